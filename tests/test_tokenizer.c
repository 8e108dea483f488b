/* Tokenizer tests: the reference's own vocabulary test strings, the prompts of the golden cases,
 * decoding and streaming, and small hand-built vocabularies (GGUF bytes made here, so hostile
 * layouts can be expressed) for the rules and the error paths. */
#include "quill.h"
#include "test.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SP "\xe2\x96\x81"   /* U+2581, SentencePiece's visible space */

/* ---------------------------------------------------------------- GGUF bytes in memory */

typedef struct {
    uint8_t *p;
    size_t n, cap;
    uint64_t n_kv;
} gbuf;

static void gb_bytes(gbuf *b, const void *d, size_t n) {
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1024;
        while (cap < b->n + n) cap *= 2;
        b->p = realloc(b->p, cap);
        if (!b->p) abort();
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, d, n);
    b->n += n;
}
static void gb_u32(gbuf *b, uint32_t v) { gb_bytes(b, &v, 4); }
static void gb_u64(gbuf *b, uint64_t v) { gb_bytes(b, &v, 8); }
static void gb_strn(gbuf *b, const char *s, size_t n) { gb_u64(b, n); gb_bytes(b, s, n); }
static void gb_key(gbuf *b, const char *key, uint32_t type) {
    gb_strn(b, key, strlen(key));
    gb_u32(b, type);
    b->n_kv++;
}
static void kv_str(gbuf *b, const char *key, const char *s) { gb_key(b, key, QUILL_GGUF_STRING); gb_strn(b, s, strlen(s)); }
static void kv_u32(gbuf *b, const char *key, uint32_t v) { gb_key(b, key, QUILL_GGUF_UINT32); gb_u32(b, v); }
static void kv_i32(gbuf *b, const char *key, int32_t v) { gb_key(b, key, QUILL_GGUF_INT32); gb_bytes(b, &v, 4); }
static void kv_bool(gbuf *b, const char *key, bool v) { uint8_t x = v; gb_key(b, key, QUILL_GGUF_BOOL); gb_bytes(b, &x, 1); }
static void kv_arr_hdr(gbuf *b, const char *key, uint32_t elem, uint64_t n) {
    gb_key(b, key, QUILL_GGUF_ARRAY);
    gb_u32(b, elem);
    gb_u64(b, n);
}

/* The finished file: header, the metadata gathered in `b`, padding; no tensors. */
static uint8_t *gb_finish(gbuf *b, size_t *size) {
    gbuf f = {0};
    gb_bytes(&f, "GGUF", 4);
    gb_u32(&f, 3);
    gb_u64(&f, 0);
    gb_u64(&f, b->n_kv);
    gb_bytes(&f, b->p, b->n);
    static const uint8_t zeros[32];
    gb_bytes(&f, zeros, (32 - f.n % 32) % 32);
    free(b->p);
    *b = (gbuf){0};
    *size = f.n;
    return f.p;
}

/* A small vocabulary: <unk> <s> </s>, the 256 byte tokens (ids 3..258), then `extra`. */
typedef struct {
    const char *text;
    float score;
    int type;
} tokspec;

enum { BYTE0 = 3, FIRST_EXTRA = 259 };

static int vocab_size(int n_extra, bool bytes) { return 3 + (bytes ? 256 : 0) + n_extra; }

static void add_vocab(gbuf *b, const tokspec *extra, int n_extra, bool bytes) {
    int n = vocab_size(n_extra, bytes);
    char byte_text[256][7];
    kv_arr_hdr(b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, (uint64_t)n);
    gb_strn(b, "<unk>", 5);
    gb_strn(b, "<s>", 3);
    gb_strn(b, "</s>", 4);
    if (bytes)
        for (int i = 0; i < 256; i++) {
            snprintf(byte_text[i], sizeof byte_text[i], "<0x%02X>", i);
            gb_strn(b, byte_text[i], 6);
        }
    for (int i = 0; i < n_extra; i++) gb_strn(b, extra[i].text, strlen(extra[i].text));
    kv_arr_hdr(b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, (uint64_t)n);
    float z = 0;
    for (int i = 0; i < 3 + (bytes ? 256 : 0); i++) gb_bytes(b, &z, 4);
    for (int i = 0; i < n_extra; i++) gb_bytes(b, &extra[i].score, 4);
    kv_arr_hdr(b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, (uint64_t)n);
    int32_t ty[3] = {QUILL_TOKEN_UNKNOWN, QUILL_TOKEN_CONTROL, QUILL_TOKEN_CONTROL};
    gb_bytes(b, ty, sizeof ty);
    int32_t byte_type = QUILL_TOKEN_BYTE;
    if (bytes)
        for (int i = 0; i < 256; i++) gb_bytes(b, &byte_type, 4);
    for (int i = 0; i < n_extra; i++) {
        int32_t t = extra[i].type ? extra[i].type : QUILL_TOKEN_NORMAL;
        gb_bytes(b, &t, 4);
    }
}

/* Owns the bytes, the GGUF view and the tokenizer of one in-memory vocabulary. */
typedef struct {
    uint8_t *bytes;
    quill_gguf *g;
    quill_tokenizer *t;
    quill_error err;
    quill_status status;
} memtok;

static memtok mt_load(gbuf *b) {
    memtok m = {0};
    size_t size;
    m.bytes = gb_finish(b, &size);
    m.status = quill_gguf_open_memory(m.bytes, size, "mem.gguf", &m.g, &m.err);
    if (m.status == QUILL_OK) m.status = quill_tokenizer_load(m.g, &m.t, &m.err);
    return m;
}

static void mt_free(memtok *m) {
    quill_tokenizer_free(m->t);
    quill_gguf_close(m->g);
    free(m->bytes);
}

/* Tokenizes and compares with `want` (n ids); returns false and reports on mismatch. */
static bool tok_eq(const quill_tokenizer *t, const char *text, size_t len, bool add_special, bool parse_special,
                   const int32_t *want, size_t n, int line) {
    int32_t *ids = NULL;
    size_t n_ids = 0;
    quill_error err = {0};
    quill_status s = quill_tokenize(t, text, len, add_special, parse_special, &ids, &n_ids, &err);
    if (s != QUILL_OK) {
        test_fail(__FILE__, line, "tokenize failed: %s", err.message);
        return false;
    }
    bool ok = n_ids == n && (n == 0 || memcmp(ids, want, n * sizeof *ids) == 0);
    if (!ok) {
        char got[1024] = "", exp[1024] = "";
        for (size_t i = 0; i < n_ids && strlen(got) < 1000; i++)
            snprintf(got + strlen(got), sizeof got - strlen(got), " %d", ids[i]);
        for (size_t i = 0; i < n && strlen(exp) < 1000; i++)
            snprintf(exp + strlen(exp), sizeof exp - strlen(exp), " %d", want[i]);
        test_fail(__FILE__, line, "tokens of \"%.*s\":%s, expected%s", (int)(len > 60 ? 60 : len), text, got, exp);
    }
    free(ids);
    return ok;
}

#define TOK_EQ(t, text, add, parse, ...)                                                       \
    do {                                                                                       \
        const int32_t want_[] = {__VA_ARGS__};                                                 \
        if (!tok_eq(t, text, strlen(text), add, parse, want_, sizeof want_ / sizeof want_[0], __LINE__)) return; \
    } while (0)
#define TOK_EMPTY(t, text, add, parse)                                                         \
    do { if (!tok_eq(t, text, strlen(text), add, parse, NULL, 0, __LINE__)) return; } while (0)

/* ---------------------------------------------------------------- the reference vocabulary */

static quill_gguf *vocab_gguf;
static quill_tokenizer *vocab_tok;

/* The 32000-token Llama 2 vocabulary, loaded once for the tests that use it (never freed: the
 * process ends with the run). */
static const quill_tokenizer *llama_vocab(void) {
    if (vocab_tok) return vocab_tok;
    const char *dir = shared_dir();
    if (!dir) return NULL;
    char *path = path_join(dir, "tokenizer/ggml-vocab-llama-spm.gguf");
    quill_error err = {0};
    if (quill_gguf_open(path, &vocab_gguf, &err) != QUILL_OK ||
        quill_tokenizer_load(vocab_gguf, &vocab_tok, &err) != QUILL_OK)
        test_fail(__FILE__, __LINE__, "loading %s: %s", path, err.message);
    free(path);
    return vocab_tok;
}

#define REQUIRE_VOCAB(t)                                                                       \
    const quill_tokenizer *t = llama_vocab();                                                  \
    if (!t) return

