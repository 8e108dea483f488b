/* Hybrid architectures (Qwen 3.5, Qwen3-Next; Nemotron-H, Granite 4.0-H): the Gated DeltaNet layers
 * (deltanet.c) or the Mamba-2 mixers (mamba.c), and the recurrent state they keep per sequence
 * (recurrent.c). A Mamba-2 layer keeps the same two parts: its convolution's last inputs (over the
 * xBC channels) and S [d_inner][state].
 *
 * A DeltaNet layer keeps, per sequence, the last kernel - 1 inputs of its causal convolution
 * ([conv channels][kernel - 1]) and one state matrix per value head ([head][v][k], the reference's
 * transposed layout: row j holds S[.][j]). A state cannot be cut back to an earlier position as a
 * KV cache can: the context keeps each sequence's tokens and copies of its state (checkpoints) at
 * chosen positions; going back restores the nearest checkpoint at or before the target and
 * evaluates the tokens from there again, which gives the same bits as a fresh run because every
 * token's arithmetic is independent of the batching. */
#ifndef QUILL_RECURRENT_H
#define QUILL_RECURRENT_H

#include "model/context.h"

/* Checkpoints kept per sequence (besides the empty state at position 0, always at hand). */
#define QUILL_CHECKPOINTS 4
/* A sequence that grows by one token at a time (generation) gets a checkpoint every this many. */
#define QUILL_CHECKPOINT_EVERY 256

typedef struct {
    int pos;        /* the state after positions [0, pos); -1: unused */
    void *state;    /* seq_bytes */
} quill_checkpoint;

struct quill_recurrent {
    int n_rec;                  /* DeltaNet (or Mamba-2) layers */
    int *rec_index;             /* [n_layer] the layer's index among them, or -1 */
    int64_t conv_elems, ssm_elems; /* per sequence and recurrent layer */
    size_t elem;                /* sizeof(float), or sizeof(double) on the reference path */
    size_t seq_bytes;           /* one sequence's whole state */
    uint8_t *state;             /* [n_seq][seq_bytes]: per sequence, the layers' conv states, then their matrices */
    quill_checkpoint *ckpt;     /* [n_seq][QUILL_CHECKPOINTS] */
    int *last_ckpt;             /* [n_seq] position of the newest checkpoint taken */
    int32_t *tokens;            /* [n_seq][n_ctx] every sequence's tokens, to evaluate again */
    /* fast path's scratch, per micro-batch */
    float *mixed, *z, *beta, *alpha, *out; /* [ub][conv channels], [ub][value dim], [ub][v heads] x2, [ub][value dim] */
    float *qfull, *gate;        /* gated attention: [ub][2 q_dim], [ub][q_dim] */
    float *qkvz;                /* Qwen3-Next's fused ssm_in: [ub][conv channels + value dim] */
    float *decay, *gate_beta;   /* the delta rule's e^g and σ(b): [ub][v heads] each */
    float *bcx, *conv_y;        /* short convolutions: in_proj's [ub][3 n_embd], the gated output [ub][n_embd] */
    size_t bytes;               /* all of the above, for the memory estimate */
};

/* ---------------------------------------------------------------- loading (deltanet.c) */

/* Reads the hybrid hyperparameters (ssm.*, full_attention_interval or attention.recurrent_layers,
 * rope.dimension_sections), checks them against each other and marks the DeltaNet layers. */
quill_status quill_hybrid_params(quill_model *m, quill_error *err);
/* Binds the tensors of DeltaNet layer l. */
quill_status quill_hybrid_bind_layer(quill_model *m, int64_t l, quill_error *err);
/* Checks the MTP blocks' tensors (loaded, not run). */
quill_status quill_hybrid_bind_mtp(quill_model *m, quill_error *err);
void quill_hybrid_free_layer(quill_layer *L);

/* ---------------------------------------------------------------- the passes (deltanet.c) */

/* A DeltaNet layer on the micro-batch: its normed input in c->xb, its output left there. */
void quill_deltanet_fast(quill_context *c, const quill_layer *L, int layer, int n_tok);
/* The same for one token of sequence 0 in double: in [n_embd] -> out [n_embd]. */
quill_status quill_deltanet_exact(const quill_context *c, const quill_layer *L, int layer, const double *in,
                                  double *out, quill_error *err);
/* Gated attention: splits rec->qfull into c->q and rec->gate; after attention, c->att *= σ(gate). */
void quill_attn_gate_split(quill_context *c, int n_tok);
void quill_attn_gate_apply(quill_context *c, int n_tok);

/* The causal depthwise convolution of the micro-batch's conv channels in rec->mixed, in place: each
 * token's window is its sequence's last kernel - 1 inputs and its own (which then shift into the
 * state); out = silu(Σ taps + L->ssm_conv_b when the layer has one). */
