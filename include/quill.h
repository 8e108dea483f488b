/* libquill — run GGUF language models on the CPU, exactly.
 *
 * This header is the whole API: it includes quill_model.h (tokenizer, model, context, sampling,
 * generation), quill_chat.h (chat templates) and quill_quantize.h (quantization), each of which
 * can also be included alone. Link with `pkg-config --cflags --libs quill`.
 *
 * Conventions: every fallible function returns a quill_status and, when `err` is not NULL, fills
 * it with a message that says what failed, where (file, offset, tensor, token) and what to do.
 * The library never prints and never exits; diagnostics go through quill_set_log(). */
#ifndef QUILL_H
#define QUILL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The library's version; quill_version() tells the version of the library actually linked.
 * The shared library's SONAME changes with the major version. */
#define QUILL_VERSION_MAJOR 0
#define QUILL_VERSION_MINOR 1
#define QUILL_VERSION_PATCH 0
#define QUILL_VERSION "0.1.0"

/* Marks every public function: libquill is built with hidden visibility, so that libquill.so
 * exports these and nothing else. */
#if defined(__GNUC__)
#define QUILL_API __attribute__((visibility("default")))
#else
#define QUILL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* "MAJOR.MINOR.PATCH" of the linked library. */
QUILL_API const char *quill_version(void);

/* ---------------------------------------------------------------- errors and logging */

typedef enum quill_status {
    QUILL_OK = 0,
    QUILL_E_IO,          /* a file could not be opened, read, mapped or written */
    QUILL_E_FORMAT,      /* the bytes of a file are malformed */
    QUILL_E_UNSUPPORTED, /* well-formed, but a version, type or architecture quill does not run */
    QUILL_E_NOMEM,
    QUILL_E_ARG,         /* the caller passed an invalid argument (bad flag value, token id...) */
    QUILL_E_NOT_FOUND,   /* a key, tensor or file that was asked for does not exist */
    QUILL_E_CONTEXT,     /* the context window is full or a prompt does not fit in it */
    QUILL_E_TEMPLATE,    /* a chat template failed to parse or raised an error */
} quill_status;

typedef struct quill_error {
    quill_status status;
    char message[768];
} quill_error;

QUILL_API const char *quill_status_name(quill_status s);

typedef enum { QUILL_LOG_DEBUG, QUILL_LOG_INFO, QUILL_LOG_WARN, QUILL_LOG_ERROR } quill_log_level;
typedef void (*quill_log_fn)(quill_log_level level, const char *message, void *user);
/* Sets the process-wide log sink; NULL (the default) discards everything. */
QUILL_API void quill_set_log(quill_log_fn fn, void *user);

/* ---------------------------------------------------------------- tensor types */

/* GGUF / ggml tensor type ids (the numbers stored in files). */
typedef enum quill_type {
    QUILL_TYPE_F32 = 0, QUILL_TYPE_F16 = 1, QUILL_TYPE_Q4_0 = 2, QUILL_TYPE_Q4_1 = 3,
    QUILL_TYPE_Q5_0 = 6, QUILL_TYPE_Q5_1 = 7, QUILL_TYPE_Q8_0 = 8, QUILL_TYPE_Q8_1 = 9,
    QUILL_TYPE_Q2_K = 10, QUILL_TYPE_Q3_K = 11, QUILL_TYPE_Q4_K = 12, QUILL_TYPE_Q5_K = 13,
    QUILL_TYPE_Q6_K = 14, QUILL_TYPE_Q8_K = 15, QUILL_TYPE_IQ2_XXS = 16, QUILL_TYPE_IQ2_XS = 17,
    QUILL_TYPE_IQ3_XXS = 18, QUILL_TYPE_IQ1_S = 19, QUILL_TYPE_IQ4_NL = 20, QUILL_TYPE_IQ3_S = 21,
    QUILL_TYPE_IQ2_S = 22, QUILL_TYPE_IQ4_XS = 23, QUILL_TYPE_I8 = 24, QUILL_TYPE_I16 = 25,
    QUILL_TYPE_I32 = 26, QUILL_TYPE_I64 = 27, QUILL_TYPE_F64 = 28, QUILL_TYPE_IQ1_M = 29,
    QUILL_TYPE_BF16 = 30, QUILL_TYPE_TQ1_0 = 34, QUILL_TYPE_TQ2_0 = 35, QUILL_TYPE_MXFP4 = 39,
    QUILL_TYPE_NVFP4 = 40, QUILL_TYPE_Q1_0 = 41, QUILL_TYPE_Q2_0 = 42,
    QUILL_TYPE_COUNT = 43
} quill_type;

typedef void (*quill_to_float_fn)(const void *src, float *dst, int64_t n);

/* One row per type: the single place that knows a type's layout. */
typedef struct quill_type_traits {
    const char *name;         /* "q4_K", as ggml names it; NULL for ids that were never used */
    int64_t block_size;       /* elements per block */
    size_t type_size;         /* bytes per block */
    quill_to_float_fn to_float; /* NULL when quill cannot decode this type */
} quill_type_traits;

