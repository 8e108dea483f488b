/* Tensor types: the layout table, half/bfloat conversions and bit-exact dequantization against
 * the reference implementation's output. */
#include "test.h"

#include "quill.h"

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* ---------------------------------------------------------------- half conversions */

/* The value a half encodes, computed by a route independent of the bit tricks under test. */
static double f16_reference(uint16_t h) {
    int sign = h >> 15, exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
    double v;
    if (exp == 0x1F) v = mant ? NAN : INFINITY;
    else if (exp == 0) v = ldexp(mant, -24);
    else v = ldexp(1024 + mant, exp - 25);
    return sign ? -v : v;
}

TEST(types_f16_to_f32_all_values) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quill_f16_to_f32((uint16_t)h);
        double want = f16_reference((uint16_t)h);
        if (isnan(want)) {
            CHECK(isnan(f), "half 0x%04x should be NaN", h);
            CHECK((f32_bits(f) >> 31) == (h >> 15), "half 0x%04x NaN sign", h);
        } else {
            CHECK((double)f == want, "half 0x%04x -> %.9g, expected %.9g", h, (double)f, want);
            CHECK((f32_bits(f) >> 31) == (h >> 15), "half 0x%04x sign (signed zero)", h);
        }
    }
}

TEST(types_f16_round_trip_all_values) {
    for (uint32_t h = 0; h < 65536; h++) {
        uint16_t back = quill_f32_to_f16(quill_f16_to_f32((uint16_t)h));
        CHECK(back == h, "half 0x%04x came back as 0x%04x", h, back);
    }
}

TEST(types_bf16_round_trip_all_values) {
    for (uint32_t h = 0; h < 65536; h++) {
        float f = quill_bf16_to_f32((uint16_t)h);
        CHECK(f32_bits(f) == h << 16, "bf16 0x%04x -> 0x%08x", h, f32_bits(f));
        uint16_t back = quill_f32_to_bf16(f);
        CHECK(back == h, "bf16 0x%04x came back as 0x%04x", h, back);
    }
}

/* Every pair of adjacent finite halves of both signs: the exact midpoint rounds to the even one,
 * one float ulp either side rounds to the nearer one. This covers subnormals, the normal/subnormal
 * boundary, exponent carries and overflow to infinity. */
TEST(types_f32_to_f16_rounding_ties) {
    for (uint32_t s = 0; s < 2; s++) {
        for (uint32_t h = 0; h < 0x7C00; h++) {
            uint16_t lo = (uint16_t)(h | s << 15), hi = (uint16_t)((h + 1) | s << 15);
            double a = fabs(f16_reference(lo));
            /* past the largest half, the next step would be 65536, where infinity begins */
            double b = h + 1 == 0x7C00 ? 65536.0 : fabs(f16_reference(hi));
            float mid = (float)((a + b) / 2);
            CHECK((double)mid == (a + b) / 2, "midpoint of 0x%04x not exact", h);
            if (s) mid = -mid;
            float below = nextafterf(mid, 0.0f), above = nextafterf(mid, s ? -INFINITY : INFINITY);
            uint16_t even = (h & 1) ? hi : lo;
            CHECK(quill_f32_to_f16(mid) == even, "tie above 0x%04x gave 0x%04x", lo, quill_f32_to_f16(mid));
            CHECK(quill_f32_to_f16(below) == lo, "just below tie of 0x%04x gave 0x%04x", lo, quill_f32_to_f16(below));
            CHECK(quill_f32_to_f16(above) == hi, "just above tie of 0x%04x gave 0x%04x", lo, quill_f32_to_f16(above));
        }
    }
    /* spot values worth naming */
    CHECK_EQ_INT(quill_f32_to_f16(1.0f), 0x3C00);
    CHECK_EQ_INT(quill_f32_to_f16(-2.0f), 0xC000);
    CHECK_EQ_INT(quill_f32_to_f16(65504.0f), 0x7BFF);
    CHECK_EQ_INT(quill_f32_to_f16(65519.996f), 0x7BFF);
    CHECK_EQ_INT(quill_f32_to_f16(65520.0f), 0x7C00);
    CHECK_EQ_INT(quill_f32_to_f16(1e10f), 0x7C00);
    CHECK_EQ_INT(quill_f32_to_f16(-INFINITY), 0xFC00);
    CHECK_EQ_INT(quill_f32_to_f16(1e-30f), 0x0000);
    CHECK_EQ_INT(quill_f32_to_f16(-1e-30f), 0x8000);
    CHECK_EQ_INT(quill_f32_to_f16(bits_f32(1)), 0x0000);           /* float subnormal */
    CHECK_EQ_INT(quill_f32_to_f16(ldexpf(1.0f, -24)), 0x0001);     /* smallest half subnormal */
    CHECK_EQ_INT(quill_f32_to_f16(ldexpf(1.0f, -25)), 0x0000);     /* its half: tie to even 0 */
    CHECK_EQ_INT(quill_f32_to_f16(ldexpf(1.5f, -25)), 0x0001);
    CHECK_EQ_INT(quill_f32_to_f16(ldexpf(1.0f, -14)), 0x0400);     /* smallest normal */
    uint16_t n = quill_f32_to_f16(NAN);
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x3FF) != 0, "NaN became 0x%04x", n);
    /* a NaN whose payload lives only in the low bits must not turn into infinity */
    n = quill_f32_to_f16(bits_f32(0x7F800001));
    CHECK((n & 0x7C00) == 0x7C00 && (n & 0x3FF) != 0, "low-payload NaN became 0x%04x", n);
}

