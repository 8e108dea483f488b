/* Every tensor type, one row each: the single list from which the type table (types.c), the
 * quantizers' dispatch (quantize.c), the exact products' facts (kernels/kernels_exact.h) and each
 * kernel set's per-type instantiations and install tables are generated. A new type is a row here
 * plus its functions: quill_to_float_<sfx> when it decodes, quill_from_float_<sfx> when quill
 * writes it, and, when it has exact products, its code unpacking in exact_scalar.c and in each
 * exact kernel file.
 *
 * QUILL_TYPE_LIST(X, ctx) expands X(ctx, ID, sfx, block, bytes, decodes, quantizes, vector, exact, facts)
 * for every row; ctx is passed through untouched (a macro name the row macro may apply):
 *   ID        the quill_type name after QUILL_TYPE_ (the ggml id lives in quill.h's enum)
 *   sfx       ggml's name of the type ("q4_K"), and the suffix of its functions
 *   block     elements per block; bytes: bytes per block (the GGUF reader sizes tensors with them)
 *   decodes, quantizes: 1 or 0 (literal tokens: they select code with QUILL_IF)
 *   exact     0: no exact products; 1: exact products by the sets' specialised kernels (each exact
 *             kernel file unpacks the type itself); 2: exact products by the unpacking kernels
 *             (kernels_exact.h), from quill_exact_unpack_<sfx> (exact_unpack.c); the vnni set
 *             runs q2_K and q3_K in its own loops besides (kernels_vnni.c)
 *   vector    what the avx2 and avx512 files define for it: 0 nothing, 1 dequant_<sfx> (a vector
 *             dequantizer, bit-identical to to_float), 2 that and vec_dot_<sfx> (kernels_simd.h)
 *   facts     for exact types EXACT(slot_width, code_bias, act_max, has_min, scales, qs, qh), as
 *             kernels_exact.h describes them; NO_EXACT otherwise
 * Ids without a row (4, 5: the removed q4_2/q4_3; 31-33, 36-38: removed repacked layouts) read as
 * unknown. Rows are in id order. */
#ifndef QUILL_TYPE_LIST_H
#define QUILL_TYPE_LIST_H

