/* The Vulkan backend (src/gpu/, docs/gpu.md) on whatever device the loader finds first: lavapipe
 * (mesa-vulkan-drivers) here and in CI, with the Khronos validation layer on. In a build with the
 * backend these tests run and must pass (no device is a failure); in a build without it they check
 * that the CLI says how to get it. */
#include "test.h"

#include "tensor/types_internal.h"
#include "server_util.h"
#include "gpu/gpu.h"
#include "kernels/exact_scalar.h"
#include "model/context.h"
#include "tensor/types_internal.h"
#include "quill.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>

/* What the device's opening said of its multiply-adds (probe_fma's log line). */
static char fma_said[512];
static void keep_fma_line(quill_log_level level, const char *message, void *user) {
    (void)level, (void)user;
    if (strstr(message, "multiply-adds")) snprintf(fma_said, sizeof fma_said, "%s", message);
}

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
 * activations), products of 1 and of n_tok tokens on the device: the exact types equal to the CPU's
 * exact products bit for bit; the float ones (f32, f16, bf16) within a relative 1e-5 of a float64 sum (f32 rounding
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
    if (quill_can_quantize(type)) CHECK(quill_quantize_rows(type, wf, w, rows, cols, &err) == QUILL_OK, "%s", err.message);
    else quill_random_rows(type, w, rows, cols, &seed); /* (the grid i-quants) */
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
    fma_said[0] = 0;
    quill_set_log(keep_fma_line, NULL);
    quill_gpu *g = open_validated();
    quill_set_log(NULL, NULL);
    CHECK(g);
    /* the log says which multiply-adds the exact products take */
    CHECK(strstr(fma_said, quill_gpu_native_fma(g) ? "take its fma" : "take float64 steps"), "the log said: %s", fma_said);
    /* llvmpipe's GLSL fma is a multiply and an add: the probe at open must tell it from one rounding,
     * or every exact multiply-add here would take it and differ from the CPU's (a GPU's, where the
     * suite runs on one, is fused: the products below check whichever the probe chose) */
    quill_gpu_device dev[8];
    int n_dev = 0;
    quill_error derr;
    CHECK(quill_gpu_devices(dev, 8, &n_dev, &derr) == QUILL_OK && n_dev > 0);
    if (strstr(dev[0].driver, "llvmpipe"))
        CHECK(!quill_gpu_native_fma(g), "the fma probe took llvmpipe's unfused fma for a fused one");
    /* 96 columns: three blocks a row, so that the rows of the 32-column formats (18 to 34-byte
     * blocks) start off 4-byte boundaries */
    static const uint32_t types[] = {QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_0, QUILL_TYPE_F32, QUILL_TYPE_F16};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        check_products(g, types[k], 70, 96, 4, 11 + k);
        check_products(g, types[k], 33, 512, 3, 23 + k);
    }
    /* the other 32-column formats: minimums (q4_1, q5_1), fifth bits (q5_0, q5_1), mxfp4's E8M0
     * scale and fp4 levels, iq4_nl's levels; bf16 */
    static const uint32_t narrow[] = {QUILL_TYPE_Q4_1, QUILL_TYPE_Q5_0, QUILL_TYPE_Q5_1, QUILL_TYPE_MXFP4,
                                      QUILL_TYPE_IQ4_NL, QUILL_TYPE_BF16};
    for (size_t k = 0; k < sizeof narrow / sizeof narrow[0]; k++) check_products(g, narrow[k], 70, 96, 3, 31 + k);
    /* the k-quants: blocks of 256, q4_K's and q5_K's minimums, q6_K's, q2_K's and q3_K's slots of
     * 16 (q2_K's minimums per slot), iq4_xs's 6-bit scales; the grid i-quants (their lattice tables,
     * signs and scales; iq2_xs, iq2_s and iq1_m slots of 16), the ternary types and q1_0, q2_0;
     * nvfp4 (in f32, its UE4M3 scales per 16) */
    static const uint32_t wide[] = {QUILL_TYPE_Q4_K,    QUILL_TYPE_Q6_K,   QUILL_TYPE_Q5_K,  QUILL_TYPE_Q2_K,
                                    QUILL_TYPE_Q3_K,    QUILL_TYPE_IQ4_XS, QUILL_TYPE_IQ2_XXS, QUILL_TYPE_IQ2_XS,
                                    QUILL_TYPE_IQ2_S,   QUILL_TYPE_IQ3_XXS, QUILL_TYPE_IQ3_S, QUILL_TYPE_IQ1_S,
                                    QUILL_TYPE_IQ1_M,   QUILL_TYPE_TQ1_0,  QUILL_TYPE_TQ2_0,  QUILL_TYPE_Q1_0,
                                    QUILL_TYPE_Q2_0,    QUILL_TYPE_NVFP4};
    for (size_t k = 0; k < sizeof wide / sizeof wide[0]; k++) check_products(g, wide[k], 37, 512, 3, 41 + k);
    /* the other way to the same bits, a workgroup per (row, token) (a GPU's for a few tokens; off on
     * lavapipe, where it is slow): each type's products of 1 and 2 tokens equal to the CPU's (or
     * within the float bound), and of 9 tokens, which still take the first way, equal to each token
     * alone */
    quill_gpu_set_split(g, true);
    for (uint32_t type = 0; type < QUILL_TYPE_COUNT; type++)
        if (quill_gpu_supports(type))
            check_products(g, type, 9, quill_type_traits_of(type)->block_size > 32 ? 512 : 96, 2, 61 + type);
    check_products(g, QUILL_TYPE_Q4_K, 5, 512, 9, 97);
    /* rows of more than one chunk of 64 slots (72 of q4_1, 80 of q6_K's 16 columns), pairs that do
     * not fill their last workgroup of eight */
    check_products(g, QUILL_TYPE_Q4_1, 13, 2304, 2, 94);
    check_products(g, QUILL_TYPE_Q6_K, 11, 1280, 3, 95);
    check_products(g, QUILL_TYPE_F16, 5, 70, 9, 96); /* (blocks of 32 columns and one of 6) */
    /* workgroups spread over x and y (as past the 65535 a device must take in x), here past 3 */
    quill_gpu_set_dispatch_width(g, 3);
    check_products(g, QUILL_TYPE_Q8_0, 9, 96, 2, 98);  /* split: 18 workgroups */
    quill_gpu_set_split(g, false);
    check_products(g, QUILL_TYPE_Q4_K, 37, 512, 13, 99); /* 8 workgroups; the quantizer's 4 */
    check_products(g, QUILL_TYPE_F16, 70, 96, 5, 100);
    /* a prompt's products in tiles of 64 rows by 64 tokens (product_tiled.comp), each type that has
     * them: 70 rows and 66 tokens are two tiles each way, the second ones ragged; then the one
     * invocation per (row, token) way for the same */
    const bool tiled = quill_gpu_set_tiled(g, true);
    static const uint32_t coded[] = {QUILL_TYPE_Q4_0, QUILL_TYPE_Q4_1,  QUILL_TYPE_Q5_0,   QUILL_TYPE_Q5_1, QUILL_TYPE_Q8_0,
                                     QUILL_TYPE_MXFP4, QUILL_TYPE_Q4_K, QUILL_TYPE_Q5_K, QUILL_TYPE_Q6_K, QUILL_TYPE_Q2_K,
                                     QUILL_TYPE_Q3_K, QUILL_TYPE_IQ4_NL, QUILL_TYPE_IQ4_XS};
    for (size_t k = 0; k < sizeof coded / sizeof coded[0]; k++)
        check_products(g, coded[k], 70, quill_type_traits_of(coded[k])->block_size > 32 ? 256 : 64, 66, 120 + k);
    quill_gpu_set_tiled(g, false);
    check_products(g, QUILL_TYPE_Q5_K, 70, 256, 66, 119);
    quill_gpu_set_tiled(g, tiled);
    CHECK_EQ_INT(quill_gpu_validation_errors(g), 0);
    quill_gpu_close(g);
}

