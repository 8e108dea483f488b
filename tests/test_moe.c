/* Mixture-of-experts models beyond their golden cases (test_arch.c): each token's routing and
 * expert products are independent of the batch, the thread count, the other sequences and the
 * weights' layout, bit for bit; bad MoE files are refused with messages naming the key or tensor. */
#include "gguf_build.h"
#include "test.h"

#include "golden.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* more than a MoE micro-batch (QUILL_UBATCH_MOE, 256): one batch is cut in two */
#define N_TOK 300

/* Small MoE models in F32, in Q4_K_M and in MXFP4_MOE (experts mxfp4, the rest q8_0) by quill's
 * quantizer, made once: a qwen3moe (16 experts, 4 used) and a gpt-oss (8 experts, 2 used, window 5,
 * sinks, biases). */
static const char *const moe_synth[] = {
    "--arch qwen3moe --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 512 --experts 16 --experts-used 4 "
    "--expert-ff 96 --seed 3",
    "--arch gpt-oss --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 96 --experts 8 --experts-used 2 --window 5 "
    "--seed 3",
};

static bool moe_models(const char *shared, int which, char *f32, char *q4, char *mx, size_t cap) {
    snprintf(f32, cap, "%s/moe-%d-f32.gguf", tmp_dir(), which);
    snprintf(q4, cap, "%s/moe-%d-q4_k_m.gguf", tmp_dir(), which);
    snprintf(mx, cap, "%s/moe-%d-mxfp4_moe.gguf", tmp_dir(), which);
    FILE *f = fopen(mx, "rb");
    if (f) {
        fclose(f);
        return true;
    }
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s synth %s --vocab %s/models/stories260K.gguf --type f32 -o %s && %s quantize %s %s q4_k_m && "
             "%s quantize %s %s mxfp4_moe",
             quill_bin(), moe_synth[which], shared, f32, quill_bin(), f32, q4, quill_bin(), f32, mx);
    const int rc = run_cmd(cmd, &out, true);
    if (rc != 0) test_fail(__FILE__, __LINE__, "making the MoE models failed (exit %d): %.2000s", rc, out);
    free(out);
    return rc == 0;
}

static void prompt_tokens(int32_t *t, int n, int salt) {
    for (int i = 0; i < n; i++) t[i] = (int32_t)((i * 37 + salt * 101 + 5) % 500) + 1;
}

/* Sequence 0's logits for every prompt position: in one batch, token by token, or in batches shared
 * with a second sequence (its tokens interleaved, batches of 7); NULL after a test failure. The
 * weights in the file's layout, in the kernel set's copy (complete: waited for), or as the copy
 * stands (the experts copied by a thread of their own while the prompt runs). */
typedef enum { ONE_BATCH, TOKEN_BY_TOKEN, SHARED_BATCHES } how;
typedef enum { FILE_LAYOUT, PACKED, WHILE_PACKING } layout;

