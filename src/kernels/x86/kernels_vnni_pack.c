/* The vnni set's load-time layout: packing a matrix once into the order its loops read it, and
 * the decoding and batch loops over the packed copy (exact_avx512.h describes the sets). */
#include "kernels/x86/exact_avx512.h"

#if defined(__x86_64__)
#include "kernels/x86/unpack_simd.h"

#include "kernels/pack_vnni16.h"
_Static_assert(TR == PACK_TR && CW == PACK_CW, "the vnni loops read the layout's tiles and chunks");

size_t quill_vnni_pack_bytes(uint32_t type, int64_t rows, int64_t cols) {
    return packed_type(type) ? vnni16_pack_bytes(type, rows, cols) : 0;
}

void quill_vnni_pack(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                     int64_t tile0, int64_t tile1) {
    vnni16_pack(type, w, row_bytes, rows, cols, dst, tile0, tile1);
}

/* Bytes ahead of the reading position that the decoding loop prefetches: where one core reads
 * 32 GB/s (this machine kind on 2026-11-25), some 4 KiB must be in flight to cover memory's latency.
 * Measured side by side, one and two threads, against 1 KiB: q4_0 +16 % at 8 KiB (+2 % over
 * 4 KiB), q4_K +6 %, q5_K +7 %; q6_K +14 % at 4 KiB but -13 % at 8 KiB, q8_0 +2 % at 4 KiB.
 * (Into L2 16-32 KiB ahead and into L1 1-2 KiB ahead: 0-15 % slower.) q4_0 read in groups of 4
 * tiles (2026-11-26): 4 KiB non-temporal and nothing further, below. */
static inline size_t packed_ahead(uint32_t type) {
    return type == QUILL_TYPE_Q6_K || type == QUILL_TYPE_Q8_0 || type == QUILL_TYPE_Q4_0 || table_nibbles(type)
               ? 4096
               : 8192;
}
/* q4_0 and q8_0 prefetch their lines near as non-temporal (2 threads +1.4 % and +2.5 % against
 * T0, one thread even), and into L2 further ahead, PACKED_FAR: a core's misses to L1 are few (its
 * fill buffers), the line requests L2 keeps in flight many more, and the non-temporal lines do not
 * pass through L2 for its own prefetchers to follow. Shared machines' memory latency grows with the
 * other tenants' load until the near prefetches alone no longer cover it. Against the near
 * prefetch alone, `bench/ab.sh` tg128 (10 and 8 alternating rounds; A/A control 1.008x): q4_0
 * +4.1-5.4 % with 2 threads (8-10 rounds of 10 faster), +14 % with one; q8_0 +4.5 % with 2, 1 thread
 * 0.98x and 1.045x in two runs. The k-quants, whose near prefetch goes through L2, measured slower
 * with it: q4_K_M 0.93x, q6_K 0.89x (and 0.96x, 0.90x with a non-temporal near prefetch besides);
 * 64 KiB ahead, or into L2 instead of the near prefetch, was slower for every type.
 * q4_0 read in groups of 4 tiles (nibble_group) no longer gains from the L2 prefetch: its lines
 * non-temporal 4 KiB ahead and nothing else, against 8 KiB + L2 16 KiB, tg128 2 threads 1.08x
 * (7 of 8 rounds) with T0 4 KiB and 1.02x more non-temporal (7 of 8), one thread 1.07x and
 * 0.99x; non-temporal 2 KiB and 6 KiB ahead 0.98x and 0.995x against 4 KiB. */
#define PACKED_FAR 16384
static inline __attribute__((always_inline)) void prefetch_ahead(uint32_t type, const __m512i *at) {
    if (type == QUILL_TYPE_Q4_0 || table_nibbles(type)) {
        _mm_prefetch((const char *)at + packed_ahead(type), _MM_HINT_NTA);
    } else if (type == QUILL_TYPE_Q8_0) {
        _mm_prefetch((const char *)at + PACKED_FAR, _MM_HINT_T1);
        _mm_prefetch((const char *)at + packed_ahead(type), _MM_HINT_NTA);
    } else {
        _mm_prefetch((const char *)at + packed_ahead(type), _MM_HINT_T0);
    }
}

/* The f32 step of one slot, as decode_impl takes it. */
static inline __attribute__((always_inline)) __m512 slot_step(uint32_t type, __m512 acc, __m512i ch, __m512i cl,
                                                             const planes *P, int64_t slot_k, int64_t blk, __m512 sc,
                                                             const float *m) {
    const __m512i sub = _mm512_sub_epi32(_mm512_add_epi32(_mm512_slli_epi32(ch, 8), cl), _mm512_set1_epi32(P->bias_sum[slot_k]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sub), _mm512_mul_ps(sc, _mm512_set1_ps(P->da[blk])), acc);
    if (has_min(type)) /* da·Σa of the slot's 32 columns, or of its 16 (q2_K) */
        acc = _mm512_fnmadd_ps(_mm512_load_ps(m), _mm512_set1_ps(min_term(P, slot_width(type), slot_k, blk)), acc);
    return acc;
}

