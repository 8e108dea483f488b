/* Other APIs' requests as OpenAI chat requests, so that every API generates through the same path
 * (gen_begin): Anthropic's Messages and OpenAI's Responses. Pure JSON to JSON (fuzzed by
 * fuzz/fuzz_request.c); what a route replies is in its routes_*.c. */
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- chat's tools, as both translate to */

/* Chat's function tool, {"type": "function", "function": {name, description, parameters}}, onto
 * `tools`: the description from `tool` when it has a string one, the parameters a copy of `schema`
 * unless NULL. */
static void add_function_tool(cJSON *tools, const char *name, const cJSON *tool, const cJSON *schema) {
    cJSON *ft = cJSON_CreateObject(), *fn = cJSON_AddObjectToObject(ft, "function");
    cJSON_AddStringToObject(ft, "type", "function");
    cJSON_AddStringToObject(fn, "name", name);
    const cJSON *desc = cJSON_GetObjectItemCaseSensitive(tool, "description");
    if (cJSON_IsString(desc)) cJSON_AddStringToObject(fn, "description", desc->valuestring);
    if (schema) cJSON_AddItemToObject(fn, "parameters", cJSON_Duplicate(schema, true));
    cJSON_AddItemToArray(tools, ft);
}

/* Chat's tool message: the result of call `call_id` (NULL: empty). */
static void add_tool_result(cJSON *msgs, const char *call_id, const char *content) {
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "tool");
    cJSON_AddStringToObject(m, "tool_call_id", call_id);
    cJSON_AddStringToObject(m, "content", content ? content : "");
    cJSON_AddItemToArray(msgs, m);
}

/* Chat's tool_choice that names one function. */
static void add_named_tool_choice(cJSON *out, const char *name) {
    cJSON *tc = cJSON_AddObjectToObject(out, "tool_choice");
    cJSON_AddStringToObject(tc, "type", "function");
    cJSON_AddStringToObject(cJSON_AddObjectToObject(tc, "function"), "name", name);
}

/* ---------------------------------------------------------------- Anthropic Messages */

/* A block list's text ("text" blocks joined); false for other kinds of blocks. */
static bool blocks_text(const cJSON *content, const char *where, char **out, api_error *e) {
    if (cJSON_IsString(content)) {
        *out = strdup(content->valuestring);
        return *out || api_fail(e, 500, NULL, "out of memory");
    }
    if (!cJSON_IsArray(content)) return api_fail(e, 400, "messages", "%s: content must be a string or an array of blocks", where);
    size_t len = 1;
    const cJSON *b;
    cJSON_ArrayForEach(b, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type"), *text = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return api_fail(e, 400, "messages", "%s: only text blocks are accepted here (got %.32s)", where,
                            cJSON_IsString(type) ? type->valuestring : "a block without a type");
        len += strlen(text->valuestring);
    }
    if (!(*out = malloc(len))) return api_fail(e, 500, NULL, "out of memory");
    size_t at = 0;
    cJSON_ArrayForEach(b, content) {
        const char *t = cJSON_GetObjectItemCaseSensitive(b, "text")->valuestring;
        memcpy(*out + at, t, strlen(t));
        at += strlen(t);
    }
    (*out)[at] = 0;
    return true;
}

/* One Anthropic message to chat messages (a user turn with tool results becomes tool messages
 * followed by the user's text, if any). */
