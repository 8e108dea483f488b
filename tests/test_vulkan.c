/* The Vulkan backend (src/gpu/, docs/gpu.md) on whatever device the loader finds first: lavapipe
 * (mesa-vulkan-drivers) here and in CI, with the Khronos validation layer on. In a build with the
 * backend these tests run and must pass (no device is a failure); in a build without it they check
 * that the CLI says how to get it. */
#include "test.h"
#include "gpu/gpu.h"
#include "kernels/exact_scalar.h"
#include "quill.h"

#include <math.h>
#include <stdlib.h>

static quill_gpu *open_validated(void) {
    setenv("QUILL_VULKAN_VALIDATION", "1", 1);
    quill_gpu *g = NULL;
    quill_error err;
    if (quill_gpu_open(0, &g, &err)) test_fail(__FILE__, __LINE__, "quill_gpu_open: %s", err.message);
    unsetenv("QUILL_VULKAN_VALIDATION");
    return g;
}

TEST(vulkan_absent_says_how) {
    if (quill_gpu_built()) {
        test_skip("this build has the Vulkan backend (the other vulkan_ tests run it)");
        return;
    }
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s devices", quill_bin());
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "libvulkan-dev");
    free(out);
}

TEST(vulkan_devices_listed) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    quill_gpu_device d[8];
    int n = 0;
    quill_error err;
    CHECK(quill_gpu_devices(d, 8, &n, &err) == QUILL_OK, "%s", err.message);
    CHECK(n >= 1, "no Vulkan device: install mesa-vulkan-drivers (lavapipe)");
    CHECK(d[0].name[0] && d[0].driver[0] && d[0].subgroup_size > 0);
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s devices --json", quill_bin());
    const int rc = run_cmd(cmd, &out, false);
    CHECK_EQ_INT(rc, 0);
    CHECK_STR_CONTAINS(out, "\"subgroup_size\":");
    CHECK_STR_CONTAINS(out, d[0].name);
    free(out);
    /* a device number past the list is refused by name */
    quill_gpu *g = NULL;
    CHECK(quill_gpu_open(n, &g, &err) == QUILL_E_ARG && !g);
    CHECK_STR_CONTAINS(err.message, "quill devices");
}

/* Weights of `type` (rows x cols, random, a block of zeros and one of large values among the
 * activations), products of 1 and of n_tok tokens on the device: q4_0 and q8_0 equal to the CPU's
 * exact products bit for bit; f32 and f16 within a relative 1e-5 of a float64 sum (f32 rounding
 * of a sum in another order: ~1e-7 relative per add, at most a few hundred adds); and every token's
 * result the same whatever the batch. */
static void check_products(quill_gpu *g, uint32_t type, int64_t rows, int64_t cols, int n_tok, uint64_t seed) {
    const size_t row_bytes = quill_row_size(type, cols);
    float *wf = malloc(sizeof(float) * (size_t)(rows * cols)), *x = malloc(sizeof(float) * (size_t)(n_tok * cols));
    uint8_t *w = malloc(row_bytes * (size_t)rows);
    float *y = malloc(sizeof(float) * (size_t)(rows * n_tok)), *y1 = malloc(sizeof(float) * (size_t)rows);
    float *ref = malloc(sizeof(float) * (size_t)(rows * n_tok)), *row = malloc(sizeof(float) * (size_t)cols);
    CHECK(wf && x && w && y && y1 && ref && row);
    for (int64_t i = 0; i < rows * cols; i++) wf[i] = test_randf(&seed);
    for (int64_t i = 0; i < n_tok * cols; i++) x[i] = test_randf(&seed) * (i % 7 == 0 ? 40.0f : 1.0f);
    for (int64_t i = 0; i < 32 && n_tok > 1; i++) x[cols + i] = 0; /* token 1's first block: all zeros */
    quill_error err;
    CHECK(quill_quantize_rows(type, wf, w, rows, cols, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gpu_matmul(g, type, w, row_bytes, rows, cols, x, n_tok, y, &err) == QUILL_OK, "%s", err.message);
    for (int t = 0; t < n_tok; t++) {
        CHECK(quill_gpu_matmul(g, type, w, row_bytes, rows, cols, x + t * cols, 1, y1, &err) == QUILL_OK, "%s",
              err.message);
        CHECK(!memcmp(y1, y + t * rows, sizeof(float) * (size_t)rows), "%s: token %d alone differs from its batch",
              quill_type_name(type), t);
    }
    if (quill_exact_supported(type)) {
        CHECK(quill_exact_matmul_model(type, w, row_bytes, rows, cols, x, n_tok, ref));
        for (int64_t i = 0; i < rows * n_tok; i++)
            CHECK(!memcmp(&y[i], &ref[i], sizeof(float)), "%s %lldx%lld: y[%lld] = %.9g on the GPU, %.9g on the CPU",
                  quill_type_name(type), (long long)rows, (long long)cols, (long long)i, y[i], ref[i]);
    } else {
        double worst = 0, ymax = 0;
        for (int64_t r = 0; r < rows; r++) {
            CHECK(quill_dequantize(type, w + r * row_bytes, row, cols, &err) == QUILL_OK);
            for (int t = 0; t < n_tok; t++) {
                double sum = 0;
                for (int64_t c = 0; c < cols; c++) sum += (double)row[c] * x[t * cols + c];
                worst = fmax(worst, fabs(sum - y[t * rows + r]));
                ymax = fmax(ymax, fabs(sum));
            }
        }
        CHECK(worst <= 1e-5 * ymax, "%s: max |gpu - float64| %.3g of max |y| %.3g", quill_type_name(type), worst, ymax);
    }
    free(wf), free(x), free(w), free(y), free(y1), free(ref), free(row);
}

TEST(vulkan_products_match_cpu) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    quill_gpu *g = open_validated();
    CHECK(g);
    /* 96 columns: three blocks a row, so that q4_0's and q8_0's rows start off 4-byte boundaries */
    static const uint32_t types[] = {QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_0, QUILL_TYPE_F32, QUILL_TYPE_F16};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        check_products(g, types[k], 70, 96, 4, 11 + k);
        check_products(g, types[k], 33, 512, 3, 23 + k);
    }
    CHECK_EQ_INT(quill_gpu_validation_errors(g), 0);
    quill_gpu_close(g);
}

TEST(vulkan_refuses_types_by_name) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    quill_gpu *g = open_validated();
    CHECK(g);
    uint8_t w[210] = {0};
    float x[256] = {0}, y[1];
    quill_error err;
    CHECK(quill_gpu_matmul(g, QUILL_TYPE_Q6_K, w, sizeof w, 1, 256, x, 1, y, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "q6_K");
    /* a row size that does not match the type and width is refused, not read past */
    CHECK(quill_gpu_matmul(g, QUILL_TYPE_Q8_0, w, 33, 1, 32, x, 1, y, &err) == QUILL_E_ARG);
    CHECK_EQ_INT(quill_gpu_validation_errors(g), 0);
    quill_gpu_close(g);
}
