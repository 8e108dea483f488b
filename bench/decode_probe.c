/* How fast the vnni set's one-token product reads a packed matrix, apart from the model: a core's
 * arithmetic (a matrix that stays in the caches) against its memory (one that does not).
 *
 *   build/decode_probe TYPE ROWS COLS [THREADS [SECONDS [COPIES]]]      e.g. q4_0 64 2048 1
 *
 * prints the packed bytes read per second (QUILL_ISA: another set that reads the layout, avx2 or
 * avxvnni; QUILL_REPACK=0: that set's product from the file's rows instead; TOKENS=n: n tokens
 * per product, a batch, instead of 1). COPIES matrices of ROWS x COLS are cycled through, so
 * that the total exceeds the caches when it is large (~1 GB).
 *
 * When the copies total 256 MiB or more, passes over all of them alternate with passes of a plain
 * read of the same bytes, the way `quill bench` measures the bandwidth (AVX2 loads summed,
 * contiguous shares, the same threads). These machines' bandwidth moves by 2x within minutes, so
 * a product's speed alone says little; its ratio to a read of the same memory milliseconds apart
 * does (the median over the pass pairs, with its quartiles). */
#define _GNU_SOURCE
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../cli/plain_read.h"
#include "base/threadpool.h"
#include "kernels/kernels.h"
#include "quill.h"

/* The plain read: items of READ_ITEM bytes of `bytes`, summed as 64-bit words. */
#define READ_ITEM ((size_t)64 << 10)
#define FROM_MEMORY ((size_t)256 << 20)
#define MAX_PAIRS 4096
typedef struct {
    const uint8_t *bytes;
    volatile uint64_t sums[64];
} read_job;

static void read_items(void *arg, int64_t i0, int64_t i1, int thread) {
    read_job *r = arg;
    const uint64_t *words = (const uint64_t *)(r->bytes + (size_t)i0 * READ_ITEM);
    const size_t n = (size_t)(i1 - i0) * READ_ITEM / 8;
#ifdef PLAIN_READ_HAVE_AVX2
    r->sums[thread & 63] += plain_read_avx2(words, n);
#else
    r->sums[thread & 63] += plain_read_scalar(words, n);
#endif
}

static int by_value(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s TYPE ROWS COLS [THREADS [SECONDS [COPIES]]]\n", argv[0]);
        return 2;
    }
    uint32_t type = QUILL_TYPE_COUNT;
    for (uint32_t t = 0; t < QUILL_TYPE_COUNT; t++)
        if (quill_type_name(t) && strcmp(quill_type_name(t), argv[1]) == 0) type = t;
    const int64_t rows = atoll(argv[2]), cols = atoll(argv[3]);
    const int threads = argc > 4 ? atoi(argv[4]) : 1;
    const double seconds = argc > 5 ? atof(argv[5]) : 2.0;
    int copies = argc > 6 ? atoi(argv[6]) : 1;
    const char *isa = getenv("QUILL_ISA") && *getenv("QUILL_ISA") ? getenv("QUILL_ISA") : "vnni";
    const quill_kernels *k = quill_kernels_for(isa);
    if (type == QUILL_TYPE_COUNT || !k || !k->pack_bytes || !k->pack_bytes(type, rows, cols) || copies < 1) {
        fprintf(stderr, "decode_probe: no packed %s product for %s here\n", isa, argv[1]);
        return 1;
    }
    const size_t row_bytes = quill_row_size(type, cols), pb = k->pack_bytes(type, rows, cols);
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    void *file = malloc(row_bytes * (size_t)rows);
    uint8_t *packed = aligned_alloc(2 << 20, (pb * (size_t)copies + (2 << 20) - 1) / (2 << 20) * (2 << 20));
    madvise(packed, (pb * (size_t)copies + (2 << 20) - 1) / (2 << 20) * (2 << 20), MADV_HUGEPAGE); /* as the model's copy */
    const int n_tok = getenv("TOKENS") ? atoi(getenv("TOKENS")) : 1;
    const bool from_file = getenv("QUILL_REPACK") && !strcmp(getenv("QUILL_REPACK"), "0");
    if (n_tok < 1) return 2;
    float *x = aligned_alloc(64, (size_t)n_tok * (size_t)cols * sizeof *x);
    float *y = aligned_alloc(64, (size_t)n_tok * (size_t)rows * sizeof *y + 64);
    void *scratch = aligned_alloc(64, (k->matmul_scratch(cols, n_tok) + 63) / 64 * 64);
    srand(1);
    for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    quill_error err = {0};
    if (quill_quantize_rows(type, src, file, rows, cols, &err) != QUILL_OK) return 1;
    for (int c = 0; c < copies; c++)
        k->pack(type, file, row_bytes, rows, cols, packed + (size_t)c * pb, 0, (rows + 15) / 16);
    quill_pool *pool = threads > 1 ? quill_pool_new(threads) : NULL;
    const size_t total = pb * (size_t)copies;
    /* below this the copies stay partly in the last-level cache, and a plain read of them says
     * nothing about memory: the products then run back to back */
    const bool from_memory = total >= FROM_MEMORY;
    read_job reader = {.bytes = packed};
    double *product_gbs = calloc(MAX_PAIRS, sizeof *product_gbs), *read_gbs = calloc(MAX_PAIRS, sizeof *read_gbs),
           *ratio = calloc(MAX_PAIRS, sizeof *ratio);
    long n = 0, pairs = 0;
    double t0 = now_s(), t = t0, in_products = 0;
    while (t - t0 < seconds) {
        const double p0 = now_s();
        for (int c = 0; c < copies; c++) {
            quill_matrix m = {from_file ? file : packed + (size_t)c * pb, row_bytes, rows, y};
            (from_file ? k->matmul : k->matmul_packed)[type](&m, 1, cols, x, n_tok, pool, scratch);
        }
        const double p1 = now_s();
        n += copies;
        in_products += p1 - p0;
        if (from_memory) {
            quill_pool_run(pool, read_items, &reader, (int64_t)(total / READ_ITEM), 16);
            const double p2 = now_s();
            const int at = (int)(pairs++ % MAX_PAIRS); /* the last MAX_PAIRS pairs */
            product_gbs[at] = (double)total / (p1 - p0) / 1e9;
            read_gbs[at] = (double)(total / READ_ITEM * READ_ITEM) / (p2 - p1) / 1e9;
            ratio[at] = product_gbs[at] / read_gbs[at];
        }
        t = now_s();
    }
    printf("%s %lld x %lld, %d thread(s), %d copies (%.1f MiB): %.2f GB/s of packed weights, %.1f us per product\n",
           argv[1], (long long)rows, (long long)cols, threads, copies, (double)total / 1048576.0,
           (double)pb * (double)n / in_products / 1e9, in_products / (double)n * 1e6);
    if (pairs) {
        const size_t kept = pairs < MAX_PAIRS ? (size_t)pairs : MAX_PAIRS;
        qsort(product_gbs, kept, sizeof(double), by_value);
        qsort(read_gbs, kept, sizeof(double), by_value);
        qsort(ratio, kept, sizeof(double), by_value);
        printf("%zu pass pairs, medians: product %.2f GB/s, plain read of the same bytes %.2f GB/s; "
               "product / read %.3f (quartiles %.3f-%.3f)\n",
               kept, product_gbs[kept / 2], read_gbs[kept / 2], ratio[kept / 2], ratio[kept / 4], ratio[3 * kept / 4]);
    }
    free(product_gbs);
    free(read_gbs);
    free(ratio);
    quill_pool_free(pool);
    return 0;
}
