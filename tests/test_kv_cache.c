/* The KV cache's types (-ctk / -ctv): the rounding of stored keys and values against the
 * reference's CPU cache, the key block decoders of every kernel set against the scalar ones, the
 * float64 path's model of the rounding, and the refusals and messages. The batch, thread and
 * sequence contract with each type is in test_batch.c and test_hybrid.c. */
#include "golden.h"
#include "test.h"

#include "kernels/kernels.h"
#include "model/context.h"
#include "model/kv_cache.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x5EEDC0FFEEull;

static const uint32_t kv_types[] = {QUILL_TYPE_F32, QUILL_TYPE_F16, QUILL_TYPE_BF16, QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_0};

/* Keys of KEY_BLOCK positions with head size hd, stored one position at a time in random order;
 * the values of a row scaled per block of 32 by up to 2^±6, with some exact ties for q8_0's
 * rounding. */
static void random_rows(float *x, int n, int64_t hd) {
    for (int p = 0; p < n; p++)
        for (int64_t g = 0; g < hd / 32; g++) {
            const float scale = ldexpf(1.0f, (int)(test_rand(&rng) % 13) - 6);
            for (int j = 0; j < 32; j++) x[(size_t)p * hd + g * 32 + j] = test_randf(&rng) * scale;
        }
}

/* What the reference's x86 CPU cache stores for 32 values in q8_0 (ggml-cpu's AVX quantize_row_q8_0,
 * which its set_rows calls): d = max/127 in f16, codes round-half-even(x · (127/max)). Written out
 * again here from its definition, independently of kv_cache.c. */
static void q8_0_x86(const float *x, uint16_t *d, int8_t *q) {
    float m = 0;
    for (int j = 0; j < 32; j++) m = fmaxf(m, fabsf(x[j]));
    *d = quill_f32_to_f16(m / 127.0f);
    const float id = m != 0 ? 127.0f / m : 0;
    for (int j = 0; j < 32; j++) q[j] = (int8_t)lrintf(x[j] * id);
}

TEST(kv_cache_stores_round_as_the_reference_cache) {
    const int64_t hd = 128;
    float x[128];
    for (int trial = 0; trial < 200; trial++) {
        random_rows(x, 1, hd);
        if (trial == 0) {
            /* a tie: 0.5 / 127 of the maximum is code 0.5, which half-to-even makes 0 and
             * round-half-away 1 (the reference's portable quantizer, which its CPU cache does not use) */
            for (int j = 0; j < 32; j++) x[j] = 0;
            x[0] = 127.0f;
            x[1] = 0.5f;
            x[2] = 2.5f;
        }
        uint8_t row[128 * 4];
        /* f16 and bf16: round to nearest even, element by element */
        quill_kv_store_value(QUILL_TYPE_F16, row, x, hd);
        for (int64_t i = 0; i < hd; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            CHECK(h == quill_f32_to_f16(x[i]), "f16 element %lld", (long long)i);
        }
        quill_kv_store_value(QUILL_TYPE_BF16, row, x, hd);
        for (int64_t i = 0; i < hd; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            CHECK(h == quill_f32_to_bf16(x[i]), "bf16 element %lld", (long long)i);
        }
        /* q8_0: the x86 path's blocks */
        quill_kv_store_value(QUILL_TYPE_Q8_0, row, x, hd);
        for (int64_t g = 0; g < hd / 32; g++) {
            block_q8_0 want;
            q8_0_x86(x + g * 32, &want.d, want.qs);
            CHECK(!memcmp(row + g * sizeof want, &want, sizeof want), "trial %d: q8_0 block %lld differs", trial,
                  (long long)g);
        }
        if (trial == 0) {
            const block_q8_0 *b = (const block_q8_0 *)row;
            CHECK(b->qs[0] == 127 && b->qs[1] == 0 && b->qs[2] == 2, "the ties: %d %d %d", b->qs[0], b->qs[1], b->qs[2]);
        }
        /* q4_0: the reference's quantize_row_q4_0 (quill quantize writes its bytes) */
        uint8_t want4[128 * 4];
        quill_from_float_q4_0(x, want4, hd / 32);
        quill_kv_store_value(QUILL_TYPE_Q4_0, row, x, hd);
        CHECK(!memcmp(row, want4, quill_row_size(QUILL_TYPE_Q4_0, hd)), "trial %d: q4_0 row differs", trial);
    }
}

