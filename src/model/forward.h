/* What the forward passes share with the feed-forward blocks (ffn_dense.c, ffn_moe.c): the
 * parallel products and traces of the fast pass, the plain loops of the float64 pass, and the one
 * table that maps an architecture's FFN kind (model.h) to its two implementations. */
#ifndef QUILL_FORWARD_H
#define QUILL_FORWARD_H

#include "model/context.h"

#include <math.h>

/* gpt-oss's clamped SwiGLU: the reference's constants */
#define QUILL_OAI_ALPHA 1.702f
#define QUILL_OAI_LIMIT 7.0f

/* Llama 4's attention temperature (Mistral 3) at position pos, 1 without it, as the reference
 * computes it: the queries' scale 1 + s·ln(floor(pos / n_ctx_orig) + 1). */
static inline float quill_attn_temperature(const quill_arch_params *ap, int pos) {
    if (!ap->attn_temp_scale) return 1.0f;
    return (float)(log(floorf((float)pos / (float)ap->n_ctx_orig) + 1.0) * ap->attn_temp_scale + 1.0);
}

/* ---------------------------------------------------------------- fast pass (forward.c) */

/* The Vulkan backend's executor (gpu_offload.c): at context creation, the layers placed on the device
 * checked and their weights uploaded; at the end, its release. quill_gpu_product runs y = W·x there
 * when w was uploaded (false: not, the CPU runs it); quill_gpu_products runs y[i] = W[i]·x for the
 * uploaded weights at the start of w[0..n) that share x's width, in one submission, and says how many
 * (0: w[0] was not uploaded). A failure there is kept for quill_gpu_failed, which the pass's callers
 * check after each micro-batch (and which clears it). */
quill_status quill_gpu_offload(quill_context *c, const quill_context_params *p, quill_error *err);
void quill_gpu_offload_free(quill_context *c);
bool quill_gpu_product(const quill_context *c, const quill_weight *w, const float *x, int n_tok, float *y);
int quill_gpu_products(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                       int n_tok);
quill_status quill_gpu_failed(quill_context *c, quill_error *err);
/* With c->gpu_whole: the placed layers of a micro-batch on the device, from c->x (the first placed
 * layer's input) in one submission; then, when the output layer is placed too, the output norm and
 * the wanted rows' logits (true: `logits` has them), else the last layer's output back in c->x
 * (false: the CPU runs the output). A failure is kept as a product's is (logits then NaN). */
bool quill_gpu_run_layers(quill_context *c, const int32_t *seq, const int32_t *pos, const bool *want, int n,
                          float *logits);
/* Without c->gpu_whole: a placed mixture-of-experts layer's FFN on the device (its router, experts
 * and shared expert there: a hybrid's, whose mixer runs on the CPU), from c->xb to c->xb, the
 * bits of ffn_moe.c's; false when the layer's experts are not there (the CPU runs the FFN). A
 * failure is kept as a product's is (c->xb then NaN). */
bool quill_gpu_moe_ffn(quill_context *c, const quill_layer *L, int n);
/* quill_seq_copy_prefix's copy of the first n positions of sequence src to dst in the device's KV
 * cache (nothing without c->gpu_whole). */
quill_status quill_gpu_copy_prefix(quill_context *c, int src, int dst, int n, quill_error *err);

/* y[t][r] = W[r] · x[t] for every token t < n_tok; x is [n_tok][cols], y is [n_tok][rows]. */
void quill_matmul(const quill_context *c, const quill_weight *w, const float *x, int n_tok, float *y);
/* The products of n weights with the same input, y[i] = W[i] · x; neighbours of one type go to the
 * kernel together (the input quantized once, one parallel loop). Same results as one by one. */
void quill_matmuls(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                   int n_tok);
/* quill_matmuls on the calling thread alone, for parallel items that are products themselves (one
 * expert's tokens each, ffn_moe.c): `scratch` holds kern->matmul_scratch(cols, n_tok) bytes,
 * `thread` indexes thread_scratch. Same results. */
void quill_matmuls_here(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                        int n_tok, void *scratch, int thread);
/* Announces the first product that quill_matmuls(w, n) will run to the pool, so that idle threads
 * prefetch its first bytes (only for few tokens, where products wait for memory). */
