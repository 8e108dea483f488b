/* What the AVX-512 exact kernels share (kernels_amx.c, kernels_vnni.c, kernels_vnni_pack.c): the
 * activation codes, reading weight tiles from a file's rows, and decoding on the vector unit (one
 * token, by VNNI byte products), which both sets use. exact_scalar.c defines the arithmetic.
 *   - vnni (AVX-512 VNNI and VBMI, e.g. Ice Lake, Zen 4): all on the vector unit. One token
 *     (decoding) by VNNI byte products over the two bytes of each code, C = 256·Σq·h + Σq·l (lanes
 *     are rows); batches with the codes unpacked once per chunk for many tokens (kernels_vnni.c),
 *     and weights in a load-time layout (kernels_vnni_pack.c).
 *   - amx (Sapphire Rapids and later): batches on the tile unit's bf16 products (16 rows × 32 k ×
 *     16 tokens per product, lanes are tokens); one token as the vnni set decodes it
 *     (kernels_amx.c).
 * Both give the same C and the same f32 steps in the same order, on any thread: results are
 * bitwise batch- and thread-invariant, equal to the scalar model's bit for bit.
 *
 * Only files built with the AVX-512 VNNI flags include this header. */
#ifndef QUILL_EXACT_AVX512_H
#define QUILL_EXACT_AVX512_H

#include "kernels/kernels.h"
#include "base/threadpool.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels_exact.h"

#if defined(__x86_64__)
#include <immintrin.h>

#define TR 16         /* weight rows per tile */
#define GT 16         /* tokens per token group: the tile's 16 columns */
#define CW 256        /* weight columns unpacked at a time (one k-quant super-block) */
#define TCW 128       /* the same for the tile loop: its buffers and a chunk's activations fit L1 */
#define MAX_GROUPS 4  /* token groups accumulated per pass over the weights (64 tokens) */

/* quantize_block on AVX-512, giving the same codes (in 32-bit lanes, 16 columns per register): the
 * same f32 max, division and product, rounded to nearest even as nearbyintf does by default, and
 * the same rounding to 8 significant bits. */
static inline __attribute__((always_inline)) float quantize_codes(const float *x, uint32_t type, __m512i a[2],
                                                                  int32_t *sum) {
    const __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
    const bool nan = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(x1, x1, _CMP_UNORD_Q);
    if (!(amax > 0) || !isfinite(amax) || nan) { /* zeros, or inf / nan: the scalar path decides */
        int16_t c[32];
        const float da = quantize_block(x, type, c, sum);
        a[0] = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)c));
        a[1] = _mm512_cvtepi16_epi32(_mm256_loadu_si256((const __m256i *)(c + 16)));
        return da;
    }
    const int qa = act_max(type);
    const __m512 id = _mm512_set1_ps((float)qa / amax);
    const __m512i qmax = _mm512_set1_epi32(qa), qmin = _mm512_set1_epi32(-qa);
    const __m512i half = _mm512_set1_epi32(0x7FFF), one = _mm512_set1_epi32(1), top = _mm512_set1_epi32((int)0xFFFF0000u);
    for (int i = 0; i < 2; i++) {
        const __m512i v = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(i ? x1 : x0, id)), qmin), qmax);
        __m512i u = _mm512_castps_si512(_mm512_cvtepi32_ps(v));
        u = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(half, _mm512_and_si512(_mm512_srli_epi32(u, 16), one))), top);
        a[i] = _mm512_cvttps_epi32(_mm512_castsi512_ps(u));
    }
    *sum = _mm512_reduce_add_epi32(_mm512_add_epi32(a[0], a[1]));
    return amax / (float)qa;
}

/* ---------------------------------------------------------------- weights into tile rows
 *
 * A chunk: TR rows × CW columns of codes in abuf (slot by slot, see put64), and each sub-block's
 * scales for the TR rows at s[i][TR] (m[i][TR] for the types with minimums). Gathers read
 * a row's scales at `idx` (row offsets). */

typedef struct {
    uint32_t type;
    const uint8_t *w; /* first row of the tile */
    size_t row_bytes;
    int nr;           /* rows present (the rest are zero) */
    __m512i idx;
    __mmask16 mask;
} tile_src;

/* The tile of rows [r0, r0 + TR) of a matrix (fewer at its end). */
static inline tile_src tile_at(uint32_t type, const uint8_t *w, size_t row_bytes, int64_t rows, int64_t r0) {
    const int nr = rows - r0 < TR ? (int)(rows - r0) : TR;
    const tile_src t = {type, w + (size_t)r0 * row_bytes, row_bytes, nr,
                        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32((int)row_bytes)),
                        (__mmask16)((1u << nr) - 1)};
    return t;
}

static inline __m512 gather_half_lo(const tile_src *t, const uint8_t *base) {
    __m512i v = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), t->mask, t->idx, base, 1);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
}

/* The sub-block scales of a k-quant super-block for 16 rows (rows in lanes) from its leading
 * 32-bit words: for q4_K / q5_K words 0-3 are (d, dmin) and the 12 packed scale bytes; for q6_K
 * words 0-3 are the 16 signed scales and word 4 holds d in its high half (the 4 bytes ending where
 * the block ends). */
static inline __attribute__((always_inline)) void kquant_scales(uint32_t type, const __m512i *w, float (*s)[TR],
                                                                float (*m)[TR]) {
    if (type == QUILL_TYPE_Q6_K) {
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w[4], 16)));
        for (int g = 0; g < 4; g++)
            for (int j = 0; j < 4; j++) {
                __m512i v = _mm512_srai_epi32(_mm512_slli_epi32(w[g], 24 - 8 * j), 24);
                _mm512_store_ps(s[4 * g + j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(v)));
            }
        return;
    }
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(w[0]));
    const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w[0], 16)));
    const __m512i m6 = _mm512_set1_epi32(0x3F3F3F3F), m4 = _mm512_set1_epi32(0x0F0F0F0F), m2 = _mm512_set1_epi32(0x30303030);
    /* bytes j of sc[0]/mn[0] are sub-blocks j < 4, of sc[1]/mn[1] sub-blocks 4 + j (see quill_scale_min_k4) */
    __m512i sc[2], mn[2];
    sc[0] = _mm512_and_si512(w[1], m6);
    mn[0] = _mm512_and_si512(w[2], m6);
    sc[1] = _mm512_or_si512(_mm512_and_si512(w[3], m4), _mm512_and_si512(_mm512_srli_epi32(w[1], 2), m2));
    mn[1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w[3], 4), m4), _mm512_and_si512(_mm512_srli_epi32(w[2], 2), m2));
    const __m512i ff = _mm512_set1_epi32(0xFF);
    for (int j = 0; j < 8; j++) {
        __m512i vs = _mm512_and_si512(_mm512_srli_epi32(sc[j / 4], 8 * (j % 4)), ff);
        __m512i vm = _mm512_and_si512(_mm512_srli_epi32(mn[j / 4], 8 * (j % 4)), ff);
        _mm512_store_ps(s[j], _mm512_mul_ps(d, _mm512_cvtepi32_ps(vs)));
        _mm512_store_ps(m[j], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(vm)));
    }
}

/* The scales of q2_K and q3_K super-blocks for 16 rows (rows in lanes), from 16 bytes of each row
 * as words w[0..3]: q2_K's 16 scale bytes (4-bit scale, 4-bit minimum), with d and dmin in `dm`;
 * q3_K's 12 bytes of 6-bit scales from byte 2 of the window, which ends with d (the 16 bytes
 * before the block's end: a read past it could leave the mapping). */
