/* The low-bit types (q1_0, q2_0, mxfp4, nvfp4, tq1_0, tq2_0 and the grid i-quants): random valid
 * blocks of every type, in odd shapes, written to a GGUF file at test time and dequantized both by
 * quill and by the reference's own decoder (../shared/ref/bin/deqdump), compared bit for bit. */
#include "golden.h"
#include "test.h"
#include "gguf_build.h"

#include "quill.h"
#include "tensor/types_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The types this file covers, with where each keeps its scale. */
typedef enum { SCALE_HALF_FIRST, SCALE_HALF_LAST, SCALE_E8M0, SCALE_ANY, SCALE_IQ1_M } scale_kind;
typedef struct {
    uint32_t type;
    scale_kind scale;
} lowbit_type;

static const lowbit_type lowbit_types[] = {
    {QUILL_TYPE_Q1_0, SCALE_HALF_FIRST},    {QUILL_TYPE_Q2_0, SCALE_HALF_FIRST},
    {QUILL_TYPE_MXFP4, SCALE_E8M0},         {QUILL_TYPE_NVFP4, SCALE_ANY},
    {QUILL_TYPE_TQ1_0, SCALE_HALF_LAST},    {QUILL_TYPE_TQ2_0, SCALE_HALF_LAST},
    {QUILL_TYPE_IQ2_XXS, SCALE_HALF_FIRST}, {QUILL_TYPE_IQ2_XS, SCALE_HALF_FIRST},
    {QUILL_TYPE_IQ2_S, SCALE_HALF_FIRST},   {QUILL_TYPE_IQ3_XXS, SCALE_HALF_FIRST},
    {QUILL_TYPE_IQ3_S, SCALE_HALF_FIRST},   {QUILL_TYPE_IQ1_S, SCALE_HALF_FIRST},
    {QUILL_TYPE_IQ1_M, SCALE_IQ1_M},
};
#define N_LOWBIT (sizeof lowbit_types / sizeof lowbit_types[0])

/* A finite half of either sign with a biased exponent in [min_exp, min_exp + span) and a random
 * mantissa. */
static uint16_t random_scale(uint64_t *rng, uint32_t min_exp, uint32_t span) {
    const uint32_t r = test_rand(rng);
    const uint32_t exp = min_exp + r % span;
    return (uint16_t)((r >> 8 & 1) << 15 | exp << 10 | (r >> 9 & 0x3FF));
}

/* Random bytes are valid blocks of these types once their scales are made finite: half scales
 * with biased exponents in [min_exp, min_exp + span) (6 and 11: between 2^-9 and 2), the E8M0
 * exponent 128 + min_exp - 15 + [0, span), and for a model (span < 11) UE4M3 exponents
 * min_exp - 8 + [0, 4) (clamped). */
static void fill_blocks(const lowbit_type *lt, uint8_t *p, int64_t n_blocks, uint64_t *rng, uint32_t min_exp,
                        uint32_t span) {
    const size_t size = quill_type_traits_of(lt->type)->type_size;
    for (int64_t b = 0; b < n_blocks; b++, p += size) {
        for (size_t i = 0; i < size; i++) p[i] = (uint8_t)test_rand(rng);
        uint16_t h = random_scale(rng, min_exp, span);
        switch (lt->scale) {
        case SCALE_HALF_FIRST: memcpy(p, &h, 2); break;
        case SCALE_HALF_LAST: memcpy(p + size - 2, &h, 2); break;
        case SCALE_E8M0: p[0] = (uint8_t)(128 + min_exp - 15 + test_rand(rng) % span); break;
        case SCALE_ANY: /* nvfp4's four UE4M3 scales: any byte is valid, a model's are moderate */
            for (int k = 0; span < 11 && k < 4; k++) {
                const int e = (int)min_exp - 8 + (int)(test_rand(rng) % 4);
                p[k] = (uint8_t)((e < 1 ? 1 : e > 14 ? 14 : e) << 3 | (test_rand(rng) & 7));
            }
            break;
        case SCALE_IQ1_M: {
            /* the half's four nibbles are the top nibbles of the four scale words */
            uint8_t *sc = p + offsetof(block_iq1_m, scales);
            for (int k = 0; k < 4; k++) sc[2 * k + 1] = (uint8_t)((sc[2 * k + 1] & 0x0F) | ((h >> (4 * k)) & 0xF) << 4);
            break;
        }
        }
    }
}

