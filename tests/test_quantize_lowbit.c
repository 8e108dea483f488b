/* Quantizing to the low-bit types: whole files byte-identical to the reference quantizer's
 * (run at test time on the same input), mxfp4 experts, and the refusal of the types that need an
 * importance matrix. */
#include "golden.h"
#include "test.h"

#include "quill.h"
#include "quill_quantize.h"
#include "tensor/types_internal.h"

static bool quill_iq3s_ready_for_tests(void) { return quill_iq3s_ready(); }

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Quantizes `in` with quill and with the reference's llama-quantize to `ftype` and compares the
 * two files byte for byte. */
static void check_against_reference_opts(const char *shared, const char *in, const char *ftype, bool pure) {
    char ref[512], ours[512], cmd[2048], upper[32];
    size_t n = strlen(ftype);
    for (size_t i = 0; i <= n && i < sizeof upper; i++)
        upper[i] = (char)(ftype[i] >= 'a' && ftype[i] <= 'z' ? ftype[i] - 'a' + 'A' : ftype[i]);
    snprintf(ref, sizeof ref, "%s/ref-%s.gguf", tmp_dir(), ftype);
    snprintf(ours, sizeof ours, "%s/quill-%s.gguf", tmp_dir(), ftype);
    snprintf(cmd, sizeof cmd, "%s/ref/bin/llama-quantize %s %s %s %s 2", shared, pure ? "--pure" : "", in, ref, upper);
    char *out = NULL;
    int rc = run_cmd(cmd, &out, true);
    if (rc != 0) {
        test_fail(__FILE__, __LINE__, "%s: exit %d: %s", cmd, rc, out ? out : "");
        free(out);
        return;
    }
    free(out);
    quill_quantize_params p = {.n_threads = 2, .pure = pure};
    quill_error err = {0};
    if (quill_ftype_parse(ftype, &p.ftype, &err) != QUILL_OK || quill_quantize_file(in, ours, &p, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "%s: %s", ftype, err.message);
        return;
    }
    size_t na = 0, nb = 0;
    char *a = read_file(ours, &na), *b = read_file(ref, &nb);
    size_t k = 0;
    while (a && b && k < na && k < nb && a[k] == b[k]) k++;
    if (!a || !b || na != nb || k != na)
        test_fail(__FILE__, __LINE__, "%s: quill's file differs from the reference's (sizes %zu / %zu, first at byte %zu)",
                  ftype, na, nb, k);
    remove(ours);
    remove(ref);
    free(a);
    free(b);
}

static void check_against_reference(const char *shared, const char *in, const char *ftype) {
    check_against_reference_opts(shared, in, ftype, false);
}

TEST(quantize_lowbit_files_identical_to_reference) {
    REQUIRE_SHARED(shared);
    char *in = path_join(shared, "models/synth-k-f32.gguf");
    /* tq1_0, tq2_0, q2_0: token_embd in q4_K, output in q6_K; q1_0 everywhere but output;
     * mxfp4_moe without experts: every matrix q8_0 */
    static const char *const ftypes[] = {"tq1_0", "tq2_0", "q1_0", "q2_0", "mxfp4_moe", "iq3_s", "iq3_m"};
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++) check_against_reference(shared, in, ftypes[i]);
    free(in);
}

/* iq3_s, every matrix (--pure), on weights with all-zero sub-blocks (which the reference skips
 * without advancing its code and sign pointers), tiny and huge blocks, and exact lattice points. */
TEST(quantize_lowbit_iq3_s_edge_blocks_identical_to_reference) {
    REQUIRE_SHARED(shared);
    CHECK(quill_iq3s_ready_for_tests(), "iq3_s neighbour lists did not fit");
    quill_gguf *g = NULL;
    quill_gguf_writer *w = writer_from_model(shared, "models/synth-k-f32.gguf", &g);
    if (!w) return;
    char *in = path_join(tmp_dir(), "iq3s-edges-f32.gguf");
    quill_error err = {0};
    float *edited = NULL;
    uint64_t rng = 77;
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (strcmp(t->name, "blk.0.attn_q.weight")) {
            quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        edited = malloc((size_t)t->n_elements * sizeof *edited);
        if (!edited) abort();
        memcpy(edited, t->data, (size_t)t->n_elements * sizeof *edited);
        for (int64_t r = 0; r < t->ne[1]; r++) {
            float *row = edited + r * t->ne[0];
            const int kind = (int)(r % 6);
            for (int64_t c = 0; c < t->ne[0]; c++) {
                const int sub = (int)(c / 32);
                if (kind == 0 && (sub == 1 || sub == 2 || sub == 7)) row[c] = 0;  /* zero sub-blocks */
                if (kind == 1 && sub < 7) row[c] = 0;                              /* all but the last */
                if (kind == 2) row[c] *= 1e-6f;                                    /* tiny */
                if (kind == 3) row[c] *= 1e6f;                                     /* huge */
                if (kind == 4) row[c] = (float)(2 * (int)(test_rand(&rng) % 8) + 1) * (c % 3 ? 1.f : -1.f);
            }
        }
        quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, edited);
    }
    quill_status st = quill_gguf_writer_write(w, in, &err);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    free(edited);
    if (st != QUILL_OK) test_fail(__FILE__, __LINE__, "%s", err.message);
    else check_against_reference_opts(shared, in, "iq3_s", true);
    remove(in);
    free(in);
}

