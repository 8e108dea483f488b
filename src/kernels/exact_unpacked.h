/* The unpacking kernels: exact products for the types whose rows exact_unpack.c turns into codes
 * and slot scales (type list rows with exact = 2). Per row tile, each chunk of UNPACK_COLS columns
 * is unpacked once and serves every token of the pass; per slot the integer sum C = Σq·a is exact
 * (act_max keeps it below 2^24) whatever the vector width that forms it, and the f32 steps
 * acc = fma(C, s·da, acc) (and fma(-m, da·Σa, acc) for minimums) run slot after slot as in
 * exact_scalar.c: the model's bits, for any batch and thread count.
 *
 * An instruction-set file defines `static inline int32_t slot_dot(const int8_t *q, const int16_t
 * *a, int width)` (Σ q[i]·a[i] for i < width, width 16 or 32), `static inline void
 * slot_dots8(q, a, width, int32_t C[8])` (the sums of 8 consecutive slots: a set may reduce them
 * together, one transposing reduction rather than eight horizontal sums), and `static inline
 * quill_exact_unpack_fn unpack_fast(uint32_t type)` (a vector unpacker of the type, writing the
 * same codes and scales as exact_unpack.c's, or NULL), and then instantiates
 * QUILL_UNPACKED_KERNELS(sfx), which defines unpacked_matmul_<sfx>_<type> for every such type and
 * install_unpacked_<sfx>(k). */
#ifndef QUILL_EXACT_UNPACKED_H
#define QUILL_EXACT_UNPACKED_H

#include "base/threadpool.h"
#include "kernels/kernels.h"
#include "kernels/kernels_exact.h"

typedef struct {
    uint32_t type;
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    int n_tok;           /* tokens of this pass */
    const int16_t *a;    /* [n_tok][cols] activation codes */
    const float *da;     /* [n_tok][cols / 32] their scales */
    const int32_t *sums; /* [n_tok][cols / 16] their sums per 16 columns (the minimums' term) */
    float *y;            /* the pass's first token's outputs: y[t · rows + r] */
} unpacked_job;

typedef struct {
    uint32_t type;
    const float *x;
    int64_t cols;
    int16_t *a;
    float *da;
    int32_t *sums;
} unpacked_acts;

static void unpacked_quantize_tokens(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const unpacked_acts *A = ctx;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t b = 0; b < A->cols / 32; b++) {
            int32_t sum;
            int16_t *a = A->a + t * A->cols + b * 32;
            A->da[t * (A->cols / 32) + b] = quantize_block(A->x + t * A->cols + b * 32, A->type, a, &sum);
            int32_t *half = A->sums + t * (A->cols / 16) + 2 * b;
            half[0] = half[1] = 0;
            for (int i = 0; i < 32; i++) half[i / 16] += a[i];
        }
}

/* Slot i's f32 steps, as exact_scalar.c's: fma(C, s·da, acc), then the minimum's term. */
static inline __attribute__((always_inline)) float unpacked_step(uint32_t type, float at, int32_t C, int i, int kb,
                                                                 const float *s, const float *mins, const float *da,
                                                                 const int32_t *sums) {
    at = fmaf((float)C, s[i] * da[i * kb / 32], at);
    if (has_min(type)) {
        const int32_t sum = kb == 16 ? sums[i] : sums[2 * i] + sums[2 * i + 1];
        at = fmaf(-mins[i], da[i * kb / 32] * (float)sum, at);
    }
    return at;
}

