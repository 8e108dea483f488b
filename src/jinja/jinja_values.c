/* Chat-template engine, values: the arena, byte buffers, UTF-8, value lifetime and constructors, truth, equality,
 * Python number formatting. The bottom layer: it calls no other file of the engine. */
#include "jinja/jinja_internal.h"
#include "base/utf8.h"

void jj_jfail_v(J *j, quill_status st, int line, int col, const char *what, const char *fmt,
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
void jj_synerr(J *j, int line, int col, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    jj_jfail_v(j, QUILL_E_TEMPLATE, line, col, "syntax error", fmt, ap);
    va_end(ap);
}
void jj_rterr(J *j, const node *at, const char *fmt, ...) {
    if (!at) at = j->at;
    va_list ap;
    va_start(ap, fmt);
    jj_jfail_v(j, QUILL_E_TEMPLATE, at ? at->line : 0, at ? at->col : 0, "error", fmt, ap);
    va_end(ap);
}
bool jj_charge(J *j, uint64_t units) {
    j->steps += units;
    if (j->steps > MAX_STEPS && !j->failed) {
        jj_rterr(j, NULL, "template did not finish within %llu steps", (unsigned long long)MAX_STEPS);
        return false;
    }
    return !j->failed;
}
void jj_nomem(J *j) {
    if (j->failed) return;
    j->failed = true;
    j->status = QUILL_E_NOMEM;
    snprintf(j->msg, sizeof j->msg, "chat template: out of memory");
}
void *jj_jmalloc(J *j, size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) jj_nomem(j);
    return p;
}
bool jj_grow(J *j, void **arr, size_t *cap, size_t need, size_t elem) {
    if (need <= *cap) return true;
    if (need > MAX_ITEMS * 4) { jj_rterr(j, NULL, "too many items"); return false; }
    size_t nc = *cap ? *cap : 4;
    while (nc < need) nc *= 2;
    void *p = realloc(*arr, nc * elem);
    if (!p) { jj_nomem(j); return false; }
    *arr = p;
    *cap = nc;
    return true;
}
/* ------------------------------------------------------------------ arena (AST lifetime) */

