/* Block layouts of the quantized types, shared by the dequantizers (types.c) and the dot-product
 * kernels. They mirror the bytes in GGUF files exactly, so every struct is checked against the
 * block size in the type table; all multi-byte fields are little-endian, as is every host quill
 * supports. */
#ifndef QUILL_TYPES_INTERNAL_H
#define QUILL_TYPES_INTERNAL_H

#include "quill.h"
#include "tensor/type_list.h"

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
#define QK1_0 128
#define QK2_0 64
#define QK_MXFP4 32
#define QK_NVFP4 64
#define QK_NVFP4_SUB 16

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

/* 1 bit per weight: +d when set, -d when clear. */
typedef struct { quill_half d; uint8_t qs[QK1_0 / 8]; } block_q1_0;
/* 2 bits per weight: (q - 1) * d, so -d, 0, d or 2d. */
typedef struct { quill_half d; uint8_t qs[QK2_0 / 4]; } block_q2_0;
/* An E8M0 power of two shared by 32 E2M1 (fp4) nibbles. */
typedef struct { uint8_t e; uint8_t qs[QK_MXFP4 / 2]; } block_mxfp4;
/* Four UE4M3 scales, one per 16 weights, then 32 bytes of E2M1 nibbles. */
typedef struct { uint8_t d[QK_NVFP4 / QK_NVFP4_SUB]; uint8_t qs[QK_NVFP4 / 2]; } block_nvfp4;

/* Ternary weights (-1, 0, 1) times d: tq1_0 packs five trits per byte of qs as a base-3 fraction
 * of 256, and four per byte of qh; tq2_0 keeps two bits per weight. d ends the block. */
typedef struct {
    uint8_t qs[(QK_K - 4 * QK_K / 64) / 5];
    uint8_t qh[QK_K / 64];
    quill_half d;
} block_tq1_0;
typedef struct { uint8_t qs[QK_K / 4]; quill_half d; } block_tq2_0;

/* The i-quants: weights come in groups of 8 (4 for iq3's grid halves), each group an index into
 * a table of lattice points (iq_grids.c) plus 8 sign bits (7 stored, the 8th makes the parity
 * even for iq2_xxs / iq2_xs / iq3_xxs), with a 4-bit scale per 16 or 32 weights. */
typedef struct { quill_half d; uint16_t qs[QK_K / 8]; } block_iq2_xxs;
typedef struct { quill_half d; uint16_t qs[QK_K / 8]; uint8_t scales[QK_K / 32]; } block_iq2_xs;
typedef struct {
    quill_half d;
    uint8_t qs[QK_K / 4]; /* 32 grid indices (low 8 bits), then 32 bytes of signs */
    uint8_t qh[QK_K / 32];
    uint8_t scales[QK_K / 32];
} block_iq2_s;
typedef struct { quill_half d; uint8_t qs[3 * QK_K / 8]; } block_iq3_xxs;
typedef struct {
    quill_half d;
    uint8_t qs[QK_K / 4];
    uint8_t qh[QK_K / 32];
    uint8_t signs[QK_K / 8];
    uint8_t scales[QK_K / 64];
} block_iq3_s;
typedef struct { quill_half d; uint8_t qs[QK_K / 8]; uint16_t qh[QK_K / 32]; } block_iq1_s;
/* No d field: the super-block's half scale is spread over the top nibbles of the four scale words. */
typedef struct { uint8_t qs[QK_K / 8]; uint8_t qh[QK_K / 16]; uint8_t scales[QK_K / 32]; } block_iq1_m;

_Static_assert(sizeof(block_q1_0) == 18, "block_q1_0 layout");
_Static_assert(sizeof(block_q2_0) == 18, "block_q2_0 layout");
_Static_assert(sizeof(block_mxfp4) == 17, "block_mxfp4 layout");
_Static_assert(sizeof(block_nvfp4) == 36, "block_nvfp4 layout");
_Static_assert(sizeof(block_tq1_0) == 54, "block_tq1_0 layout");
_Static_assert(sizeof(block_tq2_0) == 66, "block_tq2_0 layout");
_Static_assert(sizeof(block_iq2_xxs) == 66, "block_iq2_xxs layout");
_Static_assert(sizeof(block_iq2_xs) == 74, "block_iq2_xs layout");
_Static_assert(sizeof(block_iq2_s) == 82, "block_iq2_s layout");
_Static_assert(sizeof(block_iq3_xxs) == 98, "block_iq3_xxs layout");
_Static_assert(sizeof(block_iq3_s) == 110, "block_iq3_s layout");
_Static_assert(sizeof(block_iq1_s) == 50, "block_iq1_s layout");
_Static_assert(sizeof(block_iq1_m) == 56, "block_iq1_m layout");
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
/* The 16 E2M1 (fp4) values of mxfp4 and nvfp4, doubled so that they are integers. */
extern const int8_t quill_kvalues_fp4[16];

/* The i-quants' lattice points (iq_grids.c): byte j of entry i is the magnitude of weight j of
 * the group (iq1s: the signed value -1, 0 or 1). */
extern const uint64_t quill_iq2xxs_grid[256];
extern const uint64_t quill_iq2xs_grid[512];
extern const uint64_t quill_iq2s_grid[1024];
extern const uint32_t quill_iq3xxs_grid[256];
extern const uint32_t quill_iq3s_grid[512];
extern const uint64_t quill_iq1s_grid[2048];

/* The 8 sign bits of a group from its 7 stored ones: the 8th makes their count even. */
static inline uint8_t quill_iq_signs(uint32_t seven) {
    return (uint8_t)(seven | (uint32_t)(__builtin_parity(seven) << 7));
}

/* The E8M0 exponent e as the float 2^(e - 128): half the block scale, because the fp4 values
 * are kept doubled. e = 0 and 1 give subnormals; 255 (E8M0's NaN) gives 2^127, as the
 * reference's decoder does. */
static inline float quill_e8m0_half_to_float(uint8_t e) {
    uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

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

/* Every type's functions, declared from the type list: quill_to_float_<sfx> decodes n elements
 * (whole blocks) of a row, quill_from_float_<sfx> writes n_blocks blocks (types.c, types_lowbit.c,
 * quantize.c, quantize_lowbit.c define them). Only the rows whose flags say so define them. */
#define QUILL_DECLARE_TYPE_FNS(ctx, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)                   \
    void quill_to_float_##sfx(const void *src, float *y, int64_t n);                                     \
    void quill_from_float_##sfx(const float *x, uint8_t *dst, int64_t n_blocks);
QUILL_TYPE_LIST(QUILL_DECLARE_TYPE_FNS, )
#undef QUILL_DECLARE_TYPE_FNS

/* Builds iq3_s's lattice neighbour lists once (quantize_lowbit.c); false if they did not fit. */
bool quill_iq3s_ready(void);

/* rows x cols of random valid weights of `type`: random bytes, then in every block a finite scale of
 * at most 0.05 (and minimum) where the type keeps one; f32, f16, bf16: values in [-1, 1). For the
 * types quill does not quantize (the grid i-quants) the way the tests and `quill devices --selftest`
 * get weights of them. *state: an xorshift64 state (nonzero), advanced. */
void quill_random_rows(uint32_t type, uint8_t *out, int64_t rows, int64_t cols, uint64_t *state);

#endif
