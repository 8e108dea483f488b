/* GGUF reader: maps the file once, validates every byte of the header, metadata and tensor
 * directory up front, and then hands out views into the mapping. Because validation is complete
 * at open time, every accessor afterwards can trust the structure and stays simple.
 *
 * Layout (little-endian): "GGUF", u32 version, u64 n_tensors, u64 n_kv, n_kv × (string key,
 * u32 type, value), n_tensors × (string name, u32 n_dims, u64 ne[n_dims], u32 type, u64 offset),
 * padding to general.alignment (default 32), then the data section. Strings are u64 length + bytes. */
#include "base/error.h"
#include "gguf/gguf_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4
/* Real files never nest arrays; a bound keeps hostile files from exhausting the stack. */
#define GGUF_MAX_ARRAY_DEPTH 8
#define GGUF_MAX_ALIGNMENT (1u << 20)

typedef struct {
    const char *name;
    uint64_t index;
} name_ref;

/* Keys and tensor names are copied into chunks that never move, sized by what the directory
 * holds rather than by the file (a 30 GB model must not cost a 30 GB allocation). */
#define GGUF_NAME_CHUNK 65536
typedef struct name_chunk {
    struct name_chunk *next;
    size_t used, cap;
    char bytes[];
} name_chunk;

struct quill_gguf {
    char *path;
    const uint8_t *base;
    size_t size;
    bool mapped;
    uint32_t version;
    uint64_t alignment;
    uint64_t data_offset;
    uint64_t n_kv, n_tensors;
    quill_gguf_kv *kv;
    quill_gguf_tensor *tensors;
    name_ref *kv_sorted;
    name_ref *tensor_sorted;
    name_chunk *names;        /* every NUL-terminated key and tensor name */
};

/* A bounds-checked cursor over the file's bytes. */
typedef struct {
    quill_gguf *g;
    uint64_t pos;
    quill_error *err;
} reader;

static const char *label(const quill_gguf *g) { return g->path; }

static const uint8_t scalar_size[QUILL_GGUF_TYPE_COUNT] = {
    [QUILL_GGUF_UINT8] = 1, [QUILL_GGUF_INT8] = 1, [QUILL_GGUF_UINT16] = 2, [QUILL_GGUF_INT16] = 2,
    [QUILL_GGUF_UINT32] = 4, [QUILL_GGUF_INT32] = 4, [QUILL_GGUF_FLOAT32] = 4, [QUILL_GGUF_BOOL] = 1,
    [QUILL_GGUF_UINT64] = 8, [QUILL_GGUF_INT64] = 8, [QUILL_GGUF_FLOAT64] = 8,
};

size_t quill_gguf_scalar_size(uint32_t type) { return type < QUILL_GGUF_TYPE_COUNT ? scalar_size[type] : 0; }

const char *quill_gguf_type_name(uint32_t t) {
    static const char *const names[QUILL_GGUF_TYPE_COUNT] = {
        "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
    };
    return t < QUILL_GGUF_TYPE_COUNT ? names[t] : "unknown";
}

static uint64_t remaining(const reader *r) { return r->g->size - r->pos; }

/* `owner` (may be NULL) names the key or tensor the bytes belong to, for the message. */
static quill_status need(reader *r, uint64_t n, const char *what, const char *owner) {
    if (n > remaining(r))
        return quill_fail(r->err, QUILL_E_FORMAT,
                          "%s: offset %llu: truncated %s%s%s%s: needs %llu bytes but the file ends after "
                          "%llu (file size %zu); the file is incomplete, download or convert it again",
                          label(r->g), (unsigned long long)r->pos, what, owner ? " of '" : "",
                          owner ? owner : "", owner ? "'" : "", (unsigned long long)n,
                          (unsigned long long)remaining(r), r->g->size);
    return QUILL_OK;
}

static quill_status read_u32(reader *r, uint32_t *v, const char *what, const char *owner) {
    quill_status s = need(r, 4, what, owner);
    if (s) return s;
    memcpy(v, r->g->base + r->pos, 4);
    r->pos += 4;
    return QUILL_OK;
}

