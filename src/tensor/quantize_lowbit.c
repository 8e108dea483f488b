/* Quantizers of the low-bit types the reference writes without an importance matrix: q1_0, q2_0,
 * mxfp4, tq1_0 and tq2_0. Each makes the reference's choices with the reference's float
 * operations, in its order, so that the same F32 rows give the same bytes (tests compare whole
 * files with the reference quantizer's). */
#include "tensor/types_internal.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>

/* No fused multiply-add, as in quantize.c. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

/* q1_0: d is the mean magnitude of the block; one bit per weight, set for x >= 0. */
void quill_from_float_q1_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK1_0, dst += sizeof(block_q1_0)) {
        block_q1_0 b;
        float sum_abs = 0.0f;
        for (int j = 0; j < QK1_0; j++) sum_abs += fabsf(x[j]);
        b.d = quill_f32_to_f16(sum_abs / QK1_0);
        memset(b.qs, 0, sizeof b.qs);
        for (int j = 0; j < QK1_0; j++)
            if (x[j] >= 0.0f) b.qs[j / 8] |= (uint8_t)(1u << (j % 8));
        memcpy(dst, &b, sizeof b);
    }
}

/* q2_0: d is the block's largest magnitude; codes round(x / d) + 1, clamped to 0..3. */
void quill_from_float_q2_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK2_0, dst += sizeof(block_q2_0)) {
        block_q2_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK2_0; j++)
            if (fabsf(x[j]) > amax) amax = fabsf(x[j]);
        const float id = amax > 0.0f ? 1.0f / amax : 0.0f;
        b.d = quill_f32_to_f16(amax);
        memset(b.qs, 0, sizeof b.qs);
        for (int j = 0; j < QK2_0; j++) {
            int q = (int)roundf(x[j] * id) + 1;
            q = q < 0 ? 0 : q > 3 ? 3 : q;
            b.qs[j / 4] |= (uint8_t)(q << (2 * (j % 4)));
        }
        memcpy(dst, &b, sizeof b);
    }
}

/* The fp4 level nearest to x at (half) scale d; the first of equals wins, so 0 codes as +0. */
static uint8_t nearest_fp4(float x, float d) {
    int best = 0;
    float best_err = fabsf((float)quill_kvalues_fp4[0] * d - x);
    for (int i = 1; i < 16; i++) {
        const float e = fabsf((float)quill_kvalues_fp4[i] * d - x);
        if (e < best_err) best = i, best_err = e;
    }
    return (uint8_t)best;
}

/* mxfp4: the shared exponent puts the block's largest magnitude among the top fp4 levels
 * (floor(log2 amax) - 2, biased by 127), then each weight takes its nearest level. */
void quill_from_float_mxfp4(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, x += QK_MXFP4, dst += sizeof(block_mxfp4)) {
        block_mxfp4 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_MXFP4; j++)
            if (amax < fabsf(x[j])) amax = fabsf(x[j]);
        /* through int: the reference converts the float straight to a byte, which x86 does this way */
        b.e = amax > 0.0f ? (uint8_t)(int)(floorf(log2f(amax)) - 2 + 127) : 0;
        const float d = quill_e8m0_half_to_float(b.e);
        for (int j = 0; j < QK_MXFP4 / 2; j++)
            b.qs[j] = (uint8_t)(nearest_fp4(x[j], d) | nearest_fp4(x[j + QK_MXFP4 / 2], d) << 4);
        memcpy(dst, &b, sizeof b);
    }
}

/* A ternary code, -1, 0 or 1 as 0, 1, 2. */
static inline int trit(float x, float id) { return (int)lroundf(x * id) + 1; }

/* n trits, the first most significant, as a base-3 fraction of 256 rounded up (so that
 * tq1_trit's multiply-and-shift reads them back). */
static uint8_t pack_trits(const float *x, int n, int stride, float id, bool shift_one) {
    int q = 0;
    for (int k = 0; k < n; k++) q = q * 3 + trit(x[k * stride], id);
    if (shift_one) q *= 3;
    return (uint8_t)((q * 256 + (243 - 1)) / 243);
}

