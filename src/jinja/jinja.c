/* Chat-template engine, the entry points (quill_chat_render, _json, _inputs, quill_chat_check): the
 * messages and tools as template values (from C structs or JSON text), the template compiled
 * (jinja_parse.c) and run (jinja_eval.c), the output or the error. The engine's files in layers:
 * this one on top, then evaluation (jinja_eval.c) over the filters, tests and methods
 * (jinja_builtins.c), the parser (jinja_parse.c), and the values (jinja_values.c) at the bottom. */
#include "jinja/jinja_internal.h"
#include "base/utf8.h"

/* ------------------------------------------------------------------ JSON input */

/* Messages and tools arrive as JSON (OpenAI's shapes) and reach the template as Jinja2 sees them
 * after json.loads: objects are dicts in key order, integers stay ints, numbers with a fraction
 * or exponent are floats, null is none. Strict RFC 8259; errors name the byte offset. */

static bool json_err(jsonr *r, const char *why) {
    if (!r->j->failed) {
        r->j->failed = true;
        r->j->status = QUILL_E_ARG;
        snprintf(r->j->msg, sizeof r->j->msg, "%s: not valid JSON or not of the expected shape (%s at byte %zu)",
                 r->what, why, (size_t)(r->p - r->s));
    }
    return false;
}

static void json_ws(jsonr *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static bool json_string(jsonr *r, jv *out) {
    r->p++; /* the opening quote */
    jbuf b = {0};
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20) { jj_bfree(&b); return json_err(r, "control character in a string"); }
        if (c != '\\') {
            if (!jj_bput(r->j, &b, r->p, 1)) { jj_bfree(&b); return false; }
            r->p++;
            continue;
        }
        if (r->end - r->p < 2) break;
        char e = r->p[1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            if (!jj_bput(r->j, &b, &map[simple - "\"\\/bfnrt"], 1)) { jj_bfree(&b); return false; }
            r->p += 2;
            continue;
        }
        if (e != 'u' || r->end - r->p < 6) { jj_bfree(&b); return json_err(r, "bad escape in a string"); }
        int cp = hex4_value(r->p + 2);
        r->p += 6;
        if (cp < 0) { jj_bfree(&b); return json_err(r, "bad \\u escape"); }
        if (cp >= 0xD800 && cp <= 0xDBFF && r->end - r->p >= 6 && r->p[0] == '\\' && r->p[1] == 'u') {
            int lo = hex4_value(r->p + 2);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                r->p += 6;
            }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate is not text */
        char u[4];
        size_t n = jj_u8enc((uint32_t)cp, u);
        if (!jj_bput(r->j, &b, u, n)) { jj_bfree(&b); return false; }
    }
    if (r->p >= r->end) { jj_bfree(&b); return json_err(r, "unterminated string"); }
    r->p++;
    return jj_buf_to_str(r->j, &b, out);
}

static bool json_number(jsonr *r, jv *out) {
    const char *start = r->p;
    bool is_float = false;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (r->p >= r->end || *r->p < '0' || *r->p > '9') return json_err(r, "bad number");
    if (*r->p == '0') r->p++;
    else while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    if (r->p < r->end && *r->p == '.') {
        is_float = true;
        r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return json_err(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        is_float = true;
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return json_err(r, "bad number");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    char tmp[64];
    size_t n = (size_t)(r->p - start);
    if (n >= sizeof tmp) is_float = true; /* beyond int64: Python would keep it exact; a float is close */
    if (n >= sizeof tmp) n = sizeof tmp - 1;
    memcpy(tmp, start, n);
    tmp[n] = 0;
    if (!is_float) {
        errno = 0;
        long long v = strtoll(tmp, NULL, 10);
        if (errno == 0) {
            *out = mk_int(v);
            return true;
        }
    }
    *out = mk_float(strtod(tmp, NULL));
    return true;
}

static bool json_value(jsonr *r, jv *out);

static bool json_container(jsonr *r, jv *out) {
    bool is_obj = *r->p == '{';
    char close = is_obj ? '}' : ']';
    if (++r->depth > MAX_NEST) return json_err(r, "nested too deeply");
    r->p++;
    jlist *l = is_obj ? NULL : jj_list_new(r->j, 4);
    jdict *d = is_obj ? jj_dict_new(r->j) : NULL;
    if (!l && !d) return false;
    jv self = is_obj ? dict_val(d) : list_val(l);
    json_ws(r);
    bool first = true;
    while (r->p < r->end && *r->p != close) {
        if (!first) {
            if (*r->p != ',') { jj_unref(self); return json_err(r, is_obj ? "expected ',' or '}'" : "expected ',' or ']'"); }
            r->p++;
            json_ws(r);
        }
        first = false;
        jv k = mk_undef(), v;
        if (is_obj) {
            if (r->p >= r->end || *r->p != '"') { jj_unref(self); return json_err(r, "expected a string key"); }
            if (!json_string(r, &k)) { jj_unref(self); return false; }
            json_ws(r);
            if (r->p >= r->end || *r->p != ':') { jj_unref(k); jj_unref(self); return json_err(r, "expected ':'"); }
            r->p++;
        }
        if (!json_value(r, &v)) { jj_unref(k); jj_unref(self); return false; }
        if (!(is_obj ? jj_dict_set(r->j, d, k, v) : jj_list_push(r->j, l, v))) { jj_unref(self); return false; }
        json_ws(r);
    }
    if (r->p >= r->end) { jj_unref(self); return json_err(r, is_obj ? "unterminated object" : "unterminated array"); }
    r->p++;
    r->depth--;
    *out = self;
    return true;
}

static bool json_value(jsonr *r, jv *out) {
    json_ws(r);
    if (r->p >= r->end) return json_err(r, "unexpected end");
    if (!jj_charge(r->j, 1)) return false;
    char c = *r->p;
    if (c == '{' || c == '[') return json_container(r, out);
    if (c == '"') return json_string(r, out);
    if (c == '-' || (c >= '0' && c <= '9')) return json_number(r, out);
    static const struct { const char *word; uint8_t t; bool b; } words[] = {
        {"true", T_BOOL, true}, {"false", T_BOOL, false}, {"null", T_NONE, false}};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(r->end - r->p) >= n && !memcmp(r->p, words[i].word, n)) {
            r->p += n;
            *out = words[i].t == T_BOOL ? mk_bool(words[i].b) : mk_none();
            return true;
        }
    }
    return json_err(r, "unexpected character");
}

