/* The generation loop: prompt tokens -> evaluate -> sample -> detokenize -> stop.
 *
 * Every front end (the CLI's run and chat, the server, a program embedding the library) streams
 * through this one loop, so stop conditions mean the same everywhere:
 *   - an end-of-generation token ends it (finish "stop"; the token is neither counted nor shown);
 *   - n_predict tokens, or a context with no room for the next token (finish "length");
 *   - a stop string in the text (finish "stop"; neither it nor what follows is shown);
 *   - the callback returning false or should_stop() returning true (finish "stop", cancelled).
 * Text that ends with the beginning of a stop string is held back until the next tokens either
 * complete the stop string or show it was not one, so a streaming client never receives text it
 * would have to take back.
 *
 * The room src/generation/: the generation loop (this file) and the drafters of speculative
 * decoding (speculative.c). It sits on top of the library: it calls the model's forward pass
 * (quill_decode), the tokenizer and the sampler; only the front ends (cli/, server/, programs
 * embedding the library) call it.
 */
#include "base/error.h"
#include "model/context.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *quill_finish_name(quill_finish f) { return f == QUILL_FINISH_LENGTH ? "length" : "stop"; }

quill_generate_params quill_generate_defaults(void) {
    return (quill_generate_params){.sampling = quill_sampler_defaults(), .n_predict = 128};
}

/* Text produced but not yet given to the callback. */
typedef struct {
    char *buf;
    size_t len, cap;
} held_text;

static bool held_append(held_text *h, const char *s, size_t n) {
    if (h->len + n + 1 > h->cap) {
        size_t cap = (h->len + n + 1) * 2;
        char *g = realloc(h->buf, cap);
        if (!g) return false;
        h->buf = g;
        h->cap = cap;
    }
    memcpy(h->buf + h->len, s, n);
    h->len += n;
    return true;
}

static const char *find_bytes(const char *hay, size_t n, const char *needle, size_t m) {
    if (m == 0 || m > n) return NULL;
    for (size_t i = 0; i + m <= n; i++)
        if (hay[i] == needle[0] && !memcmp(hay + i, needle, m)) return hay + i;
    return NULL;
}

long quill_stop_scan(const char *text, size_t len, const char *const *stop, size_t n_stop, size_t *release) {
    long best = -1;
    for (size_t i = 0; i < n_stop; i++) {
        const char *s = stop[i];
        if (!s || !*s) continue;
        const char *at = find_bytes(text, len, s, strlen(s));
        if (at && (best < 0 || at - text < best)) best = at - text;
    }
    /* everything before the earliest suffix that is a proper beginning of some stop string */
    size_t free_bytes = len;
    for (size_t start = 0; start < len && free_bytes == len; start++) {
        size_t tail = len - start;
        for (size_t i = 0; i < n_stop; i++) {
            const char *s = stop[i];
            if (s && strlen(s) > tail && !memcmp(text + start, s, tail)) {
                free_bytes = start;
                break;
            }
        }
    }
    if (release) *release = best >= 0 ? (size_t)best : free_bytes;
    return best;
}

/* ---------------------------------------------------------------- the generator */

struct quill_generator {
    const quill_tokenizer *tok;
    quill_sampler *sampler, *own;
    int n_predict;
    bool penalize_prompt, text_start, render_special;
    char **stop;
    size_t n_stop;
    quill_detokenizer dt;
    held_text held;         /* produced, not yet final */
    held_text out;          /* released by the current step */
    quill_generate_result res;
    bool done;
};

