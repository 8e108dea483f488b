/* The GPU backend's entry points in a build without Vulkan: each says how to get it. */
#ifndef QUILL_VULKAN
#include "gpu/gpu.h"
#include "base/error.h"

bool quill_gpu_built(void) { return false; }

quill_status quill_gpu_devices(quill_gpu_device *out, int max, int *n, quill_error *err) {
    (void)out, (void)max;
    *n = 0;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}

quill_status quill_gpu_open(int index, quill_gpu **out, quill_error *err) {
    (void)index;
    *out = NULL;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}

void quill_gpu_close(quill_gpu *g) { (void)g; }
int quill_gpu_validation_errors(const quill_gpu *g) { (void)g; return 0; }
bool quill_gpu_supports(uint32_t type) { (void)type; return false; }
bool quill_gpu_resident(const quill_gpu *g, const void *w) { (void)g, (void)w; return false; }
const char *quill_gpu_name(const quill_gpu *g) { (void)g; return "none"; }
void quill_gpu_force_staging(quill_gpu *g, size_t chunk) { (void)g, (void)chunk; }
uint64_t quill_gpu_memory(const quill_gpu *g) { (void)g; return 0; }
void quill_gpu_set_split(quill_gpu *g, bool split) { (void)g, (void)split; }
void quill_gpu_set_dispatch_width(quill_gpu *g, uint32_t width) { (void)g, (void)width; }

quill_status quill_gpu_upload(quill_gpu *g, const void *w, size_t bytes, quill_error *err) {
    (void)g, (void)w, (void)bytes;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}

quill_status quill_gpu_matmul(quill_gpu *g, uint32_t type, const void *w, size_t row_bytes, int64_t rows,
                              int64_t cols, const float *x, int n_tok, float *y, quill_error *err) {
    (void)g, (void)type, (void)w, (void)row_bytes, (void)rows, (void)cols, (void)x, (void)n_tok, (void)y;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}

quill_status quill_gpu_matmuls(quill_gpu *g, const quill_gpu_mat *p, int n, int64_t cols, const float *x, int n_tok,
                               quill_error *err) {
    (void)g, (void)p, (void)n, (void)cols, (void)x, (void)n_tok;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}
#else
typedef int quill_gpu_absent_unused; /* (ISO C wants a translation unit to declare something) */
#endif
