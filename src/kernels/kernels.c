/* Scalar kernels and the run-time choice of instruction set. */
#include "kernels/kernels.h"
#include "base/exp_poly.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <cpuid.h>
#endif

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

static void swiglu_scalar(float *gate, const float *up, int64_t n) {
    for (int64_t i = 0; i < n; i++) gate[i] = gate[i] / (1.0f + exp_poly(-gate[i])) * up[i];
}

static const quill_kernels scalar_table = {
    .isa = "scalar", .dot = dot_scalar, .weighted_sum = quill_weighted_sum_scalar, .dot_columns = dot_columns_scalar,
    .softmax = softmax_scalar, .swiglu = swiglu_scalar};

const quill_kernels *quill_kernels_scalar(void) { return &scalar_table; }

#if defined(__x86_64__)
/* clang 14's __builtin_cpu_supports does not know "f16c": ask CPUID (leaf 1, ECX bit 29). */
static bool cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

const quill_kernels *quill_kernels_for(const char *isa) {
    if (!strcmp(isa, "scalar")) return &scalar_table;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!strcmp(isa, "avx2") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        cpu_has_f16c())
        return &quill_kernels_avx2_table;
    if (!strcmp(isa, "avx512") && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_f16c())
        return &quill_kernels_avx512_table;
    if (!strcmp(isa, "amx")) return quill_kernels_amx();
    if (!strcmp(isa, "vnni")) return quill_kernels_vnni();
#endif
    return NULL;
}

const quill_kernels *quill_kernels_best(void) {
    const char *forced = getenv("QUILL_ISA");
    if (forced && *forced) {
        const quill_kernels *k = quill_kernels_for(forced);
        if (k) return k;
    }
    const quill_kernels *k;
    if ((k = quill_kernels_amx())) return k;
    if ((k = quill_kernels_vnni())) return k;
    if ((k = quill_kernels_for("avx512"))) return k;
    if ((k = quill_kernels_for("avx2"))) return k;
    return &scalar_table;
}

quill_row_dequant_fn quill_kernels_dequant(const quill_kernels *k, uint32_t type) {
    if (type < QUILL_TYPE_COUNT && k->dequant[type]) return k->dequant[type];
    const quill_type_traits *tr = quill_type_traits_of(type);
    return tr ? tr->to_float : NULL;
}
