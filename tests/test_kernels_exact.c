/* The exact integer products of the amx and vnni sets (exact_avx512.h, kernels_vnni*.c, kernels_amx.c) and of the avx2 and
 * avx512 sets (kernels_avx2_exact.c): bit for bit equal to their scalar model (exact_scalar.c),
 * within the error bound of their activation codes of a double product, and bitwise batch and
 * thread invariant. Each set's checks report a skip on CPUs without it (the scalar model's own
 * checks run everywhere). */
#include "test.h"

#include "kernels/kernels.h"
#include "kernels/exact_scalar.h"
#include "kernels/kernels_exact.h"
#include "base/threadpool.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) { return test_rand(&rng_state); }
static float rndf(void) { return test_randf(&rng_state); }

/* The types with exact products: the specialised kernels' eight, then the low-bit types and iq4 of
 * the unpacking kernels (exact_unpacked.h), q2_K (minimums per 16 columns) and q3_K last. */
static const uint32_t amx_types[] = {QUILL_TYPE_Q4_0,   QUILL_TYPE_Q4_1,    QUILL_TYPE_Q5_0,   QUILL_TYPE_Q5_1,
                                     QUILL_TYPE_Q8_0,   QUILL_TYPE_Q4_K,    QUILL_TYPE_Q5_K,   QUILL_TYPE_Q6_K,
                                     QUILL_TYPE_MXFP4,  QUILL_TYPE_TQ2_0,   QUILL_TYPE_TQ1_0,  QUILL_TYPE_Q1_0,
                                     QUILL_TYPE_Q2_0,   QUILL_TYPE_IQ2_XXS, QUILL_TYPE_IQ2_XS, QUILL_TYPE_IQ2_S,
                                     QUILL_TYPE_IQ3_XXS, QUILL_TYPE_IQ3_S,  QUILL_TYPE_IQ1_S,  QUILL_TYPE_IQ1_M,
                                     QUILL_TYPE_IQ4_NL,  QUILL_TYPE_IQ4_XS, QUILL_TYPE_Q2_K,   QUILL_TYPE_Q3_K};
#define N_TYPES (sizeof amx_types / sizeof amx_types[0])

/* Random valid rows (types.c's quill_random_rows). */
static uint8_t *random_matrix(uint32_t type, int64_t rows, int64_t cols, size_t *row_bytes) {
    *row_bytes = quill_row_size(type, cols);
    uint8_t *w = test_guarded(*row_bytes * (size_t)rows, 16);
    quill_random_rows(type, w, rows, cols, &rng_state);
    return w;
}

static float *random_acts(int n_tok, int64_t cols) {
    float *x = test_guarded((size_t)n_tok * (size_t)cols * sizeof *x, 16);
    /* activations of varied magnitude, as after a norm with some large channels */
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rndf() * (rnd() % 16 == 0 ? 20.0f : 1.0f);
    return x;
}

/* Not a multiple of the kernels' 256-column chunks for the 32-blocks: a short last chunk; for the
 * unpacking kernels more than their UNPACK_COLS (2048) columns, the last chunk short. */
static int64_t cols_for(uint32_t type) {
    if (exact_unpacked(type)) return 2304;
    return quill_type_traits_of(type)->block_size == 256 ? 768 : 352;
}

/* The named set, or NULL and a skip when this CPU lacks it. */
static const quill_kernels *set_or_skip(const char *isa) {
    const quill_kernels *k = quill_kernels_for(isa);
    if (!k) {
        char why[96];
        snprintf(why, sizeof why, "this CPU does not offer the %s kernel set", isa);
        test_skip(why);
    } else if (strcmp(k->isa, isa) != 0) {
        test_fail(__FILE__, __LINE__, "asked for the %s set, got %s", isa, k->isa);
        return NULL;
    }
    return k;
}

