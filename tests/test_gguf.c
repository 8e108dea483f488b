/* GGUF reader and writer: every value type, v2 and v3, alignment, typed getters, array walking,
 * tensor lookup, writer round trips, truncation and corruption sweeps, and the reference files.
 * Malformed files with their exact errors are in test_gguf_malformed.c. */
#include "test.h"

#include "gguf_build.h"
#include "quill.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- helpers */

static quill_gguf *open_buf(const gbuf *b, quill_error *err) {
    quill_gguf *g = NULL;
    quill_status s = quill_gguf_open_memory(b->p, b->len, "mem.gguf", &g, err);
    return s == QUILL_OK ? g : NULL;
}

static char *tmp_path(const char *name) { return path_join(tmp_dir(), name); }

static bool bytes_eq(const void *a, const void *b, size_t n) { return n == 0 || memcmp(a, b, n) == 0; }

static size_t scalar_bytes(uint32_t t) {
    switch (t) {
    case QUILL_GGUF_UINT8: case QUILL_GGUF_INT8: case QUILL_GGUF_BOOL: return 1;
    case QUILL_GGUF_UINT16: case QUILL_GGUF_INT16: return 2;
    case QUILL_GGUF_UINT32: case QUILL_GGUF_INT32: case QUILL_GGUF_FLOAT32: return 4;
    case QUILL_GGUF_UINT64: case QUILL_GGUF_INT64: case QUILL_GGUF_FLOAT64: return 8;
    default: return 0;
    }
}

/* Walks a value completely, checking what array_next reports against the value's own header:
 * element count, element sizes adding up to the array's bytes, and every byte readable. */
static bool walk_value(const quill_gguf_value *v, int depth, uint64_t *sum, char *why, size_t cap) {
    if (depth > 16) { snprintf(why, cap, "nested deeper than the reader allows"); return false; }
    if (v->type == QUILL_GGUF_STRING) {
        if (v->nbytes != 8 + v->count) { snprintf(why, cap, "string nbytes %llu for %llu bytes", (unsigned long long)v->nbytes, (unsigned long long)v->count); return false; }
        for (uint64_t i = 0; i < v->count; i++) *sum += v->data[i];
        return true;
    }
    if (v->type != QUILL_GGUF_ARRAY) {
        size_t n = scalar_bytes(v->type);
        if (!n || v->nbytes != n || v->count != 1) { snprintf(why, cap, "scalar of type %u: nbytes %llu count %llu", v->type, (unsigned long long)v->nbytes, (unsigned long long)v->count); return false; }
        for (size_t i = 0; i < n; i++) *sum += v->data[i];
        uint64_t u;
        int64_t s;
        double d;
        bool iu = quill_gguf_value_u64(v, &u), is = quill_gguf_value_i64(v, &s), fd = quill_gguf_value_f64(v, &d);
        if (iu && is && (uint64_t)s != u) { snprintf(why, cap, "u64 %llu and i64 %lld disagree", (unsigned long long)u, (long long)s); return false; }
        if (v->type == QUILL_GGUF_BOOL && (iu || is || fd)) { snprintf(why, cap, "a bool converted to a number"); return false; }
        return true;
    }
    uint64_t cursor = 0, n = 0;
    quill_gguf_value e;
    while (quill_gguf_array_next(v, &cursor, &e)) {
        if (e.type != v->elem_type) { snprintf(why, cap, "element type %u in an array of %u", e.type, v->elem_type); return false; }
        if (!walk_value(&e, depth + 1, sum, why, cap)) return false;
        n++;
        if (n > v->count) break;
    }
    if (n != v->count) { snprintf(why, cap, "array_next gave %llu elements, count is %llu", (unsigned long long)n, (unsigned long long)v->count); return false; }
    if (cursor != v->nbytes - 12) { snprintf(why, cap, "elements cover %llu bytes, array holds %llu", (unsigned long long)cursor, (unsigned long long)(v->nbytes - 12)); return false; }
    if (quill_gguf_array_next(v, &cursor, &e)) { snprintf(why, cap, "array_next went past the end"); return false; }
    return true;
}

/* Every accessor on an opened file, with the invariants the reader promises. */
static bool walk_file(const quill_gguf *g, const void *base, size_t size, char *why, size_t cap) {
    uint64_t sum = 0;
    for (uint64_t i = 0; i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        if (quill_gguf_find(g, kv->key) != &kv->value) { snprintf(why, cap, "find('%s') is not kv %llu", kv->key, (unsigned long long)i); return false; }
        if (kv->value.nbytes > size || (base && (const uint8_t *)kv->value.data < (const uint8_t *)base)) { snprintf(why, cap, "value of '%s' outside the file", kv->key); return false; }
        if (!walk_value(&kv->value, 0, &sum, why, cap)) return false;
    }
    if (quill_gguf_kv_at(g, quill_gguf_n_kv(g))) { snprintf(why, cap, "kv_at past the end"); return false; }
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (quill_gguf_find_tensor(g, t->name) != t) { snprintf(why, cap, "find_tensor('%s') is not tensor %llu", t->name, (unsigned long long)i); return false; }
        if (t->file_offset != quill_gguf_data_offset(g) + t->offset || t->offset % quill_gguf_alignment(g)) { snprintf(why, cap, "tensor '%s' offsets", t->name); return false; }
        if (t->nbytes && (t->file_offset > size || t->nbytes > size - t->file_offset)) { snprintf(why, cap, "tensor '%s' outside the file", t->name); return false; }
        if (t->nbytes && base && (const uint8_t *)t->data != (const uint8_t *)base + t->file_offset) { snprintf(why, cap, "tensor '%s' data pointer", t->name); return false; }
        int64_t n = 1;
        for (uint32_t d = 0; d < 4; d++) {
            if (d >= t->n_dims && t->ne[d] != 1) { snprintf(why, cap, "tensor '%s' unused dim %u is %lld", t->name, d, (long long)t->ne[d]); return false; }
            n *= t->ne[d];
        }
        if (n != t->n_elements) { snprintf(why, cap, "tensor '%s' n_elements", t->name); return false; }
        const quill_type_traits *tr = quill_type_traits_of(t->type);
        if (!tr || (uint64_t)(t->n_elements / tr->block_size) * tr->type_size != t->nbytes) { snprintf(why, cap, "tensor '%s' nbytes", t->name); return false; }
        for (uint64_t k = 0; k < t->nbytes && k < 64; k++) sum += ((const uint8_t *)t->data)[k];
    }
    if (quill_gguf_tensor_at(g, quill_gguf_n_tensors(g))) { snprintf(why, cap, "tensor_at past the end"); return false; }
    (void)sum;
    return true;
}

/* A file with every kind of metadata value and a few tensors, hand-made so that nothing depends
 * on the writer. Keys are listed in order in RICH_KEYS. */
static const char *const RICH_KEYS[] = {
    "t.u8", "t.i8", "t.u16", "t.i16", "t.u32", "t.i32", "t.f32", "t.bool_t", "t.bool_f", "t.str",
    "t.u64", "t.i64", "t.f64", "t.str_empty", "t.arr_u8", "t.arr_i32", "t.arr_f64", "t.arr_bool",
    "t.arr_str", "t.arr_empty", "t.nested", "t.after",
};
#define N_RICH_KEYS (sizeof RICH_KEYS / sizeof RICH_KEYS[0])

static void build_rich(gbuf *b, uint32_t version, bool with_tensors) {
    gb_header(b, version, with_tensors ? 2 : 0, N_RICH_KEYS);
    gb_key(b, "t.u8", QUILL_GGUF_UINT8); gb_u8(b, 200);
    gb_key(b, "t.i8", QUILL_GGUF_INT8); gb_u8(b, (uint8_t)(int8_t)-100);
    gb_key(b, "t.u16", QUILL_GGUF_UINT16); gb_u16(b, 60000);
    gb_key(b, "t.i16", QUILL_GGUF_INT16); gb_u16(b, (uint16_t)(int16_t)-30000);
    gb_key(b, "t.u32", QUILL_GGUF_UINT32); gb_u32(b, 4000000000u);
    gb_key(b, "t.i32", QUILL_GGUF_INT32); gb_u32(b, (uint32_t)(int32_t)-2000000000);
    gb_key(b, "t.f32", QUILL_GGUF_FLOAT32); gb_f32(b, 1.5f);
    gb_key(b, "t.bool_t", QUILL_GGUF_BOOL); gb_u8(b, 1);
    gb_key(b, "t.bool_f", QUILL_GGUF_BOOL); gb_u8(b, 0);
    gb_key(b, "t.str", QUILL_GGUF_STRING); gb_str(b, "h\xc3\xa9llo \xe2\x96\x81world");
    gb_key(b, "t.u64", QUILL_GGUF_UINT64); gb_u64(b, (1ull << 63) + 5);
    gb_key(b, "t.i64", QUILL_GGUF_INT64); gb_u64(b, (uint64_t)-(INT64_C(1) << 62));
    gb_key(b, "t.f64", QUILL_GGUF_FLOAT64); gb_f64(b, 3.25);
    gb_key(b, "t.str_empty", QUILL_GGUF_STRING); gb_str(b, "");
    gb_key(b, "t.arr_u8", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_UINT8, 3); gb_u8(b, 1); gb_u8(b, 2); gb_u8(b, 255);
    gb_key(b, "t.arr_i32", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_INT32, 2); gb_u32(b, (uint32_t)-7); gb_u32(b, 7);
    gb_key(b, "t.arr_f64", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_FLOAT64, 2); gb_f64(b, -0.5); gb_f64(b, 1e300);
    gb_key(b, "t.arr_bool", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_BOOL, 2); gb_u8(b, 1); gb_u8(b, 0);
    gb_key(b, "t.arr_str", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_STRING, 4);
    gb_str(b, "<s>"); gb_str(b, ""); gb_strn(b, "a\0b", 3); gb_str(b, "\xe2\x96\x81the");
    gb_key(b, "t.arr_empty", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_FLOAT32, 0);
    /* [[u16 1,2,3], [string "a","bc"], [[u8 7], [u8]]] */
    gb_key(b, "t.nested", QUILL_GGUF_ARRAY); gb_arr(b, QUILL_GGUF_ARRAY, 3);
    gb_arr(b, QUILL_GGUF_UINT16, 3); gb_u16(b, 1); gb_u16(b, 2); gb_u16(b, 3);
    gb_arr(b, QUILL_GGUF_STRING, 2); gb_str(b, "a"); gb_str(b, "bc");
    gb_arr(b, QUILL_GGUF_ARRAY, 2); gb_arr(b, QUILL_GGUF_UINT8, 1); gb_u8(b, 7); gb_arr(b, QUILL_GGUF_UINT8, 0);
    gb_key(b, "t.after", QUILL_GGUF_UINT32); gb_u32(b, 77);
    if (with_tensors) {
        static const uint64_t ne_a[2] = {3, 2}, ne_b[1] = {32};
        gb_tensor(b, "a", 2, ne_a, QUILL_TYPE_F32, 0);
        gb_tensor(b, "b", 1, ne_b, QUILL_TYPE_Q8_0, 32);
        gb_pad(b, 32);
        for (int i = 0; i < 6; i++) gb_f32(b, (float)i - 2.5f);
        gb_zeros(b, 8);
        gb_u16(b, quill_f32_to_f16(0.5f));
        for (int i = 0; i < 32; i++) gb_u8(b, (uint8_t)(int8_t)(i - 16));
    }
}

