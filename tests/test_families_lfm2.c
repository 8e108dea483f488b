/* Liquid LFM2 (issue 48) against the reference implementation: lfm2 (gated short convolutions beside
 * attention layers with q/k norms, the final norm token_embd_norm) and lfm2moe (the same layers, leading
 * dense FFNs, then a sigmoid router with a selection bias). Each a small random-weight model from
 * `quill synth --arch`, quantized to Q8_0 and Q4_K_M by the reference's quantizer, golden data made on the
 * spot by its refdump: F32 logits, the quantized files' distance from float64 truth, greedy tokens, the
 * trace by the reference's names and quill verify; the convolution's state in sequences (one batch,
 * token by token, beside another sequence, truncated and copied); bad files refused by name. */
#include "family_harness.h"
#include "golden.h"
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    const char *synth; /* quill synth arguments besides --vocab, --type and -o */
} lfm2_case;

#define SHAPE "--embd 256 --heads 4 --kv-heads 2 --ff 512 --seed 11"
static const lfm2_case cases[] = {
    /* conv, conv, attention, conv: a conv layer after the attention one too */
    {"lfm2", "--arch lfm2 --layers 4 " SHAPE},
    /* a dense layer, then routed ones (conv, attention, conv) */
    {"lfm2moe", "--arch lfm2moe --layers 4 --dense-lead 1 --experts 16 --experts-used 4 --expert-ff 64 " SHAPE},
};
#define N_CASES (sizeof cases / sizeof cases[0])
#define KIND "lfm2"

/* F32: logits, greedy tokens, the trace (the projections and attention's output of layer 2, the output of
 * the conv layer after it, the final norm among its tensors), verify. */
static void check_f32(const lfm2_case *fc) {
    family_f32_rules rules = {.trace_names = {"Qcur-2", "kqv_out-2", "l_out-3", "result_norm"}, .trace_min = 10};
    family_check_f32(KIND, fc->name, &rules);
}

TEST(families_lfm2_match_the_reference) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_CASES; i++) {
        if (!family_make(shared, KIND, cases[i].name, cases[i].synth, true)) continue;
        check_f32(&cases[i]);
        family_check_quantized(KIND, cases[i].name, 1, false, false);
        family_check_quantized(KIND, cases[i].name, 2, false, false);
        family_remove(KIND, cases[i].name);
    }
}

/* Logits of `n` tokens evaluated one at a time from the sequence's end. */
static quill_status step_tokens(quill_context *c, int seq, const int32_t *tokens, int n, float *logits, int64_t nv,
                                quill_error *err) {
    for (int i = 0; i < n; i++) {
        int32_t pos = quill_seq_len(c, seq);
        quill_batch b = {1, &tokens[i], &seq, &pos, NULL};
        quill_status st = quill_decode(c, &b, logits + (size_t)i * nv, err);
        if (st) return st;
    }
    return QUILL_OK;
}

/* The convolution's window in sequences: each token's logits the same bits in one batch, token by token
 * on one thread and beside another sequence; after truncating (to a checkpoint's position and before
 * any) and copying a prefix to another sequence, the same tokens again give the same bits. */
