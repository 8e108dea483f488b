/* Every fast kernel against its plain version: row dequantizers bit for bit against the type's
 * to_float, SIMD dot products against the double-precision scalar dot, and fused quantized products
 * bit for bit against dequantize-then-dot of the same kernel set. */
#include "test.h"

#include "base/exp_poly.h"
#include "base/threadpool.h"
#include "kernels/kernels.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) { return test_rand(&rng_state); }
static float rndf(void) { return test_randf(&rng_state); }

/* Random but valid blocks: random bytes everywhere, then finite, moderate half scales. */
static void random_row(uint32_t type, uint8_t *row, int64_t n) {
    const quill_type_traits *tr = quill_type_traits_of(type);
    size_t bytes = quill_row_size(type, n);
    for (size_t i = 0; i < bytes; i++) row[i] = (uint8_t)rnd();
    int64_t nb = n / tr->block_size;
    for (int64_t b = 0; b < nb; b++) {
        uint8_t *blk = row + (size_t)b * tr->type_size;
        uint16_t h1 = quill_f32_to_f16(rndf() * 0.05f), h2 = quill_f32_to_f16(rndf() * 0.05f);
        switch (type) {
        case QUILL_TYPE_F16: case QUILL_TYPE_BF16: case QUILL_TYPE_F32: break;
        case QUILL_TYPE_Q4_1: case QUILL_TYPE_Q5_1: memcpy(blk + 2, &h2, 2); /* fallthrough */
        case QUILL_TYPE_Q4_0: case QUILL_TYPE_Q5_0: case QUILL_TYPE_Q8_0: case QUILL_TYPE_IQ4_NL:
        case QUILL_TYPE_IQ4_XS:
            memcpy(blk, &h1, 2); break;
        case QUILL_TYPE_Q4_K: case QUILL_TYPE_Q5_K: memcpy(blk, &h1, 2); memcpy(blk + 2, &h2, 2); break;
        case QUILL_TYPE_Q2_K: memcpy(blk + 80, &h1, 2); memcpy(blk + 82, &h2, 2); break;
        case QUILL_TYPE_Q3_K: memcpy(blk + 108, &h1, 2); break;
        case QUILL_TYPE_Q6_K: memcpy(blk + 208, &h1, 2); break;
        default: break;
        }
    }
    /* memcpy: the row may sit at an odd address on purpose */
    bool plain = type == QUILL_TYPE_F32 || type == QUILL_TYPE_F16 || type == QUILL_TYPE_BF16;
    for (int64_t i = 0; plain && i < n; i++) {
        float f = rndf();
        uint16_t h = type == QUILL_TYPE_F16 ? quill_f32_to_f16(f) : quill_f32_to_bf16(f);
        if (type == QUILL_TYPE_F32) memcpy(row + 4 * i, &f, 4);
        else memcpy(row + 2 * i, &h, 2);
    }
}

static const uint32_t decodable[] = {
    QUILL_TYPE_F32, QUILL_TYPE_F16, QUILL_TYPE_BF16, QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_0, QUILL_TYPE_Q4_1,
    QUILL_TYPE_Q5_0, QUILL_TYPE_Q5_1, QUILL_TYPE_Q2_K, QUILL_TYPE_Q3_K, QUILL_TYPE_Q4_K, QUILL_TYPE_Q5_K,
    QUILL_TYPE_Q6_K, QUILL_TYPE_IQ4_NL, QUILL_TYPE_IQ4_XS,
};
static const char *const isas[] = {"avx2", "avx512", "dotprod", "i8mm"};

/* The named set, or NULL after reporting a skip when this CPU lacks it (the other sets are still
 * checked, and the test reads "skip", not "ok"). */
/* The set, or NULL; a set of this architecture the CPU lacks makes the test a skip, one of the
 * other architecture does not (those run under qemu: make cross-test), so that a test whose
 * checks ran on every set this machine can have reads as passed. */
static const quill_kernels *set_or_skip(const char *isa) {
    const quill_kernels *k = quill_kernels_for(isa);
#if defined(__x86_64__)
    const bool other_arch = !strcmp(isa, "dotprod") || !strcmp(isa, "i8mm");
#else
    const bool other_arch = strcmp(isa, "dotprod") && strcmp(isa, "i8mm");
#endif
    if (!k && !other_arch) {
        char why[96];
        snprintf(why, sizeof why, "this CPU does not offer the %s kernel set", isa);
        test_skip(why);
    }
    return k;
}

