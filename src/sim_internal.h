/* SPDX-License-Identifier: MIT */
/*
 * sim_internal.h -- what the simulated device's two files share: its private
 * types (the device, its streams, events, kernels, resident ranges, faults,
 * captures, graph templates and executables), the device lock and the model
 * helpers that the public simulator calls use. sim_device.c is the model and
 * the device table, and states the invariants; sim_hooks.c holds the calls
 * tidepool_sim.h declares. Nothing outside these two files includes this.
 */
#ifndef TIDEPOOL_SIM_INTERNAL_H
#define TIDEPOOL_SIM_INTERNAL_H

#include "internal.h"

#define SIM_MAX_STREAMS 64

/* A stream's capture: what it recorded so far (see "Capture" in sim_device.c). */
typedef struct sim_capture {
    tp_sim_capture_state state;
    uint64_t id;          /* unique per capture; events recorded in it carry it */
    uint32_t node_count;
    uint64_t topology;    /* FNV-1a over the sequence of nodes */
    uint64_t duration_ns; /* sum of the nodes' durations */
    tp_range *ranges;     /* every non-empty range a node touches, unmerged */
    size_t range_count, range_capacity;
} sim_capture;

typedef struct sim_stream {
    bool in_use;
    uint64_t tail_ns;       /* completion time of the last queued work */
    uint64_t wait_floor_ns; /* latest completion of waited-on events */
    uint64_t seq;           /* kernels launched so far */
    uint64_t vc[SIM_MAX_STREAMS];
    sim_capture capture;
} sim_stream;

typedef struct sim_event {
    bool recorded;
    uint32_t capture_stream; /* last recorded during capture capture_id there */
    uint64_t capture_id;     /* (0: last recorded outside any capture) */
    uint64_t time_ns;
    uint64_t vc[SIM_MAX_STREAMS];
} sim_event;

typedef struct sim_kernel {
    uint64_t end_ns;
    uint32_t stream;
    uint64_t seq;
    size_t range_count;
    tp_range *ranges;
} sim_kernel;

enum { RESIDENT_MAP = 1, RESIDENT_ALLOC = 2 };

typedef struct sim_resident {
    uint64_t start;
    uint64_t bytes;
    int kind;
} sim_resident;

typedef struct sim_reservation {
    uint64_t va;
    uint64_t bytes;
} sim_reservation;

typedef struct sim_fault {
    bool armed;
    uint64_t skip;
    uint64_t fail;
    tp_status status;
} sim_fault;

typedef struct sim_graph {
    uint32_t node_count;
    uint64_t topology_id;
    uint64_t duration_ns;
    size_t range_count;
    tp_range *ranges;
} sim_graph;

typedef struct sim_exec {
    sim_graph shape; /* a copy of the template it was made from */
    uint64_t bytes;
} sim_exec;

typedef struct sim_device {
    pthread_mutex_t lock;
    tp_device *device;
    uint64_t capacity_bytes;
    uint64_t granularity_bytes;
    uint64_t graph_node_bytes, graph_exec_bytes;
    bool vmm;
    bool check;
    bool adjacent; /* device allocations may follow each other directly */
    /* The clock, now_ns + owner_ns (saturating; sim_clock_now), in two
     * counters that only rise. owner_ns is moved by one thread only, the
     * clock's owner: the first thread that advanced it (tp_sim_advance),
     * with a plain load and store -- a replay steps the clock at nearly
     * every event, and a locked compare-exchange there cost an eighth of
     * its pool stage. now_ns is moved by every other thread's step and by
     * the raises of host waits (under the lock), with compare-exchange.
     * Each counter only rises, so their sum only rises, and steps taken
     * side by side all count. Read without the lock. */
    _Atomic uint64_t now_ns;
    _Atomic uint64_t owner_ns;
    _Atomic uintptr_t owner; /* the owner's pthread_self(); 0: none yet */

    sim_stream streams[SIM_MAX_STREAMS];

    sim_kernel *kernels;
    size_t kernel_count, kernel_capacity;
    /* kernel_count, written with it under the lock, read without it: a
     * replay's clock steps and hand-out checks skip the lock while no
     * kernel is pending. */
    _Atomic size_t kernels_pending;

    sim_resident *resident;
    size_t resident_count, resident_capacity;
    sim_reservation *reservations;
    size_t reservation_count, reservation_capacity;
    uint64_t next_va, next_malloc;

    uint64_t mapped_bytes, allocated_bytes, graph_bytes, occupied_bytes;
    /* graphpool: memory the "driver" holds for executables, never given
     * back: the high-water mark of graph_bytes. */
    bool graph_pool;
    uint64_t graph_pool_bytes;
    sim_fault faults[TP_SIM_OP_COUNT_];
    tp_sim_counters counters;
    uint64_t last_capture_id;
} sim_device;