/* Shapes whose row counts and row lengths are odd multiples of the block. */
static void tensor_shape(uint32_t type, int variant, int64_t ne[4], uint32_t *n_dims) {
    const int64_t blk = quill_type_traits_of(type)->block_size;
    ne[0] = blk * (variant ? 3 : 5);
    ne[1] = variant ? 7 : 1;
    ne[2] = variant ? 3 : 1;
    ne[3] = 1;
    *n_dims = variant ? 3 : 1;
}

/* One deqdump record: u32 name length, name, 4 x i64 ne, then the f32 data. */
typedef struct {
    const uint8_t *p, *end;
} reader;
static bool next_record(reader *r, char *name, size_t name_cap, int64_t ne[4], const float **data, int64_t *n) {
    uint32_t len;
    if ((size_t)(r->end - r->p) < 4) return false;
    memcpy(&len, r->p, 4);
    if (len >= name_cap || (size_t)(r->end - r->p) < 4 + len + 32) return false;
    memcpy(name, r->p + 4, len);
    name[len] = 0;
    memcpy(ne, r->p + 4 + len, 32);
    *n = ne[0] * ne[1] * ne[2] * ne[3];
    r->p += 4 + len + 32;
    if (*n < 0 || (size_t)(r->end - r->p) < (size_t)*n * 4) return false;
    *data = (const float *)(const void *)r->p;
    r->p += (size_t)*n * 4;
    return true;
}

