/* The passes' building blocks, shared by forward.c, reference.c and every layer kind (deltanet.c,
 * mamba.c, shortconv.c, mla.c, ffn_dense.c, ffn_moe.c, per_layer.c). The fast pass's: weight
 * products on the context's threads (one matrix, or several over the same input at once), the next
 * weights announced to the prefetcher, gated activations, attention over the KV cache, traces; the
 * float64 pass's: a weight times a vector, the gated activations, traces. forward.c and reference.c
 * walk the layers and call the layer kinds; those call these, never the walkers. Every parallel loop splits
 * work into items whose arithmetic does not depend on the split: results are bitwise identical
 * for any thread count and any batching. */
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/recurrent.h"
#include "base/error.h"
#include "base/exp_poly.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- parallel building blocks */

typedef struct {
    const quill_weight *w;
    const float *x;
    int n_tok;
    float *y;
    quill_row_dequant_fn dequant;
    quill_vec_dot_fn fused;
    const quill_context *c;
} matmul_job;

static void matmul_rows(void *arg, int64_t r0, int64_t r1, int thread) {
    const matmul_job *j = arg;
    const quill_weight *w = j->w;
    float *row = j->c->thread_scratch + (size_t)thread * j->c->thread_scratch_len;
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *src = w->data + (size_t)r * w->row_bytes;
        if (j->fused) {
            j->fused(src, j->x, w->cols, j->n_tok, w->cols, j->y + r, w->rows);
            continue;
        }
        const float *wf = (const float *)src;
        if (w->type != QUILL_TYPE_F32) {
            j->dequant(src, row, w->cols);
            wf = row;
        }
        j->c->kern->dot(wf, j->x, w->cols, j->n_tok, w->cols, j->y + r, w->rows);
    }
}

/* The whole-matrix product for w (NULL: none) and the matrix it reads: the packed copy when
 * the context's kernels read one. */
static quill_matmul_fn matrix_product(const quill_context *c, const quill_weight *w, float *y, quill_matrix *m) {
    if (c->packed && w->packed && c->kern->matmul_packed[w->type]) {
        *m = (quill_matrix){w->packed, w->row_bytes, w->rows, y};
        return c->kern->matmul_packed[w->type];
    }
    *m = (quill_matrix){w->data, w->row_bytes, w->rows, y};
    return c->kern->matmul[w->type];
}

/* y = W · x over the pool, or (pool NULL) on the calling thread with its scratch: `thread` indexes
 * the dequantized-row scratch, `scratch` is the kernel's. */
static void matmul_on(const quill_context *c, const quill_weight *w, const float *x, int n_tok, float *y,
                      quill_pool *pool, void *scratch, int thread) {
    if (quill_gpu_product(c, w, x, n_tok, y)) return;
    quill_matrix m;
    const quill_matmul_fn product = matrix_product(c, w, y, &m);
    if (product) {
        product(&m, 1, w->cols, x, n_tok, pool, scratch);
        return;
    }
    matmul_job j = {w, x, n_tok, y, quill_kernels_dequant(c->kern, w->type), c->kern->vec_dot[w->type], c};
    if (!pool) {
        matmul_rows(&j, 0, w->rows, thread);
        return;
    }
    int64_t grain = w->rows / (c->n_threads * 16);
    quill_pool_run(pool, matmul_rows, &j, w->rows, grain < 1 ? 1 : grain);
}

/* y[t][r] = W[r] · x[t] for every token t < n_tok; x is [n_tok][cols], y is [n_tok][rows]. */
void quill_matmul(const quill_context *c, const quill_weight *w, const float *x, int n_tok, float *y) {
    matmul_on(c, w, x, n_tok, y, c->pool, c->matmul_scratch, 0);
}

/* How many of w[0..n), from the first, go to the kernel as one product (matmuls); their matrices
 * in m, and *fn the product (NULL: none, w[0] alone by rows). y may be NULL. */
static int product_group(const quill_context *c, const quill_weight *const *w, float *const *y, int n,
                         quill_matrix *m, quill_matmul_fn *fn) {
    *fn = matrix_product(c, w[0], y ? y[0] : NULL, &m[0]);
    int j = 1;
    for (; *fn && j < n && j < QUILL_MATMUL_MAX_MATS; j++)
        if (w[j]->cols != w[0]->cols || matrix_product(c, w[j], y ? y[j] : NULL, &m[j]) != *fn) break;
    return j;
}