/* A key block holds the values its positions' value rows would (the same rounding, transposed),
 * and every kernel set decodes it to the scalar set's bits. */
TEST(kv_cache_key_blocks_decode_alike_on_every_set) {
    const int64_t sizes[] = {32, 64, 128, 256};
    const char *isas[] = {"avx2", "avx512", "vnni", "amx"};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t hd = sizes[si];
        float *x = malloc((size_t)(KEY_BLOCK * hd) * sizeof *x), *want = malloc((size_t)(KEY_BLOCK * hd) * sizeof *want);
        float *tile = malloc((size_t)(KEY_BLOCK * hd) * sizeof *tile), *fast = malloc((size_t)(KEY_BLOCK * hd) * sizeof *fast);
        uint8_t *block = malloc((size_t)KEY_BLOCK * (size_t)hd * 4), *row = malloc((size_t)hd * 4);
        random_rows(x, KEY_BLOCK, hd);
        for (size_t ti = 0; ti < sizeof kv_types / sizeof kv_types[0]; ti++) {
            const uint32_t type = kv_types[ti];
            memset(block, 0xA5, (size_t)KEY_BLOCK * (size_t)hd * 4);
            /* positions stored out of order, as parallel tokens store them */
            for (int i = 0; i < KEY_BLOCK; i++) {
                const int p = (i * 37 + 5) % KEY_BLOCK;
                quill_kv_store_key(type, block, p, x + (size_t)p * hd, hd);
                quill_kv_store_value(type, row, x + (size_t)p * hd, hd);
                quill_type_traits_of(type)->to_float(row, want + (size_t)p * hd, hd);
            }
            const float *keys = quill_kv_key_block(quill_kernels_scalar(), type, block, hd, tile);
            bool same = true;
            for (int p = 0; p < KEY_BLOCK; p++)
                for (int64_t d = 0; d < hd; d++) same &= keys[d * KEY_BLOCK + p] == want[(size_t)p * hd + d];
            CHECK(same, "%s keys of %lld: the scalar decoder does not give the stored values", quill_type_name(type),
                  (long long)hd);
            memcpy(fast, keys, (size_t)(KEY_BLOCK * hd) * sizeof *fast);
            for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
                const quill_kernels *kern = quill_kernels_for(isas[k]);
                if (!kern) continue; /* (test_kernels.c reports the sets this CPU lacks) */
                const float *got = quill_kv_key_block(kern, type, block, hd, tile);
                CHECK(!memcmp(got, fast, (size_t)(KEY_BLOCK * hd) * sizeof *got), "%s: %s keys of %lld differ", isas[k],
                      quill_type_name(type), (long long)hd);
                /* value rows: the set's dequantizer (the encoded row of position 0 three times) */
                for (int r = 0; r < 3; r++) quill_kv_store_value(type, block + (size_t)r * quill_row_size(type, hd), x, hd);
                const float *vals = quill_kv_value_rows(kern, type, block, 3, hd, tile);
                for (int r = 0; r < 3; r++)
                    CHECK(!memcmp(vals + r * hd, want, (size_t)hd * sizeof *vals), "%s: %s value row %d differs", isas[k],
                          quill_type_name(type), r);
                for (int i = 0; i < KEY_BLOCK; i++) quill_kv_store_key(type, block, i, x + (size_t)i * hd, hd);
            }
        }
        free(x), free(want), free(tile), free(fast), free(block), free(row);
    }
}