/* Capture topology: FNV-1a over the node sequence, one token per node. */
#define SIM_FNV_BASIS 0xcbf29ce484222325ull
#define SIM_FNV_PRIME 0x100000001b3ull
enum { NODE_KERNEL = 1, NODE_GRAPH = 2 }; /* topology tokens */

/* Runs the statements with the device lock held. */
#define SIM_LOCKED(sim, ...)                \
    do {                                    \
        pthread_mutex_lock(&(sim)->lock);   \
        __VA_ARGS__;                        \
        pthread_mutex_unlock(&(sim)->lock); \
    } while (0)

static inline sim_device *sim_of(tp_device *device) { return (sim_device *)device->impl; }

/* The clock now. */
static inline uint64_t sim_clock_now(sim_device *sim) {
    uint64_t owned = atomic_load_explicit(&sim->owner_ns, memory_order_relaxed);
    uint64_t shared = atomic_load_explicit(&sim->now_ns, memory_order_relaxed);
    return owned > UINT64_MAX - shared ? UINT64_MAX : owned + shared;
}

/* The clock moves to at least t_ns (by the shared counter: a step the
 * owner takes meanwhile adds to it). */
static inline void sim_clock_raise(sim_device *sim, uint64_t t_ns) {
    uint64_t shared = atomic_load_explicit(&sim->now_ns, memory_order_relaxed);
    for (;;) {
        uint64_t owned = atomic_load_explicit(&sim->owner_ns, memory_order_relaxed);
        if (owned > UINT64_MAX - shared || owned + shared >= t_ns) return;
        if (atomic_compare_exchange_weak_explicit(&sim->now_ns, &shared, t_ns - owned, memory_order_relaxed,
                                                  memory_order_relaxed))
            return;
    }
}

/* The clock moves on by ns (saturating): the owner's counter if the caller
 * owns the clock (or is the first to step it), else the shared one. */
static inline void sim_clock_add(sim_device *sim, uint64_t ns) {
    _Static_assert(sizeof(pthread_t) <= sizeof(uintptr_t), "pthread_t fits a word");
    uintptr_t self = (uintptr_t)pthread_self(), owner = atomic_load_explicit(&sim->owner, memory_order_relaxed);
    if (owner == self ||
        (owner == 0 && atomic_compare_exchange_strong_explicit(&sim->owner, &owner, self, memory_order_relaxed,
                                                               memory_order_relaxed))) {
        uint64_t owned = atomic_load_explicit(&sim->owner_ns, memory_order_relaxed);
        atomic_store_explicit(&sim->owner_ns, ns > UINT64_MAX - owned ? UINT64_MAX : owned + ns,
                              memory_order_relaxed);
        return;
    }
    uint64_t shared = atomic_load_explicit(&sim->now_ns, memory_order_relaxed), next;
    do next = ns > UINT64_MAX - shared ? UINT64_MAX : shared + ns;
    while (!atomic_compare_exchange_weak_explicit(&sim->now_ns, &shared, next, memory_order_relaxed,
                                                  memory_order_relaxed));
}

/* The simulated device's operations. */
extern const tpi_device_ops tpi_sim_ops;

static inline bool sim_capturing(const sim_stream *st) { return st->capture.state != TP_SIM_CAPTURE_NONE; }

/* Model helpers (sim_device.c). "Locked": the caller holds sim->lock. */

/* Whether bytes more fit on the device (never a wrapping sum). */
bool sim_fits_capacity(const sim_device *sim, uint64_t bytes);
/* Whether every range ends at or below UINT64_MAX. */
bool sim_ranges_valid(const tp_range *ranges, size_t count);
/* Updates the physical-use counters and their peak. Locked. */
void sim_note_physical(sim_device *sim);
/* Drops kernels complete by the virtual clock. Locked. */
void sim_prune_kernels(sim_device *sim);
/* The slot of a stream in use, false for any other handle. Locked. */
bool sim_stream_index(sim_device *sim, tp_stream stream, uint32_t *out_index);
/* Work submitted to stream s: queued, recorded into its capture, or
 * refused once that capture is invalidated. Locked. */
tp_status sim_submit_work(sim_device *sim, uint32_t s, uint64_t duration_ns, const tp_range *ranges,
                          size_t range_count, uint32_t node_count, uint64_t token);
/* A graph template's ranges, copied from src (dst takes src's other fields). */
tp_status sim_copy_graph_shape(const tpi_host *host, sim_graph *dst, const sim_graph *src);
void sim_free_graph_shape(const tpi_host *host, sim_graph *g);
/* Frees a capture's record and leaves it NONE. Locked. */
void sim_capture_reset(sim_device *sim, sim_capture *c);
/* The capture's graph template, ranges sorted and merged. Locked. */
tp_status sim_capture_graph(sim_device *sim, sim_capture *c, sim_graph **out_graph);

#endif /* TIDEPOOL_SIM_INTERNAL_H */
