/* The exact integer products on AVX-512 (exact_scalar.c defines their arithmetic): two kernel sets.
 *   - vnni (AVX-512 VNNI and VBMI, e.g. Ice Lake, Zen 4): all on the vector unit. One token
 *     (decoding) by VNNI byte products over the two bytes of each code, C = 256·Σq·h + Σq·l (lanes
 *     are rows); batches with the codes unpacked once per chunk for many tokens (gemm_impl).
 *   - amx (Sapphire Rapids and later): batches on the tile unit's bf16 products (16 rows × 32 k ×
 *     16 tokens per product, lanes are tokens); one token as the vnni set decodes it.
 * Both give the same C and the same f32 steps in the same order, on any thread: results are
 * bitwise batch- and thread-invariant, equal to the scalar model's bit for bit. */
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

/* ---------------------------------------------------------------- activations
 *
 * Layout for n_groups groups of GT tokens (missing tokens are zero): bf16 codes B[g][k/2][GT][2],
 * each pair of columns k, k + 1 next to each other per token (the tile unit's bf16 operand layout:
 * one column of the tile per token); per block of 32 columns, dapat = da and sfpat = da·Σa, one
 * float per token of the group. */

typedef struct {
    int n_groups;
    int64_t cols;
    uint16_t *b;
    float *dapat, *sfpat;
} acts;

static size_t acts_bytes(int64_t cols, int n_tok) {
    const int groups = (n_tok + GT - 1) / GT;
    return (size_t)groups * ((size_t)cols * 2 * GT + (size_t)(cols / 32) * GT * sizeof(float) * 2) + 64;
}

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

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

/* vpermt2w indices that keep the high 16 bits of each 32-bit lane of two registers: the bf16
 * values of 32 f32 (exact when they have at most 8 significant bits). */
static _Alignas(64) const uint16_t high_halves[32] = {1,  3,  5,  7,  9,  11, 13, 15, 17, 19, 21,
                                                      23, 25, 27, 29, 31, 33, 35, 37, 39, 41, 43,
                                                      45, 47, 49, 51, 53, 55, 57, 59, 61, 63};

static inline __m512i bf16_of(__m512 lo, __m512 hi) {
    return _mm512_permutex2var_epi16(_mm512_castps_si512(lo), _mm512_load_si512(high_halves), _mm512_castps_si512(hi));
}

/* Quantizes token t (index tg inside group g) for a product with `type` weights. */
static void quantize_token(const acts *A, uint32_t type, const float *x, int g, int tg) {
    uint16_t *bg = A->b + (size_t)g * (size_t)A->cols * GT;
    float *dap = A->dapat + (size_t)g * (size_t)(A->cols / 32) * GT;
    float *sfp = A->sfpat + (size_t)g * (size_t)(A->cols / 32) * GT;
    /* pair j of a block goes to dword (blk · 16 + j) · GT + tg */
    const __m512i at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(GT));
    for (int64_t blk = 0; blk < A->cols / 32; blk++) {
        __m512i a[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        int32_t sum = 0;
        float da = 0;
        if (x) da = quantize_codes(x + blk * 32, type, a, &sum);
        const __m512i pairs = bf16_of(_mm512_cvtepi32_ps(a[0]), _mm512_cvtepi32_ps(a[1]));
        _mm512_i32scatter_epi32((uint32_t *)bg + (size_t)blk * 16 * GT + tg, at, pairs, 4);
        dap[blk * GT + tg] = da;
        sfp[blk * GT + tg] = da * (float)sum;
    }
}

typedef struct {
    const acts *A;
    uint32_t type;
    const float *x;
    int n_tok;
} quant_job;

static void quantize_items(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const quant_job *j = arg;
    for (int64_t t = i0; t < i1; t++)
        quantize_token(j->A, j->type, t < j->n_tok ? j->x + t * j->A->cols : NULL, (int)(t / GT), (int)(t % GT));
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

/* A chunk's codes are stored slot by slot as bf16, each slot a contiguous TR x kb tile operand (a
 * tile load touching fewer cache lines is faster): column `col` of row r of the chunk lives at
 * abuf[(col / kb) * TR * kb + r * kb + col % kb]. This stores 32 codes from column col. */
static inline void put32(uint16_t *abuf, int kb, int r, int col, __m512i v) {
    if (kb == 32) {
        _mm512_storeu_si512(abuf + (col / 32) * TR * 32 + r * 32, v);
    } else {
        uint16_t *d = abuf + (col / 16) * TR * 16 + r * 16;
        _mm256_storeu_si256((__m256i *)d, _mm512_castsi512_si256(v));
        _mm256_storeu_si256((__m256i *)(d + TR * 16), _mm512_extracti64x4_epi64(v, 1));
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

/* bf16(u - bias) for the unsigned codes u = 0..63 of the types below 8 bits, two registers: the
 * lookup table that turns codes into tile operands. */
static void bf16_codes_table(uint32_t type, __m512i t[2]) {
    const __m512 bias = _mm512_set1_ps((float)code_bias(type));
    const __m512 u = _mm512_cvtepi32_ps(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0));
    for (int i = 0; i < 2; i++) {
        const __m512 lo = _mm512_add_ps(u, _mm512_set1_ps(32.0f * (float)i)), hi = _mm512_add_ps(lo, _mm512_set1_ps(16));
        t[i] = bf16_of(_mm512_sub_ps(lo, bias), _mm512_sub_ps(hi, bias));
    }
}

/* Signed codes q of row r of a tile, columns [k0, k0 + n) (n a multiple of the block), into a
 * chunk as bf16 values (exact: |q| <= 128): the unsigned codes looked up in `table` (q8_0: its
 * signed bytes converted). */
static inline __attribute__((always_inline)) void unpack_row(uint32_t type, const uint8_t *row, int64_t k0, int n,
                                                             uint16_t *abuf, int r, const __m512i table[2]) {
    const int kb = slot_width(type);
    if (type == QUILL_TYPE_Q8_0) {
        /* the signed codes straight from the block, sign-extended by their loads (through codes64
         * they took a flip to unsigned and back and three lane extractions more per 64) */
        for (int i = 0; i < n; i += 32) {
            const int8_t *qs = ((const block_q8_0 *)row)[(k0 + i) / 32].qs;
            const __m512 f0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)qs)));
            const __m512 f1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(qs + 16))));
            put32(abuf, kb, r, i, bf16_of(f0, f1));
        }
        return;
    }
    for (int i = 0; i < n; i += 64) {
        const bool half = n - i < 64;
        const __m512i v = codes64(type, row, k0 + i, half);
        const __m512i w0 = _mm512_cvtepu8_epi16(_mm512_castsi512_si256(v));
        put32(abuf, kb, r, i, type == QUILL_TYPE_Q6_K ? _mm512_permutex2var_epi16(table[0], w0, table[1])
                                                      : _mm512_permutexvar_epi16(w0, table[0]));
        if (half) continue;
        const __m512i w1 = _mm512_cvtepu8_epi16(_mm512_extracti64x4_epi64(v, 1));
        put32(abuf, kb, r, i + 32, type == QUILL_TYPE_Q6_K ? _mm512_permutex2var_epi16(table[0], w1, table[1])
                                                           : _mm512_permutexvar_epi16(w1, table[0]));
    }
}

/* ---------------------------------------------------------------- the tile loop */

typedef struct {
    uint32_t type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    int n_tok;
    const acts *A;
    float *y;
} tiles_job;

/* Tiles: 0-3 sums (C), 4-5 weight codes (A), 6-7 activations (B), all bf16 operands. Tile
 * numbers are immediates, hence the macro. The sums start from zero for each sub-block: each has
 * its own scale. */
#define TILE_DP(C, AT, BT, i)                                                                        \
    do {                                                                                             \
        _tile_loadd(AT, a_base + (size_t)(i) * TR * kb, 2 * kb);                                     \
        _tile_loadd(BT, bbase + (size_t)((i) * kb / 2) * 2 * GT, 4 * GT);                           \
        _tile_zero(C);                                                                               \
        _tile_dpbf16ps(C, AT, BT);                                                                   \
    } while (0)

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

/* The scales of the sub-blocks of columns [k0, k0 + cw): for the k-quants those of the whole
 * super-block (the chunk's slot i is then at (k0 % 256) / kb + i). */
static inline __attribute__((always_inline)) void chunk_scales(const tile_src *src, uint32_t type, int64_t k0, int cw,
                                                               int kb, float (*s)[TR], float (*m)[TR]) {
    if (is_kquant(type)) unpack_scales(src, k0 - k0 % 256, 256 / kb, s, m);
    else unpack_scales(src, k0, cw / kb, s, m);
}

/* Codes and scales of columns [k0, k0 + cw) of a row tile, into abuf / s / m. */
static inline __attribute__((always_inline)) void prep_chunk(const tile_src *src, uint32_t type, int64_t k0, int cw,
                                                             int kb, uint16_t *abuf, float (*s)[TR], float (*m)[TR],
                                                             const __m512i table[2]) {
    prefetch_next_tile(src, type, k0, cw);
    for (int r = 0; r < src->nr; r++) unpack_row(type, src->w + (size_t)r * src->row_bytes, k0, cw, abuf, r, table);
    chunk_scales(src, type, k0, cw, kb, s, m);
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
} planes;

