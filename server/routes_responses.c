/* /v1/responses: OpenAI's Responses API. `input` (text or items: messages, function_call,
 * function_call_output), `instructions` and function `tools` become a chat request; the reply
 * comes back as output items (reasoning, message with output_text, function_call) or as the
 * Responses event stream (response.created ... response.completed). A response is kept for
 * `previous_response_id` only when the request says `store: true` (in memory, the newest 256). */
#include "server.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---------------------------------------------------------------- stored conversations */

enum { MAX_STORED = 256 };

struct response_store {
    pthread_mutex_t mu;
    char *id[MAX_STORED];
    char *messages[MAX_STORED];   /* the conversation through this response, as chat messages JSON */
    unsigned long long next;
};

response_store *response_store_new(void) {
    response_store *st = calloc(1, sizeof *st);
    if (st) pthread_mutex_init(&st->mu, NULL);
    return st;
}

void response_store_free(response_store *st) {
    if (!st) return;
    for (int i = 0; i < MAX_STORED; i++) {
        free(st->id[i]);
        free(st->messages[i]);
    }
    pthread_mutex_destroy(&st->mu);
    free(st);
}

static void store_put(response_store *st, const char *id, char *messages) {
    if (!st) {
        free(messages);
        return;
    }
    pthread_mutex_lock(&st->mu);
    int slot = (int)(st->next++ % MAX_STORED);
    free(st->id[slot]);
    free(st->messages[slot]);
    st->id[slot] = strdup(id);
    st->messages[slot] = messages;
    pthread_mutex_unlock(&st->mu);
}

/* A parsed copy of a stored conversation, or NULL (a stored_conversation_fn). */
static cJSON *stored_conversation(void *ctx, const char *id) {
    response_store *st = ctx;
    cJSON *out = NULL;
    if (!st) return NULL;
    pthread_mutex_lock(&st->mu);
    for (int i = 0; i < MAX_STORED; i++)
        if (st->id[i] && !strcmp(st->id[i], id)) out = cJSON_Parse(st->messages[i]);
    pthread_mutex_unlock(&st->mu);
    return out;
}

/* ---------------------------------------------------------------- output */

static cJSON *response_shell(server *s, const gen *g, const responses_req *q, const char *status) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", gen_id(g));
    cJSON_AddStringToObject(o, "object", "response");
    cJSON_AddNumberToObject(o, "created_at", (double)time(NULL));
    cJSON_AddStringToObject(o, "status", status);
    cJSON_AddStringToObject(o, "model", gen_req(g)->model ? gen_req(g)->model : s->model_id);
    cJSON_AddNullToObject(o, "error");
    cJSON_AddNullToObject(o, "incomplete_details");
    if (q->previous) cJSON_AddStringToObject(o, "previous_response_id", q->previous);
    else cJSON_AddNullToObject(o, "previous_response_id");
    const cJSON *v;
    cJSON_ArrayForEach(v, q->echo) cJSON_AddItemToObject(o, v->string, cJSON_Duplicate(v, true));
    if (!cJSON_GetObjectItemCaseSensitive(o, "tools")) cJSON_AddArrayToObject(o, "tools");
    cJSON_AddBoolToObject(o, "store", q->store);
    cJSON_AddItemToObject(o, "output", cJSON_CreateArray());
    return o;
}

static void add_usage(cJSON *o, const job *j) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", j->n_cached);
    cJSON_AddNumberToObject(u, "output_tokens", j->n_generated);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", 0);
    cJSON_AddNumberToObject(u, "total_tokens", j->n_prompt + j->n_generated);
}

static void item_id(const gen *g, const char *kind, int index, char *out, size_t cap) {
    const char *id = gen_id(g), *dash = strchr(id, '-');
    snprintf(out, cap, "%s_%s_%d", kind, dash ? dash + 1 : id, index);
}

static cJSON *reasoning_item(const gen *g, const char *text) {
    char id[64];
    item_id(g, "rs", 0, id, sizeof id);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "reasoning");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddArrayToObject(it, "summary");
    cJSON *parts = cJSON_AddArrayToObject(it, "content"), *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "reasoning_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddItemToArray(parts, p);
    return it;
}

