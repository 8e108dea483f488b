/* A property test of agent replies: random-weight models with the real templates of every
 * tool-call syntax quill knows, sampled at temperature 0.8 over many seeds, through the three APIs
 * (chat completions, Anthropic messages, Responses), whole and streamed. Whatever the sampler draws:
 * - a reply with calls ends the turn (finish_reason "tool_calls", stop_reason "tool_use", a
 *   completed response), each call to an offered tool with arguments that hold to its schema;
 * - a reply cut off by max_tokens has no calls (a call being written is never passed off as done);
 * - under "required" or a named tool, a reply that was not cut off is calls;
 * - no text or reasoning holds call or reasoning markup, whole or partial;
 * - a stream adds up to the whole reply drawn with the same seed.
 * The counts tried per template and API are printed (QUILL_TEST_VERBOSE shows every reply). */
#include "server_util.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *synth_model(const char *shared, const char *vocab, char *path, size_t cap) {
    snprintf(path, cap, "%s/agent-replies-%s.gguf", tmp_dir(), vocab);
    struct stat st;
    if (stat(path, &st) == 0) return path;
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s synth --arch qwen3 --embd 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 --vocab "
             "%s/tokenizer/ggml-vocab-%s.gguf -o %s",
             quill_bin(), shared, vocab, path);
    int rc = run_cmd(cmd, &out, true);
    if (rc) test_fail(__FILE__, __LINE__, "synth failed: %s", out);
    free(out);
    return rc ? NULL : path;
}

/* ---------------------------------------------------------------- a reply, in every API's terms */

typedef struct text {
    char *s;
    size_t n;
} text;

static void put(text *t, const char *s) {
    size_t k = strlen(s);
    t->s = realloc(t->s, t->n + k + 1);
    memcpy(t->s + t->n, s, k + 1);
    t->n += k;
}

