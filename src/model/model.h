/* Internal view of a loaded model, shared by the forward passes. */
#ifndef QUILL_MODEL_INTERNAL_H
#define QUILL_MODEL_INTERNAL_H

#include "quill.h"

/* A weight matrix as stored: `rows` rows of `cols` elements of `type`, row-major, in the mapping.
 * A fused tensor (phi3's attn_qkv, its gate+up ffn_up) is bound as several of these, each a view
 * of consecutive rows. A 3-D expert tensor [n_expert][rows][cols] is n_expert such matrices,
 * expert_bytes apart (packed_expert_bytes apart in the packed copy); quill_weight_expert views one. */
typedef struct {
    const char *name;
    uint32_t type;
    int64_t cols, rows;
    size_t row_bytes;
    const uint8_t *data;
    const uint8_t *packed; /* the same matrix in the model's packed layout (pack.c), or NULL */
    int64_t n_expert;      /* 1 for a plain matrix */
    size_t expert_bytes, packed_expert_bytes;
    /* an expert tensor's copy is made in the background (pack.c): expert e's packed copy serves
     * once expert_ready[e] is set (NULL: every expert's, when packed is set) */
    const uint8_t *expert_ready;
} quill_weight;

/* Expert e of a 3-D expert tensor, as a plain matrix: its packed copy when it is complete, else
 * the file's rows (the same products, bit for bit). */
static inline quill_weight quill_weight_expert(const quill_weight *w, int64_t e) {
    quill_weight v = *w;
    v.n_expert = 1;
    v.data = w->data + (size_t)e * w->expert_bytes;
    const bool ready = !w->expert_ready || __atomic_load_n(&w->expert_ready[e], __ATOMIC_ACQUIRE);
    v.packed = w->packed && ready ? w->packed + (size_t)e * w->packed_expert_bytes : NULL;
    v.expert_ready = NULL;
    return v;
}

/* RoPE rotates pairs of a head's first n_rot dims: adjacent ones (x[2i], x[2i+1]) in the original
 * Llama layout, or the two halves (x[i], x[i + n_rot/2]) in the GPT-NeoX layout. */
typedef enum { QUILL_ROPE_ADJACENT, QUILL_ROPE_NEOX } quill_rope_style;

/* The feed-forward's gate: silu(gate)·up (SwiGLU), gelu_tanh(gate)·up (GeGLU), or gpt-oss's clamped
 * SwiGLU, g·sigmoid(1.702·g)·(u + 1) with g = min(gate, 7) and u = clamp(up, -7, 7). */
typedef enum { QUILL_ACT_SILU, QUILL_ACT_GELU_TANH, QUILL_ACT_SWIGLU_OAI, QUILL_ACT_RELU2 } quill_activation;
/* (QUILL_ACT_RELU2: Nemotron-H's ungated FFN, relu(up)², with no ffn_gate) */

/* The feed-forward block of a layer (forward.h maps each to its fast and float64 versions):
 * dense is one gated FFN of ffn_gate, ffn_up, ffn_down (ffn_dense.c); MoE is a router
 * (ffn_gate_inp) that picks expert_used_count of expert_count gated FFNs, the 3-D tensors
 * ffn_{gate,up,down}_exps, and sums their outputs with the router's weights (ffn_moe.c); MoE with
 * a shared expert adds one more gated FFN every token runs, ffn_{gate,up,down}_shexp, scaled by
 * sigmoid(ffn_gate_inp_shexp · h) (ffn_moe.c). */
typedef enum { QUILL_FFN_DENSE, QUILL_FFN_MOE, QUILL_FFN_MOE_SHARED } quill_ffn_kind;

/* How a MoE router turns its logits into the chosen experts' weights: a softmax over all experts,
 * then the top k (Qwen3-MoE, Mixtral); or the top k logits, then a softmax over those k (gpt-oss);
 * or a sigmoid of each logit, the top k of those (plus a selection bias) weighting (DeepSeek V3,
 * GLM-4.5: expert_gating_func 2). */