/* The log-probabilities of the reply's tokens from `from` on, when the request asked (else none).
 * Under the scheduler's mutex. */
static cJSON *reply_logprobs(gen *g, size_t from) {
    const job *j = gen_job(g);
    if (!gen_req(g)->logprobs || from >= j->n_tokens) return cJSON_CreateArray();
    return logprobs_array(gen_server(g)->tok, j->tokens + from, j->n_tokens - from);
}

/* `final`: the part's text is whole, and its log-probabilities are those of every token. */
static cJSON *text_part(gen *g, const char *text, bool final) {
    cJSON *p = cJSON_CreateObject();
    cJSON_AddStringToObject(p, "type", "output_text");
    cJSON_AddStringToObject(p, "text", text);
    cJSON_AddArrayToObject(p, "annotations");
    cJSON_AddItemToObject(p, "logprobs", final ? reply_logprobs(g, 0) : cJSON_CreateArray());
    return p;
}

static cJSON *message_item(gen *g, const char *text, const char *status) {
    char id[64];
    item_id(g, "msg", 1, id, sizeof id);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "message");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "status", status);
    cJSON_AddStringToObject(it, "role", "assistant");
    cJSON *content = cJSON_AddArrayToObject(it, "content");
    if (text) cJSON_AddItemToArray(content, text_part(g, text, true));
    return it;
}

static cJSON *call_item(const gen *g, int index, const char *call_id, const char *name, const char *args, const char *status) {
    char id[64];
    item_id(g, "fc", index + 2, id, sizeof id);
    cJSON *it = cJSON_CreateObject();
    cJSON_AddStringToObject(it, "type", "function_call");
    cJSON_AddStringToObject(it, "id", id);
    cJSON_AddStringToObject(it, "call_id", call_id);
    cJSON_AddStringToObject(it, "name", name);
    cJSON_AddStringToObject(it, "arguments", args);
    cJSON_AddStringToObject(it, "status", status);
    return it;
}

/* Fills the finished response's output and status from the chat message; stores the conversation
 * when asked. Under the scheduler's mutex. */
static void finish_response(server *s, gen *g, responses_req *q, cJSON *o) {
    job *j = gen_job(g);
    const char *finish = j->finish_reason;
    cJSON *msg = cJSON_CreateObject();
    chat_tools_message(gen_tools(g), j->text, j->text_len, msg, &finish);
    cJSON *output = cJSON_GetObjectItemCaseSensitive(o, "output");
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (cJSON_IsString(reasoning)) cJSON_AddItemToArray(output, reasoning_item(g, reasoning->valuestring));
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls"), *c;
    if (cJSON_IsString(content) && (content->valuestring[0] || !calls))
        cJSON_AddItemToArray(output, message_item(g, content->valuestring, "completed"));
    int index = 0;
    cJSON_ArrayForEach(c, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        cJSON_AddItemToArray(output, call_item(g, index++, cJSON_GetObjectItemCaseSensitive(c, "id")->valuestring,
                                               cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring,
                                               cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring, "completed"));
    }
    bool incomplete = !strcmp(finish, "length");
    cJSON_ReplaceItemInObjectCaseSensitive(o, "status", cJSON_CreateString(incomplete ? "incomplete" : "completed"));
    if (incomplete) {
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "reason", "max_output_tokens");
        cJSON_ReplaceItemInObjectCaseSensitive(o, "incomplete_details", d);
    }
    add_usage(o, j);
    if (q->store) {
        cJSON *assistant = cJSON_CreateObject();
        cJSON_AddStringToObject(assistant, "role", "assistant");
        if (cJSON_IsString(content)) cJSON_AddStringToObject(assistant, "content", content->valuestring);
        else cJSON_AddNullToObject(assistant, "content");
        if (calls) cJSON_AddItemToObject(assistant, "tool_calls", cJSON_Duplicate(calls, true));
        cJSON_AddItemToArray(q->history, assistant);
        char *text = cJSON_PrintUnformatted(q->history);
        if (text) store_put(s->responses, gen_id(g), text);
    }
    cJSON_Delete(msg);
}

