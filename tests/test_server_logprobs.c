/* Log-probabilities beyond chat: /v1/completions with echo (the reply's text starts with the prompt,
 * and with logprobs the prompt's tokens carry the log-probability the model gives each after the
 * ones before it, what evaluation harnesses read with max_tokens 0, equal to the library's own
 * logits), and the Responses API's output_text logprobs, whole and streamed. */
#include "server_util.h"
#include "test.h"

#include "quill.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *text_of(const cJSON *o) {
    const cJSON *t = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "text");
    return cJSON_IsString(t) ? t->valuestring : NULL;
}

static cJSON *post_json(int port, const char *body, int want_status) {
    http_resp r;
    cJSON *o = NULL;
    if (http_post(port, "/v1/completions", body, &r) && r.status == want_status) o = cJSON_Parse(r.body);
    else test_fail(__FILE__, __LINE__, "%s: status %d, %s", body, r.status, r.body ? r.body : "");
    http_resp_free(&r);
    return o;
}

/* log softmax(logits)[token] in double, as the server computes it */
static double logprob_of(const float *logits, int n, int token) {
    double mx = -INFINITY, sum = 0;
    for (int i = 0; i < n; i++) mx = logits[i] > mx ? logits[i] : mx;
    for (int i = 0; i < n; i++) sum += exp((double)logits[i] - mx);
    return (double)logits[token] - (mx + log(sum));
}

TEST(server_completions_echo) {
    REQUIRE_SHARED(shared);
    char *model_path = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model_path, "-np 2 -c 512 -t 1 -b 8");
    CHECK(started);
    if (!started) {
        free(model_path);
        return;
    }
    const char *prompt = "Once upon a time there was a little girl who liked to play in the garden";
    char body[512];
    /* the prompt alone, scored */
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 0, \"echo\": true, \"logprobs\": 1}", prompt);
    cJSON *o = post_json(s.port, body, 200);
    CHECK(o && text_of(o) && !strcmp(text_of(o), prompt), "echoed text: %s", o ? text_of(o) : "");
    const cJSON *lp = cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), "logprobs");
    const cJSON *lps = cJSON_GetObjectItem(lp, "token_logprobs"), *offs = cJSON_GetObjectItem(lp, "text_offset");
    const cJSON *toks = cJSON_GetObjectItem(lp, "tokens");
    int n_prompt = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "prompt_tokens")->valueint;
    CHECK(cJSON_GetArraySize(lps) == n_prompt, "%d logprobs for %d prompt tokens", cJSON_GetArraySize(lps), n_prompt);
    CHECK(cJSON_IsNull(cJSON_GetArrayItem(lps, 0)), "the first token has a log-probability");
    /* each against the library's logits of the same prompt */
    quill_model *m = NULL;
    quill_context *c = NULL;
    quill_error err;
    quill_context_params cp = {.n_ctx = 512, .n_threads = 1};
    CHECK(quill_model_load(model_path, &m, &err) == QUILL_OK && quill_context_new(m, &cp, &c, &err) == QUILL_OK, "%s",
          err.message);
    free(model_path);
    int32_t *ids = NULL;
    size_t n = 0;
    if (c && quill_tokenize(quill_model_tokenizer(m), prompt, strlen(prompt), true, true, &ids, &n, &err) == QUILL_OK &&
        (int)n == n_prompt) {
        int nv = (int)quill_model_hparams(m)->n_vocab;
        float *logits = malloc(n * (size_t)nv * sizeof *logits);
        CHECK(quill_eval(c, ids, (int)n, logits, true, &err) == QUILL_OK, "%s", err.message);
        for (size_t i = 1; i < n; i++) {
            double want = logprob_of(logits + (i - 1) * (size_t)nv, nv, ids[i]);
            double got = cJSON_GetArrayItem(lps, (int)i)->valuedouble;
            CHECK(fabs(got - (double)(float)want) < 1e-6, "token %zu: %.8f, library %.8f", i, got, want);
            /* the offsets point at each token's text in the echoed prompt */
            const char *piece = cJSON_GetArrayItem(toks, (int)i)->valuestring;
            int at = cJSON_GetArrayItem(offs, (int)i)->valueint;
            const char *word = piece[0] == ' ' && at == 0 ? piece + 1 : piece;
            CHECK(at >= 0 && (size_t)at <= strlen(prompt) && !strncmp(prompt + at, word, strlen(word)),
                  "token %zu '%s' at offset %d", i, piece, at);
        }
        free(logits);
    } else {
        test_fail(__FILE__, __LINE__, "tokenizing the prompt: %zu tokens, the server counted %d", n, n_prompt);
    }
    free(ids);
    quill_context_free(c);
    quill_model_free(m);
    cJSON_Delete(o);
    /* with a reply: the prompt, then the same reply as without echo; streamed the same */
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 6, \"temperature\": 0}", prompt);
    cJSON *plain = post_json(s.port, body, 200);
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 6, \"temperature\": 0, \"echo\": true}", prompt);
    cJSON *echoed = post_json(s.port, body, 200);
    char want[512];
    snprintf(want, sizeof want, "%s%s", prompt, plain ? text_of(plain) : "");
    CHECK(echoed && text_of(echoed) && !strcmp(text_of(echoed), want), "echo: [%s], want [%s]",
          echoed ? text_of(echoed) : "", want);
    snprintf(body, sizeof body,
             "{\"prompt\": \"%s\", \"max_tokens\": 6, \"temperature\": 0, \"echo\": true, \"logprobs\": 2, \"stream\": true}",
             prompt);
    http_resp r;
    CHECK(http_post(s.port, "/v1/completions", body, &r) && r.status == 200, "stream: %d", r.status);
    char *finish = NULL;
    bool done = false;
    char *streamed = sse_text(r.body, &finish, &done);
    CHECK(streamed && !strcmp(streamed, want) && done, "streamed [%s], want [%s]", streamed ? streamed : "", want);
    free(streamed);
    free(finish);
    http_resp_free(&r);
    cJSON_Delete(plain);
    cJSON_Delete(echoed);
    /* max_tokens 0 needs echo */
    snprintf(body, sizeof body, "{\"prompt\": \"%s\", \"max_tokens\": 0}", prompt);
    cJSON_Delete(post_json(s.port, body, 400));
    CHECK_EQ_INT(server_stop(&s), 0);
}

