/* The instructions of one exact product, for the aarch64 sets, which no machine here runs: under
 * qemu-user with bench/qemu_insns.c counting what the guest executes (bench/arm_insns.sh runs it).
 *
 *   insn_probe ISA TYPE ROWS COLS TOKENS REPS rows|packed
 *
 * multiplies a matrix of random blocks REPS times, from the file's rows (`rows`) or from the set's
 * load-time layout (`packed`), one thread. Two runs with different REPS give the instructions of a
 * product as their difference: the setup cancels out. An instruction count is not a speed (it
 * weighs a load like an add and knows no latency), but where one loop needs half the instructions
 * of another for the same products, it is the better guess. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kernels.h"
#include "quill.h"

int main(int argc, char **argv) {
    if (argc != 8) {
        fprintf(stderr, "usage: insn_probe ISA TYPE ROWS COLS TOKENS REPS rows|packed\n");
        return 2;
    }
    uint32_t type = QUILL_TYPE_COUNT;
    for (uint32_t t = 0; t < QUILL_TYPE_COUNT; t++)
        if (quill_type_name(t) && strcmp(quill_type_name(t), argv[2]) == 0) type = t;
    const int64_t rows = atoll(argv[3]), cols = atoll(argv[4]);
    const int n_tok = atoi(argv[5]), reps = atoi(argv[6]);
    const int packed = strcmp(argv[7], "packed") == 0;
    const quill_kernels *k = quill_kernels_for(argv[1]);
    if (!k || type == QUILL_TYPE_COUNT || rows < 1 || cols < 1 || n_tok < 1 || reps < 0) {
        fprintf(stderr, "insn_probe: no %s set here, or a bad argument\n", argv[1]);
        return 2;
    }
    if (packed ? !(k->pack_bytes && k->pack_bytes(type, rows, cols)) : !k->matmul[type]) {
        fprintf(stderr, "insn_probe: the %s set has no %s product of %s\n", argv[1], argv[7], argv[2]);
        return 2;
    }
    const size_t row_bytes = quill_row_size(type, cols), bytes = row_bytes * (size_t)rows;
    uint8_t *file = malloc(bytes);
    srand(7);
    for (size_t i = 0; i < bytes; i++) file[i] = (uint8_t)rand();
    float *x = malloc((size_t)(cols * n_tok) * sizeof *x), *y = malloc((size_t)(rows * n_tok) * sizeof *y);
    for (int64_t i = 0; i < cols * n_tok; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    void *w = file;
    if (packed) {
        const size_t pb = k->pack_bytes(type, rows, cols);
        w = aligned_alloc(64, (pb + 63) / 64 * 64);
        k->pack(type, file, row_bytes, rows, cols, w, 0, (rows + QUILL_PACK_ROWS - 1) / QUILL_PACK_ROWS);
    }
    void *scratch = aligned_alloc(64, (k->matmul_scratch(cols, n_tok) + 63) / 64 * 64);
    const quill_matrix m = {w, row_bytes, rows, y};
    for (int r = 0; r < reps; r++) (packed ? k->matmul_packed : k->matmul)[type](&m, 1, cols, x, n_tok, NULL, scratch);
    printf("%s %s %lld x %lld, %d token(s), %d product(s) from the %s: y[0] = %g\n", argv[1], argv[2], (long long)rows,
           (long long)cols, n_tok, reps, packed ? "layout" : "file's rows", y[0]);
    return 0;
}
