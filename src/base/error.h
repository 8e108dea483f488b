/* Internal error and logging helpers shared by every library file. */
#ifndef QUILL_ERROR_H
#define QUILL_ERROR_H

#include "quill.h"

/* Fills *err (when not NULL) and returns `status`, so failures read `return quill_fail(...)`. */
quill_status quill_fail(quill_error *err, quill_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void quill_log(quill_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
