/* SPDX-License-Identifier: MIT */
/*
 * sim_device.c -- the simulated device: the default backend everywhere. This
 * file is its model (resident map, kernels and the hazard checker, capture
 * recording) and the device table the pools call through; sim_hooks.c holds
 * the calls tidepool_sim.h declares, sim_internal.h the types both share.
 *
 * Memory: addresses are fake 64-bit numbers; what is mapped or allocated is a
 * sorted array of resident ranges, so host memory grows with the number of
 * mappings, never with the device's size. Mallocs live in [2^44, 2^60),
 * reservations in [2^60, 2^64). Physical use (maps + mallocs + graph
 * executables + memory another tenant occupies) never exceeds the capacity:
 * a call that would exceed it fails with TP_ERR_OUT_OF_MEMORY, as does one
 * that runs out of address space.
 *
 * Time: a virtual clock that only tp_sim_advance and host waits move. A
 * kernel launched on a stream starts when the stream's earlier work and the
 * events it waits on are done (start = max(now, stream tail, wait floor)) and
 * completes at start + duration. An event takes max(tail, wait floor) of its
 * stream, so the wait floor is transitive. A stream synchronize moves the
 * clock to max(tail, wait floor); a device synchronize to the end of every
 * pending kernel, destroyed streams' included.
 *
 * Arithmetic never wraps: a range with address + bytes past 2^64-1 is
 * refused (TP_ERR_INVALID_ARGUMENT) by every call that takes one, as is a
 * kernel whose end would pass 2^64-1 ns; capacity checks compare against
 * what is left, never a sum.
 *
 * Ordering: each stream carries a vector clock: vc[s] is the number of
 * kernels of stream s that work queued next on this stream is ordered after
 * (its own count for itself; others through stream-wait-event). The hazard
 * checker flags
 *   - handing out memory on stream T that an incomplete kernel K touches,
 *     unless K ran on T or T.vc[K.stream] >= K.seq;
 *   - unmapping or freeing memory that any incomplete kernel touches;
 *   - launching work on memory that is not mapped or allocated.
 * Each is counted and reported through the log callback.
 *
 * Capture (CUDA's relaxed stream capture): a capturing stream records the
 * kernels and graphs launched on it -- their ranges, summed duration, node
 * count and a hash of the node sequence (the topology) -- instead of
 * queuing them; its tail, seq and vector clock do not move and the hazard
 * checker never sees the record. tp_sim_capture_end turns the record into a
 * graph template (ranges merged), which is checked when an executable of it
 * is launched. An event recorded on a capturing stream is marked with the
 * capture's id and keeps its last real record. Synchronising the stream or
 * the device, querying or synchronising a marked event of an open capture,
 * another stream waiting on one, or the capturing stream waiting on an
 * event recorded outside the capture (CUDA allows that only with the
 * external-event flag), invalidates the capture (counted,
 * logged) and fails with TP_ERR_CAPTURE; every later op on that stream
 * fails the same way until tp_sim_capture_end, which always leaves capture
 * mode.
 *
 * Faults: per operation kind, after N further successes the next M calls
 * fail with a chosen status; TP_SIM_OP_ANY counts every call.
 *
 * Invariants: resident ranges are sorted and disjoint; every map lies inside
 * a reservation; physical_used_bytes equals the sum of what is held and is
 * at most the capacity; no stored range or kernel end wraps past 2^64; only
 * streams in use capture. One mutex guards the whole device; no call blocks
 * on the host. Two exceptions skip it while no kernel is pending (the count
 * mirrored in kernels_pending): tp_sim_advance moves the clock, and a
 * hand-out check finds nothing to conflict with. The clock only rises
 * (two counters that only rise: sim_internal.h), so a step taken beside a
 * locked call is as if taken just before or after it.
 */
#include "sim_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SIM_VA_BASE (1ull << 60)
#define SIM_MALLOC_BASE (1ull << 44)

static uint64_t physical_used(const sim_device *sim) {
    uint64_t graph = sim->graph_pool ? sim->graph_pool_bytes : sim->graph_bytes;
    return sim->mapped_bytes + sim->allocated_bytes + graph + sim->occupied_bytes;
}

/* Whether bytes more fit on the device (never a wrapping sum). */
bool sim_fits_capacity(const sim_device *sim, uint64_t bytes) {
    uint64_t used = physical_used(sim);
    return used <= sim->capacity_bytes && bytes <= sim->capacity_bytes - used;
}

/* Whether [address, address + bytes) is representable: it ends at or below
 * UINT64_MAX, so no sum of its bounds wraps. Every range the simulator
 * takes is checked with this before it is stored or compared. */
static bool range_valid(uint64_t address, uint64_t bytes) { return bytes <= UINT64_MAX - address; }

bool sim_ranges_valid(const tp_range *ranges, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (!range_valid(ranges[i].address, ranges[i].bytes)) return false;
    return true;
}

void sim_note_physical(sim_device *sim) {
    sim->counters.physical_used_bytes = physical_used(sim);
    if (sim->counters.physical_used_bytes > sim->counters.physical_peak_bytes)
        sim->counters.physical_peak_bytes = sim->counters.physical_used_bytes;
}

/* Counts a call of kind op and decides whether an injected fault fails it. */
static tp_status sim_enter(sim_device *sim, tp_sim_op op) {
    sim->counters.calls[op]++;
    sim->counters.calls[TP_SIM_OP_ANY]++;
    tp_sim_op kinds[2] = {op, TP_SIM_OP_ANY};
    tp_status result = TP_OK;
    for (int i = 0; i < 2; i++) {
        sim_fault *f = &sim->faults[kinds[i]];
        if (!f->armed) continue;
        if (f->skip > 0) {
            f->skip--;
        } else if (f->fail > 0) {
            f->fail--;
            if (f->fail == 0) f->armed = false;
            if (result == TP_OK) result = f->status;
        }
    }
    if (result != TP_OK) sim->counters.faults_injected++;
    return result;
}