/* Weights uploaded to device-local memory through the staging buffer (forced, in chunks of 1000
 * bytes, as a discrete GPU's uploads go; lavapipe's device memory would take them in place): the
 * products read that copy, equal to the CPU's bit for bit, and again after a product of weights
 * that were not uploaded (the kept buffers grown and reused). */
TEST(vulkan_staged_weights) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    quill_gpu *g = open_validated();
    CHECK(g);
    quill_gpu_force_staging(g, 1000);
    enum { ROWS = 45, COLS = 256, TOK = 3 };
    const uint32_t type = QUILL_TYPE_Q5_K;
    const size_t row_bytes = quill_row_size(type, COLS);
    float wf[ROWS * COLS], x[TOK * COLS], y[ROWS * TOK], ref[ROWS * TOK], big_y[2 * ROWS * TOK];
    static uint8_t w[ROWS * 176], big[2 * ROWS * 176];
    uint64_t seed = 99;
    for (int i = 0; i < ROWS * COLS; i++) wf[i] = test_randf(&seed);
    for (int i = 0; i < TOK * COLS; i++) x[i] = test_randf(&seed);
    quill_error err;
    CHECK(quill_quantize_rows(type, wf, w, ROWS, COLS, &err) == QUILL_OK, "%s", err.message);
    memcpy(big, w, sizeof w);
    memcpy(big + sizeof w, w, sizeof w);
    CHECK(quill_exact_matmul_model(type, w, row_bytes, ROWS, COLS, x, TOK, ref));
    CHECK(quill_gpu_upload(g, w, sizeof w, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gpu_resident(g, w));
    for (int round = 0; round < 2; round++) {
        memset(y, 0, sizeof y);
        CHECK(quill_gpu_matmul(g, type, w, row_bytes, ROWS, COLS, x, TOK, y, &err) == QUILL_OK, "%s", err.message);
        CHECK(!memcmp(y, ref, sizeof y), "round %d: staged weights' products differ from the CPU's", round);
        /* twice the rows, not uploaded: the kept buffers grow */
        CHECK(quill_gpu_matmul(g, type, big, row_bytes, 2 * ROWS, COLS, x, TOK, big_y, &err) == QUILL_OK, "%s", err.message);
        for (int t = 0; t < TOK; t++)
            CHECK(!memcmp(big_y + t * 2 * ROWS, ref + t * ROWS, sizeof(float) * ROWS) &&
                  !memcmp(big_y + t * 2 * ROWS + ROWS, ref + t * ROWS, sizeof(float) * ROWS));
    }
    CHECK_EQ_INT(quill_gpu_validation_errors(g), 0);
    quill_gpu_close(g);
}

/* A group of products with one input in one submission (quill_gpu_matmuls): q8_0, q4_0 (another
 * act_max: the codes made again between the products), f16 (the activations themselves) and q8_0
 * again, rows whose results do not end on the device's offset alignment; each result equal to the
 * same product alone, bit for bit; a group with weights not uploaded refused. */
