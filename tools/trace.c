/* SPDX-License-Identifier: MIT */
/*
 * trace.c -- the trace reader and writer (formats in trace.h).
 *
 * The source. A file is gzip when it starts with the gzip magic (1f 8b),
 * plain otherwise (as zlib's gzopen tells them). Its text comes from one of
 *   - a region in memory, cut into blocks without copying: the caller's
 *     data (trace_open_memory), or a plain regular file mapped (mmap);
 *   - a stream, read in blocks of BLOCK_BYTES through a fixed buffer: gzip
 *     inflated into the blocks as they are cut (concatenated members are
 *     read on, bytes after the last member ignored, as gzread does), or
 *     read() for a plain file that cannot be mapped (a pipe). Of a regular
 *     gzip file, the first member -- a trace's whole text, as gzip writes
 *     it -- is decoded by the inflater (inflater.c, 2.8x zlib's speed)
 *     from the file mapped, unless its header is one zlib should read or
 *     TIDE_INFLATE=zlib (trace_open_options.zlib_gzip); later members, a
 *     pipe's, and a first member the inflater rejects are zlib's: zlib then
 *     inflates the file again from its start, drops the text already
 *     given, and decodes the rest or says what is wrong (so damaged data
 *     reads as it does with zlib alone). The first member's CRC-32 is not
 *     computed by the thread that inflates: each block's text is summed as
 *     it is parsed (in parallel), and the ordering step, which takes the
 *     blocks in order anyway, combines the sums and compares (crc_feed);
 *     later members zlib checks.
 * Damaged gzip data is an error, never a shorter trace: a stream cut short
 * (inflate wants input after the file's end: "truncated gzip file"), bad
 * deflate data or a wrong CRC/length trailer ("corrupt gzip data"), or a
 * read error, named with the file and the line being read when the data
 * stopped. Text inflated before the damage is parsed first, so a bad line
 * before it is the error reported.
 *
 * Blocks. The text after the header is cut at newlines into blocks of at
 * most BLOCK_BYTES of whole lines (the last block may end without one); a
 * stream keeps the bytes after the last newline (at most
 * TRACE_LINE_MAX_BYTES, else the line is too long: an error) for the next
 * block. A block parses on its own (trace_text.c), so with threads
 * (trace_set_threads) worker threads cut and parse blocks while the caller
 * takes them in order: cutting is serial (one worker at a time holds
 * cut_lock, and takes the blocks' sequence numbers in order), parsing is
 * parallel. What needs trace order then runs in the ordering step, block
 * by block in sequence: the time origin (times made relative to the first
 * event) and the batch hook (trace_set_batch_hook; the replay gives events
 * their live-table slots there). With threads a worker that has parsed a
 * block runs it for every parsed block next in line, unless another worker
 * is at it (`ordering`, under lock): one at a time, in order, off the
 * caller's thread. Line numbers are applied in order by the caller: a block
 * reports its line count and, at a bad line, the line's index in the block.
 * Workers run as threads of the caller's process, or (trace_set_worker_process)
 * in a worker process forked at the first read: the control (locks, made
 * process-shared, the caller's robust), the slots, their events and
 * buffers then live in one shared mapping made before the fork, and the
 * process runs the same workers' loop on its threads; everything else a
 * worker touches (the source, the cut state, the ordering step, the hook's
 * memory) is that process's own copy, never read by the caller. The
 * caller's process then has no second thread (trace.h says why that pays);
 * the worker process dies with it (Linux), and the caller finds a worker
 * process that died before the end by polling it while it waits (an
 * error, never a hang).
 * Invariants: block seq lives in slot seq % slot_count; a slot is cut only
 * when FREE (the caller released the block before it), is PARSED once its
 * events are parsed and READY once ordered (blocks are ordered in seq
 * order: next_order), and the caller takes seqs in order, each READY; at
 * most slot_count blocks of text and events exist, so memory is bounded
 * whatever the trace's length. Without threads the same blocks are cut,
 * parsed and ordered on the caller's thread.
 */
#include "trace.h"

#include "inflater.h"
#include "pickle.h"
#include "trace_text.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#define BLOCK_BYTES (1u << 20)
#define INPUT_BYTES (1u << 18) /* compressed bytes read at a time */
#define MAX_THREADS 64
#define REASON_CAPACITY 400

enum { TAIL_MORE = 0, TAIL_END, TAIL_DAMAGED, TAIL_TOO_LONG };
enum { SLOT_FREE = 0, SLOT_CUTTING, SLOT_PARSED, SLOT_READY };

typedef struct text_block {
    const char *text; /* into the region, or the block's buffer */
    size_t length;
    char *buffer; /* stream sources: block_bytes of its own */
    int tail;     /* TAIL_MORE, or what ends the text after this block */
    char tail_reason[REASON_CAPACITY]; /* TAIL_DAMAGED: why (no location) */
    uint64_t source_bytes; /* bytes of the file as stored read up to the block's end */
    /* The first gzip member ended while this block was cut: where in the
     * text, and its trailer's CRC-32 (the deferred check: crc_feed). */
    bool member_end;
    uint64_t member_end_offset;
    uint32_t member_crc;
    uint32_t text_crc; /* the CRC-32 of its text, summed as it is parsed (crc_in_blocks) */
    trace_event *events;
    size_t event_capacity;
    trace_text_result parsed;
    bool bad;
    char what[300];
    int state; /* SLOT_*; under lock with threads */
    uint64_t order_ns; /* host time of its ordering step (the batch hook's) */
} text_block;

/* What the caller and the workers share to hand blocks over: in the
 * reader's memory with worker threads, in a shared mapping (process-shared
 * locks) with a worker process. */
typedef struct block_control {
    pthread_mutex_t lock, cut_lock;
    pthread_cond_t freed, parsed;
    bool stop;
} block_control;