TEST(types_lowbit_dequant_matches_reference) {
    REQUIRE_SHARED(shared);
    uint64_t rng = 0x5EED1234ABCDull;
    quill_gguf_writer *w = quill_gguf_writer_new();
    CHECK(w != NULL);
    quill_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    void *blocks[N_LOWBIT][2] = {{0}};
    char names[N_LOWBIT][2][32];
    bool ok = true;
    for (size_t t = 0; t < N_LOWBIT && ok; t++)
        for (int v = 0; v < 2 && ok; v++) {
            int64_t ne[4];
            uint32_t n_dims;
            tensor_shape(lowbit_types[t].type, v, ne, &n_dims);
            const quill_type_traits *tr = quill_type_traits_of(lowbit_types[t].type);
            const int64_t n_blocks = ne[0] * ne[1] * ne[2] / tr->block_size;
            blocks[t][v] = malloc((size_t)n_blocks * tr->type_size);
            if (!blocks[t][v]) abort();
            fill_blocks(&lowbit_types[t], blocks[t][v], n_blocks, &rng, 6, 11);
            snprintf(names[t][v], sizeof names[t][v], "%s.%d", tr->name, v);
            ok = quill_gguf_writer_add_tensor(w, names[t][v], lowbit_types[t].type, n_dims, ne, blocks[t][v]) == QUILL_OK;
        }
    char *model = path_join(tmp_dir(), "lowbit.gguf"), *dump = path_join(tmp_dir(), "lowbit.deq.bin");
    quill_error err = {0};
    if (ok && quill_gguf_writer_write(w, model, &err) != QUILL_OK) {
        test_fail(__FILE__, __LINE__, "writing %s: %s", model, err.message);
        ok = false;
    }
    quill_gguf_writer_free(w);

    size_t cmd_len = 4096;
    char *cmd = malloc(cmd_len);
    int pos = snprintf(cmd, cmd_len, "%s/ref/bin/deqdump %s %s", shared, model, dump);
    for (size_t t = 0; t < N_LOWBIT; t++)
        for (int v = 0; v < 2; v++) pos += snprintf(cmd + pos, cmd_len - (size_t)pos, " %s", names[t][v]);
    snprintf(cmd + pos, cmd_len - (size_t)pos, " 2>&1");
    char *out = NULL;
    if (ok && run_cmd(cmd, &out, true) != 0) {
        test_fail(__FILE__, __LINE__, "%s failed: %s", cmd, out ? out : "");
        ok = false;
    }
    free(out);
    free(cmd);

    size_t size = 0;
    uint8_t *bytes = ok ? read_file(dump, &size) : NULL;
    if (ok && !bytes) test_fail(__FILE__, __LINE__, "no output from deqdump in %s", dump), ok = false;
    reader r = {bytes, bytes + size};
    int n_checked = 0;
    while (ok) {
        char name[64];
        int64_t ne[4], n;
        const float *want;
        if (!next_record(&r, name, sizeof name, ne, &want, &n)) break;
        size_t t = 0;
        int v = 0;
        while (t < N_LOWBIT && strcmp(names[t][0], name) && strcmp(names[t][1], name)) t++;
        if (t == N_LOWBIT) {
            test_fail(__FILE__, __LINE__, "deqdump wrote an unexpected tensor '%s'", name);
            break;
        }
        v = strcmp(names[t][0], name) ? 1 : 0;
        float *got = malloc((size_t)n * sizeof *got);
        if (!got) abort();
        if (quill_dequantize(lowbit_types[t].type, blocks[t][v], got, n, &err) != QUILL_OK) {
            test_fail(__FILE__, __LINE__, "%s: %s", name, err.message);
            ok = false;
        } else if (memcmp(got, want, (size_t)n * sizeof *got)) {
            int64_t i = 0;
            while (!memcmp(&got[i], &want[i], 4)) i++;
            test_fail(__FILE__, __LINE__, "%s: element %lld (row %lld) is %.9g, the reference's %.9g", name,
                      (long long)i, (long long)(i / ne[0]), (double)got[i], (double)want[i]);
            ok = false;
        } else {
            n_checked++;
        }
        free(got);
    }
    if (ok) CHECK_EQ_INT(n_checked, 2 * N_LOWBIT);
    free(bytes);
    for (size_t t = 0; t < N_LOWBIT; t++) free(blocks[t][0]), free(blocks[t][1]);
    free(model);
    free(dump);
}

/* The facts the dequantizers rest on, worked out by hand: sign parity, the E8M0 scale, and the
 * ternary base-3 packing. */