/* The products of n weights with the same input, y[i] = W[i] · x. Neighbours of one type go to
 * the kernel together: the input is then quantized once and their rows make one parallel loop (q,
 * k and v: one wait instead of three per layer and token). Same results as one by one. */
static void matmuls_on(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                       int n_tok, quill_pool *pool, void *scratch, int thread) {
    for (int i = 0; i < n;) {
        if (c->gpu) { /* the device runs the uploaded ones, neighbours of this input in one submission */
            const int done = quill_gpu_products(c, w + i, y + i, n - i, x, n_tok);
            if (!done) matmul_on(c, w[i], x, n_tok, y[i], pool, scratch, thread);
            i += done ? done : 1;
            continue;
        }
        quill_matrix m[QUILL_MATMUL_MAX_MATS];
        quill_matmul_fn joined;
        const int group = product_group(c, w + i, y + i, n - i, m, &joined);
        if (group == 1) matmul_on(c, w[i], x, n_tok, y[i], pool, scratch, thread);
        else joined(m, group, w[i]->cols, x, n_tok, pool, scratch);
        i += group;
    }
}

void quill_matmuls(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                   int n_tok) {
    matmuls_on(c, w, y, n, x, n_tok, c->pool, c->matmul_scratch, 0);
}

void quill_matmuls_here(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                        int n_tok, void *scratch, int thread) {
    matmuls_on(c, w, y, n, x, n_tok, NULL, scratch, thread);
}

/* Tokens up to which a pass announces each coming product to the pool (quill_pool_warm): few
 * tokens read every weight once and wait for memory; more are bound by arithmetic. */
#define WARM_TOKENS 16

/* Announces the first product that matmuls(w, n) will run, as the one after the product about to
 * run: a thread that waits meanwhile (for its next job, or at the end of one for the others)
 * prefetches the first bytes of its part there. Prefetched, the next start finds its first lines
 * in L2 instead of waiting for memory, and the idle thread reads memory in gaps where it read
 * none: q4_0 tg 1.018x with 2 threads, q8_0 1.015x, q6_k 1.020x (with the change beside it in
 * kernels_vnni.c; alternating in one process). */
void quill_announce(const quill_context *c, const quill_weight *const *w, int n, int n_tok) {
    if (n_tok > WARM_TOKENS) return;
    quill_matrix m[QUILL_MATMUL_MAX_MATS];
    quill_matmul_fn fn;
    const int group = product_group(c, w, NULL, n, m, &fn);
    quill_pool_span spans[QUILL_MATMUL_MAX_MATS];
    for (int i = 0; i < group; i++) {
        const bool packed = m[i].w == w[i]->packed;
        spans[i] = (quill_pool_span){m[i].w, packed ? c->kern->pack_bytes(w[i]->type, w[i]->rows, w[i]->cols)
                                                    : (size_t)w[i]->rows * w[i]->row_bytes};
    }
    quill_pool_warm(c->pool, spans, group);
}

void quill_announce_next_layer(const quill_context *c, int layer, int n_tok) {
    const quill_model *m = c->model;
    if (layer + 1 < c->hp->n_layer && m->layers[layer + 1].ffn_only) {
        m->layers[layer + 1].ffn_impl->announce(c, &m->layers[layer + 1], n_tok);
    } else if (layer + 1 < c->hp->n_layer && m->layers[layer + 1].recurrent) {
        quill_announce(c, (const quill_weight *[]){&m->layers[layer + 1].ssm_in}, 1, n_tok);
    } else if (layer + 1 < c->hp->n_layer) {
        const quill_layer *N = &m->layers[layer + 1];
        quill_announce(c, (const quill_weight *[]){N->q_a.data ? &N->q_a : &N->wq, &N->wk, &N->wv}, quill_projections(N),
                       n_tok);
    } else {
        quill_announce(c, (const quill_weight *[]){&m->output}, 1, n_tok);
    }
}

/* 1 / sqrt(mean(x²) + eps) */
/* SwiGLU over rows of the feed-forward activations: gate = silu(gate) * up. */
typedef struct {
    const quill_kernels *kern;
    float *gate;
    const float *up;
    int64_t n_ff;
} swiglu_job;

static void swiglu_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const swiglu_job *j = arg;
    j->kern->swiglu(j->gate + t0 * j->n_ff, j->up + t0 * j->n_ff, (t1 - t0) * j->n_ff);
}

