/* SPDX-License-Identifier: MIT */
/*
 * test_trace.c -- the trace reader and writer (tools/trace.c): both formats,
 * gzip and plain, from files and from memory; malformed lines and files
 * with errors that name the file and the line; the writer read back.
 * argv[1]: the test data directory; argv[2]: a scratch directory.
 */
#include "../check.h"
#include "trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static const char *data_dir, *scratch_dir;

#define MAX_EVENTS 4096

/* Reads a whole trace; returns the count or -1 (err filled). */
static long read_all(trace_reader *r, trace_event *events, size_t capacity, char *err, size_t err_capacity) {
    size_t total = 0;
    for (;;) {
        /* odd chunk sizes: events must come out the same whatever the chunking */
        size_t chunk = capacity - total < 13 ? capacity - total : 13;
        if (!chunk) return (long)total;
        long n = trace_read(r, events + total, chunk, err, err_capacity);
        if (n < 0) return -1;
        if (n == 0) return (long)total;
        total += (size_t)n;
    }
}

static long read_file(const char *path, trace_event *events, trace_format *format, char *err, size_t cap) {
    trace_reader *r = trace_open(path, err, cap);
    if (!r) return -1;
    if (format) *format = trace_get_format(r);
    long n = read_all(r, events, MAX_EVENTS, err, cap);
    trace_close(r);
    return n;
}

static long read_memory(const char *text, trace_event *events, size_t capacity, char *err, size_t cap) {
    trace_reader *r = trace_open_memory(text, strlen(text), err, cap);
    if (!r) return -1;
    long n = read_all(r, events, capacity, err, cap);
    trace_close(r);
    return n;
}

static int count_lines(const char *path) {
    FILE *f = fopen(path, "r");
    REQUIRE(f != NULL);
    int lines = 0, c;
    while ((c = fgetc(f)) != EOF) lines += c == '\n';
    fclose(f);
    return lines;
}

static bool same_events(const trace_event *a, const trace_event *b, long n) {
    for (long i = 0; i < n; i++)
        if (a[i].time_ns != b[i].time_ns || a[i].address != b[i].address || a[i].bytes != b[i].bytes ||
            a[i].stream != b[i].stream || a[i].action != b[i].action)
            return false;
    return true;
}

static void path_in(char *buf, size_t capacity, const char *dir, const char *name) {
    snprintf(buf, capacity, "%s/%s", dir, name);
}

/* The tidepool CSV, plain and gzip, and the same events as an RMM log. */
static void test_formats(void) {
    static trace_event plain[MAX_EVENTS], gz[MAX_EVENTS], rmm[MAX_EVENTS];
    char path[1024], err[512];
    trace_format format = TRACE_FORMAT_RMM; /* read_file must set it */
    path_in(path, sizeof path, data_dir, "qwen2vl_excerpt.csv");
    int expected = count_lines(path) - 1; /* minus the header */
    long n_plain = read_file(path, plain, &format, err, sizeof err);
    CHECK_MSG(n_plain == expected, "%ld events, file has %d lines of events (%s)", n_plain, expected, err);
    CHECK_EQ_U64(format, TRACE_FORMAT_TIDEPOOL);
    /* The first event is the origin of time; the first line of the file is
     * "1795975054429409,alloc,139827366330368,3010560,0". */
    CHECK_EQ_U64(plain[0].time_ns, 0);
    CHECK_EQ_U64(plain[0].action, TRACE_ALLOC);
    CHECK_EQ_U64(plain[0].address, 139827366330368ull);
    CHECK_EQ_U64(plain[0].bytes, 3010560);
    CHECK_EQ_U64(plain[0].stream, 0);
    bool monotonic = true;
    for (long i = 1; i < n_plain; i++) monotonic &= plain[i].time_ns >= plain[i - 1].time_ns;
    CHECK(monotonic);

    path_in(path, sizeof path, data_dir, "qwen2vl_excerpt.csv.gz");
    long n_gz = read_file(path, gz, &format, err, sizeof err);
    CHECK_MSG(n_gz == n_plain && same_events(plain, gz, n_plain), "gzip: %ld events (%s)", n_gz, err);

    path_in(path, sizeof path, data_dir, "qwen2vl_excerpt.rmm.csv");
    long n_rmm = read_file(path, rmm, &format, err, sizeof err);
    CHECK_MSG(n_rmm == n_plain, "rmm: %ld events (%s)", n_rmm, err);
    CHECK_EQ_U64(format, TRACE_FORMAT_RMM);
    CHECK(same_events(plain, rmm, n_plain));
}

