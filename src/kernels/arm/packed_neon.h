/* The aarch64 sets' exact products from the load-time layout (pack_vnni16.h), which the x86 sets
 * share: included by kernels_dotprod.c and kernels_i8mm.c after exact_neon.h, whose activations,
 * tile job and matmul driver it uses.
 *
 * Why a layout: from the file's rows a tile of 4 rows is 4 strided streams, each block unpacked to
 * memory and read back, and every slot's four rows end in horizontal adds. In the layout a 64-byte
 * register holds 4 columns of 16 rows, so a 16-byte NEON load is 4 columns of 4 rows, row r in
 * 32-bit lane r: sdot by lane multiplies it by the same 4 activation bytes for all 4 rows and adds
 * into each row's own lane. A tile of 16 rows is 4 such quads, their codes unpacked in registers
 * from the nibbles and their scales read side by side. A token's products take 1.7-3.7x fewer
 * instructions than from the file's rows (10-26x for the types those unpack in scalar code;
 * bench/README.md); speed is not measured here (no aarch64 machine), only bits.
 *
 * Arithmetic: the model's (exact_scalar.c), as exact_neon.h's: per slot C = 256·Σq·h + Σq·l with
 * signed codes q (the layout's unsigned ones less their bias, q8_0's flipped back), exact in 32
 * bits; then acc = fma(C, s·da, acc) and, for the types with minimums, fma(-m, da·Σa, acc), slot
 * after slot in column order, one row per lane. The bits of the file-row products. */
#ifndef QUILL_PACKED_NEON_H
#define QUILL_PACKED_NEON_H

#include "kernels/pack_vnni16.h"

#if PACKED_SMMLA && !ACTS_INTERLEAVED
#error "smmla takes a token's 8 h and 8 l bytes as one operand: the interleaved activations"
#endif

#define PK_QUADS (PACK_TR / 4) /* 4-row NEON registers in a 16-row tile */
#define PK_AI inline __attribute__((always_inline))

/* The types packed on aarch64: every type of the layout (the x86 sets' list, with the 32-column
 * formats only the avx2 sets pack there); the ternary and 1/2-bit q types keep the file's rows
 * (exact_neon.h). The table types' nibbles (mxfp4, iq4, the grid i-quants) become codes by one
 * table lookup (tbl). */
#define NEON_PACKED_TYPES(M) VNNI16_TYPES(M) M(q4_1, Q4_1) M(q5_0, Q5_0) M(q5_1, Q5_1)
static inline bool neon_packed_type(uint32_t type) { return packed_type(type) || legacy_packed(type); }

/* sdot by lane: the lane must be a constant, which the unrolled loops make it */
static PK_AI int32x4_t sdot_lane(int32x4_t acc, int8x16_t w, int8x16_t a, int lane) {
    switch (lane) {
    case 0: return vdotq_laneq_s32(acc, w, a, 0);
    case 1: return vdotq_laneq_s32(acc, w, a, 1);
    case 2: return vdotq_laneq_s32(acc, w, a, 2);
    default: return vdotq_laneq_s32(acc, w, a, 3);
    }
}

/* A token's activation bytes of 16 columns from col, as two registers; group gg (columns col + 4gg
 * .. + 3) finds its 4 h bytes in register H_REG(gg), lane H_LANE(gg), its l bytes likewise. */
typedef struct {
    int8x16_t x[2];
} act16;
static PK_AI act16 acts16(const acts *A, int64_t cols, int64_t col) {
#if ACTS_INTERLEAVED /* per 8 columns their h bytes, then their l bytes */
    (void)cols;
    return (act16){{vld1q_s8(A->hl + 2 * col), vld1q_s8(A->hl + 2 * col + 16)}};
#else /* the h bytes in column order, then the l bytes */
    return (act16){{vld1q_s8(A->hl + col), vld1q_s8(A->hl + cols + col)}};
#endif
}
#if ACTS_INTERLEAVED
#define H_REG(gg) ((gg) / 2)
#define H_LANE(gg) ((gg) % 2)
#define L_REG(gg) ((gg) / 2)
#define L_LANE(gg) (2 + (gg) % 2)
#else
#define H_REG(gg) 0
#define H_LANE(gg) (gg)
#define L_REG(gg) 1
#define L_LANE(gg) (gg)
#endif

