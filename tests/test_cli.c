/* The command line: one option parser for run/chat/tokenize, llama-cli habits, and the crashes a
 * new user found (each also runs under ASan/UBSan in the sanitizer build of the suite). */
#include "gguf_build.h"
#include "golden.h"
#include "test.h"

#include <cjson/cJSON.h>

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *stories(const char *shared) { return path_join(shared, "models/stories260K.gguf"); }

/* Runs `quill ARGS` (through the shell) and returns its exit status; *out gets stdout and, unless
 * ARGS discard it, stderr. */
static int quill(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int quill(char **out, const char *fmt, ...) {
    char args[4096], cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(args, sizeof args, fmt, ap);
    va_end(ap);
    snprintf(cmd, sizeof cmd, "%s %s", quill_bin(), args);
    return run_cmd(cmd, out, strstr(args, "2>/dev/null") == NULL);
}

/* A parse that fails after the prompt was read (here a JSON schema that does not compile) frees
 * the prompt: under the sanitizers a leak would change the exit status and print a report. */
TEST(cli_failed_parse_frees_the_prompt) {
    char *out = NULL;
    int rc = quill(&out, "run -m /nonexistent.gguf -p hello -j '{\"type\": 5}'");
    CHECK(rc == 1, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "--json-schema");
    CHECK(!strstr(out, "Sanitizer"), "%s", out);
    free(out);
}

/* A bad --tokens list is an error message and exit 1; it used to be freed twice (SIGABRT). */
TEST(cli_run_bad_token_lists_fail_cleanly) {
    REQUIRE_SHARED(shared);
    char *model = stories(shared);
    static const char *const bad[] = {"abc", "", "1,,2", "-1", "1,", ",1", "1 2", "99999999999", "+1", NULL};
    for (const char *const *b = bad; *b; b++) {
        char *out = NULL;
        int rc = quill(&out, "run -m %s --tokens '%s' -n 1", model, *b);
        CHECK(rc == 1, "--tokens '%s': exit %d: %s", *b, rc, out);
        CHECK_STR_CONTAINS(out, "--tokens");
        CHECK(!strstr(out, "free") && !strstr(out, "Sanitizer"), "--tokens '%s': %s", *b, out);
        free(out);
    }
    char *out = NULL;
    int rc = quill(&out, "run -m %s --tokens 1,403,407 -n 2 --temp 0", model);
    CHECK(rc == 0, "%s", out);
    free(out);
    free(model);
}

/* A copy of stories260K with add_bos_token = false (and, like it, no chat template). */
static char *no_bos_model(const char *shared) {
    char *src = stories(shared), *dst = path_join(tmp_dir(), "no_bos.gguf");
    quill_gguf *g = NULL;
    quill_error err;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = quill_gguf_open(src, &g, &err) == QUILL_OK && copy_metadata(w, g, "tokenizer.ggml.add_bos_token");
    ok = ok && quill_gguf_writer_add_bool(w, "tokenizer.ggml.add_bos_token", false) == QUILL_OK;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    free(src);
    if (!ok) {
        free(dst);
        return NULL;
    }
    return dst;
}

/* chat on a model without BOS and without a template, first input an empty line (and a lone
 * space, which tokenizes to nothing or almost): it used to evaluate "1 new token, 2^64-1 reused"
 * and read before the buffer. */
TEST(cli_chat_empty_first_line_without_bos) {
    REQUIRE_SHARED(shared);
    char *model = no_bos_model(shared);
    CHECK(model != NULL, "cannot write the model copy");
    char *out = NULL, cmd[4096];
    snprintf(cmd, sizeof cmd, "printf '\\n \\n\\nOnce upon a time\\n/bye\\n' | %s chat -m %s -n 4 --temp 0 --verbose",
             quill_bin(), model);
    int rc = run_cmd(cmd, &out, true);
    free(model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK(!strstr(out, "18446744073709551615") && !strstr(out, "Sanitizer"), "%s", out);
    CHECK_STR_CONTAINS(out, "raw mode");
    CHECK_STR_CONTAINS(out, "[turn 1: evaluating");
    CHECK_STR_CONTAINS(out, "tokens, 0 reused from the cache]");
    free(out);
}

/* Values are checked before the model is loaded, with the same message in every command. */
TEST(cli_options_checked_before_loading) {
    static const struct {
        const char *args, *message;
    } cases[] = {
        {"run -m /nonexistent.gguf -p hi --top-p 0", "--top-p: '0' is not a number in (0, 1]"},
        {"chat -m /nonexistent.gguf --top-p 0", "--top-p: '0' is not a number in (0, 1]"},
        {"run -m /nonexistent.gguf -p hi -n x", "--n-predict: 'x' is not a whole number"},
        {"chat -m /nonexistent.gguf -n 0", "a reply of 0 tokens"},
        {"chat -m /nonexistent.gguf --n-predict=abc", "--n-predict: 'abc' is not a whole number"},
        {"run -m /nonexistent.gguf -p hi -t 0", "--threads: '0' is not a whole number in 1..1024"},
        {"chat -m /nonexistent.gguf --threads 5000", "--threads: '5000' is not a whole number in 1..1024"},
        {"run -m /nonexistent.gguf -p hi --ctx-size -5", "--ctx-size: '-5'"},
        {"run -m /nonexistent.gguf -p hi --seed x", "--seed: 'x' is not a whole number"},
        {"run -m /nonexistent.gguf -p hi --system S", "--system applies only with --chat"},
        {"run -m /nonexistent.gguf -p hi --chat-format chatml", "--chat-format applies only with --chat"},
        {"run -m /nonexistent.gguf -p hi --chat-template t.jinja", "--chat-template applies only with --chat"},
        {"run -m /nonexistent.gguf -p hi --tokens 1", "give one of -p, -f and --tokens"},
        {"run -m /nonexistent.gguf", "no prompt given"},
        {"run -p hi", "no model given"},
        {"chat -m /nonexistent.gguf --bogus", "unknown option '--bogus'"},
        {"chat -m /nonexistent.gguf --tokens 1", "does not apply to quill chat"},
        {"tokenize -m /nonexistent.gguf -p hi --temp 1", "does not apply to quill tokenize"},
        {"run -m /nonexistent.gguf -p hi --temp", "needs a value"},
        {"run -m /nonexistent.gguf -f /nonexistent.txt", "/nonexistent.txt: cannot read the prompt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out = NULL;
        int rc = quill(&out, "%s", cases[i].args);
        CHECK(rc == 1, "%s: exit %d: %s", cases[i].args, rc, out);
        CHECK(strstr(out, cases[i].message) != NULL, "%s: expected \"%s\" in \"%s\"", cases[i].args, cases[i].message, out);
        CHECK(!strstr(out, "nonexistent.gguf:"), "%s: the model was opened before the options were checked: %s",
              cases[i].args, out);
        free(out);
    }
}

/* llama-cli habits: long names, -f, -p -, the prompt echoed, -r/--stop, -ngl, --mlock, --no-mmap,
 * -t above the CPUs, --version, quill help COMMAND. */
TEST(cli_llama_cli_habits) {
    REQUIRE_SHARED(shared);
    char *model = stories(shared), *out = NULL;
    int rc = quill(&out, "run --model %s --prompt 'Once upon a time' --n-predict 8 --temp 0 --ctx-size 64 --threads 1 "
                   "-ngl 99 --mlock --no-mmap", model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "Once upon a time, there was a little girl");
    CHECK_STR_CONTAINS(out, "-ngl 99 ignored: quill runs on the CPU");
    free(out);
    rc = quill(&out, "run -m %s -p 'Once upon a time' -n 8 --temp 0 --no-display-prompt 2>/dev/null", model);
    CHECK(rc == 0 && !strncmp(out, ", there was a little girl", 25), "exit %d: %s", rc, out);
    free(out);
    /* -p - reads stdin, -f reads a file; the final newline is not part of the prompt */
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "echo 'Once upon a time' | %s run -m %s -p - -n 8 --temp 0 --json", quill_bin(), model);
    rc = run_cmd(cmd, &out, false);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "\"prompt_tokens\": [1, 403, 407, 261, 378]");
    free(out);
    char *file = path_join(tmp_dir(), "prompt.txt");
    FILE *f = fopen(file, "w");
    CHECK(f != NULL);
    fputs("Once upon a time\n", f);
    fclose(f);
    rc = quill(&out, "run -m %s -f %s -n 8 --temp 0 --json", model, file);
    free(file);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "\"prompt_tokens\": [1, 403, 407, 261, 378]");
    free(out);
    /* stop strings: -r, --reverse-prompt and --stop are one list */
    rc = quill(&out, "run -m %s -p 'Once upon a time' -n 30 --temp 0 -r Lily --stop zzz 2>/dev/null", model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK(!strcmp(out, "Once upon a time, there was a little girl named \n"), "\"%s\"", out);
    free(out);
    rc = quill(&out, "run -m %s -p 'Once upon a time' -n 30 --temp 0 -r Lily --json", model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "\"finish_reason\": \"stop\"");
    free(out);
    /* more threads than CPUs: accepted, with a warning */
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    rc = quill(&out, "run -m %s -p hi -n 1 --temp 0 -t %ld", model, cpus + 1);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "more threads than the");
    free(out);
    rc = quill(&out, "--version");
    CHECK(rc == 0 && !strncmp(out, "quill ", 6), "exit %d: %s", rc, out);
    free(out);
    rc = quill(&out, "help run");
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "--reverse-prompt");
    CHECK_STR_CONTAINS(out, "--ctx-size");
    free(out);
    rc = quill(&out, "help chat");
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "/bye");
    free(out);
    rc = quill(&out, "help nonsense");
    CHECK(rc == 1, "exit %d: %s", rc, out);
    free(out);
    free(model);
}

