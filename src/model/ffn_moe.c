/* The mixture-of-experts feed-forward block, in the fast pass and in the float64 pass:
 *
 *   logits = Wrouter · h (+ b)                             (ffn_gate_inp: [n_expert][n_embd])
 *   chosen experts and weights = route(logits)             (the architecture's gating, below)
 *   f = Σ_k weight_k · (act(h·Wgate[e_k] + bg) · (h·Wup[e_k] + bu) · Wdown[e_k] + bd), k in the
 *       chosen order (the expert biases: gpt-oss)
 *   f += sigmoid(w_shexp · h) · ((act(h·Wgate_shexp) · (h·Wup_shexp)) · Wdown_shexp)
 *       (with a shared expert: qwen2moe)
 *   (Nemotron-H's experts and shared expert have no gate: relu(h·Wup)² · Wdown)
 *
 * The fast pass groups a micro-batch's tokens by expert: each chosen expert's rows are read once
 * for all the tokens that chose it (gathered into one small product), instead of once per token.
 * A token's routing depends on its own logits only, every (row, token) result of a product is
 * independent of the other tokens in it (kernels.h), and a token's outputs are summed in its own
 * slot order, so its bits do not depend on the batch, the thread count or the other sequences. */
#include "model/forward.h"
#include "base/error.h"
#include "base/exp_poly.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The reference clamps the sum of the chosen weights at the smallest normal f16 before dividing. */
#define MIN_WEIGHT_SUM 6.103515625e-5

/* The n best of score[0..n) into best[], highest first (the lower index first on ties; a NaN is never
 * chosen over a number; all NaN: the lowest free index). */
static void top_k(const double *score, int64_t n, int64_t k, int32_t *best_of) {
    for (int64_t i = 0; i < k; i++) {
        int64_t best = -1;
        for (int64_t e = 0; e < n; e++) {
            bool taken = false;
            for (int64_t j = 0; j < i && !taken; j++) taken = best_of[j] == e;
            if (!taken && (best < 0 || score[e] > score[best] || (isnan(score[best]) && !isnan(score[e])))) best = e;
        }
        best_of[i] = (int32_t)best;
    }
}

/* One token's routing, shared by both passes: from its router logits [n_expert] (replaced by the
 * probabilities the gating computes over all experts: softmax or sigmoid, or the logits themselves
 * when the softmax is over the chosen ones), the k chosen experts, highest first (the lower index
 * first on ties), and their weights. The selection bias (exp_probs_b) and the expert groups choose the
 * experts; the probabilities weight them. */
static void route(const quill_model *m, const quill_layer *L, double *logits, int64_t n_expert, int64_t k,
                  int32_t *expert, double *weight) {
    const quill_arch_params *ap = &m->ap;
    if (ap->gating == QUILL_GATING_SOFTMAX) {
        double max = -INFINITY, sum = 0;
        for (int64_t e = 0; e < n_expert; e++) max = logits[e] > max ? logits[e] : max;
        for (int64_t e = 0; e < n_expert; e++) sum += logits[e] = exp_f64(logits[e] - max);
        for (int64_t e = 0; e < n_expert; e++) logits[e] /= sum;
    } else if (ap->gating == QUILL_GATING_SIGMOID) {
        for (int64_t e = 0; e < n_expert; e++) logits[e] = 1.0 / (1.0 + exp_f64(-logits[e]));
    }
    double select[QUILL_MAX_EXPERTS];
    for (int64_t e = 0; e < n_expert; e++) select[e] = L->probs_bias ? logits[e] + L->probs_bias[e] : logits[e];
    if (ap->n_group > 1) {
        /* the n_group_used groups whose two best scores sum highest keep their experts */
        const int64_t per = n_expert / ap->n_group;
        double group_score[QUILL_MAX_EXPERTS];
        int32_t two[2], kept[QUILL_MAX_EXPERTS];
        for (int64_t g = 0; g < ap->n_group; g++) {
            top_k(select + g * per, per, 2, two);
            group_score[g] = select[g * per + two[0]] + select[g * per + two[1]];
        }
        top_k(group_score, ap->n_group, ap->n_group_used, kept);
        for (int64_t g = 0; g < ap->n_group; g++) {
            bool keep = false;
            for (int64_t j = 0; j < ap->n_group_used && !keep; j++) keep = kept[j] == g;
            for (int64_t e = 0; !keep && e < per; e++) select[g * per + e] = -INFINITY;
        }
    }
    top_k(select, n_expert, k, expert);
    for (int64_t i = 0; i < k; i++) weight[i] = logits[expert[i]];
    if (ap->gating == QUILL_GATING_TOP_K_SOFTMAX) {
        double max = weight[0], sum = 0;
        for (int64_t i = 0; i < k; i++) sum += weight[i] = exp_f64(weight[i] - max);
        for (int64_t i = 0; i < k; i++) weight[i] /= sum;
    }
    if (ap->norm_w) {
        double sum = 0;
        for (int64_t i = 0; i < k; i++) sum += weight[i];
        if (!(sum >= MIN_WEIGHT_SUM)) sum = MIN_WEIGHT_SUM;
        for (int64_t i = 0; i < k; i++) weight[i] /= sum;
    }
    if (ap->w_scale != 0 && ap->w_scale != 1)
        for (int64_t i = 0; i < k; i++) weight[i] *= ap->w_scale;
    /* (a weight that would be a subnormal float is 0 on every device: a GPU may flush them) */
    for (int64_t i = 0; i < k; i++)
        if (fabs(weight[i]) < 0x1p-126) weight[i] = 0;
}

