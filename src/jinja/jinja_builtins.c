/* Chat-template engine, builtins: string helpers, tojson, sorting, filters, tests, methods, and the
 * built-in templates. */
#include "jinja/jinja_internal.h"

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
        jj_rterr(j, NULL, "strip arg must be None or str");
        return false;
    }
    size_t a = 0, b = n, l, st;
    while (left && a < b) {
        uint32_t c = u8dec(s + a, b - a, &l);
        if (set ? !cp_in(c, set) : !jj_py_space(c)) break;
        a += l;
    }
    while (right && b > a) {
        uint32_t c = u8prev(s, a, b, &st);
        if (set ? !cp_in(c, set) : !jj_py_space(c)) break;
        b = st;
    }
    return jj_mk_strn(j, s + a, b - a, out);
}


static bool map_case(J *j, const char *s, size_t n, int mode, jv *out) {
    jbuf b = {0};
    bool prev_cased = false, first = true;
    for (size_t i = 0, l; i < n; i += l) {
        uint32_t c = u8dec(s + i, n - i, &l), m = c;
        switch (mode) {
        case CASE_UPPER: m = jj_cp_upper(c); break;
        case CASE_LOWER: m = jj_cp_lower(c); break;
        case CASE_SWAP: m = jj_cp_is_upper(c) ? jj_cp_lower(c) : jj_cp_upper(c); break;
        case CASE_TITLE:
            m = prev_cased ? jj_cp_lower(c) : jj_cp_upper(c);
            prev_cased = jj_cp_cased(c);
            break;
        default: m = first ? jj_cp_upper(c) : jj_cp_lower(c); break;
        }
        first = false;
        char e[4];
        if (!jj_bput(j, &b, e, jj_u8enc(m, e))) { jj_bfree(&b); return false; }
    }
    return jj_buf_to_str(j, &b, out);
}

static bool push_str(J *j, jlist *l, const char *s, size_t n) {
    jv v;
    return jj_mk_strn(j, s, n, &v) && jj_list_push(j, l, v);
}

/* str.split / str.rsplit (sep None: runs of whitespace, no empty strings). */
static bool do_split(J *j, const jstr *s, const jv *sepv, int64_t maxsplit, bool right, jv *out) {
    const char *p = s->s;
    size_t n = s->len;
    jlist *l = jj_list_new(j, 0);
    if (!l) return false;
    *out = list_val(l);
    bool ok = true;
    if (!sepv || sepv->t == T_NONE) {
        if (!right) {
            size_t i = 0, k;
            int64_t count = 0;
            for (;;) {
                while (i < n && (k = jj_space_at(p + i, n - i))) i += k;
                if (i >= n) break;
                if (maxsplit >= 0 && count >= maxsplit) { ok = push_str(j, l, p + i, n - i); break; }
                size_t st = i;
                while (i < n && !jj_space_at(p + i, n - i)) { size_t q; u8dec(p + i, n - i, &q); i += q; }
                if (!(ok = push_str(j, l, p + st, i - st))) break;
                count++;
            }
        } else {
            size_t e = n, st;
            int64_t count = 0;
            jlist *rev = jj_list_new(j, 0);
            if (!rev) ok = false;
            while (ok) {
                while (e > 0 && jj_py_space(u8prev(p, 0, e, &st))) e = st;
                if (e == 0) break;
                if (maxsplit >= 0 && count >= maxsplit) { ok = push_str(j, rev, p, e); break; }
                size_t b = e;
                while (b > 0 && !jj_py_space(u8prev(p, 0, b, &st))) b = st;
                if (!(ok = push_str(j, rev, p + b, e - b))) break;
                e = b;
                count++;
            }
            for (size_t i = rev ? rev->n : 0; ok && i-- > 0;) ok = jj_list_push(j, l, ref(rev->v[i]));
            if (rev) jj_unref(list_val(rev));
        }
    } else if (sepv->t != T_STR) {
        jj_rterr(j, NULL, "must be str or None, not %s", jj_type_name(*sepv));
        ok = false;
    } else if (sepv->u.s->len == 0) {
        jj_rterr(j, NULL, "empty separator");
        ok = false;
    } else {
        const char *sep = sepv->u.s->s;
        size_t sn = sepv->u.s->len;
        if (!right) {
            size_t i = 0;
            int64_t count = 0;
            const char *f;
            while (ok && (maxsplit < 0 || count < maxsplit) && (f = jj_find_bytes(p + i, n - i, sep, sn))) {
                ok = push_str(j, l, p + i, (size_t)(f - (p + i)));
                i = (size_t)(f - p) + sn;
                count++;
            }
            if (ok) ok = push_str(j, l, p + i, n - i);
        } else {
            jlist *rev = jj_list_new(j, 0);
            size_t e = n;
            int64_t count = 0;
            const char *f;
            ok = rev != NULL;
            while (ok && (maxsplit < 0 || count < maxsplit) && (f = jj_rfind_bytes(p, e, sep, sn))) {
                ok = push_str(j, rev, f + sn, (size_t)(p + e - (f + sn)));
                e = (size_t)(f - p);
                count++;
            }
            if (ok) ok = push_str(j, rev, p, e);
            for (size_t i = rev ? rev->n : 0; ok && i-- > 0;) ok = jj_list_push(j, l, ref(rev->v[i]));
            if (rev) jj_unref(list_val(rev));
        }
    }
    if (!ok) { jj_unref(*out); *out = mk_undef(); }
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
            if (count < 0 || done < count) { ok = jj_bput(j, &b, nw->s, nw->len); done++; }
            if (i == s->len) break;
            u8dec(s->s + i, s->len - i, &l);
            if (ok) ok = jj_bput(j, &b, s->s + i, l);
            i += l;
        }
        if (ok && i < s->len) ok = jj_bput(j, &b, s->s + i, s->len - i);
    } else {
        size_t i = 0;
        const char *f;
        while (ok && (count < 0 || done < count) && (f = jj_find_bytes(s->s + i, s->len - i, old->s, old->len))) {
            ok = jj_bput(j, &b, s->s + i, (size_t)(f - (s->s + i))) && jj_bput(j, &b, nw->s, nw->len);
            i = (size_t)(f - s->s) + old->len;
            done++;
        }
        if (ok) ok = jj_bput(j, &b, s->s + i, s->len - i);
    }
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

static bool str_arg(J *j, const jv *v, const char *what, const jstr **out) {
    if (!v || v->t != T_STR) {
        jj_rterr(j, NULL, "%s must be a string, not %s", what, v ? jj_type_name(*v) : "nothing");
        return false;
    }
    *out = v->u.s;
    return true;
}

static bool int_arg(J *j, const jv *v, int64_t dflt, const char *what, int64_t *out) {
    if (!v || v->t == T_NONE) { *out = dflt; return true; }
    if (!is_intlike(*v)) {
        jj_rterr(j, NULL, "%s must be an integer, not %s", what, jj_type_name(*v));
        return false;
    }
    *out = as_int(*v);
    return true;
}

/* Pads to `width` code points: align '<', '>' or '^' (Python's center rounding). */
static bool pad_str(J *j, const char *s, size_t n, int64_t width, char align, const char *fill, jv *out) {
    int64_t len = (int64_t)jj_u8len(s, n);
    if (width <= len) return jj_mk_strn(j, s, n, out);
    int64_t marg = width - len, left = 0;
    if (align == '>') left = marg;
    else if (align == '^') left = marg / 2 + (marg & width & 1);
    if (marg > (int64_t)MAX_STR_BYTES) { jj_rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES); return false; }
    jbuf b = {0};
    bool ok = true;
    size_t fl = strlen(fill);
    for (int64_t i = 0; ok && i < left; i++) ok = jj_bput(j, &b, fill, fl);
    if (ok) ok = jj_bput(j, &b, s, n);
    for (int64_t i = left; ok && i < marg; i++) ok = jj_bput(j, &b, fill, fl);
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

