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
#define N_GEN FAMILY_N_GEN
#define prompt family_prompt
#define quants family_quants
#define tokens_arg family_tokens_arg
#define variant family_variant
#define rel_to_max family_rel_to_max
#define max_abs_diff family_max_abs_diff
#define load_ref family_load_ref
#define run_model family_run_model
typedef refdump_out ref_out;
static void model_path(const family_case *fc, int q, char *buf, size_t cap) { family_model_path(KIND, fc->name, q, buf, cap); }
static void ref_prefix(const family_case *fc, int q, char *buf, size_t cap) { family_ref_prefix(KIND, fc->name, q, buf, cap); }
static bool make_family(const char *shared, const family_case *fc) { return family_make(shared, KIND, fc->name, fc->synth, fc->q4); }
static void remove_family(const family_case *fc) { family_remove(KIND, fc->name); }

/* The trace by the reference's names, within 1e-4 of its values. */
static void check_trace(const family_case *fc, const char *model, const char *prefix, const char *tokens) {
    char trace[600], ref_trace[600], cmd[2048], *out = NULL;
    snprintf(trace, sizeof trace, "%s/mla-%s-f32.trace.gguf", tmp_dir(), fc->name);
    snprintf(ref_trace, sizeof ref_trace, "%s.trace.bin", prefix);
    snprintf(cmd, sizeof cmd, "%s run -m %s --tokens %s -n 0 -t 2 --trace %s", quill_bin(), model, tokens, trace);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "%s: exit %d: %s", fc->name, rc, out);
    free(out);
    quill_trace_diff *d;
    size_t nd;
    int64_t bad;
    quill_error err;
    if (quill_trace_compare(trace, ref_trace, 1e-4, &d, &nd, &bad, &err) != QUILL_OK) {
        CHECK(false, "%s", err.message);
        return;
    }
    double worst = 0;
    bool has_qcur = false, has_lout = false, has_kqv = false;
    for (size_t k = 0; k < nd; k++) {
        if (d[k].rel > worst) worst = d[k].rel;
        has_qcur |= !strcmp(d[k].name, "Qcur-1");
        has_kqv |= !strcmp(d[k].name, "kqv_out-1");
        has_lout |= !strcmp(d[k].name, "l_out-1");
    }
    printf("    %-14s trace: %zu tensors by the reference's names, worst rel %.3g\n", fc->name, nd, worst);
    CHECK(has_qcur && has_kqv && has_lout && nd >= 12, "%s: only %zu tensors in common with the reference's trace",
          fc->name, nd);
    CHECK(bad < 0, "%s: %s beyond tolerance (rel %.3g)", fc->name, bad >= 0 ? d[bad].name : "", bad >= 0 ? d[bad].rel : 0);
    free(d);
}