static quill_status read_u64(reader *r, uint64_t *v, const char *what, const char *owner) {
    quill_status s = need(r, 8, what, owner);
    if (s) return s;
    memcpy(v, r->g->base + r->pos, 8);
    r->pos += 8;
    return QUILL_OK;
}

/* A string: its bytes stay in the mapping; *len and *data describe them. */
static quill_status read_str(reader *r, const uint8_t **data, uint64_t *len, const char *what,
                             const char *owner) {
    uint64_t start = r->pos;
    quill_status s = read_u64(r, len, what, owner);
    if (s) return s;
    if (*len > remaining(r))
        return quill_fail(r->err, QUILL_E_FORMAT,
                          "%s: offset %llu: %s%s%s%s length %llu runs past the end of the file (%llu "
                          "bytes left); the file is truncated or corrupt",
                          label(r->g), (unsigned long long)start, what, owner ? " of '" : "",
                          owner ? owner : "", owner ? "'" : "", (unsigned long long)*len,
                          (unsigned long long)remaining(r));
    *data = r->g->base + r->pos;
    r->pos += *len;
    return QUILL_OK;
}

static quill_status read_value(reader *r, uint32_t type, quill_gguf_value *v, int depth, const char *key);

static quill_status read_array(reader *r, quill_gguf_value *v, int depth, const char *key) {
    uint64_t start = r->pos;
    quill_status s;
    if ((s = read_u32(r, &v->elem_type, "array element type", key))) return s;
    if ((s = read_u64(r, &v->count, "array length", key))) return s;
    if (v->elem_type >= QUILL_GGUF_TYPE_COUNT)
        return quill_fail(r->err, QUILL_E_FORMAT,
                          "%s: offset %llu: unknown value type id %u for the elements of array '%s' "
                          "(known: 0..12)",
                          label(r->g), (unsigned long long)start, v->elem_type, key);
    if (v->elem_type == QUILL_GGUF_ARRAY && depth + 1 >= GGUF_MAX_ARRAY_DEPTH)
        return quill_fail(r->err, QUILL_E_FORMAT,
                          "%s: offset %llu: arrays in '%s' are nested more than %d deep",
                          label(r->g), (unsigned long long)start, key, GGUF_MAX_ARRAY_DEPTH);
    v->data = r->g->base + r->pos;
    uint64_t elem = scalar_size[v->elem_type];
    if (elem) {
        if (v->count > remaining(r) / elem)
            return quill_fail(r->err, QUILL_E_FORMAT,
                              "%s: offset %llu: array '%s' claims %llu elements of %s (%llu bytes "
                              "each) but only %llu bytes are left in the file",
                              label(r->g), (unsigned long long)start, key, (unsigned long long)v->count,
                              quill_gguf_type_name(v->elem_type), (unsigned long long)elem,
                              (unsigned long long)remaining(r));
        r->pos += v->count * elem;
    } else {
        /* Strings take at least 8 bytes and arrays at least 12: reject absurd counts before
         * walking them, so a hostile count cannot make us loop for long. */
        uint64_t min = v->elem_type == QUILL_GGUF_STRING ? 8 : 12;
        if (v->count > remaining(r) / min)
            return quill_fail(r->err, QUILL_E_FORMAT,
                              "%s: offset %llu: array '%s' claims %llu %s elements but only %llu bytes "
                              "are left in the file",
                              label(r->g), (unsigned long long)start, key, (unsigned long long)v->count,
                              quill_gguf_type_name(v->elem_type), (unsigned long long)remaining(r));
        for (uint64_t i = 0; i < v->count; i++) {
            quill_gguf_value e;
            if ((s = read_value(r, v->elem_type, &e, depth + 1, key))) return s;
        }
    }
    return QUILL_OK;
}

