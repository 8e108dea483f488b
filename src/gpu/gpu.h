/* The GPU backend (docs/gpu.md): Vulkan compute, built when the build machine has Vulkan's headers
 * and glslc (the Makefile's VULKAN), else left out. It enumerates the devices and runs the weight
 * products (the types of QUILL_GPU_TYPES) on one, with the CPU path's exact integer semantics, and
 * the steps of a layer (norms, RoPE, the KV cache, attention, activations) recorded into one
 * command buffer per forward step; model/gpu_offload.c runs a context's placed layers there. */
#ifndef QUILL_GPU_H
#define QUILL_GPU_H

#include "quill.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Whether this build has the Vulkan backend. */
bool quill_gpu_built(void);
/* What to install to get it, for messages. */
#define QUILL_GPU_HOWTO                                                                                 \
    "this quill was built without Vulkan: install libvulkan-dev and glslc (Debian), and "              \
    "mesa-vulkan-drivers for a CPU driver, then rebuild (make clean all)"

typedef struct {
    char name[256];
    char driver[520];     /* the driver's name and version, e.g. "llvmpipe: Mesa 22.3.6" */
    char kind[16];        /* discrete, integrated, virtual, cpu, other */
    uint32_t api_version; /* VK_MAKE_API_VERSION */
    uint64_t memory;      /* bytes of its device-local heaps */
    uint32_t subgroup_size;
    bool fp16, int8, fp64, int16; /* the shader features found (the products need none of them) */
} quill_gpu_device;

/* Fills up to `max` devices; *n gets how many exist. */
quill_status quill_gpu_devices(quill_gpu_device *out, int max, int *n, quill_error *err);

typedef struct quill_gpu quill_gpu;
/* Opens device `index` for compute. With QUILL_VULKAN_VALIDATION=1 in the environment the Khronos
 * validation layer is enabled and its errors counted (quill_gpu_validation_errors). */
quill_status quill_gpu_open(int index, quill_gpu **out, quill_error *err);
void quill_gpu_close(quill_gpu *g);
/* The validation layer's error messages since the open (0 when it is off). */
int quill_gpu_validation_errors(const quill_gpu *g);
/* The weight types the device multiplies, for messages. */
#define QUILL_GPU_TYPES                                                                                  \
    "f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, iq2_xxs, iq2_xs, " \
    "iq2_s, iq3_xxs, iq3_s, iq1_s, iq1_m, tq1_0, tq2_0, q1_0, q2_0, mxfp4, nvfp4"
/* Whether the device runs products of weights of `type`. */
bool quill_gpu_supports(uint32_t type);
/* y[t * rows + r] = W[r] · x[t] for r < rows, t < n_tok, on the device. For the types with exact
 * products (q4_0 .. q8_0, the k-quants q2_K .. q6_K, mxfp4, the i-quants, tq1_0, tq2_0, q1_0, q2_0)
 * the bits are the CPU's exact products' (src/kernels/exact_scalar.c); for f32, f16, bf16 and nvfp4
 * an f32 sum of the decoded
 * weights (blocks of 32 in column order, then the blocks' sums in order). Either way a token's
 * result does not depend on the batch. An unsupported type is refused by name. */
quill_status quill_gpu_matmul(quill_gpu *g, uint32_t type, const void *w, size_t row_bytes, int64_t rows,
                              int64_t cols, const float *x, int n_tok, float *y, quill_error *err);

/* One product of a group: y[t * rows + r] = W[r] · x[t]. */
typedef struct {
    uint32_t type;
    const void *w;
    size_t row_bytes;
    int64_t rows;
    float *y;
    int64_t n_expert; /* an expert tensor's matrices, rows · row_bytes apart (0 or 1: one matrix) */
} quill_gpu_mat;
/* The most products of one group. */
#define QUILL_GPU_GROUP_MAX 4
/* The products of n (1 to QUILL_GPU_GROUP_MAX) weights of `cols` columns with the same x (a layer's
 * q, k and v; its gate and up) in one submission: x goes to the device once and is quantized once
 * per act_max among them; each result as quill_gpu_matmul's. With n > 1 every w must be uploaded. */
quill_status quill_gpu_matmuls(quill_gpu *g, const quill_gpu_mat *p, int n, int64_t cols, const float *x, int n_tok,
                               quill_error *err);

