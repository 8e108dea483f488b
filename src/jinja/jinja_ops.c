/* Chat-template engine, operations on values that the evaluator and the filters share: methods by
 * name, attribute and item access (slices included), iteration and membership, arithmetic and
 * comparison operators, a callable's arguments, substring search and Python's str % args. Below the evaluator (jinja_eval.c) and the filters
 * (jinja_builtins.c), above the values (jinja_values.c): it calls neither of the first two. */
#include "jinja/jinja_internal.h"

/* ------------------------------------------------------------------ methods */


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

int jj_method_id(jtype t, const char *name) {
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (METHODS[i].type == t && strcmp(METHODS[i].name, name) == 0) return METHODS[i].id;
    return M_NONE;
}

const char *jj_method_name(int id) {
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
    return jj_in_list(t == T_LIST ? list_m : dict_m, name);
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
        *out = i > 0 ? ref(lp->items->v[i - 1]) : jj_mk_undef_msg(j, "there is no previous item");
    else if (strcmp(name, "nextitem") == 0)
        *out = i + 1 < n ? ref(lp->items->v[i + 1]) : jj_mk_undef_msg(j, "there is no next item");
    else if (strcmp(name, "cycle") == 0) return jj_mk_method(j, M_CYCLE, self, out);
    else *out = jj_undef_attr(j, self, name);
    return !j->failed;
}

/* obj.name: Python attributes (methods) first, then items, as Jinja's getattr does. */
bool jj_get_attr(J *j, jv obj, const char *name, jv *out) {
    *out = mk_undef();
    int mid;
    switch (obj.t) {
    case T_UNDEF: jj_undef_err(j, NULL, obj); return false;
    case T_DICT:
        if ((mid = jj_method_id(T_DICT, name))) return jj_mk_method(j, mid, obj, out);
        if (unsafe_method(T_DICT, name)) break;
        {
            jv *p = jj_dict_get_str(obj.u.d, name);
            *out = p ? ref(*p) : jj_undef_attr(j, obj, name);
        }
        return !j->failed;
    case T_NS: {
        jv *p = jj_dict_get_str(obj.u.d, name);
        *out = p ? ref(*p) : jj_undef_attr(j, obj, name);
        return !j->failed;
    }
    case T_STR: case T_LIST:
        if ((mid = jj_method_id(obj.t, name))) return jj_mk_method(j, mid, obj, out);
        if (unsafe_method(obj.t, name)) break;
        *out = jj_undef_attr(j, obj, name);
        return !j->failed;
    case T_LOOP: return loop_attr(j, obj.u.lp, name, obj, out);
    default:
        *out = jj_undef_attr(j, obj, name);
        return !j->failed;
    }
    *out = jj_mk_undef_msg(j, "access to attribute '%s' of '%s' object is unsafe.", name, jj_type_name(obj));
    return !j->failed;
}

/* Code point i of a string as a new string, or false when out of range. */
static bool str_char_at(J *j, const jstr *s, int64_t idx, jv *out, bool *found) {
    *found = false;
    if (!jj_charge(j, s->len / 64)) return false;
    size_t len = jj_u8len(s->s, s->len);
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
    return jj_mk_strn(j, s->s + off, l, out);
}