/* ---------------------------------------------------------------- metadata values */

TEST(gguf_every_scalar_type) {
    gbuf b = {0};
    build_rich(&b, 3, false);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_version(g), 3);
    CHECK_EQ_INT(quill_gguf_n_kv(g), N_RICH_KEYS);
    CHECK_EQ_INT(quill_gguf_n_tensors(g), 0);
    CHECK(strcmp(quill_gguf_path(g), "mem.gguf") == 0);
    CHECK_EQ_INT(quill_gguf_file_size(g), b.len);
    for (size_t i = 0; i < N_RICH_KEYS; i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        CHECK(kv && strcmp(kv->key, RICH_KEYS[i]) == 0, "kv %zu is '%s'", i, kv ? kv->key : "(null)");
        CHECK(quill_gguf_find(g, RICH_KEYS[i]) == &kv->value);
    }
    CHECK_EQ_INT(quill_gguf_kv_at(g, 0)->offset, 24);
    CHECK_EQ_INT(quill_gguf_kv_at(g, 1)->offset, 24 + 8 + 4 + 4 + 1);

    static const struct { const char *key; uint32_t type; size_t size; } scalars[] = {
        {"t.u8", QUILL_GGUF_UINT8, 1}, {"t.i8", QUILL_GGUF_INT8, 1}, {"t.u16", QUILL_GGUF_UINT16, 2},
        {"t.i16", QUILL_GGUF_INT16, 2}, {"t.u32", QUILL_GGUF_UINT32, 4}, {"t.i32", QUILL_GGUF_INT32, 4},
        {"t.f32", QUILL_GGUF_FLOAT32, 4}, {"t.bool_t", QUILL_GGUF_BOOL, 1}, {"t.u64", QUILL_GGUF_UINT64, 8},
        {"t.i64", QUILL_GGUF_INT64, 8}, {"t.f64", QUILL_GGUF_FLOAT64, 8},
    };
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++) {
        const quill_gguf_value *v = quill_gguf_find(g, scalars[i].key);
        CHECK(v, "%s missing", scalars[i].key);
        CHECK(v->type == scalars[i].type, "%s has type %s", scalars[i].key, quill_gguf_type_name(v->type));
        CHECK_EQ_INT(v->count, 1);
        CHECK_EQ_INT(v->nbytes, scalars[i].size);
    }
    uint64_t u;
    int64_t s;
    double d;
    bool bo;
    CHECK(quill_gguf_get_u64(g, "t.u8", &u, &err) == QUILL_OK && u == 200);
    CHECK(quill_gguf_get_i64(g, "t.i8", &s, &err) == QUILL_OK && s == -100);
    CHECK(quill_gguf_get_u64(g, "t.u16", &u, &err) == QUILL_OK && u == 60000);
    CHECK(quill_gguf_get_i64(g, "t.i16", &s, &err) == QUILL_OK && s == -30000);
    CHECK(quill_gguf_get_u64(g, "t.u32", &u, &err) == QUILL_OK && u == 4000000000u);
    CHECK(quill_gguf_get_i64(g, "t.i32", &s, &err) == QUILL_OK && s == -2000000000);
    CHECK(quill_gguf_get_f64(g, "t.f32", &d, &err) == QUILL_OK && d == 1.5);
    CHECK(quill_gguf_get_bool(g, "t.bool_t", &bo, &err) == QUILL_OK && bo);
    CHECK(quill_gguf_get_bool(g, "t.bool_f", &bo, &err) == QUILL_OK && !bo);
    CHECK(quill_gguf_get_u64(g, "t.u64", &u, &err) == QUILL_OK && u == (1ull << 63) + 5);
    CHECK(quill_gguf_get_i64(g, "t.i64", &s, &err) == QUILL_OK && s == -(INT64_C(1) << 62));
    CHECK(quill_gguf_get_f64(g, "t.f64", &d, &err) == QUILL_OK && d == 3.25);
    const char *str;
    size_t len;
    CHECK(quill_gguf_get_str(g, "t.str", &str, &len, &err) == QUILL_OK);
    CHECK(len == 15 && memcmp(str, "h\xc3\xa9llo \xe2\x96\x81world", 15) == 0, "got %zu bytes", len);
    const quill_gguf_value *sv = quill_gguf_find(g, "t.str");
    CHECK_EQ_INT(sv->count, 15);
    CHECK_EQ_INT(sv->nbytes, 8 + 15);
    CHECK(quill_gguf_get_str(g, "t.str_empty", &str, &len, &err) == QUILL_OK && len == 0);
    CHECK_EQ_INT(quill_gguf_find(g, "t.str_empty")->nbytes, 8);
    /* The value after the nested array was read from the right place. */
    CHECK(quill_gguf_get_u64(g, "t.after", &u, &err) == QUILL_OK && u == 77);
    quill_gguf_close(g);
    gb_free(&b);
}

TEST(gguf_typed_getters_conversions_and_errors) {
    gbuf b = {0};
    build_rich(&b, 3, false);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    uint64_t u = 0;
    int64_t s = 0;
    double d = 0;
    bool bo;
    const char *str;
    size_t len;
    quill_gguf_value arr;

    /* Integers of any width where they fit; floats take integers too. */
    CHECK(quill_gguf_get_i64(g, "t.u8", &s, &err) == QUILL_OK && s == 200);
    CHECK(quill_gguf_get_i64(g, "t.u32", &s, &err) == QUILL_OK && s == 4000000000);
    CHECK(quill_gguf_get_f64(g, "t.i16", &d, &err) == QUILL_OK && d == -30000);
    CHECK(quill_gguf_get_f64(g, "t.u64", &d, &err) == QUILL_OK && d == (double)((1ull << 63) + 5));
    CHECK(quill_gguf_get_f64(g, "t.i64", &d, &err) == QUILL_OK && d == -ldexp(1, 62));

    /* Wrong types: QUILL_E_FORMAT naming the key and both types. */
    static const struct { const char *key, *getter, *msg; } wrong[] = {
        {"t.i8", "u64", "metadata key 't.i8' has type i8, expected a non-negative integer"},
        {"t.i64", "u64", "metadata key 't.i64' has type i64, expected a non-negative integer"},
        {"t.f32", "u64", "metadata key 't.f32' has type f32, expected a non-negative integer"},
        {"t.bool_t", "u64", "metadata key 't.bool_t' has type bool, expected a non-negative integer"},
        {"t.u64", "i64", "metadata key 't.u64' has type u64, expected an integer"},
        {"t.str", "i64", "metadata key 't.str' has type string, expected an integer"},
        {"t.f64", "i64", "metadata key 't.f64' has type f64, expected an integer"},
        {"t.bool_f", "f64", "metadata key 't.bool_f' has type bool, expected a number"},
        {"t.arr_u8", "f64", "metadata key 't.arr_u8' has type array, expected a number"},
        {"t.u8", "bool", "metadata key 't.u8' has type u8, expected bool"},
        {"t.str", "bool", "metadata key 't.str' has type string, expected bool"},
        {"t.u32", "str", "metadata key 't.u32' has type u32, expected string"},
        {"t.arr_str", "str", "metadata key 't.arr_str' has type array, expected string"},
        {"t.str", "arr", "metadata key 't.str' has type string, expected array"},
        {"t.u64", "arr", "metadata key 't.u64' has type u64, expected array"},
    };
    for (size_t i = 0; i < sizeof wrong / sizeof wrong[0]; i++) {
        quill_status st;
        memset(&err, 0, sizeof err);
        const char *gt = wrong[i].getter, *key = wrong[i].key;
        if (!strcmp(gt, "u64")) st = quill_gguf_get_u64(g, key, &u, &err);
        else if (!strcmp(gt, "i64")) st = quill_gguf_get_i64(g, key, &s, &err);
        else if (!strcmp(gt, "f64")) st = quill_gguf_get_f64(g, key, &d, &err);
        else if (!strcmp(gt, "bool")) st = quill_gguf_get_bool(g, key, &bo, &err);
        else if (!strcmp(gt, "str")) st = quill_gguf_get_str(g, key, &str, &len, &err);
        else st = quill_gguf_get_arr(g, key, &arr, &err);
        CHECK(st == QUILL_E_FORMAT, "get_%s('%s') returned %d", gt, key, st);
        CHECK(err.status == QUILL_E_FORMAT);
        CHECK_STR_CONTAINS(err.message, wrong[i].msg);
        CHECK_STR_CONTAINS(err.message, "mem.gguf");
        /* The same without an error record. */
        if (!strcmp(gt, "u64")) st = quill_gguf_get_u64(g, key, &u, NULL);
        else if (!strcmp(gt, "str")) st = quill_gguf_get_str(g, key, &str, &len, NULL);
        CHECK(st == QUILL_E_FORMAT);
    }

    /* Absent keys: QUILL_E_NOT_FOUND from every getter. */
    quill_status st[6] = {
        quill_gguf_get_u64(g, "nope", &u, &err), quill_gguf_get_i64(g, "nope", &s, &err),
        quill_gguf_get_f64(g, "nope", &d, &err), quill_gguf_get_bool(g, "nope", &bo, &err),
        quill_gguf_get_str(g, "nope", &str, &len, &err), quill_gguf_get_arr(g, "nope", &arr, NULL),
    };
    for (int i = 0; i < 6; i++) CHECK(st[i] == QUILL_E_NOT_FOUND, "getter %d returned %d", i, st[i]);
    CHECK_STR_CONTAINS(err.message, "metadata key 'nope' is missing");
    CHECK(quill_gguf_find(g, "nope") == NULL);
    CHECK(quill_gguf_find(g, "") == NULL);
    CHECK(quill_gguf_find(g, "t.u") == NULL);
    CHECK(quill_gguf_find(g, "t.u8x") == NULL);

    /* get_arr hands out the value itself. */
    CHECK(quill_gguf_get_arr(g, "t.arr_str", &arr, &err) == QUILL_OK);
    CHECK(arr.type == QUILL_GGUF_ARRAY && arr.elem_type == QUILL_GGUF_STRING && arr.count == 4);
    CHECK(memcmp(&arr, quill_gguf_find(g, "t.arr_str"), sizeof arr) == 0);

    /* Value conversions directly. */
    const quill_gguf_value *v = quill_gguf_find(g, "t.str");
    CHECK(!quill_gguf_value_u64(v, &u) && !quill_gguf_value_i64(v, &s) && !quill_gguf_value_f64(v, &d));
    v = quill_gguf_find(g, "t.i8");
    CHECK(!quill_gguf_value_u64(v, &u) && quill_gguf_value_i64(v, &s) && s == -100);
    CHECK(strcmp(quill_gguf_type_name(QUILL_GGUF_FLOAT64), "f64") == 0);
    CHECK(strcmp(quill_gguf_type_name(QUILL_GGUF_ARRAY), "array") == 0);
    CHECK(strcmp(quill_gguf_type_name(13), "unknown") == 0);
    CHECK(strcmp(quill_gguf_type_name(0xFFFFFFFFu), "unknown") == 0);
    quill_gguf_close(g);
    gb_free(&b);
}

