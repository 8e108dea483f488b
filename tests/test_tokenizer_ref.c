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

/* Gemma 4's tokenizer model (gemma4: BPE over SentencePiece-style text) against llama-tokenize. No
 * published vocabulary is at hand, so one is made from stories260K's: its tokens, scores and types
 * (its <0xXX> byte tokens), "\n" and "\n\n" added, and a merge for each token of two or more
 * characters at its first split into two tokens (and "\n \n"). Random texts as above, then the
 * decoding of a clean text back to itself. */
static bool gemma4_vocab(const char *src, const char *dst) {
    quill_gguf *g = NULL;
    quill_error err;
    if (quill_gguf_open(src, &g, &err)) return false;
    quill_gguf_value tokens, scores, types;
    bool ok = !quill_gguf_get_arr(g, "tokenizer.ggml.tokens", &tokens, &err) &&
              !quill_gguf_get_arr(g, "tokenizer.ggml.scores", &scores, &err) &&
              !quill_gguf_get_arr(g, "tokenizer.ggml.token_type", &types, &err) && tokens.count < 4000;
    const size_t n = ok ? (size_t)tokens.count : 0, total = n + 2;
    char **text = calloc(total, sizeof *text), **merges = calloc(total + 1, sizeof *merges);
    size_t *len = calloc(total, sizeof *len);
    float *score = calloc(total, sizeof *score);
    int32_t *type = calloc(total, sizeof *type);
    ok = ok && text && merges && len && score && type;
    uint64_t ct = 0, cs = 0, cy = 0;
    quill_gguf_value e;
    for (size_t i = 0; ok && i < n; i++) {
        ok = quill_gguf_array_next(&tokens, &ct, &e);
        text[i] = ok ? strndup((const char *)e.data, (size_t)e.count) : NULL;
        len[i] = ok ? (size_t)e.count : 0;
        double v;
        int64_t y;
        ok = ok && text[i] && quill_gguf_array_next(&scores, &cs, &e) && quill_gguf_value_f64(&e, &v) &&
             quill_gguf_array_next(&types, &cy, &e) && quill_gguf_value_i64(&e, &y);
        score[i] = ok ? (float)v : 0;
        type[i] = ok ? (int32_t)y : 0;
    }
    if (ok) {
        text[n] = strdup("\n"), len[n] = 1, type[n] = 1;
        text[n + 1] = strdup("\n\n"), len[n + 1] = 2, type[n + 1] = 1;
    }
    size_t n_merges = 0;
    for (size_t i = 0; ok && i < total; i++) {
        if (type[i] != 1) continue;
        for (size_t k = 1; k < len[i]; k++) {
            if (((unsigned char)text[i][k] & 0xC0) == 0x80) continue; /* inside a character */
            bool left = false, right = false;
            for (size_t j = 0; j < total; j++) {
                left |= len[j] == k && !memcmp(text[j], text[i], k);
                right |= len[j] == len[i] - k && !memcmp(text[j], text[i] + k, len[i] - k);
            }
            if (left && right) {
                merges[n_merges] = malloc(len[i] + 2);
                memcpy(merges[n_merges], text[i], k);
                merges[n_merges][k] = ' ';
                memcpy(merges[n_merges] + k + 1, text[i] + k, len[i] - k + 1);
                n_merges++;
                break;
            }
        }
    }
    quill_gguf_writer *w = ok ? quill_gguf_writer_new() : NULL;
    ok = w && !quill_gguf_writer_add_str(w, "general.architecture", "gemma4", 6) &&
         !quill_gguf_writer_add_str(w, "tokenizer.ggml.model", "gemma4", 6) &&
         !quill_gguf_writer_add_str_arr(w, "tokenizer.ggml.tokens", (const char *const *)text, len, total) &&
         !quill_gguf_writer_add_arr(w, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, score, total) &&
         !quill_gguf_writer_add_arr(w, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, type, total) &&
         !quill_gguf_writer_add_str_arr(w, "tokenizer.ggml.merges", (const char *const *)merges, NULL, n_merges) &&
         !quill_gguf_writer_add_u32(w, "tokenizer.ggml.bos_token_id", 1) &&
         !quill_gguf_writer_add_u32(w, "tokenizer.ggml.eos_token_id", 2) &&
         !quill_gguf_writer_add_bool(w, "tokenizer.ggml.add_space_prefix", false) &&
         !quill_gguf_writer_write(w, dst, &err);
    quill_gguf_writer_free(w);
    for (size_t i = 0; text && i < total; i++) free(text[i]);
    for (size_t i = 0; merges && i < n_merges; i++) free(merges[i]);
    free(text), free(merges), free(len), free(score), free(type);
    quill_gguf_close(g);
    return ok && n_merges > 100;
}

