/* The inference bars of issue 3 and 5, measured against ../shared/golden. */
#include "golden.h"
#include "gguf_build.h"
#include "test.h"

#include "kernels/kernels.h"
#include "model/context.h"
#include "quill_quantize.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Loads a model and makes a context for it; on failure the test fails and both are NULL. */
static bool open_model(const char *model_path, int n_ctx, int threads, bool reference, quill_model **m,
                       quill_context **c) {
    quill_error err;
    *c = NULL;
    if (quill_model_load(model_path, m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return false;
    }
    quill_context_params p = {.n_ctx = n_ctx, .n_threads = threads, .reference = reference};
    if (quill_context_new(*m, &p, c, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        quill_model_free(*m);
        *m = NULL;
        return false;
    }
    return true;
}

/* Evaluates `tokens` in chunks of `chunk` (0 = one batch); all logits. */
static float *eval_logits(const char *model_path, const int32_t *tokens, size_t n, int threads, int chunk,
                          bool reference) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (!open_model(model_path, 512, threads, reference, &m, &c)) return NULL;
    int64_t nv = quill_model_hparams(m)->n_vocab;
    float *logits = malloc(n * (size_t)nv * sizeof *logits);
    size_t step = chunk > 0 ? (size_t)chunk : n;
    for (size_t done = 0; done < n; done += step) {
        size_t k = n - done < step ? n - done : step;
        if (quill_eval(c, tokens + done, (int)k, logits + done * nv, true, &err)) {
            test_fail(__FILE__, __LINE__, "%s", err.message);
            free(logits);
            logits = NULL;
            break;
        }
    }
    quill_context_free(c);
    quill_model_free(m);
    return logits;
}

/* Default path vs float64 truth, and vs the reference implementation's own error. */
TEST(infer_golden_logits_accuracy) {
    REQUIRE_SHARED(shared);
    size_t n;
    char **names = golden_case_names(shared, &n);
    CHECK(n >= 20, "expected the golden cases, found %zu", n);
    for (size_t i = 0; i < n; i++) {
        golden_case gc;
        if (!golden_load(shared, names[i], &gc)) { golden_free(&gc); break; }
        size_t count = gc.n_prompt * (size_t)gc.n_vocab;
        float *ours = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 2, 0, false);
        if (!ours) { golden_free(&gc); break; }
        double ours_err = rms_rel_error(ours, gc.exact, count);
        double ref_err = rms_rel_error(gc.logits, gc.exact, count);
        double vs_golden = max_rel_error(ours, gc.logits, count);
        printf("    %-24s rms err vs exact: quill %.3g, reference impl %.3g (ratio %.3f); max vs golden %.3g\n",
               gc.name, ours_err, ref_err, ours_err / ref_err, vs_golden);
        bool ok = true;
        if (!strncmp(gc.name, "s260", 4)) {
            if (vs_golden > 1e-4) {
                test_fail(__FILE__, __LINE__, "%s: logits differ from golden by %.3g x max|logit| (> 1e-4)",
                          gc.name, vs_golden);
                ok = false;
            }
        } else if (strstr(gc.name, "-f32") || strstr(gc.name, "-f16")) {
            if (ours_err > 1e-5) {
                test_fail(__FILE__, __LINE__, "%s: rms error vs exact %.3g > 1e-5", gc.name, ours_err);
                ok = false;
            }
        } else if (ours_err > 0.5 * ref_err) {
            test_fail(__FILE__, __LINE__, "%s: rms error vs exact %.3g is not at most half the reference's %.3g",
                      gc.name, ours_err, ref_err);
            ok = false;
        }
        free(ours);
        golden_free(&gc);
        if (!ok) break;
    }
    golden_free_names(names);
}

TEST(infer_reference_path_matches_exact) {
    REQUIRE_SHARED(shared);
    size_t n;
    char **names = golden_case_names(shared, &n);
    for (size_t i = 0; i < n; i++) {
        golden_case gc;
        if (!golden_load(shared, names[i], &gc)) { golden_free(&gc); break; }
        /* Under the sanitizers the first 6 positions (a position's logits depend only on the
         * tokens up to it): the float64 path is the suite's slowest there, and each case's
         * every code path runs from the first token. */
        const size_t n_prompt = TEST_SANITIZED && gc.n_prompt > 6 ? 6 : gc.n_prompt;
        size_t count = n_prompt * (size_t)gc.n_vocab;
        float *ref = eval_logits(gc.model_path, gc.prompt_tokens, n_prompt, 1, 0, true);
        double e = ref ? max_rel_error(ref, gc.exact, count) : 1;
        free(ref);
        golden_free(&gc);
        CHECK(e <= 1e-6, "%s: --reference logits differ from exact by %.3g (max rel) > 1e-6", names[i], e);
    }
    golden_free_names(names);
}

