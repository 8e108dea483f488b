/* The layers call one way. Every file of src/, server/ and cli/ sits on a floor: it may call the
 * files below it, never one above, so that a reader can take a file with what it calls and leave
 * the rest (a dispatcher that its handlers call back into, a tokenizer that its vocabulary calls,
 * a state that reads the pass that reads it: each such circle once hid where one part ended). This
 * reads the build's objects with nm: a file calls another when it uses a symbol the other defines.
 * Any circle among the files, or among the folders (src/model, src/kernels, server, ...), fails,
 * naming its members and a symbol of each call in it. */
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FILES 400
#define MAX_SYMS 20000

typedef struct {
    char name[160];   /* the object's path under the build, without ".o" */
    char folder[64];  /* src/<room>, or server, cli */
} unit;

typedef struct {
    char *name;
    int unit;
} symbol;

static unit units[MAX_FILES];
static int n_units;
static symbol defined[MAX_SYMS];
static int n_defined;
/* calls[a][b]: a symbol of b that a uses (NULL: none) */
static const char *calls[MAX_FILES][MAX_FILES];

static int cmp_symbol(const void *a, const void *b) {
    return strcmp(((const symbol *)a)->name, ((const symbol *)b)->name);
}

static int owner_of(const char *name) {
    symbol key = {(char *)name, -1};
    const symbol *s = bsearch(&key, defined, (size_t)n_defined, sizeof key, cmp_symbol);
    return s ? s->unit : -1;
}

/* Tarjan's strongly connected components over n nodes of an adjacency test; returns the first
 * component of more than one node in comp[] (its size), or 0. */
typedef bool (*edge_fn)(int a, int b);
static int t_index[MAX_FILES], t_low[MAX_FILES], t_stack[MAX_FILES], t_sp, t_next;
static bool t_on[MAX_FILES];
static int found[MAX_FILES], n_found;

static void strongconnect(int v, int n, edge_fn edge) {
    t_index[v] = t_low[v] = t_next++;
    t_stack[t_sp++] = v;
    t_on[v] = true;
    for (int w = 0; w < n; w++) {
        if (w == v || !edge(v, w)) continue;
        if (t_index[w] < 0) {
            strongconnect(w, n, edge);
            if (t_low[w] < t_low[v]) t_low[v] = t_low[w];
        } else if (t_on[w] && t_index[w] < t_low[v]) {
            t_low[v] = t_index[w];
        }
    }
    if (t_low[v] != t_index[v]) return;
    int members[MAX_FILES], m = 0, w;
    do {
        w = t_stack[--t_sp];
        t_on[w] = false;
        members[m++] = w;
    } while (w != v);
    if (m > 1 && !n_found) {
        memcpy(found, members, (size_t)m * sizeof *members);
        n_found = m;
    }
}

static int first_circle(int n, edge_fn edge) {
    for (int i = 0; i < n; i++) t_index[i] = -1, t_on[i] = false;
    t_sp = t_next = n_found = 0;
    for (int v = 0; v < n; v++)
        if (t_index[v] < 0) strongconnect(v, n, edge);
    return n_found;
}

static bool file_calls(int a, int b) { return calls[a][b] != NULL; }

static char folders[MAX_FILES][64];
static int n_folders;
static int folder_of(const char *f) {
    for (int i = 0; i < n_folders; i++)
        if (!strcmp(folders[i], f)) return i;
    snprintf(folders[n_folders], sizeof folders[0], "%s", f);
    return n_folders++;
}
static int unit_folder[MAX_FILES];
static bool folder_calls(int a, int b) {
    for (int i = 0; i < n_units; i++)
        if (unit_folder[i] == a)
            for (int j = 0; j < n_units; j++)
                if (unit_folder[j] == b && calls[i][j]) return true;
    return false;
}

/* Appends a name to a newline-separated list. */
static bool list_add(char **list, size_t *len, size_t *cap, const char *name) {
    const size_t n = strlen(name);
    if (*len + n + 2 > *cap) {
        const size_t grown_cap = (*len + n + 2) * 2;
        char *grown = realloc(*list, grown_cap);
        if (!grown) return false;
        *list = grown;
        *cap = grown_cap;
    }
    memcpy(*list + *len, name, n);
    (*list)[*len + n] = '\n';
    *len += n + 1;
    (*list)[*len] = 0;
    return true;
}

/* The unit of an object path (a new one the first time), or -1 for an object whose source is gone
 * (left by a renamed or deleted file: linked into nothing). */
