/* What the tile unit of this machine costs, measured apart from quill's kernels.
 *
 * The prompt loop (src/kernels/x86/kernels_amx.c) pays, per 16 × 16 × 32 bf16 product, one tile load of the
 * activations, a share of a weight-tile load, one tile store (every 32-column sub-block has its
 * own scale, so its sums must leave the tile) and ~48 vector instructions that scale the stored
 * sums. This probe times those pieces alone and together, so that a change to the loop can be
 * judged against what the hardware allows:
 *
 *   product        tdpbf16ps into 4 rotating sums, operands already in tiles
 *   + loads        the same with one activation tile (1 KiB) loaded per product, from L1 or L2
 *   + store        the same with the sums stored after every product
 *   vector         48 independent FMAs (12 chains), alone and between products
 *   shuffles       48 permutes (port 5 only), alone and between products
 *
 * Times are the best of REPS rounds (each round runs every measurement once), in ns per product;
 * ratios to the bare product are what carries over between runs on these shared machines, whose
 * speed moves by up to 2x from minute to minute.
 *
 *   make bench-probe && build/amx_probe
 */
/* gcc names the features __AMX_TILE__ / __AMX_BF16__, clang __AMXTILE__ / __AMXBF16__ */
#if defined(__x86_64__) && (defined(__AMX_TILE__) || defined(__AMXTILE__)) && \
    (defined(__AMX_BF16__) || defined(__AMXBF16__)) && defined(__AVX512F__)
#include <cpuid.h>
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define REPS 5
#define N 200000L /* products per timed run */

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static _Alignas(64) uint8_t weights[1024], sums[4][1024];
static uint8_t *acts; /* activation tiles, 1 KiB each */
static volatile float sink_f;
static volatile int sink_i;

/* Two products, into sums c0 and c1 from activation tiles 6 and 7 (loaded from b + off when
 * `load`), then the stores of the other pair's sums, s0 and s1, when `store`. Tile numbers are
 * immediates, hence the macro. */
#define PRODUCT_PAIR(c0, c1, off, s0, s1)                                                            \
    do {                                                                                             \
        if (load) _tile_loadd(6, b + (off), 64);                                                     \
        _tile_zero(c0);                                                                              \
        _tile_dpbf16ps(c0, 4, 6);                                                                    \
        if (load) _tile_loadd(7, b + (off) + 1024, 64);                                              \
        _tile_zero(c1);                                                                              \
        _tile_dpbf16ps(c1, 4, 7);                                                                    \
        if (store) {                                                                                 \
            _tile_stored(s0, sums[s0], 64);                                                          \
            _tile_stored(s1, sums[s1], 64);                                                          \
        }                                                                                            \
    } while (0)

/* Four products per round into sums 0-3, weights in tile 4, activations in tiles 6/7. */
static double products(int load, size_t span, int store) {
    const double t0 = now();
    for (long i = 0; i < N / 4; i++) {
        const uint8_t *b = acts + (size_t)(i * 4096) % span;
        PRODUCT_PAIR(0, 1, 0, 2, 3);
        PRODUCT_PAIR(2, 3, 2048, 0, 1);
    }
    return (now() - t0) / N * 1e9;
}

/* 48 vector instructions per product: 12 independent chains of 4 FMAs (ports 0 and 5), or of 4
 * permutes (port 5), with or without the products between them. The chains are named variables:
 * an array of them went through memory around the barriers. */
#define CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DECLARE_F(k) __m512 f##k = _mm512_set1_ps(1.0f + (float)(k) * 1e-6f);
#define DECLARE_S(k) __m512i s##k = _mm512_set1_epi32(k);
#define STEP_F(k) f##k = _mm512_fmadd_ps(f##k, m, a);
#define STEP_S(k) s##k = _mm512_permutexvar_epi32(idx, s##k);
#define KEEP_F(k) __asm__ volatile("" : "+v"(f##k));
#define KEEP_S(k) __asm__ volatile("" : "+v"(s##k));

/* The timed loop: N rounds of 4 steps of the 12 chains, a product first when with_products. */
#define TIMED_CHAINS(DECLARE, STEP, KEEP)                                                            \
    CHAINS(DECLARE)                                                                                  \
    for (long i = 0; i < N; i++) {                                                                   \
        if (with_products) product_between(i);                                                       \
        for (int j = 0; j < 4; j++) {                                                                \
            CHAINS(STEP)                                                                             \
            CHAINS(KEEP)                                                                             \
        }                                                                                            \
    }

