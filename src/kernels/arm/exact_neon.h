/* The exact integer products on aarch64: the part the dotprod and i8mm sets share (exact_scalar.c
 * describes the arithmetic and defines the bits).
 *
 * Activations: each token's blocks of 32 become the model's codes (kernels_exact.h's
 * quantize_block, the definition itself), split into two signed bytes a = 256·h + l. Weights: a
 * tile of 4 rows, one block (32 columns, or a k-quant's 256) at a time, unpacked to the model's
 * signed codes q (every exact type's fit a signed byte: no bias to take out again) and its slots'
 * scales. Per slot the including file's slot_c4 forms the 4 rows' C = 256·Σq·h + Σq·l with its
 * byte products: exact in 32 bits (|Σq·h| <= 32·128·128), and below 2^24 (act_max). The f32 steps
 * then run as the model's, fused multiply-add for fused multiply-add, one row per lane:
 * acc = fma(C, s·da, acc), and fma(-m, da·Σa, acc) for the types with minimums. Every (row,
 * token) result is a function of that row and token alone: batch- and thread-invariant, and the
 * bits of every other set's exact products.
 *
 * The including file (built with its set's flags) defines, before including this:
 *   ACTS_INTERLEAVED  0: a token's h bytes in column order, then its l bytes (sdot takes 16 of
 *                     either); 1: per 8 columns their 8 h bytes, then their 8 l bytes (an smmla
 *                     operand: the two columns of a 8x2 matrix);
 *   slot_c4(q, A, cols, col, kb)  the 4 rows' C of the kb (16 or 32) columns from `col`: q[r] is
 *                     row r's codes from that column, A the token's acts (below);
 * and gets matmul_<type> for every exact type and install_exact(k). */
#ifndef QUILL_EXACT_NEON_H
#define QUILL_EXACT_NEON_H

#include "kernels/kernels.h"
#include "kernels/kernels_exact.h"
#include "base/threadpool.h"
#include "tensor/types_internal.h"

#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

#define TILE_ROWS 4     /* rows per tile: one per f32 lane */
#define MAX_BLOCK 256   /* the largest block: a k-quant super-block */
#define PASS_TOKENS 64  /* tokens per pass over the weights: their accumulators live on the stack */

/* ---------------------------------------------------------------- activations */

/* One token's activations: h and l bytes (in the ACTS_INTERLEAVED layout), the scale of each
 * block of 32 and, per slot, da·Σa (the minimums' term). */
typedef struct {
    int8_t *hl;
    float *da, *sf;
} acts;

static inline size_t acts_bytes(int64_t cols) {
    return (size_t)cols * 2 + (size_t)(cols / 32) * sizeof(float) + (size_t)(cols / 16) * sizeof(float) + 16;
}

static inline acts acts_at(void *mem, int64_t cols) {
    acts A;
    A.da = (float *)(((uintptr_t)mem + 15) & ~(uintptr_t)15);
    A.sf = A.da + cols / 32;
    A.hl = (int8_t *)(A.sf + cols / 16);
    return A;
}

/* Eight 16-bit codes a = 256·h + l as their h and l bytes: l the low byte, h = (a - l) / 256 exactly. */
static inline void split_hl(int16x8_t a16, int8x8_t *h8, int8x8_t *l8) {
    *l8 = vmovn_s16(a16);
    *h8 = vmovn_s16(vshrq_n_s16(vsubq_s16(a16, vmovl_s8(*l8)), 8));
}

/* Block blk's h and l bytes (columns 8i..8i + 7 of the block in h8[i], l8[i]) into the token's
 * layout. */
static inline void store_hl(const acts *A, int64_t cols, int64_t blk, const int8x8_t h8[4], const int8x8_t l8[4]) {
    for (int i = 0; i < 4; i++) {
        const int64_t col = blk * 32 + 8 * i;
#if ACTS_INTERLEAVED
        (void)cols;
        vst1q_s8(A->hl + 2 * col, vcombine_s8(h8[i], l8[i]));
#else
        vst1_s8(A->hl + col, h8[i]);
        vst1_s8(A->hl + cols + col, l8[i]);
#endif
    }
}

