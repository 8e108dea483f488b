/* Vector unpackers for the unpacking kernels (exact_unpacked.h): the same codes and scales as
 * exact_unpack.c's plain ones (the same float operations in the same order), with byte shuffles,
 * compares and grid words from table loads: AVX2, which every x86 set that includes this has.
 * Included by the instruction-set files, which are compiled with their ISA flags. MXFP4 experts
 * (gpt-oss) spent 76 % of a token in the plain unpacker's table lookups; the grid and ternary
 * types' one-token products were 4-12x slower with the plain ones (bench/README.md). */
#ifndef QUILL_UNPACK_SIMD_H
#define QUILL_UNPACK_SIMD_H

#include "kernels/kernels_exact.h"
#include "tensor/types_internal.h"

/* empty on other targets, so that files built for every target may include it unguarded */
#if defined(__x86_64__)
#include <immintrin.h>

/* 16 bytes of nibbles to 32 codes: the low nibbles' values first, then the high ones' */
static inline void unpack_nibbles_lut(const uint8_t *qs, __m128i table, int8_t *q) {
    const __m128i low = _mm_set1_epi8(0x0F), v = _mm_loadu_si128((const __m128i *)qs);
    _mm_storeu_si128((__m128i *)q, _mm_shuffle_epi8(table, _mm_and_si128(v, low)));
    _mm_storeu_si128((__m128i *)(q + 16), _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(v, 4), low)));
}

static void unpack_mxfp4_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i table = _mm_loadu_si128((const __m128i *)quill_kvalues_fp4);
    for (int64_t b = 0; b < n / QK_MXFP4; b++, row += sizeof(block_mxfp4), q += QK_MXFP4) {
        const block_mxfp4 *blk = (const block_mxfp4 *)row;
        s[b] = quill_e8m0_half_to_float(blk->e);
        unpack_nibbles_lut(blk->qs, table, q);
    }
}

static void unpack_iq4_nl_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i table = _mm_loadu_si128((const __m128i *)quill_kvalues_iq4nl);
    for (int64_t b = 0; b < n / QK4_NL; b++, row += sizeof(block_iq4_nl), q += QK4_NL) {
        s[b] = half_at(row);
        unpack_nibbles_lut(row + offsetof(block_iq4_nl, qs), table, q);
    }
}

static void unpack_iq4_xs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i table = _mm_loadu_si128((const __m128i *)quill_kvalues_iq4nl);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq4_xs)) {
        const block_iq4_xs *blk = (const block_iq4_xs *)row;
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            *s++ = iq4_xs_sub_scale(row, ib);
            unpack_nibbles_lut(blk->qs + 16 * ib, table, q);
        }
    }
}

/* 32 sign bits (4 bytes, bit j of byte l for code 8l + j) applied to 32 magnitudes. */
static inline __m256i apply_signs32(__m256i mag, uint32_t signs) {
    const __m256i spread = _mm256_set_epi64x(0x0303030303030303ll, 0x0202020202020202ll, 0x0101010101010101ll, 0);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)signs), spread), bit), bit);
    return _mm256_sub_epi8(_mm256_xor_si256(mag, set), set);
}

/* iq3_s (the grid i-quants' mix, IQ3_S / IQ3_M): per 32 codes, the 8 grid words gathered at once
 * (index qs[i] with bit i of qh as its ninth bit), then their signs. */
static void unpack_iq3_s_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m256i shifts = _mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), one = _mm256_set1_epi32(1);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq3_s)) {
        const block_iq3_s *blk = (const block_iq3_s *)row;
        const float d = half_at(row);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            const int sc = ib % 2 ? blk->scales[ib / 2] >> 4 : blk->scales[ib / 2] & 0xF;
            *s++ = d * (float)(1 + 2 * sc);
            const __m256i lo = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk->qs + 8 * ib)));
            const __m256i hi = _mm256_slli_epi32(_mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(blk->qh[ib]), shifts), one), 8);
            const __m256i mag = _mm256_i32gather_epi32((const int *)quill_iq3s_grid, _mm256_or_si256(lo, hi), 4);
            uint32_t signs;
            memcpy(&signs, blk->signs + 4 * ib, 4);
            _mm256_storeu_si256((__m256i *)q, apply_signs32(mag, signs));
        }
    }
}

