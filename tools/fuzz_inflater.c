/* SPDX-License-Identifier: MIT */
/*
 * fuzz_inflater.c -- libFuzzer target for the trace reader's deflate
 * decoder (inflater.c), against zlib.
 *
 * The input's first byte picks the buffer sizes (1 to 256 bytes, or 64 KiB
 * when it is 0); the rest is raw deflate data, decoded by the inflater a
 * buffer at a time and by zlib's inflate at once. Beyond "no crash, no
 * sanitizer report", it checks inflater.h's contract: a call never writes
 * past its buffer, MORE comes with a full buffer, the inflater's text is a
 * prefix of zlib's (the trace reader hands a rejected stream to zlib,
 * dropping the text already given), and END only where zlib reaches the
 * stream's end with the same text and input. A broken contract aborts,
 * which the fuzzer reports as a crash.
 */
#include "inflater.h"
#include "zlib_reference.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEXT_MAX (1u << 20)

static void broken(const char *what) {
    fprintf(stderr, "fuzz_inflater: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    static unsigned char mine[TEXT_MAX + 1], theirs[TEXT_MAX];
    static inflater *d;
    if (!d && !(d = inflater_create())) broken("out of memory");
    if (size < 1) return 0;
    size_t chunk = data[0] ? data[0] : 65536;
    const unsigned char *in = data + 1;
    size_t length = size - 1;

    inflater_start(d, in, length);
    size_t at = 0;
    inflater_status st = INFLATER_MORE;
    while (st == INFLATER_MORE && at < TEXT_MAX) {
        size_t room = TEXT_MAX - at < chunk ? TEXT_MAX - at : chunk, got = 0;
        mine[at + room] = 0xa5; /* a guard: never written */
        st = inflater_read(d, mine + at, room, &got);
        if (got > room || mine[at + room] != 0xa5) broken("wrote past its buffer");
        if (st == INFLATER_MORE && got != room) broken("MORE with a buffer not full");
        at += got;
    }

    size_t theirs_length = 0, theirs_used = 0;
    bool zlib_end = zlib_raw_inflate(in, length, theirs, TEXT_MAX, &theirs_length, &theirs_used);

    if (at > theirs_length || memcmp(mine, theirs, at)) broken("text that is not a prefix of zlib's");
    if (st == INFLATER_END &&
        (!zlib_end || theirs_length != at || theirs_used != inflater_input_used(d)))
        broken("END where zlib does not end there");
    return 0;
}
