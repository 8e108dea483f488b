/* Dequantizers of the low-bit types: the 1- and 2-bit q1_0 / q2_0, the fp4 types (mxfp4,
 * nvfp4), the ternary tq1_0 / tq2_0 and the grid-based i-quants (iq1_s ... iq3_s).
 *
 * As in types.c, each performs the reference's float operations in the reference's order (for
 * example iq2_xxs forms d · (0.5 + s) · 0.25, then multiplies by the grid value, then by ±1), so
 * that the results are bit-identical; tests/test_types_lowbit.c checks them against the
 * reference's own decoder on random blocks. */
#include "tensor/types_internal.h"

#include <math.h>

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

const int8_t quill_kvalues_fp4[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* The reference's delta of iq1_s / iq1_m: every grid value is shifted by ±1/8. */
#define IQ1_DELTA 0.125f

/* Each loop copies its block into a local first: blocks in a mapped file are not aligned. */

void quill_to_float_q1_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK1_0; i++, p += sizeof(block_q1_0), y += QK1_0) {
        block_q1_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d), neg_d = -d;
        for (int j = 0; j < QK1_0; j++) y[j] = (b.qs[j / 8] >> (j % 8)) & 1 ? d : neg_d;
    }
}

void quill_to_float_q2_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK2_0; i++, p += sizeof(block_q2_0), y += QK2_0) {
        block_q2_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int j = 0; j < QK2_0; j++) y[j] = (float)(((b.qs[j / 4] >> (2 * (j % 4))) & 3) - 1) * d;
    }
}

void quill_to_float_mxfp4(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_MXFP4; i++, p += sizeof(block_mxfp4), y += QK_MXFP4) {
        block_mxfp4 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_e8m0_half_to_float(b.e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            y[j] = (float)quill_kvalues_fp4[b.qs[j] & 0xF] * d;
            y[j + QK_MXFP4 / 2] = (float)quill_kvalues_fp4[b.qs[j] >> 4] * d;
        }
    }
}

/* An unsigned E4M3 scale, halved like the fp4 values are doubled; 0 and 0x7F (its NaN) read as 0. */
static float ue4m3_half_to_float(uint8_t x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    const int exp = (x >> 3) & 0xF, man = x & 7;
    const float raw = exp == 0 ? ldexpf((float)man, -9) : ldexpf(1.0f + (float)man / 8.0f, exp - 7);
    return raw * 0.5f;
}

void quill_to_float_nvfp4(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_NVFP4; i++, p += sizeof(block_nvfp4)) {
        block_nvfp4 b;
        memcpy(&b, p, sizeof b);
        for (int s = 0; s < QK_NVFP4 / QK_NVFP4_SUB; s++, y += QK_NVFP4_SUB) {
            const float d = ue4m3_half_to_float(b.d[s]);
            const uint8_t *qs = b.qs + s * (QK_NVFP4_SUB / 2);
            for (int j = 0; j < QK_NVFP4_SUB / 2; j++) {
                y[j] = (float)quill_kvalues_fp4[qs[j] & 0xF] * d;
                y[j + QK_NVFP4_SUB / 2] = (float)quill_kvalues_fp4[qs[j] >> 4] * d;
            }
        }
    }
}

/* Trit n (0 = most significant) of a tq1_0 byte, which holds its trits as a base-3 fraction of
 * 256: multiplying by 3^n (mod 256) shifts trit n to the top, and · 3 >> 8 reads it. */
static inline int tq1_trit(uint8_t byte, int n) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    const uint8_t q = (uint8_t)(byte * pow3[n]);
    return (q * 3) >> 8;
}

void quill_to_float_tq1_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    enum { QS = sizeof(((block_tq1_0 *)0)->qs), QH = sizeof(((block_tq1_0 *)0)->qh) };
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_tq1_0)) {
        block_tq1_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        /* 48 bytes of five trits: one run of 32 bytes, then one of 16, each trit-major */
        for (int j = 0; j < QS; j += j < QS - QS % 32 ? 32 : 16) {
            const int width = j < QS - QS % 32 ? 32 : 16;
            for (int t = 0; t < 5; t++)
                for (int m = 0; m < width; m++) *y++ = (float)(tq1_trit(b.qs[j + m], t) - 1) * d;
        }
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < QH; j++) *y++ = (float)(tq1_trit(b.qh[j], t) - 1) * d;
    }
}

void quill_to_float_tq2_0(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_tq2_0)) {
        block_tq2_0 b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int j = 0; j < QK_K / 4; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) *y++ = (float)(((b.qs[j + m] >> (2 * l)) & 3) - 1) * d;
    }
}

static inline float signed_by(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.f : 1.f; }

void quill_to_float_iq2_xxs(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq2_xxs)) {
        block_iq2_xxs b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            /* four grid indices (bytes), then 4 x 7 sign bits and the 4-bit scale */
            uint32_t idx, aux;
            memcpy(&idx, b.qs + 4 * ib, 4);
            memcpy(&aux, b.qs + 4 * ib + 2, 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, y += 8) {
                const uint64_t grid = quill_iq2xxs_grid[(idx >> (8 * l)) & 0xFF];
                const uint8_t signs = quill_iq_signs((aux >> (7 * l)) & 127);
                for (int j = 0; j < 8; j++) y[j] = db * (float)(uint8_t)(grid >> (8 * j)) * signed_by(signs, j);
            }
        }
    }
}

