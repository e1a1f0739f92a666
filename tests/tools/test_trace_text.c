/* SPDX-License-Identifier: MIT */
/*
 * test_trace_text.c -- the CSV line parser (tools/trace_text.c) and the
 * block reader around it (tools/trace.c): the fast path against the careful
 * one on generated and mutated lines; strict errors with their line (huge
 * numbers, CRLF, NUL, the line length limit, a last line without its
 * newline); blocks cut at every position of a text; and the same events
 * whatever the source (memory, mapped file, zlib stream, whole inflate) and
 * the number of worker threads (in the caller's process or a worker
 * process); the batch hook sees those events, in order, one call at a time.
 * argv[1]: a scratch directory; argv[2]: the directory of the real traces
 * (docs/traces.md), or - (the parallel-vs-serial test on
 * decode_growing_kv.csv.gz is skipped, and says so, where it is absent).
 */
#include "../check.h"
#include "trace.h"
#include "trace_text.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

static const char *scratch_dir, *traces_dir;

static bool same_event(const trace_event *a, const trace_event *b) {
    return a->time_ns == b->time_ns && a->address == b->address && a->bytes == b->bytes && a->stream == b->stream &&
           a->action == b->action;
}

/* xorshift: the tests' own random numbers, the same every run */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(void) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

/* A number as a trace might write it: small, large, 19 or 20 digits, the
 * largest u64, one past it (as text), leading zeros. */
static void random_number(char *out, size_t cap) {
    switch (rnd() % 8) {
    case 0: snprintf(out, cap, "%llu", (unsigned long long)(rnd() % 10)); break;
    case 1: snprintf(out, cap, "%llu", (unsigned long long)rnd()); break;
    case 2: snprintf(out, cap, "18446744073709551615"); break;
    case 3: snprintf(out, cap, "18446744073709551616"); break;
    case 4: snprintf(out, cap, "9999999999999999999"); break;
    case 5: snprintf(out, cap, "000%llu", (unsigned long long)(rnd() % 100000)); break;
    case 6: snprintf(out, cap, "0x%llx", (unsigned long long)rnd()); break;
    default: snprintf(out, cap, "%llu", (unsigned long long)(rnd() >> (rnd() % 64))); break;
    }
}

/* A tidepool line, mostly well formed, sometimes mutated. */
static size_t random_line(char *out, size_t cap) {
    char t[40], a[40], s[40], st[40];
    random_number(t, sizeof t);
    random_number(a, sizeof a);
    random_number(s, sizeof s);
    random_number(st, sizeof st);
    if (rnd() % 2) snprintf(t, sizeof t, "%llu", (unsigned long long)(1795975099620091ull + rnd() % 1000000));
    const char *ends[] = {"\n", "\r\n", "\r\r\n", "", "\r"};
    int n = snprintf(out, cap, "%s,%s,%s,%s,%s%s", t, rnd() % 2 ? "alloc" : "free", a, s, st, ends[rnd() % 5]);
    size_t length = (size_t)n;
    if (rnd() % 4 == 0 && length) { /* mutate one byte */
        const char junk[] = ",x-0 9\n\r\0aF:/\xff";
        out[rnd() % length] = junk[rnd() % (sizeof junk - 1)];
    }
    return length;
}

/* The fast path (trace_text_parse on one line) agrees with the careful one
 * (trace_text_parse_line) on every line: accepted or not, event, message. */
static void test_fast_matches_careful(void) {
    char line[200];
    int accepted = 0, refused = 0;
    for (int i = 0; i < 200000; i++) {
        size_t length = random_line(line, sizeof line);
        if (length > 1 && memchr(line, '\n', length - 1)) continue; /* a newline put inside: two lines */
        memset(line + length, '7', 16); /* digits past the end, which neither path may read as the line's */
        trace_event fast = {0}, careful = {0};
        char fast_what[300] = "", careful_what[300] = "";
        trace_text_result result;
        bool ok = trace_text_parse(TRACE_FORMAT_TIDEPOOL, line, length, &fast, &result, fast_what, sizeof fast_what);
        int got = trace_text_parse_line(TRACE_FORMAT_TIDEPOOL, line, length, &careful, careful_what, sizeof careful_what);
        if (got < 0) {
            refused++;
            CHECK_MSG(!ok && result.lines == 0 && !strcmp(fast_what, careful_what), "'%.*s': fast '%s', careful '%s'",
                      (int)length, line, ok ? "accepted" : fast_what, careful_what);
        } else {
            accepted += got;
            CHECK_MSG(ok && result.lines == (length ? 1u : 0u) && result.events == (size_t)got &&
                          (!got || same_event(&fast, &careful)),
                      "'%.*s': fast %s (%zu events), careful %d", (int)length, line, ok ? "accepted" : fast_what,
                      result.events, got);
        }
        if (check_failures) return;
    }
    CHECK(accepted > 10000 && refused > 10000); /* both sides exercised */
}