void quill_announce(const quill_context *c, const quill_weight *const *w, int n, int n_tok);
/* Announces the products that follow layer `layer`: the next layer's q, k, v, or the output. */
void quill_announce_next_layer(const quill_context *c, int layer, int n_tok);
/* Hands a tensor to the context's trace callback as "name-layer" (layer < 0: "name"). */
void quill_trace(const quill_context *c, const char *name, int layer, const float *data, int n_dims, int64_t ne0,
                 int64_t ne1, int64_t ne2);
/* gate[t][i] = act(gate[t][i]) · up[t][i] for t < n_tok, i < width, in parallel over tokens, with
 * the architecture's activation (each token's bits independent of the split). */
void quill_gated_activation(const quill_context *c, float *gate, const float *up, int n_tok, int64_t width);
/* The same on the calling thread alone. */
void quill_gated_activation_here(const quill_context *c, float *gate, const float *up, int n_tok, int64_t width);

/* How many of a layer's wq, wk, wv it computes: q alone when it reads an earlier layer's cache,
 * q and k when V is K's projection. */
static inline int quill_projections(const quill_layer *L) { return L->kv_shared ? 1 : L->v_from_k ? 2 : 3; }

/* Gemma 4's per-layer inputs (per_layer.c): each token's slices for every layer, from the embeddings
 * in c->x (before the first layer); then layer `layer`'s gated slice added to c->x (after its FFN). */
void quill_per_layer_inputs_prepare(quill_context *c, const int32_t *tokens, int n_tok);
void quill_per_layer_inputs_fast(quill_context *c, const quill_layer *L, int layer, int n_tok);

/* Causal attention of layer `layer` over the micro-batch's queries in c->q (written to the cache
 * before), into c->att: the items of the fast pass's attention. */
void quill_attention(quill_context *c, int layer, int n_tok);

/* Latent attention (mla.c): the micro-batch's attention block from c->xb, its output in c->xb; and
 * one token's at position pos in double, in -> out. */
void quill_mla_fast(quill_context *c, const quill_layer *L, int layer, int n_tok);
quill_status quill_mla_exact(const quill_context *c, const quill_layer *L, int layer, const double *in, int pos,
                             double *out, quill_error *err);

/* ---------------------------------------------------------------- float64 pass (reference.c) */

/* out[r] = Σ_i W[r][i]·x[i] in double; row is scratch of w->cols floats. */
void quill_ref_matvec(const quill_weight *w, const double *x, double *out, float *row);
/* act(gate) · up in double, with the architecture's activation, into gate. */
void quill_ref_gated_activation(const quill_context *c, double *gate, const double *up, int64_t n);
/* Hands a double vector (one token) to the trace callback as f32; tmp holds n floats. */
void quill_ref_trace(const quill_context *c, const char *name, int layer, const double *v, int64_t n, int n_dims,
                     int64_t ne0, int64_t ne1, float *tmp);

/* The float64 per-layer inputs: one token's slices [n_layer][n_pl] from its scaled embedding x; then
 * layer `layer`'s gated slice added to x. */
quill_status quill_per_layer_inputs_exact(const quill_context *c, int32_t token, const double *x, double *slices,
                                          quill_error *err);
quill_status quill_per_layer_inputs_exact_layer(const quill_context *c, const quill_layer *L, int layer,
                                                const double *slices, double *x, quill_error *err);

/* ---------------------------------------------------------------- the FFN blocks */

/* One kind of feed-forward block, in both passes. `fast` reads the micro-batch's normed input from
 * c->xb and leaves the block's output there (before any post-norm); `exact` maps one token's
 * input `in` [n_embd] to `out` [n_embd] in double (the same per-token arithmetic, so that the
 * same experts are chosen wherever the logits are not near a tie); `announce` tells the pool the block's first
 * product (quill_announce), while attention's output product runs. */
typedef struct quill_ffn_impl {
    void (*announce)(const quill_context *c, const quill_layer *L, int n_tok);
    void (*fast)(quill_context *c, const quill_layer *L, int layer, int n_tok);
    quill_status (*exact)(const quill_context *c, const quill_layer *L, int layer, const double *in, double *out,
                          quill_error *err);
    const char *out_name; /* the block's output in the reference's traces */
} quill_ffn_impl;

extern const quill_ffn_impl quill_ffn_dense, quill_ffn_moe, quill_ffn_moe_shared;

/* The implementation of an FFN kind (model.c; a layer's is L->ffn_impl). */
const quill_ffn_impl *quill_ffn_of(quill_ffn_kind kind);

#endif