static bool translate_message(const cJSON *m, size_t i, cJSON *out, api_error *e) {
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role"), *content = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!cJSON_IsObject(m) || !cJSON_IsString(role) || (strcmp(role->valuestring, "user") && strcmp(role->valuestring, "assistant")))
        return api_fail(e, 400, "messages", "messages[%zu]: role must be \"user\" or \"assistant\"", i);
    bool assistant = !strcmp(role->valuestring, "assistant");
    if (cJSON_IsString(content)) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "role", role->valuestring);
        cJSON_AddStringToObject(c, "content", content->valuestring);
        cJSON_AddItemToArray(out, c);
        return true;
    }
    if (!cJSON_IsArray(content)) return api_fail(e, 400, "messages", "messages[%zu].content must be a string or an array of blocks", i);
    size_t text_len = 1;
    const cJSON *b;
    cJSON *calls = NULL;
    char *reasoning = NULL;
    cJSON_ArrayForEach(b, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(b, "text");
        if (!cJSON_IsObject(b) || !cJSON_IsString(type)) {
            cJSON_Delete(calls);
            free(reasoning);
            return api_fail(e, 400, "messages", "messages[%zu]: each content block needs a 'type'", i);
        }
        const char *t = type->valuestring;
        if (!strcmp(t, "text")) {
            if (!cJSON_IsString(text)) {
                cJSON_Delete(calls);
                free(reasoning);
                return api_fail(e, 400, "messages", "messages[%zu]: a text block needs a string 'text'", i);
            }
            text_len += strlen(text->valuestring);
        } else if (!strcmp(t, "thinking") && assistant) {
            const cJSON *th = cJSON_GetObjectItemCaseSensitive(b, "thinking");
            if (cJSON_IsString(th) && !reasoning) reasoning = strdup(th->valuestring);
        } else if (!strcmp(t, "redacted_thinking") && assistant) {
            continue;
        } else if (!strcmp(t, "tool_use") && assistant) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "id"), *name = cJSON_GetObjectItemCaseSensitive(b, "name");
            const cJSON *input = cJSON_GetObjectItemCaseSensitive(b, "input");
            if (!cJSON_IsString(id) || !cJSON_IsString(name) || !cJSON_IsObject(input)) {
                cJSON_Delete(calls);
                free(reasoning);
                return api_fail(e, 400, "messages", "messages[%zu]: a tool_use block needs id, name and an object input", i);
            }
            if (!calls) calls = cJSON_CreateArray();
            cJSON *call = cJSON_CreateObject(), *fn;
            cJSON_AddStringToObject(call, "id", id->valuestring);
            cJSON_AddStringToObject(call, "type", "function");
            fn = cJSON_AddObjectToObject(call, "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            char *args = cJSON_PrintUnformatted(input);
            cJSON_AddStringToObject(fn, "arguments", args ? args : "{}");
            free(args);
            cJSON_AddItemToArray(calls, call);
        } else if (!strcmp(t, "tool_result") && !assistant) {
            const cJSON *id = cJSON_GetObjectItemCaseSensitive(b, "tool_use_id");
            if (!cJSON_IsString(id)) {
                cJSON_Delete(calls);
                free(reasoning);
                return api_fail(e, 400, "messages", "messages[%zu]: a tool_result block needs a tool_use_id", i);
            }
            const cJSON *rc = cJSON_GetObjectItemCaseSensitive(b, "content");
            char *result = NULL;
            char where[64];
            snprintf(where, sizeof where, "messages[%zu] tool_result", i);
            if (!rc || cJSON_IsNull(rc)) result = strdup("");
            else if (!blocks_text(rc, where, &result, e)) {
                cJSON_Delete(calls);
                free(reasoning);
                return false;
            }
            add_tool_result(out, id->valuestring, result);
            free(result);
        } else {
            cJSON_Delete(calls);
            free(reasoning);
            return api_fail(e, 400, "messages", "messages[%zu]: %.32s blocks are not supported in %s turns (this server takes "
                            "text, tool_use, tool_result and thinking)", i, t, role->valuestring);
        }
    }
    char *text = malloc(text_len);
    if (!text) {
        cJSON_Delete(calls);
        free(reasoning);
        return api_fail(e, 500, NULL, "out of memory");
    }
    size_t at = 0;
    cJSON_ArrayForEach(b, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(b, "type");
        if (strcmp(type->valuestring, "text")) continue;
        const char *t = cJSON_GetObjectItemCaseSensitive(b, "text")->valuestring;
        memcpy(text + at, t, strlen(t));
        at += strlen(t);
    }
    text[at] = 0;
    if (at || calls || reasoning) {
        cJSON *c = cJSON_CreateObject();
        cJSON_AddStringToObject(c, "role", role->valuestring);
        if (!at && calls) cJSON_AddNullToObject(c, "content");
        else cJSON_AddStringToObject(c, "content", text);
        if (calls) cJSON_AddItemToObject(c, "tool_calls", calls);
        if (reasoning) cJSON_AddStringToObject(c, "reasoning_content", reasoning);
        cJSON_AddItemToArray(out, c);
    }
    free(text);
    free(reasoning);
    return true;
}