static size_t planes_bytes(int64_t cols) {
    return (size_t)cols * 10 + (size_t)(cols / 16) * 4 + (size_t)(cols / 32) * 8 + 64;
}

/* The planes of one token in scratch (64-byte aligned). */
static planes planes_at(void *scratch, int64_t cols) {
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    planes P;
    P.hx = (__m512i *)base;
    P.lx = P.hx + cols / 16;
    P.bias_sum = (int32_t *)(P.lx + cols / 16);
    P.da = (float *)(P.bias_sum + cols / 16);
    P.sf = P.da + cols / 32;
    P.h = (int8_t *)(P.sf + cols / 32);
    P.l = P.h + cols;
    return P;
}

/* The per-block numbers the decoding steps use, computed once per token here so that the steps
 * take them straight from memory (embedded broadcasts) instead of computing and broadcasting them
 * on the vector unit's shuffle port, which the steps keep busy. With `words` (the token's first
 * dword in the word products' view, see decode_job), each pair of codes also goes there. */
static void quantize_planes(uint32_t type, const float *x, int64_t cols, const planes *P, bool broadcasts,
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

/* Exact sums Σu·h and Σu·l (u the unsigned codes) of the 16 rows of rp over each slot of the
 * window_width(type) columns from k, rows in lanes: ch[s], cl[s] for slot s. */
static inline __attribute__((always_inline)) void lane_sums(uint32_t type, const uint8_t *const rp[TR], int64_t k,
                                                            const planes *P, __m512i ch[4], __m512i cl[4]) {
    const int parts_per_slot = slot_width(type) / 16, n_slots = window_width(type) / slot_width(type);
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
                    const __m512i sub = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(ch[s], 8), cl[s]),
                                                         _mm512_set1_epi32(P->bias_sum[slot_k]));
                    const int slot = (c + s * kb) / kb;
                    const int64_t blk = (k + s * kb) / 32;
                    const __m512 sc = _mm512_load_ps(sbuf[slot]);
                    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sub), _mm512_mul_ps(sc, _mm512_set1_ps(P->da[blk])), acc);
                    if (has_min(type)) acc = _mm512_fnmadd_ps(_mm512_load_ps(mbuf[slot]), _mm512_set1_ps(P->sf[blk]), acc);
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
#define TYPED_TASKS(prefix, impl)                                                                    \
    TYPED_TASK(prefix, impl, q4_0, QUILL_TYPE_Q4_0)                                                  \
    TYPED_TASK(prefix, impl, q4_1, QUILL_TYPE_Q4_1)                                                  \
    TYPED_TASK(prefix, impl, q5_0, QUILL_TYPE_Q5_0)                                                  \
    TYPED_TASK(prefix, impl, q5_1, QUILL_TYPE_Q5_1)                                                  \
    TYPED_TASK(prefix, impl, q8_0, QUILL_TYPE_Q8_0)                                                  \
    TYPED_TASK(prefix, impl, q4_K, QUILL_TYPE_Q4_K)                                                  \
    TYPED_TASK(prefix, impl, q5_K, QUILL_TYPE_Q5_K)                                                  \
    TYPED_TASK(prefix, impl, q6_K, QUILL_TYPE_Q6_K)                                                  \
    static quill_task_fn prefix##_fn(uint32_t type) {                                                \
        switch (type) {                                                                              \
        case QUILL_TYPE_Q4_0: return prefix##_q4_0;                                                  \
        case QUILL_TYPE_Q4_1: return prefix##_q4_1;                                                  \
        case QUILL_TYPE_Q5_0: return prefix##_q5_0;                                                  \
        case QUILL_TYPE_Q5_1: return prefix##_q5_1;                                                  \
        case QUILL_TYPE_Q8_0: return prefix##_q8_0;                                                  \
        case QUILL_TYPE_Q4_K: return prefix##_q4_K;                                                  \
        case QUILL_TYPE_Q5_K: return prefix##_q5_K;                                                  \
        default: return prefix##_q6_K;                                                               \
        }                                                                                            \
    }
TYPED_TASKS(decode, decode_impl)


/* v[i][j] becomes v[j][i]: four rounds of shuffles, 64 in all. */
static inline __attribute__((always_inline)) void transpose16(__m512 v[16]) {
    __m512 t[16];
#pragma GCC unroll 8
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_ps(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_ps(v[i], v[i + 1]);
    }
    /* t[2p], t[2p+1] hold rows 2p, 2p+1 interleaved: pairs of (row 2p, row 2p+1) elements */
#pragma GCC unroll 4
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        v[i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i]), _mm512_castps_pd(t[i + 2])));
        v[i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
        v[i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(t[i + 1]), _mm512_castps_pd(t[i + 3])));
    }
    /* each 128-bit lane of v[4q + c] now holds column (4·lane + c) of rows 4q..4q+3 */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        const __m512 a = _mm512_shuffle_f32x4(v[c], v[4 + c], 0x88), b = _mm512_shuffle_f32x4(v[c], v[4 + c], 0xDD);
        const __m512 e = _mm512_shuffle_f32x4(v[8 + c], v[12 + c], 0x88), f = _mm512_shuffle_f32x4(v[8 + c], v[12 + c], 0xDD);
        t[c] = _mm512_shuffle_f32x4(a, e, 0x88);      /* column c */
        t[8 + c] = _mm512_shuffle_f32x4(a, e, 0xDD);  /* column 8 + c */
        t[4 + c] = _mm512_shuffle_f32x4(b, f, 0x88);  /* column 4 + c */
        t[12 + c] = _mm512_shuffle_f32x4(b, f, 0xDD); /* column 12 + c */
    }
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) v[i] = t[i];
}

