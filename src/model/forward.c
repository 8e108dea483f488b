/* The fast forward pass of a Llama model, in the order the reference evaluates it:
 *
 *   x = embed(tokens)
 *   for each layer:
 *       h = rmsnorm(x) * attn_norm
 *       q, k, v = h·Wq, h·Wk, h·Wv;  rope(q, k);  append k, v to the cache
 *       x += softmax(q·Kᵀ / √head_dim, causal) · V · Wo
 *       h = rmsnorm(x) * ffn_norm
 *       x += (silu(h·Wgate) * (h·Wup)) · Wdown
 *   logits = (rmsnorm(x) * output_norm) · Wout
 *
 * Activations stay in f32; weights are dequantized row by row inside the matrix products (see
 * kernels.h). Every parallel loop splits work into items whose arithmetic does not depend on the
 * split, so results are bitwise identical for any thread count and any batching. */
#include "model/context.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int quill_test_flip_rope_sign;

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

/* y[t][r] = W[r] · x[t] for every token t < n_tok; x is [n_tok][cols], y is [n_tok][rows]. */
static void matmul(const quill_context *c, const quill_weight *w, const float *x, int n_tok, float *y) {
    if (c->kern->matmul[w->type]) {
        const quill_matrix m = {w->data, w->row_bytes, w->rows, y};
        c->kern->matmul[w->type](&m, 1, w->cols, x, n_tok, c->pool, c->matmul_scratch);
        return;
    }
    matmul_job j = {w, x, n_tok, y, quill_kernels_dequant(c->kern, w->type), c->kern->vec_dot[w->type], c};
    int64_t grain = w->rows / (c->n_threads * 16);
    quill_pool_run(c->pool, matmul_rows, &j, w->rows, grain < 1 ? 1 : grain);
}

/* The products of n weights with the same input, y[i] = W[i] · x. Neighbours of one type go to
 * the kernel together: the input is then quantized once and their rows make one parallel loop (q,
 * k and v: one wait instead of three per layer and token). Same results as one by one. */
static void matmuls(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                    int n_tok) {
    for (int i = 0, j; i < n; i = j) {
        quill_matmul_fn joined = c->kern->matmul[w[i]->type];
        for (j = i + 1; joined && j < n && j - i < QUILL_MATMUL_MAX_MATS; j++)
            if (w[j]->type != w[i]->type || w[j]->cols != w[i]->cols) break;
        if (j - i == 1) {
            matmul(c, w[i], x, n_tok, y[i]);
            continue;
        }
        quill_matrix m[QUILL_MATMUL_MAX_MATS];
        for (int k = i; k < j; k++) m[k - i] = (quill_matrix){w[k]->data, w[k]->row_bytes, w[k]->rows, y[k]};
        joined(m, j - i, w[i]->cols, x, n_tok, c->pool, c->matmul_scratch);
    }
}

static void rmsnorm(float *restrict out, const float *restrict x, const float *restrict weight, int64_t n,
                    double eps) {
    /* eight partial sums in double: one running sum was a chain of n dependent adds (~8000 cycles
     * for 2048 elements, 2 % of a prompt's time); a fixed order, so every token still gets the
     * same bits in any batch and on any thread */
    double part[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) part[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) part[0] += (double)x[i] * x[i];
    const double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    const float scale = (float)(1.0 / sqrt(sum / (double)n + eps));
    for (i = 0; i + 4 <= n; i += 4)
        for (int k = 0; k < 4; k++) out[i + k] = (x[i + k] * scale) * weight[i + k];
    for (; i < n; i++) out[i] = (x[i] * scale) * weight[i];
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
        if (j->out) rmsnorm(j->out + t * j->d, x, j->weight, j->d, j->eps);
    }
}

