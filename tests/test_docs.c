/* The documentation against the code it describes, so that a doc that falls behind fails the
 * suite: README.md's two commands and its usage examples run as written (against stories260K);
 * every flag of every `quill COMMAND --help` appears in that command's section of docs/cli.md;
 * every option the man page shows exists; every route of server/'s table is in docs/server.md and
 * answered by a live server; every kernel set is named in docs/performance.md and the man page,
 * every architecture in README.md and docs/models.md, and every BPE pre-tokenizer in the latter;
 * every relative link of README.md, bench/README.md and docs/ reaches a file and heading that
 * exist. Runs from the repository root, as the whole suite does. */
#include "server_util.h"
#include "test.h"

#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---------------------------------------------------------------- small text helpers */

typedef struct {
    char **items;
    size_t n, cap;
} str_list;

static void list_push(str_list *l, const char *s, size_t len);

/* Appends unless an equal item is there. */
static void list_add(str_list *l, const char *s, size_t len) {
    for (size_t i = 0; i < l->n; i++)
        if (strlen(l->items[i]) == len && !memcmp(l->items[i], s, len)) return;
    list_push(l, s, len);
}

/* Appends without looking for an equal item (parallel lists). */
static void list_push(str_list *l, const char *s, size_t len) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 32;
        l->items = realloc(l->items, l->cap * sizeof *l->items);
        if (!l->items) abort();
    }
    l->items[l->n] = strndup(s, len);
    if (!l->items[l->n]) abort();
    l->n++;
}

static void list_free(str_list *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i]);
    free(l->items);
    *l = (str_list){0};
}

static bool flag_char(char c) { return isalnum((unsigned char)c) || c == '-' || c == '_'; }

/* The option names a help text mentions: "-x" or "--name" where a word starts (after a space,
 * a bracket, a comma, a bar or a slash), so that "llama-cli" and "Ctrl-C" are not taken. */
static void help_flags(const char *help, str_list *out) {
    for (const char *p = help; *p; p++) {
        if (*p != '-') continue;
        if (p > help && !strchr(" \t\n[(|,/\"", p[-1])) continue;
        const char *q = p + 1;
        if (*q == '-') q++;
        if (!isalpha((unsigned char)*q)) continue;
        while (flag_char(*q)) q++;
        size_t len = (size_t)(q - p);
        while (len > 2 && p[len - 1] == '-') len--; /* "--swa-pattern-th" keeps its word; a dash at the end is prose */
        list_add(out, p, len);
        p = q - 1;
    }
}

/* Whether `word` occurs in text[0..len) as a whole word (no flag character on either side). */
static bool has_word(const char *text, size_t len, const char *word) {
    size_t wl = strlen(word);
    if (wl == 0 || wl > len) return false;
    for (const char *p = text; p + wl <= text + len; p++) {
        if (*p != word[0] || memcmp(p, word, wl) != 0) continue;
        bool left = p == text || !flag_char(p[-1]);
        bool right = p + wl == text + len || !flag_char(p[wl]);
        if (left && right) return true;
    }
    return false;
}

/* The section of a Markdown text under the heading line `heading` (up to the next heading of the
 * same or a higher level), or NULL. */
static const char *md_section(const char *md, const char *heading, size_t *len) {
    size_t hl = strlen(heading);
    const char *p = md;
    while ((p = strstr(p, heading)) != NULL) {
        if ((p == md || p[-1] == '\n') && (p[hl] == '\n' || p[hl] == 0)) break;
        p += hl;
    }
    if (!p) return NULL;
    int level = 0;
    while (heading[level] == '#') level++;
    const char *end = p + hl;
    while ((end = strchr(end, '\n')) != NULL) {
        end++;
        int l = 0;
        while (end[l] == '#') l++;
        if (l > 0 && l <= level && end[l] == ' ') break;
    }
    *len = end ? (size_t)(end - p) : strlen(p);
    return p;
}

/* The lines of every ```sh block of a Markdown text. */
static void sh_block_lines(const char *md, str_list *out) {
    const char *p = md;
    while ((p = strstr(p, "```sh\n")) != NULL) {
        p += 6;
        const char *end = strstr(p, "```");
        if (!end) break;
        while (p < end) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            if (!nl) nl = end;
            if (nl > p) list_add(out, p, (size_t)(nl - p));
            p = nl + 1;
        }
        p = end + 3;
    }
}

