// The KV cache's element types on the device (model/kv_cache.c's, the same roundings): a position
// of a KV head is a row of hd elements in `words` 32-bit words. f32: hd words; f16 and bf16: hd / 2
// words of pairs (element 2i in the low half); q8_0: hd / 4 words of signed byte codes, then hd / 32
// words holding each block's scale (its f16 rounding, as an f32); q4_0: hd / 8 words of levels
// (element 8w + j in bits 4j..4j+3 of word w, each level - 8 the code), then the scales so.
// type codes (vulkan.c's kv_kind): 0 f32, 1 f16, 2 bf16, 3 q8_0, 4 q4_0

#include "exact_math.glsl"

// quill_f32_to_f16 (tensor/types.c) in integers: round to nearest even, NaN payloads kept.
uint f32_to_f16(float f) {
    const uint x = floatBitsToUint(f), sign = (x >> 16) & 0x8000u, ex = (x >> 23) & 0xFFu, mant = x & 0x7FFFFFu;
    if (ex == 0xFFu) {
        if (mant == 0u) return sign | 0x7C00u;
        const uint payload = mant >> 13;
        return sign | 0x7C00u | (payload != 0u ? payload : 0x200u);
    }
    const int e = int(ex) - 127 + 15;
    if (e >= 0x1F) return sign | 0x7C00u;
    if (e <= 0) {
        if (e < -10) return sign;
        const uint full = mant | 0x800000u, shift = uint(14 - e);
        uint m = full >> shift;
        const uint rem = full & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (m & 1u) != 0u)) m++;
        return sign | m;
    }
    uint h = (uint(e) << 10) | (mant >> 13);
    const uint rem = mant & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u) != 0u)) h++;
    return sign | h;
}

// quill_f32_to_bf16: round to nearest even, a NaN truncated (its payload kept).
uint f32_to_bf16(float f) {
    uint x = floatBitsToUint(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) {
        const uint h = x >> 16;
        return (h & 0x7Fu) != 0u ? h : h | 0x40u;
    }
    x += 0x7FFFu + ((x >> 16) & 1u);
    return x >> 16;
}

// An f16's value, exactly (subnormals as m · 2^-24, which f32 holds as normal numbers).
float f16_to_f32(uint h) {
    const uint sign = (h & 0x8000u) << 16, ex = (h >> 10) & 0x1Fu, mant = h & 0x3FFu;
    if (ex == 0u) {
        precise const float v = float(mant) * uintBitsToFloat(0x33800000u);
        return uintBitsToFloat(floatBitsToUint(v) | sign);
    }
    if (ex == 0x1Fu) return uintBitsToFloat(sign | 0x7F800000u | (mant << 13));
    return uintBitsToFloat(sign | ((ex + 112u) << 23) | (mant << 13));
}


uint kv_row_words(uint type, uint hd) {
    return type == 0u ? hd : type <= 2u ? hd / 2u : type == 3u ? hd / 4u + hd / 32u : hd / 8u + hd / 32u;
}
