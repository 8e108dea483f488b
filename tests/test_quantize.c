/* Quantization: round-trip error bounds, byte identity with the reference quantizer's files,
 * the per-tensor choices of the mixes, the streaming GGUF writer, and the quantize / synth CLI. */
#include "test.h"

#include "quill.h"
#include "quill_quantize.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- helpers */

static uint64_t rng_state;
static double rng_uniform(void) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return ((double)(rng_state >> 11) + 0.5) / 9007199254740992.0;
}
/* Standard normal (Box-Muller). */
static float rng_normal(void) {
    double a = rng_uniform(), b = rng_uniform();
    return (float)(sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b));
}

static double rel_rms_error(const float *x, const float *y, int64_t n) {
    double se = 0, sx = 0;
    for (int64_t i = 0; i < n; i++) {
        se += ((double)y[i] - x[i]) * ((double)y[i] - x[i]);
        sx += (double)x[i] * x[i];
    }
    return sx > 0 ? sqrt(se / sx) : sqrt(se);
}

static char *shared_path(const char *dir, const char *name) { return path_join(dir, name); }

static char *tmp_path(const char *name) { return path_join(tmp_dir(), name); }

/* ---------------------------------------------------------------- rows */

typedef struct {
    uint32_t type;
    double bound;  /* relative rms error on N(0, 1) data; measured values are about 0.8x these */
} error_bound;

static const error_bound bounds[] = {
    {QUILL_TYPE_F32, 0.0},      {QUILL_TYPE_F16, 4e-4},     {QUILL_TYPE_BF16, 3e-3},
    {QUILL_TYPE_Q8_0, 0.008},   {QUILL_TYPE_Q4_0, 0.11},    {QUILL_TYPE_Q4_1, 0.10},
    {QUILL_TYPE_Q5_0, 0.055},   {QUILL_TYPE_Q5_1, 0.05},    {QUILL_TYPE_Q2_K, 0.36},
    {QUILL_TYPE_Q3_K, 0.19},    {QUILL_TYPE_Q4_K, 0.09},    {QUILL_TYPE_Q5_K, 0.046},
    {QUILL_TYPE_Q6_K, 0.023},   {QUILL_TYPE_IQ4_NL, 0.095}, {QUILL_TYPE_IQ4_XS, 0.095},
};

TEST(quantize_roundtrip_error_bounds) {
    const int64_t n = 8192, row = 512;
    float *x = malloc((size_t)n * sizeof *x), *y = malloc((size_t)n * sizeof *y);
    uint8_t *q = malloc((size_t)n * sizeof(float));
    rng_state = 42;
    for (int64_t i = 0; i < n; i++) x[i] = rng_normal();
    for (size_t t = 0; t < sizeof bounds / sizeof bounds[0]; t++) {
        const uint32_t type = bounds[t].type;
        quill_error err;
        CHECK(quill_can_quantize(type), "%s", quill_type_name(type));
        CHECK(quill_quantize_rows(type, x, q, n / row, row, &err) == QUILL_OK, "%s: %s", quill_type_name(type), err.message);
        CHECK(quill_dequantize(type, q, y, n, &err) == QUILL_OK, "%s", err.message);
        const double e = rel_rms_error(x, y, n);
        CHECK(e <= bounds[t].bound, "%s: relative rms error %.5f > %.5f", quill_type_name(type), e, bounds[t].bound);
        /* a scaled copy of the data quantizes to a scaled error (no hidden absolute thresholds) */
        for (int64_t i = 0; i < n; i++) y[i] = x[i] * 1e-3f;
        CHECK(quill_quantize_rows(type, y, q, n / row, row, &err) == QUILL_OK, "%s", err.message);
        float *z = malloc((size_t)n * sizeof *z);
        quill_dequantize(type, q, z, n, &err);
        const double e2 = rel_rms_error(y, z, n);
        free(z);
        CHECK(e2 <= bounds[t].bound * 1.05 + 1e-6, "%s: scaled data error %.5f", quill_type_name(type), e2);
    }
    free(x);
    free(y);
    free(q);
}

TEST(quantize_special_rows) {
    /* zeros, a constant, a lone spike, negative-only and tiny values: finite output, zeros stay zero */
    const int64_t n = 512;
    float x[512], y[512];
    uint8_t q[512 * 4];
    for (size_t t = 0; t < sizeof bounds / sizeof bounds[0]; t++) {
        const uint32_t type = bounds[t].type;
        quill_error err;
        for (int c = 0; c < 5; c++) {
            for (int64_t i = 0; i < n; i++) {
                switch (c) {
                case 0: x[i] = 0.0f; break;
                case 1: x[i] = 0.75f; break;
                case 2: x[i] = i == 100 ? -3.0f : 0.0f; break;
                case 3: x[i] = -0.5f - (float)(i % 7) * 0.01f; break;
                default: x[i] = (float)((i % 13) - 6) * 1e-20f; break;
                }
            }
            CHECK(quill_quantize_rows(type, x, q, 1, n, &err) == QUILL_OK, "%s", err.message);
            CHECK(quill_dequantize(type, q, y, n, &err) == QUILL_OK, "%s", err.message);
            for (int64_t i = 0; i < n; i++) CHECK(isfinite(y[i]), "%s case %d: y[%lld] = %g", quill_type_name(type), c, (long long)i, y[i]);
            if (c == 0)
                for (int64_t i = 0; i < n; i++) CHECK(y[i] == 0.0f, "%s: zeros give %g", quill_type_name(type), y[i]);
            if (c == 2) CHECK(fabsf(y[100] + 3.0f) < 0.35f, "%s: spike -3 gives %g", quill_type_name(type), y[100]);
            if (c == 1 && type != QUILL_TYPE_Q2_K)
                CHECK(fabsf(y[7] - 0.75f) < 0.05f, "%s: constant 0.75 gives %g", quill_type_name(type), y[7]);
        }
    }
}

