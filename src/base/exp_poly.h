/* The exponential of attention's softmax, one formula for every instruction set.
 *
 * libm's expf has no vector version we can rely on to give its bits, so the kernels share this
 * one: x = n·ln2 + r with n = round(x·log2 e) and |r| <= ln2/2 (r in two fused steps, ln2 split
 * in a high part exact in float and a low part), e^r by a degree-6 polynomial (Cephes' expf
 * coefficients, ~1 ulp) in fused multiply-adds, then times 2^n, which is exact. Every step is one
 * IEEE operation, so scalar and vector versions give the same bits. Arguments below -87 (where
 * e^x leaves the normal floats) give 0, which in a softmax means a weight under 1e-38. */
#ifndef QUILL_EXP_POLY_H
#define QUILL_EXP_POLY_H

#include <math.h>

#define EXP_LOG2E 1.44269504088896341f
#define EXP_LN2_HI 0.693359375f
#define EXP_LN2_LO -2.12194440e-4f
#define EXP_P0 1.9875691500e-4f
#define EXP_P1 1.3981999507e-3f
#define EXP_P2 8.3334519073e-3f
#define EXP_P3 4.1665795894e-2f
#define EXP_P4 1.6666665459e-1f
#define EXP_P5 5.0000001201e-1f
#define EXP_MIN_ARG -87.0f

static inline float exp_poly(float x) {
    if (isnan(x)) return x;
    if (x < EXP_MIN_ARG) return 0;
    if (x > 88.0f) return INFINITY;
    const float n = nearbyintf(x * EXP_LOG2E);
    float r = fmaf(n, -EXP_LN2_HI, x);
    r = fmaf(n, -EXP_LN2_LO, r);
    float p = fmaf(EXP_P0, r, EXP_P1);
    p = fmaf(p, r, EXP_P2);
    p = fmaf(p, r, EXP_P3);
    p = fmaf(p, r, EXP_P4);
    p = fmaf(p, r, EXP_P5);
    p = fmaf(p, r * r, r + 1.0f);
    return ldexpf(p, (int)n);
}

#endif
