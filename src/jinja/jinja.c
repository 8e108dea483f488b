/* A Jinja2 interpreter sized for chat templates.
 *
 * The reference is Jinja2 3.x configured as Hugging Face does for `apply_chat_template`:
 * trim_blocks, lstrip_blocks, keep_trailing_newline off, the loopcontrols extension, the
 * ImmutableSandboxedEnvironment (no mutating methods, range() capped at 100000), the default
 * Undefined, `raise_exception` and a json.dumps-based `tojson`. Exact output matters: a stray
 * space or newline changes the tokens the model sees, so whitespace handling and str() of values
 * mirror Python, including float repr.
 *
 * Templates come from model files, so they are untrusted. Every recursion is bounded (parser
 * nesting, evaluation depth, container nesting), every string and the output are size-capped, a
 * step budget stops runaway loops, and all failures unwind to one error with a line and column.
 *
 * Pipeline: newline normalization -> lexer (applies whitespace control, so the parser never sees
 * it) -> recursive-descent parser producing an arena-allocated AST -> tree-walking evaluator over
 * reference-counted values. */
#include "quill_chat.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ limits */

enum {
    MAX_PARSE_DEPTH = 128,   /* nested blocks plus nested brackets/operators in one expression */
    MAX_EVAL_DEPTH = 320,    /* evaluator frames: bounds C stack use, including macro recursion */
    MAX_NEST = 100,          /* nesting of list/dict values */
    MAX_RANGE = 100000,      /* the sandbox's MAX_RANGE */
};
#define MAX_STR_BYTES ((size_t)64 << 20) /* any single string, including the whole output */
#define MAX_ITEMS ((size_t)1 << 20)      /* elements of one list or dict */
#define MAX_STEPS 5000000ull             /* work units in one render; real templates use ~100 per message */

/* ------------------------------------------------------------------ values */

/* Order matters: types from T_STR on (and T_UNDEF carrying a hint) own a reference-counted block. */
typedef enum {
    T_UNDEF, T_NONE, T_BOOL, T_INT, T_FLOAT, T_FUNC,
    T_STR, T_LIST, T_DICT, T_NS, T_MACRO, T_LOOP, T_METHOD
} jtype;

typedef struct jv {
    uint8_t t;
    union {
        bool b;
        int64_t i;
        double f;
        int fn;
        void *p;
        struct jstr *s;
        struct jlist *l;
        struct jdict *d;
        struct jmacro *m;
        struct jloop *lp;
        struct jmethod *me;
    } u;
} jv;

/* rc < 0 marks an immortal object (string constants in the AST arena). */
typedef struct jstr { int32_t rc; size_t len; char s[]; } jstr;
typedef struct jlist { int32_t rc; uint16_t nest; bool tuple; size_t n, cap; jv *v; } jlist;
/* Dicts keep insertion order, as Python's do; namespaces are dicts with attribute syntax. */
typedef struct jkv { struct jv k, v; } jkv;
typedef struct jdict { int32_t rc; uint16_t nest; size_t n, cap; jkv *e; } jdict;
typedef struct jmacro { int32_t rc; const struct node *def; struct scope *closure; } jmacro;
typedef struct jloop { int32_t rc; int64_t i, n; jlist *items; } jloop;
typedef struct jmethod { int32_t rc; int id; jv self; } jmethod;

/* Variables of one frame. Frames normally die with the block that made them; a frame that a macro
 * closes over is "captured" and lives until the end of the render instead, which is what lets
 * macros hold a plain pointer to their defining frame without reference cycles. */
typedef struct scope {
    struct scope *parent;
    size_t n, cap;
    const char **k;
    jv *v;
    bool captured;
    struct scope *next_captured;
    /* most frames hold a loop variable and `loop`: no allocation for those */
    const char *k0[4];
    jv v0[4];
} scope;

/* ------------------------------------------------------------------ AST */

typedef enum {
    /* expressions */
    E_CONST, E_NAME, E_LIST, E_TUPLE, E_DICT, E_ATTR, E_ITEM, E_SLICE, E_CALL, E_FILTER, E_TEST,
    E_UNARY, E_BIN, E_CMP, E_COND, E_PLACEHOLDER,
    /* statements */
    S_BODY, S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_SETATTR, S_SETBLOCK, S_MACRO, S_CALLBLOCK,
    S_BREAK, S_CONTINUE, S_FILTERBLOCK, S_WITH
} nkind;

enum { OP_NOT = 1, OP_NEG, OP_POS, OP_ADD, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW,
       OP_CONCAT, OP_AND, OP_OR, OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN };

typedef struct node {
    uint8_t kind, op;
    bool flag;               /* E_TEST: negated; E_TUPLE/E_LIST from `a, b` */
    int line, col;
    const char *name;        /* NUL-terminated: variable, attribute, filter, test, macro, text */
    size_t name_len;
    struct node *a, *b, *c, *d;
    struct node **kids;      /* positional args, items, keys, statements, compare operands */
    uint32_t nkids;
    struct node **kids2;     /* keyword values, dict values, parameter defaults (may hold NULL) */
    const char **names;      /* keyword names, assignment targets, parameters */
    uint32_t nnames;
    uint8_t *ops;            /* E_CMP operators, one per operand */
    jv cval;                 /* E_CONST */
} node;

/* ------------------------------------------------------------------ context */

typedef enum { TK_EOF, TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END,
               TK_NAME, TK_STRING, TK_INT, TK_FLOAT, TK_OP } tkind;

enum { P_ADD = 1, P_SUB, P_DIV, P_FLOORDIV, P_MUL, P_POW, P_MOD, P_TILDE, P_LBRACKET, P_RBRACKET,
       P_LPAREN, P_RPAREN, P_LBRACE, P_RBRACE, P_EQ, P_NE, P_GT, P_GTEQ, P_LT, P_LTEQ, P_ASSIGN,
       P_DOT, P_COLON, P_PIPE, P_COMMA, P_SEMICOLON };

typedef struct tok {
    uint8_t type, op;
    int line, col;
    const char *s;   /* TK_DATA/TK_NAME: into the source; TK_STRING: decoded, in the arena */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct ablock { struct ablock *next; size_t used, cap; } ablock;

typedef struct jbuf { char *p; size_t n, cap; } jbuf;

typedef struct J {
    /* source and tokens */
    char *src;
    size_t src_len;
    tok *toks;
    size_t ntok, captok, pos;
    int lex_line, lex_col;
    size_t lex_off;
    /* parser */
    int pdepth;
    int loop_depth;          /* enclosing for-loops of the statement being parsed */
    ablock *arena;
    /* evaluator */
    int depth;
    uint64_t steps;
    const node *at;          /* node being evaluated, for errors raised by helpers */
    jv placeholder;          /* operand of a {% filter %} block */
    scope *captured;
    jdict **nss;             /* every namespace, held until the end to break reference cycles */
    size_t n_nss, cap_nss;
    /* error */
    bool failed;
    quill_status status;
    char msg[700];
} J;

static void jfail_v(J *j, quill_status st, int line, int col, const char *what, const char *fmt,
                    va_list ap) {
    if (j->failed) return;
    j->failed = true;
    j->status = st;
    char m[600];
    vsnprintf(m, sizeof m, fmt, ap);
    if (st == QUILL_E_NOMEM || line <= 0)
        snprintf(j->msg, sizeof j->msg, "chat template %s: %s", what, m);
    else
        snprintf(j->msg, sizeof j->msg, "chat template %s at line %d, column %d: %s", what, line, col, m);
}

/* Syntax errors, reported at a token or node. */
static void synerr(J *j, int line, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void synerr(J *j, int line, int col, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    jfail_v(j, QUILL_E_TEMPLATE, line, col, "syntax error", fmt, ap);
    va_end(ap);
}

/* Runtime errors at a node (NULL: the node being evaluated). */
static void rterr(J *j, const node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void rterr(J *j, const node *at, const char *fmt, ...) {
    if (!at) at = j->at;
    va_list ap;
    va_start(ap, fmt);
    jfail_v(j, QUILL_E_TEMPLATE, at ? at->line : 0, at ? at->col : 0, "error", fmt, ap);
    va_end(ap);
}

/* Work that scales with data size counts against the step budget too (one step per 64 bytes
 * scanned or allocated, one per list element), so no template can loop over huge strings. */
static bool charge(J *j, uint64_t units) {
    j->steps += units;
    if (j->steps > MAX_STEPS && !j->failed) {
        rterr(j, NULL, "template did not finish within %llu steps", (unsigned long long)MAX_STEPS);
        return false;
    }
    return !j->failed;
}

static void nomem(J *j) {
    if (j->failed) return;
    j->failed = true;
    j->status = QUILL_E_NOMEM;
    snprintf(j->msg, sizeof j->msg, "chat template: out of memory");
}

static void *jmalloc(J *j, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) nomem(j);
    return p;
}

/* Grows an array of `elem` bytes to hold at least `need` elements. */
static bool grow(J *j, void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    if (need > MAX_ITEMS * 4) { rterr(j, NULL, "too many items"); return false; }
    size_t nc = *cap ? *cap : 4;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, nc * elem);
    if (!p) { nomem(j); return false; }
    *arr = p;
    *cap = nc;
    return true;
}

/* ------------------------------------------------------------------ arena (AST lifetime) */

static void *arena_alloc(J *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ablock *b = j->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        size_t hdr = (sizeof(ablock) + 15) & ~(size_t)15;
        b = malloc(hdr + cap);
        if (!b) { nomem(j); return NULL; }
        b->next = j->arena;
        b->used = hdr;
        b->cap = hdr + cap;
        j->arena = b;
    }
    void *p = (char *)b + b->used;
    b->used += n;
    memset(p, 0, n);
    return p;
}

static char *arena_strndup(J *j, const char *s, size_t n) {
    char *p = arena_alloc(j, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

static void arena_free(ablock *b) {
    while (b) {
        ablock *n = b->next;
        free(b);
        b = n;
    }
}

/* ------------------------------------------------------------------ growable byte buffer */

static bool bput(J *j, jbuf *b, const void *s, size_t n) {
    if (n > MAX_STR_BYTES - b->n) {
        rterr(j, NULL, "string or output larger than %zu bytes", MAX_STR_BYTES);
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) { nomem(j); return false; }
        b->p = p;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

static bool bputs(J *j, jbuf *b, const char *s) { return bput(j, b, s, strlen(s)); }
static bool bputc(J *j, jbuf *b, char c) { return bput(j, b, &c, 1); }

static bool bprintf(J *j, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static bool bprintf(J *j, jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1;
    return bput(j, b, tmp, (size_t)n);
}

static void bfree(jbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ------------------------------------------------------------------ UTF-8 and Unicode helpers */

/* Bytes that are not valid UTF-8 decode to 0x110000 + byte, so that a string transformed code
 * point by code point is written back byte for byte. */
#define CP_BAD 0x110000u

static inline bool u8cont(unsigned char c) { return (c & 0xC0) == 0x80; }

static inline uint32_t u8dec(const char *str, size_t n, size_t *len) {
    const unsigned char *s = (const unsigned char *)str;
    unsigned char c = s[0];
    if (c < 0x80) { *len = 1; return c; }
    if (c >= 0xC2 && c < 0xE0 && n >= 2 && u8cont(s[1])) {
        *len = 2;
        return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F);
    }
    if (c >= 0xE0 && c < 0xF0 && n >= 3 && u8cont(s[1]) && u8cont(s[2])) {
        uint32_t cp = ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
        if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) { *len = 3; return cp; }
    }
    if (c >= 0xF0 && c < 0xF5 && n >= 4 && u8cont(s[1]) && u8cont(s[2]) && u8cont(s[3])) {
        uint32_t cp = ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) |
                      ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
        if (cp >= 0x10000 && cp <= 0x10FFFF) { *len = 4; return cp; }
    }
    *len = 1;
    return CP_BAD + c;
}

static size_t u8enc(uint32_t cp, char *o) {
    if (cp >= CP_BAD) { o[0] = (char)(cp - CP_BAD); return 1; }
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

static size_t u8len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n;) {
        if ((unsigned char)s[i] < 0x80) { i++; c++; continue; }
        size_t l;
        u8dec(s + i, n - i, &l);
        i += l;
        c++;
    }
    return c;
}

/* Python's str.isspace(), which is what strip(), split() and the lexer's \s use. */
static bool py_space(uint32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Length of the Python whitespace at s[0..n), or 0. */
static size_t space_at(const char *s, size_t n) {
    size_t l;
    uint32_t c = u8dec(s, n, &l);
    return py_space(c) ? l : 0;
}

/* Offset where trailing Python whitespace of s[0..n) begins. */
static size_t rstrip_ws(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && u8cont((unsigned char)s[st]) && end - st < 4) st--;
        size_t l;
        uint32_t c = u8dec(s + st, end - st, &l);
        if (st + l != end) { st = end - 1; c = CP_BAD; }
        if (!py_space(c)) break;
        end = st;
    }
    return end;
}

/* Simple case mapping for the scripts chat text commonly uses (ASCII, Latin-1, Latin Extended-A
 * and Additional, Greek, Cyrillic, Armenian, fullwidth). Python's full mapping also changes a few
 * characters into several (ß -> SS); those stay unchanged here. */
static uint32_t cp_upper(uint32_t c) {
    if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
    if (c == 0xB5) return 0x39C;
    if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
    if (c == 0xFF) return 0x178;
    if (c >= 0x100 && c <= 0x17F) {
        if (c == 0x131) return 'I';
        if (c == 0x17F) return 'S';
        if ((c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
            return (c & 1) ? c - 1 : c;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c : c - 1;
        return c;
    }
    if (c >= 0x3B1 && c <= 0x3C9) return c == 0x3C2 ? 0x3A3 : c - 32;
    if (c == 0x3AC) return 0x386;
    if (c >= 0x3AD && c <= 0x3AF) return c - 37;
    if (c == 0x3CC) return 0x38C;
    if (c == 0x3CD || c == 0x3CE) return c - 63;
    if (c >= 0x430 && c <= 0x44F) return c - 32;
    if (c >= 0x450 && c <= 0x45F) return c - 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c & 1) ? c - 1 : c;
    if (c >= 0x561 && c <= 0x586) return c - 48;
    if ((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) return (c & 1) ? c - 1 : c;
    if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
    return c;
}

static uint32_t cp_lower(uint32_t c) {
    if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
    if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
    if (c == 0x178) return 0xFF;
    if (c >= 0x100 && c <= 0x17F) {
        if ((c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177))
            return (c & 1) ? c : c + 1;
        if ((c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E)) return (c & 1) ? c + 1 : c;
        return c;
    }
    if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
    if (c == 0x386) return 0x3AC;
    if (c >= 0x388 && c <= 0x38A) return c + 37;
    if (c == 0x38C) return 0x3CC;
    if (c == 0x38E || c == 0x38F) return c + 63;
    if (c >= 0x410 && c <= 0x42F) return c + 32;
    if (c >= 0x400 && c <= 0x40F) return c + 80;
    if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return (c & 1) ? c : c + 1;
    if (c >= 0x531 && c <= 0x556) return c + 48;
    if ((c >= 0x1E00 && c <= 0x1E95) || (c >= 0x1EA0 && c <= 0x1EFF)) return (c & 1) ? c : c + 1;
    if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
    return c;
}

static bool cp_cased(uint32_t c) {
    return cp_upper(c) != c || cp_lower(c) != c || c == 0xDF || c == 0x138 || c == 0x149;
}
static bool cp_is_lower(uint32_t c) { return cp_upper(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }
static bool cp_is_upper(uint32_t c) { return cp_lower(c) != c; }
static bool cp_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return c < CP_BAD && (cp_cased(c) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) ||
                          (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x0600 && c <= 0x06FF) ||
                          (c >= 0x0900 && c <= 0x0DFF) || (c >= 0x0E00 && c <= 0x0E7F) ||
                          (c >= 0x05D0 && c <= 0x05EA) || c == 0xAA || c == 0xBA);
}
static bool cp_digit(uint32_t c) { return c >= '0' && c <= '9'; }

/* ------------------------------------------------------------------ value lifetime */

static inline jv mk_undef(void) { jv v = {T_UNDEF, {.p = NULL}}; return v; }
static inline jv mk_none(void) { jv v = {T_NONE, {.p = NULL}}; return v; }
static inline jv mk_bool(bool b) { jv v = {T_BOOL, {.b = b}}; return v; }
static inline jv mk_int(int64_t i) { jv v = {T_INT, {.i = i}}; return v; }
static inline jv mk_float(double f) { jv v = {T_FLOAT, {.f = f}}; return v; }
static inline jv mk_func(int fn) { jv v = {T_FUNC, {.fn = fn}}; return v; }

static inline bool heap(jv v) { return v.t >= T_STR || (v.t == T_UNDEF && v.u.p); }

static inline jv ref(jv v) {
    if (heap(v)) {
        int32_t *rc = v.u.p;
        if (*rc >= 0) (*rc)++;
    }
    return v;
}

static void unref(jv v);

static void free_dict(jdict *d) {
    for (size_t i = 0; i < d->n; i++) { unref(d->e[i].k); unref(d->e[i].v); }
    free(d->e);
    free(d);
}

static void unref(jv v) {
    if (!heap(v)) return;
    int32_t *rc = v.u.p;
    if (*rc < 0 || --*rc > 0) return;
    switch (v.t) {
    case T_LIST:
        for (size_t i = 0; i < v.u.l->n; i++) unref(v.u.l->v[i]);
        free(v.u.l->v);
        free(v.u.l);
        break;
    case T_DICT: case T_NS: free_dict(v.u.d); break;
    case T_LOOP:
        if (v.u.lp->items) { jv l = {T_LIST, {.l = v.u.lp->items}}; unref(l); }
        free(v.u.lp);
        break;
    case T_METHOD: unref(v.u.me->self); free(v.u.me); break;
    default: free(v.u.p); break; /* strings, undefined hints, macros */
    }
}

/* ------------------------------------------------------------------ constructors */

static jstr *str_alloc(J *j, size_t n) {
    if (n > MAX_STR_BYTES) { rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES); return NULL; }
    if (!charge(j, n / 64)) return NULL;
    jstr *s = jmalloc(j, sizeof(jstr) + n + 1);
    if (!s) return NULL;
    s->rc = 1;
    s->len = n;
    s->s[n] = 0;
    return s;
}

/* Returns false (with the error set) on failure; *out is then T_UNDEF. */
static bool mk_strn(J *j, const char *p, size_t n, jv *out) {
    *out = mk_undef();
    jstr *s = str_alloc(j, n);
    if (!s) return false;
    if (n) memcpy(s->s, p, n);
    out->t = T_STR;
    out->u.s = s;
    return true;
}

static bool mk_str(J *j, const char *p, jv *out) { return mk_strn(j, p, strlen(p), out); }

/* Moves a buffer's bytes into a string value and empties the buffer. */
static bool buf_to_str(J *j, jbuf *b, jv *out) {
    bool ok = mk_strn(j, b->p ? b->p : "", b->n, out);
    bfree(b);
    return ok;
}

static jlist *list_new(J *j, size_t cap) {
    if (cap > MAX_ITEMS) { rterr(j, NULL, "list longer than %zu items", MAX_ITEMS); return NULL; }
    jlist *l = jmalloc(j, sizeof *l);
    if (!l) return NULL;
    memset(l, 0, sizeof *l);
    l->rc = 1;
    if (cap) {
        l->v = jmalloc(j, cap * sizeof(jv));
        if (!l->v) { free(l); return NULL; }
        l->cap = cap;
    }
    return l;
}

static inline jv list_val(jlist *l) { jv v = {T_LIST, {.l = l}}; return v; }

static uint16_t nest_of(jv v) {
    if (v.t == T_LIST) return v.u.l->nest;
    if (v.t == T_DICT) return v.u.d->nest;
    return 0;
}

/* Appends, taking ownership of v (released on failure). Nesting is tracked at construction so
 * that every recursive walk over values (printing, tojson, equality, freeing) is bounded. */
static bool list_push(J *j, jlist *l, jv v) {
    uint16_t nn = nest_of(v) + 1;
    if (nn > MAX_NEST) { unref(v); rterr(j, NULL, "values nested deeper than %d levels", MAX_NEST); return false; }
    if (l->n >= MAX_ITEMS) { unref(v); rterr(j, NULL, "list longer than %zu items", MAX_ITEMS); return false; }
    if (!charge(j, 1)) { unref(v); return false; }
    if (!grow(j, (void **)&l->v, &l->cap, l->n + 1, sizeof(jv))) { unref(v); return false; }
    l->v[l->n++] = v;
    if (nn > l->nest) l->nest = nn;
    return true;
}

static jdict *dict_new(J *j) {
    jdict *d = jmalloc(j, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    d->rc = 1;
    return d;
}

static inline jv dict_val(jdict *d) { jv v = {T_DICT, {.d = d}}; return v; }

static bool jv_eq(jv a, jv b, int depth);

static size_t dict_find(const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jv_eq(d->e[i].k, key, 0)) return i;
    return SIZE_MAX;
}

static jv *dict_get_str(const jdict *d, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].k.t == T_STR && d->e[i].k.u.s->len == n && memcmp(d->e[i].k.u.s->s, s, n) == 0)
            return &d->e[i].v;
    return NULL;
}

/* Inserts or replaces, taking ownership of k and v. */
static bool dict_set(J *j, jdict *d, jv k, jv v) {
    size_t i = dict_find(d, k);
    if (i != SIZE_MAX) {
        unref(k);
        unref(d->e[i].v);
        d->e[i].v = v;
    } else {
        if (d->n >= MAX_ITEMS) { unref(k); unref(v); rterr(j, NULL, "dict larger than %zu items", MAX_ITEMS); return false; }
        if (!grow(j, (void **)&d->e, &d->cap, d->n + 1, sizeof(jkv))) { unref(k); unref(v); return false; }
        d->e[d->n].k = k;
        d->e[d->n].v = v;
        d->n++;
    }
    uint16_t nn = nest_of(v) + 1;
    if (nn > MAX_NEST) { rterr(j, NULL, "values nested deeper than %d levels", MAX_NEST); return false; }
    if (nn > d->nest) d->nest = nn;
    return true;
}

static bool dict_set_cstr(J *j, jdict *d, const char *key, jv v) {
    jv k;
    if (!mk_str(j, key, &k)) { unref(v); return false; }
    return dict_set(j, d, k, v);
}

/* Namespaces are the only mutable containers, so the only way to build a reference cycle; the
 * context keeps each one alive until the end of the render and then empties them all. */