/* Byte j of entry i is 0xFF when bit j of quill_iq_signs(i) is set: a group's 8 signs as a mask
 * from its 7 stored bits by one load (the parity bit and the spreading of bits to bytes computed
 * per group took a third of iq2_xxs's unpacking). The unpackers' tests compare the codes with
 * exact_unpack.c's. */
static const uint64_t iq_sign_masks[128] = {
    0x0000000000000000ull, 0xff000000000000ffull, 0xff0000000000ff00ull, 0x000000000000ffffull,
    0xff00000000ff0000ull, 0x0000000000ff00ffull, 0x0000000000ffff00ull, 0xff00000000ffffffull,
    0xff000000ff000000ull, 0x00000000ff0000ffull, 0x00000000ff00ff00ull, 0xff000000ff00ffffull,
    0x00000000ffff0000ull, 0xff000000ffff00ffull, 0xff000000ffffff00ull, 0x00000000ffffffffull,
    0xff0000ff00000000ull, 0x000000ff000000ffull, 0x000000ff0000ff00ull, 0xff0000ff0000ffffull,
    0x000000ff00ff0000ull, 0xff0000ff00ff00ffull, 0xff0000ff00ffff00ull, 0x000000ff00ffffffull,
    0x000000ffff000000ull, 0xff0000ffff0000ffull, 0xff0000ffff00ff00ull, 0x000000ffff00ffffull,
    0xff0000ffffff0000ull, 0x000000ffffff00ffull, 0x000000ffffffff00ull, 0xff0000ffffffffffull,
    0xff00ff0000000000ull, 0x0000ff00000000ffull, 0x0000ff000000ff00ull, 0xff00ff000000ffffull,
    0x0000ff0000ff0000ull, 0xff00ff0000ff00ffull, 0xff00ff0000ffff00ull, 0x0000ff0000ffffffull,
    0x0000ff00ff000000ull, 0xff00ff00ff0000ffull, 0xff00ff00ff00ff00ull, 0x0000ff00ff00ffffull,
    0xff00ff00ffff0000ull, 0x0000ff00ffff00ffull, 0x0000ff00ffffff00ull, 0xff00ff00ffffffffull,
    0x0000ffff00000000ull, 0xff00ffff000000ffull, 0xff00ffff0000ff00ull, 0x0000ffff0000ffffull,
    0xff00ffff00ff0000ull, 0x0000ffff00ff00ffull, 0x0000ffff00ffff00ull, 0xff00ffff00ffffffull,
    0xff00ffffff000000ull, 0x0000ffffff0000ffull, 0x0000ffffff00ff00ull, 0xff00ffffff00ffffull,
    0x0000ffffffff0000ull, 0xff00ffffffff00ffull, 0xff00ffffffffff00ull, 0x0000ffffffffffffull,
    0xffff000000000000ull, 0x00ff0000000000ffull, 0x00ff00000000ff00ull, 0xffff00000000ffffull,
    0x00ff000000ff0000ull, 0xffff000000ff00ffull, 0xffff000000ffff00ull, 0x00ff000000ffffffull,
    0x00ff0000ff000000ull, 0xffff0000ff0000ffull, 0xffff0000ff00ff00ull, 0x00ff0000ff00ffffull,
    0xffff0000ffff0000ull, 0x00ff0000ffff00ffull, 0x00ff0000ffffff00ull, 0xffff0000ffffffffull,
    0x00ff00ff00000000ull, 0xffff00ff000000ffull, 0xffff00ff0000ff00ull, 0x00ff00ff0000ffffull,
    0xffff00ff00ff0000ull, 0x00ff00ff00ff00ffull, 0x00ff00ff00ffff00ull, 0xffff00ff00ffffffull,
    0xffff00ffff000000ull, 0x00ff00ffff0000ffull, 0x00ff00ffff00ff00ull, 0xffff00ffff00ffffull,
    0x00ff00ffffff0000ull, 0xffff00ffffff00ffull, 0xffff00ffffffff00ull, 0x00ff00ffffffffffull,
    0x00ffff0000000000ull, 0xffffff00000000ffull, 0xffffff000000ff00ull, 0x00ffff000000ffffull,
    0xffffff0000ff0000ull, 0x00ffff0000ff00ffull, 0x00ffff0000ffff00ull, 0xffffff0000ffffffull,
    0xffffff00ff000000ull, 0x00ffff00ff0000ffull, 0x00ffff00ff00ff00ull, 0xffffff00ff00ffffull,
    0x00ffff00ffff0000ull, 0xffffff00ffff00ffull, 0xffffff00ffffff00ull, 0x00ffff00ffffffffull,
    0xffffffff00000000ull, 0x00ffffff000000ffull, 0x00ffffff0000ff00ull, 0xffffffff0000ffffull,
    0x00ffffff00ff0000ull, 0xffffffff00ff00ffull, 0xffffffff00ffff00ull, 0x00ffffff00ffffffull,
    0x00ffffffff000000ull, 0xffffffffff0000ffull, 0xffffffffff00ff00ull, 0x00ffffffff00ffffull,
    0xffffffffffff0000ull, 0x00ffffffffff00ffull, 0x00ffffffffffff00ull, 0xffffffffffffffffull,
};

