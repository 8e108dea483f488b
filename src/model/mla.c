/* Multi-head Latent Attention (DeepSeek V2 / V3, Kimi K2), in the fast pass and the float64 pass:
 *
 *   q = attn_q_b · rmsnorm(attn_q_a · h) · q_a_norm   (or attn_q · h)   each head [q_nope | q_pe]
 *   [c | k_pe] = attn_kv_a_mqa · h;  c = rmsnorm(c) · kv_a_norm;  q_pe, k_pe = rope(q_pe), rope(k_pe)
 *   each head's query in the latent: [attn_k_b[h] · q_nope | q_pe]      (kv_lora_rank + n_rot)
 *   the cache: one KV head, key = value = [c | k_pe] (the latent and the RoPE part, not per-head keys)
 *   o[h] = attn_v_b[h] · (softmax(q[h] · keys · scale) · values)[0 .. kv_lora_rank)
 *   out = attn_output · [o[0] .. o[n_head - 1]]
 *
 * q_nope · k_nope = q_nope · (k_b[h]ᵀ c) = (k_b[h] · q_nope) · c: the keys' per-head halves never exist,
 * as in the reference's absorbed form (its Qcur, Kcur, Vcur are these). The older files' attn_kv_b holds
 * each head's k_nope rows, then its value rows: k_b is its k_nope rows transposed (made at load, f32),
 * v_b a view of its value rows. The scale is mscale² / sqrt(qk_nope + n_rot), mscale YaRN's. */
#include "model/forward.h"
#include "model/kv_cache.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static quill_status key_i64(const quill_model *m, const char *suffix, int64_t *out, bool required, quill_error *err) {
    char key[96];
    snprintf(key, sizeof key, "%s.%s", m->arch->name, suffix);
    quill_status s = quill_gguf_get_i64(m->gguf, key, out, err);
    if (s == QUILL_E_NOT_FOUND && !required) {
        *out = 0;
        return QUILL_OK;
    }
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s is missing (latent attention needs it)", quill_gguf_path(m->gguf), key);
    if (s) return s;
    if (*out < 0 || *out > (1 << 20))
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range", quill_gguf_path(m->gguf), key,
                          (long long)*out);
    return QUILL_OK;
}

quill_status quill_mla_dims(quill_model *m, quill_error *err) {
    quill_hparams *hp = &m->hp;
    quill_arch_params *ap = &m->ap;
    const char *path = quill_gguf_path(m->gguf), *name = m->arch->name;
    int64_t value_len, k_mla, v_mla;
    quill_status s;
    if ((s = key_i64(m, "attention.q_lora_rank", &ap->q_lora, false, err)) ||
        (s = key_i64(m, "attention.kv_lora_rank", &ap->kv_lora, true, err)) ||
        (s = key_i64(m, "attention.value_length", &value_len, false, err)) ||
        (s = key_i64(m, "attention.key_length_mla", &k_mla, false, err)) ||
        (s = key_i64(m, "attention.value_length_mla", &v_mla, false, err)))
        return s;
    if (!value_len) value_len = hp->head_dim;
    if (ap->kv_lora < 1) return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.kv_lora_rank is 0", path, name);
    ap->qk_rope = hp->n_rot;
    if (!k_mla != !v_mla)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.attention.key_length_mla and value_length_mla come together", path,
                          name);
    if (k_mla) {
        /* the converter's absorbed form: attention.key_length is the cache's head, kv_lora_rank + n_rot,
         * value_length the latent's */
        if (hp->head_dim != ap->kv_lora + hp->n_rot || value_len != ap->kv_lora)
            return quill_fail(err, QUILL_E_FORMAT,
                              "%s: %s.attention.key_length = %lld and value_length = %lld must be kv_lora_rank + "
                              "rope.dimension_count (%lld) and kv_lora_rank (%lld)",
                              path, name, (long long)hp->head_dim, (long long)value_len,
                              (long long)(ap->kv_lora + hp->n_rot), (long long)ap->kv_lora);
        ap->qk_nope = k_mla - hp->n_rot;
        ap->v_head = v_mla;
    } else {
        /* older files (attn_kv_b): the heads' own sizes */
        ap->qk_nope = hp->head_dim - hp->n_rot;
        ap->v_head = value_len;
    }
    if (ap->qk_nope < 1 || ap->v_head < 1)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s: heads of %lld dims with %lld rotated leave no unrotated part", path,
                          name, (long long)(ap->qk_nope + hp->n_rot), (long long)hp->n_rot);
    hp->head_dim = ap->kv_lora + hp->n_rot;
    hp->n_head_kv = 1;
    if (ap->v_head > hp->head_dim)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "%s: %s: value heads of %lld are wider than the latent's %lld", path,
                          name, (long long)ap->v_head, (long long)hp->head_dim);
    const int64_t qk = ap->qk_nope + ap->qk_rope;
    const int64_t gather = ap->qk_nope > ap->kv_lora ? ap->qk_nope : ap->kv_lora;
    const int64_t product = ap->kv_lora > ap->v_head ? ap->kv_lora : ap->v_head;
    ap->mla_floats = hp->n_head * qk + hp->head_dim + ap->q_lora + gather + product;
    return QUILL_OK;
}