/* ------------------------------------------------------------------ tojson */


static bool json_str(J *j, jbuf *b, const char *s, size_t n, bool ascii) {
    if (!jj_bputc(j, b, '"')) return false;
    for (size_t i = 0, l; i < n; i += l) {
        uint32_t c = u8dec(s + i, n - i, &l);
        bool ok;
        switch (c) {
        case '"': ok = jj_bput(j, b, "\\\"", 2); break;
        case '\\': ok = jj_bput(j, b, "\\\\", 2); break;
        case '\n': ok = jj_bput(j, b, "\\n", 2); break;
        case '\r': ok = jj_bput(j, b, "\\r", 2); break;
        case '\t': ok = jj_bput(j, b, "\\t", 2); break;
        case '\b': ok = jj_bput(j, b, "\\b", 2); break;
        case '\f': ok = jj_bput(j, b, "\\f", 2); break;
        default:
            if (c < 0x20) ok = jj_bprintf(j, b, "\\u%04x", c);
            else if (!ascii || c < 0x80) ok = jj_bput(j, b, s + i, l);
            else if (c >= CP_BAD) ok = jj_bprintf(j, b, "\\ufffd");
            else if (c > 0xFFFF) {
                uint32_t v = c - 0x10000;
                ok = jj_bprintf(j, b, "\\u%04x\\u%04x", 0xD800 + (v >> 10), 0xDC00 + (v & 0x3FF));
            } else ok = jj_bprintf(j, b, "\\u%04x", c);
            break;
        }
        if (!ok) return false;
    }
    return jj_bputc(j, b, '"');
}

static bool json_newline(J *j, jbuf *b, const jsonopt *o, int level) {
    if (!jj_bputc(j, b, '\n')) return false;
    for (int i = 0; i < level; i++)
        if (!jj_bput(j, b, o->ind, o->indn)) return false;
    return true;
}

static bool put_json(J *j, jbuf *b, jv v, const jsonopt *o, int level) {
    if (level > MAX_NEST + 8) { jj_rterr(j, NULL, "value nested too deeply for tojson"); return false; }
    char tmp[64];
    switch (v.t) {
    case T_NONE: return jj_bputs(j, b, "null");
    case T_BOOL: return jj_bputs(j, b, v.u.b ? "true" : "false");
    case T_INT: return jj_bprintf(j, b, "%lld", (long long)v.u.i);
    case T_FLOAT:
        if (v.u.f != v.u.f) return jj_bputs(j, b, "NaN");
        if (isinf(v.u.f)) return jj_bputs(j, b, v.u.f > 0 ? "Infinity" : "-Infinity");
        jj_fmt_float(v.u.f, tmp, sizeof tmp);
        return jj_bputs(j, b, tmp);
    case T_STR: return json_str(j, b, v.u.s->s, v.u.s->len, o->ascii);
    case T_LIST: {
        if (v.u.l->n == 0) return jj_bputs(j, b, "[]");
        if (!jj_charge(j, v.u.l->n) || !jj_bputc(j, b, '[')) return false;
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i && !jj_bput(j, b, o->isep, o->isepn)) return false;
            if (o->pretty && !json_newline(j, b, o, level + 1)) return false;
            if (!put_json(j, b, v.u.l->v[i], o, level + 1)) return false;
        }
        if (o->pretty && !json_newline(j, b, o, level)) return false;
        return jj_bputc(j, b, ']');
    }
    case T_DICT: {
        jdict *d = v.u.d;
        if (d->n == 0) return jj_bputs(j, b, "{}");
        if (!jj_charge(j, d->n)) return false;
        /* keys as json.dumps converts them */
        jv *keys = jj_jmalloc(j, d->n * sizeof(jv));
        size_t *order = jj_jmalloc(j, d->n * sizeof(size_t));
        bool ok = keys && order;
        size_t nk = 0;
        for (size_t i = 0; ok && i < d->n; i++, nk++) {
            jv k = d->e[i].k;
            order[i] = i;
            if (k.t == T_STR) keys[i] = ref(k);
            else if (k.t == T_BOOL) ok = jj_mk_str(j, k.u.b ? "true" : "false", &keys[i]);
            else if (k.t == T_NONE) ok = jj_mk_str(j, "null", &keys[i]);
            else if (k.t == T_INT || k.t == T_FLOAT) ok = jj_to_str(j, k, &keys[i]);
            else {
                jj_rterr(j, NULL, "keys must be str, int, float, bool or None, not %s", jj_type_name(k));
                ok = false;
            }
            if (!ok) keys[i] = mk_undef();
        }
        if (ok && o->sort) /* insertion sort: stable, and dicts in templates are small */
            for (size_t i = 1; i < d->n; i++)
                for (size_t k = i; k > 0; k--) {
                    int c;
                    jj_jv_cmp(j, keys[order[k - 1]], keys[order[k]], "<", &c, 0);
                    if (c <= 0) break;
                    size_t t = order[k]; order[k] = order[k - 1]; order[k - 1] = t;
                }
        if (ok) ok = jj_bputc(j, b, '{');
        for (size_t i = 0; ok && i < d->n; i++) {
            size_t x = order[i];
            if (i) ok = jj_bput(j, b, o->isep, o->isepn);
            if (ok && o->pretty) ok = json_newline(j, b, o, level + 1);
            if (ok) ok = json_str(j, b, keys[x].u.s->s, keys[x].u.s->len, o->ascii) && jj_bput(j, b, o->ksep, o->ksepn) &&
                         put_json(j, b, d->e[x].v, o, level + 1);
        }
        if (ok && o->pretty) ok = json_newline(j, b, o, level);
        if (ok) ok = jj_bputc(j, b, '}');
        for (size_t i = 0; keys && i < nk; i++) jj_unref(keys[i]);
        free(keys);
        free(order);
        return ok;
    }
    default:
        jj_rterr(j, NULL, "Object of type %s is not JSON serializable", jj_type_name(v));
        return false;
    }
}

/* Hugging Face's tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False). */
static bool f_tojson(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"ensure_ascii", "indent", "separators", "sort_keys", NULL};
    if (!jj_check_args(j, a, 4, kw, "tojson")) return false;
    const jv *asc = jj_arg(a, 0, "ensure_ascii"), *ind = jj_arg(a, 1, "indent"), *sep = jj_arg(a, 2, "separators"),
             *srt = jj_arg(a, 3, "sort_keys");
    jsonopt o = {0};
    o.ascii = asc && jj_truthy(*asc);
    o.sort = srt && jj_truthy(*srt);
    char spaces[64];
    if (ind && ind->t != T_NONE) {
        o.pretty = true;
        if (ind->t == T_STR) { o.ind = ind->u.s->s; o.indn = ind->u.s->len; }
        else if (is_intlike(*ind)) {
            int64_t w = as_int(*ind);
            if (w < 0) w = 0;
            if (w > 63) { jj_rterr(j, NULL, "tojson indent too large"); return false; }
            memset(spaces, ' ', (size_t)w);
            o.ind = spaces;
            o.indn = (size_t)w;
        } else { jj_rterr(j, NULL, "tojson indent must be an integer or a string"); return false; }
    }
    o.isep = o.pretty ? "," : ", ";
    o.ksep = ": ";
    if (sep && sep->t != T_NONE) {
        if (sep->t != T_LIST || sep->u.l->n != 2 || sep->u.l->v[0].t != T_STR || sep->u.l->v[1].t != T_STR) {
            jj_rterr(j, NULL, "tojson separators must be a pair of strings");
            return false;
        }
        o.isep = sep->u.l->v[0].u.s->s;
        o.ksep = sep->u.l->v[1].u.s->s;
    }
    o.isepn = strlen(o.isep);
    o.ksepn = strlen(o.ksep);
    if (v.t == T_UNDEF) { jj_rterr(j, NULL, "Object of type Undefined is not JSON serializable"); return false; }
    jbuf b = {0};
    if (!put_json(j, &b, v, &o, 0)) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