/* The default seed is random and reported; --seed N reproduces; --seed -1 is random. */
TEST(cli_seed_default_random_and_reproducible) {
    REQUIRE_SHARED(shared);
    char *model = stories(shared), *a = NULL, *b = NULL;
    int rc;
    rc = quill(&a, "run -m %s -p 'Once upon a time' -n 24 --temp 1.5 --json 2>/dev/null", model);
    CHECK(rc == 0, "%s", a);
    rc = quill(&b, "run -m %s -p 'Once upon a time' -n 24 --temp 1.5 --json 2>/dev/null", model);
    CHECK(rc == 0, "%s", b);
    const char *sa = strstr(a, "\"seed\": "), *sb = strstr(b, "\"seed\": ");
    CHECK(sa && sb, "no seed in %s", a);
    CHECK(strtoull(sa + 8, NULL, 10) != strtoull(sb + 8, NULL, 10), "two default seeds were equal");
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", strtoull(sa + 8, NULL, 10));
    free(b);
    rc = quill(&b, "run -m %s -p 'Once upon a time' -n 24 --temp 1.5 --json --seed %s 2>/dev/null", model, seed);
    CHECK(rc == 0);
    const char *ga = strstr(a, "\"generated_tokens\""), *gb = strstr(b, "\"generated_tokens\"");
    CHECK(ga && gb && !strncmp(ga, gb, strcspn(ga, "]")), "the same seed gave another text:\n%s\n%s", a, b);
    free(a);
    free(b);
    rc = quill(&a, "run -m %s -p hi -n 1 --seed -1 --verbose", model);
    CHECK(rc == 0, "%s", a);
    CHECK_STR_CONTAINS(a, "seed ");
    free(a);
    free(model);
}