/* A shell line without its comment (a # after a space, outside quotes) and trailing blanks. */
static char *strip_comment(const char *line) {
    char *s = strdup(line);
    if (!s) abort();
    char quote = 0;
    for (char *p = s; *p; p++) {
        if (quote) {
            if (*p == quote) quote = 0;
        } else if (*p == '\'' || *p == '"') {
            quote = *p;
        } else if (*p == '#' && p > s && isspace((unsigned char)p[-1])) {
            *p = 0;
            break;
        }
    }
    size_t n = strlen(s);
    while (n > 0 && isspace((unsigned char)s[n - 1])) s[--n] = 0;
    return s;
}

/* `text` with every "../shared" replaced by the suite's shared directory; malloc'd. */
static char *with_shared(const char *text, const char *shared) {
    size_t cap = strlen(text) * 2 + strlen(shared) * 8 + 64, n = 0;
    char *out = malloc(cap);
    if (!out) abort();
    for (const char *p = text; *p;) {
        if (!strncmp(p, "../shared", 9)) {
            size_t sl = strlen(shared);
            if (n + sl + 1 >= cap) { cap = 2 * (n + sl + 1); out = realloc(out, cap); if (!out) abort(); }
            memcpy(out + n, shared, sl);
            n += sl;
            p += 9;
        } else {
            if (n + 2 >= cap) { cap *= 2; out = realloc(out, cap); if (!out) abort(); }
            out[n++] = *p++;
        }
    }
    out[n] = 0;
    return out;
}

static char *read_text(const char *path) { return read_file(path, NULL); }

/* ---------------------------------------------------------------- README.md */

/* The two commands of the front page, as written: the install script is there and runnable, the
 * run target is known to make and builds only the CLI, and its main job (the command `make run`
 * would run) generates the story with the built binary. */
TEST(docs_readme_two_commands_work) {
    char *readme = read_text("README.md");
    CHECK(readme, "README.md missing (run the suite from the repository root)");
    str_list lines = {0};
    sh_block_lines(readme, &lines);
    bool install_run = false, make_test = false;
    for (size_t i = 0; i < lines.n; i++) {
        char *l = strip_comment(lines.items[i]);
        if (!strcmp(l, "./scripts/install-deps.sh && make run")) install_run = true;
        if (!strcmp(l, "make test")) make_test = true;
        free(l);
    }
    list_free(&lines);
    free(readme);
    CHECK(install_run, "README.md has no sh block line `./scripts/install-deps.sh && make run`");
    CHECK(make_test, "README.md has no sh block line `make test`");
    CHECK(access("scripts/install-deps.sh", X_OK) == 0, "scripts/install-deps.sh is missing or not executable");

    char *plan = NULL;
    /* MAKEFLAGS of a `make test` above us would hand this make a jobserver it cannot reach */
    int rc = run_cmd("env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -n run BUILD=build-docs-check", &plan, true);
    if (rc != 0) {
        test_fail(__FILE__, __LINE__, "`make -n run` failed (%d):\n%s", rc, plan ? plan : "");
        free(plan);
        return;
    }
    bool builds_tests = strstr(plan, "quill_test") != NULL;
    /* the recipe's last line is the main job: ./BUILD/quill run ... */
    char *job = strstr(plan, "./build-docs-check/quill run ");
    char *cmd = NULL;
    if (job) {
        char *nl = strchr(job, '\n');
        if (nl) *nl = 0;
        cmd = strdup(job + strlen("./build-docs-check/quill"));
    }
    free(plan);
    CHECK(!builds_tests, "`make run` builds the test suite; it should build only the CLI");
    CHECK(cmd, "`make -n run` does not run `./BUILD/quill run ...`");

    const char *shared = shared_dir();
    if (!shared) { free(cmd); return; }
    char *args = with_shared(cmd, shared);
    free(cmd);
    size_t n = strlen(quill_bin()) + strlen(args) + 32;
    char *full = malloc(n);
    if (!full) abort();
    snprintf(full, n, "%s%s", quill_bin(), args);
    char *out = NULL;
    rc = run_cmd(full, &out, true);
    if (rc != 0 || !strstr(out, "Once upon a time"))
        test_fail(__FILE__, __LINE__, "the main job `%s` exited %d:\n%s", full, rc, out ? out : "");
    free(out);
    free(full);
    free(args);
}