/* Parses a whole JSON text that must be an array (or, when `allow_object`, an object). */
static bool json_parse_list(J *j, const char *what, const char *text, jv *out, bool allow_object) {
    jsonr r = {j, what, text, text, text + strlen(text), 0};
    json_ws(&r);
    if (r.p >= r.end || (*r.p != '[' && !(allow_object && *r.p == '{')))
        return json_err(&r, allow_object ? "expected a list or an object" : "expected a list");
    if (!json_value(&r, out)) return false;
    json_ws(&r);
    if (r.p != r.end) {
        jj_unref(*out);
        *out = mk_undef();
        return json_err(&r, "text after the list");
    }
    return true;
}

/* The end of a render: the output (an empty string when nothing was written) or the error. */
static quill_status render_finish(J *j, jbuf *b, char **out, quill_error *err) {
    if (!j->failed && !b->p) {
        b->p = malloc(1);
        if (b->p) b->p[0] = 0;
        else jj_nomem(j);
    }
    jj_cleanup(j);
    if (j->failed) {
        jj_bfree(b);
        jj_set_err(err, j->status, j->msg);
        return j->status;
    }
    *out = b->p;
    return QUILL_OK;
}

quill_status quill_chat_render(const char *template_src, const quill_chat_message *msgs, size_t n_msgs,
                               const char *bos_token, const char *eos_token, bool add_generation_prompt,
                               char **out, quill_error *err) {
    if (out) *out = NULL;
    if (!template_src || !out || (n_msgs && !msgs)) {
        jj_set_err(err, QUILL_E_ARG, "quill_chat_render: template, messages and out must not be NULL");
        return QUILL_E_ARG;
    }
    for (size_t i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content) {
            char m[128];
            snprintf(m, sizeof m, "quill_chat_render: message %zu has a NULL role or content", i);
            jj_set_err(err, QUILL_E_ARG, m);
            return QUILL_E_ARG;
        }
    J j;
    memset(&j, 0, sizeof j);
    node *root = jj_compile(&j, template_src);
    jbuf b = {0};
    if (root && !j.failed) {
        scope *g = jj_scope_new(&j, NULL);
        if (g) {
            jj_capture(&j, g);
            jlist *ml = jj_list_new(&j, n_msgs);
            bool ok = ml != NULL;
            if (ok) ok = jj_scope_set(&j, g, "messages", list_val(ml));
            for (size_t i = 0; ok && i < n_msgs; i++) {
                jdict *d = jj_dict_new(&j);
                jv r, c;
                ok = d && jj_list_push(&j, ml, dict_val(d)) && jj_mk_str(&j, msgs[i].role, &r) &&
                     jj_dict_set_cstr(&j, d, "role", r) && jj_mk_str(&j, msgs[i].content, &c) &&
                     jj_dict_set_cstr(&j, d, "content", c);
            }
            ok = ok && jj_set_str(&j, g, "bos_token", bos_token) && jj_set_str(&j, g, "eos_token", eos_token) &&
                 jj_scope_set(&j, g, "add_generation_prompt", mk_bool(add_generation_prompt));
            if (ok) jj_exec(&j, root, g, &b);
        }
    }
    return render_finish(&j, &b, out, err);
}