quill_status quill_generator_new(const quill_tokenizer *tok, quill_sampler *sampler, const quill_generate_params *params,
                                 quill_generator **out, quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "generator: `out` must not be NULL");
    *out = NULL;
    if (!tok) return quill_fail(err, QUILL_E_ARG, "generator: no tokenizer given");
    quill_generate_params p = params ? *params : quill_generate_defaults();
    if (p.n_stop && !p.stop) return quill_fail(err, QUILL_E_ARG, "generator: %zu stop strings but no array", p.n_stop);
    if (p.grammar && sampler)
        return quill_fail(err, QUILL_E_ARG, "generator: a grammar in the parameters goes into the sampler the "
                                            "generator makes; add it to your own with quill_sampler_add_grammar()");
    if (p.grammar && !p.grammar_vocab)
        return quill_fail(err, QUILL_E_ARG, "generator: a grammar needs the vocabulary index (quill_grammar_vocab_new)");
    quill_generator *g = calloc(1, sizeof *g);
    if (!g) return quill_fail(err, QUILL_E_NOMEM, "generator: out of memory");
    g->tok = tok;
    g->n_predict = p.n_predict;
    g->penalize_prompt = p.penalize_prompt;
    g->text_start = p.text_start;
    g->render_special = p.render_special;
    if (p.n_stop && !(g->stop = calloc(p.n_stop, sizeof *g->stop))) goto oom;
    for (size_t i = 0; i < p.n_stop; i++) {
        if (!p.stop[i]) continue;
        if (!(g->stop[i] = strdup(p.stop[i]))) goto oom;
        g->n_stop = i + 1;
    }
    g->n_stop = p.n_stop;
    if (!sampler) {
        quill_status st = quill_sampler_new(&p.sampling, quill_tokenizer_n_vocab(tok), &g->own, err);
        if (!st && p.grammar)
            st = p.n_grammar_triggers ? quill_sampler_add_grammar_lazy(g->own, p.grammar, p.grammar_vocab, p.grammar_triggers,
                                                                       p.n_grammar_triggers, err)
                                      : quill_sampler_add_grammar(g->own, p.grammar, p.grammar_vocab, err);
        if (st) {
            quill_generator_free(g);
            return st;
        }
        sampler = g->own;
    }
    g->sampler = sampler;
    quill_generator_begin(g, NULL, 0);
    *out = g;
    return QUILL_OK;
oom:
    quill_generator_free(g);
    return quill_fail(err, QUILL_E_NOMEM, "generator: out of memory for the stop strings");
}

void quill_generator_free(quill_generator *g) {
    if (!g) return;
    for (size_t i = 0; g->stop && i < g->n_stop; i++) free(g->stop[i]);
    free(g->stop);
    free(g->held.buf);
    free(g->out.buf);
    quill_sampler_free(g->own);
    free(g);
}

quill_sampler *quill_generator_sampler(quill_generator *g) { return g ? g->sampler : NULL; }

const quill_generate_result *quill_generator_result(const quill_generator *g) { return g ? &g->res : NULL; }

void quill_generator_begin(quill_generator *g, const int32_t *prompt, size_t n_prompt) {
    if (!g) return;
    memset(&g->res, 0, sizeof g->res);
    g->res.finish = QUILL_FINISH_STOP;
    g->held.len = g->out.len = 0;
    g->done = false;
    quill_detokenizer_init(&g->dt, g->tok, g->render_special, g->text_start);
    if (g->penalize_prompt && prompt)
        for (size_t i = 0; i < n_prompt; i++) quill_sampler_accept_prompt(g->sampler, prompt[i]);
}

/* Moves the first n held bytes to the step's output. */
static bool release(quill_generator *g, size_t n) {
    if (n && !held_append(&g->out, g->held.buf, n)) return false;
    memmove(g->held.buf, g->held.buf + n, g->held.len - n);
    g->held.len -= n;
    return true;
}

/* The end: what the detokenizer and the stop-string check still hold becomes final (cut at a stop
 * string that only the last bytes complete). */
static bool release_all(quill_generator *g) {
    char piece[64];
    size_t len = quill_detokenizer_flush(&g->dt, piece, sizeof piece);
    if (len && !held_append(&g->held, piece, len)) return false;
    long at = g->held.len ? quill_stop_scan(g->held.buf, g->held.len, (const char *const *)g->stop, g->n_stop, NULL) : -1;
    if (at >= 0) {
        g->held.len = (size_t)at;
        g->res.stop_string = true;
        g->res.finish = QUILL_FINISH_STOP;
    }
    return release(g, g->held.len);
}

