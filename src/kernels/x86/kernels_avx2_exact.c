/* Exact-integer matrix products for CPUs with AVX2 but no AVX-512: the arithmetic of the AMX and
 * VNNI kernels (exact_scalar.c describes it and defines the bits), so these
 * CPUs give the same logits as those, and decode about twice as fast as through the f32 kernels,
 * which dequantize every weight and spend a multiply-add on it per token.
 *
 * Activations: each block of 32 becomes integer codes a = 256·h + l (two signed bytes) with scale
 * da, as there. Weights: 8 rows at a time, row r in 32-bit lane r of a register. Each row's codes
 * are made unsigned, u = q + bias, and transposed so that a register holds 4 consecutive columns
 * of all 8 rows: one vpmaddubsw against 4 activation bytes broadcast from memory then adds, per
 * row, the products of those columns in pairs, and no sums ever cross lanes. The integer sums per
 * sub-block are exact (see sums_per_lane16), C = 256·Σu·h + Σu·l - bias·Σa, and the f32 steps that follow are
 * the model's, operation for operation, on 8 rows at once. Every (row, token) result is a function
 * of that row and token only: batch- and thread-invariant, and equal to the AMX / VNNI sets'. */
#include "kernels/kernels.h"
#include "kernels/kernels_exact.h"
#include "kernels/exact_unpacked.h"
#include "base/threadpool.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>

#include "kernels/pack_vnni16.h" /* the load-time layout these sets read (below) */

/* kernels_avxvnni_exact.c builds this file again with QUILL_AVXVNNI 1 (and -mavxvnni): the
 * avxvnni set, whose sums take VEX vpdpbusd where these take vpmaddubsw and vpmaddwd. */
#ifndef QUILL_AVXVNNI
#define QUILL_AVXVNNI 0
#endif

#define TR 8             /* weight rows per tile: one per 32-bit lane */
#define MAX_WINDOW 256   /* columns unpacked at a time: one k-quant super-block */
#define PASS_TOKENS 256  /* tokens per pass over the weights: their accumulators live on the stack */

/* ---------------------------------------------------------------- per-type facts (with kernels_exact.h) */

/* Columns unpacked at a time: a block, or a k-quant super-block (whose scales come packed together;
 * iq4_xs's layout keeps them per block of 32, pack_vnni16.h). */
static inline int window_width(uint32_t type) { return is_kquant(type) && !chunk_per_block(type) ? MAX_WINDOW : 32; }

/* The types whose codes are whole bytes u = q + 128 (q8_0's, and the iq4 and iq3 levels from their
 * tables): on AVX2 their sums take vpmaddwd (q8_0_sums), as vpmaddubsw would saturate on them. */
static inline bool byte_codes(uint32_t type) {
    return type == QUILL_TYPE_Q8_0 || type == QUILL_TYPE_IQ4_NL || type == QUILL_TYPE_IQ4_XS || grid_nibbles(type);
}

/* The largest unsigned code vpmaddubsw sees (q8_0's 8-bit codes take vpmaddwd instead: q8_0_sums). */
static inline int code_max(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_Q2_K: return 3;  /* 2-bit codes, no bias */
    case QUILL_TYPE_Q3_K: return 7;  /* u = q + 4 of 3-bit codes, q in [-4, 3] */
    case QUILL_TYPE_Q6_K: return 63;
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1:
    case QUILL_TYPE_Q5_K: return 31;
    case QUILL_TYPE_MXFP4: return 31; /* fp4 values + 12 reach 24; 31 keeps the count of sums a divisor of 8 */
    default: return 15;
    }
}

/* vpmaddubsw adds two products u·x into a signed 16-bit lane, SATURATING: with u <= code_max and
 * |x| <= 128 a result is at most 2·code_max·128 in magnitude (3840 for 4-bit codes, 7936 for 5-bit
 * ones, 16128 for q6_K's 6 bits), so this many results (8, 4, 2) add up in 16 bits without ever
 * passing 32767: every sum is exact. q2_K's codes (u <= 3: 768 a result) and q3_K's (u <= 7: 1792)
 * allow 42 and 18, more than a slot of 16 columns has (4 registers: at most 4 · 1792 = 7168), so
 * they add a whole slot. Each count divides a slot's kb / 4 registers (8, or 4 for the slots of
 * 16), as window_step's loop over them needs. */
static inline int sums_per_lane16(uint32_t type) {
    const int fit = 32767 / (2 * 128 * code_max(type)), regs = slot_width(type) / 4;
    return fit < regs ? fit : regs;
}

/* ---------------------------------------------------------------- activations */

static inline int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(1, 0, 3, 2)));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, _MM_SHUFFLE(2, 3, 0, 1)));
    return _mm_cvtsi128_si32(s);
}


/* quantize_block and the split into h and l bytes with AVX2, giving the same codes: the same f32
 * max, division and products, rounded to nearest even as nearbyintf does by default, and the same
 * rounding to 8 significant bits. Also returns the sums of the codes over columns 0-15 and 16-31. */
static float quantize_block_avx2(const float *x, uint32_t type, int8_t *h, int8_t *l, int32_t *sum, int32_t part[2]) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4], amax8 = _mm256_setzero_ps(), unordered = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        v[i] = _mm256_loadu_ps(x + 8 * i);
        amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, v[i]));
        unordered = _mm256_or_ps(unordered, _mm256_cmp_ps(v[i], v[i], _CMP_UNORD_Q));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax8), _mm256_extractf128_ps(amax8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    if (!(amax > 0) || !isfinite(amax) || _mm256_movemask_ps(unordered)) { /* zeros, inf or nan: the model's rule */
        int16_t a[32];
        const float da = quantize_block(x, type, a, sum);
        part[0] = part[1] = 0;
        for (int k = 0; k < 32; k++) {
            split16(a[k], &h[k], &l[k]);
            part[k / 16] += a[k];
        }
        return da;
    }
    const int qa = act_max(type);
    const __m256 id = _mm256_set1_ps((float)qa / amax);
    const __m256i qmax = _mm256_set1_epi32(qa), qmin = _mm256_set1_epi32(-qa);
    const __m256i half = _mm256_set1_epi32(0x7FFF), one = _mm256_set1_epi32(1), top = _mm256_set1_epi32((int)0xFFFF0000u);
    __m256i a[4];
    for (int i = 0; i < 4; i++) {
        const __m256i q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v[i], id)), qmin), qmax);
        /* to 8 significant bits: the bf16 rounding of the exact f32 value */
        __m256i u = _mm256_castps_si256(_mm256_cvtepi32_ps(q));
        u = _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(half, _mm256_and_si256(_mm256_srli_epi32(u, 16), one))), top);
        a[i] = _mm256_cvttps_epi32(_mm256_castsi256_ps(u));
    }
    part[0] = hsum_epi32(_mm256_add_epi32(a[0], a[1]));
    part[1] = hsum_epi32(_mm256_add_epi32(a[2], a[3]));
    *sum = part[0] + part[1];
    /* 16-bit codes of columns 0-15, then 16-31 (packing interleaves 128-bit lanes: the permutation
     * below restores column order); l is the low byte as signed, h = (a - l) / 256 exactly */
    __m256i hv[2], lv[2];
    for (int i = 0; i < 2; i++) {
        const __m256i a16 = _mm256_packs_epi32(a[2 * i], a[2 * i + 1]);
        lv[i] = _mm256_srai_epi16(_mm256_slli_epi16(a16, 8), 8);
        hv[i] = _mm256_srai_epi16(_mm256_sub_epi16(a16, lv[i]), 8);
    }
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)h, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(hv[0], hv[1]), order));
    _mm256_storeu_si256((__m256i *)l, _mm256_permutevar8x32_epi32(_mm256_packs_epi16(lv[0], lv[1]), order));
    return amax / (float)qa;
}

/* One block's facts besides its codes (32 bytes: two to a cache line). */
typedef struct {
    float da, sf;         /* the scale; da·Σa */
    int32_t bias_sum[2];  /* per slot: bias·Σa (one slot of 32 columns, or two of 16) */
    float sf16[2];        /* per 16 columns: da·Σa, the minimums' term of q2_K's sub-blocks of 16 */
    float unused[2];
} block_facts;

/* One token's quantized activations, block by block: block b's codes are 64 bytes at codes +
 * 64·stride·b (h[32] then l[32], a = 256·h + l, in column order; q8_0 on avx2: its 16-bit codes
 * per 4 columns in the order 0, 2, 1, 3, see q8_0_sums) and its facts at facts[stride·b]. A pass's
 * tokens interleave block by block (stride = its token count), so the batch loop, which takes one
 * block of every token in turn, reads one stream: token after token in one place, where each
 * token's planes of its own (26 KiB apart for 5632 columns, beyond the stride prefetcher's reach
 * and a page each) left the loop waiting on L2 and the TLB at 34 cycles a token and block of 8 rows
 * against the 13 its operations need. */
typedef struct {
    const int8_t *codes;
    const block_facts *facts;
    size_t stride;
} planes;

#define BLOCK_CODE_BYTES 64

/* Per token: the codes and facts of its blocks, and room to align the first token's. */
static size_t planes_bytes(int64_t cols) {
    return (size_t)(cols / 32) * (BLOCK_CODE_BYTES + sizeof(block_facts)) + 64;
}

