/* The i8mm set's exact integer products (exact_neon.h): the byte sums by smmla, which multiplies a
 * 2x8 matrix of signed bytes by an 8x2 one into a 2x2 of 32-bit sums. The first holds 8 codes of
 * two weight rows, the second 8 columns' h bytes and their l bytes (the activations' interleaved
 * layout), so one instruction gives both rows' Σq·h and Σq·l: two per 8 columns for a tile of 4
 * rows, where sdot takes four. Built with -march=armv8.2-a+dotprod+i8mm on aarch64 only (kernels.c
 * installs it where Linux reports i8mm); elsewhere it compiles to nothing. */
#include "kernels/kernels.h"

#if defined(__aarch64__)
#define ACTS_INTERLEAVED 1

#include <arm_neon.h>

static inline __attribute__((always_inline)) int32x4_t slot_c4_i8mm(const int8_t *const q[4], const int8_t *hl,
                                                                    int64_t col, int kb) {
    const int8_t *a = hl + 2 * col;
    int32x4_t s01 = vdupq_n_s32(0), s23 = vdupq_n_s32(0);
#pragma GCC unroll 4
    for (int c = 0; c < kb; c += 8) {
        const int8x16_t b = vld1q_s8(a + 2 * c); /* columns c..c+7: their h bytes, then their l bytes */
        s01 = vmmlaq_s32(s01, vcombine_s8(vld1_s8(q[0] + c), vld1_s8(q[1] + c)), b);
        s23 = vmmlaq_s32(s23, vcombine_s8(vld1_s8(q[2] + c), vld1_s8(q[3] + c)), b);
    }
    /* s01 = (row 0: Σq·h, Σq·l, row 1: Σq·h, Σq·l); the even lanes of both give the 4 rows' h sums */
    const int32x4_t H = vuzp1q_s32(s01, s23), L = vuzp2q_s32(s01, s23);
    return vaddq_s32(vshlq_n_s32(H, 8), L);
}
#define slot_c4(q, A, cols, col, kb) slot_c4_i8mm(q, (A)->hl, col, kb)

#include "kernels/arm/exact_neon.h"
#define PACKED_SMMLA 1
#include "kernels/arm/packed_neon.h"

void quill_kernels_install_i8mm(quill_kernels *k) {
    install_exact(k);
    install_packed(k);
}
#endif
