/* quill serve with tools and reasoning, on random-weight models whose files carry real templates
 * (`quill synth` copies the vocabulary's tokenizer.chat_template):
 * - a conversation with tool calls and tool results is rendered as the template renders it (the
 *   prompt's token count equals our own render of the same messages);
 * - reasoning from a prompt that opened <think> comes back as reasoning_content, whole and
 *   streamed alike, and in the content with reasoning_format none;
 * - every malformed tools field is a 400 naming it. */
#include "server_util.h"
#include "test.h"

#include "quill_chat.h"
#include "quill_model.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* A small model with the vocabulary (and template) of `vocab`, made once per run. */
static const char *synth_model(const char *shared, const char *arch, const char *vocab, char *path, size_t cap) {
    snprintf(path, cap, "%s/tools-%s.gguf", tmp_dir(), vocab);
    struct stat st;
    if (stat(path, &st) == 0) return path;
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s synth --arch %s --embd 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --vocab %s/tokenizer/ggml-vocab-%s.gguf "
             "-o %s",
             quill_bin(), arch, shared, vocab, path);
    int rc = run_cmd(cmd, &out, true);
    if (rc) test_fail(__FILE__, __LINE__, "synth failed: %s", out);
    free(out);
    return rc ? NULL : path;
}

static cJSON *post_json(int port, const char *body, int *status) {
    http_resp r;
    *status = 0;
    if (!http_post(port, "/v1/chat/completions", body, &r)) return NULL;
    *status = r.status;
    cJSON *o = cJSON_Parse(r.body);
    http_resp_free(&r);
    return o;
}

static const char weather_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]";

TEST(server_tools_history_renders_through_the_template) {
    REQUIRE_SHARED(shared);
    char model[600];
    CHECK(synth_model(shared, "qwen3", "qwen3", model, sizeof model));
    test_server s;
    CHECK(server_start(&s, model, "-np 1 -c 2048 -t 1"));
    /* OpenAI's shapes: content null beside tool_calls, arguments as JSON text */
    char body[2048];
    snprintf(body, sizeof body,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", "
             "\"content\": null, \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": "
             "\"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Paris\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": "
             "\"call_1\", \"content\": \"sunny\"}], \"tools\": %s, \"max_tokens\": 4, \"temperature\": 0}",
             weather_tools);
    int status;
    cJSON *o = post_json(s.port, body, &status);
    CHECK(status == 200, "status %d", status);
    int prompt_tokens = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens")->valueint;
    cJSON_Delete(o);
    /* the same conversation as Qwen 3's template wants it: content "", arguments an object */
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(model, &m, &err) == QUILL_OK, "%s", err.message);
    char *tmpl = NULL, *text = NULL;
    CHECK(quill_chat_template_for(m, NULL, NULL, &tmpl, &err) == QUILL_OK, "%s", err.message);
    quill_chat_inputs in = {
        .messages_json = "[{\"role\": \"user\", \"content\": \"Weather in Paris?\"}, {\"role\": \"assistant\", \"content\": "
                         "\"\", \"tool_calls\": [{\"id\": \"call_1\", \"type\": \"function\", \"function\": {\"name\": "
                         "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", \"tool_call_id\": "
                         "\"call_1\", \"content\": \"sunny\"}]",
        .tools_json = weather_tools, .add_generation_prompt = true};
    CHECK(quill_chat_render_inputs(tmpl, &in, &text, &err) == QUILL_OK, "%s", err.message);
    CHECK_STR_CONTAINS(text, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>");
    CHECK_STR_CONTAINS(text, "<tool_response>\nsunny\n</tool_response>");
    int32_t *ids;
    size_t n;
    CHECK(quill_tokenize(quill_model_tokenizer(m), text, strlen(text), quill_tokenizer_add_bos(quill_model_tokenizer(m)),
                         true, &ids, &n, &err) == QUILL_OK, "%s", err.message);
    CHECK((int)n == prompt_tokens, "the server's prompt has %d tokens, the template's render %zu", prompt_tokens, n);
    free(ids);
    free(text);
    free(tmpl);
    quill_model_free(m);
    CHECK_EQ_INT(server_stop(&s), 0);
}

