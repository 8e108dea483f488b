/* quill devices: the GPUs the Vulkan backend sees, and (--selftest) a check of its products
 * against the CPU's on one of them. */
#include "cli.h"
#include "gpu/gpu.h"
#include "kernels/exact_scalar.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEVICES 16

/* Random weights of each type the backend runs, products of 12 tokens on the device and on the CPU,
 * and of the first token alone (on a GPU the products of a few tokens take the other way, a
 * workgroup per (row, token)): the types with exact products must agree bit for bit with the CPU's,
 * both times; the float ones (f32, f16, bf16) give the same bits both times, within
 * f32 rounding of a float64 sum (a relative 1e-5 of the largest |y|). Returns the number of types
 * that failed (-1: the device could not run them). */
static int selftest(int device) {
    quill_gpu *g;
    quill_error err;
    if (quill_gpu_open(device, &g, &err)) {
        cli_fail("devices: %s", err.message);
        return -1;
    }
    printf("  multiply-adds: %s\n", quill_gpu_native_fma(g) ? "the device's fma (it rounds once, as C's fmaf)"
                                                            : "float64 steps (the device's fma does not round once)");
    enum { ROWS = 96, COLS = 256, TOKENS = 12 };
    float *wf = malloc(sizeof(float) * ROWS * COLS), *x = malloc(sizeof(float) * TOKENS * COLS);
    float *yg = malloc(sizeof(float) * ROWS * TOKENS), *yc = malloc(sizeof(float) * ROWS * TOKENS);
    float *y1 = malloc(sizeof(float) * ROWS);
    uint8_t *wq = malloc(quill_row_size(QUILL_TYPE_F32, COLS) * ROWS);
    int failed = 0;
    if (!wf || !x || !yg || !yc || !y1 || !wq) {
        cli_fail("devices: out of memory");
        failed = -1;
    }
    uint64_t state = 0x9E3779B97F4A7C15ull;
    for (int i = 0; failed == 0 && i < ROWS * COLS + TOKENS * COLS; i++) {
        state ^= state << 13, state ^= state >> 7, state ^= state << 17;
        const float v = (float)((double)(state >> 11) / 9007199254740992.0 * 2.0 - 1.0);
        if (i < ROWS * COLS) wf[i] = v;
        else x[i - ROWS * COLS] = v;
    }
    for (uint32_t type = 0; failed >= 0 && type < QUILL_TYPE_COUNT; type++) {
        if (!quill_gpu_supports(type)) continue;
        const size_t row_bytes = quill_row_size(type, COLS);
        /* (the types quill does not quantize, the grid i-quants: random valid blocks) */
        uint64_t rows_state = 0x2545F4914F6CDD1Dull;
        if (!quill_can_quantize(type)) quill_random_rows(type, wq, ROWS, COLS, &rows_state);
        if ((quill_can_quantize(type) && quill_quantize_rows(type, wf, wq, ROWS, COLS, &err)) ||
            quill_gpu_matmul(g, type, wq, row_bytes, ROWS, COLS, x, TOKENS, yg, &err) ||
            quill_gpu_matmul(g, type, wq, row_bytes, ROWS, COLS, x, 1, y1, &err)) {
            cli_fail("devices: %s: %s", quill_type_name(type), err.message);
            failed++;
            continue;
        }
        if (quill_exact_supported(type)) {
            quill_exact_matmul_model(type, wq, row_bytes, ROWS, COLS, x, TOKENS, yc);
            int differ = 0;
            for (int i = 0; i < ROWS * TOKENS; i++) differ += memcmp(&yg[i], &yc[i], sizeof(float)) != 0;
            for (int i = 0; i < ROWS; i++) differ += memcmp(&y1[i], &yc[i], sizeof(float)) != 0;
            printf("  %-7s %d of %d results differ from the CPU's exact product (bit for bit)\n", quill_type_name(type),
                   differ, ROWS * (TOKENS + 1));
            failed += differ != 0;
        } else {
            float *row = malloc(sizeof(float) * COLS);
            double worst = 0, ymax = 0;
            for (int r = 0; row && r < ROWS; r++) {
                quill_dequantize(type, wq + (size_t)r * row_bytes, row, COLS, &err);
                for (int t = 0; t < TOKENS; t++) {
                    double sum = 0;
                    for (int c = 0; c < COLS; c++) sum += (double)row[c] * x[t * COLS + c];
                    worst = fmax(worst, fabs(sum - yg[t * ROWS + r]));
                    ymax = fmax(ymax, fabs(sum));
                }
            }
            free(row);
            /* the token alone (on a GPU the other way) gives its batch's bits */
            const bool alone_same = !memcmp(y1, yg, sizeof(float) * ROWS);
            const bool ok = row && worst <= 1e-5 * ymax && alone_same;
            printf("  %-7s max |gpu - float64| = %.3g (%.3g of max |y|; limit 1e-5)%s\n", quill_type_name(type), worst,
                   worst / ymax, alone_same ? "" : "; a token alone differs from its batch");
            failed += !ok;
        }
    }
    const int verrors = quill_gpu_validation_errors(g);
    if (verrors) printf("  %d validation errors\n", verrors);
    free(wf), free(x), free(yg), free(yc), free(y1), free(wq);
    quill_gpu_close(g);
    return failed < 0 ? -1 : failed + (verrors != 0);
}