TEST(types_f32_to_bf16_rounding_ties) {
    for (uint32_t s = 0; s < 2; s++) {
        for (uint32_t h = 0; h < 0x7F80; h++) {
            uint32_t base = (h | s << 15) << 16;
            uint16_t lo = (uint16_t)(h | s << 15), hi = (uint16_t)((h + 1) | s << 15);
            uint16_t even = (h & 1) ? hi : lo;
            CHECK(quill_f32_to_bf16(bits_f32(base | 0x8000)) == even, "tie above bf16 0x%04x", lo);
            CHECK(quill_f32_to_bf16(bits_f32(base | 0x7FFF)) == lo, "below tie of bf16 0x%04x", lo);
            CHECK(quill_f32_to_bf16(bits_f32(base | 0x8001)) == hi, "above tie of bf16 0x%04x", lo);
        }
    }
    CHECK_EQ_INT(quill_f32_to_bf16(1.0f), 0x3F80);
    CHECK_EQ_INT(quill_f32_to_bf16(FLT_MAX), 0x7F80); /* rounds up past the largest bf16 */
    CHECK_EQ_INT(quill_f32_to_bf16(INFINITY), 0x7F80);
    uint16_t n = quill_f32_to_bf16(bits_f32(0x7F800001));
    CHECK((n & 0x7F80) == 0x7F80 && (n & 0x7F) != 0, "low-payload NaN became 0x%04x", n);
    n = quill_f32_to_bf16(bits_f32(0xFFFFFFFF));
    CHECK(n == 0xFFFF, "all-ones NaN became 0x%04x (must not carry into the sign)", n);
}

/* ---------------------------------------------------------------- the table */

