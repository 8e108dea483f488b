/* Quantization: F32 rows into the GGUF block types, and whole Llama files into the reference
 * quantizer's mixes.
 *
 * Matching the reference's bytes means more than the same algorithm: every block parameter comes
 * out of a search whose comparisons decide between candidates that differ in the last bits, so
 * each float expression below is evaluated in the reference's order (left to right, single
 * precision, no fused multiply-add). Rounding to the nearest integer is half-to-even, as adding
 * 1.5 * 2^23 does in single precision. */
#include "base/error.h"
#include "quill_quantize.h"
#include "tensor/types_internal.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* No fused multiply-add: the reference rounds every product (ISO C mode implies this for GCC,
 * but not -std=gnu11 with FMA hardware enabled). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* Below this a group counts as all zeros (the reference's threshold). */
#define GROUP_EPS 1e-15f

static inline int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Round half to even for |v| < 2^22: in [2^23, 2^24) floats are spaced by one, so adding
 * 1.5 * 2^23 rounds v to an integer that sits in the low mantissa bits. */
static inline int round_even(float v) {
    float biased = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007FFFFF) - 0x00400000;
}

/* Truncation toward zero of v >= 0, capped at `top`; NaN and negatives give 0. */
static inline int trunc_level(float v, int top) {
    if (!(v > 0.0f)) return 0;
    if (v >= (float)top) return top;
    return (int)v;
}

static inline float half_round_trip(quill_half h) { return quill_half_to_float(h); }

/* ---------------------------------------------------------------- 32-element block types */

void quill_from_float_q4_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_0, dst += sizeof(block_q4_0)) {
        /* the element of largest magnitude maps to -8 exactly, its sign kept */
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK4_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -8.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_0 b;
        b.d = quill_f32_to_f16(d);
        for (int j = 0; j < QK4_0 / 2; j++) {
            const int lo = trunc_level(x[j] * id + 8.5f, 15);
            const int hi = trunc_level(x[j + QK4_0 / 2] * id + 8.5f, 15);
            b.qs[j] = (uint8_t)(lo | hi << 4);
        }
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q4_1(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK4_1, dst += sizeof(block_q4_1)) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK4_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 15.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_1 b;
        b.d = quill_f32_to_f16(d);
        b.m = quill_f32_to_f16(min);
        for (int j = 0; j < QK4_1 / 2; j++) {
            const int lo = trunc_level((x[j] - min) * id + 0.5f, 15);
            const int hi = trunc_level((x[j + QK4_1 / 2] - min) * id + 0.5f, 15);
            b.qs[j] = (uint8_t)(lo | hi << 4);
        }
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q5_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_0, dst += sizeof(block_q5_0)) {
        float amax = 0.0f, max = 0.0f;
        for (int j = 0; j < QK5_0; j++) {
            if (amax < fabsf(x[j])) {
                amax = fabsf(x[j]);
                max = x[j];
            }
        }
        const float d = max / -16.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_0 b;
        b.d = quill_f32_to_f16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_0 / 2; j++) {
            const int lo = trunc_level(x[j] * id + 16.5f, 31);
            const int hi = trunc_level(x[j + QK5_0 / 2] * id + 16.5f, 31);
            b.qs[j] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + QK5_0 / 2);
        }
        memcpy(b.qh, &qh, sizeof qh);
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q5_1(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK5_1, dst += sizeof(block_q5_1)) {
        float min = FLT_MAX, max = -FLT_MAX;
        for (int j = 0; j < QK5_1; j++) {
            if (x[j] < min) min = x[j];
            if (x[j] > max) max = x[j];
        }
        const float d = (max - min) / 31.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_1 b;
        b.d = quill_f32_to_f16(d);
        b.m = quill_f32_to_f16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK5_1 / 2; j++) {
            const int lo = trunc_level((x[j] - min) * id + 0.5f, 31);
            const int hi = trunc_level((x[j + QK5_1 / 2] - min) * id + 0.5f, 31);
            b.qs[j] = (uint8_t)((lo & 0xF) | (hi & 0xF) << 4);
            qh |= (uint32_t)(lo >> 4) << j;
            qh |= (uint32_t)(hi >> 4) << (j + QK5_1 / 2);
        }
        memcpy(b.qh, &qh, sizeof qh);
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q8_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK8_0, dst += sizeof(block_q8_0)) {
        float amax = 0.0f;
        for (int j = 0; j < QK8_0; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_0 b;
        b.d = quill_f32_to_f16(d);
        for (int j = 0; j < QK8_0; j++) {
            const float v = roundf(x[j] * id); /* half away from zero, as the reference */
            b.qs[j] = (int8_t)(v >= 127.0f ? 127 : v <= -128.0f ? -128 : v == v ? (int)v : 0);
        }
        memcpy(dst, &b, sizeof b);
    }
}

/* ---------------------------------------------------------------- searches for block scales */

/* Symmetric levels -nmax .. nmax-1 with a scale chosen to minimise sum x^2 (x - scale*l)^2:
 * start from the scale that maps the largest magnitude to -nmax, then try 18 nearby inverse
 * scales, each with its least-squares scale. L receives l + nmax. */
static float fit_symmetric(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)(l + nmax);
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0.0f ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    for (int step = -9; step <= 9; step++) {
        if (step == 0) continue;
        iscale = -((float)nmax + 0.1f * (float)step) / max;
        sumlx = suml2 = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
            const float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0.0f && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + clampi(round_even(iscale * x[i]), -nmax, nmax - 1));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* q3_K's variant: symmetric levels from the max-magnitude scale, then up to five rounds of
 * moving single elements to the level their leave-one-out least-squares scale suggests, kept
 * when the weighted error drops. L receives l + nmax (or zeros for an all-zero group). */
static float fit_symmetric_refine(int n, int nmax, const float *x, int8_t *L) {
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < n; i++) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < GROUP_EPS) {
        memset(L, 0, (size_t)n);
        return 0.0f;
    }
    const float iscale = (float)-nmax / max;
    float sumlx = 0.0f, suml2 = 0.0f;
    for (int i = 0; i < n; i++) {
        const int l = clampi(round_even(iscale * x[i]), -nmax, nmax - 1);
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    for (int round = 0; round < 5; round++) {
        int changed = 0;
        for (int i = 0; i < n; i++) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * (float)L[i];
            if (slx > 0.0f) {
                float sl2 = suml2 - w * (float)L[i] * (float)L[i];
                const int nl = clampi(round_even(x[i] * sl2 / slx), -nmax, nmax - 1);
                if (nl != L[i]) {
                    slx += w * x[i] * (float)nl;
                    sl2 += w * (float)nl * (float)nl;
                    if (sl2 > 0.0f && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)nl;
                        sumlx = slx;
                        suml2 = sl2;
                        changed++;
                    }
                }
            }
        }
        if (!changed) break;
    }
    for (int i = 0; i < n; i++) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* Levels 0..nmax with a scale and a non-positive offset, x ~ scale*l + min, minimising the
 * weighted error (absolute when `use_mad`, else squared): start from the range, then for nstep+1
 * candidate inverse scales (rmin + rdelta*k + nmax) / range take the weighted least-squares
 * scale and offset of the rounded levels, keeping the best. The range uses the best offset found
 * so far, as the reference does. Returns the scale; *neg_min receives -min (>= 0). */
