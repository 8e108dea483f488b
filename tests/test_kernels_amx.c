/* The AMX matrix products (kernels_amx.c): exact weight unpacking, accuracy against a double
 * product, and bitwise batch and thread invariance. Skipped on CPUs without AMX. */
#include "test.h"

#include "kernels.h"
#include "kernels_amx.h"
#include "threadpool.h"
#include "types_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng_state = 0x243F6A8885A308D3ull;
static uint32_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 16);
}
static float rndf(void) { return (float)((double)rnd() / 4294967296.0 * 2.0 - 1.0); }

static const uint32_t amx_types[] = {QUILL_TYPE_Q4_0, QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_K, QUILL_TYPE_Q6_K};
#define N_TYPES (sizeof amx_types / sizeof amx_types[0])

/* Random valid rows: random bytes, then a finite moderate half scale (and min) in every block. */
static uint8_t *random_matrix(uint32_t type, int64_t rows, int64_t cols, size_t *row_bytes) {
    const quill_type_traits *tr = quill_type_traits_of(type);
    *row_bytes = quill_row_size(type, cols);
    size_t bytes = *row_bytes * (size_t)rows;
    uint8_t *w = malloc(bytes);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rnd();
    for (size_t b = 0; b < bytes / tr->type_size; b++) {
        uint8_t *blk = w + b * tr->type_size;
        uint16_t h1 = quill_f32_to_f16(rndf() * 0.05f), h2 = quill_f32_to_f16(rndf() * 0.05f);
        switch (type) {
        case QUILL_TYPE_Q4_0: case QUILL_TYPE_Q8_0: memcpy(blk, &h1, 2); break;
        case QUILL_TYPE_Q4_K: memcpy(blk, &h1, 2); memcpy(blk + 2, &h2, 2); break;
        case QUILL_TYPE_Q6_K: memcpy(blk + 208, &h1, 2); break;
        default: break;
        }
    }
    return w;
}

static float *random_acts(int n_tok, int64_t cols) {
    float *x = malloc((size_t)n_tok * (size_t)cols * sizeof *x);
    /* activations of varied magnitude, as after a norm with some large channels */
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = rndf() * (rnd() % 16 == 0 ? 20.0f : 1.0f);
    return x;
}

static int64_t cols_for(uint32_t type) { return quill_type_traits_of(type)->block_size == 256 ? 768 : 224; }

static const quill_kernels *amx_or_skip(void) {
    const quill_kernels *k = quill_kernels_amx();
    if (!k) test_skip("this CPU (or kernel) does not offer AMX");
    return k;
}

TEST(kernels_amx_unpack_bit_identical_to_to_float) {
    if (!amx_or_skip()) return;
    {
        uint32_t type = QUILL_TYPE_Q6_K;
        int64_t n = cols_for(type);
        size_t rb;
        uint8_t *row = random_matrix(type, 1, n, &rb);
        float *a = malloc((size_t)n * sizeof *a), *b = malloc((size_t)n * sizeof *b);
        quill_type_traits_of(type)->to_float(row, a, n);
        quill_amx_unpack_row(type, row, b, n);
        bool same = memcmp(a, b, (size_t)n * sizeof *a) == 0;
        free(row); free(a); free(b);
        CHECK(same, "AMX unpacking of %s differs from to_float", quill_type_traits_of(type)->name);
    }
}

/* x = hi + lo + e with hi its top 8 significant bits (|x - hi| < 2^-7 |x|) and lo = x - hi rounded
 * to bf16, so |e| < 2^-8 · 2^-7 |x| = 2^-15 |x|. q4_0 / q8_0 / q4_K codes are exact, so each product
 * errs by < 2^-15 |w x|; q6_K weights are split too and lo(w)·lo(x) (< 2^-14 |w x|) is dropped, in
 * all < 2^-13 |w x|. With the f32 sums (~cols · 2^-24 of Σ|w x|), 2^-12 Σ|w x| bounds every dot
 * product; the typical (rms) error is far smaller and is checked against 2^-16. */