/* gate = gelu(gate) · up, GELU in its tanh form (Gemma's GeGLU) */
static void geglu_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const swiglu_job *j = arg;
    float *gate = j->gate + t0 * j->n_ff;
    const float *up = j->up + t0 * j->n_ff;
    const float k = 0.7978845608028654f; /* sqrt(2 / pi) */
    for (int64_t i = 0; i < (t1 - t0) * j->n_ff; i++) {
        const float x = gate[i];
        gate[i] = 0.5f * x * (1.0f + tanh_poly(k * x * (1.0f + 0.044715f * x * x))) * up[i];
    }
}

/* gpt-oss's clamped SwiGLU: x·sigmoid(1.702·x)·(y + 1), x = min(gate, 7), y = clamp(up, -7, 7), with
 * exp_poly.h's exponential (the GPU's glu.comp gives these bits) */
static void swiglu_oai_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const swiglu_job *j = arg;
    float *gate = j->gate + t0 * j->n_ff;
    const float *up = j->up + t0 * j->n_ff;
    for (int64_t i = 0; i < (t1 - t0) * j->n_ff; i++) {
        const float x = gate[i] < QUILL_OAI_LIMIT ? gate[i] : QUILL_OAI_LIMIT;
        const float y = up[i] < -QUILL_OAI_LIMIT ? -QUILL_OAI_LIMIT : up[i] > QUILL_OAI_LIMIT ? QUILL_OAI_LIMIT : up[i];
        gate[i] = x / (1.0f + exp_poly(-QUILL_OAI_ALPHA * x)) * (y + 1.0f);
    }
}

static void gated_activation_on(const quill_context *c, quill_pool *pool, float *gate, const float *up, int n_tok,
                                int64_t width) {
    swiglu_job j = {c->kern, gate, up, width};
    const quill_activation act = c->model->arch->act;
    quill_pool_run(pool, act == QUILL_ACT_GELU_TANH ? geglu_rows : act == QUILL_ACT_SWIGLU_OAI ? swiglu_oai_rows : swiglu_rows,
                   &j, n_tok, 1);
}

void quill_gated_activation(const quill_context *c, float *gate, const float *up, int n_tok, int64_t width) {
    gated_activation_on(c, c->pool, gate, up, n_tok, width);
}

void quill_gated_activation_here(const quill_context *c, float *gate, const float *up, int n_tok, int64_t width) {
    gated_activation_on(c, NULL, gate, up, n_tok, width);
}

typedef struct {
    quill_context *c;
    int layer, n_tok;
} attn_job;

/* The key cache of one KV head is blocks of KEY_BLOCK positions, each dimension-major (context.h).
 * Dimension-major, the scores of 16 positions are one vector of fused multiply-adds (no
 * reductions); blocked, a block's head_dim × KEY_BLOCK floats are one contiguous read, where
 * dimension-major over the whole context a block was head_dim runs of 256 bytes a context apart:
 * a Llama-2-7B-shaped layer (32 KV heads of 128) generates 1.03-1.23x faster after 3584
 * positions with the blocks (bench/README.md). */

/* cap · tanh(x / cap) over one token's scores (Gemma 2), before the softmax */
static void softcap_scores(float *x, int n, float scale, float cap) {
    const float inv = 1.0f / cap;
    for (int p = 0; p < n; p++) x[p] = cap * tanh_poly(x[p] * scale * inv);
}

/* The softmax with a learned sink logit per head (gpt-oss): its e^(sink - m) joins the denominator,
 * m the largest of the scaled scores and the sink. The kernel's softmax without it gives
 * p = e^(s·x - m')/S' (m' the largest scaled score, where p = e^0/S' = 1/S'), and with the sink
 * every p is scaled by S'/(S' + e^(sink - m')) = 1/(1 + p_max · e^(sink - m')), in double: the same
 * bits on every instruction set, the result within an f32 rounding of the direct sum. */
static void with_sink(const quill_context *c, float *row, int n, float scale, float sink) {
    float max = row[0];
    int at = 0;
    for (int p = 1; p < n; p++)
        if (row[p] > max) max = row[p], at = p;
    const double m = (double)(max * scale);
    c->kern->softmax(row, n, scale);
    const float f = (float)(1.0 / (1.0 + (double)row[at] * exp_f64((double)sink - m)));
    for (int p = 0; p < n; p++) row[p] *= f;
}