static int reply_response(http_request *r, gen *g, responses_req *q) {
    server *s = r->srv;
    int reply;
    if (!gen_wait_whole(r, g, &reply)) {
        responses_req_free(q);
        return reply;
    }
    cJSON *o = response_shell(s, g, q, "completed");
    finish_response(s, g, q, o);
    scheduler_unlock(s->sched);
    gen_free(g);
    responses_req_free(q);
    return reply_json(r, 200, o);
}

/* ---------------------------------------------------------------- streams */

typedef enum { ITEM_NONE, ITEM_REASONING, ITEM_MESSAGE, ITEM_CALL } item_kind;

typedef struct rstream {
    sse_stream base;            /* first: the stream's functions receive it; base.g the generation */
    responses_req q;
    bool started;               /* response.created is written */
    int seq;
    int output_index;           /* of the open item, -1 before the first */
    item_kind open;
    int call_index;             /* the chat delta's index of the open call */
    char *acc;                  /* the open item's text so far (for its .done events) */
    size_t acc_len;
    char item_id[64], call_id[40], call_name[300];
    reply_reader reply;
    size_t tokens_sent;         /* tokens whose log-probabilities a delta carried */
} rstream;

static void emit(rstream *a, const char *type, cJSON *o) {
    cJSON_AddStringToObject(o, "type", type);
    cJSON_AddNumberToObject(o, "sequence_number", a->seq++);
    sse_json(&a->base, type, o);
}

static void acc_add(rstream *a, const char *piece) {
    size_t n = strlen(piece);
    char *grown = realloc(a->acc, a->acc_len + n + 1);
    if (!grown) return;
    a->acc = grown;
    memcpy(a->acc + a->acc_len, piece, n + 1);
    a->acc_len += n;
}

static cJSON *at_item(rstream *a) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "item_id", a->item_id);
    cJSON_AddNumberToObject(o, "output_index", a->output_index);
    return o;
}

static void close_item(rstream *a) {
    const char *text = a->acc ? a->acc : "";
    cJSON *o, *item = NULL;
    switch (a->open) {
    case ITEM_NONE: return;
    case ITEM_REASONING:
        o = at_item(a);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, "text", text);
        emit(a, "response.reasoning_text.done", o);
        item = reasoning_item(a->base.g, text);
        break;
    case ITEM_MESSAGE:
        o = at_item(a);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, "text", text);
        cJSON_AddItemToObject(o, "logprobs", reply_logprobs(a->base.g, 0));
        emit(a, "response.output_text.done", o);
        o = at_item(a);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddItemToObject(o, "part", text_part(a->base.g, text, true));
        emit(a, "response.content_part.done", o);
        item = message_item(a->base.g, text, "completed");
        break;
    case ITEM_CALL:
        o = at_item(a);
        cJSON_AddStringToObject(o, "arguments", text);
        emit(a, "response.function_call_arguments.done", o);
        item = call_item(a->base.g, a->call_index, a->call_id, a->call_name, text, "completed");
        break;
    }
    o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "output_index", a->output_index);
    cJSON_AddItemToObject(o, "item", item);
    emit(a, "response.output_item.done", o);
    a->open = ITEM_NONE;
    free(a->acc);
    a->acc = NULL;
    a->acc_len = 0;
}

static void open_item(rstream *a, item_kind kind, cJSON *item) {
    close_item(a);
    a->open = kind;
    a->output_index++;
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(item, "id");
    snprintf(a->item_id, sizeof a->item_id, "%s", cJSON_IsString(id) ? id->valuestring : "");
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "output_index", a->output_index);
    cJSON_AddItemToObject(o, "item", item);
    emit(a, "response.output_item.added", o);
    if (kind == ITEM_MESSAGE) {
        o = at_item(a);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddItemToObject(o, "part", text_part(a->base.g, "", false));
        emit(a, "response.content_part.added", o);
    }
}

