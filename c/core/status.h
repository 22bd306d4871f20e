/* Error reporting without global state: a caller owns an mg_error and passes it down. */
#ifndef MG_STATUS_H
#define MG_STATUS_H

#include <stdarg.h>
#include <stdio.h>

typedef struct mg_error {
    char msg[1024];
} mg_error;

/* Formats the message into err (when err is not NULL) and returns -1, so that
 * `return mg_fail(err, "...", ...);` reads as one statement. */
static inline int mg_fail(mg_error *err, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

#endif