struct trace_reader {
    char name[200];
    trace_format format;
    unsigned pt_device; /* PyTorch snapshot: which device's trace */
    size_t block_bytes; /* BLOCK_BYTES, or the options' */
    bool zlib_gzip;     /* options: gzip inflated by zlib alone */
    bool inflater_gives_up; /* options (tests): the inflater acts as if it rejected the data ... */
    uint64_t inflater_gives_up_at; /* ... once it has given this many bytes of text */
    uint64_t snapshot_max_bytes; /* TRACE_SNAPSHOT_MAX_BYTES, or the options' */
    uint64_t file_bytes; /* the file's size as stored (0: not known) */
    /* The source: a region of text, or a stream (fd). */
    const char *region;
    size_t region_length, region_offset;
    void *mapping; /* a mapped plain file */
    size_t mapping_length;
    int fd;
    bool gzip, z_ready, input_end, member_end;
    z_stream z;
    unsigned char *input; /* compressed bytes for zlib (INPUT_BYTES) */
    /* The first member of a regular gzip file, decoded by the inflater
     * (inflater.c) from the file mapped whole; later members, and a first
     * member the inflater rejects (zlib then inflates it again from the
     * file's start, skipping the text already given: skip_text), by zlib. */
    inflater *fast;
    bool fast_active;
    const unsigned char *gz_map; /* the gzip file mapped */
    size_t gz_map_length;
    size_t fast_data_start; /* the first member's deflate data: its offset in the file */
    uint64_t skip_text;     /* zlib: text to inflate and drop first */
    size_t input_capacity;
    uint64_t raw_bytes; /* bytes read from the file */
    bool damage_pending; /* found after producing output: the next read reports it */
    char damage_reason[REASON_CAPACITY];
    /* The first member's check, deferred (a regular gzip file): the
     * inflater, or zlib (inflateValidate off), decodes it without computing
     * its CRC-32, and the text's own is compared with the trailer's where
     * the text is taken in order anyway -- the header line at open, then
     * the ordering step, which combines the sums the parse workers took of
     * their blocks (crc_in_blocks), or the pickle reader -- so the decoding
     * thread does not spend its time on it. Later members zlib checks. */
    bool crc_deferred;        /* stream_read: the member being inflated is the first, unchecked */
    uint64_t text_produced;   /* stream_read: text bytes produced so far */
    bool member_end_pending;  /* stream_read: the first member ended; not yet given to a block */
    uint64_t pending_end_offset;
    uint32_t pending_crc;
    bool crc_checking;        /* in text order: the first member's text is being summed */
    bool crc_in_blocks;       /* set at open: blocks sum their own text's CRC-32 as they are parsed, in parallel */
    uint64_t crc_end;         /* where the first member's text ends (UINT64_MAX: not known yet) */
    uint64_t crc_pos;         /* text summed so far */
    uint32_t crc, crc_expected;
    char *carry; /* stream: text after the last whole line (block_bytes) */
    size_t carry_length;
    bool cut_done; /* the block with the text's end is cut */
    /* In order, on the caller's thread. */
    unsigned long long line; /* lines consumed, the header included */
    /* In order, in the ordering step (finish_block): on the caller's thread,
     * or with threads on the one worker that holds `ordering`. */
    bool have_origin;
    uint64_t origin_ns; /* time of the first event */
    bool order_stopped; /* a block that ends the events (an error) was ordered */
    uint64_t day_ns, last_clock_ns; /* RMM HH:MM:SS times: the days passed (midnights), the last time of day */
    trace_batch_hook hook; /* trace_set_batch_hook, or NULL */
    void *hook_user;
    uint64_t position_bytes; /* source bytes behind the blocks taken */
    bool ended;
    char error[700]; /* sticky: once an error, always that error */
    /* Blocks. */
    unsigned threads;
    text_block *slots;
    size_t slot_count;
    uint64_t next_cut, next_take, next_order;
    bool ordering; /* a worker is running the ordering step (under lock) */
    text_block *held; /* returned by the last batch; released at the next */
    pthread_t workers[MAX_THREADS];
    unsigned worker_count;
    block_control *control; /* in blocks_memory */
    bool locks_ready;
    /* The control, the slots, their events and buffers, in one piece:
     * shared with the worker process (mmap) or not (calloc). */
    char *blocks_memory;
    size_t blocks_memory_bytes;
    bool blocks_shared;
    bool worker_process; /* trace_set_worker_process */
    pid_t child;         /* the worker process, or 0 */
    uint64_t hook_ns;    /* the ordering steps of the blocks taken */
    /* trace_read's copy-out of the current batch */
    const trace_event *batch;
    size_t batch_count, batch_next;
    /* PyTorch snapshot: every event, converted at open */
    trace_event *pk_events;
    size_t pk_count, pk_next;
};

static uint32_t fold_stream(uint64_t v) { return (uint32_t)(v ^ (v >> 32)); }

static const char TIDEPOOL_HEADER[] = "time_us,action,addr,size,stream";
static const char RMM_HEADER[] = "Thread,Time,Action,Pointer,Size,Stream";

/* --------------------------------------------------------------- sources */

/* The last '\n' in s[0, n), or NULL (memrchr is not C11). */
static const char *last_newline(const char *s, size_t n) {
    while (n) {
        if (s[--n] == '\n') return s + n;
    }
    return NULL;
}

static void zlib_reason(trace_reader *r, int code) {
    const char *msg = r->z.msg;
    if (code == Z_DATA_ERROR)
        snprintf(r->damage_reason, sizeof r->damage_reason, "corrupt gzip data (zlib: %s)",
                 msg && *msg ? msg : "compressed data error");
    else if (code == Z_MEM_ERROR)
        snprintf(r->damage_reason, sizeof r->damage_reason, "zlib error %d (out of memory)", code);
    else
        snprintf(r->damage_reason, sizeof r->damage_reason, "zlib error %d (%s)", code,
                 msg && *msg ? msg : "internal error: inflate stream corrupt");
}

static void truncated_reason(trace_reader *r) {
    snprintf(r->damage_reason, sizeof r->damage_reason,
             "truncated gzip file: the compressed data stops before its end (zlib: unexpected end of file)");
}

/* More compressed input; false on a read error (reason set). */
static bool read_input(trace_reader *r) {
    if (r->input_end) return true;
    if (r->z.avail_in && r->z.next_in != r->input) memmove(r->input, r->z.next_in, r->z.avail_in);
    r->z.next_in = r->input;
    for (;;) {
        ssize_t n = read(r->fd, r->input + r->z.avail_in, r->input_capacity - r->z.avail_in);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(r->damage_reason, sizeof r->damage_reason, "read error: %s", strerror(errno));
            return false;
        }
        if (n == 0) r->input_end = true;
        r->z.avail_in += (uInt)n;
        r->raw_bytes += (uint64_t)n;
        return true;
    }
}

/* The first member's end, decoded without its check (r->crc_deferred),
 * after `produced` bytes of this call's text: its trailer t, its text
 * member_text bytes long. The length is checked here, the CRC-32 kept for
 * crc_feed. False (reason set) when the length is wrong. */
static bool first_member_trailer(trace_reader *r, const unsigned char t[8], uint64_t member_text, uint64_t produced) {
    r->crc_deferred = false;
    uint32_t crc = (uint32_t)t[0] | (uint32_t)t[1] << 8 | (uint32_t)t[2] << 16 | (uint32_t)t[3] << 24;
    uint32_t isize = (uint32_t)t[4] | (uint32_t)t[5] << 8 | (uint32_t)t[6] << 16 | (uint32_t)t[7] << 24;
    if (isize != (uint32_t)member_text) {
        snprintf(r->damage_reason, sizeof r->damage_reason,
                 "corrupt gzip data (the trailer gives a length of %lu bytes, modulo 2^32; the member has %lu)",
                 (unsigned long)isize, (unsigned long)(uint32_t)member_text);
        return false;
    }
    r->member_end_pending = true;
    r->pending_end_offset = r->text_produced + produced;
    r->pending_crc = crc;
    return true;
}

/* ... zlib's: the trailer read back from the file (zlib has consumed it,
 * and the input buffer may have been refilled since). False (reason set)
 * also when it cannot be read. */
static bool first_member_ended(trace_reader *r, uint64_t produced) {
    uint64_t trailer_end = r->raw_bytes - r->z.avail_in; /* the file offset just past it */
    unsigned char t[8];
    ssize_t got = trailer_end >= 8 ? pread(r->fd, t, 8, (off_t)(trailer_end - 8)) : -1;
    if (got != 8) {
        r->crc_deferred = false;
        snprintf(r->damage_reason, sizeof r->damage_reason, "read error: the gzip trailer cannot be read back (%s)",
                 got < 0 ? strerror(errno) : "short read");
        return false;
    }
    return first_member_trailer(r, t, r->z.total_out, produced);
}

/* One inflate call into the output the caller set, zlib's input read
 * first if it has none: *member_ended set at a member's end (the caller
 * checks it). False (reason set) on damage: data zlib rejects, a read
 * error, or a stream cut short -- zlib can go no further and the file has
 * no input left. (zlib is called even with no input: having stopped only
 * because its output was full, it may hold the bits of what comes next, an
 * error included.) */
static bool zlib_step(trace_reader *r, bool *member_ended) {
    *member_ended = false;
    if (r->z.avail_in == 0 && !read_input(r)) return false;
    uInt room = r->z.avail_out;
    int ret = inflate(&r->z, Z_NO_FLUSH);
    if (ret == Z_STREAM_END) {
        *member_ended = r->member_end = true;
        return true;
    }
    if (ret == Z_BUF_ERROR && !r->z.avail_in && r->input_end && r->z.avail_out == room) {
        truncated_reason(r);
        return false;
    }
    if (ret == Z_OK || ret == Z_BUF_ERROR) return true;
    zlib_reason(r, ret);
    return false;
}