static const struct { uint32_t id; const char *name; int64_t block; size_t size; bool decodes; } known[] = {
    {QUILL_TYPE_F32, "f32", 1, 4, true},         {QUILL_TYPE_F16, "f16", 1, 2, true},
    {QUILL_TYPE_Q4_0, "q4_0", 32, 18, true},     {QUILL_TYPE_Q4_1, "q4_1", 32, 20, true},
    {QUILL_TYPE_Q5_0, "q5_0", 32, 22, true},     {QUILL_TYPE_Q5_1, "q5_1", 32, 24, true},
    {QUILL_TYPE_Q8_0, "q8_0", 32, 34, true},     {QUILL_TYPE_Q8_1, "q8_1", 32, 36, false},
    {QUILL_TYPE_Q2_K, "q2_K", 256, 84, true},    {QUILL_TYPE_Q3_K, "q3_K", 256, 110, true},
    {QUILL_TYPE_Q4_K, "q4_K", 256, 144, true},   {QUILL_TYPE_Q5_K, "q5_K", 256, 176, true},
    {QUILL_TYPE_Q6_K, "q6_K", 256, 210, true},   {QUILL_TYPE_Q8_K, "q8_K", 256, 292, false},
    {QUILL_TYPE_IQ2_XXS, "iq2_xxs", 256, 66, true}, {QUILL_TYPE_IQ2_XS, "iq2_xs", 256, 74, true},
    {QUILL_TYPE_IQ3_XXS, "iq3_xxs", 256, 98, true}, {QUILL_TYPE_IQ1_S, "iq1_s", 256, 50, true},
    {QUILL_TYPE_IQ4_NL, "iq4_nl", 32, 18, true}, {QUILL_TYPE_IQ3_S, "iq3_s", 256, 110, true},
    {QUILL_TYPE_IQ2_S, "iq2_s", 256, 82, true}, {QUILL_TYPE_IQ4_XS, "iq4_xs", 256, 136, true},
    {QUILL_TYPE_I8, "i8", 1, 1, false},          {QUILL_TYPE_I16, "i16", 1, 2, false},
    {QUILL_TYPE_I32, "i32", 1, 4, false},        {QUILL_TYPE_I64, "i64", 1, 8, false},
    {QUILL_TYPE_F64, "f64", 1, 8, false},        {QUILL_TYPE_IQ1_M, "iq1_m", 256, 56, true},
    {QUILL_TYPE_BF16, "bf16", 1, 2, true},       {QUILL_TYPE_TQ1_0, "tq1_0", 256, 54, true},
    {QUILL_TYPE_TQ2_0, "tq2_0", 256, 66, true}, {QUILL_TYPE_MXFP4, "mxfp4", 32, 17, true},
    {QUILL_TYPE_NVFP4, "nvfp4", 64, 36, true},  {QUILL_TYPE_Q1_0, "q1_0", 128, 18, true},
    {QUILL_TYPE_Q2_0, "q2_0", 64, 18, true},
};
#define N_KNOWN (sizeof known / sizeof known[0])

TEST(types_traits_table) {
    for (size_t i = 0; i < N_KNOWN; i++) {
        const quill_type_traits *t = quill_type_traits_of(known[i].id);
        CHECK(t != NULL, "type %u missing", known[i].id);
        CHECK(strcmp(t->name, known[i].name) == 0, "type %u named %s, expected %s", known[i].id, t->name, known[i].name);
        CHECK(strcmp(quill_type_name(known[i].id), known[i].name) == 0, "quill_type_name(%u)", known[i].id);
        CHECK_EQ_INT(t->block_size, known[i].block);
        CHECK_EQ_INT(t->type_size, known[i].size);
        CHECK((t->to_float != NULL) == known[i].decodes, "type %s: to_float presence", t->name);
        if (t->to_float) {
            /* rows of the models are whole super-blocks; decodable types must tile 256 */
            bool tiles = t->block_size == 32 || 256 % t->block_size == 0;
            CHECK(tiles, "type %s block %lld", t->name, (long long)t->block_size);
        }
        CHECK_EQ_INT(quill_row_size(known[i].id, 256 * 3), (256 * 3 / known[i].block) * known[i].size);
    }
    /* every id not listed above is unknown, and so is everything past the end */
    int n_present = 0;
    for (uint32_t id = 0; id < 1000; id++) {
        const quill_type_traits *t = quill_type_traits_of(id);
        if (!t) {
            CHECK(strcmp(quill_type_name(id), "unknown") == 0, "name of unknown id %u", id);
            CHECK_EQ_INT(quill_row_size(id, 256), 0);
            continue;
        }
        n_present++;
        CHECK(t->name && t->block_size > 0 && t->type_size > 0, "type %u incomplete", id);
    }
    CHECK_EQ_INT(n_present, N_KNOWN);
    CHECK(quill_type_traits_of(UINT32_MAX) == NULL);
    CHECK(quill_type_traits_of(4) == NULL && quill_type_traits_of(31) == NULL && quill_type_traits_of(36) == NULL);
}