static int unit_of(const char *object, const char *build) {
    char source[600];
    snprintf(source, sizeof source, "%s", object + strlen(build) + 1);
    const size_t len = strlen(source);
    if (len < 3) return -1;
    source[len - 1] = 'c';
    char name[160];
    snprintf(name, sizeof name, "%.*s", (int)(len - 2), source);
    for (int i = n_units - 1; i >= 0; i--)
        if (!strcmp(units[i].name, name)) return i;
    if (access(source, F_OK) != 0 || n_units == MAX_FILES) return -1;
    unit *u = &units[n_units];
    snprintf(u->name, sizeof u->name, "%s", name);
    const char *second = strchr(source, '/');
    const char *third = second ? strchr(second + 1, '/') : NULL;
    if (!strncmp(source, "src/", 4) && third) snprintf(u->folder, sizeof u->folder, "%.*s", (int)(third - source), source);
    else snprintf(u->folder, sizeof u->folder, "%.*s", second ? (int)(second - source) : (int)len, source);
    unit_folder[n_units] = folder_of(u->folder);
    return n_units++;
}

TEST(layers_call_one_way) {
    if (!tool_available("nm --version")) {
        test_skip("nm not found (binutils)");
        return;
    }
    const char *build = quill_build_dir();
    char cmd[1800];
    /* one nm for every object ("path: name type [value size]" lines): a process per object took
     * seconds on a busy machine */
    snprintf(cmd, sizeof cmd, "find '%s/src' '%s/server' '%s/cli' -name '*.o' 2>/dev/null | sort | xargs nm -P -A 2>&1", build,
             build, build);
    static char *undef[MAX_FILES];
    static size_t undef_len[MAX_FILES], undef_cap[MAX_FILES];
    n_units = n_defined = n_folders = 0;
    memset(calls, 0, sizeof calls);
    FILE *p = popen(cmd, "r");
    CHECK(p != NULL, "cannot run nm");
    char line[1200];
    bool ok = true;
    while (fgets(line, sizeof line, p)) {
        char object[600], name[512], type;
        if (sscanf(line, "%599[^:]: %511s %c", object, name, &type) != 3) continue;
        const int u = unit_of(object, build);
        if (u < 0) continue;
        if (type == 'U') ok &= list_add(&undef[u], &undef_len[u], &undef_cap[u], name);
        else if ((type == 'T' || type == 'D' || type == 'B' || type == 'R') && n_defined < MAX_SYMS) {
            defined[n_defined].name = strdup(name);
            defined[n_defined++].unit = u;
        }
    }
    if (pclose(p) != 0) test_fail(__FILE__, __LINE__, "nm failed on the objects of %s", build), ok = false;
    CHECK(n_units < MAX_FILES && n_defined < MAX_SYMS, "%d objects, %d symbols: raise MAX_FILES (%d) or MAX_SYMS (%d)",
          n_units, n_defined, MAX_FILES, MAX_SYMS);
    qsort(defined, (size_t)n_defined, sizeof defined[0], cmp_symbol);
    for (int a = 0; a < n_units; a++) {
        for (char *s = undef[a] ? strtok(undef[a], "\n") : NULL; s; s = strtok(NULL, "\n")) {
            const int b = owner_of(s);
            if (b >= 0 && b != a && !calls[a][b]) calls[a][b] = s;
        }
    }
    CHECK(!ok || n_units >= 60, "found only %d objects under %s", n_units, build);
    if (ok && first_circle(n_units, file_calls)) {
        char msg[3000] = "";
        for (int i = 0; i < n_found; i++)
            for (int j = 0; j < n_found; j++)
                if (calls[found[i]][found[j]] && strlen(msg) < sizeof msg - 300)
                    snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "\n    %.150s -> %.150s (%.120s)", units[found[i]].name,
                             units[found[j]].name, calls[found[i]][found[j]]);
        test_fail(__FILE__, __LINE__, "%d files call one another in a circle (move what both need below both):%s", n_found,
                  msg);
        ok = false;
    }
    if (ok && first_circle(n_folders, folder_calls)) {
        char msg[1500] = "";
        for (int i = 0; i < n_found; i++)
            for (int a = 0; a < n_units; a++)
                for (int b = 0; b < n_units; b++)
                    if (unit_folder[a] == found[i] && calls[a][b] && unit_folder[b] != found[i] &&
                        strlen(msg) < sizeof msg - 300) {
                        for (int j = 0; j < n_found; j++)
                            if (unit_folder[b] == found[j])
                                snprintf(msg + strlen(msg), sizeof msg - strlen(msg), "\n    %.150s -> %.150s (%.120s)", units[a].name,
                                         units[b].name, calls[a][b]);
                    }
        test_fail(__FILE__, __LINE__, "%d folders call one another in a circle:%s", n_found, msg);
    }
    for (int a = 0; a < n_units; a++) free(undef[a]), undef[a] = NULL, undef_len[a] = undef_cap[a] = 0;
    for (int i = 0; i < n_defined; i++) free(defined[i].name);
}
