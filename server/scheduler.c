/* The engine thread: N slots over one context with N sequences, and continuous batching.
 *
 * Every step evaluates, in one forward pass, the next token of every generating slot and then,
 * within the step's token budget, chunks of the prompts still being read (the shortest rest
 * first): a long prompt never stalls the others' streams, nor a new request's first token. A slot keeps its conversation's KV cache
 * after the request; a new request goes to the idle slot whose cache shares the longest prefix
 * with its prompt (or, when a busy slot shares more, gets a copy of that prefix), and only the
 * rest of the prompt is evaluated.
 *
 * A request's answer does not depend on what else runs: each token's arithmetic is independent
 * of the batch (quill_decode), a reused prefix holds the bits the same tokens produce anew, and
 * each request samples with its own sampler.
 *
 * The decisions after each token (end of generation, stop strings, max_tokens, a full context,
 * text released only once final) are the library's generator (quill_generator_step), the same
 * loop `quill run` and `quill chat` use: the engine only batches the evaluations. As the
 * reference's server does, the prompt enters the penalty window and the sampler accepts a token
 * before the end-of-generation check. */
#include "server.h"
#include "base/error.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Rows of prompt logits a step computes for echo requests with logprobs (their prompts then move on
 * ECHO_ROWS tokens a step): the logits buffer holds a row per slot plus these. */
enum { ECHO_ROWS = 16 };

typedef struct slot {
    int id;                     /* also its sequence id in the context */
    job *job;                   /* NULL when idle */
    int32_t *cache;             /* the tokens in its sequence of the KV cache */
    int n_cache;
    bool generating;            /* the prompt is read; `pending` is evaluated next */
    int32_t pending;
    int32_t *draft;             /* speculative decoding: tokens drafted to follow `pending`, in the */
    int n_draft;                /* batch with it; `draft_row` is the row of the first */
    int pending_row, draft_row;
    quill_generator *gen;       /* the library's loop, driven one step per batch */
    double last_used;
} slot;

struct scheduler {
    quill_model *model;
    quill_context *ctx;
    const quill_tokenizer *tok;
    scheduler_params p;
    int n_vocab;
    char backend[320];          /* scheduler_backend's text */
    slot *slots;
    int32_t *eog;               /* end-of-generation ids, masked for ignore_eos */
    int n_eog;
    quill_grammar_vocab *grammar_vocab;   /* shared by every request's grammar */
    quill_drafter *drafter;     /* speculative decoding (one sequence per slot), or NULL */

    pthread_mutex_t mu;
    pthread_cond_t wake;
    job **queue;                /* ring of max_queue */
    int q_head, q_len;
    bool stopping;
    pthread_t thread;
    bool thread_started;

    /* the step's batch: tokens, and for each row of logits its slot (-1: a drafted token's row,
     * read with its slot's first) and the prompt position it follows (-1: a generated token's) */
    int32_t *b_tok, *b_seq, *b_pos;
    bool *b_want;
    int *row_slot, *row_pos;
    float *logits, *raw;

    scheduler_stats st;
};

/* ---------------------------------------------------------------- jobs */

job *job_new(void) {
    job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (pthread_cond_init(&j->changed, NULL)) {
        free(j);
        return NULL;
    }
    j->refs = 1;
    j->slot = -1;
    return j;
}

static void job_unref(job *j);

static void job_free(job *j) {
    if (j->holds_source) job_unref(j->prompt_source);
    pthread_cond_destroy(&j->changed);
    free(j->prompt);
    free(j->text);
    free(j->tokens);
    free(j->prompt_info);
    quill_grammar_free(j->grammar);
    free(j);
}

/* Under the mutex. */
static void job_unref(job *j) {
    if (--j->refs == 0) job_free(j);
}

void job_release(scheduler *s, job *j) {
    if (!j) return;
    if (!s) {
        job_unref(j);
        return;
    }
    pthread_mutex_lock(&s->mu);
    job_unref(j);
    pthread_mutex_unlock(&s->mu);
}