/* A well-formed tidepool line (no newline): numbers of 1 to 19 digits, so
 * that every length of a number meets every offset in a word. */
static size_t good_line(char *out, size_t cap) {
    char numbers[4][24];
    for (int i = 0; i < 4; i++) {
        int digits = 1 + (int)(rnd() % (i == 0 ? 16 : 19)); /* the time in us stays below UINT64_MAX / 1000 */
        for (int d = 0; d < digits; d++) numbers[i][d] = (char)('0' + rnd() % 10);
        numbers[i][digits] = '\0';
    }
    int n = snprintf(out, cap, "%s,%s,%s,%s,%s%s", numbers[0], rnd() % 2 ? "alloc" : "free", numbers[1], numbers[2],
                     numbers[3], rnd() % 8 ? "" : "\r");
    return (size_t)n;
}

/* The same in blocks of lines, as the reader hands them to the parser:
 * whole lines, each ending in a newline, so that the fast path reads its
 * numbers eight bytes at a time (it does so only with eight bytes left
 * before the block's end, which a lone line seldom has) and its words run
 * on into the next line. The block parses to the careful path's events up
 * to its first refused line, and then stops with its message. */
static void test_fast_matches_careful_in_blocks(void) {
    enum { LINES = 48 };
    static char text[LINES * 200];
    static trace_event fast[LINES], careful[LINES];
    int refusals = 0, events_seen = 0;
    for (int block = 0; block < 6000; block++) {
        size_t length = 0, line_starts[LINES + 1];
        for (int i = 0; i < LINES; i++) {
            line_starts[i] = length;
            char line[200];
            size_t n = rnd() % 16 ? good_line(line, sizeof line) : random_line(line, sizeof line);
            while (n && line[n - 1] == '\n') n--;
            if (memchr(line, '\n', n) || memchr(line, '\0', n)) n = 0; /* keep one line each */
            memcpy(text + length, line, n);
            text[length + n] = '\n';
            length += n + 1;
        }
        line_starts[LINES] = length;
        size_t want = 0;
        char careful_what[300] = "", fast_what[300] = "";
        bool refused = false;
        for (int i = 0; i < LINES && !refused; i++) {
            int got = trace_text_parse_line(TRACE_FORMAT_TIDEPOOL, text + line_starts[i],
                                            line_starts[i + 1] - line_starts[i], &careful[want], careful_what,
                                            sizeof careful_what);
            if (got < 0) refused = true;
            else want += (size_t)got;
        }
        trace_text_result result;
        bool ok = trace_text_parse(TRACE_FORMAT_TIDEPOOL, text, length, fast, &result, fast_what, sizeof fast_what);
        CHECK_MSG(ok == !refused && result.events == want, "block %d: fast %s with %zu events, careful %s with %zu",
                  block, ok ? "accepted" : fast_what, result.events, refused ? careful_what : "accepted", want);
        if (refused) CHECK_MSG(!strcmp(fast_what, careful_what), "fast '%s', careful '%s'", fast_what, careful_what);
        for (size_t i = 0; i < want && i < result.events; i++)
            CHECK_MSG(same_event(&fast[i], &careful[i]), "block %d, event %zu differs", block, i);
        refusals += refused;
        events_seen += (int)want;
        if (check_failures) return;
    }
    CHECK(refusals > 1000 && events_seen > 50000); /* both sides exercised */
}

/* Reads r to the end with threads workers and closes it: the number of
 * events (copied to events unless it is NULL), or -1 with err. */
static bool in_process; /* the workers in a worker process (trace_set_worker_process) */

static long read_all_from(trace_reader *r, unsigned threads, trace_event *events, size_t capacity, char *err,
                          size_t cap) {
    trace_set_threads(r, threads);
    trace_set_worker_process(r, in_process);
    size_t n = 0;
    for (;;) {
        const trace_event *batch;
        long got = trace_read_batch(r, &batch, err, cap);
        if (got <= 0) {
            trace_close(r);
            return got < 0 ? -1 : (long)n;
        }
        if (events) {
            if (n + (size_t)got > capacity) {
                snprintf(err, cap, "more than %zu events", capacity);
                trace_close(r);
                return -1;
            }
            memcpy(events + n, batch, (size_t)got * sizeof *batch);
        }
        n += (size_t)got;
    }
}

