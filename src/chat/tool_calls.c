/* Tool calls and reasoning in generated text (see tool_calls.h). Every parse starts from the
 * beginning of the reply: replies are short next to the work of generating them, and a parse of the
 * whole text is what makes a stream's deltas add up to the final reply exactly. */
#include "chat/tool_calls.h"

#include "base/error.h"
#include "base/strbuf.h"
#include "base/utf8.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ detection */

chat_syntax chat_syntax_detect(const char *src) {
    chat_syntax s = {TOOL_SYNTAX_GENERIC, false};
    if (!src) return s;
    s.think_tags = strstr(src, "<think>") != NULL;
    /* The order matters: more specific marks first (Qwen3-Coder's template also has <tool_call>). */
    if (strstr(src, "<|channel|>")) s.tools = TOOL_SYNTAX_GPT_OSS;
    else if (strstr(src, "<tool_call>") && strstr(src, "<function=") && strstr(src, "<parameter=")) s.tools = TOOL_SYNTAX_QWEN3_CODER;
    else if (strstr(src, "<tool_call>")) s.tools = TOOL_SYNTAX_HERMES;
    else if (strstr(src, "tool\xe2\x96\x81" "calls\xe2\x96\x81" "begin")) s.tools = TOOL_SYNTAX_DEEPSEEK_V3;
    else if (strstr(src, "[TOOL_CALLS]")) s.tools = TOOL_SYNTAX_MISTRAL;
    else if (strstr(src, "<|start_header_id|>") && strstr(src, "ipython")) s.tools = TOOL_SYNTAX_LLAMA3;
    return s;
}

const char *tool_syntax_name(tool_syntax s) {
    switch (s) {
    case TOOL_SYNTAX_HERMES: return "hermes";
    case TOOL_SYNTAX_LLAMA3: return "llama3";
    case TOOL_SYNTAX_MISTRAL: return "mistral";
    case TOOL_SYNTAX_GPT_OSS: return "gpt-oss";
    case TOOL_SYNTAX_DEEPSEEK_V3: return "deepseek-v3";
    case TOOL_SYNTAX_QWEN3_CODER: return "qwen3-coder";
    case TOOL_SYNTAX_GENERIC: break;
    }
    return "generic";
}

/* ------------------------------------------------------------------ JSON scanning */

typedef enum { J_OK, J_MORE, J_BAD } jscan;

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

static size_t skip_ws(const char *s, size_t n, size_t i) {
    while (i < n && is_ws(s[i])) i++;
    return i;
}

static bool is_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

static jscan scan_string(const char *s, size_t n, size_t *i) {
    size_t k = *i + 1;
    while (k < n) {
        unsigned char c = (unsigned char)s[k];
        if (c == '"') {
            *i = k + 1;
            return J_OK;
        }
        if (c < 0x20) return J_BAD;
        if (c == '\\') {
            if (k + 1 >= n) return J_MORE;
            char e = s[k + 1];
            if (e == 'u') {
                for (size_t h = 0; h < 4; h++) {
                    if (k + 2 + h >= n) return J_MORE;
                    if (!is_hex(s[k + 2 + h])) return J_BAD;
                }
                k += 6;
                continue;
            }
            if (!strchr("\"\\/bfnrt", e)) return J_BAD;
            k += 2;
            continue;
        }
        k++;
    }
    return J_MORE;
}

static jscan scan_number(const char *s, size_t n, size_t *i) {
    size_t k = *i;
    if (k < n && s[k] == '-') k++;
    if (k >= n) return J_MORE;
    if (s[k] == '0') k++;
    else if (s[k] >= '1' && s[k] <= '9') while (k < n && s[k] >= '0' && s[k] <= '9') k++;
    else return J_BAD;
    if (k < n && s[k] == '.') {
        k++;
        if (k >= n) return J_MORE;
        if (!(s[k] >= '0' && s[k] <= '9')) return J_BAD;
        while (k < n && s[k] >= '0' && s[k] <= '9') k++;
    }
    if (k < n && (s[k] == 'e' || s[k] == 'E')) {
        k++;
        if (k < n && (s[k] == '+' || s[k] == '-')) k++;
        if (k >= n) return J_MORE;
        if (!(s[k] >= '0' && s[k] <= '9')) return J_BAD;
        while (k < n && s[k] >= '0' && s[k] <= '9') k++;
    }
    /* a number at the end of the text may still grow */
    *i = k;
    return k == n ? J_MORE : J_OK;
}

enum { MAX_JSON_DEPTH = 64 };

static jscan scan_value(const char *s, size_t n, size_t *i, int depth) {
    size_t k = skip_ws(s, n, *i);
    if (k >= n) return J_MORE;
    if (depth > MAX_JSON_DEPTH) return J_BAD;
    char c = s[k];
    jscan r;
    if (c == '"') {
        r = scan_string(s, n, &k);
    } else if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        k = skip_ws(s, n, k + 1);
        if (k >= n) return J_MORE;
        if (s[k] == close) {
            *i = k + 1;
            return J_OK;
        }
        for (;;) {
            if (c == '{') {
                k = skip_ws(s, n, k);
                if (k >= n) return J_MORE;
                if (s[k] != '"') return J_BAD;
                if ((r = scan_string(s, n, &k)) != J_OK) return r;
                k = skip_ws(s, n, k);
                if (k >= n) return J_MORE;
                if (s[k++] != ':') return J_BAD;
            }
            if ((r = scan_value(s, n, &k, depth + 1)) != J_OK) return r;
            k = skip_ws(s, n, k);
            if (k >= n) return J_MORE;
            if (s[k] == close) {
                *i = k + 1;
                return J_OK;
            }
            if (s[k++] != ',') return J_BAD;
        }
    } else if (c == '-' || (c >= '0' && c <= '9')) {
        r = scan_number(s, n, &k);
    } else {
        static const char *const words[] = {"true", "false", "null"};
        for (size_t w = 0; w < 3; w++) {
            size_t len = strlen(words[w]);
            size_t have = n - k < len ? n - k : len;
            if (!memcmp(s + k, words[w], have)) {
                if (have < len) return J_MORE;
                *i = k + len;
                return J_OK;
            }
        }
        return J_BAD;
    }
    if (r == J_OK || (r == J_MORE && c != '"')) *i = k;
    return r;
}

size_t json_value_span(const char *s, size_t n, bool *incomplete) {
    size_t i = 0;
    jscan r = scan_value(s, n, &i, 0);
    if (incomplete) *incomplete = r == J_MORE;
    return r == J_OK ? i : 0;
}