quill_status quill_generator_step(quill_generator *g, float *logits, bool room, quill_generator_event *out,
                                  quill_error *err) {
    if (!g || !logits || !out) return quill_fail(err, QUILL_E_ARG, "generator step: no generator, logits or output");
    memset(out, 0, sizeof *out);
    out->token = -1;
    if (g->done) return quill_fail(err, QUILL_E_ARG, "generator step: the generation is over; begin a new one first");
    g->out.len = 0;
    int32_t next = quill_sampler_sample(g->sampler, logits);
    if (next < 0) {
        const char *why = quill_sampler_error(g->sampler);
        return quill_fail(err, QUILL_E_ARG, "generation: %s", why ? why : "the sampler chose no token");
    }
    out->token = next;
    quill_sampler_accept(g->sampler, next);
    bool oom = false;
    size_t text_len = 0;
    if (quill_tokenizer_is_eog(g->tok, next)) {
        out->eog = g->done = true;
        g->res.finish = QUILL_FINISH_STOP;
    } else {
        g->res.n_generated++;
        char piece[512];
        size_t len = quill_detokenizer_push(&g->dt, next, piece, sizeof piece);
        oom = !held_append(&g->held, piece, len);
        size_t n = 0;
        long at = oom ? -1 : quill_stop_scan(g->held.buf, g->held.len, (const char *const *)g->stop, g->n_stop, &n);
        if (at >= 0) {
            g->held.len = (size_t)at;
            g->res.stop_string = g->done = true;
            g->res.finish = QUILL_FINISH_STOP;
            n = g->held.len;
        }
        oom = oom || !release(g, n);
        text_len = g->out.len;
        if (!g->done && g->n_predict >= 0 && g->res.n_generated >= g->n_predict) {
            g->done = true;
            g->res.finish = QUILL_FINISH_LENGTH;
        } else if (!g->done && !room) {
            g->done = g->res.context_full = true;
            g->res.finish = QUILL_FINISH_LENGTH;
        }
    }
    if (g->done && !g->res.stop_string) oom = oom || !release_all(g);
    if (oom) {
        g->done = true;
        return quill_fail(err, QUILL_E_NOMEM, "generation: out of memory for the generated text");
    }
    out->done = g->done;
    out->text = g->out.buf;
    out->len = text_len;
    out->tail = g->out.buf ? g->out.buf + text_len : NULL;
    out->tail_len = g->out.len - text_len;
    return QUILL_OK;
}

/* ---------------------------------------------------------------- the convenience loop */

typedef struct {
    quill_generate_fn fn;
    void *user;
    bool cancelled;
} sink;

static void deliver(sink *k, int32_t token, const char *text, size_t len) {
    if (k->fn && !k->cancelled && !k->fn(token, text, len, k->user)) k->cancelled = true;
}

typedef struct {
    int32_t *v;
    size_t n, cap;
} token_seq;

static bool seq_push(token_seq *q, const int32_t *t, size_t n) {
    if (q->n + n > q->cap) {
        size_t cap = (q->n + n) * 2;
        int32_t *v = realloc(q->v, cap * sizeof *v);
        if (!v) return false;
        q->v = v;
        q->cap = cap;
    }
    memcpy(q->v + q->n, t, n * sizeof *t);
    q->n += n;
    return true;
}

/* The generation after the prompt: `logits` holds the last prompt token's row. Each round
 * evaluates the token drawn last and, with a drafter, the tokens drafted to follow it, in one
 * batch; then the generator steps on the rows in order while it draws the drafted tokens. Row i
 * holds the logits after position at + i, so a step there sees the context as plain decoding
 * would (at + i + 1 tokens); where the draw leaves the draft, the positions after it are
 * forgotten. Without a drafter every batch is the one token: plain decoding. */