TEST(vulkan_grouped_products) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    quill_gpu *g = open_validated();
    CHECK(g);
    enum { COLS = 96, TOK = 5, N = 4 };
    static const uint32_t types[N] = {QUILL_TYPE_Q8_0, QUILL_TYPE_Q4_0, QUILL_TYPE_F16, QUILL_TYPE_Q8_0};
    static const int64_t rows[N] = {13, 7, 21, 3};
    static float wf[21 * COLS], x[TOK * COLS], y[N][21 * TOK], alone[21 * TOK];
    static uint8_t w[N][21 * COLS * 2];
    uint64_t seed = 5;
    for (int i = 0; i < TOK * COLS; i++) x[i] = test_randf(&seed) * (i % 5 == 0 ? 30.0f : 1.0f);
    quill_gpu_mat p[N];
    quill_error err;
    for (int k = 0; k < N; k++) {
        for (int i = 0; i < rows[k] * COLS; i++) wf[i] = test_randf(&seed);
        CHECK(quill_quantize_rows(types[k], wf, w[k], rows[k], COLS, &err) == QUILL_OK, "%s", err.message);
        p[k] = (quill_gpu_mat){types[k], w[k], quill_row_size(types[k], COLS), rows[k], y[k], 1};
    }
    CHECK(quill_gpu_matmuls(g, p, N, COLS, x, TOK, &err) == QUILL_E_ARG); /* not uploaded */
    for (int k = 0; k < N; k++)
        CHECK(quill_gpu_upload(g, w[k], p[k].row_bytes * (size_t)rows[k], &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gpu_matmuls(g, p, N, COLS, x, TOK, &err) == QUILL_OK, "%s", err.message);
    for (int k = 0; k < N; k++) {
        CHECK(quill_gpu_matmul(g, types[k], w[k], p[k].row_bytes, rows[k], COLS, x, TOK, alone, &err) == QUILL_OK, "%s",
              err.message);
        CHECK(!memcmp(alone, y[k], sizeof(float) * (size_t)(rows[k] * TOK)), "product %d of the group differs from it alone", k);
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
    uint8_t w[292] = {0};
    float x[256] = {0}, y[1];
    quill_error err;
    /* (every type a model file may hold has a product there: q8_K, an activations' type, has none) */
    CHECK(quill_gpu_matmul(g, QUILL_TYPE_Q8_K, w, 292, 1, 256, x, 1, y, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "q8_K");
    /* a row size that does not match the type and width is refused, not read past */
    CHECK(quill_gpu_matmul(g, QUILL_TYPE_Q8_0, w, 33, 1, 32, x, 1, y, &err) == QUILL_E_ARG);
    CHECK_EQ_INT(quill_gpu_validation_errors(g), 0);
    quill_gpu_close(g);
}

/* ---------------------------------------------------------------- the forward pass with --backend vulkan */

/* The logits of every position of `tokens` (n of them), evaluated in batches of `step` tokens, on the
 * CPU (gpu_layers 0) or with the products of the last gpu_layers layers on the device (-1: all and
 * the output layer). NULL after a failed check. */
static float *model_logits(quill_model *m, const int32_t *tokens, int n, int step, int gpu_layers) {
    quill_context_params cp = {.n_ctx = 64, .n_threads = 2};
    if (gpu_layers) cp.backend = QUILL_BACKEND_VULKAN, cp.n_gpu_layers = gpu_layers;
    setenv("QUILL_VULKAN_VALIDATION", "1", 1);
    quill_context *c = NULL;
    quill_error err;
    const quill_status s = quill_context_new(m, &cp, &c, &err);
    unsetenv("QUILL_VULKAN_VALIDATION");
    if (s) {
        test_fail(__FILE__, __LINE__, "context (gpu layers %d): %s", gpu_layers, err.message);
        return NULL;
    }
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    float *logits = malloc(sizeof(float) * (size_t)(n * nv));
    for (int done = 0; logits && done < n; done += step) {
        const int k = n - done < step ? n - done : step;
        if (quill_eval(c, tokens + done, k, logits + done * nv, true, &err)) {
            test_fail(__FILE__, __LINE__, "eval: %s", err.message);
            free(logits);
            logits = NULL;
        }
    }
    if (gpu_layers) {
        const char *device = NULL;
        int layers = 0;
        if (strcmp(quill_context_backend(c, &device, &layers), "vulkan") || !device || layers < 1) {
            test_fail(__FILE__, __LINE__, "the context does not name the device and its layers");
            free(logits);
            logits = NULL;
        }
        /* (these llama layers have nothing the device's layer lacks: they run there whole) */
        if (!c->gpu_whole) test_fail(__FILE__, __LINE__, "the placed layers did not run whole on the device");
        if (quill_gpu_validation_errors(c->gpu))
            test_fail(__FILE__, __LINE__, "%d validation errors", quill_gpu_validation_errors(c->gpu));
    }
    quill_context_free(c);
    return logits;
}

static int argmax(const float *x, int64_t n) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return (int)best;
}

/* One model against the CPU: all layers and the output on the device in one batch, token by token,
 * and (exact types) only the last layer there, each placed layer whole on the device (norms, RoPE,
 * attention over the device's KV cache, SwiGLU). q8_0 and q4_0 logits equal the CPU's bit for bit:
 * the products keep the exact integer contract and every other step is written to give the CPU's
 * bits (gpu/vulkan/shaders: rms_scale's double sums, the CPU's RoPE tables, exp_poly and fmaf through
 * float64), so nothing differs. f32 and f16 within 1e-4 of the largest |logit|: their products sum
 * in another order than the CPU's vector lanes (f32 rounding, ~1e-6 relative after a few layers:
 * lavapipe, stories260K over bench/gpu.sh's 16 positions: 9e-6 of max |logit| 17), which the quantized types' products
 * do not; greedy tokens equal. */
static void check_model_logits(const char *path, bool exact) {
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(path, &m, &err) == QUILL_OK, "%s: %s", path, err.message);
    enum { N = 12 };
    int32_t tokens[N];
    uint64_t seed = 7;
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)(1 + test_rand(&seed) % (uint32_t)(nv - 1));
    float *cpu = model_logits(m, tokens, N, N, 0), *gpu = model_logits(m, tokens, N, N, -1);
    float *gpu1 = model_logits(m, tokens, N, 1, -1);
    float *last = exact ? model_logits(m, tokens, N, 5, 1) : NULL;
    bool ok = cpu && gpu && gpu1 && (!exact || last);
    if (ok && !exact) {
        double worst = 0, top = 0;
        for (int64_t i = 0; i < N * nv; i++) worst = fmax(worst, fabs(gpu[i] - cpu[i])), top = fmax(top, fabs(cpu[i]));
        if (!(worst <= 1e-4 * top)) test_fail(__FILE__, __LINE__, "%s: max |gpu - cpu| %.3g of max |logit| %.3g", path, worst, top);
        for (int t = 0; t < N; t++)
            if (argmax(gpu + t * nv, nv) != argmax(cpu + t * nv, nv))
                test_fail(__FILE__, __LINE__, "%s: position %d: greedy token differs", path, t);
    } else if (ok) {
        if (memcmp(cpu, gpu, sizeof(float) * (size_t)(N * nv)))
            test_fail(__FILE__, __LINE__, "%s: GPU logits differ from the CPU's", path);
        if (memcmp(cpu, last, sizeof(float) * (size_t)(N * nv)))
            test_fail(__FILE__, __LINE__, "%s: -ngl 1 logits differ from the CPU's", path);
    }
    if (ok && memcmp(gpu, gpu1, sizeof(float) * (size_t)(N * nv)))
        test_fail(__FILE__, __LINE__, "%s: GPU logits depend on the batch", path);
    free(cpu), free(gpu), free(gpu1), free(last);
    quill_model_free(m);
}

