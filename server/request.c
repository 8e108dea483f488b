/* A /v1/chat/completions or /v1/completions body to generation parameters. Every known field is
 * checked for type and range and named in the error when wrong (OpenAI's behaviour); unknown
 * fields are ignored, as OpenAI's clients send fields newer than any server. llama-server's
 * extensions keep its names: top_k, min_p, repeat_penalty, repeat_last_n, ignore_eos, grammar,
 * json_schema. Structured outputs (response_format) become a GBNF grammar here, so that a schema
 * the converter cannot honour is a 400 naming the keyword before anything runs. */
#include "server.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* An optional number field in [lo, hi]; `integer` refuses fractions. Absent or null: untouched. */
static bool get_number(const cJSON *o, const char *name, double lo, double hi, bool integer, double *out,
                       bool *present, api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (present) *present = false;
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsNumber(v))
        return api_fail(e, 400, name, "'%s' must be a number%s", name, integer ? " (an integer)" : "");
    double d = v->valuedouble;
    if (!isfinite(d) || (integer && d != floor(d)))
        return api_fail(e, 400, name, "'%s' must be %s", name, integer ? "an integer" : "a finite number");
    if (d < lo || d > hi) return api_fail(e, 400, name, "'%s' is %g; it must be between %g and %g", name, d, lo, hi);
    *out = d;
    if (present) *present = true;
    return true;
}

static bool get_bool(const cJSON *o, const char *name, bool *out, api_error *e) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
    if (!v || cJSON_IsNull(v)) return true;
    if (!cJSON_IsBool(v)) return api_fail(e, 400, name, "'%s' must be true or false", name);
    *out = cJSON_IsTrue(v);
    return true;
}

static char *dup_str(const char *s) {
    size_t n = strlen(s);
    char *d = malloc(n + 1);
    if (d) memcpy(d, s, n + 1);
    return d;
}

/* A message's content: a string, an array of {"type": "text", "text": ...} parts (joined), or
 * null (an assistant turn that only called tools). */
static bool message_content(const cJSON *m, size_t index, char **out, api_error *e) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    if (!c || cJSON_IsNull(c)) {
        *out = dup_str("");
    } else if (cJSON_IsString(c)) {
        *out = dup_str(c->valuestring);
    } else if (cJSON_IsArray(c)) {
        size_t len = 0;
        const cJSON *part;
        cJSON_ArrayForEach(part, c) {
            const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
            const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
            if (!cJSON_IsObject(part) || !cJSON_IsString(type))
                return api_fail(e, 400, "messages", "messages[%zu].content: each part must be an object with a 'type'",
                                index);
            if (strcmp(type->valuestring, "text") != 0)
                return api_fail(e, 400, "messages",
                                "messages[%zu].content: parts of type '%.64s' are not supported (this server takes "
                                "text only)",
                                index, type->valuestring);
            if (!cJSON_IsString(text))
                return api_fail(e, 400, "messages", "messages[%zu].content: a text part needs a string 'text'", index);
            len += strlen(text->valuestring);
        }
        *out = malloc(len + 1);
        if (*out) {
            size_t at = 0;
            cJSON_ArrayForEach(part, c) {
                const char *t = cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring;
                size_t n = strlen(t);
                memcpy(*out + at, t, n);
                at += n;
            }
            (*out)[at] = 0;
        }
    } else {
        return api_fail(e, 400, "messages", "messages[%zu].content must be a string or an array of text parts", index);
    }
    if (!*out) return api_fail(e, 500, NULL, "out of memory");
    return true;
}

static bool parse_messages(const cJSON *root, gen_request *r, api_error *e) {
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!msgs) return api_fail(e, 400, "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return api_fail(e, 400, "messages", "'messages' must be an array");
    int n = cJSON_GetArraySize(msgs);
    if (n == 0) return api_fail(e, 400, "messages", "'messages' must hold at least one message");
    r->msgs = calloc((size_t)n, sizeof *r->msgs);
    if (!r->msgs) return api_fail(e, 500, NULL, "out of memory");
    static const char *const roles[] = {"system", "user", "assistant", "tool", "developer", NULL};
    const cJSON *m;
    cJSON_ArrayForEach(m, msgs) {
        size_t i = r->n_msgs;
        if (!cJSON_IsObject(m)) return api_fail(e, 400, "messages", "messages[%zu] must be an object", i);
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!cJSON_IsString(role)) return api_fail(e, 400, "messages", "messages[%zu].role must be a string", i);
        const char *known = NULL;
        for (const char *const *k = roles; *k; k++)
            if (!strcmp(role->valuestring, *k)) known = *k;
        if (!known)
            return api_fail(e, 400, "messages",
                            "messages[%zu].role '%.64s' is not one of system, user, assistant, tool, developer", i,
                            role->valuestring);
        /* "developer" is the newer name of the system role; templates know "system" */
        char *content = NULL;
        if (!message_content(m, i, &content, e)) return false;
        char *role_copy = dup_str(strcmp(known, "developer") ? known : "system");
        if (!role_copy) {
            free(content);
            return api_fail(e, 500, NULL, "out of memory");
        }
        r->msgs[i] = (quill_chat_message){role_copy, content};
        r->n_msgs++;
    }
    return true;
}