/* ----------------------------------------------------------- resident map */

/* Index of the first resident range whose end is above address. */
static size_t resident_lower_bound(const sim_device *sim, uint64_t address) {
    size_t lo = 0, hi = sim->resident_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (sim->resident[mid].start + sim->resident[mid].bytes <= address)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static bool resident_overlaps(const sim_device *sim, uint64_t start, uint64_t bytes) {
    size_t i = resident_lower_bound(sim, start);
    return i < sim->resident_count && sim->resident[i].start < start + bytes;
}

/* True when [start, start+bytes) is wholly covered by resident ranges. */
static bool resident_covers(const sim_device *sim, uint64_t start, uint64_t bytes) {
    uint64_t cursor = start, end = start + bytes;
    size_t i = resident_lower_bound(sim, start);
    while (cursor < end) {
        if (i >= sim->resident_count || sim->resident[i].start > cursor) return false;
        cursor = sim->resident[i].start + sim->resident[i].bytes;
        i++;
    }
    return true;
}

/* Inserts count entries: entry, then copies advanced by stride bytes. */
static tp_status resident_insert_run(sim_device *sim, sim_resident entry, size_t count, uint64_t stride) {
    if (!tpi_host_grow(&sim->device->host, (void **)&sim->resident, sizeof *sim->resident,
                      &sim->resident_capacity, sim->resident_count + count))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    size_t i = resident_lower_bound(sim, entry.start);
    memmove(&sim->resident[i + count], &sim->resident[i], (sim->resident_count - i) * sizeof *sim->resident);
    for (size_t k = 0; k < count; k++) {
        sim->resident[i + k] = entry;
        sim->resident[i + k].start = entry.start + k * stride;
    }
    sim->resident_count += count;
    return TP_OK;
}

static tp_status resident_insert(sim_device *sim, sim_resident entry) { return resident_insert_run(sim, entry, 1, 0); }

/* [va, va + bytes) as mapped chunks of chunk bytes from va, the last one
 * shorter if bytes is not a multiple of chunk. */
static tp_status resident_insert_chunks(sim_device *sim, uint64_t va, uint64_t bytes, uint64_t chunk) {
    size_t count = (size_t)(bytes / chunk + (bytes % chunk != 0));
    tp_status st = resident_insert_run(sim, (sim_resident){va, chunk, RESIDENT_MAP}, count, chunk);
    if (st == TP_OK && bytes % chunk) {
        size_t last = resident_lower_bound(sim, va) + count - 1;
        sim->resident[last].bytes = bytes % chunk;
    }
    return st;
}

/* Finds the resident range starting exactly at start with that kind. */
static bool resident_find_exact(const sim_device *sim, uint64_t start, int kind, size_t *out_index) {
    size_t i = resident_lower_bound(sim, start);
    if (i < sim->resident_count && sim->resident[i].start == start && sim->resident[i].kind == kind) {
        *out_index = i;
        return true;
    }
    return false;
}

static void resident_remove_run(sim_device *sim, size_t i, size_t count) {
    memmove(&sim->resident[i], &sim->resident[i + count],
            (sim->resident_count - i - count) * sizeof *sim->resident);
    sim->resident_count -= count;
}

/* ---------------------------------------------------------------- kernels */

/* kernel_count changed: its two copies follow (the lock-free readers' and
 * the counters'). */
static void kernels_counted(sim_device *sim) {
    atomic_store_explicit(&sim->kernels_pending, sim->kernel_count, memory_order_relaxed);
    sim->counters.pending_kernels = sim->kernel_count;
}

void sim_prune_kernels(sim_device *sim) {
    size_t kept = 0;
    for (size_t i = 0; i < sim->kernel_count; i++) {
        sim_kernel *k = &sim->kernels[i];
        if (k->end_ns <= sim_clock_now(sim)) {
            tpi_host_free(&sim->device->host, k->ranges, k->range_count * sizeof *k->ranges);
        } else {
            sim->kernels[kept++] = *k;
        }
    }
    sim->kernel_count = kept;
    kernels_counted(sim);
}

static bool ranges_overlap(uint64_t a, uint64_t a_bytes, uint64_t b, uint64_t b_bytes) {
    return a < b + b_bytes && b < a + a_bytes;
}

/* Counts incomplete kernels touching [address, +bytes) that are not ordered
 * before future work on `stream` (stream < 0: ordered before nothing). */
static uint64_t count_conflicts(sim_device *sim, uint64_t address, uint64_t bytes, int stream,
                                const char *what) {
    sim_prune_kernels(sim);
    uint64_t found = 0;
    for (size_t i = 0; i < sim->kernel_count; i++) {
        const sim_kernel *k = &sim->kernels[i];
        if (stream >= 0 && ((int)k->stream == stream || sim->streams[stream].vc[k->stream] >= k->seq)) continue;
        for (size_t r = 0; r < k->range_count; r++) {
            if (!ranges_overlap(address, bytes, k->ranges[r].address, k->ranges[r].bytes)) continue;
            found++;
            tpi_logf(&sim->device->logger, TP_LOG_WARN,
                    "sim hazard: %s of [0x%llx, +%llu) while kernel #%llu on stream %u (ends at %llu ns, now %llu ns) "
                    "still touches [0x%llx, +%llu)",
                    what, (unsigned long long)address, (unsigned long long)bytes, (unsigned long long)k->seq,
                    k->stream, (unsigned long long)k->end_ns, (unsigned long long)sim_clock_now(sim),
                    (unsigned long long)k->ranges[r].address, (unsigned long long)k->ranges[r].bytes);
            break;
        }
    }
    return found;
}

/* When everything queued on the stream so far is complete: its own work
 * and the work of the events it waited on (transitively: an event captures
 * its stream's wait floor too). */
static uint64_t stream_done_ns(const sim_stream *st) { return TPI_MAX(st->tail_ns, st->wait_floor_ns); }

bool sim_stream_index(sim_device *sim, tp_stream stream, uint32_t *out_index) {
    uintptr_t index = (uintptr_t)stream;
    if (index >= SIM_MAX_STREAMS || !sim->streams[index].in_use) return false;
    *out_index = (uint32_t)index;
    return true;
}

/* Queues work touching ranges on stream s; the caller holds the lock. */
static tp_status queue_work(sim_device *sim, uint32_t s, uint64_t duration_ns, const tp_range *ranges,
                            size_t range_count) {
    sim_stream *st = &sim->streams[s];
    uint64_t start = TPI_MAX(sim_clock_now(sim), stream_done_ns(st));
    /* Refused, not wrapped: an end past the clock's range, or a range past
     * the address space's end, would slip past every later check. */
    if (duration_ns > UINT64_MAX - start || !sim_ranges_valid(ranges, range_count)) return TP_ERR_INVALID_ARGUMENT;
    for (size_t r = 0; r < range_count; r++) {
        if (ranges[r].bytes && !resident_covers(sim, ranges[r].address, ranges[r].bytes)) {
            sim->counters.invalid_accesses++;
            tpi_logf(&sim->device->logger, TP_LOG_WARN,
                    "sim invalid access: work on stream %u touches [0x%llx, +%llu), which is not mapped or allocated",
                    s, (unsigned long long)ranges[r].address, (unsigned long long)ranges[r].bytes);
        }
    }
    if (!tpi_host_grow(&sim->device->host, (void **)&sim->kernels, sizeof *sim->kernels, &sim->kernel_capacity,
                      sim->kernel_count + 1))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    tp_range *copy = NULL;
    if (range_count) {
        copy = tpi_host_alloc(&sim->device->host, range_count * sizeof *copy);
        if (!copy) return TP_ERR_HOST_OUT_OF_MEMORY;
        memcpy(copy, ranges, range_count * sizeof *copy);
    }
    st->tail_ns = start + duration_ns;
    st->seq++;
    st->vc[s] = st->seq;
    sim->kernels[sim->kernel_count++] =
        (sim_kernel){.end_ns = st->tail_ns, .stream = s, .seq = st->seq, .range_count = range_count, .ranges = copy};
    kernels_counted(sim);
    return TP_OK;
}

/* ----------------------------------------------------------- graph shapes */

void sim_free_graph_shape(const tpi_host *host, sim_graph *g) {
    tpi_host_free(host, g->ranges, g->range_count * sizeof *g->ranges);
    g->ranges = NULL;
    g->range_count = 0;
}

tp_status sim_copy_graph_shape(const tpi_host *host, sim_graph *dst, const sim_graph *src) {
    tp_range *ranges = NULL;
    if (src->range_count) {
        ranges = tpi_host_alloc(host, src->range_count * sizeof *ranges);
        if (!ranges) return TP_ERR_HOST_OUT_OF_MEMORY;
        memcpy(ranges, src->ranges, src->range_count * sizeof *ranges);
    }
    *dst = *src;
    dst->ranges = ranges;
    return TP_OK;
}

/* ---------------------------------------------------------------- capture */

void sim_capture_reset(sim_device *sim, sim_capture *c) {
    tpi_host_free(&sim->device->host, c->ranges, c->range_capacity * sizeof *c->ranges);
    memset(c, 0, sizeof *c);
}

/* Invalidates the capture on stream s (if still active) because of `why`. */
static void capture_invalidate(sim_device *sim, uint32_t s, const char *why) {
    sim_capture *c = &sim->streams[s].capture;
    if (c->state != TP_SIM_CAPTURE_ACTIVE) return;
    c->state = TP_SIM_CAPTURE_INVALIDATED;
    sim->counters.captures_invalidated++;
    tpi_logf(&sim->device->logger, TP_LOG_WARN, "sim capture: %s during the capture on stream %u invalidates it",
            why, s);
}

/* The stream whose capture (still open) recorded the event last, or -1. */
static int event_capture(const sim_device *sim, const sim_event *e) {
    if (!e->capture_id) return -1;
    const sim_stream *st = &sim->streams[e->capture_stream];
    return st->in_use && sim_capturing(st) && st->capture.id == e->capture_id ? (int)e->capture_stream : -1;
}

/* Records a node (node_count kernels of the given topology token) into the
 * active capture on s instead of running it. */
static tp_status capture_record(sim_device *sim, uint32_t s, uint64_t duration_ns, const tp_range *ranges,
                                size_t range_count, uint32_t node_count, uint64_t token) {
    sim_capture *c = &sim->streams[s].capture;
    if (!sim_ranges_valid(ranges, range_count) || duration_ns > UINT64_MAX - c->duration_ns ||
        node_count > UINT32_MAX - c->node_count)
        return TP_ERR_INVALID_ARGUMENT;
    if (range_count && !tpi_host_grow(&sim->device->host, (void **)&c->ranges, sizeof *c->ranges,
                                      &c->range_capacity, c->range_count + range_count))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    for (size_t r = 0; r < range_count; r++)
        if (ranges[r].bytes) c->ranges[c->range_count++] = ranges[r];
    c->duration_ns += duration_ns;
    c->node_count += node_count;
    for (int b = 0; b < 64; b += 8) c->topology = (c->topology ^ ((token >> b) & 0xff)) * SIM_FNV_PRIME;
    return TP_OK;
}

/* Work submitted to stream s: queued, recorded into its capture, or
 * refused once that capture is invalidated. Caller holds the lock. */
tp_status sim_submit_work(sim_device *sim, uint32_t s, uint64_t duration_ns, const tp_range *ranges,
                          size_t range_count, uint32_t node_count, uint64_t token) {
    switch (sim->streams[s].capture.state) {
    case TP_SIM_CAPTURE_ACTIVE: return capture_record(sim, s, duration_ns, ranges, range_count, node_count, token);
    case TP_SIM_CAPTURE_INVALIDATED: return TP_ERR_CAPTURE;
    default: return queue_work(sim, s, duration_ns, ranges, range_count);
    }
}

static int compare_ranges(const void *a, const void *b) {
    const tp_range *x = a, *y = b;
    return x->address < y->address ? -1 : x->address > y->address;
}

/* The capture's graph: its ranges sorted with overlapping or adjacent ones
 * merged. Caller holds the lock. */
tp_status sim_capture_graph(sim_device *sim, sim_capture *c, sim_graph **out_graph) {
    const tpi_host *host = &sim->device->host;
    size_t n = 0;
    if (c->range_count) {
        qsort(c->ranges, c->range_count, sizeof *c->ranges, compare_ranges);
        for (size_t i = 1; i < c->range_count; i++) {
            tp_range *last = &c->ranges[n], next = c->ranges[i];
            uint64_t end = last->address + last->bytes; /* no wrap: checked when recorded */
            if (next.address <= end)
                last->bytes = TPI_MAX(end, next.address + next.bytes) - last->address;
            else
                c->ranges[++n] = next;
        }
        n++;
    }
    sim_graph *g = tpi_host_calloc(host, 1, sizeof *g);
    if (!g) return TP_ERR_HOST_OUT_OF_MEMORY;
    sim_graph shape = {c->node_count, c->topology, c->duration_ns, n, c->ranges};
    if (sim_copy_graph_shape(host, g, &shape) != TP_OK) {
        tpi_host_free(host, g, sizeof *g);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    *out_graph = g;
    return TP_OK;
}


/* ------------------------------------------------------------------- ops */

static void sim_close(tp_device *device) {
    sim_device *sim = sim_of(device);
    const tpi_host *host = &device->host;
    for (size_t i = 0; i < sim->kernel_count; i++)
        tpi_host_free(host, sim->kernels[i].ranges, sim->kernels[i].range_count * sizeof(tp_range));
    tpi_host_free(host, sim->kernels, sim->kernel_capacity * sizeof *sim->kernels);
    tpi_host_free(host, sim->resident, sim->resident_capacity * sizeof *sim->resident);
    tpi_host_free(host, sim->reservations, sim->reservation_capacity * sizeof *sim->reservations);
    for (int i = 0; i < SIM_MAX_STREAMS; i++) sim_capture_reset(sim, &sim->streams[i].capture);
    pthread_mutex_destroy(&sim->lock);
    tpi_host_free(host, sim, sizeof *sim);
}

static tp_status sim_mem_info(tp_device *device, uint64_t *out_free, uint64_t *out_total) {
    sim_device *sim = sim_of(device);
    SIM_LOCKED(sim, {
        *out_total = sim->capacity_bytes;
        *out_free = sim->capacity_bytes - physical_used(sim);
    });
    return TP_OK;
}

static tp_status sim_va_reserve(tp_device *device, uint64_t bytes, uint64_t alignment, uint64_t *out_va) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_VA_RESERVE);
        if (st == TP_OK && (!sim->vmm || bytes == 0 || bytes % sim->granularity_bytes ||
                            (alignment && !tpi_is_pow2(alignment))))
            st = TP_ERR_INVALID_ARGUMENT;
        uint64_t align = TPI_MAX(alignment, sim->granularity_bytes);
        /* The reservation and its guard gap must end inside the address
         * space (the last VA region runs to 2^64): else it is exhausted. */
        uint64_t va = sim->next_va > UINT64_MAX - (align - 1) ? 0 : tpi_align_up(sim->next_va, align);
        if (st == TP_OK && (va == 0 || bytes > UINT64_MAX - va || bytes + va > UINT64_MAX - sim->granularity_bytes))
            st = TP_ERR_OUT_OF_MEMORY;
        if (st == TP_OK && !tpi_host_grow(&device->host, (void **)&sim->reservations, sizeof *sim->reservations,
                                         &sim->reservation_capacity, sim->reservation_count + 1))
            st = TP_ERR_HOST_OUT_OF_MEMORY;
        if (st == TP_OK) {
            sim->next_va = va + bytes + sim->granularity_bytes; /* a guard gap between reservations */
            sim->reservations[sim->reservation_count++] = (sim_reservation){va, bytes};
            *out_va = va;
        }
    });
    return st;
}