/* zlib reads the file on from offset (the inflater mapped it). False
 * (reason set) when it cannot seek there. */
static bool zlib_from(trace_reader *r, uint64_t offset) {
    r->fast_active = false;
    if (lseek(r->fd, (off_t)offset, SEEK_SET) < 0) {
        snprintf(r->damage_reason, sizeof r->damage_reason, "read error: %s", strerror(errno));
        return false;
    }
    r->raw_bytes = offset;
    r->z.next_in = r->input;
    r->z.avail_in = 0;
    r->input_end = false;
    return true;
}

/* stream_read_text's text while the inflater decodes the first member:
 * > 0 bytes, -1 on damage (reason set), or 0 when zlib goes on from here
 * with nothing given yet: the member ended (later members are zlib's), or
 * the inflater rejected it (zlib inflates it again from the file's start,
 * dropping the text given so far, and then decodes it or says what is
 * wrong: inflater.h's contract). */
static long fast_read(trace_reader *r, char *buf, size_t capacity) {
    size_t got = 0;
    if (r->inflater_gives_up && r->inflater_gives_up_at - r->text_produced < capacity)
        capacity = (size_t)(r->inflater_gives_up_at - r->text_produced);
    inflater_status st = capacity ? inflater_read(r->fast, (unsigned char *)buf, capacity, &got) : INFLATER_ERROR;
    if (st == INFLATER_MORE && r->inflater_gives_up && r->text_produced + got == r->inflater_gives_up_at)
        st = INFLATER_ERROR;
    if (st == INFLATER_MORE) return (long)got;
    size_t trailer = r->fast_data_start + inflater_input_used(r->fast);
    if (st == INFLATER_END && r->gz_map_length - trailer >= 8) {
        if (!first_member_trailer(r, r->gz_map + trailer, inflater_total_out(r->fast), got) ||
            !zlib_from(r, trailer + 8)) {
            r->damage_pending = true;
            return got ? (long)got : -1;
        }
        r->member_end = true; /* another member follows, or the end */
        return (long)got;
    }
    r->skip_text = r->text_produced + got;
    if (!zlib_from(r, 0)) {
        r->damage_pending = true;
        return got ? (long)got : -1;
    }
    inflateReset(&r->z);
    inflateValidate(&r->z, 0); /* the deferred check, as before */
    r->member_end = false;
    return (long)got;
}

/* zlib, taking over a member the inflater rejected, inflates and drops the
 * text already given (skip_text). False (reason set) on damage, or where
 * its text ends before that (which inflater.h's contract rules out). */
static bool drop_given_text(trace_reader *r) {
    unsigned char scratch[16384];
    while (r->skip_text) {
        uInt room = r->skip_text < sizeof scratch ? (uInt)r->skip_text : (uInt)sizeof scratch;
        r->z.next_out = scratch;
        r->z.avail_out = room;
        bool ended;
        if (!zlib_step(r, &ended)) return false;
        r->skip_text -= room - r->z.avail_out;
        if (!ended) continue;
        if (r->skip_text) {
            snprintf(r->damage_reason, sizeof r->damage_reason,
                     "internal error: zlib's text of the first gzip member ends before the inflater's");
            return false;
        }
        if (r->crc_deferred && !first_member_ended(r, 0)) return false;
    }
    return true;
}

/* stream_read without the count of text produced. */
static long stream_read_text(trace_reader *r, char *buf, size_t capacity) {
    if (r->damage_pending) return -1;
    if (!r->gzip) {
        if (r->z.avail_in) { /* what the gzip check read first */
            size_t n = r->z.avail_in < capacity ? r->z.avail_in : capacity;
            memcpy(buf, r->z.next_in, n);
            r->z.next_in += n;
            r->z.avail_in -= (uInt)n;
            return (long)n;
        }
        for (;;) {
            ssize_t n = read(r->fd, buf, capacity);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) {
                snprintf(r->damage_reason, sizeof r->damage_reason, "read error: %s", strerror(errno));
                r->damage_pending = true;
                return -1;
            }
            r->raw_bytes += (uint64_t)n;
            return (long)n;
        }
    }
    if (r->fast_active) {
        long n = fast_read(r, buf, capacity);
        if (n != 0) return n;
    }
    if (r->skip_text && !drop_given_text(r)) {
        r->damage_pending = true;
        return -1;
    }
    r->z.next_out = (unsigned char *)buf;
    r->z.avail_out = (uInt)capacity;
    while (r->z.avail_out == capacity) {
        if (r->member_end) { /* another member follows, or the end (bytes after the last member are ignored) */
            while (r->z.avail_in < 2 && !r->input_end)
                if (!read_input(r)) goto damaged;
            if (r->z.avail_in < 2 || r->z.next_in[0] != 0x1f || r->z.next_in[1] != 0x8b) break;
            inflateReset(&r->z);
            inflateValidate(&r->z, 1); /* a later member: zlib checks it */
            r->member_end = false;
        }
        bool ended;
        if (!zlib_step(r, &ended)) goto damaged;
        if (ended && r->crc_deferred && !first_member_ended(r, capacity - r->z.avail_out)) goto damaged;
    }
    return (long)(capacity - r->z.avail_out);
damaged:
    r->damage_pending = true;
    return capacity - r->z.avail_out ? (long)(capacity - r->z.avail_out) : -1;
}

/* Up to capacity bytes of text from the stream: > 0, 0 at the end, or -1
 * when the data is damaged (r->damage_reason says how). */
static long stream_read(trace_reader *r, char *buf, size_t capacity) {
    long n = stream_read_text(r, buf, capacity);
    if (n > 0) r->text_produced += (uint64_t)n;
    return n;
}

/* The deferred check (r->crc_deferred) learns where the first member ends
 * and what its trailer says. */
static void crc_end_from(trace_reader *r, uint64_t offset, uint32_t crc) {
    r->crc_end = offset;
    r->crc_expected = crc;
}

/* ... from stream_read directly, on the thread that reads (the header line
 * at open, the pickle reader); blocks carry it to the ordering step. */
static void crc_end_from_pending(trace_reader *r) {
    if (!r->member_end_pending) return;
    crc_end_from(r, r->pending_end_offset, r->pending_crc);
    r->member_end_pending = false;
}

/* crc continued over text[0, length). */
static uint32_t crc_over(uint32_t crc, const char *text, size_t length) {
    for (size_t done = 0; done < length;) { /* (crc32 takes an unsigned int) */
        size_t part = length - done < (1u << 30) ? length - done : (1u << 30);
        crc = (uint32_t)crc32(crc, (const unsigned char *)text + done, (uInt)part);
        done += part;
    }
    return crc;
}

/* The deferred check, fed the text in order from its start: up to the first
 * member's end, once known, the text's CRC-32 is summed; there it is
 * compared with the trailer's. A block's text comes with its own CRC-32
 * (text_crc; NULL: none), summed in parallel as it was parsed: combined
 * (zlib's crc32_combine) where the whole text is the member's. False (why
 * set) on a mismatch. */
static bool crc_feed(trace_reader *r, const char *text, size_t length, const uint32_t *text_crc, char *why,
                     size_t why_capacity) {
    if (!r->crc_checking) return true;
    if (r->crc_pos > r->crc_end) { /* (cannot happen: the end is learnt before its text) */
        snprintf(why, why_capacity, "internal error: the first gzip member's end was learnt after its text");
        return false;
    }
    size_t take = length;
    if (r->crc_end - r->crc_pos < take) take = (size_t)(r->crc_end - r->crc_pos);
    if (text_crc && take == length && (z_off_t)length >= 0)
        r->crc = (uint32_t)crc32_combine(r->crc, *text_crc, (z_off_t)length);
    else
        r->crc = crc_over(r->crc, text, take);
    r->crc_pos += take;
    if (r->crc_pos != r->crc_end) return true;
    r->crc_checking = false;
    if (r->crc == r->crc_expected) return true;
    snprintf(why, why_capacity, "corrupt gzip data (the text's CRC-32 is %08lx, the trailer's %08lx)",
             (unsigned long)r->crc, (unsigned long)r->crc_expected);
    return false;
}

