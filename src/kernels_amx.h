/* Internals of the AMX kernels (kernels_amx.c) that its tests reach. */
#ifndef QUILL_KERNELS_AMX_H
#define QUILL_KERNELS_AMX_H

#include <stdint.h>

/* Unpacks a q6_K row of n elements (a multiple of 256) to f32 the way the AMX product does; it
 * must equal to_float bit for bit. (The other types enter the tile unit as exact integer codes.) */
void quill_amx_unpack_row(uint32_t type, const void *row, float *out, int64_t n);
/* Tests set this to take the path used when the packed activations cannot be allocated. */
extern int quill_amx_test_unpacked;

#endif
