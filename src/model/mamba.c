/* Mamba-2 mixers (Nemotron-H, Granite 4.0-H), as the reference's build_mamba2_layer and its CPU
 * ssm_conv / ssm_scan compute them, in the fast pass and in the float64 pass:
 *
 *   [z | xBC | dt] = h·W_in         z, x: d_inner = heads × head size; B, C: groups × state; dt: heads
 *   xBC = silu(causal depthwise conv of `kernel` taps over the sequence's last inputs + conv bias)
 *   per head h (group g = h / (heads / groups)), state S [head size][state]:
 *       Δ = softplus(dt_h + dt_bias_h);  S = e^(Δ·A_h)·S + (Δ·x) Bᵀ;  y = S C + D_h·x
 *   y = y · silu(z);  y = rmsnorm(y per group of d_inner / groups) · ssm_norm;  out = y·W_out
 *
 * ssm_a holds A itself (the converter stores -exp(A_log)); ssm_a and ssm_d have no ".weight". The
 * state and its checkpoints are the hybrids' (recurrent.c); the convolution is the DeltaNet's
 * (deltanet.c). The scan runs token by token in order, one head per work item, so that a token's
 * bits do not depend on the batching or the threads. */
#include "model/recurrent.h"
#include "model/forward.h"
#include "base/error.h"
#include "model/conv_window.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_KERNEL 64
#define MAX_STATE 4096

/* ---------------------------------------------------------------- loading */

quill_status quill_mamba_layer_value(const quill_gguf *g, const char *key, int64_t n_layer, int64_t layer,
                                     int64_t fallback, int64_t *out, quill_error *err) {
    const quill_gguf_value *v = quill_gguf_find(g, key);
    if (!v) {
        if (fallback < 0)
            return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s is missing", quill_gguf_path(g), key);
        *out = fallback;
        return QUILL_OK;
    }
    int64_t value = -1;
    if (v->type != QUILL_GGUF_ARRAY) {
        if (!quill_gguf_value_i64(v, &value)) value = -1;
    } else {
        if (v->count != (uint64_t)n_layer)
            return quill_fail(err, QUILL_E_FORMAT, "%s: %s has %llu values for %lld layers", quill_gguf_path(g), key,
                              (unsigned long long)v->count, (long long)n_layer);
        uint64_t cursor = 0;
        quill_gguf_value e;
        for (int64_t i = 0; i <= layer; i++)
            if (!quill_gguf_array_next(v, &cursor, &e) || !quill_gguf_value_i64(&e, &value)) value = -1;
    }
    if (value < 0 || value > 1 << 20)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s[%lld] = %lld is out of range (0..%d)", quill_gguf_path(g),
                          key, (long long)layer, (long long)value, 1 << 20);
    *out = value;
    return QUILL_OK;
}

