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

#endif