static void putf(text *t, const char *fmt, ...) {
    char buf[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    put(t, buf);
}

typedef struct reply {
    text content, reasoning, calls;   /* calls: "name(arguments as compact JSON)" each, '|' between */
    int n_calls;
    const char *end;                  /* "stop", "length" or "tool_calls" in the API's own words mapped */
    char raw_end[32];
    text args_raw[8];                 /* each call's arguments as sent (checked against the schema) */
    char names[8][64];
} reply;

static void reply_free(reply *r) {
    free(r->content.s);
    free(r->reasoning.s);
    free(r->calls.s);
    for (int i = 0; i < 8; i++) free(r->args_raw[i].s);
    memset(r, 0, sizeof *r);
}

static const char *sv(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static void add_call(reply *r, const char *name, const char *args) {
    int i = r->n_calls++;
    if (i < 8) {
        snprintf(r->names[i], sizeof r->names[i], "%s", name ? name : "");
        put(&r->args_raw[i], args ? args : "");
    }
    cJSON *parsed = args ? cJSON_Parse(args) : NULL;
    char *compact = parsed ? cJSON_PrintUnformatted(parsed) : NULL;
    putf(&r->calls, "%s%s(%s)", i ? "|" : "", name ? name : "?", compact ? compact : args ? args : "");
    free(compact);
    cJSON_Delete(parsed);
}

/* The end as chat completions names it (static strings: the reply outlives the JSON it came from). */
static void set_end(reply *r, const char *raw, const char *mapped) {
    static const char *const known[] = {"stop", "length", "tool_calls", NULL};
    snprintf(r->raw_end, sizeof r->raw_end, "%s", raw ? raw : "(none)");
    r->end = NULL;
    for (const char *const *k = known; *k && mapped; k++)
        if (!strcmp(*k, mapped)) r->end = *k;
}

static void chat_whole(const cJSON *o, reply *r) {
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *m = cJSON_GetObjectItem(c, "message"), *call;
    if (sv(m, "content")) put(&r->content, sv(m, "content"));
    if (sv(m, "reasoning_content")) put(&r->reasoning, sv(m, "reasoning_content"));
    cJSON_ArrayForEach(call, cJSON_GetObjectItem(m, "tool_calls")) {
        const cJSON *fn = cJSON_GetObjectItem(call, "function");
        add_call(r, sv(fn, "name"), sv(fn, "arguments"));
    }
    const char *f = sv(c, "finish_reason");
    set_end(r, f, f);
}

/* Each "data: {...}" event of an SSE body (and its "event:" name, when it has one). */
static void each_event(const char *body, void (*fn)(const char *name, const cJSON *data, void *ctx), void *ctx) {
    for (const char *p = strstr(body, "data: {"); p; p = strstr(p + 1, "data: {")) {
        char name[64] = "";
        const char *line = p;
        if (line - body >= 7) {
            const char *prev = line - 1;
            while (prev > body && prev[-1] != '\n') prev--;
            if (!strncmp(prev, "event: ", 7)) snprintf(name, sizeof name, "%.*s", (int)strcspn(prev + 7, "\n"), prev + 7);
        }
        const char *end = strstr(p, "\n\n");
        char *one = strndup(p + 6, end ? (size_t)(end - p - 6) : strlen(p + 6));
        cJSON *o = cJSON_Parse(one);
        free(one);
        if (o) fn(name, o, ctx);
        cJSON_Delete(o);
    }
}

typedef struct stream_calls {
    reply *r;
    char names[8][64];
    text args[8];
    int n;
    cJSON *final_copy;        /* Responses: the last response object */
    text deltas;              /* Responses: the output_text deltas */
    int open_kind;            /* Anthropic: 1 text, 2 thinking, 3 tool_use */
} stream_calls;

static void chat_event(const char *name, const cJSON *o, void *ctx) {
    (void)name;
    stream_calls *sc = ctx;
    const cJSON *c = cJSON_GetArrayItem(cJSON_GetObjectItem(o, "choices"), 0), *d = cJSON_GetObjectItem(c, "delta"), *call;
    if (sv(d, "content")) put(&sc->r->content, sv(d, "content"));
    if (sv(d, "reasoning_content")) put(&sc->r->reasoning, sv(d, "reasoning_content"));
    cJSON_ArrayForEach(call, cJSON_GetObjectItem(d, "tool_calls")) {
        int i = cJSON_GetObjectItem(call, "index")->valueint;
        if (i < 0 || i >= 8) continue;
        if (i >= sc->n) sc->n = i + 1;
        const cJSON *fn = cJSON_GetObjectItem(call, "function");
        if (sv(fn, "name")) snprintf(sc->names[i], sizeof sc->names[i], "%s", sv(fn, "name"));
        if (sv(fn, "arguments")) put(&sc->args[i], sv(fn, "arguments"));
    }
    if (sv(c, "finish_reason")) set_end(sc->r, sv(c, "finish_reason"), sv(c, "finish_reason"));
}

static const char *anthropic_end(const char *stop) {
    if (!stop) return NULL;
    if (!strcmp(stop, "tool_use")) return "tool_calls";
    if (!strcmp(stop, "max_tokens")) return "length";
    if (!strcmp(stop, "end_turn")) return "stop";
    return NULL;
}

static void anthropic_whole(const cJSON *o, reply *r) {
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItem(o, "content")) {
        const char *type = sv(b, "type");
        if (!type) continue;
        if (!strcmp(type, "text")) put(&r->content, sv(b, "text") ? sv(b, "text") : "");
        else if (!strcmp(type, "thinking")) put(&r->reasoning, sv(b, "thinking") ? sv(b, "thinking") : "");
        else if (!strcmp(type, "tool_use")) {
            char *input = cJSON_PrintUnformatted(cJSON_GetObjectItem(b, "input"));
            add_call(r, sv(b, "name"), input);
            free(input);
        }
    }
    set_end(r, sv(o, "stop_reason"), anthropic_end(sv(o, "stop_reason")));
}

static void anthropic_event(const char *name, const cJSON *o, void *ctx) {
    stream_calls *sc = ctx;
    if (!strcmp(name, "content_block_start")) {
        const cJSON *b = cJSON_GetObjectItem(o, "content_block");
        const char *type = sv(b, "type");
        sc->open_kind = !type ? 0 : !strcmp(type, "text") ? 1 : !strcmp(type, "thinking") ? 2 : !strcmp(type, "tool_use") ? 3 : 0;
        if (sc->open_kind == 3 && sc->n < 8) snprintf(sc->names[sc->n++], sizeof sc->names[0], "%s", sv(b, "name") ? sv(b, "name") : "");
    } else if (!strcmp(name, "content_block_delta")) {
        const cJSON *d = cJSON_GetObjectItem(o, "delta");
        if (sv(d, "text")) put(&sc->r->content, sv(d, "text"));
        if (sv(d, "thinking")) put(&sc->r->reasoning, sv(d, "thinking"));
        if (sv(d, "partial_json") && sc->n > 0) put(&sc->args[sc->n - 1], sv(d, "partial_json"));
    } else if (!strcmp(name, "message_delta")) {
        const char *stop = sv(cJSON_GetObjectItem(o, "delta"), "stop_reason");
        set_end(sc->r, stop, anthropic_end(stop));
    }
}

static void responses_whole(const cJSON *o, reply *r) {
    const cJSON *it;
    bool calls = false;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(o, "output")) {
        const char *type = sv(it, "type");
        const cJSON *part;
        if (!type) continue;
        if (!strcmp(type, "message")) {
            cJSON_ArrayForEach(part, cJSON_GetObjectItem(it, "content")) if (sv(part, "text")) put(&r->content, sv(part, "text"));
        } else if (!strcmp(type, "reasoning")) {
            cJSON_ArrayForEach(part, cJSON_GetObjectItem(it, "content")) if (sv(part, "text")) put(&r->reasoning, sv(part, "text"));
        } else if (!strcmp(type, "function_call")) {
            add_call(r, sv(it, "name"), sv(it, "arguments"));
            calls = true;
        }
    }
    const char *status = sv(o, "status");
    const char *end = !status ? NULL : !strcmp(status, "incomplete") ? "length" : !strcmp(status, "completed") ? (calls ? "tool_calls" : "stop") : NULL;
    set_end(r, status, end);
}