/* Bytes of the file as stored behind the text read so far. */
static uint64_t source_position(const trace_reader *r) {
    if (r->region) return r->region_offset;
    if (r->fast_active) return r->fast_data_start + inflater_input_position(r->fast);
    return r->raw_bytes - r->z.avail_in;
}

/* The length of the gzip header at p (n bytes), or 0 where zlib should
 * read it: not deflate, reserved flags, a header CRC-32 (zlib checks it),
 * or cut short. */
static size_t gzip_header_bytes(const unsigned char *p, size_t n) {
    if (n < 10 || p[0] != 0x1f || p[1] != 0x8b || p[2] != 8 || (p[3] & 0xe2)) return 0;
    size_t at = 10;
    if (p[3] & 4) { /* FEXTRA */
        if (n - at < 2) return 0;
        size_t extra = (size_t)p[at] | (size_t)p[at + 1] << 8;
        at += 2;
        if (n - at < extra) return 0;
        at += extra;
    }
    for (unsigned flag = 8; flag <= 16; flag <<= 1) { /* FNAME, FCOMMENT */
        if (!(p[3] & flag)) continue;
        const unsigned char *nul = memchr(p + at, 0, n - at);
        if (!nul) return 0;
        at = (size_t)(nul - p) + 1;
    }
    return at;
}

/* The first member of a regular gzip file to the inflater, the file mapped
 * (unless zlib alone is asked for, or it cannot be mapped, or zlib should
 * read its header). */
static void start_inflater(trace_reader *r) {
    const char *choice = getenv("TIDE_INFLATE");
    if (r->zlib_gzip || (choice && !strcmp(choice, "zlib")) || !r->file_bytes || r->file_bytes > SIZE_MAX) return;
    size_t length = (size_t)r->file_bytes;
    void *m = mmap(NULL, length, PROT_READ, MAP_PRIVATE, r->fd, 0);
    if (m == MAP_FAILED) return;
    size_t header = gzip_header_bytes(m, length);
    if (!header || !(r->fast = inflater_create())) {
        munmap(m, length);
        return;
    }
    madvise(m, length, MADV_SEQUENTIAL);
    r->gz_map = m;
    r->gz_map_length = length;
    r->fast_data_start = header;
    inflater_start(r->fast, r->gz_map + header, length - header);
    r->fast_active = true;
}

/* Opens the source of path: a mapped plain file, or a stream. */
static bool open_source(trace_reader *r, const char *path, char *err, size_t cap) {
    r->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        snprintf(err, cap, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
        return false;
    }
    struct stat st;
    bool regular = fstat(r->fd, &st) == 0 && S_ISREG(st.st_mode);
    if (regular) r->file_bytes = (uint64_t)st.st_size;
    r->input_capacity = INPUT_BYTES;
    r->input = malloc(r->input_capacity);
    if (!r->input) {
        snprintf(err, cap, "%s: out of memory", path);
        return false;
    }
    r->z.next_in = r->input;
    while (r->z.avail_in < 2 && !r->input_end) /* the magic */
        if (!read_input(r)) {
            snprintf(err, cap, "%s: %s", path, r->damage_reason);
            return false;
        }
    r->gzip = r->z.avail_in >= 2 && r->input[0] == 0x1f && r->input[1] == 0x8b;
    if (!r->gzip && regular && r->file_bytes && r->file_bytes <= SIZE_MAX) {
        void *m = mmap(NULL, (size_t)r->file_bytes, PROT_READ, MAP_PRIVATE, r->fd, 0);
        if (m != MAP_FAILED) {
            madvise(m, (size_t)r->file_bytes, MADV_SEQUENTIAL);
            r->mapping = m;
            r->mapping_length = (size_t)r->file_bytes;
            r->region = m;
            r->region_length = r->mapping_length;
            return true;
        }
    }
    if (r->gzip) {
        if (inflateInit2(&r->z, 15 + 16) != Z_OK) {
            snprintf(err, cap, "%s: out of memory", path);
            return false;
        }
        r->z_ready = true;
        if (regular) { /* the first member's check deferred: its trailer can be read back */
            inflateValidate(&r->z, 0);
            r->crc_deferred = r->crc_checking = r->crc_in_blocks = true;
            r->crc_end = UINT64_MAX;
            start_inflater(r);
        }
    }
    r->carry = malloc(r->block_bytes);
    if (!r->carry) {
        snprintf(err, cap, "%s: out of memory", path);
        return false;
    }
    return true;
}

/* ---------------------------------------------------------------- blocks */

/* Cuts the next block into b (the caller holds cut_lock, or is the only
 * thread). */
static void cut_block(trace_reader *r, text_block *b) {
    b->tail = TAIL_MORE;
    if (r->region) {
        size_t start = r->region_offset, left = r->region_length - start;
        if (left <= r->block_bytes) {
            b->text = r->region + start;
            b->length = left;
            b->tail = TAIL_END;
            r->region_offset = r->region_length;
        } else {
            const char *s = r->region + start;
            const char *nl = last_newline(s, r->block_bytes);
            size_t cut = nl ? (size_t)(nl - s) + 1 : 0;
            if (r->block_bytes - cut > TRACE_LINE_MAX_BYTES) b->tail = TAIL_TOO_LONG;
            b->text = s;
            b->length = cut;
            r->region_offset = start + cut;
        }
        b->source_bytes = source_position(r);
        if (b->tail != TAIL_MORE) r->cut_done = true;
        return;
    }
    char *buf = b->buffer;
    size_t n = r->carry_length;
    memcpy(buf, r->carry, n);
    r->carry_length = 0;
    bool end = false, damaged = false;
    while (n < r->block_bytes) {
        long got = stream_read(r, buf + n, r->block_bytes - n);
        if (got > 0) {
            n += (size_t)got;
        } else {
            end = got == 0;
            damaged = got < 0;
            break;
        }
    }
    /* (The end lies in this block's text or in what it carries over.) */
    b->member_end = r->member_end_pending;
    if (b->member_end) {
        b->member_end_offset = r->pending_end_offset;
        b->member_crc = r->pending_crc;
        r->member_end_pending = false;
    }
    b->text = buf;
    if (end) {
        b->length = n;
        b->tail = TAIL_END;
    } else {
        const char *nl = last_newline(buf, n);
        size_t cut = nl ? (size_t)(nl - buf) + 1 : 0;
        b->length = cut;
        if (n - cut > TRACE_LINE_MAX_BYTES) {
            b->tail = TAIL_TOO_LONG;
        } else if (damaged) {
            b->tail = TAIL_DAMAGED;
            snprintf(b->tail_reason, sizeof b->tail_reason, "%s", r->damage_reason);
        } else {
            memcpy(r->carry, buf + cut, n - cut);
            r->carry_length = n - cut;
        }
    }
    b->source_bytes = source_position(r);
    if (b->tail != TAIL_MORE) r->cut_done = true;
}

static void parse_block(trace_reader *r, text_block *b) {
    b->bad = !trace_text_parse(r->format, b->text, b->length, b->events, &b->parsed, b->what, sizeof b->what);
    if (r->crc_in_blocks) b->text_crc = crc_over(0, b->text, b->length);
}

/* The ordering step, block by block in trace order: event times made
 * relative to the first event's (times that run backwards are clamped: the
 * replay's clock only moves on), then the batch hook. A block whose events
 * are never returned (a bad line, damaged data, a line too long: the caller
 * stops there with the error) stops it, so the hook sees exactly the events
 * the caller gets. */
