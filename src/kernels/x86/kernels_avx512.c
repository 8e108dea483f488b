/* AVX-512 kernels. Dequantizers perform the same float operations as the scalar to_float
 * functions (multiply, then subtract; never fused), so their output is bit-identical. */
#include "kernels/x86/kernels_simd.h"
#include "kernels/x86/float_products.h"
#include "base/exp_poly.h"
#include "tensor/types_internal.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/x86/unpack_avx512.h"
#include "kernels/dot_tokens.h"

/* The F16C instruction converts a half exactly, like quill_half_to_float, without its branches. */
static inline float half_to_float(uint16_t h) { return _cvtsh_ss(h); }

/* Dot products of one weight row with NT token rows; NT is a compile-time constant at every call
 * site so the accumulators stay in registers. Each token owns two accumulators (even and odd
 * 16-lane halves of each 32-element chunk) updated in the same order for any NT: the result of a
 * (row, token) pair never depends on which other tokens share the call. */
static inline __attribute__((always_inline)) void dot_nt(const float *w, const float *x, int64_t n,
                                                         int64_t xs, float *out, int64_t os, int NT) {
    __m512 a[4], b[4];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512 w0 = _mm512_loadu_ps(w + i), w1 = _mm512_loadu_ps(w + i + 16);
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            a[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * xs + i), a[t]);
            b[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * xs + i + 16), b[t]);
        }
    }
    if (i < n) {
        int64_t rest = n - i;
        __mmask16 m0 = rest >= 16 ? 0xFFFF : (__mmask16)((1u << rest) - 1);
        __mmask16 m1 = rest <= 16 ? 0 : (__mmask16)((1u << (rest - 16)) - 1);
        __m512 w0 = _mm512_maskz_loadu_ps(m0, w + i), w1 = _mm512_maskz_loadu_ps(m1, w + i + 16);
        #pragma GCC unroll 8
        for (int t = 0; t < NT; t++) {
            a[t] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, x + t * xs + i), a[t]);
            b[t] = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, x + t * xs + i + 16), b[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) out[t * os] = _mm512_reduce_add_ps(_mm512_add_ps(a[t], b[t]));
}

QUILL_TOKENS_BY_4(dot_avx512, const float *, dot_nt)

/* ---------------------------------------------------------------- float weights, whole matrices
 *
 * f32, f16 and bf16 matrices, row by row, were dequantized a row at a time and dotted with the
 * tokens up to 4 at a time: 2 accumulators per token, so one token's product was two chains of
 * fused multiply-adds waiting on each other (latency-bound at about a quarter of the FMA unit),
 * and a batch read each weight once per 4 tokens. Here a panel of FLOAT_ROWS rows goes through
 * the columns a chunk at a time, converted once to f32 in L1, and every token of the call is
 * multiplied with it 2 at a time (16 chains); its sums wait in a small array between chunks.
 * Each (row, token) accumulator receives the same fused multiply-adds in the same order as
 * dot_nt's (the same even and odd 16-column halves of each 32, the same masked tail, the same
 * final reduction), and storing an accumulator between chunks is exact: the bits are those of
 * dequantize + dot, whatever the batch, the thread count or the other matrices of the call. */
#define FLOAT_ROWS 4
#define FLOAT_CHUNK 512 /* columns converted at a time: 4 rows x 2 KiB */
#define FLOAT_TOKENS 36 /* tokens whose sums a panel keeps at a time (6 passes of FLOAT_NT) */


/* Columns [k0, k0 + n) of a row as f32 into dst, zero beyond n up to a multiple of 32. The next
 * two chunks' lines are asked for: a panel reads its rows a chunk at a time, 4 short runs that the
 * hardware prefetchers did not follow (one token's product waited on memory for 82 % of its time). */
static inline void float_chunk(uint32_t type, const uint8_t *row, int64_t k0, int64_t n, int64_t cols, float *dst) {
    const size_t es = (size_t)float_elem_bytes(type);
    float_prefetch(row + (size_t)(k0 + FLOAT_CHUNK) * es, 2 * FLOAT_CHUNK * es, row + (size_t)cols * es);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        __m512 v;
        if (type == QUILL_TYPE_F32) v = _mm512_maskz_loadu_ps(m, (const float *)row + k0 + i);
        else {
            const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + k0 + i);
            v = type == QUILL_TYPE_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
        }
        _mm512_store_ps(dst + i, v);
    }
    for (int64_t i = (n + 15) / 16 * 16; i < (n + 31) / 32 * 32; i += 16) _mm512_store_ps(dst + i, _mm512_setzero_ps());
}

/* NT (1..FLOAT_NT) tokens against the panel's chunk, one half of every 32 columns (parity 0: the
 * first 16, dot_nt's `a`; 1: the last 16, its `b`): `steps` whole 32-column steps, then the tail
 * of `tail` columns, masked as dot_nt masks it. A half's chains are independent of the other
 * half's, so the halves take turns: one register per (row, token) instead of two, and 4 x 6 of
 * them share each weight and activation load. acc[t][r][parity]: the pair's accumulator. */
#define FLOAT_NT 6
static inline __attribute__((always_inline)) void float_panel_tokens(const float (*wc)[FLOAT_CHUNK], const float *x,
                                                                     int64_t xs, int64_t steps, int64_t tail,
                                                                     __m512 (*acc)[FLOAT_ROWS][2], const int parity,
                                                                     const int NT) {
    __m512 a[FLOAT_NT][FLOAT_ROWS];
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) a[t][r] = acc[t][r][parity];
    const int64_t half = 16 * parity;
    for (int64_t s = 0; s < steps; s++) {
        __m512 w[FLOAT_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) w[r] = _mm512_load_ps(wc[r] + 32 * s + half);
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            const __m512 xt = _mm512_loadu_ps(x + t * xs + 32 * s + half);
#pragma GCC unroll 4
            for (int r = 0; r < FLOAT_ROWS; r++) a[t][r] = _mm512_fmadd_ps(w[r], xt, a[t][r]);
        }
    }
    if (tail) {
        const int64_t rest = tail - half;
        const __mmask16 m = rest >= 16 ? 0xFFFF : rest <= 0 ? 0 : (__mmask16)((1u << rest) - 1);
        const int64_t i = 32 * steps + half;
        __m512 w[FLOAT_ROWS];
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) w[r] = _mm512_load_ps(wc[r] + i);
#pragma GCC unroll 6
        for (int t = 0; t < NT; t++) {
            const __m512 xt = _mm512_maskz_loadu_ps(m, x + t * xs + i);
#pragma GCC unroll 4
            for (int r = 0; r < FLOAT_ROWS; r++) a[t][r] = _mm512_fmadd_ps(w[r], xt, a[t][r]);
        }
    }
#pragma GCC unroll 6
    for (int t = 0; t < NT; t++)
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) acc[t][r][parity] = a[t][r];
}

