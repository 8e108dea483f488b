/* Chat-template engine, lexer and parser: template text to tokens (whitespace control applied) to an arena AST. */
#include "jinja/jinja_internal.h"

/* ------------------------------------------------------------------ lexer */

/* Line and column (1-based, in code points) of a source offset. Offsets are asked for in
 * increasing order, so the walk is incremental. */
static void src_pos(J *j, size_t off, int *line, int *col) {
    if (off < j->lex_off) { j->lex_off = 0; j->lex_line = 1; j->lex_col = 1; }
    while (j->lex_off < off && j->lex_off < j->src_len) {
        unsigned char c = (unsigned char)j->src[j->lex_off++];
        if (c == '\n') { j->lex_line++; j->lex_col = 1; }
        else if (!u8cont(c)) j->lex_col++;
    }
    *line = j->lex_line;
    *col = j->lex_col;
}

static tok *push_tok(J *j, int type, size_t off, const char *s, size_t n) {
    if (!jj_grow(j, (void **)&j->toks, &j->captok, j->ntok + 1, sizeof(tok))) return NULL;
    tok *t = &j->toks[j->ntok++];
    memset(t, 0, sizeof *t);
    t->type = (uint8_t)type;
    t->s = s;
    t->n = n;
    src_pos(j, off, &t->line, &t->col);
    return t;
}

static void lex_err(J *j, size_t off, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void lex_err(J *j, size_t off, const char *fmt, ...) {
    int line, col;
    src_pos(j, off, &line, &col);
    va_list ap;
    va_start(ap, fmt);
    jj_jfail_v(j, QUILL_E_TEMPLATE, line, col, "syntax error", fmt, ap);
    va_end(ap);
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t l;
    while (i < n && (l = jj_space_at(s + i, n - i)) > 0) i += l;
    return i;
}

/* Where the text s[start..end) stops once lstrip_blocks has removed the indentation in front of
 * a block or comment tag: only when nothing but whitespace sits between the line start and the
 * tag. `line_starting` says whether `start` itself begins a line (the previous tag ended with a
 * newline), as in Jinja's lexer. */
static size_t lstrip_end(const char *s, size_t start, size_t end, bool line_starting) {
    size_t lp = end;
    while (lp > start && s[lp - 1] != '\n') lp--;
    if (lp == start && !line_starting) return end;
    if (lp == end) return end;
    for (size_t i = lp; i < end;) {
        size_t l = jj_space_at(s + i, end - i);
        if (!l) return end;
        i += l;
    }
    return lp;
}

static bool starts(const char *s, size_t n, size_t i, const char *lit) {
    size_t k = strlen(lit);
    return i + k <= n && memcmp(s + i, lit, k) == 0;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if ((c | 32) >= 'a' && (c | 32) <= 'f') return (c | 32) - 'a' + 10;
    return -1;
}

/* Decodes a string literal the way Jinja does (Python's unicode-escape). */
static bool decode_string(J *j, size_t off, const char *s, size_t n, const char **out, size_t *outn) {
    char *o = jj_arena_alloc(j, n + 1); /* escapes never expand: \U0010FFFF (10 bytes) -> 4 bytes */
    if (!o) return false;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) { o[k++] = s[i++]; continue; }
        char d = s[i + 1];
        i += 2;
        uint32_t cp;
        int digits = 0;
        switch (d) {
        case '\n': continue;
        case '\\': o[k++] = '\\'; continue;
        case '\'': o[k++] = '\''; continue;
        case '"': o[k++] = '"'; continue;
        case 'a': o[k++] = 7; continue;
        case 'b': o[k++] = 8; continue;
        case 'f': o[k++] = 12; continue;
        case 'n': o[k++] = '\n'; continue;
        case 'r': o[k++] = '\r'; continue;
        case 't': o[k++] = '\t'; continue;
        case 'v': o[k++] = 11; continue;
        case 'x': digits = 2; break;
        case 'u': digits = 4; break;
        case 'U': digits = 8; break;
        case 'N': lex_err(j, off, "\\N{...} escapes are not supported"); return false;
        default:
            if (d >= '0' && d <= '7') {
                cp = (uint32_t)(d - '0');
                for (int m = 0; m < 2 && i < n && s[i] >= '0' && s[i] <= '7'; m++) cp = cp * 8 + (uint32_t)(s[i++] - '0');
                k += jj_u8enc(cp, o + k);
            } else {
                o[k++] = '\\';
                o[k++] = d;
            }
            continue;
        }
        cp = 0;
        for (int m = 0; m < digits; m++) {
            int h = i < n ? hexval(s[i]) : -1;
            if (h < 0) { lex_err(j, off, "truncated \\%c escape in string", d); return false; }
            cp = cp * 16 + (uint32_t)h;
            i++;
        }
        if (cp > 0x10FFFF) { lex_err(j, off, "illegal Unicode character in string"); return false; }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;
        k += jj_u8enc(cp, o + k);
    }
    o[k] = 0;
    *out = o;
    *outn = k;
    return true;
}

bool jj_is_digit(char c) { return c >= '0' && c <= '9'; }
static bool name_start(unsigned char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80; }
static bool name_char(unsigned char c) { return name_start(c) || jj_is_digit((char)c); }

/* (\d+_)*\d+ */
static size_t scan_digits(const char *s, size_t n, size_t i) {
    while (i < n && jj_is_digit(s[i])) {
        i++;
        if (i + 1 < n && s[i] == '_' && jj_is_digit(s[i + 1])) i++;
    }
    return i;
}