static quill_status generate_tokens(quill_context *c, quill_generator *g, const quill_generate_params *p,
                                    const int32_t *prompt, size_t n_prompt, float *logits, sink *k,
                                    quill_generate_result *res, quill_error *err) {
    const int32_t n_vocab = (int32_t)c->hp->n_vocab;
    const int n_ctx = quill_context_n_ctx(c);
    const int n_max = p->drafter ? quill_drafter_n_max(p->drafter) : 0;
    int32_t *batch = malloc(((size_t)n_max + 1) * sizeof *batch);
    token_seq seq = {0};
    bool oom = !batch;
    if (p->drafter && !oom)
        oom = (p->n_history && !seq_push(&seq, p->history, p->n_history)) || !seq_push(&seq, prompt, n_prompt);
    if (oom) {
        free(batch);
        free(seq.v);
        return quill_fail(err, QUILL_E_NOMEM, "generate: out of memory for the draft");
    }
    quill_status st = QUILL_OK;
    int at = quill_context_pos(c) - 1, n_rows = 1;
    for (bool over = false; !over;) {
        int32_t next = -1;
        for (int i = 0; i < n_rows && !over; i++) {
            if (p->should_stop && p->should_stop(p->should_stop_user)) k->cancelled = true;
            float *row = logits + (size_t)i * n_vocab;
            quill_generator_event s = {0};
            if (!k->cancelled) {
                if (p->step_logits) p->step_logits(row, n_vocab, p->step_logits_user);
                st = quill_generator_step(g, row, at + i + 1 < n_ctx, &s, err);
            }
            if (!st && !k->cancelled && !s.eog) deliver(k, s.token, s.text, s.len);
            over = st || k->cancelled || s.done;
            if (!over && i + 1 < n_rows && s.token == batch[i + 1]) {
                res->n_accepted++;
                if (p->drafter && !seq_push(&seq, &s.token, 1)) oom = over = true;
                continue;
            }
            /* the context keeps what this row saw; drafted positions after it go */
            quill_seq_truncate(c, 0, at + i + 1);
            if (over) {
                if (!st && !k->cancelled && s.done && s.tail_len) deliver(k, -1, s.tail, s.tail_len);
                break;
            }
            next = s.token;
            break;
        }
        if (over) break;
        at = quill_context_pos(c);
        batch[0] = next;
        int n_draft = 0;
        if (p->drafter) {
            if (!seq_push(&seq, &next, 1)) {
                oom = true;
                break;
            }
            /* the batch must fit the context, and drafting past the length limit is wasted */
            int max = n_ctx - at - 1;
            if (max > n_max) max = n_max;
            const int left = p->n_predict - quill_generator_result(g)->n_generated - 1;
            if (p->n_predict >= 0 && left < max) max = left;
            if (max > 0 && (st = quill_drafter_draft(p->drafter, 0, seq.v, seq.n, max, batch + 1, &n_draft, err))) break;
        }
        res->n_drafted += n_draft;
        n_rows = n_draft + 1;
        if ((st = quill_eval(c, batch, n_rows, logits, true, err))) break;
    }
    free(batch);
    free(seq.v);
    if (oom && !st) st = quill_fail(err, QUILL_E_NOMEM, "generate: out of memory for the draft");
    return st;
}

