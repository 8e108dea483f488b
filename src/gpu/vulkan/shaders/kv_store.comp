#version 450
#extension GL_GOOGLE_include_directive : require
// A batch's keys and values into the device's KV cache, each rounded once into the cache's type as
// model/kv_cache.c stores it (kv_types.glsl's rows): layer l's keys of sequence s at k_base +
// s·k_seq_stride, head h's position pos at + (h·n_ctx + pos)·(its row's words); its values likewise
// from v_base. One invocation per (token, keys or values, head, block of 32 elements).
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer K { float k[]; };
layout(std430, binding = 1) readonly buffer V { float v[]; };
layout(std430, binding = 2) buffer Cache { uint cache[]; };
layout(std430, binding = 3) readonly buffer Tokens { int tok[]; }; // [token]: position, sequence, attention factor, 0
layout(push_constant) uniform Params {
    uint kv_dim; uint hd; uint n_ctx; uint n_tok; uint k_base; uint v_base; uint k_seq_stride; uint v_seq_stride;
    uint type_k; uint type_v;
} p;

#include "kv_types.glsl"

float element(bool values, uint at) { return values ? v[at] : k[at]; }

void main() {
    const uint id = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    const uint n_heads = p.kv_dim / p.hd, groups = (p.hd + 31u) / 32u;
    if (id >= p.n_tok * 2u * n_heads * groups) return;
    const uint g = id % groups, h = (id / groups) % n_heads, which = (id / (groups * n_heads)) % 2u;
    const uint t = id / (groups * n_heads * 2u);
    const bool values = which == 1u;
    const uint type = values ? p.type_v : p.type_k, words = kv_row_words(type, p.hd);
    const uint pos = uint(tok[4u * t]), seq = uint(tok[4u * t + 1u]);
    const uint row = (values ? p.v_base + seq * p.v_seq_stride : p.k_base + seq * p.k_seq_stride) +
                     (h * p.n_ctx + pos) * words;
    const uint x0 = t * p.kv_dim + h * p.hd + g * 32u, n = min(32u, p.hd - g * 32u);
    if (type == 0u) {
        for (uint j = 0u; j < n; j++) cache[row + g * 32u + j] = floatBitsToUint(element(values, x0 + j));
    } else if (type <= 2u) {
        for (uint j = 0u; j < n; j += 2u) {
            const float a = element(values, x0 + j), b = element(values, x0 + j + 1u);
            const uint lo = type == 1u ? f32_to_f16(a) : f32_to_bf16(a), hi = type == 1u ? f32_to_f16(b) : f32_to_bf16(b);
            cache[row + (g * 32u + j) / 2u] = lo | (hi << 16);
        }
    } else if (type == 3u) {
        // q8_0: kv_cache.c's quill_kv_quantize_q8_0
        float amax = 0.0;
        for (uint j = 0u; j < 32u; j++) amax = abs(element(values, x0 + j)) > amax ? abs(element(values, x0 + j)) : amax;
        const uint d = f32_to_f16(divide_once(amax, 127.0));
        const float id_ = amax != 0.0 ? divide_once(127.0, amax) : 0.0;
        for (uint w = 0u; w < 8u; w++) {
            uint word = 0u;
            for (uint j = 0u; j < 4u; j++) {
                precise const float s = element(values, x0 + 4u * w + j) * id_;
                const float r = roundEven(s);
                const int q = isnan(r) ? -128 : r >= 127.0 ? 127 : r <= -128.0 ? -128 : int(r);
                word |= (uint(q) & 0xFFu) << (8u * j);
            }
            cache[row + g * 8u + w] = word;
        }
        cache[row + p.hd / 4u + g] = floatBitsToUint(f16_to_f32(d));
    } else {
        // q4_0: quantize.c's quill_from_float_q4_0 (the largest magnitude maps to -8, its sign kept)
        float amax = 0.0, mx = 0.0;
        for (uint j = 0u; j < 32u; j++) {
            const float e = element(values, x0 + j);
            if (amax < abs(e)) {
                amax = abs(e);
                mx = e;
            }
        }
        precise const float d = mx * -0.125;
        const float id_ = d != 0.0 ? divide_once(1.0, d) : 0.0;
        for (uint w = 0u; w < 4u; w++) {
            uint word = 0u;
            for (uint j = 0u; j < 8u; j++) {
                precise const float s = element(values, x0 + 8u * w + j) * id_;
                precise const float lv = s + 8.5;
                const uint level = !(lv > 0.0) ? 0u : lv >= 15.0 ? 15u : uint(lv);
                word |= level << (4u * j);
            }
            cache[row + g * 4u + w] = word;
        }
        cache[row + p.hd / 8u + g] = floatBitsToUint(f16_to_f32(f32_to_f16(d)));
    }
}
