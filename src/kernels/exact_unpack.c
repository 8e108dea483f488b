/* The exact products' view of the low-bit types (type list rows with exact = 2): each block as
 * signed integer codes and one f32 scale per slot, weight = s·q. Which (q, s) pair a type gets is
 * part of the definition of its exact products' bits (exact_scalar.c): the codes are the format's
 * own integers (fp4 levels doubled, trits, lattice magnitudes with their signs, iq1's 8·grid ± 1
 * for its ±1/8 shift), the scales its per-sub-block factors, computed as its dequantizer computes
 * them. Built without instruction-set flags: the scalar model and every set's unpacking kernels
 * call these. */
#include "kernels/kernels_exact.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

void quill_exact_unpack_mxfp4(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_MXFP4; b++, row += sizeof(block_mxfp4), q += QK_MXFP4) {
        const block_mxfp4 *blk = (const block_mxfp4 *)row;
        s[b] = quill_e8m0_half_to_float(blk->e);
        for (int j = 0; j < QK_MXFP4 / 2; j++) {
            q[j] = quill_kvalues_fp4[blk->qs[j] & 0xF];
            q[j + QK_MXFP4 / 2] = quill_kvalues_fp4[blk->qs[j] >> 4];
        }
    }
}

/* iq4_nl and iq4_xs: each nibble's level (quill_kvalues_iq4nl) is its code, as their dequantizers
 * read them: byte j holds column j low, 16 + j high. */
void quill_exact_unpack_iq4_nl(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK4_NL; b++, row += sizeof(block_iq4_nl), q += QK4_NL) {
        const block_iq4_nl *blk = (const block_iq4_nl *)row;
        s[b] = half_at(row);
        for (int j = 0; j < QK4_NL / 2; j++) {
            q[j] = quill_kvalues_iq4nl[blk->qs[j] & 0xF];
            q[j + QK4_NL / 2] = quill_kvalues_iq4nl[blk->qs[j] >> 4];
        }
    }
}

/* iq4_xs: 8 sub-blocks of 32, each with its scale (iq4_xs_sub_scale). */
void quill_exact_unpack_iq4_xs(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq4_xs)) {
        const block_iq4_xs *blk = (const block_iq4_xs *)row;
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            *s++ = iq4_xs_sub_scale(row, ib);
            for (int j = 0; j < 16; j++) {
                q[j] = quill_kvalues_iq4nl[blk->qs[16 * ib + j] & 0xF];
                q[j + 16] = quill_kvalues_iq4nl[blk->qs[16 * ib + j] >> 4];
            }
        }
    }
}

void quill_exact_unpack_q1_0(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK1_0; b++, row += sizeof(block_q1_0), q += QK1_0) {
        const float d = half_at(row);
        for (int i = 0; i < QK1_0 / 32; i++) *s++ = d;
        for (int j = 0; j < QK1_0; j++) q[j] = (row[2 + j / 8] >> (j % 8)) & 1 ? 1 : -1;
    }
}

void quill_exact_unpack_q2_0(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK2_0; b++, row += sizeof(block_q2_0), q += QK2_0) {
        const float d = half_at(row);
        for (int i = 0; i < QK2_0 / 32; i++) *s++ = d;
        for (int j = 0; j < QK2_0; j++) q[j] = (int8_t)(((row[2 + j / 4] >> (2 * (j % 4))) & 3) - 1);
    }
}

/* q2_K and q3_K: column 32j + l of a 128-column half h takes bits 2j, 2j + 1 of qs[32h + l]; each
 * 16 columns have their own scale (q2_K: 4 bits and a 4-bit minimum, q3_K: 6 bits less 32), as
 * their dequantizers (types.c) read them. */
void quill_exact_unpack_q2_K(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_q2_K)) {
        const block_q2_K *blk = (const block_q2_K *)row;
        const float d = half_at(row + offsetof(block_q2_K, d)), dmin = half_at(row + offsetof(block_q2_K, dmin));
        for (int i = 0; i < QK_K / 16; i++) {
            *s++ = d * (float)(blk->scales[i] & 0xF);
            *mins++ = dmin * (float)(blk->scales[i] >> 4);
        }
        for (int c = 0; c < QK_K; c++) *q++ = (int8_t)((blk->qs[32 * (c / 128) + c % 32] >> (2 * (c % 128 / 32))) & 3);
    }
}