/* Whether s[0..n) is exactly one JSON value (a number at the very end counts as finished). */
static bool is_whole_json(const char *s, size_t n) {
    char *copy = malloc(n + 2);
    if (!copy) return false;
    memcpy(copy, s, n);
    copy[n] = ' ';
    copy[n + 1] = 0;
    bool more;
    size_t span = json_value_span(copy, n + 1, &more);
    free(copy);
    return span == n;
}

/* The text of a whole JSON string s[0..n) (quotes included), unescaped; lone surrogates become
 * U+FFFD. */
static char *json_unescape(const char *s, size_t n) {
    strbuf b = {0};
    for (size_t k = 1; k + 1 < n; k++) {
        if (s[k] != '\\') {
            strbuf_put(&b, s + k, 1);
            continue;
        }
        char e = s[++k];
        if (e == 'u') {
            uint32_t cp = (uint32_t)hex4_value(s + k + 1);   /* scanned before: 4 hex digits */
            k += 4;
            if (cp >= 0xD800 && cp < 0xDC00 && k + 6 < n && s[k + 1] == '\\' && s[k + 2] == 'u') {
                int lo = hex4_value(s + k + 3);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + ((uint32_t)lo - 0xDC00);
                    k += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
            char bytes[4];
            strbuf_put(&b, bytes, utf8_encode(cp, bytes));
            continue;
        }
        const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
        char o = to[strchr(from, e) - from];
        strbuf_put(&b, &o, 1);
    }
    return strbuf_take(&b);
}

/* Text as a JSON string literal (quotes included, unless `open`: then the closing quote is left
 * for later). */
static void json_quote(strbuf *b, const char *s, size_t n, bool open) {
    strbuf_put(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            strbuf_put(b, esc, 2);
        } else if (c == '\n') strbuf_puts(b, "\\n");
        else if (c == '\t') strbuf_puts(b, "\\t");
        else if (c == '\r') strbuf_puts(b, "\\r");
        else if (c < 0x20) strbuf_printf(b, "\\u%04x", c);
        else strbuf_put(b, s + i, 1);
    }
    if (!open) strbuf_put(b, "\"", 1);
}

/* ------------------------------------------------------------------ the parse being built */

typedef struct parser {
    const chat_parse_options *opt;
    strbuf content, reasoning;
    parsed_call *calls;
    size_t n_calls, cap_calls;
    bool nomem, dropped;
    const char *end;        /* of the whole text */
    bool content_at_end;    /* the content's last piece reached the end of the text */
    bool reasoning_at_end;  /* likewise the reasoning's */
} parser;

static char *dup_n(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (p) {
        memcpy(p, s, n);
        p[n] = 0;
    }
    return p;
}

/* Takes ownership of name, arguments and id. */
static void add_call(parser *ps, char *name, char *arguments, char *id, bool complete) {
    if (!name || !arguments) ps->nomem = true;
    if (!ps->nomem && ps->n_calls == ps->cap_calls) {
        size_t cap = ps->cap_calls ? ps->cap_calls * 2 : 4;
        parsed_call *c = realloc(ps->calls, cap * sizeof *c);
        if (!c) ps->nomem = true;
        else {
            ps->calls = c;
            ps->cap_calls = cap;
        }
    }
    if (ps->nomem) {
        free(name);
        free(arguments);
        free(id);
        return;
    }
    ps->calls[ps->n_calls++] = (parsed_call){name, arguments, id, complete};
}

static bool starts(const char *s, size_t n, size_t i, const char *lit) {
    size_t len = strlen(lit);
    return n - i >= len && !memcmp(s + i, lit, len);
}

/* Position of `lit` in s[from..n), or n. */
static size_t find(const char *s, size_t n, size_t from, const char *lit) {
    size_t len = strlen(lit);
    for (size_t i = from; i + len <= n; i++)
        if (!memcmp(s + i, lit, len)) return i;
    return n;
}

/* How many bytes at the end of s[0..n) could begin `lit` (a proper prefix of it). */
static size_t tail_prefix(const char *s, size_t n, const char *lit) {
    size_t len = strlen(lit);
    for (size_t k = len - 1 < n ? len - 1 : n; k > 0; k--)
        if (!memcmp(s + n - k, lit, k)) return k;
    return 0;
}

/* Whether the end of the text may still become a mark (generation goes on, or was cut off). */
static bool holds_tail(const parser *ps) { return ps->opt->partial || ps->opt->cut; }

/* Content text; while generating, the end that could begin `mark` is held back. */
static void put_content(parser *ps, const char *s, size_t n, const char *mark) {
    ps->content_at_end = s + n == ps->end;
    if (holds_tail(ps) && mark) n -= tail_prefix(s, n, mark);
    strbuf_put(&ps->content, s, n);
}

/* Call syntax that makes no whole call: it is neither a call nor text. */
static void drop(parser *ps, size_t n) {
    if (n) ps->dropped = true;
}

static size_t rtrim(const char *s, size_t n) {
    while (n && is_ws(s[n - 1])) n--;
    return n;
}

/* A call object {"name": ..., <args_key>: {...}, "id": ...} at s[*i..n). J_OK: a whole call;
 * J_MORE: the text ends inside it (a call with a known name is added as incomplete); J_BAD: not
 * a call. */
static jscan read_call_object(parser *ps, const char *s, size_t n, size_t *i, const char *args_key, const char *alt_key) {
    size_t k = skip_ws(s, n, *i);
    if (k >= n) return J_MORE;
    if (s[k] != '{') return J_BAD;
    k++;
    char *name = NULL, *id = NULL;
    size_t args_at = 0, args_end = 0;
    bool args_open = false;
    jscan r = J_MORE;
    for (;;) {
        k = skip_ws(s, n, k);
        if (k >= n) { r = J_MORE; break; }   /* also after a comma: r still holds the last value's scan */
        if (s[k] == '}' && !args_open) {
            r = name && args_end ? J_OK : J_BAD;
            k++;
            break;
        }
        if (s[k] != '"') { r = J_BAD; break; }
        size_t key_at = k;
        if ((r = scan_string(s, n, &k)) != J_OK) break;
        char *key = json_unescape(s + key_at, k - key_at);
        if (!key) { ps->nomem = true; r = J_BAD; break; }
        k = skip_ws(s, n, k);
        if (k >= n) { free(key); r = J_MORE; break; }
        if (s[k++] != ':') { free(key); r = J_BAD; break; }
        k = skip_ws(s, n, k);
        size_t v_at = k;
        r = scan_value(s, n, &k, 1);
        bool is_args = !strcmp(key, args_key) || (alt_key && !strcmp(key, alt_key));
        if (is_args && v_at < n && s[v_at] != '{') r = J_BAD;
        if (r == J_BAD) { free(key); break; }
        if (is_args) {
            args_at = v_at;
            args_end = r == J_OK ? k : n;
            args_open = r == J_MORE;
        } else if (r == J_OK && !strcmp(key, "name") && s[v_at] == '"') {
            free(name);
            name = json_unescape(s + v_at, k - v_at);
        } else if (r == J_OK && !strcmp(key, "id") && s[v_at] == '"') {
            free(id);
            id = json_unescape(s + v_at, k - v_at);
        }
        free(key);
        if (r == J_MORE) break;
        k = skip_ws(s, n, k);
        if (k >= n) { r = J_MORE; break; }
        if (s[k] == ',') { k++; continue; }
        if (s[k] == '}') continue;
        r = J_BAD;
        break;
    }
    if (r == J_BAD || (r == J_MORE && !ps->opt->partial) || (r == J_MORE && !name)) {
        free(name);
        free(id);
        return r == J_MORE && !ps->opt->partial ? J_BAD : r;
    }
    char *args = args_end ? dup_n(s + args_at, rtrim(s + args_at, args_end - args_at)) : dup_n("", 0);
    add_call(ps, name, args, id, r == J_OK);
    *i = k;
    return r;
}

