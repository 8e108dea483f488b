/* Chat prompts from the model's own template, and the interactive `quill chat` session. */
#include "golden.h"
#include "test.h"

#include <stdlib.h>
#include <string.h>

TEST(chat_model_template_tokens_match_golden) {
    REQUIRE_SHARED(shared);
    golden_case gc;
    CHECK(golden_load(shared, "synth-32k-q4_k_m-chat", &gc), "cannot load the chat case");
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(gc.model_path, &m, &err) == QUILL_OK, "%s", err.message);
    char *tmpl, *text;
    CHECK(quill_chat_template_for(m, NULL, NULL, &tmpl, &err) == QUILL_OK, "%s", err.message);
    quill_chat_message msg = {"user", "What is the capital of France?"};
    int32_t *ids;
    size_t n;
    CHECK(quill_chat_tokenize(m, tmpl, &msg, 1, true, &ids, &n, &text, &err) == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(text, "<|user|>\nWhat is the capital of France?</s>\n<|assistant|>\n"), "rendered %s", text);
    CHECK_EQ_INT(n, gc.n_prompt);
    for (size_t i = 0; i < n; i++) CHECK(ids[i] == gc.prompt_tokens[i], "token %zu: %d vs %d", i, ids[i], gc.prompt_tokens[i]);
    /* a built-in format never replaces the model's own template */
    char *again;
    CHECK(quill_chat_template_for(m, NULL, "chatml", &again, &err) == QUILL_OK, "%s", err.message);
    CHECK(!strcmp(again, tmpl), "the model's template must win over --chat-format");
    free(again);
    free(ids);
    free(text);
    free(tmpl);
    quill_model_free(m);
    golden_free(&gc);
}

TEST(chat_builtin_template_only_without_model_template) {
    REQUIRE_SHARED(shared);
    char *path = path_join(shared, "models/stories260K.gguf");
    quill_model *m;
    quill_error err;
    CHECK(quill_model_load(path, &m, &err) == QUILL_OK, "%s", err.message);
    free(path);
    char *tmpl = NULL;
    CHECK_EQ_INT(quill_chat_template_for(m, NULL, NULL, &tmpl, &err), QUILL_E_NOT_FOUND);
    CHECK_STR_CONTAINS(err.message, "--chat-format");
    CHECK_EQ_INT(quill_chat_template_for(m, NULL, "nonsense", &tmpl, &err), QUILL_E_ARG);
    CHECK_STR_CONTAINS(err.message, "chatml");
    CHECK(quill_chat_template_for(m, NULL, "llama2", &tmpl, &err) == QUILL_OK, "%s", err.message);
    /* Llama 2's template writes BOS itself: it must not be doubled */
    quill_chat_message msg = {"user", "Hi"};
    int32_t *ids;
    size_t n;
    CHECK(quill_chat_tokenize(m, tmpl, &msg, 1, true, &ids, &n, NULL, &err) == QUILL_OK, "%s", err.message);
    CHECK(n >= 2 && ids[0] == 1 && ids[1] != 1, "BOS doubled or missing: %d %d", ids[0], n > 1 ? ids[1] : -1);
    free(ids);
    free(tmpl);
    quill_model_free(m);
}

static long number_after(const char *s, const char *prefix) {
    const char *p = strstr(s, prefix);
    return p ? strtol(p + strlen(prefix), NULL, 10) : -1;
}

/* Two scripted turns through stdin: the second must evaluate only the tokens after the cached
 * conversation (the first turn's prompt and reply). */
