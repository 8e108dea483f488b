/* AMX kernels: batched products of quantized matrices on the tile unit (Sapphire Rapids and later).
 *
 * y[t][r] = Σ_k W[r][k] · x[t][k] with weight rows as the 16 rows of a tile and tokens as its 16
 * columns, 32 k (one tile product) at a time:
 *   - activations: every f32 x is split in two bf16 parts, hi = x with its low 16 bits cleared
 *     (exact) and lo = bf16(x - hi) (x - hi is exact in f32; rounding it loses < 2^-15 |x|);
 *   - q4_0, q8_0, q4_K: a k step is one block (sub-block for q4_K) and its integer codes (q - 8,
 *     q, q) are exact in bf16, so the tile unit computes S = Σ q·hi(x) + q·lo(x) from exact
 *     products, rounded only by its f32 sums; then acc += d·S (- m·Σx for q4_K's minimums) in f32,
 *     step after step;
 *   - q6_K (16-element scales inside a step): weights are unpacked to f32 exactly as to_float and
 *     split like x; the tile unit accumulates hi·hi, hi·lo, lo·hi (lo·lo, < 2^-14 |w·x|, dropped).
 * A (row, token) result depends only on that row, that token and the fixed order of the k steps
 * and tile products, never on how many other rows or tokens share the tiles (unused tile rows and
 * columns hold zeros) nor on which thread computes it: one token alone (decoding) gets the same
 * bits as inside a batch, for any thread count.
 *
 * Speed: a 64-token batch runs ~4-6x faster per core than the AVX-512 fused products, but one token
 * costs the same weight conversion and tile round trips as a batch and runs ~2-3x slower than them,
 * so decoding regresses; the table is therefore opt-in ($QUILL_ISA=amx). */
#include "kernels.h"
#include "threadpool.h"
#include "types_internal.h"
#include "unpack_avx512.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "kernels_amx.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

#define TOK 16                  /* tokens per tile (N) */
#define KSTEP 32                /* k per tile product (K, in bf16) */
#define ROWS 16                 /* weight rows per tile (M) */
#define MAX_TB 4                /* token tiles accumulated at once: 64 tokens */
#define TILE_BYTES 1024
/* One packed activation item, in uint16 units: hi tile, lo tile, then 16 f32 sums of the step's x */
#define ITEM (TILE_BYTES + 32)
#define CHUNK 8                 /* k steps converted at once: 256 weights of each row */

/* ---------------------------------------------------------------- hi + lo bf16 split */

/* 32 values (v0: k 0..15, v1: k 16..31) to 32 bf16 hi parts and 32 bf16 lo parts, k in order. */
static inline __attribute__((always_inline)) void split32(__m512 v0, __m512 v1, __m512i *hi, __m512i *lo) {
    const __m512i top = _mm512_set1_epi32((int)0xFFFF0000u);
    __m512 h0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v0), top));
    __m512 h1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v1), top));
    *hi = (__m512i)_mm512_cvtne2ps_pbh(h1, h0); /* exact: h0, h1 are bf16 values */
    *lo = (__m512i)_mm512_cvtne2ps_pbh(_mm512_sub_ps(v1, h1), _mm512_sub_ps(v0, h0));
}

/* ---------------------------------------------------------------- exact unpacking of weights */

/* A converted weight chunk: for each of CHUNK k steps, a hi tile and a lo tile (16 rows x 32). */
typedef uint16_t wchunk[CHUNK][2][ROWS * KSTEP];

/* Stores 32 weights (k steps q of row r) split into dst, or as f32 into out (tests). */
static inline __attribute__((always_inline)) void put32(__m512 w0, __m512 w1, wchunk *dst, int q, int r, float *out) {
    if (out) {
        _mm512_storeu_ps(out + q * KSTEP, w0);
        _mm512_storeu_ps(out + q * KSTEP + 16, w1);
        return;
    }
    __m512i h, l;
    split32(w0, w1, &h, &l);
    _mm512_store_si512((*dst)[q][0] + r * KSTEP, h);
    _mm512_store_si512((*dst)[q][1] + r * KSTEP, l);
}

