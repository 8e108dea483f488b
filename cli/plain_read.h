/* The plain read that measures memory bandwidth: 64-bit words summed, so that every load is used
 * and none can be dropped. `quill bench` reads its bandwidth with it, and bench/decode_probe.c
 * sets a product's speed against it, so that the two compare like with like. */
#ifndef QUILL_CLI_PLAIN_READ_H
#define QUILL_CLI_PLAIN_READ_H

#include <stddef.h>
#include <stdint.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PLAIN_READ_HAVE_AVX2 1
#endif

static inline uint64_t plain_read_scalar(const uint64_t *p, size_t n) {
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a0 += p[i]; a1 += p[i + 1]; a2 += p[i + 2]; a3 += p[i + 3];
        a4 += p[i + 4]; a5 += p[i + 5]; a6 += p[i + 6]; a7 += p[i + 7];
    }
    for (; i < n; i++) a0 += p[i];
    return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7;
}

#ifdef PLAIN_READ_HAVE_AVX2
/* AVX2 loads; p 32-byte aligned, n words (the loop reads multiples of 16, the rest plainly).
 * (AVX-512 loads read no faster here: 0.90-1.08x; bench/README.md, eighteenth session.) */
__attribute__((target("avx2"))) static inline uint64_t plain_read_avx2(const uint64_t *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 4)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 8)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 12)));
    }
    a0 = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t lanes[4];
    _mm256_storeu_si256((__m256i *)lanes, a0);
    return lanes[0] + lanes[1] + lanes[2] + lanes[3] + plain_read_scalar(p + i, n - i);
}
#endif

#endif