static float fit_affine(int n, int nmax, const float *x, const float *weights, uint8_t *L, float *neg_min,
                        uint8_t *Laux, float rmin, float rdelta, int nstep, bool use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0.0f) min = 0.0f;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *neg_min = -min;
        return 0.0f;
    }
    float iscale = (float)nmax / (max - min);
    float scale = 1.0f / iscale;
    float best_error = 0.0f;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(round_even(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * (float)L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int step = 0; step <= nstep; step++) {
        iscale = (rmin + rdelta * (float)step + (float)nmax) / (max - min);
        float sum_l = 0.0f, sum_l2 = 0.0f, sum_xl = 0.0f;
        for (int i = 0; i < n; i++) {
            const int l = clampi(round_even(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * (float)l;
            sum_l2 += w * (float)l * (float)l;
            sum_xl += w * (float)l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0.0f) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0.0f) {
                this_min = 0.0f;
                this_scale = sum_xl / sum_l2;
            }
            float error = 0.0f;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * (float)Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                error += weights[i] * diff;
            }
            if (error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *neg_min = -min;
    return scale;
}

/* ---------------------------------------------------------------- k-quants (super-blocks of 256) */

/* Four 2-bit levels per byte: byte l of each 32-byte group holds elements l, l+32, l+64, l+96. */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; l++)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 2 | L[j + l + 64] << 4 | L[j + l + 96] << 6);
}

void quill_from_float_q2_K(const float *x, uint8_t *dst, int64_t nb) {
    uint8_t L[QK_K], Laux[16];
    float weights[16], mins[QK_K / 16], scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_q2_K)) {
        float max_scale = 0.0f, max_min = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            for (int l = 0; l < 16; l++) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = fit_affine(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, true);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        block_q2_K b;
        if (max_scale > 0.0f) {
            const float iscale = 15.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) b.scales[j] = (uint8_t)round_even(iscale * scales[j]);
            b.d = quill_f32_to_f16(max_scale / 15.0f);
        } else {
            memset(b.scales, 0, sizeof b.scales);
            b.d = quill_f32_to_f16(0.0f);
        }
        if (max_min > 0.0f) {
            const float iscale = 15.0f / max_min;
            for (int j = 0; j < QK_K / 16; j++) b.scales[j] = (uint8_t)(b.scales[j] | (unsigned)round_even(iscale * mins[j]) << 4);
            b.dmin = quill_f32_to_f16(max_min / 15.0f);
        } else {
            b.dmin = quill_f32_to_f16(0.0f);
        }
        /* requantize against the scales as stored */
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = half_round_trip(b.d) * (float)(b.scales[j] & 0xF);
            if (d == 0.0f) continue;
            const float dm = half_round_trip(b.dmin) * (float)(b.scales[j] >> 4);
            for (int k = 0; k < 16; k++)
                L[16 * j + k] = (uint8_t)clampi(round_even((x[16 * j + k] + dm) / d), 0, 3);
        }
        pack_2bit(L, b.qs);
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q3_K(const float *x, uint8_t *dst, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_q3_K)) {
        float max_scale = 0.0f, amax = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = fit_symmetric_refine(16, 4, x + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > amax) {
                amax = a;
                max_scale = scales[j];
            }
        }
        block_q3_K b;
        memset(b.scales, 0, sizeof b.scales);
        if (max_scale != 0.0f) {
            /* 6-bit signed sub-block scales: low nibbles in bytes 0..7, top two bits in 8..11 */
            const float iscale = -32.0f / max_scale;
            for (int j = 0; j < QK_K / 16; j++) {
                const int l = clampi((int8_t)round_even(iscale * scales[j]), -32, 31) + 32;
                if (j < 8) b.scales[j] = (uint8_t)(l & 0xF);
                else b.scales[j - 8] = (uint8_t)(b.scales[j - 8] | (l & 0xF) << 4);
                b.scales[8 + j % 4] = (uint8_t)(b.scales[8 + j % 4] | (l >> 4) << (2 * (j / 4)));
            }
            b.d = quill_f32_to_f16(1.0f / iscale);
        } else {
            b.d = quill_f32_to_f16(0.0f);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const int lo = j < 8 ? b.scales[j] & 0xF : b.scales[j - 8] >> 4;
            const int sc = (lo | ((b.scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4) - 32;
            const float d = half_round_trip(b.d) * (float)sc;
            if (d == 0.0f) continue;
            for (int k = 0; k < 16; k++) L[16 * j + k] = (int8_t)(clampi(round_even(x[16 * j + k] / d), -4, 3) + 4);
        }
        /* the third bit of element j goes to bit j/32 of hmask[j%32] */
        memset(b.hmask, 0, sizeof b.hmask);
        uint8_t q[QK_K];
        for (int j = 0; j < QK_K; j++) {
            int l = L[j];
            if (l > 3) {
                b.hmask[j % 32] = (uint8_t)(b.hmask[j % 32] | 1u << (j / 32));
                l -= 4;
            }
            q[j] = (uint8_t)l;
        }
        pack_2bit(q, b.qs);
        memcpy(dst, &b, sizeof b);
    }
}

/* Six-bit scales and mins of q4_K / q5_K's eight sub-blocks, packed as quill_scale_min_k4 reads
 * them. */
static void pack_scale_min_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t out[K_SCALE_SIZE]) {
    for (int j = 0; j < 8; j++) {
        if (j < 4) {
            out[j] = ls[j];
            out[j + 4] = lm[j];
        } else {
            out[j + 4] = (uint8_t)((ls[j] & 0xF) | (lm[j] & 0xF) << 4);
            out[j - 4] = (uint8_t)(out[j - 4] | (ls[j] >> 4) << 6);
            out[j] = (uint8_t)(out[j] | (lm[j] >> 4) << 6);
        }
    }
}

/* The shared part of q4_K and q5_K: per 32-element sub-block an affine fit with weights
 * rms(sub-block) + |x|, scales and mins quantized to 6 bits against the largest, levels
 * recomputed against the stored values. */
static void affine_k_blocks(const float *x, int nmax, float rmin, int nstep, uint8_t L[QK_K], quill_half *d_out,
                            quill_half *dmin_out, uint8_t packed[K_SCALE_SIZE]) {
    uint8_t Laux[32], ls[8], lm[8];
    float weights[32], mins[8], scales[8];
    float max_scale = 0.0f, max_min = 0.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0.0f;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32.0f);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = fit_affine(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, false);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
    const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
    for (int j = 0; j < QK_K / 32; j++) {
        const uint8_t s = (uint8_t)round_even(inv_scale * scales[j]);
        const uint8_t m = (uint8_t)round_even(inv_min * mins[j]);
        ls[j] = s < 63 ? s : 63;
        lm[j] = m < 63 ? m : 63;
    }
    pack_scale_min_k4(ls, lm, packed);
    *d_out = quill_f32_to_f16(max_scale / 63.0f);
    *dmin_out = quill_f32_to_f16(max_min / 63.0f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t sc, m;
        quill_scale_min_k4(j, packed, &sc, &m);
        const float d = half_round_trip(*d_out) * (float)sc;
        if (d == 0.0f) continue;
        const float dm = half_round_trip(*dmin_out) * (float)m;
        for (int k = 0; k < 32; k++) L[32 * j + k] = (uint8_t)clampi(round_even((x[32 * j + k] + dm) / d), 0, nmax);
    }
}

