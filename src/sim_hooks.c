/* SPDX-License-Identifier: MIT */
/*
 * sim_hooks.c -- the simulated device's public calls (tidepool_sim.h): kernel
 * launches and the virtual clock, fault injection, counters, another
 * tenant's occupied memory, graph templates and stream capture. Each checks
 * that the device is simulated (else TP_ERR_UNSUPPORTED), validates its
 * arguments and does its work under the device lock through the model in
 * sim_device.c; the model and its invariants are described there.
 */
#include "sim_internal.h"

#include <string.h>

static const char *const sim_op_names[] = {
#define TP_SIM_OP_NAME_(name, label) label,
    TP_SIM_OP_LIST(TP_SIM_OP_NAME_)
#undef TP_SIM_OP_NAME_
};

const char *tp_sim_op_name(tp_sim_op op) {
    if ((unsigned)op >= (unsigned)TP_SIM_OP_COUNT_) return "unknown";
    return sim_op_names[op];
}

/* (By the backend's name: a test may wrap the table in a copy; the
 * pointer first, as a replay asks at every step.) */
static bool is_sim(tp_device *device) {
    return device && device->ops && (device->ops == &tpi_sim_ops || strcmp(device->ops->backend, "sim") == 0);
}

/* TP_OK for a simulated device; no device is an invalid argument, another
 * backend's device TP_ERR_UNSUPPORTED (checked before any other argument). */
static tp_status sim_device_check(tp_device *device) {
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    return is_sim(device) ? TP_OK : TP_ERR_UNSUPPORTED;
}

#define SIM_REQUIRE_DEVICE(device)                      \
    do {                                                \
        tp_status require_st_ = sim_device_check(device); \
        if (require_st_ != TP_OK) return require_st_;   \
    } while (0)

/* ------------------------------------------------------- public sim calls */

tp_status tp_sim_launch(tp_device *device, tp_stream stream, uint64_t duration_ns, const tp_range *ranges,
                        size_t range_count) {
    SIM_REQUIRE_DEVICE(device);
    if (range_count && !ranges) return TP_ERR_INVALID_ARGUMENT;
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        uint32_t s;
        st = sim_stream_index(sim, stream, &s)
                 ? sim_submit_work(sim, s, duration_ns, ranges, range_count, 1, NODE_KERNEL)
                 : TP_ERR_INVALID_ARGUMENT;
    });
    return st;
}

/* tp_sim_advance past its common case: the checks, and the step that
 * retires kernels under the lock (with none pending it retires nothing:
 * a device reached through a copy of the table, tests only). */
TPI_NOINLINE static tp_status sim_advance_checked(tp_device *device, uint64_t ns) {
    SIM_REQUIRE_DEVICE(device);
    if (ns == 0) return TP_OK; /* nothing moves (replays advance by 0 often) */
    sim_device *sim = sim_of(device);
    SIM_LOCKED(sim, {
        sim_clock_add(sim, ns);
        sim_prune_kernels(sim);
    });
    return TP_OK;
}

/* No kernel pending: nothing to retire, so the clock moves without the lock
 * (a replay steps it at nearly every event), and without a call that would
 * save registers. A kernel launched meanwhile is retired by the next call
 * that looks. */
tp_status tp_sim_advance(tp_device *device, uint64_t ns) {
    if (device && device->ops == &tpi_sim_ops && ns &&
        !atomic_load_explicit(&sim_of(device)->kernels_pending, memory_order_relaxed)) {
        sim_clock_add(sim_of(device), ns);
        return TP_OK;
    }
    return sim_advance_checked(device, ns);
}

tp_status tp_sim_now(tp_device *device, uint64_t *out_now_ns) {
    SIM_REQUIRE_DEVICE(device);
    if (!out_now_ns) return TP_ERR_INVALID_ARGUMENT;
    *out_now_ns = sim_clock_now(sim_of(device));
    return TP_OK;
}

tp_status tp_sim_inject_fault(tp_device *device, tp_sim_op op, uint64_t after_successes, uint64_t fail_count,
                              tp_status status) {
    SIM_REQUIRE_DEVICE(device);
    if ((unsigned)op >= (unsigned)TP_SIM_OP_COUNT_ || (unsigned)status >= (unsigned)TP_STATUS_COUNT_)
        return TP_ERR_INVALID_ARGUMENT;
    sim_device *sim = sim_of(device);
    SIM_LOCKED(sim, {
        sim->faults[op] = (sim_fault){.armed = fail_count > 0, .skip = after_successes, .fail = fail_count,
                                      .status = status == TP_OK ? TP_ERR_DEVICE : status};
    });
    return TP_OK;
}

tp_status tp_sim_clear_faults(tp_device *device) {
    SIM_REQUIRE_DEVICE(device);
    sim_device *sim = sim_of(device);
    SIM_LOCKED(sim, { memset(sim->faults, 0, sizeof sim->faults); });
    return TP_OK;
}

