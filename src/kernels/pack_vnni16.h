/* The "vnni16" load-time layout (kernels.h: packed_layout): how a matrix is copied, once, into the
 * order the exact products' loops read it. The vnni set (kernels_vnni_pack.c) and the avx2 and
 * avxvnni sets (kernels_avx2_exact.c, which read a 16-row tile as two halves of 8 rows) share it,
 * and so do the aarch64 sets (arm/packed_neon.h), for which a 64-byte register of the layout is
 * four NEON registers of 4 rows each: per 4 columns, row r's 4 bytes in 32-bit lane r % 4, sdot's
 * operand against 4 activation bytes chosen by lane. Each includes this file, so that the packing
 * is compiled for its own instruction set (the CPU that packs may lack AVX-512). On x86-64 the grid
 * types' packing takes unpack_simd.h's vector unpackers; elsewhere their plain ones. */
#ifndef QUILL_PACK_VNNI16_H
#define QUILL_PACK_VNNI16_H

#include "kernels/kernels.h"
#include "kernels/kernels_exact.h"
#if defined(__x86_64__)
#include "kernels/x86/unpack_simd.h"
#else
static inline quill_exact_unpack_fn unpack_fast(uint32_t type) {
    (void)type;
    return NULL;
}
#endif

#include <stddef.h>

#define PACK_TR 16  /* rows per tile (QUILL_PACK_ROWS) */
#define PACK_CW 256 /* columns per chunk of the 32-column blocks' layout */
_Static_assert(PACK_TR == QUILL_PACK_ROWS, "a tile of the layout is QUILL_PACK_ROWS rows");
/* q3_K: the 16 bytes that end a block, its 12 scale bytes and d */
#ifndef Q3_K_SCALE_WINDOW
#define Q3_K_SCALE_WINDOW (offsetof(block_q3_K, d) + 2 - 16)
#endif

