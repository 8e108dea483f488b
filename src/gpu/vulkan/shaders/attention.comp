#version 450
#extension GL_GOOGLE_include_directive : require
// Causal softmax attention over the device's KV cache (its rows in kv_types.glsl's types, decoded
// to f32 as model/kv_cache.c decodes them), one workgroup of 64 per (token, query
// head); query head h reads KV head h / (n_head / n_head_kv) (GQA). The bits are the CPU path's
// (layer_ops.c's attention with kernels.h's dot_columns, softmax and weighted_sum): each score one
// chain of fused multiply-adds in dimension order, times the scale; the largest; e = exp_poly(s -
// max) summed in 16 partial sums (position p in sum p mod 16, in position order) added pairwise 8,
// 4, 2, 1 apart; w = e · (1 / sum); each output dimension one chain of fused multiply-adds w·v in
// position order. A sliding window of w positions starts the keys at max(0, pos + 1 - w), and the
// partial sums count from there, as the CPU's softmax over that row does. Three passes over the
// positions (in chunks of 64, one per invocation): the largest score, the partial sums, the
// weighted sum. The first keeps the scores in shared memory when there are at most kept_max (at
// most MAX_KEPT) of them; beyond, the other two make them again (the same bits), so that shared
// memory stays small.
// With sinks (gpt-oss), each weight is then multiplied by f = 1 / (1 + w_max · exp_f64(sink_h - max))
// in float64, rounded to f32 (w_max = 1 / sum, the largest score's weight), as layer_ops.c's
// with_sink: the sink's share of the softmax.
// Nothing depends on the batch: only on the token's own position and its sequence's cache.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Q { float q[]; };
layout(std430, binding = 1) readonly buffer Cache { uint cache[]; };
layout(std430, binding = 2) readonly buffer Tokens { int tok[]; }; // [token]: position, sequence, attention factor, 0
layout(std430, binding = 3) writeonly buffer Out { float outv[]; };
layout(std430, binding = 4) readonly buffer Sinks { float sinks[]; }; // [query head]
layout(push_constant) uniform Params {
    uint n_head; uint n_head_kv; uint hd; uint n_ctx; uint n_tok; uint k_base; uint v_base; uint k_seq_stride;
    uint v_seq_stride; float scale; uint window; float softcap; uint kept_max; uint has_sinks; uint type_k; uint type_v;
} p;

#include "exact_math.glsl"
#include "kv_types.glsl"

// Element i of the cache row at word `row` of `type`, as an f32 (kv_cache.c's decoding: a code
// times its block's scale, one rounding).
float kv_at(uint row, uint type, uint i) {
    if (type == 0u) return uintBitsToFloat(cache[row + i]);
    if (type <= 2u) {
        const uint h = (cache[row + i / 2u] >> (16u * (i & 1u))) & 0xFFFFu;
        return type == 1u ? f16_to_f32(h) : uintBitsToFloat(h << 16);
    }
    if (type == 3u) {
        precise const float v = float(bitfieldExtract(int(cache[row + i / 4u]), int(8u * (i % 4u)), 8)) *
                                uintBitsToFloat(cache[row + p.hd / 4u + i / 32u]);
        return v;
    }
    precise const float v = float(int((cache[row + i / 8u] >> (4u * (i % 8u))) & 0xFu) - 8) *
                            uintBitsToFloat(cache[row + p.hd / 8u + i / 32u]);
    return v;
}

const uint MAX_HD = 256u, PER_LANE = MAX_HD / 64u, MAX_KEPT = 2048u;
shared float s_q[MAX_HD];
shared float s_kept[MAX_KEPT];
shared float s_w[64];
shared float s_part[16];

uint keys, values, k_words, v_words;
float scale_t;

// position j's score, scaled (softmax's x · s), or soft-capped: cap · tanh(x · s · (1 / cap)) (Gemma
// 2, layer_ops.c's softcap_scores, with exp_poly.h's tanh_poly: the CPU's bits)
float score(uint j) {
    float acc = 0.0;
    for (uint i = 0u; i < p.hd; i++) acc = fma_once(s_q[i], kv_at(keys + j * k_words, p.type_k, i), acc);
    precise const float s = acc * scale_t;
    if (p.softcap > 0.0) {
        const float inv = divide_once(1.0, p.softcap);
        precise const float si = s * inv;
        precise const float capped = p.softcap * tanh_poly(si);
        return capped;
    }
    return s;
}