static void product_between(long i) {
    if (i & 1) {
        _tile_zero(1);
        _tile_dpbf16ps(1, 4, 6);
    } else {
        _tile_zero(0);
        _tile_dpbf16ps(0, 4, 6);
    }
}

static double vector_work(int with_products, int shuffles) {
    const __m512 m = _mm512_set1_ps(0.999999f), a = _mm512_set1_ps(1e-7f);
    const __m512i idx = _mm512_set1_epi32(3);
    const double t0 = now();
    if (shuffles) {
        TIMED_CHAINS(DECLARE_S, STEP_S, KEEP_S)
        sink_i = _mm512_reduce_add_epi32(_mm512_add_epi32(s0, s11));
    } else {
        TIMED_CHAINS(DECLARE_F, STEP_F, KEEP_F)
        sink_f = _mm512_reduce_add_ps(_mm512_add_ps(f0, f11));
    }
    return (now() - t0) / N * 1e9;
}

/* 1 when the vector work hides entirely behind the products (or they behind it), 0 when the two
 * only add up, below 0 when together they take longer than the sum. */
static double overlap(double alone, double bare, double together) {
    const double hi = alone > bare ? alone : bare, lo = alone < bare ? alone : bare;
    return 1 - (together - hi) / lo;
}

int main(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 22))) {
        printf("amx_probe: this CPU has no AMX-TILE/AMX-BF16; nothing to measure\n");
        return 0;
    }
    /* Linux hands out the 8 KiB of tile state only on request (ARCH_REQ_XCOMP_PERM, XTILEDATA). */
    if (syscall(SYS_arch_prctl, 0x1023, 18) != 0) {
        printf("amx_probe: the kernel refused the tile state (arch_prctl); nothing to measure\n");
        return 0;
    }
    const size_t l2_span = (size_t)256 << 10;
    acts = aligned_alloc(64, l2_span);
    if (!acts) return 1;
    memset(acts, 0, l2_span);
    tile_config cfg = {.palette = 1};
    for (int i = 0; i < 8; i++) cfg.colsb[i] = 64, cfg.rows[i] = 16;
    _tile_loadconfig(&cfg);
    _tile_loadd(4, weights, 64);
    _tile_loadd(6, acts, 64);
    _tile_loadd(7, acts, 64);
    products(0, 4096, 0); /* the tile unit powers up on first use: not timed */

    /* Every measurement once per round, the best of the rounds kept: each one's samples then span
     * the whole run, so that a slow minute of the machine does not land on one of them alone. */
    enum { BARE, L1, L2, L1S, L2S, FMA, FMA_P, SHF, SHF_P, N_KINDS };
    double best[N_KINDS];
    for (int k = 0; k < N_KINDS; k++) best[k] = 1e30;
    for (int r = 0; r < REPS; r++) {
        const double t[N_KINDS] = {products(0, 4096, 0),     products(1, 16 << 10, 0), products(1, l2_span, 0),
                                   products(1, 16 << 10, 1), products(1, l2_span, 1),  vector_work(0, 0),
                                   vector_work(1, 0),        vector_work(0, 1),        vector_work(1, 1)};
        for (int k = 0; k < N_KINDS; k++)
            if (t[k] < best[k]) best[k] = t[k];
    }
    const double bare = best[BARE], l1 = best[L1], l2 = best[L2], l1s = best[L1S], l2s = best[L2S];
    const double fma = best[FMA], fma_p = best[FMA_P], shf = best[SHF], shf_p = best[SHF_P];
    _tile_release();
    free(acts);

    printf("tile unit, ns per 16x16x32 bf16 product (best of %d rounds), and x the bare product\n", REPS);
    printf("  product                        %7.2f\n", bare);
    printf("  + activation load, from L1     %7.2f  %.2fx\n", l1, l1 / bare);
    printf("  + activation load, from L2     %7.2f  %.2fx\n", l2, l2 / bare);
    printf("  + load (L1) + store of sums    %7.2f  %.2fx\n", l1s, l1s / bare);
    printf("  + load (L2) + store of sums    %7.2f  %.2fx\n", l2s, l2s / bare);
    printf("vector work per product: alone, then between products (overlap: 1 = fully hidden)\n");
    printf("  48 FMAs        %6.2f   with products %6.2f   overlap %.2f\n", fma, fma_p, overlap(fma, bare, fma_p));
    printf("  48 permutes    %6.2f   with products %6.2f   overlap %.2f\n", shf, shf_p, overlap(shf, bare, shf_p));
    return 0;
}
#else
#include <stdio.h>
int main(void) {
    printf("amx_probe: built without AMX support (x86-64 with -mamx-tile -mamx-bf16 -mavx512f needed)\n");
    return 0;
}
#endif
