/* Several sequences in one forward pass: checking a batch, splitting it into micro-batches, and
 * the sequences' share of the KV cache (truncate, copy a prefix). quill_eval is the one-sequence
 * case. Each sequence has its own n_ctx positions in the cache, laid out as a lone context's
 * cache, so a token's attention reads exactly what it would read alone. This file is the forward
 * pass's entrance: the state below it (context.c, kv_cache.c, recurrent.c) never calls back into
 * it, so going back in a recurrent state is two steps, the state's restore of a checkpoint and
 * this file's evaluation of the tokens after it. */
#include "model/context.h"
#include "model/forward.h"
#include "model/kv_cache.h"
#include "model/recurrent.h"
#include "base/error.h"

#include <stdlib.h>
#include <string.h>

/* The batch's sequence ids and positions make sense: each sequence's tokens are consecutive
 * positions that start at most at its cached length and end inside the context. */
static quill_status check_batch(quill_context *c, const quill_batch *b, quill_error *err) {
    if (!b || b->n <= 0 || !b->token || !b->seq || !b->pos)
        return quill_fail(err, QUILL_E_ARG, "quill_decode: an empty batch, or one without tokens, sequences or positions");
    const int64_t n_vocab = c->hp->n_vocab;
    for (int s = 0; s < c->n_seq; s++) c->seq_next[s] = -1;
    for (int i = 0; i < b->n; i++) {
        const int32_t t = b->token[i], s = b->seq[i], p = b->pos[i];
        if (t < 0 || t >= n_vocab)
            return quill_fail(err, QUILL_E_ARG, "token id %d at batch index %d is outside the vocabulary (0..%lld)", t, i,
                              (long long)n_vocab - 1);
        if (s < 0 || s >= c->n_seq)
            return quill_fail(err, QUILL_E_ARG, "sequence id %d at batch index %d is outside 0..%d (n_seq %d)", s, i,
                              c->n_seq - 1, c->n_seq);
        if (p < 0 || p >= c->n_ctx)
            return quill_fail(err, QUILL_E_CONTEXT,
                              "position %d of sequence %d does not fit in the context of %d positions; use a larger "
                              "context (-c) or a shorter prompt",
                              p, s, c->n_ctx);
        if (c->seq_next[s] < 0 ? p > c->seq_len[s] : p != c->seq_next[s])
            return quill_fail(err, QUILL_E_ARG,
                              "batch index %d: position %d of sequence %d does not follow on (expected %s%d): a "
                              "sequence's tokens take consecutive positions from at most its length",
                              i, p, s, c->seq_next[s] < 0 ? "at most " : "", c->seq_next[s] < 0 ? c->seq_len[s] : c->seq_next[s]);
        c->seq_next[s] = p + 1;
    }
    return QUILL_OK;
}

static quill_status rewind_to(quill_context *c, int seq, int pos, quill_error *err);

quill_status quill_decode(quill_context *c, const quill_batch *b, float *logits, quill_error *err) {
    quill_status st = check_batch(c, b, err);
    if (st) return st;
    const int64_t n_vocab = c->hp->n_vocab;
    /* a sequence that starts before its end forgets the positions from there on */
    for (int i = b->n - 1; i >= 0; i--) {
        const int32_t sq = b->seq[i];
        if (c->rec && b->pos[i] < c->seq_len[sq] && (st = rewind_to(c, sq, b->pos[i], err))) return st;
        c->seq_len[sq] = b->pos[i] < c->seq_len[sq] ? b->pos[i] : c->seq_len[sq];
    }
    if (c->reference) {
        /* one token at a time, as the reference path always goes (n_seq is 1) */
        for (int i = 0; i < b->n; i++) {
            bool want = b->logits ? b->logits[i] : i == b->n - 1;
            st = quill_reference_eval(c, &b->token[i], 1, want ? logits : NULL, false, err);
            if (st) return st;
            if (c->rec) quill_recurrent_after_ubatch(c, &b->token[i], &b->seq[i], &b->pos[i], 1);
            if (want && logits) logits += n_vocab;
        }
        return QUILL_OK;
    }
    bool want_last[QUILL_UBATCH_MAX];
    for (int done = 0; done < b->n;) {
        const int n = b->n - done < c->ubatch ? b->n - done : c->ubatch;
        const bool *want = b->logits ? b->logits + done : want_last;
        if (!b->logits)
            for (int i = 0; i < n; i++) want_last[i] = done + i == b->n - 1;
        int rows = 0;
        for (int i = 0; i < n; i++) rows += want[i];
        quill_forward_ubatch(c, b->token + done, b->seq + done, b->pos + done, want, n, logits);
        if ((st = quill_gpu_failed(c, err))) return st;
        if (c->rec) quill_recurrent_after_ubatch(c, b->token + done, b->seq + done, b->pos + done, n);
        for (int i = 0; i < n; i++) c->seq_len[b->seq[done + i]] = b->pos[done + i] + 1;
        if (logits) logits += (size_t)rows * n_vocab;
        done += n;
    }
    return QUILL_OK;
}