void quill_from_float_tq1_0(const float *x, uint8_t *dst, int64_t nb) {
    enum { QS = sizeof(((block_tq1_0 *)0)->qs), QH = sizeof(((block_tq1_0 *)0)->qh) };
    for (int64_t i = 0; i < nb; i++, dst += sizeof(block_tq1_0)) {
        block_tq1_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        b.d = quill_f32_to_f16(amax);
        /* five trits per byte: 32 bytes over 160 weights, then 16 bytes over 80 */
        for (int j = 0; j < QS - QS % 32; j += 32, x += 5 * 32)
            for (int m = 0; m < 32; m++) b.qs[j + m] = pack_trits(x + m, 5, 32, id, false);
        for (int j = QS - QS % 32; j < QS; j += 16, x += 5 * 16)
            for (int m = 0; m < 16; m++) b.qs[j + m] = pack_trits(x + m, 5, 16, id, false);
        /* four per byte for the last 16 weights, shifted up one trit */
        for (int j = 0; j < QH; j++) b.qh[j] = pack_trits(x + j, 4, QH, id, true);
        x += 4 * QH;
        memcpy(dst, &b, sizeof b);
    }
}

void quill_from_float_tq2_0(const float *x, uint8_t *dst, int64_t nb) {
    for (int64_t i = 0; i < nb; i++, dst += sizeof(block_tq2_0)) {
        block_tq2_0 b;
        float amax = 0.0f;
        for (int j = 0; j < QK_K; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]);
        const float id = amax != 0.0f ? 1.0f / amax : 0.0f;
        b.d = quill_f32_to_f16(amax);
        for (int j = 0; j < QK_K / 4; j += 32, x += 4 * 32)
            for (int m = 0; m < 32; m++) {
                int q = 0;
                for (int n = 0; n < 4; n++) q += (trit(x[m + n * 32], id) & 3) << (2 * n);
                b.qs[j + m] = (uint8_t)q;
            }
        memcpy(dst, &b, sizeof b);
    }
}

/* ---------------------------------------------------------------- iq3_s
 *
 * Each group of 4 weights must be a point of the 512-point lattice (iq_grids.c): magnitudes
 * 2l + 1, l = 0..7, so a point is a 12-bit code of four 3-bit l. The search rounds a group to the
 * nearest code; a code off the lattice is replaced by the best of its nearest lattice points, as
 * the reference does: its neighbour list holds every lattice point within the three smallest
 * squared distances, nearest first (ties by index), which the search scans in order. */

enum { IQ3S_CODES = 4096, IQ3S_POINTS = 512, IQ3S_MAX_NEIGHBOURS = 64 };

typedef struct {
    int16_t point[IQ3S_CODES]; /* lattice index of a code, -1 off the lattice */
    uint8_t n_near[IQ3S_CODES];
    uint16_t near[IQ3S_CODES][IQ3S_MAX_NEIGHBOURS];
    bool ok;
} iq3s_neighbours;

static iq3s_neighbours iq3s_table;

static int compare_distance(const void *a, const void *b) {
    const int *l = a, *r = b;
    return l[0] < r[0] ? -1 : l[0] > r[0] ? 1 : l[1] < r[1] ? -1 : l[1] > r[1] ? 1 : 0;
}

static inline int iq3s_level(uint32_t point, int i) { return (int)((point >> (8 * i)) & 0xFF); }

