/* The whole-matrix products of float weights (f32, f16, bf16) on avx2 and avx512: the part the two
 * instruction-set files share. Each defines FLOAT_ROWS and `static inline void float_panels(const
 * float_job *j, int64_t p0, int64_t p1, uint32_t type)` (panels [p0, p1) of FLOAT_ROWS rows: the
 * bits of dequantize + its dot for every row and token), then instantiates
 * QUILL_FLOAT_PRODUCTS(), which defines float_matmul_f32, _f16 and _bf16 (quill_matmul_fn: each
 * matrix's panels one parallel loop) and QUILL_INSTALL_FLOAT_PRODUCTS(k). */
#ifndef QUILL_FLOAT_PRODUCTS_H
#define QUILL_FLOAT_PRODUCTS_H

#include "base/threadpool.h"
#include "kernels/kernels.h"

typedef struct {
    uint32_t type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    const float *x; /* [n_tok][cols] */
    int n_tok;
    float *y;       /* y[t · rows + r] */
} float_job;

/* Bytes of one weight of a float type. */
static inline int64_t float_elem_bytes(uint32_t type) { return type == QUILL_TYPE_F32 ? 4 : 2; }

/* Asks for the cache lines of [from, from + bytes) that lie before `end`: the rows a panel reads
 * next, fetched as one run at the pace it reads its own (a panel's rows are runs of a few KiB, too
 * short for the hardware prefetchers: one token's product waited on them 82 % of its time). */
static inline __attribute__((always_inline)) void float_prefetch(const uint8_t *from, size_t bytes, const uint8_t *end) {
    for (size_t at = 0; at < bytes; at += 64)
        if (from + at < end) __builtin_prefetch(from + at, 0, 3);
}

#define QUILL_FLOAT_PRODUCT_(sfx, ID)                                                                \
    static void float_panels_##sfx(void *ctx, int64_t p0, int64_t p1, int thread) {                  \
        (void)thread;                                                                                \
        float_panels(ctx, p0, p1, QUILL_TYPE_##ID);                                                  \
    }                                                                                                \
    static void float_matmul_##sfx(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok, \
                                   quill_pool *pool, void *scratch) {                                \
        (void)scratch;                                                                               \
        float_job jobs[QUILL_MATMUL_MAX_MATS];                                                       \
        quill_pool_task tasks[QUILL_MATMUL_MAX_MATS];                                                \
        for (int i = 0; i < n_mats; i++) {                                                           \
            jobs[i] = (float_job){QUILL_TYPE_##ID, m[i].w, m[i].row_bytes, m[i].rows, cols, x, n_tok, m[i].y}; \
            tasks[i] = (quill_pool_task){float_panels_##sfx, &jobs[i], (m[i].rows + FLOAT_ROWS - 1) / FLOAT_ROWS}; \
        }                                                                                            \
        quill_pool_run_joined(pool, tasks, n_mats, 4);                                               \
    }

#define QUILL_FLOAT_PRODUCTS()                                                                       \
    QUILL_FLOAT_PRODUCT_(f32, F32)                                                                   \
    QUILL_FLOAT_PRODUCT_(f16, F16)                                                                   \
    QUILL_FLOAT_PRODUCT_(bf16, BF16)

#define QUILL_INSTALL_FLOAT_PRODUCTS(k)                                                              \
    do {                                                                                             \
        (k)->matmul[QUILL_TYPE_F32] = float_matmul_f32;                                              \
        (k)->matmul[QUILL_TYPE_F16] = float_matmul_f16;                                              \
        (k)->matmul[QUILL_TYPE_BF16] = float_matmul_bf16;                                            \
    } while (0)

#endif
