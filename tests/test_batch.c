/* The multi-sequence batch API: each sequence's logits bitwise identical to evaluating it alone,
 * whatever else shares its batches, how the batches are cut, and the thread count; with the KV
 * cache in every type. */
#include "golden.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const int32_t *tokens;
    int n;
} prompt;

/* The KV cache types of every context these tests make (f32 unless a test sets them). */
static quill_type cache_k, cache_v;

/* All logits of one prompt evaluated alone, in one batch, in a one-sequence context. */
static float *alone(quill_model *m, const prompt *p, int threads) {
    quill_context *c;
    quill_error err;
    quill_context_params cp = {.n_ctx = 256, .n_threads = threads, .type_k = cache_k, .type_v = cache_v};
    if (quill_context_new(m, &cp, &c, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    float *l = malloc((size_t)p->n * nv * sizeof *l);
    if (l && quill_eval(c, p->tokens, p->n, l, true, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        free(l);
        l = NULL;
    }
    quill_context_free(c);
    return l;
}

/* The three prompts interleaved token by token in shared batches of varying size; sequence k
 * joins at step start[k] and lives in sequence id seq_id[k]. Returns false after a test failure. */
static bool interleaved(quill_model *m, const prompt *p, const int *start, const int *seq_id, int threads,
                        uint64_t seed, float *const *ref) {
    quill_context *c;
    quill_error err;
    quill_context_params cp = {.n_ctx = 256, .n_threads = threads, .n_seq = 5, .type_k = cache_k, .type_v = cache_v};
    if (quill_context_new(m, &cp, &c, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return false;
    }
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    int total = p[0].n + p[1].n + p[2].n;
    int32_t *tok = malloc((size_t)total * sizeof *tok), *seq = malloc((size_t)total * sizeof *seq);
    int32_t *pos = malloc((size_t)total * sizeof *pos), *owner = malloc((size_t)total * sizeof *owner);
    bool *want = malloc((size_t)total * sizeof *want);
    float *logits = malloc((size_t)total * nv * sizeof *logits);
    int done[3] = {0, 0, 0};
    bool ok = tok && seq && pos && owner && want && logits;
    for (int step = 0; ok && (done[0] < p[0].n || done[1] < p[1].n || done[2] < p[2].n); step++) {
        int n = 0, take[3];
        for (int k = 0; k < 3; k++) {
            take[k] = step < start[k] ? 0 : 1 + (int)(test_rand(&seed) % 7);
            if (take[k] > p[k].n - done[k]) take[k] = p[k].n - done[k];
        }
        /* round robin over the sequences: their tokens alternate inside the batch */
        for (int i = 0; i < 7; i++)
            for (int k = 0; k < 3; k++)
                if (i < take[k]) {
                    tok[n] = p[k].tokens[done[k] + i];
                    seq[n] = seq_id[k];
                    pos[n] = done[k] + i;
                    owner[n] = k;
                    want[n] = (test_rand(&seed) & 3) != 0;   /* some tokens do not ask */
                    n++;
                }
        if (!n) continue;
        quill_batch b = {n, tok, seq, pos, want};
        if (quill_decode(c, &b, logits, &err)) {
            test_fail(__FILE__, __LINE__, "%s", err.message);
            ok = false;
            break;
        }
        for (int i = 0, row = 0; i < n; i++) {
            if (!want[i]) continue;
            const float *got = logits + (size_t)row++ * nv, *exp = ref[owner[i]] + (size_t)pos[i] * nv;
            if (memcmp(got, exp, (size_t)nv * sizeof *got)) {
                test_fail(__FILE__, __LINE__,
                          "step %d, %d threads: sequence %d (id %d) position %d differs from the prompt alone", step,
                          threads, owner[i], seq[i], pos[i]);
                ok = false;
                break;
            }
        }
        for (int k = 0; k < 3; k++) done[k] += take[k];
    }
    for (int k = 0; ok && k < 3; k++)
        if (quill_seq_len(c, seq_id[k]) != p[k].n) {
            test_fail(__FILE__, __LINE__, "sequence %d holds %d positions, expected %d", seq_id[k],
                      quill_seq_len(c, seq_id[k]), p[k].n);
            ok = false;
        }
    free(tok);
    free(seq);
    free(pos);
    free(owner);
    free(want);
    free(logits);
    quill_context_free(c);
    return ok;
}

static void check_model(const char *model_path, const prompt *p) {
    quill_model *m;
    quill_error err;
    if (quill_model_load(model_path, &m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return;
    }
    float *ref[3] = {NULL, NULL, NULL};
    bool ok = true;
    for (int k = 0; k < 3 && ok; k++) ok = (ref[k] = alone(m, &p[k], 2)) != NULL;
    const int starts[][3] = {{0, 0, 0}, {0, 2, 5}, {3, 0, 1}};
    const int ids[][3] = {{0, 1, 2}, {4, 2, 0}, {1, 3, 4}};
    for (int t = 1; t <= 2 && ok; t++)
        for (int v = 0; v < 3 && ok; v++) ok = interleaved(m, p, starts[v], ids[v], t, 0x5eed + (uint64_t)v * 77, ref);
    for (int k = 0; k < 3; k++) free(ref[k]);
    quill_model_free(m);
}

/* Three golden prompts of stories260K (F32 weights), interleaved with different lengths and
 * start steps, against each alone; 1 and 2 threads. */
TEST(batch_interleaved_golden_prompts_f32) {
    REQUIRE_SHARED(shared);
    const char *names[3] = {"s260-once", "s260-lily", "s260-long"};
    golden_case gc[3];
    int loaded = 0;
    for (; loaded < 3; loaded++)
        if (!golden_load(shared, names[loaded], &gc[loaded])) break;
    if (loaded == 3) {
        prompt p[3];
        for (int k = 0; k < 3; k++) p[k] = (prompt){gc[k].prompt_tokens, (int)gc[k].n_prompt};
        CHECK(p[0].n != p[1].n && p[1].n != p[2].n, "the cases should differ in length");
        check_model(gc[0].model_path, p);
    }
    for (int k = 0; k < loaded; k++) golden_free(&gc[k]);
}

/* The chat and plain prompts of synth-32k-q4_k_m, and the plain one's first half. */
static void check_synth_32k(const char *shared) {
    golden_case chat, plain;
    bool ok = golden_load(shared, "synth-32k-q4_k_m-chat", &chat);
    ok = golden_load(shared, "synth-32k-q4_k_m-plain", &plain) && ok;
    if (ok) {
        prompt p[3] = {{chat.prompt_tokens, (int)chat.n_prompt},
                       {plain.prompt_tokens, (int)plain.n_prompt},
                       {plain.prompt_tokens, (int)plain.n_prompt / 2}};
        check_model(chat.model_path, p);
    }
    golden_free(&chat);
    golden_free(&plain);
}

/* The same on quantized weights (the exact integer products, 16-token tiles on AMX). */
TEST(batch_interleaved_golden_prompts_q4_k_m) {
    REQUIRE_SHARED(shared);
    check_synth_32k(shared);
}

/* With the KV cache in each other type (keys and values rounded when stored, decoded block by
 * block when read) the contract holds as in f32. stories260K's heads of 8 take only f16 and bf16
 * (blocks of 32 do not divide them); synth-k (heads of 32, the same vocabulary, q4_0 weights)
 * reads the same prompts (up to 236 tokens: several key blocks) with every type, mixed too. */
TEST(batch_interleaved_with_every_cache_type) {
    REQUIRE_SHARED(shared);
    golden_case gc[3];
    const char *names[3] = {"s260-once", "s260-lily", "s260-long"};
    int loaded = 0;
    for (; loaded < 3; loaded++)
        if (!golden_load(shared, names[loaded], &gc[loaded])) break;
    char *synth = path_join(shared, "models/synth-k-q4_0.gguf");
    const quill_type types[][2] = {{QUILL_TYPE_F16, QUILL_TYPE_F16},   {QUILL_TYPE_BF16, QUILL_TYPE_BF16},
                                   {QUILL_TYPE_Q8_0, QUILL_TYPE_Q8_0}, {QUILL_TYPE_Q4_0, QUILL_TYPE_Q4_0},
                                   {QUILL_TYPE_F16, QUILL_TYPE_Q4_0},  {QUILL_TYPE_Q8_0, QUILL_TYPE_F32}};
    for (size_t i = 0; loaded == 3 && i < sizeof types / sizeof types[0]; i++) {
        cache_k = types[i][0];
        cache_v = types[i][1];
        prompt p[3];
        for (int k = 0; k < 3; k++) p[k] = (prompt){gc[k].prompt_tokens, (int)gc[k].n_prompt};
        if (i < 2) check_model(gc[0].model_path, p);
        check_model(synth, p);
    }
    free(synth);
    for (int k = 0; k < loaded; k++) golden_free(&gc[k]);
    cache_k = cache_v = QUILL_TYPE_F32;
}

/* Truncating a sequence and copying a prefix into another one give the logits of evaluating
 * from scratch; a bad batch is refused and changes nothing. */
static void sequence_operations(const char *shared, const char *model) {
    golden_case gc;
    if (!golden_load(shared, "s260-long", &gc)) {
        golden_free(&gc);
        return;
    }
    quill_model *m = NULL;
    quill_context *c = NULL;
    quill_error err;
    float *ref = NULL, *l = NULL;
    const int n = (int)gc.n_prompt, half = n / 2;
    char *path = model ? path_join(shared, model) : NULL;
    const quill_status loaded = quill_model_load(path ? path : gc.model_path, &m, &err);
    free(path);
    CHECK(loaded == QUILL_OK, "%s", err.message);
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    prompt p = {gc.prompt_tokens, n};
    ref = alone(m, &p, 2);
    quill_context_params cp = {.n_ctx = 256, .n_threads = 2, .n_seq = 3, .type_k = cache_k, .type_v = cache_v};
    bool ok = ref && quill_context_new(m, &cp, &c, &err) == QUILL_OK && (l = malloc((size_t)n * nv * sizeof *l));
    if (ok) {
        /* sequence 2 reads the whole prompt; 1 gets a copy of its first half and reads the rest */
        int32_t seq[512], pos[512];
        CHECK(n <= 512);
        for (int i = 0; i < n; i++) seq[i] = 2, pos[i] = i;
        quill_batch b = {n, gc.prompt_tokens, seq, pos, NULL};
        ok = quill_decode(c, &b, l, &err) == QUILL_OK && !memcmp(l, ref + (size_t)(n - 1) * nv, (size_t)nv * sizeof *l);
        if (ok) ok = quill_seq_copy_prefix(c, 2, 1, half, &err) == QUILL_OK && quill_seq_len(c, 1) == half;
        for (int i = half; ok && i < n; i++) seq[i] = 1;
        quill_batch rest = {n - half, gc.prompt_tokens + half, seq + half, pos + half, NULL};
        if (ok) ok = quill_decode(c, &rest, l, &err) == QUILL_OK;
        if (ok) ok = !memcmp(l, ref + (size_t)(n - 1) * nv, (size_t)nv * sizeof *l);
        if (!ok) test_fail(__FILE__, __LINE__, "copy_prefix: %s", err.message);
        /* truncate 2 to 3 positions and read again from there: a position below the length
         * truncates implicitly too */
        quill_seq_truncate(c, 2, 3);
        if (ok) ok = quill_seq_len(c, 2) == 3;
        for (int i = 0; i < n; i++) seq[i] = 2;
        quill_batch again = {n - 3, gc.prompt_tokens + 3, seq + 3, pos + 3, NULL};
        if (ok) ok = quill_decode(c, &again, l, &err) == QUILL_OK &&
                     !memcmp(l, ref + (size_t)(n - 1) * nv, (size_t)nv * sizeof *l);
        quill_batch implicit = {n - 5, gc.prompt_tokens + 5, seq + 5, pos + 5, NULL};
        if (ok) ok = quill_decode(c, &implicit, l, &err) == QUILL_OK &&
                     !memcmp(l, ref + (size_t)(n - 1) * nv, (size_t)nv * sizeof *l);
        if (!ok) test_fail(__FILE__, __LINE__, "truncate: %s", err.message);
        /* refused: a gap, an unknown sequence, a position past the context; nothing changes */
        const int len0 = quill_seq_len(c, 0);
        int32_t t2[2] = {gc.prompt_tokens[0], gc.prompt_tokens[1]}, s2[2] = {0, 0}, p2[2] = {0, 2};
        quill_batch gap = {2, t2, s2, p2, NULL};
        if (ok) ok = quill_decode(c, &gap, l, &err) == QUILL_E_ARG && strstr(err.message, "does not follow on");
        s2[1] = 3;
        p2[1] = 0;
        quill_batch bad_seq = {2, t2, s2, p2, NULL};
        if (ok) ok = quill_decode(c, &bad_seq, l, &err) == QUILL_E_ARG && strstr(err.message, "sequence id 3");
        if (ok) ok = quill_seq_len(c, 0) == len0 && quill_seq_copy_prefix(c, 0, 1, 5, &err) == QUILL_E_ARG;
        if (!ok) test_fail(__FILE__, __LINE__, "refusals: %s", err.message);
    }
    free(l);
    free(ref);
    quill_context_free(c);
    quill_model_free(m);
    golden_free(&gc);
}

/* Gemma 4's per-layer features keep the promise: heads of two sizes, layers reading an earlier
 * layer's cache, per-layer inputs (a random model from quill synth: 9 layers, window 5, 3 shared
 * layers). Three prompts, one longer than a micro-batch, interleaved against each alone; then a
 * copied prefix continued in another sequence against the prompt alone. */
TEST(batch_interleaved_gemma4) {
    REQUIRE_SHARED(shared);
    char path[512], cmd[1536], *out = NULL;
    snprintf(path, sizeof path, "%s/batch-gemma4.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd,
             "%s synth --arch gemma4 --layers 9 --swa-pattern 3 --shared-kv 3 --window 5 --embd 128 --heads 4 "
             "--kv-heads 2 --ff 256 --per-layer-input 32 --seed 5 --vocab %s/models/stories260K.gguf --type f32 -o %s",
             quill_bin(), shared, path);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "synth: exit %d: %s", rc, out);
    free(out);
    if (rc) return;
    int32_t tokens[3][80];
    uint64_t seed = 99;
    for (int k = 0; k < 3; k++)
        for (int i = 0; i < 80; i++) tokens[k][i] = (int32_t)(1 + test_rand(&seed) % 500);
    const prompt p[3] = {{tokens[0], 70}, {tokens[1], 23}, {tokens[2], 9}};
    check_model(path, p);
    /* and with the cache in q8_0 keys and q4_0 values (shared layers read their source's) */
    cache_k = QUILL_TYPE_Q8_0;
    cache_v = QUILL_TYPE_Q4_0;
    check_model(path, p);
    cache_k = cache_v = QUILL_TYPE_F32;

    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(path, &m, &err)) {
        CHECK(false, "%s", err.message);
        remove(path);
        return;
    }
    float *ref = alone(m, &p[0], 2);
    quill_context_params cp = {.n_ctx = 256, .n_threads = 2, .n_seq = 2};
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    float *rest = malloc((size_t)(p[0].n - 30) * nv * sizeof *rest);
    if (ref && rest && !quill_context_new(m, &cp, &c, &err)) {
        bool ok = !quill_eval(c, p[0].tokens, 40, NULL, false, &err) && !quill_seq_copy_prefix(c, 0, 1, 30, &err);
        int32_t seq1[80], pos[80];
        for (int i = 30; i < p[0].n; i++) seq1[i - 30] = 1, pos[i - 30] = i;
        quill_batch b = {p[0].n - 30, p[0].tokens + 30, seq1, pos, NULL};
        bool want[80];
        for (int i = 0; i < 80; i++) want[i] = true;
        b.logits = want;
        ok = ok && !quill_decode(c, &b, rest, &err);
        CHECK(ok, "%s", err.message);
        CHECK(!ok || !memcmp(rest, ref + (size_t)30 * nv, (size_t)(p[0].n - 30) * nv * sizeof *rest),
              "a prefix copied into sequence 1 and continued differs from the prompt alone");
        quill_context_free(c);
    }
    free(rest);
    free(ref);
    quill_model_free(m);
    remove(path);
}

TEST(batch_sequence_operations) {
    REQUIRE_SHARED(shared);
    sequence_operations(shared, NULL);
}

/* The same with the cache in q8_0 and q4_0 (whole key blocks and value rows copied in their
 * bytes) and f16 keys with bf16 values, on synth-k (stories260K's vocabulary, heads of 32). */
TEST(batch_sequence_operations_with_cache_types) {
    REQUIRE_SHARED(shared);
    const quill_type types[][2] = {{QUILL_TYPE_Q8_0, QUILL_TYPE_Q8_0}, {QUILL_TYPE_Q4_0, QUILL_TYPE_Q4_0},
                                   {QUILL_TYPE_F16, QUILL_TYPE_BF16}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        cache_k = types[i][0];
        cache_v = types[i][1];
        sequence_operations(shared, "models/synth-k-q8_0.gguf");
    }
    cache_k = cache_v = QUILL_TYPE_F32;
}
