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

static inline quill_exact_unpack_fn unpack_fast(uint32_t type) {
    return type == QUILL_TYPE_MXFP4 ? unpack_mxfp4_simd : type == QUILL_TYPE_IQ3_S ? unpack_iq3_s_simd : NULL;
}

#endif