TEST(kernels_dequant_bit_identical_to_to_float) {
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const quill_kernels *kern = set_or_skip(isas[k]);
        if (!kern) continue;
        for (size_t ti = 0; ti < sizeof decodable / sizeof decodable[0]; ti++) {
            uint32_t type = decodable[ti];
            const quill_type_traits *tr = quill_type_traits_of(type);
            int64_t n = tr->block_size == 256 ? 768 : 96 + tr->block_size; /* several blocks, odd count */
            if (tr->block_size == 1) n = 77;
            uint8_t *row = test_guarded(quill_row_size(type, n) + 2, 16);
            float *a = test_guarded((size_t)n * sizeof *a, 16), *b = test_guarded((size_t)n * sizeof *b, 16);
            /* GGUF only guarantees 2-byte alignment of a row (block sizes are even); the kernels
             * must not assume more */
            uint8_t *src = row + 2;
            random_row(type, src, n);
            tr->to_float(src, a, n);
            quill_kernels_dequant(kern, type)(src, b, n);
            bool same = memcmp(a, b, (size_t)n * sizeof *a) == 0;
            test_guarded_free(row); test_guarded_free(a); test_guarded_free(b);
            CHECK(same, "%s dequant of %s differs from to_float", isas[k], tr->name);
        }
    }
}

TEST(kernels_dot_matches_scalar_for_every_size) {
    const quill_kernels *scalar = quill_kernels_scalar();
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const quill_kernels *kern = set_or_skip(isas[k]);
        if (!kern) continue;
        for (int64_t n = 1; n <= 300; n += (n < 70 ? 1 : 37)) {
            for (int nt = 1; nt <= 11; nt += 3) {
                float *w = test_guarded((size_t)n * sizeof *w, 16), *x = test_guarded((size_t)n * nt * sizeof *x, 16);
                float fast[16], ref[16];
                for (int64_t i = 0; i < n; i++) w[i] = rndf();
                for (int64_t i = 0; i < n * nt; i++) x[i] = rndf();
                kern->dot(w, x, n, nt, n, fast, 1);
                scalar->dot(w, x, n, nt, n, ref, 1);
                double worst = 0;
                for (int t = 0; t < nt; t++) {
                    double bound = 0;
                    for (int64_t i = 0; i < n; i++) bound += fabs((double)w[i] * x[t * n + i]);
                    double e = fabs((double)fast[t] - ref[t]) / (bound + 1e-30);
                    if (e > worst) worst = e;
                }
                test_guarded_free(w); test_guarded_free(x);
                /* f32 accumulation: error bounded by ~n ulp of the absolute sum; 1e-6 is generous */
                CHECK(worst < 1e-6, "%s dot n=%lld nt=%d: relative error %.3g", isas[k], (long long)n, nt, worst);
            }
        }
    }
}

/* Attention's weighted sum: every instruction set gives the scalar bits (one chain of fused
 * multiply-adds per head and dimension, rows in order), for 1 to 9 heads at a time (the vector
 * kernels batch heads by 2, 4, 8 or 16), head sizes they vectorize and ones they hand back to the
 * scalar loop. */