/* ------------------------------------------------------------------ sorting */

/* Stable merge sort of idx[] by keys[]; comparisons can fail (mismatched types). */
static bool sort_idx(J *j, const jv *keys, size_t *idx, size_t n, bool reverse) {
    uint64_t lg = 1;
    while (((size_t)1 << lg) < n) lg++;
    if (!jj_charge(j, (uint64_t)n * lg)) return false;
    size_t *tmp = jj_jmalloc(j, (n ? n : 1) * sizeof(size_t));
    if (!tmp) return false;
    for (size_t w = 1; w < n; w *= 2) {
        for (size_t lo = 0; lo < n; lo += 2 * w) {
            size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            size_t a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                int c;
                if (!jj_jv_cmp(j, keys[idx[b]], keys[idx[a]], "<", &c, 0)) { free(tmp); return false; }
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
    if (is_intlike(*path)) return jj_get_item(j, item, *path, out);
    if (path->t != T_STR) { jj_rterr(j, NULL, "attribute must be a string or integer"); return false; }
    const char *s = path->u.s->s;
    jv curv = ref(item);
    for (;;) {
        const char *dot = strchr(s, '.');
        size_t n = dot ? (size_t)(dot - s) : strlen(s);
        jv key;
        bool isnum = n > 0;
        int64_t num = 0;
        for (size_t i = 0; i < n; i++) {
            if (!jj_is_digit(s[i]) || num > INT64_MAX / 10) { isnum = false; break; }
            num = num * 10 + (s[i] - '0');
        }
        if (isnum) key = mk_int(num);
        else if (!jj_mk_strn(j, s, n, &key)) { jj_unref(curv); return false; }
        jv next;
        bool ok = curv.t == T_UNDEF ? (next = curv, curv = mk_undef(), true) : jj_get_item(j, curv, key, &next);
        jj_unref(key);
        jj_unref(curv);
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
        jj_unref(k);
        return ok;
    }
    *out = k;
    return true;
}

/* ------------------------------------------------------------------ filters */

static size_t value_len(J *j, jv v, bool *ok) {
    *ok = true;
    switch (v.t) {
    case T_STR: *ok = jj_charge(j, v.u.s->len / 64); return jj_u8len(v.u.s->s, v.u.s->len);
    case T_LIST: return v.u.l->n;
    case T_DICT: return v.u.d->n;
    case T_UNDEF: return 0;
    case T_LOOP: return (size_t)v.u.lp->n;
    default:
        jj_rterr(j, NULL, "object of type '%s' has no len()", jj_type_name(v));
        *ok = false;
        return 0;
    }
}

/* Python float(str): optional whitespace and sign, decimal or inf/nan, underscores between digits. */
static bool parse_py_float(const jstr *s, double *out) {
    size_t a = 0, b = s->len, l, st;
    while (a < b && jj_py_space(u8dec(s->s + a, b - a, &l))) a += l;
    while (b > a && jj_py_space(u8prev(s->s, a, b, &st))) b = st;
    if (a == b || b - a > 300) return false;
    char buf[320];
    size_t k = 0;
    for (size_t i = a; i < b; i++) {
        char c = s->s[i];
        if (c == '_') {
            if (i == a || i + 1 >= b || !jj_is_digit(s->s[i - 1]) || !jj_is_digit(s->s[i + 1])) return false;
            continue;
        }
        if (!(jj_is_digit(c) || c == '.' || c == '+' || c == '-' || (c | 32) == 'e' || (c | 32) == 'i' ||
              (c | 32) == 'n' || (c | 32) == 'f' || (c | 32) == 't' || (c | 32) == 'y' || (c | 32) == 'a'))
            return false;
        buf[k++] = c;
    }
    buf[k] = 0;
    /* strtod also takes hex floats and "infinity"-like words Python accepts; reject hex */
    for (size_t i = 0; i < k; i++)
        if ((buf[i] | 32) == 'x') return false;
    char *end;
    double d = jj_loc_strtod(buf, &end);
    if (end != buf + k) return false;
    *out = d;
    return true;
}

/* Python int(str, base): whitespace, sign, optional prefix matching the base, underscores. */
static bool parse_py_int(const jstr *s, int64_t base, int64_t *out) {
    size_t a = 0, b = s->len, l, st;
    while (a < b && jj_py_space(u8dec(s->s + a, b - a, &l))) a += l;
    while (b > a && jj_py_space(u8prev(s->s, a, b, &st))) b = st;
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
        int d = jj_is_digit(c) ? c - '0' : ((c | 32) >= 'a' && (c | 32) <= 'z') ? (c | 32) - 'a' + 10 : 99;
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
        case '&': ok = jj_bputs(j, &b, "&amp;"); break;
        case '<': ok = jj_bputs(j, &b, "&lt;"); break;
        case '>': ok = jj_bputs(j, &b, "&gt;"); break;
        case '"': ok = jj_bputs(j, &b, "&#34;"); break;
        case '\'': ok = jj_bputs(j, &b, "&#39;"); break;
        default: ok = jj_bputc(j, &b, s[i]); break;
        }
    }
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

/* select/reject/selectattr/rejectattr: keeps items whose test (or truth) equals `keep`. */
/* Jinja2's select/reject/selectattr/rejectattr/map start with `if value:`: a falsy input (none,
 * an empty string, 0) gives an empty sequence before the arguments are even looked at. */
static bool falsy_gives_empty(J *j, jv v, jv *out) {
    if (jj_truthy(v)) return false;
    jlist *empty = jj_list_new(j, 0);
    if (empty) *out = list_val(empty);
    return true;
}

static bool filter_select(J *j, jv v, const jargs *a, bool by_attr, bool keep, jv *out) {
    if (falsy_gives_empty(j, v, out)) return !j->failed;
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    size_t first = by_attr ? 1 : 0;
    const jv *attr = by_attr ? jj_arg(a, 0, NULL) : NULL;
    if (by_attr && !attr) { jj_unref(list_val(items)); jj_rterr(j, NULL, "missing parameter for attribute name"); return false; }
    const jv *testname = jj_arg(a, first, NULL);
    if (testname && testname->t != T_STR) { jj_unref(list_val(items)); jj_rterr(j, NULL, "test name must be a string"); return false; }
    jargs sub = {0};
    if (a->npos > first + 1) { sub.pos = a->pos + first + 1; sub.npos = a->npos - first - 1; }
    sub.kwn = a->kwn;
    sub.kwv = a->kwv;
    sub.nkw = a->nkw;
    jlist *res = jj_list_new(j, 0);
    bool ok = res != NULL;
    for (size_t i = 0; ok && i < items->n; i++) {
        jv x;
        if (!(ok = attr_path(j, items->v[i], attr, &x))) break;
        bool r;
        if (testname) ok = jj_run_test(j, testname->u.s->s, x, &sub, &r);
        else r = jj_truthy(x);
        jj_unref(x);
        if (ok && r == keep) ok = jj_list_push(j, res, ref(items->v[i]));
    }
    jj_unref(list_val(items));
    if (!ok) { if (res) jj_unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

static bool f_map(J *j, jv v, const jargs *a, jv *out) {
    if (falsy_gives_empty(j, v, out)) return !j->failed;
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    const jv *attr = NULL, *dflt = NULL;
    for (size_t i = 0; i < a->nkw; i++) {
        if (strcmp(a->kwn[i], "attribute") == 0) attr = &a->kwv[i];
        else if (strcmp(a->kwn[i], "default") == 0) dflt = &a->kwv[i];
    }
    jlist *res = jj_list_new(j, items->n);
    bool ok = res != NULL;
    if (ok && !attr && (a->npos == 0 || a->pos[0].t != T_STR)) {
        jj_rterr(j, NULL, "map requires a filter name or attribute=");
        ok = false;
    }
    jargs sub = {0};
    if (!attr && a->npos > 1) { sub.pos = a->pos + 1; sub.npos = a->npos - 1; }
    if (!attr) { sub.kwn = a->kwn; sub.kwv = a->kwv; sub.nkw = a->nkw; }
    for (size_t i = 0; ok && i < items->n; i++) {
        jv x;
        if (attr) {
            ok = attr_path(j, items->v[i], attr, &x);
            if (ok && x.t == T_UNDEF && dflt) { jj_unref(x); x = ref(*dflt); }
        } else {
            ok = jj_apply_filter(j, a->pos[0].u.s->s, items->v[i], &sub, &x);
        }
        if (ok) ok = jj_list_push(j, res, x);
    }
    jj_unref(list_val(items));
    if (!ok) { if (res) jj_unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

/* sort, unique, min, max, dictsort share the key machinery. */
static bool f_sort(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"reverse", "case_sensitive", "attribute", NULL};
    if (!jj_check_args(j, a, 3, kw, "sort")) return false;
    const jv *rev = jj_arg(a, 0, "reverse"), *cs = jj_arg(a, 1, "case_sensitive"), *attr = jj_arg(a, 2, "attribute");
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    size_t n = items->n;
    jv *keys = jj_jmalloc(j, (n ? n : 1) * sizeof(jv));
    size_t *idx = jj_jmalloc(j, (n ? n : 1) * sizeof(size_t));
    bool ok = keys && idx;
    size_t nk = 0;
    for (; ok && nk < n; nk++) {
        idx[nk] = nk;
        if (!(ok = sort_key(j, items->v[nk], attr, cs && jj_truthy(*cs), &keys[nk]))) break;
    }
    if (ok) ok = sort_idx(j, keys, idx, n, rev && jj_truthy(*rev));
    jlist *res = ok ? jj_list_new(j, n) : NULL;
    if (ok && !res) ok = false;
    for (size_t i = 0; ok && i < n; i++) ok = jj_list_push(j, res, ref(items->v[idx[i]]));
    for (size_t i = 0; keys && i < nk; i++) jj_unref(keys[i]);
    free(keys);
    free(idx);
    jj_unref(list_val(items));
    if (!ok) { if (res) jj_unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

static bool f_unique(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"case_sensitive", "attribute", NULL};
    if (!jj_check_args(j, a, 2, kw, "unique")) return false;
    const jv *cs = jj_arg(a, 0, "case_sensitive"), *attr = jj_arg(a, 1, "attribute");
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    jlist *res = jj_list_new(j, 0), *seen = jj_list_new(j, 0);
    bool ok = res && seen;
    for (size_t i = 0; ok && i < items->n; i++) {
        jv k;
        if (!(ok = sort_key(j, items->v[i], attr, cs && jj_truthy(*cs), &k))) break;
        bool dup = false;
        if (!(ok = jj_charge(j, seen->n))) { jj_unref(k); break; }
        for (size_t s = 0; s < seen->n && !dup; s++) dup = jj_jv_eq(seen->v[s], k, 0);
        if (dup) { jj_unref(k); continue; }
        ok = jj_list_push(j, seen, k) && jj_list_push(j, res, ref(items->v[i]));
    }
    jj_unref(list_val(items));
    if (seen) jj_unref(list_val(seen));
    if (!ok) { if (res) jj_unref(list_val(res)); return false; }
    *out = list_val(res);
    return true;
}

static bool f_minmax(J *j, jv v, const jargs *a, bool want_max, jv *out) {
    static const char *const kw[] = {"case_sensitive", "attribute", NULL};
    if (!jj_check_args(j, a, 2, kw, want_max ? "max" : "min")) return false;
    const jv *cs = jj_arg(a, 0, "case_sensitive"), *attr = jj_arg(a, 1, "attribute");
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    bool ok = true;
    size_t best = SIZE_MAX;
    jv bestk = mk_undef();
    for (size_t i = 0; ok && i < items->n; i++) {
        jv k;
        if (!(ok = sort_key(j, items->v[i], attr, cs && jj_truthy(*cs), &k))) break;
        int c = 0;
        if (best != SIZE_MAX) ok = jj_jv_cmp(j, k, bestk, want_max ? ">" : "<", &c, 0);
        if (ok && (best == SIZE_MAX || (want_max ? c == 1 : c == -1))) { jj_unref(bestk); bestk = k; best = i; }
        else jj_unref(k);
    }
    jj_unref(bestk);
    if (ok) *out = best == SIZE_MAX ? jj_mk_undef_msg(j, "No aggregated item, sequence was empty.") : ref(items->v[best]);
    jj_unref(list_val(items));
    return ok && !j->failed;
}

static bool f_dictsort(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"case_sensitive", "by", "reverse", NULL};
    if (!jj_check_args(j, a, 3, kw, "dictsort")) return false;
    const jv *cs = jj_arg(a, 0, "case_sensitive"), *by = jj_arg(a, 1, "by"), *rev = jj_arg(a, 2, "reverse");
    if (v.t != T_DICT) { jj_rterr(j, NULL, "You can only sort by either \"key\" or \"value\" of a mapping"); return false; }
    int pos = 0;
    if (by && by->t == T_STR && strcmp(by->u.s->s, "value") == 0) pos = 1;
    else if (by && !(by->t == T_STR && strcmp(by->u.s->s, "key") == 0)) {
        jj_rterr(j, NULL, "You can only sort by either \"key\" or \"value\"");
        return false;
    }
    jdict *d = v.u.d;
    jlist *pairs = jj_list_new(j, d->n);
    bool ok = pairs != NULL;
    for (size_t i = 0; ok && i < d->n; i++) {
        jlist *p = jj_list_new(j, 2);
        if (!(ok = p != NULL)) break;
        p->tuple = true;
        ok = jj_list_push(j, p, ref(d->e[i].k)) && jj_list_push(j, p, ref(d->e[i].v)) && jj_list_push(j, pairs, list_val(p));
        if (!ok) jj_unref(list_val(p));
    }
    if (!ok) { if (pairs) jj_unref(list_val(pairs)); return false; }
    jv idx = mk_int(pos);
    jargs sa = {0};
    jv sargs[3] = {rev ? *rev : mk_bool(false), cs ? *cs : mk_bool(false), idx};
    sa.pos = sargs;
    sa.npos = 3;
    ok = f_sort(j, list_val(pairs), &sa, out);
    jj_unref(list_val(pairs));
    return ok;
}

static bool f_indent(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"width", "first", "blank", NULL};
    if (!jj_check_args(j, a, 3, kw, "indent")) return false;
    const jv *w = jj_arg(a, 0, "width"), *fi = jj_arg(a, 1, "first"), *bl = jj_arg(a, 2, "blank");
    jv s, ind;
    if (v.t == T_UNDEF) { jj_undef_err(j, NULL, v); return false; }
    if (v.t != T_STR) { jj_rterr(j, NULL, "unsupported operand type(s) for +=: '%s' and 'str'", jj_type_name(v)); return false; }
    s = ref(v);
    if (w && w->t == T_STR) ind = ref(*w);
    else {
        int64_t n;
        if (!int_arg(j, w, 4, "indent width", &n)) { jj_unref(s); return false; }
        if (n < 0) n = 0;
        if (n > 1000) n = 1000;
        char sp[1001];
        memset(sp, ' ', (size_t)n);
        if (!jj_mk_strn(j, sp, (size_t)n, &ind)) { jj_unref(s); return false; }
    }
    /* Jinja appends "\n" and then uses str.splitlines(), which splits on \n, \r\n and \r among
     * others; lines after the first get the indentation (blank ones only with blank=true). */
    jbuf b = {0};
    bool ok = true, first_line = true;
    const char *p = s.u.s->s;
    size_t n = s.u.s->len, i = 0;
    if (fi && jj_truthy(*fi)) ok = jj_bput(j, &b, ind.u.s->s, ind.u.s->len);
    while (ok && i <= n) {
        size_t e = i;
        while (e < n && p[e] != '\n' && p[e] != '\r' && p[e] != '\v' && p[e] != '\f') e++;
        if (e >= n && i >= n && !first_line) break;
        if (!first_line) {
            ok = jj_bputc(j, &b, '\n');
            if (ok && (e > i || (bl && jj_truthy(*bl)))) ok = jj_bput(j, &b, ind.u.s->s, ind.u.s->len);
        }
        if (ok) ok = jj_bput(j, &b, p + i, e - i);
        first_line = false;
        if (e >= n) break;
        i = e + ((p[e] == '\r' && e + 1 < n && p[e + 1] == '\n') ? 2 : 1);
    }
    jj_unref(s);
    jj_unref(ind);
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

static bool f_truncate(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"length", "killwords", "end", "leeway", NULL};
    if (!jj_check_args(j, a, 4, kw, "truncate")) return false;
    int64_t length, leeway;
    const jv *kwd = jj_arg(a, 1, "killwords"), *endv = jj_arg(a, 2, "end");
    if (!int_arg(j, jj_arg(a, 0, "length"), 255, "length", &length) || !int_arg(j, jj_arg(a, 3, "leeway"), 5, "leeway", &leeway))
        return false;
    jv s;
    if (v.t != T_STR) {
        /* Jinja returns short sized values as they are and fails on the rest */
        bool ok;
        size_t n = value_len(j, v, &ok);
        if (!ok) return false;
        if ((int64_t)n > length + leeway) { jj_rterr(j, NULL, "truncate needs a string, not %s", jj_type_name(v)); return false; }
        *out = ref(v);
        return true;
    }
    s = ref(v);
    const char *end = endv && endv->t == T_STR ? endv->u.s->s : "...";
    int64_t endlen = (int64_t)jj_u8len(end, strlen(end));
    int64_t len = (int64_t)jj_u8len(s.u.s->s, s.u.s->len);
    if (length < endlen || leeway < 0) { jj_unref(s); jj_rterr(j, NULL, "expected length >= len(end) and leeway >= 0"); return false; }
    if (len <= length + leeway) { *out = s; return true; }
    size_t off = 0, l;
    for (int64_t k = 0; k < length - endlen; k++) { u8dec(s.u.s->s + off, s.u.s->len - off, &l); off += l; }
    if (!(kwd && jj_truthy(*kwd))) {
        const char *sp = jj_rfind_bytes(s.u.s->s, off, " ", 1);
        if (sp) off = (size_t)(sp - s.u.s->s);
    }
    jbuf b = {0};
    bool ok = jj_bput(j, &b, s.u.s->s, off) && jj_bputs(j, &b, end);
    jj_unref(s);
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

static bool f_round(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"precision", "method", NULL};
    if (!jj_check_args(j, a, 2, kw, "round")) return false;
    int64_t prec;
    if (!int_arg(j, jj_arg(a, 0, "precision"), 0, "precision", &prec)) return false;
    const jv *m = jj_arg(a, 1, "method");
    const char *method = m && m->t == T_STR ? m->u.s->s : "common";
    if (strcmp(method, "common") && strcmp(method, "ceil") && strcmp(method, "floor")) {
        jj_rterr(j, NULL, "method must be common, ceil or floor");
        return false;
    }
    if (!is_num(v)) { jj_rterr(j, NULL, "type %s doesn't define __round__ method", jj_type_name(v)); return false; }
    if (strcmp(method, "common") == 0) {
        if (is_intlike(v) && prec >= 0) { *out = mk_int(as_int(v)); return true; }
        double x = as_dbl(v);
        if (prec > 300 || !isfinite(x)) { *out = mk_float(x); return true; }
        if (prec < -300) { *out = mk_float(0.0 * x); return true; }
        char buf[400], *end;
        if (prec >= 0) {
            /* printf rounds the exact binary value half-to-even, as Python's round() does */
            jj_fmt_c_double(buf, sizeof buf, "%*.*f", 0, (int)prec, x);
            *out = mk_float(jj_loc_strtod(buf, &end));
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
    if (!jj_check_args(j, a, 2, kw, "int")) return false;
    const jv *d = jj_arg(a, 0, "default");
    int64_t base;
    if (!int_arg(j, jj_arg(a, 1, "base"), 10, "base", &base)) return false;
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
    if (!jj_check_args(j, a, 1, kw, "float")) return false;
    const jv *d = jj_arg(a, 0, "default");
    double f;
    if (is_num(v)) { *out = mk_float(as_dbl(v)); return true; }
    if (v.t == T_STR && parse_py_float(v.u.s, &f)) { *out = mk_float(f); return true; }
    *out = d ? ref(*d) : mk_float(0.0);
    return true;
}

static bool f_first_last(J *j, jv v, bool last, jv *out) {
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    if (items->n) *out = ref(items->v[last ? items->n - 1 : 0]);
    else *out = jj_mk_undef_msg(j, "No %s item, sequence was empty.", last ? "last" : "first");
    jj_unref(list_val(items));
    return !j->failed;
}

static bool f_join(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"d", "attribute", NULL};
    if (!jj_check_args(j, a, 2, kw, "join")) return false;
    const jv *d = jj_arg(a, 0, "d"), *attr = jj_arg(a, 1, "attribute");
    jv sep = mk_undef();
    if (d && !jj_to_str(j, *d, &sep)) return false;
    jlist *items;
    if (!jj_iter_list(j, v, &items)) { jj_unref(sep); return false; }
    jbuf b = {0};
    bool ok = true;
    for (size_t i = 0; ok && i < items->n; i++) {
        if (i && sep.t == T_STR) ok = jj_bput(j, &b, sep.u.s->s, sep.u.s->len);
        jv x;
        if (ok && (ok = attr_path(j, items->v[i], attr, &x))) {
            ok = jj_put_value(j, &b, x, false, 0);
            jj_unref(x);
        }
    }
    jj_unref(list_val(items));
    jj_unref(sep);
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

static bool f_sum(J *j, jv v, const jargs *a, jv *out) {
    static const char *const kw[] = {"attribute", "start", NULL};
    if (!jj_check_args(j, a, 2, kw, "sum")) return false;
    const jv *attr = jj_arg(a, 0, "attribute"), *start = jj_arg(a, 1, "start");
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    jv acc = start ? ref(*start) : mk_int(0);
    bool ok = true;
    for (size_t i = 0; ok && i < items->n; i++) {
        jv x, r;
        if (!(ok = attr_path(j, items->v[i], attr, &x))) break;
        ok = jj_binop(j, OP_ADD, acc, x, &r);
        jj_unref(x);
        jj_unref(acc);
        acc = ok ? r : mk_undef();
    }
    jj_unref(list_val(items));
    if (!ok) { jj_unref(acc); return false; }
    *out = acc;
    return true;
}

static bool f_items(J *j, jv v, jv *out) {
    if (v.t == T_UNDEF) { jlist *l = jj_list_new(j, 0); if (!l) return false; *out = list_val(l); return true; }
    if (v.t != T_DICT) { jj_rterr(j, NULL, "Can only get item pairs from a mapping."); return false; }
    jlist *l = jj_list_new(j, v.u.d->n);
    if (!l) return false;
    *out = list_val(l);
    for (size_t i = 0; i < v.u.d->n; i++) {
        jlist *p = jj_list_new(j, 2);
        if (!p) goto fail;
        p->tuple = true;
        p->v[0] = ref(v.u.d->e[i].k);
        p->v[1] = ref(v.u.d->e[i].v);
        p->n = 2;
        p->nest = (uint16_t)((jj_nest_of(p->v[0]) > jj_nest_of(p->v[1]) ? jj_nest_of(p->v[0]) : jj_nest_of(p->v[1])) + 1);
        if (!jj_list_push(j, l, list_val(p))) goto fail;
    }
    return true;
fail:
    jj_unref(*out);
    *out = mk_undef();
    return false;
}

static bool f_wordcount(J *j, jv v, jv *out) {
    jv s;
    if (!jj_to_str(j, v, &s)) return false;
    int64_t words = 0;
    bool in = false;
    for (size_t i = 0, l; i < s.u.s->len; i += l) {
        uint32_t c = u8dec(s.u.s->s + i, s.u.s->len - i, &l);
        bool w = c == '_' || jj_cp_digit(c) || jj_cp_alpha(c) || (c >= 0x80 && c < CP_BAD && !jj_py_space(c) &&
                                                             !(c >= 0x2000 && c <= 0x206F) && !(c >= 0x3000 && c <= 0x303F));
        if (w && !in) words++;
        in = w;
    }
    jj_unref(s);
    *out = mk_int(words);
    return true;
}

static bool f_title(J *j, jv v, jv *out) {
    /* Jinja's title: words start after runs of whitespace, '-', '(', '{', '[' or '<' */
    jv s;
    if (!jj_to_str(j, v, &s)) return false;
    jbuf b = {0};
    bool ok = true, at_start = true;
    for (size_t i = 0, l; ok && i < s.u.s->len; i += l) {
        uint32_t c = u8dec(s.u.s->s + i, s.u.s->len - i, &l);
        bool sep = jj_py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
        uint32_t m = sep ? c : at_start ? jj_cp_upper(c) : jj_cp_lower(c);
        at_start = sep;
        char e[4];
        ok = jj_bput(j, &b, e, jj_u8enc(m, e));
    }
    jj_unref(s);
    if (!ok) { jj_bfree(&b); return false; }
    return jj_buf_to_str(j, &b, out);
}

static bool f_reverse(J *j, jv v, jv *out) {
    if (v.t == T_STR) {
        jbuf b = {0};
        size_t e = v.u.s->len, st;
        bool ok = true;
        while (ok && e > 0) {
            u8prev(v.u.s->s, 0, e, &st);
            ok = jj_bput(j, &b, v.u.s->s + st, e - st);
            e = st;
        }
        if (!ok) { jj_bfree(&b); return false; }
        return jj_buf_to_str(j, &b, out);
    }
    jlist *items;
    if (!jj_iter_list(j, v, &items)) return false;
    jlist *r = jj_list_new(j, items->n);
    bool ok = r != NULL;
    for (size_t i = items->n; ok && i-- > 0;) ok = jj_list_push(j, r, ref(items->v[i]));
    jj_unref(list_val(items));
    if (!ok) { if (r) jj_unref(list_val(r)); return false; }
    *out = list_val(r);
    return true;
}

bool jj_apply_filter(J *j, const char *name, jv v, const jargs *a, jv *out) {
    *out = mk_undef();
    jv s = mk_undef();
    bool ok;
#define IS(n) (strcmp(name, n) == 0)
#define NOARGS(what) if (!jj_check_args(j, a, 0, NULL, what)) return false
    if (IS("tojson")) return f_tojson(j, v, a, out);
    if (IS("trim")) {
        static const char *const kw[] = {"chars", NULL};
        if (!jj_check_args(j, a, 1, kw, "trim") || !jj_to_str(j, v, &s)) return false;
        ok = do_strip(j, s.u.s->s, s.u.s->len, jj_arg(a, 0, "chars"), true, true, out);
        jj_unref(s);
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
        if (!jj_to_str(j, v, &s)) return false;
        ok = map_case(j, s.u.s->s, s.u.s->len, IS("upper") ? CASE_UPPER : IS("lower") ? CASE_LOWER : CASE_CAPITALIZE, out);
        jj_unref(s);
        return ok;
    }
    if (IS("title")) { NOARGS(name); return f_title(j, v, out); }
    if (IS("default") || IS("d")) {
        static const char *const kw[] = {"default_value", "boolean", NULL};
        if (!jj_check_args(j, a, 2, kw, "default")) return false;
        const jv *d = jj_arg(a, 0, "default_value"), *bo = jj_arg(a, 1, "boolean");
        if (v.t == T_UNDEF || (bo && jj_truthy(*bo) && !jj_truthy(v))) {
            if (d) *out = ref(*d);
            else return jj_mk_str(j, "", out);
        } else {
            *out = ref(v);
        }
        return true;
    }
    if (IS("replace")) {
        static const char *const kw[] = {"old", "new", "count", NULL};
        if (!jj_check_args(j, a, 3, kw, "replace")) return false;
        const jv *o = jj_arg(a, 0, "old"), *n = jj_arg(a, 1, "new");
        if (!o || !n) { jj_rterr(j, NULL, "replace() needs old and new"); return false; }
        int64_t cnt;
        jv os = mk_undef(), ns = mk_undef();
        ok = int_arg(j, jj_arg(a, 2, "count"), -1, "count", &cnt) && jj_to_str(j, v, &s) && jj_to_str(j, *o, &os) && jj_to_str(j, *n, &ns);
        if (ok) ok = do_replace(j, s.u.s, os.u.s, ns.u.s, cnt, out);
        jj_unref(s);
        jj_unref(os);
        jj_unref(ns);
        return ok;
    }
    if (IS("join")) return f_join(j, v, a, out);
    if (IS("items")) { NOARGS(name); return f_items(j, v, out); }
    if (IS("first") || IS("last")) { NOARGS(name); return f_first_last(j, v, IS("last"), out); }
    if (IS("list")) {
        NOARGS(name);
        jlist *l;
        if (!jj_iter_list(j, v, &l)) return false;
        if (l->tuple) {
            jv t = list_val(l);
            jlist *c = jj_list_new(j, l->n);
            ok = c != NULL;
            for (size_t i = 0; ok && i < l->n; i++) ok = jj_list_push(j, c, ref(l->v[i]));
            jj_unref(t);
            if (!ok) { if (c) jj_unref(list_val(c)); return false; }
            l = c;
        }
        *out = list_val(l);
        return true;
    }
    if (IS("string")) { NOARGS(name); return jj_to_str(j, v, out); }
    if (IS("int")) return f_int(j, v, a, out);
    if (IS("float")) return f_float(j, v, a, out);
    if (IS("abs")) {
        NOARGS(name);
        if (v.t == T_FLOAT) { *out = mk_float(fabs(v.u.f)); return true; }
        if (is_intlike(v)) return jj_int_result(j, as_int(v) == INT64_MIN, as_int(v) < 0 ? -as_int(v) : as_int(v), out);
        jj_rterr(j, NULL, "bad operand type for abs(): '%s'", jj_type_name(v));
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
        if (!jj_check_args(j, a, 1, kw, "center") || !int_arg(j, jj_arg(a, 0, "width"), 80, "width", &w) || !jj_to_str(j, v, &s))
            return false;
        ok = pad_str(j, s.u.s->s, s.u.s->len, w, '^', " ", out);
        jj_unref(s);
        return ok;
    }
    if (IS("safe")) { NOARGS(name); *out = ref(v); return true; }
    if (IS("escape") || IS("e") || IS("forceescape")) {
        NOARGS(name);
        if (!jj_to_str(j, v, &s)) return false;
        ok = html_escape(j, s.u.s->s, s.u.s->len, out);
        jj_unref(s);
        return ok;
    }
    if (IS("pprint")) {
        NOARGS(name);
        jbuf b = {0};
        if (!jj_put_value(j, &b, v, true, 0)) { jj_bfree(&b); return false; }
        return jj_buf_to_str(j, &b, out);
    }
    if (IS("attr")) {
        if (a->npos != 1 || a->pos[0].t != T_STR) { jj_rterr(j, NULL, "attr() needs an attribute name"); return false; }
        if (v.t == T_DICT) {
            int mid = jj_method_id(T_DICT, a->pos[0].u.s->s);
            if (mid) return jj_mk_method(j, mid, v, out);
            *out = jj_undef_attr(j, v, a->pos[0].u.s->s);
            return !j->failed;
        }
        return jj_get_attr(j, v, a->pos[0].u.s->s, out);
    }
    if (IS("format")) {
        if (!jj_to_str(j, v, &s)) return false;
        if (a->nkw) {
            jdict *d = jj_dict_new(j);
            ok = d != NULL;
            for (size_t i = 0; ok && i < a->nkw; i++) ok = jj_dict_set_cstr(j, d, a->kwn[i], ref(a->kwv[i]));
            if (ok) ok = jj_py_format(j, s.u.s->s, s.u.s->len, dict_val(d), false, out);
            if (d) jj_unref(dict_val(d));
        } else {
            jlist *t = jj_list_new(j, a->npos);
            ok = t != NULL;
            if (ok) t->tuple = true;
            for (size_t i = 0; ok && i < a->npos; i++) ok = jj_list_push(j, t, ref(a->pos[i]));
            if (ok) ok = jj_py_format(j, s.u.s->s, s.u.s->len, list_val(t), true, out);
            if (t) jj_unref(list_val(t));
        }
        jj_unref(s);
        return ok;
    }
#undef IS
#undef NOARGS
    jj_rterr(j, NULL, "the '%s' filter is not supported by quill", name);
    return false;
}

/* ------------------------------------------------------------------ tests */

bool jj_run_test(J *j, const char *name, jv v, const jargs *a, bool *res) {
    *res = false;
#define IS(n) (strcmp(name, n) == 0)
    const jv *x = jj_arg(a, 0, NULL);
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
    else if (IS("filter")) *res = v.t == T_STR && jj_in_list(jj_JINJA_FILTERS, v.u.s->s);
    else if (IS("test")) *res = v.t == T_STR && jj_in_list(jj_JINJA_TESTS, v.u.s->s);
    else if (IS("lower") || IS("upper")) {
        jv s;
        if (!jj_to_str(j, v, &s)) return false;
        bool cased = false, all = true;
        for (size_t i = 0, l; i < s.u.s->len; i += l) {
            uint32_t c = u8dec(s.u.s->s + i, s.u.s->len - i, &l);
            if (!jj_cp_cased(c)) continue;
            cased = true;
            if (IS("lower") ? !jj_cp_is_lower(c) : !jj_cp_is_upper(c)) all = false;
        }
        *res = cased && all;
        jj_unref(s);
    } else if (IS("sameas")) {
        if (!x) { jj_rterr(j, NULL, "sameas needs an argument"); return false; }
        *res = heap(v) || heap(*x) ? (v.t == x->t && v.u.p == x->u.p) : jj_jv_eq(v, *x, 0) && v.t == x->t;
    } else if (IS("in")) {
        if (!x) { jj_rterr(j, NULL, "in needs an argument"); return false; }
        return jj_contains(j, *x, v, res);
    } else if (IS("odd") || IS("even") || IS("divisibleby")) {
        jv two = mk_int(2), r;
        const jv *d = IS("divisibleby") ? x : &two;
        if (!d) { jj_rterr(j, NULL, "divisibleby needs an argument"); return false; }
        if (!jj_binop(j, OP_MOD, v, *d, &r)) return false;
        *res = IS("odd") ? jj_jv_eq(r, mk_int(1), 0) : jj_jv_eq(r, mk_int(0), 0);
        jj_unref(r);
    } else {
        if (!x) { jj_rterr(j, NULL, "the '%s' test needs an argument", name); return false; }
        if (IS("==") || IS("eq") || IS("equalto")) *res = jj_jv_eq(v, *x, 0);
        else if (IS("!=") || IS("ne")) *res = !jj_jv_eq(v, *x, 0);
        else {
            int c;
            const char *sym = (IS(">") || IS("gt") || IS("greaterthan")) ? ">" : (IS(">=") || IS("ge")) ? ">="
                              : (IS("<") || IS("lt") || IS("lessthan")) ? "<" : "<=";
            if (!jj_jv_cmp(j, v, *x, sym, &c, 0)) return false;
            *res = c != 2 && (sym[0] == '>' ? (sym[1] ? c >= 0 : c > 0) : (sym[1] ? c <= 0 : c < 0));
        }
    }
#undef IS
    return true;
}

/* ------------------------------------------------------------------ methods */

bool jj_call_method(J *j, const jmethod *m, const jargs *a, jv *out) {
    *out = mk_undef();
    jv self = m->self;
    const char *mn = jj_method_name(m->id);
    const jv *a0 = jj_arg(a, 0, NULL), *a1 = jj_arg(a, 1, NULL), *a2 = jj_arg(a, 2, NULL);
    if (a->nkw && m->id != M_SPLIT && m->id != M_RSPLIT && m->id != M_SPLITLINES) {
        jj_rterr(j, NULL, "%s() takes no keyword arguments", mn);
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
            if (!jj_check_args(j, a, 2, kw, mn)) return false;
            int64_t ms;
            if (!int_arg(j, jj_arg(a, 1, "maxsplit"), -1, "maxsplit", &ms)) return false;
            return do_split(j, s, jj_arg(a, 0, "sep"), ms, m->id == M_RSPLIT, out);
        }
        case M_STARTSWITH: case M_ENDSWITH: {
            if (!a0) { jj_rterr(j, NULL, "%s() takes at least 1 argument", mn); return false; }
            const jv *cands = a0->t == T_LIST && a0->u.l->tuple ? a0->u.l->v : a0;
            size_t nc = a0->t == T_LIST && a0->u.l->tuple ? a0->u.l->n : 1;
            bool r = false;
            for (size_t i = 0; i < nc && !r; i++) {
                if (cands[i].t != T_STR) {
                    jj_rterr(j, NULL, "%s first arg must be str or a tuple of str, not %s", mn, jj_type_name(cands[i]));
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
            if (!str_arg(j, a0, "substring", &t) || !jj_charge(j, s->len / 64)) return false;
            if (m->id == M_SCOUNT) {
                int64_t c = 0;
                if (t->len == 0) c = (int64_t)jj_u8len(s->s, s->len) + 1;
                else
                    for (const char *f = s->s; (f = jj_find_bytes(f, s->len - (size_t)(f - s->s), t->s, t->len)) != NULL;
                         f += t->len)
                        c++;
                *out = mk_int(c);
                return true;
            }
            bool rev = m->id == M_RFIND || m->id == M_RINDEX;
            const char *f = rev ? jj_rfind_bytes(s->s, s->len, t->s, t->len) : jj_find_bytes(s->s, s->len, t->s, t->len);
            if (!f && (m->id == M_INDEX || m->id == M_RINDEX)) { jj_rterr(j, NULL, "substring not found"); return false; }
            *out = mk_int(f ? (int64_t)jj_u8len(s->s, (size_t)(f - s->s)) : -1);
            return true;
        }
        case M_JOIN: {
            if (!a0) { jj_rterr(j, NULL, "join() takes exactly one argument"); return false; }
            jlist *items;
            if (!jj_iter_list(j, *a0, &items)) return false;
            jbuf b = {0};
            bool ok = true;
            for (size_t i = 0; ok && i < items->n; i++) {
                if (items->v[i].t != T_STR) {
                    jj_rterr(j, NULL, "sequence item %zu: expected str instance, %s found", i, jj_type_name(items->v[i]));
                    ok = false;
                    break;
                }
                if (i) ok = jj_bput(j, &b, s->s, s->len);
                if (ok) ok = jj_bput(j, &b, items->v[i].u.s->s, items->v[i].u.s->len);
            }
            jj_unref(list_val(items));
            if (!ok) { jj_bfree(&b); return false; }
            return jj_buf_to_str(j, &b, out);
        }
        case M_SPLITLINES: {
            const jv *ke = jj_arg(a, 0, "keepends");
            bool keep = ke && jj_truthy(*ke);
            jlist *l = jj_list_new(j, 0);
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
                if (!push_str(j, l, s->s + i, (e - i) + (keep ? brk : 0))) { jj_unref(*out); *out = mk_undef(); return false; }
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
                case M_ISDIGIT: r = r && jj_cp_digit(c); break;
                case M_ISALPHA: r = r && jj_cp_alpha(c); break;
                case M_ISALNUM: r = r && (jj_cp_alpha(c) || jj_cp_digit(c)); break;
                case M_ISSPACE: r = r && jj_py_space(c); break;
                case M_ISLOWER: if (jj_cp_cased(c)) { cased = true; r = r && jj_cp_is_lower(c); } break;
                default: if (jj_cp_cased(c)) { cased = true; r = r && jj_cp_is_upper(c); } break;
                }
            }
            if (m->id == M_ISLOWER || m->id == M_ISUPPER) r = r && cased;
            *out = mk_bool(r);
            return true;
        }
        case M_CENTER: case M_LJUST: case M_RJUST: case M_ZFILL: {
            int64_t w;
            if (!a0 || !int_arg(j, a0, 0, "width", &w)) { if (!a0) jj_rterr(j, NULL, "%s() takes a width", mn); return false; }
            if (m->id == M_ZFILL) {
                int64_t len = (int64_t)jj_u8len(s->s, s->len);
                if (w <= len) { *out = ref(self); return true; }
                if (w > (int64_t)MAX_STR_BYTES) { jj_rterr(j, NULL, "string larger than %zu bytes", MAX_STR_BYTES); return false; }
                jbuf b = {0};
                size_t sg = s->len && (s->s[0] == '+' || s->s[0] == '-') ? 1 : 0;
                bool ok = jj_bput(j, &b, s->s, sg);
                for (int64_t k = len; ok && k < w; k++) ok = jj_bputc(j, &b, '0');
                if (ok) ok = jj_bput(j, &b, s->s + sg, s->len - sg);
                if (!ok) { jj_bfree(&b); return false; }
                return jj_buf_to_str(j, &b, out);
            }
            const char *fill = " ";
            if (a1) {
                if (a1->t != T_STR || jj_u8len(a1->u.s->s, a1->u.s->len) != 1) {
                    jj_rterr(j, NULL, "the fill character must be exactly one character long");
                    return false;
                }
                fill = a1->u.s->s;
            }
            return pad_str(j, s->s, s->len, w, m->id == M_CENTER ? '^' : m->id == M_LJUST ? '<' : '>', fill, out);
        }
        case M_PARTITION: case M_RPARTITION: {
            if (!str_arg(j, a0, "separator", &t)) return false;
            if (!t->len) { jj_rterr(j, NULL, "empty separator"); return false; }
            bool rev = m->id == M_RPARTITION;
            const char *f = rev ? jj_rfind_bytes(s->s, s->len, t->s, t->len) : jj_find_bytes(s->s, s->len, t->s, t->len);
            jlist *l = jj_list_new(j, 3);
            if (!l) return false;
            l->tuple = true;
            *out = list_val(l);
            bool ok;
            if (!f) ok = rev ? push_str(j, l, "", 0) && push_str(j, l, "", 0) && push_str(j, l, s->s, s->len)
                             : push_str(j, l, s->s, s->len) && push_str(j, l, "", 0) && push_str(j, l, "", 0);
            else ok = push_str(j, l, s->s, (size_t)(f - s->s)) && push_str(j, l, t->s, t->len) &&
                      push_str(j, l, f + t->len, s->len - (size_t)(f - s->s) - t->len);
            if (!ok) { jj_unref(*out); *out = mk_undef(); }
            return ok;
        }
        default: break;
        }
    } else if (self.t == T_DICT) {
        const jdict *d = self.u.d;
        if (m->id == M_GET) {
            if (!a0 || a->npos > 2) { jj_rterr(j, NULL, "get expected 1 or 2 arguments"); return false; }
            size_t i = jj_dict_find(d, *a0);
            *out = i != SIZE_MAX ? ref(d->e[i].v) : a1 ? ref(*a1) : mk_none();
            return true;
        }
        if (a->npos) { jj_rterr(j, NULL, "%s() takes no arguments", mn); return false; }
        if (m->id == M_ITEMS) return f_items(j, self, out);
        jlist *l = jj_list_new(j, d->n);
        if (!l) return false;
        *out = list_val(l);
        for (size_t i = 0; i < d->n; i++)
            if (!jj_list_push(j, l, ref(m->id == M_KEYS ? d->e[i].k : d->e[i].v))) { jj_unref(*out); *out = mk_undef(); return false; }
        return true;
    } else if (self.t == T_LIST) {
        if (!a0) { jj_rterr(j, NULL, "%s() takes exactly one argument", mn); return false; }
        int64_t c = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (jj_jv_eq(self.u.l->v[i], *a0, 0)) {
                if (m->id == M_LINDEX) { *out = mk_int((int64_t)i); return true; }
                c++;
            }
        if (m->id == M_LINDEX) { jj_rterr(j, NULL, "value is not in list"); return false; }
        *out = mk_int(c);
        return true;
    } else if (self.t == T_LOOP) {
        if (!a->npos) { jj_rterr(j, NULL, "no items for cycling given"); return false; }
        *out = ref(a->pos[self.u.lp->i % (int64_t)a->npos]);
        return true;
    }
    jj_rterr(j, NULL, "unsupported method %s", mn);
    return false;
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

