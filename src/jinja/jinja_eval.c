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
#include "jinja/jinja_internal.h"

#include <time.h>

/* ------------------------------------------------------------------ scopes */

scope *jj_scope_new(J *j, scope *parent) {
    scope *s = jj_jmalloc(j, sizeof *s);
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
    for (size_t i = 0; i < s->n; i++) jj_unref(s->v[i]);
    s->n = 0;
}

static void scope_free(scope *s) {
    if (!s || s->captured) return;
    scope_clear(s);
    scope_release(s);
}

/* Keeps a frame and its ancestors alive until the end of the render (a macro closes over it). */
void jj_capture(J *j, scope *s) {
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
bool jj_scope_set(J *j, scope *s, const char *k, jv v) {
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->k[i], k) == 0) { jj_unref(s->v[i]); s->v[i] = v; return true; }
    if (s->n == s->cap) {
        if (s->cap >= MAX_ITEMS) { jj_unref(v); jj_rterr(j, NULL, "too many variables"); return false; }
        size_t nc = s->cap * 2;
        const char **nk = s->k == s->k0 ? malloc(nc * sizeof *nk) : realloc((void *)s->k, nc * sizeof *nk);
        if (!nk) { jj_unref(v); jj_nomem(j); return false; }
        if (s->k == s->k0) memcpy(nk, s->k0, sizeof s->k0);
        s->k = nk;
        jv *nv = s->v == s->v0 ? malloc(nc * sizeof *nv) : realloc(s->v, nc * sizeof *nv);
        if (!nv) { jj_unref(v); jj_nomem(j); return false; } /* s->k grew; cap stays, still consistent */
        if (s->v == s->v0) memcpy(nv, s->v0, sizeof s->v0);
        s->v = nv;
        s->cap = nc;
    }
    s->k[s->n] = k;
    s->v[s->n++] = v;
    return true;
}

/* ------------------------------------------------------------------ names */

static int builtin_func(const J *j, const char *name) {
    if (strcmp(name, "range") == 0) return F_RANGE;
    if (j->has_now && strcmp(name, "strftime_now") == 0) return F_STRFTIME_NOW;
    if (strcmp(name, "raise_exception") == 0) return F_RAISE;
    if (strcmp(name, "namespace") == 0) return F_NAMESPACE;
    if (strcmp(name, "dict") == 0) return F_DICT;
    return F_NONE;
}

static bool lookup(J *j, scope *sc, const char *name, jv *out) {
    jv *p = scope_lookup(sc, name);
    if (p) { *out = ref(*p); return true; }
    int fn = builtin_func(j, name);
    if (fn) { *out = mk_func(fn); return true; }
    *out = jj_mk_undef_msg(j, "'%s' is undefined", name);
    return !j->failed;
}

/* ------------------------------------------------------------------ evaluation */


static void free_args(jargs *a) {
    for (size_t i = 0; i < a->npos; i++) jj_unref(a->pos[i]);
    for (size_t i = 0; i < a->nkw; i++) jj_unref(a->kwv[i]);
    free(a->pos);
    free(a->kwv);
    memset(a, 0, sizeof *a);
}

static bool eval(J *j, const node *e, scope *sc, jv *out);

static bool eval_args(J *j, const node *e, scope *sc, jargs *a) {
    memset(a, 0, sizeof *a);
    if (e->nkids) {
        a->pos = jj_jmalloc(j, e->nkids * sizeof(jv));
        if (!a->pos) return false;
    }
    for (uint32_t i = 0; i < e->nkids; i++) {
        if (!eval(j, e->kids[i], sc, &a->pos[i])) { free_args(a); return false; }
        a->npos++;
    }
    if (e->nnames) {
        a->kwv = jj_jmalloc(j, e->nnames * sizeof(jv));
        if (!a->kwv) { free_args(a); return false; }
        a->kwn = e->names;
    }
    for (uint32_t i = 0; i < e->nnames; i++) {
        if (!eval(j, e->kids2[i], sc, &a->kwv[i])) { free_args(a); return false; }
        a->nkw++;
    }
    return true;
}


