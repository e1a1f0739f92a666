/* SPDX-License-Identifier: MIT */
/*
 * trace_text.c -- the CSV line parser (trace_text.h).
 *
 * Two paths with one meaning. The careful path (trace_text_parse_line)
 * copies a line, splits it at commas and parses each field strictly: only
 * digits (or 0x and hex digits for addresses; the RMM time syntax), no
 * overflow, exactly the expected fields; a line longer than
 * TRACE_LINE_MAX_BYTES or holding a NUL byte is "too long or not text";
 * blank lines and any CRs before the newline are accepted. The fast path
 * takes only the common shape of a tidepool line --
 * DIGITS,alloc|free,DIGITS,DIGITS,DIGITS then LF, CR LF or the end of the
 * text, each number at most 19 digits (so no overflow check), the time at
 * most UINT64_MAX / 1000 us, the line within the length limit -- reading
 * numbers eight digits at a time, with no copy. Anything else (hex
 * addresses, a 20-digit number, RMM lines, blank lines with CR, every
 * error) goes to the careful path, which decides: so both paths accept the
 * same lines with the same values, and errors say exactly what the careful
 * path says.
 *
 * Invariant: the fast path accepts a line only if the careful path
 * accepts it with the same event (tests/tools/test_trace_text.c checks
 * this on generated and mutated lines).
 */
#include "trace_text.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------ the careful path */

/* Splits line at commas into exactly n fields; more or fewer is an error. */
static bool split_fields(char *line, char **fields, int n) {
    int count = 0;
    char *p = line;
    for (;;) {
        fields[count++] = p;
        char *comma = strchr(p, ',');
        if (!comma) break;
        if (count == n) return false; /* a field too many */
        *comma = '\0';
        p = comma + 1;
    }
    return count == n;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!*s) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* Decimal, or hexadecimal with 0x. */
static bool parse_pointer(const char *s, uint64_t *out) {
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        if (!*s) return false;
        uint64_t v = 0;
        for (; *s; s++) {
            int d;
            if (*s >= '0' && *s <= '9') d = *s - '0';
            else if (*s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
            else if (*s >= 'A' && *s <= 'F') d = *s - 'A' + 10;
            else return false;
            if (v >> 60) return false;
            v = (v << 4) | (uint64_t)d;
        }
        *out = v;
        return true;
    }
    return parse_u64(s, out);
}

/* RMM time: fractional seconds ("1634567890.123456") or "HH:MM:SS.ffffff". */
static bool parse_rmm_time(const char *s, uint64_t *out_ns) {
    uint64_t whole = 0, frac_ns = 0;
    const char *dot = strchr(s, '.');
    char head[40];
    size_t head_len = dot ? (size_t)(dot - s) : strlen(s);
    if (head_len == 0 || head_len >= sizeof head) return false;
    memcpy(head, s, head_len);
    head[head_len] = '\0';
    if (strchr(head, ':')) { /* H:MM:SS, each part digits only (no sscanf: its %u wraps hours past 2^32) */
        char *minutes = strchr(head, ':'), *seconds = strchr(minutes + 1, ':');
        if (!seconds || strchr(seconds + 1, ':')) return false;
        *minutes++ = '\0';
        *seconds++ = '\0';
        uint64_t h, m, sec;
        if (!parse_u64(head, &h) || !parse_u64(minutes, &m) || !parse_u64(seconds, &sec) || m > 59 || sec > 60 ||
            h > UINT64_MAX / 1000000000ull / 3600 - 1)
            return false;
        whole = h * 3600 + m * 60 + sec;
    } else if (!parse_u64(head, &whole)) {
        return false;
    }
    if (dot) {
        const char *f = dot + 1;
        int digits = 0;
        if (!*f) return false;
        for (; *f; f++, digits++) {
            if (!isdigit((unsigned char)*f)) return false;
            if (digits < 9) frac_ns = frac_ns * 10 + (uint64_t)(*f - '0');
        }
        for (; digits < 9; digits++) frac_ns *= 10;
    }
    if (whole > UINT64_MAX / 1000000000ull - 1) return false;
    *out_ns = whole * 1000000000ull + frac_ns;
    return true;
}