static tp_status sim_va_release(tp_device *device, uint64_t va, uint64_t bytes) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_VA_RELEASE);
        if (st == TP_OK) {
            st = TP_ERR_INVALID_ARGUMENT;
            for (size_t i = 0; i < sim->reservation_count; i++) {
                if (sim->reservations[i].va != va || sim->reservations[i].bytes != bytes) continue;
                if (resident_overlaps(sim, va, bytes)) break; /* still mapped inside: refuse like the driver */
                sim->reservations[i] = sim->reservations[--sim->reservation_count];
                st = TP_OK;
                break;
            }
        }
    });
    return st;
}

static bool inside_reservation(const sim_device *sim, uint64_t va, uint64_t bytes) {
    for (size_t i = 0; i < sim->reservation_count; i++) {
        const sim_reservation *r = &sim->reservations[i];
        if (va >= r->va && va + bytes <= r->va + r->bytes) return true;
    }
    return false;
}

/* Removes count resident entries at index i holding [address, +bytes):
 * queued work still touching them is a hazard of the given kind. */
static void give_back(sim_device *sim, size_t i, size_t count, uint64_t address, uint64_t bytes,
                      uint64_t *held_bytes, uint64_t *hazard_counter, const char *what) {
    if (sim->check) {
        uint64_t n = count_conflicts(sim, address, bytes, -1, what);
        *hazard_counter += n;
        sim->counters.hazards += n;
    }
    resident_remove_run(sim, i, count);
    *held_bytes -= bytes;
    sim_note_physical(sim);
}