/* Rows 4qd..4qd + 3 of register `reg` of a packed range. */
static PK_AI uint8x16_t reg_quad(const uint8_t *base, int reg, int qd) {
    return vld1q_u8(base + (size_t)reg * 64 + 16 * (size_t)qd);
}

/* The fifth bits of q5_0 / q5_1 columns 4gb..4gb + 3 of a block (gb < 4: the low nibbles' columns
 * 4gb.., else 16 + 4(gb - 4)..), as 16 or 0 per byte: register 4 holds each row's 32-bit qh, whose
 * bit c is column c's. Each byte of a row's lane takes the qh byte that holds its column's bit. */
static PK_AI uint8x16_t fifth_bits(const uint8_t *base, int gb, int qd) {
    const int c0 = gb < 4 ? 4 * gb : 16 + 4 * (gb - 4);
    const uint8x16_t qh = reg_quad(base, 4, qd);
    static const uint8_t lane_base[16] = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 8, 12, 12, 12, 12};
    const uint8x16_t spread = vqtbl1q_u8(qh, vaddq_u8(vld1q_u8(lane_base), vdupq_n_u8((uint8_t)(c0 / 8))));
    const uint8x16_t bit = vreinterpretq_u8_u32(vdupq_n_u32(0x08040201u << (c0 % 8)));
    return vandq_u8(vtstq_u8(spread, bit), vdupq_n_u8(16));
}

/* The signed codes of group g (columns 4g..4g + 3) of slot sl, rows 4qd..4qd + 3: `base` is a
 * k-quant super-block's registers, or a 32-column block's code registers (sl: the slot in the
 * block, 0 or for slots of 16 also 1; its group gb of the block's 8). */