/* Exact half -> float (F16C converts every half exactly, as quill_half_to_float does). */
static inline float half(quill_half h) { return _cvtsh_ss(h); }

/* Weights of k steps c0 .. c0+7 (one super-block) of a q6_K row, computed as the dequantizer
 * does (same float operations in the same order). */
static inline __attribute__((always_inline)) void convert_row(uint32_t type, const uint8_t *row, int64_t c0, int ns,
                                                              wchunk *dst, int r, float *out) {
    (void)ns;
    switch (type) {
    case QUILL_TYPE_Q6_K: {
        const block_q6_K *b = (const block_q6_K *)row + c0 / 8;
        const float d = half(b->d);
        for (int hf = 0; hf < 2; hf++) {
            for (int k = 0; k < 4; k++) {
                __m512 w[2];
                quill_q6_K_unpack32(b, d, hf, k, w);
                put32(w[0], w[1], dst, 4 * hf + k, r, out);
            }
        }
        break;
    }
    default:
        break;
    }
}

/* ---------------------------------------------------------------- activations, once per product
 *
 * Token tile tb, step s: a hi tile then a lo tile, each 16 rows (k pairs) x 16 tokens of
 * (x[2k], x[2k+1]) bf16 pairs: the pair ("VNNI") layout the tile unit expects for its B operand. */
typedef struct {
    const float *x;
    int64_t cols, n_steps;
    int n_tok;
    uint16_t *packed;
} pack_job;

/* One item at dst: a hi tile and a lo tile of tokens tb*16 .. tb*16+15 (zeros past n_tok), k of
 * step s, then each token's sum of those 32 x (for the minimums of q4_K). */
static void pack_tile(const float *x, int64_t cols, int n_tok, int64_t tb, int64_t s, uint16_t *dst) {
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                           _mm512_set1_epi32(TOK));
    uint16_t *hi = dst, *lo = dst + TILE_BYTES / 2;
    float *sum = (float *)(dst + TILE_BYTES);
    for (int i = 0; i < TOK; i++) {
        int64_t t = tb * TOK + i;
        __m512i h = _mm512_setzero_si512(), l = _mm512_setzero_si512();
        sum[i] = 0;
        if (t < n_tok) {
            const float *xt = x + t * cols + s * KSTEP;
            __m512 x0 = _mm512_loadu_ps(xt), x1 = _mm512_loadu_ps(xt + 16);
            split32(x0, x1, &h, &l);
            sum[i] = _mm512_reduce_add_ps(_mm512_add_ps(x0, x1));
        }
        /* token i's 16 pairs go down column i */
        _mm512_i32scatter_epi32(hi + 2 * i, idx, h, 4);
        _mm512_i32scatter_epi32(lo + 2 * i, idx, l, 4);
    }
}

static void pack_items(void *arg, int64_t i0, int64_t i1, int thread) {
    (void)thread;
    const pack_job *j = arg;
    for (int64_t item = i0; item < i1; item++)
        pack_tile(j->x, j->cols, j->n_tok, item / j->n_steps, item % j->n_steps,
                  j->packed + (size_t)item * ITEM);
}

/* ---------------------------------------------------------------- the tile loop */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

typedef struct {
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols, n_steps;
    int n_tok;
    const float *x;
    const uint16_t *packed; /* NULL: pack each step's activation tiles on the spot */
    float *y;
} rows_job;

/* Tiles: 0..3 accumulators (token tiles), 4/5 weight hi/lo, 6/7 activation hi/lo. */
#define TILE_STEP(J)                                                                                \
    do {                                                                                            \
        const uint16_t *b_ = bt + (size_t)(J) * bstride;                                            \
        _tile_loadd(6, b_, 64);                                                                     \
        _tile_loadd(7, b_ + TILE_BYTES / 2, 64);                                                    \
        _tile_dpbf16ps(J, 4, 6);                                                                    \
        _tile_dpbf16ps(J, 4, 7);                                                                    \
        _tile_dpbf16ps(J, 5, 6);                                                                    \
    } while (0)