static uint64_t monotonic_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void order_events(trace_reader *r, text_block *b);

static void order_block(trace_reader *r, text_block *b) {
    uint64_t start = monotonic_ns();
    order_events(r, b);
    b->order_ns = monotonic_ns() - start;
}

static void order_events(trace_reader *r, text_block *b) {
    if (r->order_stopped) return;
    if (b->member_end) crc_end_from(r, b->member_end_offset, b->member_crc);
    if (!b->bad && b->tail != TAIL_DAMAGED && b->tail != TAIL_TOO_LONG &&
        !crc_feed(r, b->text, b->length, r->crc_in_blocks ? &b->text_crc : NULL, b->tail_reason,
                  sizeof b->tail_reason))
        b->tail = TAIL_DAMAGED; /* its events are not returned: the caller stops with the reason */
    if (b->tail == TAIL_END && r->crc_checking) { /* (cannot happen: a text's end follows its member's) */
        snprintf(b->tail_reason, sizeof b->tail_reason, "internal error: the first gzip member's end was not seen");
        b->tail = TAIL_DAMAGED;
    }
    if (b->bad || b->tail == TAIL_DAMAGED || b->tail == TAIL_TOO_LONG) {
        r->order_stopped = true;
        return;
    }
    size_t n = b->parsed.events;
    if (!n) return;
    trace_event *e = b->events;
    if (r->format == TRACE_FORMAT_RMM) {
        /* RMM logs times of day (HH:MM:SS.ffffff): one that falls back by
         * more than 12 h has passed midnight, and a day is added (else the
         * rest of the log was clamped to the time before midnight) */
        const uint64_t day = 86400000000000ull, half = day / 2;
        for (size_t i = 0; i < n; i++) {
            uint64_t t = e[i].time_ns;
            if (t > day + 1000000000ull) continue; /* seconds since the epoch, not a time of day */
            if (r->last_clock_ns > t && r->last_clock_ns - t > half) r->day_ns += day;
            r->last_clock_ns = t;
            e[i].time_ns = t + r->day_ns;
        }
    }
    if (!r->have_origin) {
        r->have_origin = true;
        r->origin_ns = e[0].time_ns;
    }
    uint64_t origin = r->origin_ns;
    for (size_t i = 0; i < n; i++) e[i].time_ns = e[i].time_ns >= origin ? e[i].time_ns - origin : 0;
    if (r->hook) r->hook(r->hook_user, e, n);
}

static void *worker_main(void *arg) {
    trace_reader *r = arg;
    for (;;) {
        pthread_mutex_lock(&r->control->cut_lock);
        pthread_mutex_lock(&r->control->lock);
        text_block *b = NULL;
        if (!r->cut_done && !r->control->stop) {
            b = &r->slots[r->next_cut % r->slot_count];
            while (b->state != SLOT_FREE && !r->control->stop) pthread_cond_wait(&r->control->freed, &r->control->lock);
            if (r->control->stop) b = NULL;
            else b->state = SLOT_CUTTING;
        }
        pthread_mutex_unlock(&r->control->lock);
        if (!b) {
            pthread_mutex_unlock(&r->control->cut_lock);
            return NULL;
        }
        cut_block(r, b);
        r->next_cut++;
        pthread_mutex_unlock(&r->control->cut_lock);
        parse_block(r, b);
        pthread_mutex_lock(&r->control->lock);
        b->state = SLOT_PARSED;
        if (!r->ordering) { /* order every parsed block next in line, this one or others' */
            r->ordering = true;
            for (;;) {
                text_block *next = &r->slots[r->next_order % r->slot_count];
                if (next->state != SLOT_PARSED) break;
                pthread_mutex_unlock(&r->control->lock);
                order_block(r, next);
                pthread_mutex_lock(&r->control->lock);
                next->state = SLOT_READY;
                r->next_order++;
                pthread_cond_broadcast(&r->control->parsed);
            }
            r->ordering = false;
        }
        pthread_mutex_unlock(&r->control->lock);
    }
}

/* The caller's lock of the control: with a worker process the mutex is
 * robust, so a process killed while it held it leaves it to the caller
 * (EOWNERDEAD) instead of blocking it for good. */
static void lock_control(trace_reader *r) {
    if (pthread_mutex_lock(&r->control->lock) == EOWNERDEAD) pthread_mutex_consistent(&r->control->lock);
}

static void stop_workers(trace_reader *r) {
    if (!r->worker_count && !r->child) return;
    lock_control(r);
    r->control->stop = true;
    pthread_cond_broadcast(&r->control->freed);
    pthread_mutex_unlock(&r->control->lock);
    for (unsigned i = 0; i < r->worker_count; i++) pthread_join(r->workers[i], NULL);
    r->worker_count = 0;
    while (r->child && waitpid(r->child, NULL, 0) < 0 && errno == EINTR) {
    }
    r->child = 0;
}

/* The worker process: the workers' loop on its own threads (the first on
 * its main thread), then _exit -- never back into the caller's code, and no
 * stdio flushed twice. It dies with the caller (Linux: PR_SET_PDEATHSIG). */
static void run_worker_process(trace_reader *r, pid_t parent) {
#ifdef __linux__
    prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
    if (getppid() != parent) _exit(1); /* the caller is gone already */
    for (unsigned i = 1; i < r->threads; i++) {
        if (pthread_create(&r->workers[r->worker_count], NULL, worker_main, r) != 0) break;
        r->worker_count++;
    }
    worker_main(r);
    for (unsigned i = 0; i < r->worker_count; i++) pthread_join(r->workers[i], NULL);
    _exit(0);
}

static size_t round_up_64(size_t n) { return (n + 63) & ~(size_t)63; }

static bool init_control(block_control *c, bool shared) {
    pthread_mutexattr_t ma;
    pthread_condattr_t ca;
    if (pthread_mutexattr_init(&ma)) return false;
    if (pthread_condattr_init(&ca)) {
        pthread_mutexattr_destroy(&ma);
        return false;
    }
    int scope = shared ? PTHREAD_PROCESS_SHARED : PTHREAD_PROCESS_PRIVATE;
    bool ok = !pthread_mutexattr_setpshared(&ma, scope) && !pthread_condattr_setpshared(&ca, scope) &&
              (!shared || !pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST)) &&
              !pthread_mutex_init(&c->lock, &ma);
    if (ok && pthread_mutex_init(&c->cut_lock, &ma)) {
        pthread_mutex_destroy(&c->lock);
        ok = false;
    }
    if (ok && pthread_cond_init(&c->freed, &ca)) {
        pthread_mutex_destroy(&c->cut_lock);
        pthread_mutex_destroy(&c->lock);
        ok = false;
    }
    if (ok && pthread_cond_init(&c->parsed, &ca)) {
        pthread_cond_destroy(&c->freed);
        pthread_mutex_destroy(&c->cut_lock);
        pthread_mutex_destroy(&c->lock);
        ok = false;
    }
    pthread_condattr_destroy(&ca);
    pthread_mutexattr_destroy(&ma);
    return ok;
}

/* The slots and, with threads, the workers (threads, or a process that
 * runs them: trace_set_worker_process); false when out of memory. */