static inline __attribute__((always_inline)) void tiles_impl(const tiles_job *j, int64_t t0, int64_t t1,
                                                             uint32_t type) {
    const int kb = slot_width(type);
    const acts *A = j->A;
    tile_config cfg = {.palette = 1};
    for (int i = 0; i < 4; i++) cfg.colsb[i] = 64, cfg.rows[i] = TR;
    for (int i = 4; i < 6; i++) cfg.colsb[i] = (uint16_t)(2 * kb), cfg.rows[i] = TR;
    for (int i = 6; i < 8; i++) cfg.colsb[i] = 4 * GT, cfg.rows[i] = (uint8_t)(kb / 2);
    _tile_loadconfig(&cfg);

    /* Two of each buffer: while the tile unit works on one chunk (or token group), the vector unit
     * unpacks the next chunk and scales the previous sums. */
    _Alignas(64) uint16_t abuf[2][TR * TCW];
    _Alignas(64) float cbuf[2][TCW / 16][TR * GT];
    _Alignas(64) float sbuf[2][256 / 16][TR], mbuf[2][256 / 16][TR];
    _Alignas(64) float accbuf[MAX_GROUPS][TR][GT];
    const int64_t blocks = A->cols / 32, n_chunks = (A->cols + TCW - 1) / TCW;
    __m512i table[2];
    bf16_codes_table(type, table);

    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t r0 = tile * TR;
        const tile_src src = tile_at(type, j->w, j->row_bytes, j->rows, r0);
        if (src.nr < TR) memset(abuf, 0, sizeof abuf);
        for (int g0 = 0; g0 < A->n_groups; g0 += MAX_GROUPS) {
            const int ng = A->n_groups - g0 < MAX_GROUPS ? A->n_groups - g0 : MAX_GROUPS;
            prep_chunk(&src, type, 0, A->cols < TCW ? (int)A->cols : TCW, kb, abuf[0], sbuf[0], mbuf[0], table);
            for (int64_t c = 0; c < n_chunks; c++) {
                const int64_t k0 = c * TCW;
                const int cw = A->cols - k0 < TCW ? (int)(A->cols - k0) : TCW, n = cw / kb;
                const uint16_t *a_base = abuf[c & 1];
                /* the k-quants' scales serve a super-block: two chunks (see chunk_scales) */
                const int sel = is_kquant(type) ? (int)(k0 / 256) & 1 : (int)c & 1;
                const int first = is_kquant(type) ? (int)(k0 % 256) / kb : 0;
                const float(*sb)[TR] = sbuf[sel] + first, (*mb)[TR] = mbuf[sel] + first;
                const int64_t k1 = k0 + TCW;
                const int cw1 = A->cols - k1 < TCW ? (int)(A->cols - k1) : TCW;
                const int rows_per_slot = (src.nr + n - 1) / n;
                /* Group gi's products on the tile unit and, slot by slot between them, the vector
                 * unit's work: scaling group gi - 1's sums, or (during group 0) unpacking the next
                 * chunk's rows. Interleaved at this grain, both are in the core's window at once
                 * and overlap; done one after the other they mostly did not. */
                for (int gi = 0; gi <= ng; gi++) {
                    const bool tiles = gi < ng, scale = gi > 0, unpack = gi == 0 && c + 1 < n_chunks;
                    const uint16_t *bbase = A->b + (size_t)(g0 + (tiles ? gi : 0)) * (size_t)A->cols * GT + (size_t)k0 * GT;
                    float(*cb)[TR * GT] = cbuf[gi & 1];
                    const float(*prev)[TR * GT] = (const float(*)[TR * GT])cbuf[(gi + 1) & 1];
                    const int g = g0 + gi - 1;
                    const float *dap = A->dapat + ((size_t)(scale ? g : 0) * blocks + k0 / 32) * GT;
                    const float *sfp = A->sfpat + ((size_t)(scale ? g : 0) * blocks + k0 / 32) * GT;
                    /* lanes: tokens; one accumulator per row */
                    __m512 acc[TR];
#pragma GCC unroll 16
                    for (int r = 0; r < TR; r++) acc[r] = scale && c > 0 ? _mm512_load_ps(accbuf[gi - 1][r]) : _mm512_setzero_ps();
#define VECTOR_WORK(i)                                                                               \
    do {                                                                                             \
        if ((i) < n && scale) {                                                                      \
            const __m512 da = _mm512_load_ps(dap + ((i) * kb / 32) * GT);                            \
            const __m512 sf = _mm512_load_ps(sfp + ((i) * kb / 32) * GT);                            \
            _Pragma("GCC unroll 16") for (int r = 0; r < TR; r++) {                                  \
                acc[r] = _mm512_fmadd_ps(_mm512_load_ps(prev[i] + GT * r), _mm512_mul_ps(da, _mm512_set1_ps(sb[i][r])), \
                                         acc[r]);                                                    \
                if (has_min(type)) acc[r] = _mm512_fnmadd_ps(_mm512_set1_ps(mb[i][r]), sf, acc[r]);   \
            }                                                                                        \
        }                                                                                            \
        if ((i) < n && unpack)                                                                       \
            for (int r = (i) * rows_per_slot; r < ((i) + 1) * rows_per_slot && r < src.nr; r++)       \
                unpack_row(type, src.w + (size_t)r * src.row_bytes, k1, cw1, abuf[(c + 1) & 1], r, table); \
    } while (0)
                    for (int s0 = 0; s0 < n; s0 += 4) {
                        if (tiles) {
                            if (s0 + 0 < n) TILE_DP(0, 4, 6, s0 + 0);
                            if (s0 + 1 < n) TILE_DP(1, 5, 7, s0 + 1);
                            if (s0 > 0) {
                                _tile_stored(2, cb[s0 - 2], 4 * GT);
                                _tile_stored(3, cb[s0 - 1], 4 * GT);
                            }
                        }
                        VECTOR_WORK(s0);
                        VECTOR_WORK(s0 + 1);
                        if (tiles) {
                            if (s0 + 2 < n) TILE_DP(2, 4, 6, s0 + 2);
                            if (s0 + 3 < n) TILE_DP(3, 5, 7, s0 + 3);
                            if (s0 + 0 < n) _tile_stored(0, cb[s0 + 0], 4 * GT);
                            if (s0 + 1 < n) _tile_stored(1, cb[s0 + 1], 4 * GT);
                        }
                        VECTOR_WORK(s0 + 2);
                        VECTOR_WORK(s0 + 3);
                    }
#undef VECTOR_WORK
                    if (tiles) {
                        const int last = (n - 1) / 4 * 4;
                        if (last + 2 < n) _tile_stored(2, cb[last + 2], 4 * GT);
                        if (last + 3 < n) _tile_stored(3, cb[last + 3], 4 * GT);
                    }
                    if (scale)
#pragma GCC unroll 16
                        for (int r = 0; r < TR; r++) _mm512_store_ps(accbuf[gi - 1][r], acc[r]);
                    if (gi == 0 && c + 1 < n_chunks) {
                        prefetch_next_tile(&src, type, k1, cw1);
                        if (!is_kquant(type)) chunk_scales(&src, type, k1, cw1, kb, sbuf[(c + 1) & 1], mbuf[(c + 1) & 1]);
                        else if (k1 % 256 == 0) chunk_scales(&src, type, k1, cw1, kb, sbuf[(k1 / 256) & 1], mbuf[(k1 / 256) & 1]);
                    }
                }
            }
            /* y = acc, transposed here so that each token's 16 rows leave in one store: a store per
             * row and token touched one line each, rows apart by the matrix's row count (8 KiB for
             * 2048 rows: one L1 set), ~8 % of the loop; the transposition by shuffles (by scalar
             * moves it took ~10 %) */
            for (int g = g0; g < g0 + ng; g++) {
                __m512 v[TR];
#pragma GCC unroll 16
                for (int r = 0; r < TR; r++) v[r] = _mm512_load_ps(accbuf[g - g0][r]);
                transpose16(v);
                for (int t = 0; t < GT && g * GT + t < j->n_tok; t++)
                    _mm512_mask_storeu_ps(j->y + (size_t)(g * GT + t) * j->rows + r0, src.mask, v[t]);
            }
        }
    }
    _tile_release();
}

TYPED_TASKS(tiles, tiles_impl)


/* ---------------------------------------------------------------- the matmul entry point */

static size_t amx_scratch(int64_t cols, int n_tok) {
    size_t a = acts_bytes(cols, n_tok), p = planes_bytes(cols);
    return a > p ? a : p;
}

static void amx_matmul(uint32_t type, const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok,
                       quill_pool *pool, void *scratch) {
    const int n_threads = pool ? quill_pool_size(pool) : 1;
    quill_pool_task tasks[QUILL_MATMUL_MAX_MATS];
    if (n_tok == 1) {
        const planes P = planes_at(scratch, cols);
        quantize_planes(type, x, cols, &P, true, NULL, 0);
        decode_job dj[QUILL_MATMUL_MAX_MATS];
        for (int i = 0; i < n_mats; i++) {
            dj[i] = (decode_job){type, m[i].w, m[i].row_bytes, m[i].rows, cols, 1, &P, m[i].y, NULL, NULL, NULL};
            tasks[i] = (quill_pool_task){decode_fn(type), &dj[i], (m[i].rows + TR - 1) / TR};
        }
        /* Tiles one at a time: each thread walks its own contiguous share (see threadpool.c), so
         * the tile two ahead that a step prefetches is this thread's next but one (with streamed
         * rows, the rows a few ahead in each lane's stream are its own), and the shares even out
         * at the end one tile at a time (chunks of 16 tiles: 10.7-11.6 GB/s
         * against 13.2-14.1 streaming through the q4_0 model's weights). */
        quill_pool_run_joined(pool, tasks, n_mats, 1);
        return;
    }
    acts A = {.n_groups = (n_tok + GT - 1) / GT, .cols = cols};
    const size_t nb = (size_t)A.n_groups * (size_t)cols * GT, nf = (size_t)A.n_groups * (size_t)(cols / 32) * GT;
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    A.b = (uint16_t *)base;
    A.dapat = (float *)(base + nb * sizeof *A.b);
    A.sfpat = A.dapat + nf;
    quant_job qj = {&A, type, x, n_tok};
    const int64_t padded = (int64_t)A.n_groups * GT;
    quill_pool_run(pool, quantize_items, &qj, padded, padded / n_threads / 2 > 0 ? padded / n_threads / 2 : 1);
    tiles_job tj[QUILL_MATMUL_MAX_MATS];
    for (int i = 0; i < n_mats; i++) {
        tj[i] = (tiles_job){type, m[i].w, m[i].row_bytes, m[i].rows, cols, n_tok, &A, m[i].y};
        tasks[i] = (quill_pool_task){tiles_fn(type), &tj[i], (m[i].rows + TR - 1) / TR};
    }
    quill_pool_run_joined(pool, tasks, n_mats, 1);
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
                acc[t] = _mm512_fnmadd_ps(_mm512_load_ps(mbuf[i]), _mm512_set1_ps(pt[t]->sf[blk]), acc[t]);
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
    if (j->n_tok >= WORD_TOKENS) {
        widen(type, wbuf, cw / 4, wbuf16);
        gemm_chunk_words(j, type, k0, cw / slot_width(type), wbuf16, sbuf, mbuf, accbuf);
    } else {
        gemm_chunk(j, type, k0, cw / slot_width(type), wbuf, sbuf, mbuf, accbuf);
    }
}