static void responses_event(const char *name, const cJSON *o, void *ctx) {
    stream_calls *sc = ctx;
    if (!strcmp(name, "response.output_text.delta") && sv(o, "delta")) put(&sc->deltas, sv(o, "delta"));
    if (!strcmp(name, "response.completed") || !strcmp(name, "response.incomplete")) {
        cJSON_Delete(sc->final_copy);
        sc->final_copy = cJSON_Duplicate(cJSON_GetObjectItem(o, "response"), true);
    }
}

typedef enum { API_CHAT, API_ANTHROPIC, API_RESPONSES, N_API } api;
static const char *const api_names[N_API] = {"chat", "messages", "responses"};

/* Sends one request and reads its reply; false (with *why) when the exchange itself failed. */
static bool fetch(int port, api a, const char *body, bool stream, reply *r, char *why, size_t cap) {
    static const char *const paths[N_API] = {"/v1/chat/completions", "/v1/messages", "/v1/responses"};
    http_resp h;
    memset(r, 0, sizeof *r);
    if (!http_post(port, paths[a], body, &h)) {
        snprintf(why, cap, "no answer");
        return false;
    }
    if (h.status != 200) {
        snprintf(why, cap, "status %d: %.300s", h.status, h.body);
        http_resp_free(&h);
        return false;
    }
    put(&r->content, "");
    put(&r->reasoning, "");
    put(&r->calls, "");
    bool ok = true;
    if (!stream) {
        cJSON *o = cJSON_Parse(h.body);
        if (a == API_CHAT) chat_whole(o, r);
        else if (a == API_ANTHROPIC) anthropic_whole(o, r);
        else responses_whole(o, r);
        cJSON_Delete(o);
    } else {
        stream_calls sc = {.r = r};
        each_event(h.body, a == API_CHAT ? chat_event : a == API_ANTHROPIC ? anthropic_event : responses_event, &sc);
        if (a == API_RESPONSES) {
            if (!sc.final_copy) {
                snprintf(why, cap, "the stream has no response.completed or response.incomplete: %.300s", h.body);
                ok = false;
            } else {
                text streamed = sc.deltas;
                responses_whole(sc.final_copy, r);
                if (strcmp(streamed.s ? streamed.s : "", r->content.s)) {
                    snprintf(why, cap, "output_text deltas [%.200s] differ from the final text [%.200s]", streamed.s ? streamed.s : "",
                             r->content.s);
                    ok = false;
                }
                cJSON_Delete(sc.final_copy);
            }
            free(sc.deltas.s);
        } else {
            for (int i = 0; i < sc.n; i++) {
                add_call(r, sc.names[i], sc.args[i].s ? sc.args[i].s : "");
                free(sc.args[i].s);
            }
        }
    }
    http_resp_free(&h);
    return ok;
}

