/* Gated DeltaNet layers (Qwen 3.5, as the reference's qwen35 graph computes them), in the fast pass
 * and in the float64 pass, and the output gate of the hybrids' full-attention layers.
 *
 *   mixed = h·W_qkv (q, k, v channels), z = h·W_gate, b = h·W_beta, a = h·W_alpha (Qwen3-Next's
 *   older files: q, k, v and z from one ssm_in, per key head; b and a from one ssm_ba)
 *   mixed = silu(causal depthwise conv of `kernel` taps over the sequence's last inputs)
 *   q, k = l2norm per key head (eps: the RMS norm's); β = σ(b); g = softplus(a + dt) · A
 *   per value head h (key head h mod key heads), state S [k][v]:
 *       S = exp(g)·S;  δ = β·(v − Sᵀk);  S += k δᵀ;  o = Sᵀq / √state
 *   out = (rmsnorm(o per head) · ssm_norm · silu(z)) · W_out
 *
 * The recurrence runs token by token in order (the reference's fused CPU kernel does too), one
 * value head per work item: a token's arithmetic never depends on how the batch is split or on
 * the threads, so results are bitwise invariant. */
#include "model/recurrent.h"
#include "model/forward.h"
#include "base/error.h"
#include "model/conv_window.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Upper bounds far above any real model, against absurd metadata. */
#define MAX_KERNEL 64
#define MAX_STATE 4096

/* ---------------------------------------------------------------- loading */

/* Which layers are DeltaNet layers: attention.recurrent_layers (one flag per block) when the file
 * has it, else every layer but each full_attention_interval-th (default 4). */
static quill_status mark_recurrent(quill_model *m, quill_error *err) {
    const quill_gguf *g = m->gguf;
    const char *arch = m->arch->name, *path = quill_gguf_path(g);
    char key[128];
    snprintf(key, sizeof key, "%s.attention.recurrent_layers", arch);
    const quill_gguf_value *flags = quill_gguf_find(g, key);
    if (flags) {
        if (flags->type != QUILL_GGUF_ARRAY || flags->count < (uint64_t)m->hp.n_layer)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s must be an array of one flag per layer (%lld)", path, key,
                              (long long)m->hp.n_layer);
        uint64_t cursor = 0;
        quill_gguf_value e;
        for (int64_t l = 0; l < m->hp.n_layer; l++) {
            int64_t v;
            if (!quill_gguf_array_next(flags, &cursor, &e) || !quill_gguf_value_i64(&e, &v))
                return quill_fail(err, QUILL_E_FORMAT, "%s: %s[%lld] is not a number or flag", path, key, (long long)l);
            m->layers[l].recurrent = v != 0;
        }
        return QUILL_OK;
    }
    int64_t interval = 4;
    snprintf(key, sizeof key, "%s.full_attention_interval", arch);
    quill_status s = quill_gguf_get_i64(g, key, &interval, err);
    if (s && s != QUILL_E_NOT_FOUND) return s;
    if (interval < 1 || interval > 1 << 20)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range (1..%d)", path, key,
                          (long long)interval, 1 << 20);
    for (int64_t l = 0; l < m->hp.n_layer; l++) m->layers[l].recurrent = (l + 1) % interval != 0;
    return QUILL_OK;
}

/* rope.dimension_sections: four section sizes, summing to the rotated pairs (rope.dimension_count
 * / 2); with text positions the pairs of the fourth section do not rotate. */
static quill_status read_sections(quill_model *m, quill_error *err) {
    const quill_gguf *g = m->gguf;
    char key[128];
    snprintf(key, sizeof key, "%s.rope.dimension_sections", m->arch->name);
    const quill_gguf_value *v = quill_gguf_find(g, key);
    if (!v || v->type != QUILL_GGUF_ARRAY || v->count < 1 || v->count > 4)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s is missing or not an array of up to 4 sizes",
                          quill_gguf_path(g), key);
    uint64_t cursor = 0;
    quill_gguf_value e;
    int64_t sum = 0;
    for (int i = 0; i < 4; i++) {
        int64_t n = 0;
        if (i < (int)v->count && (!quill_gguf_array_next(v, &cursor, &e) || !quill_gguf_value_i64(&e, &n) || n < 0 ||
                                  n > 1 << 20))
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s[%d] is not a size", quill_gguf_path(g), key, i);
        m->ap.rope_sections[i] = (int)n;
        sum += n;
    }
    if (sum != m->hp.n_rot / 2)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: the sections of %s sum to %lld pairs, but rope.dimension_count = %lld rotates %lld",
                          quill_gguf_path(g), key, (long long)sum, (long long)m->hp.n_rot, (long long)m->hp.n_rot / 2);
    return QUILL_OK;
}

