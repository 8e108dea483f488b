/* libquill chat templates: a Jinja2 interpreter for the `tokenizer.chat_template` that models ship.
 *
 * Templates render the way Hugging Face renders them (Jinja2 with trim_blocks and lstrip_blocks
 * on, the loopcontrols extension, the immutable sandbox, `raise_exception(msg)` and a `tojson`
 * filter that is json.dumps with ensure_ascii off), because that is the text the models were
 * trained on. `tools` is defined only when given (quill_chat_render_json); `strftime_now(fmt)` only
 * when a time is given (quill_chat_render_inputs).
 *
 * A template is untrusted input: a bad one yields QUILL_E_TEMPLATE with a message naming the line
 * and column ("chat template syntax error at line 3, column 5: unknown tag 'foo'"), never a crash.
 * Nesting, recursion, output size and work are bounded. Everything here is thread-safe: there is
 * no global state. */
#ifndef QUILL_CHAT_H
#define QUILL_CHAT_H

#include "quill.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct quill_chat_message {
    const char *role;     /* "system", "user", "assistant", ... */
    const char *content;  /* UTF-8 text */
} quill_chat_message;

/* Renders `template_src` (NUL-terminated) with the variables `messages` (a list of
 * {"role", "content"} dicts), `bos_token`, `eos_token` (NULL means "") and
 * `add_generation_prompt`. On success *out is a malloc'd NUL-terminated string the caller frees;
 * on failure *out is NULL. Errors: QUILL_E_ARG (NULL template/out, a message with a NULL field),
 * QUILL_E_TEMPLATE (syntax error, runtime error or raise_exception), QUILL_E_NOMEM. */
QUILL_API quill_status quill_chat_render(const char *template_src, const quill_chat_message *msgs, size_t n_msgs,
                                         const char *bos_token, const char *eos_token, bool add_generation_prompt,
                                         char **out, quill_error *err);

/* The same, with the conversation as JSON text in OpenAI's shapes, so that tool-use templates see
 * what Jinja2 sees after json.loads: `messages_json` is a list of message objects (or a request
 * body {"messages": [...], "tools": [...]}) whose fields
 * reach the template as they are (content null with "tool_calls", content as a list of
 * {"type": "text", "text": ...} parts, "tool_call_id", "name", ...); `tools_json` (NULL: `tools`
 * stays undefined) is a JSON list passed as `tools`. Each message needs a string "role".
 * Errors: QUILL_E_ARG for JSON that is malformed or not of that shape (naming the byte offset),
 * else as quill_chat_render. */
QUILL_API quill_status quill_chat_render_json(const char *template_src, const char *messages_json,
                                              const char *tools_json, const char *bos_token, const char *eos_token,
                                              bool add_generation_prompt, char **out, quill_error *err);

/* Everything a render can be given, for quill_chat_render_inputs. */
typedef struct quill_chat_inputs {
    const char *messages_json;  /* as quill_chat_render_json's; required */
    const char *tools_json;     /* a JSON list passed as `tools`; NULL: undefined */
    const char *extra_json;     /* NULL, or a JSON object whose members become variables (the
                                 * reference's chat_template_kwargs: enable_thinking,
                                 * reasoning_effort, ...); they never replace the ones below */
    const char *bos_token, *eos_token;
    bool add_generation_prompt;
    bool has_now;               /* defines strftime_now(fmt): `now` (Unix seconds) formatted as
                                 * C's strftime does, in UTC; add the UTC offset for local time */
    int64_t now;
} quill_chat_inputs;

/* quill_chat_render_json with every input: the same errors, and QUILL_E_ARG when extra_json is
 * not a JSON object. */
QUILL_API quill_status quill_chat_render_inputs(const char *template_src, const quill_chat_inputs *in, char **out,
                                                quill_error *err);

/* Parses a template without rendering it: QUILL_OK or the syntax error render would report.
 * Runtime errors (undefined attributes, raise_exception) depend on the messages and are not found. */
QUILL_API quill_status quill_chat_check(const char *template_src, quill_error *err);

/* The Jinja source a model family publishes, for models whose GGUF carries no template:
 * "chatml", "llama2", "llama3", "zephyr", "mistral", "gemma". NULL for an unknown name. */
QUILL_API const char *quill_chat_builtin_template(const char *name);

/* The names quill_chat_builtin_template() knows, NULL-terminated. */
QUILL_API const char *const *quill_chat_builtin_names(void);

#ifdef __cplusplus
}
#endif

#endif
