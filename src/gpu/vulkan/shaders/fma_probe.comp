#version 450
// y[i] = fma(a, b, c) of the triples in x, with GLSL's fma as the device compiles it: vulkan.c's
// probe_fma compares the results with C's fmaf to learn whether that fma rounds once (NVIDIA's, AMD's
// and Intel's do; llvmpipe's is a multiply and an add), and so whether exact_math.glsl's fma_once may
// be it rather than its float64 steps.
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer X { float x[]; };
layout(std430, binding = 3) writeonly buffer Y { float y[]; };
layout(push_constant) uniform Params { uint n; } p;

void main() {
    const uint i = gl_GlobalInvocationID.x;
    if (i < p.n) y[i] = fma(x[3u * i], x[3u * i + 1u], x[3u * i + 2u]);
}
