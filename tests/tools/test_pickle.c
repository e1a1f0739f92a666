/* SPDX-License-Identifier: MIT */
/*
 * test_pickle.c -- the pickle reader (tools/pickle.c) and PyTorch memory
 * snapshots as traces (tools/trace.c): the committed snapshots (written by
 * make_pickles.py from qwen2vl_excerpt.csv, protocols 2, 4 and 5, gzip and
 * plain) read as the same events as the CSV; --pt-device; and malformed
 * pickles -- every truncation, unknown and refused opcodes, deep nesting,
 * huge lengths, memo abuse, integers at and past 64 bits -- end in an error
 * naming the offset, never a crash.
 * argv[1]: the test data directory; argv[2]: the fuzz corpus directory.
 */
#include "../check.h"
#include "pickle.h"
#include "trace.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static const char *data_dir, *corpus_dir;

#define MAX_EVENTS 4096

static long read_all(trace_reader *r, trace_event *events, size_t capacity, char *err, size_t cap) {
    size_t total = 0;
    for (;;) {
        size_t chunk = capacity - total < 13 ? capacity - total : 13;
        if (!chunk) return (long)total;
        long n = trace_read(r, events + total, chunk, err, cap);
        if (n < 0) return -1;
        if (n == 0) return (long)total;
        total += (size_t)n;
    }
}

static long read_path(const char *name, unsigned device, trace_event *events, trace_format *format, char *err,
                      size_t cap) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    trace_open_options options = {.pt_device = device};
    trace_reader *r = trace_open_with(path, &options, err, cap);
    if (!r) return -1;
    if (format) *format = trace_get_format(r);
    long n = read_all(r, events, MAX_EVENTS, err, cap);
    trace_close(r);
    return n;
}

static unsigned char *load(const char *dir, const char *name, size_t *length) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "rb");
    REQUIRE(f != NULL);
    static unsigned char buf[1 << 16];
    *length = fread(buf, 1, sizeof buf, f);
    fclose(f);
    unsigned char *copy = malloc(*length);
    REQUIRE(copy != NULL);
    memcpy(copy, buf, *length);
    return copy;
}

static void test_snapshots_read_as_the_csv(void) {
    static trace_event csv[MAX_EVENTS], pk[MAX_EVENTS];
    char err[512];
    long n = read_path("qwen2vl_excerpt.csv", 0, csv, NULL, err, sizeof err);
    REQUIRE(n > 0);
    const char *names[] = {"qwen2vl_excerpt.pickle", "qwen2vl_excerpt.p2.pickle.gz", "qwen2vl_excerpt.p5.pickle"};
    for (size_t f = 0; f < sizeof names / sizeof *names; f++) {
        trace_format format = TRACE_FORMAT_TIDEPOOL; /* stays so when the file does not open */
        long m = read_path(names[f], 0, pk, &format, err, sizeof err);
        CHECK_MSG(m == n, "%s: %ld events, the CSV has %ld (%s)", names[f], m, n, m < 0 ? err : "");
        CHECK_EQ_I64(format, TRACE_FORMAT_PYTORCH_PICKLE);
        bool same = m == n;
        for (long i = 0; same && i < n; i++)
            same = csv[i].time_ns == pk[i].time_ns && csv[i].address == pk[i].address && csv[i].bytes == pk[i].bytes &&
                   csv[i].stream == pk[i].stream && csv[i].action == pk[i].action;
        CHECK_MSG(same, "%s: events differ from the CSV's", names[f]);
    }
}

static void test_device_choice(void) {
    trace_event e[16];
    char err[512];
    long n = read_path("qwen2vl_excerpt.pickle", 1, e, NULL, err, sizeof err);
    REQUIRE(n == 4);
    CHECK_EQ_I64(e[0].action, TRACE_ALLOC);
    CHECK_EQ_U64(e[0].address, 0x10000);
    CHECK_EQ_U64(e[0].bytes, 1u << 20);
    CHECK_EQ_U64(e[0].stream, 7);
    CHECK_EQ_U64(e[2].time_ns, 2000);
    CHECK_EQ_I64(e[3].action, TRACE_FREE);
    CHECK_EQ_U64(e[3].time_ns, 10000);
    CHECK(read_path("qwen2vl_excerpt.pickle", 2, e, NULL, err, sizeof err) < 0);
    CHECK_CONTAINS(err, "device 2 has no trace: the snapshot holds 2 devices");
}

