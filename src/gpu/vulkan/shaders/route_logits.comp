#version 450
// A mixture-of-experts router's logits in float64, one invocation per (row, token): out[t][r] =
// W[r] · x[t] (+ bias[r]), as the CPU's kernels.h dot_f64 computes them (model/ffn_moe.c): element
// i in partial sum i mod 8, in i order, the eight added ((0+1)+(2+3))+((4+5)+(6+7)), then the bias
// added in float64. A product of two floats is exact in float64, so the steps round as the CPU's
// and the logits are its bits. Also the shared expert's gate (one row: its vector).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { float w[]; };
layout(std430, binding = 1) readonly buffer X { float x[]; };
layout(std430, binding = 2) readonly buffer Bias { float bias[]; };
layout(std430, binding = 3) writeonly buffer Out { double outv[]; };
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint has_bias; } p;

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (id >= p.rows * p.n_tok) return;
    const uint r = id % p.rows, t = id / p.rows, w0 = r * p.cols, x0 = t * p.cols;
    double part[8] = double[8](0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF, 0.0LF);
    for (uint i = 0u; i < p.cols; i++) {
        precise const double v = part[i % 8u] + double(w[w0 + i]) * double(x[x0 + i]);
        part[i % 8u] = v;
    }
    precise double sum = ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
    if (p.has_bias != 0u) sum = sum + double(bias[r]);
    outv[t * p.rows + r] = sum;
}