TEST(chat_cli_second_turn_evaluates_only_new_tokens) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/synth-32k-q4_k_m.gguf");
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd,
             "printf 'Hello\\nWhat is the capital of France?\\n/tokens\\n/quit\\n' | %s chat -m %s -n 6 --temp 0 --verbose",
             quill_bin(), model);
    int rc = run_cmd(cmd, &out, true);
    free(model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    const char *t2 = strstr(out, "[turn 2: evaluating ");
    CHECK(t2 != NULL, "no second turn in: %s", out);
    /* "[N tokens in context]" after turn 1 */
    const char *mark = strstr(out, " tokens in context]");
    CHECK(mark != NULL, "no context report");
    const char *start = mark;
    while (start > out && start[-1] != '[') start--;
    long cached = strtol(start, NULL, 10);
    long fresh = number_after(t2, "[turn 2: evaluating ");
    long reused = number_after(strstr(t2, "tokens, "), "tokens, ");
    CHECK(reused == cached, "turn 2 reused %ld tokens, the cache held %ld", reused, cached);
    CHECK(fresh > 0 && fresh < 40, "turn 2 evaluated %ld new tokens", fresh);
    /* /tokens lists the whole second prompt: reused + fresh lines */
    const char *list = strstr(t2, "\n     1  \"<s>\"");
    CHECK(list != NULL, "no /tokens listing");
    long lines = 0;
    for (const char *p = list + 1; *p; p++) if (*p == '\n') lines++;
    CHECK(lines >= reused + fresh, "/tokens listed %ld lines, expected %ld", lines, reused + fresh);
    free(out);
}

TEST(chat_cli_commands_and_raw_mode) {
    REQUIRE_SHARED(shared);
    char *model = path_join(shared, "models/stories260K.gguf");
    char cmd[2048], *out = NULL;
    /* stories260K has no template: the session starts in raw mode and continues the text */
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\n/reset\\n/bogus\\n/quit\\n' | %s chat -m %s -n 12 --temp 0",
             quill_bin(), model);
    int rc = run_cmd(cmd, &out, true);
    free(model);
    CHECK(rc == 0, "exit %d: %s", rc, out);
    CHECK_STR_CONTAINS(out, "raw mode");
    CHECK_STR_CONTAINS(out, ", there was a little girl named Lily");
    CHECK_STR_CONTAINS(out, "[conversation cleared]");
    CHECK_STR_CONTAINS(out, "[unknown command /bogus");
    free(out);
}

/* A reply's reasoning is shown apart from the answer, or hidden: a model with Qwen 3's vocabulary
 * and DeepSeek R1's template (whose prompt opens <think>) reasons for the whole short reply. */
TEST(chat_cli_reasoning_shown_apart_or_hidden) {
    REQUIRE_SHARED(shared);
    char model[512], cmd[4096], *shown = NULL, *hidden = NULL, *raw = NULL;
    snprintf(model, sizeof model, "%s/chat-qwen3.gguf", tmp_dir());
    snprintf(cmd, sizeof cmd,
             "%s synth --arch qwen3 --embd 64 --layers 2 --heads 2 --kv-heads 1 --ff 128 "
             "--vocab %s/tokenizer/ggml-vocab-qwen3.gguf -o %s > /dev/null",
             quill_bin(), shared, model);
    CHECK(run_cmd(cmd, &raw, true) == 0, "synth: %s", raw);
    free(raw);
    const char *r1 = "chat/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja";
    snprintf(cmd, sizeof cmd, "printf 'What is 2+2?\\n/bye\\n' | %s chat -m %s --chat-template %s/%s -n 8 --temp 0",
             quill_bin(), model, shared, r1);
    CHECK(run_cmd(cmd, &shown, false) == 0, "chat: %s", shown);
    snprintf(cmd + strlen(cmd), sizeof cmd - strlen(cmd), " --hide-reasoning");
    CHECK(run_cmd(cmd, &hidden, false) == 0, "chat --hide-reasoning: %s", hidden);
    /* the same reply through `run` with the same prompt: the text the chat split */
    snprintf(cmd, sizeof cmd, "%s run -m %s --chat --chat-template %s/%s -p 'What is 2+2?' -n 8 --temp 0 --no-display-prompt 2>/dev/null",
             quill_bin(), model, shared, r1);
    CHECK(run_cmd(cmd, &raw, false) == 0, "run: %s", raw);
    remove(model);
    /* reasoning, a blank line, then the (empty) answer; hidden: nothing but the line end */
    size_t n = strlen(raw);
    while (n && raw[n - 1] == '\n') n--;
    raw[n] = 0;
    const char *text = raw;
    while (*text == ' ' || *text == '\n') text++;
    CHECK(*text && strstr(shown, text) != NULL, "the reasoning [%s] is not shown in [%s]", text, shown);
    CHECK(strstr(hidden, text) == NULL, "--hide-reasoning still shows it: [%s]", hidden);
    free(shown);
    free(hidden);
    free(raw);
}