TEST(tokenizer_llama_vocab_load) {
    REQUIRE_SHARED(dir);
    char *path = path_join(dir, "tokenizer/ggml-vocab-llama-spm.gguf");
    quill_gguf *g = NULL;
    quill_tokenizer *t = NULL;
    quill_error err = {0};
    CHECK(quill_gguf_open(path, &g, &err) == QUILL_OK, "%s", err.message);
    free(path);
    quill_status s = quill_tokenizer_load(g, &t, &err);
    CHECK(s == QUILL_OK, "%s", err.message);
    CHECK_EQ_INT(quill_tokenizer_n_vocab(t), 32000);
    CHECK_EQ_INT(quill_tokenizer_bos(t), 1);
    CHECK_EQ_INT(quill_tokenizer_eos(t), 2);
    CHECK(quill_tokenizer_add_bos(t));
    CHECK(!quill_tokenizer_add_eos(t));
    CHECK(strcmp(quill_tokenizer_piece(t, 0), "<unk>") == 0);
    CHECK(strcmp(quill_tokenizer_piece(t, 13), "<0x0A>") == 0);
    CHECK(strcmp(quill_tokenizer_piece(t, 15043), SP "Hello") == 0);
    CHECK(quill_tokenizer_piece(t, 32000) == NULL);
    CHECK(quill_tokenizer_piece(t, -1) == NULL);
    CHECK_EQ_INT(quill_tokenizer_token_type(t, 0), QUILL_TOKEN_UNKNOWN);
    CHECK_EQ_INT(quill_tokenizer_token_type(t, 1), QUILL_TOKEN_CONTROL);
    CHECK_EQ_INT(quill_tokenizer_token_type(t, 13), QUILL_TOKEN_BYTE);
    CHECK_EQ_INT(quill_tokenizer_token_type(t, 15043), QUILL_TOKEN_NORMAL);
    CHECK_EQ_INT(quill_tokenizer_token_type(t, 32000), -1);
    CHECK(quill_tokenizer_is_eog(t, 2));
    CHECK(!quill_tokenizer_is_eog(t, 1));
    CHECK(!quill_tokenizer_is_eog(t, 0));
    CHECK(!quill_tokenizer_is_eog(t, -1));
    CHECK(!quill_tokenizer_is_eog(t, 32000));
    quill_tokenizer_free(t);
    quill_gguf_close(g);
}

/* Splits the .inp file on its separator line. */
static int read_vocab_tests_of(const char *dir, const char *vocab, char ***texts, size_t **lens, char ***expected) {
    char name[512];
    snprintf(name, sizeof name, "tokenizer/%s.inp", vocab);
    char *ip = path_join(dir, name);
    snprintf(name, sizeof name, "tokenizer/%s.out", vocab);
    char *op = path_join(dir, name);
    size_t in_size = 0, out_size = 0;
    char *in = read_file(ip, &in_size), *out = read_file(op, &out_size);
    free(ip);
    free(op);
    if (!in || !out) { free(in); free(out); return -1; }
    static const char sep[] = "\n__ggml_vocab_test__\n";
    int n = 0;
    *texts = NULL;
    *lens = NULL;
    *expected = NULL;
    char *p = in, *end = in + in_size, *q = out;
    while (p < end) {
        char *m = NULL;
        for (char *s = p; s + sizeof sep - 1 <= end; s++)
            if (memcmp(s, sep, sizeof sep - 1) == 0) { m = s; break; }
        if (!m) break;
        char *nl = strchr(q, '\n');
        if (!nl) break;
        *texts = realloc(*texts, (size_t)(n + 1) * sizeof **texts);
        *lens = realloc(*lens, (size_t)(n + 1) * sizeof **lens);
        *expected = realloc(*expected, (size_t)(n + 1) * sizeof **expected);
        (*lens)[n] = (size_t)(m - p);
        (*texts)[n] = malloc((*lens)[n] + 1);
        memcpy((*texts)[n], p, (*lens)[n]);
        (*texts)[n][(*lens)[n]] = 0;
        (*expected)[n] = strndup(q, (size_t)(nl - q));
        n++;
        p = m + sizeof sep - 1;
        q = nl + 1;
    }
    free(in);
    free(out);
    return n;
}

static int read_vocab_tests(const char *dir, char ***texts, size_t **lens, char ***expected) {
    return read_vocab_tests_of(dir, "ggml-vocab-llama-spm.gguf", texts, lens, expected);
}

static void free_vocab_tests(int n, char **texts, size_t *lens, char **expected) {
    for (int i = 0; i < n; i++) { free(texts[i]); free(expected[i]); }
    free(texts);
    free(lens);
    free(expected);
}

TEST(tokenizer_reference_strings) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    char **texts, **expected;
    size_t *lens;
    int n = read_vocab_tests(dir, &texts, &lens, &expected);
    CHECK_EQ_INT(n, 46);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t want[512];
        size_t nw = 0;
        for (char *s = expected[i], *e; nw < 512; s = e) {
            long v = strtol(s, &e, 10);
            if (e == s) break;
            want[nw++] = (int32_t)v;
        }
        if (!tok_eq(t, texts[i], lens[i], false, false, want, nw, __LINE__)) bad++;
    }
    free_vocab_tests(n, texts, lens, expected);
    CHECK_EQ_INT(bad, 0);
}

/* Decoding what was encoded gives the text back: the streaming detokenizer removes exactly the
 * one space the tokenizer put in front. */
TEST(tokenizer_reference_strings_round_trip) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    char **texts, **expected;
    size_t *lens;
    int n = read_vocab_tests(dir, &texts, &lens, &expected);
    CHECK_EQ_INT(n, 46);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (quill_tokenize(t, texts[i], lens[i], false, false, &ids, &n_ids, NULL) != QUILL_OK) { bad++; continue; }
        quill_detokenizer d;
        quill_detokenizer_init(&d, t, false, true);
        char *buf = malloc(lens[i] + 512);
        size_t len = 0;
        for (size_t k = 0; k < n_ids; k++) len += quill_detokenizer_push(&d, ids[k], buf + len, 256);
        len += quill_detokenizer_flush(&d, buf + len, 256);
        if (len != lens[i] || memcmp(buf, texts[i], len) != 0) {
            test_fail(__FILE__, __LINE__, "string %d: decoded \"%.*s\", expected \"%s\"", i, (int)len, buf, texts[i]);
            bad++;
        }
        free(buf);
        free(ids);
    }
    free_vocab_tests(n, texts, lens, expected);
    CHECK_EQ_INT(bad, 0);
}

/* Every vocabulary in ../shared/tokenizer with the reference's vectors (X.gguf.inp / .out), SPM
 * and BPE alike: ids without BOS, special-token parsing off; and the ids decode back to the text.
 * Fails when no pair is found, so a moved directory cannot pass unnoticed. */
TEST(tokenizer_all_shared_vectors) {
    REQUIRE_SHARED(dir);
    char *tdir = path_join(dir, "tokenizer");
    DIR *dp = opendir(tdir);
    CHECK(dp, "cannot open %s", tdir);
    int vocabs = 0, strings = 0, bad = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t nl = strlen(de->d_name);
        if (nl < 10 || strcmp(de->d_name + nl - 9, ".gguf.inp") != 0) continue;
        char vocab[256];
        snprintf(vocab, sizeof vocab, "%.*s", (int)(nl - 4), de->d_name);
        char **texts, **expected;
        size_t *lens;
        int n = read_vocab_tests_of(dir, vocab, &texts, &lens, &expected);
        if (n <= 0) {
            test_fail(__FILE__, __LINE__, "%s: no test strings (or no .out file)", vocab);
            bad++;
            continue;
        }
        char *vp = path_join(tdir, vocab);
        quill_gguf *g = NULL;
        quill_tokenizer *t = NULL;
        quill_error err = {0};
        if (quill_gguf_open(vp, &g, &err) != QUILL_OK || quill_tokenizer_load(g, &t, &err) != QUILL_OK) {
            test_fail(__FILE__, __LINE__, "%s: %s", vocab, err.message);
            bad++;
        } else {
            vocabs++;
            int wrong = 0;
            for (int i = 0; i < n; i++) {
                int32_t want[1024];
                size_t nw = 0;
                for (char *p = expected[i], *e; nw < 1024; p = e) {
                    long v = strtol(p, &e, 10);
                    if (e == p) break;
                    want[nw++] = (int32_t)v;
                }
                strings++;
                if (!tok_eq(t, texts[i], lens[i], false, false, want, nw, __LINE__)) {
                    test_fail(__FILE__, __LINE__, "  string %d of %s", i, vocab);
                    wrong++;
                    continue;
                }
                /* the way back: the same text (byte-level BPE keeps every byte; SPM drops the one
                 * space it added) */
                quill_detokenizer d;
                quill_detokenizer_init(&d, t, false, true);
                size_t cap = lens[i] * 3 + 1024, len = 0;
                char *buf = malloc(cap);
                for (size_t k = 0; k < nw; k++) len += quill_detokenizer_push(&d, want[k], buf + len, cap - len);
                len += quill_detokenizer_flush(&d, buf + len, cap - len);
                if (len != lens[i] || memcmp(buf, texts[i], len) != 0) {
                    test_fail(__FILE__, __LINE__, "%s string %d: decoded \"%.*s\", expected \"%s\"", vocab, i,
                              (int)len, buf, texts[i]);
                    wrong++;
                }
                free(buf);
            }
            bad += wrong;
        }
        free(vp);
        quill_tokenizer_free(t);
        quill_gguf_close(g);
        free_vocab_tests(n, texts, lens, expected);
    }
    closedir(dp);
    free(tdir);
    CHECK_EQ_INT(bad, 0);
    CHECK(vocabs > 0 && strings > 0, "no vocabulary test vectors found in %s/tokenizer", dir);
}

/* ---------------------------------------------------------------- golden prompts */

