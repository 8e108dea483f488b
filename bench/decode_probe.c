/* How fast the vnni set's one-token product reads a packed matrix, apart from the model: a core's
 * arithmetic (a matrix that stays in the caches) against its memory (one that does not).
 *
 *   build/decode_probe TYPE ROWS COLS [THREADS [SECONDS]]      e.g. q4_0 64 2048 1
 *
 * prints the packed bytes read per second. Several matrices of ROWS x COLS are cycled through so
 * that the total exceeds the caches when ROWS x COLS x n is large; with a small matrix, n is 1. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "base/threadpool.h"
#include "kernels/kernels.h"
#include "quill.h"

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
    const quill_kernels *k = quill_kernels_for("vnni");
    if (type == QUILL_TYPE_COUNT || !k || !k->pack_bytes || !k->pack_bytes(type, rows, cols) || copies < 1) {
        fprintf(stderr, "decode_probe: no packed vnni product for %s here\n", argv[1]);
        return 1;
    }
    const size_t row_bytes = quill_row_size(type, cols), pb = k->pack_bytes(type, rows, cols);
    float *src = malloc((size_t)(rows * cols) * sizeof *src);
    void *file = malloc(row_bytes * (size_t)rows);
    uint8_t *packed = aligned_alloc(2 << 20, (pb * (size_t)copies + (2 << 20) - 1) / (2 << 20) * (2 << 20));
    madvise(packed, (pb * (size_t)copies + (2 << 20) - 1) / (2 << 20) * (2 << 20), MADV_HUGEPAGE); /* as the model's copy */
    float *x = aligned_alloc(64, (size_t)cols * sizeof *x), *y = aligned_alloc(64, (size_t)rows * sizeof *y + 64);
    void *scratch = aligned_alloc(64, (k->matmul_scratch(cols, 1) + 63) / 64 * 64);
    srand(1);
    for (int64_t i = 0; i < rows * cols; i++) src[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    for (int64_t i = 0; i < cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    quill_error err = {0};
    if (quill_quantize_rows(type, src, file, rows, cols, &err) != QUILL_OK) return 1;
    for (int c = 0; c < copies; c++)
        k->pack(type, file, row_bytes, rows, cols, packed + (size_t)c * pb, 0, (rows + 15) / 16);
    quill_pool *pool = threads > 1 ? quill_pool_new(threads) : NULL;
    double t0 = now_s(), t = t0;
    long n = 0;
    while (t - t0 < seconds) {
        for (int c = 0; c < copies; c++) {
            quill_matrix m = {packed + (size_t)c * pb, row_bytes, rows, y};
            k->matmul_packed[type](&m, 1, cols, x, 1, pool, scratch);
        }
        n += copies;
        t = now_s();
    }
    printf("%s %lld x %lld, %d thread(s), %d copies (%.1f MiB): %.2f GB/s of packed weights, %.1f us per product\n",
           argv[1], (long long)rows, (long long)cols, threads, copies, (double)(pb * (size_t)copies) / 1048576.0,
           (double)pb * (double)n / (t - t0) / 1e9, (t - t0) / (double)n * 1e6);
    quill_pool_free(pool);
    return 0;
}
