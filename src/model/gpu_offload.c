/* The Vulkan backend as an executor of the model's layers (docs/gpu.md): at context creation the
 * layers placed on the device (the last n_gpu_layers, as the reference places them; more than the
 * model has: the output layer too) are checked and their weights uploaded. When every operation of
 * every placed layer is one the device has (device_refusal), the placed layers run there whole, from
 * the first one's input to the last one's output (or the logits), with their KV cache in device
 * memory, recorded into one command buffer per micro-batch (quill_gpu_run_layers): the same layer
 * description the CPU's pass reads (the layer's fields and the architecture's descriptor row), the
 * same order of operations as forward.c's. Otherwise the forward pass (forward.c's matmul_on) sends
 * every product of an uploaded weight to the device and runs the rest itself. */
#include "model/forward.h"
#include "gpu/gpu.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct quill_gpu_failure {
    quill_status status;
    quill_error err;
};

/* The layer kinds whose other operations (a recurrent step and its state, latent attention's
 * compressed cache, per-layer inputs) are not written for the device's layer: such a layer runs its
 * weight products there and the rest on the CPU, or NULL when it is not one of them. */
static const char *layer_kind_on_cpu(const quill_model *m, const quill_layer *L) {
    if (L->recurrent || L->shortconv) return "a recurrent layer (DeltaNet, Mamba-2 or short convolution)";
    if (L->mla) return "latent attention";
    if (L->ffn_only || L->no_ffn) return "a single-block layer";
    if (L->ple_gate.data || m->arch->per_layer_inputs) return "per-layer inputs";
    return NULL;
}

/* Why the device cannot run layer L's FFN (dense or a mixture of experts: a step of ffn_dense.c's
 * or ffn_moe.c's it lacks), or NULL when it can. */
static const char *ffn_refusal(const quill_model *m, const quill_layer *L) {
    const quill_activation act = m->arch->act;
    if (!L->w_gate.data || (act != QUILL_ACT_SILU && act != QUILL_ACT_GELU_TANH && act != QUILL_ACT_SWIGLU_OAI))
        return "an FFN other than SwiGLU (gpt-oss's too) or GeGLU";
    if (L->ffn == QUILL_FFN_DENSE) return NULL;
    if (L->w_router.type != QUILL_TYPE_F32) return "a router stored in a type other than f32";
    if (m->ap.n_expert_used > QUILL_GPU_MAX_USED || m->ap.n_group > QUILL_GPU_MAX_GROUPS)
        return "more experts per token, or expert groups, than the device's router takes";
    if (L->ffn == QUILL_FFN_MOE_SHARED && !L->w_gate_shexp.data) return "a shared expert without a gate";
    return NULL;
}

/* Whether layer L's FFN is a mixture of experts the device runs (whole, or alone beside a mixer the
 * CPU runs: quill_gpu_moe_ffn). */
static bool moe_on_device(const quill_model *m, const quill_layer *L) {
    return L->ffn != QUILL_FFN_DENSE && !ffn_refusal(m, L);
}

/* Why layer L cannot run whole on the device (an operation the device's layer does not have yet),
 * or NULL when it can. The checks follow forward.c's layer: each of its optional steps is either
 * written for the device or named here. */
static const char *device_refusal(const quill_context *c, const quill_layer *L) {
    const quill_model *m = c->model;
    const quill_arch *a = m->arch;
    const char *kind = layer_kind_on_cpu(m, L);
    if (kind) return kind;
    if (a->single_block) return "a single-block layer";
    if (a->layer_norm && (!L->attn_norm || (!L->ffn_norm && !a->parallel_block))) return "a LayerNorm branch without its weight";
    if (!L->q_norm != !L->k_norm) return "a query norm without a key norm, or the other way";
    if (L->window >= INT32_MAX) return "a sliding window wider than 2^31 positions";
    if (L->kv_shared) return "a KV cache shared with another layer";
    if (L->attn_gated) return "a gated attention output";
    if (L->head_dim > 256) return "heads wider than 256";
    if (L->n_head_kv <= 0 || L->n_head % L->n_head_kv) return "query heads not a multiple of the KV heads";
    if (!quill_gpu_kv_type_ok(c->type_k, L->head_dim) || !quill_gpu_kv_type_ok(c->type_v, L->head_dim))
        return "a KV cache type the device does not store for these heads (-ctk/-ctv)";
    return ffn_refusal(m, L);
}

/* A weight's bytes (an expert tensor's: all its experts'). */
static double weight_bytes(const quill_weight *w) {
    return w->data ? (double)(w->n_expert > 1 ? w->n_expert : 1) * (double)w->rows * (double)w->row_bytes : 0;
}