static inline __attribute__((always_inline)) void gemm_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                            uint32_t type) {
    const int kb = slot_width(type);
    _Alignas(64) uint8_t rowbuf[TR][CW];
    _Alignas(64) __m512i wbuf[CW / 4], wbuf16[CW / 2];
    _Alignas(64) float sbuf[CW / 16][TR], mbuf[CW / 16][TR];
    _Alignas(64) float accbuf[VNNI_TOKENS + TBW][TR];
    const __m512i row_at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(CW));
    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t r0 = tile * TR;
        const tile_src src = tile_at(type, j->w, j->row_bytes, j->rows, r0);
        memset(accbuf, 0, (size_t)(j->n_tok + TBW) * sizeof accbuf[0]);
        for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
            const int cw = j->cols - k0 < CW ? (int)(j->cols - k0) : CW;
            prefetch_next_tile(&src, type, k0, cw);
            /* rows past the matrix repeat its first row: their lanes are computed and never stored */
            for (int r = 0; r < TR; r++) {
                const uint8_t *row = src.w + (size_t)(r < src.nr ? r : 0) * j->row_bytes;
                for (int i = 0; i < cw; i += 64) {
                    const __m512i v = codes64(type, row, k0 + i, cw - i < 64);
                    if (cw - i < 64) _mm256_store_si256((__m256i *)&rowbuf[r][i], _mm512_castsi512_si256(v));
                    else _mm512_store_si512(&rowbuf[r][i], v);
                }
            }
            for (int g = 0; g < cw / 4; g++) wbuf[g] = _mm512_i32gather_epi32(row_at, rowbuf[0] + 4 * g, 1);
            unpack_scales(&src, k0, cw / kb, sbuf, mbuf);
            gemm_chunk_any(j, type, k0, cw, wbuf, wbuf16, sbuf, mbuf, accbuf);
        }
        for (int t = 0; t < j->n_tok; t++)
            _mm512_mask_storeu_ps(j->y + (size_t)t * (size_t)j->rows + r0, src.mask, _mm512_load_ps(accbuf[t]));
    }
}

TYPED_TASKS(gemm, gemm_impl)

/* ---------------------------------------------------------------- the load-time layout
 *
 * q4_0, q8_0 and q4_K matrices are copied once, at load, into the order the vnni loops read them
 * (the reference implementation likewise repacks q4_0 and q4_K into interleaved rows on x86). From
 * the file's rows a tile of 16 rows is 16 strided streams, each read 18 or 34 bytes at a time,
 * with the scales among the codes: the decoding loop spent most of its time waiting on those
 * loads (bench/README.md), and it gathered the scales and shuffled every 16 bytes of 4 rows into
 * place. Packed, each tile (q4_0: each group of 4 tiles) is one contiguous range read front to
 * back, so a thread's share of a matrix is one stream, and the codes are already in the vpdpbusd
 * operand layout that words16 and the gemm's unpacking built at every use: per 4 columns, the 16
 * rows' 4 code bytes, row r in 32-bit lane r. Nothing of the arithmetic changes (the same integer
 * sums, the same f32 steps in the same order), so results are those of the unpacked loops bit for
 * bit.
 *   q8_0: per chunk of 256 columns (CW, 8 blocks; fewer in a last chunk), the chunk's scales
 *         first, per block of 32 columns the 16 rows' d (f16), padded to 64 bytes; then per block
 *         8 registers of unsigned codes q + 128, register i holding columns 4i..4i+3.
 *   q4_0: per chunk, the same scales; then per block 4 registers of the file's nibble bytes
 *         4i..4i+3 of each row (low nibbles: columns 4i..4i+3, high nibbles: 16 + 4i..16 + 4i + 3).
 *         (All the tile's scales before all its codes made two streams of a tile, which the
 *         hardware prefetcher followed at about half the rate of one: bench/README.md.)
 *         Tiles go in groups of 4 (PACK_GROUP; the last group holds what is left), interleaved
 *         chunk by chunk: the group's chunk is its n tiles' scales, one after the other, then per
 *         block the n tiles' 4 registers. Decoding takes a group at a time, each activation
 *         broadcast serving 4 tiles, in one stream (tiles side by side in their own layout were
 *         two streams, 0.8x from memory). A group of 1 is the layout above, which q8_0 keeps.
 *   q4_K: per super-block of 256 columns, 4 registers of its first 16 bytes (d, dmin and the 12
 *         scale bytes, as kquant_scales reads them), then for each 64-column window c and half h
 *         4 registers of nibble bytes 32c + 16h + 4i.. (low nibbles: sub-block 2c, high: 2c + 1).
 *   q5_K: as q4_K, and after each window half's 4 nibble registers one register of their fifth
 *         bits: byte j of a row's lane holds, for register i, the low nibble's bit at bit 2i and
 *         the high nibble's at bit 2i + 1.
 *   q6_K: per super-block, 5 registers for kquant_scales (the 16 signed scales as 4 words, then
 *         d in the high half of a word), then per 16-column sub-block s 3 registers: the low 4
 *         bits of u = q + 32 of columns 16s + 0..3 (low nibbles) and 16s + 8..11 (high), of
 *         16s + 4..7 and 16s + 12..15, then the top 2 bits of all 16 (column 16s + 4g + j: bits
 *         2g, 2g + 1 of byte j).
 * The same bytes as the file's rows (a q6_K scale word more per super-block), plus the scales'
 * padding and the last tile's missing rows. */

static bool packed_type(uint32_t type) {
    return type == QUILL_TYPE_Q8_0 || type == QUILL_TYPE_Q4_0 || type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K ||
           type == QUILL_TYPE_Q6_K;
}

/* Bytes of a chunk's scales (q4_0, q8_0): 32 per block, padded to a cache line. */
static inline size_t chunk_scale_bytes(int64_t blocks) { return ((size_t)blocks * 32 + 63) & ~(size_t)63; }

/* Code registers per 32-column block (q4_0, q8_0). */
static inline int packed_regs(uint32_t type) { return type == QUILL_TYPE_Q8_0 ? 8 : 4; }

/* Bytes of a packed chunk of `blocks` blocks (q4_0, q8_0), and where the chunk of column k0 begins. */
static inline size_t packed_chunk_bytes(uint32_t type, int64_t blocks) {
    return chunk_scale_bytes(blocks) + (size_t)blocks * (size_t)packed_regs(type) * 64;
}
static inline size_t packed_chunk_at(uint32_t type, int64_t k0) {
    return (size_t)(k0 / CW) * packed_chunk_bytes(type, CW / 32);
}

/* Registers of a packed k-quant super-block; in q4_K and q5_K, where window c's half h begins. */
static inline int kblock_regs(uint32_t type) {
    return type == QUILL_TYPE_Q4_K ? 4 + 32 : type == QUILL_TYPE_Q5_K ? 4 + 40 : 5 + 48;
}
static inline int half_window_reg(uint32_t type, int c, int h) {
    return 4 + (2 * c + h) * (type == QUILL_TYPE_Q5_K ? 5 : 4);
}

static inline size_t packed_tile_bytes(uint32_t type, int64_t cols) {
    if (is_kquant(type)) return (size_t)(cols / 256) * (size_t)kblock_regs(type) * 64;
    return packed_chunk_at(type, cols) + (cols % CW ? packed_chunk_bytes(type, cols % CW / 32) : 0);
}

/* Tiles per group in the layout of q4_0 and q8_0 (see above). */
#define PACK_GROUP 4
static inline int pack_group(uint32_t type) { return type == QUILL_TYPE_Q4_0 ? PACK_GROUP : 1; }

/* Where tile `tile` (of `tiles`) of a packed q4_0 or q8_0 matrix keeps its chunk from column k0:
 * the group's chunk, at byte `chunk`, holds n tiles, this one the i-th. */
typedef struct {
    size_t chunk;
    int n, i;
} packed_place;
static inline packed_place place_chunk(uint32_t type, int64_t tiles, size_t tile_bytes, int64_t tile, int64_t k0) {
    const int g = pack_group(type);
    const int64_t first = tile / g * g;
    const int n = tiles - first < g ? (int)(tiles - first) : g;
    return (packed_place){(size_t)first * tile_bytes + (size_t)n * packed_chunk_at(type, k0), n, (int)(tile - first)};
}
/* In that chunk (of `blocks` blocks), the byte where the tile's scales begin, and its block b's codes. */
static inline size_t place_scales(packed_place p, int64_t blocks) {
    return p.chunk + (size_t)p.i * chunk_scale_bytes(blocks);
}
static inline size_t place_codes(uint32_t type, packed_place p, int64_t blocks, int64_t b) {
    return p.chunk + (size_t)p.n * chunk_scale_bytes(blocks) +
           ((size_t)p.n * (size_t)b + (size_t)p.i) * (size_t)packed_regs(type) * 64;
}

static size_t vnni_pack_bytes(uint32_t type, int64_t rows, int64_t cols) {
    if (!packed_type(type) || rows <= 0 || cols <= 0 || cols % block_elems(type)) return 0;
    return (size_t)((rows + TR - 1) / TR) * packed_tile_bytes(type, cols);
}

/* The 4 bytes of row r that go to register `reg` of a packed range at `dst`. */
static inline void put_word(uint8_t *dst, size_t reg, int r, const uint8_t *bytes, uint8_t flip) {
    uint32_t v;
    memcpy(&v, bytes, 4);
    v ^= flip * 0x01010101u;
    memcpy(dst + reg * 64 + (size_t)r * 4, &v, 4);
}