/* The unsigned codes of sub-block s of a packed q2_K or q3_K super-block at v: columns
 * 16s + 4g..4g + 3 to g[g], rows in lanes. */
static inline __attribute__((always_inline)) void lowbit_codes(uint32_t type, const __m512i *v, int s, __m512i g[4]) {
    const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
    const __m512i *at = type == QUILL_TYPE_Q2_K ? v + 5 + s : v + 4 + 3 * (s / 2) + s % 2;
    __m512i w = _mm512_load_si512(at);
    __asm__("" : "+v"(w)); /* one load for the four uses (see nibble_codes) */
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        g[i] = _mm512_and_si512(_mm512_srli_epi16(w, (unsigned)(2 * i)), three);
        if (type == QUILL_TYPE_Q3_K) { /* u | (third bit 4(s % 2) + i moved to bit 2): a | (b & c) */
            const __m512i third = _mm512_load_si512(v + 4 + 3 * (s / 2) + 2);
            g[i] = _mm512_ternarylogic_epi32(g[i], shift16(third, 2 - (4 * (s % 2) + i)), four, 0xF8);
        }
    }
}

/* The codes (value + code_bias) of the nibbles of the table types: mxfp4's fp4 values, a grid
 * type's levels, iq4's levels (+ 128: 1..241, unsigned bytes). vpermb reads an index's low 6 bits,
 * so the 16 values repeat 4 times and a nibble needs no masking. */
static inline __m512i nibble_table(uint32_t type) {
    const int8_t *values = nibble_levels(type);
    return _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)values)),
                           _mm512_set1_epi8((char)code_bias(type)));
}

/* The codes of packed nibble register i of 4 (q4_0, mxfp4, grid types; `table` is nibble_table()'s):
 * low nibbles to *lo, high ones to *hi. */
static inline __attribute__((always_inline)) void packed_nibbles(uint32_t type, const __m512i *v, int i, __m512i table,
                                                                 __m512i *lo, __m512i *hi) {
    if (!table_nibbles(type)) {
        nibble_codes(v, NULL, i, lo, hi);
        return;
    }
    __m512i w = _mm512_load_si512(v + i);
    __asm__("" : "+v"(w)); /* one load for both uses (see nibble_codes) */
    *lo = _mm512_permutexvar_epi8(w, table);
    *hi = _mm512_permutexvar_epi8(_mm512_srli_epi16(w, 4), table);
}

/* The 16 rows' scales of block b of a packed chunk whose scales begin at `scales` (q4_0, q8_0:
 * f16 d; mxfp4: the E8M0 byte e as quill_e8m0_half_to_float reads it, 2^(e - 128): the bits
 * (e - 1) << 23, or for e < 2 the subnormal 2^21 << e); a grid type's of slot b. */
static inline __attribute__((always_inline)) __m512 packed_scales(uint32_t type, const uint8_t *scales, int64_t b) {
    if (grid_nibbles(type)) { /* sc the slot's nibble of the row's scale words; the unpacker's steps */
        const __m512i words = _mm512_load_si512((const __m512i *)(scales + 64 * (b / 8)));
        const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(words, (unsigned)(4 * (b % 8))), _mm512_set1_epi32(0xF));
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(scales + grid_d_at(type))));
        if (type == QUILL_TYPE_IQ3_S) /* d · (1 + 2 sc) */
            return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(sc, 1), _mm512_set1_epi32(1))));
        if (type == QUILL_TYPE_IQ1_S || type == QUILL_TYPE_IQ1_M) /* d · (2 sc + 1) · 0.125 */
            return _mm512_mul_ps(_mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(sc, 1),
                                                                                      _mm512_set1_epi32(1)))),
                                 _mm512_set1_ps(0.125f));
        /* iq3_xxs: d · (0.5 + sc) · 0.5; the iq2 types: d · (0.5 + sc) · 0.25 */
        const __m512 half = _mm512_set1_ps(0.5f), last = _mm512_set1_ps(type == QUILL_TYPE_IQ3_XXS ? 0.5f : 0.25f);
        return _mm512_mul_ps(_mm512_mul_ps(d, _mm512_add_ps(half, _mm512_cvtepi32_ps(sc))), last);
    }
    if (type == QUILL_TYPE_IQ4_XS) { /* d · (ls - 32), as the unpacker */
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)scales));
        const __m512i ls = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(scales + 64 + 16 * b)));
        return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_sub_epi32(ls, _mm512_set1_epi32(32))));
    }
    if (type != QUILL_TYPE_MXFP4)
        return _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(scales + (size_t)b * block_scale_bytes(type))));
    const __m512i e = _mm512_cvtepu8_epi32(_mm_load_si128((const __m128i *)(scales + (size_t)b * 16)));
    const __m512i one = _mm512_set1_epi32(1);
    const __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, one), 23);
    const __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    return _mm512_castsi512_ps(_mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2)), normal, tiny));
}