static bool ns_new(J *j, jv *out) {
    *out = mk_undef();
    jdict *d = dict_new(j);
    if (!d) return false;
    if (!grow(j, (void **)&j->nss, &j->cap_nss, j->n_nss + 1, sizeof(jdict *))) { free(d); return false; }
    d->rc = 2;
    j->nss[j->n_nss++] = d;
    out->t = T_NS;
    out->u.d = d;
    return true;
}

static bool mk_method(J *j, int id, jv self, jv *out) {
    *out = mk_undef();
    jmethod *m = jmalloc(j, sizeof *m);
    if (!m) return false;
    m->rc = 1;
    m->id = id;
    m->self = ref(self);
    out->t = T_METHOD;
    out->u.me = m;
    return true;
}

/* An Undefined carrying Jinja's explanation, shown if something later uses it. */
static jv mk_undef_msg(J *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static jv mk_undef_msg(J *j, const char *fmt, ...) {
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    jv s;
    if (!mk_str(j, m, &s)) return mk_undef();
    jv u = {T_UNDEF, {.s = s.u.s}};
    return u;
}

/* ------------------------------------------------------------------ type names and truth */

static const char *type_name(jv v) {
    switch (v.t) {
    case T_UNDEF: return "Undefined";
    case T_NONE: return "NoneType";
    case T_BOOL: return "bool";
    case T_INT: return "int";
    case T_FLOAT: return "float";
    case T_FUNC: return "builtin_function_or_method";
    case T_STR: return "str";
    case T_LIST: return v.u.l->tuple ? "tuple" : "list";
    case T_DICT: return "dict";
    case T_NS: return "Namespace";
    case T_MACRO: return "Macro";
    case T_LOOP: return "LoopContext";
    default: return "builtin_function_or_method";
    }
}

/* Jinja's object_type_repr, used in "'dict object' has no attribute 'x'". */
static void obj_type_repr(jv v, char *o, size_t cap) {
    if (v.t == T_NONE) snprintf(o, cap, "None");
    else snprintf(o, cap, "%s object", type_name(v));
}

static jv undef_attr(J *j, jv obj, const char *name) {
    char t[64];
    obj_type_repr(obj, t, sizeof t);
    return mk_undef_msg(j, "'%s' has no attribute '%s'", t, name);
}

static bool truthy(jv v) {
    switch (v.t) {
    case T_UNDEF: case T_NONE: return false;
    case T_BOOL: return v.u.b;
    case T_INT: return v.u.i != 0;
    case T_FLOAT: return v.u.f != 0.0;
    case T_STR: return v.u.s->len != 0;
    case T_LIST: return v.u.l->n != 0;
    case T_DICT: return v.u.d->n != 0;
    default: return true;
    }
}

static inline bool is_num(jv v) { return v.t == T_INT || v.t == T_FLOAT || v.t == T_BOOL; }
static inline bool is_intlike(jv v) { return v.t == T_INT || v.t == T_BOOL; }
static inline int64_t as_int(jv v) { return v.t == T_BOOL ? (int64_t)v.u.b : v.u.i; }
static inline double as_dbl(jv v) { return v.t == T_FLOAT ? v.u.f : (double)as_int(v); }

/* The error for using an Undefined where Jinja raises UndefinedError. */
static void undef_err(J *j, const node *at, jv u) {
    if (u.u.s) rterr(j, at, "%s", u.u.s->s);
    else rterr(j, at, "value is undefined");
}

/* ------------------------------------------------------------------ equality and ordering */

static bool jv_eq(jv a, jv b, int depth) {
    if (depth > MAX_NEST + 8) return false;
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) == as_int(b);
        return as_dbl(a) == as_dbl(b);
    }
    if (a.t != b.t) return false;
    switch (a.t) {
    case T_UNDEF: case T_NONE: return true;
    case T_FUNC: return a.u.fn == b.u.fn;
    case T_STR: return a.u.s->len == b.u.s->len && memcmp(a.u.s->s, b.u.s->s, a.u.s->len) == 0;
    case T_LIST:
        if (a.u.l->tuple != b.u.l->tuple || a.u.l->n != b.u.l->n) return false;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jv_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case T_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            size_t k = dict_find(b.u.d, a.u.d->e[i].k);
            if (k == SIZE_MAX || !jv_eq(a.u.d->e[i].v, b.u.d->e[k].v, depth + 1)) return false;
        }
        return true;
    case T_METHOD: return a.u.me->id == b.u.me->id && jv_eq(a.u.me->self, b.u.me->self, depth + 1);
    default: return a.u.p == b.u.p;
    }
}

/* Python ordering: numbers with numbers, strings with strings (code point order, which UTF-8
 * byte order preserves), sequences lexicographically; anything else is a TypeError. */
static bool jv_cmp(J *j, jv a, jv b, const char *opname, int *res, int depth) {
    if (a.t == T_UNDEF) { undef_err(j, NULL, a); return false; }
    if (b.t == T_UNDEF) { undef_err(j, NULL, b); return false; }
    if (depth > MAX_NEST + 8) { rterr(j, NULL, "values nested too deeply to compare"); return false; }
    if (is_num(a) && is_num(b)) {
        if (is_intlike(a) && is_intlike(b)) *res = (as_int(a) > as_int(b)) - (as_int(a) < as_int(b));
        else {
            double x = as_dbl(a), y = as_dbl(b);
            *res = (x > y) - (x < y);
            if (x != x || y != y) *res = 2; /* NaN: every ordering is false */
        }
        return true;
    }
    if (a.t == T_STR && b.t == T_STR) {
        size_t n = a.u.s->len < b.u.s->len ? a.u.s->len : b.u.s->len;
        int c = memcmp(a.u.s->s, b.u.s->s, n);
        *res = c ? (c > 0 ? 1 : -1) : (a.u.s->len > b.u.s->len) - (a.u.s->len < b.u.s->len);
        return true;
    }
    if (a.t == T_LIST && b.t == T_LIST && a.u.l->tuple == b.u.l->tuple) {
        size_t n = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < n; i++) {
            if (jv_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return jv_cmp(j, a.u.l->v[i], b.u.l->v[i], opname, res, depth + 1);
        }
        *res = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return true;
    }
    rterr(j, NULL, "'%s' not supported between instances of '%s' and '%s'", opname, type_name(a),
          type_name(b));
    return false;
}

/* ------------------------------------------------------------------ Python number formatting */

/* strtod that also accepts '.' when the C library runs under a locale with another radix. */
static double loc_strtod(const char *s, char **end) {
    double d = strtod(s, end);
    if (end && **end == '.') {
        char tmp[400];
        size_t n = strlen(s);
        if (n < sizeof tmp) {
            memcpy(tmp, s, n + 1);
            tmp[*end - s] = ',';
            char *e2;
            double d2 = strtod(tmp, &e2);
            if (e2 > tmp + (*end - s)) { *end = (char *)s + (e2 - tmp); return d2; }
        }
    }
    return d;
}

/* repr(float): the shortest digits that round-trip, fixed notation for exponents -4..15, with
 * ".0" added to integral values. */
static void fmt_float(double x, char *out, size_t cap) {
    if (x != x) { snprintf(out, cap, "nan"); return; }
    if (isinf(x)) { snprintf(out, cap, x < 0 ? "-inf" : "inf"); return; }
    if (x == 0) { snprintf(out, cap, signbit(x) ? "-0.0" : "0.0"); return; }
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        char *end;
        if (loc_strtod(tmp, &end) == x) break;
    }
    /* tmp is [-]d[<radix>ddd]e[+-]XX in whatever radix the locale uses */
    char digits[40];
    int nd = 0;
    const char *p = tmp;
    bool neg = false;
    if (*p == '-') { neg = true; p++; }
    while (*p && *p != 'e') {
        if (*p >= '0' && *p <= '9') digits[nd++] = *p;
        p++;
    }
    int exp10 = *p == 'e' ? atoi(p + 1) : 0;
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char o[64];
    size_t k = 0;
    if (neg) o[k++] = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 >= 0) {
            for (int i = 0; i <= exp10; i++) o[k++] = i < nd ? digits[i] : '0';
            o[k++] = '.';
            if (nd > exp10 + 1) for (int i = exp10 + 1; i < nd; i++) o[k++] = digits[i];
            else o[k++] = '0';
        } else {
            o[k++] = '0';
            o[k++] = '.';
            for (int i = 0; i < -exp10 - 1; i++) o[k++] = '0';
            for (int i = 0; i < nd; i++) o[k++] = digits[i];
        }
        o[k] = 0;
    } else {
        o[k++] = digits[0];
        if (nd > 1) {
            o[k++] = '.';
            for (int i = 1; i < nd; i++) o[k++] = digits[i];
        }
        o[k] = 0;
        snprintf(o + k, sizeof o - k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(out, cap, "%s", o);
}

/* Python repr() of a string: single quotes unless the text has ' and no ". */
static bool put_repr_str(J *j, jbuf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    if (!bputc(j, b, q)) return false;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = u8dec(s + i, n - i, &l);
        bool ok;
        if (c == (uint32_t)q || c == '\\') { char e[2] = {'\\', (char)c}; ok = bput(j, b, e, 2); }
        else if (c == '\n') ok = bput(j, b, "\\n", 2);
        else if (c == '\r') ok = bput(j, b, "\\r", 2);
        else if (c == '\t') ok = bput(j, b, "\\t", 2);
        else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) ok = bprintf(j, b, "\\x%02x", c);
        else if (c >= CP_BAD) ok = bprintf(j, b, "\\udc%02x", c - CP_BAD);
        else if (c == 0x2028 || c == 0x2029) ok = bprintf(j, b, "\\u%04x", c);
        else ok = bput(j, b, s + i, l);
        if (!ok) return false;
        i += l;
    }
    return bputc(j, b, q);
}

/* str(v) (repr=false) or repr(v) (repr=true), as Python prints them. */
static bool put_value(J *j, jbuf *b, jv v, bool repr, int depth) {
    if (depth > MAX_NEST + 8) { rterr(j, NULL, "value nested too deeply to print"); return false; }
    char tmp[64];
    switch (v.t) {
    case T_UNDEF: return repr ? bputs(j, b, "Undefined") : true;
    case T_NONE: return bputs(j, b, "None");
    case T_BOOL: return bputs(j, b, v.u.b ? "True" : "False");
    case T_INT: return bprintf(j, b, "%lld", (long long)v.u.i);
    case T_FLOAT: fmt_float(v.u.f, tmp, sizeof tmp); return bputs(j, b, tmp);
    case T_STR:
        return repr ? put_repr_str(j, b, v.u.s->s, v.u.s->len) : bput(j, b, v.u.s->s, v.u.s->len);
    case T_LIST: {
        jlist *l = v.u.l;
        if (!charge(j, l->n) || !bputc(j, b, l->tuple ? '(' : '[')) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (i && !bput(j, b, ", ", 2)) return false;
            if (!put_value(j, b, l->v[i], true, depth + 1)) return false;
        }
        if (l->tuple && l->n == 1 && !bputc(j, b, ',')) return false;
        return bputc(j, b, l->tuple ? ')' : ']');
    }
    case T_DICT: case T_NS: {
        jdict *d = v.u.d;
        if (!charge(j, d->n)) return false;
        if (v.t == T_NS && !bputs(j, b, "<Namespace ")) return false;
        if (!bputc(j, b, '{')) return false;
        for (size_t i = 0; i < d->n; i++) {
            if (i && !bput(j, b, ", ", 2)) return false;
            if (!put_value(j, b, d->e[i].k, true, depth + 1) || !bput(j, b, ": ", 2) ||
                !put_value(j, b, d->e[i].v, true, depth + 1))
                return false;
        }
        if (!bputc(j, b, '}')) return false;
        return v.t == T_NS ? bputc(j, b, '>') : true;
    }
    case T_MACRO: return bprintf(j, b, "<Macro '%s'>", v.u.m->def->name ? v.u.m->def->name : "caller");
    case T_LOOP: return bprintf(j, b, "<LoopContext %lld/%lld>", (long long)v.u.lp->i + 1, (long long)v.u.lp->n);
    default: return bputs(j, b, "<built-in function>");
    }
}

/* str(v) as a new string value (a string is returned as is). */
static bool to_str(J *j, jv v, jv *out) {
    if (v.t == T_STR) { *out = ref(v); return true; }
    jbuf b = {0};
    if (!put_value(j, &b, v, false, 0)) { bfree(&b); *out = mk_undef(); return false; }
    return buf_to_str(j, &b, out);
}

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
    if (!grow(j, (void **)&j->toks, &j->captok, j->ntok + 1, sizeof(tok))) return NULL;
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
    jfail_v(j, QUILL_E_TEMPLATE, line, col, "syntax error", fmt, ap);
    va_end(ap);
}

static size_t skip_ws(const char *s, size_t n, size_t i) {
    size_t l;
    while (i < n && (l = space_at(s + i, n - i)) > 0) i += l;
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
        size_t l = space_at(s + i, end - i);
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
    char *o = arena_alloc(j, n + 1); /* escapes never expand: \U0010FFFF (10 bytes) -> 4 bytes */
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
                k += u8enc(cp, o + k);
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
        k += u8enc(cp, o + k);
    }
    o[k] = 0;
    *out = o;
    *outn = k;
    return true;
}

static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool name_start(unsigned char c) { return c == '_' || ((c | 32) >= 'a' && (c | 32) <= 'z') || c >= 0x80; }
static bool name_char(unsigned char c) { return name_start(c) || is_digit((char)c); }

