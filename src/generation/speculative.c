/* Drafters for speculative decoding: they propose the tokens likely to follow a sequence, and the
 * caller evaluates the last drawn token and the draft in one batch, then steps its generator row
 * by row, keeping a drafted token only when the generator draws that very token (quill_generate
 * in generate.c, the server's scheduler). Since every token's logits are the same bits in any
 * batch (quill_decode), and the generator and its sampler see the same calls in the same order,
 * the output is bitwise the one of decoding without a drafter; a draft only decides how many
 * tokens one pass of the target model can confirm.
 *
 * Two drafters:
 *   - n-gram lookup, no model: the reference's context n-gram cache (common/ngram-cache): for
 *     n = 1..4, which tokens followed each n-gram of the sequence so far and how often; a draft
 *     token is the most frequent follower of the longest n-gram at the end of the sequence (and
 *     draft) that has been seen often and consistently enough (the reference's "lax" thresholds:
 *     at least 2, 2, 1, 1 occurrences and a share of 66, 50, 50, 50 %), token after token until
 *     no n-gram qualifies;
 *   - a draft model (a smaller model, or the same weights at a lower bit width) with its own
 *     context: its greedy continuation. Its cache holds each sequence's tokens; a call evaluates
 *     only what changed since the last one (the accepted part of a draft stays), like the
 *     server's prompt reuse.
 * Both take the whole sequence at every call and find for themselves what is new, so a caller
 * never tells them what was accepted: a sequence that went back (a new chat turn that rewrote the
 * end) is simply indexed anew from where it differs. */
#include "base/error.h"
#include "model/context.h"
#include "tokenizer/vocab.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The reference's n-gram sizes (LLAMA_NGRAM_MIN / LLAMA_NGRAM_MAX) and its lax thresholds per
 * size, which it applies to the cache of the current context. */
#define NGRAM_MIN 1
#define NGRAM_MAX 4
static const int ngram_min_count[NGRAM_MAX] = {2, 2, 1, 1};
static const int ngram_min_percent[NGRAM_MAX] = {66, 50, 50, 50};

/* The reference checks the vocabularies of a draft and its target this way
 * (common_speculative_are_compatible): same tokenizer kind, same BOS/EOS handling, sizes within
 * 128 of each other and the same texts from id 5 on. */
#define VOCAB_MAX_SIZE_DIFFERENCE 128
#define VOCAB_CHECK_START_ID 5

quill_draft_params quill_draft_defaults(void) { return (quill_draft_params){.n_max = 16, .n_min = 0}; }

/* ---------------------------------------------------------------- the n-gram cache */

typedef struct {
    int32_t token, count;
} follower;

typedef struct {
    int32_t key[NGRAM_MAX];     /* the n-gram, padded with -1 */
    follower *f;
    int n_f, cap_f;
} ngram_entry;

typedef struct {
    ngram_entry *e;
    size_t n, cap;
    int32_t *slot;              /* open addressing: entry index or -1 */
    size_t n_slots;             /* a power of two, at least twice n */
} ngram_cache;

static uint64_t ngram_hash(const int32_t *key) {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < NGRAM_MAX; i++) h = (h ^ (uint32_t)key[i]) * 0x100000001b3ull, h ^= h >> 29;
    return h;
}

static void ngram_clear(ngram_cache *c) {
    for (size_t i = 0; i < c->n; i++) free(c->e[i].f);
    c->n = 0;
    for (size_t i = 0; i < c->n_slots; i++) c->slot[i] = -1;
}

static void ngram_free(ngram_cache *c) {
    ngram_clear(c);
    free(c->e);
    free(c->slot);
    memset(c, 0, sizeof *c);
}

static long ngram_find(const ngram_cache *c, const int32_t *key) {
    if (!c->n_slots) return -1;
    for (size_t i = ngram_hash(key) & (c->n_slots - 1);; i = (i + 1) & (c->n_slots - 1)) {
        if (c->slot[i] < 0) return -1;
        if (!memcmp(c->e[c->slot[i]].key, key, sizeof c->e[0].key)) return c->slot[i];
    }
}

