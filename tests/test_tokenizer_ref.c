/* The tokenizer against the reference's own llama-tokenize (../shared/ref/bin), on text made here
 * and seen by nobody beforehand: for every vocabulary in ../shared/tokenizer, one text assembled
 * from pieces chosen to stress pre-tokenizers (newlines, tabs, runs of spaces and digits, CJK,
 * emoji, combining marks, contractions in any case, Unicode whitespace, invalid UTF-8) by a
 * seeded generator. QUILL_TOKENIZER_SEED picks other texts. */
#include "quill.h"
#include "test.h"

#include <dirent.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

static const char *const pieces[] = {
    "Hello", "world", " ", "  ", "   ", "\n", "\n\n", "\r\n", "\r", "\t", "\t\t", " \n ", "123", "4567890",
    "1,234.56", "IT'S", "it's", "we'LL", "I'M", "'re", "'VE", "don't", "'", "''", "'s", "\xe4\xbd\xa0\xe5\xa5\xbd",
    "\xe4\xb8\x96\xe7\x95\x8c", "\xed\x95\x9c\xea\xb5\xad\xec\x96\xb4", "\xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e",
    "\xe3\x81\xa7\xe3\x81\x99", "\xf0\x9f\xa6\x99", "\xf0\x9f\x98\x80\xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd", "\xc3\xa9",
    "e\xcc\x81", "\xce\xa9\xce\xbc\xce\xad\xce\xb3\xce\xb1", "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82",
    "\xd9\x85\xd8\xb1\xd8\xad\xd8\xa8\xd8\xa7", "\xe0\xa4\xa8\xe0\xa4\xae\xe0\xa4\xb8\xe0\xa5\x8d\xe0\xa4\xa4\xe0\xa5\x87",
    "\xe0\xb9\x84\xe0\xb8\x97\xe0\xb8\xa2", "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\xa8", "\xc2\x85", "\xe2\x80\x8b",
    "x\xcc\x80\xcc\x81", "\xc7\x85", "\xc3\x9f", "\xef\xac\x81", "\xe2\x85\xab", "\xc2\xbd", "\xe2\x91\xa0",
    "\xd9\xa3", "\xe0\xa5\xa9", "~", "$", "+", "<=>", "^", "`", "|", "...", "!?", "\xe2\x80\x94", "\xc2\xab\xc2\xbb",
    "()", "[]", "{}", "#", "@", "_", "-", "/", "\\", "&&", "::", "->", "</s>", "<|endoftext|>", "<s>",
    "\xf0\x90\x90\x80", "\xf0\xaa\x9b\x96", "\xee\x80\x80", "\xf3\xa0\x80\x81", "a", "B", "zZ", "\xca\xb0",
    "\xc5\xbf", "\xe2\x84\xaa", "\xc4\xb0", "\x01", "\x1f", "\x7f", "\xcd\xb8", "\xe3\x80\x82", "\xef\xbc\x8c",
    "\xef\xbc\x81", "\xe2\x80\x98", "\xe0\xa5\xa4", "\xd8\x8c",
    /* invalid UTF-8: a lone continuation, cut sequences, a surrogate, an overlong '/', 0xFF */
    "\x80", "\xc3", "\xe4\xbd", "\xed\xa0\x80", "\xc0\xaf", "\xff", "\xf0\x9f\x98",
};
#define N_PIECES (sizeof pieces / sizeof pieces[0])

static size_t make_text(uint64_t *rng, char *buf, size_t cap) {
    size_t n = 0;
    while (n + 64 < cap) {
        uint32_t r = test_rand(rng) % 100;
        if (r < 8) {
            size_t k = 1 + test_rand(rng) % 40;   /* a run of spaces, some ending the text's lines */
            memset(buf + n, ' ', k);
            n += k;
        } else if (r < 12) {
            size_t k = 1 + test_rand(rng) % 12;   /* a run of digits */
            for (size_t i = 0; i < k; i++) buf[n++] = (char)('0' + test_rand(rng) % 10);
        } else {
            const char *p = pieces[test_rand(rng) % N_PIECES];
            size_t k = strlen(p);
            memcpy(buf + n, p, k);
            n += k;
        }
    }
    return n;
}

