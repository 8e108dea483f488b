/* Packaging for C users: `make install` (PREFIX, DESTDIR, uninstall), the shared library's SONAME
 * and exports, quill.pc, the version, public headers that compile alone, the example built against
 * an installed copy, the man page, and the one Debian package list with its install script. */
#include "test.h"

#include "quill.h"

#include <dirent.h>
#include <libgen.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>


/* Runs a printf-formatted shell command with stderr merged into *out (which the caller frees). */
__attribute__((format(printf, 2, 3))) static int sh(char **out, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    char *cmd = malloc((size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(cmd, (size_t)n + 1, fmt, ap);
    va_end(ap);
    char *ignored = NULL;
    int rc = run_cmd(cmd, out ? out : &ignored, true);
    free(ignored);
    free(cmd);
    return rc;
}

/* The build directory of the quill binary under test (its libraries are beside it). */
static const char *build_dir(void) {
    static char dir[4096];
    snprintf(dir, sizeof dir, "%s", quill_bin());
    return dirname(dir);
}

/* The packaging is the gcc build's: the sanitizer build links the library differently and
 * repeats the same files. */
static bool packaging_build(void) {
#if TEST_SANITIZED
    test_skip("packaging is tested by the gcc build's run of the suite");
    return false;
#else
    return true;
#endif
}

/* make from inside the suite: not the outer make's job server. */
#define MAKE "env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s --no-print-directory"

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* The names of the functions the public headers declare, and whether every declaration carries
 * QUILL_API. A declaration starts in column 0 with its return type; `typedef`s, comments and
 * preprocessor lines are not declarations. */
static int public_functions(char names[][64], int cap, char *unmarked, size_t unmarked_cap) {
    int n = 0;
    unmarked[0] = 0;
    DIR *d = opendir("include");
    if (!d) return -1;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
        char *path = path_join("include", e->d_name);
        char *text = read_file(path, NULL);
        free(path);
        if (!text) continue;
        bool in_comment = false;
        for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
            if (in_comment) {
                in_comment = !strstr(line, "*/");
                continue;
            }
            if (!strncmp(line, "/*", 2)) {
                in_comment = !strstr(line, "*/");
                continue;
            }
            if (line[0] == ' ' || line[0] == '\t' || line[0] == '#' || line[0] == '}' || line[0] == '{' ||
                !strncmp(line, "typedef", 7) || !strncmp(line, "static", 6) || !strncmp(line, "struct", 6) ||
                !strncmp(line, "extern", 6))
                continue;
            char *paren = strchr(line, '(');
            if (!paren) continue;
            char *end = paren;
            while (end > line && end[-1] == ' ') end--;
            char *start = end;
            while (start > line && (start[-1] == '_' || (start[-1] >= 'a' && start[-1] <= 'z') ||
                                    (start[-1] >= '0' && start[-1] <= '9')))
                start--;
            if (end - start < 1 || end - start >= 64 || strncmp(start, "quill_", 6)) continue;
            if (strncmp(line, "QUILL_API ", 10)) {
                size_t used = strlen(unmarked);
                snprintf(unmarked + used, unmarked_cap - used, "%s%.*s (%s)", used ? ", " : "", (int)(end - start),
                         start, e->d_name);
            }
            if (n < cap) snprintf(names[n++], 64, "%.*s", (int)(end - start), start);
        }
        free(text);
    }
    closedir(d);
    return n;
}