/* Opens bytes as a trace; returns the error ("" when it opened). */
static const char *open_error(const void *data, size_t length) {
    static char err[512];
    err[0] = '\0';
    trace_reader *r = trace_open_memory((const char *)data, length, err, sizeof err);
    if (r) {
        trace_event e[8];
        while (trace_read(r, e, 8, err, sizeof err) > 0) {
        }
        trace_close(r);
    }
    return err;
}

static void test_every_truncation_fails_cleanly(void) {
    size_t length;
    unsigned char *whole = load(corpus_dir, "pt_snapshot_p4.pickle", &length);
    CHECK_EQ_STR(open_error(whole, length), "");
    for (size_t cut = 1; cut < length; cut++) {
        const char *err = open_error(whole, cut);
        CHECK_MSG(strncmp(err, "<memory>: not a readable pickle: offset ", 40) == 0, "cut at %zu: '%s'", cut, err);
    }
    free(whole);
}

static void test_refused_and_unknown_opcodes(void) {
    /* os.system by GLOBAL + REDUCE: refused at the GLOBAL */
    static const char global[] = "\x80\x02" "cos\nsystem\n" "X\x02\x00\x00\x00id" "\x85R.";
    CHECK_CONTAINS(open_error(global, sizeof global - 1), "offset 2: unsupported pickle opcode 0x63 (GLOBAL)");
    static const char unknown[] = "\x80\x04\xff.";
    CHECK_CONTAINS(open_error(unknown, sizeof unknown - 1), "offset 2: unknown pickle opcode 0xff");
    static const char newer[] = "\x80\x06}.";
    CHECK_CONTAINS(open_error(newer, sizeof newer - 1), "offset 0: pickle protocol 6 is newer than 5");
    /* every single byte after PROTO: an error or a value, never a crash */
    for (int op = 0; op < 256; op++) {
        unsigned char text[] = {0x80, 0x04, (unsigned char)op, '.'};
        const char *err = open_error(text, sizeof text);
        CHECK_MSG(*err, "opcode 0x%02x alone opened as a snapshot", op);
    }
    /* structure errors */
    static const char setitem_on_list[] = "\x80\x02]K\x01K\x02s.";
    CHECK_CONTAINS(open_error(setitem_on_list, sizeof setitem_on_list - 1), "offset 7: SETITEM on a list, not a dict");
    static const char appends_no_mark[] = "\x80\x02]K\x01" "e.";
    CHECK_CONTAINS(open_error(appends_no_mark, sizeof appends_no_mark - 1), "offset 5: APPENDS without a MARK");
    static const char stop_empty[] = "\x80\x02.";
    CHECK_CONTAINS(open_error(stop_empty, sizeof stop_empty - 1), "STOP with nothing on the stack");
    static const char odd_setitems[] = "\x80\x02}(K\x01u.";
    CHECK_CONTAINS(open_error(odd_setitems, sizeof odd_setitems - 1), "SETITEMS with a key without a value");
}

