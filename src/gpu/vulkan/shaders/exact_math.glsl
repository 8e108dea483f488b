// The CPU's floating-point steps, bit for bit, for the shaders that #include this: C's fmaf and
// f32 division, exp_poly.h's exponential and tanh. (Needs shaderFloat64, which vulkan.c requires at
// open.)
#ifndef EXACT_MATH_GLSL
#define EXACT_MATH_GLSL

// f32 division a / b rounded once, as C's: through float64, rounded to f32. Vulkan lets a device's
// f32 division be off by 2.5 ulp; the quotient of two floats is never within float64's rounding of
// a float's rounding boundary, so the float64 quotient rounds to the correctly rounded float.
float divide_once(float a, float b) {
    precise const double q = double(a) / double(b);
    return float(q);
}

// Whether the device's fma rounds once (vulkan.c's probe_fma asks it at open, and specializes every
// pipeline with the answer).
layout(constant_id = 1) const bool NATIVE_FMA = false;

// fma(a, b, c) rounded once, as C's fmaf: GLSL's fma may be a multiply and an add (llvmpipe's
// is), so where the probe found it so it is built from float64 operations, each correctly rounded
// in Vulkan: a·b is exact in float64 (24 + 24 bits), the sum is rounded to odd (TwoSum gives its
// exact error; a nonzero error with an even last bit moves it one unit toward the exact sum), and
// round-to-odd in 53 bits then to nearest in 24 is the sum rounded once to nearest (Boldo and
// Melquiond, 2008). Those are about ten float64 operations in a chain: a GPU's exact products'
// sums wait on them, slot after slot.
float fma_once(float a, float b, float c) {
    if (NATIVE_FMA) return fma(a, b, c);
    precise const double p = double(a) * double(b);
    precise const double s = p + double(c);
    precise const double bv = s - p;
    precise const double e = (p - (s - bv)) + (double(c) - bv);
    if (e == 0.0) return float(s);
    uvec2 u = unpackDouble2x32(s);
    if ((u.x & 1u) != 0u) return float(s);
    uint carry;
    if ((e > 0.0) == (s > 0.0)) { // the exact sum is farther from zero
        u.x = uaddCarry(u.x, 1u, carry);
        u.y += carry;
    } else {
        u.x = usubBorrow(u.x, 1u, carry);
        u.y -= carry;
    }
    return float(packDouble2x32(u));
}

// src/base/exp_poly.h's exp_poly: n = nearbyint(x·log2 e), r = x - n·ln2 in two fused steps, Cephes'
// degree-6 polynomial in fused multiply-adds, times 2^n (exact); the same constants (their f32 bits).
float exp_poly(float x) {
    if (isnan(x)) return x;
    if (x < -87.0) return 0.0;
    if (x > 88.0) return uintBitsToFloat(0x7F800000u);
    precise const float t = x * uintBitsToFloat(0x3FB8AA3Bu);
    const float n = roundEven(t);
    float r = fma_once(n, -uintBitsToFloat(0x3F318000u), x);
    r = fma_once(n, -uintBitsToFloat(0xB95E8083u), r);
    float p = fma_once(uintBitsToFloat(0x39506967u), r, uintBitsToFloat(0x3AB743CEu));
    p = fma_once(p, r, uintBitsToFloat(0x3C088908u));
    p = fma_once(p, r, uintBitsToFloat(0x3D2AA9C1u));
    p = fma_once(p, r, uintBitsToFloat(0x3E2AAAAAu));
    p = fma_once(p, r, uintBitsToFloat(0x3F000000u));
    precise const float rr = r * r, r1 = r + 1.0;
    p = fma_once(p, rr, r1);
    return ldexp(p, int(n));
}

// src/base/exp_poly.h's tanh_poly: Cephes' odd polynomial below 0.625, else 1 - 2/(e^{2|x|} + 1),
// 1 from 9, the sign of x; the same constants (their f32 bits).
float tanh_poly(float x) {
    if (isnan(x)) return x;
    const float z = abs(x);
    float r;
    if (z >= 9.0) {
        r = 1.0;
    } else if (z >= 0.625) {
        precise const float zz = z + z;
        precise const float den = exp_poly(zz) + 1.0;
        const float q = divide_once(2.0, den);
        precise const float one_less = 1.0 - q;
        r = one_less;
    } else {
        precise const float s = z * z;
        float p = fma_once(uintBitsToFloat(0xBBBAF0EAu), s, uintBitsToFloat(0x3CA9134Eu));
        p = fma_once(p, s, uintBitsToFloat(0xBD5C1E2Du));
        p = fma_once(p, s, uintBitsToFloat(0x3E088393u));
        p = fma_once(p, s, uintBitsToFloat(0xBEAAAA99u));
        precise const float ps = p * s;
        r = fma_once(ps, z, z);
    }
    return (floatBitsToUint(x) & 0x80000000u) != 0u ? -r : r;
}

// src/base/exp_poly.h's exp_f64, the same steps and constants (their float64 bits): the
// mixture-of-experts router's exponential. n = roundEven(x·log2 e), r = (x - n·ln2_hi) - n·ln2_lo,
// e^r by its Taylor series to r^13 in Horner's form, times 2^n (exact).
double exp_f64(double x) {
    if (isnan(x)) return x;
    if (x < -700.0LF) return 0.0LF;
    if (x > 709.0LF) return packDouble2x32(uvec2(0u, 0x7FF00000u));
    const double inverse_factorial[14] = double[14](
        0.0LF, 0.0LF, packDouble2x32(uvec2(0x0u, 0x3fe00000u)), packDouble2x32(uvec2(0x55555555u, 0x3fc55555u)),
        packDouble2x32(uvec2(0x55555555u, 0x3fa55555u)), packDouble2x32(uvec2(0x11111111u, 0x3f811111u)),
        packDouble2x32(uvec2(0x16c16c17u, 0x3f56c16cu)), packDouble2x32(uvec2(0x1a01a01au, 0x3f2a01a0u)),
        packDouble2x32(uvec2(0x1a01a01au, 0x3efa01a0u)), packDouble2x32(uvec2(0xa556c734u, 0x3ec71de3u)),
        packDouble2x32(uvec2(0xb7789f5cu, 0x3e927e4fu)), packDouble2x32(uvec2(0x67f544e4u, 0x3e5ae645u)),
        packDouble2x32(uvec2(0xeff8d898u, 0x3e21eed8u)), packDouble2x32(uvec2(0x13a86d09u, 0x3de61246u)));
    precise double t = x * packDouble2x32(uvec2(0x652b82feu, 0x3ff71547u));
    const double n = roundEven(t);
    precise const double hi = n * packDouble2x32(uvec2(0xfee00000u, 0x3fe62e42u));
    precise const double lo = n * packDouble2x32(uvec2(0x35793c76u, 0x3dea39efu));
    precise double r = x - hi;
    r = r - lo;
    precise double p = inverse_factorial[13];
    for (int k = 12; k >= 2; k--) {
        p = p * r;
        p = p + inverse_factorial[k];
    }
    p = p * r;
    p = p + 1.0LF;
    p = p * r;
    p = p + 1.0LF;
    return ldexp(p, int(n));
}

#endif