static bool start_blocks(trace_reader *r) {
    r->slot_count = r->threads ? 2 * (size_t)r->threads + 2 : 1;
    size_t event_capacity = trace_text_max_events(r->block_bytes);
    size_t events_bytes = round_up_64(event_capacity * sizeof(trace_event));
    size_t buffer_bytes = r->region ? 0 : round_up_64(r->block_bytes);
    size_t control_bytes = round_up_64(sizeof(block_control));
    size_t slots_bytes = round_up_64(r->slot_count * sizeof(text_block));
    size_t total = control_bytes + slots_bytes + r->slot_count * (events_bytes + buffer_bytes);
    char *base = NULL;
    if (r->threads && r->worker_process) {
        void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
        if (m != MAP_FAILED) {
            base = m;
            r->blocks_shared = true;
        }
    }
    if (!base && !(base = calloc(1, total))) return false;
    r->blocks_memory = base;
    r->blocks_memory_bytes = total;
    r->control = (block_control *)base;
    r->slots = (text_block *)(base + control_bytes);
    for (size_t i = 0; i < r->slot_count; i++) {
        text_block *b = &r->slots[i];
        char *own = base + control_bytes + slots_bytes + i * (events_bytes + buffer_bytes);
        b->event_capacity = event_capacity;
        b->events = (trace_event *)own;
        b->buffer = buffer_bytes ? own + events_bytes : NULL;
    }
    if (!r->threads) return true;
    if (!init_control(r->control, r->blocks_shared)) return false;
    r->locks_ready = true;
    if (r->blocks_shared) {
        pid_t parent = getpid();
        pid_t pid = fork();
        if (pid == 0) run_worker_process(r, parent); /* does not return */
        if (pid > 0) {
            r->child = pid;
            return true;
        }
        /* no process to be had: threads, over the same (shared) memory */
    }
    for (unsigned i = 0; i < r->threads; i++) {
        if (pthread_create(&r->workers[i], NULL, worker_main, r) != 0) break;
        r->worker_count++;
    }
    if (!r->worker_count) { /* no threads to be had: parse here */
        r->threads = 0;
    }
    return true;
}

/* The next block in order, parsed. */
static text_block *take_block(trace_reader *r) {
    if (!r->threads) {
        text_block *b = &r->slots[0];
        cut_block(r, b);
        parse_block(r, b);
        order_block(r, b);
        return b;
    }
    text_block *b = &r->slots[r->next_take % r->slot_count];
    lock_control(r);
    while (b->state != SLOT_READY) {
        if (!r->child) {
            pthread_cond_wait(&r->control->parsed, &r->control->lock);
            continue;
        }
        /* a worker process can die (killed): look every 100 ms */
        struct timespec deadline;
        clock_gettime(CLOCK_REALTIME, &deadline);
        deadline.tv_nsec += 100000000;
        if (deadline.tv_nsec >= 1000000000) {
            deadline.tv_sec++;
            deadline.tv_nsec -= 1000000000;
        }
        int waited = pthread_cond_timedwait(&r->control->parsed, &r->control->lock, &deadline);
        if (waited == EOWNERDEAD) pthread_mutex_consistent(&r->control->lock);
        if (waited != 0 && b->state != SLOT_READY && waitpid(r->child, NULL, WNOHANG) == r->child) {
            r->child = 0;
            pthread_mutex_unlock(&r->control->lock);
            return NULL;
        }
    }
    pthread_mutex_unlock(&r->control->lock);
    r->next_take++;
    return b;
}

static void release_block(trace_reader *r, text_block *b) {
    if (!r->threads) return;
    lock_control(r);
    b->state = SLOT_FREE;
    pthread_cond_broadcast(&r->control->freed);
    pthread_mutex_unlock(&r->control->lock);
}

#define FAIL(...)                                                  \
    do {                                                           \
        snprintf(r->error, sizeof r->error, __VA_ARGS__);          \
        snprintf(err, cap, "%s", r->error);                        \
        return -1;                                                 \
    } while (0)

long trace_read_batch(trace_reader *r, const trace_event **out_events, char *err, size_t cap) {
    *out_events = NULL;
    if (r->format == TRACE_FORMAT_PYTORCH_PICKLE) {
        size_t n = r->pk_count - r->pk_next;
        *out_events = r->pk_events + r->pk_next;
        if (n && r->hook) {
            uint64_t start = monotonic_ns();
            r->hook(r->hook_user, r->pk_events + r->pk_next, n);
            r->hook_ns += monotonic_ns() - start;
        }
        r->pk_next = r->pk_count;
        return (long)n;
    }
    if (r->error[0]) {
        snprintf(err, cap, "%s", r->error);
        return -1;
    }
    for (;;) {
        if (r->held) {
            release_block(r, r->held);
            r->held = NULL;
        }
        if (r->ended) return 0;
        if (!r->slots && !start_blocks(r)) FAIL("%s: out of memory", r->name);
        text_block *b = take_block(r);
        if (!b) FAIL("%s: the worker process that parses the trace ended before its end", r->name);
        r->held = b;
        r->hook_ns += b->order_ns;
        if (b->bad) FAIL("%s:%llu: %s", r->name, r->line + b->parsed.lines + 1, b->what);
        r->line += b->parsed.lines;
        r->position_bytes = b->source_bytes;
        if (b->tail == TAIL_DAMAGED) FAIL("%s:%llu: %s", r->name, r->line + 1, b->tail_reason);
        if (b->tail == TAIL_TOO_LONG) FAIL("%s:%llu: line too long or not text", r->name, r->line + 1);
        if (b->tail == TAIL_END) r->ended = true;
        size_t n = b->parsed.events;
        if (!n) continue;
        *out_events = b->events; /* ordered: relative times, hooked */
        return (long)n;
    }
}

#undef FAIL

long trace_read(trace_reader *r, trace_event *events, size_t capacity, char *err, size_t cap) {
    size_t n = 0;
    while (n < capacity) {
        if (r->batch_next == r->batch_count) {
            long got = trace_read_batch(r, &r->batch, err, cap);
            if (got < 0) return -1;
            r->batch_count = (size_t)got;
            r->batch_next = 0;
            if (!got) break;
        }
        size_t take = r->batch_count - r->batch_next;
        if (take > capacity - n) take = capacity - n;
        memcpy(events + n, r->batch + r->batch_next, take * sizeof *events);
        n += take;
        r->batch_next += take;
    }
    return (long)n;
}

void trace_set_batch_hook(trace_reader *r, trace_batch_hook hook, void *user) {
    if (r->slots || r->pk_next) return; /* too late */
    r->hook = hook;
    r->hook_user = user;
}

void trace_set_worker_process(trace_reader *r, bool process) {
    if (!r->slots) r->worker_process = process;
}

uint64_t trace_hook_ns(const trace_reader *r) { return r->hook_ns; }

void trace_set_threads(trace_reader *r, unsigned threads) {
    if (r->slots || r->format == TRACE_FORMAT_PYTORCH_PICKLE) return; /* too late, or nothing to parse */
    r->threads = threads > MAX_THREADS ? MAX_THREADS : threads;
}

/* ---------------------------------------------------------------- opening */

static bool open_pickle(trace_reader *r, char *err, size_t cap);

