/* The KV cache's element types: storing, rounding and decoding (see kv_cache.h). */
#include "model/kv_cache.h"
#include "model/context.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <string.h>

bool quill_kv_type_ok(uint32_t type) {
    return type == QUILL_TYPE_F32 || type == QUILL_TYPE_F16 || type == QUILL_TYPE_BF16 || type == QUILL_TYPE_Q8_0 ||
           type == QUILL_TYPE_Q4_0;
}

size_t quill_kv_row_bytes(uint32_t type, int64_t head_dim) { return quill_row_size(type, head_dim); }

void quill_kv_quantize_q8_0(const float *x, uint16_t *d, int8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; j++) amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
    *d = quill_f32_to_f16(amax / 127.0f);
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < QK8_0; j++) {
        /* rintf rounds half to even, as the vector round; a NaN converts to INT_MIN, which the
         * saturating packs make -128 */
        const float v = rintf(x[j] * id);
        q[j] = (int8_t)(v != v ? -128 : v >= 127.0f ? 127 : v <= -128.0f ? -128 : (int)v);
    }
}

/* q4_0 as the reference's CPU cache stores it (its quantize_row_q4_0 is the portable one): the
 * levels 0..15 of 32 values and d's f16 bits. */
static void quantize_q4_0_levels(const float *x, uint16_t *d, uint8_t *levels) {
    block_q4_0 b;
    quill_from_float_q4_0(x, (uint8_t *)&b, 1);
    *d = b.d;
    for (int j = 0; j < QK4_0 / 2; j++) {
        levels[j] = b.qs[j] & 0xF;
        levels[j + QK4_0 / 2] = b.qs[j] >> 4;
    }
}

void quill_kv_store_key(uint32_t type, uint8_t *block, int slot, const float *k, int64_t hd) {
    switch (type) {
    case QUILL_TYPE_F32: {
        float *b = (float *)block;
        for (int64_t i = 0; i < hd; i++) b[i * KEY_BLOCK + slot] = k[i];
        return;
    }
    case QUILL_TYPE_F16:
    case QUILL_TYPE_BF16: {
        uint16_t *b = (uint16_t *)block;
        for (int64_t i = 0; i < hd; i++) b[i * KEY_BLOCK + slot] = type == QUILL_TYPE_F16 ? quill_f32_to_f16(k[i]) : quill_f32_to_bf16(k[i]);
        return;
    }
    case QUILL_TYPE_Q8_0: {
        int8_t *codes = (int8_t *)block;
        uint16_t *scales = (uint16_t *)(block + (size_t)hd * KEY_BLOCK);
        for (int64_t g = 0; g < hd / QK8_0; g++) {
            int8_t q[QK8_0];
            quill_kv_quantize_q8_0(k + g * QK8_0, &scales[g * KEY_BLOCK + slot], q);
            for (int j = 0; j < QK8_0; j++) codes[(g * QK8_0 + j) * KEY_BLOCK + slot] = q[j];
        }
        return;
    }
    case QUILL_TYPE_Q4_0: {
        uint8_t *pairs = block;
        uint16_t *scales = (uint16_t *)(block + (size_t)hd / 2 * KEY_BLOCK);
        for (int64_t g = 0; g < hd / QK4_0; g++) {
            uint8_t levels[QK4_0];
            quantize_q4_0_levels(k + g * QK4_0, &scales[g * KEY_BLOCK + slot], levels);
            for (int j = 0; j < QK4_0; j += 2)
                pairs[(g * QK4_0 + j) / 2 * KEY_BLOCK + slot] = (uint8_t)(levels[j] | levels[j + 1] << 4);
        }
        return;
    }
    default: return;
    }
}

void quill_kv_store_value(uint32_t type, uint8_t *row, const float *v, int64_t hd) {
    switch (type) {
    case QUILL_TYPE_F32: memcpy(row, v, (size_t)hd * sizeof *v); return;
    case QUILL_TYPE_F16:
    case QUILL_TYPE_BF16:
        for (int64_t i = 0; i < hd; i++) {
            const uint16_t h = type == QUILL_TYPE_F16 ? quill_f32_to_f16(v[i]) : quill_f32_to_bf16(v[i]);
            memcpy(row + 2 * i, &h, 2);
        }
        return;
    case QUILL_TYPE_Q8_0:
        for (int64_t g = 0; g < hd / QK8_0; g++) {
            block_q8_0 b;
            quill_kv_quantize_q8_0(v + g * QK8_0, &b.d, b.qs);
            memcpy(row + (size_t)g * sizeof b, &b, sizeof b);
        }
        return;
    case QUILL_TYPE_Q4_0: quill_from_float_q4_0(v, row, hd / QK4_0); return;
    default: return;
    }
}

const float *quill_kv_key_block(const quill_kernels *k, uint32_t type, const uint8_t *block, int64_t hd, float *tile) {
    switch (type) {
    case QUILL_TYPE_F32: return (const float *)block;
    case QUILL_TYPE_Q8_0: k->key_block_q8_0(block, hd, tile); return tile;
    case QUILL_TYPE_Q4_0: k->key_block_q4_0(block, hd, tile); return tile;
    default: quill_kernels_dequant(k, type)(block, tile, hd * KEY_BLOCK); return tile;
    }
}

const float *quill_kv_value_rows(const quill_kernels *k, uint32_t type, const uint8_t *rows, int n, int64_t hd,
                                 float *tile) {
    if (type == QUILL_TYPE_F32) return (const float *)rows;
    quill_kernels_dequant(k, type)(rows, tile, (int64_t)n * hd);
    return tile;
}

void quill_kv_round_double(uint32_t type, double *x, int64_t hd) {
    if (type == QUILL_TYPE_F32) return;
    /* (head sizes of the models quill runs are at most a few hundred) */
    float f[1024], back[1024];
    uint8_t row[1024 * 4];
    for (int64_t at = 0; at < hd; at += 1024) {
        const int64_t n = hd - at < 1024 ? hd - at : 1024;
        for (int64_t i = 0; i < n; i++) f[i] = (float)x[at + i];
        quill_kv_store_value(type, row, f, n);
        quill_type_traits_of(type)->to_float(row, back, n);
        for (int64_t i = 0; i < n; i++) x[at + i] = back[i];
    }
}