/* Each chunk of a mapping is its own resident entry (its own physical
 * allocation, as with the driver), so any run of whole chunks can be
 * unmapped, and none that cuts one. */
static tp_status sim_map(tp_device *device, uint64_t va, uint64_t bytes, uint64_t chunk_bytes) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_MAP);
        uint64_t chunk = chunk_bytes ? chunk_bytes : sim->granularity_bytes;
        if (st == TP_OK && (bytes == 0 || !range_valid(va, bytes) || va % sim->granularity_bytes ||
                            bytes % sim->granularity_bytes || chunk % sim->granularity_bytes ||
                            !inside_reservation(sim, va, bytes) || resident_overlaps(sim, va, bytes)))
            st = TP_ERR_INVALID_ARGUMENT;
        if (st == TP_OK && !sim_fits_capacity(sim, bytes)) st = TP_ERR_OUT_OF_MEMORY;
        if (st == TP_OK) st = resident_insert_chunks(sim, va, bytes, chunk);
        if (st == TP_OK) {
            sim->mapped_bytes += bytes;
            sim->counters.map_chunks_made += bytes / chunk + (bytes % chunk != 0);
            sim_note_physical(sim);
        }
    });
    return st;
}

static tp_status sim_unmap(tp_device *device, uint64_t va, uint64_t bytes) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_UNMAP);
        size_t i = 0, chunks = 0;
        if (st == TP_OK && (bytes == 0 || !range_valid(va, bytes) || va % sim->granularity_bytes ||
                            bytes % sim->granularity_bytes || !resident_find_exact(sim, va, RESIDENT_MAP, &i)))
            st = TP_ERR_INVALID_ARGUMENT;
        /* Whole chunks, end to end, ending exactly at va + bytes. */
        for (uint64_t at = va; st == TP_OK && at < va + bytes; chunks++) {
            const sim_resident *r = i + chunks < sim->resident_count ? &sim->resident[i + chunks] : NULL;
            if (!r || r->kind != RESIDENT_MAP || r->start != at || r->bytes > va + bytes - at)
                st = TP_ERR_INVALID_ARGUMENT;
            else
                at += r->bytes;
        }
        if (st == TP_OK) {
            give_back(sim, i, chunks, va, bytes, &sim->mapped_bytes, &sim->counters.hazards_unmap, "unmap");
        }
    });
    return st;
}