TEST(tokenizer_golden_prompts) {
    REQUIRE_SHARED(dir);
    char *gdir = path_join(dir, "golden");
    DIR *dp = opendir(gdir);
    CHECK(dp, "cannot open %s", gdir);
    int checked = 0, bad = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t nl = strlen(de->d_name);
        if (nl < 6 || strcmp(de->d_name + nl - 5, ".json") != 0) continue;
        char *jp = path_join(gdir, de->d_name);
        char *js = read_file(jp, NULL);
        free(jp);
        cJSON *j = js ? cJSON_Parse(js) : NULL;
        free(js);
        if (!j) { test_fail(__FILE__, __LINE__, "%s: unreadable JSON", de->d_name); bad++; continue; }
        const cJSON *prompt = cJSON_GetObjectItem(j, "prompt"), *model = cJSON_GetObjectItem(j, "model");
        const cJSON *toks = cJSON_GetObjectItem(j, "prompt_tokens");
        if (!cJSON_IsString(prompt) || !prompt->valuestring[0] || !cJSON_IsString(model) || !cJSON_IsArray(toks)) {
            cJSON_Delete(j);
            continue;   /* made from token ids, not from a prompt */
        }
        bool add_bos = cJSON_IsTrue(cJSON_GetObjectItem(j, "add_bos"));
        bool parse_special = cJSON_IsTrue(cJSON_GetObjectItem(j, "parse_special"));
        char *mdir = path_join(dir, "models");
        char *mp = path_join(mdir, model->valuestring);
        free(mdir);
        quill_gguf *g = NULL;
        quill_tokenizer *t = NULL;
        quill_error err = {0};
        if (quill_gguf_open(mp, &g, &err) != QUILL_OK || quill_tokenizer_load(g, &t, &err) != QUILL_OK) {
            test_fail(__FILE__, __LINE__, "%s: %s", de->d_name, err.message);
            bad++;
        } else {
            int n = cJSON_GetArraySize(toks);
            int32_t *want = malloc((size_t)(n ? n : 1) * sizeof *want);
            for (int i = 0; i < n; i++) want[i] = (int32_t)cJSON_GetArrayItem(toks, i)->valuedouble;
            /* add_bos records whether BOS was added; these models all ask for it. */
            if (add_bos != quill_tokenizer_add_bos(t)) {
                test_fail(__FILE__, __LINE__, "%s: add_bos %d but the model says %d", de->d_name, add_bos,
                          quill_tokenizer_add_bos(t));
                bad++;
            } else if (!tok_eq(t, prompt->valuestring, strlen(prompt->valuestring), add_bos, parse_special, want,
                               (size_t)n, __LINE__)) {
                test_fail(__FILE__, __LINE__, "  in %s", de->d_name);
                bad++;
            }
            checked++;
            free(want);
        }
        free(mp);
        quill_tokenizer_free(t);
        quill_gguf_close(g);
        cJSON_Delete(j);
    }
    closedir(dp);
    free(gdir);
    CHECK_EQ_INT(bad, 0);
    CHECK(checked >= 20, "only %d golden prompts found", checked);
}

/* The reference's rendering of each greedy continuation (invalid UTF-8 as U+FFFD) is what the
 * streaming detokenizer produces for the continuation (no leading-space strip: it does not start
 * the text). */
TEST(tokenizer_golden_greedy_text) {
    REQUIRE_SHARED(dir);
    char *gdir = path_join(dir, "golden");
    DIR *dp = opendir(gdir);
    CHECK(dp, "cannot open %s", gdir);
    int checked = 0, bad = 0;
    struct dirent *de;
    while ((de = readdir(dp))) {
        size_t nl = strlen(de->d_name);
        if (nl < 6 || strcmp(de->d_name + nl - 5, ".json") != 0) continue;
        char *jp = path_join(gdir, de->d_name);
        char *js = read_file(jp, NULL);
        free(jp);
        cJSON *j = js ? cJSON_Parse(js) : NULL;
        free(js);
        const cJSON *model = j ? cJSON_GetObjectItem(j, "model") : NULL;
        const cJSON *toks = j ? cJSON_GetObjectItem(j, "greedy_tokens") : NULL;
        const cJSON *text = j ? cJSON_GetObjectItem(j, "greedy_text") : NULL;
        if (!cJSON_IsString(model) || !cJSON_IsArray(toks) || !cJSON_IsString(text)) {
            test_fail(__FILE__, __LINE__, "%s: no model, greedy_tokens or greedy_text", de->d_name);
            bad++;
            cJSON_Delete(j);
            continue;
        }
        char *mdir = path_join(dir, "models");
        char *mp = path_join(mdir, model->valuestring);
        free(mdir);
        quill_gguf *g = NULL;
        quill_tokenizer *t = NULL;
        quill_error err = {0};
        if (quill_gguf_open(mp, &g, &err) != QUILL_OK || quill_tokenizer_load(g, &t, &err) != QUILL_OK) {
            test_fail(__FILE__, __LINE__, "%s: %s", de->d_name, err.message);
            bad++;
        } else {
            int n = cJSON_GetArraySize(toks);
            char *out = malloc((size_t)n * 256 + 256);
            size_t len = 0;
            quill_detokenizer d;
            quill_detokenizer_init(&d, t, false, false);
            for (int i = 0; i < n; i++)
                len += quill_detokenizer_push(&d, (int32_t)cJSON_GetArrayItem(toks, i)->valuedouble, out + len, 256);
            len += quill_detokenizer_flush(&d, out + len, 256);
            if (len != strlen(text->valuestring) || memcmp(out, text->valuestring, len) != 0) {
                test_fail(__FILE__, __LINE__, "%s: decoded \"%.*s\", expected \"%s\"", de->d_name, (int)len, out,
                          text->valuestring);
                bad++;
            }
            checked++;
            free(out);
        }
        free(mp);
        quill_tokenizer_free(t);
        quill_gguf_close(g);
        cJSON_Delete(j);
    }
    closedir(dp);
    free(gdir);
    CHECK_EQ_INT(bad, 0);
    CHECK(checked >= 20, "only %d golden cases found", checked);
}

/* ---------------------------------------------------------------- encoding rules on the real vocab */

TEST(tokenizer_llama_special_and_newlines) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    (void)dir;
    /* Only ' ' becomes U+2581; a newline stays a byte token. */
    TOK_EQ(t, "\n", false, false, 29871, 13);
    TOK_EQ(t, "Hello world\n", true, false, 1, 15043, 3186, 13);
    /* Empty text: [] without and [BOS] with special tokens, as the original tokenizer. */
    TOK_EMPTY(t, "", false, false);
    TOK_EQ(t, "", true, false, 1);
    /* Control tokens are only parsed on request; a text fragment after one gets a space prefix. */
    TOK_EQ(t, "</s>", false, true, 2);
    TOK_EQ(t, "a</s>b", false, true, 263, 2, 289);
    TOK_EQ(t, "<s></s>", false, true, 1, 2);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(quill_tokenize(t, "</s>", 4, false, false, &ids, &n, NULL) == QUILL_OK);
    CHECK(n > 1 && ids[0] != 2);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] != 2);
    free(ids);
    /* Bytes inside the text, including NUL, go through byte fallback. */
    const int32_t want_nul[] = {29871, 3, 29874};
    CHECK(tok_eq(t, "\0a", 2, false, false, want_nul, 3, __LINE__));
    /* NULL text with length 0 is the empty text. */
    CHECK(quill_tokenize(t, NULL, 0, true, false, &ids, &n, NULL) == QUILL_OK);
    CHECK(ids && n == 1 && ids[0] == 1);
    free(ids);
    quill_error err = {0};
    CHECK(quill_tokenize(t, NULL, 3, true, false, &ids, &n, &err) == QUILL_E_ARG);
    CHECK(quill_tokenize(NULL, "a", 1, true, false, &ids, &n, &err) == QUILL_E_ARG);
}

/* Random bytes never crash the tokenizer, and the tokens are a segmentation of the escaped text
 * ("▁" + text with each ' ' as "▁"). Decoding is not always the identity: a stray UTF-8 lead
 * byte swallows the first byte of a following "▁", which then comes back as raw bytes, exactly
 * as in the reference. */
TEST(tokenizer_llama_random_bytes) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    (void)dir;
    uint64_t x = 0x9e3779b97f4a7c15ull;
    char text[300], esc[1000], back[2000];
    for (int round = 0; round < 300; round++) {
        size_t len = (size_t)(round % 97) + 1;
        for (size_t i = 0; i < len; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            unsigned char c = (unsigned char)(x >> 24);
            if (round % 3 == 0) c = (unsigned char)("ab \n\xc3\xa9<>/s"[c % 11]);
            text[i] = (char)c;
        }
        size_t el = 0;
        memcpy(esc, SP, 3);
        el = 3;
        for (size_t i = 0; i < len; i++) {
            if (text[i] == ' ') { memcpy(esc + el, SP, 3); el += 3; }
            else esc[el++] = text[i];
        }
        int32_t *ids = NULL;
        size_t n = 0;
        quill_error err = {0};
        CHECK(quill_tokenize(t, text, len, round & 1, round & 2, &ids, &n, &err) == QUILL_OK, "%s", err.message);
        size_t bl = 0;
        bool special_inside = false;
        for (size_t i = 0; i < n; i++) {
            CHECK(ids[i] >= 0 && ids[i] < 32000);
            if ((round & 1) && i == 0) { CHECK_EQ_INT(ids[0], 1); continue; }
            special_inside |= ids[i] <= 2;
            const char *piece = quill_tokenizer_piece(t, ids[i]);
            size_t k = strlen(piece);
            if (quill_tokenizer_token_type(t, ids[i]) == QUILL_TOKEN_BYTE) {
                CHECK_EQ_INT(quill_token_to_bytes(t, ids[i], false, back + bl, 1), 1);
                k = 1;
            } else {
                CHECK(bl + k < sizeof back);
                memcpy(back + bl, piece, k);
            }
            bl += k;
        }
        free(ids);
        /* A special token parsed out of the text puts a space prefix on what follows it. */
        if (special_inside) continue;
        CHECK(bl == el && memcmp(back, esc, el) == 0, "round %d: %zu bytes, expected %zu", round, bl, el);
    }
}

/* Merging word by word (the fast path, valid for SentencePiece vocabularies) gives exactly what
 * merging whole fragments gives. The same vocabulary plus a piece "x▁y" turns the fast path off
 * yet tokenizes any text without an 'x' the same way, so the two must agree on such texts. */