static void test_rmm_details(void) {
    trace_event e[8];
    char err[512] = "";
    const char *log = "Thread,Time,Action,Pointer,Size,Stream\n"
                      "7,1634567890.5,allocate,0x7f00,256,0x0\n"
                      "7,1634567890.750000001,allocate failure,0x0,4096,0x0\n"
                      "7,1634567891,deallocate,0x7f00,256,0x10\n"
                      "7,1634567889,free,32512,256,0\n";
    long n = read_memory(log, e, 8, err, sizeof err);
    CHECK_MSG(n == 4, "%ld (%s)", n, err);
    CHECK_EQ_U64(e[0].time_ns, 0);
    CHECK_EQ_U64(e[0].address, 0x7f00);
    CHECK_EQ_U64(e[0].action, TRACE_ALLOC);
    CHECK_EQ_U64(e[1].time_ns, 250000001ull);
    CHECK_EQ_U64(e[1].action, TRACE_ALLOC_FAILURE);
    CHECK_EQ_U64(e[1].bytes, 4096);
    CHECK_EQ_U64(e[2].time_ns, 500000000ull);
    CHECK_EQ_U64(e[2].action, TRACE_FREE);
    CHECK_EQ_U64(e[2].stream, 0x10);
    CHECK_EQ_U64(e[3].time_ns, 0); /* before the origin: clamped, the clock only moves on */
    CHECK_EQ_U64(e[3].address, 0x7f00); /* decimal pointers too */
    /* HH:MM:SS.ffffff */
    const char *clock = "Thread,Time,Action,Pointer,Size,Stream\n"
                        "1,01:02:03.000004,allocate,0x1,1,0x0\n"
                        "1,01:03:03.5,free,0x1,1,0x0\n";
    n = read_memory(clock, e, 8, err, sizeof err);
    CHECK_EQ_U64(n, 2);
    CHECK_EQ_U64(e[1].time_ns, 60ull * 1000000000ull + 499996000ull);
    /* past midnight (twice): a day later, not clamped to the time before it;
     * a time falling back less than 12 h is out of order, no day added */
    const char *midnight = "Thread,Time,Action,Pointer,Size,Stream\n"
                           "1,23:59:59.5,allocate,0x1,1,0x0\n"
                           "1,00:00:00.25,free,0x1,1,0x0\n"
                           "1,23:00:00,allocate,0x2,1,0x0\n"
                           "1,00:00:01,free,0x2,1,0x0\n"
                           "1,00:00:00,allocate,0x3,1,0x0\n";
    n = read_memory(midnight, e, 8, err, sizeof err);
    CHECK_MSG(n == 5, "%ld (%s)", n, err);
    CHECK_EQ_U64(e[1].time_ns, 750000000ull);
    CHECK_EQ_U64(e[2].time_ns, 82800500000000ull); /* 23:00 the next day: 23 h - 0.5 s after the first */
    CHECK_EQ_U64(e[3].time_ns, 86401500000000ull); /* 00:00:01 two days on */
    CHECK_EQ_U64(e[4].time_ns, 86400500000000ull); /* 1 s back */
}

/* Accepted variations: CRLF, a byte-order mark, blank lines, no final newline, hex addresses. */
static void test_lenient(void) {
    trace_event e[8];
    char err[512] = "";
    long n = read_memory("\xEF\xBB\xBFtime_us,action,addr,size,stream\r\n10,alloc,0x10,5,2\r\n\r\n\n12,free,16,5,2", e,
                         8, err, sizeof err);
    CHECK_MSG(n == 2, "%ld (%s)", n, err);
    CHECK_EQ_U64(e[0].address, 16);
    CHECK_EQ_U64(e[1].address, 16);
    CHECK_EQ_U64(e[1].time_ns, 2000);
    CHECK_EQ_U64(e[1].stream, 2);
}

/* Expects a malformed trace to fail with "<where>:<line>: " and `what` in the message. */
static void expect_bad(const char *text, const char *where, int line, const char *what) {
    trace_event e[8];
    char err[512] = "", prefix[600];
    long n = read_memory(text, e, 8, err, sizeof err);
    snprintf(prefix, sizeof prefix, "%s:%d: ", where, line);
    CHECK_MSG(n == -1 && strncmp(err, prefix, strlen(prefix)) == 0 && strstr(err, what),
              "expected '%s...%s', got %ld '%s'", prefix, what, n, err);
}

