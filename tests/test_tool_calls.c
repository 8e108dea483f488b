/* Tool calls and reasoning in generated text (src/chat/tool_calls.c): the syntax each real
 * template implies, the parse of the replies those templates themselves write for a tool call (the
 * text between the prompt and the end of the assistant turn), streams (every prefix of a reply
 * parses to a prefix of the final answer, reasoning and arguments), and the grammars. */
#include "test.h"

#include "quill_chat.h"
#include "chat/tool_calls.h"

#include <stdlib.h>
#include <string.h>

static const char tools_json[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"description\":\"Weather\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}},\"required\":[\"city\"]}}}]";

/* What the template writes for an assistant turn that calls get_weather({"city": "Paris"}): the
 * conversation with that turn, less the prompt without it, less the end-of-turn mark the model
 * ends with (end-of-generation tokens are not part of the reply). `string_args`: the template
 * concatenates arguments as text (DeepSeek); `null_content`: it writes calls only beside null. */
static char *template_reply(const char *shared, const char *rel, bool string_args, bool null_content,
                            const char *end_mark) {
    char *path = path_join(shared, rel);
    char *tmpl = read_file(path, NULL);
    free(path);
    if (!tmpl) return NULL;
    char with_call[1024];
    snprintf(with_call, sizeof with_call,
             "[{\"role\":\"user\",\"content\":\"Weather in Paris?\"},{\"role\":\"assistant\",\"content\":%s,"
             "\"tool_calls\":[{\"id\":\"abcDEF123\",\"type\":\"function\",\"function\":{\"name\":\"get_weather\","
             "\"arguments\":%s}}]}]",
             null_content ? "null" : "\"\"",
             string_args ? "\"{\\\"city\\\": \\\"Paris\\\"}\"" : "{\"city\": \"Paris\"}");
    quill_chat_inputs in = {.messages_json = "[{\"role\":\"user\",\"content\":\"Weather in Paris?\"}]",
                            .tools_json = tools_json, .bos_token = "<s>", .eos_token = "</s>",
                            .add_generation_prompt = true, .has_now = true, .now = 1768469400};
    char *prompt = NULL, *whole = NULL;
    quill_error err;
    quill_status a = quill_chat_render_inputs(tmpl, &in, &prompt, &err);
    in.messages_json = with_call;
    in.add_generation_prompt = false;
    quill_status b = a ? a : quill_chat_render_inputs(tmpl, &in, &whole, &err);
    free(tmpl);
    char *reply = NULL;
    if (!a && !b && !strncmp(prompt, whole, strlen(prompt))) {
        const char *r = whole + strlen(prompt);
        size_t n = strlen(r);
        while (n && (r[n - 1] == '\n')) n--;
        if (end_mark && n >= strlen(end_mark) && !memcmp(r + n - strlen(end_mark), end_mark, strlen(end_mark)))
            n -= strlen(end_mark);
        reply = strndup(r, n);
    }
    free(prompt);
    free(whole);
    return reply;
}

static bool is_prefix(const char *a, const char *b) { return !strncmp(a, b, strlen(a)); }

/* The whole reply parses to `want_content` / `want_reasoning` and calls get_weather({"city": "Paris"})
 * `n_calls` times; and every prefix, parsed as a stream, to prefixes of those. */
static int check_reply(const chat_syntax *syn, const chat_parse_options *base, const char *reply, const char *want_content,
                       const char *want_reasoning, size_t n_calls, const char *what) {
    chat_parse_options o = *base;
    o.partial = false;
    chat_parse full;
    quill_error err;
    size_t n = strlen(reply);
    if (chat_parse_output(syn, &o, reply, n, &full, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "%s: %s", what, err.message);
        return 1;
    }
    int bad = 0;
    if (strcmp(full.content, want_content) || strcmp(full.reasoning, want_reasoning) || full.n_calls != n_calls) {
        test_fail(__FILE__, __LINE__, "%s: content [%s] reasoning [%s] %zu calls, from [%s]", what, full.content,
                  full.reasoning, full.n_calls, reply);
        bad = 1;
    }
    for (size_t c = 0; !bad && c < full.n_calls; c++)
        if (strcmp(full.calls[c].name, "get_weather") || strcmp(full.calls[c].arguments, "{\"city\": \"Paris\"}") ||
            !full.calls[c].complete) {
            test_fail(__FILE__, __LINE__, "%s: call %zu is %s(%s)", what, c, full.calls[c].name, full.calls[c].arguments);
            bad = 1;
        }
    o.partial = true;
    for (size_t k = 0; !bad && k <= n; k++) {
        chat_parse p;
        if (chat_parse_output(syn, &o, reply, k, &p, &err) != QUILL_OK) {
            test_fail(__FILE__, __LINE__, "%s: %s", what, err.message);
            bad = 1;
            break;
        }
        if (!is_prefix(p.content, full.content) || !is_prefix(p.reasoning, full.reasoning) || p.n_calls > full.n_calls) {
            test_fail(__FILE__, __LINE__, "%s: after %zu bytes content [%s] reasoning [%s] %zu calls, not prefixes", what, k,
                      p.content, p.reasoning, p.n_calls);
            bad = 1;
        }
        for (size_t c = 0; !bad && c < p.n_calls; c++)
            if (strcmp(p.calls[c].name, full.calls[c].name) || !is_prefix(p.calls[c].arguments, full.calls[c].arguments)) {
                test_fail(__FILE__, __LINE__, "%s: after %zu bytes call %zu is %s(%s)", what, k, c, p.calls[c].name,
                          p.calls[c].arguments);
                bad = 1;
            }
        chat_parse_free(&p);
    }
    chat_parse_free(&full);
    return bad;
}

TEST(tool_calls_syntax_detected_from_real_templates) {
    REQUIRE_SHARED(shared);
    static const struct { const char *rel; tool_syntax want; bool think; } cases[] = {
        {"chat/Qwen-Qwen2.5-7B-Instruct.jinja", TOOL_SYNTAX_HERMES, false},
        {"chat/tools/Qwen-Qwen3-0.6B.jinja", TOOL_SYNTAX_HERMES, true},
        {"chat/meta-llama-Llama-3.1-8B-Instruct.jinja", TOOL_SYNTAX_LLAMA3, false},
        {"chat/meta-llama-Llama-3.2-3B-Instruct.jinja", TOOL_SYNTAX_LLAMA3, false},
        {"chat/mistralai-Mistral-Nemo-Instruct-2407.jinja", TOOL_SYNTAX_MISTRAL, false},
        {"chat/tools/openai-gpt-oss-120b.jinja", TOOL_SYNTAX_GPT_OSS, false},
        {"chat/tools/deepseek-ai-DeepSeek-V3.jinja", TOOL_SYNTAX_DEEPSEEK_V3, false},
        {"chat/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja", TOOL_SYNTAX_DEEPSEEK_V3, true},
        {"chat/tools/google-gemma-3-it.jinja", TOOL_SYNTAX_GENERIC, false},
        {"chat/TinyLlama-TinyLlama-1.1B-Chat-v1.0.jinja", TOOL_SYNTAX_GENERIC, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *path = path_join(shared, cases[i].rel);
        char *src = read_file(path, NULL);
        free(path);
        CHECK(src, "cannot read %s", cases[i].rel);
        chat_syntax s = chat_syntax_detect(src);
        free(src);
        CHECK(s.tools == cases[i].want, "%s: detected %s, expected %s", cases[i].rel, tool_syntax_name(s.tools),
              tool_syntax_name(cases[i].want));
        CHECK(s.think_tags == cases[i].think, "%s: think tags %d", cases[i].rel, s.think_tags);
    }
    chat_syntax coder = chat_syntax_detect("{{ '<tool_call>\\n<function=' }}{{ '<parameter=' }}");
    CHECK(coder.tools == TOOL_SYNTAX_QWEN3_CODER, "Qwen3-Coder's marks: %s", tool_syntax_name(coder.tools));
}

TEST(tool_calls_parse_what_real_templates_write) {
    REQUIRE_SHARED(shared);
    static const struct {
        const char *rel, *end_mark;
        bool string_args, null_content;
    } cases[] = {
        {"chat/Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>", false, false},
        {"chat/tools/Qwen-Qwen3-0.6B.jinja", "<|im_end|>", false, false},
        {"chat/meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>", false, false},
        {"chat/meta-llama-Llama-3.2-3B-Instruct.jinja", "<|eot_id|>", false, false},
        {"chat/mistralai-Mistral-Nemo-Instruct-2407.jinja", "</s>", false, false},
        {"chat/tools/openai-gpt-oss-120b.jinja", "<|call|>", false, false},
        {"chat/tools/deepseek-ai-DeepSeek-V3.jinja", NULL, true, true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *reply = template_reply(shared, cases[i].rel, cases[i].string_args, cases[i].null_content, cases[i].end_mark);
        CHECK(reply, "%s: no reply rendered", cases[i].rel);
        char *path = path_join(shared, cases[i].rel);
        char *src = read_file(path, NULL);
        free(path);
        chat_syntax syn = chat_syntax_detect(src);
        free(src);
        chat_parse_options o = {.extract_reasoning = true, .tools = true};
        CHECK(check_reply(&syn, &o, reply, "", "", 1, cases[i].rel) == 0, "%s", cases[i].rel);
        /* with some text before it, the text is the content (not for Llama 3, whose call is the whole
         * reply, gpt-oss, whose text is in channels, or templates that open the reply with <think>) */
        if (syn.tools != TOOL_SYNTAX_LLAMA3 && syn.tools != TOOL_SYNTAX_GPT_OSS && !syn.think_tags) {
            size_t n = strlen(reply) + 32;
            char *with_text = malloc(n);
            snprintf(with_text, n, "Let me check.\n%s", reply);
            CHECK(check_reply(&syn, &o, with_text, "Let me check.", "", 1, cases[i].rel) == 0, "%s with text", cases[i].rel);
            free(with_text);
        }
        free(reply);
    }
}

TEST(tool_calls_reasoning) {
    chat_syntax qwen3 = {TOOL_SYNTAX_HERMES, true};
    chat_parse_options o = {.extract_reasoning = true, .tools = true};
    CHECK(!check_reply(&qwen3, &o,
                       "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
                       "{\"city\": \"Paris\"}}\n</tool_call>",
                       "", "The user wants weather.", 1, "qwen3 thinking then a call"),
          "qwen3");
    CHECK(!check_reply(&qwen3, &o, "<think>\nhmm\n</think>\n\nParis is sunny.", "Paris is sunny.", "hmm", 0, "qwen3 answer"),
          "qwen3 answer");
    /* a prompt that opened <think> itself (DeepSeek R1 distills) */
    chat_syntax r1 = {TOOL_SYNTAX_DEEPSEEK_V3, true};
    chat_parse_options open = {.extract_reasoning = true, .thinking_open = true};
    CHECK(!check_reply(&r1, &open, "Two and two.\n</think>\n\n4", "4", "Two and two.", 0, "r1"), "r1");
    CHECK(!check_reply(&r1, &open, "still thinking", "", "still thinking", 0, "r1 unfinished"), "r1 unfinished");
    /* reasoning_format none: everything stays in the content */
    chat_parse_options keep = {.tools = true};
    CHECK(!check_reply(&qwen3, &keep, "<think>\nx\n</think>\n\ny", "<think>\nx\n</think>\n\ny", "", 0, "kept"), "kept");
    /* gpt-oss: analysis is reasoning, final the answer, a commentary to=functions.* a call */
    chat_syntax oss = {TOOL_SYNTAX_GPT_OSS, false};
    CHECK(!check_reply(&oss, &o,
                       "<|channel|>analysis<|message|>User asks capital.<|end|><|start|>assistant<|channel|>final<|message|>Paris.",
                       "Paris.", "User asks capital.", 0, "gpt-oss final"),
          "gpt-oss final");
    CHECK(!check_reply(&oss, &o,
                       "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary "
                       "to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>",
                       "", "Need weather.", 1, "gpt-oss call in the channel"),
          "gpt-oss call");
    /* a random model that never opens a channel: its text is the answer */
    CHECK(!check_reply(&oss, &o, "babble babble", "babble babble", "", 0, "gpt-oss without channels"), "gpt-oss raw");
}

TEST(tool_calls_other_forms) {
    chat_parse_options o = {.extract_reasoning = true, .tools = true};
    chat_syntax coder = {TOOL_SYNTAX_QWEN3_CODER, false};
    chat_parse p;
    quill_error err;
    const char *xml = "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
                      "</parameter>\n</function>\n</tool_call>";
    CHECK(chat_parse_output(&coder, &o, xml, strlen(xml), &p, &err) == QUILL_OK, "%s", err.message);
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].arguments, "{\"city\": \"Paris\", \"days\": 3}"), "qwen3-coder: %zu %s",
          p.n_calls, p.n_calls ? p.calls[0].arguments : "");
    chat_parse_free(&p);
    chat_syntax generic = {TOOL_SYNTAX_GENERIC, false};
    CHECK(!check_reply(&generic, &o, "{\"tool_calls\": [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]}", "",
                       "", 1, "generic call"),
          "generic call");
    CHECK(!check_reply(&generic, &o, "{\"response\": \"It is \\\"sunny\\\" \\u00e9\"}", "It is \"sunny\" \xc3\xa9", "", 0,
                       "generic response"),
          "generic response");
    CHECK(!check_reply(&generic, &o, "plain text", "plain text", "", 0, "generic text"), "generic text");
    chat_syntax llama = {TOOL_SYNTAX_LLAMA3, false};
    const char *py = "<|python_tag|>print(\"hi\")\n";
    CHECK(chat_parse_output(&llama, &o, py, strlen(py), &p, &err) == QUILL_OK, "%s", err.message);
    CHECK(p.n_calls == 1 && !strcmp(p.calls[0].name, "python") && !strcmp(p.calls[0].arguments, "{\"code\": \"print(\\\"hi\\\")\"}"),
          "python tag: %s", p.n_calls ? p.calls[0].arguments : "(none)");
    chat_parse_free(&p);
    chat_syntax mistral = {TOOL_SYNTAX_MISTRAL, false};
    CHECK(!check_reply(&mistral, &o,
                       "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"a1\"}, "
                       "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}]",
                       "", "", 2, "mistral, two calls"),
          "mistral two");
    CHECK(!check_reply(&mistral, &o, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}", "", "", 1, "mistral, [ARGS] form"),
          "mistral args form");
}