static const char *str_of(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItem(b ? cJSON_GetObjectItem(o, a) : o, b ? b : a);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Joins one delta field of an SSE stream. */
static char *sse_field(const char *body, const char *field) {
    size_t cap = strlen(body) + 1, n = 0;
    char *out = calloc(1, cap);
    for (const char *p = strstr(body, "data: {"); p; p = strstr(p + 1, "data: {")) {
        const char *end = strstr(p, "\n\n");
        char *one = strndup(p + 6, end ? (size_t)(end - p - 6) : strlen(p + 6));
        cJSON *o = cJSON_Parse(one);
        free(one);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const char *v = str_of(cJSON_GetObjectItem(c, "delta"), field, NULL);
        if (v && n + strlen(v) < cap) {
            memcpy(out + n, v, strlen(v));
            n += strlen(v);
        }
        cJSON_Delete(o);
    }
    return out;
}

TEST(server_tools_reasoning_content) {
    REQUIRE_SHARED(shared);
    char model[600], args[1024];
    CHECK(synth_model(shared, "qwen3", "qwen3", model, sizeof model));
    /* DeepSeek R1's template opens <think> in the prompt: the reply begins with reasoning */
    char *r1 = path_join(shared, "chat/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    snprintf(args, sizeof args, "-np 1 -c 1024 -t 1 --chat-template %s", r1);
    free(r1);
    test_server s;
    CHECK(server_start(&s, model, args));
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"max_tokens\": 12, "
                      "\"temperature\": 0%s}";
    char body[512];
    snprintf(body, sizeof body, req, "");
    int status;
    cJSON *whole = post_json(s.port, body, &status);
    CHECK(status == 200, "status %d", status);
    const cJSON *msg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(whole, "choices"), 0), "message");
    const char *reasoning = str_of(msg, "reasoning_content", NULL), *content = str_of(msg, "content", NULL);
    CHECK(reasoning && reasoning[0] && content && !content[0], "reasoning [%s] content [%s]", reasoning ? reasoning : "(none)",
          content ? content : "(none)");
    /* streamed: the same reasoning in delta.reasoning_content */
    snprintf(body, sizeof body, req, ", \"stream\": true");
    http_resp r;
    CHECK(http_post(s.port, "/v1/chat/completions", body, &r) && r.status == 200, "stream");
    char *streamed = sse_field(r.body, "reasoning_content"), *streamed_content = sse_field(r.body, "content");
    http_resp_free(&r);
    CHECK(!strcmp(streamed, reasoning) && !streamed_content[0], "streamed reasoning [%s] content [%s], whole [%s]", streamed,
          streamed_content, reasoning);
    free(streamed);
    free(streamed_content);
    /* reasoning_format none: the same text as content */
    snprintf(body, sizeof body, req, ", \"reasoning_format\": \"none\"");
    cJSON *kept = post_json(s.port, body, &status);
    const cJSON *kmsg = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(kept, "choices"), 0), "message");
    CHECK(status == 200 && str_of(kmsg, "content", NULL) && !cJSON_GetObjectItem(kmsg, "reasoning_content"), "none");
    /* reasoning is trimmed; the content keeps the text as generated */
    const char *kc = str_of(kmsg, "content", NULL);
    while (*kc == ' ' || *kc == '\n') kc++;
    CHECK(!strcmp(kc, reasoning), "content [%s] vs reasoning [%s]", kc, reasoning);
    cJSON_Delete(kept);
    cJSON_Delete(whole);
    CHECK_EQ_INT(server_stop(&s), 0);
}

TEST(server_tools_bad_fields) {
    REQUIRE_SHARED(shared);
    char model[600];
    CHECK(synth_model(shared, "qwen3", "qwen3", model, sizeof model));
    test_server s;
    CHECK(server_start(&s, model, "-np 1 -c 512 -t 1"));
    static const struct { const char *fields, *param, *needle; } cases[] = {
        {"\"tools\": {}", "tools", "array"},
        {"\"tools\": [{\"type\": \"code_interpreter\"}]", "tools", "function"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {}}]", "tools", "name"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"a b\"}}]", "tools", "letters"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": 3}}]", "tools", "Schema"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}, {\"type\": \"function\", \"function\": "
         "{\"name\": \"f\"}}]", "tools", "twice"},
        {"\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}], \"tool_choice\": {\"type\": \"function\", "
         "\"function\": {\"name\": \"g\"}}", "tool_choice", "not among"},
        {"\"tool_choice\": \"required\"", "tool_choice", "no 'tools'"},
        {"\"tool_choice\": \"sometimes\"", "tool_choice", "auto"},
        {"\"tool_choice\": 7", "tool_choice", "string or an object"},
        {"\"parallel_tool_calls\": \"yes\"", "parallel_tool_calls", "true or false"},
        {"\"reasoning_format\": \"loud\"", "reasoning_format", "deepseek"},
        {"\"chat_template_kwargs\": []", "chat_template_kwargs", "object"},
        {"\"reasoning_effort\": 3", "reasoning_effort", "string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char body[1024];
        snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, %s}",
                 cases[i].fields);
        int status;
        cJSON *o = post_json(s.port, body, &status);
        const cJSON *e = cJSON_GetObjectItem(o, "error");
        const char *param = str_of(e, "param", NULL), *message = str_of(e, "message", NULL);
        CHECK(status == 400 && param && !strcmp(param, cases[i].param) && message && strstr(message, cases[i].needle),
              "%s: %d %s %s", cases[i].fields, status, param ? param : "-", message ? message : "-");
        cJSON_Delete(o);
    }
    /* arguments in the history that are not a JSON object */
    const char *bad_history =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", \"content\": null, "
        "\"tool_calls\": [{\"id\": \"c\", \"type\": \"function\", \"function\": {\"name\": \"f\", \"arguments\": "
        "\"{not json\"}}]}]}";
    int status;
    cJSON *o = post_json(s.port, bad_history, &status);
    CHECK(status == 400 && strstr(str_of(cJSON_GetObjectItem(o, "error"), "message", NULL), "not a JSON object"),
          "bad arguments: %d", status);
    cJSON_Delete(o);
    CHECK_EQ_INT(server_stop(&s), 0);
}

