/* A tiny test framework: TEST(name) registers a function at load time, so a new test file needs
 * no central list. Assertions record a failure and return from the test. */
#ifndef QUILL_TEST_H
#define QUILL_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef void (*test_fn)(void);
void test_register(const char *name, const char *file, test_fn fn);
void test_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void test_skip(const char *why);

#define TEST(name)                                                                   \
    static void test_##name(void);                                                   \
    __attribute__((constructor)) static void test_register_##name(void) {            \
        test_register(#name, __FILE__, test_##name);                                 \
    }                                                                                \
    static void test_##name(void)

#define CHECK(cond, ...)                                                             \
    do {                                                                             \
        if (!(cond)) { test_fail(__FILE__, __LINE__, "CHECK(" #cond ") " __VA_ARGS__); return; } \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                           \
    do {                                                                             \
        long long a_ = (long long)(a), b_ = (long long)(b);                          \
        if (a_ != b_) { test_fail(__FILE__, __LINE__, "%s == %lld, expected %s == %lld", #a, a_, #b, b_); return; } \
    } while (0)

#define CHECK_STR_CONTAINS(hay, needle)                                              \
    do {                                                                             \
        const char *h_ = (hay), *n_ = (needle);                                      \
        if (!h_ || !strstr(h_, n_)) { test_fail(__FILE__, __LINE__, "expected \"%s\" in \"%s\"", n_, h_ ? h_ : "(null)"); return; } \
    } while (0)

/* ../shared (or $QUILL_SHARED). Returns NULL and marks the test skipped — or failed when
 * QUILL_REQUIRE_SHARED=1, as in CI — when the reference data is missing. */
const char *shared_dir(void);
#define REQUIRE_SHARED(var)                                                          \
    const char *var = shared_dir();                                                  \
    if (!var) return

/* Path helpers: a static-duration buffer per call site would be awkward, so these return malloc'd
 * strings the caller frees. */
char *path_join(const char *a, const char *b);
/* Reads a whole file; returns NULL on failure. */
void *read_file(const char *path, size_t *size);
/* Path of the built quill binary (for CLI tests) and a fresh temporary directory. */
const char *quill_bin(void);
/* The build folder the tests run from (quill_bin's folder: build/ or build-san/), whose objects
 * the tests that read the compiled code inspect. */
const char *quill_build_dir(void);
/* Whether a tool runs (`cmd` prints its version): for tests that skip without binutils. */
bool tool_available(const char *cmd);
const char *tmp_dir(void);
/* Memory for a kernel's operands (not zeroed, as malloc's) that ends where the process may not read
 * or write: `bytes` from an address aligned to `align` (a power of two up to 64; 16 is what malloc
 * promises, so what a kernel may assume of its caller's buffers), then a page without access, so
 * that a read or write past the end faults at once. The sanitizer run does not instrument the SIMD
 * kernel files (Makefile): this is what finds their accesses past a buffer, in both runs. Freed by
 * test_guarded_free. */
void *test_guarded(size_t bytes, size_t align);
void test_guarded_free(void *p);
/* Runs a shell command, capturing stdout (and stderr when merge_stderr); returns the exit status. */
int run_cmd(const char *cmd, char **out, bool merge_stderr);

/* The suite's second run is the same tests built with AddressSanitizer and UndefinedBehaviorSanitizer:
 * it is there for memory and undefined behaviour, the first run for results. Sweeps that run the
 * same code again with other numbers (every kernel set, many seeds) run part of themselves under
 * the sanitizers (ten times slower), so that the suite keeps to its time. */
#if defined(__SANITIZE_ADDRESS__)
#define TEST_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_SANITIZED 1
#endif
#endif
#ifndef TEST_SANITIZED
#define TEST_SANITIZED 0
#endif
/* Whether a sweep over kernel sets runs `isa`: always, except under the sanitizers, where only the
 * CPU's fastest set runs (every set's kernels, the scalar ones too, still meet the sanitizers in
 * test_kernels*.c, and the scalar set is the one that runs 25x slower). */
bool test_sweeps_set(const char *isa);

/* Reproducible random test data: xorshift64 over a state each file seeds itself. */
static inline uint32_t test_rand(uint64_t *state) {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return (uint32_t)(*state >> 16);
}
/* Uniform in [-1, 1). */
static inline float test_randf(uint64_t *state) { return (float)((double)test_rand(state) / 4294967296.0 * 2.0 - 1.0); }

#endif