/* F32: logits, greedy tokens, trace, verify. */
static void check_f32(const family_case *fc) {
    char model[512], prefix[512], tokens[256], cmd[2048], *out = NULL;
    model_path(fc, 0, model, sizeof model);
    ref_prefix(fc, 0, prefix, sizeof prefix);
    ref_out r;
    if (!load_ref(prefix, &r)) return;
    const size_t n = (size_t)N_PROMPT * (size_t)r.n_vocab;
    int agreed = 0;
    bool at_tie = false;
    float *exact = run_model(model, true, NULL, 0, NULL, NULL);
    float *fast = exact ? run_model(model, false, &r, 0, NULL, NULL) : NULL;
    const double tie = fast ? max_abs_diff(fast, r.logits, n) : 0;
    free(fast);
    fast = exact ? run_model(model, false, &r, tie, &agreed, &at_tie) : NULL;
    if (fast && exact) {
        const double vs_ref = rel_to_max(fast, r.logits, n), vs_exact = rel_to_max(fast, exact, n);
        const double ref_vs_exact = rel_to_max(r.logits, exact, n);
        printf("    %-14s f32: fast vs reference impl %.2g, fast vs float64 %.2g, reference impl vs float64 %.2g; "
               "%d of %d greedy tokens equal%s\n",
               fc->name, vs_ref, vs_exact, ref_vs_exact, agreed, r.n_greedy, agreed < r.n_greedy ? ", then a near-tie" : "");
        CHECK(vs_ref < 1e-5 || vs_exact < 1e-5,
              "%s: logits %.3g from the reference implementation's, %.3g from float64", fc->name, vs_ref, vs_exact);
        CHECK(ref_vs_exact < 1e-5, "%s: float64 path %.3g from the reference implementation",
              fc->name, ref_vs_exact);
        CHECK(agreed == r.n_greedy || at_tie, "%s: greedy token %d differs from the reference's (margin %.3g)",
              fc->name, agreed, r.margin[agreed]);
    }
    free(fast);
    free(exact);
    free(r.logits);

    tokens_arg(tokens, sizeof tokens);
    /* (the older files' reference computes the heads' keys and values: its Qcur, Kcur, Vcur are other
     * tensors than the absorbed ones; the logits above and verify below still hold) */
    if (!fc->own_trace) check_trace(fc, model, prefix, tokens);
    snprintf(cmd, sizeof cmd, "%s verify -m %s --tokens %s -t 2", quill_bin(), model, tokens);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0 && strstr(out, "ok: "), "%s: quill verify: exit %d: %s", fc->name, rc, out);
    free(out);
}

/* The median over the prompt's positions of each position's rms error relative to truth: the typical
 * position. A random router has near-ties, and where one engine's 8-bit activations (both quantize them
 * for quantized weights) tip a token to another expert than float64's, that position's error is the
 * other expert's output, whoever is more exact elsewhere. */
static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median_position_error(const float *a, const float *truth, int64_t n_vocab) {
    double e[N_PROMPT];
    for (int p = 0; p < N_PROMPT; p++)
        e[p] = rms_rel_error(a + (size_t)p * (size_t)n_vocab, truth + (size_t)p * (size_t)n_vocab, (size_t)n_vocab);
    qsort(e, N_PROMPT, sizeof e[0], by_value);
    return (e[N_PROMPT / 2 - 1] + e[N_PROMPT / 2]) / 2;
}

/* A quantized file: quill at least 2x closer to float64 truth on the same weights than the
 * reference implementation at the typical position. */
static void check_quantized(const family_case *fc, int quant) {
    char model[512], prefix[512];
    model_path(fc, quant, model, sizeof model);
    ref_prefix(fc, quant, prefix, sizeof prefix);
    ref_out r;
    if (!load_ref(prefix, &r)) return;
    const size_t n = (size_t)N_PROMPT * (size_t)r.n_vocab;
    float *fast = run_model(model, false, NULL, 0, NULL, NULL), *exact = run_model(model, true, NULL, 0, NULL, NULL);
    if (fast && exact) {
        const double ours = median_position_error(fast, exact, r.n_vocab);
        const double theirs = median_position_error(r.logits, exact, r.n_vocab);
        printf("    %-14s %s: error vs float64 at the median position: quill %.3g, reference impl %.3g (%.1fx); "
               "rms over all: %.3g, %.3g\n",
               fc->name, quants[quant], ours, theirs, theirs / ours, rms_rel_error(fast, exact, n),
               rms_rel_error(r.logits, exact, n));
        CHECK(2 * ours <= theirs, "%s %s: quill %.3g is not 2x closer to truth than the reference's %.3g", fc->name,
              quants[quant], ours, theirs);
    }
    free(fast);
    free(exact);
    free(r.logits);
}

TEST(families_mla_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_FAMILIES; i++) {
        const family_case *fc = &families[i];
        if (!make_family(shared, fc)) continue;
        check_f32(fc);
        check_quantized(fc, 1);
        if (fc->q4) check_quantized(fc, 2);
        remove_family(fc);
    }
}

/* What these families' reference requires, or a tensor nothing would read, is refused naming the key or
 * tensor. */
