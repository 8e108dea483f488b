/* quill serve with speculative decoding (--lookup, -md): every reply — text, finish and the
 * log-probabilities of every token — is the one a server without it gives the same request
 * alone, with many requests at once sharing the batches; the draft counters show in /metrics and
 * in the replies' timings. */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int port;
    const char *path;
    char body[768];
    char *reply;            /* what must not change: the choices, logprobs included */
    int drafted;
    bool ok;
} spec_client;

static void *spec_client_run(void *arg) {
    spec_client *c = arg;
    http_resp r;
    c->ok = http_do(c->port, "POST", c->path, NULL, c->body, strlen(c->body), 120, &r) && r.status == 200;
    cJSON *o = c->ok ? cJSON_Parse(r.body) : NULL;
    cJSON *choices = cJSON_GetObjectItem(o, "choices");
    c->ok = choices != NULL;
    if (c->ok) c->reply = cJSON_PrintUnformatted(choices);
    const cJSON *d = cJSON_GetObjectItem(cJSON_GetObjectItem(o, "timings"), "draft_n");
    c->drafted = cJSON_IsNumber(d) ? d->valueint : 0;
    cJSON_Delete(o);
    http_resp_free(&r);
    return NULL;
}

enum { N_CLIENTS = 8 };

static void make_clients(spec_client *c, int port) {
    static const char *const prompts[] = {
        "Once upon a time, there was a little girl named Lily. She loved to play. Once upon a time, there was a",
        "Tom had a red ball. Tom liked the red ball. One day Tom",
        "The little dog ran to the park. The little dog",
        "Lily and Tom went to the park. Lily and Tom"};
    for (int i = 0; i < N_CLIENTS; i++) {
        memset(&c[i], 0, sizeof c[i]);
        c[i].port = port;
        const char *sampling = i % 2 ? "\"temperature\": 0" : "\"temperature\": 0.8, \"seed\": 77";
        const char *extra = i % 4 == 1 ? ", \"stop\": [\"park\"]" : i % 4 == 2 ? ", \"logprobs\": 3" : "";
        c[i].path = "/v1/completions";
        snprintf(c[i].body, sizeof c[i].body, "{\"prompt\": \"%s\", \"max_tokens\": %d, %s%s}", prompts[i % 4], 40 + 5 * i,
                 sampling, extra);
    }
}

static void run_clients(spec_client *c, bool together) {
    pthread_t th[N_CLIENTS];
    for (int i = 0; i < N_CLIENTS; i++) {
        if (together) pthread_create(&th[i], NULL, spec_client_run, &c[i]);
        else spec_client_run(&c[i]);
    }
    if (together)
        for (int i = 0; i < N_CLIENTS; i++) pthread_join(th[i], NULL);
}

static unsigned long long metric_value(int port, const char *name) {
    http_resp r;
    unsigned long long v = 0;
    if (http_do(port, "GET", "/metrics", NULL, NULL, 0, 10, &r) && r.status == 200) {
        char key[96];
        snprintf(key, sizeof key, "\n%s ", name);
        const char *at = strstr(r.body, key);
        if (at) v = strtoull(at + strlen(key), NULL, 10);
    }
    http_resp_free(&r);
    return v;
}

/* Plain, alone, against speculative, together; `draft_args` turns speculation on. */
static void compare(const char *model, const char *draft_args) {
    spec_client alone[N_CLIENTS], together[N_CLIENTS];
    test_server s;
    if (!server_start(&s, model, "-np 1 -c 512 -t 2")) return;
    make_clients(alone, s.port);
    run_clients(alone, false);
    if (server_stop(&s) != 0) test_fail(__FILE__, __LINE__, "the plain server did not stop cleanly");
    char args[1024];
    snprintf(args, sizeof args, "-np 4 -c 2048 -t 2 -b 64 %s", draft_args);
    if (server_start(&s, model, args)) {
        make_clients(together, s.port);
        run_clients(together, true);
        const unsigned long long drafted = metric_value(s.port, "quill_draft_tokens_total"),
                                 accepted = metric_value(s.port, "quill_draft_tokens_accepted_total");
        int drafted_in_replies = 0;
        for (int i = 0; i < N_CLIENTS; i++) drafted_in_replies += together[i].drafted;
        for (int i = 0; i < N_CLIENTS; i++)
            if (!(alone[i].ok && together[i].ok && !strcmp(alone[i].reply, together[i].reply))) {
                test_fail(__FILE__, __LINE__, "%s, client %d (%s): alone %s, with speculation %s", draft_args, i,
                          together[i].body, alone[i].reply ? alone[i].reply : "(failed)",
                          together[i].reply ? together[i].reply : "(failed)");
                break;
            }
        if (drafted == 0 || accepted == 0 || accepted > drafted || drafted_in_replies == 0)
            test_fail(__FILE__, __LINE__, "%s: %llu drafted, %llu accepted (metrics), %d drafted (replies' timings)",
                      draft_args, drafted, accepted, drafted_in_replies);
        if (server_stop(&s) != 0) test_fail(__FILE__, __LINE__, "%s: the server did not stop cleanly", draft_args);
    }
    for (int i = 0; i < N_CLIENTS; i++) {
        cJSON_free(alone[i].reply);
        cJSON_free(together[i].reply);
    }
}

TEST(server_speculative_lookup_replies_unchanged) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    compare(model, "--lookup");
    free(model);
}

TEST(server_speculative_draft_model_replies_unchanged) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-k-q8_0.gguf");
    char *draft = path_join(shared, "models/synth-k-q4_0.gguf");
    char args[1024];
    snprintf(args, sizeof args, "-md %s --draft-max 6", draft);
    compare(model, args);
    free(model);
    free(draft);
}

/* The options are checked before anything loads; a draft with another vocabulary stops the start. */
TEST(server_speculative_options_refused) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-k-q8_0.gguf");
    char *v32k = path_join(shared, "models/synth-32k-q8_0.gguf");
    const struct {
        const char *args, *want;
    } bad[] = {
        {"--draft-max 4", "add -md DRAFT.gguf or --lookup"},
        {"--lookup --draft-max 0", "not a whole number in 1..256"},
        {"--lookup --draft-max 3 --draft-min 4", "--draft-min 4 is more than --draft-max 3"},
        {"--lookup -md x.gguf", "give one of -md/--model-draft and --lookup"},
        {"-md V32K", "share the target's tokenizer"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[1024], cmd[2048], *out = NULL;
        snprintf(args, sizeof args, "%s", bad[i].args);
        if (!strcmp(args, "-md V32K")) snprintf(args, sizeof args, "-md %s", v32k);
        snprintf(cmd, sizeof cmd, "timeout 60 %s serve -m %s --port 0 %s", quill_bin(), model, args);
        int rc = run_cmd(cmd, &out, true);
        if (rc != 1 || !out || !strstr(out, bad[i].want))
            test_fail(__FILE__, __LINE__, "serve %s: rc %d, \"%s\" (want \"%s\")", bad[i].args, rc, out ? out : "",
                      bad[i].want);
        free(out);
    }
    free(model);
    free(v32k);
}