TEST(families_lfm2_state_in_sequences) {
    REQUIRE_SHARED(shared);
    char model[512], cmd[2048], *out = NULL;
    snprintf(model, sizeof model, "%s/lfm2-seq.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd, "%s synth --arch lfm2 --layers 4 " SHAPE " --vocab %s/models/stories260K.gguf --type f16 -o %s",
             quill_bin(), shared, model);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    free(out);
    if (rc) return;
    float *one = family_logits_by(model, 0), *single = family_logits_by(model, 1), *beside = family_logits_by(model, 2);
    if (one && single && beside) {
        const size_t n = (size_t)FAMILY_N_PROMPT * 512 * sizeof(float);
        CHECK(!memcmp(one, single, n), "one batch on 2 threads and token by token on 1 differ");
        CHECK(!memcmp(one, beside, n), "sharing batches with another sequence changes the logits");
    }
    free(one), free(single), free(beside);

    quill_model *m = NULL;
    quill_context *c = NULL;
    quill_error err;
    quill_context_params p = {.n_ctx = 64, .n_threads = 2, .n_seq = 2};
    quill_status st = quill_model_load(model, &m, &err);
    if (!st) st = quill_context_new(m, &p, &c, &err);
    const int64_t nv = m ? quill_model_hparams(m)->n_vocab : 0;
    int32_t gen[12];
    for (int i = 0; i < 12; i++) gen[i] = (int32_t)(i * 29 % 400 + 5);
    float *first = malloc(12 * (size_t)(nv + 1) * sizeof(float)), *again = malloc(12 * (size_t)(nv + 1) * sizeof(float));
    float *prompt_logits = malloc((size_t)FAMILY_N_PROMPT * (size_t)(nv + 1) * sizeof(float));
    bool after = false, copy = false, before = false;
    if (!st && (!first || !again || !prompt_logits)) st = QUILL_E_NOMEM;
    if (!st) st = quill_eval(c, family_prompt, FAMILY_N_PROMPT, prompt_logits, true, &err);
    if (!st) st = step_tokens(c, 0, gen, 12, first, nv, &err);
    if (!st) { /* back to the prompt's end + 5 (its checkpoint at the prompt's end) */
        quill_seq_truncate(c, 0, FAMILY_N_PROMPT + 5);
        after = quill_seq_len(c, 0) == FAMILY_N_PROMPT + 5;
        st = step_tokens(c, 0, gen + 5, 7, again, nv, &err);
        after &= !st && !memcmp(again, first + 5 * (size_t)nv, 7 * (size_t)nv * sizeof(float));
    }
    if (!st) st = quill_seq_copy_prefix(c, 0, 1, FAMILY_N_PROMPT + 4, &err);
    if (!st) st = step_tokens(c, 1, gen + 4, 8, again, nv, &err);
    if (!st) copy = !memcmp(again, first + 4 * (size_t)nv, 8 * (size_t)nv * sizeof(float));
    if (!st) { /* back to 6, before every checkpoint: from the empty window */
        quill_seq_truncate(c, 0, 6);
        st = step_tokens(c, 0, family_prompt + 6, 10, again, nv, &err);
        before = !st && !memcmp(again, prompt_logits + 6 * (size_t)nv, 10 * (size_t)nv * sizeof(float));
    }
    CHECK(st == QUILL_OK, "%s", st == QUILL_E_NOMEM ? "out of memory" : err.message);
    CHECK(after, "truncating to the prompt's end + 5 changed the logits");
    CHECK(copy, "the copied prefix continues with other logits");
    CHECK(before, "truncating to 6, before any checkpoint, changed the logits");
    free(first), free(again), free(prompt_logits);
    quill_context_free(c);
    quill_model_free(m);
    remove(model);
}

/* What the reference requires, or what quill does not implement, is refused naming the key or tensor. */
TEST(families_lfm2_refuse_by_name) {
    REQUIRE_SHARED(shared);
    static const family_refusal refusals[] = {
        {"lfm2", "lfm2.shortconv.l_cache", NULL, NULL, 0, "lfm2.shortconv.l_cache is missing", false},
        {"lfm2", "lfm2.shortconv.l_cache", NULL, "lfm2.shortconv.l_cache", 1, "lfm2.shortconv.l_cache = 1", false},
        {"lfm2", NULL, "token_embd_norm.weight", NULL, 0, "'token_embd_norm.weight' is missing", false},
        {"lfm2", NULL, "blk.0.shortconv.in_proj.weight", NULL, 0, "'blk.0.shortconv.in_proj.weight' is missing", false},
        {"lfm2", NULL, "blk.2.attn_q_norm.weight", NULL, 0, "'blk.2.attn_q_norm.weight' is missing", false},
        /* one KV head count: every layer attends */
        {"lfm2", "lfm2.attention.head_count_kv", NULL, "lfm2.attention.head_count_kv", 1, "'blk.0.attn_q.weight' is missing", false},
        {"lfm2moe", "lfm2moe.leading_dense_block_count", NULL, NULL, 0, "'blk.0.ffn_gate_inp.weight' is missing", false},
        {"lfm2", NULL, NULL, "lfm2.attention.sliding_window", 64, "lfm2.attention.sliding_window = 64", false},
        {"lfm2moe", "lfm2moe.expert_gating_func", NULL, NULL, 0, "lfm2moe.expert_gating_func is missing", false},
        {"lfm2moe", NULL, "blk.1.exp_probs_b.bias", NULL, 0, "'blk.1.exp_probs_b.bias' is missing", false},
    };
    for (size_t i = 0; i < sizeof refusals / sizeof refusals[0]; i++)
        family_check_refusal(shared, "lfm2", &refusals[i], i, !strcmp(refusals[i].arch, "lfm2")
                                 ? "--layers 3 --embd 64 --heads 2 --kv-heads 1 --ff 64"
                                 : "--layers 3 --embd 64 --heads 2 --kv-heads 1 --ff 64 --experts 8 --experts-used 2 --expert-ff 32 --dense-lead 1");
}

/* The types of `ours` and `theirs`, tensor by tensor: how many differ (the first few recorded). */
static int mix_differences(const char *label, const char *ours, const char *theirs) {
    quill_gguf *a = NULL, *b = NULL;
    quill_error err;
    int differ = 0;
    if (quill_gguf_open(ours, &a, &err) != QUILL_OK || quill_gguf_open(theirs, &b, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "%s: %s", label, err.message);
        differ = -1;
    }
    for (uint64_t k = 0; differ >= 0 && k < quill_gguf_n_tensors(b); k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(b, k), *u = quill_gguf_find_tensor(a, t->name);
        if ((!u || u->type != t->type) && differ++ < 3)
            test_fail(__FILE__, __LINE__, "%s: %s is %s in quill's file, %s in the reference's", label, t->name,
                  u ? quill_type_name(u->type) : "missing", quill_type_name(t->type));
    }
    if (differ >= 0 && quill_gguf_n_tensors(a) != quill_gguf_n_tensors(b)) differ++;
    quill_gguf_close(a);
    quill_gguf_close(b);
    return differ;
}