/* The planes of n_tok tokens interleaved in mem (n_tok · planes_bytes(cols) bytes), P[0..n_tok). */
static void planes_at(void *mem, int64_t cols, int n_tok, planes *P) {
    int8_t *codes = (int8_t *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    block_facts *facts = (block_facts *)(codes + (size_t)n_tok * (size_t)(cols / 32) * BLOCK_CODE_BYTES);
    for (int t = 0; t < n_tok; t++) P[t] = (planes){codes + (size_t)t * BLOCK_CODE_BYTES, facts + t, (size_t)n_tok};
}

/* The same token's planes from block b on (a window's from column 32·b): its blocks lie stride
 * records apart. */
static inline __attribute__((always_inline)) planes acts_block(planes A, int64_t b) {
    return (planes){A.codes + (size_t)b * A.stride * BLOCK_CODE_BYTES, A.facts + (size_t)b * A.stride, A.stride};
}

/* From column k (a multiple of 32) on. */
static inline __attribute__((always_inline)) planes window_acts_at(const planes *P, int64_t k) {
    return acts_block(*P, k >> 5);
}

/* The same when decoding (one token: stride 1, a constant the slots' addresses fold). */
static inline __attribute__((always_inline)) planes token_acts_at(const planes *P, int64_t k) {
    return acts_block((planes){P->codes, P->facts, 1}, k >> 5);
}

/* The codes from column off of A (within its block; off a constant where the loops unroll): h
 * there, l 32 bytes on. */
static inline __attribute__((always_inline)) const int8_t *codes_in(planes A, int off) {
    return acts_block(A, off >> 5).codes + (off & 31);
}

/* The facts of the block holding column off of A. */
static inline __attribute__((always_inline)) const block_facts *facts_in(planes A, int off) {
    return acts_block(A, off >> 5).facts;
}

/* bias·Σa of the slot of kb columns at off (as col: a window starts at a multiple of 32), whose block's facts are f */
static inline __attribute__((always_inline)) int32_t slot_bias_sum(const block_facts *f, int off, int kb) {
    return f->bias_sum[kb == 16 ? (off >> 4) & 1 : 0];
}

/* The activation bytes h and l of the 4 columns at c (codes_in), each broadcast to every 32-bit lane
 * (one per row), as the byte products take them. */
static inline __attribute__((always_inline)) void act_bytes4(const int8_t *c, __m256i *xh, __m256i *xl) {
    int32_t h4, l4;
    memcpy(&h4, c, 4);
    memcpy(&l4, c + 32, 4);
    *xh = _mm256_set1_epi32(h4);
    *xl = _mm256_set1_epi32(l4);
}

static void quantize_planes(uint32_t type, const float *x, int64_t cols, const planes *P) {
    const int bias = code_bias(type);
    for (int64_t blk = 0; blk < cols / 32; blk++) {
        const planes A = window_acts_at(P, blk * 32);
        int8_t *codes = (int8_t *)A.codes;
        block_facts *f = (block_facts *)A.facts;
        const bool wide = byte_codes(type) && !QUILL_AVXVNNI;
        _Alignas(32) int8_t hl[64];
        int8_t *h = wide ? hl : codes, *l = h + 32;
        int32_t sum, part[2];
        const float da = quantize_block_avx2(x + blk * 32, type, h, l, &sum, part);
        f->da = da;
        f->sf = da * (float)sum;
        if (slot_width(type) == 32) f->bias_sum[0] = bias * (part[0] + part[1]);
        else f->bias_sum[0] = bias * part[0], f->bias_sum[1] = bias * part[1];
        if (slot_width(type) == 16 && has_min(type)) f->sf16[0] = da * (float)part[0], f->sf16[1] = da * (float)part[1];
        if (wide) {
            int16_t a16[32];
            for (int c = 0; c < 32; c++) /* columns 4g + 1 and 4g + 2 trade places */
                a16[(c & ~3) + (c & 1) * 2 + (c & 2) / 2] = (int16_t)(256 * h[c] + l[c]);
            memcpy(codes, a16, sizeof a16);
        }
    }
}

/* ---------------------------------------------------------------- weights: a window of 8 rows */

/* A window unpacked: the unsigned codes of its columns, 4 per register (register g: columns
 * 4g..4g+3, row r in lane r), and the 8 rows' scales (and minimums) of each of its slots. */
typedef struct {
    __m256i *u;
    /* q8_0 on AVX2 splits its codes into 16-bit halves (q8_0_codes): with u_hi, u holds columns 4g
     * and 4g + 2 and u_hi 4g + 1 and 4g + 3; without (decoding, and vpdpbusd), u holds whole codes,
     * split when used, which keeps fewer registers live */
    __m256i *u_hi;
    float (*s)[TR], (*m)[TR];
} window;

/* The 32-bit words of 16 bytes at offset `at` of the 8 rows, row r in lane r: w[i] holds bytes
 * 4i..4i+3. Rows r and r + 4 are loaded into the two 128-bit halves of one register, then a 4x4
 * transpose within the halves. */
static inline __attribute__((always_inline)) __m256i load2(const uint8_t *const rp[TR], int j, size_t at) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rp[j] + at))),
                                   _mm_loadu_si128((const __m128i *)(rp[j + 4] + at)), 1);
}

static inline __attribute__((always_inline)) void words8(const uint8_t *const rp[TR], size_t at, __m256i w[4]) {
    const __m256i a0 = load2(rp, 0, at), a1 = load2(rp, 1, at), a2 = load2(rp, 2, at), a3 = load2(rp, 3, at);
    const __m256i t0 = _mm256_unpacklo_epi32(a0, a1), t1 = _mm256_unpackhi_epi32(a0, a1);
    const __m256i t2 = _mm256_unpacklo_epi32(a2, a3), t3 = _mm256_unpackhi_epi32(a2, a3);
    w[0] = _mm256_unpacklo_epi64(t0, t2);
    w[1] = _mm256_unpackhi_epi64(t0, t2);
    w[2] = _mm256_unpacklo_epi64(t1, t3);
    w[3] = _mm256_unpackhi_epi64(t1, t3);
}

/* The halves in the low (high) 16 bits of each lane, as floats. */
static inline __m256 halves_lo(__m256i v) {
    const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)));
}

static inline __m256 halves_hi(__m256i v) {
    const __m256i hi = _mm256_srli_epi32(v, 16);
    return _mm256_cvtph_ps(_mm_packus_epi32(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
}

/* The sub-block scales of a k-quant super-block for the 8 rows from its leading 32-bit words: for
 * q4_K and q5_K words 0-3 are (d, dmin) and the 12 packed scale bytes; for q6_K words 0-3 are the
 * 16 signed scales and `d6` holds d in its high half. */
static inline __attribute__((always_inline)) void kquant_scales(uint32_t type, const __m256i w[4], __m256i d6,
                                                                const window *W) {
    if (type == QUILL_TYPE_Q6_K) {
        const __m256 d = halves_hi(d6);
        for (int g = 0; g < 4; g++)
            for (int b = 0; b < 4; b++) {
                const __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(w[g], 24 - 8 * b), 24);
                _mm256_store_ps(W->s[4 * g + b], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
            }
        return;
    }
    const __m256 d = halves_lo(w[0]), dmin = halves_hi(w[0]);
    const __m256i m6 = _mm256_set1_epi32(0x3F3F3F3F), m4 = _mm256_set1_epi32(0x0F0F0F0F), m2 = _mm256_set1_epi32(0x30303030);
    /* bytes b of sc[0] / mn[0] belong to sub-blocks b < 4, of sc[1] / mn[1] to 4 + b (see quill_scale_min_k4) */
    __m256i sc[2], mn[2];
    sc[0] = _mm256_and_si256(w[1], m6);
    mn[0] = _mm256_and_si256(w[2], m6);
    sc[1] = _mm256_or_si256(_mm256_and_si256(w[3], m4), _mm256_and_si256(_mm256_srli_epi32(w[1], 2), m2));
    mn[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w[3], 4), m4), _mm256_and_si256(_mm256_srli_epi32(w[2], 2), m2));
    const __m256i ff = _mm256_set1_epi32(0xFF);
    for (int j = 0; j < 8; j++) {
        const __m256i vs = _mm256_and_si256(_mm256_srli_epi32(sc[j / 4], 8 * (j % 4)), ff);
        const __m256i vm = _mm256_and_si256(_mm256_srli_epi32(mn[j / 4], 8 * (j % 4)), ff);
        _mm256_store_ps(W->s[j], _mm256_mul_ps(d, _mm256_cvtepi32_ps(vs)));
        _mm256_store_ps(W->m[j], _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(vm)));
    }
}

/* The sub-block scales of a q2_K or q3_K super-block for the 8 rows, from 16 bytes of each row as
 * words w[0..3], as exact_unpack.c's unpackers compute them: q2_K's 16 scale bytes (4-bit scale,
 * 4-bit minimum) with d and dmin in `dm`; q3_K's 12 bytes of 6-bit scales from byte 2 (as
 * quill_q3_K_scales), d in the high half of word 3. */
static inline __m256i window_byte(const __m256i w[4], int p) {
    return _mm256_and_si256(_mm256_srli_epi32(w[p / 4], 8 * (p % 4)), _mm256_set1_epi32(0xFF));
}
static inline __attribute__((always_inline)) void lowbit_scales(uint32_t type, const __m256i w[4], __m256i dm,
                                                                const window *W) {
    const __m256i low = _mm256_set1_epi32(0xF);
    if (type == QUILL_TYPE_Q2_K) {
        const __m256 d = halves_lo(dm), dmin = halves_hi(dm);
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++) {
            const __m256i b = window_byte(w, i);
            _mm256_store_ps(W->s[i], _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_and_si256(b, low))));
            _mm256_store_ps(W->m[i], _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_srli_epi32(b, 4))));
        }
        return;
    }
    const __m256 d = halves_hi(w[3]);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) {
        const __m256i lo = i < 8 ? _mm256_and_si256(window_byte(w, 2 + i), low) : _mm256_srli_epi32(window_byte(w, 2 + i - 8), 4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi32(window_byte(w, 2 + 8 + (i & 3)), 2 * (i >> 2)), _mm256_set1_epi32(3));
        const __m256i sc = _mm256_sub_epi32(_mm256_or_si256(lo, _mm256_slli_epi32(hi, 4)), _mm256_set1_epi32(32));
        _mm256_store_ps(W->s[i], _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
    }
}

/* q5_0 / q5_1: bit j of a row's 32-bit qh is the fifth bit of its element j, and u[n] holds
 * elements 4n..4n+3 of the row in the 4 bytes of its lane, so byte k of qh belongs to u[2k] (its
 * bits 0-3) and u[2k + 1] (bits 4-7). Byte k is copied to all 4 bytes of its lane; byte b then
 * keeps bit 4 + b (of the copy shifted up by 4 for u[2k]: 16-bit shifts move bits across bytes,
 * but none of those kept). A kept bit is >= 16, so min(·, 16) is 16 exactly when it is set. */
static inline __attribute__((always_inline)) void add_fifth_bits(__m256i qh, __m256i u[8]) {
    const __m256i lane_base = /* shuffle indices of each lane's byte 0, in both 128-bit halves */
        _mm256_setr_epi32(0, 0x04040404, 0x08080808, 0x0C0C0C0C, 0, 0x04040404, 0x08080808, 0x0C0C0C0C);
    const __m256i bit_b = _mm256_set1_epi32((int)0x80402010u), sixteen = _mm256_set1_epi8(16);
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        const __m256i copy = _mm256_shuffle_epi8(qh, _mm256_add_epi8(lane_base, _mm256_set1_epi8((char)k)));
        const __m256i lo = _mm256_and_si256(_mm256_slli_epi16(copy, 4), bit_b), hi = _mm256_and_si256(copy, bit_b);
        u[2 * k] = _mm256_or_si256(u[2 * k], _mm256_min_epu8(lo, sixteen));
        u[2 * k + 1] = _mm256_or_si256(u[2 * k + 1], _mm256_min_epu8(hi, sixteen));
    }
}

