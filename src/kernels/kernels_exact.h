/* The arithmetic the exact integer products share (exact_scalar.c describes it and defines the
 * bits): the per-type facts and the activation codes. Static, so that each kernel file compiles
 * them for its own instruction set. */
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

/* How a type's blocks keep the scales of their sub-blocks. */
typedef enum {
    EXACT_SCALE_D,    /* one half d at the start of each block (q4_0, q5_0, q8_0) */
    EXACT_SCALE_D_M,  /* d, then the block minimum (q4_1, q5_1) */
    EXACT_SCALE_K4,   /* d, dmin, then 12 bytes of 6-bit scales and minimums (q4_K, q5_K) */
    EXACT_SCALE_Q6_K, /* 16 signed 8-bit scales, then d, at the end of the block */
    EXACT_SCALE_UNPACKED, /* the type's quill_exact_unpack_<sfx> gives codes and scales (exact = 2) */
} exact_scale_layout;

/* What the exact integer products need to know of one weight type: its row in the type list
 * (tensor/type_list.h) with exact = 1, whose EXACT(...) facts fill the fields after the block's
 * size. A type with slot_width 0 has no exact product. Read with a constant type (every kernel is
 * instantiated per type), each field is a constant the compiler folds into the unpacking loops,
 * as a call to quill_row_size is not. */
typedef struct {
    int block_elems;   /* elements per block: 32, or 256 for the k-quants */
    int block_bytes;
    int slot_width;    /* elements of a sub-block, which share one scale: a tile product each */
    int code_bias;     /* what makes the type's codes unsigned bytes (0 when they already are; mxfp4's
                        * 12 serves the vnni set's packed layout, whose codes are fp4 values + 12; the
                        * other types of the unpacking kernels: 128, for the vnni set's batch loop) */
    int act_max;       /* the largest activation code for its products: see below */
    bool has_min;      /* value = s·q - m per sub-block (q4_1 and q5_1 add theirs: m is the negated minimum) */
    exact_scale_layout scales;
    int qs, qh;        /* the 32-element 4/5-bit formats: where a block keeps its 16 bytes of nibbles,
                        * and its 32 fifth bits (0: none) */
} exact_type;

/* The largest activation code: a sub-block's sum Σq·a must stay below 2^24 in magnitude, where
 * every partial sum of f32 adds is an exact integer, whatever order the tile unit adds its products
 * in: slot_width · max|q| · act_max < 2^24. Each cap has at most 8 significant bits (127·2^k), so
 * rounding a code to 8 bits never leaves the range.
 *   q8_0: 32 · 128 · 4064 = 16,646,144; iq4_nl, iq4_xs (levels down to -127): 32 · 127 · 4064; q5_1, q5_K: 32 · 31 · 16256 = 16,125,952;
 *   q5_0: 32 · 16 · 32512 = 16,646,144; q6_K: 16 · 32 · 32512, the same;
 *   q4_0, q4_1, q4_K: at most 32 · 15 · 32512 = 15,605,760. */
#define EXACT(slot, bias, amax, min, layout, qs_at, qh_at)                                                 \
    .slot_width = slot, .code_bias = bias, .act_max = amax, .has_min = min, .scales = layout, .qs = qs_at, \
    .qh = qh_at
#define EXACT_ANY_0(...)
#define EXACT_ANY_1(...) __VA_ARGS__
#define EXACT_ANY_2(...) __VA_ARGS__
#define EXACT_ROW(ctx, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)                                  \
    EXACT_ANY_##exact([QUILL_TYPE_##ID] = {.block_elems = block, .block_bytes = (int)(bytes), facts}, )
static const exact_type exact_types[QUILL_TYPE_COUNT] = {QUILL_TYPE_LIST(EXACT_ROW, )};
#undef EXACT_ROW
#undef EXACT

/* Every exact type's instantiation of a kernel: QUILL_EXACT_TYPES(M) expands M(sfx, ID) once per
 * row of the type list with exact = 1, so that the kernel files' per-type functions and install
 * tables follow the list. */
#define QUILL_EXACT_KERNELS_0(...)
#define QUILL_EXACT_KERNELS_1(...) __VA_ARGS__
#define QUILL_EXACT_KERNELS_2(...)
#define QUILL_EXACT_TYPE_ROW_(M, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)               \
    QUILL_EXACT_KERNELS_##exact(M(sfx, ID))
#define QUILL_EXACT_TYPES(M) QUILL_TYPE_LIST(QUILL_EXACT_TYPE_ROW_, M)