static PK_AI int8x16_t group_codes(uint32_t type, const uint8_t *base, int sl, int g, int qd) {
    const uint8x16_t low = vdupq_n_u8(0x0F);
    const int gb = sl * slot_width(type) / 4 + g;
    switch (type) {
    case QUILL_TYPE_Q4_0:
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1: { /* register gb % 4: columns 4gb.. in the low nibbles, 16 + 4gb.. in the high */
        const uint8x16_t v = reg_quad(base, gb % 4, qd);
        uint8x16_t u = gb < 4 ? vandq_u8(v, low) : vshrq_n_u8(v, 4);
        if (legacy_qh(type)) u = vorrq_u8(u, fifth_bits(base, gb, qd));
        return vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8((int8_t)code_bias(type)));
    }
    case QUILL_TYPE_Q8_0: /* q + 128 */
        return vreinterpretq_s8_u8(veorq_u8(reg_quad(base, gb, qd), vdupq_n_u8(0x80)));
    case QUILL_TYPE_Q2_K:
    case QUILL_TYPE_Q3_K: { /* slots of 16: byte j of the slot's register holds column 4g + j's code at
                             * bits 2g, 2g + 1; q3_K's u = q + 4 has its third bit at bit 4(sl % 2) + g
                             * of the pair of slots' third register */
        const bool q3 = type == QUILL_TYPE_Q3_K;
        const uint8x16_t v = reg_quad(base, q3 ? 4 + 3 * (sl / 2) + sl % 2 : 5 + sl, qd);
        uint8x16_t u = vandq_u8(vshlq_u8(v, vdupq_n_s8((int8_t)(-2 * g))), vdupq_n_u8(3));
        if (!q3) return vreinterpretq_s8_u8(u);
        const uint8x16_t third = reg_quad(base, 4 + 3 * (sl / 2) + 2, qd);
        u = vorrq_u8(u, vandq_u8(vshlq_u8(third, vdupq_n_s8((int8_t)(2 - 4 * (sl % 2) - g))), vdupq_n_u8(4)));
        return vsubq_s8(vreinterpretq_s8_u8(u), vdupq_n_s8(4));
    }
    case QUILL_TYPE_Q4_K:
    case QUILL_TYPE_Q5_K: { /* slot sl = 2c + hi of window c: its half h = g / 4, register g % 4 */
        const int c = sl / 2, hi = sl % 2, i = g % 4, reg = half_window_reg(type, c, g / 4);
        const uint8x16_t v = reg_quad(base, reg + i, qd);
        uint8x16_t u = hi ? vshrq_n_u8(v, 4) : vandq_u8(v, low);
        if (type == QUILL_TYPE_Q5_K) /* the fifth bit at bit 2i + hi of the half's fifth register */
            u = vorrq_u8(u, vandq_u8(vshlq_u8(reg_quad(base, reg + 4, qd), vdupq_n_s8((int8_t)(4 - 2 * i - hi))),
                                     vdupq_n_u8(0x10)));
        return vreinterpretq_s8_u8(u);
    }
    case QUILL_TYPE_Q6_K: { /* slots of 16: the low 4 bits of u = q + 32 in two nibble registers, the top 2 in a third */
        const uint8x16_t n = reg_quad(base, 5 + 3 * sl + (g & 1), qd), top = reg_quad(base, 5 + 3 * sl + 2, qd);
        const uint8x16_t nib = g < 2 ? vandq_u8(n, low) : vshrq_n_u8(n, 4);
        const uint8x16_t hi2 = vandq_u8(vshlq_u8(top, vdupq_n_s8((int8_t)(4 - 2 * g))), vdupq_n_u8(0x30));
        return vsubq_s8(vreinterpretq_s8_u8(vorrq_u8(nib, hi2)), vdupq_n_s8(32));
    }
    default: { /* the table types (mxfp4, iq4, grid i-quants): q4_0's nibbles, each its level's index */
        const uint8x16_t v = reg_quad(base, gb % 4, qd);
        return vqtbl1q_s8(vld1q_s8(nibble_levels(type)), gb < 4 ? vandq_u8(v, low) : vshrq_n_u8(v, 4));
    }
    }
}

/* f16 values in the low (high) 16 bits of each lane, as f32 */
static PK_AI float32x4_t halves_low(uint32x4_t v) { return vcvt_f32_f16(vreinterpret_f16_u16(vmovn_u32(v))); }
static PK_AI float32x4_t halves_high(uint32x4_t v) { return vcvt_f32_f16(vreinterpret_f16_u16(vshrn_n_u32(v, 16))); }
static PK_AI uint32x4_t field(uint32x4_t v, int shift, uint32_t mask) {
    return vandq_u32(vshlq_u32(v, vdupq_n_s32(-shift)), vdupq_n_u32(mask));
}

/* A k-quant super-block's slot scales s (and the minimums m of q2_K, q4_K, q5_K), slot sl of quad
 * qd at [sl · PK_QUADS + qd], as the unpackers make them: d·sc and dmin·m (quill_scale_min_k4),
 * q2_K's d·(4-bit scale) and dmin·(4-bit minimum), q3_K's d·(6-bit scale - 32), q6_K's d·scale. */