/* Copies the weights w[0..bytes) to the device's own (device-local) memory once; later products of
 * w read that copy. The caller keeps w unchanged while g is open (a model's mapped weights). */
quill_status quill_gpu_upload(quill_gpu *g, const void *w, size_t bytes, quill_error *err);
/* Uploads after this go through the staging buffer `chunk` bytes at a time (a multiple of 4), into
 * device-local memory the host does not map, also where that memory is host-visible (lavapipe,
 * integrated GPUs): the path a discrete GPU's uploads take, for the tests. */
void quill_gpu_force_staging(quill_gpu *g, size_t chunk);
/* Whether w was uploaded. */
bool quill_gpu_resident(const quill_gpu *g, const void *w);
/* Whether products of a few tokens run as a workgroup per (row, token) (split) or, as the others,
 * one invocation per (row, token); both give the same bits. By default split on
 * a GPU, not on a CPU driver; the tests set it to check both ways on lavapipe. */
void quill_gpu_set_split(quill_gpu *g, bool split);
/* Whether products of more tokens (a prompt's) of the types with a code per column run in tiles of
 * 64 rows by 64 tokens (product_tiled.comp) or, as the others, one invocation per (row, token); both
 * give the same bits. By default tiled where the device has the shared memory for it; the tests
 * check both ways. Returns what it was. */
bool quill_gpu_set_tiled(quill_gpu *g, bool tiled);
/* Whether the device's fma rounds once, as C's fmaf (asked at open), so that the shaders' exact
 * multiply-adds take it; else they take float64 steps to the same bits (slower). */
bool quill_gpu_native_fma(const quill_gpu *g);
/* Workgroups in a dispatch's x at most (65535, what Vulkan lets every device take; more spread over
 * y): the tests lower it to check the spreading on small products. */
void quill_gpu_set_dispatch_width(quill_gpu *g, uint32_t width);
/* Attention keeps the scores of at most n positions (2048 and less) in shared memory, and makes
 * them again in its later passes beyond (the same bits): the tests lower it to check that way. */
void quill_gpu_set_attention_kept(quill_gpu *g, uint32_t n);
/* The device-local memory quill may use on g: its device-local heaps, or QUILL_VULKAN_MEMORY_MIB
 * when that is less. */
uint64_t quill_gpu_memory(const quill_gpu *g);
/* ---------------------------------------------------------------- a step: layers on the device
 *
 * A forward step's operations recorded into one command buffer and submitted once: its input goes
 * up, the operations run on activations that stay in device memory (regions of the step's
 * activations, addressed in floats from its start, each at a multiple of QUILL_GPU_ALIGN so that
 * any device takes it as a descriptor's offset), and one region comes back. The KV cache is a
 * device buffer of 32-bit words (quill_gpu_kv_alloc) that the steps' kv_store writes, each key and
 * value rounded once into the cache's type as the CPU's cache stores it, and attention reads.
 * The recording functions keep their first failure (a weight not uploaded, the descriptor pool,
 * a shape out of range); quill_gpu_step_end returns it. The caller (model/gpu_offload.c) says what
 * the operations are, from the model's layer description. */
#define QUILL_GPU_ALIGN 64
#define QUILL_GPU_NONE UINT64_MAX
/* A KV cache of `words` 32-bit words on the device, zeroed (made again when it has fewer). */
quill_status quill_gpu_kv_alloc(quill_gpu *g, uint64_t words, quill_error *err);
/* Copies n ranges within the KV cache, words[i] from src[i] to dst[i], in one submission. */
quill_status quill_gpu_kv_copy(quill_gpu *g, const uint64_t *src, const uint64_t *dst, const uint64_t *words, int n,
                               quill_error *err);
/* Whether the device's cache takes keys or values of `type` for heads of hd (f32, f16, bf16 of an
 * even hd; q8_0, q4_0 of a multiple of 32: model/kv_cache.c's types), and the 32-bit words one
 * position of one KV head takes there. */
bool quill_gpu_kv_type_ok(uint32_t type, int64_t hd);
uint64_t quill_gpu_kv_row_words(uint32_t type, int64_t hd);
/* Starts a step of n_tok tokens over `act_floats` floats of activations: in[0..in_floats) goes to
 * region in_at; each token's (position, sequence) to the token table, with the factor of its
 * attention's scale (attn_factor[t]: an attention temperature; NULL: 1); room for up to
 * max_dispatches operations. */
