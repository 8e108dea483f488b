// The CPU's floating-point steps, bit for bit, for the shaders that #include this: C's fmaf and
// exp_poly.h's exponential. (Needs shaderFloat64, which vulkan.c requires at open.)

// fma(a, b, c) rounded once, as C's fmaf: GLSL's fma may be a multiply and an add (llvmpipe's
// is), so it is built from float64 operations, each correctly rounded in Vulkan: a·b is exact in
// float64 (24 + 24 bits), the sum is rounded to odd (TwoSum gives its exact error; a nonzero error
// with an even last bit moves it one unit toward the exact sum), and round-to-odd in 53 bits then
// to nearest in 24 is the sum rounded once to nearest (Boldo and Melquiond, 2008).
float fma_once(float a, float b, float c) {
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