static void test_malformed_lines(void) {
    const char *h = "time_us,action,addr,size,stream\n";
    char text[2048];
    struct {
        const char *line;
        const char *what;
    } bad[] = {
        {"1,alloc,1,2", "expected 5 comma-separated fields"},
        {"1,alloc,1,2,0,9", "expected 5 comma-separated fields"},
        {"x1,alloc,1,2,0", "bad time_us"},
        {"1,allocate,1,2,0", "bad action"},
        {"1,alloc,-1,2,0", "bad addr"},
        {"1,alloc,0x,2,0", "bad addr"},
        {"1,alloc,1,2.5,0", "bad size"},
        {"1,alloc,1,18446744073709551616,0", "bad size"},
        {"1,alloc,1,2, 0", "bad stream"},
        {"18446744073709552,alloc,1,2,0", "bad time_us"},
        {"1,alloc,1,\x1b]0;x\x07\x7f,0", "bad size '?]0;x?\?'"}, /* the file's bytes quoted: no terminal escapes */
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        /* two good lines first, so the bad one is line 4 */
        snprintf(text, sizeof text, "%s1,alloc,1,2,0\n\n%s\n5,free,1,2,0\n", h, bad[i].line);
        expect_bad(text, "<memory>", 4, bad[i].what);
    }
    const char *rh = "Thread,Time,Action,Pointer,Size,Stream\n";
    struct {
        const char *line;
        const char *what;
    } rmm_bad[] = {
        {"1,25:99:00,allocate,0x1,1,0x0", "bad Time"},
        {"1,4294967296:00:00.5,allocate,0x1,1,0x0", "bad Time"}, /* hours past 2^32 wrapped to 00:00:00.5 */
        {"1,1:2:3:4,allocate,0x1,1,0x0", "bad Time"},
        {"1,1:+2:3,allocate,0x1,1,0x0", "bad Time"},
        {"1,1.,allocate,0x1,1,0x0", "bad Time"},
        {"1,1.5,alloc,0x1,1,0x0", "bad Action"},
        {"1,1.5,allocate,zz,1,0x0", "bad Pointer"},
        {"1,1.5,allocate,0x1,-1,0x0", "bad Size"},
        {"1,1.5,allocate,0x1,1", "expected 6 comma-separated fields"},
    };
    for (size_t i = 0; i < sizeof rmm_bad / sizeof *rmm_bad; i++) {
        snprintf(text, sizeof text, "%s%s\n", rh, rmm_bad[i].line);
        expect_bad(text, "<memory>", 2, rmm_bad[i].what);
    }
    /* A header with a terminal's escape: quoted with '?' for the control bytes. */
    {
        static const char escape_header[] = "\x1b[2Jtime,what\n1\n";
        char header_err[512] = "";
        trace_reader *hr = trace_open_memory(escape_header, sizeof escape_header - 1, header_err, sizeof header_err);
        if (hr) trace_close(hr);
        CHECK_MSG(!hr && strstr(header_err, "unknown header '?[2Jtime,what'"), "'%s'", header_err);
    }
    /* A line longer than the reader's buffer is an error at that line. */
    static char long_text[4096];
    int used = snprintf(long_text, sizeof long_text, "%s1,alloc,1,2,0\n1,alloc,1,", h);
    memset(long_text + used, '7', 2000);
    strcpy(long_text + used + 2000, ",0\n");
    expect_bad(long_text, "<memory>", 3, "line too long");
    /* A NUL byte inside a line. */
    static const char nul_text[] = "time_us,action,addr,size,stream\n1,alloc,1,2,0\n1,al\0loc,1,2,0\n";
    trace_event e[4];
    char err[512] = "";
    trace_reader *r = trace_open_memory(nul_text, sizeof nul_text - 1, err, sizeof err);
    REQUIRE(r != NULL);
    long n = read_all(r, e, 4, err, sizeof err);
    CHECK_MSG(n == -1 && strstr(err, "<memory>:3: ") == err && strstr(err, "not text"), "%ld '%s'", n, err);
    trace_close(r);
}

static void write_text(const char *path, const char *text, size_t length, bool gzip) {
    if (gzip) {
        gzFile gz = gzopen(path, "wb");
        REQUIRE(gz != NULL);
        REQUIRE(gzwrite(gz, text, (unsigned)length) == (int)length);
        REQUIRE(gzclose(gz) == Z_OK);
    } else {
        FILE *f = fopen(path, "wb");
        REQUIRE(f != NULL);
        REQUIRE(fwrite(text, 1, length, f) == length);
        REQUIRE(fclose(f) == 0);
    }
}