/* The name of the chosen weights' last step in the reference's traces. */
static const char *weights_name(const quill_arch_params *ap) {
    if (ap->w_scale != 0 && ap->w_scale != 1) return "ffn_moe_weights_scaled";
    if (ap->norm_w) return "ffn_moe_weights_norm";
    return ap->gating == QUILL_GATING_TOP_K_SOFTMAX ? "ffn_moe_weights_softmax" : "ffn_moe_weights";
}

/* ---------------------------------------------------------------- fast pass */

/* x[r][i] += bias[i] for each of `rows` rows of n */
static void add_row(float *x, const float *bias, int64_t n, int rows) {
    for (int r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) x[(size_t)r * n + i] += bias[i];
}

static void moe_announce(const quill_context *c, const quill_layer *L, int n_tok) {
    quill_announce(c, (const quill_weight *[]){&L->w_router}, 1, n_tok);
}

/* g = relu(u)² over n: Nemotron-H's experts without a gate */
static void relu2(float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        const float v = u[i] > 0.0f ? u[i] : 0.0f;
        g[i] = v * v;
    }
}

/* Per token, in parallel over tokens: out[t] = Σ_k w[t][k] · y[t][k], in slot order. */
typedef struct {
    const quill_context *c;
    float *out;
} weighted_sum_job;

static void weighted_sum_rows(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const weighted_sum_job *j = arg;
    const quill_context *c = j->c;
    const int64_t d = c->hp->n_embd, k = c->model->ap.n_expert_used;
    for (int64_t t = t0; t < t1; t++) {
        float *out = j->out + t * d;
        for (int64_t s = 0; s < k; s++) {
            const float w = c->moe_weight[t * k + s], *y = c->moe_out + (t * k + s) * d;
            if (s == 0)
                for (int64_t i = 0; i < d; i++) out[i] = y[i] * w;
            else
                for (int64_t i = 0; i < d; i++) out[i] += y[i] * w;
        }
    }
}

/* The shared expert of every token of the micro-batch (its input still in c->xb), into c->moe_in,
 * and its gates into c->moe_shared_gate. */