/* One item = one KV head and up to ATT_TOKENS consecutive tokens of the batch: causal softmax
 * attention over the cached positions for the query heads that share that KV head. The kernels
 * take a token's query heads together to reuse each key and value they load; the item's tokens
 * go through the keys and values a block of KEY_BLOCK positions at a time, so that a block (16-32
 * KB) serves them all from L1 instead of being read again per token. Every score and output is
 * still one chain of fused multiply-adds in position order (weighted_sum continues its chains
 * across blocks), so the bits do not depend on how the batch is split. A token sees the keys from
 * its first (0, or the start of its sliding window) to its own position.
 *
 * Items run KV head by KV head, so that a thread's successive items read the same head's cache,
 * which then stays in L2: in token order they cycled through every head's cache (3.6 MB at 2048
 * positions for TinyLlama, more than a core's 2 MB L2) — pp512 after 1536 cached tokens 1.21x
 * faster for that order alone. Blocks of 4 tokens on top: pp512 after 3584 cached tokens 1.42x
 * on a Llama-2-7B-shaped layer (32 KV heads of 128: 3.6 MB of cache per head, read from L3 per
 * token before), and TinyLlama's attention 24 % → 21.5 % of pp512 at 1536 (profiles). */
static void attention_items(void *arg, int64_t i0, int64_t i1, int thread) {
    const attn_job *j = arg;
    quill_context *c = j->c;
    const quill_layer *L = &c->model->layers[j->layer];
    const int64_t hd = L->head_dim, q_dim = L->n_head * hd;
    const int group = (int)(L->n_head / L->n_head_kv);
    const float base_scale = (float)c->model->ap.attn_scale, cap = c->model->ap.attn_softcap;
    const int64_t sstride = quill_score_stride(c->n_ctx);
    /* the scores of token i of an item: group rows from scores + i · group · sstride; after them,
     * the tile that a key block or value rows are decoded into when the cache is not in f32 */
    float *scores = c->thread_scratch + (size_t)thread * c->thread_scratch_len;
    float *tile = scores + c->tile_at;
    const int64_t kpos = quill_key_positions(c->n_ctx);
    const size_t krow = quill_kv_row_bytes(c->type_k, hd), vrow = quill_kv_row_bytes(c->type_v, hd);
    const int n_runs = c->n_runs;
    for (int64_t item = i0; item < i1; item++) {
        /* a run: consecutive tokens of one sequence at consecutive positions from p0 */
        const int64_t kvh = item / n_runs, run = item % n_runs, h0 = kvh * group;
        const int64_t t0 = c->run_start[run];
        const int nt = c->run_start[run + 1] - (int)t0, p0 = c->ub_pos[t0];
        const uint8_t *kc = c->k_cache + quill_row_size(c->type_k, (int64_t)quill_kv_at(c, L, c->ub_seq[t0], kpos));
        const uint8_t *vc = c->v_cache + quill_row_size(c->type_v, (int64_t)quill_kv_at(c, L, c->ub_seq[t0], c->n_ctx));
        const int last_keys = p0 + nt; /* the run's last token sees the most */
        int first[ATT_TOKENS] = {0};   /* each token's first visible key */
        for (int i = 0; i < nt; i++) {
            const int p = p0 + i;
            first[i] = L->window && p + 1 > L->window ? p + 1 - (int)L->window : 0;
        }
        const int p_lo = first[0] / KEY_BLOCK * KEY_BLOCK;
        const uint8_t *kh = kc + (size_t)kvh * kpos * krow, *vh = vc + (size_t)kvh * c->n_ctx * vrow;
        for (int p = p_lo; p < last_keys; p += KEY_BLOCK) {
            const float *keys = quill_kv_key_block(c->kern, c->type_k, kh + (size_t)p * krow, hd, tile);
            for (int i = 0; i < nt; i++) {
                const int n_keys = p0 + i + 1, lo = first[i] > p ? first[i] : p;
                if (lo < n_keys && lo < p + KEY_BLOCK)
                    c->kern->dot_columns(c->q + (t0 + i) * q_dim + h0 * hd, hd, group, keys + (lo - p), hd, KEY_BLOCK,
                                         n_keys - lo < p + KEY_BLOCK - lo ? n_keys - lo : p + KEY_BLOCK - lo,
                                         scores + (size_t)i * group * sstride + lo, sstride);
            }
        }
        for (int i = 0; i < nt; i++)
            for (int g = 0; g < group; g++) {
                /* (the temperature scales the scores where the reference scales the queries) */
                const float scale = base_scale * quill_attn_temperature(&c->model->ap, p0 + i);
                float *row = scores + ((size_t)i * group + g) * sstride + first[i];
                const int n_keys = p0 + i + 1 - first[i];
                if (cap > 0) {
                    softcap_scores(row, n_keys, scale, cap);
                    if (L->sinks) with_sink(c, row, n_keys, 1.0f, L->sinks[h0 + g]);
                    else c->kern->softmax(row, n_keys, 1.0f);
                } else if (L->sinks) {
                    with_sink(c, row, n_keys, scale, L->sinks[h0 + g]);
                } else {
                    c->kern->softmax(row, n_keys, scale);
                }
            }
        /* (one token alone sums f32 values in one call: nothing to share, no chains to resume;
         * values of another type are decoded KEY_BLOCK rows at a time) */
        const bool whole = nt == 1 && c->type_v == QUILL_TYPE_F32;
        const int vb = whole ? last_keys : KEY_BLOCK;
        for (int p = whole ? first[0] : p_lo; p < last_keys; p += vb) {
            /* the rows this block's tokens read: from the first one's first to the last one's end */
            const int from = first[0] > p ? first[0] : p, to = last_keys < p + vb ? last_keys : p + vb;
            const float *values = quill_kv_value_rows(c->kern, c->type_v, vh + (size_t)from * vrow, to - from, hd, tile);
            for (int i = 0; i < nt; i++) {
                const int n_keys = p0 + i + 1, lo = first[i] > p ? first[i] : p;
                if (lo < n_keys && lo < p + vb)
                    c->kern->weighted_sum(scores + (size_t)i * group * sstride + lo, sstride, group,
                                          values + (size_t)(lo - from) * hd,
                                          n_keys - lo < p + vb - lo ? n_keys - lo : p + vb - lo, hd, hd,
                                          c->att + (t0 + i) * q_dim + h0 * hd, hd, lo > first[i]);
            }
        }
    }
}

