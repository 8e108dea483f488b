/* GBNF grammars: the reference's format, parsed into rules, and the parser's parse state.
 *
 * Syntax (as llama.cpp's grammars/README.md describes it, so existing .gbnf files work):
 *   name ::= alternatives          rule (names: letters, digits, '-'); `root` is where text starts
 *   "text"  [a-z0-9_]  [^"\\]  .    literals with \x.. \u.... \U........ \t \n \r \\ \" \[ \]
 *                                   escapes, character classes, any character
 *   ( ... )  a | b                  grouping, alternatives
 *   x*  x+  x?  x{m}  x{m,}  x{m,n}  repetition (m and n at most 2000)
 *   <[123]>  !<[123]>  <|text|>     a token by id, any token but it, a token by its text
 *   # comment                       to the end of the line; a rule ends at a newline outside ( )
 * A repetition becomes helper rules (x* is R ::= x R | empty), as the reference rewrites it.
 *
 * Matching is a set of pushdown stacks, as in the reference: each stack lists where to continue,
 * innermost first, and its top is always a terminal (a character class or a token). A character
 * advances every stack whose top accepts it; a stack that runs out of rules is an empty stack,
 * which means the text may end here. Stacks are immutable linked lists whose nodes are
 * hash-consed (one node per position and rest-of-stack), so equal stacks are equal indices: sets
 * of stacks sort, deduplicate and compare as arrays of integers, which lets a state's token mask
 * be cached and found again. */
#include "sampling/grammar_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_REPEAT = 2000, MAX_ELEMS = 1 << 20, MAX_RULES = 1 << 16, MAX_EXPAND_DEPTH = 4096 };

/* ---------------------------------------------------------------- growable arrays */