/* The 32 codes of 4 groups with magnitudes mag and their signs' 7-bit fields at bits 0, 7, 14 and
 * 21 of aux (iq2_xxs, iq3_xxs; iq2_xs's gathered there): (mag ^ m) - m negates where m is set. */
static inline __m256i apply_iq_signs4(__m256i mag, uint32_t aux) {
    const __m256i m = _mm256_set_epi64x((long long)iq_sign_masks[(aux >> 21) & 127], (long long)iq_sign_masks[(aux >> 14) & 127],
                                        (long long)iq_sign_masks[(aux >> 7) & 127], (long long)iq_sign_masks[aux & 127]);
    return _mm256_sub_epi8(_mm256_xor_si256(mag, m), m);
}

/* The 4 groups' 8-byte grid words of 32 codes. Built from scalar loads: on an EPYC (Zen 4) that
 * took the one-token products 1-22 % less time than _mm256_i32gather_epi64 (bench/README.md). */
static inline __m256i grid4(const uint64_t *grid, uint32_t i0, uint32_t i1, uint32_t i2, uint32_t i3) {
    return _mm256_set_epi64x((long long)grid[i3], (long long)grid[i2], (long long)grid[i1], (long long)grid[i0]);
}

static void unpack_iq2_xxs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_xxs)) {
        const float d = half_at(row);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            uint32_t idx, aux;
            memcpy(&idx, row + 2 + 8 * ib, 4);
            memcpy(&aux, row + 2 + 8 * ib + 4, 4);
            *s++ = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            const __m256i mag = grid4(quill_iq2xxs_grid, idx & 255, (idx >> 8) & 255, (idx >> 16) & 255, idx >> 24);
            _mm256_storeu_si256((__m256i *)q, apply_iq_signs4(mag, aux));
        }
    }
}

/* iq2_xs: per group a 16-bit word, the grid index in its low 9 bits, 7 sign bits above. */
static void unpack_iq2_xs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_xs)) {
        const block_iq2_xs *blk = (const block_iq2_xs *)row;
        const float d = half_at(row);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            const uint8_t sc = blk->scales[ib];
            *s++ = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
            *s++ = d * (0.5f + (float)(sc >> 4)) * 0.25f;
            uint16_t v[4];
            memcpy(v, row + offsetof(block_iq2_xs, qs) + 8 * ib, sizeof v);
            const __m256i mag = grid4(quill_iq2xs_grid, v[0] & 511u, v[1] & 511u, v[2] & 511u, v[3] & 511u);
            _mm256_storeu_si256((__m256i *)q, apply_iq_signs4(mag, (uint32_t)(v[0] >> 9) | (uint32_t)(v[1] >> 9) << 7 |
                                                                     (uint32_t)(v[2] >> 9) << 14 | (uint32_t)(v[3] >> 9) << 21));
        }
    }
}