/* (\d+_)*\d+ */
static size_t scan_digits(const char *s, size_t n, size_t i) {
    while (i < n && is_digit(s[i])) {
        i++;
        if (i + 1 < n && s[i] == '_' && is_digit(s[i + 1])) i++;
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
        if (f + 1 < n && s[f] == '.' && is_digit(s[f + 1])) { f = scan_digits(s, n, f + 1); fl = true; }
        if (f < n && (s[f] | 32) == 'e') {
            size_t x = f + 1;
            if (x < n && (s[x] == '+' || s[x] == '-')) x++;
            if (x < n && is_digit(s[x])) { f = scan_digits(s, n, x); fl = true; }
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
        tk->f = loc_strtod(buf, &end);
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
        size_t l = space_at(s + t, n - t);
        if (l) { t += l; continue; }
        unsigned char c = (unsigned char)s[t];
        if (is_digit((char)c)) {
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
        if (sign == '-') tend = pos + rstrip_ws(s + pos, p - pos);
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
                    if (es == '-') de = cs + rstrip_ws(s + cs, e - cs);
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

static void unexpected(J *j, const char *wanted) {
    char d[64];
    tok *t = cur(j);
    tok_desc(t, d, sizeof d);
    if (wanted) synerr(j, t->line, t->col, "expected %s, got %s", wanted, d);
    else synerr(j, t->line, t->col, "unexpected %s", d);
}

static bool expect_op(J *j, int op, const char *what) {
    if (is_op(cur(j), op)) { adv(j); return true; }
    unexpected(j, what);
    return false;
}

static const char *expect_name(J *j) {
    tok *t = cur(j);
    if (t->type != TK_NAME) { unexpected(j, "a name"); return NULL; }
    adv(j);
    return arena_strndup(j, t->s, t->n);
}

static bool expect_end(J *j) {
    if (cur(j)->type == TK_BLOCK_END) { adv(j); return true; }
    unexpected(j, "end of statement block");
    return false;
}

static node *nnew(J *j, int kind, const tok *at) {
    node *n = arena_alloc(j, sizeof *n);
    if (!n) return NULL;
    n->kind = (uint8_t)kind;
    n->line = at->line;
    n->col = at->col;
    return n;
}

static bool enter(J *j) {
    if (++j->pdepth > MAX_PARSE_DEPTH) {
        tok *t = cur(j);
        synerr(j, t->line, t->col, "template nested too deeply (more than %d levels)", MAX_PARSE_DEPTH);
        return false;
    }
    return true;
}
static void leave(J *j) { j->pdepth--; }

/* Growable arrays in the arena, so that an error mid-parse leaks nothing. */
typedef struct pvec { void **v; uint32_t n, cap; } pvec;

static bool pvec_push(J *j, pvec *v, void *x) {
    if (v->n == v->cap) {
        uint32_t nc = v->cap ? v->cap * 2 : 4;
        void **p = arena_alloc(j, nc * sizeof(void *));
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
static const char *const JINJA_FILTERS[] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e",
    "escape", "filesizeformat", "first", "float", "forceescape", "format", "groupby", "indent",
    "int", "join", "last", "length", "list", "lower", "items", "map", "min", "max", "pprint",
    "random", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select",
    "selectattr", "slice", "sort", "string", "striptags", "sum", "title", "trim", "truncate",
    "unique", "upper", "urlencode", "urlize", "wordcount", "wordwrap", "xmlattr", "tojson", NULL,
};
static const char *const JINJA_TESTS[] = {
    "odd", "even", "divisibleby", "defined", "undefined", "filter", "test", "none", "boolean",
    "false", "true", "integer", "float", "lower", "upper", "string", "mapping", "number",
    "sequence", "iterable", "callable", "sameas", "escaped", "in", "==", "eq", "equalto", "!=",
    "ne", ">", "gt", "greaterthan", "ge", ">=", "<", "lt", "lessthan", "<=", "le", NULL,
};

static bool in_list(const char *const *l, const char *s) {
    for (; *l; l++)
        if (strcmp(*l, s) == 0) return true;
    return false;
}

/* Dotted names (`foo.bar`) as filters and tests use them. */
static const char *parse_dotted(J *j) {
    tok *t = cur(j);
    if (t->type != TK_NAME) { unexpected(j, "a name"); return NULL; }
    const char *start = t->s;
    size_t len = t->n;
    adv(j);
    while (is_op(cur(j), P_DOT) && look(j)->type == TK_NAME) {
        adv(j);
        len = (size_t)(cur(j)->s + cur(j)->n - start);
        adv(j);
    }
    return arena_strndup(j, start, len);
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
            synerr(j, t->line, t->col, "*args and **kwargs in calls are not supported");
            return false;
        }
        if (t->type == TK_NAME && is_op(look(j), P_ASSIGN)) {
            const char *k = arena_strndup(j, t->s, t->n);
            adv(j);
            adv(j);
            node *v = parse_expression(j, true);
            if (!v || !k || !pvec_push(j, &kwn, (void *)k) || !pvec_push(j, &kwv, v)) return false;
        } else {
            if (kwn.n) { synerr(j, t->line, t->col, "positional argument follows keyword argument"); return false; }
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
            n->name = arena_strndup(j, t->s, t->n);
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
        jstr *s = arena_alloc(j, sizeof(jstr) + len + 1);
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
    unexpected(j, NULL);
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
                if (!x || !(x->name = arena_strndup(j, a->s, a->n))) return NULL;
            } else if (a->type == TK_INT) {
                x = nnew(j, E_ITEM, t);
                node *k = nnew(j, E_CONST, a);
                if (!x || !k) return NULL;
                k->cval = mk_int(a->i);
                x->b = k;
            } else {
                unexpected(j, "an attribute name");
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
            if (args.n != 1) { synerr(j, t->line, t->col, "subscripts must be a single index or slice"); return NULL; }
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
        if (!in_list(JINJA_FILTERS, name)) { synerr(j, t->line, t->col, "no filter named '%s'", name); return NULL; }
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
    if (!in_list(JINJA_TESTS, name)) { synerr(j, t->line, t->col, "no test named '%s'", name); return NULL; }
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
        if (is_name(c, "is")) { synerr(j, c->line, c->col, "cannot chain multiple tests with 'is'"); return NULL; }
        node *arg = parse_primary(j);
        if (!arg || !(arg = parse_postfix(j, arg))) return NULL;
        node **kids = arena_alloc(j, sizeof(node *));
        if (!kids) return NULL;
        kids[0] = arg;
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
    n->ops = arena_alloc(j, kids.n);
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
        if (!explicit_parens) { unexpected(j, "an expression"); return NULL; }
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
            synerr(j, t->line, t->col, "non-default argument follows default argument");
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
    if (t->type != TK_NAME) { unexpected(j, "a tag name"); return NULL; }
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
        if (!is_name(cur(j), "in")) { unexpected(j, "'in'"); return NULL; }
        adv(j);
        if (!(n->a = parse_tuple(j, false, false, "recursive"))) return NULL;
        if (is_name(cur(j), "if")) {
            adv(j);
            if (!(n->b = parse_expression(j, true))) return NULL;
        }
        if (is_name(cur(j), "recursive")) {
            synerr(j, cur(j)->line, cur(j)->col, "recursive for loops are not supported");
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
            const char **names = arena_alloc(j, sizeof(char *));
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
        if (n->nnames != 1) { unexpected(j, "'='"); return NULL; }
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
            if (n->a->kind != E_CALL) { synerr(j, ct->line, ct->col, "expected a call after 'call'"); return NULL; }
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
        if (!j->loop_depth) { synerr(j, t->line, t->col, "'%s' outside loop", tag); return NULL; }
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
    if (in_list(unsupported, tag)) {
        synerr(j, t->line, t->col, "the '%s' tag is not supported in chat templates", tag);
        return NULL;
    }
    synerr(j, t->line, t->col, "unknown tag '%s'", tag);
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
                synerr(j, opener->line, opener->col, "'%s' block is never closed (missing {%% %s %%})", block,
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
            if (cur(j)->type != TK_VAR_END) { unexpected(j, "end of print statement"); return NULL; }
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
                if (in_list(closers, tag)) {
                    if (ends)
                        synerr(j, nm->line, nm->col, "unexpected '%s' inside the '%s' block opened at line %d (expected '%s')",
                               tag, block, opener->line, strcmp(ends[0], "elif") == 0 ? "endif" : ends[0]);
                    else
                        synerr(j, nm->line, nm->col, "unexpected '%s' (no open block to close)", tag);
                    return NULL;
                }
            }
            if (!(n = parse_statement(j))) return NULL;
        } else {
            unexpected(j, NULL);
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
static node *compile(J *j, const char *src) {
    size_t n = strlen(src);
    j->src = malloc(n + 1);
    if (!j->src) { nomem(j); return NULL; }
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

/* ------------------------------------------------------------------ scopes */

static scope *scope_new(J *j, scope *parent) {
    scope *s = jmalloc(j, sizeof *s);
    if (!s) return NULL;
    memset(s, 0, sizeof *s);
    s->parent = parent;
    s->k = s->k0;
    s->v = s->v0;
    s->cap = 4;
    return s;
}

static void scope_release(scope *s) {
    if (s->k != s->k0) free(s->k);
    if (s->v != s->v0) free(s->v);
    free(s);
}

static void scope_clear(scope *s) {
    for (size_t i = 0; i < s->n; i++) unref(s->v[i]);
    s->n = 0;
}

static void scope_free(scope *s) {
    if (!s || s->captured) return;
    scope_clear(s);
    scope_release(s);
}

/* Keeps a frame and its ancestors alive until the end of the render (a macro closes over it). */
static void capture(J *j, scope *s) {
    for (; s && !s->captured; s = s->parent) {
        s->captured = true;
        s->next_captured = j->captured;
        j->captured = s;
    }
}

static jv *scope_lookup(scope *s, const char *k) {
    for (; s; s = s->parent)
        for (size_t i = s->n; i-- > 0;)
            if (strcmp(s->k[i], k) == 0) return &s->v[i];
    return NULL;
}

/* Assigns in this frame (Jinja's `set` never writes to an outer frame); takes ownership of v. */
static bool scope_set(J *j, scope *s, const char *k, jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->k[i], k) == 0) { unref(s->v[i]); s->v[i] = v; return true; }
    if (s->n == s->cap) {
        if (s->cap >= MAX_ITEMS) { unref(v); rterr(j, NULL, "too many variables"); return false; }
        size_t nc = s->cap * 2;
        const char **nk = s->k == s->k0 ? malloc(nc * sizeof *nk) : realloc((void *)s->k, nc * sizeof *nk);
        if (!nk) { unref(v); nomem(j); return false; }
        if (s->k == s->k0) memcpy(nk, s->k0, sizeof s->k0);
        s->k = nk;
        jv *nv = s->v == s->v0 ? malloc(nc * sizeof *nv) : realloc(s->v, nc * sizeof *nv);
        if (!nv) { unref(v); nomem(j); return false; } /* s->k grew; cap stays, still consistent */
        if (s->v == s->v0) memcpy(nv, s->v0, sizeof s->v0);
        s->v = nv;
        s->cap = nc;
    }
    s->k[s->n] = k;
    s->v[s->n++] = v;
    return true;
}

/* ------------------------------------------------------------------ methods, builtins */

enum {
    M_NONE,
    /* str */
    M_STRIP, M_LSTRIP, M_RSTRIP, M_SPLIT, M_RSPLIT, M_STARTSWITH, M_ENDSWITH, M_UPPER, M_LOWER,
    M_TITLE, M_CAPITALIZE, M_SWAPCASE, M_REPLACE, M_FIND, M_RFIND, M_INDEX, M_RINDEX, M_SCOUNT,
    M_JOIN, M_SPLITLINES, M_ISDIGIT, M_ISALPHA, M_ISALNUM, M_ISSPACE, M_ISLOWER, M_ISUPPER,
    M_CENTER, M_LJUST, M_RJUST, M_ZFILL, M_PARTITION, M_RPARTITION,
    /* dict */
    M_GET, M_ITEMS, M_KEYS, M_VALUES,
    /* list */
    M_LINDEX, M_LCOUNT,
    /* loop */
    M_CYCLE,
};

static const struct { uint8_t type; const char *name; int id; } METHODS[] = {
    {T_STR, "strip", M_STRIP}, {T_STR, "lstrip", M_LSTRIP}, {T_STR, "rstrip", M_RSTRIP},
    {T_STR, "split", M_SPLIT}, {T_STR, "rsplit", M_RSPLIT}, {T_STR, "startswith", M_STARTSWITH},
    {T_STR, "endswith", M_ENDSWITH}, {T_STR, "upper", M_UPPER}, {T_STR, "lower", M_LOWER},
    {T_STR, "title", M_TITLE}, {T_STR, "capitalize", M_CAPITALIZE}, {T_STR, "swapcase", M_SWAPCASE},
    {T_STR, "replace", M_REPLACE}, {T_STR, "find", M_FIND}, {T_STR, "rfind", M_RFIND},
    {T_STR, "index", M_INDEX}, {T_STR, "rindex", M_RINDEX}, {T_STR, "count", M_SCOUNT},
    {T_STR, "join", M_JOIN}, {T_STR, "splitlines", M_SPLITLINES}, {T_STR, "isdigit", M_ISDIGIT},
    {T_STR, "isalpha", M_ISALPHA}, {T_STR, "isalnum", M_ISALNUM}, {T_STR, "isspace", M_ISSPACE},
    {T_STR, "islower", M_ISLOWER}, {T_STR, "isupper", M_ISUPPER}, {T_STR, "center", M_CENTER},
    {T_STR, "ljust", M_LJUST}, {T_STR, "rjust", M_RJUST}, {T_STR, "zfill", M_ZFILL},
    {T_STR, "partition", M_PARTITION}, {T_STR, "rpartition", M_RPARTITION},
    {T_DICT, "get", M_GET}, {T_DICT, "items", M_ITEMS}, {T_DICT, "keys", M_KEYS},
    {T_DICT, "values", M_VALUES},
    {T_LIST, "index", M_LINDEX}, {T_LIST, "count", M_LCOUNT},
    {T_LOOP, "cycle", M_CYCLE},
};

static int method_id(jtype t, const char *name) {
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].type == t && strcmp(METHODS[i].name, name) == 0) return METHODS[i].id;
    return M_NONE;
}

static const char *method_name(int id) {
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].id == id) return METHODS[i].name;
    return "?";
}

/* The immutable sandbox refuses these; Jinja reports the refusal when the attribute is used. */
static bool unsafe_method(jtype t, const char *name) {
    static const char *const list_m[] = {"append", "extend", "insert", "pop", "remove", "reverse",
                                         "sort", "clear", NULL};
    static const char *const dict_m[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
    if (t != T_LIST && t != T_DICT) return false;
    return in_list(t == T_LIST ? list_m : dict_m, name);
}

enum { F_NONE, F_RANGE, F_RAISE, F_NAMESPACE, F_DICT };

static int builtin_func(const char *name) {
    if (strcmp(name, "range") == 0) return F_RANGE;
    if (strcmp(name, "raise_exception") == 0) return F_RAISE;
    if (strcmp(name, "namespace") == 0) return F_NAMESPACE;
    if (strcmp(name, "dict") == 0) return F_DICT;
    return F_NONE;
}

static bool lookup(J *j, scope *sc, const char *name, jv *out) {
    jv *p = scope_lookup(sc, name);
    if (p) { *out = ref(*p); return true; }
    int fn = builtin_func(name);
    if (fn) { *out = mk_func(fn); return true; }
    *out = mk_undef_msg(j, "'%s' is undefined", name);
    return !j->failed;
}

/* ------------------------------------------------------------------ attribute and item access */

static bool loop_attr(J *j, jloop *lp, const char *name, jv self, jv *out) {
    int64_t i = lp->i, n = lp->n;
    if (strcmp(name, "index") == 0) *out = mk_int(i + 1);
    else if (strcmp(name, "index0") == 0) *out = mk_int(i);
    else if (strcmp(name, "revindex") == 0) *out = mk_int(n - i);
    else if (strcmp(name, "revindex0") == 0) *out = mk_int(n - i - 1);
    else if (strcmp(name, "first") == 0) *out = mk_bool(i == 0);
    else if (strcmp(name, "last") == 0) *out = mk_bool(i == n - 1);
    else if (strcmp(name, "length") == 0) *out = mk_int(n);
    else if (strcmp(name, "depth") == 0) *out = mk_int(1);
    else if (strcmp(name, "depth0") == 0) *out = mk_int(0);
    else if (strcmp(name, "previtem") == 0)
        *out = i > 0 ? ref(lp->items->v[i - 1]) : mk_undef_msg(j, "there is no previous item");
    else if (strcmp(name, "nextitem") == 0)
        *out = i + 1 < n ? ref(lp->items->v[i + 1]) : mk_undef_msg(j, "there is no next item");
    else if (strcmp(name, "cycle") == 0) return mk_method(j, M_CYCLE, self, out);
    else *out = undef_attr(j, self, name);
    return !j->failed;
}

/* obj.name: Python attributes (methods) first, then items, as Jinja's getattr does. */
static bool get_attr(J *j, jv obj, const char *name, jv *out) {
    *out = mk_undef();
    int mid;
    switch (obj.t) {
    case T_UNDEF: undef_err(j, NULL, obj); return false;
    case T_DICT:
        if ((mid = method_id(T_DICT, name))) return mk_method(j, mid, obj, out);
        if (unsafe_method(T_DICT, name)) break;
        {
            jv *p = dict_get_str(obj.u.d, name);
            *out = p ? ref(*p) : undef_attr(j, obj, name);
        }
        return !j->failed;
    case T_NS: {
        jv *p = dict_get_str(obj.u.d, name);
        *out = p ? ref(*p) : undef_attr(j, obj, name);
        return !j->failed;
    }
    case T_STR: case T_LIST:
        if ((mid = method_id(obj.t, name))) return mk_method(j, mid, obj, out);
        if (unsafe_method(obj.t, name)) break;
        *out = undef_attr(j, obj, name);
        return !j->failed;
    case T_LOOP: return loop_attr(j, obj.u.lp, name, obj, out);
    default:
        *out = undef_attr(j, obj, name);
        return !j->failed;
    }
    *out = mk_undef_msg(j, "access to attribute '%s' of '%s' object is unsafe.", name, type_name(obj));
    return !j->failed;
}

/* Code point i of a string as a new string, or false when out of range. */
static bool str_char_at(J *j, const jstr *s, int64_t idx, jv *out, bool *found) {
    *found = false;
    if (!charge(j, s->len / 64)) return false;
    size_t len = u8len(s->s, s->len);
    if (idx < 0) idx += (int64_t)len;
    if (idx < 0 || (size_t)idx >= len) return true;
    size_t off = 0, l = 0;
    for (int64_t k = 0;; k++) {
        if ((unsigned char)s->s[off] < 0x80) l = 1;
        else u8dec(s->s + off, s->len - off, &l);
        if (k == idx) break;
        off += l;
    }
    *found = true;
    return mk_strn(j, s->s + off, l, out);
}

/* obj[key]: items first, then attributes for string keys, as Jinja's getitem does. */
static bool get_item(J *j, jv obj, jv key, jv *out) {
    *out = mk_undef();
    if (obj.t == T_UNDEF) { undef_err(j, NULL, obj); return false; }
    if (obj.t == T_DICT) {
        size_t i = dict_find(obj.u.d, key);
        if (i != SIZE_MAX) { *out = ref(obj.u.d->e[i].v); return true; }
    } else if ((obj.t == T_LIST || obj.t == T_STR) && is_intlike(key)) {
        int64_t idx = as_int(key);
        if (obj.t == T_LIST) {
            int64_t n = (int64_t)obj.u.l->n;
            if (idx < 0) idx += n;
            if (idx >= 0 && idx < n) { *out = ref(obj.u.l->v[idx]); return true; }
        } else {
            bool found;
            if (!str_char_at(j, obj.u.s, idx, out, &found)) return false;
            if (found) return true;
        }
    }
    if (key.t == T_STR && obj.t != T_LIST && obj.t != T_STR) return get_attr(j, obj, key.u.s->s, out);
    if (key.t == T_STR && method_id(obj.t, key.u.s->s)) return get_attr(j, obj, key.u.s->s, out);
    char t[64];
    obj_type_repr(obj, t, sizeof t);
    jbuf b = {0};
    if (!put_value(j, &b, key, true, 0)) { bfree(&b); return false; }
    if (key.t == T_STR) *out = mk_undef_msg(j, "'%s' has no attribute %s", t, b.p);
    else *out = mk_undef_msg(j, "%s has no element %s", t, b.p);
    bfree(&b);
    return !j->failed;
}

/* Python slice semantics (negative indices, negative steps, clamping). */
static bool do_slice(J *j, jv obj, jv start, jv stop, jv step, jv *out) {
    *out = mk_undef();
    if (obj.t == T_UNDEF) { undef_err(j, NULL, obj); return false; }
    jv parts[3] = {start, stop, step};
    for (int k = 0; k < 3; k++)
        if (parts[k].t != T_NONE && parts[k].t != T_UNDEF && !is_intlike(parts[k])) {
            rterr(j, NULL, "slice indices must be integers or None");
            return false;
        }
    bool is_str = obj.t == T_STR;
    if (!is_str && obj.t != T_LIST) {
        char t[64];
        obj_type_repr(obj, t, sizeof t);
        *out = mk_undef_msg(j, "%s has no element slice", t);
        return !j->failed;
    }
    size_t *offs = NULL;
    int64_t len;
    if (!charge(j, is_str ? obj.u.s->len / 64 : obj.u.l->n)) return false;
    if (is_str) {
        size_t ncp = u8len(obj.u.s->s, obj.u.s->len);
        offs = jmalloc(j, (ncp + 1) * sizeof(size_t));
        if (!offs) return false;
        size_t off = 0, k = 0, l;
        while (off < obj.u.s->len) { offs[k++] = off; u8dec(obj.u.s->s + off, obj.u.s->len - off, &l); off += l; }
        offs[k] = off;
        len = (int64_t)ncp;
    } else {
        len = (int64_t)obj.u.l->n;
    }
    int64_t st = is_intlike(step) ? as_int(step) : 1;
    if (st == 0) { free(offs); rterr(j, NULL, "slice step cannot be zero"); return false; }
    int64_t lower = st > 0 ? 0 : -1, upper = st > 0 ? len : len - 1, a, b;
    if (!is_intlike(start)) a = st < 0 ? upper : lower;
    else {
        a = as_int(start);
        if (a < 0) { a += len; if (a < lower) a = lower; }
        else if (a > upper) a = upper;
    }
    if (!is_intlike(stop)) b = st < 0 ? lower : upper;
    else {
        b = as_int(stop);
        if (b < 0) { b += len; if (b < lower) b = lower; }
        else if (b > upper) b = upper;
    }
    bool ok = true;
    if (is_str) {
        jbuf buf = {0};
        if (st == 1) ok = a < b ? bput(j, &buf, obj.u.s->s + offs[a], offs[b] - offs[a]) : true;
        else
            for (int64_t i = a; ok && (st > 0 ? i < b : i > b); i += st)
                ok = bput(j, &buf, obj.u.s->s + offs[i], offs[i + 1] - offs[i]);
        free(offs);
        if (!ok) { bfree(&buf); return false; }
        return buf_to_str(j, &buf, out);
    }
    jlist *l = list_new(j, 0);
    if (!l) return false;
    l->tuple = obj.u.l->tuple;
    for (int64_t i = a; ok && (st > 0 ? i < b : i > b); i += st) ok = list_push(j, l, ref(obj.u.l->v[i]));
    *out = list_val(l);
    if (!ok) { unref(*out); *out = mk_undef(); }
    return ok;
}

/* ------------------------------------------------------------------ iteration */

/* The items a for-loop or a filter iterates over, as a list (a new reference). */
static bool iter_list(J *j, jv v, jlist **out) {
    *out = NULL;
    switch (v.t) {
    case T_LIST: *out = ref(v).u.l; return true;
    case T_UNDEF: *out = list_new(j, 0); return *out != NULL;
    case T_DICT: {
        jlist *l = list_new(j, v.u.d->n);
        if (!l) return false;
        for (size_t i = 0; i < v.u.d->n; i++)
            if (!list_push(j, l, ref(v.u.d->e[i].k))) { unref(list_val(l)); return false; }
        *out = l;
        return true;
    }
    case T_STR: {
        jlist *l = list_new(j, 0);
        if (!l) return false;
        for (size_t i = 0, k; i < v.u.s->len; i += k) {
            u8dec(v.u.s->s + i, v.u.s->len - i, &k);
            jv c;
            if (!mk_strn(j, v.u.s->s + i, k, &c) || !list_push(j, l, c)) { unref(list_val(l)); return false; }
        }
        *out = l;
        return true;
    }
    case T_LOOP: *out = ref(list_val(v.u.lp->items)).u.l; return true;
    default:
        rterr(j, NULL, "'%s' object is not iterable", type_name(v));
        return false;
    }
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn);

static bool contains(J *j, jv container, jv item, bool *res) {
    *res = false;
    switch (container.t) {
    case T_STR:
        if (item.t != T_STR) {
            if (item.t == T_UNDEF) { undef_err(j, NULL, item); return false; }
            rterr(j, NULL, "'in <string>' requires string as left operand, not %s", type_name(item));
            return false;
        }
        if (!charge(j, container.u.s->len / 64)) return false;
        *res = find_bytes(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
        return true;
    case T_LIST:
        if (!charge(j, container.u.l->n)) return false;
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jv_eq(container.u.l->v[i], item, 0)) { *res = true; break; }
        return true;
    case T_DICT: *res = dict_find(container.u.d, item) != SIZE_MAX; return true;
    case T_UNDEF: return true;
    default:
        rterr(j, NULL, "argument of type '%s' is not iterable", type_name(container));
        return false;
    }
}

/* ------------------------------------------------------------------ arithmetic */

static bool int_result(J *j, bool overflow, int64_t r, jv *out) {
    if (overflow) { rterr(j, NULL, "integer overflow (quill's integers are 64-bit)"); return false; }
    *out = mk_int(r);
    return true;
}

static bool repeat(J *j, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    if (seq.t == T_STR) {
        if (times && seq.u.s->len > MAX_STR_BYTES / (uint64_t)times) {
            rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES);
            return false;
        }
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++)
            if (!bput(j, &b, seq.u.s->s, seq.u.s->len)) { bfree(&b); return false; }
        return buf_to_str(j, &b, out);
    }
    if (times && seq.u.l->n > MAX_ITEMS / (uint64_t)times) {
        rterr(j, NULL, "list longer than %zu items", MAX_ITEMS);
        return false;
    }
    jlist *l = list_new(j, 0);
    if (!l) return false;
    l->tuple = seq.u.l->tuple;
    *out = list_val(l);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++)
            if (!list_push(j, l, ref(seq.u.l->v[k]))) { unref(*out); *out = mk_undef(); return false; }
    return true;
}

static bool py_format(J *j, const char *fmt, size_t n, jv args, bool args_is_tuple, jv *out);

static const char *op_sym(int op) {
    switch (op) {
    case OP_ADD: return "+"; case OP_SUB: return "-"; case OP_MUL: return "*"; case OP_DIV: return "/";
    case OP_FLOORDIV: return "//"; case OP_MOD: return "%"; case OP_POW: return "**";
    case OP_LT: return "<"; case OP_LE: return "<="; case OP_GT: return ">"; case OP_GE: return ">=";
    default: return "?";
    }
}

static bool binop(J *j, int op, jv a, jv b, jv *out) {
    *out = mk_undef();
    if (a.t == T_UNDEF) { undef_err(j, NULL, a); return false; }
    if (b.t == T_UNDEF) { undef_err(j, NULL, b); return false; }
    if (is_intlike(a) && is_intlike(b)) {
        int64_t x = as_int(a), y = as_int(b), r = 0;
        switch (op) {
        case OP_ADD: { bool o = __builtin_add_overflow(x, y, &r); return int_result(j, o, r, out); }
        case OP_SUB: { bool o = __builtin_sub_overflow(x, y, &r); return int_result(j, o, r, out); }
        case OP_MUL: { bool o = __builtin_mul_overflow(x, y, &r); return int_result(j, o, r, out); }
        case OP_DIV:
            if (y == 0) { rterr(j, NULL, "division by zero"); return false; }
            *out = mk_float((double)x / (double)y);
            return true;
        case OP_FLOORDIV: case OP_MOD: {
            if (y == 0) { rterr(j, NULL, "integer division or modulo by zero"); return false; }
            if (x == INT64_MIN && y == -1) return int_result(j, op == OP_FLOORDIV, 0, out);
            int64_t q = x / y, m = x % y;
            if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
            *out = mk_int(op == OP_FLOORDIV ? q : m);
            return true;
        }
        case OP_POW: {
            if (y < 0) { *out = mk_float(pow((double)x, (double)y)); return true; }
            int64_t acc = 1, base = x;
            bool ovf = false;
            for (int64_t e = y; e > 0 && !ovf; e >>= 1) {
                if (e & 1) ovf |= __builtin_mul_overflow(acc, base, &acc);
                if (e > 1) ovf |= __builtin_mul_overflow(base, base, &base);
            }
            return int_result(j, ovf, acc, out);
        }
        default: break;
        }
    } else if (is_num(a) && is_num(b)) {
        double x = as_dbl(a), y = as_dbl(b);
        switch (op) {
        case OP_ADD: *out = mk_float(x + y); return true;
        case OP_SUB: *out = mk_float(x - y); return true;
        case OP_MUL: *out = mk_float(x * y); return true;
        case OP_DIV:
            if (y == 0) { rterr(j, NULL, "float division by zero"); return false; }
            *out = mk_float(x / y);
            return true;
        case OP_FLOORDIV: case OP_MOD: {
            if (y == 0) { rterr(j, NULL, "float modulo"); return false; }
            /* Python's float divmod */
            double m = fmod(x, y), d = (x - m) / y;
            if (m != 0) {
                if ((y < 0) != (m < 0)) { m += y; d -= 1.0; }
            } else {
                m = copysign(0.0, y);
            }
            double fd;
            if (d != 0) { fd = floor(d); if (d - fd > 0.5) fd += 1.0; }
            else fd = copysign(0.0, x / y);
            *out = mk_float(op == OP_MOD ? m : fd);
            return true;
        }
        case OP_POW: *out = mk_float(pow(x, y)); return true;
        default: break;
        }
    } else if (op == OP_ADD && a.t == T_STR && b.t == T_STR) {
        jbuf s = {0};
        if (!bput(j, &s, a.u.s->s, a.u.s->len) || !bput(j, &s, b.u.s->s, b.u.s->len)) { bfree(&s); return false; }
        return buf_to_str(j, &s, out);
    } else if (op == OP_ADD && a.t == T_LIST && b.t == T_LIST && a.u.l->tuple == b.u.l->tuple) {
        jlist *l = list_new(j, a.u.l->n + b.u.l->n);
        if (!l) return false;
        l->tuple = a.u.l->tuple;
        *out = list_val(l);
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!list_push(j, l, ref(a.u.l->v[i]))) { unref(*out); *out = mk_undef(); return false; }
        for (size_t i = 0; i < b.u.l->n; i++)
            if (!list_push(j, l, ref(b.u.l->v[i]))) { unref(*out); *out = mk_undef(); return false; }
        return true;
    } else if (op == OP_MUL && (a.t == T_STR || a.t == T_LIST) && is_intlike(b)) {
        return repeat(j, a, as_int(b), out);
    } else if (op == OP_MUL && (b.t == T_STR || b.t == T_LIST) && is_intlike(a)) {
        return repeat(j, b, as_int(a), out);
    } else if (op == OP_MOD && a.t == T_STR) {
        return py_format(j, a.u.s->s, a.u.s->len, b, b.t == T_LIST && b.u.l->tuple, out);
    }
    if (op == OP_ADD && a.t == T_STR)
        rterr(j, NULL, "can only concatenate str (not \"%s\") to str", type_name(b));
    else
        rterr(j, NULL, "unsupported operand type(s) for %s: '%s' and '%s'", op_sym(op), type_name(a), type_name(b));
    return false;
}