TEST(gguf_numeric_and_bool_arrays) {
    gbuf b = {0};
    build_rich(&b, 3, false);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    quill_gguf_value a, e;
    uint64_t cursor, u;
    int64_t s;
    double d;

    CHECK(quill_gguf_get_arr(g, "t.arr_u8", &a, &err) == QUILL_OK);
    CHECK(a.elem_type == QUILL_GGUF_UINT8 && a.count == 3 && a.nbytes == 12 + 3);
    CHECK(a.data[0] == 1 && a.data[1] == 2 && a.data[2] == 255);
    static const uint64_t want_u8[3] = {1, 2, 255};
    cursor = 0;
    for (int i = 0; i < 3; i++) {
        CHECK(quill_gguf_array_next(&a, &cursor, &e), "element %d", i);
        CHECK(e.type == QUILL_GGUF_UINT8 && e.count == 1 && e.nbytes == 1);
        CHECK(quill_gguf_value_u64(&e, &u) && u == want_u8[i]);
    }
    CHECK(!quill_gguf_array_next(&a, &cursor, &e));
    CHECK(!quill_gguf_array_next(&a, &cursor, &e), "stays at the end");

    CHECK(quill_gguf_get_arr(g, "t.arr_i32", &a, &err) == QUILL_OK);
    CHECK(a.elem_type == QUILL_GGUF_INT32 && a.count == 2 && a.nbytes == 12 + 8);
    cursor = 0;
    CHECK(quill_gguf_array_next(&a, &cursor, &e) && quill_gguf_value_i64(&e, &s) && s == -7);
    CHECK(!quill_gguf_value_u64(&e, &u), "-7 is not a u64");
    CHECK(quill_gguf_array_next(&a, &cursor, &e) && quill_gguf_value_i64(&e, &s) && s == 7);
    CHECK(!quill_gguf_array_next(&a, &cursor, &e));

    CHECK(quill_gguf_get_arr(g, "t.arr_f64", &a, &err) == QUILL_OK);
    cursor = 0;
    CHECK(quill_gguf_array_next(&a, &cursor, &e) && quill_gguf_value_f64(&e, &d) && d == -0.5);
    CHECK(quill_gguf_array_next(&a, &cursor, &e) && quill_gguf_value_f64(&e, &d) && d == 1e300);

    CHECK(quill_gguf_get_arr(g, "t.arr_bool", &a, &err) == QUILL_OK);
    CHECK(a.elem_type == QUILL_GGUF_BOOL && a.count == 2);
    cursor = 0;
    CHECK(quill_gguf_array_next(&a, &cursor, &e) && e.type == QUILL_GGUF_BOOL && e.data[0] == 1);
    CHECK(quill_gguf_array_next(&a, &cursor, &e) && e.data[0] == 0);

    CHECK(quill_gguf_get_arr(g, "t.arr_empty", &a, &err) == QUILL_OK);
    CHECK(a.elem_type == QUILL_GGUF_FLOAT32 && a.count == 0 && a.nbytes == 12);
    cursor = 0;
    CHECK(!quill_gguf_array_next(&a, &cursor, &e));

    /* array_next on something that is not an array. */
    cursor = 0;
    CHECK(!quill_gguf_array_next(quill_gguf_find(g, "t.u32"), &cursor, &e));
    CHECK(!quill_gguf_array_next(quill_gguf_find(g, "t.str"), &cursor, &e));
    quill_gguf_close(g);
    gb_free(&b);
}

TEST(gguf_string_arrays) {
    gbuf b = {0};
    build_rich(&b, 3, false);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    quill_gguf_value a, e;
    CHECK(quill_gguf_get_arr(g, "t.arr_str", &a, &err) == QUILL_OK);
    CHECK(a.nbytes == 12 + (8 + 3) + 8 + (8 + 3) + (8 + 6), "nbytes %llu", (unsigned long long)a.nbytes);
    static const struct { const char *s; size_t n; } want[4] = {
        {"<s>", 3}, {"", 0}, {"a\0b", 3}, {"\xe2\x96\x81the", 6},
    };
    uint64_t cursor = 0;
    for (int i = 0; i < 4; i++) {
        CHECK(quill_gguf_array_next(&a, &cursor, &e), "element %d", i);
        CHECK(e.type == QUILL_GGUF_STRING);
        CHECK(e.count == want[i].n && e.nbytes == 8 + want[i].n, "element %d: %llu bytes", i,
              (unsigned long long)e.count);
        CHECK(bytes_eq(e.data, want[i].s, want[i].n), "element %d bytes", i);
    }
    CHECK(!quill_gguf_array_next(&a, &cursor, &e));
    CHECK_EQ_INT(cursor, a.nbytes - 12);
    quill_gguf_close(g);
    gb_free(&b);
}

TEST(gguf_nested_arrays) {
    gbuf b = {0};
    build_rich(&b, 3, false);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    quill_gguf_value a, e, x, y;
    CHECK(quill_gguf_get_arr(g, "t.nested", &a, &err) == QUILL_OK);
    CHECK(a.elem_type == QUILL_GGUF_ARRAY && a.count == 3);
    uint64_t c = 0, c2, u;

    /* [u16 1, 2, 3] */
    CHECK(quill_gguf_array_next(&a, &c, &e));
    CHECK(e.type == QUILL_GGUF_ARRAY && e.elem_type == QUILL_GGUF_UINT16 && e.count == 3 && e.nbytes == 12 + 6);
    c2 = 0;
    for (uint64_t i = 1; i <= 3; i++)
        CHECK(quill_gguf_array_next(&e, &c2, &x) && quill_gguf_value_u64(&x, &u) && u == i);
    CHECK(!quill_gguf_array_next(&e, &c2, &x));

    /* [string "a", "bc"] */
    CHECK(quill_gguf_array_next(&a, &c, &e));
    CHECK(e.elem_type == QUILL_GGUF_STRING && e.count == 2 && e.nbytes == 12 + 9 + 10);
    c2 = 0;
    CHECK(quill_gguf_array_next(&e, &c2, &x) && x.count == 1 && x.data[0] == 'a');
    CHECK(quill_gguf_array_next(&e, &c2, &x) && x.count == 2 && memcmp(x.data, "bc", 2) == 0);
    CHECK(!quill_gguf_array_next(&e, &c2, &x));

    /* [[u8 7], [u8]] */
    CHECK(quill_gguf_array_next(&a, &c, &e));
    CHECK(e.elem_type == QUILL_GGUF_ARRAY && e.count == 2 && e.nbytes == 12 + 13 + 12,
          "nbytes %llu", (unsigned long long)e.nbytes);
    c2 = 0;
    CHECK(quill_gguf_array_next(&e, &c2, &x) && x.elem_type == QUILL_GGUF_UINT8 && x.count == 1);
    uint64_t c3 = 0;
    CHECK(quill_gguf_array_next(&x, &c3, &y) && y.data[0] == 7);
    CHECK(!quill_gguf_array_next(&x, &c3, &y));
    CHECK(quill_gguf_array_next(&e, &c2, &x) && x.count == 0 && x.nbytes == 12);
    CHECK(!quill_gguf_array_next(&e, &c2, &x));
    CHECK(!quill_gguf_array_next(&a, &c, &e));
    CHECK_EQ_INT(c, a.nbytes - 12);

    char why[256] = "";
    CHECK(walk_file(g, b.p, b.len, why, sizeof why), "%s", why);
    quill_gguf_close(g);
    gb_free(&b);
}

/* Eight levels of arrays are accepted (nine are not: see the malformed corpus). */
TEST(gguf_nested_depth_limit) {
    for (int levels = 1; levels <= 9; levels++) {
        gbuf b = {0};
        gb_header(&b, 3, 0, 1);
        gb_key(&b, "deep", QUILL_GGUF_ARRAY);
        for (int i = 0; i < levels - 1; i++) gb_arr(&b, QUILL_GGUF_ARRAY, 1);
        gb_arr(&b, QUILL_GGUF_STRING, 1);
        gb_str(&b, "leaf");
        quill_error err = {0};
        quill_gguf *g = open_buf(&b, &err);
        if (levels <= 8) {
            CHECK(g, "%d levels: %s", levels, err.message);
            const quill_gguf_value *v = quill_gguf_find(g, "deep");
            quill_gguf_value cur = *v, e;
            for (int i = 0; i < levels - 1; i++) {
                uint64_t c = 0;
                CHECK(quill_gguf_array_next(&cur, &c, &e) && e.type == QUILL_GGUF_ARRAY);
                cur = e;
            }
            uint64_t c = 0;
            CHECK(quill_gguf_array_next(&cur, &c, &e) && e.count == 4 && memcmp(e.data, "leaf", 4) == 0);
            quill_gguf_close(g);
        } else {
            CHECK(!g && err.status == QUILL_E_FORMAT);
            CHECK_STR_CONTAINS(err.message, "arrays in 'deep' are nested more than 8 deep");
        }
        gb_free(&b);
    }
}