void *jj_arena_alloc(J *j, size_t n) {
    n = (n + 15) & ~(size_t)15;
    ablock *b = j->arena;
    if (!b || b->cap - b->used < n) {
        size_t cap = n > 16384 ? n : 16384;
        size_t hdr = (sizeof(ablock) + 15) & ~(size_t)15;
        b = malloc(hdr + cap);
        if (!b) { jj_nomem(j); return NULL; }
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

char *jj_arena_strndup(J *j, const char *s, size_t n) {
    char *p = jj_arena_alloc(j, n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void jj_arena_free(ablock *b) {
    while (b) {
        ablock *n = b->next;
        free(b);
        b = n;
    }
}

/* ------------------------------------------------------------------ growable byte buffer */

bool jj_bput(J *j, jbuf *b, const void *s, size_t n) {
    if (n > MAX_STR_BYTES - b->n) {
        jj_rterr(j, NULL, "string or output larger than %zu bytes", MAX_STR_BYTES);
        return false;
    }
    if (b->n + n + 1 > b->cap) {
        size_t nc = b->cap ? b->cap : 64;
        while (nc < b->n + n + 1) nc *= 2;
        char *p = realloc(b->p, nc);
        if (!p) { jj_nomem(j); return false; }
        b->p = p;
        b->cap = nc;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
    return true;
}

bool jj_bputs(J *j, jbuf *b, const char *s) { return jj_bput(j, b, s, strlen(s)); }
bool jj_bputc(J *j, jbuf *b, char c) { return jj_bput(j, b, &c, 1); }

bool jj_bprintf(J *j, jbuf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof tmp) n = sizeof tmp - 1;
    return jj_bput(j, b, tmp, (size_t)n);
}

void jj_bfree(jbuf *b) {
    free(b->p);
    b->p = NULL;
    b->n = b->cap = 0;
}

/* ------------------------------------------------------------------ UTF-8 and Unicode helpers */

/* Bytes that are not valid UTF-8 decode to 0x110000 + byte, so that a string transformed code
 * point by code point is written back byte for byte. */



size_t jj_u8enc(uint32_t cp, char *o) {
    if (cp >= CP_BAD) { o[0] = (char)(cp - CP_BAD); return 1; }
    return utf8_encode(cp, o);
}

size_t jj_u8len(const char *s, size_t n) {
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
bool jj_py_space(uint32_t c) {
    if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
    return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
           c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Length of the Python whitespace at s[0..n), or 0. */
size_t jj_space_at(const char *s, size_t n) {
    size_t l;
    uint32_t c = u8dec(s, n, &l);
    return jj_py_space(c) ? l : 0;
}

/* Offset where trailing Python whitespace of s[0..n) begins. */
size_t jj_rstrip_ws(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && u8cont((unsigned char)s[st]) && end - st < 4) st--;
        size_t l;
        uint32_t c = u8dec(s + st, end - st, &l);
        if (st + l != end) { st = end - 1; c = CP_BAD; }
        if (!jj_py_space(c)) break;
        end = st;
    }
    return end;
}

/* Simple case mapping for the scripts chat text commonly uses (ASCII, Latin-1, Latin Extended-A
 * and Additional, Greek, Cyrillic, Armenian, fullwidth). Python's full mapping also changes a few
 * characters into several (ß -> SS); those stay unchanged here. */
uint32_t jj_cp_upper(uint32_t c) {
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

uint32_t jj_cp_lower(uint32_t c) {
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

bool jj_cp_cased(uint32_t c) {
    return jj_cp_upper(c) != c || jj_cp_lower(c) != c || c == 0xDF || c == 0x138 || c == 0x149;
}
bool jj_cp_is_lower(uint32_t c) { return jj_cp_upper(c) != c || c == 0xDF || c == 0x138 || c == 0x149; }
bool jj_cp_is_upper(uint32_t c) { return jj_cp_lower(c) != c; }
bool jj_cp_alpha(uint32_t c) {
    if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
    return c < CP_BAD && (jj_cp_cased(c) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3040 && c <= 0x30FF) ||
                          (c >= 0xAC00 && c <= 0xD7A3) || (c >= 0x0600 && c <= 0x06FF) ||
                          (c >= 0x0900 && c <= 0x0DFF) || (c >= 0x0E00 && c <= 0x0E7F) ||
                          (c >= 0x05D0 && c <= 0x05EA) || c == 0xAA || c == 0xBA);
}
bool jj_cp_digit(uint32_t c) { return c >= '0' && c <= '9'; }

/* ------------------------------------------------------------------ value lifetime */





static void free_dict(jdict *d) {
    for (size_t i = 0; i < d->n; i++) { jj_unref(d->e[i].k); jj_unref(d->e[i].v); }
    free(d->e);
    free(d);
}

void jj_unref(jv v) {
    if (!heap(v)) return;
    int32_t *rc = v.u.p;
    if (*rc < 0 || --*rc > 0) return;
    switch (v.t) {
    case T_LIST:
        for (size_t i = 0; i < v.u.l->n; i++) jj_unref(v.u.l->v[i]);
        free(v.u.l->v);
        free(v.u.l);
        break;
    case T_DICT: case T_NS: free_dict(v.u.d); break;
    case T_LOOP:
        if (v.u.lp->items) { jv l = {T_LIST, {.l = v.u.lp->items}}; jj_unref(l); }
        free(v.u.lp);
        break;
    case T_METHOD: jj_unref(v.u.me->self); free(v.u.me); break;
    default: free(v.u.p); break; /* strings, undefined hints, macros */
    }
}

/* ------------------------------------------------------------------ constructors */

static jstr *str_alloc(J *j, size_t n) {
    if (n > MAX_STR_BYTES) { jj_rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES); return NULL; }
    if (!jj_charge(j, n / 64)) return NULL;
    jstr *s = jj_jmalloc(j, sizeof(jstr) + n + 1);
    if (!s) return NULL;
    s->rc = 1;
    s->len = n;
    s->s[n] = 0;
    return s;
}

/* Returns false (with the error set) on failure; *out is then T_UNDEF. */
bool jj_mk_strn(J *j, const char *p, size_t n, jv *out) {
    *out = mk_undef();
    jstr *s = str_alloc(j, n);
    if (!s) return false;
    if (n) memcpy(s->s, p, n);
    out->t = T_STR;
    out->u.s = s;
    return true;
}

bool jj_mk_str(J *j, const char *p, jv *out) { return jj_mk_strn(j, p, strlen(p), out); }

/* Moves a buffer's bytes into a string value and empties the buffer. */
bool jj_buf_to_str(J *j, jbuf *b, jv *out) {
    bool ok = jj_mk_strn(j, b->p ? b->p : "", b->n, out);
    jj_bfree(b);
    return ok;
}

jlist *jj_list_new(J *j, size_t cap) {
    if (cap > MAX_ITEMS) { jj_rterr(j, NULL, "list longer than %zu items", MAX_ITEMS); return NULL; }
    jlist *l = jj_jmalloc(j, sizeof *l);
    if (!l) return NULL;
    memset(l, 0, sizeof *l);
    l->rc = 1;
    if (cap) {
        l->v = jj_jmalloc(j, cap * sizeof(jv));
        if (!l->v) { free(l); return NULL; }
        l->cap = cap;
    }
    return l;
}


uint16_t jj_nest_of(jv v) {
    if (v.t == T_LIST) return v.u.l->nest;
    if (v.t == T_DICT) return v.u.d->nest;
    return 0;
}

/* Appends, taking ownership of v (released on failure). Nesting is tracked at construction so
 * that every recursive walk over values (printing, tojson, equality, freeing) is bounded. */
bool jj_list_push(J *j, jlist *l, jv v) {
    uint16_t nn = jj_nest_of(v) + 1;
    if (nn > MAX_NEST) { jj_unref(v); jj_rterr(j, NULL, "values nested deeper than %d levels", MAX_NEST); return false; }
    if (l->n >= MAX_ITEMS) { jj_unref(v); jj_rterr(j, NULL, "list longer than %zu items", MAX_ITEMS); return false; }
    if (!jj_charge(j, 1)) { jj_unref(v); return false; }
    if (!jj_grow(j, (void **)&l->v, &l->cap, l->n + 1, sizeof(jv))) { jj_unref(v); return false; }
    l->v[l->n++] = v;
    if (nn > l->nest) l->nest = nn;
    return true;
}

jdict *jj_dict_new(J *j) {
    jdict *d = jj_jmalloc(j, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    d->rc = 1;
    return d;
}



size_t jj_dict_find(const jdict *d, jv key) {
    for (size_t i = 0; i < d->n; i++)
        if (jj_jv_eq(d->e[i].k, key, 0)) return i;
    return SIZE_MAX;
}

jv *jj_dict_get_str(const jdict *d, const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < d->n; i++)
        if (d->e[i].k.t == T_STR && d->e[i].k.u.s->len == n && memcmp(d->e[i].k.u.s->s, s, n) == 0)
            return &d->e[i].v;
    return NULL;
}

/* Inserts or replaces, taking ownership of k and v. */
bool jj_dict_set(J *j, jdict *d, jv k, jv v) {
    size_t i = jj_dict_find(d, k);
    if (i != SIZE_MAX) {
        jj_unref(k);
        jj_unref(d->e[i].v);
        d->e[i].v = v;
    } else {
        if (d->n >= MAX_ITEMS) { jj_unref(k); jj_unref(v); jj_rterr(j, NULL, "dict larger than %zu items", MAX_ITEMS); return false; }
        if (!jj_grow(j, (void **)&d->e, &d->cap, d->n + 1, sizeof(jkv))) { jj_unref(k); jj_unref(v); return false; }
        d->e[d->n].k = k;
        d->e[d->n].v = v;
        d->n++;
    }
    uint16_t nn = jj_nest_of(v) + 1;
    if (nn > MAX_NEST) { jj_rterr(j, NULL, "values nested deeper than %d levels", MAX_NEST); return false; }
    if (nn > d->nest) d->nest = nn;
    return true;
}

bool jj_dict_set_cstr(J *j, jdict *d, const char *key, jv v) {
    jv k;
    if (!jj_mk_str(j, key, &k)) { jj_unref(v); return false; }
    return jj_dict_set(j, d, k, v);
}

/* Namespaces are the only mutable containers, so the only way to build a reference cycle; the
 * context keeps each one alive until the end of the render and then empties them all. */
bool jj_ns_new(J *j, jv *out) {
    *out = mk_undef();
    jdict *d = jj_dict_new(j);
    if (!d) return false;
    if (!jj_grow(j, (void **)&j->nss, &j->cap_nss, j->n_nss + 1, sizeof(jdict *))) { free(d); return false; }
    d->rc = 2;
    j->nss[j->n_nss++] = d;
    out->t = T_NS;
    out->u.d = d;
    return true;
}

bool jj_mk_method(J *j, int id, jv self, jv *out) {
    *out = mk_undef();
    jmethod *m = jj_jmalloc(j, sizeof *m);
    if (!m) return false;
    m->rc = 1;
    m->id = id;
    m->self = ref(self);
    out->t = T_METHOD;
    out->u.me = m;
    return true;
}

/* An Undefined carrying Jinja's explanation, shown if something later uses it. */
jv jj_mk_undef_msg(J *j, const char *fmt, ...) {
    char m[300];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m, sizeof m, fmt, ap);
    va_end(ap);
    jv s;
    if (!jj_mk_str(j, m, &s)) return mk_undef();
    jv u = {T_UNDEF, {.s = s.u.s}};
    return u;
}

/* ------------------------------------------------------------------ type names and truth */

const char *jj_type_name(jv v) {
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
void jj_obj_type_repr(jv v, char *o, size_t cap) {
    if (v.t == T_NONE) snprintf(o, cap, "None");
    else snprintf(o, cap, "%s object", jj_type_name(v));
}

jv jj_undef_attr(J *j, jv obj, const char *name) {
    char t[64];
    jj_obj_type_repr(obj, t, sizeof t);
    return jj_mk_undef_msg(j, "'%s' has no attribute '%s'", t, name);
}

bool jj_truthy(jv v) {
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


/* The error for using an Undefined where Jinja raises UndefinedError. */
void jj_undef_err(J *j, const node *at, jv u) {
    if (u.u.s) jj_rterr(j, at, "%s", u.u.s->s);
    else jj_rterr(j, at, "value is undefined");
}

/* ------------------------------------------------------------------ equality and ordering */

bool jj_jv_eq(jv a, jv b, int depth) {
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
            if (!jj_jv_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) return false;
        return true;
    case T_DICT:
        if (a.u.d->n != b.u.d->n) return false;
        for (size_t i = 0; i < a.u.d->n; i++) {
            size_t k = jj_dict_find(b.u.d, a.u.d->e[i].k);
            if (k == SIZE_MAX || !jj_jv_eq(a.u.d->e[i].v, b.u.d->e[k].v, depth + 1)) return false;
        }
        return true;
    case T_METHOD: return a.u.me->id == b.u.me->id && jj_jv_eq(a.u.me->self, b.u.me->self, depth + 1);
    default: return a.u.p == b.u.p;
    }
}

/* Python ordering: numbers with numbers, strings with strings (code point order, which UTF-8
 * byte order preserves), sequences lexicographically; anything else is a TypeError. */
bool jj_jv_cmp(J *j, jv a, jv b, const char *opname, int *res, int depth) {
    if (a.t == T_UNDEF) { jj_undef_err(j, NULL, a); return false; }
    if (b.t == T_UNDEF) { jj_undef_err(j, NULL, b); return false; }
    if (depth > MAX_NEST + 8) { jj_rterr(j, NULL, "values nested too deeply to compare"); return false; }
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
            if (jj_jv_eq(a.u.l->v[i], b.u.l->v[i], depth + 1)) continue;
            return jj_jv_cmp(j, a.u.l->v[i], b.u.l->v[i], opname, res, depth + 1);
        }
        *res = (a.u.l->n > b.u.l->n) - (a.u.l->n < b.u.l->n);
        return true;
    }
    jj_rterr(j, NULL, "'%s' not supported between instances of '%s' and '%s'", opname, jj_type_name(a),
          jj_type_name(b));
    return false;
}

/* ------------------------------------------------------------------ Python number formatting */

static char locale_radix(void) {
    char t[8];
    snprintf(t, sizeof t, "%.1f", 1.5);
    return t[1];
}

/* snprintf of a double with the radix made '.' whatever the locale. */
void jj_fmt_c_double(char *o, size_t cap, const char *cfmt, int width, int prec, double x) {
    snprintf(o, cap, cfmt, width, prec, x);
    char r = locale_radix();
    if (r != '.')
        for (char *p = o; *p; p++)
            if (*p == r) *p = '.';
}


/* strtod that also accepts '.' when the C library runs under a locale with another radix. */
double jj_loc_strtod(const char *s, char **end) {
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
void jj_fmt_float(double x, char *out, size_t cap) {
    if (x != x) { snprintf(out, cap, "nan"); return; }
    if (isinf(x)) { snprintf(out, cap, x < 0 ? "-inf" : "inf"); return; }
    if (x == 0) { snprintf(out, cap, signbit(x) ? "-0.0" : "0.0"); return; }
    char tmp[64];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec - 1, x);
        char *end;
        if (jj_loc_strtod(tmp, &end) == x) break;
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
    if (!jj_bputc(j, b, q)) return false;
    for (size_t i = 0; i < n;) {
        size_t l;
        uint32_t c = u8dec(s + i, n - i, &l);
        bool ok;
        if (c == (uint32_t)q || c == '\\') { char e[2] = {'\\', (char)c}; ok = jj_bput(j, b, e, 2); }
        else if (c == '\n') ok = jj_bput(j, b, "\\n", 2);
        else if (c == '\r') ok = jj_bput(j, b, "\\r", 2);
        else if (c == '\t') ok = jj_bput(j, b, "\\t", 2);
        else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD) ok = jj_bprintf(j, b, "\\x%02x", c);
        else if (c >= CP_BAD) ok = jj_bprintf(j, b, "\\udc%02x", c - CP_BAD);
        else if (c == 0x2028 || c == 0x2029) ok = jj_bprintf(j, b, "\\u%04x", c);
        else ok = jj_bput(j, b, s + i, l);
        if (!ok) return false;
        i += l;
    }
    return jj_bputc(j, b, q);
}

/* str(v) (repr=false) or repr(v) (repr=true), as Python prints them. */
bool jj_put_value(J *j, jbuf *b, jv v, bool repr, int depth) {
    if (depth > MAX_NEST + 8) { jj_rterr(j, NULL, "value nested too deeply to print"); return false; }
    char tmp[64];
    switch (v.t) {
    case T_UNDEF: return repr ? jj_bputs(j, b, "Undefined") : true;
    case T_NONE: return jj_bputs(j, b, "None");
    case T_BOOL: return jj_bputs(j, b, v.u.b ? "True" : "False");
    case T_INT: return jj_bprintf(j, b, "%lld", (long long)v.u.i);
    case T_FLOAT: jj_fmt_float(v.u.f, tmp, sizeof tmp); return jj_bputs(j, b, tmp);
    case T_STR:
        return repr ? put_repr_str(j, b, v.u.s->s, v.u.s->len) : jj_bput(j, b, v.u.s->s, v.u.s->len);
    case T_LIST: {
        jlist *l = v.u.l;
        if (!jj_charge(j, l->n) || !jj_bputc(j, b, l->tuple ? '(' : '[')) return false;
        for (size_t i = 0; i < l->n; i++) {
            if (i && !jj_bput(j, b, ", ", 2)) return false;
            if (!jj_put_value(j, b, l->v[i], true, depth + 1)) return false;
        }
        if (l->tuple && l->n == 1 && !jj_bputc(j, b, ',')) return false;
        return jj_bputc(j, b, l->tuple ? ')' : ']');
    }
    case T_DICT: case T_NS: {
        jdict *d = v.u.d;
        if (!jj_charge(j, d->n)) return false;
        if (v.t == T_NS && !jj_bputs(j, b, "<Namespace ")) return false;
        if (!jj_bputc(j, b, '{')) return false;
        for (size_t i = 0; i < d->n; i++) {
            if (i && !jj_bput(j, b, ", ", 2)) return false;
            if (!jj_put_value(j, b, d->e[i].k, true, depth + 1) || !jj_bput(j, b, ": ", 2) ||
                !jj_put_value(j, b, d->e[i].v, true, depth + 1))
                return false;
        }
        if (!jj_bputc(j, b, '}')) return false;
        return v.t == T_NS ? jj_bputc(j, b, '>') : true;
    }
    case T_MACRO: return jj_bprintf(j, b, "<Macro '%s'>", v.u.m->def->name ? v.u.m->def->name : "caller");
    case T_LOOP: return jj_bprintf(j, b, "<LoopContext %lld/%lld>", (long long)v.u.lp->i + 1, (long long)v.u.lp->n);
    default: return jj_bputs(j, b, "<built-in function>");
    }
}

/* str(v) as a new string value (a string is returned as is). */
bool jj_to_str(J *j, jv v, jv *out) {
    if (v.t == T_STR) { *out = ref(v); return true; }
    jbuf b = {0};
    if (!jj_put_value(j, &b, v, false, 0)) { jj_bfree(&b); *out = mk_undef(); return false; }
    return jj_buf_to_str(j, &b, out);
}