static tp_status sim_mem_alloc(tp_device *device, uint64_t bytes, uint64_t *out_address) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_MALLOC);
        if (st == TP_OK && bytes == 0) st = TP_ERR_INVALID_ARGUMENT;
        if (st == TP_OK && !sim_fits_capacity(sim, bytes)) st = TP_ERR_OUT_OF_MEMORY;
        /* Allocations live below SIM_VA_BASE, with a 2 MiB gap after each:
         * a device larger than that address space runs out of it first. */
        uint64_t address = sim->next_malloc;
        if (st == TP_OK && (address > SIM_VA_BASE || bytes > SIM_VA_BASE - address ||
                            SIM_VA_BASE - address - bytes < 4 * TPI_MiB))
            st = TP_ERR_OUT_OF_MEMORY;
        if (st == TP_OK) {
            /* 512-byte aligned. By default never adjacent to the previous
             * allocation; with "adjacent" the next one starts where this
             * one ends (2 MiB aligned), as cudaMalloc's often do. */
            sim->next_malloc = tpi_align_up(address + bytes, 2 * TPI_MiB) + (sim->adjacent ? 0 : 2 * TPI_MiB);
            st = resident_insert(sim, (sim_resident){address, bytes, RESIDENT_ALLOC});
            if (st == TP_OK) {
                sim->allocated_bytes += bytes;
                sim_note_physical(sim);
                *out_address = address;
            }
        }
    });
    return st;
}

static tp_status sim_mem_free(tp_device *device, uint64_t address, uint64_t bytes) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_FREE);
        size_t i;
        if (st == TP_OK && (!range_valid(address, bytes) || !resident_find_exact(sim, address, RESIDENT_ALLOC, &i) ||
                            sim->resident[i].bytes != bytes))
            st = TP_ERR_INVALID_ARGUMENT;
        if (st == TP_OK) {
            give_back(sim, i, 1, address, bytes, &sim->allocated_bytes, &sim->counters.hazards_free, "device free");
        }
    });
    return st;
}

/* A free slot, preferring one none of whose kernels is still pending: a
 * reused slot's old kernels would count as the new stream's own work. */
static bool free_stream_slot(sim_device *sim, uint32_t *out_slot) {
    sim_prune_kernels(sim);
    uint64_t pending = 0;
    for (size_t i = 0; i < sim->kernel_count; i++) pending |= 1ull << sim->kernels[i].stream;
    bool found = false;
    for (uint32_t i = 1; i < SIM_MAX_STREAMS; i++) {
        if (sim->streams[i].in_use) continue;
        if (!found || !(pending & (1ull << i))) *out_slot = i;
        found = true;
        if (!(pending & (1ull << i))) break;
    }
    return found;
}

