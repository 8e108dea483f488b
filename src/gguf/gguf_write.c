/* GGUF v3 writer: metadata and tensors are accumulated in memory and written in one pass, with
 * the tensor directory's offsets computed at write time. Used for traces, quantized models,
 * synthetic models and test fixtures. */
#include "base/error.h"
#include "gguf/gguf_internal.h"

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
    char **keys;              /* every key added, to refuse duplicates (the reader rejects them) */
    uint64_t cap_keys;
    pending_tensor *tensors;
    uint64_t n_tensors, cap_tensors;
    uint32_t alignment;
    size_t alignment_at;      /* where general.alignment's value is in `kv`; 0 until it is added */
    bool failed;              /* an invalid alignment was set: writing fails */
    /* streaming (see quill_gguf_writer_begin_stream) */
    bool declaring;           /* add_tensor is declaring a tensor without data */
    FILE *stream;             /* open between begin_stream and finish_stream */
    char *stream_buffer;      /* its stdio buffer (open_for_writing) */
    char *stream_path;
    uint64_t stream_cur;      /* tensor the next streamed bytes belong to */
    size_t stream_written;    /* bytes of it written so far */
    bool stream_failed;
};

static void put(buffer *b, const void *p, size_t n) {
    if (b->failed || n == 0) return; /* p may be NULL when n is 0: memcpy must not see it */
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
    if (w->stream) fclose(w->stream);
    free(w->stream_buffer);
    free(w->stream_path);
    for (uint64_t i = 0; i < w->n_kv; i++) free(w->keys[i]);
    free(w->keys);
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        free(w->tensors[i].name);
        free(w->tensors[i].data);
    }
    free(w->tensors);
    free(w->kv.data);
    free(w);
}

/* general.alignment decides where the data goes, so the writer owns it: it must be a u32 power
 * of two (as the reader demands), and setting it again updates the one key instead of adding a
 * duplicate. */
static bool is_alignment_key(const char *key) { return strcmp(key, "general.alignment") == 0; }

static quill_status begin_kv(quill_gguf_writer *w, const char *key, uint32_t type) {
    if (w->stream) return QUILL_E_ARG; /* the header is already on disk */
    if (is_alignment_key(key) && type != QUILL_GGUF_UINT32) return QUILL_E_ARG;
    for (uint64_t i = 0; i < w->n_kv; i++)
        if (strcmp(w->keys[i], key) == 0) return QUILL_E_ARG;
    if (w->n_kv == w->cap_keys) {
        uint64_t cap = w->cap_keys ? w->cap_keys * 2 : 32;
        char **keys = realloc(w->keys, cap * sizeof *keys);
        if (!keys) return QUILL_E_NOMEM;
        w->keys = keys;
        w->cap_keys = cap;
    }
    if (!(w->keys[w->n_kv] = strdup(key))) return QUILL_E_NOMEM;
    put_str(&w->kv, key, strlen(key));
    put_u32(&w->kv, type);
    w->n_kv++;
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

static quill_status set_alignment(quill_gguf_writer *w, uint32_t alignment) {
    if (w->stream) return QUILL_E_ARG;
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20)) return QUILL_E_ARG;
    if (w->alignment_at) {
        memcpy(w->kv.data + w->alignment_at, &alignment, 4);
    } else {
        quill_status s = begin_kv(w, "general.alignment", QUILL_GGUF_UINT32);
        if (s) return s;
        w->alignment_at = w->kv.len;
        put_u32(&w->kv, alignment);
        if (w->kv.failed) return QUILL_E_NOMEM;
    }
    w->alignment = alignment;
    return QUILL_OK;
}

void quill_gguf_writer_set_alignment(quill_gguf_writer *w, uint32_t alignment) {
    if (set_alignment(w, alignment) != QUILL_OK) w->failed = true;
}