/* The same for the rows with exact = 2, which the unpacking kernels serve: UNPACKED(M) expands
 * M(sfx, ID) for each. */
#define QUILL_UNPACKED_0(...)
#define QUILL_UNPACKED_1(...)
#define QUILL_UNPACKED_2(...) __VA_ARGS__
#define QUILL_UNPACKED_TYPE_ROW_(M, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)            \
    QUILL_UNPACKED_##exact(M(sfx, ID))
#define QUILL_UNPACKED_EXACT_TYPES(M) QUILL_TYPE_LIST(QUILL_UNPACKED_TYPE_ROW_, M)

/* The unpacking kernels' view of a row (exact = 2): the signed integer codes q of columns
 * [0, n) (n whole blocks, from the block at `row`) and the scale of each slot of slot_width
 * columns, and for the types with minimums (q2_K) the minimum m of each slot, such that the weight
 * is s·q - m (m untouched for the others); the exact products then sum Σq·a per slot exactly and
 * add fma(C, s·da, acc) slot after slot, and fma(-m, da·Σa, acc) with Σa the slot's activation
 * codes' sum, as exact_scalar.c defines. */
typedef void (*quill_exact_unpack_fn)(const uint8_t *row, int64_t n, int8_t *q, float *s, float *m);
/* The f16 at p (a block's scale, at any alignment), as f32: the unpackers' d. */
static inline float half_at(const uint8_t *p) {
    quill_half h;
    memcpy(&h, p, 2);
    return quill_half_to_float(h);
}
/* iq4_xs's scale of sub-block ib (32 columns) of the block at row: d·(ls - 32), its 6-bit ls's 4
 * low bits in scales_l and 2 high ones in scales_h. */
static inline float iq4_xs_sub_scale(const uint8_t *row, int ib) {
    const block_iq4_xs *blk = (const block_iq4_xs *)row;
    uint16_t scales_h;
    memcpy(&scales_h, row + offsetof(block_iq4_xs, scales_h), 2);
    const int ls = ((blk->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | ((scales_h >> 2 * ib) & 3) << 4;
    return half_at(row + offsetof(block_iq4_xs, d)) * (float)(ls - 32);
}
#define QUILL_DECLARE_UNPACK_(sfx, ID)                                                               \
    void quill_exact_unpack_##sfx(const uint8_t *row, int64_t n, int8_t *q, float *s, float *m);
QUILL_UNPACKED_EXACT_TYPES(QUILL_DECLARE_UNPACK_)
#undef QUILL_DECLARE_UNPACK_
/* The unpacker of a type, or NULL (exact_unpack.c). */
quill_exact_unpack_fn quill_exact_unpack_for(uint32_t type);
static inline bool exact_unpacked(uint32_t type) {
    return type < QUILL_TYPE_COUNT && exact_types[type].scales == EXACT_SCALE_UNPACKED && exact_types[type].slot_width;
}

/* Columns an unpacking kernel unpacks at a time (a multiple of every block size), and tokens per
 * pass over a matrix: its scratch holds a pass's activation codes, their scales per 32 columns and
 * their sums per 16 (the minimums' term). */
#define UNPACK_COLS 2048
#define UNPACK_TOKENS 64
static inline size_t unpacked_scratch(int64_t cols, int n_tok) {
    const size_t pass = (size_t)(n_tok < UNPACK_TOKENS ? n_tok : UNPACK_TOKENS);
    return pass * ((size_t)cols * sizeof(int16_t) + (size_t)(cols / 32) * sizeof(float) +
                   (size_t)(cols / 16) * sizeof(int32_t)) +
           64;
}
/* Whether a type has exact products (the facts below are only defined for those). */
static inline bool exact_supported(uint32_t type) { return type < QUILL_TYPE_COUNT && exact_types[type].slot_width; }

/* Short names for the facts, as the kernels read them. */
static inline int slot_width(uint32_t type) { return exact_types[type].slot_width; }
static inline bool has_min(uint32_t type) { return exact_types[type].has_min; }
static inline int code_bias(uint32_t type) { return exact_types[type].code_bias; }
static inline size_t legacy_qs(uint32_t type) { return (size_t)exact_types[type].qs; }
static inline size_t legacy_qh(uint32_t type) { return (size_t)exact_types[type].qh; }
static inline size_t block_bytes(uint32_t type) { return (size_t)exact_types[type].block_bytes; }
static inline int block_elems(uint32_t type) { return exact_types[type].block_elems; }
static inline bool is_kquant(uint32_t type) { return exact_types[type].block_elems == 256; }
static inline int act_max(uint32_t type) { return exact_types[type].act_max; }

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
