/* Only the files whose kernels are chosen at run time may hold instructions beyond x86-64's
 * baseline: any other object may run on a CPU without AVX2 or AVX-512 (the dispatcher, the scalar
 * exact model, the whole engine), where one such instruction dies with SIGILL. The compiler emits
 * them unasked when a file is built with ISA flags (it vectorises plain C), so this reads the
 * build's objects with objdump: a VEX/EVEX instruction (their mnemonics start with v), a ymm/zmm
 * register, a mask register or a tile instruction anywhere else fails, naming the function. A
 * portable file may still hold a function built for a set by __attribute__((target)) and called
 * after a run-time check of the CPU (cmd_bench.c's memory bandwidth probe): its name must then end
 * with the set, _avx2 or _avx512. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The instruction-set files: their objects get ISA flags (Makefile) and must show them. */
static const char *const isa_objects[] = {"kernels_avx2.o",      "kernels_avx2_exact.o", "kernels_avxvnni_exact.o",
                                          "kernels_avx512.o",    "kernels_vnni.o",       "kernels_vnni_pack.o",
                                          "kernels_amx.o",       "kernels_recurrent_avx2.o"};

static bool is_isa_object(const char *path) {
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    for (size_t i = 0; i < sizeof isa_objects / sizeof isa_objects[0]; i++)
        if (!strcmp(base, isa_objects[i])) return true;
    return false;
}

/* An instruction line of objdump -d --no-show-raw-insn ("  addr:\tmnemonic operands  # comment")
 * beyond the baseline: VEX/EVEX mnemonics start with v, mask instructions with k, AMX ones are
 * the tile loads, stores and products; or a ymm, zmm or mask register among the operands. */
static bool beyond_baseline(const char *line) {
    const char *tab = strchr(line, '\t');
    if (!tab) return false;
    char insn[256];
    snprintf(insn, sizeof insn, "%s", tab + 1);
    insn[strcspn(insn, "#<")] = 0; /* the comment names symbols, which may read like registers */
    const char *ops = insn + strcspn(insn, " ");
    return insn[0] == 'v' || insn[0] == 'k' || !strncmp(insn, "tile", 4) || !strncmp(insn, "ldtilecfg", 9) ||
           !strncmp(insn, "sttilecfg", 9) || !strncmp(insn, "tdp", 3) || strstr(ops, "%ymm") || strstr(ops, "%zmm") ||
           strstr(ops, "%k");
}

/* A function built for a set by its own target attribute, by the naming rule above. */
static bool targeted(const char *func) {
    const size_t len = strlen(func);
    return (len > 5 && !strcmp(func + len - 5, "_avx2")) || (len > 7 && !strcmp(func + len - 7, "_avx512"));
}

/* Counts the instructions beyond the baseline in one object; on the first, records where. */
static long count_beyond(const char *object, char *where, size_t where_len) {
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "objdump -d --no-show-raw-insn '%s' 2>&1", object);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char line[1024], func[256] = "?";
    long n = 0;
    while (fgets(line, sizeof line, p)) {
        char name[200];
        if (sscanf(line, "%*x <%199[^>]>:", name) == 1) snprintf(func, sizeof func, "%s", name);
        else if (beyond_baseline(line) && !targeted(func) && n++ == 0) {
            line[strcspn(line, "\n")] = 0;
            snprintf(where, where_len, "%s in %s: %s", object, func, line);
        }
    }
    return pclose(p) == 0 ? n : -1;
}

TEST(isa_objects_only_kernels_use_simd) {
#if TEST_SANITIZED
    test_skip("the sanitizer build: its objects carry the sanitizers' code; the gcc build's are the ones checked");
    return;
#endif
#if !defined(__x86_64__)
    test_skip("not an x86-64 build: no ISA flags are given");
    return;
#endif
    if (!tool_available("objdump --version")) {
        test_skip("objdump not found (binutils)");
        return;
    }
    /* the objects of the build the tests run from: build/quill -> build/src, build/tests, build/cli */
    const char *build = quill_build_dir();
    char *out = NULL;
    char cmd[1800];
    snprintf(cmd, sizeof cmd, "find '%s/src' '%s/cli' '%s/tests' -name '*.o' 2>/dev/null | sort", build, build, build);
    CHECK(run_cmd(cmd, &out, false) == 0 && out, "cannot list the objects of %s", build);
    int portable = 0, isa = 0;
    bool ok = true;
    for (char *line = strtok(out, "\n"); line && ok; line = strtok(NULL, "\n")) {
        /* an object left by a renamed or deleted source is linked into nothing: its source, from
         * the repository's root (where the tests run), tells */
        char source[600];
        snprintf(source, sizeof source, "%s", line + strlen(build) + 1);
        const size_t len = strlen(source);
        if (len > 2) source[len - 1] = 'c';
        if (access(source, F_OK) != 0) continue;
        char where[1500] = "";
        const long n = count_beyond(line, where, sizeof where);
        if (n < 0) {
            test_fail(__FILE__, __LINE__, "objdump failed on %s", line), ok = false;
        } else if (is_isa_object(line)) {
            isa++;
            /* built with its flags: else this test would read nothing */
            if (n == 0) test_fail(__FILE__, __LINE__, "%s holds no SIMD instruction: built without its flags?", line), ok = false;
        } else {
            portable++;
            if (n > 0)
                test_fail(__FILE__, __LINE__, "%ld instructions beyond x86-64's baseline in a portable object: %s", n, where),
                    ok = false;
        }
    }
    free(out);
    CHECK(!ok || isa == (int)(sizeof isa_objects / sizeof isa_objects[0]), "found %d of the instruction-set objects in %s/src",
          isa, build);
    CHECK(!ok || portable >= 20, "found only %d portable objects under %s", portable, build);
}