/* `src` quantized to `type` (a file type or mix) as tmp_dir()/vk-STEM-TYPE.gguf, its logits checked
 * (check_model_logits, exact when `exact`), the file removed. */
static void check_quantized(const char *src, const char *stem, const char *type, bool exact) {
    char path[512], cmd[2048], *out = NULL;
    snprintf(path, sizeof path, "%s/vk-%s-%s.gguf", tmp_dir(), stem, type);
    snprintf(cmd, sizeof cmd, "%s quantize %s %s %s", quill_bin(), src, path, type);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "quantize %s: %s", type, out);
    free(out);
    check_model_logits(path, exact);
    remove(path);
}

TEST(vulkan_forward_matches_cpu) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    REQUIRE_SHARED(shared);
    char models[512], f32[512], cmd[4096], *out = NULL;
    snprintf(models, sizeof models, "%s/models/stories260K.gguf", shared);
    check_model_logits(models, false);
    /* a synthesized TinyLlama-like model (GQA: 4 heads, 2 KV heads) in f32, f16, q8_0 and q4_0 */
    snprintf(f32, sizeof f32, "%s/vk-f32.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd,
             "%s synth --embd 64 --layers 3 --heads 4 --kv-heads 2 --ff 128 --seed 3 --vocab %s --type f32 -o %s",
             quill_bin(), models, f32);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "synth: %s", out);
    free(out);
    check_model_logits(f32, false);
    static const char *types[] = {"f16", "q8_0", "q4_0"};
    /* (under the sanitizers q8_0 alone: the products' test has every type) */
    for (int k = TEST_SANITIZED ? 1 : 0; k < (TEST_SANITIZED ? 2 : 3); k++)
        check_quantized(f32, "narrow", types[k], k > 0);
    /* the q4_k_m mix of the model 64 wide keeps its matrices in q5_0 (the reference's fallback for
     * rows narrower than a k-quant block) and its output in q8_0 */
    check_quantized(f32, "narrow", "q4_k_m", true);
    /* a model 256 wide (the k-quants' blocks) in q3_k_m (q3_K, q4_K, q5_K, q6_K; q2_K's products are
     * checked above) and iq4_xs (its levels as codes: the CPU's exact products there too) */
    char wide[512];
    snprintf(wide, sizeof wide, "%s/vk-wide.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd,
             "%s synth --embd 256 --layers 2 --heads 4 --kv-heads 2 --ff 512 --seed 4 --vocab %s --type f32 -o %s",
             quill_bin(), models, wide);
    rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "synth: %s", out);
    free(out);
    static const char *mixes[] = {"q3_k_m", "iq4_xs"};
    /* (under the sanitizers q3_k_m alone: the host code is the same for every type) */
    for (int k = 0; k < (TEST_SANITIZED ? 1 : 2); k++) check_quantized(wide, "wide", mixes[k], true);
    /* its f32 weights (5.0 MiB with the output) and KV cache (64 positions: 0.125 MiB) against a
     * device capped at 3 MiB: refused before any upload, with the sizes and the -ngl that fits,
     * which then runs */
    snprintf(cmd, sizeof cmd,
             "QUILL_VULKAN_MEMORY_MIB=3 %s run -m %s -c 64 -p hi -n 1 --backend vulkan 2>&1; "
             "QUILL_VULKAN_MEMORY_MIB=3 %s run -m %s -c 64 -p hi -n 1 --backend vulkan -ngl 1 --json",
             quill_bin(), wide, quill_bin(), wide);
    rc = run_cmd(cmd, &out, true);
    remove(wide);
    CHECK(rc == 0, "%s", out);
    CHECK_STR_CONTAINS(out, "places 5.1 MiB of weights and KV cache on");
    CHECK_STR_CONTAINS(out, "which has 3.0 MiB of device-local memory");
    CHECK_STR_CONTAINS(out, "-ngl 1 fits");
    CHECK_STR_CONTAINS(out, "\"gpu_layers\": 1, \"gpu_whole_layers\": 1");
    free(out);
    /* a trace of the intermediate tensors would miss the device's layers: refused, naming them */
    snprintf(cmd, sizeof cmd, "%s run -m %s -p hi -n 1 --backend vulkan -ngl 1 --trace %s/vk-trace.gguf", quill_bin(), f32,
             tmp_dir());
    rc = run_cmd(cmd, &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "layers 2 to 2 (of 0 to 2) run whole on the Vulkan device: trace with --backend cpu");
    free(out);
    /* the 2-bit q2_0 (the types below 4 bits run there too, with the CPU's bits; not under the
     * sanitizers, as above) */
    if (!TEST_SANITIZED) check_quantized(f32, "narrow", "q2_0", true);
    remove(f32);
}