/* Joins a stream's delta.tool_calls by index into "name(arguments)|..." (malloc'd). */
static char *sse_calls(const char *body, char **finish) {
    char names[4][64] = {{0}}, *args[4] = {0};
    int n = 0;
    *finish = NULL;
    for (const char *p = strstr(body, "data: {"); p; p = strstr(p + 1, "data: {")) {
        const char *end = strstr(p, "\n\n");
        char *one = strndup(p + 6, end ? (size_t)(end - p - 6) : strlen(p + 6));
        cJSON *o = cJSON_Parse(one);
        free(one);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *d;
        const char *fr = str_of(c, "finish_reason", NULL);
        if (fr) *finish = strdup(fr);
        cJSON_ArrayForEach(d, cJSON_GetObjectItem(cJSON_GetObjectItem(c, "delta"), "tool_calls")) {
            int i = cJSON_GetObjectItem(d, "index")->valueint;
            if (i < 0 || i > 3) continue;
            if (i >= n) n = i + 1;
            const char *name = str_of(cJSON_GetObjectItem(d, "function"), "name", NULL);
            const char *piece = str_of(cJSON_GetObjectItem(d, "function"), "arguments", NULL);
            if (name) snprintf(names[i], sizeof names[i], "%s", name);
            if (piece) {
                size_t have = args[i] ? strlen(args[i]) : 0;
                args[i] = realloc(args[i], have + strlen(piece) + 1);
                memcpy(args[i] + have, piece, strlen(piece) + 1);
            }
        }
        cJSON_Delete(o);
    }
    size_t cap = 64;
    for (int i = 0; i < n; i++) cap += strlen(names[i]) + (args[i] ? strlen(args[i]) : 0) + 4;
    char *out = calloc(1, cap);
    for (int i = 0; i < n; i++) {
        snprintf(out + strlen(out), cap - strlen(out), "%s%s(%s)", i ? "|" : "", names[i], args[i] ? args[i] : "");
        free(args[i]);
    }
    return out;
}

/* tool_choice "required" and a named function: a random-weight model's reply is a call by
 * construction (the syntax's grammar, arguments by the tool's schema), whole and streamed alike. */
