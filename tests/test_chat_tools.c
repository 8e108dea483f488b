/* Tool-call and reasoning templates (gpt-oss harmony, Qwen 3, DeepSeek V3, Gemma 3): the renders
 * of shared/chat/tools/cases.json, made by Jinja2 with tool calls, tool results, reasoning and
 * strftime_now in the conversation, must come out of quill's engine byte for byte; and the
 * templates the new vocabularies carry must be those. */
#define _GNU_SOURCE
#include "test.h"

#include "quill_chat.h"

#include <cjson/cJSON.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "2026-01-15T09:30:00" as Unix seconds (the instant is naive: UTC here, as the renders used it). */
static bool parse_instant(const char *iso, int64_t *out) {
    struct tm tm = {0};
    const char *end = strptime(iso, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!end || *end) return false;
    *out = (int64_t)timegm(&tm);
    return true;
}

TEST(chat_tools_reference_cases_render_exactly) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "chat/tools/cases.json");
    char *json = read_file(path, NULL);
    free(path);
    CHECK(json, "cannot read chat/tools/cases.json");
    cJSON *root = cJSON_Parse(json);
    free(json);
    CHECK(cJSON_IsArray(root), "chat/tools/cases.json is not a JSON array");
    int total = 0, failed = 0, errors = 0, with_tools = 0, with_time = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, root) {
        total++;
        const char *tname = cJSON_GetStringValue(cJSON_GetObjectItem(c, "template"));
        const char *conv = cJSON_GetStringValue(cJSON_GetObjectItem(c, "conversation"));
        char rel[256];
        snprintf(rel, sizeof rel, "chat/tools/%s", tname ? tname : "?");
        char *tpath = path_join(shared, rel);
        char *tmpl = read_file(tpath, NULL);
        free(tpath);
        char *messages = cJSON_PrintUnformatted(cJSON_GetObjectItem(c, "messages"));
        const cJSON *tools = cJSON_GetObjectItem(c, "tools");
        char *tools_json = tools ? cJSON_PrintUnformatted(tools) : NULL;
        with_tools += tools != NULL;
        quill_chat_inputs in = {
            .messages_json = messages,
            .tools_json = tools_json,
            .bos_token = cJSON_GetStringValue(cJSON_GetObjectItem(c, "bos_token")),
            .eos_token = cJSON_GetStringValue(cJSON_GetObjectItem(c, "eos_token")),
            .add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
        };
        const char *instant = cJSON_GetStringValue(cJSON_GetObjectItem(c, "strftime_now"));
        if (instant) {
            with_time++;
            in.has_now = parse_instant(instant, &in.now);
            CHECK(in.has_now, "cannot read the instant %s", instant);
        }
        const char *expected = cJSON_GetStringValue(cJSON_GetObjectItem(c, "expected"));
        const char *error = cJSON_GetStringValue(cJSON_GetObjectItem(c, "error"));
        char *out = NULL;
        quill_error err = {0};
        quill_status st = tmpl ? quill_chat_render_inputs(tmpl, &in, &out, &err) : QUILL_E_IO;
        if (error) {
            errors++;
            if (st != QUILL_E_TEMPLATE || !strstr(err.message, error)) {
                failed++;
                test_fail(__FILE__, __LINE__, "%s / %s / agp=%d: expected the error \"%s\", got %s", tname, conv,
                          in.add_generation_prompt, error, st == QUILL_OK ? out : err.message);
            }
        } else if (st != QUILL_OK || !expected || strcmp(out, expected) != 0) {
            failed++;
            test_fail(__FILE__, __LINE__, "%s / %s / agp=%d:\n      got      %s\n      expected %s", tname, conv,
                      in.add_generation_prompt, st == QUILL_OK ? out : err.message, expected ? expected : "(nothing)");
        }
        free(out);
        free(messages);
        free(tools_json);
        free(tmpl);
    }
    cJSON_Delete(root);
    CHECK(total == 20, "chat/tools/cases.json holds %d cases, expected 20", total);
    CHECK(errors == 2, "%d cases expect an error, expected 2 (Gemma 3 refusing a tool turn)", errors);
    CHECK(with_tools == 8 && with_time == 6, "%d cases with tools, %d with a time: expected 8 and 6", with_tools, with_time);
    CHECK(failed == 0, "%d of %d tool-call cases differ", failed, total);
}

