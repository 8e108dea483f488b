/* JSON Schema to GBNF: the grammar of the JSON texts a schema accepts, for structured outputs.
 *
 * The layout follows the reference's json-schema-to-grammar: one rule per schema (named after
 * where it is), the shared primitives (value, object, array, string, number, integer, boolean,
 * null, space) defined once when used, objects with their properties in the schema's order
 * (required ones always, optional ones each optional and in order), whitespace `space` after
 * every token. A keyword this converter does not implement is refused with its name and path:
 * a grammar that silently ignored `pattern` or `minimum` would let through what the client
 * asked to exclude. The JSON reader is a small one of its own (the library needs no JSON
 * library); its input has been checked for depth by the caller or is bounded here. */
#include "base/error.h"
#include "base/utf8.h"
#include "base/strbuf.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_DEPTH = 64 };

/* ---------------------------------------------------------------- a small JSON reader */

typedef enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ } jtype;

typedef struct jv {
    jtype t;
    bool b;
    char *s;                 /* J_STR: decoded (NUL-terminated, may hold NULs: len); J_NUM: its text */
    size_t len;
    struct jv *items;        /* J_ARR / J_OBJ */
    char **keys;             /* J_OBJ */
    size_t *key_lens;
    size_t n;
} jv;

typedef struct {
    const char *p, *end, *start;
    quill_error *err;
    bool failed;
} jreader;

static bool jfail(jreader *r, const char *what) {
    if (!r->failed) quill_fail(r->err, QUILL_E_FORMAT, "json_schema: malformed JSON at byte %zu: %s",
                               (size_t)(r->p - r->start), what);
    r->failed = true;
    return false;
}

static void jskip(jreader *r) {
    while (r->p < r->end && (*r->p == ' ' || *r->p == '\t' || *r->p == '\n' || *r->p == '\r')) r->p++;
}

static void jfree(jv *v) {
    if (!v) return;
    free(v->s);
    for (size_t i = 0; i < v->n; i++) {
        jfree(&v->items[i]);
        if (v->keys) free(v->keys[i]);
    }
    free(v->items);
    free(v->keys);
    free(v->key_lens);
}

/* The length of the valid UTF-8 character at s (strict: no overlong forms, surrogates or values
 * past U+10FFFF), or 0. */
static size_t utf8_char(const char *s, const char *end) {
    const unsigned char *u = (const unsigned char *)s;
    size_t n = u[0] >= 0xC2 && u[0] <= 0xDF ? 2 : u[0] >= 0xE0 && u[0] <= 0xEF ? 3 : u[0] >= 0xF0 && u[0] <= 0xF4 ? 4 : 0;
    if (!n || (size_t)(end - s) < n) return 0;
    unsigned char lo = 0x80, hi = 0xBF;
    if (u[0] == 0xE0) lo = 0xA0;
    else if (u[0] == 0xED) hi = 0x9F;
    else if (u[0] == 0xF0) lo = 0x90;
    else if (u[0] == 0xF4) hi = 0x8F;
    if (u[1] < lo || u[1] > hi) return 0;
    for (size_t i = 2; i < n; i++)
        if ((u[i] & 0xC0) != 0x80) return 0;
    return n;
}

static bool jstring(jreader *r, char **out, size_t *out_len) {
    r->p++;   /* '"' */
    const char *s = r->p;
    while (r->p < r->end && *r->p != '"') r->p += *r->p == '\\' ? 2 : 1;
    if (r->p >= r->end) return jfail(r, "unterminated string");
    char *buf = malloc((size_t)(r->p - s) + 1);
    if (!buf) return jfail(r, "out of memory");
    size_t n = 0;
    for (const char *q = s; q < r->p;) {
        unsigned char c = (unsigned char)*q;
        if (c < 0x20) { free(buf); return jfail(r, "a control character inside a string"); }
        if (c >= 0x80) {
            size_t k = utf8_char(q, r->p);
            if (!k) { free(buf); return jfail(r, "invalid UTF-8 inside a string"); }
            memcpy(buf + n, q, k);
            n += k;
            q += k;
            continue;
        }
        if (c != '\\') { buf[n++] = (char)c; q++; continue; }
        char e = q[1];
        q += 2;
        switch (e) {
        case '"': buf[n++] = '"'; break;
        case '\\': buf[n++] = '\\'; break;
        case '/': buf[n++] = '/'; break;
        case 'b': buf[n++] = '\b'; break;
        case 'f': buf[n++] = '\f'; break;
        case 'n': buf[n++] = '\n'; break;
        case 'r': buf[n++] = '\r'; break;
        case 't': buf[n++] = '\t'; break;
        case 'u': {
            int v = q + 4 <= r->p ? hex4_value(q) : -1;
            if (v < 0) { free(buf); return jfail(r, "a bad \\u escape"); }
            q += 4;
            uint32_t cp = (uint32_t)v;
            if (cp >= 0xD800 && cp < 0xDC00 && q + 6 <= r->p && q[0] == '\\' && q[1] == 'u') {
                int lo = hex4_value(q + 2);
                if (lo >= 0xDC00 && lo < 0xE000) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (uint32_t)(lo - 0xDC00);
                    q += 6;
                }
            }
            if (cp >= 0xD800 && cp < 0xE000) cp = 0xFFFD;
            n += utf8_encode(cp, buf + n);   /* at most 4 bytes for 6 to 12 of input */
            break;
        }
        default: free(buf); return jfail(r, "an unknown escape in a string");
        }
    }
    buf[n] = 0;
    r->p++;
    *out = buf;
    *out_len = n;
    return true;
}

