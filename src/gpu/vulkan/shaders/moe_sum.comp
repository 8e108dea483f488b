#version 450
#extension GL_GOOGLE_include_directive : require
// A mixture-of-experts layer's output, one invocation per (token, element), as model/ffn_moe.c's
// weighted_sum_rows and moe_fast add it up: out = y[slot 0] · w0, then += y[slot s] · ws in slot
// order (each product rounded, then the add), then, with a shared expert, += shared · gate, with
// gate = 1 / (1 + exp_f64(-dot)) from its float64 dot (route_logits.comp) rounded to f32, or 1
// when the shared expert has no gate.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Y { float y[]; };       // [token][slot][d]
layout(std430, binding = 1) readonly buffer Weights { float wts[]; }; // [token][slot]
layout(std430, binding = 2) readonly buffer Shared { float shared_out[]; }; // [token][d]
layout(std430, binding = 3) writeonly buffer Out { float outv[]; };  // [token][d]
layout(std430, binding = 4) readonly buffer Gate { double gate_dot[]; }; // [token]
layout(push_constant) uniform Params { uint d; uint k; uint n_tok; uint has_shared; uint has_gate; } p;

#include "exact_math.glsl"

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (id >= p.d * p.n_tok) return;
    const uint t = id / p.d, i = id % p.d;
    precise float acc = y[(t * p.k) * p.d + i] * wts[t * p.k];
    for (uint s = 1u; s < p.k; s++) {
        precise const float v = y[(t * p.k + s) * p.d + i] * wts[t * p.k + s];
        acc = acc + v;
    }
    if (p.has_shared != 0u) {
        float g = 1.0;
        if (p.has_gate != 0u) {
            precise const double v = 1.0LF / (1.0LF + exp_f64(-gate_dot[t]));
            g = float(v);
        }
        precise const float v = shared_out[t * p.d + i] * g;
        acc = acc + v;
    }
    outv[t * p.d + i] = acc;
}
