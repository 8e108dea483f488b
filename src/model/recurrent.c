/* The recurrent state of the hybrid architectures' DeltaNet or Mamba-2 layers, per sequence: its memory, its
 * checkpoints, and going back to an earlier position (recurrent.h says how). */
#include "model/recurrent.h"
#include "base/error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t conv_elems(const quill_model *m) { return (m->ap.ssm_kernel - 1) * m->ap.ssm_conv_dim; }
/* (a DeltaNet head's state is [state][state]; Mamba-2's whole d_inner rows of [state]) */
static int64_t ssm_elems(const quill_model *m) {
    return (m->arch->mamba2 ? m->ap.ssm_inner : m->ap.ssm_v_heads * m->ap.ssm_state) * m->ap.ssm_state;
}

/* Mamba-2's ssm_in rows: z, xBC, dt */
static int64_t mamba_proj(const quill_model *m) { return m->ap.ssm_inner + m->ap.ssm_conv_dim + m->ap.ssm_v_heads; }

static int count_recurrent(const quill_model *m) {
    int n = 0;
    for (int64_t l = 0; l < m->hp.n_layer; l++) n += m->layers[l].recurrent;
    return n;
}

/* The fast path's scratch per micro-batch, in floats. */
static size_t scratch_floats(const quill_model *m) {
    const quill_arch_params *ap = &m->ap;
    /* Mamba-2: the conv channels (mixed), ssm_in's rows [z | xBC | dt] (qkvz), y (out) */
    if (m->arch->mamba2)
        return (size_t)quill_model_ubatch(m) * (size_t)(ap->ssm_conv_dim + mamba_proj(m) + ap->ssm_inner);
    const size_t value_dim = (size_t)(ap->ssm_state * ap->ssm_v_heads), q_dim = (size_t)(m->hp.n_head * m->hp.head_dim);
    const size_t shortconv = m->arch->shortconv ? 4 * (size_t)m->hp.n_embd : 0;
    return (size_t)quill_model_ubatch(m) *
           (2 * (size_t)ap->ssm_conv_dim + 3 * value_dim + 4 * (size_t)ap->ssm_v_heads + 3 * q_dim + shortconv);
}

double quill_recurrent_bytes(const quill_model *m, int n_seq, int n_ctx, bool reference) {
    if (!quill_arch_stateful(m->arch)) return 0;
    const double elem = reference ? sizeof(double) : sizeof(float);
    const double seq = (double)count_recurrent(m) * (double)(conv_elems(m) + ssm_elems(m)) * elem;
    return (double)n_seq * (seq * (1 + QUILL_CHECKPOINTS) + (double)n_ctx * sizeof(int32_t)) +
           (reference ? 0 : (double)scratch_floats(m) * sizeof(float));
}