quill_status quill_hybrid_params(quill_model *m, quill_error *err) {
    const quill_gguf *g = m->gguf;
    const char *arch = m->arch->name, *path = quill_gguf_path(g);
    quill_arch_params *ap = &m->ap;
    int64_t inner;
    quill_status s;
    if ((s = quill_ssm_size(g, arch, "ssm.conv_kernel", 1, MAX_KERNEL, &ap->ssm_kernel, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.state_size", 1, MAX_STATE, &ap->ssm_state, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.group_count", 1, 1 << 16, &ap->ssm_k_heads, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.time_step_rank", 1, 1 << 16, &ap->ssm_v_heads, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.inner_size", 1, 1 << 24, &inner, err)))
        return s;
    if (ap->ssm_v_heads % ap->ssm_k_heads)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: %lld value heads (%s.ssm.time_step_rank) are not a multiple of %lld key heads "
                          "(ssm.group_count)",
                          path, (long long)ap->ssm_v_heads, arch, (long long)ap->ssm_k_heads);
    if (inner != ap->ssm_state * ap->ssm_v_heads)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: %s.ssm.inner_size = %lld, but state size %lld x %lld value heads (ssm.time_step_rank) "
                          "= %lld: inconsistent state sizes",
                          path, arch, (long long)inner, (long long)ap->ssm_state, (long long)ap->ssm_v_heads,
                          (long long)(ap->ssm_state * ap->ssm_v_heads));
    ap->ssm_conv_dim = 2 * ap->ssm_state * ap->ssm_k_heads + inner;
    char key[128];
    snprintf(key, sizeof key, "%s.nextn_predict_layers", arch);
    ap->n_layer_mtp = 0;
    if ((s = quill_gguf_get_i64(g, key, &ap->n_layer_mtp, err)) && s != QUILL_E_NOT_FOUND) return s;
    if (m->arch->rope_sections && (s = read_sections(m, err))) return s;
    return mark_recurrent(m, err);
}

quill_status quill_hybrid_bind_layer(quill_model *m, int64_t l, quill_error *err) {
    const quill_arch_params *ap = &m->ap;
    const int64_t d = m->hp.n_embd, key_dim = ap->ssm_state * ap->ssm_k_heads;
    const int64_t value_dim = ap->ssm_state * ap->ssm_v_heads;
    quill_layer *L = &m->layers[l];
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
    quill_status s;
    /* Qwen3-Next's older files: ssm_in holds per key head its q, k, v and z rows (ssm_gate stays
     * unbound) */
    const bool fused = m->arch->ssm_grouped && !quill_gguf_find_tensor(m->gguf, NAME("attn_qkv.weight")) &&
                       quill_gguf_find_tensor(m->gguf, NAME("ssm_in.weight"));
    if ((fused && (s = quill_model_bind(m, NAME("ssm_in.weight"), d, 2 * key_dim + 2 * value_dim, &L->ssm_in, err))) ||
        (!fused && (s = quill_model_bind(m, NAME("attn_qkv.weight"), d, 2 * key_dim + value_dim, &L->ssm_in, err))) ||
        (!fused && (s = quill_model_bind(m, NAME("attn_gate.weight"), d, value_dim, &L->ssm_gate, err))) ||
        /* Qwen3-Next: beta and alpha in one matrix, per key head its value heads' betas, then their alphas */
        (s = m->arch->ssm_grouped
                 ? quill_model_bind(m, NAME("ssm_ba.weight"), d, 2 * ap->ssm_v_heads, &L->ssm_beta, err)
                 : quill_model_bind(m, NAME("ssm_beta.weight"), d, ap->ssm_v_heads, &L->ssm_beta, err)) ||
        (!m->arch->ssm_grouped &&
         (s = quill_model_bind(m, NAME("ssm_alpha.weight"), d, ap->ssm_v_heads, &L->ssm_alpha, err))) ||
        (s = quill_model_bind(m, NAME("ssm_out.weight"), value_dim, d, &L->ssm_out, err)) ||
        (s = quill_model_floats(m, NAME("ssm_dt.bias"), ap->ssm_v_heads, 1, &L->ssm_dt, err)) ||
        (s = quill_model_floats(m, NAME("ssm_a"), ap->ssm_v_heads, 1, &L->ssm_a, err)) ||
        (s = quill_model_floats(m, NAME("ssm_norm.weight"), ap->ssm_state, 1, &L->ssm_norm, err)))
        return s;
#undef NAME
    /* the convolution's taps, [conv channels][kernel], in f32 */
    snprintf(name, sizeof name, "blk.%lld.ssm_conv1d.weight", (long long)l);
    return quill_model_floats(m, name, ap->ssm_kernel, ap->ssm_conv_dim, &L->ssm_conv, err);
}