TEST(quantize_rows_rejects_bad_arguments) {
    float x[64] = {0};
    uint8_t q[256];
    quill_error err;
    CHECK(quill_quantize_rows(QUILL_TYPE_Q4_K, x, q, 1, 64, &err) == QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "q4_K");
    CHECK(quill_quantize_rows(QUILL_TYPE_Q4_0, x, q, 1, 48, &err) == QUILL_E_ARG);
    CHECK(quill_quantize_rows(QUILL_TYPE_Q8_K, x, q, 1, 256, &err) == QUILL_E_UNSUPPORTED);
    CHECK(quill_quantize_rows(QUILL_TYPE_IQ2_XXS, x, q, 1, 256, &err) == QUILL_E_UNSUPPORTED);
    CHECK(!quill_can_quantize(QUILL_TYPE_Q8_1));
    CHECK(quill_quantize_rows(QUILL_TYPE_Q8_0, x, q, 0, 32, &err) == QUILL_OK);
    CHECK(quill_quantize_rows(QUILL_TYPE_Q8_0, x, q, 2, 32, &err) == QUILL_OK);
}

TEST(quantize_ftype_names) {
    quill_ftype f;
    CHECK(quill_ftype_from_name("q4_k_m", &f) && f == QUILL_FTYPE_MOSTLY_Q4_K_M);
    CHECK(quill_ftype_from_name("Q4_K_M", &f) && f == QUILL_FTYPE_MOSTLY_Q4_K_M);
    CHECK(quill_ftype_from_name("q4_k", &f) && f == QUILL_FTYPE_MOSTLY_Q4_K_M);
    CHECK(quill_ftype_from_name("q3_k", &f) && f == QUILL_FTYPE_MOSTLY_Q3_K_M);
    CHECK(quill_ftype_from_name("q6_k", &f) && f == QUILL_FTYPE_MOSTLY_Q6_K);
    CHECK(quill_ftype_from_name("bf16", &f) && f == QUILL_FTYPE_MOSTLY_BF16);
    CHECK(quill_ftype_from_name("f32", &f) && f == QUILL_FTYPE_ALL_F32);
    CHECK(!quill_ftype_from_name("q4_k_x", &f));
    CHECK(!quill_ftype_from_name("", &f));
    CHECK(!quill_ftype_from_name("a_very_long_unknown_name", &f));
    CHECK(quill_ftype_base_type(QUILL_FTYPE_MOSTLY_Q5_K_S) == QUILL_TYPE_Q5_K);
    CHECK(!strcmp(quill_ftype_name(QUILL_FTYPE_MOSTLY_Q3_K_S), "q3_k_s"));
    CHECK(quill_ftype_name((quill_ftype)4) == NULL);
}

/* ---------------------------------------------------------------- against the reference files */

typedef struct {
    int64_t blocks, identical;
    double err_ours, err_ref; /* squared error sums against the F32 source */
} ref_stats;

/* Quantizes the F32 source of every tensor of `ref_file` whose name is in `names` (NULL: every
 * tensor of a quantized type) into that tensor's type and compares with the reference bytes. */
static bool compare_with_reference(const char *sd, const char *ref_file, const char *const *names, ref_stats *st) {
    char *src_path = shared_path(sd, "models/synth-k-f32.gguf"), *ref_path = shared_path(sd, ref_file);
    quill_gguf *src = NULL, *ref = NULL;
    quill_error err;
    bool ok = quill_gguf_open(src_path, &src, &err) == QUILL_OK && quill_gguf_open(ref_path, &ref, &err) == QUILL_OK;
    if (!ok) test_fail(__FILE__, __LINE__, "%s", err.message);
    memset(st, 0, sizeof *st);
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(ref); i++) {
        const quill_gguf_tensor *r = quill_gguf_tensor_at(ref, i);
        if (r->type == QUILL_TYPE_F32) continue;
        if (names) {
            bool listed = false;
            for (const char *const *p = names; *p; p++) listed |= !strcmp(*p, r->name);
            if (!listed) continue;
        }
        const quill_gguf_tensor *s = quill_gguf_find_tensor(src, r->name);
        const quill_type_traits *tr = quill_type_traits_of(r->type);
        uint8_t *q = malloc(r->nbytes);
        float *a = malloc((size_t)r->n_elements * sizeof *a), *b = malloc((size_t)r->n_elements * sizeof *b);
        ok = s && q && a && b &&
             quill_quantize_rows(r->type, s->data, q, r->n_elements / r->ne[0], r->ne[0], &err) == QUILL_OK &&
             quill_dequantize(r->type, q, a, r->n_elements, &err) == QUILL_OK &&
             quill_dequantize(r->type, r->data, b, r->n_elements, &err) == QUILL_OK;
        if (!ok) {
            test_fail(__FILE__, __LINE__, "%s %s: %s", ref_file, r->name, err.message);
        } else {
            const int64_t nb = r->n_elements / tr->block_size;
            for (int64_t k = 0; k < nb; k++)
                st->identical += !memcmp(q + k * tr->type_size, (const uint8_t *)r->data + k * tr->type_size, tr->type_size);
            st->blocks += nb;
            const float *x = s->data;
            for (int64_t k = 0; k < r->n_elements; k++) {
                st->err_ours += ((double)a[k] - x[k]) * ((double)a[k] - x[k]);
                st->err_ref += ((double)b[k] - x[k]) * ((double)b[k] - x[k]);
            }
        }
        free(q);
        free(a);
        free(b);
    }
    quill_gguf_close(src);
    quill_gguf_close(ref);
    free(src_path);
    free(ref_path);
    return ok && st->blocks > 0;
}

/* A few tensors of each shape keep the tests fast: 64 rows of 256, 256 of 256, 256 of 768; the
 * attn_v and ffn_down of layers 0 and 3 take different types in the mixes. */