/* The model's codes (kernels_exact.h's quantize_block) 32 at a time: the same f32 max, division and
 * products, rounded to nearest even (fcvtns, as nearbyintf), clamped, then rounded to 8
 * significant bits as round_8_bits does, and split into h and l bytes.
 * A block of zeros, or with an infinity or a NaN (fmax propagates it into amax), takes
 * quantize_block itself. */
static void quantize_acts(uint32_t type, const float *x, int64_t cols, const acts *A) {
    const int kb = slot_width(type), qa = act_max(type);
    for (int64_t blk = 0; blk < cols / 32; blk++) {
        const float *xb = x + blk * 32;
        float32x4_t v[8], amax4 = vdupq_n_f32(0);
        for (int i = 0; i < 8; i++) {
            v[i] = vld1q_f32(xb + 4 * i);
            amax4 = vmaxq_f32(amax4, vabsq_f32(v[i]));
        }
        const float amax = vmaxvq_f32(amax4);
        int8x8_t h8[4], l8[4];
        if (!(amax > 0) || !isfinite(amax)) {
            int16_t a[32];
            int32_t sum;
            const float da = quantize_block(xb, type, a, &sum);
            A->da[blk] = da;
            for (int sl = 0; sl < 32 / kb; sl++) {
                int32_t part = 0;
                for (int i = sl * kb; i < (sl + 1) * kb; i++) part += a[i];
                A->sf[blk * (32 / kb) + sl] = da * (float)part;
            }
            for (int i = 0; i < 4; i++) split_hl(vld1q_s16(a + 8 * i), &h8[i], &l8[i]);
            store_hl(A, cols, blk, h8, l8);
            continue;
        }
        const float32x4_t id = vdupq_n_f32((float)qa / amax);
        const int32x4_t qmax = vdupq_n_s32(qa), qmin = vdupq_n_s32(-qa);
        int32x4_t a[8];
        for (int i = 0; i < 8; i++) {
            const int32x4_t q = vminq_s32(vmaxq_s32(vcvtnq_s32_f32(vmulq_f32(v[i], id)), qmin), qmax);
            uint32x4_t u = vreinterpretq_u32_f32(vcvtq_f32_s32(q));
            u = vaddq_u32(u, vaddq_u32(vdupq_n_u32(0x7FFF), vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1))));
            a[i] = vcvtq_s32_f32(vreinterpretq_f32_u32(vandq_u32(u, vdupq_n_u32(0xFFFF0000u))));
        }
        const float da = amax / (float)qa;
        A->da[blk] = da;
        for (int sl = 0; sl < 32 / kb; sl++) {
            int32x4_t part = vdupq_n_s32(0);
            for (int i = sl * kb / 4; i < (sl + 1) * kb / 4; i++) part = vaddq_s32(part, a[i]);
            A->sf[blk * (32 / kb) + sl] = da * (float)vaddvq_s32(part);
        }
        for (int i = 0; i < 4; i++) split_hl(vcombine_s16(vmovn_s32(a[2 * i]), vmovn_s32(a[2 * i + 1])), &h8[i], &l8[i]);
        store_hl(A, cols, blk, h8, l8);
    }
}

typedef struct {
    uint32_t type;
    const float *x;
    int64_t cols;
    const acts *A;
} quantize_job;

static void quantize_tokens(void *ctx, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const quantize_job *j = ctx;
    for (int64_t t = t0; t < t1; t++) quantize_acts(j->type, j->x + t * j->cols, j->cols, &j->A[t]);
}

/* ---------------------------------------------------------------- weights: one block of a row */

/* The model's codes and slot scales of one block (exact_scalar.c's row_codes and row_scales, a
 * block at a time): q gets block_elems(type) codes, s and m one value per slot. */