/* Parses text from memory whole; returns the events or -1 with err. */
static long read_memory(const char *text, size_t length, const trace_open_options *options, unsigned threads,
                        trace_event *events, size_t capacity, char *err, size_t cap) {
    trace_reader *r = trace_open_memory_with(text, length, options, err, cap);
    return r ? read_all_from(r, threads, events, capacity, err, cap) : -1;
}

static void expect_error(const char *text, const char *expected) {
    trace_event e[8];
    char err[512] = "";
    long n = read_memory(text, strlen(text), NULL, 0, e, 8, err, sizeof err);
    CHECK_MSG(n == -1 && !strncmp(err, expected, strlen(expected)), "'%s': expected '%s...', got %ld '%s'", text,
              expected, n, err);
}

static void expect_events(const char *text, long count, uint64_t last_bytes) {
    trace_event e[8];
    char err[512] = "";
    long n = read_memory(text, strlen(text), NULL, 0, e, 8, err, sizeof err);
    CHECK_MSG(n == count && (n <= 0 || e[n - 1].bytes == last_bytes), "'%s': %ld events (%s), last %llu", text, n, err,
              n > 0 ? (unsigned long long)e[n - 1].bytes : 0ull);
}

static void test_strict_lines(void) {
    const char *h = "time_us,action,addr,size,stream\n";
    char text[4096];
#define TEXT(body) (snprintf(text, sizeof text, "%s%s", h, body), text)
    expect_events(TEXT("1,alloc,2,3,0\r\n2,free,2,3,0\r\n"), 2, 3);
    expect_events(TEXT("1,alloc,2,3,0\n2,free,2,7,0"), 2, 7);      /* no trailing newline */
    expect_events(TEXT("1,alloc,2,3,0\r\r\n2,free,2,9,0\r"), 2, 9); /* CRs before the newline, or the end */
    expect_events(TEXT("\n\r\n1,alloc,2,5,0\n\n"), 1, 5);             /* blank lines */
    expect_events(TEXT("1,alloc,0x1F,18446744073709551615,18446744073709551615\n"), 1, UINT64_MAX);
    expect_events(TEXT("18446744073709551,alloc,1,00000000000000000000000042,0\n"), 1, 42);
    expect_error(TEXT("1,alloc,2,18446744073709551616,0\n"), "<memory>:2: bad size '18446744073709551616'");
    expect_error(TEXT("18446744073709552,alloc,1,2,0\n"), "<memory>:2: bad time_us"); /* * 1000 overflows */
    expect_error(TEXT("1,alloc,2,3,0\n\n1,alloc,2,-3,0\n"), "<memory>:4: bad size '-3'");
    expect_error(TEXT("1,alloc,2,3,0\n1,alloc,2,3\n"), "<memory>:3: expected 5 comma-separated fields");
    expect_error(TEXT("1,alloc,2,3,0\n1,Alloc,2,3,0\n"), "<memory>:3: bad action 'Alloc'");
    expect_error(TEXT("1,alloc,0x,3,0\n"), "<memory>:2: bad addr '0x'");
    expect_error(TEXT("1,alloc,0x10000000000000000,3,0\n"), "<memory>:2: bad addr");
    expect_error(TEXT("1,alloc,2,3,0\r1,alloc,2,3,0\n"), "<memory>:2: expected 5 comma-separated fields");
    expect_error(TEXT("1,alloc,2,3, 0\n"), "<memory>:2: bad stream ' 0'");
    expect_error(TEXT("1,alloc,2,3,0\n2,free,2,3,"), "<memory>:3: bad stream ''");
    /* the length limit: 1023 bytes with the newline pass, 1024 do not */
    char line[1100];
    int pad = 1023 - (int)strlen("1,alloc,2,3,\n");
    snprintf(line, sizeof line, "1,alloc,2,3,%0*d\n", pad, 5);
    expect_events(TEXT(line), 1, 3);
    snprintf(line, sizeof line, "1,alloc,2,3,%0*d\n", pad + 1, 5);
    expect_error(TEXT(line), "<memory>:2: line too long or not text");
    /* a NUL byte is not text */
    static const char nul[] = "time_us,action,addr,size,stream\n1,alloc,2,3,0\n1,alloc,2\0,3,0\n";
    trace_event e[4];
    char err[512] = "";
    CHECK(read_memory(nul, sizeof nul - 1, NULL, 0, e, 4, err, sizeof err) == -1);
    CHECK_CONTAINS(err, "<memory>:3: line too long or not text");
#undef TEXT
}