void main() {
    const uint wg = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, lane = gl_LocalInvocationID.x;
    if (wg >= p.n_tok * p.n_head) return;
    const uint t = wg / p.n_head, h = wg % p.n_head, kvh = h / (p.n_head / p.n_head_kv);
    const uint pos = uint(tok[4u * t]), seq = uint(tok[4u * t + 1u]);
    // (the token's scale: the layer's times its attention temperature, forward.h's
    // quill_attn_temperature, 1 without one: layer_ops.c's base_scale · temperature)
    precise const float token_scale = p.scale * intBitsToFloat(tok[4u * t + 2u]);
    scale_t = token_scale;
    k_words = kv_row_words(p.type_k, p.hd);
    v_words = kv_row_words(p.type_v, p.hd);
    keys = p.k_base + seq * p.k_seq_stride + kvh * p.n_ctx * k_words;
    values = p.v_base + seq * p.v_seq_stride + kvh * p.n_ctx * v_words;
    const uint n_keys = pos + 1u, first = p.window != 0u && n_keys > p.window ? n_keys - p.window : 0u;
    for (uint i = lane; i < p.hd; i += 64u) s_q[i] = q[(t * p.n_head + h) * p.hd + i];
    barrier();
    // the largest scaled score (the same whatever the order)
    const bool kept = n_keys - first <= min(p.kept_max, MAX_KEPT);
    float m = uintBitsToFloat(0xFF800000u);
    for (uint j = first + lane; j < n_keys; j += 64u) {
        const float s = score(j);
        if (kept) s_kept[j - first] = s;
        m = max(m, s);
    }
    s_w[lane] = m;
    barrier();
    m = s_w[0];
    for (uint k = 1u; k < 64u; k++) m = max(m, s_w[k]);
    barrier();
    // the partial sums: invocation k < 16 adds positions first + k, first + k + 16, ... in order
    float part = 0.0;
    for (uint c0 = first; c0 < n_keys; c0 += 64u) {
        const uint j = c0 + lane;
        if (j < n_keys) {
            precise const float x = (kept ? s_kept[j - first] : score(j)) - m;
            s_w[lane] = exp_poly(x);
        }
        barrier();
        if (lane < 16u)
            for (uint k = lane; k < 64u && c0 + k < n_keys; k += 16u) {
                precise const float sum = part + s_w[k];
                part = sum;
            }
        barrier();
    }
    if (lane < 16u) s_part[lane] = part;
    barrier();
    if (lane == 0u)
        for (uint w = 8u; w >= 1u; w /= 2u)
            for (uint k = 0u; k < w; k++) {
                precise const float sum = s_part[k] + s_part[k + w];
                s_part[k] = sum;
            }
    barrier();
    const float inv = divide_once(1.0, s_part[0]);
    float sink_factor = 1.0;
    if (p.has_sinks != 0u) {
        precise const double f = 1.0LF / (1.0LF + double(inv) * exp_f64(double(sinks[h]) - double(m)));
        sink_factor = float(f);
    }
    // the weighted sum of the values
    float acc[PER_LANE];
    for (uint k = 0u; k < PER_LANE; k++) acc[k] = 0.0;
    for (uint c0 = first; c0 < n_keys; c0 += 64u) {
        const uint j = c0 + lane;
        if (j < n_keys) {
            precise const float x = (kept ? s_kept[j - first] : score(j)) - m;
            precise float w = exp_poly(x) * inv;
            if (p.has_sinks != 0u) w = w * sink_factor;
            s_w[lane] = w;
        }
        barrier();
        const uint n = min(64u, n_keys - c0);
        for (uint k = 0u; k < PER_LANE; k++) {
            const uint i = lane + 64u * k;
            if (i < p.hd)
                for (uint r = 0u; r < n; r++) acc[k] = fma_once(s_w[r], kv_at(values + (c0 + r) * v_words, p.type_v, i), acc[k]);
        }
        barrier();
    }
    for (uint k = 0u; k < PER_LANE; k++) {
        const uint i = lane + 64u * k;
        if (i < p.hd) outv[(t * p.n_head + h) * p.hd + i] = acc[k];
    }
}