/* q3_K's third bit: bit 4h + j of hmask[l] for that column, clear meaning 4 lower. */
void quill_exact_unpack_q3_K(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_q3_K)) {
        const block_q3_K *blk = (const block_q3_K *)row;
        const float d = half_at(row + offsetof(block_q3_K, d));
        int8_t sc[16];
        quill_q3_K_scales(blk->scales, sc);
        for (int i = 0; i < QK_K / 16; i++) *s++ = d * (float)sc[i];
        for (int c = 0; c < QK_K; c++) {
            const int h = c / 128, j = c % 128 / 32, l = c % 32;
            const int lo = (blk->qs[32 * h + l] >> (2 * j)) & 3;
            *q++ = (int8_t)(lo - ((blk->hmask[l] >> (4 * h + j)) & 1 ? 0 : 4));
        }
    }
}

/* Trit t (0 = most significant) of a tq1_0 byte, as its dequantizer reads it. */
static inline int8_t trit(uint8_t byte, int t) {
    static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
    return (int8_t)((((uint8_t)(byte * pow3[t])) * 3 >> 8) - 1);
}

void quill_exact_unpack_tq1_0(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    enum { QS = sizeof(((block_tq1_0 *)0)->qs), QH = sizeof(((block_tq1_0 *)0)->qh) };
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_tq1_0)) {
        const block_tq1_0 *blk = (const block_tq1_0 *)row;
        const float d = half_at(row + offsetof(block_tq1_0, d));
        for (int i = 0; i < QK_K / 32; i++) *s++ = d;
        for (int j = 0; j < QS; j += j < QS - QS % 32 ? 32 : 16) {
            const int width = j < QS - QS % 32 ? 32 : 16;
            for (int t = 0; t < 5; t++)
                for (int m = 0; m < width; m++) *q++ = trit(blk->qs[j + m], t);
        }
        for (int t = 0; t < 4; t++)
            for (int j = 0; j < QH; j++) *q++ = trit(blk->qh[j], t);
    }
}

void quill_exact_unpack_tq2_0(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_tq2_0)) {
        const block_tq2_0 *blk = (const block_tq2_0 *)row;
        const float d = half_at(row + offsetof(block_tq2_0, d));
        for (int i = 0; i < QK_K / 32; i++) *s++ = d;
        for (int j = 0; j < QK_K / 4; j += 32)
            for (int l = 0; l < 4; l++)
                for (int m = 0; m < 32; m++) *q++ = (int8_t)(((blk->qs[j + m] >> (2 * l)) & 3) - 1);
    }
}

/* 8 lattice magnitudes (bytes of `grid`) with their signs into q. */
static inline void signed_group(uint64_t grid, uint8_t signs, int8_t *q) {
    for (int j = 0; j < 8; j++) {
        const int v = (int)(uint8_t)(grid >> (8 * j));
        q[j] = (int8_t)((signs >> j) & 1 ? -v : v);
    }
}

void quill_exact_unpack_iq2_xxs(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_xxs)) {
        const float d = half_at(row);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            uint32_t idx, aux;
            memcpy(&idx, row + 2 + 8 * ib, 4);
            memcpy(&aux, row + 2 + 8 * ib + 4, 4);
            *s++ = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            for (int l = 0; l < 4; l++, q += 8)
                signed_group(quill_iq2xxs_grid[(idx >> (8 * l)) & 0xFF], quill_iq_signs((aux >> (7 * l)) & 127), q);
        }
    }
}

void quill_exact_unpack_iq2_xs(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_xs)) {
        block_iq2_xs blk;
        memcpy(&blk, row, sizeof blk);
        const float d = quill_half_to_float(blk.d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            *s++ = d * (0.5f + (float)(blk.scales[ib] & 0xF)) * 0.25f;
            *s++ = d * (0.5f + (float)(blk.scales[ib] >> 4)) * 0.25f;
            for (int l = 0; l < 4; l++, q += 8) {
                const uint16_t v = blk.qs[4 * ib + l];
                signed_group(quill_iq2xs_grid[v & 511], quill_iq_signs(v >> 9), q);
            }
        }
    }
}