static float *logits_of(const char *model, how h, int threads, layout lay) {
    const bool repack = lay != FILE_LAYOUT;
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (!repack) setenv("QUILL_REPACK", "0", 1);
    quill_status s = quill_model_load(model, &m, &err);
    quill_context_params p = {.n_ctx = N_TOK, .n_threads = threads, .n_seq = h == SHARED_BATCHES ? 2 : 1};
    if (!s && (s = quill_context_new(m, &p, &c, &err))) quill_model_free(m);
    if (!repack) unsetenv("QUILL_REPACK");
    if (s) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    if (lay == PACKED) quill_context_wait_layout(c);
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    float *out = malloc((size_t)N_TOK * (size_t)nv * sizeof *out);
    float *tmp = malloc((size_t)2 * N_TOK * (size_t)nv * sizeof *tmp);
    int32_t tok[N_TOK], other[N_TOK];
    prompt_tokens(tok, N_TOK, 0);
    prompt_tokens(other, N_TOK, 1);
    s = out && tmp ? QUILL_OK : QUILL_E_NOMEM;
    if (!s && h == ONE_BATCH) s = quill_eval(c, tok, N_TOK, out, true, &err);
    for (int i = 0; !s && h == TOKEN_BY_TOKEN && i < N_TOK; i++)
        s = quill_eval(c, tok + i, 1, out + (size_t)i * nv, true, &err);
    for (int at = 0; !s && h == SHARED_BATCHES && at < N_TOK; at += 7) {
        const int n = N_TOK - at < 7 ? N_TOK - at : 7;
        int32_t bt[14], bs[14], bp[14];
        bool want[14];
        for (int i = 0; i < n; i++) {
            bt[2 * i] = other[at + i], bs[2 * i] = 1, bp[2 * i] = at + i, want[2 * i] = true;
            bt[2 * i + 1] = tok[at + i], bs[2 * i + 1] = 0, bp[2 * i + 1] = at + i, want[2 * i + 1] = true;
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

TEST(moe_logits_bitwise_invariant_to_batch_threads_sequences_and_layout) {
    REQUIRE_SHARED(shared);
    char f32[2][512], q4[2][512], mx[2][512];
    for (int i = 0; i < 2; i++)
        if (!moe_models(shared, i, f32[i], q4[i], mx[i], sizeof f32[i])) return;
    const char *models[] = {f32[0], q4[0], f32[1], q4[1], mx[1]};
    for (int k = 0; k < 5; k++) {
        quill_model *m;
        quill_error err;
        CHECK(quill_model_load(models[k], &m, &err) == QUILL_OK, "%s", err.message);
        const size_t n = (size_t)N_TOK * (size_t)quill_model_hparams(m)->n_vocab * sizeof(float);
        quill_model_free(m);
        float *base = logits_of(models[k], ONE_BATCH, 2, PACKED);
        float *single = logits_of(models[k], TOKEN_BY_TOKEN, 1, PACKED);
        float *shared_b = logits_of(models[k], SHARED_BATCHES, 2, PACKED);
        float *unpacked = logits_of(models[k], ONE_BATCH, 1, FILE_LAYOUT);
        float *early = logits_of(models[k], TOKEN_BY_TOKEN, 2, WHILE_PACKING);
        CHECK(base && single && shared_b && unpacked && early);
        if (base && single && shared_b && unpacked && early) {
            CHECK(!memcmp(base, early, n), "%s: read while its experts are copied, the model's logits differ",
                  models[k]);
            CHECK(!memcmp(base, single, n), "%s: one batch on 2 threads and token by token on 1 differ", models[k]);
            CHECK(!memcmp(base, shared_b, n), "%s: sharing batches with another sequence changes the logits",
                  models[k]);
            CHECK(!memcmp(base, unpacked, n), "%s: the packed and the file's layout differ", models[k]);
        }
        free(base), free(single), free(shared_b), free(unpacked), free(early);
    }
}

/* A copy of `src` where metadata `key` becomes the u32 `value` (NULL key: none; value DROP: the
 * key is left out), tensor `drop`
 * is left out (NULL: none) and tensor `reshape` gets ne `ne` (its first elements kept). */
#define DROP UINT32_MAX

static bool variant(const char *src, const char *dst, const char *key, uint32_t value, const char *drop,
                    const char *reshape, const int64_t *ne) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err) != QUILL_OK) return false;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w != NULL && copy_metadata(w, g, key);
    if (ok && key && value != DROP) ok = quill_gguf_writer_add_u32(w, key, value) == QUILL_OK;
    float *zeros = NULL;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (drop && !strcmp(t->name, drop)) continue;
        if (reshape && !strcmp(t->name, reshape)) {
            const int64_t count = ne[0] * ne[1] * ne[2];
            ok = (zeros = calloc((size_t)count, sizeof *zeros)) != NULL &&
                 quill_gguf_writer_add_tensor(w, t->name, QUILL_TYPE_F32, ne[2] > 1 ? 3 : 2, ne, zeros) == QUILL_OK;
        } else {
            ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
        }
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    free(zeros);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

/* A copy of `src` whose routers (ffn_gate_inp) are rounded to f16: stored in f16 (as_f16), or in
 * f32 holding the same rounded values. */
static bool router_rounded(const char *src, const char *dst, bool as_f16) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err) != QUILL_OK) return false;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w != NULL && copy_metadata(w, g, NULL);
    void **kept = calloc(quill_gguf_n_tensors(g), sizeof *kept); /* (the writer reads them at write) */
    ok = ok && kept;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (!strstr(t->name, "ffn_gate_inp.weight") || t->type != QUILL_TYPE_F32) {
            ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
            continue;
        }
        const int64_t n = t->ne[0] * t->ne[1];
        const float *x = t->data;
        uint16_t *h = malloc((size_t)n * sizeof *h);
        float *f = malloc((size_t)n * sizeof *f);
        ok = h && f;
        for (int64_t j = 0; ok && j < n; j++) f[j] = quill_f16_to_f32(h[j] = quill_f32_to_f16(x[j]));
        ok = ok && quill_gguf_writer_add_tensor(w, t->name, as_f16 ? QUILL_TYPE_F16 : QUILL_TYPE_F32, t->n_dims, t->ne,
                                                as_f16 ? (void *)h : (void *)f) == QUILL_OK;
        kept[i] = as_f16 ? (void *)h : (void *)f;
        free(as_f16 ? (void *)f : (void *)h);
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    for (uint64_t i = 0; kept && i < quill_gguf_n_tensors(g); i++) free(kept[i]);
    free(kept);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

