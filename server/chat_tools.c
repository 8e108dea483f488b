/* Chat requests with tools and reasoning: the conversation as the model's template wants it
 * (assistant tool calls, tool results, reasoning), the tools and tool_choice, and the reply read
 * back into content, reasoning_content and tool_calls — whole, or as the deltas of a stream.
 *
 * What a template accepts is probed once at start (chat_caps_probe), as the reference probes its
 * templates: whether it writes calls beside content "" or only beside null (DeepSeek V3's file),
 * and whether it takes arguments as an object (Qwen, gpt-oss: it prints them with tojson) or as the
 * JSON text OpenAI sends (DeepSeek concatenates them). */
#include "server.h"

#include "chat/tool_calls.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- the template's capabilities */

static const char probe_tools[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"quill_probe_fn\",\"description\":\"probe\",\"parameters\":"
    "{\"type\":\"object\",\"properties\":{\"quill_probe_arg\":{\"type\":\"number\"}}}}}]";

/* Renders a user turn and an assistant turn calling quill_probe_fn; malloc'd text or NULL. */
static char *probe_render(const char *tmpl, const char *content, const char *arguments) {
    char messages[512];
    snprintf(messages, sizeof messages,
             "[{\"role\":\"user\",\"content\":\"hi\"},{\"role\":\"assistant\",\"content\":%s,\"tool_calls\":[{\"id\":"
             "\"abcDEF123\",\"type\":\"function\",\"function\":{\"name\":\"quill_probe_fn\",\"arguments\":%s}}]},"
             "{\"role\":\"tool\",\"tool_call_id\":\"abcDEF123\",\"name\":\"quill_probe_fn\",\"content\":\"1\"}]",
             content, arguments);
    quill_chat_inputs in = {.messages_json = messages, .tools_json = probe_tools, .add_generation_prompt = true};
    /* the variables of a real render (gpt-oss's template fails without strftime_now) */
    quill_chat_inputs_common(NULL, &in);
    char *out = NULL;
    quill_error err;
    if (quill_chat_render_inputs(tmpl, &in, &out, &err) != QUILL_OK) return NULL;
    return out;
}

void chat_caps_probe(server *s) {
    chat_caps *c = &s->caps;
    c->syntax = chat_syntax_detect(s->chat_template);
    c->template_has_tools = strstr(s->chat_template, "tools") != NULL;
    static const char object_args[] = "{\"quill_probe_arg\": 1}", text_args[] = "\"{\\\"quill_probe_arg\\\": 1}\"";
    c->null_content = false;
    c->object_arguments = false;
    c->writes_calls = false;
    char *out = probe_render(s->chat_template, "\"\"", object_args);
    if (out && strstr(out, "quill_probe_fn") && strstr(out, "\"quill_probe_arg\"")) {
        c->object_arguments = c->writes_calls = true;
    } else {
        free(out);
        const char *contents[] = {"\"\"", "null"};
        for (int k = 0; k < 2 && !c->writes_calls; k++) {
            out = probe_render(s->chat_template, contents[k], text_args);
            if (out && strstr(out, "quill_probe_fn") && strstr(out, "quill_probe_arg")) {
                c->writes_calls = true;
                c->null_content = k == 1;
            }
            free(out);
            out = NULL;
        }
        if (!c->writes_calls) {
            out = probe_render(s->chat_template, "null", object_args);
            if (out && strstr(out, "quill_probe_fn")) c->writes_calls = c->null_content = c->object_arguments = true;
        }
    }
    free(out);
    /* without a way to show tools or calls, the generic JSON form (described in a system message) */
    if (!c->template_has_tools || !c->writes_calls) c->syntax.tools = TOOL_SYNTAX_GENERIC;
}

/* ---------------------------------------------------------------- the request */

struct chat_tools {
    chat_syntax syntax;
    chat_parse_options opt;
    tool_choice choice;
    bool parallel;
    char **names;
    char **params;              /* each tool's parameters schema as JSON text, or NULL */
    size_t n_names;
    char *forced_name;          /* tool_choice naming a function */
    char id_base[24];
    /* streaming progress */
    size_t content_sent, reasoning_sent;
    size_t calls_started;
    size_t *args_sent;
    size_t args_cap;
};

void chat_tools_free(chat_tools *t) {
    if (!t) return;
    for (size_t i = 0; i < t->n_names; i++) {
        free(t->names[i]);
        if (t->params) free(t->params[i]);
    }
    free(t->names);
    free(t->params);
    free(t->forced_name);
    free(t->args_sent);
    free(t);
}

static char *dup_str(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

chat_tools *chat_tools_clone(const chat_tools *t, int choice) {
    chat_tools *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->syntax = t->syntax;
    c->opt = t->opt;
    c->choice = t->choice;
    c->parallel = t->parallel;
    char base[sizeof c->id_base];
    snprintf(base, sizeof base, "%.14s-%d", t->id_base, choice);
    memcpy(c->id_base, base, sizeof base);
    bool ok = !t->forced_name || (c->forced_name = dup_str(t->forced_name));
    if (ok && t->n_names && (!(c->names = calloc(t->n_names, sizeof *c->names)) ||
                             !(c->params = calloc(t->n_names, sizeof *c->params))))
        ok = false;
    for (size_t i = 0; ok && i < t->n_names; i++) {
        if (!(c->names[i] = dup_str(t->names[i]))) ok = false;
        else c->n_names = i + 1;
        if (ok && t->params[i] && !(c->params[i] = dup_str(t->params[i]))) ok = false;
    }
    if (!ok) {
        chat_tools_free(c);
        return NULL;
    }
    return c;
}

static bool parse_tools(const cJSON *root, chat_tools *t, api_error *e) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    if (!tools || cJSON_IsNull(tools)) return true;
    if (!cJSON_IsArray(tools)) return api_fail(e, 400, "tools", "'tools' must be an array of function tools");
    size_t n = (size_t)cJSON_GetArraySize(tools), i = 0;
    if (n > 512) return api_fail(e, 400, "tools", "'tools' holds %zu tools; at most 512 are accepted", n);
    t->names = calloc(n ? n : 1, sizeof *t->names);
    t->params = calloc(n ? n : 1, sizeof *t->params);
    if (!t->names || !t->params) return api_fail(e, 500, NULL, "out of memory");
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(tool, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(tool, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsObject(tool) || !cJSON_IsString(type) || strcmp(type->valuestring, "function"))
            return api_fail(e, 400, "tools", "tools[%zu]: only {\"type\": \"function\", \"function\": {...}} tools are supported", i);
        if (!cJSON_IsObject(fn) || !cJSON_IsString(name) || !name->valuestring[0] || strlen(name->valuestring) > 256)
            return api_fail(e, 400, "tools", "tools[%zu].function.name must be a string of 1 to 256 characters", i);
        for (const char *p = name->valuestring; *p; p++)
            if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_' ||
                  *p == '-' || *p == '.'))
                return api_fail(e, 400, "tools", "tools[%zu].function.name '%.64s' may hold only letters, digits, '_', '-' and '.'",
                                i, name->valuestring);
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params))
            return api_fail(e, 400, "tools", "tools[%zu].function.parameters must be a JSON Schema object", i);
        for (size_t k = 0; k < i; k++)
            if (!strcmp(t->names[k], name->valuestring))
                return api_fail(e, 400, "tools", "tools[%zu]: the name '%.64s' is given twice", i, name->valuestring);
        if (!(t->names[i] = dup_str(name->valuestring))) return api_fail(e, 500, NULL, "out of memory");
        t->n_names = i + 1;
        if (cJSON_IsObject(params) && !(t->params[i] = cJSON_PrintUnformatted(params)))
            return api_fail(e, 500, NULL, "out of memory");
        i++;
    }
    return true;
}