/* A Llama file with 3-D expert tensors (gate, up, down of 4 experts) beside its dense layers:
 * mxfp4_moe puts exactly those in mxfp4. The weights span several binades per block so that the
 * shared exponent and every fp4 level get exercised. */
TEST(quantize_lowbit_mxfp4_experts_identical_to_reference) {
    REQUIRE_SHARED(shared);
    quill_gguf *g = NULL;
    quill_gguf_writer *w = writer_from_model(shared, "models/synth-k-f32.gguf", &g);
    if (!w) return;
    char *in = path_join(tmp_dir(), "experts-f32.gguf");
    quill_error err = {0};
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    static const char *const names[] = {"blk.0.ffn_gate_exps.weight", "blk.0.ffn_up_exps.weight",
                                        "blk.0.ffn_down_exps.weight"};
    const int64_t ne[3][3] = {{256, 96, 4}, {256, 96, 4}, {96, 256, 4}};
    uint64_t rng = 2026;
    float *data[3];
    for (int k = 0; k < 3; k++) {
        const int64_t n = ne[k][0] * ne[k][1] * ne[k][2];
        data[k] = malloc((size_t)n * sizeof(float));
        if (!data[k]) abort();
        for (int64_t j = 0; j < n; j++) {
            const int binade = (int)(test_rand(&rng) % 24) - 16;
            data[k][j] = ldexpf(test_randf(&rng), j % 32 == 5 ? binade : binade / 4);
        }
        quill_gguf_writer_add_tensor(w, names[k], QUILL_TYPE_F32, 3, ne[k], data[k]);
    }
    quill_status st = quill_gguf_writer_write(w, in, &err);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    for (int k = 0; k < 3; k++) free(data[k]);
    if (st != QUILL_OK) test_fail(__FILE__, __LINE__, "%s", err.message);

    /* the plan: experts in mxfp4, the other matrices in q8_0 */
    quill_gguf *gin = NULL;
    if (st == QUILL_OK && quill_gguf_open(in, &gin, &err) == QUILL_OK) {
        const uint64_t n = quill_gguf_n_tensors(gin);
        quill_quant_choice *plan = calloc(n, sizeof *plan);
        CHECK(plan && quill_quantize_plan(gin, QUILL_FTYPE_MOSTLY_MXFP4_MOE, false, plan, &err) == QUILL_OK, "%s",
              err.message);
        int n_mxfp4 = 0;
        for (uint64_t i = 0; i < n; i++) {
            const quill_gguf_tensor *t = quill_gguf_tensor_at(gin, plan[i].src_index);
            if (plan[i].type == QUILL_TYPE_MXFP4) {
                n_mxfp4++;
                CHECK(t->ne[2] == 4, "%s in mxfp4", t->name);
            } else if (plan[i].quantized) {
                CHECK(plan[i].type == QUILL_TYPE_Q8_0, "%s in %s", t->name, quill_type_name(plan[i].type));
            }
        }
        CHECK_EQ_INT(n_mxfp4, 3);
        free(plan);
        quill_gguf_close(gin);
        check_against_reference(shared, in, "mxfp4_moe");
    }
    remove(in);
    free(in);
}

/* Rows of the low-bit types decode to values near the input: a check that does not lean on the
 * reference (N(0,1)-like data: uniform here, bounds well above the measured errors). */