static tp_status sim_stream_create(tp_device *device, tp_stream *out_stream) {
    sim_device *sim = sim_of(device);
    tp_status st = TP_OK;
    SIM_LOCKED(sim, {
        uint32_t i = 0;
        if (free_stream_slot(sim, &i)) {
            sim_stream *s = &sim->streams[i];
            uint64_t seq = s->seq; /* keep counting so old kernels stay distinguishable */
            memset(s, 0, sizeof *s);
            s->in_use = true;
            s->seq = seq;
            s->vc[i] = seq;
            *out_stream = (tp_stream)(uintptr_t)i;
        } else {
            st = TP_ERR_BUSY;
        }
    });
    if (st == TP_ERR_BUSY)
        tpi_logf(&device->logger, TP_LOG_ERROR,
                "sim: stream_create refused: all %d simulated streams are in use (destroy one first)",
                SIM_MAX_STREAMS - 1);
    return st;
}

static tp_status sim_stream_destroy(tp_device *device, tp_stream stream) {
    sim_device *sim = sim_of(device);
    tp_status st = TP_ERR_INVALID_ARGUMENT;
    SIM_LOCKED(sim, {
        uint32_t s;
        if (sim_stream_index(sim, stream, &s) && s != 0) {
            capture_invalidate(sim, s, "destroying the stream");
            sim_capture_reset(sim, &sim->streams[s].capture);
            sim->streams[s].in_use = false;
            st = TP_OK;
        }
    });
    return st;
}

static tp_status sim_stream_synchronize(tp_device *device, tp_stream stream) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        uint32_t s;
        st = sim_enter(sim, TP_SIM_OP_SYNC);
        if (st == TP_OK && !sim_stream_index(sim, stream, &s)) st = TP_ERR_INVALID_ARGUMENT;
        if (st == TP_OK && sim_capturing(&sim->streams[s])) {
            capture_invalidate(sim, s, "synchronizing the stream");
            st = TP_ERR_CAPTURE;
        }
        /* Done when its own work and everything that work waited on is. */
        if (st == TP_OK) sim_clock_raise(sim, stream_done_ns(&sim->streams[s]));
    });
    return st;
}

static tp_status sim_stream_wait_event(tp_device *device, tp_stream stream, tp_event event) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        uint32_t s;
        st = sim_enter(sim, TP_SIM_OP_EVENT);
        if (st == TP_OK && !sim_stream_index(sim, stream, &s)) st = TP_ERR_INVALID_ARGUMENT;
        const sim_event *e = (const sim_event *)event;
        int from = st == TP_OK ? event_capture(sim, e) : -1;
        tp_sim_capture_state state = st == TP_OK ? sim->streams[s].capture.state : TP_SIM_CAPTURE_NONE;
        if (st == TP_OK && state == TP_SIM_CAPTURE_INVALIDATED) {
            st = TP_ERR_CAPTURE;
        } else if (st == TP_OK && from >= 0 && (uint32_t)from != s) {
            /* CUDA would pull this stream into that capture (a fork), or
             * merge two captures; neither is modelled: both fail. */
            capture_invalidate(sim, (uint32_t)from, "another stream waiting on an event recorded in it");
            capture_invalidate(sim, s, "waiting on an event of another capture");
            st = TP_ERR_CAPTURE;
        } else if (st == TP_OK && from < 0 && e->recorded && state == TP_SIM_CAPTURE_ACTIVE) {
            /* CUDA refuses a wait on an event recorded outside the capture
             * (without the external-event flag, which this interface does
             * not pass), and the error invalidates the capture. */
            capture_invalidate(sim, s, "waiting on an event recorded outside the capture");
            st = TP_ERR_CAPTURE;
        } else if (st == TP_OK && state == TP_SIM_CAPTURE_NONE) {
            if (e->recorded) {
                sim_stream *target = &sim->streams[s];
                target->wait_floor_ns = TPI_MAX(target->wait_floor_ns, e->time_ns);
                for (int i = 0; i < SIM_MAX_STREAMS; i++) target->vc[i] = TPI_MAX(target->vc[i], e->vc[i]);
            }
        }
    });
    return st;
}

static tp_status sim_event_create(tp_device *device, tp_event *out_event) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, { st = sim_enter(sim, TP_SIM_OP_EVENT); });
    if (st != TP_OK) return st;
    sim_event *e = tpi_host_calloc(&device->host, 1, sizeof *e);
    if (!e) return TP_ERR_HOST_OUT_OF_MEMORY;
    *out_event = (tp_event)e;
    return TP_OK;
}

static tp_status sim_event_destroy(tp_device *device, tp_event event) {
    tpi_host_free(&device->host, event, sizeof(sim_event));
    return TP_OK;
}

static tp_status sim_event_record(tp_device *device, tp_event event, tp_stream stream) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        uint32_t s;
        st = sim_enter(sim, TP_SIM_OP_EVENT);
        if (st == TP_OK && !sim_stream_index(sim, stream, &s)) st = TP_ERR_INVALID_ARGUMENT;
        sim_event *e = (sim_event *)event;
        const sim_stream *src = st == TP_OK ? &sim->streams[s] : NULL;
        if (src && src->capture.state == TP_SIM_CAPTURE_INVALIDATED) {
            st = TP_ERR_CAPTURE;
        } else if (src && sim_capturing(src)) {
            /* Marks a point in the capture; the last real record stays. */
            e->capture_stream = s;
            e->capture_id = src->capture.id;
        } else if (src) {
            e->capture_id = 0;
            e->recorded = true;
            e->time_ns = stream_done_ns(src);
            memcpy(e->vc, src->vc, sizeof e->vc);
        }
    });
    return st;
}