/* The older files' attn_kv_b [n_head · (qk_nope + v_head)][kv_lora]: v_b a view of each head's value
 * rows; k_b each head's k_nope rows transposed, in f32 (the reference multiplies by those rows). */
static quill_status split_kv_b(quill_model *m, quill_layer *L, const quill_weight *kv_b, quill_error *err) {
    const quill_arch_params *ap = &m->ap;
    const int64_t H = m->hp.n_head, nope = ap->qk_nope, kvl = ap->kv_lora, per = nope + ap->v_head;
    L->v_b = *kv_b;
    L->v_b.rows = ap->v_head;
    L->v_b.n_expert = H;
    L->v_b.expert_bytes = (size_t)per * kv_b->row_bytes;
    L->v_b.data = kv_b->data + (size_t)nope * kv_b->row_bytes;
    L->k_b_owned = malloc((size_t)(H * kvl * nope) * sizeof(float));
    float *row = malloc((size_t)kvl * sizeof *row);
    quill_status s = L->k_b_owned && row ? QUILL_OK
                                         : quill_fail(err, QUILL_E_NOMEM, "out of memory for %s's k_b", kv_b->name);
    for (int64_t h = 0; !s && h < H; h++)
        for (int64_t j = 0; !s && j < nope; j++) {
            s = quill_dequantize(kv_b->type, kv_b->data + (size_t)(h * per + j) * kv_b->row_bytes, row, kvl, err);
            for (int64_t r = 0; !s && r < kvl; r++) L->k_b_owned[(h * kvl + r) * nope + j] = row[r];
        }
    free(row);
    if (s) return s;
    L->k_b = (quill_weight){.name = kv_b->name, .type = QUILL_TYPE_F32, .cols = nope, .rows = kvl,
                            .row_bytes = (size_t)nope * sizeof(float), .data = (const uint8_t *)L->k_b_owned,
                            .n_expert = H, .expert_bytes = (size_t)(kvl * nope) * sizeof(float)};
    return QUILL_OK;
}

quill_status quill_mla_bind_layer(quill_model *m, int64_t l, quill_error *err) {
    const quill_hparams *hp = &m->hp;
    const quill_arch_params *ap = &m->ap;
    quill_layer *L = &m->layers[l];
    const int64_t d = hp->n_embd, H = hp->n_head, qk = ap->qk_nope + ap->qk_rope, kvl = ap->kv_lora;
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
    quill_status s;
    L->mla = true;
    L->v_from_k = true; /* two projections (q, kv_a): quill_projections */
    if (ap->q_lora) {
        if ((s = quill_model_bind(m, NAME("attn_q_a.weight"), d, ap->q_lora, &L->q_a, err)) ||
            (s = quill_model_floats(m, NAME("attn_q_a_norm.weight"), ap->q_lora, 1, &L->q_a_norm, err)) ||
            (s = quill_model_bind(m, NAME("attn_q_b.weight"), ap->q_lora, H * qk, &L->wq, err)))
            return s;
    } else if ((s = quill_model_bind(m, NAME("attn_q.weight"), d, H * qk, &L->wq, err))) {
        return s;
    }
    if ((s = quill_model_bind(m, NAME("attn_kv_a_mqa.weight"), d, kvl + ap->qk_rope, &L->wk, err)) ||
        (s = quill_model_floats(m, NAME("attn_kv_a_norm.weight"), kvl, 1, &L->kv_a_norm, err)) ||
        (s = quill_model_bind(m, NAME("attn_output.weight"), H * ap->v_head, d, &L->wo, err)))
        return s;
    if (quill_gguf_find_tensor(m->gguf, NAME("attn_kv_b.weight"))) {
        quill_weight kv_b = {0};
        if ((s = quill_model_bind(m, name, kvl, H * (ap->qk_nope + ap->v_head), &kv_b, err))) return s;
        return split_kv_b(m, L, &kv_b, err);
    }
    if ((s = quill_model_bind_experts(m, NAME("attn_k_b.weight"), ap->qk_nope, kvl, H, &L->k_b, err)) ||
        (s = quill_model_bind_experts(m, NAME("attn_v_b.weight"), kvl, ap->v_head, H, &L->v_b, err)))
        return s;
#undef NAME
    return QUILL_OK;
}