/* ------------------------------------------------------------------ reasoning */

/* <think>...</think> at the start (or, when the prompt opened it, everything up to </think>):
 * returns where the rest of the reply begins. */
static size_t take_think(parser *ps, const chat_syntax *syn, const char *s, size_t n) {
    if (!syn->think_tags || !ps->opt->extract_reasoning) return 0;
    size_t at = skip_ws(s, n, 0);
    if (!ps->opt->thinking_open) {
        if (ps->opt->partial && n - at < 7 && !memcmp(s + at, "<think>", n - at)) return n;   /* could open it */
        if (!starts(s, n, at, "<think>")) return 0;
        at += 7;
    }
    size_t end = find(s, n, at, "</think>");
    if (end == n) {
        size_t keep = ps->opt->partial ? n - tail_prefix(s, n, "</think>") : n;
        ps->reasoning_at_end = true;
        strbuf_put(&ps->reasoning, s + skip_ws(s, keep, at), keep - skip_ws(s, keep, at));
        return n;
    }
    size_t from = skip_ws(s, end, at);
    strbuf_put(&ps->reasoning, s + from, rtrim(s + from, end - from));
    return skip_ws(s, n, end + 8);
}

/* ------------------------------------------------------------------ the syntaxes */

static void parse_hermes(parser *ps, const char *s, size_t n) {
    static const char open[] = "<tool_call>", close[] = "</tool_call>";
    size_t at = find(s, n, 0, open);
    put_content(ps, s, at == n ? n : rtrim(s, at), at == n ? open : NULL);
    size_t i = at;
    while (i < n && starts(s, n, i, open)) {
        size_t k = i + strlen(open);
        jscan r = read_call_object(ps, s, n, &k, "arguments", "parameters");
        if (r == J_MORE) return;
        if (r == J_BAD) break;
        k = skip_ws(s, n, k);
        if (ps->opt->partial && k < n && n - k < strlen(close) && !memcmp(s + k, close, n - k)) return;
        if (k >= n && ps->opt->partial) return;
        if (starts(s, n, k, close)) k += strlen(close);
        i = skip_ws(s, n, k);
    }
    drop(ps, n - i);   /* what follows the calls, or a malformed or cut-off one */
}

static void parse_qwen3_coder(parser *ps, const char *s, size_t n) {
    static const char open[] = "<tool_call>";
    size_t at = find(s, n, 0, open);
    put_content(ps, s, at == n ? n : rtrim(s, at), at == n ? open : NULL);
    size_t i = at;
    while (i < n && starts(s, n, i, open)) {
        size_t k = skip_ws(s, n, i + strlen(open));
        if (!starts(s, n, k, "<function=")) {
            if (ps->opt->partial && n - k < 10) return;
            break;
        }
        k += 10;
        size_t name_end = find(s, n, k, ">");
        if (name_end == n) return;
        char *name = dup_n(s + k, name_end - k);
        strbuf args = {0};
        strbuf_put(&args, "{", 1);
        bool first = true, complete = false;
        k = skip_ws(s, n, name_end + 1);
        for (;;) {
            if (starts(s, n, k, "</function>")) {
                k = skip_ws(s, n, k + 11);
                if (starts(s, n, k, "</tool_call>")) k += 12;
                complete = true;
                break;
            }
            if (!starts(s, n, k, "<parameter=")) break;
            size_t pname = k + 11, pname_end = find(s, n, pname, ">");
            if (pname_end == n) break;
            size_t v = pname_end + 1;
            if (v < n && s[v] == '\n') v++;
            size_t v_end = find(s, n, v, "</parameter>");
            if (v_end == n) break;
            size_t vlen = v_end - v;
            if (vlen && s[v + vlen - 1] == '\n') vlen--;
            if (!first) strbuf_put(&args, ", ", 2);
            first = false;
            json_quote(&args, s + pname, pname_end - pname, false);
            strbuf_put(&args, ": ", 2);
            if (vlen && s[v] != '"' && is_whole_json(s + v, vlen)) strbuf_put(&args, s + v, vlen);
            else json_quote(&args, s + v, vlen, false);
            k = skip_ws(s, n, v_end + 12);
        }
        if (complete) strbuf_put(&args, "}", 1);
        if (args.oom) ps->nomem = true;
        if (!complete && !ps->opt->partial) {
            free(name);
            free(args.buf);
            break;
        }
        add_call(ps, name, strbuf_take(&args), NULL, complete);
        if (!complete) return;
        i = skip_ws(s, n, k);
    }
    drop(ps, n - i);
}

/* Llama 3.1: a reply that is a call object, or text and then a call: from the first `{"name":`
 * (the grammar's trigger) or <|python_tag|> on, the reply is the call. */
