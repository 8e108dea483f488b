/* Private to src/jinja: the values, AST and render context shared by the engine's files (see
 * jinja_eval.c for the design). Not installed. The files are layers, each calling only those below:
 *   jinja.c           the entry points (quill_chat_render*, quill_chat_check) and JSON input
 *   jinja_eval.c      the evaluator: scopes, expressions, statements, macros
 *   jinja_builtins.c  filters, tests, methods, tojson, sorting
 *   jinja_ops.c       operations on values: attributes, items, slices, iteration, operators, str % args
 *   jinja_parse.c     lexer and parser (and the name lists of filters and tests)
 *   jinja_values.c    arena, buffers, UTF-8, values, truth, equality, number formatting */
#ifndef QUILL_JINJA_INTERNAL_H
#define QUILL_JINJA_INTERNAL_H

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
    bool has_now;            /* strftime_now() is defined, formatting `now` (seconds, UTC) */
    int64_t now;
    /* error */
    bool failed;
    quill_status status;
    char msg[700];
} J;


/* Syntax errors, reported at a token or node. */

/* Runtime errors at a node (NULL: the node being evaluated). */

/* Work that scales with data size counts against the step budget too (one step per 64 bytes
 * scanned or allocated, one per list element), so no template can loop over huge strings. */



/* Grows an array of `elem` bytes to hold at least `need` elements. */

#define CP_BAD 0x110000u
typedef struct {
    J *j;
    const char *what;        /* "messages" or "tools" */
    const char *s, *p, *end;
    int depth;
} jsonr;
typedef struct pvec { void **v; uint32_t n, cap; } pvec;
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
enum { F_NONE, F_RANGE, F_RAISE, F_NAMESPACE, F_DICT, F_STRFTIME_NOW };
typedef struct jargs {
    jv *pos;
    size_t npos;
    const char **kwn;
    jv *kwv;
    size_t nkw;
} jargs;
typedef enum { X_OK, X_ERR, X_BREAK, X_CONTINUE } xres;
enum { CASE_UPPER, CASE_LOWER, CASE_SWAP, CASE_TITLE, CASE_CAPITALIZE };
typedef struct jsonopt {
    bool ascii, sort, pretty;
    const char *ind, *isep, *ksep;
    size_t indn, isepn, ksepn;
} jsonopt;

/* ------------------------------------------------------------------ shared functions */

extern const char *const jj_JINJA_FILTERS[];
extern const char *const jj_JINJA_TESTS[];
void jj_jfail_v(J *j, quill_status st, int line, int col, const char *what, const char *fmt,
                    va_list ap);