TEST(tokenizer_word_split_matches_whole_fragment) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    const quill_gguf_value *toks = quill_gguf_find(vocab_gguf, "tokenizer.ggml.tokens");
    const quill_gguf_value *scores = quill_gguf_find(vocab_gguf, "tokenizer.ggml.scores");
    const quill_gguf_value *types = quill_gguf_find(vocab_gguf, "tokenizer.ggml.token_type");
    CHECK(toks && scores && types);
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_arr_hdr(&b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, toks->count + 1);
    uint64_t cur = 0;
    quill_gguf_value e;
    while (quill_gguf_array_next(toks, &cur, &e)) gb_strn(&b, (const char *)e.data, (size_t)e.count);
    gb_strn(&b, "x" SP "y", 5);
    kv_arr_hdr(&b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, scores->count + 1);
    gb_bytes(&b, scores->data, (size_t)scores->count * 4);
    float sc = -1;
    gb_bytes(&b, &sc, 4);
    kv_arr_hdr(&b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, types->count + 1);
    gb_bytes(&b, types->data, (size_t)types->count * 4);
    int32_t ty = QUILL_TOKEN_NORMAL;
    gb_bytes(&b, &ty, 4);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);

    static const char *const parts[] = {
        " ", "  ", "   ", "\n", "\t", "the", "Hello", "world", "333", ",", ".", "'s", "\xc3\xa9", "\xe2\x82\xac",
        SP, SP SP, "\xc3", "\xe2", "\xe2\x96", "\x96\x81", "\xf0\x9f\xa6\x99", "</s>", "<s>", "\xff", "ab", "ba",
    };
    const size_t n_parts = sizeof parts / sizeof parts[0];
    uint64_t x = 0x2545f4914f6cdd1dull;
    int compared = 0;
    for (int round = 0; round < 2000; round++) {
        char text[512];
        size_t len = 0;
        int n_words = 1 + (int)(round % 40);
        for (int w = 0; w < n_words; w++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            const char *p = parts[x % n_parts];
            size_t pl = strlen(p);
            if (len + pl >= sizeof text) break;
            memcpy(text + len, p, pl);
            len += pl;
        }
        bool parse = round & 1;
        int32_t *a = NULL, *c = NULL;
        size_t na = 0, nc = 0;
        CHECK(quill_tokenize(t, text, len, false, parse, &a, &na, NULL) == QUILL_OK);
        CHECK(quill_tokenize(m.t, text, len, false, parse, &c, &nc, NULL) == QUILL_OK);
        bool same = na == nc && memcmp(a, c, na * sizeof *a) == 0;
        free(a);
        free(c);
        CHECK(same, "round %d: \"%.*s\" tokenizes differently word by word", round, (int)len, text);
        compared++;
    }
    char **texts, **expected;
    size_t *lens;
    int n = read_vocab_tests(dir, &texts, &lens, &expected);
    for (int i = 0; i < n; i++) {
        if (memchr(texts[i], 'x', lens[i])) continue;
        int32_t *a = NULL, *c = NULL;
        size_t na = 0, nc = 0;
        quill_tokenize(t, texts[i], lens[i], false, false, &a, &na, NULL);
        quill_tokenize(m.t, texts[i], lens[i], false, false, &c, &nc, NULL);
        bool same = a && c && na == nc && memcmp(a, c, na * sizeof *a) == 0;
        free(a);
        free(c);
        if (!same) test_fail(__FILE__, __LINE__, "reference string %d differs", i);
        compared++;
    }
    free_vocab_tests(n, texts, lens, expected);
    mt_free(&m);
    CHECK(compared > 2000);
}

/* ---------------------------------------------------------------- decoding */

TEST(tokenizer_token_to_bytes) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    (void)dir;
    char buf[64];
    CHECK_EQ_INT(quill_token_to_bytes(t, 15043, false, buf, sizeof buf), 6);
    CHECK(memcmp(buf, " Hello", 6) == 0);
    CHECK_EQ_INT(quill_token_to_bytes(t, 13, false, buf, sizeof buf), 1);
    CHECK(buf[0] == '\n');
    CHECK_EQ_INT(quill_token_to_bytes(t, 3, false, buf, sizeof buf), 1);
    CHECK(buf[0] == 0);
    /* Control and unknown tokens are text only when asked for. */
    CHECK_EQ_INT(quill_token_to_bytes(t, 2, false, buf, sizeof buf), 0);
    CHECK_EQ_INT(quill_token_to_bytes(t, 2, true, buf, sizeof buf), 4);
    CHECK(memcmp(buf, "</s>", 4) == 0);
    CHECK_EQ_INT(quill_token_to_bytes(t, 0, false, buf, sizeof buf), 0);
    CHECK_EQ_INT(quill_token_to_bytes(t, 0, true, buf, sizeof buf), 5);
    /* Invalid ids, and a buffer too small: the full length, nothing written past cap. */
    CHECK_EQ_INT(quill_token_to_bytes(t, -1, true, buf, sizeof buf), -1);
    CHECK_EQ_INT(quill_token_to_bytes(t, 32000, true, buf, sizeof buf), -1);
    memset(buf, '#', sizeof buf);
    CHECK_EQ_INT(quill_token_to_bytes(t, 15043, false, buf, 3), 6);
    CHECK(memcmp(buf, " He###", 6) == 0);
    CHECK_EQ_INT(quill_token_to_bytes(t, 15043, false, NULL, 0), 6);
}

static size_t detok_all(const quill_tokenizer *t, const int32_t *ids, size_t n, bool render, char *out) {
    quill_detokenizer d;
    quill_detokenizer_init(&d, t, render, true);
    size_t len = 0;
    for (size_t i = 0; i < n; i++) len += quill_detokenizer_push(&d, ids[i], out + len, 256);
    len += quill_detokenizer_flush(&d, out + len, 256);
    out[len] = 0;
    return len;
}

#define BYTE_ID(b) (3 + (b))   /* <0xNN> in the Llama vocabulary */

TEST(tokenizer_detokenizer_utf8) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    (void)dir;
    quill_detokenizer d;
    char out[1024];
    /* "€" = E2 82 AC split over three byte tokens: held back until complete. */
    quill_detokenizer_init(&d, t, false, true);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 15043, out, 256), 5);   /* "Hello": leading space removed */
    CHECK(memcmp(out, "Hello", 5) == 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, BYTE_ID(0xE2), out, 256), 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, BYTE_ID(0x82), out, 256), 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, BYTE_ID(0xAC), out, 256), 3);
    CHECK(memcmp(out, "\xe2\x82\xac", 3) == 0);
    CHECK_EQ_INT(quill_detokenizer_flush(&d, out, 256), 0);
    /* A 4-byte emoji (U+1F999) from the reference strings, then a normal token. */
    const int32_t llama[] = {29871, 243, 162, 169, 156, 29889, 8223};
    CHECK_EQ_INT(detok_all(t, llama, 7, false, out), 8);
    CHECK(strcmp(out, "\xf0\x9f\xa6\x99.cpp") == 0, "got \"%s\"", out);

    /* Each invalid byte becomes one U+FFFD, as the reference renders text (a maximal-subpart
     * decoder such as Python's would give one for "E2 82"). */
    const int32_t ff[] = {BYTE_ID(0xFF), BYTE_ID('A')};
    detok_all(t, ff, 2, false, out);
    CHECK(strcmp(out, "\xef\xbf\xbd" "A") == 0);
    const int32_t cut[] = {BYTE_ID(0xE2), BYTE_ID(0x82), BYTE_ID('A')};
    detok_all(t, cut, 3, false, out);
    CHECK(strcmp(out, "\xef\xbf\xbd\xef\xbf\xbd" "A") == 0);
    const int32_t surrogate[] = {BYTE_ID(0xED), BYTE_ID(0xA0), BYTE_ID(0x80)};
    detok_all(t, surrogate, 3, false, out);
    CHECK(strcmp(out, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd") == 0);
    const int32_t overlong[] = {BYTE_ID(0xC0), BYTE_ID(0xAF)};
    detok_all(t, overlong, 2, false, out);
    CHECK(strcmp(out, "\xef\xbf\xbd\xef\xbf\xbd") == 0);
    const int32_t lead_lead[] = {BYTE_ID(0xE2), BYTE_ID(0xE2), BYTE_ID(0x82), BYTE_ID(0xAC)};
    detok_all(t, lead_lead, 4, false, out);
    CHECK(strcmp(out, "\xef\xbf\xbd\xe2\x82\xac") == 0);
    /* The ends of the code space: U+10FFFF is fine, past it is not. */
    const int32_t max_cp[] = {BYTE_ID(0xF4), BYTE_ID(0x8F), BYTE_ID(0xBF), BYTE_ID(0xBF)};
    detok_all(t, max_cp, 4, false, out);
    CHECK(strcmp(out, "\xf4\x8f\xbf\xbf") == 0);
    const int32_t past[] = {BYTE_ID(0xF4), BYTE_ID(0x90), BYTE_ID(0x80), BYTE_ID(0x80)};
    CHECK_EQ_INT(detok_all(t, past, 4, false, out), 12);
    const int32_t overlong3[] = {BYTE_ID(0xE0), BYTE_ID(0x9F), BYTE_ID(0xBF)};
    CHECK_EQ_INT(detok_all(t, overlong3, 3, false, out), 9);
    const int32_t ok3[] = {BYTE_ID(0xE0), BYTE_ID(0xA0), BYTE_ID(0x80)};
    CHECK_EQ_INT(detok_all(t, ok3, 3, false, out), 3);
    /* A held prefix survives tokens that render as nothing (control tokens). */
    const int32_t around[] = {BYTE_ID(0xC3), 2, BYTE_ID(0xA9)};
    detok_all(t, around, 3, false, out);
    CHECK(strcmp(out, "\xc3\xa9") == 0);
    /* Incomplete at the end: flush gives U+FFFD. */
    quill_detokenizer_init(&d, t, false, true);
    CHECK_EQ_INT(quill_detokenizer_push(&d, BYTE_ID(0xF0), out, 256), 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, BYTE_ID(0x9F), out, 256), 0);
    CHECK_EQ_INT(quill_detokenizer_flush(&d, out, 256), 6);
    CHECK(memcmp(out, "\xef\xbf\xbd\xef\xbf\xbd", 6) == 0);
    CHECK_EQ_INT(quill_detokenizer_flush(&d, out, 256), 0);
    /* Invalid ids produce nothing. */
    CHECK_EQ_INT(quill_detokenizer_push(&d, -5, out, 256), 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 32000, out, 256), 0);
}