/* 16 weights of a row from column i as f32, lanes off in m read as zero. */
static inline __attribute__((always_inline)) __m512 float_weights(uint32_t type, const uint8_t *row, int64_t i,
                                                                  __mmask16 m) {
    if (type == QUILL_TYPE_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    const __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    return type == QUILL_TYPE_F16 ? _mm512_cvtph_ps(h) : _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* One token: the panel's rows straight from memory, converted in registers, each row one stream
 * read front to back (the chunks above, made for reuse across tokens, only cost a token alone). */
static inline __attribute__((always_inline)) void float_panel_one(const float_job *j, int64_t r0, int nr,
                                                                  const uint32_t type) {
    const uint8_t *row[FLOAT_ROWS];
    for (int r = 0; r < FLOAT_ROWS; r++) row[r] = j->w + (size_t)(r0 + (r < nr ? r : 0)) * j->row_bytes;
    __m512 a[FLOAT_ROWS], b[FLOAT_ROWS];
#pragma GCC unroll 4
    for (int r = 0; r < FLOAT_ROWS; r++) a[r] = b[r] = _mm512_setzero_ps();
    int64_t i = 0;
    /* the rows are 4 runs of a few KiB each, too short for the hardware prefetchers: the next
     * panel's rows (the bytes that follow, as a matrix's rows do) are fetched as one run, at the
     * pace this panel reads */
    const int64_t es = float_elem_bytes(type);
    const uint8_t *next = j->w + (size_t)(r0 + FLOAT_ROWS) * j->row_bytes;
    const uint8_t *end = j->w + (size_t)j->rows * j->row_bytes;
    for (; i + 32 <= j->cols; i += 32) {
        const __m512 x0 = _mm512_loadu_ps(j->x + i), x1 = _mm512_loadu_ps(j->x + i + 16);
        float_prefetch(next + (size_t)(FLOAT_ROWS * i * es), (size_t)(FLOAT_ROWS * 32 * es), end);
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) {
            a[r] = _mm512_fmadd_ps(float_weights(type, row[r], i, 0xFFFF), x0, a[r]);
            b[r] = _mm512_fmadd_ps(float_weights(type, row[r], i + 16, 0xFFFF), x1, b[r]);
        }
    }
    if (i < j->cols) {
        const int64_t rest = j->cols - i;
        const __mmask16 m0 = rest >= 16 ? 0xFFFF : (__mmask16)((1u << rest) - 1);
        const __mmask16 m1 = rest <= 16 ? 0 : (__mmask16)((1u << (rest - 16)) - 1);
        const __m512 x0 = _mm512_maskz_loadu_ps(m0, j->x + i), x1 = _mm512_maskz_loadu_ps(m1, j->x + i + 16);
#pragma GCC unroll 4
        for (int r = 0; r < FLOAT_ROWS; r++) {
            a[r] = _mm512_fmadd_ps(float_weights(type, row[r], i, m0), x0, a[r]);
            b[r] = _mm512_fmadd_ps(float_weights(type, row[r], i + 16, m1), x1, b[r]);
        }
    }
    for (int r = 0; r < nr; r++) j->y[r0 + r] = _mm512_reduce_add_ps(_mm512_add_ps(a[r], b[r]));
}

/* A few tokens (a server's step, a speculative draft being checked): 2 rows at a time straight
 * from memory, NT (1..4) tokens of [t0, t0 + NT) against them, both halves at once (4 x NT
 * accumulators); the next token group reads the 2 rows again from L1. Converting each chunk once
 * for the panel, as prompts do, cost 2 tokens as much as 2 tokens alone. */
#define FLOAT_FEW 16
static inline __attribute__((always_inline)) void float_pair_few(const float_job *j, int64_t r0, int nr, int t0,
                                                                 const uint32_t type, const int NT) {
    const uint8_t *row[2] = {j->w + (size_t)r0 * j->row_bytes, j->w + (size_t)(r0 + (nr > 1)) * j->row_bytes};
    __m512 a[4][2], b[4][2];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = b[t][0] = b[t][1] = _mm512_setzero_ps();
    const float *x = j->x + (size_t)t0 * (size_t)j->cols;
    const int64_t xs = j->cols, es = float_elem_bytes(type);
    /* the next pair's rows follow these: fetched as one run at the pace these are read */
    const uint8_t *next = j->w + (size_t)(r0 + 2) * j->row_bytes, *end = j->w + (size_t)j->rows * j->row_bytes;
    int64_t i = 0;
    for (; i + 32 <= j->cols; i += 32) {
        if (t0 == 0) float_prefetch(next + (size_t)(2 * i * es), (size_t)(2 * 32 * es), end);
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            const __m512 w0 = float_weights(type, row[r], i, 0xFFFF), w1 = float_weights(type, row[r], i + 16, 0xFFFF);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                a[t][r] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * xs + i), a[t][r]);
                b[t][r] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * xs + i + 16), b[t][r]);
            }
        }
    }
    if (i < j->cols) {
        const int64_t rest = j->cols - i;
        const __mmask16 m0 = rest >= 16 ? 0xFFFF : (__mmask16)((1u << rest) - 1);
        const __mmask16 m1 = rest <= 16 ? 0 : (__mmask16)((1u << (rest - 16)) - 1);
#pragma GCC unroll 2
        for (int r = 0; r < 2; r++) {
            const __m512 w0 = float_weights(type, row[r], i, m0), w1 = float_weights(type, row[r], i + 16, m1);
#pragma GCC unroll 4
            for (int t = 0; t < NT; t++) {
                a[t][r] = _mm512_fmadd_ps(w0, _mm512_maskz_loadu_ps(m0, x + t * xs + i), a[t][r]);
                b[t][r] = _mm512_fmadd_ps(w1, _mm512_maskz_loadu_ps(m1, x + t * xs + i + 16), b[t][r]);
            }
        }
    }
    for (int t = 0; t < NT; t++)
        for (int r = 0; r < nr; r++)
            j->y[(size_t)(t0 + t) * (size_t)j->rows + (size_t)(r0 + r)] = _mm512_reduce_add_ps(_mm512_add_ps(a[t][r], b[t][r]));
}

static inline __attribute__((always_inline)) void float_panel_few(const float_job *j, int64_t r0, int nr,
                                                                  const uint32_t type) {
    for (int r = 0; r < nr; r += 2)
        for (int t = 0; t < j->n_tok; t += 4) switch (j->n_tok - t < 4 ? j->n_tok - t : 4) {
            case 4: float_pair_few(j, r0 + r, nr - r < 2 ? nr - r : 2, t, type, 4); break;
            case 3: float_pair_few(j, r0 + r, nr - r < 2 ? nr - r : 2, t, type, 3); break;
            case 2: float_pair_few(j, r0 + r, nr - r < 2 ? nr - r : 2, t, type, 2); break;
            default: float_pair_few(j, r0 + r, nr - r < 2 ? nr - r : 2, t, type, 1); break;
            }
}