typedef enum { QUILL_GATING_SOFTMAX, QUILL_GATING_TOP_K_SOFTMAX, QUILL_GATING_SIGMOID } quill_gating;

/* The most experts a layer may have (the reference's limit). */
#define QUILL_MAX_EXPERTS 512

/* One architecture: general.architecture's value (also the prefix of its hyperparameter keys) and
 * the ways its layer differs from Llama's. arch.c holds the table; the forward passes read these
 * per layer, never per element. */
typedef struct quill_arch {
    const char *name;
    quill_rope_style rope;
    quill_activation act;
    quill_ffn_kind ffn;
    bool experts_optional; /* MoE only when <arch>.expert_count > 0, else dense (llama: Mixtral) */
    quill_gating gating;
    bool norm_expert_weights; /* the chosen experts' weights divided by their sum */
    bool expert_ff_key;   /* expert_feed_forward_length, else feed_forward_length / expert_used_count
                           * (without it: feed_forward_length) */
    bool shared_expert;   /* MoE with a shared expert, expert_shared_feed_forward_length (else
                           * feed_forward_length) wide (qwen2moe) */
    bool qkv_bias;        /* attn_{q,k,v}.bias added after the projections */
    bool qk_norm;         /* attn_{q,k}_norm.weight [head_dim]: RMS norm per head before RoPE */
    bool post_norms;      /* attn_post_norm and post_ffw_norm: RMS norm of each branch before the residual */
    bool fused_qkv;       /* attn_qkv (q, k, v rows) is how its files come; any attention layer of a
                           * dense architecture may have one, with attn_qkv.bias, as the reference reads */
    bool fused_gate_up;   /* ffn_up.weight holds the gate's rows, then the up rows; no ffn_gate */
    bool embd_scale;      /* embeddings multiplied by sqrt(n_embd) */
    bool softcap;         /* attention and final logit soft-capping: cap · tanh(x / cap) */
    bool gemma_query_scale; /* queries scaled by 1/sqrt(n_embd/n_head) for the 27B shapes */
    bool rope_freqs;      /* rope_freqs.weight [n_rot/2] may divide the frequencies (Llama 3) */
    bool rope_long_short; /* rope_factors_{long,short}.weight (Phi-3 LongRoPE) */
    int swa_pattern;      /* n > 0: layer il uses the sliding window when il % n < n - 1, unless the
                           * file's attention.sliding_window_pattern names another n (0: every layer) */
    double swa_rope_base; /* RoPE base of the sliding-window layers, unscaled, unless the file's
                           * rope.freq_base_swa names one (0: the global base and scaling) */
    double swa_default;   /* window when the file names none (0: none, every layer global) */
    bool swa_required;    /* attention.sliding_window must be there (gpt-oss) */
    bool attn_out_bias;   /* attn_output.bias added after the output projection */
    bool attn_sinks;      /* attn_sinks.weight [n_head]: a learned logit per head in each softmax */
    bool ffn_norm_post_attention; /* the FFN's input norm is post_attention_norm.weight (gpt-oss) */
    bool expert_biases;   /* ffn_gate_inp.bias and ffn_{gate,up,down}_exps.bias */
    bool head_dim_is_rot; /* the head size is rope.dimension_count (the reference sizes q, k, v by it) */
    bool trace_q_scaled;  /* the reference's Qcur trace is taken after the queries' scaling (Phi-3) */
    bool hybrid;          /* Qwen 3.5 / Qwen3-Next: Gated DeltaNet layers (deltanet.c) between full-attention
                           * layers whose queries carry an output gate */
    bool rope_sections;   /* rope.dimension_sections: interleaved multi-section RoPE (text positions) */
    bool ssm_grouped;     /* Qwen3-Next: value heads grouped by key head (head h reads key head h / ratio),
                           * beta and alpha packed per key head in ssm_ba */
    int nope_interval;    /* n > 0: layer il is not rotated when (il + 1) % n == 0 (SmolLM3) */
    bool no_input_norms;  /* no attn_norm, ffn_norm: q, k, v read the residual stream, the FFN ffn_inp (OLMo 2) */
    bool qk_norm_full;    /* attn_{q,k}_norm are [q_dim], [kv_dim]: one RMS norm over the whole projection */
    bool swa_rope_plain;  /* the sliding layers rotate with the global base, unscaled, magnitude 1 (OLMo 3) */
    bool output_required; /* output.weight must be there (no tied embeddings) */
    bool multipliers;     /* Granite: embedding_scale, attention.scale, residual_scale (each branch before its
                           * residual add) and logit_scale (logits divided by it, required) */
    bool mtp_skipped;     /* block_count counts nextn_predict_layers MTP blocks after the main stack, not
                           * loaded (GLM-4) */
    bool mrope_refused;   /* rope.dimension_sections (a vision variant's multi-section RoPE) is refused */
    int64_t swa_at_layers; /* n > 0: sliding layers only in a model of n layers (EXAONE 4 32B) */
    bool swa_rope_global; /* the sliding layers rotate as the global ones (rope.freq_base_swa unused) */
    bool global_unroped;  /* with sliding layers, the global layers are not rotated */
    bool layer_norm;      /* attn_norm and output_norm are LayerNorms without bias (attention.layer_norm_epsilon,
                           * required) where Llama has RMS norms (Cohere) */
    bool parallel_block;  /* attention and FFN both read attn_norm's output; x += ffn, then x += attention;
                           * no ffn_norm (Cohere) */
    bool logit_scale;     /* logits multiplied by the required logit_scale (Cohere) */
    bool output_tied;     /* the output is always token_embd, whatever output.weight the file has (Cohere 2) */
    bool yarn_keys;       /* rope.scaling.yarn_beta_fast, yarn_beta_slow, yarn_log_multiplier and Llama 4's
                           * attention.temperature_scale are read (Mistral 3) */
    /* Gemma 4 (per_layer.c): */
    bool per_layer_shapes; /* attention.head_count, head_count_kv and feed_forward_length may be per-layer arrays;
                           * attention.sliding_window_pattern (required) says per layer which slide; the sliding
                           * layers have their own head size (attention.key_length_swa, required) and rotated
                           * dims (rope.dimension_count_swa) */
    bool kv_sharing;      /* attention.shared_kv_layers: the last n layers have no K, V of their own and attend
                           * over the cache of the last earlier layer of their kind (sliding or global) */
    bool v_norm;          /* attn_v optional (without it V is K's projection); V RMS-normed per head, no weight */
    bool per_layer_inputs; /* embedding_length_per_layer_input (required; 0: none): a slice of per-layer token
                           * embeddings and of a projection of the embeddings, gated into each layer's output */
    bool layer_out_scale; /* layer_output_scale.weight [1] (optional) multiplies each layer's output */
    bool unit_attn_scale; /* q·k unscaled (the q and k norms stand in for 1/sqrt(head_dim)) */
    bool final_softcap;   /* final logit soft-capping alone: final_logit_softcapping, 30 unless the file says (0: none) */
    bool rope_freqs_global; /* rope_freqs.weight [global head size / 2] divides the global layers' frequencies
                           * (required when a layer is global): proportional RoPE, 1e30 for the unrotated pairs */
    bool trace_projections; /* the reference's Qcur, Kcur, Vcur are the projections (before norms and RoPE) and
                           * its attn_out is the residual stream after attention */
    /* DeepSeek V2/V3, Kimi K2 (mla.c), GLM-4.5: */
    bool mla;             /* Multi-head Latent Attention: low-rank q (attn_q_a, attn_q_a_norm, attn_q_b; or attn_q),
                           * one latent KV head (attn_kv_a_mqa, attn_kv_a_norm) holding the latent and a decoupled
                           * RoPE part, attn_k_b / attn_v_b per head (or the older files' attn_kv_b) */
    bool router_keys;     /* expert_gating_func, expert_weights_norm, expert_weights_scale, expert_group_count and
                           * expert_group_used_count are read; leading_dense_block_count layers have a dense FFN;
                           * expert_shared_count shared experts (ungated, expert_feed_forward_length each) */
    int probs_bias;       /* exp_probs_b.bias [n_expert], added to the router's probabilities to choose the experts
                           * (not to weight them): 1 optional, 2 required */
    bool qk_norm_optional; /* attn_{q,k}_norm.weight [head_dim] when the file has them (GLM-4.5: use_qk_norm) */
    /* Mamba-2 hybrids (mamba.c): */
    bool mamba2;          /* the recurrent layers are Mamba-2 mixers (ssm_in [z | xBC | dt], a causal conv over
                           * xBC, the selective scan with grouped B and C, the D skip, silu(z) gate, grouped
                           * RMS norm, ssm_out); a layer is recurrent where attention.head_count_kv[l] is 0 */
    bool single_block;    /* Nemotron-H: each layer is one block on attn_norm's output, a Mamba-2 mixer,
                           * attention (feed_forward_length[l] 0) or an FFN alone (head_count_kv[l] > 0 and
                           * feed_forward_length[l] > 0), then the residual; no ffn_norm */
    bool unroped;         /* no layer is rotated: attention without positions (Nemotron-H) */
    bool mtp_bound;       /* block_count counts nextn_predict_layers MTP blocks after the main stack: their
                           * tensors are checked at load (claimed), never run */
    /* LFM2 (shortconv.c): */
    bool shortconv;       /* gated short-convolution layers (attention.head_count_kv 0 in its per-layer array)
                           * between attention layers; the final norm is token_embd_norm; every tensor claimed */
    bool router_norm_only; /* the router's chosen weights always normalised, never scaled; expert_gating_func
                           * required; no shared experts (LFM2-8B-A1B: the keys the reference reads for it) */
} quill_arch;