static tp_status sim_event_query(tp_device *device, tp_event event) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        const sim_event *e = (const sim_event *)event;
        st = sim_enter(sim, TP_SIM_OP_EVENT);
        int from = st == TP_OK ? event_capture(sim, e) : -1;
        if (from >= 0) {
            capture_invalidate(sim, (uint32_t)from, "querying an event recorded in it");
            st = TP_ERR_CAPTURE;
        }
        if (st == TP_OK) st = (!e->recorded || e->time_ns <= sim_clock_now(sim)) ? TP_OK : TP_NOT_READY;
    });
    return st;
}

static tp_status sim_event_synchronize(tp_device *device, tp_event event) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        const sim_event *e = (const sim_event *)event;
        st = sim_enter(sim, TP_SIM_OP_SYNC);
        int from = st == TP_OK ? event_capture(sim, e) : -1;
        if (from >= 0) {
            capture_invalidate(sim, (uint32_t)from, "synchronizing an event recorded in it");
            st = TP_ERR_CAPTURE;
        }
        if (st == TP_OK && e->recorded) sim_clock_raise(sim, e->time_ns);
    });
    return st;
}

static tp_status sim_device_synchronize(tp_device *device) {
    sim_device *sim = sim_of(device);
    tp_status st;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_SYNC);
        for (uint32_t i = 0; st != TP_ERR_CAPTURE && i < SIM_MAX_STREAMS; i++)
            if (st == TP_OK && sim->streams[i].in_use && sim_capturing(&sim->streams[i])) st = TP_ERR_CAPTURE;
        for (uint32_t i = 0; st == TP_ERR_CAPTURE && i < SIM_MAX_STREAMS; i++)
            if (sim->streams[i].in_use) capture_invalidate(sim, i, "synchronizing the device");
        if (st == TP_OK) {
            /* Every stream's work, and what destroyed streams left queued. */
            uint64_t done = sim_clock_now(sim);
            for (int i = 0; i < SIM_MAX_STREAMS; i++)
                if (sim->streams[i].in_use) done = TPI_MAX(done, stream_done_ns(&sim->streams[i]));
            for (size_t k = 0; k < sim->kernel_count; k++) done = TPI_MAX(done, sim->kernels[k].end_ns);
            sim_clock_raise(sim, done);
        }
    });
    return st;
}

static tp_status sim_stream_capturing(tp_device *device, tp_stream stream, bool *out_capturing) {
    sim_device *sim = sim_of(device);
    tp_status st = TP_OK;
    SIM_LOCKED(sim, {
        uint32_t s;
        if (sim_stream_index(sim, stream, &s))
            *out_capturing = sim_capturing(&sim->streams[s]); /* an invalidated capture too: hands off */
        else
            st = TP_ERR_INVALID_ARGUMENT;
    });
    return st;
}

static uint64_t sim_now_ns(tp_device *device) {
    return sim_clock_now(sim_of(device));
}

static uint64_t sim_check_handout(tp_device *device, uint64_t address, uint64_t bytes, tp_stream stream) {
    sim_device *sim = sim_of(device);
    uint64_t found = 0;
    /* No kernel pending: nothing to conflict with (one launched meanwhile
     * is ordered after this hand-out). */
    if (!sim->check || !atomic_load_explicit(&sim->kernels_pending, memory_order_relaxed)) return 0;
    SIM_LOCKED(sim, {
        uint32_t s;
        if (sim->kernel_count && sim_stream_index(sim, stream, &s)) {
            bytes = TPI_MIN(bytes, UINT64_MAX - address); /* no error to return: clamp, never wrap */
            char what[32];
            snprintf(what, sizeof what, "hand-out on stream %u", s);
            found = count_conflicts(sim, address, bytes, (int)s, what);
            sim->counters.hazards_handout += found;
            sim->counters.hazards += found;
        }
    });
    return found;
}

/* ----------------------------------------------------------------- graphs */

static tp_status sim_graph_instantiate(tp_device *device, tp_graph graph, tpi_graph_exec *out_exec,
                                       uint64_t *out_bytes) {
    sim_device *sim = sim_of(device);
    const sim_graph *g = (const sim_graph *)graph;
    sim_exec *exec = tpi_host_calloc(&device->host, 1, sizeof *exec);
    if (!exec) return TP_ERR_HOST_OUT_OF_MEMORY;
    tp_status st = sim_copy_graph_shape(&device->host, &exec->shape, g);
    if (st != TP_OK) {
        tpi_host_free(&device->host, exec, sizeof *exec);
        return st;
    }
    /* Saturating: a cost past 2^64 cannot fit, and must not wrap into one that does. */
    uint64_t node_bytes = 0;
    if (__builtin_mul_overflow((uint64_t)g->node_count, sim->graph_node_bytes, &node_bytes) ||
        __builtin_add_overflow(node_bytes, sim->graph_exec_bytes, &exec->bytes))
        exec->bytes = UINT64_MAX;
    SIM_LOCKED(sim, {
        st = sim_enter(sim, TP_SIM_OP_GRAPH_INSTANTIATE);
        /* With graphpool, only growth of the pool takes new memory. */
        uint64_t growth = exec->bytes;
        if (sim->graph_pool) {
            uint64_t room = sim->graph_pool_bytes - sim->graph_bytes;
            growth = exec->bytes > room ? exec->bytes - room : 0;
        }
        if (st == TP_OK && !sim_fits_capacity(sim, growth)) st = TP_ERR_OUT_OF_MEMORY;
        if (st == TP_OK) {
            sim->graph_bytes += exec->bytes;
            sim->graph_pool_bytes += growth;
            sim->counters.graph_exec_bytes = sim->graph_bytes;
            sim->counters.graph_execs++;
            sim_note_physical(sim);
        }
    });
    if (st != TP_OK) {
        sim_free_graph_shape(&device->host, &exec->shape);
        tpi_host_free(&device->host, exec, sizeof *exec);
        return st;
    }
    *out_exec = (tpi_graph_exec)exec;
    *out_bytes = sim->graph_pool ? 0 : exec->bytes;
    return TP_OK;
}