TEST(packaging_public_headers_compile_alone) {
    /* A user may include any one public header first; each compiles on its own, and quill.h
     * alone declares the whole API. */
    const char *compilers[] = {"gcc", "clang"};
    DIR *d = opendir("include");
    CHECK(d != NULL, "include/ not found (run the suite from the repository root)");
    int checked = 0;
    for (struct dirent *e; (e = readdir(d));) {
        size_t len = strlen(e->d_name);
        if (len < 3 || strcmp(e->d_name + len - 2, ".h")) continue;
        for (int c = 0; c < 2; c++) {
            char *out = NULL;
            int rc = sh(&out, "printf '#include \"%s\"\\nint main(void) { return 0; }\\n' | "
                              "%s -std=c11 -Wall -Wextra -Werror -Iinclude -x c -fsyntax-only -",
                        e->d_name, compilers[c]);
            if (rc != 0)
                test_fail(__FILE__, __LINE__, "include/%s does not compile alone with %s:\n%s", e->d_name,
                          compilers[c], out ? out : "");
            free(out);
            checked++;
        }
    }
    closedir(d);
    CHECK(checked >= 8, "only %d header/compiler pairs checked", checked);
    /* every function of every public header, through quill.h alone */
    static char names[512][64];
    char unmarked[4096];
    int n = public_functions(names, 512, unmarked, sizeof unmarked);
    CHECK(n > 100, "found %d public functions", n);
    char *src = path_join(tmp_dir(), "all_api.c");
    FILE *f = fopen(src, "w");
    CHECK(f != NULL);
    fprintf(f, "#include <quill.h>\nint main(void) {\n    const void *api[] = {\n");
    for (int i = 0; i < n; i++) fprintf(f, "        (const void *)%s,\n", names[i]);
    fprintf(f, "    };\n    return api[0] == 0;\n}\n");
    fclose(f);
    char *out = NULL;
    int rc = sh(&out, "gcc -std=c11 -Wall -Wextra -Werror -Wno-pedantic -Iinclude -fsyntax-only %s", src);
    free(src);
    if (rc != 0) test_fail(__FILE__, __LINE__, "quill.h alone does not declare the whole API:\n%s", out ? out : "");
    free(out);
}

TEST(packaging_exports_only_the_public_api) {
    if (!packaging_build()) return;
    static char names[512][64];
    char unmarked[4096];
    int n = public_functions(names, 512, unmarked, sizeof unmarked);
    CHECK(n > 100, "found %d public functions", n);
    CHECK(!unmarked[0], "public functions without QUILL_API (libquill.so does not export them): %s", unmarked);

    char *out = NULL;
    int rc = sh(&out, "nm -D --defined-only %s/libquill.so | awk '$2 == \"T\" || $2 == \"D\" || $2 == \"B\" "
                      "|| $2 == \"R\" || $2 == \"W\" {print $3}'", build_dir());
    CHECK(rc == 0 && out, "nm -D %s/libquill.so failed: %s", build_dir(), out ? out : "");
    /* every exported symbol is a declared function, and every declared function is exported */
    int exported = 0;
    char extra[2048] = "";
    for (char *sym = strtok(out, "\n"); sym; sym = strtok(NULL, "\n")) {
        bool declared = false;
        for (int i = 0; i < n && !declared; i++) declared = !strcmp(sym, names[i]);
        if (declared) exported++;
        else if (strlen(extra) + strlen(sym) + 3 < sizeof extra) strcat(strcat(extra, " "), sym);
    }
    free(out);
    CHECK(!extra[0], "libquill.so exports symbols no public header declares:%s", extra);
    CHECK(exported == n, "libquill.so exports %d of the %d public functions", exported, n);
}

TEST(packaging_version) {
    char want[64];
    snprintf(want, sizeof want, "%d.%d.%d", QUILL_VERSION_MAJOR, QUILL_VERSION_MINOR, QUILL_VERSION_PATCH);
    CHECK(!strcmp(QUILL_VERSION, want), "QUILL_VERSION \"%s\", the numbers say %s", QUILL_VERSION, want);
    CHECK(!strcmp(quill_version(), QUILL_VERSION), "quill_version() \"%s\", header \"%s\"", quill_version(),
          QUILL_VERSION);
}

