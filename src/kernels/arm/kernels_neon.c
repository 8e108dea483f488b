/* The f32 kernels of the aarch64 sets (dotprod and i8mm), in NEON, which every aarch64 CPU has.
 *
 * Every entry gives the bits its contract in kernels.h fixes, and `dot`, whose contract leaves the
 * order of its sum open, adds in the avx2 set's order (kernels_avx2.c's dot_nt: 16 columns a step
 * as two 8-lane chains, then the lanes folded 4, 2, 1 apart, then the columns past the last 16),
 * so that a model's f32 products on these sets give the avx2 set's bits, which `make cross-test`
 * compares. Built on aarch64 only; elsewhere this file compiles to nothing. */
#include "kernels/kernels.h"
#include "kernels/dot_tokens.h"
#include "base/exp_poly.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>

/* ---------------------------------------------------------------- dot */

/* NT tokens (1..4) against one row. An 8-lane AVX2 register is two NEON ones here: a[t][0] holds
 * lanes 0-3 of the avx2 chain a, a[t][1] lanes 4-7; the same for b. */
static inline __attribute__((always_inline)) void dot_nt(const float *w, const float *x, int64_t n, int64_t xs,
                                                         float *out, int64_t os, const int NT) {
    float32x4_t a[4][2], b[4][2];
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) a[t][0] = a[t][1] = b[t][0] = b[t][1] = vdupq_n_f32(0);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) {
        const float32x4_t w0 = vld1q_f32(w + i), w1 = vld1q_f32(w + i + 4), w2 = vld1q_f32(w + i + 8),
                          w3 = vld1q_f32(w + i + 12);
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            const float *xt = x + t * xs + i;
            a[t][0] = vfmaq_f32(a[t][0], w0, vld1q_f32(xt));
            a[t][1] = vfmaq_f32(a[t][1], w1, vld1q_f32(xt + 4));
            b[t][0] = vfmaq_f32(b[t][0], w2, vld1q_f32(xt + 8));
            b[t][1] = vfmaq_f32(b[t][1], w3, vld1q_f32(xt + 12));
        }
    }
    float tail[4] = {0};
    for (; i < n; i++)
#pragma GCC unroll 4
        for (int t = 0; t < NT; t++) {
            /* two statements: a compiler that contracts within an expression (clang) must not fuse them */
            const float p = w[i] * x[t * xs + i];
            tail[t] += p;
        }
#pragma GCC unroll 4
    for (int t = 0; t < NT; t++) {
        /* hsum256(a + b): the 8 lanes' sums v, then v[0..3] + v[4..7], then lanes 0 + 2 and 1 + 3,
         * then their sum */
        const float32x4_t s = vaddq_f32(vaddq_f32(a[t][0], b[t][0]), vaddq_f32(a[t][1], b[t][1]));
        const float32x2_t s2 = vadd_f32(vget_low_f32(s), vget_high_f32(s));
        out[t * os] = (vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1)) + tail[t];
    }
}

QUILL_TOKENS_BY_4(dot_neon, const float *, dot_nt)

/* ---------------------------------------------------------------- attention */

/* hb heads (1..4) of nv vectors of 4 dims (1..4): each lane one chain of fused multiply-adds over
 * the rows in order; a row's values are loaded once for the hb heads. */
static inline __attribute__((always_inline)) void weighted_block(const int hb, const int nv, const float *wgt,
                                                                 int64_t wgt_stride, const float *v, int n_rows,
                                                                 int64_t stride, float *out, int64_t out_stride,
                                                                 bool accumulate) {
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++)
#pragma GCC unroll 4
        for (int i = 0; i < nv; i++) acc[h][i] = accumulate ? vld1q_f32(out + h * out_stride + 4 * i) : vdupq_n_f32(0);
    for (int p = 0; p < n_rows; p++) {
        float32x4_t vp[4];
#pragma GCC unroll 4
        for (int i = 0; i < nv; i++) vp[i] = vld1q_f32(v + p * stride + 4 * i);
#pragma GCC unroll 4
        for (int h = 0; h < hb; h++) {
            const float wp = wgt[h * wgt_stride + p];
#pragma GCC unroll 4
            for (int i = 0; i < nv; i++) acc[h][i] = vfmaq_n_f32(acc[h][i], vp[i], wp);
        }
    }
#pragma GCC unroll 4
    for (int h = 0; h < hb; h++)
#pragma GCC unroll 4
        for (int i = 0; i < nv; i++) vst1q_f32(out + h * out_stride + 4 * i, acc[h][i]);
}