quill_status quill_mla_params(quill_model *m, quill_error *err) {
    const quill_hparams *hp = &m->hp;
    quill_arch_params *ap = &m->ap;
    /* The reference's YaRN for this family (its llama-context.cpp and deepseek2.cpp): the file's
     * yarn_log_multiplier is 0.1 · mscale_all_dim; with it the rotation's factor is get_mscale(f, mscale) /
     * get_mscale(f, mscale_all_dim), mscale = mscale_all_dim unless that is 1, divided by 1 + 0.1 ln f (which
     * the rotation multiplies back), times rope.scaling.attn_factor; the scores are scaled by mscale² /
     * sqrt(qk_nope + n_rot) with mscale = that factor · (1 + 0.1 ln f) · (1 + 0.1 · mscale_all_dim · ln f). */
    double log_mul = 0, attn_factor = 1;
    char key[96];
    snprintf(key, sizeof key, "%s.rope.scaling.yarn_log_multiplier", m->arch->name);
    if (quill_gguf_get_f64(m->gguf, key, &log_mul, NULL) == QUILL_OK) log_mul /= 0.1;
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", m->arch->name);
    quill_gguf_get_f64(m->gguf, key, &attn_factor, NULL);
    if (!(log_mul >= 0) || log_mul > 1e3 || !(attn_factor > 0) || attn_factor > 1e3)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s.rope.scaling.yarn_log_multiplier or attn_factor is out of range",
                          quill_gguf_path(m->gguf), m->arch->name);
    /* Mistral Large 3's files (this architecture) scale the queries by a temperature over
     * attention.temperature_length positions: not implemented, so refused rather than run differently */
    double temp = 0;
    snprintf(key, sizeof key, "%s.attention.temperature_scale", m->arch->name);
    if (quill_gguf_get_f64(m->gguf, key, &temp, NULL) == QUILL_OK && temp != 0)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "%s: %s = %g: the attention temperature of this architecture is not "
                          "implemented", quill_gguf_path(m->gguf), key, temp);
    const double f = 1.0 / hp->rope_freq_scale;
    const float ff = (float)f;
    double yarn = 1; /* the factor handed to the rotation */
    if (ap->rope_yarn) {
        const double mscale = log_mul != 0 && log_mul != 1 ? log_mul : 1;
#define GET_MSCALE(m_) (ff <= 1.0f ? 1.0 : 0.1 * (m_) * log(f) + 1.0)
        yarn = log_mul != 0 ? GET_MSCALE(mscale) / GET_MSCALE(log_mul) : GET_MSCALE(1.0);
#undef GET_MSCALE
        yarn /= 1.0 + 0.1 * log(f);
    }
    yarn *= attn_factor;
    /* the rotation multiplies its factor by 1 + 0.1 ln f with YaRN */
    ap->rope_attn_factor = ap->rope_yarn ? yarn * (1.0 + 0.1 * log(f)) : yarn;
    const double mscale = yarn * (1.0 + 0.1 * log(f)) * (1.0 + 0.1 * log_mul * log(f));
    ap->attn_scale = (float)(mscale * mscale / sqrt((double)(ap->qk_nope + ap->qk_rope)));
    return QUILL_OK;
}