/* ---------------------------------------------------------------- the rules */

/* Markup of any syntax that text must never hold (special tokens as <|name|> are checked apart). */
static const char *const forbidden[] = {
    "<tool_call>", "</tool_call>", "<think>", "</think>", "[TOOL_CALLS]", "[ARGS]", "<|python_tag|>", "{\"name\": ",
    "<function=", "</function>", "<\xef\xbd\x9c" "tool", "tool\xe2\x96\x81" "call", NULL,
};

static const char *markup_in(const char *s) {
    for (const char *const *f = forbidden; *f; f++)
        if (strstr(s, *f)) return *f;
    for (const char *p = strstr(s, "<|"); p; p = strstr(p + 1, "<|")) {
        const char *q = p + 2;
        while ((*q >= 'a' && *q <= 'z') || *q == '_') q++;
        if (q > p + 2 && q[0] == '|' && q[1] == '>') return "<|special|>";
    }
    return NULL;
}

/* get_time's arguments: {"unit": "c" | "f", "days": 1..7}; get_weather's: {"city": "Paris" | "Rome"}. */
static const char *args_fault(const char *name, const char *args) {
    cJSON *o = cJSON_Parse(args);
    const char *fault = NULL;
    if (!cJSON_IsObject(o)) fault = "not a JSON object";
    else if (!strcmp(name, "get_time")) {
        const char *unit = sv(o, "unit");
        const cJSON *days = cJSON_GetObjectItem(o, "days");
        if (!unit || (strcmp(unit, "c") && strcmp(unit, "f"))) fault = "unit outside its enum";
        else if (!cJSON_IsNumber(days) || days->valuedouble != (double)(int)days->valuedouble || days->valueint < 1 || days->valueint > 7)
            fault = "days not an integer in 1..7";
        else if (cJSON_GetArraySize(o) != 2) fault = "a property the schema does not have";
    } else if (!strcmp(name, "get_weather")) {
        const char *city = sv(o, "city");
        if (!city || (strcmp(city, "Paris") && strcmp(city, "Rome"))) fault = "city outside its enum";
    } else {
        fault = "a tool that was not offered";
    }
    cJSON_Delete(o);
    return fault;
}

typedef enum { CHOICE_AUTO, CHOICE_REQUIRED, CHOICE_NAMED, N_CHOICES } choice;
static const char *const choice_names[N_CHOICES] = {"auto", "required", "named"};