char *anthropic_to_chat(const char *body, size_t len, bool *stream, api_error *e) {
    cJSON *in = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        api_fail(e, 400, NULL, "the body is not a JSON object");
        return NULL;
    }
    cJSON *out = cJSON_CreateObject();
    bool ok = true;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(in, "max_tokens");
    if (!cJSON_IsNumber(v)) ok = api_fail(e, 400, "max_tokens", "'max_tokens' is required and must be a number");
    /* seed: quill's own, as llama-server takes it, for replies that can be drawn again */
    static const char *const same[] = {"model", "max_tokens", "temperature", "top_p", "top_k", "seed", NULL};
    for (const char *const *k = same; ok && *k; k++)
        if ((v = cJSON_GetObjectItemCaseSensitive(in, *k))) cJSON_AddItemToObject(out, *k, cJSON_Duplicate(v, true));
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(in, "stop_sequences")) && !cJSON_IsNull(v))
        cJSON_AddItemToObject(out, "stop", cJSON_Duplicate(v, true));
    *stream = false;
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(in, "stream")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) ok = api_fail(e, 400, "stream", "'stream' must be true or false");
        else *stream = cJSON_IsTrue(v);
    }
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    const cJSON *system = cJSON_GetObjectItemCaseSensitive(in, "system");
    if (ok && system && !cJSON_IsNull(system)) {
        char *text = NULL;
        if (blocks_text(system, "system", &text, e)) {
            cJSON *sm = cJSON_CreateObject();
            cJSON_AddStringToObject(sm, "role", "system");
            cJSON_AddStringToObject(sm, "content", text);
            cJSON_AddItemToArray(msgs, sm);
            free(text);
        } else {
            ok = false;
        }
    }
    const cJSON *ms = cJSON_GetObjectItemCaseSensitive(in, "messages"), *m;
    if (ok && (!cJSON_IsArray(ms) || cJSON_GetArraySize(ms) == 0))
        ok = api_fail(e, 400, "messages", "'messages' must be a non-empty array");
    size_t i = 0;
    if (ok) cJSON_ArrayForEach(m, ms) {
        if (!translate_message(m, i++, msgs, e)) {
            ok = false;
            break;
        }
    }
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(in, "tools"), *t;
    if (ok && tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) ok = api_fail(e, 400, "tools", "'tools' must be an array");
        cJSON *ot = ok ? cJSON_AddArrayToObject(out, "tools") : NULL;
        i = 0;
        if (ok) cJSON_ArrayForEach(t, tools) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            const cJSON *schema = cJSON_GetObjectItemCaseSensitive(t, "input_schema");
            if (!cJSON_IsString(name)) {
                ok = api_fail(e, 400, "tools", "tools[%zu] needs a string 'name' (server tools are not supported)", i);
                break;
            }
            add_function_tool(ot, name->valuestring, t, schema);
            i++;
        }
    }
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(in, "tool_choice");
    if (ok && choice && !cJSON_IsNull(choice)) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(choice, "type");
        const char *ty = cJSON_IsString(type) ? type->valuestring : "";
        if (!strcmp(ty, "auto")) cJSON_AddStringToObject(out, "tool_choice", "auto");
        else if (!strcmp(ty, "any")) cJSON_AddStringToObject(out, "tool_choice", "required");
        else if (!strcmp(ty, "none")) cJSON_AddStringToObject(out, "tool_choice", "none");
        else if (!strcmp(ty, "tool")) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
            if (!cJSON_IsString(name)) ok = api_fail(e, 400, "tool_choice", "tool_choice of type \"tool\" needs a 'name'");
            else add_named_tool_choice(out, name->valuestring);
        } else ok = api_fail(e, 400, "tool_choice", "'tool_choice.type' must be auto, any, tool or none");
        if (ok && cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(choice, "disable_parallel_tool_use")))
            cJSON_AddFalseToObject(out, "parallel_tool_calls");
    }
    cJSON_Delete(in);
    char *text = ok ? cJSON_PrintUnformatted(out) : NULL;
    cJSON_Delete(out);
    if (ok && !text) api_fail(e, 500, NULL, "out of memory");
    return text;
}