static inline __attribute__((always_inline)) void float_panels(const float_job *j, int64_t p0, int64_t p1,
                                                               const uint32_t type) {
    if (j->n_tok <= FLOAT_FEW) {
        for (int64_t p = p0; p < p1; p++) {
            const int64_t r0 = p * FLOAT_ROWS;
            const int nr = j->rows - r0 < FLOAT_ROWS ? (int)(j->rows - r0) : FLOAT_ROWS;
            if (j->n_tok == 1) float_panel_one(j, r0, nr, type);
            else float_panel_few(j, r0, nr, type);
        }
        return;
    }
    _Alignas(64) float wc[FLOAT_ROWS][FLOAT_CHUNK];
    _Alignas(64) __m512 acc[FLOAT_TOKENS][FLOAT_ROWS][2];
    for (int64_t p = p0; p < p1; p++) {
        const int64_t r0 = p * FLOAT_ROWS;
        const int nr = j->rows - r0 < FLOAT_ROWS ? (int)(j->rows - r0) : FLOAT_ROWS;
        for (int tg = 0; tg < j->n_tok; tg += FLOAT_TOKENS) {
            const int ntg = j->n_tok - tg < FLOAT_TOKENS ? j->n_tok - tg : FLOAT_TOKENS;
            for (int t = 0; t < ntg; t++)
                for (int r = 0; r < FLOAT_ROWS; r++) acc[t][r][0] = acc[t][r][1] = _mm512_setzero_ps();
            for (int64_t k0 = 0; k0 < j->cols; k0 += FLOAT_CHUNK) {
                const int64_t n = j->cols - k0 < FLOAT_CHUNK ? j->cols - k0 : FLOAT_CHUNK;
                /* a panel's missing rows (the matrix's last) repeat its first: computed, not stored */
                for (int r = 0; r < FLOAT_ROWS; r++)
                    float_chunk(type, j->w + (size_t)(r0 + (r < nr ? r : 0)) * j->row_bytes, k0, n, j->cols, wc[r]);
                const float *x = j->x + (size_t)tg * (size_t)j->cols + k0;
                const int64_t steps = n / 32, tail = n % 32;
                for (int parity = 0; parity < 2; parity++)
                    for (int t = 0; t < ntg; t += FLOAT_NT) {
                        const float *xt = x + (size_t)t * (size_t)j->cols;
                        const float (*w)[FLOAT_CHUNK] = (const float (*)[FLOAT_CHUNK])wc;
                        switch (ntg - t < FLOAT_NT ? ntg - t : FLOAT_NT) {
                        case 6: float_panel_tokens(w, xt, j->cols, steps, tail, acc + t, parity, 6); break;
                        case 5: float_panel_tokens(w, xt, j->cols, steps, tail, acc + t, parity, 5); break;
                        case 4: float_panel_tokens(w, xt, j->cols, steps, tail, acc + t, parity, 4); break;
                        case 3: float_panel_tokens(w, xt, j->cols, steps, tail, acc + t, parity, 3); break;
                        case 2: float_panel_tokens(w, xt, j->cols, steps, tail, acc + t, parity, 2); break;
                        default: float_panel_tokens(w, xt, j->cols, steps, tail, acc + t, parity, 1); break;
                        }
                    }
            }
            for (int t = 0; t < ntg; t++)
                for (int r = 0; r < nr; r++)
                    j->y[(size_t)(tg + t) * (size_t)j->rows + (size_t)(r0 + r)] =
                        _mm512_reduce_add_ps(_mm512_add_ps(acc[t][r][0], acc[t][r][1]));
        }
    }
}

QUILL_FLOAT_PRODUCTS()

static void dequant_f16(const void *src, float *y, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(h + i))));
    for (; i < n; i++) y[i] = half_to_float(h[i]);
}

static void dequant_bf16(const void *src, float *y, int64_t n) {
    const uint16_t *h = src;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i v = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(h + i)));
        _mm512_storeu_ps(y + i, _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)));
    }
    for (; i < n; i++) y[i] = quill_bfloat_to_float(h[i]);
}

static inline __m512 bytes_to_ps(__m128i b) { return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(b)); }

static void dequant_q4_0(const void *src, float *y, int64_t n) {
    const block_q4_0 *b = src;
    const __m128i low = _mm_set1_epi8(0x0F);
    const __m512 eight = _mm512_set1_ps(8.0f);
    for (int64_t ib = 0; ib < n / QK4_0; ib++, y += QK4_0) {
        __m512 d = _mm512_set1_ps(half_to_float(b[ib].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[ib].qs);
        /* (q - 8) is an exact small integer either way; subtracting in float keeps it simple */
        __m512 lo = _mm512_sub_ps(bytes_to_ps(_mm_and_si128(q, low)), eight);
        __m512 hi = _mm512_sub_ps(bytes_to_ps(_mm_and_si128(_mm_srli_epi16(q, 4), low)), eight);
        _mm512_storeu_ps(y, _mm512_mul_ps(lo, d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(hi, d));
    }
}

static void dequant_q8_0(const void *src, float *y, int64_t n) {
    const block_q8_0 *b = src;
    for (int64_t ib = 0; ib < n / QK8_0; ib++, y += QK8_0) {
        __m512 d = _mm512_set1_ps(half_to_float(b[ib].d));
        __m128i q0 = _mm_loadu_si128((const __m128i *)b[ib].qs);
        __m128i q1 = _mm_loadu_si128((const __m128i *)(b[ib].qs + 16));
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d));
    }
}

static void dequant_q4_K(const void *src, float *y, int64_t n) {
    const block_q4_K *b = src;
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d), dmin = half_to_float(b[ib].dmin);
        const uint8_t *q = b[ib].qs;
        for (int j = 0; j < 4; j++, q += 32) {
            uint8_t sc, m;
            quill_scale_min_k4(2 * j, b[ib].scales, &sc, &m);
            __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * m);
            quill_scale_min_k4(2 * j + 1, b[ib].scales, &sc, &m);
            __m512 d2 = _mm512_set1_ps(d * sc), m2 = _mm512_set1_ps(dmin * m);
            for (int h = 0; h < 2; h++) {
                __m128i qq = _mm_loadu_si128((const __m128i *)(q + 16 * h));
                __m512 lo = bytes_to_ps(_mm_and_si128(qq, low));
                __m512 hi = bytes_to_ps(_mm_and_si128(_mm_srli_epi16(qq, 4), low));
                _mm512_storeu_ps(y + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, lo), m1));
                _mm512_storeu_ps(y + 32 + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d2, hi), m2));
            }
            y += 64;
        }
    }
}