/* Errors from files name the file and the line, gzip or plain. */
static void test_malformed_files(void) {
    static trace_event e[MAX_EVENTS];
    char path[1024], err[512], expected[1100];
    for (int gzip = 0; gzip < 2; gzip++) {
        path_in(path, sizeof path, scratch_dir, gzip ? "bad_size.csv.gz" : "bad_size.csv");
        const char *text = "time_us,action,addr,size,stream\n1,alloc,1,2,0\n2,alloc,3,4,0\n3,free,1,2,0\n"
                           "4,alloc,5,six,0\n";
        write_text(path, text, strlen(text), gzip);
        long n = read_file(path, e, NULL, err, sizeof err);
        snprintf(expected, sizeof expected, "%s:5: bad size 'six'", path);
        CHECK_MSG(n == -1 && strcmp(err, expected) == 0, "got '%s', expected '%s'", err, expected);

        path_in(path, sizeof path, scratch_dir, gzip ? "empty.csv.gz" : "empty.csv");
        write_text(path, "", 0, gzip);
        CHECK(trace_open(path, err, sizeof err) == NULL && strstr(err, path) == err && strstr(err, "empty file"));

        path_in(path, sizeof path, scratch_dir, gzip ? "header.csv.gz" : "header.csv");
        write_text(path, "time;action\n1;alloc\n", 20, gzip);
        snprintf(expected, sizeof expected, "%s:1: unknown header", path);
        CHECK_MSG(trace_open(path, err, sizeof err) == NULL && strncmp(err, expected, strlen(expected)) == 0, "'%s'",
                  err);

        /* A NUL inside a line of a file (gzip and plain take different paths). */
        path_in(path, sizeof path, scratch_dir, gzip ? "nul.csv.gz" : "nul.csv");
        static const char nul_text[] = "time_us,action,addr,size,stream\n1,alloc,1,2,0\n1,al\0loc,1,2,0\n2,free,1,2,0\n";
        write_text(path, nul_text, sizeof nul_text - 1, gzip);
        n = read_file(path, e, NULL, err, sizeof err);
        snprintf(expected, sizeof expected, "%s:3: ", path);
        CHECK_MSG(n == -1 && strncmp(err, expected, strlen(expected)) == 0, "%ld '%s'", n, err);
    }
    path_in(path, sizeof path, scratch_dir, "does-not-exist.csv");
    CHECK(trace_open(path, err, sizeof err) == NULL && strstr(err, "cannot open"));
}