static inline __attribute__((always_inline)) void unpack_block(uint32_t type, const uint8_t *b, int8_t *q, float *s,
                                                               float *m) {
    switch (type) {
    case QUILL_TYPE_Q4_0:
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1: {
        /* column i in the low nibble of byte i, column 16 + i in the high one; q5's fifth bits in qh */
        const uint8x16_t v = vld1q_u8(b + legacy_qs(type));
        uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(v, 4);
        if (legacy_qh(type)) {
            uint32_t qh;
            memcpy(&qh, b + legacy_qh(type), 4);
            /* bit j of qh is column j's: the bytes of qh spread to 8 lanes each, then each lane's bit */
            const uint8x16_t bit = vreinterpretq_u8_u64(vdupq_n_u64(0x8040201008040201ull));
            const uint8x16_t h01 = vcombine_u8(vdup_n_u8((uint8_t)qh), vdup_n_u8((uint8_t)(qh >> 8)));
            const uint8x16_t h23 = vcombine_u8(vdup_n_u8((uint8_t)(qh >> 16)), vdup_n_u8((uint8_t)(qh >> 24)));
            lo = vorrq_u8(lo, vandq_u8(vtstq_u8(h01, bit), vdupq_n_u8(16)));
            hi = vorrq_u8(hi, vandq_u8(vtstq_u8(h23, bit), vdupq_n_u8(16)));
        }
        const int8x16_t bias = vdupq_n_s8((int8_t)code_bias(type));
        vst1q_s8(q, vsubq_s8(vreinterpretq_s8_u8(lo), bias));
        vst1q_s8(q + 16, vsubq_s8(vreinterpretq_s8_u8(hi), bias));
        s[0] = half_at(b);
        if (has_min(type)) m[0] = -half_at(b + 2); /* the minimum is added: m is its negation */
        break;
    }
    case QUILL_TYPE_Q8_0:
        vst1q_s8(q, vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs)));
        vst1q_s8(q + 16, vld1q_s8((const int8_t *)b + offsetof(block_q8_0, qs) + 16));
        s[0] = half_at(b);
        break;
    case QUILL_TYPE_Q4_K:
    case QUILL_TYPE_Q5_K: {
        /* per 64 columns 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high ones; q5_K
         * adds bit 2c (2c + 1) of qh[l] for element l of sub-block 2c (2c + 1) */
        const bool q5 = type == QUILL_TYPE_Q5_K;
        const block_q4_K *k4 = (const block_q4_K *)b;
        const block_q5_K *k5 = (const block_q5_K *)b;
        const uint8_t *qs = q5 ? k5->qs : k4->qs, *scales = q5 ? k5->scales : k4->scales;
        uint8x16_t qh[2] = {vdupq_n_u8(0), vdupq_n_u8(0)};
        if (q5) qh[0] = vld1q_u8(k5->qh), qh[1] = vld1q_u8(k5->qh + 16);
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 2; i++) {
                const uint8x16_t v = vld1q_u8(qs + 32 * c + 16 * i);
                uint8x16_t lo = vandq_u8(v, vdupq_n_u8(0x0F)), hi = vshrq_n_u8(v, 4);
                if (q5) {
                    const uint8x16_t b_lo = vdupq_n_u8((uint8_t)(1u << (2 * c))), b_hi = vdupq_n_u8((uint8_t)(2u << (2 * c)));
                    lo = vorrq_u8(lo, vandq_u8(vtstq_u8(qh[i], b_lo), vdupq_n_u8(16)));
                    hi = vorrq_u8(hi, vandq_u8(vtstq_u8(qh[i], b_hi), vdupq_n_u8(16)));
                }
                vst1q_s8(q + 64 * c + 16 * i, vreinterpretq_s8_u8(lo));
                vst1q_s8(q + 64 * c + 32 + 16 * i, vreinterpretq_s8_u8(hi));
            }
        const float d = quill_half_to_float(k4->d), dmin = quill_half_to_float(k4->dmin);
        for (int j = 0; j < 8; j++) {
            uint8_t sc, mn;
            quill_scale_min_k4(j, scales, &sc, &mn);
            s[j] = d * (float)sc;
            m[j] = dmin * (float)mn;
        }
        break;
    }
    case QUILL_TYPE_Q6_K: {
        /* column 128·hf + 32·qd + l takes the low (qd < 2) or high nibble of ql[64·hf + 32·(qd & 1)
         * + l] and bits 2qd, 2qd + 1 of qh[32·hf + l], less 32 */
        const block_q6_K *k6 = (const block_q6_K *)b;
        const uint8x16_t low = vdupq_n_u8(0x0F), m30 = vdupq_n_u8(0x30);
        const int8x16_t bias = vdupq_n_s8(32);
        for (int hf = 0; hf < 2; hf++)
            for (int i = 0; i < 2; i++) {
                const uint8x16_t ql0 = vld1q_u8(k6->ql + 64 * hf + 16 * i), ql1 = vld1q_u8(k6->ql + 64 * hf + 32 + 16 * i);
                const uint8x16_t qh = vld1q_u8(k6->qh + 32 * hf + 16 * i);
                const uint8x16_t u0 = vorrq_u8(vandq_u8(ql0, low), vandq_u8(vshlq_n_u8(qh, 4), m30));
                const uint8x16_t u1 = vorrq_u8(vandq_u8(ql1, low), vandq_u8(vshlq_n_u8(qh, 2), m30));
                const uint8x16_t u2 = vorrq_u8(vshrq_n_u8(ql0, 4), vandq_u8(qh, m30));
                const uint8x16_t u3 = vorrq_u8(vshrq_n_u8(ql1, 4), vandq_u8(vshrq_n_u8(qh, 2), m30));
                int8_t *o = q + 128 * hf + 16 * i;
                vst1q_s8(o, vsubq_s8(vreinterpretq_s8_u8(u0), bias));
                vst1q_s8(o + 32, vsubq_s8(vreinterpretq_s8_u8(u1), bias));
                vst1q_s8(o + 64, vsubq_s8(vreinterpretq_s8_u8(u2), bias));
                vst1q_s8(o + 96, vsubq_s8(vreinterpretq_s8_u8(u3), bias));
            }
        const float d = quill_half_to_float(k6->d);
        for (int j = 0; j < 16; j++) s[j] = d * (float)k6->scales[j];
        break;
    }
    default: /* the low-bit types: exact_unpack.c's unpacker defines their codes and scales */
        quill_exact_unpack_for(type)(b, block_elems(type), q, s, m);
        break;
    }
}

