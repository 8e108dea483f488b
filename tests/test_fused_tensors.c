/* Tensor layouts the reference accepts in any dense architecture: a fused attn_qkv (with its bias)
 * in place of attn_q/k/v, which must give the same bits as the three apart, and Granite's optional
 * FFN biases, which must follow the reference. Each case is a variant of a synthesized F32 model;
 * the reference's logits come from refdump at test time. */
#include "golden.h"
#include "test.h"

#include "quill.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const int32_t prompt[] = {1, 20, 300, 45, 67, 89, 100, 200, 311, 400, 12, 13};
#define N_PROMPT ((int)(sizeof prompt / sizeof prompt[0]))

static bool synth(const char *shared, const char *args, const char *out) {
    char cmd[2048], *log = NULL;
    snprintf(cmd, sizeof cmd, "%s synth %s --embd 128 --heads 4 --kv-heads 2 --ff 256 --layers 2 --seed 5 --vocab "
                              "%s/models/stories260K.gguf --type f32 -o %s",
             quill_bin(), args, shared, out);
    int rc = run_cmd(cmd, &log, true);
    if (rc) test_fail(__FILE__, __LINE__, "synth %s: %s", args, log ? log : "");
    free(log);
    return rc == 0;
}

/* The logits of the prompt, on the fast path or the float64 one; NULL (and a failure) on error. */
static float *logits_of(const char *model, bool reference, int64_t *n_vocab) {
    quill_model *m = NULL;
    quill_context *c = NULL;
    quill_error err;
    quill_context_params p = {.n_ctx = 32, .n_threads = 2, .reference = reference};
    float *logits = NULL;
    if (quill_model_load(model, &m, &err) == QUILL_OK && quill_context_new(m, &p, &c, &err) == QUILL_OK) {
        *n_vocab = quill_model_hparams(m)->n_vocab;
        logits = malloc((size_t)N_PROMPT * (size_t)*n_vocab * sizeof *logits);
        if (quill_eval(c, prompt, N_PROMPT, logits, true, &err) != QUILL_OK) {
            free(logits);
            logits = NULL;
        }
    }
    if (!logits) test_fail(__FILE__, __LINE__, "%s: %s", model, err.message);
    quill_context_free(c);
    quill_model_free(m);
    return logits;
}

/* refdump's logits for the prompt */
static float *reference_logits(const char *shared, const char *model, int64_t n_vocab) {
    char prefix[600], cmd[2048], tokens[256] = "", *log = NULL;
    for (int i = 0; i < N_PROMPT; i++) snprintf(tokens + strlen(tokens), sizeof tokens - strlen(tokens), "%s%d", i ? "," : "", prompt[i]);
    snprintf(prefix, sizeof prefix, "%s.ref", model);
    snprintf(cmd, sizeof cmd, "OMP_WAIT_POLICY=PASSIVE %s/ref/bin/refdump %s %s 1 - - 0 --tokens %s", shared, model,
             prefix, tokens);
    int rc = run_cmd(cmd, &log, true);
    if (rc) test_fail(__FILE__, __LINE__, "refdump %s: %.1500s", model, log ? log : "");
    free(log);
    refdump_out r = {0};
    if (rc || !refdump_load(prefix, N_PROMPT, &r)) return NULL;
    if (r.n_vocab != n_vocab) {
        test_fail(__FILE__, __LINE__, "refdump: %lld tokens, quill %lld", (long long)r.n_vocab, (long long)n_vocab);
        free(r.logits);
        return NULL;
    }
    return r.logits;
}

/* A copy of src with blk.N.attn_{q,k,v}.weight (and .bias when `bias`) fused into attn_qkv. */
static bool fuse_qkv(const char *src, const char *dst, bool bias) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err) != QUILL_OK) return false;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w && copy_metadata(w, g, NULL);
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        const char *kind = strstr(t->name, ".attn_");
        bool is_q = kind && (!strncmp(kind, ".attn_q.", 8)), is_kv = kind && (!strncmp(kind, ".attn_k.", 8) || !strncmp(kind, ".attn_v.", 8));
        bool is_bias = strstr(t->name, ".bias") != NULL;
        if ((is_q || is_kv) && (!is_bias || bias)) {
            if (!is_q) continue;   /* written with q's */
            char base[64], name[128];
            snprintf(base, sizeof base, "%.*s", (int)(kind - t->name), t->name);
            const char *suffix = is_bias ? "bias" : "weight";
            const quill_gguf_tensor *parts[3];
            const char *names[3] = {"attn_q", "attn_k", "attn_v"};
            size_t bytes = 0;
            for (int k = 0; k < 3; k++) {
                snprintf(name, sizeof name, "%s.%s.%s", base, names[k], suffix);
                parts[k] = quill_gguf_find_tensor(g, name);
                ok = ok && parts[k] && parts[k]->type == QUILL_TYPE_F32;
                if (ok) bytes += parts[k]->nbytes;
            }
            char *data = ok ? malloc(bytes) : NULL;
            size_t at = 0;
            int64_t rows = 0;
            for (int k = 0; data && k < 3; k++) {
                memcpy(data + at, parts[k]->data, parts[k]->nbytes);
                at += parts[k]->nbytes;
                rows += is_bias ? parts[k]->ne[0] : parts[k]->ne[1];
            }
            snprintf(name, sizeof name, "%s.attn_qkv.%s", base, suffix);
            const int64_t ne[2] = {is_bias ? rows : t->ne[0], rows};
            ok = data && quill_gguf_writer_add_tensor(w, name, QUILL_TYPE_F32, is_bias ? 1 : 2, ne, data) == QUILL_OK;
            free(data);
            continue;
        }
        ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