/* quill quantize's Q4_0 and Q4_K_M mixes the reference's, tensor by tensor (the convolution's taps kept
 * in f32, the attention layers' attn_v counted as the reference counts them); on quill's Q4_0 file, quill
 * at least 2x closer to float64 than the reference implementation. */
TEST(families_lfm2_quantize_mixes) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < N_CASES; i++) {
        char f16[512], ours[512], theirs[512], prefix[512], tokens[256], cmd[4096], *out = NULL;
        snprintf(f16, sizeof f16, "%s/lfm2-mix-%zu.gguf", tmp_dir(), i);
        snprintf(ours, sizeof ours, "%s/lfm2-mix-%zu-quill.gguf", tmp_dir(), i);
        snprintf(theirs, sizeof theirs, "%s/lfm2-mix-%zu-ref.gguf", tmp_dir(), i);
        snprintf(prefix, sizeof prefix, "%s/lfm2-mix-%zu.ref", tmp_dir(), i);
        family_tokens_arg(tokens, sizeof tokens);
        snprintf(cmd, sizeof cmd,
                 "(export OMP_WAIT_POLICY=PASSIVE; %s synth %s --vocab %s/models/stories260K.gguf -o %s && "
                 "%s quantize --force %s %s q4_k_m && %s/ref/bin/llama-quantize %s %s Q4_K_M)",
                 quill_bin(), cases[i].synth, shared, f16, quill_bin(), f16, ours, shared, f16, theirs);
        int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "%s: exit %d: %.2000s", cases[i].name, rc, out);
        free(out);
        if (rc) continue;
        CHECK(mix_differences(cases[i].name, ours, theirs) == 0, "%s: q4_k_m mixes differ", cases[i].name);
        snprintf(cmd, sizeof cmd,
                 "(export OMP_WAIT_POLICY=PASSIVE; %s quantize --force %s %s q4_0 && %s/ref/bin/llama-quantize %s %s Q4_0"
                 " && %s/ref/bin/refdump %s %s 0 - - 0 --tokens %s)",
                 quill_bin(), f16, ours, shared, f16, theirs, shared, ours, prefix, tokens);
        rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "%s: exit %d: %.2000s", cases[i].name, rc, out);
        free(out);
        if (!rc) CHECK(mix_differences(cases[i].name, ours, theirs) == 0, "%s: q4_0 mixes differ", cases[i].name);
        refdump_out r;
        if (!rc && family_load_ref(prefix, &r)) {
            const size_t n = (size_t)FAMILY_N_PROMPT * (size_t)r.n_vocab;
            float *fast = family_run_model(ours, false, NULL, 0, NULL, NULL);
            float *exact = fast ? family_run_model(ours, true, NULL, 0, NULL, NULL) : NULL;
            if (fast && exact) {
                const double mine = rms_rel_error(fast, exact, n), ref = rms_rel_error(r.logits, exact, n);
                printf("    %-8s q4_0 (quill's file): rms error vs float64: quill %.3g, reference impl %.3g (%.1fx)\n",
                       cases[i].name, mine, ref, ref / mine);
                CHECK(2 * mine <= ref, "%s q4_0: quill %.3g is not 2x closer to truth than the reference's %.3g",
                      cases[i].name, mine, ref);
            }
            free(fast), free(exact), free(r.logits);
        }
        char json[600], logits[600];
        snprintf(json, sizeof json, "%s.json", prefix);
        snprintf(logits, sizeof logits, "%s.logits.f32", prefix);
        remove(f16), remove(ours), remove(theirs), remove(json), remove(logits);
    }
}

/* quill serve runs lfm2moe: a prompt that extends a finished one reuses its state, the shorter prompt
 * again goes back through a checkpoint, and both answer as a fresh server does. */
TEST(families_lfm2_server_prefix_reuse_answers_as_fresh) {
    REQUIRE_SHARED(shared);
    char model[512], cmd[2048], *out = NULL;
    snprintf(model, sizeof model, "%s/lfm2-serve.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd, "%s synth %s --vocab %s/models/stories260K.gguf --type f16 -o %s", quill_bin(),
             cases[1].synth, shared, model);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    free(out);
    server_check_prefix_reuse("lfm2moe", model, "-np 2 -c 256 -t 2 -b 4", family_prompt, 10, FAMILY_N_PROMPT);
    remove(model);
}