/* A text of count event lines (with blank and CRLF lines among them). */
static size_t make_text(char *text, size_t cap, int count) {
    size_t n = (size_t)snprintf(text, cap, "time_us,action,addr,size,stream\n");
    for (int i = 0; i < count && n < cap; i++) {
        if (i % 17 == 5) n += (size_t)snprintf(text + n, cap - n, "\n");
        n += (size_t)snprintf(text + n, cap - n, "%llu,%s,%llu,%llu,%d%s", 1700000000000000ull + (unsigned long long)i * 37,
                              i % 2 ? "free" : "alloc", 139772529999872ull + (unsigned long long)(i / 2) * 4096,
                              (unsigned long long)(rnd() % 100000000), i % 3, i % 5 == 1 ? "\r\n" : "\n");
    }
    return n;
}

/* Blocks of every size from the smallest on: each line boundary falls at
 * every position of a block once; events and errors do not change. */
static void test_block_boundaries(void) {
    static char text[8192];
    size_t length = make_text(text, sizeof text, 150);
    length--; /* the last line without its newline */
    static trace_event reference[200], got[200];
    char err[512];
    long expected = read_memory(text, length, NULL, 0, reference, 200, err, sizeof err);
    REQUIRE(expected == 150);
    for (size_t block = 1024; block <= 1024 + 64; block++) {
        for (unsigned threads = 0; threads <= 2; threads += 2) {
            trace_open_options options = {.block_bytes = block};
            long n = read_memory(text, length, &options, threads, got, 200, err, sizeof err);
            bool same = n == expected;
            for (long i = 0; same && i < n; i++) same = same_event(&reference[i], &got[i]);
            CHECK_MSG(same, "block %zu, %u threads: %ld events (%s)", block, threads, n, err);
        }
    }
    /* a bad line found at its line number whatever block it falls in */
    static char bad[8192];
    memcpy(bad, text, length);
    char *line_80 = bad;
    for (int i = 0; i < 80; i++) line_80 = strchr(line_80, '\n') + 1; /* line 81 of the file */
    unsigned long long line_number = 81;
    line_80[0] = 'x';
    char expected_err[64];
    snprintf(expected_err, sizeof expected_err, "<memory>:%llu: bad time_us 'x", line_number);
    for (size_t block = 1024; block <= 1024 + 64; block += 3) {
        trace_open_options options = {.block_bytes = block};
        long n = read_memory(bad, length, &options, 3, got, 200, err, sizeof err);
        CHECK_MSG(n == -1 && !strncmp(err, expected_err, strlen(expected_err)), "block %zu: %ld '%s'", block, n, err);
    }
}

/* Reads a file whole with options and threads; the events or -1. */
/* bytes[0, length) as the file at path (the test ends if it cannot be written). */
static void write_file(const char *path, const void *bytes, size_t length) {
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(bytes, 1, length, f) == length && fclose(f) == 0);
}

static long read_path(const char *path, const trace_open_options *options, unsigned threads, trace_event *events,
                      size_t capacity, char *err, size_t cap) {
    trace_reader *r = trace_open_with(path, options, err, cap);
    return r ? read_all_from(r, threads, events, capacity, err, cap) : -1;
}

/* A file, plain and gzip, read through every source (mapped, stream,
 * inflated whole or by zlib) with small blocks and 0 to 5 threads: the
 * same events. */
static void test_sources_and_threads(void) {
    enum { COUNT = 6000 };
    static char text[COUNT * 64];
    size_t length = make_text(text, sizeof text, COUNT);
    char plain[1024], gz[1024], err[512];
    snprintf(plain, sizeof plain, "%s/text_trace.csv", scratch_dir);
    snprintf(gz, sizeof gz, "%s/text_trace.csv.gz", scratch_dir);
    write_file(plain, text, length);
    gzFile g = gzopen(gz, "wb6");
    REQUIRE(g && gzwrite(g, text, (unsigned)length) == (int)length && gzclose(g) == Z_OK);
    static trace_event reference[COUNT], got[COUNT];
    long expected = read_memory(text, length, NULL, 0, reference, COUNT, err, sizeof err);
    REQUIRE(expected == COUNT);
    const char *paths[] = {plain, gz, gz};
    for (int process = 0; process < 2; process++) {
        in_process = process;
        for (int p = 0; p < 3; p++) {
            for (unsigned threads = 0; threads <= 5; threads++) {
                trace_open_options options = {.block_bytes = 1024 + 97 * threads, .zlib_gzip = p == 2};
                long n = read_path(paths[p], &options, threads, got, COUNT, err, sizeof err);
                bool same = n == expected;
                for (long i = 0; same && i < n; i++) same = same_event(&reference[i], &got[i]);
                CHECK_MSG(same, "%s (%s), %u threads%s: %ld events (%s)", paths[p], p == 2 ? "zlib" : "default", threads,
                          process ? " in a worker process" : "", n, err);
            }
        }
    }
    in_process = false;
}