/* A curl line of the README: its path and -d body (NULL: a GET). */
static bool parse_curl(const char *line, char *path, size_t path_size, char **body) {
    const char *u = strstr(line, "http://127.0.0.1:");
    if (!u) return false;
    u += strlen("http://127.0.0.1:");
    while (isdigit((unsigned char)*u)) u++;
    size_t pl = strcspn(u, " '\"");
    if (pl == 0 || pl >= path_size) return false;
    memcpy(path, u, pl);
    path[pl] = 0;
    *body = NULL;
    const char *d = strstr(line, " -d '");
    if (d) {
        d += 5;
        const char *e = strchr(d, '\'');
        if (!e) return false;
        *body = strndup(d, (size_t)(e - d));
    }
    return true;
}

/* The usage screen: every `quill ...` line of the README's sh blocks that uses a model of
 * ../shared runs with the built binary and succeeds (a chat reads one message then /bye; a serve
 * starts on a free port and answers the curl lines after it). It must show run, chat, serve,
 * perplexity and verify. */
TEST(docs_readme_usage_examples_run) {
    REQUIRE_SHARED(shared);
    char *readme = read_text("README.md");
    CHECK(readme, "README.md missing");
    str_list lines = {0};
    sh_block_lines(readme, &lines);
    free(readme);
    const char *seen[] = {"run", "chat", "serve", "perplexity", "verify"};
    bool ran[5] = {0};
    test_server srv = {0};
    bool serving = false;
    int n_ran = 0;
    for (size_t i = 0; i < lines.n; i++) {
        char *line = strip_comment(lines.items[i]);
        if (!strncmp(line, "curl ", 5) && serving) {
            char path[256], *body = NULL;
            if (!parse_curl(line, path, sizeof path, &body)) {
                test_fail(__FILE__, __LINE__, "README curl line not understood: %s", line);
                free(line);
                break;
            }
            http_resp r = {0};
            bool ok = body ? http_post(srv.port, path, body, &r)
                           : http_do(srv.port, "GET", path, NULL, NULL, 0, 60, &r);
            if (!ok || r.status != 200)
                test_fail(__FILE__, __LINE__, "README example `%s` answered %d: %s", line, ok ? r.status : -1,
                          r.body ? r.body : "(no reply)");
            http_resp_free(&r);
            free(body);
            n_ran++;
        } else if (!strncmp(line, "quill ", 6) && strstr(line, "../shared/models/")) {
            char *cmdline = with_shared(line + 6, shared);
            char verb[32] = "";
            sscanf(cmdline, "%31s", verb);
            for (int k = 0; k < 5; k++)
                if (!strcmp(verb, seen[k])) ran[k] = true;
            if (!strcmp(verb, "serve")) {
                /* the model after -m, the rest as written but --port (a free one here) and & */
                char model[1024] = "", args[2048] = "";
                size_t an = 0;
                char *save = NULL;
                char *tok = strtok_r(cmdline + strlen("serve"), " ", &save);
                while (tok) {
                    if (!strcmp(tok, "-m")) {
                        tok = strtok_r(NULL, " ", &save);
                        if (tok) snprintf(model, sizeof model, "%s", tok);
                    } else if (!strcmp(tok, "--port")) {
                        strtok_r(NULL, " ", &save);
                    } else if (strcmp(tok, "&") != 0) {
                        an += (size_t)snprintf(args + an, sizeof args - an, "%s ", tok);
                    }
                    tok = tok ? strtok_r(NULL, " ", &save) : NULL;
                }
                if (serving) server_stop(&srv);
                serving = server_start(&srv, model, args);
                if (!serving) test_fail(__FILE__, __LINE__, "README example `%s` did not start", line);
            } else {
                size_t n = strlen(quill_bin()) + strlen(cmdline) + 64;
                char *full = malloc(n);
                if (!full) abort();
                if (!strcmp(verb, "chat"))
                    snprintf(full, n, "printf 'Once upon a time\\n/bye\\n' | %s %s", quill_bin(), cmdline);
                else
                    snprintf(full, n, "%s %s", quill_bin(), cmdline);
                char *out = NULL;
                int rc = run_cmd(full, &out, true);
                if (rc != 0 || !out || !*out)
                    test_fail(__FILE__, __LINE__, "README example `%s` exited %d:\n%s", line, rc, out ? out : "");
                free(out);
                free(full);
            }
            free(cmdline);
            n_ran++;
        }
        free(line);
    }
    if (serving) CHECK_EQ_INT(server_stop(&srv), 0);
    list_free(&lines);
    for (int k = 0; k < 5; k++)
        CHECK(ran[k], "README.md's usage has no runnable `quill %s -m ../shared/models/...` line", seen[k]);
    CHECK(n_ran >= 6, "only %d usage lines ran", n_ran);
}

