/* LFM2's gated short convolutions (as the reference's lfm2 graph computes them), in the fast pass
 * and in the float64 pass:
 *
 *   [b | c | x] = h·W_in_proj             (three chunks of n_embd, in this order)
 *   u = b ⊙ x
 *   y[ch] = Σ_i window[i][ch] · taps[ch][i], the window the sequence's last l_cache - 1 u's and this one
 *   out = (c ⊙ y)·W_out_proj
 *
 * No activation follows the convolution. The window of each sequence lives in the recurrent state
 * (recurrent.h) beside the DeltaNet layers' kind, so checkpoints, going back and copying sequences
 * are the hybrids'. The convolution runs per block of channels, the tokens in order: a token's
 * arithmetic is the same however the batch is split and on any thread. */
#include "model/recurrent.h"
#include "model/forward.h"
#include "base/error.h"
#include "model/conv_window.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Above any published kernel (3), against absurd metadata: the fast pass keeps a block's window on
 * the stack. */
#define MAX_L_CACHE 64

/* ---------------------------------------------------------------- loading */

/* The i-th value of attention.head_count_kv (an array) or its one value; -1 when it is not a count. */
static int64_t kv_heads_at(const quill_gguf_value *v, uint64_t *cursor) {
    quill_gguf_value e;
    int64_t n = -1;
    if (v->type != QUILL_GGUF_ARRAY) return quill_gguf_value_i64(v, &n) ? n : -1;
    return quill_gguf_array_next(v, cursor, &e) && quill_gguf_value_i64(&e, &n) ? n : -1;
}

quill_status quill_shortconv_kv_heads(const quill_gguf *g, const char *key, int64_t n_layer, int64_t n_head,
                                      int64_t *out, quill_error *err) {
    const quill_gguf_value *v = quill_gguf_find(g, key);
    *out = n_head; /* (the reference's default: every layer attends with n_head KV heads) */
    if (!v) return QUILL_OK;
    if (v->type == QUILL_GGUF_ARRAY && v->count != (uint64_t)n_layer)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s has %llu values for %lld layers", quill_gguf_path(g), key,
                          (unsigned long long)v->count, (long long)n_layer);
    uint64_t cursor = 0;
    int64_t seen = 0;
    for (int64_t l = 0; l < (v->type == QUILL_GGUF_ARRAY ? n_layer : 1); l++) {
        const int64_t n = kv_heads_at(v, &cursor);
        if (n < 0 || n > n_head)
            return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s[%lld] = %lld is out of range (0 for a conv layer, "
                              "else 1..%lld)", quill_gguf_path(g), key, (long long)l, (long long)n, (long long)n_head);
        if (n && seen && n != seen)
            return quill_fail(err, QUILL_E_UNSUPPORTED,
                              "%s: %s names %lld and %lld KV heads: quill runs LFM2 attention layers of one shape",
                              quill_gguf_path(g), key, (long long)seen, (long long)n);
        if (n) seen = n;
    }
    if (v->type != QUILL_GGUF_ARRAY && !seen)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = 0 leaves no attention heads", quill_gguf_path(g), key);
    if (seen) *out = seen;
    return QUILL_OK;
}

quill_status quill_shortconv_params(quill_model *m, quill_error *err) {
    const quill_gguf *g = m->gguf;
    const char *arch = m->arch->name, *path = quill_gguf_path(g);
    char key[128];
    int64_t l_cache = 0;
    snprintf(key, sizeof key, "%s.shortconv.l_cache", arch);
    quill_status s = quill_gguf_get_i64(g, key, &l_cache, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s is missing (a %s model needs it)", path, key, arch);
    if (s) return s;
    if (l_cache < 2 || l_cache > MAX_L_CACHE)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range (2..%d)", path, key,
                          (long long)l_cache, MAX_L_CACHE);
    /* the bidirectional (embedding) variant pads its window on both sides; sliding windows on the
     * attention layers are not implemented here */
    bool causal = true;
    snprintf(key, sizeof key, "%s.attention.causal", arch);
    if ((s = quill_gguf_get_bool(g, key, &causal, err)) && s != QUILL_E_NOT_FOUND) return s;
    if (!causal)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "%s: %s = false: the bidirectional LFM2 (an embedding model) is "
                          "not implemented", path, key);
    int64_t window = 0;
    snprintf(key, sizeof key, "%s.attention.sliding_window", arch);
    if ((s = quill_gguf_get_i64(g, key, &window, err)) && s != QUILL_E_NOT_FOUND) return s;
    if (window > 0)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "%s: %s = %lld: LFM2's sliding-window attention is not implemented",
                          path, key, (long long)window);
    m->ap.ssm_kernel = l_cache;
    m->ap.ssm_conv_dim = m->hp.n_embd;
    /* conv layers: 0 KV heads in the per-layer array (every layer attends when it is one number) */
    snprintf(key, sizeof key, "%s.attention.head_count_kv", arch);
    const quill_gguf_value *v = quill_gguf_find(g, key);
    uint64_t cursor = 0;
    for (int64_t l = 0; v && v->type == QUILL_GGUF_ARRAY && l < m->hp.n_layer; l++)
        m->layers[l].recurrent = m->layers[l].shortconv = kv_heads_at(v, &cursor) == 0;
    return QUILL_OK;
}