TEST(types_lowbit_hand_blocks) {
    CHECK(quill_iq_signs(0) == 0 && quill_iq_signs(1) == 0x81 && quill_iq_signs(3) == 3 && quill_iq_signs(127) == 0xFF);
    CHECK(quill_e8m0_half_to_float(128) == 1.0f && quill_e8m0_half_to_float(127) == 0.5f);
    CHECK(quill_e8m0_half_to_float(0) == ldexpf(1.0f, -128) && quill_e8m0_half_to_float(1) == ldexpf(1.0f, -127));

    /* mxfp4, e = 127 (scale 2^0): each nibble reads as its fp4 value */
    uint8_t mx[17];
    mx[0] = 127;
    for (int j = 0; j < 16; j++) mx[1 + j] = (uint8_t)(j | (15 - j) << 4);
    float out[256];
    CHECK(quill_dequantize(QUILL_TYPE_MXFP4, mx, out, 32, NULL) == QUILL_OK);
    static const float fp4[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
    for (int j = 0; j < 16; j++) CHECK(out[j] == fp4[j] && out[16 + j] == fp4[15 - j], "mxfp4[%d]", j);

    /* tq2_0 with d = 2: codes 0..3 are -2, 0, 2, 4 */
    uint8_t tq2[66] = {0};
    const uint16_t two = quill_f32_to_f16(2.0f);
    memcpy(tq2 + 64, &two, 2);
    tq2[0] = 0xE4; /* codes 0, 1, 2, 3 for weights 0, 32, 64, 96 */
    CHECK(quill_dequantize(QUILL_TYPE_TQ2_0, tq2, out, 256, NULL) == QUILL_OK);
    CHECK(out[0] == -2 && out[32] == 0 && out[64] == 2 && out[96] == 4 && out[1] == -2);

    /* tq1_0: the byte for trits (2, 0, 1, 1, 0) = 2·81 + 0·27 + 1·9 + 1·3 + 0 = 174 is
     * ceil(174 · 256 / 243) = 184 */
    uint8_t tq1[54] = {0};
    const uint16_t one = quill_f32_to_f16(1.0f);
    memcpy(tq1 + 52, &one, 2);
    tq1[0] = 184;
    CHECK(quill_dequantize(QUILL_TYPE_TQ1_0, tq1, out, 256, NULL) == QUILL_OK);
    CHECK(out[0] == 1 && out[32] == -1 && out[64] == 0 && out[96] == 0 && out[128] == -1, "tq1_0 trits %g %g %g %g %g",
          (double)out[0], (double)out[32], (double)out[64], (double)out[96], (double)out[128]);

    /* q1_0: bit set = +d */
    uint8_t q1[18] = {0};
    memcpy(q1, &two, 2);
    q1[2] = 0x01;
    CHECK(quill_dequantize(QUILL_TYPE_Q1_0, q1, out, 128, NULL) == QUILL_OK);
    CHECK(out[0] == 2 && out[1] == -2 && out[127] == -2);
}

/* Blocks inside a mapped file carry no alignment promise: every type decodes the same at an odd
 * address (and cleanly under UBSan). */
TEST(types_lowbit_unaligned) {
    uint64_t rng = 99;
    for (size_t t = 0; t < N_LOWBIT; t++) {
        const quill_type_traits *tr = quill_type_traits_of(lowbit_types[t].type);
        uint8_t aligned[2 * 256] __attribute__((aligned(16))), odd[2 * 256 + 1];
        fill_blocks(&lowbit_types[t], aligned, 2, &rng, 6, 11);
        memcpy(odd + 1, aligned, 2 * tr->type_size);
        float a[512], b[512];
        CHECK(quill_dequantize(lowbit_types[t].type, aligned, a, 2 * tr->block_size, NULL) == QUILL_OK);
        CHECK(quill_dequantize(lowbit_types[t].type, odd + 1, b, 2 * tr->block_size, NULL) == QUILL_OK);
        CHECK(!memcmp(a, b, (size_t)(2 * tr->block_size) * sizeof(float)), "%s differs when unaligned", tr->name);
    }
}

/* A model whose weight matrices are of the new types (random blocks, each matrix a different type)
 * loads and runs: quill verify finds the fast path within its tolerance of float64. */
TEST(types_lowbit_model_runs) {
    REQUIRE_SHARED(shared);
    quill_gguf *g = NULL;
    quill_gguf_writer *w = writer_from_model(shared, "models/synth-k-f32.gguf", &g);
    if (!w) return;
    char *dst = path_join(tmp_dir(), "lowbit-model.gguf");
    quill_error err = {0};
    uint64_t rng = 7;
    size_t next = 0;
    bool used[N_LOWBIT] = {false};
    void *data[512];
    size_t n_data = 0;
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        if (strncmp(t->name, "blk.", 4) || t->n_dims != 2 || n_data == sizeof data / sizeof data[0]) {
            quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
            continue;
        }
        const lowbit_type *lt = &lowbit_types[next];
        used[next] = true;
        next = (next + 1) % N_LOWBIT;
        const quill_type_traits *tr = quill_type_traits_of(lt->type);
        const int64_t n_blocks = t->n_elements / tr->block_size;
        /* weights of a few hundredths (an n_embd of 256 wants about 1/16): each type's scale
         * exponent for that, from its largest codes and sub-block scales */
        uint32_t exp;
        switch (lt->type) {
        case QUILL_TYPE_IQ2_XXS: case QUILL_TYPE_IQ2_XS: case QUILL_TYPE_IQ2_S: exp = 4; break;
        case QUILL_TYPE_IQ3_XXS: case QUILL_TYPE_IQ3_S: exp = 3; break;
        case QUILL_TYPE_IQ1_S: case QUILL_TYPE_IQ1_M: exp = 7; break;
        case QUILL_TYPE_MXFP4: exp = 8; break;
        case QUILL_TYPE_Q2_0: exp = 9; break;
        case QUILL_TYPE_NVFP4: exp = 10; break;
        default: exp = 10; break;
        }
        data[n_data] = malloc((size_t)n_blocks * tr->type_size);
        if (!data[n_data]) abort();
        fill_blocks(lt, data[n_data], n_blocks, &rng, exp - 1, 2);
        quill_gguf_writer_add_tensor(w, t->name, lt->type, t->n_dims, t->ne, data[n_data]);
        n_data++;
    }
    quill_status st = quill_gguf_writer_write(w, dst, &err);
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    for (size_t i = 0; i < n_data; i++) free(data[i]);
    for (size_t t = 0; t < N_LOWBIT; t++) CHECK(used[t], "no matrix of type %s", quill_type_name(lowbit_types[t].type));
    CHECK(st == QUILL_OK, "%s", err.message);
    char cmd[1024], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s verify -m %s --tokens 1,20,300,45,67 -t 2", quill_bin(), dst);
    int rc = run_cmd(cmd, &out, true);
    if (!getenv("KEEP")) remove(dst);
    free(dst);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "ok:");
    free(out);
}

