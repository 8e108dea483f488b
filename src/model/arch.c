/* The architectures quill runs: one row each. A new dense decoder whose layer is Llama's with some
 * of these differences is one row here (and its tensor names in model.c if they are new). */
#include "model/model.h"

#include <string.h>

static const quill_arch archs[] = {
    /* Llama 1-3, TinyLlama, Mistral (dense), Mistral Nemo's head size, Llama 3's frequency factors;
     * with expert_count > 0 Mixtral: a softmax over the experts, the top k renormalised */
    {.name = "llama", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .rope_freqs = true,
     .ffn = QUILL_FFN_MOE, .experts_optional = true, .gating = QUILL_GATING_SOFTMAX, .norm_expert_weights = true},
    /* Qwen 2 / 2.5: biases on q, k, v */
    {.name = "qwen2", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qkv_bias = true},
    /* Qwen 3 (dense): RMS norm per head on q and k */
    {.name = "qwen3", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true},
    /* Qwen 3 MoE (Qwen3-30B-A3B, Qwen3-Coder): Qwen 3's attention; a softmax over all experts, the
     * top k renormalised */
    {.name = "qwen3moe", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true, .ffn = QUILL_FFN_MOE,
     .gating = QUILL_GATING_SOFTMAX, .norm_expert_weights = true, .expert_ff_key = true},
    /* Qwen 1.5 / 2 MoE: Qwen 2's attention; a softmax over all experts, the top k as they are (not
     * renormalised), plus a shared expert gated by sigmoid(ffn_gate_inp_shexp · h) */
    {.name = "qwen2moe", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .ffn = QUILL_FFN_MOE,
     .gating = QUILL_GATING_SOFTMAX, .expert_ff_key = true, .shared_expert = true},
    /* gpt-oss (openai-moe in the reference): biases on q, k, v and the output; a learned sink logit per
     * head; a window on every other layer (0, 2, ...); post_attention_norm is the FFN's input norm;
     * the top k router logits (with their bias), then a softmax over those k; the experts' biases
     * and the clamped SwiGLU with (up + 1) */
    {.name = "gpt-oss", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SWIGLU_OAI, .attn_out_bias = true,
     .attn_sinks = true, .swa_pattern = 2, .swa_required = true, .ffn_norm_post_attention = true,
     .ffn = QUILL_FFN_MOE, .gating = QUILL_GATING_TOP_K_SOFTMAX, .expert_biases = true, .expert_ff_key = true,
     .head_dim_is_rot = true},
    /* Gemma 2: every other layer (0, 2, ...) sees a sliding window, 4096 unless the file says; those
     * layers rotate as the others unless the file names rope.freq_base_swa */
    {.name = "gemma2", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_GELU_TANH, .post_norms = true, .embd_scale = true,
     .softcap = true, .gemma_query_scale = true, .swa_pattern = 2, .swa_default = 4096},
    /* Gemma 3: five sliding-window layers rotating with base 10000 (unscaled), then one global
     * layer; without attention.sliding_window every layer is global */
    {.name = "gemma3", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_GELU_TANH, .qk_norm = true, .post_norms = true,
     .embd_scale = true, .gemma_query_scale = true, .swa_pattern = 6, .swa_rope_base = 10000},
    /* Phi-3 / 3.5: fused qkv and gate+up; its sliding window is ignored, as the reference does */
    {.name = "phi3", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .fused_qkv = true, .fused_gate_up = true,
     .rope_long_short = true, .trace_q_scaled = true},
    /* Qwen 3.5 (dense): three Gated DeltaNet layers, then one full-attention layer whose queries
     * carry an output gate, with q/k norms and multi-section RoPE (recurrent.h, deltanet.c);
     * post_attention_norm is the FFN's input norm */
    {.name = "qwen35", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true, .hybrid = true,
     .rope_sections = true, .ffn_norm_post_attention = true},
    /* Qwen 3.5 / 3.6 MoE (Qwen3.6-35B-A3B): the same layers, a softmax router over the experts, the
     * top k renormalised, plus a shared expert gated by sigmoid(ffn_gate_inp_shexp · h) */
    {.name = "qwen35moe", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true, .hybrid = true,
     .rope_sections = true, .ffn_norm_post_attention = true, .ffn = QUILL_FFN_MOE, .gating = QUILL_GATING_SOFTMAX,
     .norm_expert_weights = true, .expert_ff_key = true, .shared_expert = true},
    /* Qwen3-Next: Qwen 3.5 MoE's layers with plain NeoX RoPE, value heads grouped by key head and
     * beta/alpha packed in ssm_ba */
    {.name = "qwen3next", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true, .hybrid = true,
     .ssm_grouped = true, .ffn_norm_post_attention = true, .ffn = QUILL_FFN_MOE, .gating = QUILL_GATING_SOFTMAX,
     .norm_expert_weights = true, .expert_ff_key = true, .shared_expert = true},
    /* SmolLM3: Llama with every fourth layer (3, 7, ...) unrotated */
    {.name = "smollm3", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .nope_interval = 4, .head_dim_is_rot = true},
    /* OLMo 2 / 3: no input norms, RMS norms over the whole q and k projections, post norms on both
     * branches, its own output matrix; with attention.sliding_window (OLMo 3) three sliding layers,
     * rotating unscaled, then a global one */
    {.name = "olmo2", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .no_input_norms = true, .qk_norm_full = true,
     .post_norms = true, .swa_pattern = 4, .swa_rope_plain = true, .output_required = true, .head_dim_is_rot = true},
    /* IBM Granite 3.x (dense): Llama with multipliers on the embeddings, the attention scores, each
     * residual branch and the logits; no RoPE when rope.scaling.finetuned is false */
    {.name = "granite", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .multipliers = true, .rope_freqs = true,
     .head_dim_is_rot = true},
    /* GLM-4 (0414): optional q, k, v biases, partial RoPE on adjacent pairs, fused gate+up, norms after
     * attention and FFN; its MTP blocks are not loaded; GLM-4V's multi-section RoPE is refused */
    {.name = "glm4", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .post_norms = true, .fused_gate_up = true,
     .mtp_skipped = true, .mrope_refused = true},
    /* EXAONE 4: no input norms, q/k norms per head, norms after attention and FFN; in the 64-layer
     * model (32B) three sliding layers (4096 unless the file says), rotating as the others, then an
     * unrotated global one; MTP blocks not loaded */
    {.name = "exaone4", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .no_input_norms = true, .qk_norm = true,
     .post_norms = true, .rope_freqs = true, .swa_pattern = 4, .swa_default = 4096, .swa_at_layers = 64,
     .swa_rope_global = true, .global_unroped = true, .mtp_skipped = true, .head_dim_is_rot = true},
    /* Seed-OSS: Llama's layer in NeoX RoPE with optional q, k, v biases; its FFN norm is named
     * post_attention_norm */
    {.name = "seed_oss", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .ffn_norm_post_attention = true,
     .head_dim_is_rot = true},
    /* Command R7B / Command A: LayerNorms, attention and FFN in parallel on one norm, three sliding
     * layers (attention.sliding_window required) rotating as usual, then an unrotated global one; the
     * logits multiplied by logit_scale; the output is token_embd */
    {.name = "cohere2", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .layer_norm = true, .parallel_block = true,
     .swa_pattern = 4, .swa_required = true, .swa_rope_global = true, .global_unroped = true, .logit_scale = true,
     .output_tied = true},
    /* Mistral Small 3.x / Ministral 3 / Magistral: Llama with YaRN's own betas and log multiplier, and
     * Llama 4's attention temperature over the original context */
    {.name = "mistral3", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .rope_freqs = true, .yarn_keys = true,
     .head_dim_is_rot = true},
    /* Gemma 4 (dense: E2B, E4B, 31B; per_layer.c): per-layer head counts, head sizes and FFN widths, sliding
     * layers named one by one (rotating with base 10000 unscaled), the last layers reading an earlier layer's
     * KV cache, V normed without a weight (K's projection when attn_v is absent), per-layer inputs, a
     * per-layer output scale, proportional RoPE on the global layers, unscaled q·k, final soft-capping */
    {.name = "gemma4", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_GELU_TANH, .qk_norm = true, .post_norms = true,
     .embd_scale = true, .swa_rope_base = 10000, .per_layer_shapes = true, .kv_sharing = true, .v_norm = true,
     .per_layer_inputs = true, .layer_out_scale = true, .unit_attn_scale = true, .final_softcap = true,
     .rope_freqs_global = true, .trace_projections = true},
    /* DeepSeek V2 / V3 / R1, Kimi K2, Moonlight (mla.c): latent attention, adjacent RoPE on its decoupled part;
     * leading dense layers, then a router (softmax unless expert_gating_func says sigmoid) whose selection bias
     * chooses but does not weight, experts chosen within the best groups, weights normalised (floored) and
     * scaled, shared experts ungated; MTP blocks checked, not run */
    {.name = "deepseek2", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .ffn = QUILL_FFN_MOE,
     .gating = QUILL_GATING_SOFTMAX, .expert_ff_key = true, .mla = true, .router_keys = true, .probs_bias = 1,
     .mtp_bound = true},
    /* GLM-4.5 / 4.5-Air / 4.6: NeoX RoPE over part of the head, optional q, k, v biases and q/k norms,
     * post_attention_norm as the FFN's norm; leading dense layers, then a sigmoid router with a required
     * selection bias and a shared expert; MTP blocks checked, not run */
    {.name = "glm4moe", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .ffn = QUILL_FFN_MOE,
     .gating = QUILL_GATING_SIGMOID, .expert_ff_key = true, .router_keys = true, .probs_bias = 2,
     .qk_norm_optional = true, .ffn_norm_post_attention = true, .mtp_bound = true},
    /* NVIDIA Nemotron-H / Nemotron Nano 2 (mamba.c): each layer one block after its norm, a Mamba-2 mixer,
     * attention without RoPE, or an FFN of relu(up)² without a gate, as the per-layer head_count_kv and
     * feed_forward_length say */
    {.name = "nemotron_h", .act = QUILL_ACT_RELU2, .mamba2 = true, .single_block = true, .unroped = true},
    /* NVIDIA Nemotron 3 Nano (30B-A3B): Nemotron-H's layers with its FFN layers' experts: a sigmoid router whose
     * exp_probs_b chooses but does not weight, weights normalised and scaled as the file says, experts and a
     * shared expert of relu(up)² without a gate */
    {.name = "nemotron_h_moe", .act = QUILL_ACT_RELU2, .mamba2 = true, .single_block = true, .unroped = true,
     .ffn = QUILL_FFN_MOE, .gating = QUILL_GATING_SIGMOID, .expert_ff_key = true, .router_keys = true,
     .probs_bias = 2},
    /* IBM Granite 4.0-H (Micro, Tiny, Small; mamba.c): Granite's multipliers (logit_scale optional), Mamba-2
     * mixers where the per-layer head_count_kv is 0, attention elsewhere, each layer with its FFN; with
     * expert_count > 0 a softmax router over feed_forward_length-wide experts, the top k renormalised, plus an
     * ungated shared expert when expert_shared_feed_forward_length says */
    {.name = "granitehybrid", .rope = QUILL_ROPE_ADJACENT, .act = QUILL_ACT_SILU, .multipliers = true, .rope_freqs = true,
     .head_dim_is_rot = true, .mamba2 = true, .ffn = QUILL_FFN_MOE, .experts_optional = true,
     .gating = QUILL_GATING_SOFTMAX, .norm_expert_weights = true},
    /* Liquid LFM2 (350M-2.6B; shortconv.c): gated short convolutions where attention.head_count_kv is 0, else
     * attention with q/k norms per head in NeoX RoPE; the final norm is token_embd_norm */
    {.name = "lfm2", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true, .shortconv = true,
     .trace_projections = true},
    /* LFM2-8B-A1B: the same layers; after leading dense ones a router (sigmoid, expert_gating_func) whose
     * selection bias chooses but does not weight, the chosen weights normalised */
    {.name = "lfm2moe", .rope = QUILL_ROPE_NEOX, .act = QUILL_ACT_SILU, .qk_norm = true, .shortconv = true,
     .ffn = QUILL_FFN_MOE, .gating = QUILL_GATING_SIGMOID, .expert_ff_key = true, .router_keys = true, .probs_bias = 2,
     .router_norm_only = true, .trace_projections = true},
};

const quill_arch *quill_arch_find(const char *name, size_t len) {
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (strlen(archs[i].name) == len && !memcmp(archs[i].name, name, len)) return &archs[i];
    return NULL;
}

const char *quill_arch_list(void) {
    return "llama (Llama 2 and 3, TinyLlama, Mistral, Mixtral), qwen2, qwen2moe, qwen3, qwen3moe, gpt-oss, gemma2, gemma3, phi3, qwen35, qwen35moe, qwen3next, smollm3, olmo2, granite, glm4, exaone4, seed_oss, cohere2, mistral3, gemma4, deepseek2, glm4moe, nemotron_h, nemotron_h_moe, granitehybrid, lfm2 and lfm2moe; "
           "other families are not implemented";
}
