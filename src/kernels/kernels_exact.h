/* The arithmetic the exact integer products share (kernels_amx.c describes it; its
 * quill_amx_matmul_model defines the bits): the per-type facts and the activation codes. Static
 * inline, so that each kernel file compiles them for its own instruction set. */
#ifndef QUILL_KERNELS_EXACT_H
#define QUILL_KERNELS_EXACT_H

#include "tensor/types_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Activation codes are integers with at most 8 significant bits, so that each is exactly a bf16 value
 * and the tile unit's bf16 products add them exactly (see act_max); in magnitude at most act_max,
 * which never exceeds QMAX = 127·256, so that the two bytes of a code, a = 256·h + l, both fit a
 * signed byte for the vector unit's byte products. */
#define QMAX 32512

/* Width of the sub-blocks that share one scale: one tile product each. */
static inline int slot_width(uint32_t type) { return type == QUILL_TYPE_Q6_K ? 16 : 32; }

/* Types whose value subtracts a minimum per sub-block: value = s·q - m (q4_1 and q5_1 add theirs:
 * there m is the negated block minimum). */
static inline bool has_min(uint32_t type) {
    return type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K || type == QUILL_TYPE_Q4_1 || type == QUILL_TYPE_Q5_1;
}

/* The bias that makes a type's codes unsigned bytes (0 when they already are). */
static inline int code_bias(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q4_0: return 8;
    case QUILL_TYPE_Q5_0: return 16;
    case QUILL_TYPE_Q8_0: return 128;
    case QUILL_TYPE_Q6_K: return 32;
    default: return 0;
    }
}

/* The 32-element formats q4_0, q4_1, q5_0, q5_1: where a block keeps its 16 bytes of nibbles,
 * and where the 5-bit ones keep the 32 fifth bits (0: none). */
static inline size_t legacy_qs(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q4_0: return offsetof(block_q4_0, qs);
    case QUILL_TYPE_Q4_1: return offsetof(block_q4_1, qs);
    case QUILL_TYPE_Q5_0: return offsetof(block_q5_0, qs);
    case QUILL_TYPE_Q5_1: return offsetof(block_q5_1, qs);
    default: return 0;
    }
}

/* Bytes of one block (32 elements, or 256 for the k-quants): constants the compiler folds into
 * the unpacking loops, unlike a call to quill_row_size. */
static inline size_t block_bytes(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q4_0: return sizeof(block_q4_0);
    case QUILL_TYPE_Q4_1: return sizeof(block_q4_1);
    case QUILL_TYPE_Q5_0: return sizeof(block_q5_0);
    case QUILL_TYPE_Q5_1: return sizeof(block_q5_1);
    case QUILL_TYPE_Q8_0: return sizeof(block_q8_0);
    case QUILL_TYPE_Q4_K: return sizeof(block_q4_K);
    case QUILL_TYPE_Q5_K: return sizeof(block_q5_K);
    default: return sizeof(block_q6_K);
    }
}

static inline bool is_kquant(uint32_t type) {
    return type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K || type == QUILL_TYPE_Q6_K;
}

/* Elements per block: 256 for the k-quants, 32 for the others. */
static inline int block_elems(uint32_t type) { return is_kquant(type) ? 256 : 32; }

static inline size_t legacy_qh(uint32_t type) {
    return type == QUILL_TYPE_Q5_0 ? offsetof(block_q5_0, qh) : type == QUILL_TYPE_Q5_1 ? offsetof(block_q5_1, qh) : 0;
}

/* The largest activation code for a type's products. A sub-block's sum Σq·a must stay below 2^24
 * in magnitude, where every partial sum of f32 adds is an exact integer, whatever order the tile
 * unit adds its products in: slot_width · max|q| · act_max < 2^24. Each cap has at most 8
 * significant bits (127·2^k), so rounding a code to 8 bits never leaves the range. */
static inline int act_max(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q8_0: return 127 * 32;               /* 32 · 128 · 4064 = 16,646,144 */
    case QUILL_TYPE_Q5_1: case QUILL_TYPE_Q5_K: return 127 * 128; /* 32 · 31 · 16256 = 16,125,952 */
    default: return QMAX; /* q5_0: 32 · 16 · 32512 = 16,646,144, q6_K: 16 · 32 · 32512 the same */
    }
}

/* An integer (|v| < 2^24) rounded to 8 significant bits, to nearest, ties to even: the bf16
 * value nearest to it. */
static inline int32_t round_8_bits(int32_t v) {
    uint32_t u;
    float f = (float)v;
    memcpy(&u, &f, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    memcpy(&f, &u, 4);
    return (int32_t)f;
}

/* One block of 32 activations to codes for a product with weights of `type`: the nearest integers
 * to x · act_max / max|x|, then rounded to 8 significant bits; returns the scale da and sets
 * *sum = Σa. */
static inline float quantize_block(const float *x, uint32_t type, int16_t *a, int32_t *sum) {
    const int qa = act_max(type);
    float amax = 0;
    bool nan = false;
    for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[i])), nan |= isnan(x[i]);
    *sum = 0;
    if (!(amax > 0) || !isfinite(amax) || nan) {
        memset(a, 0, 32 * sizeof *a);
        return amax > 0 || nan ? NAN : 0; /* inf or nan in: nan out, as f32 math would (mostly) give */
    }
    const float id = (float)qa / amax;
    for (int i = 0; i < 32; i++) {
        float v = nearbyintf(x[i] * id);
        v = v > (float)qa ? (float)qa : v < -(float)qa ? -(float)qa : v;
        a[i] = (int16_t)round_8_bits((int32_t)v);
        *sum += a[i];
    }
    return amax / (float)qa;
}

static inline void split16(int16_t a, int8_t *h, int8_t *l) {
    *l = (int8_t)(a & 0xFF);
    *h = (int8_t)((a - *l) / 256);
}

#endif