static quill_status upload(quill_context *c, const quill_weight *w, int layer, quill_error *err) {
    if (!w->data) return QUILL_OK;
    if (!quill_gpu_supports(w->type))
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "--backend vulkan: %s%s%d is %s, which the Vulkan backend does not run yet (" QUILL_GPU_TYPES
                          " do); use fewer -ngl layers or --backend cpu",
                          w->name ? w->name : "a weight", layer >= 0 ? " of layer " : "", layer >= 0 ? layer : 0,
                          quill_type_name(w->type));
    quill_status s = quill_gpu_upload(c->gpu, w->data, (size_t)weight_bytes(w), err);
    if (s == QUILL_E_NOMEM)
        return quill_fail(err, s, "--backend vulkan: %s (%.1f MiB) does not fit the device's memory; use fewer -ngl layers",
                          w->name ? w->name : "a weight", weight_bytes(w) / (1024.0 * 1024.0));
    return s;
}

/* The matrices of a layer that may go to the device: its products' (the experts' and the router's
 * when the device runs its mixture of experts: whole, or beside a mixer on the CPU). Latent
 * attention's per-head k_b and v_b stay on the CPU: a product is sent to the device when its
 * matrix starts an uploaded tensor, and a head's is a slice of one. */
static int layer_weights(const quill_model *m, const quill_layer *L, const quill_weight **out) {
    const bool experts = moe_on_device(m, L);
    const quill_weight *all[] = {&L->wq,       &L->wk,           &L->wv,         &L->wo,          &L->w_gate,
                                 &L->w_up,     &L->w_down,       &L->w_gate_shexp, &L->w_up_shexp, &L->w_down_shexp,
                                 &L->ssm_in,   &L->ssm_gate,     &L->ssm_beta,   &L->ssm_alpha,   &L->ssm_out,
                                 &L->q_a,      &L->ple_gate,     &L->ple_proj};
    int n = 0;
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]->data && (experts || all[i]->n_expert <= 1)) out[n++] = all[i];
    if (experts) out[n++] = &L->w_router;
    return n;
}
#define LAYER_WEIGHTS_MAX 19

/* The bytes of a layer's weights that go to the device. */
static double layer_bytes(const quill_model *m, const quill_layer *L) {
    const quill_weight *ws[LAYER_WEIGHTS_MAX];
    const int n = layer_weights(m, L, ws);
    double b = 0;
    for (int i = 0; i < n; i++) b += weight_bytes(ws[i]);
    return b;
}

