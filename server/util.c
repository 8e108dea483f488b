/* Errors, UTF-8 and JSON checks shared by the server's routes and request parser. */
#include "server.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static const char *error_type(int status) {
    switch (status) {
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 503: return "unavailable_error";
    default: return status >= 500 ? "server_error" : "invalid_request_error";
    }
}

bool api_fail(api_error *e, int status, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = error_type(status);
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

/* Length of the valid UTF-8 sequence at s[0..n), or 0 when it is invalid or cut short:
 * shortest forms only, no surrogates, nothing above U+10FFFF. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    unsigned min;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) len = 2, min = 0x80, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) len = 3, min = 0x800, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) len = 4, min = 0x10000, cp = c & 0x07;
    else return 0;
    if (n < len) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

size_t utf8_valid_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0;
    while (i < n) {
        size_t len = utf8_char(u + i, n - i);
        if (!len) break;
        i += len;
    }
    return i;
}

char *utf8_sanitize(const char *s, size_t n) {
    char *out = malloc(n * 3 + 1);   /* each invalid byte becomes 3 bytes at most */
    if (!out) return NULL;
    const unsigned char *u = (const unsigned char *)s;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char(u + i, n - i);
        if (len) {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = 0;
    return out;
}

bool json_body_check(const char *body, size_t len, int max_depth, api_error *e) {
    size_t valid = utf8_valid_prefix(body, len);
    if (valid != len)
        return api_fail(e, 400, NULL, "the request body is not valid UTF-8 (invalid byte 0x%02x at offset %zu)",
                        (unsigned char)body[valid], valid);
    if (memchr(body, 0, len)) return api_fail(e, 400, NULL, "the request body contains a NUL byte");
    /* cJSON recurses once per nesting level; a bound here keeps hostile bodies from deep stacks */
    int depth = 0;
    bool in_string = false;
    for (size_t i = 0; i < len; i++) {
        char c = body[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '[' || c == '{') {
            if (++depth > max_depth)
                return api_fail(e, 400, NULL, "the request's JSON nests deeper than %d levels", max_depth);
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return true;
}
