/* The walk over the tokens of the kernels whose row product is `impl(row, x, n, xs, out, os, NT)`:
 * always inline, NT a constant at each call so that its accumulators stay in registers. Each
 * macro defines `static void name(row, x, n, n_tok, xs, out, os)` (quill_kernels' dot and vec_dot
 * entries): NT tokens at a time, then the rest in one call with its exact count, so that every call
 * is specialised. QUILL_TOKENS_BY_4: the f32 dot of avx2, avx512 and neon; QUILL_TOKENS_BY_8:
 * avx512's fused quantized products, whose 32 registers hold 8 tokens' accumulators. */
#ifndef QUILL_DOT_TOKENS_H
#define QUILL_DOT_TOKENS_H

#define QUILL_TOKENS_BY_4(name, row_type, impl)                                                        \
    static void name(row_type row, const float *x, int64_t n, int n_tok, int64_t xs, float *out, int64_t os) { \
        int t = 0;                                                                                     \
        for (; t + 4 <= n_tok; t += 4) impl(row, x + t * xs, n, xs, out + t * os, os, 4);              \
        switch (n_tok - t) {                                                                           \
        case 3: impl(row, x + t * xs, n, xs, out + t * os, os, 3); break;                              \
        case 2: impl(row, x + t * xs, n, xs, out + t * os, os, 2); break;                              \
        case 1: impl(row, x + t * xs, n, xs, out + t * os, os, 1); break;                              \
        default: break;                                                                                \
        }                                                                                              \
    }

#define QUILL_TOKENS_BY_8(name, row_type, impl)                                                        \
    static void name(row_type row, const float *x, int64_t n, int n_tok, int64_t xs, float *out, int64_t os) { \
        int t = 0;                                                                                     \
        for (; t + 8 <= n_tok; t += 8) impl(row, x + t * xs, n, xs, out + t * os, os, 8);              \
        x += t * xs;                                                                                   \
        out += t * os;                                                                                 \
        switch (n_tok - t) {                                                                           \
        case 7: impl(row, x, n, xs, out, os, 7); break;                                                \
        case 6: impl(row, x, n, xs, out, os, 6); break;                                                \
        case 5: impl(row, x, n, xs, out, os, 5); break;                                                \
        case 4: impl(row, x, n, xs, out, os, 4); break;                                                \
        case 3: impl(row, x, n, xs, out, os, 3); break;                                                \
        case 2: impl(row, x, n, xs, out, os, 2); break;                                                \
        case 1: impl(row, x, n, xs, out, os, 1); break;                                                \
        default: break;                                                                                \
        }                                                                                              \
    }

#endif
