/* AVX2 + FMA kernels (8 lanes). Same structure as the AVX-512 file: see there. The two stay apart
 * where the lanes (8 against 16), the tails (loops against masks) and the registers (16 against
 * 32) change the code; what is the same is in float_products.h, unpack_simd.h and dot_tokens.h. */
#include "kernels/x86/kernels_simd.h"
#include "kernels/x86/float_products.h"
#include "kernels/dot_tokens.h"
#include "base/exp_poly.h"
#include "tensor/types_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

/* The F16C instruction converts a half exactly, like quill_half_to_float, without its branches. */
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

static inline float hsum256(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __attribute__((always_inline)) void dot_nt(const float *w, const float *x, int64_t n,
                                                         int64_t xs, float *out, int64_t os, int NT) {
    __m256 a[4], b[4];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 w0 = _mm256_loadu_ps(w + i), w1 = _mm256_loadu_ps(w + i + 8);
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            a[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs + i), a[t]);
            b[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * xs + i + 8), b[t]);
        }
    }
    float tail[4] = {0};
    for (; i < n; i++)
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) tail[t] += w[i] * x[t * xs + i];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t])) + tail[t];
}

QUILL_TOKENS_BY_4(dot_avx2, const float *, dot_nt)

/* ---------------------------------------------------------------- float weights, whole matrices
 *
 * As kernels_avx512.c's (see there), in 8 lanes: a panel of FLOAT_ROWS rows a chunk of columns at
 * a time, converted once to f32, tokens 2 at a time against 2 of its rows (the 16 registers hold 8
 * accumulators, 4 activation and 2 weight vectors), one token straight from memory. Each (row,
 * token) pair gets dot_nt's operations in dot_nt's order: the even and odd 8-column halves of each
 * 16, the last n mod 16 columns summed one by one apart, then hsum256(a + b) + that sum. */
#define FLOAT_ROWS 4
#define FLOAT_CHUNK 512
#define FLOAT_TOKENS 32


static inline __attribute__((always_inline)) __m256 float_weights8(uint32_t type, const uint8_t *row, int64_t i) {
    if (type == QUILL_TYPE_F32) return _mm256_loadu_ps((const float *)row + i);
    const __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    return type == QUILL_TYPE_F16 ? _mm256_cvtph_ps(h) : _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float float_weight(uint32_t type, const uint8_t *row, int64_t i) {
    if (type == QUILL_TYPE_F32) return ((const float *)row)[i];
    uint16_t h;
    memcpy(&h, row + 2 * i, 2);
    return type == QUILL_TYPE_F16 ? half_to_float(h) : quill_bfloat_to_float(h);
}

/* Columns [k0, k0 + n) of a row as f32 into dst; the next two chunks' lines asked for. */
static inline void float_chunk(uint32_t type, const uint8_t *row, int64_t k0, int64_t n, int64_t cols, float *dst) {
    const size_t es = (size_t)float_elem_bytes(type);
    float_prefetch(row + (size_t)(k0 + FLOAT_CHUNK) * es, 2 * FLOAT_CHUNK * es, row + (size_t)cols * es);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_store_ps(dst + i, float_weights8(type, row, k0 + i));
    for (; i < n; i++) dst[i] = float_weight(type, row, k0 + i);
}

/* NT (1 or 2) tokens against rows r0, r0 + 1 of the chunk: `steps` 16-column steps, then (the
 * matrix's last chunk) `tail` columns one by one into tail[t][r]. */
static inline __attribute__((always_inline)) void float_pair_tokens(const float (*wc)[FLOAT_CHUNK], int r0, const float *x,
                                                                    int64_t xs, int64_t steps, int64_t tail,
                                                                    __m256 (*acc)[FLOAT_ROWS][2],
                                                                    float (*tails)[FLOAT_ROWS], const int NT) {
    __m256 a[2][2], b[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) a[t][r] = acc[t][r0 + r][0], b[t][r] = acc[t][r0 + r][1];
    for (int64_t s = 0; s < steps; s++) {
        __m256 x0[2], x1[2];
#pragma GCC unroll 2
        for (int t = 0; t < NT; t++) {
            x0[t] = _mm256_loadu_ps(x + t * xs + 16 * s);
            x1[t] = _mm256_loadu_ps(x + t * xs + 16 * s + 8);
        }
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            const __m256 w0 = _mm256_load_ps(wc[r0 + r] + 16 * s), w1 = _mm256_load_ps(wc[r0 + r] + 16 * s + 8);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                a[t][r] = _mm256_fmadd_ps(w0, x0[t], a[t][r]);
                b[t][r] = _mm256_fmadd_ps(w1, x1[t], b[t][r]);
            }
        }
    }
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            acc[t][r0 + r][0] = a[t][r], acc[t][r0 + r][1] = b[t][r];
            const float *w = wc[r0 + r] + 16 * steps, *xt = x + t * xs + 16 * steps;
            float sum = tails[t][r0 + r];
            for (int64_t i = 0; i < tail; i++) sum += w[i] * xt[i];
            tails[t][r0 + r] = sum;
        }
}

static inline __attribute__((always_inline)) void float_panel_one(const float_job *j, int64_t r0, int nr,
                                                                  const uint32_t type) {
    const uint8_t *row[FLOAT_ROWS];
    for (int r = 0; r < FLOAT_ROWS; r++) row[r] = j->w + (size_t)(r0 + (r < nr ? r : 0)) * j->row_bytes;
    __m256 a[FLOAT_ROWS], b[FLOAT_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < FLOAT_ROWS; r++) a[r] = b[r] = _mm256_setzero_ps();
    const int64_t es = float_elem_bytes(type);
    const uint8_t *next = j->w + (size_t)(r0 + FLOAT_ROWS) * j->row_bytes;
    const uint8_t *end = j->w + (size_t)j->rows * j->row_bytes;
    int64_t i = 0;
    for (; i + 16 <= j->cols; i += 16) {
        const __m256 x0 = _mm256_loadu_ps(j->x + i), x1 = _mm256_loadu_ps(j->x + i + 8);
        float_prefetch(next + (size_t)(FLOAT_ROWS * i * es), (size_t)(FLOAT_ROWS * 16 * es), end);
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) {
            a[r] = _mm256_fmadd_ps(float_weights8(type, row[r], i), x0, a[r]);
            b[r] = _mm256_fmadd_ps(float_weights8(type, row[r], i + 8), x1, b[r]);
        }
    }
    for (int r = 0; r < nr; r++) {
        float tail = 0;
        for (int64_t k = i; k < j->cols; k++) {
            const float w = float_weight(type, row[r], k);
            tail += w * j->x[k];
        }
        j->y[r0 + r] = hsum256(_mm256_add_ps(a[r], b[r])) + tail;
    }
}