static void dequant_q6_K(const void *src, float *y, int64_t n) {
    const block_q6_K *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d);
        for (int hf = 0; hf < 2; hf++)
            for (int k = 0; k < 4; k++, y += 32) {
                __m512 w[2];
                quill_q6_K_unpack32(&b[ib], d, hf, k, w);
                _mm512_storeu_ps(y, w[0]);
                _mm512_storeu_ps(y + 16, w[1]);
            }
    }
}

static inline __m512 nib_ps(__m128i q, int high) {
    const __m128i low = _mm_set1_epi8(0x0F);
    return bytes_to_ps(_mm_and_si128(high ? _mm_srli_epi16(q, 4) : q, low));
}

static void dequant_q4_1(const void *src, float *y, int64_t n) {
    const block_q4_1 *b = src;
    for (int64_t ib = 0; ib < n / QK4_1; ib++, y += QK4_1) {
        __m512 d = _mm512_set1_ps(half_to_float(b[ib].d)), m = _mm512_set1_ps(half_to_float(b[ib].m));
        __m128i q = _mm_loadu_si128((const __m128i *)b[ib].qs);
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(nib_ps(q, 0), d), m));
        _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_mul_ps(nib_ps(q, 1), d), m));
    }
}

/* The fifth bits of q5_0 / q5_1 weights j and j+16 are bits j and j+16 of qh. */
static inline void q5_unpack(const uint8_t *qs, const uint8_t *qh4, __m512 *lo, __m512 *hi) {
    uint32_t qh;
    memcpy(&qh, qh4, 4);
    const __m128i low = _mm_set1_epi8(0x0F);
    __m128i q = _mm_loadu_si128((const __m128i *)qs);
    __m512i a = _mm512_cvtepu8_epi32(_mm_and_si128(q, low));
    __m512i b = _mm512_cvtepu8_epi32(_mm_and_si128(_mm_srli_epi16(q, 4), low));
    const __m512i sixteen = _mm512_set1_epi32(16);
    a = _mm512_mask_add_epi32(a, (__mmask16)(qh & 0xFFFF), a, sixteen);
    b = _mm512_mask_add_epi32(b, (__mmask16)(qh >> 16), b, sixteen);
    *lo = _mm512_cvtepi32_ps(a);
    *hi = _mm512_cvtepi32_ps(b);
}

static void dequant_q5_0(const void *src, float *y, int64_t n) {
    const block_q5_0 *b = src;
    const __m512 off = _mm512_set1_ps(16.0f);
    for (int64_t ib = 0; ib < n / QK5_0; ib++, y += QK5_0) {
        __m512 d = _mm512_set1_ps(half_to_float(b[ib].d)), lo, hi;
        q5_unpack(b[ib].qs, b[ib].qh, &lo, &hi);
        _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_sub_ps(lo, off), d));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_sub_ps(hi, off), d));
    }
}

static void dequant_q5_1(const void *src, float *y, int64_t n) {
    const block_q5_1 *b = src;
    for (int64_t ib = 0; ib < n / QK5_1; ib++, y += QK5_1) {
        __m512 d = _mm512_set1_ps(half_to_float(b[ib].d)), m = _mm512_set1_ps(half_to_float(b[ib].m));
        __m512 lo, hi;
        q5_unpack(b[ib].qs, b[ib].qh, &lo, &hi);
        _mm512_storeu_ps(y, _mm512_add_ps(_mm512_mul_ps(lo, d), m));
        _mm512_storeu_ps(y + 16, _mm512_add_ps(_mm512_mul_ps(hi, d), m));
    }
}

static void dequant_q5_K(const void *src, float *y, int64_t n) {
    const block_q5_K *b = src;
    const __m512i sixteen = _mm512_set1_epi32(16);
    const __m128i low = _mm_set1_epi8(0x0F);
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d), dmin = half_to_float(b[ib].dmin);
        const uint8_t *ql = b[ib].qs;
        for (int is = 0; is < 8; is += 2, ql += 32) {
            for (int part = 0; part < 2; part++, y += 32) {
                uint8_t sc, m;
                quill_scale_min_k4(is + part, b[ib].scales, &sc, &m);
                __m512 d1 = _mm512_set1_ps(d * (float)sc), m1 = _mm512_set1_ps(dmin * (float)m);
                const __m128i bit = _mm_set1_epi8((char)(1u << (is + part)));
                for (int h = 0; h < 2; h++) {
                    __m128i q = _mm_loadu_si128((const __m128i *)(ql + 16 * h));
                    if (part) q = _mm_srli_epi16(q, 4);
                    __m512i v = _mm512_cvtepu8_epi32(_mm_and_si128(q, low));
                    __mmask16 hb = _mm_test_epi8_mask(_mm_loadu_si128((const __m128i *)(b[ib].qh + 16 * h)), bit);
                    v = _mm512_mask_add_epi32(v, hb, v, sixteen);
                    _mm512_storeu_ps(y + 16 * h, _mm512_sub_ps(_mm512_mul_ps(d1, _mm512_cvtepi32_ps(v)), m1));
                }
            }
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
                    __m512 dl = _mm512_set1_ps(d * (float)(sc & 0xF)), ml = _mm512_set1_ps(dmin * (float)(sc >> 4));
                    __m128i v = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three);
                    _mm512_storeu_ps(y, _mm512_sub_ps(_mm512_mul_ps(dl, bytes_to_ps(v)), ml));
                }
    }
}

static void dequant_q3_K(const void *src, float *y, int64_t n) {
    const block_q3_K *b = src;
    const __m128i three = _mm_set1_epi8(3);
    const __m512i four = _mm512_set1_epi32(4);
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
                    __m512 dl = _mm512_set1_ps(d_all * (float)scales[is++]);
                    __m128i v = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three);
                    __m512i vi = _mm512_cvtepu8_epi32(v);
                    /* a clear hmask bit means the weight sits 4 lower */
                    __mmask16 set = _mm_test_epi8_mask(_mm_loadu_si128((const __m128i *)(b[ib].hmask + 16 * k)),
                                                       _mm_set1_epi8((char)m));
                    vi = _mm512_mask_sub_epi32(vi, (__mmask16)~set, vi, four);
                    _mm512_storeu_ps(y, _mm512_mul_ps(dl, _mm512_cvtepi32_ps(vi)));
                }
    }
}

static inline __m512 iq4_values(__m128i q, int high) {
    const __m512 table = _mm512_setr_ps(-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);
    const __m128i low = _mm_set1_epi8(0x0F);
    __m512i idx = _mm512_cvtepu8_epi32(_mm_and_si128(high ? _mm_srli_epi16(q, 4) : q, low));
    return _mm512_permutexvar_ps(idx, table);
}