bool quill_recurrent_new(quill_context *c) {
    const quill_model *m = c->model;
    quill_recurrent *r = calloc(1, sizeof *r);
    if (!r) return false;
    c->rec = r;
    r->n_rec = count_recurrent(m);
    r->conv_elems = conv_elems(m);
    r->ssm_elems = ssm_elems(m);
    r->elem = c->reference ? sizeof(double) : sizeof(float);
    r->seq_bytes = (size_t)r->n_rec * (size_t)(r->conv_elems + r->ssm_elems) * r->elem;
    r->rec_index = malloc((size_t)m->hp.n_layer * sizeof *r->rec_index);
    r->state = calloc((size_t)c->n_seq, r->seq_bytes ? r->seq_bytes : 1);
    r->ckpt = calloc((size_t)c->n_seq * QUILL_CHECKPOINTS, sizeof *r->ckpt);
    r->last_ckpt = calloc((size_t)c->n_seq, sizeof *r->last_ckpt);
    r->tokens = calloc((size_t)c->n_seq * (size_t)c->n_ctx, sizeof *r->tokens);
    if (!r->rec_index || !r->state || !r->ckpt || !r->last_ckpt || !r->tokens) return false;
    for (int64_t l = 0, i = 0; l < m->hp.n_layer; l++) r->rec_index[l] = m->layers[l].recurrent ? (int)i++ : -1;
    for (int i = 0; i < c->n_seq * QUILL_CHECKPOINTS; i++) r->ckpt[i].pos = -1;
    r->bytes = (size_t)c->n_seq * (r->seq_bytes + (size_t)c->n_ctx * sizeof(int32_t));
    if (!c->reference && m->arch->mamba2) {
        const quill_arch_params *ap = &m->ap;
        const size_t ub = (size_t)quill_model_ubatch(m);
        float *f = malloc(scratch_floats(m) * sizeof(float));
        if (!f) return false;
        r->mixed = f;
        r->qkvz = r->mixed + ub * (size_t)ap->ssm_conv_dim;
        r->out = r->qkvz + ub * (size_t)mamba_proj(m);
        r->bytes += scratch_floats(m) * sizeof(float);
    } else if (!c->reference) {
        const quill_arch_params *ap = &m->ap;
        const size_t ub = (size_t)quill_model_ubatch(m), value_dim = (size_t)(ap->ssm_state * ap->ssm_v_heads);
        const size_t q_dim = (size_t)(m->hp.n_head * m->hp.head_dim), heads = (size_t)ap->ssm_v_heads;
        float *f = malloc(scratch_floats(m) * sizeof(float));
        if (!f) return false;
        r->mixed = f;
        r->z = r->mixed + ub * (size_t)ap->ssm_conv_dim;
        r->out = r->z + ub * value_dim;
        r->beta = r->out + ub * value_dim;
        r->alpha = r->beta + ub * heads;
        r->qfull = r->alpha + ub * heads;
        r->gate = r->qfull + ub * 2 * q_dim;
        r->qkvz = r->gate + ub * q_dim;
        r->decay = r->qkvz + ub * ((size_t)ap->ssm_conv_dim + value_dim);
        r->gate_beta = r->decay + ub * heads;
        r->bcx = r->gate_beta + ub * heads;
        r->conv_y = r->bcx + ub * 3 * (size_t)m->hp.n_embd;
        r->bytes += scratch_floats(m) * sizeof(float);
    }
    return true;
}

void quill_recurrent_free(quill_context *c) {
    quill_recurrent *r = c->rec;
    if (!r) return;
    if (r->ckpt)
        for (int i = 0; i < c->n_seq * QUILL_CHECKPOINTS; i++) free(r->ckpt[i].state);
    free(r->rec_index);
    free(r->state);
    free(r->ckpt);
    free(r->last_ckpt);
    free(r->tokens);
    free(r->mixed);
    free(r);
    c->rec = NULL;
}

static uint8_t *seq_state(const quill_context *c, int seq) { return c->rec->state + (size_t)seq * c->rec->seq_bytes; }

void *quill_recurrent_conv(const quill_context *c, int seq, int layer) {
    const quill_recurrent *r = c->rec;
    return seq_state(c, seq) + (size_t)r->rec_index[layer] * (size_t)r->conv_elems * r->elem;
}

void *quill_recurrent_ssm(const quill_context *c, int seq, int layer) {
    const quill_recurrent *r = c->rec;
    return seq_state(c, seq) + (size_t)r->n_rec * (size_t)r->conv_elems * r->elem +
           (size_t)r->rec_index[layer] * (size_t)r->ssm_elems * r->elem;
}

/* Copies sequence seq's state into a checkpoint at pos, in the slot of the oldest one (or a free
 * one); without memory for it, none is taken (going back then evaluates more again). */
static void take_checkpoint(quill_context *c, int seq, int pos) {
    quill_recurrent *r = c->rec;
    quill_checkpoint *slots = r->ckpt + (size_t)seq * QUILL_CHECKPOINTS, *slot = &slots[0];
    for (int i = 1; i < QUILL_CHECKPOINTS && slot->pos != pos; i++)
        if (slots[i].pos == pos || slots[i].pos < slot->pos) slot = &slots[i];
    if (!slot->state && !(slot->state = malloc(r->seq_bytes ? r->seq_bytes : 1))) return;
    memcpy(slot->state, seq_state(c, seq), r->seq_bytes);
    slot->pos = pos;
    r->last_ckpt[seq] = pos;
}