static bool lex_number(J *j, size_t *pi) {
    const char *s = j->src;
    size_t n = j->src_len, t = *pi;
    size_t e = scan_digits(s, n, t);
    bool fl = false;
    size_t f = e;
    if (t == 0 || s[t - 1] != '.') {
        if (f + 1 < n && s[f] == '.' && jj_is_digit(s[f + 1])) { f = scan_digits(s, n, f + 1); fl = true; }
        if (f < n && (s[f] | 32) == 'e') {
            size_t x = f + 1;
            if (x < n && (s[x] == '+' || s[x] == '-')) x++;
            if (x < n && jj_is_digit(s[x])) { f = scan_digits(s, n, x); fl = true; }
        }
    }
    char buf[400];
    if (fl) {
        size_t k = 0;
        for (size_t i = t; i < f && k + 1 < sizeof buf; i++)
            if (s[i] != '_') buf[k++] = s[i];
        buf[k] = 0;
        char *end;
        tok *tk = push_tok(j, TK_FLOAT, t, s + t, f - t);
        if (!tk) return false;
        tk->f = jj_loc_strtod(buf, &end);
        *pi = f;
        return true;
    }
    int base = 10;
    size_t i = t;
    if (s[t] == '0' && t + 1 < n && ((s[t + 1] | 32) == 'b' || (s[t + 1] | 32) == 'o' || (s[t + 1] | 32) == 'x')) {
        base = (s[t + 1] | 32) == 'b' ? 2 : (s[t + 1] | 32) == 'o' ? 8 : 16;
        i = t + 2;
    } else if (s[t] == '0') {
        e = t + 1;
        while (e < n && (s[e] == '0' || (s[e] == '_' && e + 1 < n && s[e + 1] == '0'))) e++;
        tok *tk = push_tok(j, TK_INT, t, s + t, e - t);
        if (!tk) return false;
        *pi = e;
        return true;
    }
    uint64_t v = 0;
    size_t nd = 0;
    for (;;) {
        /* one '_' between digits, or right after a 0x/0o/0b prefix */
        bool digit_next = i + 1 < n && hexval(s[i + 1]) >= 0 && hexval(s[i + 1]) < base;
        if (i < n && s[i] == '_' && digit_next && (nd > 0 || base != 10)) { i++; continue; }
        int h = i < n ? hexval(s[i]) : -1;
        if (h < 0 || h >= base) break;
        if (v > (UINT64_MAX - (uint64_t)h) / (uint64_t)base) { lex_err(j, t, "integer literal too large"); return false; }
        v = v * (uint64_t)base + (uint64_t)h;
        nd++;
        i++;
    }
    if (nd == 0) { lex_err(j, t, "invalid integer literal"); return false; }
    if (v > INT64_MAX) { lex_err(j, t, "integer literal too large"); return false; }
    tok *tk = push_tok(j, TK_INT, t, s + t, i - t);
    if (!tk) return false;
    tk->i = (int64_t)v;
    *pi = i;
    return true;
}

static const struct { const char *s; uint8_t op; } OPS[] = {
    {"//", P_FLOORDIV}, {"**", P_POW}, {"==", P_EQ}, {"!=", P_NE}, {">=", P_GTEQ}, {"<=", P_LTEQ},
    {"+", P_ADD}, {"-", P_SUB}, {"/", P_DIV}, {"*", P_MUL}, {"%", P_MOD}, {"~", P_TILDE},
    {"[", P_LBRACKET}, {"]", P_RBRACKET}, {"(", P_LPAREN}, {")", P_RPAREN}, {"{", P_LBRACE},
    {"}", P_RBRACE}, {">", P_GT}, {"<", P_LT}, {"=", P_ASSIGN}, {".", P_DOT}, {":", P_COLON},
    {"|", P_PIPE}, {",", P_COMMA}, {";", P_SEMICOLON},
};

/* Tokens inside {{ ... }} or {% ... %}, starting after the opening delimiter; returns the offset
 * after the closing delimiter (and the whitespace it removes). */
static bool lex_tag(J *j, size_t open, size_t t, bool block, size_t *endpos) {
    const char *s = j->src;
    size_t n = j->src_len;
    char stack[MAX_PARSE_DEPTH];
    int bal = 0;
    for (;;) {
        if (t >= n) {
            lex_err(j, open, "'%s' is never closed (missing '%s')", block ? "{%" : "{{", block ? "%}" : "}}");
            return false;
        }
        /* End delimiters only count when brackets are balanced, so {{ {'a': {}} }} works. */
        if (bal == 0) {
            size_t e = 0;
            if (block) {
                if (starts(s, n, t, "+%}")) e = t + 3;
                else if (starts(s, n, t, "-%}")) e = skip_ws(s, n, t + 3);
                else if (starts(s, n, t, "%}")) { e = t + 2; if (e < n && s[e] == '\n') e++; }
            } else {
                if (starts(s, n, t, "-}}")) e = skip_ws(s, n, t + 3);
                else if (starts(s, n, t, "}}")) e = t + 2;
            }
            if (e) {
                if (!push_tok(j, block ? TK_BLOCK_END : TK_VAR_END, t, s + t, 2)) return false;
                *endpos = e;
                return true;
            }
        }
        size_t l = jj_space_at(s + t, n - t);
        if (l) { t += l; continue; }
        unsigned char c = (unsigned char)s[t];
        if (jj_is_digit((char)c)) {
            if (!lex_number(j, &t)) return false;
            continue;
        }
        if (name_start(c)) {
            size_t e = t;
            while (e < n && name_char((unsigned char)s[e])) e++;
            if (!push_tok(j, TK_NAME, t, s + t, e - t)) return false;
            t = e;
            continue;
        }
        if (c == '\'' || c == '"') {
            size_t e = t + 1;
            while (e < n && s[e] != (char)c) e += (s[e] == '\\' && e + 1 < n) ? 2 : 1;
            if (e >= n) { lex_err(j, t, "unterminated string"); return false; }
            const char *dec;
            size_t decn;
            if (!decode_string(j, t, s + t + 1, e - t - 1, &dec, &decn)) return false;
            tok *tk = push_tok(j, TK_STRING, t, dec, decn);
            if (!tk) return false;
            t = e + 1;
            continue;
        }
        size_t k;
        for (k = 0; k < sizeof OPS / sizeof OPS[0]; k++)
            if (starts(s, n, t, OPS[k].s)) break;
        if (k == sizeof OPS / sizeof OPS[0]) {
            if (c < 0x20 || c == 0x7F) lex_err(j, t, "unexpected character 0x%02x", c);
            else lex_err(j, t, "unexpected character '%c'", c);
            return false;
        }
        uint8_t op = OPS[k].op;
        if (op == P_LPAREN || op == P_LBRACKET || op == P_LBRACE) {
            if (bal >= MAX_PARSE_DEPTH) { lex_err(j, t, "brackets nested too deeply"); return false; }
            stack[bal++] = op == P_LPAREN ? ')' : op == P_LBRACKET ? ']' : '}';
        } else if (op == P_RPAREN || op == P_RBRACKET || op == P_RBRACE) {
            if (!bal) { lex_err(j, t, "unexpected '%c'", c); return false; }
            if (stack[bal - 1] != (char)c) { lex_err(j, t, "unexpected '%c', expected '%c'", c, stack[bal - 1]); return false; }
            bal--;
        }
        tok *tk = push_tok(j, TK_OP, t, s + t, strlen(OPS[k].s));
        if (!tk) return false;
        tk->op = op;
        t += strlen(OPS[k].s);
    }
}