TEST(fused_qkv_same_bits_as_apart_and_as_the_reference) {
    REQUIRE_SHARED(shared);
    /* llama (no biases) and qwen2 (q, k, v biases, fused with the weights) */
    static const char *const archs[] = {"llama", "qwen2"};
    for (size_t a = 0; a < 2; a++) {
        char apart[512], fused[512], args[64];
        snprintf(apart, sizeof apart, "%s/qkv-%s-apart.gguf", tmp_dir(), archs[a]);
        snprintf(fused, sizeof fused, "%s/qkv-%s-fused.gguf", tmp_dir(), archs[a]);
        snprintf(args, sizeof args, "--arch %s", archs[a]);
        if (!synth(shared, args, apart)) continue;
        CHECK(fuse_qkv(apart, fused, a == 1), "fusing %s", archs[a]);
        for (int reference = 0; reference < 2; reference++) {
            int64_t nv = 0, nv2 = 0;
            float *x = logits_of(apart, reference, &nv), *y = logits_of(fused, reference, &nv2);
            CHECK(x && y && nv == nv2 && !memcmp(x, y, (size_t)N_PROMPT * (size_t)nv * sizeof *x),
                  "%s (%s pass): fused attn_qkv changes the logits", archs[a], reference ? "float64" : "fast");
            if (!reference && y) {
                float *r = reference_logits(shared, fused, nv);
                double d = r ? max_rel_error(y, r, (size_t)N_PROMPT * (size_t)nv) : 1;
                CHECK(r && d < 1e-5, "%s fused: %.3g from the reference", archs[a], d);
                free(r);
            }
            free(x);
            free(y);
        }
    }
}

/* A copy of src with random biases on every layer's ffn_gate, ffn_up and ffn_down. */
static bool add_ffn_biases(const char *src, const char *dst) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err) != QUILL_OK) return false;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w && copy_metadata(w, g, NULL);
    uint64_t rng = 99;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
        const char *ffn = strstr(t->name, ".ffn_");
        if (!ok || !ffn || !strstr(ffn, ".weight") || !(strstr(ffn, "gate") || strstr(ffn, "up") || strstr(ffn, "down")))
            continue;
        char name[96];
        snprintf(name, sizeof name, "%.*s.bias", (int)(strstr(t->name, ".weight") - t->name), t->name);
        const int64_t n = t->ne[1];
        float *b = malloc((size_t)n * sizeof *b);
        for (int64_t k = 0; b && k < n; k++) b[k] = ((float)(test_rand(&rng) % 2001) - 1000.0f) / 4000.0f;
        ok = b && quill_gguf_writer_add_tensor(w, name, QUILL_TYPE_F32, 1, &n, b) == QUILL_OK;
        free(b);
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

TEST(granite_ffn_biases_follow_the_reference) {
    REQUIRE_SHARED(shared);
    char plain[512], biased[512];
    snprintf(plain, sizeof plain, "%s/granite-plain.gguf", tmp_dir());
    snprintf(biased, sizeof biased, "%s/granite-ffn-bias.gguf", tmp_dir());
    if (!synth(shared, "--arch granite", plain)) return;
    CHECK(add_ffn_biases(plain, biased), "adding the biases");
    int64_t nv = 0, nv2 = 0, nv3 = 0;
    float *without = logits_of(plain, false, &nv), *fast = logits_of(biased, false, &nv2), *exact = logits_of(biased, true, &nv3);
    const size_t n = (size_t)N_PROMPT * (size_t)nv;
    CHECK(without && fast && exact && max_rel_error(fast, without, n) > 1e-3, "the biases change nothing");
    float *r = fast ? reference_logits(shared, biased, nv) : NULL;
    double d_fast = r ? max_rel_error(fast, r, n) : 1, d_exact = r && exact ? max_rel_error(exact, r, n) : 1;
    CHECK(r && d_fast < 1e-5 && d_exact < 1e-5, "from the reference: fast %.3g, float64 %.3g", d_fast, d_exact);
    free(r);
    free(without);
    free(fast);
    free(exact);
}