quill_status quill_chat_render_json(const char *template_src, const char *messages_json, const char *tools_json,
                                    const char *bos_token, const char *eos_token, bool add_generation_prompt,
                                    char **out, quill_error *err) {
    quill_chat_inputs in = {.messages_json = messages_json, .tools_json = tools_json, .bos_token = bos_token,
                            .eos_token = eos_token, .add_generation_prompt = add_generation_prompt};
    return quill_chat_render_inputs(template_src, &in, out, err);
}

static void fail_arg(J *j, const char *msg) {
    j->failed = true;
    j->status = QUILL_E_ARG;
    snprintf(j->msg, sizeof j->msg, "%s", msg);
}

/* Each member of `extra` becomes a variable, unless it would hide one of the render's own. */
static bool set_extra_vars(J *j, scope *g, jv extra) {
    static const char *const reserved[] = {"messages", "tools", "bos_token", "eos_token", "add_generation_prompt", NULL};
    for (size_t i = 0; i < extra.u.d->n; i++) {
        jv k = extra.u.d->e[i].k;
        if (k.t != T_STR || jj_in_list(reserved, k.u.s->s)) continue;
        if (!jj_scope_set(j, g, k.u.s->s, ref(extra.u.d->e[i].v))) return false;
    }
    return true;
}

quill_status quill_chat_render_inputs(const char *template_src, const quill_chat_inputs *in, char **out,
                                      quill_error *err) {
    if (out) *out = NULL;
    if (!template_src || !in || !in->messages_json || !out) {
        jj_set_err(err, QUILL_E_ARG, "quill_chat_render_inputs: template, inputs, messages and out must not be NULL");
        return QUILL_E_ARG;
    }
    J j;
    memset(&j, 0, sizeof j);
    j.has_now = in->has_now;
    j.now = in->now;
    jbuf b = {0};
    jv messages = mk_undef(), tools = mk_undef(), extra = mk_undef();
    /* The inputs are checked before the template, so a bad message is reported as such. */
    bool parsed = json_parse_list(&j, "messages", in->messages_json, &messages, true) &&
                  (!in->tools_json || json_parse_list(&j, "tools", in->tools_json, &tools, false)) &&
                  (!in->extra_json || json_parse_list(&j, "template variables", in->extra_json, &extra, true));
    if (parsed && extra.t == T_LIST) {
        fail_arg(&j, "template variables: expected a JSON object");
        parsed = false;
    }
    if (parsed && messages.t == T_DICT) {
        /* a request body: {"messages": [...], "tools": [...]} */
        jv body = messages;
        const jv *m = jj_dict_get_str(body.u.d, "messages"), *t = jj_dict_get_str(body.u.d, "tools");
        messages = m && m->t == T_LIST ? ref(*m) : mk_undef();
        if (t && t->t == T_LIST && tools.t == T_UNDEF) tools = ref(*t);
        jj_unref(body);
        if (messages.t == T_UNDEF) {
            fail_arg(&j, "messages: an object must hold a \"messages\" list");
            parsed = false;
        }
    }
    if (parsed) {
        for (size_t i = 0; i < messages.u.l->n && !j.failed; i++) {
            jv m = messages.u.l->v[i];
            const jv *role = m.t == T_DICT ? jj_dict_get_str(m.u.d, "role") : NULL;
            if (!role || role->t != T_STR) {
                char msg[96];
                snprintf(msg, sizeof msg, "messages: message %zu needs a string \"role\"", i);
                fail_arg(&j, msg);
            }
        }
        j.steps = 0;
        node *root = j.failed ? NULL : jj_compile(&j, template_src);
        if (root && !j.failed) {
            scope *g = jj_scope_new(&j, NULL);
            if (g) {
                jj_capture(&j, g);
                bool ok = extra.t != T_DICT || set_extra_vars(&j, g, extra);
                ok = ok && jj_scope_set(&j, g, "messages", messages);
                messages = mk_undef();
                if (ok && tools.t != T_UNDEF) {
                    ok = jj_scope_set(&j, g, "tools", tools);
                    tools = mk_undef();
                }
                ok = ok && jj_set_str(&j, g, "bos_token", in->bos_token) && jj_set_str(&j, g, "eos_token", in->eos_token) &&
                     jj_scope_set(&j, g, "add_generation_prompt", mk_bool(in->add_generation_prompt));
                if (ok) jj_exec(&j, root, g, &b);
            }
        }
    }
    jj_unref(messages);
    jj_unref(tools);
    jj_unref(extra);
    return render_finish(&j, &b, out, err);
}

quill_status quill_chat_check(const char *template_src, quill_error *err) {
    if (!template_src) {
        jj_set_err(err, QUILL_E_ARG, "quill_chat_check: template must not be NULL");
        return QUILL_E_ARG;
    }
    J j;
    memset(&j, 0, sizeof j);
    jj_compile(&j, template_src);
    jj_cleanup(&j);
    if (j.failed) {
        jj_set_err(err, j.status, j.msg);
        return j.status;
    }
    return QUILL_OK;
}