void quill_exact_unpack_iq2_s(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_s)) {
        const block_iq2_s *blk = (const block_iq2_s *)row;
        const float d = half_at(row);
        const uint8_t *qs = blk->qs, *signs = blk->qs + QK_K / 8;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 4, signs += 4) {
            *s++ = d * (0.5f + (float)(blk->scales[ib] & 0xF)) * 0.25f;
            *s++ = d * (0.5f + (float)(blk->scales[ib] >> 4)) * 0.25f;
            for (int l = 0; l < 4; l++, q += 8)
                signed_group(quill_iq2s_grid[qs[l] | ((blk->qh[ib] << (8 - 2 * l)) & 0x300)], signs[l], q);
        }
    }
}

void quill_exact_unpack_iq3_xxs(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq3_xxs)) {
        const float d = half_at(row);
        const uint8_t *qs = row + 2, *scales_and_signs = row + 2 + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8) {
            uint32_t aux;
            memcpy(&aux, scales_and_signs + 4 * ib, 4);
            *s++ = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            for (int l = 0; l < 4; l++, q += 8) {
                const uint64_t grid = (uint64_t)quill_iq3xxs_grid[qs[2 * l]] |
                                      (uint64_t)quill_iq3xxs_grid[qs[2 * l + 1]] << 32;
                signed_group(grid, quill_iq_signs((aux >> (7 * l)) & 127), q);
            }
        }
    }
}

void quill_exact_unpack_iq3_s(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq3_s)) {
        const block_iq3_s *blk = (const block_iq3_s *)row;
        const float d = half_at(row);
        const uint8_t *qs = blk->qs, *signs = blk->signs;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8, signs += 4) {
            const int sc = ib % 2 ? blk->scales[ib / 2] >> 4 : blk->scales[ib / 2] & 0xF;
            *s++ = d * (float)(1 + 2 * sc);
            const uint8_t qh = blk->qh[ib];
            for (int l = 0; l < 4; l++, q += 8) {
                const uint64_t grid = (uint64_t)quill_iq3s_grid[qs[2 * l] | ((qh << (8 - 2 * l)) & 256)] |
                                      (uint64_t)quill_iq3s_grid[qs[2 * l + 1] | ((qh << (7 - 2 * l)) & 256)] << 32;
                signed_group(grid, signs[l], q);
            }
        }
    }
}

/* iq1's grid values g (-1, 0, 1) shifted by ±1/8 as the integers 8g ± 1, with the scale / 8. */
static inline void iq1_group(uint64_t grid, bool minus, int8_t *q) {
    for (int j = 0; j < 8; j++) q[j] = (int8_t)(8 * (int8_t)(grid >> (8 * j)) + (minus ? -1 : 1));
}

void quill_exact_unpack_iq1_s(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq1_s)) {
        block_iq1_s blk;
        memcpy(&blk, row, sizeof blk);
        const float d = quill_half_to_float(blk.d);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            const uint16_t qh = blk.qh[ib];
            *s++ = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
            for (int l = 0; l < 4; l++, q += 8)
                iq1_group(quill_iq1s_grid[blk.qs[4 * ib + l] | (((qh >> (3 * l)) & 7) << 8)], qh & 0x8000, q);
        }
    }
}

void quill_exact_unpack_iq1_m(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq1_m)) {
        block_iq1_m blk;
        memcpy(&blk, row, sizeof blk);
        uint16_t sc[4];
        memcpy(sc, blk.scales, sizeof sc);
        const quill_half h =
            (quill_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        const float d = quill_half_to_float(h);
        for (int ib = 0; ib < QK_K / 32; ib++) {
            *s++ = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) * 0.125f;
            *s++ = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) * 0.125f;
            for (int l = 0; l < 4; l++, q += 8) {
                const uint8_t hb = blk.qh[2 * ib + l / 2] >> (4 * (l % 2));
                iq1_group(quill_iq1s_grid[blk.qs[4 * ib + l] | ((hb & 7) << 8)], hb & 8, q);
            }
        }
    }
}

#define UNPACK_ROW(sfx, ID) [QUILL_TYPE_##ID] = quill_exact_unpack_##sfx,
static const quill_exact_unpack_fn unpackers[QUILL_TYPE_COUNT] = {QUILL_UNPACKED_EXACT_TYPES(UNPACK_ROW)};

quill_exact_unpack_fn quill_exact_unpack_for(uint32_t type) { return type < QUILL_TYPE_COUNT ? unpackers[type] : NULL; }