static bool parse_tool_choice(const cJSON *root, chat_tools *t, api_error *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "tool_choice");
    t->choice = t->n_names ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
    if (!c || cJSON_IsNull(c)) return true;
    if (cJSON_IsString(c)) {
        if (!strcmp(c->valuestring, "auto")) t->choice = t->n_names ? TOOL_CHOICE_AUTO : TOOL_CHOICE_NONE;
        else if (!strcmp(c->valuestring, "none")) t->choice = TOOL_CHOICE_NONE;
        else if (!strcmp(c->valuestring, "required")) t->choice = TOOL_CHOICE_REQUIRED;
        else return api_fail(e, 400, "tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
    } else if (cJSON_IsObject(c)) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(c, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        if (!cJSON_IsString(name))
            return api_fail(e, 400, "tool_choice", "'tool_choice' as an object needs function.name");
        size_t k = 0;
        while (k < t->n_names && strcmp(t->names[k], name->valuestring)) k++;
        if (k == t->n_names)
            return api_fail(e, 400, "tool_choice", "'tool_choice' names the function '%.64s', which is not among 'tools'",
                            name->valuestring);
        t->choice = TOOL_CHOICE_NAMED;
        if (!(t->forced_name = dup_str(name->valuestring))) return api_fail(e, 500, NULL, "out of memory");
    } else {
        return api_fail(e, 400, "tool_choice", "'tool_choice' must be a string or an object");
    }
    if (t->choice == TOOL_CHOICE_REQUIRED && !t->n_names)
        return api_fail(e, 400, "tool_choice", "'tool_choice' is \"required\" but the request has no 'tools'");
    return true;
}