/* ---------------------------------------------------------------- the tile loop */

typedef struct {
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    int n_tok;      /* at most PASS_TOKENS */
    const acts *A;  /* one per token */
    float *y;       /* y[t · rows + r] */
} tiles_job;

static inline __attribute__((always_inline)) void tiles_impl(const tiles_job *j, int64_t t0, int64_t t1,
                                                             uint32_t type) {
    const int width = block_elems(type), kb = slot_width(type), n_slots = width / kb;
    const size_t bb = block_bytes(type);
    _Alignas(16) int8_t q[TILE_ROWS][MAX_BLOCK];
    float s[TILE_ROWS][MAX_BLOCK / 16], m[TILE_ROWS][MAX_BLOCK / 16];
    float32x4_t acc[PASS_TOKENS];
    for (int64_t tile = t0; tile < t1; tile++) {
        const int64_t r0 = tile * TILE_ROWS;
        const int nr = j->rows - r0 < TILE_ROWS ? (int)(j->rows - r0) : TILE_ROWS;
        /* rows past the matrix repeat the tile's first row: computed, never stored */
        const uint8_t *rp[TILE_ROWS];
        for (int r = 0; r < TILE_ROWS; r++) rp[r] = j->w + (size_t)(r0 + (r < nr ? r : 0)) * j->row_bytes;
        for (int t = 0; t < j->n_tok; t++) acc[t] = vdupq_n_f32(0);
        for (int64_t k = 0; k < j->cols; k += width) {
            for (int r = 0; r < TILE_ROWS; r++) unpack_block(type, rp[r] + (size_t)(k / width) * bb, q[r], s[r], m[r]);
            float32x4_t s4[MAX_BLOCK / 16], m4[MAX_BLOCK / 16];
            for (int i = 0; i < n_slots; i++) {
                const float sv[4] = {s[0][i], s[1][i], s[2][i], s[3][i]};
                s4[i] = vld1q_f32(sv);
                if (has_min(type)) {
                    const float mv[4] = {m[0][i], m[1][i], m[2][i], m[3][i]};
                    m4[i] = vld1q_f32(mv);
                }
            }
            for (int t = 0; t < j->n_tok; t++) {
                const acts *A = &j->A[t];
                float32x4_t a = acc[t];
                for (int i = 0; i < n_slots; i++) {
                    const int64_t col = k + (int64_t)i * kb;
                    const int8_t *qs[TILE_ROWS] = {q[0] + i * kb, q[1] + i * kb, q[2] + i * kb, q[3] + i * kb};
                    const int32x4_t c = slot_c4(qs, A, j->cols, col, kb);
                    a = vfmaq_f32(a, vcvtq_f32_s32(c), vmulq_n_f32(s4[i], A->da[col / 32]));
                    if (has_min(type)) a = vfmsq_f32(a, m4[i], vdupq_n_f32(A->sf[col / kb]));
                }
                acc[t] = a;
            }
        }
        for (int t = 0; t < j->n_tok; t++) {
            float out[TILE_ROWS];
            vst1q_f32(out, acc[t]);
            memcpy(j->y + (size_t)t * (size_t)j->rows + (size_t)r0, out, (size_t)nr * sizeof(float));
        }
    }
}