/* A few tokens: 2 rows at a time straight from memory against NT (1, 2) tokens of [t0, t0 + NT),
 * the next token pair reading the 2 rows again from L1 (as kernels_avx512.c's float_pair_few). */
#define FLOAT_FEW 16
static inline __attribute__((always_inline)) void float_pair_few(const float_job *j, int64_t r0, int nr, int t0,
                                                                 const uint32_t type, const int NT) {
    const uint8_t *row[2] = {j->w + (size_t)r0 * j->row_bytes, j->w + (size_t)(r0 + (nr > 1)) * j->row_bytes};
    __m256 a[2][2], b[2][2];
#pragma GCC unroll 2
    for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = b[t][0] = b[t][1] = _mm256_setzero_ps();
    const float *x = j->x + (size_t)t0 * (size_t)j->cols;
    const int64_t xs = j->cols, es = float_elem_bytes(type);
    const uint8_t *next = j->w + (size_t)(r0 + 2) * j->row_bytes, *end = j->w + (size_t)j->rows * j->row_bytes;
    int64_t i = 0;
    for (; i + 16 <= j->cols; i += 16) {
        if (t0 == 0) float_prefetch(next + (size_t)(2 * i * es), (size_t)(2 * 16 * es), end);
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            const __m256 w0 = float_weights8(type, row[r], i), w1 = float_weights8(type, row[r], i + 8);
#pragma GCC unroll 2
            for (int t = 0; t < NT; t++) {
                a[t][r] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs + i), a[t][r]);
                b[t][r] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * xs + i + 8), b[t][r]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < nr; r++) {
            float tail = 0;
            for (int64_t k = i; k < j->cols; k++) {
                const float w = float_weight(type, row[r], k);
                tail += w * x[t * xs + k];
            }
            j->y[(size_t)(t0 + t) * (size_t)j->rows + (size_t)(r0 + r)] = hsum256(_mm256_add_ps(a[t][r], b[t][r])) + tail;
        }
}

static inline __attribute__((always_inline)) void float_panels(const float_job *j, int64_t p0, int64_t p1,
                                                               const uint32_t type) {
    if (j->n_tok <= FLOAT_FEW) {
        for (int64_t p = p0; p < p1; p++) {
            const int64_t r0 = p * FLOAT_ROWS;
            const int nr = j->rows - r0 < FLOAT_ROWS ? (int)(j->rows - r0) : FLOAT_ROWS;
            if (j->n_tok == 1) {
                float_panel_one(j, r0, nr, type);
                continue;
            }
            for (int r = 0; r < nr; r += 2)
                for (int t = 0; t < j->n_tok; t += 2) {
                    const int pr = nr - r < 2 ? nr - r : 2;
                    if (j->n_tok - t >= 2) float_pair_few(j, r0 + r, pr, t, type, 2);
                    else float_pair_few(j, r0 + r, pr, t, type, 1);
                }
        }
        return;
    }
    _Alignas(32) float wc[FLOAT_ROWS][FLOAT_CHUNK];
    _Alignas(32) __m256 acc[FLOAT_TOKENS][FLOAT_ROWS][2];
    float tails[FLOAT_TOKENS][FLOAT_ROWS];
    for (int64_t p = p0; p < p1; p++) {
        const int64_t r0 = p * FLOAT_ROWS;
        const int nr = j->rows - r0 < FLOAT_ROWS ? (int)(j->rows - r0) : FLOAT_ROWS;
        for (int tg = 0; tg < j->n_tok; tg += FLOAT_TOKENS) {
            const int ntg = j->n_tok - tg < FLOAT_TOKENS ? j->n_tok - tg : FLOAT_TOKENS;
            for (int t = 0; t < ntg; t++)
                for (int r = 0; r < FLOAT_ROWS; r++) acc[t][r][0] = acc[t][r][1] = _mm256_setzero_ps(), tails[t][r] = 0;
            for (int64_t k0 = 0; k0 < j->cols; k0 += FLOAT_CHUNK) {
                const int64_t n = j->cols - k0 < FLOAT_CHUNK ? j->cols - k0 : FLOAT_CHUNK;
                for (int r = 0; r < FLOAT_ROWS; r++)
                    float_chunk(type, j->w + (size_t)(r0 + (r < nr ? r : 0)) * j->row_bytes, k0, n, j->cols, wc[r]);
                const float *x = j->x + (size_t)tg * (size_t)j->cols + k0;
                const int64_t steps = n / 16, tail = n % 16;
                const float (*w)[FLOAT_CHUNK] = (const float (*)[FLOAT_CHUNK])wc;
                for (int r = 0; r < FLOAT_ROWS; r += 2) {
                    int t = 0;
                    for (; t + 2 <= ntg; t += 2)
                        float_pair_tokens(w, r, x + (size_t)t * (size_t)j->cols, j->cols, steps, tail, acc + t, tails + t, 2);
                    if (t < ntg)
                        float_pair_tokens(w, r, x + (size_t)t * (size_t)j->cols, j->cols, steps, tail, acc + t, tails + t, 1);
                }
            }
            for (int t = 0; t < ntg; t++)
                for (int r = 0; r < nr; r++)
                    j->y[(size_t)(tg + t) * (size_t)j->rows + (size_t)(r0 + r)] =
                        hsum256(_mm256_add_ps(acc[t][r][0], acc[t][r][1])) + tails[t][r];
        }
    }
}