/* A message's text content (a string or text parts), or NULL when null/absent. */
static char *content_text(const cJSON *c) {
    if (cJSON_IsString(c)) return dup_str(c->valuestring);
    if (!cJSON_IsArray(c)) return NULL;
    size_t len = 0;
    const cJSON *part;
    cJSON_ArrayForEach(part, c) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (cJSON_IsString(text)) len += strlen(text->valuestring);
    }
    char *out = malloc(len + 1);
    if (!out) return NULL;
    size_t at = 0;
    cJSON_ArrayForEach(part, c) {
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(text)) continue;
        size_t n = strlen(text->valuestring);
        memcpy(out + at, text->valuestring, n);
        at += n;
    }
    out[at] = 0;
    return out;
}

/* The conversation as the template wants it (see the capabilities above). request_parse has
 * already checked roles and content shapes. */
static cJSON *template_messages(const server *s, const cJSON *msgs, api_error *e) {
    const chat_caps *caps = &s->caps;
    cJSON *out = cJSON_CreateArray();
    const cJSON *m;
    size_t i = 0;
    cJSON_ArrayForEach(m, msgs) {
        cJSON *copy = cJSON_Duplicate(m, true);
        if (!copy) break;
        cJSON_AddItemToArray(out, copy);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(copy, "role");
        if (caps->syntax.tools != TOOL_SYNTAX_GPT_OSS && cJSON_IsString(role) && !strcmp(role->valuestring, "developer"))
            cJSON_SetValuestring((cJSON *)role, "system");
        cJSON *content = cJSON_GetObjectItemCaseSensitive(copy, "content");
        if (cJSON_IsArray(content)) {
            char *text = content_text(content);
            cJSON_ReplaceItemInObjectCaseSensitive(copy, "content", cJSON_CreateString(text ? text : ""));
            free(text);
        }
        cJSON *calls = cJSON_GetObjectItemCaseSensitive(copy, "tool_calls");
        if (calls && !cJSON_IsNull(calls)) {
            if (!cJSON_IsArray(calls)) {
                cJSON_Delete(out);
                api_fail(e, 400, "messages", "messages[%zu].tool_calls must be an array", i);
                return NULL;
            }
            cJSON *call;
            size_t k = 0;
            cJSON_ArrayForEach(call, calls) {
                cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
                const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
                const cJSON *args = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
                if (!cJSON_IsString(name) || !(cJSON_IsString(args) || cJSON_IsObject(args))) {
                    cJSON_Delete(out);
                    api_fail(e, 400, "messages", "messages[%zu].tool_calls[%zu] needs function.name and function.arguments", i, k);
                    return NULL;
                }
                cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : cJSON_Duplicate(args, true);
                if (!cJSON_IsObject(parsed)) {
                    cJSON_Delete(parsed);
                    cJSON_Delete(out);
                    api_fail(e, 400, "messages", "messages[%zu].tool_calls[%zu].function.arguments is not a JSON object", i, k);
                    return NULL;
                }
                if (caps->object_arguments) {
                    cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", parsed);
                } else {
                    char *text = cJSON_PrintUnformatted(parsed);
                    cJSON_Delete(parsed);
                    cJSON_ReplaceItemInObjectCaseSensitive(fn, "arguments", cJSON_CreateString(text ? text : "{}"));
                    free(text);
                }
                if (!cJSON_GetObjectItemCaseSensitive(call, "type")) cJSON_AddStringToObject(call, "type", "function");
                k++;
            }
            if (!content || cJSON_IsNull(content)) {
                if (content) cJSON_DeleteItemFromObjectCaseSensitive(copy, "content");
                if (caps->null_content) cJSON_AddNullToObject(copy, "content");
                else cJSON_AddStringToObject(copy, "content", "");
            }
        } else if (!content || cJSON_IsNull(content)) {
            if (content) cJSON_DeleteItemFromObjectCaseSensitive(copy, "content");
            cJSON_AddStringToObject(copy, "content", "");
        }
        /* gpt-oss's template reads reasoning as "thinking" */
        const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(copy, "reasoning_content");
        if (cJSON_IsString(reasoning) && !cJSON_GetObjectItemCaseSensitive(copy, "thinking"))
            cJSON_AddStringToObject(copy, "thinking", reasoning->valuestring);
        i++;
    }
    return out;
}