static bool ngram_rehash(ngram_cache *c, size_t n_slots) {
    int32_t *slot = malloc(n_slots * sizeof *slot);
    if (!slot) return false;
    for (size_t i = 0; i < n_slots; i++) slot[i] = -1;
    for (size_t k = 0; k < c->n; k++) {
        size_t i = ngram_hash(c->e[k].key) & (n_slots - 1);
        while (slot[i] >= 0) i = (i + 1) & (n_slots - 1);
        slot[i] = (int32_t)k;
    }
    free(c->slot);
    c->slot = slot;
    c->n_slots = n_slots;
    return true;
}

/* Counts `token` after `key`. False when out of memory. */
static bool ngram_add(ngram_cache *c, const int32_t *key, int32_t token) {
    long at = ngram_find(c, key);
    if (at < 0) {
        if ((c->n + 1) * 2 > c->n_slots && !ngram_rehash(c, c->n_slots ? c->n_slots * 2 : 256)) return false;
        if (c->n == c->cap) {
            size_t cap = c->cap ? c->cap * 2 : 128;
            ngram_entry *e = realloc(c->e, cap * sizeof *e);
            if (!e) return false;
            c->e = e;
            c->cap = cap;
        }
        ngram_entry *e = &c->e[c->n];
        memset(e, 0, sizeof *e);
        memcpy(e->key, key, sizeof e->key);
        size_t i = ngram_hash(key) & (c->n_slots - 1);
        while (c->slot[i] >= 0) i = (i + 1) & (c->n_slots - 1);
        c->slot[i] = (int32_t)c->n;
        at = (long)c->n++;
    }
    ngram_entry *e = &c->e[at];
    for (int i = 0; i < e->n_f; i++)
        if (e->f[i].token == token) {
            e->f[i].count++;
            return true;
        }
    if (e->n_f == e->cap_f) {
        int cap = e->cap_f ? e->cap_f * 2 : 2;
        follower *f = realloc(e->f, (size_t)cap * sizeof *f);
        if (!f) return false;
        e->f = f;
        e->cap_f = cap;
    }
    e->f[e->n_f++] = (follower){token, 1};
    return true;
}

/* The n-gram of `size` tokens ending at seq[end - 1], padded as keys are. */
static void ngram_key_at(const int32_t *seq, size_t end, int size, int32_t *key) {
    for (int i = 0; i < NGRAM_MAX; i++) key[i] = i < size ? seq[end - (size_t)size + (size_t)i] : -1;
}

/* ---------------------------------------------------------------- the drafter */

typedef enum { DRAFT_LOOKUP, DRAFT_MODEL } draft_kind;

typedef struct {
    int32_t *tokens;            /* lookup: the sequence indexed; model: the tokens in the draft cache */
    size_t n, cap;
    ngram_cache cache;
    /* the last draft (it followed tokens[0..last_at)) and the length the next one may have */
    int32_t *last;
    int n_last, limit;
    size_t last_at;
    int pause, backoff;         /* calls left without a draft, and the next pause's length */
} seq_state;

struct quill_drafter {
    draft_kind kind;
    quill_draft_params p;
    int32_t target_vocab;       /* drafted ids must exist in the target's vocabulary */
    seq_state *seqs;
    /* draft model */
    quill_context *ctx;
    float *logits;
    int32_t *b_tok, *b_seq, *b_pos;
    size_t b_cap;
    int32_t *work;              /* lookup: sequence and draft together */
    size_t work_cap;
};

static bool tokens_reserve(int32_t **v, size_t *cap, size_t n) {
    if (n <= *cap) return true;
    size_t c = *cap ? *cap : 64;
    while (c < n) c *= 2;
    int32_t *g = realloc(*v, c * sizeof *g);
    if (!g) return false;
    *v = g;
    *cap = c;
    return true;
}