static tp_status sim_graph_update(tp_device *device, tpi_graph_exec exec_handle, tp_graph graph) {
    sim_device *sim = sim_of(device);
    sim_exec *exec = (sim_exec *)exec_handle;
    const sim_graph *g = (const sim_graph *)graph;
    tp_status st;
    SIM_LOCKED(sim, { st = sim_enter(sim, TP_SIM_OP_GRAPH_UPDATE); });
    if (st != TP_OK) return st;
    if (g->topology_id != exec->shape.topology_id || g->node_count != exec->shape.node_count)
        return TP_ERR_TOPOLOGY_MISMATCH;
    sim_graph updated;
    st = sim_copy_graph_shape(&device->host, &updated, g);
    if (st != TP_OK) return st;
    sim_free_graph_shape(&device->host, &exec->shape);
    exec->shape = updated;
    return TP_OK;
}

static tp_status sim_graph_launch(tp_device *device, tpi_graph_exec exec_handle, tp_stream stream) {
    sim_device *sim = sim_of(device);
    const sim_exec *exec = (const sim_exec *)exec_handle;
    tp_status st;
    SIM_LOCKED(sim, {
        uint32_t s;
        st = sim_enter(sim, TP_SIM_OP_GRAPH_LAUNCH);
        if (st == TP_OK && !sim_stream_index(sim, stream, &s)) st = TP_ERR_INVALID_ARGUMENT;
        if (st == TP_OK)
            st = sim_submit_work(sim, s, exec->shape.duration_ns, exec->shape.ranges, exec->shape.range_count,
                                 exec->shape.node_count, NODE_GRAPH ^ (exec->shape.topology_id * SIM_FNV_PRIME));
    });
    return st;
}

static tp_status sim_graph_destroy(tp_device *device, tpi_graph_exec exec_handle) {
    sim_device *sim = sim_of(device);
    sim_exec *exec = (sim_exec *)exec_handle;
    SIM_LOCKED(sim, {
        sim->graph_bytes -= exec->bytes;
        sim->counters.graph_exec_bytes = sim->graph_bytes;
        sim->counters.graph_execs--;
        sim_note_physical(sim);
    });
    sim_free_graph_shape(&device->host, &exec->shape);
    tpi_host_free(&device->host, exec, sizeof *exec);
    return TP_OK;
}

static uint64_t sim_graph_node_count(tp_device *device, tp_graph graph) {
    (void)device;
    return graph ? ((const sim_graph *)graph)->node_count : 0;
}

const tpi_device_ops tpi_sim_ops = {
    .backend = "sim",
    .close = sim_close,
    .mem_info = sim_mem_info,
    .va_reserve = sim_va_reserve,
    .va_release = sim_va_release,
    .map = sim_map,
    .unmap = sim_unmap,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_synchronize = sim_stream_synchronize,
    .stream_wait_event = sim_stream_wait_event,
    .event_create = sim_event_create,
    .event_destroy = sim_event_destroy,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_synchronize = sim_event_synchronize,
    .device_synchronize = sim_device_synchronize,
    .stream_capturing = sim_stream_capturing,
    .now_ns = sim_now_ns,
    .check_handout = sim_check_handout,
    .graph_instantiate = sim_graph_instantiate,
    .graph_update = sim_graph_update,
    .graph_launch = sim_graph_launch,
    .graph_destroy = sim_graph_destroy,
    .graph_node_count = sim_graph_node_count,
};

tp_status tpi_sim_device_create(tp_device *device, const tpi_device_options *options) {
    sim_device *sim = tpi_host_calloc(&device->host, 1, sizeof *sim);
    if (!sim) return TP_ERR_HOST_OUT_OF_MEMORY;
    if (pthread_mutex_init(&sim->lock, NULL) != 0) {
        tpi_host_free(&device->host, sim, sizeof *sim);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    sim->device = device;
    sim->capacity_bytes = options->capacity_bytes ? options->capacity_bytes : 16 * TPI_GiB;
    sim->granularity_bytes = options->granularity_bytes ? options->granularity_bytes : 2 * TPI_MiB;
    sim->graph_node_bytes = options->graph_node_bytes ? options->graph_node_bytes : 10 * TPI_KiB;
    sim->graph_exec_bytes = options->graph_exec_bytes;
    sim->vmm = !options->novmm;
    sim->check = !options->nocheck;
    sim->graph_pool = options->graphpool;
    sim->adjacent = options->adjacent;
    sim->streams[0].in_use = true; /* the default stream */
    sim->next_va = SIM_VA_BASE;
    sim->next_malloc = SIM_MALLOC_BASE;

    device->impl = sim;
    device->ops = &tpi_sim_ops;
    device->hazard_checker = sim->check;
    device->hazard_work = &sim->kernels_pending; /* (sim_check_handout's early return) */
    tp_device_info *info = &device->info;
    snprintf(info->name, sizeof info->name, "simulated device");
    snprintf(info->backend, sizeof info->backend, "sim");
    info->ordinal = 0;
    info->capacity_bytes = sim->capacity_bytes;
    info->granularity_bytes = sim->granularity_bytes;
    info->vmm_supported = sim->vmm;
    info->vmm_enabled = sim->vmm;
    return TP_OK;
}