TEST(kernels_weighted_sum_bit_identical_to_scalar) {
    const quill_kernels *scalar = quill_kernels_scalar();
    const int64_t sizes[] = {8, 16, 48, 64, 128, 100, 256, 272, 3};
    const int heads[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const quill_kernels *kern = set_or_skip(isas[k]);
        if (!kern) continue;
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
                const int64_t n = sizes[si], stride = n + 7, wstride = 41, ostride = n + 3;
                const int rows = 37, nh = heads[hi];
                float *v = test_guarded((size_t)(rows * stride) * sizeof *v, 16),
                      *wgt = test_guarded((size_t)(nh * wstride) * sizeof *wgt, 16),
                      *fast = test_guarded((size_t)(nh * ostride) * sizeof *fast, 16),
                      *ref = test_guarded((size_t)(nh * ostride) * sizeof *ref, 16);
                memset(fast, 0, (size_t)(nh * ostride) * sizeof *fast);
                memset(ref, 0, (size_t)(nh * ostride) * sizeof *ref);
                for (int64_t i = 0; i < rows * stride; i++) v[i] = rndf();
                for (int64_t i = 0; i < nh * wstride; i++) wgt[i] = rndf() * rndf();
                kern->weighted_sum(wgt, wstride, nh, v, rows, stride, n, fast, ostride, false);
                scalar->weighted_sum(wgt, wstride, nh, v, rows, stride, n, ref, ostride, false);
                bool same = memcmp(fast, ref, (size_t)(nh * ostride) * sizeof *fast) == 0;
                /* the same rows a block at a time (13, then 24 more): the same bits again */
                memset(fast, 0, (size_t)(nh * ostride) * sizeof *fast);
                kern->weighted_sum(wgt, wstride, nh, v, 13, stride, n, fast, ostride, false);
                kern->weighted_sum(wgt + 13, wstride, nh, v + 13 * stride, rows - 13, stride, n, fast, ostride, true);
                bool blocked = memcmp(fast, ref, (size_t)(nh * ostride) * sizeof *fast) == 0;
                test_guarded_free(v); test_guarded_free(wgt); test_guarded_free(fast); test_guarded_free(ref);
                CHECK(same, "%s weighted sum of %lld dims, %d heads differs", isas[k], (long long)n, nh);
                CHECK(blocked, "%s weighted sum of %lld dims, %d heads, in two blocks differs", isas[k], (long long)n, nh);
            }
    }
}

/* Attention's scores against the dimension-major key cache: every instruction set gives the
 * scalar bits (one fused multiply-add chain per head and column), for column counts with every
 * tail and 1 to 9 heads at a time, and nothing written past the columns. */
TEST(kernels_dot_columns_bit_identical_to_scalar) {
    const quill_kernels *scalar = quill_kernels_scalar();
    const int heads[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const quill_kernels *kern = set_or_skip(isas[k]);
        if (!kern) continue;
        for (int cols = 1; cols <= 150; cols += cols < 20 ? 3 : 13)
            for (size_t hi = 0; hi < sizeof heads / sizeof heads[0]; hi++) {
                const int64_t n = 64, stride = 157, qstride = 70, ostride = 163;
                const int nh = heads[hi];
                float *q = test_guarded((size_t)(nh * qstride) * sizeof *q, 16),
                      *kt = test_guarded((size_t)(n * stride) * sizeof *kt, 16),
                      *fast = test_guarded((size_t)(nh * ostride) * sizeof *fast, 16),
                      *ref = test_guarded((size_t)(nh * ostride) * sizeof *ref, 16);
                /* the same marks in both outside the columns: a write past the last one shows */
                for (int64_t i = 0; i < nh * ostride; i++) fast[i] = ref[i] = -1.5f - (float)i;
                for (int64_t i = 0; i < nh * qstride; i++) q[i] = rndf();
                for (int64_t i = 0; i < n * stride; i++) kt[i] = rndf();
                kern->dot_columns(q, qstride, nh, kt, n, stride, cols, fast, ostride);
                scalar->dot_columns(q, qstride, nh, kt, n, stride, cols, ref, ostride);
                CHECK(memcmp(fast, ref, (size_t)(nh * ostride) * sizeof *fast) == 0, "%s scores of %d columns, %d heads differ",
                      isas[k], cols, nh);
                test_guarded_free(q); test_guarded_free(kt); test_guarded_free(fast); test_guarded_free(ref);
            }
    }
}

/* Attention's softmax: every instruction set gives the scalar bits (same exponential, same
 * partial sums) for every tail, and all of them stay within 1e-6 (relative, plus the f32
 * argument's rounding) of a softmax in double with libm's exp. */
