/* Internal state of an inference context, shared by the fast and the reference forward passes. */
#ifndef QUILL_CONTEXT_H
#define QUILL_CONTEXT_H

#include "kernels/kernels.h"
#include "model/model.h"
#include "base/threadpool.h"

/* Prompts are evaluated in micro-batches of this many tokens: scratch memory stays small and the
 * results are the same as for one big batch (every token's arithmetic is independent of it). */
#define QUILL_UBATCH 64
/* ... or of this many in mixture-of-experts models, whose micro-batches are grouped by expert: with
 * 8 of 128 experts chosen per token, 64 tokens give an expert 4 on average, and each read of its
 * rows serves 4x more tokens at 256 (the products' cost per token falls with more tokens). */
#define QUILL_UBATCH_MOE 256
#define QUILL_UBATCH_MAX QUILL_UBATCH_MOE
/* A model's micro-batch: QUILL_UBATCH_MOE with experts (hybrids too), else QUILL_UBATCH. */
static inline int quill_model_ubatch(const quill_model *m) { return m->ap.n_expert ? QUILL_UBATCH_MOE : QUILL_UBATCH; }

/* The most tokens of one expert that a thread multiplies at a time (ffn_moe.c). */
#define QUILL_EXPERT_TOKENS 64
/* Bytes of one part of a thread's expert scratch (context.h: expert_scratch) holding `n` floats,
 * rounded up so that the next part starts 64-byte aligned. */
static inline size_t quill_expert_part(size_t n) { return (n * sizeof(float) + 63) & ~(size_t)63; }

/* The key cache of one KV head is blocks of KEY_BLOCK positions, each dimension-major: key
 * (d, pos) at block pos / KEY_BLOCK, d · KEY_BLOCK + pos % KEY_BLOCK (see forward.c). */
#define KEY_BLOCK QUILL_KEY_BLOCK
/* Tokens of one attention work item (see forward.c). */
#define ATT_TOKENS 4

/* The hybrid architectures' recurrent state and its scratch (recurrent.h); NULL for the others. */
typedef struct quill_recurrent quill_recurrent;

struct quill_context {
    quill_model *model;
    const quill_hparams *hp;
    int n_ctx, n_threads;           /* n_ctx: positions of each sequence */
    int ubatch;                     /* tokens of a micro-batch: QUILL_UBATCH or QUILL_UBATCH_MOE */
    int n_seq;                      /* sequences in the cache */
    int *seq_len;                   /* [n_seq] cached positions of each sequence */
    int *seq_next;                  /* [n_seq] scratch of quill_decode's checks */
    bool reference;
    quill_pool *pool;
    const quill_kernels *kern;
    /* the Vulkan backend (gpu_offload.c): the device, whose uploaded weights' products run there, the
     * layers placed on it, and the first failure of a product there (the pass's callers return it) */
    struct quill_gpu *gpu;
    int gpu_layers;
    struct quill_gpu_failure *gpu_failure; /* (its own allocation: the products see a const context) */
    /* the placed layers run whole on the device (every operation of theirs is written there): the
     * first of them and where their KV cache is there (gpu_offload.c), or NULL when only their weight
     * products run there */
    struct quill_gpu_layers {
        int first;
        struct quill_gpu_kv_layer *kv; /* [layer - first] */
    } *gpu_whole;
    bool packed;                    /* the model's weights are packed for kern (their packed copies serve) */
    quill_trace_fn trace;
    void *trace_user;

    const float *rope_factors;      /* the RoPE frequency divisors this context uses, or NULL */

    /* the micro-batch being evaluated: each token's sequence and position, and the runs of
     * consecutive tokens of one sequence (at most ATT_TOKENS) that attention items take */
    const int32_t *ub_seq, *ub_pos;
    int *run_start, n_runs;

