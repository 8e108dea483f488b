/* Compute kernels, one table per instruction set, one entry per tensor type.
 *
 * The sets, fastest first: amx, vnni, avx512, avxvnni, avx2 and scalar on x86-64; i8mm, dotprod and
 * scalar on aarch64 (kernels.c builds them from what the CPU offers; $QUILL_ISA forces one). By
 * default a matrix-vector or matrix-matrix product is computed row by row: the weight row is
 * dequantized to f32 (bit-identical to the type's to_float), then dotted with every token's
 * activations in f32; that is all the scalar set does.
 * The others replace it for q4_0/q4_1/q5_0/q5_1/q8_0/q4_K/q5_K/q6_K with whole-matrix products on
 * integer activation codes (bf16 precision) and exact integer sums, which exact_scalar.c defines
 * and every set reproduces bit for bit: avx2 and avx512 on AVX2 (kernels_avx2_exact.c), vnni and
 * amx on AVX-512 VNNI and the tile unit (kernels_vnni.c, kernels_vnni_pack.c, kernels_amx.c, with
 * exact_avx512.h), dotprod and i8mm on NEON (src/kernels/arm/: every exact type, one loop); the
 * low-bit types (mxfp4, tq1_0, tq2_0, q1_0, q2_0, the grid i-quants) and iq4_nl, iq4_xs by the
 * unpacking kernels of exact_unpacked.h on AVX2 and AVX-512 (the vnni set packs mxfp4 and iq4 at
 * load and multiplies them as it does q4_0, kernels_vnni_pack.c). Float weights (f32, f16, bf16)
 * keep the row path's arithmetic, but avx2 and avx512 run it a whole matrix at a time (panels of
 * rows against several tokens, the bits of dequantize + dot). The per-type lists come from
 * tensor/type_list.h. Either way each (row, token)
 * result runs the same arithmetic whatever the batch size or thread count, which is what makes
 * results batch- and thread-invariant. */
#ifndef QUILL_KERNELS_H
#define QUILL_KERNELS_H

#include "quill.h"

/* Dequantizes one row of n elements (a multiple of the block size) to f32. Rows are only
 * assumed 2-byte aligned (4 for f32), which GGUF data always is: every block size is even. */
typedef void (*quill_row_dequant_fn)(const void *src, float *dst, int64_t n);

/* out[t * out_stride] = dot(w[0..n), x[t * x_stride + 0..n)) for t < n_tok. */
typedef void (*quill_dot_fn)(const float *w, const float *x, int64_t n, int n_tok, int64_t x_stride,
                             float *out, int64_t out_stride);

/* Attention for the n_heads query heads that share one key/value head.
 *
 * out[h * out_stride + d] = Σ_p wgt[h * wgt_stride + p] · v[p * stride + d] for h < n_heads,
 * d < n: each (head, d) a chain of fused multiply-adds over p in order, so every instruction set
 * gives the same bits (heads are batched only to reuse the loads of v and overlap the chains):
 * attention's weighted sum of values. With `accumulate` the chains start from the values in out
 * instead of zero, so that rows can be summed a block at a time with the same bits. */
typedef void (*quill_weighted_sum_fn)(const float *wgt, int64_t wgt_stride, int n_heads, const float *v, int n_rows,
                                      int64_t stride, int64_t n, float *out, int64_t out_stride, bool accumulate);

/* out[h * out_stride + p] = Σ_d q[h * q_stride + d] · kt[d * stride + p] for h < n_heads,
 * p < n_cols, d < n: dot products with the columns of a transposed matrix (attention's scores
 * against a key cache stored dimension-major), each a chain of fused multiply-adds in d order, so
 * every instruction set gives the same bits. */
typedef void (*quill_dot_columns_fn)(const float *q, int64_t q_stride, int n_heads, const float *kt, int64_t n,
                                     int64_t stride, int n_cols, float *out, int64_t out_stride);

/* The KV cache's key blocks (model/kv_cache.h): QUILL_KEY_BLOCK positions of one head, dimension-
 * major. A key block decoder writes tile[d * QUILL_KEY_BLOCK + p] = code(d, p) · scale(d / 32, p)
 * for d < hd (a multiple of 32), p < QUILL_KEY_BLOCK: the f32 value, (float)code times the f16
 * scale, as the type's to_float computes it, so every set gives the same bits. */
#define QUILL_KEY_BLOCK 64
typedef void (*quill_key_block_fn)(const uint8_t *block, int64_t hd, float *tile);

/* x[p] = e^(s·x[p] - m) / Σ_p' e^(s·x[p'] - m) for p < n, with m the largest s·x[p]:
 * attention's softmax. Every instruction set gives the same bits: the exponential of exp_poly.h
 * and the sum as 16 partial sums (p mod 16, in p order) added pairwise 8, 4, 2, 1 apart. */
