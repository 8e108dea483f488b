/* Quantizers of the low-bit types the reference writes without an importance matrix: q1_0, q2_0,
 * mxfp4, tq1_0 and tq2_0. Each makes the reference's choices with the reference's float
 * operations, in its order, so that the same F32 rows give the same bytes (tests compare whole
 * files with the reference quantizer's). */
#include "tensor/types_internal.h"

#include <math.h>
#include <stdbool.h>

/* No fused multiply-add, as in quantize.c. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* q1_0: d is the mean magnitude of the block; one bit per weight, set for x >= 0. */
void quill_from_float_q1_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK1_0, dst += sizeof(block_q1_0)) {
        block_q1_0 b;
        float sum_abs = 0.0f;
        for (int j = 0; j < QK1_0; j++) sum_abs += fabsf(x[j]);
        b.d = quill_f32_to_f16(sum_abs / QK1_0);
        memset(b.qs, 0, sizeof b.qs);
        for (int j = 0; j < QK1_0; j++)
            if (x[j] >= 0.0f) b.qs[j / 8] |= (uint8_t)(1u << (j % 8));
        memcpy(dst, &b, sizeof b);
    }
}

/* q2_0: d is the block's largest magnitude; codes round(x / d) + 1, clamped to 0..3. */
void quill_from_float_q2_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK2_0, dst += sizeof(block_q2_0)) {
        block_q2_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK2_0; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
        const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
        b.d = quill_f32_to_f16(amax);
        memset(b.qs, 0, sizeof b.qs);
        for (int j = 0; j < QK2_0; j++) {
            int q = (int)roundf(x[j] * id) + 1;
            q = q < 0 ? 0 : q > 3 ? 3 : q;
            b.qs[j / 4] |= (uint8_t)(q << (2 * (j % 4)));
        }
        memcpy(dst, &b, sizeof b);
    }
}

/* The fp4 level nearest to x at (half) scale d; the first of equals wins, so 0 codes as +0. */
static uint8_t nearest_fp4(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)quill_kvalues_fp4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float e = fabsf((float)quill_kvalues_fp4[i] * d - x);
        if (e < best_err) best = i, best_err = e;
    }
    return (uint8_t)best;
}

/* mxfp4: the shared exponent puts the block's largest magnitude among the top fp4 levels
 * (floor(log2 amax) - 2, biased by 127), then each weight takes its nearest level. */
void quill_from_float_mxfp4(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_MXFP4, dst += sizeof(block_mxfp4)) {
        block_mxfp4 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* through int: the reference converts the float straight to a byte, which x86 does this way */
        b.e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = quill_e8m0_half_to_float(b.e);
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            b.qs[j] = (uint8_t)(nearest_fp4(x[j], d) | nearest_fp4(x[j + QK_MXFP4 / 2], d) << 4);
        memcpy(dst, &b, sizeof b);
    }
}

/* A ternary code, -1, 0 or 1 as 0, 1, 2. */
static inline int trit(float x, float id) { return (int)lroundf(x * id) + 1; }

/* n trits, the first most significant, as a base-3 fraction of 256 rounded up (so that
 * tq1_trit's multiply-and-shift reads them back). */
static uint8_t pack_trits(const float *x, int n, int stride, float id, bool shift_one) {
    int q = 0;
    for (int k = 0; k < n; k++) q = q * 3 + trit(x[k * stride], id);
    if (shift_one) q *= 3;
    return (uint8_t)((q * 256 + (243 - 1)) / 243);
}

void quill_from_float_tq1_0(const float *x, uint8_t *dst, int64_t nb) {
    enum { QS = sizeof(((block_tq1_0 *)0)->qs), QH = sizeof(((block_tq1_0 *)0)->qh) };
    for (int64_t i = 0; i < nb; i++, dst += sizeof(block_tq1_0)) {
        block_tq1_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        b.d = quill_f32_to_f16(amax);
        /* five trits per byte: 32 bytes over 160 weights, then 16 bytes over 80 */
        for (int j = 0; j < QS - QS % 32; j += 32, x += 5 * 32)
            for (int m = 0; m < 32; m++) b.qs[j + m] = pack_trits(x + m, 5, 32, id, false);
        for (int j = QS - QS % 32; j < QS; j += 16, x += 5 * 16)
            for (int m = 0; m < 16; m++) b.qs[j + m] = pack_trits(x + m, 5, 16, id, false);
        /* four per byte for the last 16 weights, shifted up one trit */
        for (int j = 0; j < QH; j++) b.qh[j] = pack_trits(x + j, 4, QH, id, true);
        x += 4 * QH;
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_tq2_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += sizeof(block_tq2_0)) {
        block_tq2_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        b.d = quill_f32_to_f16(amax);
        for (int j = 0; j < QK_K / 4; j += 32, x += 4 * 32)
            for (int m = 0; m < 32; m++) {
                int q = 0;
                for (int n = 0; n < 4; n++) q += (trit(x[m + n * 32], id) & 3) << (2 * n);
                b.qs[j + m] = (uint8_t)q;
            }
        memcpy(dst, &b, sizeof b);
    }
}
