/* Gemma 4's per-layer features, read as the reference reads them (its gemma4 model and the KV cache's
 * layer reuse):
 *
 * - shapes: attention.head_count, head_count_kv and feed_forward_length may be arrays of one value per
 *   layer; attention.sliding_window_pattern (required) says per layer whether it slides (a single
 *   number: every layer or none); a sliding layer's head size is attention.key_length_swa (required),
 *   a global one's attention.key_length, and each kind rotates its own dims (rope.dimension_count_swa,
 *   rope.dimension_count) with its own base (rope.freq_base_swa unscaled, rope.freq_base);
 * - KV sharing: the last attention.shared_kv_layers layers compute no keys or values and attend over
 *   the cache of the last earlier layer of their kind (that layer's offset in the cache);
 * - proportional RoPE: rope_freqs.weight divides the global layers' frequencies (1e30 leaves a pair
 *   unrotated);
 * - per-layer inputs: each token gets a slice per layer, (per_layer_token_embd[token] · √n_pl +
 *   rmsnorm(per_layer_model_proj · x / √n_embd) · per_layer_proj_norm) / √2 (x: the scaled embedding),
 *   and each layer, after its FFN, adds rmsnorm(proj · (gelu(inp_gate · x) · slice)) · post_norm. */
#include "base/exp_poly.h"
#include "base/error.h"
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Per-layer sliding flags from attention.sliding_window_pattern: an array of n_layer booleans (or
 * numbers), or one number for every layer. */
static quill_status sliding_layers(const quill_model *m, bool *sliding, quill_error *err) {
    const char *path = quill_gguf_path(m->gguf), *name = m->arch->name;
    char key[96];
    snprintf(key, sizeof key, "%s.attention.sliding_window_pattern", name);
    const quill_gguf_value *v = quill_gguf_find(m->gguf, key);
    const int64_t n_layer = m->hp.n_layer;
    if (!v) return quill_fail(err, QUILL_E_FORMAT, "%s: %s is missing (it says which layers slide)", path, key);
    if (v->type != QUILL_GGUF_ARRAY) {
        int64_t all;
        quill_status s = quill_gguf_get_i64(m->gguf, key, &all, err);
        if (s) return s;
        for (int64_t l = 0; l < n_layer; l++) sliding[l] = all != 0;
        return QUILL_OK;
    }
    if (v->count != (uint64_t)n_layer)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s has %llu values for %lld layers", path, key,
                          (unsigned long long)v->count, (long long)n_layer);
    uint64_t cursor = 0;
    quill_gguf_value e;
    for (int64_t l = 0; l < n_layer; l++) {
        int64_t x = 0;
        if (!quill_gguf_array_next(v, &cursor, &e) ||
            !(e.type == QUILL_GGUF_BOOL ? (x = e.data[0], true) : quill_gguf_value_i64(&e, &x)))
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s[%lld] is not a boolean or a number", path, key, (long long)l);
        sliding[l] = x != 0;
    }
    return QUILL_OK;
}

static quill_status required_dim(const quill_model *m, const char *suffix, int64_t *out, quill_error *err) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    if (!quill_gguf_find(m->gguf, key))
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s is missing", quill_gguf_path(m->gguf), key);
    return quill_layer_dim(m->gguf, key, false, m->hp.n_layer, 0, -1, out, err);
}