static void add_and_norm(const quill_context *c, const float *add, const float *weight, float *out, int n) {
    norm_job j = {c->x, add, weight, out, c->hp->n_embd, c->hp->rms_eps};
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

typedef struct {
    quill_context *c;
    int layer, n_tok;
} attn_job;

/* Floats between two heads' scores: the context rounded up to a multiple of 16 (64 bytes). */
static int64_t score_stride(int n_ctx) { return ((int64_t)n_ctx + 15) / 16 * 16; }

/* The key cache of one KV head is blocks of KEY_BLOCK positions, each dimension-major: key
 * (d, pos) at block pos / KEY_BLOCK, d · KEY_BLOCK + pos % KEY_BLOCK. Dimension-major, the scores
 * of 16 positions are one vector of fused multiply-adds (no reductions); blocked, a block's
 * head_dim × KEY_BLOCK floats are one contiguous read. Dimension-major over the whole context, as
 * before, a block was head_dim runs of 256 bytes a context apart, head_dim streams at once: a
 * Llama-2-7B-shaped layer (32 KV heads of 128) generates 1.03-1.23x faster after 3584 positions
 * with the blocks (bench/README.md, tenth session). */
#define KEY_BLOCK 64
static int64_t key_positions(int n_ctx) { return ((int64_t)n_ctx + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK; }

/* One item = one KV head and up to ATT_TOKENS consecutive tokens of the batch: causal softmax
 * attention over the cached positions for the query heads that share that KV head. The kernels
 * take a token's query heads together to reuse each key and value they load; the item's tokens
 * go through the keys and values a block of KEY_BLOCK positions at a time, so that a block (16-32
 * KB) serves them all from L1 instead of being read again per token. Every score and output is
 * still one chain of fused multiply-adds in position order (weighted_sum continues its chains
 * across blocks), so the bits do not depend on how the batch is split.
 *
 * Items run KV head by KV head, so that a thread's successive items read the same head's cache,
 * which then stays in L2: in token order they cycled through every head's cache (3.6 MB at 2048
 * positions for TinyLlama, more than a core's 2 MB L2) — pp512 after 1536 cached tokens 1.21x
 * faster for that order alone. Blocks of 4 tokens on top: pp512 after 3584 cached tokens 1.42x
 * on a Llama-2-7B-shaped layer (32 KV heads of 128: 3.6 MB of cache per head, read from L3 per
 * token before), and TinyLlama's attention 24 % → 21.5 % of pp512 at 1536 (profiles). */
#define ATT_TOKENS 4

static void attention_items(void *arg, int64_t i0, int64_t i1, int thread) {
    const attn_job *j = arg;
    quill_context *c = j->c;
    const quill_hparams *hp = c->hp;
    const int64_t hd = hp->head_dim, kv_dim = hp->n_head_kv * hd, q_dim = hp->n_head * hd;
    const int group = (int)(hp->n_head / hp->n_head_kv);
    const float scale = (float)(1.0 / sqrt((double)hd));
    const int64_t sstride = score_stride(c->n_ctx);
    /* the scores of token i of an item: group rows from scores + i · group · sstride */
    float *scores = c->thread_scratch + (size_t)thread * c->thread_scratch_len;
    const int64_t kpos = key_positions(c->n_ctx);
    const float *kc = c->k_cache + (size_t)j->layer * kpos * kv_dim; /* [kv head][block][dim][pos] */
    const float *vc = c->v_cache + (size_t)j->layer * c->n_ctx * kv_dim; /* [kv head][pos][dim] */
    const int64_t n_blocks = (j->n_tok + ATT_TOKENS - 1) / ATT_TOKENS;
    for (int64_t item = i0; item < i1; item++) {
        const int64_t kvh = item / n_blocks, t0 = item % n_blocks * ATT_TOKENS, h0 = kvh * group;
        const int nt = j->n_tok - t0 < ATT_TOKENS ? (int)(j->n_tok - t0) : ATT_TOKENS;
        const int last_keys = c->pos + (int)t0 + nt; /* the block's last token sees the most */
        const float *kh = kc + (size_t)kvh * hd * kpos, *vh = vc + (size_t)kvh * c->n_ctx * hd;
        for (int p = 0; p < last_keys; p += KEY_BLOCK)
            for (int i = 0; i < nt; i++) {
                const int n_keys = c->pos + (int)t0 + i + 1;
                if (p < n_keys)
                    c->kern->dot_columns(c->q + (t0 + i) * q_dim + h0 * hd, hd, group, kh + (size_t)p * hd, hd,
                                         KEY_BLOCK, n_keys - p < KEY_BLOCK ? n_keys - p : KEY_BLOCK,
                                         scores + (size_t)i * group * sstride + p, sstride);
            }
        for (int i = 0; i < nt; i++)
            for (int g = 0; g < group; g++)
                c->kern->softmax(scores + ((size_t)i * group + g) * sstride, c->pos + (int)t0 + i + 1, scale);
        /* (one token alone sums its values in one call: nothing to share, no chains to resume) */
        const int vb = nt > 1 ? KEY_BLOCK : last_keys;
        for (int p = 0; p < last_keys; p += vb)
            for (int i = 0; i < nt; i++) {
                const int n_keys = c->pos + (int)t0 + i + 1;
                if (p < n_keys)
                    c->kern->weighted_sum(scores + (size_t)i * group * sstride + p, sstride, group, vh + (size_t)p * hd,
                                          n_keys - p < vb ? n_keys - p : vb, hd, hd, c->att + (t0 + i) * q_dim + h0 * hd,
                                          hd, p > 0);
            }
    }
}

/* Rotates adjacent pairs (x[2i], x[2i+1]) of the first n_rot dims of each head by pos·θ_i. */
static void rope(const quill_context *c, float *vec, int64_t n_heads, int pos) {
    const int64_t hd = c->hp->head_dim, half = c->hp->n_rot / 2;
    const float *cs = c->rope_cos + (size_t)pos * half, *sn = c->rope_sin + (size_t)pos * half;
    for (int64_t h = 0; h < n_heads; h++) {
        float *v = vec + h * hd;
        for (int64_t i = 0; i < half; i++) {
            float x0 = v[2 * i], x1 = v[2 * i + 1];
            float s = quill_test_flip_rope_sign ? -sn[i] : sn[i];
            v[2 * i] = x0 * cs[i] - x1 * s;
            v[2 * i + 1] = x0 * s + x1 * cs[i];
        }
    }
}

/* Per token, in parallel over tokens: RoPE on its queries and keys, then its key and value into
 * layer `layer`'s cache at its position. */
typedef struct {
    const quill_context *c;
    int layer;
} rope_job;

static void rope_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const rope_job *j = arg;
    const quill_context *c = j->c;
    const quill_hparams *hp = c->hp;
    const int64_t hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    /* keys in blocks of positions, dimension-major within a block (see KEY_BLOCK) */
    const int64_t kpos = key_positions(c->n_ctx);
    float *kt = c->k_cache + (size_t)j->layer * kpos * kv_dim;
    /* values head-major: one head's values are one contiguous stream for the hardware prefetchers
     * (position-major, a head's 256 bytes every kv_dim floats, the weighted sum ran ~1.8x slower
     * at 2000 positions) */
    float *vt = c->v_cache + (size_t)j->layer * c->n_ctx * kv_dim;
    for (int64_t t = t0; t < t1; t++) {
        const int pos = c->pos + (int)t;
        rope(c, c->q + t * q_dim, hp->n_head, pos);
        rope(c, c->k + t * kv_dim, hp->n_head_kv, pos);
        float *block = kt + (size_t)(pos / KEY_BLOCK) * KEY_BLOCK * hd + pos % KEY_BLOCK;
        for (int64_t h = 0; h < hp->n_head_kv; h++)
            for (int64_t i = 0; i < hd; i++)
                block[(size_t)h * hd * kpos + (size_t)i * KEY_BLOCK] = c->k[t * kv_dim + h * hd + i];
        for (int64_t h = 0; h < hp->n_head_kv; h++)
            memcpy(vt + ((size_t)h * c->n_ctx + (size_t)pos) * hd, c->v + t * kv_dim + h * hd,
                   (size_t)hd * sizeof(float));
    }
}

static void trace(const quill_context *c, const char *name, int layer, const float *data, int n_dims,
                  int64_t ne0, int64_t ne1, int64_t ne2) {
    if (!c->trace) return;
    char full[64];
    if (layer >= 0) snprintf(full, sizeof full, "%s-%d", name, layer);
    else snprintf(full, sizeof full, "%s", name);
    int64_t ne[3] = {ne0, ne1, ne2};
    c->trace(full, data, n_dims, ne, c->trace_user);
}

/* ---------------------------------------------------------------- one micro-batch */

static void eval_ubatch(quill_context *c, const int32_t *tokens, int n, float *logits, bool all_logits) {
    const quill_model *m = c->model;
    const quill_hparams *hp = c->hp;
    const int64_t d = hp->n_embd, hd = hp->head_dim;
    const int64_t q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd, ff = hp->n_ff;
    quill_row_dequant_fn embed = quill_kernels_dequant(c->kern, m->token_embd.type);

    for (int t = 0; t < n; t++)
        embed(m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes, c->x + t * d, d);
    trace(c, "inp_embd", -1, c->x, 2, d, n, 1);

    for (int l = 0; l < hp->n_layer; l++) {
        const quill_layer *L = &m->layers[l];
        add_and_norm(c, NULL, L->attn_norm, c->xb, n);
        trace(c, "attn_norm", l, c->xb, 2, d, n, 1);

        matmuls(c, (const quill_weight *[]){&L->wq, &L->wk, &L->wv}, (float *[]){c->q, c->k, c->v}, 3, c->xb, n);
        rope_job rj = {c, l};
        quill_pool_run(c->pool, rope_rows, &rj, n, 1);
        trace(c, "Qcur", l, c->q, 3, hd, hp->n_head, n);
        trace(c, "Kcur", l, c->k, 3, hd, hp->n_head_kv, n);
        trace(c, "Vcur", l, c->v, 2, kv_dim, n, 1);

        attn_job aj = {c, l, n};
        quill_pool_run(c->pool, attention_items, &aj, (n + ATT_TOKENS - 1) / ATT_TOKENS * hp->n_head_kv, 1);
        trace(c, "kqv_merged_cont", l, c->att, 2, q_dim, n, 1);

        matmul(c, &L->wo, c->att, n, c->xb);
        trace(c, "kqv_out", l, c->xb, 2, d, n, 1);
        add_and_norm(c, c->xb, L->ffn_norm, c->xb, n); /* the residual, then the norm into xb */
        trace(c, "ffn_inp", l, c->x, 2, d, n, 1);
        trace(c, "ffn_norm", l, c->xb, 2, d, n, 1);
        matmuls(c, (const quill_weight *[]){&L->w_gate, &L->w_up}, (float *[]){c->ffn_gate, c->ffn_up}, 2, c->xb, n);
        swiglu_job sj = {c->kern, c->ffn_gate, c->ffn_up, ff};
        quill_pool_run(c->pool, swiglu_rows, &sj, n, 1);
        matmul(c, &L->w_down, c->ffn_gate, n, c->xb);
        trace(c, "ffn_out", l, c->xb, 2, d, n, 1);
        add_and_norm(c, c->xb, NULL, NULL, n);
        trace(c, "l_out", l, c->x, 2, d, n, 1);
    }

    add_and_norm(c, NULL, m->output_norm, c->xb, n);
    trace(c, "result_norm", -1, c->xb, 2, d, n, 1);
    if (logits) {
        if (all_logits) matmul(c, &m->output, c->xb, n, logits);
        else matmul(c, &m->output, c->xb + (n - 1) * d, 1, logits);
    }
    c->pos += n;
}

quill_status quill_eval(quill_context *c, const int32_t *tokens, int n, float *logits, bool all_logits,
                        quill_error *err) {
    if (n <= 0) return quill_fail(err, QUILL_E_ARG, "nothing to evaluate: %d tokens", n);
    const int64_t n_vocab = c->hp->n_vocab;
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= n_vocab)
            return quill_fail(err, QUILL_E_ARG,
                              "token id %d at position %d is outside the vocabulary (0..%lld)",
                              tokens[i], i, (long long)n_vocab - 1);
    if (n > c->n_ctx - c->pos)
        return quill_fail(err, QUILL_E_CONTEXT,
                          "%d tokens do not fit in the context: %d of %d positions are used, %d are "
                          "free; use a larger context (-c) or a shorter prompt",
                          n, c->pos, c->n_ctx, c->n_ctx - c->pos);
    if (c->reference) return quill_reference_eval(c, tokens, n, logits, all_logits, err);
    for (int done = 0; done < n;) {
        int chunk = n - done < QUILL_UBATCH ? n - done : QUILL_UBATCH;
        bool last = done + chunk == n;
        float *out = NULL;
        if (logits && all_logits) out = logits + (size_t)done * n_vocab;
        else if (logits && last) out = logits;
        eval_ubatch(c, tokens + done, chunk, out, all_logits);
        done += chunk;
    }
    return QUILL_OK;
}