quill_status quill_eval(quill_context *c, const int32_t *tokens, int n, float *logits, bool all_logits,
                        quill_error *err) {
    if (n <= 0) return quill_fail(err, QUILL_E_ARG, "nothing to evaluate: %d tokens", n);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->hp->n_vocab)
            return quill_fail(err, QUILL_E_ARG, "token id %d at position %d is outside the vocabulary (0..%lld)",
                              tokens[i], i, (long long)c->hp->n_vocab - 1);
    const int start = c->seq_len[0];
    if (n > c->n_ctx - start)
        return quill_fail(err, QUILL_E_CONTEXT,
                          "%d tokens do not fit in the context: %d of %d positions are used, %d are "
                          "free; use a larger context (-c) or a shorter prompt",
                          n, start, c->n_ctx, c->n_ctx - start);
    /* micro-batch by micro-batch, so that the batch's arrays stay small */
    int32_t seq[QUILL_UBATCH_MAX] = {0}, pos[QUILL_UBATCH_MAX];
    bool want[QUILL_UBATCH_MAX];
    for (int done = 0; done < n;) {
        const int k = n - done < c->ubatch ? n - done : c->ubatch;
        for (int i = 0; i < k; i++) {
            pos[i] = start + done + i;
            want[i] = logits && (all_logits || done + i == n - 1);
        }
        quill_batch b = {k, tokens + done, seq, pos, want};
        quill_status st = quill_decode(c, &b, logits && all_logits ? logits + (size_t)done * c->hp->n_vocab : logits, err);
        if (st) return st;
        done += k;
    }
    return QUILL_OK;
}

int quill_context_n_seq(const quill_context *c) { return c->n_seq; }

int quill_seq_len(const quill_context *c, int seq) { return seq >= 0 && seq < c->n_seq ? c->seq_len[seq] : -1; }

/* Evaluates sequence seq's stored tokens again, from its length (a checkpoint the recurrent state
 * went back to) up to `to`, without logits or traces; its length becomes `to`, or stays where it
 * was when the reference path runs out of memory. */
static quill_status evaluate_again(quill_context *c, int seq, int to, quill_error *err) {
    const int from = c->seq_len[seq];
    const int32_t *tokens = quill_recurrent_tokens(c, seq);
    quill_trace_fn trace = c->trace;
    c->trace = NULL;
    quill_status s = QUILL_OK;
    if (c->reference) {
        s = quill_reference_eval(c, tokens + from, to - from, NULL, false, err);
    } else {
        int32_t seqs[QUILL_UBATCH], pos[QUILL_UBATCH];
        bool want[QUILL_UBATCH] = {false};
        for (int done = from; done < to;) {
            const int n = to - done < QUILL_UBATCH ? to - done : QUILL_UBATCH;
            for (int i = 0; i < n; i++) {
                seqs[i] = seq;
                pos[i] = done + i;
            }
            quill_forward_ubatch(c, tokens + done, seqs, pos, want, n, NULL);
            if ((s = quill_gpu_failed(c, err))) break;
            done += n;
        }
    }
    c->trace = trace;
    c->seq_len[seq] = s ? from : to;
    return s;
}