/* ---------------------------------------------------------------- the load-time layout
 *
 * q4_0, q8_0 and the k-quants' matrices are copied once, at load, into the order the vnni loops read them
 * (the reference implementation likewise repacks q4_0 and q4_K into interleaved rows on x86). From
 * the file's rows a tile of 16 rows is 16 strided streams, each read 18 or 34 bytes at a time,
 * with the scales among the codes: the decoding loop spent most of its time waiting on those
 * loads (bench/README.md), and it gathered the scales and shuffled every 16 bytes of 4 rows into
 * place. Packed, each tile (q4_0: each group of 4 tiles) is one contiguous range read front to
 * back, so a thread's share of a matrix is one stream, and the codes are already in the vpdpbusd
 * operand layout that words16 and the gemm's unpacking built at every use: per 4 columns, the 16
 * rows' 4 code bytes, row r in 32-bit lane r. Nothing of the arithmetic changes (the same integer
 * sums, the same f32 steps in the same order), so results are those of the unpacked loops bit for
 * bit.
 *   q8_0: per chunk of 256 columns (PACK_CW, 8 blocks; fewer in a last chunk), the chunk's scales
 *         first, per block of 32 columns the 16 rows' d (f16), padded to 64 bytes; then per block
 *         8 registers of unsigned codes q + 128, register i holding columns 4i..4i+3.
 *   q4_0: per chunk, the same scales; then per block 4 registers of the file's nibble bytes
 *         4i..4i+3 of each row (low nibbles: columns 4i..4i+3, high nibbles: 16 + 4i..16 + 4i + 3).
 *         (All the tile's scales before all its codes made two streams of a tile, which the
 *         hardware prefetcher followed at about half the rate of one: bench/README.md.)
 *   mxfp4: as q4_0 (groups of 4 tiles, 4 registers of the file's nibble bytes per block), but a
 *         block's scales are the 16 rows' E8M0 exponent bytes (16 bytes; the chunk's padded to 64),
 *         which no f16 holds; the loops turn nibbles into codes fp4 value + 12 by a byte permute.
 *         Tiles go in groups of 4 (PACK_GROUP; the last group holds what is left), interleaved
 *         chunk by chunk: the group's chunk is its n tiles' scales, one after the other, then per
 *         block the n tiles' 4 registers. Decoding takes a group at a time, each activation
 *         broadcast serving 4 tiles, in one stream (tiles side by side in their own layout were
 *         two streams, 0.8x from memory). A group of 1 is the layout above, which q8_0 keeps.
 *   iq3_s, iq3_xxs, iq2_xxs, iq2_xs, iq2_s, iq1_s, iq1_m (the grid types): as mxfp4, but each
 *         code (a grid byte, one of iq3's 8 levels or iq2's 3, with its sign; iq1's 8g ± 1) is a
 *         nibble of its own, looked up once here instead of in the grid at every use (iq3_s's
 *         gathers were 39 % of a token: bench/README.md); a chunk is one file block, its scales
 *         per row a 32-bit word of 4-bit slot scales (iq1's 3-bit ones; slots 8-15 of the types
 *         with slots of 16 in a second 64 bytes), then the 16 rows' d (f16; iq1_m's assembled from
 *         its scale words). 4.25 bits a weight (4.375 with slots of 16) against the file's
 *         1.56-3.44: the layouts larger than their file (pack.c leaves them out when memory is short).
 *   iq4_nl: as q4_0 (its blocks are q4_0's: d, then 16 nibble bytes), the nibbles turned into
 *         codes level + 128 by mxfp4's byte permute, with the 16 levels as its table.
 *   iq4_xs: as iq4_nl, a chunk one file block (its nibble bytes are iq4_nl's, sub-block after
 *         sub-block); its scales the 16 rows' d (f16, 32 bytes, padded to 64), then per sub-block
 *         b the 16 rows' 6-bit scales ls as bytes (16 bytes at 64 + 16b): 192 bytes, so that the
 *         loops make d·(ls - 32) as the unpacker does.
 *   q4_K: per super-block of 256 columns, 4 registers of its first 16 bytes (d, dmin and the 12
 *         scale bytes, as kquant_scales reads them), then for each 64-column window c and half h
 *         4 registers of nibble bytes 32c + 16h + 4i.. (low nibbles: sub-block 2c, high: 2c + 1).
 *   q5_K: as q4_K, and after each window half's 4 nibble registers one register of their fifth
 *         bits: byte j of a row's lane holds, for register i, the low nibble's bit at bit 2i and
 *         the high nibble's at bit 2i + 1.
 *   q6_K: per super-block, 5 registers for kquant_scales (the 16 signed scales as 4 words, then
 *         d in the high half of a word), then per 16-column sub-block s 3 registers: the low 4
 *         bits of u = q + 32 of columns 16s + 0..3 (low nibbles) and 16s + 8..11 (high), of
 *         16s + 4..7 and 16s + 12..15, then the top 2 bits of all 16 (column 16s + 4g + j: bits
 *         2g, 2g + 1 of byte j).
 *   q2_K: per super-block, 4 registers of its 16 scale bytes (4-bit scale, 4-bit minimum) as
 *         lowbit_scales reads them, 1 of its d and dmin; then per 16-column sub-block s one
 *         register of codes: byte j of a row's lane holds the code of column 16s + 4g + j at bits
 *         2g, 2g + 1, so that (v >> 2g) & 3 is vpdpbusd's operand of columns 16s + 4g..4g + 3.
 *         (The file's bytes hold four columns 32 apart, which the decoding loop from the file
 *         transposed from 16 strided rows at every use: words16.)
 *   q3_K: per super-block, 4 registers of the 16 bytes that end the block (its 12 scale bytes,
 *         then d), as lowbit_scales reads them; then per pair of sub-blocks 2p, 2p + 1 three
 *         registers: the low 2 bits of u = q + 4 of sub-block 2p, then of 2p + 1, as q2_K's
 *         codes, then their third bits (hmask): column 16(2p + i) + 4g + j at bit 4i + g of byte j.
 *   q4_1, q5_0, q5_1 (the avx2 and avxvnni sets only: legacy_packed): as q4_0 (groups of 4 tiles,
 *         4 registers of the file's nibble bytes per block), q5_0 and q5_1 with a fifth register,
 *         the 16 rows' 32-bit qh words; a block's scales are the 16 rows' d (f16), and for q4_1 and
 *         q5_1 then their minimums (f16), 64 bytes.
 * The same bytes as the file's rows (a q6_K scale word more per super-block, q3_K's 2 bytes of its
 * window), plus the scales' padding and the last tile's missing rows. */