TEST(tokenizer_detokenizer_space_prefix) {
    REQUIRE_SHARED(dir);
    REQUIRE_VOCAB(t);
    (void)dir;
    char out[256];
    const int32_t hw[] = {15043, 3186};
    detok_all(t, hw, 2, false, out);
    CHECK(strcmp(out, "Hello world") == 0, "got \"%s\"", out);
    /* " Hello" was tokenized as "▁" "▁Hello": one space survives. */
    const int32_t shw[] = {29871, 15043, 3186};
    detok_all(t, shw, 3, false, out);
    CHECK(strcmp(out, " Hello world") == 0, "got \"%s\"", out);
    /* As in the reference, only the very first token is stripped: after BOS the space stays. */
    const int32_t bhw[] = {1, 15043, 3186};
    detok_all(t, bhw, 3, false, out);
    CHECK(strcmp(out, " Hello world") == 0, "got \"%s\"", out);
    detok_all(t, bhw, 3, true, out);
    CHECK(strcmp(out, "<s> Hello world") == 0, "got \"%s\"", out);
    /* "\n" <-> "▁" + <0x0A>. */
    const int32_t nl[] = {29871, 13};
    detok_all(t, nl, 2, false, out);
    CHECK(strcmp(out, "\n") == 0);
    /* A caller streaming a continuation turns the strip off. */
    quill_detokenizer d;
    quill_detokenizer_init(&d, t, false, false);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 15043, out, 256), 6);
    CHECK(memcmp(out, " Hello", 6) == 0);
    /* Too small a buffer loses output but never overflows. */
    quill_detokenizer_init(&d, t, false, true);
    memset(out, '#', sizeof out);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 15043, out, 3), 3);
    CHECK(memcmp(out, "Hel#", 4) == 0);
}

/* ---------------------------------------------------------------- hand-built vocabularies */

TEST(tokenizer_merge_priority) {
    /* Scores drive the merges; equal scores merge the leftmost pair first. */
    const float cases[3][2] = {{-1, -2}, {-2, -1}, {-1, -1}};
    for (int c = 0; c < 3; c++) {
        tokspec v[] = {
            {"a", -10, 0}, {"b", -10, 0}, {"c", -10, 0}, {"ab", cases[c][0], 0}, {"bc", cases[c][1], 0},
            {SP, -10, 0}, {"abc" "x", -1, 0},
        };
        gbuf b = {0};
        kv_str(&b, "tokenizer.ggml.model", "llama");
        kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
        add_vocab(&b, v, 7, true);
        memtok m = mt_load(&b);
        CHECK(m.status == QUILL_OK, "%s", m.err.message);
        const int32_t a = FIRST_EXTRA, bb = a + 1, cc = a + 2, ab = a + 3, bc = a + 4;
        if (c == 1) TOK_EQ(m.t, "abc", false, false, a, bc);
        else TOK_EQ(m.t, "abc", false, false, ab, cc);
        /* Without a space prefix, spaces still become U+2581. */
        if (c == 1) TOK_EQ(m.t, "b a", false, false, bb, a + 5, a);
        /* Symbols not in the vocabulary fall back to bytes; the merged "abc" never forms because
         * no "abc" piece exists, and "abcx" needs it. */
        if (c == 0) TOK_EQ(m.t, "abcx\n", false, false, ab, cc, BYTE0 + 'x', BYTE0 + '\n');
        mt_free(&m);
    }
}

TEST(tokenizer_merge_longer_chain) {
    /* "▁hello" needs several merges; the best-scoring path wins over a worse split. */
    tokspec v[] = {
        {SP, -1, 0}, {"h", -1, 0}, {"e", -1, 0}, {"l", -1, 0}, {"o", -1, 0},
        {"he", -5, 0}, {"ll", -3, 0}, {"llo", -4, 0}, {"hell", -6, 0}, {"hello", -7, 0},
        {SP "hello", -8, 0}, {"el", -2, 0},
    };
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    add_vocab(&b, v, 12, true);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    /* "el" (-2) merges first; that breaks up "ll" (-3) and "he" (-5), and "hel"/"ell" do not
     * exist, so the better-looking "▁hello" is never reached. */
    const int32_t X = FIRST_EXTRA;
    TOK_EQ(m.t, "hello", false, false, X + 0, X + 1, X + 11, X + 3, X + 4);
    mt_free(&m);
}

TEST(tokenizer_special_partition_rules) {
    tokspec v[] = {
        {SP, -1, 0}, {"a", -1, 0}, {"b", -1, 0}, {SP "a", -0.5f, 0}, {SP "b", -0.5f, 0},
        {"<tool>", 0, QUILL_TOKEN_USER_DEFINED},      /* X+5 */
        {"<|im", 0, QUILL_TOKEN_CONTROL},              /* X+6 */
        {"<|im_start|>", 0, QUILL_TOKEN_CONTROL},      /* X+7 */
        {"<|im_end|>", 0, QUILL_TOKEN_USER_DEFINED},   /* X+8: forced to CONTROL and EOG */
        {"<|unused|>", 0, QUILL_TOKEN_UNUSED},         /* X+9: never split out */
    };
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    add_vocab(&b, v, 10, true);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    const quill_tokenizer *t = m.t;
    const int32_t X = FIRST_EXTRA;
    /* User-defined tokens are split out even without parse_special; the next fragment is
     * prefixed with a space because it follows a special token. */
    TOK_EQ(t, "a<tool>b", false, false, X + 3, X + 5, X + 4);
    TOK_EQ(t, "<tool>", false, false, X + 5);
    /* Control tokens only with parse_special; longest first. */
    TOK_EQ(t, "<|im_start|>a", false, true, X + 7, X + 3);
    TOK_EQ(t, "<|ima", false, true, X + 6, X + 3);
    TOK_EQ(t, "b<|im_start|><|im", true, true, 1, X + 4, X + 7, X + 6);
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK(quill_tokenize(t, "<|im_start|>", 12, false, false, &ids, &n, NULL) == QUILL_OK);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] != X + 6 && ids[i] != X + 7);
    free(ids);
    /* <|im_end|> looked like a control token: it became one, so it is not split without
     * parse_special, renders as nothing by default and ends generation. */
    CHECK_EQ_INT(quill_tokenizer_token_type(t, X + 8), QUILL_TOKEN_CONTROL);
    CHECK(quill_tokenizer_is_eog(t, X + 8));
    CHECK(quill_tokenizer_is_eog(t, 2));
    CHECK(!quill_tokenizer_is_eog(t, X + 7));
    TOK_EQ(t, "<|im_end|>", false, true, X + 8);
    CHECK(quill_tokenize(t, "<|im_end|>", 10, false, false, &ids, &n, NULL) == QUILL_OK);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] != X + 8);
    free(ids);
    char buf[32];
    CHECK_EQ_INT(quill_token_to_bytes(t, X + 8, false, buf, sizeof buf), 0);
    CHECK_EQ_INT(quill_token_to_bytes(t, X + 5, false, buf, sizeof buf), 6);   /* user-defined: always text */
    CHECK_EQ_INT(quill_token_to_bytes(t, X + 9, true, buf, sizeof buf), 0);    /* unused: nothing */
    /* A normal piece turns U+2581 into a space. */
    CHECK_EQ_INT(quill_token_to_bytes(t, X + 3, false, buf, sizeof buf), 2);
    CHECK(memcmp(buf, " a", 2) == 0);
    mt_free(&m);
}

TEST(tokenizer_flags_and_special_ids) {
    tokspec v[] = {{SP, -1, 0}, {"a", -1, 0}, {SP "a", -0.5f, 0}, {"<|eot_id|>", 0, QUILL_TOKEN_CONTROL},
                   {"<custom_end>", 0, QUILL_TOKEN_CONTROL}, {"<|fim_pad|>", 0, QUILL_TOKEN_NORMAL}};
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    add_vocab(&b, v, 6, true);
    const int32_t X = FIRST_EXTRA;
    kv_bool(&b, "tokenizer.ggml.add_bos_token", false);
    kv_bool(&b, "tokenizer.ggml.add_eos_token", true);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", (uint32_t)X);            /* "▁" as EOS, odd but legal */
    kv_u32(&b, "tokenizer.ggml.eot_token_id", (uint32_t)(X + 4));      /* EOT named by metadata */
    kv_u32(&b, "tokenizer.ggml.padding_token_id", 0xFFFFFFFFu);        /* out of range: ignored */
    kv_i32(&b, "tokenizer.ggml.bos_token_id", -7);                     /* out of range: default 1 */
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    const quill_tokenizer *t = m.t;
    CHECK_EQ_INT(quill_tokenizer_bos(t), 1);
    CHECK_EQ_INT(quill_tokenizer_eos(t), X);
    CHECK(!quill_tokenizer_add_bos(t));
    CHECK(quill_tokenizer_add_eos(t));
    TOK_EQ(t, "a", true, false, X + 2, X);
    TOK_EQ(t, "a", false, false, X + 2);
    CHECK(quill_tokenizer_is_eog(t, X));       /* EOS */
    CHECK(quill_tokenizer_is_eog(t, X + 3));   /* <|eot_id|> by text */
    CHECK(quill_tokenizer_is_eog(t, X + 4));   /* EOT by metadata */
    CHECK(quill_tokenizer_is_eog(t, X + 5));   /* FIM pad by text, and turned into a control token */
    CHECK_EQ_INT(quill_tokenizer_token_type(t, X + 5), QUILL_TOKEN_CONTROL);
    CHECK(quill_tokenizer_is_eog(t, 2));       /* </s> is not EOS here but ends generation by its text */
    CHECK(!quill_tokenizer_is_eog(t, 1));
    mt_free(&m);
}

