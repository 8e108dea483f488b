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
