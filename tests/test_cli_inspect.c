/* `quill inspect` and `quill tensor` on every reference file, checked against the library's own
 * view of the file: text output, --json parsed with cJSON, tensor dumps against the reference
 * dequantization, and the failures a user meets (bad path, bad file, unknown tensor). */
#include "test.h"

#include "quill.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

/* ---------------------------------------------------------------- helpers */

/* The *.gguf files of shared/<sub>, sorted, as full paths; NULL-terminated. */
static char **list_ggufs(const char *shared, const char *sub, int *count) {
    char *dir = path_join(shared, sub);
    DIR *d = opendir(dir);
    char **out = calloc(256, sizeof *out);
    int n = 0;
    if (d) {
        struct dirent *e;
        while ((e = readdir(d)) && n < 255) {
            size_t len = strlen(e->d_name);
            if (len > 5 && strcmp(e->d_name + len - 5, ".gguf") == 0) out[n++] = path_join(dir, e->d_name);
        }
        closedir(d);
    }
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && strcmp(out[j - 1], out[j]) > 0; j--) {
            char *t = out[j];
            out[j] = out[j - 1];
            out[j - 1] = t;
        }
    free(dir);
    *count = n;
    return out;
}

static void free_list(char **l) {
    for (int i = 0; l && l[i]; i++) free(l[i]);
    free(l);
}

/* Every reference GGUF the CLI must describe: the models and the vocabulary-only file. */
static char **shared_files(const char *shared, int *count) {
    int nm, nt;
    char **m = list_ggufs(shared, "models", &nm), **t = list_ggufs(shared, "tokenizer", &nt);
    for (int i = 0; i < nt && nm < 255; i++) m[nm++] = t[i];
    free(t);
    *count = nm;
    return m;
}

/* Runs quill with `args` appended; returns the exit status and the output (caller frees). */
static int quill(const char *args, char **out, bool merge_stderr) {
    size_t n = strlen(quill_bin()) + strlen(args) + 8;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s %s", quill_bin(), args);
    int rc = run_cmd(cmd, out, merge_stderr);
    free(cmd);
    return rc;
}

static char *fmt(const char *f, const char *a, const char *b, const char *c) {
    size_t n = strlen(f) + strlen(a) + (b ? strlen(b) : 0) + (c ? strlen(c) : 0) + 1;
    char *s = malloc(n);
    snprintf(s, n, f, a, b ? b : "", c ? c : "");
    return s;
}

static bool quill_built(void) {
    struct stat st;
    if (stat(quill_bin(), &st) == 0) return true;
    test_fail(__FILE__, __LINE__, "%s is not built (set QUILL_BIN)", quill_bin());
    return false;
}

static const char *base_name(const char *p) {
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---------------------------------------------------------------- inspect, text */

TEST(cli_inspect_text_every_shared_file) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    int n;
    char **files = shared_files(shared, &n);
    CHECK(n >= 20, "only %d reference files found", n);
    for (int i = 0; i < n; i++) {
        quill_gguf *g;
        quill_error err = {0};
        CHECK(quill_gguf_open(files[i], &g, &err) == QUILL_OK, "%s", err.message);
        char *args = fmt("inspect '%s'", files[i], NULL, NULL), *out = NULL;
        int rc = quill(args, &out, false);
        free(args);
        CHECK(rc == 0, "inspect %s exited %d:\n%s", files[i], rc, out);
        char line[512];
        snprintf(line, sizeof line, "file         %s\n", files[i]);
        CHECK_STR_CONTAINS(out, line);
        snprintf(line, sizeof line, "version      %u\n", quill_gguf_version(g));
        CHECK_STR_CONTAINS(out, line);
        snprintf(line, sizeof line, "size         %llu bytes\n", (unsigned long long)quill_gguf_file_size(g));
        CHECK_STR_CONTAINS(out, line);
        snprintf(line, sizeof line, "metadata (%llu keys)\n", (unsigned long long)quill_gguf_n_kv(g));
        CHECK_STR_CONTAINS(out, line);
        snprintf(line, sizeof line, "tensors (%llu)\n", (unsigned long long)quill_gguf_n_tensors(g));
        CHECK_STR_CONTAINS(out, line);
        CHECK_STR_CONTAINS(out, "\ntotals\n");
        CHECK_STR_CONTAINS(out, " hyperparameters\n");
        for (uint64_t k = 0; k < quill_gguf_n_kv(g); k++) {
            snprintf(line, sizeof line, "\n  %-40s ", quill_gguf_kv_at(g, k)->key);
            CHECK_STR_CONTAINS(out, line);
        }
        for (uint64_t k = 0; k < quill_gguf_n_tensors(g); k++) {
            const quill_gguf_tensor *t = quill_gguf_tensor_at(g, k);
            snprintf(line, sizeof line, "\n  %-32s %-8s ", t->name, quill_type_name(t->type));
            CHECK_STR_CONTAINS(out, line);
        }
        free(out);
        quill_gguf_close(g);
    }
    free_list(files);
}