static const char *const sample_tensors[] = {
    "blk.0.attn_v.weight", "blk.2.attn_q.weight", "blk.1.ffn_down.weight", "blk.3.attn_v.weight",
    "blk.3.ffn_down.weight", "output.weight", NULL,
};
static const char *const sample_tensors_small[] = {
    "blk.0.attn_v.weight", "blk.3.attn_v.weight", "blk.2.attn_k.weight", "blk.3.ffn_down.weight", NULL,
};

TEST(quantize_matches_reference_bytes_simple_types) {
    REQUIRE_SHARED(sd);
    /* q8_0, q4_0, q4_1, q5_0, q5_1, q6_K, f16 and bf16: the same bytes as the reference, block
     * for block (each file's output.weight is q6_K or q8_0 and is compared too) */
    const char *files[] = {"models/synth-k-q8_0.gguf", "models/synth-k-q4_0.gguf", "models/synth-k-q4_1.gguf",
                           "models/synth-k-q5_0.gguf", "models/synth-k-q5_1.gguf", "models/synth-k-q6_k.gguf",
                           "models/synth-k-f16.gguf",  "models/synth-k-bf16.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        ref_stats st;
        CHECK(compare_with_reference(sd, files[i], sample_tensors, &st), "%s", files[i]);
        CHECK(st.identical == st.blocks, "%s: %lld of %lld blocks identical", files[i], (long long)st.identical,
              (long long)st.blocks);
    }
}

TEST(quantize_matches_reference_kquants) {
    REQUIRE_SHARED(sd);
    /* k-quants and iq4 choose their scales by search; require (nearly) the reference's blocks and
     * no more than 1.02x its error. Measured: every block identical, error ratio 1.000000. */
    const char *files[] = {"models/synth-k-q2_k.gguf",   "models/synth-k-q3_k_s.gguf", "models/synth-k-q3_k_m.gguf",
                           "models/synth-k-q4_k_s.gguf", "models/synth-k-q4_k_m.gguf", "models/synth-k-q5_k_s.gguf",
                           "models/synth-k-q5_k_m.gguf", "models/synth-k-iq4_nl.gguf", "models/synth-k-iq4_xs.gguf"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        ref_stats st;
        CHECK(compare_with_reference(sd, files[i], sample_tensors_small, &st), "%s", files[i]);
        const double frac = (double)st.identical / (double)st.blocks;
        const double ratio = sqrt(st.err_ours / st.err_ref);
        printf("    %-28s %6.2f%% of %5lld blocks identical, rms error ours/reference %.6f\n", files[i] + 7,
               100.0 * frac, (long long)st.blocks, ratio);
        CHECK(ratio <= 1.02, "%s: error ratio %.4f", files[i], ratio);
        CHECK(frac >= 0.95, "%s: only %.2f%% of blocks identical", files[i], 100.0 * frac);
    }
}

/* Whole files: metadata order, file type, tensor order, padding and data, byte for byte. */
static void check_whole_file(const char *sd, const char *type_name) {
    char ref_name[128], out_name[64];
    snprintf(ref_name, sizeof ref_name, "models/synth-k-%s.gguf", type_name);
    snprintf(out_name, sizeof out_name, "whole-%s.gguf", type_name);
    char *in = shared_path(sd, "models/synth-k-f32.gguf"), *ref = shared_path(sd, ref_name), *out = tmp_path(out_name);
    quill_quantize_params p = {.n_threads = 2};
    quill_error err;
    bool ok = quill_ftype_from_name(type_name, &p.ftype);
    ok = ok && quill_quantize_file(in, out, &p, &err) == QUILL_OK;
    if (!ok) test_fail(__FILE__, __LINE__, "%s: %s", type_name, err.message);
    size_t na = 0, nb = 0;
    char *a = ok ? read_file(out, &na) : NULL, *b = ok ? read_file(ref, &nb) : NULL;
    if (ok && (!a || !b || na != nb || memcmp(a, b, na) != 0)) {
        size_t k = 0;
        while (a && b && k < na && k < nb && a[k] == b[k]) k++;
        test_fail(__FILE__, __LINE__, "%s: output differs from the reference file (sizes %zu / %zu, first at byte %zu)",
                  type_name, na, nb, k);
    }
    remove(out);
    free(a);
    free(b);
    free(in);
    free(ref);
    free(out);
}

TEST(quantize_whole_file_identical_to_reference) {
    REQUIRE_SHARED(sd);
    check_whole_file(sd, "q8_0");
    check_whole_file(sd, "q4_0");
    check_whole_file(sd, "q5_1");
    check_whole_file(sd, "bf16");
    check_whole_file(sd, "q3_k_m"); /* a mix: q3_K, q4_K, q5_K and q6_K tensors */
}

/* ---------------------------------------------------------------- mixes */

TEST(quantize_mix_choices_match_reference_files) {
    REQUIRE_SHARED(sd);
    const char *mixes[] = {"q2_k",   "q3_k_s", "q3_k_m", "q4_k_s", "q4_k_m", "q5_k_s", "q5_k_m",
                           "q6_k",   "q8_0",   "q4_0",   "q4_1",   "q5_0",   "q5_1",   "iq4_nl",
                           "iq4_xs", "f16",    "bf16"};
    char *src_path = shared_path(sd, "models/synth-k-f32.gguf");
    quill_gguf *src;
    quill_error err;
    CHECK(quill_gguf_open(src_path, &src, &err) == QUILL_OK, "%s", err.message);
    free(src_path);
    const uint64_t n = quill_gguf_n_tensors(src);
    quill_quant_choice *plan = calloc(n, sizeof *plan);
    for (size_t m = 0; m < sizeof mixes / sizeof mixes[0]; m++) {
        char name[96];
        snprintf(name, sizeof name, "models/synth-k-%s.gguf", mixes[m]);
        char *ref_path = shared_path(sd, name);
        quill_gguf *ref;
        quill_ftype ft;
        bool ok = quill_ftype_from_name(mixes[m], &ft) && quill_gguf_open(ref_path, &ref, &err) == QUILL_OK;
        free(ref_path);
        if (!ok) {
            test_fail(__FILE__, __LINE__, "%s", mixes[m]);
            break;
        }
        uint64_t file_type = 0;
        quill_gguf_get_u64(ref, "general.file_type", &file_type, NULL);
        ok = file_type == (uint64_t)ft && quill_quantize_plan(src, ft, false, plan, &err) == QUILL_OK &&
             quill_gguf_n_tensors(ref) == n;
        if (!ok) test_fail(__FILE__, __LINE__, "%s: file_type %llu, plan: %s", mixes[m], (unsigned long long)file_type, err.message);
        for (uint64_t i = 0; ok && i < n; i++) {
            const quill_gguf_tensor *r = quill_gguf_tensor_at(ref, i);
            const quill_gguf_tensor *s = quill_gguf_tensor_at(src, plan[i].src_index);
            if (strcmp(r->name, s->name) != 0 || r->type != plan[i].type) {
                test_fail(__FILE__, __LINE__, "%s: tensor %llu is %s %s in the reference, %s %s in the plan", mixes[m],
                          (unsigned long long)i, r->name, quill_type_name(r->type), s->name, quill_type_name(plan[i].type));
                ok = false;
            }
        }
        quill_gguf_close(ref);
        if (!ok) break;
    }
    free(plan);
    quill_gguf_close(src);
}