/* The GGUF fuzzer's seed of these types (fuzz/seeds/lowbit.gguf.seed): two rows of random valid
 * blocks of each, built here and compared with the committed file (QUILL_REGEN_MALFORMED=1
 * rewrites it; run from the repository root). */
TEST(types_lowbit_fuzz_seed) {
    uint64_t rng = 4242;
    quill_gguf_writer *w = quill_gguf_writer_new();
    CHECK(w != NULL);
    quill_gguf_writer_add_str(w, "general.architecture", "llama", 5);
    void *blocks[N_LOWBIT] = {0};
    bool ok = true;
    for (size_t t = 0; t < N_LOWBIT && ok; t++) {
        const quill_type_traits *tr = quill_type_traits_of(lowbit_types[t].type);
        const int64_t ne[2] = {tr->block_size, 2};
        blocks[t] = malloc(2 * tr->type_size);
        if (!blocks[t]) abort();
        fill_blocks(&lowbit_types[t], blocks[t], 2, &rng, 6, 11);
        char name[32];
        snprintf(name, sizeof name, "w.%s", tr->name);
        ok = quill_gguf_writer_add_tensor(w, name, lowbit_types[t].type, 2, ne, blocks[t]) == QUILL_OK;
    }
    char *path = path_join(tmp_dir(), "lowbit.gguf.seed");
    quill_error err = {0};
    ok = ok && quill_gguf_writer_write(w, path, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    for (size_t t = 0; t < N_LOWBIT; t++) free(blocks[t]);
    size_t n = 0, have_n = 0;
    void *built = ok ? read_file(path, &n) : NULL;
    free(path);
    CHECK(built && n <= 6000, "building the seed: %s (%zu bytes)", err.message, n);
    const char *regen = getenv("QUILL_REGEN_MALFORMED");
    if (regen && !strcmp(regen, "1")) {
        FILE *f = fopen("fuzz/seeds/lowbit.gguf.seed", "wb");
        CHECK(f && fwrite(built, 1, n, f) == n && fclose(f) == 0, "writing fuzz/seeds/lowbit.gguf.seed");
    }
    void *have = read_file("fuzz/seeds/lowbit.gguf.seed", &have_n);
    const bool same = have && have_n == n && !memcmp(have, built, n);
    free(have);
    free(built);
    CHECK(same, "fuzz/seeds/lowbit.gguf.seed differs from its builder (run from the repository root; regenerate "
                "with QUILL_REGEN_MALFORMED=1)");
}
