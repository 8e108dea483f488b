/* OpenAI's generation routes: /v1/chat/completions and /v1/completions, whole replies and
 * Server-Sent Events streams as OpenAI sends them (a first delta with the role, content deltas, a
 * last chunk with finish_reason, an optional usage chunk, `data: [DONE]`), and /v1/models. */
#include "server.h"
#include "generation.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- JSON pieces */

static cJSON *token_bytes(const int32_t id, const quill_tokenizer *tok, char *piece, size_t cap, int *len) {
    int n = quill_token_to_bytes(tok, id, false, piece, cap);
    if (n < 0) n = 0;
    if ((size_t)n > cap) n = (int)cap;
    *len = n;
    cJSON *bytes = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(bytes, cJSON_CreateNumber((unsigned char)piece[i]));
    return bytes;
}

/* A token as text: its bytes, with U+FFFD for a character it holds only part of. */
static void add_token_text(cJSON *o, const char *key, const char *piece, int len) {
    char *text = utf8_sanitize(piece, (size_t)len);
    cJSON_AddStringToObject(o, key, text ? text : "");
    free(text);
}

/* Chat logprobs: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}, ...]} */
cJSON *logprobs_array(const quill_tokenizer *tok, const token_info *t, size_t n) {
    cJSON *content = cJSON_CreateArray();
    char piece[256];
    int len;
    for (size_t i = 0; i < n; i++) {
        cJSON *e = cJSON_CreateObject();
        cJSON *bytes = token_bytes(t[i].id, tok, piece, sizeof piece, &len);
        add_token_text(e, "token", piece, len);
        cJSON_AddNumberToObject(e, "logprob", t[i].logprob);
        cJSON_AddItemToObject(e, "bytes", bytes);
        cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
        for (int k = 0; k < t[i].n_top; k++) {
            cJSON *a = cJSON_CreateObject();
            cJSON *ab = token_bytes(t[i].top_id[k], tok, piece, sizeof piece, &len);
            add_token_text(a, "token", piece, len);
            cJSON_AddNumberToObject(a, "logprob", t[i].top_logprob[k]);
            cJSON_AddItemToObject(a, "bytes", ab);
            cJSON_AddItemToArray(top, a);
        }
        cJSON_AddItemToArray(content, e);
    }
    return content;
}

static cJSON *chat_logprobs(const quill_tokenizer *tok, const token_info *t, size_t n) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddItemToObject(lp, "content", logprobs_array(tok, t, n));
    return lp;
}

/* The legacy completions' logprobs: {"tokens", "token_logprobs", "top_logprobs", "text_offset"}, with
 * the tokens of `t` appended from text offset *offset on; a token with n_top -1 (an echoed prompt's
 * first) has null log-probabilities. `text_start`: the tokens begin a text whose first word lost
 * the space the tokenizer put before it (an echoed prompt), which the offsets then skip. */
static cJSON *completion_logprobs_new(void) {
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

static void completion_logprobs_add(cJSON *lp, const quill_tokenizer *tok, const token_info *t, size_t n, size_t *offset,
                                    bool text_start) {
    cJSON *tokens = cJSON_GetObjectItem(lp, "tokens"), *lps = cJSON_GetObjectItem(lp, "token_logprobs");
    cJSON *tops = cJSON_GetObjectItem(lp, "top_logprobs"), *offs = cJSON_GetObjectItem(lp, "text_offset");
    char piece[256];
    for (size_t i = 0; i < n; i++) {
        int len = quill_token_to_bytes(tok, t[i].id, false, piece, sizeof piece);
        if (len < 0) len = 0;
        if ((size_t)len > sizeof piece) len = sizeof piece;
        char *text = utf8_sanitize(piece, (size_t)len);
        cJSON_AddItemToArray(tokens, cJSON_CreateString(text ? text : ""));
        free(text);
        if (text_start && len > 0) {
            if (piece[0] == ' ') len--;
            text_start = false;
        }
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)*offset));
        *offset += (size_t)len;
        if (t[i].n_top < 0) {
            cJSON_AddItemToArray(lps, cJSON_CreateNull());
            cJSON_AddItemToArray(tops, cJSON_CreateNull());
            continue;
        }
        cJSON_AddItemToArray(lps, cJSON_CreateNumber(t[i].logprob));
        cJSON *top = cJSON_CreateObject();
        for (int k = 0; k < t[i].n_top; k++) {
            int l2 = quill_token_to_bytes(tok, t[i].top_id[k], false, piece, sizeof piece);
            if (l2 < 0) l2 = 0;
            if ((size_t)l2 > sizeof piece) l2 = sizeof piece;
            char *alt = utf8_sanitize(piece, (size_t)l2);
            if (alt && !cJSON_GetObjectItemCaseSensitive(top, alt)) cJSON_AddNumberToObject(top, alt, t[i].top_logprob[k]);
            free(alt);
        }
        cJSON_AddItemToArray(tops, top);
    }
}