/* The log's last line of a level at least INFO (the products-only layers' reason). */
static char logged[1024];
static void keep_log(quill_log_level level, const char *message, void *user) {
    (void)user;
    if (level >= QUILL_LOG_INFO) snprintf(logged, sizeof logged, "%s", message);
}

static int64_t resident_layers, moe_layers, resident_experts;

/* Several sequences through the device's layers: 70 positions of sequence 0 (two micro-batches, the
 * attention past one chunk of 64 keys, and past the 16 whose scores it keeps), its first 40 copied to sequence 1 (quill_seq_copy_prefix,
 * the device's KV cache too), then one batch of both (4 positions of 0, 6 of 1), every logit; on the
 * CPU and with every layer and the output on the device. */
static float *sequences_logits(quill_model *m, bool gpu, bool *whole, quill_type type_k, quill_type type_v) {
    quill_context_params cp = {.n_ctx = 96, .n_threads = 2, .n_seq = 2, .type_k = type_k, .type_v = type_v};
    if (gpu) cp.backend = QUILL_BACKEND_VULKAN, cp.n_gpu_layers = -1;
    setenv("QUILL_VULKAN_VALIDATION", "1", 1);
    quill_context *c = NULL;
    quill_error err;
    logged[0] = 0;
    quill_set_log(keep_log, NULL);
    const quill_status s = quill_context_new(m, &cp, &c, &err);
    quill_set_log(NULL, NULL);
    unsetenv("QUILL_VULKAN_VALIDATION");
    if (s) {
        test_fail(__FILE__, __LINE__, "context: %s", err.message);
        return NULL;
    }
    /* (the attention's scores kept for at most 16 positions: beyond, made again in its later passes) */
    if (gpu) quill_gpu_set_attention_kept(c->gpu, 16);
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    enum { FIRST = 70, SHARED = 40, MIXED = 10 };
    float *logits = malloc(sizeof(float) * (size_t)((FIRST + MIXED) * nv));
    int32_t tok[FIRST], seq[FIRST], pos[FIRST];
    bool want[FIRST];
    uint64_t seed = 11;
    for (int i = 0; i < FIRST; i++)
        tok[i] = (int32_t)(1 + test_rand(&seed) % (uint32_t)(nv - 1)), seq[i] = 0, pos[i] = i, want[i] = true;
    quill_batch b = {FIRST, tok, seq, pos, want};
    bool ok = logits && quill_decode(c, &b, logits, &err) == QUILL_OK &&
              quill_seq_copy_prefix(c, 0, 1, SHARED, &err) == QUILL_OK;
    for (int i = 0; i < MIXED; i++) seq[i] = i >= 4, pos[i] = i < 4 ? FIRST + i : SHARED + i - 4;
    b.n = MIXED;
    ok = ok && quill_decode(c, &b, logits + (size_t)FIRST * nv, &err) == QUILL_OK;
    if (!ok) test_fail(__FILE__, __LINE__, "%s", err.message);
    *whole = c->gpu_whole != NULL;
    /* the layers whose products' weights went to the device (layer_ops.c sends a product there when
     * its matrix is resident): the first matrix of each one's mixer, or of its FFN */
    resident_layers = 0, moe_layers = 0, resident_experts = 0;
    for (int64_t l = 0; gpu && l < quill_model_hparams(m)->n_layer; l++) {
        const quill_layer *L = &m->layers[l];
        const quill_weight *first = L->ssm_in.data ? &L->ssm_in : L->q_a.data ? &L->q_a : L->wq.data ? &L->wq : &L->w_up;
        resident_layers += quill_gpu_resident(c->gpu, first->data);
        /* and a mixture of experts' experts (its FFN there: quill_gpu_moe_ffn) */
        moe_layers += L->ffn != QUILL_FFN_DENSE;
        resident_experts += L->ffn != QUILL_FFN_DENSE && quill_gpu_resident(c->gpu, L->w_gate.data);
    }
    if (gpu && quill_gpu_validation_errors(c->gpu))
        test_fail(__FILE__, __LINE__, "%d validation errors", quill_gpu_validation_errors(c->gpu));
    quill_context_free(c);
    if (!ok) free(logits);
    return ok ? logits : NULL;
}

/* The families whose layers run whole on the device (Llama 3: rope_freqs and a tied output;
 * SmolLM3: every fourth layer unrotated; Phi-3: NEOX RoPE, the fused qkv and gate+up; Qwen 2: the
 * q, k, v biases; Qwen 3: each head's q and k norms; GLM-4: biases, half the head rotated, fused
 * gate+up, post-norms; Gemma 3: post-norms, GeGLU and a sliding
 * window of 16 on its first layer; Granite: scaled residuals; Gemma 2: soft-capping; the mixtures of
 * experts; OLMo 2: branches without input norms, q and k norms over the whole projections; EXAONE 4:
 * no input norms, post-norms; Seed-OSS: biases; Cohere 2: LayerNorm, the parallel block, the logit
 * scale; Mistral 3: YaRN and an attention temperature, its context 8 so that the temperature moves)
 * and those that keep to the products there (the rest on the CPU; the log names the layer and the
 * step or kind): heads wider than 256, Qwen3.6's DeltaNet, Nemotron-H's Mamba-2 and single-block
 * layers, LFM2's short convolutions, DeepSeek-V2's latent attention, Gemma 4's per-layer inputs (a
 * mixture of experts beside them whole there: quill_gpu_moe_ffn); in
 * q8_0: the logits of several sequences equal the CPU's bit for bit (Gemma's GeGLU and
 * soft-capping too: exp_poly.h's tanh_poly on both). */