TEST(infer_thread_and_batch_invariance) {
    REQUIRE_SHARED(shared);
    size_t n;
    char **names = golden_case_names(shared, &n);
    for (size_t i = 0; i < n; i++) {
        golden_case gc;
        if (!golden_load(shared, names[i], &gc)) { golden_free(&gc); break; }
        size_t bytes = gc.n_prompt * (size_t)gc.n_vocab * sizeof(float);
        float *one = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 1, 0, false);
        float *two = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 2, 0, false);
        float *tok = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 2, 1, false);
        float *chunks = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 2, 3, false);
        bool threads_ok = one && two && memcmp(one, two, bytes) == 0;
        bool tokens_ok = one && tok && memcmp(one, tok, bytes) == 0;
        bool chunks_ok = one && chunks && memcmp(one, chunks, bytes) == 0;
        free(one); free(two); free(tok); free(chunks);
        golden_free(&gc);
        CHECK(threads_ok, "%s: 1 and 2 threads give different logits", names[i]);
        CHECK(tokens_ok, "%s: token-by-token evaluation differs from one batch", names[i]);
        CHECK(chunks_ok, "%s: evaluation in chunks of 3 differs from one batch", names[i]);
    }
    golden_free_names(names);
}

/* Greedy continuation: whole length for the trained model. For random-weight quantized models the
 * reference's own logits are off by its 8-bit activations, so a golden token is only binding up to
 * the first step whose margin is within that error (4x the rms of golden - exact over the prompt,
 * at least 0.05): past it, the reference may have picked the token exact math would not. */
TEST(infer_greedy_continuations) {
    REQUIRE_SHARED(shared);
    size_t n;
    char **names = golden_case_names(shared, &n);
    for (size_t i = 0; i < n; i++) {
        golden_case gc;
        if (!golden_load(shared, names[i], &gc)) { golden_free(&gc); break; }
        quill_model *m;
        quill_context *c;
        quill_error err;
        CHECK(quill_model_load(gc.model_path, &m, &err) == QUILL_OK, "%s", err.message);
        quill_context_params p = {.n_ctx = 512, .n_threads = 2};
        CHECK(quill_context_new(m, &p, &c, &err) == QUILL_OK, "%s", err.message);
        const int64_t nv = gc.n_vocab;
        const bool trained = !strncmp(gc.name, "s260", 4);
        double se = 0;
        for (size_t k = 0; k < gc.n_prompt * (size_t)nv; k++) {
            double d = (double)gc.logits[k] - gc.exact[k];
            se += d * d;
        }
        double tie = 4 * sqrt(se / (double)(gc.n_prompt * (size_t)nv));
        if (tie < 0.05) tie = 0.05;
        size_t needed = gc.n_greedy;
        if (!trained)
            for (size_t k = 0; k < gc.n_greedy; k++)
                if (gc.greedy_margin[k] < tie) { needed = k; break; }
        float *logits = malloc((size_t)nv * sizeof *logits);
        quill_status s = quill_eval(c, gc.prompt_tokens, (int)gc.n_prompt, logits, false, &err);
        size_t matched = 0;
        for (size_t k = 0; s == QUILL_OK && k < needed; k++) {
            int32_t best = 0;
            for (int64_t v = 1; v < nv; v++)
                if (logits[v] > logits[best]) best = (int32_t)v;
            if (best != gc.greedy_tokens[k]) break;
            matched++;
            s = quill_eval(c, &best, 1, logits, false, &err);
        }
        free(logits);
        quill_context_free(c);
        quill_model_free(m);
        golden_free(&gc);
        CHECK(s == QUILL_OK, "%s: %s", names[i], err.message);
        CHECK(matched >= needed, "%s: greedy tokens match for %zu steps, need %zu", names[i], matched, needed);
        if (!trained) printf("    %-24s %zu greedy steps binding (near-tie threshold %.3f), all match\n", names[i], needed, tie);
    }
    golden_free_names(names);
}

