#include "base/error.h"

#include <stdarg.h>
#include <stdio.h>

static quill_log_fn log_fn;
static void *log_user;

void quill_set_log(quill_log_fn fn, void *user) {
    log_fn = fn;
    log_user = user;
}

void quill_log(quill_log_level level, const char *fmt, ...) {
    if (!log_fn) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    log_fn(level, buf, log_user);
}

quill_status quill_fail(quill_error *err, quill_status status, const char *fmt, ...) {
    if (err) {
        err->status = status;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return status;
}

const char *quill_status_name(quill_status s) {
    switch (s) {
    case QUILL_OK: return "ok";
    case QUILL_E_IO: return "I/O error";
    case QUILL_E_FORMAT: return "malformed file";
    case QUILL_E_UNSUPPORTED: return "unsupported";
    case QUILL_E_NOMEM: return "out of memory";
    case QUILL_E_ARG: return "invalid argument";
    case QUILL_E_NOT_FOUND: return "not found";
    case QUILL_E_CONTEXT: return "context full";
    case QUILL_E_TEMPLATE: return "template error";
    }
    return "unknown error";
}