TEST(vulkan_families_and_sequences) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    REQUIRE_SHARED(shared);
    static const struct {
        const char *arch;
        bool whole;
        const char *options; /* (the experts' shapes: rows of whole q8_0 blocks) */
        const char *on_cpu;  /* products only: the layer's kind or step that keeps the rest on the CPU */
    } families[] = {{"llama3", true, "", NULL},
                    {"smollm3", true, "", NULL},
                    {"phi3", true, "", NULL},
                    {"qwen2", true, "", NULL},
                    {"qwen3", true, "", NULL},
                    {"glm4", true, "", NULL},
                    {"granite", true, "", NULL},
                    {"gemma3", true, "", NULL},
                    {"gemma2", true, "", NULL},
                    {"qwen3moe", true, "--experts 16 --experts-used 4 --expert-ff 32", NULL},
                    {"qwen2moe", true, "--experts 8 --experts-used 2 --expert-ff 32", NULL},
                    {"llama-moe", true, "", NULL},
                    {"glm4moe", true, "--experts 16 --experts-used 4 --expert-ff 32", NULL},
                    {"gpt-oss", true, "--experts 8 --experts-used 2", NULL},
                    {"olmo2", true, "", NULL},
                    {"exaone4", true, "", NULL},
                    {"seed_oss", true, "", NULL},
                    {"cohere2", true, "", NULL},
                    {"mistral3", true, "--head-dim 32 --ctx 8", NULL},
                    /* the layer kinds whose products alone run there (their weights' and the
                     * recurrent state's, latent cache's or per-layer inputs' steps on the CPU) */
                    {"qwen35moe", false, "--experts 16 --experts-used 4 --expert-ff 32", "a recurrent layer"},
                    {"nemotron_h", false, "", "a recurrent layer"},
                    {"lfm2", false, "", "a recurrent layer"},
                    {"deepseek2", false, "--experts 16 --experts-used 4 --expert-ff 32 --groups 4,2", "latent attention"},
                    {"gemma4", false, "--per-layer-input 32", "per-layer inputs"},
                    {"llama", false, "--head-dim 288", "heads wider than 256"}};
    const size_t n_families = sizeof families / sizeof families[0];
    for (size_t k = 0; k < n_families; k++) {
        /* under the sanitizers every fourth family and the last products-only one (the gcc run has
         * all: lavapipe's shaders run 2-3x slower there, and the host code is the same for all) */
        if (TEST_SANITIZED && k % 4 && k != n_families - 1) continue;
        char f32[512], q8[512], cmd[2048], *out = NULL;
        snprintf(f32, sizeof f32, "%s/vk-%s-f32.gguf", tmp_dir(), families[k].arch);
        snprintf(q8, sizeof q8, "%s/vk-%s-q8_0.gguf", tmp_dir(), families[k].arch);
        snprintf(cmd, sizeof cmd,
                 "%s synth --arch %s --embd 64 --layers 2 --heads 4 --kv-heads 2 --ff 128 %s --seed 3 %s --vocab "
                 "%s/models/stories260K.gguf --type f32 -o %s && %s quantize %s %s q8_0",
                 quill_bin(), families[k].arch, strcmp(families[k].arch, "lfm2") ? "--window 16" : "" /* (none in LFM2) */,
                 families[k].options, shared, f32, quill_bin(), f32, q8);
        const int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "synth + quantize %s: %s", families[k].arch, out);
        free(out);
        quill_model *m;
        quill_error err;
        CHECK(quill_model_load(q8, &m, &err) == QUILL_OK, "%s", err.message);
        bool whole_cpu = false, whole = false;
        float *cpu = sequences_logits(m, false, &whole_cpu, QUILL_TYPE_F32, QUILL_TYPE_F32),
              *gpu = sequences_logits(m, true, &whole, QUILL_TYPE_F32, QUILL_TYPE_F32);
        const int64_t nv = quill_model_hparams(m)->n_vocab;
        if (cpu && gpu && memcmp(cpu, gpu, sizeof(float) * (size_t)(80 * nv)))
            test_fail(__FILE__, __LINE__, "%s: the device's logits differ from the CPU's", families[k].arch);
        if (whole != families[k].whole)
            test_fail(__FILE__, __LINE__, "%s: the layers %s whole on the device", families[k].arch, whole ? "ran" : "did not run");
        /* the products-only layers' reason, by name */
        char reason[256];
        snprintf(reason, sizeof reason, "layer 0 of this %s model has %s", families[k].arch,
                 families[k].on_cpu ? families[k].on_cpu : "");
        if (!families[k].whole && (!strstr(logged, reason) || !strstr(logged, "which the device's layer does not run yet")))
            test_fail(__FILE__, __LINE__, "%s: the log says \"%s\"", families[k].arch, logged);
        if (!families[k].whole && resident_experts != moe_layers)
            test_fail(__FILE__, __LINE__, "%s: %lld of %lld layers' experts on the device", families[k].arch,
                      (long long)resident_experts, (long long)moe_layers);
        if (!families[k].whole && resident_layers != quill_model_hparams(m)->n_layer)
            test_fail(__FILE__, __LINE__, "%s: %lld of %lld layers' products on the device", families[k].arch,
                      (long long)resident_layers, (long long)quill_model_hparams(m)->n_layer);
        free(cpu), free(gpu);
        quill_model_free(m);
        remove(q8), remove(f32);
    }
}

/* A model of stories260K's vocabulary synthesized with `options` (seed 5) in f32 into
 * tmp/STEM-f32.gguf and quantized to q8_0 into tmp/STEM-q8_0.gguf; false (a failure said) when
 * either command fails. */