quill_status quill_gpu_offload(quill_context *c, const quill_context_params *p, quill_error *err) {
    const quill_model *m = c->model;
    const int n_layer = (int)c->hp->n_layer;
    if (c->reference)
        return quill_fail(err, QUILL_E_ARG, "--backend vulkan: the float64 reference path runs on the CPU only");
    const int ngl = p->n_gpu_layers < 0 || p->n_gpu_layers > n_layer + 1 ? n_layer + 1 : p->n_gpu_layers;
    const int first = n_layer - ngl < 0 ? 0 : n_layer - ngl;
    /* the whole layers, when every placed one can: else only their products (said in the log) */
    const char *whole_refused = NULL;
    int refused_at = -1;
    for (int l = first; l < n_layer && !whole_refused; l++)
        if ((whole_refused = device_refusal(c, &m->layers[l]))) refused_at = l;
    if (!(c->gpu_failure = calloc(1, sizeof *c->gpu_failure))) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    quill_status s = quill_gpu_open(p->device, &c->gpu, err);
    if (s) return s;
    /* the placed weights against the device's memory, before any is uploaded: the sizes, and how
     * many of the last layers would fit */
    const double mib = 1024.0 * 1024.0, memory = (double)quill_gpu_memory(c->gpu);
    /* (whole layers: the RoPE tables too) */
    double need = (ngl > n_layer ? weight_bytes(&m->output) : 0) +
                  (whole_refused ? 0
                                 : 2.0 * (m->ap.n_rope_tables > 1 ? m->ap.n_rope_tables : 1) * (double)c->n_ctx *
                                       (double)quill_rope_stride(m) * sizeof(float)),
           fit_need = 0;
    int fits = 0;
    for (int l = n_layer - 1; l >= first; l--) {
        /* (and the layer's KV cache, in its types, when it runs whole there) */
        const quill_layer *L = &m->layers[l];
        const double b = layer_bytes(m, L) +
                         (whole_refused ? 0
                                        : (double)(quill_gpu_kv_row_words(c->type_k, L->head_dim) +
                                                   quill_gpu_kv_row_words(c->type_v, L->head_dim)) *
                                              (double)L->n_head_kv * (double)c->n_seq * (double)c->n_ctx * 4.0);
        need += b;
        if (fits == n_layer - 1 - l && fit_need + b <= memory) fit_need += b, fits++;
    }
    if (need > memory)
        return quill_fail(err, QUILL_E_NOMEM,
                          "--backend vulkan: -ngl %d places %.1f MiB of weights%s on %s, which has %.1f MiB of "
                          "device-local memory%s; -ngl %d fits (the rest of the layers on the CPU), or use --backend cpu",
                          ngl, need / mib, whole_refused ? "" : " and KV cache", quill_gpu_name(c->gpu), memory / mib,
                          getenv("QUILL_VULKAN_MEMORY_MIB") ? " for quill (QUILL_VULKAN_MEMORY_MIB)" : "", fits);
    for (int l = first; l < n_layer && !s; l++) {
        const quill_weight *ws[LAYER_WEIGHTS_MAX];
        const quill_layer *L = &m->layers[l];
        const int n = layer_weights(m, L, ws);
        for (int i = 0; i < n && !s; i++) s = upload(c, ws[i], l, err);
        /* a mixture of experts' vectors (a whole layer's others below) */
        const size_t E = (size_t)m->ap.n_expert, ff = (size_t)m->ap.n_ff_exp, d = (size_t)c->hp->n_embd;
        const struct {
            const float *v;
            size_t n;
        } moe_vectors[] = {{L->router_bias, E}, {L->probs_bias, E}, {L->shexp_gate, d}, {L->gate_exps_bias, E * ff},
                           {L->up_exps_bias, E * ff}, {L->down_exps_bias, E * d}};
        for (size_t i = 0; moe_on_device(m, L) && i < sizeof moe_vectors / sizeof moe_vectors[0] && !s; i++)
            if (moe_vectors[i].v) s = quill_gpu_upload(c->gpu, moe_vectors[i].v, moe_vectors[i].n * sizeof(float), err);
    }
    if (!s && ngl > n_layer) s = upload(c, &m->output, -1, err);
    c->gpu_layers = ngl;
    if (s || first == n_layer) return s;
    if (whole_refused) {
        quill_log(QUILL_LOG_INFO,
                  "--backend vulkan: layer %d of this %s model has %s, which the device's layer does not run yet: the "
                  "placed layers' weight products (and mixture-of-experts FFNs) run on the device, their other operations "
                  "on the CPU",
                  refused_at, m->arch->name, whole_refused);
        return QUILL_OK;
    }
    /* whole layers: their norms' weights and the RoPE tables too, and their KV cache there */
    for (int l = first; l < n_layer && !s; l++) {
        const quill_layer *L = &m->layers[l];
        const size_t d = (size_t)c->hp->n_embd, q_dim = (size_t)(L->n_head * L->head_dim),
                     kv_dim = (size_t)(L->n_head_kv * L->head_dim), hd = (size_t)L->head_dim;
        const struct {
            const float *v;
            size_t n;
        } vectors[] = {{L->attn_norm, d}, {L->ffn_norm, d}, {L->bq, q_dim}, {L->bk, kv_dim}, {L->bv, kv_dim},
                       {L->bo, d}, {L->q_norm, m->arch->qk_norm_full ? q_dim : hd},
                       {L->k_norm, m->arch->qk_norm_full ? kv_dim : hd}, {L->attn_post_norm, d}, {L->ffn_post_norm, d},
                       {L->b_gate, (size_t)L->w_gate.rows}, {L->b_up, (size_t)L->w_up.rows}, {L->b_down, d},
                       {L->sinks, (size_t)L->n_head}}; /* (a mixture of experts' with its weights, above) */
        for (size_t i = 0; i < sizeof vectors / sizeof vectors[0] && !s; i++)
            if (vectors[i].v) s = quill_gpu_upload(c->gpu, vectors[i].v, vectors[i].n * sizeof(float), err);
    }
    if (!s && ngl > n_layer) s = quill_gpu_upload(c->gpu, m->output_norm, (size_t)c->hp->n_embd * sizeof(float), err);
    const size_t table = (size_t)(m->ap.n_rope_tables > 1 ? m->ap.n_rope_tables : 1) * (size_t)c->n_ctx *
                         (size_t)quill_rope_stride(m) * sizeof(float);
    if (!s && table) s = quill_gpu_upload(c->gpu, c->rope_cos, table, err);
    if (!s && table) s = quill_gpu_upload(c->gpu, c->rope_sin, table, err);
    if (s) return s;
    struct quill_gpu_layers *w = calloc(1, sizeof *w);
    if (!w || !(w->kv = calloc((size_t)(n_layer - first), sizeof *w->kv))) {
        free(w);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    }
    w->first = first;
    c->gpu_whole = w;
    /* each layer's keys [seq][KV head][n_ctx][a row of the type's words] one after the other, then
     * the values so */
    uint64_t at = 0;
    for (int l = first; l < n_layer; l++) {
        const quill_layer *L = &m->layers[l];
        quill_gpu_kv_layer *kv = &w->kv[l - first];
        kv->type_k = c->type_k, kv->type_v = c->type_v;
        kv->k_seq_stride = quill_gpu_kv_row_words(c->type_k, L->head_dim) * (uint64_t)L->n_head_kv * (uint64_t)c->n_ctx;
        kv->v_seq_stride = quill_gpu_kv_row_words(c->type_v, L->head_dim) * (uint64_t)L->n_head_kv * (uint64_t)c->n_ctx;
        kv->n_ctx = c->n_ctx;
        kv->k_base = at;
        at += kv->k_seq_stride * (uint64_t)c->n_seq;
    }
    for (int l = first; l < n_layer; l++) {
        quill_gpu_kv_layer *kv = &w->kv[l - first];
        kv->v_base = at;
        at += kv->v_seq_stride * (uint64_t)c->n_seq;
    }
    return quill_gpu_kv_alloc(c->gpu, at, err);
}