tp_status tp_sim_get_counters(tp_device *device, tp_sim_counters *out_counters) {
    SIM_REQUIRE_DEVICE(device);
    if (!out_counters) return TP_ERR_INVALID_ARGUMENT;
    sim_device *sim = sim_of(device);
    SIM_LOCKED(sim, {
        sim_prune_kernels(sim);
        sim->counters.now_ns = sim_clock_now(sim);
        sim->counters.map_chunks = 0;
        for (size_t i = 0; i < sim->resident_count; i++) sim->counters.map_chunks += sim->resident[i].kind == RESIDENT_MAP;
        *out_counters = sim->counters;
    });
    return TP_OK;
}

tp_status tp_sim_occupy(tp_device *device, uint64_t bytes) {
    SIM_REQUIRE_DEVICE(device);
    sim_device *sim = sim_of(device);
    tp_status st = TP_OK;
    SIM_LOCKED(sim, {
        if (bytes == 0) {
            sim->occupied_bytes = 0;
        } else if (!sim_fits_capacity(sim, bytes)) {
            st = TP_ERR_OUT_OF_MEMORY;
        } else {
            sim->occupied_bytes += bytes;
        }
        sim_note_physical(sim);
    });
    return st;
}

tp_status tp_sim_graph_create(tp_device *device, const tp_sim_graph_desc *desc, tp_graph *out_graph) {
    SIM_REQUIRE_DEVICE(device);
    if (!desc || !out_graph || desc->node_count == 0 || (desc->range_count && !desc->ranges) ||
        !sim_ranges_valid(desc->ranges, desc->range_count))
        return TP_ERR_INVALID_ARGUMENT;
    sim_graph *g = tpi_host_calloc(&device->host, 1, sizeof *g);
    if (!g) return TP_ERR_HOST_OUT_OF_MEMORY;
    sim_graph shape = {desc->node_count, desc->topology_id, desc->duration_ns, desc->range_count,
                       (tp_range *)desc->ranges};
    tp_status st = sim_copy_graph_shape(&device->host, g, &shape);
    if (st != TP_OK) {
        tpi_host_free(&device->host, g, sizeof *g);
        return st;
    }
    *out_graph = (tp_graph)g;
    return TP_OK;
}

tp_status tp_sim_graph_destroy(tp_device *device, tp_graph graph) {
    SIM_REQUIRE_DEVICE(device);
    if (!graph) return TP_ERR_INVALID_ARGUMENT;
    sim_graph *g = (sim_graph *)graph;
    sim_free_graph_shape(&device->host, g);
    tpi_host_free(&device->host, g, sizeof *g);
    return TP_OK;
}

tp_status tp_sim_capture_begin(tp_device *device, tp_stream stream) {
    SIM_REQUIRE_DEVICE(device);
    sim_device *sim = sim_of(device);
    tp_status st = TP_OK;
    SIM_LOCKED(sim, {
        uint32_t s;
        if (!sim_stream_index(sim, stream, &s)) {
            st = TP_ERR_INVALID_ARGUMENT;
        } else if (s == 0 || sim_capturing(&sim->streams[s])) {
            st = TP_ERR_CAPTURE; /* the legacy default stream cannot capture */
        } else {
            sim_capture *c = &sim->streams[s].capture;
            sim_capture_reset(sim, c);
            c->state = TP_SIM_CAPTURE_ACTIVE;
            c->id = ++sim->last_capture_id;
            c->topology = SIM_FNV_BASIS;
            sim->counters.captures++;
        }
    });
    return st;
}

tp_status tp_sim_capture_end(tp_device *device, tp_stream stream, tp_graph *out_graph) {
    SIM_REQUIRE_DEVICE(device);
    if (!out_graph) return TP_ERR_INVALID_ARGUMENT;
    *out_graph = NULL;
    sim_device *sim = sim_of(device);
    tp_status st = TP_OK;
    sim_graph *g = NULL;
    SIM_LOCKED(sim, {
        uint32_t s;
        if (!sim_stream_index(sim, stream, &s)) {
            st = TP_ERR_INVALID_ARGUMENT;
        } else {
            sim_capture *c = &sim->streams[s].capture;
            if (c->state != TP_SIM_CAPTURE_ACTIVE)
                st = TP_ERR_CAPTURE; /* not capturing, or invalidated */
            else
                st = sim_capture_graph(sim, c, &g);
            sim_capture_reset(sim, c);
        }
    });
    if (st == TP_OK) *out_graph = (tp_graph)g;
    return st;
}

tp_status tp_sim_capture_status(tp_device *device, tp_stream stream, tp_sim_capture_state *out_state) {
    SIM_REQUIRE_DEVICE(device);
    if (!out_state) return TP_ERR_INVALID_ARGUMENT;
    sim_device *sim = sim_of(device);
    tp_status st = TP_OK;
    SIM_LOCKED(sim, {
        uint32_t s;
        if (sim_stream_index(sim, stream, &s))
            *out_state = sim->streams[s].capture.state;
        else
            st = TP_ERR_INVALID_ARGUMENT;
    });
    return st;
}
