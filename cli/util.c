/* Helpers every command shares: messages, JSON strings, files, numbers. Kept apart from main()
 * so that the fuzz target for the option parser links them. */
#include "cli.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int cli_fail(const char *fmt, ...) {
    va_list ap;
    fputs("quill: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    return 1;
}

/* Length of the valid UTF-8 character at s (at most n bytes), or 0 when the bytes there are not
 * one (overlong forms, surrogates and code points past U+10FFFF included). */
static size_t utf8_char_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 0;
    if (n < need || s[1] < lo || s[1] > hi) return 0;
    for (size_t i = 2; i < need; i++)
        if (s[i] < 0x80 || s[i] > 0xBF) return 0;
    return need;
}

void cli_json_string(FILE *f, const char *s, size_t len) {
    const unsigned char *u = (const unsigned char *)s;
    fputc('"', f);
    for (size_t i = 0; i < len;) {
        unsigned char c = u[i];
        if (c >= 0x80) {
            /* JSON text is UTF-8: bytes that are not (metadata is untrusted) become U+FFFD. */
            size_t k = utf8_char_len(u + i, len - i);
            if (k) fwrite(u + i, 1, k, f);
            else fputs("\xef\xbf\xbd", f);
            i += k ? k : 1;
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20 || c == 0x7F) fprintf(f, "\\u%04x", c);
            else fputc(c, f);
        }
        i++;
    }
    fputc('"', f);
}

char *cli_read_stream(FILE *f, size_t *len) {
    size_t cap = 4096, n = 0, got;
    char *buf = malloc(cap + 1);
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *grown = cap < ((size_t)1 << 30) ? realloc(buf, cap * 2 + 1) : NULL;
            if (!grown) {
                free(buf);
                errno = ENOMEM;
                return NULL;
            }
            buf = grown;
            cap *= 2;
        }
    }
    if (!buf || ferror(f)) {
        free(buf);
        return NULL;
    }
    buf[n] = 0;
    if (len) *len = n;
    return buf;
}

bool cli_text_append(char **text, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t grown_cap = (*len + n + 1) * 2;
        char *grown = realloc(*text, grown_cap);
        if (!grown) return false;
        *text = grown;
        *cap = grown_cap;
    }
    if (n) memcpy(*text + *len, s, n);
    *len += n;
    (*text)[*len] = 0;
    return true;
}

char *cli_read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = cli_read_stream(f, len);
    fclose(f);
    return buf;
}

bool cli_parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_double(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool cli_parse_cache_type(const char *command, const char *flag, const char *value, quill_type *out) {
    quill_error err;
    if (quill_cache_type_parse(value, out, &err) == QUILL_OK) return true;
    cli_fail("%s: %s: %s", command, flag, err.message);
    return false;
}

bool cli_parse_backend(const char *command, const char *value, quill_backend *out) {
    if (!strcmp(value, "cpu")) *out = QUILL_BACKEND_CPU;
    else if (!strcmp(value, "vulkan")) *out = QUILL_BACKEND_VULKAN;
    else {
        cli_fail("%s: --backend %s: the backends are cpu and vulkan", command, value);
        return false;
    }
    return true;
}
