/* The family tests' shared harness (family_harness.h). */
#include "family_harness.h"
#include "test.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const int32_t family_prompt[FAMILY_N_PROMPT] = {1, 20, 300, 45, 67, 89, 100, 200, 311, 400, 12, 13, 14, 15, 16, 17};
#define N_PROMPT FAMILY_N_PROMPT
#define N_GEN FAMILY_N_GEN
#define prompt family_prompt

const char *const family_quants[3] = {"f32", "q8_0", "q4_k_m"};
#define quants family_quants

void family_tokens_arg(char *buf, size_t cap) {
    buf[0] = 0;
    for (int i = 0; i < N_PROMPT; i++) snprintf(buf + strlen(buf), cap - strlen(buf), "%s%d", i ? "," : "", prompt[i]);
}

void family_model_path(const char *kind, const char *name, int quant, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s-%s-%s.gguf", tmp_dir(), kind, name, quants[quant]);
}

void family_ref_prefix(const char *kind, const char *name, int quant, char *buf, size_t cap) {
    snprintf(buf, cap, "%s/%s-%s-%s.ref", tmp_dir(), kind, name, quants[quant]);
}

bool family_make(const char *shared, const char *kind, const char *name, const char *synth, bool q4) {
    char f32[512], q8[512], q4_path[512], r32[512], r8[512], r4[512], tokens[256], cmd[8192], *out = NULL;
    family_model_path(kind, name, 0, f32, sizeof f32), family_model_path(kind, name, 1, q8, sizeof q8);
    family_model_path(kind, name, 2, q4_path, sizeof q4_path);
    family_ref_prefix(kind, name, 0, r32, sizeof r32), family_ref_prefix(kind, name, 1, r8, sizeof r8);
    family_ref_prefix(kind, name, 2, r4, sizeof r4);
    family_tokens_arg(tokens, sizeof tokens);
    int at = snprintf(cmd, sizeof cmd,
                      "(export OMP_WAIT_POLICY=PASSIVE; %s synth %s --vocab %s/models/stories260K.gguf --type f32 -o %s"
                      " && %s/ref/bin/llama-quantize %s %s Q8_0 && %s/ref/bin/refdump %s %s %d - - 1 --tokens %s"
                      " && %s/ref/bin/refdump %s %s %d - - 0 --tokens %s",
                      quill_bin(), synth, shared, f32, shared, f32, q8, shared, f32, r32, N_GEN, tokens, shared, q8,
                      r8, N_GEN, tokens);
    if (q4)
        at += snprintf(cmd + at, sizeof cmd - (size_t)at,
                       " && %s/ref/bin/llama-quantize %s %s Q4_K_M && %s/ref/bin/refdump %s %s %d - - 0 --tokens %s",
                       shared, f32, q4_path, shared, q4_path, r4, N_GEN, tokens);
    snprintf(cmd + at, sizeof cmd - (size_t)at, ")");
    const int rc = run_cmd(cmd, &out, true);
    if (rc != 0) test_fail(__FILE__, __LINE__, "%s: making the case failed (exit %d): %.2000s", name, rc, out);
    free(out);
    return rc == 0;
}

void family_remove(const char *kind, const char *name) {
    const char *suffixes[] = {".gguf", ".ref.json", ".ref.logits.f32", ".ref.trace.bin", ".trace.gguf"};
    for (int q = 0; q < 3; q++)
        for (size_t k = 0; k < sizeof suffixes / sizeof suffixes[0]; k++) {
            char path[600];
            snprintf(path, sizeof path, "%s/%s-%s-%s%s", tmp_dir(), kind, name, quants[q], suffixes[k]);
            remove(path);
        }
}

bool family_load_ref(const char *prefix, refdump_out *r) { return refdump_load(prefix, N_PROMPT, r); }

