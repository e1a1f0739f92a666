/* SPDX-License-Identifier: MIT */
/*
 * inflater.h -- a streaming decoder of raw deflate data (RFC 1951) held
 * whole in memory, for the trace reader's gzip files: it writes the text
 * straight into the caller's buffers, a buffer at a time, so the parse
 * workers can follow it, and decodes nearly three times as fast as zlib's
 * inflate (inflater.c says how). It checks nothing beyond the deflate
 * format: the gzip wrapper and its CRC-32 are the caller's.
 *
 * Contract: any data that zlib's inflate rejects, the inflater rejects too
 * (at or before the same symbol, having produced at most the same text);
 * it may also reject some odd but valid streams (an incomplete Huffman code
 * zlib accepts), so a caller that gets INFLATER_ERROR hands the stream to
 * zlib, which then decodes it or says what is wrong. Text it produces is
 * what any correct decoder produces.
 */
#ifndef TIDE_INFLATER_H
#define TIDE_INFLATER_H

#include <stddef.h>
#include <stdint.h>

typedef struct inflater inflater;

typedef enum inflater_status {
    INFLATER_MORE,  /* the buffer is full; call again for more */
    INFLATER_END,   /* the final block ended (inflater_input_used says where) */
    INFLATER_ERROR, /* damaged or unsupported data (inflater_error says why) */
} inflater_status;

/* NULL: out of memory. */
inflater *inflater_create(void);
void inflater_destroy(inflater *d);

/* Starts decoding the raw deflate data at in[0, length). The bytes stay
 * the caller's and must not change until the next start or the destroy. */
void inflater_start(inflater *d, const unsigned char *in, size_t length);

/* Up to capacity bytes of text into out (*produced: how many). MORE means
 * out is full; END and ERROR may come with text before them. After END or
 * ERROR every call returns the same with nothing produced. */
inflater_status inflater_read(inflater *d, unsigned char *out, size_t capacity, size_t *produced);

/* After END: the bytes of input the stream took, its last byte included. */
size_t inflater_input_used(const inflater *d);

/* Bytes of input behind the text produced so far (a progress figure). */
size_t inflater_input_position(const inflater *d);

/* Text produced since the start. */
uint64_t inflater_total_out(const inflater *d);

/* After ERROR: why, in a few words. */
const char *inflater_error(const inflater *d);

#endif
