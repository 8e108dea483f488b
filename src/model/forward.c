/* The fast forward pass, in the order the reference evaluates it:
 *
 *   x = embed(tokens)                                (· √n_embd: gemma)
 *   for each layer:
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = h·Wq (+bq), h·Wk (+bk), h·Wv (+bv)
 *       q, k = rmsnorm per head (qwen3, gemma3); rope(q, k); append k, v to the cache
 *       a = softmax(softcap(q·Kᵀ · scale), causal, sliding window) · V · Wo
 *       x += a                                       (rmsnorm(a) * attn_post_norm: gemma)
 *       h = rmsnorm(x) * ffn_norm
 *       f = ffn(h): the architecture's FFN block      (ffn_dense.c: (act(h·Wgate) * (h·Wup)) · Wdown,
 *                                                      act silu, or gelu for gemma)
 *       x += f                                       (rmsnorm(f) * ffn_post_norm: gemma)
 *   logits = softcap((rmsnorm(x) * output_norm) · Wout)
 *
 * The architecture (model.h's quill_arch) decides each step per layer, never per element.
 * Activations stay in f32; weights are dequantized row by row inside the matrix products (see
 * kernels.h). Every parallel loop splits work into items whose arithmetic does not depend on the
 * split, so results are bitwise identical for any thread count and any batching. */
#include "base/exp_poly.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/recurrent.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static float rms_scale(const float *x, int64_t n, double eps) {
    /* eight partial sums in double: one running sum was a chain of n dependent adds (~8000 cycles
     * for 2048 elements, 2 % of a prompt's time); a fixed order, so every token still gets the
     * same bits in any batch and on any thread */
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) part[0] += (double)x[i] * x[i];
    const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    return (float)(1.0 / sqrt(sum / (double)n + eps));
}

static void rmsnorm(float *restrict out, const float *restrict x, const float *restrict weight, int64_t n,
                    double eps) {
    const float scale = rms_scale(x, n, eps);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) out[i + k] = (x[i + k] * scale) * weight[i + k];
    for (; i < n; i++) out[i] = (x[i] * scale) * weight[i];
}

/* LayerNorm without bias, as the reference computes it: the mean and the variance summed in
 * double, x - mean and the scale in f32 (Cohere). */
static void layernorm(float *restrict out, const float *restrict x, const float *restrict weight, int64_t n,
                      double eps) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += x[i];
    const float mean = (float)(sum / (double)n);
    double var = 0;
    for (int64_t i = 0; i < n; i++) var += (double)(x[i] - mean) * (double)(x[i] - mean);
    const float scale = (float)(1.0 / sqrt(var / (double)n + eps));
    for (int64_t i = 0; i < n; i++) out[i] = ((x[i] - mean) * scale) * weight[i];
}

/* The same in place: x = rmsnorm(x) · weight. */
static void rmsnorm_in_place(float *restrict x, const float *restrict weight, int64_t n, double eps) {
    const float scale = rms_scale(x, n, eps);
    for (int64_t i = 0; i < n; i++) x[i] = (x[i] * scale) * weight[i];
}

/* Per token, in parallel over tokens: x += add (when add is set), then out = rmsnorm(x) · weight
 * (when out is set; out may be add). One token's row is one item, so its bits do not depend on
 * the batch or the threads. */
typedef struct {
    float *x;
    const float *add, *weight;
    float *out;
    int64_t d;
    double eps;
    bool layer_norm;
} norm_job;

/* x += a, four at a time so that the compiler packs them (n is a multiple of 4 in practice) */
static void add_into(float *restrict x, const float *restrict a, int64_t n) {
    int64_t i = 0;
    for (; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) x[i + k] += a[i + k];
    for (; i < n; i++) x[i] += a[i];
}

static void norm_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const norm_job *j = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *x = j->x + t * j->d;
        if (j->add) add_into(x, j->add + t * j->d, j->d);
        if (j->out && j->weight && j->layer_norm) layernorm(j->out + t * j->d, x, j->weight, j->d, j->eps);
        else if (j->out && j->weight) rmsnorm(j->out + t * j->d, x, j->weight, j->d, j->eps);
        else if (j->out) memcpy(j->out + t * j->d, x, (size_t)j->d * sizeof *x); /* no norm (OLMo 2) */
    }
}

