/* The dot kernel's walk over the tokens, shared by the instruction-set files whose row product is
 * `dot_nt(w, x, n, xs, out, os, NT)`: always inline, NT (1 to 4) a constant at each call so its
 * accumulators stay in registers. QUILL_DOT_BY_TOKENS(name) defines `static void name` (the
 * quill_kernels dot) over dot_nt as the including file defines it: 4 tokens at a time, then the
 * rest in one call. */
#ifndef QUILL_DOT_TOKENS_H
#define QUILL_DOT_TOKENS_H

#define QUILL_DOT_BY_TOKENS(name)                                                                      \
    static void name(const float *w, const float *x, int64_t n, int n_tok, int64_t xs, float *out, int64_t os) { \
        int t = 0;                                                                                     \
        for (; t + 4 <= n_tok; t += 4) dot_nt(w, x + t * xs, n, xs, out + t * os, os, 4);              \
        switch (n_tok - t) {                                                                           \
        case 3: dot_nt(w, x + t * xs, n, xs, out + t * os, os, 3); break;                              \
        case 2: dot_nt(w, x + t * xs, n, xs, out + t * os, os, 2); break;                              \
        case 1: dot_nt(w, x + t * xs, n, xs, out + t * os, os, 1); break;                              \
        default: break;                                                                                \
        }                                                                                              \
    }

#endif