static cJSON *completion_logprobs(const quill_tokenizer *tok, const token_info *t, size_t n, size_t offset) {
    cJSON *lp = completion_logprobs_new();
    completion_logprobs_add(lp, tok, t, n, &offset, false);
    return lp;
}

/* Under the scheduler's mutex. */
static cJSON *usage_object(const job *j) {
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_generated);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", j->n_cached);
    return u;
}

/* llama-server's timings: what was taken from the cache, evaluated, generated, and how fast. */
static cJSON *timings_object(const job *j) {
    cJSON *t = cJSON_CreateObject();
    double prompt_ms = j->t_first > 0 ? j->t_first - j->t_start : 0;
    double gen_ms = j->t_end > j->t_first && j->t_first > 0 ? j->t_end - j->t_first : 0;
    int prompt_n = j->n_prompt - j->n_cached;
    cJSON_AddNumberToObject(t, "cache_n", j->n_cached);
    cJSON_AddNumberToObject(t, "prompt_n", prompt_n);
    cJSON_AddNumberToObject(t, "prompt_ms", prompt_ms);
    cJSON_AddNumberToObject(t, "prompt_per_second", prompt_ms > 0 ? prompt_n / (prompt_ms / 1e3) : 0);
    cJSON_AddNumberToObject(t, "predicted_n", j->n_generated);
    cJSON_AddNumberToObject(t, "predicted_ms", gen_ms);
    cJSON_AddNumberToObject(t, "predicted_per_second",
                            gen_ms > 0 && j->n_generated > 1 ? (j->n_generated - 1) / (gen_ms / 1e3) : 0);
    cJSON_AddNumberToObject(t, "queue_ms", j->t_start > 0 ? j->t_start - j->t_submit : 0);
    cJSON_AddNumberToObject(t, "slot", j->slot);
    if (j->n_drafted) { /* speculative decoding, as llama-server names it */
        cJSON_AddNumberToObject(t, "draft_n", j->n_drafted);
        cJSON_AddNumberToObject(t, "draft_n_accepted", j->n_accepted);
    }
    return t;
}

static cJSON *envelope(const gen *g, const char *object) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", g->id);
    cJSON_AddStringToObject(o, "object", object);
    cJSON_AddNumberToObject(o, "created", (double)g->created);
    cJSON_AddStringToObject(o, "model", g->srv->model_id);
    cJSON_AddStringToObject(o, "system_fingerprint", "quill");
    return o;
}

/* Parses, renders the prompt, and queues the job. NULL after replying with an error. */
static gen *gen_start(http_request *r, request_kind kind, int *ret) {
    api_error e;
    gen *g = gen_begin(r, kind, r->body, r->body_len, kind == REQ_CHAT ? "chatcmpl" : "cmpl", &e);
    if (!g) *ret = reply_error(r, &e);
    return g;
}

/* ---------------------------------------------------------------- whole replies */