static size_t common_prefix(const int32_t *a, size_t na, const int32_t *b, size_t nb) {
    size_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

static quill_status check_params(const quill_draft_params *p, quill_error *err) {
    if (p->n_max < 1 || p->n_max > QUILL_DRAFT_MAX)
        return quill_fail(err, QUILL_E_ARG, "draft-max %d is out of range: drafts are 1..%d tokens", p->n_max,
                          QUILL_DRAFT_MAX);
    if (p->n_min < 0 || p->n_min > p->n_max)
        return quill_fail(err, QUILL_E_ARG, "draft-min %d is out of range 0..%d (draft-max)", p->n_min, p->n_max);
    if (p->n_seq < 0 || p->n_seq > 4096)
        return quill_fail(err, QUILL_E_ARG, "a drafter for %d sequences: use 1..4096 (0 = 1)", p->n_seq);
    if (!(p->p_min >= 0 && p->p_min <= 1))
        return quill_fail(err, QUILL_E_ARG, "draft-p-min %g is out of range [0, 1] (0 = off)", (double)p->p_min);
    return QUILL_OK;
}

static quill_status drafter_alloc(draft_kind kind, const quill_draft_params *params, quill_drafter **out,
                                  quill_error *err) {
    quill_draft_params p = params ? *params : quill_draft_defaults();
    quill_status st = check_params(&p, err);
    if (st) return st;
    if (p.n_seq == 0) p.n_seq = 1;
    quill_drafter *d = calloc(1, sizeof *d);
    if (!d || !(d->seqs = calloc((size_t)p.n_seq, sizeof *d->seqs))) {
        free(d);
        return quill_fail(err, QUILL_E_NOMEM, "drafter: out of memory");
    }
    d->kind = kind;
    d->p = p;
    for (int i = 0; i < p.n_seq; i++) d->seqs[i].limit = p.n_max;
    d->target_vocab = INT32_MAX;
    *out = d;
    return QUILL_OK;
}

quill_status quill_drafter_new_lookup(const quill_draft_params *p, quill_drafter **out, quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "drafter: `out` must not be NULL");
    *out = NULL;
    return drafter_alloc(DRAFT_LOOKUP, p, out, err);
}

quill_status quill_draft_vocab_check(const quill_model *target, const quill_model *draft, quill_error *err) {
    if (!target || !draft) return quill_fail(err, QUILL_E_ARG, "draft vocabulary check: a model is missing");
    const quill_tokenizer *t = quill_model_tokenizer(target), *d = quill_model_tokenizer(draft);
    const char *fix = "; a draft model must share the target's tokenizer (a smaller model of the same family, or the "
                      "same model in a lower-bit type)";
    if (t->kind != d->kind)
        return quill_fail(err, QUILL_E_ARG, "the draft model's vocabulary is %s but the target's is %s%s",
                          d->kind == VOCAB_SPM ? "SentencePiece" : "BPE", t->kind == VOCAB_SPM ? "SentencePiece" : "BPE",
                          fix);
    if (t->add_bos != d->add_bos || (t->add_bos && t->bos != d->bos))
        return quill_fail(err, QUILL_E_ARG,
                          "the draft model's BOS token differs from the target's (adds BOS: %s / %s, id %d / %d)%s",
                          d->add_bos ? "yes" : "no", t->add_bos ? "yes" : "no", d->bos, t->bos, fix);
    if (t->add_eos != d->add_eos || (t->add_eos && t->eos != d->eos))
        return quill_fail(err, QUILL_E_ARG,
                          "the draft model's EOS token differs from the target's (adds EOS: %s / %s, id %d / %d)%s",
                          d->add_eos ? "yes" : "no", t->add_eos ? "yes" : "no", d->eos, t->eos, fix);
    const int32_t nt = t->n_vocab, nd = d->n_vocab;
    if ((nt > nd ? nt - nd : nd - nt) > VOCAB_MAX_SIZE_DIFFERENCE)
        return quill_fail(err, QUILL_E_ARG,
                          "the draft model has %d tokens and the target %d: more than %d apart, not the same "
                          "vocabulary%s",
                          nd, nt, VOCAB_MAX_SIZE_DIFFERENCE, fix);
    for (int32_t i = VOCAB_CHECK_START_ID; i < (nt < nd ? nt : nd); i++)
        if (strcmp(vocab_text(t, i), vocab_text(d, i)) != 0)
            return quill_fail(err, QUILL_E_ARG, "token %d is \"%.40s\" in the draft model but \"%.40s\" in the target%s",
                              i, vocab_text(d, i), vocab_text(t, i), fix);
    return QUILL_OK;
}

