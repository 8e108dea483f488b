/* libFuzzer target for the server's request parsers: any bytes as a /v1/chat/completions and a
 * /v1/completions body (server/request.c), and as a /v1/messages and a /v1/responses body, whose
 * translation to a chat body (server/translate.c) must then parse as one or be refused cleanly.
 * A refusal must be a 4xx/5xx with a message; an accepted request must hold what the engine relies
 * on. Any broken promise aborts. */
#include "server/server.h"

#include <stdlib.h>
#include <string.h>

static void check_accepted(const gen_request *r, request_kind kind) {
    if (kind == REQ_CHAT) {
        if (r->n_msgs == 0 || !r->msgs) abort();
        for (size_t i = 0; i < r->n_msgs; i++) {
            const char *role = r->msgs[i].role, *content = r->msgs[i].content;
            if (!role || !content) abort();
            if (strcmp(role, "system") && strcmp(role, "user") && strcmp(role, "assistant") && strcmp(role, "tool"))
                abort();
        }
    } else if (!r->prompt && (!r->prompt_ids || r->n_prompt_ids == 0)) {
        abort();
    }
    for (size_t i = 0; i < r->n_prompt_ids; i++)
        if (r->prompt_ids[i] < 0) abort();
    if (r->n_stop < 0 || r->n_stop > MAX_STOP) abort();
    for (int i = 0; i < r->n_stop; i++)
        if (!r->stop[i] || !*r->stop[i]) abort();
    if (r->top_logprobs < 0 || r->top_logprobs > MAX_TOP_LOGPROBS) abort();
    if (r->max_tokens != -1 && r->max_tokens < 1) abort();
    /* the sampler must take what the parser let through */
    if (quill_sampler_params_check(&r->sp, NULL) != QUILL_OK) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *body = (const char *)data;
    const request_limits lim = {64, 4096};
    for (int k = 0; k < 2; k++) {
        const request_kind kind = k ? REQ_COMPLETION : REQ_CHAT;
        gen_request r;
        api_error e;
        memset(&e, 0, sizeof e);
        if (request_parse(body, size, kind, &lim, &r, &e)) {
            check_accepted(&r, kind);
            request_free(&r);
        } else if (e.status < 400 || e.status > 599 || !e.message[0] || !e.type) {
            abort();
        }
    }
    /* the other APIs: a translation is a chat body that parses, or is refused with a message */
    bool stream;
    api_error e;
    memset(&e, 0, sizeof e);
    char *chat = anthropic_to_chat(body, size, &stream, &e);
    responses_req q;
    char *chats[2] = {chat, NULL};
    if (!chat && (e.status < 400 || e.status > 599 || !e.message[0])) abort();
    memset(&e, 0, sizeof e);
    if (responses_to_chat(body, size, NULL, NULL, &q, &e)) chats[1] = q.chat_body;
    else if (e.status < 400 || e.status > 599 || !e.message[0]) abort();
    for (int k = 0; k < 2; k++) {
        if (!chats[k]) continue;
        gen_request r;
        memset(&e, 0, sizeof e);
        if (request_parse(chats[k], strlen(chats[k]), REQ_CHAT, &lim, &r, &e)) {
            check_accepted(&r, REQ_CHAT);
            request_free(&r);
        } else if (e.status < 400 || e.status > 499 || !e.message[0]) {
            abort();
        }
    }
    free(chat);
    if (chats[1]) responses_req_free(&q);
    /* the sanitizer's output is always valid UTF-8 */
    char *clean = utf8_sanitize(body, size);
    if (clean && utf8_valid_prefix(clean, strlen(clean)) != strlen(clean)) abort();
    free(clean);
    return 0;
}