/* q4_0's decoding of one group of n (1..PACK_GROUP) tiles: each activation word broadcast serves
 * the n tiles. One tile at a time, a block's 16 broadcasts and 4 code loads (8 as gcc compiled
 * them) outnumbered its 16 vpdpbusd on a machine that issues two vector loads and two vpdpbusd
 * per cycle: 17-19 cycles per tile and block where the products take 8. Grouped, tg128 1.06x
 * with one thread, 1.00-1.01x with two (bench/README.md, seventeenth session). mxfp4 the same, its
 * nibbles through its table. */
static inline __attribute__((always_inline)) void nibble_group(const decode_job *j, int64_t group, const int n,
                                                               const uint32_t type) {
    const __m512i table = nibble_table(type);
    const uint8_t *base = j->w + (size_t)group * PACK_GROUP * packed_tile_bytes(type, j->cols);
    const planes *P = j->P;
    const __m512i z = _mm512_setzero_si512();
    __m512 acc[PACK_GROUP];
#pragma GCC unroll 4
    for (int t = 0; t < n; t++) acc[t] = _mm512_setzero_ps();
    for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
        const int64_t blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
        const size_t scale_bytes = chunk_scale_bytes(type, blocks);
        const uint8_t *chunk = base + (size_t)n * packed_chunk_at(type, k0);
        /* every line read is prefetched once, ahead: the scales' with the chunk's first block */
        for (size_t at = 0; at < (size_t)n * scale_bytes; at += 64) prefetch_ahead(type, (const __m512i *)(chunk + at));
        /* the chunk's scales first, all of them, so that the group is read front to back (a scale
         * per block, between the blocks' codes, went back to the chunk's front each time: tg
         * 1.034x with 2 threads, 1.054x with one) */
        _Alignas(64) float sbuf[PACK_GROUP][CW / 16][TR];
        const int64_t slots = blocks * 32 / slot_width(type);
#pragma GCC unroll 4
        for (int t = 0; t < n; t++)
            for (int64_t sl = 0; sl < slots; sl++) _mm512_store_ps(sbuf[t][sl], packed_scales(type, chunk + t * scale_bytes, sl));
        const __m512i *codes = (const __m512i *)(chunk + (size_t)n * scale_bytes);
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t blk = k0 / 32 + b;
            const int8_t *h = P->h + blk * 32, *l = P->l + blk * 32;
            const __m512i *v = codes + 4 * n * b;
#pragma GCC unroll 16
            for (int i = 0; i < 4 * n; i++) prefetch_ahead(type, v + i);
            __m512i lo_h[PACK_GROUP], hi_h[PACK_GROUP], lo_l[PACK_GROUP], hi_l[PACK_GROUP];
#pragma GCC unroll 4
            for (int t = 0; t < n; t++) lo_h[t] = hi_h[t] = lo_l[t] = hi_l[t] = z;
            /* the block's activation words by 4 loads and 16 shuffles instead of 16 broadcast
             * loads: in cache 0.95x, but from memory one core read 0.95 of a plain read's speed
             * against 0.89 (medians; fewer loads beside the codes' and the prefetches, which
             * share the core's load pipes); tg128 1.02-1.10x with 1 and 2 threads. q8_0 and q6_K
             * gained nothing from the same (bench/README.md, eighteenth session). */
            const __m512i h_lo4 = quad_of(h), h_hi4 = quad_of(h + 16), l_lo4 = quad_of(l), l_hi4 = quad_of(l + 16);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) {
                const __m512i h_lo = dword_of(h_lo4, i), h_hi = dword_of(h_hi4, i);
                const __m512i l_lo = dword_of(l_lo4, i), l_hi = dword_of(l_hi4, i);
#pragma GCC unroll 4
                for (int t = 0; t < n; t++) {
                    __m512i lo, hi;
                    packed_nibbles(type, v + 4 * t, i, table, &lo, &hi);
                    lo_h[t] = _mm512_dpbusd_epi32(lo_h[t], lo, h_lo);
                    hi_h[t] = _mm512_dpbusd_epi32(hi_h[t], hi, h_hi);
                    lo_l[t] = _mm512_dpbusd_epi32(lo_l[t], lo, l_lo);
                    hi_l[t] = _mm512_dpbusd_epi32(hi_l[t], hi, l_hi);
                }
            }
            if (slot_width(type) == 16) { /* the low nibbles are the block's first 16 columns */
#pragma GCC unroll 4
                for (int t = 0; t < n; t++) {
                    acc[t] = slot_step(type, acc[t], lo_h[t], lo_l[t], P, 2 * blk, blk, _mm512_load_ps(sbuf[t][2 * b]), NULL);
                    acc[t] = slot_step(type, acc[t], hi_h[t], hi_l[t], P, 2 * blk + 1, blk, _mm512_load_ps(sbuf[t][2 * b + 1]),
                                       NULL);
                }
                continue;
            }
#pragma GCC unroll 4
            for (int t = 0; t < n; t++)
                acc[t] = slot_step(type, acc[t], _mm512_add_epi32(lo_h[t], hi_h[t]), _mm512_add_epi32(lo_l[t], hi_l[t]), P,
                                   blk, blk, _mm512_load_ps(sbuf[t][b]), NULL);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < n; t++) {
        const int64_t r0 = (group * PACK_GROUP + t) * TR;
        const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
        _Alignas(64) float out[TR];
        _mm512_store_ps(out, acc[t]);
        for (int r = 0; r < nr; r++) j->y[r0 + r] = out[r];
    }
}

