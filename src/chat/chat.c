/* Chat prompts for a loaded model: which template applies, and the tokens it renders to.
 *
 * The room src/chat/: conversations: which template applies, the variables every front end gives
 * it and the tokens it renders to (this file), and each template family's tool-call and reasoning
 * syntax (tool_calls.c: reading replies, and the GBNF of a forced call for src/sampling/). It calls
 * the template engine (src/jinja/) and the tokenizer; the CLI and the server call it.
 */
#include "base/error.h"
#include "base/strbuf.h"
#include "quill_chat.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

quill_status quill_chat_template_for(const quill_model *m, const char *override_src, const char *format,
                                     char **out, quill_error *err) {
    *out = NULL;
    const char *src = override_src;
    size_t len = src ? strlen(src) : 0;
    if (!src) {
        const char *s;
        size_t n;
        quill_status st = quill_gguf_get_str(quill_model_gguf(m), "tokenizer.chat_template", &s, &n, err);
        if (st == QUILL_OK) {
            src = s;
            len = n;
        } else if (st != QUILL_E_NOT_FOUND) {
            return st;
        }
    }
    /* A named built-in template is a fallback for models without one: the model's own template
     * is what it was trained with, so it wins. */
    if (!src && format) {
        src = quill_chat_builtin_template(format);
        if (!src) {
            char names[256] = "";
            for (const char *const *n = quill_chat_builtin_names(); *n; n++) {
                if (names[0]) strncat(names, ", ", sizeof names - strlen(names) - 1);
                strncat(names, *n, sizeof names - strlen(names) - 1);
            }
            return quill_fail(err, QUILL_E_ARG, "unknown chat format '%s' (known: %s)", format, names);
        }
        len = strlen(src);
    }
    if (!src)
        return quill_fail(err, QUILL_E_NOT_FOUND,
                          "%s has no chat template (tokenizer.chat_template); pass --chat-template FILE "
                          "or --chat-format NAME",
                          quill_gguf_path(quill_model_gguf(m)));
    if (memchr(src, 0, len)) return quill_fail(err, QUILL_E_TEMPLATE, "the chat template contains a NUL byte");
    *out = malloc(len + 1);
    if (!*out) return quill_fail(err, QUILL_E_NOMEM, "out of memory");
    memcpy(*out, src, len);
    (*out)[len] = 0;
    return QUILL_OK;
}

void quill_chat_inputs_common(const quill_tokenizer *tok, quill_chat_inputs *in) {
    if (tok) {
        int32_t bos = quill_tokenizer_bos(tok), eos = quill_tokenizer_eos(tok);
        in->bos_token = bos >= 0 ? quill_tokenizer_piece(tok, bos) : "";
        in->eos_token = eos >= 0 ? quill_tokenizer_piece(tok, eos) : "";
    }
    /* local time, as the reference's strftime_now gives it */
    time_t now = time(NULL);
    struct tm lt;
    long offset = localtime_r(&now, &lt) ? lt.tm_gmtoff : 0;
    in->has_now = true;
    in->now = (int64_t)now + offset;
}

/* The messages as a JSON list of {"role", "content"} (malloc'd), for quill_chat_render_inputs. */
static char *messages_json(const quill_chat_message *msgs, size_t n) {
    strbuf b = {0};
    strbuf_put(&b, "[", 1);
    for (size_t i = 0; i < n; i++) {
        const char *fields[2] = {msgs[i].role, msgs[i].content};
        strbuf_puts(&b, i ? ",{\"role\":" : "{\"role\":");
        for (int f = 0; f < 2; f++) {
            if (f) strbuf_puts(&b, ",\"content\":");
            strbuf_put(&b, "\"", 1);
            for (const unsigned char *p = (const unsigned char *)fields[f]; p && *p; p++) {
                if (*p == '"' || *p == '\\') {
                    char esc[2] = {'\\', (char)*p};
                    strbuf_put(&b, esc, 2);
                } else if (*p < 0x20) {
                    strbuf_printf(&b, "\\u%04x", *p);
                } else {
                    strbuf_put(&b, (const char *)p, 1);
                }
            }
            strbuf_put(&b, "\"", 1);
        }
        strbuf_put(&b, "}", 1);
    }
    strbuf_put(&b, "]", 1);
    return strbuf_take(&b);
}

quill_status quill_chat_tokenize(const quill_model *m, const char *template_src, const quill_chat_message *msgs,
                                 size_t n_msgs, bool add_generation_prompt, int32_t **tokens, size_t *n_tokens,
                                 char **text, quill_error *err) {
    const quill_tokenizer *tok = quill_model_tokenizer(m);
    for (size_t i = 0; i < n_msgs; i++)
        if (!msgs[i].role || !msgs[i].content)
            return quill_fail(err, QUILL_E_ARG, "quill_chat_tokenize: message %zu has a NULL role or content", i);
    char *json = messages_json(msgs, n_msgs);
    if (!json) return quill_fail(err, QUILL_E_NOMEM, "out of memory rendering a chat of %zu messages", n_msgs);
    quill_chat_inputs in = {.messages_json = json, .add_generation_prompt = add_generation_prompt};
    quill_chat_inputs_common(tok, &in);
    const char *bos_text = in.bos_token;
    char *rendered;
    quill_status s = quill_chat_render_inputs(template_src, &in, &rendered, err);
    free(json);
    if (s) return s;
    /* Templates such as Llama 2's write the BOS text themselves; adding BOS as well would
     * double it, so the tokenizer adds it only when the text does not already start with it. */
    bool starts_with_bos = bos_text && *bos_text && strncmp(rendered, bos_text, strlen(bos_text)) == 0;
    bool add_special = quill_tokenizer_add_bos(tok) && !starts_with_bos;
    s = quill_tokenize(tok, rendered, strlen(rendered), add_special, true, tokens, n_tokens, err);
    if (s == QUILL_OK && text) *text = rendered;
    else free(rendered);
    return s;
}
