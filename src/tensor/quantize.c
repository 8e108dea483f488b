/* Quantization: F32 rows into the GGUF block types (whole files into the reference quantizer's
 * mixes are src/quantize/, above this and the GGUF reader and writer).
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
#include <stdlib.h>
#include <string.h>

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

/* The symmetric k-quants' first step: each of a super-block's 16 groups fitted alone (codes into
 * L, its scale into scales[]); returns the scale of largest magnitude (the first of equals, as
 * the reference keeps it) and that magnitude in *amax. */
static float fit_sub_blocks(const float *x, float (*fit)(int, int, const float *, int8_t *), int nmax, int8_t *L,
                            float *scales, float *amax) {
    float max_scale = 0.0f;
    *amax = 0.0f;
    for (int j = 0; j < QK_K / 16; j++) {
        scales[j] = fit(16, nmax, x + 16 * j, L + 16 * j);
        const float a = fabsf(scales[j]);
        if (a > *amax) {
            *amax = a;
            max_scale = scales[j];
        }
    }
    return max_scale;
}

void quill_from_float_q3_K(const float *x, uint8_t *dst, int64_t nb) {
    int8_t L[QK_K];
    float scales[QK_K / 16];
    for (int64_t i = 0; i < nb; i++, x += QK_K, dst += sizeof(block_q3_K)) {
        float amax;
        const float max_scale = fit_sub_blocks(x, fit_symmetric_refine, 4, L, scales, &amax);
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
        float max_abs;
        const float max_scale = fit_sub_blocks(x, fit_symmetric, 32, L, scales, &max_abs);
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