/* ---------------------------------------------------------------- versions, alignment */

TEST(gguf_versions_2_and_3) {
    gbuf b2 = {0}, b3 = {0};
    build_rich(&b2, 2, true);
    build_rich(&b3, 3, true);
    quill_error err = {0};
    quill_gguf *g2 = open_buf(&b2, &err);
    CHECK(g2, "v2: %s", err.message);
    quill_gguf *g3 = open_buf(&b3, &err);
    CHECK(g3, "v3: %s", err.message);
    CHECK_EQ_INT(quill_gguf_version(g2), 2);
    CHECK_EQ_INT(quill_gguf_version(g3), 3);
    CHECK_EQ_INT(quill_gguf_n_kv(g2), quill_gguf_n_kv(g3));
    CHECK_EQ_INT(quill_gguf_n_tensors(g2), 2);
    CHECK_EQ_INT(quill_gguf_data_offset(g2), quill_gguf_data_offset(g3));
    for (uint64_t i = 0; i < quill_gguf_n_kv(g2); i++) {
        const quill_gguf_kv *a = quill_gguf_kv_at(g2, i), *c = quill_gguf_kv_at(g3, i);
        CHECK(strcmp(a->key, c->key) == 0 && a->value.type == c->value.type && a->value.nbytes == c->value.nbytes);
        CHECK(a->offset == c->offset && bytes_eq(a->value.data, c->value.data, a->value.nbytes - (a->value.type == QUILL_GGUF_ARRAY ? 12 : a->value.type == QUILL_GGUF_STRING ? 8 : 0)));
    }
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g2, "a");
    CHECK(t && t->type == QUILL_TYPE_F32 && t->ne[0] == 3 && t->ne[1] == 2);
    float f[6];
    memcpy(f, t->data, sizeof f);
    CHECK(f[0] == -2.5f && f[5] == 2.5f);
    char why[256] = "";
    CHECK(walk_file(g2, b2.p, b2.len, why, sizeof why), "v2: %s", why);
    CHECK(walk_file(g3, b3.p, b3.len, why, sizeof why), "v3: %s", why);
    quill_gguf_close(g2);
    quill_gguf_close(g3);
    gb_free(&b2);
    gb_free(&b3);
}

TEST(gguf_minimal_file) {
    gbuf b = {0};
    gb_header(&b, 3, 0, 0);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_n_kv(g), 0);
    CHECK_EQ_INT(quill_gguf_n_tensors(g), 0);
    CHECK_EQ_INT(quill_gguf_alignment(g), 32);
    CHECK_EQ_INT(quill_gguf_data_offset(g), 32);
    CHECK_EQ_INT(quill_gguf_file_size(g), 24);
    CHECK(quill_gguf_kv_at(g, 0) == NULL && quill_gguf_tensor_at(g, 0) == NULL);
    CHECK(quill_gguf_find(g, "general.architecture") == NULL);
    CHECK(quill_gguf_find_tensor(g, "token_embd.weight") == NULL);
    uint64_t u;
    CHECK(quill_gguf_get_u64(g, "x", &u, &err) == QUILL_E_NOT_FOUND);
    quill_gguf_close(g);
    quill_gguf_close(NULL);
    gb_free(&b);
}

TEST(gguf_alignment_key) {
    quill_error err = {0};
    /* Alignment 1: the data starts right after the directory and offsets need no padding. */
    {
        gbuf b = {0};
        static const uint64_t ne[1] = {2};
        gb_header(&b, 3, 2, 1);
        gb_key(&b, "general.alignment", QUILL_GGUF_UINT32);
        gb_u32(&b, 1);
        gb_tensor(&b, "x", 1, ne, QUILL_TYPE_F16, 0);
        gb_tensor(&b, "y", 1, ne, QUILL_TYPE_F32, 5);
        size_t dir_end = b.len;
        gb_raw(&b, "\x00\x3c\x00\xc0", 4); /* f16 1, -2 */
        gb_u8(&b, 0x55);
        gb_f32(&b, 0.25f); /* y at the odd data offset 5 */
        gb_f32(&b, 8.0f);
        quill_gguf *g = open_buf(&b, &err);
        CHECK(g, "%s", err.message);
        CHECK_EQ_INT(quill_gguf_alignment(g), 1);
        CHECK_EQ_INT(quill_gguf_data_offset(g), dir_end);
        const quill_gguf_tensor *y = quill_gguf_find_tensor(g, "y");
        CHECK(y && y->file_offset == dir_end + 5 && (const uint8_t *)y->data == b.p + dir_end + 5);
        float f[2];
        CHECK(quill_dequantize(y->type, y->data, f, 2, &err) == QUILL_OK && f[0] == 0.25f && f[1] == 8.0f);
        const quill_gguf_tensor *x = quill_gguf_find_tensor(g, "x");
        CHECK(quill_dequantize(x->type, x->data, f, 2, &err) == QUILL_OK && f[0] == 1.0f && f[1] == -2.0f,
              "%g %g", f[0], f[1]);
        quill_gguf_close(g);
        gb_free(&b);
    }
    /* The largest alignment accepted; without tensors the data section may start past the end. */
    {
        gbuf b = {0};
        gb_header(&b, 3, 0, 1);
        gb_key(&b, "general.alignment", QUILL_GGUF_UINT32);
        gb_u32(&b, 1u << 20);
        quill_gguf *g = open_buf(&b, &err);
        CHECK(g, "%s", err.message);
        CHECK_EQ_INT(quill_gguf_alignment(g), 1 << 20);
        CHECK_EQ_INT(quill_gguf_data_offset(g), 1 << 20);
        quill_gguf_close(g);
        gb_free(&b);
    }
    /* Alignment 64 with the key after other metadata: the tensor offsets obey it. */
    {
        gbuf b = {0};
        static const uint64_t ne[1] = {4};
        gb_header(&b, 3, 2, 2);
        gb_key(&b, "general.name", QUILL_GGUF_STRING);
        gb_str(&b, "x");
        gb_key(&b, "general.alignment", QUILL_GGUF_UINT32);
        gb_u32(&b, 64);
        gb_tensor(&b, "a", 1, ne, QUILL_TYPE_F32, 0);
        gb_tensor(&b, "b", 1, ne, QUILL_TYPE_F32, 64);
        gb_pad(&b, 64);
        size_t data = b.len;
        for (int i = 0; i < 4; i++) gb_f32(&b, (float)i);
        gb_pad(&b, 64);
        for (int i = 0; i < 4; i++) gb_f32(&b, (float)(10 + i));
        quill_gguf *g = open_buf(&b, &err);
        CHECK(g, "%s", err.message);
        CHECK_EQ_INT(quill_gguf_alignment(g), 64);
        CHECK_EQ_INT(quill_gguf_data_offset(g), data);
        CHECK_EQ_INT(data % 64, 0);
        const quill_gguf_tensor *t = quill_gguf_find_tensor(g, "b");
        CHECK(t->file_offset == data + 64 && ((const float *)t->data)[3] == 13.0f);
        quill_gguf_close(g);
        gb_free(&b);
    }
}

/* ---------------------------------------------------------------- tensors through the writer */

typedef struct {
    const char *name;
    uint32_t type, n_dims;
    int64_t ne[4];
} tensor_spec;

static const tensor_spec SPECS[] = {
    {"f32.1d", QUILL_TYPE_F32, 1, {7}},
    {"f16.2d", QUILL_TYPE_F16, 2, {4, 3}},
    {"q8_0.3d", QUILL_TYPE_Q8_0, 3, {64, 2, 2}},
    {"bf16.4d", QUILL_TYPE_BF16, 4, {2, 3, 4, 5}},
    {"blk.0.q4_K", QUILL_TYPE_Q4_K, 2, {256, 2}},
    {"i32", QUILL_TYPE_I32, 1, {5}},
    {"empty", QUILL_TYPE_F32, 2, {0, 3}},
    {"", QUILL_TYPE_F32, 1, {1}},
};
#define N_SPECS (sizeof SPECS / sizeof SPECS[0])

static size_t spec_bytes(const tensor_spec *s) {
    size_t rows = 1;
    for (uint32_t d = 1; d < s->n_dims; d++) rows *= (size_t)s->ne[d];
    return quill_row_size(s->type, s->ne[0]) * rows;
}

/* Data with valid halves (so f16/bf16/q8_0 dequantize to finite values) and a per-tensor seed. */
static void fill_spec(const tensor_spec *s, uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)(i * 7 + seed * 13 + 1);
    if (s->type == QUILL_TYPE_F32)
        for (size_t i = 0; i + 4 <= n; i += 4) { float f = (float)i * 0.25f - (float)seed; memcpy(p + i, &f, 4); }
    if (s->type == QUILL_TYPE_F16 || s->type == QUILL_TYPE_BF16)
        for (size_t i = 0; i + 2 <= n; i += 2) {
            uint16_t h = s->type == QUILL_TYPE_F16 ? quill_f32_to_f16((float)i - 3.0f) : quill_f32_to_bf16((float)i - 3.0f);
            memcpy(p + i, &h, 2);
        }
    if (s->type == QUILL_TYPE_Q8_0)
        for (size_t i = 0; i < n; i += 34) { uint16_t h = quill_f32_to_f16(0.125f); memcpy(p + i, &h, 2); }
}