/* The sums of tokens [t0, t0 + n) against one tile's block (its codes unpacked in lo, hi), whose
 * scales are sc (per slot: sc[0] and, with slots of 16, sc[1] for the high nibbles' columns). */
static inline __attribute__((always_inline)) void few_tokens(const planes *P, int64_t blk, const __m512i lo[4],
                                                             const __m512i hi[4], const __m512 sc[2], bool halves,
                                                             float (*acc)[TR], int t0, const int n) {
    const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int t = t0; t < t0 + n; t++) {
        const int8_t *h = P[t].h + blk * 32, *l = P[t].l + blk * 32;
        /* with few tokens two chains per plane, so that enough products are in flight; slots of
         * 16 keep the halves apart */
        __m512i sh[2] = {z, z}, sl[2] = {z, z};
        const int c = n < 4 || halves;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            sh[0] = dpbusd_bcast(sh[0], lo[q], h + 4 * q);
            sh[c] = dpbusd_bcast(sh[c], hi[q], h + 16 + 4 * q);
            sl[0] = dpbusd_bcast(sl[0], lo[q], l + 4 * q);
            sl[c] = dpbusd_bcast(sl[c], hi[q], l + 16 + 4 * q);
        }
        /* (q4_0's f32 step is mxfp4's: neither has minimums, and the bias comes with the planes) */
        if (halves) {
            const __m512 a = slot_step(QUILL_TYPE_Q4_0, _mm512_load_ps(acc[t]), sh[0], sl[0], &P[t], 2 * blk, blk, sc[0], NULL);
            _mm512_store_ps(acc[t], slot_step(QUILL_TYPE_Q4_0, a, sh[1], sl[1], &P[t], 2 * blk + 1, blk, sc[1], NULL));
            continue;
        }
        _mm512_store_ps(acc[t], slot_step(QUILL_TYPE_Q4_0, _mm512_load_ps(acc[t]), _mm512_add_epi32(sh[0], sh[1]),
                                          _mm512_add_epi32(sl[0], sl[1]), &P[t], blk, blk, sc[0], NULL));
    }
    __asm__ volatile("" ::: "memory"); /* one block of tokens at a time: gcc interleaved 8 and spilled */
}

/* q4_0's decoding of a few tokens (the streams of a server's step): nibble_group with each block's
 * codes loaded and unpacked once for all n_tok tokens, and the group read front to back with the
 * same prefetches as for one token. The batch loop (gemm_packed_impl) unpacks a chunk into L1 and
 * fetches the next chunk's lines just before using them: at 4 tokens a third of its samples sat on
 * those loads. Each token's f32 steps are slot_step's, in the same order: the same bits.
 * Against the batch loop, tokens per CPU second of quill_batched, one thread, TinyLlama-shaped
 * q4_0, 2 alternating rounds each (a loaded machine: wall times meant little): 2 tokens
 * 1.27-1.41x, 4 tokens 1.09-1.14x, 6 tokens 1.29-1.32x, 8 tokens 1.20-1.26x, 12 tokens
 * 1.10-1.13x, and 16 tokens 1.07-1.10x against the word products. The tokens go 4 at a time
 * (few_tokens): all 8 unrolled together, gcc spilled their operands and 8 tokens ran 0.9x. */
#define FEW_TOKENS 16
static inline __attribute__((always_inline)) void nibble_group_few(const decode_job *j, int64_t group, const int n,
                                                                   const int n_tok, const uint32_t type) {
    const __m512i table = nibble_table(type);
    const uint8_t *base = j->w + (size_t)group * PACK_GROUP * packed_tile_bytes(type, j->cols);
    const planes *P = j->P;
    _Alignas(64) float acc[PACK_GROUP][FEW_TOKENS][TR];
    for (int i = 0; i < n; i++)
        for (int t = 0; t < n_tok; t++) _mm512_store_ps(acc[i][t], _mm512_setzero_ps());
    for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
        const int64_t blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
        const size_t scale_bytes = chunk_scale_bytes(type, blocks);
        const uint8_t *chunk = base + (size_t)n * packed_chunk_at(type, k0);
        /* (mxfp4 prefetches as q4_0 does: a constant, so that no test of the type is left) */
        for (size_t at = 0; at < (size_t)n * scale_bytes; at += 64)
            prefetch_ahead(QUILL_TYPE_Q4_0, (const __m512i *)(chunk + at));
        const __m512i *codes = (const __m512i *)(chunk + (size_t)n * scale_bytes);
        for (int64_t b = 0; b < blocks; b++) {
            const int64_t blk = k0 / 32 + b;
            const __m512i *v = codes + 4 * n * b;
#pragma GCC unroll 16
            for (int i = 0; i < 4 * n; i++) prefetch_ahead(QUILL_TYPE_Q4_0, v + i);
#pragma GCC unroll 1
            for (int i = 0; i < n; i++) {
                __m512i lo[4], hi[4];
#pragma GCC unroll 4
                for (int q = 0; q < 4; q++) packed_nibbles(type, v + 4 * i, q, table, &lo[q], &hi[q]);
                const bool halves = slot_width(type) == 16;
                const __m512 sc[2] = {packed_scales(type, chunk + i * scale_bytes, halves ? 2 * b : b),
                                      halves ? packed_scales(type, chunk + i * scale_bytes, 2 * b + 1) : _mm512_setzero_ps()};
#define FEW_BLOCK(t0) if (n_tok > t0) few_tokens(P, blk, lo, hi, sc, halves, acc[i], t0, n_tok - t0 < 4 ? n_tok - t0 : 4);
                FEW_BLOCK(0) FEW_BLOCK(4) FEW_BLOCK(8) FEW_BLOCK(12)
#undef FEW_BLOCK
            }
        }
    }
    for (int i = 0; i < n; i++) {
        const int64_t r0 = (group * PACK_GROUP + i) * TR;
        const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
        const __mmask16 mask = (__mmask16)((1u << nr) - 1);
        for (int t = 0; t < n_tok; t++)
            _mm512_mask_storeu_ps(j->y + (size_t)t * (size_t)j->rows + r0, mask, _mm512_load_ps(acc[i][t]));
    }
}