/* The real trace, serial against 1 to 7 worker threads: the same events. */
static void test_parallel_real_trace(void) {
    char path[1024], err[512];
    if (!strcmp(traces_dir, "-")) {
        printf("  (skipped: no directory of real traces; configure with -DTP_TRACES_DIR=DIR)\n");
        return;
    }
    snprintf(path, sizeof path, "%s/decode_growing_kv.csv.gz", traces_dir);
    FILE *probe = fopen(path, "rb");
    if (!probe) {
        printf("  (skipped: %s is absent)\n", path);
        return;
    }
    fclose(probe);
    enum { MAX = 2000000 };
    trace_event *serial = malloc(MAX * sizeof *serial), *parallel = malloc(MAX * sizeof *parallel);
    REQUIRE(serial && parallel);
    long n0 = read_path(path, NULL, 0, serial, MAX, err, sizeof err);
    CHECK_MSG(n0 > 1000000, "%ld (%s)", n0, err);
    unsigned counts[] = {1, 3, 7};
    for (int i = 0; i < 3; i++) {
        trace_open_options options = {.zlib_gzip = i == 1};
        long n = read_path(path, &options, counts[i], parallel, MAX, err, sizeof err);
        bool same = n == n0;
        for (long j = 0; same && j < n; j++) same = same_event(&serial[j], &parallel[j]);
        CHECK_MSG(same,
                  "%u threads: %ld events, serial %ld (%s)", counts[i], n, n0, err);
    }
    free(serial);
    free(parallel);
}

/* A damaged gzip stream read with threads: the same error as without. */
static void test_damage_with_threads(void) {
    enum { COUNT = 4000 };
    static char text[COUNT * 64];
    size_t length = make_text(text, sizeof text, COUNT);
    char gz[1024], cut[1024];
    snprintf(gz, sizeof gz, "%s/text_damage.csv.gz", scratch_dir);
    snprintf(cut, sizeof cut, "%s/text_damage_cut.csv.gz", scratch_dir);
    gzFile g = gzopen(gz, "wb6");
    REQUIRE(g && gzwrite(g, text, (unsigned)length) == (int)length && gzclose(g) == Z_OK);
    FILE *f = fopen(gz, "rb");
    REQUIRE(f);
    static unsigned char bytes[COUNT * 64];
    size_t size = fread(bytes, 1, sizeof bytes, f);
    fclose(f);
    write_file(cut, bytes, size * 2 / 3);
    char serial_err[512] = "", err[512] = "";
    CHECK(read_path(cut, NULL, 0, NULL, 0, serial_err, sizeof serial_err) == -1);
    CHECK_CONTAINS(serial_err, "truncated gzip file");
    for (unsigned threads = 1; threads <= 4; threads++) {
        in_process = threads % 2 == 0; /* 2 and 4 in a worker process */
        trace_open_options options = {.block_bytes = 1500};
        err[0] = '\0';
        CHECK(read_path(cut, &options, threads, NULL, 0, err, sizeof err) == -1);
        CHECK_MSG(!strcmp(err, serial_err), "%u threads%s: '%s', serial '%s'", threads,
                  in_process ? " in a worker process" : "", err, serial_err);
    }
    in_process = false;
}

/* text[0, length) as gzip members cut at the given offsets, into path;
 * the size written. */
static size_t write_members(const char *path, const char *text, size_t length, const size_t *cuts, int cut_count,
                            unsigned char *out, size_t out_capacity) {
    size_t size = 0, from = 0;
    for (int m = 0; m <= cut_count; m++) {
        size_t to = m < cut_count ? cuts[m] : length;
        uLong bound = compressBound((uLong)(to - from)) + 64;
        REQUIRE(size + bound <= out_capacity);
        z_stream z;
        memset(&z, 0, sizeof z);
        REQUIRE(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) == Z_OK);
        z.next_in = (Bytef *)(uintptr_t)(text + from);
        z.avail_in = (uInt)(to - from);
        z.next_out = out + size;
        z.avail_out = (uInt)bound;
        REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
        size += z.total_out;
        deflateEnd(&z);
        from = to;
    }
    write_file(path, out, size);
    return size;
}

/* A stream's gzip checks, the first member's deferred to the ordering step
 * (tools/trace.c: crc_feed) and later members' made by zlib, with 0 to 4
 * threads, in a worker process or not: concatenated members read whole
 * (the first ending inside the header line, mid-line or at a block's
 * edge); a wrong CRC or length in the first or a later member is the same
 * error, at the same line, whatever the threads. */
