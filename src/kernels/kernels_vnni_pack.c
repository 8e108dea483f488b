/* The vnni set's load-time layout: packing a matrix once into the order its loops read it, and
 * the decoding and batch loops over the packed copy (exact_avx512.h describes the sets). */
#include "kernels/exact_avx512.h"

#if defined(__x86_64__)
#include "kernels/unpack_simd.h"

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
 *   q8_0: per chunk of 256 columns (CW, 8 blocks; fewer in a last chunk), the chunk's scales
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
 *   iq3_s, iq3_xxs (the grid types): as mxfp4, but each code (a grid byte, one of 8 levels,
 *         with its sign) is a nibble of its own, looked up once here instead of in the grid at
 *         every use (iq3_s's gathers were 39 % of a token: bench/README.md); a chunk is one file
 *         block, its scales the 16 rows' 4 bytes of 4-bit sub-block scales, then their d (f16).
 *         4.25 bits a weight against the file's 3.44 and 3.06: the layouts larger than their file
 *         (pack.c leaves them out when memory is short).
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
 * The same bytes as the file's rows (a q6_K scale word more per super-block, q3_K's 2 bytes of its
 * window), plus the scales' padding and the last tile's missing rows. */

static bool packed_type(uint32_t type) {
    return type == QUILL_TYPE_Q8_0 || type == QUILL_TYPE_Q4_0 || type == QUILL_TYPE_Q4_K || type == QUILL_TYPE_Q5_K ||
           type == QUILL_TYPE_Q6_K || type == QUILL_TYPE_MXFP4 || type == QUILL_TYPE_IQ3_S || type == QUILL_TYPE_IQ3_XXS ||
           type == QUILL_TYPE_Q2_K || type == QUILL_TYPE_Q3_K;
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

/* The grid i-quants whose codes take 16 values at most (8 magnitudes, signed): packed as nibbles. */
static inline bool grid_nibbles(uint32_t type) { return type == QUILL_TYPE_IQ3_S || type == QUILL_TYPE_IQ3_XXS; }

/* Nibbles turned into codes by a table (vpermb) rather than q4_0's arithmetic. */
static inline bool table_nibbles(uint32_t type) { return type == QUILL_TYPE_MXFP4 || grid_nibbles(type); }

/* Bytes of a block's scales for the 16 rows (q4_0, q8_0: f16 d; mxfp4: the exponent byte). */
static inline size_t block_scale_bytes(uint32_t type) { return type == QUILL_TYPE_MXFP4 ? 16 : 32; }

/* Bytes of a chunk's scales (q4_0, q8_0, mxfp4, grid types), padded to a cache line. A grid
 * type's chunk is one file block: the 16 rows' 4 bytes of 4-bit sub-block scales, then their d (f16). */
static inline size_t chunk_scale_bytes(uint32_t type, int64_t blocks) {
    if (grid_nibbles(type)) return 128;
    return ((size_t)blocks * block_scale_bytes(type) + 63) & ~(size_t)63;
}

/* Code registers per 32-column block (q4_0, q8_0, mxfp4). */
static inline int packed_regs(uint32_t type) { return type == QUILL_TYPE_Q8_0 ? 8 : 4; }

/* Bytes of a packed chunk of `blocks` blocks (q4_0, q8_0, mxfp4), and where the chunk of column k0 begins. */
static inline size_t packed_chunk_bytes(uint32_t type, int64_t blocks) {
    return chunk_scale_bytes(type, blocks) + (size_t)blocks * (size_t)packed_regs(type) * 64;
}
static inline size_t packed_chunk_at(uint32_t type, int64_t k0) {
    return (size_t)(k0 / CW) * packed_chunk_bytes(type, CW / 32);
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
    return packed_chunk_at(type, cols) + (cols % CW ? packed_chunk_bytes(type, cols % CW / 32) : 0);
}

/* Tiles per group in the layout of q4_0, mxfp4 and q8_0 (see above). */
#define PACK_GROUP 4
static inline int pack_group(uint32_t type) { return type == QUILL_TYPE_Q4_0 || table_nibbles(type) ? PACK_GROUP : 1; }

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

size_t quill_vnni_pack_bytes(uint32_t type, int64_t rows, int64_t cols) {
    if (!packed_type(type) || rows <= 0 || cols <= 0 || cols % block_elems(type)) return 0;
    return (size_t)((rows + TR - 1) / TR) * packed_tile_bytes(type, cols);
}

/* The 16 codes of a grid type's nibbles: its 8 grid levels (every byte of its grid is one of
 * them: the packed products' tests, on random blocks, read every grid entry), then their negatives. */
static const int8_t iq3s_levels[16] = {1, 3, 5, 7, 9, 11, 13, 15, -1, -3, -5, -7, -9, -11, -13, -15};
static const int8_t iq3xxs_levels[16] = {4, 12, 20, 28, 36, 44, 52, 62, -4, -12, -20, -28, -36, -44, -52, -62};
static inline const int8_t *grid_levels(uint32_t type) {
    return type == QUILL_TYPE_IQ3_S ? iq3s_levels : iq3xxs_levels;
}

/* The 4 bytes of row r that go to register `reg` of a packed range at `dst`. */
static inline void put_word(uint8_t *dst, size_t reg, int r, const uint8_t *bytes, uint8_t flip) {
    uint32_t v;
    memcpy(&v, bytes, 4);
    v ^= flip * 0x01010101u;
    memcpy(dst + reg * 64 + (size_t)r * 4, &v, 4);
}

void quill_vnni_pack(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                     int64_t tile0, int64_t tile1) {
    uint8_t nibble_of[256] = {0}; /* a grid type's code (as a byte) to its nibble */
    if (grid_nibbles(type))
        for (int i = 0; i < 16; i++) nibble_of[(uint8_t)grid_levels(type)[i]] = (uint8_t)i;
    const size_t tb = packed_tile_bytes(type, cols);
    const int64_t nb = cols / 32, tiles = (rows + TR - 1) / TR;
    for (int64_t tile = tile0; tile < tile1; tile++) {
        uint8_t *t = (uint8_t *)dst + (size_t)tile * tb;
        if (kblock_type(type)) {
            memset(t, 0, tb);
        } else { /* the tile's pieces of its group: its scales and its registers of each block */
            for (int64_t k0 = 0; k0 < cols; k0 += CW) {
                const int64_t blocks = (cols - k0 < CW ? cols - k0 : CW) / 32;
                const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                memset((uint8_t *)dst + place_scales(type, pl, blocks), 0, chunk_scale_bytes(type, blocks));
                for (int64_t b = 0; b < blocks; b++)
                    memset((uint8_t *)dst + place_codes(type, pl, blocks, b), 0, (size_t)packed_regs(type) * 64);
            }
        }
        for (int r = 0; r < TR && tile * TR + r < rows; r++) {
            const uint8_t *row = (const uint8_t *)w + (size_t)(tile * TR + r) * row_bytes;
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
            if (grid_nibbles(type)) {
                for (int64_t k0 = 0; k0 < cols; k0 += 256) {
                    const uint8_t *b = row + (size_t)(k0 / 256) * block_bytes(type);
                    int8_t q[256];
                    float unused[8];
                    (unpack_fast(type) ? unpack_fast(type) : quill_exact_unpack_for(type))(b, 256, q, unused, NULL);
                    const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                    uint8_t *scales = (uint8_t *)dst + place_scales(type, pl, 8);
                    uint8_t sub[4]; /* sub-block b's 4-bit scale in bits 4b..4b+3 */
                    if (type == QUILL_TYPE_IQ3_S) {
                        memcpy(sub, b + offsetof(block_iq3_s, scales), 4);
                    } else { /* iq3_xxs: the top 4 bits of each sub-block's scale-and-signs word */
                        const uint8_t *words = b + 2 + QK_K / 4;
                        for (int i = 0; i < 4; i++) sub[i] = (uint8_t)(words[8 * i + 3] >> 4 | (words[8 * i + 7] >> 4) << 4);
                    }
                    put_word(scales, 0, r, sub, 0);
                    memcpy(scales + 64 + (size_t)r * 2, b, 2); /* d */
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
                const int64_t k0 = blk * 32 / CW * CW, in_chunk = blk % (CW / 32);
                const int64_t blocks = (cols - k0 < CW ? cols - k0 : CW) / 32;
                const packed_place pl = place_chunk(type, tiles, tb, tile, k0);
                uint8_t *codes = (uint8_t *)dst + place_codes(type, pl, blocks, in_chunk);
                uint8_t *scales = (uint8_t *)dst + place_scales(type, pl, blocks) + (size_t)in_chunk * block_scale_bytes(type);
                if (type == QUILL_TYPE_MXFP4) {
                    scales[r] = ((const block_mxfp4 *)b)->e;
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + offsetof(block_mxfp4, qs) + 4 * i, 0);
                    continue;
                }
                memcpy(scales + (size_t)r * 2, b, 2); /* d */
                if (type == QUILL_TYPE_Q8_0)
                    for (int i = 0; i < 8; i++) put_word(codes, (size_t)i, r, b + offsetof(block_q8_0, qs) + 4 * i, 0x80);
                else
                    for (int i = 0; i < 4; i++) put_word(codes, (size_t)i, r, b + offsetof(block_q4_0, qs) + 4 * i, 0);
            }
        }
    }
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
 * type's levels. vpermb reads an index's low 6 bits, so the 16 values repeat 4 times and a nibble
 * needs no masking. */
static inline __m512i nibble_table(uint32_t type) {
    const int8_t *values = grid_nibbles(type) ? grid_levels(type) : quill_kvalues_fp4;
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
 * (e - 1) << 23, or for e < 2 the subnormal 2^21 << e). */
static inline __attribute__((always_inline)) __m512 packed_scales(uint32_t type, const uint8_t *scales, int64_t b) {
    if (grid_nibbles(type)) { /* sc the nibble b of the row's scale word; the unpacker's steps */
        const __m512i words = _mm512_load_si512((const __m512i *)scales);
        const __m512i sc = _mm512_and_si512(_mm512_srli_epi32(words, (unsigned)(4 * b)), _mm512_set1_epi32(0xF));
        const __m512 d = _mm512_cvtph_ps(_mm256_load_si256((const __m256i *)(scales + 64)));
        if (type == QUILL_TYPE_IQ3_S) /* d · (1 + 2 sc) */
            return _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(sc, 1), _mm512_set1_epi32(1))));
        /* iq3_xxs: d · (0.5 + sc) · 0.5 */
        const __m512 half = _mm512_set1_ps(0.5f);
        return _mm512_mul_ps(_mm512_mul_ps(d, _mm512_add_ps(half, _mm512_cvtepi32_ps(sc))), half);
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
        _Alignas(64) float sbuf[PACK_GROUP][CW / 32][TR];
#pragma GCC unroll 4
        for (int t = 0; t < n; t++)
            for (int64_t b = 0; b < blocks; b++) _mm512_store_ps(sbuf[t][b], packed_scales(type, chunk + t * scale_bytes, b));
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

/* The sums of tokens [t0, t0 + n) against one tile's block (its codes unpacked in lo, hi). */
static inline __attribute__((always_inline)) void few_tokens(const planes *P, int64_t blk, const __m512i lo[4],
                                                             const __m512i hi[4], __m512 sc, float (*acc)[TR], int t0,
                                                             const int n) {
    const __m512i z = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int t = t0; t < t0 + n; t++) {
        const int8_t *h = P[t].h + blk * 32, *l = P[t].l + blk * 32;
        /* with few tokens two chains per plane, so that enough products are in flight */
        __m512i sh[2] = {z, z}, sl[2] = {z, z};
        const int c = n < 4;
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) {
            sh[0] = dpbusd_bcast(sh[0], lo[q], h + 4 * q);
            sh[c] = dpbusd_bcast(sh[c], hi[q], h + 16 + 4 * q);
            sl[0] = dpbusd_bcast(sl[0], lo[q], l + 4 * q);
            sl[c] = dpbusd_bcast(sl[c], hi[q], l + 16 + 4 * q);
        }
        /* (q4_0's f32 step is mxfp4's: neither has minimums, and the bias comes with the planes) */
        _mm512_store_ps(acc[t], slot_step(QUILL_TYPE_Q4_0, _mm512_load_ps(acc[t]), _mm512_add_epi32(sh[0], sh[1]),
                                          _mm512_add_epi32(sl[0], sl[1]), &P[t], blk, blk, sc, NULL));
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
                const __m512 sc = packed_scales(type, chunk + i * scale_bytes, b);
#define FEW_BLOCK(t0) if (n_tok > t0) few_tokens(P, blk, lo, hi, sc, acc[i], t0, n_tok - t0 < 4 ? n_tok - t0 : 4);
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
                    for (int b = 0; b < cw / 32; b++) _mm512_store_ps(sbuf[b], packed_scales(type, scales, b));
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
/* mxfp4 and the grid types are no types of the specialised kernels (QUILL_EXACT_TYPES) but are packed */
DECODE_PACKED_TASK(mxfp4, MXFP4)
GEMM_PACKED_TASK(mxfp4, MXFP4)
DECODE_PACKED_TASK(iq3_s, IQ3_S)
GEMM_PACKED_TASK(iq3_s, IQ3_S)
DECODE_PACKED_TASK(iq3_xxs, IQ3_XXS)
GEMM_PACKED_TASK(iq3_xxs, IQ3_XXS)
/* nor q2_K and q3_K (the unpacking kernels' types, which the vnni set also runs in loops of its own) */
DECODE_PACKED_TASK(q2_K, Q2_K)
GEMM_PACKED_TASK(q2_K, Q2_K)
DECODE_PACKED_TASK(q3_K, Q3_K)
GEMM_PACKED_TASK(q3_K, Q3_K)

size_t quill_vnni_packed_tile_bytes(uint32_t type, int64_t cols) { return packed_tile_bytes(type, cols); }
int quill_vnni_pack_group(uint32_t type) { return pack_group(type); }
quill_task_fn quill_vnni_decode_packed_fn(uint32_t type) {
    return type == QUILL_TYPE_MXFP4   ? decode_packed_mxfp4
           : type == QUILL_TYPE_IQ3_S ? decode_packed_iq3_s
           : type == QUILL_TYPE_IQ3_XXS ? decode_packed_iq3_xxs
           : type == QUILL_TYPE_Q2_K  ? decode_packed_q2_K
           : type == QUILL_TYPE_Q3_K  ? decode_packed_q3_K
                                      : decode_packed_fn(type);
}
quill_task_fn quill_vnni_gemm_packed_fn(uint32_t type) {
    return type == QUILL_TYPE_MXFP4   ? gemm_packed_mxfp4
           : type == QUILL_TYPE_IQ3_S ? gemm_packed_iq3_s
           : type == QUILL_TYPE_IQ3_XXS ? gemm_packed_iq3_xxs
           : type == QUILL_TYPE_Q2_K  ? gemm_packed_q2_K
           : type == QUILL_TYPE_Q3_K  ? gemm_packed_q3_K
                                      : gemm_packed_fn(type);
}
quill_task_fn quill_vnni_few_packed_fn(uint32_t type, int n_tok) {
    if (n_tok < 2 || n_tok > FEW_TOKENS) return NULL;
    return type == QUILL_TYPE_Q4_0 || table_nibbles(type) ? few_packed : NULL;
}
#endif