quill_status quill_mamba_params(quill_model *m, quill_error *err) {
    const quill_gguf *g = m->gguf;
    const char *arch = m->arch->name, *path = quill_gguf_path(g);
    quill_arch_params *ap = &m->ap;
    quill_hparams *hp = &m->hp;
    quill_status s;
    if ((s = quill_ssm_size(g, arch, "ssm.conv_kernel", 1, MAX_KERNEL, &ap->ssm_kernel, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.state_size", 1, MAX_STATE, &ap->ssm_state, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.group_count", 1, 1 << 16, &ap->ssm_k_heads, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.time_step_rank", 1, 1 << 16, &ap->ssm_v_heads, err)) ||
        (s = quill_ssm_size(g, arch, "ssm.inner_size", 1, 1 << 24, &ap->ssm_inner, err)))
        return s;
    if (ap->ssm_inner % ap->ssm_v_heads || ap->ssm_v_heads % ap->ssm_k_heads)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: %s.ssm.inner_size = %lld must be a multiple of its %lld heads (ssm.time_step_rank), and "
                          "those of its %lld groups (ssm.group_count)",
                          path, arch, (long long)ap->ssm_inner, (long long)ap->ssm_v_heads, (long long)ap->ssm_k_heads);
    ap->ssm_conv_dim = ap->ssm_inner + 2 * ap->ssm_k_heads * ap->ssm_state;
    char latent_key[128];
    int64_t latent = 0;
    snprintf(latent_key, sizeof latent_key, "%s.moe_latent_size", arch);
    if ((s = quill_gguf_get_i64(g, latent_key, &latent, err)) && s != QUILL_E_NOT_FOUND) return s;
    if (latent > 0)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: %s = %lld: experts in a latent space (ffn_latent_down/up) are not implemented", path,
                          latent_key, (long long)latent);
    char kv_key[128], ff_key[128], head_key[128];
    snprintf(kv_key, sizeof kv_key, "%s.attention.head_count_kv", arch);
    snprintf(ff_key, sizeof ff_key, "%s.feed_forward_length", arch);
    snprintf(head_key, sizeof head_key, "%s.attention.head_count", arch);
    for (int64_t l = 0; l < hp->n_layer; l++) {
        quill_layer *L = &m->layers[l];
        int64_t kv, ff, heads;
        if ((s = quill_mamba_layer_value(g, head_key, hp->n_layer, l, -1, &heads, err)) ||
            (s = quill_mamba_layer_value(g, kv_key, hp->n_layer, l, -1, &kv, err)) ||
            (s = quill_mamba_layer_value(g, ff_key, hp->n_layer, l, 0, &ff, err)))
            return s;
        /* the layer's kind from the arrays alone, as the reference decides it */
        L->recurrent = kv == 0 && (!m->arch->single_block || ff == 0);
        L->ffn_only = m->arch->single_block && ff > 0;
        L->no_ffn = m->arch->single_block && ff == 0;
        L->n_head = heads ? heads : hp->n_head;
        L->n_head_kv = L->recurrent || L->ffn_only ? 0 : kv;
        L->head_dim = hp->head_dim;
        L->n_ff = ff;
        if (!L->recurrent && !L->ffn_only && (L->n_head_kv == 0 || L->n_head % L->n_head_kv))
            return quill_fail(err, QUILL_E_FORMAT, "%s: layer %lld: %lld heads are not a multiple of %lld KV heads", path,
                              (long long)l, (long long)L->n_head, (long long)L->n_head_kv);
    }
    return QUILL_OK;
}

quill_status quill_mamba_bind_layer(quill_model *m, int64_t l, quill_error *err) {
    const quill_arch_params *ap = &m->ap;
    const int64_t d = m->hp.n_embd, DI = ap->ssm_inner, G = ap->ssm_k_heads, H = ap->ssm_v_heads;
    const int64_t proj = 2 * DI + 2 * G * ap->ssm_state + H;
    quill_layer *L = &m->layers[l];
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
    quill_status s;
    if ((s = quill_model_bind(m, NAME("ssm_in.weight"), d, proj, &L->ssm_in, err)) ||
        (s = quill_model_floats(m, NAME("ssm_conv1d.weight"), ap->ssm_kernel, ap->ssm_conv_dim, &L->ssm_conv, err)) ||
        (quill_gguf_find_tensor(m->gguf, NAME("ssm_conv1d.bias")) &&
         (s = quill_model_floats(m, name, ap->ssm_conv_dim, 1, &L->ssm_conv_b, err))) ||
        (s = quill_model_floats(m, NAME("ssm_dt.bias"), H, 1, &L->ssm_dt, err)) ||
        (s = quill_model_floats(m, NAME("ssm_a"), 1, H, &L->ssm_a, err)) ||
        (s = quill_model_floats(m, NAME("ssm_d"), 1, H, &L->ssm_d, err)) ||
        (s = quill_model_floats(m, NAME("ssm_norm.weight"), DI / G, G, &L->ssm_norm, err)) ||
        (s = quill_model_bind(m, NAME("ssm_out.weight"), DI, d, &L->ssm_out, err)))
        return s;
#undef NAME
    return QUILL_OK;
}