/* Whether the architecture keeps a recurrent state per sequence (recurrent.h). */
static inline bool quill_arch_stateful(const quill_arch *a) { return a->hybrid || a->mamba2 || a->shortconv; }

/* ---- bind.c: metadata sizes and tensors by name, for the loader and the layer kinds */
/* The size `key`: positive and within bounds; missing: `fallback`, or an error when fallback < 0. */
quill_status quill_model_dim(const quill_gguf *g, const char *key, int64_t fallback, int64_t *out, quill_error *err);
/* Layer `layer`'s value of `key`: one number for all layers, or (arrays) an array of n_layer. */
quill_status quill_layer_dim(const quill_gguf *g, const char *key, bool arrays, int64_t n_layer, int64_t layer,
                             int64_t fallback, int64_t *out, quill_error *err);
/* Binds tensor `name` as a matrix of rows x cols, checking its shape and type. */
quill_status quill_model_bind(quill_model *m, const char *name, int64_t cols, int64_t rows, quill_weight *w,
                              quill_error *err);
/* Binds the 3-D tensor `name` as n matrices of rows x cols, one after the other. */
quill_status quill_model_bind_experts(quill_model *m, const char *name, int64_t cols, int64_t rows, int64_t n,
                                      quill_weight *w, quill_error *err);
