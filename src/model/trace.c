/* Trace recording and comparison: the tools that find where numbers leave the truth. */
#include "base/error.h"

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
    static const char *const per_layer[] = {"attn_norm", "Qcur", "Kcur", "Vcur", "kqv_merged_cont",
                                            "kqv_out", "ffn_inp", "ffn_norm", "ffn_out", "l_out"};
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

quill_status quill_trace_compare(const char *path_a, const char *path_b, double tol, quill_trace_diff **diffs,
                                 size_t *n_diffs, int64_t *first_bad, quill_error *err) {
    *diffs = NULL;
    *n_diffs = 0;
    *first_bad = -1;
    quill_gguf *a = NULL, *b = NULL;
    quill_status s = quill_gguf_open(path_a, &a, err);
    if (!s) s = quill_gguf_open(path_b, &b, err);
    if (s) goto done;
    uint64_t nb = quill_gguf_n_tensors(b);
    quill_trace_diff *out = calloc(nb ? nb : 1, sizeof *out);
    float *fa = NULL, *fb = NULL;
    if (!out) { s = quill_fail(err, QUILL_E_NOMEM, "out of memory"); goto done; }
    size_t n = 0;
    for (uint64_t i = 0; i < nb && !s; i++) {
        const quill_gguf_tensor *tb = quill_gguf_tensor_at(b, i);
        const quill_gguf_tensor *ta = quill_gguf_find_tensor(a, tb->name);
        if (!ta) continue;
        if (ta->n_elements != tb->n_elements || ta->ne[0] != tb->ne[0]) {
            s = quill_fail(err, QUILL_E_FORMAT,
                           "tensor '%s' has %lld elements (ne0 %lld) in %s but %lld (ne0 %lld) in %s",
                           tb->name, (long long)ta->n_elements, (long long)ta->ne[0], path_a,
                           (long long)tb->n_elements, (long long)tb->ne[0], path_b);
            break;
        }
        fa = realloc(fa, (size_t)ta->n_elements * sizeof *fa + 1);
        fb = realloc(fb, (size_t)tb->n_elements * sizeof *fb + 1);
        if (!fa || !fb) { s = quill_fail(err, QUILL_E_NOMEM, "out of memory"); break; }
        if ((s = quill_dequantize(ta->type, ta->data, fa, ta->n_elements, err))) break;
        if ((s = quill_dequantize(tb->type, tb->data, fb, tb->n_elements, err))) break;
        quill_trace_diff *d = &out[n++];
        d->name = tb->name;
        d->n_elements = tb->n_elements;
        double se = 0, sr = 0;
        for (int64_t k = 0; k < tb->n_elements; k++) {
            double diff = fabs((double)fa[k] - fb[k]);
            if (!(diff <= d->max_abs)) d->max_abs = diff; /* NaN propagates */
            if (fabs(fb[k]) > d->max_ref) d->max_ref = fabs(fb[k]);
            se += diff * diff;
            sr += (double)fb[k] * fb[k];
        }
        d->rel = d->max_ref > 0 ? d->max_abs / d->max_ref : d->max_abs;
        d->rms_rel = sr > 0 ? sqrt(se / sr) : sqrt(se);
    }
    free(fa);
    free(fb);
    if (s) { free(out); goto done; }
    qsort(out, n, sizeof *out, cmp_diff);
    for (size_t i = 0; i < n; i++)
        if (!(out[i].rel <= tol)) { *first_bad = (int64_t)i; break; }
    /* Names point into file b's mapping, which closes below: keep b open by leaking nothing —
     * copy the names into one block after the array. */
    size_t names = 0;
    for (size_t i = 0; i < n; i++) names += strlen(out[i].name) + 1;
    quill_trace_diff *packed = malloc(n * sizeof *packed + names + 1);
    if (!packed) { free(out); s = quill_fail(err, QUILL_E_NOMEM, "out of memory"); goto done; }
    char *p = (char *)(packed + n);
    for (size_t i = 0; i < n; i++) {
        packed[i] = out[i];
        strcpy(p, out[i].name);
        packed[i].name = p;
        p += strlen(p) + 1;
    }
    free(out);
    *diffs = packed;
    *n_diffs = n;
done:
    quill_gguf_close(a);
    quill_gguf_close(b);
    return s;
}
