/* The recurrent layers' kernels on AVX2: the Gated DeltaNet delta rule (kernels.h defines its
 * arithmetic; the scalar set in kernels.c gives the same bits). */
#include "kernels/kernels.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>

/* The 8 chains of a dot product added 4, 2, 1 apart. */
static inline float sum_chains(__m256 p) {
    const __m128 a = _mm_add_ps(_mm256_castps256_ps128(p), _mm256_extractf128_ps(p, 1));
    const __m128 b = _mm_add_ps(a, _mm_movehl_ps(a, a));
    return _mm_cvtss_f32(_mm_add_ss(b, _mm_shuffle_ps(b, b, 1)));
}

/* ROWS consecutive rows (from j) through all the tokens: the rows stay in L1 while the tokens'
 * k and q stream by, the row update of one token feeding the next. The rows' chains are
 * independent, which hides the latency of the fused multiply-adds; k and q are loaded once for
 * all of them. The decayed row is computed twice (for the dot with k, then for the update) rather
 * than stored in between: the same product, the same bits. */
#define ROWS_KERNEL(ROWS)                                                                                              \
    static void rows##ROWS(float *state, int64_t s, int64_t j, int n_tok, const float *q, const float *k,            \
                           int64_t qk_stride, const float *v, int64_t v_stride, const float *decay, const float *beta,  \
                           int64_t gate_stride, float scale, float *out, int64_t out_stride) {                        \
        float *row[ROWS];                                                                                              \
        for (int r = 0; r < ROWS; r++) row[r] = state + (j + r) * s;                                                   \
        for (int t = 0; t < n_tok; t++) {                                                                              \
            const float *kt = k + t * qk_stride, *qt = q + t * qk_stride;                                              \
            const __m256 g = _mm256_set1_ps(decay[t * gate_stride]);                                                   \
            __m256 acc[ROWS];                                                                                          \
            for (int r = 0; r < ROWS; r++) acc[r] = _mm256_setzero_ps();                                               \
            for (int64_t i = 0; i < s; i += 8) {                                                                       \
                const __m256 kv = _mm256_loadu_ps(kt + i);                                                             \
                for (int r = 0; r < ROWS; r++)                                                                         \
                    acc[r] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(row[r] + i), g), kv, acc[r]);               \
            }                                                                                                          \
            __m256 delta[ROWS];                                                                                        \
            for (int r = 0; r < ROWS; r++) {                                                                           \
                delta[r] = _mm256_set1_ps((v[t * v_stride + j + r] - sum_chains(acc[r])) * beta[t * gate_stride]);     \
                acc[r] = _mm256_setzero_ps();                                                                          \
            }                                                                                                          \
            for (int64_t i = 0; i < s; i += 8) {                                                                       \
                const __m256 kv = _mm256_loadu_ps(kt + i), qv = _mm256_loadu_ps(qt + i);                               \
                for (int r = 0; r < ROWS; r++) {                                                                       \
                    const __m256 x =                                                                                   \
                        _mm256_fmadd_ps(kv, delta[r], _mm256_mul_ps(_mm256_loadu_ps(row[r] + i), g));                  \
                    _mm256_storeu_ps(row[r] + i, x);                                                                   \
                    acc[r] = _mm256_fmadd_ps(x, qv, acc[r]);                                                           \
                }                                                                                                      \
            }                                                                                                          \
            for (int r = 0; r < ROWS; r++) out[t * out_stride + j + r] = sum_chains(acc[r]) * scale;                   \
        }                                                                                                              \
    }
ROWS_KERNEL(4)
ROWS_KERNEL(1)

/* Rows ahead of the ones computing whose lines are prefetched. */
#define PREFETCH_ROWS 16

static void delta_rule_rows(float *state, int64_t s, int n_tok, const float *q, const float *k, int64_t qk_stride,
                            const float *v, int64_t v_stride, const float *decay, const float *beta,
                            int64_t gate_stride, float scale, float *out, int64_t out_stride) {
    if (s % 8) {   /* state sizes that are not a multiple of 8: the plain kernel, the same bits */
        quill_delta_rule_scalar(state, s, n_tok, q, k, qk_stride, v, v_stride, decay, beta, gate_stride, scale, out,
                                out_stride);
        return;
    }
    int64_t j = 0;
    for (; j + 4 <= s; j += 4) {
        /* Decoding reads each row once per token, from memory (a layer's states, 2 MiB for 32
         * heads of 128, are evicted by the weights streamed between two tokens): the rows
         * PREFETCH_ROWS ahead are asked for while these compute. */
        if (j + PREFETCH_ROWS + 4 <= s)
            for (int64_t i = 0; i < 4 * s; i += 16) _mm_prefetch((const char *)(state + (j + PREFETCH_ROWS) * s + i), _MM_HINT_T0);
        rows4(state, s, j, n_tok, q, k, qk_stride, v, v_stride, decay, beta, gate_stride, scale, out, out_stride);
    }
    for (; j < s; j++)
        rows1(state, s, j, n_tok, q, k, qk_stride, v, v_stride, decay, beta, gate_stride, scale, out, out_stride);
}

void quill_kernels_install_recurrent_avx2(quill_kernels *k) { k->delta_rule = delta_rule_rows; }
#endif
