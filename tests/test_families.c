/* The long tail of dense families (issue 40) against the reference implementation, one row each:
 * a small random-weight model per family from `quill synth --arch`, quantized to Q8_0 (and
 * Q4_K_M for some) by the reference's quantizer, golden data made on the spot by its refdump.
 * One pass per family checks the F32 logits, the quantized files' distance from float64 truth,
 * the greedy tokens, the trace's names and values, and quill verify. */
#include "family_harness.h"
#include "golden.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    const char *synth; /* quill synth arguments besides --vocab, --type and -o */
    bool q4;           /* a Q4_K_M variant besides Q8_0 */
    /* The reference computes GELU through a table of f16 values (test_arch.c): its Gemma logits sit
     * ~1e-3 from exact math; quill's are compared with float64 truth, its traces within 1e-2. */
    bool gelu_table;
} family_case;

#define SHAPE "--embd 256 --heads 4 --kv-heads 2 --ff 512 --seed 11"
static const family_case families[] = {
    /* layers 3 and 7 unrotated */
    {"smollm3", "--arch smollm3 --layers 8 " SHAPE, true, false},
    /* OLMo 2 as published (every layer global), and OLMo 3's sliding layers (0-2, 4-6) */
    {"olmo2", "--arch olmo2 --layers 2 " SHAPE, false, false},
    {"olmo3", "--arch olmo2 --layers 8 --window 5 " SHAPE, true, false},
    /* the embedding, attention, residual and logit multipliers */
    {"granite", "--arch granite --layers 2 " SHAPE, false, false},
    /* biases, half of each head rotated, fused gate+up, post norms */
    {"glm4", "--arch glm4 --layers 2 " SHAPE, true, false},
    /* EXAONE 4.0 1.2B-like (no window), and 32B-like: 64 layers, 48 sliding and 16 unrotated global */
    {"exaone4", "--arch exaone4 --layers 2 " SHAPE, false, false},
    {"exaone4-swa", "--arch exaone4 --layers 64 --window 5 --embd 64 --heads 2 --kv-heads 1 --ff 128 --seed 11", true, false},
    {"seed_oss", "--arch seed_oss --layers 2 " SHAPE, true, false},
    /* layers 0-2 and 4 slide (window 5), 3 and 7 are global and unrotated */
    {"cohere2", "--arch cohere2 --layers 8 --window 5 " SHAPE, true, false},
    /* YaRN from 8 positions and the attention temperature past them; heads of 96 */
    {"mistral3", "--arch mistral3 --layers 2 --embd 288 --heads 4 --kv-heads 2 --ff 512 --seed 11", true, false},
    /* Gemma 4: layers 2, 5, 8 global (heads of 128, one KV head, V = K, rotated by a quarter), the others
     * sliding (window 5, heads of 64, two KV heads); 6 and 7 read layer 4's cache, 8 layer 5's, with
     * FFNs twice as wide; per-layer inputs of 32 */
    {"gemma4", "--arch gemma4 --layers 9 --swa-pattern 3 --shared-kv 3 --window 5 --per-layer-input 32 " SHAPE, true,
     true},
    /* ... and without per-layer inputs or shared layers, every other layer global */
    {"gemma4-plain", "--arch gemma4 --layers 6 --swa-pattern 2 --per-layer-input 0 --window 5 " SHAPE, false, true},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

#define KIND "family"
/* Under the sanitizers no q4_k_m file: the quantized forward's memory is checked with q8_0's, and
 * its numbers are the gcc run's to check (TEST_SANITIZED, tests/test.h). */
static bool with_q4(const family_case *fc) { return fc->q4 && !TEST_SANITIZED; }
static bool make_family(const char *shared, const family_case *fc) {
    return family_make(shared, KIND, fc->name, fc->synth, with_q4(fc));
}
static void remove_family(const family_case *fc) { family_remove(KIND, fc->name); }

/* F32: logits, greedy tokens, trace (Qcur and l_out of layer 1 among them), verify. */
static void check_f32(const family_case *fc) {
    /* a GELU by the reference's table rounds its logits: float64's are the measure */
    family_f32_rules rules = {.ref_rounds = fc->gelu_table, .float64_tol = fc->gelu_table ? 3e-3 : 0,
                              .trace_tol = fc->gelu_table ? 1e-2 : 0, .trace_names = {"Qcur-1", "l_out-1"}};
    family_check_f32(KIND, fc->name, &rules);
}

TEST(families_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const family_case *fc = &families[i];
        if (!make_family(shared, fc)) continue;
        check_f32(fc);
        family_check_quantized(KIND, fc->name, 1, false, false);
        if (with_q4(fc)) family_check_quantized(KIND, fc->name, 2, false, false);
        remove_family(fc);
    }
}

