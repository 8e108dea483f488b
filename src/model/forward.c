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
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/recurrent.h"
#include "base/error.h"

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
        if (c->gpu) { /* (one by one: the device runs the uploaded ones) */
            matmul_on(c, w[i], x, n_tok, y[i], pool, scratch, thread);
            i++;
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
        quill_ffn_of(m->layers[layer + 1].ffn)->announce(c, &m->layers[layer + 1], n_tok);
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
        gate[i] = 0.5f * x * (1.0f + tanhf(k * x * (1.0f + 0.044715f * x * x))) * up[i];
    }
}

/* gpt-oss's clamped SwiGLU: x·sigmoid(1.702·x)·(y + 1), x = min(gate, 7), y = clamp(up, -7, 7) */
static void swiglu_oai_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const swiglu_job *j = arg;
    float *gate = j->gate + t0 * j->n_ff;
    const float *up = j->up + t0 * j->n_ff;
    for (int64_t i = 0; i < (t1 - t0) * j->n_ff; i++) {
        const float x = gate[i] < QUILL_OAI_LIMIT ? gate[i] : QUILL_OAI_LIMIT;
        const float y = up[i] < -QUILL_OAI_LIMIT ? -QUILL_OAI_LIMIT : up[i] > QUILL_OAI_LIMIT ? QUILL_OAI_LIMIT : up[i];
        gate[i] = x / (1.0f + expf(-QUILL_OAI_ALPHA * x)) * (y + 1.0f);
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
    for (int p = 0; p < n; p++) x[p] = cap * tanhf(x[p] * scale * inv);
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
    const float f = (float)(1.0 / (1.0 + (double)row[at] * exp((double)sink - m)));
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

void quill_trace(const quill_context *c, const char *name, int layer, const float *data, int n_dims, int64_t ne0,
                 int64_t ne1, int64_t ne2) {
    if (!c->trace) return;
    char full[64];
    if (layer >= 0) snprintf(full, sizeof full, "%s-%d", name, layer);
    else snprintf(full, sizeof full, "%s", name);
    int64_t ne[3] = {ne0, ne1, ne2};
    c->trace(full, data, n_dims, ne, c->trace_user);
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

const quill_ffn_impl *quill_ffn_of(quill_ffn_kind kind) {
    return kind == QUILL_FFN_MOE ? &quill_ffn_moe : kind == QUILL_FFN_MOE_SHARED ? &quill_ffn_moe_shared : &quill_ffn_dense;
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

    for (int l = 0; l < hp->n_layer; l++) {
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

            attn_job aj = {c, l, n};
            quill_pool_run(c->pool, attention_items, &aj, (int64_t)c->n_runs * L->n_head_kv, 1);
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

    add_and_norm(c, NULL, m->output_norm, c->xb, n);
    quill_trace(c, "result_norm", -1, c->xb, 2, d, n, 1);
    if (logits) {
        /* the rows that asked for logits, gathered in order (row t only moves down) */
        int rows = 0;
        for (int t = 0; t < n; t++)
            if (want[t]) {
                if (rows != t) memcpy(c->xb + rows * d, c->xb + t * d, (size_t)d * sizeof(float));
                rows++;
            }
        /* the next token's first product */
        quill_announce_next_layer(c, -1, n);
        if (rows) quill_matmul(c, &m->output, c->xb, rows, logits);
        if (rows && ap->logit_multiplier) scale_rows(logits, rows * hp->n_vocab, ap->logit_multiplier);
        if (rows && ap->final_softcap > 0) {
            const float cap = ap->final_softcap, inv = 1.0f / cap;
            for (int64_t i = 0; i < rows * hp->n_vocab; i++) logits[i] = cap * tanhf(logits[i] * inv);
        }
    }
}