static inline __m512i window_byte(const __m512i w[4], int p) {
    return _mm512_and_si512(_mm512_srli_epi32(w[p / 4], (unsigned)(8 * (p % 4))), _mm512_set1_epi32(0xFF));
}
static inline __attribute__((always_inline)) void lowbit_scales(uint32_t type, const __m512i w[4], __m512i dm,
                                                                float (*s)[TR], float (*m)[TR]) {
    const __m512i low = _mm512_set1_epi32(0xF);
    if (type == QUILL_TYPE_Q2_K) {
        const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm));
        const __m512 dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(dm, 16)));
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const __m512i b = window_byte(w, i);
            _mm512_store_ps(s[i], _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_and_si512(b, low))));
            _mm512_store_ps(m[i], _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(_mm512_srli_epi32(b, 4))));
        }
        return;
    }
    const __m512 d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32(w[3], 16)));
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) { /* as quill_q3_K_scales */
        const __m512i lo = i < 8 ? _mm512_and_si512(window_byte(w, 2 + i), low) : _mm512_srli_epi32(window_byte(w, 2 + i - 8), 4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(window_byte(w, 2 + 8 + (i & 3)), (unsigned)(2 * (i >> 2))),
                                            _mm512_set1_epi32(3));
        const __m512i sc = _mm512_sub_epi32(_mm512_or_si512(lo, _mm512_slli_epi32(hi, 4)), _mm512_set1_epi32(32));
        _mm512_store_ps(s[i], _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc)));
    }
}
/* Where lowbit_scales' 16 bytes start in a block, and (q2_K) its d and dmin. */
#define Q3_K_SCALE_WINDOW (offsetof(block_q3_K, d) + 2 - 16)
_Static_assert(offsetof(block_q3_K, d) + 2 == sizeof(block_q3_K) && offsetof(block_q3_K, scales) == Q3_K_SCALE_WINDOW + 2,
               "q3_K: 12 scale bytes, then d, end the block");

/* Always inlined: as a call (gcc's choice for this switch over the types) each 32-column step of
 * the decoding loop paid a vzeroupper and the shuffling of live registers around it, 1.27x the
 * q4_0 loop's time from cache. */
static inline __attribute__((always_inline)) void unpack_scales(const tile_src *t, int64_t k0, int n_slots,
                                                                float (*s)[TR], float (*m)[TR]) {
    switch (t->type) {
    case QUILL_TYPE_Q4_0:
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1:
    case QUILL_TYPE_Q8_0: {
        /* d first in every block; q4_1 and q5_1 keep their minimum next (negated: they add it) */
        const size_t bs = block_bytes(t->type);
        for (int i = 0; i < n_slots; i++) {
            const uint8_t *b = t->w + (size_t)(k0 / 32 + i) * bs;
            _mm512_store_ps(s[i], gather_half_lo(t, b));
            if (has_min(t->type)) _mm512_store_ps(m[i], _mm512_sub_ps(_mm512_setzero_ps(), gather_half_lo(t, b + 2)));
        }
        break;
    }
    case QUILL_TYPE_Q4_K:
    case QUILL_TYPE_Q5_K: { /* the same d, dmin and scales at the start of the block */
        const uint8_t *b = t->w + (size_t)(k0 / 256) * block_bytes(t->type);
        const __m512i z = _mm512_setzero_si512();
        __m512i w[5] = {z, z, z, z, z}; /* kquant_scales reads a fifth word for q6_K only */
        for (int i = 0; i < 4; i++) w[i] = _mm512_mask_i32gather_epi32(z, t->mask, t->idx, b + 4 * i, 1);
        kquant_scales(t->type, w, s, m);
        break;
    }
    case QUILL_TYPE_Q2_K:
    case QUILL_TYPE_Q3_K: {
        const uint8_t *b = t->w + (size_t)(k0 / 256) * block_bytes(t->type);
        const size_t at = t->type == QUILL_TYPE_Q2_K ? 0 : Q3_K_SCALE_WINDOW;
        const __m512i z = _mm512_setzero_si512();
        __m512i w[4];
        for (int i = 0; i < 4; i++) w[i] = _mm512_mask_i32gather_epi32(z, t->mask, t->idx, b + at + 4 * i, 1);
        const __m512i dm = t->type == QUILL_TYPE_Q2_K
                               ? _mm512_mask_i32gather_epi32(z, t->mask, t->idx, b + offsetof(block_q2_K, d), 1)
                               : z;
        lowbit_scales(t->type, w, dm, s, m);
        break;
    }
    case QUILL_TYPE_Q6_K: {
        _Static_assert(offsetof(block_q6_K, d) == offsetof(block_q6_K, scales) + 16, "q6_K: d follows the scales");
        const uint8_t *b = t->w + (size_t)(k0 / 256) * sizeof(block_q6_K) + offsetof(block_q6_K, scales);
        const __m512i z = _mm512_setzero_si512();
        __m512i w[5];
        for (int i = 0; i < 4; i++) w[i] = _mm512_mask_i32gather_epi32(z, t->mask, t->idx, b + 4 * i, 1);
        w[4] = _mm512_mask_i32gather_epi32(z, t->mask, t->idx, b + 14, 1);
        kquant_scales(t->type, w, s, m);
        break;
    }
    default: break;
    }
}

/* vpermb indices of the 32-element formats (q4_0, q4_1, q5_0, q5_1): lane i takes byte
 * (i / 32) * block + qs + i % 16 of two consecutive blocks. */
static _Alignas(64) const uint8_t legacy_perm[4][64] = {
    {2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
     16, 17, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 20, 21, 22, 23, 24, 25, 26, 27,
     28, 29, 30, 31, 32, 33, 34, 35},
    {4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16,
     17, 18, 19, 24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 24, 25, 26, 27, 28, 29, 30,
     31, 32, 33, 34, 35, 36, 37, 38, 39},
    {6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17,
     18, 19, 20, 21, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 28, 29, 30, 31, 32, 33,
     34, 35, 36, 37, 38, 39, 40, 41, 42, 43},
    {8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18,
     19, 20, 21, 22, 23, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 32, 33, 34, 35, 36,
     37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47}};

/* Unsigned codes q + bias of one row's 64 columns from column k (a multiple of 64; with `half`,
 * the last 32 columns of a row of 32-blocks, and the upper half of the result is not used),
 * unpacked in registers. */
static inline __attribute__((always_inline)) __m512i codes64(uint32_t type, const uint8_t *row, int64_t k, bool half) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    switch (type) {
    case QUILL_TYPE_Q4_0:
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1: {
        /* two blocks: byte j of each 16-byte nibble array to positions j and 16 + j of that block's
         * 32-byte half, then the upper 16 of each half take the high nibble; the 5-bit formats
         * add their fifth bits, bit j of qh for element j */
        const int bs = (int)block_bytes(type);
        const int which = type == QUILL_TYPE_Q4_0 ? 0 : type == QUILL_TYPE_Q4_1 ? 1 : type == QUILL_TYPE_Q5_0 ? 2 : 3;
        const __m512i idx = _mm512_load_si512(legacy_perm[which]);
        const uint8_t *b = row + (size_t)(k / 32) * (size_t)bs;
        const __mmask64 bytes = half ? ((__mmask64)1 << bs) - 1 : ((__mmask64)1 << (2 * bs)) - 1;
        __m512i v = _mm512_permutexvar_epi8(idx, _mm512_maskz_loadu_epi8(bytes, b));
        v = _mm512_and_si512(_mm512_mask_srli_epi16(v, 0xFF00FF00u, v, 4), low);
        if (legacy_qh(type)) {
            uint32_t h0, h1 = 0;
            memcpy(&h0, b + legacy_qh(type), 4);
            if (!half) memcpy(&h1, b + bs + legacy_qh(type), 4);
            v = _mm512_or_si512(v, _mm512_maskz_set1_epi8((__mmask64)h0 | (__mmask64)h1 << 32, 0x10));
        }
        return v;
    }
    case QUILL_TYPE_Q8_0: {
        const block_q8_0 *b = (const block_q8_0 *)row + k / 32;
        const __m256i lo = _mm256_loadu_si256((const __m256i *)b->qs);
        const __m256i hi = half ? _mm256_setzero_si256() : _mm256_loadu_si256((const __m256i *)b[1].qs);
        return _mm512_xor_si512(_mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1), _mm512_set1_epi8((char)0x80));
    }
    case QUILL_TYPE_Q4_K: {
        /* 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high ones */
        const block_q4_K *b = (const block_q4_K *)row + k / 256;
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + k % 256 / 2)));
        return _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), low);
    }
    case QUILL_TYPE_Q5_K: {
        /* as q4_K, plus bit 2c (low nibbles) or 2c + 1 (high nibbles) of qh as the fifth bit */
        const block_q5_K *b = (const block_q5_K *)row + k / 256;
        const int c = (int)(k % 256) / 64;
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qs + k % 256 / 2)));
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)b->qh));
        const __m512i lo = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 4, 4, 0, 0, 0, 0)), low);
        const __m512i sh = _mm512_set_epi64(2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c + 1, 2 * c, 2 * c, 2 * c, 2 * c);
        const __m512i bit = _mm512_and_si512(_mm512_srlv_epi64(qh, sh), _mm512_set1_epi8(1));
        return _mm512_or_si512(lo, _mm512_slli_epi16(bit, 4));
    }
    case QUILL_TYPE_Q2_K:
    case QUILL_TYPE_Q3_K: {
        /* column 32j + l of a 128-column half h is bits 2j, 2j + 1 of qs[32h + l]; q3_K's third bit
         * is bit 4h + j of hmask[l] (u = q + 4) */
        const int h = (int)(k % 256) / 128, j = (int)(k % 128) / 32;
        const uint8_t *qs = type == QUILL_TYPE_Q2_K ? ((const block_q2_K *)row + k / 256)->qs
                                                    : ((const block_q3_K *)row + k / 256)->qs;
        const __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(qs + 32 * h)));
        __m512i u = _mm512_and_si512(_mm512_srlv_epi64(v, _mm512_set_epi64(2 * j + 2, 2 * j + 2, 2 * j + 2, 2 * j + 2,
                                                                            2 * j, 2 * j, 2 * j, 2 * j)),
                                     _mm512_set1_epi8(3));
        if (type == QUILL_TYPE_Q3_K) {
            const __m512i hm = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)((const block_q3_K *)row + k / 256)->hmask));
            const int b = 4 * h + j;
            const __m512i bit = _mm512_and_si512(_mm512_srlv_epi64(hm, _mm512_set_epi64(b + 1, b + 1, b + 1, b + 1, b, b, b, b)),
                                                 _mm512_set1_epi8(1));
            u = _mm512_or_si512(u, _mm512_slli_epi16(bit, 2));
        }
        return u;
    }
    default: {
        /* q6_K: columns 0-63 of a 128-half take the low nibbles of ql, 64-127 the high, and two
         * bits of qh each (shifted by 0, 2, 4, 6 for its four 32-column quarters) */
        const block_q6_K *b = (const block_q6_K *)row + k / 256;
        const int hf = (int)(k % 256) / 128;
        const __m512i m30 = _mm512_set1_epi8(0x30);
        const __m512i ql = _mm512_loadu_si512(b->ql + 64 * hf);
        const __m512i qh = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(b->qh + 32 * hf)));
        if (k % 128 == 0)
            return _mm512_or_si512(_mm512_and_si512(ql, low),
                                   _mm512_and_si512(_mm512_sllv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 4, 4, 4, 4)), m30));
        return _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), low),
                               _mm512_and_si512(_mm512_srlv_epi64(qh, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m30));
    }
    }
}