/* What a family's reference requires, or what quill does not run, is refused naming the key or
 * tensor. */
TEST(families_refuse_by_name) {
    REQUIRE_SHARED(shared);
    static const family_refusal cases[] = {
        {"olmo2", NULL, "output.weight", NULL, 0, "'output.weight' is missing", false},
        {"granite", "granite.logit_scale", NULL, NULL, 0, "granite.logit_scale is missing", false},
        {"granite", NULL, NULL, "granite.deepstack_mapping", 1, "granite.deepstack_mapping", false},
        {"cohere2", "cohere2.attention.layer_norm_epsilon", NULL, NULL, 0,
         "cohere2.attention.layer_norm_epsilon is missing", false},
        {"cohere2", "cohere2.attention.sliding_window", NULL, NULL, 0, "cohere2.attention.sliding_window", false},
        {"glm4", NULL, NULL, "glm4.rope.dimension_sections", 8, "glm4.rope.dimension_sections", true},
        {"smollm3", "smollm3.rope.dimension_count", NULL, "smollm3.rope.dimension_count", 16,
         "must be the head size", false},
        {"mistral3", NULL, NULL, "mistral3.expert_count", 8, "mistral3.expert_count", false},
        {"exaone4", NULL, "blk.0.attn_q_norm.weight", NULL, 0, "blk.0.attn_q_norm.weight", false},
        {"seed_oss", NULL, "blk.0.post_attention_norm.weight", NULL, 0, "blk.0.post_attention_norm.weight", false},
        /* gemma4 of 4 layers, 1 and 3 global, 2 and 3 reading layers 0's and 1's caches; with 3 shared
         * layers one is left with a cache, with 1 the global layer 3 would read the sliding layer 2's */
        {"gemma4", "gemma4.attention.sliding_window_pattern", NULL, NULL, 0,
         "gemma4.attention.sliding_window_pattern is missing", false},
        {"gemma4", "gemma4.attention.key_length_swa", NULL, NULL, 0, "gemma4.attention.key_length_swa is missing", false},
        {"gemma4", "gemma4.attention.sliding_window", NULL, NULL, 0, "gemma4.attention.sliding_window is missing", false},
        {"gemma4", "gemma4.embedding_length_per_layer_input", NULL, NULL, 0,
         "gemma4.embedding_length_per_layer_input is missing", false},
        {"gemma4", NULL, "rope_freqs.weight", NULL, 0, "'rope_freqs.weight' is missing", false},
        {"gemma4", NULL, "blk.0.attn_k.weight", NULL, 0, "'blk.0.attn_k.weight' is missing", false},
        {"gemma4", NULL, "per_layer_model_proj.weight", NULL, 0, "'per_layer_model_proj.weight' is missing", false},
        {"gemma4", NULL, NULL, "gemma4.expert_count", 8, "gemma4.expert_count", false},
        {"gemma4", "gemma4.attention.shared_kv_layers", NULL, "gemma4.attention.shared_kv_layers", 3,
         "leaves fewer than 2", false},
        {"gemma4", "gemma4.attention.shared_kv_layers", NULL, "gemma4.attention.shared_kv_layers", 1,
         "would read the cache of layer", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        family_check_refusal(shared, "family", &cases[i], i,
                             !strcmp(cases[i].arch, "cohere2")  ? "--layers 1 --embd 64 --heads 2 --kv-heads 1 --ff 64 --window 4"
                             : !strcmp(cases[i].arch, "gemma4") ? "--layers 1 --embd 64 --heads 2 --kv-heads 1 --ff 64 --layers 4 "
                                                                  "--swa-pattern 2 --shared-kv 2 --window 4"
                                                                : "--layers 1 --embd 64 --heads 2 --kv-heads 1 --ff 64");
}