static bool trace_case(const char *model, const int32_t *tokens, size_t n, const char *out) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(model, &m, &err)) return false;
    quill_context_params p = {.n_ctx = 512, .n_threads = 2};
    if (quill_context_new(m, &p, &c, &err)) { quill_model_free(m); return false; }
    quill_trace_recorder *r = quill_trace_recorder_new();
    quill_context_set_trace(c, quill_trace_record, r);
    bool ok = quill_eval(c, tokens, (int)n, NULL, false, &err) == QUILL_OK &&
              quill_trace_recorder_write(r, out, &err) == QUILL_OK;
    quill_trace_recorder_free(r);
    quill_context_free(c);
    quill_model_free(m);
    return ok;
}

/* The tolerance (error relative to each tensor's scale, max|a-b| / max|b|): the reference rounds
 * activations to 8 bits before quantized products, so on synth-k-q4_k_m its tensors drift from
 * exact math by 1 % in layer 0 to 4.3 % (ffn_out-3) in layer 3, and by < 1e-6 on the F32 model. A
 * real bug moves a tensor by its own magnitude (the attn_q fault below: rel ~ 1). 0.1 sits
 * between with a 2x margin on each side. */
#define TRACE_TOL 0.1

TEST(infer_trace_compare_and_fault_injection) {
    REQUIRE_SHARED(shared);
    const char *cases[] = {"s260-once", "synth-k-q4_k_m"};
    for (size_t i = 0; i < 2; i++) {
        golden_case gc;
        CHECK(golden_load(shared, cases[i], &gc), "cannot load %s", cases[i]);
        CHECK(gc.trace_path != NULL, "%s has no trace", cases[i]);
        char out[512];
        snprintf(out, sizeof out, "%s/%s.trace.gguf", tmp_dir(), cases[i]);
        CHECK(trace_case(gc.model_path, gc.prompt_tokens, gc.n_prompt, out), "tracing %s failed", cases[i]);
        quill_trace_diff *d;
        size_t nd;
        int64_t bad;
        quill_error err;
        CHECK(quill_trace_compare(out, gc.trace_path, TRACE_TOL, &d, &nd, &bad, &err) == QUILL_OK, "%s", err.message);
        double worst = 0;
        for (size_t k = 0; k < nd; k++) if (d[k].rel > worst) worst = d[k].rel;
        printf("    %-16s %zu tensors compared, worst rel %.3g\n", cases[i], nd, worst);
        CHECK(nd == 2 + 10 * (strncmp(cases[i], "s260", 4) ? 4 : 5), "only %zu tensors in common", nd);
        CHECK(bad < 0, "%s: %s beyond tolerance (rel %.3g)", cases[i], d[bad].name, d[bad].rel);
        free(d);

        char faulty[512];
        snprintf(faulty, sizeof faulty, "%s/%s.faulty.gguf", tmp_dir(), cases[i]);
        CHECK(gguf_copy_reversing_rows(gc.model_path, "blk.0.attn_q.weight", faulty), "cannot write %s", faulty);
        bool traced = trace_case(faulty, gc.prompt_tokens, gc.n_prompt, out);
        remove(faulty);
        CHECK(traced, "tracing with the fault failed");
        CHECK(quill_trace_compare(out, gc.trace_path, TRACE_TOL, &d, &nd, &bad, &err) == QUILL_OK, "%s", err.message);
        CHECK(bad >= 0, "%s: the injected attn_q fault went unnoticed", cases[i]);
        CHECK(!strcmp(d[bad].name, "Qcur-0"), "%s: first divergence named %s, expected Qcur-0", cases[i], d[bad].name);
        free(d);
        golden_free(&gc);
    }
}

/* The fast path against the float64 reference path, tensor by tensor, through the CLI. The fast
 * path's quantized products see activations as integer codes of at most 8 significant bits (bf16
 * precision for the large elements of a block, finer for the small ones), which moves this
 * model's tensors by up to ~6e-3 (ffn_out-3); 1e-2 is still 2-4x tighter than the reference
 * implementation's own distance from exact math (1-4 %), and a real bug moves a tensor by its own
 * size. */
