/* The official clients of the agent APIs (tests/node: `openai` and `@anthropic-ai/sdk`, locked)
 * against quill serve on a random-weight model that carries Qwen 3's real template: tools and
 * tool-call histories in chat.completions (whole and streamed), responses.create (with
 * previous_response_id, function-call items and streaming), Anthropic's messages.create and
 * messages.stream with tools, embeddings.create, and both clients' error types. Without node or the packages the test
 * fails under QUILL_REQUIRE_SHARED=1 (CI) and is skipped elsewhere. */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static bool node_ready(void) {
    char *out = NULL;
    int rc = run_cmd("node --version", &out, true);
    free(out);
    return rc == 0 && access("tests/node/node_modules/openai/package.json", R_OK) == 0 &&
           access("tests/node/node_modules/@anthropic-ai/sdk/package.json", R_OK) == 0;
}

static const cJSON *at(const cJSON *o, const char *path) {
    char key[64];
    while (o && *path) {
        size_t n = strcspn(path, ".");
        snprintf(key, sizeof key, "%.*s", (int)n, path);
        o = (key[0] >= '0' && key[0] <= '9') ? cJSON_GetArrayItem(o, atoi(key)) : cJSON_GetObjectItem(o, key);
        path += n + (path[n] == '.');
    }
    return o;
}

static const char *str(const cJSON *o, const char *path) {
    const cJSON *v = at(o, path);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static bool is(const cJSON *o, const char *path, const char *want) {
    const char *s = str(o, path);
    return s && !strcmp(s, want);
}

TEST(server_agents_official_clients) {
    REQUIRE_SHARED(shared);
    if (!node_ready()) {
        const char *why = "node or the client packages are missing (cd tests/node && npm ci)";
        const char *req = getenv("QUILL_REQUIRE_SHARED");
        if (req && !strcmp(req, "1")) test_fail(__FILE__, __LINE__, "%s", why);
        else test_skip(why);
        return;
    }
    char model[600];
    snprintf(model, sizeof model, "%s/agents-qwen3.gguf", tmp_dir());
    struct stat st;
    if (stat(model, &st) != 0) {
        char cmd[2048], *out = NULL;
        snprintf(cmd, sizeof cmd,
                 "%s synth --arch qwen3 --embd 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 "
                 "--vocab %s/tokenizer/ggml-vocab-qwen3.gguf -o %s",
                 quill_bin(), shared, model);
        int rc = run_cmd(cmd, &out, true);
        CHECK(rc == 0, "synth: %s", out);
        free(out);
    }
    test_server s;
    CHECK(server_start(&s, model, "-np 2 -c 4096 -t 2 --api-key sk-agents"));
    char cmd[512], *out = NULL;
    snprintf(cmd, sizeof cmd, "node tests/node/agents_client.mjs http://127.0.0.1:%d sk-agents", s.port);
    int rc = run_cmd(cmd, &out, false);
    int stop = server_stop(&s);
    cJSON *o = rc == 0 ? cJSON_Parse(out) : NULL;
    CHECK(o, "the node clients failed (exit %d): %s", rc, out ? out : "");
    /* chat.completions with tools and a tool-call history: the same reply whole and streamed */
    const cJSON *chat = at(o, "chat_tools"), *chat_stream = at(o, "chat_tools_stream");
    CHECK(str(chat, "content") && str(chat_stream, "content") && !strcmp(str(chat, "content"), str(chat_stream, "content")),
          "chat with tools: %s", out);
    CHECK(is(chat, "finish_reason", "length") && is(chat_stream, "finish_reason", "length"), "finish: %s", out);
    CHECK(is(o, "chat_bad_tool_choice.error.name", "BadRequestError"), "an unknown tool_choice: %s", out);
    /* responses */
    const cJSON *resp = at(o, "responses");
    CHECK(str(resp, "id") && str(resp, "output_text") && is(resp, "output_types.0", "message") &&
              is(resp, "status", "incomplete") && cJSON_IsNumber(at(resp, "usage.input_tokens")),
          "responses.create: %s", out);
    CHECK(cJSON_IsNumber(at(resp, "follow_input_tokens")) &&
              at(resp, "follow_input_tokens")->valueint > at(resp, "usage.input_tokens")->valueint +
                                                              at(resp, "usage.output_tokens")->valueint,
          "previous_response_id did not carry the conversation: %s", out);
    CHECK(is(o, "responses_tools.output_types.0", "message"), "responses with function-call items: %s", out);
    const cJSON *rs = at(o, "responses_stream");
    CHECK(is(rs, "first", "response.created") && is(rs, "last", "response.incomplete") && cJSON_IsTrue(at(rs, "seq_ok")) &&
              str(rs, "text") && str(rs, "text")[0] && is(rs, "final_output.0", "message"),
          "responses stream: %s", out);
    /* Anthropic */
    const cJSON *msg = at(o, "messages"), *ms = at(o, "messages_stream");
    CHECK(is(msg, "type", "message") && is(msg, "role", "assistant") && is(msg, "stop_reason", "max_tokens") &&
              is(msg, "content.0.type", "text") && cJSON_IsNumber(at(msg, "usage.output_tokens")) &&
              at(msg, "usage.output_tokens")->valueint == 8,
          "messages.create: %s", out);
    CHECK(is(ms, "events.0", "message_start") && is(ms, "stop_reason", "max_tokens") && str(ms, "text") &&
              is(ms, "final_content.0.text", str(ms, "text")) && is(ms, "final_content.0.text", str(msg, "content.0.text")),
          "messages.stream (the same text as messages.create at temperature 0): %s", out);
    CHECK(is(o, "messages_auth.error.name", "AuthenticationError"), "a wrong x-api-key: %s", out);
    /* embeddings: two unit vectors of n_embd values, base64 and float alike */
    const cJSON *emb = at(o, "embeddings");
    CHECK(cJSON_IsNumber(at(emb, "count")) && at(emb, "count")->valueint == 2 && at(emb, "dims")->valueint == 64 &&
              fabs(at(emb, "norms.0")->valuedouble - 1) < 1e-5 && fabs(at(emb, "norms.1")->valuedouble - 1) < 1e-5 &&
              cJSON_IsTrue(at(emb, "same_as_float")) && cJSON_IsTrue(at(emb, "differ")),
          "embeddings.create: %s", out);
    /* forced calls: by construction, with arguments valid against the schema (ajv) */
    const cJSON *req = at(o, "chat_required");
    CHECK(is(req, "finish_reason", "tool_calls") && is(req, "name", "get_weather") && cJSON_IsTrue(at(req, "valid")) &&
              cJSON_IsTrue(at(req, "stream_same")) && is(req, "stream_finish", "tool_calls"),
          "tool_choice required: %s", out);
    CHECK(cJSON_IsNumber(at(o, "chat_n.count")) && at(o, "chat_n.count")->valueint == 2 && cJSON_IsTrue(at(o, "chat_n.differ")),
          "n: 2: %s", out);
    CHECK(is(o, "messages_tool_use.stop_reason", "tool_use") && is(o, "messages_tool_use.name", "get_weather") &&
              cJSON_IsTrue(at(o, "messages_tool_use.valid")),
          "messages with tool_choice any: %s", out);
    CHECK(is(o, "responses_call.status", "completed") && is(o, "responses_call.name", "get_weather") &&
              cJSON_IsTrue(at(o, "responses_call.valid")),
          "responses with tool_choice required: %s", out);
    cJSON_Delete(o);
    free(out);
    CHECK_EQ_INT(stop, 0);
}