#include "kernels/vnni16_types.h"

#define VNNI16_CASE_(sfx, ID) case QUILL_TYPE_##ID:

static inline bool grid_nibbles(uint32_t type) {
    switch (type) {
    VNNI16_GRID_TYPES(VNNI16_CASE_)
        return true;
    default: return false;
    }
}

static inline bool packed_type(uint32_t type) {
    switch (type) {
    VNNI16_TYPES(VNNI16_CASE_)
        return true;
    default: return false;
    }
}

/* The 32-column types only the avx2 and avxvnni sets read from this layout (the vnni set keeps
 * their file's rows: quill_vnni_pack_bytes asks packed_type). */
static inline bool legacy_packed(uint32_t type) {
    return type == QUILL_TYPE_Q4_1 || type == QUILL_TYPE_Q5_0 || type == QUILL_TYPE_Q5_1;
}

/* The k-quants' layout (by super-block) rather than the chunks of 32-column blocks; the grid
 * types have 256-column blocks too but are packed as 32-column ones, one chunk per block. */
static inline bool kblock_type(uint32_t type) {
    return type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K || type == QUILL_TYPE_Q6_K || type == QUILL_TYPE_Q2_K ||
           type == QUILL_TYPE_Q3_K;
}

/* The k-quants of 2-bit codes (q3_K with a third bit apart), in sub-blocks of 16. */
static inline bool lowbit_type(uint32_t type) { return type == QUILL_TYPE_Q2_K || type == QUILL_TYPE_Q3_K; }
/* Registers of a packed q2_K or q3_K super-block before its codes: the scale words (q2_K: and d, dmin). */
static inline int lowbit_head(uint32_t type) { return type == QUILL_TYPE_Q2_K ? 5 : 4; }

/* Where a grid type's chunk keeps its 16 rows' d: after one 64-byte row of scale words per 8 slots. */
static inline size_t grid_d_at(uint32_t type) { return slot_width(type) == 16 ? 128 : 64; }

/* The 256-column types packed as 32-column blocks, a chunk per file block. */
static inline bool chunk_per_block(uint32_t type) { return grid_nibbles(type) || type == QUILL_TYPE_IQ4_XS; }

/* Nibbles turned into codes by a table (vpermb) rather than q4_0's arithmetic. */
static inline bool table_nibbles(uint32_t type) {
    return type == QUILL_TYPE_MXFP4 || type == QUILL_TYPE_IQ4_NL || chunk_per_block(type);
}

/* Bytes of a block's scales for the 16 rows (q4_0, q8_0, q5_0: f16 d; q4_1, q5_1: d, then the
 * minimums; mxfp4: the exponent byte). */
static inline size_t block_scale_bytes(uint32_t type) {
    return type == QUILL_TYPE_MXFP4 ? 16 : type == QUILL_TYPE_Q4_1 || type == QUILL_TYPE_Q5_1 ? 64 : 32;
}

/* Bytes of a chunk's scales (q4_0, q8_0, mxfp4, grid types), padded to a cache line. A grid
 * type's chunk is one file block: the 16 rows' 4 bytes of 4-bit sub-block scales, then their d (f16). */
static inline size_t chunk_scale_bytes(uint32_t type, int64_t blocks) {
    if (grid_nibbles(type)) return grid_d_at(type) + 64;
    if (type == QUILL_TYPE_IQ4_XS) return 192;
    return ((size_t)blocks * block_scale_bytes(type) + 63) & ~(size_t)63;
}

/* Code registers per 32-column block (q4_0, q8_0, mxfp4, legacy_packed). */
static inline int packed_regs(uint32_t type) {
    return type == QUILL_TYPE_Q8_0 ? 8 : type == QUILL_TYPE_Q5_0 || type == QUILL_TYPE_Q5_1 ? 5 : 4;
}

