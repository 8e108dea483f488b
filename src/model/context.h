/* Internal state of an inference context, shared by the fast and the reference forward passes. */
#ifndef QUILL_CONTEXT_H
#define QUILL_CONTEXT_H

#include "kernels/kernels.h"
#include "model/model.h"
#include "base/threadpool.h"

/* Prompts are evaluated in micro-batches of this many tokens: scratch memory stays small and the
 * results are the same as for one big batch (every token's arithmetic is independent of it). */
#define QUILL_UBATCH 64

struct quill_context {
    quill_model *model;
    const quill_hparams *hp;
    int n_ctx, n_threads, pos;
    bool reference;
    quill_pool *pool;
    const quill_kernels *kern;
    quill_trace_fn trace;
    void *trace_user;

    /* fast path: f32 KV cache, keys [n_layer][kv head][head dim][n_ctx] (dimension-major for the
     * score kernel), values [n_layer][n_ctx][kv_dim]; RoPE table [n_ctx][n_rot/2] */
    float *k_cache, *v_cache;
    float *rope_cos, *rope_sin;
    float *x, *xb, *q, *k, *v, *att, *ffn_gate, *ffn_up, *logits;
    float *thread_scratch;          /* per thread: a dequantized row or attention scores */
    size_t thread_scratch_len;
    void *matmul_scratch;           /* for kern->matmul (NULL when the kernels have none) */

    /* reference path: everything in double */
    double *ref_k, *ref_v;
};

/* The float64 reference forward pass (reference.c). */
quill_status quill_reference_eval(quill_context *c, const int32_t *tokens, int n, float *logits,
                                  bool all_logits, quill_error *err);
/* The fast forward pass hooks used by tests to inject faults (test builds only). */
extern int quill_test_flip_rope_sign;

#endif
