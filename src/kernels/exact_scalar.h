/* The exact integer products in plain C (exact_scalar.c): the definition of their bits, which
 * every instruction set's kernels reproduce and are tested against. Portable; slow. */
#ifndef QUILL_EXACT_SCALAR_H
#define QUILL_EXACT_SCALAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether `type` has exact products (q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K). */
bool quill_exact_supported(uint32_t type);
/* One block of 32 activations to the codes a of a product with `type` weights (integers of at
 * most 8 significant bits, |a| <= act_max(type) <= 32512), their scale *da and Σa. */
void quill_exact_quantize_block(const float *x, uint32_t type, int16_t *a, float *da, int32_t *sum);
/* y[t * rows + r] = W[r] · x[t] for r < rows, t < n_tok, one (row, token) at a time. False (and y
 * untouched) when the type has no exact product or memory runs out. */
bool quill_exact_matmul_model(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                              const float *x, int n_tok, float *y);

#endif
