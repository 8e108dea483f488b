#version 450
// A bias added to each of n_rows rows of n floats in place, x[r][i] += b[i], as forward.c's
// add_bias (one IEEE add: the CPU's bits); by_id: each row's own expert's, x[r][i] += b[ids[ids_at
// + r] · n + i] (ffn_moe.c's expert biases).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer B { float b[]; };
layout(std430, binding = 4) readonly buffer Ids { int ids[]; };
layout(push_constant) uniform Params { uint n; uint n_rows; uint by_id; uint ids_at; } p;

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (id >= p.n * p.n_rows) return;
    const uint at = p.by_id != 0u ? uint(ids[p.ids_at + id / p.n]) * p.n + id % p.n : id % p.n;
    precise const float v = x[id] + b[at];
    x[id] = v;
}