#define TILE_STORE(J)                                                                               \
    do {                                                                                            \
        _tile_stored(J, cbuf, TOK * sizeof(float));                                                 \
        int t0_ = (tb0 + (J)) * TOK;                                                                \
        for (int i_ = 0; i_ < TOK && t0_ + i_ < j->n_tok; i_++)                                     \
            for (int r_ = 0; r_ < nr; r_++) j->y[(size_t)(t0_ + i_) * j->rows + r0 + r_] = cbuf[r_][i_]; \
    } while (0)

static inline __attribute__((always_inline)) void rows_impl(const rows_job *j, int64_t blk0, int64_t blk1,
                                                            uint32_t type) {
    static const tile_config cfg = {
        .palette = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
    };
    /* Weight tiles CHUNK steps at a time, converted row by row (each row read in order) into one
     * buffer while the tile unit works on the other: step q of chunk c also converts rows
     * [q nr / ns, (q+1) nr / ns) of chunk c+1. */
    _Alignas(64) wchunk abuf[2];
    _Alignas(64) float cbuf[ROWS][TOK];
    _Alignas(64) uint16_t local[MAX_TB * ITEM];  /* activation tiles when not packed */
    const int n_tb = (j->n_tok + TOK - 1) / TOK;
    _tile_loadconfig(&cfg);
    for (int64_t blk = blk0; blk < blk1; blk++) {
        const int64_t r0 = blk * ROWS;
        const int nr = j->rows - r0 < ROWS ? (int)(j->rows - r0) : ROWS;
        const uint8_t *w = j->w + (size_t)r0 * j->row_bytes;
        if (nr < ROWS) memset(abuf, 0, sizeof abuf); /* missing rows stay zero */
        for (int tb0 = 0; tb0 < n_tb; tb0 += MAX_TB) {
            const int nb = n_tb - tb0 < MAX_TB ? n_tb - tb0 : MAX_TB;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            int ns = j->n_steps < CHUNK ? (int)j->n_steps : CHUNK;
            for (int r = 0; r < nr; r++) convert_row(type, w + (size_t)r * j->row_bytes, 0, ns, &abuf[0], r, NULL);
            for (int64_t c0 = 0, ci = 0; c0 < j->n_steps; c0 += CHUNK, ci ^= 1) {
                ns = j->n_steps - c0 < CHUNK ? (int)(j->n_steps - c0) : CHUNK;
                const int64_t c1 = c0 + CHUNK;
                const int ns1 = j->n_steps - c1 <= 0 ? 0 : j->n_steps - c1 < CHUNK ? (int)(j->n_steps - c1) : CHUNK;
                for (int q = 0; q < ns; q++) {
                    const int64_t s = c0 + q;
                    _tile_loadd(4, abuf[ci][q][0], 64);
                    _tile_loadd(5, abuf[ci][q][1], 64);
                    const uint16_t *bt = local;
                    size_t bstride = ITEM;
                    if (j->packed) {
                        bt = j->packed + ((size_t)tb0 * j->n_steps + s) * ITEM;
                        bstride = (size_t)j->n_steps * ITEM;
                    } else {
                        for (int b = 0; b < nb; b++)
                            pack_tile(j->x, j->cols, j->n_tok, tb0 + b, s, local + b * ITEM);
                    }
                    TILE_STEP(0);
                    if (nb > 1) TILE_STEP(1);
                    if (nb > 2) TILE_STEP(2);
                    if (nb > 3) TILE_STEP(3);
                    if (ns1)
                        for (int r = q * nr / ns; r < (q + 1) * nr / ns; r++)
                            convert_row(type, w + (size_t)r * j->row_bytes, c1, ns1, &abuf[ci ^ 1], r, NULL);
                }
            }
            TILE_STORE(0);
            if (nb > 1) TILE_STORE(1);
            if (nb > 2) TILE_STORE(2);
            if (nb > 3) TILE_STORE(3);
        }
    }
    _tile_release();
}