static char *write_spec_file(const char *name, uint32_t alignment, uint8_t **datas, quill_error *err) {
    quill_gguf_writer *w = quill_gguf_writer_new();
    if (!w) return NULL;
    if (alignment) quill_gguf_writer_set_alignment(w, alignment);
    quill_gguf_writer_add_str(w, "general.architecture", "test", 4);
    for (size_t i = 0; i < N_SPECS; i++) {
        size_t n = spec_bytes(&SPECS[i]);
        datas[i] = malloc(n ? n : 1);
        fill_spec(&SPECS[i], datas[i], n, (unsigned)i);
        if (quill_gguf_writer_add_tensor(w, SPECS[i].name, SPECS[i].type, SPECS[i].n_dims, SPECS[i].ne,
                                         datas[i]) != QUILL_OK) {
            quill_gguf_writer_free(w);
            return NULL;
        }
    }
    char *path = tmp_path(name);
    quill_status s = quill_gguf_writer_write(w, path, err);
    quill_gguf_writer_free(w);
    if (s != QUILL_OK) {
        free(path);
        return NULL;
    }
    return path;
}

static void check_spec_file(const char *path, uint32_t alignment, uint8_t **datas) {
    quill_error err = {0};
    quill_gguf *g;
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_alignment(g), alignment);
    CHECK_EQ_INT(quill_gguf_data_offset(g) % alignment, 0);
    CHECK_EQ_INT(quill_gguf_n_tensors(g), N_SPECS);
    for (size_t i = 0; i < N_SPECS; i++) {
        const tensor_spec *s = &SPECS[i];
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        CHECK(strcmp(t->name, s->name) == 0, "tensor %zu is '%s'", i, t->name);
        CHECK(quill_gguf_find_tensor(g, s->name) == t, "find_tensor('%s')", s->name);
        CHECK(t->type == s->type && t->n_dims == s->n_dims, "%s: type %u dims %u", s->name, t->type, t->n_dims);
        int64_t n = 1;
        for (uint32_t d = 0; d < 4; d++) {
            int64_t want = d < s->n_dims ? s->ne[d] : 1;
            CHECK(t->ne[d] == want, "%s: ne[%u] = %lld, expected %lld", s->name, d, (long long)t->ne[d], (long long)want);
            n *= want;
        }
        CHECK_EQ_INT(t->n_elements, n);
        size_t nb = spec_bytes(s);
        CHECK_EQ_INT(t->nbytes, nb);
        CHECK_EQ_INT(t->offset % alignment, 0);
        CHECK_EQ_INT(t->file_offset, quill_gguf_data_offset(g) + t->offset);
        CHECK(bytes_eq(t->data, datas[i], nb), "%s: data differs", s->name);
        const quill_type_traits *tr = quill_type_traits_of(t->type);
        if (tr->to_float && n > 0) {
            float *out = malloc((size_t)n * sizeof *out);
            CHECK(quill_dequantize(t->type, t->data, out, n, &err) == QUILL_OK, "%s", err.message);
            if (t->type == QUILL_TYPE_F32) CHECK(memcmp(out, datas[i], nb) == 0);
            if (t->type == QUILL_TYPE_F16) CHECK(out[0] == -3.0f && out[1] == -1.0f, "%g %g", out[0], out[1]);
            if (t->type == QUILL_TYPE_Q8_0) CHECK(out[0] == 0.125f * (float)(int8_t)datas[i][2]);
            for (int64_t k = 0; k < n; k++) CHECK(isfinite(out[k]), "%s[%lld] = %g", s->name, (long long)k, out[k]);
            free(out);
        }
    }
    CHECK(quill_gguf_find_tensor(g, "missing") == NULL);
    CHECK(quill_gguf_find_tensor(g, "f32.1") == NULL);
    CHECK(quill_gguf_find_tensor(g, "f32.1d ") == NULL);
    quill_gguf_close(g);
}

TEST(gguf_tensor_lookup_default_alignment) {
    uint8_t *datas[N_SPECS] = {0};
    quill_error err = {0};
    char *path = write_spec_file("specs32.gguf", 0, datas, &err);
    CHECK(path, "%s", err.message);
    check_spec_file(path, 32, datas);
    for (size_t i = 0; i < N_SPECS; i++) free(datas[i]);
    free(path);
}

TEST(gguf_tensor_lookup_alignment_64_and_1) {
    static const uint32_t aligns[] = {64, 1, 4096};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        uint8_t *datas[N_SPECS] = {0};
        quill_error err = {0};
        char name[64];
        snprintf(name, sizeof name, "specs%u.gguf", aligns[k]);
        char *path = write_spec_file(name, aligns[k], datas, &err);
        CHECK(path, "%s", err.message);
        check_spec_file(path, aligns[k], datas);
        for (size_t i = 0; i < N_SPECS; i++) free(datas[i]);
        free(path);
    }
}

/* ---------------------------------------------------------------- writer */

TEST(gguf_writer_typed_adders) {
    quill_gguf_writer *w = quill_gguf_writer_new();
    CHECK(w);
    CHECK(quill_gguf_writer_add_u32(w, "w.u32", 4000000000u) == QUILL_OK);
    CHECK(quill_gguf_writer_add_i32(w, "w.i32", -5) == QUILL_OK);
    CHECK(quill_gguf_writer_add_u64(w, "w.u64", UINT64_MAX) == QUILL_OK);
    CHECK(quill_gguf_writer_add_f32(w, "w.f32", -0.75f) == QUILL_OK);
    CHECK(quill_gguf_writer_add_bool(w, "w.bool", true) == QUILL_OK);
    CHECK(quill_gguf_writer_add_str(w, "w.str", "a\0b", 3) == QUILL_OK);
    static const uint16_t u16s[3] = {1, 65535, 3};
    static const double f64s[2] = {0.5, -1e-300};
    static const uint8_t bools[2] = {0, 1};
    CHECK(quill_gguf_writer_add_arr(w, "w.u16s", QUILL_GGUF_UINT16, u16s, 3) == QUILL_OK);
    CHECK(quill_gguf_writer_add_arr(w, "w.f64s", QUILL_GGUF_FLOAT64, f64s, 2) == QUILL_OK);
    CHECK(quill_gguf_writer_add_arr(w, "w.bools", QUILL_GGUF_BOOL, bools, 2) == QUILL_OK);
    CHECK(quill_gguf_writer_add_arr(w, "w.none", QUILL_GGUF_INT64, NULL, 0) == QUILL_OK);
    const char *strs[3] = {"x", "", "\xe2\x96\x81y"};
    const size_t lens[3] = {1, 0, 4};
    CHECK(quill_gguf_writer_add_str_arr(w, "w.strs", strs, NULL, 3) == QUILL_OK);
    CHECK(quill_gguf_writer_add_str_arr(w, "w.strs_len", strs, lens, 3) == QUILL_OK);

    /* What the reader would reject is refused up front. */
    CHECK(quill_gguf_writer_add_u32(w, "w.u32", 1) == QUILL_E_ARG, "duplicate key");
    CHECK(quill_gguf_writer_add_str(w, "w.i32", "x", 1) == QUILL_E_ARG, "duplicate key, other type");
    CHECK(quill_gguf_writer_add_arr(w, "w.bad", QUILL_GGUF_STRING, strs, 1) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_arr(w, "w.bad", QUILL_GGUF_ARRAY, strs, 1) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_str(w, "general.alignment", "32", 2) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_u64(w, "general.alignment", 32) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_u32(w, "general.alignment", 48) == QUILL_E_ARG);
    float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int64_t ne1[1] = {8}, ne_q[1] = {16}, ne_neg[2] = {8, -1}, ne5[5] = {1, 1, 1, 1, 1}, ne_big[2] = {INT64_C(1) << 40, INT64_C(1) << 40};
    CHECK(quill_gguf_writer_add_tensor(w, "t", QUILL_TYPE_F32, 1, ne1, data) == QUILL_OK);
    CHECK(quill_gguf_writer_add_tensor(w, "t", QUILL_TYPE_F32, 1, ne1, data) == QUILL_E_ARG, "duplicate name");
    CHECK(quill_gguf_writer_add_tensor(w, "t0", QUILL_TYPE_F32, 0, ne1, data) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_tensor(w, "t5", QUILL_TYPE_F32, 5, ne5, data) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_tensor(w, "tq", QUILL_TYPE_Q4_0, 1, ne_q, data) == QUILL_E_ARG, "16 is not a multiple of 32");
    CHECK(quill_gguf_writer_add_tensor(w, "tu", 4, 1, ne1, data) == QUILL_E_ARG, "unknown type");
    CHECK(quill_gguf_writer_add_tensor(w, "tn", QUILL_TYPE_F32, 2, ne_neg, data) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_tensor(w, "tb", QUILL_TYPE_F32, 2, ne_big, data) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_tensor(w, "tnull", QUILL_TYPE_F32, 1, ne1, NULL) == QUILL_E_ARG);

    char *path = tmp_path("adders.gguf");
    quill_error err = {0};
    CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);

    quill_gguf *g;
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_version(g), 3);
    CHECK_EQ_INT(quill_gguf_n_kv(g), 12);
    CHECK_EQ_INT(quill_gguf_n_tensors(g), 1);
    uint64_t u;
    int64_t s;
    double d;
    bool bo;
    const char *str;
    size_t len;
    CHECK(quill_gguf_get_u64(g, "w.u32", &u, &err) == QUILL_OK && u == 4000000000u);
    CHECK(quill_gguf_find(g, "w.u32")->type == QUILL_GGUF_UINT32);
    CHECK(quill_gguf_get_i64(g, "w.i32", &s, &err) == QUILL_OK && s == -5);
    CHECK(quill_gguf_find(g, "w.i32")->type == QUILL_GGUF_INT32);
    CHECK(quill_gguf_get_u64(g, "w.u64", &u, &err) == QUILL_OK && u == UINT64_MAX);
    CHECK(quill_gguf_get_f64(g, "w.f32", &d, &err) == QUILL_OK && d == -0.75);
    CHECK(quill_gguf_get_bool(g, "w.bool", &bo, &err) == QUILL_OK && bo);
    CHECK(quill_gguf_get_str(g, "w.str", &str, &len, &err) == QUILL_OK && len == 3 && memcmp(str, "a\0b", 3) == 0);
    quill_gguf_value a, e;
    uint64_t c = 0;
    CHECK(quill_gguf_get_arr(g, "w.u16s", &a, &err) == QUILL_OK && a.elem_type == QUILL_GGUF_UINT16 && a.count == 3);
    CHECK(memcmp(a.data, u16s, sizeof u16s) == 0);
    CHECK(quill_gguf_get_arr(g, "w.f64s", &a, &err) == QUILL_OK && memcmp(a.data, f64s, sizeof f64s) == 0);
    CHECK(quill_gguf_get_arr(g, "w.bools", &a, &err) == QUILL_OK && a.elem_type == QUILL_GGUF_BOOL && a.data[1] == 1);
    CHECK(quill_gguf_get_arr(g, "w.none", &a, &err) == QUILL_OK && a.elem_type == QUILL_GGUF_INT64 && a.count == 0);
    for (int k = 0; k < 2; k++) {
        CHECK(quill_gguf_get_arr(g, k ? "w.strs_len" : "w.strs", &a, &err) == QUILL_OK);
        CHECK(a.elem_type == QUILL_GGUF_STRING && a.count == 3);
        c = 0;
        for (int i = 0; i < 3; i++) {
            CHECK(quill_gguf_array_next(&a, &c, &e));
            CHECK(e.count == lens[i] && bytes_eq(e.data, strs[i], lens[i]), "string %d", i);
        }
    }
    CHECK(quill_gguf_find(g, "w.bad") == NULL && quill_gguf_find(g, "general.alignment") == NULL);
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g, "t");
    CHECK(t && t->nbytes == sizeof data && memcmp(t->data, data, sizeof data) == 0);
    quill_gguf_close(g);
    free(path);
}

