#version 450
#extension GL_GOOGLE_include_directive : require
// A mixture-of-experts router's choice, one invocation per token, as model/ffn_moe.c's route()
// makes it, step for step in float64 (so the CPU's bits where the device's float64 arithmetic is
// IEEE's): the probabilities over all experts (softmax or sigmoid, with exp_f64) in place of the
// logits, the selection scores (plus the selection bias), the groups whose two best sum highest,
// the k best experts (highest first, the lower index on ties, never a NaN over a number), their
// weights (a softmax over the chosen ones; divided by their sum, floored; scaled; below the
// smallest normal float 0), written as the expert ids and f32 weights of the (token, slot) pairs.
layout(local_size_x = 64) in;
layout(std430, binding = 0) buffer Logits { double logit[]; };  // [token][expert], probabilities after
layout(std430, binding = 1) buffer Select { double sel[]; };    // [token][expert]: room for the scores
layout(std430, binding = 2) readonly buffer ProbsBias { float probs_bias[]; };
layout(std430, binding = 3) writeonly buffer Weights { float weights[]; }; // [token][slot]
layout(std430, binding = 4) writeonly buffer Ids { int ids[]; };           // [token][slot]
// gating: 0 softmax, 1 softmax over the chosen, 2 sigmoid; w_scale: a float's bits (0 or 1: none)
layout(push_constant) uniform Params {
    uint n_expert; uint k; uint n_tok; uint gating; uint has_probs_bias; uint n_group; uint n_group_used; uint norm_w;
    uint w_scale;
} p;

#include "exact_math.glsl"

const uint MAX_K = 64u, MAX_GROUPS = 64u;

// The n best of score[at + stride·i] for i < n into best[], as ffn_moe.c's top_k.
void top_k_select(uint at, uint n, uint k, inout int best[MAX_K]) {
    for (uint i = 0u; i < k; i++) {
        int b = -1;
        for (uint e = 0u; e < n; e++) {
            bool taken = false;
            for (uint j = 0u; j < i && !taken; j++) taken = best[j] == int(e);
            if (taken) continue;
            const double s = sel[at + e];
            if (b < 0 || s > sel[at + uint(b)] || (isnan(sel[at + uint(b)]) && !isnan(s))) b = int(e);
        }
        best[i] = b;
    }
}

void main() {
    const uint t = (gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x) * 64u + gl_LocalInvocationID.x;
    if (t >= p.n_tok) return;
    const uint n = p.n_expert, base = t * n;
    if (p.gating == 0u) {
        double mx = -packDouble2x32(uvec2(0u, 0x7FF00000u)), sum = 0.0LF;
        for (uint e = 0u; e < n; e++) mx = logit[base + e] > mx ? logit[base + e] : mx;
        for (uint e = 0u; e < n; e++) {
            precise const double v = exp_f64(logit[base + e] - mx);
            logit[base + e] = v;
            sum = sum + v;
        }
        for (uint e = 0u; e < n; e++) {
            precise const double v = logit[base + e] / sum;
            logit[base + e] = v;
        }
    } else if (p.gating == 2u) {
        for (uint e = 0u; e < n; e++) {
            precise const double v = 1.0LF / (1.0LF + exp_f64(-logit[base + e]));
            logit[base + e] = v;
        }
    }
    for (uint e = 0u; e < n; e++) {
        precise const double v = p.has_probs_bias != 0u ? logit[base + e] + double(probs_bias[e]) : logit[base + e];
        sel[base + e] = v;
    }
    if (p.n_group > 1u) {
        const uint per = n / p.n_group;
        double group_score[MAX_GROUPS];
        int two[MAX_K], kept[MAX_K];
        for (uint g = 0u; g < p.n_group; g++) {
            top_k_select(base + g * per, per, 2u, two);
            precise const double v = sel[base + g * per + uint(two[0])] + sel[base + g * per + uint(two[1])];
            group_score[g] = v;
        }
        // (the groups' top: the same loop over group_score)
        for (uint i = 0u; i < p.n_group_used; i++) {
            int b = -1;
            for (uint g = 0u; g < p.n_group; g++) {
                bool taken = false;
                for (uint j = 0u; j < i && !taken; j++) taken = kept[j] == int(g);
                if (taken) continue;
                if (b < 0 || group_score[g] > group_score[uint(b)] || (isnan(group_score[uint(b)]) && !isnan(group_score[g])))
                    b = int(g);
            }
            kept[i] = b;
        }
        for (uint g = 0u; g < p.n_group; g++) {
            bool keep = false;
            for (uint j = 0u; j < p.n_group_used && !keep; j++) keep = kept[j] == int(g);
            for (uint e = 0u; !keep && e < per; e++) sel[base + g * per + e] = -packDouble2x32(uvec2(0u, 0x7FF00000u));
        }
    }
    int expert[MAX_K];
    double weight[MAX_K];
    top_k_select(base, n, p.k, expert);
    for (uint i = 0u; i < p.k; i++) weight[i] = logit[base + uint(expert[i])];
    if (p.gating == 1u) {
        const double mx = weight[0];
        double sum = 0.0LF;
        for (uint i = 0u; i < p.k; i++) {
            precise const double v = exp_f64(weight[i] - mx);
            weight[i] = v;
            sum = sum + v;
        }
        for (uint i = 0u; i < p.k; i++) {
            precise const double v = weight[i] / sum;
            weight[i] = v;
        }
    }
    if (p.norm_w != 0u) {
        precise double sum = 0.0LF;
        for (uint i = 0u; i < p.k; i++) sum = sum + weight[i];
        // (ffn_moe.c's MIN_WEIGHT_SUM, the smallest normal f16)
        if (!(sum >= 6.103515625e-5LF)) sum = 6.103515625e-5LF;
        for (uint i = 0u; i < p.k; i++) {
            precise const double v = weight[i] / sum;
            weight[i] = v;
        }
    }
    const float scale = uintBitsToFloat(p.w_scale);
    if (scale != 0.0 && scale != 1.0)
        for (uint i = 0u; i < p.k; i++) {
            precise const double v = weight[i] * double(scale);
            weight[i] = v;
        }
    for (uint i = 0u; i < p.k; i++) {
        ids[t * p.k + i] = expert[i];
        weights[t * p.k + i] = abs(weight[i]) < packDouble2x32(uvec2(0u, 0x38100000u)) ? 0.0 : float(weight[i]);
    }
}