static void shared_expert(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    const int64_t d = c->hp->n_embd, ff = L->w_up_shexp.rows;
    /* (ungated without ffn_gate_inp_shexp: DeepSeek, GLM-4.5) */
    for (int t = 0; t < n_tok; t++) {
        double dot = 0;
        if (L->shexp_gate) c->kern->dot_f64(L->shexp_gate, 0, 1, c->xb + (size_t)t * d, d, &dot);
        c->moe_shared_gate[t] = L->shexp_gate ? (float)(1.0 / (1.0 + exp_f64(-dot))) : 1.0f;
    }
    if (L->shexp_gate) quill_trace(c, "ffn_shexp_gate", layer, c->moe_shared_gate, 2, 1, n_tok, 1);
    quill_announce(c, (const quill_weight *[]){&L->w_down_shexp}, 1, n_tok);
    if (!L->w_gate_shexp.data) {
        /* relu(up)², no gate (Nemotron-H) */
        quill_matmul(c, &L->w_up_shexp, c->xb, n_tok, c->ffn_up);
        relu2(c->ffn_gate, c->ffn_up, (int64_t)n_tok * L->w_up_shexp.rows);
    } else {
        quill_matmuls(c, (const quill_weight *[]){&L->w_gate_shexp, &L->w_up_shexp}, (float *[]){c->ffn_gate, c->ffn_up},
                      2, c->xb, n_tok);
        quill_gated_activation(c, c->ffn_gate, c->ffn_up, n_tok, ff);
    }
    quill_matmul(c, &L->w_down_shexp, c->ffn_gate, n_tok, c->moe_in);
    quill_trace(c, "ffn_shexp", layer, c->moe_in, 2, d, n_tok, 1);
}

/* The FFN of expert e for its (token, slot) pairs [0, m): out[pair] = down(act(gate(x) · up(x))),
 * with in [m][n_embd], g and u [m][n_ff_exp] as room. Over the pool (scratch NULL: decoding, a few
 * experts, each product split over the threads), or on the calling thread with the kernel's
 * `scratch` (prompts: whole experts per thread, below). */
static void expert_ffn(quill_context *c, const quill_layer *L, int64_t e, const int32_t *pairs, int m, float *in,
                       float *g, float *u, void *scratch, int thread) {
    const int64_t k = c->model->ap.n_expert_used, d = c->hp->n_embd, ff = c->model->ap.n_ff_exp;
    for (int i = 0; i < m; i++)
        memcpy(in + (size_t)i * d, c->xb + (size_t)(pairs[i] / k) * d, (size_t)d * sizeof(float));
    /* (no gate: relu(up)², Nemotron-H) */
    const bool gated = L->w_gate.data != NULL;
    const quill_weight up = quill_weight_expert(&L->w_up, e), gate = gated ? quill_weight_expert(&L->w_gate, e) : up;
    const quill_weight down = quill_weight_expert(&L->w_down, e);
    const quill_weight *gate_up[] = {&gate, &up}, *down_only[] = {&down};
    if (scratch) {
        quill_matmuls_here(c, gate_up + !gated, (float *[]){g, u} + !gated, 2 - !gated, in, m, scratch, thread);
    } else {
        quill_announce(c, down_only, 1, m);
        quill_matmuls(c, gate_up + !gated, (float *[]){g, u} + !gated, 2 - !gated, in, m);
    }
    if (L->gate_exps_bias) add_row(g, L->gate_exps_bias + e * ff, ff, m);
    if (L->up_exps_bias) add_row(u, L->up_exps_bias + e * ff, ff, m);
    if (!gated) relu2(g, u, (int64_t)m * ff);
    else if (scratch) quill_gated_activation_here(c, g, u, m, ff);
    else quill_gated_activation(c, g, u, m, ff);
    if (scratch) quill_matmuls_here(c, down_only, (float *[]){in}, 1, g, m, scratch, thread);
    else quill_matmul(c, &down, g, m, in);
    if (L->down_exps_bias) add_row(in, L->down_exps_bias + e * d, d, m);
    for (int i = 0; i < m; i++)
        memcpy(c->moe_out + (size_t)pairs[i] * d, in + (size_t)i * d, (size_t)d * sizeof(float));
}

/* Prompts: one item per expert, each thread running whole experts with its own scratch
 * (QUILL_EXPERT_TOKENS tokens at a time). With 256 experts and ~2 tokens each in a micro-batch,
 * three parallel products per expert were ~750 waits per layer, and each product's last tiles left
 * a thread idle (2 threads: the second thread spun 15 % of a prompt); one loop over the experts has
 * one wait. A (row, token) product does not depend on the tokens beside it or on the thread
 * (kernels.h), so the bits are the same. */
typedef struct {
    quill_context *c;
    const quill_layer *L;
} experts_job;