/* iq2_s: group l's index is qs[l] with bits 2l, 2l + 1 of qh as its ninth and tenth; its 8 sign
 * bits are stored whole. */
static void unpack_iq2_s_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_s)) {
        const block_iq2_s *blk = (const block_iq2_s *)row;
        const float d = half_at(row);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            *s++ = d * (0.5f + (float)(blk->scales[ib] & 0xF)) * 0.25f;
            *s++ = d * (0.5f + (float)(blk->scales[ib] >> 4)) * 0.25f;
            uint32_t lo, signs;
            memcpy(&lo, blk->qs + 4 * ib, 4);
            memcpy(&signs, blk->qs + QK_K / 8 + 4 * ib, 4);
            const uint32_t qh = blk->qh[ib];
            const __m256i mag = grid4(quill_iq2s_grid, (lo & 255) | (qh << 8 & 0x300), ((lo >> 8) & 255) | (qh << 6 & 0x300),
                                      ((lo >> 16) & 255) | (qh << 4 & 0x300), (lo >> 24) | (qh << 2 & 0x300));
            _mm256_storeu_si256((__m256i *)q, apply_signs32(mag, signs));
        }
    }
}

/* iq3_xxs: 8 byte indices of 4-byte grid words per 32 codes (scalar loads, as grid4), signs and
 * scale as iq2_xxs's. */
static void unpack_iq3_xxs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const uint32_t *g = quill_iq3xxs_grid;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq3_xxs)) {
        const float d = half_at(row);
        const uint8_t *qs = row + 2, *scales_and_signs = row + 2 + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8, q += 32) {
            uint32_t aux;
            memcpy(&aux, scales_and_signs + 4 * ib, 4);
            *s++ = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            const __m256i mag = _mm256_set_epi32((int)g[qs[7]], (int)g[qs[6]], (int)g[qs[5]], (int)g[qs[4]],
                                                 (int)g[qs[3]], (int)g[qs[2]], (int)g[qs[1]], (int)g[qs[0]]);
            _mm256_storeu_si256((__m256i *)q, apply_iq_signs4(mag, aux));
        }
    }
}

/* iq1's codes 8g ± 1 of 4 groups' signed grid bytes g, with delta (1 or -1) in each byte. */
static inline __m256i iq1_codes(__m256i grid, __m256i delta) {
    return _mm256_add_epi8(_mm256_and_si256(_mm256_slli_epi16(grid, 3), _mm256_set1_epi8((char)0xF8)), delta);
}

/* iq1_s: group l's index is qs[l] with bits 3l.. 3l + 2 of the sub-block's qh word as its top
 * three; bit 15 gives every code of the 32 the shift -1/8 instead of +1/8. */
static void unpack_iq1_s_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq1_s)) {
        const block_iq1_s *blk = (const block_iq1_s *)row;
        const float d = half_at(row);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            uint16_t qh16;
            uint32_t lo;
            memcpy(&qh16, row + offsetof(block_iq1_s, qh) + 2 * ib, 2);
            memcpy(&lo, blk->qs + 4 * ib, 4);
            const uint32_t qh = qh16;
            *s++ = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
            const __m256i grid = grid4(quill_iq1s_grid, (lo & 255) | (qh & 7) << 8, ((lo >> 8) & 255) | (qh >> 3 & 7) << 8,
                                       ((lo >> 16) & 255) | (qh >> 6 & 7) << 8, (lo >> 24) | (qh >> 9 & 7) << 8);
            _mm256_storeu_si256((__m256i *)q, iq1_codes(grid, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1)));
        }
    }
}

/* iq1_m: a nibble of qh per group (its index's top three bits, then its shift's sign), two 3-bit
 * scales per 32 codes in the scale words, the half scale in their top nibbles. */