/* ---------------------------------------------------------------- decoding on the vector unit
 *
 * One token leaves 15 of the tile's 16 columns empty and pays a tile store and reload per 512
 * weights, which made the tile unit ~3x slower than the vector unit here. The vector unit computes
 * the same exact integer sums from the two bytes of each code, a = 256·h + l (vpdpbusd: unsigned
 * codes u = q + bias times signed h or l bytes, four products per lane, then C = 256·Σu·h + Σu·l -
 * bias·Σa), reduces them so that lanes are rows, and applies the same f32 steps as the tile loop:
 * bit-identical results. */

typedef struct {
    int8_t *h, *l;         /* byte planes of the codes, a = 256·h + l, column order */
    __m512i *hx, *lx;      /* per 16 columns: their 16 h (l) bytes in each 128-bit lane */
    int32_t *bias_sum;     /* per slot (the type's sub-block): bias·Σa, see lane_sums */
    float *da, *sf;        /* per block of 32: scale, da·Σa */
    float *sf16;           /* per 16 columns: da·Σa, the minimums' term of q2_K's sub-blocks of 16 */
} planes;

static inline size_t planes_bytes(int64_t cols) {
    return (size_t)cols * 10 + (size_t)(cols / 16) * 8 + (size_t)(cols / 32) * 8 + 64;
}

/* The planes of one token in scratch (64-byte aligned). */
static inline planes planes_at(void *scratch, int64_t cols) {
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    planes P;
    P.hx = (__m512i *)base;
    P.lx = P.hx + cols / 16;
    P.bias_sum = (int32_t *)(P.lx + cols / 16);
    P.da = (float *)(P.bias_sum + cols / 16);
    P.sf = P.da + cols / 32;
    P.sf16 = P.sf + cols / 32;
    P.h = (int8_t *)(P.sf16 + cols / 16);
    P.l = P.h + cols;
    return P;
}

/* The per-block numbers the decoding steps use, computed once per token here so that the steps
 * take them straight from memory (embedded broadcasts) instead of computing and broadcasting them
 * on the vector unit's shuffle port, which the steps keep busy. With `words` (the token's first
 * dword in the word products' view, see decode_job), each pair of codes also goes there. */
static inline void quantize_planes(uint32_t type, const float *x, int64_t cols, const planes *P, bool broadcasts,
                            int32_t *words, int words_stride) {
    const int bias = code_bias(type);
    for (int64_t blk = 0; blk < cols / 32; blk++) {
        int8_t *h = P->h + blk * 32, *l = P->l + blk * 32;
        __m512i a[2];
        int32_t sum;
        P->da[blk] = quantize_codes(x + blk * 32, type, a, &sum);
        P->sf[blk] = P->da[blk] * (float)sum;
        int32_t part[2];
        for (int i = 0; i < 2; i++) {
            const __m512i lo = _mm512_srai_epi32(_mm512_slli_epi32(a[i], 24), 24);
            const __m512i hi = _mm512_srai_epi32(_mm512_sub_epi32(a[i], lo), 8);
            _mm_storeu_si128((__m128i *)(h + 16 * i), _mm512_cvtepi32_epi8(hi));
            _mm_storeu_si128((__m128i *)(l + 16 * i), _mm512_cvtepi32_epi8(lo));
            if (words) {
                _Alignas(32) int32_t pairs[8];
                _mm256_store_si256((__m256i *)pairs, _mm512_cvtepi32_epi16(a[i]));
                for (int p = 0; p < 8; p++) words[(size_t)(blk * 16 + 8 * i + p) * (size_t)words_stride] = pairs[p];
            }
            part[i] = _mm512_reduce_add_epi32(a[i]);
            P->sf16[2 * blk + i] = P->da[blk] * (float)part[i];
        }
        if (slot_width(type) == 32) P->bias_sum[blk] = bias * (part[0] + part[1]);
        else P->bias_sum[2 * blk] = bias * part[0], P->bias_sum[2 * blk + 1] = bias * part[1];
        /* only the file layout's decoding loop reads these (the packed one and the batch loop
         * broadcast from h and l). 16 KiB per 2048 columns, which the caller writes while the
         * other threads wait: with 2 threads a 2048-column input took 11.3k cycles with them and
         * 4.7k without (one thread: 3.1k and 2.9k); 2-thread decoding +2.2 % (q4_0, in-process
         * alternation) */
        if (!broadcasts) continue;
        for (int q = 0; q < 2; q++) {
            P->hx[blk * 2 + q] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(h + 16 * q)));
            P->lx[blk * 2 + q] = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(l + 16 * q)));
        }
    }
}

/* da·Σa over a slot for the minimums' term: its block of 32's, or for slots of 16 (q2_K) its own. */
static inline float min_term(const planes *P, int slot_width, int64_t slot_k, int64_t blk) {
    return slot_width == 16 ? P->sf16[slot_k] : P->sf[blk];
}

/* Decoding works on four rows at a time in one register, each row in its own 128-bit lane
 * (16 codes): vpdpbusd then adds, per lane, 4 products of one row, and a 32-column sub-block
 * leaves 4 lane sums per row to add up (a row per register left 8, spread over more registers),
 * so reducing sixteen rows to "rows in lanes" costs 9 instructions per sub-block and plane
 * instead of ~22. Register j (0..3) holds rows j, j+4, j+8
 * and j+12: with that order the reduction below ends with row r in lane r. */
static inline __attribute__((always_inline)) __m512i load4(const uint8_t *const rp[TR], int j, size_t off) {
    __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[j] + off)));
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[j + 4] + off)), 1);
    v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[j + 8] + off)), 2);
    return _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[j + 12] + off)), 3);
}

/* Lane sums of registers 0..3 (rows as above) to one sum per row, row r in lane r. Integer sums:
 * any order is exact. */
