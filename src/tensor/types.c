/* Tensor types: the layout table and the reference dequantizers.
 *
 * The dequantizers must match the reference implementation bit for bit, so each one performs the
 * same float operations in the same order as ggml's scalar code (e.g. q4_K forms d*sc and dmin*m
 * first and only then d1*q - m1). Do not "simplify" the arithmetic. */
#include "tensor/types_internal.h"

#include "base/error.h"

#include <stdio.h>

/* A fused multiply-add would round once instead of twice and break bit-exactness. GCC does not
 * contract in ISO C mode; clang needs to be told. */
#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

const int8_t quill_kvalues_iq4nl[16] = {
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
};

/* ---------------------------------------------------------------- half conversions */

float quill_f16_to_f32(uint16_t h) { return quill_half_to_float(h); }

float quill_bf16_to_f32(uint16_t h) { return quill_bfloat_to_float(h); }

uint16_t quill_f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
    uint32_t exp = (x >> 23) & 0xFF;
    uint32_t mant = x & 0x7FFFFF;

    if (exp == 0xFF) {
        if (mant == 0) return sign | 0x7C00;
        /* keep the payload's top bits; if they are all zero the result would read as inf */
        uint16_t payload = (uint16_t)(mant >> 13);
        return sign | 0x7C00 | (payload ? payload : 0x200);
    }
    int32_t e = (int32_t)exp - 127 + 15; /* half biased exponent */
    if (e >= 0x1F) return sign | 0x7C00; /* overflow -> inf */
    if (e <= 0) {
        /* half subnormal (or zero): value = m * 2^-24 with m = full mantissa >> shift */
        if (e < -10) return sign; /* below half the smallest subnormal: rounds to zero */
        uint32_t full = mant | 0x800000;
        uint32_t shift = (uint32_t)(14 - e);
        uint32_t m = full >> shift;
        uint32_t rem = full & ((1u << shift) - 1);
        uint32_t halfway = 1u << (shift - 1);
        if (rem > halfway || (rem == halfway && (m & 1))) m++;
        /* m may carry into 0x400, which is exactly the smallest normal half */
        return (uint16_t)(sign | m);
    }
    uint32_t h = ((uint32_t)e << 10) | (mant >> 13);
    uint32_t rem = mant & 0x1FFF;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++; /* a carry may round up to inf: correct */
    return (uint16_t)(sign | h);
}

uint16_t quill_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    if ((x & 0x7FFFFFFF) > 0x7F800000) {
        /* NaN: truncate rather than round (rounding could carry into the exponent or sign); the
         * payload survives unless all its kept bits are zero, which would read as infinity */
        uint16_t h = (uint16_t)(x >> 16);
        return (h & 0x7F) ? h : (uint16_t)(h | 0x40);
    }
    x += 0x7FFF + ((x >> 16) & 1);
    return (uint16_t)(x >> 16);
}

/* ---------------------------------------------------------------- dequantizers */

void quill_to_float_f32(const void *src, float *y, int64_t n) {
    memcpy(y, src, (size_t)n * sizeof(float));
}

void quill_to_float_f16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = quill_half_to_float(h);
    }
}

void quill_to_float_bf16(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        y[i] = quill_bfloat_to_float(h);
    }
}

/* The blocks inside a mapped file are not necessarily aligned for their struct, so each block is
 * copied into a local before its half fields are read. */

void quill_to_float_q4_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK4_0; i++, p += sizeof(block_q4_0), y += QK4_0) {
        block_q4_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int x0 = (b.qs[j] & 0x0F) - 8;
            const int x1 = (b.qs[j] >> 4) - 8;
            y[j] = (float)x0 * d;
            y[j + QK4_0 / 2] = (float)x1 * d;
        }
    }
}

void quill_to_float_q4_1(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK4_1; i++, p += sizeof(block_q4_1), y += QK4_1) {
        block_q4_1 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const float m = quill_half_to_float(b.m);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int x0 = b.qs[j] & 0x0F;
            const int x1 = b.qs[j] >> 4;
            y[j] = (float)x0 * d + m;
            y[j + QK4_1 / 2] = (float)x1 * d + m;
        }
    }
}

