/* Test runner: runs every registered test (or those whose name or file contains one of the
 * arguments) and ends with the line "N passed, N failed" that CI reads. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "test.h"
#include "kernels/kernels.h"

#include <ftw.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

typedef struct { const char *name, *file; test_fn fn; } test_case;
static test_case *tests;
static int n_tests, cap_tests;
static int current_failed, current_skipped;

void test_register(const char *name, const char *file, test_fn fn) {
    if (n_tests == cap_tests) {
        cap_tests = cap_tests ? cap_tests * 2 : 64;
        tests = realloc(tests, (size_t)cap_tests * sizeof *tests);
        if (!tests) abort();
    }
    tests[n_tests++] = (test_case){name, file, fn};
}

void test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stdout, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stdout, fmt, ap);
    va_end(ap);
    fputc('\n', stdout);
    current_failed = 1;
}

void test_skip(const char *why) {
    fprintf(stdout, "    skipped: %s\n", why);
    current_skipped = 1;
}

bool test_sweeps_set(const char *isa) {
    if (!TEST_SANITIZED) return true;
    const quill_kernels *k = quill_kernels_for(isa);
    return k && k == quill_kernels_best();
}

const char *shared_dir(void) {
    static char dir[4096];
    const char *env = getenv("QUILL_SHARED");
    snprintf(dir, sizeof dir, "%s", env && *env ? env : "../shared");
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/README.md", dir);
    struct stat st;
    if (stat(probe, &st) == 0) return dir;
    const char *req = getenv("QUILL_REQUIRE_SHARED");
    if (req && strcmp(req, "1") == 0)
        test_fail(__FILE__, __LINE__, "reference data not found at %s (set QUILL_SHARED)", dir);
    else
        test_skip("reference data ../shared not found (set QUILL_SHARED)");
    return NULL;
}

char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = malloc(n);
    if (!p) abort();
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

void *read_file(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + len, 1, cap - len, f)) > 0) {
        len += got;
        if (len == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) { free(buf); buf = NULL; }
            else buf = nb;
        }
    }
    fclose(f);
    if (!buf) return NULL;
    buf[len] = 0;
    if (size) *size = len;
    return buf;
}

const char *quill_bin(void) {
    const char *env = getenv("QUILL_BIN");
    return env && *env ? env : "./build/quill";
}

const char *quill_build_dir(void) {
    static char build[512];
    snprintf(build, sizeof build, "%s", quill_bin());
    char *slash = strrchr(build, '/');
    if (slash) *slash = 0;
    else snprintf(build, sizeof build, ".");
    return build;
}

bool tool_available(const char *cmd) {
    char *out = NULL;
    const int status = run_cmd(cmd, &out, true);
    free(out);
    return status == 0;
}

static char test_tmp[256];

const char *tmp_dir(void) {
    char *dir = test_tmp;
    if (!dir[0]) {
        snprintf(dir, sizeof test_tmp, "/tmp/quill-test-XXXXXX");
        if (!mkdtemp(dir)) abort();
    }
    return dir;
}

int run_cmd(const char *cmd, char **out, bool merge_stderr) {
    size_t n = strlen(cmd) + 16;
    char *full = malloc(n);
    if (!full) abort();
    snprintf(full, n, "%s%s", cmd, merge_stderr ? " 2>&1" : "");
    FILE *p = popen(full, "r");
    free(full);
    if (!p) return -1;
    size_t cap = 4096, len = 0, got;
    char *buf = malloc(cap + 1);
    while ((got = fread(buf + len, 1, cap - len, p)) > 0) {
        len += got;
        if (len == cap) { cap *= 2; buf = realloc(buf, cap + 1); if (!buf) abort(); }
    }
    buf[len] = 0;
    int st = pclose(p);
    if (out) *out = buf; else free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int remove_entry(const char *path, const struct stat *st, int kind, struct FTW *ftw) {
    (void)st; (void)kind; (void)ftw;
    remove(path);
    return 0;
}

/* The models and files tests write add up to some 400 MB a run: a suite run many times a day
 * must not fill /tmp. QUILL_KEEP_TMP keeps them to look at after a failure. */
static void remove_tmp_dir(void) {
    if (!test_tmp[0]) return;
    if (getenv("QUILL_KEEP_TMP")) { printf("test files kept in %s\n", test_tmp); return; }
    nftw(test_tmp, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < n_tests; i++) {
        bool chosen = argc < 2;
        for (int f = 1; f < argc && !chosen; f++) chosen = strstr(tests[i].name, argv[f]) || strstr(tests[i].file, argv[f]);
        if (!chosen) continue;
        current_failed = current_skipped = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        const char *verdict = current_failed ? "FAIL" : current_skipped ? "skip" : "ok";
        printf("%-4s %-50s %8.1f ms\n", verdict, tests[i].name, ms);
        fflush(stdout);
        if (current_failed) failed++;
        else if (current_skipped) skipped++;
        else passed++;
    }
    remove_tmp_dir();
    if (skipped) printf("%d skipped\n", skipped);
    printf("%d passed, %d failed\n", passed, failed);
    free(tests);
    return failed ? 1 : 0;
}