/* obj[key]: items first, then attributes for string keys, as Jinja's getitem does. */
bool jj_get_item(J *j, jv obj, jv key, jv *out) {
    *out = mk_undef();
    if (obj.t == T_UNDEF) { jj_undef_err(j, NULL, obj); return false; }
    if (obj.t == T_DICT) {
        size_t i = jj_dict_find(obj.u.d, key);
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
    if (key.t == T_STR && obj.t != T_LIST && obj.t != T_STR) return jj_get_attr(j, obj, key.u.s->s, out);
    if (key.t == T_STR && jj_method_id(obj.t, key.u.s->s)) return jj_get_attr(j, obj, key.u.s->s, out);
    char t[64];
    jj_obj_type_repr(obj, t, sizeof t);
    jbuf b = {0};
    if (!jj_put_value(j, &b, key, true, 0)) { jj_bfree(&b); return false; }
    if (key.t == T_STR) *out = jj_mk_undef_msg(j, "'%s' has no attribute %s", t, b.p);
    else *out = jj_mk_undef_msg(j, "%s has no element %s", t, b.p);
    jj_bfree(&b);
    return !j->failed;
}

/* Python slice semantics (negative indices, negative steps, clamping). */
bool jj_slice(J *j, jv obj, jv start, jv stop, jv step, jv *out) {
    *out = mk_undef();
    if (obj.t == T_UNDEF) { jj_undef_err(j, NULL, obj); return false; }
    jv parts[3] = {start, stop, step};
    for (int k = 0; k < 3; k++)
        if (parts[k].t != T_NONE && parts[k].t != T_UNDEF && !is_intlike(parts[k])) {
            jj_rterr(j, NULL, "slice indices must be integers or None");
            return false;
        }
    bool is_str = obj.t == T_STR;
    if (!is_str && obj.t != T_LIST) {
        char t[64];
        jj_obj_type_repr(obj, t, sizeof t);
        *out = jj_mk_undef_msg(j, "%s has no element slice", t);
        return !j->failed;
    }
    size_t *offs = NULL;
    int64_t len;
    if (!jj_charge(j, is_str ? obj.u.s->len / 64 : obj.u.l->n)) return false;
    if (is_str) {
        size_t ncp = jj_u8len(obj.u.s->s, obj.u.s->len);
        offs = jj_jmalloc(j, (ncp + 1) * sizeof(size_t));
        if (!offs) return false;
        size_t off = 0, k = 0, l;
        while (off < obj.u.s->len) { offs[k++] = off; u8dec(obj.u.s->s + off, obj.u.s->len - off, &l); off += l; }
        offs[k] = off;
        len = (int64_t)ncp;
    } else {
        len = (int64_t)obj.u.l->n;
    }
    int64_t st = is_intlike(step) ? as_int(step) : 1;
    if (st == 0) { free(offs); jj_rterr(j, NULL, "slice step cannot be zero"); return false; }
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
        if (st == 1) ok = a < b ? jj_bput(j, &buf, obj.u.s->s + offs[a], offs[b] - offs[a]) : true;
        else
            for (int64_t i = a; ok && (st > 0 ? i < b : i > b); i += st)
                ok = jj_bput(j, &buf, obj.u.s->s + offs[i], offs[i + 1] - offs[i]);
        free(offs);
        if (!ok) { jj_bfree(&buf); return false; }
        return jj_buf_to_str(j, &buf, out);
    }
    jlist *l = jj_list_new(j, 0);
    if (!l) return false;
    l->tuple = obj.u.l->tuple;
    for (int64_t i = a; ok && (st > 0 ? i < b : i > b); i += st) ok = jj_list_push(j, l, ref(obj.u.l->v[i]));
    *out = list_val(l);
    if (!ok) { jj_unref(*out); *out = mk_undef(); }
    return ok;
}

/* ------------------------------------------------------------------ iteration */

/* The items a for-loop or a filter iterates over, as a list (a new reference). */
bool jj_iter_list(J *j, jv v, jlist **out) {
    *out = NULL;
    switch (v.t) {
    case T_LIST: *out = ref(v).u.l; return true;
    case T_UNDEF: *out = jj_list_new(j, 0); return *out != NULL;
    case T_DICT: {
        jlist *l = jj_list_new(j, v.u.d->n);
        if (!l) return false;
        for (size_t i = 0; i < v.u.d->n; i++)
            if (!jj_list_push(j, l, ref(v.u.d->e[i].k))) { jj_unref(list_val(l)); return false; }
        *out = l;
        return true;
    }
    case T_STR: {
        jlist *l = jj_list_new(j, 0);
        if (!l) return false;
        for (size_t i = 0, k; i < v.u.s->len; i += k) {
            u8dec(v.u.s->s + i, v.u.s->len - i, &k);
            jv c;
            if (!jj_mk_strn(j, v.u.s->s + i, k, &c) || !jj_list_push(j, l, c)) { jj_unref(list_val(l)); return false; }
        }
        *out = l;
        return true;
    }
    case T_LOOP: *out = ref(list_val(v.u.lp->items)).u.l; return true;
    default:
        jj_rterr(j, NULL, "'%s' object is not iterable", jj_type_name(v));
        return false;
    }
}


