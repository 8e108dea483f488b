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
 * would have to take back. */
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

typedef struct {
    quill_generate_fn fn;
    void *user;
    bool cancelled;
} sink;

static void deliver(sink *k, int32_t token, const char *text, size_t len) {
    if (k->fn && !k->cancelled && !k->fn(token, text, len, k->user)) k->cancelled = true;
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
    const quill_tokenizer *tok = quill_model_tokenizer(c->model);
    if (n_prompt > (size_t)(quill_context_n_ctx(c) - quill_context_pos(c)))
        return quill_fail(err, QUILL_E_CONTEXT,
                          "the prompt has %zu tokens but the context has room for %d more (%d of %d used); use a "
                          "larger context (-c) or a shorter prompt",
                          n_prompt, quill_context_n_ctx(c) - quill_context_pos(c), quill_context_pos(c), quill_context_n_ctx(c));

    quill_sampler *own = NULL;
    if (!sampler) {
        quill_status s = quill_sampler_new(&p.sampling, n_vocab, &own, err);
        if (s) return s;
        sampler = own;
    }
    float *logits = malloc((size_t)n_vocab * sizeof *logits);
    held_text held = {0};
    if (!logits) {
        quill_sampler_free(own);
        return quill_fail(err, QUILL_E_NOMEM, "generate: out of memory for %d logits", (int)n_vocab);
    }
    quill_status st = QUILL_OK;
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
    res->prompt_ms = now_ms() - t0;
    if (st || k.cancelled) goto done;
    if (p.penalize_prompt)
        for (size_t i = 0; i < n_prompt; i++) quill_sampler_accept(sampler, prompt[i]);
    const float *last = p.prompt_logits ? p.prompt_logits + (n_prompt - 1) * (size_t)n_vocab : logits;
    if (last != logits) memcpy(logits, last, (size_t)n_vocab * sizeof *logits); /* the sampler modifies it */

    quill_detokenizer dt;
    quill_detokenizer_init(&dt, tok, false, p.text_start);
    double t1 = now_ms();
    char piece[512];
    bool stopped = false;
    while (p.n_predict < 0 || res->n_generated < p.n_predict) {
        if (p.should_stop && p.should_stop(p.should_stop_user)) {
            k.cancelled = true;
            break;
        }
        int32_t next = quill_sampler_sample(sampler, logits);
        if (quill_tokenizer_is_eog(tok, next)) {
            stopped = true;
            break;
        }
        res->n_generated++;
        quill_sampler_accept(sampler, next);
        size_t len = quill_detokenizer_push(&dt, next, piece, sizeof piece);
        if (p.n_stop == 0) {
            deliver(&k, next, piece, len);
        } else {
            if (!held_append(&held, piece, len)) {
                st = quill_fail(err, QUILL_E_NOMEM, "generate: out of memory for the generated text");
                break;
            }
            size_t n;
            long at = quill_stop_scan(held.buf, held.len, p.stop, p.n_stop, &n);
            if (at >= 0) {
                held.len = (size_t)at;
                res->stop_string = stopped = true;
                deliver(&k, next, held.buf, held.len);
                held.len = 0;
                break;
            }
            deliver(&k, next, held.buf, n);
            memmove(held.buf, held.buf + n, held.len - n);
            held.len -= n;
        }
        if (k.cancelled) break;
        if (p.n_predict >= 0 && res->n_generated >= p.n_predict) break;
        if (quill_context_pos(c) >= quill_context_n_ctx(c)) {
            res->context_full = true;
            break;
        }
        st = quill_eval(c, &next, 1, logits, false, err);
        if (st) break;
    }
    if (!st && !k.cancelled && !res->stop_string) {
        /* What the detokenizer and the stop-string check still hold is text the caller gets. */
        size_t len = quill_detokenizer_flush(&dt, piece, sizeof piece);
        if (len && !held_append(&held, piece, len)) {
            st = quill_fail(err, QUILL_E_NOMEM, "generate: out of memory for the generated text");
        } else {
            long at = held.len ? quill_stop_scan(held.buf, held.len, p.stop, p.n_stop, NULL) : -1;
            if (at >= 0) {
                held.len = (size_t)at;
                res->stop_string = stopped = true;
            }
            if (held.len) deliver(&k, -1, held.buf, held.len);
        }
    }
    res->generation_ms = now_ms() - t1;
    if (!stopped && !k.cancelled && !st) res->finish = QUILL_FINISH_LENGTH;
done:
    res->cancelled = k.cancelled;
    free(held.buf);
    free(logits);
    quill_sampler_free(own);
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
