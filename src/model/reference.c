/* The float64 reference forward pass: the yardstick for the fast path and a user-facing
 * verification mode (--reference). Plain loops, one token at a time, every weight dequantized to
 * f32 exactly (as stored) and widened to double, every operation in double. It is meant to be
 * obviously right, not fast. */
#include "model/context.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* out[r] = Σ_i W[r][i]·x[i] in double. */
static void ref_matvec(const quill_weight *w, const double *x, double *out, float *row) {
    const quill_type_traits *tr = quill_type_traits_of(w->type);
    for (int64_t r = 0; r < w->rows; r++) {
        tr->to_float(w->data + (size_t)r * w->row_bytes, row, w->cols);
        double sum = 0;
        for (int64_t i = 0; i < w->cols; i++) sum += (double)row[i] * x[i];
        out[r] = sum;
    }
}

static void ref_rmsnorm(double *out, const double *x, const float *weight, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * (double)weight[i];
}

static void ref_rope(double *v, int64_t n_heads, int64_t hd, int64_t n_rot, double base, double scale, int pos) {
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < n_rot / 2; i++) {
            double theta = pos * scale * pow(base, -2.0 * (double)i / (double)n_rot);
            double c = cos(theta), s = sin(theta);
            double *p = v + h * hd + 2 * i;
            double x0 = p[0], x1 = p[1];
            p[0] = x0 * c - x1 * s;
            p[1] = x0 * s + x1 * c;
        }
}

/* Hands a double vector to the trace callback as f32, one token at a time being appended. */
static void ref_trace(const quill_context *c, const char *name, int layer, const double *v, int64_t n,
                      int n_dims, int64_t ne0, int64_t ne1, float *tmp) {
    if (!c->trace) return;
    char full[64];
    if (layer >= 0) snprintf(full, sizeof full, "%s-%d", name, layer);
    else snprintf(full, sizeof full, "%s", name);
    for (int64_t i = 0; i < n; i++) tmp[i] = (float)v[i];
    int64_t ne[3] = {ne0, ne1, 1};   /* one token: the token dimension is 1 */
    c->trace(full, tmp, n_dims, ne, c->trace_user);
}