static void parse_llama3(parser *ps, const char *s, size_t n) {
    static const char tag[] = "<|python_tag|>", json_mark[] = "{\"name\":";
    size_t at = skip_ws(s, n, 0);
    if (at < n && s[at] == '{') {
        size_t k = at;
        size_t first = ps->n_calls;
        jscan r = read_call_object(ps, s, n, &k, "parameters", "arguments");
        if (r == J_OK && skip_ws(s, n, k) == n) return;
        if (r == J_MORE) return;
        /* not a call after all: the text is the answer */
        for (size_t c = first; c < ps->n_calls; c++) {
            free(ps->calls[c].name);
            free(ps->calls[c].arguments);
            free(ps->calls[c].id);
        }
        ps->n_calls = first;
    }
    size_t t = find(s, n, 0, tag), j = find(s, n, 0, json_mark);
    if (t == n && j == n) {
        size_t keep = n;
        if (holds_tail(ps)) {
            size_t a1 = tail_prefix(s, n, tag), a2 = tail_prefix(s, n, json_mark);
            keep -= a1 > a2 ? a1 : a2;
        }
        put_content(ps, s, keep, NULL);
        return;
    }
    if (j < t) {
        put_content(ps, s, rtrim(s, j), NULL);
        size_t k = j;
        jscan r = read_call_object(ps, s, n, &k, "parameters", "arguments");
        if (r == J_MORE) return;
        drop(ps, r == J_OK ? n - skip_ws(s, n, k) : n - j);
        return;
    }
    put_content(ps, s, rtrim(s, t), NULL);
    size_t k = skip_ws(s, n, t + strlen(tag));
    if (k < n && s[k] == '{') {
        size_t c = k;
        jscan r = read_call_object(ps, s, n, &c, "parameters", "arguments");
        if (r == J_OK) drop(ps, n - skip_ws(s, n, c));
        if (r != J_BAD) return;
    }
    /* code for the built-in interpreter */
    if (k >= n && ps->opt->partial) return;
    size_t end = rtrim(s, n);
    strbuf args = {0};
    strbuf_puts(&args, "{\"code\": ");
    json_quote(&args, s + k, end > k ? end - k : 0, ps->opt->partial);
    if (!ps->opt->partial) strbuf_put(&args, "}", 1);
    if (args.oom) ps->nomem = true;
    add_call(ps, dup_n("python", 6), strbuf_take(&args), NULL, !ps->opt->partial);
}

static void parse_mistral(parser *ps, const char *s, size_t n) {
    static const char tag[] = "[TOOL_CALLS]";
    size_t at = find(s, n, 0, tag);
    put_content(ps, s, at == n ? n : rtrim(s, at), at == n ? tag : NULL);
    while (at < n) {
        size_t k = skip_ws(s, n, at + strlen(tag));
        if (k >= n) {
            if (!ps->opt->partial) drop(ps, n - at);
            return;
        }
        if (s[k] == '[') {
            k++;
            for (;;) {
                jscan r = read_call_object(ps, s, n, &k, "arguments", "parameters");
                if (r != J_OK) {
                    if (r == J_BAD) drop(ps, n - at);
                    return;
                }
                k = skip_ws(s, n, k);
                if (k < n && s[k] == ',') { k++; continue; }
                if (k < n && s[k] == ']') k++;
                break;
            }
        } else {
            /* the newer form: [TOOL_CALLS]name[ARGS]{...} */
            size_t args = find(s, n, k, "[ARGS]");
            if (args == n) {
                if (!ps->opt->partial) drop(ps, n - at);
                return;
            }
            size_t v = args + 6, v_end = v;
            bool more;
            size_t span = json_value_span(s + v, n - v, &more);
            if (!span && !(more && ps->opt->partial)) {
                drop(ps, n - at);
                return;
            }
            v_end = span ? v + span : n;
            size_t vs = skip_ws(s, v_end, v);
            add_call(ps, dup_n(s + k, args - k), dup_n(s + vs, rtrim(s + vs, v_end - vs)), NULL, span != 0);
            if (!span) return;
            k = v_end;
        }
        /* after the calls, only more calls: anything else is no answer of the reply's */
        at = find(s, n, k, tag);
        if (at > k) drop(ps, at - skip_ws(s, at, k));
    }
}

#define DS_CALLS_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALLS_END "<\xef\xbd\x9ctool\xe2\x96\x81" "calls\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_CALL_BEGIN "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "begin\xef\xbd\x9c>"
#define DS_CALL_END "<\xef\xbd\x9ctool\xe2\x96\x81" "call\xe2\x96\x81" "end\xef\xbd\x9c>"
#define DS_SEP "<\xef\xbd\x9ctool\xe2\x96\x81" "sep\xef\xbd\x9c>"

static void parse_deepseek(parser *ps, const char *s, size_t n) {
    size_t at = find(s, n, 0, DS_CALLS_BEGIN), k;
    if (at == n) at = find(s, n, 0, DS_CALL_BEGIN);
    if (at == n) {
        /* either mark may be starting at the end */
        size_t hold = 0;
        if (holds_tail(ps)) {
            hold = tail_prefix(s, n, DS_CALLS_BEGIN);
            size_t other = tail_prefix(s, n, DS_CALL_BEGIN);
            if (other > hold) hold = other;
        }
        put_content(ps, s, n - hold, NULL);
        return;
    }
    put_content(ps, s, rtrim(s, at), NULL);
    k = starts(s, n, at, DS_CALLS_BEGIN) ? at + strlen(DS_CALLS_BEGIN) : at;
    for (;;) {
        k = skip_ws(s, n, k);
        if (k >= n) return;
        if (starts(s, n, k, DS_CALLS_END)) {
            k += strlen(DS_CALLS_END);
            break;
        }
        if (!starts(s, n, k, DS_CALL_BEGIN)) {
            if (ps->opt->partial && n - k < strlen(DS_CALL_BEGIN)) return;
            break;
        }
        size_t sep = find(s, n, k, DS_SEP);
        if (sep == n) return;
        size_t name = sep + strlen(DS_SEP), name_end = find(s, n, name, "\n");
        if (name_end == n) return;
        size_t v = name_end + 1;
        if (ps->opt->partial && n - v < 7 && !memcmp(s + v, "```json", n - v)) return;
        if (starts(s, n, v, "```json")) v = skip_ws(s, n, v + 7);
        bool more;
        size_t span = json_value_span(s + v, n - v, &more);
        if (!span && !(more && ps->opt->partial)) break;
        size_t v_end = span ? v + span : n;
        add_call(ps, dup_n(s + name, rtrim(s + name, name_end - name)), dup_n(s + v, rtrim(s + v, v_end - v)), NULL,
                 span != 0);
        if (!span) return;
        k = skip_ws(s, n, v_end);
        if (starts(s, n, k, "```")) k += 3;
        k = skip_ws(s, n, k);
        if (starts(s, n, k, DS_CALL_END)) k += strlen(DS_CALL_END);
    }
    drop(ps, n - skip_ws(s, n, k));
}

/* Whether s[0..n) is (when `whole`) or can become a harmony message header (the reply's first
 * header may begin with its recipient: " to=functions.x<|channel|>..."). */
static bool harmony_header_begins(const char *s, size_t n, bool whole) {
    static const char *const openings[] = {"<|channel|>", " to=", "to="};
    if (n > 256) return false;
    for (size_t i = 0; i < 3; i++) {
        size_t len = strlen(openings[i]);
        if (whole ? n >= len && !memcmp(s, openings[i], len) : !memcmp(s, openings[i], n < len ? n : len)) return true;
    }
    return false;
}

