#version 450
// Per token (one workgroup each): x += add (when has_add), then out = rmsnorm(x) · weight (when
// has_out), as forward.c's add_and_norm: the squares in eight partial sums in double (element i in
// sum i mod 8, the tail in sum 0), added ((0+1)+(2+3))+((4+5)+(6+7)), the scale 1/sqrt(sum/n + eps)
// rounded to f32, then (x · scale) · w rounded twice. Every step is the CPU's, so the bits are its
// own where the device's double division and square root are correctly rounded (lavapipe's are).
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Add { float add[]; };
layout(std430, binding = 2) readonly buffer Weight { float weight[]; };
layout(std430, binding = 3) writeonly buffer Out { float outv[]; };
// eps: the model's double, as two words (low, high)
layout(push_constant) uniform Params { uint d; uint n_tok; uint has_add; uint has_out; uint eps_lo; uint eps_hi; } p;

shared double s_part[8];
shared float s_scale;

void main() {
    const uint t = gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x, lane = gl_LocalInvocationID.x;
    if (t >= p.n_tok) return;
    const uint base = t * p.d;
    if (p.has_add != 0u) {
        for (uint i = lane; i < p.d; i += 64u) {
            precise const float v = x[base + i] + add[base + i];
            x[base + i] = v;
        }
        memoryBarrierBuffer();
        barrier();
    }
    if (p.has_out == 0u) return;
    const uint whole = p.d / 8u * 8u;
    if (lane < 8u) {
        precise double s = 0.0;
        for (uint i = lane; i < whole; i += 8u) {
            const double v = double(x[base + i]);
            s += v * v;
        }
        if (lane == 0u)
            for (uint i = whole; i < p.d; i++) {
                const double v = double(x[base + i]);
                s += v * v;
            }
        s_part[lane] = s;
    }
    barrier();
    if (lane == 0u) {
        precise const double sum = ((s_part[0] + s_part[1]) + (s_part[2] + s_part[3])) +
                                   ((s_part[4] + s_part[5]) + (s_part[6] + s_part[7]));
        precise const double r = 1.0 / sqrt(sum / double(p.d) + packDouble2x32(uvec2(p.eps_lo, p.eps_hi)));
        s_scale = float(r);
    }
    barrier();
    const float scale = s_scale;
    for (uint i = lane; i < p.d; i += 64u) {
        precise const float v = (x[base + i] * scale) * weight[i];
        outv[base + i] = v;
    }
}