TEST(gguf_writer_alignment) {
    quill_error err = {0};
    char *path = tmp_path("align.gguf");
    float data[3] = {1, 2, 3};
    int64_t ne[1] = {3};
    /* Setting it twice keeps one key with the last value. */
    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_set_alignment(w, 16);
    quill_gguf_writer_add_u32(w, "x", 1);
    quill_gguf_writer_set_alignment(w, 128);
    CHECK(quill_gguf_writer_add_tensor(w, "a", QUILL_TYPE_F32, 1, ne, data) == QUILL_OK);
    CHECK(quill_gguf_writer_add_tensor(w, "b", QUILL_TYPE_F32, 1, ne, data) == QUILL_OK);
    CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);
    quill_gguf *g;
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_n_kv(g), 2);
    CHECK_EQ_INT(quill_gguf_alignment(g), 128);
    CHECK_EQ_INT(quill_gguf_find_tensor(g, "b")->offset, 128);
    CHECK_EQ_INT(quill_gguf_file_size(g) % 128, 0);
    quill_gguf_close(g);

    /* add_u32 of general.alignment is the same as set_alignment. */
    w = quill_gguf_writer_new();
    CHECK(quill_gguf_writer_add_u32(w, "general.alignment", 8) == QUILL_OK);
    CHECK(quill_gguf_writer_add_tensor(w, "a", QUILL_TYPE_F32, 1, ne, data) == QUILL_OK);
    CHECK(quill_gguf_writer_add_tensor(w, "b", QUILL_TYPE_F32, 1, ne, data) == QUILL_OK);
    CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_alignment(g), 8);
    CHECK_EQ_INT(quill_gguf_find_tensor(g, "b")->offset, 16);
    quill_gguf_close(g);

    /* Invalid alignments make writing fail instead of dividing by zero or misplacing data. */
    static const uint32_t bad[] = {0, 3, 48, 1u << 21, 0x80000000u};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        w = quill_gguf_writer_new();
        quill_gguf_writer_set_alignment(w, bad[i]);
        CHECK(quill_gguf_writer_add_tensor(w, "a", QUILL_TYPE_F32, 1, ne, data) == QUILL_OK);
        memset(&err, 0, sizeof err);
        CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_E_ARG, "alignment %u", bad[i]);
        CHECK_STR_CONTAINS(err.message, "alignment");
        quill_gguf_writer_free(w);
    }
    free(path);
}

TEST(gguf_writer_error_on_bad_path) {
    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_add_u32(w, "x", 1);
    quill_error err = {0};
    CHECK(quill_gguf_writer_write(w, "/nonexistent-dir/x.gguf", &err) == QUILL_E_IO);
    CHECK_STR_CONTAINS(err.message, "/nonexistent-dir/x.gguf: cannot create");
    quill_gguf_writer_free(w);
    quill_gguf_writer_free(NULL);
}

/* The raw serialized bytes of a value, as add_value copies them. */
static void value_bytes(const quill_gguf_value *v, const uint8_t **p, uint64_t *n) {
    if (v->type == QUILL_GGUF_ARRAY) { *p = v->data - 12; *n = v->nbytes; }
    else if (v->type == QUILL_GGUF_STRING) { *p = v->data - 8; *n = v->nbytes; }
    else { *p = v->data; *n = v->nbytes; }
}

static bool same_value(const quill_gguf_value *a, const quill_gguf_value *b) {
    const uint8_t *pa, *pb;
    uint64_t na, nb;
    value_bytes(a, &pa, &na);
    value_bytes(b, &pb, &nb);
    return a->type == b->type && a->elem_type == b->elem_type && a->count == b->count && na == nb &&
           bytes_eq(pa, pb, na);
}

/* Copies every kv (add_value) and tensor of g into a new file at `path`. */
static quill_status copy_gguf(const quill_gguf *g, const char *path, quill_error *err) {
    quill_gguf_writer *w = gguf_copy_writer(g, NULL);
    if (!w) {
        snprintf(err->message, sizeof err->message, "copying into the writer failed");
        return QUILL_E_FORMAT;
    }
    quill_status s = quill_gguf_writer_write(w, path, err);
    quill_gguf_writer_free(w);
    return s;
}

static bool same_files(const char *a, const char *b) {
    size_t na, nb;
    void *pa = read_file(a, &na), *pb = read_file(b, &nb);
    bool same = pa && pb && na == nb && memcmp(pa, pb, na) == 0;
    free(pa);
    free(pb);
    return same;
}

TEST(gguf_writer_add_value_round_trip_every_type) {
    gbuf b = {0};
    build_rich(&b, 2, true);
    quill_error err = {0};
    quill_gguf *src = open_buf(&b, &err);
    CHECK(src, "%s", err.message);
    char *p1 = tmp_path("copy1.gguf"), *p2 = tmp_path("copy2.gguf");

    /* add_value of every kv plus array elements taken out on their own. */
    quill_gguf_writer *w = quill_gguf_writer_new();
    for (uint64_t i = 0; i < quill_gguf_n_kv(src); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(src, i);
        CHECK(quill_gguf_writer_add_value(w, kv->key, &kv->value) == QUILL_OK, "add_value('%s')", kv->key);
    }
    quill_gguf_value elems[4], e;
    uint64_t c = 0;
    CHECK(quill_gguf_array_next(quill_gguf_find(src, "t.arr_str"), &c, &elems[0]));    /* string element */
    c = 0;
    CHECK(quill_gguf_array_next(quill_gguf_find(src, "t.arr_i32"), &c, &elems[1]));    /* scalar element */
    c = 0;
    CHECK(quill_gguf_array_next(quill_gguf_find(src, "t.nested"), &c, &e));
    CHECK(quill_gguf_array_next(quill_gguf_find(src, "t.nested"), &c, &elems[2]));     /* array of strings */
    CHECK(quill_gguf_array_next(quill_gguf_find(src, "t.nested"), &c, &elems[3]));     /* array of arrays */
    static const char *const ekeys[4] = {"e.str", "e.i32", "e.strs", "e.arrs"};
    for (int i = 0; i < 4; i++) CHECK(quill_gguf_writer_add_value(w, ekeys[i], &elems[i]) == QUILL_OK);
    CHECK(quill_gguf_writer_add_value(w, "t.u8", quill_gguf_find(src, "t.u8")) == QUILL_E_ARG, "duplicate");
    for (uint64_t i = 0; i < quill_gguf_n_tensors(src); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(src, i);
        CHECK(quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK);
    }
    CHECK(quill_gguf_writer_write(w, p1, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);

    quill_gguf *g;
    CHECK(quill_gguf_open(p1, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_gguf_n_kv(g), quill_gguf_n_kv(src) + 4);
    for (uint64_t i = 0; i < quill_gguf_n_kv(src); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(src, i), *kv2 = quill_gguf_kv_at(g, i);
        CHECK(strcmp(kv->key, kv2->key) == 0);
        CHECK(same_value(&kv->value, &kv2->value), "'%s' differs after the copy", kv->key);
    }
    for (int i = 0; i < 4; i++) CHECK(same_value(&elems[i], quill_gguf_find(g, ekeys[i])), "%s", ekeys[i]);
    for (uint64_t i = 0; i < quill_gguf_n_tensors(src); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(src, i), *t2 = quill_gguf_find_tensor(g, t->name);
        CHECK(t2 && t2->type == t->type && t2->nbytes == t->nbytes && memcmp(t2->ne, t->ne, sizeof t->ne) == 0);
        CHECK(bytes_eq(t->data, t2->data, t->nbytes));
    }
    char why[256] = "";
    CHECK(walk_file(g, NULL, quill_gguf_file_size(g), why, sizeof why), "%s", why);

    /* Copying the copy gives the same bytes. */
    CHECK(copy_gguf(g, p2, &err) == QUILL_OK, "%s", err.message);
    CHECK(same_files(p1, p2), "a copy of a copy differs");
    quill_gguf_close(g);
    quill_gguf_close(src);
    gb_free(&b);
    free(p1);
    free(p2);
}

/* ---------------------------------------------------------------- open paths */

TEST(gguf_open_errors) {
    quill_gguf *g = (quill_gguf *)1;
    quill_error err = {0};
    CHECK(quill_gguf_open("/nonexistent/model.gguf", &g, &err) == QUILL_E_NOT_FOUND);
    CHECK(g == NULL);
    CHECK_STR_CONTAINS(err.message, "/nonexistent/model.gguf: cannot open");
    CHECK(quill_gguf_open(tmp_dir(), &g, &err) == QUILL_E_IO);
    CHECK_STR_CONTAINS(err.message, "not a regular file");
    CHECK(quill_gguf_open("/nonexistent/model.gguf", &g, NULL) == QUILL_E_NOT_FOUND);
    CHECK(quill_gguf_open_memory(NULL, 0, NULL, &g, &err) == QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "(memory): offset 0: the file is empty");
}

TEST(gguf_open_file_and_memory_agree) {
    gbuf b = {0};
    build_rich(&b, 3, true);
    char *path = tmp_path("rich.gguf");
    FILE *f = fopen(path, "wb");
    CHECK(f && fwrite(b.p, 1, b.len, f) == b.len && fclose(f) == 0);
    quill_error err = {0};
    quill_gguf *a, *m;
    CHECK(quill_gguf_open(path, &a, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_open_memory(b.p, b.len, path, &m, &err) == QUILL_OK, "%s", err.message);
    CHECK(strcmp(quill_gguf_path(a), path) == 0 && strcmp(quill_gguf_path(m), path) == 0);
    CHECK_EQ_INT(quill_gguf_n_kv(a), quill_gguf_n_kv(m));
    CHECK_EQ_INT(quill_gguf_data_offset(a), quill_gguf_data_offset(m));
    for (uint64_t i = 0; i < quill_gguf_n_kv(a); i++)
        CHECK(same_value(&quill_gguf_kv_at(a, i)->value, &quill_gguf_kv_at(m, i)->value));
    for (uint64_t i = 0; i < quill_gguf_n_tensors(a); i++) {
        const quill_gguf_tensor *x = quill_gguf_tensor_at(a, i), *y = quill_gguf_tensor_at(m, i);
        CHECK(x->file_offset == y->file_offset && bytes_eq(x->data, y->data, x->nbytes));
        CHECK((const uint8_t *)y->data == b.p + y->file_offset);
    }
    quill_gguf_close(a);
    quill_gguf_close(m);
    gb_free(&b);
    free(path);
}

/* Many names and one longer than a name chunk: lookups find every one. */
TEST(gguf_many_and_long_names) {
    enum { N = 3000 };
    gbuf b = {0};
    size_t long_len = 70000;
    char *long_key = malloc(long_len + 1);
    for (size_t i = 0; i < long_len; i++) long_key[i] = (char)('a' + i % 26);
    long_key[long_len] = 0;
    gb_header(&b, 3, 2, N + 1);
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "k.%05d", (i * 7919) % N);
        gb_key(&b, key, QUILL_GGUF_UINT32);
        gb_u32(&b, (uint32_t)((i * 7919) % N));
    }
    gb_key(&b, long_key, QUILL_GGUF_UINT8);
    gb_u8(&b, 9);
    static const uint64_t ne[1] = {1};
    gb_tensor(&b, long_key, 1, ne, QUILL_TYPE_F32, 0);
    gb_tensor(&b, "k.00001", 1, ne, QUILL_TYPE_F32, 32);
    gb_pad(&b, 32);
    gb_zeros(&b, 64);
    quill_error err = {0};
    quill_gguf *g = open_buf(&b, &err);
    CHECK(g, "%s", err.message);
    for (int i = 0; i < N; i++) {
        char key[32];
        snprintf(key, sizeof key, "k.%05d", i);
        uint64_t u;
        CHECK(quill_gguf_get_u64(g, key, &u, &err) == QUILL_OK && u == (uint64_t)i, "%s", key);
    }
    uint64_t u;
    CHECK(quill_gguf_get_u64(g, long_key, &u, &err) == QUILL_OK && u == 9);
    CHECK(quill_gguf_find_tensor(g, long_key) == quill_gguf_tensor_at(g, 0));
    CHECK(quill_gguf_find_tensor(g, "k.00001") == quill_gguf_tensor_at(g, 1));
    quill_gguf_close(g);
    free(long_key);
    gb_free(&b);
}

/* ---------------------------------------------------------------- sweeps */

/* Every strict prefix of a valid file is rejected as malformed (each copy is exactly sized, so
 * ASan catches a read past the end). */
TEST(gguf_truncation_sweep) {
    gbuf b = {0};
    build_rich(&b, 3, true);
    for (size_t n = 0; n < b.len; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, b.p, n);
        quill_gguf *g = (quill_gguf *)1;
        quill_error err = {0};
        quill_status s = quill_gguf_open_memory(copy, n, "cut", &g, &err);
        free(copy);
        CHECK(s == QUILL_E_FORMAT && g == NULL, "prefix of %zu of %zu bytes: status %d (%s)", n, b.len, s, err.message);
        CHECK_STR_CONTAINS(err.message, "cut: offset ");
    }
    gb_free(&b);
}