/* ---------------------------------------------------------------- fast pass */

typedef struct {
    quill_context *c;
    const quill_layer *L;
    int layer, n_tok;
} mamba_job;

static inline float softplus_f(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }
static inline float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* The selective scan for one head per item, over each run of consecutive tokens of one sequence:
 * y = S·C + D·x after S = e^(Δ·A)·S + Δ·x·Bᵀ, in the reference's order of operations. */
static void scan_heads(void *arg, int64_t h0, int64_t h1, int thread) {
    (void)thread;
    const mamba_job *j = arg;
    const quill_context *c = j->c;
    const quill_layer *L = j->L;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t N = ap->ssm_state, H = ap->ssm_v_heads, G = ap->ssm_k_heads, DI = ap->ssm_inner, P = DI / H;
    const int64_t conv_dim = ap->ssm_conv_dim, proj = L->ssm_in.rows;
    const quill_recurrent *r = c->rec;
    for (int64_t h = h0; h < h1; h++) {
        const int64_t g = h / (H / G);
        for (int t0 = 0, t1; t0 < j->n_tok; t0 = t1) {
            for (t1 = t0 + 1; t1 < j->n_tok && c->ub_seq[t1] == c->ub_seq[t0]; t1++) {}
            float *S = (float *)quill_recurrent_ssm(c, c->ub_seq[t0], j->layer) + h * P * N;
            for (int t = t0; t < t1; t++) {
                const float *row = r->mixed + (size_t)t * conv_dim;
                const float *x = row + h * P, *B = row + DI + g * N, *C = row + DI + G * N + g * N;
                const float dt = softplus_f(r->qkvz[(size_t)t * proj + 2 * DI + 2 * G * N + h] + L->ssm_dt[h]);
                const float dA = expf(dt * L->ssm_a[h]);
                float *y = r->out + (size_t)t * DI + h * P;
                for (int64_t i = 0; i < P; i++) {
                    const float x_dt = x[i] * dt;
                    float *s = S + i * N, sum = 0.0f;
                    for (int64_t n = 0; n < N; n++) {
                        s[n] = s[n] * dA + B[n] * x_dt;
                        sum += s[n] * C[n];
                    }
                    y[i] = sum + x[i] * L->ssm_d[h];
                }
            }
        }
    }
}

/* Per token: y · silu(z), then the RMS norm of each group's slice with ssm_norm. */
static void gate_norm_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const mamba_job *j = arg;
    const quill_context *c = j->c;
    const quill_arch_params *ap = &c->model->ap;
    const int64_t DI = ap->ssm_inner, W = DI / ap->ssm_k_heads, proj = j->L->ssm_in.rows;
    for (int64_t t = t0; t < t1; t++) {
        float *y = c->rec->out + t * DI;
        const float *z = c->rec->qkvz + t * proj;
        for (int64_t i = 0; i < DI; i++) y[i] *= silu_f(z[i]);
        for (int64_t g = 0; g < ap->ssm_k_heads; g++) {
            float *v = y + g * W;
            double ss = 0;
            for (int64_t i = 0; i < W; i++) ss += (double)v[i] * v[i];
            const float scale = (float)(1.0 / sqrt(ss / (double)W + c->hp->rms_eps));
            for (int64_t i = 0; i < W; i++) v[i] = (v[i] * scale) * j->L->ssm_norm[g * W + i];
        }
    }
}