quill_status quill_hybrid_bind_mtp(quill_model *m, quill_error *err) {
    const quill_hparams *hp = &m->hp;
    const quill_arch_params *ap = &m->ap;
    const int64_t d = hp->n_embd, q_dim = hp->n_head * hp->head_dim, kv_dim = hp->n_head_kv * hp->head_dim;
    const int64_t E = ap->n_expert, ff = E ? ap->n_ff_exp : hp->n_ff, ff_sh = ap->n_ff_shexp;
    for (int64_t i = 0; i < ap->n_layer_mtp; i++) {
        const long long l = (long long)(hp->n_layer + i);
        /* a full-attention block (dense FFN, or the experts: router, shared expert, and the 3-D
         * expert tensors [E][rows][cols]) with its nextn projection and norms */
        struct { const char *suffix; int64_t cols, rows, depth; } mats[] = {
            {"attn_q.weight", d, 2 * q_dim, 1},         {"attn_k.weight", d, kv_dim, 1},
            {"attn_v.weight", d, kv_dim, 1},            {"attn_output.weight", q_dim, d, 1},
            {"nextn.eh_proj.weight", 2 * d, d, 1},      {"attn_norm.weight", d, 1, 1},
            {"post_attention_norm.weight", d, 1, 1},    {"attn_q_norm.weight", hp->head_dim, 1, 1},
            {"attn_k_norm.weight", hp->head_dim, 1, 1}, {"nextn.enorm.weight", d, 1, 1},
            {"nextn.hnorm.weight", d, 1, 1},
            {E ? "ffn_gate_exps.weight" : "ffn_gate.weight", d, ff, E ? E : 1},
            {E ? "ffn_up_exps.weight" : "ffn_up.weight", d, ff, E ? E : 1},
            {E ? "ffn_down_exps.weight" : "ffn_down.weight", ff, d, E ? E : 1},
            {E ? "ffn_gate_inp.weight" : NULL, d, E, 1},
            {ff_sh ? "ffn_gate_shexp.weight" : NULL, d, ff_sh, 1},
            {ff_sh ? "ffn_up_shexp.weight" : NULL, d, ff_sh, 1},
            {ff_sh ? "ffn_down_shexp.weight" : NULL, ff_sh, d, 1},
            {ff_sh ? "ffn_gate_inp_shexp.weight" : NULL, d, 1, 1},
        };
        for (size_t k = 0; k < sizeof mats / sizeof mats[0]; k++) {
            if (!mats[k].suffix) continue;
            char name[96];
            snprintf(name, sizeof name, "blk.%lld.%s", l, mats[k].suffix);
            const quill_gguf_tensor *t = quill_gguf_find_tensor(m->gguf, name);
            if (!t) return quill_fail(err, QUILL_E_FORMAT, "%s: tensor '%s' is missing", quill_gguf_path(m->gguf), name);
            if (t->ne[0] != mats[k].cols || t->ne[1] != mats[k].rows || t->ne[2] != mats[k].depth || t->ne[3] != 1)
                return quill_fail(err, QUILL_E_FORMAT,
                                  "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected [%lld, %lld, %lld] "
                                  "from the hyperparameters",
                                  quill_gguf_path(m->gguf), name, (long long)t->ne[0], (long long)t->ne[1],
                                  (long long)t->ne[2], (long long)t->ne[3], (long long)mats[k].cols,
                                  (long long)mats[k].rows, (long long)mats[k].depth);
        }
    }
    return QUILL_OK;
}

void quill_hybrid_free_layer(quill_layer *L) {
    free(L->ssm_conv);
    free(L->ssm_dt);
    free(L->ssm_a);
    free(L->ssm_norm);
    free(L->ssm_d);
    free(L->ssm_conv_b);
}

