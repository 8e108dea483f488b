#version 450
// A bias added to each of n_rows rows of n floats in place, x[r][i] += b[i], as forward.c's
// add_bias (one IEEE add: the CPU's bits).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(push_constant) uniform Params { uint n; uint n_rows; } p;

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (id >= p.n * p.n_rows) return;
    precise const float v = x[id] + b[id % p.n];
    x[id] = v;
}