/* Usage over the choices: the prompt once, every choice's completion. Under the scheduler's mutex. */
static cJSON *usage_all(const gen *g) {
    cJSON *u = usage_object(g->ch[0].job);
    int completion = 0;
    for (int i = 0; i < g->n; i++) completion += g->ch[i].job->n_generated;
    cJSON_ReplaceItemInObject(u, "completion_tokens", cJSON_CreateNumber(completion));
    cJSON_ReplaceItemInObject(u, "total_tokens", cJSON_CreateNumber(g->ch[0].job->n_prompt + completion));
    return u;
}

static int reply_whole(http_request *r, gen *g) {
    server *s = r->srv;
    int reply;
    if (!gen_wait_whole(r, g, &reply)) return reply;
    const bool chat = g->req.kind == REQ_CHAT;
    cJSON *root = envelope(g, chat ? "chat.completion" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(root, "choices");
    for (int i = 0; i < g->n; i++) {
        const job *j = g->ch[i].job;
        const char *finish_reason = j->finish_reason;
        cJSON *c = cJSON_CreateObject();
        cJSON_AddNumberToObject(c, "index", i);
        if (chat) {
            cJSON *msg = cJSON_AddObjectToObject(c, "message");
            cJSON_AddStringToObject(msg, "role", "assistant");
            chat_tools_message(g->ch[i].tools, j->text, j->text_len, msg, &finish_reason);
        } else {
            size_t echo_len = g->echo_text ? strlen(g->echo_text) : 0;
            char *text = malloc(echo_len + j->text_len + 1);
            if (text) {
                if (echo_len) memcpy(text, g->echo_text, echo_len);
                if (j->text_len) memcpy(text + echo_len, j->text, j->text_len);
                text[echo_len + j->text_len] = 0;
            }
            cJSON_AddStringToObject(c, "text", text ? text : "");
            free(text);
        }
        if (j->want_logprobs && chat) {
            cJSON_AddItemToObject(c, "logprobs", chat_logprobs(s->tok, j->tokens, j->n_tokens));
        } else if (j->want_logprobs) {
            cJSON *lp = completion_logprobs_new();
            size_t offset = 0;
            if (j->prompt_info) {
                completion_logprobs_add(lp, s->tok, j->prompt_info, (size_t)j->n_prompt, &offset, g->echo_text[0] != ' ');
                offset = strlen(g->echo_text);   /* the echoed prompt as given, before the reply */
            }
            completion_logprobs_add(lp, s->tok, j->tokens, j->n_tokens, &offset, false);
            cJSON_AddItemToObject(c, "logprobs", lp);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
        cJSON_AddStringToObject(c, "finish_reason", finish_reason);
        cJSON_AddItemToArray(choices, c);
    }
    cJSON_AddItemToObject(root, "usage", usage_all(g));
    cJSON_AddItemToObject(root, "timings", timings_object(g->ch[0].job));
    scheduler_unlock(s->sched);
    gen_free(g);
    return reply_json(r, 200, root);
}

/* ---------------------------------------------------------------- streams */

static void out_event(gen *g, cJSON *o) { sse_json(&g->base, NULL, o); }

static cJSON *chunk(gen *g, int index, cJSON **choice) {
    const bool chat = g->req.kind == REQ_CHAT;
    cJSON *o = envelope(g, chat ? "chat.completion.chunk" : "text_completion");
    cJSON *choices = cJSON_AddArrayToObject(o, "choices");
    *choice = cJSON_CreateObject();
    cJSON_AddNumberToObject(*choice, "index", index);
    cJSON_AddItemToArray(choices, *choice);
    if (g->req.include_usage) cJSON_AddNullToObject(o, "usage");
    return o;
}

/* The events a choice's progress allows, under the scheduler's mutex. False: nothing new. */
static bool produce_choice(gen *g, int index) {
    choice *ch = &g->ch[index];
    const job *j = ch->job;
    const bool chat = g->req.kind == REQ_CHAT;
    const quill_tokenizer *tok = g->srv->tok;
    cJSON *c;
    bool produced = false;
    size_t new_tokens = j->n_tokens - ch->tokens_sent;
    if (chat && (j->ready > ch->text_sent || (new_tokens && j->want_logprobs) || (j->done && !ch->parsed_final))) {
        /* the reply so far, parsed: what it adds to content, reasoning and calls */
        bool final = j->done && j->ready == j->text_len;
        cJSON *o = chunk(g, index, &c);
        bool any = chat_tools_delta(ch->tools, j->text, j->ready, final, j->finish_reason,
                                    cJSON_AddObjectToObject(c, "delta"), &ch->had_calls);
        ch->parsed_final = final;
        ch->text_sent = j->ready;
        if (any || (new_tokens && j->want_logprobs)) {
            if (j->want_logprobs && new_tokens)
                cJSON_AddItemToObject(c, "logprobs", chat_logprobs(tok, j->tokens + ch->tokens_sent, new_tokens));
            else cJSON_AddNullToObject(c, "logprobs");
            cJSON_AddNullToObject(c, "finish_reason");
            out_event(g, o);
            ch->tokens_sent = j->n_tokens;
            produced = true;
        } else {
            cJSON_Delete(o);
        }
    } else if (!chat && (j->ready > ch->text_sent || (new_tokens && j->want_logprobs))) {
        size_t n = j->ready > ch->text_sent ? j->ready - ch->text_sent : 0;
        cJSON *o = chunk(g, index, &c);
        char *piece = malloc(n + 1);
        if (!piece) {
            cJSON_Delete(o);
            return false;
        }
        memcpy(piece, j->text + ch->text_sent, n);
        piece[n] = 0;
        cJSON_AddStringToObject(c, "text", piece);
        free(piece);
        if (j->want_logprobs && new_tokens)
            cJSON_AddItemToObject(c, "logprobs", completion_logprobs(tok, j->tokens + ch->tokens_sent, new_tokens,
                                                                     ch->text_sent + (g->echo_text ? strlen(g->echo_text) : 0)));
        else cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddNullToObject(c, "finish_reason");
        out_event(g, o);
        ch->text_sent += n;
        ch->tokens_sent = j->n_tokens;
        produced = true;
    }
    if (j->done && !ch->finished && ch->text_sent == j->ready && (!chat || ch->parsed_final)) {
        cJSON *o = chunk(g, index, &c);
        if (chat) cJSON_AddObjectToObject(c, "delta");
        else cJSON_AddStringToObject(c, "text", "");
        cJSON_AddNullToObject(c, "logprobs");
        cJSON_AddStringToObject(c, "finish_reason",
                                ch->had_calls && !strcmp(j->finish_reason, "stop") ? "tool_calls" : j->finish_reason);
        cJSON_AddItemToObject(o, "timings", timings_object(j));
        out_event(g, o);
        ch->finished = true;
        produced = true;
    }
    return produced;
}

/* The events the request's progress allows, under the scheduler's mutex. False: nothing new. */
static bool produce(sse_stream *s) {
    gen *g = (gen *)s;
    const bool chat = g->req.kind == REQ_CHAT;
    cJSON *c;
    if (g->phase == PHASE_ROLE && g->echo_text) {
        /* the echoed prompt comes first, once it is evaluated (its log-probabilities with it) */
        for (int i = 0; i < g->n; i++)
            if (!g->ch[i].job->done && g->ch[i].job->t_first == 0) return false;
        for (int i = 0; i < g->n; i++) {
            const job *j = g->ch[i].job;
            cJSON *o = chunk(g, i, &c);
            cJSON_AddStringToObject(c, "text", g->echo_text);
            if (j->prompt_info) {
                cJSON *lp = completion_logprobs_new();
                size_t offset = 0;
                completion_logprobs_add(lp, g->srv->tok, j->prompt_info, (size_t)j->n_prompt, &offset, g->echo_text[0] != ' ');
                cJSON_AddItemToObject(c, "logprobs", lp);
            } else {
                cJSON_AddNullToObject(c, "logprobs");
            }
            cJSON_AddNullToObject(c, "finish_reason");
            out_event(g, o);
        }
        g->phase = PHASE_CONTENT;
        return true;
    }
    if (g->phase == PHASE_ROLE) {
        for (int i = 0; chat && i < g->n; i++) {
            cJSON *o = chunk(g, i, &c);
            cJSON *delta = cJSON_AddObjectToObject(c, "delta");
            cJSON_AddStringToObject(delta, "role", "assistant");
            cJSON_AddStringToObject(delta, "content", "");
            cJSON_AddNullToObject(c, "logprobs");
            cJSON_AddNullToObject(c, "finish_reason");
            out_event(g, o);
        }
        g->phase = PHASE_CONTENT;
        return true;
    }
    if (g->phase == PHASE_CONTENT) {
        for (int i = 0; i < g->n; i++) {
            const job *j = g->ch[i].job;
            if (!j->error_status) continue;
            cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(e, "message", j->error);
            cJSON_AddStringToObject(e, "type", j->error_status >= 500 ? "server_error" : "invalid_request_error");
            cJSON_AddNumberToObject(e, "code", j->error_status);
            out_event(g, o);
            s->finished = true;
            return true;
        }
        bool produced = false, all_finished = true;
        for (int i = 0; i < g->n; i++) {
            produced |= produce_choice(g, i);
            all_finished &= g->ch[i].finished;
        }
        if (all_finished) g->phase = g->req.include_usage ? PHASE_USAGE : PHASE_DONE;
        return produced;
    }
    if (g->phase == PHASE_USAGE) {
        cJSON *o = envelope(g, chat ? "chat.completion.chunk" : "text_completion");
        cJSON_AddArrayToObject(o, "choices");
        cJSON_AddItemToObject(o, "usage", usage_all(g));
        out_event(g, o);
        g->phase = PHASE_DONE;
        return true;
    }
    if (g->phase == PHASE_DONE) {
        sse_write(s, NULL, "[DONE]");
        s->finished = true;
        return true;
    }
    return false;
}

/* A job that is still going (with several, look again soon: each has its own signal). */
static job *waiting(sse_stream *s, int *ms) {
    gen *g = (gen *)s;
    int i = 0;
    while (i < g->n - 1 && g->ch[i].job->done) i++;
    if (g->n > 1) *ms = 20;
    return g->ch[i].job;
}

static void cancel(sse_stream *s) { gen_cancel((gen *)s); }
static void destroy(sse_stream *s) { gen_free((gen *)s); }

static int route_generate(http_request *r, request_kind kind) {
    int ret = MHD_NO;
    gen *g = gen_start(r, kind, &ret);
    if (!g) return ret;
    if (!g->req.stream) return reply_whole(r, g);
    g->base = (sse_stream){.produce = produce, .waiting = waiting, .cancel = cancel, .destroy = destroy};
    return sse_reply(r, &g->base);
}

int route_chat_completions(http_request *r) { return route_generate(r, REQ_CHAT); }
int route_completions(http_request *r) { return route_generate(r, REQ_COMPLETION); }

int route_models(http_request *r) {
    server *s = r->srv;
    const quill_hparams *hp = quill_model_hparams(s->model);
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *data = cJSON_AddArrayToObject(root, "data"), *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "id", s->model_id);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)s->created);
    cJSON_AddStringToObject(m, "owned_by", "quill");
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddNumberToObject(meta, "n_vocab", (double)hp->n_vocab);
    cJSON_AddNumberToObject(meta, "n_ctx_train", (double)hp->n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_embd", (double)hp->n_embd);
    cJSON_AddNumberToObject(meta, "n_ctx_slot", scheduler_n_ctx(s->sched));
    cJSON_AddNumberToObject(meta, "n_slots", s->cfg.n_slots);
    cJSON_AddItemToArray(data, m);
    return reply_json(r, 200, root);
}