static bool call_macro(J *j, const jmacro *m, const jargs *a, jv caller, jv *out) {
    *out = mk_undef();
    const node *def = m->def;
    const char *mname = def->name ? def->name : "caller";
    bool take_varargs = def->flag, take_kwargs = def->op;
    if (a->npos > def->nnames && !take_varargs) {
        jj_rterr(j, NULL, "macro '%s' takes not more than %u argument(s)", mname, def->nnames);
        return false;
    }
    scope *s = jj_scope_new(j, m->closure);
    if (!s) return false;
    bool ok = true;
    jlist *va = NULL;
    jdict *kw = NULL;
    if (take_varargs && (va = jj_list_new(j, 0)) != NULL) va->tuple = true;
    if (take_kwargs) kw = jj_dict_new(j);
    ok = (!take_varargs || va) && (!take_kwargs || kw);
    for (size_t i = 0; ok && i < a->nkw; i++) {
        bool is_param = false;
        for (uint32_t p = 0; p < def->nnames; p++)
            if (strcmp(def->names[p], a->kwn[i]) == 0) {
                is_param = true;
                if (p < a->npos) {
                    jj_rterr(j, NULL, "macro '%s' got multiple values for argument '%s'", mname, a->kwn[i]);
                    ok = false;
                }
            }
        if (!is_param && ok) {
            if (!take_kwargs) { jj_rterr(j, NULL, "macro '%s' takes no keyword argument '%s'", mname, a->kwn[i]); ok = false; }
            else ok = jj_dict_set_cstr(j, kw, a->kwn[i], ref(a->kwv[i]));
        }
    }
    for (uint32_t p = 0; ok && p < def->nnames; p++) {
        jv v;
        const jv *given = jj_arg(a, p, def->names[p]);
        if (given) v = ref(*given);
        else if (def->kids2[p]) ok = eval(j, def->kids2[p], s, &v);
        else v = jj_mk_undef_msg(j, "parameter '%s' was not provided", def->names[p]);
        if (ok) ok = jj_scope_set(j, s, def->names[p], v);
    }
    for (size_t i = def->nnames; ok && i < a->npos; i++) ok = jj_list_push(j, va, ref(a->pos[i]));
    if (va) { if (ok) ok = jj_scope_set(j, s, "varargs", list_val(va)); else jj_unref(list_val(va)); }
    if (kw) { if (ok) ok = jj_scope_set(j, s, "kwargs", dict_val(kw)); else jj_unref(dict_val(kw)); }
    if (ok && caller.t == T_MACRO) ok = jj_scope_set(j, s, "caller", ref(caller));
    jbuf b = {0};
    if (ok) ok = jj_exec(j, def->b, s, &b) == X_OK;
    scope_free(s);
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

static bool call_builtin(J *j, int fn, const jargs *a, jv *out) {
    *out = mk_undef();
    switch (fn) {
    case F_RANGE: {
        if (a->nkw || a->npos < 1 || a->npos > 3) { jj_rterr(j, NULL, "range() takes 1 to 3 positional arguments"); return false; }
        for (size_t i = 0; i < a->npos; i++)
            if (!is_intlike(a->pos[i])) {
                jj_rterr(j, NULL, "'%s' object cannot be interpreted as an integer", jj_type_name(a->pos[i]));
                return false;
            }
        int64_t start = 0, stop, step = 1;
        if (a->npos == 1) stop = as_int(a->pos[0]);
        else { start = as_int(a->pos[0]); stop = as_int(a->pos[1]); }
        if (a->npos == 3) step = as_int(a->pos[2]);
        if (step == 0) { jj_rterr(j, NULL, "range() arg 3 must not be zero"); return false; }
        double cnt = step > 0 ? ceil(((double)stop - (double)start) / (double)step)
                              : ceil(((double)start - (double)stop) / -(double)step);
        if (cnt < 0) cnt = 0;
        if (cnt > MAX_RANGE) {
            jj_rterr(j, NULL, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (%d).", MAX_RANGE);
            return false;
        }
        jlist *l = jj_list_new(j, (size_t)cnt);
        if (!l || !jj_charge(j, (uint64_t)cnt)) { if (l) jj_unref(list_val(l)); return false; }
        for (int64_t i = 0; i < (int64_t)cnt; i++) l->v[l->n++] = mk_int(start + i * step);
        *out = list_val(l);
        return true;
    }
    case F_RAISE: {
        jv m = mk_undef();
        const jv *p = jj_arg(a, 0, "message");
        if (p && !jj_to_str(j, *p, &m)) return false;
        const node *at = j->at;
        if (!j->failed) {
            j->failed = true;
            j->status = QUILL_E_TEMPLATE;
            snprintf(j->msg, sizeof j->msg, "chat template raised an exception at line %d, column %d: %s",
                     at ? at->line : 0, at ? at->col : 0, m.t == T_STR ? m.u.s->s : "");
        }
        jj_unref(m);
        return false;
    }
    case F_NAMESPACE: case F_DICT: {
        if (a->npos > 1) {
            jj_rterr(j, NULL, "%s() takes at most 1 positional argument", fn == F_DICT ? "dict" : "namespace");
            return false;
        }
        if (fn == F_NAMESPACE) { if (!jj_ns_new(j, out)) return false; }
        else {
            jdict *d = jj_dict_new(j);
            if (!d) return false;
            *out = dict_val(d);
        }
        jdict *d = out->u.d;
        if (a->npos == 1) {
            jv src = a->pos[0];
            if (src.t != T_DICT && src.t != T_NS) {
                jj_rterr(j, NULL, "cannot build a mapping from '%s'", jj_type_name(src));
                return false;
            }
            for (size_t i = 0; i < src.u.d->n; i++)
                if (!jj_dict_set(j, d, ref(src.u.d->e[i].k), ref(src.u.d->e[i].v))) return false;
        }
        for (size_t i = 0; i < a->nkw; i++)
            if (!jj_dict_set_cstr(j, d, a->kwn[i], ref(a->kwv[i]))) return false;
        return true;
    }
    case F_STRFTIME_NOW: {
        const jv *fmt = jj_arg(a, 0, "format");
        if (!fmt || fmt->t != T_STR || a->npos + a->nkw != 1) {
            jj_rterr(j, NULL, "strftime_now() takes one string argument");
            return false;
        }
        /* Python's strftime has C's directives; a format longer than the buffer allows fails
         * rather than truncating. */
        time_t t = (time_t)j->now;
        struct tm tm;
        char buf[512];
        size_t n = 0;
        if (gmtime_r(&t, &tm) && fmt->u.s->len < 200) n = strftime(buf, sizeof buf, fmt->u.s->s, &tm);
        if (n == 0 && fmt->u.s->len > 0) {
            jj_rterr(j, NULL, "strftime_now(): the format is empty, too long or gives no text");
            return false;
        }
        buf[n] = 0;
        return jj_mk_str(j, buf, out);
    }
    default: jj_rterr(j, NULL, "unknown function"); return false;
    }
}


static bool call_value(J *j, jv f, const jargs *a, jv caller, jv *out) {
    *out = mk_undef();
    switch (f.t) {
    case T_FUNC: return call_builtin(j, f.u.fn, a, out);
    case T_MACRO: return call_macro(j, f.u.m, a, caller, out);
    case T_METHOD: return jj_call_method(j, f.u.me, a, out);
    case T_UNDEF: jj_undef_err(j, NULL, f); return false;
    default: jj_rterr(j, NULL, "'%s' object is not callable", jj_type_name(f)); return false;
    }
}


static bool eval_call(J *j, const node *e, scope *sc, jv caller, jv *out) {
    jv f;
    if (!eval(j, e->a, sc, &f)) return false;
    jargs a;
    if (!eval_args(j, e, sc, &a)) { jj_unref(f); return false; }
    j->at = e;
    bool ok = call_value(j, f, &a, caller, out);
    free_args(&a);
    jj_unref(f);
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
        jlist *l = jj_list_new(j, e->nkids);
        if (!l) return false;
        l->tuple = e->kind == E_TUPLE;
        *out = list_val(l);
        for (uint32_t i = 0; ok && i < e->nkids; i++) {
            ok = eval(j, e->kids[i], sc, &a);
            if (ok) ok = jj_list_push(j, l, a);
        }
        break;
    }
    case E_DICT: {
        jdict *d = jj_dict_new(j);
        if (!d) return false;
        *out = dict_val(d);
        for (uint32_t i = 0; ok && i < e->nkids; i++) {
            ok = eval(j, e->kids[i], sc, &a);
            if (ok && !(ok = eval(j, e->kids2[i], sc, &b))) jj_unref(a);
            if (ok) ok = jj_dict_set(j, d, a, b);
        }
        break;
    }
    case E_ATTR:
        if (!eval(j, e->a, sc, &a)) return false;
        ok = jj_get_attr(j, a, e->name, out);
        jj_unref(a);
        return ok;
    case E_ITEM:
        if (!eval(j, e->a, sc, &a)) return false;
        if (e->b->kind == E_SLICE) {
            jv p[3] = {mk_none(), mk_none(), mk_none()};
            const node *pn[3] = {e->b->a, e->b->b, e->b->c};
            for (int k = 0; ok && k < 3; k++)
                if (pn[k]) ok = eval(j, pn[k], sc, &p[k]);
            j->at = e;
            if (ok) ok = jj_slice(j, a, p[0], p[1], p[2], out);
            for (int k = 0; k < 3; k++) jj_unref(p[k]);
        } else {
            ok = eval(j, e->b, sc, &b);
            j->at = e;
            if (ok) ok = jj_get_item(j, a, b, out);
        }
        jj_unref(a);
        jj_unref(b);
        return ok;
    case E_CALL: return eval_call(j, e, sc, mk_undef(), out);
    case E_FILTER: case E_TEST: {
        if (e->a && !eval(j, e->a, sc, &a)) return false;
        jargs args;
        if (!eval_args(j, e, sc, &args)) { jj_unref(a); return false; }
        j->at = e;
        if (e->kind == E_FILTER) ok = jj_apply_filter(j, e->name, a, &args, out);
        else {
            bool r;
            ok = jj_run_test(j, e->name, a, &args, &r);
            if (ok) *out = mk_bool(r != e->flag);
        }
        free_args(&args);
        jj_unref(a);
        return ok;
    }
    case E_UNARY:
        if (!eval(j, e->a, sc, &a)) return false;
        if (e->op == OP_NOT) *out = mk_bool(!jj_truthy(a));
        else if (a.t == T_INT && e->op == OP_NEG) ok = jj_int_result(j, a.u.i == INT64_MIN, -a.u.i, out);
        else if (is_intlike(a)) *out = mk_int(e->op == OP_NEG ? -as_int(a) : as_int(a));
        else if (a.t == T_FLOAT) *out = mk_float(e->op == OP_NEG ? -a.u.f : a.u.f);
        else if (a.t == T_UNDEF) { jj_undef_err(j, e, a); ok = false; }
        else { jj_rterr(j, e, "bad operand type for unary %s: '%s'", e->op == OP_NEG ? "-" : "+", jj_type_name(a)); ok = false; }
        jj_unref(a);
        return ok;
    case E_BIN:
        if (!eval(j, e->a, sc, &a)) return false;
        if (e->op == OP_AND || e->op == OP_OR) {
            /* Python's and/or yield an operand, not a boolean */
            if (jj_truthy(a) == (e->op == OP_OR)) { *out = a; return true; }
            jj_unref(a);
            return eval(j, e->b, sc, out);
        }
        if (!eval(j, e->b, sc, &b)) { jj_unref(a); return false; }
        j->at = e;
        if (e->op == OP_CONCAT) {
            jbuf s = {0};
            ok = jj_put_value(j, &s, a, false, 0) && jj_put_value(j, &s, b, false, 0);
            if (ok) ok = jj_buf_to_str(j, &s, out);
            else jj_bfree(&s);
        } else {
            ok = jj_binop(j, e->op, a, b, out);
        }
        jj_unref(a);
        jj_unref(b);
        return ok;
    case E_CMP: {
        if (!eval(j, e->a, sc, &a)) return false;
        bool res = true;
        for (uint32_t i = 0; ok && res && i < e->nkids; i++) {
            if (!(ok = eval(j, e->kids[i], sc, &b))) break;
            j->at = e;
            int op = e->ops[i], c;
            if ((op == OP_EQ || op == OP_NE) && a.t == T_STR && b.t == T_STR && !(ok = jj_charge(j, a.u.s->len / 64))) break;
            switch (op) {
            case OP_EQ: res = jj_jv_eq(a, b, 0); break;
            case OP_NE: res = !jj_jv_eq(a, b, 0); break;
            case OP_IN: case OP_NOTIN:
                ok = jj_contains(j, b, a, &res);
                if (op == OP_NOTIN) res = !res;
                break;
            default:
                ok = jj_jv_cmp(j, a, b, jj_op_sym(op), &c, 0);
                res = c != 2 && (op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0);
                break;
            }
            jj_unref(a);
            a = b;
            b = mk_undef();
        }
        jj_unref(a);
        jj_unref(b);
        if (ok) *out = mk_bool(res);
        return ok;
    }
    case E_COND:
        if (!eval(j, e->b, sc, &a)) return false;
        ok = jj_truthy(a);
        jj_unref(a);
        if (ok) return eval(j, e->a, sc, out);
        if (e->c) return eval(j, e->c, sc, out);
        *out = jj_mk_undef_msg(j, "the inline if-expression on line %d evaluated to false and no else section was defined.",
                            e->line);
        return !j->failed;
    default:
        jj_rterr(j, e, "internal error: not an expression");
        return false;
    }
    if (!ok) { jj_unref(*out); *out = mk_undef(); }
    return ok;
}