static inline __attribute__((always_inline)) __m512i reduce4(const __m512i a[4]) {
    const __m512i t01 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[0], a[1]), _mm512_unpackhi_epi32(a[0], a[1]));
    const __m512i t23 = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2], a[3]), _mm512_unpackhi_epi32(a[2], a[3]));
    return _mm512_add_epi32(_mm512_unpacklo_epi64(t01, t23), _mm512_unpackhi_epi64(t01, t23));
}

/* The 32-bit words w of 16 bytes at offset `at` of the 16 rows, row r in lane r: load4's
 * registers transposed within their 128-bit lanes. */
static inline __attribute__((always_inline)) void words16(const uint8_t *const rp[TR], size_t at, __m512i w[4]) {
    const __m512i a0 = load4(rp, 0, at), a1 = load4(rp, 1, at), a2 = load4(rp, 2, at), a3 = load4(rp, 3, at);
    const __m512i t0 = _mm512_unpacklo_epi32(a0, a1), t1 = _mm512_unpackhi_epi32(a0, a1);
    const __m512i t2 = _mm512_unpacklo_epi32(a2, a3), t3 = _mm512_unpackhi_epi32(a2, a3);
    w[0] = _mm512_unpacklo_epi64(t0, t2);
    w[1] = _mm512_unpackhi_epi64(t0, t2);
    w[2] = _mm512_unpacklo_epi64(t1, t3);
    w[3] = _mm512_unpackhi_epi64(t1, t3);
}

/* unpack_scales for the k-quants when decoding: the same words from plain loads of the rows the
 * codes come from, instead of gathers (which cost ~7 % of a q4_k_m token). */
static inline __attribute__((always_inline)) void row_kquant_scales(uint32_t type, const uint8_t *const rp[TR],
                                                                    int64_t k0, float (*s)[TR], float (*m)[TR]) {
    const size_t at = (size_t)(k0 / 256) * block_bytes(type);
    __m512i w[5];
    if (type == QUILL_TYPE_Q2_K || type == QUILL_TYPE_Q3_K) {
        __m512i dm[4];
        words16(rp, at + (type == QUILL_TYPE_Q2_K ? 0 : Q3_K_SCALE_WINDOW), w);
        if (type == QUILL_TYPE_Q2_K) words16(rp, at + sizeof(block_q2_K) - 16, dm); /* its word 3 is d, dmin */
        lowbit_scales(type, w, type == QUILL_TYPE_Q2_K ? dm[3] : w[3], s, m);
        return;
    }
    if (type == QUILL_TYPE_Q6_K) {
        __m512i dw[4];
        words16(rp, at + offsetof(block_q6_K, scales), w);
        words16(rp, at + offsetof(block_q6_K, scales) + 2, dw); /* its word 3 ends with d */
        w[4] = dw[3];
    } else {
        words16(rp, at, w);
    }
    kquant_scales(type, w, s, m);
}

/* Adds 16 to the codes whose fifth bit is set, for the 32-element 5-bit formats: each lane's
 * first 4 bytes hold its row's qh, bit i for element i; elements 0-15 are part 0, 16-31 part 1. */
static inline __attribute__((always_inline)) void add_fifth_bits(__m512i qh, __m512i *p0, __m512i *p1) {
    const __m512i bit = _mm512_set1_epi64(0x8040201008040201ll), sixteen = _mm512_set1_epi8(16);
    const __m512i spread0 = _mm512_set_epi64(0x0101010101010101ll, 0, 0x0101010101010101ll, 0, 0x0101010101010101ll, 0,
                                             0x0101010101010101ll, 0);
    const __m512i spread1 = _mm512_add_epi8(spread0, _mm512_set1_epi8(2));
    *p0 = _mm512_mask_add_epi8(*p0, _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, spread0), bit), *p0, sixteen);
    *p1 = _mm512_mask_add_epi8(*p1, _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, spread1), bit), *p1, sixteen);
}

/* Columns per step of the decoding loop: 64 for q4_K and q5_K, whose bytes hold two sub-blocks'
 * codes 32 columns apart (and q6_K, see below), 32 for the others. */
static inline int window_width(uint32_t type) { return is_kquant(type) ? 64 : 32; }

/* Unsigned codes q + bias of rows j, j+4, j+8, j+12 (see load4) for the window_width(type)
 * columns from column k, as parts of 16 columns in column order. */
static inline __attribute__((always_inline)) void window_codes(uint32_t type, const uint8_t *const rp[TR], int j,
                                                                int64_t k, __m512i part[4]) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    switch (type) {
    case QUILL_TYPE_Q4_0:
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1: {
        /* 16 bytes of nibbles: element i low in byte i, element 16 + i high */
        const size_t at = (size_t)(k / 32) * block_bytes(type);
        const __m512i raw = load4(rp, j, at + legacy_qs(type));
        part[0] = _mm512_and_si512(raw, low);
        part[1] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
        if (legacy_qh(type)) add_fifth_bits(load4(rp, j, at + legacy_qh(type)), &part[0], &part[1]);
        break;
    }
    case QUILL_TYPE_Q8_0: {
        const __m512i flip = _mm512_set1_epi8((char)0x80);
        const size_t at = (size_t)(k / 32) * sizeof(block_q8_0) + offsetof(block_q8_0, qs);
        part[0] = _mm512_xor_si512(load4(rp, j, at), flip);
        part[1] = _mm512_xor_si512(load4(rp, j, at + 16), flip);
        break;
    }
    case QUILL_TYPE_Q4_K:
    case QUILL_TYPE_Q5_K: {
        /* 32 bytes per 64 columns: sub-block 2c in the low nibbles, 2c + 1 in the high ones; q5_K
         * adds bit 2c or 2c + 1 of qh[l] for element l of the sub-block */
        const size_t at = (size_t)(k / 256) * block_bytes(type);
        const int c = (int)(k % 256) / 64;
        const size_t qs = type == QUILL_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs);
        for (int i = 0; i < 2; i++) {
            const __m512i raw = load4(rp, j, at + qs + 32 * (size_t)c + 16 * (size_t)i);
            part[i] = _mm512_and_si512(raw, low);
            part[2 + i] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
            if (type == QUILL_TYPE_Q5_K) {
                const __m512i qh = load4(rp, j, at + offsetof(block_q5_K, qh) + 16 * (size_t)i);
                const __m512i sixteen = _mm512_set1_epi8(16);
                part[i] = _mm512_mask_add_epi8(part[i], _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c)))),
                                               part[i], sixteen);
                part[2 + i] = _mm512_mask_add_epi8(
                    part[2 + i], _mm512_test_epi8_mask(qh, _mm512_set1_epi8((char)(1 << (2 * c + 1)))), part[2 + i], sixteen);
            }
        }
        break;
    }
    default: break; /* q6_K decodes a row per register: group_sums */
    }
}

/* q6_K decodes one row per register instead: a register holds a row's 64 codes in column order
 * (codes64), whose 128-bit lanes are its four 16-column sub-blocks, so its codes need no
 * transposing, and a sub-block of 16 leaves as many lane sums to add either way.
 *
 * The reduction of sixteen rows' lane sums (16 lanes of 4 products each, over 64 columns) to
 * sums per quarter (16 columns) with rows in lanes, Q[q][r]: rows are paired (2p, 2p+1) and their
 * lanes interleaved and added, then pairs of pairs; s2[p] then holds in its 128-bit lane q the
 * quarter-q sums of rows 4p..4p+3, and a 4x4 transpose of those lanes gives Q. Integer sums:
 * any order is exact. */
static inline __attribute__((always_inline)) __m512i pair_rows(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}

static inline __attribute__((always_inline)) __m512i pair_pairs(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b));
}