/* The first line of the text; false with err filled. */
static bool read_header(trace_reader *r, char *err, size_t cap) {
    const char *text;
    size_t avail;
    bool at_end;
    if (r->region) {
        text = r->region;
        avail = r->region_length;
        at_end = true;
    } else {
        for (;;) { /* until a newline, TRACE_LINE_MAX_BYTES + 1 bytes, or the end */
            if (memchr(r->carry, '\n', r->carry_length) || r->carry_length > TRACE_LINE_MAX_BYTES) break;
            long got = stream_read(r, r->carry + r->carry_length, r->block_bytes - r->carry_length);
            if (got < 0) {
                snprintf(err, cap, "%s:1: %s", r->name, r->damage_reason);
                return false;
            }
            if (got == 0) break;
            r->carry_length += (size_t)got;
        }
        text = r->carry;
        avail = r->carry_length;
        at_end = false;
    }
    if (!avail) {
        snprintf(err, cap, "%s: empty file (expected a header line '%s' or '%s')", r->name, TIDEPOOL_HEADER, RMM_HEADER);
        return false;
    }
    const char *nl = memchr(text, '\n', avail);
    size_t length = nl ? (size_t)(nl - text) + 1 : avail;
    (void)at_end;
    if (length > TRACE_LINE_MAX_BYTES || memchr(text, '\0', length)) {
        snprintf(err, cap, "%s:1: header line too long or not text", r->name);
        return false;
    }
    char line[TRACE_LINE_MAX_BYTES + 1];
    memcpy(line, text, length);
    line[length] = '\0';
    while (length && (line[length - 1] == '\n' || line[length - 1] == '\r')) line[--length] = '\0';
    if (r->region) {
        r->region_offset = nl ? (size_t)(nl - text) + 1 : avail;
    } else {
        size_t used = nl ? (size_t)(nl - text) + 1 : avail;
        crc_end_from_pending(r);
        char why[REASON_CAPACITY];
        if (!crc_feed(r, r->carry, used, NULL, why, sizeof why)) {
            snprintf(err, cap, "%s:1: %s", r->name, why);
            return false;
        }
        memmove(r->carry, r->carry + used, r->carry_length - used);
        r->carry_length -= used;
    }
    r->line = 1;
    const char *header = line;
    /* Tolerate a UTF-8 byte-order mark and surrounding blanks. */
    if ((unsigned char)header[0] == 0xEF && (unsigned char)header[1] == 0xBB && (unsigned char)header[2] == 0xBF) header += 3;
    while (*header == ' ') header++;
    if (strcmp(header, TIDEPOOL_HEADER) == 0) {
        r->format = TRACE_FORMAT_TIDEPOOL;
    } else if (strcmp(header, RMM_HEADER) == 0) {
        r->format = TRACE_FORMAT_RMM;
    } else {
        char shown[81];
        snprintf(shown, sizeof shown, "%.80s", header);
        trace_text_printable(shown); /* the file's bytes: no terminal escapes */
        snprintf(err, cap, "%s:1: unknown header '%s' (expected '%s' or '%s')", r->name, shown, TIDEPOOL_HEADER,
                 RMM_HEADER);
        return false;
    }
    return true;
}

static trace_reader *open_common(trace_reader *r, char *err, size_t cap) {
    /* A pickle starts with PROTO (0x80), which no text header does. */
    bool pickle;
    if (r->region) {
        pickle = r->region_length && (unsigned char)r->region[0] == 0x80;
    } else {
        long got = 0;
        while (!r->carry_length && (got = stream_read(r, r->carry, r->block_bytes)) > 0) r->carry_length = (size_t)got;
        if (got < 0) {
            snprintf(err, cap, "%s:1: %s", r->name, r->damage_reason);
            goto fail;
        }
        pickle = r->carry_length && (unsigned char)r->carry[0] == 0x80;
    }
    if (pickle) {
        if (!open_pickle(r, err, cap)) goto fail;
        r->format = TRACE_FORMAT_PYTORCH_PICKLE;
        return r;
    }
    if (!read_header(r, err, cap)) goto fail;
    return r;
fail:
    trace_close(r);
    return NULL;
}

static trace_reader *new_reader(const char *name, const trace_open_options *options, char *err, size_t cap) {
    trace_reader *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    r->fd = -1;
    snprintf(r->name, sizeof r->name, "%s", name);
    r->block_bytes = BLOCK_BYTES;
    r->snapshot_max_bytes = TRACE_SNAPSHOT_MAX_BYTES;
    if (options) {
        if (options->snapshot_max_bytes) r->snapshot_max_bytes = options->snapshot_max_bytes;
        r->pt_device = options->pt_device;
        r->zlib_gzip = options->zlib_gzip;
        r->inflater_gives_up = options->inflater_gives_up;
        r->inflater_gives_up_at = options->inflater_gives_up_at;
        if (options->block_bytes) r->block_bytes = options->block_bytes;
        if (r->block_bytes <= TRACE_LINE_MAX_BYTES) r->block_bytes = TRACE_LINE_MAX_BYTES + 1;
    }
    return r;
}

trace_reader *trace_open(const char *path, char *err, size_t cap) { return trace_open_with(path, NULL, err, cap); }

trace_reader *trace_open_memory(const char *data, size_t length, char *err, size_t cap) {
    return trace_open_memory_with(data, length, NULL, err, cap);
}

trace_reader *trace_open_with(const char *path, const trace_open_options *options, char *err, size_t cap) {
    trace_reader *r = new_reader(path, options, err, cap);
    if (!r) return NULL;
    if (!open_source(r, path, err, cap)) {
        trace_close(r);
        return NULL;
    }
    return open_common(r, err, cap);
}

trace_reader *trace_open_memory_with(const char *data, size_t length, const trace_open_options *options, char *err,
                                     size_t cap) {
    trace_reader *r = new_reader("<memory>", options, err, cap);
    if (!r) return NULL;
    r->region = data;
    r->region_length = length;
    return open_common(r, err, cap);
}

void trace_close(trace_reader *r) {
    if (!r) return;
    stop_workers(r);
    if (r->locks_ready) {
        pthread_mutex_destroy(&r->control->lock);
        pthread_mutex_destroy(&r->control->cut_lock);
        pthread_cond_destroy(&r->control->freed);
        pthread_cond_destroy(&r->control->parsed);
    }
    if (r->blocks_shared) munmap(r->blocks_memory, r->blocks_memory_bytes);
    else free(r->blocks_memory);
    if (r->z_ready) inflateEnd(&r->z);
    inflater_destroy(r->fast);
    if (r->gz_map) munmap((void *)r->gz_map, r->gz_map_length);
    if (r->mapping) munmap(r->mapping, r->mapping_length);
    if (r->fd >= 0) close(r->fd);
    free(r->input);
    free(r->carry);
    free(r->pk_events);
    free(r);
}

trace_format trace_get_format(const trace_reader *r) { return r->format; }

void trace_position(const trace_reader *r, uint64_t *bytes_read, uint64_t *bytes_total, uint64_t *events_total) {
    *events_total = r->format == TRACE_FORMAT_PYTORCH_PICKLE ? r->pk_count : 0;
    *bytes_total = r->fd >= 0 ? r->file_bytes : r->region_length;
    *bytes_read = r->format == TRACE_FORMAT_PYTORCH_PICKLE ? *bytes_total : r->position_bytes;
}

/* ------------------------------------------------ PyTorch memory snapshots */

/* A snapshot past r->snapshot_max_bytes: the error. */
static unsigned char *too_large(trace_reader *r, char *err, size_t cap) {
    char limit[64] = "";
    if (r->snapshot_max_bytes % (1ull << 30) == 0)
        snprintf(limit, sizeof limit, " (%llu GiB)", (unsigned long long)(r->snapshot_max_bytes >> 30));
    snprintf(err, cap, "%s: the snapshot is larger than %llu bytes%s%s, the most tide reads (it reads a snapshot whole)",
             r->name, (unsigned long long)r->snapshot_max_bytes, limit, r->gzip ? " inflated" : "");
    return NULL;
}

/* The whole (decompressed) file into memory, at most r->snapshot_max_bytes
 * of it; NULL with err filled. */