TEST(docs_front_pages_stay_small) {
    char *readme = NULL, *bench = NULL;
    size_t rn = 0, bn = 0;
    readme = read_file("README.md", &rn);
    bench = read_file("bench/README.md", &bn);
    free(readme);
    free(bench);
    CHECK(readme && bench, "README.md or bench/README.md missing");
    /* the front door fits a few screens; the bench page holds today's tables (history: git) */
    CHECK(rn <= 15 * 1024, "README.md is %zu bytes: move detail to docs/ (at most 15 KiB)", rn);
    CHECK(bn <= 40 * 1024, "bench/README.md is %zu bytes: replace superseded tables, the history is in git (at most 40 KiB)", bn);
}

/* ---------------------------------------------------------------- docs/cli.md and the man page */

/* The commands `quill --help` lists. */
static void quill_commands(str_list *out) {
    char cmd[512], *help = NULL;
    snprintf(cmd, sizeof cmd, "%s --help", quill_bin());
    if (run_cmd(cmd, &help, false) != 0) { free(help); return; }
    const char *p = strstr(help, "commands:\n");
    if (p) p += strlen("commands:\n");
    while (p && *p == ' ') {
        while (*p == ' ') p++;
        size_t n = strcspn(p, " \n");
        if (n) list_add(out, p, n);
        p = strchr(p, '\n');
        if (p) p++;
    }
    free(help);
}

TEST(docs_cli_every_flag_documented) {
    char *cli = read_text("docs/cli.md");
    CHECK(cli, "docs/cli.md missing");
    str_list cmds = {0};
    quill_commands(&cmds);
    int n_flags = 0;
    for (size_t i = 0; i < cmds.n; i++) {
        const char *c = cmds.items[i];
        char heading[128], cmd[512], *help = NULL;
        snprintf(heading, sizeof heading, "## `quill %s`", c);
        size_t sl = 0;
        const char *sec = md_section(cli, heading, &sl);
        if (!sec) test_fail(__FILE__, __LINE__, "docs/cli.md has no section \"%s\"", heading);
        snprintf(cmd, sizeof cmd, "%s %s --help", quill_bin(), c);
        run_cmd(cmd, &help, true);
        str_list flags = {0};
        help_flags(help ? help : "", &flags);
        free(help);
        if (flags.n == 0) test_fail(__FILE__, __LINE__, "`quill %s --help` names no option", c);
        for (size_t f = 0; sec && f < flags.n; f++, n_flags++)
            if (!has_word(sec, sl, flags.items[f]))
                test_fail(__FILE__, __LINE__, "`quill %s --help` has %s, which docs/cli.md's \"%s\" does not mention "
                          "(scripts/update-cli-doc.sh refreshes the --help blocks)", c,
                          flags.items[f], heading);
        list_free(&flags);
    }
    size_t n_cmds = cmds.n;
    list_free(&cmds);
    free(cli);
    CHECK(n_cmds >= 10, "`quill --help` listed %zu commands", n_cmds);
    CHECK(n_flags >= 100, "only %d flags found in the commands' help", n_flags);
}

/* The man page's options exist: every \-\-name it shows is in some command's help. */
TEST(docs_man_page_options_exist) {
    char *man = read_text("packaging/quill.1");
    CHECK(man, "packaging/quill.1 missing");
    /* troff writes a dash as \- */
    size_t n = strlen(man);
    char *plain = malloc(n + 1);
    if (!plain) abort();
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (man[i] == '\\' && man[i + 1] == '-') { plain[k++] = '-'; i++; }
        else plain[k++] = man[i];
    }
    plain[k] = 0;
    free(man);
    /* SEE ALSO names other programs' options (pkg-config's) */
    char *see_also = strstr(plain, ".SH SEE ALSO");
    if (see_also) *see_also = 0;
    str_list man_flags = {0}, cmds = {0};
    help_flags(plain, &man_flags);
    free(plain);
    quill_commands(&cmds);
    size_t cap = 1 << 16, len = 0;
    char *all = malloc(cap);
    if (!all) abort();
    all[0] = 0;
    for (size_t i = 0; i < cmds.n; i++) {
        char cmd[512], *help = NULL;
        snprintf(cmd, sizeof cmd, "%s %s --help", quill_bin(), cmds.items[i]);
        run_cmd(cmd, &help, true);
        size_t hl = help ? strlen(help) : 0;
        if (len + hl + 2 > cap) { cap = 2 * (len + hl + 2); all = realloc(all, cap); if (!all) abort(); }
        memcpy(all + len, help ? help : "", hl);
        len += hl;
        all[len++] = '\n';
        all[len] = 0;
        free(help);
    }
    for (size_t i = 0; i < man_flags.n; i++)
        if (strcmp(man_flags.items[i], "--version") != 0 && !has_word(all, len, man_flags.items[i]))
            test_fail(__FILE__, __LINE__, "packaging/quill.1 shows %s, which no `quill COMMAND --help` has",
                      man_flags.items[i]);
    size_t n_man = man_flags.n;
    list_free(&man_flags);
    list_free(&cmds);
    free(all);
    CHECK(n_man >= 5, "only %zu options found in packaging/quill.1", n_man);
}

