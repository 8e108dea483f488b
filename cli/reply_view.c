/* A chat reply shown while it is generated (see reply_view.h). */
#include "reply_view.h"

#include <stdio.h>
#include <string.h>

void reply_view_begin(reply_view *v, const char *rendered, bool raw) {
    v->shown_reasoning = v->shown_content = 0;
    v->in_reasoning = false;
    v->split = !raw && (v->syntax.think_tags || v->syntax.tools == TOOL_SYNTAX_GPT_OSS);
    v->thinking_open = false;
    if (v->split) {
        /* a prompt that ends inside <think> makes the reply begin with reasoning */
        size_t rl = rendered ? strlen(rendered) : 0;
        while (rl && (rendered[rl - 1] == '\n' || rendered[rl - 1] == ' ')) rl--;
        v->thinking_open = rl >= 7 && !memcmp(rendered + rl - 7, "<think>", 7);
    }
}

bool reply_view_needs_special(const reply_view *v) { return v->split && v->syntax.tools == TOOL_SYNTAX_GPT_OSS; }

void reply_view_show(reply_view *v, const char *text, size_t len, bool final) {
    if (!v->split) return;   /* the caller printed the text as it came */
    chat_parse_options po = {.partial = !final, .extract_reasoning = true, .thinking_open = v->thinking_open};
    chat_parse p;
    if (chat_parse_output(&v->syntax, &po, text ? text : "", len, &p, NULL) != QUILL_OK) return;
    size_t rn = strlen(p.reasoning), cn = strlen(p.content);
    if (rn > v->shown_reasoning) {
        if (!v->hide) {
            if (v->dim && !v->in_reasoning) fputs("\033[2m", stdout);
            v->in_reasoning = true;
            fwrite(p.reasoning + v->shown_reasoning, 1, rn - v->shown_reasoning, stdout);
        }
        v->shown_reasoning = rn;
    }
    if (cn > v->shown_content || (final && v->in_reasoning)) {
        if (v->in_reasoning) {
            fputs(v->dim ? "\033[0m\n\n" : "\n\n", stdout);
            v->in_reasoning = false;
        }
        fwrite(p.content + v->shown_content, 1, cn - v->shown_content, stdout);
        v->shown_content = cn;
    }
    fflush(stdout);
    chat_parse_free(&p);
}
