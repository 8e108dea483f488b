/* /v1/messages: Anthropic's Messages API. The body is translated into a chat request (system,
 * text, tool_use and tool_result blocks, tools, tool_choice, stop_sequences) and generated like any
 * other; the reply comes back as content blocks (thinking, text, tool_use) with a stop_reason, or
 * as Anthropic's stream of events (message_start, content_block_start/delta/stop, message_delta,
 * message_stop). Errors have Anthropic's shape (http.c). Images and documents are refused. */
#include "server.h"

#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *stop_reason(const char *finish) {
    if (!strcmp(finish, "tool_calls")) return "tool_use";
    if (!strcmp(finish, "length")) return "max_tokens";
    return "end_turn";
}

/* ---------------------------------------------------------------- whole replies */

static void add_usage(cJSON *o, const job *j) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt);
    cJSON_AddNumberToObject(u, "output_tokens", j->n_generated);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", j->n_cached);
}

static cJSON *message_shell(server *s, const char *id, const char *model) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "type", "message");
    cJSON_AddStringToObject(o, "role", "assistant");
    cJSON_AddStringToObject(o, "model", model ? model : s->model_id);
    return o;
}

/* An OpenAI message (content, reasoning_content, tool_calls) as Anthropic content blocks. */
static cJSON *content_blocks(const cJSON *msg) {
    cJSON *blocks = cJSON_CreateArray();
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(msg, "reasoning_content");
    if (cJSON_IsString(reasoning) && reasoning->valuestring[0]) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "thinking");
        cJSON_AddStringToObject(b, "thinking", reasoning->valuestring);
        cJSON_AddStringToObject(b, "signature", "");
        cJSON_AddItemToArray(blocks, b);
    }
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(msg, "content");
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(msg, "tool_calls");
    if (cJSON_IsString(content) && (content->valuestring[0] || !calls)) {
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "text");
        cJSON_AddStringToObject(b, "text", content->valuestring);
        cJSON_AddItemToArray(blocks, b);
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        cJSON *b = cJSON_CreateObject();
        cJSON_AddStringToObject(b, "type", "tool_use");
        cJSON_AddStringToObject(b, "id", cJSON_GetObjectItemCaseSensitive(call, "id")->valuestring);
        cJSON_AddStringToObject(b, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
        cJSON *input = cJSON_Parse(cJSON_GetObjectItemCaseSensitive(fn, "arguments")->valuestring);
        cJSON_AddItemToObject(b, "input", cJSON_IsObject(input) ? input : (cJSON_Delete(input), cJSON_CreateObject()));
        cJSON_AddItemToArray(blocks, b);
    }
    return blocks;
}

static int reply_message(http_request *r, gen *g) {
    server *s = r->srv;
    int reply;
    if (!gen_wait_whole(r, g, &reply)) return reply;
    job *j = gen_job(g);
    const char *finish = j->finish_reason;
    cJSON *msg = cJSON_CreateObject();
    chat_tools_message(gen_tools(g), j->text, j->text_len, msg, &finish);
    cJSON *o = message_shell(s, gen_id(g), gen_req(g)->model);
    cJSON_AddItemToObject(o, "content", content_blocks(msg));
    cJSON_AddStringToObject(o, "stop_reason", stop_reason(finish));
    cJSON_AddNullToObject(o, "stop_sequence");
    add_usage(o, j);
    scheduler_unlock(s->sched);
    cJSON_Delete(msg);
    gen_free(g);
    return reply_json(r, 200, o);
}

/* ---------------------------------------------------------------- streams */

typedef enum { BLOCK_NONE, BLOCK_THINKING, BLOCK_TEXT, BLOCK_TOOL } block_kind;

typedef struct astream {
    sse_stream base;        /* first: the stream's functions receive it; base.g the generation */
    bool started;           /* message_start is written */
    block_kind block;
    int index;              /* of the open block; -1 before the first */
    int tool_index;         /* the OpenAI index of the call the open tool block holds */
    reply_reader reply;
} astream;

static void event(astream *a, const char *name, cJSON *data) { sse_json(&a->base, name, data); }

static cJSON *typed(const char *type) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", type);
    return o;
}

static void close_block(astream *a) {
    if (a->block == BLOCK_NONE) return;
    cJSON *o = typed("content_block_stop");
    cJSON_AddNumberToObject(o, "index", a->index);
    event(a, "content_block_stop", o);
    a->block = BLOCK_NONE;
}

static void open_block(astream *a, block_kind kind, cJSON *content_block) {
    close_block(a);
    a->block = kind;
    a->index++;
    cJSON *o = typed("content_block_start");
    cJSON_AddNumberToObject(o, "index", a->index);
    cJSON_AddItemToObject(o, "content_block", content_block);
    event(a, "content_block_start", o);
}