quill_status quill_generate(quill_context *c, quill_sampler *sampler, const int32_t *prompt, size_t n_prompt,
                            const quill_generate_params *params, quill_generate_fn fn, void *user,
                            quill_generate_result *result, quill_error *err) {
    quill_generate_result res_local;
    quill_generate_result *res = result ? result : &res_local;
    memset(res, 0, sizeof *res);
    res->finish = QUILL_FINISH_STOP;
    if (!c) return quill_fail(err, QUILL_E_ARG, "generate: no context given");
    if (!prompt || n_prompt == 0)
        return quill_fail(err, QUILL_E_ARG, "generate: the prompt is empty (nothing to evaluate)");
    quill_generate_params p = params ? *params : quill_generate_defaults();
    const int32_t n_vocab = (int32_t)c->hp->n_vocab;
    if (n_prompt > (size_t)(quill_context_n_ctx(c) - quill_context_pos(c)))
        return quill_fail(err, QUILL_E_CONTEXT,
                          "the prompt has %zu tokens but the context has room for %d more (%d of %d used); use a "
                          "larger context (-c) or a shorter prompt",
                          n_prompt, quill_context_n_ctx(c) - quill_context_pos(c), quill_context_pos(c), quill_context_n_ctx(c));

    quill_generator *g = NULL;
    quill_status st = quill_generator_new(quill_model_tokenizer(c->model), sampler, &p, &g, err);
    if (st) return st;
    /* a row for the last token and one for each drafted token */
    const size_t rows = p.drafter ? (size_t)quill_drafter_n_max(p.drafter) + 1 : 1;
    float *logits = malloc(rows * (size_t)n_vocab * sizeof *logits);
    if (!logits) {
        quill_generator_free(g);
        return quill_fail(err, QUILL_E_NOMEM, "generate: out of memory for %d logits", (int)n_vocab);
    }
    sink k = {fn, user, false};

    /* The prompt, in micro-batch pieces when the caller may want to stop it (the same arithmetic
     * as one call: the context evaluates micro-batches of this size anyway). */
    double t0 = now_ms();
    quill_trace_fn saved_trace = c->trace;
    void *saved_trace_user = c->trace_user;
    if (p.prompt_trace) quill_context_set_trace(c, p.prompt_trace, p.prompt_trace_user);
    size_t step = p.should_stop && !p.prompt_logits ? QUILL_UBATCH : n_prompt;
    for (size_t done = 0; done < n_prompt && !st;) {
        if (p.should_stop && p.should_stop(p.should_stop_user)) {
            k.cancelled = true;
            break;
        }
        size_t n = n_prompt - done < step ? n_prompt - done : step;
        st = quill_eval(c, prompt + done, (int)n, p.prompt_logits ? p.prompt_logits : logits, p.prompt_logits != NULL,
                        err);
        done += n;
        if (!st) res->n_prompt = (int)done;
    }
    if (p.prompt_trace) quill_context_set_trace(c, saved_trace, saved_trace_user);
    /* a draft model reads the prompt in the prompt's time, not in the first draft's */
    if (!st && !k.cancelled && p.drafter && !p.n_history) st = quill_drafter_prepare(p.drafter, 0, prompt, n_prompt, err);
    res->prompt_ms = now_ms() - t0;
    if (st || k.cancelled) goto done;
    quill_generator_begin(g, prompt, n_prompt);
    if (p.prompt_logits) memcpy(logits, p.prompt_logits + (n_prompt - 1) * (size_t)n_vocab, (size_t)n_vocab * sizeof *logits);
    double t1 = now_ms();
    if (p.n_predict != 0) st = generate_tokens(c, g, &p, prompt, n_prompt, logits, &k, res, err);
    res->generation_ms = now_ms() - t1;
    const quill_generate_result *r = quill_generator_result(g);
    res->n_generated = r->n_generated;
    res->stop_string = r->stop_string;
    res->context_full = r->context_full;
    res->finish = p.n_predict == 0 ? QUILL_FINISH_LENGTH : r->finish;
    if (k.cancelled || st) res->finish = QUILL_FINISH_STOP;
done:
    res->cancelled = k.cancelled;
    free(logits);
    quill_generator_free(g);
    return st;
}

quill_status quill_generate_text(quill_context *c, const char *prompt, const quill_generate_params *p,
                                 quill_generate_fn fn, void *user, quill_generate_result *result,
                                 quill_error *err) {
    if (!c || !prompt) return quill_fail(err, QUILL_E_ARG, "generate: no context or prompt given");
    int32_t *ids = NULL;
    size_t n = 0;
    quill_status s = quill_tokenize(quill_model_tokenizer(c->model), prompt, strlen(prompt), true, false, &ids, &n, err);
    if (s) return s;
    quill_context_truncate(c, 0);
    quill_generate_params q = p ? *p : quill_generate_defaults();
    q.text_start = false;
    s = quill_generate(c, NULL, ids, n, &q, fn, user, result, err);
    free(ids);
    return s;
}