/* strftime_now exists only when a time is given, and formats that time. */
TEST(chat_tools_strftime_now_defined_only_with_a_time) {
    const char *tmpl = "{% if strftime_now is defined %}{{ strftime_now('%Y-%m-%d %H:%M %A') }}{% else %}none{% endif %}";
    quill_chat_inputs in = {.messages_json = "[]"};
    char *out = NULL;
    quill_error err;
    CHECK(quill_chat_render_inputs(tmpl, &in, &out, &err) == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(out, "none"), "got %s", out);
    free(out);
    in.has_now = true;
    in.now = 1768469400; /* 2026-01-15T09:30:00Z */
    CHECK(quill_chat_render_inputs(tmpl, &in, &out, &err) == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(out, "2026-01-15 09:30 Thursday"), "got %s", out);
    free(out);
    CHECK(quill_chat_render_inputs("{{ strftime_now(3) }}", &in, &out, &err) == QUILL_E_TEMPLATE, "a number format must fail");
    CHECK_STR_CONTAINS(err.message, "strftime_now");
}

/* Extra variables (the reference's chat_template_kwargs) reach the template, but never replace
 * the render's own. */
TEST(chat_tools_extra_variables) {
    const char *tmpl = "{{ enable_thinking }}|{{ reasoning_effort }}|{{ messages | length }}|{{ add_generation_prompt }}";
    quill_chat_inputs in = {.messages_json = "[{\"role\":\"user\",\"content\":\"x\"}]",
                            .extra_json = "{\"enable_thinking\": false, \"reasoning_effort\": \"low\", \"messages\": [], "
                                          "\"add_generation_prompt\": 7}"};
    char *out = NULL;
    quill_error err;
    CHECK(quill_chat_render_inputs(tmpl, &in, &out, &err) == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(out, "False|low|1|False"), "got %s", out);
    free(out);
    in.extra_json = "[1]";
    CHECK_EQ_INT(quill_chat_render_inputs(tmpl, &in, &out, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "object");
    in.extra_json = "{\"a\": ";
    CHECK_EQ_INT(quill_chat_render_inputs(tmpl, &in, &out, &err), QUILL_E_ARG);
    CHECK(out == NULL, "out set on failure");
}

/* The vocabularies of the new families carry their model's template; each renders a tool-call
 * conversation with its tools. Content beside tool_calls: "" for Qwen 3, whose template tests `in
 * message.content` (Jinja2 refuses that on None too), None for DeepSeek V3's file, which writes the
 * calls only when the content is none. */
TEST(chat_tools_vocab_templates_render) {
    REQUIRE_SHARED(shared);
    static const struct { const char *vocab, *must_contain; } cases[] = {
        {"tokenizer/ggml-vocab-qwen3.gguf", "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>"},
        {"tokenizer/ggml-vocab-gpt-oss.gguf", "to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>"},
        {"tokenizer/ggml-vocab-deepseek-v3.gguf", "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Paris\"}\n```<｜tool▁call▁end｜>"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *path = path_join(shared, cases[i].vocab);
        quill_gguf *g = NULL;
        quill_error err;
        CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s: %s", cases[i].vocab, err.message);
        free(path);
        const char *src;
        size_t len;
        CHECK(quill_gguf_get_str(g, "tokenizer.chat_template", &src, &len, &err) == QUILL_OK, "%s: %s", cases[i].vocab,
              err.message);
        char *tmpl = strndup(src, len);
        bool deepseek = strstr(cases[i].vocab, "deepseek") != NULL;
        const char *args = deepseek ? "\"{\\\"city\\\": \\\"Paris\\\"}\"" : "{\"city\": \"Paris\"}";
        char messages[1024];
        snprintf(messages, sizeof messages,
                 "[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},"
                 "{\"role\":\"assistant\",\"content\":%s,\"tool_calls\":[{\"id\":\"call_1\",\"type\":\"function\","
                 "\"function\":{\"name\":\"get_weather\",\"arguments\":%s}}]},"
                 "{\"role\":\"tool\",\"tool_call_id\":\"call_1\",\"name\":\"get_weather\",\"content\":\"sunny\"}]",
                 deepseek ? "null" : "\"\"", args);
        quill_chat_inputs in = {.messages_json = messages,
                                .tools_json = "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
                                              "\"description\":\"Weather\",\"parameters\":{\"type\":\"object\","
                                              "\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]",
                                .add_generation_prompt = true, .has_now = true, .now = 1768469400};
        char *out = NULL;
        CHECK(quill_chat_render_inputs(tmpl, &in, &out, &err) == QUILL_OK, "%s: %s", cases[i].vocab, err.message);
        CHECK(strstr(out, cases[i].must_contain) != NULL, "%s rendered:\n%s", cases[i].vocab, out);
        free(out);
        free(tmpl);
        quill_gguf_close(g);
    }
}