/* ---------------------------------------------------------------- shared arithmetic */

/* The key head a value head reads: Qwen 3.5 tiles the key heads over the value heads, Qwen3-Next
 * gives each key head a run of consecutive value heads. */
static inline int64_t key_head(const quill_model *m, int64_t h) {
    const quill_arch_params *ap = &m->ap;
    return m->arch->ssm_grouped ? h / (ap->ssm_v_heads / ap->ssm_k_heads) : h % ap->ssm_k_heads;
}

/* Value head h's beta and alpha inputs of one token: from ssm_beta's and ssm_alpha's rows (b, a),
 * or from ssm_ba's row (b), where key head kh holds its heads' betas, then their alphas. */
static inline void beta_alpha(const quill_model *m, const float *b, const float *a, int64_t h, float *beta,
                              float *alpha) {
    if (m->arch->ssm_grouped) {
        const int64_t ratio = m->ap.ssm_v_heads / m->ap.ssm_k_heads, kh = h / ratio, i = h % ratio;
        *beta = b[kh * 2 * ratio + i];
        *alpha = b[kh * 2 * ratio + ratio + i];
    } else {
        *beta = b[h];
        *alpha = a[h];
    }
}

static inline float sigmoid_f(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus_f(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

/* x / max(‖x‖, eps), the sum of squares in double as the reference's */
static void l2_norm(float *x, int64_t n, float eps) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    const float scale = 1.0f / fmaxf(sqrtf((float)sum), eps);
    for (int64_t i = 0; i < n; i++) x[i] *= scale;
}

/* Splits one token's fused ssm_in row (per key head: q, k, then its value heads' v, then their z)
 * into the conv channels (all q, all k, all v) and z. */
#define SPLIT_QKVZ(T)                                                                                          \
    static void split_qkvz_##T(const quill_arch_params *ap, const T *row, T *mixed, T *z) {                 \
        const int64_t S = ap->ssm_state, r = ap->ssm_v_heads / ap->ssm_k_heads, key_dim = S * ap->ssm_k_heads; \
        for (int64_t kh = 0; kh < ap->ssm_k_heads; kh++) {                                                   \
            const T *g = row + kh * (2 * S + 2 * S * r);                                                     \
            memcpy(mixed + kh * S, g, (size_t)S * sizeof(T));                                                \
            memcpy(mixed + key_dim + kh * S, g + S, (size_t)S * sizeof(T));                                  \
            memcpy(mixed + 2 * key_dim + kh * S * r, g + 2 * S, (size_t)(S * r) * sizeof(T));                \
            memcpy(z + kh * S * r, g + 2 * S + S * r, (size_t)(S * r) * sizeof(T));                          \
        }                                                                                                    \
    }
SPLIT_QKVZ(float)
SPLIT_QKVZ(double)

/* ---------------------------------------------------------------- fast pass */

typedef struct {
    quill_context *c;
    const quill_layer *L;
    int layer, n_tok;
} dn_job;

/* silu(x) = x / (1 + e^-x) with libm's expf. (The kernels' SwiGLU against ones, whose exponential
 * has a vector form, was tried: its ~1 ulp moved the dense test model's logits 1.4e-5 from float64,
 * past the 1e-5 the hybrids keep.) */
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* The causal convolution (conv_window.h), one item per block of CONV_BLOCK channels, the tokens in
 * order: out = silu(Σ + bias), in place of the input. */
static void conv_blocks(void *arg, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    const dn_job *j = arg;
    const quill_context *c = j->c;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t K = ap->ssm_kernel, conv_dim = ap->ssm_conv_dim, W = K - 1;
    float *mixed = c->rec->mixed;
    float taps[MAX_KERNEL][CONV_BLOCK], ring[MAX_KERNEL][CONV_BLOCK], sum[CONV_BLOCK];
    for (int64_t b = b0; b < b1; b++) {
        const int64_t ch0 = b * CONV_BLOCK, n = conv_dim - ch0 < CONV_BLOCK ? conv_dim - ch0 : CONV_BLOCK;
        conv_block_taps(taps, j->L->ssm_conv, K, ch0, n);
        for (int t0 = 0, t1; t0 < j->n_tok; t0 = t1) {
            for (t1 = t0 + 1; t1 < j->n_tok && c->ub_seq[t1] == c->ub_seq[t0]; t1++) {}
            float *st = (float *)quill_recurrent_conv(c, c->ub_seq[t0], j->layer) + ch0 * W;
            conv_ring_load(ring, st, W, n);
            int64_t head = 0;
            for (int t = t0; t < t1; t++) {
                float *x = mixed + (size_t)t * conv_dim + ch0;
                conv_ring_sum(sum, ring, taps, head, W, x, n);
                /* (Mamba-2's bias comes after the taps' sum, as the reference adds it) */
                if (j->L->ssm_conv_b)
                    for (int64_t ch = 0; ch < n; ch++) sum[ch] += j->L->ssm_conv_b[ch0 + ch];
                conv_ring_push(ring, &head, W, x, n);
                for (int64_t ch = 0; ch < n; ch++) x[ch] = silu_f(sum[ch]);
            }
            conv_ring_store(st, ring, head, W, n);
        }
    }
}

