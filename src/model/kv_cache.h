/* The KV cache's element types (-ctk / -ctv): how one position of one KV head is stored, rounded
 * and read back.
 *
 * Every type keeps the cache's layout (context.h): a head's keys in blocks of KEY_BLOCK positions,
 * dimension-major, its values position-major. A position of a head takes `row` bytes,
 * quill_row_size(type, head_dim), in both, so a key block is KEY_BLOCK rows' bytes:
 *   f32, f16, bf16  keys [dim][KEY_BLOCK] elements; values [pos][dim]
 *   q8_0            keys: codes int8 [dim][KEY_BLOCK], then the f16 scales [dim / 32][KEY_BLOCK];
 *                   values: each position's row of q8_0 blocks, as in a file
 *   q4_0            keys: levels [dim / 2][KEY_BLOCK] bytes, dimension 2i in the low nibble and
 *                   2i + 1 in the high one (so that a position's bytes are its own: tokens are
 *                   stored in parallel), then the f16 scales [dim / 32][KEY_BLOCK]; values: q4_0 rows
 * Attention decodes a key block, or a run of value rows, to f32 (a scratch tile) and reads it with
 * the f32 kernels: the scores and sums are those of an f32 cache holding the rounded values. */
#ifndef QUILL_KV_CACHE_H
#define QUILL_KV_CACHE_H

#include "kernels/kernels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether quill stores a cache in this type. */
bool quill_kv_type_ok(uint32_t type);

/* Bytes of one position of one head of head_dim elements. */
size_t quill_kv_row_bytes(uint32_t type, int64_t head_dim);

/* Stores key k[0..hd) at position `slot` (< KEY_BLOCK) of a key block. */
void quill_kv_store_key(uint32_t type, uint8_t *block, int slot, const float *k, int64_t hd);
/* Stores value v[0..hd) into its row. */
void quill_kv_store_value(uint32_t type, uint8_t *row, const float *v, int64_t hd);

/* A key block as f32 [hd][KEY_BLOCK]: the block itself for f32, else decoded into tile. */
const float *quill_kv_key_block(const quill_kernels *k, uint32_t type, const uint8_t *block, int64_t hd, float *tile);
/* n value rows as f32 [n][hd]: the rows themselves for f32, else decoded into tile. */
const float *quill_kv_value_rows(const quill_kernels *k, uint32_t type, const uint8_t *rows, int n, int64_t hd,
                                 float *tile);

/* x[0..hd) in double rounded as the cache of `type` stores it (to float first; f32 keeps the
 * doubles as they are): the float64 reference pass's model of the cache. */
void quill_kv_round_double(uint32_t type, double *x, int64_t hd);

/* The reference CPU cache's rounding of 32 values to q8_0 (its AVX path: d = max|x| / 127 stored as
 * f16, codes rint(x · 127 / max|x|), half to even): d's f16 bits and the codes. */
void quill_kv_quantize_q8_0(const float *x, uint16_t *d, int8_t *q);

#endif