/* Traits of a type id, or NULL when the id is not a known ggml type. */
QUILL_API const quill_type_traits *quill_type_traits_of(uint32_t type);
/* "q4_K" or "unknown". */
QUILL_API const char *quill_type_name(uint32_t type);
/* Bytes of a row of n elements (n must be a multiple of the block size). */
QUILL_API size_t quill_row_size(uint32_t type, int64_t n);
/* Dequantizes n elements (a multiple of the block size) of a tensor of type `type`. */
QUILL_API quill_status quill_dequantize(uint32_t type, const void *src, float *dst, int64_t n, quill_error *err);

/* IEEE half and bfloat16 conversions (exact in this direction). */
QUILL_API float quill_f16_to_f32(uint16_t h);
QUILL_API float quill_bf16_to_f32(uint16_t h);
QUILL_API uint16_t quill_f32_to_f16(float f);   /* round to nearest even */
QUILL_API uint16_t quill_f32_to_bf16(float f);  /* round to nearest even */

/* ---------------------------------------------------------------- GGUF files */

typedef enum quill_gguf_type {
    QUILL_GGUF_UINT8 = 0, QUILL_GGUF_INT8 = 1, QUILL_GGUF_UINT16 = 2, QUILL_GGUF_INT16 = 3,
    QUILL_GGUF_UINT32 = 4, QUILL_GGUF_INT32 = 5, QUILL_GGUF_FLOAT32 = 6, QUILL_GGUF_BOOL = 7,
    QUILL_GGUF_STRING = 8, QUILL_GGUF_ARRAY = 9, QUILL_GGUF_UINT64 = 10, QUILL_GGUF_INT64 = 11,
    QUILL_GGUF_FLOAT64 = 12, QUILL_GGUF_TYPE_COUNT = 13
} quill_gguf_type;

QUILL_API const char *quill_gguf_type_name(uint32_t t);

/* A view of one metadata value inside the mapped file (nothing is copied).
 * Scalars: `data` points at the little-endian bytes. Strings: `data`/`count` are the bytes and
 * their length (not NUL-terminated). Arrays: `elem_type`, `count` elements starting at `data`. */
typedef struct quill_gguf_value {
    uint32_t type;
    uint32_t elem_type;
    uint64_t count;
    const uint8_t *data;
    uint64_t nbytes;          /* bytes the whole value occupies in the file */
} quill_gguf_value;

typedef struct quill_gguf_kv {
    const char *key;          /* NUL-terminated copy */
    quill_gguf_value value;
    uint64_t offset;          /* byte offset of the key in the file */
} quill_gguf_kv;

typedef struct quill_gguf_tensor {
    const char *name;         /* NUL-terminated copy */
    uint32_t type;
    uint32_t n_dims;
    int64_t ne[4];            /* ne[0] is the contiguous (fastest) dimension; unused dims are 1 */
    int64_t n_elements;
    uint64_t offset;          /* relative to the start of the data section */
    uint64_t file_offset;     /* absolute offset of the data in the file */
    uint64_t nbytes;
    const void *data;         /* into the mapping */
} quill_gguf_tensor;

typedef struct quill_gguf quill_gguf;

/* Maps and validates a whole file; on success the file can be read without further checks. */
QUILL_API quill_status quill_gguf_open(const char *path, quill_gguf **out, quill_error *err);
/* The same over bytes the caller owns and keeps alive (used by the fuzzer); `name` labels errors. */
QUILL_API quill_status quill_gguf_open_memory(const void *data, size_t size, const char *name,
                                              quill_gguf **out, quill_error *err);
QUILL_API void quill_gguf_close(quill_gguf *g);

QUILL_API const char *quill_gguf_path(const quill_gguf *g);
QUILL_API uint32_t quill_gguf_version(const quill_gguf *g);
QUILL_API uint64_t quill_gguf_alignment(const quill_gguf *g);
QUILL_API uint64_t quill_gguf_file_size(const quill_gguf *g);
QUILL_API uint64_t quill_gguf_data_offset(const quill_gguf *g);

QUILL_API uint64_t quill_gguf_n_kv(const quill_gguf *g);
QUILL_API const quill_gguf_kv *quill_gguf_kv_at(const quill_gguf *g, uint64_t i);
QUILL_API const quill_gguf_value *quill_gguf_find(const quill_gguf *g, const char *key); /* NULL if absent */

QUILL_API uint64_t quill_gguf_n_tensors(const quill_gguf *g);
QUILL_API const quill_gguf_tensor *quill_gguf_tensor_at(const quill_gguf *g, uint64_t i);
QUILL_API const quill_gguf_tensor *quill_gguf_find_tensor(const quill_gguf *g, const char *name);

/* Typed getters by key. They return QUILL_E_NOT_FOUND when the key is absent and QUILL_E_FORMAT
 * (with a message naming the key and both types) when its type does not fit. Integers of any
 * width are accepted where they fit the requested range; floats accept floats and integers. */