static void expert_items(void *arg, int64_t e0, int64_t e1, int thread) {
    const experts_job *j = arg;
    quill_context *c = j->c;
    const size_t et = QUILL_EXPERT_TOKENS, d = (size_t)c->hp->n_embd, ff = (size_t)c->model->ap.n_ff_exp;
    uint8_t *mine = c->expert_scratch + (size_t)thread * c->expert_scratch_bytes;
    float *in = (float *)mine, *g = (float *)(mine + quill_expert_part(et * d));
    float *u = (float *)((uint8_t *)g + quill_expert_part(et * ff));
    void *scratch = (uint8_t *)u + quill_expert_part(et * ff);
    for (int64_t e = e0; e < e1; e++)
        for (int p0 = c->moe_start[e]; p0 < c->moe_start[e + 1]; p0 += (int)et) {
            const int m = c->moe_start[e + 1] - p0 < (int)et ? c->moe_start[e + 1] - p0 : (int)et;
            expert_ffn(c, j->L, e, c->moe_pairs + p0, m, in, g, u, scratch, thread);
        }
}

/* The router's logits [token][expert] in float64 (kernels.h's dot_f64: the same bits on every kernel
 * set and on the GPU, and no rounding of their own in the choice of experts), over the pool by
 * experts. A router stored in another type than f32 is decoded a row at a time into the thread's
 * scratch. */
typedef struct {
    quill_context *c;
    const quill_layer *L;
    int n_tok;
} router_job;

static void router_rows(void *arg, int64_t e0, int64_t e1, int thread) {
    const router_job *j = arg;
    quill_context *c = j->c;
    const quill_weight *w = &j->L->w_router;
    const int64_t d = c->hp->n_embd, n_expert = c->model->ap.n_expert;
    if (w->type == QUILL_TYPE_F32) {
        for (int t = 0; t < j->n_tok; t++)
            c->kern->dot_f64((const float *)(w->data + (size_t)e0 * w->row_bytes), (int64_t)(w->row_bytes / sizeof(float)),
                             (int)(e1 - e0), c->xb + (size_t)t * d, d, c->moe_router + (size_t)t * n_expert + e0);
        return;
    }
    float *row = c->thread_scratch + (size_t)thread * c->thread_scratch_len;
    for (int64_t e = e0; e < e1; e++) {
        quill_kernels_dequant(c->kern, w->type)(w->data + (size_t)e * w->row_bytes, row, d);
        for (int t = 0; t < j->n_tok; t++)
            c->kern->dot_f64(row, 0, 1, c->xb + (size_t)t * d, d, c->moe_router + (size_t)t * n_expert + e);
    }
}