/* Bit `bit` of every byte of v, as 16 or 0 in that byte. Of the bits the 16-bit shifts move
 * across bytes, none lands on a bit 4: the shift is at most 4 left or 3 right. */
static inline __attribute__((always_inline)) __m256i bit_as_16(__m256i v, int bit) {
    const __m256i at4 = bit <= 4 ? _mm256_slli_epi16(v, 4 - bit) : _mm256_srli_epi16(v, bit - 4);
    return _mm256_and_si256(at4, _mm256_set1_epi8(16));
}

/* q8_0's codes of register g (columns 4g..4g + 3, u = q + 128) into a window: whole (vpdpbusd
 * takes them, and decoding splits them when used), or for a batch on AVX2 as q8_0_sums reads
 * them, the 16-bit q of columns 4g and 4g + 2 in u[g], of 4g + 1 and 4g + 3 in u_hi[g]. */
static inline __attribute__((always_inline)) void q8_0_codes(__m256i u, const window *W, int g) {
    if (!W->u_hi) {
        W->u[g] = u;
        return;
    }
    const __m256i q = _mm256_xor_si256(u, _mm256_set1_epi8((char)0x80));
    W->u[g] = _mm256_srai_epi16(_mm256_slli_epi16(q, 8), 8);
    W->u_hi[g] = _mm256_srai_epi16(q, 8);
}

/* Codes and scales of the window of columns from k of the rows rp (lanes of `rows_at`: the rows'
 * offsets from rp[0], for the gathers of the 32-element formats' scales). */
static inline __attribute__((always_inline)) void unpack_window(uint32_t type, const uint8_t *const rp[TR],
                                                                __m256i rows_at, int64_t k, const window *W) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i w[4];
    switch (type) {
    case QUILL_TYPE_Q4_0:
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1: {
        /* 16 bytes of nibbles: column i low in byte i, column 16 + i high */
        const size_t at = (size_t)(k / 32) * block_bytes(type);
        words8(rp, at + legacy_qs(type), w);
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            W->u[g] = _mm256_and_si256(w[g], low);
            W->u[4 + g] = _mm256_and_si256(_mm256_srli_epi16(w[g], 4), low);
        }
        if (legacy_qh(type))
            add_fifth_bits(_mm256_i32gather_epi32((const int *)(rp[0] + at + legacy_qh(type)), rows_at, 1), W->u);
        /* d, and q4_1's or q5_1's minimum after it (negated: it is added), of one block per row */
        const __m256i dm = _mm256_i32gather_epi32((const int *)(rp[0] + at), rows_at, 1);
        _mm256_store_ps(W->s[0], halves_lo(dm));
        if (has_min(type)) _mm256_store_ps(W->m[0], _mm256_xor_ps(halves_hi(dm), _mm256_set1_ps(-0.0f)));
        break;
    }
    case QUILL_TYPE_Q8_0: {
        /* u = q + 128 reaches 255, and two products of 255 and -128 saturate vpmaddubsw: on AVX2
         * the codes enter q8_0_sums as 16-bit values instead (batches: split here, once) */
        const size_t at = (size_t)(k / 32) * sizeof(block_q8_0);
#pragma GCC unroll 2
        for (int half = 0; half < 2; half++) {
            words8(rp, at + offsetof(block_q8_0, qs) + 16 * (size_t)half, w);
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) q8_0_codes(_mm256_xor_si256(w[g], _mm256_set1_epi8((char)0x80)), W, 4 * half + g);
        }
        _mm256_store_ps(W->s[0], halves_lo(_mm256_i32gather_epi32((const int *)(rp[0] + at), rows_at, 1)));
        break;
    }
    case QUILL_TYPE_Q4_K:
    case QUILL_TYPE_Q5_K: {
        /* per 64 columns 32 bytes: sub-block 2c in the low nibbles, 2c + 1 in the high ones; q5_K
         * adds bit 2c (2c + 1) of qh[l] for element l of sub-block 2c (2c + 1) */
        const size_t at = (size_t)(k / 256) * block_bytes(type);
        const bool q5 = type == QUILL_TYPE_Q5_K;
        const size_t qs = at + (q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs));
        __m256i qh[2][4]; /* q5_K's 32 bytes, bytes 16i + 4g.. in qh[i][g] */
        for (int i = 0; i < 2 && q5; i++) words8(rp, at + offsetof(block_q5_K, qh) + 16 * (size_t)i, qh[i]);
        for (int c = 0; c < 4; c++)
            for (int i = 0; i < 2; i++) {
                words8(rp, qs + 32 * (size_t)c + 16 * (size_t)i, w);
                for (int g = 0; g < 4; g++) {
                    __m256i lo = _mm256_and_si256(w[g], low), hi = _mm256_and_si256(_mm256_srli_epi16(w[g], 4), low);
                    if (q5) {
                        lo = _mm256_or_si256(lo, bit_as_16(qh[i][g], 2 * c));
                        hi = _mm256_or_si256(hi, bit_as_16(qh[i][g], 2 * c + 1));
                    }
                    W->u[16 * c + 4 * i + g] = lo;
                    W->u[16 * c + 8 + 4 * i + g] = hi;
                }
            }
        _Static_assert(offsetof(block_q4_K, scales) == 4 && offsetof(block_q4_K, qs) == 16, "q4_K: d, dmin, scales");
        _Static_assert(offsetof(block_q5_K, scales) == 4 && offsetof(block_q5_K, qh) == 16, "q5_K: the same, then qh");
        words8(rp, at, w);
        kquant_scales(type, w, _mm256_setzero_si256(), W);
        break;
    }
    default: {
        /* q6_K: column 128·hf + 32·qd + l (l < 32) takes the low (qd < 2) or high nibble of
         * ql[64·hf + 32·(qd & 1) + l] and bits 2qd, 2qd + 1 of qh[32·hf + l] */
        const size_t at = (size_t)(k / 256) * sizeof(block_q6_K);
        const __m256i m30 = _mm256_set1_epi8(0x30);
        for (int hf = 0; hf < 2; hf++)
            for (int i = 0; i < 2; i++) {
                __m256i ql0[4], ql1[4], qh[4];
                words8(rp, at + offsetof(block_q6_K, ql) + 64 * (size_t)hf + 16 * (size_t)i, ql0);
                words8(rp, at + offsetof(block_q6_K, ql) + 64 * (size_t)hf + 32 + 16 * (size_t)i, ql1);
                words8(rp, at + offsetof(block_q6_K, qh) + 32 * (size_t)hf + 16 * (size_t)i, qh);
                for (int g = 0; g < 4; g++) {
                    __m256i *u = W->u + 32 * hf + 4 * i + g;
                    u[0] = _mm256_or_si256(_mm256_and_si256(ql0[g], low), _mm256_and_si256(_mm256_slli_epi16(qh[g], 4), m30));
                    u[8] = _mm256_or_si256(_mm256_and_si256(ql1[g], low), _mm256_and_si256(_mm256_slli_epi16(qh[g], 2), m30));
                    u[16] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0[g], 4), low), _mm256_and_si256(qh[g], m30));
                    u[24] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1[g], 4), low),
                                            _mm256_and_si256(_mm256_srli_epi16(qh[g], 2), m30));
                }
            }
        _Static_assert(offsetof(block_q6_K, d) == offsetof(block_q6_K, scales) + 16, "q6_K: d follows the scales");
        __m256i dw[4];
        words8(rp, at + offsetof(block_q6_K, scales), w);
        words8(rp, at + offsetof(block_q6_K, scales) + 2, dw); /* its word 3 ends with d */
        kquant_scales(type, w, dw[3], W);
        break;
    }
    }
}

/* ---------------------------------------------------------------- sums and f32 steps */

#if !QUILL_AVXVNNI
/* q8_0 on AVX2: whole codes against whole activation codes by vpmaddwd, whose two 16-bit products
 * per 32-bit lane add without saturating: |q·a| <= 128 · 4064 (act_max), so the block's C = Σq·a
 * stays below 2^24, exact in 32 bits and needing no bias. A lane's low 16 bits hold column 4g's
 * (4g + 1's) code, its high ones 4g + 2's (4g + 3's): the even and odd bytes of the 4 codes, taken
 * apart with 16-bit shifts, and the activations stored in that order (quantize_planes). Half the
 * instructions of vpmaddubsw on the codes' two 4-bit digits against both activation bytes. The
 * slot's registers only: a grid type with slots of 16 sums each half of its block apart. */
static inline __attribute__((always_inline)) void q8_0_sums(const window *W, const int8_t *codes, int slot, int kb,
                                                            const block_facts *f, __m256 *acc) {
    __m256i c = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int g = slot * kb / 4; g < (slot + 1) * kb / 4; g++) {
        __m256i even, odd;
        if (W->u_hi) {
            even = W->u[g], odd = W->u_hi[g];
        } else {
            const __m256i q = _mm256_xor_si256(W->u[g], _mm256_set1_epi8((char)0x80));
            even = _mm256_srai_epi16(_mm256_slli_epi16(q, 8), 8);
            odd = _mm256_srai_epi16(q, 8);
        }
        int32_t a02, a13;
        const int8_t *a16 = codes + 2 * 4 * g; /* 16-bit codes: 8 bytes per 4 columns */
        memcpy(&a02, a16, 4);
        memcpy(&a13, a16 + 4, 4);
        c = _mm256_add_epi32(c, _mm256_madd_epi16(even, _mm256_set1_epi32(a02)));
        c = _mm256_add_epi32(c, _mm256_madd_epi16(odd, _mm256_set1_epi32(a13)));
    }
    const __m256 sc = _mm256_load_ps(W->s[slot]);
    *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c), _mm256_mul_ps(sc, _mm256_set1_ps(f->da)), *acc);
}
#endif

/* One token's contribution of a window: per slot the exact sums Σu·h and Σu·l of the 8 rows,
 * combined into C = Σq·a, then the model's f32 steps into acc, slot after slot. (Two or three
 * tokens interleaved in one step were slower: their sums spill; the loop runs near the bound of
 * its ports when it has the core to itself, bench/README.md.) */