/* Bytes of a packed chunk of `blocks` blocks (q4_0, q8_0, mxfp4), and where the chunk of column k0 begins. */
static inline size_t packed_chunk_bytes(uint32_t type, int64_t blocks) {
    return chunk_scale_bytes(type, blocks) + (size_t)blocks * (size_t)packed_regs(type) * 64;
}
static inline size_t packed_chunk_at(uint32_t type, int64_t k0) {
    return (size_t)(k0 / PACK_CW) * packed_chunk_bytes(type, PACK_CW / 32);
}

/* Registers of a packed k-quant super-block; in q4_K and q5_K, where window c's half h begins. */
static inline int kblock_regs(uint32_t type) {
    return type == QUILL_TYPE_Q4_K   ? 4 + 32
           : type == QUILL_TYPE_Q5_K ? 4 + 40
           : type == QUILL_TYPE_Q2_K ? 5 + 16
           : type == QUILL_TYPE_Q3_K ? 4 + 24
                                     : 5 + 48;
}
static inline int half_window_reg(uint32_t type, int c, int h) {
    return 4 + (2 * c + h) * (type == QUILL_TYPE_Q5_K ? 5 : 4);
}

static inline size_t packed_tile_bytes(uint32_t type, int64_t cols) {
    if (kblock_type(type)) return (size_t)(cols / 256) * (size_t)kblock_regs(type) * 64;
    return packed_chunk_at(type, cols) + (cols % PACK_CW ? packed_chunk_bytes(type, cols % PACK_CW / 32) : 0);
}

/* Tiles per group in the layout of q4_0, mxfp4 and q8_0 (see above). */
#define PACK_GROUP 4
static inline int pack_group(uint32_t type) {
    return type == QUILL_TYPE_Q4_0 || table_nibbles(type) || legacy_packed(type) ? PACK_GROUP : 1;
}

/* Where tile `tile` (of `tiles`) of a packed q4_0 or q8_0 matrix keeps its chunk from column k0:
 * the group's chunk, at byte `chunk`, holds n tiles, this one the i-th. */
typedef struct {
    size_t chunk;
    int n, i;
} packed_place;
static inline packed_place place_chunk(uint32_t type, int64_t tiles, size_t tile_bytes, int64_t tile, int64_t k0) {
    const int g = pack_group(type);
    const int64_t first = tile / g * g;
    const int n = tiles - first < g ? (int)(tiles - first) : g;
    return (packed_place){(size_t)first * tile_bytes + (size_t)n * packed_chunk_at(type, k0), n, (int)(tile - first)};
}
/* In that chunk (of `blocks` blocks), the byte where the tile's scales begin, and its block b's codes. */
static inline size_t place_scales(uint32_t type, packed_place p, int64_t blocks) {
    return p.chunk + (size_t)p.i * chunk_scale_bytes(type, blocks);
}
static inline size_t place_codes(uint32_t type, packed_place p, int64_t blocks, int64_t b) {
    return p.chunk + (size_t)p.n * chunk_scale_bytes(type, blocks) +
           ((size_t)p.n * (size_t)b + (size_t)p.i) * (size_t)packed_regs(type) * 64;
}

static inline size_t vnni16_pack_bytes(uint32_t type, int64_t rows, int64_t cols) {
    if (!(packed_type(type) || legacy_packed(type)) || rows <= 0 || cols <= 0 || cols % block_elems(type)) return 0;
    return (size_t)((rows + PACK_TR - 1) / PACK_TR) * packed_tile_bytes(type, cols);
}

/* The 16 codes of a grid type's nibbles: its 8 grid levels (every byte of its grid is one of
 * them: the packed products' tests, on random blocks, read every grid entry), then their negatives. */