static void dequant_iq4_nl(const void *src, float *y, int64_t n) {
    const block_iq4_nl *b = src;
    for (int64_t ib = 0; ib < n / QK4_NL; ib++, y += QK4_NL) {
        __m512 d = _mm512_set1_ps(half_to_float(b[ib].d));
        __m128i q = _mm_loadu_si128((const __m128i *)b[ib].qs);
        _mm512_storeu_ps(y, _mm512_mul_ps(d, iq4_values(q, 0)));
        _mm512_storeu_ps(y + 16, _mm512_mul_ps(d, iq4_values(q, 1)));
    }
}

static void dequant_iq4_xs(const void *src, float *y, int64_t n) {
    const block_iq4_xs *b = src;
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(b[ib].d);
        const uint8_t *qs = b[ib].qs;
        for (int j = 0; j < QK_K / 32; j++, qs += 16, y += 32) {
            const int ls = ((b[ib].scales_l[j / 2] >> 4 * (j % 2)) & 0xF) | ((b[ib].scales_h >> 2 * j) & 3) << 4;
            __m512 dl = _mm512_set1_ps(d * (float)(ls - 32));
            __m128i q = _mm_loadu_si128((const __m128i *)qs);
            _mm512_storeu_ps(y, _mm512_mul_ps(dl, iq4_values(q, 0)));
            _mm512_storeu_ps(y + 16, _mm512_mul_ps(dl, iq4_values(q, 1)));
        }
    }
}

/* ---------------------------------------------------------------- fused quantized products
 *
 * Up to 8 tokens share each unpacked chunk of 32 weights (two registers); per token the
 * accumulation is exactly dot_nt's: a += w0·x[0:16], b += w1·x[16:32], chunk after chunk. */
#define MAX_NT 8

static inline __attribute__((always_inline)) void acc_chunk(__m512 w0, __m512 w1, const float *x, int64_t xs,
                                                            __m512 *a, __m512 *b, int NT) {
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) {
        a[t] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + t * xs), a[t]);
        b[t] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + t * xs + 16), b[t]);
    }
}

static inline __attribute__((always_inline)) void finish(const __m512 *a, const __m512 *b, float *out, int64_t os, int NT) {
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) out[t * os] = _mm512_reduce_add_ps(_mm512_add_ps(a[t], b[t]));
}

static inline __attribute__((always_inline)) void q4_0_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q4_0 *bl = row;
    const __m128i low = _mm_set1_epi8(0x0F);
    __m512 a[MAX_NT], b[MAX_NT];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK4_0; ib++) {
        /* (q - 8)·d == q·d - 8d exactly (both products are exact), so one FMA does it and the
         * single 512-bit FP port this CPU has does less work */
        const float dh = half_to_float(bl[ib].d);
        __m512 d = _mm512_set1_ps(dh), m8d = _mm512_set1_ps(-8.0f * dh);
        __m128i q = _mm_loadu_si128((const __m128i *)bl[ib].qs);
        __m512 w0 = _mm512_fmadd_ps(bytes_to_ps(_mm_and_si128(q, low)), d, m8d);
        __m512 w1 = _mm512_fmadd_ps(bytes_to_ps(_mm_and_si128(_mm_srli_epi16(q, 4), low)), d, m8d);
        acc_chunk(w0, w1, x + ib * QK4_0, xs, a, b, NT);
    }
    finish(a, b, out, os, NT);
}

static inline __attribute__((always_inline)) void q8_0_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q8_0 *bl = row;
    __m512 a[MAX_NT], b[MAX_NT];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK8_0; ib++) {
        __m512 d = _mm512_set1_ps(half_to_float(bl[ib].d));
        __m128i q0 = _mm_loadu_si128((const __m128i *)bl[ib].qs);
        __m128i q1 = _mm_loadu_si128((const __m128i *)(bl[ib].qs + 16));
        __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d);
        __m512 w1 = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d);
        acc_chunk(w0, w1, x + ib * QK8_0, xs, a, b, NT);
    }
    finish(a, b, out, os, NT);
}

static inline __attribute__((always_inline)) void q4_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q4_K *bl = row;
    const __m128i low = _mm_set1_epi8(0x0F);
    __m512 a[MAX_NT], b[MAX_NT];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(bl[ib].d), dmin = half_to_float(bl[ib].dmin);
        const uint8_t *q = bl[ib].qs;
        const float *xb = x + ib * QK_K;
        for (int j = 0; j < 8; j++) {
            uint8_t sc, m;
            quill_scale_min_k4(j, bl[ib].scales, &sc, &m);
            __m512 d1 = _mm512_set1_ps(d * sc), m1 = _mm512_set1_ps(dmin * m);
            const uint8_t *qq = q + (j / 2) * 32;
            __m128i q0 = _mm_loadu_si128((const __m128i *)qq), q1 = _mm_loadu_si128((const __m128i *)(qq + 16));
            if (j & 1) {
                q0 = _mm_srli_epi16(q0, 4);
                q1 = _mm_srli_epi16(q1, 4);
            }
            /* d1·q is exact (6+11+4 bits), so fusing the subtraction rounds exactly as before */
            __m512 w0 = _mm512_fmsub_ps(d1, bytes_to_ps(_mm_and_si128(q0, low)), m1);
            __m512 w1 = _mm512_fmsub_ps(d1, bytes_to_ps(_mm_and_si128(q1, low)), m1);
            acc_chunk(w0, w1, xb + 32 * j, xs, a, b, NT);
        }
    }
    finish(a, b, out, os, NT);
}

static inline __attribute__((always_inline)) void q6_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q6_K *bl = row;
    __m512 a[MAX_NT], b[MAX_NT];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(bl[ib].d);
        for (int hf = 0; hf < 2; hf++)
            for (int k = 0; k < 4; k++) {
                __m512 w[2];
                quill_q6_K_unpack32(&bl[ib], d, hf, k, w);
                acc_chunk(w[0], w[1], x + ib * QK_K + 128 * hf + 32 * k, xs, a, b, NT);
            }
    }
    finish(a, b, out, os, NT);
}

/* q2_K: 32 elements are two sub-blocks of 16 with their own scale and min (d·sc·q is exact, so the
 * multiply then subtract rounds as the dequantizer's) */
static inline __attribute__((always_inline)) void q2_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q2_K *bl = row;
    const __m128i three = _mm_set1_epi8(3);
    __m512 a[MAX_NT], b[MAX_NT];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d = half_to_float(bl[ib].d), dmin = half_to_float(bl[ib].dmin);
        const uint8_t *q = bl[ib].qs, *sc = bl[ib].scales;
        const float *xb = x + ib * QK_K;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2, sc += 2, xb += 32) {
                __m512 w[2];
                for (int k = 0; k < 2; k++) {
                    __m128i v = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three);
                    w[k] = _mm512_sub_ps(_mm512_mul_ps(_mm512_set1_ps(d * (float)(sc[k] & 0xF)), bytes_to_ps(v)),
                                         _mm512_set1_ps(dmin * (float)(sc[k] >> 4)));
                }
                acc_chunk(w[0], w[1], xb, xs, a, b, NT);
            }
    }
    finish(a, b, out, os, NT);
}