quill_status quill_gpu_step_begin(quill_gpu *g, uint64_t act_floats, const float *in, uint64_t in_at, uint64_t in_floats,
                                  const int32_t *pos, const int32_t *seq, const float *attn_factor, int n_tok,
                                  int max_dispatches, quill_error *err);
/* Per row of d floats (n_tok rows): x += add (add_at not QUILL_GPU_NONE), then out = rmsnorm(x) ·
 * weight (out_at not QUILL_GPU_NONE, may be x_at; weight: an uploaded f32 vector of d, or NULL: x ·
 * its scale alone, forward.c's value norms), as forward.c's add_and_norm (a token's row) and
 * head_norms (a head's); with layer_norm its LayerNorm (Cohere's, without bias) instead. */
void quill_gpu_rmsnorm(quill_gpu *g, uint64_t x_at, uint64_t add_at, const float *weight, uint64_t out_at, int64_t d,
                       int n_tok, double eps);
void quill_gpu_norm(quill_gpu *g, uint64_t x_at, uint64_t add_at, const float *weight, uint64_t out_at, int64_t d,
                    int n_tok, double eps, bool layer_norm);
/* y_at[i] = W[i] · x for n (1 to QUILL_GPU_GROUP_MAX) uploaded weights of `cols` columns with the
 * same x, n_tok tokens (their y unused), each as quill_gpu_matmul's; the exact types' codes of x made
 * once per act_max among them. */
void quill_gpu_step_products(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at,
                             const uint64_t *y_at, int n_tok);
/* ---------------------------------------------------------------- a mixture-of-experts layer
 *
 * model/ffn_moe.c's steps on the device, with its bits: the router's logits in float64, the choice
 * of experts and their weights, the experts' products for each (token, slot) pair, and the sum. */
/* out_at (doubles: an even float offset) [token][rows] = W · x[token] (+ bias) in float64, as
 * kernels.h's dot_f64: W an uploaded f32 matrix of rows x cols (the router; one row: a shared
 * expert's gate vector), bias an uploaded vector of rows or NULL. */
void quill_gpu_route_logits(quill_gpu *g, const float *w, int64_t rows, int64_t cols, uint64_t x_at, const float *bias,
                            uint64_t out_at, int n_tok);
#define QUILL_GPU_MAX_USED 64   /* experts a token uses, at most */
#define QUILL_GPU_MAX_GROUPS 64 /* expert groups, at most */
/* How the router chooses (model.h's quill_gating and the architecture's parameters). */
typedef struct {
    enum { QUILL_GPU_GATING_SOFTMAX, QUILL_GPU_GATING_TOP_K_SOFTMAX, QUILL_GPU_GATING_SIGMOID } gating;
    bool norm_w;
    float w_scale;
    int64_t n_group, n_group_used;
    const float *probs_bias; /* the selection bias (uploaded, n_expert) or NULL */
} quill_gpu_routing;
/* From the logits at logits_at (replaced by the probabilities; select_at: room for as many
 * doubles), each token's k experts into ids_at (ints) and their f32 weights into weights_at,
 * [token][slot], as ffn_moe.c's route. */
void quill_gpu_route_select(quill_gpu *g, const quill_gpu_routing *r, int64_t n_expert, int64_t k, uint64_t logits_at,
                            uint64_t select_at, uint64_t weights_at, uint64_t ids_at, int n_tok);
/* The experts' products of n_pairs (token, slot) pairs: y_at[i][p · rows + r] = W_i[e][r] · x[p /
 * x_div] with e the int at ids_at + p, for the n uploaded expert tensors W_i (each as
 * quill_gpu_matmul's bits); x_div the slots per token when the pairs share their token's input
 * (gate, up), 1 when each has its own (down). */
void quill_gpu_step_expert_products(quill_gpu *g, const quill_gpu_mat *w, int n, int64_t cols, uint64_t x_at, int x_div,
                                    uint64_t ids_at, const uint64_t *y_at, int n_pairs);