const char *quill_context_backend(const quill_context *c, const char **device, int *gpu_layers) {
    if (device) *device = c->gpu ? quill_gpu_name(c->gpu) : NULL;
    if (gpu_layers) *gpu_layers = c->gpu ? c->gpu_layers : 0;
    return c->gpu ? "vulkan" : "cpu";
}

int quill_context_gpu_whole_layers(const quill_context *c) {
    return c->gpu && c->gpu_whole ? c->model->hp.n_layer - c->gpu_whole->first : 0;
}

void quill_gpu_offload_free(quill_context *c) {
    if (c->gpu_whole) free(c->gpu_whole->kv);
    free(c->gpu_whole);
    c->gpu_whole = NULL;
    quill_gpu_close(c->gpu);
    free(c->gpu_failure);
    c->gpu = NULL;
    c->gpu_failure = NULL;
}

quill_status quill_gpu_failed(quill_context *c, quill_error *err) {
    if (!c->gpu_failure || !c->gpu_failure->status) return QUILL_OK;
    const quill_status s = c->gpu_failure->status;
    if (err) *err = c->gpu_failure->err;
    c->gpu_failure->status = QUILL_OK;
    return s;
}

int quill_gpu_products(const quill_context *c, const quill_weight *const *w, float *const *y, int n, const float *x,
                       int n_tok) {
    if (!c->gpu) return 0;
    quill_gpu_mat p[QUILL_GPU_GROUP_MAX];
    int k = 0;
    for (; k < n && k < QUILL_GPU_GROUP_MAX && w[k]->cols == w[0]->cols && quill_gpu_resident(c->gpu, w[k]->data); k++)
        p[k] = (quill_gpu_mat){w[k]->type, w[k]->data, w[k]->row_bytes, w[k]->rows, y[k], 1};
    if (!k) return 0;
    struct quill_gpu_failure *f = c->gpu_failure;
    if (f->status == QUILL_OK) f->status = quill_gpu_matmuls(c->gpu, p, k, w[0]->cols, x, n_tok, &f->err);
    for (int i = 0; f->status && i < k; i++)
        for (int64_t j = 0; j < w[i]->rows * n_tok; j++) y[i][j] = __builtin_nanf(""); /* (the pass's result is discarded) */
    return k;
}

bool quill_gpu_product(const quill_context *c, const quill_weight *w, const float *x, int n_tok, float *y) {
    return quill_gpu_products(c, &w, &y, 1, x, n_tok) == 1;
}

/* ---------------------------------------------------------------- whole layers */

/* The step's regions of activations, in floats (each at a multiple of QUILL_GPU_ALIGN). */
typedef struct {
    uint64_t x, xb, q, k, v, att, gate, up, parallel, out_in, logits, total;
    /* a mixture-of-experts layer's: the router's logits and scores (float64), the pairs' experts
     * and weights, their gate, up and down products, the shared expert's output and gate */
    uint64_t router, select, ids, weights, pair_gate, pair_up, pair_down, shared, shared_gate;
} step_layout;

static uint64_t region(uint64_t *at, uint64_t floats) {
    const uint64_t r = *at;
    *at += (floats + QUILL_GPU_ALIGN - 1) / QUILL_GPU_ALIGN * QUILL_GPU_ALIGN;
    return r;
}

static quill_gpu_activation activation_of(const quill_model *m) {
    return m->arch->act == QUILL_ACT_GELU_TANH    ? QUILL_GPU_GELU_TANH
           : m->arch->act == QUILL_ACT_SWIGLU_OAI ? QUILL_GPU_SWIGLU_OAI
                                                  : QUILL_GPU_SILU;
}

static quill_gpu_mat mat_of(const quill_weight *w) {
    return (quill_gpu_mat){w->type, w->data, w->row_bytes, w->rows, NULL, w->n_expert};
}