static unsigned char *slurp(trace_reader *r, size_t *out_length, char *err, size_t cap) {
    const uint64_t max = r->snapshot_max_bytes < SIZE_MAX - 1 ? r->snapshot_max_bytes : SIZE_MAX - 1;
    if (r->region && r->region_length > max) return too_large(r, err, cap);
    if (!r->region && r->carry_length > max) return too_large(r, err, cap);
    if (r->region) {
        unsigned char *copy = malloc(r->region_length ? r->region_length : 1);
        if (!copy) snprintf(err, cap, "%s: out of memory", r->name);
        else memcpy(copy, r->region, r->region_length);
        *out_length = r->region_length;
        return copy;
    }
    size_t length = r->carry_length, capacity = (size_t)1 << 20;
    if (capacity > max + 1) capacity = (size_t)max + 1; /* room for one byte past the limit */
    if (capacity < length) capacity = length;
    unsigned char *buf = malloc(capacity);
    if (buf) memcpy(buf, r->carry, length);
    r->carry_length = 0;
    for (;;) {
        if (!buf) {
            snprintf(err, cap, "%s: out of memory reading the snapshot", r->name);
            return NULL;
        }
        if (length > max) {
            free(buf);
            return too_large(r, err, cap);
        }
        if (length == capacity) {
            size_t larger = capacity <= max / 2 ? capacity * 2 : (size_t)max + 1; /* > capacity: length <= max */
            unsigned char *grown = realloc(buf, larger);
            if (!grown) free(buf);
            buf = grown;
            capacity = larger;
            continue;
        }
        long n = stream_read(r, (char *)buf + length, capacity - length < (1u << 30) ? capacity - length : (1u << 30));
        if (n > 0) {
            length += (size_t)n;
            continue;
        }
        if (n < 0) {
            snprintf(err, cap, "%s: %s", r->name, r->damage_reason);
            free(buf);
            return NULL;
        }
        break;
    }
    crc_end_from_pending(r); /* (the text from its start is in buf: no header line was taken) */
    char why[REASON_CAPACITY];
    if (!crc_feed(r, (const char *)buf, length, NULL, why, sizeof why)) {
        snprintf(err, cap, "%s: %s", r->name, why);
        free(buf);
        return NULL;
    }
    *out_length = length;
    return buf;
}

/* Fills r->pk_events from device_traces[r->pt_device], as the recorder of
 * the shared traces did: alloc -> alloc, free_requested -> free, the rest
 * (free_completed, segment_*, snapshot, oom, ...) left out; time_us and
 * stream default to 0. */
static bool open_pickle(trace_reader *r, char *err, size_t cap) {
    size_t length = 0;
    unsigned char *data = slurp(r, &length, err, cap);
    if (!data) return false;
    char why[256];
    pk_doc *doc = pk_parse(data, length, why, sizeof why);
    if (!doc) {
        snprintf(err, cap, "%s: not a readable pickle: %s", r->name, why);
        free(data);
        return false;
    }
    bool ok = false;
    const pk_value *root = pk_root(doc);
    const pk_value *traces = pk_dict_get(root, "device_traces");
    if (!traces) {
        snprintf(err, cap, "%s: a pickle without 'device_traces' (expected what torch.cuda.memory._snapshot() returns, "
                 "recorded after torch.cuda.memory._record_memory_history())", r->name);
        goto done;
    }
    if (traces->type != PK_LIST) {
        snprintf(err, cap, "%s: 'device_traces' is a %s, not a list", r->name, pk_type_name(traces));
        goto done;
    }
    size_t devices = pk_list_count(traces);
    if (r->pt_device >= devices) {
        snprintf(err, cap, "%s: device %u has no trace: the snapshot holds %zu device%s (0 to %zu)", r->name,
                 r->pt_device, devices, devices == 1 ? "" : "s", devices ? devices - 1 : 0);
        if (!devices) snprintf(err, cap, "%s: the snapshot holds no device trace ('device_traces' is empty)", r->name);
        goto done;
    }
    const pk_value *list = pk_list_item(traces, r->pt_device);
    if (list->type != PK_LIST) {
        snprintf(err, cap, "%s: device_traces[%u] is a %s, not a list", r->name, r->pt_device, pk_type_name(list));
        goto done;
    }
    size_t count = pk_list_count(list), kept = 0;
    r->pk_events = malloc((count ? count : 1) * sizeof *r->pk_events);
    if (!r->pk_events) {
        snprintf(err, cap, "%s: out of memory", r->name);
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        const pk_value *entry = pk_list_item(list, i);
        const pk_value *action = pk_dict_get(entry, "action");
#define ENTRY_BAD(...)                                                                               \
    do {                                                                                             \
        int at_ = snprintf(err, cap, "%s: device_traces[%u][%zu]: ", r->name, r->pt_device, i);      \
        if (at_ > 0 && (size_t)at_ < cap) snprintf(err + at_, cap - (size_t)at_, __VA_ARGS__);       \
        goto done;                                                                                   \
    } while (0)
        if (entry->type != PK_DICT) ENTRY_BAD("a %s, not a dict", pk_type_name(entry));
        if (!action || action->type != PK_STR) ENTRY_BAD("no 'action' string");
        trace_event *e = &r->pk_events[kept];
        if (pk_str_is(action, "alloc")) e->action = TRACE_ALLOC;
        else if (pk_str_is(action, "free_requested")) e->action = TRACE_FREE;
        else continue;
        const pk_value *addr = pk_dict_get(entry, "addr"), *size = pk_dict_get(entry, "size");
        const pk_value *stream = pk_dict_get(entry, "stream"), *time = pk_dict_get(entry, "time_us");
        uint64_t t_us = 0, bits = 0;
        if (!pk_as_bits64(addr, &e->address)) ENTRY_BAD("'addr' is %s, not a 64-bit int", addr ? pk_type_name(addr) : "missing");
        if (!pk_as_bits64(size, &e->bytes) || (size->int_range == PK_INT_I64 && size->u.i < 0))
            ENTRY_BAD("'size' is %s, not a byte count", size ? pk_type_name(size) : "missing");
        if (stream && stream->type != PK_NONE && !pk_as_bits64(stream, &bits))
            ENTRY_BAD("'stream' is a %s, not an int", pk_type_name(stream));
        e->stream = fold_stream(bits);
        if (time && time->type != PK_NONE &&
            (!pk_as_bits64(time, &t_us) || (time->int_range == PK_INT_I64 && time->u.i < 0) || t_us > UINT64_MAX / 1000))
            ENTRY_BAD("'time_us' is not a time in microseconds");
#undef ENTRY_BAD
        uint64_t t_ns = t_us * 1000;
        if (!r->have_origin) {
            r->have_origin = true;
            r->origin_ns = t_ns;
        }
        e->time_ns = t_ns >= r->origin_ns ? t_ns - r->origin_ns : 0;
        kept++;
    }
    r->pk_count = kept;
    ok = true;
done:
    pk_free(doc);
    free(data);
    return ok;
}

/* ---------------------------------------------------------------- writer */

struct trace_writer {
    gzFile gz;
    FILE *plain;
};

trace_writer *trace_writer_open(const char *path, char *err, size_t cap) {
    trace_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    size_t len = strlen(path);
    if (len > 3 && strcmp(path + len - 3, ".gz") == 0)
        w->gz = gzopen(path, "wb6");
    else
        w->plain = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (!w->gz && !w->plain) {
        snprintf(err, cap, "%s: cannot create: %s", path, strerror(errno));
        free(w);
        return NULL;
    }
    if (w->gz) gzprintf(w->gz, "%s\n", TIDEPOOL_HEADER);
    else fprintf(w->plain, "%s\n", TIDEPOOL_HEADER);
    return w;
}

int trace_write(trace_writer *w, const trace_event *e) {
    const char *action = e->action == TRACE_FREE ? "free" : "alloc";
    unsigned long long t_us = (unsigned long long)(e->time_ns / 1000);
    if (w->gz)
        return gzprintf(w->gz, "%llu,%s,%llu,%llu,%u\n", t_us, action, (unsigned long long)e->address,
                        (unsigned long long)e->bytes, e->stream) > 0 ? 0 : -1;
    return fprintf(w->plain, "%llu,%s,%llu,%llu,%u\n", t_us, action, (unsigned long long)e->address,
                   (unsigned long long)e->bytes, e->stream) > 0 ? 0 : -1;
}

int trace_writer_close(trace_writer *w) {
    int rc = 0;
    if (w->gz) rc = gzclose(w->gz) == Z_OK ? 0 : -1;
    else if (w->plain && w->plain != stdout) rc = fclose(w->plain) == 0 ? 0 : -1;
    else if (w->plain) rc = fflush(w->plain) == 0 ? 0 : -1;
    free(w);
    return rc;
}