static inline __attribute__((always_inline)) void weighted_heads(const int nv, const float *wgt, int64_t wgt_stride,
                                                                 int n_heads, const float *v, int n_rows, int64_t stride,
                                                                 float *out, int64_t out_stride, bool accumulate) {
    int h = 0;
    for (; h + 4 <= n_heads; h += 4)
        weighted_block(4, nv, wgt + h * wgt_stride, wgt_stride, v, n_rows, stride, out + h * out_stride, out_stride,
                       accumulate);
    const float *wh = wgt + h * wgt_stride;
    float *oh = out + h * out_stride;
    switch (n_heads - h) {
    case 3: weighted_block(3, nv, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
    case 2: weighted_block(2, nv, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
    case 1: weighted_block(1, nv, wh, wgt_stride, v, n_rows, stride, oh, out_stride, accumulate); break;
    default: break;
    }
}

static void weighted_sum_neon(const float *wgt, int64_t wgt_stride, int n_heads, const float *v, int n_rows,
                              int64_t stride, int64_t n, float *out, int64_t out_stride, bool accumulate) {
    if (n % 4) {
        quill_weighted_sum_scalar(wgt, wgt_stride, n_heads, v, n_rows, stride, n, out, out_stride, accumulate);
        return;
    }
    /* 16 dims at a time, then the 4, 8 or 12 left: each dim its own chain, so any grouping gives
     * the same bits */
    int64_t d = 0;
    for (; d + 16 <= n; d += 16)
        weighted_heads(4, wgt, wgt_stride, n_heads, v + d, n_rows, stride, out + d, out_stride, accumulate);
    switch ((n - d) / 4) {
    case 3: weighted_heads(3, wgt, wgt_stride, n_heads, v + d, n_rows, stride, out + d, out_stride, accumulate); break;
    case 2: weighted_heads(2, wgt, wgt_stride, n_heads, v + d, n_rows, stride, out + d, out_stride, accumulate); break;
    case 1: weighted_heads(1, wgt, wgt_stride, n_heads, v + d, n_rows, stride, out + d, out_stride, accumulate); break;
    default: break;
    }
}

/* Scores against dimension-major keys: 4 columns per vector, each lane a chain of fused
 * multiply-adds in d order; the last n_cols mod 4 columns one by one, in the same order. */
static void dot_columns_neon(const float *q, int64_t q_stride, int n_heads, const float *kt, int64_t n,
                             int64_t stride, int n_cols, float *out, int64_t out_stride) {
    for (int h = 0; h < n_heads; h++) {
        const float *qh = q + h * q_stride;
        int p = 0;
        for (; p + 16 <= n_cols; p += 16) {
            float32x4_t acc[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
            for (int64_t d = 0; d < n; d++) {
                const float *row = kt + d * stride + p;
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) acc[i] = vfmaq_n_f32(acc[i], vld1q_f32(row + 4 * i), qh[d]);
            }
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) vst1q_f32(out + h * out_stride + p + 4 * i, acc[i]);
        }
        for (; p + 4 <= n_cols; p += 4) {
            float32x4_t acc = vdupq_n_f32(0);
            for (int64_t d = 0; d < n; d++) acc = vfmaq_n_f32(acc, vld1q_f32(kt + d * stride + p), qh[d]);
            vst1q_f32(out + h * out_stride + p, acc);
        }
        for (; p < n_cols; p++) {
            float acc = 0;
            for (int64_t d = 0; d < n; d++) acc = fmaf(qh[d], kt[d * stride + p], acc);
            out[h * out_stride + p] = acc;
        }
    }
}

/* exp_poly on 4 lanes, operation for operation: n rounded to nearest even as nearbyintf, r and the
 * polynomial in fused steps (fmaf(n, -c, x) is x - n·c fused), 2^n built in the exponent bits (for
 * the n that reach the product, -126 <= n <= 127, the exact power, so the product rounds as
 * ldexpf), then the scalar version's three cases, NaN first. */
static inline float32x4_t exp4(float32x4_t x) {
    const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, EXP_LOG2E));
    float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(EXP_LN2_HI));
    r = vfmsq_f32(r, n, vdupq_n_f32(EXP_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(EXP_P1), vdupq_n_f32(EXP_P0), r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(EXP_P5), p, r);
    p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
    const int32x4_t bits = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    float32x4_t e = vmulq_f32(p, vreinterpretq_f32_s32(bits));
    e = vbslq_f32(vcgtq_f32(x, vdupq_n_f32(88.0f)), vdupq_n_f32(INFINITY), e);
    e = vbslq_f32(vcltq_f32(x, vdupq_n_f32(EXP_MIN_ARG)), vdupq_n_f32(0), e);
    return vbslq_f32(vceqq_f32(x, x), e, x);
}

/* The 16 partial sums (p mod 16) as 4 vectors, folded 8, 4, 2, 1 apart as the scalar version
 * does. Columns past n add 0, which leaves a sum of non-negative terms unchanged. */