quill_status quill_reference_eval(quill_context *c, const int32_t *tokens, int n, float *logits,
                                  bool all_logits, quill_error *err) {
    const quill_model *m = c->model;
    const quill_hparams *hp = c->hp;
    const int64_t d = hp->n_embd, hd = hp->head_dim, q_dim = hp->n_head * hd;
    const int64_t kv_dim = hp->n_head_kv * hd, ff = hp->n_ff, nv = hp->n_vocab;
    const int64_t group = hp->n_head / hp->n_head_kv;
    int64_t widest = d > q_dim ? d : q_dim;
    if (ff > widest) widest = ff;
    if (nv > widest) widest = nv;
    double *x = malloc(d * sizeof *x), *xb = malloc(d * sizeof *xb), *q = malloc(q_dim * sizeof *q);
    double *k = malloc(kv_dim * sizeof *k), *v = malloc(kv_dim * sizeof *v), *att = malloc(q_dim * sizeof *att);
    double *g = malloc(ff * sizeof *g), *u = malloc(ff * sizeof *u), *o = malloc(d * sizeof *o);
    double *scores = malloc((size_t)c->n_ctx * sizeof *scores), *out = malloc(nv * sizeof *out);
    float *row = malloc((size_t)widest * sizeof *row), *tmp = malloc((size_t)widest * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!x || !xb || !q || !k || !v || !att || !g || !u || !o || !scores || !out || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    const quill_type_traits *embd_tr = quill_type_traits_of(m->token_embd.type);
    for (int t = 0; t < n; t++) {
        const int pos = c->pos;
        embd_tr->to_float(m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes, row, d);
        for (int64_t i = 0; i < d; i++) x[i] = row[i];
        ref_trace(c, "inp_embd", -1, x, d, 2, d, 1, tmp);
        for (int l = 0; l < hp->n_layer; l++) {
            const quill_layer *L = &m->layers[l];
            ref_rmsnorm(xb, x, L->attn_norm, d, hp->rms_eps);
            ref_trace(c, "attn_norm", l, xb, d, 2, d, 1, tmp);
            ref_matvec(&L->wq, xb, q, row);
            ref_matvec(&L->wk, xb, k, row);
            ref_matvec(&L->wv, xb, v, row);
            ref_rope(q, hp->n_head, hd, hp->n_rot, hp->rope_base, hp->rope_freq_scale, pos);
            ref_rope(k, hp->n_head_kv, hd, hp->n_rot, hp->rope_base, hp->rope_freq_scale, pos);
            ref_trace(c, "Qcur", l, q, q_dim, 3, hd, hp->n_head, tmp);
            ref_trace(c, "Kcur", l, k, kv_dim, 3, hd, hp->n_head_kv, tmp);
            ref_trace(c, "Vcur", l, v, kv_dim, 2, kv_dim, 1, tmp);
            double *kc = c->ref_k + (size_t)l * c->n_ctx * kv_dim, *vc = c->ref_v + (size_t)l * c->n_ctx * kv_dim;
            memcpy(kc + (size_t)pos * kv_dim, k, kv_dim * sizeof *k);
            memcpy(vc + (size_t)pos * kv_dim, v, kv_dim * sizeof *v);
            for (int64_t h = 0; h < hp->n_head; h++) {
                const double *qh = q + h * hd;
                int64_t kvh = h / group;
                double max = -INFINITY, sum = 0;
                for (int p = 0; p <= pos; p++) {
                    const double *kp = kc + (size_t)p * kv_dim + kvh * hd;
                    double dot = 0;
                    for (int64_t i = 0; i < hd; i++) dot += qh[i] * kp[i];
                    scores[p] = dot / sqrt((double)hd);
                    if (scores[p] > max) max = scores[p];
                }
                for (int p = 0; p <= pos; p++) sum += (scores[p] = exp(scores[p] - max));
                double *ah = att + h * hd;
                for (int64_t i = 0; i < hd; i++) ah[i] = 0;
                for (int p = 0; p <= pos; p++) {
                    const double *vp = vc + (size_t)p * kv_dim + kvh * hd;
                    for (int64_t i = 0; i < hd; i++) ah[i] += scores[p] / sum * vp[i];
                }
            }
            ref_trace(c, "kqv_merged_cont", l, att, q_dim, 2, q_dim, 1, tmp);
            ref_matvec(&L->wo, att, o, row);
            ref_trace(c, "kqv_out", l, o, d, 2, d, 1, tmp);
            for (int64_t i = 0; i < d; i++) x[i] += o[i];
            ref_trace(c, "ffn_inp", l, x, d, 2, d, 1, tmp);
            ref_rmsnorm(xb, x, L->ffn_norm, d, hp->rms_eps);
            ref_trace(c, "ffn_norm", l, xb, d, 2, d, 1, tmp);
            ref_matvec(&L->w_gate, xb, g, row);
            ref_matvec(&L->w_up, xb, u, row);
            for (int64_t i = 0; i < ff; i++) g[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
            ref_matvec(&L->w_down, g, o, row);
            ref_trace(c, "ffn_out", l, o, d, 2, d, 1, tmp);
            for (int64_t i = 0; i < d; i++) x[i] += o[i];
            ref_trace(c, "l_out", l, x, d, 2, d, 1, tmp);
        }
        ref_rmsnorm(xb, x, m->output_norm, d, hp->rms_eps);
        ref_trace(c, "result_norm", -1, xb, d, 2, d, 1, tmp);
        if (logits && (all_logits || t == n - 1)) {
            ref_matvec(&m->output, xb, out, row);
            float *dst = all_logits ? logits + (size_t)t * nv : logits;
            for (int64_t i = 0; i < nv; i++) dst[i] = (float)out[i];
        }
        c->pos++;
    }
done:
    free(x); free(xb); free(q); free(k); free(v); free(att); free(g); free(u); free(o);
    free(scores); free(out); free(row); free(tmp);
    return s;
}
