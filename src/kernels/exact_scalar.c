/* The exact integer products in plain C: the definition of the bits that the AMX, VNNI and AVX2
 * kernels (kernels_vnni.c, kernels_vnni_pack.c, kernels_amx.c, kernels_avx2_exact.c) reproduce.
 *
 * The arithmetic, for weight row r and token t:
 *   - activations: each block of 32 x is scaled to integers, a = round(x · A / max|x|), with scale
 *     da = max|x| / A, and each code rounded to 8 significant bits (kernels_exact.h; A is
 *     act_max(type), 32512 for most types). So every code is exactly a bf16 value, with an error
 *     relative to x like bf16 rounding for the large elements and much smaller for the small ones:
 *     ~5x closer to the f32 values than the reference's 8-bit activations;
 *   - weights: each sub-block (32 weights; 16 for q6_K, iq2_xs, iq2_s, iq1_m) enters as its
 *     integer codes (q - 8 for q4_0, q - 16 for q5_0, q - 32 for q6_K, q for the k-quants and
 *     q8_0; for the low-bit types the codes and scales exact_unpack.c defines), unpacked from the
 *     mapping;
 *   - per sub-block the integer C = Σ q·a, which A keeps below 2^24: exact in f32, whatever the
 *     order of the adds;
 *   - then in f32, sub-block after sub-block: acc = fma(C, s·da, acc), with s the sub-block's
 *     scale (d, or d·sc for k-quants), and for the types with minimums (q4_K, q5_K, q2_K; q4_1,
 *     q5_1 add theirs) acc = fma(-m, da·Σa, acc), Σa the sum of the sub-block's activation codes
 *     (of its block of 32: the sub-block for all but q2_K, whose sub-blocks are 16); y = acc.
 * Every step is a function of that row and that token alone, so any kernel that keeps to it is
 * bitwise batch- and thread-invariant, and equal to every other one.
 *
 * This file is built without instruction-set flags: it runs on every CPU (and is what tests
 * compare the fast kernels with). */
#include "kernels/exact_scalar.h"
#include "kernels/kernels_exact.h"

#include <stdlib.h>

bool quill_exact_supported(uint32_t type) { return exact_supported(type); }

void quill_exact_quantize_block(const float *x, uint32_t type, int16_t *a, float *da, int32_t *sum) {
    *da = quantize_block(x, type, a, sum);
}

/* The scales of a row's n sub-blocks: s[i], and m[i] for the types with minimums. */
static void row_scales(uint32_t type, const uint8_t *row, int n, float *s, float *m) {
    const exact_type *et = &exact_types[type];
    for (int i = 0; i < n; i++) {
        const int64_t k = (int64_t)i * et->slot_width;
        const uint8_t *b = row + (size_t)(k / et->block_elems) * (size_t)et->block_bytes;
        switch (et->scales) {
        case EXACT_SCALE_D:
        case EXACT_SCALE_D_M: {
            /* d first in every block; q4_1 and q5_1 keep their minimum next (added: m is its negation) */
            quill_half d, mn;
            memcpy(&d, b, 2);
            memcpy(&mn, b + 2, 2);
            s[i] = quill_half_to_float(d);
            if (et->scales == EXACT_SCALE_D_M) m[i] = -quill_half_to_float(mn);
            break;
        }
        case EXACT_SCALE_K4: {
            /* q4_K and q5_K share d, dmin and the scales' packing at the start of the block */
            const block_q4_K *kb = (const block_q4_K *)b;
            uint8_t sc, mn;
            quill_scale_min_k4((int)(k % 256 / 32), kb->scales, &sc, &mn);
            s[i] = quill_half_to_float(kb->d) * (float)sc;
            m[i] = quill_half_to_float(kb->dmin) * (float)mn;
            break;
        }
        case EXACT_SCALE_Q6_K: {
            const block_q6_K *kb = (const block_q6_K *)b;
            s[i] = quill_half_to_float(kb->d) * (float)kb->scales[k % 256 / 16];
            break;
        }
        case EXACT_SCALE_UNPACKED: break; /* their unpacker gives the scales */
        }
    }
}

