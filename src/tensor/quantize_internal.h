/* The row quantizers quantize.c dispatches to from other files: each turns n_blocks blocks of
 * floats into the type's bytes, as the reference quantizer (without an importance matrix) does. */
#ifndef QUILL_QUANTIZE_INTERNAL_H
#define QUILL_QUANTIZE_INTERNAL_H

#include <stdint.h>

void quill_quant_q1_0(const float *x, uint8_t *dst, int64_t n_blocks);
void quill_quant_q2_0(const float *x, uint8_t *dst, int64_t n_blocks);
void quill_quant_mxfp4(const float *x, uint8_t *dst, int64_t n_blocks);
void quill_quant_tq1_0(const float *x, uint8_t *dst, int64_t n_blocks);
void quill_quant_tq2_0(const float *x, uint8_t *dst, int64_t n_blocks);

#endif