QUILL_API quill_status quill_gguf_get_u64(const quill_gguf *g, const char *key, uint64_t *out, quill_error *err);
QUILL_API quill_status quill_gguf_get_i64(const quill_gguf *g, const char *key, int64_t *out, quill_error *err);
QUILL_API quill_status quill_gguf_get_f64(const quill_gguf *g, const char *key, double *out, quill_error *err);
QUILL_API quill_status quill_gguf_get_bool(const quill_gguf *g, const char *key, bool *out, quill_error *err);
/* The string's bytes inside the mapping (not NUL-terminated) and their length. */
QUILL_API quill_status quill_gguf_get_str(const quill_gguf *g, const char *key, const char **s, size_t *len,
                                          quill_error *err);
QUILL_API quill_status quill_gguf_get_arr(const quill_gguf *g, const char *key, quill_gguf_value *out,
                                          quill_error *err);

/* Scalar conversions of a value (false when the type does not fit). */
QUILL_API bool quill_gguf_value_u64(const quill_gguf_value *v, uint64_t *out);
QUILL_API bool quill_gguf_value_i64(const quill_gguf_value *v, int64_t *out);
QUILL_API bool quill_gguf_value_f64(const quill_gguf_value *v, double *out);

/* Sequential access to array elements: set `*cursor = 0` first, then each call yields the next
 * element (strings and nested arrays have variable size). Returns false past the end. */
QUILL_API bool quill_gguf_array_next(const quill_gguf_value *arr, uint64_t *cursor, quill_gguf_value *elem);

/* ---------------------------------------------------------------- GGUF writer */

/* Builds a GGUF v3 file in memory and writes it out; used for traces, quantized models and tests.
 * The adders refuse (QUILL_E_ARG) what would make an unreadable file: a duplicate key or tensor
 * name, bad dimensions, rows that are not whole blocks. `general.alignment` (set with
 * set_alignment, or added like any key) both writes the key once and lays out the data; an invalid
 * alignment makes write() fail with QUILL_E_ARG. */
typedef struct quill_gguf_writer quill_gguf_writer;

QUILL_API quill_gguf_writer *quill_gguf_writer_new(void);
QUILL_API void quill_gguf_writer_free(quill_gguf_writer *w);
QUILL_API void quill_gguf_writer_set_alignment(quill_gguf_writer *w, uint32_t alignment);
/* Metadata. Arrays of numbers take `count` elements of `elem_type` in native layout. */
QUILL_API quill_status quill_gguf_writer_add_u32(quill_gguf_writer *w, const char *key, uint32_t v);
QUILL_API quill_status quill_gguf_writer_add_i32(quill_gguf_writer *w, const char *key, int32_t v);
QUILL_API quill_status quill_gguf_writer_add_u64(quill_gguf_writer *w, const char *key, uint64_t v);
QUILL_API quill_status quill_gguf_writer_add_f32(quill_gguf_writer *w, const char *key, float v);
QUILL_API quill_status quill_gguf_writer_add_bool(quill_gguf_writer *w, const char *key, bool v);
QUILL_API quill_status quill_gguf_writer_add_str(quill_gguf_writer *w, const char *key, const char *s, size_t len);
QUILL_API quill_status quill_gguf_writer_add_arr(quill_gguf_writer *w, const char *key, uint32_t elem_type,
                                                 const void *elems, uint64_t count);
QUILL_API quill_status quill_gguf_writer_add_str_arr(quill_gguf_writer *w, const char *key,
                                                     const char *const *strs, const size_t *lens, uint64_t count);
/* Copies a value read from another file (any type, including nested arrays). */
QUILL_API quill_status quill_gguf_writer_add_value(quill_gguf_writer *w, const char *key, const quill_gguf_value *v);
/* Tensors: `data` holds quill_row_size(type, ne[0]) * rows bytes and is copied. */
QUILL_API quill_status quill_gguf_writer_add_tensor(quill_gguf_writer *w, const char *name, uint32_t type,
                                                    uint32_t n_dims, const int64_t *ne, const void *data);
QUILL_API quill_status quill_gguf_writer_write(quill_gguf_writer *w, const char *path, quill_error *err);

/* Streaming, for files too large to build in memory: declare tensors without data, write the
 * header with begin_stream, then pass every declared tensor's bytes in declaration order to
 * stream_data (in pieces of any size; padding is added between tensors; tensors added with data
 * are written when the stream reaches them) and close with finish_stream, which fails when data
 * is missing. Metadata and tensors cannot be added once streaming has begun. */
QUILL_API quill_status quill_gguf_writer_add_tensor_info(quill_gguf_writer *w, const char *name, uint32_t type,
                                                         uint32_t n_dims, const int64_t *ne);
QUILL_API quill_status quill_gguf_writer_begin_stream(quill_gguf_writer *w, const char *path, quill_error *err);
QUILL_API quill_status quill_gguf_writer_stream_data(quill_gguf_writer *w, const void *data, size_t n, quill_error *err);
QUILL_API quill_status quill_gguf_writer_finish_stream(quill_gguf_writer *w, quill_error *err);

#ifdef __cplusplus
}
#endif

#include "quill_model.h"
#include "quill_chat.h"
#include "quill_quantize.h"

#endif