/* Harmony: messages "<|channel|>C[ to=R][<|constrain|>json]<|message|>BODY(<|end|>|<|call|>|<|return|>)",
 * each after the first introduced by "<|start|>assistant[ to=R]". */
static void parse_gpt_oss(parser *ps, const char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        size_t h = i;
        bool started = starts(s, n, h, "<|start|>");
        if (!started && ps->opt->partial && n - i < 9 && !memcmp(s + i, "<|start|>", n - i)) return;
        if (started) h += 9;
        size_t msg = find(s, n, h, "<|message|>");
        /* the header's start: after <|start|>, the role "assistant" */
        size_t r = h, hdr_end = msg == n ? n - tail_prefix(s + h, n - h, "<|message|>") : msg;
        if (started) {
            size_t len = hdr_end - h < 9 ? hdr_end - h : 9;
            if (!memcmp(s + h, "assistant", len)) r = h + len;
        }
        bool plausible = (started && r == hdr_end && (msg == n || r - h == 9)) ||
                         (r < hdr_end && harmony_header_begins(s + r, hdr_end - r, msg < n));
        if (msg == n) {
            /* a header still being written or cut off, or text that never opened a channel */
            if (plausible && (holds_tail(ps) || started || harmony_header_begins(s + r, hdr_end - r, true))) {
                drop(ps, ps->opt->partial ? 0 : n - i);
                return;
            }
            put_content(ps, s + i, n - i, NULL);
            return;
        }
        if (!plausible) {
            put_content(ps, s + i, n - i, NULL);
            return;
        }
        size_t body = msg + 11;
        size_t end = n, term = n;
        static const char *const terms[] = {"<|end|>", "<|call|>", "<|return|>"};
        for (size_t t = 0; t < 3; t++) {
            size_t e = find(s, n, body, terms[t]);
            if (e < end) { end = e; term = e + strlen(terms[t]); }
        }
        bool finished = end < n || !ps->opt->partial;
        size_t ch = find(s, msg, h, "<|channel|>");
        size_t cname = ch < msg ? ch + 11 : msg, cname_end = cname;
        while (cname_end < msg && s[cname_end] != ' ' && s[cname_end] != '<') cname_end++;
        size_t to = find(s, msg, h, "to=functions.");
        size_t bend = end;
        if (!finished) {
            static const char *const marks[] = {"<|end|>", "<|call|>", "<|return|>"};
            size_t hold = 0;
            for (size_t t = 0; t < 3; t++) {
                size_t k = tail_prefix(s + body, n - body, marks[t]);
                if (k > hold) hold = k;
            }
            bend = n - hold;
        }
        if (to < msg) {
            size_t nm = to + 13, nm_end = nm;
            while (nm_end < msg && s[nm_end] != ' ' && s[nm_end] != '<') nm_end++;
            size_t b = skip_ws(s, bend, body);
            size_t len = rtrim(s + b, bend - b);
            bool more;
            bool whole = json_value_span(s + b, len, &more) == len && len > 0;
            if (finished && !whole) {
                drop(ps, term - i);
            } else {
                add_call(ps, dup_n(s + nm, nm_end - nm), dup_n(s + b, len), NULL, finished);
            }
        } else {
            bool analysis = cname_end - cname == 8 && !memcmp(s + cname, "analysis", 8);
            strbuf *dst = analysis && ps->opt->extract_reasoning ? &ps->reasoning : &ps->content;
            if (dst->len && bend > body) strbuf_put(dst, "\n", 1);
            strbuf_put(dst, s + body, bend - body);
            if (dst == &ps->content) ps->content_at_end = s + bend == ps->end;
            else ps->reasoning_at_end = s + bend == ps->end;
        }
        if (!finished) return;
        i = term;
    }
}

/* {"tool_calls": [...]}, {"tool_call": {...}} or {"response": "..."} */
static void parse_generic(parser *ps, const char *s, size_t n) {
    static const char trigger[] = "{\"tool_calls\":";
    size_t at = skip_ws(s, n, 0), t = find(s, n, 0, trigger);
    if (t < n && t > at) {
        /* prose, then calls (the lazy grammar's trigger may come anywhere): from it on, calls */
        put_content(ps, s, rtrim(s, t), NULL);
        s += t;
        n -= t;
        at = 0;
    } else if (at >= n || s[at] != '{') {
        put_content(ps, s, n, trigger);
        return;
    }
    const bool calls_form = starts(s, n, at, trigger);
    const size_t content_before = ps->content.len;
    bool more;
    size_t span = json_value_span(s + at, n - at, &more);
    if (!span) {
        if (more && ps->opt->partial) return;
        if (calls_form) drop(ps, n - at);
        else put_content(ps, s, n, trigger);
        return;
    }
    /* one level of keys */
    size_t k = skip_ws(s, n, at + 1), end = at + span;
    size_t first_call = ps->n_calls;
    bool understood = false;
    while (k < end && s[k] == '"') {
        size_t key_at = k;
        if (scan_string(s, end, &k) != J_OK) break;
        char *key = json_unescape(s + key_at, k - key_at);
        k = skip_ws(s, end, k) + 1;   /* ':' */
        size_t v = skip_ws(s, end, k);
        size_t vk = v;
        scan_value(s, end, &vk, 1);
        if (key && !strcmp(key, "response") && s[v] == '"') {
            char *text = json_unescape(s + v, vk - v);
            if (text) strbuf_puts(&ps->content, text);
            free(text);
            understood = true;
        } else if (key && !strcmp(key, "tool_call")) {
            size_t c = v;
            understood = read_call_object(ps, s, vk, &c, "arguments", "parameters") == J_OK;
        } else if (key && !strcmp(key, "tool_calls") && s[v] == '[') {
            size_t c = skip_ws(s, vk, v + 1);
            understood = true;
            while (c < vk && s[c] == '{') {
                if (read_call_object(ps, s, vk, &c, "arguments", "parameters") != J_OK) { understood = false; break; }
                c = skip_ws(s, vk, c);
                if (c < vk && s[c] == ',') c = skip_ws(s, vk, c + 1);
            }
        }
        free(key);
        k = skip_ws(s, end, vk);
        if (k < end && s[k] == ',') k = skip_ws(s, end, k + 1);
    }
    if (!understood) {
        for (size_t c = first_call; c < ps->n_calls; c++) {
            free(ps->calls[c].name);
            free(ps->calls[c].arguments);
            free(ps->calls[c].id);
        }
        ps->n_calls = first_call;
        ps->content.len = content_before;
        if (ps->content.buf) ps->content.buf[content_before] = 0;
        if (calls_form) drop(ps, n - at);
        else put_content(ps, s, n, trigger);
    } else if (calls_form) {
        drop(ps, n - skip_ws(s, n, end));
    }
}

