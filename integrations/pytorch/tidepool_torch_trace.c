/* SPDX-License-Identifier: MIT */
/*
 * tidepool_torch_trace.c -- trace=PATH: one pool's allocations and frees as
 * tidepool's CSV trace (time_us,action,addr,size,stream), the format
 * `tide replay` reads.
 *
 * A pool observer (tp_pool_set_observer) receives every event with the
 * pool's lock held; alloc and free events become rows in a buffer of this
 * trace, written out (gzip-compressed when built with zlib) when it fills
 * and when the trace is closed (tp_torch_trace_close, or at exit). A write
 * that fails is logged once at ERROR and ends the writing; the rows that
 * never reach the file are counted (rows_lost in the stats JSON).
 *   time_us  the event's device clock (tp_pool_event.time_ns) / 1000
 *   addr     the block's address, decimal (identity only)
 *   size     the bytes the caller asked for
 *   stream   0 for the default (NULL) stream, then 1, 2, ... in the order
 *            the streams first appear in this trace
 * The observer is installed right after the pool is created, before its
 * first allocation, so the trace holds every block the pool handed out and
 * replaying it reproduces the pool's peak of requested bytes exactly.
 *
 * Locking: the observer runs under the pool's lock and takes the trace's
 * own lock; closing takes the trace's lock only (never the pool's), so the
 * two cannot deadlock.
 *
 * fork(): the trace's lock is held across the fork (pthread_atfork, in
 * tidepool_torch.c), so the child's copy is consistent and unlocked. In the
 * child it stops recording (tpt_trace_after_fork_child): the rows buffered
 * at the fork and the child's own are dropped, never written into the
 * parent's file. The plain FILE is unbuffered, so the child's exit(), which
 * flushes every FILE, has none of the parent's rows to write either.
 */
#include "tidepool.h"
#include "tidepool_torch_internal.h"
#include "tpi_map.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef TPT_HAVE_ZLIB
#include <zlib.h>
#endif

#define TRACE_HEADER "time_us,action,addr,size,stream\n"
#define TRACE_BUFFER (256u * 1024u)
#define TRACE_ROW_MAX 96u

struct tpt_trace {
    pthread_mutex_t lock;
#ifdef TPT_HAVE_ZLIB
    gzFile gz;
#endif
    FILE *plain;
    bool open;
    bool write_failed;        /* a write failed: nothing is written any more */
    pid_t owner;
    tpi_map streams;          /* stream pointer -> id (1, 2, ...) */
    uint64_t next_stream_id;
    uint64_t rows;            /* rows recorded: written, in buf, or lost */
    uint64_t rows_in_buf;
    uint64_t rows_lost;       /* rows that never reached the file */
    char path[PATH_MAX];
    size_t len;
    char buf[TRACE_BUFFER];
};

bool tpt_trace_has_gzip(void) {
#ifdef TPT_HAVE_ZLIB
    return true;
#else
    return false;
#endif
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && !strcmp(s + n - m, suffix);
}

/* %p: the process id; %d: the device number. Without %d, device 0 writes
 * the path as given and device N inserts ".devN" before the extension
 * (".csv.gz", ".csv", ".gz", or the end). Without zlib a ".gz" at the end
 * is dropped (the file is plain CSV). */
void tpt_trace_resolve(const char *pattern, int device, char *out, size_t capacity) {
    char tmp[PATH_MAX + 64];
    size_t o = 0;
    bool has_device = false;
    for (const char *p = pattern; *p && o + 24 < sizeof tmp; p++) {
        if (p[0] == '%' && p[1] == 'p') {
            o += (size_t)snprintf(tmp + o, sizeof tmp - o, "%ld", (long)getpid());
            p++;
        } else if (p[0] == '%' && p[1] == 'd') {
            o += (size_t)snprintf(tmp + o, sizeof tmp - o, "%d", device);
            has_device = true;
            p++;
        } else {
            tmp[o++] = *p;
        }
    }
    tmp[o] = '\0';
    if (!tpt_trace_has_gzip() && ends_with(tmp, ".gz")) tmp[strlen(tmp) - 3] = '\0';
    if (!has_device && device != 0) {
        static const char *exts[] = {".csv.gz", ".csv", ".gz"};
        size_t cut = strlen(tmp);
        for (size_t i = 0; i < sizeof exts / sizeof exts[0]; i++) {
            if (ends_with(tmp, exts[i])) {
                cut -= strlen(exts[i]);
                break;
            }
        }
        snprintf(out, capacity, "%.*s.dev%d%s", (int)cut, tmp, device, tmp + cut);
        return;
    }
    snprintf(out, capacity, "%s", tmp);
}

/* The first write that fails is logged (once: the next ones would fail
 * alike); lock held. */
static void note_write_failure(tpt_trace *t, const char *why) {
    if (t->write_failed) return;
    t->write_failed = true;
    tpt_log(TP_LOG_ERROR, "trace %s: writing failed (%s); nothing more is written to it: %llu rows lost so far, and "
            "every later row (\"rows_lost\" in the stats JSON)", t->path, why,
            (unsigned long long)(t->rows_lost + t->rows_in_buf));
}

/* Writes the buffer out; lock held. After a failed write nothing more is
 * written: a trace with rows missing in the middle would replay wrong
 * (frees of blocks it never allocated), one cut short replays what it
 * holds. The rows that never reach the file are counted apart. */
