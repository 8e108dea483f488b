#version 450
// A batch's keys and values into the device's KV cache (f32): layer l's keys of sequence s at
// k_base + s·seq_stride, head h's position pos at + (h·n_ctx + pos)·hd; its values likewise from
// v_base. One invocation per (token, element of the KV width).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) writeonly buffer Cache { float cache[]; };
layout(std430, binding = 3) readonly buffer Tokens { int tok[]; }; // [token]: position, sequence
layout(push_constant) uniform Params {
    uint kv_dim; uint hd; uint n_ctx; uint n_tok; uint k_base; uint v_base; uint seq_stride;
} p;

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (id >= p.n_tok * p.kv_dim) return;
    const uint t = id / p.kv_dim, e = id % p.kv_dim, h = e / p.hd, i = e % p.hd;
    const uint pos = uint(tok[2u * t]), seq = uint(tok[2u * t + 1u]);
    const uint at = seq * p.seq_stride + (h * p.n_ctx + pos) * p.hd + i;
    cache[p.k_base + at] = k[id];
    cache[p.v_base + at] = v[id];
}