/* A check of a kernel set, registered once for each set that runs the exact integer products. */
#define ON_EXACT_SETS(check)                                                                         \
    TEST(kernels_amx_##check) {                                                                      \
        const quill_kernels *k = set_or_skip("amx");                                                 \
        if (k) check(k);                                                                             \
    }                                                                                                \
    TEST(kernels_vnni_##check) {                                                                     \
        const quill_kernels *k = set_or_skip("vnni");                                                \
        if (k) check(k);                                                                             \
    }                                                                                                \
    TEST(kernels_avx2_##check) {                                                                     \
        const quill_kernels *k = set_or_skip("avx2");                                                \
        if (k) check(k);                                                                             \
    }                                                                                                \
    TEST(kernels_avxvnni_##check) {                                                                  \
        const quill_kernels *k = set_or_skip("avxvnni");                                             \
        if (k) check(k);                                                                             \
    }                                                                                                \
    TEST(kernels_avx512_##check) {                                                                   \
        const quill_kernels *k = set_or_skip("avx512");                                              \
        if (k) check(k);                                                                             \
    }                                                                                                \
    TEST(kernels_dotprod_##check) {                                                                  \
        const quill_kernels *k = set_or_skip("dotprod");                                             \
        if (k) check(k);                                                                             \
    }                                                                                                \
    TEST(kernels_i8mm_##check) {                                                                     \
        const quill_kernels *k = set_or_skip("i8mm");                                                \
        if (k) check(k);                                                                             \
    }

/* Whether a set has the exact product for a type, which the checks then cover: every set must
 * have every type (a missing one fails, and its checks are skipped). */
static bool has_product(const quill_kernels *k, uint32_t type) {
    if (k->matmul[type]) return true;
    test_fail(__FILE__, __LINE__, "no %s product for %s", k->isa, quill_type_traits_of(type)->name);
    return false;
}

static void amx_product(const quill_kernels *k, uint32_t type, const uint8_t *w, size_t rb, int64_t rows,
                        int64_t cols, const float *x, int nt, float *y, quill_pool *pool) {
    void *scratch = test_guarded(k->matmul_scratch(cols, nt), 64);
    const quill_matrix m = {w, rb, rows, y};
    k->matmul[type](&m, 1, cols, x, nt, pool, scratch);
    test_guarded_free(scratch);
}

/* The largest activation code per type, as kernels_exact.h documents it: slot · max|q| · cap < 2^24. */
static int act_cap(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q8_0: return 4064;
    /* iq4's levels reach -127 as q8_0's codes do: 32 · 127 · 4064 < 2^24 */
    case QUILL_TYPE_IQ4_NL: case QUILL_TYPE_IQ4_XS: return 4064;
    case QUILL_TYPE_Q5_1: case QUILL_TYPE_Q5_K: return 16256;
    /* lattice magnitudes up to 43 (iq2) and 62 (iq3_xxs): 32 · 62 · 8128 < 2^24 */
    case QUILL_TYPE_IQ2_XXS: case QUILL_TYPE_IQ2_XS: case QUILL_TYPE_IQ2_S: case QUILL_TYPE_IQ3_XXS: return 8128;
    default: return 32512;
    }
}

static bool has_8_significant_bits(int v) {
    v = abs(v);
    while (v >= 256) {
        if (v & 1) return false;
        v >>= 1;
    }
    return true;
}

/* Activation codes: integers of at most 8 significant bits within the type's cap, within half a
 * step of x / da plus the 8-bit rounding (half a unit in the 8th bit), Σa and da as documented. */
