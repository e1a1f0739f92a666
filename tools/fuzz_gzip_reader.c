/* SPDX-License-Identifier: MIT */
/*
 * fuzz_gzip_reader.c -- libFuzzer target for the trace reader's gzip path
 * (trace.c with inflater.c), against zlib alone.
 *
 * The input's first byte picks the reader's block size; the rest is raw
 * deflate data. Where zlib decodes a whole stream from its start, the file
 * is a gzip header, that stream, its true trailer (CRC-32, length) and the
 * input's remaining bytes (a second member, or bytes after the last one);
 * otherwise a gzip header and the data as they are (damaged). The file is
 * read twice, serially: as the reader does by default (the inflater, zlib
 * taking over the first member where the inflater rejects it) and with
 * zlib alone (trace_open_options.zlib_gzip). Beyond "no crash, no sanitizer
 * report", the two must give the same events, in the same order, and end
 * the same way: at the end, or with the same error. A difference aborts,
 * which the fuzzer reports as a crash.
 */
#include "trace.h"
#include "zlib_reference.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

static void broken(const char *what, const char *a, const char *b) {
    fprintf(stderr, "fuzz_gzip_reader: %s ('%s' / '%s')\n", what, a, b);
    abort();
}

typedef struct outcome {
    uint64_t events, hash;
    bool failed;
    char err[512];
} outcome;

static void read_all(const char *path, size_t block_bytes, bool zlib_alone, outcome *o) {
    memset(o, 0, sizeof *o);
    o->hash = 1469598103934665603ull;
    trace_open_options options = {.block_bytes = block_bytes, .zlib_gzip = zlib_alone};
    trace_reader *r = trace_open_with(path, &options, o->err, sizeof o->err);
    if (!r) {
        o->failed = true;
        return;
    }
    trace_event events[64];
    for (;;) {
        long n = trace_read(r, events, 64, o->err, sizeof o->err);
        if (n < 0) o->failed = true;
        if (n <= 0) break;
        for (long i = 0; i < n; i++) {
            const trace_event *e = &events[i];
            uint64_t fields[5] = {e->time_ns, e->address, e->bytes, e->stream, e->action};
            for (int k = 0; k < 5; k++) o->hash = (o->hash ^ fields[k]) * 1099511628211ull;
        }
        o->events += (uint64_t)n;
    }
    trace_close(r);
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static char path[64];
    static unsigned char *file, *text;
    static const size_t TEXT_MAX = 1u << 20;
    if (!path[0]) {
        snprintf(path, sizeof path, "/tmp/fuzz_gzip_reader.%ld.gz", (long)getpid());
        file = malloc(1u << 21);
        text = malloc(TEXT_MAX);
        if (!file || !text) broken("out of memory", "", "");
    }
    if (size < 1 || size > (1u << 20)) return 0;
    size_t block_bytes = 1024 + (size_t)(data[0] % 8) * 517;
    const unsigned char *in = data + 1;
    size_t length = size - 1, at = 0;
    static const unsigned char header[10] = {0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3};
    memcpy(file, header, 10);
    at = 10;

    size_t text_length = 0, used = 0;
    bool whole = zlib_raw_inflate(in, length, text, TEXT_MAX, &text_length, &used);
    if (whole) { /* the stream, its true trailer, then the rest */
        memcpy(file + at, in, used);
        at += used;
        uint32_t crc = (uint32_t)crc32(0, text, (uInt)text_length), isize = (uint32_t)text_length;
        for (int k = 0; k < 4; k++) file[at++] = (unsigned char)(crc >> (8 * k));
        for (int k = 0; k < 4; k++) file[at++] = (unsigned char)(isize >> (8 * k));
        memcpy(file + at, in + used, length - used);
        at += length - used;
    } else {
        memcpy(file + at, in, length);
        at += length;
    }
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(file, 1, at, f) != at || fclose(f) != 0) broken("cannot write the file", path, "");

    outcome mine, zlib_alone;
    read_all(path, block_bytes, false, &mine);
    read_all(path, block_bytes, true, &zlib_alone);
    if (mine.failed != zlib_alone.failed) broken("one read failed, the other did not", mine.err, zlib_alone.err);
    if (mine.failed && strcmp(mine.err, zlib_alone.err)) broken("different errors", mine.err, zlib_alone.err);
    if (mine.events != zlib_alone.events || mine.hash != zlib_alone.hash)
        broken("different events", mine.err, zlib_alone.err);
    return 0;
}