TEST(kernels_softmax_bit_identical_and_accurate) {
    const quill_kernels *scalar = quill_kernels_scalar();
    for (int n = 1; n <= 300; n += n < 40 ? 1 : 37) {
        float *x = test_guarded((size_t)n * sizeof *x, 16),
              *ref = test_guarded((size_t)n * sizeof *ref, 16),
              *fast = test_guarded((size_t)n * sizeof *fast, 16);
        for (int p = 0; p < n; p++) x[p] = (n % 2 ? 12 : 600) * rndf(); /* exponents down to -75 */
        if (n > 3) x[n / 2] = -1e30f; /* far below the rest: its weight is 0 */
        const float s = 0.125f;
        double max = -INFINITY, sum = 0;
        for (int p = 0; p < n; p++) max = fmax(max, (double)s * x[p]);
        for (int p = 0; p < n; p++) sum += exp((double)s * x[p] - max);
        memcpy(ref, x, (size_t)n * sizeof *x);
        scalar->softmax(ref, n, s);
        /* beyond a few ulp, the f32 argument s·x - m carries an absolute error up to |s·x - m|·2^-24,
         * which e^ turns into that relative error */
        double worst = 0;
        for (int p = 0; p < n; p++) {
            const double arg = (double)s * x[p] - max, want = exp(arg) / sum;
            worst = fmax(worst, fabs(ref[p] - want) / fmax(want, 1e-30) / (1e-6 + fabs(arg) * 0x1p-24));
        }
        CHECK(worst < 1, "softmax of %d: error %.3g of the bound", n, worst);
        for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
            const quill_kernels *kern = set_or_skip(isas[k]);
            if (!kern) continue;
            memcpy(fast, x, (size_t)n * sizeof *x);
            kern->softmax(fast, n, s);
            CHECK(memcmp(fast, ref, (size_t)n * sizeof *fast) == 0, "%s softmax of %d differs from scalar", isas[k], n);
        }
        test_guarded_free(x); test_guarded_free(ref); test_guarded_free(fast);
    }
}

/* The router's float64 dot products (kernels.h's dot_f64): every instruction set gives the scalar
 * bits, for every tail and row count (their vector paths take rows in fours or pairs), and the
 * scalar ones are within float64 rounding of a long double sum. */
TEST(kernels_dot_f64_bit_identical_and_accurate) {
    const quill_kernels *scalar = quill_kernels_scalar();
    for (int64_t n = 1; n <= 300; n += n < 40 ? 1 : 37)
        for (int rows = 1; rows <= 7; rows += 3) {
            const int64_t stride = n + 3;
            float *w = test_guarded((size_t)(rows * stride) * sizeof *w, 16),
                  *x = test_guarded((size_t)n * sizeof *x, 16);
            double ref[7], fast[7];
            for (int64_t i = 0; i < rows * stride; i++) w[i] = rndf() * (i % 5 ? 1.0f : 300.0f);
            for (int64_t i = 0; i < n; i++) x[i] = rndf();
            scalar->dot_f64(w, stride, rows, x, n, ref);
            for (int r = 0; r < rows; r++) {
                long double sum = 0, mag = 0;
                for (int64_t i = 0; i < n; i++)
                    sum += (long double)w[r * stride + i] * x[i], mag += fabsl((long double)w[r * stride + i] * x[i]);
                CHECK(fabsl(ref[r] - sum) <= mag * 0x1p-50, "dot_f64 of %lld: %.17g against %.17Lg", (long long)n, ref[r], sum);
            }
            for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
                const quill_kernels *kern = set_or_skip(isas[k]);
                if (!kern) continue;
                kern->dot_f64(w, stride, rows, x, n, fast);
                CHECK(memcmp(fast, ref, (size_t)rows * sizeof *fast) == 0, "%s dot_f64 of %d x %lld differs from scalar",
                      isas[k], rows, (long long)n);
            }
            test_guarded_free(w); test_guarded_free(x);
        }
}

/* The feed-forward gate: every instruction set gives the scalar bits, for every tail and for
 * arguments from tiny to beyond exp's range (and inf / nan), within 4e-7 of a double silu (where
 * e^-g overflows f32, below -88, the result is 0 where it is ~1e-37). */
