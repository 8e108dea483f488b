/* A chat reply shown while it is generated, for quill chat and quill run --chat: its reasoning
 * (<think>...</think>, gpt-oss's analysis channel) apart from the answer, dimmed on a terminal or
 * hidden, never as the answer. The reply so far is parsed as the server parses it
 * (chat_parse_output), and only what the parse adds is printed. */
#ifndef QUILL_CLI_REPLY_VIEW_H
#define QUILL_CLI_REPLY_VIEW_H

#include "chat/tool_calls.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct reply_view {
    chat_syntax syntax;         /* of the template (chat_syntax_detect) */
    bool hide, dim;             /* --hide-reasoning; a terminal */
    bool split;                 /* this reply is parsed (else its text is printed as it comes) */
    bool thinking_open;         /* the prompt ended inside <think> */
    size_t shown_reasoning, shown_content;
    bool in_reasoning;
} reply_view;

/* A new reply to the prompt `rendered` (raw: no template, the text as it comes). */
void reply_view_begin(reply_view *v, const char *rendered, bool raw);
/* Whether the generator must write special tokens into the text (harmony's channel marks). */
bool reply_view_needs_special(const reply_view *v);
/* Prints what text[0..len) adds; `final`: the reply is whole (then the colour is reset). */
void reply_view_show(reply_view *v, const char *text, size_t len, bool final);

#endif