static void iq3s_build(void) {
    iq3s_neighbours *t = &iq3s_table;
    for (int u = 0; u < IQ3S_CODES; u++) t->point[u] = -1;
    for (int j = 0; j < IQ3S_POINTS; j++) {
        int u = 0;
        for (int i = 0; i < 4; i++) u |= ((iq3s_level(quill_iq3s_grid[j], i) - 1) / 2) << (3 * i);
        t->point[u] = (int16_t)j;
    }
    t->ok = true;
    static int dist[IQ3S_POINTS][2];
    for (int u = 0; u < IQ3S_CODES; u++) {
        if (t->point[u] >= 0) continue;
        for (int j = 0; j < IQ3S_POINTS; j++) {
            int d2 = 0;
            for (int i = 0; i < 4; i++) {
                const int diff = iq3s_level(quill_iq3s_grid[j], i) - (2 * ((u >> (3 * i)) & 7) + 1);
                d2 += diff * diff;
            }
            dist[j][0] = d2;
            dist[j][1] = j;
        }
        qsort(dist, IQ3S_POINTS, sizeof dist[0], compare_distance);
        int n = 0, distinct = 1, d2 = dist[0][0];
        for (int j = 0; j < IQ3S_POINTS; j++) {
            if (dist[j][0] > d2) {
                if (distinct == 3) break;
                d2 = dist[j][0];
                distinct++;
            }
            if (n == IQ3S_MAX_NEIGHBOURS) {
                t->ok = false; /* cannot happen with this lattice (tests quantize every code) */
                break;
            }
            t->near[u][n++] = (uint16_t)dist[j][1];
        }
        t->n_near[u] = (uint8_t)n;
    }
}

bool quill_iq3s_ready(void) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, iq3s_build);
    return iq3s_table.ok;
}

static inline int round_even(float v) {
    float biased = v + 12582912.0f;
    int32_t bits;
    memcpy(&bits, &biased, sizeof bits);
    return (bits & 0x007FFFFF) - 0x00400000;
}

/* The neighbour of code u nearest to x (weighted) at `scale`; writes its levels to L. */
static int iq3s_best_neighbour(int u, const float *x, const float *w, float scale, int8_t *L) {
    float best_d2 = FLT_MAX;
    int best = -1;
    for (int n = 0; n < iq3s_table.n_near[u]; n++) {
        const uint32_t p = quill_iq3s_grid[iq3s_table.near[u][n]];
        float d2 = 0;
        for (int i = 0; i < 4; i++) {
            const float diff = scale * (float)iq3s_level(p, i) - x[i];
            d2 += w[i] * diff * diff;
        }
        if (d2 < best_d2) best_d2 = d2, best = iq3s_table.near[u][n];
    }
    for (int i = 0; i < 4; i++) L[i] = (int8_t)((iq3s_level(quill_iq3s_grid[best], i) - 1) / 2);
    return best;
}

static inline int iq3s_code(const int8_t *L) { return L[0] | L[1] << 3 | L[2] << 6 | L[3] << 9; }

/* One sub-block of 32: its levels L (0..7 per weight), sign bytes and scale (>= 0); *zero when
 * every weight is 0. */