QUILL_FLOAT_PRODUCTS()

static void dequant_f16(const void *src, float *y, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + i))));
    for (; i < n; i++) y[i] = half_to_float(h[i]);
}

static void dequant_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t ib = 0; ib < n / QK8_0; ib++, y += QK8_0) {
        __m256 d = _mm256_set1_ps(half_to_float(b[ib].d));
        for (int k = 0; k < 4; k++) {
            __m128i q = _mm_loadl_epi64((const __m128i *)(b[ib].qs + 8 * k));
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
        }
    }
}

static void dequant_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *b = src;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m256 eight = _mm256_set1_ps(8.0f);
    for (int64_t ib = 0; ib < n / QK4_0; ib++, y += QK4_0) {
        __m256 d = _mm256_set1_ps(half_to_float(b[ib].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[ib].qs);
        __m128i lo = _mm_and_si128(q, low), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low);
        for (int k = 0; k < 2; k++) {
            __m256 l = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), eight);
            __m256 h = _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), eight);
            _mm256_storeu_ps(y + 8 * k, _mm256_mul_ps(l, d));
            _mm256_storeu_ps(y + 16 + 8 * k, _mm256_mul_ps(h, d));
            lo = _mm_srli_si128(lo, 8);
            hi = _mm_srli_si128(hi, 8);
        }
    }
}

static void dequant_bf16(const void *src, float *y, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(h + i)));
        _mm256_storeu_ps(y + i, _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)));
    }
    for (; i < n; i++) y[i] = quill_bfloat_to_float(h[i]);
}

/* The other dequantizers build each group of 16 weights as 16 small integers in bytes (exact
 * either way, so offsets such as q5_0's -16 are applied there), convert them to two vectors of 8
 * floats and scale them with the float operations of the scalar code, in its order. */
static inline __m128i low_nibbles(__m128i q) { return _mm_and_si128(q, _mm_set1_epi8(0x0F)); }
static inline __m128i high_nibbles(__m128i q) { return _mm_and_si128(_mm_srli_epi16(q, 4), _mm_set1_epi8(0x0F)); }

static inline void u8x16_to_ps(__m128i q, __m256 v[2]) {
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(q, 8)));
}

static inline void i8x16_to_ps(__m128i q, __m256 v[2]) {
    v[0] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
    v[1] = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(q, 8)));
}

static inline void store16_mul(float *y, const __m256 v[2], __m256 d) {
    _mm256_storeu_ps(y, _mm256_mul_ps(v[0], d));
    _mm256_storeu_ps(y + 8, _mm256_mul_ps(v[1], d));
}

static inline void store16_mul_add(float *y, const __m256 v[2], __m256 d, __m256 m) {
    _mm256_storeu_ps(y, _mm256_add_ps(_mm256_mul_ps(v[0], d), m));
    _mm256_storeu_ps(y + 8, _mm256_add_ps(_mm256_mul_ps(v[1], d), m));
}

static inline void store16_mul_sub(float *y, const __m256 v[2], __m256 d, __m256 m) {
    _mm256_storeu_ps(y, _mm256_sub_ps(_mm256_mul_ps(d, v[0]), m));
    _mm256_storeu_ps(y + 8, _mm256_sub_ps(_mm256_mul_ps(d, v[1]), m));
}

static void dequant_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t ib = 0; ib < n / QK4_1; ib++, y += QK4_1) {
        __m256 d = _mm256_set1_ps(half_to_float(b[ib].d)), m = _mm256_set1_ps(half_to_float(b[ib].m)), v[2];
        __m128i q = _mm_loadu_si128((const __m128i *)b[ib].qs);
        u8x16_to_ps(low_nibbles(q), v);
        store16_mul_add(y, v, d, m);
        u8x16_to_ps(high_nibbles(q), v);
        store16_mul_add(y + 16, v, d, m);
    }
}

/* 0x10 in byte j where bit j of the low 16 bits of qh is set: the fifth bits of 16 q5_0 / q5_1
 * weights. Byte j gets qh's byte j / 8 with every bit but bit j % 8 set, so it is all ones exactly
 * when that bit is. */
static inline __m128i fifth_bits16(uint32_t qh) {
    const __m128i byte_of_bit = _mm_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128i spread = _mm_shuffle_epi8(_mm_set1_epi32((int)qh), byte_of_bit);
    const __m128i all_but_own = _mm_set1_epi64x(0x7FBFDFEFF7FBFDFE);
    return _mm_and_si128(_mm_cmpeq_epi8(_mm_or_si128(spread, all_but_own), _mm_set1_epi8(-1)), _mm_set1_epi8(0x10));
}

/* Weights 0..15 and 16..31 of a q5_0 / q5_1 block as unsigned 5-bit bytes. */
static inline void q5_unpack(const uint8_t *qs, const uint8_t *qh4, __m128i *lo, __m128i *hi) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    *lo = _mm_or_si128(low_nibbles(q), fifth_bits16(qh));
    *hi = _mm_or_si128(high_nibbles(q), fifth_bits16(qh >> 16));
}

static void dequant_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *b = src;
    const __m128i sixteen = _mm_set1_epi8(16);
    for (int64_t ib = 0; ib < n / QK5_0; ib++, y += QK5_0) {
        __m256 d = _mm256_set1_ps(half_to_float(b[ib].d)), v[2];
        __m128i lo, hi;
        q5_unpack(b[ib].qs, b[ib].qh, &lo, &hi);
        i8x16_to_ps(_mm_sub_epi8(lo, sixteen), v);
        store16_mul(y, v, d);
        i8x16_to_ps(_mm_sub_epi8(hi, sixteen), v);
        store16_mul(y + 16, v, d);
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t ib = 0; ib < n / QK5_1; ib++, y += QK5_1) {
        __m256 d = _mm256_set1_ps(half_to_float(b[ib].d)), m = _mm256_set1_ps(half_to_float(b[ib].m)), v[2];
        __m128i lo, hi;
        q5_unpack(b[ib].qs, b[ib].qh, &lo, &hi);
        u8x16_to_ps(lo, v);
        store16_mul_add(y, v, d, m);
        u8x16_to_ps(hi, v);
        store16_mul_add(y + 16, v, d, m);
    }
}