/* A tiny Llama-shaped GGUF (every matrix 256 x 2) with the given layer and head counts. */
static char *write_shape_model(const char *file, int n_layer, int n_head, int n_head_kv, int64_t row,
                               int64_t layer_row, bool with_output) {
    char *path = tmp_path(file);
    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    quill_gguf_writer_add_u32(w, "llama.block_count", (uint32_t)n_layer);
    quill_gguf_writer_add_u32(w, "llama.attention.head_count", (uint32_t)n_head);
    quill_gguf_writer_add_u32(w, "llama.attention.head_count_kv", (uint32_t)n_head_kv);
    float data[2 * 1024] = {0};
    const int64_t mat[2] = {row, 2}, vec[1] = {row}, lmat[2] = {layer_row, 2};
    quill_gguf_writer_add_tensor(w, "token_embd.weight", QUILL_TYPE_F32, 2, mat, data);
    quill_gguf_writer_add_tensor(w, "output_norm.weight", QUILL_TYPE_F32, 1, vec, data);
    if (with_output) quill_gguf_writer_add_tensor(w, "output.weight", QUILL_TYPE_F32, 2, mat, data);
    static const char *const kinds[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
    for (int l = 0; l < n_layer; l++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%d.attn_norm.weight", l);
        quill_gguf_writer_add_tensor(w, name, QUILL_TYPE_F32, 1, vec, data);
        for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
            snprintf(name, sizeof name, "blk.%d.%s.weight", l, kinds[k]);
            quill_gguf_writer_add_tensor(w, name, QUILL_TYPE_F32, 2, lmat, data);
        }
    }
    quill_error err;
    if (quill_gguf_writer_write(w, path, &err) != QUILL_OK) test_fail(__FILE__, __LINE__, "%s", err.message);
    quill_gguf_writer_free(w);
    return path;
}

/* Type of `name` in the plan of `ftype`. The last plan is kept: the rule tests ask for many
 * tensors of one plan (plan_forget before closing the file). */
static const quill_gguf *plan_g;
static quill_ftype plan_f;
static uint32_t *plan_types; /* by tensor index in the file */
static void plan_forget(void) {
    free(plan_types);
    plan_types = NULL;
    plan_g = NULL;
}
static uint32_t planned(const quill_gguf *g, quill_ftype ftype, const char *name) {
    const uint64_t n = quill_gguf_n_tensors(g);
    if (plan_g != g || plan_f != ftype || !plan_types) {
        plan_forget();
        quill_quant_choice *plan = calloc(n, sizeof *plan);
        quill_error err;
        if (quill_quantize_plan(g, ftype, false, plan, &err) != QUILL_OK) {
            free(plan);
            return QUILL_TYPE_COUNT;
        }
        plan_types = malloc(n * sizeof *plan_types);
        for (uint64_t i = 0; i < n; i++) plan_types[plan[i].src_index] = plan[i].type;
        free(plan);
        plan_g = g;
        plan_f = ftype;
    }
    for (uint64_t i = 0; i < n; i++)
        if (!strcmp(quill_gguf_tensor_at(g, i)->name, name)) return plan_types[i];
    return QUILL_TYPE_COUNT;
}

static uint32_t layer_type(const quill_gguf *g, quill_ftype ftype, int layer, const char *kind) {
    char name[64];
    snprintf(name, sizeof name, "blk.%d.%s.weight", layer, kind);
    return planned(g, ftype, name);
}

