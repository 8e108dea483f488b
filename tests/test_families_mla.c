/* The families with latent attention and biased sigmoid routers (issue 48) against the reference
 * implementation: DeepSeek V2/V3 (deepseek2: Multi-head Latent Attention, leading dense layers, shared
 * experts, a sigmoid router with a selection bias, expert groups, scaled weights, YaRN, MTP blocks) and
 * GLM-4.5 (glm4moe). Each a small random-weight model from `quill synth --arch`, quantized to Q8_0 (and
 * Q4_K_M) by the reference's quantizer, golden data made on the spot by its refdump: F32 logits, the
 * quantized files' distance from float64 truth, greedy tokens, the trace by the reference's names and
 * quill verify; then bad files refused by name. */
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
    bool own_trace;    /* the reference's trace holds other tensors by the same names (older attn_kv_b files) */
} family_case;

#define SHAPE "--embd 256 --heads 4 --ff 512 --experts 16 --experts-used 4 --expert-ff 64 --seed 11"
static const family_case families[] = {
    /* DeepSeek V3's kind: low-rank q, 8 groups of 2 experts (4 kept), weights scaled by 2.5, a dense layer
     * first, one MTP block (one routed layer: with two, the 8-bit activations of both engines tip most
     * positions of the Q4_K_M file to other experts than float64 chooses somewhere) */
    {"deepseek3", "--arch deepseek2 --layers 2 --mtp 1 " SHAPE, true, false},
    /* YaRN (factor 40 from 4096 positions, mscale_all_dim 1): the scale and the rotation's magnitude */
    {"deepseek3-yarn", "--arch deepseek2 --layers 2 --yarn " SHAPE, false, false},
    /* DeepSeek V2 Lite's kind: attn_q, no groups, two dense layers */
    {"deepseek2-lite", "--arch deepseek2 --layers 4 --dense-lead 2 --mla 0,256,128,64,128 --groups 0,0 " SHAPE, true,
     false},
    /* the older files: attn_kv_b, the heads' own sizes in key_length / value_length */
    {"deepseek2-kvb", "--arch deepseek2 --layers 3 --kv-b --mla 0,256,128,64,128 --groups 0,0 " SHAPE, false, true},
    /* GLM-4.5: q, k, v biases, NeoX RoPE over half of each head, GQA, one MTP block */
    {"glm4moe", "--arch glm4moe --layers 3 --kv-heads 2 --mtp 1 " SHAPE, true, false},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

#define KIND "mla"
#define N_PROMPT FAMILY_N_PROMPT
static bool make_family(const char *shared, const family_case *fc) { return family_make(shared, KIND, fc->name, fc->synth, fc->q4); }
static void remove_family(const family_case *fc) { family_remove(KIND, fc->name); }

/* F32: logits, greedy tokens, trace (Qcur, kqv_out and l_out of layer 1 among them), verify. (The older
 * files' reference computes the heads' keys and values: its Qcur, Kcur, Vcur are other tensors than the
 * absorbed ones, so their trace is not compared; the logits and verify still hold.) */
static void check_f32(const family_case *fc) {
    family_f32_rules rules = {.trace_tol = fc->own_trace ? -1 : 0, .trace_names = {"Qcur-1", "kqv_out-1", "l_out-1"}};
    family_check_f32(KIND, fc->name, &rules);
}

TEST(families_mla_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const family_case *fc = &families[i];
        if (!make_family(shared, fc)) continue;
        check_f32(fc);
        family_check_quantized(KIND, fc->name, 1, true, false);
        if (fc->q4) family_check_quantized(KIND, fc->name, 2, true, false);
        remove_family(fc);
    }
}

/* What these families' reference requires, or a tensor nothing would read, is refused naming the key or
 * tensor. */