/* ---------------------------------------------------------------- fast pass */

static void rmsnorm_row(float *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    const float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] * scale) * w[i];
}

/* RoPE on n_rot dims at v: adjacent pairs or NeoX halves, from the context's tables */
static void rope_part(const quill_context *c, float *v, int pos) {
    const int64_t half = c->hp->n_rot / 2, stride = quill_rope_stride(c->model);
    const float *cs = c->rope_cos + (size_t)pos * stride, *sn = c->rope_sin + (size_t)pos * stride;
    const bool neox = c->model->arch->rope == QUILL_ROPE_NEOX;
    for (int64_t i = 0; i < half; i++) {
        float *p0 = neox ? v + i : v + 2 * i, *p1 = neox ? p0 + half : p0 + 1;
        const float x0 = *p0, x1 = *p1;
        *p0 = x0 * cs[i] - x1 * sn[i];
        *p1 = x0 * sn[i] + x1 * cs[i];
    }
}

/* The scratch's parts for n tokens: full queries [n][n_head][qk], the kv_a projection [n][kv_lora +
 * n_rot], q_a [n][q_lora], a gathered head [n][widest in], its product [n][widest out]. */
typedef struct {
    float *qfull, *kv, *qa, *gather, *product;
} mla_parts;

static mla_parts parts_of(const quill_context *c, int n) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t qk = ap->qk_nope + ap->qk_rope;
    const int64_t gather = ap->qk_nope > ap->kv_lora ? ap->qk_nope : ap->kv_lora;
    mla_parts p;
    p.qfull = c->mla;
    p.kv = p.qfull + (size_t)n * (size_t)(c->hp->n_head * qk);
    p.qa = p.kv + (size_t)n * (size_t)c->hp->head_dim;
    p.gather = p.qa + (size_t)n * (size_t)ap->q_lora;
    p.product = p.gather + (size_t)n * (size_t)gather;
    return p;
}

typedef struct {
    quill_context *c;
    const quill_layer *L;
    mla_parts p;
} mla_job;

/* Per token: the norms, RoPE, the queries' RoPE parts in place, the latent and k_pe into the cache. */
static void mla_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const mla_job *j = arg;
    quill_context *c = j->c;
    const quill_layer *L = j->L;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t H = L->n_head, hd = L->head_dim, qk = ap->qk_nope + ap->qk_rope, kvl = ap->kv_lora;
    const int64_t kpos = quill_key_positions(c->n_ctx);
    const size_t krow = quill_kv_row_bytes(c->type_k, hd), vrow = quill_kv_row_bytes(c->type_v, hd);
    for (int64_t t = t0; t < t1; t++) {
        const int pos = c->ub_pos[t];
        float *kv = j->p.kv + t * hd, *qf = j->p.qfull + t * H * qk, *q = c->q + t * H * hd;
        rmsnorm_row(kv, L->kv_a_norm, kvl, c->hp->rms_eps);
        rope_part(c, kv + kvl, pos);
        for (int64_t h = 0; h < H; h++) {
            rope_part(c, qf + h * qk + ap->qk_nope, pos);
            memcpy(q + h * hd + kvl, qf + h * qk + ap->qk_nope, (size_t)ap->qk_rope * sizeof *q);
        }
        uint8_t *kt = c->k_cache + quill_row_size(c->type_k, (int64_t)quill_kv_at(c, L, c->ub_seq[t], kpos));
        uint8_t *vt = c->v_cache + quill_row_size(c->type_v, (int64_t)quill_kv_at(c, L, c->ub_seq[t], c->n_ctx));
        quill_kv_store_key(c->type_k, kt + (size_t)(pos / KEY_BLOCK) * KEY_BLOCK * krow, pos % KEY_BLOCK, kv, hd);
        quill_kv_store_value(c->type_v, vt + (size_t)pos * vrow, kv, hd);
    }
}

/* Per head h: out[t][h · out_stride ..] = w[h] · in[t][h · in_stride + in_at ..], the head's inputs
 * gathered into one product of n tokens. */