/* The rules above for one reply: NULL, or what broke. */
static const char *broken_rule(const reply *r, choice ch, char *buf, size_t cap) {
    if (!r->end) return "no finish reason the API knows";
    const char *m;
    if ((m = markup_in(r->content.s))) return snprintf(buf, cap, "the text holds %s", m), buf;
    if ((m = markup_in(r->reasoning.s))) return snprintf(buf, cap, "the reasoning holds %s", m), buf;
    if (!strcmp(r->end, "length") && r->n_calls) return "cut off by max_tokens, yet with calls";
    if (r->n_calls && strcmp(r->end, "tool_calls")) return "calls, but the turn did not end with them";
    if (!strcmp(r->end, "tool_calls") && !r->n_calls) return "ended for calls that are not there";
    if (ch != CHOICE_AUTO && strcmp(r->end, "length") && !r->n_calls) return "a forced call is missing";
    for (int i = 0; i < r->n_calls && i < 8; i++) {
        const char *fault = args_fault(r->names[i], r->args_raw[i].s ? r->args_raw[i].s : "");
        if (fault) return snprintf(buf, cap, "call %d %s(%s): %s", i, r->names[i], r->args_raw[i].s, fault), buf;
        if (ch == CHOICE_NAMED && strcmp(r->names[i], "get_time")) return "the named tool was not the one called";
    }
    return NULL;
}

/* ---------------------------------------------------------------- the bodies */

static const char tool_time[] = "\"get_time\", \"description\": \"The time\"";
static const char params_time[] =
    "{\"type\": \"object\", \"properties\": {\"unit\": {\"type\": \"string\", \"enum\": [\"c\", \"f\"]}, \"days\": "
    "{\"type\": \"integer\", \"minimum\": 1, \"maximum\": 7}}, \"required\": [\"unit\", \"days\"], \"additionalProperties\": false}";
static const char params_weather[] =
    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\", \"enum\": [\"Paris\", \"Rome\"]}}, \"required\": [\"city\"]}";

static void body_for(api a, choice ch, bool parallel, bool stream, int seed, int max_tokens, char *out, size_t cap) {
    char tools[2048], tc[256];
    const char *common = "\"temperature\": 0.8";
    if (a == API_CHAT) {
        snprintf(tools, sizeof tools,
                 "[{\"type\": \"function\", \"function\": {\"name\": %s, \"parameters\": %s}}, {\"type\": \"function\", "
                 "\"function\": {\"name\": \"get_weather\", \"description\": \"The weather\", \"parameters\": %s}}]",
                 tool_time, params_time, params_weather);
        snprintf(tc, sizeof tc, "%s",
                 ch == CHOICE_AUTO ? "\"auto\"" : ch == CHOICE_REQUIRED ? "\"required\"" : "{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}");
        snprintf(out, cap,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"What time is it in Paris?\"}], \"tools\": %s, \"tool_choice\": %s, "
                 "\"parallel_tool_calls\": %s, \"max_tokens\": %d, \"seed\": %d, \"stream\": %s, %s}",
                 tools, tc, parallel ? "true" : "false", max_tokens, seed, stream ? "true" : "false", common);
    } else if (a == API_ANTHROPIC) {
        snprintf(tools, sizeof tools,
                 "[{\"name\": %s, \"input_schema\": %s}, {\"name\": \"get_weather\", \"description\": \"The weather\", \"input_schema\": %s}]",
                 tool_time, params_time, params_weather);
        snprintf(tc, sizeof tc, ch == CHOICE_AUTO ? "{\"type\": \"auto\"%s}" : ch == CHOICE_REQUIRED ? "{\"type\": \"any\"%s}"
                                                                                        : "{\"type\": \"tool\", \"name\": \"get_time\"%s}",
                 parallel ? "" : ", \"disable_parallel_tool_use\": true");
        snprintf(out, cap,
                 "{\"model\": \"m\", \"messages\": [{\"role\": \"user\", \"content\": \"What time is it in Paris?\"}], \"tools\": %s, "
                 "\"tool_choice\": %s, \"max_tokens\": %d, \"seed\": %d, \"stream\": %s, %s}",
                 tools, tc, max_tokens, seed, stream ? "true" : "false", common);
    } else {
        snprintf(tools, sizeof tools,
                 "[{\"type\": \"function\", \"name\": %s, \"parameters\": %s}, {\"type\": \"function\", \"name\": \"get_weather\", "
                 "\"description\": \"The weather\", \"parameters\": %s}]",
                 tool_time, params_time, params_weather);
        snprintf(tc, sizeof tc, "%s",
                 ch == CHOICE_AUTO ? "\"auto\"" : ch == CHOICE_REQUIRED ? "\"required\"" : "{\"type\": \"function\", \"name\": \"get_time\"}");
        snprintf(out, cap,
                 "{\"model\": \"m\", \"input\": \"What time is it in Paris?\", \"tools\": %s, \"tool_choice\": %s, "
                 "\"parallel_tool_calls\": %s, \"max_output_tokens\": %d, \"seed\": %d, \"stream\": %s, \"store\": false, %s}",
                 tools, tc, parallel ? "true" : "false", max_tokens, seed, stream ? "true" : "false", common);
    }
}

