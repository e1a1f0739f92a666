/*
 * trace.h -- streaming reader of allocation traces.
 *
 * Formats, told apart by the header line:
 *   tidepool/PyTorch CSV   time_us,action,addr,size,stream
 *                          action: alloc | free
 *   RAPIDS RMM replay log  Thread,Time,Action,Pointer,Size,Stream
 *                          Action: allocate | free | allocate failure;
 *                          Time: seconds (fractional) or HH:MM:SS.micro
 * Files may be gzip-compressed or plain (zlib reads both). Events come out
 * in chunks, so a trace of any length streams through fixed memory.
 */
#ifndef TIDEPOOL_TRACE_H
#define TIDEPOOL_TRACE_H

#include <stddef.h>
#include <stdint.h>

typedef enum trace_action { TRACE_ALLOC = 0, TRACE_FREE = 1, TRACE_ALLOC_FAILURE = 2 } trace_action;
typedef enum trace_format { TRACE_FORMAT_TIDEPOOL = 0, TRACE_FORMAT_RMM = 1 } trace_format;

typedef struct trace_event {
    uint64_t time_ns; /* from the trace's first event */
    uint64_t address; /* identity only */
    uint64_t bytes;
    uint32_t stream;  /* trace's stream id (RMM: hashed pointer value) */
    uint8_t action;
} trace_event;

typedef struct trace_reader trace_reader;

/* Opens path; on failure returns NULL and writes the reason to err. */
trace_reader *trace_open(const char *path, char *err, size_t err_capacity);
/* Opens a trace held in memory (for tests and the fuzzer). */
trace_reader *trace_open_memory(const char *data, size_t length, char *err, size_t err_capacity);
void trace_close(trace_reader *reader);
trace_format trace_get_format(const trace_reader *reader);

/* Fills up to capacity events. Returns how many (0 at the end), or -1 on
 * malformed input with "FILE:LINE: what" in err; a truncated or corrupt
 * gzip file, or a read error, is malformed input too (LINE: the line being
 * read when the data stopped), never an early end. */
long trace_read(trace_reader *reader, trace_event *events, size_t capacity, char *err, size_t err_capacity);

/* Writes events in the tidepool CSV format. */
typedef struct trace_writer trace_writer;
trace_writer *trace_writer_open(const char *path, char *err, size_t err_capacity); /* ".gz" -> gzip */
int trace_write(trace_writer *writer, const trace_event *event);
int trace_writer_close(trace_writer *writer);

#endif
