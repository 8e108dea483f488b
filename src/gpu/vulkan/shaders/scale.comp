#version 450
// x[i] *= s over n floats in place, as forward.c's scale_rows (one IEEE multiply: the CPU's bits).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(push_constant) uniform Params { uint n; float s; } p;

void main() {
    const uint i = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (i >= p.n) return;
    precise const float v = x[i] * p.s;
    x[i] = v;
}