/* forward.c's FFN (ffn_dense.c's dense_fast, with its biases, or the experts below), its input in
 * xb, its output into xb. */
static void moe_layer(const quill_context *c, const quill_layer *L, const step_layout *r, int n);
static void ffn_block(const quill_context *c, const quill_layer *L, const step_layout *r, int n) {
    if (L->ffn != QUILL_FFN_DENSE) {
        moe_layer(c, L, r, n);
        return;
    }
    quill_gpu *g = c->gpu;
    const int64_t d = c->hp->n_embd, ff = L->w_gate.rows;
    const quill_gpu_mat gate_up[2] = {mat_of(&L->w_gate), mat_of(&L->w_up)}, wd = mat_of(&L->w_down);
    quill_gpu_step_products(g, gate_up, 2, d, r->xb, (const uint64_t[]){r->gate, r->up}, n);
    if (L->b_gate) quill_gpu_add_rows(g, r->gate, L->b_gate, ff, n);
    if (L->b_up) quill_gpu_add_rows(g, r->up, L->b_up, ff, n);
    quill_gpu_glu(g, r->gate, r->up, (int64_t)n * ff, activation_of(c->model));
    quill_gpu_step_products(g, &wd, 1, ff, r->gate, &r->xb, n);
    if (L->b_down) quill_gpu_add_rows(g, r->xb, L->b_down, d, n);
}

/* forward.c's FFN of a mixture-of-experts layer (ffn_moe.c's moe_fast), its input in xb, its
 * output into xb. */
static void moe_layer(const quill_context *c, const quill_layer *L, const step_layout *r, int n) {
    const quill_model *m = c->model;
    quill_gpu *g = c->gpu;
    const int64_t d = c->hp->n_embd, E = m->ap.n_expert, k = m->ap.n_expert_used, ff = m->ap.n_ff_exp;
    const int pairs = n * (int)k;
    quill_gpu_route_logits(g, (const float *)L->w_router.data, E, d, r->xb, L->router_bias, r->router, n);
    const quill_gpu_routing routing = {
        m->ap.gating == QUILL_GATING_SIGMOID         ? QUILL_GPU_GATING_SIGMOID
        : m->ap.gating == QUILL_GATING_TOP_K_SOFTMAX ? QUILL_GPU_GATING_TOP_K_SOFTMAX
                                                     : QUILL_GPU_GATING_SOFTMAX,
        m->ap.norm_w, m->ap.w_scale, m->ap.n_group, m->ap.n_group_used, L->probs_bias};
    quill_gpu_route_select(g, &routing, E, k, r->router, r->select, r->weights, r->ids, n);
    const quill_gpu_mat gate_up[2] = {mat_of(&L->w_gate), mat_of(&L->w_up)}, down = mat_of(&L->w_down);
    quill_gpu_step_expert_products(g, gate_up, 2, d, r->xb, (int)k, r->ids, (const uint64_t[]){r->pair_gate, r->pair_up},
                                   pairs);
    /* (gpt-oss: each expert's biases) */
    if (L->gate_exps_bias) quill_gpu_add_rows_by_id(g, r->pair_gate, L->gate_exps_bias, E, ff, r->ids, pairs);
    if (L->up_exps_bias) quill_gpu_add_rows_by_id(g, r->pair_up, L->up_exps_bias, E, ff, r->ids, pairs);
    quill_gpu_glu(g, r->pair_gate, r->pair_up, (int64_t)pairs * ff, activation_of(m));
    quill_gpu_step_expert_products(g, &down, 1, ff, r->pair_gate, 1, r->ids, &r->pair_down, pairs);
    if (L->down_exps_bias) quill_gpu_add_rows_by_id(g, r->pair_down, L->down_exps_bias, E, d, r->ids, pairs);
    uint64_t shared = QUILL_GPU_NONE, gate = QUILL_GPU_NONE;
    if (L->ffn == QUILL_FFN_MOE_SHARED) {
        const quill_gpu_mat sh[2] = {mat_of(&L->w_gate_shexp), mat_of(&L->w_up_shexp)}, sh_down = mat_of(&L->w_down_shexp);
        quill_gpu_step_products(g, sh, 2, d, r->xb, (const uint64_t[]){r->gate, r->up}, n);
        quill_gpu_glu(g, r->gate, r->up, (int64_t)n * L->w_up_shexp.rows, activation_of(m));
        quill_gpu_step_products(g, &sh_down, 1, L->w_up_shexp.rows, r->gate, &r->shared, n);
        shared = r->shared;
        if (L->shexp_gate) {
            quill_gpu_route_logits(g, L->shexp_gate, 1, d, r->xb, NULL, r->shared_gate, n);
            gate = r->shared_gate;
        }
    }
    quill_gpu_moe_sum(g, r->pair_down, r->weights, d, k, shared, gate, r->xb, n);
}