static bool text_append(job *j, const char *bytes, size_t n) {
    if (j->text_len + n + 1 > j->text_cap) {
        size_t cap = (j->text_len + n + 1) * 2;
        char *t = realloc(j->text, cap);
        if (!t) return false;
        j->text = t;
        j->text_cap = cap;
    }
    memcpy(j->text + j->text_len, bytes, n);
    j->text_len += n;
    j->text[j->text_len] = 0;
    return true;
}

/* ---------------------------------------------------------------- slots (engine thread, under the mutex) */

static void slot_finish(scheduler *s, slot *sl, const char *reason, int error_status, const char *error) {
    job *j = sl->job;
    if (!j) return;
    j->finish_reason = reason;
    j->error_status = error_status;
    if (error) snprintf(j->error, sizeof j->error, "%s", error);
    j->done = true;
    j->t_end = now_ms();
    pthread_cond_broadcast(&j->changed);
    quill_generator_free(sl->gen);
    sl->gen = NULL;
    sl->job = NULL;
    sl->generating = false;
    sl->last_used = now_ms();
    s->st.busy--;
    job_unref(j);
}

static int common_prefix(const int32_t *a, int na, const int32_t *b, int nb) {
    int n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* A job whose prompt another is evaluating right now (the first of n choices): it waits, then
 * copies that slot's cache (slot_assign's donor) instead of evaluating the same tokens again. */
static bool waits_for_prompt(const scheduler *s, const job *j) {
    const job *src = j->prompt_source;
    if (!src || src->done || src->slot < 0) return false;
    const slot *sl = &s->slots[src->slot];
    return sl->job == src && !sl->generating;
}

/* Starts a queued job in an idle slot. False when no slot is idle. */
static bool slot_assign(scheduler *s, job *j) {
    slot *best = NULL;
    int best_len = -1;
    for (int i = 0; i < s->p.n_slots; i++) {
        slot *sl = &s->slots[i];
        if (sl->job) continue;
        int l = common_prefix(sl->cache, sl->n_cache, j->prompt, j->n_prompt);
        /* among equals the least recently used: the others' caches may serve their follow-ups */
        if (l > best_len || (l == best_len && sl->last_used < best->last_used)) best = sl, best_len = l;
    }
    if (!best) return false;
    /* a busy slot may hold a longer prefix (the same system prompt, a conversation's earlier turn) */
    slot *donor = NULL;
    int donor_len = best_len;
    for (int i = 0; i < s->p.n_slots; i++) {
        slot *sl = &s->slots[i];
        if (!sl->job || sl == best) continue;
        int l = common_prefix(sl->cache, sl->n_cache, j->prompt, j->n_prompt);
        if (l > donor_len) donor = sl, donor_len = l;
    }
    int keep = best_len;
    quill_error err;
    if (j->prompt_logprobs) keep = 0, donor = NULL;   /* every position's logits are wanted */
    if (donor && quill_seq_copy_prefix(s->ctx, donor->id, best->id, donor_len, &err) == QUILL_OK) {
        memcpy(best->cache, donor->cache, (size_t)donor_len * sizeof *best->cache);
        best->n_cache = donor_len;
        keep = donor_len;
    }
    /* the last prompt token is evaluated again for its logits */
    if (keep >= j->n_prompt) keep = j->n_prompt - 1;
    quill_seq_truncate(s->ctx, best->id, keep);
    best->n_cache = keep;
    best->job = j;
    best->generating = false;
    s->st.busy++;
    j->slot = best->id;
    j->n_cached = keep;
    j->t_start = now_ms();
    s->st.prompt_tokens += (unsigned long long)j->n_prompt;
    s->st.cached_tokens += (unsigned long long)keep;
    quill_generate_params gp = quill_generate_defaults();
    gp.sampling = j->sp;
    gp.n_predict = j->max_tokens > 0 ? (int)j->max_tokens : -1;
    gp.stop = (const char *const *)j->stop;
    gp.n_stop = (size_t)j->n_stop;
    gp.penalize_prompt = true;
    gp.text_start = false;   /* the reply continues the prompt: its leading space is real */
    gp.render_special = j->render_special;
    gp.grammar = j->grammar;
    gp.grammar_vocab = s->grammar_vocab;
    gp.grammar_triggers = &j->grammar_trigger;
    gp.n_grammar_triggers = j->grammar_trigger ? 1 : 0;
    if (quill_generator_new(s->tok, NULL, &gp, &best->gen, &err)) {
        slot_finish(s, best, NULL, err.status == QUILL_E_NOMEM ? 500 : 400, err.message);
        return true;
    }
    quill_generator_begin(best->gen, j->prompt, (size_t)j->n_prompt);
    return true;
}