TEST(kernels_swiglu_bit_identical_and_accurate) {
    const quill_kernels *scalar = quill_kernels_scalar();
    for (int64_t n = 1; n <= 200; n += n < 40 ? 1 : 23) {
        float *g = test_guarded((size_t)n * sizeof *g, 16), *u = test_guarded((size_t)n * sizeof *u, 16);
        float *ref = test_guarded((size_t)n * sizeof *ref, 16), *fast = test_guarded((size_t)n * sizeof *fast, 16);
        for (int64_t i = 0; i < n; i++) {
            const float mag = i % 5 == 0 ? 1e-3f : i % 5 == 1 ? 200.0f : 8.0f;
            g[i] = mag * rndf(), u[i] = rndf() * 3;
        }
        if (n > 5) g[1] = INFINITY, g[2] = -INFINITY, g[3] = NAN, g[4] = -0.0f;
        memcpy(ref, g, (size_t)n * sizeof *g);
        scalar->swiglu(ref, u, n);
        for (int64_t i = 0; i < n; i++) {
            if (!isfinite(g[i])) continue;
            const double want = (double)g[i] / (1.0 + exp(-(double)g[i])) * u[i];
            CHECK(fabs(ref[i] - want) <= 4e-7 * fabs(want) + 1e-30, "silu(%g)·%g = %.9g, want %.9g", g[i], u[i], ref[i], want);
        }
        /* as the f32 formula gives (and libm's expf gave): -inf / (1 + inf) is nan */
        if (n > 5) CHECK(ref[1] == INFINITY * u[1] && isnan(ref[2]) && isnan(ref[3]), "inf, -inf, nan: %g %g %g", ref[1], ref[2], ref[3]);
        for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
            const quill_kernels *kern = set_or_skip(isas[k]);
            if (!kern) continue;
            memcpy(fast, g, (size_t)n * sizeof *g);
            kern->swiglu(fast, u, n);
            CHECK(memcmp(fast, ref, (size_t)n * sizeof *fast) == 0, "%s swiglu of %lld differs from scalar", isas[k], (long long)n);
        }
        test_guarded_free(g); test_guarded_free(u); test_guarded_free(ref); test_guarded_free(fast);
    }
}

/* exp_poly.h's tanh_poly (GELU's tanh form and soft-capping, the GPU's too) within 2 ulp of tanh
 * over every magnitude, on both sides of its 0.625 seam and past 9, odd, and tanh's specials. */
TEST(kernels_tanh_poly_accurate) {
    int worst = 0;
    float at = 0;
    for (int i = 0; i < 400000; i++) {
        /* a log-uniform magnitude from 1e-6 to 20, with a sign */
        const float x = (i % 2 ? -1.0f : 1.0f) * expf(-13.8f + 16.8f * (float)i / 400000.0f) * (1.0f + 0.01f * rndf());
        const float got = tanh_poly(x), want = (float)tanh((double)x);
        int32_t a, b;
        memcpy(&a, &got, 4), memcpy(&b, &want, 4);
        const int ulp = abs(a - b);
        if (ulp > worst) worst = ulp, at = x;
        if (tanh_poly(-x) != -got) {
            CHECK(false, "tanh_poly(%g) is not -tanh_poly(%g)", -x, x);
            return;
        }
    }
    CHECK(worst <= 2, "tanh_poly is %d ulp from tanh at %.9g", worst, at);
    const float nz = tanh_poly(-0.0f);
    CHECK(nz == 0 && signbit(nz) && tanh_poly(INFINITY) == 1 && tanh_poly(-INFINITY) == -1 && isnan(tanh_poly(NAN)) &&
          tanh_poly(9.5f) == 1, "tanh_poly's specials: -0, inf, -inf, nan, 9.5");
}

TEST(kernels_fused_bit_identical_to_dequant_then_dot) {
    for (size_t k = 0; k < sizeof isas / sizeof isas[0]; k++) {
        const quill_kernels *kern = set_or_skip(isas[k]);
        if (!kern) continue;
        for (uint32_t type = 0; type < QUILL_TYPE_COUNT; type++) {
            if (!kern->vec_dot[type]) continue;
            const quill_type_traits *tr = quill_type_traits_of(type);
            int64_t n = tr->block_size == 256 ? 512 : 160;
            for (int nt = 1; nt <= 19; nt += 2) {
                uint8_t *row = test_guarded(quill_row_size(type, n), 16);
                float *w = test_guarded((size_t)n * sizeof *w, 16), *x = test_guarded((size_t)n * nt * sizeof *x, 16);
                float fused[32], plain[32];
                random_row(type, row, n);
                for (int64_t i = 0; i < n * nt; i++) x[i] = rndf();
                kern->vec_dot[type](row, x, n, nt, n, fused, 1);
                quill_kernels_dequant(kern, type)(row, w, n);
                kern->dot(w, x, n, nt, n, plain, 1);
                bool same = memcmp(fused, plain, (size_t)nt * sizeof(float)) == 0;
                /* and each token alone gives the same bits as inside the group (batch invariance) */
                for (int t = 0; t < nt && same; t++) {
                    float alone;
                    kern->vec_dot[type](row, x + t * n, n, 1, n, &alone, 1);
                    same = memcmp(&alone, &fused[t], sizeof alone) == 0;
                }
                test_guarded_free(row); test_guarded_free(w); test_guarded_free(x);
                CHECK(same, "%s fused %s (nt=%d) differs from dequant + dot", isas[k], tr->name, nt);
            }
        }
    }
}