/* Groups [t0, t1) of a packed q4_0, mxfp4 or a grid type matrix for 2..FEW_TOKENS tokens; each count a copy of
 * its own, so that the token loop unrolls. */
static inline __attribute__((always_inline)) void few_group(const decode_job *j, int64_t g, const int n_tok,
                                                            const uint32_t type) {
    const int64_t left = (j->rows + TR - 1) / TR - g * PACK_GROUP;
    /* the tiles go one at a time: their count need not be a constant (a copy per count and
     * token count made the file's compile several times longer) */
    nibble_group_few(j, g, left < PACK_GROUP ? (int)left : PACK_GROUP, n_tok, type);
}
static void few_packed(void *arg, int64_t t0, int64_t t1, int thread) {
    (void)thread;
    const decode_job *j = arg;
    /* q4_0, mxfp4 or a grid type, read here rather than a constant: a copy of the 15 token counts per type
     * doubled the file's compile (clang with the sanitizers: minutes), for a branch per block and
     * tile that the loop does not feel beside its tokens' products */
    const uint32_t type = j->type;
    for (int64_t g = t0; g < t1; g++) switch (j->n_tok) {
        case 2: few_group(j, g, 2, type); break;
        case 3: few_group(j, g, 3, type); break;
        case 4: few_group(j, g, 4, type); break;
        case 5: few_group(j, g, 5, type); break;
        case 6: few_group(j, g, 6, type); break;
        case 7: few_group(j, g, 7, type); break;
        case 8: few_group(j, g, 8, type); break;
        case 9: few_group(j, g, 9, type); break;
        case 10: few_group(j, g, 10, type); break;
        case 11: few_group(j, g, 11, type); break;
        case 12: few_group(j, g, 12, type); break;
        case 13: few_group(j, g, 13, type); break;
        case 14: few_group(j, g, 14, type); break;
        case 15: few_group(j, g, 15, type); break;
        case 16: few_group(j, g, 16, type); break;
        default: break;
        }
}