void quill_from_float_q4_K(const float *x, uint8_t *dst, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_q4_K)) {
        block_q4_K b;
        affine_k_blocks(x, 15, -1.0f, 20, L, &b.d, &b.dmin, b.scales);
        /* byte l of each 32-byte group: element l of a 64-element chunk low, l+32 high */
        for (int j = 0; j < QK_K; j += 64)
            for (int l = 0; l < 32; l++) b.qs[j / 2 + l] = (uint8_t)(L[j + l] | L[j + l + 32] << 4);
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q5_K(const float *x, uint8_t *dst, int64_t nb) {
    uint8_t L[QK_K];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_q5_K)) {
        block_q5_K b;
        affine_k_blocks(x, 31, -0.5f, 15, L, &b.d, &b.dmin, b.scales);
        memset(b.qh, 0, sizeof b.qh);
        /* the fifth bit of element j + 32*k (j < 32) of chunk c goes to bit 2c+k of qh[j] */
        for (int c = 0; c < QK_K / 64; c++) {
            for (int j = 0; j < 32; j++) {
                int l1 = L[64 * c + j], l2 = L[64 * c + j + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    b.qh[j] = (uint8_t)(b.qh[j] | 1u << (2 * c));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    b.qh[j] = (uint8_t)(b.qh[j] | 2u << (2 * c));
                }
                b.qs[32 * c + j] = (uint8_t)(l1 | l2 << 4);
            }
        }
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_q6_K(const float *x, uint8_t *dst, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_q6_K)) {
        float max_scale = 0.0f, max_abs = 0.0f;
        for (int j = 0; j < QK_K / 16; j++) {
            scales[j] = fit_symmetric(16, 32, x + 16 * j, L + 16 * j);
            const float a = fabsf(scales[j]);
            if (a > max_abs) {
                max_abs = a;
                max_scale = scales[j];
            }
        }
        block_q6_K b;
        if (max_abs < GROUP_EPS) {
            memset(&b, 0, sizeof b);
            b.d = quill_f32_to_f16(0.0f);
            memcpy(dst, &b, sizeof b);
            continue;
        }
        const float iscale = -128.0f / max_scale;
        b.d = quill_f32_to_f16(1.0f / iscale);
        for (int j = 0; j < QK_K / 16; j++) {
            const int s = round_even(iscale * scales[j]);
            b.scales[j] = (int8_t)(s < 127 ? s : 127);
        }
        for (int j = 0; j < QK_K / 16; j++) {
            const float d = half_round_trip(b.d) * (float)b.scales[j];
            if (d == 0.0f) continue;
            for (int k = 0; k < 16; k++) L[16 * j + k] = (int8_t)(clampi(round_even(x[16 * j + k] / d), -32, 31) + 32);
        }
        /* per 128 elements: low nibbles of l and l+64 share ql[l], of l+32 and l+96 share
         * ql[l+32]; the top two bits of all four go to qh[l] */
        for (int h = 0; h < QK_K / 128; h++) {
            const int8_t *Lh = L + 128 * h;
            uint8_t *ql = b.ql + 64 * h, *qh = b.qh + 32 * h;
            for (int l = 0; l < 32; l++) {
                ql[l] = (uint8_t)((Lh[l] & 0xF) | (Lh[l + 64] & 0xF) << 4);
                ql[l + 32] = (uint8_t)((Lh[l + 32] & 0xF) | (Lh[l + 96] & 0xF) << 4);
                qh[l] = (uint8_t)(Lh[l] >> 4 | (Lh[l + 32] >> 4) << 2 | (Lh[l + 64] >> 4) << 4 | (Lh[l + 96] >> 4) << 6);
            }
        }
        memcpy(dst, &b, sizeof b);
    }
}

/* ---------------------------------------------------------------- iq4_nl / iq4_xs */

/* Index of the level nearest to v in the sorted table (ties to the upper level). */
static int nearest_level(const int8_t *values, float v) {
    if (v <= values[0]) return 0;
    if (v >= values[15]) return 15;
    int lo = 0, hi = 15;
    while (hi - lo > 1) {
        const int mid = (lo + hi) / 2;
        if (v < values[mid]) hi = mid;
        else lo = mid;
    }
    return v - (float)values[hi - 1] < (float)values[hi] - v ? hi - 1 : hi;
}

/* Scale of one 32-element group on the non-uniform grid: from the max-magnitude element onto
 * the grid's first level, then 15 candidate inverse scales, each with its least-squares scale
 * (weights x^2). Returns 0 for an all-zero group. */
static float iq4_group_scale(const float *x, const int8_t *values) {
    const int ntry = 7;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    if (amax < GROUP_EPS) return 0.0f;
    float d = -max / (float)values[0];
    float id = 1.0f / d;
    float sumqx = 0.0f, sumq2 = 0.0f;
    for (int j = 0; j < 32; j++) {
        const float q = (float)values[nearest_level(values, id * x[j])];
        const float w = x[j] * x[j];
        sumqx += w * q * x[j];
        sumq2 += w * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int t = -ntry; t <= ntry; t++) {
        id = (float)(t + values[0]) / max;
        sumqx = sumq2 = 0.0f;
        for (int j = 0; j < 32; j++) {
            const float q = (float)values[nearest_level(values, id * x[j])];
            const float w = x[j] * x[j];
            sumqx += w * q * x[j];
            sumq2 += w * q * q;
        }
        if (sumq2 > 0.0f && sumqx * sumqx > best * sumq2) {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    return d;
}

/* 32 four-bit indices: byte j holds element j (low) and element j+16 (high). */
static void pack_iq4(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < 16; j++) qs[j] = (uint8_t)(L[j] | L[j + 16] << 4);
}

void quill_from_float_iq4_nl(const float *x, uint8_t *dst, int64_t nb) {
    const int8_t *values = quill_kvalues_iq4nl;
    uint8_t L[32];
    for (int64_t i = 0; i < nb; i++, x += QK4_NL, dst += sizeof(block_iq4_nl)) {
        const float d = iq4_group_scale(x, values);
        block_iq4_nl b;
        b.d = quill_f32_to_f16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_level(values, id * x[j]);
        pack_iq4(L, b.qs);
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_iq4_xs(const float *x, uint8_t *dst, int64_t nb) {
    const int8_t *values = quill_kvalues_iq4nl;
    uint8_t L[32];
    float scales[QK_K / 32];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_iq4_xs)) {
        float max_scale = 0.0f, amax_scale = 0.0f;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            scales[ib] = iq4_group_scale(x + 32 * ib, values);
            if (fabsf(scales[ib]) > amax_scale) {
                amax_scale = fabsf(scales[ib]);
                max_scale = scales[ib];
            }
        }
        block_iq4_xs b;
        memset(&b, 0, sizeof b);
        const float d = -max_scale / 32.0f;
        b.d = quill_f32_to_f16(d);
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        uint16_t scales_h = 0;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int l = clampi(round_even(id * scales[ib]), -32, 31);
            const float dl = d * (float)l;
            const float idl = dl != 0.0f ? 1.0f / dl : 0.0f;
            for (int j = 0; j < 32; j++) L[j] = (uint8_t)nearest_level(values, idl * x[32 * ib + j]);
            pack_iq4(L, b.qs + 16 * ib);
            l += 32;
            if (ib % 2 == 0) b.scales_l[ib / 2] = (uint8_t)(l & 0xF);
            else b.scales_l[ib / 2] = (uint8_t)(b.scales_l[ib / 2] | (l & 0xF) << 4);
            scales_h = (uint16_t)(scales_h | (l >> 4) << (2 * ib));
        }
        b.scales_h = scales_h;
        memcpy(dst, &b, sizeof b);
    }
}