quill_status quill_per_layer_shapes(quill_model *m, quill_error *err) {
    const quill_hparams *hp = &m->hp;
    quill_arch_params *ap = &m->ap;
    const char *path = quill_gguf_path(m->gguf), *name = m->arch->name;
    const int64_t n_layer = hp->n_layer;
    char key[96];
    bool *sliding = calloc((size_t)n_layer, sizeof *sliding);
    if (!sliding) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    quill_status s = sliding_layers(m, sliding, err);
    int64_t head_swa = 0, value_swa = 0, rot_swa = hp->n_rot, shared = 0;
    if (!s) s = required_dim(m, "attention.key_length_swa", &head_swa, err);
    if (!s) s = required_dim(m, "attention.value_length_swa", &value_swa, err);
    if (!s && head_swa != value_swa)
        s = quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.key_length_swa = %lld and value_length_swa = %lld must be equal",
                       path, name, (long long)head_swa, (long long)value_swa);
    if (!s) {
        snprintf(key, sizeof key, "%s.rope.dimension_count_swa", name);
        s = quill_layer_dim(m->gguf, key, false, n_layer, 0, hp->n_rot, &rot_swa, err);
    }
    if (!s && (rot_swa > head_swa || rot_swa % 2))
        s = quill_fail(err, QUILL_E_FORMAT, "%s: %s = %lld must be even and at most the sliding head size %lld", path, key,
                       (long long)rot_swa, (long long)head_swa);
    ap->n_rot_local = rot_swa;
    if (!s && m->arch->kv_sharing) {
        snprintf(key, sizeof key, "%s.attention.shared_kv_layers", name);
        s = quill_gguf_get_i64(m->gguf, key, &shared, err);
        if (s == QUILL_E_NOT_FOUND) s = QUILL_OK, shared = 0;
        /* the reference takes each shared layer's cache from the last layer or the one before */
        if (!s && (shared < 0 || n_layer - shared < 2))
            s = quill_fail(err, QUILL_E_FORMAT, "%s: %s = %lld leaves fewer than 2 of %lld layers with a KV cache", path,
                           key, (long long)shared, (long long)n_layer);
    }
    double window = 0;
    if (!s) {
        snprintf(key, sizeof key, "%s.attention.sliding_window", name);
        s = quill_gguf_get_f64(m->gguf, key, &window, err);
        if (s == QUILL_E_NOT_FOUND) s = quill_fail(err, QUILL_E_FORMAT, "%s: %s is missing", path, key);
    }
    for (int64_t l = 0; !s && l < n_layer; l++)
        if (sliding[l] && (!(window >= 1) || window > 1e9))
            s = quill_fail(err, QUILL_E_FORMAT, "%s: %s = %g is out of range (1..1e9) with sliding layers", path, key, window);
    for (int64_t l = 0; !s && l < n_layer; l++) {
        quill_layer *L = &m->layers[l];
        L->window = sliding[l] ? (int64_t)window : 0;
        L->head_dim = sliding[l] ? head_swa : hp->head_dim;
        const bool arrays = m->arch->per_layer_shapes;
        snprintf(key, sizeof key, "%s.attention.head_count", name);
        s = quill_layer_dim(m->gguf, key, arrays, n_layer, l, -1, &L->n_head, err);
        snprintf(key, sizeof key, "%s.attention.head_count_kv", name);
        if (!s) s = quill_layer_dim(m->gguf, key, arrays, n_layer, l, L->n_head, &L->n_head_kv, err);
        snprintf(key, sizeof key, "%s.feed_forward_length", name);
        if (!s) s = quill_layer_dim(m->gguf, key, arrays, n_layer, l, -1, &L->n_ff, err);
        if (!s && L->n_head % L->n_head_kv)
            s = quill_fail(err, QUILL_E_FORMAT, "%s: layer %lld: head count %lld is not a multiple of the KV head count %lld",
                           path, (long long)l, (long long)L->n_head, (long long)L->n_head_kv);
        snprintf(key, sizeof key, "blk.%lld.ffn_gate_inp.weight", (long long)l);
        if (!s && quill_gguf_find_tensor(m->gguf, key))
            s = quill_fail(err, QUILL_E_UNSUPPORTED, "%s: tensor '%s': Gemma 4's mixture-of-experts layers (26B-A4B) are "
                           "not implemented", path, key);
        if (s || l < n_layer - shared) continue;
        /* the reference's reuse: the last layer with a cache, or the one before for a sliding layer, which must
         * be of the same kind (the other kind's cache is another one there) and as wide */
        const int64_t src = n_layer - shared - (sliding[l] ? 2 : 1);
        const quill_layer *S = &m->layers[src];
        if (sliding[src] != sliding[l] || S->n_head_kv != L->n_head_kv)
            s = quill_fail(err, QUILL_E_FORMAT,
                           "%s: %s.attention.shared_kv_layers: layer %lld (%s, %lld KV heads) would read the cache of "
                           "layer %lld (%s, %lld KV heads)", path, name, (long long)l, sliding[l] ? "sliding" : "global",
                           (long long)L->n_head_kv, (long long)src, sliding[src] ? "sliding" : "global",
                           (long long)S->n_head_kv);
        L->kv_shared = true;
        L->kv_source = (int)src;
    }
    free(sliding);
    return s;
}

quill_status quill_per_layer_rope(quill_model *m, quill_error *err) {
    const quill_hparams *hp = &m->hp;
    quill_arch_params *ap = &m->ap;
    const char *path = quill_gguf_path(m->gguf), *name = m->arch->name;
    bool any_global = false;
    for (int64_t l = 0; l < hp->n_layer; l++) {
        quill_layer *L = &m->layers[l];
        L->rope_table = L->window ? 1 : 0;
        any_global |= !L->window;
    }
    ap->n_rope_tables = 2;
    ap->rope_base_local = m->arch->swa_rope_base;
    ap->rope_scale_local = 1.0;
    ap->rope_attn_factor_local = 1.0;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.freq_base_swa", name);
    quill_status s = quill_gguf_get_f64(m->gguf, key, &ap->rope_base_local, err);
    if (s && s != QUILL_E_NOT_FOUND) return s;
    if (!(ap->rope_base_local > 0) || ap->rope_base_local > 1e12)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s = %g is out of range", path, key, ap->rope_base_local);
    /* (the reference sizes them by the global head: at least the rotated pairs) */
    if (m->arch->rope_freqs_global && any_global)
        return quill_model_floats(m, "rope_freqs.weight", hp->head_dim / 2, 1, &ap->rope_factors, err);
    return QUILL_OK;
}