static quill_status read_value(reader *r, uint32_t type, quill_gguf_value *v, int depth, const char *key) {
    uint64_t start = r->pos;
    memset(v, 0, sizeof *v);
    v->type = type;
    quill_status s;
    if (type == QUILL_GGUF_STRING) {
        if ((s = read_str(r, &v->data, &v->count, "string value", key))) return s;
    } else if (type == QUILL_GGUF_ARRAY) {
        if ((s = read_array(r, v, depth, key))) return s;
    } else if (type < QUILL_GGUF_TYPE_COUNT) {
        if ((s = need(r, scalar_size[type], "metadata value", key))) return s;
        v->data = r->g->base + r->pos;
        v->count = 1;
        r->pos += scalar_size[type];
    } else {
        return quill_fail(r->err, QUILL_E_FORMAT,
                          "%s: offset %llu: unknown value type id %u for key '%s' (known: 0..12)",
                          label(r->g), (unsigned long long)start - 4, type, key);
    }
    v->nbytes = r->pos - start;
    return QUILL_OK;
}

/* Lookup by name goes through an array of (name, index) pairs sorted by name: the sort also
 * puts duplicates next to each other, so detecting them is linear. */
static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const name_ref *)a)->name, ((const name_ref *)b)->name);
}

static quill_status copy_name(quill_gguf *g, const uint8_t *s, uint64_t len, uint64_t offset,
                              const char *what, quill_error *err, const char **out) {
    if (memchr(s, 0, len))
        return quill_fail(err, QUILL_E_FORMAT, "%s: offset %llu: %s contains a NUL byte", label(g),
                          (unsigned long long)offset, what);
    /* len <= the file size, which fits a size_t. */
    name_chunk *c = g->names;
    if (!c || c->cap - c->used < len + 1) {
        size_t cap = len + 1 > GGUF_NAME_CHUNK ? (size_t)len + 1 : GGUF_NAME_CHUNK;
        c = malloc(sizeof *c + cap);
        if (!c) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory reading the GGUF directory", label(g));
        c->next = g->names;
        c->used = 0;
        c->cap = cap;
        g->names = c;
    }
    char *dst = c->bytes + c->used;
    memcpy(dst, s, len);
    dst[len] = 0;
    c->used += len + 1;
    *out = dst;
    return QUILL_OK;
}