/* A router stored in f16 (ffn_moe.c decodes its rows, then the float64 products): the logits of a
 * file whose routers are f16 equal those of one whose f32 routers hold the same rounded values, bit
 * for bit, on one batch and token by token. */
TEST(moe_router_of_another_type) {
    REQUIRE_SHARED(shared);
    char f32[512], q4[512], mx[512], half[600], rounded[600];
    if (!moe_models(shared, 0, f32, q4, mx, sizeof f32)) return;
    snprintf(half, sizeof half, "%s/moe-router-f16.gguf", tmp_dir());
    snprintf(rounded, sizeof rounded, "%s/moe-router-rounded.gguf", tmp_dir());
    CHECK(router_rounded(q4, half, true) && router_rounded(q4, rounded, false), "rewriting the routers");
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(half, &m, &err) == QUILL_OK, "%s", err.message);
    const size_t n = (size_t)N_TOK * (size_t)quill_model_hparams(m)->n_vocab * sizeof(float);
    quill_model_free(m);
    float *a = logits_of(half, ONE_BATCH, 2, PACKED), *b = logits_of(rounded, ONE_BATCH, 2, PACKED);
    float *a1 = logits_of(half, TOKEN_BY_TOKEN, 1, PACKED);
    CHECK(a && b && a1);
    if (a && b && a1) {
        CHECK(!memcmp(a, b, n), "an f16 router and its values in f32 give different logits");
        CHECK(!memcmp(a, a1, n), "an f16 router's logits depend on the batch");
    }
    free(a), free(b), free(a1);
    remove(half), remove(rounded);
}