static float iq3s_sub_block(const float *xb, int8_t L[32], uint8_t signs[4], bool *zero) {
    enum { KMAX = 8 };
    float weight[32], waux[32], xval[32];
    int8_t Laux[32];
    bool on_grid[8], on_grid_aux[8];
    for (int i = 0; i < 32; i++) weight[i] = xb[i] * xb[i];
    for (int i = 0; i < 32; i++) waux[i] = sqrtf(weight[i]);
    for (int k = 0; k < 4; k++) {
        uint8_t s = 0;
        for (int i = 0; i < 8; i++) {
            if (xb[8 * k + i] >= 0) xval[8 * k + i] = xb[8 * k + i];
            else xval[8 * k + i] = -xb[8 * k + i], s |= (uint8_t)(1 << i);
        }
        signs[k] = s;
    }
    float max = xval[0];
    for (int i = 1; i < 32; i++) max = max > xval[i] ? max : xval[i];
    memset(L, 0, 32);
    *zero = !max;
    if (!max) return 0;
    float best = 0, scale = max / (2 * KMAX - 1);
    for (int k = 0; k < 8; k++) on_grid[k] = false;
    /* 19 trial scales around max / 15, each rounded to the lattice; the best fit wins */
    for (int is = -9; is <= 9; is++) {
        const float id = ((float)(2 * KMAX - 1) + (float)is * 0.2f) / max, this_scale = 1 / id;
        for (int k = 0; k < 8; k++) {
            for (int i = 0; i < 4; i++) {
                const int l = round_even(0.5f * (id * xval[4 * k + i] - 1));
                Laux[4 * k + i] = (int8_t)(l < 0 ? 0 : l > KMAX - 1 ? KMAX - 1 : l);
            }
            const int u = iq3s_code(Laux + 4 * k);
            on_grid_aux[k] = iq3s_table.point[u] >= 0;
            if (!on_grid_aux[k]) iq3s_best_neighbour(u, xval + 4 * k, waux + 4 * k, this_scale, Laux + 4 * k);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < 32; i++) {
            const float w = weight[i], q = (float)(2 * Laux[i] + 1);
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
            scale = sumqx / sumq2;
            best = scale * sumqx;
            memcpy(L, Laux, 32);
            memcpy(on_grid, on_grid_aux, sizeof on_grid);
        }
    }
    int off_grid = 0;
    for (int k = 0; k < 8; k++) off_grid += !on_grid[k];
    if (off_grid > 0 && scale > 0) {
        /* groups whose best trial fell off the lattice: once more at the final scale */
        const float id = 1 / scale;
        for (int k = 0; k < 8; k++) {
            int8_t l4[4];
            for (int i = 0; i < 4; i++) {
                const int l = round_even(0.5f * (id * xval[4 * k + i] - 1));
                l4[i] = (int8_t)(l < 0 ? 0 : l > KMAX - 1 ? KMAX - 1 : l);
            }
            const int u = iq3s_code(l4);
            int p = iq3s_table.point[u];
            if (p < 0) p = iq3s_best_neighbour(u, xval + 4 * k, waux + 4 * k, scale, L + 4 * k);
            for (int i = 0; i < 4; i++) L[4 * k + i] = (int8_t)((iq3s_level(quill_iq3s_grid[p], i) - 1) / 2);
        }
        float sumqx = 0, sumq2 = 0;
        for (int i = 0; i < 32; i++) {
            const float w = weight[i], q = (float)(2 * L[i] + 1);
            sumqx += w * xval[i] * q;
            sumq2 += w * q * q;
        }
        if (sumq2 > 0) scale = sumqx / sumq2;
    }
    if (scale < 0) {
        scale = -scale;
        for (int k = 0; k < 4; k++) signs[k] = (uint8_t)~signs[k];
    }
    return scale;
}

void quill_from_float_iq3_s(const float *x, uint8_t *dst, int64_t nb) {
    if (!quill_iq3s_ready()) return; /* unreachable: the table always fits (tests build it) */
    for (int64_t ibl = 0; ibl < nb; ibl++, x += QK_K, dst += sizeof(block_iq3_s)) {
        block_iq3_s b;
        memset(&b, 0, sizeof b);
        float scales[QK_K / 32], max_scale = 0;
        /* An all-zero sub-block writes nothing and does not advance qs and signs, so the next
         * sub-block's codes and signs land in its place: the reference's layout, kept for its bytes. */
        uint8_t *qs = b.qs, *signs = b.signs;
        for (int ib = 0; ib < QK_K / 32; ib++) {
            int8_t L[32];
            uint8_t s4[4];
            bool zero;
            scales[ib] = iq3s_sub_block(x + 32 * ib, L, s4, &zero);
            if (zero) continue;
            for (int k = 0; k < 8; k++) {
                const int p = iq3s_table.point[iq3s_code(L + 4 * k)];
                qs[k] = (uint8_t)(p & 255);
                b.qh[ib] |= (uint8_t)((p >> 8) << k);
            }
            qs += 8;
            memcpy(signs, s4, 4);
            signs += 4;
            max_scale = max_scale > scales[ib] ? max_scale : scales[ib];
        }
        if (max_scale) {
            const float d = max_scale / 31;
            b.d = quill_f32_to_f16(d * 1.033f);
            const float id = 1 / d;
            for (int ib = 0; ib < QK_K / 32; ib += 2) {
                int l1 = round_even(0.5f * (id * scales[ib] - 1)), l2 = round_even(0.5f * (id * scales[ib + 1] - 1));
                l1 = l1 < 0 ? 0 : l1 > 15 ? 15 : l1;
                l2 = l2 < 0 ? 0 : l2 > 15 ? 15 : l2;
                b.scales[ib / 2] = (uint8_t)(l1 | l2 << 4);
            }
        }
        memcpy(dst, &b, sizeof b);
    }
}
