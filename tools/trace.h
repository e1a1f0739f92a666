/* SPDX-License-Identifier: MIT */
/*
 * trace.h -- streaming reader of allocation traces.
 *
 * Formats, told apart by the header line:
 *   tidepool/PyTorch CSV   time_us,action,addr,size,stream
 *                          action: alloc | free
 *   RAPIDS RMM replay log  Thread,Time,Action,Pointer,Size,Stream
 *                          Action: allocate | free | allocate failure;
 *                          Time: seconds (fractional) or HH:MM:SS.micro
 *   PyTorch memory snapshot
 *                          the pickle torch.cuda.memory._snapshot() returns
 *                          (what _dump_snapshot writes and memory_viz reads),
 *                          told by its first byte (0x80, pickle's PROTO):
 *                          device_traces[device] entries with action alloc
 *                          become allocs, free_requested frees, the others
 *                          (free_completed, segment_*, snapshot, oom, ...)
 *                          are left out; addr, size, stream, time_us as in
 *                          the CSV; other keys (frames, ...) are ignored.
 * Files may be gzip-compressed or plain. CSV events come out in blocks of
 * lines, so a trace of any length streams through fixed memory; with
 * threads, worker threads (in the caller's
 * process, or in a worker process) parse blocks ahead (and run the batch
 * hook on them, in order) while the caller takes them in order. A snapshot is read whole at open (a
 * pickle is one object), its events kept: at most TRACE_SNAPSHOT_MAX_BYTES
 * of it. trace.c says how.
 */
#ifndef TIDEPOOL_TRACE_H
#define TIDEPOOL_TRACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum trace_action { TRACE_ALLOC = 0, TRACE_FREE = 1, TRACE_ALLOC_FAILURE = 2 } trace_action;
typedef enum trace_format {
    TRACE_FORMAT_TIDEPOOL = 0,
    TRACE_FORMAT_RMM = 1,
    TRACE_FORMAT_PYTORCH_PICKLE = 2
} trace_format;

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

/* The most bytes of a PyTorch snapshot (inflated, when gzip) a reader
 * takes: a snapshot is read whole, then parsed into values that take a few
 * times its size (pickle.c bounds them at 32 a byte), so a gzip bomb --
 * 4 MiB of gzip inflate to 4 GiB -- is refused here. Snapshots of
 * _record_memory_history(max_entries=10_000_000) take about a GiB. CSV and
 * RMM traces stream and have no such limit. */
#define TRACE_SNAPSHOT_MAX_BYTES (4ull << 30)

typedef struct trace_open_options {
    unsigned pt_device; /* PyTorch snapshots: the device whose trace is read (default 0) */
    /* For tests and measurements (0/false: the defaults): the bytes of text
     * in a block (at least 1024; default 1 MiB), gzip inflated by zlib
     * alone, never the inflater (also the environment's TIDE_INFLATE=zlib),
     * the most bytes of a snapshot (default TRACE_SNAPSHOT_MAX_BYTES), and
     * the inflater made to give up (as on data it rejects: zlib takes over)
     * once it has given inflater_gives_up_at bytes of text. */
    size_t block_bytes;
    bool zlib_gzip;
    uint64_t snapshot_max_bytes;
    bool inflater_gives_up;
    uint64_t inflater_gives_up_at;
} trace_open_options;
/* The same with options (NULL: the defaults). A snapshot that cannot be
 * read, or has no trace for the device, fails here with the reason
 * ("FILE: not a readable pickle: offset N: what"). */
trace_reader *trace_open_with(const char *path, const trace_open_options *options, char *err, size_t err_capacity);
trace_reader *trace_open_memory_with(const char *data, size_t length, const trace_open_options *options, char *err,
                                     size_t err_capacity);
void trace_close(trace_reader *reader);
trace_format trace_get_format(const trace_reader *reader);

/* Fills up to capacity events. Returns how many (0 at the end), or -1 on
 * malformed input with "FILE:LINE: what" in err; a truncated or corrupt
 * gzip file, or a read error, is malformed input too (LINE: the line being
 * read when the data stopped), never an early end. */
long trace_read(trace_reader *reader, trace_event *events, size_t capacity, char *err, size_t err_capacity);

/* The next events in trace order, without a copy: *events points into the
 * reader and stays valid until the next read or trace_close. Returns how
 * many (0 at the end), or -1 as trace_read. Mixing it with trace_read is
 * allowed (trace_read copies out of the same blocks). */
long trace_read_batch(trace_reader *reader, const trace_event **events, char *err, size_t err_capacity);

/* Called on the events of each batch in trace order, before
 * trace_read_batch (or trace_read) hands them out, after their times were
 * made relative to the first event; it may rewrite the events (the replay
 * puts each event's live-table slot in its address). It sees exactly the
 * events the caller gets, no more: none after a malformed line. With
 * threads it runs on a worker thread (in the worker process, if there is
 * one: trace_set_worker_process), never two calls at once, each one
 * done before the caller gets its batch; without, on the caller's thread.
 * Set before the first read (later it changes nothing). */
typedef void (*trace_batch_hook)(void *user, trace_event *events, size_t count);
void trace_set_batch_hook(trace_reader *reader, trace_batch_hook hook, void *user);

/* Host time the batch hook (and the ordering step around it) took on the
 * batches handed out so far, on whichever thread or process ran it. */
uint64_t trace_hook_ns(const trace_reader *reader);

/* The workers (trace_set_threads) run in a worker process of their own
 * (fork) instead of the caller's: the blocks and their events are handed
 * over through shared memory, so the caller's process has no second
 * thread -- and glibc keeps its mutexes on their single-threaded path
 * (about 4 ns a lock and unlock here, against 11-12 ns once a process has
 * had a second thread); the replay's pool and simulated device take one
 * or two an event. The batch hook then runs in that process: what it
 * writes into the events comes back, what it changes in its own memory
 * does not. Where fork fails, threads. Set before the first read. */
void trace_set_worker_process(trace_reader *reader, bool process);

/* Worker threads that read and parse CSV blocks ahead of the caller (0,
 * the default: all on the caller's thread; at most 64). Set before the
 * first read; later it changes nothing, as for a snapshot. The events and
 * errors are the same whatever the count. */
void trace_set_threads(trace_reader *reader, unsigned threads);

/* How far the reader is: bytes of the file as stored (compressed or not)
 * read so far and in all (0: not known, e.g. a pipe or memory), and the
 * events in all (0: not known; a snapshot knows them at open). */
void trace_position(const trace_reader *reader, uint64_t *bytes_read, uint64_t *bytes_total, uint64_t *events_total);

/* Writes events in the tidepool CSV format. */
typedef struct trace_writer trace_writer;
trace_writer *trace_writer_open(const char *path, char *err, size_t err_capacity); /* ".gz" -> gzip */
int trace_write(trace_writer *writer, const trace_event *event);
int trace_writer_close(trace_writer *writer);

#endif