TEST(server_tools_required_and_named_calls) {
    REQUIRE_SHARED(shared);
    char model[600];
    CHECK(synth_model(shared, "qwen3", "qwen3", model, sizeof model));
    test_server s;
    CHECK(server_start(&s, model, "-np 2 -c 4096 -t 1"));
    static const char tools[] =
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"city\":{\"type\":\"string\",\"enum\":[\"Paris\",\"Rome\"]}},\"required\":[\"city\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"parameters\":{\"type\":\"object\",\"properties\":"
        "{\"zone\":{\"type\":\"string\",\"enum\":[\"UTC\",\"CET\"]}},\"required\":[\"zone\"]}}}]";
    const char *choices[] = {"\"required\"", "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}"};
    for (int k = 0; k < 2; k++) {
        char body[2048];
        snprintf(body, sizeof body,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": %s, \"tool_choice\": %s, "
                 "\"parallel_tool_calls\": false, \"max_tokens\": 300, \"temperature\": 0%%s}",
                 tools, choices[k]);
        char whole[2100], streamed[2100];
        snprintf(whole, sizeof whole, body, "");
        snprintf(streamed, sizeof streamed, body, ", \"stream\": true");
        int status;
        cJSON *o = post_json(s.port, whole, &status);
        const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
        const cJSON *calls = cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "tool_calls");
        const cJSON *call = cJSON_GetArrayItem(calls, 0);
        const char *name = str_of(cJSON_GetObjectItem(call, "function"), "name", NULL);
        const char *args = str_of(cJSON_GetObjectItem(call, "function"), "arguments", NULL);
        cJSON *parsed = args ? cJSON_Parse(args) : NULL;
        const char *arg = k == 0 ? str_of(parsed, "city", NULL) : str_of(parsed, "zone", NULL);
        CHECK(status == 200 && cJSON_GetArraySize(calls) == 1 && name && args && arg &&
                  !strncmp(str_of(call, "id", NULL) ? str_of(call, "id", NULL) : "", "call_", 5) &&
                  !strcmp(str_of(c, "finish_reason", NULL), "tool_calls") &&
                  cJSON_IsNull(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "content")),
              "tool_choice %s: %d %s", choices[k], status, cJSON_PrintUnformatted(o));
        CHECK(k == 0 || !strcmp(name, "get_time"), "the named function was not called: %s", name);
        char expect[1024];
        snprintf(expect, sizeof expect, "%s(%s)", name, args);
        cJSON_Delete(parsed);
        cJSON_Delete(o);
        http_resp r;
        CHECK(http_post(s.port, "/v1/chat/completions", streamed, &r) && r.status == 200, "stream");
        char *finish = NULL, *joined = sse_calls(r.body, &finish);
        CHECK(!strcmp(joined, expect) && finish && !strcmp(finish, "tool_calls"), "streamed [%s] (%s), whole [%s]", joined,
              finish ? finish : "-", expect);
        free(joined);
        free(finish);
        http_resp_free(&r);
    }
    /* a tool_choice that forces a call cannot take another grammar */
    int status;
    char bad[1024];
    snprintf(bad, sizeof bad,
             "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": %s, \"tool_choice\": \"required\", "
             "\"response_format\": {\"type\": \"json_object\"}}",
             tools);
    cJSON *o = post_json(s.port, bad, &status);
    CHECK(status == 400 && !strcmp(str_of(cJSON_GetObjectItem(o, "error"), "param", NULL), "tool_choice"), "%d", status);
    cJSON_Delete(o);
    CHECK_EQ_INT(server_stop(&s), 0);
}

/* n choices: each its own draw (seed + i), whole and streamed alike; usage counts them all. */
TEST(server_n_choices) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 3 -c 1024 -t 1");
    free(model);
    CHECK(started);
    const char *body = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 12, \"temperature\": 1, \"seed\": 7, \"n\": 3%s}";
    char whole[256], streamed[256];
    snprintf(whole, sizeof whole, body, "");
    snprintf(streamed, sizeof streamed, body, ", \"stream\": true");
    http_resp r;
    CHECK(http_post(s.port, "/v1/completions", whole, &r) && r.status == 200, "n=3: %s", r.body);
    cJSON *o = cJSON_Parse(r.body);
    http_resp_free(&r);
    const cJSON *choices = cJSON_GetObjectItem(o, "choices");
    CHECK(cJSON_GetArraySize(choices) == 3, "choices");
    const char *t0 = str_of(cJSON_GetArrayItem(choices, 0), "text", NULL), *t1 = str_of(cJSON_GetArrayItem(choices, 1), "text", NULL);
    CHECK(t0 && t1 && strcmp(t0, t1), "two choices drew the same text: %s", t0);
    CHECK(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "completion_tokens")->valueint == 36, "usage");
    CHECK(http_post(s.port, "/v1/completions", streamed, &r) && r.status == 200, "stream");
    /* the stream's text for each index equals the whole reply's choice */
    for (int i = 0; i < 3; i++) {
        char want[64];
        snprintf(want, sizeof want, "\"index\":%d", i);
        size_t cap = strlen(r.body) + 1, n = 0;
        char *text = calloc(1, cap);
        for (const char *p = strstr(r.body, "data: {"); p; p = strstr(p + 1, "data: {")) {
            const char *end = strstr(p, "\n\n");
            char *one = strndup(p + 6, end ? (size_t)(end - p - 6) : strlen(p + 6));
            cJSON *e = cJSON_Parse(one);
            free(one);
            const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(e, "choices"), 0);
            const char *piece = str_of(c, "text", NULL);
            if (c && cJSON_GetObjectItem(c, "index")->valueint == i && piece) {
                memcpy(text + n, piece, strlen(piece));
                n += strlen(piece);
            }
            cJSON_Delete(e);
        }
        const char *expected = str_of(cJSON_GetArrayItem(choices, i), "text", NULL);
        CHECK(!strcmp(text, expected), "choice %d streamed [%s], whole [%s]", i, text, expected);
        free(text);
    }
    http_resp_free(&r);
    cJSON_Delete(o);
    CHECK_EQ_INT(server_stop(&s), 0);
}