static bool lex(J *j) {
    const char *s = j->src;
    size_t n = j->src_len, pos = 0;
    while (pos < n) {
        bool line_starting = pos == 0 || s[pos - 1] == '\n';
        size_t p = pos;
        char kind = 0;
        while (p < n) {
            const char *q = memchr(s + p, '{', n - p);
            if (!q) { p = n; break; }
            p = (size_t)(q - s);
            if (p + 1 < n && (s[p + 1] == '{' || s[p + 1] == '%' || s[p + 1] == '#')) { kind = s[p + 1]; break; }
            p++;
        }
        if (!kind) {
            if (!push_tok(j, TK_DATA, pos, s + pos, n - pos)) return false;
            break;
        }
        char sign = (p + 2 < n && (s[p + 2] == '-' || s[p + 2] == '+')) ? s[p + 2] : 0;
        size_t tend = p;
        if (sign == '-') tend = pos + jj_rstrip_ws(s + pos, p - pos);
        else if (sign != '+' && kind != '{') tend = lstrip_end(s, pos, p, line_starting);
        if (tend > pos && !push_tok(j, TK_DATA, pos, s + pos, tend - pos)) return false;
        size_t body = p + 2 + (sign ? 1 : 0);

        if (kind == '#') {
            size_t q = body;
            for (;;) {
                const char *f = q < n ? memchr(s + q, '#', n - q) : NULL;
                if (!f) { lex_err(j, p, "comment is never closed (missing '#}')"); return false; }
                q = (size_t)(f - s);
                if (q + 1 < n && s[q + 1] == '}') break;
                q++;
            }
            char es = (q > body && (s[q - 1] == '-' || s[q - 1] == '+')) ? s[q - 1] : 0;
            pos = q + 2;
            if (es == '-') pos = skip_ws(s, n, pos);
            else if (!es && pos < n && s[pos] == '\n') pos++;
            continue;
        }

        if (kind == '%') {
            /* {% raw %}: the text up to {% endraw %} is data, tags and all. */
            size_t r = skip_ws(s, n, body);
            if (starts(s, n, r, "raw")) {
                size_t r2 = skip_ws(s, n, r + 3), cs = 0;
                if (starts(s, n, r2, "-%}")) cs = skip_ws(s, n, r2 + 3);
                else if (starts(s, n, r2, "%}")) cs = r2 + 2;
                if (cs) {
                    size_t e = cs, after = 0;
                    char es = 0;
                    for (;;) {
                        const char *f = e < n ? memchr(s + e, '{', n - e) : NULL;
                        if (!f) { lex_err(j, p, "raw block is never closed (missing '{%% endraw %%}')"); return false; }
                        e = (size_t)(f - s);
                        if (starts(s, n, e, "{%")) {
                            size_t x = e + 2;
                            es = (x < n && (s[x] == '-' || s[x] == '+')) ? s[x] : 0;
                            if (es) x++;
                            x = skip_ws(s, n, x);
                            if (starts(s, n, x, "endraw")) {
                                x = skip_ws(s, n, x + 6);
                                if (starts(s, n, x, "+%}")) after = x + 3;
                                else if (starts(s, n, x, "-%}")) after = skip_ws(s, n, x + 3);
                                else if (starts(s, n, x, "%}")) { after = x + 2; if (after < n && s[after] == '\n') after++; }
                                if (after) break;
                            }
                        }
                        e++;
                    }
                    size_t de = e;
                    if (es == '-') de = cs + jj_rstrip_ws(s + cs, e - cs);
                    else if (es != '+') de = lstrip_end(s, cs, e, s[cs - 1] == '\n');
                    if (de > cs && !push_tok(j, TK_DATA, cs, s + cs, de - cs)) return false;
                    pos = after;
                    continue;
                }
            }
        }

        if (!push_tok(j, kind == '%' ? TK_BLOCK_BEGIN : TK_VAR_BEGIN, p, s + p, 2)) return false;
        if (!lex_tag(j, p, body, kind == '%', &pos)) return false;
    }
    return push_tok(j, TK_EOF, n, s + n, 0) != NULL;
}

/* ------------------------------------------------------------------ parser */

static tok *cur(J *j) { return &j->toks[j->pos]; }
static tok *look(J *j) { return &j->toks[j->pos + 1 < j->ntok ? j->pos + 1 : j->ntok - 1]; }
static void adv(J *j) { if (j->pos + 1 < j->ntok) j->pos++; }
static bool is_op(const tok *t, int op) { return t->type == TK_OP && t->op == op; }
static bool is_name(const tok *t, const char *nm) {
    return t->type == TK_NAME && t->n == strlen(nm) && memcmp(t->s, nm, t->n) == 0;
}

static void tok_desc(const tok *t, char *o, size_t cap) {
    switch (t->type) {
    case TK_EOF: snprintf(o, cap, "end of template"); break;
    case TK_DATA: snprintf(o, cap, "template text"); break;
    case TK_VAR_BEGIN: snprintf(o, cap, "'{{'"); break;
    case TK_BLOCK_BEGIN: snprintf(o, cap, "'{%%'"); break;
    case TK_VAR_END: snprintf(o, cap, "end of print statement"); break;
    case TK_BLOCK_END: snprintf(o, cap, "end of statement block"); break;
    case TK_STRING: snprintf(o, cap, "string"); break;
    default: snprintf(o, cap, "'%.*s'", (int)(t->n > 40 ? 40 : t->n), t->s); break;
    }
}

void jj_unexpected(J *j, const char *wanted) {
    char d[64];
    tok *t = cur(j);
    tok_desc(t, d, sizeof d);
    if (wanted) jj_synerr(j, t->line, t->col, "expected %s, got %s", wanted, d);
    else jj_synerr(j, t->line, t->col, "unexpected %s", d);
}

static bool expect_op(J *j, int op, const char *what) {
    if (is_op(cur(j), op)) { adv(j); return true; }
    jj_unexpected(j, what);
    return false;
}

static const char *expect_name(J *j) {
    tok *t = cur(j);
    if (t->type != TK_NAME) { jj_unexpected(j, "a name"); return NULL; }
    adv(j);
    return jj_arena_strndup(j, t->s, t->n);
}

static bool expect_end(J *j) {
    if (cur(j)->type == TK_BLOCK_END) { adv(j); return true; }
    jj_unexpected(j, "end of statement block");
    return false;
}