/* Templates that cannot show tools get them in a system message, with the JSON form to answer in. */
static bool add_generic_tools_prompt(cJSON *msgs, const cJSON *tools, const chat_tools *t) {
    char *list = cJSON_Print(tools);
    if (!list) return false;
    const char *how = t->choice == TOOL_CHOICE_AUTO
                          ? "To call tools, reply with only a JSON object {\"tool_calls\": [{\"name\": ..., \"arguments\": "
                            "{...}}]}; to answer directly, reply with {\"response\": \"...\"} or plain text."
                          : "Reply with only a JSON object {\"tool_calls\": [{\"name\": ..., \"arguments\": {...}}]}.";
    size_t n = strlen(list) + strlen(how) + 128;
    char *text = malloc(n);
    if (!text) {
        free(list);
        return false;
    }
    snprintf(text, n, "You can call these tools:\n%s\n%s", list, how);
    free(list);
    cJSON *first = cJSON_GetArrayItem(msgs, 0);
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(first, "role");
    const cJSON *content = cJSON_GetObjectItemCaseSensitive(first, "content");
    if (cJSON_IsString(role) && !strcmp(role->valuestring, "system") && cJSON_IsString(content)) {
        size_t m = strlen(content->valuestring) + strlen(text) + 3;
        char *joined = malloc(m);
        if (joined) {
            snprintf(joined, m, "%s\n\n%s", content->valuestring, text);
            cJSON_ReplaceItemInObjectCaseSensitive(first, "content", cJSON_CreateString(joined));
        }
        free(joined);
    } else {
        cJSON *sys = cJSON_CreateObject();
        cJSON_AddStringToObject(sys, "role", "system");
        cJSON_AddStringToObject(sys, "content", text);
        cJSON_InsertItemInArray(msgs, 0, sys);
    }
    free(text);
    return true;
}

