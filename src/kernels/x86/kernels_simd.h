/* The entries that the avx2 and avx512 files both provide, listed once: each file defines static
 * functions of these names (the first five with its suffix) and installs them with this macro. */
#ifndef QUILL_KERNELS_SIMD_H
#define QUILL_KERNELS_SIMD_H

#include "kernels/kernels.h"
#include "tensor/type_list.h"

/* A type's vector kernels, as its row in the type list says (vector = 1: dequant_<sfx>; 2: and
 * vec_dot_<sfx>). */
#define QUILL_INSTALL_VECTOR_ROW_(k, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)    \
    QUILL_INSTALL_DEQUANT_##vector(k, ID, sfx) QUILL_INSTALL_VEC_DOT_##vector(k, ID, sfx)
#define QUILL_INSTALL_DEQUANT_0(k, ID, sfx)
#define QUILL_INSTALL_DEQUANT_1(k, ID, sfx) (k)->dequant[QUILL_TYPE_##ID] = dequant_##sfx;
#define QUILL_INSTALL_DEQUANT_2(k, ID, sfx) (k)->dequant[QUILL_TYPE_##ID] = dequant_##sfx;
#define QUILL_INSTALL_VEC_DOT_0(k, ID, sfx)
#define QUILL_INSTALL_VEC_DOT_1(k, ID, sfx)
#define QUILL_INSTALL_VEC_DOT_2(k, ID, sfx) (k)->vec_dot[QUILL_TYPE_##ID] = vec_dot_##sfx;

#define QUILL_INSTALL_SIMD(k, sfx)                                                                   \
    do {                                                                                             \
        (k)->dot = dot_##sfx;                                                                        \
        (k)->weighted_sum = weighted_sum_##sfx;                                                      \
        (k)->dot_columns = dot_columns_##sfx;                                                        \
        (k)->softmax = softmax_##sfx;                                                                \
        (k)->swiglu = swiglu_##sfx;                                                                  \
        (k)->key_block_q8_0 = key_block_q8_0_##sfx;                                                  \
        (k)->key_block_q4_0 = key_block_q4_0_##sfx;                                                  \
        (k)->dot_f64 = dot_f64_##sfx;                                                                \
        QUILL_TYPE_LIST(QUILL_INSTALL_VECTOR_ROW_, k)                                               \
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