/* ---------------------------------------------------------------- rows */

typedef void (*quant_fn)(const float *x, uint8_t *dst, int64_t n_blocks);

void quill_from_float_f32(const float *x, uint8_t *dst, int64_t n) { memcpy(dst, x, (size_t)n * sizeof(float)); }
void quill_from_float_f16(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = quill_f32_to_f16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}
void quill_from_float_bf16(const float *x, uint8_t *dst, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const uint16_t h = quill_f32_to_bf16(x[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

#define QUANT_ROW(ctx, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)                                  \
    QUILL_IF(quantizes, [QUILL_TYPE_##ID] = quill_from_float_##sfx, )
static const quant_fn quant_fns[QUILL_TYPE_COUNT] = {QUILL_TYPE_LIST(QUANT_ROW, )};
#undef QUANT_ROW

static quant_fn quant_for(uint32_t type) { return type < QUILL_TYPE_COUNT ? quant_fns[type] : NULL; }

bool quill_can_quantize(uint32_t type) { return quant_for(type) != NULL; }

quill_status quill_quantize_rows(uint32_t type, const float *src, void *dst, int64_t n_rows, int64_t n_per_row,
                                 quill_error *err) {
    quant_fn fn = quant_for(type);
    if (!fn) return quill_fail(err, QUILL_E_UNSUPPORTED, "quantize: quill cannot produce type %s", quill_type_name(type));
    const quill_type_traits *tr = quill_type_traits_of(type);
    if (n_rows < 0 || n_per_row <= 0 || n_per_row % tr->block_size != 0)
        return quill_fail(err, QUILL_E_ARG, "quantize: rows of %lld elements do not split into %s blocks of %lld",
                          (long long)n_per_row, tr->name, (long long)tr->block_size);
    if (n_rows == 0) return QUILL_OK;
    if (!src || !dst) return quill_fail(err, QUILL_E_ARG, "quantize: NULL buffer");
    fn(src, dst, n_rows * (n_per_row / tr->block_size));
    return QUILL_OK;
}

/* ---------------------------------------------------------------- file types */

typedef struct {
    const char *name;
    quill_ftype ftype;
    uint32_t base;
} ftype_info;

static const ftype_info ftypes[] = {
    {"f32", QUILL_FTYPE_ALL_F32, QUILL_TYPE_F32},
    {"f16", QUILL_FTYPE_MOSTLY_F16, QUILL_TYPE_F16},
    {"bf16", QUILL_FTYPE_MOSTLY_BF16, QUILL_TYPE_BF16},
    {"q8_0", QUILL_FTYPE_MOSTLY_Q8_0, QUILL_TYPE_Q8_0},
    {"q4_0", QUILL_FTYPE_MOSTLY_Q4_0, QUILL_TYPE_Q4_0},
    {"q4_1", QUILL_FTYPE_MOSTLY_Q4_1, QUILL_TYPE_Q4_1},
    {"q5_0", QUILL_FTYPE_MOSTLY_Q5_0, QUILL_TYPE_Q5_0},
    {"q5_1", QUILL_FTYPE_MOSTLY_Q5_1, QUILL_TYPE_Q5_1},
    {"q2_k", QUILL_FTYPE_MOSTLY_Q2_K, QUILL_TYPE_Q2_K},
    {"q3_k_s", QUILL_FTYPE_MOSTLY_Q3_K_S, QUILL_TYPE_Q3_K},
    {"q3_k_m", QUILL_FTYPE_MOSTLY_Q3_K_M, QUILL_TYPE_Q3_K},
    {"q3_k_l", QUILL_FTYPE_MOSTLY_Q3_K_L, QUILL_TYPE_Q3_K},
    {"q4_k_s", QUILL_FTYPE_MOSTLY_Q4_K_S, QUILL_TYPE_Q4_K},
    {"q4_k_m", QUILL_FTYPE_MOSTLY_Q4_K_M, QUILL_TYPE_Q4_K},
    {"q5_k_s", QUILL_FTYPE_MOSTLY_Q5_K_S, QUILL_TYPE_Q5_K},
    {"q5_k_m", QUILL_FTYPE_MOSTLY_Q5_K_M, QUILL_TYPE_Q5_K},
    {"q6_k", QUILL_FTYPE_MOSTLY_Q6_K, QUILL_TYPE_Q6_K},
    {"iq4_nl", QUILL_FTYPE_MOSTLY_IQ4_NL, QUILL_TYPE_IQ4_NL},
    {"iq4_xs", QUILL_FTYPE_MOSTLY_IQ4_XS, QUILL_TYPE_IQ4_XS},
    {"tq1_0", QUILL_FTYPE_MOSTLY_TQ1_0, QUILL_TYPE_TQ1_0},
    {"tq2_0", QUILL_FTYPE_MOSTLY_TQ2_0, QUILL_TYPE_TQ2_0},
    {"mxfp4_moe", QUILL_FTYPE_MOSTLY_MXFP4_MOE, QUILL_TYPE_MXFP4},
    {"q1_0", QUILL_FTYPE_MOSTLY_Q1_0, QUILL_TYPE_Q1_0},
    {"q2_0", QUILL_FTYPE_MOSTLY_Q2_0, QUILL_TYPE_Q2_0},
    {"iq3_s", QUILL_FTYPE_MOSTLY_IQ3_S, QUILL_TYPE_IQ3_S},
    {"iq3_m", QUILL_FTYPE_MOSTLY_IQ3_M, QUILL_TYPE_IQ3_S},
};

/* The reference's file types whose blocks it only makes with an importance matrix (or, for
 * iq3_xs, whose mix puts some tensors in such a type): quill computes none, so it refuses them. */
static const char *const imatrix_ftypes[] = {"iq2_xxs", "iq2_xs", "iq2_s", "iq2_m", "iq1_s",
                                             "iq1_m",   "iq3_xxs", "iq3_xs", "q2_k_s"};
#define N_FTYPES (sizeof ftypes / sizeof ftypes[0])

/* The reference quantizer's shorthands: a bare k-quant means its _m mix. */
static const struct { const char *alias, *name; } ftype_aliases[] = {
    {"q3_k", "q3_k_m"}, {"q4_k", "q4_k_m"}, {"q5_k", "q5_k_m"},
};

static const ftype_info *ftype_lookup(quill_ftype f) {
    for (size_t i = 0; i < N_FTYPES; i++)
        if (ftypes[i].ftype == f) return &ftypes[i];
    return NULL;
}

bool quill_ftype_from_name(const char *name, quill_ftype *out) {
    char lower[16];
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof lower) return false;
    for (size_t i = 0; i <= n; i++) lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] - 'A' + 'a' : name[i]);
    for (size_t i = 0; i < sizeof ftype_aliases / sizeof ftype_aliases[0]; i++)
        if (!strcmp(lower, ftype_aliases[i].alias)) return quill_ftype_from_name(ftype_aliases[i].name, out);
    for (size_t i = 0; i < N_FTYPES; i++) {
        if (!strcmp(lower, ftypes[i].name)) {
            *out = ftypes[i].ftype;
            return true;
        }
    }
    return false;
}

quill_status quill_ftype_parse(const char *name, quill_ftype *out, quill_error *err) {
    if (quill_ftype_from_name(name, out)) return QUILL_OK;
    char lower[16];
    size_t n = strlen(name);
    for (size_t i = 0; i <= n && n < sizeof lower; i++)
        lower[i] = (char)((name[i] >= 'A' && name[i] <= 'Z') ? name[i] - 'A' + 'a' : name[i]);
    for (size_t i = 0; n < sizeof lower && i < sizeof imatrix_ftypes / sizeof imatrix_ftypes[0]; i++)
        if (!strcmp(lower, imatrix_ftypes[i]))
            return quill_fail(err, QUILL_E_UNSUPPORTED,
                              "quantize: %s needs an importance matrix (the reference's llama-imatrix output, "
                              "passed with --imatrix), which quill does not compute; quantize to it with the "
                              "reference's tools, or choose a type that needs none: %s",
                              lower, quill_ftype_names());
    return quill_fail(err, QUILL_E_ARG, "quantize: unknown type '%.32s'; choose one of: %s", name, quill_ftype_names());
}

const char *quill_ftype_name(quill_ftype ftype) {
    const ftype_info *f = ftype_lookup(ftype);
    return f ? f->name : NULL;
}

uint32_t quill_ftype_base_type(quill_ftype ftype) {
    const ftype_info *f = ftype_lookup(ftype);
    return f ? f->base : QUILL_TYPE_COUNT;
}

const char *quill_ftype_names(void) {
    return "q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k_s q3_k_m q3_k_l q4_k_s q4_k_m q5_k_s q5_k_m q6_k iq4_nl iq4_xs "
           "tq1_0 tq2_0 q1_0 q2_0 iq3_s iq3_m mxfp4_moe f16 bf16 f32 (q3_k, q4_k, q5_k = the _m mixes)";
}

/* ---------------------------------------------------------------- per-tensor types */

static bool is_quantized_type(uint32_t t) {
    return t != QUILL_TYPE_F32 && t != QUILL_TYPE_F16 && t != QUILL_TYPE_BF16 && t != QUILL_TYPE_F64 &&
           t != QUILL_TYPE_I8 && t != QUILL_TYPE_I16 && t != QUILL_TYPE_I32 && t != QUILL_TYPE_I64;
}

static bool contains(const char *s, const char *needle) { return strstr(s, needle) != NULL; }

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* Dimensions up to the last one above 1 (a [n, 1] matrix counts as a vector). */
static int effective_dims(const quill_gguf_tensor *t) {
    int n = 1;
    for (int d = 1; d < 4; d++)
        if (t->ne[d] > 1) n = d + 1;
    return n;
}

/* Which tensors the reference quantizes at all: 2-D+ weights except norms, router gates,
 * positional tables and a few small architecture-specific ones. */
static bool wants_quantization(const quill_gguf_tensor *t) {
    const char *name = t->name;
    if (effective_dims(t) < 2 || !ends_with(name, "weight")) return false;
    static const char *const keep[] = {
        "_norm.weight", "ffn_gate_inp.weight", "ssm_conv1d.weight", "shortconv.conv.weight", "time_mix_first.weight",
        "time_mix_w1.weight", "time_mix_w2.weight", "time_mix_decay_w1.weight", "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight", "attn_rel_b.weight", "altup", "laurel", "per_layer_model_proj",
    };
    for (size_t i = 0; i < sizeof keep / sizeof keep[0]; i++)
        if (contains(name, keep[i])) return false;
    return strcmp(name, "position_embd.weight") != 0 && strcmp(name, "token_types.weight") != 0;
}

typedef struct {
    quill_ftype ftype;
    int n_layer, n_gqa, n_expert;
    bool is_70b, has_output;
    int n_attention_wv, i_attention_wv, i_ffn_down, i_ffn_gate, i_ffn_up;
} mix_state;

/* The reference's "use_more_bits": the first and last eighth of the layers and every third in
 * between. */
static bool use_more_bits(int i_layer, int n_layers) {
    return i_layer < n_layers / 8 || i_layer >= 7 * n_layers / 8 || (i_layer - n_layers / 8) % 3 == 2;
}

/* Layer index of a per-layer tensor: its position among its kind, or (models with experts) the
 * number in its name. */
static int layer_of(const mix_state *s, int counter, const char *name) {
    if (s->n_expert > 1) {
        int layer;
        if (sscanf(name, "blk.%d.", &layer) == 1) return layer;
    }
    return counter;
}

static int64_t block_size_of(uint32_t type) { return quill_type_traits_of(type)->block_size; }

/* Rows the chosen type cannot split take the reference's fallback: a 32-element block type of
 * about the same size, else f16. QUILL_TYPE_COUNT when there is none (the 32-block types). */
static uint32_t fit_rows(const quill_gguf_tensor *t, uint32_t type, bool *fallback) {
    if (t->ne[0] % block_size_of(type) == 0) return type;
    *fallback = true;
    switch (type) {
    case QUILL_TYPE_IQ3_S:
    case QUILL_TYPE_IQ4_XS: type = QUILL_TYPE_IQ4_NL; break;
    case QUILL_TYPE_Q2_K: /* this reference's choice; early-2025 versions took iq4_nl */
    case QUILL_TYPE_Q3_K:
    case QUILL_TYPE_Q2_0:
    case QUILL_TYPE_TQ1_0:
    case QUILL_TYPE_TQ2_0: type = QUILL_TYPE_Q4_0; break;
    case QUILL_TYPE_Q4_K: type = QUILL_TYPE_Q5_0; break;
    case QUILL_TYPE_Q5_K: type = QUILL_TYPE_Q5_1; break;
    case QUILL_TYPE_Q6_K: type = QUILL_TYPE_Q8_0; break;
    default: return QUILL_TYPE_COUNT;
    }
    return t->ne[0] % block_size_of(type) == 0 ? type : QUILL_TYPE_F16;
}

/* The reference's choice for one tensor of a mix (llama_tensor_get_type, early 2025), for the
 * file types quill produces; `fallback` tells whether the row length forced another type.
 * Returns QUILL_TYPE_COUNT when no type fits the rows. */
static uint32_t mix_type(mix_state *s, const quill_gguf_tensor *t, bool *fallback) {
    const quill_ftype f = s->ftype;
    const char *name = t->name;
    uint32_t type = quill_ftype_base_type(f);
    *fallback = false;

    /* (Gemma 4's per-layer token embeddings count as token embeddings) */
    const bool token_embd = !strcmp(name, "token_embd.weight") || !strcmp(name, "per_layer_token_embd.weight");
    if (!strcmp(name, "output.weight") || (!s->has_output && token_embd)) {
        if (f == QUILL_FTYPE_MOSTLY_MXFP4_MOE || t->ne[0] % block_size_of(type) != 0) type = QUILL_TYPE_Q8_0;
        else if (type != QUILL_TYPE_Q8_0) type = QUILL_TYPE_Q6_K;
    } else if (f == QUILL_FTYPE_MOSTLY_MXFP4_MOE) {
        /* experts (3-D) in mxfp4, every other matrix in q8_0 */
        type = t->ne[2] > 1 ? QUILL_TYPE_MXFP4 : QUILL_TYPE_Q8_0;
    } else if (token_embd) {
        if (f == QUILL_FTYPE_MOSTLY_TQ1_0 || f == QUILL_FTYPE_MOSTLY_TQ2_0 || f == QUILL_FTYPE_MOSTLY_Q2_0)
            type = QUILL_TYPE_Q4_K;
    } else if (contains(name, "attn_v.weight") || contains(name, "attn_kv_b.weight")) {
        /* (the older DeepSeek files' attn_kv_b holds the values: the reference treats it as attn_v) */
        if (f == QUILL_FTYPE_MOSTLY_Q2_K) type = s->n_gqa >= 4 ? QUILL_TYPE_Q4_K : QUILL_TYPE_Q3_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_M) type = s->i_attention_wv < 2 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_L) type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_IQ3_S && s->n_gqa >= 4) type = QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_IQ3_M) type = QUILL_TYPE_Q4_K;
        else if ((f == QUILL_FTYPE_MOSTLY_IQ4_NL || f == QUILL_FTYPE_MOSTLY_IQ4_XS) && s->n_gqa >= 4)
            type = QUILL_TYPE_Q5_K;
        else if ((f == QUILL_FTYPE_MOSTLY_Q4_K_M || f == QUILL_FTYPE_MOSTLY_Q5_K_M) &&
                 use_more_bits(s->i_attention_wv, s->n_attention_wv))
            type = QUILL_TYPE_Q6_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_S && s->i_attention_wv < 4) type = QUILL_TYPE_Q5_K;
        /* 70B: eight heads share each attn_v, which is small; more bits are nearly free */
        if (s->is_70b && (type == QUILL_TYPE_Q3_K || type == QUILL_TYPE_Q4_K)) type = QUILL_TYPE_Q5_K;
        if (s->n_expert == 8) type = QUILL_TYPE_Q8_0;
        s->i_attention_wv++;
    } else if (contains(name, "attn_k.weight")) {
        if (s->n_expert == 8) type = QUILL_TYPE_Q8_0;
    } else if (contains(name, "attn_q.weight")) {
        /* unchanged for these mixes */
    } else if (contains(name, "ffn_down")) {
        const int il = layer_of(s, s->i_ffn_down, name), nl = s->n_layer;
        if (f == QUILL_FTYPE_MOSTLY_Q2_K) type = QUILL_TYPE_Q3_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_M) type = il < nl / 16 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_IQ3_M && (il < nl / 8 || (s->n_expert == 8 && use_more_bits(il, nl))))
            type = QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q3_K_L) type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_M) {
            if (use_more_bits(il, nl)) type = QUILL_TYPE_Q6_K;
        } else if (il < nl / 8 && (f == QUILL_FTYPE_MOSTLY_IQ4_NL || f == QUILL_FTYPE_MOSTLY_IQ4_XS))
            type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q5_K_M && use_more_bits(il, nl)) type = QUILL_TYPE_Q6_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_S && il < nl / 8) type = QUILL_TYPE_Q5_K;
        s->i_ffn_down++;
    } else if (contains(name, "attn_output.weight")) {
        if (s->n_expert == 8) {
            if (f == QUILL_FTYPE_MOSTLY_Q2_K || f == QUILL_FTYPE_MOSTLY_Q3_K_S || f == QUILL_FTYPE_MOSTLY_Q3_K_M ||
                f == QUILL_FTYPE_MOSTLY_IQ4_NL || f == QUILL_FTYPE_MOSTLY_Q4_K_S || f == QUILL_FTYPE_MOSTLY_Q4_K_M ||
                f == QUILL_FTYPE_MOSTLY_IQ4_XS || f == QUILL_FTYPE_MOSTLY_IQ3_S || f == QUILL_FTYPE_MOSTLY_IQ3_M)
                type = QUILL_TYPE_Q5_K;
        } else {
            if (f == QUILL_FTYPE_MOSTLY_Q2_K) type = QUILL_TYPE_Q3_K;
            else if (f == QUILL_FTYPE_MOSTLY_Q3_K_M) type = QUILL_TYPE_Q4_K;
            else if (f == QUILL_FTYPE_MOSTLY_Q3_K_L) type = QUILL_TYPE_Q5_K;
            else if (f == QUILL_FTYPE_MOSTLY_IQ3_M) type = QUILL_TYPE_Q4_K;
        }
    } else if (contains(name, "attn_qkv.weight")) {
        if (f == QUILL_FTYPE_MOSTLY_Q3_K_M || f == QUILL_FTYPE_MOSTLY_Q3_K_L || f == QUILL_FTYPE_MOSTLY_IQ3_M)
            type = QUILL_TYPE_Q4_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q4_K_M) type = QUILL_TYPE_Q5_K;
        else if (f == QUILL_FTYPE_MOSTLY_Q5_K_M) type = QUILL_TYPE_Q6_K;
    } else if (contains(name, "ffn_gate")) {
        s->i_ffn_gate++;
    } else if (contains(name, "ffn_up")) {
        s->i_ffn_up++;
    }

    return fit_rows(t, type, fallback);
}