/* The 4-bit parts of weights 16h .. 16h+15 of sub-block j (0..7) of a q4_K / q5_K super-block:
 * sub-blocks 2i and 2i+1 are the low and high nibbles of the same 32 bytes of qs. */
static inline __m128i k_nibbles16(const uint8_t *qs, int j, int h) {
    __m128i q = _mm_loadu_si128((const __m128i *)(qs + 32 * (j / 2) + 16 * h));
    return j & 1 ? high_nibbles(q) : low_nibbles(q);
}

static void dequant_q4_K(const void *src, float *y, int64_t n) {
    const block_q4_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d), dmin = half_to_float(b[ib].dmin);
        for (int j = 0; j < 8; j++, y += 32) {
            uint8_t sc, m;
            quill_scale_min_k4(j, b[ib].scales, &sc, &m);
            __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(dmin * (float)m), v[2];
            for (int h = 0; h < 2; h++) {
                u8x16_to_ps(k_nibbles16(b[ib].qs, j, h), v);
                store16_mul_sub(y + 16 * h, v, d1, m1);
            }
        }
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t n) {
    const block_q5_K *b = src;
    const __m128i sixteen = _mm_set1_epi8(16);
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d), dmin = half_to_float(b[ib].dmin);
        for (int j = 0; j < 8; j++, y += 32) {
            uint8_t sc, m;
            quill_scale_min_k4(j, b[ib].scales, &sc, &m);
            __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(dmin * (float)m), v[2];
            /* sub-block j's fifth bits are bit j of qh[0..31] */
            const __m128i bit = _mm_set1_epi8((char)(1u << j));
            for (int h = 0; h < 2; h++) {
                __m128i qh = _mm_and_si128(_mm_loadu_si128((const __m128i *)(b[ib].qh + 16 * h)), bit);
                __m128i fifth = _mm_and_si128(_mm_cmpeq_epi8(qh, bit), sixteen);
                u8x16_to_ps(_mm_or_si128(k_nibbles16(b[ib].qs, j, h), fifth), v);
                store16_mul_sub(y + 16 * h, v, d1, m1);
            }
        }
    }
}

/* Weights 32k .. 32k+31 of half hf (0, 1) of a q6_K super-block as four vectors of 8, the AVX2
 * counterpart of quill_q6_K_unpack32 (unpack_avx512.h, which describes the layout). Each 16
 * weights share a signed scale; the -32 offset is applied in bytes. */
static inline __attribute__((always_inline)) void q6_K_unpack32(const block_q6_K *b, float d, int hf, int k,
                                                                __m256 w[4]) {
    const __m128i three = _mm_set1_epi8(3), thirty_two = _mm_set1_epi8(32);
    const uint8_t *ql = b->ql + 64 * hf, *qh = b->qh + 32 * hf;
    const int8_t *sc = b->scales + 8 * hf;
    for (int h = 0; h < 2; h++) {
        __m128i l = _mm_loadu_si128((const __m128i *)(ql + (k & 1) * 32 + 16 * h));
        l = k >= 2 ? high_nibbles(l) : low_nibbles(l);
        __m128i hb = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(qh + 16 * h)), 2 * k), three);
        __m128i q = _mm_sub_epi8(_mm_or_si128(l, _mm_slli_epi16(hb, 4)), thirty_two);
        __m256 v[2];
        i8x16_to_ps(q, v);
        const __m256 dl = _mm256_set1_ps(d * (float)sc[2 * k + h]);
        w[2 * h] = _mm256_mul_ps(dl, v[0]);
        w[2 * h + 1] = _mm256_mul_ps(dl, v[1]);
    }
}

static void dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d);
        for (int hf = 0; hf < 2; hf++)
            for (int k = 0; k < 4; k++, y += 32) {
                __m256 w[4];
                q6_K_unpack32(&b[ib], d, hf, k, w);
                for (int i = 0; i < 4; i++) _mm256_storeu_ps(y + 8 * i, w[i]);
            }
    }
}

static void dequant_q2_K(const void *src, float *y, int64_t n) {
    const block_q2_K *b = src;
    const __m128i three = _mm_set1_epi8(3);
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d), dmin = half_to_float(b[ib].dmin);
        const uint8_t *q = b[ib].qs;
        int is = 0;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int k = 0; k < 2; k++, y += 16) {
                    const uint8_t sc = b[ib].scales[is++];
                    __m256 dl = _mm256_set1_ps(d * (float)(sc & 0xF)), ml = _mm256_set1_ps(dmin * (float)(sc >> 4)), v[2];
                    __m128i q2 = _mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift);
                    u8x16_to_ps(_mm_and_si128(q2, three), v);
                    store16_mul_sub(y, v, dl, ml);
                }
    }
}

static void dequant_q3_K(const void *src, float *y, int64_t n) {
    const block_q3_K *b = src;
    const __m128i three = _mm_set1_epi8(3), four = _mm_set1_epi8(4);
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d_all = half_to_float(b[ib].d);
        const uint8_t *s = b[ib].scales;
        int8_t scales[16];
        quill_q3_K_scales(s, scales);
        const uint8_t *q = b[ib].qs;
        int is = 0;
        unsigned m = 1;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int k = 0; k < 2; k++, y += 16) {
                    __m256 dl = _mm256_set1_ps(d_all * (float)scales[is++]), v[2];
                    __m128i lo = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three);
                    /* a clear hmask bit means the weight sits 4 lower */
                    __m128i hm = _mm_loadu_si128((const __m128i *)(b[ib].hmask + 16 * k));
                    __m128i clear = _mm_cmpeq_epi8(_mm_and_si128(hm, _mm_set1_epi8((char)m)), _mm_setzero_si128());
                    i8x16_to_ps(_mm_sub_epi8(lo, _mm_and_si128(clear, four)), v);
                    store16_mul(y, v, dl);
                }
    }
}