TEST(kernels_amx_matmul_matches_double_product) {
    const quill_kernels *k = amx_or_skip();
    if (!k) return;
    quill_pool *pool = quill_pool_new(2);
    const int64_t rows = 37; /* not a multiple of the 16-row tiles */
    const int toks[] = {1, 3, 16, 17, 64, 70};
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        const int64_t cols = cols_for(type);
        CHECK(k->matmul[type] != NULL, "no AMX product for %s", quill_type_traits_of(type)->name);
        size_t rb;
        uint8_t *w = random_matrix(type, rows, cols, &rb);
        float *wf = malloc((size_t)(rows * cols) * sizeof *wf);
        for (int64_t r = 0; r < rows; r++) quill_type_traits_of(type)->to_float(w + r * rb, wf + r * cols, cols);
        for (size_t ni = 0; ni < sizeof toks / sizeof toks[0]; ni++) {
            int nt = toks[ni];
            float *x = random_acts(nt, cols), *y = malloc((size_t)nt * rows * sizeof *y);
            k->matmul[type](w, rb, rows, cols, x, nt, y, pool);
            double worst = 0, sq = 0;
            for (int t = 0; t < nt; t++)
                for (int64_t r = 0; r < rows; r++) {
                    double exact = 0, mag = 0;
                    for (int64_t i = 0; i < cols; i++) {
                        exact += (double)wf[r * cols + i] * x[t * cols + i];
                        mag += fabs((double)wf[r * cols + i] * x[t * cols + i]);
                    }
                    double e = fabs(y[t * rows + r] - exact) / (mag + 1e-30);
                    if (e > worst) worst = e;
                    sq += e * e;
                }
            double rms = sqrt(sq / (nt * rows));
            free(x); free(y);
            if (worst > 0x1p-12 || rms > 0x1p-16) {
                test_fail(__FILE__, __LINE__, "%s nt=%d: error %.3g (rms %.3g) of Σ|w·x|",
                          quill_type_traits_of(type)->name, nt, worst, rms);
                break;
            }
        }
        free(w); free(wf);
    }
    quill_pool_free(pool);
}

/* Token t alone (as when decoding) gives the bits it gets inside any batch of 1..70 tokens, for
 * 1, 2 or 3 threads, and on the path that packs activations tile by tile. */
TEST(kernels_amx_batch_and_thread_invariance) {
    const quill_kernels *k = amx_or_skip();
    if (!k) return;
    quill_pool *pools[3] = {quill_pool_new(1), quill_pool_new(2), quill_pool_new(3)};
    const int64_t rows = 45, max_tok = 70;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        uint32_t type = amx_types[ti];
        const char *name = quill_type_traits_of(type)->name;
        const int64_t cols = cols_for(type);
        size_t rb;
        uint8_t *w = random_matrix(type, rows, cols, &rb);
        float *x = random_acts((int)max_tok, cols);
        float *alone = malloc((size_t)(max_tok * rows) * sizeof *alone);
        float *batch = malloc((size_t)(max_tok * rows) * sizeof *batch);
        for (int64_t t = 0; t < max_tok; t++) k->matmul[type](w, rb, rows, cols, x + t * cols, 1, alone + t * rows, NULL);
        bool ok = true;
        for (int nt = 1; nt <= max_tok && ok; nt++) {
            for (int p = 0; p < 3 && ok; p++) {
                /* every batch size with 2 threads, a spread of them with 1 and 3 */
                if (p != 1 && nt % 7 != 0 && nt != 1 && nt != max_tok) continue;
                for (int unpacked = 0; unpacked < 2 && ok; unpacked++) {
                    if (unpacked && nt % 11 != 0 && nt != max_tok) continue;
                    int64_t off = max_tok - nt; /* the last nt tokens */
                    quill_amx_test_unpacked = unpacked;
                    k->matmul[type](w, rb, rows, cols, x + off * cols, nt, batch, pools[p]);
                    quill_amx_test_unpacked = 0;
                    ok = memcmp(batch, alone + off * rows, (size_t)nt * rows * sizeof *batch) == 0;
                    if (!ok)
                        test_fail(__FILE__, __LINE__, "%s: batch of %d tokens on %d threads%s differs from "
                                  "tokens alone", name, nt, p + 1, unpacked ? " (unpacked path)" : "");
                }
            }
        }
        free(w); free(x); free(alone); free(batch);
        if (!ok) break;
    }
    for (int p = 0; p < 3; p++) quill_pool_free(pools[p]);
}

TEST(kernels_amx_selected_and_forced_off) {
    const quill_kernels *k = amx_or_skip();
    if (!k) return;
    CHECK(strcmp(k->isa, "amx") == 0, "isa %s", k->isa);
    CHECK(quill_kernels_for("amx") == k, "quill_kernels_for(\"amx\")");
    /* non-AMX types and the f32 path stay on the AVX-512 kernels */
    CHECK(k->matmul[QUILL_TYPE_F16] == NULL && k->matmul[QUILL_TYPE_F32] == NULL && k->matmul[QUILL_TYPE_BF16] == NULL,
          "float types must keep the exact f32 path");
    CHECK(k->dot == quill_kernels_avx512_table.dot, "AVX-512 dot");
    CHECK(quill_kernels_avx512_table.matmul[QUILL_TYPE_Q4_0] == NULL, "the AVX-512 table has no AMX entries");
}