/* q4_0 and q8_0: a block is one k step, and its integer codes (q - 8, or q) are exact in bf16, so
 * the tile unit computes S = Σ_k q_k (hi(x_k) + lo(x_k)) exactly per product, rounded only by its
 * f32 sums; then acc += d · S in f32 (one fused multiply-add per row and token, in block order). */
static inline __attribute__((always_inline)) __m512i codes32(uint32_t type, const uint8_t *row, int64_t s, float *d,
                                                            float *m) {
    if (type == QUILL_TYPE_Q4_K) {
        const __m512i lut = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x4170, 0x4160, 0x4150,
                                             0x4140, 0x4130, 0x4120, 0x4110, 0x4100, 0x40E0, 0x40C0, 0x40A0, 0x4080,
                                             0x4040, 0x4000, 0x3F80, 0x0000);
        const block_q4_K *b = (const block_q4_K *)row + s / 8;
        const int jj = (int)(s % 8);
        uint8_t sc, mn;
        quill_scale_min_k4(jj, b->scales, &sc, &mn);
        *d = half(b->d) * sc;
        *m = half(b->dmin) * mn;
        __m256i v = _mm256_loadu_si256((const __m256i *)(b->qs + (jj / 2) * 32));
        if (jj & 1) v = _mm256_srli_epi16(v, 4);
        v = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
        return _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(v), lut);
    }
    (void)m;
    if (type == QUILL_TYPE_Q4_0) {
        const block_q4_0 *b = (const block_q4_0 *)row + s;
        /* bf16 of i - 8 for nibble i (only the low 16 entries are used) */
        const __m512i lut = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x40E0, 0x40C0, 0x40A0,
                                             0x4080, 0x4040, 0x4000, 0x3F80, 0x0000, (short)0xBF80, (short)0xC000,
                                             (short)0xC040, (short)0xC080, (short)0xC0A0, (short)0xC0C0,
                                             (short)0xC0E0, (short)0xC100);
        *d = half(b->d);
        __m128i v = _mm_loadu_si128((const __m128i *)b->qs), low = _mm_set1_epi8(0x0F);
        __m256i nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low), _mm_and_si128(v, low));
        return _mm512_permutexvar_epi16(_mm512_cvtepu8_epi16(nib), lut);
    }
    const block_q8_0 *b = (const block_q8_0 *)row + s;
    *d = half(b->d);
    __m512i q0 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)b->qs));
    __m512i q1 = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(b->qs + 16)));
    return (__m512i)_mm512_cvtne2ps_pbh(_mm512_cvtepi32_ps(q1), _mm512_cvtepi32_ps(q0)); /* exact: |q| <= 128 */
}

/* acc[r][t] += d[r] S[r][t] (- m[r] X[t] for q4_K, X the token's sum of the step's x). */
static inline __attribute__((always_inline)) void scale_acc(uint32_t type, float (*acc)[TOK], const float (*S)[TOK],
                                                            const float *d, const float *m, const float *xsum) {
    const __m512 x = _mm512_loadu_ps(xsum);
    for (int r = 0; r < ROWS; r++) {
        __m512 a = _mm512_fmadd_ps(_mm512_set1_ps(d[r]), _mm512_load_ps(S[r]), _mm512_load_ps(acc[r]));
        if (type == QUILL_TYPE_Q4_K) a = _mm512_fnmadd_ps(_mm512_set1_ps(m[r]), x, a);
        _mm512_store_ps(acc[r], a);
    }
}