static inline __attribute__((always_inline)) void window_step(uint32_t type, const window *W, planes A,
                                                              __m256 *acc) {
    const int kb = slot_width(type), n_slots = window_width(type) / kb;
#if !QUILL_AVXVNNI
    const int per = sums_per_lane16(type);
    const __m256i ones = _mm256_set1_epi16(1), k256 = _mm256_set1_epi16(256);
#endif
#pragma GCC unroll 16
    for (int i = 0; i < n_slots; i++) {
        const int off = i * kb; /* k is a multiple of 32: off places the slot in its block */
        const int8_t *codes = codes_in(A, off); /* the slot's activation bytes */
        const block_facts *f = facts_in(A, off);
        __m256i ch = _mm256_setzero_si256(), cl = ch;
#if !QUILL_AVXVNNI
        if (byte_codes(type)) { /* the block's 16-bit codes from its start (the grid types' slots of 16: two a block) */
            q8_0_sums(W, acts_block(A, off >> 5).codes, i, kb, f, acc);
            continue;
        }
#endif
#if QUILL_AVXVNNI
        /* vpdpbusd adds its four products u·x into the 32-bit lane without saturating: whole codes,
         * q8_0's 8-bit ones too, and no 16-bit partial sums (at most 32 · 255 · 128 < 2^31) */
        /* the k-quants' windows: two chains a plane, where one of 8 vpdpbusd (5 cycles each) a slot
         * held batches to its latency (q4_K 1.23x); the 32-column types' 4-block steps already
         * overlap enough (two chains: q4_0 the same, q8_0 0.92x) */
        const int chains = window_width(type) == MAX_WINDOW ? 2 : 1;
        __m256i ch2 = ch, cl2 = cl;
#pragma GCC unroll 8
        for (int g = 0; g < kb / 4; g += chains) {
            __m256i xh, xl;
            act_bytes4(codes + 4 * g, &xh, &xl);
            const __m256i u = W->u[i * kb / 4 + g];
            ch = _mm256_dpbusd_avx_epi32(ch, u, xh);
            cl = _mm256_dpbusd_avx_epi32(cl, u, xl);
            if (chains == 2) {
                act_bytes4(codes + 4 * g + 4, &xh, &xl);
                const __m256i u2 = W->u[i * kb / 4 + g + 1];
                ch2 = _mm256_dpbusd_avx_epi32(ch2, u2, xh);
                cl2 = _mm256_dpbusd_avx_epi32(cl2, u2, xl);
            }
        }
        if (chains == 2) {
            ch = _mm256_add_epi32(ch, ch2);
            cl = _mm256_add_epi32(cl, cl2);
        }
#else
#pragma GCC unroll 4
        for (int g0 = 0; g0 < kb / 4; g0 += per) {
            __m256i h16 = _mm256_setzero_si256(), l16 = h16;
#pragma GCC unroll 8
            for (int g = g0; g < g0 + per; g++) {
                __m256i xh, xl; /* the activation bytes of columns 4g..4g + 3 of the slot */
                act_bytes4(codes + 4 * g, &xh, &xl);
                const __m256i u = W->u[i * kb / 4 + g];
                h16 = _mm256_add_epi16(h16, _mm256_maddubs_epi16(u, xh));
                l16 = _mm256_add_epi16(l16, _mm256_maddubs_epi16(u, xl));
                /* each sum a chain in one register: GCC otherwise regroups the adds into a tree
                 * over all the products, whose waiting halves spill */
                __asm__("" : "+x"(h16), "+x"(l16));
            }
            /* 256·Σu·h directly: pairs of at most 32767 · 256, exact in 32 bits */
            ch = _mm256_add_epi32(ch, _mm256_madd_epi16(h16, k256));
            cl = _mm256_add_epi32(cl, _mm256_madd_epi16(l16, ones));
        }
#endif
        /* C = 256·Σu·h + Σu·l - bias·Σa: exact, below 2^24 */
#if QUILL_AVXVNNI
        ch = _mm256_slli_epi32(ch, 8);
#endif
        __m256i sub = _mm256_add_epi32(ch, cl);
        if (code_bias(type)) /* (q4_K, q5_K, q4_1, q5_1, q2_K: codes unsigned as they are) */
            sub = _mm256_sub_epi32(sub, _mm256_set1_epi32(slot_bias_sum(f, off, kb)));
        const __m256 sc = _mm256_load_ps(W->s[i]);
        *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sub), _mm256_mul_ps(sc, _mm256_set1_ps(f->da)), *acc);
        if (has_min(type)) { /* da·Σa of the slot's block of 32, or of its own 16 columns (q2_K) */
            const float term = kb == 16 ? f->sf16[(off >> 4) & 1] : f->sf;
            *acc = _mm256_fnmadd_ps(_mm256_load_ps(W->m[i]), _mm256_set1_ps(term), *acc);
        }
    }
}

/* ---------------------------------------------------------------- the tile loop */

typedef struct {
    const uint8_t *w;
    size_t row_bytes;
    int64_t rows, cols;
    int n_tok;       /* at most PASS_TOKENS */
    const planes *P; /* one per token */
    float *y;        /* y[t · rows + r] */
} tiles_job;

static inline void store_rows(float *y, int nr, __m256 v) {
    if (nr == TR) {
        _mm256_storeu_ps(y, v);
        return;
    }
    _Alignas(32) float out[TR];
    _mm256_store_ps(out, v);
    memcpy(y, out, (size_t)nr * sizeof *y);
}

/* A batch's columns go in chunks, each through a group of BATCH_TILES tiles before the next: a
 * chunk's activation bytes for all the pass's tokens then stay in a core's L2 while the group's
 * tiles reread them, where a whole row of 256 tokens' bytes (2 per column: 4 MiB for an FFN of
 * 8192) came from L3 for every 8 rows (one product of 512 x 8192 x 256 tokens ran at 0.54x the
 * rate of 1024 x 2048's). Between chunks the group's (row, token) sums wait in accumulators of
 * their own (f32, as in the register), so every sum still adds its slots in column order: the same
 * bits. (They waited in y, across all the thread's tiles: 8 KiB apart a token, a round trip per
 * chunk that cost 1.1-1.3x, and with more than one thread each claim was one tile, so the chunks
 * shared nothing.) BATCH_CHUNK_BYTES is a quarter of Zen 3's 512 KiB L2, the smallest of the CPUs
 * this set serves (64-256 KiB measured alike here). */
#define BATCH_CHUNK_BYTES (128 * 1024)
#define BATCH_TILES 4
static inline int64_t batch_chunk_cols(int64_t cols, int n_tok) {
    int64_t c = BATCH_CHUNK_BYTES / (2 * (int64_t)n_tok) / MAX_WINDOW * MAX_WINDOW;
    if (c < MAX_WINDOW) c = MAX_WINDOW;
    return c < cols ? c : cols;
}

/* How many of the 8 rows from r0 lie in the matrix. */
static inline int tile_nr(const tiles_job *j, int64_t r0) { return j->rows - r0 < TR ? (int)(j->rows - r0) : TR; }

/* The 8 rows of a file-row tile from r0: their addresses, and their offsets from the first as the
 * lanes of a register (rows past the matrix repeat its first row: their lanes are computed and
 * never stored). */
typedef struct {
    const uint8_t *rp[TR];
    __m256i at;
} tile_rows;
static inline __attribute__((always_inline)) tile_rows rows_of(const tiles_job *j, int64_t r0) {
    const int nr = tile_nr(j, r0);
    tile_rows t;
    int32_t offs[TR];
    for (int r = 0; r < TR; r++) {
        offs[r] = (int32_t)((size_t)(r < nr ? r : 0) * j->row_bytes);
        t.rp[r] = j->w + (size_t)r0 * j->row_bytes + (size_t)offs[r];
    }
    t.at = _mm256_loadu_si256((const __m256i *)offs);
    return t;
}

static inline __attribute__((always_inline)) void tiles_impl(const tiles_job *j, int64_t t0, int64_t t1,
                                                             uint32_t type) {
    const int width = window_width(type);
    const int64_t n_windows = j->cols / width;
    /* Eight rows read a little at a time defeat the hardware prefetchers: each window prefetches its
     * share of the tile two ahead, one contiguous range, in address order and a few lines at a time
     * (as the vnni set's decoding loop, exact_avx512.h, where this was measured essential). Addresses past the
     * matrix are harmless: prefetches do not fault. */
    const size_t tile_bytes = TR * j->row_bytes, tile_lines = (tile_bytes + 63) / 64;
    const size_t pf_lines = (tile_lines + (size_t)n_windows - 1) / (size_t)n_windows;
    /* a block's codes fit in registers, where the compiler keeps arrays this small */
    _Alignas(32) __m256i u_block[32 / 4], u_hi[32 / 4], u_super[MAX_WINDOW / 4];
    _Alignas(32) float s_block[2][TR], m_block[2][TR], s_super[MAX_WINDOW / 16][TR], m_super[MAX_WINDOW / 16][TR];
    /* q8_0's digits (u_hi) only where vpmaddubsw would saturate on whole codes */
    __m256i *const digits = QUILL_AVXVNNI ? NULL : u_hi;
    const window batch = width == 32 ? (window){u_block, digits, s_block, m_block} : (window){u_super, digits, s_super, m_super};
    const window decode = {batch.u, NULL, batch.s, batch.m};
    if (j->n_tok == 1) { /* decoding: the accumulators stay in registers */
        for (int64_t tile = t0; tile < t1; tile++) {
            const int64_t r0 = tile * TR;
            const tile_rows rows = rows_of(j, r0);
            uintptr_t pf = (uintptr_t)rows.rp[0] + 2 * tile_bytes;
            __m256 acc1 = _mm256_setzero_ps();
            for (int64_t k = 0; k < j->cols; k += width, pf += 64 * pf_lines) {
                for (size_t i = 0; i < pf_lines; i++) _mm_prefetch((const char *)(pf + 64 * i), _MM_HINT_T0);
                unpack_window(type, rows.rp, rows.at, k, &decode);
                window_step(type, &decode, token_acts_at(j->P, k), &acc1);
            }
            store_rows(j->y + r0, tile_nr(j, r0), acc1);
        }
        return;
    }
    /* a batch: 2 · BATCH_TILES tiles of 8 rows at a time (packed_impl's groups of 16-row tiles) */
    enum { GROUP = 2 * BATCH_TILES };
    __m256 accs[GROUP][PASS_TOKENS];
    const int64_t chunk = batch_chunk_cols(j->cols, j->n_tok);
    for (int64_t g0 = t0; g0 < t1; g0 += GROUP) {
        const int64_t g1 = t1 - g0 < GROUP ? t1 : g0 + GROUP;
        for (int64_t k0 = 0; k0 < j->cols; k0 += chunk) {
            const int64_t k1 = j->cols - k0 < chunk ? j->cols : k0 + chunk;
            for (int64_t tile = g0; tile < g1; tile++) {
                const int64_t r0 = tile * TR;
                const tile_rows rows = rows_of(j, r0);
                uintptr_t pf = (uintptr_t)rows.rp[0] + 2 * tile_bytes;
                __m256 *acc = accs[tile - g0];
                if (k0 == 0)
                    for (int t = 0; t < j->n_tok; t++) acc[t] = _mm256_setzero_ps();
                for (int64_t k = k0; k < k1; k += width) {
                    /* (the tile two ahead is one range only when the chunk is the whole row) */
                    if (chunk == j->cols) {
                        for (size_t i = 0; i < pf_lines; i++) _mm_prefetch((const char *)(pf + 64 * i), _MM_HINT_T0);
                        pf += 64 * pf_lines;
                    }
                    unpack_window(type, rows.rp, rows.at, k, &batch);
                    for (int t = 0; t < j->n_tok; t++) window_step(type, &batch, window_acts_at(j->P + t, k), &acc[t]);
                }
            }
        }
        for (int64_t tile = g0; tile < g1; tile++) {
            const int64_t r0 = tile * TR;
            for (int t = 0; t < j->n_tok; t++)
                store_rows(j->y + (size_t)t * (size_t)j->rows + r0, tile_nr(j, r0), accs[tile - g0][t]);
        }
    }
}