static bool jvalue(jreader *r, jv *v, int depth) {
    memset(v, 0, sizeof *v);
    if (depth > MAX_DEPTH) return jfail(r, "nested too deep");
    jskip(r);
    if (r->p >= r->end) return jfail(r, "unexpected end");
    char c = *r->p;
    if (c == '{' || c == '[') {
        bool obj = c == '{';
        v->t = obj ? J_OBJ : J_ARR;
        r->p++;
        size_t cap = 0;
        jskip(r);
        if (r->p < r->end && *r->p == (obj ? '}' : ']')) {
            r->p++;
            return true;
        }
        for (;;) {
            if (v->n == cap) {
                cap = cap ? cap * 2 : 4;
                jv *it = realloc(v->items, cap * sizeof *it);
                if (!it) return jfail(r, "out of memory");
                v->items = it;
                if (obj) {
                    char **k = realloc(v->keys, cap * sizeof *k);
                    if (!k) return jfail(r, "out of memory");
                    v->keys = k;
                    size_t *kl = realloc(v->key_lens, cap * sizeof *kl);
                    if (!kl) return jfail(r, "out of memory");
                    v->key_lens = kl;
                }
            }
            if (obj) {
                jskip(r);
                if (r->p >= r->end || *r->p != '"') return jfail(r, "expected a key");
                v->keys[v->n] = NULL;
                if (!jstring(r, &v->keys[v->n], &v->key_lens[v->n])) return false;
                jskip(r);
                if (r->p >= r->end || *r->p != ':') {
                    free(v->keys[v->n]);
                    return jfail(r, "expected ':'");
                }
                r->p++;
            }
            bool ok = jvalue(r, &v->items[v->n], depth + 1);
            v->n++;
            if (!ok) return false;
            jskip(r);
            if (r->p < r->end && *r->p == ',') {
                r->p++;
                continue;
            }
            if (r->p < r->end && *r->p == (obj ? '}' : ']')) {
                r->p++;
                return true;
            }
            return jfail(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        }
    }
    if (c == '"') {
        v->t = J_STR;
        return jstring(r, &v->s, &v->len);
    }
    static const struct { const char *word; jtype t; bool b; } words[] = {
        {"true", J_BOOL, true}, {"false", J_BOOL, false}, {"null", J_NULL, false}};
    for (size_t i = 0; i < 3; i++) {
        size_t l = strlen(words[i].word);
        if ((size_t)(r->end - r->p) >= l && !memcmp(r->p, words[i].word, l)) {
            v->t = words[i].t;
            v->b = words[i].b;
            r->p += l;
            return true;
        }
    }
    /* a number, as JSON spells it */
    const char *s = r->p;
    if (r->p < r->end && *r->p == '-') r->p++;
    if (r->p < r->end && *r->p == '0') r->p++;
    else if (r->p < r->end && *r->p >= '1' && *r->p <= '9')
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    else return jfail(r, "expected a value");
    if (r->p < r->end && *r->p == '.') {
        r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jfail(r, "expected digits after '.'");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    if (r->p < r->end && (*r->p == 'e' || *r->p == 'E')) {
        r->p++;
        if (r->p < r->end && (*r->p == '+' || *r->p == '-')) r->p++;
        if (r->p >= r->end || *r->p < '0' || *r->p > '9') return jfail(r, "expected an exponent");
        while (r->p < r->end && *r->p >= '0' && *r->p <= '9') r->p++;
    }
    v->t = J_NUM;
    v->len = (size_t)(r->p - s);
    if (!(v->s = malloc(v->len + 1))) return jfail(r, "out of memory");
    memcpy(v->s, s, v->len);
    v->s[v->len] = 0;
    return true;
}

static const jv *jget(const jv *o, const char *key) {
    if (!o || o->t != J_OBJ) return NULL;
    for (size_t i = 0; i < o->n; i++)
        if (o->key_lens[i] == strlen(key) && !memcmp(o->keys[i], key, o->key_lens[i])) return &o->items[i];
    return NULL;
}

/* ---------------------------------------------------------------- output */

/* Bytes as the inside of a GBNF "literal". */
static void sb_gbnf_literal(strbuf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            strbuf_put(b, e, 2);
        } else if (c == '\n') strbuf_lit(b, "\\n");
        else if (c == '\r') strbuf_lit(b, "\\r");
        else if (c == '\t') strbuf_lit(b, "\\t");
        else if (c < 0x20 || c == 0x7F) strbuf_printf(b, "\\x%02X", c);
        else strbuf_put(b, (const char *)&c, 1);
    }
}

/* A JSON value written compactly (the one spelling a const or enum member accepts). */
static void sb_json(strbuf *b, const jv *v) {
    switch (v->t) {
    case J_NULL: strbuf_lit(b, "null"); break;
    case J_BOOL: v->b ? strbuf_lit(b, "true") : strbuf_lit(b, "false"); break;
    case J_NUM: strbuf_put(b, v->s, v->len); break;
    case J_STR:
        strbuf_lit(b, "\"");
        for (size_t i = 0; i < v->len; i++) {
            unsigned char c = (unsigned char)v->s[i];
            if (c == '"') strbuf_lit(b, "\\\"");
            else if (c == '\\') strbuf_lit(b, "\\\\");
            else if (c == '\n') strbuf_lit(b, "\\n");
            else if (c == '\r') strbuf_lit(b, "\\r");
            else if (c == '\t') strbuf_lit(b, "\\t");
            else if (c < 0x20) strbuf_printf(b, "\\u%04x", c);
            else strbuf_put(b, (const char *)&c, 1);
        }
        strbuf_lit(b, "\"");
        break;
    case J_ARR:
    case J_OBJ:
        strbuf_put(b, v->t == J_ARR ? "[" : "{", 1);
        for (size_t i = 0; i < v->n; i++) {
            if (i) strbuf_lit(b, ",");
            if (v->t == J_OBJ) {
                jv key = {.t = J_STR, .s = v->keys[i], .len = v->key_lens[i]};
                sb_json(b, &key);
                strbuf_lit(b, ":");
            }
            sb_json(b, &v->items[i]);
        }
        strbuf_put(b, v->t == J_ARR ? "]" : "}", 1);
        break;
    }
}

/* ---------------------------------------------------------------- the converter */

/* The shared rules, in the reference's spelling; each is written once, when first used. */
enum { P_SPACE, P_VALUE, P_OBJECT, P_ARRAY, P_STRING, P_CHAR, P_NUMBER, P_INTEGER, P_INTEGRAL, P_DECIMAL, P_BOOLEAN,
       P_NULL, P_DATE, P_TIME, P_DATE_TIME, P_UUID, P_COUNT };