#define SC_STEP(J)                                                                                  \
    do {                                                                                            \
        const uint16_t *b_ = bt + (size_t)(J) * bstride;                                            \
        _tile_zero(J);                                                                              \
        _tile_loadd(6, b_, 64);                                                                     \
        _tile_loadd(7, b_ + TILE_BYTES / 2, 64);                                                    \
        _tile_dpbf16ps(J, 4, 6);                                                                    \
        _tile_dpbf16ps(J, 4, 7);                                                                    \
        _tile_stored(J, sbuf[J], TOK * sizeof(float));                                              \
    } while (0)

#define SC_STEP_A(J, A)                                                                             \
    do {                                                                                            \
        _tile_zero(J);                                                                              \
        _tile_loadd(6, bt, 64);                                                                     \
        _tile_loadd(7, bt + TILE_BYTES / 2, 64);                                                    \
        _tile_dpbf16ps(J, A, 6);                                                                    \
        _tile_dpbf16ps(J, A, 7);                                                                    \
        _tile_stored(J, sbuf[J], TOK * sizeof(float));                                              \
    } while (0)

static inline __attribute__((always_inline)) void rows_scaled_impl(const rows_job *j, int64_t blk0, int64_t blk1,
                                                                   uint32_t type) {
    static const tile_config cfg = {
        .palette = 1,
        .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
        .rows = {16, 16, 16, 16, 16, 16, 16, 16},
    };
    _Alignas(64) uint16_t abuf[ROWS * KSTEP];
    _Alignas(64) float sbuf[MAX_TB][ROWS][TOK], acc[MAX_TB][ROWS][TOK], dbuf[ROWS], mbuf[ROWS];
    _Alignas(64) uint16_t local[MAX_TB * ITEM];  /* activation tiles when not packed */
    const int n_tb = (j->n_tok + TOK - 1) / TOK;
    _tile_loadconfig(&cfg);
    for (int64_t blk = blk0; blk < blk1; blk++) {
        const int64_t r0 = blk * ROWS;
        const int nr = j->rows - r0 < ROWS ? (int)(j->rows - r0) : ROWS;
        const uint8_t *w = j->w + (size_t)r0 * j->row_bytes;
        if (nr < ROWS) {
            memset(abuf, 0, sizeof abuf);
            memset(dbuf, 0, sizeof dbuf);
            memset(mbuf, 0, sizeof mbuf);
        }
        for (int tb0 = 0; tb0 < n_tb; tb0 += MAX_TB) {
            const int nb = n_tb - tb0 < MAX_TB ? n_tb - tb0 : MAX_TB;
            memset(acc, 0, sizeof acc);
            if (nb == 1 && j->packed) {
                /* one token tile (decoding): four steps at a time, each in its own accumulator tile,
                 * so the tile unit's latency is paid once per four steps; the scaling is then done
                 * in step order, exactly as below */
                _Alignas(64) uint16_t a4[4][ROWS * KSTEP];
                float d4[4][ROWS], m4[4][ROWS];
                if (nr < ROWS) {
                    memset(a4, 0, sizeof a4);
                    memset(d4, 0, sizeof d4);
                    memset(m4, 0, sizeof m4);
                }
                const uint16_t *bt0 = j->packed + (size_t)tb0 * j->n_steps * ITEM;
                const size_t bstride = 0;
                for (int64_t s0 = 0; s0 < j->n_steps; s0 += 4) {
                    const int n4 = j->n_steps - s0 < 4 ? (int)(j->n_steps - s0) : 4;
                    for (int r = 0; r < nr; r++) {
                        const uint8_t *row = w + (size_t)r * j->row_bytes;
                        for (int q = 0; q < n4; q++)
                            _mm512_store_si512(a4[q] + r * KSTEP, codes32(type, row, s0 + q, &d4[q][r], &m4[q][r]));
                    }
                    const uint16_t *bt = bt0 + (size_t)s0 * ITEM;
                    _tile_loadd(4, a4[0], 64);
                    SC_STEP(0);
                    if (n4 > 1) {
                        _tile_loadd(5, a4[1], 64);
                        bt += ITEM;
                        SC_STEP_A(1, 5);
                    }
                    if (n4 > 2) {
                        _tile_loadd(4, a4[2], 64);
                        bt += ITEM;
                        SC_STEP(2);
                    }
                    if (n4 > 3) {
                        _tile_loadd(5, a4[3], 64);
                        bt += ITEM;
                        SC_STEP_A(3, 5);
                    }
                    for (int q = 0; q < n4; q++)
                        scale_acc(type, acc[0], sbuf[q], d4[q], m4[q], (const float *)(bt0 + (size_t)(s0 + q) * ITEM + TILE_BYTES));
                }
            } else
            for (int64_t s = 0; s < j->n_steps; s++) {
                for (int r = 0; r < nr; r++)
                    _mm512_store_si512(abuf + r * KSTEP, codes32(type, w + (size_t)r * j->row_bytes, s, &dbuf[r], &mbuf[r]));
                _tile_loadd(4, abuf, 64);
                const uint16_t *bt = local;
                size_t bstride = ITEM;
                if (j->packed) {
                    bt = j->packed + ((size_t)tb0 * j->n_steps + s) * ITEM;
                    bstride = (size_t)j->n_steps * ITEM;
                } else {
                    for (int b = 0; b < nb; b++) pack_tile(j->x, j->cols, j->n_tok, tb0 + b, s, local + b * ITEM);
                }
                SC_STEP(0);
                if (nb > 1) SC_STEP(1);
                if (nb > 2) SC_STEP(2);
                if (nb > 3) SC_STEP(3);
                for (int b = 0; b < nb; b++)
                    scale_acc(type, acc[b], sbuf[b], dbuf, mbuf, (const float *)(bt + (size_t)b * bstride + TILE_BYTES));
            }
            for (int b = 0; b < nb; b++) {
                int t0 = (tb0 + b) * TOK;
                for (int i = 0; i < TOK && t0 + i < j->n_tok; i++)
                    for (int r = 0; r < nr; r++) j->y[(size_t)(t0 + i) * j->rows + r0 + r] = acc[b][r][i];
            }
        }
    }
    _tile_release();
}