/* A recurrent state goes back through a checkpoint, then evaluates the tokens after it again. */
static quill_status rewind_to(quill_context *c, int seq, int pos, quill_error *err) {
    if (pos >= c->seq_len[seq]) return QUILL_OK;
    quill_recurrent_rewind(c, seq, pos);
    return evaluate_again(c, seq, pos, err);
}

void quill_seq_truncate(quill_context *c, int seq, int pos) {
    if (seq < 0 || seq >= c->n_seq || pos < 0 || pos >= c->seq_len[seq]) return;
    /* (only the reference path can fail, out of memory: the sequence is then shorter, as
     * quill_seq_len tells) */
    if (c->rec) (void)rewind_to(c, seq, pos, NULL);
    else c->seq_len[seq] = pos;
}

void quill_context_truncate(quill_context *c, int pos) { quill_seq_truncate(c, 0, pos); }

quill_status quill_seq_copy_prefix(quill_context *c, int src, int dst, int n, quill_error *err) {
    if (src < 0 || src >= c->n_seq || dst < 0 || dst >= c->n_seq)
        return quill_fail(err, QUILL_E_ARG, "quill_seq_copy_prefix: sequence ids %d and %d must be in 0..%d", src, dst,
                          c->n_seq - 1);
    if (n < 0 || n > c->seq_len[src])
        return quill_fail(err, QUILL_E_ARG, "quill_seq_copy_prefix: sequence %d holds %d positions, not %d", src,
                          c->seq_len[src], n);
    if (src == dst) {
        if (c->rec) return rewind_to(c, dst, n, err);
        c->seq_len[dst] = n;
        return QUILL_OK;
    }
    if (c->reference) {
        /* (n_seq is 1 on the reference path: unreachable, kept for clarity of the contract) */
        return quill_fail(err, QUILL_E_UNSUPPORTED, "the reference path holds one sequence");
    }
    const int64_t kpos = quill_key_positions(c->n_ctx);
    for (int64_t l = 0; l < c->hp->n_layer; l++) {
        const quill_layer *L = &c->model->layers[l];
        if (L->recurrent || L->kv_shared) continue; /* (a shared layer's cache is its source's) */
        const int64_t hd = L->head_dim;
        /* keys: whole blocks of KEY_BLOCK positions per KV head; values: n positions per KV head (a
         * position of a head takes krow and vrow bytes in the cache's types) */
        const size_t krow = quill_kv_row_bytes(c->type_k, hd), vrow = quill_kv_row_bytes(c->type_v, hd);
        const size_t key_bytes = (size_t)((n + KEY_BLOCK - 1) / KEY_BLOCK) * KEY_BLOCK * krow;
        uint8_t *s_keys = c->k_cache + quill_row_size(c->type_k, (int64_t)quill_kv_at(c, L, src, kpos));
        uint8_t *d_keys = c->k_cache + quill_row_size(c->type_k, (int64_t)quill_kv_at(c, L, dst, kpos));
        uint8_t *s_values = c->v_cache + quill_row_size(c->type_v, (int64_t)quill_kv_at(c, L, src, c->n_ctx));
        uint8_t *d_values = c->v_cache + quill_row_size(c->type_v, (int64_t)quill_kv_at(c, L, dst, c->n_ctx));
        for (int64_t h = 0; h < L->n_head_kv; h++) {
            memcpy(d_keys + (size_t)h * kpos * krow, s_keys + (size_t)h * kpos * krow, key_bytes);
            memcpy(d_values + (size_t)h * c->n_ctx * vrow, s_values + (size_t)h * c->n_ctx * vrow, (size_t)n * vrow);
        }
    }
    /* (the device's layers keep their cache there) */
    const quill_status gs = quill_gpu_copy_prefix(c, src, dst, n, err);
    if (gs) return gs;
    c->seq_len[dst] = n;
    if (!c->rec || quill_recurrent_copy_prefix(c, src, dst, n) == n) return QUILL_OK;
    return evaluate_again(c, dst, n, err);
}