static void vnni_pack(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                      int64_t tile0, int64_t tile1) {
    const size_t tb = packed_tile_bytes(type, cols);
    const int64_t nb = cols / 32, tiles = (rows + TR - 1) / TR;
    for (int64_t tile = tile0; tile < tile1; tile++) {
        uint8_t *t = (uint8_t *)dst + (size_t)tile * tb;
        if (is_kquant(type)) {
            memset(t, 0, tb);
        } else { /* the tile's pieces of its group: its scales and its registers of each block */
            for (int64_t k0 = 0; k0 < cols; k0 += CW) {
                const int64_t blocks = (cols - k0 < CW ? cols - k0 : CW) / 32;
                const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                memset((uint8_t *)dst + place_scales(pl, blocks), 0, chunk_scale_bytes(blocks));
                for (int64_t b = 0; b < blocks; b++)
                    memset((uint8_t *)dst + place_codes(type, pl, blocks, b), 0, (size_t)packed_regs(type) * 64);
            }
        }
        for (int r = 0; r < TR && tile * TR + r < rows; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)(tile * TR + r) * row_bytes;
            if (type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K) {
                for (int64_t sb = 0; sb < cols / 256; sb++) {
                    const uint8_t *b = row + (size_t)sb * block_bytes(type);
                    const uint8_t *qs = b + (type == QUILL_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs));
                    uint8_t *d = t + (size_t)sb * (size_t)kblock_regs(type) * 64;
                    for (int i = 0; i < 4; i++) put_word(d, (size_t)i, r, b + 4 * i, 0);
                    for (int c = 0; c < 4; c++)
                        for (int h = 0; h < 2; h++) {
                            const size_t reg = (size_t)half_window_reg(type, c, h);
                            for (int i = 0; i < 4; i++) put_word(d, reg + (size_t)i, r, qs + 32 * c + 16 * h + 4 * i, 0);
                            if (type != QUILL_TYPE_Q5_K) continue;
                            const uint8_t *qh = ((const block_q5_K *)b)->qh;
                            uint8_t fifth[4] = {0};
                            for (int j = 0; j < 4; j++)
                                for (int i = 0; i < 4; i++) {
                                    const int l = 16 * h + 4 * i + j; /* the element of sub-blocks 2c and 2c + 1 */
                                    fifth[j] |= (uint8_t)(((qh[l] >> (2 * c)) & 1) << (2 * i));
                                    fifth[j] |= (uint8_t)(((qh[l] >> (2 * c + 1)) & 1) << (2 * i + 1));
                                }
                            put_word(d, reg + 4, r, fifth, 0);
                        }
                }
                continue;
            }
            if (type == QUILL_TYPE_Q6_K) {
                for (int64_t sb = 0; sb < cols / 256; sb++) {
                    const block_q6_K *b = (const block_q6_K *)row + sb;
                    uint8_t *d = t + (size_t)sb * (size_t)kblock_regs(type) * 64;
                    for (int i = 0; i < 4; i++) put_word(d, (size_t)i, r, (const uint8_t *)b->scales + 4 * i, 0);
                    const uint8_t dword[4] = {0, 0, ((const uint8_t *)&b->d)[0], ((const uint8_t *)&b->d)[1]};
                    put_word(d, 4, r, dword, 0);
                    uint8_t u[256]; /* q + 32, as the file's dequantizer takes them apart */
                    for (int half = 0; half < 2; half++)
                        for (int l = 0; l < 32; l++) {
                            const uint8_t *ql = b->ql + 64 * half, qh = b->qh[32 * half + l];
                            u[128 * half + l] = (uint8_t)((ql[l] & 0xF) | ((qh & 3) << 4));
                            u[128 * half + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
                            u[128 * half + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
                            u[128 * half + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
                        }
                    for (int sl = 0; sl < 16; sl++) {
                        const uint8_t *v = u + 16 * sl;
                        uint8_t n0[4], n1[4], top[4];
                        for (int j = 0; j < 4; j++) {
                            n0[j] = (uint8_t)((v[j] & 0xF) | (v[8 + j] & 0xF) << 4);
                            n1[j] = (uint8_t)((v[4 + j] & 0xF) | (v[12 + j] & 0xF) << 4);
                            top[j] = (uint8_t)((v[j] >> 4) | (v[4 + j] >> 4) << 2 | (v[8 + j] >> 4) << 4 | (v[12 + j] >> 4) << 6);
                        }
                        put_word(d, (size_t)(5 + 3 * sl), r, n0, 0);
                        put_word(d, (size_t)(5 + 3 * sl + 1), r, n1, 0);
                        put_word(d, (size_t)(5 + 3 * sl + 2), r, top, 0);
                    }
                }
                continue;
            }
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *b = row + (size_t)blk * block_bytes(type);
                const int64_t k0 = blk * 32 / CW * CW, in_chunk = blk % (CW / 32);
                const int64_t blocks = (cols - k0 < CW ? cols - k0 : CW) / 32;
                const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                uint8_t *codes = (uint8_t *)dst + place_codes(type, pl, blocks, in_chunk);
                memcpy((uint8_t *)dst + place_scales(pl, blocks) + (size_t)in_chunk * 32 + (size_t)r * 2, b, 2); /* d */
                if (type == QUILL_TYPE_Q8_0)
                    for (int i = 0; i < 8; i++) put_word(codes, (size_t)i, r, b + offsetof(block_q8_0, qs) + 4 * i, 0x80);
                else
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + offsetof(block_q4_0, qs) + 4 * i, 0);
            }
        }
    }
}

/* Bytes ahead of the reading position that the decoding loop prefetches: where one core reads
 * 32 GB/s (this machine kind on 2026-11-25), some 4 KiB must be in flight to cover memory's latency.
 * Measured side by side, one and two threads, against 1 KiB: q4_0 +16 % at 8 KiB (+2 % over
 * 4 KiB), q4_K +6 %, q5_K +7 %; q6_K +14 % at 4 KiB but -13 % at 8 KiB, q8_0 +2 % at 4 KiB.
 * (Into L2 16-32 KiB ahead and into L1 1-2 KiB ahead: 0-15 % slower.) q4_0 read in groups of 4
 * tiles (2026-11-26): 4 KiB non-temporal and nothing further, below. */
static inline size_t packed_ahead(uint32_t type) {
    return type == QUILL_TYPE_Q6_K || type == QUILL_TYPE_Q8_0 || type == QUILL_TYPE_Q4_0 ? 4096 : 8192;
}
/* q4_0 and q8_0 prefetch their lines near as non-temporal (2 threads +1.4 % and +2.5 % against
 * T0, one thread even), and into L2 further ahead, PACKED_FAR: a core's misses to L1 are few (its
 * fill buffers), the line requests L2 keeps in flight many more, and the non-temporal lines do not
 * pass through L2 for its own prefetchers to follow. Shared machines' memory latency grows with the
 * other tenants' load until the near prefetches alone no longer cover it. Against the near
 * prefetch alone, `bench/ab.sh` tg128 (10 and 8 alternating rounds; A/A control 1.008x): q4_0
 * +4.1-5.4 % with 2 threads (8-10 rounds of 10 faster), +14 % with one; q8_0 +4.5 % with 2, 1 thread
 * 0.98x and 1.045x in two runs. The k-quants, whose near prefetch goes through L2, measured slower
 * with it: q4_K_M 0.93x, q6_K 0.89x (and 0.96x, 0.90x with a non-temporal near prefetch besides);
 * 64 KiB ahead, or into L2 instead of the near prefetch, was slower for every type.
 * q4_0 read in groups of 4 tiles (q4_0_group) no longer gains from the L2 prefetch: its lines
 * non-temporal 4 KiB ahead and nothing else, against 8 KiB + L2 16 KiB, tg128 2 threads 1.08x
 * (7 of 8 rounds) with T0 4 KiB and 1.02x more non-temporal (7 of 8), one thread 1.07x and
 * 0.99x; non-temporal 2 KiB and 6 KiB ahead 0.98x and 0.995x against 4 KiB. */
#define PACKED_FAR 16384
static inline __attribute__((always_inline)) void prefetch_ahead(uint32_t type, const __m512i *at) {
    if (type == QUILL_TYPE_Q4_0) {
        _mm_prefetch((const char *)at + packed_ahead(type), _MM_HINT_NTA);
    } else if (type == QUILL_TYPE_Q8_0) {
        _mm_prefetch((const char *)at + PACKED_FAR, _MM_HINT_T1);
        _mm_prefetch((const char *)at + packed_ahead(type), _MM_HINT_NTA);
    } else {
        _mm_prefetch((const char *)at + packed_ahead(type), _MM_HINT_T0);
    }
}

/* The f32 step of one slot, as decode_impl takes it. */
static inline __attribute__((always_inline)) __m512 slot_step(uint32_t type, __m512 acc, __m512i ch, __m512i cl,
                                                             const planes *P, int64_t slot_k, int64_t blk, __m512 sc,
                                                             const float *m) {
    const __m512i sub = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(ch, 8), cl), _mm512_set1_epi32(P->bias_sum[slot_k]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sub), _mm512_mul_ps(sc, _mm512_set1_ps(P->da[blk])), acc);
    if (has_min(type)) acc = _mm512_fnmadd_ps(_mm512_load_ps(m), _mm512_set1_ps(P->sf[blk]), acc);
    return acc;
}