float *family_run_model(const char *model, bool reference, const refdump_out *r, double tie, int *agreed,
                        bool *at_tie) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(model, &m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    quill_context_params p = {.n_ctx = 64, .n_threads = 2, .reference = reference};
    if (quill_context_new(m, &p, &c, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        quill_model_free(m);
        return NULL;
    }
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    float *logits = malloc((size_t)N_PROMPT * (size_t)nv * sizeof *logits), *next = malloc((size_t)nv * sizeof *next);
    quill_status s = logits && next ? quill_eval(c, prompt, N_PROMPT, logits, true, &err) : QUILL_E_NOMEM;
    if (!s && agreed) {
        *agreed = 0;
        *at_tie = false;
        memcpy(next, logits + (size_t)(N_PROMPT - 1) * (size_t)nv, (size_t)nv * sizeof *next);
        for (int k = 0; k < r->n_greedy && !s; k++) {
            int32_t best = 0;
            for (int64_t v = 1; v < nv; v++)
                if (next[v] > next[best]) best = (int32_t)v;
            if (best != r->greedy[k]) {
                *at_tie = r->margin[k] < 10 * tie;
                break;
            }
            ++*agreed;
            s = quill_eval(c, &best, 1, next, false, &err);
        }
    }
    if (s) {
        test_fail(__FILE__, __LINE__, "%s: %s", model, s == QUILL_E_NOMEM ? "out of memory" : err.message);
        free(logits);
        logits = NULL;
    }
    free(next);
    quill_context_free(c);
    quill_model_free(m);
    return logits;
}

double family_rel_to_max(const float *a, const float *b, size_t n) {
    double m = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(fabs((double)a[i] - b[i]) <= m)) m = fabs((double)a[i] - b[i]);
        if (fabs(b[i]) > top) top = fabs(b[i]);
    }
    return m / top;
}

double family_max_abs_diff(const float *a, const float *b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) if (!(fabs((double)a[i] - b[i]) <= m)) m = fabs((double)a[i] - b[i]);
    return m;
}

/* (family_harness.h) A copy of `src` without metadata `drop_key` and tensor `drop_tensor` (NULL: none), plus u32
 * metadata `add_key` = add_value (or, with add_sections, rope.dimension_sections-like [a, 0, 0, 0]). */
bool family_variant(const char *src, const char *dst, const char *drop_key, const char *drop_tensor,
                    const char *add_key, uint32_t add_value, bool add_sections) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err) != QUILL_OK) return false;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w != NULL;
    for (uint64_t i = 0; ok && i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        if (!drop_key || strcmp(kv->key, drop_key)) ok = quill_gguf_writer_add_value(w, kv->key, &kv->value) == QUILL_OK;
    }
    const int32_t sections[4] = {(int32_t)add_value, 0, 0, 0};
    if (ok && add_key)
        ok = add_sections ? quill_gguf_writer_add_arr(w, add_key, QUILL_GGUF_INT32, sections, 4) == QUILL_OK
                          : quill_gguf_writer_add_u32(w, add_key, add_value) == QUILL_OK;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (!drop_tensor || strcmp(t->name, drop_tensor))
            ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

/* (family_harness.h) Sequence 0's logits over the prompt: in one batch on 2 threads, token by token on 1, or in batches of
 * 3 shared with a second sequence; NULL after a failure. */