/* ---------------------------------------------------------------- docs/server.md */

/* The routes of server/'s route table: {"METHOD", "/path", ...} rows in any .c file of server/. */
static void server_routes(str_list *methods, str_list *paths) {
    DIR *d = opendir("server");
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl < 3 || strcmp(e->d_name + nl - 2, ".c") != 0) continue;
        char *path = path_join("server", e->d_name);
        char *src = read_text(path);
        free(path);
        if (!src) continue;
        static const char *const verbs[] = {"GET", "POST", "PUT", "DELETE", "PATCH"};
        for (const char *p = src; (p = strstr(p, "{\"")) != NULL; p += 2) {
            for (size_t v = 0; v < sizeof verbs / sizeof verbs[0]; v++) {
                size_t vl = strlen(verbs[v]);
                if (strncmp(p + 2, verbs[v], vl) != 0 || p[2 + vl] != '"') continue;
                const char *q = p + 3 + vl;
                while (*q == ',' || *q == ' ') q++;
                if (q[0] != '"' || q[1] != '/') continue;
                const char *end = strchr(q + 1, '"');
                if (!end) continue;
                list_push(methods, verbs[v], vl);
                list_push(paths, q + 1, (size_t)(end - q - 1));
            }
        }
        free(src);
    }
    closedir(d);
}

TEST(docs_server_every_route_documented) {
    char *doc = read_text("docs/server.md");
    CHECK(doc, "docs/server.md missing");
    str_list methods = {0}, paths = {0};
    server_routes(&methods, &paths);
    bool chat = false, health = false;
    for (size_t i = 0; i < paths.n; i++) {
        char want[512];
        snprintf(want, sizeof want, "`%s %s`", methods.items[i], paths.items[i]);
        if (!strstr(doc, want)) test_fail(__FILE__, __LINE__, "docs/server.md does not list the route %s", want);
        if (!strcmp(paths.items[i], "/v1/chat/completions")) chat = true;
        if (!strcmp(paths.items[i], "/health")) health = true;
    }
    size_t n = paths.n;
    list_free(&methods);
    list_free(&paths);
    free(doc);
    CHECK(chat && health, "the route table was not found in server/'s sources ({\"POST\", \"/v1/chat/completions\", ...})");
    CHECK(n >= 8, "only %zu routes found in server/'s sources", n);
}

/* The table is what the server answers: each route is served (not 404) by a live server, and a
 * path outside it is a 404. */
TEST(docs_server_routes_answered) {
    REQUIRE_SHARED(shared);
    str_list methods = {0}, paths = {0};
    server_routes(&methods, &paths);
    CHECK(paths.n >= 8, "only %zu routes found in server/'s sources", paths.n);
    char *model = path_join(shared, "models/stories260K.gguf");
    test_server s;
    bool started = server_start(&s, model, "-np 1 -c 256 -t 1");
    free(model);
    if (!started) { list_free(&methods); list_free(&paths); return; }
    for (size_t i = 0; i < paths.n; i++) {
        http_resp r = {0};
        bool post = !strcmp(methods.items[i], "POST");
        bool ok = http_do(s.port, methods.items[i], paths.items[i], post ? "Content-Type: application/json\r\n" : NULL,
                          post ? "{}" : NULL, post ? 2 : 0, 30, &r);
        if (!ok || r.status == 404 || r.status == 405)
            test_fail(__FILE__, __LINE__, "%s %s answered %d", methods.items[i], paths.items[i], ok ? r.status : -1);
        http_resp_free(&r);
    }
    http_resp r = {0};
    bool ok = http_do(s.port, "GET", "/v1/no-such-route", NULL, NULL, 0, 30, &r);
    int status = ok ? r.status : -1;
    http_resp_free(&r);
    list_free(&methods);
    list_free(&paths);
    CHECK_EQ_INT(server_stop(&s), 0);
    CHECK_EQ_INT(status, 404);
}