bool chat_tools_prepare(server *s, const char *body, size_t len, const char *id, chat_tools **out, char **prompt,
                        api_error *e) {
    *out = NULL;
    *prompt = NULL;
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) return api_fail(e, 400, NULL, "the body is not valid JSON");
    chat_tools *t = calloc(1, sizeof *t);
    bool ok = t != NULL;
    if (!ok) api_fail(e, 500, NULL, "out of memory");
    if (ok) {
        t->syntax = s->caps.syntax;
        t->parallel = true;
        t->opt.extract_reasoning = true;
        snprintf(t->id_base, sizeof t->id_base, "%s", id);
        ok = parse_tools(root, t, e) && parse_tool_choice(root, t, e);
    }
    const cJSON *v;
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(root, "parallel_tool_calls")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) ok = api_fail(e, 400, "parallel_tool_calls", "'parallel_tool_calls' must be true or false");
        else t->parallel = cJSON_IsTrue(v);
    }
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(root, "reasoning_format")) && !cJSON_IsNull(v)) {
        static const char *const known[] = {"none", "auto", "deepseek", "deepseek-legacy", NULL};
        const char *const *k = known;
        if (cJSON_IsString(v))
            while (*k && strcmp(*k, v->valuestring)) k++;
        if (!cJSON_IsString(v) || !*k)
            ok = api_fail(e, 400, "reasoning_format", "'reasoning_format' must be \"none\", \"auto\", \"deepseek\" or \"deepseek-legacy\"");
        else t->opt.extract_reasoning = strcmp(v->valuestring, "none") != 0;
    }
    cJSON *kwargs = NULL;
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsObject(v)) ok = api_fail(e, 400, "chat_template_kwargs", "'chat_template_kwargs' must be an object");
        else kwargs = cJSON_Duplicate(v, true);
    }
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(root, "reasoning_effort")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) ok = api_fail(e, 400, "reasoning_effort", "'reasoning_effort' must be a string");
        else {
            if (!kwargs) kwargs = cJSON_CreateObject();
            if (!cJSON_GetObjectItemCaseSensitive(kwargs, "reasoning_effort"))
                cJSON_AddStringToObject(kwargs, "reasoning_effort", v->valuestring);
        }
    }
    cJSON *msgs = ok ? template_messages(s, cJSON_GetObjectItemCaseSensitive(root, "messages"), e) : NULL;
    if (ok && !msgs) ok = false;
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
    bool show_tools = ok && t->n_names && t->choice != TOOL_CHOICE_NONE;
    if (show_tools && t->syntax.tools == TOOL_SYNTAX_GENERIC && !add_generic_tools_prompt(msgs, tools, t))
        ok = api_fail(e, 500, NULL, "out of memory");
    char *messages_json = ok ? cJSON_PrintUnformatted(msgs) : NULL;
    char *tools_json = show_tools && s->caps.template_has_tools ? cJSON_PrintUnformatted(tools) : NULL;
    char *extra_json = kwargs ? cJSON_PrintUnformatted(kwargs) : NULL;
    if (ok && !messages_json) ok = api_fail(e, 500, NULL, "out of memory");
    if (ok) {
        quill_chat_inputs in = {.messages_json = messages_json, .tools_json = tools_json, .extra_json = extra_json,
                                .add_generation_prompt = true};
        quill_chat_inputs_common(s->tok, &in);
        quill_error err;
        quill_status st = quill_chat_render_inputs(s->chat_template, &in, prompt, &err);
        if (st) ok = api_fail(e, st == QUILL_E_NOMEM ? 500 : 400, "messages", "%s", err.message);
    }
    if (ok) {
        /* a prompt that ends inside <think> makes the reply begin with reasoning */
        size_t n = strlen(*prompt);
        while (n && (*prompt)[n - 1] == '\n') n--;
        t->opt.thinking_open = t->syntax.think_tags && n >= 7 && !memcmp(*prompt + n - 7, "<think>", 7);
        t->opt.tools = t->n_names && t->choice != TOOL_CHOICE_NONE;
    }
    free(messages_json);
    free(tools_json);
    free(extra_json);
    cJSON_Delete(msgs);
    cJSON_Delete(kwargs);
    cJSON_Delete(root);
    if (!ok) {
        free(*prompt);
        *prompt = NULL;
        chat_tools_free(t);
        return false;
    }
    *out = t;
    return true;
}

tool_choice chat_tools_choice(const chat_tools *t) { return t->choice; }