/* out[t] = Σ_slot weight · y[t][slot] in slot order (y_at [token][slot][d], weights_at
 * [token][slot]), then + shared[t] · gate (shared_at not QUILL_GPU_NONE; gate = sigmoid of the
 * float64 at gate_at + 2t, or 1 when gate_at is QUILL_GPU_NONE), as ffn_moe.c's sums. */
void quill_gpu_moe_sum(quill_gpu *g, uint64_t y_at, uint64_t weights_at, int64_t d, int64_t k, uint64_t shared_at,
                       uint64_t gate_at, uint64_t out_at, int n_tok);

/* RoPE in place on n_heads vectors of hd per token, pairs adjacent or neox (half of them rotated),
 * with the uploaded tables cos_table, sin_table at table_at + position · stride. */
void quill_gpu_rope(quill_gpu *g, uint64_t v_at, int64_t n_heads, int64_t hd, int64_t half, int64_t stride, bool neox,
                    const float *cos_table, const float *sin_table, uint64_t table_at, int n_tok);
/* Where one layer's keys and values are in the KV cache (in words): sequence s's keys from k_base +
 * s · k_seq_stride, each KV head n_ctx positions of quill_gpu_kv_row_words(type_k, hd) words; the
 * values so from v_base. */
typedef struct quill_gpu_kv_layer {
    uint64_t k_base, v_base, k_seq_stride, v_seq_stride;
    int64_t n_ctx;
    uint32_t type_k, type_v;
} quill_gpu_kv_layer;
/* Each token's key and value (kv_dim = KV heads · hd) into the cache at its sequence and position. */
void quill_gpu_kv_store(quill_gpu *g, const quill_gpu_kv_layer *kv, uint64_t k_at, uint64_t v_at, int64_t kv_dim,
                        int64_t hd, int n_tok);
/* out = causal softmax(q·Kᵀ · scale)·V per token and query head over the cached positions 0 (or,
 * with a sliding window of `window` positions, pos + 1 - window) .. its own of its sequence (GQA:
 * n_head / n_head_kv query heads per KV head; hd at most 256); softcap > 0: the scores
 * softcap · tanh(x / softcap) before the softmax; sinks (an uploaded vector of n_head, or NULL):
 * each head's sink logit in the softmax's sum (gpt-oss, layer_ops.c's with_sink). */
void quill_gpu_attention(quill_gpu *g, const quill_gpu_kv_layer *kv, uint64_t q_at, uint64_t out_at, int64_t n_head,
                         int64_t n_head_kv, int64_t hd, float scale, int64_t window, float softcap, const float *sinks,
                         int n_tok);
/* The FFN's gated activations (glu.comp). */
typedef enum { QUILL_GPU_SILU, QUILL_GPU_GELU_TANH, QUILL_GPU_SWIGLU_OAI } quill_gpu_activation;
/* gate = act(gate) · up over n floats. */
void quill_gpu_glu(quill_gpu *g, uint64_t gate_at, uint64_t up_at, int64_t n, quill_gpu_activation act);
/* x[r][i] += bias[i] for n_rows rows of n floats (bias: an uploaded f32 vector). */
void quill_gpu_add_rows(quill_gpu *g, uint64_t x_at, const float *bias, int64_t n, int64_t n_rows);
/* x[p][i] += bias[e][i] for n_pairs rows of n floats, e the int at ids_at + p: an expert tensor's
 * biases (bias: an uploaded n_expert x n array). */
void quill_gpu_add_rows_by_id(quill_gpu *g, uint64_t x_at, const float *bias, int64_t n_expert, int64_t n, uint64_t ids_at,
                              int n_pairs);
/* x[i] *= s over n floats. */
void quill_gpu_scale(quill_gpu *g, uint64_t x_at, uint64_t n, float s);
/* Copies n floats within the activations (a gather of rows). */
void quill_gpu_copy(quill_gpu *g, uint64_t from_at, uint64_t to_at, uint64_t n);
/* Submits the step, waits, and copies out_floats from region out_at to out (none when out is
 * NULL); the first failure of the step's recording, else of its run. */
quill_status quill_gpu_step_end(quill_gpu *g, uint64_t out_at, uint64_t out_floats, float *out, quill_error *err);

/* The device's name (for --json and logs). */
const char *quill_gpu_name(const quill_gpu *g);

#endif