/* Every byte of the directory set to a few hostile values: the reader either rejects the file
 * with a format/unsupported error or hands out a structure that survives a complete walk. */
TEST(gguf_corruption_sweep) {
    gbuf b = {0};
    build_rich(&b, 3, true);
    static const uint8_t vals[] = {0x00, 0x01, 0x07, 0x0c, 0x0d, 0x20, 0x7f, 0x80, 0xfe, 0xff};
    int opened = 0, rejected = 0;
    for (size_t pos = 0; pos < b.len; pos++) {
        for (size_t k = 0; k < sizeof vals; k++) {
            if (b.p[pos] == vals[k]) continue;
            uint8_t *copy = malloc(b.len);
            memcpy(copy, b.p, b.len);
            copy[pos] = vals[k];
            quill_gguf *g = NULL;
            quill_error err = {0};
            quill_status s = quill_gguf_open_memory(copy, b.len, "flip", &g, &err);
            if (s == QUILL_OK) {
                char why[256] = "";
                bool ok = walk_file(g, copy, b.len, why, sizeof why);
                quill_gguf_close(g);
                if (!ok) free(copy);
                CHECK(ok, "byte %zu = 0x%02x: %s", pos, vals[k], why);
                opened++;
            } else {
                CHECK(g == NULL);
                CHECK(s == QUILL_E_FORMAT || s == QUILL_E_UNSUPPORTED, "byte %zu = 0x%02x: status %d", pos, vals[k], s);
                CHECK(strncmp(err.message, "flip: offset ", 13) == 0, "byte %zu: %s", pos, err.message);
                rejected++;
            }
            free(copy);
        }
    }
    CHECK(opened > 0 && rejected > 0, "opened %d rejected %d", opened, rejected);
    gb_free(&b);
}

/* ---------------------------------------------------------------- the reference files */

static const char *const SHARED_GGUFS[] = {
    "models/stories260K.gguf", "models/synth-k-f32.gguf", "models/synth-k-f16.gguf", "models/synth-k-bf16.gguf",
    "models/synth-k-q8_0.gguf", "models/synth-k-q4_0.gguf", "models/synth-k-q4_1.gguf", "models/synth-k-q5_0.gguf",
    "models/synth-k-q5_1.gguf", "models/synth-k-q2_k.gguf", "models/synth-k-q3_k_s.gguf", "models/synth-k-q3_k_m.gguf",
    "models/synth-k-q4_k_s.gguf", "models/synth-k-q4_k_m.gguf", "models/synth-k-q5_k_s.gguf", "models/synth-k-q5_k_m.gguf",
    "models/synth-k-q6_k.gguf", "models/synth-k-iq4_nl.gguf", "models/synth-k-iq4_xs.gguf",
    "models/synth-32k-q4_k_m.gguf", "models/synth-32k-q8_0.gguf", "tokenizer/ggml-vocab-llama-spm.gguf",
    "golden/s260-once.trace.gguf", "golden/dequant/synth-k-q4_k_m.dequant.gguf",
};

TEST(gguf_shared_files_open_and_walk) {
    REQUIRE_SHARED(shared);
    for (size_t i = 0; i < sizeof SHARED_GGUFS / sizeof SHARED_GGUFS[0]; i++) {
        char *path = path_join(shared, SHARED_GGUFS[i]);
        quill_gguf *g;
        quill_error err = {0};
        CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
        CHECK(quill_gguf_version(g) == 3 || quill_gguf_version(g) == 2);
        char why[256] = "";
        CHECK(walk_file(g, NULL, quill_gguf_file_size(g), why, sizeof why), "%s: %s", path, why);
        quill_gguf_close(g);
        free(path);
    }
}

TEST(gguf_shared_stories260k_facts) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_gguf *g;
    quill_error err = {0};
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    const char *s;
    size_t n;
    uint64_t u;
    CHECK(quill_gguf_get_str(g, "general.architecture", &s, &n, &err) == QUILL_OK && n == 5 && !memcmp(s, "llama", 5));
    CHECK(quill_gguf_get_u64(g, "llama.embedding_length", &u, &err) == QUILL_OK && u == 64);
    CHECK(quill_gguf_get_u64(g, "llama.block_count", &u, &err) == QUILL_OK && u == 5);
    CHECK(quill_gguf_get_u64(g, "llama.attention.head_count", &u, &err) == QUILL_OK && u == 8);
    CHECK(quill_gguf_get_u64(g, "llama.attention.head_count_kv", &u, &err) == QUILL_OK && u == 4);
    CHECK(quill_gguf_get_u64(g, "llama.feed_forward_length", &u, &err) == QUILL_OK && u == 172);
    quill_gguf_value toks, e;
    CHECK(quill_gguf_get_arr(g, "tokenizer.ggml.tokens", &toks, &err) == QUILL_OK);
    CHECK(toks.elem_type == QUILL_GGUF_STRING && toks.count == 512);
    uint64_t c = 0;
    CHECK(quill_gguf_array_next(&toks, &c, &e) && e.count == 5 && memcmp(e.data, "<unk>", 5) == 0);
    CHECK(quill_gguf_array_next(&toks, &c, &e) && e.count == 3 && memcmp(e.data, "<s>", 3) == 0);
    const quill_gguf_tensor *t = quill_gguf_find_tensor(g, "token_embd.weight");
    CHECK(t && t->type == QUILL_TYPE_F32 && t->n_dims == 2 && t->ne[0] == 64 && t->ne[1] == 512);
    CHECK_EQ_INT(t->nbytes, 64 * 512 * 4);
    CHECK(quill_gguf_find_tensor(g, "output.weight") != NULL);
    CHECK(quill_gguf_find_tensor(g, "blk.4.ffn_down.weight") != NULL);
    CHECK(quill_gguf_find_tensor(g, "blk.5.ffn_down.weight") == NULL);
    quill_gguf_close(g);
    free(path);
}

/* A real file copied kv by kv (add_value) and tensor by tensor reads back identical; the copy's
 * copy is byte-identical to the copy. */