static quill_status scalar(quill_gguf_writer *w, const char *key, uint32_t type, const void *v, size_t n) {
    quill_status s = begin_kv(w, key, type);
    if (s) return s;
    put(&w->kv, v, n);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_u32(quill_gguf_writer *w, const char *key, uint32_t v) {
    if (is_alignment_key(key)) return set_alignment(w, v);
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
    quill_status st = begin_kv(w, key, QUILL_GGUF_STRING);
    if (st) return st;
    put_str(&w->kv, s, len);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_arr(quill_gguf_writer *w, const char *key, uint32_t elem_type,
                                       const void *elems, uint64_t count) {
    size_t es = quill_gguf_scalar_size(elem_type);
    if (!es) return QUILL_E_ARG;
    quill_status s = begin_kv(w, key, QUILL_GGUF_ARRAY);
    if (s) return s;
    put_u32(&w->kv, elem_type);
    put_u64(&w->kv, count);
    put(&w->kv, elems, es * count);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_str_arr(quill_gguf_writer *w, const char *key,
                                           const char *const *strs, const size_t *lens, uint64_t count) {
    quill_status s = begin_kv(w, key, QUILL_GGUF_ARRAY);
    if (s) return s;
    put_u32(&w->kv, QUILL_GGUF_STRING);
    put_u64(&w->kv, count);
    for (uint64_t i = 0; i < count; i++) put_str(&w->kv, strs[i], lens ? lens[i] : strlen(strs[i]));
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_value(quill_gguf_writer *w, const char *key, const quill_gguf_value *v) {
    if (v->type >= QUILL_GGUF_TYPE_COUNT) return QUILL_E_ARG;
    if (is_alignment_key(key) && v->type == QUILL_GGUF_UINT32) {
        uint32_t a;
        memcpy(&a, v->data, 4);
        return set_alignment(w, a);
    }
    quill_status s = begin_kv(w, key, v->type);
    if (s) return s;
    /* A value's bytes in the source file are exactly its serialized form minus nothing: scalars
     * are raw, strings carry their length before `data`, arrays their header before `data`. */
    if (v->type == QUILL_GGUF_STRING) put_str(&w->kv, (const char *)v->data, v->count);
    else if (v->type == QUILL_GGUF_ARRAY) put(&w->kv, v->data - 12, v->nbytes);
    else put(&w->kv, v->data, v->nbytes);
    return w->kv.failed ? QUILL_E_NOMEM : QUILL_OK;
}

quill_status quill_gguf_writer_add_tensor(quill_gguf_writer *w, const char *name, uint32_t type,
                                          uint32_t n_dims, const int64_t *ne, const void *data) {
    const quill_type_traits *tr = quill_type_traits_of(type);
    if (n_dims == 0 || n_dims > 4 || !tr || w->stream) return QUILL_E_ARG;
    /* Refuse what the reader would reject: bad shapes and duplicate names. */
    int64_t span = 1, n = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] < 0 || (ne[d] > 1 && span > INT64_MAX / ne[d])) return QUILL_E_ARG;
        if (ne[d]) span *= ne[d];
        n *= ne[d];
    }
    if (ne[0] % tr->block_size != 0 || (n > 0 && !data && !w->declaring)) return QUILL_E_ARG;
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (strcmp(w->tensors[i].name, name) == 0) return QUILL_E_ARG;
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
    t->data = w->declaring ? NULL : malloc(t->nbytes ? t->nbytes : 1); /* declared: streamed later */
    if (!t->name || (!t->data && !w->declaring)) {
        free(t->name);
        free(t->data);
        return QUILL_E_NOMEM;
    }
    if (t->nbytes && t->data) memcpy(t->data, data, t->nbytes);
    w->n_tensors++;
    return QUILL_OK;
}

static size_t pad_to(size_t n, size_t a) { return (n + a - 1) / a * a; }

static const uint8_t zeros[64];

/* Everything before the tensor data: header, metadata, tensor directory, padding. On failure the
 * buffer is freed and *err filled. */
static quill_status build_head(const quill_gguf_writer *w, const char *path, buffer *out, quill_error *err) {
    if (w->failed)
        return quill_fail(err, QUILL_E_ARG, "%s: the GGUF alignment set on the writer is not a power of "
                          "two from 1 to 1048576", path);
    if (w->kv.failed) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory building GGUF", path);
    buffer head = {0};
    put(&head, "GGUF", 4);
    put_u32(&head, 3);
    put_u64(&head, w->n_tensors);
    put_u64(&head, w->n_kv);
    put(&head, w->kv.data, w->kv.len);
    size_t offset = 0;
    for (uint64_t i = 0; i < w->n_tensors; i++) {
        const pending_tensor *t = &w->tensors[i];
        put_str(&head, t->name, strlen(t->name));
        put_u32(&head, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++) put_u64(&head, (uint64_t)t->ne[d]);
        put_u32(&head, t->type);
        put_u64(&head, offset);
        offset = pad_to(offset + t->nbytes, w->alignment);
    }
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
    *out = head;
    return QUILL_OK;
}

/* The file opened for writing through a 4 MiB buffer (*buffer, to free after fclose; NULL if stdio
 * kept its own): the kernel then receives writes of 4 MiB at offsets that are multiples of it, and
 * a file system with large folios (ext4 since Linux 6.16) caches the file in 2 MiB folios, which
 * the loader's mapping takes with one page-table entry each (see quill_gguf_open). stdio's own
 * 4 KiB writes left quantized models in 4 KiB pages. */
#define WRITE_BUFFER ((size_t)4 << 20)
static FILE *open_for_writing(const char *path, char **buffer) {
    FILE *f = fopen(path, "wb");
    *buffer = f ? malloc(WRITE_BUFFER) : NULL;
    if (*buffer && setvbuf(f, *buffer, _IOFBF, WRITE_BUFFER) != 0) {
        free(*buffer);
        *buffer = NULL;
    }
    return f;
}

quill_status quill_gguf_writer_write(quill_gguf_writer *w, const char *path, quill_error *err) {
    if (w->stream) return quill_fail(err, QUILL_E_ARG, "%s: the writer is streaming to %s", path, w->stream_path);
    for (uint64_t i = 0; i < w->n_tensors; i++)
        if (!w->tensors[i].data && w->tensors[i].nbytes)
            return quill_fail(err, QUILL_E_ARG, "%s: tensor '%s' was declared without data: write it with "
                              "quill_gguf_writer_begin_stream / stream_data", path, w->tensors[i].name);
    buffer head;
    quill_status s = build_head(w, path, &head, err);
    if (s) return s;
    char *buffer;
    FILE *f = open_for_writing(path, &buffer);
    if (!f) {
        free(head.data);
        return quill_fail(err, QUILL_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    bool ok = fwrite(head.data, 1, head.len, f) == head.len;
    free(head.data);
    for (uint64_t i = 0; ok && i < w->n_tensors; i++) {
        pending_tensor *t = &w->tensors[i];
        ok = !t->nbytes || fwrite(t->data, 1, t->nbytes, f) == t->nbytes;
        size_t tail = pad_to(t->nbytes, w->alignment) - t->nbytes;
        while (ok && tail > 0) {
            size_t n = tail < sizeof zeros ? tail : sizeof zeros;
            ok = fwrite(zeros, 1, n, f) == n;
            tail -= n;
        }
    }
    if (fclose(f) != 0) ok = false;
    free(buffer);
    if (!ok) return quill_fail(err, QUILL_E_IO, "%s: write failed (disk full?)", path);
    return QUILL_OK;
}

/* ---------------------------------------------------------------- streaming */

quill_status quill_gguf_writer_add_tensor_info(quill_gguf_writer *w, const char *name, uint32_t type,
                                               uint32_t n_dims, const int64_t *ne) {
    w->declaring = true;
    quill_status s = quill_gguf_writer_add_tensor(w, name, type, n_dims, ne, NULL);
    w->declaring = false;
    return s;
}

static bool stream_pad(quill_gguf_writer *w, size_t nbytes) {
    size_t tail = pad_to(nbytes, w->alignment) - nbytes;
    while (tail > 0) {
        size_t n = tail < sizeof zeros ? tail : sizeof zeros;
        if (fwrite(zeros, 1, n, w->stream) != n) return false;
        tail -= n;
    }
    return true;
}

static quill_status stream_error(quill_gguf_writer *w, quill_error *err) {
    w->stream_failed = true;
    return quill_fail(err, QUILL_E_IO, "%s: write failed (disk full?): %s", w->stream_path, strerror(errno));
}

/* Writes the tensors the stream has reached that need nothing from the caller: those added with
 * their data, and empty ones. */
static quill_status stream_advance(quill_gguf_writer *w, quill_error *err) {
    while (w->stream_cur < w->n_tensors) {
        const pending_tensor *t = &w->tensors[w->stream_cur];
        if (!t->data && t->nbytes) break;
        if (t->nbytes && fwrite(t->data, 1, t->nbytes, w->stream) != t->nbytes) return stream_error(w, err);
        if (!stream_pad(w, t->nbytes)) return stream_error(w, err);
        w->stream_cur++;
        w->stream_written = 0;
    }
    return QUILL_OK;
}

quill_status quill_gguf_writer_begin_stream(quill_gguf_writer *w, const char *path, quill_error *err) {
    if (w->stream) return quill_fail(err, QUILL_E_ARG, "%s: the writer is already streaming to %s", path, w->stream_path);
    buffer head;
    quill_status s = build_head(w, path, &head, err);
    if (s) return s;
    if (!(w->stream_path = strdup(path))) {
        free(head.data);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory building GGUF", path);
    }
    if (!(w->stream = open_for_writing(path, &w->stream_buffer))) {
        free(head.data);
        free(w->stream_path);
        w->stream_path = NULL;
        return quill_fail(err, QUILL_E_IO, "%s: cannot create: %s", path, strerror(errno));
    }
    w->stream_cur = 0;
    w->stream_written = 0;
    w->stream_failed = false;
    bool ok = fwrite(head.data, 1, head.len, w->stream) == head.len;
    free(head.data);
    if (!ok) return stream_error(w, err);
    return stream_advance(w, err);
}

quill_status quill_gguf_writer_stream_data(quill_gguf_writer *w, const void *data, size_t n, quill_error *err) {
    if (!w->stream) return quill_fail(err, QUILL_E_ARG, "GGUF writer: stream_data before begin_stream");
    if (w->stream_failed) return quill_fail(err, QUILL_E_IO, "%s: an earlier write failed", w->stream_path);
    const uint8_t *p = data;
    while (n > 0) {
        if (w->stream_cur >= w->n_tensors)
            return quill_fail(err, QUILL_E_ARG, "%s: %zu bytes of tensor data past the last declared tensor",
                              w->stream_path, n);
        const pending_tensor *t = &w->tensors[w->stream_cur];
        size_t take = t->nbytes - w->stream_written;
        if (take > n) take = n;
        if (fwrite(p, 1, take, w->stream) != take) return stream_error(w, err);
        p += take;
        n -= take;
        w->stream_written += take;
        if (w->stream_written == t->nbytes) {
            if (!stream_pad(w, t->nbytes)) return stream_error(w, err);
            w->stream_cur++;
            w->stream_written = 0;
            quill_status s = stream_advance(w, err);
            if (s) return s;
        }
    }
    return QUILL_OK;
}

quill_status quill_gguf_writer_finish_stream(quill_gguf_writer *w, quill_error *err) {
    if (!w->stream) return quill_fail(err, QUILL_E_ARG, "GGUF writer: finish_stream before begin_stream");
    bool ok = !w->stream_failed;
    if (fclose(w->stream) != 0) ok = false;
    w->stream = NULL;
    free(w->stream_buffer);
    w->stream_buffer = NULL;
    quill_status s = QUILL_OK;
    if (!ok) {
        s = quill_fail(err, QUILL_E_IO, "%s: write failed (disk full?)", w->stream_path);
    } else if (w->stream_cur < w->n_tensors) {
        const pending_tensor *t = &w->tensors[w->stream_cur];
        s = quill_fail(err, QUILL_E_ARG, "%s: incomplete: tensor '%s' has %zu of its %zu bytes", w->stream_path,
                       t->name, w->stream_written, t->nbytes);
    }
    free(w->stream_path);
    w->stream_path = NULL;
    return s;
}