/* ---------------------------------------------------------------- the load-time layout (pack_vnni16.h)
 *
 * The vnni set's "vnni16" copy, read as two halves of 8 rows: a 64-byte register of the layout
 * holds 4 columns' code bytes of 16 rows, row r in 32-bit lane r, so its first 32 bytes are
 * exactly what words8 builds from 8 strided rows with 8 loads and 8 shuffles, and the rows'
 * scales lie side by side where the file's rows needed a gather. Decoding reads a group of tiles
 * (q4_0's 4, the others' 1) as one stream, front to back, both halves of a tile from each line.
 * The codes and scales are the file's, so the sums and f32 steps are those of the file's rows bit
 * for bit. (pack_vnni16.h, included above.) */

static inline bool avx2_packed_type(uint32_t type) {
    return type == QUILL_TYPE_Q4_0 || type == QUILL_TYPE_Q8_0 || type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K ||
           type == QUILL_TYPE_Q6_K || type == QUILL_TYPE_MXFP4 || type == QUILL_TYPE_Q2_K || type == QUILL_TYPE_Q3_K ||
           type == QUILL_TYPE_IQ4_NL || type == QUILL_TYPE_IQ4_XS || grid_nibbles(type) || legacy_packed(type);
}

static size_t avx2_pack_bytes(uint32_t type, int64_t rows, int64_t cols) {
    return avx2_packed_type(type) ? vnni16_pack_bytes(type, rows, cols) : 0;
}

static void avx2_pack(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                      int64_t tile0, int64_t tile1) {
    vnni16_pack(type, w, row_bytes, rows, cols, dst, tile0, tile1);
}

/* Half hf (rows 8hf..8hf + 7) of register `reg` at p. */
static inline __m256i half_reg(const uint8_t *p, int reg, int hf) {
    return _mm256_load_si256((const __m256i *)(p + (size_t)reg * 64 + 32 * (size_t)hf));
}

/* Where a tile's window from column k lies in the packed matrix: the 32-column types' codes of the
 * block and the chunk's scales of it, the k-quants' super-block. */
typedef struct {
    const uint8_t *codes, *scales;
    int sub; /* iq4_xs: the block's place in its chunk, whose scales begin at `scales` */
} packed_window;

static inline __attribute__((always_inline)) packed_window locate_window(uint32_t type, const uint8_t *m, int64_t tiles,
                                                                         size_t tb, int64_t cols, int64_t tile, int64_t k) {
    if (kblock_type(type))
        return (packed_window){m + (size_t)tile * tb + (size_t)(k / 256) * (size_t)kblock_regs(type) * 64, NULL, 0};
    const int64_t k0 = k / PACK_CW * PACK_CW, in_chunk = (k - k0) / 32;
    const int64_t blocks = (cols - k0 < PACK_CW ? cols - k0 : PACK_CW) / 32;
    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
    const size_t scales_at = chunk_per_block(type) ? 0 : (size_t)in_chunk * block_scale_bytes(type);
    return (packed_window){m + place_codes(type, pl, blocks, in_chunk), m + place_scales(type, pl, blocks) + scales_at,
                           (int)in_chunk};
}

/* Slot sl's scales of half hf of a grid type's packed block, from the chunk's scales: sc the
 * slot's nibble of the row's scale words, then the unpacker's steps. */
static inline __attribute__((always_inline)) __m256 grid_scales(uint32_t type, const uint8_t *scales, int sl, int hf) {
    const __m256i words = _mm256_load_si256((const __m256i *)(scales + 64 * (sl / 8) + 32 * hf));
    const __m256i sc = _mm256_and_si256(_mm256_srli_epi32(words, 4 * (sl % 8)), _mm256_set1_epi32(0xF));
    const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(scales + grid_d_at(type) + 16 * hf)));
    const __m256 odd = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_slli_epi32(sc, 1), _mm256_set1_epi32(1)));
    if (type == QUILL_TYPE_IQ3_S) return _mm256_mul_ps(d, odd); /* d · (1 + 2 sc) */
    if (type == QUILL_TYPE_IQ1_S || type == QUILL_TYPE_IQ1_M) /* d · (2 sc + 1) · 0.125 */
        return _mm256_mul_ps(_mm256_mul_ps(d, odd), _mm256_set1_ps(0.125f));
    /* iq3_xxs: d · (0.5 + sc) · 0.5; the iq2 types: d · (0.5 + sc) · 0.25 */
    const __m256 half = _mm256_set1_ps(0.5f), last = _mm256_set1_ps(type == QUILL_TYPE_IQ3_XXS ? 0.5f : 0.25f);
    return _mm256_mul_ps(_mm256_mul_ps(d, _mm256_add_ps(half, _mm256_cvtepi32_ps(sc))), last);
}

/* unpack_window's codes and scales of 8 rows, from the layout. */
static inline __attribute__((always_inline)) void unpack_packed(uint32_t type, packed_window pw, int hf, const window *W) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256i w[4];
    switch (type) {
    case QUILL_TYPE_Q4_0: /* (no fifth bits, no minimums: the facts below skip them) */
    case QUILL_TYPE_Q4_1:
    case QUILL_TYPE_Q5_0:
    case QUILL_TYPE_Q5_1:
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i v = half_reg(pw.codes, g, hf);
            W->u[g] = _mm256_and_si256(v, low);
            W->u[4 + g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        }
        if (legacy_qh(type)) add_fifth_bits(half_reg(pw.codes, 4, hf), W->u);
        _mm256_store_ps(W->s[0], _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(pw.scales + 16 * hf))));
        if (has_min(type)) /* negated, as unpack_window's: it is added */
            _mm256_store_ps(W->m[0], _mm256_xor_ps(_mm256_cvtph_ps(_mm_load_si128((const __m128i *)(pw.scales + 32 + 16 * hf))),
                                                   _mm256_set1_ps(-0.0f)));
        break;
    case QUILL_TYPE_MXFP4: {
        /* q4_0's nibble bytes; each nibble to its code + 12 (code_bias) by a byte shuffle, and each
         * row's exponent byte to quill_e8m0_half_to_float's scale: 2^(e - 128) as (e - 1) << 23,
         * the two smallest (e < 2) subnormal */
        _Alignas(16) int8_t table[16];
        for (int i = 0; i < 16; i++) table[i] = (int8_t)(quill_kvalues_fp4[i] + 12);
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)table));
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i v = half_reg(pw.codes, g, hf);
            W->u[g] = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, low));
            W->u[4 + g] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
        }
        const __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(pw.scales + 8 * hf)));
        const __m256i normal = _mm256_slli_epi32(_mm256_sub_epi32(e, _mm256_set1_epi32(1)), 23);
        const __m256i tiny = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
        const __m256i is_tiny = _mm256_cmpgt_epi32(_mm256_set1_epi32(2), e);
        _mm256_store_ps(W->s[0], _mm256_castsi256_ps(_mm256_blendv_epi8(normal, tiny, is_tiny)));
        break;
    }
    case QUILL_TYPE_IQ4_NL:
    case QUILL_TYPE_IQ4_XS:
    case QUILL_TYPE_IQ3_S:
    case QUILL_TYPE_IQ3_XXS:
    case QUILL_TYPE_IQ2_XXS:
    case QUILL_TYPE_IQ2_XS:
    case QUILL_TYPE_IQ2_S:
    case QUILL_TYPE_IQ1_S:
    case QUILL_TYPE_IQ1_M: {
        /* each nibble to its level + 128 by a byte shuffle: q8_0's codes, low nibbles its registers
         * 0-3 (columns 4g..), high ones 4-7 (16 + 4g..) */
        _Alignas(16) int8_t table[16];
        for (int i = 0; i < 16; i++) table[i] = (int8_t)(nibble_levels(type)[i] ^ 0x80);
        const __m256i lut = _mm256_broadcastsi128_si256(_mm_load_si128((const __m128i *)table));
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i v = half_reg(pw.codes, g, hf);
            q8_0_codes(_mm256_shuffle_epi8(lut, _mm256_and_si256(v, low)), W, g);
            q8_0_codes(_mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), low)), W, 4 + g);
        }
        if (grid_nibbles(type)) { /* the block's slots' scales (one, or two of 16 columns) */
            const int per = 32 / slot_width(type);
            for (int i = 0; i < per; i++) _mm256_store_ps(W->s[i], grid_scales(type, pw.scales, per * pw.sub + i, hf));
            break;
        }
        const __m256 d = _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(pw.scales + 16 * hf)));
        if (type == QUILL_TYPE_IQ4_NL) {
            _mm256_store_ps(W->s[0], d);
            break;
        }
        /* d · (ls - 32), as the unpacker */
        const __m256i ls = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(pw.scales + 64 + 16 * pw.sub + 8 * hf)));
        _mm256_store_ps(W->s[0], _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32)))));
        break;
    }
    case QUILL_TYPE_Q8_0: /* the layout's codes are u = q + 128 already */
