/* SPDX-License-Identifier: MIT */
/*
 * zlib_reference.h -- zlib's inflate of a whole buffer of raw deflate data:
 * the reference that the inflater's test (tests/tools/test_inflater.c) and
 * the fuzzers (fuzz_inflater.c, fuzz_gzip_reader.c) compare with. For tests
 * and fuzzers only: header-only, and it aborts if zlib cannot start.
 */
#ifndef TIDE_ZLIB_REFERENCE_H
#define TIDE_ZLIB_REFERENCE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* zlib's raw inflate of in[0, length) into text (capacity bytes, at most
 * 4 GiB): its text (*text_length), the input it used (*used), and whether
 * it reached the stream's end. */
static inline bool zlib_raw_inflate(const unsigned char *in, size_t length, unsigned char *text, size_t capacity,
                                    size_t *text_length, size_t *used) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit2(&z, -15) != Z_OK) {
        fprintf(stderr, "zlib_raw_inflate: zlib cannot start (out of memory)\n");
        abort();
    }
    z.next_in = (unsigned char *)(uintptr_t)in;
    z.avail_in = (uInt)length;
    z.next_out = text;
    z.avail_out = (uInt)capacity;
    bool ended = inflate(&z, Z_FINISH) == Z_STREAM_END;
    *text_length = capacity - z.avail_out;
    *used = length - z.avail_in;
    inflateEnd(&z);
    return ended;
}

#endif
