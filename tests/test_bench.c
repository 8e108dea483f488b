/* `quill bench`: the JSON report of a tiny model parses and its figures are sane (never its
 * speed: the machine may be busy), and bad flags fail with a clear message. */
#include "test.h"

#include "gguf_build.h"
#include "kernels/kernels.h"

#include "quill.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <sys/stat.h>

static int bench_quill(const char *args, char **out, bool merge_stderr) {
    size_t n = strlen(quill_bin()) + strlen(args) + 8;
    char *cmd = malloc(n);
    snprintf(cmd, n, "%s %s", quill_bin(), args);
    int rc = run_cmd(cmd, out, merge_stderr);
    free(cmd);
    return rc;
}

static bool bench_quill_built(void) {
    struct stat st;
    if (stat(quill_bin(), &st) == 0) return true;
    test_fail(__FILE__, __LINE__, "%s is not built (set QUILL_BIN)", quill_bin());
    return false;
}

/* A finite number > 0 under `key`. */
static bool positive(const cJSON *o, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    return cJSON_IsNumber(v) && v->valuedouble > 0 && v->valuedouble < 1e300;
}

TEST(bench_json_stories260k) {
    REQUIRE_SHARED(shared);
    if (!bench_quill_built()) return;
    char *model = path_join(shared, "models/stories260K.gguf");
    size_t n = strlen(model) + 64;
    char *args = malloc(n);
    snprintf(args, n, "bench -m '%s' -p 16 -n 8 -r 2 --bw-mib 64 --json", model);
    char *out = NULL;
    int rc = bench_quill(args, &out, false);
    free(args);
    cJSON *j = rc == 0 ? cJSON_Parse(out) : NULL;
    if (!j) {
        test_fail(__FILE__, __LINE__, "exit %d, not JSON: %s", rc, out);
        free(out);
        free(model);
        return;
    }
    free(out);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "model");
    bool ok = cJSON_IsString(name) && !strcmp(name->valuestring, model);
    free(model);
    if (!ok) { cJSON_Delete(j); CHECK(ok, "model names the file"); }

    const char *keys[] = {"threads", "bandwidth_gbs", "bytes_per_token", "tg_roofline_share", "load_ms",
                          "rss_mb", "hwm_mb", "file_bytes", "kv_bytes"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (!positive(j, keys[i])) {
            test_fail(__FILE__, __LINE__, "\"%s\" is missing or not positive", keys[i]);
            cJSON_Delete(j);
            return;
        }
    const char *tests[] = {"pp", "tg"};
    const int sizes[] = {16, 8};
    for (int t = 0; t < 2; t++) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, tests[t]);
        const cJSON *nn = cJSON_GetObjectItemCaseSensitive(r, "n");
        const cJSON *sd = cJSON_GetObjectItemCaseSensitive(r, "sd");
        const cJSON *runs = cJSON_GetObjectItemCaseSensitive(r, "runs");
        bool good = cJSON_IsObject(r) && cJSON_IsNumber(nn) && nn->valueint == sizes[t] && positive(r, "mean") &&
                    cJSON_IsNumber(sd) && sd->valuedouble >= 0 && cJSON_IsArray(runs) && cJSON_GetArraySize(runs) == 2;
        double sum = 0;
        for (int i = 0; good && i < 2; i++) {
            const cJSON *v = cJSON_GetArrayItem(runs, i);
            good = cJSON_IsNumber(v) && v->valuedouble > 0;
            if (good) sum += v->valuedouble;
        }
        /* the mean is the mean of the runs */
        good = good && fabs(sum / 2 - cJSON_GetObjectItemCaseSensitive(r, "mean")->valuedouble) <= 1e-3 * sum;
        if (!good) {
            char *s = cJSON_PrintUnformatted(r);
            test_fail(__FILE__, __LINE__, "\"%s\" is malformed: %s", tests[t], s ? s : "(missing)");
            free(s);
            cJSON_Delete(j);
            return;
        }
    }
    /* the paired share: each tg run against the bandwidth read around it, the median of those */
    const cJSON *around = cJSON_GetObjectItemCaseSensitive(j, "tg_bandwidth_around_gbs");
    bool around_ok = positive(j, "tg_paired_share") && cJSON_IsArray(around) && cJSON_GetArraySize(around) == 2;
    double paired[2] = {0, 0};
    const cJSON *tg_runs = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "tg"), "runs");
    for (int i = 0; around_ok && i < 2; i++) {
        const cJSON *v = cJSON_GetArrayItem(around, i);
        around_ok = cJSON_IsNumber(v) && v->valuedouble > 0;
        if (around_ok)
            paired[i] = cJSON_GetObjectItemCaseSensitive(j, "bytes_per_token")->valuedouble *
                        cJSON_GetArrayItem(tg_runs, i)->valuedouble / (v->valuedouble * 1e9);
    }
    if (around_ok) {
        const double median = (paired[0] + paired[1]) / 2,
                     got = cJSON_GetObjectItemCaseSensitive(j, "tg_paired_share")->valuedouble;
        around_ok = fabs(got - median) <= 1e-3 * median;
    }
    if (!around_ok) {
        test_fail(__FILE__, __LINE__, "\"tg_paired_share\" is not the median of the runs' shares of \"tg_bandwidth_around_gbs\"");
        cJSON_Delete(j);
        return;
    }
    /* the figures agree with each other */
    double bpt = cJSON_GetObjectItemCaseSensitive(j, "bytes_per_token")->valuedouble;
    double file = cJSON_GetObjectItemCaseSensitive(j, "file_bytes")->valuedouble;
    double tg = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "tg"), "mean")->valuedouble;
    double bw = cJSON_GetObjectItemCaseSensitive(j, "bandwidth_gbs")->valuedouble;
    double share = cJSON_GetObjectItemCaseSensitive(j, "tg_roofline_share")->valuedouble;
    double rss = cJSON_GetObjectItemCaseSensitive(j, "rss_mb")->valuedouble;
    double hwm = cJSON_GetObjectItemCaseSensitive(j, "hwm_mb")->valuedouble;
    const cJSON *types = cJSON_GetObjectItemCaseSensitive(j, "types");
    cJSON_bool types_ok = cJSON_IsObject(types) && cJSON_GetArraySize(types) > 0;
    /* the kernel set that ran: the one this process would pick too (QUILL_ISA's, else the fastest) */
    const quill_kernels *chosen = NULL;
    quill_kernels_choose(&chosen, NULL);
    const char *want = chosen ? chosen->isa : "(QUILL_ISA names no set this CPU offers)";
    const cJSON *kernels = cJSON_GetObjectItemCaseSensitive(j, "kernels");
    bool kernels_ok = cJSON_IsString(kernels) && !strcmp(kernels->valuestring, want);
    /* a share of the model's mapping, or null where /proc/self/smaps cannot tell */
    const cJSON *pages = cJSON_GetObjectItemCaseSensitive(j, "weights_2m_share");
    bool pages_ok = cJSON_IsNull(pages) || (cJSON_IsNumber(pages) && pages->valuedouble >= 0 && pages->valuedouble <= 1);
    cJSON_Delete(j);
    CHECK(pages_ok, "\"weights_2m_share\" is a share in [0, 1] or null");
    CHECK(kernels_ok, "\"kernels\" names the kernel set (%s)", want);
    CHECK(bpt < file, "bytes per token %.0f must be less than the file, %.0f", bpt, file);
    CHECK(fabs(share - bpt * tg / (bw * 1e9)) <= 1e-3 * share, "share %g", share);
    CHECK(hwm >= rss, "VmHWM %g < VmRSS %g", hwm, rss);
    CHECK(types_ok, "a type mix");
}