static void per_head(quill_context *c, const quill_weight *w, const float *in, int64_t in_stride, int64_t in_at,
                     float *out, int64_t out_stride, int n, const mla_parts *p) {
    for (int64_t h = 0; h < w->n_expert; h++) {
        const quill_weight head = quill_weight_expert(w, h);
        for (int t = 0; t < n; t++)
            memcpy(p->gather + (size_t)t * head.cols, in + (size_t)t * in_stride * w->n_expert + h * in_stride + in_at,
                   (size_t)head.cols * sizeof(float));
        quill_matmul(c, &head, p->gather, n, p->product);
        for (int t = 0; t < n; t++)
            memcpy(out + (size_t)t * out_stride * w->n_expert + h * out_stride, p->product + (size_t)t * head.rows,
                   (size_t)head.rows * sizeof(float));
    }
}

void quill_mla_fast(quill_context *c, const quill_layer *L, int layer, int n) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t H = L->n_head, hd = L->head_dim, qk = ap->qk_nope + ap->qk_rope, kvl = ap->kv_lora;
    const mla_parts p = parts_of(c, n);
    if (L->q_a.data) {
        quill_matmuls(c, (const quill_weight *[]){&L->q_a, &L->wk}, (float *[]){p.qa, p.kv}, 2, c->xb, n);
        for (int t = 0; t < n; t++) rmsnorm_row(p.qa + (size_t)t * ap->q_lora, L->q_a_norm, ap->q_lora, c->hp->rms_eps);
        quill_matmul(c, &L->wq, p.qa, n, p.qfull);
    } else {
        quill_matmuls(c, (const quill_weight *[]){&L->wq, &L->wk}, (float *[]){p.qfull, p.kv}, 2, c->xb, n);
    }
    mla_job j = {c, L, p};
    quill_pool_run(c->pool, mla_rows, &j, n, 1);
    /* each head's q_nope into the latent: [k_b[h] · q_nope | q_pe] */
    per_head(c, &L->k_b, p.qfull, qk, 0, c->q, hd, n, &p);
    quill_trace(c, "Qcur", layer, c->q, 3, hd, H, n);
    quill_trace(c, "Kcur", layer, p.kv, 3, hd, 1, n);
    if (c->trace) {
        for (int t = 0; t < n; t++) memcpy(p.gather + (size_t)t * kvl, p.kv + (size_t)t * hd, (size_t)kvl * sizeof(float));
        quill_trace(c, "Vcur", layer, p.gather, 3, kvl, 1, n);
    }
    quill_attention(c, layer, n);
    quill_announce(c, (const quill_weight *[]){&L->wo}, 1, n);
    /* each head's weighted latent through v_b[h], into q (free now): [n][n_head · v_head] */
    per_head(c, &L->v_b, c->att, hd, 0, c->q, ap->v_head, n, &p);
    quill_trace(c, "kqv_out", layer, c->q, 2, H * ap->v_head, n, 1);
    quill_matmul(c, &L->wo, c->q, n, c->xb);
    quill_trace(c, "attn_out", layer, c->xb, 2, c->hp->n_embd, n, 1);
}

/* ---------------------------------------------------------------- float64 pass */

static void ref_norm(double *x, const float *w, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    const double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) x[i] = x[i] * scale * (double)w[i];
}

static void ref_rope_part(const quill_context *c, double *v, int pos) {
    const int64_t half = c->hp->n_rot / 2;
    const bool neox = c->model->arch->rope == QUILL_ROPE_NEOX;
    const double mscale = c->model->ap.rope_attn_factor;
    for (int64_t i = 0; i < half; i++) {
        const double theta = quill_rope_angle(c, 0, pos, i), co = cos(theta) * mscale, s = sin(theta) * mscale;
        double *p0 = neox ? v + i : v + 2 * i, *p1 = neox ? p0 + half : p0 + 1;
        const double x0 = *p0, x1 = *p1;
        *p0 = x0 * co - x1 * s;
        *p1 = x0 * s + x1 * co;
    }
}