/* ---------------------------------------------------------------- OpenAI Responses */

static char *parts_text(const cJSON *content) {
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    size_t len = 1;
    const cJSON *p;
    cJSON_ArrayForEach(p, content) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (cJSON_IsString(t)) len += strlen(t->valuestring);
    }
    char *out = malloc(len);
    if (!out) return NULL;
    size_t at = 0;
    cJSON_ArrayForEach(p, content) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(p, "text");
        if (!cJSON_IsString(t)) continue;
        memcpy(out + at, t->valuestring, strlen(t->valuestring));
        at += strlen(t->valuestring);
    }
    out[at] = 0;
    return out;
}

/* Input items to chat messages appended to `msgs`. */
static bool translate_items(const cJSON *input, cJSON *msgs, api_error *e) {
    if (cJSON_IsString(input)) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "user");
        cJSON_AddStringToObject(m, "content", input->valuestring);
        cJSON_AddItemToArray(msgs, m);
        return true;
    }
    if (!cJSON_IsArray(input)) return api_fail(e, 400, "input", "'input' must be a string or an array of items");
    const cJSON *item;
    size_t i = 0;
    cJSON *last_calls = NULL;   /* consecutive function_call items join one assistant turn */
    cJSON_ArrayForEach(item, input) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(item, "type");
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(item, "role");
        const char *ty = cJSON_IsString(type) ? type->valuestring : "message";
        if (!cJSON_IsObject(item)) return api_fail(e, 400, "input", "input[%zu] must be an object", i);
        if (!strcmp(ty, "message")) {
            static const char *const roles[] = {"user", "system", "developer", "assistant", NULL};
            const char *const *r = roles;
            if (cJSON_IsString(role))
                while (*r && strcmp(*r, role->valuestring)) r++;
            if (!cJSON_IsString(role) || !*r)
                return api_fail(e, 400, "input", "input[%zu].role must be user, system, developer or assistant", i);
            const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
            if (!cJSON_IsString(content) && !cJSON_IsArray(content))
                return api_fail(e, 400, "input", "input[%zu].content must be a string or an array of parts", i);
            const cJSON *part;
            cJSON_ArrayForEach(part, content) {
                const cJSON *pt = cJSON_GetObjectItemCaseSensitive(part, "type");
                if (!cJSON_IsString(pt) || (strcmp(pt->valuestring, "input_text") && strcmp(pt->valuestring, "output_text") &&
                                            strcmp(pt->valuestring, "text")))
                    return api_fail(e, 400, "input", "input[%zu]: content parts of type %.32s are not supported (text only)", i,
                                    cJSON_IsString(pt) ? pt->valuestring : "(none)");
            }
            char *text = parts_text(content);
            if (!text) return api_fail(e, 500, NULL, "out of memory");
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", role->valuestring);
            cJSON_AddStringToObject(m, "content", text);
            free(text);
            cJSON_AddItemToArray(msgs, m);
            last_calls = NULL;
        } else if (!strcmp(ty, "function_call")) {
            const cJSON *call_id = cJSON_GetObjectItemCaseSensitive(item, "call_id");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(item, "name");
            const cJSON *args = cJSON_GetObjectItemCaseSensitive(item, "arguments");
            if (!cJSON_IsString(call_id) || !cJSON_IsString(name) || !cJSON_IsString(args))
                return api_fail(e, 400, "input", "input[%zu]: a function_call needs string call_id, name and arguments", i);
            if (!last_calls) {
                cJSON *m = cJSON_CreateObject();
                cJSON_AddStringToObject(m, "role", "assistant");
                cJSON_AddNullToObject(m, "content");
                last_calls = cJSON_AddArrayToObject(m, "tool_calls");
                cJSON_AddItemToArray(msgs, m);
            }
            cJSON *c = cJSON_CreateObject(), *fn;
            cJSON_AddStringToObject(c, "id", call_id->valuestring);
            cJSON_AddStringToObject(c, "type", "function");
            fn = cJSON_AddObjectToObject(c, "function");
            cJSON_AddStringToObject(fn, "name", name->valuestring);
            cJSON_AddStringToObject(fn, "arguments", args->valuestring);
            cJSON_AddItemToArray(last_calls, c);
        } else if (!strcmp(ty, "function_call_output")) {
            const cJSON *call_id = cJSON_GetObjectItemCaseSensitive(item, "call_id");
            const cJSON *output = cJSON_GetObjectItemCaseSensitive(item, "output");
            if (!cJSON_IsString(call_id) || !(cJSON_IsString(output) || cJSON_IsArray(output)))
                return api_fail(e, 400, "input", "input[%zu]: a function_call_output needs a string call_id and output", i);
            char *text = parts_text(output);
            add_tool_result(msgs, call_id->valuestring, text);
            free(text);
            last_calls = NULL;
        } else if (!strcmp(ty, "reasoning")) {
            last_calls = NULL;   /* the model's earlier reasoning is not shown to it again */
        } else {
            return api_fail(e, 400, "input", "input[%zu]: items of type %.32s are not supported", i, ty);
        }
        i++;
    }
    return true;
}