typedef void (*quill_softmax_fn)(float *x, int n, float s);

/* gate[i] = silu(gate[i]) · up[i] = gate[i] / (1 + e^-gate[i]) · up[i] for i < n: the feed-forward
 * gate, with exp_poly.h's exponential and then one IEEE add, divide and multiply, so every
 * instruction set gives the same bits. */
typedef void (*quill_swiglu_fn)(float *gate, const float *up, int64_t n);

/* out[r] = Σ_i w[r·w_stride + i] · x[i] in float64, for r < rows: the mixture-of-experts router's
 * logits (model/ffn_moe.c). Element i goes to partial sum i mod 8, in i order, and the eight are
 * added ((0+1)+(2+3))+((4+5)+(6+7)). A product of two floats is exact in float64, so fused or not
 * the steps round alike: every instruction set, and the GPU's router (gpu/vulkan/shaders/
 * route_logits.comp), gives the same bits, and the router adds no rounding of its own to the
 * choice of experts beyond float64's. */
typedef void (*quill_dot_f64_fn)(const float *w, int64_t w_stride, int rows, const float *x, int64_t n, double *out);

/* The Gated DeltaNet delta rule of one value head over n_tok tokens of one sequence, in order, on
 * its state of s x s floats (row j: the state's column for value j). For token t (its q, k at
 * t * qk_stride, v at t * v_stride, decay and beta at t * gate_stride, output at t * out_stride),
 * every row j: m = row · decay; δ = (v[j] − m·k) · beta; row = m + k δ (fused); out[j] = (row·q) ·
 * scale. Each dot product is 8 chains of fused multiply-adds (element i in chain i mod 8, in i
 * order) added pairwise 4, 2, 1 apart, so every instruction set gives the same bits; a row depends
 * on nothing but itself, so a set may run the rows in any order (the tokens of a row in order). */
typedef void (*quill_delta_rule_fn)(float *state, int64_t s, int n_tok, const float *q, const float *k,
                                    int64_t qk_stride, const float *v, int64_t v_stride, const float *decay,
                                    const float *beta, int64_t gate_stride, float scale, float *out,
                                    int64_t out_stride);
/* The plain version, the model of every set's (kernels_scalar.c). */
void quill_delta_rule_scalar(float *state, int64_t s, int n_tok, const float *q, const float *k, int64_t qk_stride,
                             const float *v, int64_t v_stride, const float *decay, const float *beta,
                             int64_t gate_stride, float scale, float *out, int64_t out_stride);

/* The same products straight from a quantized row: out[t * out_stride] = dot(row, x_t). Each
 * fused kernel unpacks weights into registers exactly as its dequantizer would and accumulates in
 * the same order as `dot`, so its results are bit-identical to dequant + dot (tests check this);
 * it only saves the round trip through memory. */
typedef void (*quill_vec_dot_fn)(const void *row, const float *x, int64_t n, int n_tok, int64_t x_stride,
                                 float *out, int64_t out_stride);

/* A matrix of `rows` rows (row_bytes apart) and where its products go: y[t * rows + r] = W[r] · x[t]. */
typedef struct {
    const void *w;
    size_t row_bytes;
    int64_t rows;
    float *y;
} quill_matrix;

/* Optional whole-matrix products of one input: for each of the n_mats (1..QUILL_MATMUL_MAX_MATS)
 * matrices m[i], all of one type and `cols` columns, m[i].y[t * rows + r] = W[r] · x[t] for
 * r < rows, t < n_tok. The input is prepared once for all of them (q, k and v share theirs, gate
 * and up theirs) and their rows form one parallel loop; the kernel splits the work over the pool
 * (NULL: the caller's thread only) and uses `scratch`, at least matmul_scratch(cols, n_tok) bytes.
 * A (row, token) result must not depend on n_tok, on the thread count or on the other matrices
 * of the call. */
struct quill_pool;
#define QUILL_MATMUL_MAX_MATS 4
typedef void (*quill_matmul_fn)(const quill_matrix *m, int n_mats, int64_t cols, const float *x, int n_tok,
                                struct quill_pool *pool, void *scratch);

