/* A growable NUL-terminated text, for code that writes text piece by piece (grammars generated
 * from schemas, tool-call arguments). A failed allocation sets `oom` and later writes do nothing,
 * so a writer checks once at the end instead of after every piece. */
#ifndef QUILL_STRBUF_H
#define QUILL_STRBUF_H

#include <stdbool.h>
#include <stddef.h>

typedef struct strbuf {
    char *buf;              /* NULL until the first write */
    size_t len, cap;
    bool oom;
} strbuf;

void strbuf_put(strbuf *b, const char *s, size_t n);
void strbuf_puts(strbuf *b, const char *s);
void strbuf_printf(strbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define strbuf_lit(b, s) strbuf_put((b), (s), sizeof(s) - 1)
/* The text, now the caller's ("" when nothing was written; NULL after a failed allocation); the
 * buffer is empty again. */
char *strbuf_take(strbuf *b);

#endif