/* The log-probabilities of the chosen token and the best alternatives, from raw logits. */
static void fill_logprobs(const float *raw, int n_vocab, int top, int32_t chosen, token_info *ti) {
    float mx = -INFINITY;
    for (int i = 0; i < n_vocab; i++)
        if (raw[i] > mx) mx = raw[i];
    double sum = 0;
    for (int i = 0; i < n_vocab; i++) sum += exp((double)raw[i] - mx);
    const double lse = mx + log(sum);
    ti->id = chosen;
    ti->logprob = (float)(raw[chosen] - lse);
    ti->n_top = 0;
    /* insertion into a short sorted list: top <= 20 */
    for (int i = 0; i < n_vocab && top > 0; i++) {
        float l = raw[i];
        if (ti->n_top == top && l <= ti->top_logprob[top - 1]) continue;
        int at = ti->n_top < top ? ti->n_top++ : top - 1;
        while (at > 0 && ti->top_logprob[at - 1] < l) {
            ti->top_logprob[at] = ti->top_logprob[at - 1];
            ti->top_id[at] = ti->top_id[at - 1];
            at--;
        }
        ti->top_logprob[at] = l;
        ti->top_id[at] = i;
    }
    for (int k = 0; k < ti->n_top; k++) ti->top_logprob[k] = (float)(ti->top_logprob[k] - lse);
}

/* A slot's logits after its prompt or its last token: one step of its generator, then the text
 * it released goes to the job (all of it final: the generator holds back what is not). */
static void slot_next(scheduler *s, slot *sl, float *logits) {
    job *j = sl->job;
    if (j->n_generated == 0) j->t_first = now_ms();
    if (j->max_tokens == 0) {   /* the prompt alone (echo) */
        slot_finish(s, sl, "length", 0, NULL);
        return;
    }
    if (j->ignore_eos)
        for (int i = 0; i < s->n_eog; i++) logits[s->eog[i]] = -INFINITY;
    if (j->want_logprobs) memcpy(s->raw, logits, (size_t)s->n_vocab * sizeof *logits);
    quill_generator_event ev;
    quill_error err;
    if (quill_generator_step(sl->gen, logits, sl->n_cache < s->p.n_ctx, &ev, &err)) {
        slot_finish(s, sl, NULL, err.status == QUILL_E_NOMEM ? 500 : 400, err.message);
        return;
    }
    if (!ev.eog) {
        j->n_generated++;
        s->st.generated_tokens++;
    }
    if (!ev.eog && j->want_logprobs) {
        if (j->n_tokens == j->tokens_cap) {
            size_t cap = j->tokens_cap ? j->tokens_cap * 2 : 64;
            token_info *t = realloc(j->tokens, cap * sizeof *t);
            if (!t) {
                slot_finish(s, sl, NULL, 500, "out of memory");
                return;
            }
            j->tokens = t;
            j->tokens_cap = cap;
        }
        fill_logprobs(s->raw, s->n_vocab, j->top_logprobs, ev.token, &j->tokens[j->n_tokens++]);
    }
    if ((ev.len && !text_append(j, ev.text, ev.len)) || (ev.tail_len && !text_append(j, ev.tail, ev.tail_len))) {
        slot_finish(s, sl, NULL, 500, "out of memory");
        return;
    }
    j->ready = j->text_len;
    pthread_cond_broadcast(&j->changed);
    if (ev.done) {
        slot_finish(s, sl, quill_finish_name(quill_generator_result(sl->gen)->finish), 0, NULL);
    } else {
        sl->pending = ev.token;
        sl->generating = true;
    }
}