/* The iq4 levels all fit a signed byte, so a byte shuffle looks up 16 of them at once. */
static inline __m128i iq4_levels(__m128i nibbles) {
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)quill_kvalues_iq4nl), nibbles);
}

static void dequant_iq4_nl(const void *src, float *y, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t ib = 0; ib < n / QK4_NL; ib++, y += QK4_NL) {
        __m256 d = _mm256_set1_ps(half_to_float(b[ib].d)), v[2];
        __m128i q = _mm_loadu_si128((const __m128i *)b[ib].qs);
        i8x16_to_ps(iq4_levels(low_nibbles(q)), v);
        store16_mul(y, v, d);
        i8x16_to_ps(iq4_levels(high_nibbles(q)), v);
        store16_mul(y + 16, v, d);
    }
}

static void dequant_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d);
        const uint8_t *qs = b[ib].qs;
        for (int j = 0; j < QK_K / 32; j++, qs += 16, y += 32) {
            const int ls = ((b[ib].scales_l[j / 2] >> 4 * (j % 2)) & 0xF) | ((b[ib].scales_h >> 2 * j) & 3) << 4;
            __m256 dl = _mm256_set1_ps(d * (float)(ls - 32)), v[2];
            __m128i q = _mm_loadu_si128((const __m128i *)qs);
            i8x16_to_ps(iq4_levels(low_nibbles(q)), v);
            store16_mul(y, v, dl);
            i8x16_to_ps(iq4_levels(high_nibbles(q)), v);
            store16_mul(y + 16, v, dl);
        }
    }
}

/* Fused products straight from q4_0 / q8_0 / q4_K / q6_K rows: each 16-element chunk is unpacked
 * into two registers exactly as the dequantizers above produce it and accumulated as dot_nt does,
 * so the results are bit-identical to dequantize + dot. */
static inline __attribute__((always_inline)) void acc16(__m256 w0, __m256 w1, const float *x, int64_t xs,
                                                        __m256 *a, __m256 *b, int NT) {
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        a[t] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + t * xs), a[t]);
        b[t] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(x + t * xs + 8), b[t]);
    }
}

static inline __attribute__((always_inline)) void q4_0_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q4_0 *bl = row;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m256 eight = _mm256_set1_ps(8.0f);
    __m256 a[4], b[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK4_0; ib++) {
        __m256 d = _mm256_set1_ps(half_to_float(bl[ib].d));
        __m128i q = _mm_loadu_si128((const __m128i *)bl[ib].qs);
        __m128i nib[2] = {_mm_and_si128(q, low), _mm_and_si128(_mm_srli_epi16(q, 4), low)};
        for (int h = 0; h < 2; h++) {
            __m256 w0 = _mm256_mul_ps(_mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(nib[h])), eight), d);
            __m256 w1 = _mm256_mul_ps(
                _mm256_sub_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(nib[h], 8))), eight), d);
            acc16(w0, w1, x + ib * QK4_0 + 16 * h, xs, a, b, NT);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t]));
}

static inline __attribute__((always_inline)) void q8_0_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q8_0 *bl = row;
    __m256 a[4], b[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        __m256 d = _mm256_set1_ps(half_to_float(bl[ib].d));
        for (int h = 0; h < 2; h++) {
            __m128i q0 = _mm_loadl_epi64((const __m128i *)(bl[ib].qs + 16 * h));
            __m128i q1 = _mm_loadl_epi64((const __m128i *)(bl[ib].qs + 16 * h + 8));
            __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q0)), d);
            __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q1)), d);
            acc16(w0, w1, x + ib * QK8_0 + 16 * h, xs, a, b, NT);
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t]));
}

static inline __attribute__((always_inline)) void q4_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q4_K *bl = row;
    __m256 a[4], b[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(bl[ib].d), dmin = half_to_float(bl[ib].dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quill_scale_min_k4(j, bl[ib].scales, &sc, &m);
            __m256 d1 = _mm256_set1_ps(d * (float)sc), m1 = _mm256_set1_ps(dmin * (float)m), v[2];
            for (int h = 0; h < 2; h++) {
                u8x16_to_ps(k_nibbles16(bl[ib].qs, j, h), v);
                /* d1·q is exact (6+11+4 bits), so fusing the subtraction rounds as the dequantizer does */
                __m256 w0 = _mm256_fmsub_ps(d1, v[0], m1), w1 = _mm256_fmsub_ps(d1, v[1], m1);
                acc16(w0, w1, x + ib * QK_K + 32 * j + 16 * h, xs, a, b, NT);
            }
        }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t]));
}

static inline __attribute__((always_inline)) void q6_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q6_K *bl = row;
    __m256 a[4], b[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(bl[ib].d);
        for (int hf = 0; hf < 2; hf++)
            for (int k = 0; k < 4; k++) {
                __m256 w[4];
                q6_K_unpack32(&bl[ib], d, hf, k, w);
                const float *xc = x + ib * QK_K + 128 * hf + 32 * k;
                acc16(w[0], w[1], xc, xs, a, b, NT);
                acc16(w[2], w[3], xc + 16, xs, a, b, NT);
            }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t]));
}

/* q2_K: each sub-block of 16 has its own scale and min (d·sc·q is exact, so the multiply then
 * subtract rounds as the dequantizer's) */
static inline __attribute__((always_inline)) void q2_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q2_K *bl = row;
    const __m128i three = _mm_set1_epi8(3);
    __m256 a[4], b[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(bl[ib].d), dmin = half_to_float(bl[ib].dmin);
        const uint8_t *q = bl[ib].qs, *sc = bl[ib].scales;
        const float *xb = x + ib * QK_K;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2)
                for (int k = 0; k < 2; k++, sc++, xb += 16) {
                    __m256 dl = _mm256_set1_ps(d * (float)(*sc & 0xF)), ml = _mm256_set1_ps(dmin * (float)(*sc >> 4)), v[2];
                    u8x16_to_ps(_mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three), v);
                    acc16(_mm256_sub_ps(_mm256_mul_ps(dl, v[0]), ml), _mm256_sub_ps(_mm256_mul_ps(dl, v[1]), ml), xb, xs,
                          a, b, NT);
                }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t]));
}

