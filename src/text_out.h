/* SPDX-License-Identifier: MIT */
/*
 * text_out.h -- appending formatted text to a caller's buffer the way the
 * *_json and *_openmetrics calls promise: always NUL-terminated when there
 * is room, the full length counted even past the end, and
 * TP_ERR_BUFFER_TOO_SMALL when it did not fit.
 */
#ifndef TIDEPOOL_TEXT_OUT_H
#define TIDEPOOL_TEXT_OUT_H

#include "internal.h"

#include <stdarg.h>

/* Appends to buf like snprintf, counting the full length even past the
 * end of the buffer. */
typedef struct text_out {
    char *buf;
    size_t capacity;
    size_t length;
    bool failed;
} text_out;

__attribute__((format(printf, 2, 3))) static inline void out_printf(text_out *out, const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    size_t room = out->length < out->capacity ? out->capacity - out->length : 0;
    int n = vsnprintf(room ? out->buf + out->length : NULL, room, fmt, args);
    va_end(args);
    if (n < 0)
        out->failed = true;
    else
        out->length += (size_t)n;
}

static inline tp_status out_finish(const text_out *out, size_t *out_length) {
    if (out->failed) return TP_ERR_INVALID_ARGUMENT;
    if (out_length) *out_length = out->length;
    return out->length < out->capacity ? TP_OK : TP_ERR_BUFFER_TOO_SMALL;
}

#endif /* TIDEPOOL_TEXT_OUT_H */