/* ------------------------------------------------------------------ evaluation */

typedef struct jargs {
    jv *pos;
    size_t npos;
    const char **kwn;
    jv *kwv;
    size_t nkw;
} jargs;

static void free_args(jargs *a) {
    for (size_t i = 0; i < a->npos; i++) unref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) unref(a->kwv[i]);
    free(a->pos);
    free(a->kwv);
    memset(a, 0, sizeof *a);
}

/* Positional argument `idx` or keyword `name`; NULL when neither was passed. */
static const jv *arg(const jargs *a, size_t idx, const char *name) {
    if (idx < a->npos) return &a->pos[idx];
    for (size_t i = 0; name && i < a->nkw; i++)
        if (strcmp(a->kwn[i], name) == 0) return &a->kwv[i];
    return NULL;
}

/* Rejects arguments a callable does not take: more than `max_pos` positional ones, or keywords
 * outside `kw` (a NULL-terminated list of parameter names). */
static bool check_args(J *j, const jargs *a, size_t max_pos, const char *const *kw, const char *what) {
    if (a->npos > max_pos) {
        rterr(j, NULL, "%s takes at most %zu positional argument%s (%zu given)", what, max_pos, max_pos == 1 ? "" : "s", a->npos);
        return false;
    }
    for (size_t i = 0; i < a->nkw; i++) {
        size_t k = 0;
        bool ok = false;
        for (; kw && kw[k]; k++)
            if (strcmp(kw[k], a->kwn[i]) == 0) { ok = true; break; }
        if (!ok) { rterr(j, NULL, "%s got an unexpected keyword argument '%s'", what, a->kwn[i]); return false; }
        if (k < a->npos) { rterr(j, NULL, "%s got multiple values for argument '%s'", what, a->kwn[i]); return false; }
    }
    return true;
}

static bool eval(J *j, const node *e, scope *sc, jv *out);

static bool eval_args(J *j, const node *e, scope *sc, jargs *a) {
    memset(a, 0, sizeof *a);
    if (e->nkids) {
        a->pos = jmalloc(j, e->nkids * sizeof(jv));
        if (!a->pos) return false;
    }
    for (uint32_t i = 0; i < e->nkids; i++) {
        if (!eval(j, e->kids[i], sc, &a->pos[i])) { free_args(a); return false; }
        a->npos++;
    }
    if (e->nnames) {
        a->kwv = jmalloc(j, e->nnames * sizeof(jv));
        if (!a->kwv) { free_args(a); return false; }
        a->kwn = e->names;
    }
    for (uint32_t i = 0; i < e->nnames; i++) {
        if (!eval(j, e->kids2[i], sc, &a->kwv[i])) { free_args(a); return false; }
        a->nkw++;
    }
    return true;
}

typedef enum { X_OK, X_ERR, X_BREAK, X_CONTINUE } xres;
static xres exec(J *j, const node *s, scope *sc, jbuf *out);