static const struct {
    const char *name, *body;
    int needs[4];
} primitives[P_COUNT] = {
    [P_SPACE] = {"space", "| \" \" | \"\\n\"{1,2} [ \\t]{0,20}", {-1}},
    [P_VALUE] = {"value", "object | array | string | number | boolean | null",
                 {P_OBJECT, P_ARRAY, P_STRING, P_NUMBER}},
    [P_OBJECT] = {"object", "\"{\" space ( string \":\" space value (\",\" space string \":\" space value)* )? \"}\" space",
                  {P_SPACE, P_STRING, P_VALUE, -1}},
    [P_ARRAY] = {"array", "\"[\" space ( value (\",\" space value)* )? \"]\" space", {P_SPACE, P_VALUE, -1}},
    [P_STRING] = {"string", "\"\\\"\" char* \"\\\"\" space", {P_CHAR, P_SPACE, -1}},
    [P_CHAR] = {"char", "[^\"\\\\\\x7F\\x00-\\x1F] | [\\\\] ([\"\\\\bfnrt] | \"u\" [0-9a-fA-F]{4})", {-1}},
    [P_NUMBER] = {"number", "(\"-\"? integral-part) (\".\" decimal-part)? ([eE] [-+]? integral-part)? space",
                  {P_INTEGRAL, P_DECIMAL, P_SPACE, -1}},
    [P_INTEGER] = {"integer", "(\"-\"? integral-part) space", {P_INTEGRAL, P_SPACE, -1}},
    [P_INTEGRAL] = {"integral-part", "[0] | [1-9] [0-9]{0,15}", {-1}},
    [P_DECIMAL] = {"decimal-part", "[0-9]{1,16}", {-1}},
    [P_BOOLEAN] = {"boolean", "(\"true\" | \"false\") space", {P_SPACE, -1}},
    [P_NULL] = {"null", "\"null\" space", {P_SPACE, -1}},
    [P_DATE] = {"date", "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [1-2] [0-9] | \"3\" [0-1] )",
                {-1}},
    [P_TIME] = {"time",
                "([01] [0-9] | \"2\" [0-3]) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{3} )? ( \"Z\" | ( \"+\" | "
                "\"-\" ) ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )",
                {-1}},
    [P_DATE_TIME] = {"date-time", "date \"T\" time", {P_DATE, P_TIME, -1}},
    [P_UUID] = {"uuid",
                "\"\\\"\" [0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
                "[0-9a-fA-F]{12} \"\\\"\" space",
                {P_SPACE, -1}},
};

typedef struct {
    const jv *root;
    strbuf out;
    bool used[P_COUNT];
    int next_id;
    /* $ref targets already given a rule: their paths and rule names */
    char **ref_paths, **ref_rules;
    size_t n_refs, cap_refs;
    quill_error *err;
    bool failed;
    quill_status status;
    int depth;
} conv;

