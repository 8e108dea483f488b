#version 450
// y[t][r] = W[r] · x[t] for f32 and f16 weights: f32 products summed in column order, one
// invocation per (row, token) (the CPU's kernels sum in their vector lanes' order, so the two
// agree to f32 rounding, not bit for bit).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
// kind: 0 f32, 1 f16
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; } p;

void main() {
    const uint id = gl_GlobalInvocationID.x;
    if (id >= p.rows * p.n_tok) return;
    const uint r = id % p.rows, t = id / p.rows;
    const uint x0 = t * p.cols, w0 = r * p.row_bytes / 4u;
    precise float acc = 0.0;
    if (p.kind == 0u) {
        for (uint k = 0u; k < p.cols; k++) acc = fma(uintBitsToFloat(w[w0 + k]), x[x0 + k], acc);
    } else {
        for (uint k = 0u; k < p.cols; k += 2u) {
            const vec2 h = unpackHalf2x16(w[w0 + k / 2u]);
            acc = fma(h.x, x[x0 + k], acc);
            acc = fma(h.y, x[x0 + k + 1u], acc);
        }
    }
    y[t * p.rows + r] = acc;
}