TEST(kernels_exact_activation_codes) {
    float x[32];
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = amx_types[ti];
        const int cap = act_cap(type);
        bool reached = false;
        for (int trial = 0; trial < 200; trial++) {
            for (int i = 0; i < 32; i++) x[i] = rndf() * (trial % 3 == 0 ? 1e-30f : trial % 3 == 1 ? 1.0f : 3e4f);
            if (trial == 7) memset(x, 0, sizeof x);
            if (trial == 8) x[5] = NAN;
            if (trial == 9) x[31] = -INFINITY;
            int16_t a[32];
            float da;
            int32_t sum, s2 = 0;
            quill_exact_quantize_block(x, type, a, &da, &sum);
            if (trial == 8 || trial == 9) {
                CHECK(isnan(da) && sum == 0, "a non-finite block must give a NaN scale and zero codes");
                continue;
            }
            for (int i = 0; i < 32; i++) {
                s2 += a[i];
                reached |= abs(a[i]) == cap;
                CHECK(a[i] >= -cap && a[i] <= cap, "%s: code %d out of range", quill_type_traits_of(type)->name, a[i]);
                CHECK(has_8_significant_bits(a[i]), "code %d has more than 8 significant bits", a[i]);
                if (da > 0)
                    CHECK(fabs(x[i] / da - a[i]) <= 0.5 + fabs(x[i] / da) / 256 + 1e-3, "x %g / da %g vs code %d", x[i], da,
                          a[i]);
                else CHECK(a[i] == 0 && x[i] == 0, "zero block");
            }
            CHECK(s2 == sum, "sum %d vs %d", sum, s2);
        }
        CHECK(reached, "%s: no block reached the cap %d", quill_type_traits_of(type)->name, cap);
    }
}

/* The kernels (amx: tile loop and decoding; vnni: the decoding loop over several tokens) give
 * exactly the bits of the scalar model: rows not a multiple of the 16-row tiles, columns with a
 * short last chunk, decoding (1 token) and batches with partial groups and register blocks (and,
 * for vnni, more than the 256 tokens it takes per pass, the last pass a single token). */
static void bit_identical_to_scalar_model(const quill_kernels *k) {
    quill_pool *pool = quill_pool_new(2);
    const int64_t rows = 37;
    const int toks[] = {1, 3, 8, 17, 70, 257};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        if (!has_product(k, type)) continue;
        const int64_t cols = cols_for(type);
        size_t rb;
        uint8_t *w = random_matrix(type, rows, cols, &rb);
        for (size_t ni = 0; ni < sizeof toks / sizeof toks[0]; ni++) {
            int nt = toks[ni];
            float *x = random_acts(nt, cols), *y = test_guarded((size_t)nt * rows * sizeof *y, 16),
                  *want = test_guarded((size_t)nt * rows * sizeof *want, 16);
            amx_product(k, type, w, rb, rows, cols, x, nt, y, pool);
            CHECK(quill_exact_matmul_model(type, w, rb, rows, cols, x, nt, want), "the model runs");
            int bad = -1;
            for (int64_t i = 0; i < nt * rows && bad < 0; i++)
                if (memcmp(&y[i], &want[i], sizeof *y)) bad = (int)i;
            if (bad >= 0)
                test_fail(__FILE__, __LINE__, "%s, %d tokens: row %lld token %lld: kernel %.9g, model %.9g",
                          quill_type_traits_of(type)->name, nt, (long long)(bad % rows), (long long)(bad / rows),
                          y[bad], want[bad]);
            test_guarded_free(x); test_guarded_free(y); test_guarded_free(want);
        }
        test_guarded_free(w);
    }
    quill_pool_free(pool);
}

ON_EXACT_SETS(bit_identical_to_scalar_model)

/* A NaN or an infinity among a token's activations makes that token's outputs NaN (as f32 math
 * would give NaN or inf), a zero token gives zeros, and the other tokens are unaffected: on the
 * tile loop (batch) and on the vector path (one token). */
static void nonfinite_activations(const quill_kernels *k) {
    const int64_t rows = 20;
    const int nt = 5;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        if (!has_product(k, type)) continue;
        const int64_t cols = cols_for(type);
        size_t rb;
        uint8_t *w = random_matrix(type, rows, cols, &rb);
        float *x = random_acts(nt, cols), *y = test_guarded((size_t)nt * rows * sizeof *y, 16), one[20];
        x[1 * cols + 40] = NAN;
        x[2 * cols + 3] = INFINITY;
        memset(x + 3 * cols, 0, (size_t)cols * sizeof *x);
        amx_product(k, type, w, rb, rows, cols, x, nt, y, NULL);
        for (int t = 0; t < nt; t++) {
            amx_product(k, type, w, rb, rows, cols, x + t * cols, 1, one, NULL);
            for (int64_t r = 0; r < rows; r++) {
                float v = y[t * rows + r];
                if (t == 1 || t == 2) CHECK(isnan(v) && isnan(one[r]), "%s token %d row %lld: %g / %g, want NaN",
                                             quill_type_traits_of(type)->name, t, (long long)r, v, one[r]);
                else if (t == 3) CHECK(v == 0 && one[r] == 0, "%s zero token gives %g", quill_type_traits_of(type)->name, v);
                else CHECK(isfinite(v) && !memcmp(&v, &one[r], sizeof v), "%s token %d row %lld: %g vs %g alone",
                           quill_type_traits_of(type)->name, t, (long long)r, v, one[r]);
            }
        }
        test_guarded_free(w); test_guarded_free(x); test_guarded_free(y);
    }
}