TEST(infer_trace_fast_vs_reference_path) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-k-q4_k_m.gguf");
    char cmd[4096], *out = NULL, fast[256], ref[256];
    snprintf(fast, sizeof fast, "%s/fast.trace.gguf", tmp_dir());
    snprintf(ref, sizeof ref, "%s/ref.trace.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 0 --trace %s 2>&1 && %s run -m %s "
             "-p 'Once upon a time' -n 0 --reference --trace %s 2>&1 && %s compare %s %s --tol 1e-2",
             quill_bin(), model, fast, quill_bin(), model, ref, quill_bin(), fast, ref);
    int rc = run_cmd(cmd, &out, true);
    free(model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "all 50 tensors within tol 0.01");
    free(out);
}

TEST(infer_cli_stories_prints_golden_continuation) {
    REQUIRE_SHARED(shared);
    golden_case gc;
    CHECK(golden_load(shared, "s260-once", &gc), "cannot load s260-once");
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 64 --temp 0 2>/dev/null", quill_bin(),
             gc.model_path);
    int rc = run_cmd(cmd, &out, false);
    golden_free(&gc);
    CHECK(rc == 0, "exit %d", rc);
    CHECK_STR_CONTAINS(out, ", there was a little girl named Lily. She loved to play outside in the park. One day, "
                            "she saw a big, red ball. She wanted to play with it, but it was too high.\nLily's mom said");
    free(out);
}

TEST(infer_cli_json_and_logits_file) {
    REQUIRE_SHARED(shared);
    golden_case gc;
    CHECK(golden_load(shared, "s260-once", &gc), "cannot load s260-once");
    char cmd[1024], *out = NULL, logits[512];
    snprintf(logits, sizeof logits, "%s/once.logits.f32", tmp_dir());
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time' -n 8 --temp 0 --json --logits %s", quill_bin(),
             gc.model_path, logits);
    int rc = run_cmd(cmd, &out, false);
    CHECK(rc == 0, "exit %d", rc);
    CHECK_STR_CONTAINS(out, "\"prompt_tokens\": [1, 403, 407, 261, 378]");
    CHECK_STR_CONTAINS(out, "\"generated_tokens\": [432, 383, 286, 261, 376, 298, 315, 421]");
    CHECK_STR_CONTAINS(out, "\"text\": \", there was a little girl\"");
    free(out);
    size_t size;
    float *ours = read_file(logits, &size);
    CHECK(ours && size == gc.n_prompt * gc.n_vocab * sizeof(float), "logits file has %zu bytes", size);
    double e = max_rel_error(ours, gc.logits, gc.n_prompt * gc.n_vocab);
    free(ours);
    golden_free(&gc);
    CHECK(e < 1e-4, "logits file differs from golden by %.3g", e);
}

/* ---------------------------------------------------------------- linear RoPE scaling */

/* Copies `src` with extra metadata: `str_key` = `str_val` and/or `f32_key` = `f32_val` (NULL keys
 * are left out). */
