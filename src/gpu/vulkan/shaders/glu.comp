#version 450
#extension GL_GOOGLE_include_directive : require
// The FFN's gated activation in place: gate = act(gate) · up. SiLU as kernels.h's swiglu, bit for
// bit: g / (1 + exp_poly(-g)) · up, one IEEE add, divide and multiply. gpt-oss's clamped SwiGLU as
// layer_ops.c's swiglu_oai_rows, bit for bit: x / (1 + exp_poly(-1.702·x)) · (y + 1) with x =
// min(g, 7), y = clamp(up, ±7). GELU in its tanh form (Gemma's GeGLU, layer_ops.c's geglu_rows),
// bit for bit: exp_poly.h's tanh_poly.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Gate { float gate[]; };
layout(std430, binding = 1) readonly buffer Up { float up[]; };
// kind: 0 SiLU, 1 GELU, 2 gpt-oss's clamped SwiGLU
layout(push_constant) uniform Params { uint n; uint kind; } p;

#include "exact_math.glsl"

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    const float g = gate[i];
    if (p.kind == 2u) {
        const float x = g < 7.0 ? g : 7.0, u = up[i];
        const float y = u < -7.0 ? -7.0 : u > 7.0 ? 7.0 : u;
        precise const float den = 1.0 + exp_poly(-1.702 * x);
        precise const float r = divide_once(x, den) * (y + 1.0);
        gate[i] = r;
    } else if (p.kind == 1u) {
        precise const float t = 0.7978845608028654 * g * (1.0 + 0.044715 * g * g);
        precise const float r = 0.5 * g * (1.0 + tanh_poly(t)) * up[i];
        gate[i] = r;
    } else {
        precise const float den = 1.0 + exp_poly(-g);
        precise const float r = divide_once(g, den) * up[i];
        gate[i] = r;
    }
}