static uint32_t fold_stream(uint64_t v) { return (uint32_t)(v ^ (v >> 32)); }

void trace_text_printable(char *text) {
    for (unsigned char *c = (unsigned char *)text; *c; c++)
        if (*c < 0x20 || *c == 0x7f) *c = '?';
}

/* what echoes the file's bytes: control bytes (a terminal's escapes) become '?' */
#define BAD(...)                                    \
    do {                                            \
        snprintf(what, what_capacity, __VA_ARGS__); \
        trace_text_printable(what);                 \
        return -1;                                  \
    } while (0)

int trace_text_parse_line(trace_format format, const char *text, size_t length, trace_event *e, char *what,
                          size_t what_capacity) {
    char line[TRACE_LINE_MAX_BYTES + 1];
    if (length > TRACE_LINE_MAX_BYTES || memchr(text, '\0', length)) BAD("line too long or not text");
    memcpy(line, text, length);
    size_t n = length;
    line[n] = '\0';
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
    if (!n) return 0;
    char *f[6];
    if (format == TRACE_FORMAT_TIDEPOOL) {
        if (!split_fields(line, f, 5)) BAD("expected 5 comma-separated fields (time_us,action,addr,size,stream)");
        uint64_t t_us, stream;
        if (!parse_u64(f[0], &t_us) || t_us > UINT64_MAX / 1000) BAD("bad time_us '%.40s'", f[0]);
        e->time_ns = t_us * 1000;
        if (strcmp(f[1], "alloc") == 0) e->action = TRACE_ALLOC;
        else if (strcmp(f[1], "free") == 0) e->action = TRACE_FREE;
        else BAD("bad action '%.40s' (expected alloc or free)", f[1]);
        if (!parse_pointer(f[2], &e->address)) BAD("bad addr '%.40s'", f[2]);
        if (!parse_u64(f[3], &e->bytes)) BAD("bad size '%.40s'", f[3]);
        if (!parse_u64(f[4], &stream)) BAD("bad stream '%.40s'", f[4]);
        e->stream = fold_stream(stream);
    } else {
        if (!split_fields(line, f, 6)) BAD("expected 6 comma-separated fields (Thread,Time,Action,Pointer,Size,Stream)");
        uint64_t thread, stream;
        if (!parse_pointer(f[0], &thread)) BAD("bad Thread '%.40s'", f[0]);
        if (!parse_rmm_time(f[1], &e->time_ns)) BAD("bad Time '%.40s'", f[1]);
        if (strcmp(f[2], "allocate") == 0) e->action = TRACE_ALLOC;
        else if (strcmp(f[2], "free") == 0 || strcmp(f[2], "deallocate") == 0) e->action = TRACE_FREE;
        else if (strcmp(f[2], "allocate failure") == 0 || strcmp(f[2], "allocate_failure") == 0)
            e->action = TRACE_ALLOC_FAILURE;
        else BAD("bad Action '%.40s' (expected allocate, free or allocate failure)", f[2]);
        if (!parse_pointer(f[3], &e->address)) BAD("bad Pointer '%.40s'", f[3]);
        if (!parse_u64(f[4], &e->bytes)) BAD("bad Size '%.40s'", f[4]);
        if (!parse_pointer(f[5], &stream)) BAD("bad Stream '%.40s'", f[5]);
        e->stream = fold_stream(stream);
    }
    return 1;
}

#undef BAD

/* --------------------------------------------------------- the fast path */

/* Digits eight at a time where eight bytes can be read (a little-endian
 * host: the first character is the word's low byte). t = w minus '0' in
 * every byte: a digit's byte is 0..9; any other byte is 10 or more, which
 * bit 7 of t or of t + 0x76 shows. Neither sum carries or borrows from a
 * digit's byte into the next, so every byte up to the first non-digit is
 * judged right (what follows it does not matter). */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define TRACE_TEXT_WORDS 1
/* The number of digits the eight characters at s start with (0 to 8);
 * *t: their word, minus '0' in every byte. */
static inline unsigned leading_digits(const char *s, uint64_t *t) {
    uint64_t w;
    memcpy(&w, s, sizeof w);
    *t = w - 0x3030303030303030ull;
    uint64_t flags = ((*t + 0x7676767676767676ull) | *t) & 0x8080808080808080ull;
    return flags ? (unsigned)__builtin_ctzll(flags) >> 3 : 8;
}

