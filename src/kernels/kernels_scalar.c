/* The scalar set: plain loops that run on any CPU, the yardstick every instruction set's kernels are
 * tested against, and the fallback each set's table starts from (kernels.c copies it before a set
 * installs its own). It calls nothing above it: the sets call its functions, never the reverse. */
#include "kernels/kernels.h"
#include "base/exp_poly.h"

#include <math.h>
#include <string.h>

/* Plain loop, accumulated in double: the slow, simple yardstick for the SIMD versions. */
static void dot_scalar(const float *w, const float *x, int64_t n, int n_tok, int64_t x_stride, float *out,
                       int64_t out_stride) {
    for (int t = 0; t < n_tok; t++) {
        const float *xt = x + t * x_stride;
        double sum = 0;
        for (int64_t i = 0; i < n; i++) sum += (double)w[i] * xt[i];
        out[t * out_stride] = (float)sum;
    }
}

void quill_weighted_sum_scalar(const float *wgt, int64_t wgt_stride, int n_heads, const float *v, int n_rows,
                               int64_t stride, int64_t n, float *out, int64_t out_stride, bool accumulate) {
    for (int h = 0; h < n_heads; h++) {
        const float *w = wgt + h * wgt_stride;
        float *o = out + h * out_stride;
        if (!accumulate)
            for (int64_t d = 0; d < n; d++) o[d] = 0;
        for (int p = 0; p < n_rows; p++)
            for (int64_t d = 0; d < n; d++) o[d] = fmaf(w[p], v[p * stride + d], o[d]);
    }
}

static void dot_columns_scalar(const float *q, int64_t q_stride, int n_heads, const float *kt, int64_t n,
                               int64_t stride, int n_cols, float *out, int64_t out_stride) {
    for (int h = 0; h < n_heads; h++)
        for (int p = 0; p < n_cols; p++) {
            float acc = 0;
            for (int64_t d = 0; d < n; d++) acc = fmaf(q[h * q_stride + d], kt[d * stride + p], acc);
            out[h * out_stride + p] = acc;
        }
}

static void softmax_scalar(float *x, int n, float s) {
    float max = -INFINITY, part[16] = {0};
    for (int p = 0; p < n; p++) {
        x[p] *= s;
        if (x[p] > max) max = x[p];
    }
    for (int p = 0; p < n; p++) {
        x[p] = exp_poly(x[p] - max);
        part[p % 16] += x[p];
    }
    for (int w = 8; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) part[j] += part[j + w];
    const float inv = 1.0f / part[0];
    for (int p = 0; p < n; p++) x[p] *= inv;
}

double quill_dot_f64_finish(double part[8], const float *w, const float *x, int64_t from, int64_t n) {
    for (int64_t i = from; i < n; i++) part[i % 8] += (double)w[i] * (double)x[i];
    return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

static void dot_f64_scalar(const float *w, int64_t w_stride, int rows, const float *x, int64_t n, double *out) {
    for (int r = 0; r < rows; r++) {
        double part[8] = {0};
        out[r] = quill_dot_f64_finish(part, w + r * w_stride, x, 0, n);
    }
}

static void swiglu_scalar(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) gate[i] = gate[i] / (1.0f + exp_poly(-gate[i])) * up[i];
}

/* group g's f16 scales of a quantized key block, one per position */
static void key_block_scales(const uint8_t *scales, int64_t g, float *s) {
    for (int p = 0; p < QUILL_KEY_BLOCK; p++) {
        uint16_t h;
        memcpy(&h, scales + 2 * ((size_t)g * QUILL_KEY_BLOCK + (size_t)p), 2);
        s[p] = quill_f16_to_f32(h);
    }
}

/* q8_0 key block: codes int8 [hd][KEY_BLOCK], then the f16 scales [hd / 32][KEY_BLOCK] */
static void key_block_q8_0_scalar(const uint8_t *block, int64_t hd, float *tile) {
    const int8_t *codes = (const int8_t *)block;
    const uint8_t *scales = block + (size_t)hd * QUILL_KEY_BLOCK;
    for (int64_t g = 0; g < hd / 32; g++) {
        float s[QUILL_KEY_BLOCK];
        key_block_scales(scales, g, s);
        for (int64_t d = g * 32; d < g * 32 + 32; d++)
            for (int p = 0; p < QUILL_KEY_BLOCK; p++)
                tile[d * QUILL_KEY_BLOCK + p] = (float)codes[d * QUILL_KEY_BLOCK + p] * s[p];
    }
}

/* q4_0 key block: levels [hd / 2][KEY_BLOCK] bytes (dimension 2i low nibble, 2i + 1 high), then
 * the f16 scales [hd / 32][KEY_BLOCK]; a value is (level - 8) · scale */
static void key_block_q4_0_scalar(const uint8_t *block, int64_t hd, float *tile) {
    const uint8_t *scales = block + (size_t)hd / 2 * QUILL_KEY_BLOCK;
    for (int64_t g = 0; g < hd / 32; g++) {
        float s[QUILL_KEY_BLOCK];
        key_block_scales(scales, g, s);
        for (int64_t d = g * 32; d < g * 32 + 32; d += 2)
            for (int p = 0; p < QUILL_KEY_BLOCK; p++) {
                const uint8_t b = block[d / 2 * QUILL_KEY_BLOCK + p];
                tile[d * QUILL_KEY_BLOCK + p] = (float)((b & 0xF) - 8) * s[p];
                tile[(d + 1) * QUILL_KEY_BLOCK + p] = (float)((b >> 4) - 8) * s[p];
            }
    }
}

/* x·y as quill_delta_rule_fn defines it: 8 chains of fused multiply-adds, added 4, 2, 1 apart */
static float dot8_scalar(const float *x, const float *y, int64_t n) {
    float part[8] = {0};
    for (int64_t i = 0; i < n; i++) part[i % 8] = fmaf(x[i], y[i], part[i % 8]);
    for (int w = 4; w >= 1; w /= 2)
        for (int j = 0; j < w; j++) part[j] += part[j + w];
    return part[0];
}

void quill_delta_rule_scalar(float *state, int64_t s, int n_tok, const float *q, const float *k, int64_t qk_stride,
                             const float *v, int64_t v_stride, const float *decay, const float *beta,
                             int64_t gate_stride, float scale, float *out, int64_t out_stride) {
    for (int t = 0; t < n_tok; t++) {
        const float *qt = q + t * qk_stride, *kt = k + t * qk_stride;
        const float g = decay[t * gate_stride], b = beta[t * gate_stride];
        for (int64_t j = 0; j < s; j++) {
            float *row = state + j * s;
            for (int64_t i = 0; i < s; i++) row[i] *= g;
            const float delta = (v[t * v_stride + j] - dot8_scalar(row, kt, s)) * b;
            for (int64_t i = 0; i < s; i++) row[i] = fmaf(kt[i], delta, row[i]);
            out[t * out_stride + j] = dot8_scalar(row, qt, s) * scale;
        }
    }
}

static const quill_kernels scalar_table = {
    .isa = "scalar", .dot = dot_scalar, .weighted_sum = quill_weighted_sum_scalar, .dot_columns = dot_columns_scalar,
    .softmax = softmax_scalar, .swiglu = swiglu_scalar, .key_block_q8_0 = key_block_q8_0_scalar,
    .key_block_q4_0 = key_block_q4_0_scalar, .delta_rule = quill_delta_rule_scalar,
    .dot_f64 = dot_f64_scalar};

const quill_kernels *quill_kernels_scalar(void) { return &scalar_table; }