TEST(quantize_mix_rules_llama_32_layers) {
    /* Llama-2-7B's layout: 32 layers, no GQA. use_more_bits picks layers 0-3, 28-31 and every
     * third from 6 to 27 (the q6_K layers of a 7B q4_k_m). */
    char *path = write_shape_model("shape32.gguf", 32, 32, 32, 256, 256, true);
    quill_gguf *g;
    quill_error err;
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    free(path);
    const bool more[32] = {1, 1, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1};
    /* one loop per mix, so each plan is computed once */
    for (int l = 0; l < 32; l++) {
        const uint32_t want = more[l] ? QUILL_TYPE_Q6_K : QUILL_TYPE_Q4_K;
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, l, "attn_v") == want, "q4_k_m attn_v layer %d", l);
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, l, "ffn_down") == want, "q4_k_m ffn_down layer %d", l);
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, l, "attn_q") == QUILL_TYPE_Q4_K);
    }
    for (int l = 0; l < 32; l++)
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q5_K_M, l, "attn_v") == (more[l] ? QUILL_TYPE_Q6_K : QUILL_TYPE_Q5_K));
    for (int l = 0; l < 32; l++) {
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_S, l, "attn_v") == (l < 4 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K));
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_S, l, "ffn_down") == (l < 4 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K));
    }
    for (int l = 0; l < 32; l++) {
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_M, l, "attn_v") == (l < 2 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K));
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_M, l, "ffn_down") == (l < 2 ? QUILL_TYPE_Q5_K : QUILL_TYPE_Q4_K));
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_M, l, "attn_output") == QUILL_TYPE_Q4_K);
    }
    for (int l = 0; l < 32; l++) CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_L, l, "attn_v") == QUILL_TYPE_Q5_K);
    for (int l = 0; l < 32; l++) {
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q2_K, l, "attn_v") == QUILL_TYPE_Q3_K); /* no GQA */
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q2_K, l, "ffn_down") == QUILL_TYPE_Q3_K);
        CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q2_K, l, "ffn_up") == QUILL_TYPE_Q2_K);
    }
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_K_M, "output.weight") == QUILL_TYPE_Q6_K);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q8_0, "output.weight") == QUILL_TYPE_Q8_0);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_0, "output.weight") == QUILL_TYPE_Q6_K);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_K_M, "token_embd.weight") == QUILL_TYPE_Q4_K);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_K_M, "output_norm.weight") == QUILL_TYPE_F32);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_F16, "output.weight") == QUILL_TYPE_F16);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_F16, "blk.3.attn_norm.weight") == QUILL_TYPE_F32);
    plan_forget();
    /* pure: the base type everywhere, output included */
    const uint64_t n = quill_gguf_n_tensors(g);
    quill_quant_choice *plan = calloc(n, sizeof *plan);
    CHECK(quill_quantize_plan(g, QUILL_FTYPE_MOSTLY_Q4_K_M, true, plan, &err) == QUILL_OK, "%s", err.message);
    for (uint64_t i = 0; i < n; i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, plan[i].src_index);
        CHECK(plan[i].type == (t->n_dims == 2 ? QUILL_TYPE_Q4_K : QUILL_TYPE_F32), "%s", t->name);
    }
    free(plan);
    quill_gguf_close(g);
}

TEST(quantize_mix_rules_70b_gqa_and_tied) {
    /* 80 layers with GQA is the reference's 70B: attn_v gets q5_K where the mix says q3_K/q4_K */
    char *path = write_shape_model("shape80.gguf", 80, 64, 8, 256, 256, false);
    quill_gguf *g;
    quill_error err;
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    free(path);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_S, 40, "attn_v") == QUILL_TYPE_Q5_K);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, 11, "attn_v") == QUILL_TYPE_Q5_K);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, 12, "attn_v") == QUILL_TYPE_Q6_K); /* (12-10)%3 == 2 */
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q2_K, 5, "attn_v") == QUILL_TYPE_Q5_K);    /* q4_K (GQA 8), bumped */
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_M, 4, "ffn_down") == QUILL_TYPE_Q5_K); /* 4 < 80/16 */
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_M, 5, "ffn_down") == QUILL_TYPE_Q4_K);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_M, 5, "attn_v") == QUILL_TYPE_Q5_K);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_IQ4_NL, 5, "attn_v") == QUILL_TYPE_Q5_K);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_IQ4_NL, 9, "ffn_down") == QUILL_TYPE_Q5_K); /* 9 < 80/8 */
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_IQ4_NL, 10, "ffn_down") == QUILL_TYPE_IQ4_NL);
    /* no output.weight: the token embeddings double as the output and get its type */
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_K_M, "token_embd.weight") == QUILL_TYPE_Q6_K);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q8_0, "token_embd.weight") == QUILL_TYPE_Q8_0);
    plan_forget();
    quill_gguf_close(g);
}

TEST(quantize_mix_fallback_for_short_rows) {
    /* rows of 64: k-quants fall back to 32-blocks (q2_K, q3_K -> q4_0, q4_K -> q5_0, q5_K -> q5_1,
     * q6_K -> q8_0; tests/test_quantize_lowbit.c compares a whole file with the reference's); the
     * output matrix takes q8_0 */
    char *path = write_shape_model("shape64.gguf", 2, 4, 4, 64, 64, true);
    quill_gguf *g;
    quill_error err;
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    const uint64_t n = quill_gguf_n_tensors(g);
    quill_quant_choice *plan = calloc(n, sizeof *plan);
    CHECK(quill_quantize_plan(g, QUILL_FTYPE_MOSTLY_Q4_K_M, false, plan, &err) == QUILL_OK, "%s", err.message);
    int fallbacks = 0;
    for (uint64_t i = 0; i < n; i++) fallbacks += plan[i].fallback;
    free(plan);
    CHECK(fallbacks == 2 * 7 + 1, "%d fallbacks", fallbacks); /* every matrix but output.weight */
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_K_M, "output.weight") == QUILL_TYPE_Q8_0);
    CHECK(planned(g, QUILL_FTYPE_MOSTLY_Q4_K_M, "token_embd.weight") == QUILL_TYPE_Q5_0);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, 1, "attn_v") == QUILL_TYPE_Q8_0); /* q6_K layer */
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_S, 0, "attn_q") == QUILL_TYPE_Q4_0);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q5_K_S, 0, "attn_q") == QUILL_TYPE_Q5_1);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q2_K, 0, "attn_q") == QUILL_TYPE_Q4_0);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_IQ4_XS, 0, "attn_q") == QUILL_TYPE_IQ4_NL);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q6_K, 0, "attn_q") == QUILL_TYPE_Q8_0);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_0, 0, "attn_q") == QUILL_TYPE_Q4_0);
    quill_quant_choice pure[32];
    CHECK(quill_quantize_plan(g, QUILL_FTYPE_MOSTLY_Q4_K_M, true, pure, &err) == QUILL_OK, "%s", err.message);
    CHECK(pure[0].type == QUILL_TYPE_Q5_0 && pure[0].fallback); /* output.weight: q4_K -> q5_0 */
    /* and the file quantizes */
    char *out = tmp_path("shape64-q3ks.gguf");
    quill_quantize_params p = {.ftype = QUILL_FTYPE_MOSTLY_Q3_K_S};
    CHECK(quill_quantize_file(path, out, &p, &err) == QUILL_OK, "%s", err.message);
    quill_gguf *o;
    CHECK(quill_gguf_open(out, &o, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_find_tensor(o, "blk.1.ffn_up.weight")->type == QUILL_TYPE_Q4_0);
    quill_gguf_close(o);
    remove(out);
    free(out);
    free(path);
    plan_forget();
    quill_gguf_close(g);
}

