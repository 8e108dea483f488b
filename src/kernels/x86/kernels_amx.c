/* The amx set's batches: activations as bf16 codes in the tile unit's operand layout, weight codes
 * unpacked into tiles, and the tile loop (exact_avx512.h describes the sets). One token goes to the
 * vector unit's decoding loop. */
#include "kernels/x86/exact_avx512.h"

#if defined(__x86_64__)

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

TYPED_TASKS(tiles, TILES_TASK, TILES_CASE)


/* ---------------------------------------------------------------- the matmul entry point */

static size_t amx_scratch(int64_t cols, int n_tok) {
    size_t a = acts_bytes(cols, n_tok), p = planes_bytes(cols), u = unpacked_scratch(cols, n_tok);
    a = a > p ? a : p;
    return a > u ? a : u; /* the low-bit types keep the avx512 set's unpacking kernels */
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
            tasks[i] = (quill_pool_task){quill_avx512_decode_fn(type), &dj[i], (m[i].rows + TR - 1) / TR};
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

#define MATMUL_AMX(sfx, ID) QUILL_MATMUL_OF_TYPE(matmul_amx_##sfx, amx_matmul, QUILL_TYPE_##ID)
#define INSTALL_AMX(sfx, ID) k->matmul[QUILL_TYPE_##ID] = matmul_amx_##sfx;
QUILL_EXACT_TYPES(MATMUL_AMX)

/* kernels.c calls this on CPUs with the features, over a copy of the avx512 set. */
void quill_kernels_install_amx(quill_kernels *k) {
    k->matmul_scratch = amx_scratch;
    QUILL_EXACT_TYPES(INSTALL_AMX)
}
#endif