int cmd_devices(int argc, char **argv) {
    static const char usage[] =
        "usage: quill devices [--json] [--selftest] [--device N]\n"
        "lists the GPUs (and CPU drivers such as lavapipe) that quill's Vulkan backend sees: name, driver,\n"
        "memory, subgroup size and the shader features found.\n"
        "  --json        one JSON object per device, one a line\n"
        "  --selftest    run the backend's weight products of every type it runs on device N (default 0)\n"
        "                and compare them with the CPU path's; exit status 1 when one differs\n"
        "  --device N    the device of --selftest\n"
        "The forward pass runs the -ngl layers there (docs/gpu.md: which layers whole, which types).\n";
    bool json = false, test = false;
    long device = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) { fputs(usage, stdout); return 0; }
        if (!strcmp(argv[i], "--json")) json = true;
        else if (!strcmp(argv[i], "--selftest")) test = true;
        else if (!strcmp(argv[i], "--device")) {
            if (i + 1 >= argc || !cli_parse_long(argv[++i], 0, MAX_DEVICES - 1, &device))
                return cli_fail("devices: --device needs a device number (0 to %d)", MAX_DEVICES - 1);
        } else return cli_fail("devices: unknown option '%s'\n%s", argv[i], usage);
    }
    if (!quill_gpu_built()) return cli_fail("devices: %s", QUILL_GPU_HOWTO);
    quill_gpu_device d[MAX_DEVICES];
    int n;
    quill_error err;
    if (quill_gpu_devices(d, MAX_DEVICES, &n, &err)) return cli_fail("devices: %s", err.message);
    if (n == 0) return cli_fail("devices: no Vulkan device found (install mesa-vulkan-drivers for lavapipe, or your GPU's driver)");
    for (int i = 0; i < n && i < MAX_DEVICES; i++) {
        const unsigned major = d[i].api_version >> 22 & 0x7F, minor = d[i].api_version >> 12 & 0x3FF;
        if (json) {
            printf("{\"index\":%d,\"name\":", i);
            cli_json_string(stdout, d[i].name, strlen(d[i].name));
            printf(",\"driver\":");
            cli_json_string(stdout, d[i].driver, strlen(d[i].driver));
            printf(",\"kind\":\"%s\",\"vulkan\":\"%u.%u\",\"memory_bytes\":%llu,\"subgroup_size\":%u,"
                   "\"fp16\":%s,\"int8\":%s,\"int16\":%s,\"fp64\":%s}\n",
                   d[i].kind, major, minor, (unsigned long long)d[i].memory, d[i].subgroup_size, d[i].fp16 ? "true" : "false",
                   d[i].int8 ? "true" : "false", d[i].int16 ? "true" : "false", d[i].fp64 ? "true" : "false");
        } else {
            printf("device %d: %s (%s, Vulkan %u.%u)\n  driver: %s\n  memory: %.1f GiB device-local\n"
                   "  subgroup size: %u\n  features: fp16 %s, int8 %s, int16 %s, fp64 %s\n",
                   i, d[i].name, d[i].kind, major, minor, d[i].driver, (double)d[i].memory / (1024.0 * 1024 * 1024),
                   d[i].subgroup_size, d[i].fp16 ? "yes" : "no", d[i].int8 ? "yes" : "no", d[i].int16 ? "yes" : "no",
                   d[i].fp64 ? "yes" : "no");
        }
    }
    if (!test) return 0;
    if (device >= n) return cli_fail("devices: --device %ld: there are %d devices, 0 to %d", device, n, n - 1);
    if (!json) printf("selftest on device %ld:\n", device);
    const int failed = selftest((int)device);
    if (failed > 0) return cli_fail("devices: selftest: %d of the checks above failed", failed);
    return failed < 0 ? 1 : 0;
}
