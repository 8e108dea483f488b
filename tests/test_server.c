/* quill serve through HTTP: every route and error, streaming, concurrency (each reply identical
 * to the same request alone), vanished clients, the queue limit, prefix reuse, full contexts and
 * a clean shutdown. Servers listen on 127.0.0.1 on ephemeral ports; every wait is bounded. */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STORIES "models/stories260K.gguf"

static char *model_path(const char *shared) { return path_join(shared, STORIES); }

/* The JSON body of a reply, or NULL with a test failure. */
static cJSON *body_json(const http_resp *r) {
    cJSON *o = cJSON_Parse(r->body ? r->body : "");
    if (!o) test_fail(__FILE__, __LINE__, "not JSON: %s", r->body ? r->body : "(none)");
    return o;
}

static const char *str_at(const cJSON *o, const char *path) {
    /* "a.b.0.c": object keys and array indices */
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItem(cur, tok);
    return cJSON_IsString(cur) ? cur->valuestring : NULL;
}

static double num_at(const cJSON *o, const char *path) {
    char buf[128];
    snprintf(buf, sizeof buf, "%s", path);
    const cJSON *cur = o;
    for (char *tok = strtok(buf, "."); tok && cur; tok = strtok(NULL, "."))
        cur = (*tok >= '0' && *tok <= '9') ? cJSON_GetArrayItem(cur, atoi(tok)) : cJSON_GetObjectItem(cur, tok);
    return cJSON_IsNumber(cur) ? cur->valuedouble : -1e300;
}

/* POSTs and expects an OpenAI error object with `status`, whose message contains `needle`. */
static bool expect_error(int port, const char *path, const char *body, size_t len, int status, const char *needle,
                         const char *param) {
    http_resp r;
    if (!http_do(port, "POST", path, NULL, body, len, 30, &r)) {
        test_fail(__FILE__, __LINE__, "%s: no reply to %.80s", path, body);
        return false;
    }
    cJSON *o = cJSON_Parse(r.body);
    const char *msg = str_at(o, "error.message"), *type = str_at(o, "error.type"), *p = str_at(o, "error.param");
    bool ok = r.status == status && msg && type && strstr(msg, needle) && (!param || (p && !strcmp(p, param)));
    if (!ok)
        test_fail(__FILE__, __LINE__, "%.80s: expected %d with \"%s\"%s%s, got %d %s", body, status, needle,
                  param ? " for " : "", param ? param : "", r.status, r.body);
    cJSON_Delete(o);
    http_resp_free(&r);
    return ok;
}