/* ---------------------------------------------------------------- inspect, JSON */

static bool json_num(const cJSON *o, const char *k, double *v) {
    const cJSON *x = cJSON_GetObjectItemCaseSensitive(o, k);
    if (!cJSON_IsNumber(x)) return false;
    *v = x->valuedouble;
    return true;
}

/* A scalar value as inspect --json prints it, compared with the library's reading. */
static bool json_scalar_matches(const cJSON *j, const quill_gguf_value *v) {
    double d;
    if (v->type == QUILL_GGUF_BOOL) return cJSON_IsBool(j) && cJSON_IsTrue(j) == (v->data[0] != 0);
    if (v->type == QUILL_GGUF_STRING)
        return cJSON_IsString(j) && strlen(j->valuestring) == v->count && memcmp(j->valuestring, v->data, v->count) == 0;
    if (!quill_gguf_value_f64(v, &d)) return false;
    if (isnan(d) || isinf(d)) return cJSON_IsNull(j);
    if (!cJSON_IsNumber(j)) return false;
    if (v->type == QUILL_GGUF_FLOAT32) return (float)j->valuedouble == (float)d;
    if (v->type == QUILL_GGUF_FLOAT64) return fabs(j->valuedouble - d) <= 1e-8 * fabs(d);
    return j->valuedouble == d;
}

static bool json_value_matches(const cJSON *j, const quill_gguf_value *v, char *why, size_t cap) {
    if (v->type != QUILL_GGUF_ARRAY) {
        if (!json_scalar_matches(j, v)) {
            char *p = cJSON_PrintUnformatted(j);
            snprintf(why, cap, "%s value %.200s", quill_gguf_type_name(v->type), p ? p : "?");
            free(p);
            return false;
        }
        return true;
    }
    double count;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(j, "type");
    const cJSON *et = cJSON_GetObjectItemCaseSensitive(j, "elem_type");
    const cJSON *first = cJSON_GetObjectItemCaseSensitive(j, "first");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "array") != 0 || !cJSON_IsString(et) ||
        strcmp(et->valuestring, quill_gguf_type_name(v->elem_type)) != 0 || !json_num(j, "count", &count) ||
        count != (double)v->count || !cJSON_IsArray(first)) {
        snprintf(why, cap, "array header");
        return false;
    }
    int n = cJSON_GetArraySize(first);
    if ((uint64_t)n != (v->count < 8 ? v->count : 8)) {
        snprintf(why, cap, "array preview of %d elements for %llu", n, (unsigned long long)v->count);
        return false;
    }
    uint64_t cursor = 0;
    quill_gguf_value e;
    for (int i = 0; i < n; i++) {
        if (!quill_gguf_array_next(v, &cursor, &e)) return false;
        if (!json_value_matches(cJSON_GetArrayItem(first, i), &e, why, cap)) return false;
    }
    return true;
}