static PK_AI void kblock_scales(uint32_t type, const uint8_t *base, float32x4_t *s, float32x4_t *m) {
    for (int qd = 0; qd < PK_QUADS; qd++) {
        const uint32x4_t w0 = vreinterpretq_u32_u8(reg_quad(base, 0, qd)), w1 = vreinterpretq_u32_u8(reg_quad(base, 1, qd));
        const uint32x4_t w2 = vreinterpretq_u32_u8(reg_quad(base, 2, qd)), w3 = vreinterpretq_u32_u8(reg_quad(base, 3, qd));
        const uint32x4_t w[4] = {w0, w1, w2, w3};
        if (type == QUILL_TYPE_Q2_K) { /* 16 bytes of a 4-bit scale and a 4-bit minimum; d, dmin in register 4 */
            const uint32x4_t dm = vreinterpretq_u32_u8(reg_quad(base, 4, qd));
            const float32x4_t d = halves_low(dm), dmin = halves_high(dm);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                s[i * PK_QUADS + qd] = vmulq_f32(d, vcvtq_f32_u32(field(w[i / 4], 8 * (i % 4), 0xF)));
                m[i * PK_QUADS + qd] = vmulq_f32(dmin, vcvtq_f32_u32(field(w[i / 4], 8 * (i % 4) + 4, 0xF)));
            }
            continue;
        }
        if (type == QUILL_TYPE_Q3_K) { /* the 12 scale bytes from byte 2 of the 16 (quill_q3_K_scales), d after them */
            const float32x4_t d = halves_high(w3);
#pragma GCC unroll 16
            for (int i = 0; i < 16; i++) {
                const int lo_at = i < 8 ? 2 + i : 2 + i - 8, hi_at = 2 + 8 + (i & 3);
                const uint32x4_t lo = field(w[lo_at / 4], 8 * (lo_at % 4) + (i < 8 ? 0 : 4), 0xF);
                const uint32x4_t hi = field(w[hi_at / 4], 8 * (hi_at % 4) + 2 * (i >> 2), 3);
                const int32x4_t sc = vsubq_s32(vreinterpretq_s32_u32(vorrq_u32(lo, vshlq_n_u32(hi, 4))), vdupq_n_s32(32));
                s[i * PK_QUADS + qd] = vmulq_f32(d, vcvtq_f32_s32(sc));
            }
            continue;
        }
        if (type == QUILL_TYPE_Q6_K) { /* 16 signed bytes in w0..w3, d in the high half of register 4's word */
            const float32x4_t d = halves_high(vreinterpretq_u32_u8(reg_quad(base, 4, qd)));
#pragma GCC unroll 16
            for (int j = 0; j < 16; j++) {
                const int32x4_t sc = vshlq_s32(vshlq_s32(vreinterpretq_s32_u32(w[j / 4]), vdupq_n_s32(24 - 8 * (j % 4))),
                                               vdupq_n_s32(-24));
                s[j * PK_QUADS + qd] = vmulq_f32(d, vcvtq_f32_s32(sc));
            }
            continue;
        }
        /* w0: d, dmin; w1..w3: the 12 bytes of 6-bit scales and minimums */
        const float32x4_t d = halves_low(w0), dmin = halves_high(w0);
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            const int b = 8 * (j % 4);
            uint32x4_t sc, mn;
            if (j < 4) {
                sc = field(w1, b, 63);
                mn = field(w2, b, 63);
            } else {
                sc = vorrq_u32(field(w3, b, 0xF), vshlq_n_u32(field(w1, b + 6, 3), 4));
                mn = vorrq_u32(field(w3, b + 4, 0xF), vshlq_n_u32(field(w2, b + 6, 3), 4));
            }
            s[j * PK_QUADS + qd] = vmulq_f32(d, vcvtq_f32_u32(sc));
            m[j * PK_QUADS + qd] = vmulq_f32(dmin, vcvtq_f32_u32(mn));
        }
    }
}

/* Where a 32-column type's block keeps its codes, the scales of its chunk, and its place there. */
typedef struct {
    const uint8_t *codes, *scales;
    int b;
} block_at;

/* A 32-column block's slot scales of the 16 rows, slot i of quad qd at s[i · PK_QUADS + qd], as the
 * unpackers make them: d (f16, side by side; q4_1's and q5_1's negated minimums in m), mxfp4's
 * 2^(e - 128) from its exponent byte, iq4_xs's d·(ls - 32) of sub-block b, the grid types' from
 * their slots' 4-bit fields (grid_scales of the avx2 set, step for step). */