/* A generating slot's rows: its token's, then its draft's. The generator steps on them in order
 * while it draws the drafted tokens (the same calls, hence the same bits, as without a draft);
 * the cache then keeps what the last row used saw and forgets the rest of the draft. */
static void slot_verify(scheduler *s, slot *sl) {
    const int start = sl->n_cache - sl->n_draft - 1;    /* the position of the slot's token */
    job *j = sl->job;
    if (j) j->n_drafted += sl->n_draft;
    s->st.drafted_tokens += (unsigned long long)sl->n_draft;
    sl->n_cache = start + 1;
    for (int i = 0; i <= sl->n_draft; i++) {
        if (!sl->job || sl->job->cancelled) break;
        sl->n_cache = start + i + 1;
        const int row = i == 0 ? sl->pending_row : sl->draft_row + i - 1;
        slot_next(s, sl, s->logits + (size_t)row * s->n_vocab);
        if (!sl->job || i == sl->n_draft || sl->pending != sl->draft[i]) break;
        sl->job->n_accepted++;
        s->st.accepted_tokens++;
    }
    sl->n_draft = 0;
    quill_seq_truncate(s->ctx, sl->id, sl->n_cache);
}

/* ---------------------------------------------------------------- the engine */

static void *engine(void *arg) {
    scheduler *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->stopping) {
            for (int i = 0; i < s->p.n_slots; i++)
                slot_finish(s, &s->slots[i], NULL, 503, "the server is shutting down");
        }
        for (int i = 0; i < s->p.n_slots; i++)
            if (s->slots[i].job && s->slots[i].job->cancelled) slot_finish(s, &s->slots[i], NULL, 499, "cancelled");
        while (s->q_len > 0) {
            job *j = s->queue[s->q_head];
            if (j->cancelled || s->stopping) {
                j->done = true;
                j->error_status = s->stopping ? 503 : 499;
                snprintf(j->error, sizeof j->error, "%s",
                         s->stopping ? "the server is shutting down" : "cancelled");
                pthread_cond_broadcast(&j->changed);
                job_unref(j);
            } else if (waits_for_prompt(s, j) || !slot_assign(s, j)) {
                break;
            }
            s->q_head = (s->q_head + 1) % s->p.max_queue;
            s->q_len--;
        }
        if (s->stopping) break;

        /* the batch: generating slots' next tokens, then prompt chunks */
        int n = 0, rows = 0;
        for (int i = 0; i < s->p.n_slots; i++) {
            slot *sl = &s->slots[i];
            if (!sl->job || !sl->generating) continue;
            s->b_tok[n] = sl->pending;
            s->b_seq[n] = sl->id;
            s->b_pos[n] = sl->n_cache;
            s->b_want[n] = true;
            s->row_pos[rows] = -1;
            s->row_slot[rows++] = i;
            n++;
        }
        const int n_gen = n;
        int budget = s->p.n_batch - n;
        if (budget < 8) budget = 8;   /* prompts always move on */
        int echo_rows = ECHO_ROWS;    /* rows of prompt logits (echo) this step */
        /* the prompts being read take the rest, the shortest rest first (among equals the earliest
         * request): a new request's first token does not wait for the long prompts that arrived
         * before it. (Equal shares for every prompt did that too, but made prompts that arrived
         * together all finish last: 8 streams' median time to first token 1.8x.) */
        for (;;) {
            slot *next = NULL;
            for (int i = 0; i < s->p.n_slots; i++) {
                slot *sl = &s->slots[i];
                if (!sl->job || sl->generating || sl->n_cache >= sl->job->n_prompt) continue;
                bool taken = false;   /* already in this batch */
                for (int k = n_gen; k < n && !taken; k++) taken = s->b_seq[k] == sl->id;
                if (taken) continue;
                const int rest = sl->job->n_prompt - sl->n_cache, next_rest = next ? next->job->n_prompt - next->n_cache : 0;
                if (!next || rest < next_rest || (rest == next_rest && sl->job->t_start < next->job->t_start)) next = sl;
            }
            if (!next || budget == 0) break;
            const job *j = next->job;
            int take = j->n_prompt - next->n_cache;
            if (take > budget) take = budget;
            if (j->prompt_logprobs && take > echo_rows) take = echo_rows;
            if (take == 0) break;
            if (j->prompt_logprobs) echo_rows -= take;
            for (int k = 0; k < take; k++) {
                int pos = next->n_cache + k;
                s->b_tok[n] = j->prompt[pos];
                s->b_seq[n] = next->id;
                s->b_pos[n] = pos;
                s->b_want[n] = pos == j->n_prompt - 1 || j->prompt_logprobs;
                if (s->b_want[n]) {
                    s->row_pos[rows] = pos;
                    s->row_slot[rows++] = next->id;
                }
                n++;
            }
            budget -= take;
        }
        if (n == 0) {
            pthread_cond_wait(&s->wake, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);

        /* Speculative decoding where the batch has room: each generating slot's draft follows its
         * token. Only this thread changes the slots, so drafting needs no lock. */
        for (int i = 0; i < n_gen; i++) s->slots[s->row_slot[i]].pending_row = i;
        for (int i = 0; i < n_gen && s->drafter; i++) {
            slot *sl = &s->slots[s->row_slot[i]];
            sl->n_draft = 0;
            int max = s->p.n_batch - n;
            if (max > s->p.draft_max) max = s->p.draft_max;
            if (max > s->p.n_ctx - sl->n_cache - 1) max = s->p.n_ctx - sl->n_cache - 1;
            const long left = sl->job->max_tokens > 0 ? sl->job->max_tokens - sl->job->n_generated - 1 : max;
            if (left < max) max = (int)left;
            if (max <= 0) continue;
            /* the slot's tokens and the one drawn last (n_cache < n_ctx while it generates) */
            sl->cache[sl->n_cache] = sl->pending;
            quill_error derr;
            if (quill_drafter_draft(s->drafter, sl->id, sl->cache, (size_t)sl->n_cache + 1, max, sl->draft, &sl->n_draft,
                                    &derr))
                sl->n_draft = 0; /* no draft: the step is plain decoding for this slot */
            sl->draft_row = rows;
            for (int k = 0; k < sl->n_draft; k++) {
                s->b_tok[n] = sl->draft[k];
                s->b_seq[n] = sl->id;
                s->b_pos[n] = sl->n_cache + 1 + k;
                s->b_want[n] = true;
                s->row_pos[rows] = -1;
                s->row_slot[rows++] = -1;
                n++;
            }
        }

        quill_batch b = {n, s->b_tok, s->b_seq, s->b_pos, s->b_want};
        quill_error err;
        double t0 = now_ms();
        quill_status st = quill_decode(s->ctx, &b, s->logits, &err);
        double dt = (now_ms() - t0) / 1e3;

        pthread_mutex_lock(&s->mu);
        s->st.steps++;
        s->st.decode_seconds += dt;
        if (n_gen) s->st.generation_seconds += dt;
        if (st) {
            for (int k = 0; k < n; k++) slot_finish(s, &s->slots[s->b_seq[k]], NULL, 500, err.message);
            continue;
        }
        for (int k = 0; k < n; k++) {
            slot *sl = &s->slots[s->b_seq[k]];
            sl->cache[s->b_pos[k]] = s->b_tok[k];
            sl->n_cache = s->b_pos[k] + 1;
        }
        for (int r = 0; r < rows; r++) {
            if (s->row_slot[r] < 0) continue;
            slot *sl = &s->slots[s->row_slot[r]];
            if (r < n_gen) {
                slot_verify(s, sl);
                continue;
            }
            job *j = sl->job;
            if (!j || j->cancelled) continue;
            float *row = s->logits + (size_t)r * s->n_vocab;
            const int pos = s->row_pos[r];
            if (pos >= 0 && pos < j->n_prompt - 1) {
                fill_logprobs(row, s->n_vocab, j->top_logprobs, j->prompt[pos + 1], &j->prompt_info[pos + 1]);
                continue;
            }
            slot_next(s, sl, row);
        }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---------------------------------------------------------------- lifetime and API */

quill_status scheduler_new(quill_model *m, const scheduler_params *p, scheduler **out, quill_error *err) {
    *out = NULL;
    scheduler *s = calloc(1, sizeof *s);
    if (!s) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    s->model = m;
    s->p = *p;
    s->tok = quill_model_tokenizer(m);
    s->n_vocab = (int)quill_model_hparams(m)->n_vocab;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->wake, NULL);
    quill_context_params cp = {.n_ctx = p->n_ctx, .n_threads = p->n_threads, .n_seq = p->n_slots,
                               .type_k = p->type_k, .type_v = p->type_v, .backend = p->backend,
                               .n_gpu_layers = p->n_gpu_layers, .device = p->device};
    quill_status st = quill_context_new(m, &cp, &s->ctx, err);
    if (st) {
        scheduler_free(s);
        return st;
    }
    const char *device = NULL;
    int gpu_layers = 0;
    const char *backend = quill_context_backend(s->ctx, &device, &gpu_layers);
    if (device) snprintf(s->backend, sizeof s->backend, ", %s backend on %s (%d layers)", backend, device, gpu_layers);
    s->p.n_ctx = quill_context_n_ctx(s->ctx);
    if ((st = quill_grammar_vocab_new(s->tok, &s->grammar_vocab, err))) {
        scheduler_free(s);
        return st;
    }
    if (p->lookup || p->draft_model) {
        quill_draft_params dp = quill_draft_defaults();
        dp.n_max = p->draft_max;
        dp.n_min = p->draft_min;
        dp.n_seq = p->n_slots;
        dp.n_ctx = s->p.n_ctx;
        dp.n_threads = p->n_threads;
        st = p->lookup ? quill_drafter_new_lookup(&dp, &s->drafter, err)
                       : quill_drafter_new_model(p->draft_model, m, &dp, &s->drafter, err);
        if (st) {
            scheduler_free(s);
            return st;
        }
    }
    const size_t nb = (size_t)p->n_batch + (size_t)p->n_slots + 8;
    /* rows of logits: a slot's token or the end of its prompt, and the drafts the batch has room for */
    size_t draft_rows = s->drafter ? (size_t)p->n_slots * (size_t)p->draft_max : 0;
    if (draft_rows > (size_t)p->n_batch) draft_rows = (size_t)p->n_batch;
    s->slots = calloc((size_t)p->n_slots, sizeof *s->slots);
    s->queue = calloc((size_t)p->max_queue, sizeof *s->queue);
    s->b_tok = malloc(nb * sizeof *s->b_tok);
    s->b_seq = malloc(nb * sizeof *s->b_seq);
    s->b_pos = malloc(nb * sizeof *s->b_pos);
    s->b_want = malloc(nb * sizeof *s->b_want);
    s->row_slot = malloc(nb * sizeof *s->row_slot);
    s->row_pos = malloc(nb * sizeof *s->row_pos);
    s->logits = malloc(((size_t)p->n_slots + 1 + ECHO_ROWS + draft_rows) * (size_t)s->n_vocab * sizeof *s->logits);
    s->raw = malloc((size_t)s->n_vocab * sizeof *s->raw);
    s->eog = malloc((size_t)s->n_vocab * sizeof *s->eog);
    bool ok = s->slots && s->queue && s->b_tok && s->b_seq && s->b_pos && s->b_want && s->row_slot && s->row_pos && s->logits &&
              s->raw && s->eog;
    for (int i = 0; ok && i < p->n_slots; i++) {
        s->slots[i].id = i;
        ok = (s->slots[i].cache = malloc((size_t)s->p.n_ctx * sizeof(int32_t))) != NULL &&
             (!s->drafter || (s->slots[i].draft = malloc((size_t)p->draft_max * sizeof(int32_t))) != NULL);
    }
    if (!ok) {
        scheduler_free(s);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory for %d slots", p->n_slots);
    }
    for (int i = 0; i < s->n_vocab; i++)
        if (quill_tokenizer_is_eog(s->tok, i)) s->eog[s->n_eog++] = i;
    s->st.n_slots = p->n_slots;
    if (pthread_create(&s->thread, NULL, engine, s)) {
        scheduler_free(s);
        return quill_fail(err, QUILL_E_NOMEM, "cannot start the engine thread");
    }
    s->thread_started = true;
    *out = s;
    return QUILL_OK;
}