/* Broken calls are neither calls nor text (dropped, and said so); hostile JSON neither crashes
 * nor leaks. */
TEST(tool_calls_malformed_are_dropped) {
    chat_parse_options o = {.extract_reasoning = true, .tools = true};
    chat_syntax hermes = {TOOL_SYNTAX_HERMES, false};
    static const char *const bad[] = {
        "<tool_call>\n{\"name\": \"x\", \"arguments\": [1]}\n</tool_call>",
        "<tool_call>\n{\"name\": 3, \"arguments\": {}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": tru}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": \"\\q\"}}\n</tool_call>",
        "<tool_call>\n{\"name\": \"x\", \"arguments\": {\"a\": 1}",
        "<tool_call>\n[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        chat_parse p;
        quill_error err;
        CHECK(chat_parse_output(&hermes, &o, bad[i], strlen(bad[i]), &p, &err) == QUILL_OK, "%s", err.message);
        CHECK(p.n_calls == 0 && !p.content[0] && p.dropped, "case %zu: %zu calls, content [%s]", i, p.n_calls, p.content);
        chat_parse_free(&p);
    }
    char deep[4096];
    memset(deep, '[', sizeof deep - 1);
    deep[sizeof deep - 1] = 0;
    bool more;
    CHECK(json_value_span(deep, strlen(deep), &more) == 0 && !more, "nesting beyond the bound must be refused");
    CHECK(json_value_span("{\"a\": [1, 2.5e3, true, null, \"\\u00e9\"]} ", 39, &more) == 39, "a whole value");
}