TEST(quantize_refuses_requantizing_and_bad_rows) {
    REQUIRE_SHARED(sd);
    char *in = shared_path(sd, "models/synth-k-q4_0.gguf"), *out = tmp_path("requant.gguf");
    quill_quantize_params p = {.ftype = QUILL_FTYPE_MOSTLY_Q4_K_M};
    quill_error err;
    CHECK(quill_quantize_file(in, out, &p, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "requantizing");
    FILE *f = fopen(out, "rb");
    CHECK(f == NULL, "a failed quantization leaves no output file");
    /* types already as the mix wants them are copied: quantizing the reference's q4_0 file to
     * q4_0 gives the same file back */
    p.ftype = QUILL_FTYPE_MOSTLY_Q4_0;
    CHECK(quill_quantize_file(in, out, &p, &err) == QUILL_OK, "%s", err.message);
    size_t na, nb;
    char *a = read_file(in, &na), *b = read_file(out, &nb);
    CHECK(a && b && na == nb && !memcmp(a, b, na), "q4_0 -> q4_0 is not the identity");
    free(a);
    free(b);
    remove(out);
    free(in);
    free(out);

    quill_gguf *g;
    quill_quant_choice plan[16];
    /* rows of 48 fit no block type: q4_0 cannot be made; the k-quant mixes fall back to f16 */
    char *bad = write_shape_model("shape48.gguf", 1, 1, 1, 256, 48, true);
    CHECK(quill_gguf_open(bad, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_quantize_plan(g, QUILL_FTYPE_MOSTLY_Q4_0, false, plan, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "48");
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q4_K_M, 0, "attn_q") == QUILL_TYPE_F16);
    CHECK(layer_type(g, QUILL_FTYPE_MOSTLY_Q3_K_S, 0, "ffn_up") == QUILL_TYPE_F16);
    plan_forget();
    quill_gguf_close(g);
    free(bad);
    /* ... except the output matrix, whose q8_0 has no fallback (as in the reference) */
    bad = write_shape_model("shape48o.gguf", 1, 1, 1, 48, 48, true);
    CHECK(quill_gguf_open(bad, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_quantize_plan(g, QUILL_FTYPE_MOSTLY_Q4_K_M, false, plan, &err) == QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "output.weight");
    plan_forget();
    quill_gguf_close(g);
    free(bad);
}

/* ---------------------------------------------------------------- streaming writer */

TEST(quantize_writer_streaming_matches_in_memory) {
    float a[64], b[96];
    for (int i = 0; i < 64; i++) a[i] = (float)i;
    for (int i = 0; i < 96; i++) b[i] = -(float)i;
    const int64_t ne_a[2] = {32, 2}, ne_b[1] = {96}, ne_e[2] = {32, 0};
    char *p1 = tmp_path("mem.gguf"), *p2 = tmp_path("stream.gguf");
    quill_error err;

    quill_gguf_writer *w = quill_gguf_writer_new();
    quill_gguf_writer_add_str(w, "general.name", "x", 1);
    quill_gguf_writer_add_tensor(w, "a", QUILL_TYPE_F32, 2, ne_a, a);
    quill_gguf_writer_add_tensor(w, "empty", QUILL_TYPE_F32, 2, ne_e, NULL);
    quill_gguf_writer_add_tensor(w, "b", QUILL_TYPE_F32, 1, ne_b, b);
    CHECK(quill_gguf_writer_write(w, p1, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);

    w = quill_gguf_writer_new();
    quill_gguf_writer_add_str(w, "general.name", "x", 1);
    CHECK(quill_gguf_writer_add_tensor_info(w, "a", QUILL_TYPE_F32, 2, ne_a) == QUILL_OK);
    CHECK(quill_gguf_writer_add_tensor_info(w, "empty", QUILL_TYPE_F32, 2, ne_e) == QUILL_OK);
    CHECK(quill_gguf_writer_add_tensor(w, "b", QUILL_TYPE_F32, 1, ne_b, b) == QUILL_OK); /* with data: automatic */
    CHECK(quill_gguf_writer_add_tensor_info(w, "a", QUILL_TYPE_F32, 2, ne_a) == QUILL_E_ARG); /* duplicate */
    CHECK(quill_gguf_writer_write(w, p2, &err) == QUILL_E_ARG); /* declared data is missing */
    CHECK(quill_gguf_writer_begin_stream(w, p2, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_writer_add_u32(w, "late", 1) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_add_tensor_info(w, "c", QUILL_TYPE_F32, 1, ne_b) == QUILL_E_ARG);
    CHECK(quill_gguf_writer_stream_data(w, a, 100, &err) == QUILL_OK); /* pieces of any size */
    CHECK(quill_gguf_writer_stream_data(w, (const uint8_t *)a + 100, sizeof a - 100, &err) == QUILL_OK);
    CHECK(quill_gguf_writer_stream_data(w, a, 4, &err) == QUILL_E_ARG); /* nothing left to write */
    CHECK(quill_gguf_writer_finish_stream(w, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);

    size_t n1, n2;
    char *d1 = read_file(p1, &n1), *d2 = read_file(p2, &n2);
    CHECK(d1 && d2 && n1 == n2 && memcmp(d1, d2, n1) == 0, "streamed file differs (%zu / %zu bytes)", n1, n2);
    free(d1);
    free(d2);

    /* finishing early is an error that names the tensor */
    w = quill_gguf_writer_new();
    quill_gguf_writer_add_tensor_info(w, "a", QUILL_TYPE_F32, 2, ne_a);
    CHECK(quill_gguf_writer_stream_data(w, a, 4, &err) == QUILL_E_ARG); /* before begin */
    CHECK(quill_gguf_writer_begin_stream(w, p2, &err) == QUILL_OK);
    CHECK(quill_gguf_writer_stream_data(w, a, 64, &err) == QUILL_OK);
    CHECK(quill_gguf_writer_finish_stream(w, &err) == QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "'a'");
    quill_gguf_writer_free(w);
    /* a writer freed mid-stream closes its file */
    w = quill_gguf_writer_new();
    quill_gguf_writer_add_tensor_info(w, "a", QUILL_TYPE_F32, 2, ne_a);
    CHECK(quill_gguf_writer_begin_stream(w, p2, &err) == QUILL_OK);
    quill_gguf_writer_free(w);
    remove(p1);
    remove(p2);
    free(p1);
    free(p2);
}

/* ---------------------------------------------------------------- CLI */

static int run_quill(const char *args, char **out) {
    size_t n = strlen(quill_bin()) + strlen(args) + 8;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s %s", quill_bin(), args);
    int rc = run_cmd(cmd, out, true);
    free(cmd);
    return rc;
}

TEST(quantize_cli_synth_quantize_inspect) {
    REQUIRE_SHARED(sd);
    char *vocab = shared_path(sd, "models/stories260K.gguf");
    char *m1 = tmp_path("cli-synth.gguf"), *m2 = tmp_path("cli-synth-again.gguf"), *q = tmp_path("cli-q4km.gguf");
    char args[2048];
    char *out = NULL;
    /* one KV head for four query heads: GQA 4 */
    snprintf(args, sizeof args, "synth --embd 256 --layers 2 --heads 4 --kv-heads 1 --ff 512 --vocab %s --seed 5 -o %s",
             vocab, m1);
    CHECK(run_quill(args, &out) == 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "synth --embd 256 --layers 2 --heads 4 --kv-heads 1 --ff 512 --vocab %s --seed 5 -o %s",
             vocab, m2);
    CHECK(run_quill(args, &out) == 0, "%s", out);
    free(out);
    size_t n1, n2;
    char *d1 = read_file(m1, &n1), *d2 = read_file(m2, &n2);
    CHECK(d1 && d2 && n1 == n2 && !memcmp(d1, d2, n1), "synth is not deterministic for a seed");
    free(d1);
    free(d2);

    /* the synthesized model: Llama metadata, the vocabulary's tokenizer, sane weights */
    quill_gguf *g, *v;
    quill_error err;
    CHECK(quill_gguf_open(m1, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_open(vocab, &v, &err) == QUILL_OK, "%s", err.message);
    quill_hparams hp;
    CHECK(quill_hparams_from_gguf(g, &hp, &err) == QUILL_OK, "%s", err.message);
    CHECK(hp.n_embd == 256 && hp.n_layer == 2 && hp.n_head == 4 && hp.n_head_kv == 1 && hp.n_ff == 512 &&
          hp.n_vocab == 512 && hp.n_rot == 64 && !hp.tied_output);
    uint64_t u;
    CHECK(quill_gguf_get_u64(g, "general.file_type", &u, NULL) == QUILL_OK && u == 1);
    CHECK(quill_gguf_get_u64(g, "llama.context_length", &u, NULL) == QUILL_OK && u == 2048);
    int n_tok_keys = 0;
    for (uint64_t i = 0; i < quill_gguf_n_kv(v); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(v, i);
        if (strncmp(kv->key, "tokenizer.", 10)) continue;
        n_tok_keys++;
        const quill_gguf_value *c = quill_gguf_find(g, kv->key);
        /* `data` follows a string's length or an array's header, which nbytes includes */
        const uint64_t head = kv->value.type == QUILL_GGUF_STRING ? 8 : kv->value.type == QUILL_GGUF_ARRAY ? 12 : 0;
        CHECK(c && c->type == kv->value.type && c->count == kv->value.count && c->nbytes == kv->value.nbytes &&
              !memcmp(c->data, kv->value.data, kv->value.nbytes - head), "%s not copied", kv->key);
    }
    CHECK(n_tok_keys >= 3);
    const quill_gguf_tensor *wq = quill_gguf_find_tensor(g, "blk.1.attn_q.weight");
    const quill_gguf_tensor *nrm = quill_gguf_find_tensor(g, "output_norm.weight");
    CHECK(wq && wq->type == QUILL_TYPE_F16 && nrm && nrm->type == QUILL_TYPE_F32);
    float *w = malloc((size_t)wq->n_elements * sizeof *w);
    quill_dequantize(wq->type, wq->data, w, wq->n_elements, &err);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < wq->n_elements; i++) {
        s += w[i];
        s2 += (double)w[i] * w[i];
    }
    const double mean = s / (double)wq->n_elements, sd_w = sqrt(s2 / (double)wq->n_elements - mean * mean);
    CHECK(fabs(mean) < 0.002 && fabs(sd_w - 1.0 / 16.0) < 0.002, "attn_q mean %g sd %g (want 0, 1/16)", mean, sd_w);
    free(w);
    for (int i = 0; i < 256; i++) CHECK(fabsf(((const float *)nrm->data)[i] - 1.0f) <= 0.0175f); /* 1 + 0.01 sqrt(3) U(-1, 1) */
    quill_gguf_close(v);
    plan_forget();
    quill_gguf_close(g);

    /* quantize it and inspect the result */
    snprintf(args, sizeof args, "quantize %s %s q4_k_m -t 2", m1, q);
    CHECK(run_quill(args, &out) == 0, "%s", out);
    CHECK_STR_CONTAINS(out, "blk.1.attn_v.weight");
    CHECK_STR_CONTAINS(out, "f16 -> q6_K");
    CHECK_STR_CONTAINS(out, "21 tensors");
    free(out);
    snprintf(args, sizeof args, "inspect %s", q);
    CHECK(run_quill(args, &out) == 0, "%s", out);
    CHECK_STR_CONTAINS(out, "general.file_type");
    CHECK_STR_CONTAINS(out, "general.quantization_version");
    CHECK_STR_CONTAINS(out, "q4_K");
    CHECK_STR_CONTAINS(out, "n_head_kv       1");
    free(out);
    CHECK(quill_gguf_open(q, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_alignment(g) == 32 && quill_gguf_version(g) == 3);
    CHECK(quill_gguf_get_u64(g, "general.file_type", &u, NULL) == QUILL_OK && u == 15);
    CHECK(quill_gguf_get_u64(g, "general.quantization_version", &u, NULL) == QUILL_OK && u == 2);
    /* two layers: use_more_bits is true for layer 1 only; GQA 4 changes nothing for q4_k_m */
    CHECK(quill_gguf_find_tensor(g, "blk.0.attn_v.weight")->type == QUILL_TYPE_Q4_K);
    CHECK(quill_gguf_find_tensor(g, "blk.1.attn_v.weight")->type == QUILL_TYPE_Q6_K);
    CHECK(quill_gguf_find_tensor(g, "blk.1.ffn_down.weight")->type == QUILL_TYPE_Q6_K);
    CHECK(quill_gguf_find_tensor(g, "output.weight")->type == QUILL_TYPE_Q6_K);
    CHECK(quill_gguf_find_tensor(g, "token_embd.weight")->type == QUILL_TYPE_Q4_K);
    CHECK(quill_gguf_find_tensor(g, "blk.0.ffn_norm.weight")->type == QUILL_TYPE_F32);
    /* the model loads */
    plan_forget();
    quill_gguf_close(g);
    quill_model *model;
    CHECK(quill_model_load(q, &model, &err) == QUILL_OK, "%s", err.message);
    quill_model_free(model);

    remove(m1);
    remove(m2);
    remove(q);
    free(m1);
    free(m2);
    free(q);
    free(vocab);
}

TEST(quantize_cli_errors) {
    REQUIRE_SHARED(sd);
    char *in = shared_path(sd, "models/synth-k-f32.gguf"), *out = tmp_path("cli-err.gguf");
    char args[2048];
    char *text = NULL;
    snprintf(args, sizeof args, "quantize %s %s q9_k", in, out);
    CHECK(run_quill(args, &text) == 1);
    CHECK_STR_CONTAINS(text, "unknown type 'q9_k'");
    free(text);
    snprintf(args, sizeof args, "quantize %s %s q4_0", in, in);
    CHECK(run_quill(args, &text) == 1);
    CHECK_STR_CONTAINS(text, "is the input file");
    free(text);
    snprintf(args, sizeof args, "quantize %s", in);
    CHECK(run_quill(args, &text) == 1);
    free(text);
    CHECK(run_quill("quantize /nonexistent/x.gguf /tmp/y.gguf q4_0", &text) == 1);
    CHECK_STR_CONTAINS(text, "/nonexistent/x.gguf");
    free(text);
    snprintf(args, sizeof args, "synth --embd 250 --layers 1 --heads 4 --ff 64 --vocab %s -o %s", in, out);
    CHECK(run_quill(args, &text) == 1);
    CHECK_STR_CONTAINS(text, "multiple");
    free(text);
    snprintf(args, sizeof args, "synth --embd 64 --layers 1 --heads 4 --ff 64 -o %s", out);
    CHECK(run_quill(args, &text) == 1);
    CHECK_STR_CONTAINS(text, "--vocab");
    free(text);
    CHECK(run_quill("synth --like gpt-5 --vocab x -o y", &text) == 1);
    CHECK_STR_CONTAINS(text, "tinyllama-1.1b");
    free(text);
    CHECK(run_quill("quantize --help", &text) == 0);
    CHECK_STR_CONTAINS(text, "q4_k_m");
    free(text);
    CHECK(run_quill("synth --help", &text) == 0);
    free(text);
    free(in);
    free(out);
}

TEST(quantize_cli_synth_copies_chat_template) {
    REQUIRE_SHARED(sd);
    /* synth-32k carries TinyLlama's vocabulary and chat template */
    char *vocab = shared_path(sd, "models/synth-32k-q8_0.gguf"), *out = tmp_path("cli-synth-32k.gguf");
    char args[2048];
    char *text = NULL;
    snprintf(args, sizeof args, "synth --embd 64 --layers 1 --heads 2 --ff 128 --type f32 --ctx 4096 --vocab %s -o %s",
             vocab, out);
    CHECK(run_quill(args, &text) == 0, "%s", text);
    free(text);
    quill_gguf *g, *v;
    quill_error err;
    CHECK(quill_gguf_open(out, &g, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_open(vocab, &v, &err) == QUILL_OK, "%s", err.message);
    const char *a, *b;
    size_t na, nb;
    CHECK(quill_gguf_get_str(g, "tokenizer.chat_template", &a, &na, &err) == QUILL_OK, "%s", err.message);
    CHECK(quill_gguf_get_str(v, "tokenizer.chat_template", &b, &nb, &err) == QUILL_OK, "%s", err.message);
    CHECK(na == nb && !memcmp(a, b, na) && na > 0);
    uint64_t u;
    CHECK(quill_gguf_get_u64(g, "llama.vocab_size", &u, NULL) == QUILL_OK && u == 32000);
    CHECK(quill_gguf_get_u64(g, "llama.context_length", &u, NULL) == QUILL_OK && u == 4096);
    CHECK(quill_gguf_get_u64(g, "general.file_type", &u, NULL) == QUILL_OK && u == 0);
    CHECK(quill_gguf_find_tensor(g, "output.weight")->type == QUILL_TYPE_F32);
    quill_gguf_close(v);
    quill_gguf_close(g);
    remove(out);
    free(out);
    free(vocab);
}
