/* GGUF v3 writer: metadata and tensors are accumulated in memory and written in one pass, with
 * the tensor directory's offsets computed at write time. Used for traces, quantized models,
 * synthetic models and test fixtures. */
#include "error.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *data;
    size_t len, cap;
    bool failed;
} buffer;

typedef struct {
    char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
    void *data;
    size_t nbytes;
} pending_tensor;

struct quill_gguf_writer {
    buffer kv;
    uint64_t n_kv;
    pending_tensor *tensors;
    uint64_t n_tensors, cap_tensors;
    uint32_t alignment;
    bool failed;
};

static void put(buffer *b, const void *p, size_t n) {
    if (b->failed) return;
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n) cap *= 2;
        uint8_t *d = realloc(b->data, cap);
        if (!d) { b->failed = true; return; }
        b->data = d;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, n);
    b->len += n;
}
static void put_u32(buffer *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(buffer *b, uint64_t v) { put(b, &v, 8); }
static void put_str(buffer *b, const char *s, size_t len) { put_u64(b, len); put(b, s, len); }

quill_gguf_writer *quill_gguf_writer_new(void) {
    quill_gguf_writer *w = calloc(1, sizeof *w);
    if (w) w->alignment = 32;
    return w;
}

void quill_gguf_writer_free(quill_gguf_writer *w) {
    if (!w) return;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w->kv.data);
    free(w);
}

void quill_gguf_writer_set_alignment(quill_gguf_writer *w, uint32_t alignment) {
    w->alignment = alignment;
    quill_gguf_writer_add_u32(w, "general.alignment", alignment);
}