/* ---------------------------------------------------------------- kernel sets */

/* The names of the kernel sets: the strings of every `set_names[...] = {...}` table under src/
 * (found wherever it lives; one per architecture is fine). */
static void find_set_names(const char *dir, str_list *out) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *path = path_join(dir, e->d_name);
        size_t nl = strlen(e->d_name);
        if (nl > 2 && !strcmp(e->d_name + nl - 2, ".c")) {
            char *src = read_text(path);
            for (const char *p = src; p && (p = strstr(p, "set_names[")) != NULL; p++) {
                const char *open = strchr(p, '{'), *close = open ? strstr(open, "};") : NULL;
                if (!open || !close || memchr(p, ';', (size_t)(open - p))) continue;
                for (const char *q = open; (q = memchr(q, '"', (size_t)(close - q))) != NULL;) {
                    const char *end = memchr(q + 1, '"', (size_t)(close - q - 1));
                    if (!end) break;
                    list_add(out, q + 1, (size_t)(end - q - 1));
                    q = end + 1;
                }
            }
            free(src);
        } else if (!strchr(e->d_name, '.')) {
            find_set_names(path, out);
        }
        free(path);
    }
    closedir(d);
}

/* Every kernel set QUILL_ISA accepts is named in docs/performance.md and in the man page. */
TEST(docs_kernel_sets_documented) {
    str_list sets = {0};
    find_set_names("src", &sets);
    char *perf = read_text("docs/performance.md");
    char *man = read_text("packaging/quill.1");
    bool scalar = false;
    for (size_t i = 0; i < sets.n; i++) {
        if (!strcmp(sets.items[i], "scalar")) scalar = true;
        if (!perf || !has_word(perf, strlen(perf), sets.items[i]))
            test_fail(__FILE__, __LINE__, "docs/performance.md does not name the kernel set %s", sets.items[i]);
        char want[64];
        snprintf(want, sizeof want, ".BR %s", sets.items[i]);
        bool in_man = man && (strstr(man, want) || (snprintf(want, sizeof want, ".B %s\n", sets.items[i]), strstr(man, want)));
        if (!in_man) test_fail(__FILE__, __LINE__, "packaging/quill.1 does not name the kernel set %s under QUILL_ISA", sets.items[i]);
    }
    size_t n = sets.n;
    list_free(&sets);
    free(perf);
    free(man);
    CHECK(scalar && n >= 2, "the kernel sets' names (set_names[] = {...}) were not found under src/");
}

/* ---------------------------------------------------------------- families */

/* The architectures quill loads: the {.name = "..."} rows of every arch.c under src/. */
static void find_arch_names(const char *dir, str_list *out) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char *path = path_join(dir, e->d_name);
        if (!strcmp(e->d_name, "arch.c")) {
            char *src = read_text(path);
            for (const char *p = src; p && (p = strstr(p, "{.name = \"")) != NULL;) {
                p += strlen("{.name = \"");
                const char *end = strchr(p, '"');
                if (!end) break;
                list_add(out, p, (size_t)(end - p));
            }
            free(src);
        } else if (!strchr(e->d_name, '.')) {
            find_arch_names(path, out);
        }
        free(path);
    }
    closedir(d);
}

/* Every architecture of the table is in README.md's and docs/models.md's families. */
TEST(docs_families_documented) {
    str_list archs = {0};
    find_arch_names("src", &archs);
    char *readme = read_text("README.md"), *models = read_text("docs/models.md");
    bool llama = false;
    for (size_t i = 0; i < archs.n; i++) {
        char want[80];
        snprintf(want, sizeof want, "`%s`", archs.items[i]);
        if (!strcmp(archs.items[i], "llama")) llama = true;
        if (!readme || !strstr(readme, want))
            test_fail(__FILE__, __LINE__, "README.md's families do not name %s", want);
        if (!models || !strstr(models, want))
            test_fail(__FILE__, __LINE__, "docs/models.md's families do not name %s", want);
    }
    size_t n = archs.n;
    list_free(&archs);
    free(readme);
    free(models);
    CHECK(llama && n >= 10, "the architecture table ({.name = \"llama\", ...} in an arch.c under src/) was not found");
}