static node *nnew(J *j, int kind, const tok *at) {
    node *n = jj_arena_alloc(j, sizeof *n);
    if (!n) return NULL;
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static bool enter(J *j) {
    if (++j->pdepth > MAX_PARSE_DEPTH) {
        tok *t = cur(j);
        jj_synerr(j, t->line, t->col, "template nested too deeply (more than %d levels)", MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}
static void leave(J *j) { j->pdepth--; }

/* Growable arrays in the arena, so that an error mid-parse leaks nothing. */

static bool pvec_push(J *j, pvec *v, void *x) {
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        void **p = jj_arena_alloc(j, nc * sizeof(void *));
        if (!p) return false;
        if (v->n) memcpy(p, v->v, v->n * sizeof(void *));
        v->v = p;
        v->cap = nc;
    }
    v->v[v->n++] = x;
    return true;
}

static node *parse_expression(J *j, bool with_condexpr);
static node *parse_tuple(J *j, bool with_condexpr, bool explicit_parens, const char *extra_end);
static node *parse_unary(J *j, bool with_filter);
static node *parse_primary(J *j);
static node *parse_postfix(J *j, node *n);
static node *parse_filter_expr(J *j, node *n);
static node *parse_filter(J *j, node *n, bool start_inline);

/* Filters and tests Jinja knows. Names outside these lists fail at parse time, as Jinja's compiler
 * does; the few known ones quill does not implement fail only if executed. */
const char *const jj_JINJA_FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent",
    "int", "join", "last", "length", "list", "lower", "items", "map", "min", "max", "pprint",
    "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "trim", "truncate",
    "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", "tojson", NULL,
};
const char *const jj_JINJA_TESTS[] = {
    "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean",
    "false", "true", "integer", "float", "lower", "upper", "string", "mapping", "number",
    "sequence", "iterable", "callable", "sameas", "escaped", "in", "==", "eq", "equalto", "!=",
    "ne", ">", "gt", "greaterthan", "ge", ">=", "<", "lt", "lessthan", "<=", "le", NULL,
};

bool jj_in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (strcmp(*l, s) == 0) return true;
    return false;
}

/* Dotted names (`foo.bar`) as filters and tests use them. */
static const char *parse_dotted(J *j) {
    tok *t = cur(j);
    if (t->type != TK_NAME) { jj_unexpected(j, "a name"); return NULL; }
    const char *start = t->s;
    size_t len = t->n;
    adv(j);
    while (is_op(cur(j), P_DOT) && look(j)->type == TK_NAME) {
        adv(j);
        len = (size_t)(cur(j)->s + cur(j)->n - start);
        adv(j);
    }
    return jj_arena_strndup(j, start, len);
}

/* ( args ) with keyword arguments; the opening parenthesis is the current token. */
static bool parse_call_args(J *j, node *n) {
    if (!expect_op(j, P_LPAREN, "'('")) return false;
    pvec args = {0}, kwn = {0}, kwv = {0};
    while (!is_op(cur(j), P_RPAREN)) {
        if (args.n || kwn.n) {
            if (!expect_op(j, P_COMMA, "','")) return false;
            if (is_op(cur(j), P_RPAREN)) break;
        }
        tok *t = cur(j);
        if (is_op(t, P_MUL) || is_op(t, P_POW)) {
            jj_synerr(j, t->line, t->col, "*args and **kwargs in calls are not supported");
            return false;
        }
        if (t->type == TK_NAME && is_op(look(j), P_ASSIGN)) {
            const char *k = jj_arena_strndup(j, t->s, t->n);
            adv(j);
            adv(j);
            node *v = parse_expression(j, true);
            if (!v || !k || !pvec_push(j, &kwn, (void *)k) || !pvec_push(j, &kwv, v)) return false;
        } else {
            if (kwn.n) { jj_synerr(j, t->line, t->col, "positional argument follows keyword argument"); return false; }
            node *v = parse_expression(j, true);
            if (!v || !pvec_push(j, &args, v)) return false;
        }
    }
    adv(j);
    n->kids = (node **)args.v;
    n->nkids = args.n;
    n->names = (const char **)kwn.v;
    n->nnames = kwn.n;
    n->kids2 = (node **)kwv.v;
    return true;
}

static node *parse_primary(J *j) {
    tok *t = cur(j);
    node *n;
    switch (t->type) {
    case TK_NAME:
        n = nnew(j, E_CONST, t);
        if (!n) return NULL;
        if (is_name(t, "true") || is_name(t, "True")) n->cval = mk_bool(true);
        else if (is_name(t, "false") || is_name(t, "False")) n->cval = mk_bool(false);
        else if (is_name(t, "none") || is_name(t, "None")) n->cval = mk_none();
        else {
            n->kind = E_NAME;
            n->name = jj_arena_strndup(j, t->s, t->n);
            if (!n->name) return NULL;
        }
        adv(j);
        return n;
    case TK_STRING: {
        n = nnew(j, E_CONST, t);
        if (!n) return NULL;
        /* adjacent literals concatenate, as in Python */
        size_t len = 0, k = j->pos;
        while (j->toks[k].type == TK_STRING) len += j->toks[k++].n;
        jstr *s = jj_arena_alloc(j, sizeof(jstr) + len + 1);
        if (!s) return NULL;
        s->rc = -1;
        s->len = len;
        size_t o = 0;
        while (cur(j)->type == TK_STRING) {
            memcpy(s->s + o, cur(j)->s, cur(j)->n);
            o += cur(j)->n;
            adv(j);
        }
        s->s[len] = 0;
        n->cval.t = T_STR;
        n->cval.u.s = s;
        return n;
    }
    case TK_INT: case TK_FLOAT:
        n = nnew(j, E_CONST, t);
        if (!n) return NULL;
        n->cval = t->type == TK_INT ? mk_int(t->i) : mk_float(t->f);
        adv(j);
        return n;
    case TK_OP:
        if (t->op == P_LPAREN) {
            adv(j);
            n = parse_tuple(j, true, true, NULL);
            if (!n || !expect_op(j, P_RPAREN, "')'")) return NULL;
            return n;
        }
        if (t->op == P_LBRACKET || t->op == P_LBRACE) {
            bool dict = t->op == P_LBRACE;
            n = nnew(j, dict ? E_DICT : E_LIST, t);
            if (!n) return NULL;
            adv(j);
            int close = dict ? P_RBRACE : P_RBRACKET;
            pvec items = {0}, vals = {0};
            while (!is_op(cur(j), close)) {
                if (items.n) {
                    if (!expect_op(j, P_COMMA, "','")) return NULL;
                    if (is_op(cur(j), close)) break;
                }
                node *k = parse_expression(j, true);
                if (!k || !pvec_push(j, &items, k)) return NULL;
                if (dict) {
                    if (!expect_op(j, P_COLON, "':'")) return NULL;
                    node *v = parse_expression(j, true);
                    if (!v || !pvec_push(j, &vals, v)) return NULL;
                }
            }
            adv(j);
            n->kids = (node **)items.v;
            n->nkids = items.n;
            n->kids2 = (node **)vals.v;
            return n;
        }
        break;
    default: break;
    }
    jj_unexpected(j, NULL);
    return NULL;
}