static PK_AI void block_scales(uint32_t type, block_at blk, float32x4_t *s, float32x4_t *m) {
    for (int qd = 0; qd < PK_QUADS; qd++) {
        if (grid_nibbles(type)) { /* a chunk is one file block: slot sl = per · b + i of its 8 or 16 */
            const int per = 32 / slot_width(type);
            const float32x4_t d =
                vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(blk.scales + grid_d_at(type) + 8 * qd))));
            for (int i = 0; i < per; i++) {
                const int sl = per * blk.b + i;
                const uint32x4_t sc = field(vreinterpretq_u32_u8(reg_quad(blk.scales, sl / 8, qd)), 4 * (sl % 8), 0xF);
                const float32x4_t odd = vcvtq_f32_u32(vaddq_u32(vshlq_n_u32(sc, 1), vdupq_n_u32(1)));
                float32x4_t v;
                if (type == QUILL_TYPE_IQ3_S) v = vmulq_f32(d, odd); /* d · (1 + 2 sc) */
                else if (type == QUILL_TYPE_IQ1_S || type == QUILL_TYPE_IQ1_M) /* d · (2 sc + 1) · 0.125 */
                    v = vmulq_f32(vmulq_f32(d, odd), vdupq_n_f32(0.125f));
                else /* iq3_xxs: d · (0.5 + sc) · 0.5; the iq2 types: · 0.25 */
                    v = vmulq_f32(vmulq_f32(d, vaddq_f32(vdupq_n_f32(0.5f), vcvtq_f32_u32(sc))),
                                  vdupq_n_f32(type == QUILL_TYPE_IQ3_XXS ? 0.5f : 0.25f));
                s[i * PK_QUADS + qd] = v;
            }
            continue;
        }
        if (type == QUILL_TYPE_MXFP4) { /* quill_e8m0_half_to_float, 4 rows at once */
            uint32_t e4;
            memcpy(&e4, blk.scales + (size_t)blk.b * block_scale_bytes(type) + 4 * qd, 4);
            const uint32x4_t e = vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(e4)))));
            const uint32x4_t small = vshlq_u32(vdupq_n_u32(0x00200000u), vreinterpretq_s32_u32(e));
            const uint32x4_t big = vshlq_n_u32(vsubq_u32(e, vdupq_n_u32(1)), 23);
            s[qd] = vreinterpretq_f32_u32(vbslq_u32(vcltq_u32(e, vdupq_n_u32(2)), small, big));
            continue;
        }
        const uint8_t *d16 = blk.scales + (type == QUILL_TYPE_IQ4_XS ? 0 : (size_t)blk.b * block_scale_bytes(type));
        const float32x4_t d = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(d16 + 8 * qd))));
        if (has_min(type)) /* q4_1, q5_1: the minimum after the 16 rows' d, negated (it is added) */
            m[qd] = vnegq_f32(vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(d16 + 32 + 8 * qd)))));
        if (type != QUILL_TYPE_IQ4_XS) {
            s[qd] = d;
            continue;
        }
        uint32_t ls4; /* the 4 rows' 6-bit ls, bytes at 64 + 16b */
        memcpy(&ls4, blk.scales + 64 + 16 * (size_t)blk.b + 4 * qd, 4);
        const int32x4_t ls = vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vreinterpret_u8_u32(vdup_n_u32(ls4))))));
        s[qd] = vmulq_f32(d, vcvtq_f32_s32(vsubq_s32(ls, vdupq_n_s32(32))));
    }
}

/* One token's slots [sl0, sl1) of a window that starts at column k, into acc (a quad per register),
 * the codes read from the layout at `base` into the byte products: decoding. */