/* ------------------------------------------------------------------ stray marks
 *
 * A mark of the syntax outside the structure it belongs to (a </tool_call> with no call, a special
 * token a sampled model wrote into prose, <think> in the middle of an answer) is markup, not text:
 * it is removed from the content and the reasoning. */

typedef struct mark_set {
    const char *const *literals;
    bool pipes;         /* <|name|>: harmony's and Llama 3's special tokens */
    bool fullwidth;     /* <｜...｜>: DeepSeek's */
} mark_set;

#define FW_BAR "\xef\xbd\x9c"

/* The length of a mark at s[i..n), or 0; *could_be: s[i..n) is a proper prefix of one. */
static size_t mark_at(const mark_set *m, const char *s, size_t n, size_t i, bool *could_be) {
    *could_be = false;
    const size_t rest = n - i;
    for (const char *const *l = m->literals; l && *l; l++) {
        size_t len = strlen(*l);
        if (rest >= len && !memcmp(s + i, *l, len)) return len;
        if (rest < len && !memcmp(s + i, *l, rest)) *could_be = true;
    }
    if (s[i] != '<') return 0;
    if (rest == 1) {
        *could_be = *could_be || m->pipes || m->fullwidth;
        return 0;
    }
    if (m->pipes && s[i + 1] == '|') {
        size_t k = i + 2;
        while (k < n && k - i < 48 && ((s[k] >= 'a' && s[k] <= 'z') || (s[k] >= '0' && s[k] <= '9') || s[k] == '_')) k++;
        if (k + 1 < n && k > i + 2 && s[k] == '|' && s[k + 1] == '>') return k + 2 - i;
        if (k == n || (k + 1 == n && s[k] == '|')) *could_be = true;
    }
    if (m->fullwidth) {
        size_t bar = strlen(FW_BAR);
        if (rest < 1 + bar) {
            if (!memcmp(s + i + 1, FW_BAR, rest - 1)) *could_be = true;
        } else if (!memcmp(s + i + 1, FW_BAR, bar)) {
            for (size_t k = i + 1 + bar; k < n && k - i < 96; k++) {
                if (n - k < bar + 1) {
                    if (!memcmp(s + k, FW_BAR ">", n - k)) *could_be = true;
                    break;
                }
                if (!memcmp(s + k, FW_BAR ">", bar + 1)) return k + bar + 1 - i;
                if (s[k] == '\n' || s[k] == ' ') break;
            }
            if (n - i < 96 && !*could_be) {
                size_t k = i + 1 + bar;
                while (k < n && s[k] != '\n' && s[k] != ' ') k++;
                if (k == n) *could_be = true;
            }
        }
    }
    return 0;
}

static void scrub_once(strbuf *b, const mark_set *m, bool hold_tail) {
    size_t w = 0, i = 0, n = b->len;
    while (i < n) {
        bool could_be;
        size_t len = mark_at(m, b->buf, n, i, &could_be);
        if (len) {
            i += len;
            continue;
        }
        if (could_be && hold_tail) break;
        b->buf[w++] = b->buf[i++];
    }
    b->len = w;
    b->buf[w] = 0;
}

/* Until nothing changes: removing a mark may join the text around it into another. */
static void scrub(strbuf *b, const mark_set *m, bool hold_tail) {
    if (!b->buf) return;
    size_t before;
    do {
        before = b->len;
        scrub_once(b, m, hold_tail);
    } while (b->len != before);
}

static void scrub_marks(parser *ps, const chat_syntax *syn) {
    static const char *const think[] = {"<think>", "</think>", NULL};
    static const char *const hermes[] = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", NULL};
    static const char *const hermes_think[] = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                                               "<think>", "</think>", NULL};
    static const char *const coder[] = {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                                        "</parameter>", "<tool_response>", "</tool_response>", NULL};
    static const char *const coder_think[] = {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                                              "</parameter>", "<tool_response>", "</tool_response>", "<think>", "</think>", NULL};
    static const char *const mistral[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                                          "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]", NULL};
    static const char *const mistral_think[] = {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]",
                                                "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[INST]", "[/INST]", "<think>",
                                                "</think>", NULL};
    const bool tags = syn->think_tags && ps->opt->extract_reasoning, tools = ps->opt->tools;
    mark_set m = {tags ? think : NULL, false, false};
    switch (syn->tools) {
    case TOOL_SYNTAX_HERMES:
        if (tools) m.literals = tags ? hermes_think : hermes;
        break;
    case TOOL_SYNTAX_QWEN3_CODER:
        if (tools) m.literals = tags ? coder_think : coder;
        break;
    case TOOL_SYNTAX_MISTRAL:
        if (tools) m.literals = tags ? mistral_think : mistral;
        break;
    case TOOL_SYNTAX_LLAMA3: m.pipes = tools; break;
    case TOOL_SYNTAX_GPT_OSS: m.pipes = true; break;   /* its channels are special tokens, tools or not */
    case TOOL_SYNTAX_DEEPSEEK_V3: m.fullwidth = tools; break;
    case TOOL_SYNTAX_GENERIC: break;
    }
    if (!m.literals && !m.pipes && !m.fullwidth) return;
    /* a cut-off reply's last bytes may be a mark's beginning; text that a call followed is whole */
    scrub(&ps->content, &m, ps->opt->partial || (ps->opt->cut && ps->content_at_end));
    scrub(&ps->reasoning, &m, ps->opt->partial || (ps->opt->cut && ps->reasoning_at_end));
}