/* q3_K: likewise two sub-blocks of 16 per chunk, each weight 4 lower where its hmask bit is clear */
static inline __attribute__((always_inline)) void q3_K_nt(const void *row, const float *x, int64_t n, int64_t xs,
                                                          float *out, int64_t os, int NT) {
    const block_q3_K *bl = row;
    const __m128i three = _mm_set1_epi8(3);
    const __m512i four = _mm512_set1_epi32(4);
    __m512 a[MAX_NT], b[MAX_NT];
    #pragma GCC unroll 8
    for (int t = 0; t < NT; t++) a[t] = b[t] = _mm512_setzero_ps();
    for (int64_t ib = 0; ib < n / QK_K; ib++) {
        const float d_all = half_to_float(bl[ib].d);
        int8_t scales[16];
        quill_q3_K_scales(bl[ib].scales, scales);
        const uint8_t *q = bl[ib].qs;
        const float *xb = x + ib * QK_K;
        int is = 0;
        unsigned m = 1;
        for (int half = 0; half < 2; half++, q += 32)
            for (int shift = 0; shift < 8; shift += 2, m <<= 1, xb += 32) {
                __m512 w[2];
                for (int k = 0; k < 2; k++) {
                    __m128i v = _mm_and_si128(_mm_srli_epi16(_mm_loadu_si128((const __m128i *)(q + 16 * k)), shift), three);
                    __m512i vi = _mm512_cvtepu8_epi32(v);
                    __mmask16 set = _mm_test_epi8_mask(_mm_loadu_si128((const __m128i *)(bl[ib].hmask + 16 * k)),
                                                       _mm_set1_epi8((char)m));
                    vi = _mm512_mask_sub_epi32(vi, (__mmask16)~set, vi, four);
                    w[k] = _mm512_mul_ps(_mm512_set1_ps(d_all * (float)scales[is++]), _mm512_cvtepi32_ps(vi));
                }
                acc_chunk(w[0], w[1], xb, xs, a, b, NT);
            }
    }
    finish(a, b, out, os, NT);
}

QUILL_TOKENS_BY_8(vec_dot_q4_0, const void *, q4_0_nt)
QUILL_TOKENS_BY_8(vec_dot_q8_0, const void *, q8_0_nt)
QUILL_TOKENS_BY_8(vec_dot_q4_K, const void *, q4_K_nt)
QUILL_TOKENS_BY_8(vec_dot_q6_K, const void *, q6_K_nt)
QUILL_TOKENS_BY_8(vec_dot_q2_K, const void *, q2_K_nt)
QUILL_TOKENS_BY_8(vec_dot_q3_K, const void *, q3_K_nt)

/* hb heads of nv vectors of values each (nv·hb <= 16 accumulators, in registers across all rows):
 * each row of values is loaded once for the hb heads, and the hb·nv chains of fused
 * multiply-adds overlap. */
static inline __attribute__((always_inline)) void weighted_heads(const int nv, const int hb, const float *wgt,
                                                                 int64_t wgt_stride, const float *v, int n_rows,
                                                                 int64_t stride, float *out, int64_t out_stride,
                                                                 bool accumulate) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < nv * hb; i++)
        acc[i] = accumulate ? _mm512_loadu_ps(out + (i / nv) * out_stride + 16 * (i % nv)) : _mm512_setzero_ps();
    for (int p = 0; p < n_rows; p++) {
        const float *vp = v + p * stride;
        __m512 vr[8];
#pragma GCC unroll 8
        for (int i = 0; i < nv; i++) vr[i] = _mm512_loadu_ps(vp + 16 * i);
#pragma GCC unroll 16
        for (int h = 0; h < hb; h++) {
            const __m512 w = _mm512_set1_ps(wgt[h * wgt_stride + p]);
#pragma GCC unroll 8
            for (int i = 0; i < nv; i++) acc[h * nv + i] = _mm512_fmadd_ps(w, vr[i], acc[h * nv + i]);
        }
    }
#pragma GCC unroll 16
    for (int h = 0; h < hb; h++)
#pragma GCC unroll 8
        for (int i = 0; i < nv; i++) _mm512_storeu_ps(out + h * out_stride + 16 * i, acc[h * nv + i]);
}

/* Value rows of one block of wide heads (see below): 32 rows of 256 floats, 32 KiB. */
#define WIDE_ROWS 32

/* Heads of 64 dims (the usual size) four at a time, the rest together; other sizes one head at a
 * time. */
/* Heads of at most 16 columns, hb of them at a time, each one vector (the lanes of m) and its own
 * chain in row order, the chains in registers: with the accumulators in an array of run-time
 * length, gcc kept them in memory and every row waited on a store's forwarding (78 % of the
 * function's samples on stories260K). */
static inline __attribute__((always_inline)) void narrow_heads(const int hb, __mmask16 m, const float *wgt,
                                                               int64_t wgt_stride, const float *v, int n_rows,
                                                               int64_t stride, float *out, int64_t out_stride,
                                                               bool accumulate) {
    __m512 acc[4];
#pragma GCC unroll 4
    for (int k = 0; k < hb; k++) acc[k] = accumulate ? _mm512_maskz_loadu_ps(m, out + k * out_stride) : _mm512_setzero_ps();
    for (int p = 0; p < n_rows; p++) {
        const __m512 vp = _mm512_maskz_loadu_ps(m, v + p * stride);
#pragma GCC unroll 4
        for (int k = 0; k < hb; k++) acc[k] = _mm512_fmadd_ps(_mm512_set1_ps(wgt[k * wgt_stride + p]), vp, acc[k]);
    }
#pragma GCC unroll 4
    for (int k = 0; k < hb; k++) _mm512_mask_storeu_ps(out + k * out_stride, m, acc[k]);
}

