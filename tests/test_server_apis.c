/* The Anthropic, Responses and embeddings routes with bad input: each malformed field is a 400 in
 * the API's own error shape, naming what is wrong; nothing crashes (the sanitizer run checks). */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>

TEST(server_apis_bad_input) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 1 -c 256 -t 1");
    free(model);
    CHECK(started);
    static const struct { const char *path, *body, *needle; } cases[] = {
        {"/v1/messages", "[]", "JSON object"},
        {"/v1/messages", "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "max_tokens"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": []}", "non-empty"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}", "role"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}", "image"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", \"id\": \"t\"}]}]}", "tool_use"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"tool_result\"}]}]}", "tool_use_id"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{}]}", "name"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": {\"type\": \"sometimes\"}}", "tool_choice"},
        {"/v1/messages", "{\"max_tokens\": 4, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": 1}", "stream"},
        {"/v1/messages", "{\"max_tokens\": 4, \"system\": [{\"type\": \"image\"}], \"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "text blocks"},
        {"/v1/responses", "{}", "input"},
        {"/v1/responses", "{\"input\": 3}", "input"},
        {"/v1/responses", "{\"input\": [{\"role\": \"robot\", \"content\": \"x\"}]}", "role"},
        {"/v1/responses", "{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\"}]}]}", "input_image"},
        {"/v1/responses", "{\"input\": [{\"type\": \"function_call\", \"name\": \"f\"}]}", "call_id"},
        {"/v1/responses", "{\"input\": [{\"type\": \"web_search_call\"}]}", "not supported"},
        {"/v1/responses", "{\"input\": \"x\", \"tools\": [{\"type\": \"web_search\"}]}", "function tools"},
        {"/v1/responses", "{\"input\": \"x\", \"previous_response_id\": \"resp_nope\"}", "store"},
        {"/v1/responses", "{\"input\": \"x\", \"instructions\": 5}", "instructions"},
        {"/v1/embeddings", "{}", "input"},
        {"/v1/embeddings", "{\"input\": [[]]}", "empty"},
        {"/v1/embeddings", "{\"input\": []}", "inputs"},
        {"/v1/embeddings", "{\"input\": [1, 2, 999999]}", "token id"},
        {"/v1/embeddings", "{\"input\": {\"a\": 1}}", "input"},
        {"/v1/embeddings", "{\"input\": \"x\", \"encoding_format\": \"hex\"}", "encoding_format"},
        {"/v1/embeddings", "{\"input\": \"x\", \"pooling\": \"max\"}", "pooling"},
        {"/v1/embeddings", "{\"input\": \"x\", \"dimensions\": 3}", "dimensions"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        http_resp r;
        CHECK(http_post(s.port, cases[i].path, cases[i].body, &r), "%s: no reply", cases[i].body);
        cJSON *o = cJSON_Parse(r.body);
        const cJSON *err = cJSON_GetObjectItem(o, "error");
        const char *msg = cJSON_GetStringValue(cJSON_GetObjectItem(err, "message"));
        bool anthropic = !strcmp(cases[i].path, "/v1/messages");
        bool shape = anthropic ? !strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(o, "type")) ? cJSON_GetStringValue(cJSON_GetObjectItem(o, "type")) : "", "error") &&
                                     cJSON_GetStringValue(cJSON_GetObjectItem(err, "type"))
                               : cJSON_IsNumber(cJSON_GetObjectItem(err, "code"));
        CHECK(r.status == 400 && shape && msg && strstr(msg, cases[i].needle), "%s %s: %d %s", cases[i].path, cases[i].body,
              r.status, r.body);
        cJSON_Delete(o);
        http_resp_free(&r);
    }
    CHECK_EQ_INT(server_stop(&s), 0);
}