static bool grow(void **p, size_t *cap, size_t need, size_t size) {
    if (need <= *cap) return true;
    size_t c = *cap ? *cap : 16;
    while (c < need) c *= 2;
    void *q = realloc(*p, c * size);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---------------------------------------------------------------- parser */

typedef struct {
    gelem *e;
    size_t n, cap;
} elem_buf;

typedef struct {
    quill_grammar *g;
    const quill_tokenizer *tok;
    const char *src, *end;
    quill_error *err;
    bool failed;
    quill_status status;
    size_t cap_elems, cap_alts, cap_rules, cap_classes, cap_ranges, cap_names;
    uint32_t *table;             /* rule names: ids + 1 by hash */
    size_t table_cap;
    int depth;
} parser;

static bool fail_at(parser *p, const char *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool fail_at(parser *p, const char *at, const char *fmt, ...) {
    if (p->failed) return false;
    p->failed = true;
    int line = 1, col = 1;
    for (const char *c = p->src; c < at && c < p->end; c++) {
        if (*c == '\n') line++, col = 1;
        else col++;
    }
    char msg[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* a short excerpt of where it went wrong */
    char near[32];
    size_t k = 0;
    for (const char *c = at; c < p->end && *c != '\n' && k + 1 < sizeof near; c++) near[k++] = *c;
    near[k] = 0;
    p->status = strstr(fmt, "out of memory") ? QUILL_E_NOMEM : QUILL_E_FORMAT;
    quill_fail(p->err, p->status, "grammar: line %d, column %d: %s%s%s%s", line, col, msg,
               k ? " (at \"" : "", near, k ? "\")" : "");
    return false;
}

static bool is_word(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-';
}

static const char *skip_space(parser *p, const char *s, bool newlines) {
    while (s < p->end) {
        if (*s == ' ' || *s == '\t' || (newlines && (*s == '\n' || *s == '\r'))) s++;
        else if (*s == '#')
            while (s < p->end && *s != '\n' && *s != '\r') s++;
        else break;
    }
    return s;
}

static uint32_t name_hash(const char *s, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 16777619u;
    return h;
}

/* The rule called name[0..len), made (undefined) when new. Names are found through a hash table
 * of rule ids + 1 (0: free), grown at half full. */
static int32_t rule_id(parser *p, const char *name, size_t len, const char *at) {
    quill_grammar *g = p->g;
    size_t mask = p->table_cap - 1;
    size_t h = p->table_cap ? name_hash(name, len) & mask : 0;
    for (; p->table_cap && p->table[h]; h = (h + 1) & mask) {
        const char *have = g->names[p->table[h] - 1];
        if (strlen(have) == len && !memcmp(have, name, len)) return (int32_t)p->table[h] - 1;
    }
    if (g->n_rules >= MAX_RULES) return fail_at(p, at, "more than %d rules", MAX_RULES), -1;
    if ((g->n_rules + 1) * 2 > p->table_cap) {
        size_t cap = p->table_cap ? p->table_cap * 2 : 64;
        uint32_t *t = calloc(cap, sizeof *t);
        if (!t) return fail_at(p, at, "out of memory"), -1;
        for (size_t i = 0; i < g->n_rules; i++) {
            size_t k = name_hash(g->names[i], strlen(g->names[i])) & (cap - 1);
            while (t[k]) k = (k + 1) & (cap - 1);
            t[k] = (uint32_t)i + 1;
        }
        free(p->table);
        p->table = t;
        p->table_cap = cap;
        mask = cap - 1;
        for (h = name_hash(name, len) & mask; p->table[h]; h = (h + 1) & mask) {}
    }
    if (!grow((void **)&g->rules, &p->cap_rules, g->n_rules + 1, sizeof *g->rules) ||
        !grow((void **)&g->names, &p->cap_names, g->n_rules + 1, sizeof *g->names))
        return fail_at(p, at, "out of memory"), -1;
    char *copy = malloc(len + 1);
    if (!copy) return fail_at(p, at, "out of memory"), -1;
    memcpy(copy, name, len);
    copy[len] = 0;
    g->names[g->n_rules] = copy;
    g->rules[g->n_rules] = (grule){0, 0, false, (uint32_t)(at - p->src)};
    p->table[h] = (uint32_t)g->n_rules + 1;
    return (int32_t)g->n_rules++;
}

/* A helper rule named after the rule it serves. */
static int32_t new_rule(parser *p, int32_t parent, const char *at) {
    char name[96];
    snprintf(name, sizeof name, "%.64s_%zu", p->g->names[parent], p->g->n_rules);
    int32_t id = rule_id(p, name, strlen(name), at);
    return id;
}

static bool buf_push(parser *p, elem_buf *b, uint8_t kind, uint32_t value, const char *at) {
    if (b->n >= MAX_ELEMS || p->g->n_elems + b->n >= MAX_ELEMS)
        return fail_at(p, at, "the grammar is too large (more than %d elements once repetitions are expanded)",
                       MAX_ELEMS);
    if (!grow((void **)&b->e, &b->cap, b->n + 1, sizeof *b->e)) return fail_at(p, at, "out of memory");
    b->e[b->n++] = (gelem){kind, value};
    return true;
}

/* Stores a rule's alternatives (elements separated by G_END) as its definition. */
static bool define_rule(parser *p, int32_t id, const elem_buf *b, const char *at) {
    quill_grammar *g = p->g;
    if (g->rules[id].defined) return fail_at(p, at, "rule '%s' is defined twice", g->names[id]);
    size_t n_alts = 0;
    for (size_t i = 0; i < b->n; i++) n_alts += b->e[i].kind == G_END;
    if (!grow((void **)&g->elems, &p->cap_elems, g->n_elems + b->n, sizeof *g->elems) ||
        !grow((void **)&g->alts, &p->cap_alts, g->n_alts + n_alts, sizeof *g->alts))
        return fail_at(p, at, "out of memory");
    g->rules[id].first_alt = (uint32_t)g->n_alts;
    g->rules[id].n_alts = (uint32_t)n_alts;
    g->rules[id].defined = true;
    size_t start = g->n_elems;
    for (size_t i = 0; i < b->n; i++) {
        if (i == 0 || b->e[i - 1].kind == G_END) g->alts[g->n_alts++] = (uint32_t)(start + i);
        g->elems[g->n_elems++] = b->e[i];
    }
    return true;
}

static bool add_class(parser *p, bool negated, const cp_range *r, size_t n, uint32_t *out, const char *at) {
    quill_grammar *g = p->g;
    if (!grow((void **)&g->classes, &p->cap_classes, g->n_classes + 1, sizeof *g->classes) ||
        !grow((void **)&g->ranges, &p->cap_ranges, g->n_ranges + n + 1, sizeof *g->ranges))
        return fail_at(p, at, "out of memory");
    /* sorted and merged, so that a class is a list of disjoint ranges */
    cp_range *dst = g->ranges + g->n_ranges;
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        cp_range x = r[i];
        if (x.lo > x.hi) continue;
        size_t j = m;
        while (j > 0 && dst[j - 1].lo > x.lo) dst[j] = dst[j - 1], j--;
        dst[j] = x;
        m++;
    }
    size_t k = 0;
    for (size_t i = 0; i < m; i++) {
        if (k && dst[i].lo <= dst[k - 1].hi + 1) {
            if (dst[i].hi > dst[k - 1].hi) dst[k - 1].hi = dst[i].hi;
        } else {
            dst[k++] = dst[i];
        }
    }
    g->classes[g->n_classes] = (gclass){negated, (uint32_t)g->n_ranges, (uint32_t)k};
    g->n_ranges += k;
    *out = (uint32_t)g->n_classes++;
    return true;
}

/* One character of a literal or class: an escape or a UTF-8 sequence. */
static const char *parse_char(parser *p, const char *s, uint32_t *cp) {
    if (s >= p->end) return fail_at(p, s, "unexpected end of the grammar"), NULL;
    if (*s == '\\') {
        if (s + 1 >= p->end) return fail_at(p, s, "unexpected end of the grammar after '\\'"), NULL;
        int digits = 0;
        switch (s[1]) {
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 't': *cp = '\t'; return s + 2;
        case 'r': *cp = '\r'; return s + 2;
        case 'n': *cp = '\n'; return s + 2;
        case '\\': case '"': case '[': case ']': *cp = (unsigned char)s[1]; return s + 2;
        default: return fail_at(p, s, "unknown escape '\\%c'", s[1]), NULL;
        }
        uint32_t v = 0;
        const char *h = s + 2;
        for (int i = 0; i < digits; i++, h++) {
            if (h >= p->end) return fail_at(p, s, "expected %d hex digits after '\\%c'", digits, s[1]), NULL;
            char c = *h;
            int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
            if (d < 0) return fail_at(p, s, "expected %d hex digits after '\\%c'", digits, s[1]), NULL;
            v = v * 16 + (uint32_t)d;
        }
        if (v > 0x10FFFF) return fail_at(p, s, "code point U+%X is beyond U+10FFFF", v), NULL;
        *cp = v;
        return h;
    }
    const unsigned char *u = (const unsigned char *)s;
    int n = u[0] < 0x80 ? 1 : (u[0] >> 5) == 6 ? 2 : (u[0] >> 4) == 14 ? 3 : (u[0] >> 3) == 30 ? 4 : 0;
    if (!n || s + n > p->end) return fail_at(p, s, "invalid UTF-8 in the grammar"), NULL;
    uint32_t v = n == 1 ? u[0] : u[0] & (0x7F >> n);
    for (int i = 1; i < n; i++) {
        if ((u[i] & 0xC0) != 0x80) return fail_at(p, s, "invalid UTF-8 in the grammar"), NULL;
        v = (v << 6) | (u[i] & 0x3F);
    }
    *cp = v;
    return s + n;
}

static const char *parse_alternates(parser *p, const char *s, int32_t id, bool nested);

/* x{min,max} (max UINT32_MAX: unbounded) applied to b->e[last..n). */
static bool repeat(parser *p, elem_buf *b, size_t last, uint32_t min, uint32_t max, int32_t parent, const char *at) {
    if (last == b->n) return fail_at(p, at, "a repetition needs something before it");
    size_t len = b->n - last;
    gelem *item = malloc(len * sizeof *item);
    if (!item) return fail_at(p, at, "out of memory");
    memcpy(item, b->e + last, len * sizeof *item);
    bool ok = true;
    b->n = last;
    for (uint32_t i = 0; i < min && ok; i++)
        for (size_t k = 0; k < len && ok; k++) ok = buf_push(p, b, item[k].kind, item[k].value, at);
    if (ok && max != min) {
        /* unbounded: R ::= x R | (empty); bounded: R_k ::= x R_(k-1) | (empty), R_1 ::= x | (empty) */
        uint32_t n_opt = max == UINT32_MAX ? 1 : max - min;
        int32_t prev = -1;
        for (uint32_t i = 0; i < n_opt && ok; i++) {
            int32_t r = new_rule(p, parent, at);
            elem_buf rb = {0};
            ok = r >= 0;
            for (size_t k = 0; k < len && ok; k++) ok = buf_push(p, &rb, item[k].kind, item[k].value, at);
            if (ok && max == UINT32_MAX) ok = buf_push(p, &rb, G_RULE, (uint32_t)r, at);
            else if (ok && prev >= 0) ok = buf_push(p, &rb, G_RULE, (uint32_t)prev, at);
            ok = ok && buf_push(p, &rb, G_END, 0, at) && buf_push(p, &rb, G_END, 0, at) && define_rule(p, r, &rb, at);
            free(rb.e);
            prev = r;
        }
        if (ok) ok = buf_push(p, b, G_RULE, (uint32_t)prev, at);
    }
    free(item);
    return ok;
}

static const char *parse_int(parser *p, const char *s, uint32_t *out) {
    if (s >= p->end || *s < '0' || *s > '9') return fail_at(p, s, "expected a number"), NULL;
    uint64_t v = 0;
    while (s < p->end && *s >= '0' && *s <= '9') {
        v = v * 10 + (uint64_t)(*s++ - '0');
        if (v > 1000000) return fail_at(p, s, "number too large"), NULL;
    }
    *out = (uint32_t)v;
    return s;
}

static const char *parse_token(parser *p, const char *s, uint32_t *id) {
    const char *start = s;
    s++;   /* '<' */
    if (s < p->end && *s == '[') {
        uint32_t v;
        if (!(s = parse_int(p, s + 1, &v))) return NULL;
        if (s + 1 >= p->end || s[0] != ']' || s[1] != '>') return fail_at(p, s, "expected ']>' after a token id"), NULL;
        *id = v;
        return s + 2;
    }
    while (s < p->end && *s != '>' && *s != '\n') s++;
    if (s >= p->end || *s != '>') return fail_at(p, start, "expected '>' to close the token"), NULL;
    s++;
    if (!p->tok) return fail_at(p, start, "a token by text needs the model's vocabulary; use <[id]>"), NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    quill_error e;
    if (quill_tokenize(p->tok, start, (size_t)(s - start), false, true, &ids, &n, &e) || n != 1) {
        free(ids);
        return fail_at(p, start, "'%.*s' is not a single token of this vocabulary", (int)(s - start), start), NULL;
    }
    *id = (uint32_t)ids[0];
    free(ids);
    return s;
}

static const char *parse_sequence(parser *p, const char *s, elem_buf *b, int32_t id, bool nested) {
    size_t last = b->n;   /* where the last item starts (for a repetition) */
    bool have_last = false;
    while (s < p->end) {
        const char *at = s;
        char c = *s;
        if (c == '"') {
            s++;
            last = b->n;
            have_last = true;
            while (s < p->end && *s != '"') {
                uint32_t cp, cls;
                if (!(s = parse_char(p, s, &cp))) return NULL;
                cp_range r = {cp, cp};
                if (!add_class(p, false, &r, 1, &cls, at) || !buf_push(p, b, G_CHARS, cls, at)) return NULL;
            }
            if (s >= p->end) return fail_at(p, at, "unterminated string literal"), NULL;
            s = skip_space(p, s + 1, nested);
        } else if (c == '[') {
            s++;
            bool neg = s < p->end && *s == '^';
            if (neg) s++;
            cp_range *rs = NULL;
            size_t n = 0, cap = 0;
            while (s < p->end && *s != ']') {
                uint32_t lo, hi;
                if (!(s = parse_char(p, s, &lo))) { free(rs); return NULL; }
                hi = lo;
                if (s + 1 < p->end && s[0] == '-' && s[1] != ']') {
                    if (!(s = parse_char(p, s + 1, &hi))) { free(rs); return NULL; }
                    if (hi < lo) { free(rs); return fail_at(p, at, "the range U+%04X-U+%04X is empty (its end comes before its start)", lo, hi), NULL; }
                }
                if (!grow((void **)&rs, &cap, n + 1, sizeof *rs)) { free(rs); return fail_at(p, at, "out of memory"), NULL; }
                rs[n++] = (cp_range){lo, hi};
            }
            if (s >= p->end) { free(rs); return fail_at(p, at, "unterminated character class"), NULL; }
            uint32_t cls;
            bool ok = add_class(p, neg, rs, n, &cls, at);
            free(rs);
            last = b->n;
            have_last = true;
            if (!ok || !buf_push(p, b, G_CHARS, cls, at)) return NULL;
            s = skip_space(p, s + 1, nested);
        } else if (c == '.') {
            uint32_t cls;
            last = b->n;
            have_last = true;
            if (!add_class(p, true, NULL, 0, &cls, at) || !buf_push(p, b, G_CHARS, cls, at)) return NULL;
            s = skip_space(p, s + 1, nested);
        } else if (c == '<' || (c == '!' && s + 1 < p->end && s[1] == '<')) {
            uint32_t tid;
            if (!(s = parse_token(p, c == '!' ? s + 1 : s, &tid))) return NULL;
            last = b->n;
            have_last = true;
            if (!buf_push(p, b, c == '!' ? G_TOKEN_NOT : G_TOKEN, tid, at)) return NULL;
            s = skip_space(p, s, nested);
        } else if (is_word(c)) {
            const char *e = s;
            while (e < p->end && is_word(*e)) e++;
            int32_t r = rule_id(p, s, (size_t)(e - s), s);
            if (r < 0) return NULL;
            last = b->n;
            have_last = true;
            if (!buf_push(p, b, G_RULE, (uint32_t)r, at)) return NULL;
            s = skip_space(p, e, nested);
        } else if (c == '(') {
            if (++p->depth > 200) return fail_at(p, at, "groups nested more than 200 deep"), NULL;
            int32_t r = new_rule(p, id, at);
            if (r < 0) return NULL;
            s = parse_alternates(p, skip_space(p, s + 1, true), r, true);
            p->depth--;
            if (!s) return NULL;
            if (s >= p->end || *s != ')') return fail_at(p, s, "expected ')' to close a group"), NULL;
            last = b->n;
            have_last = true;
            if (!buf_push(p, b, G_RULE, (uint32_t)r, at)) return NULL;
            s = skip_space(p, s + 1, nested);
        } else if (c == '*' || c == '+' || c == '?' || c == '{') {
            uint32_t min = 0, max = UINT32_MAX;
            if (c == '+') min = 1;
            else if (c == '?') max = 1;
            s = skip_space(p, s + 1, nested);
            if (c == '{') {
                if (!(s = parse_int(p, s, &min))) return NULL;
                s = skip_space(p, s, nested);
                if (s < p->end && *s == '}') {
                    max = min;
                } else if (s < p->end && *s == ',') {
                    s = skip_space(p, s + 1, nested);
                    if (s < p->end && *s >= '0' && *s <= '9') {
                        if (!(s = parse_int(p, s, &max))) return NULL;
                        s = skip_space(p, s, nested);
                    }
                    if (s >= p->end || *s != '}') return fail_at(p, s, "expected '}' to close the repetition"), NULL;
                } else {
                    return fail_at(p, s, "expected ',' or '}' in the repetition"), NULL;
                }
                s = skip_space(p, s + 1, nested);
                if (min > MAX_REPEAT || (max != UINT32_MAX && max > MAX_REPEAT))
                    return fail_at(p, at, "a repetition count above %d", MAX_REPEAT), NULL;
                if (max < min) return fail_at(p, at, "a repetition {%u,%u} whose maximum is below its minimum", min, max), NULL;
            }
            if (!have_last) return fail_at(p, at, "'%c' needs something before it to repeat", c), NULL;
            if (!repeat(p, b, last, min, max, id, at)) return NULL;
            have_last = false;   /* x** is not allowed, as in the reference's grammars */
        } else {
            break;
        }
    }
    return s;
}

static const char *parse_alternates(parser *p, const char *s, int32_t id, bool nested) {
    elem_buf b = {0};
    s = parse_sequence(p, s, &b, id, nested);
    while (s && s < p->end && *s == '|') {
        if (!buf_push(p, &b, G_END, 0, s)) s = NULL;
        else s = parse_sequence(p, skip_space(p, s + 1, true), &b, id, nested);
    }
    if (s && !(buf_push(p, &b, G_END, 0, s) && define_rule(p, id, &b, s))) s = NULL;
    free(b.e);
    return s;
}

/* ---------------------------------------------------------------- checks after parsing */

/* Left recursion (a rule that can reach itself without consuming a character) would make the
 * matcher loop: refused, as the reference refuses it. */
static bool check_left_recursion(parser *p) {
    quill_grammar *g = p->g;
    size_t n = g->n_rules;
    bool *nullable = calloc(n ? n : 1, 1);
    uint8_t *color = calloc(n ? n : 1, 1);
    uint32_t *stack = malloc((n ? n : 1) * 2 * sizeof *stack);
    bool ok = nullable && color && stack;
    if (!ok) {
        free(nullable), free(color), free(stack);
        return fail_at(p, p->src, "out of memory");
    }
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t r = 0; r < n; r++) {
            if (nullable[r]) continue;
            for (uint32_t a = 0; a < g->rules[r].n_alts && !nullable[r]; a++) {
                const gelem *e = g->elems + g->alts[g->rules[r].first_alt + a];
                while (e->kind == G_RULE && nullable[e->value]) e++;
                if (e->kind == G_END) nullable[r] = changed = true;
            }
        }
    }
    /* depth-first search over "r can begin with s" edges, iteratively: (rule, next alternative) */
    for (size_t start = 0; start < n && ok; start++) {
        if (color[start]) continue;
        size_t top = 0;
        stack[top++] = (uint32_t)start;
        color[start] = 1;
        while (top && ok) {
            uint32_t r = stack[top - 1];
            bool pushed = false;
            for (uint32_t a = 0; a < g->rules[r].n_alts && !pushed && ok; a++) {
                for (const gelem *e = g->elems + g->alts[g->rules[r].first_alt + a]; e->kind == G_RULE; e++) {
                    uint32_t s = e->value;
                    if (color[s] == 1) {
                        ok = fail_at(p, p->src + g->rules[s].first_use,
                                     "rule '%s' is left-recursive (it can reach itself before any character); "
                                     "rewrite it with a repetition such as x (op x)*",
                                     g->names[s]);
                        break;
                    }
                    if (color[s] == 0) {
                        color[s] = 1;
                        stack[top++] = s;
                        pushed = true;
                        break;
                    }
                    if (!nullable[s]) break;
                }
            }
            if (!pushed && ok) {
                color[r] = 2;
                top--;
            }
        }
    }
    free(nullable), free(color), free(stack);
    return ok;
}