static int count_logprobs_in_events(const char *body, const char *event) {
    int total = 0;
    char key[96];
    snprintf(key, sizeof key, "event: %s\ndata: ", event);
    for (const char *p = strstr(body, key); p; p = strstr(p + 1, key)) {
        const char *data = p + strlen(key), *end = strstr(data, "\n\n");
        char *one = strndup(data, end ? (size_t)(end - data) : strlen(data));
        cJSON *e = cJSON_Parse(one);
        free(one);
        total += cJSON_GetArraySize(cJSON_GetObjectItem(e, "logprobs"));
        cJSON_Delete(e);
    }
    return total;
}

TEST(server_responses_logprobs) {
    REQUIRE_SHARED(shared);
    char *model_path = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model_path, "-np 1 -c 512 -t 1");
    free(model_path);
    CHECK(started);
    if (!started) return;
    const char *body = "{\"input\": \"Tell me a story\", \"max_output_tokens\": 6, \"temperature\": 0, "
                       "\"include\": [\"message.output_text.logprobs\", \"reasoning.encrypted_content\"], \"top_logprobs\": 2}";
    http_resp r;
    CHECK(http_post(s.port, "/v1/responses", body, &r) && r.status == 200, "responses: %d %s", r.status, r.body);
    cJSON *o = cJSON_Parse(r.body);
    http_resp_free(&r);
    const cJSON *part = cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(o, "output"), 0), "content"), 0);
    const cJSON *lps = cJSON_GetObjectItem(part, "logprobs");
    int out_tokens = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "usage"), "output_tokens")->valueint;
    CHECK(out_tokens == 6 && cJSON_GetArraySize(lps) == out_tokens, "%d logprobs for %d tokens", cJSON_GetArraySize(lps),
          out_tokens);
    const cJSON *first = cJSON_GetArrayItem(lps, 0);
    double lp = cJSON_GetObjectItem(first, "logprob")->valuedouble;
    const cJSON *top = cJSON_GetObjectItem(first, "top_logprobs");
    /* greedy: the token drawn is the most likely one */
    CHECK(lp <= 0 && cJSON_GetArraySize(top) == 2 && cJSON_GetObjectItem(cJSON_GetArrayItem(top, 0), "logprob")->valuedouble == lp,
          "first token logprob %f", lp);
    cJSON_Delete(o);
    /* streamed: the deltas carry every token once, the done event all of them */
    const char *streamed = "{\"input\": \"Tell me a story\", \"max_output_tokens\": 6, \"temperature\": 0, "
                           "\"include\": [\"message.output_text.logprobs\"], \"stream\": true}";
    CHECK(http_post(s.port, "/v1/responses", streamed, &r) && r.status == 200, "stream: %d", r.status);
    CHECK_EQ_INT(count_logprobs_in_events(r.body, "response.output_text.delta"), 6);
    CHECK_EQ_INT(count_logprobs_in_events(r.body, "response.output_text.done"), 6);
    http_resp_free(&r);
    /* without include: none; a malformed include: a 400 naming it */
    CHECK(http_post(s.port, "/v1/responses", "{\"input\": \"Hi\", \"max_output_tokens\": 2}", &r) && r.status == 200, "plain");
    CHECK(strstr(r.body, "\"logprobs\":[]") != NULL, "logprobs without include: %s", r.body);
    http_resp_free(&r);
    CHECK(http_post(s.port, "/v1/responses", "{\"input\": \"Hi\", \"include\": \"message.output_text.logprobs\"}", &r) &&
              r.status == 400, "include as a string: %d", r.status);
    CHECK_STR_CONTAINS(r.body, "'include' must be an array");
    http_resp_free(&r);
    CHECK_EQ_INT(server_stop(&s), 0);
}