static bool parse_prompt(const cJSON *root, gen_request *r, api_error *e) {
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (!p) return api_fail(e, 400, "prompt", "'prompt' is required");
    /* one prompt per request: ["text"] and [[ids]] are that one prompt in array form */
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    if (cJSON_IsString(p)) {
        if (!(r->prompt = dup_str(p->valuestring))) return api_fail(e, 500, NULL, "out of memory");
        return true;
    }
    if (!cJSON_IsArray(p) || cJSON_GetArraySize(p) == 0)
        return api_fail(e, 400, "prompt", "'prompt' must be a string, or an array of token ids");
    if (!cJSON_IsNumber(p->child))
        return api_fail(e, 400, "prompt",
                        "'prompt' holds several prompts; this server takes one prompt per request");
    size_t n = (size_t)cJSON_GetArraySize(p);
    r->prompt_ids = malloc(n * sizeof *r->prompt_ids);
    if (!r->prompt_ids) return api_fail(e, 500, NULL, "out of memory");
    const cJSON *t;
    cJSON_ArrayForEach(t, p) {
        if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
            t->valuedouble > INT32_MAX)
            return api_fail(e, 400, "prompt", "'prompt' token ids must be non-negative integers");
        r->prompt_ids[r->n_prompt_ids++] = (int32_t)t->valuedouble;
    }
    return true;
}

static bool parse_stop(const cJSON *root, gen_request *r, api_error *e) {
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (!s || cJSON_IsNull(s)) return true;
    if (cJSON_IsString(s)) {
        if (!*s->valuestring) return true;   /* "" stops nothing */
        if (!(r->stop[r->n_stop++] = dup_str(s->valuestring))) return api_fail(e, 500, NULL, "out of memory");
        return true;
    }
    if (!cJSON_IsArray(s)) return api_fail(e, 400, "stop", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(s) > MAX_STOP)
        return api_fail(e, 400, "stop", "'stop' holds %d strings; at most %d are allowed", cJSON_GetArraySize(s),
                        MAX_STOP);
    const cJSON *item;
    cJSON_ArrayForEach(item, s) {
        if (!cJSON_IsString(item)) return api_fail(e, 400, "stop", "'stop' must hold strings only");
        if (!*item->valuestring) continue;
        if (!(r->stop[r->n_stop++] = dup_str(item->valuestring))) return api_fail(e, 500, NULL, "out of memory");
    }
    return true;
}

/* A JSON Schema (a cJSON value) as GBNF in r->grammar. */
static bool schema_grammar(const cJSON *schema, const char *param, gen_request *r, api_error *e) {
    if (!cJSON_IsObject(schema) && !cJSON_IsBool(schema))
        return api_fail(e, 400, param, "the JSON schema in '%s' must be an object", param);
    char *text = cJSON_PrintUnformatted(schema);
    if (!text) return api_fail(e, 500, NULL, "out of memory");
    quill_error err;
    quill_status st = quill_json_schema_to_grammar(text, strlen(text), &r->grammar, &err);
    free(text);
    if (st) return api_fail(e, st == QUILL_E_NOMEM ? 500 : 400, param, "%s: %s", param, err.message);
    r->grammar_param = param;
    return true;
}

/* grammar (GBNF text), response_format ({"type": "text" | "json_object" | "json_schema"}) and
 * llama-server's json_schema: at most one of them constrains the output. */