static bool cfail(conv *c, quill_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool cfail(conv *c, quill_status st, const char *fmt, ...) {
    if (c->failed) return false;
    c->failed = true;
    c->status = st;
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    quill_fail(c->err, st, "json_schema: %s", msg);
    return false;
}

static void use(conv *c, int p) {
    if (c->used[p]) return;
    c->used[p] = true;
    for (int i = 0; i < 4 && primitives[p].needs[i] >= 0; i++) use(c, primitives[p].needs[i]);
    if (p == P_VALUE) use(c, P_BOOLEAN), use(c, P_NULL);
}

/* A fresh rule name: the path's last word made safe, and a number. */
static void new_name(conv *c, const char *hint, char *name, size_t cap) {
    char safe[40];
    size_t k = 0;
    for (const char *h = hint; *h && k + 1 < sizeof safe; h++) {
        char ch = *h;
        bool word = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9');
        safe[k++] = word ? ch : '-';
    }
    safe[k] = 0;
    snprintf(name, cap, "%s%s%d", k ? safe : "r", k ? "-" : "", c->next_id++);
}

static bool rule_for(conv *c, const jv *schema, const char *path, const char *hint, char *name, size_t cap);

static const char *const annotations[] = {"title", "description", "$schema", "$id", "$comment", "default", "examples",
                                          "deprecated", "readOnly", "writeOnly", "$defs", "definitions", "strict",
                                          NULL};

static bool known_key(const char *k, const char *const *allowed) {
    for (const char *const *a = annotations; *a; a++)
        if (!strcmp(k, *a)) return true;
    for (const char *const *a = allowed; a && *a; a++)
        if (!strcmp(k, *a)) return true;
    return false;
}

/* Every keyword of `schema` is one the converter implements or an annotation. */
static bool check_keys(conv *c, const jv *schema, const char *path, const char *const *allowed, const char *what) {
    for (size_t i = 0; i < schema->n; i++)
        if (!known_key(schema->keys[i], allowed))
            return cfail(c, QUILL_E_UNSUPPORTED, "the keyword '%s' at %s is not supported%s%s (supported: type, "
                                                 "properties, required, additionalProperties, enum, const, items, "
                                                 "prefixItems, minItems, maxItems, minLength, maxLength, format "
                                                 "date/time/date-time/uuid, anyOf, oneOf, $ref)",
                         schema->keys[i], path, what ? " with " : "", what ? what : "");
    return true;
}

static bool get_count(conv *c, const jv *schema, const char *key, const char *path, long *out) {
    const jv *v = jget(schema, key);
    if (!v) return true;
    char *end;
    long n = v->t == J_NUM ? strtol(v->s, &end, 10) : -1;
    if (v->t != J_NUM || *end || n < 0 || n > 10000)
        return cfail(c, QUILL_E_FORMAT, "'%s' at %s must be a whole number in 0..10000", key, path);
    *out = n;
    return true;
}

/* "x{min,max}" for a repetition count (max < 0: unbounded). */
static void sb_repeat(strbuf *b, long min, long max) {
    if (min == 0 && max < 0) strbuf_lit(b, "*");
    else if (min == 1 && max < 0) strbuf_lit(b, "+");
    else if (min == 0 && max == 1) strbuf_lit(b, "?");
    else if (max < 0) strbuf_printf(b, "{%ld,}", min);
    else if (min == max) strbuf_printf(b, "{%ld}", min);
    else strbuf_printf(b, "{%ld,%ld}", min, max);
}

static bool define(conv *c, const char *name, const char *body, size_t len) {
    strbuf_printf(&c->out, "%s ::= ", name);
    strbuf_put(&c->out, body, len);
    strbuf_put(&c->out, "\n", 1);
    return !c->out.oom || cfail(c, QUILL_E_NOMEM, "out of memory");
}

/* ---------------------------------------------------------------- numeric ranges */

enum { MAX_DIGITS = 19 };    /* bounds up to 2^63 - 1, every 64-bit integer but -2^63 */
enum { MAX_DECIMALS = 16 };

/* Digits of x (>= 0), written left to right into d; returns the count. */
static int digits_of(long long x, char d[MAX_DIGITS + 1]) {
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%lld", x);
    memcpy(d, tmp, (size_t)n);
    return n;
}

static bool all_of(const char *s, int n, char c) {
    for (int i = 0; i < n; i++)
        if (s[i] != c) return false;
    return true;
}

/* Decimal strings of equal length n from a to z (a <= z digit-wise), as a GBNF sequence: at
 * each position the digits strictly between the bounds' take any tail, the bounds' own digits
 * recurse; a bound whose tail is all zeros (or nines) joins the middle. */
static void same_length_range(strbuf *b, const char *a, const char *z, int n) {
    if (n == 0) return;
    if (n == 1) {
        if (a[0] == z[0]) strbuf_printf(b, "[%c] ", a[0]);
        else strbuf_printf(b, "[%c-%c] ", a[0], z[0]);
        return;
    }
    if (a[0] == z[0]) {
        strbuf_printf(b, "[%c] ", a[0]);
        same_length_range(b, a + 1, z + 1, n - 1);
        return;
    }
    static const char nines[MAX_DIGITS + 1] = "9999999999999999999", zeros[MAX_DIGITS + 1] = "0000000000000000000";
    const bool low_full = all_of(a + 1, n - 1, '0'), high_full = all_of(z + 1, n - 1, '9');
    const char from = low_full ? a[0] : (char)(a[0] + 1), to = high_full ? z[0] : (char)(z[0] - 1);
    bool first = true;
    strbuf_lit(b, "( ");
    if (!low_full) {
        strbuf_printf(b, "[%c] ", a[0]);
        same_length_range(b, a + 1, nines, n - 1);
        first = false;
    }
    if (from <= to) {
        strbuf_printf(b, "%s[%c-%c] [0-9]{%d} ", first ? "" : "| ", from, to, n - 1);
        first = false;
    }
    if (!high_full) {
        strbuf_printf(b, "%s[%c] ", first ? "" : "| ", z[0]);
        same_length_range(b, zeros, z + 1, n - 1);
    }
    strbuf_lit(b, ") ");
}

/* Non-negative integers in [lo, hi] (hi < 0: unbounded) without leading zeros. */
static void nonneg_range(strbuf *b, long long lo, long long hi) {
    char a[MAX_DIGITS + 1], z[MAX_DIGITS + 1];
    int na = digits_of(lo, a);
    int nz = hi >= 0 ? digits_of(hi, z) : MAX_DIGITS + 1;
    bool first = true;
    for (int len = na; len <= nz && len <= MAX_DIGITS; len++) {
        char from[MAX_DIGITS + 1], to[MAX_DIGITS + 1];
        if (len == na) memcpy(from, a, (size_t)len);
        else {
            memset(from, '0', (size_t)len);
            from[0] = '1';
        }
        if (len == nz) memcpy(to, z, (size_t)len);
        else memset(to, '9', (size_t)len);
        if (first) strbuf_lit(b, "( ");
        else strbuf_lit(b, "| ");
        first = false;
        same_length_range(b, from, to, len);
    }
    if (hi < 0) strbuf_printf(b, "| [1-9] [0-9]{%d,} ", MAX_DIGITS);   /* past the digits spelt out */
    strbuf_lit(b, ")");
}

/* A bound as the schema writes it: exactly when it is a whole number that fits 64 bits. */
typedef struct num_bound {
    bool set, whole;
    long long i;            /* when whole */
    double d;
} num_bound;

static bool get_bound(conv *c, const jv *schema, const char *key, const char *path, num_bound *out) {
    memset(out, 0, sizeof *out);
    const jv *v = jget(schema, key);
    if (!v || v->t == J_BOOL) return true;   /* draft 4's exclusiveMinimum: true, read beside minimum */
    if (v->t != J_NUM) return cfail(c, QUILL_E_FORMAT, "'%s' at %s must be a number", key, path);
    const char *t = v->s + (v->s[0] == '-');
    bool plain = *t != 0;
    for (const char *q = t; *q; q++) plain = plain && *q >= '0' && *q <= '9';
    out->set = true;
    out->d = strtod(v->s, NULL);
    if (plain) {
        errno = 0;
        out->i = strtoll(v->s, NULL, 10);
        if (errno == ERANGE || out->i == LLONG_MIN)
            return cfail(c, QUILL_E_UNSUPPORTED, "'%s' %s at %s is beyond 64-bit integers (+-9223372036854775807): not supported",
                         key, v->s, path);
        out->whole = true;
    } else if (floor(out->d) == out->d && fabs(out->d) < 9.2e18) {
        out->i = (long long)out->d;
        out->whole = true;
    } else if (!isfinite(out->d) || fabs(out->d) >= 9.2e18) {
        return cfail(c, QUILL_E_UNSUPPORTED, "'%s' %s at %s is beyond 64-bit integers (+-9223372036854775807): not supported",
                     key, v->s, path);
    }
    return true;
}

static bool draft4_exclusive(const jv *schema, const char *key) {
    const jv *v = jget(schema, key);
    return v && v->t == J_BOOL && v->b;
}

/* The range a schema's bounds leave: [lo, hi] or open ends, as whole numbers (an integer's
 * fractional bounds rounded inwards; a number's must be whole). */
typedef struct num_range {
    bool has_lo, has_hi, lo_excl, hi_excl;
    long long lo, hi;
} num_range;

static bool read_range(conv *c, const jv *schema, const char *path, bool integer, num_range *r) {
    memset(r, 0, sizeof *r);
    static const char *const keys[] = {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"};
    for (int k = 0; k < 4; k++) {
        num_bound nb;
        if (!get_bound(c, schema, keys[k], path, &nb)) return false;
        if (!nb.set) continue;
        const bool low = k < 2;
        bool excl = k == 1 || k == 3 || draft4_exclusive(schema, low ? "exclusiveMinimum" : "exclusiveMaximum");
        long long v;
        if (nb.whole) {
            v = nb.i;
        } else if (integer) {
            v = low ? (long long)ceil(nb.d) : (long long)floor(nb.d);   /* no whole number lies on it */
            excl = false;
        } else {
            return cfail(c, QUILL_E_UNSUPPORTED, "'%s' %g at %s is not a whole number: a number's bounds between "
                                                 "whole numbers are not supported", keys[k], nb.d, path);
        }
        if (integer && excl) {
            /* (v, ...) of integers is [v + 1, ...) */
            if ((low && v == LLONG_MAX) || (!low && v == -LLONG_MAX))
                return cfail(c, QUILL_E_FORMAT, "the bounds at %s leave no value", path);
            v += low ? 1 : -1;
            excl = false;
        }
        if (low && (!r->has_lo || v > r->lo || (v == r->lo && excl))) r->has_lo = true, r->lo = v, r->lo_excl = excl;
        if (!low && (!r->has_hi || v < r->hi || (v == r->hi && excl))) r->has_hi = true, r->hi = v, r->hi_excl = excl;
    }
    if (r->has_lo && r->has_hi && (r->lo > r->hi || (r->lo == r->hi && (r->lo_excl || r->hi_excl))))
        return cfail(c, QUILL_E_FORMAT, "the bounds at %s leave no value", path);
    return true;
}

/* Magnitudes (the digits after any sign) in [a, b] with at most `decimals` decimals: ends open
 * when excluded, b absent when !has_b. */
static void magnitude_range(strbuf *b, long long a, bool a_excl, bool has_b, long long bv, bool b_excl, int decimals) {
    bool first = true;
    strbuf_lit(b, "( ");
    if (a_excl && decimals > 0 && (!has_b || a < bv)) {
        /* a itself and a fraction that is not zero */
        strbuf_printf(b, "\"%lld.\" [0-9]{0,%d} [1-9] ", a, decimals - 1);
        first = false;
    }
    long long from = a_excl ? a + 1 : a, to = has_b ? bv - 1 : -1;
    if (!has_b || (bv > 0 && from <= to)) {
        strbuf_puts(b, first ? "" : "| ");
        nonneg_range(b, from, to);
        if (decimals > 0) strbuf_printf(b, " (\".\" [0-9]{1,%d})? ", decimals);
        else strbuf_lit(b, " ");
        first = false;
    }
    if (has_b && !b_excl && (bv > a || !a_excl)) {
        strbuf_printf(b, "%s\"%lld\" ", first ? "" : "| ", bv);
        if (decimals > 0) strbuf_printf(b, "(\".\" [0]{1,%d})? ", decimals);
        first = false;
    }
    if (first) strbuf_lit(b, "[^\\x00-\\x{10FFFF}] ");   /* nothing (the caller excludes this) */
    strbuf_lit(b, ") ");
}

/* An integer or a number in a range, and a number with at most `decimals` decimals (multipleOf a
 * power of ten), without exponents: sign, then magnitudes. */
static void range_body(strbuf *b, const num_range *r, int decimals) {
    bool alt = false;
    strbuf_lit(b, "( ");
    /* x < 0: "-" and a magnitude in (max(0, -hi), -lo] */
    if (!r->has_lo || r->lo < 0) {
        const bool neg_hi = r->has_hi && (r->hi < 0 || (r->hi == 0 && r->hi_excl));
        long long a = neg_hi ? -r->hi : 0;
        bool a_excl = neg_hi ? r->hi_excl : true;
        if (decimals == 0 && a_excl) a += 1, a_excl = false;   /* whole magnitudes above a */
        strbuf_lit(b, "\"-\" ");
        magnitude_range(b, a, a_excl, r->has_lo, r->has_lo ? -r->lo : 0, r->lo_excl, decimals);
        alt = true;
    }
    /* x >= 0 */
    if (!r->has_hi || r->hi > 0 || (r->hi == 0 && !r->hi_excl)) {
        const bool pos_lo = r->has_lo && r->lo >= 0;
        long long a = pos_lo ? r->lo : 0;
        bool a_excl = pos_lo && r->lo_excl;
        if (decimals == 0 && a_excl) a += 1, a_excl = false;
        if (alt) strbuf_lit(b, "| ");
        magnitude_range(b, a, a_excl, r->has_hi, r->hi, r->hi_excl, decimals);
    }
    strbuf_lit(b, ") space");
}

/* multipleOf: 1 (any integer; on a number, whole numbers) or, on a number, a power of ten below it
 * (0.1, 0.01, ...: that many decimals). *decimals: -1 when absent. */
static bool multiple_of(conv *c, const jv *schema, const char *path, bool integer, int *decimals) {
    *decimals = -1;
    const jv *v = jget(schema, "multipleOf");
    if (!v) return true;
    double m = v->t == J_NUM ? strtod(v->s, NULL) : 0;
    if (m == 1) {
        *decimals = 0;
        return true;
    }
    for (int k = 1; !integer && k <= MAX_DECIMALS; k++)
        if (fabs(m * pow(10, k) - 1) < 1e-9) {
            *decimals = k;
            return true;
        }
    return cfail(c, QUILL_E_UNSUPPORTED, "'multipleOf' %s at %s is not supported (1, and on numbers 0.1, 0.01 and "
                                         "other powers of ten below 1, are)", v->t == J_NUM ? v->s : "?", path);
}

/* The body of the rule for one type. */
static bool type_body(conv *c, const jv *schema, const char *type, const char *path, strbuf *b) {
    if (!strcmp(type, "null")) {
        use(c, P_NULL);
        strbuf_lit(b, "null");
    } else if (!strcmp(type, "boolean")) {
        use(c, P_BOOLEAN);
        strbuf_lit(b, "boolean");
    } else if (!strcmp(type, "integer") || !strcmp(type, "number")) {
        bool integer = type[0] == 'i';
        static const char *const bounded[] = {"type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                                              "multipleOf", NULL};
        if (!check_keys(c, schema, path, bounded, integer ? "type integer" : "type number")) return false;
        int decimals;
        num_range r;
        if (!multiple_of(c, schema, path, integer, &decimals) || !read_range(c, schema, path, integer, &r)) return false;
        if (r.has_lo || r.has_hi || decimals >= 0) {
            use(c, P_SPACE);
            range_body(b, &r, integer ? 0 : decimals >= 0 ? decimals : MAX_DECIMALS);
            return true;
        }
        use(c, integer ? P_INTEGER : P_NUMBER);
        strbuf_put(b, type, strlen(type));
    } else if (!strcmp(type, "string")) {
        static const char *const str[] = {"type", "minLength", "maxLength", "format", NULL};
        if (!check_keys(c, schema, path, str, "type string")) return false;
        const jv *fmt = jget(schema, "format");
        if (fmt) {
            const char *f = fmt->t == J_STR ? fmt->s : "";
            if (jget(schema, "minLength") || jget(schema, "maxLength"))
                return cfail(c, QUILL_E_UNSUPPORTED, "'format' together with minLength/maxLength at %s is not supported",
                             path);
            if (!strcmp(f, "uuid")) {
                use(c, P_UUID);
                strbuf_lit(b, "uuid");
                return true;
            }
            int p = !strcmp(f, "date") ? P_DATE : !strcmp(f, "time") ? P_TIME : !strcmp(f, "date-time") ? P_DATE_TIME : -1;
            if (p < 0)
                return cfail(c, QUILL_E_UNSUPPORTED, "the string format '%s' at %s is not supported (date, time, "
                                                     "date-time and uuid are)", f, path);
            use(c, p);
            use(c, P_SPACE);
            strbuf_printf(b, "\"\\\"\" %s \"\\\"\" space", primitives[p].name);
            return true;
        }
        long min = 0, max = -1;
        if (!get_count(c, schema, "minLength", path, &min) || !get_count(c, schema, "maxLength", path, &max)) return false;
        if (max >= 0 && max < min) return cfail(c, QUILL_E_FORMAT, "maxLength is below minLength at %s", path);
        if (min == 0 && max < 0) {
            use(c, P_STRING);
            strbuf_lit(b, "string");
        } else {
            use(c, P_CHAR);
            use(c, P_SPACE);
            strbuf_lit(b, "\"\\\"\" char");
            sb_repeat(b, min, max);
            strbuf_lit(b, " \"\\\"\" space");
        }
    } else if (!strcmp(type, "array")) {
        static const char *const arr[] = {"type", "items", "prefixItems", "minItems", "maxItems", NULL};
        if (!check_keys(c, schema, path, arr, "type array")) return false;
        const jv *items = jget(schema, "items"), *prefix = jget(schema, "prefixItems");
        long min = 0, max = -1;
        if (!get_count(c, schema, "minItems", path, &min) || !get_count(c, schema, "maxItems", path, &max)) return false;
        if (max >= 0 && max < min) return cfail(c, QUILL_E_FORMAT, "maxItems is below minItems at %s", path);
        use(c, P_SPACE);
        char sub[700], item[96];
        if (prefix) {
            if (prefix->t != J_ARR) return cfail(c, QUILL_E_FORMAT, "'prefixItems' at %s must be an array", path);
            if (jget(schema, "minItems") || jget(schema, "maxItems") || (items && items->t != J_BOOL))
                return cfail(c, QUILL_E_UNSUPPORTED, "'prefixItems' with items, minItems or maxItems at %s is not "
                                                     "supported", path);
            strbuf_lit(b, "\"[\" space");
            for (size_t i = 0; i < prefix->n; i++) {
                snprintf(sub, sizeof sub, "%s/prefixItems/%zu", path, i);
                if (!rule_for(c, &prefix->items[i], sub, "item", item, sizeof item)) return false;
                strbuf_printf(b, "%s %s", i ? " \",\" space" : "", item);
            }
            strbuf_lit(b, " \"]\" space");
            return true;
        }
        if (items && items->t == J_BOOL && items->b) items = NULL;
        if (items && items->t == J_BOOL) {
            strbuf_lit(b, "\"[\" space \"]\" space");
            return true;
        }
        snprintf(sub, sizeof sub, "%s/items", path);
        if (items) {
            if (!rule_for(c, items, sub, "item", item, sizeof item)) return false;
        } else {
            use(c, P_VALUE);
            snprintf(item, sizeof item, "value");
        }
        strbuf_lit(b, "\"[\" space ");
        if (max == 0) {
            strbuf_lit(b, "\"]\" space");
        } else {
            /* item ("," item){min-1, max-1}, optional as a whole when min is 0 */
            strbuf_printf(b, "%s%s (\",\" space %s)", min == 0 ? "( " : "", item, item);
            sb_repeat(b, min > 0 ? min - 1 : 0, max < 0 ? -1 : max - 1);
            strbuf_printf(b, "%s \"]\" space", min == 0 ? " )?" : "");
        }
    } else if (!strcmp(type, "object")) {
        static const char *const obj[] = {"type", "properties", "required", "additionalProperties", NULL};
        if (!check_keys(c, schema, path, obj, "type object")) return false;
        const jv *props = jget(schema, "properties"), *req = jget(schema, "required"),
                 *extra = jget(schema, "additionalProperties");
        if (props && props->t != J_OBJ) return cfail(c, QUILL_E_FORMAT, "'properties' at %s must be an object", path);
        if (req && req->t != J_ARR) return cfail(c, QUILL_E_FORMAT, "'required' at %s must be an array", path);
        if (extra && extra->t != J_BOOL && extra->t != J_OBJ)
            return cfail(c, QUILL_E_FORMAT, "'additionalProperties' at %s must be a boolean or a schema", path);
        use(c, P_SPACE);
        if (!props && (!extra || (extra->t == J_BOOL && extra->b)) && !req) {
            use(c, P_OBJECT);
            strbuf_lit(b, "object");
            return true;
        }
        size_t n = props ? props->n : 0;
        char (*kv)[96] = calloc(n + 1, sizeof *kv);
        bool *required = calloc(n + 1, sizeof *required);
        if (!kv || !required) {
            free(kv), free(required);
            return cfail(c, QUILL_E_NOMEM, "out of memory");
        }
        bool ok = true;
        for (size_t i = 0; req && i < req->n && ok; i++) {
            const jv *r = &req->items[i];
            if (r->t != J_STR) ok = cfail(c, QUILL_E_FORMAT, "'required' at %s must hold strings", path);
            size_t k = 0;
            while (ok && k < n && !(props->key_lens[k] == r->len && !memcmp(props->keys[k], r->s, r->len))) k++;
            if (ok && k == n)
                ok = cfail(c, QUILL_E_UNSUPPORTED, "'required' at %s names '%s', which is not among the properties",
                           path, r->s);
            if (ok) required[k] = true;
        }
        /* one rule per key-value pair: "\"key\"" space ":" space value */
        for (size_t i = 0; i < n && ok; i++) {
            char sub[700], val[96];
            snprintf(sub, sizeof sub, "%s/properties/%.200s", path, props->keys[i]);
            ok = rule_for(c, &props->items[i], sub, props->keys[i], val, sizeof val);
            if (!ok) break;
            new_name(c, props->keys[i], kv[i], sizeof kv[i]);
            strbuf body = {0};
            jv key = {.t = J_STR, .s = props->keys[i], .len = props->key_lens[i]};
            strbuf lit = {0};
            sb_json(&lit, &key);
            strbuf_lit(&body, "\"");
            if (lit.buf) sb_gbnf_literal(&body, lit.buf, lit.len);
            strbuf_printf(&body, "\" space \":\" space %s", val);
            ok = !lit.oom && !body.oom ? define(c, kv[i], body.buf, body.len) : cfail(c, QUILL_E_NOMEM, "out of memory");
            free(lit.buf);
            free(body.buf);
        }
        /* additional properties: any other key with a value of that schema (or any value) */
        char extra_kv[96] = "";
        if (ok && extra && !(extra->t == J_BOOL && !extra->b)) {
            char sub[700], val[96];
            snprintf(sub, sizeof sub, "%s/additionalProperties", path);
            if (extra->t == J_OBJ) ok = rule_for(c, extra, sub, "additional", val, sizeof val);
            else {
                use(c, P_VALUE);
                snprintf(val, sizeof val, "value");
            }
            if (ok) {
                use(c, P_STRING);
                new_name(c, "additional-kv", extra_kv, sizeof extra_kv);
                char body[256];
                snprintf(body, sizeof body, "string \":\" space %s", val);
                ok = define(c, extra_kv, body, strlen(body));
            }
        }
        if (ok) {
            /* required keys in order, then each optional key in order; when none is required, the
             * first key present may be any optional one */
            size_t n_req = 0;
            for (size_t i = 0; i < n; i++) n_req += required[i];
            strbuf_lit(b, "\"{\" space ");
            bool first = true;
            for (size_t i = 0; i < n; i++)
                if (required[i]) {
                    strbuf_printf(b, "%s%s", first ? "" : " \",\" space ", kv[i]);
                    first = false;
                }
            if (n_req > 0) {
                for (size_t i = 0; i < n; i++)
                    if (!required[i]) strbuf_printf(b, " (\",\" space %s)?", kv[i]);
                if (extra_kv[0]) strbuf_printf(b, " (\",\" space %s)*", extra_kv);
            } else if (n > 0 || extra_kv[0]) {
                strbuf_lit(b, "( ");
                for (size_t i = 0; i < n; i++) {
                    strbuf_printf(b, "%s%s", i ? " | " : "", kv[i]);
                    for (size_t j = i + 1; j < n; j++) strbuf_printf(b, " (\",\" space %s)?", kv[j]);
                    if (extra_kv[0]) strbuf_printf(b, " (\",\" space %s)*", extra_kv);
                }
                if (extra_kv[0]) strbuf_printf(b, "%s%s (\",\" space %s)*", n ? " | " : "", extra_kv, extra_kv);
                strbuf_lit(b, " )?");
            }
            strbuf_lit(b, " \"}\" space");
        }
        free(kv);
        free(required);
        return ok;
    } else {
        return cfail(c, QUILL_E_UNSUPPORTED, "the type '%s' at %s is not a JSON Schema type", type, path);
    }
    return true;
}

/* The name of a rule for `schema` (defined now, or a primitive's name). */
static bool rule_for(conv *c, const jv *schema, const char *path, const char *hint, char *name, size_t cap) {
    if (c->failed) return false;
    if (++c->depth > MAX_DEPTH) return cfail(c, QUILL_E_UNSUPPORTED, "the schema nests more than %d deep at %s", MAX_DEPTH, path);
    bool ok = true;
    strbuf body = {0};
    char sub[700];
    if (schema->t == J_BOOL) {
        if (!schema->b) ok = cfail(c, QUILL_E_UNSUPPORTED, "the schema 'false' at %s accepts nothing", path);
        use(c, P_VALUE);
        snprintf(name, cap, "value");
        c->depth--;
        return ok;
    }
    if (schema->t != J_OBJ) {
        c->depth--;
        return cfail(c, QUILL_E_FORMAT, "the schema at %s must be an object or a boolean", path);
    }
    const jv *ref = jget(schema, "$ref"), *en = jget(schema, "enum"), *cn = jget(schema, "const"),
             *any = jget(schema, "anyOf"), *one = jget(schema, "oneOf"), *type = jget(schema, "type");
    if (ref) {
        static const char *const refk[] = {"$ref", NULL};
        ok = check_keys(c, schema, path, refk, "$ref");
        const char *target = ref->t == J_STR ? ref->s : "";
        const char *defs = !strncmp(target, "#/$defs/", 8) ? "$defs" : !strncmp(target, "#/definitions/", 14) ? "definitions" : NULL;
        if (ok && !defs)
            ok = cfail(c, QUILL_E_UNSUPPORTED, "the $ref '%s' at %s is not supported (only #/$defs/NAME and "
                                               "#/definitions/NAME)", target, path);
        if (ok) {
            size_t i = 0;
            while (i < c->n_refs && strcmp(c->ref_paths[i], target)) i++;
            if (i < c->n_refs) {
                snprintf(name, cap, "%s", c->ref_rules[i]);
            } else {
                const char *key = target + (defs[0] == '$' ? 8 : 14);
                const jv *def = jget(jget(c->root, defs), key);
                if (!def) ok = cfail(c, QUILL_E_FORMAT, "the $ref '%s' at %s points to nothing", target, path);
                if (ok && c->n_refs == c->cap_refs) {
                    size_t cap2 = c->cap_refs ? c->cap_refs * 2 : 8;
                    char **p = realloc(c->ref_paths, cap2 * sizeof *p), **r = p ? realloc(c->ref_rules, cap2 * sizeof *r) : NULL;
                    if (p) c->ref_paths = p;
                    if (r) c->ref_rules = r, c->cap_refs = cap2;
                    if (!p || !r) ok = cfail(c, QUILL_E_NOMEM, "out of memory");
                }
                if (ok) {
                    /* the name first, so that a recursive schema refers to itself */
                    char def_name[96], inner[96];
                    new_name(c, key, def_name, sizeof def_name);
                    c->ref_paths[c->n_refs] = strdup(target);
                    c->ref_rules[c->n_refs] = strdup(def_name);
                    if (!c->ref_paths[c->n_refs] || !c->ref_rules[c->n_refs]) {
                        free(c->ref_paths[c->n_refs]), free(c->ref_rules[c->n_refs]);
                        ok = cfail(c, QUILL_E_NOMEM, "out of memory");
                    } else {
                        c->n_refs++;
                    }
                    snprintf(sub, sizeof sub, "#/%s/%.200s", defs, key);
                    if (ok) ok = rule_for(c, def, sub, key, inner, sizeof inner);
                    if (ok) ok = define(c, def_name, inner, strlen(inner));
                    snprintf(name, cap, "%s", def_name);
                }
            }
        }
        c->depth--;
        return ok;
    }
    if (en || cn) {
        static const char *const ek[] = {"enum", "const", "type", NULL};
        ok = check_keys(c, schema, path, ek, en ? "enum" : "const");
        if (ok && en && en->t != J_ARR) ok = cfail(c, QUILL_E_FORMAT, "'enum' at %s must be an array", path);
        if (ok && en && en->n == 0) ok = cfail(c, QUILL_E_FORMAT, "'enum' at %s is empty: nothing would match", path);
        size_t n = en ? en->n : 1;
        strbuf_lit(&body, "(");
        for (size_t i = 0; i < n && ok; i++) {
            strbuf lit = {0};
            sb_json(&lit, en ? &en->items[i] : cn);
            strbuf_printf(&body, "%s\"", i ? " | " : " ");
            if (lit.buf) sb_gbnf_literal(&body, lit.buf, lit.len);
            strbuf_lit(&body, "\"");
            if (lit.oom) ok = cfail(c, QUILL_E_NOMEM, "out of memory");
            free(lit.buf);
        }
        strbuf_lit(&body, " ) space");
        use(c, P_SPACE);
    } else if (any || one) {
        static const char *const ak[] = {"anyOf", "oneOf", NULL};
        const jv *list = any ? any : one;
        const char *kw = any ? "anyOf" : "oneOf";
        ok = check_keys(c, schema, path, ak, kw);
        if (ok && any && one) ok = cfail(c, QUILL_E_UNSUPPORTED, "anyOf together with oneOf at %s is not supported", path);
        if (ok && (list->t != J_ARR || list->n == 0))
            ok = cfail(c, QUILL_E_FORMAT, "'%s' at %s must be a non-empty array", kw, path);
        for (size_t i = 0; ok && i < list->n; i++) {
            char alt[96];
            snprintf(sub, sizeof sub, "%s/%s/%zu", path, kw, i);
            ok = rule_for(c, &list->items[i], sub, hint, alt, sizeof alt);
            strbuf_printf(&body, "%s%s", i ? " | " : "", alt);
        }
    } else if (type) {
        if (type->t == J_STR) {
            ok = type_body(c, schema, type->s, path, &body);
        } else if (type->t == J_ARR && type->n > 0) {
            for (size_t i = 0; ok && i < type->n; i++) {
                if (type->items[i].t != J_STR) {
                    ok = cfail(c, QUILL_E_FORMAT, "'type' at %s must hold strings", path);
                    break;
                }
                strbuf one_type = {0};
                ok = type_body(c, schema, type->items[i].s, path, &one_type);
                strbuf_printf(&body, "%s%s", i ? " | " : "", one_type.buf ? one_type.buf : "");
                free(one_type.buf);
            }
        } else {
            ok = cfail(c, QUILL_E_FORMAT, "'type' at %s must be a string or a non-empty array of strings", path);
        }
    } else {
        /* no type: any JSON value, when nothing else constrains it */
        static const char *const none[] = {NULL};
        ok = check_keys(c, schema, path, none, NULL);
        use(c, P_VALUE);
        strbuf_lit(&body, "value");
    }
    if (ok && body.oom) ok = cfail(c, QUILL_E_NOMEM, "out of memory");
    if (ok) {
        new_name(c, hint, name, cap);
        ok = define(c, name, body.buf ? body.buf : "", body.len);
    }
    free(body.buf);
    c->depth--;
    return ok;
}

quill_status quill_json_schema_to_grammar(const char *schema, size_t len, char **gbnf, quill_error *err) {
    if (!gbnf) return quill_fail(err, QUILL_E_ARG, "json_schema: `gbnf` must not be NULL");
    *gbnf = NULL;
    if (!schema) return quill_fail(err, QUILL_E_ARG, "json_schema: no schema given");
    jreader r = {schema, schema + len, schema, err, false};
    jv root;
    bool ok = jvalue(&r, &root, 0);
    if (ok) {
        jskip(&r);
        if (r.p != r.end) ok = jfail(&r, "text after the schema");
    }
    if (!ok) {
        jfree(&root);
        return QUILL_E_FORMAT;
    }
    conv c = {.root = &root, .err = err};
    char top[96];
    ok = rule_for(&c, &root, "#", "", top, sizeof top);
    if (ok) {
        strbuf_printf(&c.out, "root ::= %s\n", top);
        for (int p = 0; p < P_COUNT; p++)
            if (c.used[p]) strbuf_printf(&c.out, "%s ::= %s\n", primitives[p].name, primitives[p].body);
        if (c.out.oom) ok = cfail(&c, QUILL_E_NOMEM, "out of memory");
    }
    for (size_t i = 0; i < c.n_refs; i++) free(c.ref_paths[i]), free(c.ref_rules[i]);
    free(c.ref_paths);
    free(c.ref_rules);
    jfree(&root);
    if (!ok) {
        free(c.out.buf);
        return c.status ? c.status : QUILL_E_FORMAT;
    }
    *gbnf = c.out.buf;
    return QUILL_OK;
}