void quill_grammar_free(quill_grammar *g) {
    if (!g) return;
    for (size_t i = 0; i < g->n_rules; i++) free(g->names[i]);
    free(g->names);
    free(g->rules);
    free(g->elems);
    free(g->alts);
    free(g->classes);
    free(g->ranges);
    free(g);
}

quill_status quill_grammar_parse(const quill_tokenizer *tok, const char *text, size_t len, const char *root,
                                 quill_grammar **out, quill_error *err) {
    if (!out) return quill_fail(err, QUILL_E_ARG, "grammar: `out` must not be NULL");
    *out = NULL;
    if (!text) return quill_fail(err, QUILL_E_ARG, "grammar: no text given");
    if (!root) root = "root";
    quill_grammar *g = calloc(1, sizeof *g);
    if (!g) return quill_fail(err, QUILL_E_NOMEM, "grammar: out of memory");
    parser p = {.g = g, .tok = tok, .src = text, .end = text + len, .err = err};
    for (size_t i = 0; i < len; i++)
        if (!text[i]) {
            fail_at(&p, text + i, "a NUL byte in the grammar");
            break;
        }
    const char *s = skip_space(&p, text, true);
    while (!p.failed && s < p.end) {
        const char *name = s;
        while (s < p.end && is_word(*s)) s++;
        if (s == name) {
            fail_at(&p, s, "expected a rule name");
            break;
        }
        const size_t name_len = (size_t)(s - name);
        int32_t id = rule_id(&p, name, name_len, name);
        if (id < 0) break;
        s = skip_space(&p, s, false);
        if (p.end - s < 3 || memcmp(s, "::=", 3)) {
            fail_at(&p, s, "expected '::=' after the rule name '%.*s'", (int)name_len, name);
            break;
        }
        if (g->rules[id].defined) {
            fail_at(&p, name, "rule '%s' is defined twice", g->names[id]);
            break;
        }
        if (!(s = parse_alternates(&p, skip_space(&p, s + 3, true), id, false))) break;
        if (s < p.end && *s != '\n' && *s != '\r') {
            fail_at(&p, s, "unexpected '%c' (expected a newline or the end of the rule)", *s);
            break;
        }
        s = skip_space(&p, s, true);
    }
    if (!p.failed && g->n_rules == 0) fail_at(&p, text, "the grammar is empty (it needs at least a rule '%s')", root);
    for (size_t i = 0; i < g->n_rules && !p.failed; i++)
        if (!g->rules[i].defined)
            fail_at(&p, text + g->rules[i].first_use, "rule '%s' is used but never defined", g->names[i]);
    if (!p.failed) {
        size_t i = 0;
        while (i < g->n_rules && strcmp(g->names[i], root)) i++;
        if (i == g->n_rules) fail_at(&p, p.end, "there is no rule '%s' to start from", root);
        else g->root = (uint32_t)i;
    }
    if (!p.failed) check_left_recursion(&p);
    free(p.table);
    if (p.failed) {
        quill_grammar_free(g);
        return p.status;
    }
    *out = g;
    return QUILL_OK;
}

size_t quill_grammar_n_rules(const quill_grammar *g) { return g ? g->n_rules : 0; }
