/* libFuzzer target for the GGUF reader and what reads through it.
 *
 * Each input is opened with quill_gguf_open_memory. A rejected input must fail with a format or
 * unsupported status and a message naming the input and the offset. An accepted one is walked
 * through every accessor, and each promise of the reader is checked (abort() on a broken one, so
 * libFuzzer reports it): every key and tensor found by name, array_next agreeing with the
 * array's count and byte size at every nesting level, getters agreeing with the value
 * conversions, every tensor inside the input, and the first rows of each tensor dequantized
 * (libFuzzer hands over an exactly-sized heap copy, so ASan sees any read past the input).
 * Then every value is copied into a GGUF writer, the Llama hyperparameters are read, and the
 * tokenizer is loaded and used. See fuzz/README.md for building and running. */
#include "quill.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DEQUANT_ELEMENTS 8192 /* per tensor: the first rows, capped */
#define MAX_DEQUANT_ROWS 2

#define REQUIRE(cond, ...)                                                                        \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            fprintf(stderr, "fuzz_gguf: broken promise at line %d: %s: ", __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                         \
            fputc('\n', stderr);                                                                  \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

static volatile uint64_t sink; /* keeps reads of the input from being optimised away */

/* The sizes again, not the reader's table: the walk checks the reader against them. */
static size_t scalar_size(uint32_t t) {
    switch (t) {
    case QUILL_GGUF_UINT8: case QUILL_GGUF_INT8: case QUILL_GGUF_BOOL: return 1;
    case QUILL_GGUF_UINT16: case QUILL_GGUF_INT16: return 2;
    case QUILL_GGUF_UINT32: case QUILL_GGUF_INT32: case QUILL_GGUF_FLOAT32: return 4;
    case QUILL_GGUF_UINT64: case QUILL_GGUF_INT64: case QUILL_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

static bool inside(const uint8_t *base, size_t size, const uint8_t *p, uint64_t n) {
    return p >= base && (uint64_t)(p - base) <= size && n <= size - (uint64_t)(p - base);
}

/* Every element of a value, recursively; returns nothing, aborts on an inconsistency. */
static void walk_value(const uint8_t *base, size_t size, const quill_gguf_value *v, int depth) {
    REQUIRE(depth <= 8, "arrays nested %d deep", depth);
    uint64_t acc = 0;
    if (v->type == QUILL_GGUF_STRING) {
        REQUIRE(v->nbytes == 8 + v->count, "string nbytes");
        REQUIRE(inside(base, size, v->data, v->count), "string outside the input");
        for (uint64_t i = 0; i < v->count; i++) acc += v->data[i];
    } else if (v->type == QUILL_GGUF_ARRAY) {
        REQUIRE(v->elem_type < QUILL_GGUF_TYPE_COUNT, "elem type %u", v->elem_type);
        REQUIRE(v->nbytes >= 12 && inside(base, size, v->data - 12, v->nbytes), "array outside the input");
        uint64_t cursor = 0, n = 0;
        quill_gguf_value e;
        while (quill_gguf_array_next(v, &cursor, &e)) {
            REQUIRE(e.type == v->elem_type, "element type %u in an array of %u", e.type, v->elem_type);
            REQUIRE(cursor <= v->nbytes - 12, "cursor past the array");
            walk_value(base, size, &e, depth + 1);
            n++;
            REQUIRE(n <= v->count, "more elements than the count %llu", (unsigned long long)v->count);
        }
        REQUIRE(n == v->count, "%llu elements for a count of %llu", (unsigned long long)n, (unsigned long long)v->count);
        REQUIRE(cursor == v->nbytes - 12, "elements cover %llu of %llu bytes", (unsigned long long)cursor,
                (unsigned long long)(v->nbytes - 12));
    } else {
        size_t n = scalar_size(v->type);
        REQUIRE(n && v->nbytes == n && v->count == 1, "scalar of type %u", v->type);
        REQUIRE(inside(base, size, v->data, n), "scalar outside the input");
        uint64_t u;
        int64_t i;
        double d;
        bool is_u = quill_gguf_value_u64(v, &u), is_i = quill_gguf_value_i64(v, &i), is_f = quill_gguf_value_f64(v, &d);
        REQUIRE(v->type != QUILL_GGUF_BOOL || (!is_u && !is_i && !is_f), "a bool converted to a number");
        REQUIRE(v->type == QUILL_GGUF_BOOL || is_f, "a number that is not a number");
        REQUIRE(!(is_u && is_i) || (uint64_t)i == u, "u64 and i64 disagree");
        acc += (uint64_t)is_u + (uint64_t)is_i + v->data[0];
    }
    sink += acc;
}

static void check_getters(const quill_gguf *g, const quill_gguf_kv *kv) {
    const quill_gguf_value *v = &kv->value;
    quill_error err;
    uint64_t u;
    int64_t i;
    double d;
    bool b;
    const char *s;
    size_t len;
    quill_gguf_value a;
    bool want_u = quill_gguf_value_u64(v, &u), want_i = quill_gguf_value_i64(v, &i), want_f = quill_gguf_value_f64(v, &d);
    quill_status st;
    st = quill_gguf_get_u64(g, kv->key, &u, &err);
    REQUIRE(st == (want_u ? QUILL_OK : QUILL_E_FORMAT), "get_u64 %d", st);
    st = quill_gguf_get_i64(g, kv->key, &i, &err);
    REQUIRE(st == (want_i ? QUILL_OK : QUILL_E_FORMAT), "get_i64 %d", st);
    st = quill_gguf_get_f64(g, kv->key, &d, &err);
    REQUIRE(st == (want_f ? QUILL_OK : QUILL_E_FORMAT), "get_f64 %d", st);
    st = quill_gguf_get_bool(g, kv->key, &b, &err);
    REQUIRE(st == (v->type == QUILL_GGUF_BOOL ? QUILL_OK : QUILL_E_FORMAT), "get_bool %d", st);
    st = quill_gguf_get_str(g, kv->key, &s, &len, &err);
    REQUIRE(st == (v->type == QUILL_GGUF_STRING ? QUILL_OK : QUILL_E_FORMAT), "get_str %d", st);
    if (st == QUILL_OK) REQUIRE(len == v->count && s == (const char *)v->data, "get_str result");
    st = quill_gguf_get_arr(g, kv->key, &a, &err);
    REQUIRE(st == (v->type == QUILL_GGUF_ARRAY ? QUILL_OK : QUILL_E_FORMAT), "get_arr %d", st);
    if (st != QUILL_OK) REQUIRE(strstr(err.message, "metadata key '") != NULL, "wrong-type message: %s", err.message);
}

static void check_tensor(const quill_gguf *g, const uint8_t *base, size_t size, const quill_gguf_tensor *t) {
    REQUIRE(quill_gguf_find_tensor(g, t->name) == t, "find_tensor('%s')", t->name);
    REQUIRE(t->n_dims >= 1 && t->n_dims <= 4, "n_dims %u", t->n_dims);
    int64_t n = 1;
    for (uint32_t d = 0; d < 4; d++) {
        REQUIRE(t->ne[d] >= 0 && (d < t->n_dims || t->ne[d] == 1), "ne[%u] = %lld", d, (long long)t->ne[d]);
        n *= t->ne[d];
    }
    REQUIRE(n == t->n_elements, "n_elements");
    const quill_type_traits *tr = quill_type_traits_of(t->type);
    REQUIRE(tr && tr->block_size > 0 && t->ne[0] % tr->block_size == 0, "type %u", t->type);
    REQUIRE((uint64_t)(t->n_elements / tr->block_size) * tr->type_size == t->nbytes, "nbytes");
    REQUIRE(t->offset % quill_gguf_alignment(g) == 0, "alignment");
    REQUIRE(t->file_offset == quill_gguf_data_offset(g) + t->offset, "file_offset");
    if (t->nbytes) REQUIRE(inside(base, size, t->data, t->nbytes), "tensor '%s' outside the input", t->name);
    if (t->n_elements == 0) return;

    /* The first rows, capped, in whole blocks. */
    int64_t rows = t->n_elements / t->ne[0];
    int64_t want = t->ne[0] * (rows < MAX_DEQUANT_ROWS ? rows : MAX_DEQUANT_ROWS);
    if (want > MAX_DEQUANT_ELEMENTS) want = MAX_DEQUANT_ELEMENTS / tr->block_size * tr->block_size;
    if (want == 0) return;
    REQUIRE(quill_row_size(t->type, want) <= t->nbytes, "rows past the tensor");
    static float out[MAX_DEQUANT_ELEMENTS];
    quill_error err;
    quill_status st = quill_dequantize(t->type, t->data, out, want, &err);
    REQUIRE(st == (tr->to_float ? QUILL_OK : QUILL_E_UNSUPPORTED), "dequantize %s: %d", tr->name, st);
    if (st == QUILL_OK) {
        uint32_t x = 0;
        for (int64_t k = 0; k < want; k++) {
            uint32_t bits;
            memcpy(&bits, &out[k], 4);
            x ^= bits;
        }
        sink += x;
    }
}

/* Copies every value into a writer (add_value reads each value's serialized bytes back out of
 * the input); nothing is written to disk. */
static void copy_values(const quill_gguf *g) {
    quill_gguf_writer *w = quill_gguf_writer_new();
    if (!w) return;
    for (uint64_t i = 0; i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        quill_status st = quill_gguf_writer_add_value(w, kv->key, &kv->value);
        REQUIRE(st == QUILL_OK || st == QUILL_E_NOMEM, "add_value('%s') = %d", kv->key, st);
    }
    quill_gguf_writer_free(w);
}

static void use_tokenizer(const quill_gguf *g, const uint8_t *data, size_t size) {
    quill_tokenizer *tok = NULL;
    quill_error err;
    if (quill_tokenizer_load(g, &tok, &err) != QUILL_OK) return;
    int32_t n = quill_tokenizer_n_vocab(tok);
    REQUIRE(n > 0, "n_vocab %d", n);
    sink += (uint64_t)quill_tokenizer_bos(tok) + (uint64_t)quill_tokenizer_eos(tok) + quill_tokenizer_add_bos(tok);
    for (int32_t id = -1; id <= n && id < 64; id++) {
        const char *p = quill_tokenizer_piece(tok, id);
        REQUIRE((p != NULL) == (id >= 0 && id < n), "piece(%d)", id);
        sink += (uint64_t)quill_tokenizer_token_type(tok, id) + quill_tokenizer_is_eog(tok, id);
    }
    /* Some fixed text and the tail of the input itself as text. */
    static const char *const texts[] = {"Hello world", " </s><s> <|user|>\n\xc3\xa9\xe2\x96\x81 \xff\xfe ab", ""};
    char tail[97];
    size_t tail_len = size < 96 ? size : 96;
    memcpy(tail, data + size - tail_len, tail_len);
    for (int k = 0; k < 4; k++) {
        const char *text = k < 3 ? texts[k] : tail;
        size_t len = k < 3 ? strlen(text) : tail_len;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        quill_status st = quill_tokenize(tok, text, len, k & 1, k != 1, &ids, &n_ids, &err);
        if (st == QUILL_OK) {
            quill_detokenizer dt;
            quill_detokenizer_init(&dt, tok, k == 2, true);
            char buf[512];
            for (size_t i = 0; i < n_ids; i++) {
                REQUIRE(ids[i] >= 0 && ids[i] < n, "token id %d of %d", ids[i], n);
                int m = quill_token_to_bytes(tok, ids[i], true, buf, sizeof buf);
                REQUIRE(m >= 0, "token_to_bytes(%d)", ids[i]);
                sink += quill_detokenizer_push(&dt, ids[i], buf, sizeof buf);
            }
            sink += quill_detokenizer_flush(&dt, buf, sizeof buf);
        }
        free(ids);
    }
    quill_tokenizer_free(tok);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    quill_gguf *g = (quill_gguf *)&sink;
    quill_error err;
    memset(&err, 0, sizeof err);
    quill_status st = quill_gguf_open_memory(data, size, "fuzz", &g, &err);
    if (st != QUILL_OK) {
        REQUIRE(g == NULL, "*out not cleared on failure");
        REQUIRE(st == QUILL_E_FORMAT || st == QUILL_E_UNSUPPORTED || st == QUILL_E_NOMEM, "status %d", st);
        REQUIRE(err.status == st, "err.status %d for %d", err.status, st);
        REQUIRE(strncmp(err.message, "fuzz: ", 6) == 0, "message does not name the input: %s", err.message);
        REQUIRE(st == QUILL_E_NOMEM || strncmp(err.message, "fuzz: offset ", 13) == 0,
                "message does not give the offset: %s", err.message);
        return 0;
    }
    REQUIRE(quill_gguf_version(g) == 2 || quill_gguf_version(g) == 3, "version");
    REQUIRE(quill_gguf_file_size(g) == size, "file size");
    uint64_t align = quill_gguf_alignment(g);
    REQUIRE(align && (align & (align - 1)) == 0, "alignment %llu", (unsigned long long)align);
    REQUIRE(quill_gguf_data_offset(g) % align == 0, "data offset");

    for (uint64_t i = 0; i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        REQUIRE(kv && kv->key, "kv_at(%llu)", (unsigned long long)i);
        REQUIRE(quill_gguf_find(g, kv->key) == &kv->value, "find('%s')", kv->key);
        REQUIRE(kv->offset < size, "kv offset");
        walk_value(data, size, &kv->value, 0);
        check_getters(g, kv);
    }
    REQUIRE(quill_gguf_kv_at(g, quill_gguf_n_kv(g)) == NULL, "kv_at past the end");
    quill_error err2;
    uint64_t u;
    REQUIRE(quill_gguf_find(g, "\x01not a key") == NULL, "find of an absent key");
    REQUIRE(quill_gguf_get_u64(g, "\x01not a key", &u, &err2) == QUILL_E_NOT_FOUND, "absent key");

    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) check_tensor(g, data, size, quill_gguf_tensor_at(g, i));
    REQUIRE(quill_gguf_tensor_at(g, quill_gguf_n_tensors(g)) == NULL, "tensor_at past the end");
    REQUIRE(quill_gguf_find_tensor(g, "\x01not a tensor") == NULL, "find_tensor of an absent name");

    copy_values(g);
    quill_hparams hp;
    if (quill_hparams_from_gguf(g, &hp, &err2) == QUILL_OK) sink += (uint64_t)hp.n_embd + (uint64_t)hp.n_vocab;
    use_tokenizer(g, data, size);
    quill_gguf_close(g);
    return 0;
}