/* ---------------------------------------------------------------- the test */

/* DeepSeek V3's template never shows the tools, so the server asks for calls in the generic JSON
 * form; with a line that lists them before it, the model's own call syntax (its special tokens)
 * is driven too. */
static const struct {
    const char *label, *vocab, *template_rel;
    bool list_tools;
} templates[] = {
    {"Qwen 3", "qwen3", "chat/tools/Qwen-Qwen3-0.6B.jinja", false},
    {"Qwen 2.5", "qwen2", "chat/Qwen-Qwen2.5-7B-Instruct.jinja", false},
    {"Llama 3.1", "llama-bpe", "chat/meta-llama-Llama-3.1-8B-Instruct.jinja", false},
    {"Mistral Nemo", "llama-spm", "chat/mistralai-Mistral-Nemo-Instruct-2407.jinja", false},
    {"gpt-oss", "gpt-oss", "chat/tools/openai-gpt-oss-120b.jinja", false},
    {"DeepSeek V3", "deepseek-v3", "chat/tools/deepseek-ai-DeepSeek-V3.jinja", false},
    {"DeepSeek V3+", "deepseek-v3", "chat/tools/deepseek-ai-DeepSeek-V3.jinja", true},
};

/* The template's path, or a copy that first lists the tools (malloc'd). */
static char *template_path(const char *shared, size_t t) {
    char *path = path_join(shared, templates[t].template_rel);
    if (!templates[t].list_tools) return path;
    char *src = read_file(path, NULL);
    free(path);
    if (!src) return NULL;
    char out[600];
    snprintf(out, sizeof out, "%s/agent-replies-%zu.jinja", tmp_dir(), t);
    FILE *f = fopen(out, "w");
    if (f) {
        fputs("{% if tools %}Tools: {{ tools | tojson }}\n{% endif %}", f);
        fputs(src, f);
        fclose(f);
    }
    free(src);
    return f ? strdup(out) : NULL;
}

/* under the sanitizers every tool_choice once, and budgets up to 64 tokens rather than 112 (test.h):
 * what they look for is in the parsers and streams, which a shorter reply runs through as well */
enum { SEEDS = TEST_SANITIZED ? N_CHOICES : 6, BUDGET_SPREAD = TEST_SANITIZED ? 48 : 96 };