/* The value of the first n (1..8) digits of t (leading_digits): moved to
 * the word's top, so that the bytes below read as leading zeros, then
 * combined in pairs, fours and eights. */
static inline uint64_t digits_value(uint64_t t, unsigned n) {
    uint64_t v = t << (8 * (8 - n));
    v = (v * 10 + (v >> 8)) & 0x00FF00FF00FF00FFull;
    v = (v * 100 + (v >> 16)) & 0x0000FFFF0000FFFFull;
    return (v * 10000 + (v >> 32)) & 0xFFFFFFFFull;
}
#endif

/* 1 to 19 decimal digits at *p (below end): no overflow is possible.
 * Eight bytes at a time while eight remain before end; the rest of the
 * run, if it may go on, one byte at a time. */
static inline bool fast_digits(const char **p, const char *end, uint64_t *out) {
    const char *s = *p, *start = s;
    uint64_t v = 0;
    bool run_may_go_on = true;
#ifdef TRACE_TEXT_WORDS
    static const uint64_t powers_of_ten[9] = {1, 10, 100, 1000, 10000, 100000, 1000000, 10000000, 100000000};
    while (end - s >= 8 && s - start <= 19) {
        uint64_t t;
        unsigned n = leading_digits(s, &t);
        if (n) v = v * powers_of_ten[n] + digits_value(t, n);
        s += n;
        if (n < 8) {
            run_may_go_on = false; /* a non-digit ends it */
            break;
        }
    }
#endif
    while (run_may_go_on && s < end) {
        unsigned d = (unsigned)(unsigned char)*s - '0';
        if (d > 9) break;
        v = v * 10 + d;
        s++;
    }
    size_t digits = (size_t)(s - start);
    if (digits == 0 || digits > 19) return false;
    *out = v;
    *p = s;
    return true;
}

/* One tidepool line at *p in the common shape; false (nothing consumed)
 * for anything else. */
static inline bool fast_line(const char **p, const char *end, trace_event *e) {
    const char *s = *p, *line = s;
    uint64_t t_us, stream;
    if (!fast_digits(&s, end, &t_us) || s == end || *s != ',') return false;
    s++;
    if (end - s >= 6 && memcmp(s, "alloc,", 6) == 0) {
        e->action = TRACE_ALLOC;
        s += 6;
    } else if (end - s >= 5 && memcmp(s, "free,", 5) == 0) {
        e->action = TRACE_FREE;
        s += 5;
    } else {
        return false;
    }
    if (!fast_digits(&s, end, &e->address) || s == end || *s != ',') return false;
    s++;
    if (!fast_digits(&s, end, &e->bytes) || s == end || *s != ',') return false;
    s++;
    if (!fast_digits(&s, end, &stream)) return false;
    if (s < end) {
        if (*s == '\n') s++;
        else if (*s == '\r' && end - s >= 2 && s[1] == '\n') s += 2;
        else return false;
    }
    if ((size_t)(s - line) > TRACE_LINE_MAX_BYTES || t_us > UINT64_MAX / 1000) return false;
    e->time_ns = t_us * 1000;
    e->stream = fold_stream(stream);
    *p = s;
    return true;
}

bool trace_text_parse(trace_format format, const char *text, size_t length, trace_event *events,
                      trace_text_result *result, char *what, size_t what_capacity) {
    const char *p = text, *end = text + length;
    size_t n = 0;
    uint64_t lines = 0;
    bool fast = format == TRACE_FORMAT_TIDEPOOL;
    while (p < end) {
        if (fast) {
            if (fast_line(&p, end, &events[n])) {
                n++;
                lines++;
                continue;
            }
            if (*p == '\n') { /* blank */
                p++;
                lines++;
                continue;
            }
        }
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t line_length = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
        int got = trace_text_parse_line(format, p, line_length, &events[n], what, what_capacity);
        if (got < 0) {
            result->events = n;
            result->lines = lines;
            return false;
        }
        n += (size_t)got;
        lines++;
        p += line_length;
    }
    result->events = n;
    result->lines = lines;
    return true;
}