TEST(server_routes) {
    REQUIRE_SHARED(shared);
    char *model = model_path(shared);
    test_server s;
    bool started = server_start(&s, model, "-np 2 -c 2048 -t 2");
    free(model);
    CHECK(started);
    http_resp r;
    cJSON *o = NULL;
    bool ok = http_do(s.port, "GET", "/health", NULL, NULL, 0, 10, &r) && r.status == 200 && strstr(r.body, "\"ok\"");
    if (!ok) test_fail(__FILE__, __LINE__, "/health: %d %s", r.status, r.body);
    http_resp_free(&r);

    if (ok) ok = http_do(s.port, "GET", "/v1/models", NULL, NULL, 0, 10, &r) && r.status == 200;
    if (ok) {
        o = body_json(&r);
        ok = o && str_at(o, "data.0.id") && !strcmp(str_at(o, "data.0.id"), "stories260K.gguf") &&
             !strcmp(str_at(o, "object"), "list");
        if (!ok) test_fail(__FILE__, __LINE__, "/v1/models: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);

    /* greedy completion: the golden continuation of stories260K */
    if (ok) ok = http_post(s.port, "/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 24, \"temperature\": 0}", &r);
    if (ok) {
        o = body_json(&r);
        const char *text = str_at(o, "choices.0.text");
        ok = r.status == 200 && text && !strncmp(text, ", there was a little girl named Lily. She loved to play outside", 60) &&
             !strcmp(str_at(o, "object"), "text_completion") && !strcmp(str_at(o, "choices.0.finish_reason"), "length") &&
             num_at(o, "usage.completion_tokens") == 24 && num_at(o, "usage.prompt_tokens") == 5 &&
             num_at(o, "usage.total_tokens") == 29;
        if (!ok) test_fail(__FILE__, __LINE__, "completion: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);

    /* a stop string ends the text before it; it is not included */
    if (ok) ok = http_post(s.port, "/v1/completions", "{\"prompt\": \"Once upon a time\", \"max_tokens\": 40, \"temperature\": 0, \"stop\": [\"zzz\", \"Lily\"]}", &r);
    if (ok) {
        o = body_json(&r);
        const char *text = str_at(o, "choices.0.text");
        ok = r.status == 200 && text && !strcmp(text, ", there was a little girl named ") &&
             !strcmp(str_at(o, "choices.0.finish_reason"), "stop");
        if (!ok) test_fail(__FILE__, __LINE__, "stop: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);

    /* chat, whole and streamed: the same text at temperature 0 */
    const char *chat = "{\"model\": \"whatever\", \"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, "
                       "{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"Tell me\"}, {\"type\": \"text\", \"text\": \" a story\"}]}], "
                       "\"max_tokens\": 30, \"temperature\": 0, \"unknown_field\": {\"x\": [1, 2]}%s}";
    char req[1024];
    char *whole = NULL;
    snprintf(req, sizeof req, chat, "");
    if (ok) ok = http_post(s.port, "/v1/chat/completions", req, &r);
    if (ok) {
        o = body_json(&r);
        const char *content = str_at(o, "choices.0.message.content");
        ok = r.status == 200 && content && *content && !strcmp(str_at(o, "choices.0.message.role"), "assistant") &&
             !strcmp(str_at(o, "object"), "chat.completion") && !strncmp(str_at(o, "id"), "chatcmpl-", 9) &&
             num_at(o, "usage.completion_tokens") >= 1 && num_at(o, "usage.completion_tokens") <= 30;
        if (ok) whole = strdup(content);
        if (!ok) test_fail(__FILE__, __LINE__, "chat: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);
    snprintf(req, sizeof req, chat, ", \"stream\": true, \"stream_options\": {\"include_usage\": true}");
    if (ok) ok = http_post(s.port, "/v1/chat/completions", req, &r);
    if (ok) {
        char *finish, *ctype = http_header(&r, "Content-Type");
        bool done;
        char *text = sse_text(r.body, &finish, &done);
        ok = r.status == 200 && ctype && !strcmp(ctype, "text/event-stream") && done && finish && text &&
             !strcmp(text, whole) && strstr(r.body, "\"delta\":{\"role\":\"assistant\",\"content\":\"\"}") &&
             strstr(r.body, "\"choices\":[],\"usage\":{\"prompt_tokens\"");
        if (!ok) test_fail(__FILE__, __LINE__, "stream (whole reply \"%s\"): %s", whole, r.body);
        free(text);
        free(finish);
        free(ctype);
    }
    http_resp_free(&r);
    free(whole);

    /* logprobs: the greedy token is the best alternative */
    if (ok) ok = http_post(s.port, "/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"max_tokens\": 4, \"temperature\": 0, \"logprobs\": true, \"top_logprobs\": 3}", &r);
    if (ok) {
        o = body_json(&r);
        const cJSON *content = cJSON_GetObjectItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "logprobs"), "content");
        ok = r.status == 200 && cJSON_GetArraySize(content) == 4;
        for (int i = 0; ok && i < 4; i++) {
            const cJSON *e = cJSON_GetArrayItem(content, i), *top = cJSON_GetObjectItem(e, "top_logprobs");
            ok = cJSON_GetArraySize(top) == 3 &&
                 cJSON_GetObjectItem(e, "logprob")->valuedouble == cJSON_GetObjectItem(cJSON_GetArrayItem(top, 0), "logprob")->valuedouble &&
                 cJSON_GetObjectItem(e, "logprob")->valuedouble <= 0;
        }
        if (!ok) test_fail(__FILE__, __LINE__, "logprobs: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);

    /* tokenize and detokenize: llama-server's shapes, a round trip */
    if (ok) ok = http_post(s.port, "/tokenize", "{\"content\": \"Once upon a time\"}", &r);
    if (ok) {
        o = body_json(&r);
        const cJSON *toks = cJSON_GetObjectItem(o, "tokens");
        ok = r.status == 200 && cJSON_GetArraySize(toks) == 4;
        if (ok) {
            char *ids = cJSON_PrintUnformatted(toks), det[256];
            snprintf(det, sizeof det, "{\"tokens\": %s}", ids);
            free(ids);
            http_resp d;
            ok = http_post(s.port, "/detokenize", det, &d) && d.status == 200 &&
                 !strcmp(d.body, "{\"content\":\"Once upon a time\"}");
            if (!ok) test_fail(__FILE__, __LINE__, "detokenize: %s", d.body);
            http_resp_free(&d);
        } else {
            test_fail(__FILE__, __LINE__, "tokenize: %s", r.body);
        }
        cJSON_Delete(o);
    }
    http_resp_free(&r);

    /* metrics: Prometheus text with the counters */
    if (ok) ok = http_do(s.port, "GET", "/metrics", NULL, NULL, 0, 10, &r);
    if (ok) {
        ok = r.status == 200 && strstr(r.body, "quill_requests_total{status=\"200\"}") &&
             strstr(r.body, "# TYPE quill_generated_tokens_total counter") && strstr(r.body, "quill_slots_busy 0") &&
             strstr(r.body, "quill_queue_depth 0") && strstr(r.body, "quill_prompt_tokens_cached_total") &&
             strstr(r.body, "quill_generation_tokens_per_second");
        if (!ok) test_fail(__FILE__, __LINE__, "metrics: %s", r.body);
    }
    http_resp_free(&r);

    /* unknown route and wrong method */
    if (ok) ok = http_do(s.port, "GET", "/v2/nothing", NULL, NULL, 0, 10, &r) && r.status == 404 && strstr(r.body, "not_found_error");
    http_resp_free(&r);
    if (ok) ok = http_do(s.port, "GET", "/v1/chat/completions", NULL, NULL, 0, 10, &r) && r.status == 405;
    http_resp_free(&r);
    if (!ok) test_fail(__FILE__, __LINE__, "404/405");
    CHECK_EQ_INT(server_stop(&s), 0);
}

/* Bad requests: each a clear 4xx naming what is wrong, and the server goes on. */
TEST(server_bad_requests) {
    REQUIRE_SHARED(shared);
    char *model = model_path(shared);
    test_server s;
    bool started = server_start(&s, model, "-np 1 -c 512 -t 1 --max-body 8192");
    free(model);
    CHECK(started);
    const char *C = "/v1/chat/completions", *P = "/v1/completions";
    struct {
        const char *path, *body, *needle, *param;
        int status;
    } cases[] = {
        {C, "{\"messages\": [", "not valid JSON", NULL, 400},
        {C, "{\"messages\": []} trailing", "not valid JSON", NULL, 400},
        {C, "[1, 2]", "must be a JSON object", NULL, 400},
        {C, "", "not valid JSON", NULL, 400},
        {C, "{}", "'messages' is required", "messages", 400},
        {C, "{\"messages\": \"hi\"}", "must be an array", "messages", 400},
        {C, "{\"messages\": []}", "at least one message", "messages", 400},
        {C, "{\"messages\": [{\"role\": \"wizard\", \"content\": \"x\"}]}", "is not one of", "messages", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": 5}]}", "must be a string or an array", "messages", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image_url\"}]}]}", "not supported", "messages", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": \"hot\"}", "must be a number", "temperature", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"temperature\": 7}", "between 0 and 2", "temperature", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2.5}", "integer", "max_tokens", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 0}", "between", "max_tokens", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"n\": 17}", "between 1 and 16", "n", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": 1}", "true or false", "stream", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop\": [1]}", "strings", "stop", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"top_logprobs\": 2}", "needs 'logprobs'", "top_logprobs", 400},
        {C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream_options\": 3}", "must be an object", "stream_options", 400},
        {P, "{\"prompt\": [\"a\", \"b\"]}", "one prompt per request", "prompt", 400},
        {P, "{\"prompt\": [1, 99999]}", "outside the vocabulary", "prompt", 400},
        {P, "{\"prompt\": 12}", "must be a string", "prompt", 400},
        {P, "{\"prompt\": \"x\", \"logprobs\": 9}", "between 0 and 5", "logprobs", 400},
        {"/tokenize", "{\"content\": 3}", "must be a string", "content", 400},
        {"/detokenize", "{\"tokens\": [1, -4]}", "token ids in", "tokens", 400},
    };
    bool ok = true;
    for (size_t i = 0; ok && i < sizeof cases / sizeof cases[0]; i++)
        ok = expect_error(s.port, cases[i].path, cases[i].body, strlen(cases[i].body), cases[i].status, cases[i].needle,
                          cases[i].param);
    /* invalid UTF-8, a NUL byte, nesting, an oversize body */
    if (ok) ok = expect_error(s.port, C, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xC3\x28\"}]}", strlen("{\"messages\": [{\"role\": \"user\", \"content\": \"\xC3\x28\"}]}"), 400, "not valid UTF-8", NULL);
    if (ok) ok = expect_error(s.port, C, "{\"messages\": [{\"role\": \"user\", \"content\": \"\xED\xA0\x80\"}]}", strlen("{\"messages\": [{\"role\": \"user\", \"content\": \"\xED\xA0\x80\"}]}"), 400, "not valid UTF-8", NULL);
    if (ok) ok = expect_error(s.port, C, "{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}", strlen("{\"messages\": [{\"role\": \"user\", \"content\": \"\\ud800\"}]}"), 400, "not valid JSON", NULL);
    if (ok) ok = expect_error(s.port, C, "{\"a\": 1}\0{}", 11, 400, "NUL byte", NULL);
    char deep[600];
    memset(deep, '[', 300);
    memset(deep + 300, ']', 300);
    if (ok) ok = expect_error(s.port, C, deep, sizeof deep, 400, "nests deeper", NULL);
    char *big = malloc(20000);
    memset(big, ' ', 20000);
    big[0] = '{';
    big[19999] = '}';
    if (ok) ok = expect_error(s.port, C, big, 20000, 413, "larger than", NULL);
    free(big);
    /* after all that, a good request still works, and the server stops cleanly */
    http_resp r;
    if (ok) {
        ok = http_post(s.port, C, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"max_tokens\": 2, \"future_field\": true}", &r) &&
             r.status == 200;
        if (!ok) test_fail(__FILE__, __LINE__, "good request after bad ones: %d %s", r.status, r.body);
        http_resp_free(&r);
    }
    CHECK_EQ_INT(server_stop(&s), 0);
}

TEST(server_api_key) {
    REQUIRE_SHARED(shared);
    char *model = model_path(shared), *key = path_join(tmp_dir(), "api.key"), args[600];
    FILE *f = fopen(key, "w");
    CHECK(f && fputs("s3cret-key\n", f) >= 0 && fclose(f) == 0);
    snprintf(args, sizeof args, "-np 1 -c 256 -t 1 --api-key-file %s", key);
    test_server s;
    bool started = server_start(&s, model, args);
    free(model);
    free(key);
    CHECK(started);
    http_resp r;
    bool ok = http_do(s.port, "GET", "/v1/models", NULL, NULL, 0, 10, &r) && r.status == 401 &&
              strstr(r.body, "authentication_error");
    http_resp_free(&r);
    if (ok) ok = http_do(s.port, "GET", "/v1/models", "Authorization: Bearer s3cret-kez\r\n", NULL, 0, 10, &r) && r.status == 401;
    http_resp_free(&r);
    if (ok) ok = http_do(s.port, "GET", "/v1/models", "Authorization: Bearer s3cret-key-and-more\r\n", NULL, 0, 10, &r) && r.status == 401;
    http_resp_free(&r);
    if (ok) ok = http_do(s.port, "POST", "/v1/completions", NULL, "{\"prompt\": \"a\"}", 15, 10, &r) && r.status == 401;
    http_resp_free(&r);
    if (ok) ok = http_do(s.port, "GET", "/v1/models", "Authorization: Bearer s3cret-key\r\n", NULL, 0, 10, &r) && r.status == 200;
    http_resp_free(&r);
    if (ok) ok = http_do(s.port, "GET", "/health", NULL, NULL, 0, 10, &r) && r.status == 200;
    http_resp_free(&r);
    if (!ok) test_fail(__FILE__, __LINE__, "API key checks");
    CHECK_EQ_INT(server_stop(&s), 0);
}

/* ---------------------------------------------------------------- concurrency */

typedef struct {
    int port;
    const char *path;
    char body[512];
    bool stream;
    char *text;         /* the reply's text */
    bool ok;
    char why[200];      /* when not ok: the transport's failure, or the status and the reply's start */
} client_job;

static void *client_run(void *arg) {
    client_job *j = arg;
    http_resp r;
    const bool sent = http_do(j->port, "POST", j->path, NULL, j->body, strlen(j->body), 120, &r);
    j->ok = sent && r.status == 200;
    if (!sent) snprintf(j->why, sizeof j->why, "no HTTP reply (connection failed, reset or timed out)");
    else snprintf(j->why, sizeof j->why, "status %d: %.160s", r.status, r.body ? r.body : "");
    if (j->ok && j->stream) {
        char *finish;
        bool done;
        j->text = sse_text(r.body, &finish, &done);
        j->ok = done && finish;
        free(finish);
    } else if (j->ok) {
        cJSON *o = cJSON_Parse(r.body);
        const char *t = str_at(o, "choices.0.message.content");
        if (!t) t = str_at(o, "choices.0.text");
        j->text = t ? strdup(t) : NULL;
        j->ok = t != NULL;
        cJSON_Delete(o);
    }
    http_resp_free(&r);
    return NULL;
}

static void make_jobs(client_job *jobs, int n, int port) {
    static const char *const prompts[] = {"Once upon a time", "Lily and Tom went to the park", "The little dog",
                                          "One day, a big bird"};
    for (int i = 0; i < n; i++) {
        client_job *j = &jobs[i];
        memset(j, 0, sizeof *j);
        j->port = port;
        j->stream = i % 3 == 1;
        const char *p = prompts[i % 4];
        /* greedy, and seeded sampling: both must not depend on the company */
        const char *sampling = i % 2 ? "\"temperature\": 0" : "\"temperature\": 0.9, \"seed\": 1234";
        if (i % 4 < 2) {
            j->path = "/v1/chat/completions";
            snprintf(j->body, sizeof j->body,
                     "{\"messages\": [{\"role\": \"user\", \"content\": \"%s\"}], \"max_tokens\": %d, %s%s}", p,
                     24 + i, sampling, j->stream ? ", \"stream\": true" : "");
        } else {
            j->path = "/v1/completions";
            snprintf(j->body, sizeof j->body, "{\"prompt\": \"%s\", \"max_tokens\": %d, %s%s}", p, 24 + i, sampling,
                     j->stream ? ", \"stream\": true" : "");
        }
    }
}

/* 16 clients at once against 4 slots (a queue forms): each reply identical to the same request
 * served alone by a fresh one-slot server. */
TEST(server_concurrent_clients_match_alone) {
    REQUIRE_SHARED(shared);
    enum { N = 16 };
    char *model = model_path(shared);
    client_job alone[N], together[N];
    test_server s;
    bool ok = server_start(&s, model, "-np 1 -c 512 -t 2");
    if (ok) {
        make_jobs(alone, N, s.port);
        for (int i = 0; i < N; i++) client_run(&alone[i]);
        CHECK_EQ_INT(server_stop(&s), 0);
        ok = server_start(&s, model, "-np 4 -c 2048 -t 2 -b 16");
    }
    free(model);
    CHECK(ok);
    make_jobs(together, N, s.port);
    pthread_t th[N];
    for (int i = 0; i < N; i++) pthread_create(&th[i], NULL, client_run, &together[i]);
    for (int i = 0; i < N; i++) pthread_join(th[i], NULL);
    int stop = server_stop(&s);
    for (int i = 0; i < N; i++) {
        if (ok && !(alone[i].ok && together[i].ok && !strcmp(alone[i].text, together[i].text))) {
            test_fail(__FILE__, __LINE__, "client %d (%s): alone \"%s\", together \"%s\"", i, together[i].body,
                      alone[i].text ? alone[i].text : alone[i].why, together[i].text ? together[i].text : together[i].why);
            ok = false;
        }
        free(alone[i].text);
        free(together[i].text);
    }
    if (!ok && s.log[0]) {
        size_t len = 0;
        char *log = read_file(s.log, &len);
        test_fail(__FILE__, __LINE__, "the server's log ends: %s", log ? log + (len > 1500 ? len - 1500 : 0) : "(none)");
        free(log);
    }
    CHECK_EQ_INT(stop, 0);
}

/* Slots busy according to /metrics, or -1. */
static int busy_slots(int port) {
    http_resp r;
    int busy = -1;
    if (http_do(port, "GET", "/metrics", NULL, NULL, 0, 10, &r) && r.status == 200) {
        const char *at = strstr(r.body, "\nquill_slots_busy ");
        if (at) busy = atoi(at + 18);
    }
    http_resp_free(&r);
    return busy;
}

static const char long_stream[] = "{\"prompt\": \"Once upon a time\", \"max_tokens\": 100000, \"ignore_eos\": true, "
                                  "\"temperature\": 0, \"stream\": true}";

/* Opens a streaming request that would run for long and reads its first bytes; the socket. */
static int start_long_stream(int port) {
    int fd = http_connect(port);
    if (fd < 0) return -1;
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(long_stream), long_stream);
    char buf[256];
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n || recv(fd, buf, sizeof buf, 0) <= 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A client that vanishes mid-stream frees its slot; the others finish. */
TEST(server_client_vanishes_mid_stream) {
    REQUIRE_SHARED(shared);
    char *model = model_path(shared);
    test_server s;
    bool ok = server_start(&s, model, "-np 2 -c 8192 -t 2");
    free(model);
    CHECK(ok);
    int fd = start_long_stream(s.port);
    client_job other;
    make_jobs(&other, 1, s.port);
    pthread_t th;
    pthread_create(&th, NULL, client_run, &other);
    int busy_before = busy_slots(s.port);
    for (int i = 0; i < 100 && busy_before < 1; i++) {
        usleep(50000);
        busy_before = busy_slots(s.port);
    }
    if (fd >= 0) close(fd);
    pthread_join(th, NULL);
    int busy = -1;
    for (int i = 0; i < 100 && busy != 0; i++) {
        usleep(50000);
        busy = busy_slots(s.port);
    }
    int stop = server_stop(&s);
    free(other.text);
    CHECK(fd >= 0, "the long stream did not start");
    CHECK(busy_before >= 1, "the long stream should hold a slot (busy %d)", busy_before);
    CHECK(other.ok, "the other client's request failed");
    CHECK_EQ_INT(busy, 0);
    CHECK_EQ_INT(stop, 0);
}

/* Beyond the slots and the queue: 503 with Retry-After; a SIGTERM ends open streams cleanly. */
TEST(server_queue_full_and_shutdown) {
    REQUIRE_SHARED(shared);
    char *model = model_path(shared);
    test_server s;
    bool ok = server_start(&s, model, "-np 1 -c 8192 -t 1 --max-queue 1");
    free(model);
    CHECK(ok);
    int running = start_long_stream(s.port);
    /* the first holds the slot before the second comes, and the second waits in the queue before
     * the third comes */
    for (int i = 0; i < 200 && busy_slots(s.port) != 1; i++) usleep(50000);
    int queued = http_connect(s.port);
    char req[512];
    int n = snprintf(req, sizeof req,
                     "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n\r\n%s",
                     strlen(long_stream), long_stream);
    bool sent = queued >= 0 && send(queued, req, (size_t)n, MSG_NOSIGNAL) == n;
    int depth = -1;
    for (int i = 0; i < 200 && depth != 1; i++) {
        usleep(50000);
        http_resp m;
        if (http_do(s.port, "GET", "/metrics", NULL, NULL, 0, 10, &m) && m.status == 200) {
            const char *at = strstr(m.body, "\nquill_queue_depth ");
            depth = at ? atoi(at + strlen("\nquill_queue_depth ")) : -1;
        }
        http_resp_free(&m);
    }
    http_resp r;
    bool got = http_post(s.port, "/v1/completions", "{\"prompt\": \"x\", \"max_tokens\": 1}", &r);
    char *retry = got ? http_header(&r, "Retry-After") : NULL;
    bool refused = got && r.status == 503 && retry && strstr(r.body, "queue is full");
    if (!refused) test_fail(__FILE__, __LINE__, "expected 503 + Retry-After, got %d %s", r.status, r.body ? r.body : "");
    free(retry);
    http_resp_free(&r);
    /* SIGTERM: the running stream and the queued request end, the server exits 0 */
    int stop = server_stop(&s);
    char buf[4096];
    ssize_t got_bytes;
    bool ended = true;
    if (running >= 0) {
        while ((got_bytes = recv(running, buf, sizeof buf, 0)) > 0) {}
        ended = got_bytes == 0 || got_bytes < 0;
        close(running);
    }
    if (queued >= 0) close(queued);
    CHECK(running >= 0 && sent, "could not start the streams");
    CHECK(ended);
    CHECK_EQ_INT(stop, 0);
}

/* A follow-up turn evaluates only its new tokens (cached_tokens), with the reply a fresh server
 * gives; a full context ends the reply with "length". */
TEST(server_prefix_reuse_and_full_context) {
    REQUIRE_SHARED(shared);
    char *model = model_path(shared);
    test_server s;
    bool ok = server_start(&s, model, "-np 2 -c 1024 -t 2");
    CHECK(ok, "start");
    const char *turn1 = "{\"messages\": [{\"role\": \"user\", \"content\": \"Tell me about Lily\"}], \"max_tokens\": 20, \"temperature\": 0}";
    http_resp r;
    cJSON *o = NULL;
    char turn2[1024] = "";
    ok = http_post(s.port, "/v1/chat/completions", turn1, &r) && r.status == 200;
    if (ok) {
        o = cJSON_Parse(r.body);
        const char *reply = str_at(o, "choices.0.message.content");
        cJSON *msgs = cJSON_CreateArray(), *m;
        m = cJSON_CreateObject(), cJSON_AddStringToObject(m, "role", "user"), cJSON_AddStringToObject(m, "content", "Tell me about Lily"), cJSON_AddItemToArray(msgs, m);
        m = cJSON_CreateObject(), cJSON_AddStringToObject(m, "role", "assistant"), cJSON_AddStringToObject(m, "content", reply ? reply : ""), cJSON_AddItemToArray(msgs, m);
        m = cJSON_CreateObject(), cJSON_AddStringToObject(m, "role", "user"), cJSON_AddStringToObject(m, "content", "And then?"), cJSON_AddItemToArray(msgs, m);
        char *ms = cJSON_PrintUnformatted(msgs);
        snprintf(turn2, sizeof turn2, "{\"messages\": %s, \"max_tokens\": 20, \"temperature\": 0}", ms);
        free(ms);
        cJSON_Delete(msgs);
        cJSON_Delete(o);
    }
    http_resp_free(&r);
    double cached = -1, prompt_n = -1;
    char *second = NULL;
    if (ok) ok = http_post(s.port, "/v1/chat/completions", turn2, &r) && r.status == 200;
    if (ok) {
        o = cJSON_Parse(r.body);
        cached = num_at(o, "usage.prompt_tokens_details.cached_tokens");
        prompt_n = num_at(o, "timings.prompt_n");
        const char *t = str_at(o, "choices.0.message.content");
        second = t ? strdup(t) : NULL;
        if (!(cached > 10 && prompt_n >= 1 && prompt_n + cached == num_at(o, "usage.prompt_tokens")))
            test_fail(__FILE__, __LINE__, "the follow-up should reuse the first turn's cache: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);
    /* full context: 64 positions per slot */
    int stop1 = server_stop(&s);
    bool ok2 = server_start(&s, model, "-np 1 -c 64 -t 1");
    free(model);
    char *fresh = NULL;
    if (ok2) ok2 = http_post(s.port, "/v1/chat/completions", turn2, &r);
    if (ok2 && r.status == 200) {
        /* turn 2 does not fit in 64 positions */
        test_fail(__FILE__, __LINE__, "expected a too-long prompt to be refused: %s", r.body);
    }
    http_resp_free(&r);
    if (ok2) ok2 = http_post(s.port, "/v1/completions", "{\"prompt\": \"Once upon a time\", \"ignore_eos\": true, \"temperature\": 0}", &r) && r.status == 200;
    if (ok2) {
        o = cJSON_Parse(r.body);
        if (!(str_at(o, "choices.0.finish_reason") && !strcmp(str_at(o, "choices.0.finish_reason"), "length") &&
              num_at(o, "usage.total_tokens") == 65))
            test_fail(__FILE__, __LINE__, "a full context should end with length after 60 tokens: %s", r.body);
        cJSON_Delete(o);
    }
    http_resp_free(&r);
    int stop2 = server_stop(&s);
    /* the follow-up alone on a fresh server: the same reply */
    model = model_path(shared);
    if (ok && server_start(&s, model, "-np 1 -c 1024 -t 1")) {
        if (http_post(s.port, "/v1/chat/completions", turn2, &r) && r.status == 200) {
            o = cJSON_Parse(r.body);
            const char *t = str_at(o, "choices.0.message.content");
            fresh = t ? strdup(t) : NULL;
            cJSON_Delete(o);
        }
        http_resp_free(&r);
        server_stop(&s);
    }
    free(model);
    bool same = second && fresh && !strcmp(second, fresh);
    if (ok && !same) test_fail(__FILE__, __LINE__, "cached \"%s\" vs fresh \"%s\"", second ? second : "", fresh ? fresh : "");
    free(second);
    free(fresh);
    CHECK(ok && ok2);
    CHECK_EQ_INT(stop1, 0);
    CHECK_EQ_INT(stop2, 0);
}
