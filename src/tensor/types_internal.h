/* Block layouts of the quantized types, shared by the dequantizers (types.c) and the dot-product
 * kernels. They mirror the bytes in GGUF files exactly, so every struct is checked against the
 * block size in the type table; all multi-byte fields are little-endian, as is every host quill
 * supports. */
#ifndef QUILL_TYPES_INTERNAL_H
#define QUILL_TYPES_INTERNAL_H

#include "quill.h"

#include <stdint.h>
#include <string.h>

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12
#define QK4_NL 32

/* Halves are kept as raw bits: C11 has no portable half type. */
typedef uint16_t quill_half;

typedef struct { quill_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
typedef struct { quill_half d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
typedef struct { quill_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
typedef struct { quill_half d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
typedef struct { quill_half d; int8_t qs[QK8_0]; } block_q8_0;
/* s = d * sum(qs), precomputed by the quantizer for the q4_1/q5_1 dot products. */
typedef struct { quill_half d, s; int8_t qs[QK8_1]; } block_q8_1;

/* Super-blocks of 256: 16 sub-blocks of 16, 4-bit scale and 4-bit min each. */
typedef struct {
    uint8_t scales[QK_K / 16];
    uint8_t qs[QK_K / 4];
    quill_half d, dmin;
} block_q2_K;
/* 16 sub-blocks of 16; 6-bit scales packed in 12 bytes; the third bit of each weight is hmask. */
typedef struct {
    uint8_t hmask[QK_K / 8];
    uint8_t qs[QK_K / 4];
    uint8_t scales[12];
    quill_half d;
} block_q3_K;
/* 8 sub-blocks of 32; 6-bit scales and mins packed in 12 bytes (see quill_scale_min_k4). */
typedef struct {
    quill_half d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qs[QK_K / 2];
} block_q4_K;
typedef struct {
    quill_half d, dmin;
    uint8_t scales[K_SCALE_SIZE];
    uint8_t qh[QK_K / 8];
    uint8_t qs[QK_K / 2];
} block_q5_K;
/* 16 sub-blocks of 16 with signed 8-bit scales. */
typedef struct {
    uint8_t ql[QK_K / 2];
    uint8_t qh[QK_K / 4];
    int8_t scales[QK_K / 16];
    quill_half d;
} block_q6_K;
/* Activation format of the k-quant dot products; d is a full float here. */
typedef struct {
    float d;
    int8_t qs[QK_K];
    int16_t bsums[QK_K / 16];
} block_q8_K;

typedef struct { quill_half d; uint8_t qs[QK4_NL / 2]; } block_iq4_nl;
/* 8 sub-blocks of 32 with 6-bit scales: low 4 bits in scales_l, high 2 bits in scales_h. */
typedef struct {
    quill_half d;
    uint16_t scales_h;
    uint8_t scales_l[QK_K / 64];
    uint8_t qs[QK_K / 2];
} block_iq4_xs;

_Static_assert(sizeof(block_q4_0) == 18, "block_q4_0 layout");
_Static_assert(sizeof(block_q4_1) == 20, "block_q4_1 layout");
_Static_assert(sizeof(block_q5_0) == 22, "block_q5_0 layout");
_Static_assert(sizeof(block_q5_1) == 24, "block_q5_1 layout");
_Static_assert(sizeof(block_q8_0) == 34, "block_q8_0 layout");
_Static_assert(sizeof(block_q8_1) == 36, "block_q8_1 layout");
_Static_assert(sizeof(block_q2_K) == 84, "block_q2_K layout");
_Static_assert(sizeof(block_q3_K) == 110, "block_q3_K layout");
_Static_assert(sizeof(block_q4_K) == 144, "block_q4_K layout");
_Static_assert(sizeof(block_q5_K) == 176, "block_q5_K layout");
_Static_assert(sizeof(block_q6_K) == 210, "block_q6_K layout");
_Static_assert(sizeof(block_q8_K) == 292, "block_q8_K layout");
_Static_assert(sizeof(block_iq4_nl) == 18, "block_iq4_nl layout");
_Static_assert(sizeof(block_iq4_xs) == 136, "block_iq4_xs layout");

/* The 16 non-uniform levels of iq4_nl / iq4_xs. */
extern const int8_t quill_kvalues_iq4nl[16];

/* Sub-block j (0..7) of a q4_K / q5_K super-block: 6-bit scale and min. The first four keep both
 * in the low 6 bits of bytes 0..7; the last four borrow the top 2 bits of those bytes. */
static inline void quill_scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

/* q3_K's twelve scale bytes as sixteen signed 6-bit scales: the low 4 bits come from bytes 0..7
 * (low nibbles for 0..7, high nibbles for 8..15), the high 2 bits from bytes 8..11. */
static inline void quill_q3_K_scales(const uint8_t *s, int8_t out[16]) {
    for (int j = 0; j < 16; j++) {
        const int lo = j < 8 ? s[j] & 0xF : s[j - 8] >> 4;
        const int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
        out[j] = (int8_t)((lo | hi << 4) - 32);
    }
}

/* Exact half -> float by bit manipulation; hot loops use this inline copy. */
static inline float quill_half_to_float(quill_half h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1F;
    uint32_t mant = h & 0x3FF;
    uint32_t bits;
    if (exp == 0x1F) {
        /* inf or NaN: keep the payload so a round trip through float is the identity */
        bits = sign | 0x7F800000u | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + (127 - 15)) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else {
        /* subnormal half: normalise, every half subnormal is a normal float */
        int e = -1;
        do { mant <<= 1; e++; } while (!(mant & 0x400));
        bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline float quill_bfloat_to_float(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

#endif