void quill_causal_conv(quill_context *c, const quill_layer *L, int layer, int n_tok);

/* The ssm.* size `arch`.`suffix`, required, within lo..hi (DeltaNet's and Mamba-2's keys). */
quill_status quill_ssm_size(const quill_gguf *g, const char *arch, const char *suffix, int64_t lo, int64_t hi,
                            int64_t *out, quill_error *err);

/* ---------------------------------------------------------------- Mamba-2 (mamba.c) */

/* Layer `layer`'s value of the per-layer key (an array of n_layer, or one number for all; 0 allowed;
 * missing: fallback, or an error when fallback < 0). */
quill_status quill_mamba_layer_value(const quill_gguf *g, const char *key, int64_t n_layer, int64_t layer,
                                     int64_t fallback, int64_t *out, quill_error *err);
/* Reads the ssm.* sizes and each layer's kind and shape from the per-layer head_count_kv and
 * feed_forward_length (recurrent where head_count_kv is 0; Nemotron-H: and feed_forward_length 0). */
quill_status quill_mamba_params(quill_model *m, quill_error *err);
/* Binds the Mamba-2 tensors of layer l (ssm_in, ssm_conv1d and its optional bias, ssm_dt.bias, ssm_a,
 * ssm_d, ssm_norm, ssm_out). */
quill_status quill_mamba_bind_layer(quill_model *m, int64_t l, quill_error *err);
/* A Mamba-2 mixer on the micro-batch: its normed input in c->xb, its output left there. */
void quill_mamba_fast(quill_context *c, const quill_layer *L, int layer, int n_tok);
/* The same for one token of sequence 0 in double: in [n_embd] -> out [n_embd]. */
quill_status quill_mamba_exact(const quill_context *c, const quill_layer *L, int layer, const double *in, double *out,
                               quill_error *err);

/* ---------------------------------------------------------------- LFM2's short convolutions (shortconv.c)
 *
 * A conv layer keeps, per sequence, the last l_cache - 1 inputs of its convolution ([n_embd][l_cache - 1],
 * the DeltaNet conv state's layout) and no matrices. */

/* The layers' KV head count as the reference reads attention.head_count_kv: one number, or one per layer
 * where 0 marks a conv layer; the attention layers' (all equal) into *out (n_head when there are none). */
quill_status quill_shortconv_kv_heads(const quill_gguf *g, const char *key, int64_t n_layer, int64_t n_head,
                                      int64_t *out, quill_error *err);
/* shortconv.l_cache, the keys quill does not implement refused by name, the conv layers marked. */
quill_status quill_shortconv_params(quill_model *m, quill_error *err);
quill_status quill_shortconv_bind_layer(quill_model *m, int64_t l, quill_error *err);
/* A conv layer on the micro-batch (its normed input in c->xb, its output left there), and one token
 * of sequence 0 in double. */
void quill_shortconv_fast(quill_context *c, const quill_layer *L, int layer, int n_tok);
quill_status quill_shortconv_exact(const quill_context *c, const quill_layer *L, int layer, const double *in,
                                   double *out, quill_error *err);

/* ---------------------------------------------------------------- state (recurrent.c) */

/* The state's bytes for a context of n_seq sequences of n_ctx positions (estimate, no allocation). */
double quill_recurrent_bytes(const quill_model *m, int n_seq, int n_ctx, bool reference);
/* Allocates c->rec (zero states); false when out of memory. */
bool quill_recurrent_new(quill_context *c);
void quill_recurrent_free(quill_context *c);
/* The conv state and the matrices of DeltaNet layer `layer` for sequence seq (floats, or doubles
 * on the reference path). */
void *quill_recurrent_conv(const quill_context *c, int seq, int layer);
void *quill_recurrent_ssm(const quill_context *c, int seq, int layer);
/* After a micro-batch: records its tokens and takes the checkpoints the policy asks for. */
void quill_recurrent_after_ubatch(quill_context *c, const int32_t *tokens, const int32_t *seq, const int32_t *pos,
                                  int n);
/* Going back is the state's half of the work, the evaluation the forward pass's (batch.c): the
 * state never calls the forward pass. quill_recurrent_rewind restores sequence seq's newest
 * checkpoint at or before pos and returns its position, now seq's length; the caller evaluates
 * the stored tokens (quill_recurrent_tokens) from there up to pos. */
int quill_recurrent_rewind(quill_context *c, int seq, int pos);
/* Gives dst src's tokens and checkpoints up to n, and src's state when n is src's length; returns
 * dst's length, from which the caller evaluates dst's stored tokens up to n. */
int quill_recurrent_copy_prefix(quill_context *c, int src, int dst, int n);
/* Sequence seq's tokens as evaluated, n_ctx of them. */
const int32_t *quill_recurrent_tokens(const quill_context *c, int seq);

#endif