static void add_and_norm(const quill_context *c, const float *add, const float *weight, float *out, int n) {
    norm_job j = {c->x, add, weight, out, c->hp->n_embd, c->hp->rms_eps, c->model->arch->layer_norm};
    quill_pool_run(c->pool, norm_rows, &j, n, 1);
}

/* RoPE on the first n_rot dims of each head, by pos·θ_i: adjacent pairs (x[2i], x[2i+1]), Llama's
 * layout. */
static void rope_adjacent(float *vec, int64_t n_heads, int64_t hd, int64_t half, const float *cs, const float *sn) {
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = vec + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            v[2 * i] = x0 * cs[i] - x1 * sn[i];
            v[2 * i + 1] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* The same with the halves (x[i], x[i + n_rot/2]): GPT-NeoX's layout (Qwen, Gemma, Phi-3). */
static void rope_neox(float *vec, int64_t n_heads, int64_t hd, int64_t half, const float *cs, const float *sn) {
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = vec + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float x0 = v[i], x1 = v[i + half];
            v[i] = x0 * cs[i] - x1 * sn[i];
            v[i + half] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

static void scale_in_place(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* RMS norm of each head's vector with one weight of head_dim (Qwen 3, Gemma 3's q/k norms). */
static void head_norms(float *vec, int64_t n_heads, int64_t hd, const float *weight, double eps) {
    for (int64_t h = 0; h < n_heads; h++) rmsnorm_in_place(vec + h * hd, weight, hd, eps);
}

static void add_bias(float *x, const float *b, int64_t n) {
    for (int64_t i = 0; i < n; i++) x[i] += b[i];
}

/* Per token, in parallel over tokens: the biases and q/k norms the architecture has, RoPE on its
 * queries and keys, then its key and value into layer `layer`'s cache at its position. */
typedef struct {
    const quill_context *c;
    int layer;
} rope_job;

static void rope_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const rope_job *j = arg;
    const quill_context *c = j->c;
    const quill_hparams *hp = c->hp;
    const quill_layer *L = &c->model->layers[j->layer];
    const int64_t hd = L->head_dim, q_dim = L->n_head * hd, kv_dim = L->n_head_kv * hd;
    const int64_t half = quill_rope_dims(c->model, L->rope_table) / 2, stride = quill_rope_stride(c->model);
    void (*rope)(float *, int64_t, int64_t, int64_t, const float *, const float *) =
        c->model->arch->rope == QUILL_ROPE_NEOX ? rope_neox : rope_adjacent;
    const float *cos_table = c->rope_cos + (size_t)L->rope_table * c->n_ctx * stride;
    const float *sin_table = c->rope_sin + (size_t)L->rope_table * c->n_ctx * stride;
    /* keys in blocks of positions, dimension-major within a block (see KEY_BLOCK); a position of a
     * head takes krow and vrow bytes in the cache's types */
    const int64_t kpos = quill_key_positions(c->n_ctx);
    const size_t krow = quill_kv_row_bytes(c->type_k, hd), vrow = quill_kv_row_bytes(c->type_v, hd);
    for (int64_t t = t0; t < t1; t++) {
        const int pos = c->ub_pos[t];
        const float *cs = cos_table + (size_t)pos * stride, *sn = sin_table + (size_t)pos * stride;
        float *q = c->q + t * q_dim, *k = c->k + t * kv_dim, *v = c->v + t * kv_dim;
        if (L->kv_shared) {
            /* the query alone: the keys and values are an earlier layer's */
            if (L->q_norm) head_norms(q, L->n_head, hd, L->q_norm, hp->rms_eps);
            if (!L->no_rope) rope(q, L->n_head, hd, half, cs, sn);
            continue;
        }
        uint8_t *kt = c->k_cache + quill_row_size(c->type_k, (int64_t)quill_kv_at(c, L, c->ub_seq[t], kpos));
        /* values head-major: one head's values are one contiguous stream for the hardware
         * prefetchers (position-major, a head's 256 bytes every kv_dim floats, the weighted sum
         * ran ~1.8x slower at 2000 positions) */
        uint8_t *vt = c->v_cache + quill_row_size(c->type_v, (int64_t)quill_kv_at(c, L, c->ub_seq[t], c->n_ctx));
        if (L->v_from_k) memcpy(v, k, (size_t)kv_dim * sizeof *k);
        if (L->bq) add_bias(q, L->bq, q_dim);
        if (L->bk) add_bias(k, L->bk, kv_dim);
        if (L->bv) add_bias(v, L->bv, kv_dim);
        if (L->q_norm && c->model->arch->qk_norm_full) {
            rmsnorm_in_place(q, L->q_norm, q_dim, hp->rms_eps);
            rmsnorm_in_place(k, L->k_norm, kv_dim, hp->rms_eps);
        } else if (L->q_norm) {
            head_norms(q, L->n_head, hd, L->q_norm, hp->rms_eps);
            head_norms(k, L->n_head_kv, hd, L->k_norm, hp->rms_eps);
        }
        if (c->model->arch->v_norm)
            for (int64_t h = 0; h < L->n_head_kv; h++) scale_in_place(v + h * hd, hd, rms_scale(v + h * hd, hd, hp->rms_eps));
        if (!L->no_rope) {
            rope(q, L->n_head, hd, half, cs, sn);
            rope(k, L->n_head_kv, hd, half, cs, sn);
        }
        /* (in the cache's types: rounded once, here, as the reference's cache stores them) */
        uint8_t *block = kt + (size_t)(pos / KEY_BLOCK) * KEY_BLOCK * krow;
        for (int64_t h = 0; h < L->n_head_kv; h++)
            quill_kv_store_key(c->type_k, block + (size_t)h * kpos * krow, pos % KEY_BLOCK, k + h * hd, hd);
        for (int64_t h = 0; h < L->n_head_kv; h++)
            quill_kv_store_value(c->type_v, vt + ((size_t)h * c->n_ctx + (size_t)pos) * vrow, v + h * hd, hd);
    }
}

/* Per token, in place: branch = rmsnorm(branch) · weight, Gemma's norm of each branch before the
 * residual. */
typedef struct {
    float *branch;
    const float *weight;
    int64_t d;
    double eps;
} post_norm_job;

static void post_norm_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const post_norm_job *j = arg;
    for (int64_t t = t0; t < t1; t++) rmsnorm_in_place(j->branch + t * j->d, j->weight, j->d, j->eps);
}