quill_status quill_drafter_new_model(quill_model *draft, const quill_model *target, const quill_draft_params *p,
                                     quill_drafter **out, quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "drafter: `out` must not be NULL");
    *out = NULL;
    quill_status st = quill_draft_vocab_check(target, draft, err);
    if (st) return st;
    quill_drafter *d;
    if ((st = drafter_alloc(DRAFT_MODEL, p, &d, err))) return st;
    d->target_vocab = (int32_t)quill_model_hparams(target)->n_vocab;
    quill_context_params cp = {.n_ctx = d->p.n_ctx, .n_threads = d->p.n_threads, .n_seq = d->p.n_seq};
    if ((st = quill_context_new(draft, &cp, &d->ctx, err))) {
        quill_drafter_free(d);
        return st;
    }
    if (!(d->logits = malloc((size_t)quill_model_hparams(draft)->n_vocab * sizeof *d->logits))) {
        quill_drafter_free(d);
        return quill_fail(err, QUILL_E_NOMEM, "drafter: out of memory for the draft model's logits");
    }
    *out = d;
    return QUILL_OK;
}

void quill_drafter_free(quill_drafter *d) {
    if (!d) return;
    for (int i = 0; i < d->p.n_seq; i++) {
        free(d->seqs[i].tokens);
        free(d->seqs[i].last);
        ngram_free(&d->seqs[i].cache);
    }
    free(d->seqs);
    quill_context_free(d->ctx);
    free(d->logits);
    free(d->b_tok);
    free(d->b_seq);
    free(d->b_pos);
    free(d->work);
    free(d);
}

int quill_drafter_n_max(const quill_drafter *d) { return d ? d->p.n_max : 0; }
int quill_drafter_n_min(const quill_drafter *d) { return d ? d->p.n_min : 0; }

/* ---------------------------------------------------------------- lookup */

/* Brings the n-gram counts of a sequence up to `seq`: the tokens past the indexed ones are
 * added; a sequence that differs from what was indexed is indexed anew. */
static quill_status lookup_sync(seq_state *s, const int32_t *seq, size_t n, quill_error *err) {
    size_t from = common_prefix(s->tokens, s->n, seq, n);
    if (from < s->n) { /* it went back: the counts of the old end are wrong now */
        ngram_clear(&s->cache);
        s->n = from = 0;
    }
    if (!tokens_reserve(&s->tokens, &s->cap, n)) return quill_fail(err, QUILL_E_NOMEM, "lookup: out of memory");
    memcpy(s->tokens + from, seq + from, (n - from) * sizeof *seq);
    for (int size = NGRAM_MIN; size <= NGRAM_MAX; size++) {
        int32_t key[NGRAM_MAX];
        for (size_t i = from > (size_t)size ? from : (size_t)size; i < n; i++) {
            ngram_key_at(seq, i, size, key);
            if (!ngram_add(&s->cache, key, seq[i])) {
                ngram_clear(&s->cache);
                s->n = 0;
                return quill_fail(err, QUILL_E_NOMEM, "lookup: out of memory for the n-gram counts");
            }
        }
    }
    s->n = n;
    return QUILL_OK;
}

/* The token that follows the end of work[0..n) by the counts, or -1. */
static int32_t lookup_next(const ngram_cache *c, const int32_t *work, size_t n) {
    for (int size = NGRAM_MAX; size >= NGRAM_MIN; size--) {
        if ((size_t)size > n) continue;
        int32_t key[NGRAM_MAX];
        ngram_key_at(work, n, size, key);
        long at = ngram_find(c, key);
        if (at < 0) continue;
        const ngram_entry *e = &c->e[at];
        int best = -1, sum = 0;
        for (int i = 0; i < e->n_f; i++) {
            sum += e->f[i].count;
            if (best < 0 || e->f[i].count > e->f[best].count) best = i;
        }
        if (sum < ngram_min_count[size - 1]) continue;
        if (100 * e->f[best].count < ngram_min_percent[size - 1] * sum) continue;
        return e->f[best].token;
    }
    return -1;
}