quill_status quill_mla_exact(const quill_context *c, const quill_layer *L, int layer, const double *in, int pos,
                             double *out, quill_error *err) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t H = L->n_head, hd = L->head_dim, qk = ap->qk_nope + ap->qk_rope, kvl = ap->kv_lora;
    const int64_t d = c->hp->n_embd, vh = ap->v_head;
    int64_t widest = d > H * qk ? d : H * qk;
    if (H * hd > widest) widest = H * hd;
    if (ap->q_lora > widest) widest = ap->q_lora;
    double *qfull = malloc((size_t)(H * qk) * sizeof *qfull), *kv = malloc((size_t)hd * sizeof *kv);
    double *qa = malloc((size_t)(ap->q_lora + 1) * sizeof *qa), *q = malloc((size_t)(H * hd) * sizeof *q);
    double *att = malloc((size_t)(H * hd) * sizeof *att), *kqv = malloc((size_t)(H * vh) * sizeof *kqv);
    double *scores = malloc((size_t)(pos + 1) * sizeof *scores);
    float *row = malloc((size_t)widest * sizeof *row), *tmp = malloc((size_t)widest * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!qfull || !kv || !qa || !q || !att || !kqv || !scores || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    if (L->q_a.data) {
        quill_ref_matvec(&L->q_a, in, qa, row);
        ref_norm(qa, L->q_a_norm, ap->q_lora, c->hp->rms_eps);
        quill_ref_matvec(&L->wq, qa, qfull, row);
    } else {
        quill_ref_matvec(&L->wq, in, qfull, row);
    }
    quill_ref_matvec(&L->wk, in, kv, row);
    ref_norm(kv, L->kv_a_norm, kvl, c->hp->rms_eps);
    ref_rope_part(c, kv + kvl, pos);
    for (int64_t h = 0; h < H; h++) {
        ref_rope_part(c, qfull + h * qk + ap->qk_nope, pos);
        const quill_weight k_b = quill_weight_expert(&L->k_b, h);
        quill_ref_matvec(&k_b, qfull + h * qk, q + h * hd, row);
        memcpy(q + h * hd + kvl, qfull + h * qk + ap->qk_nope, (size_t)ap->qk_rope * sizeof *q);
    }
    quill_ref_trace(c, "Qcur", layer, q, H * hd, 3, hd, H, tmp);
    quill_ref_trace(c, "Kcur", layer, kv, hd, 3, hd, 1, tmp);
    quill_ref_trace(c, "Vcur", layer, kv, kvl, 3, kvl, 1, tmp);
    double *kc = c->ref_k + quill_kv_at(c, L, 0, c->n_ctx), *vc = c->ref_v + quill_kv_at(c, L, 0, c->n_ctx);
    memcpy(kc + (size_t)pos * hd, kv, (size_t)hd * sizeof *kv);
    memcpy(vc + (size_t)pos * hd, kv, (size_t)hd * sizeof *kv);
    quill_kv_round_double(c->type_k, kc + (size_t)pos * hd, hd);
    quill_kv_round_double(c->type_v, vc + (size_t)pos * hd, hd);
    const double scale = ap->attn_scale * quill_attn_temperature(ap, pos);
    for (int64_t h = 0; h < H; h++) {
        double max = -INFINITY, sum = 0;
        for (int p = 0; p <= pos; p++) {
            double dot = 0;
            for (int64_t i = 0; i < hd; i++) dot += q[h * hd + i] * kc[(size_t)p * hd + i];
            scores[p] = dot * scale;
            if (scores[p] > max) max = scores[p];
        }
        for (int p = 0; p <= pos; p++) sum += (scores[p] = exp(scores[p] - max));
        for (int64_t i = 0; i < kvl; i++) att[h * hd + i] = 0;
        for (int p = 0; p <= pos; p++)
            for (int64_t i = 0; i < kvl; i++) att[h * hd + i] += scores[p] / sum * vc[(size_t)p * hd + i];
        const quill_weight v_b = quill_weight_expert(&L->v_b, h);
        quill_ref_matvec(&v_b, att + h * hd, kqv + h * vh, row);
    }
    quill_ref_trace(c, "kqv_out", layer, kqv, H * vh, 2, H * vh, 1, tmp);
    quill_ref_matvec(&L->wo, kqv, out, row);
    quill_ref_trace(c, "attn_out", layer, out, d, 2, d, 1, tmp);
done:
    free(qfull), free(kv), free(qa), free(q), free(att), free(kqv), free(scores), free(row), free(tmp);
    return s;
}