static void test_gzip_checks_with_threads(void) {
    enum { COUNT = 3000 };
    static char text[COUNT * 64];
    size_t length = make_text(text, sizeof text, COUNT);
    static trace_event reference[COUNT], got[COUNT];
    char err[512], path[1024];
    long expected = read_memory(text, length, NULL, 0, reference, COUNT, err, sizeof err);
    REQUIRE(expected == COUNT);
    snprintf(path, sizeof path, "%s/members.csv.gz", scratch_dir);
    static unsigned char bytes[COUNT * 64 * 2];
    const size_t block = 1500;
    const size_t cuts[][2] = {{10, 0}, {length / 3 + 7, 0}, {block - 1, 2 * block + 1}, {length / 2, length - 5}};
    const int cut_counts[] = {1, 1, 2, 2};
    for (int c = 0; c < 4; c++) {
        write_members(path, text, length, cuts[c], cut_counts[c], bytes, sizeof bytes);
        for (unsigned threads = 0; threads <= 4; threads++) {
            in_process = threads % 2 == 0;
            trace_open_options options = {.block_bytes = block, .zlib_gzip = threads % 2 == 1};
            long n = read_path(path, &options, threads, got, COUNT, err, sizeof err);
            bool same = n == expected;
            for (long i = 0; same && i < n; i++) same = same_event(&reference[i], &got[i]);
            CHECK_MSG(same, "members cut %d, %u threads, %s: %ld events (%s)", c, threads,
                      options.zlib_gzip ? "zlib" : "the inflater", n, err);
        }
    }
    /* Damage: the first member's CRC, then its length; a later member's CRC. */
    const size_t two[2] = {length / 3 + 7, 2 * length / 3};
    for (int damage = 0; damage < 3; damage++) {
        size_t size = write_members(path, text, length, two, 2, bytes, sizeof bytes);
        /* the first member's trailer ends where the second's magic begins */
        size_t second = 0;
        for (size_t i = 10; i + 1 < size && !second; i++)
            if (bytes[i] == 0x1f && bytes[i + 1] == 0x8b && bytes[i + 2] == 8 && i >= 8) second = i;
        REQUIRE(second);
        size_t at = damage == 0 ? second - 8 : damage == 1 ? second - 4 : size - 8;
        bytes[at] ^= 0x01;
        write_file(path, bytes, size);
        char serial_err[512] = "";
        trace_open_options options = {.block_bytes = block};
        in_process = false;
        CHECK(read_path(path, &options, 0, NULL, 0, serial_err, sizeof serial_err) == -1);
        CHECK_MSG(strstr(serial_err, "corrupt gzip data") != NULL, "damage %d: '%s'", damage, serial_err);
        for (unsigned threads = 1; threads <= 4; threads++) {
            in_process = threads % 2 == 0;
            options.zlib_gzip = threads >= 3;
            err[0] = '\0';
            CHECK(read_path(path, &options, threads, NULL, 0, err, sizeof err) == -1);
            CHECK_MSG(!strcmp(err, serial_err), "damage %d, %u threads%s: '%s', serial '%s'", damage, threads,
                      in_process ? " in a worker process" : "", err, serial_err);
        }
    }
    in_process = false;
}

/* The inflater (tools/inflater.c) handing a gzip file's first member to
 * zlib at any point (as on data it rejects: trace_open_options'
 * inflater_gives_up): zlib inflates it again from the start and drops the
 * text already given, so the events are the same wherever it happens --
 * at the start, mid-block, at a block's edge, just before or at the
 * member's end, or not at all -- with 0 to 3 threads; and a damaged file
 * reads as the same error, at the same line, as with zlib alone. */