void quill_to_float_q5_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK5_0; i++, p += sizeof(block_q5_0), y += QK5_0) {
        block_q5_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint32_t qh = (uint32_t)b.qh[0] | (uint32_t)b.qh[1] << 8 | (uint32_t)b.qh[2] << 16 |
                            (uint32_t)b.qh[3] << 24;
        for (int j = 0; j < QK5_0 / 2; j++) {
            /* bit j of qh is the fifth bit of weight j, bit j+16 that of weight j+16 */
            const int h0 = (int)((qh >> j) << 4 & 0x10);
            const int h1 = (int)((qh >> (j + 12)) & 0x10);
            const int x0 = ((b.qs[j] & 0x0F) | h0) - 16;
            const int x1 = ((b.qs[j] >> 4) | h1) - 16;
            y[j] = (float)x0 * d;
            y[j + QK5_0 / 2] = (float)x1 * d;
        }
    }
}

void quill_to_float_q5_1(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK5_1; i++, p += sizeof(block_q5_1), y += QK5_1) {
        block_q5_1 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const float m = quill_half_to_float(b.m);
        const uint32_t qh = (uint32_t)b.qh[0] | (uint32_t)b.qh[1] << 8 | (uint32_t)b.qh[2] << 16 |
                            (uint32_t)b.qh[3] << 24;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int h0 = (int)((qh >> j) << 4 & 0x10);
            const int h1 = (int)((qh >> (j + 12)) & 0x10);
            const int x0 = (b.qs[j] & 0x0F) | h0;
            const int x1 = (b.qs[j] >> 4) | h1;
            y[j] = (float)x0 * d + m;
            y[j + QK5_1 / 2] = (float)x1 * d + m;
        }
    }
}

void quill_to_float_q8_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK8_0; i++, p += sizeof(block_q8_0), y += QK8_0) {
        block_q8_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int j = 0; j < QK8_0; j++) y[j] = (float)b.qs[j] * d;
    }
}

void quill_to_float_q2_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q2_K)) {
        block_q2_K b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const float dmin = quill_half_to_float(b.dmin);
        const uint8_t *q = b.qs;
        int is = 0;
        /* each 128-weight half reads 32 bytes four times, two bits per pass */
        for (int half = 0; half < QK_K / 128; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2) {
                for (int k = 0; k < 2; k++) {
                    const uint8_t sc = b.scales[is++];
                    const float dl = d * (float)(sc & 0xF);
                    const float ml = dmin * (float)(sc >> 4);
                    for (int l = 0; l < 16; l++)
                        *y++ = dl * (float)((q[l + 16 * k] >> shift) & 3) - ml;
                }
            }
        }
    }
}

void quill_to_float_q3_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q3_K)) {
        block_q3_K b;
        memcpy(&b, p, sizeof b);
        const float d_all = quill_half_to_float(b.d);
        int8_t scales[16];
        quill_q3_K_scales(b.scales, scales);
        const uint8_t *q = b.qs;
        uint8_t m = 1;
        int is = 0;
        for (int half = 0; half < QK_K / 128; half++, q += 32) {
            for (int shift = 0; shift < 8; shift += 2, m = (uint8_t)(m << 1)) {
                for (int k = 0; k < 2; k++) {
                    const float dl = d_all * (float)scales[is++];
                    for (int l = 0; l < 16; l++) {
                        const int lo = (q[l + 16 * k] >> shift) & 3;
                        /* a clear hmask bit means the weight sits 4 lower */
                        const int v = lo - ((b.hmask[l + 16 * k] & m) ? 0 : 4);
                        *y++ = dl * (float)v;
                    }
                }
            }
        }
    }
}

void quill_to_float_q4_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q4_K)) {
        block_q4_K b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const float dmin = quill_half_to_float(b.dmin);
        const uint8_t *q = b.qs;
        for (int is = 0; is < 8; is += 2, q += 32) {
            uint8_t sc, m;
            quill_scale_min_k4(is, b.scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            quill_scale_min_k4(is + 1, b.scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++) *y++ = d1 * (float)(q[l] & 0xF) - m1;
            for (int l = 0; l < 32; l++) *y++ = d2 * (float)(q[l] >> 4) - m2;
        }
    }
}

