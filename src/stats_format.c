/*
 * stats_format.c -- the pool's statistics as text, generated from the one
 * list of fields in tidepool.h (TP_POOL_STAT_BYTES_LIST and
 * TP_POOL_STAT_COUNT_LIST). It sits beside pool.c and uses only the public
 * API.
 */
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

__attribute__((format(printf, 2, 3))) static void out_printf(text_out *out, const char *fmt, ...) {
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

static tp_status out_finish(const text_out *out, size_t *out_length) {
    if (out->failed) return TP_ERR_INVALID_ARGUMENT;
    if (out_length) *out_length = out->length;
    return out->length < out->capacity ? TP_OK : TP_ERR_BUFFER_TOO_SMALL;
}

tp_status tp_pool_stats_json(tp_pool *pool, char *buf, size_t capacity, size_t *out_length) {
    if (!pool || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    tp_pool_stats s;
    tp_status st = tp_pool_get_stats(pool, &s);
    if (st != TP_OK) return st;
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
    out_printf(&out, "{\"kind\":\"%s\"", s.kind == TP_POOL_VMM ? "vmm" : "segment");
#define JSON_BYTES_(name, kind, description)                                                                    \
    out_printf(&out, ",\"" #name "\":{\"current\":%llu,\"peak\":%llu,\"total\":%llu}",                          \
               (unsigned long long)s.name.current, (unsigned long long)s.name.peak, (unsigned long long)s.name.total);
#define JSON_COUNT_(name, kind, description) out_printf(&out, ",\"" #name "\":%llu", (unsigned long long)s.name);
    TP_POOL_STAT_BYTES_LIST(JSON_BYTES_)
    TP_POOL_STAT_COUNT_LIST(JSON_COUNT_)
#undef JSON_BYTES_
#undef JSON_COUNT_
    out_printf(&out, ",\"fragmentation\":%.6f}", s.fragmentation);
    return out_finish(&out, out_length);
}
