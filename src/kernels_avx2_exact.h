/* Exact-integer matrix products on AVX2 (kernels_avx2_exact.c): the arithmetic of the AMX / VNNI
 * kernels, bit for bit, for CPUs without AVX-512. */
#ifndef QUILL_KERNELS_AVX2_EXACT_H
#define QUILL_KERNELS_AVX2_EXACT_H

#include "kernels.h"

void quill_avx2_exact_matmul_q4_0(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,
                                  int n_tok, float *y, struct quill_pool *pool, void *scratch);
void quill_avx2_exact_matmul_q4_1(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,
                                  int n_tok, float *y, struct quill_pool *pool, void *scratch);
void quill_avx2_exact_matmul_q8_0(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,
                                  int n_tok, float *y, struct quill_pool *pool, void *scratch);
void quill_avx2_exact_matmul_q4_K(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,
                                  int n_tok, float *y, struct quill_pool *pool, void *scratch);
void quill_avx2_exact_matmul_q6_K(const void *w, size_t row_bytes, int64_t rows, int64_t cols, const float *x,
                                  int n_tok, float *y, struct quill_pool *pool, void *scratch);
/* Bytes of scratch the products above need (the table's matmul_scratch). */
size_t quill_avx2_exact_scratch(int64_t cols, int n_tok);

#endif