static void flush_locked(tpt_trace *t) {
    if (!t->len) return;
    if (!t->write_failed) {
#ifdef TPT_HAVE_ZLIB
        if (t->gz) {
            if (gzwrite(t->gz, t->buf, (unsigned)t->len) != (int)t->len) {
                int code = Z_OK;
                const char *why = gzerror(t->gz, &code);
                note_write_failure(t, code == Z_ERRNO ? strerror(errno) : why);
            }
        } else
#endif
        if (fwrite(t->buf, 1, t->len, t->plain) != t->len) {
            note_write_failure(t, strerror(errno));
        }
    }
    if (t->write_failed) t->rows_lost += t->rows_in_buf;
    t->rows_in_buf = 0;
    t->len = 0;
}

tpt_trace *tpt_trace_open(const char *path, char *err, size_t err_capacity) {
    tpt_trace *t = calloc(1, sizeof *t);
    if (!t) {
        snprintf(err, err_capacity, "out of host memory");
        return NULL;
    }
    snprintf(t->path, sizeof t->path, "%s", path);
#ifdef TPT_HAVE_ZLIB
    if (ends_with(path, ".gz")) {
        t->gz = gzopen(path, "wb1");
        if (!t->gz) {
            snprintf(err, err_capacity, "cannot create %s: %s", path, strerror(errno));
            free(t);
            return NULL;
        }
        gzbuffer(t->gz, 1u << 17);
    }
    if (!t->gz)
#endif
    {
        t->plain = fopen(path, "w");
        if (!t->plain) {
            snprintf(err, err_capacity, "cannot create %s: %s", path, strerror(errno));
            free(t);
            return NULL;
        }
        /* The trace buffers its rows itself: nothing may wait in stdio's
         * buffer, where a fork()ed child's exit() would write it into this
         * file a second time. */
        setvbuf(t->plain, NULL, _IONBF, 0);
    }
    pthread_mutex_init(&t->lock, NULL);
    tpi_map_init(&t->streams, NULL);
    t->owner = getpid();
    t->open = true;
    memcpy(t->buf, TRACE_HEADER, sizeof TRACE_HEADER - 1);
    t->len = sizeof TRACE_HEADER - 1;
    return t;
}

void tpt_trace_observer(void *user, const tp_pool_event *e) {
    tpt_trace *t = user;
    if (e->kind != TP_POOL_EVENT_ALLOC && e->kind != TP_POOL_EVENT_FREE) return;
    pthread_mutex_lock(&t->lock);
    if (!t->open) goto out;
    uint64_t stream_id = 0;
    if (e->stream) {
        uint64_t key = (uint64_t)(uintptr_t)e->stream;
        if (!tpi_map_get(&t->streams, key, &stream_id)) {
            stream_id = ++t->next_stream_id;
            if (!tpi_map_put(&t->streams, key, stream_id)) stream_id = key; /* out of host memory: the raw value */
        }
    }
    if (t->len + TRACE_ROW_MAX > sizeof t->buf) flush_locked(t);
    int n = snprintf(t->buf + t->len, sizeof t->buf - t->len, "%" PRIu64 ",%s,%" PRIu64 ",%" PRIu64 ",%" PRIu64 "\n",
                     e->time_ns / 1000u, e->kind == TP_POOL_EVENT_ALLOC ? "alloc" : "free", e->address, e->bytes,
                     stream_id);
    if (n > 0 && (size_t)n < sizeof t->buf - t->len) {
        t->len += (size_t)n;
        t->rows++;
        t->rows_in_buf++;
    }
out:
    pthread_mutex_unlock(&t->lock);
}

int tpt_trace_close(tpt_trace *t) {
    if (!t) return 0;
    pthread_mutex_lock(&t->lock);
    int rc = 0;
    if (t->open) {
        t->open = false;
        if (getpid() == t->owner) { /* a forked child leaves the parent's file alone */
            flush_locked(t);
            /* Rows a failed close loses (zlib's buffer) cannot be counted. */
#ifdef TPT_HAVE_ZLIB
            if (t->gz && gzclose(t->gz) != Z_OK) note_write_failure(t, "closing the gzip stream failed");
            t->gz = NULL;
#endif
            if (t->plain && fclose(t->plain) != 0) note_write_failure(t, strerror(errno));
            t->plain = NULL;
            rc = t->write_failed ? -1 : 1;
        }
        tpi_map_destroy(&t->streams);
    }
    pthread_mutex_unlock(&t->lock);
    return rc;
}

void tpt_trace_before_fork(tpt_trace *t) {
    if (t) pthread_mutex_lock(&t->lock);
}

void tpt_trace_after_fork_parent(tpt_trace *t) {
    if (t) pthread_mutex_unlock(&t->lock);
}

void tpt_trace_after_fork_child(tpt_trace *t) {
    if (!t) return;
    t->open = false; /* the observer drops the child's rows; closing writes nothing */
    t->len = 0;      /* the parent's buffered rows: the parent writes them */
    t->rows_in_buf = 0;
    pthread_mutex_unlock(&t->lock);
}

const char *tpt_trace_path(const tpt_trace *t) { return t ? t->path : ""; }

tpt_trace_state tpt_trace_get_state(tpt_trace *t) {
    tpt_trace_state s = {0};
    if (!t) return s;
    pthread_mutex_lock(&t->lock);
    s.rows = t->rows;
    s.rows_lost = t->rows_lost;
    s.open = t->open;
    s.write_failed = t->write_failed;
    pthread_mutex_unlock(&t->lock);
    return s;
}