/* Tiles [t0, t1) of the matrix; for q4_0, mxfp4 and the grid types groups [t0, t1) instead (nibble_group). */
static inline __attribute__((always_inline)) void decode_packed_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                                     uint32_t type) {
    if (!packed_type(type)) return; /* never called: TYPED_TASKS instantiates every type */
    if (pack_group(type) > 1) {
        const int64_t tiles = (j->rows + TR - 1) / TR;
        for (int64_t g = t0; g < t1; g++) {
            const int64_t left = tiles - g * PACK_GROUP;
            if (left >= 4) nibble_group(j, g, 4, type);
            else if (left == 3) nibble_group(j, g, 3, type);
            else if (left == 2) nibble_group(j, g, 2, type);
            else nibble_group(j, g, 1, type);
        }
        return;
    }
    const size_t tb = packed_tile_bytes(type, j->cols);
    const planes *P = j->P;
    for (int64_t tile = t0; tile < t1; tile++) {
        const uint8_t *base = j->w + (size_t)tile * tb;
        const int64_t r0 = tile * TR;
        const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
        __m512 acc = _mm512_setzero_ps();
        if (lowbit_type(type)) {
            for (int64_t sb = 0; sb < j->cols / 256; sb++) {
                const __m512i *v = (const __m512i *)(base + (size_t)sb * (size_t)kblock_regs(type) * 64);
                const __m512i z = _mm512_setzero_si512();
                for (int i = 0; i < lowbit_head(type); i++) prefetch_ahead(type, v + i);
                const __m512i hw[4] = {_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
                                       _mm512_load_si512(v + 3)};
                _Alignas(64) float s[16][TR], m[16][TR];
                lowbit_scales(type, hw, type == QUILL_TYPE_Q2_K ? _mm512_load_si512(v + 4) : z, s, m);
                const __m512i *codes = v + lowbit_head(type);
                for (int sl = 0; sl < 16; sl++) {
                    if (type == QUILL_TYPE_Q2_K) prefetch_ahead(type, codes + sl);
                    else if (sl % 2 == 0)
                        for (int i = 0; i < 3; i++) prefetch_ahead(type, codes + 3 * (sl / 2) + i);
                    const int64_t k = sb * 256 + 16 * sl;
                    __m512i g[4], h[2] = {z, z}, l[2] = {z, z};
                    lowbit_codes(type, v, sl, g);
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) {
                        h[q & 1] = _mm512_dpbusd_epi32(h[q & 1], g[q], bcast4(P->h + k + 4 * q));
                        l[q & 1] = _mm512_dpbusd_epi32(l[q & 1], g[q], bcast4(P->l + k + 4 * q));
                    }
                    acc = slot_step(type, acc, _mm512_add_epi32(h[0], h[1]), _mm512_add_epi32(l[0], l[1]), P, k / 16,
                                    k / 32, _mm512_load_ps(s[sl]), m[sl]);
                }
            }
        } else if (type == QUILL_TYPE_Q6_K) {
            for (int64_t sb = 0; sb < j->cols / 256; sb++) {
                const __m512i *v = (const __m512i *)(base + (size_t)sb * (size_t)kblock_regs(type) * 64);
                const __m512i z = _mm512_setzero_si512();
                __m512i hw[5];
                for (int i = 0; i < 5; i++) hw[i] = _mm512_load_si512(v + i);
                _Alignas(64) float s[16][TR];
                kquant_scales(type, hw, s, NULL);
                for (int sl = 0; sl < 16; sl++) {
                    const __m512i *sv = v + 5 + 3 * sl;
                    for (int i = 0; i < 3; i++) prefetch_ahead(type, sv + i);
                    const int64_t k = sb * 256 + 16 * sl;
                    __m512i g[4], h[2] = {z, z}, l[2] = {z, z};
                    q6_codes(sv, g);
#pragma GCC unroll 4
                    for (int q = 0; q < 4; q++) {
                        h[q & 1] = _mm512_dpbusd_epi32(h[q & 1], g[q], bcast4(P->h + k + 4 * q));
                        l[q & 1] = _mm512_dpbusd_epi32(l[q & 1], g[q], bcast4(P->l + k + 4 * q));
                    }
                    acc = slot_step(type, acc, _mm512_add_epi32(h[0], h[1]), _mm512_add_epi32(l[0], l[1]), P, k / 16,
                                    k / 32, _mm512_load_ps(s[sl]), NULL);
                }
            }
        } else if (kblock_type(type)) {
            for (int64_t sb = 0; sb < j->cols / 256; sb++) {
                const __m512i *v = (const __m512i *)(base + (size_t)sb * (size_t)kblock_regs(type) * 64);
                const __m512i z = _mm512_setzero_si512();
                __m512i hw[5] = {_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
                                 _mm512_load_si512(v + 3), z};
                _Alignas(64) float s[8][TR], m[8][TR];
                kquant_scales(type, hw, s, m);
                for (int c = 0; c < 4; c++) {
                    const __m512i *cv = v + half_window_reg(type, c, 0), *cv1 = v + half_window_reg(type, c, 1);
                    for (int i = 0; i < kblock_regs(type) / 4 - 1; i++)
                        prefetch_ahead(type, cv + i);
                    const int64_t k = sb * 256 + 64 * c;
                    const bool q5 = type == QUILL_TYPE_Q5_K;
                    __m512i lo_h = z, hi_h = z, lo_l = z, hi_l = z;
                    nibble_sums(cv, q5 ? cv + 4 : NULL, P, k, 32, &lo_h, &hi_h, &lo_l, &hi_l);
                    nibble_sums(cv1, q5 ? cv1 + 4 : NULL, P, k + 16, 32, &lo_h, &hi_h, &lo_l, &hi_l);
                    acc = slot_step(type, acc, lo_h, lo_l, P, k / 32, k / 32, _mm512_load_ps(s[2 * c]), m[2 * c]);
                    acc = slot_step(type, acc, hi_h, hi_l, P, k / 32 + 1, k / 32 + 1, _mm512_load_ps(s[2 * c + 1]),
                                    m[2 * c + 1]);
                }
            }
        } else {
            const int regs = packed_regs(type);
            for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
                const int64_t chunk_blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
                const uint8_t *chunk = base + packed_chunk_at(type, k0);
                const __m512i *codes = (const __m512i *)(chunk + chunk_scale_bytes(type, chunk_blocks));
                /* every line read is prefetched once, ahead: the scales' with the chunk's first block */
                for (size_t at = 0; at < chunk_scale_bytes(type, chunk_blocks); at += 64)
                    prefetch_ahead(type, (const __m512i *)(chunk + at));
                /* (a scale per block: all the chunk's scales first, as q4_0 takes them, measured
                 * 0.94-0.98x for q8_0's twice as many codes per scale) */
                for (int64_t b = 0; b < chunk_blocks; b++) {
                    const int64_t blk = k0 / 32 + b;
                    const __m512i *v = codes + b * regs;
                    for (int i = 0; i < regs; i++) prefetch_ahead(type, v + i);
                    const __m512 sc = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(chunk + b * 32)));
                    const __m512i z = _mm512_setzero_si512();
                    /* two chains per plane, so that each vpdpbusd waits on one two back */
                    __m512i h[2] = {z, z}, l[2] = {z, z};
#pragma GCC unroll 8
                    for (int i = 0; i < 8; i++) {
                        const __m512i w = _mm512_load_si512(v + i);
                        h[i & 1] = dpbusd_bcast(h[i & 1], w, P->h + blk * 32 + 4 * i);
                        l[i & 1] = dpbusd_bcast(l[i & 1], w, P->l + blk * 32 + 4 * i);
                    }
                    acc = slot_step(type, acc, _mm512_add_epi32(h[0], h[1]), _mm512_add_epi32(l[0], l[1]), P, blk, blk,
                                    sc, NULL);
                }
            }
        }
        _Alignas(64) float out[TR];
        _mm512_store_ps(out, acc);
        for (int r = 0; r < nr; r++) j->y[r0 + r] = out[r];
    }
}

