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
bool quill_gpu_set_tiled(quill_gpu *g, bool tiled) { return (void)g, (void)tiled, false; }
bool quill_gpu_native_fma(const quill_gpu *g) { return (void)g, false; }
void quill_gpu_set_dispatch_width(quill_gpu *g, uint32_t width) { (void)g, (void)width; }
void quill_gpu_set_attention_kept(quill_gpu *g, uint32_t n) { (void)g, (void)n; }

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

/* (no step can begin without a device: the recording functions are never reached) */
bool quill_gpu_kv_type_ok(uint32_t type, int64_t hd) {
    (void)type, (void)hd;
    return false;
}
uint64_t quill_gpu_kv_row_words(uint32_t type, int64_t hd) {
    (void)type, (void)hd;
    return 0;
}
quill_status quill_gpu_kv_alloc(quill_gpu *g, uint64_t words, quill_error *err) {
    (void)g, (void)words;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}
quill_status quill_gpu_kv_copy(quill_gpu *g, const uint64_t *src, const uint64_t *dst, const uint64_t *words, int n,
                               quill_error *err) {
    (void)g, (void)src, (void)dst, (void)words, (void)n;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}
quill_status quill_gpu_step_begin(quill_gpu *g, uint64_t act_floats, const float *in, uint64_t in_at, uint64_t in_floats,
                                  const int32_t *pos, const int32_t *seq, const float *attn_factor, int n_tok,
                                  int max_dispatches, quill_error *err) {
    (void)g, (void)act_floats, (void)in, (void)in_at, (void)in_floats, (void)pos, (void)seq, (void)attn_factor, (void)n_tok,
        (void)max_dispatches;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}
void quill_gpu_rmsnorm(quill_gpu *g, uint64_t x_at, uint64_t add_at, const float *weight, uint64_t out_at, int64_t d,
                       int n_tok, double eps) {
    (void)g, (void)x_at, (void)add_at, (void)weight, (void)out_at, (void)d, (void)n_tok, (void)eps;
}
void quill_gpu_norm(quill_gpu *g, uint64_t x_at, uint64_t add_at, const float *weight, uint64_t out_at, int64_t d,
                    int n_tok, double eps, bool layer_norm) {
    (void)g, (void)x_at, (void)add_at, (void)weight, (void)out_at, (void)d, (void)n_tok, (void)eps, (void)layer_norm;
}
void quill_gpu_step_products(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at,
                             const uint64_t *y_at, int n_tok) {
    (void)g, (void)w, (void)n, (void)cols, (void)x_at, (void)y_at, (void)n_tok;
}
void quill_gpu_route_logits(quill_gpu *g, const float *w, int64_t rows, int64_t cols, uint64_t x_at, const float *bias,
                            uint64_t out_at, int n_tok) {
    (void)g, (void)w, (void)rows, (void)cols, (void)x_at, (void)bias, (void)out_at, (void)n_tok;
}
void quill_gpu_route_select(quill_gpu *g, const quill_gpu_routing *r, int64_t n_expert, int64_t k, uint64_t logits_at,
                            uint64_t select_at, uint64_t weights_at, uint64_t ids_at, int n_tok) {
    (void)g, (void)r, (void)n_expert, (void)k, (void)logits_at, (void)select_at, (void)weights_at, (void)ids_at, (void)n_tok;
}
void quill_gpu_step_expert_products(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at, int x_div,
                                    uint64_t ids_at, const uint64_t *y_at, int n_pairs) {
    (void)g, (void)w, (void)n, (void)cols, (void)x_at, (void)x_div, (void)ids_at, (void)y_at, (void)n_pairs;
}
void quill_gpu_moe_sum(quill_gpu *g, uint64_t y_at, uint64_t weights_at, int64_t d, int64_t k, uint64_t shared_at,
                       uint64_t gate_at, uint64_t out_at, int n_tok) {
    (void)g, (void)y_at, (void)weights_at, (void)d, (void)k, (void)shared_at, (void)gate_at, (void)out_at, (void)n_tok;
}
void quill_gpu_rope(quill_gpu *g, uint64_t v_at, int64_t n_heads, int64_t hd, int64_t half, int64_t stride, bool neox,
                    const float *cos_table, const float *sin_table, uint64_t table_at, int n_tok) {
    (void)g, (void)v_at, (void)n_heads, (void)hd, (void)half, (void)stride, (void)neox, (void)cos_table, (void)sin_table,
        (void)table_at, (void)n_tok;
}
void quill_gpu_kv_store(quill_gpu *g, const quill_gpu_kv_layer *kv, uint64_t k_at, uint64_t v_at, int64_t kv_dim,
                        int64_t hd, int n_tok) {
    (void)g, (void)kv, (void)k_at, (void)v_at, (void)kv_dim, (void)hd, (void)n_tok;
}
void quill_gpu_attention(quill_gpu *g, const quill_gpu_kv_layer *kv, uint64_t q_at, uint64_t out_at, int64_t n_head,
                         int64_t n_head_kv, int64_t hd, float scale, int64_t window, float softcap, const float *sinks,
                         int n_tok) {
    (void)g, (void)kv, (void)q_at, (void)out_at, (void)n_head, (void)n_head_kv, (void)hd, (void)scale, (void)window, (void)softcap,
        (void)sinks, (void)n_tok;
}
void quill_gpu_glu(quill_gpu *g, uint64_t gate_at, uint64_t up_at, int64_t n, quill_gpu_activation act) {
    (void)g, (void)gate_at, (void)up_at, (void)n, (void)act;
}
void quill_gpu_add_rows_by_id(quill_gpu *g, uint64_t x_at, const float *bias, int64_t n_expert, int64_t n, uint64_t ids_at,
                              int n_pairs) {
    (void)g, (void)x_at, (void)bias, (void)n_expert, (void)n, (void)ids_at, (void)n_pairs;
}
void quill_gpu_add_rows(quill_gpu *g, uint64_t x_at, const float *bias, int64_t n, int64_t n_rows) {
    (void)g, (void)x_at, (void)bias, (void)n, (void)n_rows;
}
void quill_gpu_scale(quill_gpu *g, uint64_t x_at, uint64_t n, float s) { (void)g, (void)x_at, (void)n, (void)s; }
void quill_gpu_copy(quill_gpu *g, uint64_t from_at, uint64_t to_at, uint64_t n) { (void)g, (void)from_at, (void)to_at, (void)n; }
quill_status quill_gpu_step_end(quill_gpu *g, uint64_t out_at, uint64_t out_floats, float *out, quill_error *err) {
    (void)g, (void)out_at, (void)out_floats, (void)out;
    return quill_fail(err, QUILL_E_UNSUPPORTED, "%s", QUILL_GPU_HOWTO);
}
#else
typedef int quill_gpu_absent_unused; /* (ISO C wants a translation unit to declare something) */
#endif