ON_EXACT_SETS(nonfinite_activations)

/* Against a double product of the dequantized weights: each activation moves by at most half a
 * code step (step = max|x of its block| / cap) plus the rounding to 8 significant bits (|x| / 256,
 * with the half step it moved first), so |error| <= Σ_k |w_k| · (step_k / 2 + (|x_k| + step_k / 2) / 256),
 * plus the f32 sums (cols · 2^-23 of Σ|w·x|, generously). Checks the model, hence the kernels. */
TEST(kernels_exact_model_within_activation_bound) {
    const int64_t rows = 21;
    const int nt = 5;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        const int64_t cols = cols_for(type);
        size_t rb;
        uint8_t *w = random_matrix(type, rows, cols, &rb);
        float *wf = test_guarded((size_t)(rows * cols) * sizeof *wf, 16);
        for (int64_t r = 0; r < rows; r++) quill_type_traits_of(type)->to_float(w + r * rb, wf + r * cols, cols);
        float *x = random_acts(nt, cols), *y = test_guarded((size_t)nt * rows * sizeof *y, 16);
        CHECK(quill_exact_matmul_model(type, w, rb, rows, cols, x, nt, y), "the model runs");
        double worst = 0;
        for (int t = 0; t < nt; t++)
            for (int64_t r = 0; r < rows; r++) {
                double exact = 0, mag = 0, bound = 0;
                for (int64_t i = 0; i < cols; i++) {
                    double wi = wf[r * cols + i], xi = x[t * cols + i], amax = 0;
                    for (int64_t j = i / 32 * 32; j < i / 32 * 32 + 32; j++) amax = fmax(amax, fabs(x[t * cols + j]));
                    exact += wi * xi;
                    mag += fabs(wi * xi);
                    const double step = amax / act_cap(type);
                    bound += fabs(wi) * (step / 2 + (fabs(xi) + step / 2) / 256);
                }
                bound += (double)cols * 0x1p-23 * mag;
                double ratio = fabs(y[t * rows + r] - exact) / bound;
                if (ratio > worst) worst = ratio;
            }
        CHECK(worst <= 1.0, "%s: error %.3g of its bound", quill_type_traits_of(type)->name, worst);
        test_guarded_free(w); test_guarded_free(wf); test_guarded_free(x); test_guarded_free(y);
    }
}

/* Token t alone (as when decoding) gives the bits it gets inside any batch of 1..70 tokens, for
 * 1, 2 or 3 threads. */
static void batch_and_thread_invariance(const quill_kernels *k) {
    quill_pool *pools[3] = {quill_pool_new(1), quill_pool_new(2), quill_pool_new(3)};
    const int64_t rows = 45, max_tok = 70;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        if (!has_product(k, type)) continue;
        const char *name = quill_type_traits_of(type)->name;
        const int64_t cols = cols_for(type);
        size_t rb;
        uint8_t *w = random_matrix(type, rows, cols, &rb);
        float *x = random_acts((int)max_tok, cols);
        float *alone = test_guarded((size_t)(max_tok * rows) * sizeof *alone, 16);
        float *batch = test_guarded((size_t)(max_tok * rows) * sizeof *batch, 16);
        for (int64_t t = 0; t < max_tok; t++) amx_product(k, type, w, rb, rows, cols, x + t * cols, 1, alone + t * rows, NULL);
        bool ok = true;
        for (int nt = 1; nt <= max_tok && ok; nt++) {
            for (int p = 0; p < 3 && ok; p++) {
                /* every batch size with 2 threads, a spread of them with 1 and 3 */
                if (p != 1 && nt % 7 != 0 && nt != 1 && nt != max_tok) continue;
                int64_t off = max_tok - nt; /* the last nt tokens */
                amx_product(k, type, w, rb, rows, cols, x + off * cols, nt, batch, pools[p]);
                ok = memcmp(batch, alone + off * rows, (size_t)nt * rows * sizeof *batch) == 0;
                if (!ok)
                    test_fail(__FILE__, __LINE__, "%s: batch of %d tokens on %d threads differs from tokens alone",
                              name, nt, p + 1);
            }
        }
        test_guarded_free(w); test_guarded_free(x); test_guarded_free(alone); test_guarded_free(batch);
        if (!ok) break;
    }
    for (int p = 0; p < 3; p++) quill_pool_free(pools[p]);
}