/* Loads the small tensor `name` [rows][cols] as f32 (malloc'd into *out). */
quill_status quill_model_floats(quill_model *m, const char *name, int64_t cols, int64_t rows, float **out,
                                quill_error *err);

/* Frees the packed copies of the weights (pack.c), if any, after stopping their copier. */
void quill_model_unpack(quill_model *m);
/* Waits until the expert tensors' copies are complete (stop: cuts them short instead). */
void quill_model_finish_packing(quill_model *m, bool stop);

/* Gemma 4's per-layer features (per_layer.c). Before the layers are bound: each layer's heads, head
 * size, FFN width, window and KV sharing, from the per-layer keys. */
quill_status quill_per_layer_shapes(quill_model *m, quill_error *err);
/* The per-layer inputs' model tensors, and layer l's (with the layer's binding). */
quill_status quill_per_layer_inputs_bind(quill_model *m, quill_error *err);
quill_status quill_per_layer_inputs_bind_layer(quill_model *m, int64_t l, quill_error *err);
/* At the end of arch_params: the two RoPE tables (global: rope.freq_base, its scaling and rope_freqs;
 * sliding: rope.freq_base_swa unscaled) and each layer's. */
quill_status quill_per_layer_rope(quill_model *m, quill_error *err);

/* Latent attention (mla.c). Before the layers: the ranks and heads' parts from the keys (the cache's head,
 * kv_lora_rank + the RoPE part, becomes hp.head_dim with one KV head); each layer's tensors; after
 * arch_params, the attention scale and RoPE magnitude (YaRN's mscale as the reference computes them). */
