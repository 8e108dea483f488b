/* Trace recording and comparison: the tools that find where numbers leave the truth. */
#include "base/error.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *name;
    int n_dims;
    int64_t ne[3];
    float *data;
} recorded;

struct quill_trace_recorder {
    recorded *t;
    size_t n, cap;
    bool failed;
};

quill_trace_recorder *quill_trace_recorder_new(void) { return calloc(1, sizeof(quill_trace_recorder)); }

void quill_trace_recorder_free(quill_trace_recorder *r) {
    if (!r) return;
    for (size_t i = 0; i < r->n; i++) {
        free(r->t[i].name);
        free(r->t[i].data);
    }
    free(r->t);
    free(r);
}

static int64_t count(int n_dims, const int64_t *ne) {
    int64_t n = 1;
    for (int d = 0; d < n_dims; d++) n *= ne[d];
    return n;
}

void quill_trace_record(const char *name, const float *data, int n_dims, const int64_t *ne, void *user) {
    quill_trace_recorder *r = user;
    if (r->failed || n_dims < 1 || n_dims > 3) return;
    recorded *t = NULL;
    for (size_t i = 0; i < r->n; i++)
        if (!strcmp(r->t[i].name, name)) t = &r->t[i];
    int64_t add = count(n_dims, ne);
    if (t) {
        /* Same tensor from a later micro-batch: the leading dims must agree. */
        int64_t have = count(t->n_dims, t->ne);
        float *grown = t->n_dims == n_dims ? realloc(t->data, (size_t)(have + add) * sizeof(float)) : NULL;
        if (!grown) { r->failed = true; return; }
        t->data = grown;
        memcpy(t->data + have, data, (size_t)add * sizeof(float));
        t->ne[n_dims - 1] += ne[n_dims - 1];
        return;
    }
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 64;
        recorded *g = realloc(r->t, cap * sizeof *g);
        if (!g) { r->failed = true; return; }
        r->t = g;
        r->cap = cap;
    }
    t = &r->t[r->n];
    t->name = strdup(name);
    t->data = malloc((size_t)add * sizeof(float));
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        r->failed = true;
        return;
    }
    t->n_dims = n_dims;
    for (int d = 0; d < 3; d++) t->ne[d] = d < n_dims ? ne[d] : 1;
    memcpy(t->data, data, (size_t)add * sizeof(float));
    r->n++;
}

quill_status quill_trace_recorder_write(const quill_trace_recorder *r, const char *path, quill_error *err) {
    if (r->failed) return quill_fail(err, QUILL_E_NOMEM, "out of memory while recording the trace");
    quill_gguf_writer *w = quill_gguf_writer_new();
    if (!w) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    quill_gguf_writer_add_str(w, "general.architecture", "trace", 5);
    quill_gguf_writer_add_str(w, "trace.source", "quill", 5);
    quill_status s = QUILL_OK;
    for (size_t i = 0; i < r->n && !s; i++)
        s = quill_gguf_writer_add_tensor(w, r->t[i].name, QUILL_TYPE_F32, (uint32_t)r->t[i].n_dims, r->t[i].ne,
                                         r->t[i].data);
    if (s) s = quill_fail(err, s, "cannot build the trace file %s", path);
    else s = quill_gguf_writer_write(w, path, err);
    quill_gguf_writer_free(w);
    return s;
}

int64_t quill_trace_rank(const char *name) {
    static const char *const per_layer[] = {
        "attn_norm", "Qcur", "Kcur", "Vcur", "kqv_out", "attn_out", "attn_post_norm", "ffn_inp", "ffn_norm",
        "ffn_gate", "ffn_up", "ffn_moe_logits", "ffn_moe_logits_biased", "ffn_moe_probs", "ffn_moe_weights", "ffn_moe_weights_norm",
        "ffn_moe_weights_softmax", "ffn_moe_down", "ffn_shexp_gate", "ffn_shexp", "ffn_moe_out", "ffn_out", "ffn_post_norm",
        "l_out"};
    const int64_t n_stages = (int64_t)(sizeof per_layer / sizeof per_layer[0]);
    if (!strcmp(name, "inp_embd")) return 0;
    if (!strcmp(name, "result_norm")) return INT64_MAX / 4;
    if (!strcmp(name, "result_output")) return INT64_MAX / 4 + 1;
    const char *dash = strrchr(name, '-');
    if (dash && dash[1]) {
        char *end;
        long layer = strtol(dash + 1, &end, 10);
        if (!*end && layer >= 0 && layer < (1 << 20))
            for (int64_t s = 0; s < n_stages; s++)
                if ((size_t)(dash - name) == strlen(per_layer[s]) && !strncmp(name, per_layer[s], (size_t)(dash - name)))
                    return 1 + layer * n_stages + s;
    }
    return INT64_MAX / 2;
}

static int cmp_diff(const void *a, const void *b) {
    const quill_trace_diff *x = a, *y = b;
    int64_t rx = quill_trace_rank(x->name), ry = quill_trace_rank(y->name);
    if (rx != ry) return rx < ry ? -1 : 1;
    return strcmp(x->name, y->name);
}