/* A stream cut right after a comma inside a call object: the object is unfinished, not a call
 * without a name (the fuzzer's find: `{"": "x",` was read as a whole call and failed the parse). */
TEST(tool_calls_object_cut_after_a_comma) {
    static const char *const replies[] = {"{\"\":\"x\",", "{\"a\": 1, ", "<tool_call>\n{\"b\": [1], ",
                                          "{\"name\": \"get_weather\","};
    static const tool_syntax syntaxes[] = {TOOL_SYNTAX_GENERIC, TOOL_SYNTAX_HERMES, TOOL_SYNTAX_LLAMA3,
                                           TOOL_SYNTAX_MISTRAL, TOOL_SYNTAX_DEEPSEEK_V3, TOOL_SYNTAX_QWEN3_CODER};
    for (size_t s = 0; s < sizeof syntaxes / sizeof syntaxes[0]; s++)
        for (size_t i = 0; i < sizeof replies / sizeof replies[0]; i++)
            for (int cut = 0; cut < 2; cut++) {
                chat_syntax syn = {syntaxes[s], false};
                chat_parse_options o = {.tools = true, .partial = !cut, .cut = cut};
                chat_parse p;
                quill_error err;
                CHECK(chat_parse_output(&syn, &o, replies[i], strlen(replies[i]), &p, &err) == QUILL_OK,
                      "syntax %d, [%s]: %s", (int)syntaxes[s], replies[i], err.message);
                for (size_t c = 0; c < p.n_calls; c++)
                    CHECK(!p.calls[c].complete, "syntax %d, [%s]: a cut-off object read as a whole call",
                          (int)syntaxes[s], replies[i]);
                chat_parse_free(&p);
            }
}