/* q3_K: sub-blocks of 16, each weight 4 lower where its hmask bit is clear */
static inline __attribute__((always_inline)) void q3_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q3_K *bl = row;
    const __m128i three = _mm_set1_epi8(3), four = _mm_set1_epi8(4);
    __m256 a[4], b[4];
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d_all = half_to_float(bl[ib].d);
        int8_t scales[16];
        quill_q3_K_scales(bl[ib].scales, scales);
        const uint8_t *q = bl[ib].qs;
        const float *xb = x + ib * QK_K;
        int is = 0;
        unsigned m = 1;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1)
                for (int k = 0; k < 2; k++, xb += 16) {
                    __m256 dl = _mm256_set1_ps(d_all * (float)scales[is++]), v[2];
                    __m128i lo = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three);
                    __m128i hm = _mm_loadu_si128((const __m128i *)(bl[ib].hmask + 16 * k));
                    __m128i clear = _mm_cmpeq_epi8(_mm_and_si128(hm, _mm_set1_epi8((char)m)), _mm_setzero_si128());
                    i8x16_to_ps(_mm_sub_epi8(lo, _mm_and_si128(clear, four)), v);
                    acc16(_mm256_mul_ps(v[0], dl), _mm256_mul_ps(v[1], dl), xb, xs, a, b, NT);
                }
    }
    #pragma GCC unroll 4
    for (int t = 0; t < NT; t++) out[t * os] = hsum256(_mm256_add_ps(a[t], b[t]));
}

/* QUILL_TOKENS_BY_4 (dot_tokens.h) but with the pointers advanced before the remainder, the form
 * these products have always had: the two forms compile to different code. */
#define FUSED_DISPATCH(name, impl)                                                                  \
    static void name(const void *row, const float *x, int64_t n, int n_tok, int64_t xs, float *out,  \
                     int64_t os) {                                                                  \
        int t = 0;                                                                                  \
        for (; t + 4 <= n_tok; t += 4) impl(row, x + t * xs, n, xs, out + t * os, os, 4);           \
        x += t * xs;                                                                                \
        out += t * os;                                                                              \
        switch (n_tok - t) {                                                                        \
        case 3: impl(row, x, n, xs, out, os, 3); break;                                             \
        case 2: impl(row, x, n, xs, out, os, 2); break;                                             \
        case 1: impl(row, x, n, xs, out, os, 1); break;                                             \
        default: break;                                                                             \
        }                                                                                           \
    }

FUSED_DISPATCH(vec_dot_q4_0, q4_0_nt)
FUSED_DISPATCH(vec_dot_q8_0, q8_0_nt)
FUSED_DISPATCH(vec_dot_q4_K, q4_K_nt)
FUSED_DISPATCH(vec_dot_q6_K, q6_K_nt)
FUSED_DISPATCH(vec_dot_q2_K, q2_K_nt)
FUSED_DISPATCH(vec_dot_q3_K, q3_K_nt)

/* hb heads (up to 4) × 16 dims at a time (2·hb accumulators): each row's 16 values are loaded
 * once for the hb heads, where a head at a time loaded them once per head. */
static inline __attribute__((always_inline)) void weighted_x16(const int hb, const float *wgt, int64_t wgt_stride,
                                                               const float *v, int n_rows, int64_t stride, float *out,
                                                               int64_t out_stride, bool accumulate) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < 2 * hb; i++)
        acc[i] = accumulate ? _mm256_loadu_ps(out + (i / 2) * out_stride + 8 * (i % 2)) : _mm256_setzero_ps();
    for (int p = 0; p < n_rows; p++) {
        const float *vp = v + p * stride;
        const __m256 v0 = _mm256_loadu_ps(vp), v1 = _mm256_loadu_ps(vp + 8);
#pragma GCC unroll 4
        for (int h = 0; h < hb; h++) {
            const __m256 w = _mm256_set1_ps(wgt[h * wgt_stride + p]);
            acc[2 * h] = _mm256_fmadd_ps(w, v0, acc[2 * h]);
            acc[2 * h + 1] = _mm256_fmadd_ps(w, v1, acc[2 * h + 1]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++) {
        _mm256_storeu_ps(out + h * out_stride, acc[2 * h]);
        _mm256_storeu_ps(out + h * out_stride + 8, acc[2 * h + 1]);
    }
}

/* hb heads (up to 4) of 8 dims: one accumulator each, in registers (the general loop's array of
 * run-time length sat in memory, each row waiting on a store's forwarding). */
static inline __attribute__((always_inline)) void weighted_x8(const int hb, const float *wgt, int64_t wgt_stride,
                                                              const float *v, int n_rows, int64_t stride, float *out,
                                                              int64_t out_stride, bool accumulate) {
    __m256 acc[4];
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++) acc[h] = accumulate ? _mm256_loadu_ps(out + h * out_stride) : _mm256_setzero_ps();
    for (int p = 0; p < n_rows; p++) {
        const __m256 vp = _mm256_loadu_ps(v + p * stride);
#pragma GCC unroll 4
        for (int h = 0; h < hb; h++) acc[h] = _mm256_fmadd_ps(_mm256_set1_ps(wgt[h * wgt_stride + p]), vp, acc[h]);
    }
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++) _mm256_storeu_ps(out + h * out_stride, acc[h]);
}

/* Every output is one chain of fused multiply-adds over the rows in order, as in the scalar
 * version, however heads and dims are grouped. */