TEST(moe_bad_files_are_refused_by_name) {
    REQUIRE_SHARED(shared);
    char f32[512], q4[512], mx[512], bad[600];
    if (!moe_models(shared, 0, f32, q4, mx, sizeof f32)) return;
    snprintf(bad, sizeof bad, "%s/moe-bad.gguf", tmp_dir());
    const int64_t oss_bias[] = {96, 7, 1};
    const int64_t gate_7[] = {256, 96, 7}, gate_2d[] = {256, 96, 1}, down_t[] = {256, 96, 16}, router[] = {256, 15, 1};
    const struct {
        const char *key;
        uint32_t value;
        const char *drop, *reshape;
        const int64_t *ne;
        const char *message;
    } cases[] = {
        {"qwen3moe.expert_count", 0, NULL, NULL, NULL, "qwen3moe.expert_count is missing or 0"},
        {"qwen3moe.expert_used_count", 0, NULL, NULL, NULL, "qwen3moe.expert_used_count is missing or 0"},
        {"qwen3moe.expert_used_count", 17, NULL, NULL, NULL,
         "qwen3moe.expert_used_count = 17 is more than qwen3moe.expert_count = 16"},
        {"qwen3moe.expert_count", 513, NULL, NULL, NULL, "qwen3moe.expert_count = 513 is more than 512 experts"},
        {"qwen3moe.expert_group_count", 4, NULL, NULL, NULL, "qwen3moe.expert_group_count = 4"},
        {NULL, 0, "blk.1.ffn_up_exps.weight", NULL, NULL, "tensor 'blk.1.ffn_up_exps.weight' is missing"},
        {NULL, 0, "blk.0.ffn_gate_inp.weight", NULL, NULL, "tensor 'blk.0.ffn_gate_inp.weight' is missing"},
        {NULL, 0, NULL, "blk.0.ffn_gate_exps.weight", gate_7,
         "tensor 'blk.0.ffn_gate_exps.weight' has shape [256, 96, 7, 1], expected [256, 96, 16] (16 experts)"},
        {NULL, 0, NULL, "blk.1.ffn_gate_exps.weight", gate_2d,
         "tensor 'blk.1.ffn_gate_exps.weight' has shape [256, 96, 1, 1], expected [256, 96, 16]"},
        {NULL, 0, NULL, "blk.0.ffn_down_exps.weight", down_t,
         "tensor 'blk.0.ffn_down_exps.weight' has shape [256, 96, 16, 1], expected [96, 256, 16]"},
        {NULL, 0, NULL, "blk.1.ffn_gate_inp.weight", router,
         "tensor 'blk.1.ffn_gate_inp.weight' has shape [256, 15, 1, 1], expected [256, 16]"},
        /* gpt-oss (from here on) */
        {"gpt-oss.attention.sliding_window", DROP, NULL, NULL, NULL, "gpt-oss.attention.sliding_window is missing"},
        {NULL, 0, "blk.0.attn_sinks.weight", NULL, NULL, "tensor 'blk.0.attn_sinks.weight' is missing"},
        {NULL, 0, "blk.1.ffn_down_exps.bias", NULL, NULL, "tensor 'blk.1.ffn_down_exps.bias' is missing"},
        {NULL, 0, "blk.0.attn_output.bias", NULL, NULL, "tensor 'blk.0.attn_output.bias' is missing"},
        {NULL, 0, NULL, "blk.0.ffn_up_exps.bias", oss_bias, "tensor 'blk.0.ffn_up_exps.bias' has shape [96, 7, 1, 1], "
         "expected [96, 8]"},
        {"gpt-oss.rope.dimension_count", 32, NULL, NULL, NULL, "gpt-oss.rope.dimension_count = 32 must be the head size 64"},
    };
    const size_t first_oss = 11;
    char oss[512], oss_q4[512], oss_mx[512];
    if (!moe_models(shared, 1, oss, oss_q4, oss_mx, sizeof oss)) return;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(variant(i < first_oss ? f32 : oss, bad, cases[i].key, cases[i].value, cases[i].drop, cases[i].reshape,
                      cases[i].ne),
              "cannot write case %zu", i);
        quill_model *m = NULL;
        quill_error err = {0};
        const quill_status s = quill_model_load(bad, &m, &err);
        CHECK(s != QUILL_OK, "case %zu (%s) loaded", i, cases[i].message);
        if (s == QUILL_OK) quill_model_free(m);
        else CHECK_STR_CONTAINS(err.message, cases[i].message);
    }
    remove(bad);
}

/* Q8_0 files (the reference's quantizer) of the MoE families, and gpt-oss as its files ship
 * (MXFP4_MOE: experts in mxfp4, the rest q8_0): quill's logits at least 2x closer to float64 truth
 * on the same weights (its --reference path) than the reference implementation's. */