TEST(tool_calls_grammar_text) {
    const char *names[] = {"get_weather", "say \"hi\""};
    chat_syntax syn = {TOOL_SYNTAX_HERMES, true};
    char *g = NULL;
    quill_error err;
    CHECK(tool_call_grammar(&syn, NULL, names, NULL, 2, true, true, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_STR_CONTAINS(g, "root ::= \"</think>\\n\\n\" call ( \"\\n\" call )*");
    CHECK_STR_CONTAINS(g, "fn-1 ::= \"\\\"say \\\\\\\"hi\\\\\\\"\\\"\" \", \\\"arguments\\\": \" args\n");
    CHECK_STR_CONTAINS(g, "call ::= \"<tool_call>\\n{\\\"name\\\": \" fn \"}\\n</tool_call>\"");
    free(g);
    chat_syntax oss = {TOOL_SYNTAX_GPT_OSS, false};
    CHECK(tool_call_grammar(&oss, NULL, names, NULL, 1, true, false, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_STR_CONTAINS(g, "root ::= call\n");
    CHECK_STR_CONTAINS(g, "fn ::= fn-0\nfn-0 ::= \"get_weather\"");
    free(g);
    CHECK_EQ_INT(tool_call_grammar(&oss, NULL, names, NULL, 0, false, false, &g, &err), QUILL_E_ARG);
}

/* Every syntax's grammar is valid GBNF for the grammar engine, and accepts what the real templates
 * write for a call (where the template's form is the one the grammar asks for). */
TEST(tool_calls_grammars_parse_and_accept_template_replies) {
    REQUIRE_SHARED(shared);
    const char *names[] = {"get_weather", "other"};
    /* get_weather's arguments by its schema (as the grammar engine converts it), other's any object */
    char *schema = NULL;
    quill_error serr;
    const char *city = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}";
    CHECK(quill_json_schema_to_grammar(city, strlen(city), &schema, &serr) == QUILL_OK, "%s", serr.message);
    const char *args[] = {schema, NULL};
    static const struct { tool_syntax syntax; const char *template_rel, *end_mark; } cases[] = {
        {TOOL_SYNTAX_HERMES, "chat/Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>"},
        {TOOL_SYNTAX_LLAMA3, "chat/meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>"},
        {TOOL_SYNTAX_MISTRAL, "chat/mistralai-Mistral-Nemo-Instruct-2407.jinja", "</s>"},
        {TOOL_SYNTAX_GENERIC, NULL, NULL},
        {TOOL_SYNTAX_GPT_OSS, NULL, NULL},
        {TOOL_SYNTAX_DEEPSEEK_V3, NULL, NULL},
        {TOOL_SYNTAX_QWEN3_CODER, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        chat_syntax syn = {cases[i].syntax, false};
        char *text = NULL;
        quill_error err;
        CHECK(tool_call_grammar(&syn, NULL, names, args, 2, true, false, &text, &err) == QUILL_OK, "%s", err.message);
        quill_grammar *g = NULL;
        CHECK(quill_grammar_parse(NULL, text, strlen(text), NULL, &g, &err) == QUILL_OK, "%s: %s\n%s",
              tool_syntax_name(cases[i].syntax), err.message, text);
        if (cases[i].template_rel) {
            char *reply = template_reply(shared, cases[i].template_rel, false, false, cases[i].end_mark);
            CHECK(reply && quill_grammar_accepts(g, reply, strlen(reply)), "%s: the grammar refuses [%s]",
                  tool_syntax_name(cases[i].syntax), reply ? reply : "(none)");
            free(reply);
        }
        const char *generic = "{\"tool_calls\": [{\"name\": \"other\", \"arguments\": {\"a\": [1, 2.5, \"x\"]}}]}";
        if (cases[i].syntax == TOOL_SYNTAX_GENERIC)
            CHECK(quill_grammar_accepts(g, generic, strlen(generic)), "generic: refuses %s", generic);
        /* the schema holds: get_weather without its city is refused */
        const char *no_city = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>";
        if (cases[i].syntax == TOOL_SYNTAX_HERMES)
            CHECK(!quill_grammar_accepts(g, no_city, strlen(no_city)), "hermes: accepts a call without its required city");
        quill_grammar_free(g);
        free(text);
    }
    free(schema);
}

/* The syntax of calls and reasoning never reaches the text: text before a call stays text, a call
 * cut off is dropped (whole and while streaming), stray marks are removed, and an end that could
 * begin a mark is held back while generating and dropped when the reply was cut off. */
TEST(tool_calls_no_markup_in_text) {
    static const chat_parse_options o = {.extract_reasoning = true, .tools = true},
                                    cut = {.extract_reasoning = true, .tools = true, .cut = true};
    static const struct {
        tool_syntax syntax;
        bool think;
        const chat_parse_options *opt;
        const char *reply, *content, *reasoning;
        size_t n_calls;
        bool dropped;
    } cases[] = {
        /* the reply: a whole call, then a second one cut off by max_tokens */
        {TOOL_SYNTAX_HERMES, true, &cut,
         "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"unit\": \"c\", \"days\": 5}}\n</tool_call>\n<tool_call>\n{\"name\": "
         "\"f\", \"arguments\": {\n  \t   \t \t",
         "", "", 1, true},
        {TOOL_SYNTAX_HERMES, false, &o, "Let me see.\n<tool_call>\n{\"name\": \"get_time", "Let me see.", "", 0, true},
        {TOOL_SYNTAX_HERMES, false, &o, "a </tool_call> b <tool_response>", "a  b ", "", 0, false},
        {TOOL_SYNTAX_HERMES, true, &o, "<think>x</think>y <think>z", "y z", "x", 0, false},
        {TOOL_SYNTAX_HERMES, false, &cut, "so <tool_c", "so ", "", 0, false},
        /* a mark removed joins its neighbours into another, removed too */
        {TOOL_SYNTAX_HERMES, true, &o, "<tool<think>_call>x", "x", "", 0, false},
        /* text before a call is whole even when the reply was cut off later */
        {TOOL_SYNTAX_LLAMA3, false, &cut, "a<\n<|python_tag|>print(1)", "a<", "", 1, false},
        {TOOL_SYNTAX_LLAMA3, false, &o, "Sure: {\"name\": \"get_time\", \"parameters\": {\"unit\"", "Sure:", "", 0, true},
        {TOOL_SYNTAX_LLAMA3, false, &o, "a<|eom_id|>b<|reserved_special_token_3|>", "ab", "", 0, false},
        {TOOL_SYNTAX_MISTRAL, false, &o, "hi [TOOL_CALLS][{\"name\": \"f\", \"arguments\": {", "hi", "", 0, true},
        {TOOL_SYNTAX_GPT_OSS, false, &o,
         "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>commentary to=functions.f <|constrain|>json"
         "<|message|>{\"a\": ",
         "", "think", 0, true},
        {TOOL_SYNTAX_GPT_OSS, false, &o, "words<|message|>more", "wordsmore", "", 0, false},
        {TOOL_SYNTAX_DEEPSEEK_V3, false, &o,
         "x <\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c><\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81"
         "begin\xef\xbd\x9c>function<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>f\n```json\n{\"a\"",
         "x", "", 0, true},
        {TOOL_SYNTAX_DEEPSEEK_V3, false, &o, "a<\xef\xbd\x9c" "end\xe2\x96\x81" "of\xe2\x96\x81" "sentence\xef\xbd\x9c>b", "ab", "", 0, false},
        {TOOL_SYNTAX_GENERIC, false, &o, "{\"tool_calls\": [{\"name\": \"get_time\", \"arguments\": {\"unit\":", "", "", 0, true},
        {TOOL_SYNTAX_GENERIC, false, &o, "ok {\"tool_calls\": [{\"name\": \"f\", \"arguments\": {}}]}", "ok", "", 1, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        chat_syntax syn = {cases[i].syntax, cases[i].think};
        chat_parse p;
        quill_error err;
        const char *r = cases[i].reply;
        CHECK(chat_parse_output(&syn, cases[i].opt, r, strlen(r), &p, &err) == QUILL_OK, "%s", err.message);
        CHECK(!strcmp(p.content, cases[i].content) && !strcmp(p.reasoning, cases[i].reasoning) &&
                  p.n_calls == cases[i].n_calls && p.dropped == cases[i].dropped,
              "case %zu (%s): content [%s] reasoning [%s] %zu calls, dropped %d", i, tool_syntax_name(cases[i].syntax),
              p.content, p.reasoning, p.n_calls, p.dropped);
        chat_parse_free(&p);
        /* streamed: every prefix's text is a prefix of the whole reply's */
        chat_parse_options partial = *cases[i].opt;
        partial.partial = true;
        partial.cut = false;
        for (size_t k = 0; k <= strlen(r); k++) {
            CHECK(chat_parse_output(&syn, &partial, r, k, &p, &err) == QUILL_OK, "%s", err.message);
            bool ok = !strncmp(p.content, cases[i].content, strlen(p.content)) &&
                      !strncmp(p.reasoning, cases[i].reasoning, strlen(p.reasoning));
            CHECK(ok, "case %zu after %zu bytes: content [%s] reasoning [%s]", i, k, p.content, p.reasoning);
            chat_parse_free(&p);
        }
    }
}

/* A call's arguments take at most one space between tokens, whatever the schema converter's
 * `space` allows elsewhere: a sampled model cannot spend its budget on layout inside a call. */
TEST(tool_calls_grammar_compact_arguments) {
    const char *names[] = {"get_weather"};
    char *schema = NULL, *text = NULL;
    quill_error err;
    const char *city = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}";
    CHECK(quill_json_schema_to_grammar(city, strlen(city), &schema, &err) == QUILL_OK, "%s", err.message);
    const char *args[] = {schema};
    chat_syntax syn = {TOOL_SYNTAX_HERMES, false};
    CHECK(tool_call_grammar(&syn, NULL, names, args, 1, false, false, &text, &err) == QUILL_OK, "%s", err.message);
    CHECK_STR_CONTAINS(text, "a0-space ::= \" \"?\n");
    quill_grammar *g = NULL;
    CHECK(quill_grammar_parse(NULL, text, strlen(text), NULL, &g, &err) == QUILL_OK, "%s", err.message);
    const char *compact = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    const char *laid_out = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\n  \"city\": \"Paris\"\n}}\n</tool_call>";
    CHECK(quill_grammar_accepts(g, compact, strlen(compact)), "refuses %s", compact);
    CHECK(!quill_grammar_accepts(g, laid_out, strlen(laid_out)), "accepts %s", laid_out);
    quill_grammar_free(g);
    free(text);
    free(schema);
}
