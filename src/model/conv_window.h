/* The causal convolutions' window, shared by DeltaNet (deltanet.c, whose convolution Mamba-2 also
 * runs) and LFM2's short convolutions (shortconv.c): the same walk with another input and another
 * output. A sequence's window is its last K - 1 inputs, kept in the recurrent state per channel
 * ([channel][K - 1], oldest first).
 *
 * The fast pass takes a block of up to CONV_BLOCK channels at a time with its taps and window
 * transposed ([tap][channel]) so that the channels are one vector loop, and a ring (`head`: the
 * oldest input) replaces the shifting of each window. Per channel the sum runs over the taps in
 * order, from the oldest input, the token's own last: the float64 pass's order. */
#ifndef QUILL_CONV_WINDOW_H
#define QUILL_CONV_WINDOW_H

#include <stdint.h>
#include <string.h>

/* Channels of one convolution item. */
#define CONV_BLOCK 64

/* Taps [0, K) of channels [ch0, ch0 + n) from the [channel][K] weights. */
static inline void conv_block_taps(float (*taps)[CONV_BLOCK], const float *weights, int64_t K, int64_t ch0, int64_t n) {
    for (int64_t i = 0; i < K; i++)
        for (int64_t ch = 0; ch < n; ch++) taps[i][ch] = weights[(ch0 + ch) * K + i];
}

/* The W = K - 1 inputs of the block's window from the state (its channels' [W] runs). */
static inline void conv_ring_load(float (*ring)[CONV_BLOCK], const float *state, int64_t W, int64_t n) {
    for (int64_t i = 0; i < W; i++)
        for (int64_t ch = 0; ch < n; ch++) ring[i][ch] = state[ch * W + i];
}

/* sum = Σ_i window[i] · taps[i], then + input · taps[W]: one token's convolution. */
static inline void conv_ring_sum(float *sum, float (*ring)[CONV_BLOCK], float (*taps)[CONV_BLOCK],
                                 int64_t head, int64_t W, const float *input, int64_t n) {
    for (int64_t ch = 0; ch < n; ch++) sum[ch] = 0.0f;
    for (int64_t i = 0; i < W; i++) {
        const float *in = ring[(head + i) % W], *w = taps[i];
        for (int64_t ch = 0; ch < n; ch++) sum[ch] += in[ch] * w[ch];
    }
    for (int64_t ch = 0; ch < n; ch++) sum[ch] += input[ch] * taps[W][ch];
}

/* The token's input joins the window in place of the oldest. */
static inline void conv_ring_push(float (*ring)[CONV_BLOCK], int64_t *head, int64_t W, const float *input, int64_t n) {
    if (W == 0) return;
    memcpy(ring[*head], input, (size_t)n * sizeof(float));
    *head = (*head + 1) % W;
}

/* The window back into the state, oldest first. */
static inline void conv_ring_store(float *state, float (*ring)[CONV_BLOCK], int64_t head, int64_t W, int64_t n) {
    for (int64_t i = 0; i < W; i++)
        for (int64_t ch = 0; ch < n; ch++) state[ch * W + i] = ring[(head + i) % W][ch];
}

/* The float64 pass's step for one channel: Σ_i state[i] · w[i] + input · w[K - 1], then the input
 * joins the state ([K - 1], oldest first). */
static inline double conv_ref_step(double *state, const float *w, int64_t K, double input) {
    double sum = 0;
    for (int64_t i = 0; i < K - 1; i++) sum += state[i] * w[i];
    sum += input * w[K - 1];
    for (int64_t i = 0; i + 1 < K - 1; i++) state[i] = state[i + 1];
    if (K > 1) state[K - 2] = input;
    return sum;
}

#endif
