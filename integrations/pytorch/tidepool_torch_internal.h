/* SPDX-License-Identifier: MIT */
/*
 * tidepool_torch_internal.h -- between the C shim (tidepool_torch.c) and its
 * C++ entry point (tidepool_torch_raise.cpp). Nothing here is exported.
 */
#ifndef TIDEPOOL_TORCH_INTERNAL_H
#define TIDEPOOL_TORCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#ifdef __cplusplus
extern "C" {
#endif

/* What tp_torch_alloc does when it has no memory to return (oom=). */
typedef enum tpt_oom_mode {
    TPT_OOM_RAISE = 0, /* throw a C++ exception: PyTorch raises RuntimeError */
    TPT_OOM_NULL = 1,  /* return NULL */
    TPT_OOM_ABORT = 2  /* print the report and abort() */
} tpt_oom_mode;

/* The allocation itself: NULL on failure (and for size <= 0), never throws. */
void *tpt_alloc(ssize_t size, int device, void *stream);
tpt_oom_mode tpt_get_oom_mode(void);
/* Why tpt_alloc(size, device) just failed, as one line for an exception. */
void tpt_oom_message(ssize_t size, int device, char *buf, size_t capacity);
/* oom=abort: prints the message and aborts. */
void tpt_oom_abort(ssize_t size, int device) __attribute__((noreturn));
/* Whether the failure tpt_alloc just reported was a lack of memory (as
 * opposed to no device, or a configuration refused). */
int tpt_last_failure_was_oom(void);
/* The function tp_torch_set_oom_handler installed, or NULL: called with the
 * out-of-memory message, it throws the host's own exception type (PyTorch's
 * c10::OutOfMemoryError, built against the installed torch). */
typedef void (*tpt_oom_handler)(const char *message);
tpt_oom_handler tpt_get_oom_handler(void);

/* A line on stderr at level (a tp_log_level) if the configured log level
 * lets it through, as the shim's own messages. */
void tpt_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* trace=PATH (tidepool_torch_trace.c). */
struct tp_pool_event;
typedef struct tpt_trace tpt_trace;
/* Whether this build writes gzip (zlib found at build time). */
bool tpt_trace_has_gzip(void);
/* The file name for device: %p -> pid, %d -> device (see the .c file). */
void tpt_trace_resolve(const char *pattern, int device, char *out, size_t capacity);
/* Creates the file and writes the header row; NULL with err filled. */
tpt_trace *tpt_trace_open(const char *path, char *err, size_t err_capacity);
/* A tp_pool_observer_fn; user is the tpt_trace. */
void tpt_trace_observer(void *user, const struct tp_pool_event *event);
/* Stops recording, writes the rest and closes the file (the tpt_trace stays
 * allocated: a late observer call finds it closed). 1 when written, 0 when
 * already closed or in a forked child, -1 on a write error. */
int tpt_trace_close(tpt_trace *trace);
/* pthread_atfork handlers, called for each trace: before_fork takes the
 * trace's lock, after_fork_parent releases it, after_fork_child releases it
 * in the child after stopping the child's copy (no row of the child, nor
 * one buffered at the fork, reaches the parent's file). */
void tpt_trace_before_fork(tpt_trace *trace);
void tpt_trace_after_fork_parent(tpt_trace *trace);
void tpt_trace_after_fork_child(tpt_trace *trace);
const char *tpt_trace_path(const tpt_trace *trace);
/* One consistent reading of a trace's counts, for the stats JSON. */
typedef struct tpt_trace_state {
    uint64_t rows;      /* rows recorded (written, buffered, or lost) */
    uint64_t rows_lost; /* rows that never reached the file (a write failed) */
    bool open;
    bool write_failed;  /* a write or the close failed (logged once at ERROR) */
} tpt_trace_state;
tpt_trace_state tpt_trace_get_state(tpt_trace *trace);

#ifdef __cplusplus
}
#endif

#endif
