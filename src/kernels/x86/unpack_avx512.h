/* Register-level unpacking for the AVX-512 kernels (kernels_avx512.c; include it only from a file
 * built with AVX-512). Every function yields exactly the floats the type's to_float writes. */
#ifndef QUILL_UNPACK_AVX512_H
#define QUILL_UNPACK_AVX512_H

#include "tensor/types_internal.h"

#include <immintrin.h>

/* Weights 32k .. 32k+31 of half `hf` (0, 1) of a q6_K super-block, as two 16-lane vectors. In a
 * 128-weight half, quarter k takes the low nibbles of ql[0..31] (k=0), of ql[32..63] (k=1), then
 * the high nibbles (k=2, 3); the top two bits come from qh at shift 2k; each 16 weights have their
 * own signed scale. The -32 offset is applied in integers (exact either way). */
static inline __attribute__((always_inline)) void quill_q6_K_unpack32(const block_q6_K *b, float d, int hf, int k,
                                                                      __m512 w[2]) {
    const __m128i low = _mm_set1_epi8(0x0F), three = _mm_set1_epi8(3);
    const uint8_t *ql = b->ql + 64 * hf, *qh = b->qh + 32 * hf;
    const int8_t *sc = b->scales + 8 * hf;
    for (int h = 0; h < 2; h++) {
        __m128i l = _mm_loadu_si128((const __m128i *)(ql + (k & 1) * 32 + 16 * h));
        if (k >= 2) l = _mm_srli_epi16(l, 4);
        l = _mm_and_si128(l, low);
        __m128i hb = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(qh + 16 * h)), 2 * k), three);
        __m512i q = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_or_si128(l, _mm_slli_epi16(hb, 4))),
                                     _mm512_set1_epi32(32));
        w[h] = _mm512_mul_ps(_mm512_set1_ps(d * sc[2 * k + h]), _mm512_cvtepi32_ps(q));
    }
}

#endif