/* Logits of a prompt with the cache in (k, v), fast or float64. */
static float *prompt_logits(const char *model, const int32_t *tokens, int n, bool reference, quill_type k, quill_type v) {
    quill_model *m;
    quill_context *c;
    quill_error err;
    if (quill_model_load(model, &m, &err)) {
        test_fail(__FILE__, __LINE__, "%s", err.message);
        return NULL;
    }
    quill_context_params cp = {.n_ctx = 128, .n_threads = 2, .reference = reference, .type_k = k, .type_v = v};
    float *l = NULL;
    if (quill_context_new(m, &cp, &c, &err) == QUILL_OK) {
        l = malloc((size_t)n * (size_t)quill_model_hparams(m)->n_vocab * sizeof *l);
        if (l && quill_eval(c, tokens, n, l, true, &err)) free(l), l = NULL;
        quill_context_free(c);
    }
    if (!l) test_fail(__FILE__, __LINE__, "%s", err.message);
    quill_model_free(m);
    return l;
}

static double rms_diff(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
    return sqrt(s / (double)n);
}

/* The float64 path rounds the cached keys and values as the fast path stores them: with a q4_0,
 * q8_0 or bf16 cache the fast logits are over 20x closer to the float64 logits of the same cache
 * than to those of an f32 cache (what the rounding adds). */
TEST(kv_cache_float64_path_models_the_rounding) {
    REQUIRE_SHARED(shared);
    golden_case gc;
    if (!golden_load(shared, "s260-long", &gc)) {
        golden_free(&gc);
        return;
    }
    char *model = path_join(shared, "models/synth-k-f32.gguf");
    const int n = 80 < (int)gc.n_prompt ? 80 : (int)gc.n_prompt;
    const size_t len = (size_t)n * 512;
    float *fast32 = prompt_logits(model, gc.prompt_tokens, n, false, QUILL_TYPE_F32, QUILL_TYPE_F32);
    float *ref32 = prompt_logits(model, gc.prompt_tokens, n, true, QUILL_TYPE_F32, QUILL_TYPE_F32);
    const quill_type types[] = {QUILL_TYPE_Q4_0, QUILL_TYPE_Q8_0, QUILL_TYPE_BF16};
    for (size_t i = 0; fast32 && ref32 && i < sizeof types / sizeof types[0]; i++) {
        float *fast = prompt_logits(model, gc.prompt_tokens, n, false, types[i], types[i]);
        float *ref = prompt_logits(model, gc.prompt_tokens, n, true, types[i], types[i]);
        if (fast && ref) {
            const double own = rms_diff(fast, ref, len), exact = rms_diff(fast32, ref32, len);
            const double rounding = rms_diff(fast, ref32, len);
            /* (not as close as f32 to f32's: where the fast path's f32 key and the rounded double
             * lie on either side of a rounding boundary, a code differs by one step) */
            CHECK(own * 20 < rounding && exact < own + 1e-6,
                  "%s cache: fast vs float64 of the same cache %.3g, f32 vs float64 %.3g, vs float64 of an f32 cache %.3g",
                  quill_type_name(types[i]), own, exact, rounding);
        }
        free(fast);
        free(ref);
    }
    free(fast32);
    free(ref32);
    free(model);
    golden_free(&gc);
}