quill_status quill_mla_dims(quill_model *m, quill_error *err);
quill_status quill_mla_bind_layer(quill_model *m, int64_t l, quill_error *err);
quill_status quill_mla_params(quill_model *m, quill_error *err);
/* mtp_bound architectures (mtp.c): the MTP blocks' tensors checked and claimed; then every tensor of the
 * file must have been claimed. */
quill_status quill_mtp_check(quill_model *m, quill_error *err);
quill_status quill_model_all_claimed(const quill_model *m, quill_error *err);

/* The descriptor named by general.architecture, or NULL. */
const quill_arch *quill_arch_find(const char *name, size_t len);
/* The names quill runs, for messages: "llama, qwen2, ..." */
const char *quill_arch_list(void);

typedef struct {
    float *attn_norm, *ffn_norm;   /* [n_embd], dequantized at load (tiny) */
    float *attn_post_norm, *ffn_post_norm; /* [n_embd] or NULL */
    float *q_norm, *k_norm;        /* [head_dim] ([q_dim], [kv_dim] with qk_norm_full) or NULL */
    float *bq, *bk, *bv;           /* [q_dim], [kv_dim], [kv_dim] or NULL (each optional) */
    float *bo;                     /* [n_embd] or NULL */
    float *sinks;                  /* [n_head] or NULL */
    quill_weight wq, wk, wv, wo;
    quill_ffn_kind ffn;            /* the architecture's FFN block */
    const struct quill_ffn_impl *ffn_impl; /* its implementation (forward.h), set once the layers are bound */
    quill_weight w_gate, w_up, w_down; /* MoE: [n_expert] of [n_ff_exp][n_embd], [n_embd][n_ff_exp] */
    float *b_gate, *b_up, *b_down; /* the dense FFN's biases: [n_ff], [n_ff], [n_embd] or NULL (Granite) */
    quill_weight w_router;         /* MoE: ffn_gate_inp [n_expert][n_embd] */
    float *router_bias;            /* [n_expert] or NULL */
    float *gate_exps_bias, *up_exps_bias, *down_exps_bias; /* [n_expert][n_ff_exp], [n_expert][n_embd] or NULL */
    quill_weight w_gate_shexp, w_up_shexp, w_down_shexp; /* the shared expert, or data NULL */
    float *shexp_gate;             /* ffn_gate_inp_shexp [n_embd] or NULL */
    int rope_table;                /* which RoPE table: 0 global, 1 the sliding-window layers' */
    int64_t window;                /* keys within this many positions; 0: all */
    bool no_rope;                  /* q and k are not rotated (nope_interval) */
    int64_t n_head, n_head_kv, head_dim; /* its attention's shape: the model's, or its own (per_layer_shapes) */
    int64_t n_ff;                  /* its dense FFN's width */
    bool kv_shared;                /* no K, V of its own: it attends over layer kv_source's cache (kv_sharing) */
    int kv_source;
    bool v_from_k;                 /* no attn_v: V is K's projection (v_norm) */
    float *out_scale;              /* [1]: multiplies the layer's output (layer_out_scale), or NULL */
    quill_weight ple_gate, ple_proj; /* per_layer_inputs: inp_gate [n_pl][n_embd], proj [n_embd][n_pl] */
    float *ple_norm;               /* per_layer_inputs: post_norm [n_embd] */
    size_t kv_offset;              /* where its KV cache starts: the KV widths (n_head_kv · head_dim) of the
                                    * layers before it that have one (context.h's quill_kv_at) */
    bool recurrent;                /* a Gated DeltaNet layer (deltanet.c), with mamba2 a Mamba-2 mixer (mamba.c), or a
                                    * short convolution (shortconv.c) instead of attention: no KV cache, a recurrent state */
    bool shortconv;                /* LFM2's gated short convolution (shortconv.c): ssm_in is its in_proj [b | c | x],
                                    * ssm_out its out_proj, ssm_conv its taps [n_embd][l_cache] */
    bool attn_gated;               /* attn_q holds each head's query, then its output gate */
    quill_weight ssm_in, ssm_gate, ssm_beta, ssm_alpha, ssm_out; /* attn_qkv, attn_gate, ssm_beta, ssm_alpha, ssm_out */
    float *ssm_conv;               /* [conv channels][kernel] */
    float *ssm_dt, *ssm_a;         /* [value heads] */
    float *ssm_norm;               /* [state size] */
    float *probs_bias;             /* exp_probs_b [n_expert]: the experts' selection bias, or NULL */
    /* Mamba-2 (mamba.c): ssm_in is [z | xBC | dt], ssm_conv [conv channels][kernel], ssm_dt the dt bias and
     * ssm_a (stored as -exp(A_log)) [heads], ssm_norm [d_inner] (one weight per group's slice) */
    float *ssm_d;                  /* [heads] the skip's D */
    float *ssm_conv_b;             /* [conv channels] or NULL */
    bool ffn_only;                 /* single_block: the layer is its FFN alone (no attention, no mixer) */
    bool no_ffn;                   /* single_block: the layer has no FFN (a mixer or attention alone) */
    /* latent attention (mla.c): wq is attn_q or attn_q_b (after attn_q_a: q_a, normed by q_a_norm), wk is
     * attn_kv_a_mqa; k_b [n_head] of [kv_lora_rank][qk_nope], v_b [n_head] of [v_head][kv_lora_rank] (3-D,
     * one matrix a head); k_b_owned: k_b made at load from the older files' attn_kv_b, or NULL */
    bool mla;
    quill_weight q_a, k_b, v_b;
    float *q_a_norm, *kv_a_norm;
    float *k_b_owned;
} quill_layer;

