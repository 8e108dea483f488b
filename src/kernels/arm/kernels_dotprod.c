/* The dotprod set's exact integer products (exact_neon.h): the byte sums by sdot, which adds 4
 * products of signed bytes into each 32-bit lane. Built with -march=armv8.2-a+dotprod on aarch64
 * only (kernels.c installs it where Linux reports asimddp); elsewhere it compiles to nothing. */
#include "kernels/kernels.h"

#if defined(__aarch64__)
#define ACTS_INTERLEAVED 0

#include <arm_neon.h>

static inline __attribute__((always_inline)) int32x4_t slot_c4_dotprod(const int8_t *const q[4], const int8_t *hl,
                                                                       int64_t cols, int64_t col, int kb) {
    const int8_t *h = hl + col, *l = hl + cols + col;
    int32x4_t sh[4], sl[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) sh[r] = sl[r] = vdupq_n_s32(0);
#pragma GCC unroll 2
    for (int c = 0; c < kb; c += 16) {
        const int8x16_t ah = vld1q_s8(h + c), al = vld1q_s8(l + c);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            const int8x16_t w = vld1q_s8(q[r] + c);
            sh[r] = vdotq_s32(sh[r], w, ah);
            sl[r] = vdotq_s32(sl[r], w, al);
        }
    }
    /* each row's 4 lanes summed, row r in lane r */
    const int32x4_t H = vpaddq_s32(vpaddq_s32(sh[0], sh[1]), vpaddq_s32(sh[2], sh[3]));
    const int32x4_t L = vpaddq_s32(vpaddq_s32(sl[0], sl[1]), vpaddq_s32(sl[2], sl[3]));
    return vaddq_s32(vshlq_n_s32(H, 8), L);
}
#define slot_c4(q, A, cols, col, kb) slot_c4_dotprod(q, (A)->hl, cols, col, kb)

#include "kernels/arm/exact_neon.h"
#define PACKED_SMMLA 0
#include "kernels/arm/packed_neon.h"

void quill_kernels_install_dotprod(quill_kernels *k) {
    install_exact(k);
    install_packed(k);
}
#endif