static bool eval(J *j, const node *e, scope *sc, jv *out) {
    *out = mk_undef();
    if (j->failed) return false;
    if (++j->steps > MAX_STEPS) {
        jj_rterr(j, e, "template did not finish within %llu steps", (unsigned long long)MAX_STEPS);
        return false;
    }
    if (j->depth >= MAX_EVAL_DEPTH) {
        jj_rterr(j, e, "template recursion deeper than %d levels", MAX_EVAL_DEPTH);
        return false;
    }
    j->depth++;
    const node *saved = j->at;
    j->at = e;
    bool ok = eval_inner(j, e, sc, out) && !j->failed;
    j->at = saved;
    j->depth--;
    if (!ok) { jj_unref(*out); *out = mk_undef(); }
    return ok;
}

/* ------------------------------------------------------------------ statements */

/* Binds a loop or set target; several names unpack a sequence of exactly that length. */
static bool bind_targets(J *j, scope *s, const node *st, jv item) {
    if (st->nnames == 1) return jj_scope_set(j, s, st->names[0], ref(item));
    jlist *parts;
    if (item.t == T_UNDEF || item.t == T_NONE || is_num(item)) {
        jj_rterr(j, st, "cannot unpack non-iterable %s object", jj_type_name(item));
        return false;
    }
    if (!jj_iter_list(j, item, &parts)) return false;
    bool ok = parts->n == st->nnames;
    if (!ok) {
        if (parts->n > st->nnames) jj_rterr(j, st, "too many values to unpack (expected %u)", st->nnames);
        else jj_rterr(j, st, "not enough values to unpack (expected %u, got %zu)", st->nnames, parts->n);
    }
    for (uint32_t i = 0; ok && i < st->nnames; i++) ok = jj_scope_set(j, s, st->names[i], ref(parts->v[i]));
    jj_unref(list_val(parts));
    return ok;
}