quill_status chat_parse_output(const chat_syntax *syn, const chat_parse_options *opt, const char *text, size_t n,
                               chat_parse *out, quill_error *err) {
    memset(out, 0, sizeof *out);
    parser ps = {.opt = opt, .end = text + n};
    if (syn->tools == TOOL_SYNTAX_GPT_OSS) {
        /* channels are the reply's structure, with or without tools */
        parse_gpt_oss(&ps, text, n);
    } else {
        size_t rest = take_think(&ps, syn, text, n);
        const char *s = text + rest;
        size_t m = n - rest;
        if (!opt->tools) put_content(&ps, s, m, NULL);
        else switch (syn->tools) {
            case TOOL_SYNTAX_HERMES: parse_hermes(&ps, s, m); break;
            case TOOL_SYNTAX_QWEN3_CODER: parse_qwen3_coder(&ps, s, m); break;
            case TOOL_SYNTAX_LLAMA3: parse_llama3(&ps, s, m); break;
            case TOOL_SYNTAX_MISTRAL: parse_mistral(&ps, s, m); break;
            case TOOL_SYNTAX_DEEPSEEK_V3: parse_deepseek(&ps, s, m); break;
            case TOOL_SYNTAX_GPT_OSS: break;
            case TOOL_SYNTAX_GENERIC: parse_generic(&ps, s, m); break;
        }
    }
    scrub_marks(&ps, syn);
    if (opt->partial) {
        /* whitespace at the end may yet be trimmed before a call or the end of reasoning */
        if (ps.content.buf) ps.content.buf[ps.content.len = rtrim(ps.content.buf, ps.content.len)] = 0;
        if (ps.reasoning.buf) ps.reasoning.buf[ps.reasoning.len = rtrim(ps.reasoning.buf, ps.reasoning.len)] = 0;
    }
    out->content = strbuf_take(&ps.content);
    out->reasoning = strbuf_take(&ps.reasoning);
    out->calls = ps.calls;
    out->n_calls = ps.n_calls;
    out->dropped = ps.dropped;
    if (ps.nomem || !out->content || !out->reasoning) {
        chat_parse_free(out);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory while parsing a reply of %zu bytes", n);
    }
    return QUILL_OK;
}

void chat_parse_free(chat_parse *p) {
    if (!p) return;
    free(p->content);
    free(p->reasoning);
    for (size_t i = 0; i < p->n_calls; i++) {
        free(p->calls[i].name);
        free(p->calls[i].arguments);
        free(p->calls[i].id);
    }
    free(p->calls);
    memset(p, 0, sizeof *p);
}

/* ------------------------------------------------------------------ grammars */

/* s as a GBNF string literal's inside. */
static void gbnf_literal(strbuf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') {
            char esc[2] = {'\\', *s};
            strbuf_put(b, esc, 2);
        } else if (*s == '\n') strbuf_puts(b, "\\n");
        else if (*s == '\r') strbuf_puts(b, "\\r");
        else if (*s == '\t') strbuf_puts(b, "\\t");
        else strbuf_put(b, s, 1);
    }
}

/* Any JSON object as arguments (the reference's json.gbnf, with bounded whitespace). */
static const char json_rules[] =
    "args ::= \"{\" ws ( jstring \":\" ws value ( \",\" ws jstring \":\" ws value )* )? \"}\"\n"
    "value ::= ( args | array | jstring | number | \"true\" | \"false\" | \"null\" ) ws\n"
    "array ::= \"[\" ws ( value ( \",\" ws value )* )? \"]\"\n"
    "jstring ::= \"\\\"\" ( [^\"\\\\\\x7F\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4} ) )* \"\\\"\" ws\n"
    "number ::= \"-\"? ( [0-9] | [1-9] [0-9]{1,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?\n"
    "ws ::= [ ]?\n";

/* A mark of the syntax as a grammar element: the special token it is in the vocabulary (`<[id]>`;
 * special tokens have no text a literal could match), else a literal. */
static void gbnf_mark(strbuf *b, const quill_tokenizer *tok, const char *mark) {
    if (tok) {
        int32_t *ids = NULL;
        size_t n = 0;
        char text[8];
        if (quill_tokenize(tok, mark, strlen(mark), false, true, &ids, &n, NULL) == QUILL_OK && n == 1 &&
            quill_token_to_bytes(tok, ids[0], false, text, sizeof text) == 0) {
            strbuf_printf(b, " <[%d]> ", ids[0]);
            free(ids);
            return;
        }
        free(ids);
    }
    strbuf_puts(b, " \"");
    gbnf_literal(b, mark);
    strbuf_puts(b, "\" ");
}

/* A GBNF text with every rule name prefixed (so that several grammars live in one): identifiers
 * outside literals, classes, repetition counts and token elements. */
static void gbnf_prefixed(strbuf *b, const char *g, const char *prefix) {
    for (const char *p = g; *p;) {
        char c = *p;
        if (c == '"' || c == '[') {
            char close = c == '"' ? '"' : ']';
            const char *q = p + 1;
            while (*q && *q != close) q += (*q == '\\' && q[1]) ? 2 : 1;
            if (*q) q++;
            strbuf_put(b, p, (size_t)(q - p));
            p = q;
        } else if (c == '{' || c == '<') {
            const char *q = strchr(p, c == '{' ? '}' : '>');
            q = q ? q + 1 : p + strlen(p);
            strbuf_put(b, p, (size_t)(q - p));
            p = q;
        } else if (c == '#') {
            const char *q = strchr(p, '\n');
            p = q ? q : p + strlen(p);
        } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_') {
            const char *q = p;
            while ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9') || *q == '-' || *q == '_') q++;
            strbuf_puts(b, prefix);
            strbuf_put(b, p, (size_t)(q - p));
            p = q;
        } else {
            strbuf_put(b, p, 1);
            p++;
        }
    }
    if (b->len && b->buf[b->len - 1] != '\n') strbuf_put(b, "\n", 1);
}

/* A call's arguments as hosted APIs write them, with at most one space between tokens: the
 * schema converter's `space` (up to two newlines and twenty blanks, for replies a person reads)
 * would let a sampled model spend its tokens on layout inside a call. The rule is rewritten in
 * place in b[from..]. */
static void compact_space(strbuf *b, size_t from, const char *prefix) {
    if (b->oom || !b->buf) return;
    char head[48];
    snprintf(head, sizeof head, "%sspace ::= ", prefix);
    size_t hl = strlen(head);
    for (size_t i = from; i + hl <= b->len; i++) {
        if ((i != from && b->buf[i - 1] != '\n') || memcmp(b->buf + i, head, hl)) continue;
        size_t body = i + hl, end = body;
        while (end < b->len && b->buf[end] != '\n') end++;
        static const char compact[] = "\" \"?";
        size_t cl = strlen(compact);
        if (end - body < cl) return;
        memcpy(b->buf + body, compact, cl);
        memmove(b->buf + body + cl, b->buf + end, b->len - end + 1);
        b->len -= end - body - cl;
        return;
    }
}

const char *tool_call_trigger(const chat_syntax *syn) {
    switch (syn->tools) {
    case TOOL_SYNTAX_HERMES:
    case TOOL_SYNTAX_QWEN3_CODER: return "<tool_call>";
    case TOOL_SYNTAX_LLAMA3: return "{\"name\": ";
    case TOOL_SYNTAX_MISTRAL: return "[TOOL_CALLS]";
    case TOOL_SYNTAX_GPT_OSS: return "<|channel|>commentary to=functions.";
    case TOOL_SYNTAX_DEEPSEEK_V3: return DS_CALLS_BEGIN;
    case TOOL_SYNTAX_GENERIC: break;
    }
    return "{\"tool_calls\": [";
}