#pragma GCC unroll 8
        for (int g = 0; g < 8; g++) q8_0_codes(half_reg(pw.codes, g, hf), W, g);
        _mm256_store_ps(W->s[0], _mm256_cvtph_ps(_mm_load_si128((const __m128i *)(pw.scales + 16 * hf))));
        break;
    case QUILL_TYPE_Q4_K:
    case QUILL_TYPE_Q5_K: {
        const bool q5 = type == QUILL_TYPE_Q5_K;
        for (int c = 0; c < 4; c++)
            for (int h = 0; h < 2; h++) {
                const int reg = half_window_reg(type, c, h);
                /* q5_K: byte j of the fifth bits' register holds register g's low nibble's bit at 2g, the high one's at 2g + 1 */
                const __m256i fifth = q5 ? half_reg(pw.codes, reg + 4, hf) : _mm256_setzero_si256();
                for (int g = 0; g < 4; g++) {
                    const __m256i v = half_reg(pw.codes, reg + g, hf);
                    __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
                    if (q5) {
                        lo = _mm256_or_si256(lo, bit_as_16(fifth, 2 * g));
                        hi = _mm256_or_si256(hi, bit_as_16(fifth, 2 * g + 1));
                    }
                    W->u[16 * c + 4 * h + g] = lo;
                    W->u[16 * c + 8 + 4 * h + g] = hi;
                }
            }
        for (int i = 0; i < 4; i++) w[i] = half_reg(pw.codes, i, hf);
        kquant_scales(type, w, _mm256_setzero_si256(), W);
        break;
    }
    case QUILL_TYPE_Q2_K:
    case QUILL_TYPE_Q3_K: {
        /* per sub-block of 16 columns a register whose byte j holds the code of column 4g + j at
         * bits 2g, 2g + 1 (q3_K: of u = q + 4, its third bits in a register per pair of sub-blocks,
         * that of sub-block 2p + i's column 4g + j at bit 4i + g of byte j). The 16-bit shifts move
         * bits across bytes, but never onto the bits kept: right by at most 6 for the 2 low bits,
         * by at most 5 or left by at most 2 for bit 2. */
        const bool q3 = type == QUILL_TYPE_Q3_K;
        const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
#pragma GCC unroll 16
        for (int sl = 0; sl < 16; sl++) {
            const __m256i v = half_reg(pw.codes, q3 ? 4 + 3 * (sl / 2) + sl % 2 : 5 + sl, hf);
            const __m256i third = q3 ? half_reg(pw.codes, 4 + 3 * (sl / 2) + 2, hf) : _mm256_setzero_si256();
#pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                __m256i u = _mm256_and_si256(_mm256_srli_epi16(v, 2 * g), three);
                if (q3) {
                    const int bit = 4 * (sl % 2) + g;
                    const __m256i at2 = bit >= 2 ? _mm256_srli_epi16(third, bit - 2) : _mm256_slli_epi16(third, 2 - bit);
                    u = _mm256_or_si256(u, _mm256_and_si256(at2, four));
                }
                W->u[4 * sl + g] = u;
            }
        }
        for (int i = 0; i < 4; i++) w[i] = half_reg(pw.codes, i, hf);
        lowbit_scales(type, w, q3 ? _mm256_setzero_si256() : half_reg(pw.codes, 4, hf), W);
        break;
    }
    default: { /* q6_K: per 16 columns, nibbles of columns 4g.. (g = 0, 1 low; 2, 3 high) and their top bits at 2g */
        const __m256i m30 = _mm256_set1_epi8(0x30);
        for (int sl = 0; sl < 16; sl++) {
            const __m256i n0 = half_reg(pw.codes, 5 + 3 * sl, hf), n1 = half_reg(pw.codes, 6 + 3 * sl, hf);
            const __m256i top = half_reg(pw.codes, 7 + 3 * sl, hf);
            __m256i *u = W->u + 4 * sl;
            u[0] = _mm256_or_si256(_mm256_and_si256(n0, low), _mm256_and_si256(_mm256_slli_epi16(top, 4), m30));
            u[1] = _mm256_or_si256(_mm256_and_si256(n1, low), _mm256_and_si256(_mm256_slli_epi16(top, 2), m30));
            u[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n0, 4), low), _mm256_and_si256(top, m30));
            u[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(n1, 4), low),
                                   _mm256_and_si256(_mm256_srli_epi16(top, 2), m30));
        }
        for (int i = 0; i < 4; i++) w[i] = half_reg(pw.codes, i, hf);
        kquant_scales(type, w, half_reg(pw.codes, 4, hf), W); /* d in the high half of register 4's words */
        break;
    }
    }
}

/* The scales (and minimums) of halves h0..h0 + nh - 1 of a packed k-quant super-block, per slot, as
 * unpack_packed makes them (for the one-token loops below). */
static inline __attribute__((always_inline)) void superblock_scales(uint32_t type, packed_window pw, int h0, int nh,
                                                                    float s[2][16][TR], float m[2][16][TR]) {
    for (int hf = h0; hf < h0 + nh; hf++) {
        const window W = {NULL, NULL, s[hf], m[hf]};
        __m256i w[4];
        for (int i = 0; i < 4; i++) w[i] = half_reg(pw.codes, i, hf);
        if (type == QUILL_TYPE_Q2_K || type == QUILL_TYPE_Q3_K) /* q2_K's d and dmin in register 4 */
            lowbit_scales(type, w, type == QUILL_TYPE_Q2_K ? half_reg(pw.codes, 4, hf) : _mm256_setzero_si256(), &W);
        else /* q6_K's d in register 4 */
            kquant_scales(type, w, type == QUILL_TYPE_Q6_K ? half_reg(pw.codes, 4, hf) : _mm256_setzero_si256(), &W);
    }
}

/* The unsigned codes of columns 4g..4g + 3 of sub-block sl of a packed q2_K or q3_K super-block,
 * from its code register v (and q3_K's third bits), as unpack_packed takes them apart. */
static inline __attribute__((always_inline)) __m256i lowbit_u(uint32_t type, __m256i v, __m256i third, int sl, int g) {
    __m256i u = _mm256_and_si256(_mm256_srli_epi16(v, 2 * g), _mm256_set1_epi8(3));
    if (type == QUILL_TYPE_Q3_K) {
        const int bit = 4 * (sl % 2) + g;
        const __m256i at2 = bit >= 2 ? _mm256_srli_epi16(third, bit - 2) : _mm256_slli_epi16(third, 2 - bit);
        u = _mm256_or_si256(u, _mm256_and_si256(at2, _mm256_set1_epi8(4)));
    }
    return u;
}

/* One token's window of a q2_K or q3_K super-block, halves h0..h0 + nh - 1 of the tile (both: each
 * activation broadcast serves 16 rows), sub-block after sub-block, the codes going from the
 * layout to the byte products without the window's round trip through memory (one product in the
 * caches: q2_K 1.1-1.4x the window loop on avx2, q2_K and q3_K 1.3-1.6x on avxvnni; bench/README.md).
 * The sums and the f32 steps are window_step's, per row, in its order: the same bits. */
static inline __attribute__((always_inline)) void lowbit_decode(uint32_t type, packed_window pw, const planes *P,
                                                                int64_t k, __m256 acc[2], int h0, int nh) {
    const bool q3 = type == QUILL_TYPE_Q3_K;
    _Alignas(32) float s[2][16][TR], m[2][16][TR];
    const planes A = token_acts_at(P, k); /* decoding only */
    superblock_scales(type, pw, h0, nh, s, m);
#if !QUILL_AVXVNNI
    const __m256i ones = _mm256_set1_epi16(1);
#endif
#pragma GCC unroll 16
    for (int sl = 0; sl < 16; sl++) {
        const int off = 16 * sl;
        const int8_t *codes = codes_in(A, off);
        const block_facts *f = facts_in(A, off);
        const int reg = q3 ? 4 + 3 * (sl / 2) + sl % 2 : 5 + sl;
        __m256i v[2], third[2], h16[2], l16[2];
        for (int hf = h0; hf < h0 + nh; hf++) {
            v[hf] = half_reg(pw.codes, reg, hf);
            third[hf] = q3 ? half_reg(pw.codes, 4 + 3 * (sl / 2) + 2, hf) : _mm256_setzero_si256();
            h16[hf] = l16[hf] = _mm256_setzero_si256();
        }
        /* 4 registers a half: at most 4 · 2 · 7 · 128 = 7168 in a 16-bit lane (sums_per_lane16) */
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256i xh, xl; /* the activation bytes of columns 4g..4g + 3 of the slot */
            act_bytes4(codes + 4 * g, &xh, &xl);
            for (int hf = h0; hf < h0 + nh; hf++) {
                const __m256i u = lowbit_u(type, v[hf], third[hf], sl, g);
#if QUILL_AVXVNNI
                h16[hf] = _mm256_dpbusd_avx_epi32(h16[hf], u, xh); /* 32-bit sums here: no 16-bit step */
                l16[hf] = _mm256_dpbusd_avx_epi32(l16[hf], u, xl);
#else
                h16[hf] = _mm256_add_epi16(h16[hf], _mm256_maddubs_epi16(u, xh));
                l16[hf] = _mm256_add_epi16(l16[hf], _mm256_maddubs_epi16(u, xl));
#endif
            }
        }
        const __m256 da = _mm256_set1_ps(f->da);
        for (int hf = h0; hf < h0 + nh; hf++) {
#if QUILL_AVXVNNI
            const __m256i ch = h16[hf], cl = l16[hf];
#else
            const __m256i ch = _mm256_madd_epi16(h16[hf], ones), cl = _mm256_madd_epi16(l16[hf], ones);
#endif
            const __m256i sub = _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(ch, 8), cl),
                                                 _mm256_set1_epi32(slot_bias_sum(f, off, 16)));
            acc[hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sub), _mm256_mul_ps(_mm256_load_ps(s[hf][sl]), da), acc[hf]);
            if (has_min(type))
                acc[hf] = _mm256_fnmadd_ps(_mm256_load_ps(m[hf][sl]), _mm256_set1_ps(f->sf16[(off >> 4) & 1]), acc[hf]);
        }
    }
}

/* The unsigned codes of register g of slot sl (32 columns, or q6_K's 16) of a packed q4_K, q5_K or
 * q6_K super-block's half hf, as unpack_packed takes them apart into W->u[kb / 4 · sl + g]. */
