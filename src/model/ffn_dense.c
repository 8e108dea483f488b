/* The dense feed-forward block, f = (act(h·Wgate + bgate) · (h·Wup + bup)) · Wdown + bdown, in the
 * fast pass and in the float64 pass (act: SiLU, or GELU-tanh for Gemma; the biases, Granite's, are
 * optional and mostly absent); without ffn_gate, f = relu(h·Wup + bup)² · Wdown + bdown (Nemotron-H). */
#include "model/forward.h"
#include "base/error.h"

#include <stdlib.h>

/* rows[t] += bias for each of n_tok rows of n */
static void add_bias_rows(float *rows, const float *bias, int n_tok, int64_t n) {
    if (!bias) return;
    for (int t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++) rows[(size_t)t * n + i] += bias[i];
}

static void add_bias_exact(double *v, const float *bias, int64_t n) {
    if (!bias) return;
    for (int64_t i = 0; i < n; i++) v[i] += bias[i];
}

static void dense_announce(const quill_context *c, const quill_layer *L, int n_tok) {
    if (!L->w_gate.data) quill_announce(c, (const quill_weight *[]){&L->w_up}, 1, n_tok);
    else quill_announce(c, (const quill_weight *[]){&L->w_gate, &L->w_up}, 2, n_tok);
}

/* Nemotron-H's FFN without a gate: f = relu(h·Wup + bup)² · Wdown + bdown */
static void ungated_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    const int64_t ff = L->w_up.rows;
    quill_announce(c, (const quill_weight *[]){&L->w_down}, 1, n_tok);
    quill_matmul(c, &L->w_up, c->xb, n_tok, c->ffn_up);
    quill_trace(c, "ffn_up", layer, c->ffn_up, 2, ff, n_tok, 1);
    add_bias_rows(c->ffn_up, L->b_up, n_tok, ff);
    for (int64_t i = 0; i < (int64_t)n_tok * ff; i++) {
        const float v = c->ffn_up[i] > 0.0f ? c->ffn_up[i] : 0.0f;
        c->ffn_up[i] = v * v;
    }
    quill_announce_next_layer(c, layer, n_tok);
    quill_matmul(c, &L->w_down, c->ffn_up, n_tok, c->xb);
    add_bias_rows(c->xb, L->b_down, n_tok, L->w_down.rows);
}

static void dense_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    if (!L->w_gate.data) {
        ungated_fast(c, L, layer, n_tok);
        return;
    }
    const int64_t ff = L->w_gate.rows;
    quill_announce(c, (const quill_weight *[]){&L->w_down}, 1, n_tok);
    quill_matmuls(c, (const quill_weight *[]){&L->w_gate, &L->w_up}, (float *[]){c->ffn_gate, c->ffn_up}, 2, c->xb,
                  n_tok);
    if (!c->model->arch->fused_gate_up) {
        quill_trace(c, "ffn_gate", layer, c->ffn_gate, 2, ff, n_tok, 1);
        quill_trace(c, "ffn_up", layer, c->ffn_up, 2, ff, n_tok, 1);
    }
    add_bias_rows(c->ffn_gate, L->b_gate, n_tok, ff);
    add_bias_rows(c->ffn_up, L->b_up, n_tok, ff);
    quill_gated_activation(c, c->ffn_gate, c->ffn_up, n_tok, ff);
    quill_announce_next_layer(c, layer, n_tok);
    quill_matmul(c, &L->w_down, c->ffn_gate, n_tok, c->xb);
    add_bias_rows(c->xb, L->b_down, n_tok, L->w_down.rows);
}

static quill_status dense_exact(const quill_context *c, const quill_layer *L, int layer, const double *in,
                                double *out, quill_error *err) {
    const int64_t ff = L->w_up.rows, d = L->w_up.cols;
    const int64_t widest = ff > d ? ff : d;
    double *g = malloc((size_t)ff * sizeof *g), *u = malloc((size_t)ff * sizeof *u);
    float *row = malloc((size_t)widest * sizeof *row), *tmp = malloc((size_t)ff * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!g || !u || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
    } else {
        quill_ref_matvec(&L->w_up, in, u, row);
        if (!L->w_gate.data) {
            /* relu(up)², no gate (Nemotron-H) */
            quill_ref_trace(c, "ffn_up", layer, u, ff, 2, ff, 1, tmp);
            add_bias_exact(u, L->b_up, ff);
            for (int64_t i = 0; i < ff; i++) g[i] = u[i] > 0 ? u[i] * u[i] : 0;
            quill_ref_matvec(&L->w_down, g, out, row);
            add_bias_exact(out, L->b_down, L->w_down.rows);
            goto done;
        }
        quill_ref_matvec(&L->w_gate, in, g, row);
        if (!c->model->arch->fused_gate_up) {
            quill_ref_trace(c, "ffn_gate", layer, g, ff, 2, ff, 1, tmp);
            quill_ref_trace(c, "ffn_up", layer, u, ff, 2, ff, 1, tmp);
        }
        add_bias_exact(g, L->b_gate, ff);
        add_bias_exact(u, L->b_up, ff);
        quill_ref_gated_activation(c, g, u, ff);
        quill_ref_matvec(&L->w_down, g, out, row);
        add_bias_exact(out, L->b_down, L->w_down.rows);
    }
done:
    free(g);
    free(u);
    free(row);
    free(tmp);
    return s;
}

const quill_ffn_impl quill_ffn_dense = {dense_announce, dense_fast, dense_exact, "ffn_out"};
