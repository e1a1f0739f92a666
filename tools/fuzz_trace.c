/* SPDX-License-Identifier: MIT */
/*
 * fuzz_trace.c -- libFuzzer target for the trace reader (trace.c, pickle.c).
 *
 * Any input opens as a trace held in memory and is read to its end in
 * small chunks. Beyond "no crash, no sanitizer report", it checks the
 * reader's contract: a refused header or a malformed line comes with an
 * error that names the source ("<memory>:"), a chunk never exceeds its
 * capacity, every event has a known action, and event times are relative
 * to the first event (the reader clamps times that run backwards to 0 and
 * never produces one before the origin, so the first event is at 0).
 * A PyTorch snapshot (a pickle: first byte 0x80) goes through the pickle
 * reader (pickle.c) at open, under the same contract.
 * A broken contract aborts, which the fuzzer reports as a crash.
 */
#include "trace.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

#define CONTRACT(cond)                                                           \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "fuzz_trace: contract broken: %s\n", #cond);        \
            abort();                                                             \
        }                                                                        \
    } while (0)

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size) {
    char err[512] = "";
    trace_reader *reader = trace_open_memory((const char *)data, size, err, sizeof err);
    if (!reader) {
        CONTRACT(strncmp(err, "<memory>:", 9) == 0);
        return 0;
    }
    enum { CHUNK = 7 };
    trace_event events[CHUNK + 1];
    events[CHUNK].bytes = 0xfeedfacecafebeefull; /* guard */
    bool first = true;
    for (;;) {
        long n = trace_read(reader, events, CHUNK, err, sizeof err);
        CONTRACT(events[CHUNK].bytes == 0xfeedfacecafebeefull);
        if (n < 0) {
            CONTRACT(strncmp(err, "<memory>:", 9) == 0);
            break;
        }
        CONTRACT(n <= CHUNK);
        if (n == 0) break;
        for (long i = 0; i < n; i++) {
            CONTRACT(events[i].action <= TRACE_ALLOC_FAILURE);
            if (first) CONTRACT(events[i].time_ns == 0);
            first = false;
        }
    }
    trace_close(reader);
    return 0;
}