TEST(families_mla_refuse_by_name) {
    REQUIRE_SHARED(shared);
    static const family_refusal cases[] = {
        {"deepseek2", "deepseek2.attention.kv_lora_rank", NULL, NULL, 0, "deepseek2.attention.kv_lora_rank is missing", false},
        {"deepseek2", "deepseek2.expert_gating_func", NULL, "deepseek2.expert_gating_func", 3,
         "deepseek2.expert_gating_func = 3", false},
        {"deepseek2", "deepseek2.expert_group_count", NULL, "deepseek2.expert_group_count", 3,
         "deepseek2.expert_group_count = 3", false},
        {"deepseek2", NULL, "blk.1.attn_k_b.weight", NULL, 0, "'blk.1.attn_k_b.weight' is missing", false},
        {"deepseek2", NULL, "blk.0.ffn_up.weight", NULL, 0, "'blk.0.ffn_up.weight' is missing", false},
        {"deepseek2", NULL, "blk.2.nextn.eh_proj.weight", NULL, 0, "'blk.2.nextn.eh_proj.weight' is missing", false},
        /* without the key the MTP block's tensors are nobody's */
        {"deepseek2", "deepseek2.nextn_predict_layers", NULL, NULL, 0, "tensor 'blk.2.", false},
        {"deepseek2", "deepseek2.leading_dense_block_count", NULL, "deepseek2.leading_dense_block_count", 0,
         "tensor 'blk.0.ffn_gate_inp.weight' is missing", false},
        {"deepseek2", "deepseek2.attention.key_length", NULL, "deepseek2.attention.key_length", 40,
         "must be kv_lora_rank + rope.dimension_count", false},
        {"deepseek2", NULL, NULL, "deepseek2.attention.temperature_scale", 1, "deepseek2.attention.temperature_scale", false},
        {"glm4moe", NULL, "blk.1.exp_probs_b.bias", NULL, 0, "'blk.1.exp_probs_b.bias' is missing", false},
        {"glm4moe", NULL, "blk.2.ffn_up_shexp.weight", NULL, 0, "'blk.2.ffn_up_shexp.weight' is missing", false},
        {"glm4moe", "glm4moe.leading_dense_block_count", NULL, "glm4moe.leading_dense_block_count", 5,
         "glm4moe.leading_dense_block_count = 5 is more than", false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        family_check_refusal(shared, "mla", &cases[i], i, "--layers 2 --embd 64 --heads 2 --kv-heads 1 --ff 64 --experts 8 --experts-used 2 --expert-ff 32 --groups 4,2 --mtp 1");
}

/* The latent cache and the routers: each token's logits the same bits in one batch, token by token on
 * one thread, and beside another sequence; and quill quantize's Q4_K_M mix the reference's, tensor by
 * tensor (the older attn_kv_b counted as attn_v, the 3-D attn_k_b falling back as the reference's). */
TEST(families_mla_batches_and_mixes) {
    REQUIRE_SHARED(shared);
    static const char *const cases[] = {"--arch deepseek2 --layers 2 --mtp 1 --kv-heads 1",
                                        "--arch deepseek2 --layers 3 --kv-b --mla 0,256,128,64,128 --groups 0,0",
                                        "--arch glm4moe --layers 3 --kv-heads 2 --mtp 1"};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char f32[512], ours[512], theirs[512], cmd[4096], *out = NULL;
        snprintf(f32, sizeof f32, "%s/mla-mix-%zu.gguf", tmp_dir(), i);
        snprintf(ours, sizeof ours, "%s/mla-mix-%zu-quill.gguf", tmp_dir(), i);
        snprintf(theirs, sizeof theirs, "%s/mla-mix-%zu-ref.gguf", tmp_dir(), i);
        snprintf(cmd, sizeof cmd,
                 "%s synth %s " SHAPE " --vocab %s/models/stories260K.gguf --type f32 -o %s && %s quantize %s %s q4_k_m"
                 " && %s/ref/bin/llama-quantize %s %s Q4_K_M",
                 quill_bin(), cases[i], shared, f32, quill_bin(), f32, ours, shared, f32, theirs);
        const int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "%s: exit %d: %.2000s", cases[i], rc, out);
        free(out);
        if (rc) continue;
        quill_gguf *a = NULL, *b = NULL;
        quill_error err;
        CHECK(quill_gguf_open(ours, &a, &err) == QUILL_OK && quill_gguf_open(theirs, &b, &err) == QUILL_OK, "%s",
              err.message);
        int differ = 0;
        for (uint64_t k = 0; a && b && k < quill_gguf_n_tensors(b); k++) {
            const quill_gguf_tensor *t = quill_gguf_tensor_at(b, k), *u = quill_gguf_find_tensor(a, t->name);
            if (!u || u->type != t->type) {
                if (differ++ < 3)
                    CHECK(false, "%s: %s is %s in quill's q4_k_m, %s in the reference's", cases[i], t->name,
                          u ? quill_type_name(u->type) : "missing", quill_type_name(t->type));
            }
        }
        CHECK(a && b && quill_gguf_n_tensors(a) == quill_gguf_n_tensors(b), "%s: tensor counts differ", cases[i]);
        quill_gguf_close(a);
        quill_gguf_close(b);
        float *one = family_logits_by(ours, 0), *single = family_logits_by(ours, 1), *shared_b = family_logits_by(ours, 2);
        CHECK(one && single && shared_b);
        if (one && single && shared_b) {
            const size_t n = (size_t)N_PROMPT * 512 * sizeof(float);
            CHECK(!memcmp(one, single, n), "%s: one batch on 2 threads and token by token on 1 differ", cases[i]);
            CHECK(!memcmp(one, shared_b, n), "%s: sharing batches with another sequence changes the logits", cases[i]);
        }
        free(one), free(single), free(shared_b);
        remove(f32), remove(ours), remove(theirs);
    }
}