/* The regions of a mixture-of-experts FFN's step (moe_layer's), from *at on. */
static void moe_regions(const quill_model *m, uint64_t nt, step_layout *r, uint64_t *at) {
    const uint64_t E = (uint64_t)m->ap.n_expert, k = (uint64_t)m->ap.n_expert_used, ff = (uint64_t)m->ap.n_ff_exp;
    const uint64_t d = (uint64_t)m->hp.n_embd;
    r->router = region(at, nt * E * 2);
    r->select = region(at, nt * E * 2);
    r->ids = region(at, nt * k);
    r->weights = region(at, nt * k);
    r->pair_gate = region(at, nt * k * ff);
    r->pair_up = region(at, nt * k * ff);
    r->pair_down = region(at, nt * k * d);
    r->shared = region(at, nt * d);
    r->shared_gate = region(at, nt * 2);
}

bool quill_gpu_moe_ffn(quill_context *c, const quill_layer *L, int n) {
    /* (a trace wants the FFN's intermediate tensors: the CPU's pass, with the same bits) */
    if (!c->gpu || c->trace || L->ffn == QUILL_FFN_DENSE || !quill_gpu_resident(c->gpu, L->w_gate.data)) return false;
    const quill_model *m = c->model;
    const uint64_t d = (uint64_t)c->hp->n_embd, nt = (uint64_t)n, ffs = (uint64_t)L->w_up_shexp.rows;
    step_layout r = {0};
    uint64_t at = 0;
    r.xb = region(&at, nt * d);
    r.gate = region(&at, nt * ffs); /* (the shared expert's) */
    r.up = region(&at, nt * ffs);
    moe_regions(m, nt, &r, &at);
    r.total = at;
    struct quill_gpu_failure *f = c->gpu_failure;
    /* (at most 16 dispatches: the router 2, the experts' products and codes 6, biases 3, the shared
     * expert 6, the sum 1) */
    if (f->status == QUILL_OK)
        f->status = quill_gpu_step_begin(c->gpu, r.total, c->xb, r.xb, nt * d, c->ub_pos, c->ub_seq, NULL, n, 24, &f->err);
    if (f->status == QUILL_OK) {
        moe_layer(c, L, &r, n);
        f->status = quill_gpu_step_end(c->gpu, r.xb, nt * d, c->xb, &f->err);
    }
    if (f->status)
        for (uint64_t i = 0; i < nt * d; i++) c->xb[i] = __builtin_nanf(""); /* (the pass's result is discarded) */
    return true;
}

