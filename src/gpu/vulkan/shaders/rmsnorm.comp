#version 450
// Per token (one workgroup each): x += add (when has_add), then out = rmsnorm(x) · weight (when
// has_out), as forward.c's add_and_norm: the squares in eight partial sums in double (element i in
// sum i mod 8, the tail in sum 0), added ((0+1)+(2+3))+((4+5)+(6+7)), the scale 1/sqrt(sum/n + eps)
// rounded to f32, then (x · scale) · w rounded twice (without has_weight x · scale: forward.c's
// value norms). With layer_norm, forward.c's layernorm instead: the sum and then the squares of
// x - mean in double, each in element order, mean and scale rounded to f32, ((x - mean) · scale) ·
// w. Every step is the CPU's, so the bits are its own where the device's double division and
// square root are correctly rounded (lavapipe's are).
layout(local_size_x = 128) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Add { float add[]; };
layout(std430, binding = 2) readonly buffer Weight { float weight[]; };
layout(std430, binding = 3) writeonly buffer Out { float outv[]; };
// eps: the model's double, as two words (low, high)
layout(push_constant) uniform Params {
    uint d; uint n_tok; uint has_add; uint has_out; uint eps_lo; uint eps_hi; uint layer_norm; uint has_weight;
} p;

// A token's row goes through shared memory CHUNK elements at a time: all the workgroup's
// invocations read it from the device's memory at once (a row of 2048 is 16 reads each, in flight
// together), then eight of them add the squares in the CPU's order from there. (With 64 invocations
// each reading its elements one after another, a token's norm took 24 us on an H200.)
const uint LANES = 128u, CHUNK = 2048u;
shared float s_x[CHUNK];
shared double s_part[8];
shared float s_scale, s_mean;

void main() {
    const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, lane = gl_LocalInvocationID.x;
    if (t >= p.n_tok) return;
    const uint base = t * p.d;
    const double eps = packDouble2x32(uvec2(p.eps_lo, p.eps_hi));
    if (p.has_out == 0u || p.layer_norm != 0u) {
        if (p.has_add != 0u) {
            for (uint i = lane; i < p.d; i += LANES) {
                precise const float v = x[base + i] + add[base + i];
                x[base + i] = v;
            }
            memoryBarrierBuffer();
            barrier();
        }
        if (p.has_out == 0u) return;
        if (lane == 0u) {
            precise double sum = 0.0LF;
            for (uint i = 0u; i < p.d; i++) sum = sum + double(x[base + i]);
            precise const double mean_d = sum / double(p.d);
            const float mean = float(mean_d);
            precise double var = 0.0LF;
            for (uint i = 0u; i < p.d; i++) {
                precise const float dx = x[base + i] - mean;
                var = var + double(dx) * double(dx);
            }
            precise const double r = 1.0LF / sqrt(var / double(p.d) + eps);
            s_mean = mean;
            s_scale = float(r);
        }
        barrier();
        const float mean = s_mean, scale = s_scale;
        for (uint i = lane; i < p.d; i += LANES) {
            precise const float v = ((x[base + i] - mean) * scale) * weight[i];
            outv[base + i] = v;
        }
        return;
    }
    // x += add (when has_add) and the squares: element i in partial sum i mod 8 in order for the
    // whole groups of 8, then the tail in sum 0
    const uint whole = p.d / 8u * 8u;
    precise double s = 0.0;
    for (uint c0 = 0u; c0 < p.d; c0 += CHUNK) {
        const uint n = min(CHUNK, p.d - c0);
        for (uint i = lane; i < n; i += LANES) {
            float v = x[base + c0 + i];
            if (p.has_add != 0u) {
                precise const float sum = v + add[base + c0 + i];
                x[base + c0 + i] = sum;
                v = sum;
            }
            s_x[i] = v;
        }
        barrier();
        if (lane < 8u) {
            for (uint i = lane; i < n && c0 + i < whole; i += 8u) {
                const double v = double(s_x[i]);
                s += v * v;
            }
            if (lane == 0u)
                for (uint i = c0 < whole ? whole - c0 : 0u; i < n; i++) {
                    const double v = double(s_x[i]);
                    s += v * v;
                }
        }
        barrier();
    }
    if (lane < 8u) s_part[lane] = s;
    // (a row longer than a chunk is read again below: this workgroup's writes to x first)
    memoryBarrierBuffer();
    barrier();
    if (lane == 0u) {
        precise const double sum = ((s_part[0] + s_part[1]) + (s_part[2] + s_part[3])) +
                                   ((s_part[4] + s_part[5]) + (s_part[6] + s_part[7]));
        precise const double r = 1.0 / sqrt(sum / double(p.d) + eps);
        s_scale = float(r);
    }
    barrier();
    const float scale = s_scale;
    const bool kept = p.d <= CHUNK;
    for (uint i = lane; i < p.d; i += LANES) {
        const float xi = kept ? s_x[i] : x[base + i];
        precise const float v = p.has_weight != 0u ? (xi * scale) * weight[i] : xi * scale;
        outv[base + i] = v;
    }
}