static bool copy_with_meta(const char *src, const char *dst, const char *str_key, const char *str_val,
                           const char *f32_key, float f32_val) {
    quill_gguf *g = NULL;
    quill_gguf_writer *w = NULL;
    quill_error err = {0};
    bool ok = quill_gguf_open(src, &g, &err) == QUILL_OK && (w = gguf_copy_writer(g, NULL)) != NULL;
    if (ok && str_key) ok = quill_gguf_writer_add_str(w, str_key, str_val, strlen(str_val)) == QUILL_OK;
    if (ok && f32_key) ok = quill_gguf_writer_add_f32(w, f32_key, f32_val) == QUILL_OK;
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

typedef struct {
    float *q; /* the last token's rotated query of layer 0 */
    int64_t n;
} last_query;

static void keep_last_query(const char *name, const float *data, int n_dims, const int64_t *ne, void *user) {
    last_query *lq = user;
    if (strcmp(name, "Qcur-0") != 0) return;
    int64_t per = 1;
    for (int d = 0; d < n_dims - 1; d++) per *= ne[d];
    free(lq->q);
    lq->q = malloc((size_t)per * sizeof *lq->q);
    if (lq->q) memcpy(lq->q, data + (ne[n_dims - 1] - 1) * per, (size_t)per * sizeof *lq->q);
    lq->n = per;
}

/* Layer 0's rotated query of the last of `tokens` (one batch). */
static last_query query_of_last(const char *model_path, const int32_t *tokens, int n, bool reference) {
    last_query lq = {0};
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (!open_model(model_path, 64, 2, reference, &m, &c)) return lq;
    quill_context_set_trace(c, keep_last_query, &lq);
    if (quill_eval(c, tokens, n, NULL, false, &err)) test_fail(__FILE__, __LINE__, "%s", err.message);
    quill_context_free(c);
    quill_model_free(m);
    return lq;
}

/* Linear scaling multiplies positions by 1 / factor: with factor 0.5 a token at position 1 is
 * rotated as the unscaled model rotates it at position 2. Layer 0's query before RoPE depends on
 * its token alone, so the two rotated queries must be bitwise equal, on both paths; the older
 * rope.scale_linear key means the same, and any other scaling type is refused by name, as is a
 * mixture-of-experts file without its expert_used_count. */
TEST(infer_linear_rope_scaling_and_refusals) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    char *scaled = path_join(tmp_dir(), "rope-linear.gguf"), *legacy = path_join(tmp_dir(), "rope-legacy.gguf");
    char *yarn = path_join(tmp_dir(), "rope-yarn.gguf");
    CHECK(copy_with_meta(model, scaled, "llama.rope.scaling.type", "linear", "llama.rope.scaling.factor", 0.5f));
    CHECK(copy_with_meta(model, legacy, NULL, NULL, "llama.rope.scale_linear", 0.5f));
    CHECK(copy_with_meta(model, yarn, "llama.rope.scaling.type", "longrope", "llama.rope.scaling.factor", 4.0f));
    const int32_t two[] = {1, 403}, three[] = {1, 87, 403};
    for (int ref = 0; ref < 2; ref++) {
        last_query want = query_of_last(model, three, 3, ref), plain = query_of_last(model, two, 2, ref);
        last_query got = query_of_last(scaled, two, 2, ref), old = query_of_last(legacy, two, 2, ref);
        CHECK(want.q && plain.q && got.q && old.q && got.n == want.n && old.n == want.n && plain.n == want.n);
        CHECK(!memcmp(got.q, want.q, (size_t)want.n * sizeof *want.q),
              "%s path: scaled position 1 is not unscaled position 2", ref ? "reference" : "fast");
        CHECK(!memcmp(old.q, want.q, (size_t)want.n * sizeof *want.q), "rope.scale_linear is not applied");
        CHECK(memcmp(plain.q, want.q, (size_t)want.n * sizeof *want.q) != 0, "positions 1 and 2 rotate alike");
        free(want.q), free(plain.q), free(got.q), free(old.q);
    }
    quill_model *m = NULL;
    quill_error err = {0};
    CHECK(quill_model_load(yarn, &m, &err) == QUILL_E_UNSUPPORTED, "a longrope-scaled llama model loaded");
    CHECK_STR_CONTAINS(err.message, "unsupported RoPE scaling 'longrope'");
    /* a Mixtral-style file without expert_used_count names the key, as the reference refuses it */
    quill_gguf_writer *w = NULL;
    quill_gguf *g = NULL;
    CHECK(quill_gguf_open(model, &g, &err) == QUILL_OK && (w = gguf_copy_writer(g, NULL)) != NULL);
    CHECK(quill_gguf_writer_add_u32(w, "llama.expert_count", 8) == QUILL_OK);
    CHECK(quill_gguf_writer_write(w, yarn, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    CHECK(quill_model_load(yarn, &m, &err) == QUILL_E_FORMAT, "a mixture-of-experts model loaded");
    CHECK_STR_CONTAINS(err.message, "llama.expert_used_count is missing or 0");
    remove(scaled), remove(legacy), remove(yarn);
    free(model), free(scaled), free(legacy), free(yarn);
}

TEST(infer_errors_are_clear) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    quill_model *m;
    quill_context *c;
    quill_error err;
    CHECK(quill_model_load(model, &m, &err) == QUILL_OK, "%s", err.message);
    quill_context_params p = {.n_ctx = 8, .n_threads = 1};
    CHECK(quill_context_new(m, &p, &c, &err) == QUILL_OK, "%s", err.message);
    int32_t bad[2] = {1, 512};
    CHECK_EQ_INT(quill_eval(c, bad, 2, NULL, false, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "token id 512 at position 1");
    int32_t many[9] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    CHECK_EQ_INT(quill_eval(c, many, 9, NULL, false, &err), QUILL_E_CONTEXT);
    CHECK_STR_CONTAINS(err.message, "do not fit in the context");
    quill_context_free(c);
    quill_model_free(m);

    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s run -m %s -p 'Once upon a time there was' -c 4 -n 1", quill_bin(), model);
    CHECK(run_cmd(cmd, &out, true) == 1, "long prompt must fail");
    CHECK_STR_CONTAINS(out, "context holds 4");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s --tokens 1,99999 -n 1", quill_bin(), model);
    CHECK(run_cmd(cmd, &out, true) == 1, "bad token id must fail");
    CHECK_STR_CONTAINS(out, "token id 99999");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi --temp -1", quill_bin(), model);
    CHECK(run_cmd(cmd, &out, true) == 1, "bad flag value must fail");
    CHECK_STR_CONTAINS(out, "--temp");
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi --bogus", quill_bin(), model);
    CHECK(run_cmd(cmd, &out, true) == 1, "unknown flag must fail");
    CHECK_STR_CONTAINS(out, "unknown option '--bogus'");
    free(out);
    free(model);

    /* another architecture */
    char path[512];
    snprintf(path, sizeof path, "%s/mamba.gguf", tmp_dir());
    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_add_str(w, "general.architecture", "mamba", 5);
    CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);
    CHECK_EQ_INT(quill_model_load(path, &m, &err), QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "unsupported model architecture 'mamba'");
}

/* A context whose KV cache cannot be allocated fails with QUILL_E_NOMEM and a message naming its
 * size; the message used to be written after the context was freed (a use-after-free that ASan
 * catches here). The float64 cache of 2^24 positions of synth-k (34 GB per cache) is refused by the
 * kernel on a machine without that much memory; where overcommit grants it, the context works. */
TEST(infer_context_out_of_memory_is_an_error) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-k-f32.gguf");
    quill_model *m;
    quill_context *c = NULL;
    quill_error err;
    CHECK(quill_model_load(model, &m, &err) == QUILL_OK, "%s", err.message);
    free(model);
    quill_context_params p = {.n_ctx = 1 << 24, .n_threads = 1, .reference = true};
    quill_status st = quill_context_new(m, &p, &c, &err);
    if (st == QUILL_OK) {
        quill_context_free(c);
    } else {
        CHECK_EQ_INT(st, QUILL_E_NOMEM);
        CHECK(c == NULL);
        CHECK_STR_CONTAINS(err.message, "out of memory creating a context of 16777216 tokens");
        CHECK_STR_CONTAINS(err.message, "use a smaller context");
    }
    quill_model_free(m);
}