/* The signed integer codes of a row's n columns. */
static void row_codes(uint32_t type, const uint8_t *row, int64_t n, int8_t *q) {
    for (int64_t k = 0; k < n; k++) {
        switch (type) {
        case QUILL_TYPE_Q4_0:
        case QUILL_TYPE_Q4_1:
        case QUILL_TYPE_Q5_0:
        case QUILL_TYPE_Q5_1: {
            const uint8_t *b = row + (size_t)(k / 32) * block_bytes(type);
            const int j = (int)(k % 32);
            int v = j < 16 ? b[legacy_qs(type) + j] & 0xF : b[legacy_qs(type) + j - 16] >> 4;
            if (legacy_qh(type)) {
                uint32_t qh;
                memcpy(&qh, b + legacy_qh(type), 4);
                v |= (int)((qh >> j) & 1) << 4;
            }
            q[k] = (int8_t)(v - code_bias(type));
            break;
        }
        case QUILL_TYPE_Q8_0: q[k] = ((const block_q8_0 *)row)[k / 32].qs[k % 32]; break;
        case QUILL_TYPE_Q4_K: {
            const block_q4_K *b = (const block_q4_K *)row + k / 256;
            int j = (int)(k % 256), chunk = j / 64, l = j % 32;
            q[k] = (int8_t)((j % 64) < 32 ? b->qs[chunk * 32 + l] & 0xF : b->qs[chunk * 32 + l] >> 4);
            break;
        }
        case QUILL_TYPE_Q5_K: {
            const block_q5_K *b = (const block_q5_K *)row + k / 256;
            int j = (int)(k % 256), chunk = j / 64, l = j % 32, hi = (j % 64) >= 32;
            int lo = hi ? b->qs[chunk * 32 + l] >> 4 : b->qs[chunk * 32 + l] & 0xF;
            q[k] = (int8_t)(lo | ((b->qh[l] >> (2 * chunk + hi)) & 1) << 4);
            break;
        }
        case QUILL_TYPE_Q6_K: {
            const block_q6_K *b = (const block_q6_K *)row + k / 256;
            int j = (int)(k % 256), half = j / 128, qd = (j % 128) / 32, l = j % 32;
            const uint8_t *ql = b->ql + 64 * half, *qh = b->qh + 32 * half;
            int lo = qd & 1 ? ql[l + 32] : ql[l];
            lo = qd >= 2 ? lo >> 4 : lo & 0xF;
            q[k] = (int8_t)((lo | ((qh[l] >> (2 * qd)) & 3) << 4) - 32);
            break;
        }
        default: q[k] = 0;
        }
    }
}

bool quill_exact_matmul_model(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols,
                              const float *x, int n_tok, float *y) {
    if (!exact_supported(type)) return false;
    const int kb = slot_width(type);
    int8_t *q = malloc((size_t)cols);
    int16_t *a = malloc((size_t)cols * sizeof *a);
    float *s = malloc((size_t)(cols / kb) * sizeof *s), *m = malloc((size_t)(cols / kb) * sizeof *m);
    float *da = malloc((size_t)(cols / 32) * sizeof *da);
    const bool ok = q && a && s && m && da;
    for (int t = 0; ok && t < n_tok; t++) {
        for (int64_t blk = 0; blk < cols / 32; blk++) {
            int32_t sum;
            da[blk] = quantize_block(x + t * cols + blk * 32, type, a + blk * 32, &sum);
        }
        for (int64_t r = 0; r < rows; r++) {
            const uint8_t *row = (const uint8_t *)w + r * row_bytes;
            if (exact_unpacked(type)) {
                quill_exact_unpack_for(type)(row, cols, q, s, m);
            } else {
                row_codes(type, row, cols, q);
                row_scales(type, row, (int)(cols / kb), s, m);
            }
            float acc = 0;
            for (int64_t i = 0; i < cols / kb; i++) {
                int32_t c = 0, sum = 0;
                for (int k = 0; k < kb; k++) c += q[i * kb + k] * a[i * kb + k], sum += a[i * kb + k];
                const int64_t blk = i * kb / 32;
                acc = fmaf((float)c, s[i] * da[blk], acc);
                if (has_min(type)) acc = fmaf(-m[i], da[blk] * (float)sum, acc);
            }
            y[(size_t)t * rows + r] = acc;
        }
    }
    free(q), free(a), free(s), free(m), free(da);
    return ok;
}