TEST(bench_text_stories260k) {
    REQUIRE_SHARED(shared);
    if (!bench_quill_built()) return;
    char *model = path_join(shared, "models/stories260K.gguf");
    size_t n = strlen(model) + 64;
    char *args = malloc(n);
    snprintf(args, n, "bench -m '%s' -p 8 -n 0 -r 1 -t 1 --bw-mib 64", model);
    char *out = NULL;
    int rc = bench_quill(args, &out, false);
    free(args);
    bool ok = rc == 0 && strstr(out, "| stories260K.gguf ") && strstr(out, " pp8 |") && !strstr(out, "tg0") &&
              strstr(out, "memory bandwidth") && strstr(out, "64 MiB buffer") && strstr(out, "bytes per token") && strstr(out, "resident memory");
    if (!ok) test_fail(__FILE__, __LINE__, "exit %d, output:\n%s", rc, out);
    free(out);
    if (!ok) {
        free(model);
        return;
    }
    /* at a depth: both tests after 40 cached tokens, and the JSON says so */
    n = strlen(model) + 80;
    args = malloc(n);
    snprintf(args, n, "bench -m '%s' -p 8 -n 3 -r 1 -t 1 -d 40 --bw-mib 64", model);
    out = NULL;
    rc = bench_quill(args, &out, false);
    ok = rc == 0 && strstr(out, " pp8 @ d40 |") && strstr(out, " tg3 @ d40 |");
    if (!ok) test_fail(__FILE__, __LINE__, "'quill %s': exit %d, output:\n%s", args, rc, out);
    free(out);
    snprintf(args, n, "bench -m '%s' -p 0 -n 2 -r 1 -t 1 -d 40 --bw-mib 64 --json", model);
    out = NULL;
    rc = bench_quill(args, &out, false);
    cJSON *j = rc == 0 ? cJSON_Parse(out) : NULL;
    const cJSON *depth = cJSON_GetObjectItemCaseSensitive(j, "depth"), *ctx = cJSON_GetObjectItemCaseSensitive(j, "n_ctx");
    ok = cJSON_IsNumber(depth) && depth->valueint == 40 && cJSON_IsNumber(ctx) && ctx->valueint >= 40 + 2 + 4;
    if (!ok) test_fail(__FILE__, __LINE__, "'quill %s': exit %d, output:\n%s", args, rc, out);
    cJSON_Delete(j);
    free(out);
    free(args);
    free(model);
}