    /* fast path: the KV cache, keys [n_layer][seq][kv head][block of KEY_BLOCK positions][head dim]
     * [KEY_BLOCK], values [n_layer][seq][kv head][n_ctx][head dim] (each layer its own sizes:
     * quill_kv_at), in type_k and type_v (kv_cache.h: quill_row_size(type, elements) turns an
     * offset in elements into bytes); RoPE cos and sin [table][n_ctx][quill_rope_stride] */
    uint32_t type_k, type_v;
    uint8_t *k_cache, *v_cache;
    float *rope_cos, *rope_sin;
    float *x, *xb, *q, *k, *v, *att, *ffn_gate, *ffn_up;
    /* per-layer inputs (per_layer.c): each token's slices [token][n_layer][n_pl], the projection's
     * scratch of the same size, one layer's gate [token][n_pl] */
    float *ple_inp, *ple_proj, *ple_gate;
    /* MoE (ffn_moe.c): router logits [token][n_expert]; each token's chosen experts and weights
     * [token][n_expert_used]; the (token, slot) pairs grouped by expert (token · n_expert_used +
     * slot) and where each expert's group starts [n_expert + 1]; the inputs of one expert's tokens
     * gathered [token][n_embd]; each slot's expert output [token][slot][n_embd] */
    float *moe_logits, *moe_weight, *moe_in, *moe_out;
    double *moe_router; /* [token][expert]: the router's logits in float64 (ffn_moe.c) */
    float *moe_shared_gate;         /* [token]: the shared expert's sigmoid gate */
    float *mla;                     /* latent attention's scratch (mla.c): [ubatch][ap.mla_floats] */
    /* MoE micro-batches' experts in parallel (ffn_moe.c): per thread, room for a chunk of
     * QUILL_EXPERT_TOKENS of one expert's tokens: their inputs [token][n_embd] (then its outputs),
     * gate and up [token][n_ff_exp], then the products' scratch; expert_scratch_bytes apart */
    uint8_t *expert_scratch;
    size_t expert_scratch_bytes;
    int32_t *moe_expert, *moe_pairs, *moe_start;
    float *thread_scratch;          /* per thread: a dequantized row or attention scores */
    size_t thread_scratch_len;
    size_t tile_at;                 /* where a thread's decoded key block or value rows start in its
                                     * scratch, after the scores (a cache in f32 needs none) */
    void *matmul_scratch;           /* for kern->matmul (NULL when the kernels have none) */

    /* reference path: everything in double (K and V rounded as type_k and type_v store them) */
    double *ref_k, *ref_v;

    quill_recurrent *rec;

    void *buffers;                  /* the one mapping that holds every buffer above (context.c) */
    size_t buffers_bytes;
};

/* Floats between two heads' scores: the context rounded up to a multiple of 16 (64 bytes). */
static inline int64_t quill_score_stride(int n_ctx) { return ((int64_t)n_ctx + 15) / 16 * 16; }
static inline int64_t quill_key_positions(int n_ctx) {
    return ((int64_t)n_ctx + KEY_BLOCK - 1) / KEY_BLOCK * KEY_BLOCK;
}

/* Where layer L's keys (positions: quill_key_positions) or values (positions: n_ctx) of sequence seq
 * start in their cache, in elements: the layers' caches one after the other, each [seq][its KV
 * width · positions]. */
static inline size_t quill_kv_at(const quill_context *c, const quill_layer *L, int seq, int64_t positions) {
    return ((size_t)L->kv_offset * (size_t)c->n_seq + (size_t)seq * (size_t)(L->n_head_kv * L->head_dim)) *
           (size_t)positions;
}

/* The rotated dims of RoPE table `table`, and the floats per position in every table: half the larger
 * table's (the tables differ in Gemma 4, rope.dimension_count_swa). */
static inline int64_t quill_rope_dims(const quill_model *m, int table) { return table ? m->ap.n_rot_local : m->hp.n_rot; }
static inline int64_t quill_rope_stride(const quill_model *m) {
    return (m->hp.n_rot > m->ap.n_rot_local ? m->hp.n_rot : m->ap.n_rot_local) / 2;
}

/* The RoPE angle of dimension pair i at position pos in table `table` (0: every layer's; 1: the
 * sliding-window layers' of architectures that rotate those with another base), in double. */
double quill_rope_angle(const quill_context *c, int table, int pos, int64_t i);

/* One micro-batch (at most c->ubatch tokens) of the fast path: token t of sequence seq[t] at
 * position pos[t]; `logits` receives a row for each token with want[t], in order (forward.c).
 * The caller has checked the batch (batch.c). */
void quill_forward_ubatch(quill_context *c, const int32_t *tokens, const int32_t *seq, const int32_t *pos,
                          const bool *want, int n, float *logits);

/* Packs the model's weights for the kernel set k, on pool, unless they are packed already (pack.c);
 * returns whether k's packed products can read them. Without memory for the copies, or with
 * QUILL_REPACK=0 in the environment, the weights stay in the file's layout. */
bool quill_model_pack(quill_model *m, const quill_kernels *k, quill_pool *pool);

/* The float64 reference forward pass (reference.c), sequence 0 only. */
quill_status quill_reference_eval(quill_context *c, const int32_t *tokens, int n, float *logits,
                                  bool all_logits, quill_error *err);

#endif