void quill_mamba_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t DI = ap->ssm_inner, conv_dim = ap->ssm_conv_dim, proj = L->ssm_in.rows;
    quill_recurrent *r = c->rec;
    quill_matmul(c, &L->ssm_in, c->xb, n_tok, r->qkvz);
    for (int t = 0; t < n_tok; t++)
        memcpy(r->mixed + (size_t)t * conv_dim, r->qkvz + (size_t)t * proj + DI, (size_t)conv_dim * sizeof(float));
    quill_causal_conv(c, L, layer, n_tok);
    quill_trace(c, "conv_output_silu", layer, r->mixed, 2, conv_dim, n_tok, 1);
    mamba_job j = {c, L, layer, n_tok};
    quill_pool_run(c->pool, scan_heads, &j, ap->ssm_v_heads, 1);
    quill_trace(c, "mamba2_y_add_d", layer, r->out, 2, DI, n_tok, 1);
    quill_pool_run(c->pool, gate_norm_rows, &j, n_tok, 1);
    quill_matmul(c, &L->ssm_out, r->out, n_tok, c->xb);
    quill_trace(c, "mamba_out", layer, c->xb, 2, c->hp->n_embd, n_tok, 1);
}

/* ---------------------------------------------------------------- float64 pass */

quill_status quill_mamba_exact(const quill_context *c, const quill_layer *L, int layer, const double *in, double *out,
                               quill_error *err) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t N = ap->ssm_state, H = ap->ssm_v_heads, G = ap->ssm_k_heads, DI = ap->ssm_inner, P = DI / H;
    const int64_t K = ap->ssm_kernel, conv_dim = ap->ssm_conv_dim, proj = L->ssm_in.rows, d = c->hp->n_embd;
    const int64_t widest = proj > d ? proj : d;
    double *zxbcdt = malloc((size_t)proj * sizeof *zxbcdt), *y = malloc((size_t)DI * sizeof *y);
    float *row = malloc((size_t)widest * sizeof *row), *tmp = malloc((size_t)widest * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!zxbcdt || !y || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    quill_ref_matvec(&L->ssm_in, in, zxbcdt, row);
    double *xbc = zxbcdt + DI, *dt = zxbcdt + DI + conv_dim;
    double *conv = quill_recurrent_conv(c, 0, layer), *state = quill_recurrent_ssm(c, 0, layer);
    for (int64_t ch = 0; ch < conv_dim; ch++) {
        double sum = conv_ref_step(conv + ch * (K - 1), L->ssm_conv + ch * K, K, xbc[ch]);
        if (L->ssm_conv_b) sum += L->ssm_conv_b[ch];
        xbc[ch] = sum / (1.0 + exp(-sum));
    }
    quill_ref_trace(c, "conv_output_silu", layer, xbc, conv_dim, 2, conv_dim, 1, tmp);
    for (int64_t h = 0; h < H; h++) {
        const int64_t g = h / (H / G);
        const double *x = xbc + h * P, *B = xbc + DI + g * N, *C = xbc + DI + G * N + g * N;
        const double v = dt[h] + L->ssm_dt[h], delta = v > 20 ? v : log1p(exp(v));
        const double dA = exp(delta * L->ssm_a[h]);
        for (int64_t i = 0; i < P; i++) {
            double *S = state + (h * P + i) * N, sum = 0;
            for (int64_t n = 0; n < N; n++) {
                S[n] = S[n] * dA + B[n] * x[i] * delta;
                sum += S[n] * C[n];
            }
            y[h * P + i] = sum + x[i] * L->ssm_d[h];
        }
    }
    quill_ref_trace(c, "mamba2_y_add_d", layer, y, DI, 2, DI, 1, tmp);
    for (int64_t i = 0; i < DI; i++) y[i] *= zxbcdt[i] / (1.0 + exp(-zxbcdt[i]));
    const int64_t W = DI / G;
    for (int64_t g = 0; g < G; g++) {
        double ss = 0;
        for (int64_t i = 0; i < W; i++) ss += y[g * W + i] * y[g * W + i];
        const double scale = 1.0 / sqrt(ss / (double)W + c->hp->rms_eps);
        for (int64_t i = 0; i < W; i++) y[g * W + i] *= scale * L->ssm_norm[g * W + i];
    }
    quill_ref_matvec(&L->ssm_out, y, out, row);
    quill_ref_trace(c, "mamba_out", layer, out, d, 2, d, 1, tmp);
done:
    free(zxbcdt);
    free(y);
    free(row);
    free(tmp);
    return s;
}