#define ROWS_SCALED_FN(name, type)                                                                  \
    static void name(void *arg, int64_t b0, int64_t b1, int thread) {                               \
        (void)thread;                                                                               \
        rows_scaled_impl(arg, b0, b1, type);                                                        \
    }

#define ROWS_FN(name, type)                                                                         \
    static void name(void *arg, int64_t b0, int64_t b1, int thread) {                               \
        (void)thread;                                                                               \
        rows_impl(arg, b0, b1, type);                                                               \
    }
ROWS_SCALED_FN(rows_q4_0, QUILL_TYPE_Q4_0)
ROWS_SCALED_FN(rows_q8_0, QUILL_TYPE_Q8_0)
ROWS_SCALED_FN(rows_q4_K, QUILL_TYPE_Q4_K)
ROWS_FN(rows_q6_K, QUILL_TYPE_Q6_K)

static quill_task_fn rows_fn(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q4_0: return rows_q4_0;
    case QUILL_TYPE_Q8_0: return rows_q8_0;
    case QUILL_TYPE_Q4_K: return rows_q4_K;
    case QUILL_TYPE_Q6_K: return rows_q6_K;
    default: return NULL;
    }
}

/* ---------------------------------------------------------------- the matmul entry point */

/* Tokens at a time: bounds the packed activations (64 tokens x 5632 cols = 1.4 MB). */
#define TOK_CHUNK 64

int quill_amx_test_unpacked;