TEST(tokenizer_gemma4_matches_reference_tool) {
    REQUIRE_SHARED(dir);
#if !defined(__x86_64__)
    test_skip("the reference's tools in ../shared/ref are built for x86-64");
    return;
#endif
    char *src = path_join(dir, "models/stories260K.gguf"), *rel = path_join(dir, "ref/bin/llama-tokenize");
    char *tool = realpath(rel, NULL), *vocab = path_join(tmp_dir(), "gemma4-vocab.gguf");
    CHECK(tool && gemma4_vocab(src, vocab), "cannot make the gemma4 vocabulary from %s (or no llama-tokenize)", src);
    quill_gguf *g = NULL;
    quill_tokenizer *t = NULL;
    quill_error err = {0};
    CHECK(!quill_gguf_open(vocab, &g, &err) && !quill_tokenizer_load(g, &t, &err), "%s", err.message);
    CHECK(!t || quill_tokenizer_add_bos(t), "gemma4 always adds BOS");
    uint64_t rng = 0x6e6d6134ull;
    for (int round = 0; t && round < 4; round++) {
        static char text[6000];
        size_t n = make_text(&rng, text, sizeof text);
        char *tp = path_join(tmp_dir(), "gemma4-text.bin"), cmd[2048], *out = NULL;
        FILE *f = fopen(tp, "wb");
        CHECK(f && fwrite(text, 1, n, f) == n && fclose(f) == 0, "cannot write %s", tp);
        snprintf(cmd, sizeof cmd, "'%s' -m '%s' -bf '%s' --ids --no-bos --no-parse-special --no-escape --log-disable 2>/dev/null",
                 tool, vocab, tp);
        run_cmd(cmd, &out, false);
        int32_t *want = NULL, *got = NULL;
        size_t n_got = 0;
        const int n_want = out ? parse_ids(out, &want) : -1;
        CHECK(n_want > 0, "llama-tokenize gave no ids: %.200s", out ? out : "");
        CHECK(!quill_tokenize(t, text, n, false, false, &got, &n_got, &err), "%s", err.message);
        size_t i = 0;
        while (i < n_got && i < (size_t)n_want && got[i] == want[i]) i++;
        CHECK(n_want > 0 && i == n_got && i == (size_t)n_want,
              "round %d: %zu tokens, reference %d; first difference at token %zu (ours %d, reference %d)", round, n_got,
              n_want, i, i < n_got ? got[i] : -1, n_want > 0 && i < (size_t)n_want ? want[i] : -1);
        free(want), free(got), free(out), free(tp);
    }
    const char clean[] = "Once upon a time,  there was\n\n\na little dog \xf0\x9f\x90\xb6 named Tom.\n";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    if (t && !quill_tokenize(t, clean, sizeof clean - 1, false, false, &ids, &n_ids, &err)) {
        char back[256] = "";
        size_t at = 0;
        for (size_t i = 0; i < n_ids; i++) {
            const int k = quill_token_to_bytes(t, ids[i], false, back + at, sizeof back - 1 - at);
            at += k > 0 ? (size_t)k : 0;
        }
        back[at] = 0;
        CHECK(!strcmp(back, clean), "the clean text decodes to \"%s\"", back);
    }
    free(ids);
    quill_tokenizer_free(t);
    quill_gguf_close(g);
    remove(vocab);
    free(src), free(rel), free(tool), free(vocab);
}