static void unpack_iq1_m_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i shifts = _mm_set_epi32(12, 8, 4, 0), eight = _mm_set1_epi32(8);
    const __m256i one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq1_m)) {
        const block_iq1_m *blk = (const block_iq1_m *)row;
        uint16_t sc[4];
        memcpy(sc, blk->scales, sizeof sc);
        const quill_half h =
            (quill_half)((sc[0] >> 12) | ((sc[1] >> 8) & 0x00F0) | ((sc[2] >> 4) & 0x0F00) | (sc[3] & 0xF000));
        const float d = quill_half_to_float(h);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            *s++ = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2))) & 7) + 1) * 0.125f;
            *s++ = d * (float)(2 * ((sc[ib / 2] >> (6 * (ib % 2) + 3)) & 7) + 1) * 0.125f;
            uint32_t lo;
            memcpy(&lo, blk->qs + 4 * ib, 4);
            const uint32_t nib = (uint32_t)blk->qh[2 * ib] | (uint32_t)blk->qh[2 * ib + 1] << 8;
            const __m256i grid = grid4(quill_iq1s_grid, (lo & 255) | (nib << 8 & 0x700), ((lo >> 8) & 255) | (nib << 4 & 0x700),
                                       ((lo >> 16) & 255) | (nib & 0x700), (lo >> 24) | (nib >> 4 & 0x700));
            /* each group's sign bit (8 of its nibble) as -1 or 1 in its 8 bytes */
            const __m128i sign = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)nib), shifts), eight);
            const __m256i minus = _mm256_cvtepi32_epi64(_mm_cmpeq_epi32(sign, eight));
            _mm256_storeu_si256((__m256i *)q, iq1_codes(grid, _mm256_or_si256(minus, one)));
        }
    }
}

/* q1_0: 1 bit per code, set meaning +1: the signs of 32 ones, negated where the bit is clear. */
static void unpack_q1_0_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m256i ones = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / QK1_0; b++, row += sizeof(block_q1_0)) {
        const float d = half_at(row);
        for (int i = 0; i < QK1_0 / 32; i++, q += 32) {
            *s++ = d;
            uint32_t bits;
            memcpy(&bits, row + 2 + 4 * i, 4);
            _mm256_storeu_si256((__m256i *)q, apply_signs32(ones, ~bits));
        }
    }
}

/* q2_0: code j is the 2-bit field j % 4 of byte j / 4, less 1. Each byte is copied to its 4
 * codes' places, masked to the place's field; the fields of places 2, 3 are moved down a nibble,
 * so that every masked byte is a + 4b (a or b zero), which one table maps to (a | b) - 1. */
static void unpack_q2_0_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m256i spread = _mm256_set_epi8(7, 7, 7, 7, 6, 6, 6, 6, 5, 5, 5, 5, 4, 4, 4, 4,
                                           3, 3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 0, 0, 0, 0);
    const __m256i field = _mm256_set1_epi32((int)0xC0300C03u), low = _mm256_set1_epi8(0x0F);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_setr_epi8(-1, 0, 1, 2, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0));
    for (int64_t b = 0; b < n / QK2_0; b++, row += sizeof(block_q2_0)) {
        const float d = half_at(row);
        for (int i = 0; i < QK2_0 / 32; i++, q += 32) {
            *s++ = d;
            const __m256i bytes = _mm256_broadcastq_epi64(_mm_loadl_epi64((const __m128i *)(row + 2 + 8 * i)));
            const __m256i x = _mm256_and_si256(_mm256_shuffle_epi8(bytes, spread), field);
            const __m256i a_or_4b = _mm256_and_si256(_mm256_or_si256(x, _mm256_srli_epi16(x, 4)), low);
            _mm256_storeu_si256((__m256i *)q, _mm256_shuffle_epi8(table, a_or_4b));
        }
    }
}

/* tq2_0: per 32 bytes, the 4 bit pairs of each byte give 4 runs of 32 codes, less 1. */
static void unpack_tq2_0_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m256i three = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_tq2_0)) {
        const block_tq2_0 *blk = (const block_tq2_0 *)row;
        const float d = half_at(row + offsetof(block_tq2_0, d));
        for (int i = 0; i < QK_K / 32; i++) *s++ = d;
        for (int j = 0; j < QK_K / 4; j += 32) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(blk->qs + j));
            for (int l = 0; l < 4; l++, q += 32)
                _mm256_storeu_si256((__m256i *)q, _mm256_sub_epi8(_mm256_and_si256(_mm256_srli_epi16(v, 2 * l), three), one));
        }
    }
}

