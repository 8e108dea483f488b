/* Exact-integer matrix products on AVX2 (kernels_avx2_exact.c): the arithmetic of the AMX / VNNI
 * kernels, bit for bit, for CPUs without AVX-512. One quill_matmul_fn per type. */
#ifndef QUILL_KERNELS_AVX2_EXACT_H
#define QUILL_KERNELS_AVX2_EXACT_H

#include "kernels/kernels.h"

#define QUILL_AVX2_EXACT_MATMUL(sfx)                                                                 \
    void quill_avx2_exact_matmul_##sfx(const quill_matrix *m, int n_mats, int64_t cols, const float *x, \
                                       int n_tok, struct quill_pool *pool, void *scratch)
QUILL_AVX2_EXACT_MATMUL(q4_0);
QUILL_AVX2_EXACT_MATMUL(q4_1);
QUILL_AVX2_EXACT_MATMUL(q5_0);
QUILL_AVX2_EXACT_MATMUL(q5_1);
QUILL_AVX2_EXACT_MATMUL(q8_0);
QUILL_AVX2_EXACT_MATMUL(q4_K);
QUILL_AVX2_EXACT_MATMUL(q5_K);
QUILL_AVX2_EXACT_MATMUL(q6_K);

/* Bytes of scratch the products above need (the table's matmul_scratch). */
size_t quill_avx2_exact_scratch(int64_t cols, int n_tok);

/* The products and their scratch as designated initializers of a quill_kernels table (the avx2
 * and avx512 sets both run them). */
#define QUILL_AVX2_EXACT_PRODUCTS                                                                    \
    .matmul = {[QUILL_TYPE_Q4_0] = quill_avx2_exact_matmul_q4_0, [QUILL_TYPE_Q4_1] = quill_avx2_exact_matmul_q4_1, \
               [QUILL_TYPE_Q5_0] = quill_avx2_exact_matmul_q5_0, [QUILL_TYPE_Q5_1] = quill_avx2_exact_matmul_q5_1, \
               [QUILL_TYPE_Q8_0] = quill_avx2_exact_matmul_q8_0, [QUILL_TYPE_Q4_K] = quill_avx2_exact_matmul_q4_K, \
               [QUILL_TYPE_Q5_K] = quill_avx2_exact_matmul_q5_K, [QUILL_TYPE_Q6_K] = quill_avx2_exact_matmul_q6_K}, \
    .matmul_scratch = quill_avx2_exact_scratch

#endif