static void translate_delta(void *self, const cJSON *delta) {
    rstream *a = self;
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content");
    if (cJSON_IsString(reasoning)) {
        if (a->open != ITEM_REASONING) {
            cJSON *it = reasoning_item(a->base.g, "");
            cJSON_ReplaceItemInObjectCaseSensitive(it, "content", cJSON_CreateArray());
            open_item(a, ITEM_REASONING, it);
        }
        cJSON *o = at_item(a);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, "delta", reasoning->valuestring);
        emit(a, "response.reasoning_text.delta", o);
        acc_add(a, reasoning->valuestring);
    }
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
    if (cJSON_IsString(content) && content->valuestring[0]) {
        if (a->open != ITEM_MESSAGE) open_item(a, ITEM_MESSAGE, message_item(a->base.g, NULL, "in_progress"));
        cJSON *o = at_item(a);
        cJSON_AddNumberToObject(o, "content_index", 0);
        cJSON_AddStringToObject(o, "delta", content->valuestring);
        cJSON_AddItemToObject(o, "logprobs", reply_logprobs(a->base.g, a->tokens_sent));
        a->tokens_sent = gen_job(a->base.g)->n_tokens;
        emit(a, "response.output_text.delta", o);
        acc_add(a, content->valuestring);
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(delta, "tool_calls")) {
        int index = cJSON_GetObjectItemCaseSensitive(call, "index")->valueint;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
        if (cJSON_IsString(id)) {
            const char *name = cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring;
            snprintf(a->call_id, sizeof a->call_id, "%s", id->valuestring);
            snprintf(a->call_name, sizeof a->call_name, "%s", name);
            open_item(a, ITEM_CALL, call_item(a->base.g, index, a->call_id, name, "", "in_progress"));
            a->call_index = index;
        }
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        if (cJSON_IsString(args) && args->valuestring[0] && a->open == ITEM_CALL && index == a->call_index) {
            cJSON *o = at_item(a);
            cJSON_AddStringToObject(o, "delta", args->valuestring);
            emit(a, "response.function_call_arguments.delta", o);
            acc_add(a, args->valuestring);
        }
    }
}

static bool produce(sse_stream *s) {
    rstream *a = (rstream *)s;
    job *j = gen_job(a->base.g);
    if (!a->started) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "response", response_shell(s->srv, a->base.g, &a->q, "in_progress"));
        emit(a, "response.created", o);
        o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "response", response_shell(s->srv, a->base.g, &a->q, "in_progress"));
        emit(a, "response.in_progress", o);
        a->started = true;
        return true;
    }
    if (j->error_status) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "code", j->error_status >= 500 ? "server_error" : "invalid_request");
        cJSON_AddStringToObject(o, "message", j->error);
        cJSON_AddNullToObject(o, "param");
        emit(a, "error", o);
        s->finished = true;
        return true;
    }
    bool produced = reply_reader_feed(&a->reply, a->base.g, translate_delta, a);
    if (j->done && a->reply.parsed_final) {
        close_item(a);
        cJSON *r = response_shell(s->srv, a->base.g, &a->q, "completed");
        finish_response(s->srv, a->base.g, &a->q, r);
        const cJSON *status = cJSON_GetObjectItemCaseSensitive(r, "status");
        bool incomplete = cJSON_IsString(status) && !strcmp(status->valuestring, "incomplete");
        cJSON *o = cJSON_CreateObject();
        cJSON_AddItemToObject(o, "response", r);
        emit(a, incomplete ? "response.incomplete" : "response.completed", o);
        s->finished = true;
        produced = true;
    }
    return produced;
}

static void destroy(sse_stream *s) {
    rstream *a = (rstream *)s;
    gen_free(a->base.g);
    responses_req_free(&a->q);
    free(a->acc);
    free(a);
}

int route_responses(http_request *r) {
    api_error e;
    responses_req q;
    if (!responses_to_chat(r->body, r->body_len, stored_conversation, r->srv->responses, &q, &e)) return reply_error(r, &e);
    gen *g = gen_begin(r, REQ_CHAT, q.chat_body, strlen(q.chat_body), "resp", &e);
    if (!g) {
        responses_req_free(&q);
        return reply_error(r, &e);
    }
    if (!q.stream) return reply_response(r, g, &q);
    rstream *a = calloc(1, sizeof *a);
    if (!a) {
        scheduler_cancel(r->srv->sched, gen_job(g));
        gen_free(g);
        responses_req_free(&q);
        return MHD_NO;
    }
    a->base = (sse_stream){.produce = produce, .destroy = destroy, .g = g};
    a->q = q;
    a->output_index = -1;
    return sse_reply(r, &a->base);
}
