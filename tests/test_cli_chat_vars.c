/* The terminal commands give a template what the server gives it (quill_chat_inputs_common):
 * gpt-oss's own template, which prints the date with strftime_now, renders in quill template and
 * quill run --chat; and run --chat shows reasoning apart from the answer, as quill chat does. */
#include "server_util.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static const char *synth(const char *shared, const char *vocab, char *path, size_t cap) {
    snprintf(path, cap, "%s/chat-vars-%s.gguf", tmp_dir(), vocab);
    struct stat st;
    if (stat(path, &st) == 0) return path;
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "%s synth --arch qwen3 --embd 64 --layers 1 --heads 2 --kv-heads 1 --ff 64 --vocab %s/tokenizer/ggml-vocab-%s.gguf -o %s",
             quill_bin(), shared, vocab, path);
    int rc = run_cmd(cmd, &out, true);
    if (rc) test_fail(__FILE__, __LINE__, "synth failed: %s", out);
    free(out);
    return rc ? NULL : path;
}

TEST(cli_templates_get_the_servers_variables) {
    REQUIRE_SHARED(shared);
    char model[600], cmd[2048], msgs[600];
    CHECK(synth(shared, "gpt-oss", model, sizeof model));
    snprintf(msgs, sizeof msgs, "%s/chat-vars-messages.json", tmp_dir());
    FILE *f = fopen(msgs, "w");
    CHECK(f);
    fputs("[{\"role\": \"user\", \"content\": \"hi\"}]", f);
    fclose(f);
    char *out = NULL;
    snprintf(cmd, sizeof cmd, "%s template -m %s --messages %s", quill_bin(), model, msgs);
    int rc = run_cmd(cmd, &out, true);
    time_t now = time(NULL);
    struct tm lt;
    char today[32];
    strftime(today, sizeof today, "Current date: %Y-%m-%d", localtime_r(&now, &lt));
    CHECK(rc == 0 && strstr(out, today), "quill template with gpt-oss's template: rc %d [%s], wanted [%s]", rc, out, today);
    free(out);
    snprintf(cmd, sizeof cmd, "%s run -m %s --chat -p hi -n 4 --seed 1 --no-display-prompt", quill_bin(), model);
    rc = run_cmd(cmd, &out, true);
    CHECK(rc == 0, "quill run --chat with gpt-oss's template: rc %d [%s]", rc, out);
    free(out);
}

TEST(cli_run_chat_shows_reasoning_apart) {
    REQUIRE_SHARED(shared);
    char model[600], cmd[2048];
    CHECK(synth(shared, "qwen3", model, sizeof model));
    /* DeepSeek R1's template opens <think> in the prompt: every token of a short reply is reasoning */
    char *r1 = path_join(shared, "chat/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja");
    char *shown = NULL, *hidden = NULL;
    snprintf(cmd, sizeof cmd, "%s run -m %s --chat-template %s --chat -p hi -n 6 --seed 1 --no-display-prompt 2>/dev/null",
             quill_bin(), model, r1);
    int rc1 = run_cmd(cmd, &shown, false);
    snprintf(cmd, sizeof cmd,
             "%s run -m %s --chat-template %s --chat -p hi -n 6 --seed 1 --no-display-prompt --hide-reasoning 2>/dev/null",
             quill_bin(), model, r1);
    int rc2 = run_cmd(cmd, &hidden, false);
    free(r1);
    size_t visible = 0;
    for (const char *p = hidden ? hidden : ""; *p; p++) visible += *p != '\n' && *p != ' ';
    CHECK(rc1 == 0 && rc2 == 0 && shown && strlen(shown) > 2 && visible == 0,
          "reasoning shown [%s], hidden [%s] (rc %d, %d)", shown ? shown : "", hidden ? hidden : "", rc1, rc2);
    free(shown);
    free(hidden);
}