/* In asm: gcc drops a loop of nothing but _mm_prefetch (no side effects, so dead code). */
static inline void prefetch_bytes(const uint8_t *p, size_t n) {
    for (size_t at = 0; at < n; at += 64) __asm__ volatile("prefetcht0 %0" : : "m"(p[at]));
}

/* Prefetches the bytes of packed tile `tile` that the chunk from column k0 reads. */
static inline __attribute__((always_inline)) void prefetch_chunk(uint32_t type, const decode_job *j, size_t tile_bytes,
                                                                 int64_t tile, int64_t k0) {
    const int64_t tiles = (j->rows + TR - 1) / TR;
    if (tile >= tiles) return;
    if (kblock_type(type)) {
        prefetch_bytes(j->w + (size_t)tile * tile_bytes + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64,
                       (size_t)kblock_regs(type) * 64);
        return;
    }
    const int64_t blocks = (j->cols - k0 < CW ? j->cols - k0 : CW) / 32;
    const packed_place pl = place_chunk(type, tiles, tile_bytes, tile, k0);
    prefetch_bytes(j->w + place_scales(type, pl, blocks), chunk_scale_bytes(type, blocks));
    for (int64_t b = 0; b < blocks; b++)
        prefetch_bytes(j->w + place_codes(type, pl, blocks, b), (size_t)packed_regs(type) * 64);
}

/* The batch loop over packed tiles: each chunk's codes go to wbuf by masks and shifts (q8_0's are
 * already wbuf: no copy), its scales by one conversion per block. */