static bool call_macro(J *j, const jmacro *m, const jargs *a, jv caller, jv *out) {
    *out = mk_undef();
    const node *def = m->def;
    const char *mname = def->name ? def->name : "caller";
    bool take_varargs = def->flag, take_kwargs = def->op;
    if (a->npos > def->nnames && !take_varargs) {
        rterr(j, NULL, "macro '%s' takes not more than %u argument(s)", mname, def->nnames);
        return false;
    }
    scope *s = scope_new(j, m->closure);
    if (!s) return false;
    bool ok = true;
    jlist *va = NULL;
    jdict *kw = NULL;
    if (take_varargs && (va = list_new(j, 0)) != NULL) va->tuple = true;
    if (take_kwargs) kw = dict_new(j);
    ok = (!take_varargs || va) && (!take_kwargs || kw);
    for (size_t i = 0; ok && i < a->nkw; i++) {
        bool is_param = false;
        for (uint32_t p = 0; p < def->nnames; p++)
            if (strcmp(def->names[p], a->kwn[i]) == 0) {
                is_param = true;
                if (p < a->npos) {
                    rterr(j, NULL, "macro '%s' got multiple values for argument '%s'", mname, a->kwn[i]);
                    ok = false;
                }
            }
        if (!is_param && ok) {
            if (!take_kwargs) { rterr(j, NULL, "macro '%s' takes no keyword argument '%s'", mname, a->kwn[i]); ok = false; }
            else ok = dict_set_cstr(j, kw, a->kwn[i], ref(a->kwv[i]));
        }
    }
    for (uint32_t p = 0; ok && p < def->nnames; p++) {
        jv v;
        const jv *given = arg(a, p, def->names[p]);
        if (given) v = ref(*given);
        else if (def->kids2[p]) ok = eval(j, def->kids2[p], s, &v);
        else v = mk_undef_msg(j, "parameter '%s' was not provided", def->names[p]);
        if (ok) ok = scope_set(j, s, def->names[p], v);
    }
    for (size_t i = def->nnames; ok && i < a->npos; i++) ok = list_push(j, va, ref(a->pos[i]));
    if (va) { if (ok) ok = scope_set(j, s, "varargs", list_val(va)); else unref(list_val(va)); }
    if (kw) { if (ok) ok = scope_set(j, s, "kwargs", dict_val(kw)); else unref(dict_val(kw)); }
    if (ok && caller.t == T_MACRO) ok = scope_set(j, s, "caller", ref(caller));
    jbuf b = {0};
    if (ok) ok = exec(j, def->b, s, &b) == X_OK;
    scope_free(s);
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

static bool call_builtin(J *j, int fn, const jargs *a, jv *out) {
    *out = mk_undef();
    switch (fn) {
    case F_RANGE: {
        if (a->nkw || a->npos < 1 || a->npos > 3) { rterr(j, NULL, "range() takes 1 to 3 positional arguments"); return false; }
        for (size_t i = 0; i < a->npos; i++)
            if (!is_intlike(a->pos[i])) {
                rterr(j, NULL, "'%s' object cannot be interpreted as an integer", type_name(a->pos[i]));
                return false;
            }
        int64_t start = 0, stop, step = 1;
        if (a->npos == 1) stop = as_int(a->pos[0]);
        else { start = as_int(a->pos[0]); stop = as_int(a->pos[1]); }
        if (a->npos == 3) step = as_int(a->pos[2]);
        if (step == 0) { rterr(j, NULL, "range() arg 3 must not be zero"); return false; }
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                              : ceil(((double)start - (double)stop) / -(double)step);
        if (cnt < 0) cnt = 0;
        if (cnt > MAX_RANGE) {
            rterr(j, NULL, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
            return false;
        }
        jlist *l = list_new(j, (size_t)cnt);
        if (!l || !charge(j, (uint64_t)cnt)) { if (l) unref(list_val(l)); return false; }
        for (int64_t i = 0; i < (int64_t)cnt; i++) l->v[l->n++] = mk_int(start + i * step);
        *out = list_val(l);
        return true;
    }
    case F_RAISE: {
        jv m = mk_undef();
        const jv *p = arg(a, 0, "message");
        if (p && !to_str(j, *p, &m)) return false;
        const node *at = j->at;
        if (!j->failed) {
            j->failed = true;
            j->status = QUILL_E_TEMPLATE;
            snprintf(j->msg, sizeof j->msg, "chat template raised an exception at line %d, column %d: %s",
                     at ? at->line : 0, at ? at->col : 0, m.t == T_STR ? m.u.s->s : "");
        }
        unref(m);
        return false;
    }
    case F_NAMESPACE: case F_DICT: {
        if (a->npos > 1) {
            rterr(j, NULL, "%s() takes at most 1 positional argument", fn == F_DICT ? "dict" : "namespace");
            return false;
        }
        if (fn == F_NAMESPACE) { if (!ns_new(j, out)) return false; }
        else {
            jdict *d = dict_new(j);
            if (!d) return false;
            *out = dict_val(d);
        }
        jdict *d = out->u.d;
        if (a->npos == 1) {
            jv src = a->pos[0];
            if (src.t != T_DICT && src.t != T_NS) {
                rterr(j, NULL, "cannot build a mapping from '%s'", type_name(src));
                return false;
            }
            for (size_t i = 0; i < src.u.d->n; i++)
                if (!dict_set(j, d, ref(src.u.d->e[i].k), ref(src.u.d->e[i].v))) return false;
        }
        for (size_t i = 0; i < a->nkw; i++)
            if (!dict_set_cstr(j, d, a->kwn[i], ref(a->kwv[i]))) return false;
        return true;
    }
    default: rterr(j, NULL, "unknown function"); return false;
    }
}

static bool call_method(J *j, const jmethod *m, const jargs *a, jv *out);

static bool call_value(J *j, jv f, const jargs *a, jv caller, jv *out) {
    *out = mk_undef();
    switch (f.t) {
    case T_FUNC: return call_builtin(j, f.u.fn, a, out);
    case T_MACRO: return call_macro(j, f.u.m, a, caller, out);
    case T_METHOD: return call_method(j, f.u.me, a, out);
    case T_UNDEF: undef_err(j, NULL, f); return false;
    default: rterr(j, NULL, "'%s' object is not callable", type_name(f)); return false;
    }
}

static bool apply_filter(J *j, const char *name, jv v, const jargs *a, jv *out);
static bool run_test(J *j, const char *name, jv v, const jargs *a, bool *res);

static bool eval_call(J *j, const node *e, scope *sc, jv caller, jv *out) {
    jv f;
    if (!eval(j, e->a, sc, &f)) return false;
    jargs a;
    if (!eval_args(j, e, sc, &a)) { unref(f); return false; }
    j->at = e;
    bool ok = call_value(j, f, &a, caller, out);
    free_args(&a);
    unref(f);
    return ok;
}

static bool eval_inner(J *j, const node *e, scope *sc, jv *out) {
    jv a = mk_undef(), b = mk_undef();
    bool ok = true;
    switch (e->kind) {
    case E_CONST: *out = ref(e->cval); return true;
    case E_NAME: return lookup(j, sc, e->name, out);
    case E_PLACEHOLDER: *out = ref(j->placeholder); return true;
    case E_LIST: case E_TUPLE: {
        jlist *l = list_new(j, e->nkids);
        if (!l) return false;
        l->tuple = e->kind == E_TUPLE;
        *out = list_val(l);
        for (uint32_t i = 0; ok && i < e->nkids; i++) {
            ok = eval(j, e->kids[i], sc, &a);
            if (ok) ok = list_push(j, l, a);
        }
        break;
    }
    case E_DICT: {
        jdict *d = dict_new(j);
        if (!d) return false;
        *out = dict_val(d);
        for (uint32_t i = 0; ok && i < e->nkids; i++) {
            ok = eval(j, e->kids[i], sc, &a);
            if (ok && !(ok = eval(j, e->kids2[i], sc, &b))) unref(a);
            if (ok) ok = dict_set(j, d, a, b);
        }
        break;
    }
    case E_ATTR:
        if (!eval(j, e->a, sc, &a)) return false;
        ok = get_attr(j, a, e->name, out);
        unref(a);
        return ok;
    case E_ITEM:
        if (!eval(j, e->a, sc, &a)) return false;
        if (e->b->kind == E_SLICE) {
            jv p[3] = {mk_none(), mk_none(), mk_none()};
            const node *pn[3] = {e->b->a, e->b->b, e->b->c};
            for (int k = 0; ok && k < 3; k++)
                if (pn[k]) ok = eval(j, pn[k], sc, &p[k]);
            j->at = e;
            if (ok) ok = do_slice(j, a, p[0], p[1], p[2], out);
            for (int k = 0; k < 3; k++) unref(p[k]);
        } else {
            ok = eval(j, e->b, sc, &b);
            j->at = e;
            if (ok) ok = get_item(j, a, b, out);
        }
        unref(a);
        unref(b);
        return ok;
    case E_CALL: return eval_call(j, e, sc, mk_undef(), out);
    case E_FILTER: case E_TEST: {
        if (e->a && !eval(j, e->a, sc, &a)) return false;
        jargs args;
        if (!eval_args(j, e, sc, &args)) { unref(a); return false; }
        j->at = e;
        if (e->kind == E_FILTER) ok = apply_filter(j, e->name, a, &args, out);
        else {
            bool r;
            ok = run_test(j, e->name, a, &args, &r);
            if (ok) *out = mk_bool(r != e->flag);
        }
        free_args(&args);
        unref(a);
        return ok;
    }
    case E_UNARY:
        if (!eval(j, e->a, sc, &a)) return false;
        if (e->op == OP_NOT) *out = mk_bool(!truthy(a));
        else if (a.t == T_INT && e->op == OP_NEG) ok = int_result(j, a.u.i == INT64_MIN, -a.u.i, out);
        else if (is_intlike(a)) *out = mk_int(e->op == OP_NEG ? -as_int(a) : as_int(a));
        else if (a.t == T_FLOAT) *out = mk_float(e->op == OP_NEG ? -a.u.f : a.u.f);
        else if (a.t == T_UNDEF) { undef_err(j, e, a); ok = false; }
        else { rterr(j, e, "bad operand type for unary %s: '%s'", e->op == OP_NEG ? "-" : "+", type_name(a)); ok = false; }
        unref(a);
        return ok;
    case E_BIN:
        if (!eval(j, e->a, sc, &a)) return false;
        if (e->op == OP_AND || e->op == OP_OR) {
            /* Python's and/or yield an operand, not a boolean */
            if (truthy(a) == (e->op == OP_OR)) { *out = a; return true; }
            unref(a);
            return eval(j, e->b, sc, out);
        }
        if (!eval(j, e->b, sc, &b)) { unref(a); return false; }
        j->at = e;
        if (e->op == OP_CONCAT) {
            jbuf s = {0};
            ok = put_value(j, &s, a, false, 0) && put_value(j, &s, b, false, 0);
            if (ok) ok = buf_to_str(j, &s, out);
            else bfree(&s);
        } else {
            ok = binop(j, e->op, a, b, out);
        }
        unref(a);
        unref(b);
        return ok;
    case E_CMP: {
        if (!eval(j, e->a, sc, &a)) return false;
        bool res = true;
        for (uint32_t i = 0; ok && res && i < e->nkids; i++) {
            if (!(ok = eval(j, e->kids[i], sc, &b))) break;
            j->at = e;
            int op = e->ops[i], c;
            if ((op == OP_EQ || op == OP_NE) && a.t == T_STR && b.t == T_STR && !(ok = charge(j, a.u.s->len / 64))) break;
            switch (op) {
            case OP_EQ: res = jv_eq(a, b, 0); break;
            case OP_NE: res = !jv_eq(a, b, 0); break;
            case OP_IN: case OP_NOTIN:
                ok = contains(j, b, a, &res);
                if (op == OP_NOTIN) res = !res;
                break;
            default:
                ok = jv_cmp(j, a, b, op_sym(op), &c, 0);
                res = c != 2 && (op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
                break;
            }
            unref(a);
            a = b;
            b = mk_undef();
        }
        unref(a);
        unref(b);
        if (ok) *out = mk_bool(res);
        return ok;
    }
    case E_COND:
        if (!eval(j, e->b, sc, &a)) return false;
        ok = truthy(a);
        unref(a);
        if (ok) return eval(j, e->a, sc, out);
        if (e->c) return eval(j, e->c, sc, out);
        *out = mk_undef_msg(j, "the inline if-expression on line %d evaluated to false and no else section was defined.",
                            e->line);
        return !j->failed;
    default:
        rterr(j, e, "internal error: not an expression");
        return false;
    }
    if (!ok) { unref(*out); *out = mk_undef(); }
    return ok;
}

static bool eval(J *j, const node *e, scope *sc, jv *out) {
    *out = mk_undef();
    if (j->failed) return false;
    if (++j->steps > MAX_STEPS) {
        rterr(j, e, "template did not finish within %llu steps", (unsigned long long)MAX_STEPS);
        return false;
    }
    if (j->depth >= MAX_EVAL_DEPTH) {
        rterr(j, e, "template recursion deeper than %d levels", MAX_EVAL_DEPTH);
        return false;
    }
    j->depth++;
    const node *saved = j->at;
    j->at = e;
    bool ok = eval_inner(j, e, sc, out) && !j->failed;
    j->at = saved;
    j->depth--;
    if (!ok) { unref(*out); *out = mk_undef(); }
    return ok;
}

/* ------------------------------------------------------------------ string helpers */

/* Start of the code point that ends at `end` (not before `lo`). */
static uint32_t u8prev(const char *s, size_t lo, size_t end, size_t *st) {
    size_t p = end - 1;
    while (p > lo && u8cont((unsigned char)s[p]) && end - p < 4) p--;
    size_t l;
    uint32_t c = u8dec(s + p, end - p, &l);
    if (p + l != end) { p = end - 1; c = CP_BAD + (unsigned char)s[p]; }
    *st = p;
    return c;
}

static bool cp_in(uint32_t c, const jstr *set) {
    for (size_t i = 0, l; i < set->len; i += l)
        if (u8dec(set->s + i, set->len - i, &l) == c) return true;
    return false;
}

/* str.strip/lstrip/rstrip; chars NULL or None strips whitespace. */
static bool do_strip(J *j, const char *s, size_t n, const jv *chars, bool left, bool right, jv *out) {
    const jstr *set = NULL;
    if (chars && chars->t == T_STR) set = chars->u.s;
    else if (chars && chars->t != T_NONE && chars->t != T_UNDEF) {
        rterr(j, NULL, "strip arg must be None or str");
        return false;
    }
    size_t a = 0, b = n, l, st;
    while (left && a < b) {
        uint32_t c = u8dec(s + a, b - a, &l);
        if (set ? !cp_in(c, set) : !py_space(c)) break;
        a += l;
    }
    while (right && b > a) {
        uint32_t c = u8prev(s, a, b, &st);
        if (set ? !cp_in(c, set) : !py_space(c)) break;
        b = st;
    }
    return mk_strn(j, s + a, b - a, out);
}

enum { CASE_UPPER, CASE_LOWER, CASE_SWAP, CASE_TITLE, CASE_CAPITALIZE };

static bool map_case(J *j, const char *s, size_t n, int mode, jv *out) {
    jbuf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0, l; i < n; i += l) {
        uint32_t c = u8dec(s + i, n - i, &l), m = c;
        switch (mode) {
        case CASE_UPPER: m = cp_upper(c); break;
        case CASE_LOWER: m = cp_lower(c); break;
        case CASE_SWAP: m = cp_is_upper(c) ? cp_lower(c) : cp_upper(c); break;
        case CASE_TITLE:
            m = prev_cased ? cp_lower(c) : cp_upper(c);
            prev_cased = cp_cased(c);
            break;
        default: m = first ? cp_upper(c) : cp_lower(c); break;
        }
        first = false;
        char e[4];
        if (!bput(j, &b, e, u8enc(m, e))) { bfree(&b); return false; }
    }
    return buf_to_str(j, &b, out);
}

/* Knuth-Morris-Pratt, linear whatever the input: a naive scan with a long needle can go
 * quadratic, and both template and message text are untrusted. `rev` finds the last match.
 * Returns false when the table cannot be allocated (the caller falls back to the naive scan). */
static bool kmp(const char *h, size_t hn, const char *nd, size_t nn, bool rev, const char **hit) {
    size_t *fail = malloc(nn * sizeof *fail);
    if (!fail) return false;
#define NDL(i) (rev ? nd[nn - 1 - (i)] : nd[i])
#define HAY(i) (rev ? h[hn - 1 - (i)] : h[i])
    fail[0] = 0;
    for (size_t i = 1, k = 0; i < nn; i++) {
        while (k && NDL(i) != NDL(k)) k = fail[k - 1];
        if (NDL(i) == NDL(k)) k++;
        fail[i] = k;
    }
    *hit = NULL;
    for (size_t i = 0, k = 0; i < hn; i++) {
        while (k && HAY(i) != NDL(k)) k = fail[k - 1];
        if (HAY(i) == NDL(k)) k++;
        if (k == nn) { *hit = rev ? h + (hn - 1 - i) : h + (i + 1 - nn); break; }
    }
#undef NDL
#undef HAY
    free(fail);
    return true;
}

static const char *find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    const char *hit;
    if (nn > 16 && kmp(h, hn, nd, nn, false, &hit)) return hit;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static const char *rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    const char *hit;
    if (nn > 16 && kmp(h, hn, nd, nn, true, &hit)) return hit;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

static bool push_str(J *j, jlist *l, const char *s, size_t n) {
    jv v;
    return mk_strn(j, s, n, &v) && list_push(j, l, v);
}

/* str.split / str.rsplit (sep None: runs of whitespace, no empty strings). */
static bool do_split(J *j, const jstr *s, const jv *sepv, int64_t maxsplit, bool right, jv *out) {
    const char *p = s->s;
    size_t n = s->len;
    jlist *l = list_new(j, 0);
    if (!l) return false;
    *out = list_val(l);
    bool ok = true;
    if (!sepv || sepv->t == T_NONE) {
        if (!right) {
            size_t i = 0, k;
            int64_t count = 0;
            for (;;) {
                while (i < n && (k = space_at(p + i, n - i))) i += k;
                if (i >= n) break;
                if (maxsplit >= 0 && count >= maxsplit) { ok = push_str(j, l, p + i, n - i); break; }
                size_t st = i;
                while (i < n && !space_at(p + i, n - i)) { size_t q; u8dec(p + i, n - i, &q); i += q; }
                if (!(ok = push_str(j, l, p + st, i - st))) break;
                count++;
            }
        } else {
            size_t e = n, st;
            int64_t count = 0;
            jlist *rev = list_new(j, 0);
            if (!rev) ok = false;
            while (ok) {
                while (e > 0 && py_space(u8prev(p, 0, e, &st))) e = st;
                if (e == 0) break;
                if (maxsplit >= 0 && count >= maxsplit) { ok = push_str(j, rev, p, e); break; }
                size_t b = e;
                while (b > 0 && !py_space(u8prev(p, 0, b, &st))) b = st;
                if (!(ok = push_str(j, rev, p + b, e - b))) break;
                e = b;
                count++;
            }
            for (size_t i = rev ? rev->n : 0; ok && i-- > 0;) ok = list_push(j, l, ref(rev->v[i]));
            if (rev) unref(list_val(rev));
        }
    } else if (sepv->t != T_STR) {
        rterr(j, NULL, "must be str or None, not %s", type_name(*sepv));
        ok = false;
    } else if (sepv->u.s->len == 0) {
        rterr(j, NULL, "empty separator");
        ok = false;
    } else {
        const char *sep = sepv->u.s->s;
        size_t sn = sepv->u.s->len;
        if (!right) {
            size_t i = 0;
            int64_t count = 0;
            const char *f;
            while (ok && (maxsplit < 0 || count < maxsplit) && (f = find_bytes(p + i, n - i, sep, sn))) {
                ok = push_str(j, l, p + i, (size_t)(f - (p + i)));
                i = (size_t)(f - p) + sn;
                count++;
            }
            if (ok) ok = push_str(j, l, p + i, n - i);
        } else {
            jlist *rev = list_new(j, 0);
            size_t e = n;
            int64_t count = 0;
            const char *f;
            ok = rev != NULL;
            while (ok && (maxsplit < 0 || count < maxsplit) && (f = rfind_bytes(p, e, sep, sn))) {
                ok = push_str(j, rev, f + sn, (size_t)(p + e - (f + sn)));
                e = (size_t)(f - p);
                count++;
            }
            if (ok) ok = push_str(j, rev, p, e);
            for (size_t i = rev ? rev->n : 0; ok && i-- > 0;) ok = list_push(j, l, ref(rev->v[i]));
            if (rev) unref(list_val(rev));
        }
    }
    if (!ok) { unref(*out); *out = mk_undef(); }
    return ok;
}

static bool do_replace(J *j, const jstr *s, const jstr *old, const jstr *nw, int64_t count, jv *out) {
    jbuf b = {0};
    bool ok = true;
    int64_t done = 0;
    if (old->len == 0) {
        /* Python inserts the replacement around every code point */
        size_t i = 0, l;
        while (ok && i <= s->len) {
            if (count < 0 || done < count) { ok = bput(j, &b, nw->s, nw->len); done++; }
            if (i == s->len) break;
            u8dec(s->s + i, s->len - i, &l);
            if (ok) ok = bput(j, &b, s->s + i, l);
            i += l;
        }
        if (ok && i < s->len) ok = bput(j, &b, s->s + i, s->len - i);
    } else {
        size_t i = 0;
        const char *f;
        while (ok && (count < 0 || done < count) && (f = find_bytes(s->s + i, s->len - i, old->s, old->len))) {
            ok = bput(j, &b, s->s + i, (size_t)(f - (s->s + i))) && bput(j, &b, nw->s, nw->len);
            i = (size_t)(f - s->s) + old->len;
            done++;
        }
        if (ok) ok = bput(j, &b, s->s + i, s->len - i);
    }
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

static bool str_arg(J *j, const jv *v, const char *what, const jstr **out) {
    if (!v || v->t != T_STR) {
        rterr(j, NULL, "%s must be a string, not %s", what, v ? type_name(*v) : "nothing");
        return false;
    }
    *out = v->u.s;
    return true;
}

static bool int_arg(J *j, const jv *v, int64_t dflt, const char *what, int64_t *out) {
    if (!v || v->t == T_NONE) { *out = dflt; return true; }
    if (!is_intlike(*v)) {
        rterr(j, NULL, "%s must be an integer, not %s", what, type_name(*v));
        return false;
    }
    *out = as_int(*v);
    return true;
}

/* Pads to `width` code points: align '<', '>' or '^' (Python's center rounding). */
static bool pad_str(J *j, const char *s, size_t n, int64_t width, char align, const char *fill, jv *out) {
    int64_t len = (int64_t)u8len(s, n);
    if (width <= len) return mk_strn(j, s, n, out);
    int64_t marg = width - len, left = 0;
    if (align == '>') left = marg;
    else if (align == '^') left = marg / 2 + (marg & width & 1);
    if (marg > (int64_t)MAX_STR_BYTES) { rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES); return false; }
    jbuf b = {0};
    bool ok = true;
    size_t fl = strlen(fill);
    for (int64_t i = 0; ok && i < left; i++) ok = bput(j, &b, fill, fl);
    if (ok) ok = bput(j, &b, s, n);
    for (int64_t i = left; ok && i < marg; i++) ok = bput(j, &b, fill, fl);
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

/* ------------------------------------------------------------------ str % args */

static char locale_radix(void) {
    char t[8];
    snprintf(t, sizeof t, "%.1f", 1.5);
    return t[1];
}

/* snprintf of a double with the radix made '.' whatever the locale. */
static void fmt_c_double(char *o, size_t cap, const char *cfmt, int width, int prec, double x) {
    snprintf(o, cap, cfmt, width, prec, x);
    char r = locale_radix();
    if (r != '.')
        for (char *p = o; *p; p++)
            if (*p == r) *p = '.';
}

static bool py_format(J *j, const char *fmt, size_t n, jv args, bool args_is_tuple, jv *out) {
    const jv *items = &args;
    size_t nitems = 1, ai = 0;
    if (args_is_tuple) { items = args.u.l->v; nitems = args.u.l->n; }
    const jdict *mapping = (!args_is_tuple && args.t == T_DICT) ? args.u.d : NULL;
    jbuf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < n;) {
        if (fmt[i] != '%') {
            size_t e = i;
            while (e < n && fmt[e] != '%') e++;
            ok = bput(j, &b, fmt + i, e - i);
            i = e;
            continue;
        }
        i++;
        const jv *val = NULL;
        if (i < n && fmt[i] == '(') {
            size_t e = i + 1;
            while (e < n && fmt[e] != ')') e++;
            if (e >= n) { rterr(j, NULL, "incomplete format key"); ok = false; break; }
            if (!mapping) { rterr(j, NULL, "format requires a mapping"); ok = false; break; }
            for (size_t k = 0; k < mapping->n; k++)
                if (mapping->e[k].k.t == T_STR && mapping->e[k].k.u.s->len == e - i - 1 &&
                    memcmp(mapping->e[k].k.u.s->s, fmt + i + 1, e - i - 1) == 0)
                    val = &mapping->e[k].v;
            if (!val) { rterr(j, NULL, "format key '%.*s' not found", (int)(e - i - 1), fmt + i + 1); ok = false; break; }
            i = e + 1;
        }
        bool minus = false, plus = false, space = false, alt = false, zero = false;
        for (; i < n && strchr("-+ #0", fmt[i]); i++) {
            if (fmt[i] == '-') minus = true;
            else if (fmt[i] == '+') plus = true;
            else if (fmt[i] == ' ') space = true;
            else if (fmt[i] == '#') alt = true;
            else zero = true;
        }
        int64_t width = 0, prec = -1;
        if (i < n && fmt[i] == '*') {
            if (ai >= nitems || !is_intlike(items[ai])) { rterr(j, NULL, "* wants int"); ok = false; break; }
            width = as_int(items[ai++]);
            if (width < 0) { minus = true; width = -width; }
            i++;
        } else {
            while (i < n && is_digit(fmt[i]) && width < 100000) width = width * 10 + (fmt[i++] - '0');
        }
        if (i < n && fmt[i] == '.') {
            i++;
            prec = 0;
            if (i < n && fmt[i] == '*') {
                if (ai >= nitems || !is_intlike(items[ai])) { rterr(j, NULL, "* wants int"); ok = false; break; }
                prec = as_int(items[ai++]);
                i++;
            } else {
                while (i < n && is_digit(fmt[i]) && prec < 100000) prec = prec * 10 + (fmt[i++] - '0');
            }
        }
        if (width > 100000 || prec > 1000) { rterr(j, NULL, "format width or precision too large"); ok = false; break; }
        while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) i++;
        if (i >= n) { rterr(j, NULL, "incomplete format"); ok = false; break; }
        char conv = fmt[i++];
        if (conv == '%') { ok = bputc(j, &b, '%'); continue; }
        if (!val) {
            if (ai >= nitems) { rterr(j, NULL, "not enough arguments for format string"); ok = false; break; }
            val = &items[ai++];
        }
        char body[400];
        const char *sign = "", *prefix = "";
        bool numeric = true;
        jv sv = mk_undef();
        switch (conv) {
        case 's': case 'r': case 'a': {
            numeric = false;
            if (conv == 's') ok = to_str(j, *val, &sv);
            else {
                jbuf rb = {0};
                ok = put_value(j, &rb, *val, true, 0) && buf_to_str(j, &rb, &sv);
                if (!ok) bfree(&rb);
            }
            if (!ok) break;
            size_t len = sv.u.s->len;
            if (prec >= 0) {
                size_t off = 0, l;
                for (int64_t k = 0; k < prec && off < len; k++) { u8dec(sv.u.s->s + off, len - off, &l); off += l; }
                len = off;
            }
            int64_t cps = (int64_t)u8len(sv.u.s->s, len);
            for (int64_t k = cps; ok && !minus && k < width; k++) ok = bputc(j, &b, ' ');
            if (ok) ok = bput(j, &b, sv.u.s->s, len);
            for (int64_t k = cps; ok && minus && k < width; k++) ok = bputc(j, &b, ' ');
            unref(sv);
            break;
        }
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
            int64_t v;
            if (is_intlike(*val)) v = as_int(*val);
            else if (val->t == T_FLOAT && (conv == 'd' || conv == 'i' || conv == 'u') && isfinite(val->u.f) &&
                     fabs(val->u.f) < 9.2e18) v = (int64_t)val->u.f;
            else {
                rterr(j, NULL, "%%%c format: %s is required, not %s", conv,
                      conv == 'x' || conv == 'X' || conv == 'o' ? "an integer" : "a real number", type_name(*val));
                ok = false;
                break;
            }
            uint64_t mag = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
            sign = v < 0 ? "-" : plus ? "+" : space ? " " : "";
            const char *cf = conv == 'x' ? "%llx" : conv == 'X' ? "%llX" : conv == 'o' ? "%llo" : "%llu";
            if (alt) prefix = conv == 'x' ? "0x" : conv == 'X' ? "0X" : conv == 'o' ? "0o" : "";
            snprintf(body, sizeof body, cf, (unsigned long long)mag);
            if (prec > (int64_t)strlen(body)) {
                char t[400];
                size_t bl = strlen(body), z = (size_t)prec - bl;
                memset(t, '0', z);
                memcpy(t + z, body, bl + 1);
                memcpy(body, t, z + bl + 1);
            }
            break;
        }
        case 'e': case 'E': case 'f': case 'F': case 'g': case 'G': {
            if (!is_num(*val)) {
                rterr(j, NULL, "must be real number, not %s", type_name(*val));
                ok = false;
                break;
            }
            double x = as_dbl(*val);
            sign = signbit(x) && !(x != x) ? "-" : plus ? "+" : space ? " " : "";
            char cf[8] = "%*.*", *q = cf + 4;
            if (alt) { memmove(cf + 2, cf + 1, 4); cf[1] = '#'; q++; }
            q[0] = conv;
            q[1] = 0;
            fmt_c_double(body, sizeof body, cf, 0, prec < 0 ? 6 : (int)prec, fabs(x));
            if (x != x) sign = plus ? "+" : space ? " " : "";
            break;
        }
        case 'c': {
            numeric = false;
            char e[4];
            size_t el;
            if (is_intlike(*val) && as_int(*val) >= 0 && as_int(*val) <= 0x10FFFF) el = u8enc((uint32_t)as_int(*val), e);
            else if (val->t == T_STR && u8len(val->u.s->s, val->u.s->len) == 1) {
                el = val->u.s->len;
                memcpy(e, val->u.s->s, el);
            }
            else { rterr(j, NULL, "%%c requires int or char"); ok = false; break; }
            for (int64_t k = 1; ok && !minus && k < width; k++) ok = bputc(j, &b, ' ');
            if (ok) ok = bput(j, &b, e, el);
            for (int64_t k = 1; ok && minus && k < width; k++) ok = bputc(j, &b, ' ');
            break;
        }
        default:
            rterr(j, NULL, "unsupported format character '%c'", conv);
            ok = false;
            break;
        }
        if (!ok || !numeric) continue;
        bool finite_num = !(strchr("eEfFgG", conv) && (strstr(body, "inf") || strstr(body, "nan") ||
                                                       strstr(body, "INF") || strstr(body, "NAN")));
        int64_t len = (int64_t)(strlen(sign) + strlen(prefix) + strlen(body));
        int64_t padn = width > len ? width - len : 0;
        bool zpad = zero && !minus && finite_num;
        for (int64_t k = 0; ok && !minus && !zpad && k < padn; k++) ok = bputc(j, &b, ' ');
        if (ok) ok = bputs(j, &b, sign) && bputs(j, &b, prefix);
        for (int64_t k = 0; ok && zpad && k < padn; k++) ok = bputc(j, &b, '0');
        if (ok) ok = bputs(j, &b, body);
        for (int64_t k = 0; ok && minus && k < padn; k++) ok = bputc(j, &b, ' ');
    }
    if (ok && ai < nitems && !mapping) {
        rterr(j, NULL, "not all arguments converted during string formatting");
        ok = false;
    }
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

/* ------------------------------------------------------------------ tojson */

typedef struct jsonopt {
    bool ascii, sort, pretty;
    const char *ind, *isep, *ksep;
    size_t indn, isepn, ksepn;
} jsonopt;

static bool json_str(J *j, jbuf *b, const char *s, size_t n, bool ascii) {
    if (!bputc(j, b, '"')) return false;
    for (size_t i = 0, l; i < n; i += l) {
        uint32_t c = u8dec(s + i, n - i, &l);
        bool ok;
        switch (c) {
        case '"': ok = bput(j, b, "\\\"", 2); break;
        case '\\': ok = bput(j, b, "\\\\", 2); break;
        case '\n': ok = bput(j, b, "\\n", 2); break;
        case '\r': ok = bput(j, b, "\\r", 2); break;
        case '\t': ok = bput(j, b, "\\t", 2); break;
        case '\b': ok = bput(j, b, "\\b", 2); break;
        case '\f': ok = bput(j, b, "\\f", 2); break;
        default:
            if (c < 0x20) ok = bprintf(j, b, "\\u%04x", c);
            else if (!ascii || c < 0x80) ok = bput(j, b, s + i, l);
            else if (c >= CP_BAD) ok = bprintf(j, b, "\\ufffd");
            else if (c > 0xFFFF) {
                uint32_t v = c - 0x10000;
                ok = bprintf(j, b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else ok = bprintf(j, b, "\\u%04x", c);
            break;
        }
        if (!ok) return false;
    }
    return bputc(j, b, '"');
}

static bool json_newline(J *j, jbuf *b, const jsonopt *o, int level) {
    if (!bputc(j, b, '\n')) return false;
    for (int i = 0; i < level; i++)
        if (!bput(j, b, o->ind, o->indn)) return false;
    return true;
}

static bool put_json(J *j, jbuf *b, jv v, const jsonopt *o, int level) {
    if (level > MAX_NEST + 8) { rterr(j, NULL, "value nested too deeply for tojson"); return false; }
    char tmp[64];
    switch (v.t) {
    case T_NONE: return bputs(j, b, "null");
    case T_BOOL: return bputs(j, b, v.u.b ? "true" : "false");
    case T_INT: return bprintf(j, b, "%lld", (long long)v.u.i);
    case T_FLOAT:
        if (v.u.f != v.u.f) return bputs(j, b, "NaN");
        if (isinf(v.u.f)) return bputs(j, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        fmt_float(v.u.f, tmp, sizeof tmp);
        return bputs(j, b, tmp);
    case T_STR: return json_str(j, b, v.u.s->s, v.u.s->len, o->ascii);
    case T_LIST: {
        if (v.u.l->n == 0) return bputs(j, b, "[]");
        if (!charge(j, v.u.l->n) || !bputc(j, b, '[')) return false;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && !bput(j, b, o->isep, o->isepn)) return false;
            if (o->pretty && !json_newline(j, b, o, level + 1)) return false;
            if (!put_json(j, b, v.u.l->v[i], o, level + 1)) return false;
        }
        if (o->pretty && !json_newline(j, b, o, level)) return false;
        return bputc(j, b, ']');
    }
    case T_DICT: {
        jdict *d = v.u.d;
        if (d->n == 0) return bputs(j, b, "{}");
        if (!charge(j, d->n)) return false;
        /* keys as json.dumps converts them */
        jv *keys = jmalloc(j, d->n * sizeof(jv));
        size_t *order = jmalloc(j, d->n * sizeof(size_t));
        bool ok = keys && order;
        size_t nk = 0;
        for (size_t i = 0; ok && i < d->n; i++, nk++) {
            jv k = d->e[i].k;
            order[i] = i;
            if (k.t == T_STR) keys[i] = ref(k);
            else if (k.t == T_BOOL) ok = mk_str(j, k.u.b ? "true" : "false", &keys[i]);
            else if (k.t == T_NONE) ok = mk_str(j, "null", &keys[i]);
            else if (k.t == T_INT || k.t == T_FLOAT) ok = to_str(j, k, &keys[i]);
            else {
                rterr(j, NULL, "keys must be str, int, float, bool or None, not %s", type_name(k));
                ok = false;
            }
            if (!ok) keys[i] = mk_undef();
        }
        if (ok && o->sort) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t k = i; k > 0; k--) {
                    int c;
                    jv_cmp(j, keys[order[k - 1]], keys[order[k]], "<", &c, 0);
                    if (c <= 0) break;
                    size_t t = order[k]; order[k] = order[k - 1]; order[k - 1] = t;
                }
        if (ok) ok = bputc(j, b, '{');
        for (size_t i = 0; ok && i < d->n; i++) {
            size_t x = order[i];
            if (i) ok = bput(j, b, o->isep, o->isepn);
            if (ok && o->pretty) ok = json_newline(j, b, o, level + 1);
            if (ok) ok = json_str(j, b, keys[x].u.s->s, keys[x].u.s->len, o->ascii) && bput(j, b, o->ksep, o->ksepn) &&
                         put_json(j, b, d->e[x].v, o, level + 1);
        }
        if (ok && o->pretty) ok = json_newline(j, b, o, level);
        if (ok) ok = bputc(j, b, '}');
        for (size_t i = 0; keys && i < nk; i++) unref(keys[i]);
        free(keys);
        free(order);
        return ok;
    }
    default:
        rterr(j, NULL, "Object of type %s is not JSON serializable", type_name(v));
        return false;
    }
}

/* Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False). */
static bool f_tojson(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    if (!check_args(j, a, 4, kw, "tojson")) return false;
    const jv *asc = arg(a, 0, "ensure_ascii"), *ind = arg(a, 1, "indent"), *sep = arg(a, 2, "separators"),
             *srt = arg(a, 3, "sort_keys");
    jsonopt o = {0};
    o.ascii = asc && truthy(*asc);
    o.sort = srt && truthy(*srt);
    char spaces[64];
    if (ind && ind->t != T_NONE) {
        o.pretty = true;
        if (ind->t == T_STR) { o.ind = ind->u.s->s; o.indn = ind->u.s->len; }
        else if (is_intlike(*ind)) {
            int64_t w = as_int(*ind);
            if (w < 0) w = 0;
            if (w > 63) { rterr(j, NULL, "tojson indent too large"); return false; }
            memset(spaces, ' ', (size_t)w);
            o.ind = spaces;
            o.indn = (size_t)w;
        } else { rterr(j, NULL, "tojson indent must be an integer or a string"); return false; }
    }
    o.isep = o.pretty ? "," : ", ";
    o.ksep = ": ";
    if (sep && sep->t != T_NONE) {
        if (sep->t != T_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != T_STR || sep->u.l->v[1].t != T_STR) {
            rterr(j, NULL, "tojson separators must be a pair of strings");
            return false;
        }
        o.isep = sep->u.l->v[0].u.s->s;
        o.ksep = sep->u.l->v[1].u.s->s;
    }
    o.isepn = strlen(o.isep);
    o.ksepn = strlen(o.ksep);
    if (v.t == T_UNDEF) { rterr(j, NULL, "Object of type Undefined is not JSON serializable"); return false; }
    jbuf b = {0};
    if (!put_json(j, &b, v, &o, 0)) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

/* ------------------------------------------------------------------ sorting */

/* Stable merge sort of idx[] by keys[]; comparisons can fail (mismatched types). */
static bool sort_idx(J *j, const jv *keys, size_t *idx, size_t n, bool reverse) {
    uint64_t lg = 1;
    while (((size_t)1 << lg) < n) lg++;
    if (!charge(j, (uint64_t)n * lg)) return false;
    size_t *tmp = jmalloc(j, (n ? n : 1) * sizeof(size_t));
    if (!tmp) return false;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                int c;
                if (!jv_cmp(j, keys[idx[b]], keys[idx[a]], "<", &c, 0)) { free(tmp); return false; }
                bool take_b = reverse ? (c == 1) : (c == -1);
                tmp[k++] = take_b ? idx[b++] : idx[a++];
            }
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, n * sizeof(size_t));
    }
    free(tmp);
    return true;
}

/* Looks up "a.b.0" on an item the way Jinja's attribute filters do (getitem, then getattr). */
static bool attr_path(J *j, jv item, const jv *path, jv *out) {
    if (!path || path->t == T_NONE) { *out = ref(item); return true; }
    if (is_intlike(*path)) return get_item(j, item, *path, out);
    if (path->t != T_STR) { rterr(j, NULL, "attribute must be a string or integer"); return false; }
    const char *s = path->u.s->s;
    jv curv = ref(item);
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        jv key;
        bool isnum = n > 0;
        int64_t num = 0;
        for (size_t i = 0; i < n; i++) {
            if (!is_digit(s[i]) || num > INT64_MAX / 10) { isnum = false; break; }
            num = num * 10 + (s[i] - '0');
        }
        if (isnum) key = mk_int(num);
        else if (!mk_strn(j, s, n, &key)) { unref(curv); return false; }
        jv next;
        bool ok = curv.t == T_UNDEF ? (next = curv, curv = mk_undef(), true) : get_item(j, curv, key, &next);
        unref(key);
        unref(curv);
        if (!ok) return false;
        curv = next;
        if (!dot) break;
        s = dot + 1;
    }
    *out = curv;
    return true;
}