/* The inside of [...]: an expression or a slice. */
static node *parse_subscribed(J *j) {
    tok *t = cur(j);
    node *parts[3] = {NULL, NULL, NULL};
    if (is_op(t, P_COLON)) {
        adv(j);
    } else {
        node *e = parse_expression(j, true);
        if (!e) return NULL;
        if (!is_op(cur(j), P_COLON)) return e;
        adv(j);
        parts[0] = e;
    }
    if (!is_op(cur(j), P_COLON) && !is_op(cur(j), P_RBRACKET) && !is_op(cur(j), P_COMMA)) {
        if (!(parts[1] = parse_expression(j, true))) return NULL;
    }
    if (is_op(cur(j), P_COLON)) {
        adv(j);
        if (!is_op(cur(j), P_RBRACKET) && !is_op(cur(j), P_COMMA)) {
            if (!(parts[2] = parse_expression(j, true))) return NULL;
        }
    }
    node *s = nnew(j, E_SLICE, t);
    if (!s) return NULL;
    s->a = parts[0];
    s->b = parts[1];
    s->c = parts[2];
    return s;
}

static node *parse_postfix(J *j, node *n) {
    for (;;) {
        tok *t = cur(j);
        if (is_op(t, P_DOT)) {
            adv(j);
            tok *a = cur(j);
            node *x;
            if (a->type == TK_NAME) {
                x = nnew(j, E_ATTR, t);
                if (!x || !(x->name = jj_arena_strndup(j, a->s, a->n))) return NULL;
            } else if (a->type == TK_INT) {
                x = nnew(j, E_ITEM, t);
                node *k = nnew(j, E_CONST, a);
                if (!x || !k) return NULL;
                k->cval = mk_int(a->i);
                x->b = k;
            } else {
                jj_unexpected(j, "an attribute name");
                return NULL;
            }
            adv(j);
            x->a = n;
            n = x;
        } else if (is_op(t, P_LBRACKET)) {
            adv(j);
            pvec args = {0};
            while (!is_op(cur(j), P_RBRACKET)) {
                if (args.n && !expect_op(j, P_COMMA, "','")) return NULL;
                if (args.n && is_op(cur(j), P_RBRACKET)) break;
                node *e = parse_subscribed(j);
                if (!e || !pvec_push(j, &args, e)) return NULL;
            }
            adv(j);
            if (args.n != 1) { jj_synerr(j, t->line, t->col, "subscripts must be a single index or slice"); return NULL; }
            node *x = nnew(j, E_ITEM, t);
            if (!x) return NULL;
            x->a = n;
            x->b = args.v[0];
            n = x;
        } else if (is_op(t, P_LPAREN)) {
            node *x = nnew(j, E_CALL, t);
            if (!x) return NULL;
            x->a = n;
            if (!parse_call_args(j, x)) return NULL;
            n = x;
        } else {
            return n;
        }
    }
}

static node *parse_filter(J *j, node *n, bool start_inline) {
    while (is_op(cur(j), P_PIPE) || start_inline) {
        if (!start_inline) adv(j);
        start_inline = false;
        tok *t = cur(j);
        const char *name = parse_dotted(j);
        if (!name) return NULL;
        if (!jj_in_list(jj_JINJA_FILTERS, name)) { jj_synerr(j, t->line, t->col, "no filter named '%s'", name); return NULL; }
        node *f = nnew(j, E_FILTER, t);
        if (!f) return NULL;
        f->name = name;
        f->a = n;
        if (is_op(cur(j), P_LPAREN) && !parse_call_args(j, f)) return NULL;
        n = f;
    }
    return n;
}

static node *parse_test(J *j, node *n) {
    adv(j); /* 'is' */
    bool neg = false;
    if (is_name(cur(j), "not")) { neg = true; adv(j); }
    tok *t = cur(j);
    const char *name = parse_dotted(j);
    if (!name) return NULL;
    if (!jj_in_list(jj_JINJA_TESTS, name)) { jj_synerr(j, t->line, t->col, "no test named '%s'", name); return NULL; }
    node *x = nnew(j, E_TEST, t);
    if (!x) return NULL;
    x->name = name;
    x->a = n;
    x->flag = neg;
    tok *c = cur(j);
    if (is_op(c, P_LPAREN)) {
        if (!parse_call_args(j, x)) return NULL;
    } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT || c->type == TK_FLOAT ||
                is_op(c, P_LPAREN) || is_op(c, P_LBRACKET) || is_op(c, P_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) { jj_synerr(j, c->line, c->col, "cannot chain multiple tests with 'is'"); return NULL; }
        node *jj_arg = parse_primary(j);
        if (!jj_arg || !(jj_arg = parse_postfix(j, jj_arg))) return NULL;
        node **kids = jj_arena_alloc(j, sizeof(node *));
        if (!kids) return NULL;
        kids[0] = jj_arg;
        x->kids = kids;
        x->nkids = 1;
    }
    return x;
}

static node *parse_filter_expr(J *j, node *n) {
    for (;;) {
        tok *t = cur(j);
        if (is_op(t, P_PIPE)) n = parse_filter(j, n, false);
        else if (is_name(t, "is")) n = parse_test(j, n);
        else if (is_op(t, P_LPAREN)) {
            node *x = nnew(j, E_CALL, t);
            if (!x) return NULL;
            x->a = n;
            if (!parse_call_args(j, x)) return NULL;
            n = x;
        } else return n;
        if (!n) return NULL;
    }
}

static node *parse_unary(J *j, bool with_filter) {
    if (!enter(j)) return NULL;
    tok *t = cur(j);
    node *n;
    if (is_op(t, P_SUB) || is_op(t, P_ADD)) {
        adv(j);
        node *o = parse_unary(j, false);
        if (!o) return NULL;
        n = nnew(j, E_UNARY, t);
        if (!n) return NULL;
        n->op = is_op(t, P_SUB) ? OP_NEG : OP_POS;
        n->a = o;
    } else {
        n = parse_primary(j);
    }
    if (n) n = parse_postfix(j, n);
    if (n && with_filter) n = parse_filter_expr(j, n);
    leave(j);
    return n;
}

static node *mk_bin(J *j, const tok *at, int op, node *a, node *b) {
    if (!a || !b) return NULL;
    node *n = nnew(j, E_BIN, at);
    if (!n) return NULL;
    n->op = (uint8_t)op;
    n->a = a;
    n->b = b;
    return n;
}

static node *parse_pow(J *j) {
    node *l = parse_unary(j, true);
    while (l && is_op(cur(j), P_POW)) {
        tok *t = cur(j);
        adv(j);
        l = mk_bin(j, t, OP_POW, l, parse_unary(j, true));
    }
    return l;
}