void scheduler_stop(scheduler *s) {
    if (!s || !s->thread_started) return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->thread_started = false;
}

void scheduler_free(scheduler *s) {
    if (!s) return;
    scheduler_stop(s);
    if (s->slots)
        for (int i = 0; i < s->p.n_slots; i++) {
            free(s->slots[i].cache);
            free(s->slots[i].draft);
            quill_generator_free(s->slots[i].gen);
        }
    free(s->slots);
    free(s->queue);
    free(s->b_tok);
    free(s->b_seq);
    free(s->b_pos);
    free(s->b_want);
    free(s->row_slot);
    free(s->row_pos);
    free(s->logits);
    free(s->raw);
    free(s->eog);
    quill_grammar_vocab_free(s->grammar_vocab);
    quill_drafter_free(s->drafter);
    quill_context_free(s->ctx);
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

bool scheduler_submit(scheduler *s, job *j, api_error *e) {
    if (j->n_prompt <= 0) return api_fail(e, 400, NULL, "the prompt is empty after tokenization");
    if (j->n_prompt > s->p.n_ctx)
        return api_fail(e, 400, NULL,
                        "the prompt has %d tokens but a slot's context holds %d; shorten the conversation or "
                        "start the server with a larger context (-c)",
                        j->n_prompt, s->p.n_ctx);
    pthread_mutex_lock(&s->mu);
    const bool stopping = s->stopping;
    bool ok = !stopping && s->q_len < s->p.max_queue;
    if (ok) {
        j->refs++;
        if (j->prompt_source) {
            j->prompt_source->refs++;
            j->holds_source = true;
        }
        j->t_submit = now_ms();
        s->queue[(s->q_head + s->q_len) % s->p.max_queue] = j;
        s->q_len++;
        pthread_cond_signal(&s->wake);
    }
    pthread_mutex_unlock(&s->mu);
    if (!ok)
        return api_fail(e, 503, NULL, "%s", stopping ? "the server is shutting down"
                                                        : "the server is busy: every slot is working and the queue "
                                                          "is full; retry later");
    return true;
}

void scheduler_cancel(scheduler *s, job *j) {
    pthread_mutex_lock(&s->mu);
    j->cancelled = true;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->mu);
}

void scheduler_lock(scheduler *s) { pthread_mutex_lock(&s->mu); }
void scheduler_unlock(scheduler *s) { pthread_mutex_unlock(&s->mu); }

void scheduler_wait(scheduler *s, job *j, int ms) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)ms * 1000000L;
    ts.tv_sec += ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_cond_timedwait(&j->changed, &s->mu, &ts);
}

void scheduler_stats_get(scheduler *s, scheduler_stats *out) {
    pthread_mutex_lock(&s->mu);
    *out = s->st;
    out->queued = s->q_len;
    pthread_mutex_unlock(&s->mu);
}

int scheduler_n_ctx(const scheduler *s) { return s->p.n_ctx; }
const char *scheduler_kernels(const scheduler *s) { return quill_context_kernels(s->ctx); }

const char *scheduler_backend(const scheduler *s) { return s->backend; }