static float *all_logits(const char *model, bool reference, int64_t nv, const int32_t *tok, int n) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(model, &m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    quill_context_params p = {.n_ctx = 64, .n_threads = 2, .reference = reference};
    float *l = NULL;
    if (quill_context_new(m, &p, &c, &err) == QUILL_OK) {
        l = malloc((size_t)n * (size_t)nv * sizeof *l);
        if (l && quill_eval(c, tok, n, l, true, &err)) free(l), l = NULL;
        quill_context_free(c);
    }
    if (!l) test_fail(__FILE__, __LINE__, "%s: %s", model, err.message);
    quill_model_free(m);
    return l;
}

TEST(moe_q8_0_and_mxfp4_closer_to_truth_than_the_reference) {
    REQUIRE_SHARED(shared);
    const char *synth[] = {
        "--arch qwen3moe --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 512 --experts 8 --experts-used 2 "
        "--expert-ff 128 --seed 5",
        "--arch llama-moe --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 128 --experts 8 --experts-used 2 --seed 5",
        "--arch gpt-oss --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 128 --experts 8 --experts-used 2 --window 5 "
        "--seed 5",
        "--arch gpt-oss --layers 2 --embd 256 --heads 4 --kv-heads 2 --ff 128 --experts 8 --experts-used 2 --window 5 "
        "--seed 6"};
    const char *names[] = {"qwen3moe", "llama-moe", "gpt-oss", "gpt-oss"};
    const char *ftypes[] = {"Q8_0", "Q8_0", "Q8_0", "MXFP4_MOE"};
    const int32_t tok[] = {1, 20, 300, 45, 67, 89, 100, 200, 311, 400, 12, 13, 14, 15, 16, 17};
    const int n = (int)(sizeof tok / sizeof tok[0]);
    for (int k = 0; k < 4; k++) {
        char f32[512], q8[512], ref[512], cmd[4096], *out = NULL;
        snprintf(f32, sizeof f32, "%s/moe-q8-%d-f32.gguf", tmp_dir(), k);
        snprintf(q8, sizeof q8, "%s/moe-q8-%d.gguf", tmp_dir(), k);
        snprintf(ref, sizeof ref, "%s/moe-q8-%d.ref", tmp_dir(), k);
        snprintf(cmd, sizeof cmd,
                 "(export OMP_WAIT_POLICY=PASSIVE; %s synth %s --vocab %s/models/stories260K.gguf --type f32 -o %s && "
                 "%s/ref/bin/llama-quantize %s %s %s && %s/ref/bin/refdump %s %s 0 - - 0 --tokens "
                 "1,20,300,45,67,89,100,200,311,400,12,13,14,15,16,17)",
                 quill_bin(), synth[k], shared, f32, shared, f32, q8, ftypes[k], shared, q8, ref);
        int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "making the %s case failed (exit %d): %.2000s", ftypes[k], rc, out);
        free(out);
        char path[600];
        size_t size = 0;
        snprintf(path, sizeof path, "%s.logits.f32", ref);
        float *theirs = read_file(path, &size);
        const int64_t nv = (int64_t)(size / sizeof(float) / (size_t)n);
        float *ours = all_logits(q8, false, nv, tok, n), *exact = all_logits(q8, true, nv, tok, n);
        CHECK(theirs && nv == 512, "%s: %zu bytes", path, size);
        if (theirs && ours && exact && nv == 512) {
            const size_t count = (size_t)n * (size_t)nv;
            const double e_ours = rms_rel_error(ours, exact, count), e_theirs = rms_rel_error(theirs, exact, count);
            printf("    %-9s %-9s rms error vs float64: quill %.3g, reference impl %.3g (%.1fx)\n", names[k],
                   ftypes[k], e_ours, e_theirs, e_theirs / e_ours);
            CHECK(2 * e_ours <= e_theirs, "quill %.3g is not 2x closer to truth than the reference's %.3g", e_ours,
                  e_theirs);
        }
        free(theirs), free(ours), free(exact);
        remove(f32), remove(q8);
        snprintf(path, sizeof path, "%s.logits.f32", ref), remove(path);
        snprintf(path, sizeof path, "%s.json", ref), remove(path);
    }
}

