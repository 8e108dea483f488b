/* The Vulkan backend as an executor of the model's weight products (docs/gpu.md): at context
 * creation the layers placed on the device (the last n_gpu_layers, as the reference places them;
 * more than the model has: the output layer too) are checked and their weights uploaded; the forward
 * pass (forward.c's matmul_on) then sends every product of an uploaded weight to the device. The
 * family's forward pass stays the one in forward.c. */
#include "model/forward.h"
#include "gpu/gpu.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

struct quill_gpu_failure {
    quill_status status;
    quill_error err;
};

/* The weights of a layer whose products the device runs, and a reason when the layer kind has
 * more than those products (its other operations are not written for a device-side executor). */
static const char *layer_refusal(const quill_model *m, const quill_layer *L) {
    if (L->recurrent || L->shortconv) return "a recurrent layer (DeltaNet, Mamba-2 or short convolution)";
    if (L->mla) return "latent attention";
    if (L->ffn != QUILL_FFN_DENSE) return "a mixture-of-experts FFN";
    if (L->ffn_only || L->no_ffn) return "a single-block layer";
    if (L->ple_gate.data || m->arch->per_layer_inputs) return "per-layer inputs";
    return NULL;
}

static quill_status upload(quill_context *c, const quill_weight *w, int layer, quill_error *err) {
    if (!w->data) return QUILL_OK;
    if (!quill_gpu_supports(w->type))
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "--backend vulkan: %s%s%d is %s, which the Vulkan backend does not run yet (" QUILL_GPU_TYPES
                          " do); use fewer -ngl layers or --backend cpu",
                          w->name ? w->name : "a weight", layer >= 0 ? " of layer " : "", layer >= 0 ? layer : 0,
                          quill_type_name(w->type));
    quill_status s = quill_gpu_upload(c->gpu, w->data, (size_t)w->rows * w->row_bytes, err);
    if (s == QUILL_E_NOMEM)
        return quill_fail(err, s, "--backend vulkan: %s (%.1f MiB) does not fit the device's memory; use fewer -ngl layers",
                          w->name ? w->name : "a weight", (double)w->rows * (double)w->row_bytes / (1024.0 * 1024.0));
    return s;
}

static double weight_bytes(const quill_weight *w) { return w->data ? (double)w->rows * (double)w->row_bytes : 0; }

/* The bytes of a layer's weights that go to the device. */
static double layer_bytes(const quill_layer *L) {
    const quill_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    double b = 0;
    for (size_t i = 0; i < sizeof ws / sizeof ws[0]; i++) b += weight_bytes(ws[i]);
    return b;
}

quill_status quill_gpu_offload(quill_context *c, const quill_context_params *p, quill_error *err) {
    const quill_model *m = c->model;
    const int n_layer = (int)c->hp->n_layer;
    if (c->reference)
        return quill_fail(err, QUILL_E_ARG, "--backend vulkan: the float64 reference path runs on the CPU only");
    const int ngl = p->n_gpu_layers < 0 || p->n_gpu_layers > n_layer + 1 ? n_layer + 1 : p->n_gpu_layers;
    const int first = n_layer - ngl < 0 ? 0 : n_layer - ngl;
    for (int l = first; l < n_layer; l++) {
        const char *why = layer_refusal(m, &m->layers[l]);
        if (why)
            return quill_fail(err, QUILL_E_UNSUPPORTED,
                              "--backend vulkan: layer %d of this %s model has %s, which the Vulkan backend does not run "
                              "yet; use --backend cpu",
                              l, m->arch->name, why);
    }
    if (!(c->gpu_failure = calloc(1, sizeof *c->gpu_failure))) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    quill_status s = quill_gpu_open(p->device, &c->gpu, err);
    if (s) return s;
    /* the placed weights against the device's memory, before any is uploaded: the sizes, and how
     * many of the last layers would fit */
    const double mib = 1024.0 * 1024.0, memory = (double)quill_gpu_memory(c->gpu);
    double need = ngl > n_layer ? weight_bytes(&m->output) : 0, fit_need = 0;
    int fits = 0;
    for (int l = n_layer - 1; l >= first; l--) {
        need += layer_bytes(&m->layers[l]);
        if (fits == n_layer - 1 - l && fit_need + layer_bytes(&m->layers[l]) <= memory)
            fit_need += layer_bytes(&m->layers[l]), fits++;
    }
    if (need > memory)
        return quill_fail(err, QUILL_E_NOMEM,
                          "--backend vulkan: -ngl %d places %.1f MiB of weights on %s, which has %.1f MiB of "
                          "device-local memory%s; -ngl %d fits (the rest of the layers on the CPU), or use --backend cpu",
                          ngl, need / mib, quill_gpu_name(c->gpu), memory / mib,
                          getenv("QUILL_VULKAN_MEMORY_MIB") ? " for quill (QUILL_VULKAN_MEMORY_MIB)" : "", fits);
    for (int l = first; l < n_layer && !s; l++) {
        const quill_layer *L = &m->layers[l];
        const quill_weight *ws[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < sizeof ws / sizeof ws[0] && !s; i++) s = upload(c, ws[i], l, err);
    }
    if (!s && ngl > n_layer) s = upload(c, &m->output, -1, err);
    c->gpu_layers = ngl;
    return s;
}

const char *quill_context_backend(const quill_context *c, const char **device, int *gpu_layers) {
    if (device) *device = c->gpu ? quill_gpu_name(c->gpu) : NULL;
    if (gpu_layers) *gpu_layers = c->gpu ? c->gpu_layers : 0;
    return c->gpu ? "vulkan" : "cpu";
}

void quill_gpu_offload_free(quill_context *c) {
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
        p[k] = (quill_gpu_mat){w[k]->type, w[k]->data, w[k]->row_bytes, w[k]->rows, y[k]};
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
