#version 450
#extension GL_GOOGLE_include_directive : require
// Activations to the exact products' 16-bit codes, one block of 32 per invocation, as
// src/kernels/kernels_exact.h's quantize_block defines them: a = round(x · A / max|x|) clamped to
// ±A, then rounded to 8 significant bits (ties to even); da = max|x| / A, both divisions rounded
// once as C's (exact_math.glsl's divide_once). Every step is marked precise so that no multiply-add
// is fused where the CPU rounds twice.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 1) writeonly buffer Codes { int codes[]; };
layout(std430, binding = 2) writeonly buffer Scales { float da[]; };
layout(push_constant) uniform Params { uint n_blocks; int act_max; } p;

#include "exact_math.glsl"

int round_8_bits(int v) {
    uint u = floatBitsToUint(float(v));
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    return int(uintBitsToFloat(u));
}

void main() {
    // (vulkan.c's dispatch spreads the workgroups over x and y: x holds at most 65535)
    const uint blk = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (blk >= p.n_blocks) return;
    const uint base = blk * 32u;
    float amax = 0.0;
    bool nan = false;
    for (uint i = 0u; i < 32u; i++) {
        const float v = x[base + i];
        nan = nan || isnan(v);
        if (!isnan(v)) amax = max(amax, abs(v));
    }
    if (!(amax > 0.0) || isinf(amax) || nan) {
        for (uint i = 0u; i < 32u; i++) codes[base + i] = 0;
        // inf or nan in: nan out, as the CPU's codes give
        da[blk] = amax > 0.0 || nan ? uintBitsToFloat(0x7FC00000u) : 0.0;
        return;
    }
    const float qa = float(p.act_max);
    const float id = divide_once(qa, amax);
    for (uint i = 0u; i < 32u; i++) {
        precise float v = roundEven(x[base + i] * id);
        v = v > qa ? qa : v < -qa ? -qa : v;
        codes[base + i] = round_8_bits(int(v));
    }
    const float scale = divide_once(amax, qa);
    da[blk] = scale;
}