/* Sort key: the attribute, lowercased when comparisons ignore case. */
static bool sort_key(J *j, jv item, const jv *attr, bool case_sensitive, jv *out) {
    jv k;
    if (!attr_path(j, item, attr, &k)) return false;
    if (!case_sensitive && k.t == T_STR) {
        bool ok = map_case(j, k.u.s->s, k.u.s->len, CASE_LOWER, out);
        unref(k);
        return ok;
    }
    *out = k;
    return true;
}

/* ------------------------------------------------------------------ filters */

static size_t value_len(J *j, jv v, bool *ok) {
    *ok = true;
    switch (v.t) {
    case T_STR: *ok = charge(j, v.u.s->len / 64); return u8len(v.u.s->s, v.u.s->len);
    case T_LIST: return v.u.l->n;
    case T_DICT: return v.u.d->n;
    case T_UNDEF: return 0;
    case T_LOOP: return (size_t)v.u.lp->n;
    default:
        rterr(j, NULL, "object of type '%s' has no len()", type_name(v));
        *ok = false;
        return 0;
    }
}

/* Python float(str): optional whitespace and sign, decimal or inf/nan, underscores between digits. */
static bool parse_py_float(const jstr *s, double *out) {
    size_t a = 0, b = s->len, l, st;
    while (a < b && py_space(u8dec(s->s + a, b - a, &l))) a += l;
    while (b > a && py_space(u8prev(s->s, a, b, &st))) b = st;
    if (a == b || b - a > 300) return false;
    char buf[320];
    size_t k = 0;
    for (size_t i = a; i < b; i++) {
        char c = s->s[i];
        if (c == '_') {
            if (i == a || i + 1 >= b || !is_digit(s->s[i - 1]) || !is_digit(s->s[i + 1])) return false;
            continue;
        }
        if (!(is_digit(c) || c == '.' || c == '+' || c == '-' || (c | 32) == 'e' || (c | 32) == 'i' ||
              (c | 32) == 'n' || (c | 32) == 'f' || (c | 32) == 't' || (c | 32) == 'y' || (c | 32) == 'a'))
            return false;
        buf[k++] = c;
    }
    buf[k] = 0;
    /* strtod also takes hex floats and "infinity"-like words Python accepts; reject hex */
    for (size_t i = 0; i < k; i++)
        if ((buf[i] | 32) == 'x') return false;
    char *end;
    double d = loc_strtod(buf, &end);
    if (end != buf + k) return false;
    *out = d;
    return true;
}

/* Python int(str, base): whitespace, sign, optional prefix matching the base, underscores. */
static bool parse_py_int(const jstr *s, int64_t base, int64_t *out) {
    size_t a = 0, b = s->len, l, st;
    while (a < b && py_space(u8dec(s->s + a, b - a, &l))) a += l;
    while (b > a && py_space(u8prev(s->s, a, b, &st))) b = st;
    bool neg = false;
    if (a < b && (s->s[a] == '+' || s->s[a] == '-')) neg = s->s[a++] == '-';
    if (b - a >= 2 && s->s[a] == '0') {
        char p = s->s[a + 1] | 32;
        if ((p == 'x' && (base == 16 || base == 0)) || (p == 'o' && (base == 8 || base == 0)) ||
            (p == 'b' && (base == 2 || base == 0))) {
            base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
            a += 2;
            if (a < b && s->s[a] == '_') a++;
        }
    }
    if (base == 0) base = 10;
    if (base < 2 || base > 36 || a >= b) return false;
    uint64_t v = 0;
    bool prev_digit = false;
    for (size_t i = a; i < b; i++) {
        char c = s->s[i];
        if (c == '_' && prev_digit && i + 1 < b) { prev_digit = false; continue; }
        int d = is_digit(c) ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'z') ? (c | 32) - 'a' + 10 : 99;
        if (d >= base) return false;
        if (v > ((uint64_t)INT64_MAX + 1 - (uint64_t)d) / (uint64_t)base) return false;
        v = v * (uint64_t)base + (uint64_t)d;
        prev_digit = true;
    }
    if (!prev_digit) return false;
    if (!neg && v > INT64_MAX) return false;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool html_escape(J *j, const char *s, size_t n, jv *out) {
    jbuf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        switch (s[i]) {
        case '&': ok = bputs(j, &b, "&amp;"); break;
        case '<': ok = bputs(j, &b, "&lt;"); break;
        case '>': ok = bputs(j, &b, "&gt;"); break;
        case '"': ok = bputs(j, &b, "&#34;"); break;
        case '\'': ok = bputs(j, &b, "&#39;"); break;
        default: ok = bputc(j, &b, s[i]); break;
        }
    }
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

/* select/reject/selectattr/rejectattr: keeps items whose test (or truth) equals `keep`. */
/* Jinja2's select/reject/selectattr/rejectattr/map start with `if value:`: a falsy input (none,
 * an empty string, 0) gives an empty sequence before the arguments are even looked at. */
static bool falsy_gives_empty(J *j, jv v, jv *out) {
    if (truthy(v)) return false;
    jlist *empty = list_new(j, 0);
    if (empty) *out = list_val(empty);
    return true;
}

static bool filter_select(J *j, jv v, const jargs *a, bool by_attr, bool keep, jv *out) {
    if (falsy_gives_empty(j, v, out)) return !j->failed;
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    size_t first = by_attr ? 1 : 0;
    const jv *attr = by_attr ? arg(a, 0, NULL) : NULL;
    if (by_attr && !attr) { unref(list_val(items)); rterr(j, NULL, "missing parameter for attribute name"); return false; }
    const jv *testname = arg(a, first, NULL);
    if (testname && testname->t != T_STR) { unref(list_val(items)); rterr(j, NULL, "test name must be a string"); return false; }
    jargs sub = {0};
    if (a->npos > first + 1) { sub.pos = a->pos + first + 1; sub.npos = a->npos - first - 1; }
    sub.kwn = a->kwn;
    sub.kwv = a->kwv;
    sub.nkw = a->nkw;
    jlist *res = list_new(j, 0);
    bool ok = res != NULL;
    for (size_t i = 0; ok && i < items->n; i++) {
        jv x;
        if (!(ok = attr_path(j, items->v[i], attr, &x))) break;
        bool r;
        if (testname) ok = run_test(j, testname->u.s->s, x, &sub, &r);
        else r = truthy(x);
        unref(x);
        if (ok && r == keep) ok = list_push(j, res, ref(items->v[i]));
    }
    unref(list_val(items));
    if (!ok) { if (res) unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

static bool f_map(J *j, jv v, const jargs *a, jv *out) {
    if (falsy_gives_empty(j, v, out)) return !j->failed;
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    const jv *attr = NULL, *dflt = NULL;
    for (size_t i = 0; i < a->nkw; i++) {
        if (strcmp(a->kwn[i], "attribute") == 0) attr = &a->kwv[i];
        else if (strcmp(a->kwn[i], "default") == 0) dflt = &a->kwv[i];
    }
    jlist *res = list_new(j, items->n);
    bool ok = res != NULL;
    if (ok && !attr && (a->npos == 0 || a->pos[0].t != T_STR)) {
        rterr(j, NULL, "map requires a filter name or attribute=");
        ok = false;
    }
    jargs sub = {0};
    if (!attr && a->npos > 1) { sub.pos = a->pos + 1; sub.npos = a->npos - 1; }
    if (!attr) { sub.kwn = a->kwn; sub.kwv = a->kwv; sub.nkw = a->nkw; }
    for (size_t i = 0; ok && i < items->n; i++) {
        jv x;
        if (attr) {
            ok = attr_path(j, items->v[i], attr, &x);
            if (ok && x.t == T_UNDEF && dflt) { unref(x); x = ref(*dflt); }
        } else {
            ok = apply_filter(j, a->pos[0].u.s->s, items->v[i], &sub, &x);
        }
        if (ok) ok = list_push(j, res, x);
    }
    unref(list_val(items));
    if (!ok) { if (res) unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

/* sort, unique, min, max, dictsort share the key machinery. */
static bool f_sort(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"reverse", "case_sensitive", "attribute", NULL};
    if (!check_args(j, a, 3, kw, "sort")) return false;
    const jv *rev = arg(a, 0, "reverse"), *cs = arg(a, 1, "case_sensitive"), *attr = arg(a, 2, "attribute");
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    size_t n = items->n;
    jv *keys = jmalloc(j, (n ? n : 1) * sizeof(jv));
    size_t *idx = jmalloc(j, (n ? n : 1) * sizeof(size_t));
    bool ok = keys && idx;
    size_t nk = 0;
    for (; ok && nk < n; nk++) {
        idx[nk] = nk;
        if (!(ok = sort_key(j, items->v[nk], attr, cs && truthy(*cs), &keys[nk]))) break;
    }
    if (ok) ok = sort_idx(j, keys, idx, n, rev && truthy(*rev));
    jlist *res = ok ? list_new(j, n) : NULL;
    if (ok && !res) ok = false;
    for (size_t i = 0; ok && i < n; i++) ok = list_push(j, res, ref(items->v[idx[i]]));
    for (size_t i = 0; keys && i < nk; i++) unref(keys[i]);
    free(keys);
    free(idx);
    unref(list_val(items));
    if (!ok) { if (res) unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

static bool f_unique(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"case_sensitive", "attribute", NULL};
    if (!check_args(j, a, 2, kw, "unique")) return false;
    const jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    jlist *res = list_new(j, 0), *seen = list_new(j, 0);
    bool ok = res && seen;
    for (size_t i = 0; ok && i < items->n; i++) {
        jv k;
        if (!(ok = sort_key(j, items->v[i], attr, cs && truthy(*cs), &k))) break;
        bool dup = false;
        if (!(ok = charge(j, seen->n))) { unref(k); break; }
        for (size_t s = 0; s < seen->n && !dup; s++) dup = jv_eq(seen->v[s], k, 0);
        if (dup) { unref(k); continue; }
        ok = list_push(j, seen, k) && list_push(j, res, ref(items->v[i]));
    }
    unref(list_val(items));
    if (seen) unref(list_val(seen));
    if (!ok) { if (res) unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

static bool f_minmax(J *j, jv v, const jargs *a, bool want_max, jv *out) {
    static const char *const kw[] = {"case_sensitive", "attribute", NULL};
    if (!check_args(j, a, 2, kw, want_max ? "max" : "min")) return false;
    const jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    bool ok = true;
    size_t best = SIZE_MAX;
    jv bestk = mk_undef();
    for (size_t i = 0; ok && i < items->n; i++) {
        jv k;
        if (!(ok = sort_key(j, items->v[i], attr, cs && truthy(*cs), &k))) break;
        int c = 0;
        if (best != SIZE_MAX) ok = jv_cmp(j, k, bestk, want_max ? ">" : "<", &c, 0);
        if (ok && (best == SIZE_MAX || (want_max ? c == 1 : c == -1))) { unref(bestk); bestk = k; best = i; }
        else unref(k);
    }
    unref(bestk);
    if (ok) *out = best == SIZE_MAX ? mk_undef_msg(j, "No aggregated item, sequence was empty.") : ref(items->v[best]);
    unref(list_val(items));
    return ok && !j->failed;
}

static bool f_dictsort(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"case_sensitive", "by", "reverse", NULL};
    if (!check_args(j, a, 3, kw, "dictsort")) return false;
    const jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
    if (v.t != T_DICT) { rterr(j, NULL, "You can only sort by either \"key\" or \"value\" of a mapping"); return false; }
    int pos = 0;
    if (by && by->t == T_STR && strcmp(by->u.s->s, "value") == 0) pos = 1;
    else if (by && !(by->t == T_STR && strcmp(by->u.s->s, "key") == 0)) {
        rterr(j, NULL, "You can only sort by either \"key\" or \"value\"");
        return false;
    }
    jdict *d = v.u.d;
    jlist *pairs = list_new(j, d->n);
    bool ok = pairs != NULL;
    for (size_t i = 0; ok && i < d->n; i++) {
        jlist *p = list_new(j, 2);
        if (!(ok = p != NULL)) break;
        p->tuple = true;
        ok = list_push(j, p, ref(d->e[i].k)) && list_push(j, p, ref(d->e[i].v)) && list_push(j, pairs, list_val(p));
        if (!ok) unref(list_val(p));
    }
    if (!ok) { if (pairs) unref(list_val(pairs)); return false; }
    jv idx = mk_int(pos);
    jargs sa = {0};
    jv sargs[3] = {rev ? *rev : mk_bool(false), cs ? *cs : mk_bool(false), idx};
    sa.pos = sargs;
    sa.npos = 3;
    ok = f_sort(j, list_val(pairs), &sa, out);
    unref(list_val(pairs));
    return ok;
}

static bool f_indent(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"width", "first", "blank", NULL};
    if (!check_args(j, a, 3, kw, "indent")) return false;
    const jv *w = arg(a, 0, "width"), *fi = arg(a, 1, "first"), *bl = arg(a, 2, "blank");
    jv s, ind;
    if (v.t == T_UNDEF) { undef_err(j, NULL, v); return false; }
    if (v.t != T_STR) { rterr(j, NULL, "unsupported operand type(s) for +=: '%s' and 'str'", type_name(v)); return false; }
    s = ref(v);
    if (w && w->t == T_STR) ind = ref(*w);
    else {
        int64_t n;
        if (!int_arg(j, w, 4, "indent width", &n)) { unref(s); return false; }
        if (n < 0) n = 0;
        if (n > 1000) n = 1000;
        char sp[1001];
        memset(sp, ' ', (size_t)n);
        if (!mk_strn(j, sp, (size_t)n, &ind)) { unref(s); return false; }
    }
    /* Jinja appends "\n" and then uses str.splitlines(), which splits on \n, \r\n and \r among
     * others; lines after the first get the indentation (blank ones only with blank=true). */
    jbuf b = {0};
    bool ok = true, first_line = true;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, i = 0;
    if (fi && truthy(*fi)) ok = bput(j, &b, ind.u.s->s, ind.u.s->len);
    while (ok && i <= n) {
        size_t e = i;
        while (e < n && p[e] != '\n' && p[e] != '\r' && p[e] != '\v' && p[e] != '\f') e++;
        if (e >= n && i >= n && !first_line) break;
        if (!first_line) {
            ok = bputc(j, &b, '\n');
            if (ok && (e > i || (bl && truthy(*bl)))) ok = bput(j, &b, ind.u.s->s, ind.u.s->len);
        }
        if (ok) ok = bput(j, &b, p + i, e - i);
        first_line = false;
        if (e >= n) break;
        i = e + ((p[e] == '\r' && e + 1 < n && p[e + 1] == '\n') ? 2 : 1);
    }
    unref(s);
    unref(ind);
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

static bool f_truncate(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"length", "killwords", "end", "leeway", NULL};
    if (!check_args(j, a, 4, kw, "truncate")) return false;
    int64_t length, leeway;
    const jv *kwd = arg(a, 1, "killwords"), *endv = arg(a, 2, "end");
    if (!int_arg(j, arg(a, 0, "length"), 255, "length", &length) || !int_arg(j, arg(a, 3, "leeway"), 5, "leeway", &leeway))
        return false;
    jv s;
    if (v.t != T_STR) {
        /* Jinja returns short sized values as they are and fails on the rest */
        bool ok;
        size_t n = value_len(j, v, &ok);
        if (!ok) return false;
        if ((int64_t)n > length + leeway) { rterr(j, NULL, "truncate needs a string, not %s", type_name(v)); return false; }
        *out = ref(v);
        return true;
    }
    s = ref(v);
    const char *end = endv && endv->t == T_STR ? endv->u.s->s : "...";
    int64_t endlen = (int64_t)u8len(end, strlen(end));
    int64_t len = (int64_t)u8len(s.u.s->s, s.u.s->len);
    if (length < endlen || leeway < 0) { unref(s); rterr(j, NULL, "expected length >= len(end) and leeway >= 0"); return false; }
    if (len <= length + leeway) { *out = s; return true; }
    size_t off = 0, l;
    for (int64_t k = 0; k < length - endlen; k++) { u8dec(s.u.s->s + off, s.u.s->len - off, &l); off += l; }
    if (!(kwd && truthy(*kwd))) {
        const char *sp = rfind_bytes(s.u.s->s, off, " ", 1);
        if (sp) off = (size_t)(sp - s.u.s->s);
    }
    jbuf b = {0};
    bool ok = bput(j, &b, s.u.s->s, off) && bputs(j, &b, end);
    unref(s);
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

static bool f_round(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"precision", "method", NULL};
    if (!check_args(j, a, 2, kw, "round")) return false;
    int64_t prec;
    if (!int_arg(j, arg(a, 0, "precision"), 0, "precision", &prec)) return false;
    const jv *m = arg(a, 1, "method");
    const char *method = m && m->t == T_STR ? m->u.s->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor")) {
        rterr(j, NULL, "method must be common, ceil or floor");
        return false;
    }
    if (!is_num(v)) { rterr(j, NULL, "type %s doesn't define __round__ method", type_name(v)); return false; }
    if (strcmp(method, "common") == 0) {
        if (is_intlike(v) && prec >= 0) { *out = mk_int(as_int(v)); return true; }
        double x = as_dbl(v);
        if (prec > 300 || !isfinite(x)) { *out = mk_float(x); return true; }
        if (prec < -300) { *out = mk_float(0.0 * x); return true; }
        char buf[400], *end;
        if (prec >= 0) {
            /* printf rounds the exact binary value half-to-even, as Python's round() does */
            fmt_c_double(buf, sizeof buf, "%*.*f", 0, (int)prec, x);
            *out = mk_float(loc_strtod(buf, &end));
        } else {
            double p = pow(10.0, (double)-prec), y = x / p, r = nearbyint(y);
            *out = mk_float(r * p);
        }
        if (is_intlike(v)) *out = mk_int((int64_t)out->u.f);
        return true;
    }
    double x = as_dbl(v), p = pow(10.0, (double)prec);
    *out = mk_float((strcmp(method, "ceil") == 0 ? ceil(x * p) : floor(x * p)) / p);
    return true;
}

static bool f_int(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"default", "base", NULL};
    if (!check_args(j, a, 2, kw, "int")) return false;
    const jv *d = arg(a, 0, "default");
    int64_t base;
    if (!int_arg(j, arg(a, 1, "base"), 10, "base", &base)) return false;
    int64_t r;
    double f;
    if (is_intlike(v)) { *out = mk_int(as_int(v)); return true; }
    if (v.t == T_FLOAT && isfinite(v.u.f) && fabs(v.u.f) < 9.2e18) { *out = mk_int((int64_t)v.u.f); return true; }
    if (v.t == T_STR) {
        if (parse_py_int(v.u.s, base, &r)) { *out = mk_int(r); return true; }
        if (parse_py_float(v.u.s, &f) && isfinite(f) && fabs(f) < 9.2e18) { *out = mk_int((int64_t)f); return true; }
    }
    *out = d ? ref(*d) : mk_int(0);
    return true;
}

static bool f_float(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"default", NULL};
    if (!check_args(j, a, 1, kw, "float")) return false;
    const jv *d = arg(a, 0, "default");
    double f;
    if (is_num(v)) { *out = mk_float(as_dbl(v)); return true; }
    if (v.t == T_STR && parse_py_float(v.u.s, &f)) { *out = mk_float(f); return true; }
    *out = d ? ref(*d) : mk_float(0.0);
    return true;
}

static bool f_first_last(J *j, jv v, bool last, jv *out) {
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    if (items->n) *out = ref(items->v[last ? items->n - 1 : 0]);
    else *out = mk_undef_msg(j, "No %s item, sequence was empty.", last ? "last" : "first");
    unref(list_val(items));
    return !j->failed;
}

static bool f_join(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"d", "attribute", NULL};
    if (!check_args(j, a, 2, kw, "join")) return false;
    const jv *d = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    jv sep = mk_undef();
    if (d && !to_str(j, *d, &sep)) return false;
    jlist *items;
    if (!iter_list(j, v, &items)) { unref(sep); return false; }
    jbuf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < items->n; i++) {
        if (i && sep.t == T_STR) ok = bput(j, &b, sep.u.s->s, sep.u.s->len);
        jv x;
        if (ok && (ok = attr_path(j, items->v[i], attr, &x))) {
            ok = put_value(j, &b, x, false, 0);
            unref(x);
        }
    }
    unref(list_val(items));
    unref(sep);
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

static bool f_sum(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"attribute", "start", NULL};
    if (!check_args(j, a, 2, kw, "sum")) return false;
    const jv *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    jv acc = start ? ref(*start) : mk_int(0);
    bool ok = true;
    for (size_t i = 0; ok && i < items->n; i++) {
        jv x, r;
        if (!(ok = attr_path(j, items->v[i], attr, &x))) break;
        ok = binop(j, OP_ADD, acc, x, &r);
        unref(x);
        unref(acc);
        acc = ok ? r : mk_undef();
    }
    unref(list_val(items));
    if (!ok) { unref(acc); return false; }
    *out = acc;
    return true;
}

static bool f_items(J *j, jv v, jv *out) {
    if (v.t == T_UNDEF) { jlist *l = list_new(j, 0); if (!l) return false; *out = list_val(l); return true; }
    if (v.t != T_DICT) { rterr(j, NULL, "Can only get item pairs from a mapping."); return false; }
    jlist *l = list_new(j, v.u.d->n);
    if (!l) return false;
    *out = list_val(l);
    for (size_t i = 0; i < v.u.d->n; i++) {
        jlist *p = list_new(j, 2);
        if (!p) goto fail;
        p->tuple = true;
        p->v[0] = ref(v.u.d->e[i].k);
        p->v[1] = ref(v.u.d->e[i].v);
        p->n = 2;
        p->nest = (uint16_t)((nest_of(p->v[0]) > nest_of(p->v[1]) ? nest_of(p->v[0]) : nest_of(p->v[1])) + 1);
        if (!list_push(j, l, list_val(p))) goto fail;
    }
    return true;
fail:
    unref(*out);
    *out = mk_undef();
    return false;
}

static bool f_wordcount(J *j, jv v, jv *out) {
    jv s;
    if (!to_str(j, v, &s)) return false;
    int64_t words = 0;
    bool in = false;
    for (size_t i = 0, l; i < s.u.s->len; i += l) {
        uint32_t c = u8dec(s.u.s->s + i, s.u.s->len - i, &l);
        bool w = c == '_' || cp_digit(c) || cp_alpha(c) || (c >= 0x80 && c < CP_BAD && !py_space(c) &&
                                                             !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F));
        if (w && !in) words++;
        in = w;
    }
    unref(s);
    *out = mk_int(words);
    return true;
}