void quill_recurrent_after_ubatch(quill_context *c, const int32_t *tokens, const int32_t *seq, const int32_t *pos,
                                  int n) {
    quill_recurrent *r = c->rec;
    for (int t = 0; t < n; t++) r->tokens[(size_t)seq[t] * c->n_ctx + pos[t]] = tokens[t];
    /* at the end of each sequence's run in the batch: after a prompt's piece (more than one
     * token), and every QUILL_CHECKPOINT_EVERY positions of generation */
    for (int t = 0; t < n; t++) {
        bool last = true, several = false;
        for (int u = 0; u < n; u++) {
            if (u != t && seq[u] == seq[t]) several = true;
            if (u > t && seq[u] == seq[t]) last = false;
        }
        const int end = pos[t] + 1;
        if (last && (several || end - r->last_ckpt[seq[t]] >= QUILL_CHECKPOINT_EVERY)) take_checkpoint(c, seq[t], end);
    }
}

/* Restores seq's newest checkpoint at or before pos (the empty state when none), drops those after
 * pos, and returns the restored position. */
static int restore(quill_context *c, int seq, int pos) {
    quill_recurrent *r = c->rec;
    quill_checkpoint *slots = r->ckpt + (size_t)seq * QUILL_CHECKPOINTS, *best = NULL;
    for (int i = 0; i < QUILL_CHECKPOINTS; i++) {
        if (slots[i].pos > pos) slots[i].pos = -1;
        else if (slots[i].pos >= 0 && (!best || slots[i].pos > best->pos)) best = &slots[i];
    }
    r->last_ckpt[seq] = best ? best->pos : 0;
    if (best) memcpy(seq_state(c, seq), best->state, r->seq_bytes);
    else memset(seq_state(c, seq), 0, r->seq_bytes);
    return best ? best->pos : 0;
}

const int32_t *quill_recurrent_tokens(const quill_context *c, int seq) {
    return c->rec->tokens + (size_t)seq * c->n_ctx;
}

int quill_recurrent_rewind(quill_context *c, int seq, int pos) {
    if (pos >= c->seq_len[seq]) return c->seq_len[seq];
    return c->seq_len[seq] = restore(c, seq, pos);
}

int quill_recurrent_copy_prefix(quill_context *c, int src, int dst, int n) {
    quill_recurrent *r = c->rec;
    if (src == dst) return quill_recurrent_rewind(c, dst, n);
    memcpy(r->tokens + (size_t)dst * c->n_ctx, r->tokens + (size_t)src * c->n_ctx, (size_t)n * sizeof *r->tokens);
    quill_checkpoint *from = r->ckpt + (size_t)src * QUILL_CHECKPOINTS, *to = r->ckpt + (size_t)dst * QUILL_CHECKPOINTS;
    for (int i = 0; i < QUILL_CHECKPOINTS; i++) to[i].pos = -1;
    for (int i = 0; i < QUILL_CHECKPOINTS; i++) {
        if (from[i].pos < 0 || from[i].pos > n) continue;
        if (!to[i].state && !(to[i].state = malloc(r->seq_bytes ? r->seq_bytes : 1))) continue;
        memcpy(to[i].state, from[i].state, r->seq_bytes);
        to[i].pos = from[i].pos;
    }
    if (n == c->seq_len[src]) {
        memcpy(seq_state(c, dst), seq_state(c, src), r->seq_bytes);
        r->last_ckpt[dst] = r->last_ckpt[src];
        c->seq_len[dst] = n;
        return n;
    }
    return c->seq_len[dst] = restore(c, dst, n);
}

/* (recurrent.h) */
quill_status quill_ssm_size(const quill_gguf *g, const char *arch, const char *suffix, int64_t lo, int64_t hi,
                            int64_t *out, quill_error *err) {
    char key[128];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    quill_status s = quill_gguf_get_i64(g, key, out, err);
    if (s == QUILL_E_NOT_FOUND)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s is missing (a %s model needs it)", quill_gguf_path(g),
                          key, arch);
    if (s) return s;
    if (*out < lo || *out > hi)
        return quill_fail(err, QUILL_E_FORMAT, "%s: metadata %s = %lld is out of range (%lld..%lld)",
                          quill_gguf_path(g), key, (long long)*out, (long long)lo, (long long)hi);
    return QUILL_OK;
}