static int parse_ids(const char *s, int32_t **ids) {
    const char *lb = strrchr(s, '[');
    if (!lb) return -1;
    int n = 0, cap = 256;
    *ids = malloc((size_t)cap * sizeof **ids);
    for (const char *p = lb + 1;;) {
        while (*p == ' ' || *p == ',') p++;
        if (*p == ']') return n;
        char *e;
        long v = strtol(p, &e, 10);
        if (e == p) return -1;
        if (n == cap) *ids = realloc(*ids, (size_t)(cap *= 2) * sizeof **ids);
        (*ids)[n++] = (int32_t)v;
        p = e;
    }
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

TEST(tokenizer_matches_reference_tool) {
    REQUIRE_SHARED(dir);
#if !defined(__x86_64__)
    test_skip("the reference's tools in ../shared/ref are built for x86-64");
    return;
#endif
    /* absolute: the commands run in the temporary directory */
    char *rel = path_join(dir, "ref/bin/llama-tokenize");
    char *tool = realpath(rel, NULL);
    free(rel);
    rel = path_join(dir, "tokenizer");
    char *tdir = realpath(rel, NULL);
    free(rel);
    CHECK(tool && tdir, "the reference's llama-tokenize or the tokenizer directory is missing under %s", dir);
    const char *seed_env = getenv("QUILL_TOKENIZER_SEED");
    uint64_t rng = seed_env ? strtoull(seed_env, NULL, 0) | 1 : 0x9e3779b97f4a7c15ull;
    DIR *dp = opendir(tdir);
    CHECK(dp, "cannot open %s", tdir);
    char *names[64];
    int n_vocabs = 0;
    struct dirent *de;
    while ((de = readdir(dp)) && n_vocabs < 64) {
        size_t nl = strlen(de->d_name);
        if (nl > 5 && strcmp(de->d_name + nl - 5, ".gguf") == 0) names[n_vocabs++] = strdup(de->d_name);
    }
    closedir(dp);
    qsort(names, (size_t)n_vocabs, sizeof *names, cmp_str);

    /* One text per vocabulary, all given to the reference at once (its start-up dominates). */
    static char texts[64][6000];
    size_t lens[64];
    size_t cmd_cap = 1024 * 64 + 8192, cmd_n = 0;
    char *cmd = malloc(cmd_cap);
    cmd_n += (size_t)snprintf(cmd + cmd_n, cmd_cap - cmd_n, "cd '%s' && { ", tmp_dir());
    for (int v = 0; v < n_vocabs; v++) {
        lens[v] = make_text(&rng, texts[v], sizeof texts[v]);
        char tn[64];
        snprintf(tn, sizeof tn, "reference-text-%d.bin", v);
        char *tp = path_join(tmp_dir(), tn);
        FILE *f = fopen(tp, "wb");
        bool written = f && fwrite(texts[v], 1, lens[v], f) == lens[v];
        if (f && fclose(f) != 0) written = false;
        free(tp);
        CHECK(written, "cannot write %s in %s", tn, tmp_dir());
        cmd_n += (size_t)snprintf(cmd + cmd_n, cmd_cap - cmd_n,
                                  "('%s' -m '%s/%s' -bf %s --ids --no-bos --no-parse-special --no-escape --log-disable "
                                  ">reference-ids-%d.txt 2>/dev/null; echo $? >reference-status-%d.txt) & ",
                                  tool, tdir, names[v], tn, v, v);
    }
    snprintf(cmd + cmd_n, cmd_cap - cmd_n, "wait; }");
    char *ignored = NULL;
    run_cmd(cmd, &ignored, true);
    free(ignored);
    free(cmd);

    int compared = 0, bad = 0;
    for (int v = 0; v < n_vocabs; v++) {
        const char *text = texts[v];
        size_t len = lens[v];
        char fn[64];
        snprintf(fn, sizeof fn, "reference-ids-%d.txt", v);
        char *op = path_join(tmp_dir(), fn);
        char *out = read_file(op, NULL);
        free(op);
        int32_t *want = NULL;
        int n_want = out ? parse_ids(out, &want) : -1;
        char *vp = path_join(tdir, names[v]);
        quill_gguf *g = NULL;
        quill_tokenizer *t = NULL;
        quill_error err = {0};
        int32_t *got = NULL;
        size_t n_got = 0;
        if (n_want < 0) {
            test_fail(__FILE__, __LINE__, "%s: the reference tool gave no ids: %.200s", names[v], out ? out : "");
            bad++;
        } else if (quill_gguf_open(vp, &g, &err) || quill_tokenizer_load(g, &t, &err) ||
                   quill_tokenize(t, text, len, false, false, &got, &n_got, &err)) {
            test_fail(__FILE__, __LINE__, "%s: %s", names[v], err.message);
            bad++;
        } else {
            size_t i = 0;
            while (i < n_got && i < (size_t)n_want && got[i] == want[i]) i++;
            if (i < n_got || i < (size_t)n_want) {
                char ctx[200];
                int before = 0;
                for (size_t k = 0; k < i; k++) {   /* the text around the first difference */
                    char piece[256];
                    int pn = quill_token_to_bytes(t, got[k], true, piece, sizeof piece);
                    before += pn > 0 ? pn : 0;
                }
                int from = before > 30 ? before - 30 : 0;
                snprintf(ctx, sizeof ctx, "%.*s", (int)((size_t)from + 60 < len ? 60 : len - (size_t)from), text + from);
                test_fail(__FILE__, __LINE__,
                          "%s: %zu tokens, reference %d; first difference at token %zu (ours %d, reference %d), near "
                          "byte %d: \"%s\" (the text is %s/reference-text-%d.bin)",
                          names[v], n_got, n_want, i, i < n_got ? got[i] : -1, i < (size_t)n_want ? want[i] : -1,
                          before, ctx, tmp_dir(), v);
                bad++;
            }
            compared++;
        }
        free(got);
        free(want);
        free(out);
        quill_tokenizer_free(t);
        quill_gguf_close(g);
        free(vp);
        free(names[v]);
    }
    free(tdir);
    free(tool);
    CHECK_EQ_INT(bad, 0);
    CHECK(compared > 0, "no vocabulary found in ../shared/tokenizer");
}