static void test_inflater_gives_up(void) {
    enum { COUNT = 3000 };
    static char text[COUNT * 64];
    size_t length = make_text(text, sizeof text, COUNT);
    static trace_event reference[COUNT], got[COUNT];
    static unsigned char bytes[COUNT * 64 * 2];
    char err[512], path[1024];
    long expected = read_memory(text, length, NULL, 0, reference, COUNT, err, sizeof err);
    REQUIRE(expected == COUNT);
    snprintf(path, sizeof path, "%s/gives_up.csv.gz", scratch_dir);
    const size_t block = 1500, first_end = length / 2 + 3;
    const uint64_t points[] = {0, 1, 37, block - 1, block, 2 * block + 5, first_end - 1, first_end, first_end + 1,
                               length - 1, length, length + 10};
    for (int members = 1; members <= 2; members++) {
        size_t size = write_members(path, text, length, &first_end, members - 1, bytes, sizeof bytes);
        for (size_t p = 0; p < sizeof points / sizeof *points; p++) {
            unsigned threads = (unsigned)(p % 4);
            in_process = p % 3 == 0;
            trace_open_options options = {.block_bytes = block, .inflater_gives_up = true,
                                          .inflater_gives_up_at = points[p]};
            long n = read_path(path, &options, threads, got, COUNT, err, sizeof err);
            bool same = n == expected;
            for (long i = 0; same && i < n; i++) same = same_event(&reference[i], &got[i]);
            CHECK_MSG(same, "%d member(s), gives up at %llu, %u threads: %ld events (%s)", members,
                      (unsigned long long)points[p], threads, n, err);
        }
        /* damaged: deflate data changed or cut, a CRC or length changed */
        for (int damage = 0; damage < 6; damage++) {
            size = write_members(path, text, length, &first_end, members - 1, bytes, sizeof bytes);
            size_t at = damage == 0 ? size / 5 : damage == 1 ? size / 3 : damage == 2 ? size / 2 : size - 8 + damage;
            if (damage < 2) bytes[at] ^= 0x5a;
            size_t written = damage == 2 ? at : size;
            if (damage >= 3) bytes[at] ^= 0x01;
            write_file(path, bytes, written);
            char zlib_err[512] = "";
            in_process = false;
            trace_open_options options = {.block_bytes = block, .zlib_gzip = true};
            long zn = read_path(path, &options, 0, NULL, 0, zlib_err, sizeof zlib_err);
            CHECK_MSG(zn == -1, "%d member(s), damage %d: zlib read %ld events", members, damage, zn);
            for (int way = 0; way < 4; way++) {
                options = (trace_open_options){.block_bytes = block, .inflater_gives_up = way > 0,
                                               .inflater_gives_up_at = way == 1 ? 0 : way == 2 ? 2 * block + 5 : length};
                err[0] = '\0';
                long n = read_path(path, &options, (unsigned)way, NULL, 0, err, sizeof err);
                CHECK_MSG(n == -1 && !strcmp(err, zlib_err), "%d member(s), damage %d, way %d: %ld, '%s', zlib '%s'",
                          members, damage, way, n, err, zlib_err);
            }
        }
    }
    in_process = false;
}

/* Damage found after zlib's output filled up (found by fuzz_gzip_reader):
 * a gzip file whose deflate data (no trailer) gives 38 bytes of text and
 * then a distance before the text's start. The inflater rejects it there
 * and zlib, taking over, drops those 38 bytes -- and stops, its output full,
 * with the bad distance's bits already read and no input left. The reader
 * took that for a file cut short ("truncated gzip file") where zlib alone
 * says "invalid distance too far back": zlib must be asked once more, with
 * no input, before the file is called truncated. */
static void test_damage_when_the_output_fills(void) {
    static const unsigned char deflate_data[] = {
        0x6b, 0x60, 0xd5, 0xd0, 0xd0, 0x28, 0xc9, 0xcc, 0x4d, 0x8d, 0x2f, 0x2d, 0xd6, 0x49, 0x4c, 0x2e, 0xc9,
        0xcc, 0xcf, 0x29, 0x49, 0xd5, 0xd5, 0x29, 0x2e, 0x29, 0x4a, 0x4d, 0xcc, 0x54, 0x68, 0x72, 0x65, 0x61,
        0x64, 0x2c, 0x3e, 0xfc, 0x01, 0xe6, 0x00};
    /* a gzip header, then the data */
    unsigned char file[10 + sizeof deflate_data] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    memcpy(file + 10, deflate_data, sizeof deflate_data);
    char path[1024], zlib_err[512] = "", err[512];
    snprintf(path, sizeof path, "%s/output_fills.csv.gz", scratch_dir);
    write_file(path, file, sizeof file);
    in_process = false;
    trace_open_options options = {.zlib_gzip = true};
    CHECK(read_path(path, &options, 0, NULL, 0, zlib_err, sizeof zlib_err) == -1);
    CHECK_CONTAINS(zlib_err, "invalid distance too far back");
    for (int way = 0; way < 3; way++) {
        options = (trace_open_options){.inflater_gives_up = way > 0, .inflater_gives_up_at = way == 1 ? 0 : 38};
        err[0] = '\0';
        CHECK(read_path(path, &options, (unsigned)way, NULL, 0, err, sizeof err) == -1);
        CHECK_MSG(!strcmp(err, zlib_err), "way %d: '%s', zlib alone '%s'", way, err, zlib_err);
    }
}

/* The batch hook: one call at a time, in trace order, on exactly the
 * events the caller then gets (relative times; what it rewrote is what the
 * caller sees) -- and none after a bad line; with 0 to 4 threads. */
typedef struct hook_state {
    _Atomic int inside; /* calls running now */
    uint64_t next;      /* events seen */
    bool overlapped, first_not_zero;
} hook_state;