/* The chat template is checked before the session starts: an unknown --chat-format, a template
 * that does not parse, and one that refuses the conversation (Gemma has no system role) end with
 * exit 1 and the message, instead of an error at every turn. */
TEST(cli_chat_template_checked_at_start) {
    REQUIRE_SHARED(shared);
    char *model = stories(shared), *gemma = path_join(shared, "chat/google-gemma-2-2b-it.jinja");
    char *broken = path_join(tmp_dir(), "broken.jinja"), *out = NULL;
    FILE *f = fopen(broken, "w");
    CHECK(f != NULL);
    fputs("{% for m in messages %}{{ m.content }", f);
    fclose(f);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "printf 'hi\\nhi\\n' | %s chat -m %s --chat-format nonsense -n 2", quill_bin(), model);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 1, "unknown format: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "nonsense");
    free(out);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nhi\\n' | %s chat -m %s --chat-template %s -n 2", quill_bin(), model, broken);
    rc = run_cmd(cmd, &out, true);
    CHECK(rc == 1, "broken template: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "the chat template cannot be used");
    CHECK_STR_CONTAINS(out, "line 1");
    free(out);
    snprintf(cmd, sizeof cmd, "printf 'hi\\nhi\\n' | %s chat -m %s --chat-template %s --system 'Be brief' -n 2",
             quill_bin(), model, gemma);
    rc = run_cmd(cmd, &out, true);
    CHECK(rc == 1, "gemma with a system message: exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "System role not supported");
    free(out);
    /* without --system the same template works */
    snprintf(cmd, sizeof cmd, "printf 'hi\\n/bye\\n' | %s chat -m %s --chat-template %s -n 2 --temp 0", quill_bin(),
             model, gemma);
    rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "gemma: exit %d: %s", rc, out);
    free(out);
    free(model), free(gemma), free(broken);
}

/* A conversation longer than the context drops its oldest turns (the system message stays) and
 * says so once; /reset keeps the system message and restarts the turn count; /system in raw mode
 * says it has no effect. */