/* Output order: tensors outside the blocks, then block 0, 1, ... (numerically), by name within
 * each group — the order of the reference's tensor map. */
static int layer_number(const char *name) {
    int layer = -1;
    if (sscanf(name, "blk.%d.", &layer) != 1) layer = -1;
    return layer;
}

/* Merge sort: stable, and needs no global for the comparison's context. */
static void sort_output_order(const quill_gguf *g, uint64_t *order, uint64_t *tmp, uint64_t n) {
    if (n < 2) return;
    const uint64_t half = n / 2;
    sort_output_order(g, order, tmp, half);
    sort_output_order(g, order + half, tmp, n - half);
    uint64_t i = 0, j = half, k = 0;
    while (i < half && j < n) {
        const quill_gguf_tensor *ta = quill_gguf_tensor_at(g, order[i]), *tb = quill_gguf_tensor_at(g, order[j]);
        const int la = layer_number(ta->name), lb = layer_number(tb->name);
        const bool take_right = la != lb ? lb < la : strcmp(tb->name, ta->name) < 0;
        tmp[k++] = take_right ? order[j++] : order[i++];
    }
    while (i < half) tmp[k++] = order[i++];
    while (j < n) tmp[k++] = order[j++];
    memcpy(order, tmp, n * sizeof *order);
}