static void weighted_sum_avx512(const float *wgt, int64_t wgt_stride, int n_heads, const float *v, int n_rows,
                                int64_t stride, int64_t n, float *out, int64_t out_stride, bool accumulate) {
    if (n == 0) return;
    /* wider heads (Qwen 3.5's gated attention: 256) a block of 128 columns at a time: each column
     * is its own chain, so the bits are those of one pass. The rows go WIDE_ROWS at a time through
     * every head and block of columns, the chains resumed from `out` (the same bits): one head after
     * another over all the rows read a generation step's values from memory once per head (8
     * heads of 256 per KV head, 4096 positions: 32 MiB a KV head per token), a block of rows once. */
    if (n > 128 || (n == 128 && n_rows > WIDE_ROWS)) {
        for (int p = 0; p < n_rows; p += WIDE_ROWS) {
            const int rows = n_rows - p < WIDE_ROWS ? n_rows - p : WIDE_ROWS;
            for (int64_t d = 0; d < n; d += 128) {
                const int64_t width = n - d < 128 ? n - d : 128;
                if (width < 128) {
                    weighted_sum_avx512(wgt + p, wgt_stride, n_heads, v + p * stride + d, rows, stride, width, out + d,
                                        out_stride, accumulate || p > 0);
                    continue;
                }
                int h = 0;
                for (; h + 2 <= n_heads; h += 2)
                    weighted_heads(8, 2, wgt + h * wgt_stride + p, wgt_stride, v + p * stride + d, rows, stride,
                                   out + h * out_stride + d, out_stride, accumulate || p > 0);
                if (h < n_heads)
                    weighted_heads(8, 1, wgt + h * wgt_stride + p, wgt_stride, v + p * stride + d, rows, stride,
                                   out + h * out_stride + d, out_stride, accumulate || p > 0);
            }
        }
        return;
    }
    int h = 0;
    if (n == 64) {
        for (; h + 4 <= n_heads; h += 4)
            weighted_heads(4, 4, wgt + h * wgt_stride, wgt_stride, v, n_rows, stride, out + h * out_stride, out_stride,
                           accumulate);
        /* the other one to three heads together (a group of 6 or 7, as Qwen2's, is 4 + 2 or 4 + 3) */
        const float *wh = wgt + h * wgt_stride;
        float *oh = out + h * out_stride;
        switch (n_heads - h) {
        case 3: weighted_heads(4, 3, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        case 2: weighted_heads(4, 2, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        case 1: weighted_heads(4, 1, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        default: break;
        }
        return;
    }
    if (n <= 16) { /* stories260K's 8: 4 heads' chains side by side (below, one head's chain ran alone) */
        const __mmask16 m = (__mmask16)(0xFFFFu >> (16 - n));
        for (; h + 4 <= n_heads; h += 4)
            narrow_heads(4, m, wgt + h * wgt_stride, wgt_stride, v, n_rows, stride, out + h * out_stride, out_stride, accumulate);
        const float *wh = wgt + h * wgt_stride;
        float *oh = out + h * out_stride;
        switch (n_heads - h) {
        case 3: narrow_heads(3, m, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        case 2: narrow_heads(2, m, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        case 1: narrow_heads(1, m, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
        default: break;
        }
        return;
    }
    /* other widths one head at a time, the last vector masked to the columns that exist (a lane
     * is its own chain, so a width that is no multiple of 16 costs no bits) */
    const int nv = (int)((n + 15) / 16);
    const __mmask16 last = (__mmask16)(0xFFFFu >> (16 * nv - n));
    for (; h < n_heads; h++) {
        const float *w = wgt + h * wgt_stride;
        float *o = out + h * out_stride;
        __m512 acc[8];
        for (int i = 0; i < nv; i++) {
            const __mmask16 m = i == nv - 1 ? last : 0xFFFF;
            acc[i] = accumulate ? _mm512_maskz_loadu_ps(m, o + 16 * i) : _mm512_setzero_ps();
        }
        for (int p = 0; p < n_rows; p++) {
            const __m512 wp = _mm512_set1_ps(w[p]);
            const float *vp = v + p * stride;
            for (int i = 0; i < nv; i++)
                acc[i] = _mm512_fmadd_ps(wp, _mm512_maskz_loadu_ps(i == nv - 1 ? last : 0xFFFF, vp + 16 * i), acc[i]);
        }
        for (int i = 0; i < nv; i++) _mm512_mask_storeu_ps(o + 16 * i, i == nv - 1 ? last : 0xFFFF, acc[i]);
    }
}

/* Sixteen columns per vector, each lane its own chain of fused multiply-adds in d order: nv
 * vectors (up to 64 columns) of hb heads at a time (nv·hb chains whose latencies overlap; the
 * keys' loads are shared by the heads). With `tail`, the last vector takes the lanes of `last`: a
 * generation step's last block of keys is part-filled, and one head and one vector at a time, as
 * it went before, its chains ran one after another (~4 cycles per key dimension each). */
static inline __attribute__((always_inline)) void column_heads(const int hb, const int nv, const bool tail,
                                                               __mmask16 last, const float *q, int64_t q_stride,
                                                               const float *kt, int64_t n, int64_t stride, int p,
                                                               float *out, int64_t out_stride) {
    __m512 acc[16];
#pragma GCC unroll 16
    for (int i = 0; i < nv * hb; i++) acc[i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < n; d++) {
        const float *row = kt + d * stride + p;
        /* two rows on (512 B): written for the cache's earlier layout, where rows were a context
         * apart and n separate streams (two blocks on then: 2x faster at 2000 positions); in the
         * blocked layout, one stream, 512 B, 4 KiB, 16 KiB ahead and none measured alike */
#pragma GCC unroll 4
        for (int i = 0; i < nv; i++) _mm_prefetch((const char *)(row + 128 + 16 * i), _MM_HINT_T0);
        __m512 k[4];
#pragma GCC unroll 4
        for (int i = 0; i < nv; i++) k[i] = _mm512_maskz_loadu_ps(tail && i == nv - 1 ? last : 0xFFFF, row + 16 * i);
#pragma GCC unroll 4
        for (int h = 0; h < hb; h++) {
            const __m512 qd = _mm512_set1_ps(q[h * q_stride + d]);
#pragma GCC unroll 4
            for (int i = 0; i < nv; i++) acc[nv * h + i] = _mm512_fmadd_ps(qd, k[i], acc[nv * h + i]);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++)
#pragma GCC unroll 4
        for (int i = 0; i < nv; i++)
            _mm512_mask_storeu_ps(out + h * out_stride + p + 16 * i, tail && i == nv - 1 ? last : 0xFFFF, acc[nv * h + i]);
}

QUILL_COLUMN_VECTORS(__mmask16, column_heads)

static void dot_columns_avx512(const float *q, int64_t q_stride, int n_heads, const float *kt, int64_t n,
                               int64_t stride, int n_cols, float *out, int64_t out_stride) {
    int p = 0;
    for (; p + 64 <= n_cols; p += 64) column_vectors(4, false, 0xFFFF, q, q_stride, n_heads, kt, n, stride, p, out, out_stride);
    const int left = n_cols - p;
    if (left == 0) return;
    const __mmask16 last = left % 16 ? (__mmask16)((1u << (left % 16)) - 1) : 0xFFFF;
    switch ((left + 15) / 16) {
    case 1: column_vectors(1, true, last, q, q_stride, n_heads, kt, n, stride, p, out, out_stride); break;
    case 2: column_vectors(2, true, last, q, q_stride, n_heads, kt, n, stride, p, out, out_stride); break;
    case 3: column_vectors(3, true, last, q, q_stride, n_heads, kt, n, stride, p, out, out_stride); break;
    default: column_vectors(4, true, last, q, q_stride, n_heads, kt, n, stride, p, out, out_stride); break;
    }
}

/* exp_poly on 16 lanes, operation for operation. */
static inline __m512 exp16(__m512 x) {
    const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_LOG2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_HI), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(EXP_LN2_LO), r);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP_P0), r, _mm512_set1_ps(EXP_P1));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P2));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P3));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P4));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P5));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    __m512 e = _mm512_scalef_ps(p, n);
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(EXP_MIN_ARG), _CMP_LT_OQ), _mm512_setzero_ps());
    e = _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_GT_OQ), _mm512_set1_ps(INFINITY));
    return _mm512_mask_mov_ps(e, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q), x);
}