static quill_status per_layer_width(const quill_model *m, int64_t *n_pl, quill_error *err) {
    char key[96];
    snprintf(key, sizeof key, "%s.embedding_length_per_layer_input", m->arch->name);
    quill_status s = quill_gguf_get_i64(m->gguf, key, n_pl, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s is missing (0 for none)", quill_gguf_path(m->gguf), key);
    if (s) return s;
    if (*n_pl < 0 || *n_pl > (1 << 16) || *n_pl * m->hp.n_layer > (1 << 24))
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s = %lld is out of range", quill_gguf_path(m->gguf), key,
                          (long long)*n_pl);
    return QUILL_OK;
}

quill_status quill_per_layer_inputs_bind(quill_model *m, quill_error *err) {
    quill_status s = per_layer_width(m, &m->ap.n_embd_per_layer, err);
    const int64_t n_pl = m->ap.n_embd_per_layer, all = n_pl * m->hp.n_layer, d = m->hp.n_embd;
    if (s || !n_pl) return s;
    if ((s = quill_model_bind(m, "per_layer_token_embd.weight", all, m->hp.n_vocab, &m->ple_embd, err)) ||
        (s = quill_model_bind(m, "per_layer_model_proj.weight", d, all, &m->ple_model_proj, err)))
        return s;
    return quill_model_floats(m, "per_layer_proj_norm.weight", n_pl, 1, &m->ple_proj_norm, err);
}

quill_status quill_per_layer_inputs_bind_layer(quill_model *m, int64_t l, quill_error *err) {
    quill_layer *L = &m->layers[l];
    const int64_t n_pl = m->ap.n_embd_per_layer, d = m->hp.n_embd;
    char name[96];
    quill_status s;
    snprintf(name, sizeof name, "blk.%lld.inp_gate.weight", (long long)l);
    if ((s = quill_model_bind(m, name, d, n_pl, &L->ple_gate, err))) return s;
    snprintf(name, sizeof name, "blk.%lld.proj.weight", (long long)l);
    if ((s = quill_model_bind(m, name, n_pl, d, &L->ple_proj, err))) return s;
    snprintf(name, sizeof name, "blk.%lld.post_norm.weight", (long long)l);
    return quill_model_floats(m, name, d, 1, &L->ple_norm, err);
}

/* ---------------------------------------------------------------- fast pass */

/* GELU in its tanh form, as the FFN's GeGLU computes it */
static float gelu(float x) {
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    return 0.5f * x * (1.0f + tanh_poly(k * x * (1.0f + 0.044715f * x * x)));
}

/* 1 / sqrt(mean(x²) + eps), the sum in double in a fixed order */
static float rms_scale(const float *x, int64_t n, double eps) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)x[i] * x[i];
    return (float)(1.0 / sqrt(sum / (double)n + eps));
}

typedef struct {
    quill_context *c;
    const int32_t *tokens;
} prepare_job;

/* Per token: the token's slices of per_layer_token_embd · √n_pl, plus the normed projection's, over √2. */
static void prepare_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const prepare_job *j = arg;
    quill_context *c = j->c;
    const quill_model *m = c->model;
    const int64_t n_pl = m->ap.n_embd_per_layer, all = n_pl * m->hp.n_layer;
    const float proj_scale = 1.0f / sqrtf((float)m->hp.n_embd), embd_scale = sqrtf((float)n_pl);
    const float input_scale = 1.0f / sqrtf(2.0f);
    const quill_row_dequant_fn dequant = quill_kernels_dequant(c->kern, m->ple_embd.type);
    for (int64_t t = t0; t < t1; t++) {
        float *slices = c->ple_inp + t * all, *proj = c->ple_proj + t * all;
        dequant(m->ple_embd.data + (size_t)j->tokens[t] * m->ple_embd.row_bytes, slices, all);
        for (int64_t l = 0; l < m->hp.n_layer; l++) {
            float *p = proj + l * n_pl, *e = slices + l * n_pl;
            for (int64_t i = 0; i < n_pl; i++) p[i] *= proj_scale;
            const float scale = rms_scale(p, n_pl, m->hp.rms_eps);
            for (int64_t i = 0; i < n_pl; i++)
                e[i] = ((p[i] * scale) * m->ple_proj_norm[i] + e[i] * embd_scale) * input_scale;
        }
    }
}