ON_EXACT_SETS(batch_and_thread_invariance)

/* Matrices of one input in one call (as q, k and v are) give each the bits it gets alone: for
 * decoding and batches, row counts that end mid-tile, with and without a pool. */
static void joined_matrices(const quill_kernels *k) {
    quill_pool *pool = quill_pool_new(2);
    const int64_t rows[3] = {37, 16, 5};
    const int n_toks[3] = {1, 3, 40};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        if (!has_product(k, type)) continue;
        const int64_t cols = cols_for(type);
        float *x = random_acts(40, cols);
        uint8_t *w[3];
        size_t rb[3];
        float *alone[3], *joined[3];
        quill_matrix m[3];
        for (int i = 0; i < 3; i++) {
            w[i] = random_matrix(type, rows[i], cols, &rb[i]);
            alone[i] = test_guarded((size_t)(40 * rows[i]) * sizeof(float), 16);
            joined[i] = test_guarded((size_t)(40 * rows[i]) * sizeof(float), 16);
            m[i] = (quill_matrix){w[i], rb[i], rows[i], joined[i]};
        }
        void *scratch = test_guarded(k->matmul_scratch(cols, 40), 64);
        bool ok = true;
        for (int c = 0; c < 3 && ok; c++)
            for (int p = 0; p < 2 && ok; p++) {
                for (int i = 0; i < 3; i++) {
                    amx_product(k, type, w[i], rb[i], rows[i], cols, x, n_toks[c], alone[i], p ? pool : NULL);
                    memset(joined[i], 0xFF, (size_t)(n_toks[c] * rows[i]) * sizeof(float));
                }
                k->matmul[type](m, 3, cols, x, n_toks[c], p ? pool : NULL, scratch);
                for (int i = 0; i < 3 && ok; i++) {
                    ok = memcmp(alone[i], joined[i], (size_t)(n_toks[c] * rows[i]) * sizeof(float)) == 0;
                    if (!ok)
                        test_fail(__FILE__, __LINE__, "%s: matrix %d of 3 joined, %d tokens, %s: not its bits alone",
                                  quill_type_traits_of(type)->name, i, n_toks[c], p ? "2 threads" : "no pool");
                }
            }
        for (int i = 0; i < 3; i++) test_guarded_free(w[i]), test_guarded_free(alone[i]), test_guarded_free(joined[i]);
        test_guarded_free(x);
        test_guarded_free(scratch);
        if (!ok) break;
    }
    quill_pool_free(pool);
}

ON_EXACT_SETS(joined_matrices)

TEST(kernels_amx_selected_by_default) {
    const quill_kernels *k = set_or_skip("amx");
    if (!k) return;
    CHECK(quill_kernels_best() == k, "AMX is the default where the CPU has it");
    /* non-AMX types and the f32 path stay on the AVX-512 kernels */
    const quill_kernels *avx512 = quill_kernels_for("avx512");
    CHECK(avx512 != NULL, "a CPU with AMX offers the avx512 set");
    CHECK(k->matmul[QUILL_TYPE_F16] == avx512->matmul[QUILL_TYPE_F16] && k->matmul[QUILL_TYPE_F32] == avx512->matmul[QUILL_TYPE_F32] &&
              k->matmul[QUILL_TYPE_BF16] == avx512->matmul[QUILL_TYPE_BF16],
          "float types keep the avx512 set's f32 products");
    CHECK(k->dot == avx512->dot, "AVX-512 dot");
    CHECK(k->matmul[QUILL_TYPE_Q4_0] != avx512->matmul[QUILL_TYPE_Q4_0] && k->matmul_scratch != avx512->matmul_scratch,
          "the tile products replace the AVX-512 set's (AVX2) ones, with their own scratch");
}