/* Checks an installed tree under `root` (PREFIX, or DESTDIR + PREFIX). */
static bool check_installed_files(const char *root) {
    char so_name[64], so_real[64];
    snprintf(so_name, sizeof so_name, "libquill.so.%d", QUILL_VERSION_MAJOR);
    snprintf(so_real, sizeof so_real, "libquill.so.%s", QUILL_VERSION);
    const char *files[] = {"bin/quill", "lib/libquill.a", "include/quill.h", "include/quill_model.h",
                           "include/quill_chat.h", "include/quill_quantize.h", "share/man/man1/quill.1",
                           "lib/pkgconfig/quill.pc"};
    bool ok = true;
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *p = path_join(root, files[i]);
        if (!is_file(p)) {
            test_fail(__FILE__, __LINE__, "make install did not install %s", p);
            ok = false;
        }
        free(p);
    }
    /* libquill.so -> libquill.so.MAJOR -> libquill.so.MAJOR.MINOR.PATCH, whose SONAME is the middle one */
    char *out = NULL;
    int rc = sh(&out, "cd %s/lib && readlink libquill.so && readlink %s && test -f %s && "
                      "readelf -d %s | grep SONAME",
                root, so_name, so_real, so_real);
    char want[256];
    snprintf(want, sizeof want, "%s\n%s\n", so_name, so_real);
    if (rc != 0 || !out || strncmp(out, want, strlen(want)) || !strstr(out, so_name)) {
        test_fail(__FILE__, __LINE__, "expected libquill.so -> %s -> %s with SONAME %s, got:\n%s", so_name, so_real,
                  so_name, out ? out : "");
        ok = false;
    }
    free(out);
    return ok;
}

TEST(packaging_install_and_build_the_example) {
    REQUIRE_SHARED(shared);
    if (!packaging_build()) return;
    char *prefix = path_join(tmp_dir(), "prefix");
    char *model = path_join(shared, "models/stories260K.gguf");
    char *out = NULL;
    int rc = sh(&out, MAKE " install BUILD=%s PREFIX=%s", build_dir(), prefix);
    if (rc != 0) {
        test_fail(__FILE__, __LINE__, "make install PREFIX=%s failed:\n%s", prefix, out ? out : "");
        goto done;
    }
    free(out);
    out = NULL;
    if (!check_installed_files(prefix)) goto done;

    /* quill.pc: the version, and for static linking every library libquill.so itself needs */
    rc = sh(&out, "export PKG_CONFIG_PATH=%s/lib/pkgconfig; pkg-config --modversion quill && "
                  "pkg-config --static --libs quill && readelf -d %s/lib/libquill.so | grep NEEDED",
            prefix, prefix);
    if (rc != 0 || !out || strncmp(out, QUILL_VERSION "\n", strlen(QUILL_VERSION) + 1) || !strstr(out, " -lm") ||
        !strstr(out, "-pthread") || (strstr(out, "[libpcre2-8.so") && !strstr(out, "-lpcre2-8"))) {
        test_fail(__FILE__, __LINE__, "pkg-config quill: expected version %s and -lm -pthread (and -lpcre2-8 "
                  "when the library needs it):\n%s", QUILL_VERSION, out ? out : "");
        goto done;
    }
    free(out);
    out = NULL;

    /* the example, built as a user builds it, linked shared and static */
    const char *expected = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park.";
    const char *links[2] = {"$(pkg-config --cflags --libs quill) -Wl,-rpath,%s/lib",
                            "$(pkg-config --cflags quill) $(pkg-config --static --libs quill | sed 's/-lquill/-l:libquill.a/')"};
    for (int k = 0; k < 2; k++) {
        char link[512];
        snprintf(link, sizeof link, links[k], prefix);
        rc = sh(&out, "export PKG_CONFIG_PATH=%s/lib/pkgconfig; cc -std=c11 -Wall -Wextra -Werror "
                      "examples/generate.c %s -o %s/generate-%d && readelf -d %s/generate-%d | grep NEEDED",
                prefix, link, tmp_dir(), k, tmp_dir(), k);
        const bool linked_shared = out && strstr(out, "[libquill.so.");
        if (rc != 0 || linked_shared != (k == 0)) {
            test_fail(__FILE__, __LINE__, "building examples/generate.c against the installed copy (%s) failed:\n%s",
                      k ? "static" : "shared", out ? out : "");
            goto done;
        }
        free(out);
        out = NULL;
        rc = sh(&out, "%s/generate-%d %s 'Once upon a time' 30 2>/dev/null", tmp_dir(), k, model);
        if (rc != 0 || !out || strncmp(out, expected, strlen(expected))) {
            test_fail(__FILE__, __LINE__, "examples/generate (%s, exit %d) printed \"%s\", expected it to begin \"%s\"",
                      k ? "static" : "shared", rc, out ? out : "", expected);
            goto done;
        }
        free(out);
        out = NULL;
    }

    /* DESTDIR stages the same tree for a package, with the final prefix inside quill.pc; uninstall
     * removes it */
    char *stage = path_join(tmp_dir(), "stage");
    rc = sh(&out, MAKE " install BUILD=%s DESTDIR=%s PREFIX=/opt/quill && grep -x 'prefix=/opt/quill' "
                  "%s/opt/quill/lib/pkgconfig/quill.pc",
            build_dir(), stage, stage);
    char *staged = path_join(stage, "opt/quill");
    if (rc != 0) test_fail(__FILE__, __LINE__, "make install DESTDIR=%s PREFIX=/opt/quill:\n%s", stage, out ? out : "");
    else if (check_installed_files(staged)) {
        free(out);
        out = NULL;
        rc = sh(&out, MAKE " uninstall BUILD=%s DESTDIR=%s PREFIX=/opt/quill && find %s -type f -o -type l", build_dir(),
                stage, stage);
        if (rc != 0 || !out || out[0])
            test_fail(__FILE__, __LINE__, "make uninstall left (exit %d):\n%s", rc, out ? out : "");
    }
    free(staged);
    free(stage);
done:
    free(out);
    free(model);
    free(prefix);
}