static void check_inspect_json(const char *path) {
    quill_gguf *g;
    quill_error err = {0};
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    char *args = fmt("inspect '%s' --json", path, NULL, NULL), *out = NULL;
    int rc = quill(args, &out, false);
    free(args);
    CHECK(rc == 0, "inspect --json %s exited %d", path, rc);
    cJSON *root = cJSON_Parse(out);
    CHECK(root, "inspect --json %s is not JSON near: %.80s", path, cJSON_GetErrorPtr() ? cJSON_GetErrorPtr() : "?");
    free(out);

    const cJSON *file = cJSON_GetObjectItemCaseSensitive(root, "file");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(file, "path");
    double v;
    CHECK(cJSON_IsString(p) && strcmp(p->valuestring, path) == 0);
    CHECK(json_num(file, "version", &v) && v == quill_gguf_version(g));
    CHECK(json_num(file, "alignment", &v) && v == (double)quill_gguf_alignment(g));
    CHECK(json_num(file, "size", &v) && v == (double)quill_gguf_file_size(g));
    CHECK(json_num(file, "data_offset", &v) && v == (double)quill_gguf_data_offset(g));

    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    CHECK(cJSON_IsObject(meta) && (uint64_t)cJSON_GetArraySize(meta) == quill_gguf_n_kv(g), "%s: metadata", path);
    uint64_t k = 0;
    for (const cJSON *item = meta->child; item; item = item->next, k++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, k);
        CHECK(strcmp(item->string, kv->key) == 0, "%s: key %llu is '%s', expected '%s'", path,
              (unsigned long long)k, item->string, kv->key);
        char why[300] = "";
        CHECK(json_value_matches(item, &kv->value, why, sizeof why), "%s: '%s': %s", path, kv->key, why);
    }

    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(root, "tensors");
    CHECK(cJSON_IsArray(tensors) && (uint64_t)cJSON_GetArraySize(tensors) == quill_gguf_n_tensors(g));
    uint64_t bytes = 0, elements = 0;
    k = 0;
    for (const cJSON *jt = tensors->child; jt; jt = jt->next, k++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, k);
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(jt, "name");
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(jt, "type");
        const cJSON *dims = cJSON_GetObjectItemCaseSensitive(jt, "dims");
        CHECK(cJSON_IsString(name) && strcmp(name->valuestring, t->name) == 0);
        CHECK(cJSON_IsString(type) && strcmp(type->valuestring, quill_type_name(t->type)) == 0);
        CHECK(cJSON_IsArray(dims) && (uint32_t)cJSON_GetArraySize(dims) == t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            CHECK(cJSON_GetArrayItem(dims, (int)d)->valuedouble == (double)t->ne[d]);
        CHECK(json_num(jt, "bytes", &v) && v == (double)t->nbytes);
        CHECK(json_num(jt, "offset", &v) && v == (double)t->file_offset);
        bytes += t->nbytes;
        elements += (uint64_t)t->n_elements;
    }
    const cJSON *all = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "totals"), "all");
    CHECK(json_num(all, "tensors", &v) && v == (double)quill_gguf_n_tensors(g));
    CHECK(json_num(all, "bytes", &v) && v == (double)bytes);
    CHECK(json_num(all, "elements", &v) && v == (double)elements);

    /* hparams: an object with the library's values, or null with the reason. */
    quill_hparams hp;
    const cJSON *jh = cJSON_GetObjectItemCaseSensitive(root, "hparams");
    if (quill_hparams_from_gguf(g, &hp, &err) == QUILL_OK) {
        CHECK(cJSON_IsObject(jh), "%s: hparams", path);
        CHECK(json_num(jh, "n_embd", &v) && v == (double)hp.n_embd);
        CHECK(json_num(jh, "n_layer", &v) && v == (double)hp.n_layer);
        CHECK(json_num(jh, "n_vocab", &v) && v == (double)hp.n_vocab);
        CHECK(cJSON_IsBool(cJSON_GetObjectItemCaseSensitive(jh, "tied_output")));
    } else {
        const cJSON *he = cJSON_GetObjectItemCaseSensitive(root, "hparams_error");
        CHECK(cJSON_IsNull(jh) && cJSON_IsString(he) && strcmp(he->valuestring, err.message) == 0);
    }
    cJSON_Delete(root);
    quill_gguf_close(g);
}

TEST(cli_inspect_json_every_shared_file) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    int n;
    char **files = shared_files(shared, &n);
    CHECK(n >= 20, "only %d reference files found", n);
    for (int i = 0; i < n; i++) check_inspect_json(files[i]);
    free_list(files);
}

