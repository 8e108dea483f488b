/* The official `openai` npm client against quill serve (tests/node: `npm ci` installs it; CI's
 * .ci/run does). Without node or the package the test fails under QUILL_REQUIRE_SHARED=1 (CI) and
 * is skipped elsewhere. */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool node_ready(void) {
    char *out = NULL;
    int rc = run_cmd("node --version", &out, true);
    free(out);
    return rc == 0 && access("tests/node/node_modules/openai/package.json", R_OK) == 0;
}

static const char *get_str(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItem(cJSON_GetObjectItem(o, a), b);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

TEST(server_openai_npm_client) {
    REQUIRE_SHARED(shared);
    if (!node_ready()) {
        const char *why = "node or the openai package is missing (cd tests/node && npm ci)";
        const char *req = getenv("QUILL_REQUIRE_SHARED");
        if (req && !strcmp(req, "1")) test_fail(__FILE__, __LINE__, "%s", why);
        else test_skip(why);
        return;
    }
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 2 -c 1024 -t 2 --api-key sk-quill-test");
    free(model);
    CHECK(started);
    /* the same chat through our own client, for comparison */
    http_resp r;
    const char *req = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me a story\"}], \"max_tokens\": 24, "
                      "\"temperature\": 0}";
    bool ok = http_do(s.port, "POST", "/v1/chat/completions", "Authorization: Bearer sk-quill-test\r\n", req,
                      strlen(req), 30, &r) && r.status == 200;
    cJSON *mine = ok ? cJSON_Parse(r.body) : NULL;
    http_resp_free(&r);
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(mine, "choices"), 0);
    const char *expected = get_str(choice, "message", "content");
    char cmd[256], *out = NULL;
    snprintf(cmd, sizeof cmd, "node tests/node/openai_client.mjs http://127.0.0.1:%d/v1 sk-quill-test", s.port);
    int rc = run_cmd(cmd, &out, true);
    int stop = server_stop(&s);
    cJSON *o = rc == 0 ? cJSON_Parse(out) : NULL;
    if (!o) test_fail(__FILE__, __LINE__, "the node client failed (exit %d): %s", rc, out ? out : "");
    else {
        const cJSON *models = cJSON_GetObjectItem(o, "models");
        const char *chat = get_str(o, "chat", "content"), *stream = get_str(o, "stream", "content");
        const char *completion = get_str(o, "completion", "text");
        const cJSON *auth = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "auth"), "status");
        if (!(cJSON_GetArraySize(models) == 1 && !strcmp(cJSON_GetArrayItem(models, 0)->valuestring, "stories260K.gguf")))
            test_fail(__FILE__, __LINE__, "models.list: %s", out);
        else if (!expected || !chat || strcmp(chat, expected))
            test_fail(__FILE__, __LINE__, "chat: \"%s\", our client got \"%s\"", chat ? chat : "", expected ? expected : "");
        else if (!stream || strcmp(stream, chat) || !get_str(o, "stream", "role") ||
                 strcmp(get_str(o, "stream", "role"), "assistant") || !get_str(o, "stream", "finish_reason") ||
                 !cJSON_IsObject(cJSON_GetObjectItem(cJSON_GetObjectItem(o, "stream"), "usage")))
            test_fail(__FILE__, __LINE__, "streaming chat: %s", out);
        else if (!completion || strncmp(completion, ", there was a little girl named Lily", 35))
            test_fail(__FILE__, __LINE__, "completions: %s", out);
        else if (!cJSON_IsNumber(auth) || auth->valueint != 401)
            test_fail(__FILE__, __LINE__, "a wrong key should give 401 (AuthenticationError): %s", out);
    }
    cJSON_Delete(o);
    cJSON_Delete(mine);
    free(out);
    CHECK_EQ_INT(stop, 0);
}