/* q4_0's decoding of one group of n (1..PACK_GROUP) tiles: each activation word broadcast serves
 * the n tiles. One tile at a time, a block's 16 broadcasts and 4 code loads (8 as gcc compiled
 * them) outnumbered its 16 vpdpbusd on a machine that issues two vector loads and two vpdpbusd
 * per cycle: 17-19 cycles per tile and block where the products take 8. Grouped, tg128 1.06x
 * with one thread, 1.00-1.01x with two (bench/README.md, seventeenth session). */
static inline __attribute__((always_inline)) void q4_0_group(const decode_job *j, int64_t group, const int n) {
    const uint32_t type = QUILL_TYPE_Q4_0;
    const uint8_t *base = j->w + (size_t)group * PACK_GROUP * packed_tile_bytes(type, j->cols);
    const planes *P = j->P;
    const __m512i z = _mm512_setzero_si512();
    __m512 acc[PACK_GROUP];
#pragma GCC unroll 4
    for (int t = 0; t < n; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
        const int64_t blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
        const size_t scale_bytes = chunk_scale_bytes(blocks);
        const uint8_t *chunk = base + (size_t)n * packed_chunk_at(type, k0);
        /* every line read is prefetched once, ahead: the scales' with the chunk's first block */
        for (size_t at = 0; at < (size_t)n * scale_bytes; at += 64) prefetch_ahead(type, (const __m512i *)(chunk + at));
        /* the chunk's scales first, all of them, so that the group is read front to back (a scale
         * per block, between the blocks' codes, went back to the chunk's front each time: tg
         * 1.034x with 2 threads, 1.054x with one) */
        _Alignas(64) float sbuf[PACK_GROUP][CW / 32][TR];
#pragma GCC unroll 4
        for (int t = 0; t < n; t++)
            for (int64_t b = 0; b < blocks; b++)
                _mm512_store_ps(sbuf[t][b],
                                _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(chunk + t * scale_bytes + b * 32))));
        const __m512i *codes = (const __m512i *)(chunk + (size_t)n * scale_bytes);
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t blk = k0 / 32 + b;
            const int8_t *h = P->h + blk * 32, *l = P->l + blk * 32;
            const __m512i *v = codes + 4 * n * b;
#pragma GCC unroll 16
            for (int i = 0; i < 4 * n; i++) prefetch_ahead(type, v + i);
            __m512i lo_h[PACK_GROUP], hi_h[PACK_GROUP], lo_l[PACK_GROUP], hi_l[PACK_GROUP];
#pragma GCC unroll 4
            for (int t = 0; t < n; t++) lo_h[t] = hi_h[t] = lo_l[t] = hi_l[t] = z;
            /* the block's activation words by 4 loads and 16 shuffles instead of 16 broadcast
             * loads: in cache 0.95x, but from memory one core read 0.95 of a plain read's speed
             * against 0.89 (medians; fewer loads beside the codes' and the prefetches, which
             * share the core's load pipes); tg128 1.02-1.10x with 1 and 2 threads. q8_0 and q6_K
             * gained nothing from the same (bench/README.md, eighteenth session). */
            const __m512i h_lo4 = quad_of(h), h_hi4 = quad_of(h + 16), l_lo4 = quad_of(l), l_hi4 = quad_of(l + 16);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m512i h_lo = dword_of(h_lo4, i), h_hi = dword_of(h_hi4, i);
                const __m512i l_lo = dword_of(l_lo4, i), l_hi = dword_of(l_hi4, i);
#pragma GCC unroll 4
                for (int t = 0; t < n; t++) {
                    __m512i lo, hi;
                    nibble_codes(v + 4 * t, NULL, i, &lo, &hi);
                    lo_h[t] = _mm512_dpbusd_epi32(lo_h[t], lo, h_lo);
                    hi_h[t] = _mm512_dpbusd_epi32(hi_h[t], hi, h_hi);
                    lo_l[t] = _mm512_dpbusd_epi32(lo_l[t], lo, l_lo);
                    hi_l[t] = _mm512_dpbusd_epi32(hi_l[t], hi, l_hi);
                }
            }
#pragma GCC unroll 4
            for (int t = 0; t < n; t++)
                acc[t] = slot_step(type, acc[t], _mm512_add_epi32(lo_h[t], hi_h[t]), _mm512_add_epi32(lo_l[t], hi_l[t]), P,
                                   blk, blk, _mm512_load_ps(sbuf[t][b]), NULL);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < n; t++) {
        const int64_t r0 = (group * PACK_GROUP + t) * TR;
        const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
        _Alignas(64) float out[TR];
        _mm512_store_ps(out, acc[t]);
        for (int r = 0; r < nr; r++) j->y[r0 + r] = out[r];
    }
}

/* Tiles [t0, t1) of the matrix; for q4_0 groups [t0, t1) instead (q4_0_group). */
static inline __attribute__((always_inline)) void decode_packed_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                                     uint32_t type) {
    if (!packed_type(type)) return; /* never called: TYPED_TASKS instantiates every type */
    if (type == QUILL_TYPE_Q4_0) {
        const int64_t tiles = (j->rows + TR - 1) / TR;
        for (int64_t g = t0; g < t1; g++) {
            const int64_t left = tiles - g * PACK_GROUP;
            if (left >= 4) q4_0_group(j, g, 4);
            else if (left == 3) q4_0_group(j, g, 3);
            else if (left == 2) q4_0_group(j, g, 2);
            else q4_0_group(j, g, 1);
        }
        return;
    }
    const size_t tb = packed_tile_bytes(type, j->cols);
    const planes *P = j->P;
    for (int64_t tile = t0; tile < t1; tile++) {
        const uint8_t *base = j->w + (size_t)tile * tb;
        const int64_t r0 = tile * TR;
        const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
        __m512 acc = _mm512_setzero_ps();
        if (type == QUILL_TYPE_Q6_K) {
            for (int64_t sb = 0; sb < j->cols / 256; sb++) {
                const __m512i *v = (const __m512i *)(base + (size_t)sb * (size_t)kblock_regs(type) * 64);
                const __m512i z = _mm512_setzero_si512();
                __m512i hw[5];
                for (int i = 0; i < 5; i++) hw[i] = _mm512_load_si512(v + i);
                _Alignas(64) float s[16][TR];
                kquant_scales(type, hw, s, NULL);
                for (int sl = 0; sl < 16; sl++) {
                    const __m512i *sv = v + 5 + 3 * sl;
                    for (int i = 0; i < 3; i++) prefetch_ahead(type, sv + i);
                    const int64_t k = sb * 256 + 16 * sl;
                    __m512i g[4], h[2] = {z, z}, l[2] = {z, z};
                    q6_codes(sv, g);
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) {
                        h[q & 1] = _mm512_dpbusd_epi32(h[q & 1], g[q], bcast4(P->h + k + 4 * q));
                        l[q & 1] = _mm512_dpbusd_epi32(l[q & 1], g[q], bcast4(P->l + k + 4 * q));
                    }
                    acc = slot_step(type, acc, _mm512_add_epi32(h[0], h[1]), _mm512_add_epi32(l[0], l[1]), P, k / 16,
                                    k / 32, _mm512_load_ps(s[sl]), NULL);
                }
            }
        } else if (is_kquant(type)) {
            for (int64_t sb = 0; sb < j->cols / 256; sb++) {
                const __m512i *v = (const __m512i *)(base + (size_t)sb * (size_t)kblock_regs(type) * 64);
                const __m512i z = _mm512_setzero_si512();
                __m512i hw[5] = {_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
                                 _mm512_load_si512(v + 3), z};
                _Alignas(64) float s[8][TR], m[8][TR];
                kquant_scales(type, hw, s, m);
                for (int c = 0; c < 4; c++) {
                    const __m512i *cv = v + half_window_reg(type, c, 0), *cv1 = v + half_window_reg(type, c, 1);
                    for (int i = 0; i < kblock_regs(type) / 4 - 1; i++)
                        prefetch_ahead(type, cv + i);
                    const int64_t k = sb * 256 + 64 * c;
                    const bool q5 = type == QUILL_TYPE_Q5_K;
                    __m512i lo_h = z, hi_h = z, lo_l = z, hi_l = z;
                    nibble_sums(cv, q5 ? cv + 4 : NULL, P, k, 32, &lo_h, &hi_h, &lo_l, &hi_l);
                    nibble_sums(cv1, q5 ? cv1 + 4 : NULL, P, k + 16, 32, &lo_h, &hi_h, &lo_l, &hi_l);
                    acc = slot_step(type, acc, lo_h, lo_l, P, k / 32, k / 32, _mm512_load_ps(s[2 * c]), m[2 * c]);
                    acc = slot_step(type, acc, hi_h, hi_l, P, k / 32 + 1, k / 32 + 1, _mm512_load_ps(s[2 * c + 1]),
                                    m[2 * c + 1]);
                }
            }
        } else {
            const int regs = packed_regs(type);
            for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
                const int64_t chunk_blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
                const uint8_t *chunk = base + packed_chunk_at(type, k0);
                const __m512i *codes = (const __m512i *)(chunk + chunk_scale_bytes(chunk_blocks));
                /* every line read is prefetched once, ahead: the scales' with the chunk's first block */
                for (size_t at = 0; at < chunk_scale_bytes(chunk_blocks); at += 64)
                    prefetch_ahead(type, (const __m512i *)(chunk + at));
                /* (a scale per block: all the chunk's scales first, as q4_0 takes them, measured
                 * 0.94-0.98x for q8_0's twice as many codes per scale) */
                for (int64_t b = 0; b < chunk_blocks; b++) {
                    const int64_t blk = k0 / 32 + b;
                    const __m512i *v = codes + b * regs;
                    for (int i = 0; i < regs; i++) prefetch_ahead(type, v + i);
                    const __m512 sc = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(chunk + b * 32)));
                    const __m512i z = _mm512_setzero_si512();
                    /* two chains per plane, so that each vpdpbusd waits on one two back */
                    __m512i h[2] = {z, z}, l[2] = {z, z};
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) {
                        const __m512i w = _mm512_load_si512(v + i);
                        h[i & 1] = dpbusd_bcast(h[i & 1], w, P->h + blk * 32 + 4 * i);
                        l[i & 1] = dpbusd_bcast(l[i & 1], w, P->l + blk * 32 + 4 * i);
                    }
                    acc = slot_step(type, acc, _mm512_add_epi32(h[0], h[1]), _mm512_add_epi32(l[0], l[1]), P, blk, blk,
                                    sc, NULL);
                }
            }
        }
        _Alignas(64) float out[TR];
        _mm512_store_ps(out, acc);
        for (int r = 0; r < nr; r++) j->y[r0 + r] = out[r];
    }
}