static PK_AI void token_slots(uint32_t type, const uint8_t *base, const float32x4_t *s,
                              const float32x4_t *m, const acts *A, int64_t cols, int64_t k, int sl0, int sl1,
                              float32x4_t acc[PK_QUADS]) {
    const int kb = slot_width(type);
#pragma GCC unroll 16
    for (int sl = sl0; sl < sl1; sl++) {
        const int64_t col = k + (int64_t)sl * kb;
        int32x4_t ch[PK_QUADS], cl[PK_QUADS];
        for (int qd = 0; qd < PK_QUADS; qd++) ch[qd] = cl[qd] = vdupq_n_s32(0);
#pragma GCC unroll 2
        for (int g16 = 0; g16 < kb / 4; g16 += 4) {
            const act16 X = acts16(A, cols, col + 4 * g16);
#pragma GCC unroll 4
            for (int gg = 0; gg < 4; gg++)
#pragma GCC unroll 4
                for (int qd = 0; qd < PK_QUADS; qd++) {
                    const int g = g16 + gg;
                    const int8x16_t w = group_codes(type, base, sl, g, qd);
                    ch[qd] = sdot_lane(ch[qd], w, X.x[H_REG(gg)], H_LANE(gg));
                    cl[qd] = sdot_lane(cl[qd], w, X.x[L_REG(gg)], L_LANE(gg));
                }
        }
        const float da = A->da[col / 32];
        for (int qd = 0; qd < PK_QUADS; qd++) {
            const int32x4_t c = vaddq_s32(vshlq_n_s32(ch[qd], 8), cl[qd]);
            acc[qd] = vfmaq_f32(acc[qd], vcvtq_f32_s32(c), vmulq_n_f32(s[sl * PK_QUADS + qd], da));
            if (has_min(type)) acc[qd] = vfmsq_f32(acc[qd], m[sl * PK_QUADS + qd], vdupq_n_f32(A->sf[col / kb]));
        }
    }
}

/* A batch's slot sl of a window whose codes are unpacked in cw, for quads q0 and q0 + 1 (8 rows)
 * and every token of the pass: the 8 rows' codes of the slot stay in registers while the tokens
 * pass, each token's accumulators updated slot after slot as in token_slots (the same bits). The
 * i8mm set (PACKED_SMMLA) multiplies by smmla: two rows' 8 codes against a token's 8 h and 8 l
 * bytes (its interleaved activations, one load) give both rows' Σq·h and Σq·l, half the
 * instructions of sdot by lane. */