TEST(cli_chat_full_context_drops_oldest_turns) {
    REQUIRE_SHARED(shared);
    char *model = stories(shared), *out = NULL, cmd[4096];
    snprintf(cmd, sizeof cmd,
             "printf 'Once upon a time\\nThere was a dog\\nThe dog ran\\nThe cat sat\\nThe sun was hot\\n/tokens\\n"
             "/reset\\nHello\\n/bye\\n' | %s chat -m %s --chat-format chatml --system 'You tell stories.' -c 96 "
             "-n 16 --temp 0 --verbose", quill_bin(), model);
    int rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    const char *first = strstr(out, "[the context is full: dropping the oldest turns (the system message stays)]");
    CHECK(first != NULL, "no notice: %s", out);
    CHECK(strstr(first + 40, "dropping the oldest turns") == NULL, "said more than once: %s", out);
    CHECK_STR_CONTAINS(out, "[turn 5: evaluating");
    CHECK(!strstr(out, "quill: the conversation needs"), "%s", out);
    /* the system message is still the first thing the model reads: its tokens stay cached */
    const char *t5 = strstr(out, "[turn 5: evaluating");
    const char *reused = t5 ? strstr(t5, "tokens, ") : NULL;
    CHECK(reused && strtol(reused + 8, NULL, 10) > 20, "turn 5 reused too little: %s", t5);
    CHECK_STR_CONTAINS(out, "[conversation cleared; the system message stays]");
    const char *after = strstr(out, "[conversation cleared");
    CHECK(after && strstr(after, "[turn 1: evaluating"), "the turn count did not restart: %s", out);
    free(out);
    snprintf(cmd, sizeof cmd, "printf '/system Be nice\\n/bye\\n' | %s chat -m %s", quill_bin(), model);
    rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "/system has no effect in raw mode");
    free(out);
    free(model);
}

/* A copy of stories260K whose general.name starts with byte 0xFF and whose token 300 is "▁" and the
 * byte FF (metadata is untrusted: not necessarily UTF-8). */
static char *invalid_utf8_model(const char *shared) {
    char *src = stories(shared), *dst = path_join(tmp_dir(), "bad_utf8.gguf");
    quill_gguf *g = NULL;
    quill_error err;
    quill_gguf_writer *w = quill_gguf_writer_new();
    bool ok = quill_gguf_open(src, &g, &err) == QUILL_OK;
    for (uint64_t i = 0; ok && i < quill_gguf_n_kv(g); i++) {
        const quill_gguf_kv *kv = quill_gguf_kv_at(g, i);
        if (!strcmp(kv->key, "general.name")) continue;
        if (!strcmp(kv->key, "tokenizer.ggml.tokens")) {
            uint64_t n = kv->value.count, cursor = 0;
            const char **strs = calloc(n, sizeof *strs);
            size_t *lens = calloc(n, sizeof *lens);
            quill_gguf_value e;
            for (uint64_t k = 0; k < n && quill_gguf_array_next(&kv->value, &cursor, &e); k++) {
                strs[k] = (const char *)e.data;
                lens[k] = e.count;
            }
            strs[300] = "\xe2\x96\x81\xff";
            lens[300] = 4;
            ok = quill_gguf_writer_add_str_arr(w, kv->key, strs, lens, n) == QUILL_OK;
            free(strs);
            free(lens);
            continue;
        }
        ok = quill_gguf_writer_add_value(w, kv->key, &kv->value) == QUILL_OK;
    }
    ok = ok && quill_gguf_writer_add_str(w, "general.name", "\xff" "bad \xc3(name", 11) == QUILL_OK;
    for (uint64_t i = 0; ok && i < quill_gguf_n_tensors(g); i++) {
        const quill_gguf_tensor *t = quill_gguf_tensor_at(g, i);
        ok = quill_gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data) == QUILL_OK;
    }
    ok = ok && quill_gguf_writer_write(w, dst, &err) == QUILL_OK;
    quill_gguf_writer_free(w);
    quill_gguf_close(g);
    free(src);
    if (!ok) {
        free(dst);
        return NULL;
    }
    return dst;
}

static bool valid_utf8(const char *s) {
    const unsigned char *u = (const unsigned char *)s;
    while (*u) {
        int n = *u < 0x80 ? 1 : (*u >> 5) == 6 ? 2 : (*u >> 4) == 14 ? 3 : (*u >> 3) == 30 ? 4 : 0;
        if (!n) return false;
        for (int i = 1; i < n; i++)
            if ((u[i] & 0xC0) != 0x80) return false;
        u += n;
    }
    return true;
}

/* inspect --json and tokenize --json print valid JSON (and UTF-8) whatever bytes the metadata
 * holds: invalid sequences come out as U+FFFD. */
