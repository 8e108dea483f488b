#version 450
// RoPE in place on n_heads vectors of head_dim per token, with the CPU's own cos and sin tables
// (context.c fills them from rope.c's angles), so the rotation is forward.c's bit for bit: pairs
// (2i, 2i+1) (adjacent) or (i, i + half) (neox), x0·c - x1·s and x0·s + x1·c, each product
// rounded on its own. One invocation per (token, head, pair).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer V { float v[]; };
layout(std430, binding = 1) readonly buffer Cos { float cs[]; };
layout(std430, binding = 2) readonly buffer Sin { float sn[]; };
layout(std430, binding = 3) readonly buffer Tokens { int tok[]; }; // [token]: position, sequence, attention factor, 0
layout(push_constant) uniform Params {
    uint n_heads; uint hd; uint half_rot; uint stride; uint neox; uint n_tok; uint table_at;
} p;

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (id >= p.n_tok * p.n_heads * p.half_rot) return;
    const uint i = id % p.half_rot, h = (id / p.half_rot) % p.n_heads, t = id / (p.half_rot * p.n_heads);
    const uint at = p.table_at + uint(tok[4u * t]) * p.stride + i;
    const float c = cs[at], s = sn[at];
    const uint base = (t * p.n_heads + h) * p.hd;
    const uint i0 = p.neox != 0u ? base + i : base + 2u * i, i1 = p.neox != 0u ? base + i + p.half_rot : i0 + 1u;
    const float x0 = v[i0], x1 = v[i1];
    precise const float a = x0 * c, b = x1 * s, e = x0 * s, f = x1 * c;
    precise const float r0 = a - b, r1 = e + f;
    v[i0] = r0;
    v[i1] = r1;
}