/* A trace in memory, whichever file it came from. */
typedef struct {
    char *name;
    int64_t n;
    float *data;
} loaded;

typedef struct {
    loaded *t;
    size_t n;
} trace_file;

static void trace_file_free(trace_file *f) {
    for (size_t i = 0; i < f->n; i++) {
        free(f->t[i].name);
        free(f->t[i].data);
    }
    free(f->t);
    f->t = NULL;
    f->n = 0;
}

static quill_status push(trace_file *f, const char *name, size_t name_len, int64_t n, loaded **out, quill_error *err) {
    loaded *g = realloc(f->t, (f->n + 1) * sizeof *g);
    if (!g) return quill_fail(err, QUILL_E_NOMEM, "out of memory reading a trace");
    f->t = g;
    loaded *t = &f->t[f->n];
    t->name = malloc(name_len + 1);
    t->data = malloc((size_t)n * sizeof(float) + 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory reading a trace");
    }
    memcpy(t->name, name, name_len);
    t->name[name_len] = 0;
    t->n = n;
    f->n++;
    *out = t;
    return QUILL_OK;
}

/* The reference's refdump writes records of (u32 name length, name, 4 × i64 ne, f32 data). */
static quill_status load_records(const char *path, const uint8_t *p, size_t size, trace_file *f, quill_error *err) {
    size_t off = 0, record = 0;
    while ((record = off) < size) {
        uint32_t len;
        int64_t ne[4];
        if (size - off < 4) goto truncated;
        memcpy(&len, p + off, 4);
        if (len == 0 || len > 256 || size - off - 4 < (size_t)len + 32) goto truncated;
        const char *name = (const char *)p + off + 4;
        memcpy(ne, p + off + 4 + len, 32);
        off += 4 + (size_t)len + 32;
        int64_t n = 1;
        for (int d = 0; d < 4; d++) {
            if (ne[d] < 1 || ne[d] > ((int64_t)1 << 32) || n > (((int64_t)1 << 40) / ne[d]))
                return quill_fail(err, QUILL_E_FORMAT, "%s: record '%.*s' at byte %zu has an invalid shape", path,
                                  (int)len, name, record);
            n *= ne[d];
        }
        if ((uint64_t)n * 4 > size - off) goto truncated;
        loaded *t;
        quill_status s = push(f, name, len, n, &t, err);
        if (s) return s;
        memcpy(t->data, p + off, (size_t)n * 4);
        off += (size_t)n * 4;
    }
    return QUILL_OK;
truncated:
    return quill_fail(err, QUILL_E_FORMAT, "%s: truncated trace record at byte %zu (not a GGUF or refdump trace)", path,
                      record);
}

/* Older reference traces (../shared/golden) name the attention before the output projection
 * kqv_merged_cont-i and after it kqv_out-i; the current reference, and quill, kqv_out-i and
 * attn_out-i. */
static void rename_old_names(trace_file *f) {
    bool old = false;
    for (size_t i = 0; i < f->n && !old; i++) old = !strncmp(f->t[i].name, "kqv_merged_cont-", 16);
    if (!old) return;
    for (size_t i = 0; i < f->n; i++) {
        char *n = f->t[i].name, renamed[64];
        if (!strncmp(n, "kqv_out-", 8)) snprintf(renamed, sizeof renamed, "attn_out-%s", n + 8);
        else if (!strncmp(n, "kqv_merged_cont-", 16)) snprintf(renamed, sizeof renamed, "kqv_out-%s", n + 16);
        else continue;
        char *copy = strdup(renamed);
        if (copy) {
            free(n);
            f->t[i].name = copy;
        }
    }
}

static quill_status load_trace(const char *path, trace_file *f, quill_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return quill_fail(err, QUILL_E_IO, "cannot open %s: %s", path, strerror(errno));
    char magic[4] = {0};
    size_t got = fread(magic, 1, 4, fp);
    quill_status s = QUILL_OK;
    if (got == 4 && !memcmp(magic, "GGUF", 4)) {
        fclose(fp);
        quill_gguf *g;
        if ((s = quill_gguf_open(path, &g, err))) return s;
        for (uint64_t i = 0; i < quill_gguf_n_tensors(g) && !s; i++) {
            const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
            loaded *l;
            if (!(s = push(f, t->name, strlen(t->name), t->n_elements, &l, err)))
                s = quill_dequantize(t->type, t->data, l->data, t->n_elements, err);
        }
        quill_gguf_close(g);
    } else {
        uint8_t *buf = NULL;
        size_t size = got, cap = 0;
        if (got) {
            cap = 1 << 20;
            buf = malloc(cap);
            if (buf) memcpy(buf, magic, got);
        }
        for (size_t n; buf && (n = fread(buf + size, 1, cap - size, fp)) > 0;) {
            size += n;
            if (size == cap) {
                uint8_t *grown = cap < ((size_t)1 << 34) ? realloc(buf, cap * 2) : NULL;
                if (!grown) { free(buf); buf = NULL; break; }
                buf = grown;
                cap *= 2;
            }
        }
        fclose(fp);
        if (got && !buf) return quill_fail(err, QUILL_E_NOMEM, "out of memory reading %s", path);
        s = load_records(path, buf, size, f, err);
        free(buf);
    }
    if (s) trace_file_free(f);
    else rename_old_names(f);
    return s;
}