static bool parse_constraints(const cJSON *root, gen_request *r, api_error *e) {
    const cJSON *grammar = cJSON_GetObjectItemCaseSensitive(root, "grammar");
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "response_format");
    const cJSON *schema = cJSON_GetObjectItemCaseSensitive(root, "json_schema");
    if (grammar && cJSON_IsNull(grammar)) grammar = NULL;
    if (format && cJSON_IsNull(format)) format = NULL;
    if (schema && cJSON_IsNull(schema)) schema = NULL;
    const char *type = NULL;
    if (format) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(format, "type");
        if (!cJSON_IsObject(format) || !cJSON_IsString(t))
            return api_fail(e, 400, "response_format", "'response_format' must be an object with a string 'type'");
        type = t->valuestring;
        if (strcmp(type, "text") && strcmp(type, "json_object") && strcmp(type, "json_schema"))
            return api_fail(e, 400, "response_format",
                            "'response_format.type' is '%.64s'; it must be text, json_object or json_schema", type);
        if (!strcmp(type, "text")) format = NULL;
    }
    if ((grammar != NULL) + (format != NULL) + (schema != NULL) > 1)
        return api_fail(e, 400, grammar ? "grammar" : "response_format",
                        "give one of 'grammar', 'response_format' and 'json_schema', not several");
    if (grammar) {
        if (!cJSON_IsString(grammar)) return api_fail(e, 400, "grammar", "'grammar' must be a string (GBNF)");
        if (!*grammar->valuestring) return true;   /* "" constrains nothing, as in llama-server */
        if (!(r->grammar = dup_str(grammar->valuestring))) return api_fail(e, 500, NULL, "out of memory");
        r->grammar_param = "grammar";
        return true;
    }
    if (schema) return schema_grammar(schema, "json_schema", r, e);
    if (!format) return true;
    if (!strcmp(type, "json_object")) {
        /* any JSON object, or the schema llama-server lets json_object carry */
        const cJSON *inner = cJSON_GetObjectItemCaseSensitive(format, "schema");
        if (inner && !cJSON_IsNull(inner)) return schema_grammar(inner, "response_format", r, e);
        cJSON *object = cJSON_CreateObject();
        bool ok = object && cJSON_AddStringToObject(object, "type", "object") &&
                  schema_grammar(object, "response_format", r, e);
        if (!object) ok = api_fail(e, 500, NULL, "out of memory");
        cJSON_Delete(object);
        return ok;
    }
    const cJSON *wrapper = cJSON_GetObjectItemCaseSensitive(format, "json_schema");
    if (!cJSON_IsObject(wrapper))
        return api_fail(e, 400, "response_format",
                        "'response_format' of type json_schema needs a 'json_schema' object ({\"name\": ..., "
                        "\"schema\": {...}})");
    const cJSON *inner = cJSON_GetObjectItemCaseSensitive(wrapper, "schema");
    if (!inner || cJSON_IsNull(inner)) {
        /* no schema: any JSON value, as the reference reads it */
        cJSON *any = cJSON_CreateObject();
        bool ok = any ? schema_grammar(any, "response_format", r, e) : api_fail(e, 500, NULL, "out of memory");
        cJSON_Delete(any);
        return ok;
    }
    return schema_grammar(inner, "response_format", r, e);
}