static quill_status parse(quill_gguf *g, quill_error *err) {
    reader r = {g, 0, err};
    quill_status s;
    if (g->size == 0)
        return quill_fail(err, QUILL_E_FORMAT, "%s: offset 0: the file is empty (0 bytes), not a GGUF file",
                          label(g));
    if (g->size < 4 || memcmp(g->base, "GGUF", 4) != 0) {
        char shown[5] = {0};
        for (size_t i = 0; i < 4 && i < g->size; i++)
            shown[i] = (g->base[i] >= 32 && g->base[i] < 127) ? (char)g->base[i] : '?';
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: offset 0: bad magic '%s' (expected 'GGUF'): this is not a GGUF file",
                          label(g), shown);
    }
    r.pos = 4;
    if ((s = read_u32(&r, &g->version, "header (version)", NULL))) return s;
    if (g->version != 2 && g->version != 3) {
        uint32_t v = g->version;
        uint32_t swapped = (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
        if (swapped >= 1 && swapped <= 3)
            return quill_fail(err, QUILL_E_UNSUPPORTED,
                              "%s: offset 4: big-endian GGUF file (version %u stored big-endian); quill "
                              "reads little-endian files only, convert the model without --bigendian",
                              label(g), swapped);
        return quill_fail(err, QUILL_E_UNSUPPORTED,
                          "%s: offset 4: unsupported GGUF version %u (quill reads versions 2 and 3; "
                          "convert the model with a current converter)",
                          label(g), g->version);
    }
    if ((s = read_u64(&r, &g->n_tensors, "header (tensor count)", NULL))) return s;
    if ((s = read_u64(&r, &g->n_kv, "header (metadata count)", NULL))) return s;

    /* Each key-value pair takes at least 13 bytes and each tensor entry at least 24: counts that
     * cannot fit in the file are rejected before anything is allocated. */
    if (g->n_kv > remaining(&r) / 13)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: offset 16: metadata count %llu cannot fit in the %zu-byte file",
                          label(g), (unsigned long long)g->n_kv, g->size);
    if (g->n_tensors > remaining(&r) / 24)
        return quill_fail(err, QUILL_E_FORMAT,
                          "%s: offset 8: tensor count %llu cannot fit in the %zu-byte file",
                          label(g), (unsigned long long)g->n_tensors, g->size);

    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    g->kv_sorted = malloc((g->n_kv ? g->n_kv : 1) * sizeof *g->kv_sorted);
    g->tensor_sorted = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *g->tensor_sorted);
    if (!g->kv || !g->tensors || !g->kv_sorted || !g->tensor_sorted)
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory reading the GGUF directory", label(g));

    g->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < g->n_kv; i++) {
        quill_gguf_kv *kv = &g->kv[i];
        kv->offset = r.pos;
        const uint8_t *key;
        uint64_t key_len;
        uint32_t type;
        if ((s = read_str(&r, &key, &key_len, "metadata key", NULL))) return s;
        if ((s = copy_name(g, key, key_len, kv->offset, "metadata key", err, &kv->key))) return s;
        if ((s = read_u32(&r, &type, "metadata value type", kv->key))) return s;
        if ((s = read_value(&r, type, &kv->value, 0, kv->key))) return s;
        g->kv_sorted[i] = (name_ref){kv->key, i};
        if (strcmp(kv->key, "general.alignment") == 0) {
            uint64_t a = 0;
            if (type != QUILL_GGUF_UINT32)
                return quill_fail(err, QUILL_E_FORMAT,
                                  "%s: offset %llu: general.alignment must be a u32 power of two "
                                  "(got type %s)",
                                  label(g), (unsigned long long)kv->offset, quill_gguf_type_name(type));
            quill_gguf_value_u64(&kv->value, &a);
            if (a == 0 || (a & (a - 1)) != 0 || a > GGUF_MAX_ALIGNMENT)
                return quill_fail(err, QUILL_E_FORMAT,
                                  "%s: offset %llu: general.alignment must be a power of two from 1 to "
                                  "%u (got %llu)",
                                  label(g), (unsigned long long)kv->offset, GGUF_MAX_ALIGNMENT,
                                  (unsigned long long)a);
            g->alignment = a;
        }
    }
    qsort(g->kv_sorted, g->n_kv, sizeof *g->kv_sorted, cmp_ref);
    for (uint64_t i = 1; i < g->n_kv; i++) {
        const quill_gguf_kv *a = &g->kv[g->kv_sorted[i - 1].index], *b = &g->kv[g->kv_sorted[i].index];
        if (strcmp(a->key, b->key) == 0) {
            const quill_gguf_kv *second = a->offset > b->offset ? a : b;
            return quill_fail(err, QUILL_E_FORMAT, "%s: offset %llu: duplicate metadata key '%s'",
                              label(g), (unsigned long long)second->offset, a->key);
        }
    }

    uint64_t *entry_offset = malloc((g->n_tensors ? g->n_tensors : 1) * sizeof *entry_offset);
    if (!entry_offset) return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", label(g));
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        quill_gguf_tensor *t = &g->tensors[i];
        uint64_t at = r.pos;
        entry_offset[i] = at;
        const uint8_t *name;
        uint64_t name_len;
        if ((s = read_str(&r, &name, &name_len, "tensor name", NULL))) goto fail_entries;
        if ((s = copy_name(g, name, name_len, at, "tensor name", err, &t->name))) goto fail_entries;
        if ((s = read_u32(&r, &t->n_dims, "tensor dimension count", t->name))) goto fail_entries;
        if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS) {
            s = quill_fail(err, QUILL_E_FORMAT,
                           "%s: offset %llu: tensor '%s' has %u dimensions (must be 1 to %d)",
                           label(g), (unsigned long long)at, t->name, t->n_dims, GGUF_MAX_DIMS);
            goto fail_entries;
        }
        /* `span` is the element count with empty dimensions read as 1. Bounding it (and its bytes
         * below) keeps every row and slice size representable, even in a tensor with a 0 dim. */
        uint64_t span = 1;
        t->n_elements = 1;
        for (int d = 0; d < GGUF_MAX_DIMS; d++) t->ne[d] = 1;
        for (uint32_t d = 0; d < t->n_dims; d++) {
            uint64_t ne;
            if ((s = read_u64(&r, &ne, "tensor dimensions", t->name))) goto fail_entries;
            if (ne > (uint64_t)INT64_MAX || (ne > 1 && span > (uint64_t)INT64_MAX / ne)) {
                s = quill_fail(err, QUILL_E_FORMAT,
                               "%s: offset %llu: dimensions of tensor '%s' overflow (dimension %u is "
                               "%llu)",
                               label(g), (unsigned long long)at, t->name, d, (unsigned long long)ne);
                goto fail_entries;
            }
            t->ne[d] = (int64_t)ne;
            t->n_elements *= (int64_t)ne;
            if (ne != 0) span *= ne;
        }
        if ((s = read_u32(&r, &t->type, "tensor type", t->name))) goto fail_entries;
        if ((s = read_u64(&r, &t->offset, "tensor data offset", t->name))) goto fail_entries;
        const quill_type_traits *tr = quill_type_traits_of(t->type);
        if (!tr) {
            s = quill_fail(err, QUILL_E_FORMAT, "%s: offset %llu: unknown tensor type id %u in tensor '%s'",
                           label(g), (unsigned long long)at, t->type, t->name);
            goto fail_entries;
        }
        if (t->ne[0] % tr->block_size != 0) {
            s = quill_fail(err, QUILL_E_FORMAT,
                           "%s: offset %llu: tensor '%s' of type %s has rows of %lld elements, not a "
                           "multiple of the block size %lld",
                           label(g), (unsigned long long)at, t->name, tr->name, (long long)t->ne[0],
                           (long long)tr->block_size);
            goto fail_entries;
        }
        /* Bytes = blocks × block bytes; n_elements/block_size ≤ 2^63 and block bytes are small,
         * but the product can still overflow. n_elements ≤ span, so checking span covers both. */
        uint64_t span_blocks = span / (uint64_t)tr->block_size;
        if (span_blocks != 0 && tr->type_size > UINT64_MAX / span_blocks) {
            s = quill_fail(err, QUILL_E_FORMAT, "%s: offset %llu: size of tensor '%s' overflows",
                           label(g), (unsigned long long)at, t->name);
            goto fail_entries;
        }
        t->nbytes = (uint64_t)t->n_elements / (uint64_t)tr->block_size * tr->type_size;
        g->tensor_sorted[i] = (name_ref){t->name, i};
    }

    /* The data section starts at the next multiple of the alignment. */
    g->data_offset = r.pos + (g->alignment - r.pos % g->alignment) % g->alignment;
    uint64_t data_size = g->data_offset <= g->size ? g->size - g->data_offset : 0;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        quill_gguf_tensor *t = &g->tensors[i];
        if (t->offset % g->alignment != 0) {
            s = quill_fail(err, QUILL_E_FORMAT,
                           "%s: offset %llu: data of tensor '%s' at data offset %llu is not aligned to "
                           "%llu bytes",
                           label(g), (unsigned long long)entry_offset[i], t->name,
                           (unsigned long long)t->offset, (unsigned long long)g->alignment);
            goto fail_entries;
        }
        if (t->offset > data_size || t->nbytes > data_size - t->offset) {
            /* data_offset + offset may wrap around: quote the two parts. */
            s = quill_fail(err, QUILL_E_FORMAT,
                           "%s: offset %llu: data of tensor '%s' (%llu bytes at offset %llu of the data "
                           "section, which starts at file offset %llu) lies outside the file (%zu "
                           "bytes); the file is truncated or corrupt",
                           label(g), (unsigned long long)entry_offset[i], t->name,
                           (unsigned long long)t->nbytes, (unsigned long long)t->offset,
                           (unsigned long long)g->data_offset, g->size);
            goto fail_entries;
        }
        t->file_offset = g->data_offset + t->offset;
        t->data = g->base + t->file_offset;
    }
    qsort(g->tensor_sorted, g->n_tensors, sizeof *g->tensor_sorted, cmp_ref);
    for (uint64_t i = 1; i < g->n_tensors; i++) {
        uint64_t a = g->tensor_sorted[i - 1].index, b = g->tensor_sorted[i].index;
        if (strcmp(g->tensors[a].name, g->tensors[b].name) == 0) {
            s = quill_fail(err, QUILL_E_FORMAT, "%s: offset %llu: duplicate tensor name '%s'", label(g),
                           (unsigned long long)entry_offset[a > b ? a : b], g->tensors[a].name);
            goto fail_entries;
        }
    }
    free(entry_offset);
    return QUILL_OK;