static void weighted_sum_avx2(const float *wgt, int64_t wgt_stride, int n_heads, const float *v, int n_rows,
                              int64_t stride, int64_t n, float *out, int64_t out_stride, bool accumulate) {
    if (n % 8) {
        quill_weighted_sum_scalar(wgt, wgt_stride, n_heads, v, n_rows, stride, n, out, out_stride, accumulate);
        return;
    }
    /* wider heads (Qwen 3.5's gated attention: 256) a block of 128 columns at a time: each column
     * is its own chain, so the bits are those of one pass */
    if (n > 128) {
        for (int64_t d = 0; d < n; d += 128)
            weighted_sum_avx2(wgt, wgt_stride, n_heads, v + d, n_rows, stride, n - d < 128 ? n - d : 128, out + d, out_stride,
                      accumulate);
        return;
    }
    int h = 0;
    if (n % 16 == 0) {
        for (; h + 4 <= n_heads; h += 4)
            for (int64_t d = 0; d < n; d += 16)
                weighted_x16(4, wgt + h * wgt_stride, wgt_stride, v + d, n_rows, stride, out + h * out_stride + d,
                             out_stride, accumulate);
        /* two or three heads left (a group of 6 or 7, as Qwen2's) together; one goes below */
        const int left = n_heads - h;
        if (left == 2 || left == 3) {
            const float *wh = wgt + h * wgt_stride;
            float *oh = out + h * out_stride;
            for (int64_t d = 0; d < n; d += 16) {
                if (left == 3) weighted_x16(3, wh, wgt_stride, v + d, n_rows, stride, oh + d, out_stride, accumulate);
                else weighted_x16(2, wh, wgt_stride, v + d, n_rows, stride, oh + d, out_stride, accumulate);
            }
            h = n_heads;
        }
    }
    if (n == 8) { /* stories260K's heads: 4 at a time, their chains in registers (see weighted_x8) */
        for (; h + 4 <= n_heads; h += 4)
            weighted_x8(4, wgt + h * wgt_stride, wgt_stride, v, n_rows, stride, out + h * out_stride, out_stride, accumulate);
        const float *wh = wgt + h * wgt_stride;
        float *oh = out + h * out_stride;
        switch (n_heads - h) {
        case 3: weighted_x8(3, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        case 2: weighted_x8(2, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        case 1: weighted_x8(1, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        default: break;
        }
        return;
    }
    const int nv = (int)(n / 8);
    for (; h < n_heads; h++) {
        __m256 acc[16];
        for (int i = 0; i < nv; i++) acc[i] = accumulate ? _mm256_loadu_ps(out + h * out_stride + 8 * i) : _mm256_setzero_ps();
        for (int p = 0; p < n_rows; p++) {
            const __m256 w = _mm256_set1_ps(wgt[h * wgt_stride + p]);
            const float *vp = v + p * stride;
            for (int i = 0; i < nv; i++) acc[i] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp + 8 * i), acc[i]);
        }
        for (int i = 0; i < nv; i++) _mm256_storeu_ps(out + h * out_stride + 8 * i, acc[i]);
    }
}

/* hb heads × nv vectors of 8 columns at a time (nv·hb accumulators, each lane a chain of fused
 * multiply-adds in d order): a row's keys are loaded once for the hb heads. With `tail`, the last
 * vector takes the lanes of `last` only (a generation step's part-filled last block of keys: one
 * head and one vector at a time, its chains ran one after another). */
static inline __attribute__((always_inline)) void columns_heads(const int hb, const int nv, const bool tail,
                                                                __m256i last, const float *q, int64_t q_stride,
                                                                const float *kt, int64_t n, int64_t stride, int p,
                                                                float *out, int64_t out_stride) {
    __m256 acc[8];
#pragma GCC unroll 8
    for (int i = 0; i < nv * hb; i++) acc[i] = _mm256_setzero_ps();
    for (int64_t d = 0; d < n; d++) {
        const float *row = kt + d * stride + p;
        /* two rows on (see kernels_avx512.c) */
        _mm_prefetch((const char *)(row + 128), _MM_HINT_T0);
        __m256 k[2];
#pragma GCC unroll 2
        for (int i = 0; i < nv; i++)
            k[i] = tail && i == nv - 1 ? _mm256_maskload_ps(row + 8 * i, last) : _mm256_loadu_ps(row + 8 * i);
#pragma GCC unroll 4
        for (int h = 0; h < hb; h++) {
            const __m256 qd = _mm256_set1_ps(q[h * q_stride + d]);
#pragma GCC unroll 2
            for (int i = 0; i < nv; i++) acc[nv * h + i] = _mm256_fmadd_ps(qd, k[i], acc[nv * h + i]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++)
#pragma GCC unroll 2
        for (int i = 0; i < nv; i++) {
            float *o = out + h * out_stride + p + 8 * i;
            if (tail && i == nv - 1) _mm256_maskstore_ps(o, last, acc[nv * h + i]);
            else _mm256_storeu_ps(o, acc[nv * h + i]);
        }
}

QUILL_COLUMN_VECTORS(__m256i, columns_heads)

static void dot_columns_avx2(const float *q, int64_t q_stride, int n_heads, const float *kt, int64_t n,
                             int64_t stride, int n_cols, float *out, int64_t out_stride) {
    int p = 0;
    for (; p + 16 <= n_cols; p += 16)
        column_vectors(2, false, _mm256_setzero_si256(), q, q_stride, n_heads, kt, n, stride, p, out, out_stride);
    const int left = n_cols - p;
    if (left == 0) return;
    /* lane i is on when i < the last vector's columns (1..8) */
    const __m256i last = _mm256_cmpgt_epi32(_mm256_set1_epi32((left - 1) % 8 + 1), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    if (left > 8) column_vectors(2, true, last, q, q_stride, n_heads, kt, n, stride, p, out, out_stride);
    else column_vectors(1, true, last, q, q_stride, n_heads, kt, n, stride, p, out, out_stride);
}

/* exp_poly on 8 lanes, operation for operation (2^n built in the exponent bits: for the n that
 * reach the product, -126 <= n <= 127, it is the exact power, so the product rounds as ldexpf). */
static inline __m256 exp8(__m256 x) {
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_HI), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(EXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_P0), r, _mm256_set1_ps(EXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P5));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    __m256 e = _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
    e = _mm256_blendv_ps(e, _mm256_setzero_ps(), _mm256_cmp_ps(x, _mm256_set1_ps(EXP_MIN_ARG), _CMP_LT_OQ));
    e = _mm256_blendv_ps(e, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_GT_OQ));
    return _mm256_blendv_ps(e, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

/* Lanes [p, p + 8) of x that exist, for maskload / maskstore. */
static inline __m256i lanes_from(int p, int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n - p), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Sixteen partial sums as two vectors: lo holds p mod 16 = 0..7, hi 8..15. */
static void softmax_avx2(float *x, int n, float s) {
    __m256 vmax = _mm256_set1_ps(-INFINITY);
    const __m256 vs = _mm256_set1_ps(s);
    for (int p = 0; p < n; p += 8) {
        const __m256i m = lanes_from(p, n);
        const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + p, m), vs);
        _mm256_maskstore_ps(x + p, m, v);
        vmax = _mm256_blendv_ps(vmax, _mm256_max_ps(vmax, v), _mm256_castsi256_ps(m));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
    const __m256 max = _mm256_set1_ps(_mm_cvtss_f32(m4));
    __m256 part[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int p = 0; p < n; p += 8) {
        const __m256i m = lanes_from(p, n);
        const __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(x + p, m), max)), _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(x + p, m, e);
        part[(p / 8) % 2] = _mm256_add_ps(part[(p / 8) % 2], e);
    }
    __m256 s8 = _mm256_add_ps(part[0], part[1]);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    const __m256 inv = _mm256_set1_ps(1.0f / _mm_cvtss_f32(s1));
    for (int p = 0; p < n; p += 8) {
        const __m256i m = lanes_from(p, n);
        _mm256_maskstore_ps(x + p, m, _mm256_mul_ps(_mm256_maskload_ps(x + p, m), inv));
    }
}

