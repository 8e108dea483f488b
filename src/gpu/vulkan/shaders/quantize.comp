#version 450
#extension GL_GOOGLE_include_directive : require
// Activations to the exact products' 16-bit codes, blocks of 32, as
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

shared float s_max[64];
shared uint s_nan[64];

void main() {
    // (vulkan.c's dispatch spreads the workgroups over x and y: x holds at most 65535) an invocation
    // per element, two blocks a workgroup: the largest |x| of a block in five halving steps (the
    // largest is the largest in any order), then each element's code
    const uint lane = gl_LocalInvocationID.x, i = lane % 32u;
    const uint blk = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 2u + lane / 32u;
    const bool valid = blk < p.n_blocks;
    const float v = valid ? x[blk * 32u + i] : 0.0;
    s_max[lane] = isnan(v) ? 0.0 : abs(v);
    s_nan[lane] = isnan(v) ? 1u : 0u;
    barrier();
    for (uint w = 16u; w >= 1u; w /= 2u) {
        if (i < w) {
            s_max[lane] = max(s_max[lane], s_max[lane + w]);
            s_nan[lane] |= s_nan[lane + w];
        }
        barrier();
    }
    if (!valid) return;
    const float amax = s_max[lane - i];
    const bool nan = s_nan[lane - i] != 0u;
    if (!(amax > 0.0) || isinf(amax) || nan) {
        codes[blk * 32u + i] = 0;
        // inf or nan in: nan out, as the CPU's codes give
        if (i == 0u) da[blk] = amax > 0.0 || nan ? uintBitsToFloat(0x7FC00000u) : 0.0;
        return;
    }
    const float qa = float(p.act_max);
    const float id = divide_once(qa, amax);
    precise float q = roundEven(v * id);
    q = q > qa ? qa : q < -qa ? -qa : q;
    codes[blk * 32u + i] = round_8_bits(int(q));
    if (i == 0u) {
        const float scale = divide_once(amax, qa);
        da[blk] = scale;
    }
}
