/* The entries that the avx2 and avx512 files both provide, listed once: each file defines static
 * functions of these names (the first five with its suffix) and installs them with this macro. */
#ifndef QUILL_KERNELS_SIMD_H
#define QUILL_KERNELS_SIMD_H

#include "kernels/kernels.h"

#define QUILL_INSTALL_SIMD(k, sfx)                                                                   \
    do {                                                                                             \
        (k)->dot = dot_##sfx;                                                                        \
        (k)->weighted_sum = weighted_sum_##sfx;                                                      \
        (k)->dot_columns = dot_columns_##sfx;                                                        \
        (k)->softmax = softmax_##sfx;                                                                \
        (k)->swiglu = swiglu_##sfx;                                                                  \
        (k)->dequant[QUILL_TYPE_F16] = dequant_f16;                                                  \
        (k)->dequant[QUILL_TYPE_BF16] = dequant_bf16;                                                \
        (k)->dequant[QUILL_TYPE_Q4_0] = dequant_q4_0;                                                \
        (k)->dequant[QUILL_TYPE_Q4_1] = dequant_q4_1;                                                \
        (k)->dequant[QUILL_TYPE_Q5_0] = dequant_q5_0;                                                \
        (k)->dequant[QUILL_TYPE_Q5_1] = dequant_q5_1;                                                \
        (k)->dequant[QUILL_TYPE_Q8_0] = dequant_q8_0;                                                \
        (k)->dequant[QUILL_TYPE_Q2_K] = dequant_q2_K;                                                \
        (k)->dequant[QUILL_TYPE_Q3_K] = dequant_q3_K;                                                \
        (k)->dequant[QUILL_TYPE_Q4_K] = dequant_q4_K;                                                \
        (k)->dequant[QUILL_TYPE_Q5_K] = dequant_q5_K;                                                \
        (k)->dequant[QUILL_TYPE_Q6_K] = dequant_q6_K;                                                \
        (k)->dequant[QUILL_TYPE_IQ4_NL] = dequant_iq4_nl;                                            \
        (k)->dequant[QUILL_TYPE_IQ4_XS] = dequant_iq4_xs;                                            \
        (k)->vec_dot[QUILL_TYPE_Q4_0] = vec_dot_q4_0;                                                \
        (k)->vec_dot[QUILL_TYPE_Q8_0] = vec_dot_q8_0;                                                \
        (k)->vec_dot[QUILL_TYPE_Q4_K] = vec_dot_q4_K;                                                \
        (k)->vec_dot[QUILL_TYPE_Q6_K] = vec_dot_q6_K;                                                \
    } while (0)

/* dot_columns' loop over a KV head's query heads, for nv vectors of columns from column p: heads
 * four at a time, then the other one to three together (a group of 6, as Qwen2's, is 4 + 2).
 * heads(hb, nv, tail, last, ...) is the set's kernel for hb heads of nv vectors, mask_t the type
 * of its last vector's lane mask, which only a tail (a part-filled last vector) applies: AVX2's
 * masked loads stay masked even with every lane on, and cost more than plain ones. */
#define QUILL_COLUMN_VECTORS(mask_t, heads)                                                          \
    static inline __attribute__((always_inline)) void column_vectors(                                \
        const int nv, const bool tail, mask_t last, const float *q, int64_t q_stride, int n_heads,   \
        const float *kt, int64_t n, int64_t stride, int p, float *out, int64_t out_stride) {         \
        int h = 0;                                                                                   \
        for (; h + 4 <= n_heads; h += 4)                                                             \
            heads(4, nv, tail, last, q + h * q_stride, q_stride, kt, n, stride, p, out + h * out_stride, \
                  out_stride);                                                                       \
        const float *qh = q + h * q_stride;                                                          \
        float *oh = out + h * out_stride;                                                            \
        switch (n_heads - h) {                                                                       \
        case 3: heads(3, nv, tail, last, qh, q_stride, kt, n, stride, p, oh, out_stride); break;     \
        case 2: heads(2, nv, tail, last, qh, q_stride, kt, n, stride, p, oh, out_stride); break;     \
        case 1: heads(1, nv, tail, last, qh, q_stride, kt, n, stride, p, oh, out_stride); break;     \
        default: break;                                                                              \
        }                                                                                            \
    }

#endif