static void test_huge_lengths_and_memo(void) {
    static const char unicode8[] = "\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x80" "abc.";
    CHECK_CONTAINS(open_error(unicode8, sizeof unicode8 - 1), "offset 2: truncated pickle: opcode 0x8d needs 9223372036854775808 bytes");
    static const char unicode4[] = "\x80\x02X\xff\xff\xff\xff" "abc.";
    CHECK_CONTAINS(open_error(unicode4, sizeof unicode4 - 1), "needs 4294967295 bytes");
    static const char long4[] = "\x80\x02\x8b\xff\xff\xff\x7f\x01.";
    CHECK_CONTAINS(open_error(long4, sizeof long4 - 1), "needs 2147483647 bytes");
    static const char long4_negative[] = "\x80\x02\x8b\xff\xff\xff\xff\x01.";
    CHECK_CONTAINS(open_error(long4_negative, sizeof long4_negative - 1), "LONG4 with a negative length");
    static const char frame[] = "\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\xff}.";
    CHECK_CONTAINS(open_error(frame, sizeof frame - 1), "without 'device_traces'"); /* a FRAME's length is a hint */
    static const char put_far[] = "\x80\x02}r\xff\xff\xff\xff.";
    CHECK_CONTAINS(open_error(put_far, sizeof put_far - 1), "offset 3: memo index 4294967295 far beyond the 0 entries");
    static const char get_unset[] = "\x80\x02}q\x00h\x05.";
    CHECK_CONTAINS(open_error(get_unset, sizeof get_unset - 1), "offset 5: memo entry 5 was never stored");
    /* a list that holds itself: read, not walked forever */
    static const char cycle[] = "\x80\x02]q\x00h\x00" "a.";
    char err[256];
    pk_doc *doc = pk_parse((const unsigned char *)cycle, sizeof cycle - 1, err, sizeof err);
    REQUIRE(doc != NULL);
    CHECK(pk_list_item(pk_root(doc), 0) == pk_root(doc));
    pk_free(doc);
}

static void test_deep_nesting(void) {
    enum { DEPTH = 1000000 };
    /* a list in a list ... a million deep, as Python's pickler writes it:
     * (EMPTY_LIST MEMOIZE) x N, APPEND x N-1 */
    size_t length = 2 + 2 * DEPTH + (DEPTH - 1) + 1;
    unsigned char *text = malloc(length);
    REQUIRE(text != NULL);
    text[0] = 0x80, text[1] = 0x04;
    for (size_t i = 0; i < DEPTH; i++) text[2 + 2 * i] = ']', text[3 + 2 * i] = 0x94;
    memset(text + 2 + 2 * DEPTH, 'a', DEPTH - 1);
    text[length - 1] = '.';
    char err[256];
    pk_doc *doc = pk_parse(text, length, err, sizeof err);
    CHECK_MSG(doc != NULL, "%s", err);
    if (doc) {
        const pk_value *v = pk_root(doc);
        size_t depth = 1;
        while (pk_list_count(v)) v = pk_list_item(v, 0), depth++;
        CHECK_EQ_U64(depth, DEPTH);
        pk_free(doc);
    }
    CHECK_CONTAINS(open_error(text, length), "without 'device_traces'");
    /* a million MARKs and nothing else: truncated */
    memset(text + 2, '(', length - 2);
    CHECK_CONTAINS(open_error(text, length), "truncated pickle");
    free(text);
}

static void test_integers(void) {
    static const struct {
        const char *bytes;
        size_t length;
        bool fits;
        uint64_t bits;
    } cases[] = {
        {"\x80\x02\x8a\x00.", 5, true, 0},                                          /* LONG1 0 */
        {"\x80\x02\x8a\x01\xff.", 6, true, UINT64_MAX},                             /* -1 */
        {"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00.", 14, true, UINT64_MAX}, /* 2^64-1 */
        {"\x80\x02\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01.", 14, false, 0},    /* 2^64 */
        {"\x80\x02\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80.", 13, true, 1ull << 63}, /* -2^63 */
        {"\x80\x02\x8a\x09\xff\xff\xff\xff\xff\xff\xff\x7f\xff.", 14, false, 0},    /* -2^63-1 */
        {"\x80\x02J\xfe\xff\xff\xff.", 8, true, UINT64_MAX - 1},                    /* BININT -2 */
        {"\x80\x02M\x34\x12.", 6, true, 0x1234},                                    /* BININT2 */
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char err[256];
        pk_doc *doc = pk_parse((const unsigned char *)cases[i].bytes, cases[i].length, err, sizeof err);
        CHECK_MSG(doc != NULL, "case %zu: %s", i, err);
        if (!doc) continue;
        uint64_t bits = 0;
        bool fits = pk_as_bits64(pk_root(doc), &bits);
        CHECK_MSG(fits == cases[i].fits && (!fits || bits == cases[i].bits), "case %zu: fits %d bits %llx", i, fits,
                  (unsigned long long)bits);
        pk_free(doc);
    }
}