/* The kernel set a context for this model computes with, or NULL (and a failure). */
static const char *context_kernels(const char *model_path) {
    quill_model *m;
    quill_context *c;
    if (!open_model(model_path, 64, 1, false, &m, &c)) return NULL;
    const char *name = quill_context_kernels(c); /* a static name: outlives the context */
    quill_context_free(c);
    quill_model_free(m);
    return name;
}

/* Every kernel set the CPU has (the scalar one always) meets the accuracy bar and is thread- and
 * batch-invariant on its own: the run-time choice must not matter for correctness. A set the CPU
 * lacks is reported as skipped (test_kernel_choice.c checks that asking for it is an error). */
TEST(infer_every_instruction_set) {
    REQUIRE_SHARED(shared);
    const char *isas[] = {"scalar", "avx2", "avxvnni", "avx512", "vnni", "amx"};
    const char *cases[] = {"synth-k-q4_0", "synth-k-q4_k_m", "synth-k-f16"};
    const char *saved = getenv("QUILL_ISA");
    char *restore = saved ? strdup(saved) : NULL;
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        setenv("QUILL_ISA", isas[k], 1);
        /* a set this CPU lacks is noted, not a skip: the test ran on every set it has */
        if (!quill_kernels_for(isas[k])) {
            printf("    (this CPU does not offer the %s kernel set)\n", isas[k]);
            continue;
        }
        if (!test_sweeps_set(isas[k])) continue;
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            golden_case gc;
            if (!golden_load(shared, cases[i], &gc)) { golden_free(&gc); break; }
            const char *used = context_kernels(gc.model_path);
            if (!used || strcmp(used, isas[k]) != 0) {
                test_fail(__FILE__, __LINE__, "QUILL_ISA=%s: the context computes with %s", isas[k], used ? used : "(none)");
                golden_free(&gc);
                break;
            }
            size_t count = gc.n_prompt * (size_t)gc.n_vocab;
            float *one = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 1, 0, false);
            float *tok = eval_logits(gc.model_path, gc.prompt_tokens, gc.n_prompt, 2, 1, false);
            double err = one ? rms_rel_error(one, gc.exact, count) : 1, ref = rms_rel_error(gc.logits, gc.exact, count);
            bool same = one && tok && memcmp(one, tok, count * sizeof(float)) == 0;
            bool f16 = strstr(cases[i], "f16") != NULL;
            free(one);
            free(tok);
            golden_free(&gc);
            if (f16 ? err > 1e-5 : err > 0.5 * ref) {
                test_fail(__FILE__, __LINE__, "%s on %s: rms error %.3g (reference %.3g)", isas[k], cases[i], err, ref);
                break;
            }
            if (!same) {
                test_fail(__FILE__, __LINE__, "%s on %s: one batch on 1 thread differs from token by token on 2",
                          isas[k], cases[i]);
                break;
            }
        }
    }
    if (restore) setenv("QUILL_ISA", restore, 1);
    else unsetenv("QUILL_ISA");
    free(restore);
}