static unsigned char *slurp_bytes(const char *path, size_t *out_size) {
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    REQUIRE(fseek(f, 0, SEEK_END) == 0);
    long size = ftell(f);
    REQUIRE(size > 0 && fseek(f, 0, SEEK_SET) == 0);
    unsigned char *bytes = malloc((size_t)size);
    REQUIRE(bytes != NULL);
    REQUIRE(fread(bytes, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    *out_size = (size_t)size;
    return bytes;
}

/* Reads a damaged file: it must fail with "PATH:LINE: " then `what`, never
 * come back as a shorter trace. Returns LINE (0 when the check failed). */
static unsigned long long expect_damaged(const char *path, const unsigned char *bytes, size_t size, const char *what) {
    static trace_event e[MAX_EVENTS];
    write_text(path, (const char *)bytes, size, false);
    char err[512] = "";
    long n = read_file(path, e, NULL, err, sizeof err);
    CHECK_MSG(n == -1, "%s: read %ld events without an error", path, n);
    size_t path_len = strlen(path);
    CHECK_MSG(!strncmp(err, path, path_len) && err[path_len] == ':', "%s: the error does not name the file: '%s'", path,
              err);
    unsigned long long line = strtoull(err + path_len + 1, NULL, 10);
    CHECK_MSG(line > 0, "%s: no line in '%s'", path, err);
    if (what) CHECK_CONTAINS(err, what);
    return n == -1 ? line : 0;
}

/* Truncated and corrupt gzip files are errors that name the file and the
 * line reached (F9: zlib returned what it could inflate, quietly). */
static void test_damaged_gzip(void) {
    /* a good trace, 2 * 2000 events, a few tens of KiB compressed */
    enum { PAIRS = 2000 };
    char path[1024], err[512];
    path_in(path, sizeof path, scratch_dir, "good.csv.gz");
    trace_writer *w = trace_writer_open(path, err, sizeof err);
    REQUIRE(w != NULL);
    for (uint64_t i = 0; i < PAIRS; i++) {
        trace_event a = {i * 1000, (i + 1) * 4096, (i % 97 + 1) * 256, 0, TRACE_ALLOC};
        trace_event f = {i * 1000 + 500, (i + 1) * 4096, 0, 0, TRACE_FREE};
        REQUIRE(trace_write(w, &a) == 0 && trace_write(w, &f) == 0);
    }
    REQUIRE(trace_writer_close(w) == 0);
    static trace_event e[MAX_EVENTS];
    CHECK_EQ_I64(read_file(path, e, NULL, err, sizeof err), 2 * PAIRS);
    size_t size;
    unsigned char *bytes = slurp_bytes(path, &size);
    REQUIRE(size > 1000);

    /* cut mid-stream: the line reached is inside the trace */
    path_in(path, sizeof path, scratch_dir, "cut_half.csv.gz");
    unsigned long long line = expect_damaged(path, bytes, size / 2, "truncated gzip file");
    CHECK_MSG(line > 1 && line < 2 * PAIRS + 1, "cut at half: line %llu", line);
    /* cut a few bytes in: not even the header */
    path_in(path, sizeof path, scratch_dir, "cut_early.csv.gz");
    expect_damaged(path, bytes, 24, "truncated gzip file");
    /* every line there, the trailer (CRC, length) missing or half there */
    path_in(path, sizeof path, scratch_dir, "cut_trailer.csv.gz");
    line = expect_damaged(path, bytes, size - 8, "truncated gzip file");
    CHECK_EQ_U64(line, 2 * PAIRS + 2); /* past the last line */
    path_in(path, sizeof path, scratch_dir, "cut_length.csv.gz");
    expect_damaged(path, bytes, size - 3, "truncated gzip file");

    /* a wrong CRC: every line parses, only the check says no */
    unsigned char *copy = malloc(size);
    REQUIRE(copy != NULL);
    memcpy(copy, bytes, size);
    copy[size - 8] ^= 0xff;
    path_in(path, sizeof path, scratch_dir, "bad_crc.csv.gz");
    expect_damaged(path, copy, size, "corrupt gzip data");
    /* bytes flipped in the deflate data: zlib, the CRC or the parser objects */
    for (size_t at = size / 4; at < size - 16; at += size / 4) {
        memcpy(copy, bytes, size);
        for (size_t k = 0; k < 4; k++) copy[at + k] ^= 0x5a;
        path_in(path, sizeof path, scratch_dir, "flipped.csv.gz");
        expect_damaged(path, copy, size, NULL);
    }
    free(copy);
    free(bytes);
}

/* What the writer writes, the reader reads back (times in whole microseconds). */
static void test_writer_round_trip(void) {
    static trace_event in[MAX_EVENTS], out[MAX_EVENTS];
    uint64_t x = 12345;
    size_t count = 1000;
    for (size_t i = 0; i < count; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        in[i] = (trace_event){i * 1000 + (i ? 7000 : 0), x >> 8, (x >> 40) + 1, (uint32_t)(x % 3),
                              (uint8_t)(i % 2 ? TRACE_FREE : TRACE_ALLOC)};
    }
    for (int gzip = 0; gzip < 2; gzip++) {
        char path[1024], err[512];
        path_in(path, sizeof path, scratch_dir, gzip ? "round.csv.gz" : "round.csv");
        trace_writer *w = trace_writer_open(path, err, sizeof err);
        REQUIRE(w != NULL);
        for (size_t i = 0; i < count; i++) REQUIRE(trace_write(w, &in[i]) == 0);
        REQUIRE(trace_writer_close(w) == 0);
        long n = read_file(path, out, NULL, err, sizeof err);
        CHECK_MSG(n == (long)count, "%ld (%s)", n, err);
        bool same = n == (long)count;
        for (size_t i = 0; same && i < count; i++)
            same = out[i].time_ns == in[i].time_ns - in[0].time_ns && out[i].address == in[i].address &&
                   out[i].bytes == in[i].bytes && out[i].stream == in[i].stream && out[i].action == in[i].action;
        CHECK_MSG(same, "%s differs from what was written", path);
    }
}

static const test_case tests[] = {
    TEST_CASE(test_formats),
    TEST_CASE(test_rmm_details),
    TEST_CASE(test_lenient),
    TEST_CASE(test_malformed_lines),
    TEST_CASE(test_malformed_files),
    TEST_CASE(test_damaged_gzip),
    TEST_CASE(test_writer_round_trip),
};

/* argv[1]: the test data directory; argv[2]: a scratch directory; further
 * arguments select tests. */
int main(int argc, char **argv) {
    REQUIRE(argc >= 3);
    data_dir = argv[1];
    scratch_dir = argv[2];
    return TEST_MAIN("test_trace", tests, argc - 2, argv + 2);
}
