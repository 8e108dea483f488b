/* Embeddings (quill_embed): the pooled final hidden states of a random-weight Qwen 3 model against
 * the reference's own `result_norm` for the same tokens (refdump's trace), for mean, cls and last
 * pooling, normalised and not; and the bad arguments. */
#include "test.h"

#include "quill_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The reference's result_norm ([n][d] floats, malloc'd) from a refdump trace.bin. */
static float *read_result_norm(const char *path, int64_t *d, int64_t *n) {
    size_t size;
    unsigned char *buf = read_file(path, &size);
    if (!buf) return NULL;
    float *out = NULL;
    size_t at = 0;
    while (at + 4 <= size) {
        uint32_t len;
        memcpy(&len, buf + at, 4);
        at += 4;
        if (at + len + 32 > size) break;
        char name[128];
        snprintf(name, sizeof name, "%.*s", (int)(len < 127 ? len : 127), (const char *)buf + at);
        at += len;
        int64_t ne[4];
        memcpy(ne, buf + at, 32);
        at += 32;
        size_t count = (size_t)(ne[0] * ne[1] * ne[2] * ne[3]);
        if (at + count * 4 > size) break;
        if (!strcmp(name, "result_norm")) {
            free(out);
            out = malloc(count * sizeof *out);
            if (out) memcpy(out, buf + at, count * 4);
            *d = ne[0];
            *n = ne[1];
        }
        at += count * 4;
    }
    free(buf);
    return out;
}

TEST(embed_matches_the_reference_hidden_states) {
    REQUIRE_SHARED(shared);
    char model[512], prefix[512], cmd[2048], *out = NULL;
    snprintf(model, sizeof model, "%s/embed-qwen3-f32.gguf", tmp_dir());
    snprintf(prefix, sizeof prefix, "%s/embed-qwen3-ref", tmp_dir());
    static const int32_t tokens[] = {9707, 11, 1879, 0, 358, 1079, 264, 1273, 315, 4345, 13};
    const int n = (int)(sizeof tokens / sizeof tokens[0]);
    snprintf(cmd, sizeof cmd,
             "%s synth --arch qwen3 --embd 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --type f32 "
             "--vocab %s/tokenizer/ggml-vocab-qwen3.gguf -o %s && OMP_WAIT_POLICY=PASSIVE %s/ref/bin/refdump %s %s 0 - - 1 "
             "--tokens 9707,11,1879,0,358,1079,264,1273,315,4345,13",
             quill_bin(), shared, model, shared, model, prefix);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "making the case failed: %s", out);
    free(out);
    char trace[600];
    snprintf(trace, sizeof trace, "%s.trace.bin", prefix);
    int64_t d = 0, rows = 0;
    float *ref = read_result_norm(trace, &d, &rows);
    CHECK(ref && rows == n && d == 64, "no result_norm of %d rows in %s", n, trace);
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(model, &m, &err) == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_model_pooling(m), QUILL_POOLING_LAST);
    quill_context_params p = {.n_ctx = 64, .n_threads = 2};
    quill_context *c;
    CHECK(quill_context_new(m, &p, &c, &err) == QUILL_OK, "%s", err.message);
    float got[64], want[64];
    for (int pooling = QUILL_POOLING_MEAN; pooling <= QUILL_POOLING_LAST; pooling++)
        for (int normalize = 0; normalize < 2; normalize++) {
            double norm = 0;
            for (int64_t i = 0; i < d; i++) {
                double v = 0;
                if (pooling == QUILL_POOLING_MEAN) {
                    for (int t = 0; t < n; t++) v += ref[t * d + i];
                    v /= n;
                } else {
                    v = ref[(pooling == QUILL_POOLING_CLS ? 0 : n - 1) * d + i];
                }
                want[i] = (float)v;
                norm += v * v;
            }
            if (normalize)
                for (int64_t i = 0; i < d; i++) want[i] = (float)(want[i] / sqrt(norm));
            CHECK(quill_embed(c, m, tokens, n, (quill_pooling)pooling, normalize, got, &err) == QUILL_OK, "%s", err.message);
            double max_err = 0, scale = 0;
            for (int64_t i = 0; i < d; i++) {
                max_err = fmax(max_err, fabs(got[i] - want[i]));
                scale = fmax(scale, fabs(want[i]));
            }
            CHECK(max_err <= 1e-5 * scale, "pooling %d normalize %d: max error %g of %g", pooling, normalize, max_err, scale);
        }
    /* the context is left empty, and the same text embeds to the same bits */
    CHECK_EQ_INT(quill_context_pos(c), 0);
    float again[64];
    CHECK(quill_embed(c, m, tokens, n, QUILL_POOLING_LAST, true, again, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_embed(c, m, tokens, n, QUILL_POOLING_LAST, true, got, &err) == QUILL_OK, "%s", err.message);
    CHECK(!memcmp(got, again, sizeof got), "two embeddings of one text differ");
    /* bad arguments */
    CHECK_EQ_INT(quill_embed(c, m, tokens, 0, QUILL_POOLING_LAST, true, got, &err), QUILL_E_ARG);
    CHECK_EQ_INT(quill_embed(c, m, tokens, n, (quill_pooling)7, true, got, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "pooling");
    int32_t bad = 1 << 30;
    CHECK_EQ_INT(quill_embed(c, m, &bad, 1, QUILL_POOLING_LAST, true, got, &err), QUILL_E_ARG);
    quill_context_free(c);
    quill_model_free(m);
    free(ref);
    remove(model);
    remove(trace);
    char other[600];
    snprintf(other, sizeof other, "%s.json", prefix);
    remove(other);
    snprintf(other, sizeof other, "%s.logits.f32", prefix);
    remove(other);
}