/* The Phi-3 rule: whitespace after a special token is dropped (keyed on the model name). */
TEST(tokenizer_phi3_rstrip) {
    tokspec v[] = {{SP, -1, 0}, {"x", -1, 0}, {SP "x", -0.5f, 0}, {"<|end|>", 0, QUILL_TOKEN_CONTROL},
                   {"<|user|>", 0, QUILL_TOKEN_USER_DEFINED}};
    const int32_t X = FIRST_EXTRA;
    for (int phi = 0; phi < 2; phi++) {
        gbuf b = {0};
        kv_str(&b, "tokenizer.ggml.model", "llama");
        kv_str(&b, "general.name", phi ? "Phi-3-mini-4k-instruct" : "llama");
        add_vocab(&b, v, 5, true);
        memtok m = mt_load(&b);
        CHECK(m.status == QUILL_OK, "%s", m.err.message);
        if (phi) {
            TOK_EQ(m.t, "<|end|>\n  x", false, true, X + 3, X + 2);
            TOK_EQ(m.t, "<|user|> \t\n", false, false, X + 4);
            TOK_EQ(m.t, "</s> x", false, true, 2, X + 2);            /* </s> strips too */
            TOK_EQ(m.t, "<s> x", false, true, 1, X, X + 2);           /* <s> does not */
        } else {
            TOK_EQ(m.t, "<|end|>\n  x", false, true, X + 3, X, BYTE0 + '\n', X, X + 2);
            TOK_EQ(m.t, "</s> x", false, true, 2, X, X + 2);
        }
        mt_free(&m);
    }
}

TEST(tokenizer_byte_fallback_variants) {
    /* No <0xNN> tokens: a one-byte token text is the fallback, then <unk>. */
    tokspec v[] = {{SP, -1, 0}, {"a", -1, 0}, {"\xc3", -1, 0}, {"\n", -1, 0}};
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
    add_vocab(&b, v, 4, false);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    const int32_t X = 3;
    TOK_EQ(m.t, "a\xc3\xa9\n", false, false, X + 1, X + 2, 0, X + 3);
    mt_free(&m);
}

TEST(tokenizer_vocab_oddities) {
    /* Empty tokens get a name, text after NUL is dropped, a duplicated text maps to its last id,
     * unknown type numbers are UNDEFINED and decode to nothing. */
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
    kv_arr_hdr(&b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, 8);
    gb_strn(&b, "<unk>", 5);
    gb_strn(&b, "<s>", 3);
    gb_strn(&b, "</s>", 4);
    gb_strn(&b, "", 0);
    gb_strn(&b, "ab\0cd", 5);
    gb_strn(&b, "q", 1);
    gb_strn(&b, "q", 1);
    gb_strn(&b, "z", 1);
    kv_arr_hdr(&b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, 8);
    int32_t ty[8] = {2, 3, 3, 1, 1, 1, 1, 99};
    gb_bytes(&b, ty, sizeof ty);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    const quill_tokenizer *t = m.t;
    CHECK(strcmp(quill_tokenizer_piece(t, 3), "[EMPTY_3]") == 0);
    CHECK(strcmp(quill_tokenizer_piece(t, 4), "ab") == 0);
    TOK_EQ(t, "q", false, false, 6);
    CHECK_EQ_INT(quill_tokenizer_token_type(t, 7), QUILL_TOKEN_UNDEFINED);
    char buf[8];
    CHECK_EQ_INT(quill_token_to_bytes(t, 7, true, buf, sizeof buf), 0);
    /* No byte tokens and no matching text: <unk> (id 0 by default). */
    TOK_EQ(t, "y", false, false, 0);
    mt_free(&m);
}

TEST(tokenizer_tiny_vocab_without_bos) {
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_arr_hdr(&b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, 1);
    gb_strn(&b, "a", 1);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    CHECK_EQ_INT(quill_tokenizer_bos(m.t), -1);
    CHECK_EQ_INT(quill_tokenizer_eos(m.t), -1);
    CHECK(!quill_tokenizer_is_eog(m.t, 0));
    int32_t *ids = NULL;
    size_t n = 0;
    quill_error err = {0};
    CHECK(quill_tokenize(m.t, "a", 1, true, false, &ids, &n, &err) == QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "BOS");
    CHECK(ids == NULL);
    /* Without special tokens it works: " a" -> "▁a" is not a token, so bytes -> <unk> = 0. */
    CHECK(quill_tokenize(m.t, "a", 1, false, false, &ids, &n, &err) == QUILL_OK, "%s", err.message);
    CHECK(n == 4 && ids[3] == 0);
    free(ids);
    mt_free(&m);
}

/* A Gemma-sized SentencePiece vocabulary: 256000 tokens, thousands of user-defined ones, no space
 * prefix. User-defined tokens are split out without special-token parsing, the rest merges by
 * score, and the ids decode back to the text. */
TEST(tokenizer_spm_large_vocabulary) {
    enum { N = 256000, N_USER = 4000, FIRST_USER = 259, FIRST_WORD = FIRST_USER + N_USER };
    gbuf b = {0};
    kv_str(&b, "tokenizer.ggml.model", "llama");
    kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
    kv_u32(&b, "tokenizer.ggml.bos_token_id", 1);
    kv_u32(&b, "tokenizer.ggml.eos_token_id", 2);
    kv_arr_hdr(&b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, N);
    gb_strn(&b, "<unk>", 5);
    gb_strn(&b, "<bos>", 5);
    gb_strn(&b, "<eos>", 5);
    char s[32];
    for (int i = 0; i < 256; i++) {
        snprintf(s, sizeof s, "<0x%02X>", i);
        gb_strn(&b, s, 6);
    }
    for (int i = 0; i < N_USER; i++) {
        snprintf(s, sizeof s, "<tag%d>", i);
        gb_strn(&b, s, strlen(s));
    }
    /* words: "w" + a base-26 number, with and without the escaped space in front */
    for (int i = FIRST_WORD; i < N; i++) {
        int k = (i - FIRST_WORD) / 2;
        size_t n = 0;
        if ((i - FIRST_WORD) % 2) { memcpy(s, SP, 3); n = 3; }
        s[n++] = 'w';
        do { s[n++] = (char)('a' + k % 26); k /= 26; } while (k);
        gb_strn(&b, s, n);
    }
    kv_arr_hdr(&b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, N);
    for (int i = 0; i < N; i++) {
        float f = i < FIRST_WORD ? 0.0f : -(float)i;
        gb_bytes(&b, &f, 4);
    }
    kv_arr_hdr(&b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, N);
    for (int i = 0; i < N; i++) {
        int32_t ty = i == 0 ? QUILL_TOKEN_UNKNOWN : i < 3 ? QUILL_TOKEN_CONTROL : i < FIRST_USER ? QUILL_TOKEN_BYTE
                   : i < FIRST_WORD ? QUILL_TOKEN_USER_DEFINED : QUILL_TOKEN_NORMAL;
        gb_bytes(&b, &ty, 4);
    }
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    CHECK_EQ_INT(quill_tokenizer_n_vocab(m.t), N);
    const int32_t wa = FIRST_WORD, sp_wa = FIRST_WORD + 1, wb = FIRST_WORD + 2;
    /* "wa": no space prefix; "<tag3999>" and "<tag17>" are split out without parse_special */
    TOK_EQ(m.t, "wa<tag3999> wa<tag17>wb", false, false, wa, FIRST_USER + 3999, sp_wa, FIRST_USER + 17, wb);
    TOK_EQ(m.t, "wa", true, false, 1, wa);
    const char *text = "<tag0><tag1>wa wb wa\n<tag2>";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(quill_tokenize(m.t, text, strlen(text), false, false, &ids, &n_ids, NULL) == QUILL_OK);
    quill_detokenizer d;
    quill_detokenizer_init(&d, m.t, false, true);
    char out[512];
    size_t len = 0;
    for (size_t i = 0; i < n_ids; i++) len += quill_detokenizer_push(&d, ids[i], out + len, sizeof out - len);
    len += quill_detokenizer_flush(&d, out + len, sizeof out - len);
    CHECK(len == strlen(text) && memcmp(out, text, len) == 0, "decoded \"%.*s\"", (int)len, out);
    free(ids);
    mt_free(&m);
}

/* ---------------------------------------------------------------- byte-level BPE */

