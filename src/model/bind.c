/* A model's tensors and per-layer metadata found by name for the loader and the layer kinds: sizes
 * checked against their bounds, each tensor's shape against the hyperparameters and its type
 * against what quill decodes, and every bound tensor claimed (an unclaimed one is an error for the
 * families that list them all). Calls nothing of the passes or the layer kinds. */
#include "model/model.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_DIM (1 << 20)

/* A size key: positive and at most MAX_DIM; missing: `fallback`, or an error when fallback < 0. */
quill_status quill_model_dim(const quill_gguf *g, const char *key, int64_t fallback, int64_t *out,
                           quill_error *err) {
    int64_t v;
    quill_status s = quill_gguf_get_i64(g, key, &v, err);
    if (s == QUILL_E_NOT_FOUND && fallback >= 0) {
        *out = fallback;
        return QUILL_OK;
    }
    if (s) return s;
    if (v <= 0 || v > MAX_DIM)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range (1..%d)",
                          quill_gguf_path(g), key, (long long)v, MAX_DIM);
    *out = v;
    return QUILL_OK;
}

/* Layer `layer`'s value of a key that may be one number for every layer or an array of one per
 * layer (only where the architecture has per-layer shapes: elsewhere an array is refused by name). */
quill_status quill_layer_dim(const quill_gguf *g, const char *key, bool arrays, int64_t n_layer, int64_t layer,
                             int64_t fallback, int64_t *out, quill_error *err) {
    const quill_gguf_value *v = quill_gguf_find(g, key);
    if (!v || v->type != QUILL_GGUF_ARRAY) return quill_model_dim(g, key, fallback, out, err);
    if (!arrays)
        return quill_fail(err, QUILL_E_UNSUPPORTED, "%s: %s is a per-layer array: quill reads per-layer values for gemma4 only",
                          quill_gguf_path(g), key);
    if (v->count != (uint64_t)n_layer)
        return quill_fail(err, QUILL_E_FORMAT, "%s: %s has %llu values for %lld layers", quill_gguf_path(g), key,
                          (unsigned long long)v->count, (long long)n_layer);
    uint64_t cursor = 0;
    quill_gguf_value e;
    int64_t value = -1;
    for (int64_t i = 0; i <= layer; i++)
        if (!quill_gguf_array_next(v, &cursor, &e) || !quill_gguf_value_i64(&e, &value)) value = -1;
    if (value <= 0 || value > MAX_DIM)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s[%lld] = %lld is out of range (1..%d)", quill_gguf_path(g),
                          key, (long long)layer, (long long)value, MAX_DIM);
    *out = value;
    return QUILL_OK;
}

/* Binds tensor `name` as a [rows][cols] matrix, or as n_expert of them when n_expert > 0 (a 3-D
 * expert tensor [n_expert][rows][cols]), after checking its shape and type. */
static quill_status bind_tensor(quill_model *m, const char *name, int64_t cols, int64_t rows, int64_t n_expert,
                                quill_weight *w, quill_error *err) {
    const quill_gguf *g = m->gguf;
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g, name);
    if (!t) return quill_fail(err, QUILL_E_FORMAT, "%s: tensor '%s' is missing", quill_gguf_path(g), name);
    const int64_t depth = n_expert > 0 ? n_expert : 1;
    if (t->ne[0] != cols || t->ne[1] != rows || t->ne[2] != depth || t->ne[3] != 1) {
        char want[96];
        if (n_expert > 0) snprintf(want, sizeof want, "[%lld, %lld, %lld] (%lld experts)", (long long)cols,
                                   (long long)rows, (long long)n_expert, (long long)n_expert);
        else snprintf(want, sizeof want, "[%lld, %lld]", (long long)cols, (long long)rows);
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: tensor '%s' has shape [%lld, %lld, %lld, %lld], expected %s from the hyperparameters",
                          quill_gguf_path(g), name, (long long)t->ne[0], (long long)t->ne[1], (long long)t->ne[2],
                          (long long)t->ne[3], want);
    }
    const quill_type_traits *tr = quill_type_traits_of(t->type);
    if (!tr || !tr->to_float)
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: unsupported tensor type %s in tensor '%s': it is not a weight type quill decodes "
                          "(the float, legacy, k-quant, iq, ternary and fp4 types are); "
                          "re-quantize the file from its f16/f32 source",
                          quill_gguf_path(g), quill_type_name(t->type), name);
    if (m->claimed) m->claimed[t - quill_gguf_tensor_at(g, 0)] = 1;
    w->name = t->name;
    w->type = t->type;
    w->cols = cols;
    w->rows = rows;
    w->row_bytes = quill_row_size(t->type, cols);
    w->data = t->data;
    w->n_expert = depth;
    w->expert_bytes = (size_t)rows * w->row_bytes;
    return QUILL_OK;
}

quill_status quill_model_bind(quill_model *m, const char *name, int64_t cols, int64_t rows, quill_weight *w,
                              quill_error *err) {
    return bind_tensor(m, name, cols, rows, 0, w, err);
}

quill_status quill_model_bind_experts(quill_model *m, const char *name, int64_t cols, int64_t rows, int64_t n,
                                      quill_weight *w, quill_error *err) {
    return bind_tensor(m, name, cols, rows, n, w, err);
}

/* A small tensor [rows][cols] dequantized to floats at load. */
quill_status quill_model_floats(quill_model *m, const char *name, int64_t cols, int64_t rows, float **out,
                                quill_error *err) {
    quill_weight w;
    quill_status s = bind_tensor(m, name, cols, rows, 0, &w, err);
    if (s) return s;
    *out = malloc((size_t)(cols * rows) * sizeof **out);
    if (!*out) return quill_fail(err, QUILL_E_NOMEM, "out of memory loading '%s'", name);
    for (int64_t r = 0; r < rows && !s; r++) s = quill_dequantize(w.type, w.data + (size_t)r * w.row_bytes, *out + r * cols, cols, err);
    return s;
}