TEST(bench_bad_flags) {
    if (!bench_quill_built()) return;
    static const struct {
        const char *args, *message;
    } cases[] = {
        {"bench", "no model given"},
        {"bench -p 16", "no model given"},
        {"bench -m x.gguf -p", "option -p needs a value"},
        {"bench -m x.gguf -p abc", "-p: 'abc' is not a whole number"},
        {"bench -m x.gguf -n -1", "-n: '-1' is not a whole number"},
        {"bench -m x.gguf -r 0", "-r: '0' is not a whole number in 1..1000"},
        {"bench -m x.gguf -t 0", "-t: '0' is not a whole number in 1..1024"},
        {"bench -m x.gguf -t 2x", "-t: '2x' is not a whole number"},
        {"bench -m x.gguf --bw-mib 0", "--bw-mib: '0' is not a whole number"},
        {"bench -m x.gguf -d -5", "-d: '-5' is not a whole number"},
        {"bench -m x.gguf --bogus", "unknown option '--bogus'"},
        {"bench x.gguf", "unexpected argument 'x.gguf'"},
        {"bench -m x.gguf -p 0 -n 0", "nothing to measure"},
        {"bench -m /nonexistent/model.gguf -p 4 -n 4", "/nonexistent/model.gguf"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        char args[128];
        snprintf(args, sizeof args, "bench --json%s", cases[i].args + strlen("bench"));
        int rc = bench_quill(args, &out, true);
        bool ok = rc != 0 && strstr(out, cases[i].message) && !strchr(out, '{');
        if (!ok) {
            test_fail(__FILE__, __LINE__, "'quill %s': exit %d, expected an error with \"%s\", got: %s", args, rc,
                      cases[i].message, out);
            free(out);
            return;
        }
        free(out);
    }
    char *out = NULL;
    int rc = bench_quill("bench --help", &out, true);
    CHECK(rc == 0 && strstr(out, "usage: quill bench"), "exit %d: %s", rc, out);
    free(out);
}

/* bytes_per_token of the file at `path` by the formula: all tensors, one row of the embedding
 * unless there is no output.weight. */
static double expected_bytes_per_token(const quill_gguf *g) {
    bool tied = quill_gguf_find_tensor(g, "output.weight") == NULL;
    double total = 0;
    for (uint64_t i = 0; i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        bool embd = !strcmp(t->name, "token_embd.weight");
        total += embd && !tied ? (double)t->nbytes / (double)t->ne[1] : (double)t->nbytes;
    }
    return total;
}

static double bench_bytes_per_token(const char *path) {
    size_t n = strlen(path) + 96;
    char *args = malloc(n);
    snprintf(args, n, "bench -m '%s' -p 2 -n 2 -r 1 -t 1 --bw-mib 16 --json", path);
    char *out = NULL;
    int rc = bench_quill(args, &out, false);
    free(args);
    cJSON *j = rc == 0 ? cJSON_Parse(out) : NULL;
    free(out);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "bytes_per_token");
    double r = cJSON_IsNumber(v) ? v->valuedouble : -1;
    cJSON_Delete(j);
    return r;
}

/* The bytes a token reads, for stories260K and for a copy of it without output.weight, whose
 * logits then reuse the embedding (read in full, counted once). */
TEST(bench_bytes_per_token_tied_and_untied) {
    REQUIRE_SHARED(shared);
    if (!bench_quill_built()) return;
    char *model = path_join(shared, "models/stories260K.gguf");
    char *tied = path_join(tmp_dir(), "bench-tied.gguf");
    quill_gguf *g = NULL, *t = NULL;
    quill_gguf_writer *w = NULL;
    quill_error err = {0};
    bool ok = quill_gguf_open(model, &g, &err) == QUILL_OK && (w = gguf_copy_writer(g, "output.weight")) != NULL;
    ok = ok && quill_gguf_writer_write(w, tied, &err) == QUILL_OK && quill_gguf_open(tied, &t, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    double want_untied = ok ? expected_bytes_per_token(g) : 0, want_tied = ok ? expected_bytes_per_token(t) : 0;
    quill_gguf_close(g);
    quill_gguf_close(t);
    double got_untied = ok ? bench_bytes_per_token(model) : 0, got_tied = ok ? bench_bytes_per_token(tied) : 0;
    remove(tied);
    free(model);
    free(tied);
    CHECK(ok, "building the tied copy: %s", err.message);
    CHECK(got_untied == want_untied, "untied: %.0f bytes per token, expected %.0f", got_untied, want_untied);
    CHECK(got_tied == want_tied, "tied: %.0f bytes per token, expected %.0f", got_tied, want_tied);
    /* stories260K's output.weight and token_embd.weight are both 64 x 512 f32 (131072 bytes): the
     * copy loses output.weight and reads the whole embedding instead of one 256-byte row */
    CHECK(got_tied == got_untied - 256, "tied %.0f, untied %.0f", got_tied, got_untied);
}