/* Sets (or with NULL clears) an environment variable, returning its old value to restore. */
static char *swap_env(const char *name, const char *value) {
    const char *old = getenv(name);
    char *saved = old ? strdup(old) : NULL;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
    return saved;
}

static void restore_env(const char *name, char *saved) {
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
    free(saved);
}

/* QUILL_ISA set to a kernel set whose load-time layout a test checks (the old value in *saved, for
 * restore_env), or a skip where this CPU lacks the set. */
static bool use_set(const char *set, char **saved) {
    if (!quill_kernels_for(set)) {
        char why[96];
        snprintf(why, sizeof why, "this CPU does not offer the %s kernel set, whose layout this checks", set);
        test_skip(why);
        return false;
    }
    *saved = swap_env("QUILL_ISA", set);
    return true;
}

/* A model whose packed copy is larger than its file (iq3_s: 4.25 bits a weight against 3.44) is
 * packed as far as the memory to use allows (QUILL_PACK_MEMORY, else MemAvailable), in list order
 * (the output first), the rest read from the file with a warning naming how many: the same logits
 * with every copy, with some and with none. */
static char pack_log[512];
static void keep_pack_log(quill_log_level level, const char *message, void *user) {
    (void)user;
    if (level == QUILL_LOG_WARN && strstr(message, "file's layout")) snprintf(pack_log, sizeof pack_log, "%s", message);
}

TEST(infer_pack_memory_budget) {
    REQUIRE_SHARED(shared);
    char *isa;
    if (!use_set("avx2", &isa)) return;
    char *in = path_join(shared, "models/synth-k-f32.gguf"), path[512];
    snprintf(path, sizeof path, "%s/pack-budget-iq3_s.gguf", tmp_dir());
    quill_quantize_params qp = {.n_threads = 2, .pure = true};
    quill_error err = {0};
    CHECK(quill_ftype_parse("iq3_s", &qp.ftype, &err) == QUILL_OK && quill_quantize_file(in, path, &qp, &err) == QUILL_OK,
          "iq3_s: %s", err.message);
    const int32_t toks[] = {1, 45, 96, 174, 17, 29, 43, 172};
    const size_t n = sizeof toks / sizeof toks[0];
    /* budgets: none given; 1K (no copy fits); the smallest that holds the output's copy (the
     * first in line), found by trying every 16 KiB up to twice the file's size */
    long file_kib = 0;
    FILE *f = fopen(path, "rb");
    if (f && fseek(f, 0, SEEK_END) == 0) file_kib = ftell(f) / 1024;
    if (f) fclose(f);
    float *logits[3] = {0};
    bool output_packed[3] = {0}, last_packed[3] = {0};
    char logs[3][512] = {{0}}, budget[32] = "";
    size_t count = 0;
    for (int b = 0; b < 3; b++) {
        for (long kib = file_kib; kib <= 2 * file_kib; kib += 16) {
            if (b == 1) snprintf(budget, sizeof budget, "1K");
            if (b == 2) snprintf(budget, sizeof budget, "%ldK", kib);
            char *saved = swap_env("QUILL_PACK_MEMORY", b == 0 ? NULL : budget);
            pack_log[0] = 0;
            quill_set_log(keep_pack_log, NULL);
            quill_model *m;
            quill_context *c;
            if (open_model(path, 64, 1, false, &m, &c)) {
                output_packed[b] = m->output.packed != NULL;
                last_packed[b] = m->layers[m->hp.n_layer - 1].w_down.packed != NULL;
                count = n * (size_t)m->hp.n_vocab;
                quill_context_free(c);
                quill_model_free(m);
            }
            quill_set_log(NULL, NULL);
            snprintf(logs[b], sizeof logs[b], "%s", pack_log);
            if (b < 2 || output_packed[b]) logits[b] = eval_logits(path, toks, n, 1, 0, false);
            restore_env("QUILL_PACK_MEMORY", saved);
            if (b < 2 || output_packed[b]) break;
        }
    }
    CHECK(output_packed[0] && last_packed[0] && !logs[0][0], "no budget given: every copy made (log: %s)", logs[0]);
    CHECK(!output_packed[1] && !last_packed[1] && strstr(logs[1], " of "), "1K: no copy made, a warning (log: %s)", logs[1]);
    CHECK(output_packed[2] && !last_packed[2] && strstr(logs[2], " of "),
          "%s: the output's copy first, the last layer's left (log: %s)", budget, logs[2]);
    for (int b = 1; b < 3; b++)
        CHECK(count && logits[0] && logits[b] && memcmp(logits[0], logits[b], count * sizeof(float)) == 0,
              "budget %d: not the logits of every copy", b);
    for (int b = 0; b < 3; b++) free(logits[b]);
    remove(path);
    free(in);
    restore_env("QUILL_ISA", isa);
}