static const loaded *find_loaded(const trace_file *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (!strcmp(f->t[i].name, name)) return &f->t[i];
    return NULL;
}

/* The diffs of every tensor b has and a shares, in forward order; names copied after the array. */
static quill_status compare_loaded(const trace_file *a, const trace_file *b, const char *what_a, const char *what_b,
                                   double tol, quill_trace_diff **diffs, size_t *n_diffs, int64_t *first_bad,
                                   quill_error *err) {
    quill_status s = QUILL_OK;
    quill_trace_diff *out = calloc(b->n ? b->n : 1, sizeof *out);
    if (!out) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    size_t n = 0;
    for (size_t i = 0; i < b->n && !s; i++) {
        const loaded *tb = &b->t[i], *ta = find_loaded(a, tb->name);
        if (!ta) continue;
        if (ta->n != tb->n) {
            s = quill_fail(err, QUILL_E_FORMAT, "tensor '%s' has %lld elements in %s but %lld in %s", tb->name,
                           (long long)ta->n, what_a, (long long)tb->n, what_b);
            break;
        }
        quill_trace_diff *d = &out[n++];
        d->name = tb->name;
        d->n_elements = tb->n;
        double se = 0, sr = 0;
        for (int64_t k = 0; k < tb->n; k++) {
            double diff = fabs((double)ta->data[k] - tb->data[k]);
            if (!(diff <= d->max_abs)) d->max_abs = diff; /* NaN propagates */
            if (fabs(tb->data[k]) > d->max_ref) d->max_ref = fabs(tb->data[k]);
            se += diff * diff;
            sr += (double)tb->data[k] * tb->data[k];
        }
        d->rel = d->max_ref > 0 ? d->max_abs / d->max_ref : d->max_abs;
        d->rms_rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    }
    if (!s) {
        qsort(out, n, sizeof *out, cmp_diff);
        for (size_t i = 0; i < n; i++)
            if (!(out[i].rel <= tol)) { *first_bad = (int64_t)i; break; }
        /* the names live in b: one block holds the array and a copy of them */
        size_t names = 0;
        for (size_t i = 0; i < n; i++) names += strlen(out[i].name) + 1;
        quill_trace_diff *packed = malloc(n * sizeof *packed + names + 1);
        if (!packed) {
            s = quill_fail(err, QUILL_E_NOMEM, "out of memory");
        } else {
            char *p = (char *)(packed + n);
            for (size_t i = 0; i < n; i++) {
                packed[i] = out[i];
                strcpy(p, out[i].name);
                packed[i].name = p;
                p += strlen(p) + 1;
            }
            *diffs = packed;
            *n_diffs = n;
        }
    }
    free(out);
    return s;
}

quill_status quill_trace_compare(const char *path_a, const char *path_b, double tol, quill_trace_diff **diffs,
                                 size_t *n_diffs, int64_t *first_bad, quill_error *err) {
    *diffs = NULL;
    *n_diffs = 0;
    *first_bad = -1;
    trace_file a = {0}, b = {0};
    quill_status s = load_trace(path_a, &a, err);
    if (!s) s = load_trace(path_b, &b, err);
    if (!s) s = compare_loaded(&a, &b, path_a, path_b, tol, diffs, n_diffs, first_bad, err);
    trace_file_free(&a);
    trace_file_free(&b);
    return s;
}

/* A recorder's tensors as a trace_file that borrows its names and data. */
static quill_status view_recorder(const quill_trace_recorder *r, trace_file *f, quill_error *err) {
    if (r->failed) return quill_fail(err, QUILL_E_NOMEM, "out of memory while recording a trace");
    f->n = r->n;
    f->t = calloc(r->n ? r->n : 1, sizeof *f->t);
    if (!f->t) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    for (size_t i = 0; i < r->n; i++)
        f->t[i] = (loaded){r->t[i].name, count(r->t[i].n_dims, r->t[i].ne), r->t[i].data};
    return QUILL_OK;
}

quill_status quill_trace_compare_recorded(const quill_trace_recorder *a, const quill_trace_recorder *b, double tol,
                                          quill_trace_diff **diffs, size_t *n_diffs, int64_t *first_bad,
                                          quill_error *err) {
    *diffs = NULL;
    *n_diffs = 0;
    *first_bad = -1;
    trace_file fa = {0}, fb = {0};
    quill_status s = view_recorder(a, &fa, err);
    if (!s) s = view_recorder(b, &fb, err);
    if (!s) s = compare_loaded(&fa, &fb, "the first trace", "the second", tol, diffs, n_diffs, first_bad, err);
    free(fa.t);
    free(fb.t);
    return s;
}