#define QUILL_UNPACKED_ROWS_(sfx)                                                                    \
    static inline __attribute__((always_inline)) void unpacked_rows_##sfx(const unpacked_job *j, int64_t r0, \
                                                                          int64_t r1) {              \
        int8_t q[UNPACK_COLS];                                                                       \
        float s[UNPACK_COLS / 16], mins[UNPACK_COLS / 16], acc[UNPACK_TOKENS];                       \
        const int kb = slot_width(j->type), per = block_elems(j->type);                              \
        const quill_exact_unpack_fn unpack =                                                         \
            unpack_fast(j->type) ? unpack_fast(j->type) : quill_exact_unpack_for(j->type);           \
        for (int64_t r = r0; r < r1; r++) {                                                          \
            const uint8_t *row = j->w + (size_t)r * j->row_bytes;                                    \
            for (int t = 0; t < j->n_tok; t++) acc[t] = 0;                                           \
            for (int64_t k0 = 0; k0 < j->cols; k0 += UNPACK_COLS) {                                  \
                const int n = j->cols - k0 < UNPACK_COLS ? (int)(j->cols - k0) : UNPACK_COLS;        \
                unpack(row + (size_t)(k0 / per) * block_bytes(j->type), n, q, s, mins);              \
                for (int t = 0; t < j->n_tok; t++) {                                                 \
                    const int16_t *a = j->a + (size_t)t * (size_t)j->cols + k0;                      \
                    const float *da = j->da + (size_t)t * (size_t)(j->cols / 32) + k0 / 32;          \
                    const int32_t *sums = j->sums + (size_t)t * (size_t)(j->cols / 16) + k0 / 16;    \
                    float at = acc[t];                                                               \
                    int i = 0;                                                                       \
                    for (; i + 8 <= n / kb; i += 8) {                                                \
                        int32_t C[8];                                                                \
                        slot_dots8(q + i * kb, a + i * kb, kb, C);                                   \
                        for (int u = 0; u < 8; u++)                                                  \
                            at = unpacked_step(j->type, at, C[u], i + u, kb, s, mins, da, sums);     \
                    }                                                                                \
                    for (; i < n / kb; i++)                                                          \
                        at = unpacked_step(j->type, at, slot_dot(q + i * kb, a + i * kb, kb), i, kb, s, mins, da, sums); \
                    acc[t] = at;                                                                     \
                }                                                                                    \
            }                                                                                        \
            for (int t = 0; t < j->n_tok; t++) j->y[(size_t)t * (size_t)j->rows + (size_t)r] = acc[t]; \
        }                                                                                            \
    }

#define QUILL_UNPACKED_TASK_(sfx, ID)                                                                \
    static void unpacked_task_##sfx##_##ID(void *ctx, int64_t r0, int64_t r1, int thread) {          \
        (void)thread;                                                                                \
        const unpacked_job *j = ctx;                                                                 \
        unpacked_rows_##sfx(&(unpacked_job){QUILL_TYPE_##ID, j->w, j->row_bytes, j->rows, j->cols,   \
                                            j->n_tok, j->a, j->da, j->sums, j->y},                   \
                            r0, r1);                                                                 \
    }

/* Each matrix's rows as one task list; tokens in passes of UNPACK_TOKENS. */
static inline void unpacked_matmul(uint32_t type, quill_task_fn task, const quill_matrix *m, int n_mats,
                                   int64_t cols, const float *x, int n_tok, quill_pool *pool, void *scratch) {
    uint8_t *base = (uint8_t *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    const int pass = n_tok < UNPACK_TOKENS ? n_tok : UNPACK_TOKENS;
    int16_t *a = (int16_t *)base;
    float *da = (float *)(base + (size_t)pass * (size_t)cols * sizeof(int16_t));
    int32_t *sums = (int32_t *)(da + (size_t)pass * (size_t)(cols / 32));
    for (int t0 = 0; t0 < n_tok; t0 += UNPACK_TOKENS) {
        const int nt = n_tok - t0 < UNPACK_TOKENS ? n_tok - t0 : UNPACK_TOKENS;
        unpacked_acts A = {type, x + (size_t)t0 * (size_t)cols, cols, a, da, sums};
        if (nt == 1) unpacked_quantize_tokens(&A, 0, 1, 0);
        else quill_pool_run(pool, unpacked_quantize_tokens, &A, nt, 1);
        unpacked_job jobs[QUILL_MATMUL_MAX_MATS];
        quill_pool_task tasks[QUILL_MATMUL_MAX_MATS];
        for (int i = 0; i < n_mats; i++) {
            jobs[i] = (unpacked_job){type, m[i].w, m[i].row_bytes, m[i].rows, cols, nt, a, da, sums,
                                     m[i].y + (size_t)t0 * (size_t)m[i].rows};
            tasks[i] = (quill_pool_task){task, &jobs[i], m[i].rows};
        }
        quill_pool_run_joined(pool, tasks, n_mats, 8);
    }
}

#define QUILL_UNPACKED_MATMUL_(sfx, ID)                                                              \
    QUILL_UNPACKED_TASK_(sfx, ID)                                                                    \
    static void unpacked_matmul_##sfx##_##ID(const quill_matrix *m, int n_mats, int64_t cols, const float *x, \
                                             int n_tok, quill_pool *pool, void *scratch) {          \
        unpacked_matmul(QUILL_TYPE_##ID, unpacked_task_##sfx##_##ID, m, n_mats, cols, x, n_tok, pool, scratch); \
    }

#endif