static inline __attribute__((always_inline)) void quarters(const __m512i s2[4], __m512i Q[4]) {
    const __m512i t0 = _mm512_shuffle_i32x4(s2[0], s2[1], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i t1 = _mm512_shuffle_i32x4(s2[0], s2[1], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512i t2 = _mm512_shuffle_i32x4(s2[2], s2[3], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512i t3 = _mm512_shuffle_i32x4(s2[2], s2[3], _MM_SHUFFLE(3, 2, 3, 2));
    Q[0] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
    Q[1] = _mm512_shuffle_i32x4(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
    Q[2] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
    Q[3] = _mm512_shuffle_i32x4(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
}

/* Exact sums Σ u·H and Σ u·L of 16 rows over 64 columns from column k, by quarter, rows in lanes. */
static inline __attribute__((always_inline)) void group_sums(uint32_t type, const uint8_t *const rp[TR], int64_t k,
                                                             __m512i H, __m512i L, __m512i Qh[4], __m512i Ql[4]) {
    __m512i s2h[4], s2l[4];
#pragma GCC unroll 4
    for (int p = 0; p < 4; p++) {
        __m512i s1h[2], s1l[2];
#pragma GCC unroll 2
        for (int i = 0; i < 2; i++) {
            const __m512i ua = codes64(type, rp[4 * p + 2 * i], k, false), ub = codes64(type, rp[4 * p + 2 * i + 1], k, false);
            const __m512i z = _mm512_setzero_si512();
            s1h[i] = pair_rows(_mm512_dpbusd_epi32(z, ua, H), _mm512_dpbusd_epi32(z, ub, H));
            s1l[i] = pair_rows(_mm512_dpbusd_epi32(z, ua, L), _mm512_dpbusd_epi32(z, ub, L));
        }
        s2h[p] = pair_pairs(s1h[0], s1h[1]);
        s2l[p] = pair_pairs(s1l[0], s1l[1]);
    }
    quarters(s2h, Qh);
    quarters(s2l, Ql);
}


static inline __attribute__((always_inline)) __m512i shift16(__m512i v, int s) {
    return s > 0 ? _mm512_slli_epi16(v, (unsigned)s) : s < 0 ? _mm512_srli_epi16(v, (unsigned)-s) : v;
}

/* The codes of packed nibble register i of 4 (q4_0, q4_K; q5_K with its fifth bits `qh`): low
 * nibbles to *lo, high ones to *hi. */
static inline __attribute__((always_inline)) void nibble_codes(const __m512i *v, const __m512i *qh, int i, __m512i *lo,
                                                               __m512i *hi) {
    const __m512i low = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
    __m512i w = _mm512_load_si512(v + i);
    /* one load for both uses: gcc loads it twice, and loads set q4_K's pace (q5_K's fifth bits
     * measured 0.97x with it) */
    if (!qh) __asm__("" : "+v"(w));
    *lo = _mm512_and_si512(w, low);
    *hi = _mm512_and_si512(_mm512_srli_epi16(w, 4), low);
    if (qh) { /* bit 2i to bit 4, bit 2i + 1 to bit 4; ternary logic: a | (b & c) */
        *lo = _mm512_ternarylogic_epi32(*lo, shift16(*qh, 4 - 2 * i), bit4, 0xF8);
        *hi = _mm512_ternarylogic_epi32(*hi, shift16(*qh, 3 - 2 * i), bit4, 0xF8);
    }
}

/* The codes of q6_K's packed sub-block (3 registers at v), 4 columns per register g. */
static inline __attribute__((always_inline)) void q6_codes(const __m512i *v, __m512i g[4]) {
    const __m512i low = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const __m512i n0 = _mm512_load_si512(v), n1 = _mm512_load_si512(v + 1), qh = _mm512_load_si512(v + 2);
    g[0] = _mm512_ternarylogic_epi32(_mm512_and_si512(n0, low), _mm512_slli_epi16(qh, 4), top, 0xF8);
    g[1] = _mm512_ternarylogic_epi32(_mm512_and_si512(n1, low), _mm512_slli_epi16(qh, 2), top, 0xF8);
    g[2] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(n0, 4), low), qh, top, 0xF8);
    g[3] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(n1, 4), low), _mm512_srli_epi16(qh, 2), top, 0xF8);
}

/* The 4 activation bytes at `four` in every lane, and acc + their products with the unsigned bytes
 * u as vpdpbusd with that operand broadcast from memory ({1to16}): gcc 12 does not fold the
 * broadcast, clang does. Folded, q8_0's decoding ran 2-4 % faster; q4_0's and q6_K's slower
 * (q6_K 0.72x), so they keep a vpbroadcastd of their own. */
typedef int32_t four_bytes __attribute__((aligned(1), may_alias));
static inline __attribute__((always_inline)) __m512i dpbusd_bcast(__m512i acc, __m512i u, const int8_t *four) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(acc) : "v"(u), "m"(*(const four_bytes *)four));
    return acc;
}
static inline __attribute__((always_inline)) __m512i bcast4(const int8_t *four) {
    return _mm512_set1_epi32(*(const four_bytes *)four);
}

/* 16 bytes (4 words of 4) in each 128-bit lane; dword_of(v, i) then broadcasts word i (0..3). */
static inline __attribute__((always_inline)) __m512i quad_of(const int8_t *sixteen) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)sixteen));
}
static inline __attribute__((always_inline)) __m512i dword_of(__m512i quad, int i) {
    return i == 0 ? _mm512_shuffle_epi32(quad, _MM_PERM_AAAA)
         : i == 1 ? _mm512_shuffle_epi32(quad, _MM_PERM_BBBB)
         : i == 2 ? _mm512_shuffle_epi32(quad, _MM_PERM_CCCC)
                  : _mm512_shuffle_epi32(quad, _MM_PERM_DDDD);
}

/* Σu·h and Σu·l for 16 rows over 32 columns whose codes are 4 registers of nibble bytes (q4_0's
 * block, or one half-window of q4_K: then the high nibbles are 32 columns on, `hi_at`): the sums of
 * the low nibbles' columns and of the high ones' accumulate apart. */
static inline __attribute__((always_inline)) void nibble_sums(const __m512i *v, const __m512i *qh, const planes *P,
                                                              int64_t col, int64_t hi_at, __m512i *lo_h, __m512i *hi_h,
                                                              __m512i *lo_l, __m512i *hi_l) {
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        __m512i lo, hi;
        nibble_codes(v, qh, i, &lo, &hi);
        *lo_h = _mm512_dpbusd_epi32(*lo_h, lo, bcast4(P->h + col + 4 * i));
        *hi_h = _mm512_dpbusd_epi32(*hi_h, hi, bcast4(P->h + col + hi_at + 4 * i));
        *lo_l = _mm512_dpbusd_epi32(*lo_l, lo, bcast4(P->l + col + 4 * i));
        *hi_l = _mm512_dpbusd_epi32(*hi_l, hi, bcast4(P->l + col + hi_at + 4 * i));
    }
}

typedef struct {
    uint32_t type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    int n_tok;       /* 1 when decoding */
    const planes *P; /* one per token */
    float *y;        /* y[t · rows + r] */
    /* The word products' view of the tokens (n_tok >= WORD_TOKENS): per block of TBW tokens, the
     * tokens side by side, so that one pointer reaches all (a pointer each ran out of registers):
     * each pair of columns' codes as one dword per token, [block][cols / 2][TBW]; da and sf per 32
     * columns, [block][cols / 32][TBW]. */
    const int32_t *word_a;
    const float *word_da, *word_sf;
} decode_job;

/* q2_K and q3_K decode transposed, as q4_K: a byte of qs holds the codes of four columns 32 apart
 * (bits 2j, 2j + 1 for column 32j + l of a 128-column half, l < 32; q3_K's third bits likewise in
 * hmask, bit 4h + j), so words16 puts 4 consecutive columns of each row in its lane for each j, and
 * every vpdpbusd adds 4 products of one row: the slots' sums come out with rows in lanes, without
 * group_sums' reduction (q6_K's way, which these types measured ~2 % slower with). */
static inline __attribute__((always_inline)) void lowbit_lane_sums(uint32_t type, const uint8_t *const rp[TR],
                                                                   int64_t k, const planes *P, __m512i ch[4],
                                                                   __m512i cl[4]) {
    const size_t at = (size_t)(k / 256) * block_bytes(type);
    const int h = (int)(k % 256) / 128, j0 = (int)(k % 128) / 32;
    const size_t qs = (type == QUILL_TYPE_Q2_K ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs)) + 32 * (size_t)h;
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    for (int s = 0; s < 4; s++) ch[s] = cl[s] = _mm512_setzero_si512();
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        _Alignas(64) __m512i w[4], hm[4];
        words16(rp, at + qs + 16 * (size_t)i, w);
        if (type == QUILL_TYPE_Q3_K) words16(rp, at + offsetof(block_q3_K, hmask) + 16 * (size_t)i, hm);