bool jj_contains(J *j, jv container, jv item, bool *res) {
    *res = false;
    switch (container.t) {
    case T_STR:
        if (item.t != T_STR) {
            if (item.t == T_UNDEF) { jj_undef_err(j, NULL, item); return false; }
            jj_rterr(j, NULL, "'in <string>' requires string as left operand, not %s", jj_type_name(item));
            return false;
        }
        if (!jj_charge(j, container.u.s->len / 64)) return false;
        *res = jj_find_bytes(container.u.s->s, container.u.s->len, item.u.s->s, item.u.s->len) != NULL;
        return true;
    case T_LIST:
        if (!jj_charge(j, container.u.l->n)) return false;
        for (size_t i = 0; i < container.u.l->n; i++)
            if (jj_jv_eq(container.u.l->v[i], item, 0)) { *res = true; break; }
        return true;
    case T_DICT: *res = jj_dict_find(container.u.d, item) != SIZE_MAX; return true;
    case T_UNDEF: return true;
    default:
        jj_rterr(j, NULL, "argument of type '%s' is not iterable", jj_type_name(container));
        return false;
    }
}

/* ------------------------------------------------------------------ arithmetic */

bool jj_int_result(J *j, bool overflow, int64_t r, jv *out) {
    if (overflow) { jj_rterr(j, NULL, "integer overflow (quill's integers are 64-bit)"); return false; }
    *out = mk_int(r);
    return true;
}

static bool repeat(J *j, jv seq, int64_t times, jv *out) {
    if (times < 0) times = 0;
    if (seq.t == T_STR) {
        if (times && seq.u.s->len > MAX_STR_BYTES / (uint64_t)times) {
            jj_rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES);
            return false;
        }
        jbuf b = {0};
        for (int64_t i = 0; i < times; i++)
            if (!jj_bput(j, &b, seq.u.s->s, seq.u.s->len)) { jj_bfree(&b); return false; }
        return jj_buf_to_str(j, &b, out);
    }
    if (times && seq.u.l->n > MAX_ITEMS / (uint64_t)times) {
        jj_rterr(j, NULL, "list longer than %zu items", MAX_ITEMS);
        return false;
    }
    jlist *l = jj_list_new(j, 0);
    if (!l) return false;
    l->tuple = seq.u.l->tuple;
    *out = list_val(l);
    for (int64_t i = 0; i < times; i++)
        for (size_t k = 0; k < seq.u.l->n; k++)
            if (!jj_list_push(j, l, ref(seq.u.l->v[k]))) { jj_unref(*out); *out = mk_undef(); return false; }
    return true;
}


const char *jj_op_sym(int op) {
    switch (op) {
    case OP_ADD: return "+"; case OP_SUB: return "-"; case OP_MUL: return "*"; case OP_DIV: return "/";
    case OP_FLOORDIV: return "//"; case OP_MOD: return "%"; case OP_POW: return "**";
    case OP_LT: return "<"; case OP_LE: return "<="; case OP_GT: return ">"; case OP_GE: return ">=";
    default: return "?";
    }
}