static const int8_t iq3s_levels[16] = {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15};
static const int8_t iq3xxs_levels[16] = {4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62};
/* iq2_xxs, iq2_xs, iq2_s: 3 levels; the rest of each half repeats the last (a nibble no code maps to) */
static const int8_t iq2_levels[16] = {8, 25, 43, 43, 43, 43, 43, 43, -8, -25, -43, -43, -43, -43, -43, -43};
/* iq1_s, iq1_m: 8g ± 1 for g in -1, 0, 1 */
static const int8_t iq1_levels[16] = {1, 7, 9, 9, 9, 9, 9, 9, -1, -7, -9, -9, -9, -9, -9, -9};
static inline const int8_t *grid_levels(uint32_t type) {
    switch (type) {
    case QUILL_TYPE_IQ3_S: return iq3s_levels;
    case QUILL_TYPE_IQ3_XXS: return iq3xxs_levels;
    case QUILL_TYPE_IQ1_S:
    case QUILL_TYPE_IQ1_M: return iq1_levels;
    default: return iq2_levels;
    }
}

/* A grid type's slot scales as 4-bit fields, slot s at bits 4s (16 slots of 16, or 8 of 32), and
 * its d as the file's f16 bits (iq1_m's from the top nibbles of its scale words), from block b. */
static inline uint64_t grid_slot_scales(uint32_t type, const uint8_t *b, uint16_t *d) {
    uint64_t sc = 0;
    memcpy(d, b, 2);
    switch (type) {
    case QUILL_TYPE_IQ3_S: {
        uint32_t w;
        memcpy(&w, b + offsetof(block_iq3_s, scales), 4);
        return w;
    }
    case QUILL_TYPE_IQ2_XXS: /* the top 4 bits of each sub-block's second word */
        for (int i = 0; i < 8; i++) sc |= (uint64_t)(b[2 + 8 * i + 7] >> 4) << (4 * i);
        return sc;
    case QUILL_TYPE_IQ3_XXS: /* the top 4 bits of each sub-block's scale-and-signs word */
        for (int i = 0; i < 8; i++) sc |= (uint64_t)(b[2 + QK_K / 4 + 4 * i + 3] >> 4) << (4 * i);
        return sc;
    case QUILL_TYPE_IQ2_XS: /* a byte per 32 columns: its 16-column slots' scales low, then high */
        memcpy(&sc, b + offsetof(block_iq2_xs, scales), 8);
        return sc;
    case QUILL_TYPE_IQ2_S:
        memcpy(&sc, b + offsetof(block_iq2_s, scales), 8);
        return sc;
    case QUILL_TYPE_IQ1_S: /* bits 12-14 of each sub-block's qh word */
        for (int i = 0; i < 8; i++) {
            uint16_t qh;
            memcpy(&qh, b + offsetof(block_iq1_s, qh) + 2 * i, 2);
            sc |= (uint64_t)((qh >> 12) & 7) << (4 * i);
        }
        return sc;
    default: { /* iq1_m: 3 bits a slot in four 16-bit words, whose top nibbles are d */
        uint16_t w[4];
        memcpy(w, b + offsetof(block_iq1_m, scales), 8);
        for (int s = 0; s < 16; s++) sc |= (uint64_t)((w[s / 4] >> (3 * (s % 4))) & 7) << (4 * s);
        *d = (uint16_t)((w[0] >> 12) | ((w[1] >> 8) & 0x00F0) | ((w[2] >> 4) & 0x0F00) | (w[3] & 0xF000));
        return sc;
    }
    }
}

/* The codes of an iq4 nibble and of a grid type's nibble: the values the tables of the packed
 * loops give them (before code_bias). */
static inline const int8_t *nibble_levels(uint32_t type) {
    return grid_nibbles(type) ? grid_levels(type) : type == QUILL_TYPE_MXFP4 ? quill_kvalues_fp4 : quill_kvalues_iq4nl;
}

/* The 4 bytes of row r that go to register `reg` of a packed range at `dst`. */
static inline void put_word(uint8_t *dst, size_t reg, int r, const uint8_t *bytes, uint8_t flip) {
    uint32_t v;
    memcpy(&v, bytes, 4);
    v ^= flip * 0x01010101u;
    memcpy(dst + reg * 64 + (size_t)r * 4, &v, 4);
}