/* ---------------------------------------------------------------- context lifetime */

quill_status quill_context_new(quill_model *m, const quill_context_params *p, quill_context **out,
                               quill_error *err) {
    *out = NULL;
    const quill_hparams *hp = quill_model_hparams(m);
    /* By default the training context, capped so that a 32k-context model does not reserve
     * gigabytes of KV cache that a short session never uses. */
    int n_ctx = p && p->n_ctx > 0 ? p->n_ctx : (int)(hp->n_ctx_train < 4096 ? hp->n_ctx_train : 4096);
    int n_threads = p && p->n_threads > 0 ? p->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    if (p && (p->n_ctx < 0 || p->n_ctx > (1 << 24)))
        return quill_fail(err, QUILL_E_ARG, "context length %d is out of range (1..%d)", p->n_ctx, 1 << 24);
    if (p && (p->n_threads < 0 || p->n_threads > 1024))
        return quill_fail(err, QUILL_E_ARG, "thread count %d is out of range (1..1024)", p->n_threads);
    quill_context *c = calloc(1, sizeof *c);
    if (!c) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    c->model = m;
    c->hp = hp;
    c->n_ctx = n_ctx;
    c->n_threads = n_threads;
    c->reference = p && p->reference;
    c->kern = quill_kernels_best();
    const int64_t d = hp->n_embd, hd = hp->head_dim, q_dim = hp->n_head * hd, kv_dim = hp->n_head_kv * hd;
    const size_t cache = (size_t)hp->n_layer * (size_t)n_ctx * (size_t)kv_dim;
    const size_t key_cache = (size_t)hp->n_layer * (size_t)key_positions(n_ctx) * (size_t)kv_dim;
    const size_t ub = QUILL_UBATCH;
    int64_t widest = d > q_dim ? d : q_dim;
    if (hp->n_ff > widest) widest = hp->n_ff;
    /* a dequantized row, or the scores of one attention item (see attention_items) */
    const size_t scores = (size_t)score_stride(n_ctx) * (size_t)(hp->n_head / hp->n_head_kv) * ATT_TOKENS;
    c->thread_scratch_len = ((size_t)widest > scores ? (size_t)widest : scores) + 64;
    bool ok = (c->pool = quill_pool_new(n_threads)) != NULL;
    if (c->reference) {
        ok = ok && (c->ref_k = calloc(cache, sizeof(double))) && (c->ref_v = calloc(cache, sizeof(double)));
    } else {
        size_t half = (size_t)hp->n_rot / 2;
        ok = ok && (c->k_cache = calloc(key_cache, sizeof(float))) && (c->v_cache = calloc(cache, sizeof(float))) &&
             (c->rope_cos = malloc((size_t)n_ctx * half * sizeof(float))) &&
             (c->rope_sin = malloc((size_t)n_ctx * half * sizeof(float))) &&
             (c->x = malloc(ub * d * sizeof(float))) && (c->xb = malloc(ub * d * sizeof(float))) &&
             (c->q = malloc(ub * q_dim * sizeof(float))) && (c->att = malloc(ub * q_dim * sizeof(float))) &&
             (c->k = malloc(ub * kv_dim * sizeof(float))) && (c->v = malloc(ub * kv_dim * sizeof(float))) &&
             (c->ffn_gate = malloc(ub * hp->n_ff * sizeof(float))) &&
             (c->ffn_up = malloc(ub * hp->n_ff * sizeof(float))) &&
             (c->thread_scratch = malloc((size_t)n_threads * c->thread_scratch_len * sizeof(float)));
        /* the whole-matrix products' scratch (quantized activations), sized for the widest input */
        if (ok && c->kern->matmul_scratch)
            ok = (c->matmul_scratch = malloc(c->kern->matmul_scratch(widest, (int)ub))) != NULL;
        if (ok) {
            /* θ_i = pos · s · base^(-2i/n_rot) (s: the linear scaling, usually 1), computed in double
             * and rounded once. */
            for (int pos = 0; pos < n_ctx; pos++)
                for (size_t i = 0; i < half; i++) {
                    double theta = pos * hp->rope_freq_scale * pow(hp->rope_base, -2.0 * (double)i / (double)hp->n_rot);
                    c->rope_cos[(size_t)pos * half + i] = (float)cos(theta);
                    c->rope_sin[(size_t)pos * half + i] = (float)sin(theta);
                }
        }
    }
    if (!ok) {
        /* the message reads the context's settings, so it is written before the context is freed */
        quill_fail(err, QUILL_E_NOMEM,
                   "out of memory creating a context of %d tokens (KV cache %.1f MB); use a smaller context (-c)",
                   n_ctx, 2.0 * cache * (c->reference ? 8 : 4) / 1e6);
        quill_context_free(c);
        return QUILL_E_NOMEM;
    }
    *out = c;
    return QUILL_OK;
}

void quill_context_free(quill_context *c) {
    if (!c) return;
    quill_pool_free(c->pool);
    free(c->k_cache);
    free(c->v_cache);
    free(c->rope_cos);
    free(c->rope_sin);
    free(c->x);
    free(c->xb);
    free(c->q);
    free(c->k);
    free(c->v);
    free(c->att);
    free(c->ffn_gate);
    free(c->ffn_up);
    free(c->thread_scratch);
    free(c->matmul_scratch);
    free(c->ref_k);
    free(c->ref_v);
    free(c);
}

int quill_context_pos(const quill_context *c) { return c->pos; }
int quill_context_n_ctx(const quill_context *c) { return c->n_ctx; }

const char *quill_context_kernels(const quill_context *c) { return c->reference ? "reference" : c->kern->isa; }

void quill_context_truncate(quill_context *c, int pos) {
    if (pos >= 0 && pos < c->pos) c->pos = pos;
}

void quill_context_set_trace(quill_context *c, quill_trace_fn fn, void *user) {
    c->trace = fn;
    c->trace_user = user;
}