TEST(kernels_vnni_offered_after_amx) {
    const quill_kernels *k = set_or_skip("vnni");
    if (!k) return;
    CHECK(quill_kernels_best() == (quill_kernels_for("amx") ? quill_kernels_for("amx") : k), "default: amx, else vnni");
    CHECK(k->matmul[QUILL_TYPE_F16] == quill_kernels_for("avx512")->matmul[QUILL_TYPE_F16] &&
              k->matmul[QUILL_TYPE_F32] == quill_kernels_for("avx512")->matmul[QUILL_TYPE_F32],
          "float types keep the avx512 set's f32 products");
    CHECK(k->matmul[QUILL_TYPE_Q4_0] != NULL && k->matmul[QUILL_TYPE_Q6_K] != NULL, "quantized products");
    CHECK(k->dot == quill_kernels_for("avx512")->dot, "the avx512 set's f32 kernels");
}

static void exact_products_registered(const quill_kernels *k) {
    CHECK(k->matmul_scratch != NULL, "a set with products sizes their scratch");
    for (size_t ti = 0; ti < N_TYPES; ti++)
        CHECK(k->matmul[amx_types[ti]] != NULL, "a product for %s", quill_type_traits_of(amx_types[ti])->name);
    for (uint32_t type = 0; type < QUILL_TYPE_COUNT; type++)
        if (!quill_exact_supported(type) && type != QUILL_TYPE_F32 && type != QUILL_TYPE_F16 && type != QUILL_TYPE_BF16)
            CHECK(k->matmul[type] == NULL, "%s has no exact product, yet the %s set has one",
                  quill_type_traits_of(type) ? quill_type_traits_of(type)->name : "?", k->isa);
}

ON_EXACT_SETS(exact_products_registered)

/* The per-type facts (kernels_exact.h) agree with the type table, and the types without exact
 * products have none: no fact silently borrowed from another type. */
TEST(kernels_exact_type_facts) {
    for (uint32_t type = 0; type < QUILL_TYPE_COUNT; type++) {
        const quill_type_traits *tr = quill_type_traits_of(type);
        bool listed = false;
        for (size_t ti = 0; ti < N_TYPES; ti++) listed |= amx_types[ti] == type;
        CHECK(quill_exact_supported(type) == listed, "type %u: exact products %s", type, listed ? "missing" : "unexpected");
        if (!listed) continue;
        const exact_type *et = &exact_types[type];
        CHECK(tr && et->block_elems == (int)tr->block_size && et->block_bytes == (int)tr->type_size,
              "%s: block of %d elements in %d bytes, the type table says %d in %d", tr ? tr->name : "?", et->block_elems,
              et->block_bytes, tr ? (int)tr->block_size : 0, tr ? (int)tr->type_size : 0);
        CHECK(et->act_max == act_cap(type), "%s: act_max %d", tr->name, et->act_max);
        const bool slots_fit = et->block_elems % et->slot_width == 0 && et->slot_width % 16 == 0;
        CHECK(slots_fit, "%s: sub-blocks of %d", tr->name, et->slot_width);
    }
    CHECK(!quill_exact_supported(QUILL_TYPE_COUNT), "out of range");
    float x[32] = {1}, y = 7;
    uint16_t row[32] = {0};
    CHECK(!quill_exact_matmul_model(QUILL_TYPE_F16, row, sizeof row, 1, 32, x, 1, &y) && y == 7,
          "the model refuses a type without exact products");
}

/* ---------------------------------------------------------------- the load-time layout */