static PK_AI void batch_slot(uint32_t type, const int8x16_t *cw, const float32x4_t *s, const float32x4_t *m,
                             const tiles_job *j, int64_t k, int sl, int q0, float32x4_t (*acc)[PK_QUADS]) {
    const int kb = slot_width(type), ng = kb / 4;
    const int64_t col = k + (int64_t)sl * kb;
    int8x16_t w[8][2]; /* group g of quad q0 + qq */
#pragma GCC unroll 8
    for (int g = 0; g < ng; g++)
        for (int qq = 0; qq < 2; qq++) w[g][qq] = cw[(sl * ng + g) * PK_QUADS + q0 + qq];
#if PACKED_SMMLA
    /* rows 0-1 and 2-3 of a quad, 8 columns (groups 2o, 2o + 1): smmla's 2x8 operands */
    int8x16_t p[4][2][2];
#pragma GCC unroll 4
    for (int o = 0; o < ng / 2; o++)
        for (int qq = 0; qq < 2; qq++) {
            const int32x4_t a = vreinterpretq_s32_s8(w[2 * o][qq]), b = vreinterpretq_s32_s8(w[2 * o + 1][qq]);
            p[o][qq][0] = vreinterpretq_s8_s32(vzip1q_s32(a, b));
            p[o][qq][1] = vreinterpretq_s8_s32(vzip2q_s32(a, b));
        }
#endif
    for (int t = 0; t < j->n_tok; t++) {
        const acts *A = &j->A[t];
        int32x4_t ch[2], cl[2];
#if PACKED_SMMLA
        int32x4_t r[2][2]; /* quad qq, rows 0-1 / 2-3: (row a: Σq·h, Σq·l, row b: Σq·h, Σq·l) */
        for (int qq = 0; qq < 2; qq++) r[qq][0] = r[qq][1] = vdupq_n_s32(0);
#pragma GCC unroll 4
        for (int o = 0; o < ng / 2; o++) {
            const int8x16_t x = vld1q_s8(A->hl + 2 * (col + 8 * o)); /* 8 columns' h bytes, then their l bytes */
            for (int qq = 0; qq < 2; qq++) {
                r[qq][0] = vmmlaq_s32(r[qq][0], p[o][qq][0], x);
                r[qq][1] = vmmlaq_s32(r[qq][1], p[o][qq][1], x);
            }
        }
        for (int qq = 0; qq < 2; qq++) {
            ch[qq] = vuzp1q_s32(r[qq][0], r[qq][1]);
            cl[qq] = vuzp2q_s32(r[qq][0], r[qq][1]);
        }
#else
        for (int qq = 0; qq < 2; qq++) ch[qq] = cl[qq] = vdupq_n_s32(0);
#pragma GCC unroll 2
        for (int g16 = 0; g16 < ng; g16 += 4) {
            const act16 X = acts16(A, j->cols, col + 4 * g16);
#pragma GCC unroll 4
            for (int gg = 0; gg < 4; gg++)
                for (int qq = 0; qq < 2; qq++) {
                    ch[qq] = sdot_lane(ch[qq], w[g16 + gg][qq], X.x[H_REG(gg)], H_LANE(gg));
                    cl[qq] = sdot_lane(cl[qq], w[g16 + gg][qq], X.x[L_REG(gg)], L_LANE(gg));
                }
        }
#endif
        const float da = A->da[col / 32];
        for (int qq = 0; qq < 2; qq++) {
            const int qd = q0 + qq;
            const int32x4_t c = vaddq_s32(vshlq_n_s32(ch[qq], 8), cl[qq]);
            float32x4_t a = vfmaq_f32(acc[t][qd], vcvtq_f32_s32(c), vmulq_n_f32(s[sl * PK_QUADS + qd], da));
            if (has_min(type)) a = vfmsq_f32(a, m[sl * PK_QUADS + qd], vdupq_n_f32(A->sf[col / kb]));
            acc[t][qd] = a;
        }
    }
}

/* The block at column kblk of a 32-column type's tile. */
static PK_AI block_at locate_block(uint32_t type, const tiles_job *j, int64_t tiles, size_t tb, int64_t tile,
                                   int64_t kblk) {
    const int64_t k0 = kblk / PACK_CW * PACK_CW, blocks = (j->cols - k0 < PACK_CW ? j->cols - k0 : PACK_CW) / 32;
    const int64_t b = (kblk - k0) / 32;
    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
    return (block_at){j->w + place_codes(type, pl, blocks, b), j->w + place_scales(type, pl, blocks), (int)b};
}

static PK_AI void store_quads(float *y, int nr, const float32x4_t acc[PK_QUADS]) {
    if (nr == PACK_TR) {
        for (int qd = 0; qd < PK_QUADS; qd++) vst1q_f32(y + 4 * qd, acc[qd]);
        return;
    }
    float out[PACK_TR];
    for (int qd = 0; qd < PK_QUADS; qd++) vst1q_f32(out + 4 * qd, acc[qd]);
    memcpy(y, out, (size_t)nr * sizeof *y);
}

/* Tiles [t0, t1) of a packed matrix. Decoding reads each group's codes from the layout into the
 * byte products; a batch unpacks a window (a super-block, or a chunk's blocks of 32) once into
 * registers on the stack and runs every token of the pass over it. */