static inline __attribute__((always_inline)) __m256i kquant_u(uint32_t type, const uint8_t *codes, int hf, int sl,
                                                               int g) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    if (type == QUILL_TYPE_Q6_K) {
        const __m256i m30 = _mm256_set1_epi8(0x30);
        const __m256i n = half_reg(codes, 5 + 3 * sl + (g & 1), hf), top = half_reg(codes, 7 + 3 * sl, hf);
        const __m256i nib = g < 2 ? _mm256_and_si256(n, low) : _mm256_and_si256(_mm256_srli_epi16(n, 4), low);
        const __m256i hi2 = g == 0 ? _mm256_slli_epi16(top, 4) : g == 1 ? _mm256_slli_epi16(top, 2)
                          : g == 2 ? top : _mm256_srli_epi16(top, 2);
        return _mm256_or_si256(nib, _mm256_and_si256(hi2, m30));
    }
    /* slot sl = 2c + hi of window c: register g < 4 of its first half-window, g >= 4 of its second */
    const int c = sl / 2, hi = sl % 2, h = g / 4, gg = g % 4;
    const int reg = half_window_reg(type, c, h);
    const __m256i v = half_reg(codes, reg + gg, hf);
    __m256i u = hi ? _mm256_and_si256(_mm256_srli_epi16(v, 4), low) : _mm256_and_si256(v, low);
    if (type == QUILL_TYPE_Q5_K) u = _mm256_or_si256(u, bit_as_16(half_reg(codes, reg + 4, hf), 2 * gg + hi));
    return u;
}

/* One token's window of a q4_K, q5_K or q6_K super-block for halves h0..h0 + nh - 1 of the tile
 * (both: each activation broadcast serves 16 rows), slot after slot,
 * the codes going from the layout to the byte products without the window's round trip through
 * memory (as lowbit_decode's); the sums and f32 steps are window_step's, in its order: the same bits.
 * One product in the caches (decode_probe 1024 x 2048): q4_K 1.17-1.25x, q5_K 1.15-1.42x, q6_K
 * 1.0-1.1x the window loop on avx2, 1.2-1.5x, 1.4x and 1.0-1.18x on avxvnni; TinyLlama q4_k_m tg64
 * on avx2 1.10x (bench/README.md). Both halves at once against one at a time: q4_K 1.03-1.09x,
 * q6_K 1.09-1.15x, q5_K 0.97-1.0x in the caches; from memory q4_K 0.633 of a plain read against
 * 0.605, q6_K 0.656 against 0.648. */
static inline __attribute__((always_inline)) void kquant_decode(uint32_t type, packed_window pw, const planes *P,
                                                                int64_t k, __m256 *acc, int h0, int nh) {
    _Alignas(32) float s[2][16][TR], m[2][16][TR];
    const planes A = token_acts_at(P, k); /* decoding only */
    superblock_scales(type, pw, h0, nh, s, m);
    const int kb = slot_width(type), n_slots = MAX_WINDOW / kb;
#if !QUILL_AVXVNNI
    const __m256i ones = _mm256_set1_epi16(1);
    const int per = sums_per_lane16(type);
#endif
#pragma GCC unroll 16
    for (int sl = 0; sl < n_slots; sl++) {
        const int off = sl * kb;
        const int8_t *codes = codes_in(A, off);
        const block_facts *f = facts_in(A, off);
        __m256i ch[2], cl[2];
        for (int hf = h0; hf < h0 + nh; hf++) ch[hf] = cl[hf] = _mm256_setzero_si256();
#if QUILL_AVXVNNI
#pragma GCC unroll 8
        for (int g = 0; g < kb / 4; g++) {
            __m256i xh, xl; /* the activation bytes of columns 4g..4g + 3 of the slot */
            act_bytes4(codes + 4 * g, &xh, &xl);
            for (int hf = h0; hf < h0 + nh; hf++) {
                const __m256i u = kquant_u(type, pw.codes, hf, sl, g);
                ch[hf] = _mm256_dpbusd_avx_epi32(ch[hf], u, xh);
                cl[hf] = _mm256_dpbusd_avx_epi32(cl[hf], u, xl);
            }
        }
#else
#pragma GCC unroll 4
        for (int g0 = 0; g0 < kb / 4; g0 += per) {
            __m256i h16[2], l16[2];
            for (int hf = h0; hf < h0 + nh; hf++) h16[hf] = l16[hf] = _mm256_setzero_si256();
#pragma GCC unroll 8
            for (int g = g0; g < g0 + per; g++) {
                __m256i xh, xl; /* the activation bytes of columns 4g..4g + 3 of the slot */
                act_bytes4(codes + 4 * g, &xh, &xl);
                for (int hf = h0; hf < h0 + nh; hf++) {
                    const __m256i u = kquant_u(type, pw.codes, hf, sl, g);
                    h16[hf] = _mm256_add_epi16(h16[hf], _mm256_maddubs_epi16(u, xh));
                    l16[hf] = _mm256_add_epi16(l16[hf], _mm256_maddubs_epi16(u, xl));
                }
            }
            for (int hf = h0; hf < h0 + nh; hf++) {
                ch[hf] = _mm256_add_epi32(ch[hf], _mm256_madd_epi16(h16[hf], ones));
                cl[hf] = _mm256_add_epi32(cl[hf], _mm256_madd_epi16(l16[hf], ones));
            }
        }
#endif
        const __m256 da = _mm256_set1_ps(f->da);
        for (int hf = h0; hf < h0 + nh; hf++) {
            const __m256i sub = _mm256_sub_epi32(_mm256_add_epi32(_mm256_slli_epi32(ch[hf], 8), cl[hf]),
                                                 _mm256_set1_epi32(slot_bias_sum(f, off, kb)));
            acc[hf] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sub), _mm256_mul_ps(_mm256_load_ps(s[hf][sl]), da), acc[hf]);
            if (has_min(type))
                acc[hf] = _mm256_fnmadd_ps(_mm256_load_ps(m[hf][sl]), _mm256_set1_ps(f->sf), acc[hf]);
        }
    }
}

/* Lines of the stream ahead of the reading position that decoding prefetches. */
#define PACKED_AHEAD 4096

/* A batch of the 32-column types over columns [k0, k1) of half hf of a tile: BATCH_BLOCKS blocks
 * unpacked at a time, then each token takes them all, so its accumulator is loaded and stored
 * once a step where the k-quants' windows of 256 columns already amortize it (one block a step:
 * q4_0 batches ran at 0.85x q4_K's rate). A token's slots still add in column order: the same bits. */
#define BATCH_BLOCKS 4
static inline __attribute__((always_inline)) void batch_blocks(uint32_t type, const tiles_job *j, int64_t tiles,
                                                               size_t tb, int64_t tile, int hf, int64_t k0,
                                                               int64_t k1, __m256 *acc) {
    _Alignas(32) __m256i u[BATCH_BLOCKS][32 / 4], u_hi[BATCH_BLOCKS][32 / 4];
    _Alignas(32) float s[BATCH_BLOCKS][2][TR], m[BATCH_BLOCKS][2][TR]; /* two slots of 16 at most */
    window W[BATCH_BLOCKS];
    for (int b = 0; b < BATCH_BLOCKS; b++) W[b] = (window){u[b], QUILL_AVXVNNI ? NULL : u_hi[b], s[b], m[b]};
    for (int64_t k = k0; k < k1; k += 32 * BATCH_BLOCKS) {
        const int nb = (k1 - k) / 32 < BATCH_BLOCKS ? (int)((k1 - k) / 32) : BATCH_BLOCKS;
        for (int b = 0; b < nb; b++)
            unpack_packed(type, locate_window(type, j->w, tiles, tb, j->cols, tile, k + 32 * b), hf, &W[b]);
        if (nb == BATCH_BLOCKS) {
            for (int t = 0; t < j->n_tok; t++) {
                const planes A = window_acts_at(j->P + t, k);
#pragma GCC unroll 4
                for (int b = 0; b < BATCH_BLOCKS; b++) window_step(type, &W[b], acts_block(A, b), &acc[t]);
            }
        } else {
            for (int t = 0; t < j->n_tok; t++)
                for (int b = 0; b < nb; b++) window_step(type, &W[b], window_acts_at(j->P + t, k + 32 * b), &acc[t]);
        }
    }
}

/* Items [i0, i1) of a packed matrix: groups of tiles (pack_group) when decoding, else tiles. */
static inline __attribute__((always_inline)) void packed_impl(const tiles_job *j, int64_t i0, int64_t i1,
                                                              uint32_t type) {
    const int width = window_width(type), group = j->n_tok == 1 ? pack_group(type) : 1;
    const int64_t tiles = (j->rows + PACK_TR - 1) / PACK_TR, n_windows = j->cols / width;
    const size_t tb = packed_tile_bytes(type, j->cols);
    _Alignas(32) __m256i u_block[32 / 4], u_hi[32 / 4], u_super[MAX_WINDOW / 4];
    _Alignas(32) float s_block[2][TR], m_block[2][TR], s_super[MAX_WINDOW / 16][TR], m_super[MAX_WINDOW / 16][TR];
    __m256i *const digits = QUILL_AVXVNNI ? NULL : u_hi;
    const window batch = width == 32 ? (window){u_block, digits, s_block, m_block} : (window){u_super, digits, s_super, m_super};
    const window decode = {batch.u, NULL, batch.s, batch.m};
    if (j->n_tok == 1) {
        for (int64_t item = i0; item < i1; item++) {
            const int64_t first = item * group, n = tiles - first < group ? tiles - first : group;
            /* the group's tiles are one range of n · tb bytes, read front to back */
            const size_t lines = (size_t)n * tb / 64, pf_lines = (lines + (size_t)n_windows - 1) / (size_t)n_windows;
            uintptr_t pf = (uintptr_t)(j->w + (size_t)first * tb) + PACKED_AHEAD;
            __m256 acc1[PACK_GROUP][2];
            for (int i = 0; i < n; i++) acc1[i][0] = acc1[i][1] = _mm256_setzero_ps();
            for (int64_t k = 0; k < j->cols; k += width, pf += 64 * pf_lines) {
                for (size_t l = 0; l < pf_lines; l++) _mm_prefetch((const char *)(pf + 64 * l), _MM_HINT_T0);
                for (int i = 0; i < n; i++) {
                    const packed_window pw = locate_window(type, j->w, tiles, tb, j->cols, first + i, k);
                    if (type == QUILL_TYPE_Q2_K || (type == QUILL_TYPE_Q3_K && QUILL_AVXVNNI)) {
                        /* a short tile's missing rows are zeros: computed, never stored */
                        lowbit_decode(type, pw, j->P, k, acc1[i], 0, 2);
                        continue;
                    }
                    if (type == QUILL_TYPE_Q3_K) {
                        /* on AVX2 one half at a time: both at once were 0.83-0.98x the window
                         * loop (the third bits' registers spill), one at a time 1.05-1.1x */
                        lowbit_decode(type, pw, j->P, k, acc1[i], 0, 1);
                        lowbit_decode(type, pw, j->P, k, acc1[i], 1, 1);
                        continue;
                    }
                    if (type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K || type == QUILL_TYPE_Q6_K) {
                        /* both halves: a short tile's missing rows are zeros, computed and never stored */
                        kquant_decode(type, pw, j->P, k, acc1[i], 0, 2);
                        continue;
                    }
                    for (int hf = 0; hf < 2; hf++) {
                        if ((first + i) * PACK_TR + hf * TR >= j->rows) break;
                        unpack_packed(type, pw, hf, &decode);
                        window_step(type, &decode, token_acts_at(j->P, k), &acc1[i][hf]);
                    }
                }
            }
            for (int i = 0; i < n; i++)
                for (int hf = 0; hf < 2; hf++) {
                    const int64_t r0 = (first + i) * PACK_TR + hf * TR;
                    if (r0 < j->rows) store_rows(j->y + r0, tile_nr(j, r0), acc1[i][hf]);
                }
        }
        return;
    }
    /* A batch: BATCH_TILES tiles at a time, chunk by chunk (batch_chunk_cols), their sums waiting
     * in accumulators of their own between chunks */
    __m256 accs[BATCH_TILES][2][PASS_TOKENS];
    const int64_t chunk = batch_chunk_cols(j->cols, j->n_tok);
    for (int64_t g0 = i0; g0 < i1; g0 += BATCH_TILES) {
        const int64_t g1 = i1 - g0 < BATCH_TILES ? i1 : g0 + BATCH_TILES;
        for (int64_t k0 = 0; k0 < j->cols; k0 += chunk) {
            const int64_t k1 = j->cols - k0 < chunk ? j->cols : k0 + chunk;
            for (int64_t tile = g0; tile < g1; tile++)
                for (int hf = 0; hf < 2; hf++) {
                    if (tile * PACK_TR + hf * TR >= j->rows) break;
                    __m256 *acc = accs[tile - g0][hf];
                    if (k0 == 0)
                        for (int t = 0; t < j->n_tok; t++) acc[t] = _mm256_setzero_ps();
                    if (width == 32) { /* BATCH_BLOCKS blocks a step (batch_blocks) */
                        batch_blocks(type, j, tiles, tb, tile, hf, k0, k1, acc);
                        continue;
                    }
                    for (int64_t k = k0; k < k1; k += width) {
                        unpack_packed(type, locate_window(type, j->w, tiles, tb, j->cols, tile, k), hf, &batch);
                        for (int t = 0; t < j->n_tok; t++) window_step(type, &batch, window_acts_at(j->P + t, k), &acc[t]);
                    }
                }
        }
        for (int64_t tile = g0; tile < g1; tile++)
            for (int hf = 0; hf < 2; hf++) {
                const int64_t r0 = tile * PACK_TR + hf * TR;
                if (r0 >= j->rows) break;
                for (int t = 0; t < j->n_tok; t++)
                    store_rows(j->y + (size_t)t * (size_t)j->rows + r0, tile_nr(j, r0), accs[tile - g0][hf][t]);
            }
    }
}

