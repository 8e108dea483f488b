#version 450
// y[t][r] = W[r] · x[t] for the weights the CPU path multiplies in floating point: f32, f16, bf16
// and nvfp4 (its weights decoded as types_lowbit.c decodes them: exactly). In f32: each block of 32 columns summed in column order, then the blocks' sums added
// in order (the CPU's kernels sum in their vector lanes' order, so the two agree to f32 rounding,
// not bit for bit). Two ways to the same bits, as product_exact.comp's: one invocation per (row,
// token) (split 0), or a workgroup per (row, token) (split 1) whose invocations sum the blocks into
// shared memory and whose first invocation adds those up in order.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
// kind (vulkan.c's float_kind): 0 f32, 1 f16, 2 bf16, 3 nvfp4; split: see above (the
// blocks then number at most MAX_BLOCKS)
// x_div: 0 for a matrix; else the experts' products of a mixture-of-experts layer (vulkan.c's
// quill_gpu_step_expert_products): "token" t is a (token, slot) pair whose expert is ids[ids_at + t],
// the matrix of `rows` rows at that expert's place in w, and whose activations are row t / x_div of x
// the kind of this pipeline's weights (a specialization constant: vulkan.c's product_pipe makes a
// pipeline per kind, each holding its own decoding only); the push constants' kind is the same
layout(constant_id = 0) const uint KIND = 0u;
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; uint split; uint x_div; uint ids_at; } p;
layout(std430, binding = 4) readonly buffer Ids { int ids[]; };

const uint MAX_BLOCKS = 1024u;
shared float s_sum[MAX_BLOCKS];

uint byte_at(uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

// E2M1's levels, doubled (types_lowbit.c's quill_kvalues_fp4)
const int FP4[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);

// An unsigned E4M3 scale, halved as the levels are doubled; 0 and 0x7F (its NaN) read as 0
// (types_lowbit.c's ue4m3_half_to_float: every value exact in f32)
float ue4m3_half(uint x) {
    if (x == 0u || x == 0x7Fu) return 0.0;
    const uint e = (x >> 3) & 0xFu, m = x & 7u;
    return (e == 0u ? float(m) * exp2(-9.0) : (1.0 + float(m) / 8.0) * exp2(float(int(e) - 7))) * 0.5;
}

// The sum of block b (columns 32b .. 32b + 31, fewer at the end of a row of f32, f16 or bf16) of the
// row at byte `row`, with the activations from x[x0].
float block_sum(uint kind, uint row, uint b, uint x0) {
    precise float acc = 0.0;
    const uint k0 = b * 32u, k1 = min(k0 + 32u, p.cols);
    if (kind == 0u) {
        for (uint k = k0; k < k1; k++) acc = fma(uintBitsToFloat(w[row / 4u + k]), x[x0 + k], acc);
    } else if (kind <= 2u) {
        // (rows of an even number of columns: whole 4-byte pairs)
        for (uint k = k0; k < k1; k += 2u) {
            const uint pair = w[row / 4u + k / 2u];
            const vec2 h = kind == 1u ? unpackHalf2x16(pair)
                                      : vec2(uintBitsToFloat(pair << 16), uintBitsToFloat(pair & 0xFFFF0000u));
            acc = fma(h.x, x[x0 + k], acc);
            acc = fma(h.y, x[x0 + k + 1u], acc);
        }
    } else {
        // nvfp4: 36-byte blocks of 64 (4 scales, one per 16 columns, then 8 bytes of nibbles per 16
        // columns, low nibbles first); block b of 32 is half b % 2 of one
        const uint at = row + (b / 2u) * 36u;
        for (uint j = 0u; j < 32u; j++) {
            const uint sub = 2u * (b % 2u) + j / 16u, jj = j % 16u, q = byte_at(at + 4u + 8u * sub + jj % 8u);
            precise const float v = float(FP4[jj < 8u ? q & 0xFu : q >> 4]) * ue4m3_half(byte_at(at + sub));
            acc = fma(v, x[x0 + k0 + j], acc);
        }
    }
    return acc;
}

void main() {
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, lane = gl_LocalInvocationID.x;
    // neighbouring (row, token) pairs are the tokens of one row: they read the same weight bytes
    const uint id = p.split != 0u ? wg : wg * 64u + lane;
    if (id >= p.rows * p.n_tok) return;
    const uint r = id / p.n_tok, t = id % p.n_tok;
    const uint x0 = (p.x_div != 0u ? t / p.x_div : t) * p.cols, n_blocks = (p.cols + 31u) / 32u;
    const uint row = (p.x_div != 0u ? uint(ids[p.ids_at + t]) * p.rows + r : r) * p.row_bytes;
    precise float acc = 0.0;
    if (p.split == 0u) {
        for (uint b = 0u; b < n_blocks; b++) acc += block_sum(KIND, row, b, x0);
        y[t * p.rows + r] = acc;
        return;
    }
    for (uint b = lane; b < n_blocks; b += 64u) s_sum[b] = block_sum(KIND, row, b, x0);
    barrier();
    if (lane != 0u) return;
    for (uint b = 0u; b < n_blocks; b++) acc += s_sum[b];
    y[t * p.rows + r] = acc;
}