/* 16 trits of tq1_0 bytes, each byte x times its power of 3 (the lanes of pow) as the plain
 * unpacker's trit(): ((x · 3^t mod 256) · 3 >> 8) - 1, in 16-bit lanes. */
static inline __m128i trits16(__m128i bytes, __m256i pow) {
    const __m256i x = _mm256_and_si256(_mm256_mullo_epi16(_mm256_cvtepu8_epi16(bytes), pow), _mm256_set1_epi16(0xFF));
    const __m256i t = _mm256_sub_epi16(_mm256_srli_epi16(_mm256_mullo_epi16(x, _mm256_set1_epi16(3)), 8), _mm256_set1_epi16(1));
    return _mm_packs_epi16(_mm256_castsi256_si128(t), _mm256_extracti128_si256(t, 1));
}

/* tq1_0: five trits per byte of qs (a run of 32 codes per trit for its first 32 bytes, of 16 for
 * the last 16), then four per byte of qh (code 4t + j the trit t of qh[j]). */
static void unpack_tq1_0_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    enum { QS = sizeof(((block_tq1_0 *)0)->qs), QH = sizeof(((block_tq1_0 *)0)->qh) };
    _Static_assert(QS == 48 && QH == 4, "tq1_0: 32 + 16 bytes of five trits, 4 of four");
    const __m256i pow_qh = _mm256_setr_epi16(1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_tq1_0)) {
        const block_tq1_0 *blk = (const block_tq1_0 *)row;
        const float d = half_at(row + offsetof(block_tq1_0, d));
        for (int i = 0; i < QK_K / 32; i++) *s++ = d;
        const __m128i a = _mm_loadu_si128((const __m128i *)blk->qs), bb = _mm_loadu_si128((const __m128i *)(blk->qs + 16)),
                      c = _mm_loadu_si128((const __m128i *)(blk->qs + 32));
        for (int t = 0, p = 1; t < 5; t++, p *= 3, q += 32) {
            _mm_storeu_si128((__m128i *)q, trits16(a, _mm256_set1_epi16((short)p)));
            _mm_storeu_si128((__m128i *)(q + 16), trits16(bb, _mm256_set1_epi16((short)p)));
        }
        for (int t = 0, p = 1; t < 5; t++, p *= 3, q += 16)
            _mm_storeu_si128((__m128i *)q, trits16(c, _mm256_set1_epi16((short)p)));
        uint32_t qh;
        memcpy(&qh, blk->qh, 4);
        _mm_storeu_si128((__m128i *)q, trits16(_mm_set1_epi32((int)qh), pow_qh));
        q += 16;
    }
}

static inline quill_exact_unpack_fn unpack_fast(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_MXFP4: return unpack_mxfp4_simd;
    case QUILL_TYPE_IQ4_NL: return unpack_iq4_nl_simd;
    case QUILL_TYPE_IQ4_XS: return unpack_iq4_xs_simd;
    case QUILL_TYPE_IQ3_S: return unpack_iq3_s_simd;
    case QUILL_TYPE_IQ3_XXS: return unpack_iq3_xxs_simd;
    case QUILL_TYPE_IQ2_XXS: return unpack_iq2_xxs_simd;
    case QUILL_TYPE_IQ2_XS: return unpack_iq2_xs_simd;
    case QUILL_TYPE_IQ2_S: return unpack_iq2_s_simd;
    case QUILL_TYPE_IQ1_S: return unpack_iq1_s_simd;
    case QUILL_TYPE_IQ1_M: return unpack_iq1_m_simd;
    case QUILL_TYPE_Q1_0: return unpack_q1_0_simd;
    case QUILL_TYPE_Q2_0: return unpack_q2_0_simd;
    case QUILL_TYPE_TQ2_0: return unpack_tq2_0_simd;
    case QUILL_TYPE_TQ1_0: return unpack_tq1_0_simd;
    default: return NULL;
    }
}

#endif /* __x86_64__ */
#endif