/* Whole-matrix products of float weights (f32, f16, bf16): each (row, token) result has the bits
 * of dequantize + the set's dot, for widths around the chunk and step sizes (masked tails),
 * row counts around the panel size, 1 to 40 tokens, two matrices per call, with and without
 * threads. */
TEST(kernels_float_matmul_bit_identical_to_dequant_then_dot) {
    const char *const sets[] = {"avx2", "avx512", "vnni"};
    const uint32_t types[] = {QUILL_TYPE_F32, QUILL_TYPE_F16, QUILL_TYPE_BF16};
    const int64_t widths[] = {1, 15, 32, 33, 100, 512, 545, 1100};
    const int64_t row_counts[] = {1, 4, 7};
    const int toks[] = {1, 2, 3, 5, 8, 16, 17, 40};
    quill_pool *pool = quill_pool_new(2);
    CHECK(pool != NULL, "a pool of 2 threads");
    int checked = 0;
    for (size_t k = 0; k < sizeof sets / sizeof sets[0]; k++) {
        const quill_kernels *kern = set_or_skip(sets[k]);
        if (!kern) continue;
        for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
            const uint32_t type = types[ti];
            if (!kern->matmul[type]) continue;
            for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++)
                for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++)
                    for (size_t ni = 0; ni < sizeof toks / sizeof toks[0]; ni++) {
                        const int64_t cols = widths[wi], rows = row_counts[ri];
                        const int nt = toks[ni];
                        const size_t rb = quill_row_size(type, cols);
                        uint8_t *w[2] = {test_guarded(rb * (size_t)rows, 16), test_guarded(rb * (size_t)rows, 16)};
                        float *x = test_guarded((size_t)(cols * nt) * sizeof *x, 16),
                              *row = test_guarded((size_t)cols * sizeof *row, 16);
                        float *y[2], *ref = test_guarded((size_t)(rows * nt) * sizeof *ref, 16);
                        for (int i = 0; i < 2; i++) {
                            for (int64_t r = 0; r < rows; r++) random_row(type, w[i] + (size_t)r * rb, cols);
                            y[i] = test_guarded((size_t)(rows * nt) * sizeof *y[i], 16);
                        }
                        for (int64_t i = 0; i < cols * nt; i++) x[i] = rndf();
                        bool same = true;
                        for (int threaded = 0; threaded < 2; threaded++) {
                            quill_matrix m[2] = {{w[0], rb, rows, y[0]}, {w[1], rb, rows, y[1]}};
                            kern->matmul[type](m, 2, cols, x, nt, threaded ? pool : NULL, NULL);
                            for (int i = 0; i < 2; i++)
                                for (int64_t r = 0; r < rows; r++) {
                                    quill_kernels_dequant(kern, type)(w[i] + (size_t)r * rb, row, cols);
                                    kern->dot(row, x, cols, nt, cols, ref + r, rows);
                                    for (int t = 0; t < nt; t++)
                                        same = same && memcmp(&ref[(size_t)t * (size_t)rows + (size_t)r],
                                                              &y[i][(size_t)t * (size_t)rows + (size_t)r], sizeof(float)) == 0;
                                }
                        }
                        CHECK(same, "%s %s product of %lld x %lld, %d tokens differs from dequant + dot", sets[k],
                              quill_type_traits_of(type)->name, (long long)rows, (long long)cols, nt);
                        test_guarded_free(w[0]); test_guarded_free(w[1]); test_guarded_free(x);
                        test_guarded_free(row); test_guarded_free(y[0]); test_guarded_free(y[1]);
                        test_guarded_free(ref);
                        checked++;
                    }
        }
    }
    quill_pool_free(pool);
    if (quill_kernels_for("avx512")) CHECK(checked > 0, "the avx512 set multiplies float matrices whole");
}
