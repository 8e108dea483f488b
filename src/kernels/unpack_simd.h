/* Vector unpackers for the unpacking kernels (exact_unpacked.h): the same codes and scales as
 * exact_unpack.c's plain ones, with byte shuffles and (iq3_s) gathers: AVX2, which every x86 set
 * that includes this has. Included
 * by the instruction-set files, which are compiled with their ISA flags. MXFP4 experts (gpt-oss)
 * spent 76 % of a token in the plain unpacker's table lookups. */
#ifndef QUILL_UNPACK_SIMD_H
#define QUILL_UNPACK_SIMD_H

#include "kernels/kernels_exact.h"
#include "tensor/types_internal.h"

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
        quill_half dh;
        memcpy(&dh, row, 2);
        const float d = quill_half_to_float(dh);
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

/* The 4 groups' sign bytes of iq2_xxs / iq3_xxs: 7 stored bits each (bits 7l.. of aux), the 8th
 * their parity. */
static inline uint32_t iq_signs4(uint32_t aux) {
    return (uint32_t)quill_iq_signs(aux & 127) | (uint32_t)quill_iq_signs((aux >> 7) & 127) << 8 |
           (uint32_t)quill_iq_signs((aux >> 14) & 127) << 16 | (uint32_t)quill_iq_signs((aux >> 21) & 127) << 24;
}

/* The 4 groups' 8-byte grid words of 32 codes, at the 4 indices of idx. */
static inline __m256i grid4(const uint64_t *grid, __m128i idx) {
    return _mm256_i32gather_epi64((const long long *)grid, idx, 8);
}

static void unpack_iq2_xxs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_xxs)) {
        quill_half dh;
        memcpy(&dh, row, 2);
        const float d = quill_half_to_float(dh);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            uint32_t idx, aux;
            memcpy(&idx, row + 2 + 8 * ib, 4);
            memcpy(&aux, row + 2 + 8 * ib + 4, 4);
            *s++ = d * (0.5f + (float)(aux >> 28)) * 0.25f;
            const __m256i mag = grid4(quill_iq2xxs_grid, _mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)idx)));
            _mm256_storeu_si256((__m256i *)q, apply_signs32(mag, iq_signs4(aux)));
        }
    }
}

/* iq2_xs: per group a 16-bit word, the grid index in its low 9 bits, 7 sign bits above. */
static void unpack_iq2_xs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i index_bits = _mm_set1_epi32(511);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_xs)) {
        const block_iq2_xs *blk = (const block_iq2_xs *)row;
        quill_half dh;
        memcpy(&dh, row, 2);
        const float d = quill_half_to_float(dh);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            const uint8_t sc = blk->scales[ib];
            *s++ = d * (0.5f + (float)(sc & 0xF)) * 0.25f;
            *s++ = d * (0.5f + (float)(sc >> 4)) * 0.25f;
            uint16_t v[4];
            memcpy(v, row + offsetof(block_iq2_xs, qs) + 8 * ib, sizeof v);
            const __m128i words = _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)v));
            const __m256i mag = grid4(quill_iq2xs_grid, _mm_and_si128(words, index_bits));
            const uint32_t signs = (uint32_t)quill_iq_signs(v[0] >> 9) | (uint32_t)quill_iq_signs(v[1] >> 9) << 8 |
                                   (uint32_t)quill_iq_signs(v[2] >> 9) << 16 | (uint32_t)quill_iq_signs(v[3] >> 9) << 24;
            _mm256_storeu_si256((__m256i *)q, apply_signs32(mag, signs));
        }
    }
}

/* iq2_s: group l's index is qs[l] with bits 2l, 2l + 1 of qh as its ninth and tenth; its 8 sign
 * bits are stored whole. */
static void unpack_iq2_s_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i shifts = _mm_set_epi32(6, 4, 2, 0), three = _mm_set1_epi32(3);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq2_s)) {
        const block_iq2_s *blk = (const block_iq2_s *)row;
        quill_half dh;
        memcpy(&dh, row, 2);
        const float d = quill_half_to_float(dh);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            *s++ = d * (0.5f + (float)(blk->scales[ib] & 0xF)) * 0.25f;
            *s++ = d * (0.5f + (float)(blk->scales[ib] >> 4)) * 0.25f;
            uint32_t lo, signs;
            memcpy(&lo, blk->qs + 4 * ib, 4);
            memcpy(&signs, blk->qs + QK_K / 8 + 4 * ib, 4);
            const __m128i hi = _mm_slli_epi32(_mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(blk->qh[ib]), shifts), three), 8);
            const __m256i mag = grid4(quill_iq2s_grid, _mm_or_si128(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)lo)), hi));
            _mm256_storeu_si256((__m256i *)q, apply_signs32(mag, signs));
        }
    }
}