quill_status tool_call_grammar(const chat_syntax *syn, const quill_tokenizer *tok, const char *const *names,
                               const char *const *args_gbnf, size_t n_names, bool parallel, bool thinking_open,
                               char **out, quill_error *err) {
    *out = NULL;
    if (!names || n_names == 0) return quill_fail(err, QUILL_E_ARG, "a tool-call grammar needs at least one tool name");
    strbuf b = {0}, sep = {0}, after = {0};
    /* fn: one alternative per tool, its name then its arguments (their own schema's rules, or any object) */
    bool json_name = syn->tools == TOOL_SYNTAX_HERMES || syn->tools == TOOL_SYNTAX_LLAMA3 ||
                     syn->tools == TOOL_SYNTAX_MISTRAL || syn->tools == TOOL_SYNTAX_GENERIC;
    switch (syn->tools) {
    case TOOL_SYNTAX_LLAMA3: strbuf_puts(&sep, " \", \\\"parameters\\\": \" "); break;
    case TOOL_SYNTAX_GPT_OSS:
        strbuf_puts(&sep, " \" \"");
        gbnf_mark(&sep, tok, "<|constrain|>");
        strbuf_puts(&sep, "\"json\"");
        gbnf_mark(&sep, tok, "<|message|>");
        break;
    case TOOL_SYNTAX_DEEPSEEK_V3:
        strbuf_puts(&sep, " \"\\n```json\\n\" ");
        strbuf_puts(&after, " \"\\n```\"");
        break;
    case TOOL_SYNTAX_QWEN3_CODER: strbuf_puts(&sep, " \">\\n\" "); break;
    default: strbuf_puts(&sep, " \", \\\"arguments\\\": \" "); break;
    }
    strbuf_puts(&b, "fn ::= ");
    for (size_t i = 0; i < n_names; i++) strbuf_printf(&b, "%sfn-%zu", i ? " | " : "", i);
    strbuf_puts(&b, "\n");
    for (size_t i = 0; i < n_names; i++) {
        strbuf q = {0};
        if (json_name) json_quote(&q, names[i], strlen(names[i]), false);
        else strbuf_puts(&q, names[i]);
        strbuf_printf(&b, "fn-%zu ::= \"", i);
        if (q.buf) gbnf_literal(&b, q.buf);
        free(q.buf);
        strbuf_puts(&b, "\"");
        if (sep.buf) strbuf_puts(&b, sep.buf);
        if (syn->tools == TOOL_SYNTAX_QWEN3_CODER) strbuf_puts(&b, "param*");
        else if (args_gbnf && args_gbnf[i]) strbuf_printf(&b, "a%zu-root", i);
        else strbuf_puts(&b, "args");
        if (after.buf) strbuf_puts(&b, after.buf);
        strbuf_puts(&b, "\n");
        if (args_gbnf && args_gbnf[i] && syn->tools != TOOL_SYNTAX_QWEN3_CODER) {
            char prefix[32];
            snprintf(prefix, sizeof prefix, "a%zu-", i);
            size_t from = b.len;
            gbnf_prefixed(&b, args_gbnf[i], prefix);
            compact_space(&b, from, prefix);
        }
    }
    if (sep.oom || after.oom) b.oom = true;
    free(sep.buf);
    free(after.buf);
    const char *call_sep = "\"\\n\"";
    strbuf open = {0}, close = {0};
    switch (syn->tools) {
    case TOOL_SYNTAX_HERMES:
        strbuf_puts(&b, "call ::= \"<tool_call>\\n{\\\"name\\\": \" fn \"}\\n</tool_call>\"\n");
        break;
    case TOOL_SYNTAX_QWEN3_CODER:
        strbuf_puts(&b, "call ::= \"<tool_call>\\n<function=\" fn \"</function>\\n</tool_call>\"\n"
                    "param ::= \"<parameter=\" [a-zA-Z0-9_]{1,64} \">\\n\" [^<]{0,256} \"\\n</parameter>\\n\"\n");
        break;
    case TOOL_SYNTAX_LLAMA3:
        strbuf_puts(&b, "call ::= \"{\\\"name\\\": \" fn \"}\"\n");
        parallel = false;   /* Llama 3.1 writes one call per turn */
        break;
    case TOOL_SYNTAX_MISTRAL:
        strbuf_puts(&b, "call ::= \"{\\\"name\\\": \" fn \", \\\"id\\\": \\\"\" [a-zA-Z0-9]{9} \"\\\"}\"\n");
        gbnf_mark(&open, tok, "[TOOL_CALLS]");
        strbuf_puts(&open, "\"[\" ");
        strbuf_puts(&close, " \"]\"");
        call_sep = "\", \"";
        break;
    case TOOL_SYNTAX_GPT_OSS:
        strbuf_puts(&b, "call ::=");
        gbnf_mark(&b, tok, "<|channel|>");
        strbuf_puts(&b, "\"commentary to=functions.\" fn\n");
        parallel = false;   /* a call ends the turn (<|call|>) */
        break;
    case TOOL_SYNTAX_DEEPSEEK_V3:
        strbuf_puts(&b, "call ::=");
        gbnf_mark(&b, tok, DS_CALL_BEGIN);
        strbuf_puts(&b, "\"function\"");
        gbnf_mark(&b, tok, DS_SEP);
        strbuf_puts(&b, "fn");
        gbnf_mark(&b, tok, DS_CALL_END);
        strbuf_puts(&b, "\n");
        gbnf_mark(&open, tok, DS_CALLS_BEGIN);
        gbnf_mark(&close, tok, DS_CALLS_END);
        break;
    case TOOL_SYNTAX_GENERIC:
        strbuf_puts(&b, "call ::= \"{\\\"name\\\": \" fn \"}\"\n");
        strbuf_puts(&open, "\"{\\\"tool_calls\\\": [\" ");
        strbuf_puts(&close, " \"]}\"");
        call_sep = "\", \"";
        break;
    }
    const char *sep_text = call_sep;
    strbuf_puts(&b, "root ::= ");
    if (syn->think_tags && thinking_open) strbuf_puts(&b, "\"</think>\\n\\n\" ");
    strbuf_printf(&b, "%scall%s%s%s%s\n", open.buf ? open.buf : "", parallel ? " ( " : "", parallel ? sep_text : "",
              parallel ? " call )*" : "", close.buf ? close.buf : "");
    if (open.oom || close.oom) b.oom = true;
    free(open.buf);
    free(close.buf);
    strbuf_puts(&b, json_rules);
    char *text = strbuf_take(&b);
    if (!text) return quill_fail(err, QUILL_E_NOMEM, "out of memory building a tool-call grammar");
    *out = text;
    return QUILL_OK;
}