static void test_not_a_snapshot(void) {
    static const char list[] = "\x80\x04]K\x01" "a.";
    CHECK_CONTAINS(open_error(list, sizeof list - 1), "<memory>: a pickle without 'device_traces'");
    /* {"device_traces": [[1]]}: an entry that is not a dict */
    static const char not_dict[] = "\x80\x02}X\x0d\x00\x00\x00" "device_traces]]K\x01" "aas.";
    CHECK_CONTAINS(open_error(not_dict, sizeof not_dict - 1), "device_traces[0][0]: a int, not a dict");
    /* {"device_traces": [[{"action": "alloc"}]]}: no addr */
    static const char no_addr[] = "\x80\x02}X\x0d\x00\x00\x00" "device_traces]]}X\x06\x00\x00\x00" "actionX\x05\x00\x00\x00"
                                  "allocsaas.";
    CHECK_CONTAINS(open_error(no_addr, sizeof no_addr - 1), "device_traces[0][0]: 'addr' is missing");
    /* no device at all */
    static const char none[] = "\x80\x02}X\x0d\x00\x00\x00" "device_traces]s.";
    CHECK_CONTAINS(open_error(none, sizeof none - 1), "holds no device trace");
}

/* Memory is bounded by the bytes read: a run of values nothing consumes
 * (a gzip bomb's EMPTY_LISTs) or of memo indices skipped ahead is refused
 * within its first MiB or so; what Python's pickler writes at the most
 * memory per byte -- a million small ints, a million empty lists -- is not. */
static void test_memory_bounded_by_input(void) {
    enum { RUN = 8 << 20, COUNT = 1000000, BATCH = 1000 };
    unsigned char *text = malloc(RUN + 16);
    REQUIRE(text != NULL);
    char err[256];
    /* PROTO 2, EMPTY_LIST x 8 Mi, STOP */
    size_t length = 0;
    text[length++] = 0x80, text[length++] = 0x02;
    memset(text + length, ']', RUN), length += RUN;
    text[length++] = '.';
    pk_doc *doc = pk_parse(text, length, err, sizeof err);
    CHECK(doc == NULL);
    pk_free(doc);
    CHECK_CONTAINS(err, "malformed pickle: its first ");
    CHECK_CONTAINS(err, "bytes of memory to read (32 a byte plus 1048576; a snapshot takes about 4 a byte)");
    unsigned long long at = 0;
    CHECK_MSG(sscanf(err, "offset %llu", &at) == 1 && at < (1u << 18), "refused late: %s", err);
    CHECK_CONTAINS(open_error(text, length), "<memory>: not a readable pickle: offset ");
    /* PROTO 2, None, LONG_BINPUT 4096, 8192, ... (32 KiB of memo each) */
    length = 0;
    text[length++] = 0x80, text[length++] = 0x02, text[length++] = 'N';
    for (uint32_t i = 1; i <= 1000; i++) {
        uint32_t index = i * 4096;
        text[length++] = 'r';
        for (int b = 0; b < 4; b++) text[length++] = (unsigned char)(index >> (8 * b));
    }
    text[length++] = '.';
    doc = pk_parse(text, length, err, sizeof err);
    CHECK(doc == NULL);
    pk_free(doc);
    CHECK_CONTAINS(err, "malformed pickle: its first ");
    free(text);
    /* what pickle.dumps([i % 256 for i in range(COUNT)], 4) and
     * pickle.dumps([[] for _ in range(COUNT)], 4) write: EMPTY_LIST MEMOIZE,
     * then batches of MARK, BATCH items, APPENDS */
    for (int empty_lists = 0; empty_lists <= 1; empty_lists++) {
        text = malloc(4 + (size_t)COUNT * 2 + (COUNT / BATCH) * 2 + 1);
        REQUIRE(text != NULL);
        length = 0;
        text[length++] = 0x80, text[length++] = 0x04, text[length++] = ']', text[length++] = 0x94;
        for (size_t i = 0; i < COUNT; i++) {
            if (i % BATCH == 0) text[length++] = '(';
            if (empty_lists) text[length++] = ']', text[length++] = 0x94;
            else text[length++] = 'K', text[length++] = (unsigned char)i;
            if (i % BATCH == BATCH - 1) text[length++] = 'e';
        }
        text[length++] = '.';
        doc = pk_parse(text, length, err, sizeof err);
        CHECK_MSG(doc != NULL, "%s: %s", empty_lists ? "empty lists" : "small ints", err);
        if (doc) CHECK_EQ_U64(pk_list_count(pk_root(doc)), COUNT);
        pk_free(doc);
        free(text);
    }
}