void quill_per_layer_inputs_prepare(quill_context *c, const int32_t *tokens, int n_tok) {
    quill_matmul(c, &c->model->ple_model_proj, c->x, n_tok, c->ple_proj);
    prepare_job j = {c, tokens};
    quill_pool_run(c->pool, prepare_rows, &j, n_tok, 1);
}

typedef struct {
    quill_context *c;
    const quill_layer *L;
    int layer;
} layer_job;

/* gate = gelu(gate) · the layer's slice, per token */
static void gate_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const layer_job *j = arg;
    const int64_t n_pl = j->c->model->ap.n_embd_per_layer, all = n_pl * j->c->hp->n_layer;
    for (int64_t t = t0; t < t1; t++) {
        float *g = j->c->ple_gate + t * n_pl;
        const float *slice = j->c->ple_inp + t * all + (int64_t)j->layer * n_pl;
        for (int64_t i = 0; i < n_pl; i++) g[i] = gelu(g[i]) * slice[i];
    }
}

/* x += rmsnorm(xb) · post_norm, per token */
static void add_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const layer_job *j = arg;
    const int64_t d = j->c->hp->n_embd;
    for (int64_t t = t0; t < t1; t++) {
        float *x = j->c->x + t * d;
        const float *b = j->c->xb + t * d;
        const float scale = rms_scale(b, d, j->c->hp->rms_eps);
        for (int64_t i = 0; i < d; i++) x[i] += (b[i] * scale) * j->L->ple_norm[i];
    }
}

void quill_per_layer_inputs_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    layer_job j = {c, L, layer};
    quill_matmul(c, &L->ple_gate, c->x, n_tok, c->ple_gate);
    quill_pool_run(c->pool, gate_rows, &j, n_tok, 1);
    quill_matmul(c, &L->ple_proj, c->ple_gate, n_tok, c->xb);
    quill_pool_run(c->pool, add_rows, &j, n_tok, 1);
}

/* ---------------------------------------------------------------- float64 pass */

quill_status quill_per_layer_inputs_exact(const quill_context *c, int32_t token, const double *x, double *slices,
                                          quill_error *err) {
    const quill_model *m = c->model;
    const int64_t n_pl = m->ap.n_embd_per_layer, all = n_pl * m->hp.n_layer, d = m->hp.n_embd;
    float *row = malloc((size_t)(all > d ? all : d) * sizeof *row);
    double *proj = malloc((size_t)all * sizeof *proj);
    if (!row || !proj) {
        free(row);
        free(proj);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
    }
    quill_ref_matvec(&m->ple_model_proj, x, proj, row);
    quill_type_traits_of(m->ple_embd.type)->to_float(m->ple_embd.data + (size_t)token * m->ple_embd.row_bytes, row, all);
    for (int64_t l = 0; l < m->hp.n_layer; l++) {
        double *p = proj + l * n_pl, ss = 0;
        for (int64_t i = 0; i < n_pl; i++) ss += (p[i] / sqrt((double)d)) * (p[i] / sqrt((double)d));
        const double scale = 1.0 / sqrt(ss / (double)n_pl + m->hp.rms_eps) / sqrt((double)d);
        for (int64_t i = 0; i < n_pl; i++)
            slices[l * n_pl + i] = (p[i] * scale * m->ple_proj_norm[i] + row[l * n_pl + i] * sqrt((double)n_pl)) / sqrt(2.0);
    }
    free(row);
    free(proj);
    return QUILL_OK;
}

quill_status quill_per_layer_inputs_exact_layer(const quill_context *c, const quill_layer *L, int layer,
                                                const double *slices, double *x, quill_error *err) {
    const int64_t n_pl = c->model->ap.n_embd_per_layer, d = c->hp->n_embd;
    float *row = malloc((size_t)d * sizeof *row);
    double *g = malloc((size_t)n_pl * sizeof *g), *o = malloc((size_t)d * sizeof *o);
    if (!row || !g || !o) {
        free(row);
        free(g);
        free(o);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
    }
    quill_ref_matvec(&L->ple_gate, x, g, row);
    for (int64_t i = 0; i < n_pl; i++)
        g[i] = 0.5 * g[i] * (1.0 + tanh(sqrt(2.0 / M_PI) * (g[i] + 0.044715 * g[i] * g[i] * g[i]))) *
               slices[(int64_t)layer * n_pl + i];
    quill_ref_matvec(&L->ple_proj, g, o, row);
    double ss = 0;
    for (int64_t i = 0; i < d; i++) ss += o[i] * o[i];
    const double scale = 1.0 / sqrt(ss / (double)d + c->hp->rms_eps);
    for (int64_t i = 0; i < d; i++) x[i] += o[i] * scale * L->ple_norm[i];
    free(row);
    free(g);
    free(o);
    return QUILL_OK;
}