void quill_causal_conv(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    dn_job j = {c, L, layer, n_tok};
    quill_pool_run(c->pool, conv_blocks, &j, (c->model->ap.ssm_conv_dim + CONV_BLOCK - 1) / CONV_BLOCK, 1);
}

/* q and k of each token, L2-normalised per key head */
static void l2_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const dn_job *j = arg;
    const quill_context *c = j->c;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t S = ap->ssm_state;
    for (int64_t t = t0; t < t1; t++) {
        float *row = c->rec->mixed + t * ap->ssm_conv_dim;
        for (int64_t h = 0; h < 2 * ap->ssm_k_heads; h++) l2_norm(row + h * S, S, (float)c->hp->rms_eps);
    }
}

/* The delta rule for one value head per item: its gates for every token, then the kernel on each
 * run of consecutive tokens of one sequence (a token's arithmetic is the same whatever the runs). */
static void delta_heads(void *arg, int64_t h0, int64_t h1, int thread) {
    (void)thread;
    const dn_job *j = arg;
    const quill_context *c = j->c;
    const quill_layer *L = j->L;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t S = ap->ssm_state, H = ap->ssm_v_heads, key_dim = S * ap->ssm_k_heads, value_dim = S * H;
    const int64_t conv_dim = ap->ssm_conv_dim;
    const float scale = 1.0f / sqrtf((float)S);
    quill_recurrent *r = c->rec;
    for (int64_t h = h0; h < h1; h++) {
        const int64_t kh = key_head(c->model, h), bw = c->model->arch->ssm_grouped ? 2 * H : H;
        for (int t = 0; t < j->n_tok; t++) {
            float b, a;
            beta_alpha(c->model, r->beta + (size_t)t * bw, r->alpha + (size_t)t * H, h, &b, &a);
            r->gate_beta[(size_t)t * H + h] = sigmoid_f(b);
            r->decay[(size_t)t * H + h] = expf(softplus_f(a + L->ssm_dt[h]) * L->ssm_a[h]);
        }
        for (int t0 = 0, t1; t0 < j->n_tok; t0 = t1) {
            for (t1 = t0 + 1; t1 < j->n_tok && c->ub_seq[t1] == c->ub_seq[t0]; t1++) {}
            const float *row = r->mixed + (size_t)t0 * conv_dim;
            float *M = (float *)quill_recurrent_ssm(c, c->ub_seq[t0], j->layer) + h * S * S;
            c->kern->delta_rule(M, S, t1 - t0, row + kh * S, row + key_dim + kh * S, conv_dim,
                                row + 2 * key_dim + h * S, conv_dim, r->decay + (size_t)t0 * H + h,
                                r->gate_beta + (size_t)t0 * H + h, H, scale, r->out + (size_t)t0 * value_dim + h * S,
                                value_dim);
        }
    }
}

/* The gated RMS norm per token and value head: rmsnorm(o) · ssm_norm · silu(z), into z. */
static void gated_norm_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const dn_job *j = arg;
    const quill_context *c = j->c;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t S = ap->ssm_state, value_dim = S * ap->ssm_v_heads;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t h = 0; h < ap->ssm_v_heads; h++) {
            const float *o = c->rec->out + t * value_dim + h * S;
            float *z = c->rec->z + t * value_dim + h * S;
            double ss = 0;
            for (int64_t i = 0; i < S; i++) ss += (double)(o[i] * o[i]);
            const float r = 1.0f / sqrtf((float)(ss / (double)S) + (float)c->hp->rms_eps);
            for (int64_t i = 0; i < S; i++) z[i] = (o[i] * r) * j->L->ssm_norm[i] * silu_f(z[i]);
        }
}