static quill_status begin_kv(quill_gguf_writer *w, const char *key, uint32_t type) {
    put_str(&w->kv, key, strlen(key));
    put_u32(&w->kv, type);
    w->n_kv++;
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

static quill_status scalar(quill_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n) {
    begin_kv(w, key, type);
    put(&w->kv, v, n);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_u32(quill_gguf_writer *w, const char *key, uint32_t v) {
    return scalar(w, key, QUILL_GGUF_UINT32, &v, 4);
}
quill_status quill_gguf_writer_add_i32(quill_gguf_writer *w, const char *key, int32_t v) {
    return scalar(w, key, QUILL_GGUF_INT32, &v, 4);
}
quill_status quill_gguf_writer_add_u64(quill_gguf_writer *w, const char *key, uint64_t v) {
    return scalar(w, key, QUILL_GGUF_UINT64, &v, 8);
}
quill_status quill_gguf_writer_add_f32(quill_gguf_writer *w, const char *key, float v) {
    return scalar(w, key, QUILL_GGUF_FLOAT32, &v, 4);
}
quill_status quill_gguf_writer_add_bool(quill_gguf_writer *w, const char *key, bool v) {
    uint8_t b = v;
    return scalar(w, key, QUILL_GGUF_BOOL, &b, 1);
}
quill_status quill_gguf_writer_add_str(quill_gguf_writer *w, const char *key, const char *s, size_t len) {
    begin_kv(w, key, QUILL_GGUF_STRING);
    put_str(&w->kv, s, len);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

static size_t elem_size(uint32_t t) {
    switch (t) {
    case QUILL_GGUF_UINT8: case QUILL_GGUF_INT8: case QUILL_GGUF_BOOL: return 1;
    case QUILL_GGUF_UINT16: case QUILL_GGUF_INT16: return 2;
    case QUILL_GGUF_UINT32: case QUILL_GGUF_INT32: case QUILL_GGUF_FLOAT32: return 4;
    case QUILL_GGUF_UINT64: case QUILL_GGUF_INT64: case QUILL_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

quill_status quill_gguf_writer_add_arr(quill_gguf_writer *w, const char *key, uint32_t elem_type,
                                       const void *elems, uint64_t count) {
    size_t es = elem_size(elem_type);
    if (!es) return QUILL_E_ARG;
    begin_kv(w, key, QUILL_GGUF_ARRAY);
    put_u32(&w->kv, elem_type);
    put_u64(&w->kv, count);
    put(&w->kv, elems, es * count);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_str_arr(quill_gguf_writer *w, const char *key,
                                           const char *const *strs, const size_t *lens, uint64_t count) {
    begin_kv(w, key, QUILL_GGUF_ARRAY);
    put_u32(&w->kv, QUILL_GGUF_STRING);
    put_u64(&w->kv, count);
    for (uint64_t i = 0; i < count; i++) put_str(&w->kv, strs[i], lens ? lens[i] : strlen(strs[i]));
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_value(quill_gguf_writer *w, const char *key, const quill_gguf_value *v) {
    begin_kv(w, key, v->type);
    /* A value's bytes in the source file are exactly its serialized form minus nothing: scalars
     * are raw, strings carry their length before `data`, arrays their header before `data`. */
    if (v->type == QUILL_GGUF_STRING) put_str(&w->kv, (const char *)v->data, v->count);
    else if (v->type == QUILL_GGUF_ARRAY) put(&w->kv, v->data - 12, v->nbytes);
    else put(&w->kv, v->data, v->nbytes);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_tensor(quill_gguf_writer *w, const char *name, uint32_t type,
                                          uint32_t n_dims, const int64_t *ne, const void *data) {
    if (n_dims == 0 || n_dims > 4 || !quill_type_traits_of(type)) return QUILL_E_ARG;
    if (w->n_tensors == w->cap_tensors) {
        uint64_t cap = w->cap_tensors ? w->cap_tensors * 2 : 16;
        pending_tensor *t = realloc(w->tensors, cap * sizeof *t);
        if (!t) return QUILL_E_NOMEM;
        w->tensors = t;
        w->cap_tensors = cap;
    }
    pending_tensor *t = &w->tensors[w->n_tensors];
    memset(t, 0, sizeof *t);
    t->type = type;
    t->n_dims = n_dims;
    int64_t rows = 1;
    for (uint32_t d = 0; d < 4; d++) {
        t->ne[d] = d < n_dims ? ne[d] : 1;
        if (d > 0) rows *= t->ne[d];
    }
    t->nbytes = quill_row_size(type, t->ne[0]) * (size_t)rows;
    t->name = strdup(name);
    t->data = malloc(t->nbytes ? t->nbytes : 1);
    if (!t->name || !t->data) {
        free(t->name);
        free(t->data);
        return QUILL_E_NOMEM;
    }
    memcpy(t->data, data, t->nbytes);
    w->n_tensors++;
    return QUILL_OK;
}

static size_t pad_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

quill_status quill_gguf_writer_write(quill_gguf_writer *w, const char *path, quill_error *err) {
    if (w->kv.failed) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory building GGUF", path);
    buffer head = {0};
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, w->n_tensors);
    put_u64(&head, w->n_kv);
    put(&head, w->kv.data, w->kv.len);
    size_t offset = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        pending_tensor *t = &w->tensors[i];
        put_str(&head, t->name, strlen(t->name));
        put_u32(&head, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&head, (uint64_t)t->ne[d]);
        put_u32(&head, t->type);
        put_u64(&head, offset);
        offset = pad_to(offset + t->nbytes, w->alignment);
    }
    static const uint8_t zeros[64];
    size_t pad = pad_to(head.len, w->alignment) - head.len;
    while (pad > 0) {
        size_t n = pad < sizeof zeros ? pad : sizeof zeros;
        put(&head, zeros, n);
        pad -= n;
    }
    if (head.failed) {
        free(head.data);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory building GGUF", path);
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        free(head.data);
        return quill_fail(err, QUILL_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(head.data, 1, head.len, f) == head.len;
    free(head.data);
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        pending_tensor *t = &w->tensors[i];
        ok = fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
        size_t tail = pad_to(t->nbytes, w->alignment) - t->nbytes;
        while (ok && tail > 0) {
            size_t n = tail < sizeof zeros ? tail : sizeof zeros;
            ok = fwrite(zeros, 1, n, f) == n;
            tail -= n;
        }
    }
    if (fclose(f) != 0) ok = false;
    if (!ok) return quill_fail(err, QUILL_E_IO, "%s: write failed (disk full?)", path);
    return QUILL_OK;
}
