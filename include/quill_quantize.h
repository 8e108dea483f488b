/* libquill quantization: F32 rows into GGUF tensor types, and whole Llama GGUF files into the
 * reference quantizer's mixes (q4_k_m and friends).
 *
 * Block parameters are chosen the way the reference quantizer (ggml, no importance matrix) chooses
 * them, so quantizing the same F32 data gives the same bytes for the simple types and nearly always
 * the same bytes for the k-quants. The library never prints; per-tensor progress goes through a
 * callback. */
#ifndef QUILL_QUANTIZE_H
#define QUILL_QUANTIZE_H

#include "quill.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- rows */

/* True when quill_quantize_rows can produce `type`: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0,
 * q2_K, q3_K, q4_K, q5_K, q6_K, iq4_nl, iq4_xs, iq3_s, q1_0, q2_0, tq1_0, tq2_0, mxfp4. */
QUILL_API bool quill_can_quantize(uint32_t type);

/* Quantizes `n_rows` rows of `n_per_row` floats (contiguous) into `dst`, which receives
 * quill_row_size(type, n_per_row) * n_rows bytes. n_per_row must be a multiple of the type's block
 * size (QUILL_E_ARG otherwise). Deterministic; rows are independent, so any split of the rows
 * gives the same bytes. */
QUILL_API quill_status quill_quantize_rows(uint32_t type, const float *src, void *dst, int64_t n_rows,
                                           int64_t n_per_row, quill_error *err);

/* ---------------------------------------------------------------- file types */

/* general.file_type values (the reference's llama_ftype numbers). */
typedef enum quill_ftype {
    QUILL_FTYPE_ALL_F32 = 0,
    QUILL_FTYPE_MOSTLY_F16 = 1,
    QUILL_FTYPE_MOSTLY_Q4_0 = 2,
    QUILL_FTYPE_MOSTLY_Q4_1 = 3,
    QUILL_FTYPE_MOSTLY_Q8_0 = 7,
    QUILL_FTYPE_MOSTLY_Q5_0 = 8,
    QUILL_FTYPE_MOSTLY_Q5_1 = 9,
    QUILL_FTYPE_MOSTLY_Q2_K = 10,
    QUILL_FTYPE_MOSTLY_Q3_K_S = 11,
    QUILL_FTYPE_MOSTLY_Q3_K_M = 12,
    QUILL_FTYPE_MOSTLY_Q3_K_L = 13,
    QUILL_FTYPE_MOSTLY_Q4_K_S = 14,
    QUILL_FTYPE_MOSTLY_Q4_K_M = 15,
    QUILL_FTYPE_MOSTLY_Q5_K_S = 16,
    QUILL_FTYPE_MOSTLY_Q5_K_M = 17,
    QUILL_FTYPE_MOSTLY_Q6_K = 18,
    QUILL_FTYPE_MOSTLY_IQ4_NL = 25,
    QUILL_FTYPE_MOSTLY_IQ3_S = 26,
    QUILL_FTYPE_MOSTLY_IQ3_M = 27,    /* iq3_s with attn_v, attn_output and early ffn_down in q4_K */
    QUILL_FTYPE_MOSTLY_IQ4_XS = 30,
    QUILL_FTYPE_MOSTLY_BF16 = 32,
    QUILL_FTYPE_MOSTLY_TQ1_0 = 36,
    QUILL_FTYPE_MOSTLY_TQ2_0 = 37,
    QUILL_FTYPE_MOSTLY_MXFP4_MOE = 38, /* experts (3-D tensors) in mxfp4, the other matrices in q8_0 */
    QUILL_FTYPE_MOSTLY_Q1_0 = 40,
    QUILL_FTYPE_MOSTLY_Q2_0 = 41,
} quill_ftype;

/* "q4_k_m" (case-insensitive; also "Q4_K_M", "q6_k", "f16", ...) to a file type; false when quill
 * cannot produce that mix. */
QUILL_API bool quill_ftype_from_name(const char *name, quill_ftype *out);
/* The same with a message: QUILL_E_UNSUPPORTED for the reference's types that need an importance
 * matrix (iq2_xxs, iq1_s, ..., which the message names as the reason), QUILL_E_ARG for a name that
 * is no file type. */
QUILL_API quill_status quill_ftype_parse(const char *name, quill_ftype *out, quill_error *err);
/* "q4_k_m" or NULL for a value quill cannot produce. */
QUILL_API const char *quill_ftype_name(quill_ftype ftype);
/* The type most tensors of the mix get (q4_K for q4_k_m, f16 for f16). */
QUILL_API uint32_t quill_ftype_base_type(quill_ftype ftype);
/* Space-separated list of the names quill_ftype_from_name accepts (for usage messages). */
QUILL_API const char *quill_ftype_names(void);

/* ---------------------------------------------------------------- whole files */

/* One tensor of the output, in output order (the reference's: tensors outside the blocks first,
 * then block 0, 1, ..., each group sorted by name). */
typedef struct quill_quant_choice {
    uint64_t src_index;     /* index of the tensor in the input file */
    uint32_t type;          /* type written */
    bool quantized;         /* false: the tensor is copied unchanged */
    bool fallback;          /* the mix's type did not fit the row length; `type` is the reference's
                             * fallback for it (q4_K -> q5_0, q3_K -> iq4_nl, ...) */
} quill_quant_choice;

typedef struct quill_quantize_progress {
    uint64_t index, count;  /* this tensor's position in the output and the number of tensors */
    const char *name;
    uint32_t n_dims;
    const int64_t *ne;
    uint32_t src_type, dst_type;
    bool quantized, fallback;
    uint64_t src_bytes, dst_bytes;
} quill_quantize_progress;

typedef void (*quill_quantize_progress_fn)(const quill_quantize_progress *p, void *user);

typedef struct quill_quantize_params {
    quill_ftype ftype;
    bool pure;                            /* every quantized tensor in the base type, no mix rules
                                           * (the reference's --pure); rows that do not fit still
                                           * take the fallback type */
    int n_threads;                        /* <= 1: the calling thread only */
    quill_quantize_progress_fn progress;  /* called after each tensor is written; may be NULL */
    void *user;
} quill_quantize_params;

/* The per-tensor decisions quill_quantize_file makes for `in` (a Llama GGUF): `choices` receives
 * quill_gguf_n_tensors(in) entries in output order. Fails (QUILL_E_UNSUPPORTED) when a tensor can
 * not be produced, e.g. rows of a length no type of the mix fits, or a quantized input tensor
 * that would need requantizing. */
QUILL_API quill_status quill_quantize_plan(const quill_gguf *in, quill_ftype ftype, bool pure, quill_quant_choice *choices,
                                           quill_error *err);

/* Quantizes a Llama GGUF with F32 / F16 / BF16 weights into `out_path`: all metadata is copied,
 * general.quantization_version = 2 and general.file_type = ftype are set, tensors are streamed to
 * disk one at a time (memory stays near the largest tensor's size). */
QUILL_API quill_status quill_quantize_file(const char *in_path, const char *out_path, const quill_quantize_params *params,
                                           quill_error *err);

#ifdef __cplusplus
}
#endif

#endif
