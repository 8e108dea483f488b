/* Hand-crafting GGUF bytes for the reader's tests and the malformed corpus: a growable byte
 * buffer with little-endian writers for each field of the format. Every GGUF test builds its
 * input with these, so the offsets quoted in expected messages can be read off the builders. */
#ifndef QUILL_TEST_GGUF_BUILD_H
#define QUILL_TEST_GGUF_BUILD_H

#include "quill.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uint8_t *p;
    size_t len, cap;
} gbuf;

static inline void gb_raw(gbuf *b, const void *p, size_t n) {
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n) cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) abort();
        b->p = q;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, p, n);
    b->len += n;
}
static inline void gb_u8(gbuf *b, uint8_t v) { gb_raw(b, &v, 1); }
static inline void gb_u16(gbuf *b, uint16_t v) { gb_raw(b, &v, 2); }
static inline void gb_u32(gbuf *b, uint32_t v) { gb_raw(b, &v, 4); }
static inline void gb_u64(gbuf *b, uint64_t v) { gb_raw(b, &v, 8); }
static inline void gb_f32(gbuf *b, float v) { gb_raw(b, &v, 4); }
static inline void gb_f64(gbuf *b, double v) { gb_raw(b, &v, 8); }
/* A GGUF string: u64 length, then the bytes. */
static inline void gb_strn(gbuf *b, const char *s, size_t n) { gb_u64(b, n); gb_raw(b, s, n); }
static inline void gb_str(gbuf *b, const char *s) { gb_strn(b, s, strlen(s)); }
static inline void gb_zeros(gbuf *b, size_t n) { while (n--) gb_u8(b, 0); }
/* Zero padding up to the next multiple of `align`. */
static inline void gb_pad(gbuf *b, size_t align) { while (b->len % align) gb_u8(b, 0); }
/* "GGUF", version, tensor count, metadata count: 24 bytes. */
static inline void gb_header(gbuf *b, uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
    gb_raw(b, "GGUF", 4);
    gb_u32(b, version);
    gb_u64(b, n_tensors);
    gb_u64(b, n_kv);
}
/* A metadata key and its value type; the value follows. */
static inline void gb_key(gbuf *b, const char *key, uint32_t type) { gb_str(b, key); gb_u32(b, type); }
/* An array header (inside a value): element type and count; the elements follow. */
static inline void gb_arr(gbuf *b, uint32_t elem_type, uint64_t count) { gb_u32(b, elem_type); gb_u64(b, count); }
/* A tensor directory entry with n_dims dimensions. */
static inline void gb_tensor(gbuf *b, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                             uint64_t offset) {
    gb_str(b, name);
    gb_u32(b, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) gb_u64(b, ne[d]);
    gb_u32(b, type);
    gb_u64(b, offset);
}
static inline void gb_free(gbuf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* A writer holding every key of g and each of its tensors except the one named `skip` (NULL:
 * all), for tests that write a variant of a model file; NULL if a copy fails. The tensors' data
 * stay in g's mapping: write before closing g. */
static inline quill_gguf_writer *gguf_copy_writer(const quill_gguf *g, const char *skip) {
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = w != NULL;
    for (uint64_t i = 0; ok && i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        ok = quill_gguf_writer_add_value(w, kv->key, &kv->value) == QUILL_OK;
    }
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (!skip || strcmp(t->name, skip) != 0)
            ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
    }
    if (!ok) {
        quill_gguf_writer_free(w);
        return NULL;
    }
    return w;
}

/* Writes a copy of the model at `src` to `dst` whose tensor `name` has its rows in reverse order:
 * a fault of any tensor type (whole rows move) that a forward pass cannot miss. */
static inline bool gguf_copy_reversing_rows(const char *src, const char *name, const char *dst) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err) != QUILL_OK) return false;
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g, name);
    quill_gguf_writer *w = t ? gguf_copy_writer(g, name) : NULL;
    uint8_t *rows = NULL;
    bool ok = w != NULL;
    if (ok) {
        const size_t row = quill_row_size(t->type, t->ne[0]), n = (size_t)(t->n_elements / t->ne[0]);
        ok = (rows = malloc(row * n)) != NULL;
        for (size_t r = 0; ok && r < n; r++) memcpy(rows + r * row, t->data + (n - 1 - r) * row, row);
        ok = ok && quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, rows) == QUILL_OK &&
             quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    }
    free(rows);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    return ok;
}

#endif