static bool f_title(J *j, jv v, jv *out) {
    /* Jinja's title: words start after runs of whitespace, '-', '(', '{', '[' or '<' */
    jv s;
    if (!to_str(j, v, &s)) return false;
    jbuf b = {0};
    bool ok = true, at_start = true;
    for (size_t i = 0, l; ok && i < s.u.s->len; i += l) {
        uint32_t c = u8dec(s.u.s->s + i, s.u.s->len - i, &l);
        bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        uint32_t m = sep ? c : at_start ? cp_upper(c) : cp_lower(c);
        at_start = sep;
        char e[4];
        ok = bput(j, &b, e, u8enc(m, e));
    }
    unref(s);
    if (!ok) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

static bool f_reverse(J *j, jv v, jv *out) {
    if (v.t == T_STR) {
        jbuf b = {0};
        size_t e = v.u.s->len, st;
        bool ok = true;
        while (ok && e > 0) {
            u8prev(v.u.s->s, 0, e, &st);
            ok = bput(j, &b, v.u.s->s + st, e - st);
            e = st;
        }
        if (!ok) { bfree(&b); return false; }
        return buf_to_str(j, &b, out);
    }
    jlist *items;
    if (!iter_list(j, v, &items)) return false;
    jlist *r = list_new(j, items->n);
    bool ok = r != NULL;
    for (size_t i = items->n; ok && i-- > 0;) ok = list_push(j, r, ref(items->v[i]));
    unref(list_val(items));
    if (!ok) { if (r) unref(list_val(r)); return false; }
    *out = list_val(r);
    return true;
}

static bool apply_filter(J *j, const char *name, jv v, const jargs *a, jv *out) {
    *out = mk_undef();
    jv s = mk_undef();
    bool ok;
#define IS(n) (strcmp(name, n) == 0)
#define NOARGS(what) if (!check_args(j, a, 0, NULL, what)) return false
    if (IS("tojson")) return f_tojson(j, v, a, out);
    if (IS("trim")) {
        static const char *const kw[] = {"chars", NULL};
        if (!check_args(j, a, 1, kw, "trim") || !to_str(j, v, &s)) return false;
        ok = do_strip(j, s.u.s->s, s.u.s->len, arg(a, 0, "chars"), true, true, out);
        unref(s);
        return ok;
    }
    if (IS("length") || IS("count")) {
        NOARGS(name);
        size_t n = value_len(j, v, &ok);
        *out = mk_int((int64_t)n);
        return ok;
    }
    if (IS("upper") || IS("lower") || IS("capitalize")) {
        NOARGS(name);
        if (!to_str(j, v, &s)) return false;
        ok = map_case(j, s.u.s->s, s.u.s->len, IS("upper") ? CASE_UPPER : IS("lower") ? CASE_LOWER : CASE_CAPITALIZE, out);
        unref(s);
        return ok;
    }
    if (IS("title")) { NOARGS(name); return f_title(j, v, out); }
    if (IS("default") || IS("d")) {
        static const char *const kw[] = {"default_value", "boolean", NULL};
        if (!check_args(j, a, 2, kw, "default")) return false;
        const jv *d = arg(a, 0, "default_value"), *bo = arg(a, 1, "boolean");
        if (v.t == T_UNDEF || (bo && truthy(*bo) && !truthy(v))) {
            if (d) *out = ref(*d);
            else return mk_str(j, "", out);
        } else {
            *out = ref(v);
        }
        return true;
    }
    if (IS("replace")) {
        static const char *const kw[] = {"old", "new", "count", NULL};
        if (!check_args(j, a, 3, kw, "replace")) return false;
        const jv *o = arg(a, 0, "old"), *n = arg(a, 1, "new");
        if (!o || !n) { rterr(j, NULL, "replace() needs old and new"); return false; }
        int64_t cnt;
        jv os = mk_undef(), ns = mk_undef();
        ok = int_arg(j, arg(a, 2, "count"), -1, "count", &cnt) && to_str(j, v, &s) && to_str(j, *o, &os) && to_str(j, *n, &ns);
        if (ok) ok = do_replace(j, s.u.s, os.u.s, ns.u.s, cnt, out);
        unref(s);
        unref(os);
        unref(ns);
        return ok;
    }
    if (IS("join")) return f_join(j, v, a, out);
    if (IS("items")) { NOARGS(name); return f_items(j, v, out); }
    if (IS("first") || IS("last")) { NOARGS(name); return f_first_last(j, v, IS("last"), out); }
    if (IS("list")) {
        NOARGS(name);
        jlist *l;
        if (!iter_list(j, v, &l)) return false;
        if (l->tuple) {
            jv t = list_val(l);
            jlist *c = list_new(j, l->n);
            ok = c != NULL;
            for (size_t i = 0; ok && i < l->n; i++) ok = list_push(j, c, ref(l->v[i]));
            unref(t);
            if (!ok) { if (c) unref(list_val(c)); return false; }
            l = c;
        }
        *out = list_val(l);
        return true;
    }
    if (IS("string")) { NOARGS(name); return to_str(j, v, out); }
    if (IS("int")) return f_int(j, v, a, out);
    if (IS("float")) return f_float(j, v, a, out);
    if (IS("abs")) {
        NOARGS(name);
        if (v.t == T_FLOAT) { *out = mk_float(fabs(v.u.f)); return true; }
        if (is_intlike(v)) return int_result(j, as_int(v) == INT64_MIN, as_int(v) < 0 ? -as_int(v) : as_int(v), out);
        rterr(j, NULL, "bad operand type for abs(): '%s'", type_name(v));
        return false;
    }
    if (IS("round")) return f_round(j, v, a, out);
    if (IS("select") || IS("reject")) return filter_select(j, v, a, false, IS("select"), out);
    if (IS("selectattr") || IS("rejectattr")) return filter_select(j, v, a, true, IS("selectattr"), out);
    if (IS("map")) return f_map(j, v, a, out);
    if (IS("unique")) return f_unique(j, v, a, out);
    if (IS("sort")) return f_sort(j, v, a, out);
    if (IS("dictsort")) return f_dictsort(j, v, a, out);
    if (IS("min") || IS("max")) return f_minmax(j, v, a, IS("max"), out);
    if (IS("sum")) return f_sum(j, v, a, out);
    if (IS("reverse")) { NOARGS(name); return f_reverse(j, v, out); }
    if (IS("indent")) return f_indent(j, v, a, out);
    if (IS("truncate")) return f_truncate(j, v, a, out);
    if (IS("wordcount")) { NOARGS(name); return f_wordcount(j, v, out); }
    if (IS("center")) {
        static const char *const kw[] = {"width", NULL};
        int64_t w;
        if (!check_args(j, a, 1, kw, "center") || !int_arg(j, arg(a, 0, "width"), 80, "width", &w) || !to_str(j, v, &s))
            return false;
        ok = pad_str(j, s.u.s->s, s.u.s->len, w, '^', " ", out);
        unref(s);
        return ok;
    }
    if (IS("safe")) { NOARGS(name); *out = ref(v); return true; }
    if (IS("escape") || IS("e") || IS("forceescape")) {
        NOARGS(name);
        if (!to_str(j, v, &s)) return false;
        ok = html_escape(j, s.u.s->s, s.u.s->len, out);
        unref(s);
        return ok;
    }
    if (IS("pprint")) {
        NOARGS(name);
        jbuf b = {0};
        if (!put_value(j, &b, v, true, 0)) { bfree(&b); return false; }
        return buf_to_str(j, &b, out);
    }
    if (IS("attr")) {
        if (a->npos != 1 || a->pos[0].t != T_STR) { rterr(j, NULL, "attr() needs an attribute name"); return false; }
        if (v.t == T_DICT) {
            int mid = method_id(T_DICT, a->pos[0].u.s->s);
            if (mid) return mk_method(j, mid, v, out);
            *out = undef_attr(j, v, a->pos[0].u.s->s);
            return !j->failed;
        }
        return get_attr(j, v, a->pos[0].u.s->s, out);
    }
    if (IS("format")) {
        if (!to_str(j, v, &s)) return false;
        if (a->nkw) {
            jdict *d = dict_new(j);
            ok = d != NULL;
            for (size_t i = 0; ok && i < a->nkw; i++) ok = dict_set_cstr(j, d, a->kwn[i], ref(a->kwv[i]));
            if (ok) ok = py_format(j, s.u.s->s, s.u.s->len, dict_val(d), false, out);
            if (d) unref(dict_val(d));
        } else {
            jlist *t = list_new(j, a->npos);
            ok = t != NULL;
            if (ok) t->tuple = true;
            for (size_t i = 0; ok && i < a->npos; i++) ok = list_push(j, t, ref(a->pos[i]));
            if (ok) ok = py_format(j, s.u.s->s, s.u.s->len, list_val(t), true, out);
            if (t) unref(list_val(t));
        }
        unref(s);
        return ok;
    }
#undef IS
#undef NOARGS
    rterr(j, NULL, "the '%s' filter is not supported by quill", name);
    return false;
}

/* ------------------------------------------------------------------ tests */

static bool run_test(J *j, const char *name, jv v, const jargs *a, bool *res) {
    *res = false;
#define IS(n) (strcmp(name, n) == 0)
    const jv *x = arg(a, 0, NULL);
    if (IS("defined")) *res = v.t != T_UNDEF;
    else if (IS("undefined")) *res = v.t == T_UNDEF;
    else if (IS("none")) *res = v.t == T_NONE;
    else if (IS("boolean")) *res = v.t == T_BOOL;
    else if (IS("true")) *res = v.t == T_BOOL && v.u.b;
    else if (IS("false")) *res = v.t == T_BOOL && !v.u.b;
    else if (IS("integer")) *res = v.t == T_INT;
    else if (IS("float")) *res = v.t == T_FLOAT;
    else if (IS("number")) *res = is_num(v);
    else if (IS("string")) *res = v.t == T_STR;
    else if (IS("mapping")) *res = v.t == T_DICT;
    else if (IS("sequence")) *res = v.t == T_STR || v.t == T_LIST || v.t == T_DICT || v.t == T_UNDEF;
    else if (IS("iterable")) *res = v.t == T_STR || v.t == T_LIST || v.t == T_DICT || v.t == T_UNDEF || v.t == T_LOOP;
    else if (IS("callable")) *res = v.t == T_FUNC || v.t == T_MACRO || v.t == T_METHOD || v.t == T_UNDEF;
    else if (IS("escaped")) *res = false;
    else if (IS("filter")) *res = v.t == T_STR && in_list(JINJA_FILTERS, v.u.s->s);
    else if (IS("test")) *res = v.t == T_STR && in_list(JINJA_TESTS, v.u.s->s);
    else if (IS("lower") || IS("upper")) {
        jv s;
        if (!to_str(j, v, &s)) return false;
        bool cased = false, all = true;
        for (size_t i = 0, l; i < s.u.s->len; i += l) {
            uint32_t c = u8dec(s.u.s->s + i, s.u.s->len - i, &l);
            if (!cp_cased(c)) continue;
            cased = true;
            if (IS("lower") ? !cp_is_lower(c) : !cp_is_upper(c)) all = false;
        }
        *res = cased && all;
        unref(s);
    } else if (IS("sameas")) {
        if (!x) { rterr(j, NULL, "sameas needs an argument"); return false; }
        *res = heap(v) || heap(*x) ? (v.t == x->t && v.u.p == x->u.p) : jv_eq(v, *x, 0) && v.t == x->t;
    } else if (IS("in")) {
        if (!x) { rterr(j, NULL, "in needs an argument"); return false; }
        return contains(j, *x, v, res);
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        jv two = mk_int(2), r;
        const jv *d = IS("divisibleby") ? x : &two;
        if (!d) { rterr(j, NULL, "divisibleby needs an argument"); return false; }
        if (!binop(j, OP_MOD, v, *d, &r)) return false;
        *res = IS("odd") ? jv_eq(r, mk_int(1), 0) : jv_eq(r, mk_int(0), 0);
        unref(r);
    } else {
        if (!x) { rterr(j, NULL, "the '%s' test needs an argument", name); return false; }
        if (IS("==") || IS("eq") || IS("equalto")) *res = jv_eq(v, *x, 0);
        else if (IS("!=") || IS("ne")) *res = !jv_eq(v, *x, 0);
        else {
            int c;
            const char *sym = (IS(">") || IS("gt") || IS("greaterthan")) ? ">" : (IS(">=") || IS("ge")) ? ">="
                              : (IS("<") || IS("lt") || IS("lessthan")) ? "<" : "<=";
            if (!jv_cmp(j, v, *x, sym, &c, 0)) return false;
            *res = c != 2 && (sym[0] == '>' ? (sym[1] ? c >= 0 : c > 0) : (sym[1] ? c <= 0 : c < 0));
        }
    }
#undef IS
    return true;
}

/* ------------------------------------------------------------------ methods */

static bool call_method(J *j, const jmethod *m, const jargs *a, jv *out) {
    *out = mk_undef();
    jv self = m->self;
    const char *mn = method_name(m->id);
    const jv *a0 = arg(a, 0, NULL), *a1 = arg(a, 1, NULL), *a2 = arg(a, 2, NULL);
    if (a->nkw && m->id != M_SPLIT && m->id != M_RSPLIT && m->id != M_SPLITLINES) {
        rterr(j, NULL, "%s() takes no keyword arguments", mn);
        return false;
    }
    if (self.t == T_STR) {
        const jstr *s = self.u.s;
        const jstr *t;
        switch (m->id) {
        case M_STRIP: return do_strip(j, s->s, s->len, a0, true, true, out);
        case M_LSTRIP: return do_strip(j, s->s, s->len, a0, true, false, out);
        case M_RSTRIP: return do_strip(j, s->s, s->len, a0, false, true, out);
        case M_SPLIT: case M_RSPLIT: {
            static const char *const kw[] = {"sep", "maxsplit", NULL};
            if (!check_args(j, a, 2, kw, mn)) return false;
            int64_t ms;
            if (!int_arg(j, arg(a, 1, "maxsplit"), -1, "maxsplit", &ms)) return false;
            return do_split(j, s, arg(a, 0, "sep"), ms, m->id == M_RSPLIT, out);
        }
        case M_STARTSWITH: case M_ENDSWITH: {
            if (!a0) { rterr(j, NULL, "%s() takes at least 1 argument", mn); return false; }
            const jv *cands = a0->t == T_LIST && a0->u.l->tuple ? a0->u.l->v : a0;
            size_t nc = a0->t == T_LIST && a0->u.l->tuple ? a0->u.l->n : 1;
            bool r = false;
            for (size_t i = 0; i < nc && !r; i++) {
                if (cands[i].t != T_STR) {
                    rterr(j, NULL, "%s first arg must be str or a tuple of str, not %s", mn, type_name(cands[i]));
                    return false;
                }
                const jstr *p = cands[i].u.s;
                r = p->len <= s->len &&
                    memcmp(m->id == M_STARTSWITH ? s->s : s->s + s->len - p->len, p->s, p->len) == 0;
            }
            *out = mk_bool(r);
            return true;
        }
        case M_UPPER: return map_case(j, s->s, s->len, CASE_UPPER, out);
        case M_LOWER: return map_case(j, s->s, s->len, CASE_LOWER, out);
        case M_TITLE: return map_case(j, s->s, s->len, CASE_TITLE, out);
        case M_CAPITALIZE: return map_case(j, s->s, s->len, CASE_CAPITALIZE, out);
        case M_SWAPCASE: return map_case(j, s->s, s->len, CASE_SWAP, out);
        case M_REPLACE: {
            const jstr *o, *n;
            int64_t cnt;
            if (!str_arg(j, a0, "replace() old", &o) || !str_arg(j, a1, "replace() new", &n) ||
                !int_arg(j, a2, -1, "count", &cnt))
                return false;
            return do_replace(j, s, o, n, cnt, out);
        }
        case M_FIND: case M_RFIND: case M_INDEX: case M_RINDEX: case M_SCOUNT: {
            if (!str_arg(j, a0, "substring", &t) || !charge(j, s->len / 64)) return false;
            if (m->id == M_SCOUNT) {
                int64_t c = 0;
                if (t->len == 0) c = (int64_t)u8len(s->s, s->len) + 1;
                else
                    for (const char *f = s->s; (f = find_bytes(f, s->len - (size_t)(f - s->s), t->s, t->len)) != NULL;
                         f += t->len)
                        c++;
                *out = mk_int(c);
                return true;
            }
            bool rev = m->id == M_RFIND || m->id == M_RINDEX;
            const char *f = rev ? rfind_bytes(s->s, s->len, t->s, t->len) : find_bytes(s->s, s->len, t->s, t->len);
            if (!f && (m->id == M_INDEX || m->id == M_RINDEX)) { rterr(j, NULL, "substring not found"); return false; }
            *out = mk_int(f ? (int64_t)u8len(s->s, (size_t)(f - s->s)) : -1);
            return true;
        }
        case M_JOIN: {
            if (!a0) { rterr(j, NULL, "join() takes exactly one argument"); return false; }
            jlist *items;
            if (!iter_list(j, *a0, &items)) return false;
            jbuf b = {0};
            bool ok = true;
            for (size_t i = 0; ok && i < items->n; i++) {
                if (items->v[i].t != T_STR) {
                    rterr(j, NULL, "sequence item %zu: expected str instance, %s found", i, type_name(items->v[i]));
                    ok = false;
                    break;
                }
                if (i) ok = bput(j, &b, s->s, s->len);
                if (ok) ok = bput(j, &b, items->v[i].u.s->s, items->v[i].u.s->len);
            }
            unref(list_val(items));
            if (!ok) { bfree(&b); return false; }
            return buf_to_str(j, &b, out);
        }
        case M_SPLITLINES: {
            const jv *ke = arg(a, 0, "keepends");
            bool keep = ke && truthy(*ke);
            jlist *l = list_new(j, 0);
            if (!l) return false;
            *out = list_val(l);
            size_t i = 0, n = s->len;
            while (i < n) {
                size_t e = i, brk = 0, k = 0;
                while (e < n) {
                    uint32_t c = u8dec(s->s + e, n - e, &k);
                    if (c == '\n' || c == '\r' || c == 11 || c == 12 || (c >= 0x1C && c <= 0x1E) || c == 0x85 ||
                        c == 0x2028 || c == 0x2029) {
                        brk = (c == '\r' && e + 1 < n && s->s[e + 1] == '\n') ? 2 : k;
                        break;
                    }
                    e += k;
                }
                if (!push_str(j, l, s->s + i, (e - i) + (keep ? brk : 0))) { unref(*out); *out = mk_undef(); return false; }
                i = e + brk;
                if (!brk) break;
            }
            return true;
        }
        case M_ISDIGIT: case M_ISALPHA: case M_ISALNUM: case M_ISSPACE: case M_ISLOWER: case M_ISUPPER: {
            bool r = s->len > 0, cased = false;
            for (size_t i = 0, l; i < s->len; i += l) {
                uint32_t c = u8dec(s->s + i, s->len - i, &l);
                switch (m->id) {
                case M_ISDIGIT: r = r && cp_digit(c); break;
                case M_ISALPHA: r = r && cp_alpha(c); break;
                case M_ISALNUM: r = r && (cp_alpha(c) || cp_digit(c)); break;
                case M_ISSPACE: r = r && py_space(c); break;
                case M_ISLOWER: if (cp_cased(c)) { cased = true; r = r && cp_is_lower(c); } break;
                default: if (cp_cased(c)) { cased = true; r = r && cp_is_upper(c); } break;
                }
            }
            if (m->id == M_ISLOWER || m->id == M_ISUPPER) r = r && cased;
            *out = mk_bool(r);
            return true;
        }
        case M_CENTER: case M_LJUST: case M_RJUST: case M_ZFILL: {
            int64_t w;
            if (!a0 || !int_arg(j, a0, 0, "width", &w)) { if (!a0) rterr(j, NULL, "%s() takes a width", mn); return false; }
            if (m->id == M_ZFILL) {
                int64_t len = (int64_t)u8len(s->s, s->len);
                if (w <= len) { *out = ref(self); return true; }
                if (w > (int64_t)MAX_STR_BYTES) { rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES); return false; }
                jbuf b = {0};
                size_t sg = s->len && (s->s[0] == '+' || s->s[0] == '-') ? 1 : 0;
                bool ok = bput(j, &b, s->s, sg);
                for (int64_t k = len; ok && k < w; k++) ok = bputc(j, &b, '0');
                if (ok) ok = bput(j, &b, s->s + sg, s->len - sg);
                if (!ok) { bfree(&b); return false; }
                return buf_to_str(j, &b, out);
            }
            const char *fill = " ";
            if (a1) {
                if (a1->t != T_STR || u8len(a1->u.s->s, a1->u.s->len) != 1) {
                    rterr(j, NULL, "the fill character must be exactly one character long");
                    return false;
                }
                fill = a1->u.s->s;
            }
            return pad_str(j, s->s, s->len, w, m->id == M_CENTER ? '^' : m->id == M_LJUST ? '<' : '>', fill, out);
        }
        case M_PARTITION: case M_RPARTITION: {
            if (!str_arg(j, a0, "separator", &t)) return false;
            if (!t->len) { rterr(j, NULL, "empty separator"); return false; }
            bool rev = m->id == M_RPARTITION;
            const char *f = rev ? rfind_bytes(s->s, s->len, t->s, t->len) : find_bytes(s->s, s->len, t->s, t->len);
            jlist *l = list_new(j, 3);
            if (!l) return false;
            l->tuple = true;
            *out = list_val(l);
            bool ok;
            if (!f) ok = rev ? push_str(j, l, "", 0) && push_str(j, l, "", 0) && push_str(j, l, s->s, s->len)
                             : push_str(j, l, s->s, s->len) && push_str(j, l, "", 0) && push_str(j, l, "", 0);
            else ok = push_str(j, l, s->s, (size_t)(f - s->s)) && push_str(j, l, t->s, t->len) &&
                      push_str(j, l, f + t->len, s->len - (size_t)(f - s->s) - t->len);
            if (!ok) { unref(*out); *out = mk_undef(); }
            return ok;
        }
        default: break;
        }
    } else if (self.t == T_DICT) {
        const jdict *d = self.u.d;
        if (m->id == M_GET) {
            if (!a0 || a->npos > 2) { rterr(j, NULL, "get expected 1 or 2 arguments"); return false; }
            size_t i = dict_find(d, *a0);
            *out = i != SIZE_MAX ? ref(d->e[i].v) : a1 ? ref(*a1) : mk_none();
            return true;
        }
        if (a->npos) { rterr(j, NULL, "%s() takes no arguments", mn); return false; }
        if (m->id == M_ITEMS) return f_items(j, self, out);
        jlist *l = list_new(j, d->n);
        if (!l) return false;
        *out = list_val(l);
        for (size_t i = 0; i < d->n; i++)
            if (!list_push(j, l, ref(m->id == M_KEYS ? d->e[i].k : d->e[i].v))) { unref(*out); *out = mk_undef(); return false; }
        return true;
    } else if (self.t == T_LIST) {
        if (!a0) { rterr(j, NULL, "%s() takes exactly one argument", mn); return false; }
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (jv_eq(self.u.l->v[i], *a0, 0)) {
                if (m->id == M_LINDEX) { *out = mk_int((int64_t)i); return true; }
                c++;
            }
        if (m->id == M_LINDEX) { rterr(j, NULL, "value is not in list"); return false; }
        *out = mk_int(c);
        return true;
    } else if (self.t == T_LOOP) {
        if (!a->npos) { rterr(j, NULL, "no items for cycling given"); return false; }
        *out = ref(a->pos[self.u.lp->i % (int64_t)a->npos]);
        return true;
    }
    rterr(j, NULL, "unsupported method %s", mn);
    return false;
}