void quill_deltanet_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t S = ap->ssm_state, H = ap->ssm_v_heads, value_dim = S * H;
    quill_recurrent *r = c->rec;
    /* (ssm_ba's rows fill beta's and alpha's scratch, which follow each other) */
    if (L->ssm_gate.data) {
        quill_matmuls(c, (const quill_weight *[]){&L->ssm_in, &L->ssm_gate, &L->ssm_beta, &L->ssm_alpha},
                      (float *[]){r->mixed, r->z, r->beta, r->alpha}, L->ssm_alpha.data ? 4 : 3, c->xb, n_tok);
    } else {
        quill_matmuls(c, (const quill_weight *[]){&L->ssm_in, &L->ssm_beta}, (float *[]){r->qkvz, r->beta}, 2, c->xb,
                      n_tok);
        quill_trace(c, "linear_attn_mixed_qkvz", layer, r->qkvz, 2, L->ssm_in.rows, n_tok, 1);
        for (int t = 0; t < n_tok; t++)
            split_qkvz_float(ap, r->qkvz + (size_t)t * L->ssm_in.rows, r->mixed + (size_t)t * ap->ssm_conv_dim,
                             r->z + (size_t)t * value_dim);
    }
    quill_trace(c, "linear_attn_qkv_mixed", layer, r->mixed, 2, ap->ssm_conv_dim, n_tok, 1);
    quill_trace(c, "z", layer, r->z, 2, value_dim, n_tok, 1);
    dn_job j = {c, L, layer, n_tok};
    quill_causal_conv(c, L, layer, n_tok);
    quill_trace(c, "conv_output_silu", layer, r->mixed, 2, ap->ssm_conv_dim, n_tok, 1);
    quill_pool_run(c->pool, l2_rows, &j, n_tok, 1);
    quill_pool_run(c->pool, delta_heads, &j, H, 1);
    quill_trace(c, "attn_output", layer, r->out, 3, S, H, n_tok);
    quill_pool_run(c->pool, gated_norm_rows, &j, n_tok, 1);
    quill_trace(c, "final_output", layer, r->z, 2, value_dim, n_tok, 1);
    quill_matmul(c, &L->ssm_out, r->z, n_tok, c->xb);
    quill_trace(c, "linear_attn_out", layer, c->xb, 2, c->hp->n_embd, n_tok, 1);
}

/* ---------------------------------------------------------------- gated attention */

void quill_attn_gate_split(quill_context *c, int n_tok) {
    const int64_t hd = c->hp->head_dim, nh = c->hp->n_head, q_dim = nh * hd;
    for (int t = 0; t < n_tok; t++)
        for (int64_t h = 0; h < nh; h++) {
            const float *src = c->rec->qfull + (size_t)t * 2 * q_dim + h * 2 * hd;
            memcpy(c->q + (size_t)t * q_dim + h * hd, src, (size_t)hd * sizeof(float));
            memcpy(c->rec->gate + (size_t)t * q_dim + h * hd, src + hd, (size_t)hd * sizeof(float));
        }
}

void quill_attn_gate_apply(quill_context *c, int n_tok) {
    const int64_t n = (int64_t)n_tok * c->hp->n_head * c->hp->head_dim;
    for (int64_t i = 0; i < n; i++) c->att[i] *= sigmoid_f(c->rec->gate[i]);
}

/* ---------------------------------------------------------------- float64 pass */

