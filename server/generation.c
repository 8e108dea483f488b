/* A generation request, shared by the API routes: its body parsed as an OpenAI chat or completions
 * request (the other APIs translate theirs to that), the prompt rendered, one job per choice queued
 * on the scheduler; waiting for whole replies, and reading a chat reply as it grows. The routes turn
 * it into their API's replies (routes_*.c) and streams (sse.c). */
#include "generation.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void gen_free(gen *g) {
    if (!g) return;
    for (int i = 0; i < MAX_CHOICES; i++) {
        job_release(g->srv->sched, g->ch[i].job);
        chat_tools_free(g->ch[i].tools);
    }
    request_free(&g->req);
    free(g->echo_text);
    free(g);
}

void gen_cancel(gen *g) {
    for (int i = 0; i < g->n; i++) scheduler_cancel(g->srv->sched, g->ch[i].job);   /* no-op when finished */
}

/* The text of tokens as the model writes them (invalid UTF-8 as U+FFFD); malloc'd. */
static char *tokens_text(const quill_tokenizer *tok, const int32_t *ids, size_t n) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap), piece[256];
    for (size_t i = 0; out && i < n; i++) {
        int k = quill_token_to_bytes(tok, ids[i], false, piece, sizeof piece);
        if (k < 0) k = 0;
        if ((size_t)k > sizeof piece) k = sizeof piece;
        if (len + (size_t)k + 1 > cap) {
            char *grown = realloc(out, (cap = (len + (size_t)k + 1) * 2));
            if (!grown) {
                free(out);
                return NULL;
            }
            out = grown;
        }
        memcpy(out + len, piece, (size_t)k);
        len += (size_t)k;
    }
    if (!out) return NULL;
    char *text = utf8_sanitize(out, len);
    free(out);
    return text;
}

gen *gen_begin(http_request *r, request_kind kind, const char *body, size_t len, const char *id_prefix, api_error *err_out) {
    server *s = r->srv;
    api_error e;
    gen *g = calloc(1, sizeof *g);
    if (!g) {
        api_fail(err_out, 500, NULL, "out of memory");
        return NULL;
    }
    g->srv = s;
    g->conn = r->conn;
    g->created = (long long)time(NULL);
    snprintf(g->id, sizeof g->id, "%s-%llx%06llx", id_prefix, (unsigned long long)s->created,
             (unsigned long long)atomic_fetch_add(&s->next_id, 1));
    request_limits lim = {s->cfg.max_depth, s->cfg.max_tokens};
    if (!request_parse(body, len, kind, &lim, &g->req, &e)) {
        *err_out = e;
        gen_free(g);
        return NULL;
    }
    gen_request *q = &g->req;
    g->n = q->n > 1 ? q->n : 1;
    for (int i = 0; i < g->n; i++)
        if (!(g->ch[i].job = job_new())) {
            api_fail(&e, 500, NULL, "out of memory");
            *err_out = e;
            gen_free(g);
            return NULL;
        }
    quill_error err;
    int32_t *ids = NULL;
    size_t n = 0;
    quill_status st = QUILL_OK;
    if (kind == REQ_CHAT) {
        char *prompt = NULL;
        if (!chat_tools_prepare(s, body, len, g->id, &g->ch[0].tools, &prompt, &e)) {
            *err_out = e;
            gen_free(g);
            return NULL;
        }
        for (int i = 1; i < g->n; i++)
            if (!(g->ch[i].tools = chat_tools_clone(g->ch[0].tools, i))) {
                free(prompt);
                api_fail(err_out, 500, NULL, "out of memory");
                gen_free(g);
                return NULL;
            }
        /* templates such as Llama 2's write BOS themselves: it is added only when missing */
        int32_t bos = quill_tokenizer_bos(s->tok);
        const char *bos_text = bos >= 0 ? quill_tokenizer_piece(s->tok, bos) : "";
        bool has_bos = bos_text && *bos_text && !strncmp(prompt, bos_text, strlen(bos_text));
        st = quill_tokenize(s->tok, prompt, strlen(prompt), quill_tokenizer_add_bos(s->tok) && !has_bos, true, &ids, &n,
                            &err);
        free(prompt);
    } else if (q->prompt) {
        st = quill_tokenize(s->tok, q->prompt, strlen(q->prompt), true, true, &ids, &n, &err);
    } else {
        int32_t n_vocab = quill_tokenizer_n_vocab(s->tok);
        for (size_t i = 0; i < q->n_prompt_ids; i++)
            if (q->prompt_ids[i] >= n_vocab) {
                api_fail(&e, 400, "prompt", "token id %d is outside the vocabulary (0..%d)", q->prompt_ids[i],
                         n_vocab - 1);
                *err_out = e;
                gen_free(g);
                return NULL;
            }
        ids = q->prompt_ids;
        n = q->n_prompt_ids;
        q->prompt_ids = NULL;
        q->n_prompt_ids = 0;
    }
    if (st) {
        api_fail(&e, st == QUILL_E_NOMEM ? 500 : 400, kind == REQ_CHAT ? "messages" : "prompt", "%s", err.message);
        *err_out = e;
        gen_free(g);
        return NULL;
    }
    if (q->echo && !(g->echo_text = q->prompt ? strdup(q->prompt) : tokens_text(s->tok, ids, n))) {
        free(ids);
        api_fail(err_out, 500, NULL, "out of memory");
        gen_free(g);
        return NULL;
    }
    /* a required or named tool_choice: the reply is a call by construction (the syntax's grammar) */
    const char *grammar = q->grammar, *grammar_param = q->grammar_param;
    char *tool_grammar = NULL;
    const char *trigger = NULL;
    if (g->ch[0].tools && !chat_tools_grammar(g->ch[0].tools, s->tok, &tool_grammar, &trigger, err_out)) {
        free(ids);
        gen_free(g);
        return NULL;
    }
    if (tool_grammar && trigger && (grammar || q->ignore_eos)) {
        /* auto calls yield to the request's own grammar, and cannot end without end of generation */
        free(tool_grammar);
        tool_grammar = NULL;
        trigger = NULL;
    }
    if (tool_grammar) {
        if (grammar || q->ignore_eos) {
            free(tool_grammar);
            free(ids);
            api_fail(err_out, 400, "tool_choice",
                     "a required or named 'tool_choice' constrains the reply itself: it cannot be combined with '%s'",
                     grammar ? (grammar_param ? grammar_param : "grammar") : "ignore_eos");
            gen_free(g);
            return NULL;
        }
        grammar = tool_grammar;
        grammar_param = trigger ? "tools" : "tool_choice";
    }
    /* no seed: a different draw each time, as OpenAI does; with one, choice i draws from seed + i */
    uint64_t seed = q->sp.seed;
    if (!q->seed_given) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec * 0x9E3779B97F4A7C15ull ^ (uint64_t)ts.tv_sec ^ atomic_fetch_add(&s->next_id, 1) << 32;
    }
    for (int i = 0; i < g->n; i++) {
        job *j = g->ch[i].job;
        if (i == 0) j->prompt = ids;
        else if ((j->prompt = malloc((n ? n : 1) * sizeof *ids))) memcpy(j->prompt, ids, n * sizeof *ids);
        if (!j->prompt) {
            if (i == 0) free(ids);
            api_fail(err_out, 500, NULL, "out of memory");
            gen_cancel(g);
            gen_free(g);
            return NULL;
        }
        j->n_prompt = (int)n;
        j->prompt_source = i ? g->ch[0].job : NULL;   /* the choices share the prompt's evaluation */
        j->sp = q->sp;
        j->sp.seed = seed + (uint64_t)i;
        j->max_tokens = q->max_tokens;
        j->stop = q->stop;
        j->n_stop = q->n_stop;
        j->want_logprobs = q->logprobs;
        j->prompt_logprobs = q->echo && q->logprobs;
        if (j->prompt_logprobs && n && (j->prompt_info = calloc(n, sizeof *j->prompt_info))) {
            j->prompt_info[0].id = ids[0];
            j->prompt_info[0].n_top = -1;   /* nothing before the first token predicts it */
        }
        if (j->prompt_logprobs && n && !j->prompt_info) {
            api_fail(err_out, 500, NULL, "out of memory");
            gen_cancel(g);
            gen_free(g);
            return NULL;
        }
        j->top_logprobs = q->top_logprobs;
        j->ignore_eos = q->ignore_eos;
        j->render_special = g->ch[i].tools && chat_tools_render_special(g->ch[i].tools);
        if (grammar) {
            /* parsed with the model's vocabulary (<|token|> names), once per choice (a job owns its grammar) */
            st = quill_grammar_parse(s->tok, grammar, strlen(grammar), NULL, &j->grammar, &err);
            j->grammar_trigger = trigger;
            if (st) {
                api_fail(err_out, st == QUILL_E_NOMEM ? 500 : 400, grammar_param, "%s", err.message);
                free(tool_grammar);
                gen_cancel(g);
                gen_free(g);
                return NULL;
            }
        }
        if (!scheduler_submit(s->sched, j, &e)) {
            *err_out = e;
            free(tool_grammar);
            gen_cancel(g);
            gen_free(g);
            return NULL;
        }
    }
    free(tool_grammar);
    return g;
}

