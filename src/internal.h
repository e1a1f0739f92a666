/* SPDX-License-Identifier: MIT */
/*
 * internal.h -- what the library's components share and the public header
 * does not show: host-memory and logging helpers, the device object and the
 * table of operations each backend fills in.
 *
 * Device addresses travel as uint64_t inside the library; the public API
 * turns them into pointers at its edge.
 */
#ifndef TIDEPOOL_INTERNAL_H
#define TIDEPOOL_INTERNAL_H

#include "tidepool.h"
#include "tidepool_sim.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

#define TPI_KiB (1024ull)
#define TPI_MiB (1024ull * 1024ull)
#define TPI_GiB (1024ull * 1024ull * 1024ull)

#define TPI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define TPI_MAX(a, b) ((a) > (b) ? (a) : (b))

/* A slow path kept out of its fast caller, whose registers and stack frame
 * it would otherwise cost on every call (gcc and clang). */
#define TPI_NOINLINE __attribute__((noinline))
/* ... and the fast path's body, inlined even where the compiler would not. */
#define TPI_ALWAYS_INLINE inline __attribute__((always_inline))

static inline uint64_t tpi_align_up(uint64_t value, uint64_t alignment) {
    return (value + alignment - 1) & ~(alignment - 1);
}
static inline uint64_t tpi_align_down(uint64_t value, uint64_t alignment) {
    return value & ~(alignment - 1);
}
static inline bool tpi_is_pow2(uint64_t value) { return value && !(value & (value - 1)); }

/* The one way an invariant checker reports: writes the first violation
 * into msg (when there is room) and returns false from the checker. */
#define TPI_FAIL(msg, msg_capacity, ...)                                        \
    do {                                                                        \
        if ((msg) && (msg_capacity)) snprintf((msg), (msg_capacity), __VA_ARGS__); \
        return false;                                                           \
    } while (0)

/* ------------------------------------------------------------ host memory */

typedef struct tpi_host {
    tp_host_allocator allocator; /* always complete (libc filled in) */
} tpi_host;

void tpi_host_init(tpi_host *host, const tp_host_allocator *user_allocator);
void *tpi_host_alloc(const tpi_host *host, size_t bytes);
void *tpi_host_calloc(const tpi_host *host, size_t count, size_t size);
void *tpi_host_realloc(const tpi_host *host, void *ptr, size_t old_bytes, size_t new_bytes);
void tpi_host_free(const tpi_host *host, void *ptr, size_t bytes);
/* Grows *array (element size elem) to hold at least need elements, doubling.
 * Returns false (array untouched) when host memory runs out. */
bool tpi_host_grow(const tpi_host *host, void **array, size_t elem, size_t *capacity, size_t need);

/* ---------------------------------------------------------------- logging */

typedef struct tpi_logger {
    tp_log_fn fn;
    void *user;
    tp_log_level min_level;
} tpi_logger;

void tpi_logf(const tpi_logger *logger, tp_log_level level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));


/* ----------------------------------------------------------------- device */

/* An instantiated graph executable as the backend sees it. */
typedef struct tp_graph_exec_opaque *tpi_graph_exec;