TEST(server_agent_replies_property) {
    REQUIRE_SHARED(shared);
    const bool verbose = getenv("QUILL_TEST_VERBOSE") != NULL;
    int total = 0;
    /* under the sanitizers every third template (Qwen 3, Mistral Nemo, DeepSeek V3 listing its
     * tools): each template's reply parser also meets them in fuzz_tool_calls, and the server's
     * paths are the same for all */
    for (size_t t = 0; t < sizeof templates / sizeof templates[0]; t += TEST_SANITIZED ? 3 : 1) {
        char model[600], args[1024];
        if (!synth_model(shared, templates[t].vocab, model, sizeof model)) continue;
        char *tmpl = template_path(shared, t);
        if (!tmpl) {
            test_fail(__FILE__, __LINE__, "cannot read or copy %s", templates[t].template_rel);
            continue;
        }
        snprintf(args, sizeof args, "-np 1 -c 2048 -t 1 --chat-template %s", tmpl);
        free(tmpl);
        test_server s;
        if (!server_start(&s, model, args)) continue;
        /* from here on no CHECK (it returns): the server is stopped below whatever fails */
        int tried[N_API] = {0}, with_calls[N_API] = {0}, cut[N_API] = {0};
        for (int seed = 0; seed < SEEDS; seed++) {
            /* every choice, parallel or not, and budgets from too small for a call to enough for a few */
            const choice ch = (choice)(seed % N_CHOICES);
            const bool parallel = seed % 2 == 0;
            const int max_tokens = 16 + (seed * 37 + (int)t * 11) % BUDGET_SPREAD;
            for (int a = 0; a < N_API; a++) {
                reply r[2];
                bool got[2];
                for (int stream = 0; stream < 2; stream++) {
                    char body[8192], why[512];
                    body_for((api)a, ch, parallel, stream, seed, max_tokens, body, sizeof body);
                    got[stream] = fetch(s.port, (api)a, body, stream, &r[stream], why, sizeof why);
                    if (!got[stream]) {
                        test_fail(__FILE__, __LINE__, "%s, %s, %s, seed %d, %s: %s", templates[t].label, api_names[a],
                                  choice_names[ch], seed, stream ? "streamed" : "whole", why);
                        continue;
                    }
                    tried[a]++;
                    with_calls[a] += r[stream].n_calls > 0;
                    cut[a] += r[stream].end && !strcmp(r[stream].end, "length");
                    char buf[512];
                    const char *broken = broken_rule(&r[stream], ch, buf, sizeof buf);
                    if (verbose || broken)
                        fprintf(stderr, "  %s %s %s%s seed %d max %d: %s [%s] reasoning [%s] calls [%s]\n", templates[t].label,
                                api_names[a], choice_names[ch], parallel ? " parallel" : "", seed, max_tokens, r[stream].raw_end,
                                r[stream].content.s, r[stream].reasoning.s, r[stream].calls.s);
                    /* test_fail, not CHECK: the server must be stopped whatever breaks */
                    if (broken)
                        test_fail(__FILE__, __LINE__, "%s, %s, tool_choice %s, seed %d, %s: %s", templates[t].label,
                                  api_names[a], choice_names[ch], seed, stream ? "streamed" : "whole", broken);
                }
                if (got[0] && got[1] &&
                    (strcmp(r[0].content.s, r[1].content.s) || strcmp(r[0].reasoning.s, r[1].reasoning.s) ||
                     strcmp(r[0].calls.s, r[1].calls.s) || !r[0].end || !r[1].end || strcmp(r[0].end, r[1].end)))
                    test_fail(__FILE__, __LINE__,
                              "%s, %s, seed %d: streamed [%s] (%zu bytes) [%s] [%s] %s differs from whole [%s] (%zu bytes) [%s] "
                              "[%s] %s",
                              templates[t].label, api_names[a], seed, r[1].content.s, r[1].content.n, r[1].reasoning.s,
                              r[1].calls.s, r[1].raw_end, r[0].content.s, r[0].content.n, r[0].reasoning.s, r[0].calls.s,
                              r[0].raw_end);
                for (int k = 0; k < 2; k++)
                    if (got[k]) reply_free(&r[k]);
            }
        }
        for (int a = 0; a < N_API; a++) {
            fprintf(stderr, "  %-12s %-9s %2d replies (%d with calls, %d cut off by max_tokens)\n", templates[t].label,
                    api_names[a], tried[a], with_calls[a], cut[a]);
            total += tried[a];
        }
        CHECK_EQ_INT(server_stop(&s), 0);
    }
    fprintf(stderr, "  %d replies in all\n", total);
}