void quill_to_float_q5_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q5_K)) {
        block_q5_K b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const float dmin = quill_half_to_float(b.dmin);
        const uint8_t *ql = b.qs;
        uint8_t u1 = 1, u2 = 2;
        for (int is = 0; is < 8; is += 2, ql += 32, u1 = (uint8_t)(u1 << 2), u2 = (uint8_t)(u2 << 2)) {
            uint8_t sc, m;
            quill_scale_min_k4(is, b.scales, &sc, &m);
            const float d1 = d * (float)sc, m1 = dmin * (float)m;
            quill_scale_min_k4(is + 1, b.scales, &sc, &m);
            const float d2 = d * (float)sc, m2 = dmin * (float)m;
            for (int l = 0; l < 32; l++)
                *y++ = d1 * (float)((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
            for (int l = 0; l < 32; l++)
                *y++ = d2 * (float)((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
        }
    }
}

void quill_to_float_q6_K(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_q6_K)) {
        block_q6_K b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint8_t *ql = b.ql, *qh = b.qh;
        const int8_t *sc = b.scales;
        for (int half = 0; half < QK_K / 128; half++, y += 128, ql += 64, qh += 32, sc += 8) {
            for (int l = 0; l < 32; l++) {
                const int is = l / 16;
                const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
                const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
                const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
                const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
                y[l] = d * (float)sc[is + 0] * (float)q1;
                y[l + 32] = d * (float)sc[is + 2] * (float)q2;
                y[l + 64] = d * (float)sc[is + 4] * (float)q3;
                y[l + 96] = d * (float)sc[is + 6] * (float)q4;
            }
        }
    }
}

void quill_to_float_iq4_nl(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK4_NL; i++, p += sizeof(block_iq4_nl), y += QK4_NL) {
        block_iq4_nl b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int j = 0; j < QK4_NL / 2; j++) {
            y[j] = d * (float)quill_kvalues_iq4nl[b.qs[j] & 0xF];
            y[j + QK4_NL / 2] = d * (float)quill_kvalues_iq4nl[b.qs[j] >> 4];
        }
    }
}

void quill_to_float_iq4_xs(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq4_xs)) {
        block_iq4_xs b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint8_t *qs = b.qs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 16, y += 32) {
            const int ls = ((b.scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | ((b.scales_h >> 2 * ib) & 3) << 4;
            const float dl = d * (float)(ls - 32);
            for (int j = 0; j < 16; j++) {
                y[j] = dl * (float)quill_kvalues_iq4nl[qs[j] & 0xF];
                y[j + 16] = dl * (float)quill_kvalues_iq4nl[qs[j] >> 4];
            }
        }
    }
}

/* ---------------------------------------------------------------- the table */

/* The table, generated from the type list (type_list.h): rows that do not decode get no
 * to_float. */
#define TRAITS_ROW(ctx, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)                                 \
    [QUILL_TYPE_##ID] = {#sfx, block, bytes, QUILL_PICK(decodes, quill_to_float_##sfx, NULL)},
static const quill_type_traits type_table[QUILL_TYPE_COUNT] = {QUILL_TYPE_LIST(TRAITS_ROW, )};
#undef TRAITS_ROW

const quill_type_traits *quill_type_traits_of(uint32_t type) {
    if (type >= QUILL_TYPE_COUNT || !type_table[type].name) return NULL;
    return &type_table[type];
}

const char *quill_type_name(uint32_t type) {
    const quill_type_traits *t = quill_type_traits_of(type);
    return t ? t->name : "unknown";
}

size_t quill_row_size(uint32_t type, int64_t n) {
    const quill_type_traits *t = quill_type_traits_of(type);
    if (!t || n < 0) return 0;
    return (size_t)(n / t->block_size) * t->type_size;
}

quill_status quill_dequantize(uint32_t type, const void *src, float *dst, int64_t n, quill_error *err) {
    const quill_type_traits *t = quill_type_traits_of(type);
    if (!t) return quill_fail(err, QUILL_E_UNSUPPORTED, "unsupported tensor type %u (unknown type id)", type);
    if (!t->to_float)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "unsupported tensor type %s: quill cannot decode it; "
                          "requantize the model to a supported type (e.g. q8_0, q4_K)", t->name);
    if (n < 0 || n % t->block_size != 0)
        return quill_fail(err, QUILL_E_ARG, "cannot dequantize %lld elements of type %s: not a multiple "
                          "of its block size %lld", (long long)n, t->name, (long long)t->block_size);
    if (n > 0 && (!src || !dst))
        return quill_fail(err, QUILL_E_ARG, "quill_dequantize: NULL %s buffer", src ? "destination" : "source");
    t->to_float(src, dst, n);
    return QUILL_OK;
}