static void block_delta(astream *a, const char *type, const char *field, const char *value) {
    cJSON *o = typed("content_block_delta"), *d = typed(type);
    cJSON_AddNumberToObject(o, "index", a->index);
    cJSON_AddStringToObject(d, field, value);
    cJSON_AddItemToObject(o, "delta", d);
    event(a, "content_block_delta", o);
}

/* An OpenAI delta as Anthropic block events. */
static void translate_delta(void *self, const cJSON *delta) {
    astream *a = self;
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(delta, "reasoning_content");
    if (cJSON_IsString(reasoning)) {
        if (a->block != BLOCK_THINKING) {
            cJSON *b = typed("thinking");
            cJSON_AddStringToObject(b, "thinking", "");
            cJSON_AddStringToObject(b, "signature", "");
            open_block(a, BLOCK_THINKING, b);
        }
        block_delta(a, "thinking_delta", "thinking", reasoning->valuestring);
    }
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(delta, "content");
    if (cJSON_IsString(content) && content->valuestring[0]) {
        if (a->block != BLOCK_TEXT) {
            cJSON *b = typed("text");
            cJSON_AddStringToObject(b, "text", "");
            open_block(a, BLOCK_TEXT, b);
        }
        block_delta(a, "text_delta", "text", content->valuestring);
    }
    const cJSON *call;
    cJSON_ArrayForEach(call, cJSON_GetObjectItemCaseSensitive(delta, "tool_calls")) {
        int index = cJSON_GetObjectItemCaseSensitive(call, "index")->valueint;
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
        if (cJSON_IsString(id)) {
            cJSON *b = typed("tool_use");
            cJSON_AddStringToObject(b, "id", id->valuestring);
            cJSON_AddStringToObject(b, "name", cJSON_GetObjectItemCaseSensitive(fn, "name")->valuestring);
            cJSON_AddObjectToObject(b, "input");
            open_block(a, BLOCK_TOOL, b);
            a->tool_index = index;
        }
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        /* calls are written one after another: a piece always belongs to the open block */
        if (cJSON_IsString(args) && args->valuestring[0] && a->block == BLOCK_TOOL && index == a->tool_index)
            block_delta(a, "input_json_delta", "partial_json", args->valuestring);
    }
}

/* The events the job's progress allows, under the scheduler's mutex. */
static bool produce(sse_stream *s) {
    astream *a = (astream *)s;
    job *j = gen_job(a->base.g);
    if (!a->started) {
        cJSON *o = typed("message_start");
        cJSON *m = message_shell(s->srv, gen_id(a->base.g), gen_req(a->base.g)->model);
        cJSON_AddArrayToObject(m, "content");
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
        cJSON *u = cJSON_AddObjectToObject(m, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt);
        cJSON_AddNumberToObject(u, "output_tokens", 0);
        cJSON_AddItemToObject(o, "message", m);
        event(a, "message_start", o);
        a->started = true;
        return true;
    }
    if (j->error_status) {
        cJSON *o = typed("error"), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "type", j->error_status >= 500 ? "api_error" : "invalid_request_error");
        cJSON_AddStringToObject(e, "message", j->error);
        event(a, "error", o);
        s->finished = true;
        return true;
    }
    bool produced = reply_reader_feed(&a->reply, a->base.g, translate_delta, a);
    if (j->done && a->reply.parsed_final) {
        close_block(a);
        const char *finish = a->reply.had_calls && !strcmp(j->finish_reason, "stop") ? "tool_calls" : j->finish_reason;
        cJSON *o = typed("message_delta"), *d = cJSON_AddObjectToObject(o, "delta");
        cJSON_AddStringToObject(d, "stop_reason", stop_reason(finish));
        cJSON_AddNullToObject(d, "stop_sequence");
        cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "usage"), "output_tokens", j->n_generated);
        event(a, "message_delta", o);
        event(a, "message_stop", typed("message_stop"));
        s->finished = true;
        produced = true;
    }
    return produced;
}

static void destroy(sse_stream *s) {
    gen_free(s->g);
    free(s);
}

int route_messages(http_request *r) {
    api_error e;
    bool stream = false;
    char *body = anthropic_to_chat(r->body, r->body_len, &stream, &e);
    if (!body) return reply_error(r, &e);
    gen *g = gen_begin(r, REQ_CHAT, body, strlen(body), "msg", &e);
    free(body);
    if (!g) return reply_error(r, &e);
    if (!stream) return reply_message(r, g);
    astream *a = calloc(1, sizeof *a);
    if (!a) {
        scheduler_cancel(r->srv->sched, gen_job(g));
        gen_free(g);
        return MHD_NO;
    }
    a->base = (sse_stream){.produce = produce, .destroy = destroy, .g = g};
    a->index = -1;
    return sse_reply(r, &a->base);
}