static inline __attribute__((always_inline)) void gemm_packed_impl(const decode_job *j, int64_t t0, int64_t t1,
                                                                   uint32_t type) {
    if (!packed_type(type)) return; /* never called: TYPED_TASKS instantiates every type */
    const size_t tb = packed_tile_bytes(type, j->cols);
    _Alignas(64) __m512i wbuf[CW / 4], wbuf16[CW / 2];
    _Alignas(64) float sbuf[CW / 16][TR], mbuf[CW / 16][TR];
    _Alignas(64) float tile_acc[VNNI_TOKENS + TBW][TR];
    const __m512i table = nibble_table(type);
    /* q4_0's groups interleave their tiles chunk by chunk: with few tokens (batched decoding) the
     * loop takes a group's tiles chunk by chunk as well, so that it reads the group front to back
     * once; tile by tile it went through each group four times, a quarter of it each time (4
     * sequences 0.93x). Many tokens need one tile's sums at a time (tile_acc). */
    const bool by_group = pack_group(type) > 1 && j->n_tok <= TBW;
    _Alignas(64) float group_acc[PACK_GROUP][2 * TBW][TR];
    const int64_t tiles = (j->rows + TR - 1) / TR;
    for (int64_t first = t0; first < t1;) {
        int64_t past = first + 1;
        if (by_group) {
            past = (first / PACK_GROUP + 1) * PACK_GROUP;
            if (past > t1) past = t1;
        }
        for (int64_t tile = first; tile < past; tile++)
            memset(by_group ? group_acc[tile - first] : tile_acc, 0, (size_t)(j->n_tok + TBW) * sizeof tile_acc[0]);
        for (int64_t k0 = 0; k0 < j->cols; k0 += CW) {
            for (int64_t tile = first; tile < past; tile++) {
                const uint8_t *base = j->w + (size_t)tile * tb;
                float(*accbuf)[TR] = by_group ? group_acc[tile - first] : tile_acc;
                const int cw = j->cols - k0 < CW ? (int)(j->cols - k0) : CW;
                const __m512i *w = wbuf;
                if (lowbit_type(type)) {
                    const __m512i *v = (const __m512i *)(base + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64);
                    const __m512i hw[4] = {_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
                                           _mm512_load_si512(v + 3)};
                    lowbit_scales(type, hw, type == QUILL_TYPE_Q2_K ? _mm512_load_si512(v + 4) : _mm512_setzero_si512(),
                                  sbuf, mbuf);
                    for (int sl = 0; sl < 16; sl++) lowbit_codes(type, v, sl, wbuf + 4 * sl);
                } else if (type == QUILL_TYPE_Q6_K) {
                    const __m512i *v = (const __m512i *)(base + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64);
                    __m512i hw[5];
                    for (int i = 0; i < 5; i++) hw[i] = _mm512_load_si512(v + i);
                    kquant_scales(type, hw, sbuf, NULL);
                    for (int sl = 0; sl < 16; sl++) q6_codes(v + 5 + 3 * sl, wbuf + 4 * sl);
                } else if (kblock_type(type)) {
                    const __m512i *v = (const __m512i *)(base + (size_t)(k0 / 256) * (size_t)kblock_regs(type) * 64);
                    __m512i hw[5] = {_mm512_load_si512(v), _mm512_load_si512(v + 1), _mm512_load_si512(v + 2),
                                     _mm512_load_si512(v + 3), _mm512_setzero_si512()};
                    kquant_scales(type, hw, sbuf, mbuf);
                    /* window c: slot 2c's columns (the low nibbles) are wbuf[16c..16c+7], 2c + 1's next */
                    for (int c = 0; c < 4; c++)
                        for (int h = 0; h < 2; h++) {
                            const __m512i *hv = v + half_window_reg(type, c, h);
                            for (int i = 0; i < 4; i++)
                                nibble_codes(hv, type == QUILL_TYPE_Q5_K ? hv + 4 : NULL, i, &wbuf[16 * c + 4 * h + i],
                                             &wbuf[16 * c + 8 + 4 * h + i]);
                        }
                } else {
                    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                    const uint8_t *scales = j->w + place_scales(type, pl, cw / 32);
                    for (int sl = 0; sl < cw / slot_width(type); sl++) _mm512_store_ps(sbuf[sl], packed_scales(type, scales, sl));
                    if (type == QUILL_TYPE_Q8_0) { /* groups of one: the chunk's blocks are contiguous */
                        w = (const __m512i *)(j->w + place_codes(type, pl, cw / 32, 0));
                    } else {
                        for (int b = 0; b < cw / 32; b++) {
                            const __m512i *v = (const __m512i *)(j->w + place_codes(type, pl, cw / 32, b));
                            for (int i = 0; i < 4; i++) packed_nibbles(type, v, i, table, &wbuf[8 * b + i], &wbuf[8 * b + 4 + i]);
                        }
                    }
                }
                /* the next chunk's bytes meanwhile: its loads came cold from memory and stalled the
                 * unpacking above (a tenth of a one-thread prompt's samples in this function) */
                if (k0 + CW < j->cols) prefetch_chunk(type, j, tb, tile, k0 + CW);
                else prefetch_chunk(type, j, tb, tile + 1, 0);
                gemm_chunk_any(j, type, k0, cw, w, wbuf16, sbuf, mbuf, accbuf);
            }
        }
        for (int64_t tile = first; tile < past; tile++) {
            const float(*accbuf)[TR] = by_group ? group_acc[tile - first] : tile_acc;
            const int64_t r0 = tile * TR;
            const int nr = j->rows - r0 < TR ? (int)(j->rows - r0) : TR;
            const __mmask16 mask = (__mmask16)((1u << nr) - 1);
            for (int t = 0; t < j->n_tok; t++)
                _mm512_mask_storeu_ps(j->y + (size_t)t * (size_t)j->rows + r0, mask, _mm512_load_ps(accbuf[t]));
        }
        first = past;
    }
}

TYPED_TASKS(decode_packed, DECODE_PACKED_TASK, DECODE_PACKED_CASE)
TYPED_TASKS(gemm_packed, GEMM_PACKED_TASK, GEMM_PACKED_CASE)
/* The packed types beyond the specialised kernels' (QUILL_EXACT_TYPES): the unpacking kernels'
 * types, which the vnni set also runs in loops of its own (pack_vnni16.h's list). */
#define MORE_PACKED_TYPES(M) VNNI16_UNPACKED_TYPES(M)
#define MORE_TASKS(sfx, ID) DECODE_PACKED_TASK(sfx, ID) GEMM_PACKED_TASK(sfx, ID)
MORE_PACKED_TYPES(MORE_TASKS)

size_t quill_vnni_packed_tile_bytes(uint32_t type, int64_t cols) { return packed_tile_bytes(type, cols); }
int quill_vnni_pack_group(uint32_t type) { return pack_group(type); }
quill_task_fn quill_vnni_decode_packed_fn(uint32_t type) {
    switch (type) {
    MORE_PACKED_TYPES(DECODE_PACKED_CASE)
    default: return decode_packed_fn(type);
    }
}
quill_task_fn quill_vnni_gemm_packed_fn(uint32_t type) {
    switch (type) {
    MORE_PACKED_TYPES(GEMM_PACKED_CASE)
    default: return gemm_packed_fn(type);
    }
}
quill_task_fn quill_vnni_few_packed_fn(uint32_t type, int n_tok) {
    if (n_tok < 2 || n_tok > FEW_TOKENS) return NULL;
    return type == QUILL_TYPE_Q4_0 || table_nibbles(type) ? few_packed : NULL;
}
#endif