TEST(types_dequantize_errors) {
    quill_error err = {0};
    uint8_t block[292] = {0};
    float out[256];
    CHECK(quill_dequantize(QUILL_TYPE_I32, block, out, 256, &err) == QUILL_E_UNSUPPORTED);
    CHECK_EQ_INT(err.status, QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "unsupported tensor type i32");
    CHECK(quill_dequantize(QUILL_TYPE_Q8_K, block, out, 256, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "unsupported tensor type q8_K");
    CHECK(quill_dequantize(4, block, out, 32, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "unsupported tensor type 4");
    CHECK(quill_dequantize(12345, block, out, 32, NULL) == QUILL_E_UNSUPPORTED);
    CHECK(quill_dequantize(QUILL_TYPE_Q4_K, block, out, 100, &err) == QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "block size 256");
    CHECK(quill_dequantize(QUILL_TYPE_Q4_0, block, out, 0, &err) == QUILL_OK);
}

/* Hand-built blocks whose values can be worked out on paper. */
TEST(types_dequantize_hand_blocks) {
    quill_error err = {0};
    float out[256];

    uint8_t q40[18];
    uint16_t d = quill_f32_to_f16(0.5f);
    memcpy(q40, &d, 2);
    for (int j = 0; j < 16; j++) q40[2 + j] = (uint8_t)(j | (15 - j) << 4);
    CHECK(quill_dequantize(QUILL_TYPE_Q4_0, q40, out, 32, &err) == QUILL_OK);
    for (int j = 0; j < 16; j++) {
        CHECK(out[j] == (j - 8) * 0.5f, "q4_0[%d] = %g", j, (double)out[j]);
        CHECK(out[j + 16] == (7 - j) * 0.5f, "q4_0[%d] = %g", j + 16, (double)out[j + 16]);
    }

    uint8_t q80[34];
    d = quill_f32_to_f16(-0.25f);
    memcpy(q80, &d, 2);
    for (int j = 0; j < 32; j++) q80[2 + j] = (uint8_t)(int8_t)(j * 8 - 128);
    CHECK(quill_dequantize(QUILL_TYPE_Q8_0, q80, out, 32, &err) == QUILL_OK);
    for (int j = 0; j < 32; j++) CHECK(out[j] == (float)(j * 8 - 128) * -0.25f, "q8_0[%d]", j);

    /* iq4_nl with d = 1 reproduces its level table */
    static const int levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    uint8_t nl[18];
    d = quill_f32_to_f16(1.0f);
    memcpy(nl, &d, 2);
    for (int j = 0; j < 16; j++) nl[2 + j] = (uint8_t)(j | j << 4);
    CHECK(quill_dequantize(QUILL_TYPE_IQ4_NL, nl, out, 32, &err) == QUILL_OK);
    for (int j = 0; j < 16; j++) CHECK(out[j] == levels[j] && out[16 + j] == levels[j], "iq4_nl[%d]", j);

    /* q4_K: sub-block 0 with scale 1 / min 0 and sub-block 5 with scale 33 / min 2; d=1, dmin=0.5 */
    uint8_t q4k[144] = {0};
    uint16_t dd = quill_f32_to_f16(1.0f), dm = quill_f32_to_f16(0.5f);
    memcpy(q4k, &dd, 2);
    memcpy(q4k + 2, &dm, 2);
    uint8_t *sc = q4k + 4, *qs = q4k + 16;
    sc[0] = 1;
    /* j=5: scale = (sc[9] & 15) | (sc[1] >> 6) << 4, min = (sc[9] >> 4) | (sc[5] >> 6) << 4 */
    sc[9] = (uint8_t)(1 | 2 << 4);
    sc[1] = 2 << 6;
    for (int l = 0; l < 32; l++) qs[l] = (uint8_t)(l & 15);                  /* sub-blocks 0, 1 */
    for (int l = 0; l < 32; l++) qs[64 + l] = (uint8_t)((l & 15) << 4);     /* sub-blocks 4, 5 */
    CHECK(quill_dequantize(QUILL_TYPE_Q4_K, q4k, out, 256, &err) == QUILL_OK);
    for (int l = 0; l < 32; l++) {
        CHECK(out[l] == (float)(l & 15), "q4_K sub-block 0 [%d] = %g", l, (double)out[l]);
        CHECK(out[5 * 32 + l] == 33.0f * (float)(l & 15) - 1.0f, "q4_K sub-block 5 [%d] = %g", l,
              (double)out[5 * 32 + l]);
    }
}

/* Blocks inside a mapped file carry no alignment promise; decoding at an odd address must give
 * the same values (and stay clean under UBSan). */
TEST(types_dequantize_unaligned) {
    uint8_t buf[2 * 210 + 1];
    for (size_t i = 0; i < sizeof buf; i++) buf[i] = (uint8_t)(i * 37 + 11);
    /* keep the scales finite: overwrite each block's d with 1.0 */
    uint16_t one = quill_f32_to_f16(1.0f);
    static const uint32_t types[] = {QUILL_TYPE_Q6_K, QUILL_TYPE_Q4_K, QUILL_TYPE_Q5_K, QUILL_TYPE_Q3_K,
                                     QUILL_TYPE_Q2_K, QUILL_TYPE_IQ4_XS, QUILL_TYPE_Q5_1, QUILL_TYPE_F16};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const quill_type_traits *t = quill_type_traits_of(types[k]);
        uint8_t aligned[210];
        memcpy(aligned, buf, t->type_size);
        if (t->block_size > 1) {
            /* d sits first, except in q2_K/q3_K/q6_K where it ends the block */
            size_t off = (types[k] == QUILL_TYPE_Q6_K || types[k] == QUILL_TYPE_Q3_K) ? t->type_size - 2
                       : types[k] == QUILL_TYPE_Q2_K ? t->type_size - 4 : 0;
            memcpy(aligned + off, &one, 2);
        }
        memcpy(buf + 1, aligned, t->type_size);
        int64_t n = t->block_size > 1 ? t->block_size : (int64_t)(t->type_size / 2);
        float a[256], b[256];
        CHECK(quill_dequantize(types[k], aligned, a, n, NULL) == QUILL_OK);
        CHECK(quill_dequantize(types[k], buf + 1, b, n, NULL) == QUILL_OK);
        CHECK(memcmp(a, b, (size_t)n * sizeof(float)) == 0, "type %s differs when unaligned", t->name);
    }
}

/* ---------------------------------------------------------------- reference dequantization */

static const char *const dequant_models[] = {
    "bf16", "f16", "iq4_nl", "iq4_xs", "q2_k", "q3_k_m", "q3_k_s", "q4_0", "q4_1",
    "q4_k_m", "q4_k_s", "q5_0", "q5_1", "q5_k_m", "q5_k_s", "q6_k", "q8_0",
};
static const char *const dequant_tensors[] = {
    "blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight",
};

TEST(types_dequant_matches_reference) {
    REQUIRE_SHARED(shared);
    int n_checked = 0;
    bool seen[QUILL_TYPE_COUNT] = {false};
    for (size_t m = 0; m < sizeof dequant_models / sizeof dequant_models[0]; m++) {
        char rel[256];
        snprintf(rel, sizeof rel, "models/synth-k-%s.gguf", dequant_models[m]);
        char *model_path = path_join(shared, rel);
        snprintf(rel, sizeof rel, "golden/dequant/synth-k-%s.dequant.gguf", dequant_models[m]);
        char *gold_path = path_join(shared, rel);
        quill_gguf *model = NULL, *gold = NULL;
        quill_error err = {0};
        quill_status s1 = quill_gguf_open(model_path, &model, &err);
        if (s1 != QUILL_OK) test_fail(__FILE__, __LINE__, "open %s: %s", model_path, err.message);
        quill_status s2 = s1 == QUILL_OK ? quill_gguf_open(gold_path, &gold, &err) : s1;
        if (s1 == QUILL_OK && s2 != QUILL_OK) test_fail(__FILE__, __LINE__, "open %s: %s", gold_path, err.message);
        free(model_path);
        free(gold_path);
        bool ok = s1 == QUILL_OK && s2 == QUILL_OK;
        for (size_t k = 0; ok && k < sizeof dequant_tensors / sizeof dequant_tensors[0]; k++) {
            const char *name = dequant_tensors[k];
            const quill_gguf_tensor *mt = quill_gguf_find_tensor(model, name);
            const quill_gguf_tensor *gt = quill_gguf_find_tensor(gold, name);
            if (!mt || !gt) {
                test_fail(__FILE__, __LINE__, "%s: tensor %s missing", dequant_models[m], name);
                ok = false;
                break;
            }
            if (gt->type != QUILL_TYPE_F32 || gt->n_elements != mt->n_elements ||
                gt->nbytes != (uint64_t)gt->n_elements * sizeof(float)) {
                test_fail(__FILE__, __LINE__, "%s %s: golden is %s with %lld elements, model has %lld",
                          dequant_models[m], name, quill_type_name(gt->type), (long long)gt->n_elements,
                          (long long)mt->n_elements);
                ok = false;
                break;
            }
            float *out = malloc((size_t)mt->n_elements * sizeof(float));
            if (!out) abort();
            quill_status st = quill_dequantize(mt->type, mt->data, out, mt->n_elements, &err);
            if (st != QUILL_OK) {
                test_fail(__FILE__, __LINE__, "%s %s (%s): %s", dequant_models[m], name,
                          quill_type_name(mt->type), err.message);
                ok = false;
            } else if (memcmp(out, gt->data, (size_t)mt->n_elements * sizeof(float)) != 0) {
                int64_t i = 0;
                const float *want = gt->data;
                while (f32_bits(out[i]) == f32_bits(want[i])) i++;
                test_fail(__FILE__, __LINE__, "%s %s (%s): element %lld is %.9g (0x%08x), reference %.9g (0x%08x)",
                          dequant_models[m], name, quill_type_name(mt->type), (long long)i, (double)out[i],
                          f32_bits(out[i]), (double)want[i], f32_bits(want[i]));
                ok = false;
            } else {
                n_checked++;
                seen[mt->type] = true;
            }
            free(out);
        }
        quill_gguf_close(gold);
        quill_gguf_close(model);
        if (!ok) return;
    }
    CHECK_EQ_INT(n_checked, 17 * 3);
    /* the 17 files between them must exercise every decodable quantized type */
    static const uint32_t must[] = {QUILL_TYPE_F16, QUILL_TYPE_BF16, QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_0,
                                    QUILL_TYPE_Q4_1, QUILL_TYPE_Q5_0, QUILL_TYPE_Q5_1, QUILL_TYPE_Q2_K,
                                    QUILL_TYPE_Q3_K, QUILL_TYPE_Q4_K, QUILL_TYPE_Q5_K, QUILL_TYPE_Q6_K,
                                    QUILL_TYPE_IQ4_NL, QUILL_TYPE_IQ4_XS};
    for (size_t i = 0; i < sizeof must / sizeof must[0]; i++)
        CHECK(seen[must[i]], "no reference tensor of type %s was checked", quill_type_name(must[i]));
}