static quill_status lookup_draft(quill_drafter *d, seq_state *s, const int32_t *seq, size_t n, int max,
                                 int32_t *draft, int *n_draft, quill_error *err) {
    quill_status st = lookup_sync(s, seq, n, err);
    if (st) return st;
    if (!tokens_reserve(&d->work, &d->work_cap, n + (size_t)max))
        return quill_fail(err, QUILL_E_NOMEM, "lookup: out of memory");
    memcpy(d->work, seq, n * sizeof *seq);
    size_t len = n;
    while (*n_draft < max) {
        int32_t t = lookup_next(&s->cache, d->work, len);
        if (t < 0) break;
        draft[(*n_draft)++] = d->work[len++] = t;
    }
    return QUILL_OK;
}

/* ---------------------------------------------------------------- draft model */

static int32_t argmax(const float *x, int32_t n, float *p_best) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    if (p_best) {
        double sum = 0;
        for (int32_t i = 0; i < n; i++) sum += exp((double)x[i] - x[best]);
        *p_best = (float)(1.0 / sum);
    }
    return best;
}

static quill_status model_draft(quill_drafter *d, int seq_id, seq_state *s, const int32_t *seq, size_t n, int max,
                                int32_t *draft, int *n_draft, quill_error *err) {
    quill_context *c = d->ctx;
    const int n_ctx = quill_context_n_ctx(c);
    const int32_t n_vocab = (int32_t)c->hp->n_vocab;
    if (n + 1 > (size_t)n_ctx) return QUILL_OK; /* the draft model's context is full: no draft */
    for (size_t i = 0; i < n; i++)
        if (seq[i] < 0 || seq[i] >= n_vocab) return QUILL_OK; /* a token the draft model lacks */
    /* what the draft cache holds already; at least the last token is evaluated, for its logits */
    size_t keep = common_prefix(s->tokens, s->n, seq, n);
    if (keep > (size_t)quill_seq_len(c, seq_id)) keep = (size_t)quill_seq_len(c, seq_id);
    if (keep == n) keep = n - 1;
    const size_t m = n - keep;
    if (m > d->b_cap) {
        int32_t *t = realloc(d->b_tok, m * sizeof *t), *q = t ? realloc(d->b_seq, m * sizeof *q) : NULL,
                *p = q ? realloc(d->b_pos, m * sizeof *p) : NULL;
        if (t) d->b_tok = t;
        if (q) d->b_seq = q;
        if (p) d->b_pos = p;
        if (!p) return quill_fail(err, QUILL_E_NOMEM, "draft model: out of memory for a batch of %zu tokens", m);
        d->b_cap = m;
    }
    if (!tokens_reserve(&s->tokens, &s->cap, n + (size_t)max))
        return quill_fail(err, QUILL_E_NOMEM, "draft model: out of memory");
    for (size_t i = 0; i < m; i++) {
        d->b_tok[i] = seq[keep + i];
        d->b_seq[i] = seq_id;
        d->b_pos[i] = (int32_t)(keep + i);
    }
    s->n = keep; /* until the evaluation succeeds */
    quill_batch b = {(int)m, d->b_tok, d->b_seq, d->b_pos, NULL};
    quill_status st = quill_decode(c, &b, d->logits, err);
    if (st) return st;
    memcpy(s->tokens + keep, seq + keep, m * sizeof *seq);
    s->n = n;
    while (max > 0) {
        float p_best;
        int32_t t = argmax(d->logits, n_vocab, d->p.p_min > 0 ? &p_best : NULL);
        if (t >= d->target_vocab || (d->p.p_min > 0 && p_best < d->p.p_min)) break;
        draft[(*n_draft)++] = t;
        if (*n_draft >= max || s->n >= (size_t)n_ctx) break;
        int32_t pos = (int32_t)s->n;
        quill_batch one = {1, &t, &seq_id, &pos, NULL};
        if ((st = quill_decode(c, &one, d->logits, err))) return st;
        s->tokens[s->n++] = t;
    }
    return QUILL_OK;
}