static bool synth_q8_0(const char *shared, const char *stem, const char *options, char *f32, char *q8, size_t size) {
    char cmd[2048], *out = NULL;
    snprintf(f32, size, "%s/%s-f32.gguf", tmp_dir(), stem);
    snprintf(q8, size, "%s/%s-q8_0.gguf", tmp_dir(), stem);
    snprintf(cmd, sizeof cmd, "%s synth %s --seed 5 --vocab %s/models/stories260K.gguf --type f32 -o %s && %s quantize %s %s q8_0",
             quill_bin(), options, shared, f32, quill_bin(), f32, q8);
    const int rc = run_cmd(cmd, &out, true);
    if (rc != 0) test_fail(__FILE__, __LINE__, "synth + quantize: %s", out);
    free(out);
    return rc == 0;
}

/* The KV cache's other types on the device (kv_types.glsl): a Llama 3 of heads of 32 in q8_0, keys
 * and values of different types, through sequences_logits (two micro-batches, a prefix copied to
 * another sequence, a mixed batch): every logit the CPU's bit for bit (each key and value rounded
 * once, as kv_cache.c stores it, and decoded as it decodes it), every layer whole on the device. */
TEST(vulkan_cache_types) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    REQUIRE_SHARED(shared);
    char f32[512], q8[512];
    CHECK(synth_q8_0(shared, "vk-cache", "--arch llama3 --embd 64 --layers 2 --heads 4 --kv-heads 2 --head-dim 32 --ff 128",
                     f32, q8, sizeof q8));
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(q8, &m, &err) == QUILL_OK, "%s", err.message);
    static const quill_type kinds[][2] = {{QUILL_TYPE_F16, QUILL_TYPE_Q8_0}, {QUILL_TYPE_Q4_0, QUILL_TYPE_BF16}};
    const int64_t nv = quill_model_hparams(m)->n_vocab;
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        bool whole_cpu = false, whole = false;
        float *cpu = sequences_logits(m, false, &whole_cpu, kinds[k][0], kinds[k][1]),
              *gpu = sequences_logits(m, true, &whole, kinds[k][0], kinds[k][1]);
        if (cpu && gpu && memcmp(cpu, gpu, sizeof(float) * (size_t)(80 * nv)))
            test_fail(__FILE__, __LINE__, "-ctk %s -ctv %s: the device's logits differ from the CPU's",
                      quill_type_name(kinds[k][0]), quill_type_name(kinds[k][1]));
        if (!whole) test_fail(__FILE__, __LINE__, "-ctk %s: the layers did not run whole on the device", quill_type_name(kinds[k][0]));
        free(cpu), free(gpu);
    }
    /* the kept descriptor sets full (5 of them) after the first layouts: the steps past it take sets
     * of their own and empty the cache for the next; the same bits */
    setenv("QUILL_VULKAN_SET_CACHE", "5", 1);
    bool whole = false;
    float *cpu = sequences_logits(m, false, &whole, QUILL_TYPE_F16, QUILL_TYPE_F16),
          *gpu = sequences_logits(m, true, &whole, QUILL_TYPE_F16, QUILL_TYPE_F16);
    unsetenv("QUILL_VULKAN_SET_CACHE");
    CHECK(cpu && gpu && !memcmp(cpu, gpu, sizeof(float) * (size_t)(80 * nv)) && whole,
          "with 5 kept descriptor sets the device's logits differ from the CPU's");
    free(cpu), free(gpu);
    quill_model_free(m);
    remove(q8), remove(f32);
}

/* ---------------------------------------------------------------- perplexity and serve with --backend vulkan */

/* `quill perplexity --json` of a model over bench/text/fidelity.txt (2 chunks of 64) with `backend`
 * args; the parsed object (NULL, with a failure, when it fails). */
static cJSON *perplexity_json(const char *model, const char *backend) {
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s perplexity -m %s -f bench/text/fidelity.txt -c 64 --chunks 2 -t 2 --json %s 2>/dev/null",
             quill_bin(), model, backend);
    const int rc = run_cmd(cmd, &out, false);
    cJSON *j = rc == 0 ? cJSON_Parse(out) : NULL;
    if (!j) test_fail(__FILE__, __LINE__, "`%s` exited %d with %s", cmd, rc, out ? out : "(nothing)");
    free(out);
    return j;
}

/* A greedy completion's text from a server started with `args` (malloc'd; NULL after a failure).
 * `log_has`: what its log must say (NULL: nothing). */
static char *served_text(const char *model, const char *args, const char *log_has) {
    test_server s;
    if (!server_start(&s, model, args)) return NULL;
    http_resp r = {0};
    char *text = NULL;
    if (http_post(s.port, "/v1/completions",
                  "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0}", &r) &&
        r.status == 200) {
        cJSON *j = cJSON_Parse(r.body);
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(j, "choices"), 0), "text");
        if (cJSON_IsString(t)) text = strdup(t->valuestring);
        cJSON_Delete(j);
    }
    if (!text) test_fail(__FILE__, __LINE__, "serve %s: no completion (status %d)", args, r.status);
    http_resp_free(&r);
    const int stopped = server_stop(&s);
    if (stopped) test_fail(__FILE__, __LINE__, "serve %s: exit status %d", args, stopped);
    size_t len = 0;
    char *log = read_file(s.log, &len);
    if (!log) test_fail(__FILE__, __LINE__, "serve %s: no log", args);
    if (log && log_has && !strstr(log, log_has)) test_fail(__FILE__, __LINE__, "serve %s: the log lacks \"%s\": %s", args, log_has, log);
    if (log && strstr(log, "vulkan validation")) test_fail(__FILE__, __LINE__, "serve %s: validation errors: %s", args, log);
    free(log);
    return text;
}

/* perplexity and serve with --backend vulkan on a q8_0 model (3 layers; -ngl 2 leaves one and the
 * output on the CPU): the perplexity (every chunk's, to the
 * last bit of its %.17g) and a greedy completion equal to the CPU's; the JSON and the server's log
 * name the backend and the device. */