bool quill_gpu_run_layers(quill_context *c, const int32_t *seq, const int32_t *pos, const bool *want, int n,
                          float *logits) {
    const quill_model *m = c->model;
    const quill_hparams *hp = c->hp;
    const int n_layer = (int)hp->n_layer, first = c->gpu_whole->first;
    const bool output = c->gpu_layers > n_layer;
    const uint64_t d = (uint64_t)hp->n_embd, nt = (uint64_t)n;
    int rows = 0;
    for (int t = 0; t < n; t++) rows += want[t];
    step_layout r;
    uint64_t at = 0;
    r.x = region(&at, nt * d);
    r.xb = region(&at, nt * d);
    r.q = region(&at, nt * (uint64_t)m->ap.widest_q);
    r.k = region(&at, nt * (uint64_t)m->ap.widest_kv);
    r.v = region(&at, nt * (uint64_t)m->ap.widest_kv);
    r.att = region(&at, nt * (uint64_t)m->ap.widest_q);
    const uint64_t ff_widest = (uint64_t)(m->ap.n_ff_shexp > m->ap.widest_ff ? m->ap.n_ff_shexp : m->ap.widest_ff);
    r.gate = region(&at, nt * ff_widest);
    r.up = region(&at, nt * ff_widest);
    if (m->ap.n_expert) moe_regions(m, nt, &r, &at);
    r.parallel = region(&at, m->arch->parallel_block ? nt * d : 0);
    r.out_in = region(&at, output ? nt * d : 0);
    r.logits = region(&at, output && logits ? (uint64_t)rows * (uint64_t)hp->n_vocab : 0);
    r.total = at;
    struct quill_gpu_failure *f = c->gpu_failure;
    quill_gpu *g = c->gpu;
    /* (a failed step's output is discarded: its callers return the failure; a layer records at
     * most 40 dispatches, the output 3) */
    if (f->status == QUILL_OK && c->trace)
        f->status = quill_fail(&f->err, QUILL_E_UNSUPPORTED,
                               "a trace of the intermediate tensors (--trace) sees only the CPU's layers, and layers %d to "
                               "%d (of 0 to %d) run whole on the Vulkan device: trace with --backend cpu",
                               first, n_layer - 1, n_layer - 1);
    /* (an attention temperature: each token's factor of the scale, as layer_ops.c's attention) */
    float *temperature = m->ap.attn_temp_scale ? malloc((size_t)n * sizeof *temperature) : NULL;
    for (int t = 0; temperature && t < n; t++) temperature[t] = quill_attn_temperature(&m->ap, pos[t]);
    if (f->status == QUILL_OK && m->ap.attn_temp_scale && !temperature)
        f->status = quill_fail(&f->err, QUILL_E_NOMEM, "out of memory");
    if (f->status == QUILL_OK)
        f->status = quill_gpu_step_begin(g, r.total, c->x, r.x, nt * d, pos, seq, temperature, n,
                                         40 * (n_layer - first) + 8, &f->err);
    free(temperature);
    if (f->status) {
        if (output && logits)
            for (int64_t i = 0; i < (int64_t)rows * hp->n_vocab; i++) logits[i] = __builtin_nanf("");
        return output;
    }
    const double eps = hp->rms_eps;
    const bool layer_norm = m->arch->layer_norm;
    const int64_t stride = quill_rope_stride(m);
    for (int l = first; l < n_layer; l++) {
        const quill_layer *L = &m->layers[l];
        const quill_gpu_kv_layer *kv = &c->gpu_whole->kv[l - first];
        const int64_t hd = L->head_dim, q_dim = L->n_head * hd, kv_dim = L->n_head_kv * hd;
        /* forward.c's attention layer, step by step (a branch without a norm: its input as it is) */
        if (L->attn_norm) quill_gpu_norm(g, r.x, QUILL_GPU_NONE, L->attn_norm, r.xb, (int64_t)d, n, eps, layer_norm);
        else quill_gpu_copy(g, r.x, r.xb, nt * d);
        const quill_gpu_mat qkv[3] = {mat_of(&L->wq), mat_of(&L->wk), mat_of(&L->wv)};
        /* (V = K: no value projection) */
        quill_gpu_step_products(g, qkv, L->v_from_k ? 2 : 3, (int64_t)d, r.xb, (const uint64_t[]){r.q, r.k, r.v}, n);
        /* rope_rows' steps before RoPE: the biases, the q and k norms (each head's, or the whole
         * projections'), the values' norms */
        if (L->v_from_k) quill_gpu_copy(g, r.k, r.v, nt * (uint64_t)kv_dim);
        if (L->bq) quill_gpu_add_rows(g, r.q, L->bq, q_dim, n);
        if (L->bk) quill_gpu_add_rows(g, r.k, L->bk, kv_dim, n);
        if (L->bv) quill_gpu_add_rows(g, r.v, L->bv, kv_dim, n);
        if (L->q_norm && m->arch->qk_norm_full) {
            quill_gpu_rmsnorm(g, r.q, QUILL_GPU_NONE, L->q_norm, r.q, q_dim, n, eps);
            quill_gpu_rmsnorm(g, r.k, QUILL_GPU_NONE, L->k_norm, r.k, kv_dim, n, eps);
        } else if (L->q_norm) {
            quill_gpu_rmsnorm(g, r.q, QUILL_GPU_NONE, L->q_norm, r.q, hd, n * (int)L->n_head, eps);
            quill_gpu_rmsnorm(g, r.k, QUILL_GPU_NONE, L->k_norm, r.k, hd, n * (int)L->n_head_kv, eps);
        }
        if (m->arch->v_norm) quill_gpu_rmsnorm(g, r.v, QUILL_GPU_NONE, NULL, r.v, hd, n * (int)L->n_head_kv, eps);
        if (!L->no_rope) {
            const int64_t half = quill_rope_dims(m, L->rope_table) / 2;
            const bool neox = m->arch->rope == QUILL_ROPE_NEOX;
            const uint64_t table_at = (uint64_t)L->rope_table * (uint64_t)c->n_ctx * (uint64_t)stride;
            quill_gpu_rope(g, r.q, L->n_head, hd, half, stride, neox, c->rope_cos, c->rope_sin, table_at, n);
            quill_gpu_rope(g, r.k, L->n_head_kv, hd, half, stride, neox, c->rope_cos, c->rope_sin, table_at, n);
        }
        quill_gpu_kv_store(g, kv, r.k, r.v, kv_dim, hd, n);
        quill_gpu_attention(g, kv, r.q, r.att, L->n_head, L->n_head_kv, hd, (float)m->ap.attn_scale, L->window,
                            m->ap.attn_softcap > 0 ? m->ap.attn_softcap : 0, L->sinks, n);
        /* (a parallel block keeps the norm's output in xb for the FFN: the attention's output to its
         * own region) */
        const bool parallel = m->arch->parallel_block;
        const uint64_t attn_out = parallel ? r.parallel : r.xb;
        const quill_gpu_mat wo = mat_of(&L->wo);
        quill_gpu_step_products(g, &wo, 1, q_dim, r.att, &attn_out, n);
        if (L->bo) quill_gpu_add_rows(g, attn_out, L->bo, (int64_t)d, n);
        if (parallel) {
            /* x + ffn + attention, in forward.c's order */
            ffn_block(c, L, &r, n);
            quill_gpu_rmsnorm(g, r.x, r.xb, NULL, QUILL_GPU_NONE, (int64_t)d, n, eps);
            quill_gpu_rmsnorm(g, r.x, r.parallel, NULL, QUILL_GPU_NONE, (int64_t)d, n, eps);
            continue;
        }
        if (L->attn_post_norm) quill_gpu_rmsnorm(g, r.xb, QUILL_GPU_NONE, L->attn_post_norm, r.xb, (int64_t)d, n, eps);
        if (m->ap.residual_scale) quill_gpu_scale(g, r.xb, nt * d, m->ap.residual_scale);
        /* the residual, then the FFN's norm into xb (or x itself, without a norm) */
        if (L->ffn_norm) {
            quill_gpu_norm(g, r.x, r.xb, L->ffn_norm, r.xb, (int64_t)d, n, eps, layer_norm);
        } else {
            quill_gpu_rmsnorm(g, r.x, r.xb, NULL, QUILL_GPU_NONE, (int64_t)d, n, eps);
            quill_gpu_copy(g, r.x, r.xb, nt * d);
        }
        ffn_block(c, L, &r, n);
        if (L->ffn_post_norm) quill_gpu_rmsnorm(g, r.xb, QUILL_GPU_NONE, L->ffn_post_norm, r.xb, (int64_t)d, n, eps);
        if (m->ap.residual_scale) quill_gpu_scale(g, r.xb, nt * d, m->ap.residual_scale);
        quill_gpu_rmsnorm(g, r.x, r.xb, NULL, QUILL_GPU_NONE, (int64_t)d, n, eps);
        if (L->out_scale) quill_gpu_scale(g, r.x, nt * d, *L->out_scale);
    }
    if (output) {
        quill_gpu_norm(g, r.x, QUILL_GPU_NONE, m->output_norm, r.xb, (int64_t)d, n, eps, layer_norm);
        /* the rows that asked for logits, gathered in order */
        int row = 0;
        for (int t = 0; t < n; t++)
            if (want[t]) quill_gpu_copy(g, r.xb + (uint64_t)t * d, r.out_in + (uint64_t)row++ * d, d);
        const quill_gpu_mat wout = mat_of(&m->output);
        if (rows && logits) quill_gpu_step_products(g, &wout, 1, (int64_t)d, r.out_in, &r.logits, rows);
        f->status = quill_gpu_step_end(g, r.logits, logits ? (uint64_t)rows * (uint64_t)hp->n_vocab : 0, logits, &f->err);
        if (f->status && logits)
            for (int64_t i = 0; i < (int64_t)rows * hp->n_vocab; i++) logits[i] = __builtin_nanf("");
        return true;
    }
    f->status = quill_gpu_step_end(g, r.x, nt * d, c->x, &f->err);
    return false;
}