fail_entries:
    free(entry_offset);
    return s;
}

static quill_status open_common(quill_gguf *g, quill_gguf **out, quill_error *err) {
    quill_status s = parse(g, err);
    if (s != QUILL_OK) {
        quill_gguf_close(g);
        *out = NULL;
        return s;
    }
    *out = g;
    return QUILL_OK;
}

quill_status quill_gguf_open_memory(const void *data, size_t size, const char *name, quill_gguf **out,
                                    quill_error *err) {
    *out = NULL;
    quill_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(name ? name : "(memory)"))) {
        free(g);
        return quill_fail(err, QUILL_E_NOMEM, "out of memory opening %s", name ? name : "(memory)");
    }
    g->base = size ? data : (const uint8_t *)"";
    g->size = size;
    return open_common(g, out, err);
}

quill_status quill_gguf_open(const char *path, quill_gguf **out, quill_error *err) {
    *out = NULL;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return quill_fail(err, errno == ENOENT ? QUILL_E_NOT_FOUND : QUILL_E_IO,
                          "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return quill_fail(err, QUILL_E_IO, "%s: not a regular file", path);
    }
    if (st.st_size == 0) {
        close(fd);
        return quill_fail(err, QUILL_E_FORMAT, "%s: offset 0: the file is empty (0 bytes), not a GGUF file",
                          path);
    }
    void *map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    close(fd);
    if (map == MAP_FAILED)
        return quill_fail(err, QUILL_E_IO, "%s: cannot map %lld bytes: %s", path, (long long)st.st_size,
                          strerror(map_errno));
#ifdef MADV_HUGEPAGE
    /* Decoding streams every weight once per token. Where the page cache holds the file in 2 MiB
     * folios, the kernel maps each with one page-table entry, and the stream then misses the TLB
     * once per 2 MiB instead of once per 4 KiB page (bench/README.md has the measurements); with
     * this advice, reading an uncached file in also asks for folios that size. Only advice: a
     * kernel that cannot do either ignores it. */
    (void)madvise(map, (size_t)st.st_size, MADV_HUGEPAGE);
#endif
    quill_gguf *g = calloc(1, sizeof *g);
    if (!g || !(g->path = strdup(path))) {
        free(g);
        munmap(map, (size_t)st.st_size);
        return quill_fail(err, QUILL_E_NOMEM, "%s: out of memory", path);
    }
    g->base = map;
    g->size = (size_t)st.st_size;
    g->mapped = true;
    return open_common(g, out, err);
}