/* What the architecture adds to quill_hparams. */
typedef struct {
    double attn_scale;             /* multiplies q·k */
    float embd_scale;              /* 0: none */
    float residual_scale;          /* multiplies each branch before the residual add (0: none) */
    float logit_multiplier;        /* multiplies the logits (0: none) */
    float attn_softcap, final_softcap; /* 0: none */
    double rope_base_local;        /* RoPE base of table 1 */
    double rope_scale_local;
    int n_rope_tables;
    float *rope_factors;           /* [n_rot/2] frequency divisors of table 0, or NULL */
    float *rope_factors_long;      /* [n_rot/2] the divisors beyond n_ctx_orig (Phi-3), or NULL */
    int64_t n_ctx_orig;            /* the context the model was trained for before RoPE scaling */
    double rope_attn_factor;       /* rope.scaling.attn_factor (and YaRN's magnitude correction): multiplies
                                    * the rotated q and k (1: none) */
    double rope_attn_factor_local; /* the same for table 1 */
    bool rope_yarn;                /* rope.scaling.type yarn: each frequency between the scaled and the
                                    * unscaled one by YaRN's ramp (beta_fast 32, beta_slow 1) */
    double yarn_beta_fast, yarn_beta_slow; /* the ramp's ends (32 and 1 unless the file says) */
    float attn_temp_scale;         /* queries at position p scaled by 1 + s·ln(floor(p / n_ctx_orig) + 1) (0: none) */
    int64_t n_expert, n_expert_used; /* MoE: expert_count, expert_used_count (0: dense) */
    int64_t n_ff_exp;              /* MoE: rows of one expert's gate and up */
    int64_t n_ff_shexp;            /* MoE with a shared expert: its width (0: none) */
    /* hybrid architectures (deltanet.c): the DeltaNet layers' sizes, from the ssm.* keys */
    int64_t ssm_kernel, ssm_state, ssm_k_heads, ssm_v_heads, ssm_conv_dim;
    /* Mamba-2 (mamba.c): d_inner (heads x head size); ssm_v_heads are its heads, ssm_k_heads its groups */
    int64_t ssm_inner;
    int64_t n_layer_mtp;           /* nextn_predict_layers: MTP blocks after the main stack, loaded, not run */
    int64_t kv_width;              /* Σ n_head_kv · head_dim over the layers with a KV cache (all but the
                                    * DeltaNet layers): one position's keys (or values) of one sequence */
    int64_t widest_q, widest_kv, widest_group, widest_ff; /* the largest n_head · head_dim, n_head_kv ·
                                    * head_dim, n_head / n_head_kv and n_ff of a layer, for the buffers */
    int64_t n_rot_local;           /* the rotated dims of table 1 (n_rot but with rope.dimension_count_swa) */
    int64_t n_embd_per_layer;      /* per_layer_inputs: each layer's slice (0: none) */
    int rope_sections[4];          /* rope.dimension_sections (rope_sections architectures) */
    /* the router (router_keys architectures; else the descriptor's gating and norm_expert_weights) */
    quill_gating gating;
    bool norm_w;                   /* the chosen weights divided by their sum (floored) */
    float w_scale;                 /* then multiplied by this (0 or 1: not) */
    int64_t n_group, n_group_used; /* experts in n_group groups, chosen from the n_group_used best (0: none) */
    int64_t n_dense_lead;          /* leading layers with a dense FFN */
    /* latent attention (mla.c): the ranks, each head's parts, and the floats per token of its scratch */
    int64_t q_lora, kv_lora, qk_nope, qk_rope, v_head, mla_floats;
} quill_arch_params;

struct quill_model {
    quill_gguf *gguf;
    quill_tokenizer *tokenizer;
    quill_hparams hp;
    const quill_arch *arch;
    quill_arch_params ap;
    quill_weight token_embd, output;   /* output aliases token_embd when tied */
    float *output_norm;
    /* per_layer_inputs: per_layer_token_embd [n_vocab][n_layer · n_pl], per_layer_model_proj
     * [n_layer · n_pl][n_embd], per_layer_proj_norm [n_pl] */
    quill_weight ple_embd, ple_model_proj;
    float *ple_proj_norm;
    quill_layer *layers;
    /* the weights in a kernel set's load-time layout (pack.c): its name, and the memory */
    const char *packed_layout;
    void *packed_mem;
    size_t packed_size;
    /* the expert tensors' copies, made by a thread of their own after the first context's creation
     * (pack.c): its state, and the experts' ready flags */
    struct quill_expert_packer *expert_packer;
    uint8_t *expert_ready;
    /* [n_tensors]: set for each tensor the loader has bound or checked (mtp_bound architectures: one
     * left unclaimed is an error, as a missing one is), or NULL */
    uint8_t *claimed;
};

#endif