TEST(families_mla_refuse_by_name) {
    REQUIRE_SHARED(shared);
    static const struct {
        const char *arch, *drop_key, *drop_tensor, *add_key;
        uint32_t add_value;
        const char *message;
    } cases[] = {
        {"deepseek2", "deepseek2.attention.kv_lora_rank", NULL, NULL, 0, "deepseek2.attention.kv_lora_rank is missing"},
        {"deepseek2", "deepseek2.expert_gating_func", NULL, "deepseek2.expert_gating_func", 3,
         "deepseek2.expert_gating_func = 3"},
        {"deepseek2", "deepseek2.expert_group_count", NULL, "deepseek2.expert_group_count", 3,
         "deepseek2.expert_group_count = 3"},
        {"deepseek2", NULL, "blk.1.attn_k_b.weight", NULL, 0, "'blk.1.attn_k_b.weight' is missing"},
        {"deepseek2", NULL, "blk.0.ffn_up.weight", NULL, 0, "'blk.0.ffn_up.weight' is missing"},
        {"deepseek2", NULL, "blk.2.nextn.eh_proj.weight", NULL, 0, "'blk.2.nextn.eh_proj.weight' is missing"},
        /* without the key the MTP block's tensors are nobody's */
        {"deepseek2", "deepseek2.nextn_predict_layers", NULL, NULL, 0, "tensor 'blk.2."},
        {"deepseek2", "deepseek2.leading_dense_block_count", NULL, "deepseek2.leading_dense_block_count", 0,
         "tensor 'blk.0.ffn_gate_inp.weight' is missing"},
        {"deepseek2", "deepseek2.attention.key_length", NULL, "deepseek2.attention.key_length", 40,
         "must be kv_lora_rank + rope.dimension_count"},
        {"deepseek2", NULL, NULL, "deepseek2.attention.temperature_scale", 1, "deepseek2.attention.temperature_scale"},
        {"glm4moe", NULL, "blk.1.exp_probs_b.bias", NULL, 0, "'blk.1.exp_probs_b.bias' is missing"},
        {"glm4moe", NULL, "blk.2.ffn_up_shexp.weight", NULL, 0, "'blk.2.ffn_up_shexp.weight' is missing"},
        {"glm4moe", "glm4moe.leading_dense_block_count", NULL, "glm4moe.leading_dense_block_count", 5,
         "glm4moe.leading_dense_block_count = 5 is more than"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char src[512], dst[512], cmd[2048], *out = NULL;
        snprintf(src, sizeof src, "%s/refuse-mla-%s.gguf", tmp_dir(), cases[i].arch);
        snprintf(dst, sizeof dst, "%s/refuse-mla-%s-%zu.gguf", tmp_dir(), cases[i].arch, i);
        snprintf(cmd, sizeof cmd,
                 "%s synth --arch %s --layers 2 --embd 64 --heads 2 --kv-heads 1 --ff 64 --experts 8 --experts-used 2 "
                 "--expert-ff 32 --groups 4,2 --mtp 1 --vocab %s/models/stories260K.gguf --type f32 -o %s",
                 quill_bin(), cases[i].arch, shared, src);
        int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "%s: exit %d: %s", cases[i].arch, rc, out);
        free(out);
        quill_model *m = NULL;
        quill_error err;
        CHECK(quill_model_load(src, &m, &err) == QUILL_OK, "%s: the unchanged model fails: %s", cases[i].arch,
              err.message);
        quill_model_free(m);
        CHECK(variant(src, dst, cases[i].drop_key, cases[i].drop_tensor, cases[i].add_key, cases[i].add_value, false),
              "cannot write %s", dst);
        CHECK(quill_model_load(dst, &m, &err) != QUILL_OK, "%s: case %zu loads", cases[i].arch, i);
        CHECK_STR_CONTAINS(err.message, cases[i].message);
        remove(src);
        remove(dst);
    }
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
