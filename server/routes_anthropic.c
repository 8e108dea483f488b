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
    if (!gen_wait(g)) {
        gen_free(g);
        return MHD_NO;
    }
    job *j = gen_job(g);
    if (j->error_status) {
        api_error e;
        api_fail(&e, j->error_status == 499 ? 500 : j->error_status, NULL, "%s", j->error);
        scheduler_unlock(s->sched);
        gen_free(g);
        return reply_error(r, &e);
    }
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
    server *srv;
    gen *g;
    struct MHD_Connection *conn;
    int phase;              /* 0 start, 1 blocks, 2 end, 3 finished */
    block_kind block;
    int index;              /* of the open block; -1 before the first */
    int tool_index;         /* the OpenAI index of the call the open tool block holds */
    bool parsed_final, had_calls;
    size_t text_seen, tokens_seen;
    char *out;
    size_t out_len, out_pos, out_cap;
} astream;

static void event(astream *a, const char *name, cJSON *data) {
    char *text = cJSON_PrintUnformatted(data);
    cJSON_Delete(data);
    if (!text) return;
    size_t need = a->out_len + strlen(name) + strlen(text) + 32;
    if (need > a->out_cap) {
        char *grown = realloc(a->out, need * 2);
        if (!grown) {
            free(text);
            return;
        }
        a->out = grown;
        a->out_cap = need * 2;
    }
    a->out_len += (size_t)sprintf(a->out + a->out_len, "event: %s\ndata: %s\n\n", name, text);
    free(text);
}

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
static void translate_delta(astream *a, const cJSON *delta) {
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
static bool produce(astream *a) {
    job *j = gen_job(a->g);
    if (a->phase == 0) {
        cJSON *o = typed("message_start");
        cJSON *m = message_shell(a->srv, gen_id(a->g), gen_req(a->g)->model);
        cJSON_AddArrayToObject(m, "content");
        cJSON_AddNullToObject(m, "stop_reason");
        cJSON_AddNullToObject(m, "stop_sequence");
        cJSON *u = cJSON_AddObjectToObject(m, "usage");
        cJSON_AddNumberToObject(u, "input_tokens", j->n_prompt);
        cJSON_AddNumberToObject(u, "output_tokens", 0);
        cJSON_AddItemToObject(o, "message", m);
        event(a, "message_start", o);
        a->phase = 1;
        return true;
    }
    if (a->phase == 1) {
        if (j->error_status) {
            cJSON *o = typed("error"), *e = cJSON_AddObjectToObject(o, "error");
            cJSON_AddStringToObject(e, "type", j->error_status >= 500 ? "api_error" : "invalid_request_error");
            cJSON_AddStringToObject(e, "message", j->error);
            event(a, "error", o);
            a->phase = 3;
            return true;
        }
        bool produced = false;
        if (j->ready > a->text_seen || (j->done && !a->parsed_final)) {
            bool final = j->done && j->ready == j->text_len;
            cJSON *delta = cJSON_CreateObject();
            if (chat_tools_delta(gen_tools(a->g), j->text, j->ready, final, delta, &a->had_calls)) {
                translate_delta(a, delta);
                produced = true;
            }
            cJSON_Delete(delta);
            a->text_seen = j->ready;
            a->parsed_final = final;
        }
        if (j->done && a->parsed_final) {
            close_block(a);
            const char *finish = a->had_calls && !strcmp(j->finish_reason, "stop") ? "tool_calls" : j->finish_reason;
            cJSON *o = typed("message_delta"), *d = cJSON_AddObjectToObject(o, "delta");
            cJSON_AddStringToObject(d, "stop_reason", stop_reason(finish));
            cJSON_AddNullToObject(d, "stop_sequence");
            cJSON_AddNumberToObject(cJSON_AddObjectToObject(o, "usage"), "output_tokens", j->n_generated);
            event(a, "message_delta", o);
            event(a, "message_stop", typed("message_stop"));
            a->phase = 3;
            produced = true;
        }
        return produced;
    }
    return false;
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    astream *a = cls;
    server *s = a->srv;
    for (;;) {
        if (a->out_pos < a->out_len) {
            size_t n = a->out_len - a->out_pos < max ? a->out_len - a->out_pos : max;
            memcpy(buf, a->out + a->out_pos, n);
            a->out_pos += n;
            return (ssize_t)n;
        }
        a->out_len = a->out_pos = 0;
        if (a->phase == 3) return MHD_CONTENT_READER_END_OF_STREAM;
        scheduler_lock(s->sched);
        bool produced = produce(a);
        if (!produced) {
            scheduler_wait(s->sched, gen_job(a->g), 200);
            produced = produce(a);
        }
        scheduler_unlock(s->sched);
        if (!produced && http_client_gone(a->conn)) {
            scheduler_cancel(s->sched, gen_job(a->g));
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void stream_free(void *cls) {
    astream *a = cls;
    scheduler_cancel(a->srv->sched, gen_job(a->g));
    gen_free(a->g);
    free(a->out);
    free(a);
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
    struct MHD_Response *resp = a ? MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, a, stream_free) : NULL;
    if (!resp) {
        scheduler_cancel(r->srv->sched, gen_job(g));
        gen_free(g);
        free(a);
        return MHD_NO;
    }
    a->srv = r->srv;
    a->g = g;
    a->conn = r->conn;
    a->index = -1;
    return reply_stream(r, resp);
}