/* In asm: gcc drops a loop of nothing but _mm_prefetch (no side effects, so dead code). */
static inline void prefetch_bytes(const uint8_t *p, size_t n) {
    for (size_t at = 0; at < n; at += 64) __asm__ volatile("prefetcht0 %0" : : "m"(p[at]));
}

/* Prefetches the bytes of packed tile `tile` that the chunk from column k0 reads. */
static inline __attribute__((always_inline)) void prefetch_chunk(uint32_t type, const decode_job *j, size_t tile_bytes,
                                                                 int64_t tile, int64_t k0) {
    const int64_t tiles = (j->rows + TR - 1) / TR;
    if (tile >= tiles) return;
    if (is_kquant(type)) {
        prefetch_bytes(j->w + (size_t)tile * tile_bytes + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64,
                       (size_t)kblock_regs(type) * 64);
        return;
    }
    const int64_t blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
    const packed_place pl = place_chunk(type, tiles, tile_bytes, tile, k0);
    prefetch_bytes(j->w + place_scales(pl, blocks), chunk_scale_bytes(blocks));
    for (int64_t b = 0; b < blocks; b++)
        prefetch_bytes(j->w + place_codes(type, pl, blocks, b), (size_t)packed_regs(type) * 64);
}

/* The batch loop over packed tiles: each chunk's codes go to wbuf by masks and shifts (q8_0's are
 * already wbuf: no copy), its scales by one conversion per block. */
static inline __attribute__((always_inline)) void gemm_packed_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                                   uint32_t type) {
    if (!packed_type(type)) return; /* never called: TYPED_TASKS instantiates every type */
    const size_t tb = packed_tile_bytes(type, j->cols);
    _Alignas(64) __m512i wbuf[CW / 4], wbuf16[CW / 2];
    _Alignas(64) float sbuf[CW / 16][TR], mbuf[CW / 16][TR];
    _Alignas(64) float tile_acc[VNNI_TOKENS + TBW][TR];
    /* q4_0's groups interleave their tiles chunk by chunk: with few tokens (batched decoding) the
     * loop takes a group's tiles chunk by chunk as well, so that it reads the group front to back
     * once; tile by tile it went through each group four times, a quarter of it each time (4
     * sequences 0.93x). Many tokens need one tile's sums at a time (tile_acc). */
    const bool by_group = pack_group(type) > 1 && j->n_tok <= TBW;
    _Alignas(64) float group_acc[PACK_GROUP][2 * TBW][TR];
    const int64_t tiles = (j->rows + TR - 1) / TR;
    for (int64_t first = t0; first < t1;) {
        int64_t past = first + 1;
        if (by_group) {
            past = (first / PACK_GROUP + 1) * PACK_GROUP;
            if (past > t1) past = t1;
        }
        for (int64_t tile = first; tile < past; tile++)
            memset(by_group ? group_acc[tile - first] : tile_acc, 0, (size_t)(j->n_tok + TBW) * sizeof tile_acc[0]);
        for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
            for (int64_t tile = first; tile < past; tile++) {
                const uint8_t *base = j->w + (size_t)tile * tb;
                float(*accbuf)[TR] = by_group ? group_acc[tile - first] : tile_acc;
                const int cw = j->cols - k0 < CW ? (int)(j->cols - k0) : CW;
                const __m512i *w = wbuf;
                if (type == QUILL_TYPE_Q6_K) {
                    const __m512i *v = (const __m512i *)(base + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64);
                    __m512i hw[5];
                    for (int i = 0; i < 5; i++) hw[i] = _mm512_load_si512(v + i);
                    kquant_scales(type, hw, sbuf, NULL);
                    for (int sl = 0; sl < 16; sl++) q6_codes(v + 5 + 3 * sl, wbuf + 4 * sl);
                } else if (is_kquant(type)) {
                    const __m512i *v = (const __m512i *)(base + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64);
                    __m512i hw[5] = {_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
                                     _mm512_load_si512(v + 3), _mm512_setzero_si512()};
                    kquant_scales(type, hw, sbuf, mbuf);
                    /* window c: slot 2c's columns (the low nibbles) are wbuf[16c..16c+7], 2c + 1's next */
                    for (int c = 0; c < 4; c++)
                        for (int h = 0; h < 2; h++) {
                            const __m512i *hv = v + half_window_reg(type, c, h);
                            for (int i = 0; i < 4; i++)
                                nibble_codes(hv, type == QUILL_TYPE_Q5_K ? hv + 4 : NULL, i, &wbuf[16 * c + 4 * h + i],
                                             &wbuf[16 * c + 8 + 4 * h + i]);
                        }
                } else {
                    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                    const uint16_t *scales = (const uint16_t *)(j->w + place_scales(pl, cw / 32));
                    for (int b = 0; b < cw / 32; b++)
                        _mm512_store_ps(sbuf[b], _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(scales + 16 * b))));
                    if (type == QUILL_TYPE_Q8_0) { /* groups of one: the chunk's blocks are contiguous */
                        w = (const __m512i *)(j->w + place_codes(type, pl, cw / 32, 0));
                    } else {
                        for (int b = 0; b < cw / 32; b++) {
                            const __m512i *v = (const __m512i *)(j->w + place_codes(type, pl, cw / 32, b));
                            for (int i = 0; i < 4; i++) nibble_codes(v, NULL, i, &wbuf[8 * b + i], &wbuf[8 * b + 4 + i]);
                        }
                    }
                }
                /* the next chunk's bytes meanwhile: its loads came cold from memory and stalled the
                 * unpacking above (a tenth of a one-thread prompt's samples in this function) */
                if (k0 + CW < j->cols) prefetch_chunk(type, j, tb, tile, k0 + CW);
                else prefetch_chunk(type, j, tb, tile + 1, 0);
                gemm_chunk_any(j, type, k0, cw, w, wbuf16, sbuf, mbuf, accbuf);
            }
        }
        for (int64_t tile = first; tile < past; tile++) {
            const float(*accbuf)[TR] = by_group ? group_acc[tile - first] : tile_acc;
            const int64_t r0 = tile * TR;
            const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
            const __mmask16 mask = (__mmask16)((1u << nr) - 1);
            for (int t = 0; t < j->n_tok; t++)
                _mm512_mask_storeu_ps(j->y + (size_t)t * (size_t)j->rows + r0, mask, _mm512_load_ps(accbuf[t]));
        }
        first = past;
    }
}

TYPED_TASKS(decode_packed, decode_packed_impl)
TYPED_TASKS(gemm_packed, gemm_packed_impl)

typedef struct {
    uint32_t type;
    const float *x; /* the pass's first token */
    int64_t cols;
    const planes *P;
    int n_tok;
    bool broadcasts; /* the file layout's decoding loop reads hx and lx */
    int32_t *word_a; /* NULL: no word products in this pass */
    float *word_da, *word_sf;
} planes_job;