/* The vocabulary-only file: metadata, no tensors, and a clean exit. */
TEST(cli_inspect_vocab_only_file) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    char *path = path_join(shared, "tokenizer/ggml-vocab-llama-spm.gguf");
    char *args = fmt("inspect '%s' --json", path, NULL, NULL), *out = NULL;
    int rc = quill(args, &out, true);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    cJSON *root = cJSON_Parse(out);
    CHECK(root, "not JSON");
    CHECK(cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(root, "tensors")) == 0);
    const cJSON *toks = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "metadata"),
                                                         "tokenizer.ggml.tokens");
    double v;
    CHECK(json_num(toks, "count", &v) && v == 32000);
    cJSON_Delete(root);
    free(out);
    free(args);
    args = fmt("inspect '%s'", path, NULL, NULL);
    rc = quill(args, &out, true);
    CHECK(rc == 0);
    CHECK_STR_CONTAINS(out, "tensors (0)\n");
    CHECK_STR_CONTAINS(out, "[string × 32000] \"<unk>\", \"<s>\", \"</s>\"");
    CHECK(!strstr(out, "quill:"), "no error or warning expected:\n%s", out);
    free(out);
    free(args);
    free(path);
}

/* Values real files do not have: escapes, non-ASCII, NaN and infinities, nested arrays, a
 * zero-element tensor. The JSON must still parse and match. */