/* GPT-2's printable character for a byte, as UTF-8. */
static size_t byte_char_utf8(unsigned char b, char *out) {
    unsigned c;
    if ((b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE) c = b;
    else if (b <= 0x20) c = 0x100u + b;
    else if (b <= 0xA0) c = 0x100u + 33 + (b - 0x7Fu);
    else c = 0x143;
    if (c < 0x80) { out[0] = (char)c; return 1; }
    out[0] = (char)(0xC0 | (c >> 6));
    out[1] = (char)(0x80 | (c & 0x3F));
    return 2;
}

/* A byte-level vocabulary: the 256 byte characters (ids 0..255), then `extra` (NORMAL unless a type
 * is given), with `merges` in rank order; `pre` NULL leaves tokenizer.ggml.pre out. */
static void add_bpe_vocab(gbuf *b, const char *pre, const tokspec *extra, int n_extra, const char *const *merges,
                          int n_merges) {
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    if (pre) kv_str(b, "tokenizer.ggml.pre", pre);
    kv_arr_hdr(b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, (uint64_t)(256 + n_extra));
    for (int i = 0; i < 256; i++) {
        char u[2];
        gb_strn(b, u, byte_char_utf8((unsigned char)i, u));
    }
    for (int i = 0; i < n_extra; i++) gb_strn(b, extra[i].text, strlen(extra[i].text));
    kv_arr_hdr(b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, (uint64_t)(256 + n_extra));
    int32_t normal = QUILL_TOKEN_NORMAL;
    for (int i = 0; i < 256; i++) gb_bytes(b, &normal, 4);
    for (int i = 0; i < n_extra; i++) {
        int32_t ty = extra[i].type ? extra[i].type : QUILL_TOKEN_NORMAL;
        gb_bytes(b, &ty, 4);
    }
    kv_arr_hdr(b, "tokenizer.ggml.merges", QUILL_GGUF_STRING, (uint64_t)n_merges);
    for (int i = 0; i < n_merges; i++) gb_strn(b, merges[i], strlen(merges[i]));
}

#define G_SPACE "\xc4\xa0"   /* GPT-2's character for ' ' */

TEST(tokenizer_bpe_merges_by_rank) {
    /* "abc": "b c" has the lower rank, so bc forms first and "a b" never applies. */
    tokspec v[] = {{"ab", 0, 0}, {"bc", 0, 0}, {"abc", 0, 0}, {G_SPACE "a", 0, 0}, {"a bc", 0, 0}};
    const char *merges[] = {"b c", "a b", "a bc", G_SPACE " a", "x"};
    const int32_t X = 256;
    gbuf b = {0};
    add_bpe_vocab(&b, "gpt-2", v, 5, merges, 5);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    TOK_EQ(m.t, "abc", false, false, X + 2);
    TOK_EQ(m.t, "ab", false, false, X);
    TOK_EQ(m.t, "abd", false, false, X, 'd');
    TOK_EMPTY(m.t, "", false, false);
    /* "Ga" ranks after "bc" and "abc", which take the a first */
    TOK_EQ(m.t, " abc", false, false, ' ', X + 2);
    TOK_EQ(m.t, " a", false, false, X + 3);
    /* words do not merge across the pre-tokenizer's boundaries; "a bc" (a space inside) is never made */
    TOK_EQ(m.t, "a bc", false, false, 'a', ' ', X + 1);
    CHECK_EQ_INT(quill_tokenizer_bos(m.t), 11);    /* the reference's BPE defaults */
    CHECK(!quill_tokenizer_add_bos(m.t));
    mt_free(&m);
}

/* llama3-style pre-tokenizers take a word that is a token whole, whatever the merges say. */
TEST(tokenizer_bpe_ignore_merges) {
    tokspec v[] = {{"abc", 0, 0}};
    const char *merges[] = {"a b"};
    for (int llama3 = 0; llama3 < 2; llama3++) {
        gbuf b = {0};
        add_bpe_vocab(&b, llama3 ? "llama-bpe" : "gpt-2", v, 1, merges, 1);
        memtok m = mt_load(&b);
        CHECK(m.status == QUILL_OK, "%s", m.err.message);
        if (llama3) TOK_EQ(m.t, "abc", false, false, 256);
        else TOK_EQ(m.t, "abc", false, false, 'a', 'b', 'c');
        CHECK_EQ_INT(quill_tokenizer_add_bos(m.t), llama3);   /* llama3 implies add_bos */
        mt_free(&m);
    }
}

TEST(tokenizer_bpe_pre_names) {
    /* refused by name, as the reference refuses it */
    const char *refused[] = {"gpt-neox", "kimi-k2", "no-such-pre"};
    for (int i = 0; i < 3; i++) {
        gbuf b = {0};
        add_bpe_vocab(&b, refused[i], NULL, 0, NULL, 0);
        memtok m = mt_load(&b);
        CHECK(m.status == QUILL_E_UNSUPPORTED, "pre '%s': status %d", refused[i], m.status);
        char want[64];
        snprintf(want, sizeof want, "'%s'", refused[i]);
        CHECK_STR_CONTAINS(m.err.message, want);
        CHECK_STR_CONTAINS(m.err.message, "tokenizer.ggml.pre");
        mt_free(&m);
    }
    /* every name of the table compiles and tokenizes; a missing pre is the reference's default */
    const char *names[] = {NULL, "", "default", "llama3", "llama-bpe", "dbrx", "glm4", "deepseek-llm", "deepseek-coder",
                           "falcon", "gpt-2", "mpt", "olmo", "starcoder", "refact", "command-r", "qwen2", "stablelm2",
                           "qwen35", "jais-2", "poro-chat", "viking", "tekken", "gpt-4o", "llama4", "bailingmoe",
                           "seed-coder", "ufakzeka", "laguna", "exaone-moe", "minicpm5", "grok-2", "megrez"};
    const char *text = "Hello World 12345 it's IT'S \xe4\xbd\xa0\xe5\xa5\xbd\n\n  x\xc3\xa9 !?";
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        gbuf b = {0};
        add_bpe_vocab(&b, names[i], NULL, 0, NULL, 0);
        memtok m = mt_load(&b);
        CHECK(m.status == QUILL_OK, "pre '%s': %s", names[i] ? names[i] : "(none)", m.err.message);
        int32_t *ids = NULL;
        size_t n = 0;
        quill_error err = {0};
        CHECK(quill_tokenize(m.t, text, strlen(text), false, false, &ids, &n, &err) == QUILL_OK, "%s", err.message);
        CHECK_EQ_INT(n, strlen(text));   /* no merges: one token per byte */
        for (size_t k = 0; k < n; k++) CHECK_EQ_INT(ids[k], (unsigned char)text[k]);
        free(ids);
        if (names[i] && strcmp(names[i], "glm4") == 0) CHECK_EQ_INT(quill_tokenizer_bos(m.t), -1);
        mt_free(&m);
    }
}

TEST(tokenizer_bpe_decoding_and_specials) {
    tokspec v[] = {{G_SPACE "a", 0, 0}, {"\xe2\x82\xac", 0, 0}, {"<|im_start|>", 0, QUILL_TOKEN_CONTROL},
                   {"<|endoftext|>", 0, QUILL_TOKEN_CONTROL}, {"<tool>", 0, QUILL_TOKEN_USER_DEFINED}};
    const char *merges[] = {G_SPACE " a"};
    const int32_t X = 256;
    gbuf b = {0};
    add_bpe_vocab(&b, "qwen2", v, 5, merges, 1);
    memtok m = mt_load(&b);
    CHECK(m.status == QUILL_OK, "%s", m.err.message);
    char buf[64];
    CHECK_EQ_INT(quill_token_to_bytes(m.t, X, false, buf, sizeof buf), 2);
    CHECK(memcmp(buf, " a", 2) == 0);
    /* a character outside GPT-2's byte mapping: the reference's marker, naming its bytes and the text */
    int n = quill_token_to_bytes(m.t, X + 1, false, buf, sizeof buf);
    CHECK(n > 0 && (size_t)n < sizeof buf);
    CHECK(strncmp(buf, "[UNK_BYTE_0xe282ac\xe2\x82\xac]", (size_t)n) == 0, "got %.*s", n, buf);
    CHECK_EQ_INT(quill_token_to_bytes(m.t, X + 2, false, buf, sizeof buf), 0);    /* control: hidden */
    CHECK_EQ_INT(quill_token_to_bytes(m.t, X + 2, true, buf, sizeof buf), 12);    /* rendered as is */
    CHECK_EQ_INT(quill_token_to_bytes(m.t, X + 4, false, buf, sizeof buf), 6);    /* user-defined: shown */
    CHECK(quill_tokenizer_is_eog(m.t, X + 3));
    TOK_EQ(m.t, "<|im_start|> a", false, true, X + 2, X);
    TOK_EQ(m.t, "<tool> a", false, false, X + 4, X);              /* user-defined: split without parsing */
    /* a control token is text without parse_special: '<', '|', ... one byte each here */
    int32_t *ids = NULL;
    size_t n_ids = 0;
    CHECK(quill_tokenize(m.t, "<|im_start|>", 12, false, false, &ids, &n_ids, NULL) == QUILL_OK);
    CHECK_EQ_INT(n_ids, 12);
    free(ids);
    /* streaming: the euro sign's three bytes, one token each, come out once complete */
    quill_detokenizer d;
    quill_detokenizer_init(&d, m.t, false, true);
    char out[256];
    CHECK_EQ_INT(quill_detokenizer_push(&d, 0xE2, out, sizeof out), 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 0x82, out, sizeof out), 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 0xAC, out, sizeof out), 3);
    CHECK(memcmp(out, "\xe2\x82\xac", 3) == 0);
    CHECK_EQ_INT(quill_detokenizer_push(&d, 0xE2, out, sizeof out), 0);
    CHECK_EQ_INT(quill_detokenizer_flush(&d, out, sizeof out), 3);   /* cut off: U+FFFD */
    mt_free(&m);
}

static void b_merges_ints(gbuf *b) {
    kv_str(b, "tokenizer.ggml.model", "gpt2");
    kv_str(b, "tokenizer.ggml.pre", "gpt-2");
    add_vocab(b, NULL, 0, false);
    kv_arr_hdr(b, "tokenizer.ggml.merges", QUILL_GGUF_INT32, 1);
    gb_u32(b, 7);
}