/* ---------------------------------------------------------------- entry points */

static size_t exact_scratch(int64_t cols, int n_tok) {
    const size_t planes = (size_t)(n_tok < PASS_TOKENS ? n_tok : PASS_TOKENS) * planes_bytes(cols);
    const size_t unpacked = unpacked_scratch(cols, n_tok);
    return planes > unpacked ? planes : unpacked;
}

/* ---------------------------------------------------------------- the unpacking kernels (exact_unpacked.h) */

#include "kernels/x86/unpack_simd.h"

static inline int32_t slot_dot(const int8_t *q, const int16_t *a, int width) {
    __m256i acc = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)q)),
                                    _mm256_loadu_si256((const __m256i *)a));
    if (width == 32)
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(q + 16))),
                                                      _mm256_loadu_si256((const __m256i *)(a + 16))));
    return hsum_epi32(acc);
}
/* 8 slots' sums from their 8 vectors of partial sums by one reduction (integer adds: any order is
 * exact): one product of 2048 x 2048, one token, iq2_xxs 1.3x, iq2_xs 1.1x (bench/README.md). */
static inline void slot_dots8(const int8_t *q, const int16_t *a, int width, int32_t C[8]) {
    __m256i v[8];
    for (int u = 0; u < 8; u++) {
        const int8_t *qu = q + u * width;
        const int16_t *au = a + u * width;
        v[u] = _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)qu)),
                                 _mm256_loadu_si256((const __m256i *)au));
        if (width == 32)
            v[u] = _mm256_add_epi32(v[u], _mm256_madd_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(qu + 16))),
                                                            _mm256_loadu_si256((const __m256i *)(au + 16))));
    }
    const __m256i h03 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    const __m256i h47 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    /* lane l of h03 holds slot l % 4's sum over half l / 4 of its vector */
    _mm256_storeu_si256((__m256i *)C, _mm256_add_epi32(_mm256_permute2x128_si256(h03, h47, 0x20),
                                                       _mm256_permute2x128_si256(h03, h47, 0x31)));
}
QUILL_UNPACKED_ROWS_(avx2)
#define UNPACKED_MATMUL(tsfx, ID) QUILL_UNPACKED_MATMUL_(avx2, ID)
#define INSTALL_UNPACKED(tsfx, ID) k->matmul[QUILL_TYPE_##ID] = unpacked_matmul_avx2_##ID;
QUILL_UNPACKED_EXACT_TYPES(UNPACKED_MATMUL)

typedef struct {
    uint32_t type;
    const float *x; /* the pass's first token */
    int64_t cols;
    const planes *P;
} quantize_job;

static void quantize_items(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const quantize_job *j = arg;
    for (int64_t t = t0; t < t1; t++) quantize_planes(j->type, j->x + (size_t)t * (size_t)j->cols, j->cols, &j->P[t]);
}

static void exact_matmul(uint32_t type, quill_task_fn task, bool packed, const quill_matrix *m, int n_mats, int64_t cols,
                         const float *x, int n_tok, quill_pool *pool, void *scratch) {
    planes P[PASS_TOKENS];
    tiles_job jobs[QUILL_MATMUL_MAX_MATS];
    quill_pool_task tasks[QUILL_MATMUL_MAX_MATS];
    for (int t0 = 0; t0 < n_tok; t0 += PASS_TOKENS) {
        const int nt = n_tok - t0 < PASS_TOKENS ? n_tok - t0 : PASS_TOKENS;
        planes_at(scratch, cols, nt, P);
        /* over the pool: in one thread, a batch's quantization was 2-4 % of a 2-thread product */
        const quantize_job qj = {type, x + (size_t)t0 * (size_t)cols, cols, P};
        if (nt == 1) quantize_items((void *)&qj, 0, 1, 0);
        else quill_pool_run(pool, quantize_items, (void *)&qj, nt, 1);
        for (int i = 0; i < n_mats; i++) {
            float *y = m[i].y + (size_t)t0 * (size_t)m[i].rows;
            jobs[i] = (tiles_job){m[i].w, m[i].row_bytes, m[i].rows, cols, nt, P, y};
            const int64_t tiles = (m[i].rows + PACK_TR - 1) / PACK_TR, group = nt == 1 ? pack_group(type) : 1;
            const int64_t items = packed ? (tiles + group - 1) / group : (m[i].rows + TR - 1) / TR;
            tasks[i] = (quill_pool_task){task, &jobs[i], items};
        }
        /* decoding, tiles one at a time: each thread walks its own contiguous share (threadpool.c),
         * so the tile two ahead that a window prefetches is usually this thread's own; a packed
         * batch claims BATCH_TILES tiles (8-row tiles: twice as many), which share each chunk of
         * the activations (packed_impl, tiles_impl) */
        quill_pool_run_joined(pool, tasks, n_mats, nt == 1 ? 1 : packed ? BATCH_TILES : 2 * BATCH_TILES);
    }
}

/* Each exact type of the type list: its tile task and matmul, the type a constant inside. */
#define EXACT_MATMUL(sfx, ID)                                                                        \
    static void tiles_##sfx(void *job, int64_t t0, int64_t t1, int thread) {                         \
        (void)thread;                                                                                \
        tiles_impl(job, t0, t1, QUILL_TYPE_##ID);                                                    \
    }                                                                                                \
    static void matmul_##sfx(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok, \
                             quill_pool *pool, void *scratch) {                                      \
        exact_matmul(QUILL_TYPE_##ID, tiles_##sfx, false, m, n_mats, cols, x, n_tok, pool, scratch); \
    }
QUILL_EXACT_TYPES(EXACT_MATMUL)

/* The packed types' products from the layout. */
#define PACKED_TYPES(M) VNNI16_TYPES(M) M(q4_1, Q4_1) M(q5_0, Q5_0) M(q5_1, Q5_1)
#define PACKED_MATMUL(sfx, ID)                                                                       \
    static void packed_tiles_##sfx(void *job, int64_t t0, int64_t t1, int thread) {                  \
        (void)thread;                                                                                \
        packed_impl(job, t0, t1, QUILL_TYPE_##ID);                                                   \
    }                                                                                                \
    static void matmul_packed_##sfx(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok, \
                                    quill_pool *pool, void *scratch) {                               \
        exact_matmul(QUILL_TYPE_##ID, packed_tiles_##sfx, true, m, n_mats, cols, x, n_tok, pool, scratch); \
    }
PACKED_TYPES(PACKED_MATMUL)
#define INSTALL_PACKED(sfx, ID) k->matmul_packed[QUILL_TYPE_##ID] = matmul_packed_##sfx;
/* the vnni set's layout, so that a model packed for one of these sets serves the others */
static void install_packed(quill_kernels *k) {
    k->packed_layout = "vnni16";
    k->pack_bytes = avx2_pack_bytes;
    k->pack = avx2_pack;
    PACKED_TYPES(INSTALL_PACKED)
}

#define INSTALL_MATMUL(sfx, ID) k->matmul[QUILL_TYPE_##ID] = matmul_##sfx;
#if QUILL_AVXVNNI
void quill_kernels_install_avxvnni_exact(quill_kernels *k) {
#else
void quill_kernels_install_avx2_exact(quill_kernels *k) {
#endif
    QUILL_EXACT_TYPES(INSTALL_MATMUL)
    QUILL_UNPACKED_EXACT_TYPES(INSTALL_UNPACKED)
    k->matmul_scratch = exact_scratch;
#if QUILL_AVXVNNI
    install_packed(k);
#endif
}

#if !QUILL_AVXVNNI
/* Only for the avx2 set: the avx512 set keeps the file's layout, and the amx set (a copy of it)
 * its tile products, which a packed layout would bypass. */
void quill_kernels_install_avx2_packed(quill_kernels *k) { install_packed(k); }
#endif
#endif