TEST(gguf_shared_writer_copy) {
    REQUIRE_SHARED(shared);
    static const char *const files[] = {"models/stories260K.gguf", "tokenizer/ggml-vocab-llama-spm.gguf"};
    for (size_t k = 0; k < 2; k++) {
        char *path = path_join(shared, files[k]);
        char *p1 = tmp_path("shared-copy1.gguf"), *p2 = tmp_path("shared-copy2.gguf");
        quill_gguf *src, *g;
        quill_error err = {0};
        CHECK(quill_gguf_open(path, &src, &err) == QUILL_OK, "%s", err.message);
        CHECK(copy_gguf(src, p1, &err) == QUILL_OK, "%s", err.message);
        CHECK(quill_gguf_open(p1, &g, &err) == QUILL_OK, "%s", err.message);
        CHECK_EQ_INT(quill_gguf_n_kv(g), quill_gguf_n_kv(src));
        CHECK_EQ_INT(quill_gguf_n_tensors(g), quill_gguf_n_tensors(src));
        for (uint64_t i = 0; i < quill_gguf_n_kv(src); i++) {
            const quill_gguf_kv *a = quill_gguf_kv_at(src, i);
            const quill_gguf_value *b = quill_gguf_find(g, a->key);
            CHECK(b && same_value(&a->value, b), "%s: '%s' differs", files[k], a->key);
        }
        for (uint64_t i = 0; i < quill_gguf_n_tensors(src); i++) {
            const quill_gguf_tensor *a = quill_gguf_tensor_at(src, i), *b = quill_gguf_find_tensor(g, a->name);
            CHECK(b && a->type == b->type && a->nbytes == b->nbytes && bytes_eq(a->data, b->data, a->nbytes),
                  "%s: tensor '%s' differs", files[k], a->name);
        }
        CHECK(copy_gguf(g, p2, &err) == QUILL_OK, "%s", err.message);
        CHECK(same_files(p1, p2), "%s: a copy of a copy differs", files[k]);
        quill_gguf_close(g);
        quill_gguf_close(src);
        free(path);
        free(p1);
        free(p2);
    }
}

/* ---------------------------------------------------------------- fuzzing seeds */

/* Small valid files for fuzz/fuzz_gguf.c, committed in fuzz/seeds/ (names end in .gguf.seed: a
 * repository hook rejects *.gguf). Checked like the malformed corpus and rewritten with
 * QUILL_REGEN_MALFORMED=1. With QUILL_FUZZ_SEEDS_DIR set, larger seeds made from the reference
 * files (never committed) are written there too; see fuzz/README.md. */

static bool file_bytes(const char *path, gbuf *out) {
    size_t n;
    void *p = read_file(path, &n);
    if (!p) return false;
    gb_raw(out, p, n);
    free(p);
    return true;
}

/* One tensor of every type the reader knows, one row of one block each, with varied bytes. */
static bool seed_tensors(gbuf *out) {
    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    uint32_t state = 12345;
    uint8_t block[512];
    for (uint32_t type = 0; type < QUILL_TYPE_COUNT; type++) {
        const quill_type_traits *tr = quill_type_traits_of(type);
        if (!tr) continue;
        for (size_t i = 0; i < tr->type_size && i < sizeof block; i++) {
            state = state * 1103515245u + 12345u;
            block[i] = (uint8_t)(state >> 16);
        }
        if (tr->type_size >= 2 && tr->block_size > 1) { /* a modest scale where the block has one */
            uint16_t h = quill_f32_to_f16(0.03125f);
            memcpy(block, &h, 2);
        }
        char name[32];
        snprintf(name, sizeof name, "t.%s", tr->name);
        int64_t ne[1] = {tr->block_size};
        if (quill_gguf_writer_add_tensor(w, name, type, 1, ne, block) != QUILL_OK) {
            quill_gguf_writer_free(w);
            return false;
        }
    }
    char *path = tmp_path("seed-tensors.gguf");
    quill_error err;
    bool ok = quill_gguf_writer_write(w, path, &err) == QUILL_OK && file_bytes(path, out);
    quill_gguf_writer_free(w);
    free(path);
    return ok;
}

/* A small SentencePiece vocabulary: control, byte and normal tokens with scores. */
static bool seed_vocab(gbuf *out) {
    static const char *const toks[] = {
        "<unk>", "<s>", "</s>", "<0x0A>", "<0x41>", "<0xC3>", "<0xA9>", "\xe2\x96\x81", "\xe2\x96\x81" "a",
        "a", "b", "ab", "\xe2\x96\x81" "ab", "c", "abc", "\xe2\x96\x81" "Hello", "\xe2\x96\x81" "world", "l", "o",
        "H", "e", "w", "r", "d", "<|user|>", "\xc3\xa9",
    };
    enum { N = sizeof toks / sizeof toks[0] };
    float scores[N];
    int32_t types[N];
    for (int i = 0; i < N; i++) {
        scores[i] = -(float)i * 0.5f;
        types[i] = i == 0 ? QUILL_TOKEN_UNKNOWN : i < 3 ? QUILL_TOKEN_CONTROL : i < 7 ? QUILL_TOKEN_BYTE
                 : strcmp(toks[i], "<|user|>") == 0 ? QUILL_TOKEN_USER_DEFINED : QUILL_TOKEN_NORMAL;
    }
    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    quill_gguf_writer_add_str(w, "tokenizer.ggml.model", "llama", 5);
    quill_gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", toks, NULL, N);
    quill_gguf_writer_add_arr(w, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, scores, N);
    quill_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, types, N);
    quill_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1);
    quill_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2);
    quill_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", true);
    quill_gguf_writer_add_u32(w, "llama.embedding_length", 8);
    quill_gguf_writer_add_u32(w, "llama.block_count", 1);
    quill_gguf_writer_add_u32(w, "llama.attention.head_count", 2);
    quill_gguf_writer_add_u32(w, "llama.feed_forward_length", 16);
    quill_gguf_writer_add_str(w, "llama.rope.scaling.type", "linear", 6);
    quill_gguf_writer_add_f32(w, "llama.rope.scaling.factor", 4.0f);
    float embd[8 * N];
    for (int i = 0; i < 8 * N; i++) embd[i] = (float)(i % 7) - 3.0f;
    int64_t ne[2] = {8, N};
    quill_gguf_writer_add_tensor(w, "token_embd.weight", QUILL_TYPE_F32, 2, ne, embd);
    char *path = tmp_path("seed-vocab.gguf");
    quill_error err;
    bool ok = quill_gguf_writer_write(w, path, &err) == QUILL_OK && file_bytes(path, out);
    quill_gguf_writer_free(w);
    free(path);
    return ok;
}

static bool seed_rich(gbuf *out) {
    build_rich(out, 3, true);
    return true;
}

static bool seed_rich_v2(gbuf *out) {
    build_rich(out, 2, false);
    return true;
}

TEST(gguf_fuzz_seeds) {
    static const struct { const char *name; bool (*build)(gbuf *); } seeds[] = {
        {"rich.gguf.seed", seed_rich},
        {"rich_v2.gguf.seed", seed_rich_v2},
        {"tensors.gguf.seed", seed_tensors},
        {"vocab.gguf.seed", seed_vocab},
    };
    const char *regen = getenv("QUILL_REGEN_MALFORMED");
    bool write = regen && strcmp(regen, "1") == 0;
    const char *extra = getenv("QUILL_FUZZ_SEEDS_DIR");
    for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++) {
        gbuf b = {0};
        CHECK(seeds[i].build(&b), "building %s", seeds[i].name);
        CHECK(b.len <= 6000, "%s is %zu bytes", seeds[i].name, b.len);
        quill_error err = {0};
        quill_gguf *g = open_buf(&b, &err);
        CHECK(g, "%s: %s", seeds[i].name, err.message);
        quill_gguf_close(g);
        char *path = path_join("fuzz/seeds", seeds[i].name);
        if (write) {
            mkdir("fuzz/seeds", 0755);
            FILE *f = fopen(path, "wb");
            CHECK(f && fwrite(b.p, 1, b.len, f) == b.len && fclose(f) == 0, "writing %s", path);
        }
        if (extra && *extra) {
            char *copy = path_join(extra, seeds[i].name);
            FILE *f = fopen(copy, "wb");
            CHECK(f && fwrite(b.p, 1, b.len, f) == b.len && fclose(f) == 0, "writing %s", copy);
            free(copy);
        }
        size_t n;
        void *have = read_file(path, &n);
        bool same = have && n == b.len && memcmp(have, b.p, n) == 0;
        free(have);
        gb_free(&b);
        CHECK(same, "%s differs from its builder (run from the repository root; regenerate with "
                    "QUILL_REGEN_MALFORMED=1)", path);
        free(path);
    }
    if (!extra || !*extra) return;

    /* Run-time seeds from the reference files: the whole metadata of a real model (a real
     * vocabulary and hyperparameters) with up to two of its small tensors. */
    const char *shared = shared_dir();
    if (!shared) return;
    static const struct { const char *src, *dst; int max_tensors; } real[] = {
        {"models/stories260K.gguf", "stories260k-meta.gguf.seed", 2},
        {"models/synth-k-q4_k_m.gguf", "synth-q4km-meta.gguf.seed", 2},
    };
    for (size_t k = 0; k < sizeof real / sizeof real[0]; k++) {
        char *src = path_join(shared, real[k].src), *dst = path_join(extra, real[k].dst);
        quill_gguf *g;
        quill_error err = {0};
        CHECK(quill_gguf_open(src, &g, &err) == QUILL_OK, "%s", err.message);
        quill_gguf_writer *w = quill_gguf_writer_new();
        for (uint64_t i = 0; i < quill_gguf_n_kv(g); i++)
            quill_gguf_writer_add_value(w, quill_gguf_kv_at(g, i)->key, &quill_gguf_kv_at(g, i)->value);
        int added = 0;
        for (uint64_t i = 0; i < quill_gguf_n_tensors(g) && added < real[k].max_tensors; i++) {
            const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
            if (t->nbytes > 1024) continue;
            quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
            added++;
        }
        CHECK(quill_gguf_writer_write(w, dst, &err) == QUILL_OK, "%s", err.message);
        quill_gguf_writer_free(w);
        quill_gguf_close(g);
        free(src);
        free(dst);
    }
}
