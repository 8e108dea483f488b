/* The recurrent layers' kernels: each instruction set gives the scalar set's bits, the scalar set
 * is close to a float64 delta rule, and a token's result does not depend on how the tokens are
 * split into calls. */
#include "test.h"
#include "kernels/kernels.h"

#include <math.h>
#include <stdlib.h>

static const char *const recurrent_isas[] = {"avx2", "avx512", "vnni", "amx"};

static float uniform(uint32_t *seed) {
    *seed = *seed * 1664525u + 1013904223u;
    return (float)(*seed >> 8) / (float)(1u << 24) * 2.0f - 1.0f;
}

/* Inputs of n_tok tokens for a state of s: q and k unit vectors (as after the L2 norm) in rows of
 * qk_stride, v in rows of v_stride, decay in (0.5, 1), beta in (0, 1), the gates gate_stride apart. */
typedef struct {
    int64_t s, qk_stride, v_stride, gate_stride, out_stride;
    int n_tok;
    float *q, *k, *v, *decay, *beta, *state;
} delta_case;

static bool make_case(delta_case *d, int64_t s, int n_tok, uint32_t seed) {
    d->s = s, d->n_tok = n_tok;
    d->qk_stride = 2 * s + 3, d->v_stride = s + 5, d->gate_stride = 3, d->out_stride = s + 1;
    d->q = test_guarded((size_t)(n_tok * d->qk_stride) * sizeof(float), 16);
    d->k = test_guarded((size_t)(n_tok * d->qk_stride) * sizeof(float), 16);
    d->v = test_guarded((size_t)(n_tok * d->v_stride) * sizeof(float), 16);
    d->decay = test_guarded((size_t)(n_tok * d->gate_stride) * sizeof(float), 16);
    d->beta = test_guarded((size_t)(n_tok * d->gate_stride) * sizeof(float), 16);
    d->state = test_guarded((size_t)(s * s) * sizeof(float), 16);
    if (!d->q || !d->k || !d->v || !d->decay || !d->beta || !d->state) return false;
    for (int t = 0; t < n_tok; t++) {
        float *q = d->q + t * d->qk_stride, *k = d->k + t * d->qk_stride;
        double nq = 0, nk = 0;
        for (int64_t i = 0; i < s; i++) {
            q[i] = uniform(&seed), k[i] = uniform(&seed);
            nq += (double)q[i] * q[i], nk += (double)k[i] * k[i];
        }
        for (int64_t i = 0; i < s; i++) q[i] = (float)(q[i] / sqrt(nq)), k[i] = (float)(k[i] / sqrt(nk));
        for (int64_t i = 0; i < s; i++) d->v[t * d->v_stride + i] = 2 * uniform(&seed);
        d->decay[t * d->gate_stride] = 0.75f + 0.25f * uniform(&seed);
        d->beta[t * d->gate_stride] = 0.5f + 0.5f * uniform(&seed);
    }
    for (int64_t i = 0; i < s * s; i++) d->state[i] = 0.5f * uniform(&seed);
    return true;
}

static void free_case(delta_case *d) {
    test_guarded_free(d->q); test_guarded_free(d->k); test_guarded_free(d->v); test_guarded_free(d->decay);
    test_guarded_free(d->beta); test_guarded_free(d->state);
}

/* Runs the kernel over the tokens in calls of `split` tokens (0: one call), on a copy of the
 * state; out has n_tok rows. */
static bool run(const quill_kernels *kern, const delta_case *d, int split, float *state, float *out) {
    memcpy(state, d->state, (size_t)(d->s * d->s) * sizeof *state);
    const float scale = 1.0f / sqrtf((float)d->s);
    for (int t0 = 0; t0 < d->n_tok;) {
        const int n = split ? (d->n_tok - t0 < split ? d->n_tok - t0 : split) : d->n_tok;
        kern->delta_rule(state, d->s, n, d->q + t0 * d->qk_stride, d->k + t0 * d->qk_stride, d->qk_stride,
                         d->v + t0 * d->v_stride, d->v_stride, d->decay + t0 * d->gate_stride,
                         d->beta + t0 * d->gate_stride, d->gate_stride, scale, out + t0 * d->out_stride,
                         d->out_stride);
        t0 += n;
    }
    return true;
}