TEST(cli_inspect_json_unusual_values) {
    if (!quill_built()) return;
    quill_gguf_writer *w = quill_gguf_writer_new();
    const char *tricky = "quote \" backslash \\ newline \n tab \t bell \a nul-less \x01 utf8 \xe2\x96\x81 end";
    quill_gguf_writer_add_str(w, "s.tricky", tricky, strlen(tricky));
    quill_gguf_writer_add_str(w, "key \"with\" quotes\n", "v", 1);
    quill_gguf_writer_add_f32(w, "f.nan", NAN);
    quill_gguf_writer_add_f32(w, "f.inf", INFINITY);
    quill_gguf_writer_add_f32(w, "f.ninf", -INFINITY);
    quill_gguf_writer_add_f32(w, "f.small", 1e-38f);
    quill_gguf_writer_add_i32(w, "i.min", INT32_MIN);
    quill_gguf_writer_add_u64(w, "u.max", UINT64_MAX);
    quill_gguf_writer_add_bool(w, "b.false", false);
    static const double f64s[3] = {NAN, 1e308, -0.0};
    quill_gguf_writer_add_arr(w, "a.f64", QUILL_GGUF_FLOAT64, f64s, 3);
    const char *strs[10] = {"a", "b\"", "c\n", "d", "e", "f", "g", "h", "i", "j"};
    quill_gguf_writer_add_str_arr(w, "a.strs", strs, NULL, 10);
    char long_str[400];
    memset(long_str, 'x', sizeof long_str);
    quill_gguf_writer_add_str(w, "s.long", long_str, sizeof long_str);
    float data[4] = {1, 2, 3, 4};
    int64_t ne_empty[2] = {0, 4}, ne[1] = {4};
    quill_gguf_writer_add_tensor(w, "empty", QUILL_TYPE_F32, 2, ne_empty, NULL);
    quill_gguf_writer_add_tensor(w, "name with \"quotes\"", QUILL_TYPE_F32, 1, ne, data);
    char *src = path_join(tmp_dir(), "unusual-src.gguf");
    quill_error err = {0};
    CHECK(quill_gguf_writer_write(w, src, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);

    /* Nested arrays come from a copy of a hand-made value. */
    static const uint8_t nested[] = {
        9, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0,       /* array of 2 arrays */
        8, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,       /* array of 1 string */
        2, 0, 0, 0, 0, 0, 0, 0, 'h', 'i',
        0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 5, 6, /* array of 2 u8 */
    };
    quill_gguf_value nv = {QUILL_GGUF_ARRAY, QUILL_GGUF_ARRAY, 2, nested + 12, sizeof nested};
    quill_gguf *g;
    CHECK(quill_gguf_open(src, &g, &err) == QUILL_OK, "%s", err.message);
    w = quill_gguf_writer_new();
    for (uint64_t i = 0; i < quill_gguf_n_kv(g); i++)
        CHECK(quill_gguf_writer_add_value(w, quill_gguf_kv_at(g, i)->key, &quill_gguf_kv_at(g, i)->value) == QUILL_OK);
    CHECK(quill_gguf_writer_add_value(w, "a.nested", &nv) == QUILL_OK);
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        CHECK(quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK);
    }
    quill_gguf_close(g);
    char *path = path_join(tmp_dir(), "unusual.gguf");
    CHECK(quill_gguf_writer_write(w, path, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);

    check_inspect_json(path);
    char *args = fmt("inspect '%s'", path, NULL, NULL), *out = NULL;
    int rc = quill(args, &out, true);
    CHECK(rc == 0, "text inspect exited %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "f.nan");
    CHECK_STR_CONTAINS(out, "nan");
    CHECK_STR_CONTAINS(out, "... (400 bytes)");
    CHECK_STR_CONTAINS(out, "[array × 2] [string × 1] \"hi\", [u8 × 2] 5, 6");
    CHECK_STR_CONTAINS(out, "hyperparameters\n  (none: ");
    free(out);
    free(args);
    /* `quill tensor` on the zero-element tensor writes an empty file. */
    char *dst = path_join(tmp_dir(), "empty.f32");
    args = fmt("tensor '%s' empty -o '%s'", path, dst, NULL);
    rc = quill(args, &out, true);
    CHECK(rc == 0, "%s", out);
    size_t n = 1;
    void *bytes = read_file(dst, &n);
    CHECK(bytes && n == 0);
    free(bytes);
    free(out);
    free(args);
    free(dst);
    free(src);
    free(path);
}

/* ---------------------------------------------------------------- tensor */

/* `quill tensor` writes n_elements float32s equal to the library's dequantization, for the
 * first tensor of each type in each file (every type the reference models hold). */
TEST(cli_inspect_tensor_every_type) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    int n;
    char **files = list_ggufs(shared, "models", &n);
    CHECK(n >= 20);
    char *dst = path_join(tmp_dir(), "tensor.f32");
    int dumped = 0;
    for (int i = 0; i < n; i++) {
        quill_gguf *g;
        quill_error err = {0};
        CHECK(quill_gguf_open(files[i], &g, &err) == QUILL_OK, "%s", err.message);
        bool seen[QUILL_TYPE_COUNT] = {0};
        for (uint64_t k = 0; k < quill_gguf_n_tensors(g); k++) {
            const quill_gguf_tensor *t = quill_gguf_tensor_at(g, k);
            if (t->type >= QUILL_TYPE_COUNT || seen[t->type]) continue;
            seen[t->type] = true;
            remove(dst);
            char *args = fmt("tensor '%s' '%s' -o '%s'", files[i], t->name, dst), *out = NULL;
            int rc = quill(args, &out, true);
            free(args);
            CHECK(rc == 0, "tensor %s %s exited %d: %s", files[i], t->name, rc, out);
            char want[256];
            snprintf(want, sizeof want, "%s: %s [", t->name, quill_type_name(t->type));
            CHECK_STR_CONTAINS(out, want);
            free(out);
            size_t size;
            float *got = read_file(dst, &size);
            CHECK(got, "no output from tensor %s %s", files[i], t->name);
            CHECK(size == (size_t)t->n_elements * 4, "%s %s: %zu bytes, expected %lld", base_name(files[i]),
                  t->name, size, (long long)t->n_elements * 4);
            float *ref = malloc(size ? size : 1);
            CHECK(quill_dequantize(t->type, t->data, ref, t->n_elements, &err) == QUILL_OK, "%s", err.message);
            bool same = memcmp(ref, got, size) == 0;
            free(ref);
            free(got);
            CHECK(same, "%s %s: output differs from quill_dequantize", base_name(files[i]), t->name);
            dumped++;
        }
        quill_gguf_close(g);
    }
    CHECK(dumped >= 20, "only %d tensors dumped", dumped);
    free(dst);
    free_list(files);
}

/* Bit-exact against the reference implementation's dequantization. */
TEST(cli_inspect_tensor_matches_dequant_golden) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    static const char *const cases[] = {"synth-k-q4_k_m", "synth-k-q8_0"};
    static const char *const names[] = {"blk.0.attn_q.weight", "blk.0.attn_v.weight", "blk.1.ffn_down.weight"};
    char *dst = path_join(tmp_dir(), "golden.f32");
    for (size_t c = 0; c < 2; c++) {
        char model_rel[128], gold_rel[128];
        snprintf(model_rel, sizeof model_rel, "models/%s.gguf", cases[c]);
        snprintf(gold_rel, sizeof gold_rel, "golden/dequant/%s.dequant.gguf", cases[c]);
        char *model = path_join(shared, model_rel), *gold = path_join(shared, gold_rel);
        quill_gguf *g;
        quill_error err = {0};
        CHECK(quill_gguf_open(gold, &g, &err) == QUILL_OK, "%s", err.message);
        for (size_t k = 0; k < 3; k++) {
            const quill_gguf_tensor *ref = quill_gguf_find_tensor(g, names[k]);
            CHECK(ref && ref->type == QUILL_TYPE_F32, "%s: %s", gold, names[k]);
            remove(dst);
            char *args = fmt("tensor '%s' '%s' -o '%s'", model, names[k], dst), *out = NULL;
            int rc = quill(args, &out, true);
            free(args);
            CHECK(rc == 0, "%s", out);
            free(out);
            size_t size;
            float *got = read_file(dst, &size);
            CHECK(got && size == ref->nbytes, "%s %s: %zu bytes, expected %llu", cases[c], names[k], size,
                  (unsigned long long)ref->nbytes);
            size_t bad = 0, first = 0;
            const float *want = ref->data;
            for (size_t i = 0; i < size / 4; i++)
                if (memcmp(&got[i], &want[i], 4) != 0 && bad++ == 0) first = i;
            float gf = got[first], wf = want[first];
            free(got);
            CHECK(bad == 0, "%s %s: %zu of %zu values differ from the reference, first [%zu] %.9g vs %.9g",
                  cases[c], names[k], bad, size / 4, first, (double)gf, (double)wf);
        }
        quill_gguf_close(g);
        free(model);
        free(gold);
    }
    free(dst);
}

