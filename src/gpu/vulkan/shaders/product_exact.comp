#version 450
#extension GL_GOOGLE_include_directive : require
// y[t][r] = W[r] · x[t] for the exact types' weights with the activations' codes (quantize.comp),
// as src/kernels/exact_scalar.c defines the bits: per slot (32 columns; q6_K, q2_K, q3_K: 16) the
// integer C = Σ q·a (exact), then acc = fma(C, s·da, acc) slot after slot, and for the types with
// minimums acc = fma(-m, da·Σa, acc) with Σa the slot's codes' sum. The codes q and the scales s, m
// of each type are exact_scalar.c's row_codes and row_scales, and exact_unpack.c's for q2_K, q3_K
// mxfp4, iq4_nl and iq4_xs. Two ways to the same bits: one invocation per (row, token) (split 0), or
// eight invocations per (row, token), eight pairs a workgroup (split 1, for a few tokens, where
// rows alone are too few to fill a GPU): they compute the slots' integers and the products s·da,
// da·Σa (each rounded on its own, in any order) into shared memory, 64 slots at a time, and the
// first of them adds them up slot after slot. (A workgroup per pair, as this was first, left its
// other 63 invocations idle through that chain and ran one row's chain per workgroup: 46 µs for a
// 2048-row matrix on an H200.) No result depends on the batch, the way, the workgroup or the
// subgroup size.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer Codes { int codes[]; };
// (the same codes four at a time: a slot's start at a multiple of 16 columns)
layout(std430, binding = 1) readonly buffer Codes4 { ivec4 codes4[]; };
layout(std430, binding = 2) readonly buffer Scales { float da[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
// kind (vulkan.c's exact_kind): 0 q4_0, 1 q4_1, 2 q5_0, 3 q5_1 (the 32-column formats with nibbles
// and fifth bits), 4 q8_0, 5 mxfp4, 6 q4_K, 7 q5_K, 8 q6_K, 9 q2_K, 10 q3_K, 11 iq4_nl, 12 iq4_xs,
// 13 iq2_xxs, 14 iq2_xs, 15 iq2_s, 16 iq3_xxs, 17 iq3_s, 18 iq1_s, 19 iq1_m, 20 tq1_0, 21 tq2_0,
// 22 q1_0, 23 q2_0
// split: see above (vulkan.c chooses)
// x_div: 0 for a matrix; else the experts' products of a mixture-of-experts layer (vulkan.c's
// quill_gpu_step_expert_products): "token" t is a (token, slot) pair whose expert is ids[ids_at + t],
// the matrix of `rows` rows at that expert's place in w, and whose activations are row t / x_div of x
// the kind of this pipeline's weights (a specialization constant: vulkan.c's product_pipe makes a
// pipeline per kind, each holding its own decoding only); the push constants' kind is the same
layout(constant_id = 0) const uint KIND = 0u;
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; uint split; uint x_div; uint ids_at; } p;
layout(std430, binding = 4) readonly buffer Ids { int ids[]; };
// the grid i-quants' lattice tables (iq_grids.c's), one after another: a 64-bit entry as two words,
// low first (vulkan.c's upload_grids writes them at these offsets)
layout(std430, binding = 5) readonly buffer Grids { uint grids[]; };

// the split way: a workgroup takes PAIRS (row, token) pairs, 64 / PAIRS invocations each, CHUNK
// slots at a time
const uint PAIRS = 8u, LANES = 64u / PAIRS, CHUNK = 64u;
shared float s_c[PAIRS * CHUNK], s_sda[PAIRS * CHUNK], s_negm[PAIRS * CHUNK], s_dsum[PAIRS * CHUNK];

#include "exact_weights.glsl"

// Slot s's terms of the sum for token xt: its integer C, the products s·da and da·Σa (each rounded
// on its own), and -m (0 without minimums).
void slot_terms(uint kind, uint row, uint s, uint xt, out float c, out float sda, out float neg_m, out float dsum) {
    const uint width = slot_width(kind);
    int ci, sum;
    float sc;
    slot_ints(kind, row, s, xt * p.cols + s * width, ci, sum);
    slot_scales(kind, row, s, sc, neg_m);
    const float dab = da[xt * (p.cols / 32u) + s * width / 32u];
    precise const float product = sc * dab, min_product = dab * float(sum);
    c = float(ci);
    sda = product;
    dsum = min_product;
}

void main() {
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, lane = gl_LocalInvocationID.x;
    // neighbouring (row, token) pairs are the tokens of one row: they read the same weight bytes
    const uint pair = lane / LANES, sub = lane % LANES;
    const uint id = p.split != 0u ? wg * PAIRS + pair : wg * 64u + lane;
    const bool valid = id < p.rows * p.n_tok;
    if (!valid && p.split == 0u) return;
    const uint r = valid ? id / p.n_tok : 0u, t = valid ? id % p.n_tok : 0u, kind = KIND, width = slot_width(kind);
    const uint xt = p.x_div != 0u ? t / p.x_div : t;
    const uint n_slots = p.cols / width;
    const uint row = valid ? (p.x_div != 0u ? uint(ids[p.ids_at + t]) * p.rows + r : r) * p.row_bytes : 0u;
    const bool mins = with_min(kind);
    precise float acc = 0.0;
    if (p.split == 0u) {
        for (uint s = 0u; s < n_slots; s++) {
            float c, sda, neg_m, dsum;
            slot_terms(kind, row, s, xt, c, sda, neg_m, dsum);
            acc = fma_once(c, sda, acc);
            if (mins) acc = fma_once(neg_m, dsum, acc);
        }
        y[t * p.rows + r] = acc;
        return;
    }
    // the split way: per chunk, a pair's invocations make its slots' integers and the products s·da,
    // da·Σa (each rounded on its own, in any order) into shared memory, then its first one adds them
    // up slot after slot; every invocation reaches every barrier (a pair past the end computes
    // nothing)
    for (uint base = 0u; base < n_slots; base += CHUNK) {
        const uint end = min(base + CHUNK, n_slots);
        for (uint s = base + sub; valid && s < end; s += LANES) {
            const uint at = pair * CHUNK + s - base;
            slot_terms(kind, row, s, xt, s_c[at], s_sda[at], s_negm[at], s_dsum[at]);
        }
        barrier();
        if (valid && sub == 0u)
            for (uint s = base; s < end; s++) {
                const uint at = pair * CHUNK + s - base;
                acc = fma_once(s_c[at], s_sda[at], acc);
                if (mins) acc = fma_once(s_negm[at], s_dsum[at], acc);
            }
        barrier();
    }
    if (valid && sub == 0u) y[t * p.rows + r] = acc;
}