static void vnni16_pack(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                     int64_t tile0, int64_t tile1) {
    uint8_t nibble_of[256] = {0}; /* a grid type's code (as a byte) to its nibble */
    if (grid_nibbles(type))
        for (int i = 15; i >= 0; i--) nibble_of[(uint8_t)grid_levels(type)[i]] = (uint8_t)i; /* a level's first nibble */
    const size_t tb = packed_tile_bytes(type, cols);
    const int64_t nb = cols / 32, tiles = (rows + PACK_TR - 1) / PACK_TR;
    for (int64_t tile = tile0; tile < tile1; tile++) {
        uint8_t *t = (uint8_t *)dst + (size_t)tile * tb;
        if (kblock_type(type)) {
            memset(t, 0, tb);
        } else { /* the tile's pieces of its group: its scales and its registers of each block */
            for (int64_t k0 = 0; k0 < cols; k0 += PACK_CW) {
                const int64_t blocks = (cols - k0 < PACK_CW ? cols - k0 : PACK_CW) / 32;
                const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                memset((uint8_t *)dst + place_scales(type, pl, blocks), 0, chunk_scale_bytes(type, blocks));
                for (int64_t b = 0; b < blocks; b++)
                    memset((uint8_t *)dst + place_codes(type, pl, blocks, b), 0, (size_t)packed_regs(type) * 64);
            }
        }
        for (int r = 0; r < PACK_TR && tile * PACK_TR + r < rows; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)(tile * PACK_TR + r) * row_bytes;
            if (type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K) {
                for (int64_t sb = 0; sb < cols / 256; sb++) {
                    const uint8_t *b = row + (size_t)sb * block_bytes(type);
                    const uint8_t *qs = b + (type == QUILL_TYPE_Q4_K ? offsetof(block_q4_K, qs) : offsetof(block_q5_K, qs));
                    uint8_t *d = t + (size_t)sb * (size_t)kblock_regs(type) * 64;
                    for (int i = 0; i < 4; i++) put_word(d, (size_t)i, r, b + 4 * i, 0);
                    for (int c = 0; c < 4; c++)
                        for (int h = 0; h < 2; h++) {
                            const size_t reg = (size_t)half_window_reg(type, c, h);
                            for (int i = 0; i < 4; i++) put_word(d, reg + (size_t)i, r, qs + 32 * c + 16 * h + 4 * i, 0);
                            if (type != QUILL_TYPE_Q5_K) continue;
                            const uint8_t *qh = ((const block_q5_K *)b)->qh;
                            uint8_t fifth[4] = {0};
                            for (int j = 0; j < 4; j++)
                                for (int i = 0; i < 4; i++) {
                                    const int l = 16 * h + 4 * i + j; /* the element of sub-blocks 2c and 2c + 1 */
                                    fifth[j] |= (uint8_t)(((qh[l] >> (2 * c)) & 1) << (2 * i));
                                    fifth[j] |= (uint8_t)(((qh[l] >> (2 * c + 1)) & 1) << (2 * i + 1));
                                }
                            put_word(d, reg + 4, r, fifth, 0);
                        }
                }
                continue;
            }
            if (type == QUILL_TYPE_Q6_K) {
                for (int64_t sb = 0; sb < cols / 256; sb++) {
                    const block_q6_K *b = (const block_q6_K *)row + sb;
                    uint8_t *d = t + (size_t)sb * (size_t)kblock_regs(type) * 64;
                    for (int i = 0; i < 4; i++) put_word(d, (size_t)i, r, (const uint8_t *)b->scales + 4 * i, 0);
                    const uint8_t dword[4] = {0, 0, ((const uint8_t *)&b->d)[0], ((const uint8_t *)&b->d)[1]};
                    put_word(d, 4, r, dword, 0);
                    uint8_t u[256]; /* q + 32, as the file's dequantizer takes them apart */
                    for (int half = 0; half < 2; half++)
                        for (int l = 0; l < 32; l++) {
                            const uint8_t *ql = b->ql + 64 * half, qh = b->qh[32 * half + l];
                            u[128 * half + l] = (uint8_t)((ql[l] & 0xF) | ((qh & 3) << 4));
                            u[128 * half + l + 32] = (uint8_t)((ql[l + 32] & 0xF) | (((qh >> 2) & 3) << 4));
                            u[128 * half + l + 64] = (uint8_t)((ql[l] >> 4) | (((qh >> 4) & 3) << 4));
                            u[128 * half + l + 96] = (uint8_t)((ql[l + 32] >> 4) | (((qh >> 6) & 3) << 4));
                        }
                    for (int sl = 0; sl < 16; sl++) {
                        const uint8_t *v = u + 16 * sl;
                        uint8_t n0[4], n1[4], top[4];
                        for (int j = 0; j < 4; j++) {
                            n0[j] = (uint8_t)((v[j] & 0xF) | (v[8 + j] & 0xF) << 4);
                            n1[j] = (uint8_t)((v[4 + j] & 0xF) | (v[12 + j] & 0xF) << 4);
                            top[j] = (uint8_t)((v[j] >> 4) | (v[4 + j] >> 4) << 2 | (v[8 + j] >> 4) << 4 | (v[12 + j] >> 4) << 6);
                        }
                        put_word(d, (size_t)(5 + 3 * sl), r, n0, 0);
                        put_word(d, (size_t)(5 + 3 * sl + 1), r, n1, 0);
                        put_word(d, (size_t)(5 + 3 * sl + 2), r, top, 0);
                    }
                }
                continue;
            }
            if (lowbit_type(type)) {
                for (int64_t sb = 0; sb < cols / 256; sb++) {
                    const uint8_t *b = row + (size_t)sb * block_bytes(type);
                    uint8_t *d = t + (size_t)sb * (size_t)kblock_regs(type) * 64;
                    const uint8_t *head = type == QUILL_TYPE_Q2_K ? b : b + Q3_K_SCALE_WINDOW;
                    for (int i = 0; i < 4; i++) put_word(d, (size_t)i, r, head + 4 * i, 0);
                    if (type == QUILL_TYPE_Q2_K) put_word(d, 4, r, b + offsetof(block_q2_K, d), 0);
                    /* sub-block s is columns 32jj + 16(s % 2) + 0..15 of the 128-column half h =
                     * s / 8 (jj = s % 8 / 2): bits 2jj, 2jj + 1 of qs[32h + 16(s % 2) + ..], q3_K's
                     * third bit (set: u = q + 4 >= 4) bit 4h + jj of hmask[16(s % 2) + ..]. A word
                     * at a time: byte j of group g's word is column 16s + 4g + j's byte. */
                    const uint8_t *qs = b + (type == QUILL_TYPE_Q2_K ? offsetof(block_q2_K, qs) : offsetof(block_q3_K, qs));
                    const uint8_t *hmask = b + offsetof(block_q3_K, hmask);
                    uint32_t third = 0; /* q3_K: the third bits of a pair of sub-blocks */
                    for (int sl = 0; sl < 16; sl++) {
                        const int h = sl / 8, jj = sl % 8 / 2, at = 16 * (sl % 2);
                        uint32_t low = 0;
                        for (int g = 0; g < 4; g++) {
                            uint32_t v;
                            memcpy(&v, qs + 32 * h + at + 4 * g, 4);
                            low |= ((v >> (2 * jj)) & 0x03030303u) << (2 * g);
                            if (type == QUILL_TYPE_Q2_K) continue;
                            memcpy(&v, hmask + at + 4 * g, 4);
                            third |= ((v >> (4 * h + jj)) & 0x01010101u) << (4 * (sl % 2) + g);
                        }
                        if (type == QUILL_TYPE_Q2_K) {
                            put_word(d, (size_t)(5 + sl), r, (const uint8_t *)&low, 0);
                            continue;
                        }
                        put_word(d, (size_t)(4 + 3 * (sl / 2) + sl % 2), r, (const uint8_t *)&low, 0);
                        if (sl % 2 == 0) continue;
                        put_word(d, (size_t)(4 + 3 * (sl / 2) + 2), r, (const uint8_t *)&third, 0);
                        third = 0;
                    }
                }
                continue;
            }
            if (type == QUILL_TYPE_IQ4_XS) {
                for (int64_t k0 = 0; k0 < cols; k0 += 256) {
                    const block_iq4_xs *b = (const block_iq4_xs *)(row + (size_t)(k0 / 256) * block_bytes(type));
                    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                    uint8_t *scales = (uint8_t *)dst + place_scales(type, pl, 8);
                    memcpy(scales + (size_t)r * 2, &b->d, 2);
                    uint16_t scales_h;
                    memcpy(&scales_h, &b->scales_h, 2);
                    for (int ib = 0; ib < 8; ib++) {
                        scales[64 + 16 * ib + r] =
                            (uint8_t)(((b->scales_l[ib / 2] >> 4 * (ib % 2)) & 0xF) | ((scales_h >> 2 * ib) & 3) << 4);
                        uint8_t *codes = (uint8_t *)dst + place_codes(type, pl, 8, ib);
                        for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b->qs + 16 * ib + 4 * i, 0);
                    }
                }
                continue;
            }
            if (grid_nibbles(type)) {
                for (int64_t k0 = 0; k0 < cols; k0 += 256) {
                    const uint8_t *b = row + (size_t)(k0 / 256) * block_bytes(type);
                    int8_t q[256];
                    float unused[16]; /* its slot scales (16 with slots of 16), taken from the block below */
                    (unpack_fast(type) ? unpack_fast(type) : quill_exact_unpack_for(type))(b, 256, q, unused, NULL);
                    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                    uint8_t *scales = (uint8_t *)dst + place_scales(type, pl, 8);
                    uint16_t d;
                    const uint64_t sc = grid_slot_scales(type, b, &d);
                    const uint8_t words[8] = {(uint8_t)sc,         (uint8_t)(sc >> 8),  (uint8_t)(sc >> 16), (uint8_t)(sc >> 24),
                                              (uint8_t)(sc >> 32), (uint8_t)(sc >> 40), (uint8_t)(sc >> 48), (uint8_t)(sc >> 56)};
                    put_word(scales, 0, r, words, 0);
                    if (slot_width(type) == 16) put_word(scales, 1, r, words + 4, 0);
                    memcpy(scales + grid_d_at(type) + (size_t)r * 2, &d, 2);
                    for (int blk = 0; blk < 8; blk++) {
                        uint8_t nib[16]; /* as mxfp4's bytes: code j low, code 16 + j high */
                        for (int i = 0; i < 16; i++)
                            nib[i] = (uint8_t)(nibble_of[(uint8_t)q[32 * blk + i]] | nibble_of[(uint8_t)q[32 * blk + 16 + i]] << 4);
                        uint8_t *codes = (uint8_t *)dst + place_codes(type, pl, 8, blk);
                        for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, nib + 4 * i, 0);
                    }
                }
                continue;
            }
            for (int64_t blk = 0; blk < nb; blk++) {
                const uint8_t *b = row + (size_t)blk * block_bytes(type);
                const int64_t k0 = blk * 32 / PACK_CW * PACK_CW, in_chunk = blk % (PACK_CW / 32);
                const int64_t blocks = (cols - k0 < PACK_CW ? cols - k0 : PACK_CW) / 32;
                const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                uint8_t *codes = (uint8_t *)dst + place_codes(type, pl, blocks, in_chunk);
                uint8_t *scales = (uint8_t *)dst + place_scales(type, pl, blocks) + (size_t)in_chunk * block_scale_bytes(type);
                if (type == QUILL_TYPE_MXFP4) {
                    scales[r] = ((const block_mxfp4 *)b)->e;
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + offsetof(block_mxfp4, qs) + 4 * i, 0);
                    continue;
                }
                memcpy(scales + (size_t)r * 2, b, 2); /* d */
                if (legacy_packed(type)) {
                    if (has_min(type)) memcpy(scales + 32 + (size_t)r * 2, b + 2, 2);
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + legacy_qs(type) + 4 * i, 0);
                    if (legacy_qh(type)) put_word(codes, 4, r, b + legacy_qh(type), 0);
                    continue;
                }
                if (type == QUILL_TYPE_Q8_0)
                    for (int i = 0; i < 8; i++) put_word(codes, (size_t)i, r, b + offsetof(block_q8_0, qs) + 4 * i, 0x80);
                else if (type == QUILL_TYPE_IQ4_NL)
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + offsetof(block_iq4_nl, qs) + 4 * i, 0);
                else
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + offsetof(block_q4_0, qs) + 4 * i, 0);
            }
        }
    }
}

#endif