#pragma GCC unroll 2
        for (int jj = 0; jj < 2; jj++) {
            const int j = j0 + jj, slot = 2 * jj + i;
            __m512i sh = ch[slot], sl = cl[slot];
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m512i u = _mm512_and_si512(_mm512_srli_epi32(w[g], (unsigned)(2 * j)), three);
                if (type == QUILL_TYPE_Q3_K) /* u | (hmask bit 4h + j moved to bit 2) */
                    u = _mm512_ternarylogic_epi32(u, shift16(hm[g], 2 - (4 * h + j)), four, 0xF8);
                const int64_t col = k + 32 * jj + 16 * i + 4 * g;
                sh = _mm512_dpbusd_epi32(sh, u, bcast4(P->h + col));
                sl = _mm512_dpbusd_epi32(sl, u, bcast4(P->l + col));
            }
            ch[slot] = sh, cl[slot] = sl;
        }
    }
}

/* Exact sums Σu·h and Σu·l (u the unsigned codes) of the 16 rows of rp over each slot of the
 * window_width(type) columns from k, rows in lanes: ch[s], cl[s] for slot s. */
static inline __attribute__((always_inline)) void lane_sums(uint32_t type, const uint8_t *const rp[TR], int64_t k,
                                                            const planes *P, __m512i ch[4], __m512i cl[4]) {
    const int parts_per_slot = slot_width(type) / 16, n_slots = window_width(type) / slot_width(type);
    if (type == QUILL_TYPE_Q2_K || type == QUILL_TYPE_Q3_K) {
        lowbit_lane_sums(type, rp, k, P, ch, cl);
        return;
    }
    if (type == QUILL_TYPE_Q6_K) {
        const __m512i H = _mm512_loadu_si512(P->h + k), L = _mm512_loadu_si512(P->l + k);
        group_sums(type, rp, k, H, L, ch, cl);
        return;
    }
    if (type == QUILL_TYPE_Q4_0 || type == QUILL_TYPE_Q4_1) {
        /* The codes transposed instead of the sums: words16 puts each row's 16 bytes of nibbles
         * in its lane, 4 at a time (the packed layout's registers), so every vpdpbusd adds 4
         * products of one row into that row's lane and needs only the 4 activation bytes of those
         * columns, broadcast from memory. Eight shuffles to transpose against fourteen to reduce
         * both planes' lane sums. */
        _Alignas(64) __m512i w[4];
        words16(rp, (size_t)(k / 32) * block_bytes(type) + legacy_qs(type), w);
        __m512i lo_h = _mm512_setzero_si512(), hi_h = lo_h, lo_l = lo_h, hi_l = lo_h;
        nibble_sums(w, NULL, P, k, 16, &lo_h, &hi_h, &lo_l, &hi_l);
        ch[0] = _mm512_add_epi32(lo_h, hi_h);
        cl[0] = _mm512_add_epi32(lo_l, hi_l);
        return;
    }
    if (type == QUILL_TYPE_Q4_K) {
        /* The same transposition for q4_K's 64-column windows: 32 bytes per row, whose low
         * nibbles are sub-block 2c's 32 codes and high nibbles sub-block 2c + 1's, so each
         * 16-byte half feeds both slots, 32 columns apart. */
        const size_t at = (size_t)(k / 256) * sizeof(block_q4_K) + offsetof(block_q4_K, qs) + (size_t)(k % 256) / 2;
        __m512i lo_h = _mm512_setzero_si512(), hi_h = lo_h, lo_l = lo_h, hi_l = lo_h;
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            _Alignas(64) __m512i w[4];
            words16(rp, at + 16 * (size_t)half, w);
            nibble_sums(w, NULL, P, k + 16 * half, 32, &lo_h, &hi_h, &lo_l, &hi_l);
        }
        ch[0] = lo_h, cl[0] = lo_l, ch[1] = hi_h, cl[1] = hi_l;
        return;
    }
    const __m512i *hx = P->hx + k / 16, *lx = P->lx + k / 16;
    __m512i sh[2][4], sl[2][4]; /* [slot][register] lane sums */
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        __m512i part[4];
        window_codes(type, rp, r, k, part);
        const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 2
        for (int s = 0; s < n_slots; s++) {
            const int p = s * parts_per_slot;
            sh[s][r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, part[p], hx[p]), part[p + 1], hx[p + 1]);
            sl[s][r] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, part[p], lx[p]), part[p + 1], lx[p + 1]);
        }
    }
#pragma GCC unroll 2
    for (int s = 0; s < n_slots; s++) ch[s] = reduce4(sh[s]), cl[s] = reduce4(sl[s]);
}

/* Which rows a decoding tile takes. Tile t of the contiguous layout is rows 16t..16t+15: one range
 * of memory, prefetched two tiles ahead in address order. For q8_0 tile t (t < T = rows / 16) is
 * rows t, t + T, ..., t + 15T instead: each lane's rows then form one sequential stream through
 * the matrix (the same lane of the next tile reads the next row), prefetched a few rows ahead in
 * each stream. Which rows share a tile changes no row's arithmetic. Measured (bench/README.md,
 * ninth session): q8_0 generation 1.035-1.20x (faster in 25 of 32 alternating rounds); q4_0,
 * q4_K and q6_K 0.94-1.04x, no clear change, so they keep the contiguous tiles. The rows past 16T
 * form one last contiguous tile. */
static inline bool streamed_rows(uint32_t type) { return type == QUILL_TYPE_Q8_0; }

/* How far ahead in its stream each lane prefetches, in rows. */
#define STREAM_AHEAD 3

static inline __attribute__((always_inline)) void decode_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                              uint32_t type) {
    const int kb = slot_width(type);
    const int width = window_width(type), n_slots = width / kb;
    _Alignas(64) float sbuf[CW / 16][TR], mbuf[CW / 16][TR];
    /* Lines of the tile two ahead to prefetch per step: the bytes a step reads from a tile, rounded
     * up (q4_0: 16 rows × 18 bytes = 4.5 lines, so 5), which keeps the prefetch ahead. A constant
     * per type, so that its loop unrolls: computed from the row size, the loop and its count took
     * ~20 instructions of a q4_0 step's ~115. */
    const int pf_lines = (TR * (int)block_bytes(type) * width / block_elems(type) + 63) / 64;
    /* (the scale gathers take 32-bit offsets, 15 row steps at most) */
    const bool offsets_fit = (double)(j->rows / TR) * (double)j->row_bytes * (TR - 1) < 2147483647.0;
    const int64_t n_streamed = streamed_rows(type) && offsets_fit ? j->rows / TR : 0;
    for (int64_t tile = t0; tile < t1; tile++) {
        const bool streamed = tile < n_streamed;
        const int64_t r0 = streamed ? tile : tile * TR, row_step = streamed ? n_streamed : 1;
        const size_t step_bytes = (size_t)row_step * j->row_bytes;
        tile_src src = tile_at(type, j->w, j->row_bytes, j->rows, r0);
        if (streamed) /* 16 rows (16T <= rows), row_step apart: the scale gathers' offsets */
            src.idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                         _mm512_set1_epi32((int)step_bytes));
        const int nr = src.nr;
        /* rows past the matrix repeat its first row: their lanes are computed and never stored */
        const uint8_t *rp[TR], *ahead[TR];
        for (int r = 0; r < TR; r++) {
            rp[r] = src.w + (size_t)(r < nr ? r : 0) * step_bytes;
            ahead[r] = rp[r] + STREAM_AHEAD * j->row_bytes;
        }
        int next_stream = 0;
        const planes *P = j->P;
        const uint8_t *pf = src.w + 2 * TR * j->row_bytes;
        __m512 acc = _mm512_setzero_ps();
        for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
            const int cw = j->cols - k0 < CW ? (int)(j->cols - k0) : CW;
            for (int c = 0; c < cw; c += width) {
                const int64_t k = k0 + c;
                /* The tile two ahead is one contiguous range of memory: each step prefetches its
                 * share of it in address order, which the hardware prefetchers follow, and a few
                 * lines at a time, where a burst would stall on the line fill buffers (measured
                 * 8-19% faster than a burst per chunk of the next tile's rows). The same number of
                 * lines every step, from a running pointer: the share computed per step took two
                 * 64-bit divisions and a loop whose trip count alternated (4-7 % slower). */
                if (!streamed) {
                    for (int i = 0; i < pf_lines; i++) _mm_prefetch((const char *)(pf + 64 * i), _MM_HINT_T0);
                    pf += 64 * pf_lines;
                } else {
                    /* as many lines as a step reads, one per stream in turn (each stream's
                     * pointer restarts with the tile, so it never drifts more than a row) */
                    for (int i = 0; i < pf_lines; i++) {
                        const int s = (next_stream + i) % TR;
                        _mm_prefetch((const char *)ahead[s], _MM_HINT_T0);
                        ahead[s] += 64;
                    }
                    next_stream = (next_stream + pf_lines) % TR;
                }
                __m512i ch[4], cl[4];
                lane_sums(type, rp, k, P, ch, cl);
                /* the scales, gathered once the codes' loads have brought their cache lines in */
                if (!is_kquant(type)) unpack_scales(&src, k, 1, sbuf + c / 32, mbuf + c / 32);
                else if (c == 0) row_kquant_scales(type, rp, k0, sbuf, mbuf);
#pragma GCC unroll 4
                for (int s = 0; s < n_slots; s++) {
                    const int64_t slot_k = (k + s * kb) / kb; /* the slot's index in the row */
                    /* C = Σq·a = 256·Σu·h + Σu·l - bias·Σa: exact, below 2^24 */
                    __m512i sub = _mm512_add_epi32(_mm512_slli_epi32(ch[s], 8), cl[s]);
                    if (code_bias(type)) sub = _mm512_sub_epi32(sub, _mm512_set1_epi32(P->bias_sum[slot_k]));
                    const int slot = (c + s * kb) / kb;
                    const int64_t blk = (k + s * kb) / 32;
                    const __m512 sc = _mm512_load_ps(sbuf[slot]);
                    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sub), _mm512_mul_ps(sc, _mm512_set1_ps(P->da[blk])), acc);
                    if (has_min(type))
                        acc = _mm512_fnmadd_ps(_mm512_load_ps(mbuf[slot]), _mm512_set1_ps(min_term(P, kb, slot_k, blk)), acc);
                }
            }
        }
        _Alignas(64) float out[TR];
        _mm512_store_ps(out, acc);
        for (int r = 0; r < nr; r++) j->y[r0 + r * row_step] = out[r];
    }
}

