#version 450
// y[t][r] = W[r] · x[t] for the weights the CPU path multiplies in floating point: f32, f16, bf16,
// and iq4_nl and iq4_xs, whose weights are decoded as their dequantizers (src/tensor/types.c)
// decode them. In f32: each block of 32 columns summed in column order, then the blocks' sums added
// in order (the CPU's kernels sum in their vector lanes' order, so the two agree to f32 rounding,
// not bit for bit). Two ways to the same bits, as product_exact.comp's: one invocation per (row,
// token) (split 0), or a workgroup per (row, token) (split 1) whose invocations sum the blocks into
// shared memory and whose first invocation adds those up in order.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
// kind (vulkan.c's float_kind): 0 f32, 1 f16, 2 bf16, 3 iq4_nl, 4 iq4_xs; split: see above (the
// blocks then number at most MAX_BLOCKS)
// x_div: 0 for a matrix; else the experts' products of a mixture-of-experts layer (vulkan.c's
// quill_gpu_step_expert_products): "token" t is a (token, slot) pair whose expert is ids[ids_at + t],
// the matrix of `rows` rows at that expert's place in w, and whose activations are row t / x_div of x
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; uint split; uint x_div; uint ids_at; } p;
layout(std430, binding = 4) readonly buffer Ids { int ids[]; };

const uint MAX_BLOCKS = 1024u;
shared float s_sum[MAX_BLOCKS];

// iq4_nl's and iq4_xs's 16 levels (types.c's quill_kvalues_iq4nl)
const float IQ4[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0,
                                53.0, 69.0, 89.0, 113.0);

uint byte_at(uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

float half_at(uint i) { return unpackHalf2x16(byte_at(i) | (byte_at(i + 1u) << 8)).x; }

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
        // iq4_nl's 18-byte blocks (d, 16 bytes of nibbles, low nibbles first); iq4_xs's 136-byte
        // blocks of 256 (d, 2 bytes of high scale bits, 4 of low, 128 of nibbles), sub-block ib's
        // scale d·(ls - 32)
        uint qs;
        precise float dl;
        if (kind == 3u) {
            qs = row + b * 18u + 2u;
            dl = half_at(row + b * 18u);
        } else {
            const uint at = row + (b / 8u) * 136u, ib = b % 8u;
            const uint scales_h = byte_at(at + 2u) | (byte_at(at + 3u) << 8);
            const uint ls = ((byte_at(at + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xFu) | (((scales_h >> (2u * ib)) & 3u) << 4);
            dl = half_at(at) * float(int(ls) - 32);
            qs = at + 8u + ib * 16u;
        }
        for (uint j = 0u; j < 32u; j++) {
            const uint q = byte_at(qs + j % 16u);
            precise const float v = dl * IQ4[j < 16u ? q & 0xFu : q >> 4];
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
        for (uint b = 0u; b < n_blocks; b++) acc += block_sum(p.kind, row, b, x0);
        y[t * p.rows + r] = acc;
        return;
    }
    for (uint b = lane; b < n_blocks; b += 64u) s_sum[b] = block_sum(p.kind, row, b, x0);
    barrier();
    if (lane != 0u) return;
    for (uint b = 0u; b < n_blocks; b++) acc += s_sum[b];
    y[t * p.rows + r] = acc;
}