TEST(cli_json_output_with_invalid_utf8_metadata) {
    REQUIRE_SHARED(shared);
    char *model = invalid_utf8_model(shared), *out = NULL;
    CHECK(model != NULL, "cannot write the model copy");
    int rc = quill(&out, "inspect --json %s 2>/dev/null", model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK(valid_utf8(out), "inspect --json wrote bytes that are not UTF-8");
    cJSON *j = cJSON_Parse(out);
    CHECK(j != NULL, "inspect --json is not JSON");
    cJSON_Delete(j);
    CHECK_STR_CONTAINS(out, "\"\xef\xbf\xbd" "bad \xef\xbf\xbd(name\"");
    free(out);
    rc = quill(&out, "tokenize -m %s -p 'the cat' --json 2>/dev/null", model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    j = cJSON_Parse(out);
    CHECK(j != NULL && valid_utf8(out), "tokenize --json: %s", out);
    cJSON_Delete(j);
    free(out);
    /* token 300 itself, through a prompt made of its bytes */
    rc = quill(&out, "tokenize -m %s -p \"$(printf '\\377')\" --json --no-bos 2>/dev/null", model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "\"tokens\": [300]");
    j = cJSON_Parse(out);
    CHECK(j != NULL && valid_utf8(out), "tokenize --json: %s", out);
    cJSON_Delete(j);
    free(out);
    free(model);
}

/* quantize writes under a temporary name and renames at the end, refuses to replace an existing
 * file without --force, and refuses a file with no tensors. */
TEST(cli_quantize_temporary_name_force_and_no_tensors) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-k-f32.gguf"), *small = stories(shared), *vocab = path_join(shared, "tokenizer/ggml-vocab-llama-spm.gguf");
    char *dir = path_join(tmp_dir(), "quantize"), *out_path = path_join(dir, "q8.gguf"), *text = NULL, cmd[4096];
    snprintf(cmd, sizeof cmd, "mkdir -p %s", dir);
    CHECK(run_cmd(cmd, NULL, false) == 0);
    int rc = quill(&text, "quantize %s %s q8_0 -t 1", model, out_path);
    CHECK(rc == 0, "exit %d: %s", rc, text);
    free(text);
    size_t size1 = 0;
    void *first = read_file(out_path, &size1);
    CHECK(first && size1 > 0, "no output file");
    free(first);
    /* nothing but the finished file is left in the folder */
    snprintf(cmd, sizeof cmd, "ls %s", dir);
    rc = run_cmd(cmd, &text, false);
    CHECK(rc == 0 && !strcmp(text, "q8.gguf\n"), "folder holds: %s", text);
    free(text);
    rc = quill(&text, "quantize %s %s q4_0 -t 1", model, out_path);
    CHECK(rc == 1, "overwrote without --force: exit %d: %s", rc, text);
    CHECK_STR_CONTAINS(text, "already exists; pass --force");
    free(text);
    size_t size2 = 0;
    void *again = read_file(out_path, &size2);
    CHECK(again && size2 == size1, "the existing file changed");
    free(again);
    rc = quill(&text, "quantize %s %s q4_0 -t 1 --force", model, out_path);
    CHECK(rc == 0, "exit %d: %s", rc, text);
    free(text);
    void *third = read_file(out_path, &size2);
    CHECK(third && size2 < size1, "--force did not replace the file (%zu vs %zu bytes)", size2, size1);
    free(third);
    char *vocab_out = path_join(dir, "vocab-q4.gguf");
    rc = quill(&text, "quantize %s %s q4_0", vocab, vocab_out);
    CHECK(rc == 1, "exit %d: %s", rc, text);
    CHECK_STR_CONTAINS(text, "holds no tensors");
    free(text);
    CHECK(access(vocab_out, F_OK) != 0, "a file was written for a vocabulary-only input");
    /* a quantization that fails halfway (stories260K's 172-wide rows do not fit q8_0) leaves nothing */
    char *failed_out = path_join(dir, "failed.gguf");
    rc = quill(&text, "quantize %s %s q8_0 -t 1", small, failed_out);
    CHECK(rc == 1, "exit %d: %s", rc, text);
    free(text);
    snprintf(cmd, sizeof cmd, "ls %s", dir);
    rc = run_cmd(cmd, &text, false);
    CHECK(rc == 0 && !strcmp(text, "q8.gguf\n"), "folder holds: %s", text);
    free(text);
    free(failed_out), free(small);
    free(vocab_out), free(model), free(vocab), free(dir), free(out_path);
}