bool jj_binop(J *j, int op, jv a, jv b, jv *out) {
    *out = mk_undef();
    if (a.t == T_UNDEF) { jj_undef_err(j, NULL, a); return false; }
    if (b.t == T_UNDEF) { jj_undef_err(j, NULL, b); return false; }
    if (is_intlike(a) && is_intlike(b)) {
        int64_t x = as_int(a), y = as_int(b), r = 0;
        switch (op) {
        case OP_ADD: { bool o = __builtin_add_overflow(x, y, &r); return jj_int_result(j, o, r, out); }
        case OP_SUB: { bool o = __builtin_sub_overflow(x, y, &r); return jj_int_result(j, o, r, out); }
        case OP_MUL: { bool o = __builtin_mul_overflow(x, y, &r); return jj_int_result(j, o, r, out); }
        case OP_DIV:
            if (y == 0) { jj_rterr(j, NULL, "division by zero"); return false; }
            *out = mk_float((double)x / (double)y);
            return true;
        case OP_FLOORDIV: case OP_MOD: {
            if (y == 0) { jj_rterr(j, NULL, "integer division or modulo by zero"); return false; }
            if (x == INT64_MIN && y == -1) return jj_int_result(j, op == OP_FLOORDIV, 0, out);
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
            return jj_int_result(j, ovf, acc, out);
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
            if (y == 0) { jj_rterr(j, NULL, "float division by zero"); return false; }
            *out = mk_float(x / y);
            return true;
        case OP_FLOORDIV: case OP_MOD: {
            if (y == 0) { jj_rterr(j, NULL, "float modulo"); return false; }
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
        if (!jj_bput(j, &s, a.u.s->s, a.u.s->len) || !jj_bput(j, &s, b.u.s->s, b.u.s->len)) { jj_bfree(&s); return false; }
        return jj_buf_to_str(j, &s, out);
    } else if (op == OP_ADD && a.t == T_LIST && b.t == T_LIST && a.u.l->tuple == b.u.l->tuple) {
        jlist *l = jj_list_new(j, a.u.l->n + b.u.l->n);
        if (!l) return false;
        l->tuple = a.u.l->tuple;
        *out = list_val(l);
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!jj_list_push(j, l, ref(a.u.l->v[i]))) { jj_unref(*out); *out = mk_undef(); return false; }
        for (size_t i = 0; i < b.u.l->n; i++)
            if (!jj_list_push(j, l, ref(b.u.l->v[i]))) { jj_unref(*out); *out = mk_undef(); return false; }
        return true;
    } else if (op == OP_MUL && (a.t == T_STR || a.t == T_LIST) && is_intlike(b)) {
        return repeat(j, a, as_int(b), out);
    } else if (op == OP_MUL && (b.t == T_STR || b.t == T_LIST) && is_intlike(a)) {
        return repeat(j, b, as_int(a), out);
    } else if (op == OP_MOD && a.t == T_STR) {
        return jj_py_format(j, a.u.s->s, a.u.s->len, b, b.t == T_LIST && b.u.l->tuple, out);
    }
    if (op == OP_ADD && a.t == T_STR)
        jj_rterr(j, NULL, "can only concatenate str (not \"%s\") to str", jj_type_name(b));
    else
        jj_rterr(j, NULL, "unsupported operand type(s) for %s: '%s' and '%s'", jj_op_sym(op), jj_type_name(a), jj_type_name(b));
    return false;
}

/* ------------------------------------------------------------------ arguments */

/* Positional argument `idx` or keyword `name`; NULL when neither was passed. */
const jv *jj_arg(const jargs *a, size_t idx, const char *name) {
    if (idx < a->npos) return &a->pos[idx];
    for (size_t i = 0; name && i < a->nkw; i++)
        if (strcmp(a->kwn[i], name) == 0) return &a->kwv[i];
    return NULL;
}

/* Rejects arguments a callable does not take: more than `max_pos` positional ones, or keywords
 * outside `kw` (a NULL-terminated list of parameter names). */
bool jj_check_args(J *j, const jargs *a, size_t max_pos, const char *const *kw, const char *what) {
    if (a->npos > max_pos) {
        jj_rterr(j, NULL, "%s takes at most %zu positional argument%s (%zu given)", what, max_pos, max_pos == 1 ? "" : "s", a->npos);
        return false;
    }
    for (size_t i = 0; i < a->nkw; i++) {
        size_t k = 0;
        bool ok = false;
        for (; kw && kw[k]; k++)
            if (strcmp(kw[k], a->kwn[i]) == 0) { ok = true; break; }
        if (!ok) { jj_rterr(j, NULL, "%s got an unexpected keyword argument '%s'", what, a->kwn[i]); return false; }
        if (k < a->npos) { jj_rterr(j, NULL, "%s got multiple values for argument '%s'", what, a->kwn[i]); return false; }
    }
    return true;
}

/* ------------------------------------------------------------------ substrings */

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

const char *jj_find_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn == 0) return h;
    if (nn > hn) return NULL;
    const char *hit;
    if (nn > 16 && kmp(h, hn, nd, nn, false, &hit)) return hit;
    for (size_t i = 0; i + nn <= hn; i++)
        if (h[i] == nd[0] && memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

const char *jj_rfind_bytes(const char *h, size_t hn, const char *nd, size_t nn) {
    if (nn > hn) return NULL;
    const char *hit;
    if (nn > 16 && kmp(h, hn, nd, nn, true, &hit)) return hit;
    for (size_t i = hn - nn + 1; i-- > 0;)
        if (memcmp(h + i, nd, nn) == 0) return h + i;
    return NULL;
}

/* ------------------------------------------------------------------ str % args */

bool jj_py_format(J *j, const char *fmt, size_t n, jv args, bool args_is_tuple, jv *out) {
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
            ok = jj_bput(j, &b, fmt + i, e - i);
            i = e;
            continue;
        }
        i++;
        const jv *val = NULL;
        if (i < n && fmt[i] == '(') {
            size_t e = i + 1;
            while (e < n && fmt[e] != ')') e++;
            if (e >= n) { jj_rterr(j, NULL, "incomplete format key"); ok = false; break; }
            if (!mapping) { jj_rterr(j, NULL, "format requires a mapping"); ok = false; break; }
            for (size_t k = 0; k < mapping->n; k++)
                if (mapping->e[k].k.t == T_STR && mapping->e[k].k.u.s->len == e - i - 1 &&
                    memcmp(mapping->e[k].k.u.s->s, fmt + i + 1, e - i - 1) == 0)
                    val = &mapping->e[k].v;
            if (!val) { jj_rterr(j, NULL, "format key '%.*s' not found", (int)(e - i - 1), fmt + i + 1); ok = false; break; }
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
            if (ai >= nitems || !is_intlike(items[ai])) { jj_rterr(j, NULL, "* wants int"); ok = false; break; }
            width = as_int(items[ai++]);
            if (width < 0) { minus = true; width = -width; }
            i++;
        } else {
            while (i < n && jj_is_digit(fmt[i]) && width < 100000) width = width * 10 + (fmt[i++] - '0');
        }
        if (i < n && fmt[i] == '.') {
            i++;
            prec = 0;
            if (i < n && fmt[i] == '*') {
                if (ai >= nitems || !is_intlike(items[ai])) { jj_rterr(j, NULL, "* wants int"); ok = false; break; }
                prec = as_int(items[ai++]);
                i++;
            } else {
                while (i < n && jj_is_digit(fmt[i]) && prec < 100000) prec = prec * 10 + (fmt[i++] - '0');
            }
        }
        if (width > 100000 || prec > 1000) { jj_rterr(j, NULL, "format width or precision too large"); ok = false; break; }
        while (i < n && (fmt[i] == 'h' || fmt[i] == 'l' || fmt[i] == 'L')) i++;
        if (i >= n) { jj_rterr(j, NULL, "incomplete format"); ok = false; break; }
        char conv = fmt[i++];
        if (conv == '%') { ok = jj_bputc(j, &b, '%'); continue; }
        if (!val) {
            if (ai >= nitems) { jj_rterr(j, NULL, "not enough arguments for format string"); ok = false; break; }
            val = &items[ai++];
        }
        char body[400];
        const char *sign = "", *prefix = "";
        bool numeric = true;
        jv sv = mk_undef();
        switch (conv) {
        case 's': case 'r': case 'a': {
            numeric = false;
            if (conv == 's') ok = jj_to_str(j, *val, &sv);
            else {
                jbuf rb = {0};
                ok = jj_put_value(j, &rb, *val, true, 0) && jj_buf_to_str(j, &rb, &sv);
                if (!ok) jj_bfree(&rb);
            }
            if (!ok) break;
            size_t len = sv.u.s->len;
            if (prec >= 0) {
                size_t off = 0, l;
                for (int64_t k = 0; k < prec && off < len; k++) { u8dec(sv.u.s->s + off, len - off, &l); off += l; }
                len = off;
            }
            int64_t cps = (int64_t)jj_u8len(sv.u.s->s, len);
            for (int64_t k = cps; ok && !minus && k < width; k++) ok = jj_bputc(j, &b, ' ');
            if (ok) ok = jj_bput(j, &b, sv.u.s->s, len);
            for (int64_t k = cps; ok && minus && k < width; k++) ok = jj_bputc(j, &b, ' ');
            jj_unref(sv);
            break;
        }
        case 'd': case 'i': case 'u': case 'x': case 'X': case 'o': {
            int64_t v;
            if (is_intlike(*val)) v = as_int(*val);
            else if (val->t == T_FLOAT && (conv == 'd' || conv == 'i' || conv == 'u') && isfinite(val->u.f) &&
                     fabs(val->u.f) < 9.2e18) v = (int64_t)val->u.f;
            else {
                jj_rterr(j, NULL, "%%%c format: %s is required, not %s", conv,
                      conv == 'x' || conv == 'X' || conv == 'o' ? "an integer" : "a real number", jj_type_name(*val));
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
                jj_rterr(j, NULL, "must be real number, not %s", jj_type_name(*val));
                ok = false;
                break;
            }
            double x = as_dbl(*val);
            sign = signbit(x) && !(x != x) ? "-" : plus ? "+" : space ? " " : "";
            char cf[8] = "%*.*", *q = cf + 4;
            if (alt) { memmove(cf + 2, cf + 1, 4); cf[1] = '#'; q++; }
            q[0] = conv;
            q[1] = 0;
            jj_fmt_c_double(body, sizeof body, cf, 0, prec < 0 ? 6 : (int)prec, fabs(x));
            if (x != x) sign = plus ? "+" : space ? " " : "";
            break;
        }
        case 'c': {
            numeric = false;
            char e[4];
            size_t el;
            if (is_intlike(*val) && as_int(*val) >= 0 && as_int(*val) <= 0x10FFFF) el = jj_u8enc((uint32_t)as_int(*val), e);
            else if (val->t == T_STR && jj_u8len(val->u.s->s, val->u.s->len) == 1) {
                el = val->u.s->len;
                memcpy(e, val->u.s->s, el);
            }
            else { jj_rterr(j, NULL, "%%c requires int or char"); ok = false; break; }
            for (int64_t k = 1; ok && !minus && k < width; k++) ok = jj_bputc(j, &b, ' ');
            if (ok) ok = jj_bput(j, &b, e, el);
            for (int64_t k = 1; ok && minus && k < width; k++) ok = jj_bputc(j, &b, ' ');
            break;
        }
        default:
            jj_rterr(j, NULL, "unsupported format character '%c'", conv);
            ok = false;
            break;
        }
        if (!ok || !numeric) continue;
        bool finite_num = !(strchr("eEfFgG", conv) && (strstr(body, "inf") || strstr(body, "nan") ||
                                                       strstr(body, "INF") || strstr(body, "NAN")));
        int64_t len = (int64_t)(strlen(sign) + strlen(prefix) + strlen(body));
        int64_t padn = width > len ? width - len : 0;
        bool zpad = zero && !minus && finite_num;
        for (int64_t k = 0; ok && !minus && !zpad && k < padn; k++) ok = jj_bputc(j, &b, ' ');
        if (ok) ok = jj_bputs(j, &b, sign) && jj_bputs(j, &b, prefix);
        for (int64_t k = 0; ok && zpad && k < padn; k++) ok = jj_bputc(j, &b, '0');
        if (ok) ok = jj_bputs(j, &b, body);
        for (int64_t k = 0; ok && minus && k < padn; k++) ok = jj_bputc(j, &b, ' ');
    }
    if (ok && ai < nitems && !mapping) {
        jj_rterr(j, NULL, "not all arguments converted during string formatting");
        ok = false;
    }
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}