/* gpt-oss's harmony format: with the template and vocabulary of gpt-oss, a forced call is written
 * in the commentary channel (special tokens in the grammar and in the reply's text) and comes back
 * as a tool call. */
TEST(server_tools_harmony_call) {
    REQUIRE_SHARED(shared);
    char model[600];
    CHECK(synth_model(shared, "qwen3", "gpt-oss", model, sizeof model));
    test_server s;
    CHECK(server_start(&s, model, "-np 1 -c 4096 -t 1"));
    const char *body =
        "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather in Paris?\"}], \"tools\": [{\"type\": \"function\", "
        "\"function\": {\"name\": \"get_weather\", \"description\": \"Weather\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"Paris\", \"Rome\"]}}, \"required\": [\"city\"]}}}], "
        "\"tool_choice\": \"required\", \"max_tokens\": 200, \"temperature\": 0}";
    int status;
    cJSON *o = post_json(s.port, body, &status);
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    const cJSON *call = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(c, "message"), "tool_calls"), 0);
    const char *args = str_of(cJSON_GetObjectItem(call, "function"), "arguments", NULL);
    cJSON *parsed = args ? cJSON_Parse(args) : NULL;
    const char *city = str_of(parsed, "city", NULL);
    CHECK(status == 200 && city && (!strcmp(city, "Paris") || !strcmp(city, "Rome")) &&
              !strcmp(str_of(c, "finish_reason", NULL), "tool_calls"),
          "harmony call: %d %s", status, o ? cJSON_PrintUnformatted(o) : "");
    cJSON_Delete(parsed);
    cJSON_Delete(o);
    CHECK_EQ_INT(server_stop(&s), 0);
}

static long long metric_value(int port, const char *name) {
    http_resp r;
    long long v = -1;
    if (http_do(port, "GET", "/metrics", NULL, NULL, 0, 10, &r) && r.status == 200) {
        char key[128];
        snprintf(key, sizeof key, "\n%s ", name);
        const char *at = strstr(r.body, key);
        if (at) v = atoll(at + strlen(key));
    }
    http_resp_free(&r);
    return v;
}

/* n choices evaluate their prompt once: the others copy it (all but the last token, evaluated
 * again for its logits), and each choice's text is the one it gets alone. */
TEST(server_n_choices_share_the_prompt) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 3 -c 1024 -t 1 -b 8");
    free(model);
    CHECK(started);
    if (!started) return;
    /* a prompt read 8 tokens per step: the choices arrive while the first still reads it */
    char prompt[2048] = "", body[2400];
    for (int i = 0; i < 12; i++) strcat(prompt, "The little dog ran to the park and saw a big red ball under a tree. ");
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 8, \"temperature\": 1, \"seed\": 21, \"n\": 3}",
             prompt);
    http_resp r;
    CHECK(http_post(s.port, "/v1/completions", body, &r) && r.status == 200, "n=3: %s", r.body);
    cJSON *o = cJSON_Parse(r.body);
    http_resp_free(&r);
    int n_prompt = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens")->valueint;
    long long total = metric_value(s.port, "quill_prompt_tokens_total"),
              cached = metric_value(s.port, "quill_prompt_tokens_cached_total");
    CHECK(total == 3LL * n_prompt, "prompt tokens %lld, prompt %d", total, n_prompt);
    CHECK(cached == 2LL * (n_prompt - 1), "cached %lld of 3 x %d", cached, n_prompt);
    /* choice 1 alone is the request with seed + 1 */
    const char *t1 = str_of(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 1), "text", NULL);
    char alone[2400];
    snprintf(alone, sizeof alone, "{\"prompt\": \"%s\", \"max_tokens\": 8, \"temperature\": 1, \"seed\": 22}", prompt);
    CHECK(http_post(s.port, "/v1/completions", alone, &r) && r.status == 200, "alone: %s", r.body);
    cJSON *a = cJSON_Parse(r.body);
    const char *ta = str_of(cJSON_GetArrayItem(cJSON_GetObjectItem(a, "choices"), 0), "text", NULL);
    CHECK(t1 && ta && !strcmp(t1, ta), "choice 1 [%s], alone [%s]", t1 ? t1 : "", ta ? ta : "");
    http_resp_free(&r);
    cJSON_Delete(a);
    cJSON_Delete(o);
    CHECK_EQ_INT(server_stop(&s), 0);
}