/* A snapshot larger than the limit (TRACE_SNAPSHOT_MAX_BYTES; here the
 * options' lower one) is refused at open, inflated or plain, whole or
 * streamed; one at the limit is read. */
static void test_snapshot_size_limit(void) {
    static trace_event events[MAX_EVENTS];
    size_t gz_length = 0, plain_length = 0;
    unsigned char *gz = load(data_dir, "qwen2vl_excerpt.p2.pickle.gz", &gz_length);
    free(load(data_dir, "qwen2vl_excerpt.pickle", &plain_length));
    REQUIRE(gz_length > 4);
    /* the gzip trailer's ISIZE: the inflated size */
    const unsigned char *t = gz + gz_length - 4;
    uint64_t inflated = (uint64_t)t[0] | (uint64_t)t[1] << 8 | (uint64_t)t[2] << 16 | (uint64_t)t[3] << 24;
    free(gz);
    const struct {
        const char *name;
        uint64_t size;
        const char *what;
    } files[] = {{"qwen2vl_excerpt.p2.pickle.gz", inflated, " bytes inflated, the most tide reads"},
                 {"qwen2vl_excerpt.pickle", plain_length, " bytes, the most tide reads"}};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++)
        for (int stream = 0; stream <= 1; stream++) {
            char path[1024], err[512] = "", expected[256];
            snprintf(path, sizeof path, "%s/%s", data_dir, files[f].name);
            trace_open_options options = {.zlib_gzip = stream, .snapshot_max_bytes = files[f].size - 1};
            trace_reader *r = trace_open_with(path, &options, err, sizeof err);
            CHECK_MSG(r == NULL, "%s opened with a limit below its size", files[f].name);
            trace_close(r);
            snprintf(expected, sizeof expected, "%s: the snapshot is larger than %llu%s", files[f].name,
                     (unsigned long long)files[f].size - 1, files[f].what);
            CHECK_CONTAINS(err, expected);
            options.snapshot_max_bytes = files[f].size;
            r = trace_open_with(path, &options, err, sizeof err);
            CHECK_MSG(r != NULL, "%s: %s", files[f].name, err);
            if (r) CHECK(read_all(r, events, MAX_EVENTS, err, sizeof err) > 0);
            trace_close(r);
        }
}

static const test_case tests[] = {
    TEST_CASE(test_snapshots_read_as_the_csv),
    TEST_CASE(test_device_choice),
    TEST_CASE(test_every_truncation_fails_cleanly),
    TEST_CASE(test_refused_and_unknown_opcodes),
    TEST_CASE(test_huge_lengths_and_memo),
    TEST_CASE(test_deep_nesting),
    TEST_CASE(test_integers),
    TEST_CASE(test_not_a_snapshot),
    TEST_CASE(test_memory_bounded_by_input),
    TEST_CASE(test_snapshot_size_limit),
};

int main(int argc, char **argv) {
    REQUIRE(argc >= 3);
    data_dir = argv[1];
    corpus_dir = argv[2];
    return TEST_MAIN("test_pickle", tests, argc - 2, argv + 2);
}