bool quill_gguf_is_mapped(const quill_gguf *g) { return g->mapped; }

void quill_gguf_close(quill_gguf *g) {
    if (!g) return;
    if (g->mapped) munmap((void *)g->base, g->size);
    free(g->kv);
    free(g->tensors);
    free(g->kv_sorted);
    free(g->tensor_sorted);
    while (g->names) {
        name_chunk *next = g->names->next;
        free(g->names);
        g->names = next;
    }
    free(g->path);
    free(g);
}

const char *quill_gguf_path(const quill_gguf *g) { return g->path; }
uint32_t quill_gguf_version(const quill_gguf *g) { return g->version; }
uint64_t quill_gguf_alignment(const quill_gguf *g) { return g->alignment; }
uint64_t quill_gguf_file_size(const quill_gguf *g) { return g->size; }
uint64_t quill_gguf_data_offset(const quill_gguf *g) { return g->data_offset; }
uint64_t quill_gguf_n_kv(const quill_gguf *g) { return g->n_kv; }
uint64_t quill_gguf_n_tensors(const quill_gguf *g) { return g->n_tensors; }

const quill_gguf_kv *quill_gguf_kv_at(const quill_gguf *g, uint64_t i) {
    return i < g->n_kv ? &g->kv[i] : NULL;
}