/* A matrix packed by the set's pack(), in two calls (tiles split at `split`) as the model's pool
 * may split it; NULL when the set does not pack the type. */
static uint8_t *packed_copy(const quill_kernels *k, uint32_t type, const uint8_t *w, size_t rb, int64_t rows,
                            int64_t cols) {
    const size_t bytes = k->pack_bytes(type, rows, cols);
    if (!bytes) return NULL;
    uint8_t *p = test_guarded(bytes, 64);
    memset(p, 0xA5, bytes); /* pack must write every byte it owns: padding included */
    const int64_t tiles = (rows + QUILL_PACK_ROWS - 1) / QUILL_PACK_ROWS, split = tiles / 2;
    k->pack(type, w, rb, rows, cols, p, 0, split);
    k->pack(type, w, rb, rows, cols, p, split, tiles);
    return p;
}

/* Packed products give the scalar model's bits: row counts below, at and past a tile, a single row,
 * several of q4_0's groups of 4 tiles with a short last one (150 rows: 4 + 4 + 2 tiles, packed in
 * two calls that split a group),
 * columns of one block, of a short last chunk and of several chunks, decoding and batches (past
 * the 256 tokens of a pass), with and without a pool; and three packed matrices in one call give
 * each its bits alone. */
static void packed_products(const quill_kernels *k) {
    if (!k->packed_layout) {
        test_skip("this set reads the file's layout only");
        return;
    }
    quill_pool *pool = quill_pool_new(2);
    const int64_t rows_list[] = {37, 16, 1, 50, 150};
    /* (under the sanitizers, whose run is the suite's longest lane, and in the aarch64 build, which
     * runs under emulation (make cross-test), the counts at the loops' edges: one token, a pair,
     * one short of a group of 8 and one past it, past 16, past a pass's 64 and 256) */
    static const int all_toks[] = {1, 2, 3, 4, 7, 8, 9, 16, 17, 70, 257}, edge_toks[] = {1, 2, 7, 9, 17, 257};
#if defined(__aarch64__)
    const bool edges_only = true;
#else
    const bool edges_only = TEST_SANITIZED;
#endif
    const int *toks = edges_only ? edge_toks : all_toks;
    const size_t n_toks = edges_only ? sizeof edge_toks / sizeof edge_toks[0] : sizeof all_toks / sizeof all_toks[0];
    int packed_types = 0;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t type = amx_types[ti];
        const char *name = quill_type_traits_of(type)->name;
        size_t rb;
        uint8_t *probe = random_matrix(type, 1, 256, &rb);
        uint8_t *pp = packed_copy(k, type, probe, rb, 1, 256);
        test_guarded_free(probe);
        if (!pp) {
            CHECK(k->matmul_packed[type] == NULL, "%s: a packed product without a layout", name);
            continue;
        }
        test_guarded_free(pp);
        packed_types++;
        CHECK(k->matmul_packed[type] != NULL, "%s is packed but has no packed product", name);
        CHECK(k->pack_bytes(type, 16, block_elems(type) + 16) == 0, "%s: a partial block must not pack", name);
        const int64_t cols_list[] = {block_elems(type), cols_for(type), block_elems(type) == 256 ? 2048 : 2080};
        bool ok = true;
        for (size_t ri = 0; ri < sizeof rows_list / sizeof rows_list[0] && ok; ri++)
            for (size_t ci = 0; ci < 3 && ok; ci++) {
                const int64_t rows = rows_list[ri], cols = cols_list[ci];
                uint8_t *w = random_matrix(type, rows, cols, &rb);
                uint8_t *p = packed_copy(k, type, w, rb, rows, cols);
                void *scratch = test_guarded(k->matmul_scratch(cols, 257), 64);
                for (size_t ni = 0; ni < n_toks && ok; ni++) {
                    const int nt = toks[ni];
                    if (nt > 7 && (cols > 1000 || rows == 1)) continue; /* the long batches on the small shapes */
                    float *x = random_acts(nt, cols), *want = test_guarded((size_t)nt * rows * sizeof *want, 16),
                          *y = test_guarded((size_t)nt * rows * sizeof *y, 16);
                    CHECK(quill_exact_matmul_model(type, w, rb, rows, cols, x, nt, want), "the model runs");
                    for (int pl = 0; pl < 2 && ok; pl++) {
                        memset(y, 0xFF, (size_t)nt * rows * sizeof *y);
                        const quill_matrix m = {p, rb, rows, y};
                        k->matmul_packed[type](&m, 1, cols, x, nt, pl ? pool : NULL, scratch);
                        ok = memcmp(y, want, (size_t)nt * rows * sizeof *y) == 0;
                        if (!ok)
                            test_fail(__FILE__, __LINE__, "%s packed, %lld x %lld, %d tokens, %s: not the model's bits",
                                      name, (long long)rows, (long long)cols, nt, pl ? "2 threads" : "no pool");
                    }
                    test_guarded_free(x); test_guarded_free(want); test_guarded_free(y);
                }
                test_guarded_free(scratch); test_guarded_free(w); test_guarded_free(p);
            }
        /* joined: q, k and v of one input */
        const int64_t jr[3] = {37, 16, 5}, cols = cols_for(type);
        uint8_t *w[3], *p[3];
        size_t jrb[3];
        float *alone[3], *joined[3];
        quill_matrix m[3];
        float *x = random_acts(3, cols);
        void *scratch = test_guarded(k->matmul_scratch(cols, 3), 64);
        for (int i = 0; i < 3; i++) {
            w[i] = random_matrix(type, jr[i], cols, &jrb[i]);
            p[i] = packed_copy(k, type, w[i], jrb[i], jr[i], cols);
            alone[i] = test_guarded((size_t)(3 * jr[i]) * sizeof(float), 16);
            joined[i] = test_guarded((size_t)(3 * jr[i]) * sizeof(float), 16);
            m[i] = (quill_matrix){p[i], jrb[i], jr[i], joined[i]};
        }
        for (int nt = 1; nt <= 3 && ok; nt += 2) {
            for (int i = 0; i < 3; i++) {
                const quill_matrix one = {p[i], jrb[i], jr[i], alone[i]};
                k->matmul_packed[type](&one, 1, cols, x, nt, pool, scratch);
            }
            k->matmul_packed[type](m, 3, cols, x, nt, pool, scratch);
            for (int i = 0; i < 3 && ok; i++) {
                ok = memcmp(alone[i], joined[i], (size_t)(nt * jr[i]) * sizeof(float)) == 0;
                if (!ok) test_fail(__FILE__, __LINE__, "%s packed: matrix %d of 3 joined, %d tokens: not its bits alone", name, i, nt);
            }
        }
        for (int i = 0; i < 3; i++) {
            test_guarded_free(w[i]); test_guarded_free(p[i]);
            test_guarded_free(alone[i]); test_guarded_free(joined[i]);
        }
        test_guarded_free(x);
        test_guarded_free(scratch);
    }
    CHECK(packed_types >= 5, "the %s set packs %d types; q4_0, q8_0, q4_K, q5_K and q6_K expected", k->isa, packed_types);
    quill_pool_free(pool);
}

TEST(kernels_vnni_packed_products) {
    const quill_kernels *k = set_or_skip("vnni");
    if (k) packed_products(k);
}

/* The avx2 and avxvnni sets read the vnni set's layout as two halves of 8 rows per tile. */
TEST(kernels_avx2_packed_products) {
    const quill_kernels *k = set_or_skip("avx2");
    if (k) packed_products(k);
}

TEST(kernels_avxvnni_packed_products) {
    const quill_kernels *k = set_or_skip("avxvnni");
    if (k) packed_products(k);
}

/* The aarch64 sets read the same layout as quads of 4 rows (arm/packed_neon.h); make cross-test
 * runs these under qemu. */
TEST(kernels_dotprod_packed_products) {
    const quill_kernels *k = set_or_skip("dotprod");
    if (k) packed_products(k);
}

TEST(kernels_i8mm_packed_products) {
    const quill_kernels *k = set_or_skip("i8mm");
    if (k) packed_products(k);
}
