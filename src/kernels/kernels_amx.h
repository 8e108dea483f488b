/* Internals of the AMX kernels (kernels_amx.c) that its tests reach. */
#ifndef QUILL_KERNELS_AMX_H
#define QUILL_KERNELS_AMX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One block of 32 activations to the codes a of a product with `type` weights (integers of at
 * most 8 significant bits, |a| <= act_max(type) <= 32512), their scale *da and Σa. */
void quill_amx_quantize_block(const float *x, uint32_t type, int16_t *a, float *da, int32_t *sum);
/* The AMX product computed by plain C, one (row, token) at a time with the same arithmetic: it
 * must give the same bits as the tile kernels. Portable; slow. */
void quill_amx_matmul_model(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                            const float *x, int n_tok, float *y);

#endif