/* ---------------------------------------------------------------- failures */

TEST(cli_inspect_failures) {
    if (!quill_built()) return;
    char *out = NULL;
    int rc = quill("inspect /nonexistent/model.gguf", &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "quill: /nonexistent/model.gguf: cannot open: No such file or directory");
    free(out);

    rc = quill("inspect /nonexistent/model.gguf --json 2>/dev/null", &out, false);
    CHECK(rc != 0 && out[0] == 0, "nothing on stdout for a failure, got: %s", out);
    free(out);

    char *args = fmt("inspect '%s'", tmp_dir(), NULL, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "not a regular file");
    free(out);

    rc = quill("inspect tests/malformed/magic_bad.gguf.bad", &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "quill: tests/malformed/magic_bad.gguf.bad: offset 0: bad magic 'GGUX'");
    free(out);

    rc = quill("inspect", &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "usage: quill inspect MODEL.gguf");
    free(out);
    rc = quill("inspect --bogus x.gguf", &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "unknown option '--bogus'");
    free(out);
    rc = quill("inspect a.gguf b.gguf", &out, true);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "more than one file");
    free(out);
    rc = quill("inspect --help", &out, true);
    CHECK(rc == 0);
    CHECK_STR_CONTAINS(out, "usage: quill inspect");
    free(out);
}