static PK_AI void packed_impl(const tiles_job *j, int64_t t0, int64_t t1, uint32_t type) {
    const bool kq = kblock_type(type);
    const int64_t tiles = (j->rows + PACK_TR - 1) / PACK_TR;
    const size_t tb = packed_tile_bytes(type, j->cols);
    const int kb = slot_width(type), width = kq ? 256 : PACK_CW;
    float32x4_t acc[PASS_TOKENS][PK_QUADS];
    int8x16_t cw[MAX_BLOCK / 4 * PK_QUADS];
    float32x4_t s[MAX_BLOCK / 16 * PK_QUADS], m[MAX_BLOCK / 16 * PK_QUADS];
    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t r0 = tile * PACK_TR;
        const int nr = j->rows - r0 < PACK_TR ? (int)(j->rows - r0) : PACK_TR;
        for (int t = 0; t < j->n_tok; t++)
            for (int qd = 0; qd < PK_QUADS; qd++) acc[t][qd] = vdupq_n_f32(0);
        for (int64_t k = 0; k < j->cols; k += width) {
            /* the window: a super-block, or the blocks of the chunk from k */
            const int per = 32 / kb; /* a 32-column block's slots: 1, or 2 of 16 columns */
            const int n_blocks = (int)((j->cols - k < PACK_CW ? j->cols - k : PACK_CW) / 32);
            const int n_slots = kq ? 256 / kb : n_blocks * per;
            const uint8_t *base = kq ? j->w + (size_t)tile * tb + (size_t)(k / 256) * (size_t)kblock_regs(type) * 64 : NULL;
            if (kq) kblock_scales(type, base, s, m);
            if (j->n_tok == 1) {
                if (kq) {
                    token_slots(type, base, s, m, &j->A[0], j->cols, k, 0, n_slots, acc[0]);
                    continue;
                }
                for (int b = 0; b < n_blocks; b++) {
                    const block_at blk = locate_block(type, j, tiles, tb, tile, k + 32 * b);
                    block_scales(type, blk, s, m);
                    token_slots(type, blk.codes, s, m, &j->A[0], j->cols, k + 32 * b, 0, per, acc[0]);
                }
                continue;
            }
            /* a batch: the window's codes and scales once, then each token */
            for (int sl = 0; sl < n_slots; sl++) {
                const uint8_t *codes = base;
                if (!kq) {
                    const block_at blk = locate_block(type, j, tiles, tb, tile, k + 32 * (sl / per));
                    if (sl % per == 0) block_scales(type, blk, s + sl * PK_QUADS, m + sl * PK_QUADS);
                    codes = blk.codes;
                }
#pragma GCC unroll 8
                for (int g = 0; g < kb / 4; g++)
                    for (int qd = 0; qd < PK_QUADS; qd++)
                        cw[(sl * kb / 4 + g) * PK_QUADS + qd] = group_codes(type, codes, kq ? sl : sl % per, g, qd);
            }
            for (int sl = 0; sl < n_slots; sl++)
                for (int q0 = 0; q0 < PK_QUADS; q0 += 2) batch_slot(type, cw, s, m, j, k, sl, q0, acc);
        }
        for (int t = 0; t < j->n_tok; t++) store_quads(j->y + (size_t)t * (size_t)j->rows + (size_t)r0, nr, acc[t]);
    }
}

#define NEON_PACKED_MATMUL(sfx, ID) NEON_TYPE_MATMUL(matmul_packed_##sfx, packed_impl, PACK_TR, ID)
NEON_PACKED_TYPES(NEON_PACKED_MATMUL)

static size_t neon_pack_bytes(uint32_t type, int64_t rows, int64_t cols) {
    return neon_packed_type(type) ? vnni16_pack_bytes(type, rows, cols) : 0;
}

#define NEON_INSTALL_PACKED(sfx, ID) k->matmul_packed[QUILL_TYPE_##ID] = matmul_packed_##sfx;
/* The x86 sets' layout by name: a model packed by one of the two aarch64 sets serves the other
 * (both pack the same types the same way). */
static void install_packed(quill_kernels *k) {
    k->packed_layout = "vnni16";
    k->pack_bytes = neon_pack_bytes;
    k->pack = vnni16_pack;
    NEON_PACKED_TYPES(NEON_INSTALL_PACKED)
}

#endif