void responses_req_free(responses_req *q) {
    free(q->chat_body);
    cJSON_Delete(q->history);
    cJSON_Delete(q->echo);
    free(q->previous);
}

bool responses_to_chat(const char *body, size_t len, stored_conversation_fn stored, void *stored_ctx, responses_req *q,
                       api_error *e) {
    memset(q, 0, sizeof *q);
    cJSON *in = cJSON_ParseWithLength(body, len);
    if (!cJSON_IsObject(in)) {
        cJSON_Delete(in);
        return api_fail(e, 400, NULL, "the body is not a JSON object");
    }
    bool ok = true;
    cJSON *out = cJSON_CreateObject();
    q->echo = cJSON_CreateObject();
    const cJSON *v;
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "model"))) cJSON_AddItemToObject(out, "model", cJSON_Duplicate(v, true));
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "max_output_tokens")) && !cJSON_IsNull(v))
        cJSON_AddItemToObject(out, "max_tokens", cJSON_Duplicate(v, true));
    static const char *const same[] = {"temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls", NULL};
    for (const char *const *k = same; *k; k++)
        if ((v = cJSON_GetObjectItemCaseSensitive(in, *k)) && !cJSON_IsNull(v)) cJSON_AddItemToObject(q->echo, *k, cJSON_Duplicate(v, true));
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "temperature"))) cJSON_AddItemToObject(out, "temperature", cJSON_Duplicate(v, true));
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "top_p"))) cJSON_AddItemToObject(out, "top_p", cJSON_Duplicate(v, true));
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "seed"))) cJSON_AddItemToObject(out, "seed", cJSON_Duplicate(v, true));
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "parallel_tool_calls"))) cJSON_AddItemToObject(out, "parallel_tool_calls", cJSON_Duplicate(v, true));
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(in, "stream")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) ok = api_fail(e, 400, "stream", "'stream' must be true or false");
        q->stream = cJSON_IsTrue(v);
    }
    if (ok && (v = cJSON_GetObjectItemCaseSensitive(in, "store")) && !cJSON_IsNull(v)) {
        if (!cJSON_IsBool(v)) ok = api_fail(e, 400, "store", "'store' must be true or false");
        q->store = cJSON_IsTrue(v);
    }
    /* log-probabilities of the output text: include "message.output_text.logprobs" (or top_logprobs);
     * other include values name data quill does not keep (encrypted reasoning...) and are ignored */
    const cJSON *include = cJSON_GetObjectItemCaseSensitive(in, "include");
    if (ok && include && !cJSON_IsNull(include) && !cJSON_IsArray(include))
        ok = api_fail(e, 400, "include", "'include' must be an array of strings");
    bool logprobs = false;
    const cJSON *includes = cJSON_IsArray(include) ? include : NULL;
    cJSON_ArrayForEach(v, includes)
        if (cJSON_IsString(v) && !strcmp(v->valuestring, "message.output_text.logprobs")) logprobs = true;
    if ((v = cJSON_GetObjectItemCaseSensitive(in, "top_logprobs")) && !cJSON_IsNull(v)) {
        cJSON_AddItemToObject(out, "top_logprobs", cJSON_Duplicate(v, true));
        cJSON_AddItemToObject(q->echo, "top_logprobs", cJSON_Duplicate(v, true));
        logprobs = true;
    }
    if (logprobs) cJSON_AddTrueToObject(out, "logprobs");
    const cJSON *reasoning = cJSON_GetObjectItemCaseSensitive(in, "reasoning");
    const cJSON *effort = cJSON_GetObjectItemCaseSensitive(reasoning, "effort");
    if (cJSON_IsString(effort)) cJSON_AddStringToObject(out, "reasoning_effort", effort->valuestring);
    /* tools: Responses' flat function tools to chat's nested ones */
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(in, "tools"), *t;
    if (ok && tools && !cJSON_IsNull(tools)) {
        if (!cJSON_IsArray(tools)) ok = api_fail(e, 400, "tools", "'tools' must be an array");
        cJSON *ot = ok ? cJSON_AddArrayToObject(out, "tools") : NULL;
        size_t i = 0;
        if (ok) cJSON_ArrayForEach(t, tools) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            if (!cJSON_IsString(type) || strcmp(type->valuestring, "function") || !cJSON_IsString(name)) {
                ok = api_fail(e, 400, "tools", "tools[%zu]: only function tools ({\"type\": \"function\", \"name\", ...}) are supported", i);
                break;
            }
            const cJSON *params = cJSON_GetObjectItemCaseSensitive(t, "parameters");
            add_function_tool(ot, name->valuestring, t, cJSON_IsNull(params) ? NULL : params);
            i++;
        }
    }
    const cJSON *choice = cJSON_GetObjectItemCaseSensitive(in, "tool_choice");
    if (ok && choice && !cJSON_IsNull(choice)) {
        if (cJSON_IsObject(choice)) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(choice, "name");
            if (!cJSON_IsString(name)) ok = api_fail(e, 400, "tool_choice", "'tool_choice' as an object needs a 'name'");
            else add_named_tool_choice(out, name->valuestring);
        } else {
            cJSON_AddItemToObject(out, "tool_choice", cJSON_Duplicate(choice, true));
        }
    }
    /* the conversation: a stored one, then the instructions, then the input */
    q->history = cJSON_CreateArray();
    const cJSON *prev = cJSON_GetObjectItemCaseSensitive(in, "previous_response_id");
    if (ok && prev && !cJSON_IsNull(prev)) {
        cJSON *found = cJSON_IsString(prev) && stored ? stored(stored_ctx, prev->valuestring) : NULL;
        if (!found) ok = api_fail(e, 400, "previous_response_id", "no stored response '%.64s' (responses are kept only with \"store\": true)",
                                   cJSON_IsString(prev) ? prev->valuestring : "");
        else {
            cJSON_Delete(q->history);
            q->history = found;
            q->previous = strdup(prev->valuestring);
        }
    }
    const cJSON *input = cJSON_GetObjectItemCaseSensitive(in, "input");
    if (ok && !input) ok = api_fail(e, 400, "input", "'input' is required");
    if (ok) ok = translate_items(input, q->history, e);
    cJSON *msgs = cJSON_AddArrayToObject(out, "messages");
    const cJSON *instructions = cJSON_GetObjectItemCaseSensitive(in, "instructions");
    if (ok && instructions && !cJSON_IsNull(instructions)) {
        if (!cJSON_IsString(instructions)) ok = api_fail(e, 400, "instructions", "'instructions' must be a string");
        else {
            cJSON *m = cJSON_CreateObject();
            cJSON_AddStringToObject(m, "role", "system");
            cJSON_AddStringToObject(m, "content", instructions->valuestring);
            cJSON_AddItemToArray(msgs, m);
            cJSON_AddStringToObject(q->echo, "instructions", instructions->valuestring);
        }
    }
    const cJSON *m;
    if (ok) cJSON_ArrayForEach(m, q->history) cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, true));
    if (ok && !(q->chat_body = cJSON_PrintUnformatted(out))) ok = api_fail(e, 500, NULL, "out of memory");
    cJSON_Delete(out);
    cJSON_Delete(in);
    if (!ok) responses_req_free(q);
    return ok;
}

