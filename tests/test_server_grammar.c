/* Constrained decoding through the server: `grammar` (GBNF), `response_format` (json_object and
 * json_schema) and llama-server's `json_schema` on /v1/completions and /v1/chat/completions,
 * whole and streamed, identical at temperature 0 whatever runs beside; and the 400s for what
 * cannot be honoured, naming the field and the keyword. */
#include "server_util.h"
#include "test.h"

#include "quill.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const char *str_at(const cJSON *o, const char *a, const char *b) {
    const cJSON *v = cJSON_GetObjectItem(o, a);
    if (b) v = cJSON_GetObjectItem(v, b);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* The completion's text (choices[0].text or .message.content) and finish reason; malloc'd. */
static char *completion(int port, const char *path, const char *body, char **finish) {
    http_resp r;
    if (!http_post(port, path, body, &r)) {
        test_fail(__FILE__, __LINE__, "no reply to %s", body);
        return NULL;
    }
    cJSON *o = cJSON_Parse(r.body ? r.body : "");
    const cJSON *choice = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0);
    const char *text = str_at(choice, "text", NULL);
    if (!text) text = str_at(choice, "message", "content");
    char *out = r.status == 200 && text ? strdup(text) : NULL;
    if (finish) *finish = out && str_at(choice, "finish_reason", NULL) ? strdup(str_at(choice, "finish_reason", NULL)) : NULL;
    if (!out) test_fail(__FILE__, __LINE__, "%s: %d %s", body, r.status, r.body ? r.body : "");
    cJSON_Delete(o);
    http_resp_free(&r);
    return out;
}

static bool expect_400(int port, const char *path, const char *body, const char *needle, const char *param) {
    http_resp r;
    if (!http_post(port, path, body, &r)) {
        test_fail(__FILE__, __LINE__, "no reply to %s", body);
        return false;
    }
    cJSON *o = cJSON_Parse(r.body ? r.body : "");
    const char *msg = str_at(o, "error", "message"), *p = str_at(o, "error", "param");
    bool ok = r.status == 400 && msg && strstr(msg, needle) && p && !strcmp(p, param);
    if (!ok) test_fail(__FILE__, __LINE__, "%s: expected 400 \"%s\" for %s, got %d %s", body, needle, param, r.status, r.body);
    cJSON_Delete(o);
    http_resp_free(&r);
    return ok;
}

typedef struct {
    int port;
    const char *body;
    char *text;
} job_arg;

static void *run_job(void *p) {
    job_arg *a = p;
    a->text = completion(a->port, "/v1/completions", a->body, NULL);
    return NULL;
}

