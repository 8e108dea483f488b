/* The vnni set: decoding (one token) and batches on the vector unit by VNNI byte products, from the
 * file's rows or from the load-time layout (kernels_vnni_pack.c); exact_avx512.h describes the
 * sets. */
#include "kernels/x86/exact_avx512.h"
#include "kernels/exact_unpacked.h"
#include "kernels/vnni16_types.h"

#if defined(__x86_64__)

/* q2_K and q3_K: types of the unpacking kernels (exact = 2) that this set also decodes and runs in
 * batches from the file's rows (exact_avx512.h: codes64, lowbit_lane_sums, lowbit_scales; slots of
 * 16 as q6_K's) when they are not packed (kernels_vnni_pack.c), QUILL_REPACK=0: the unpacking
 * kernels' scalar unpacking and per-slot sums made a q2_K token ~15x slower than the f32 product
 * they replaced. The same bits as the model's. */
#define FILE_DECODED_LOWBIT(M) M(q2_K, Q2_K) M(q3_K, Q3_K)
#define TYPED_TASKS_LOWBIT(prefix, TASK, CASE)                                                       \
    QUILL_EXACT_TYPES(TASK)                                                                          \
    FILE_DECODED_LOWBIT(TASK)                                                                        \
    static quill_task_fn prefix##_fn(uint32_t type) {                                                \
        switch (type) {                                                                              \
        QUILL_EXACT_TYPES(CASE)                                                                      \
        FILE_DECODED_LOWBIT(CASE)                                                                    \
        default: return NULL;                                                                        \
        }                                                                                            \
    }

TYPED_TASKS_LOWBIT(decode, DECODE_TASK, DECODE_CASE)

quill_task_fn quill_avx512_decode_fn(uint32_t type) { return decode_fn(type); }


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

TYPED_TASKS_LOWBIT(gemm, GEMM_TASK, GEMM_CASE)

#include "kernels/x86/unpack_simd.h"

/* The batch loop for the types of the unpacking kernels (exact = 2): gemm_impl's, with each row's
 * codes from its unpacker (u = q + code_bias: 128, mxfp4's 12) and its slot scales put in rows-in-lanes
 * order. The unpacking kernels' per-token horizontal sums took pp512 of a qwen3moe-shaped IQ3_M
 * file to 0.5x the reference's. */
static inline __attribute__((always_inline)) void gemm_unpacked_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                                     uint32_t type) {
    const int kb = slot_width(type), per = block_elems(type);
    const quill_exact_unpack_fn unpack = unpack_fast(type) ? unpack_fast(type) : quill_exact_unpack_for(type);
    _Alignas(64) int8_t rowbuf[TR][CW];
    _Alignas(64) __m512i wbuf[CW / 4], wbuf16[CW / 2];
    _Alignas(64) float sbuf[CW / 16][TR], mbuf[CW / 16][TR];
    _Alignas(64) float accbuf[VNNI_TOKENS + TBW][TR];
    float srow[CW / 16], mrow[CW / 16];
    const __m512i row_at = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                              _mm512_set1_epi32(CW));
    const __m256i bias = _mm256_set1_epi8((char)code_bias(type));
    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t r0 = tile * TR;
        const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
        const uint8_t *w0 = j->w + (size_t)r0 * j->row_bytes;
        memset(accbuf, 0, (size_t)(j->n_tok + TBW) * sizeof accbuf[0]);
        for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
            const int cw = j->cols - k0 < CW ? (int)(j->cols - k0) : CW;
            /* rows past the matrix repeat its first row: their lanes are computed and never stored */
            for (int r = 0; r < TR; r++) {
                const uint8_t *row = w0 + (size_t)(r < nr ? r : 0) * j->row_bytes;
                unpack(row + (size_t)(k0 / per) * block_bytes(type), cw, rowbuf[r], srow, mrow);
                for (int i = 0; i < cw; i += 32) {
                    __m256i *at = (__m256i *)(rowbuf[r] + i);
                    _mm256_store_si256(at, _mm256_add_epi8(_mm256_load_si256(at), bias));
                }
                for (int i = 0; i < cw / kb; i++) {
                    sbuf[i][r] = srow[i];
                    if (has_min(type)) mbuf[i][r] = mrow[i];
                }
            }
            for (int g = 0; g < cw / 4; g++) wbuf[g] = _mm512_i32gather_epi32(row_at, rowbuf[0] + 4 * g, 1);
            gemm_chunk_any(j, type, k0, cw, wbuf, wbuf16, sbuf, mbuf, accbuf);
        }
        for (int t = 0; t < j->n_tok; t++)
            _mm512_mask_storeu_ps(j->y + (size_t)t * (size_t)j->rows + r0, (__mmask16)((1u << nr) - 1),
                                  _mm512_load_ps(accbuf[t]));
    }
}
#define GEMM_UNPACKED_TASK(sfx, ID) TYPED_TASK(gemm_unpacked, gemm_unpacked_impl, sfx, QUILL_TYPE_##ID)
#define GEMM_UNPACKED_CASE(sfx, ID) case QUILL_TYPE_##ID: return gemm_unpacked_##sfx;
QUILL_UNPACKED_EXACT_TYPES(GEMM_UNPACKED_TASK)
static quill_task_fn gemm_unpacked_fn(uint32_t type) {
    switch (type) {
    QUILL_UNPACKED_EXACT_TYPES(GEMM_UNPACKED_CASE)
    default: return NULL;
    }
}

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
    const size_t planes = (size_t)pass * planes_bytes(cols) + (pass >= WORD_TOKENS ? word_acts_bytes(cols, pass) : 0);
    const size_t unpacked = unpacked_scratch(cols, n_tok);
    return planes > unpacked ? planes : unpacked;
}

