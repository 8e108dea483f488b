// The exact types' weights as product_exact.comp and product_tiled.comp read them: each type's
// codes q and scales s, m per slot (32 columns; q6_K, q2_K, q3_K and some grid types 16), as
// src/kernels/exact_scalar.c and exact_unpack.c define them. The including shader declares the
// buffers w (the weights' words), codes (the activations' codes) and codes4 (the same buffer as
// vectors of four) and grids (the lattice tables).
#ifndef QUILL_EXACT_WEIGHTS_GLSL
#define QUILL_EXACT_WEIGHTS_GLSL

const uint GRID_IQ2XXS = 0u, GRID_IQ2XS = 512u, GRID_IQ2S = 1536u, GRID_IQ3XXS = 3584u, GRID_IQ3S = 3840u,
           GRID_IQ1S = 4352u;

// q4_0 .. q5_1: bytes per block, where the nibbles and the fifth bits start (0: none), the code bias,
// and whether the block keeps a minimum after d
const uint LEGACY_BYTES[4] = uint[4](18u, 20u, 22u, 24u);
const uint LEGACY_QS[4] = uint[4](2u, 4u, 6u, 8u);
const uint LEGACY_QH[4] = uint[4](0u, 0u, 2u, 4u);
const int LEGACY_BIAS[4] = int[4](8, 0, 16, 0);
// mxfp4's E2M1 levels, doubled (types_lowbit.c's quill_kvalues_fp4)
const int FP4[16] = int[16](0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
// iq4_nl's and iq4_xs's 16 levels, their codes (types.c's quill_kvalues_iq4nl)
const int IQ4[16] = int[16](-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113);

#include "exact_math.glsl"

uint byte_at(uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

float half_at(uint i) { return unpackHalf2x16(byte_at(i) | (byte_at(i + 1u) << 8)).x; }

// mxfp4's E8M0 exponent as 2^(e - 128) (types_internal.h's quill_e8m0_half_to_float)
float e8m0_half(uint e) { return uintBitsToFloat(e < 2u ? 0x00200000u << e : (e - 1u) << 23); }

// One slot's step of the sum: acc = fma(C, s·da, acc), then for minimums fma(m', da·Σa, acc) with
// m' = -m, the value the CPU passes (q4_1 and q5_1 keep their minimum negated, so m' is theirs).
// Columns per slot of a kind: q6_K, q2_K, q3_K, iq2_xs, iq2_s and iq1_m 16, the others 32.
uint slot_width(uint kind) {
    return (kind >= 8u && kind <= 10u) || kind == 14u || kind == 15u || kind == 19u ? 16u : 32u;
}

uint u16_at(uint i) { return byte_at(i) | (byte_at(i + 1u) << 8); }

// The 4 bytes from byte i, for an even i (every format keeps its fields at even offsets): one or two
// loads where byte_at takes four. (The second may read the word after a buffer's last: vulkan.c's
// buffers keep slack after their bytes.)
uint word2_at(uint i) {
    const uint k = i >> 2;
    return (i & 2u) == 0u ? w[k] : (w[k] >> 16) | (w[k + 1u] << 16);
}

uint u32_at(uint i) { return u16_at(i) | (u16_at(i + 2u) << 16); }

// 8 lattice magnitudes (the bytes of lo, then hi) with their signs (bit j: negative) against the
// codes from codes[a0] (exact_unpack.c's signed_group)
int signed_group(uint lo, uint hi, uint signs, uint a0) {
    int c = 0;
    for (uint j = 0u; j < 8u; j++) {
        const int v = int(((j < 4u ? lo : hi) >> (8u * (j & 3u))) & 0xFFu);
        c += ((signs >> j) & 1u) != 0u ? -v * codes[a0 + j] : v * codes[a0 + j];
    }
    return c;
}

// 7 stored sign bits and the eighth that makes their parity even (quill_iq_signs)
uint iq_signs(uint seven) { return seven | (uint(bitCount(seven) & 1) << 7); }

// iq1's grid values g (-1, 0, 1) as the integers 8g ± 1 (exact_unpack.c's iq1_group)
int iq1_group(uint entry, bool minus, uint a0) {
    int c = 0;
    const uint lo = grids[GRID_IQ1S + 2u * entry], hi = grids[GRID_IQ1S + 2u * entry + 1u];
    for (uint j = 0u; j < 8u; j++) {
        const int g = bitfieldExtract(int(j < 4u ? lo : hi), int(8u * (j & 3u)), 8);
        c += (8 * g + (minus ? -1 : 1)) * codes[a0 + j];
    }
    return c;
}

// tq1_0's code of column c (< 256) of the block at `at`: a trit of a qs byte (5 a byte: the first
// 160 columns from bytes 0-31, the next 80 from 32-47) or of a qh byte (4 a byte, the last 16)
int tq1_code(uint at, uint c) {
    uint b, t;
    if (c < 160u) {
        b = c % 32u, t = c / 32u;
    } else if (c < 240u) {
        b = 32u + (c - 160u) % 16u, t = (c - 160u) / 16u;
    } else {
        b = 48u + (c - 240u) % 4u, t = (c - 240u) / 4u;
    }
    const uint pow3[5] = uint[5](1u, 3u, 9u, 27u, 81u);
    return int((((byte_at(at + b) * pow3[t]) & 0xFFu) * 3u) >> 8) - 1;
}

bool with_min(uint kind) { return kind == 1u || kind == 3u || kind == 6u || kind == 7u || kind == 9u; }

// The grid i-quants', ternary and 1-2-bit types' C = Σ q·a of slot s (exact_unpack.c's codes; none
// has minimums, so no Σa)
void grid_slot_ints(uint kind, uint row, uint s, uint a0, out int c) {
    c = 0;
    if (kind == 13u) {
        // iq2_xxs: 66-byte blocks (d, then per 32 columns 4 grid bytes and a word of 4 x 7 sign bits
        // and the scale)
        const uint at = row + (s / 8u) * 66u + 2u + 8u * (s % 8u), idx = u32_at(at), aux = u32_at(at + 4u);
        for (uint l = 0u; l < 4u; l++) {
            const uint e = GRID_IQ2XXS + 2u * ((idx >> (8u * l)) & 0xFFu);
            c += signed_group(grids[e], grids[e + 1u], iq_signs((aux >> (7u * l)) & 127u), a0 + 8u * l);
        }
    } else if (kind == 14u || kind == 15u) {
        // iq2_xs (74-byte blocks: d, 32 words of 9 grid bits and 7 sign bits, 8 scale bytes) and
        // iq2_s (82: d, 32 grid bytes, 32 sign bytes, 8 bytes of the grid's high bit pairs, 8 scale
        // bytes): slots of 16, two groups of 8 each
        const uint ib = (s % 16u) / 2u, hf = s % 2u;
        for (uint l = 2u * hf; l < 2u * hf + 2u; l++) {
            uint e, signs;
            if (kind == 14u) {
                const uint v = u16_at(row + (s / 16u) * 74u + 2u + 2u * (4u * ib + l));
                e = GRID_IQ2XS + 2u * (v & 511u), signs = iq_signs(v >> 9);
            } else {
                const uint at = row + (s / 16u) * 82u;
                e = GRID_IQ2S + 2u * (byte_at(at + 2u + 4u * ib + l) | ((byte_at(at + 66u + ib) << (8u - 2u * l)) & 0x300u));
                signs = byte_at(at + 34u + 4u * ib + l);
            }
            c += signed_group(grids[e], grids[e + 1u], signs, a0 + 8u * (l - 2u * hf));
        }
    } else if (kind == 16u) {
        // iq3_xxs: 98-byte blocks (d, 64 grid bytes, then per 32 columns a word of 4 x 7 sign bits
        // and the scale); each group of 8 two 4-byte grid entries
        const uint at = row + (s / 8u) * 98u, qs = at + 2u + 8u * (s % 8u), aux = u32_at(at + 66u + 4u * (s % 8u));
        for (uint l = 0u; l < 4u; l++)
            c += signed_group(grids[GRID_IQ3XXS + byte_at(qs + 2u * l)], grids[GRID_IQ3XXS + byte_at(qs + 2u * l + 1u)],
                              iq_signs((aux >> (7u * l)) & 127u), a0 + 8u * l);
    } else if (kind == 17u) {
        // iq3_s: 110-byte blocks (d, 64 grid bytes, 8 bytes of their ninth bits, 32 sign bytes, 4
        // scale bytes)
        const uint at = row + (s / 8u) * 110u, ib = s % 8u, qs = at + 2u + 8u * ib, qh = byte_at(at + 66u + ib);
        for (uint l = 0u; l < 4u; l++) {
            const uint e1 = byte_at(qs + 2u * l) | ((qh << (8u - 2u * l)) & 256u);
            const uint e2 = byte_at(qs + 2u * l + 1u) | ((qh << (7u - 2u * l)) & 256u);
            c += signed_group(grids[GRID_IQ3S + e1], grids[GRID_IQ3S + e2], byte_at(at + 74u + 4u * ib + l), a0 + 8u * l);
        }
    } else if (kind == 18u) {
        // iq1_s: 50-byte blocks (d, 32 grid bytes, per 32 columns a 16-bit word: 4 x 3 high grid
        // bits, the scale, the sign of the shift)
        const uint at = row + (s / 8u) * 50u, ib = s % 8u, qh = u16_at(at + 34u + 2u * ib);
        for (uint l = 0u; l < 4u; l++)
            c += iq1_group(byte_at(at + 2u + 4u * ib + l) | (((qh >> (3u * l)) & 7u) << 8), (qh & 0x8000u) != 0u,
                           a0 + 8u * l);
    } else if (kind == 19u) {
        // iq1_m: 56-byte blocks (32 grid bytes, 16 bytes of 2 x (3 high grid bits, the shift's
        // sign), 8 scale bytes); slots of 16
        const uint at = row + (s / 16u) * 56u, ib = (s % 16u) / 2u, hf = s % 2u;
        for (uint l = 2u * hf; l < 2u * hf + 2u; l++) {
            const uint hb = byte_at(at + 32u + 2u * ib + l / 2u) >> (4u * (l % 2u));
            c += iq1_group(byte_at(at + 4u * ib + l) | ((hb & 7u) << 8), (hb & 8u) != 0u, a0 + 8u * (l - 2u * hf));
        }
    } else if (kind == 20u) {
        // tq1_0: 54-byte blocks (48 bytes of 5 trits, 4 of 4 trits, d)
        const uint at = row + (s / 8u) * 54u, c0 = (s % 8u) * 32u;
        for (uint j = 0u; j < 32u; j++) c += tq1_code(at, c0 + j) * codes[a0 + j];
    } else if (kind == 21u) {
        // tq2_0: 66-byte blocks (64 bytes of 2-bit codes less 1, d): column c takes bits 2l, 2l + 1
        // of byte 32·(c / 128) + c % 32, l = c % 128 / 32
        const uint at = row + (s / 8u) * 66u, c0 = (s % 8u) * 32u;
        for (uint j = 0u; j < 32u; j++) {
            const uint col = c0 + j;
            c += (int((byte_at(at + 32u * (col / 128u) + col % 32u) >> (2u * ((col % 128u) / 32u))) & 3u) - 1) *
                 codes[a0 + j];
        }
    } else if (kind == 22u) {
        // q1_0: 18-byte blocks of 128 (d, a bit a weight: set +1, clear -1)
        const uint at = row + (s / 4u) * 18u + 2u, c0 = (s % 4u) * 32u;
        for (uint j = 0u; j < 32u; j++)
            c += ((byte_at(at + (c0 + j) / 8u) >> ((c0 + j) % 8u)) & 1u) != 0u ? codes[a0 + j] : -codes[a0 + j];
    } else {
        // q2_0: 18-byte blocks of 64 (d, 2 bits a weight less 1)
        const uint at = row + (s / 2u) * 18u + 2u, c0 = (s % 2u) * 32u;
        for (uint j = 0u; j < 32u; j++)
            c += (int((byte_at(at + (c0 + j) / 4u) >> (2u * ((c0 + j) % 4u))) & 3u) - 1) * codes[a0 + j];
    }
}

// Slot s of the row at byte `row`: the integers C = Σ q·a and Σa over its columns, the activation
// codes of its first column at codes[a0].
void slot_ints(uint kind, uint row, uint s, uint a0, out int c, out int sum) {
    c = 0;
    sum = 0;
    if (kind <= 3u) {
        // q4_0 .. q5_1: blocks of 32 with nibbles (low ones first) and fifth bits; the nibbles and
        // codes four at a time (byte 4k + b holds columns 4k + b and 16 + 4k + b)
        const uint at = row + s * LEGACY_BYTES[kind], qs = at + LEGACY_QS[kind], qh_at = LEGACY_QH[kind];
        const uint qh = qh_at == 0u ? 0u : word2_at(at + qh_at);
        for (uint k = 0u; k < 4u; k++) {
            const uint q = word2_at(qs + 4u * k);
            const ivec4 lo = codes4[a0 / 4u + k], hi = codes4[a0 / 4u + 4u + k];
            for (uint b = 0u; b < 4u; b++) {
                const uint jl = 4u * k + b, jh = jl + 16u, byte = (q >> (8u * b)) & 0xFFu;
                c += (int((byte & 0xFu) | (((qh >> jl) & 1u) << 4)) - LEGACY_BIAS[kind]) * lo[b] +
                     (int((byte >> 4) | (((qh >> jh) & 1u) << 4)) - LEGACY_BIAS[kind]) * hi[b];
                sum += lo[b] + hi[b];
            }
        }
    } else if (kind == 4u) {
        // q8_0: 34-byte blocks (d, 32 signed bytes)
        const uint at = row + s * 34u + 2u;
        for (uint k = 0u; k < 8u; k++) {
            const uint q = word2_at(at + 4u * k);
            const ivec4 a = codes4[a0 / 4u + k];
            for (uint b = 0u; b < 4u; b++) c += bitfieldExtract(int(q), int(8u * b), 8) * a[b];
        }
    } else if (kind == 5u) {
        // mxfp4: 17-byte blocks (E8M0 exponent, 16 bytes of fp4 nibbles, low nibbles first)
        const uint at = row + s * 17u;
        for (uint j = 0u; j < 16u; j++) {
            const uint q = byte_at(at + 1u + j);
            c += FP4[q & 0xFu] * codes[a0 + j] + FP4[q >> 4] * codes[a0 + 16u + j];
        }
    } else if (kind <= 7u) {
        // q4_K (144-byte blocks of 256: d, dmin, 12 bytes of scales and minimums, 128 of nibbles) and
        // q5_K (176: the same with 32 bytes of fifth bits before the nibbles); sub-block sb of 32
        const bool five = kind == 7u;
        const uint at = row + (s / 8u) * (five ? 176u : 144u), sb = s % 8u;
        const uint qs = at + (five ? 48u : 16u) + (sb / 2u) * 32u, shift = (sb % 2u) * 4u;
        for (uint k = 0u; k < 8u; k++) {
            const uint q = word2_at(qs + 4u * k), h = five ? word2_at(at + 16u + 4u * k) : 0u;
            const ivec4 a = codes4[a0 / 4u + k];
            for (uint b = 0u; b < 4u; b++) {
                uint v = (q >> (8u * b + shift)) & 0xFu;
                if (five) v |= ((h >> (8u * b + sb)) & 1u) << 4;
                c += int(v) * a[b];
                sum += a[b];
            }
        }
    } else if (kind == 8u) {
        // q6_K: 210-byte blocks of 256 (128 bytes of low nibbles, 64 of high bit pairs, 16 signed
        // scales, d); codes q - 32
        const uint at = row + (s / 16u) * 210u, j0 = (s % 16u) * 16u;
        for (uint j = j0; j < j0 + 16u; j++) {
            const uint hf = j / 128u, qd = (j % 128u) / 32u, l = j % 32u;
            uint lo = byte_at(at + 64u * hf + l + ((qd & 1u) != 0u ? 32u : 0u));
            lo = qd >= 2u ? lo >> 4 : lo & 0xFu;
            const int q = int(lo | (((byte_at(at + 128u + 32u * hf + l) >> (2u * qd)) & 3u) << 4)) - 32;
            c += q * codes[a0 + (j - j0)];
        }
    } else if (kind >= 13u) {
        grid_slot_ints(kind, row, s, a0, c);
    } else if (kind >= 11u) {
        // iq4_nl (18-byte blocks: d, 16 bytes of nibbles, low nibbles first) and iq4_xs (136-byte
        // blocks of 256: d, 2 bytes of high scale bits, 4 of low, then 16 bytes of nibbles per slot)
        const uint qs = kind == 11u ? row + s * 18u + 2u : row + (s / 8u) * 136u + 8u + (s % 8u) * 16u;
        for (uint k = 0u; k < 4u; k++) {
            const uint q = word2_at(qs + 4u * k);
            const ivec4 lo = codes4[a0 / 4u + k], hi = codes4[a0 / 4u + 4u + k];
            for (uint b = 0u; b < 4u; b++) {
                const uint byte = (q >> (8u * b)) & 0xFFu;
                c += IQ4[byte & 0xFu] * lo[b] + IQ4[byte >> 4] * hi[b];
            }
        }
    } else {
        // q2_K (84-byte blocks of 256: 16 bytes of scales and minimums, 64 of bit pairs, d, dmin) and
        // q3_K (110: 32 bytes of third bits, 64 of bit pairs, 12 of scales, d): column 32j + l of
        // half h takes bits 2j, 2j + 1 of qs[32h + l]
        const bool two = kind == 9u;
        const uint at = row + (s / 16u) * (two ? 84u : 110u), qs = at + (two ? 16u : 32u), j0 = (s % 16u) * 16u;
        for (uint j = j0; j < j0 + 16u; j++) {
            const uint h = j / 128u, jj = (j % 128u) / 32u, l = j % 32u;
            int q = int((byte_at(qs + 32u * h + l) >> (2u * jj)) & 3u);
            if (!two && ((byte_at(at + l) >> (4u * h + jj)) & 1u) == 0u) q -= 4;
            const int a = codes[a0 + (j - j0)];
            c += q * a;
            sum += a;
        }
    }
}

// The grid i-quants', ternary and 1-2-bit types' scale of slot s (exact_unpack.c's, each product
// rounded in its order)
float grid_slot_scale(uint kind, uint row, uint s) {
    if (kind == 13u || kind == 16u) {
        // iq2_xxs: d·(0.5 + top 4 bits)·0.25; iq3_xxs: the same ·0.5
        const uint bytes = kind == 13u ? 66u : 98u, at = row + (s / 8u) * bytes;
        const uint aux = u32_at(kind == 13u ? at + 2u + 8u * (s % 8u) + 4u : at + 66u + 4u * (s % 8u));
        precise const float a = half_at(at) * (0.5 + float(aux >> 28));
        precise const float sc = a * (kind == 13u ? 0.25 : 0.5);
        return sc;
    }
    if (kind == 14u || kind == 15u) {
        const uint bytes = kind == 14u ? 74u : 82u, at = row + (s / 16u) * bytes, ib = (s % 16u) / 2u;
        const uint sb = byte_at(at + (kind == 14u ? 66u : 74u) + ib);
        precise const float a = half_at(at) * (0.5 + float((s % 2u) != 0u ? sb >> 4 : sb & 0xFu));
        precise const float sc = a * 0.25;
        return sc;
    }
    if (kind == 17u) {
        const uint at = row + (s / 8u) * 110u, ib = s % 8u, sb = byte_at(at + 106u + ib / 2u);
        precise const float sc = half_at(at) * float(1u + 2u * ((ib % 2u) != 0u ? sb >> 4 : sb & 0xFu));
        return sc;
    }
    if (kind == 18u) {
        const uint at = row + (s / 8u) * 50u, qh = u16_at(at + 34u + 2u * (s % 8u));
        precise const float a = half_at(at) * float(2u * ((qh >> 12) & 7u) + 1u);
        precise const float sc = a * 0.125;
        return sc;
    }
    if (kind == 19u) {
        // d from the top nibbles of the four scale words, then a 3-bit scale per 16 columns
        const uint at = row + (s / 16u) * 56u + 48u, ib = (s % 16u) / 2u;
        const uint w0 = u16_at(at), w1 = u16_at(at + 2u), w2 = u16_at(at + 4u), w3 = u16_at(at + 6u);
        const float d = unpackHalf2x16((w0 >> 12) | ((w1 >> 8) & 0xF0u) | ((w2 >> 4) & 0xF00u) | (w3 & 0xF000u)).x;
        const uint word = u16_at(at + 2u * (ib / 2u));
        precise const float a = d * float(2u * ((word >> (6u * (ib % 2u) + 3u * (s % 2u))) & 7u) + 1u);
        precise const float sc = a * 0.125;
        return sc;
    }
    if (kind == 20u) return half_at(row + (s / 8u) * 54u + 52u);
    if (kind == 21u) return half_at(row + (s / 8u) * 66u + 64u);
    if (kind == 22u) return half_at(row + (s / 4u) * 18u);
    return half_at(row + (s / 2u) * 18u);
}

// Slot s's scale, and for the types with minimums the value its minimums' term multiplies (q4_1
// and q5_1 keep their minimum negated: it is theirs; the k-quants' -m).
void slot_scales(uint kind, uint row, uint s, out float sc, out float neg_m) {
    neg_m = 0.0;
    if (kind <= 3u) {
        const uint at = row + s * LEGACY_BYTES[kind];
        sc = half_at(at);
        if (with_min(kind)) neg_m = half_at(at + 2u);
    } else if (kind == 4u) {
        sc = half_at(row + s * 34u);
    } else if (kind == 5u) {
        sc = e8m0_half(byte_at(row + s * 17u));
    } else if (kind <= 7u) {
        const uint at = row + (s / 8u) * (kind == 7u ? 176u : 144u), sb = s % 8u;
        uint scale, mn;
        if (sb < 4u) {
            scale = byte_at(at + 4u + sb) & 63u;
            mn = byte_at(at + 8u + sb) & 63u;
        } else {
            scale = (byte_at(at + 8u + sb) & 0xFu) | ((byte_at(at + sb) >> 6) << 4);
            mn = (byte_at(at + 8u + sb) >> 4) | ((byte_at(at + 4u + sb) >> 6) << 4);
        }
        precise const float d = half_at(at) * float(scale);
        precise const float m = half_at(at + 2u) * float(mn);
        sc = d;
        neg_m = -m;
    } else if (kind == 8u) {
        const uint at = row + (s / 16u) * 210u;
        precise const float d = half_at(at + 208u) * float(bitfieldExtract(int(byte_at(at + 192u + s % 16u)), 0, 8));
        sc = d;
    } else if (kind >= 13u) {
        sc = grid_slot_scale(kind, row, s);
    } else if (kind == 11u) {
        sc = half_at(row + s * 18u);
    } else if (kind == 12u) {
        // (kernels_exact.h's iq4_xs_sub_scale: d·(ls - 32), ls's 4 low bits and 2 high ones)
        const uint at = row + (s / 8u) * 136u, ib = s % 8u;
        const uint scales_h = byte_at(at + 2u) | (byte_at(at + 3u) << 8);
        const uint ls = ((byte_at(at + 4u + ib / 2u) >> (4u * (ib % 2u))) & 0xFu) | (((scales_h >> (2u * ib)) & 3u) << 4);
        precise const float d = half_at(at) * float(int(ls) - 32);
        sc = d;
    } else if (kind == 9u) {
        const uint at = row + (s / 16u) * 84u, sm = byte_at(at + s % 16u);
        precise const float d = half_at(at + 80u) * float(sm & 0xFu);
        precise const float m = half_at(at + 82u) * float(sm >> 4);
        sc = d;
        neg_m = -m;
    } else {
        // q3_K's sixteen 6-bit scales: low 4 bits from bytes 0..7 (low nibbles for slots 0..7, high
        // for 8..15), high 2 bits from bytes 8..11; less 32
        const uint at = row + (s / 16u) * 110u, sat = at + 96u, k = s % 16u;
        const uint lo = k < 8u ? byte_at(sat + k) & 0xFu : byte_at(sat + k - 8u) >> 4;
        const uint hi = (byte_at(sat + 8u + (k & 3u)) >> (2u * (k >> 2))) & 3u;
        precise const float d = half_at(at + 108u) * float(int(lo | (hi << 4)) - 32);
        sc = d;
    }
}

// Whether a kind has weight_code (the tiled products' kinds: the types with a code per column and
// no lattice; vulkan.c's tiled_kind)
bool has_weight_code(uint kind) { return kind <= 12u; }

// Column j of slot s's code q of the row at byte `row`, for the kinds of has_weight_code: the q that
// slot_ints multiplies by the activation's code of that column.
int weight_code(uint kind, uint row, uint s, uint j) {
    if (kind <= 3u) {
        const uint at = row + s * LEGACY_BYTES[kind], qs = at + LEGACY_QS[kind], qh_at = LEGACY_QH[kind];
        const uint nib = j < 16u ? byte_at(qs + j) & 0xFu : byte_at(qs + j - 16u) >> 4;
        const uint high = qh_at == 0u ? 0u : (byte_at(at + qh_at + j / 8u) >> (j % 8u)) & 1u;
        return int(nib | (high << 4)) - LEGACY_BIAS[kind];
    }
    if (kind == 4u) return bitfieldExtract(int(byte_at(row + s * 34u + 2u + j)), 0, 8);
    if (kind == 5u) {
        const uint q = byte_at(row + s * 17u + 1u + j % 16u);
        return FP4[j < 16u ? q & 0xFu : q >> 4];
    }
    if (kind <= 7u) {
        const bool five = kind == 7u;
        const uint at = row + (s / 8u) * (five ? 176u : 144u), sb = s % 8u;
        uint q = (byte_at(at + (five ? 48u : 16u) + (sb / 2u) * 32u + j) >> ((sb % 2u) * 4u)) & 0xFu;
        if (five) q |= ((byte_at(at + 16u + j) >> sb) & 1u) << 4;
        return int(q);
    }
    if (kind == 8u) {
        const uint at = row + (s / 16u) * 210u, c = (s % 16u) * 16u + j;
        const uint hf = c / 128u, qd = (c % 128u) / 32u, l = c % 32u;
        uint lo = byte_at(at + 64u * hf + l + ((qd & 1u) != 0u ? 32u : 0u));
        lo = qd >= 2u ? lo >> 4 : lo & 0xFu;
        return int(lo | (((byte_at(at + 128u + 32u * hf + l) >> (2u * qd)) & 3u) << 4)) - 32;
    }
    if (kind >= 11u) {
        const uint qs = kind == 11u ? row + s * 18u + 2u : row + (s / 8u) * 136u + 8u + (s % 8u) * 16u;
        const uint q = byte_at(qs + j % 16u);
        return IQ4[j < 16u ? q & 0xFu : q >> 4];
    }
    const bool two = kind == 9u;
    const uint at = row + (s / 16u) * (two ? 84u : 110u), qs = at + (two ? 16u : 32u), c = (s % 16u) * 16u + j;
    const uint h = c / 128u, jj = (c % 128u) / 32u, l = c % 32u;
    int q = int((byte_at(qs + 32u * h + l) >> (2u * jj)) & 3u);
    if (!two && ((byte_at(at + l) >> (4u * h + jj)) & 1u) == 0u) q -= 4;
    return q;
}
#endif