TEST(server_grammar_and_structured_outputs) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 2 -c 1024 -t 1");
    free(model);
    CHECK(started);

    /* a GBNF grammar at temperature 0 */
    char *finish = NULL;
    char *t = completion(s.port, "/v1/completions",
                         "{\"prompt\": \"Once upon a time\", \"temperature\": 0, \"max_tokens\": 20, "
                         "\"grammar\": \"root ::= \\\", there \\\" (\\\"was\\\" | \\\"were\\\") \\\" a \\\" [a-z]+ \\\".\\\"\"}",
                         &finish);
    bool ok = t && !strncmp(t, ", there was a ", 14) && t[strlen(t) - 1] == '.' && finish && !strcmp(finish, "stop");
    if (!ok) test_fail(__FILE__, __LINE__, "grammar: \"%s\" (%s)", t ? t : "", finish ? finish : "");
    free(t);
    free(finish);

    /* a JSON schema: the reply parses and holds what the schema requires, even at temperature 1.5
     * from a model that never saw JSON */
    const char *schema_body =
        "{\"prompt\": \"Once upon a time\", \"temperature\": 1.5, \"seed\": 9, \"max_tokens\": 300, "
        "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"pet\", \"strict\": true, "
        "\"schema\": {\"type\": \"object\", \"properties\": {\"name\": {\"type\": \"string\", \"maxLength\": 8}, "
        "\"legs\": {\"enum\": [2, 4]}, \"tags\": {\"type\": \"array\", \"items\": {\"type\": \"boolean\"}, "
        "\"maxItems\": 3}}, \"required\": [\"name\", \"legs\", \"tags\"], \"additionalProperties\": false}}}}";
    finish = NULL;
    t = ok ? completion(s.port, "/v1/completions", schema_body, &finish) : NULL;
    cJSON *o = t ? cJSON_Parse(t) : NULL;
    const cJSON *legs = cJSON_GetObjectItem(o, "legs");
    ok = o && cJSON_IsString(cJSON_GetObjectItem(o, "name")) && cJSON_IsNumber(legs) &&
         (legs->valueint == 2 || legs->valueint == 4) && cJSON_IsArray(cJSON_GetObjectItem(o, "tags")) &&
         cJSON_GetArraySize(o) == 3 && finish && !strcmp(finish, "stop");
    if (t && !ok) test_fail(__FILE__, __LINE__, "json_schema: \"%s\" (%s)", t, finish ? finish : "");
    cJSON_Delete(o);

    /* the same request twice at once and streamed: the same text */
    if (ok) {
        pthread_t th[2];
        job_arg args[2] = {{s.port, schema_body, NULL}, {s.port, schema_body, NULL}};
        for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, run_job, &args[i]);
        for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
        for (int i = 0; i < 2; i++) {
            if (ok && (!args[i].text || strcmp(args[i].text, t)))
                ok = false, test_fail(__FILE__, __LINE__, "concurrent reply %d: \"%s\" vs \"%s\"", i,
                                      args[i].text ? args[i].text : "", t);
            free(args[i].text);
        }
        size_t n = strlen(schema_body);
        char *streamed = malloc(n + 32);
        memcpy(streamed, schema_body, n - 1);
        strcpy(streamed + n - 1, ", \"stream\": true}");
        http_resp r;
        char *sfinish = NULL;
        bool done = false;
        char *joined = NULL;
        if (ok && http_post(s.port, "/v1/completions", streamed, &r)) {
            joined = sse_text(r.body, &sfinish, &done);
            http_resp_free(&r);
        }
        if (ok && (!joined || strcmp(joined, t) || !done || !sfinish || strcmp(sfinish, "stop")))
            ok = false, test_fail(__FILE__, __LINE__, "streamed: \"%s\" vs \"%s\"", joined ? joined : "", t);
        free(joined);
        free(sfinish);
        free(streamed);
    }
    free(t);
    free(finish);

    /* json_object and llama-server's json_schema, on the chat route too when there is a template */
    t = ok ? completion(s.port, "/v1/completions",
                        "{\"prompt\": \"Once\", \"temperature\": 0.9, \"seed\": 3, \"max_tokens\": 60, "
                        "\"response_format\": {\"type\": \"json_object\"}}",
                        &finish) : NULL;
    /* stories260K writes keys and values forever: an object that is complete when it stopped */
    o = t ? cJSON_Parse(t) : NULL;
    if (t && (t[0] != '{' || (strcmp(finish, "length") && !cJSON_IsObject(o)))) {
        ok = false;
        test_fail(__FILE__, __LINE__, "json_object: \"%s\" (%s)", t, finish);
    }
    cJSON_Delete(o);
    free(t);
    free(finish);
    t = ok ? completion(s.port, "/v1/completions",
                        "{\"prompt\": \"Once\", \"temperature\": 0, \"max_tokens\": 50, "
                        "\"json_schema\": {\"enum\": [\"yes\", \"no\"]}}", NULL) : NULL;
    if (t && strcmp(t, "\"yes\"") && strcmp(t, "\"no\"") && strcmp(t, "\"yes\" ") && strcmp(t, "\"no\" "))
        ok = false, test_fail(__FILE__, __LINE__, "json_schema: \"%s\"", t);
    free(t);

    /* what cannot be honoured is refused before anything runs */
    const char *c = "/v1/completions";
    if (ok) {
        expect_400(s.port, c,
                   "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": "
                   "\"x\", \"schema\": {\"type\": \"string\", \"pattern\": \"^a\"}}}}",
                   "the keyword 'pattern' at # is not supported", "response_format");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"grammar\": \"root ::= foo\"}",
                   "line 1, column 10: rule 'foo' is used but never defined", "grammar");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"grammar\": 5}", "'grammar' must be a string", "grammar");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"grammar\": \"root ::= [a]\", \"response_format\": {\"type\": \"json_object\"}}",
                   "give one of", "grammar");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"xml\"}}", "json_schema", "response_format");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\"}}",
                   "needs a 'json_schema' object", "response_format");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_schema\", \"json_schema\": "
                              "{\"schema\": {\"type\": \"object\", \"minProperties\": 1}}}}",
                   "'minProperties'", "response_format");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"json_schema\": {\"$ref\": \"#/$defs/none\"}}", "points to nothing",
                   "json_schema");
        expect_400(s.port, c, "{\"prompt\": \"a\", \"ignore_eos\": true, \"grammar\": \"root ::= [a]\"}",
                   "cannot be combined", "ignore_eos");
    }
    /* a text response_format constrains nothing */
    t = ok ? completion(s.port, c, "{\"prompt\": \"Once upon a time\", \"temperature\": 0, \"max_tokens\": 8, "
                                   "\"response_format\": {\"type\": \"text\"}}", NULL) : NULL;
    if (t && strncmp(t, ", there was a little girl", 25)) test_fail(__FILE__, __LINE__, "text: \"%s\"", t);
    free(t);
    CHECK_EQ_INT(server_stop(&s), 0);
}