bool chat_tools_grammar(const chat_tools *t, const quill_tokenizer *tok, char **grammar, const char **trigger,
                        api_error *e) {
    *grammar = NULL;
    *trigger = NULL;
    if (t->choice == TOOL_CHOICE_NONE) return true;
    /* auto: prose, or calls that parse by construction once the model begins one */
    const bool lazy = t->choice == TOOL_CHOICE_AUTO;
    /* the tools that may be called, each with its arguments' schema as a grammar */
    size_t n = 0;
    const char **names = calloc(t->n_names, sizeof *names);
    char **args = calloc(t->n_names, sizeof *args);
    bool ok = names && args;
    if (!ok) api_fail(e, 500, NULL, "out of memory");
    for (size_t i = 0; ok && i < t->n_names; i++) {
        if (t->choice == TOOL_CHOICE_NAMED && strcmp(t->names[i], t->forced_name)) continue;
        names[n] = t->names[i];
        quill_error err;
        quill_status st = t->params[i] ? quill_json_schema_to_grammar(t->params[i], strlen(t->params[i]), &args[n], &err)
                                       : QUILL_OK;
        /* auto: a schema the converter cannot express leaves that tool's arguments any JSON object,
         * rather than refusing a request that may never call it */
        if (st && lazy && st != QUILL_E_NOMEM) args[n] = NULL;
        else if (st) ok = api_fail(e, st == QUILL_E_NOMEM ? 500 : 400, "tools", "tools[%zu].function.parameters: %s", i, err.message);
        n++;
    }
    if (ok) {
        quill_error err;
        quill_status st = tool_call_grammar(&t->syntax, tok, names, (const char *const *)args, n,
                                            t->choice != TOOL_CHOICE_NAMED && t->parallel, t->opt.thinking_open && !lazy,
                                            grammar, &err);
        if (st) ok = api_fail(e, 500, NULL, "%s", err.message);
        else if (lazy) *trigger = tool_call_trigger(&t->syntax);
    }
    for (size_t i = 0; args && i < n; i++) free(args[i]);
    free(args);
    free(names);
    return ok;
}

bool chat_tools_render_special(const chat_tools *t) {
    /* harmony's channels, DeepSeek's and Mistral's call marks and Llama's <|python_tag|> are
     * special tokens: the parse needs them in the text */
    return t->syntax.tools == TOOL_SYNTAX_GPT_OSS || (t->opt.tools && t->syntax.tools != TOOL_SYNTAX_HERMES &&
                                                      t->syntax.tools != TOOL_SYNTAX_GENERIC &&
                                                      t->syntax.tools != TOOL_SYNTAX_QWEN3_CODER);
}

/* ---------------------------------------------------------------- replies */

/* A call's id: stable for a reply and an index (streams send it once); Mistral's templates demand
 * nine letters and digits. */