TEST(kv_cache_types_refused_and_named) {
    REQUIRE_SHARED(shared);
    quill_error err;
    quill_type t;
    CHECK(quill_cache_type_parse("q8_0", &t, &err) == QUILL_OK && t == QUILL_TYPE_Q8_0);
    CHECK(quill_cache_type_parse("bf16", &t, &err) == QUILL_OK && t == QUILL_TYPE_BF16);
    CHECK_EQ_INT(quill_cache_type_parse("Q8_0", &t, &err), QUILL_E_ARG); /* the reference's names are lower case */
    CHECK_EQ_INT(quill_cache_type_parse("q4_1", &t, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "f32, f16, bf16, q8_0, q4_0");
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *m;
    quill_context *c = NULL;
    CHECK(quill_model_load(path, &m, &err) == QUILL_OK, "%s", err.message);
    free(path);
    /* heads of 8: no room for blocks of 32 */
    quill_context_params p = {.n_ctx = 64, .n_threads = 1, .type_v = QUILL_TYPE_Q4_0};
    CHECK_EQ_INT(quill_context_new(m, &p, &c, &err), QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "V cache type q4_0");
    CHECK_STR_CONTAINS(err.message, "head size 8");
    p = (quill_context_params){.n_ctx = 64, .n_threads = 1, .type_k = QUILL_TYPE_Q4_K};
    CHECK_EQ_INT(quill_context_new(m, &p, &c, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "-ctk");
    /* the estimate: keys in whole blocks of 64 positions, values per position; 5 layers, 4 KV
     * heads of 8 */
    p = (quill_context_params){.n_ctx = 100, .type_k = QUILL_TYPE_F16, .type_v = QUILL_TYPE_BF16};
    CHECK(quill_context_kv_bytes(m, &p) == 5.0 * 4 * (128 * 8 * 2 + 100 * 8 * 2), "%g", quill_context_kv_bytes(m, &p));
    p.type_k = p.type_v = QUILL_TYPE_F32;
    CHECK(quill_context_kv_bytes(m, &p) == 5.0 * 4 * (128 * 8 * 4 + 100 * 8 * 4));
    /* out of memory: the message names the types and what each would take */
    p = (quill_context_params){.n_ctx = 1 << 24, .n_seq = 4096, .n_threads = 1, .type_k = QUILL_TYPE_F16};
    quill_status st = quill_context_new(m, &p, &c, &err);
    if (st == QUILL_OK) {
        quill_context_free(c);
    } else {
        CHECK_EQ_INT(st, QUILL_E_NOMEM);
        CHECK_STR_CONTAINS(err.message, "with -ctk f16 -ctv f32");
        CHECK_STR_CONTAINS(err.message, "bf16 ");
        CHECK_STR_CONTAINS(err.message, "-ctk/-ctv");
        CHECK(!strstr(err.message, "q8_0"), "%s", err.message); /* (not for heads of 8) */
    }
    quill_model_free(m);
}

/* Every command that makes a context takes -ctk/-ctv with the reference's names and refuses
 * others, listing them. */
TEST(kv_cache_cli_flags) {
    REQUIRE_SHARED(shared);
    const char *cmds[] = {"run -p hi -n 1", "chat", "bench -p 8 -n 0 -r 1", "perplexity -f /dev/null", "serve --port 0"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char cmd[1024], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s %s -m %s/models/stories260K.gguf -ctk q4_1 </dev/null", quill_bin(), cmds[i], shared);
        const int rc = run_cmd(cmd, &out, true);
        CHECK(rc != 0 && out && strstr(out, "f32, f16, bf16, q8_0, q4_0") && strstr(out, "q4_1"),
              "%s: exit %d: %.500s", cmds[i], rc, out ? out : "");
        free(out);
    }
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s run -m %s/models/stories260K.gguf -p 'Once upon a time' -n 12 --temp 0 --cache-type-k f16 "
             "--cache-type-v=bf16 --no-display-prompt 2>/dev/null",
             quill_bin(), shared);
    CHECK(run_cmd(cmd, &out, false) == 0 && out && strstr(out, "there was a little girl"), "%.500s", out ? out : "");
    free(out);
    snprintf(cmd, sizeof cmd, "%s bench -m %s/models/synth-k-q4_0.gguf -p 16 -n 4 -r 1 -ctk q8_0 -ctv q4_0 --bw-mib 16 --json",
             quill_bin(), shared);
    out = NULL;
    CHECK(run_cmd(cmd, &out, false) == 0 && out && strstr(out, "\"cache_type_k\": \"q8_0\"") &&
              strstr(out, "\"cache_type_v\": \"q4_0\""),
          "%.800s", out ? out : "");
    free(out);
}