/* ---------------------------------------------------------------- hostile files */

typedef void (*builder)(gbuf *b);

static quill_status load_err(builder fn, quill_error *err) {
    gbuf b = {0};
    fn(&b);
    memtok m = mt_load(&b);
    *err = m.err;
    quill_status s = m.status;
    /* A failed load leaves no tokenizer behind. */
    if (s != QUILL_OK && m.t) s = (quill_status)-1;
    mt_free(&m);
    return s;
}

static void b_no_model(gbuf *b) { add_vocab(b, NULL, 0, true); }
static void b_gpt2(gbuf *b) { kv_str(b, "tokenizer.ggml.model", "gpt2"); add_vocab(b, NULL, 0, true); }
static void b_bert(gbuf *b) { kv_str(b, "tokenizer.ggml.model", "bert"); add_vocab(b, NULL, 0, true); }
static void b_model_int(gbuf *b) { kv_u32(b, "tokenizer.ggml.model", 1); add_vocab(b, NULL, 0, true); }
static void b_model_binary(gbuf *b) {
    gb_key(b, "tokenizer.ggml.model", QUILL_GGUF_STRING);
    gb_strn(b, "ll\x01\x02", 4);
}
static void b_no_tokens(gbuf *b) { kv_str(b, "tokenizer.ggml.model", "llama"); }
static void b_tokens_not_array(gbuf *b) {
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_str(b, "tokenizer.ggml.tokens", "abc");
}
static void b_tokens_ints(gbuf *b) {
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_arr_hdr(b, "tokenizer.ggml.tokens", QUILL_GGUF_INT32, 2);
    gb_u32(b, 1);
    gb_u32(b, 2);
}
static void b_tokens_empty(gbuf *b) {
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_arr_hdr(b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, 0);
}
static void base_tokens(gbuf *b, int n) {
    kv_str(b, "tokenizer.ggml.model", "llama");
    kv_arr_hdr(b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, (uint64_t)n);
    for (int i = 0; i < n; i++) {
        char s[8];
        snprintf(s, sizeof s, "t%d", i);
        gb_strn(b, s, strlen(s));
    }
}
static void b_scores_short(gbuf *b) {
    base_tokens(b, 4);
    kv_arr_hdr(b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, 3);
    float f[3] = {0};
    gb_bytes(b, f, sizeof f);
}
static void b_scores_long(gbuf *b) {
    base_tokens(b, 4);
    kv_arr_hdr(b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, 5);
    float f[5] = {0};
    gb_bytes(b, f, sizeof f);
}
static void b_scores_f64(gbuf *b) {
    base_tokens(b, 2);
    kv_arr_hdr(b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT64, 2);
    double d[2] = {0};
    gb_bytes(b, d, sizeof d);
}
static void b_scores_nan(gbuf *b) {
    base_tokens(b, 2);
    kv_arr_hdr(b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, 2);
    float f[2] = {0, NAN};
    gb_bytes(b, f, sizeof f);
}
static void b_types_short(gbuf *b) {
    base_tokens(b, 4);
    kv_arr_hdr(b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, 2);
    int32_t t[2] = {1, 1};
    gb_bytes(b, t, sizeof t);
}
static void b_types_strings(gbuf *b) {
    base_tokens(b, 1);
    kv_arr_hdr(b, "tokenizer.ggml.token_type", QUILL_GGUF_STRING, 1);
    gb_strn(b, "1", 1);
}
static void b_types_scalar(gbuf *b) {
    base_tokens(b, 1);
    kv_i32(b, "tokenizer.ggml.token_type", 1);
}
static void b_bad_byte_token(gbuf *b) {
    base_tokens(b, 2);
    kv_arr_hdr(b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, 2);
    int32_t t[2] = {1, QUILL_TOKEN_BYTE};
    gb_bytes(b, t, sizeof t);
}
static void b_bos_string(gbuf *b) {
    base_tokens(b, 4);
    kv_str(b, "tokenizer.ggml.bos_token_id", "1");
}
static void b_add_bos_string(gbuf *b) {
    base_tokens(b, 4);
    kv_str(b, "tokenizer.ggml.add_bos_token", "yes");
}

TEST(tokenizer_hostile_metadata) {
    quill_error err;
    CHECK_EQ_INT(load_err(b_no_model, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "tokenizer.ggml.model");
    CHECK_EQ_INT(load_err(b_gpt2, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "tokenizer.ggml.merges");
    CHECK_EQ_INT(load_err(b_merges_ints, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "tokenizer.ggml.merges is an array of i32");
    CHECK_EQ_INT(load_err(b_bert, &err), QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "'bert'");
    CHECK_EQ_INT(load_err(b_model_int, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "tokenizer.ggml.model");
    CHECK_EQ_INT(load_err(b_model_binary, &err), QUILL_E_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "'ll?" "?'");
    CHECK_EQ_INT(load_err(b_no_tokens, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "tokenizer.ggml.tokens");
    CHECK_EQ_INT(load_err(b_tokens_not_array, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "tokenizer.ggml.tokens");
    CHECK_EQ_INT(load_err(b_tokens_ints, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "expected strings");
    CHECK_EQ_INT(load_err(b_tokens_empty, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "0 entries");
    CHECK_EQ_INT(load_err(b_scores_short, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "scores has 3 entries but there are 4 tokens");
    CHECK_EQ_INT(load_err(b_scores_long, &err), QUILL_E_FORMAT);
    CHECK_EQ_INT(load_err(b_scores_f64, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "expected f32");
    CHECK_EQ_INT(load_err(b_scores_nan, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "NaN");
    CHECK_EQ_INT(load_err(b_types_short, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "token_type has 2 entries but there are 4 tokens");
    CHECK_EQ_INT(load_err(b_types_strings, &err), QUILL_E_FORMAT);
    CHECK_EQ_INT(load_err(b_types_scalar, &err), QUILL_E_FORMAT);
    CHECK_EQ_INT(load_err(b_bad_byte_token, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "token 1 has type BYTE");
    CHECK_EQ_INT(load_err(b_bos_string, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "bos_token_id");
    CHECK_EQ_INT(load_err(b_add_bos_string, &err), QUILL_E_FORMAT);
    CHECK_STR_CONTAINS(err.message, "add_bos_token");
    quill_tokenizer *t = (quill_tokenizer *)1;
    CHECK_EQ_INT(quill_tokenizer_load(NULL, &t, &err), QUILL_E_ARG);
}

static uint64_t xorshift(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

/* Random vocabularies (texts from a tiny alphabet so merges, duplicates and specials collide)
 * and random inputs: nothing crashes, every id is valid, bytes come back. */
TEST(tokenizer_random_vocabularies) {
    uint64_t x = 0x243f6a8885a308d3ull;
#define RND() xorshift(&x)
    static const char alpha[] = {'a', 'b', ' ', '<', '>', '\n', '\xe2', '\x96', '\x81', '\xc3', '\xa9', 0};
    for (int round = 0; round < 60; round++) {
        int n = 1 + (int)(RND() % 40);
        gbuf b = {0};
        kv_str(&b, "tokenizer.ggml.model", "llama");
        if (RND() & 1) kv_bool(&b, "tokenizer.ggml.add_space_prefix", false);
        if (RND() & 1) kv_u32(&b, "tokenizer.ggml.unknown_token_id", (uint32_t)(RND() % 50));
        kv_arr_hdr(&b, "tokenizer.ggml.tokens", QUILL_GGUF_STRING, (uint64_t)n);
        for (int i = 0; i < n; i++) {
            char s[8];
            size_t len = RND() % 5;
            for (size_t k = 0; k < len; k++) s[k] = alpha[RND() % sizeof alpha];
            gb_strn(&b, s, len);
        }
        kv_arr_hdr(&b, "tokenizer.ggml.scores", QUILL_GGUF_FLOAT32, (uint64_t)n);
        for (int i = 0; i < n; i++) {
            float f = (float)(RND() % 7) - 3.0f;
            gb_bytes(&b, &f, 4);
        }
        kv_arr_hdr(&b, "tokenizer.ggml.token_type", QUILL_GGUF_INT32, (uint64_t)n);
        for (int i = 0; i < n; i++) {
            int32_t ty = (int32_t)(RND() % 6);   /* no BYTE: random texts are not <0xNN> */
            gb_bytes(&b, &ty, 4);
        }
        memtok m = mt_load(&b);
        CHECK(m.status == QUILL_OK, "round %d: %s", round, m.err.message);
        for (int k = 0; k < 20; k++) {
            char text[64];
            size_t len = RND() % sizeof text;
            for (size_t i = 0; i < len; i++) text[i] = alpha[RND() % sizeof alpha];
            int32_t *ids = NULL;
            size_t n_ids = 0;
            bool add = RND() & 1, parse = RND() & 1;
            quill_status s = quill_tokenize(m.t, text, len, add, parse, &ids, &n_ids, NULL);
            CHECK(s == QUILL_OK || s == QUILL_E_FORMAT, "round %d: status %d", round, s);
            for (size_t i = 0; i < n_ids; i++) CHECK(ids[i] >= 0 && ids[i] < n);
            quill_detokenizer d;
            quill_detokenizer_init(&d, m.t, RND() & 1, true);
            char out[512];
            for (size_t i = 0; i < n_ids; i++) {
                size_t got = quill_detokenizer_push(&d, ids[i], out, sizeof out);
                CHECK(got <= sizeof out);
            }
            CHECK(quill_detokenizer_flush(&d, out, sizeof out) <= 9);
            free(ids);
        }
        mt_free(&m);
    }
#undef RND
}