/* One task per type, the type a constant inside the always-inlined body, and its lookup. */
#define TYPED_TASK(prefix, impl, sfx, type)                                                          \
    static void prefix##_##sfx(void *a, int64_t t0, int64_t t1, int th) {                            \
        (void)th;                                                                                    \
        impl(a, t0, t1, type);                                                                       \
    }
#define DECODE_TASK(sfx, ID) TYPED_TASK(decode, decode_impl, sfx, QUILL_TYPE_##ID)
#define DECODE_CASE(sfx, ID) case QUILL_TYPE_##ID: return decode_##sfx;
#define TILES_TASK(sfx, ID) TYPED_TASK(tiles, tiles_impl, sfx, QUILL_TYPE_##ID)
#define TILES_CASE(sfx, ID) case QUILL_TYPE_##ID: return tiles_##sfx;
#define GEMM_TASK(sfx, ID) TYPED_TASK(gemm, gemm_impl, sfx, QUILL_TYPE_##ID)
#define GEMM_CASE(sfx, ID) case QUILL_TYPE_##ID: return gemm_##sfx;
#define DECODE_PACKED_TASK(sfx, ID) TYPED_TASK(decode_packed, decode_packed_impl, sfx, QUILL_TYPE_##ID)
#define DECODE_PACKED_CASE(sfx, ID) case QUILL_TYPE_##ID: return decode_packed_##sfx;
#define GEMM_PACKED_TASK(sfx, ID) TYPED_TASK(gemm_packed, gemm_packed_impl, sfx, QUILL_TYPE_##ID)
#define GEMM_PACKED_CASE(sfx, ID) case QUILL_TYPE_##ID: return gemm_packed_##sfx;
/* TYPED_TASKS(prefix): the tasks of every exact type and prefix_fn(type), their lookup (types
 * without exact products get NULL). */
#define TYPED_TASKS(prefix, TASK, CASE)                                                              \
    QUILL_EXACT_TYPES(TASK)                                                                          \
    static quill_task_fn prefix##_fn(uint32_t type) {                                                \
        switch (type) {                                                                              \
        QUILL_EXACT_TYPES(CASE)                                                                      \
        default: return NULL;                                                                        \
        }                                                                                            \
    }
/* Reading 16 rows a little at a time defeats the hardware prefetchers: fetch the same columns
 * [k0, k0 + cw) of the next row tile while this one is computed. */
static inline __attribute__((always_inline)) void prefetch_next_tile(const tile_src *src, uint32_t type, int64_t k0,
                                                                     int cw) {
    const int per = block_elems(type);
    const size_t from = (size_t)(k0 / per) * block_bytes(type), to = (size_t)((k0 + cw + per - 1) / per) * block_bytes(type);
    const uint8_t *next = src->w + TR * src->row_bytes;
    for (int r = 0; r < TR; r++)
        for (size_t o = from & ~(size_t)63; o < to; o += 64)
            _mm_prefetch((const char *)(next + (size_t)r * src->row_bytes + o), _MM_HINT_T0);
}


/* ---------------------------------------------------------------- without the tile unit
 *
 * CPUs with AVX-512 VNNI but no AMX (Ice Lake, Zen 4) run the same arithmetic on the vector unit
 * for batches too. For each row tile and chunk of columns the codes are unpacked once into the
 * dot products' operand layout (per 4 columns, the 16 rows' 4 unsigned codes: 64 bytes, rows in
 * lanes) and serve every token of the pass from L1, TB tokens at a time in registers: per slot
 * and token, Σu·h and Σu·l by vpdpbusd with 4 bytes of h or l broadcast, then the decoding loop's
 * f32 steps. Unlike the decoding loop there is no lane reduction: lanes are rows throughout.
 * Same bits as the tile loop and the model, so a batch evaluated here equals one evaluated token
 * by token. */
#define VNNI_TOKENS 256
#define TB 6 /* tokens per register block: 4 accumulators each */
/* Tokens per block of the word products. The sums' registers are the only ones kept: the f32
 * sums go through accbuf (L1) once per slot, so that 16 chains of vpdpwssd hide its 4-cycle
 * latency at 2 per cycle (8 chains reached ~1.7 in a loop alone, and ~1 in this one). */
#define TBW 16
/* Bytes of packed weights a decoding thread claims at a time (whole tiles, at least one). A claim
 * is a locked instruction, which waits for the core's loads in flight: claiming tile by tile,
 * 3-5 % of the samples sat on the claims. 128 KiB against one tile, 2 threads, 6 alternating
 * rounds: q4_0 1.016x, q8_0 1.046x, q4_k_m 1.032x, q6_k 0.991x (noise: 4 tiles had measured
 * 1.063x). 64 KiB measured less. */
#define DECODE_CLAIM 131072
/* Tokens from which a pass takes the word products: their weights' widening, once per chunk, costs
 * about as much as a token's byte products, which for each token are twice as many. */
#define WORD_TOKENS 16
/* The word products keep da·Σa per 32 columns: q2_K's minimums of 16 columns take the byte ones. */
static inline bool word_products(uint32_t type) { return !(has_min(type) && slot_width(type) == 16); }

/* The tokens of a pass against one chunk of a row tile: n slots of kb columns from column k0,
 * their codes in wbuf (per 4 columns, the 16 rows' 4 unsigned codes, rows in lanes) and their
 * scales in s / m; each token's sums accumulate in accbuf. */
static inline __attribute__((always_inline)) void gemm_block(const decode_job *j, uint32_t type, int64_t k0, int n,
                                                             const __m512i *wbuf, float (*sbuf)[TR],
                                                             float (*mbuf)[TR], float (*accbuf)[TR], int tb,
                                                             const int nb) {
    const int kb = slot_width(type);
    const planes *pt[TB];
    __m512 acc[TB];
#pragma GCC unroll 8
    for (int t = 0; t < nb; t++) {
        pt[t] = &j->P[tb + t];
        acc[t] = _mm512_load_ps(accbuf[tb + t]);
    }
    for (int i = 0; i < n; i++) {
        const int64_t col = k0 + (int64_t)i * kb, slot_k = col / kb, blk = col / 32;
        __m512i sh[TB], sl[TB];
#pragma GCC unroll 8
        for (int t = 0; t < nb; t++) sh[t] = sl[t] = _mm512_setzero_si512();
#pragma GCC unroll 8
        for (int q = 0; q < kb / 4; q++) {
            const __m512i w = _mm512_load_si512(wbuf + i * kb / 4 + q);
#pragma GCC unroll 8
            for (int t = 0; t < nb; t++) {
                sh[t] = _mm512_dpbusd_epi32(sh[t], w, bcast4(pt[t]->h + col + 4 * q));
                sl[t] = _mm512_dpbusd_epi32(sl[t], w, bcast4(pt[t]->l + col + 4 * q));
            }
        }
        const __m512 sc = _mm512_load_ps(sbuf[i]);
#pragma GCC unroll 8
        for (int t = 0; t < nb; t++) {
            const __m512i sub = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(sh[t], 8), sl[t]),
                                                 _mm512_set1_epi32(pt[t]->bias_sum[slot_k]));
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sub), _mm512_mul_ps(sc, _mm512_set1_ps(pt[t]->da[blk])),
                                     acc[t]);
            if (has_min(type))
                acc[t] = _mm512_fnmadd_ps(_mm512_load_ps(mbuf[i]), _mm512_set1_ps(min_term(pt[t], kb, slot_k, blk)), acc[t]);
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nb; t++) _mm512_store_ps(accbuf[tb + t], acc[t]);
}