quill_status quill_deltanet_exact(const quill_context *c, const quill_layer *L, int layer, const double *in,
                                  double *out, quill_error *err) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t S = ap->ssm_state, H = ap->ssm_v_heads, K = ap->ssm_kernel, conv_dim = ap->ssm_conv_dim;
    const int64_t key_dim = S * ap->ssm_k_heads, value_dim = S * H, d = c->hp->n_embd;
    const double eps = c->hp->rms_eps;
    int64_t widest = conv_dim > d ? conv_dim : d;
    double *mixed = malloc((size_t)(conv_dim + value_dim) * sizeof *mixed), *z = malloc((size_t)value_dim * sizeof *z);
    double *qkvz = malloc((size_t)(conv_dim + value_dim) * sizeof *qkvz);
    double *b = malloc((size_t)(2 * H) * sizeof *b), *a = malloc((size_t)H * sizeof *a);
    double *o = malloc((size_t)value_dim * sizeof *o), *delta = malloc((size_t)S * sizeof *delta);
    float *row = malloc((size_t)widest * sizeof *row), *tmp = malloc((size_t)widest * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!mixed || !z || !qkvz || !b || !a || !o || !delta || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    if (L->ssm_gate.data) {
        quill_ref_matvec(&L->ssm_in, in, mixed, row);
        quill_ref_matvec(&L->ssm_gate, in, z, row);
    } else {
        quill_ref_matvec(&L->ssm_in, in, qkvz, row);
        split_qkvz_double(ap, qkvz, mixed, z);
    }
    quill_ref_matvec(&L->ssm_beta, in, b, row);
    if (L->ssm_alpha.data) quill_ref_matvec(&L->ssm_alpha, in, a, row);
    quill_ref_trace(c, "linear_attn_qkv_mixed", layer, mixed, conv_dim, 2, conv_dim, 1, tmp);
    quill_ref_trace(c, "z", layer, z, value_dim, 2, value_dim, 1, tmp);
    double *conv = quill_recurrent_conv(c, 0, layer), *state = quill_recurrent_ssm(c, 0, layer);
    for (int64_t ch = 0; ch < conv_dim; ch++) {
        const double sum = conv_ref_step(conv + ch * (K - 1), L->ssm_conv + ch * K, K, mixed[ch]);
        mixed[ch] = sum / (1.0 + exp(-sum));
    }
    quill_ref_trace(c, "conv_output_silu", layer, mixed, conv_dim, 2, conv_dim, 1, tmp);
    for (int64_t h = 0; h < 2 * ap->ssm_k_heads; h++) {
        double *x = mixed + h * S, ss = 0;
        for (int64_t i = 0; i < S; i++) ss += x[i] * x[i];
        const double scale = 1.0 / fmax(sqrt(ss), eps);
        for (int64_t i = 0; i < S; i++) x[i] *= scale;
    }
    for (int64_t h = 0; h < H; h++) {
        const int64_t kh = key_head(c->model, h);
        const double *q = mixed + kh * S, *k = mixed + key_dim + kh * S, *v = mixed + 2 * key_dim + h * S;
        double bh, ah;
        if (c->model->arch->ssm_grouped) {
            const int64_t ratio = H / ap->ssm_k_heads, i = h % ratio;
            bh = b[kh * 2 * ratio + i];
            ah = b[kh * 2 * ratio + ratio + i];
        } else {
            bh = b[h];
            ah = a[h];
        }
        const double beta = 1.0 / (1.0 + exp(-bh));
        const double x = ah + L->ssm_dt[h];
        const double decay = exp((x > 20 ? x : log1p(exp(x))) * L->ssm_a[h]);
        double *M = state + h * S * S;
        for (int64_t i = 0; i < S * S; i++) M[i] *= decay;
        for (int64_t jv = 0; jv < S; jv++) {
            double sum = 0;
            for (int64_t i = 0; i < S; i++) sum += M[jv * S + i] * k[i];
            delta[jv] = (v[jv] - sum) * beta;
        }
        for (int64_t jv = 0; jv < S; jv++)
            for (int64_t i = 0; i < S; i++) M[jv * S + i] += k[i] * delta[jv];
        for (int64_t jv = 0; jv < S; jv++) {
            double sum = 0;
            for (int64_t i = 0; i < S; i++) sum += M[jv * S + i] * q[i];
            o[h * S + jv] = sum / sqrt((double)S);
        }
    }
    quill_ref_trace(c, "attn_output", layer, o, value_dim, 3, S, H, tmp);
    for (int64_t h = 0; h < H; h++) {
        double ss = 0;
        for (int64_t i = 0; i < S; i++) ss += o[h * S + i] * o[h * S + i];
        const double r = 1.0 / sqrt(ss / (double)S + eps);
        for (int64_t i = 0; i < S; i++) {
            const double g = z[h * S + i];
            z[h * S + i] = o[h * S + i] * r * L->ssm_norm[i] * (g / (1.0 + exp(-g)));
        }
    }
    quill_ref_trace(c, "final_output", layer, z, value_dim, 2, value_dim, 1, tmp);
    quill_ref_matvec(&L->ssm_out, z, out, row);
    quill_ref_trace(c, "linear_attn_out", layer, out, d, 2, d, 1, tmp);
done:
    free(mixed); free(z); free(qkvz); free(b); free(a); free(o); free(delta); free(row); free(tmp);
    return s;
}