static void swiglu_avx2(float *gate, const float *up, int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 8) {
        const __m256i m = lanes_from(0, n - i < 8 ? (int)(n - i) : 8);
        const __m256 g = _mm256_maskload_ps(gate + i, m), u = _mm256_maskload_ps(up + i, m);
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp8(_mm256_xor_ps(g, sign))));
        _mm256_maskstore_ps(gate + i, m, _mm256_mul_ps(s, u));
    }
}

/* The KV cache's key blocks (kernels.h): 8 positions per vector, the codes widened to f32 and
 * multiplied by their positions' scales, as the scalar decoder does. */
static void key_block_q8_0_avx2(const uint8_t *block, int64_t hd, float *tile) {
    const int8_t *codes = (const int8_t *)block;
    const uint16_t *scales = (const uint16_t *)(block + (size_t)hd * QUILL_KEY_BLOCK);
    for (int64_t g = 0; g < hd / 32; g++) {
        __m256 s[8];
        for (int i = 0; i < 8; i++) s[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + g * QUILL_KEY_BLOCK + 8 * i)));
        for (int64_t d = g * 32; d < g * 32 + 32; d++)
            for (int i = 0; i < 8; i++) {
                const __m128i q = _mm_loadl_epi64((const __m128i *)(codes + d * QUILL_KEY_BLOCK + 8 * i));
                _mm256_storeu_ps(tile + d * QUILL_KEY_BLOCK + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), s[i]));
            }
    }
}

static void key_block_q4_0_avx2(const uint8_t *block, int64_t hd, float *tile) {
    const uint16_t *scales = (const uint16_t *)(block + (size_t)hd / 2 * QUILL_KEY_BLOCK);
    const __m256i low = _mm256_set1_epi32(0xF), eight = _mm256_set1_epi32(8);
    for (int64_t g = 0; g < hd / 32; g++) {
        __m256 s[8];
        for (int i = 0; i < 8; i++) s[i] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(scales + g * QUILL_KEY_BLOCK + 8 * i)));
        for (int64_t d = g * 32; d < g * 32 + 32; d += 2)
            for (int i = 0; i < 8; i++) {
                const __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(block + d / 2 * QUILL_KEY_BLOCK + 8 * i)));
                const __m256i lo = _mm256_sub_epi32(_mm256_and_si256(b, low), eight);
                const __m256i hi = _mm256_sub_epi32(_mm256_srli_epi32(b, 4), eight);
                _mm256_storeu_ps(tile + d * QUILL_KEY_BLOCK + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(lo), s[i]));
                _mm256_storeu_ps(tile + (d + 1) * QUILL_KEY_BLOCK + 8 * i, _mm256_mul_ps(_mm256_cvtepi32_ps(hi), s[i]));
            }
    }
}

/* kernels.h's dot_f64: a row's partial sums i mod 8 as two vectors of four doubles, rows in fours
 * (eight chains of fused multiply-adds in flight: one row's two would wait on their latency). */
static inline __attribute__((always_inline)) void rows_f64_avx2(const float *w, int64_t w_stride, const int nr,
                                                                const float *x, int64_t n, double *out) {
    const int64_t whole = n / 8 * 8;
    __m256d lo[4], hi[4];
    for (int j = 0; j < nr; j++) lo[j] = hi[j] = _mm256_setzero_pd();
    for (int64_t i = 0; i < whole; i += 8) {
        const __m256d xl = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), xh = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        for (int j = 0; j < nr; j++) {
            lo[j] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + j * w_stride + i)), xl, lo[j]);
            hi[j] = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + j * w_stride + i + 4)), xh, hi[j]);
        }
    }
    for (int j = 0; j < nr; j++) {
        double part[8];
        _mm256_storeu_pd(part, lo[j]);
        _mm256_storeu_pd(part + 4, hi[j]);
        out[j] = quill_dot_f64_finish(part, w + j * w_stride, x, whole, n);
    }
}

static void dot_f64_avx2(const float *w, int64_t w_stride, int rows, const float *x, int64_t n, double *out) {
    for (int r = 0; r < rows; r += 4)
        if (rows - r >= 4) rows_f64_avx2(w + r * w_stride, w_stride, 4, x, n, out + r);
        else for (int j = r; j < rows; j++) rows_f64_avx2(w + j * w_stride, w_stride, 1, x, n, out + j);
}

void quill_kernels_install_avx2(quill_kernels *k) {
    QUILL_INSTALL_SIMD(k, avx2);
    QUILL_INSTALL_FLOAT_PRODUCTS(k);
}
#endif