static int64_t get_int(const quill_gguf *g, const char *arch, size_t arch_len, const char *suffix, int64_t fallback) {
    char key[160];
    snprintf(key, sizeof key, "%.*s.%s", (int)arch_len, arch, suffix);
    int64_t v;
    /* (a per-layer array, Gemma 4's: layer 0's value, as the reference's hparams give it) */
    const quill_gguf_value *arr = quill_gguf_find(g, key);
    uint64_t cursor = 0;
    quill_gguf_value first;
    if (arr && arr->type == QUILL_GGUF_ARRAY)
        return quill_gguf_array_next(arr, &cursor, &first) && quill_gguf_value_i64(&first, &v) ? v : fallback;
    if (quill_gguf_get_i64(g, key, &v, NULL) != QUILL_OK) return fallback;
    return v;
}

quill_status quill_quantize_plan(const quill_gguf *in, quill_ftype ftype, bool pure, quill_quant_choice *choices,
                                 quill_error *err) {
    const ftype_info *fi = ftype_lookup(ftype);
    if (!fi) return quill_fail(err, QUILL_E_ARG, "quantize: unsupported file type %d", (int)ftype);
    const uint64_t n = quill_gguf_n_tensors(in);

    mix_state s;
    memset(&s, 0, sizeof s);
    s.ftype = ftype;
    const char *arch = "llama";
    size_t arch_len = 5;
    if (quill_gguf_get_str(in, "general.architecture", &arch, &arch_len, NULL) != QUILL_OK) {
        arch = "llama";
        arch_len = 5;
    }
    s.n_layer = (int)get_int(in, arch, arch_len, "block_count", 0);
    const int64_t n_head = get_int(in, arch, arch_len, "attention.head_count", 0);
    const int64_t n_head_kv = get_int(in, arch, arch_len, "attention.head_count_kv", n_head);
    s.n_gqa = n_head_kv > 0 ? (int)(n_head / n_head_kv) : 0;
    s.n_expert = (int)get_int(in, arch, arch_len, "expert_count", 0);
    s.is_70b = arch_len == 5 && !memcmp(arch, "llama", 5) && s.n_layer == 80 && n_head != n_head_kv;

    for (uint64_t i = 0; i < n; i++) {
        const char *name = quill_gguf_tensor_at(in, i)->name;
        if (contains(name, "attn_v.weight") || contains(name, "attn_qkv.weight") || contains(name, "attn_kv_b.weight"))
            s.n_attention_wv++;
        else if (!strcmp(name, "output.weight"))
            s.has_output = true;
    }

    uint64_t *order = malloc((n ? n : 1) * sizeof *order), *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!order || !tmp) {
        free(order);
        free(tmp);
        return quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
    }
    for (uint64_t i = 0; i < n; i++) order[i] = i;
    sort_output_order(in, order, tmp, n);
    free(tmp);

    const bool mix = is_quantized_type(fi->base);
    quill_status st = QUILL_OK;
    for (uint64_t k = 0; k < n && st == QUILL_OK; k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(in, order[k]);
        quill_quant_choice *c = &choices[k];
        c->src_index = order[k];
        c->type = t->type;
        c->quantized = false;
        c->fallback = false;
        if (!wants_quantization(t)) continue;
        uint32_t type = fi->base;
        if (mix) {
            type = pure ? fit_rows(t, type, &c->fallback) : mix_type(&s, t, &c->fallback);
            if (type == QUILL_TYPE_COUNT) {
                st = quill_fail(err, QUILL_E_UNSUPPORTED,
                                "quantize: tensor '%s' has rows of %lld elements, which %s blocks of %lld do not "
                                "divide and no fallback type fits",
                                t->name, (long long)t->ne[0], quill_type_name(fi->base),
                                (long long)block_size_of(fi->base));
                break;
            }
        } else if (t->ne[0] % block_size_of(type) != 0) {
            st = quill_fail(err, QUILL_E_UNSUPPORTED, "quantize: tensor '%s': rows of %lld do not fit %s",
                            t->name, (long long)t->ne[0], quill_type_name(type));
            break;
        }
        if (type == t->type) continue;
        if (t->type != QUILL_TYPE_F32 && t->type != QUILL_TYPE_F16 && t->type != QUILL_TYPE_BF16) {
            st = quill_fail(err, QUILL_E_UNSUPPORTED,
                            "quantize: tensor '%s' is %s; requantizing is not supported (start from an F32, "
                            "F16 or BF16 model)",
                            t->name, quill_type_name(t->type));
            break;
        }
        c->type = type;
        c->quantized = true;
    }
    free(order);
    return st;
}