/* A real model cut short: the message says truncated, with the offset. */
TEST(cli_inspect_truncated_model) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    char *model = path_join(shared, "models/stories260K.gguf");
    size_t n;
    char *bytes = read_file(model, &n);
    CHECK(bytes && n > 100000);
    char *cut = path_join(tmp_dir(), "cut.gguf");
    static const size_t lens[] = {3, 20, 5000, 100000};
    for (size_t i = 0; i < 4; i++) {
        FILE *f = fopen(cut, "wb");
        CHECK(f && fwrite(bytes, 1, lens[i], f) == lens[i] && fclose(f) == 0);
        char *args = fmt("inspect '%s'", cut, NULL, NULL), *out = NULL;
        int rc = quill(args, &out, true);
        free(args);
        CHECK(rc != 0, "a %zu-byte prefix was accepted", lens[i]);
        CHECK_STR_CONTAINS(out, cut);
        CHECK_STR_CONTAINS(out, ": offset ");
        CHECK(strstr(out, "truncated") || strstr(out, "bad magic") || strstr(out, "cannot fit"), "%s", out);
        free(out);
    }
    free(bytes);
    free(cut);
    free(model);
}

/* Every file of the malformed corpus fails `quill inspect` with its manifest message. */
TEST(cli_inspect_malformed_corpus) {
    if (!quill_built()) return;
    size_t n;
    char *manifest = read_file("tests/malformed/MANIFEST.tsv", &n);
    CHECK(manifest, "tests/malformed/MANIFEST.tsv missing (run from the repository root)");
    int checked = 0;
    char *save = NULL;
    for (char *line = strtok_r(manifest, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        CHECK(t1 && t2);
        *t1 = 0;
        char *args = fmt("inspect 'tests/malformed/%s' --json", line, NULL, NULL), *out = NULL;
        int rc = quill(args, &out, true);
        free(args);
        CHECK(rc == 1, "%s: exit %d", line, rc);
        CHECK(strncmp(out, "quill: tests/malformed/", 23) == 0, "%s: %s", line, out);
        CHECK_STR_CONTAINS(out, t2 + 1);
        free(out);
        checked++;
    }
    free(manifest);
    CHECK(checked >= 30, "%d", checked);
}

TEST(cli_inspect_tensor_failures) {
    REQUIRE_SHARED(shared);
    if (!quill_built()) return;
    char *model = path_join(shared, "models/stories260K.gguf");
    char *dst = path_join(tmp_dir(), "fail.f32");
    char *out = NULL;

    char *args = fmt("tensor '%s' nope.weight -o '%s'", model, dst, NULL);
    int rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "no tensor named 'nope.weight'");
    CHECK_STR_CONTAINS(out, "quill inspect");
    free(out);

    args = fmt("tensor /nonexistent/m.gguf token_embd.weight -o '%s'", dst, NULL, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "/nonexistent/m.gguf: cannot open");
    free(out);

    args = fmt("tensor tests/malformed/tensor_data_outside.gguf.bad w -o '%s'", dst, NULL, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "lies outside the file");
    free(out);

    args = fmt("tensor '%s' token_embd.weight -o /nonexistent/out.f32", model, NULL, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "/nonexistent/out.f32: cannot write");
    free(out);

    args = fmt("tensor '%s' token_embd.weight", model, NULL, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "usage: quill tensor MODEL.gguf TENSOR_NAME -o OUT.f32");
    free(out);

    args = fmt("tensor '%s' token_embd.weight -o", model, NULL, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "-o needs a file name");
    free(out);

    /* A type quill does not decode fails with a clear message, and writes nothing. */
    quill_gguf_writer *w = quill_gguf_writer_new();
    int32_t ints[4] = {1, 2, 3, 4};
    int64_t ne[1] = {4};
    CHECK(quill_gguf_writer_add_tensor(w, "ints", QUILL_TYPE_I32, 1, ne, ints) == QUILL_OK);
    char *ipath = path_join(tmp_dir(), "ints.gguf");
    quill_error err = {0};
    CHECK(quill_gguf_writer_write(w, ipath, &err) == QUILL_OK, "%s", err.message);
    quill_gguf_writer_free(w);
    remove(dst);
    args = fmt("tensor '%s' ints -o '%s'", ipath, dst, NULL);
    rc = quill(args, &out, true);
    free(args);
    CHECK(rc != 0);
    CHECK_STR_CONTAINS(out, "tensor 'ints'");
    CHECK_STR_CONTAINS(out, "i32");
    struct stat st;
    CHECK(stat(dst, &st) != 0, "no output file for a failure");
    free(out);
    free(ipath);
    free(dst);
    free(model);
}