static void numbering_hook(void *user, trace_event *events, size_t count) {
    hook_state *h = user;
    if (h->inside++) h->overlapped = true;
    if (h->next == 0 && events[0].time_ns != 0) h->first_not_zero = true;
    for (size_t i = 0; i < count; i++) events[i].stream = (uint32_t)h->next++;
    h->inside--;
}

static void test_batch_hook(void) {
    enum { COUNT = 3000 };
    static char text[COUNT * 64];
    size_t length = make_text(text, sizeof text, COUNT);
    static trace_event reference[COUNT], got[COUNT];
    char err[512];
    REQUIRE(read_memory(text, length, NULL, 0, reference, COUNT, err, sizeof err) == COUNT);
    for (int bad = 0; bad < 2; bad++) {
        if (bad) { /* the line after event 2000 */
            char *line = text;
            for (int i = 0; i < 2000; i++) line = strchr(line, '\n') + 1;
            line[0] = 'x';
        }
        for (unsigned run = 0; run <= 8; run++) {
            /* 0 to 4 threads, then 1 to 4 in a worker process: there the
             * hook's own state stays in that process, the events come back */
            unsigned threads = run <= 4 ? run : run - 4;
            in_process = run > 4;
            hook_state h = {0};
            trace_open_options options = {.block_bytes = 1024 + 61 * threads};
            trace_reader *r = trace_open_memory_with(text, length, &options, err, sizeof err);
            REQUIRE(r != NULL);
            trace_set_batch_hook(r, numbering_hook, &h);
            long n = read_all_from(r, threads, got, COUNT, err, sizeof err);
            if (bad && in_process) {
                CHECK_MSG(n == -1 && strstr(err, "bad time_us 'x"), "%u threads: %ld (%s)", threads, n, err);
                continue;
            }
            if (bad) {
                CHECK_MSG(n == -1 && strstr(err, "bad time_us 'x"), "%u threads: %ld (%s)", threads, n, err);
                /* the events before the bad block went out, each hooked; none after it */
                CHECK_MSG(h.next < 2000 && h.next > 0, "%u threads: %llu events hooked", threads,
                          (unsigned long long)h.next);
                continue;
            }
            CHECK_MSG(n == COUNT && h.next == (in_process ? 0 : COUNT), "%u threads: %ld events, %llu hooked (%s)",
                      threads, n, (unsigned long long)h.next, err);
            CHECK(!h.overlapped && !h.first_not_zero);
            bool same = true;
            for (long i = 0; same && i < n; i++) {
                trace_event expected = reference[i];
                expected.stream = (uint32_t)i;
                same = same_event(&expected, &got[i]);
            }
            CHECK_MSG(same, "%u threads%s: the events differ from the reference's", threads,
                      in_process ? " in a worker process" : "");
        }
    }
    in_process = false;
}

/* A worker process that dies (here: its hook ends it) is an error naming
 * the file, never a hang or a shorter trace. */
static void dying_hook(void *user, trace_event *events, size_t count) {
    (void)user, (void)events, (void)count;
    _exit(3);
}

static void test_worker_process_death(void) {
    enum { COUNT = 2000 };
    static char text[COUNT * 64];
    size_t length = make_text(text, sizeof text, COUNT);
    char err[512] = "";
    trace_reader *r = trace_open_memory_with(text, length, NULL, err, sizeof err);
    REQUIRE(r != NULL);
    trace_set_batch_hook(r, dying_hook, NULL);
    in_process = true;
    long n = read_all_from(r, 2, NULL, 0, err, sizeof err);
    in_process = false;
    CHECK_MSG(n == -1 && strstr(err, "<memory>: the worker process that parses the trace ended before its end"),
              "%ld '%s'", n, err);
}

static const test_case tests[] = {
    TEST_CASE(test_fast_matches_careful), TEST_CASE(test_fast_matches_careful_in_blocks),
    TEST_CASE(test_strict_lines),        TEST_CASE(test_block_boundaries),
    TEST_CASE(test_sources_and_threads),  TEST_CASE(test_parallel_real_trace), TEST_CASE(test_damage_with_threads),
    TEST_CASE(test_inflater_gives_up),
    TEST_CASE(test_damage_when_the_output_fills),
    TEST_CASE(test_gzip_checks_with_threads),
    TEST_CASE(test_batch_hook),           TEST_CASE(test_worker_process_death),
};

int main(int argc, char **argv) {
    REQUIRE(argc >= 3);
    scratch_dir = argv[1];
    traces_dir = argv[2];
    return TEST_MAIN("test_trace_text", tests, argc - 2, argv + 2);
}
