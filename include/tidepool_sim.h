/* SPDX-License-Identifier: MIT */
/*
 * tidepool_sim.h -- the simulated device's hooks: a virtual clock, kernels
 * of a given length that touch given ranges, fault injection, counters
 * (hazards among them), graph templates and stream capture. The simulated
 * device itself is
 * opened through tidepool.h ("sim", "sim:6GiB,novmm"); these calls drive it
 * from tests, tools and demos. On any other backend they return
 * TP_ERR_UNSUPPORTED.
 */
#ifndef TIDEPOOL_SIM_H
#define TIDEPOOL_SIM_H

#include "tidepool.h"

#ifdef __cplusplus
extern "C" {
#endif


/* Operation kinds for counters and fault injection. */
#define TP_SIM_OP_LIST(X)                                                         \
    X(TP_SIM_OP_VA_RESERVE, "va_reserve")                                         \
    X(TP_SIM_OP_VA_RELEASE, "va_release")                                         \
    X(TP_SIM_OP_MAP, "map")                                                       \
    X(TP_SIM_OP_UNMAP, "unmap")                                                   \
    X(TP_SIM_OP_MALLOC, "malloc")                                                 \
    X(TP_SIM_OP_FREE, "free")                                                     \
    X(TP_SIM_OP_EVENT, "event")                                                   \
    X(TP_SIM_OP_SYNC, "sync")                                                     \
    X(TP_SIM_OP_GRAPH_INSTANTIATE, "graph_instantiate")                           \
    X(TP_SIM_OP_GRAPH_UPDATE, "graph_update")                                     \
    X(TP_SIM_OP_GRAPH_LAUNCH, "graph_launch")                                     \
    X(TP_SIM_OP_ANY, "any")

typedef enum tp_sim_op {
#define TP_SIM_OP_ENUM_(name, label) name,
    TP_SIM_OP_LIST(TP_SIM_OP_ENUM_)
#undef TP_SIM_OP_ENUM_
    TP_SIM_OP_COUNT_
} tp_sim_op;

TP_API const char *tp_sim_op_name(tp_sim_op op);

typedef struct tp_sim_counters {
    uint64_t calls[TP_SIM_OP_COUNT_];  /* successful + failed calls per kind (ANY: all) */
    uint64_t faults_injected;
    uint64_t hazards;                  /* all hazards below together */
    uint64_t hazards_handout;          /* memory handed out while other-stream work still touches it */
    uint64_t hazards_unmap;            /* unmapped while queued work touches it */
    uint64_t hazards_free;             /* freed to the device while queued work touches it */
    uint64_t invalid_accesses;         /* work launched on unmapped / unallocated memory */
    uint64_t physical_used_bytes;      /* mapped + allocated + graph + occupied */
    uint64_t physical_peak_bytes;
    uint64_t graph_exec_bytes;         /* device memory held by graph executables */
    uint64_t graph_execs;
    uint64_t pending_kernels;          /* launched work not yet complete */
    uint64_t now_ns;                   /* virtual clock */
    uint64_t captures;                 /* stream captures begun */
    uint64_t captures_invalidated;     /* ... invalidated by an illegal call during them */
    uint64_t map_chunks;               /* physical allocations backing mapped memory, now */
    uint64_t map_chunks_made;          /* ... made since the device opened (the driver's cost is per chunk) */
} tp_sim_counters;

/* Simulated-device calls return TP_ERR_UNSUPPORTED on other backends. */

/* Queues a kernel of the given duration on stream; it touches ranges. It
 * starts when the stream's earlier work and waited-on events are done. */
TP_API tp_status tp_sim_launch(tp_device *device, tp_stream stream, uint64_t duration_ns,
                        const tp_range *ranges, size_t range_count);
/* Advances the virtual clock. Host-side calls take no virtual time. */
TP_API tp_status tp_sim_advance(tp_device *device, uint64_t ns);
TP_API tp_status tp_sim_now(tp_device *device, uint64_t *out_now_ns);
/* After `after_successes` further successful calls of kind op, the next
 * `fail_count` calls fail with `status` (0 = TP_ERR_DEVICE; map and malloc
 * usually want TP_ERR_OUT_OF_MEMORY). TP_SIM_OP_ANY counts every call. */
TP_API tp_status tp_sim_inject_fault(tp_device *device, tp_sim_op op, uint64_t after_successes,
                              uint64_t fail_count, tp_status status);
TP_API tp_status tp_sim_clear_faults(tp_device *device);
TP_API tp_status tp_sim_get_counters(tp_device *device, tp_sim_counters *out_counters);
/* Another tenant takes (bytes > 0) or gives back (bytes == 0: all) device
 * memory, for "only 100 MiB free" scenarios. */
TP_API tp_status tp_sim_occupy(tp_device *device, uint64_t bytes);

/* A simulated graph template: node_count kernels (an executable costs
 * node_count x graph_node_bytes of device memory), a topology identity
 * (executables update in place only to a template of the same topology),
 * the run time of one launch and the ranges its kernels touch. */
typedef struct tp_sim_graph_desc {
    uint32_t node_count;
    uint64_t topology_id;
    uint64_t duration_ns;
    const tp_range *ranges;
    size_t range_count;
} tp_sim_graph_desc;

TP_API tp_status tp_sim_graph_create(tp_device *device, const tp_sim_graph_desc *desc, tp_graph *out_graph);
TP_API tp_status tp_sim_graph_destroy(tp_device *device, tp_graph graph);

/* Stream capture, as cuStreamBeginCapture in relaxed mode models it.
 *
 * While a stream captures, kernels launched on it (tp_sim_launch) and graph
 * executables launched on it are recorded, not run: they take no virtual
 * time, do not move the stream's tail and are not queued work for the hazard
 * checker. Recording an event on it and making it wait on an event
 * recorded in the same capture are legal (the wait is not replayed when
 * the graph runs). Illegal, as on CUDA, and they INVALIDATE the capture
 * and return TP_ERR_CAPTURE: synchronising the stream or the device,
 * querying or synchronising an event recorded on the stream during the
 * capture, another stream waiting on such an event (CUDA would pull that
 * stream into the capture; the simulator does not model joined streams),
 * and the capturing stream waiting on an event recorded outside the
 * capture (CUDA accepts that only with cudaEventWaitExternal, which
 * tidepool does not pass). Once invalidated, every op
 * on the stream returns TP_ERR_CAPTURE until tp_sim_capture_end.
 *
 * begin: TP_ERR_CAPTURE if the stream already captures or is the default
 * stream (which cannot capture). end: leaves capture mode in every case;
 * returns TP_ERR_CAPTURE (and no graph) if the stream was not capturing or
 * the capture was invalidated, else a graph template as tp_sim_graph_create
 * makes (free it with tp_sim_graph_destroy): one node per recorded kernel
 * (an executable's nodes for a recorded graph), the sum of their durations,
 * the union of the ranges they touch (sorted, overlaps merged) and a
 * topology identity that depends only on the sequence of nodes, so two
 * captures of the same kernel sequence update each other's executables.
 * The graph runs, and the hazard checker sees its ranges, when an
 * executable of it is launched. Destroying a capturing stream invalidates
 * its capture. */
typedef enum tp_sim_capture_state {
    TP_SIM_CAPTURE_NONE = 0,        /* not capturing */
    TP_SIM_CAPTURE_ACTIVE = 1,      /* capturing */
    TP_SIM_CAPTURE_INVALIDATED = 2  /* capturing, but the capture failed: end it */
} tp_sim_capture_state;

TP_API tp_status tp_sim_capture_begin(tp_device *device, tp_stream stream);
TP_API tp_status tp_sim_capture_end(tp_device *device, tp_stream stream, tp_graph *out_graph);
TP_API tp_status tp_sim_capture_status(tp_device *device, tp_stream stream, tp_sim_capture_state *out_state);

#ifdef __cplusplus
}
#endif

#endif /* TIDEPOOL_SIM_H */