/* The delta rule in float64, row by row as the formula reads. */
static void run_double(const delta_case *d, double *state, double *out) {
    const int64_t s = d->s;
    for (int64_t i = 0; i < s * s; i++) state[i] = d->state[i];
    for (int t = 0; t < d->n_tok; t++) {
        const float *q = d->q + t * d->qk_stride, *k = d->k + t * d->qk_stride;
        for (int64_t j = 0; j < s; j++) {
            double *row = state + j * s, sk = 0, sq = 0;
            for (int64_t i = 0; i < s; i++) row[i] *= d->decay[t * d->gate_stride], sk += row[i] * k[i];
            const double delta = (d->v[t * d->v_stride + j] - sk) * d->beta[t * d->gate_stride];
            for (int64_t i = 0; i < s; i++) row[i] += k[i] * delta, sq += row[i] * q[i];
            out[t * d->out_stride + j] = sq / sqrt((double)s);
        }
    }
}

TEST(kernels_delta_rule_bit_identical_split_invariant_and_accurate) {
    const quill_kernels *scalar = quill_kernels_scalar();
    const int64_t sizes[] = {1, 5, 8, 12, 16, 24, 36, 128};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t s = sizes[si];
        const int n_tok = 7;
        delta_case d;
        bool ok = make_case(&d, s, n_tok, (uint32_t)(17 + s));
        const size_t out_len = (size_t)(n_tok * d.out_stride), st_len = (size_t)(s * s);
        float *ref_state = test_guarded(st_len * sizeof(float), 16), *ref_out = test_guarded(out_len * sizeof(float), 16);
        float *state = test_guarded(st_len * sizeof(float), 16), *out = test_guarded(out_len * sizeof(float), 16);
        double *exact_state = test_guarded(st_len * sizeof(double), 16),
               *exact_out = test_guarded(out_len * sizeof(double), 16);
        ok = ok && ref_state && ref_out && state && out && exact_state && exact_out;
        if (ok) {
            memset(ref_out, 0, out_len * sizeof(float));
            memset(out, 0, out_len * sizeof(float));
            memset(exact_out, 0, out_len * sizeof(double));
        }
        if (!ok) {
            free_case(&d); test_guarded_free(ref_state); test_guarded_free(ref_out);
            test_guarded_free(state); test_guarded_free(out); test_guarded_free(exact_state);
            test_guarded_free(exact_out);
            CHECK(false, "out of memory");
        }
        run(scalar, &d, 0, ref_state, ref_out);
        run_double(&d, exact_state, exact_out);
        double worst = 0, scale = 0;
        for (int t = 0; t < n_tok; t++)
            for (int64_t j = 0; j < s; j++) {
                const size_t at = (size_t)(t * d.out_stride + j);
                worst = fmax(worst, fabs(ref_out[at] - exact_out[at]));
                scale = fmax(scale, fabs(exact_out[at]));
            }
        for (size_t i = 0; i < st_len; i++) worst = fmax(worst, fabs(ref_state[i] - exact_state[i]));
        bool same = true;
        const char *which = "scalar";
        int split_bad = 0;
        /* the scalar set itself, a token per call and three per call */
        for (int split = 1; split <= 3 && same; split += 2) {
            run(scalar, &d, split, state, out);
            same = !memcmp(state, ref_state, st_len * sizeof *state) && !memcmp(out, ref_out, out_len * sizeof *out);
            split_bad = split;
        }
        for (size_t k = 0; k < sizeof recurrent_isas / sizeof recurrent_isas[0] && same; k++) {
            const quill_kernels *kern = quill_kernels_for(recurrent_isas[k]);
            if (!kern) continue;
            for (int split = 0; split <= 3 && same; split += 3) {
                run(kern, &d, split, state, out);
                same = !memcmp(state, ref_state, st_len * sizeof *state) && !memcmp(out, ref_out, out_len * sizeof *out);
                which = recurrent_isas[k], split_bad = split;
            }
        }
        free_case(&d); test_guarded_free(ref_state); test_guarded_free(ref_out); test_guarded_free(state);
        test_guarded_free(out); test_guarded_free(exact_state); test_guarded_free(exact_out);
        CHECK(same, "state %lld: the %s delta rule (calls of %d tokens, 0: all) differs from the scalar one", (long long)s,
              which, split_bad);
        CHECK(worst <= 2e-6 * (1 + scale) * sqrt((double)s), "state %lld: %.3g from the float64 delta rule",
              (long long)s, worst);
    }
}