void quill_attention(quill_context *c, int layer, int n_tok) {
    attn_job aj = {c, layer, n_tok};
    quill_pool_run(c->pool, attention_items, &aj, (int64_t)c->n_runs * c->model->layers[layer].n_head_kv, 1);
}

void quill_trace(const quill_context *c, const char *name, int layer, const float *data, int n_dims, int64_t ne0,
                 int64_t ne1, int64_t ne2) {
    if (!c->trace) return;
    char full[64];
    if (layer >= 0) snprintf(full, sizeof full, "%s-%d", name, layer);
    else snprintf(full, sizeof full, "%s", name);
    int64_t ne[3] = {ne0, ne1, ne2};
    c->trace(full, data, n_dims, ne, c->trace_user);
}

/* ---------------------------------------------------------------- the float64 pass's */

/* out[r] = Σ_i W[r][i]·x[i] in double. */
void quill_ref_matvec(const quill_weight *w, const double *x, double *out, float *row) {
    const quill_type_traits *tr = quill_type_traits_of(w->type);
    for (int64_t r = 0; r < w->rows; r++) {
        tr->to_float(w->data + (size_t)r * w->row_bytes, row, w->cols);
        double sum = 0;
        for (int64_t i = 0; i < w->cols; i++) sum += (double)row[i] * x[i];
        out[r] = sum;
    }
}

void quill_ref_trace(const quill_context *c, const char *name, int layer, const double *v, int64_t n, int n_dims,
                     int64_t ne0, int64_t ne1, float *tmp) {
    if (!c->trace) return;
    char full[64];
    if (layer >= 0) snprintf(full, sizeof full, "%s-%d", name, layer);
    else snprintf(full, sizeof full, "%s", name);
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)v[i];
    int64_t ne[3] = {ne0, ne1, 1};   /* one token: the token dimension is 1 */
    c->trace(full, tmp, n_dims, ne, c->trace_user);
}

void quill_ref_gated_activation(const quill_context *c, double *gate, const double *up, int64_t n) {
    if (c->model->arch->act == QUILL_ACT_SWIGLU_OAI)
        for (int64_t i = 0; i < n; i++) {
            const double x = gate[i] < QUILL_OAI_LIMIT ? gate[i] : QUILL_OAI_LIMIT;
            const double y = up[i] < -QUILL_OAI_LIMIT ? -QUILL_OAI_LIMIT : up[i] > QUILL_OAI_LIMIT ? QUILL_OAI_LIMIT : up[i];
            gate[i] = x / (1.0 + exp(-(double)QUILL_OAI_ALPHA * x)) * (y + 1.0);
        }
    else if (c->model->arch->act == QUILL_ACT_GELU_TANH)
        for (int64_t i = 0; i < n; i++) {
            const double x = gate[i];
            gate[i] = 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x))) * up[i];
        }
    else
        for (int64_t i = 0; i < n; i++) gate[i] = gate[i] / (1.0 + exp(-gate[i])) * up[i];
}