typedef struct tpi_device_ops {
    const char *backend;
    void (*close)(tp_device *device);
    tp_status (*mem_info)(tp_device *device, uint64_t *out_free_bytes, uint64_t *out_total_bytes);

    /* VMM: address reservation; map backs [va, va+bytes) with physical
     * allocations ("chunks") of chunk_bytes each, laid from va (the last
     * one may be shorter; 0: one per page of the device's granularity),
     * made accessible (create + map + set access). The driver's cost is per
     * chunk, not per byte, so large chunks make growth cheap; but a chunk
     * is given back only whole. unmap gives back any run of mapped memory
     * made of whole chunks, not necessarily one that was mapped in one
     * call; a run that would cut a chunk is refused
     * (TP_ERR_INVALID_ARGUMENT). Both are all-or-nothing. */
    tp_status (*va_reserve)(tp_device *device, uint64_t bytes, uint64_t alignment, uint64_t *out_va);
    tp_status (*va_release)(tp_device *device, uint64_t va, uint64_t bytes);
    tp_status (*map)(tp_device *device, uint64_t va, uint64_t bytes, uint64_t chunk_bytes);
    tp_status (*unmap)(tp_device *device, uint64_t va, uint64_t bytes);

    /* Plain device memory (no VMM). */
    tp_status (*mem_alloc)(tp_device *device, uint64_t bytes, uint64_t *out_address);
    tp_status (*mem_free)(tp_device *device, uint64_t address, uint64_t bytes);

    tp_status (*stream_create)(tp_device *device, tp_stream *out_stream);
    tp_status (*stream_destroy)(tp_device *device, tp_stream stream);
    tp_status (*stream_synchronize)(tp_device *device, tp_stream stream);
    tp_status (*stream_wait_event)(tp_device *device, tp_stream stream, tp_event event);
    tp_status (*event_create)(tp_device *device, tp_event *out_event);
    tp_status (*event_destroy)(tp_device *device, tp_event event);
    tp_status (*event_record)(tp_device *device, tp_event event, tp_stream stream);
    tp_status (*event_query)(tp_device *device, tp_event event);
    tp_status (*event_synchronize)(tp_device *device, tp_event event);
    tp_status (*device_synchronize)(tp_device *device);

    /* Optional (NULL: streams never capture): is the stream capturing a
     * graph right now? Work queued on a capturing stream is recorded into
     * the graph, not run; synchronising it, or querying or synchronising
     * an event recorded on it, invalidates the capture (as on CUDA). */
    tp_status (*stream_capturing)(tp_device *device, tp_stream stream, bool *out_capturing);

    /* Monotonic time in ns: the virtual clock on the simulator. */
    uint64_t (*now_ns)(tp_device *device);

    /* Optional (NULL when absent): the hazard checker's view of a block the
     * pool hands out on stream. Returns the number of hazards found. */
    uint64_t (*check_handout)(tp_device *device, uint64_t address, uint64_t bytes, tp_stream stream);

    /* Graph executables. instantiate reports the device bytes it cost. */
    tp_status (*graph_instantiate)(tp_device *device, tp_graph graph, tpi_graph_exec *out_exec,
                                   uint64_t *out_bytes);
    tp_status (*graph_update)(tp_device *device, tpi_graph_exec exec, tp_graph graph);
    tp_status (*graph_launch)(tp_device *device, tpi_graph_exec exec, tp_stream stream);
    tp_status (*graph_destroy)(tp_device *device, tpi_graph_exec exec);
    /* Optional: nodes of a graph template (for byte estimates); 0 if unknown. */
    uint64_t (*graph_node_count)(tp_device *device, tp_graph graph);
} tpi_device_ops;

struct tp_device {
    const tpi_device_ops *ops;
    void *impl;
    tpi_host host;
    tpi_logger logger;
    tp_device_info info;
    bool hazard_checker; /* check_handout is worth calling */
    /* With hazard_checker: a count that is 0 while check_handout would find
     * nothing (no work pending to conflict with), read without a lock; NULL:
     * check every hand-out. */
    const _Atomic size_t *hazard_work;
    atomic_int users;    /* pools and caches open on this device */
};

/* Backend constructors, called by tp_device_open with the options parsed. */
typedef struct tpi_device_options {
    uint64_t capacity_bytes;    /* 0: backend default */
    uint64_t granularity_bytes; /* 0: backend default */
    uint64_t graph_node_bytes;  /* sim: device bytes per graph node */
    uint64_t graph_exec_bytes;  /* sim: device bytes per executable on top */
    uint64_t seed;
    int ordinal;
    bool novmm;
    bool nocheck;
    bool graphpool;
    bool adjacent; /* sim: device allocations may follow each other directly */
} tpi_device_options;

tp_status tpi_sim_device_create(tp_device *device, const tpi_device_options *options);
tp_status tpi_cuda_device_create(tp_device *device, const tpi_device_options *options);

#endif /* TIDEPOOL_INTERNAL_H */