/* How long a sequence's drafts may be: a wrong draft costs the target model's rows and (with a
 * draft model) its own evaluations, so the length follows what was accepted, as Hugging Face's
 * assisted generation does: a draft taken whole lets the next one be 2 tokens longer (up to
 * n_max), a draft cut short limits the next one to what was taken plus one. What was taken of the
 * last draft shows in the sequence: the drafted tokens it now holds after where the draft began. */
static void adapt_limit(const quill_drafter *d, seq_state *s, const int32_t *tokens, size_t n) {
    if (!s->n_last || n <= s->last_at) return;
    const int taken = (int)common_prefix(s->last, (size_t)s->n_last, tokens + s->last_at, n - s->last_at);
    if (taken == s->n_last) s->limit = s->limit + 2 < d->p.n_max ? s->limit + 2 : d->p.n_max;
    else s->limit = taken + 1;
    /* Single tokens missed again and again (a draft model that never agrees, text that never
     * repeats): drafting pauses for 1, 2, 4, ... 64 steps, then tries again. */
    if (taken) {
        s->backoff = 0;
    } else if (s->n_last == 1) {
        s->backoff = s->backoff ? (s->backoff < 64 ? s->backoff * 2 : 64) : 1;
        s->pause = s->backoff;
    }
}

quill_status quill_drafter_draft(quill_drafter *d, int seq, const int32_t *tokens, size_t n_tokens, int max,
                                 int32_t *draft, int *n_draft, quill_error *err) {
    if (n_draft) *n_draft = 0;
    if (!d || !n_draft || (!draft && max > 0) || (!tokens && n_tokens))
        return quill_fail(err, QUILL_E_ARG, "drafter: no drafter, sequence or output given");
    if (seq < 0 || seq >= d->p.n_seq)
        return quill_fail(err, QUILL_E_ARG, "drafter: sequence %d is outside 0..%d", seq, d->p.n_seq - 1);
    if (max > d->p.n_max) max = d->p.n_max;
    if (max <= 0 || n_tokens == 0) return QUILL_OK;
    seq_state *s = &d->seqs[seq];
    adapt_limit(d, s, tokens, n_tokens);
    s->n_last = 0;
    if (s->pause > 0) {
        s->pause--;
        return QUILL_OK;
    }
    /* (never below n_min: a shorter draft would be dropped, and the limit could not grow again) */
    const int limit = s->limit > d->p.n_min ? s->limit : d->p.n_min;
    if (max > limit) max = limit;
    quill_status st = d->kind == DRAFT_LOOKUP ? lookup_draft(d, s, tokens, n_tokens, max, draft, n_draft, err)
                                              : model_draft(d, seq, s, tokens, n_tokens, max, draft, n_draft, err);
    if (!st && *n_draft < d->p.n_min) *n_draft = 0;
    s->n_last = 0;
    if (!s->last) s->last = malloc((size_t)d->p.n_max * sizeof *s->last); /* (without it: no adapting) */
    if (!st && *n_draft && s->last) {
        memcpy(s->last, draft, (size_t)*n_draft * sizeof *draft);
        s->n_last = *n_draft;
        s->last_at = n_tokens;
    }
    return st;
}

quill_status quill_drafter_prepare(quill_drafter *d, int seq, const int32_t *tokens, size_t n_tokens, quill_error *err) {
    if (!d || (!tokens && n_tokens)) return quill_fail(err, QUILL_E_ARG, "drafter: no drafter or sequence given");
    if (seq < 0 || seq >= d->p.n_seq)
        return quill_fail(err, QUILL_E_ARG, "drafter: sequence %d is outside 0..%d", seq, d->p.n_seq - 1);
    if (n_tokens == 0) return QUILL_OK;
    int none = 0;
    return d->kind == DRAFT_LOOKUP ? lookup_sync(&d->seqs[seq], tokens, n_tokens, err)
                                   : model_draft(d, seq, &d->seqs[seq], tokens, n_tokens, 0, NULL, &none, err);
}