void jj_synerr(J *j, int line, int col, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
void jj_synerr(J *j, int line, int col, const char *fmt, ...);
void jj_rterr(J *j, const node *at, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void jj_rterr(J *j, const node *at, const char *fmt, ...);
bool jj_charge(J *j, uint64_t units);
void jj_nomem(J *j);
void *jj_jmalloc(J *j, size_t n);
bool jj_grow(J *j, void **arr, size_t *cap, size_t need, size_t elem);
void *jj_arena_alloc(J *j, size_t n);
char *jj_arena_strndup(J *j, const char *s, size_t n);
void jj_arena_free(ablock *b);
bool jj_bput(J *j, jbuf *b, const void *s, size_t n);
bool jj_bputs(J *j, jbuf *b, const char *s);
bool jj_bputc(J *j, jbuf *b, char c);
bool jj_bprintf(J *j, jbuf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
bool jj_bprintf(J *j, jbuf *b, const char *fmt, ...);
void jj_bfree(jbuf *b);
size_t jj_u8enc(uint32_t cp, char *o);
size_t jj_u8len(const char *s, size_t n);
bool jj_py_space(uint32_t c);
size_t jj_space_at(const char *s, size_t n);
size_t jj_rstrip_ws(const char *s, size_t n);
uint32_t jj_cp_upper(uint32_t c);
uint32_t jj_cp_lower(uint32_t c);
bool jj_cp_cased(uint32_t c);
bool jj_cp_is_lower(uint32_t c);
bool jj_cp_is_upper(uint32_t c);
bool jj_cp_alpha(uint32_t c);
bool jj_cp_digit(uint32_t c);
void jj_unref(jv v);
bool jj_mk_strn(J *j, const char *p, size_t n, jv *out);
bool jj_mk_str(J *j, const char *p, jv *out);
bool jj_buf_to_str(J *j, jbuf *b, jv *out);
jlist *jj_list_new(J *j, size_t cap);
uint16_t jj_nest_of(jv v);
bool jj_list_push(J *j, jlist *l, jv v);
jdict *jj_dict_new(J *j);
size_t jj_dict_find(const jdict *d, jv key);
jv *jj_dict_get_str(const jdict *d, const char *s);
bool jj_dict_set(J *j, jdict *d, jv k, jv v);
bool jj_dict_set_cstr(J *j, jdict *d, const char *key, jv v);
bool jj_ns_new(J *j, jv *out);
bool jj_mk_method(J *j, int id, jv self, jv *out);
jv jj_mk_undef_msg(J *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
jv jj_mk_undef_msg(J *j, const char *fmt, ...);
const char *jj_type_name(jv v);
void jj_obj_type_repr(jv v, char *o, size_t cap);
jv jj_undef_attr(J *j, jv obj, const char *name);
bool jj_truthy(jv v);
void jj_undef_err(J *j, const node *at, jv u);
bool jj_jv_eq(jv a, jv b, int depth);
bool jj_jv_cmp(J *j, jv a, jv b, const char *opname, int *res, int depth);
double jj_loc_strtod(const char *s, char **end);
void jj_fmt_float(double x, char *out, size_t cap);
bool jj_put_value(J *j, jbuf *b, jv v, bool repr, int depth);
bool jj_to_str(J *j, jv v, jv *out);
/* snprintf of a double with the radix '.' whatever the locale */
void jj_fmt_c_double(char *o, size_t cap, const char *cfmt, int width, int prec, double x);
bool jj_is_digit(char c);
void jj_unexpected(J *j, const char *wanted);
bool jj_in_list(const char *const *l, const char *s);
node *jj_compile(J *j, const char *src);
scope *jj_scope_new(J *j, scope *parent);
void jj_capture(J *j, scope *s);
bool jj_scope_set(J *j, scope *s, const char *k, jv v);
/* jinja_ops.c: operations on values, shared by the evaluator and the filters */
int jj_method_id(jtype t, const char *name);
const char *jj_method_name(int id);
bool jj_get_attr(J *j, jv obj, const char *name, jv *out);
bool jj_get_item(J *j, jv obj, jv key, jv *out);
bool jj_slice(J *j, jv obj, jv start, jv stop, jv step, jv *out);
bool jj_iter_list(J *j, jv v, jlist **out);
bool jj_contains(J *j, jv container, jv item, bool *res);
bool jj_int_result(J *j, bool overflow, int64_t r, jv *out);
const char *jj_op_sym(int op);
bool jj_binop(J *j, int op, jv a, jv b, jv *out);
const jv *jj_arg(const jargs *a, size_t idx, const char *name);
bool jj_check_args(J *j, const jargs *a, size_t max_pos, const char *const *kw, const char *what);
const char *jj_find_bytes(const char *h, size_t hn, const char *nd, size_t nn);
const char *jj_rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn);
bool jj_py_format(J *j, const char *fmt, size_t n, jv args, bool args_is_tuple, jv *out);
/* jinja_eval.c */
xres jj_exec(J *j, const node *s, scope *sc, jbuf *out);
void jj_cleanup(J *j);
void jj_set_err(quill_error *err, quill_status st, const char *msg);
bool jj_set_str(J *j, scope *g, const char *name, const char *s);
bool jj_apply_filter(J *j, const char *name, jv v, const jargs *a, jv *out);
bool jj_run_test(J *j, const char *name, jv v, const jargs *a, bool *res);
bool jj_call_method(J *j, const jmethod *m, const jargs *a, jv *out);

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
static inline jv list_val(jlist *l) { jv v = {T_LIST, {.l = l}}; return v; }
static inline jv dict_val(jdict *d) { jv v = {T_DICT, {.d = d}}; return v; }
static inline bool is_num(jv v) { return v.t == T_INT || v.t == T_FLOAT || v.t == T_BOOL; }
static inline bool is_intlike(jv v) { return v.t == T_INT || v.t == T_BOOL; }
static inline int64_t as_int(jv v) { return v.t == T_BOOL ? (int64_t)v.u.b : v.u.i; }
static inline double as_dbl(jv v) { return v.t == T_FLOAT ? v.u.f : (double)as_int(v); }

#endif