/* ---------------------------------------------------------------- whole files */

typedef struct {
    const uint8_t *src;     /* rows of the source tensor */
    uint32_t src_type;
    size_t src_row_bytes;
    float *f32;             /* scratch: n_threads * n_per_row floats */
    uint8_t *dst;
    size_t dst_row_bytes;
    uint32_t dst_type;
    int64_t n_per_row;
} quant_job;

static void to_f32_row(uint32_t type, const uint8_t *src, float *dst, int64_t n) {
    if (type == QUILL_TYPE_F32) {
        memcpy(dst, src, (size_t)n * sizeof(float));
    } else {
        const int bf = type == QUILL_TYPE_BF16;
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = bf ? quill_bfloat_to_float(h) : quill_half_to_float(h);
        }
    }
}

typedef struct {
    const quant_job *job;
    int64_t begin, end;
    float *row;
} quant_slice;

static void *quant_slice_run(void *arg) {
    const quant_slice *s = arg;
    const quant_job *j = s->job;
    const quill_type_traits *tr = quill_type_traits_of(j->dst_type);
    quant_fn fn = quant_for(j->dst_type);
    for (int64_t r = s->begin; r < s->end; r++) {
        to_f32_row(j->src_type, j->src + (size_t)r * j->src_row_bytes, s->row, j->n_per_row);
        fn(s->row, j->dst + (size_t)r * j->dst_row_bytes, j->n_per_row / tr->block_size);
    }
    return NULL;
}

#define MAX_THREADS 256

/* Quantizes rows [0, n_rows) of the job, split into contiguous slices over up to n_threads
 * threads (the caller takes the first). Chunks are millions of elements, so starting threads per
 * chunk costs nothing measurable; every row's bytes are independent of the split. */