float *family_logits_by(const char *model, int how) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(model, &m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    quill_context_params p = {.n_ctx = 64, .n_threads = how == 1 ? 1 : 2, .n_seq = how == 2 ? 2 : 1};
    if (quill_context_new(m, &p, &c, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        quill_model_free(m);
        return NULL;
    }
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    float *out = malloc((size_t)N_PROMPT * (size_t)nv * sizeof *out), *tmp = malloc((size_t)6 * (size_t)nv * sizeof *tmp);
    quill_status s = out && tmp ? QUILL_OK : QUILL_E_NOMEM;
    if (!s && how == 0) s = quill_eval(c, prompt, N_PROMPT, out, true, &err);
    for (int i = 0; !s && how == 1 && i < N_PROMPT; i++) s = quill_eval(c, prompt + i, 1, out + (size_t)i * nv, true, &err);
    for (int at = 0; !s && how == 2 && at < N_PROMPT; at += 3) {
        const int n = N_PROMPT - at < 3 ? N_PROMPT - at : 3;
        int32_t bt[6], bs[6], bp[6];
        bool want[6];
        for (int i = 0; i < n; i++) {
            bt[2 * i] = prompt[N_PROMPT - 1 - at - i], bs[2 * i] = 1, bp[2 * i] = at + i, want[2 * i] = true;
            bt[2 * i + 1] = prompt[at + i], bs[2 * i + 1] = 0, bp[2 * i + 1] = at + i, want[2 * i + 1] = true;
        }
        quill_batch b = {2 * n, bt, bs, bp, want};
        s = quill_decode(c, &b, tmp, &err);
        for (int i = 0; !s && i < n; i++)
            memcpy(out + (size_t)(at + i) * nv, tmp + (size_t)(2 * i + 1) * nv, (size_t)nv * sizeof *out);
    }
    if (s) {
        test_fail(__FILE__, __LINE__, "%s", s == QUILL_E_NOMEM ? "out of memory" : err.message);
        free(out);
        out = NULL;
    }
    free(tmp);
    quill_context_free(c);
    quill_model_free(m);
    return out;
}

/* ---------------------------------------------------------------- the checks every family test makes */

/* The trace of `model` over the prompt by the reference's names, against its trace. */
static void check_trace(const char *kind, const char *name, const char *model, const char *prefix, const char *tokens,
                        const family_f32_rules *rules) {
    char trace[600], ref_trace[600], cmd[2048], *out = NULL;
    snprintf(trace, sizeof trace, "%s/%s-%s-f32.trace.gguf", tmp_dir(), kind, name);
    snprintf(ref_trace, sizeof ref_trace, "%s.trace.bin", prefix);
    snprintf(cmd, sizeof cmd, "%s run -m %s --tokens %s -n 0 -t 2 --trace %s", quill_bin(), model, tokens, trace);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "%s: exit %d: %s", name, rc, out);
    free(out);
    quill_trace_diff *d;
    size_t nd;
    int64_t bad;
    quill_error err;
    if (quill_trace_compare(trace, ref_trace, rules->trace_tol > 0 ? rules->trace_tol : 1e-4, &d, &nd, &bad, &err)) {
        test_fail(__FILE__, __LINE__, "%s: %s", name, err.message);
        return;
    }
    double worst = 0;
    const char *missing = NULL;
    for (size_t k = 0; k < nd; k++)
        if (d[k].rel > worst) worst = d[k].rel;
    for (size_t i = 0; !missing && i < sizeof rules->trace_names / sizeof rules->trace_names[0] && rules->trace_names[i]; i++) {
        bool found = false;
        for (size_t k = 0; !found && k < nd; k++) found = !strcmp(d[k].name, rules->trace_names[i]);
        if (!found) missing = rules->trace_names[i];
    }
    printf("    %-14s trace: %zu tensors by the reference's names, worst rel %.3g\n", name, nd, worst);
    if (missing || nd < (rules->trace_min ? rules->trace_min : 12))
        test_fail(__FILE__, __LINE__, "%s: only %zu tensors in common with the reference's trace%s%s", name, nd,
                  missing ? ", not " : "", missing ? missing : "");
    if (bad >= 0) test_fail(__FILE__, __LINE__, "%s: %s beyond tolerance (rel %.3g)", name, d[bad].name, d[bad].rel);
    free(d);
    remove(trace);
}