/* The fuzzer's MoE seeds (fuzz/seeds, written by `quill synth --vocab fuzz/seeds/vocab.gguf.seed`)
 * stay models quill runs: they load, and their fast and float64 logits agree. */
TEST(moe_fuzz_seeds_are_runnable_models) {
    const char *seeds[] = {"fuzz/seeds/qwen3moe.gguf.seed", "fuzz/seeds/llama-moe.gguf.seed", "fuzz/seeds/gpt-oss.gguf.seed"};
    const int32_t tok[] = {1, 5, 9, 2};
    for (size_t i = 0; i < 3; i++) {
        quill_model *m;
        quill_error err;
        CHECK(quill_model_load(seeds[i], &m, &err) == QUILL_OK, "%s", err.message);
        const int64_t nv = quill_model_hparams(m)->n_vocab;
        quill_model_free(m);
        float *fast = all_logits(seeds[i], false, nv, tok, 4), *exact = all_logits(seeds[i], true, nv, tok, 4);
        CHECK(fast && exact);
        if (fast && exact) {
            const double e = max_rel_error(fast, exact, (size_t)(4 * nv));
            CHECK(e < 1e-5, "%s: fast path %.3g from float64", seeds[i], e);
        }
        free(fast), free(exact);
    }
}

/* quill bench counts, of each 3-D expert tensor, the share of the experts a token uses: the
 * gpt-oss seed (4 experts, 2 used) reads half of each expert tensor per token. */
TEST(moe_bench_bytes_per_token_count_the_used_experts) {
    const char *seed = "fuzz/seeds/gpt-oss.gguf.seed";
    quill_gguf *g = NULL;
    quill_error err;
    CHECK(quill_gguf_open(seed, &g, &err) == QUILL_OK, "%s", err.message);
    if (!g) return;
    double want = 0;
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (t->ne[2] > 1) want += (double)t->nbytes / 2;
        else if (!strcmp(t->name, "token_embd.weight")) want += (double)t->nbytes / (double)t->ne[1];
        else want += (double)t->nbytes;
    }
    quill_gguf_close(g);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s bench -m %s -p 2 -n 2 -r 1 -t 1 --bw-mib 16 --json", quill_bin(), seed);
    const int rc = run_cmd(cmd, &out, false);
    const char *at = out ? strstr(out, "\"bytes_per_token\": ") : NULL;
    const double got = at ? atof(at + strlen("\"bytes_per_token\": ")) : -1;
    free(out);
    CHECK(rc == 0 && got == want, "exit %d: %.0f bytes per token, expected %.0f", rc, got, want);
}

/* quill verify is clean on the MoE models, F32 and Q4_K_M: every traced tensor of the fast path
 * (router logits, probabilities, chosen weights, expert outputs among them) within its tolerance
 * of the float64 path. */
TEST(moe_verify_is_clean) {
    REQUIRE_SHARED(shared);
    for (int which = 0; which < 2; which++) {
        char f32[512], q4[512], mx[512];
        if (!moe_models(shared, which, f32, q4, mx, sizeof f32)) return;
        const char *models[] = {f32, q4};
        for (int k = 0; k < 2; k++) {
            char cmd[1200], *out = NULL;
            snprintf(cmd, sizeof cmd, "%s verify -m %s --tokens 1,20,300,45,67,89,100,200,311,400 -t 2", quill_bin(),
                     models[k]);
            const int rc = run_cmd(cmd, &out, true);
            CHECK(rc == 0, "%s: exit %d: %s", models[k], rc, out);
            /* per layer at least the attention's 8 tensors, the router's logits, probabilities and
             * weights, the experts' outputs and their sum */
            const char *ok = out ? strstr(out, "ok: ") : NULL;
            CHECK(ok && atoi(ok + 4) >= 2 * (8 + 5), "%s: %s", models[k], out);
            free(out);
        }
    }
}