static void call_id(const chat_tools *t, size_t index, char *out, size_t cap) {
    static const char alnum[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
    uint64_t h = 1469598103934665603ull;
    for (const char *p = t->id_base; *p; p++) h = (h ^ (unsigned char)*p) * 1099511628211ull;
    h = (h ^ index) * 1099511628211ull;
    char nine[10];
    for (int i = 0; i < 9; i++) {
        nine[i] = alnum[h % 62];
        h = h / 62 * 6364136223846793005ull + 1442695040888963407ull;
    }
    nine[9] = 0;
    if (t->syntax.tools == TOOL_SYNTAX_MISTRAL) snprintf(out, cap, "%s", nine);
    else snprintf(out, cap, "call_%s", nine);
}

static bool parse_text(const chat_tools *t, const char *text, size_t n, bool partial, bool cut, chat_parse *p) {
    chat_parse_options o = t->opt;
    o.partial = partial;
    o.cut = cut;
    quill_error err;
    return chat_parse_output(&t->syntax, &o, text ? text : "", text ? n : 0, p, &err) == QUILL_OK;
}

/* Only the calls to offered tools count; anything else a model wrote stays text. */
static bool call_known(const chat_tools *t, const char *name) {
    for (size_t i = 0; i < t->n_names; i++)
        if (!strcmp(t->names[i], name)) return true;
    return false;
}

/* A reply cut off by max_tokens has no calls, as a hosted API's: one of them may be the one
 * being written, and an agent must not run the others as if the turn had ended. */
static bool cut_off(const char *finish_reason) { return finish_reason && !strcmp(finish_reason, "length"); }

void chat_tools_message(chat_tools *t, const char *text, size_t n, cJSON *msg, const char **finish_reason) {
    chat_parse p;
    const bool cut = cut_off(finish_reason ? *finish_reason : NULL);
    if (!parse_text(t, text, n, false, cut, &p)) {
        cJSON_AddStringToObject(msg, "content", "");
        return;
    }
    size_t calls = 0;
    for (size_t i = 0; i < p.n_calls && !cut; i++) calls += call_known(t, p.calls[i].name);
    if (calls && !p.content[0]) cJSON_AddNullToObject(msg, "content");
    else cJSON_AddStringToObject(msg, "content", p.content);
    if (p.reasoning[0]) cJSON_AddStringToObject(msg, "reasoning_content", p.reasoning);
    if (calls) {
        cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");
        size_t index = 0;
        for (size_t i = 0; i < p.n_calls; i++) {
            if (!call_known(t, p.calls[i].name)) continue;
            char id[32];
            call_id(t, index++, id, sizeof id);
            cJSON *c = cJSON_CreateObject();
            cJSON_AddStringToObject(c, "id", id);
            cJSON_AddStringToObject(c, "type", "function");
            cJSON *fn = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(fn, "name", p.calls[i].name);
            cJSON_AddStringToObject(fn, "arguments", p.calls[i].arguments);
            cJSON_AddItemToArray(arr, c);
        }
        if (finish_reason && !strcmp(*finish_reason, "stop")) *finish_reason = "tool_calls";
    }
    chat_parse_free(&p);
}

bool chat_tools_delta(chat_tools *t, const char *text, size_t n, bool final, const char *finish_reason, cJSON *delta,
                      bool *had_calls) {
    chat_parse p;
    const bool cut = final && cut_off(finish_reason);
    if (!parse_text(t, text, n, !final, cut, &p)) return false;
    bool any = false;
    size_t clen = strlen(p.content), rlen = strlen(p.reasoning);
    if (rlen > t->reasoning_sent) {
        cJSON_AddStringToObject(delta, "reasoning_content", p.reasoning + t->reasoning_sent);
        t->reasoning_sent = rlen;
        any = true;
    }
    if (clen > t->content_sent) {
        cJSON_AddStringToObject(delta, "content", p.content + t->content_sent);
        t->content_sent = clen;
        any = true;
    }
    cJSON *arr = NULL;
    size_t index = 0;
    /* calls are sent once the reply is whole: until the turn ends, the one being written may yet
     * be cut off, and then the reply has none */
    for (size_t i = 0; final && !cut && i < p.n_calls; i++) {
        if (!call_known(t, p.calls[i].name)) continue;
        const parsed_call *c = &p.calls[i];
        size_t alen = strlen(c->arguments);
        if (index >= t->args_cap) {
            size_t cap = t->args_cap ? t->args_cap * 2 : 4;
            size_t *grown = realloc(t->args_sent, cap * sizeof *grown);
            if (!grown) break;
            memset(grown + t->args_cap, 0, (cap - t->args_cap) * sizeof *grown);
            t->args_sent = grown;
            t->args_cap = cap;
        }
        bool start = index >= t->calls_started;
        if (start || alen > t->args_sent[index]) {
            if (!arr) arr = cJSON_AddArrayToObject(delta, "tool_calls");
            cJSON *d = cJSON_CreateObject();
            cJSON_AddNumberToObject(d, "index", (double)index);
            cJSON *fn;
            if (start) {
                char id[32];
                call_id(t, index, id, sizeof id);
                cJSON_AddStringToObject(d, "id", id);
                cJSON_AddStringToObject(d, "type", "function");
                fn = cJSON_AddObjectToObject(d, "function");
                cJSON_AddStringToObject(fn, "name", c->name);
                t->calls_started = index + 1;
            } else {
                fn = cJSON_AddObjectToObject(d, "function");
            }
            cJSON_AddStringToObject(fn, "arguments", c->arguments + t->args_sent[index]);
            t->args_sent[index] = alen;
            cJSON_AddItemToArray(arr, d);
            any = true;
        }
        index++;
    }
    if (had_calls) *had_calls = t->calls_started > 0;
    chat_parse_free(&p);
    return any;
}