void family_check_f32(const char *kind, const char *name, const family_f32_rules *rules) {
    char model[512], prefix[512], tokens[256], cmd[2048], *out = NULL;
    family_model_path(kind, name, 0, model, sizeof model);
    family_ref_prefix(kind, name, 0, prefix, sizeof prefix);
    refdump_out r;
    if (!family_load_ref(prefix, &r)) return;
    const size_t n = (size_t)N_PROMPT * (size_t)r.n_vocab;
    int agreed = 0;
    bool at_tie = false;
    float *exact = family_run_model(model, true, NULL, 0, NULL, NULL);
    float *fast = exact ? family_run_model(model, false, NULL, 0, NULL, NULL) : NULL;
    const double tie = fast ? family_max_abs_diff(fast, r.logits, n) : 0;
    free(fast);
    fast = exact ? family_run_model(model, false, &r, tie, &agreed, &at_tie) : NULL;
    bool ok = fast && exact;
    if (ok) {
        const double vs_ref = family_rel_to_max(fast, r.logits, n), vs_exact = family_rel_to_max(fast, exact, n);
        const double ref_vs_exact = family_rel_to_max(r.logits, exact, n);
        const double float64_tol = rules->float64_tol > 0 ? rules->float64_tol : 1e-5;
        printf("    %-14s f32: fast vs reference impl %.2g, fast vs float64 %.2g, reference impl vs float64 %.2g; "
               "%d of %d greedy tokens equal%s\n",
               name, vs_ref, vs_exact, ref_vs_exact, agreed, r.n_greedy, agreed < r.n_greedy ? ", then a near-tie" : "");
        if (!((vs_ref < 1e-5 && !rules->ref_rounds) || vs_exact < 1e-5))
            test_fail(__FILE__, __LINE__, "%s: logits %.3g from the reference implementation's, %.3g from float64", name,
                      vs_ref, vs_exact);
        if (!(ref_vs_exact < float64_tol))
            test_fail(__FILE__, __LINE__, "%s: float64 path %.3g from the reference implementation", name, ref_vs_exact);
        if (!(agreed == r.n_greedy || at_tie))
            test_fail(__FILE__, __LINE__, "%s: greedy token %d differs from the reference's (margin %.3g)", name, agreed,
                      r.margin[agreed]);
    }
    free(fast);
    free(exact);
    free(r.logits);
    if (!ok) return;
    family_tokens_arg(tokens, sizeof tokens);
    if (rules->trace_tol >= 0) check_trace(kind, name, model, prefix, tokens, rules);
    snprintf(cmd, sizeof cmd, "%s verify -m %s --tokens %s -t 2", quill_bin(), model, tokens);
    const int rc = run_cmd(cmd, &out, true);
    if (!(rc == 0 && out && strstr(out, "ok: ")))
        test_fail(__FILE__, __LINE__, "%s: quill verify: exit %d: %s", name, rc, out ? out : "");
    free(out);
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double family_median_position_error(const float *a, const float *truth, int64_t n_vocab) {
    double e[N_PROMPT];
    for (int p = 0; p < N_PROMPT; p++)
        e[p] = rms_rel_error(a + (size_t)p * (size_t)n_vocab, truth + (size_t)p * (size_t)n_vocab, (size_t)n_vocab);
    qsort(e, N_PROMPT, sizeof e[0], by_value);
    return (e[N_PROMPT / 2 - 1] + e[N_PROMPT / 2]) / 2;
}

void family_check_quantized(const char *kind, const char *name, int quant, bool median_position, bool greedy) {
    char model[512], prefix[512];
    family_model_path(kind, name, quant, model, sizeof model);
    family_ref_prefix(kind, name, quant, prefix, sizeof prefix);
    refdump_out r;
    if (!family_load_ref(prefix, &r)) return;
    const size_t n = (size_t)N_PROMPT * (size_t)r.n_vocab;
    int agreed = 0;
    bool at_tie = false;
    float *exact = family_run_model(model, true, NULL, 0, NULL, NULL);
    float *fast = !exact ? NULL
                  : greedy ? family_run_model(model, false, &r, family_max_abs_diff(r.logits, exact, n), &agreed, &at_tie)
                           : family_run_model(model, false, NULL, 0, NULL, NULL);
    if (fast && exact) {
        const double all_ours = rms_rel_error(fast, exact, n), all_theirs = rms_rel_error(r.logits, exact, n);
        const double ours = median_position ? family_median_position_error(fast, exact, r.n_vocab) : all_ours;
        const double theirs = median_position ? family_median_position_error(r.logits, exact, r.n_vocab) : all_theirs;
        printf("    %-14s %s: error vs float64 %s: quill %.3g, reference impl %.3g (%.1fx)", name, family_quants[quant],
               median_position ? "at the median position" : "(rms over all)", ours, theirs, theirs / ours);
        if (median_position) printf("; rms over all %.3g, %.3g", all_ours, all_theirs);
        if (greedy) printf("; %d of %d greedy tokens equal", agreed, r.n_greedy);
        printf("\n");
        if (!(2 * ours <= theirs))
            test_fail(__FILE__, __LINE__, "%s %s: quill %.3g is not 2x closer to truth than the reference's %.3g", name,
                      family_quants[quant], ours, theirs);
        if (greedy && !(agreed == r.n_greedy || at_tie))
            test_fail(__FILE__, __LINE__, "%s %s: greedy token %d differs from the reference's (margin %.3g)", name,
                      family_quants[quant], agreed, r.margin[agreed]);
    }
    free(fast);
    free(exact);
    free(r.logits);
}

void family_check_refusal(const char *shared, const char *kind, const family_refusal *r, size_t i, const char *synth) {
    char src[512], dst[512], cmd[2048], *out = NULL;
    snprintf(src, sizeof src, "%s/refuse-%s-%s.gguf", tmp_dir(), kind, r->arch);
    snprintf(dst, sizeof dst, "%s/refuse-%s-%s-%zu.gguf", tmp_dir(), kind, r->arch, i);
    snprintf(cmd, sizeof cmd, "%s synth --arch %s %s --vocab %s/models/stories260K.gguf --type f32 -o %s", quill_bin(),
             r->arch, synth, shared, src);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "%s: exit %d: %s", r->arch, rc, out);
    free(out);
    quill_model *m = NULL;
    quill_error err;
    CHECK(quill_model_load(src, &m, &err) == QUILL_OK, "%s: the unchanged model fails: %s", r->arch, err.message);
    quill_model_free(m);
    CHECK(family_variant(src, dst, r->drop_key, r->drop_tensor, r->add_key, r->add_value, r->add_sections),
          "cannot write %s", dst);
    CHECK(quill_model_load(dst, &m, &err) != QUILL_OK, "%s: case %zu loads", r->arch, i);
    CHECK_STR_CONTAINS(err.message, r->message);
    remove(src);
    remove(dst);
}