/* Tokens [t0, t1) of a pass (past n_tok: the word layout's padding, zeros). */
static void quantize_planes_items(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const planes_job *j = arg;
    const int64_t pairs = j->cols / 2, blocks = j->cols / 32;
    for (int64_t t = t0; t < t1; t++) {
        const bool real = t < j->n_tok;
        int32_t *a = j->word_a ? j->word_a + (size_t)(t / TBW) * (size_t)pairs * TBW + t % TBW : NULL;
        if (real) quantize_planes(j->type, j->x + (size_t)t * (size_t)j->cols, j->cols, &j->P[t], j->broadcasts, a, TBW);
        if (!a) continue;
        if (!real)
            for (int64_t p = 0; p < pairs; p++) a[p * TBW] = 0;
        const size_t at = (size_t)(t / TBW) * (size_t)blocks * TBW + (size_t)(t % TBW);
        for (int64_t b = 0; b < blocks; b++) {
            j->word_da[at + (size_t)b * TBW] = real ? j->P[t].da[b] : 0;
            j->word_sf[at + (size_t)b * TBW] = real ? j->P[t].sf[b] : 0;
        }
    }
}

static size_t word_acts_bytes(int64_t cols, int n_tok) {
    return (size_t)((n_tok + TBW - 1) / TBW * TBW) * ((size_t)cols * 2 + (size_t)(cols / 32) * 8) + 64;
}

static size_t vnni_scratch(int64_t cols, int n_tok) {
    const int pass = n_tok < VNNI_TOKENS ? n_tok : VNNI_TOKENS;
    return (size_t)pass * planes_bytes(cols) + (pass >= WORD_TOKENS ? word_acts_bytes(cols, pass) : 0);
}

static void vnni_matmul_from(uint32_t type, bool packed, const quill_matrix *m, int n_mats, int64_t cols,
                             const float *x, int n_tok, quill_pool *pool, void *scratch) {
    planes P[VNNI_TOKENS];
    decode_job dj[QUILL_MATMUL_MAX_MATS];
    quill_pool_task tasks[QUILL_MATMUL_MAX_MATS];
    const int pass = n_tok < VNNI_TOKENS ? n_tok : VNNI_TOKENS;
    uint8_t *words = (uint8_t *)(((uintptr_t)scratch + (size_t)pass * planes_bytes(cols) + 63) & ~(uintptr_t)63);
    for (int t0 = 0; t0 < n_tok; t0 += VNNI_TOKENS) {
        const int nt = n_tok - t0 < VNNI_TOKENS ? n_tok - t0 : VNNI_TOKENS;
        const int padded = (nt + TBW - 1) / TBW * TBW;
        for (int t = 0; t < nt; t++) P[t] = planes_at((uint8_t *)scratch + (size_t)t * planes_bytes(cols), cols);
        const bool by_words = nt >= WORD_TOKENS;
        int32_t *word_a = by_words ? (int32_t *)words : NULL;
        float *word_da = by_words ? (float *)(words + (size_t)padded * (size_t)cols * 2) : NULL;
        float *word_sf = by_words ? word_da + (size_t)padded * (size_t)(cols / 32) : NULL;
        const planes_job pj = {type, x + (size_t)t0 * (size_t)cols, cols, P, nt, nt == 1 && !packed, word_a, word_da, word_sf};
        /* a batch's tokens on every thread: on one, they were ~4 % of a 2-thread prompt's time */
        if (nt == 1) quantize_planes_items((void *)&pj, 0, 1, 0);
        else quill_pool_run(pool, quantize_planes_items, (void *)&pj, by_words ? padded : nt, 1);
        for (int i = 0; i < n_mats; i++) {
            float *y = m[i].y + (size_t)t0 * (size_t)m[i].rows;
            dj[i] = (decode_job){type, m[i].w, m[i].row_bytes, m[i].rows, cols, nt, P, y, word_a, word_da, word_sf};
            const quill_task_fn fn = packed ? (nt == 1 ? decode_packed_fn(type) : gemm_packed_fn(type))
                                            : (nt == 1 ? decode_fn(type) : gemm_fn(type));
            /* packed q4_0 decodes a group of tiles at a time (q4_0_group) */
            const int per_item = nt == 1 && packed ? pack_group(type) : 1;
            const int64_t tiles = (m[i].rows + TR - 1) / TR;
            tasks[i] = (quill_pool_task){fn, &dj[i], (tiles + per_item - 1) / per_item};
        }
        int64_t grain = 1;
        if (nt == 1 && packed) {
            grain = (int64_t)(DECODE_CLAIM / (packed_tile_bytes(type, cols) * (size_t)pack_group(type)));
            if (grain < 1) grain = 1;
        }
        quill_pool_run_joined(pool, tasks, n_mats, grain);
    }
}

static void vnni_matmul(uint32_t type, const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok,
                        quill_pool *pool, void *scratch) {
    vnni_matmul_from(type, false, m, n_mats, cols, x, n_tok, pool, scratch);
}

static void vnni_matmul_packed(uint32_t type, const quill_matrix *m, int n_mats, int64_t cols, const float *x,
                               int n_tok, quill_pool *pool, void *scratch) {
    vnni_matmul_from(type, true, m, n_mats, cols, x, n_tok, pool, scratch);
}

#define MATMUL_FN(name, impl, type)                                                                  \
    static void name(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok,     \
                     quill_pool *pool, void *scratch) {                                              \
        impl(type, m, n_mats, cols, x, n_tok, pool, scratch);                                        \
    }
#define MATMUL_FNS(prefix, impl)                                                                     \
    MATMUL_FN(prefix##_q4_0, impl, QUILL_TYPE_Q4_0)                                                  \
    MATMUL_FN(prefix##_q4_1, impl, QUILL_TYPE_Q4_1)                                                  \
    MATMUL_FN(prefix##_q5_0, impl, QUILL_TYPE_Q5_0)                                                  \
    MATMUL_FN(prefix##_q5_1, impl, QUILL_TYPE_Q5_1)                                                  \
    MATMUL_FN(prefix##_q8_0, impl, QUILL_TYPE_Q8_0)                                                  \
    MATMUL_FN(prefix##_q4_K, impl, QUILL_TYPE_Q4_K)                                                  \
    MATMUL_FN(prefix##_q5_K, impl, QUILL_TYPE_Q5_K)                                                  \
    MATMUL_FN(prefix##_q6_K, impl, QUILL_TYPE_Q6_K)                                                  \
    static void prefix##_install(quill_kernels *k) {                                                 \
        k->matmul[QUILL_TYPE_Q4_0] = prefix##_q4_0;                                                  \
        k->matmul[QUILL_TYPE_Q4_1] = prefix##_q4_1;                                                  \
        k->matmul[QUILL_TYPE_Q5_0] = prefix##_q5_0;                                                  \
        k->matmul[QUILL_TYPE_Q5_1] = prefix##_q5_1;                                                  \
        k->matmul[QUILL_TYPE_Q8_0] = prefix##_q8_0;                                                  \
        k->matmul[QUILL_TYPE_Q4_K] = prefix##_q4_K;                                                  \
        k->matmul[QUILL_TYPE_Q5_K] = prefix##_q5_K;                                                  \
        k->matmul[QUILL_TYPE_Q6_K] = prefix##_q6_K;                                                  \
    }
MATMUL_FNS(matmul_amx, amx_matmul)
MATMUL_FNS(matmul_vnni, vnni_matmul)
MATMUL_FN(matmul_packed_q4_0, vnni_matmul_packed, QUILL_TYPE_Q4_0)
MATMUL_FN(matmul_packed_q8_0, vnni_matmul_packed, QUILL_TYPE_Q8_0)
MATMUL_FN(matmul_packed_q4_K, vnni_matmul_packed, QUILL_TYPE_Q4_K)
MATMUL_FN(matmul_packed_q5_K, vnni_matmul_packed, QUILL_TYPE_Q5_K)
MATMUL_FN(matmul_packed_q6_K, vnni_matmul_packed, QUILL_TYPE_Q6_K)

/* ---------------------------------------------------------------- installation (kernels.c
 * calls these on CPUs with the features, over a copy of the avx512 set) */

void quill_kernels_install_vnni(quill_kernels *k) {
    k->matmul_scratch = vnni_scratch;
    matmul_vnni_install(k);
    k->packed_layout = "vnni16";
    k->pack_bytes = vnni_pack_bytes;
    k->pack = vnni_pack;
    k->matmul_packed[QUILL_TYPE_Q4_0] = matmul_packed_q4_0;
    k->matmul_packed[QUILL_TYPE_Q8_0] = matmul_packed_q8_0;
    k->matmul_packed[QUILL_TYPE_Q4_K] = matmul_packed_q4_K;
    k->matmul_packed[QUILL_TYPE_Q5_K] = matmul_packed_q5_K;
    k->matmul_packed[QUILL_TYPE_Q6_K] = matmul_packed_q6_K;
}

void quill_kernels_install_amx(quill_kernels *k) {
    k->matmul_scratch = amx_scratch;
    matmul_amx_install(k);
}
#endif
