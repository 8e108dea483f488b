#version 450
#extension GL_GOOGLE_include_directive : require
// y[t][r] = W[r] · x[t] for a prompt's tokens, with the bits of product_exact.comp: per slot the
// integer C = Σ q·a (exact), then acc = fma(C, s·da, acc) slot after slot (and the minimums' term
// after it). A workgroup takes a tile of 64 rows by 64 tokens: slot after slot it decodes the
// tile's weights' codes and copies its tokens' codes into shared memory once, and each invocation
// multiplies 4 rows by 4 tokens from there. product_exact.comp reads a row's bytes and a token's
// codes once per (row, token): 64 times as many reads of both, which bound it on a GPU. The integer
// sums are made in f32 multiply-adds: kernels_exact.h's act_max keeps every slot's Σ|q·a| below
// 2^24, so each partial sum is an integer that f32 holds exactly, in any order and whether or not
// the multiply-add is fused (a GPU does twice as many f32 multiply-adds as integer ones a cycle).
// The results are product_exact.comp's bits.
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer Codes { int codes[]; };
// (the same codes four at a time: a slot's start at a multiple of 16 columns)
layout(std430, binding = 1) readonly buffer Codes4 { ivec4 codes4[]; };
layout(std430, binding = 2) readonly buffer Scales { float da[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(std430, binding = 5) readonly buffer Grids { uint grids[]; };
// the kind of this pipeline's weights (vulkan.c's tiled pipelines: the kinds of has_weight_code)
layout(constant_id = 0) const uint KIND = 0u;
// (product_exact.comp's push constants; split, x_div and ids_at are 0 here)
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; uint split; uint x_div; uint ids_at; } p;

#include "exact_weights.glsl"

const uint TILE = 64u;
// a slot's codes, column-major (column j of rows 4i .. 4i + 3 in s_w[j·16 + i]): an invocation reads
// its 4 rows' and its 4 tokens' codes of a column as two vectors
shared vec4 s_w[32u * TILE / 4u], s_a[32u * TILE / 4u];
shared float s_sc[TILE], s_negm[TILE], s_da[TILE], s_sum[TILE];

void main() {
    const uint kind = KIND, width = slot_width(kind), lane = gl_LocalInvocationID.x;
    const uint row_tiles = (p.rows + TILE - 1u) / TILE;
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
    if (wg >= row_tiles * ((p.n_tok + TILE - 1u) / TILE)) return;
    const uint r0 = (wg % row_tiles) * TILE, t0 = (wg / row_tiles) * TILE;
    const uint nb = p.cols / 32u, n_slots = p.cols / width;
    const bool mins = with_min(kind);
    // this invocation's outputs: rows r0 + 4ri + i, tokens t0 + 4ti + k
    const uint ri = lane % 16u, ti = lane / 16u;
    // what it stages: row (and token) lane / 4, columns from (lane % 4) · width / 4
    const uint stage = lane / 4u, per = width / 4u, j0 = (lane % 4u) * per;
    const bool stage_row = r0 + stage < p.rows, stage_tok = t0 + stage < p.n_tok;
    const uint row = (r0 + stage) * p.row_bytes, tok = t0 + stage;
    precise float acc[4][4];
    for (uint i = 0u; i < 4u; i++)
        for (uint k = 0u; k < 4u; k++) acc[i][k] = 0.0;
    for (uint s = 0u; s < n_slots; s++) {
        for (uint j = j0; j < j0 + per; j++) {
            s_w[j * 16u + stage / 4u][stage % 4u] = stage_row ? float(weight_code(kind, row, s, j)) : 0.0;
            s_a[j * 16u + stage / 4u][stage % 4u] = stage_tok ? float(codes[tok * p.cols + s * width + j]) : 0.0;
        }
        if (lane < TILE) {
            float sc = 0.0, neg_m = 0.0;
            if (r0 + lane < p.rows) slot_scales(kind, (r0 + lane) * p.row_bytes, s, sc, neg_m);
            s_sc[lane] = sc;
            s_negm[lane] = neg_m;
        } else if (lane < 2u * TILE) {
            const uint t = t0 + lane - TILE;
            float d = 0.0, sum = 0.0;
            if (t < p.n_tok) {
                d = da[t * nb + s * width / 32u];
                if (mins) {
                    int a = 0;
                    for (uint j = 0u; j < width; j++) a += codes[t * p.cols + s * width + j];
                    sum = float(a);
                }
            }
            s_da[lane - TILE] = d;
            s_sum[lane - TILE] = sum;
        }
        barrier();
        float c[4][4];
        for (uint i = 0u; i < 4u; i++)
            for (uint k = 0u; k < 4u; k++) c[i][k] = 0.0;
        for (uint j = 0u; j < width; j++) {
            const vec4 wv = s_w[j * 16u + ri], av = s_a[j * 16u + ti];
            for (uint i = 0u; i < 4u; i++)
                for (uint k = 0u; k < 4u; k++) c[i][k] += wv[i] * av[k];
        }
        for (uint i = 0u; i < 4u; i++) {
            const float sc = s_sc[4u * ri + i], neg_m = s_negm[4u * ri + i];
            for (uint k = 0u; k < 4u; k++) {
                const float dab = s_da[4u * ti + k];
                precise const float sda = sc * dab;
                acc[i][k] = fma_once(c[i][k], sda, acc[i][k]);
                if (mins) {
                    precise const float dsum = dab * s_sum[4u * ti + k];
                    acc[i][k] = fma_once(neg_m, dsum, acc[i][k]);
                }
            }
        }
        barrier();
    }
    for (uint i = 0u; i < 4u; i++)
        for (uint k = 0u; k < 4u; k++) {
            const uint r = r0 + 4u * ri + i, t = t0 + 4u * ti + k;
            if (r < p.rows && t < p.n_tok) y[t * p.rows + r] = acc[i][k];
        }
}