TEST(quantize_lowbit_round_trip) {
    static const struct { uint32_t type; double bound; } cases[] = {
        {QUILL_TYPE_Q1_0, 0.75}, {QUILL_TYPE_Q2_0, 0.6}, {QUILL_TYPE_MXFP4, 0.2},
        {QUILL_TYPE_TQ1_0, 0.6}, {QUILL_TYPE_TQ2_0, 0.6}, {QUILL_TYPE_IQ3_S, 0.25},
    };
    enum { N = 1024 };
    float x[N], y[N];
    uint8_t q[N * 4];
    uint64_t rng = 5;
    for (int i = 0; i < N; i++) x[i] = test_randf(&rng);
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        CHECK(quill_can_quantize(cases[c].type), "%s", quill_type_name(cases[c].type));
        CHECK(quill_quantize_rows(cases[c].type, x, q, 2, N / 2, NULL) == QUILL_OK);
        CHECK(quill_dequantize(cases[c].type, q, y, N, NULL) == QUILL_OK);
        double se = 0, sx = 0;
        for (int i = 0; i < N; i++) se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]), sx += (double)x[i] * x[i];
        const double rel = sqrt(se / sx);
        CHECK(rel < cases[c].bound, "%s: relative rms error %.3f", quill_type_name(cases[c].type), rel);
    }
    /* an all-zero block stays zero */
    float zero[256] = {0};
    CHECK(quill_quantize_rows(QUILL_TYPE_MXFP4, zero, q, 1, 256, NULL) == QUILL_OK);
    CHECK(quill_dequantize(QUILL_TYPE_MXFP4, q, y, 256, NULL) == QUILL_OK);
    for (int i = 0; i < 256; i++) CHECK(y[i] == 0.0f);
}

/* The types that need an importance matrix are refused by name, with the reason; other names are
 * unknown. */
TEST(quantize_lowbit_imatrix_types_refused) {
    quill_ftype f;
    quill_error err = {0};
    static const char *const needs[] = {"iq2_xxs", "IQ2_XS", "iq2_s", "iq2_m", "iq1_s", "iq1_m", "iq3_xxs", "iq3_xs", "q2_k_s"};
    for (size_t i = 0; i < sizeof needs / sizeof needs[0]; i++) {
        CHECK(quill_ftype_parse(needs[i], &f, &err) == QUILL_E_UNSUPPORTED, "%s", needs[i]);
        CHECK_STR_CONTAINS(err.message, "importance matrix");
    }
    CHECK(quill_ftype_parse("q4_k_x", &f, &err) == QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "unknown type 'q4_k_x'");
    CHECK(quill_ftype_parse("MXFP4_MOE", &f, &err) == QUILL_OK && f == QUILL_FTYPE_MOSTLY_MXFP4_MOE);
    CHECK(quill_ftype_parse("tq2_0", &f, &err) == QUILL_OK && f == QUILL_FTYPE_MOSTLY_TQ2_0);

    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s quantize in.gguf %s/never.gguf IQ2_XXS", quill_bin(), tmp_dir());
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 1, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "iq2_xxs needs an importance matrix");
    free(out);
}

/* Rows of 64, which no 256-block type splits: each mix's fallbacks (q2_K, q3_K -> q4_0, q4_K ->
 * q5_0, q5_K -> q5_1, q6_K -> q8_0, iq3_s / iq4_xs -> iq4_nl, the ternary types -> q4_0) as this
 * reference makes them, whole files byte for byte. */
TEST(quantize_lowbit_fallbacks_identical_to_reference) {
    REQUIRE_SHARED(shared);
    char *in = path_join(tmp_dir(), "rows64-f16.gguf"), cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s synth --embd 64 --layers 2 --heads 2 --kv-heads 2 --ff 128 --vocab %s/tokenizer/ggml-vocab-llama-spm.gguf "
             "-o %s",
             quill_bin(), shared, in);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    free(out);
    static const char *const ftypes[] = {"q3_k_m", "q2_k", "iq4_xs", "tq2_0", "iq3_m"};
    for (size_t i = 0; i < sizeof ftypes / sizeof ftypes[0]; i++) check_against_reference(shared, in, ftypes[i]);
    remove(in);
    free(in);
}

/* Gemma 4's files (quill synth --arch gemma4): per_layer_token_embd mixed as a token embedding,
 * per_layer_model_proj left in f32, the GQA ratio from layer 0's head_count_kv, attn_v on only some
 * layers; byte-identical to the reference's mixes. */
TEST(quantize_gemma4_files_identical_to_reference) {
    REQUIRE_SHARED(shared);
    char in[512], cmd[1536], *out = NULL;
    snprintf(in, sizeof in, "%s/quantize-gemma4-f32.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd,
             "%s synth --arch gemma4 --layers 9 --swa-pattern 3 --shared-kv 3 --window 5 --embd 256 --heads 4 "
             "--kv-heads 2 --ff 512 --per-layer-input 32 --vocab %s/models/stories260K.gguf --type f32 -o %s",
             quill_bin(), shared, in);
    const int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "synth: exit %d: %s", rc, out);
    free(out);
    static const char *const ftypes[] = {"q8_0", "q4_k_m", "q3_k_m", "q2_k"};
    for (size_t i = 0; rc == 0 && i < sizeof ftypes / sizeof ftypes[0]; i++) check_against_reference(shared, in, ftypes[i]);
    remove(in);
}