/* All tokens of a pass against one chunk: blocks of TB, then the rest as one block of its own
 * size (a constant in each copy, so that the registers stay registers). */
static inline __attribute__((always_inline)) void gemm_chunk(const decode_job *j, uint32_t type, int64_t k0, int n,
                                                             const __m512i *wbuf, float (*sbuf)[TR],
                                                             float (*mbuf)[TR], float (*accbuf)[TR]) {
    int tb = 0;
    for (; tb + TB <= j->n_tok; tb += TB) gemm_block(j, type, k0, n, wbuf, sbuf, mbuf, accbuf, tb, TB);
    switch (j->n_tok - tb) {
    case 1: gemm_block(j, type, k0, n, wbuf, sbuf, mbuf, accbuf, tb, 1); break;
    case 2: gemm_block(j, type, k0, n, wbuf, sbuf, mbuf, accbuf, tb, 2); break;
    case 3: gemm_block(j, type, k0, n, wbuf, sbuf, mbuf, accbuf, tb, 3); break;
    case 4: gemm_block(j, type, k0, n, wbuf, sbuf, mbuf, accbuf, tb, 4); break;
    case 5: gemm_block(j, type, k0, n, wbuf, sbuf, mbuf, accbuf, tb, 5); break;
    default: break;
    }
}

/* gemm_chunk with one word product per code instead of two byte products: vpdpwssd adds the
 * products of two signed 16-bit codes, so each weight meets the activation code a itself (16-bit,
 * |a| <= 32512) rather than its bytes h and l, and as its signed code q, so that no bias needs
 * taking off: C = Σq·a, the same exact integer, with half the products per token (wbuf16: per 2
 * columns, the 16 rows' 2 codes q as words, rows in lanes; see widen). */
static inline __attribute__((always_inline)) void gemm_chunk_words(const decode_job *j, uint32_t type, int64_t k0,
                                                                   int n, const __m512i *wbuf16, float (*sbuf)[TR],
                                                                   float (*mbuf)[TR], float (*accbuf)[TR]) {
    const int kb = slot_width(type), n_tok = j->n_tok;
    const int64_t pairs = j->cols / 2, blocks = j->cols / 32;
    for (int tb = 0; tb < n_tok; tb += TBW) {
        const int32_t *ab = j->word_a + (size_t)(tb / TBW) * (size_t)pairs * TBW;
        const float *db = j->word_da + (size_t)(tb / TBW) * (size_t)blocks * TBW;
        const float *sb = j->word_sf + (size_t)(tb / TBW) * (size_t)blocks * TBW;
        for (int i = 0; i < n; i++) {
            const int64_t col = k0 + (int64_t)i * kb, blk = col / 32;
            __m512i c[TBW];
#pragma GCC unroll 16
            for (int t = 0; t < TBW; t++) c[t] = _mm512_setzero_si512();
#pragma GCC unroll 16
            for (int q = 0; q < kb / 2; q++) {
                const __m512i w = _mm512_load_si512(wbuf16 + i * kb / 2 + q);
                const int32_t *aq = ab + (size_t)(col / 2 + q) * TBW;
#pragma GCC unroll 16
                for (int t = 0; t < TBW; t++) c[t] = _mm512_dpwssd_epi32(c[t], w, _mm512_set1_epi32(aq[t]));
            }
            const __m512 sc = _mm512_load_ps(sbuf[i]);
            const float *dq = db + (size_t)blk * TBW, *sq = sb + (size_t)blk * TBW;
#pragma GCC unroll 16
            for (int t = 0; t < TBW; t++) {
                __m512 acc = _mm512_load_ps(accbuf[tb + t]);
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[t]), _mm512_mul_ps(sc, _mm512_set1_ps(dq[t])), acc);
                if (has_min(type)) acc = _mm512_fnmadd_ps(_mm512_load_ps(mbuf[i]), _mm512_set1_ps(sq[t]), acc);
                _mm512_store_ps(accbuf[tb + t], acc);
            }
        }
    }
}

/* vpermt2d indices: the even (odd) dwords of two registers, in order. */
static _Alignas(64) const int32_t even_dwords[16] = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
static _Alignas(64) const int32_t odd_dwords[16] = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};

/* The byte operands of n_groups 4-column groups (unsigned codes u, rows in lanes) to word operands
 * of 2 columns: q = u - bias sign-extended, group g to wbuf16[2g] (its columns 0, 1) and
 * wbuf16[2g + 1] (columns 2, 3). */
static inline __attribute__((always_inline)) void widen(uint32_t type, const __m512i *wbuf, int n_groups,
                                                        __m512i *wbuf16) {
    const __m512i bias = _mm512_set1_epi8((char)code_bias(type));
    const __m512i even = _mm512_load_si512(even_dwords), odd = _mm512_load_si512(odd_dwords);
    for (int g = 0; g < n_groups; g++) {
        const __m512i q = _mm512_sub_epi8(_mm512_load_si512(wbuf + g), bias);
        const __m512i lo = _mm512_cvtepi8_epi16(_mm512_castsi512_si256(q));       /* rows 0-7, 4 words each */
        const __m512i hi = _mm512_cvtepi8_epi16(_mm512_extracti64x4_epi64(q, 1)); /* rows 8-15 */
        wbuf16[2 * g] = _mm512_permutex2var_epi32(lo, even, hi);
        wbuf16[2 * g + 1] = _mm512_permutex2var_epi32(lo, odd, hi);
    }
}

/* One chunk's tokens by the byte or the word products (the same C, so the same bits). */
static inline __attribute__((always_inline)) void gemm_chunk_any(const decode_job *j, uint32_t type, int64_t k0, int cw,
                                                                 const __m512i *wbuf, __m512i *wbuf16, float (*sbuf)[TR],
                                                                 float (*mbuf)[TR], float (*accbuf)[TR]) {
    if (j->word_a) {
        widen(type, wbuf, cw / 4, wbuf16);
        gemm_chunk_words(j, type, k0, cw / slot_width(type), wbuf16, sbuf, mbuf, accbuf);
    } else {
        gemm_chunk(j, type, k0, cw / slot_width(type), wbuf, sbuf, mbuf, accbuf);
    }
}
/* The decoding tasks (kernels_vnni.c), which the amx set uses for one token. */
quill_task_fn quill_avx512_decode_fn(uint32_t type);

/* The vnni set's load-time layout (kernels_vnni_pack.c; the layout is described there). */
size_t quill_vnni_pack_bytes(uint32_t type, int64_t rows, int64_t cols);
void quill_vnni_pack(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                     int64_t tile0, int64_t tile1);
size_t quill_vnni_packed_tile_bytes(uint32_t type, int64_t cols);
int quill_vnni_pack_group(uint32_t type);
quill_task_fn quill_vnni_decode_packed_fn(uint32_t type);
quill_task_fn quill_vnni_gemm_packed_fn(uint32_t type);
/* The loop for a few tokens over groups of tiles (as one token's), or NULL where the batch loop serves. */
quill_task_fn quill_vnni_few_packed_fn(uint32_t type, int n_tok);

/* `static void name`, a quill_matmul_fn that calls impl(type, ...): one per type, so that the
 * kernel table holds a function per type while the set's product takes the type as an argument. */
#define QUILL_MATMUL_OF_TYPE(name, impl, type)                                                      \
    static void name(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok,     \
                     quill_pool *pool, void *scratch) {                                              \
        impl(type, m, n_mats, cols, x, n_tok, pool, scratch);                                        \
    }

#endif
#endif