static size_t exact_scratch(int64_t cols, int n_tok) {
    return (size_t)(n_tok < PASS_TOKENS ? n_tok : PASS_TOKENS) * acts_bytes(cols) + 16;
}

/* The tasks take items of item_rows rows: TILE_ROWS from the file's rows, a layout's tile of
 * QUILL_PACK_ROWS from a packed copy (packed_neon.h). */
static void exact_matmul(uint32_t type, quill_task_fn task, int item_rows, const quill_matrix *m, int n_mats,
                         int64_t cols, const float *x, int n_tok, quill_pool *pool, void *scratch) {
    acts A[PASS_TOKENS];
    tiles_job jobs[QUILL_MATMUL_MAX_MATS];
    quill_pool_task tasks[QUILL_MATMUL_MAX_MATS];
    for (int t0 = 0; t0 < n_tok; t0 += PASS_TOKENS) {
        const int nt = n_tok - t0 < PASS_TOKENS ? n_tok - t0 : PASS_TOKENS;
        for (int t = 0; t < nt; t++) A[t] = acts_at((uint8_t *)scratch + (size_t)t * acts_bytes(cols), cols);
        quantize_job qj = {type, x + (size_t)t0 * (size_t)cols, cols, A};
        if (nt == 1) quantize_tokens(&qj, 0, 1, 0);
        else quill_pool_run(pool, quantize_tokens, &qj, nt, 1);
        for (int i = 0; i < n_mats; i++) {
            jobs[i] = (tiles_job){m[i].w, m[i].row_bytes, m[i].rows, cols, nt, A, m[i].y + (size_t)t0 * (size_t)m[i].rows};
            tasks[i] = (quill_pool_task){task, &jobs[i], (m[i].rows + item_rows - 1) / item_rows};
        }
        quill_pool_run_joined(pool, tasks, n_mats, 1);
    }
}

/* A type's tile task over impl (items of item_rows rows) and its matmul `name`, the type a constant
 * inside: for every exact type here (both lists: the specialised types and the unpacked ones), and
 * for the layout's types in packed_neon.h. */
#define NEON_TYPE_MATMUL(name, impl, item_rows, ID)                                                     \
    static void name##_tiles(void *job, int64_t t0, int64_t t1, int thread) {                          \
        (void)thread;                                                                                  \
        impl(job, t0, t1, QUILL_TYPE_##ID);                                                            \
    }                                                                                                  \
    static void name(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok,         \
                     quill_pool *pool, void *scratch) {                                                \
        exact_matmul(QUILL_TYPE_##ID, name##_tiles, item_rows, m, n_mats, cols, x, n_tok, pool, scratch); \
    }
#define NEON_EXACT_MATMUL(sfx, ID) NEON_TYPE_MATMUL(matmul_##sfx, tiles_impl, TILE_ROWS, ID)
QUILL_EXACT_TYPES(NEON_EXACT_MATMUL)
QUILL_UNPACKED_EXACT_TYPES(NEON_EXACT_MATMUL)

#define NEON_INSTALL_MATMUL(sfx, ID) k->matmul[QUILL_TYPE_##ID] = matmul_##sfx;
static void install_exact(quill_kernels *k) {
    QUILL_EXACT_TYPES(NEON_INSTALL_MATMUL)
    QUILL_UNPACKED_EXACT_TYPES(NEON_INSTALL_MATMUL)
    k->matmul_scratch = exact_scratch;
}

#endif
