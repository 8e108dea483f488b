/* Test runner: runs every registered test (or those whose name or file contains one of the
 * arguments) and ends with the line "N passed, N failed" that CI reads. */
#define _XOPEN_SOURCE 700 /* nftw */
#include "test.h"
#include "kernels/kernels.h"

#include <ftw.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
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

/* One mapping per buffer: [header | the caller's bytes, aligned down | a page without access]; the
 * header (the mapping's start and size) is the 16 bytes before the caller's pointer. Freed mappings
 * wait in a small cache for the next buffer they can hold: the kernel tests allocate in loops, and
 * fresh mappings' page faults and unmapping (which interrupts every CPU the pool's threads ran on)
 * made them several times slower. */
enum { GUARDED_CACHE = 32 };
static struct { uint8_t *map; size_t total; } guarded_cache[GUARDED_CACHE];

void *test_guarded(size_t bytes, size_t align) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (align < 16) align = 16;
    const size_t before = bytes + align + 2 * sizeof(size_t); /* the bytes, their alignment and the header */
    const size_t total = (before + page - 1) / page * page + page;
    uint8_t *map = NULL;
    int best = -1; /* the smallest cached mapping that holds the buffer */
    for (int i = 0; i < GUARDED_CACHE; i++)
        if (guarded_cache[i].map && guarded_cache[i].total >= total &&
            (best < 0 || guarded_cache[i].total < guarded_cache[best].total))
            best = i;
    size_t mapped = total;
    if (best >= 0) {
        map = guarded_cache[best].map;
        mapped = guarded_cache[best].total;
        guarded_cache[best].map = NULL;
    } else {
        map = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (map == MAP_FAILED || mprotect(map + total - page, page, PROT_NONE) != 0) {
            fprintf(stderr, "test_guarded: mapping %zu bytes failed\n", total);
            abort();
        }
    }
    uint8_t *p = (uint8_t *)((uintptr_t)(map + mapped - page - bytes) & ~(uintptr_t)(align - 1));
    const size_t header[2] = {(size_t)(uintptr_t)map, mapped};
    memcpy(p - sizeof header, header, sizeof header);
    return p;
}

void test_guarded_free(void *p) {
    if (!p) return;
    size_t header[2];
    memcpy(header, (uint8_t *)p - sizeof header, sizeof header);
    for (int i = 0; i < GUARDED_CACHE; i++)
        if (!guarded_cache[i].map) {
            guarded_cache[i].map = (uint8_t *)(uintptr_t)header[0];
            guarded_cache[i].total = header[1];
            return;
        }
    munmap((void *)(uintptr_t)header[0], header[1]);
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

/* CPU time of this process and of its children waited for (servers, the CLI, the node clients): the
 * suite's budget is CPU time on a 2-core machine, where a test that waits costs the other lanes nothing. */
static double cpu_ms(void) {
    double ms = 0;
    const int who[2] = {RUSAGE_SELF, RUSAGE_CHILDREN};
    for (int i = 0; i < 2; i++) {
        struct rusage ru;
        if (getrusage(who[i], &ru) != 0) continue;
        ms += (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 + (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3;
    }
    return ms;
}

/* A test that faults (a kernel's access past a guarded buffer, say) ends the run: it is named first,
 * since the line with its verdict would never come. Only async-signal-safe calls here. Not in the
 * sanitizer build, whose own handler reports the fault with its stack. */
static const char *running_test;
static void say(const char *text) {
    ssize_t written = write(STDOUT_FILENO, text, strlen(text));
    (void)written;
}
static void on_fault(int sig) {
    say("FAIL ");
    say(running_test ? running_test : "(before the first test)");
    say(": killed by a fault (SIGSEGV or SIGBUS; test_guarded: an access past a buffer?)\n");
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv) {
    int passed = 0, failed = 0, skipped = 0;
    if (!TEST_SANITIZED) {
        signal(SIGSEGV, on_fault);
        signal(SIGBUS, on_fault);
    }
    for (int i = 0; i < n_tests; i++) {
        bool chosen = argc < 2;
        for (int f = 1; f < argc && !chosen; f++) chosen = strstr(tests[i].name, argv[f]) || strstr(tests[i].file, argv[f]);
        if (!chosen) continue;
        current_failed = current_skipped = 0;
        struct timespec t0, t1;
        const double cpu0 = cpu_ms();
        clock_gettime(CLOCK_MONOTONIC, &t0);
        running_test = tests[i].name;
        tests[i].fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
        const char *verdict = current_failed ? "FAIL" : current_skipped ? "skip" : "ok";
        printf("%-4s %-50s %8.1f ms %8.1f ms cpu\n", verdict, tests[i].name, ms, cpu_ms() - cpu0);
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