static node *parse_math2(J *j) {
    node *l = parse_pow(j);
    for (;;) {
        tok *t = cur(j);
        int op = is_op(t, P_MUL) ? OP_MUL : is_op(t, P_DIV) ? OP_DIV : is_op(t, P_FLOORDIV) ? OP_FLOORDIV
                 : is_op(t, P_MOD) ? OP_MOD : 0;
        if (!l || !op) return l;
        adv(j);
        l = mk_bin(j, t, op, l, parse_pow(j));
    }
}

static node *parse_concat(J *j) {
    node *l = parse_math2(j);
    while (l && is_op(cur(j), P_TILDE)) {
        tok *t = cur(j);
        adv(j);
        l = mk_bin(j, t, OP_CONCAT, l, parse_math2(j));
    }
    return l;
}

static node *parse_math1(J *j) {
    node *l = parse_concat(j);
    for (;;) {
        tok *t = cur(j);
        int op = is_op(t, P_ADD) ? OP_ADD : is_op(t, P_SUB) ? OP_SUB : 0;
        if (!l || !op) return l;
        adv(j);
        l = mk_bin(j, t, op, l, parse_concat(j));
    }
}

static node *parse_compare(J *j) {
    tok *t0 = cur(j);
    node *first = parse_math1(j);
    if (!first) return NULL;
    pvec kids = {0}, ops = {0};
    for (;;) {
        tok *t = cur(j);
        int op = is_op(t, P_EQ) ? OP_EQ : is_op(t, P_NE) ? OP_NE : is_op(t, P_LT) ? OP_LT
                 : is_op(t, P_LTEQ) ? OP_LE : is_op(t, P_GT) ? OP_GT : is_op(t, P_GTEQ) ? OP_GE : 0;
        if (op) adv(j);
        else if (is_name(t, "in")) { op = OP_IN; adv(j); }
        else if (is_name(t, "not") && is_name(look(j), "in")) { op = OP_NOTIN; adv(j); adv(j); }
        else break;
        node *r = parse_math1(j);
        if (!r || !pvec_push(j, &kids, r) || !pvec_push(j, &ops, (void *)(uintptr_t)op)) return NULL;
    }
    if (!kids.n) return first;
    node *n = nnew(j, E_CMP, t0);
    if (!n) return NULL;
    n->a = first;
    n->kids = (node **)kids.v;
    n->nkids = kids.n;
    n->ops = jj_arena_alloc(j, kids.n);
    if (!n->ops) return NULL;
    for (uint32_t i = 0; i < kids.n; i++) n->ops[i] = (uint8_t)(uintptr_t)ops.v[i];
    return n;
}

static node *parse_not(J *j) {
    tok *t = cur(j);
    if (is_name(t, "not")) {
        if (!enter(j)) return NULL;
        adv(j);
        node *o = parse_not(j);
        leave(j);
        if (!o) return NULL;
        node *n = nnew(j, E_UNARY, t);
        if (!n) return NULL;
        n->op = OP_NOT;
        n->a = o;
        return n;
    }
    return parse_compare(j);
}

static node *parse_and(J *j) {
    node *l = parse_not(j);
    while (l && is_name(cur(j), "and")) {
        tok *t = cur(j);
        adv(j);
        l = mk_bin(j, t, OP_AND, l, parse_not(j));
    }
    return l;
}

static node *parse_or(J *j) {
    node *l = parse_and(j);
    while (l && is_name(cur(j), "or")) {
        tok *t = cur(j);
        adv(j);
        l = mk_bin(j, t, OP_OR, l, parse_and(j));
    }
    return l;
}

static node *parse_condexpr(J *j) {
    node *e1 = parse_or(j);
    while (e1 && is_name(cur(j), "if")) {
        tok *t = cur(j);
        adv(j);
        node *cond = parse_or(j);
        if (!cond) return NULL;
        node *e3 = NULL;
        if (is_name(cur(j), "else")) {
            adv(j);
            if (!enter(j)) return NULL;
            e3 = parse_condexpr(j);
            leave(j);
            if (!e3) return NULL;
        }
        node *n = nnew(j, E_COND, t);
        if (!n) return NULL;
        n->a = e1;
        n->b = cond;
        n->c = e3;
        e1 = n;
    }
    return e1;
}

static node *parse_expression(J *j, bool with_condexpr) {
    if (!enter(j)) return NULL;
    node *n = with_condexpr ? parse_condexpr(j) : parse_or(j);
    leave(j);
    return n;
}

static bool tuple_end(J *j, bool explicit_parens, const char *extra_end) {
    tok *t = cur(j);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || t->type == TK_EOF) return true;
    if (explicit_parens && is_op(t, P_RPAREN)) return true;
    return extra_end && is_name(t, extra_end);
}

/* `a` or `a, b, ...` (a tuple). */
static node *parse_tuple(J *j, bool with_condexpr, bool explicit_parens, const char *extra_end) {
    tok *t0 = cur(j);
    pvec items = {0};
    bool is_tuple = false;
    for (;;) {
        if (items.n && !expect_op(j, P_COMMA, "','")) return NULL;
        if (tuple_end(j, explicit_parens, extra_end)) break;
        node *e = parse_expression(j, with_condexpr);
        if (!e || !pvec_push(j, &items, e)) return NULL;
        if (is_op(cur(j), P_COMMA)) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (items.n) return items.v[0];
        if (!explicit_parens) { jj_unexpected(j, "an expression"); return NULL; }
    }
    node *n = nnew(j, E_TUPLE, t0);
    if (!n) return NULL;
    n->kids = (node **)items.v;
    n->nkids = items.n;
    return n;
}

/* Assignment targets: `x`, `a, b` or `(a, b)`. */
static bool parse_targets(J *j, node *n) {
    bool paren = is_op(cur(j), P_LPAREN);
    if (paren) adv(j);
    pvec names = {0};
    for (;;) {
        const char *nm = expect_name(j);
        if (!nm || !pvec_push(j, &names, (void *)nm)) return false;
        if (!is_op(cur(j), P_COMMA)) break;
        adv(j);
        if (paren ? is_op(cur(j), P_RPAREN) : (cur(j)->type != TK_NAME || is_name(cur(j), "in"))) break;
    }
    if (paren && !expect_op(j, P_RPAREN, "')'")) return false;
    n->names = (const char **)names.v;
    n->nnames = names.n;
    return true;
}

static node *parse_body(J *j, const char *const *ends, const tok *opener, const char *block);

