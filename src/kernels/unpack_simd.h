/* Vector unpackers for the unpacking kernels (exact_unpacked.h): the same codes and scales as
 * exact_unpack.c's plain ones, with byte shuffles (SSSE3, which every x86 set here has). Included
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

static inline quill_exact_unpack_fn unpack_fast(uint32_t type) {
    return type == QUILL_TYPE_MXFP4 ? unpack_mxfp4_simd : NULL;
}

#endif
