/* The float64 reference forward pass: the yardstick for the fast path and a user-facing
 * verification mode (--reference). Plain loops, one token at a time, every weight dequantized to
 * f32 exactly (as stored) and widened to double, every operation in double. It is meant to be
 * obviously right, not fast. */
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/recurrent.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* (weight NULL: no norm, out = x) */
static void ref_rmsnorm(double *out, const double *x, const float *weight, int64_t n, double eps) {
    if (!weight) {
        memmove(out, x, (size_t)n * sizeof *out);
        return;
    }
    double ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    double scale = 1.0 / sqrt(ss / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * scale * (double)weight[i];
}

/* RoPE in double on the first n_rot dims of each head: adjacent pairs or NeoX halves. */
static void ref_rope(const quill_context *c, int table, double *v, int64_t n_heads, int64_t hd, int pos) {
    const int64_t half = quill_rope_dims(c->model, table) / 2;
    const bool neox = c->model->arch->rope == QUILL_ROPE_NEOX;
    for (int64_t h = 0; h < n_heads; h++)
        for (int64_t i = 0; i < half; i++) {
            double theta = quill_rope_angle(c, table, pos, i);
            const double mscale = table ? c->model->ap.rope_attn_factor_local : c->model->ap.rope_attn_factor;
            double co = cos(theta) * mscale, s = sin(theta) * mscale;
            double *p0 = v + h * hd + (neox ? i : 2 * i), *p1 = neox ? p0 + half : p0 + 1;
            double x0 = *p0, x1 = *p1;
            *p0 = x0 * co - x1 * s;
            *p1 = x0 * s + x1 * co;
        }
}

/* LayerNorm without bias (Cohere) where the architecture has it, else the RMS norm */
static void ref_input_norm(const quill_arch *a, double *out, const double *x, const float *weight, int64_t n,
                           double eps) {
    if (!a->layer_norm || !weight) {
        ref_rmsnorm(out, x, weight, n, eps);
        return;
    }
    double mean = 0, var = 0;
    for (int64_t i = 0; i < n; i++) mean += x[i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) var += (x[i] - mean) * (x[i] - mean);
    const double scale = 1.0 / sqrt(var / (double)n + eps);
    for (int64_t i = 0; i < n; i++) out[i] = (x[i] - mean) * scale * (double)weight[i];
}

static void ref_rmsnorm_in_place(double *x, const float *weight, int64_t n, double eps) {
    ref_rmsnorm(x, x, weight, n, eps);
}

/* Hands a double vector to the trace callback as f32, one token at a time being appended. */
quill_status quill_reference_eval(quill_context *c, const int32_t *tokens, int n, float *logits,
                                  bool all_logits, quill_error *err) {
    const quill_model *m = c->model;
    const quill_hparams *hp = c->hp;
    const int64_t d = hp->n_embd, nv = hp->n_vocab;
    const int64_t q_dim = c->model->ap.widest_q, kv_dim = c->model->ap.widest_kv; /* (for the buffers) */
    int64_t widest = d > q_dim ? d : q_dim;
    if (nv > widest) widest = nv;
    double *x = malloc(d * sizeof *x), *xb = malloc(d * sizeof *xb), *q = malloc(q_dim * sizeof *q);
    double *k = malloc(kv_dim * sizeof *k), *v = malloc(kv_dim * sizeof *v), *att = malloc(q_dim * sizeof *att);
    double *o = malloc(d * sizeof *o), *qfull = malloc(2 * q_dim * sizeof *qfull);
    double *scores = malloc((size_t)c->n_ctx * sizeof *scores), *out = malloc(nv * sizeof *out);
    float *row = malloc((size_t)widest * sizeof *row), *tmp = malloc((size_t)widest * sizeof *tmp);
    double *slices = malloc(((size_t)(hp->n_layer * c->model->ap.n_embd_per_layer) + 1) * sizeof *slices);
    quill_status s = QUILL_OK;
    if (!x || !xb || !q || !k || !v || !att || !o || !qfull || !scores || !out || !row || !tmp || !slices) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    const quill_arch *arch = m->arch;
    const quill_arch_params *ap = &m->ap;
    const quill_type_traits *embd_tr = quill_type_traits_of(m->token_embd.type);
    for (int t = 0; t < n; t++) {
        const int pos = c->seq_len[0];
        embd_tr->to_float(m->token_embd.data + (size_t)tokens[t] * m->token_embd.row_bytes, row, d);
        for (int64_t i = 0; i < d; i++) x[i] = ap->embd_scale ? row[i] * (double)ap->embd_scale : row[i];
        quill_ref_trace(c, "inp_embd", -1, x, d, 2, d, 1, tmp);
        if (ap->n_embd_per_layer && (s = quill_per_layer_inputs_exact(c, tokens[t], x, slices, err))) goto done;
        for (int l = 0; l < hp->n_layer; l++) {
            const quill_layer *L = &m->layers[l];
            const int64_t hd = L->head_dim, q_dim = L->n_head * hd, kv_dim = L->n_head_kv * hd;
            const int64_t group = L->n_head_kv ? L->n_head / L->n_head_kv : 1; /* (0: a Mamba-2 or FFN-only layer) */
            ref_input_norm(arch, xb, x, L->attn_norm, d, hp->rms_eps);
            if (L->attn_norm) quill_ref_trace(c, "attn_norm", l, xb, d, 2, d, 1, tmp);
            if (L->ffn_only) {
                if ((s = quill_ffn_of(L->ffn)->exact(c, L, l, xb, o, err))) goto done;
            } else if (L->shortconv) {
                if ((s = quill_shortconv_exact(c, L, l, xb, o, err))) goto done;
            } else if (L->recurrent && arch->mamba2) {
                if ((s = quill_mamba_exact(c, L, l, xb, o, err))) goto done;
            } else if (L->recurrent) {
                if ((s = quill_deltanet_exact(c, L, l, xb, o, err))) goto done;
            } else if (L->mla) {
                if ((s = quill_mla_exact(c, L, l, xb, pos, o, err))) goto done;
            } else {
                /* gated attention: each head's query, then its output gate (kept in qfull) */
                quill_ref_matvec(&L->wq, xb, L->attn_gated ? qfull : q, row);
                for (int64_t h = 0; L->attn_gated && h < L->n_head; h++)
                    memcpy(q + h * hd, qfull + 2 * h * hd, (size_t)hd * sizeof *q);
                const bool own_kv = !L->kv_shared; /* (else the keys and values are layer kv_source's) */
                if (own_kv) quill_ref_matvec(&L->wk, xb, k, row);
                if (own_kv) quill_ref_matvec(L->v_from_k ? &L->wk : &L->wv, xb, v, row);
                if (arch->trace_projections) {
                    quill_ref_trace(c, "Qcur", l, q, q_dim, 3, hd, L->n_head, tmp);
                    if (own_kv) quill_ref_trace(c, "Kcur", l, k, kv_dim, 3, hd, L->n_head_kv, tmp);
                    if (own_kv) quill_ref_trace(c, "Vcur", l, v, kv_dim, 3, hd, L->n_head_kv, tmp);
                }
                for (int64_t i = 0; L->bq && i < q_dim; i++) q[i] += L->bq[i];
                for (int64_t i = 0; L->bk && i < kv_dim; i++) k[i] += L->bk[i];
                for (int64_t i = 0; L->bv && i < kv_dim; i++) v[i] += L->bv[i];
                if (L->q_norm && arch->qk_norm_full) {
                    ref_rmsnorm_in_place(q, L->q_norm, q_dim, hp->rms_eps);
                    ref_rmsnorm_in_place(k, L->k_norm, kv_dim, hp->rms_eps);
                } else if (L->q_norm) {
                    for (int64_t h = 0; h < L->n_head; h++) ref_rmsnorm_in_place(q + h * hd, L->q_norm, hd, hp->rms_eps);
                    for (int64_t h = 0; own_kv && h < L->n_head_kv; h++)
                        ref_rmsnorm_in_place(k + h * hd, L->k_norm, hd, hp->rms_eps);
                }
                for (int64_t h = 0; arch->v_norm && own_kv && h < L->n_head_kv; h++) {
                    double ss = 0;
                    for (int64_t i = 0; i < hd; i++) ss += v[h * hd + i] * v[h * hd + i];
                    for (int64_t i = 0; i < hd; i++) v[h * hd + i] /= sqrt(ss / (double)hd + hp->rms_eps);
                }
                if (!L->no_rope) {
                    ref_rope(c, L->rope_table, q, L->n_head, hd, pos);
                    if (own_kv) ref_rope(c, L->rope_table, k, L->n_head_kv, hd, pos);
                }
                if (arch->trace_projections) {
                    /* (traced before the norms and RoPE) */
                } else if (c->trace && arch->trace_q_scaled) {
                    for (int64_t i = 0; i < q_dim; i++) att[i] = q[i] * ap->attn_scale;
                    quill_ref_trace(c, "Qcur", l, att, q_dim, 3, hd, L->n_head, tmp);
                } else {
                    quill_ref_trace(c, "Qcur", l, q, q_dim, 3, hd, L->n_head, tmp);
                }
                if (!arch->trace_projections) {
                    quill_ref_trace(c, "Kcur", l, k, kv_dim, 3, hd, L->n_head_kv, tmp);
                    quill_ref_trace(c, "Vcur", l, v, kv_dim, 3, hd, L->n_head_kv, tmp);
                }
                double *kc = c->ref_k + quill_kv_at(c, L, 0, c->n_ctx);
                double *vc = c->ref_v + quill_kv_at(c, L, 0, c->n_ctx);
                if (own_kv) memcpy(kc + (size_t)pos * kv_dim, k, kv_dim * sizeof *k);
                if (own_kv) memcpy(vc + (size_t)pos * kv_dim, v, kv_dim * sizeof *v);
                /* a cache in another type than f32 holds each head's row rounded as the fast
                 * path stores it (kv_cache.c); f32 keeps the exact doubles */
                for (int64_t h = 0; own_kv && h < L->n_head_kv; h++) {
                    quill_kv_round_double(c->type_k, kc + (size_t)pos * kv_dim + h * hd, hd);
                    quill_kv_round_double(c->type_v, vc + (size_t)pos * kv_dim + h * hd, hd);
                }
                const int first = L->window && pos + 1 > L->window ? pos + 1 - (int)L->window : 0;
                for (int64_t h = 0; h < L->n_head; h++) {
                    const double *qh = q + h * hd;
                    int64_t kvh = h / group;
                    double max = -INFINITY, sum = 0;
                    for (int p = first; p <= pos; p++) {
                        const double *kp = kc + (size_t)p * kv_dim + kvh * hd;
                        double dot = 0;
                        for (int64_t i = 0; i < hd; i++) dot += qh[i] * kp[i];
                        dot = arch->gemma_query_scale || arch->multipliers || arch->unit_attn_scale ? dot * ap->attn_scale
                                                                                                 : dot / sqrt((double)hd);
                        dot *= quill_attn_temperature(ap, pos);
                        scores[p] = ap->attn_softcap > 0 ? ap->attn_softcap * tanh(dot / ap->attn_softcap) : dot;
                        if (scores[p] > max) max = scores[p];
                    }
                    if (L->sinks && L->sinks[h] > max) max = L->sinks[h];
                    for (int p = first; p <= pos; p++) sum += (scores[p] = exp(scores[p] - max));
                    if (L->sinks) sum += exp((double)L->sinks[h] - max);
                    double *ah = att + h * hd;
                    for (int64_t i = 0; i < hd; i++) ah[i] = 0;
                    for (int p = first; p <= pos; p++) {
                        const double *vp = vc + (size_t)p * kv_dim + kvh * hd;
                        for (int64_t i = 0; i < hd; i++) ah[i] += scores[p] / sum * vp[i];
                    }
                }
                quill_ref_trace(c, "kqv_out", l, att, q_dim, 2, q_dim, 1, tmp);
                for (int64_t h = 0; L->attn_gated && h < L->n_head; h++)
                    for (int64_t i = 0; i < hd; i++) att[h * hd + i] *= 1.0 / (1.0 + exp(-qfull[2 * h * hd + hd + i]));
                quill_ref_matvec(&L->wo, att, o, row);
                for (int64_t i = 0; L->bo && i < d; i++) o[i] += L->bo[i];
                if (!arch->trace_projections) quill_ref_trace(c, "attn_out", l, o, d, 2, d, 1, tmp);
            }
            const quill_ffn_impl *ffn = quill_ffn_of(L->ffn);
            if (arch->single_block) {
                if (L->ffn_only) quill_ref_trace(c, "ffn_out", l, o, d, 2, d, 1, tmp);
                if (L->ffn_only) quill_ref_trace(c, "l_out", l, o, d, 2, d, 1, tmp);
                for (int64_t i = 0; i < d; i++) x[i] += o[i];
                quill_ref_trace(c, "nemotron_h_block_out", l, x, d, 2, d, 1, tmp);
                continue;
            }
            if (arch->parallel_block) {
                /* the FFN reads attn_norm's output too; x + ffn + attention (att: q_dim = n_embd) */
                if ((s = ffn->exact(c, L, l, xb, att, err))) goto done;
                quill_ref_trace(c, ffn->out_name, l, att, d, 2, d, 1, tmp);
                for (int64_t i = 0; i < d; i++) x[i] = (x[i] + att[i]) + o[i];
                quill_ref_trace(c, "l_out", l, x, d, 2, d, 1, tmp);
                continue;
            }
            if (L->attn_post_norm) {
                ref_rmsnorm_in_place(o, L->attn_post_norm, d, hp->rms_eps);
                quill_ref_trace(c, "attn_post_norm", l, o, d, 2, d, 1, tmp);
            }
            for (int64_t i = 0; i < d; i++) x[i] += ap->residual_scale ? o[i] * ap->residual_scale : o[i];
            quill_ref_trace(c, arch->hybrid ? "attn_residual" : arch->trace_projections ? "attn_out" : "ffn_inp", l, x, d, 2,
                            d, 1, tmp);
            ref_rmsnorm(xb, x, L->ffn_norm, d, hp->rms_eps);
            if (L->ffn_norm) quill_ref_trace(c, arch->ffn_norm_post_attention ? "attn_post_norm" : "ffn_norm", l, xb, d, 2, d, 1, tmp);
            if ((s = ffn->exact(c, L, l, xb, o, err))) goto done;
            quill_ref_trace(c, ffn->out_name, l, o, d, 2, d, 1, tmp);
            if (L->ffn_post_norm) {
                ref_rmsnorm_in_place(o, L->ffn_post_norm, d, hp->rms_eps);
                quill_ref_trace(c, "ffn_post_norm", l, o, d, 2, d, 1, tmp);
            }
            for (int64_t i = 0; i < d; i++) x[i] += ap->residual_scale ? o[i] * ap->residual_scale : o[i];
            if (L->ple_gate.data && (s = quill_per_layer_inputs_exact_layer(c, L, l, slices, x, err))) goto done;
            for (int64_t i = 0; L->out_scale && i < d; i++) x[i] *= (double)*L->out_scale;
            quill_ref_trace(c, "l_out", l, x, d, 2, d, 1, tmp);
        }
        ref_input_norm(arch, xb, x, m->output_norm, d, hp->rms_eps);
        quill_ref_trace(c, "result_norm", -1, xb, d, 2, d, 1, tmp);
        if (logits && (all_logits || t == n - 1)) {
            quill_ref_matvec(&m->output, xb, out, row);
            float *dst = all_logits ? logits + (size_t)t * nv : logits;
            for (int64_t i = 0; ap->logit_multiplier && i < nv; i++) out[i] *= ap->logit_multiplier;
            for (int64_t i = 0; i < nv; i++)
                dst[i] = (float)(ap->final_softcap > 0 ? ap->final_softcap * tanh(out[i] / ap->final_softcap) : out[i]);
        }
        c->seq_len[0]++;
    }
done:
    free(x); free(xb); free(q); free(k); free(v); free(att); free(o); free(qfull);
    free(scores); free(out); free(row); free(tmp); free(slices);
    return s;
}