/* xorshift64 (tests/test.h's test_rand: the same stream for the same state) */
static uint32_t random_word(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 16);
}

static float random_unit(uint64_t *state) { return (float)((double)random_word(state) / 4294967296.0 * 2.0 - 1.0); }

void quill_random_rows(uint32_t type, uint8_t *out, int64_t rows, int64_t cols, uint64_t *state) {
    const quill_type_traits *tr = quill_type_traits_of(type);
    const size_t bytes = quill_row_size(type, cols) * (size_t)rows;
    if (type == QUILL_TYPE_F32 || type == QUILL_TYPE_F16 || type == QUILL_TYPE_BF16) { /* values in [-1, 1) */
        for (size_t i = 0; i < (size_t)(rows * cols); i++) {
            const float v = random_unit(state);
            uint32_t u;
            memcpy(&u, &v, 4);
            const uint16_t h = type == QUILL_TYPE_F16 ? quill_f32_to_f16(v) : (uint16_t)(u >> 16);
            if (type == QUILL_TYPE_F32) memcpy(out + 4 * i, &v, 4);
            else memcpy(out + 2 * i, &h, 2);
        }
        return;
    }
    for (size_t i = 0; i < bytes; i++) out[i] = (uint8_t)random_word(state);
    for (size_t b = 0; tr && b < bytes / tr->type_size; b++) {
        uint8_t *blk = out + b * tr->type_size;
        /* scales of at most 0.05: a product's sums then stay far from f32's range */
        const uint16_t h1 = quill_f32_to_f16(random_unit(state) * 0.05f), h2 = quill_f32_to_f16(random_unit(state) * 0.05f);
        switch (type) {
        case QUILL_TYPE_Q4_1: case QUILL_TYPE_Q5_1: case QUILL_TYPE_Q4_K: case QUILL_TYPE_Q5_K:
            memcpy(blk, &h1, 2), memcpy(blk + 2, &h2, 2);
            break;
        case QUILL_TYPE_Q6_K: memcpy(blk + offsetof(block_q6_K, d), &h1, 2); break;
        case QUILL_TYPE_Q2_K:
            memcpy(blk + offsetof(block_q2_K, d), &h1, 2), memcpy(blk + offsetof(block_q2_K, dmin), &h2, 2);
            break;
        case QUILL_TYPE_Q3_K: memcpy(blk + offsetof(block_q3_K, d), &h1, 2); break;
        case QUILL_TYPE_TQ1_0: case QUILL_TYPE_TQ2_0: memcpy(blk + tr->type_size - 2, &h1, 2); break;
        case QUILL_TYPE_MXFP4: /* now and then the subnormal scales (e = 0, 1) and the smallest normal one */
            blk[0] = (uint8_t)(random_word(state) % 16 ? 118 + random_word(state) % 8 : random_word(state) % 3);
            break;
        case QUILL_TYPE_IQ1_M: /* the half's nibbles top the four scale words */
            for (int q = 0; q < 4; q++)
                blk[48 + 2 * q + 1] = (uint8_t)((blk[48 + 2 * q + 1] & 0xF) | ((h1 >> (4 * q)) & 0xF) << 4);
            break;
        case QUILL_TYPE_NVFP4: /* UE4M3 scales of 1/32 to about 1/4 (0x7F, 0xFF: NaN) */
            for (int q = 0; q < QK_NVFP4 / QK_NVFP4_SUB; q++) blk[q] = (uint8_t)(0x10 + random_word(state) % 16);
            break;
        default: /* the others start with their half d */
            if (tr->block_size > 1) memcpy(blk, &h1, 2);
            break;
        }
    }
}