const quill_gguf_tensor *quill_gguf_tensor_at(const quill_gguf *g, uint64_t i) {
    return i < g->n_tensors ? &g->tensors[i] : NULL;
}

static int64_t lookup(const name_ref *sorted, uint64_t n, const char *name) {
    if (n == 0) return -1;
    name_ref probe = {name, 0};
    const name_ref *hit = bsearch(&probe, sorted, n, sizeof *sorted, cmp_ref);
    return hit ? (int64_t)hit->index : -1;
}

const quill_gguf_value *quill_gguf_find(const quill_gguf *g, const char *key) {
    int64_t i = lookup(g->kv_sorted, g->n_kv, key);
    return i < 0 ? NULL : &g->kv[i].value;
}

const quill_gguf_tensor *quill_gguf_find_tensor(const quill_gguf *g, const char *name) {
    int64_t i = lookup(g->tensor_sorted, g->n_tensors, name);
    return i < 0 ? NULL : &g->tensors[i];
}

bool quill_gguf_value_u64(const quill_gguf_value *v, uint64_t *out) {
    int64_t i;
    switch (v->type) {
    case QUILL_GGUF_UINT8: *out = v->data[0]; return true;
    case QUILL_GGUF_UINT16: { uint16_t x; memcpy(&x, v->data, 2); *out = x; return true; }
    case QUILL_GGUF_UINT32: { uint32_t x; memcpy(&x, v->data, 4); *out = x; return true; }
    case QUILL_GGUF_UINT64: memcpy(out, v->data, 8); return true;
    case QUILL_GGUF_INT8: case QUILL_GGUF_INT16: case QUILL_GGUF_INT32: case QUILL_GGUF_INT64:
        if (!quill_gguf_value_i64(v, &i) || i < 0) return false;
        *out = (uint64_t)i;
        return true;
    default: return false;
    }
}

bool quill_gguf_value_i64(const quill_gguf_value *v, int64_t *out) {
    uint64_t u;
    switch (v->type) {
    case QUILL_GGUF_INT8: *out = (int8_t)v->data[0]; return true;
    case QUILL_GGUF_INT16: { int16_t x; memcpy(&x, v->data, 2); *out = x; return true; }
    case QUILL_GGUF_INT32: { int32_t x; memcpy(&x, v->data, 4); *out = x; return true; }
    case QUILL_GGUF_INT64: memcpy(out, v->data, 8); return true;
    case QUILL_GGUF_UINT8: case QUILL_GGUF_UINT16: case QUILL_GGUF_UINT32: case QUILL_GGUF_UINT64:
        if (!quill_gguf_value_u64(v, &u) || u > (uint64_t)INT64_MAX) return false;
        *out = (int64_t)u;
        return true;
    default: return false;
    }
}

bool quill_gguf_value_f64(const quill_gguf_value *v, double *out) {
    int64_t i;
    uint64_t u;
    if (v->type == QUILL_GGUF_FLOAT32) { float x; memcpy(&x, v->data, 4); *out = x; return true; }
    if (v->type == QUILL_GGUF_FLOAT64) { memcpy(out, v->data, 8); return true; }
    if (quill_gguf_value_i64(v, &i)) { *out = (double)i; return true; }
    if (quill_gguf_value_u64(v, &u)) { *out = (double)u; return true; }
    return false;
}