typedef struct quill_kernels {
    const char *isa;
    quill_dot_fn dot;
    quill_weighted_sum_fn weighted_sum;
    quill_dot_columns_fn dot_columns;
    quill_softmax_fn softmax;
    quill_swiglu_fn swiglu;
    quill_key_block_fn key_block_q8_0, key_block_q4_0;
    quill_delta_rule_fn delta_rule;
    quill_dot_f64_fn dot_f64;
    quill_row_dequant_fn dequant[QUILL_TYPE_COUNT]; /* NULL entries fall back to to_float */
    quill_vec_dot_fn vec_dot[QUILL_TYPE_COUNT];     /* NULL: dequantize the row, then dot */
    quill_matmul_fn matmul[QUILL_TYPE_COUNT];       /* NULL: row by row with vec_dot / dot */
    size_t (*matmul_scratch)(int64_t cols, int n_tok); /* set when any matmul entry is */

    /* Optional load-time layout. Decoding streams every weight once per token, and the file's
     * row-major blocks make a tile of 16 rows 16 strided streams with its scales scattered among
     * the codes; a set may instead read a copy made once, at load, in the order its loops consume
     * it (kernels_vnni_pack.c describes the vnni set's). For a type with pack_bytes() > 0 the
     * model packs each weight matrix and multiplies it with matmul_packed[type], whose results are
     * those of matmul[type] on the original rows, bit for bit. */
    const char *packed_layout; /* NULL: none; weights packed for one set serve any set of this name */
    size_t (*pack_bytes)(uint32_t type, int64_t rows, int64_t cols); /* 0: the type is not packed */
    /* packs tiles [tile0, tile1) (16 rows each) of a matrix into dst, a pack_bytes() buffer,
     * 64-byte aligned; the last tile's missing rows are zero */
    void (*pack)(uint32_t type, const void *w, size_t row_bytes, int64_t rows, int64_t cols, void *dst,
                 int64_t tile0, int64_t tile1);
    quill_matmul_fn matmul_packed[QUILL_TYPE_COUNT]; /* m->w is the packed copy; row_bytes unused */
} quill_kernels;

/* Rows per tile of the packed layouts. */
#define QUILL_PACK_ROWS 16

/* The fastest kernels this CPU runs: amx > vnni > avx512 > avxvnni > avx2 > scalar, or i8mm > dotprod >
 * scalar. */
const quill_kernels *quill_kernels_best(void);
/* The kernels of one set by name, or NULL when the name is unknown or this CPU lacks the set. */
const quill_kernels *quill_kernels_for(const char *isa);
/* The set a context computes with: the one $QUILL_ISA names, else the fastest. A name that is no
 * set, or a set this CPU lacks, is an error (QUILL_E_ARG) whose message names the sets it offers. */
quill_status quill_kernels_choose(const quill_kernels **out, quill_error *err);
/* The plain C versions every fast kernel is tested against. */
const quill_kernels *quill_kernels_scalar(void);
/* The row dequantizer of a kernel set for a type (its own, or the type's to_float). */
quill_row_dequant_fn quill_kernels_dequant(const quill_kernels *k, uint32_t type);

/* A row's dot_f64 from its partial sums over the columns before `from` (a multiple of 8): the
 * columns from..n added to them, then the eight added in dot_f64's order (kernels_scalar.c; the
 * vector sets finish their rows with it). */
double quill_dot_f64_finish(double part[8], const float *w, const float *x, int64_t from, int64_t n);

/* The scalar weighted sum, which SIMD versions use for widths they do not cover. */
void quill_weighted_sum_scalar(const float *wgt, int64_t wgt_stride, int n_heads, const float *v, int n_rows,
                               int64_t stride, int64_t n, float *out, int64_t out_stride, bool accumulate);

/* The instruction-set files (built with their ISA flags, on x86-64 only) fill in their entries of
 * a table that kernels.c builds, and only on a CPU that has the set: avx2 and avx512 over the
 * scalar set, each with the AVX2 exact products; vnni and amx over the avx512 set. */
void quill_kernels_install_avx2(quill_kernels *k);
void quill_kernels_install_avx512(quill_kernels *k);
void quill_kernels_install_avx2_exact(quill_kernels *k);
/* The avx2 set's products from the vnni set's load-time layout (kernels_avx2_exact.c). */
void quill_kernels_install_avx2_packed(quill_kernels *k);
/* The avxvnni set: the avx2 set with kernels_avx2_exact.c's products (packed ones included) built
 * for AVX-VNNI. */
void quill_kernels_install_avxvnni_exact(quill_kernels *k);
void quill_kernels_install_vnni(quill_kernels *k);
void quill_kernels_install_amx(quill_kernels *k);
/* The recurrent layers' kernels on AVX2 (kernels_recurrent_avx2.c), for the avx2 and avx512 sets. */
void quill_kernels_install_recurrent_avx2(quill_kernels *k);
/* aarch64 (src/kernels/arm/, built with their flags on aarch64 only): the f32 kernels in NEON
 * (kernels_neon.c) for both sets, then the exact products with sdot (dotprod set,
 * kernels_dotprod.c) or smmla (i8mm set, over the dotprod set: kernels_i8mm.c). */
void quill_kernels_install_neon(quill_kernels *k);
void quill_kernels_install_dotprod(quill_kernels *k);
void quill_kernels_install_i8mm(quill_kernels *k);

#endif