static void softmax_neon(float *x, int n, float s) {
    float max = -INFINITY;
    int p = 0;
    float32x4_t vmax = vdupq_n_f32(-INFINITY);
    for (; p + 4 <= n; p += 4) {
        const float32x4_t v = vmulq_n_f32(vld1q_f32(x + p), s);
        vst1q_f32(x + p, v);
        vmax = vmaxnmq_f32(vmax, v); /* a NaN is passed over, as the scalar comparison does */
    }
    for (; p < n; p++) {
        x[p] *= s;
        if (x[p] > max) max = x[p];
    }
    max = fmaxf(max, vmaxnmvq_f32(vmax));
    float32x4_t part[4] = {vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0), vdupq_n_f32(0)};
    const float32x4_t vm = vdupq_n_f32(max);
    for (p = 0; p + 4 <= n; p += 4) {
        const float32x4_t e = exp4(vsubq_f32(vld1q_f32(x + p), vm));
        vst1q_f32(x + p, e);
        part[(p / 4) % 4] = vaddq_f32(part[(p / 4) % 4], e);
    }
    if (p < n) {
        float last[4] = {0, 0, 0, 0};
        for (int i = 0; p + i < n; i++) last[i] = x[p + i] - max;
        float32x4_t e = exp4(vld1q_f32(last));
        float out[4];
        vst1q_f32(out, e);
        for (int i = 0; p + i < n; i++) x[p + i] = out[i];
        for (int i = n - p; i < 4; i++) out[i] = 0;
        part[(p / 4) % 4] = vaddq_f32(part[(p / 4) % 4], vld1q_f32(out));
    }
    const float32x4_t s4 = vaddq_f32(vaddq_f32(part[0], part[2]), vaddq_f32(part[1], part[3]));
    const float32x2_t s2 = vadd_f32(vget_low_f32(s4), vget_high_f32(s4));
    const float inv = 1.0f / (vget_lane_f32(s2, 0) + vget_lane_f32(s2, 1));
    for (p = 0; p + 4 <= n; p += 4) vst1q_f32(x + p, vmulq_n_f32(vld1q_f32(x + p), inv));
    for (; p < n; p++) x[p] *= inv;
}

static void swiglu_neon(float *gate, const float *up, int64_t n) {
    const float32x4_t one = vdupq_n_f32(1.0f);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const float32x4_t g = vld1q_f32(gate + i);
        const float32x4_t s = vdivq_f32(g, vaddq_f32(one, exp4(vnegq_f32(g))));
        vst1q_f32(gate + i, vmulq_f32(s, vld1q_f32(up + i)));
    }
    for (; i < n; i++) gate[i] = gate[i] / (1.0f + exp_poly(-gate[i])) * up[i];
}

/* kernels.h's dot_f64: a row's partial sums i mod 8 as four vectors of two doubles, rows in pairs
 * (eight chains of fused multiply-adds in flight). */
static inline __attribute__((always_inline)) void rows_f64_neon(const float *w, int64_t w_stride, const int nr,
                                                                const float *x, int64_t n, double *out) {
    const int64_t whole = n / 8 * 8;
    float64x2_t acc[2][4];
    for (int j = 0; j < nr; j++)
        for (int q = 0; q < 4; q++) acc[j][q] = vdupq_n_f64(0.0);
    for (int64_t i = 0; i < whole; i += 8) {
        const float32x4_t x0 = vld1q_f32(x + i), x1 = vld1q_f32(x + i + 4);
        const float64x2_t xs[4] = {vcvt_f64_f32(vget_low_f32(x0)), vcvt_high_f64_f32(x0), vcvt_f64_f32(vget_low_f32(x1)),
                                   vcvt_high_f64_f32(x1)};
        for (int j = 0; j < nr; j++) {
            const float32x4_t w0 = vld1q_f32(w + j * w_stride + i), w1 = vld1q_f32(w + j * w_stride + i + 4);
            acc[j][0] = vfmaq_f64(acc[j][0], vcvt_f64_f32(vget_low_f32(w0)), xs[0]);
            acc[j][1] = vfmaq_f64(acc[j][1], vcvt_high_f64_f32(w0), xs[1]);
            acc[j][2] = vfmaq_f64(acc[j][2], vcvt_f64_f32(vget_low_f32(w1)), xs[2]);
            acc[j][3] = vfmaq_f64(acc[j][3], vcvt_high_f64_f32(w1), xs[3]);
        }
    }
    for (int j = 0; j < nr; j++) {
        double part[8];
        for (int q = 0; q < 4; q++) vst1q_f64(part + 2 * q, acc[j][q]);
        out[j] = quill_dot_f64_finish(part, w + j * w_stride, x, whole, n);
    }
}

static void dot_f64_neon(const float *w, int64_t w_stride, int rows, const float *x, int64_t n, double *out) {
    for (int r = 0; r < rows; r += 2) rows_f64_neon(w + r * w_stride, w_stride, rows - r >= 2 ? 2 : 1, x, n, out + r);
}

void quill_kernels_install_neon(quill_kernels *k) {
    k->dot = dot_neon;
    k->weighted_sum = weighted_sum_neon;
    k->dot_columns = dot_columns_neon;
    k->softmax = softmax_neon;
    k->swiglu = swiglu_neon;
    k->dot_f64 = dot_f64_neon;
}
#endif
