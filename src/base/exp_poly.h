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

/* tanh in f32 from IEEE operations, for GELU's tanh form (Gemma's GeGLU) and soft-capping (Gemma
 * 2), so that the GPU's (gpu/vulkan/shaders/exact_math.glsl's tanh_poly, the same steps and
 * constants) gives these bits where libm's tanhf has none a shader can reproduce: Cephes' tanhf,
 * below |x| = 0.625 an odd polynomial (|x| + |x|·s·P(s), s = x², in fused multiply-adds), above it
 * 1 - 2/(e^{2|x|} + 1) with exp_poly, 1 from |x| = 9 (tanh(9) rounds to 1), the sign of x. Within
 * 2 ulp of tanh (tests/test_kernels.c). */
#define TANH_P0 -5.70498872745e-3f
#define TANH_P1 2.06390887954e-2f
#define TANH_P2 -5.37397155531e-2f
#define TANH_P3 1.33314422036e-1f
#define TANH_P4 -3.33332819422e-1f

static inline float tanh_poly(float x) {
    if (isnan(x)) return x;
    const float z = fabsf(x);
    float r;
    if (z >= 9.0f) {
        r = 1.0f;
    } else if (z >= 0.625f) {
        const float s = exp_poly(z + z);
        r = 1.0f - 2.0f / (s + 1.0f);
    } else {
        const float s = z * z;
        float p = fmaf(TANH_P0, s, TANH_P1);
        p = fmaf(p, s, TANH_P2);
        p = fmaf(p, s, TANH_P3);
        p = fmaf(p, s, TANH_P4);
        r = fmaf(p * s, z, z);
    }
    return copysignf(r, x);
}

/* e^x in float64 from IEEE adds, subtracts and multiplies and an exact scaling, for the
 * mixture-of-experts router's softmax and sigmoid (model/ffn_moe.c), so that the GPU's router
 * (gpu/vulkan/shaders/exact_math.glsl's exp_f64, the same steps and constants) gives these bits
 * where its float64 arithmetic rounds as IEEE's: n = round(x·log2 e), r = (x - n·ln2_hi) -
 * n·ln2_lo (ln2_hi has 32 significant bits, so n·ln2_hi is exact), e^r by its Taylor series to
 * r^13 in Horner's form (|r| <= 0.35: the series' error is 6e-18, below the roundings), times 2^n.
 * Each step is its own statement so that no compiler fuses a multiply and an add. Within a few
 * units of the last place of libm's exp; below -700 it gives 0 and above 709 infinity (so that
 * every result is a normal number or 0: a GPU may flush subnormals). */
static inline double exp_f64(double x) {
    static const double inverse_factorial[14] = {
        0, 0, 0x1p-1, 0x1.5555555555555p-3, 0x1.5555555555555p-5, 0x1.1111111111111p-7, 0x1.6c16c16c16c17p-10,
        0x1.a01a01a01a01ap-13, 0x1.a01a01a01a01ap-16, 0x1.71de3a556c734p-19, 0x1.27e4fb7789f5cp-22,
        0x1.ae64567f544e4p-26, 0x1.1eed8eff8d898p-29, 0x1.6124613a86d09p-33};
    if (isnan(x)) return x;
    if (x < -700.0) return 0;
    if (x > 709.0) return INFINITY;
    double t = x * 0x1.71547652b82fep+0;
    const double n = nearbyint(t);
    t = n * 0x1.62e42fee00000p-1;
    double r = x - t;
    t = n * 0x1.a39ef35793c76p-33;
    r = r - t;
    double p = inverse_factorial[13];
    for (int k = 12; k >= 2; k--) {
        p = p * r;
        p = p + inverse_factorial[k];
    }
    p = p * r;
    p = p + 1.0;
    p = p * r;
    p = p + 1.0;
    return ldexp(p, (int)n);
}

#endif