TEST(vulkan_perplexity_and_serve_match_cpu) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    REQUIRE_SHARED(shared);
    /* (stories260K's FFN is 172 wide, which q8_0's blocks do not divide: a synthesized model with its
     * vocabulary instead) */
    char f32[512], q8[512];
    const bool made = synth_q8_0(shared, "vk-pp", "--embd 64 --layers 3 --heads 4 --kv-heads 2 --ff 128", f32, q8, sizeof q8);
    remove(f32);
    CHECK(made);
    setenv("QUILL_VULKAN_VALIDATION", "1", 1);
    cJSON *cpu = perplexity_json(q8, ""), *gpu = perplexity_json(q8, "--backend vulkan"),
          *last = perplexity_json(q8, "--backend vulkan -ngl 2 --device 0");
    if (cpu && gpu && last) {
        char *c = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(cpu, "chunk_ppl"));
        char *g = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(gpu, "chunk_ppl"));
        char *l = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(last, "chunk_ppl"));
        CHECK(c && g && l && !strcmp(c, g) && !strcmp(c, l), "chunk perplexities: cpu %s, vulkan %s, -ngl 2 %s", c, g, l);
        free(c), free(g), free(l);
        const cJSON *ppl_c = cJSON_GetObjectItemCaseSensitive(cpu, "ppl"), *ppl_g = cJSON_GetObjectItemCaseSensitive(gpu, "ppl");
        CHECK(cJSON_IsNumber(ppl_c) && cJSON_IsNumber(ppl_g) && ppl_c->valuedouble == ppl_g->valuedouble);
        const char *bc = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(cpu, "backend"));
        const char *bg = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(gpu, "backend"));
        CHECK(bc && bg && !strcmp(bc, "cpu") && !strcmp(bg, "vulkan"), "backends: %s, %s", bc, bg);
        CHECK(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(gpu, "device")) != NULL);
        const cJSON *layers = cJSON_GetObjectItemCaseSensitive(last, "gpu_layers");
        CHECK(cJSON_IsNumber(layers) && layers->valueint == 2);
        const cJSON *whole = cJSON_GetObjectItemCaseSensitive(last, "gpu_whole_layers");
        CHECK(cJSON_IsNumber(whole) && whole->valueint == 2, "the -ngl 2 layers run whole on the device");
    }
    cJSON_Delete(cpu), cJSON_Delete(gpu), cJSON_Delete(last);
    char *served_cpu = served_text(q8, "-np 2 -c 256 -t 2", NULL);
    char *served_gpu = served_text(q8, "-np 2 -c 256 -t 2 --backend vulkan -ngl 99", "vulkan backend on");
    unsetenv("QUILL_VULKAN_VALIDATION");
    CHECK(served_cpu && served_gpu && !strcmp(served_cpu, served_gpu), "served: cpu \"%s\", vulkan \"%s\"",
          served_cpu ? served_cpu : "", served_gpu ? served_gpu : "");
    free(served_cpu), free(served_gpu);
    remove(q8);
}

/* bench/gpu.sh, the script a lent GPU machine runs, in its small mode on lavapipe: its checks pass
 * (selftest, logits bit for bit for q8_0, within bounds for f32) and its table has both models'
 * rows with speeds on both paths. */
TEST(vulkan_gpu_script_small) {
    if (!quill_gpu_built()) {
        test_skip("built without Vulkan (libvulkan-dev and glslc absent at build time)");
        return;
    }
    /* (a shell script over the commands the other tests run: the gcc run checks it) */
    if (TEST_SANITIZED) {
        test_skip("the gcc run checks the script");
        return;
    }
    REQUIRE_SHARED(shared);
    (void)shared;
    char cmd[4096], *out = NULL, results[600];
    snprintf(cmd, sizeof cmd,
             "SMALL=1 MODELS='stories260K synth64-q8_0 moe64-q8_0' PP=16 TG=4 PROFILE=1 QUILL=%s OUT=%s/gpu-out "
             "WORK=%s/gpu-work "
             "bench/gpu.sh",
             quill_bin(), tmp_dir(), tmp_dir());
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "bench/gpu.sh: %s", out);
    free(out);
    snprintf(results, sizeof results, "%s/gpu-out/results.md", tmp_dir());
    size_t len = 0;
    char *md = read_file(results, &len);
    CHECK(md != NULL);
    const bool ok = strstr(md, "`quill devices --selftest`: ok") && strstr(md, "synth64-q8_0: ok (bit for bit, the same generated tokens): identical") &&
                    strstr(md, "stories260K: ok (within 1e-4") && strstr(md, "| synth64-q8_0 | ") &&
                    strstr(md, "moe64-q8_0: ok (bit for bit, the same generated tokens): identical") && !strstr(md, "| — / ");
    if (!ok) test_fail(__FILE__, __LINE__, "results.md: %s", md);
    free(md);
    /* PROFILE=1: the device's time per shader (QUILL_VULKAN_PROFILE), the prompt's and the generated
     * tokens', each model's */
    snprintf(results, sizeof results, "%s/gpu-out/profile.txt", tmp_dir());
    char *profile = read_file(results, &len);
    /* generation's steps after the first submit the command buffer recorded for it again */
    const char *tg = profile ? strstr(profile, "== synth64-q8_0 -p 0 -n 4") : NULL;
    const char *again = tg ? strstr(tg, "steps (") : NULL;
    CHECK(again && atoi(again + strlen("steps (")) > 0, "generation's steps were recorded anew each time: %s",
          tg ? tg : "(no profile)");
    CHECK(profile && strstr(profile, "== synth64-q8_0 -p 16 -n 0") && strstr(profile, "== moe64-q8_0 -p 0 -n 4") &&
              strstr(profile, "vulkan profile: ") && strstr(profile, " steps (") && strstr(profile, "product_tiled 4 ") &&
              strstr(profile, "product_exact 4 ") && strstr(profile, "rmsnorm ") && strstr(profile, " calls "),
          "profile.txt: %s", profile ? profile : "(missing)");
    free(profile);
}
