#version 450
// y[t][r] = W[r] · x[t] for q4_0, q8_0, q4_K and q6_K weights with the activations' codes (quantize.comp),
// as src/kernels/exact_scalar.c defines the bits: per sub-block (32; q6_K: 16) the integer
// C = Σ q·a (exact), then acc = fma(C, s·da, acc) sub-block after sub-block (q4_K: and
// fma(-m, da·Σa, acc)). One invocation per (row, token), so that no
// result depends on the batch, the workgroup or the subgroup size.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer W { uint w[]; };
layout(std430, binding = 1) readonly buffer Codes { int codes[]; };
layout(std430, binding = 2) readonly buffer Scales { float da[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
// kind: 0 q4_0 (18-byte blocks: f16 d, 16 bytes of nibbles, codes q - 8), 1 q8_0 (34-byte blocks:
// f16 d, 32 signed bytes), 2 q4_K, 3 q6_K (as exact_scalar.c's row_codes and row_scales read them)
layout(push_constant) uniform Params { uint rows; uint cols; uint n_tok; uint row_bytes; uint kind; } p;

// fma(a, b, c) rounded once, as C's fmaf: GLSL's fma may be a multiply and an add (llvmpipe's
// is), so it is built from float64 operations, each correctly rounded in Vulkan: a·b is exact in
// float64 (24 + 24 bits), the sum is rounded to odd (TwoSum gives its exact error; a nonzero error
// with an even last bit moves it one unit toward the exact sum), and round-to-odd in 53 bits then
// to nearest in 24 is the sum rounded once to nearest (Boldo and Melquiond, 2008).
float fma_once(float a, float b, float c) {
    precise const double p = double(a) * double(b);
    precise const double s = p + double(c);
    precise const double bv = s - p;
    precise const double e = (p - (s - bv)) + (double(c) - bv);
    if (e == 0.0) return float(s);
    uvec2 u = unpackDouble2x32(s);
    if ((u.x & 1u) != 0u) return float(s);
    uint carry;
    if ((e > 0.0) == (s > 0.0)) { // the exact sum is farther from zero
        u.x = uaddCarry(u.x, 1u, carry);
        u.y += carry;
    } else {
        u.x = usubBorrow(u.x, 1u, carry);
        u.y -= carry;
    }
    return float(packDouble2x32(u));
}

uint byte_at(uint i) { return (w[i >> 2] >> ((i & 3u) * 8u)) & 0xFFu; }

float half_at(uint i) { return unpackHalf2x16(byte_at(i) | (byte_at(i + 1u) << 8)).x; }

void main() {
    const uint id = gl_GlobalInvocationID.x;
    if (id >= p.rows * p.n_tok) return;
    const uint r = id % p.rows, t = id / p.rows;
    const uint nb = p.cols / 32u;
    precise float acc = 0.0;
    // block after block of 32 activations (their codes share one scale da), in column order
    for (uint b = 0u; b < nb; b++) {
        const uint a0 = (t * nb + b) * 32u;
        const float dab = da[t * nb + b];
        if (p.kind <= 1u) {
            const uint at = r * p.row_bytes + b * (p.kind == 0u ? 18u : 34u);
            int c = 0;
            if (p.kind == 0u) {
                for (uint j = 0u; j < 16u; j++) {
                    const uint q = byte_at(at + 2u + j);
                    c += (int(q & 0xFu) - 8) * codes[a0 + j] + (int(q >> 4) - 8) * codes[a0 + 16u + j];
                }
            } else {
                for (uint j = 0u; j < 32u; j++) c += bitfieldExtract(int(byte_at(at + 2u + j)), 0, 8) * codes[a0 + j];
            }
            precise const float s = half_at(at) * dab;
            acc = fma_once(float(c), s, acc);
        } else if (p.kind == 2u) {
            // q4_K: 144-byte blocks of 256 (d, dmin, 12 bytes of 6-bit scales and minimums, 128 of
            // nibbles); sub-block sb of 32: weight d·sc·q - dmin·mn
            const uint at = r * p.row_bytes + (b / 8u) * 144u, sb = b % 8u;
            uint sc, mn;
            if (sb < 4u) {
                sc = byte_at(at + 4u + sb) & 63u;
                mn = byte_at(at + 8u + sb) & 63u;
            } else {
                sc = (byte_at(at + 8u + sb) & 0xFu) | ((byte_at(at + sb) >> 6) << 4);
                mn = (byte_at(at + 8u + sb) >> 4) | ((byte_at(at + 4u + sb) >> 6) << 4);
            }
            const uint qs = at + 16u + (sb / 2u) * 32u, shift = (sb % 2u) * 4u;
            int c = 0, sum = 0;
            for (uint j = 0u; j < 32u; j++) {
                const int a = codes[a0 + j];
                c += int((byte_at(qs + j) >> shift) & 0xFu) * a;
                sum += a;
            }
            precise const float s = half_at(at) * float(sc);
            precise const float m = half_at(at + 2u) * float(mn);
            precise const float sda = s * dab;
            precise const float dsum = dab * float(sum);
            acc = fma_once(float(c), sda, acc);
            acc = fma_once(-m, dsum, acc);
        } else {
            // q6_K: 210-byte blocks of 256 (128 bytes of low nibbles, 64 of high bit pairs, 16 signed
            // scales, d); slots of 16: weight d·scale·(q - 32)
            const uint at = r * p.row_bytes + (b / 8u) * 210u;
            const float d = half_at(at + 208u);
            for (uint k = 0u; k < 2u; k++) {
                int c = 0;
                const uint j0 = (b % 8u) * 32u + k * 16u;
                for (uint j = j0; j < j0 + 16u; j++) {
                    const uint hf = j / 128u, qd = (j % 128u) / 32u, l = j % 32u;
                    uint lo = byte_at(at + 64u * hf + l + ((qd & 1u) != 0u ? 32u : 0u));
                    lo = qd >= 2u ? lo >> 4 : lo & 0xFu;
                    const int q = int(lo | (((byte_at(at + 128u + 32u * hf + l) >> (2u * qd)) & 3u) << 4)) - 32;
                    c += q * codes[a0 + (j - j0) + k * 16u];
                }
                precise const float s = d * float(bitfieldExtract(int(byte_at(at + 192u + j0 / 16u)), 0, 8));
                precise const float sda = s * dab;
                acc = fma_once(float(c), sda, acc);
            }
        }
    }
    y[t * p.rows + r] = acc;
}