static void moe_fast(quill_context *c, const quill_layer *L, int layer, int n_tok) {
    /* (a layer placed on the Vulkan device whose mixer runs here: its FFN there, the same bits) */
    if (quill_gpu_moe_ffn(c, L, n_tok)) {
        quill_announce_next_layer(c, layer, n_tok);
        return;
    }
    const quill_arch_params *ap = &c->model->ap;
    const int64_t n_expert = ap->n_expert, k = ap->n_expert_used, d = c->hp->n_embd;
    router_job rj = {c, L, n_tok};
    quill_pool_run(c->pool, router_rows, &rj, n_expert, 4);
    double *router = c->moe_router;
    for (int64_t i = 0; i < n_tok * n_expert; i++) c->moe_logits[i] = (float)router[i];
    quill_trace(c, "ffn_moe_logits", layer, c->moe_logits, 2, n_expert, n_tok, 1);
    if (L->router_bias) {
        for (int64_t i = 0; i < n_tok * n_expert; i++) c->moe_logits[i] = (float)(router[i] += L->router_bias[i % n_expert]);
        quill_trace(c, "ffn_moe_logits_biased", layer, c->moe_logits, 2, n_expert, n_tok, 1);
    }

    /* each token's experts, on this thread: n_expert · k steps a token, little beside the products */
    double weight[QUILL_MAX_EXPERTS];
    for (int t = 0; t < n_tok; t++) {
        float *row = c->moe_logits + (size_t)t * n_expert;
        double *logits = router + (size_t)t * n_expert;
        route(c->model, L, logits, n_expert, k, c->moe_expert + (size_t)t * k, weight);
        for (int64_t e = 0; e < n_expert; e++) row[e] = (float)logits[e];
        for (int64_t s = 0; s < k; s++) c->moe_weight[(size_t)t * k + s] = (float)weight[s];
    }
    quill_trace(c, "ffn_moe_probs", layer, c->moe_logits, 2, n_expert, n_tok, 1);
    quill_trace(c, weights_name(ap), layer, c->moe_weight, 3, 1, k, n_tok);

    /* the (token, slot) pairs grouped by expert, in token order within an expert */
    int32_t *start = c->moe_start;
    memset(start, 0, (size_t)(n_expert + 1) * sizeof *start);
    for (int64_t p = 0; p < n_tok * k; p++) start[c->moe_expert[p] + 1]++;
    for (int64_t e = 0; e < n_expert; e++) start[e + 1] += start[e];
    for (int64_t p = 0; p < n_tok * k; p++) c->moe_pairs[start[c->moe_expert[p]]++] = (int32_t)p;
    for (int64_t e = n_expert; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;

    /* (whole experts per thread need enough of them to share out: Mixtral's 8 on 16 threads
     * would leave half the threads idle) */
    int active = 0;
    for (int64_t e = 0; e < n_expert; e++) active += start[e + 1] > start[e];
    if (n_tok > 1 && active >= 4 * c->n_threads) {
        experts_job j = {c, L};
        quill_pool_run(c->pool, expert_items, &j, n_expert, 1);
    } else {
        for (int64_t e = 0; e < n_expert; e++)
            if (start[e + 1] > start[e])
                expert_ffn(c, L, e, c->moe_pairs + start[e], start[e + 1] - start[e], c->moe_in, c->ffn_gate,
                           c->ffn_up, NULL, 0);
    }
    quill_trace(c, "ffn_moe_down", layer, c->moe_out, 3, d, k, n_tok);
    if (L->ffn == QUILL_FFN_MOE_SHARED) shared_expert(c, L, layer, n_tok);
    quill_announce_next_layer(c, layer, n_tok);
    weighted_sum_job j = {c, c->xb};
    quill_pool_run(c->pool, weighted_sum_rows, &j, n_tok, 1);
    if (L->ffn == QUILL_FFN_MOE_SHARED) {
        quill_trace(c, "ffn_moe_out", layer, c->xb, 2, d, n_tok, 1);
        for (int t = 0; t < n_tok; t++)
            for (int64_t i = 0; i < d; i++)
                c->xb[(size_t)t * d + i] += c->moe_in[(size_t)t * d + i] * c->moe_shared_gate[t];
    }
}

/* ---------------------------------------------------------------- float64 pass */

static quill_status moe_exact(const quill_context *c, const quill_layer *L, int layer, const double *in, double *out,
                              quill_error *err) {
    const quill_arch_params *ap = &c->model->ap;
    const int64_t n_expert = ap->n_expert, k = ap->n_expert_used, d = c->hp->n_embd, ff = ap->n_ff_exp;
    const int64_t widest = ff > d ? ff : d;
    double *logits = malloc((size_t)n_expert * sizeof *logits), *weight = malloc((size_t)k * sizeof *weight);
    double *g = malloc((size_t)ff * sizeof *g), *u = malloc((size_t)ff * sizeof *u);
    double *y = malloc((size_t)(k * d) * sizeof *y);
    int32_t *expert = malloc((size_t)k * sizeof *expert);
    float *row = malloc((size_t)widest * sizeof *row);
    float *tmp = malloc((size_t)(k * d > n_expert ? k * d : n_expert) * sizeof *tmp);
    quill_status s = QUILL_OK;
    if (!logits || !weight || !g || !u || !y || !expert || !row || !tmp) {
        s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        goto done;
    }
    quill_ref_matvec(&L->w_router, in, logits, row);
    quill_ref_trace(c, "ffn_moe_logits", layer, logits, n_expert, 2, n_expert, 1, tmp);
    if (L->router_bias) {
        for (int64_t e = 0; e < n_expert; e++) logits[e] += L->router_bias[e];
        quill_ref_trace(c, "ffn_moe_logits_biased", layer, logits, n_expert, 2, n_expert, 1, tmp);
    }
    route(c->model, L, logits, n_expert, k, expert, weight);
    quill_ref_trace(c, "ffn_moe_probs", layer, logits, n_expert, 2, n_expert, 1, tmp);
    quill_ref_trace(c, weights_name(ap), layer, weight, k, 3, 1, k, tmp);
    for (int64_t i = 0; i < d; i++) out[i] = 0;
    for (int64_t s_ = 0; s_ < k; s_++) {
        const quill_weight up = quill_weight_expert(&L->w_up, expert[s_]);
        const quill_weight gate = L->w_gate.data ? quill_weight_expert(&L->w_gate, expert[s_]) : up;
        const quill_weight down = quill_weight_expert(&L->w_down, expert[s_]);
        if (L->w_gate.data) quill_ref_matvec(&gate, in, g, row);
        quill_ref_matvec(&up, in, u, row);
        for (int64_t i = 0; L->gate_exps_bias && i < ff; i++) g[i] += L->gate_exps_bias[expert[s_] * ff + i];
        for (int64_t i = 0; L->up_exps_bias && i < ff; i++) u[i] += L->up_exps_bias[expert[s_] * ff + i];
        if (L->w_gate.data) quill_ref_gated_activation(c, g, u, ff);
        else
            for (int64_t i = 0; i < ff; i++) g[i] = u[i] > 0 ? u[i] * u[i] : 0;
        quill_ref_matvec(&down, g, y + s_ * d, row);
        for (int64_t i = 0; L->down_exps_bias && i < d; i++) y[s_ * d + i] += L->down_exps_bias[expert[s_] * d + i];
        for (int64_t i = 0; i < d; i++) out[i] += weight[s_] * y[s_ * d + i];
    }
    quill_ref_trace(c, "ffn_moe_down", layer, y, k * d, 3, d, k, tmp);
    if (L->ffn == QUILL_FFN_MOE_SHARED) {
        quill_ref_trace(c, "ffn_moe_out", layer, out, d, 2, d, 1, tmp);
        const int64_t ff_sh = L->w_up_shexp.rows;
        double dot = 0, *gs = malloc((size_t)ff_sh * sizeof *gs), *us = malloc((size_t)ff_sh * sizeof *us);
        float *row_sh = malloc((size_t)(ff_sh > d ? ff_sh : d) * sizeof *row_sh);
        if (!gs || !us || !row_sh) {
            s = quill_fail(err, QUILL_E_NOMEM, "out of memory in the reference forward pass");
        } else {
            for (int64_t i = 0; L->shexp_gate && i < d; i++) dot += (double)L->shexp_gate[i] * in[i];
            const double gate = L->shexp_gate ? 1.0 / (1.0 + exp(-dot)) : 1.0;
            if (L->shexp_gate) quill_ref_trace(c, "ffn_shexp_gate", layer, &gate, 1, 2, 1, 1, tmp);
            quill_ref_matvec(&L->w_up_shexp, in, us, row_sh);
            if (L->w_gate_shexp.data) {
                quill_ref_matvec(&L->w_gate_shexp, in, gs, row_sh);
                quill_ref_gated_activation(c, gs, us, ff_sh);
            } else {
                for (int64_t i = 0; i < ff_sh; i++) gs[i] = us[i] > 0 ? us[i] * us[i] : 0;
            }
            quill_ref_matvec(&L->w_down_shexp, gs, y, row_sh);
            quill_ref_trace(c, "ffn_shexp", layer, y, d, 2, d, 1, tmp);
            for (int64_t i = 0; i < d; i++) out[i] += y[i] * gate;
        }
        free(gs), free(us), free(row_sh);
    }
done:
    free(logits);
    free(weight);
    free(g);
    free(u);
    free(y);
    free(expert);
    free(row);
    free(tmp);
    return s;
}

const quill_ffn_impl quill_ffn_moe = {moe_announce, moe_fast, moe_exact, "ffn_moe_out"};
/* (the routed experts' sum is traced as ffn_moe_out inside; the block's output with the shared
 * expert is ffn_out, as the reference names them) */
const quill_ffn_impl quill_ffn_moe_shared = {moe_announce, moe_fast, moe_exact, "ffn_out"};