void quill_to_float_iq2_xs(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq2_xs)) {
        block_iq2_xs b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const float db[2] = {d * (0.5f + (float)(b.scales[ib] & 0xF)) * 0.25f,
                                 d * (0.5f + (float)(b.scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                const uint16_t q = b.qs[4 * ib + l];
                const uint64_t grid = quill_iq2xs_grid[q & 511];
                const uint8_t signs = quill_iq_signs(q >> 9);
                for (int j = 0; j < 8; j++)
                    y[j] = db[l / 2] * (float)(uint8_t)(grid >> (8 * j)) * signed_by(signs, j);
            }
        }
    }
}

void quill_to_float_iq2_s(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq2_s)) {
        block_iq2_s b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint8_t *qs = b.qs, *signs = b.qs + QK_K / 8;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, signs += 4) {
            const float db[2] = {d * (0.5f + (float)(b.scales[ib] & 0xF)) * 0.25f,
                                 d * (0.5f + (float)(b.scales[ib] >> 4)) * 0.25f};
            for (int l = 0; l < 4; l++, y += 8) {
                /* qh holds the two high bits of each of the sub-block's four 10-bit indices */
                const uint64_t grid = quill_iq2s_grid[qs[l] | ((b.qh[ib] << (8 - 2 * l)) & 0x300)];
                for (int j = 0; j < 8; j++)
                    y[j] = db[l / 2] * (float)(uint8_t)(grid >> (8 * j)) * signed_by(signs[l], j);
            }
        }
    }
}

void quill_to_float_iq3_xxs(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq3_xxs)) {
        block_iq3_xxs b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint8_t *qs = b.qs, *scales_and_signs = b.qs + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8) {
            uint32_t aux;
            memcpy(&aux, scales_and_signs + 4 * ib, 4);
            const float db = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, y += 8) {
                const uint8_t signs = quill_iq_signs((aux >> (7 * l)) & 127);
                const uint32_t g1 = quill_iq3xxs_grid[qs[2 * l]], g2 = quill_iq3xxs_grid[qs[2 * l + 1]];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * (float)(uint8_t)(g1 >> (8 * j)) * signed_by(signs, j);
                    y[j + 4] = db * (float)(uint8_t)(g2 >> (8 * j)) * signed_by(signs, j + 4);
                }
            }
        }
    }
}

void quill_to_float_iq3_s(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq3_s)) {
        block_iq3_s b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint8_t *qs = b.qs, *signs = b.signs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8, signs += 4) {
            /* one 4-bit scale per 32 weights, two to a byte; qh: the 9th bit of 8 grid indices */
            const int sc = ib % 2 ? b.scales[ib / 2] >> 4 : b.scales[ib / 2] & 0xF;
            const float db = d * (float)(1 + 2 * sc);
            const uint8_t qh = b.qh[ib];
            for (int l = 0; l < 4; l++, y += 8) {
                const uint32_t g1 = quill_iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)];
                const uint32_t g2 = quill_iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)];
                for (int j = 0; j < 4; j++) {
                    y[j] = db * (float)(uint8_t)(g1 >> (8 * j)) * signed_by(signs[l], j);
                    y[j + 4] = db * (float)(uint8_t)(g2 >> (8 * j)) * signed_by(signs[l], j + 4);
                }
            }
        }
    }
}

void quill_to_float_iq1_s(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq1_s)) {
        block_iq1_s b;
        memcpy(&b, p, sizeof b);
        const float d = quill_half_to_float(b.d);
        const uint8_t *qs = b.qs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4) {
            /* qh: 3 high index bits for each of 4 groups, a 3-bit scale, and the delta's sign */
            const uint16_t qh = b.qh[ib];
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1);
            const float delta = qh & 0x8000 ? -IQ1_DELTA : IQ1_DELTA;
            for (int l = 0; l < 4; l++, y += 8) {
                const uint64_t grid = quill_iq1s_grid[qs[l] | (((qh >> (3 * l)) & 7) << 8)];
                for (int j = 0; j < 8; j++) y[j] = dl * ((float)(int8_t)(grid >> (8 * j)) + delta);
            }
        }
    }
}

void quill_to_float_iq1_m(const void *src, float *y, int64_t n) {
    const uint8_t *p = src;
    for (int64_t i = 0; i < n / QK_K; i++, p += sizeof(block_iq1_m)) {
        block_iq1_m b;
        memcpy(&b, p, sizeof b);
        uint16_t sc[4];
        memcpy(sc, b.scales, sizeof sc);
        const quill_half scale =
            (quill_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        const float d = quill_half_to_float(scale);
        const uint8_t *qs = b.qs, *qh = b.qh;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, qh += 2) {
            /* two 3-bit scales per 32 weights; qh: per group 3 high index bits and the delta's sign */
            const float dl[2] = {d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1),
                                 d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1)};
            for (int l = 0; l < 4; l++, y += 8) {
                const uint8_t h = qh[l / 2] >> (4 * (l % 2));
                const uint64_t grid = quill_iq1s_grid[qs[l] | ((h & 7) << 8)];
                const float delta = h & 8 ? -IQ1_DELTA : IQ1_DELTA;
                for (int j = 0; j < 8; j++) y[j] = dl[l / 2] * ((float)(int8_t)(grid >> (8 * j)) + delta);
            }
        }
    }
}