static void post_norm(const quill_context *c, float *branch, const float *weight, int n) {
    post_norm_job j = {branch, weight, c->hp->n_embd, c->hp->rms_eps};
    quill_pool_run(c->pool, post_norm_rows, &j, n, 1);
}

static void scale_rows(float *x, int64_t n, float s) {
    for (int64_t i = 0; i < n; i++) x[i] *= s;
}


/* ---------------------------------------------------------------- one micro-batch */

void quill_forward_ubatch(quill_context *c, const int32_t *tokens, const int32_t *seq, const int32_t *pos,
                          const bool *want, int n, float *logits) {
    const quill_model *m = c->model;
    const quill_hparams *hp = c->hp;
    const quill_arch_params *ap = &m->ap;
    const int64_t d = hp->n_embd;
    quill_row_dequant_fn embed = quill_kernels_dequant(c->kern, m->token_embd.type);

    /* attention's runs: a new one where the sequence changes, positions jump, or one is full */
    c->ub_seq = seq;
    c->ub_pos = pos;
    c->n_runs = 0;
    for (int t = 0; t < n; t++)
        if (t == 0 || seq[t] != seq[t - 1] || pos[t] != pos[t - 1] + 1 ||
            t - c->run_start[c->n_runs - 1] == ATT_TOKENS)
            c->run_start[c->n_runs++] = t;
    c->run_start[c->n_runs] = n;

    for (int t = 0; t < n; t++)
        embed(m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes, c->x + t * d, d);
    if (ap->embd_scale) scale_rows(c->x, n * d, ap->embd_scale);
    quill_trace(c, "inp_embd", -1, c->x, 2, d, n, 1);
    if (ap->n_embd_per_layer) quill_per_layer_inputs_prepare(c, tokens, n);

    bool logits_done = false; /* the device ran the output layer too */
    for (int l = 0; l < hp->n_layer; l++) {
        if (c->gpu_whole && l == c->gpu_whole->first) {
            /* the placed layers, whole on the device (gpu_offload.c), from c->x */
            logits_done = quill_gpu_run_layers(c, seq, pos, want, n, logits);
            break;
        }
        const quill_layer *L = &m->layers[l];
        const int64_t hd = L->head_dim, q_dim = L->n_head * hd;
        add_and_norm(c, NULL, L->attn_norm, c->xb, n);
        if (L->attn_norm) quill_trace(c, "attn_norm", l, c->xb, 2, d, n, 1);

        const quill_ffn_impl *ffn = quill_ffn_of(L->ffn);
        if (L->ffn_only) {
            ffn->fast(c, L, l, n); /* (Nemotron-H: the layer is its FFN) */
        } else if (L->shortconv) {
            quill_shortconv_fast(c, L, l, n); /* its output in xb */
            ffn->announce(c, L, n);
        } else if (L->recurrent) {
            if (m->arch->mamba2) quill_mamba_fast(c, L, l, n); /* its output in xb */
            else quill_deltanet_fast(c, L, l, n);
            if (!L->no_ffn) ffn->announce(c, L, n);
        } else if (L->mla) {
            quill_mla_fast(c, L, l, n); /* its output in xb */
            ffn->announce(c, L, n);
        } else {
            quill_announce(c, (const quill_weight *[]){&L->wo}, 1, n);
            quill_matmuls(c, (const quill_weight *[]){&L->wq, &L->wk, &L->wv},
                          (float *[]){L->attn_gated ? c->rec->qfull : c->q, c->k, c->v}, quill_projections(L), c->xb, n);
            if (L->attn_gated) quill_attn_gate_split(c, n);
            if (m->arch->trace_projections) {
                quill_trace(c, "Qcur", l, c->q, 3, hd, L->n_head, n);
                if (!L->kv_shared) quill_trace(c, "Kcur", l, c->k, 3, hd, L->n_head_kv, n);
                if (!L->kv_shared) quill_trace(c, "Vcur", l, L->v_from_k ? c->k : c->v, 3, hd, L->n_head_kv, n);
            }
            rope_job rj = {c, l};
            quill_pool_run(c->pool, rope_rows, &rj, n, 1);
            if (m->arch->trace_projections) {
                /* (traced before the norms and RoPE) */
            } else if (c->trace && m->arch->trace_q_scaled) {
                /* att is free until the attention writes it */
                for (int64_t i = 0; i < n * q_dim; i++) c->att[i] = c->q[i] * (float)ap->attn_scale;
                quill_trace(c, "Qcur", l, c->att, 3, hd, L->n_head, n);
            } else {
                quill_trace(c, "Qcur", l, c->q, 3, hd, L->n_head, n);
            }
            if (!m->arch->trace_projections) {
                quill_trace(c, "Kcur", l, c->k, 3, hd, L->n_head_kv, n);
                quill_trace(c, "Vcur", l, c->v, 3, hd, L->n_head_kv, n);
            }

            quill_attention(c, l, n);
            quill_trace(c, "kqv_out", l, c->att, 2, q_dim, n, 1);
            if (L->attn_gated) quill_attn_gate_apply(c, n);

            if (!L->no_ffn) ffn->announce(c, L, n);
            /* a parallel block keeps attn_norm's output in xb for the FFN: the attention's output
             * goes to q (q_dim = n_embd there), free once the scores are done */
            float *attn_out = m->arch->parallel_block ? c->q : c->xb;
            quill_matmul(c, &L->wo, c->att, n, attn_out);
            if (L->bo)
                for (int t = 0; t < n; t++) add_bias(attn_out + (size_t)t * d, L->bo, d);
            if (!m->arch->trace_projections) quill_trace(c, "attn_out", l, attn_out, 2, d, n, 1);
        }
        if (m->arch->single_block) {
            /* one block per layer: x += its output (the reference's l_out is an FFN's output) */
            if (L->ffn_only) quill_trace(c, "ffn_out", l, c->xb, 2, d, n, 1);
            if (L->ffn_only) quill_trace(c, "l_out", l, c->xb, 2, d, n, 1);
            add_and_norm(c, c->xb, NULL, NULL, n);
            quill_trace(c, "nemotron_h_block_out", l, c->x, 2, d, n, 1);
            continue;
        }
        if (m->arch->parallel_block) {
            /* x + ffn + attention, in the reference's order */
            ffn->fast(c, L, l, n);
            quill_trace(c, ffn->out_name, l, c->xb, 2, d, n, 1);
            add_and_norm(c, c->xb, NULL, NULL, n);
            add_and_norm(c, c->q, NULL, NULL, n);
            quill_trace(c, "l_out", l, c->x, 2, d, n, 1);
            continue;
        }
        if (L->attn_post_norm) {
            post_norm(c, c->xb, L->attn_post_norm, n);
            quill_trace(c, "attn_post_norm", l, c->xb, 2, d, n, 1);
        }
        if (ap->residual_scale) scale_rows(c->xb, n * d, ap->residual_scale);
        add_and_norm(c, c->xb, L->ffn_norm, c->xb, n); /* the residual, then the norm into xb */
        quill_trace(c, m->arch->hybrid ? "attn_residual" : m->arch->trace_projections ? "attn_out" : "ffn_inp", l, c->x,
                    2, d, n, 1);
        if (L->ffn_norm)
            quill_trace(c, m->arch->ffn_norm_post_attention ? "attn_post_norm" : "ffn_norm", l, c->xb, 2, d, n, 1);
        ffn->fast(c, L, l, n);
        quill_trace(c, ffn->out_name, l, c->xb, 2, d, n, 1);
        if (L->ffn_post_norm) {
            post_norm(c, c->xb, L->ffn_post_norm, n);
            quill_trace(c, "ffn_post_norm", l, c->xb, 2, d, n, 1);
        }
        if (ap->residual_scale) scale_rows(c->xb, n * d, ap->residual_scale);
        add_and_norm(c, c->xb, NULL, NULL, n);
        if (L->ple_gate.data) quill_per_layer_inputs_fast(c, L, l, n);
        if (L->out_scale) scale_rows(c->x, n * d, *L->out_scale);
        quill_trace(c, "l_out", l, c->x, 2, d, n, 1);
    }

    if (!logits_done) {
        add_and_norm(c, NULL, m->output_norm, c->xb, n);
        quill_trace(c, "result_norm", -1, c->xb, 2, d, n, 1);
    }
    if (logits) {
        /* the rows that asked for logits, gathered in order (row t only moves down) */
        int rows = 0;
        for (int t = 0; t < n; t++)
            if (want[t]) {
                if (rows != t && !logits_done) memcpy(c->xb + rows * d, c->xb + t * d, (size_t)d * sizeof(float));
                rows++;
            }
        /* the next token's first product */
        if (!logits_done) quill_announce_next_layer(c, -1, n);
        if (rows && !logits_done) quill_matmul(c, &m->output, c->xb, rows, logits);
        if (rows && ap->logit_multiplier) scale_rows(logits, rows * hp->n_vocab, ap->logit_multiplier);
        if (rows && ap->final_softcap > 0) {
            const float cap = ap->final_softcap, inv = 1.0f / cap;
            for (int64_t i = 0; i < rows * hp->n_vocab; i++) logits[i] = cap * tanh_poly(logits[i] * inv);
        }
    }
}