static void softmax_avx512(float *x, int n, float s) {
    __m512 vmax = _mm512_set1_ps(-INFINITY);
    const __m512 vs = _mm512_set1_ps(s);
    for (int p = 0; p < n; p += 16) {
        const __mmask16 m = n - p >= 16 ? 0xFFFF : (__mmask16)((1u << (n - p)) - 1);
        const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + p), vs);
        _mm512_mask_storeu_ps(x + p, m, v);
        vmax = _mm512_mask_max_ps(vmax, m, vmax, v);
    }
    const __m512 max = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));
    __m512 part = _mm512_setzero_ps();
    for (int p = 0; p < n; p += 16) {
        const __mmask16 m = n - p >= 16 ? 0xFFFF : (__mmask16)((1u << (n - p)) - 1);
        const __m512 e = _mm512_maskz_mov_ps(m, exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + p), max)));
        _mm512_mask_storeu_ps(x + p, m, e);
        part = _mm512_add_ps(part, e);
    }
    /* partial sums 8, 4, 2, 1 apart, as the scalar version adds them */
    __m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(part), _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(part), 1)));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    __m128 s1 = _mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1));
    const __m512 inv = _mm512_set1_ps(1.0f / _mm_cvtss_f32(s1));
    for (int p = 0; p < n; p += 16) {
        const __mmask16 m = n - p >= 16 ? 0xFFFF : (__mmask16)((1u << (n - p)) - 1);
        _mm512_mask_storeu_ps(x + p, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + p), inv));
    }
}

static void swiglu_avx512(float *gate, const float *up, int64_t n) {
    const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
    for (int64_t i = 0; i < n; i += 16) {
        const __mmask16 m = n - i >= 16 ? 0xFFFF : (__mmask16)((1u << (n - i)) - 1);
        const __m512 g = _mm512_maskz_loadu_ps(m, gate + i), u = _mm512_maskz_loadu_ps(m, up + i);
        const __m512 s = _mm512_div_ps(g, _mm512_add_ps(one, exp16(_mm512_xor_ps(g, sign))));
        _mm512_mask_storeu_ps(gate + i, m, _mm512_mul_ps(s, u));
    }
}

/* The KV cache's key blocks (kernels.h): 16 positions per vector, the codes widened to f32 and
 * multiplied by their positions' scales, as the scalar decoder does. */
static void key_block_q8_0_avx512(const uint8_t *block, int64_t hd, float *tile) {
    const int8_t *codes = (const int8_t *)block;
    const uint16_t *scales = (const uint16_t *)(block + (size_t)hd * QUILL_KEY_BLOCK);
    for (int64_t g = 0; g < hd / 32; g++) {
        __m512 s[4];
        for (int i = 0; i < 4; i++)
            s[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + g * QUILL_KEY_BLOCK + 16 * i)));
        for (int64_t d = g * 32; d < g * 32 + 32; d++)
            for (int i = 0; i < 4; i++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(codes + d * QUILL_KEY_BLOCK + 16 * i));
                _mm512_storeu_ps(tile + d * QUILL_KEY_BLOCK + 16 * i, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), s[i]));
            }
    }
}

static void key_block_q4_0_avx512(const uint8_t *block, int64_t hd, float *tile) {
    const uint16_t *scales = (const uint16_t *)(block + (size_t)hd / 2 * QUILL_KEY_BLOCK);
    const __m512i low = _mm512_set1_epi32(0xF), eight = _mm512_set1_epi32(8);
    for (int64_t g = 0; g < hd / 32; g++) {
        __m512 s[4];
        for (int i = 0; i < 4; i++)
            s[i] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(scales + g * QUILL_KEY_BLOCK + 16 * i)));
        for (int64_t d = g * 32; d < g * 32 + 32; d += 2)
            for (int i = 0; i < 4; i++) {
                const __m512i b = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(block + d / 2 * QUILL_KEY_BLOCK + 16 * i)));
                const __m512i lo = _mm512_sub_epi32(_mm512_and_si512(b, low), eight);
                const __m512i hi = _mm512_sub_epi32(_mm512_srli_epi32(b, 4), eight);
                _mm512_storeu_ps(tile + d * QUILL_KEY_BLOCK + 16 * i, _mm512_mul_ps(_mm512_cvtepi32_ps(lo), s[i]));
                _mm512_storeu_ps(tile + (d + 1) * QUILL_KEY_BLOCK + 16 * i, _mm512_mul_ps(_mm512_cvtepi32_ps(hi), s[i]));
            }
    }
}

/* kernels.h's dot_f64: a row's partial sums i mod 8 in one vector of eight doubles, rows in fours
 * (four chains of fused multiply-adds in flight). */
static inline __attribute__((always_inline)) void rows_f64_avx512(const float *w, int64_t w_stride, const int nr,
                                                                  const float *x, int64_t n, double *out) {
    const int64_t whole = n / 8 * 8;
    __m512d acc[4];
    for (int j = 0; j < nr; j++) acc[j] = _mm512_setzero_pd();
    for (int64_t i = 0; i < whole; i += 8) {
        const __m512d xv = _mm512_cvtps_pd(_mm256_loadu_ps(x + i));
        for (int j = 0; j < nr; j++) acc[j] = _mm512_fmadd_pd(_mm512_cvtps_pd(_mm256_loadu_ps(w + j * w_stride + i)), xv, acc[j]);
    }
    for (int j = 0; j < nr; j++) {
        double part[8];
        _mm512_storeu_pd(part, acc[j]);
        out[j] = quill_dot_f64_finish(part, w + j * w_stride, x, whole, n);
    }
}

static void dot_f64_avx512(const float *w, int64_t w_stride, int rows, const float *x, int64_t n, double *out) {
    for (int r = 0; r < rows; r += 4)
        if (rows - r >= 4) rows_f64_avx512(w + r * w_stride, w_stride, 4, x, n, out + r);
        else for (int j = r; j < rows; j++) rows_f64_avx512(w + j * w_stride, w_stride, 1, x, n, out + j);
}

void quill_kernels_install_avx512(quill_kernels *k) {
    QUILL_INSTALL_SIMD(k, avx512);
    QUILL_INSTALL_FLOAT_PRODUCTS(k);
}
#endif