bool quill_gguf_array_next(const quill_gguf_value *arr, uint64_t *cursor, quill_gguf_value *elem) {
    /* The cursor packs the element index (high 24 bits would not suffice), so it is the byte
     * offset of the next element within the array's data; the element count is checked by
     * walking, which callers do sequentially anyway. */
    if (arr->type != QUILL_GGUF_ARRAY) return false;
    const uint8_t *end = arr->data + (arr->nbytes - 12);
    const uint8_t *p = arr->data + *cursor;
    if (p >= end) return false;
    memset(elem, 0, sizeof *elem);
    elem->type = arr->elem_type;
    if (arr->elem_type == QUILL_GGUF_STRING) {
        memcpy(&elem->count, p, 8);
        elem->data = p + 8;
        elem->nbytes = 8 + elem->count;
    } else if (arr->elem_type == QUILL_GGUF_ARRAY) {
        /* Validated at open: re-walk the nested array to learn its size. */
        memcpy(&elem->elem_type, p, 4);
        memcpy(&elem->count, p + 4, 8);
        elem->data = p + 12;
        uint64_t size = scalar_size[elem->elem_type];
        if (size) {
            elem->nbytes = 12 + elem->count * size;
        } else {
            uint64_t c = 0;
            quill_gguf_value sub;
            elem->nbytes = (uint64_t)(end - p); /* provisional bound while walking */
            for (uint64_t i = 0; i < elem->count; i++) quill_gguf_array_next(elem, &c, &sub);
            elem->nbytes = 12 + c;
        }
    } else {
        elem->count = 1;
        elem->data = p;
        elem->nbytes = scalar_size[arr->elem_type];
    }
    *cursor += elem->nbytes;
    return true;
}

static quill_status get_typed(const quill_gguf *g, const char *key, const quill_gguf_value **v,
                              quill_error *err) {
    *v = quill_gguf_find(g, key);
    if (!*v) return quill_fail(err, QUILL_E_NOT_FOUND, "%s: metadata key '%s' is missing", g->path, key);
    return QUILL_OK;
}

static quill_status wrong_type(const quill_gguf *g, const char *key, const quill_gguf_value *v,
                               const char *wanted, quill_error *err) {
    return quill_fail(err, QUILL_E_FORMAT, "%s: metadata key '%s' has type %s, expected %s", g->path,
                      key, quill_gguf_type_name(v->type), wanted);
}

quill_status quill_gguf_get_u64(const quill_gguf *g, const char *key, uint64_t *out, quill_error *err) {
    const quill_gguf_value *v;
    quill_status s = get_typed(g, key, &v, err);
    if (s) return s;
    return quill_gguf_value_u64(v, out) ? QUILL_OK : wrong_type(g, key, v, "a non-negative integer", err);
}

quill_status quill_gguf_get_i64(const quill_gguf *g, const char *key, int64_t *out, quill_error *err) {
    const quill_gguf_value *v;
    quill_status s = get_typed(g, key, &v, err);
    if (s) return s;
    return quill_gguf_value_i64(v, out) ? QUILL_OK : wrong_type(g, key, v, "an integer", err);
}

quill_status quill_gguf_get_f64(const quill_gguf *g, const char *key, double *out, quill_error *err) {
    const quill_gguf_value *v;
    quill_status s = get_typed(g, key, &v, err);
    if (s) return s;
    return quill_gguf_value_f64(v, out) ? QUILL_OK : wrong_type(g, key, v, "a number", err);
}

quill_status quill_gguf_get_bool(const quill_gguf *g, const char *key, bool *out, quill_error *err) {
    const quill_gguf_value *v;
    quill_status s = get_typed(g, key, &v, err);
    if (s) return s;
    if (v->type != QUILL_GGUF_BOOL) return wrong_type(g, key, v, "bool", err);
    *out = v->data[0] != 0;
    return QUILL_OK;
}

quill_status quill_gguf_get_str(const quill_gguf *g, const char *key, const char **str, size_t *len,
                                quill_error *err) {
    const quill_gguf_value *v;
    quill_status s = get_typed(g, key, &v, err);
    if (s) return s;
    if (v->type != QUILL_GGUF_STRING) return wrong_type(g, key, v, "string", err);
    *str = (const char *)v->data;
    *len = v->count;
    return QUILL_OK;
}

quill_status quill_gguf_get_arr(const quill_gguf *g, const char *key, quill_gguf_value *out, quill_error *err) {
    const quill_gguf_value *v;
    quill_status s = get_typed(g, key, &v, err);
    if (s) return s;
    if (v->type != QUILL_GGUF_ARRAY) return wrong_type(g, key, v, "array", err);
    *out = *v;
    return QUILL_OK;
}