static void quant_rows_parallel(const quant_job *job, int64_t n_rows, int n_threads) {
    int64_t min_rows = 65536 / job->n_per_row;
    if (min_rows < 1) min_rows = 1;
    int n = n_threads;
    if (n > MAX_THREADS) n = MAX_THREADS;
    if ((int64_t)n > n_rows / min_rows) n = (int)(n_rows / min_rows);
    if (n < 1) n = 1;
    quant_slice slices[MAX_THREADS];
    pthread_t threads[MAX_THREADS];
    bool started[MAX_THREADS] = {false};
    for (int t = 0; t < n; t++) {
        slices[t] = (quant_slice){job, n_rows * t / n, n_rows * (t + 1) / n, job->f32 + (size_t)t * (size_t)job->n_per_row};
        if (t > 0) started[t] = pthread_create(&threads[t], NULL, quant_slice_run, &slices[t]) == 0;
    }
    quant_slice_run(&slices[0]);
    for (int t = 1; t < n; t++) {
        if (started[t]) pthread_join(threads[t], NULL);
        else quant_slice_run(&slices[t]); /* could not start a thread: do its share here */
    }
}

static bool skip_key(const char *key) {
    return !strcmp(key, "general.file_type") || !strcmp(key, "general.quantization_version") ||
           !strcmp(key, "split.no") || !strcmp(key, "split.count") || !strcmp(key, "split.tensors.count");
}

quill_status quill_quantize_file(const char *in_path, const char *out_path, const quill_quantize_params *params,
                                 quill_error *err) {
    if (!params || !quill_ftype_name(params->ftype))
        return quill_fail(err, QUILL_E_ARG, "quantize: unsupported file type %d", params ? (int)params->ftype : -1);
    struct stat sa, sb;
    if (stat(in_path, &sa) == 0 && stat(out_path, &sb) == 0 && sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino)
        return quill_fail(err, QUILL_E_ARG, "quantize: the output %s is the input file", out_path);
    quill_gguf *in;
    quill_status st = quill_gguf_open(in_path, &in, err);
    if (st) return st;
    const uint64_t n = quill_gguf_n_tensors(in);
    quill_quant_choice *plan = calloc(n ? n : 1, sizeof *plan);
    quill_gguf_writer *w = quill_gguf_writer_new();
    float *f32 = NULL;
    uint8_t *out = NULL;
    bool streaming = false;
    if (!plan || !w) {
        st = quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
        goto done;
    }
    if ((st = quill_quantize_plan(in, params->ftype, params->pure, plan, err))) goto done;

    /* metadata: everything but the keys the reference resets, then those two, last */
    for (uint64_t i = 0; i < quill_gguf_n_kv(in) && !st; i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(in, i);
        if (skip_key(kv->key)) continue;
        if (quill_gguf_writer_add_value(w, kv->key, &kv->value))
            st = quill_fail(err, QUILL_E_FORMAT, "%s: cannot copy metadata key '%s'", in_path, kv->key);
    }
    if (st) goto done;
    if (quill_gguf_writer_add_u32(w, "general.quantization_version", 2) ||
        quill_gguf_writer_add_u32(w, "general.file_type", (uint32_t)params->ftype)) {
        st = quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
        goto done;
    }

    /* the directory, then the data tensor by tensor */
    int64_t max_row = 1;
    size_t max_out_chunk = 1;
    const int64_t chunk_elems = (int64_t)1 << 22;
    for (uint64_t k = 0; k < n; k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(in, plan[k].src_index);
        if (quill_gguf_writer_add_tensor_info(w, t->name, plan[k].type, t->n_dims, t->ne)) {
            st = quill_fail(err, QUILL_E_FORMAT, "%s: tensor '%s' cannot be written as %s", in_path, t->name,
                            quill_type_name(plan[k].type));
            goto done;
        }
        if (plan[k].quantized) {
            if (t->ne[0] > max_row) max_row = t->ne[0];
            int64_t rows = chunk_elems / t->ne[0];
            if (rows < 1) rows = 1;
            const size_t bytes = quill_row_size(plan[k].type, t->ne[0]) * (size_t)rows;
            if (bytes > max_out_chunk) max_out_chunk = bytes;
        }
    }
    const int n_threads = params->n_threads > 1 ? (params->n_threads < MAX_THREADS ? params->n_threads : MAX_THREADS) : 1;
    f32 = malloc((size_t)max_row * (size_t)n_threads * sizeof *f32);
    out = malloc(max_out_chunk);
    if (!f32 || !out) {
        st = quill_fail(err, QUILL_E_NOMEM, "quantize: out of memory");
        goto done;
    }
    if ((st = quill_gguf_writer_begin_stream(w, out_path, err))) goto done;
    streaming = true;

    for (uint64_t k = 0; k < n; k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(in, plan[k].src_index);
        uint64_t out_bytes = t->nbytes;
        if (!plan[k].quantized) {
            if ((st = quill_gguf_writer_stream_data(w, t->data, t->nbytes, err))) goto done;
        } else {
            const int64_t n_rows = t->n_elements / t->ne[0];
            int64_t chunk_rows = chunk_elems / t->ne[0];
            if (chunk_rows < 1) chunk_rows = 1;
            quant_job job = {
                .src_type = t->type,
                .src_row_bytes = quill_row_size(t->type, t->ne[0]),
                .f32 = f32,
                .dst = out,
                .dst_row_bytes = quill_row_size(plan[k].type, t->ne[0]),
                .dst_type = plan[k].type,
                .n_per_row = t->ne[0],
            };
            out_bytes = 0;
            for (int64_t r0 = 0; r0 < n_rows; r0 += chunk_rows) {
                const int64_t rows = n_rows - r0 < chunk_rows ? n_rows - r0 : chunk_rows;
                job.src = (const uint8_t *)t->data + (size_t)r0 * job.src_row_bytes;
                quant_rows_parallel(&job, rows, n_threads);
                const size_t bytes = (size_t)rows * job.dst_row_bytes;
                if ((st = quill_gguf_writer_stream_data(w, out, bytes, err))) goto done;
                out_bytes += bytes;
            }
        }
        if (params->progress) {
            quill_quantize_progress p = {
                .index = k,
                .count = n,
                .name = t->name,
                .n_dims = t->n_dims,
                .ne = t->ne,
                .src_type = t->type,
                .dst_type = plan[k].type,
                .quantized = plan[k].quantized,
                .fallback = plan[k].fallback,
                .src_bytes = t->nbytes,
                .dst_bytes = out_bytes,
            };
            params->progress(&p, params->user);
        }
    }
    streaming = false;
    st = quill_gguf_writer_finish_stream(w, err);
    if (st) remove(out_path);

done:
    if (streaming) {
        quill_gguf_writer_finish_stream(w, NULL);
        remove(out_path);
    }
    free(f32);
    free(out);
    quill_gguf_writer_free(w);
    free(plan);
    quill_gguf_close(in);
    return st;
}