/* iq3_xxs: 8 byte indices of 4-byte grid words per 32 codes, signs and scale as iq2_xxs's. */
static void unpack_iq3_xxs_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq3_xxs)) {
        quill_half dh;
        memcpy(&dh, row, 2);
        const float d = quill_half_to_float(dh);
        const uint8_t *qs = row + 2, *scales_and_signs = row + 2 + QK_K / 4;
        for (int ib = 0; ib < QK_K / 32; ib++, qs += 8, q += 32) {
            uint32_t aux;
            memcpy(&aux, scales_and_signs + 4 * ib, 4);
            *s++ = d * (0.5f + (float)(aux >> 28)) * 0.5f;
            const __m256i idx = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qs));
            const __m256i mag = _mm256_i32gather_epi32((const int *)quill_iq3xxs_grid, idx, 4);
            _mm256_storeu_si256((__m256i *)q, apply_signs32(mag, iq_signs4(aux)));
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
    const __m128i shifts = _mm_set_epi32(9, 6, 3, 0), seven = _mm_set1_epi32(7);
    for (int64_t b = 0; b < n / QK_K; b++, row += sizeof(block_iq1_s)) {
        const block_iq1_s *blk = (const block_iq1_s *)row;
        quill_half dh;
        memcpy(&dh, row, 2);
        const float d = quill_half_to_float(dh);
        for (int ib = 0; ib < QK_K / 32; ib++, q += 32) {
            uint16_t qh;
            uint32_t lo;
            memcpy(&qh, row + offsetof(block_iq1_s, qh) + 2 * ib, 2);
            memcpy(&lo, blk->qs + 4 * ib, 4);
            *s++ = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
            const __m128i hi = _mm_slli_epi32(_mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32(qh), shifts), seven), 8);
            const __m256i grid = grid4(quill_iq1s_grid, _mm_or_si128(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)lo)), hi));
            _mm256_storeu_si256((__m256i *)q, iq1_codes(grid, _mm256_set1_epi8(qh & 0x8000 ? -1 : 1)));
        }
    }
}

/* iq1_m: a nibble of qh per group (its index's top three bits, then its shift's sign), two 3-bit
 * scales per 32 codes in the scale words, the half scale in their top nibbles. */
static void unpack_iq1_m_simd(const uint8_t *row, int64_t n, int8_t *q, float *s, float *mins) {
    (void)mins;
    const __m128i shifts = _mm_set_epi32(12, 8, 4, 0), seven = _mm_set1_epi32(7), eight = _mm_set1_epi32(8);
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
            const __m128i nibbles = _mm_srlv_epi32(_mm_set1_epi32(blk->qh[2 * ib] | blk->qh[2 * ib + 1] << 8), shifts);
            const __m128i hi = _mm_slli_epi32(_mm_and_si128(nibbles, seven), 8);
            const __m256i grid = grid4(quill_iq1s_grid, _mm_or_si128(_mm_cvtepu8_epi32(_mm_cvtsi32_si128((int)lo)), hi));
            const __m256i minus = _mm256_cvtepi32_epi64(_mm_cmpeq_epi32(_mm_and_si128(nibbles, eight), eight));
            _mm256_storeu_si256((__m256i *)q, iq1_codes(grid, _mm256_or_si256(minus, one)));
        }
    }
}

static inline quill_exact_unpack_fn unpack_fast(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_MXFP4: return unpack_mxfp4_simd;
    case QUILL_TYPE_IQ3_S: return unpack_iq3_s_simd;
    case QUILL_TYPE_IQ3_XXS: return unpack_iq3_xxs_simd;
    case QUILL_TYPE_IQ2_XXS: return unpack_iq2_xxs_simd;
    case QUILL_TYPE_IQ2_XS: return unpack_iq2_xs_simd;
    case QUILL_TYPE_IQ2_S: return unpack_iq2_s_simd;
    case QUILL_TYPE_IQ1_S: return unpack_iq1_s_simd;
    case QUILL_TYPE_IQ1_M: return unpack_iq1_m_simd;
    default: return NULL;
    }
}

#endif