static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_ENDIF[] = {"endif", NULL};
static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_ENDFOR[] = {"endfor", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_CALL[] = {"endcall", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};

/* Consumes `{% endxxx %}` after parse_body stopped at it. */
static bool close_tag(J *j) {
    adv(j);
    return expect_end(j);
}

static bool parse_params(J *j, node *n) {
    if (!expect_op(j, P_LPAREN, "'('")) return false;
    pvec names = {0}, defs = {0};
    bool had_default = false;
    while (!is_op(cur(j), P_RPAREN)) {
        if (names.n && !expect_op(j, P_COMMA, "','")) return false;
        if (names.n && is_op(cur(j), P_RPAREN)) break;
        tok *t = cur(j);
        const char *nm = expect_name(j);
        if (!nm) return false;
        node *d = NULL;
        if (is_op(cur(j), P_ASSIGN)) {
            adv(j);
            if (!(d = parse_expression(j, true))) return false;
            had_default = true;
        } else if (had_default) {
            jj_synerr(j, t->line, t->col, "non-default argument follows default argument");
            return false;
        }
        if (!pvec_push(j, &names, (void *)nm) || !pvec_push(j, &defs, d)) return false;
    }
    adv(j);
    n->names = (const char **)names.v;
    n->nnames = names.n;
    n->kids2 = (node **)defs.v;
    return true;
}

/* Whether a macro body mentions `name` (Jinja only lets a macro take extra positional or keyword
 * arguments when its body uses `varargs` or `kwargs`). Bounded by the parser's nesting limit. */
static bool mentions(const node *n, const char *name, int depth) {
    /* ASTs deeper than the evaluator allows fail when run, so the answer no longer matters */
    if (!n || depth > MAX_EVAL_DEPTH + 8) return false;
    if (n->kind == E_NAME && strcmp(n->name, name) == 0) return true;
    if (n->kind == S_MACRO) return false; /* a nested macro has its own varargs */
    if (mentions(n->a, name, depth + 1) || mentions(n->b, name, depth + 1) || mentions(n->c, name, depth + 1) ||
        mentions(n->d, name, depth + 1))
        return true;
    for (uint32_t i = 0; i < n->nkids; i++)
        if (mentions(n->kids[i], name, depth + 1)) return true;
    if (n->kids2) {
        uint32_t k = n->kind == E_DICT ? n->nkids : n->nnames;
        for (uint32_t i = 0; i < k; i++)
            if (mentions(n->kids2[i], name, depth + 1)) return true;
    }
    return false;
}

static node *parse_statement(J *j) {
    tok *begin = cur(j);
    adv(j);
    tok *t = cur(j);
    if (t->type != TK_NAME) { jj_unexpected(j, "a tag name"); return NULL; }
    char tag[32];
    snprintf(tag, sizeof tag, "%.*s", (int)(t->n < 31 ? t->n : 31), t->s);
    node *n;

    if (is_name(t, "if")) {
        adv(j);
        n = nnew(j, S_IF, t);
        if (!n || !(n->a = parse_tuple(j, false, false, NULL)) || !expect_end(j)) return NULL;
        if (!(n->b = parse_body(j, END_IF, begin, "if"))) return NULL;
        node *ci = n;
        for (;;) {
            tok *e = cur(j);
            if (is_name(e, "elif")) {
                adv(j);
                node *x = nnew(j, S_IF, e);
                if (!x || !(x->a = parse_tuple(j, false, false, NULL)) || !expect_end(j)) return NULL;
                if (!(x->b = parse_body(j, END_IF, begin, "if"))) return NULL;
                ci->c = x;
                ci = x;
            } else if (is_name(e, "else")) {
                adv(j);
                if (!expect_end(j) || !(ci->c = parse_body(j, END_ENDIF, begin, "if"))) return NULL;
                return close_tag(j) ? n : NULL;
            } else {
                return close_tag(j) ? n : NULL;
            }
        }
    }
    if (is_name(t, "for")) {
        adv(j);
        n = nnew(j, S_FOR, t);
        if (!n || !parse_targets(j, n)) return NULL;
        if (!is_name(cur(j), "in")) { jj_unexpected(j, "'in'"); return NULL; }
        adv(j);
        if (!(n->a = parse_tuple(j, false, false, "recursive"))) return NULL;
        if (is_name(cur(j), "if")) {
            adv(j);
            if (!(n->b = parse_expression(j, true))) return NULL;
        }
        if (is_name(cur(j), "recursive")) {
            jj_synerr(j, cur(j)->line, cur(j)->col, "recursive for loops are not supported");
            return NULL;
        }
        if (!expect_end(j)) return NULL;
        j->loop_depth++;
        n->c = parse_body(j, END_FOR, begin, "for");
        j->loop_depth--;
        if (!n->c) return NULL;
        if (is_name(cur(j), "else")) {
            adv(j);
            if (!expect_end(j) || !(n->d = parse_body(j, END_ENDFOR, begin, "for"))) return NULL;
        }
        return close_tag(j) ? n : NULL;
    }
    if (is_name(t, "set")) {
        adv(j);
        if (cur(j)->type == TK_NAME && is_op(look(j), P_DOT)) {
            n = nnew(j, S_SETATTR, t);
            if (!n || !(n->name = expect_name(j))) return NULL;
            adv(j);
            const char *attr = expect_name(j);
            const char **names = jj_arena_alloc(j, sizeof(char *));
            if (!attr || !names) return NULL;
            names[0] = attr;
            n->names = names;
            n->nnames = 1;
            if (!expect_op(j, P_ASSIGN, "'='") || !(n->a = parse_tuple(j, true, false, NULL))) return NULL;
            return expect_end(j) ? n : NULL;
        }
        n = nnew(j, S_SET, t);
        if (!n || !parse_targets(j, n)) return NULL;
        if (is_op(cur(j), P_ASSIGN)) {
            adv(j);
            if (!(n->a = parse_tuple(j, true, false, NULL))) return NULL;
            return expect_end(j) ? n : NULL;
        }
        if (n->nnames != 1) { jj_unexpected(j, "'='"); return NULL; }
        n->kind = S_SETBLOCK;
        if (is_op(cur(j), P_PIPE)) {
            node *ph = nnew(j, E_PLACEHOLDER, cur(j));
            if (!ph || !(n->c = parse_filter(j, ph, false))) return NULL;
        }
        if (!expect_end(j) || !(n->b = parse_body(j, END_SET, begin, "set"))) return NULL;
        return close_tag(j) ? n : NULL;
    }
    if (is_name(t, "macro") || is_name(t, "call")) {
        bool is_macro = is_name(t, "macro");
        adv(j);
        n = nnew(j, is_macro ? S_MACRO : S_CALLBLOCK, t);
        if (!n) return NULL;
        if (is_macro) {
            if (!(n->name = expect_name(j)) || !parse_params(j, n)) return NULL;
        } else {
            if (is_op(cur(j), P_LPAREN) && !parse_params(j, n)) return NULL;
            tok *ct = cur(j);
            if (!(n->a = parse_expression(j, true))) return NULL;
            if (n->a->kind != E_CALL) { jj_synerr(j, ct->line, ct->col, "expected a call after 'call'"); return NULL; }
        }
        if (!expect_end(j)) return NULL;
        int saved = j->loop_depth;
        j->loop_depth = 0;
        n->b = parse_body(j, is_macro ? END_MACRO : END_CALL, begin, is_macro ? "macro" : "call");
        j->loop_depth = saved;
        if (!n->b) return NULL;
        n->flag = mentions(n->b, "varargs", 0);
        n->op = mentions(n->b, "kwargs", 0);
        return close_tag(j) ? n : NULL;
    }
    if (is_name(t, "break") || is_name(t, "continue")) {
        if (!j->loop_depth) { jj_synerr(j, t->line, t->col, "'%s' outside loop", tag); return NULL; }
        n = nnew(j, is_name(t, "break") ? S_BREAK : S_CONTINUE, t);
        adv(j);
        return n && expect_end(j) ? n : NULL;
    }
    if (is_name(t, "filter")) {
        adv(j);
        n = nnew(j, S_FILTERBLOCK, t);
        node *ph = n ? nnew(j, E_PLACEHOLDER, t) : NULL;
        if (!ph || !(n->a = parse_filter(j, ph, true)) || !expect_end(j)) return NULL;
        if (!(n->b = parse_body(j, END_FILTER, begin, "filter"))) return NULL;
        return close_tag(j) ? n : NULL;
    }
    if (is_name(t, "with")) {
        adv(j);
        n = nnew(j, S_WITH, t);
        if (!n) return NULL;
        pvec names = {0}, vals = {0};
        while (cur(j)->type != TK_BLOCK_END) {
            if (names.n && !expect_op(j, P_COMMA, "','")) return NULL;
            const char *nm = expect_name(j);
            if (!nm || !expect_op(j, P_ASSIGN, "'='")) return NULL;
            node *v = parse_expression(j, true);
            if (!v || !pvec_push(j, &names, (void *)nm) || !pvec_push(j, &vals, v)) return NULL;
        }
        n->names = (const char **)names.v;
        n->nnames = names.n;
        n->kids2 = (node **)vals.v;
        if (!expect_end(j) || !(n->b = parse_body(j, END_WITH, begin, "with"))) return NULL;
        return close_tag(j) ? n : NULL;
    }
    if (is_name(t, "generation")) {
        /* Hugging Face's {% generation %} marks assistant text for training masks; it renders
         * its body unchanged. */
        adv(j);
        if (!expect_end(j)) return NULL;
        n = parse_body(j, END_GEN, begin, "generation");
        return n && close_tag(j) ? n : NULL;
    }
    static const char *const unsupported[] = {"extends", "block", "include", "import", "from",
                                              "autoescape", "trans", "raw", NULL};
    if (jj_in_list(unsupported, tag)) {
        jj_synerr(j, t->line, t->col, "the '%s' tag is not supported in chat templates", tag);
        return NULL;
    }
    jj_synerr(j, t->line, t->col, "unknown tag '%s'", tag);
    return NULL;
}

static node *parse_body(J *j, const char *const *ends, const tok *opener, const char *block) {
    if (!enter(j)) return NULL;
    node *body = nnew(j, S_BODY, cur(j));
    if (!body) return NULL;
    pvec kids = {0};
    for (;;) {
        tok *t = cur(j);
        node *n = NULL;
        if (t->type == TK_EOF) {
            if (ends) {
                jj_synerr(j, opener->line, opener->col, "'%s' block is never closed (missing {%% %s %%})", block,
                       ends[0] && strcmp(ends[0], "elif") == 0 ? "endif" : ends[0]);
                return NULL;
            }
            break;
        }
        if (t->type == TK_DATA) {
            n = nnew(j, S_TEXT, t);
            if (!n) return NULL;
            n->name = t->s;
            n->name_len = t->n;
            adv(j);
        } else if (t->type == TK_VAR_BEGIN) {
            adv(j);
            n = nnew(j, S_OUT, t);
            if (!n || !(n->a = parse_tuple(j, true, false, NULL))) return NULL;
            if (cur(j)->type != TK_VAR_END) { jj_unexpected(j, "end of print statement"); return NULL; }
            adv(j);
        } else if (t->type == TK_BLOCK_BEGIN) {
            tok *nm = look(j);
            if (ends && nm->type == TK_NAME) {
                bool stop = false;
                for (const char *const *e = ends; *e; e++)
                    if (is_name(nm, *e)) stop = true;
                if (stop) { adv(j); break; }
            }
            static const char *const closers[] = {"endif", "endfor", "endset", "endmacro", "endcall",
                                                  "endfilter", "endwith", "endgeneration", "elif",
                                                  "else", "endraw", NULL};
            if (nm->type == TK_NAME) {
                char tag[32];
                snprintf(tag, sizeof tag, "%.*s", (int)(nm->n < 31 ? nm->n : 31), nm->s);
                if (jj_in_list(closers, tag)) {
                    if (ends)
                        jj_synerr(j, nm->line, nm->col, "unexpected '%s' inside the '%s' block opened at line %d (expected '%s')",
                               tag, block, opener->line, strcmp(ends[0], "elif") == 0 ? "endif" : ends[0]);
                    else
                        jj_synerr(j, nm->line, nm->col, "unexpected '%s' (no open block to close)", tag);
                    return NULL;
                }
            }
            if (!(n = parse_statement(j))) return NULL;
        } else {
            jj_unexpected(j, NULL);
            return NULL;
        }
        if (!pvec_push(j, &kids, n)) return NULL;
    }
    body->kids = (node **)kids.v;
    body->nkids = kids.n;
    leave(j);
    return body;
}

/* Newlines become \n and one trailing newline goes (keep_trailing_newline off), then lex+parse. */
node *jj_compile(J *j, const char *src) {
    size_t n = strlen(src);
    j->src = malloc(n + 1);
    if (!j->src) { jj_nomem(j); return NULL; }
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (src[i] == '\r') {
            if (i + 1 < n && src[i + 1] == '\n') i++;
            j->src[k++] = '\n';
        } else {
            j->src[k++] = src[i];
        }
    }
    if (k && j->src[k - 1] == '\n') k--;
    j->src[k] = 0;
    j->src_len = k;
    j->lex_line = j->lex_col = 1;
    if (!lex(j)) return NULL;
    j->pos = 0;
    return parse_body(j, NULL, NULL, NULL);
}

