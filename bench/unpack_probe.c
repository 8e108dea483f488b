/* What one set's one-token product of a type costs a core, for the types the unpacking kernels
 * (src/kernels/exact_unpacked.h) run from the file's rows: ROWS x COLS random valid blocks (random
 * bytes, a 0.01 half scale), small enough to stay in the caches, so that the unpacking and the
 * products, not the memory, are timed.
 *
 *   build/unpack_probe SET TYPE ROWS COLS [SECONDS]        e.g. vnni iq2_xxs 2048 768 0.5
 *
 * prints the products per CPU second (process CPU time: the machine is shared). Two builds are
 * compared by running their probes alternately (bench/README.md). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/kernels.h"
#include "quill.h"

static double clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: %s SET TYPE ROWS COLS [SECONDS]\n", argv[0]);
        return 2;
    }
    uint32_t type = QUILL_TYPE_COUNT;
    for (uint32_t t = 0; t < QUILL_TYPE_COUNT; t++)
        if (quill_type_name(t) && strcmp(quill_type_name(t), argv[2]) == 0) type = t;
    const int64_t rows = atoll(argv[3]), cols = atoll(argv[4]);
    const double seconds = argc > 5 ? atof(argv[5]) : 1.0;
    const quill_kernels *k = quill_kernels_for(argv[1]);
    if (!k || type == QUILL_TYPE_COUNT || !k->matmul[type] || rows < 1 || cols < 1 ||
        cols % quill_type_traits_of(type)->block_size) {
        fprintf(stderr, "unpack_probe: no %s product of %s for %s x %s here\n", argv[1], argv[2], argv[3], argv[4]);
        return 1;
    }
    const quill_type_traits *tr = quill_type_traits_of(type);
    const size_t row_bytes = quill_row_size(type, cols), bytes = row_bytes * (size_t)rows;
    uint8_t *w = malloc(bytes);
    float *x = aligned_alloc(64, (size_t)cols * sizeof *x), *y = aligned_alloc(64, (size_t)rows * sizeof *y + 64);
    void *scratch = aligned_alloc(64, (k->matmul_scratch(cols, 1) + 63) / 64 * 64);
    srand(1);
    for (size_t i = 0; i < bytes; i++) w[i] = (uint8_t)rand();
    const uint16_t h = quill_f32_to_f16(0.01f);
    for (size_t b = 0; b < bytes / tr->type_size; b++) {
        uint8_t *blk = w + b * tr->type_size;
        if (type == QUILL_TYPE_TQ1_0 || type == QUILL_TYPE_TQ2_0) memcpy(blk + tr->type_size - 2, &h, 2);
        else if (type == QUILL_TYPE_IQ1_M) /* the half's nibbles top the four scale words */
            for (int q = 0; q < 4; q++) blk[48 + 2 * q + 1] = (uint8_t)((blk[48 + 2 * q + 1] & 0xF) | ((h >> (4 * q)) & 0xF) << 4);
        else if (type == QUILL_TYPE_MXFP4) blk[0] = 120;
        else memcpy(blk, &h, 2);
    }
    for (int64_t i = 0; i < cols; i++) x[i] = (float)rand() / (float)RAND_MAX - 0.5f;
    quill_matrix m = {w, row_bytes, rows, y};
    long n = 0;
    const double t0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    while (clock_s(CLOCK_MONOTONIC) - t0 < seconds) {
        k->matmul[type](&m, 1, cols, x, 1, NULL, scratch);
        n++;
    }
    const double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
    printf("%s %s %lld x %lld, 1 token: %.1f products per CPU second (%.1f us each)\n", argv[1], argv[2],
           (long long)rows, (long long)cols, (double)n / cpu, cpu / (double)n * 1e6);
    free(w);
    free(x);
    free(y);
    free(scratch);
    return 0;
}