#define QUILL_TYPE_LIST(X, ctx)                                                                                    \
    X(ctx, F32, f32, 1, 4, 1, 1, 0, 0, NO_EXACT)                                                                   \
    X(ctx, F16, f16, 1, 2, 1, 1, 1, 0, NO_EXACT)                                                                   \
    X(ctx, Q4_0, q4_0, QK4_0, sizeof(block_q4_0), 1, 1, 2, 1,                                                      \
      EXACT(32, 8, QMAX, false, EXACT_SCALE_D, offsetof(block_q4_0, qs), 0))                                       \
    X(ctx, Q4_1, q4_1, QK4_1, sizeof(block_q4_1), 1, 1, 1, 1,                                                      \
      EXACT(32, 0, QMAX, true, EXACT_SCALE_D_M, offsetof(block_q4_1, qs), 0))                                      \
    X(ctx, Q5_0, q5_0, QK5_0, sizeof(block_q5_0), 1, 1, 1, 1,                                                      \
      EXACT(32, 16, QMAX, false, EXACT_SCALE_D, offsetof(block_q5_0, qs), offsetof(block_q5_0, qh)))               \
    X(ctx, Q5_1, q5_1, QK5_1, sizeof(block_q5_1), 1, 1, 1, 1,                                                      \
      EXACT(32, 0, 127 * 128, true, EXACT_SCALE_D_M, offsetof(block_q5_1, qs), offsetof(block_q5_1, qh)))          \
    X(ctx, Q8_0, q8_0, QK8_0, sizeof(block_q8_0), 1, 1, 2, 1,                                                      \
      EXACT(32, 128, 127 * 32, false, EXACT_SCALE_D, 0, 0))                                                        \
    X(ctx, Q8_1, q8_1, QK8_1, sizeof(block_q8_1), 0, 0, 0, 0, NO_EXACT)                                            \
    X(ctx, Q2_K, q2_K, QK_K, sizeof(block_q2_K), 1, 1, 2, 2,                                                       \
      EXACT(16, 0, QMAX, true, EXACT_SCALE_UNPACKED, 0, 0))                                                        \
    X(ctx, Q3_K, q3_K, QK_K, sizeof(block_q3_K), 1, 1, 2, 2,                                                       \
      EXACT(16, 4, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                       \
    X(ctx, Q4_K, q4_K, QK_K, sizeof(block_q4_K), 1, 1, 2, 1, EXACT(32, 0, QMAX, true, EXACT_SCALE_K4, 0, 0))       \
    X(ctx, Q5_K, q5_K, QK_K, sizeof(block_q5_K), 1, 1, 1, 1, EXACT(32, 0, 127 * 128, true, EXACT_SCALE_K4, 0, 0))  \
    X(ctx, Q6_K, q6_K, QK_K, sizeof(block_q6_K), 1, 1, 2, 1, EXACT(16, 32, QMAX, false, EXACT_SCALE_Q6_K, 0, 0))   \
    X(ctx, Q8_K, q8_K, QK_K, sizeof(block_q8_K), 0, 0, 0, 0, NO_EXACT)                                             \
    X(ctx, IQ2_XXS, iq2_xxs, QK_K, sizeof(block_iq2_xxs), 1, 0, 0, 2,                                              \
      EXACT(32, 128, 127 * 64, false, EXACT_SCALE_UNPACKED, 0, 0))                                                 \
    X(ctx, IQ2_XS, iq2_xs, QK_K, sizeof(block_iq2_xs), 1, 0, 0, 2,                                                 \
      EXACT(16, 128, 127 * 64, false, EXACT_SCALE_UNPACKED, 0, 0))                                                 \
    X(ctx, IQ3_XXS, iq3_xxs, QK_K, sizeof(block_iq3_xxs), 1, 0, 0, 2,                                              \
      EXACT(32, 128, 127 * 64, false, EXACT_SCALE_UNPACKED, 0, 0))                                                 \
    X(ctx, IQ1_S, iq1_s, QK_K, sizeof(block_iq1_s), 1, 0, 0, 2,                                                    \
      EXACT(32, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                     \
    /* iq4: codes the 16 levels (-127..113), one scale per 32 columns (iq4_xs: d·(ls - 32)). Slots  \
     * of 32 with act_max 127·32 (32·127·4064 < 2^24: q8_0's activation precision, 32x the         \
     * reference's 8-bit codes) rather than slots of 16 at 127·64: the packed loops then sum a      \
     * block's low and high nibbles together and take one f32 step per block, as for q4_0, mxfp4. */ \
    X(ctx, IQ4_NL, iq4_nl, QK4_NL, sizeof(block_iq4_nl), 1, 1, 1, 2,                                               \
      EXACT(32, 128, 127 * 32, false, EXACT_SCALE_UNPACKED, 0, 0))                                                 \
    X(ctx, IQ3_S, iq3_s, QK_K, sizeof(block_iq3_s), 1, 1, 0, 2,                                                    \
      EXACT(32, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                     \
    X(ctx, IQ2_S, iq2_s, QK_K, sizeof(block_iq2_s), 1, 0, 0, 2,                                                    \
      EXACT(16, 128, 127 * 64, false, EXACT_SCALE_UNPACKED, 0, 0))                                                 \
    X(ctx, IQ4_XS, iq4_xs, QK_K, sizeof(block_iq4_xs), 1, 1, 1, 2,                                                 \
      EXACT(32, 128, 127 * 32, false, EXACT_SCALE_UNPACKED, 0, 0))                                                 \
    X(ctx, I8, i8, 1, 1, 0, 0, 0, 0, NO_EXACT)                                                                     \
    X(ctx, I16, i16, 1, 2, 0, 0, 0, 0, NO_EXACT)                                                                   \
    X(ctx, I32, i32, 1, 4, 0, 0, 0, 0, NO_EXACT)                                                                   \
    X(ctx, I64, i64, 1, 8, 0, 0, 0, 0, NO_EXACT)                                                                   \
    X(ctx, F64, f64, 1, 8, 0, 0, 0, 0, NO_EXACT)                                                                   \
    X(ctx, IQ1_M, iq1_m, QK_K, sizeof(block_iq1_m), 1, 0, 0, 2,                                                    \
      EXACT(16, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                     \
    X(ctx, BF16, bf16, 1, 2, 1, 1, 1, 0, NO_EXACT)                                                                 \
    X(ctx, TQ1_0, tq1_0, QK_K, sizeof(block_tq1_0), 1, 1, 0, 2,                                                    \
      EXACT(32, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                     \
    X(ctx, TQ2_0, tq2_0, QK_K, sizeof(block_tq2_0), 1, 1, 0, 2,                                                    \
      EXACT(32, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                     \
    X(ctx, MXFP4, mxfp4, QK_MXFP4, sizeof(block_mxfp4), 1, 1, 0, 2,                                                \
      EXACT(32, 12, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                       \
    X(ctx, NVFP4, nvfp4, QK_NVFP4, sizeof(block_nvfp4), 1, 0, 0, 0, NO_EXACT)                                      \
    X(ctx, Q1_0, q1_0, QK1_0, sizeof(block_q1_0), 1, 1, 0, 2,                                                      \
      EXACT(32, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))                                                     \
    X(ctx, Q2_0, q2_0, QK2_0, sizeof(block_q2_0), 1, 1, 0, 2,                                                      \
      EXACT(32, 128, QMAX, false, EXACT_SCALE_UNPACKED, 0, 0))

/* QUILL_IF(flag, code...): the code when flag is the token 1, nothing when it is 0. */
#define QUILL_IF(flag, ...) QUILL_IF_##flag(__VA_ARGS__)
#define QUILL_IF_1(...) __VA_ARGS__
#define QUILL_IF_0(...)
/* QUILL_PICK(flag, a, b): a when flag is 1, b when it is 0. */
#define QUILL_PICK(flag, a, b) QUILL_PICK_##flag(a, b)
#define QUILL_PICK_1(a, b) a
#define QUILL_PICK_0(a, b) b

#endif