TEST(packaging_man_page_names_every_command) {
    /* the commands `quill` lists, each described in packaging/quill.1, which groff reads cleanly */
    char *usage = NULL, *out = NULL;
    char *page = read_file("packaging/quill.1", NULL);
    CHECK(page != NULL, "packaging/quill.1 not found");
    sh(&usage, "%s", quill_bin());
    int commands = 0;
    char missing[512] = "";
    char *list = usage ? strstr(usage, "commands:") : NULL;
    for (char *line = list ? strtok(list, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        char name[32];
        if (strncmp(line, "  ", 2) || sscanf(line, " %31s", name) != 1) continue;
        commands++;
        char entry[64];
        snprintf(entry, sizeof entry, "\n.B %s\n", name);
        if (!strstr(page, entry) && strlen(missing) + strlen(name) + 2 < sizeof missing)
            strcat(strcat(missing, " "), name);
    }
    int rc = sh(&out, "groff -ww -man -z packaging/quill.1");
    const bool clean = rc == 0 && out && !out[0];
    free(page);
    free(usage);
    if (!clean) test_fail(__FILE__, __LINE__, "groff warns about packaging/quill.1:\n%s", out ? out : "");
    free(out);
    CHECK(commands >= 10, "found %d commands in the usage of %s", commands, quill_bin());
    CHECK(!missing[0], "packaging/quill.1 does not describe:%s (add a .TP/.B entry under COMMANDS)", missing);
}

TEST(packaging_one_package_list) {
    /* scripts/install-deps.sh installs exactly scripts/debian-packages.txt after an apt-get update,
     * through sudo only when not root; .ci/run uses it instead of a list of its own */
    char *list = read_file("scripts/debian-packages.txt", NULL);
    char *ci = read_file(".ci/run", NULL);
    char *out = NULL;
    CHECK(list && ci, "scripts/debian-packages.txt or .ci/run not found");
    const bool ci_uses_script = strstr(ci, "scripts/install-deps.sh") && !strstr(ci, "apt-get install");
    free(ci);
    if (!ci_uses_script) {
        free(list);
        CHECK(false, ".ci/run must install packages with scripts/install-deps.sh, not a list of its own");
    }
    int rc = sh(&out, "sh scripts/install-deps.sh --dry-run");
    const bool as_root = geteuid() == 0;
    char *install = out ? strstr(out, "apt-get install") : NULL;
    char *update = out ? strstr(out, "apt-get update") : NULL;
    bool ok = rc == 0 && install && update && update < install && (as_root == !strstr(out, "sudo"));
    int n_packages = 0;
    char missing[512] = "";
    for (char *line = strtok(list, "\n"); ok && line; line = strtok(NULL, "\n")) {
        char name[128], guard[16] = "";
        if (line[0] == '#' || sscanf(line, "%127s %15s", name, guard) < 1) continue;
        n_packages++;
        if (!strcmp(guard, "unless")) continue; /* installed only when a command is missing */
        char word[132];
        snprintf(word, sizeof word, " %s", name);
        const char *at = strstr(install, word);
        if ((!at || (at[strlen(word)] != ' ' && at[strlen(word)] != '\n')) && strlen(missing) + strlen(name) + 2 < sizeof missing)
            strcat(strcat(missing, " "), name);
    }
    free(list);
    if (!ok) {
        test_fail(__FILE__, __LINE__, "install-deps.sh --dry-run (exit %d, %s) printed:\n%s", rc,
                  as_root ? "root: no sudo" : "not root: sudo", out ? out : "");
        free(out);
        return;
    }
    free(out);
    out = NULL;
    CHECK(n_packages >= 5 && !missing[0], "%d packages listed; not installed:%s", n_packages, missing);

    /* a user: sudo when there is one, a clear error when there is none (setpriv drops root) */
    if (!as_root) return;
    char *cmd_ok = NULL;
    const int have_setpriv = sh(&cmd_ok, "command -v setpriv");
    free(cmd_ok);
    CHECK(have_setpriv == 0, "setpriv (util-linux) is needed to run the script as a user");
    char *copy = path_join(tmp_dir(), "deps-as-user");
    rc = sh(&out, "mkdir -p %s/scripts %s/fakebin && cp scripts/install-deps.sh scripts/debian-packages.txt %s/scripts/ && "
                  "printf '#!/bin/sh\\necho sudo \"$@\"\\n' > %s/fakebin/sudo && chmod -R a+rX %s && chmod a+rx %s "
                  "%s/fakebin/sudo && cd / && setpriv --reuid=65534 --regid=65534 --clear-groups env PATH=%s/fakebin:/usr/bin:/bin "
                  "sh %s/scripts/install-deps.sh --dry-run",
            copy, copy, copy, copy, copy, tmp_dir(), copy, copy, copy);
    const bool with_sudo = rc == 0 && out && strstr(out, "sudo env DEBIAN_FRONTEND=noninteractive apt-get update") &&
                           strstr(out, "sudo env DEBIAN_FRONTEND=noninteractive apt-get install");
    if (!with_sudo) test_fail(__FILE__, __LINE__, "as a user with sudo (exit %d):\n%s", rc, out ? out : "");
    free(out);
    out = NULL;
    rc = sh(&out, "cd / && setpriv --reuid=65534 --regid=65534 --clear-groups env PATH=/usr/bin:/bin "
                  "sh %s/scripts/install-deps.sh --dry-run",
            copy);
    free(copy);
    const bool refused = rc != 0 && out && strstr(out, "run this script as root") && !strstr(out, "apt-get");
    if (!refused && !strstr(out ? out : "", "sudo "))
        test_fail(__FILE__, __LINE__, "as a user without sudo (exit %d):\n%s", rc, out ? out : "");
    free(out);
}
