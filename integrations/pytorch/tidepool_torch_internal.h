/*
 * tidepool_torch_internal.h -- between the C shim (tidepool_torch.c) and its
 * C++ entry point (tidepool_torch_raise.cpp). Nothing here is exported.
 */
#ifndef TIDEPOOL_TORCH_INTERNAL_H
#define TIDEPOOL_TORCH_INTERNAL_H

#include <stddef.h>
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

#ifdef __cplusplus
}
#endif

#endif