static bool parse_fields(const cJSON *root, request_kind kind, const request_limits *lim, gen_request *r,
                         api_error *e) {
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (model && !cJSON_IsNull(model)) {
        if (!cJSON_IsString(model)) return api_fail(e, 400, "model", "'model' must be a string");
        if (!(r->model = dup_str(model->valuestring))) return api_fail(e, 500, NULL, "out of memory");
    }
    if (kind == REQ_CHAT ? !parse_messages(root, r, e) : !parse_prompt(root, r, e)) return false;

    double d;
    bool present;
    const double max_tok = lim->max_tokens > 0 ? (double)lim->max_tokens : (double)(1 << 30);
    r->max_tokens = -1;
    if (kind == REQ_COMPLETION && !get_bool(root, "echo", &r->echo, e)) return false;
    /* max_completion_tokens is the newer name; it wins when both are given. 0 only with echo: the
     * prompt alone, scored (as evaluation harnesses ask) */
    if (!get_number(root, "max_tokens", r->echo ? 0 : 1, max_tok, true, &d, &present, e)) return false;
    if (present) r->max_tokens = (long)d;
    if (!get_number(root, "max_completion_tokens", 1, max_tok, true, &d, &present, e)) return false;
    if (present) r->max_tokens = (long)d;
    if (!get_number(root, "n", 1, 16, true, &d, &present, e)) return false;
    r->n = present ? (int)d : 1;

    quill_sampler_params *sp = &r->sp;
    *sp = quill_sampler_defaults();
    /* OpenAI's range; above 2 the text is noise */
    if (!get_number(root, "temperature", 0, 2, false, &d, &present, e)) return false;
    if (present) sp->temperature = (float)d;
    if (!get_number(root, "top_k", 0, 1 << 30, true, &d, &present, e)) return false;
    if (present) sp->top_k = (int)d;
    if (!get_number(root, "top_p", 0, 1, false, &d, &present, e)) return false;
    if (present) {
        sp->top_p = (float)d;
        if (d == 0) {   /* nothing but the most likely token */
            sp->top_p = 1.0f;
            sp->top_k = 1;
        }
    }
    if (!get_number(root, "presence_penalty", -2, 2, false, &d, &present, e)) return false;
    if (present) sp->presence_penalty = (float)d;
    if (!get_number(root, "frequency_penalty", -2, 2, false, &d, &present, e)) return false;
    if (present) sp->frequency_penalty = (float)d;
    if (!get_number(root, "min_p", 0, 1, false, &d, &present, e)) return false;
    if (present) sp->min_p = (float)d;
    if (!get_number(root, "repeat_penalty", 1e-6, 1e6, false, &d, &present, e)) return false;
    if (present) sp->repeat_penalty = (float)d;
    if (!get_number(root, "repeat_last_n", 0, 1 << 24, true, &d, &present, e)) return false;
    if (present) sp->repeat_last_n = (int)d;
    /* seeds are 64-bit in OpenAI's API and may be negative; they map onto the sampler's u64 */
    if (!get_number(root, "seed", -9.2e18, 1.8e19, true, &d, &present, e)) return false;
    if (present) {
        sp->seed = d < 0 ? (uint64_t)(int64_t)d : (uint64_t)d;
        r->seed_given = true;
    }
    if (!get_bool(root, "ignore_eos", &r->ignore_eos, e)) return false;
    if (!parse_stop(root, r, e)) return false;
    if (!parse_constraints(root, r, e)) return false;
    if (r->grammar && r->ignore_eos)
        return api_fail(e, 400, "ignore_eos", "'ignore_eos' cannot be combined with a grammar or response_format: "
                                              "the grammar decides where the text ends");

    if (!get_bool(root, "stream", &r->stream, e)) return false;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (so && !cJSON_IsNull(so)) {
        if (!cJSON_IsObject(so)) return api_fail(e, 400, "stream_options", "'stream_options' must be an object");
        if (!get_bool(so, "include_usage", &r->include_usage, e)) return false;
    }

    if (kind == REQ_CHAT) {
        if (!get_bool(root, "logprobs", &r->logprobs, e)) return false;
        if (!get_number(root, "top_logprobs", 0, MAX_TOP_LOGPROBS, true, &d, &present, e)) return false;
        if (present) {
            if (!r->logprobs)
                return api_fail(e, 400, "top_logprobs", "'top_logprobs' needs 'logprobs' set to true");
            r->top_logprobs = (int)d;
        }
    } else {
        /* the legacy completions API: logprobs is the number of alternatives */
        if (!get_number(root, "logprobs", 0, 5, true, &d, &present, e)) return false;
        if (present) {
            r->logprobs = true;
            r->top_logprobs = (int)d;
        }
        if (!get_number(root, "best_of", 1, 1, true, &d, &present, e)) return false;
    }
    return true;
}

bool request_parse(const char *body, size_t len, request_kind kind, const request_limits *lim, gen_request *out,
                   api_error *e) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    if (!json_body_check(body, len, lim->max_depth, e)) return false;
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, false);
    if (!root) {
        size_t at = end && end >= body ? (size_t)(end - body) : 0;
        return api_fail(e, 400, NULL, "the request body is not valid JSON (error near byte %zu)", at);
    }
    /* trailing garbage after the object is malformed too */
    for (const char *p = end; p && p < body + len; p++)
        if (*p != ' ' && *p != '\n' && *p != '\r' && *p != '\t') {
            cJSON_Delete(root);
            return api_fail(e, 400, NULL, "the request body is not valid JSON (extra data at byte %zu)",
                            (size_t)(p - body));
        }
    bool ok = cJSON_IsObject(root) ? parse_fields(root, kind, lim, out, e)
                                   : api_fail(e, 400, NULL, "the request body must be a JSON object");
    cJSON_Delete(root);
    if (!ok) request_free(out);
    return ok;
}

void request_free(gen_request *r) {
    if (!r) return;
    free(r->model);
    for (size_t i = 0; i < r->n_msgs; i++) {
        free((char *)r->msgs[i].role);
        free((char *)r->msgs[i].content);
    }
    free(r->msgs);
    free(r->prompt);
    free(r->prompt_ids);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    free(r->grammar);
    memset(r, 0, sizeof *r);
}