/* Every tokenizer.ggml.pre value the BPE tokenizer accepts (its pre_specs table: "a|b|c" per row)
 * is named in docs/models.md. */
TEST(docs_pre_tokenizers_documented) {
    char *src = NULL;
    src = read_text("src/tokenizer/bpe.c");
    CHECK(src, "the BPE tokenizer's source (src/tokenizer/bpe.c) was not found: update tests/test_docs.c");
    char *models = read_text("docs/models.md");
    const char *table = strstr(src, "pre_specs[] = {");
    const char *end = table ? strstr(table, "};") : NULL;
    int n = 0;
    for (const char *p = table; p && p < end && (p = strstr(p, "{\"")) != NULL && p < end;) {
        p += 2;
        const char *close = strchr(p, '"');
        if (!close) break;
        while (p < close) {
            size_t len = strcspn(p, "|\"");
            char want[96];
            snprintf(want, sizeof want, "`%.*s`", (int)len, p);
            if (!models || !strstr(models, want))
                test_fail(__FILE__, __LINE__, "docs/models.md does not name the pre-tokenizer %s", want);
            n++;
            p += len + (p[len] == '|');
        }
        p = close + 1;
    }
    free(src);
    free(models);
    CHECK(n >= 20, "only %d pre-tokenizer names found in pre_specs[]", n);
}

/* ---------------------------------------------------------------- links */

/* GitHub's anchor of a heading: lower case, spaces to dashes, other punctuation dropped. */
static void heading_anchor(const char *h, size_t n, char *out, size_t size) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < size; i++) {
        unsigned char c = (unsigned char)h[i];
        if (isalnum(c) || c >= 0x80) out[k++] = (char)tolower(c);
        else if (c == ' ' || c == '-') out[k++] = '-';
        else if (c == '_') out[k++] = '_';
    }
    out[k] = 0;
}

static bool has_anchor(const char *md, const char *anchor) {
    for (const char *p = md; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (*p != '#') continue;
        const char *h = p;
        while (*h == '#') h++;
        if (*h != ' ') continue;
        h++;
        size_t n = strcspn(h, "\n");
        char a[512];
        heading_anchor(h, n, a, sizeof a);
        if (!strcmp(a, anchor)) return true;
    }
    return false;
}

static void check_links(const char *file) {
    char *md = read_text(file);
    if (!md) { test_fail(__FILE__, __LINE__, "%s missing", file); return; }
    char dir[512];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (slash) slash[1] = 0;
    else dir[0] = 0;
    for (const char *p = md; (p = strstr(p, "](")) != NULL; p += 2) {
        const char *t = p + 2;
        size_t n = strcspn(t, ")");
        if (!strncmp(t, "http", 4) || !strncmp(t, "mailto:", 7) || n == 0 || n >= 400) continue;
        char target[512], path[1024];
        memcpy(target, t, n);
        target[n] = 0;
        char *hash = strchr(target, '#');
        if (hash) *hash++ = 0;
        char *doc = NULL;
        if (target[0]) {
            snprintf(path, sizeof path, "%s%s", dir, target);
            if (access(path, F_OK) != 0) {
                test_fail(__FILE__, __LINE__, "%s links to %s, which does not exist", file, path);
                continue;
            }
            doc = hash ? read_text(path) : NULL;
        } else {
            doc = strdup(md);
        }
        if (hash && doc && !has_anchor(doc, hash))
            test_fail(__FILE__, __LINE__, "%s links to %s#%s, which has no such heading", file, target[0] ? target : file,
                      hash);
        free(doc);
    }
    free(md);
}

TEST(docs_links_resolve) {
    check_links("README.md");
    check_links("bench/README.md");
    DIR *d = opendir("docs");
    CHECK(d, "docs/ missing");
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) != NULL) {
        size_t nl = strlen(e->d_name);
        if (nl < 4 || strcmp(e->d_name + nl - 3, ".md") != 0) continue;
        char *path = path_join("docs", e->d_name);
        check_links(path);
        free(path);
        n++;
    }
    closedir(d);
    CHECK(n >= 7, "docs/ holds %d pages", n);
}