static void amx_matmul(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                       const float *x, int n_tok, float *y, quill_pool *pool) {
    const int64_t n_steps = cols / KSTEP;
    const int n_threads = pool ? quill_pool_size(pool) : 1;
    const int chunk = n_tok < TOK_CHUNK ? n_tok : TOK_CHUNK;
    const size_t bytes = (size_t)((chunk + TOK - 1) / TOK) * (size_t)n_steps * ITEM * sizeof(uint16_t);
    /* without memory for the packed activations, the same arithmetic packs them tile by tile */
    uint16_t *packed = quill_amx_test_unpacked ? NULL : aligned_alloc(64, bytes);
    for (int t0 = 0; t0 < n_tok; t0 += TOK_CHUNK) {
        int nt = n_tok - t0 < TOK_CHUNK ? n_tok - t0 : TOK_CHUNK;
        const float *xc = x + (size_t)t0 * cols;
        if (packed) {
            pack_job pj = {xc, cols, n_steps, nt, packed};
            int64_t n_items = (int64_t)((nt + TOK - 1) / TOK) * n_steps, grain = n_items / (n_threads * 4);
            if (pool) quill_pool_run(pool, pack_items, &pj, n_items, grain < 1 ? 1 : grain);
            else pack_items(&pj, 0, n_items, 0);
        }
        rows_job rj = {w, row_bytes, rows, cols, n_steps, nt, xc, packed, y + (size_t)t0 * rows};
        int64_t n_blk = (rows + ROWS - 1) / ROWS, grain = n_blk / (n_threads * 8);
        if (pool) quill_pool_run(pool, rows_fn(type), &rj, n_blk, grain < 1 ? 1 : grain);
        else rows_fn(type)(&rj, 0, n_blk, 0);
    }
    free(packed);
}

#define MATMUL_FN(name, type)                                                                       \
    static void name(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,   \
                     int n_tok, float *y, quill_pool *pool) {                                       \
        amx_matmul(type, w, row_bytes, rows, cols, x, n_tok, y, pool);                              \
    }
MATMUL_FN(matmul_q4_0, QUILL_TYPE_Q4_0)
MATMUL_FN(matmul_q8_0, QUILL_TYPE_Q8_0)
MATMUL_FN(matmul_q4_K, QUILL_TYPE_Q4_K)
MATMUL_FN(matmul_q6_K, QUILL_TYPE_Q6_K)

void quill_amx_unpack_row(uint32_t type, const void *row, float *out, int64_t n) {
    if (type != QUILL_TYPE_Q6_K) return;
    for (int64_t c0 = 0; c0 < n / KSTEP; c0 += CHUNK)
        convert_row(QUILL_TYPE_Q6_K, row, c0, CHUNK, NULL, 0, out + c0 * KSTEP);
}

/* ---------------------------------------------------------------- detection */

static quill_kernels amx_table;
static bool amx_ok;

static void amx_init(void) {
    unsigned a, b, c, d;
    __builtin_cpu_init();
    if (!quill_kernels_for("avx512")) return;
    /* CPUID.(7,0).EDX: AMX-BF16 (22), AMX-TILE (24), AMX-INT8 (25); CPUID.(7,1).EAX: AVX512-BF16 (5) */
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return;
    const unsigned need = (1u << 22) | (1u << 24) | (1u << 25);
    if ((d & need) != need) return;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d) || !(a & (1u << 5))) return;
    /* the kernel must let this process use the 8 KiB of tile data state */
    if (syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) != 0) return;
    amx_table = quill_kernels_avx512_table;
    amx_table.isa = "amx";
    amx_table.matmul[QUILL_TYPE_Q4_0] = matmul_q4_0;
    amx_table.matmul[QUILL_TYPE_Q8_0] = matmul_q8_0;
    amx_table.matmul[QUILL_TYPE_Q4_K] = matmul_q4_K;
    amx_table.matmul[QUILL_TYPE_Q6_K] = matmul_q6_K;
    amx_ok = true;
}

const quill_kernels *quill_kernels_amx(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, amx_init);
    return amx_ok ? &amx_table : NULL;
}
#else
const quill_kernels *quill_kernels_amx(void) { return NULL; }
#endif