quill_status quill_gpu_copy_prefix(quill_context *c, int src, int dst, int n, quill_error *err) {
    if (!c->gpu_whole || !n) return QUILL_OK;
    const int first = c->gpu_whole->first, n_layer = (int)c->hp->n_layer;
    const int ranges = 2 * (n_layer - first) * (int)c->model->ap.widest_kv; /* (KV heads at most kv_dim) */
    uint64_t *from = malloc((size_t)ranges * 3 * sizeof *from);
    if (!from) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    uint64_t *to = from + ranges, *words = to + ranges;
    int k = 0;
    for (int l = first; l < n_layer; l++) {
        const quill_layer *L = &c->model->layers[l];
        const quill_gpu_kv_layer *kv = &c->gpu_whole->kv[l - first];
        /* each KV head's first n positions, keys and values */
        for (int64_t h = 0; h < L->n_head_kv; h++)
            for (int which = 0; which < 2; which++) {
                const uint64_t row = quill_gpu_kv_row_words(which ? kv->type_v : kv->type_k, L->head_dim);
                const uint64_t stride = which ? kv->v_seq_stride : kv->k_seq_stride;
                const uint64_t base = (which ? kv->v_base : kv->k_base) + (uint64_t)h * (uint64_t)c->n_ctx * row;
                from[k] = base + (uint64_t)src * stride;
                to[k] = base + (uint64_t)dst * stride;
                words[k++] = (uint64_t)n * row;
            }
    }
    const quill_status s = quill_gpu_kv_copy(c->gpu, from, to, words, k, err);
    free(from);
    return s;
}