/* ------------------------------------------------------------------ statements */

/* Binds a loop or set target; several names unpack a sequence of exactly that length. */
static bool bind_targets(J *j, scope *s, const node *st, jv item) {
    if (st->nnames == 1) return scope_set(j, s, st->names[0], ref(item));
    jlist *parts;
    if (item.t == T_UNDEF || item.t == T_NONE || is_num(item)) {
        rterr(j, st, "cannot unpack non-iterable %s object", type_name(item));
        return false;
    }
    if (!iter_list(j, item, &parts)) return false;
    bool ok = parts->n == st->nnames;
    if (!ok) {
        if (parts->n > st->nnames) rterr(j, st, "too many values to unpack (expected %u)", st->nnames);
        else rterr(j, st, "not enough values to unpack (expected %u, got %zu)", st->nnames, parts->n);
    }
    for (uint32_t i = 0; ok && i < st->nnames; i++) ok = scope_set(j, s, st->names[i], ref(parts->v[i]));
    unref(list_val(parts));
    return ok;
}

static xres exec_for(J *j, const node *s, scope *sc, jbuf *out) {
    jv it;
    if (!eval(j, s->a, sc, &it)) return X_ERR;
    j->at = s;
    jlist *items;
    bool ok = iter_list(j, it, &items);
    unref(it);
    if (!ok) return X_ERR;
    if (s->b) {
        /* `for x in xs if cond`: filtered first, so loop.length and loop.last see the result */
        jlist *kept = list_new(j, 0);
        ok = kept != NULL;
        for (size_t i = 0; ok && i < items->n; i++) {
            scope *ts = scope_new(j, sc);
            jv c = mk_undef();
            ok = ts && bind_targets(j, ts, s, items->v[i]) && eval(j, s->b, ts, &c);
            scope_free(ts);
            if (ok && truthy(c)) ok = list_push(j, kept, ref(items->v[i]));
            unref(c);
        }
        unref(list_val(items));
        if (!ok) { if (kept) unref(list_val(kept)); return X_ERR; }
        items = kept;
    }
    jloop *lp = jmalloc(j, sizeof *lp);
    if (!lp) { unref(list_val(items)); return X_ERR; }
    lp->rc = 1;
    lp->i = 0;
    lp->n = (int64_t)items->n;
    lp->items = items;
    jv loopv = {T_LOOP, {.lp = lp}};
    xres r = X_OK;
    for (size_t i = 0; i < items->n; i++) {
        lp->i = (int64_t)i;
        /* a fresh frame per iteration: a `set` in the body never survives to the next one */
        scope *is = scope_new(j, sc);
        if (!is || !bind_targets(j, is, s, items->v[i]) || !scope_set(j, is, "loop", ref(loopv))) {
            scope_free(is);
            r = X_ERR;
            break;
        }
        r = exec(j, s->c, is, out);
        scope_free(is);
        if (r == X_ERR) break;
        if (r == X_BREAK) { r = X_OK; break; }
        r = X_OK;
    }
    if (r == X_OK && items->n == 0 && s->d) r = exec(j, s->d, sc, out);
    unref(loopv);
    return r;
}

static bool new_macro(J *j, const node *def, scope *sc, jv *out) {
    jmacro *m = jmalloc(j, sizeof *m);
    if (!m) return false;
    m->rc = 1;
    m->def = def;
    m->closure = sc;
    capture(j, sc);
    out->t = T_MACRO;
    out->u.m = m;
    return true;
}

/* Renders a body into a new string. */
static bool render_to_str(J *j, const node *body, scope *sc, jv *out) {
    jbuf b = {0};
    if (exec(j, body, sc, &b) != X_OK) { bfree(&b); return false; }
    return buf_to_str(j, &b, out);
}

/* Applies a filter chain whose innermost operand is E_PLACEHOLDER to `v` (consumed). */
static bool apply_chain(J *j, const node *chain, scope *sc, jv v, jv *out) {
    jv saved = j->placeholder;
    j->placeholder = v;
    bool ok = eval(j, chain, sc, out);
    j->placeholder = saved;
    unref(v);
    return ok;
}

static xres exec_inner(J *j, const node *s, scope *sc, jbuf *out) {
    jv v = mk_undef(), w;
    bool ok;
    switch (s->kind) {
    case S_BODY:
        for (uint32_t i = 0; i < s->nkids; i++) {
            xres r = exec(j, s->kids[i], sc, out);
            if (r != X_OK) return r;
        }
        return X_OK;
    case S_TEXT: return bput(j, out, s->name, s->name_len) ? X_OK : X_ERR;
    case S_OUT:
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        ok = put_value(j, out, v, false, 0);
        unref(v);
        return ok ? X_OK : X_ERR;
    case S_IF:
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        ok = truthy(v);
        unref(v);
        if (ok) return exec(j, s->b, sc, out);
        return s->c ? exec(j, s->c, sc, out) : X_OK;
    case S_FOR: return exec_for(j, s, sc, out);
    case S_SET:
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        j->at = s;
        ok = bind_targets(j, sc, s, v);
        unref(v);
        return ok ? X_OK : X_ERR;
    case S_SETATTR: {
        jv *ns = scope_lookup(sc, s->name);
        if (!ns || ns->t != T_NS) {
            rterr(j, s, "cannot assign attribute on non-namespace object ('%s' is %s)", s->name,
                  ns ? type_name(*ns) : "undefined");
            return X_ERR;
        }
        jdict *d = ns->u.d; /* namespaces live until the end of the render */
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        return dict_set_cstr(j, d, s->names[0], v) ? X_OK : X_ERR;
    }
    case S_SETBLOCK:
        if (!render_to_str(j, s->b, sc, &v)) return X_ERR;
        if (s->c) {
            if (!apply_chain(j, s->c, sc, v, &w)) return X_ERR;
            v = w;
        }
        return scope_set(j, sc, s->names[0], v) ? X_OK : X_ERR;
    case S_MACRO:
        if (!new_macro(j, s, sc, &v)) return X_ERR;
        return scope_set(j, sc, s->name, v) ? X_OK : X_ERR;
    case S_CALLBLOCK: {
        jv caller;
        if (!new_macro(j, s, sc, &caller)) return X_ERR;
        ok = eval_call(j, s->a, sc, caller, &v);
        unref(caller);
        if (ok) ok = put_value(j, out, v, false, 0);
        unref(v);
        return ok ? X_OK : X_ERR;
    }
    case S_BREAK: return X_BREAK;
    case S_CONTINUE: return X_CONTINUE;
    case S_FILTERBLOCK:
        if (!render_to_str(j, s->b, sc, &v)) return X_ERR;
        if (!apply_chain(j, s->a, sc, v, &w)) return X_ERR;
        ok = put_value(j, out, w, false, 0);
        unref(w);
        return ok ? X_OK : X_ERR;
    case S_WITH: {
        scope *ws = scope_new(j, sc);
        if (!ws) return X_ERR;
        ok = true;
        for (uint32_t i = 0; ok && i < s->nnames; i++) {
            ok = eval(j, s->kids2[i], sc, &v);
            if (ok) ok = scope_set(j, ws, s->names[i], v);
        }
        xres r = ok ? exec(j, s->b, ws, out) : X_ERR;
        scope_free(ws);
        return r;
    }
    default:
        rterr(j, s, "internal error: not a statement");
        return X_ERR;
    }
}

static xres exec(J *j, const node *s, scope *sc, jbuf *out) {
    if (j->failed) return X_ERR;
    if (++j->steps > MAX_STEPS) {
        rterr(j, s, "template did not finish within %llu steps", (unsigned long long)MAX_STEPS);
        return X_ERR;
    }
    if (j->depth >= MAX_EVAL_DEPTH) {
        rterr(j, s, "template recursion deeper than %d levels", MAX_EVAL_DEPTH);
        return X_ERR;
    }
    j->depth++;
    const node *saved = j->at;
    j->at = s;
    xres r = exec_inner(j, s, sc, out);
    j->at = saved;
    j->depth--;
    if (j->failed) r = X_ERR;
    return r;
}

/* ------------------------------------------------------------------ public API */

static void cleanup(J *j) {
    /* Namespaces first (they may hold each other), then the captured frames, then the
     * namespaces' own blocks: after the first two steps nothing refers to them any more. */
    for (size_t i = 0; i < j->n_nss; i++) {
        jdict *d = j->nss[i];
        for (size_t k = 0; k < d->n; k++) { unref(d->e[k].k); unref(d->e[k].v); }
        d->n = 0;
    }
    for (scope *s = j->captured; s; s = s->next_captured) scope_clear(s);
    for (scope *s = j->captured; s;) {
        scope *n = s->next_captured;
        scope_release(s);
        s = n;
    }
    for (size_t i = 0; i < j->n_nss; i++) {
        jv v = {T_NS, {.d = j->nss[i]}};
        unref(v);
    }
    free(j->nss);
    free(j->toks);
    free(j->src);
    arena_free(j->arena);
}

static void set_err(quill_error *err, quill_status st, const char *msg) {
    if (!err) return;
    err->status = st;
    snprintf(err->message, sizeof err->message, "%s", msg);
}

static bool set_str(J *j, scope *g, const char *name, const char *s) {
    jv v;
    return mk_str(j, s ? s : "", &v) && scope_set(j, g, name, v);
}

/* ------------------------------------------------------------------ JSON input */

/* Messages and tools arrive as JSON (OpenAI's shapes) and reach the template as Jinja2 sees them
 * after json.loads: objects are dicts in key order, integers stay ints, numbers with a fraction
 * or exponent are floats, null is none. Strict RFC 8259; errors name the byte offset. */
typedef struct {
    J *j;
    const char *what;        /* "messages" or "tools" */
    const char *s, *p, *end;
    int depth;
} jsonr;

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

static int json_hex4(const char *p) {
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

static bool json_string(jsonr *r, jv *out) {
    r->p++; /* the opening quote */
    jbuf b = {0};
    while (r->p < r->end && *r->p != '"') {
        unsigned char c = (unsigned char)*r->p;
        if (c < 0x20) { bfree(&b); return json_err(r, "control character in a string"); }
        if (c != '\\') {
            if (!bput(r->j, &b, r->p, 1)) { bfree(&b); return false; }
            r->p++;
            continue;
        }
        if (r->end - r->p < 2) break;
        char e = r->p[1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (simple && e) {
            static const char map[] = "\"\\/\b\f\n\r\t";
            if (!bput(r->j, &b, &map[simple - "\"\\/bfnrt"], 1)) { bfree(&b); return false; }
            r->p += 2;
            continue;
        }
        if (e != 'u' || r->end - r->p < 6) { bfree(&b); return json_err(r, "bad escape in a string"); }
        int cp = json_hex4(r->p + 2);
        r->p += 6;
        if (cp < 0) { bfree(&b); return json_err(r, "bad \\u escape"); }
        if (cp >= 0xD800 && cp <= 0xDBFF && r->end - r->p >= 6 && r->p[0] == '\\' && r->p[1] == 'u') {
            int lo = json_hex4(r->p + 2);
            if (lo >= 0xDC00 && lo <= 0xDFFF) {
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                r->p += 6;
            }
        }
        if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD; /* a lone surrogate is not text */
        char u[4];
        size_t n = u8enc((uint32_t)cp, u);
        if (!bput(r->j, &b, u, n)) { bfree(&b); return false; }
    }
    if (r->p >= r->end) { bfree(&b); return json_err(r, "unterminated string"); }
    r->p++;
    return buf_to_str(r->j, &b, out);
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
    jlist *l = is_obj ? NULL : list_new(r->j, 4);
    jdict *d = is_obj ? dict_new(r->j) : NULL;
    if (!l && !d) return false;
    jv self = is_obj ? dict_val(d) : list_val(l);
    json_ws(r);
    bool first = true;
    while (r->p < r->end && *r->p != close) {
        if (!first) {
            if (*r->p != ',') { unref(self); return json_err(r, is_obj ? "expected ',' or '}'" : "expected ',' or ']'"); }
            r->p++;
            json_ws(r);
        }
        first = false;
        jv k = mk_undef(), v;
        if (is_obj) {
            if (r->p >= r->end || *r->p != '"') { unref(self); return json_err(r, "expected a string key"); }
            if (!json_string(r, &k)) { unref(self); return false; }
            json_ws(r);
            if (r->p >= r->end || *r->p != ':') { unref(k); unref(self); return json_err(r, "expected ':'"); }
            r->p++;
        }
        if (!json_value(r, &v)) { unref(k); unref(self); return false; }
        if (!(is_obj ? dict_set(r->j, d, k, v) : list_push(r->j, l, v))) { unref(self); return false; }
        json_ws(r);
    }
    if (r->p >= r->end) { unref(self); return json_err(r, is_obj ? "unterminated object" : "unterminated array"); }
    r->p++;
    r->depth--;
    *out = self;
    return true;
}

static bool json_value(jsonr *r, jv *out) {
    json_ws(r);
    if (r->p >= r->end) return json_err(r, "unexpected end");
    if (!charge(r->j, 1)) return false;
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
        unref(*out);
        *out = mk_undef();
        return json_err(&r, "text after the list");
    }
    return true;
}

quill_status quill_chat_render(const char *template_src, const quill_chat_message *msgs, size_t n_msgs,
                               const char *bos_token, const char *eos_token, bool add_generation_prompt,
                               char **out, quill_error *err) {
    if (out) *out = NULL;
    if (!template_src || !out || (n_msgs && !msgs)) {
        set_err(err, QUILL_E_ARG, "quill_chat_render: template, messages and out must not be NULL");
        return QUILL_E_ARG;
    }
    for (size_t i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content) {
            char m[128];
            snprintf(m, sizeof m, "quill_chat_render: message %zu has a NULL role or content", i);
            set_err(err, QUILL_E_ARG, m);
            return QUILL_E_ARG;
        }
    J j;
    memset(&j, 0, sizeof j);
    node *root = compile(&j, template_src);
    jbuf b = {0};
    if (root && !j.failed) {
        scope *g = scope_new(&j, NULL);
        if (g) {
            capture(&j, g);
            jlist *ml = list_new(&j, n_msgs);
            bool ok = ml != NULL;
            if (ok) ok = scope_set(&j, g, "messages", list_val(ml));
            for (size_t i = 0; ok && i < n_msgs; i++) {
                jdict *d = dict_new(&j);
                jv r, c;
                ok = d && list_push(&j, ml, dict_val(d)) && mk_str(&j, msgs[i].role, &r) &&
                     dict_set_cstr(&j, d, "role", r) && mk_str(&j, msgs[i].content, &c) &&
                     dict_set_cstr(&j, d, "content", c);
            }
            ok = ok && set_str(&j, g, "bos_token", bos_token) && set_str(&j, g, "eos_token", eos_token) &&
                 scope_set(&j, g, "add_generation_prompt", mk_bool(add_generation_prompt));
            if (ok) exec(&j, root, g, &b);
        }
    }
    if (!j.failed && !b.p) {
        b.p = malloc(1);
        if (b.p) b.p[0] = 0;
        else nomem(&j);
    }
    cleanup(&j);
    if (j.failed) {
        bfree(&b);
        set_err(err, j.status, j.msg);
        return j.status;
    }
    *out = b.p;
    return QUILL_OK;
}

quill_status quill_chat_render_json(const char *template_src, const char *messages_json, const char *tools_json,
                                    const char *bos_token, const char *eos_token, bool add_generation_prompt,
                                    char **out, quill_error *err) {
    if (out) *out = NULL;
    if (!template_src || !messages_json || !out) {
        set_err(err, QUILL_E_ARG, "quill_chat_render_json: template, messages and out must not be NULL");
        return QUILL_E_ARG;
    }
    J j;
    memset(&j, 0, sizeof j);
    jbuf b = {0};
    jv messages = mk_undef(), tools = mk_undef();
    /* The inputs are checked before the template, so a bad message is reported as such. */
    bool parsed = json_parse_list(&j, "messages", messages_json, &messages, true) &&
                  (!tools_json || json_parse_list(&j, "tools", tools_json, &tools, false));
    if (parsed && messages.t == T_DICT) {
        /* a request body: {"messages": [...], "tools": [...]} */
        jv body = messages;
        const jv *m = dict_get_str(body.u.d, "messages"), *t = dict_get_str(body.u.d, "tools");
        messages = m && m->t == T_LIST ? ref(*m) : mk_undef();
        if (t && t->t == T_LIST && tools.t == T_UNDEF) tools = ref(*t);
        unref(body);
        if (messages.t == T_UNDEF) {
            j.failed = true;
            j.status = QUILL_E_ARG;
            snprintf(j.msg, sizeof j.msg, "messages: an object must hold a \"messages\" list");
            parsed = false;
        }
    }
    if (parsed) {
        for (size_t i = 0; i < messages.u.l->n && !j.failed; i++) {
            jv m = messages.u.l->v[i];
            const jv *role = m.t == T_DICT ? dict_get_str(m.u.d, "role") : NULL;
            if (!role || role->t != T_STR) {
                j.failed = true;
                j.status = QUILL_E_ARG;
                snprintf(j.msg, sizeof j.msg, "messages: message %zu needs a string \"role\"", i);
            }
        }
        j.steps = 0;
        node *root = j.failed ? NULL : compile(&j, template_src);
        if (root && !j.failed) {
            scope *g = scope_new(&j, NULL);
            if (g) {
                capture(&j, g);
                bool ok = scope_set(&j, g, "messages", messages);
                messages = mk_undef();
                if (ok && tools.t != T_UNDEF) {
                    ok = scope_set(&j, g, "tools", tools);
                    tools = mk_undef();
                }
                ok = ok && set_str(&j, g, "bos_token", bos_token) && set_str(&j, g, "eos_token", eos_token) &&
                     scope_set(&j, g, "add_generation_prompt", mk_bool(add_generation_prompt));
                if (ok) exec(&j, root, g, &b);
            }
        }
    }
    unref(messages);
    unref(tools);
    if (!j.failed && !b.p) {
        b.p = malloc(1);
        if (b.p) b.p[0] = 0;
        else nomem(&j);
    }
    cleanup(&j);
    if (j.failed) {
        bfree(&b);
        set_err(err, j.status, j.msg);
        return j.status;
    }
    *out = b.p;
    return QUILL_OK;
}

quill_status quill_chat_check(const char *template_src, quill_error *err) {
    if (!template_src) {
        set_err(err, QUILL_E_ARG, "quill_chat_check: template must not be NULL");
        return QUILL_E_ARG;
    }
    J j;
    memset(&j, 0, sizeof j);
    compile(&j, template_src);
    cleanup(&j);
    if (j.failed) {
        set_err(err, j.status, j.msg);
        return j.status;
    }
    return QUILL_OK;
}

/* ------------------------------------------------------------------ built-in templates */

/* Verbatim from the models' tokenizer_config.json (the \\n are Jinja escapes in the template). */
static const struct { const char *name, *src; } BUILTINS[] = {
    /* ChatML (OpenHermes, Qwen, ...): transformers' former default_chat_template */
    {"chatml",
     "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
     "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
     "{% endif %}"},
    /* meta-llama/Llama-2-7b-chat-hf */
    {"llama2",
     "{% if messages[0]['role'] == 'system' %}{% set loop_messages = messages[1:] %}{% set system_message = "
     "messages[0]['content'] %}{% else %}{% set loop_messages = messages %}{% set system_message = false %}"
     "{% endif %}{% for message in loop_messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if loop.index0 == 0 and system_message != false %}{% set content = '<<SYS>>\\n' + system_message + "
     "'\\n<</SYS>>\\n\\n' + message['content'] %}{% else %}{% set content = message['content'] %}{% endif %}"
     "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content.strip() + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ ' '  + content.strip() + ' ' + eos_token }}{% endif %}"
     "{% endfor %}"},
    /* meta-llama/Meta-Llama-3-8B-Instruct */
    {"llama3",
     "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
     "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + "
     "'<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
     "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
     "{% endif %}"},
    /* HuggingFaceH4/zephyr-7b-beta (also TinyLlama-1.1B-Chat) */
    {"zephyr",
     "{% for message in messages %}\n{% if message['role'] == 'user' %}\n{{ '<|user|>\n' + message['content'] + "
     "eos_token }}\n{% elif message['role'] == 'system' %}\n{{ '<|system|>\n' + message['content'] + eos_token }}\n"
     "{% elif message['role'] == 'assistant' %}\n{{ '<|assistant|>\n'  + message['content'] + eos_token }}\n"
     "{% endif %}\n{% if loop.last and add_generation_prompt %}\n{{ '<|assistant|>' }}\n{% endif %}\n{% endfor %}"},
    /* mistralai/Mistral-7B-Instruct-v0.2 */
    {"mistral",
     "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
     "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}{% else %}"
     "{{ raise_exception('Only user and assistant roles are supported!') }}{% endif %}{% endfor %}"},
    /* google/gemma-2b-it */
    {"gemma",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}"
     "{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}"
     "{% endif %}{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}"
     "{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}"},
};

static const char *const BUILTIN_NAMES[] = {"chatml", "llama2", "llama3", "zephyr", "mistral", "gemma", NULL};

const char *quill_chat_builtin_template(const char *name) {
    if (!name) return NULL;
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (strcmp(BUILTINS[i].name, name) == 0) return BUILTINS[i].src;
    return NULL;
}

const char *const *quill_chat_builtin_names(void) { return BUILTIN_NAMES; }