/* ---------------------------------------------------------------- the unpacking kernels (exact_unpacked.h) */

static inline int32_t slot_dot(const int8_t *q, const int16_t *a, int width) {
    if (width == 32)
        return _mm512_reduce_add_epi32(_mm512_madd_epi16(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)q)),
                                                         _mm512_loadu_si512(a)));
    const __m256i p = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)),
                                        _mm256_loadu_si256((const __m256i *)a));
    return _mm512_reduce_add_epi32(_mm512_zextsi256_si512(p));
}
static inline void slot_dots8(const int8_t *q, const int16_t *a, int width, int32_t C[8]) {
    for (int u = 0; u < 8; u++) C[u] = slot_dot(q + u * width, a + u * width, width);
}
QUILL_UNPACKED_ROWS_(vnni)
#define UNPACKED_MATMUL(tsfx, ID) QUILL_UNPACKED_MATMUL_(vnni, ID)
#define INSTALL_UNPACKED(sfx, ID) k->matmul[QUILL_TYPE_##ID] = matmul_unpacked_##sfx;
QUILL_UNPACKED_EXACT_TYPES(UNPACKED_MATMUL)

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
        const bool by_words = nt >= WORD_TOKENS && word_products(type);
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
            const quill_task_fn few = packed ? quill_vnni_few_packed_fn(type, nt) : NULL;
            quill_task_fn fn = few                ? few
                               : packed           ? (nt == 1 ? quill_vnni_decode_packed_fn(type) : quill_vnni_gemm_packed_fn(type))
                                                  : (nt == 1 ? decode_fn(type) : gemm_fn(type));
            if (!fn) fn = gemm_unpacked_fn(type); /* the unpacking kernels' types, in batches */
            /* packed q4_0 and mxfp4 decode a group of tiles at a time (nibble_group), one token or a few */
            const int per_item = (nt == 1 || few) && packed ? quill_vnni_pack_group(type) : 1;
            const int64_t tiles = (m[i].rows + TR - 1) / TR;
            tasks[i] = (quill_pool_task){fn, &dj[i], (tiles + per_item - 1) / per_item};
        }
        int64_t grain = 1;
        if ((nt == 1 || quill_vnni_few_packed_fn(type, nt)) && packed) {
            grain = (int64_t)(DECODE_CLAIM / (quill_vnni_packed_tile_bytes(type, cols) * (size_t)quill_vnni_pack_group(type)));
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

#define MATMUL_VNNI(sfx, ID) QUILL_MATMUL_OF_TYPE(matmul_vnni_##sfx, vnni_matmul, QUILL_TYPE_##ID)
#define INSTALL_VNNI(sfx, ID) k->matmul[QUILL_TYPE_##ID] = matmul_vnni_##sfx;
QUILL_EXACT_TYPES(MATMUL_VNNI)
FILE_DECODED_LOWBIT(MATMUL_VNNI)
/* The unpacking kernels' types: one token by the unpacking kernel (each row unpacked once, for the
 * one token), batches by the batch loop above. */
#define MATMUL_UNPACKED(sfx, ID)                                                                     \
    static void matmul_unpacked_##sfx(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok, \
                                      quill_pool *pool, void *scratch) {                             \
        if (n_tok == 1) unpacked_matmul_vnni_##ID(m, n_mats, cols, x, n_tok, pool, scratch);         \
        else vnni_matmul(QUILL_TYPE_##ID, m, n_mats, cols, x, n_tok, pool, scratch);                 \
    }
QUILL_UNPACKED_EXACT_TYPES(MATMUL_UNPACKED)
/* The types the vnni16 layout serves on this set (pack_vnni16.h's list). */
#define VNNI_PACKED_TYPES(M) VNNI16_TYPES(M)
#define MATMUL_PACKED(sfx, ID) QUILL_MATMUL_OF_TYPE(matmul_packed_##sfx, vnni_matmul_packed, QUILL_TYPE_##ID)
#define INSTALL_PACKED(sfx, ID) k->matmul_packed[QUILL_TYPE_##ID] = matmul_packed_##sfx;
VNNI_PACKED_TYPES(MATMUL_PACKED)

/* ---------------------------------------------------------------- installation (kernels.c
 * calls these on CPUs with the features, over a copy of the avx512 set) */

void quill_kernels_install_vnni(quill_kernels *k) {
    k->matmul_scratch = vnni_scratch;
    QUILL_EXACT_TYPES(INSTALL_VNNI)
    QUILL_UNPACKED_EXACT_TYPES(INSTALL_UNPACKED)
    FILE_DECODED_LOWBIT(INSTALL_VNNI)
    k->packed_layout = "vnni16";
    k->pack_bytes = quill_vnni_pack_bytes;
    k->pack = quill_vnni_pack;
    VNNI_PACKED_TYPES(INSTALL_PACKED)
}


#endif