/* Weights repacked at load (the vnni set's layout) give the bits of the file's layout: a prompt in
 * one batch on 1 thread and token by token on 2, for each packed type, and the packed copies are
 * really what the context reads. */
TEST(infer_packed_weights_same_bits) {
    REQUIRE_SHARED(shared);
    char *isa;
    if (!use_set("vnni", &isa)) return;
    const char *models[] = {"synth-k-q4_0", "synth-k-q8_0", "synth-k-q4_k_m", "synth-k-q5_k_m", "synth-k-q6_k", "synth-32k-q8_0"};
    const int32_t tokens[] = {1, 450, 4996, 17354, 1701, 29916, 432, 17204, 975, 278, 17366, 11203, 29889};
    const size_t n = sizeof tokens / sizeof tokens[0];
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        char file[128];
        snprintf(file, sizeof file, "models/%s.gguf", models[i]);
        char *path = path_join(shared, file);
        quill_model *m;
        quill_context *c;
        if (open_model(path, 64, 1, false, &m, &c)) {
            CHECK(c->packed && m->packed_layout && m->layers[0].w_up.packed, "%s: the weights were not packed", models[i]);
            quill_context_free(c);
            quill_model_free(m);
        }
        int32_t toks[sizeof tokens / sizeof tokens[0]];
        for (size_t t = 0; t < n; t++) toks[t] = tokens[t] % 256; /* within the smallest vocabulary */
        float *packed_one = eval_logits(path, toks, n, 1, 0, false), *packed_tok = eval_logits(path, toks, n, 2, 1, false);
        char *repack = swap_env("QUILL_REPACK", "0");
        float *file_one = eval_logits(path, toks, n, 1, 0, false), *file_tok = eval_logits(path, toks, n, 2, 1, false);
        restore_env("QUILL_REPACK", repack);
        quill_model *probe;
        quill_error err;
        size_t count = 0;
        if (quill_model_load(path, &probe, &err) == QUILL_OK) {
            count = n * (size_t)quill_model_hparams(probe)->n_vocab;
            quill_model_free(probe);
        }
        CHECK(count && packed_one && packed_tok && file_one && file_tok, "%s: the evaluations ran", models[i]);
        if (count && packed_one && packed_tok && file_one && file_tok) {
            CHECK(memcmp(packed_one, file_one, count * sizeof(float)) == 0, "%s: one batch, packed != file layout", models[i]);
            CHECK(memcmp(packed_tok, file_tok, count * sizeof(float)) == 0, "%s: token by token, packed != file layout", models[i]);
            CHECK(memcmp(packed_one, packed_tok, count * sizeof(float)) == 0, "%s: packed, batch != token by token", models[i]);
        }
        free(packed_one); free(packed_tok); free(file_one); free(file_tok);
        free(path);
    }
    restore_env("QUILL_ISA", isa);
}