quill_status quill_shortconv_bind_layer(quill_model *m, int64_t l, quill_error *err) {
    const int64_t d = m->hp.n_embd;
    quill_layer *L = &m->layers[l];
    char name[96];
#define NAME(suffix) (snprintf(name, sizeof name, "blk.%lld." suffix, (long long)l), name)
    quill_status s;
    if ((s = quill_model_bind(m, NAME("shortconv.in_proj.weight"), d, 3 * d, &L->ssm_in, err)) ||
        (s = quill_model_bind(m, NAME("shortconv.out_proj.weight"), d, d, &L->ssm_out, err)))
        return s;
    /* the taps, [n_embd][l_cache], in f32 */
    return quill_model_floats(m, NAME("shortconv.conv.weight"), m->ap.ssm_kernel, d, &L->ssm_conv, err);
#undef NAME
}

/* ---------------------------------------------------------------- fast pass */

typedef struct {
    quill_context *c;
    const quill_layer *L;
    int layer, n_tok;
} sc_job;

/* The gated convolution, one item per block of CONV_BLOCK channels, the tokens in order: each
 * token's u = b·x joins its sequence's window (a ring of the last l_cache - 1, `head` the oldest),
 * y = c · Σ over the taps from the oldest input, in f32 as the reference sums them. */
static void conv_blocks(void *arg, int64_t b0, int64_t b1, int thread) {
    (void)thread;
    const sc_job *j = arg;
    const quill_context *c = j->c;
    const int64_t K = c->model->ap.ssm_kernel, W = K - 1, d = c->hp->n_embd;
    const float *bcx = c->rec->bcx;
    float *y = c->rec->conv_y;
    float taps[MAX_L_CACHE][CONV_BLOCK], ring[MAX_L_CACHE][CONV_BLOCK], sum[CONV_BLOCK];
    for (int64_t b = b0; b < b1; b++) {
        const int64_t ch0 = b * CONV_BLOCK, n = d - ch0 < CONV_BLOCK ? d - ch0 : CONV_BLOCK;
        conv_block_taps(taps, j->L->ssm_conv, K, ch0, n);
        for (int t0 = 0, t1; t0 < j->n_tok; t0 = t1) {
            for (t1 = t0 + 1; t1 < j->n_tok && c->ub_seq[t1] == c->ub_seq[t0]; t1++) {}
            float *st = (float *)quill_recurrent_conv(c, c->ub_seq[t0], j->layer) + ch0 * W;
            conv_ring_load(ring, st, W, n);
            int64_t head = 0;
            for (int t = t0; t < t1; t++) {
                const float *row = bcx + (size_t)t * 3 * (size_t)d, *gb = row + ch0, *gc = row + d + ch0;
                const float *x = row + 2 * d + ch0;
                float u[CONV_BLOCK];
                for (int64_t ch = 0; ch < n; ch++) u[ch] = gb[ch] * x[ch];
                conv_ring_sum(sum, ring, taps, head, W, u, n);
                conv_ring_push(ring, &head, W, u, n);
                float *out = y + (size_t)t * (size_t)d + ch0;
                for (int64_t ch = 0; ch < n; ch++) out[ch] = gc[ch] * sum[ch];
            }
            conv_ring_store(st, ring, head, W, n);
        }
    }
}

void quill_shortconv_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    const int64_t d = c->hp->n_embd;
    quill_announce(c, (const quill_weight *[]){&L->ssm_out}, 1, n_tok);
    quill_matmul(c, &L->ssm_in, c->xb, n_tok, c->rec->bcx);
    quill_trace(c, "shortconv_in_proj", layer, c->rec->bcx, 2, 3 * d, n_tok, 1);
    sc_job j = {c, L, layer, n_tok};
    quill_pool_run(c->pool, conv_blocks, &j, (d + CONV_BLOCK - 1) / CONV_BLOCK, 1);
    quill_trace(c, "shortconv_gated", layer, c->rec->conv_y, 2, d, n_tok, 1);
    quill_matmul(c, &L->ssm_out, c->rec->conv_y, n_tok, c->xb);
    quill_trace(c, "shortconv_out", layer, c->xb, 2, d, n_tok, 1);
}

/* ---------------------------------------------------------------- float64 pass */

quill_status quill_shortconv_exact(const quill_context *c, const quill_layer *L, int layer, const double *in,
                                   double *out, quill_error *err) {
    const int64_t d = c->hp->n_embd, K = c->model->ap.ssm_kernel;
    double *bcx = malloc((size_t)(3 * d) * sizeof *bcx), *y = malloc((size_t)d * sizeof *y);
    float *row = malloc((size_t)d * sizeof *row), *tmp = malloc((size_t)(3 * d) * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!bcx || !y || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    quill_ref_matvec(&L->ssm_in, in, bcx, row);
    quill_ref_trace(c, "shortconv_in_proj", layer, bcx, 3 * d, 2, 3 * d, 1, tmp);
    double *window = quill_recurrent_conv(c, 0, layer);
    for (int64_t ch = 0; ch < d; ch++) {
        const double u = bcx[ch] * bcx[2 * d + ch];
        y[ch] = bcx[d + ch] * conv_ref_step(window + ch * (K - 1), L->ssm_conv + ch * K, K, u);
    }
    quill_ref_trace(c, "shortconv_gated", layer, y, d, 2, d, 1, tmp);
    quill_ref_matvec(&L->ssm_out, y, out, row);
    quill_ref_trace(c, "shortconv_out", layer, out, d, 2, d, 1, tmp);
done:
    free(bcx), free(y), free(row), free(tmp);
    return s;
}