/* ---------------------------------------------------------------- whole replies and accessors */

bool gen_wait(gen *g) {
    server *s = g->srv;
    scheduler_lock(s->sched);
    for (int i = 0; i < g->n; i++) {
        job *j = g->ch[i].job;
        while (!j->done) {
            scheduler_wait(s->sched, j, 200);
            if (j->done) break;
            scheduler_unlock(s->sched);
            if (http_client_gone(g->conn) || atomic_load(&s->stopping)) {
                gen_cancel(g);
                return false;
            }
            scheduler_lock(s->sched);
        }
    }
    return true;
}

bool gen_wait_whole(http_request *r, gen *g, int *reply) {
    if (!gen_wait(g)) {
        gen_free(g);
        *reply = MHD_NO;
        return false;
    }
    for (int i = 0; i < g->n; i++) {
        const job *j = g->ch[i].job;
        if (!j->error_status) continue;
        /* 499 (the client cancelled) cannot reach a client that is still here: a server error */
        api_error e;
        api_fail(&e, j->error_status == 499 ? 500 : j->error_status, NULL, "%s", j->error);
        scheduler_unlock(g->srv->sched);
        gen_free(g);
        *reply = reply_error(r, &e);
        return false;
    }
    return true;
}

job *gen_job(gen *g) { return g->ch[0].job; }
chat_tools *gen_tools(gen *g) { return g->ch[0].tools; }
const char *gen_id(const gen *g) { return g->id; }
const gen_request *gen_req(const gen *g) { return &g->req; }
server *gen_server(const gen *g) { return g->srv; }

bool reply_reader_feed(reply_reader *rr, gen *g, void (*translate)(void *self, const cJSON *delta), void *self) {
    const job *j = gen_job(g);
    if (j->ready <= rr->text_seen && !(j->done && !rr->parsed_final)) return false;
    const bool final = j->done && j->ready == j->text_len;
    cJSON *delta = cJSON_CreateObject();
    bool any = delta && chat_tools_delta(gen_tools(g), j->text, j->ready, final, j->finish_reason, delta, &rr->had_calls);
    rr->text_seen = j->ready;
    rr->parsed_final = final;
    if (any) translate(self, delta);
    cJSON_Delete(delta);
    return any;
}
