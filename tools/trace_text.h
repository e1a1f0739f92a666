/* SPDX-License-Identifier: MIT */
/*
 * trace_text.h -- the line parser of the CSV trace formats (trace.h), on
 * text held in memory: a block of whole lines parses with no state from
 * the blocks before it, so blocks split at newlines parse in any order, on
 * any thread. trace.c cuts the blocks, runs the parsers and puts the
 * results back in order.
 */
#ifndef TIDEPOOL_TRACE_TEXT_H
#define TIDEPOOL_TRACE_TEXT_H

#include "trace.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest line accepted, its newline included (what the reader's old
 * 1024-byte line buffer held). */
#define TRACE_LINE_MAX_BYTES 1023

/* Room for the events of length bytes of text: an event line is at least
 * 12 bytes ("0,free,0,0,0"). */
static inline size_t trace_text_max_events(size_t length) { return length / 12 + 1; }

typedef struct trace_text_result {
    size_t events;  /* events written */
    uint64_t lines; /* lines parsed, blank ones included; after an error: the lines before the bad one */
} trace_text_result;

/* Parses text[0, length), whole lines: each ends with '\n', except that the
 * end of the text ends the last one. events has room for
 * trace_text_max_events(length). Event times are the trace's own (time_us
 * * 1000, or the RMM time), not yet relative to the first event. Blank
 * lines and CR before LF are accepted. Returns true; false at the first
 * bad line, with what it is in what ("bad size 'six'", no file or line:
 * the line is result->lines + 1 of the text). */
bool trace_text_parse(trace_format format, const char *text, size_t length, trace_event *events,
                      trace_text_result *result, char *what, size_t what_capacity);

/* One line, the careful way: the reference for trace_text_parse (which
 * calls it for every line its fast path does not take) and for the tests.
 * line[0, length) is the line as the text holds it, its newline included if
 * it has one. Returns 1 with *event filled, 0 for a blank line, -1 with
 * what filled. */
int trace_text_parse_line(trace_format format, const char *line, size_t length, trace_event *event, char *what,
                          size_t what_capacity);

/* Replaces bytes below 0x20 and 0x7f (DEL) in text by '?', so that a
 * message quoting a file's bytes sends no terminal escapes. */
void trace_text_printable(char *text);

#endif
