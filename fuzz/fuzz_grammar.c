/* libFuzzer target for constrained decoding's parsers (src/sampling/grammar*.c, json_schema.c). The
 * input, split at its first NUL byte, is a grammar and a text: the grammar is parsed as GBNF and,
 * when accepted, the text is fed to a matcher in pieces and whole (both must agree); the whole
 * input is also converted as a JSON Schema, whose grammar, when the schema is accepted, must
 * parse. A refusal must carry a message. Any broken promise aborts. */
#include "quill.h"

#include <stdlib.h>
#include <string.h>

static void check_grammar(const char *text, size_t len, const char *sample, size_t sample_len) {
    quill_grammar *g = NULL;
    quill_error err = {0};
    quill_status st = quill_grammar_parse(NULL, text, len, NULL, &g, &err);
    if (st) {
        if (g || !err.message[0]) abort();
        return;
    }
    const bool whole = quill_grammar_accepts(g, sample, sample_len);
    quill_grammar_matcher *m;
    if (quill_grammar_matcher_new(g, NULL, &m, &err) == QUILL_OK) {
        /* the same text one byte at a time: the same answer */
        bool ok = true;
        for (size_t i = 0; i < sample_len && ok; i++) ok = quill_grammar_matcher_accept_text(m, sample + i, 1);
        const bool bytewise = ok && quill_grammar_matcher_can_end(m);
        if (bytewise != whole && !quill_grammar_matcher_is_dead(m)) abort();
        quill_grammar_matcher_free(m);
    }
    quill_grammar_free(g);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *text = (const char *)data;
    const char *nul = memchr(text, 0, size);
    size_t glen = nul ? (size_t)(nul - text) : size;
    const char *sample = nul ? nul + 1 : "";
    size_t sample_len = nul ? size - glen - 1 : 0;
    check_grammar(text, glen, sample, sample_len);

    char *gbnf = NULL;
    quill_error err = {0};
    quill_status st = quill_json_schema_to_grammar(text, size, &gbnf, &err);
    if (st) {
        if (gbnf || !err.message[0]) abort();
        return 0;
    }
    quill_grammar *g = NULL;
    if (quill_grammar_parse(NULL, gbnf, strlen(gbnf), NULL, &g, &err) != QUILL_OK) abort();
    quill_grammar_free(g);
    free(gbnf);
    return 0;
}