static xres exec_for(J *j, const node *s, scope *sc, jbuf *out) {
    jv it;
    if (!eval(j, s->a, sc, &it)) return X_ERR;
    j->at = s;
    jlist *items;
    bool ok = jj_iter_list(j, it, &items);
    jj_unref(it);
    if (!ok) return X_ERR;
    if (s->b) {
        /* `for x in xs if cond`: filtered first, so loop.length and loop.last see the result */
        jlist *kept = jj_list_new(j, 0);
        ok = kept != NULL;
        for (size_t i = 0; ok && i < items->n; i++) {
            scope *ts = jj_scope_new(j, sc);
            jv c = mk_undef();
            ok = ts && bind_targets(j, ts, s, items->v[i]) && eval(j, s->b, ts, &c);
            scope_free(ts);
            if (ok && jj_truthy(c)) ok = jj_list_push(j, kept, ref(items->v[i]));
            jj_unref(c);
        }
        jj_unref(list_val(items));
        if (!ok) { if (kept) jj_unref(list_val(kept)); return X_ERR; }
        items = kept;
    }
    jloop *lp = jj_jmalloc(j, sizeof *lp);
    if (!lp) { jj_unref(list_val(items)); return X_ERR; }
    lp->rc = 1;
    lp->i = 0;
    lp->n = (int64_t)items->n;
    lp->items = items;
    jv loopv = {T_LOOP, {.lp = lp}};
    xres r = X_OK;
    for (size_t i = 0; i < items->n; i++) {
        lp->i = (int64_t)i;
        /* a fresh frame per iteration: a `set` in the body never survives to the next one */
        scope *is = jj_scope_new(j, sc);
        if (!is || !bind_targets(j, is, s, items->v[i]) || !jj_scope_set(j, is, "loop", ref(loopv))) {
            scope_free(is);
            r = X_ERR;
            break;
        }
        r = jj_exec(j, s->c, is, out);
        scope_free(is);
        if (r == X_ERR) break;
        if (r == X_BREAK) { r = X_OK; break; }
        r = X_OK;
    }
    if (r == X_OK && items->n == 0 && s->d) r = jj_exec(j, s->d, sc, out);
    jj_unref(loopv);
    return r;
}

