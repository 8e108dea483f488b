#version 450
// y[t][r] = W[r] · x[t] for q4_0 and q8_0 weights with the activations' codes (quantize.comp),
// as src/kernels/exact_scalar.c defines the bits: per block of 32 the integer C = Σ q·a (exact),
// then acc = fma(C, d·da, acc) block after block. One invocation per (row, token), so that no
// result depends on the batch, the workgroup or the subgroup size.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer Codes { int codes[]; };
layout(std430, binding = 2) readonly buffer Scales { float da[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
// kind: 0 q4_0 (18-byte blocks: f16 d, 16 bytes of nibbles, codes q - 8), 1 q8_0 (34-byte blocks:
// f16 d, 32 signed bytes)
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; } p;

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

uint byte_at(uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

void main() {
    const uint id = gl_GlobalInvocationID.x;
    if (id >= p.rows * p.n_tok) return;
    const uint r = id % p.rows, t = id / p.rows;
    const uint nb = p.cols / 32u, block_bytes = p.kind == 0u ? 18u : 34u;
    precise float acc = 0.0;
    for (uint b = 0u; b < nb; b++) {
        const uint at = r * p.row_bytes + b * block_bytes;
        const float d = unpackHalf2x16(byte_at(at) | (byte_at(at + 1u) << 8)).x;
        const uint a0 = (t * nb + b) * 32u;
        int c = 0;
        if (p.kind == 0u) {
            for (uint j = 0u; j < 16u; j++) {
                const uint q = byte_at(at + 2u + j);
                c += (int(q & 0xFu) - 8) * codes[a0 + j] + (int(q >> 4) - 8) * codes[a0 + 16u + j];
            }
        } else {
            for (uint j = 0u; j < 32u; j++) c += bitfieldExtract(int(byte_at(at + 2u + j)), 0, 8) * codes[a0 + j];
        }
        precise const float s = d * da[t * nb + b];
        acc = fma_once(float(c), s, acc);
    }
    y[t * p.rows + r] = acc;
}