static bool new_macro(J *j, const node *def, scope *sc, jv *out) {
    jmacro *m = jj_jmalloc(j, sizeof *m);
    if (!m) return false;
    m->rc = 1;
    m->def = def;
    m->closure = sc;
    jj_capture(j, sc);
    out->t = T_MACRO;
    out->u.m = m;
    return true;
}

/* Renders a body into a new string. */
static bool render_to_str(J *j, const node *body, scope *sc, jv *out) {
    jbuf b = {0};
    if (jj_exec(j, body, sc, &b) != X_OK) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

/* Applies a filter chain whose innermost operand is E_PLACEHOLDER to `v` (consumed). */
static bool apply_chain(J *j, const node *chain, scope *sc, jv v, jv *out) {
    jv saved = j->placeholder;
    j->placeholder = v;
    bool ok = eval(j, chain, sc, out);
    j->placeholder = saved;
    jj_unref(v);
    return ok;
}

static xres exec_inner(J *j, const node *s, scope *sc, jbuf *out) {
    jv v = mk_undef(), w;
    bool ok;
    switch (s->kind) {
    case S_BODY:
        for (uint32_t i = 0; i < s->nkids; i++) {
            xres r = jj_exec(j, s->kids[i], sc, out);
            if (r != X_OK) return r;
        }
        return X_OK;
    case S_TEXT: return jj_bput(j, out, s->name, s->name_len) ? X_OK : X_ERR;
    case S_OUT:
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        ok = jj_put_value(j, out, v, false, 0);
        jj_unref(v);
        return ok ? X_OK : X_ERR;
    case S_IF:
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        ok = jj_truthy(v);
        jj_unref(v);
        if (ok) return jj_exec(j, s->b, sc, out);
        return s->c ? jj_exec(j, s->c, sc, out) : X_OK;
    case S_FOR: return exec_for(j, s, sc, out);
    case S_SET:
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        j->at = s;
        ok = bind_targets(j, sc, s, v);
        jj_unref(v);
        return ok ? X_OK : X_ERR;
    case S_SETATTR: {
        jv *ns = scope_lookup(sc, s->name);
        if (!ns || ns->t != T_NS) {
            jj_rterr(j, s, "cannot assign attribute on non-namespace object ('%s' is %s)", s->name,
                  ns ? jj_type_name(*ns) : "undefined");
            return X_ERR;
        }
        jdict *d = ns->u.d; /* namespaces live until the end of the render */
        if (!eval(j, s->a, sc, &v)) return X_ERR;
        return jj_dict_set_cstr(j, d, s->names[0], v) ? X_OK : X_ERR;
    }
    case S_SETBLOCK:
        if (!render_to_str(j, s->b, sc, &v)) return X_ERR;
        if (s->c) {
            if (!apply_chain(j, s->c, sc, v, &w)) return X_ERR;
            v = w;
        }
        return jj_scope_set(j, sc, s->names[0], v) ? X_OK : X_ERR;
    case S_MACRO:
        if (!new_macro(j, s, sc, &v)) return X_ERR;
        return jj_scope_set(j, sc, s->name, v) ? X_OK : X_ERR;
    case S_CALLBLOCK: {
        jv caller;
        if (!new_macro(j, s, sc, &caller)) return X_ERR;
        ok = eval_call(j, s->a, sc, caller, &v);
        jj_unref(caller);
        if (ok) ok = jj_put_value(j, out, v, false, 0);
        jj_unref(v);
        return ok ? X_OK : X_ERR;
    }
    case S_BREAK: return X_BREAK;
    case S_CONTINUE: return X_CONTINUE;
    case S_FILTERBLOCK:
        if (!render_to_str(j, s->b, sc, &v)) return X_ERR;
        if (!apply_chain(j, s->a, sc, v, &w)) return X_ERR;
        ok = jj_put_value(j, out, w, false, 0);
        jj_unref(w);
        return ok ? X_OK : X_ERR;
    case S_WITH: {
        scope *ws = jj_scope_new(j, sc);
        if (!ws) return X_ERR;
        ok = true;
        for (uint32_t i = 0; ok && i < s->nnames; i++) {
            ok = eval(j, s->kids2[i], sc, &v);
            if (ok) ok = jj_scope_set(j, ws, s->names[i], v);
        }
        xres r = ok ? jj_exec(j, s->b, ws, out) : X_ERR;
        scope_free(ws);
        return r;
    }
    default:
        jj_rterr(j, s, "internal error: not a statement");
        return X_ERR;
    }
}

xres jj_exec(J *j, const node *s, scope *sc, jbuf *out) {
    if (j->failed) return X_ERR;
    if (++j->steps > MAX_STEPS) {
        jj_rterr(j, s, "template did not finish within %llu steps", (unsigned long long)MAX_STEPS);
        return X_ERR;
    }
    if (j->depth >= MAX_EVAL_DEPTH) {
        jj_rterr(j, s, "template recursion deeper than %d levels", MAX_EVAL_DEPTH);
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

/* ------------------------------------------------------------------ for the entry points (jinja.c) */

void jj_cleanup(J *j) {
    /* Namespaces first (they may hold each other), then the captured frames, then the
     * namespaces' own blocks: after the first two steps nothing refers to them any more. */
    for (size_t i = 0; i < j->n_nss; i++) {
        jdict *d = j->nss[i];
        for (size_t k = 0; k < d->n; k++) { jj_unref(d->e[k].k); jj_unref(d->e[k].v); }
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
        jj_unref(v);
    }
    free(j->nss);
    free(j->toks);
    free(j->src);
    jj_arena_free(j->arena);
}

void jj_set_err(quill_error *err, quill_status st, const char *msg) {
    if (!err) return;
    err->status = st;
    snprintf(err->message, sizeof err->message, "%s", msg);
}

bool jj_set_str(J *j, scope *g, const char *name, const char *s) {
    jv v;
    return jj_mk_str(j, s ? s : "", &v) && jj_scope_set(j, g, name, v);
}

