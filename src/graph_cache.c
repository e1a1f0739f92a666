/* SPDX-License-Identifier: MIT */
/*
 * graph_cache.c -- a bounded cache of instantiated graph executables.
 *
 * Model
 *   An entry ("exec") is one instantiated executable: the caller's key, the
 *   template handle it was last made to match, the device bytes it costs,
 *   the time of its last prepare or launch (device clock: the simulator's
 *   virtual clock), one completion event recorded at each launch, and the
 *   pool ranges it pins. A key may own up to GC_MAX_VARIANTS executables of
 *   different topologies ("variants"): a key alternating between two
 *   topologies (failure mode 10 in docs/failure-modes.md) then costs two
 *   instantiations in total instead of one per alternation. The key's current variant, the one
 *   tp_graph_cache_launch runs, is the one prepared last. The key index, the
 *   project's hash map (tpi_map.h), maps a key to its newest variant; the
 *   key's older variants follow through vnext.
 *
 * prepare(key, graph, pins)
 *   1. The key's variants are tried with the device's in-place update,
 *      the one last prepared with this very handle first, then the others
 *      most recently prepared first. The first that accepts becomes current.
 *      If its handle equals the one it was last prepared with it counts as a
 *      hit, otherwise as an update. A hit still runs the in-place update (no
 *      instantiation): a caller that destroys a template and builds another
 *      may get the same handle back, and a stale executable would run kernels
 *      on freed memory. A caller with nothing to change calls launch alone.
 *   2. A variant whose update fails with a device error (anything but
 *      TP_ERR_TOPOLOGY_MISMATCH) is destroyed; mismatching ones are kept as
 *      variants. If no variant accepted (update_failures += 1 when at least
 *      one refused) a new executable is instantiated; if the key already
 *      has GC_MAX_VARIANTS, its least recently used one is evicted first.
 *   3. Instantiation evicts beforehand to leave room for one more executable
 *      and for an estimate of its bytes (the largest of the key's variants,
 *      of the last GC_RECENT instantiations and of the model below), and
 *      afterwards until the bounds hold. On out of memory it evicts one
 *      victim (executables with no launch in flight first; waiting for the
 *      launch otherwise) and retries, until none is left; then it has the
 *      attached pools give back their idle memory (tp_pool_trim) and
 *      retries once more; then TP_ERR_RUN_EAGER. An executable larger than max_bytes on its own is
 *      destroyed: TP_ERR_RUN_EAGER.
 *   Bytes of an executable: what the device reported; if it reported 0, the
 *   drop in the device's free memory across the instantiation (an
 *   allocation by another thread at that moment skews it); in either case
 *   no less than the model of exec_bytes_accounted (the highest cost per
 *   node of the last GC_COST_WINDOW measurements, times the node count;
 *   node_bytes_estimate per node before any), because a driver that reuses
 *   the memory of destroyed executables shows no drop for most of them;
 *   and never more than the device's memory (nor than a 64-bit sum of
 *   max_execs + 1 of them allows: 1 TiB at the highest count cap,
 *   GC_MAX_EXECS), so that a huge node_bytes_estimate neither wraps the
 *   model to a small cost nor the byte sums.
 *
 * Eviction order: segmented LRU
 *   Two recency lists, most recent at the head: probation and protected.
 *   New executables enter probation. One used again -- prepared again, or
 *   launched a second time since its last prepare -- moves to the head of
 *   protected; when protected holds more than protected_percent of
 *   max_execs, its least recent entry drops back to the head of probation.
 *   Victims come from the tail of probation, then from the tail of
 *   protected, so a burst of one-shot keys only churns probation.
 *   Idle eviction (tick, the background thread, and prepare once the
 *   earliest possible deadline has passed) destroys executables neither
 *   prepared nor launched for idle_evict_ns.
 *
 * Pins and completion
 *   Every launch records the executable's event on the launch stream. A
 *   launch on another stream than the previous one first makes the stream
 *   wait for that event while it is pending, so launches of one executable
 *   are serialised (as CUDA does) and one event covers them all. Evicting
 *   destroys the executable at once (CUDA frees an in-flight executable
 *   when it completes) but releases its pins (tp_pool_unpin) only once its
 *   last launch is known complete:
 *     - normal paths (count/byte bounds, idle, explicit evict, pins replaced
 *       on prepare): if the event is still pending the pins and the event
 *       go to a retired list, released by a later prepare or tick once the
 *       event has completed (no host wait on these paths);
 *     - pressure paths (out of memory on instantiate, a pool's reclaim
 *       callback) and destroy: the cache waits for the event, so the memory
 *       really is free when it returns.
 *   If an event could not be recorded, launch waits for its stream (a
 *   stream that does not capture: the next point); if even that fails,
 *   completion is unknown and eviction synchronises that stream before
 *   unpinning -- or, when such launches were on several streams or the
 *   stream captures by then, the device (which would invalidate a capture
 *   in progress on any stream: a last resort); until then later launches
 *   do not make it known, as they are not ordered after it.
 *   A launch on a stream that captures is recorded into the capture, not
 *   run: it records no event (querying one recorded in a capture would
 *   invalidate it) and the event keeps covering the launches that ran; nor
 *   does the stream wait for the last launch elsewhere (a capturing stream
 *   may not wait on an event recorded outside the capture). The captured
 *   graph reads the executable's memory whenever it runs: keeping that
 *   memory for it, and ordering its runs, is the caller's part, as for any
 *   graph.
 *   Ownership of pins passed to prepare: tp_graph_pins with already_pinned
 *   hands the pins to the cache on every return except
 *   TP_ERR_INVALID_ARGUMENT (when prepare fails the pins are released at
 *   once: no executable uses them); without already_pinned the cache pins
 *   the ranges itself. pins == NULL keeps the pins the executable already
 *   has; a tp_graph_pins with count 0 drops them.
 *
 * Locking
 *   One mutex per cache guards everything, background thread included.
 *   Lock order: cache lock -> pool lock -> device lock. The cache calls
 *   tp_pool_pin / tp_pool_unpin / tp_pool_add_reclaim_callback /
 *   tp_pool_remove_reclaim_callback with its lock held; that is safe because
 *   a pool never calls into the cache while holding its own lock (reclaim
 *   callbacks run with the pool lock released, pool.c), and the cache never
 *   calls tp_pool_alloc or tp_pool_free, the only calls that run reclaim
 *   callbacks (a cache calling them with its lock held would re-enter itself
 *   through its callback). Device ops take only the device's own lock.
 *   The log callback is called with the cache lock held.
 *   Lifetime: tp_graph_cache_destroy removes the reclaim callbacks, but a
 *   pool allocation already past its copy of the callback list could still
 *   call into a destroyed cache, so destroy must not race with allocations
 *   on attached pools (the header already forbids racing destroy with any
 *   call). Pools whose memory the cache pins must outlive the cache, or the
 *   keys pinning them must be evicted and the pool then detached: detach
 *   waits for the retired pins in the pool and releases them, so that no
 *   later tick reaches into a destroyed pool.
 *
 * Invariants (tp_graph_cache_check): every executable is in exactly one
 * segment list and once in the variant chain its key leads to in the key
 * index, which holds nothing else; list counts, byte sums and the
 * pinned-range count match the statistics; execs <= max_execs and
 * exec_bytes <= max_bytes between calls; protected holds at most its share;
 * a key has at most GC_MAX_VARIANTS executables; every retired record holds
 * pins and the event that releases them. During an instantiation the device
 * may briefly hold the new executable before victims for a larger-than-
 * estimated size are destroyed; exec_bytes_peak includes that moment.
 *
 * Statistics: hits and updates count prepares served in place (same handle /
 * new handle); update_failures counts prepares that had to instantiate
 * after at least one variant refused the update; instantiate_failures
 * counts failed device calls, out-of-memory attempts that were retried
 * included; evictions_count includes the per-key variant limit; executables
 * dropped because their update failed with a device error, or by destroy,
 * are not counted as evictions.
 */
#include "internal.h"
#include "tpi_map.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#define GC_MAX_VARIANTS 4
#define GC_RECENT 16
/* Measured instantiation costs kept for the byte model (exec_bytes_accounted). */
#define GC_COST_WINDOW 16
typedef struct gc_cost {
    uint64_t bytes, nodes;
} gc_cost;
#define GC_DEFAULT_MAX_EXECS 64u
/* The highest count cap: more executables than this cannot live in a
 * host's memory, and a cap this low leaves each executable up to 1 TiB in
 * the 64-bit byte sums (a higher cap would shrink that bound: see
 * exec_bytes_clamp). Larger max_execs, UINT32_MAX included, mean this. */
#define GC_MAX_EXECS (1u << 24)
#define GC_DEFAULT_MAX_BYTES (256 * TPI_MiB)
#define GC_DEFAULT_IDLE_NS 10000000000ull
#define GC_DEFAULT_PROTECTED 80u
#define GC_DEFAULT_TICK_NS 1000000000ull
#define GC_DEFAULT_NODE_BYTES (10 * TPI_KiB)

enum { SEG_PROBATION = 0, SEG_PROTECTED = 1 };

typedef enum gc_reason {
    REASON_COUNT,    /* max_execs, or the key's variant limit */
    REASON_BYTES,    /* max_bytes */
    REASON_IDLE,     /* idle_evict_ns */
    REASON_PRESSURE, /* out of memory on instantiate, reclaim callback */
    REASON_EXPLICIT, /* tp_graph_cache_evict */
    REASON_INTERNAL  /* broken by a failed update, or destroy: not counted */
} gc_reason;

typedef struct gc_pins {
    tp_pool *pool;
    tp_range *ranges;
    size_t count;
} gc_pins;

typedef struct gc_exec {
    uint64_t key;
    tp_graph graph; /* handle last prepared into it (compared, never used) */
    tpi_graph_exec exec;
    uint64_t bytes;
    uint64_t last_use_ns;
    uint64_t prepared_seq; /* the key's current variant has the highest */
    struct gc_exec *prev, *next; /* segment list; prev is toward the head */
    struct gc_exec *vnext;       /* the key's next older variant */
    uint8_t segment;
    bool launched_since_prepare;
    bool event_recorded;     /* event covers the last launch, maybe pending */
    bool completion_unknown; /* a launch whose event could not be recorded */
    bool unknown_many;       /* ... on more than one stream */
    tp_event event;
    tp_stream last_stream;
    tp_stream unknown_stream; /* the stream of the launches of unknown completion */
    gc_pins pins;
} gc_exec;

typedef struct gc_list {
    gc_exec *head, *tail;
    uint32_t count;
} gc_list;

typedef struct gc_retired {
    gc_pins pins;
    tp_event event;
} gc_retired;

struct tp_graph_cache {
    tp_device *device;
    const tpi_device_ops *ops;
    const tpi_host *host;
    tp_graph_cache_config config; /* defaults filled in */
    uint32_t protected_cap;
    pthread_mutex_t lock;
    /* Serialises attach and detach, which call into pools without `lock`
     * held: a pool's reclaim round takes `lock` (gc_reclaim), and removing
     * the callback waits for that round. */
    pthread_mutex_t attach_lock;

    tpi_map index; /* key -> its newest variant (gc_exec *) */
    gc_list seg[2];
    uint64_t exec_bytes;
    uint64_t seq;
    uint64_t recent[GC_RECENT];
    gc_cost cost[GC_COST_WINDOW]; /* exec_bytes_accounted: the last measured costs */
    unsigned cost_next, cost_count;
    unsigned recent_next;
    uint64_t next_idle_check_ns;
    /* Most bytes one executable is counted at: the device's memory, and
     * little enough that max_execs + 1 of them add up without wrapping. */
    uint64_t exec_bytes_clamp;

    gc_retired *retired;
    size_t retired_count, retired_capacity;
    tp_pool **pools;
    size_t pool_count, pool_capacity;

    tp_graph_cache_stats stats;

    bool thread_started;
    bool thread_stop;
    pthread_t thread;
    pthread_cond_t cond;
};

/* ----------------------------------------------------------------- helpers */

static uint64_t now_ns(tp_graph_cache *cache) { return cache->ops->now_ns(cache->device); }

static uint64_t pins_bytes(const gc_pins *p) {
    uint64_t sum = 0;
    for (size_t i = 0; i < p->count; i++) sum += p->ranges[i].bytes;
    return sum;
}

static void pins_release(tp_graph_cache *cache, gc_pins *p) {
    for (size_t i = 0; i < p->count; i++) {
        const tp_range *r = &p->ranges[i];
        tp_status st = tp_pool_unpin(p->pool, (const void *)(uintptr_t)r->address, (size_t)r->bytes);
        if (st != TP_OK)
            tpi_logf(&cache->device->logger, TP_LOG_WARN, "graph cache: unpinning [0x%llx, +%llu) failed: %s",
                    (unsigned long long)r->address, (unsigned long long)r->bytes, tp_status_name(st));
    }
    cache->stats.pinned_ranges -= p->count;
    tpi_host_free(cache->host, p->ranges, p->count * sizeof *p->ranges);
    *p = (gc_pins){0};
}

/* Rejections that leave already_pinned pins with the caller. */
static tp_status pins_validate(const tp_graph_pins *in) {
    if (!in || in->count == 0) return TP_OK;
    if (!in->ranges || !in->pool) return TP_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < in->count; i++)
        if (in->ranges[i].bytes == 0 || in->ranges[i].bytes > SIZE_MAX) return TP_ERR_INVALID_ARGUMENT;
    return TP_OK;
}

/* Gives the caller's already_pinned pins back to the pool (used when the
 * cache cannot even copy them). */
static void pins_drop_foreign(tp_graph_cache *cache, const tp_graph_pins *in) {
    if (!in->already_pinned) return;
    for (size_t i = 0; i < in->count; i++)
        tp_pool_unpin(in->pool, (const void *)(uintptr_t)in->ranges[i].address, (size_t)in->ranges[i].bytes);
    (void)cache;
}

/* Copies the ranges and makes sure the cache holds one pin on each. */
static tp_status pins_acquire(tp_graph_cache *cache, const tp_graph_pins *in, gc_pins *out) {
    *out = (gc_pins){0};
    if (in->count == 0) return TP_OK;
    tp_range *copy = tpi_host_alloc(cache->host, in->count * sizeof *copy);
    if (!copy) {
        pins_drop_foreign(cache, in);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    memcpy(copy, in->ranges, in->count * sizeof *copy);
    if (!in->already_pinned) {
        for (size_t i = 0; i < in->count; i++) {
            tp_status st = tp_pool_pin(in->pool, (const void *)(uintptr_t)copy[i].address, (size_t)copy[i].bytes);
            if (st != TP_OK) {
                tpi_logf(&cache->device->logger, TP_LOG_ERROR, "graph cache: pinning [0x%llx, +%llu) failed: %s",
                        (unsigned long long)copy[i].address, (unsigned long long)copy[i].bytes, tp_status_name(st));
                for (size_t k = 0; k < i; k++)
                    tp_pool_unpin(in->pool, (const void *)(uintptr_t)copy[k].address, (size_t)copy[k].bytes);
                tpi_host_free(cache->host, copy, in->count * sizeof *copy);
                return st;
            }
        }
    }
    *out = (gc_pins){in->pool, copy, in->count};
    cache->stats.pinned_ranges += in->count;
    return TP_OK;
}

/* ------------------------------------------------------------- key index */

static gc_exec *exec_of(uint64_t value) { return (gc_exec *)(uintptr_t)value; }

/* The key's newest variant (the others follow through vnext), or NULL. */
static gc_exec *variants_of(tp_graph_cache *cache, uint64_t key) {
    uint64_t value = 0;
    return tpi_map_get(&cache->index, key, &value) ? exec_of(value) : NULL;
}

/* Makes room for one more key, so that the next index_insert does not
 * allocate (removals in between keep the room). False when host memory
 * runs out. */
static bool index_reserve(tp_graph_cache *cache) {
    return tpi_map_reserve(&cache->index, cache->index.count + 1);
}

/* Makes e its key's newest variant. Room reserved with index_reserve. */
static void index_insert(tp_graph_cache *cache, gc_exec *e) {
    uint64_t *newest = tpi_map_find(&cache->index, e->key);
    e->vnext = newest ? exec_of(*newest) : NULL;
    if (newest)
        *newest = (uint64_t)(uintptr_t)e;
    else
        tpi_map_put(&cache->index, e->key, (uint64_t)(uintptr_t)e);
}

/* Takes e out of its key's variants; the key leaves the index with its
 * last variant. */
static void index_remove(tp_graph_cache *cache, gc_exec *e) {
    uint64_t *newest = tpi_map_find(&cache->index, e->key);
    if (!newest) return;
    if (exec_of(*newest) == e) {
        if (e->vnext)
            *newest = (uint64_t)(uintptr_t)e->vnext;
        else
            tpi_map_remove(&cache->index, e->key, NULL);
    } else {
        gc_exec *p = exec_of(*newest);
        while (p && p->vnext != e) p = p->vnext;
        if (p) p->vnext = e->vnext;
    }
    e->vnext = NULL;
}

/* The key's variants, in no particular order. */
static size_t find_variants(tp_graph_cache *cache, uint64_t key, gc_exec **out) {
    size_t n = 0;
    for (gc_exec *e = variants_of(cache, key); e && n < GC_MAX_VARIANTS; e = e->vnext) out[n++] = e;
    return n;
}

static gc_exec *current_variant(tp_graph_cache *cache, uint64_t key) {
    gc_exec *best = NULL;
    for (gc_exec *e = variants_of(cache, key); e; e = e->vnext)
        if (!best || e->prepared_seq > best->prepared_seq) best = e;
    return best;
}

/* ------------------------------------------------------------ recency lists */

static void list_unlink(gc_list *l, gc_exec *e) {
    if (e->prev) e->prev->next = e->next; else l->head = e->next;
    if (e->next) e->next->prev = e->prev; else l->tail = e->prev;
    e->prev = e->next = NULL;
    l->count--;
}

static void list_push_head(gc_list *l, gc_exec *e) {
    e->prev = NULL;
    e->next = l->head;
    if (l->head) l->head->prev = e; else l->tail = e;
    l->head = e;
    l->count++;
}

/* Marks a use: moves e to the head of its segment, or of protected when it
 * is a reuse, and demotes protected's tail while protected is over its
 * share. */
static void touch(tp_graph_cache *cache, gc_exec *e, bool reuse, uint64_t now) {
    e->last_use_ns = now;
    list_unlink(&cache->seg[e->segment], e);
    if (reuse) e->segment = SEG_PROTECTED;
    list_push_head(&cache->seg[e->segment], e);
    while (cache->seg[SEG_PROTECTED].count > cache->protected_cap) {
        gc_exec *d = cache->seg[SEG_PROTECTED].tail;
        list_unlink(&cache->seg[SEG_PROTECTED], d);
        d->segment = SEG_PROBATION;
        list_push_head(&cache->seg[SEG_PROBATION], d);
    }
    if (cache->config.idle_evict_ns != TP_NS_NEVER) {
        uint64_t deadline = now > UINT64_MAX - cache->config.idle_evict_ns ? UINT64_MAX : now + cache->config.idle_evict_ns;
        if (deadline < cache->next_idle_check_ns) cache->next_idle_check_ns = deadline;
    }
}

/* -------------------------------------------------------------- completion */

/* Non-blocking: is the executable's last launch known complete? */
static bool exec_idle(tp_graph_cache *cache, gc_exec *e) {
    if (e->completion_unknown) return false;
    if (!e->event_recorded) return true;
    if (cache->ops->event_query(cache->device, e->event) == TP_OK) {
        e->event_recorded = false;
        return true;
    }
    return false;
}

/* Waits for an event, or for the whole device when event is NULL or the
 * event wait fails. False when even that failed. */
static bool wait_event(tp_graph_cache *cache, tp_event event) {
    tp_status st = event ? cache->ops->event_synchronize(cache->device, event) : TP_ERR_INVALID_ARGUMENT;
    if (st == TP_OK) return true;
    if (event)
        tpi_logf(&cache->device->logger, TP_LOG_WARN, "graph cache: event wait failed (%s); synchronising the device",
                tp_status_name(st));
    st = cache->ops->device_synchronize(cache->device);
    if (st == TP_OK) return true;
    tpi_logf(&cache->device->logger, TP_LOG_ERROR, "graph cache: device synchronisation failed: %s", tp_status_name(st));
    return false;
}

/* Blocks until the executable's launches have completed; false when the
 * device would not say. Launches of unknown completion, all on one stream
 * that is not capturing now, are waited for by synchronising that stream:
 * the device-wide synchronisation, the last resort, would invalidate any
 * capture in progress on another stream. */
static bool exec_wait(tp_graph_cache *cache, gc_exec *e) {
    if (!e->completion_unknown && !e->event_recorded) return true;
    if (e->completion_unknown) {
        tp_device *dev = cache->device;
        bool capturing = true, synced = false;
        if (!e->unknown_many &&
            (!cache->ops->stream_capturing ||
             cache->ops->stream_capturing(dev, e->unknown_stream, &capturing) != TP_OK || !capturing))
            synced = cache->ops->stream_synchronize(dev, e->unknown_stream) == TP_OK;
        if (!synced) {
            if (!wait_event(cache, NULL)) return false; /* the device: every launch */
            e->event_recorded = false;
        }
        e->completion_unknown = false;
        e->unknown_many = false;
    }
    if (e->event_recorded && !wait_event(cache, e->event)) return false;
    e->event_recorded = false;
    return true;
}

/* Last resort when completion cannot be established: keep the pool memory
 * pinned for good (a leak) rather than risk work reading freed memory. */
static void pins_abandon(tp_graph_cache *cache, gc_pins *p) {
    tpi_logf(&cache->device->logger, TP_LOG_ERROR,
            "graph cache: completion of the last launch is unknown; %zu pinned range(s) stay pinned", p->count);
    cache->stats.pinned_ranges -= p->count;
    tpi_host_free(cache->host, p->ranges, p->count * sizeof *p->ranges);
    *p = (gc_pins){0};
}

static bool retire(tp_graph_cache *cache, gc_pins *pins, tp_event event) {
    if (!tpi_host_grow(cache->host, (void **)&cache->retired, sizeof *cache->retired, &cache->retired_capacity,
                      cache->retired_count + 1))
        return false;
    cache->retired[cache->retired_count++] = (gc_retired){*pins, event};
    *pins = (gc_pins){0};
    return true;
}

/* Releases retired pins whose event has completed. With wait, waits for
 * those of pool `only` (every pool when NULL) first. Returns the bytes of
 * the ranges released in `only` (all when NULL). */
static uint64_t retired_process(tp_graph_cache *cache, bool wait, tp_pool *only) {
    uint64_t freed = 0;
    for (size_t i = 0; i < cache->retired_count;) {
        gc_retired *r = &cache->retired[i];
        bool mine = !only || r->pins.pool == only;
        bool complete = wait && mine ? wait_event(cache, r->event)
                                     : cache->ops->event_query(cache->device, r->event) == TP_OK;
        if (!complete) {
            i++;
            continue;
        }
        if (mine) freed += pins_bytes(&r->pins);
        pins_release(cache, &r->pins);
        cache->ops->event_destroy(cache->device, r->event);
        *r = cache->retired[--cache->retired_count];
    }
    return freed;
}

/* Waits for the retired pins in pool and releases them, so that the cache
 * keeps no reference to the pool (detach, before the pool goes). Pins whose
 * launch the device cannot vouch for stay pinned (pins_abandon). */
static void retired_forget_pool_locked(tp_graph_cache *cache, tp_pool *pool) {
    retired_process(cache, true, pool);
    for (size_t i = 0; i < cache->retired_count;) {
        gc_retired *r = &cache->retired[i];
        if (r->pins.pool != pool) {
            i++;
            continue;
        }
        pins_abandon(cache, &r->pins);
        cache->ops->event_destroy(cache->device, r->event);
        *r = cache->retired[--cache->retired_count];
    }
}

/* ---------------------------------------------------------------- eviction */

static void count_eviction(tp_graph_cache *cache, gc_reason reason) {
    switch (reason) {
    case REASON_COUNT: cache->stats.evictions_count++; break;
    case REASON_BYTES: cache->stats.evictions_bytes++; break;
    case REASON_IDLE: cache->stats.evictions_idle++; break;
    case REASON_PRESSURE: cache->stats.evictions_pressure++; break;
    case REASON_EXPLICIT: cache->stats.evictions_explicit++; break;
    case REASON_INTERNAL: break;
    }
}

/* Removes e from the cache and destroys its executable. Its pins go now if
 * its last launch has completed (or, with wait, after waiting for it),
 * otherwise to the retired list. Returns the pinned bytes released now in
 * pool `in_pool` (NULL: none counted). */
static uint64_t evict(tp_graph_cache *cache, gc_exec *e, gc_reason reason, bool wait, tp_pool *in_pool) {
    list_unlink(&cache->seg[e->segment], e);
    index_remove(cache, e);
    cache->exec_bytes -= e->bytes;
    cache->stats.execs--;
    count_eviction(cache, reason);
    tpi_logf(&cache->device->logger, TP_LOG_DEBUG, "graph cache: evicting key 0x%llx (%llu bytes, reason %d)",
            (unsigned long long)e->key, (unsigned long long)e->bytes, (int)reason);

    bool done = exec_idle(cache, e);
    if (!done && (wait || e->completion_unknown)) done = exec_wait(cache, e);
    tp_status st = cache->ops->graph_destroy(cache->device, e->exec);
    if (st != TP_OK)
        tpi_logf(&cache->device->logger, TP_LOG_WARN, "graph cache: destroying the executable of key 0x%llx failed: %s",
                (unsigned long long)e->key, tp_status_name(st));
    uint64_t freed = 0;
    if (e->pins.count) {
        if (!done && !e->completion_unknown && e->event_recorded && retire(cache, &e->pins, e->event)) {
            e->event = NULL;
        } else if (done || exec_wait(cache, e)) { /* retire failed (host memory): wait instead */
            if (in_pool && e->pins.pool == in_pool) freed = pins_bytes(&e->pins);
            pins_release(cache, &e->pins);
        } else {
            pins_abandon(cache, &e->pins);
        }
    }
    if (e->event) cache->ops->event_destroy(cache->device, e->event);
    tpi_host_free(cache->host, e, sizeof *e);
    return freed;
}

typedef bool (*gc_filter)(tp_graph_cache *cache, gc_exec *e, void *ctx);

/* The first accepted entry from probation's tail, then protected's tail. */
static gc_exec *pick_victim(tp_graph_cache *cache, gc_filter filter, void *ctx, const gc_exec *exclude) {
    for (int s = SEG_PROBATION; s <= SEG_PROTECTED; s++)
        for (gc_exec *e = cache->seg[s].tail; e; e = e->prev)
            if (e != exclude && (!filter || filter(cache, e, ctx))) return e;
    return NULL;
}

static bool filter_idle(tp_graph_cache *cache, gc_exec *e, void *ctx) {
    (void)ctx;
    return exec_idle(cache, e);
}

static bool filter_pins_pool(tp_graph_cache *cache, gc_exec *e, void *ctx) {
    (void)cache;
    return e->pins.count && e->pins.pool == (tp_pool *)ctx;
}

static bool filter_idle_pins_pool(tp_graph_cache *cache, gc_exec *e, void *ctx) {
    return filter_pins_pool(cache, e, ctx) && exec_idle(cache, e);
}

/* Evicts (non-blocking) until one more executable of extra_bytes fits. */
static void make_room(tp_graph_cache *cache, uint32_t extra_count, uint64_t extra_bytes, const gc_exec *exclude) {
    while (cache->stats.execs + extra_count > cache->config.max_execs) {
        gc_exec *v = pick_victim(cache, NULL, NULL, exclude);
        if (!v) break;
        evict(cache, v, REASON_COUNT, false, NULL);
    }
    if (cache->config.max_bytes == TP_BYTES_UNLIMITED) return;
    while (cache->exec_bytes + extra_bytes > cache->config.max_bytes) {
        gc_exec *v = pick_victim(cache, NULL, NULL, exclude);
        if (!v) break;
        evict(cache, v, REASON_BYTES, false, NULL);
    }
}

/* Evicts executables neither prepared nor launched for idle_evict_ns and
 * computes when the next one can become due. */
static void idle_sweep(tp_graph_cache *cache, uint64_t now) {
    uint64_t idle = cache->config.idle_evict_ns;
    cache->next_idle_check_ns = UINT64_MAX;
    if (idle == TP_NS_NEVER) return;
    for (int s = SEG_PROBATION; s <= SEG_PROTECTED; s++) {
        for (gc_exec *e = cache->seg[s].tail; e;) {
            gc_exec *prev = e->prev;
            if (now >= e->last_use_ns && now - e->last_use_ns >= idle) {
                evict(cache, e, REASON_IDLE, false, NULL);
            } else {
                uint64_t deadline = e->last_use_ns > UINT64_MAX - idle ? UINT64_MAX : e->last_use_ns + idle;
                if (deadline < cache->next_idle_check_ns) cache->next_idle_check_ns = deadline;
            }
            e = prev;
        }
    }
}

static void upkeep(tp_graph_cache *cache, uint64_t now, bool force_sweep) {
    if (cache->retired_count) retired_process(cache, false, NULL);
    if (force_sweep || now >= cache->next_idle_check_ns) idle_sweep(cache, now);
}

/* ------------------------------------------------------------ instantiate */

/* Nodes of a template, 0 when the backend cannot tell. */
static uint64_t graph_node_count(tp_graph_cache *cache, tp_graph graph) {
    const tpi_device_ops *ops = cache->device->ops;
    return ops->graph_node_count ? ops->graph_node_count(cache->device, graph) : 0;
}

static uint64_t recent_max(const tp_graph_cache *cache) {
    uint64_t m = 0;
    for (unsigned i = 0; i < GC_RECENT; i++) m = TPI_MAX(m, cache->recent[i]);
    return m;
}

/* The bytes an executable is counted at: what was reported or measured,
 * but at least the highest cost per node among the last GC_COST_WINDOW
 * instantiations that showed a cost, times its nodes. A driver that keeps
 * the memory of destroyed executables and hands it to new ones (CUDA does)
 * shows no drop in free memory for them, or a partial one; counted at that
 * (or at the configured guess), they would let the cache hold several times
 * its cap. A maximum is cautious on purpose: partial measurements do not
 * lower it, and an outlier leaves the window after GC_COST_WINDOW newer
 * measurements. Executables whose cost hardly depends on their node count
 * are over-counted (the H200's ~8 MiB memset graphs of 50..250 nodes: 2.2x),
 * so such a cache holds fewer executables than its cap allows, never more.
 * Before the first measurement: node_bytes_estimate per node. */
static uint64_t modelled_bytes(const tp_graph_cache *cache, uint64_t nodes) {
    if (!nodes) nodes = 1;
    uint64_t per_node = cache->config.node_bytes_estimate;
    if (cache->cost_count) {
        per_node = 0;
        for (unsigned i = 0; i < cache->cost_count; i++)
            per_node = TPI_MAX(per_node, cache->cost[i].bytes / cache->cost[i].nodes +
                                             (cache->cost[i].bytes % cache->cost[i].nodes != 0));
    }
    /* Saturating: a huge node_bytes_estimate must not wrap to a small cost. */
    uint64_t bytes;
    if (__builtin_mul_overflow(per_node, nodes, &bytes)) bytes = UINT64_MAX;
    return TPI_MIN(bytes, cache->exec_bytes_clamp);
}

static uint64_t exec_bytes_accounted(tp_graph_cache *cache, uint64_t measured_bytes, uint64_t nodes) {
    if (measured_bytes) {
        cache->cost[cache->cost_next] = (gc_cost){measured_bytes, nodes ? nodes : 1};
        cache->cost_next = (cache->cost_next + 1) % GC_COST_WINDOW;
        if (cache->cost_count < GC_COST_WINDOW) cache->cost_count++;
    }
    return TPI_MIN(TPI_MAX(measured_bytes, modelled_bytes(cache, nodes)), cache->exec_bytes_clamp);
}

/* Every attached pool gives back its idle memory; returns the bytes. The
 * pools' locks are taken with the cache's held: a pool calls into the cache
 * only from a reclaim round, with its own lock released (gc_reclaim). */
static uint64_t trim_pools_locked(tp_graph_cache *cache) {
    uint64_t released = 0;
    for (size_t i = 0; i < cache->pool_count; i++) {
        uint64_t bytes = 0;
        if (tp_pool_trim(cache->pools[i], 0, &bytes) == TP_OK) released += bytes;
    }
    return released;
}

/* Instantiates graph (of nodes nodes, 0 if unknown) as a new variant of
 * key. newpins (may be NULL) are consumed on every path. */
static tp_status instantiate_new(tp_graph_cache *cache, uint64_t key, tp_graph graph, uint64_t nodes,
                                 gc_pins *newpins, uint64_t estimate, uint64_t now) {
    const tpi_logger *log = &cache->device->logger;
    gc_exec *e = tpi_host_calloc(cache->host, 1, sizeof *e);
    if (!e || !index_reserve(cache)) {
        tpi_host_free(cache->host, e, sizeof *e);
        if (newpins) pins_release(cache, newpins);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    make_room(cache, 1, estimate, NULL);

    tpi_graph_exec exec = NULL;
    uint64_t bytes = 0, free_before = 0, free_after = 0, total = 0;
    tp_status st;
    bool pools_trimmed = false;
    for (;;) {
        bool measured = cache->ops->mem_info(cache->device, &free_before, &total) == TP_OK;
        st = cache->ops->graph_instantiate(cache->device, graph, &exec, &bytes);
        if (st == TP_OK) {
            if (bytes == 0 && measured && cache->ops->mem_info(cache->device, &free_after, &total) == TP_OK &&
                free_before > free_after)
                bytes = free_before - free_after;
            bytes = exec_bytes_accounted(cache, bytes, nodes);
            break;
        }
        cache->stats.instantiate_failures++;
        if (st != TP_ERR_OUT_OF_MEMORY) {
            tpi_logf(log, TP_LOG_WARN, "graph cache: instantiating key 0x%llx failed: %s", (unsigned long long)key,
                    tp_status_name(st));
            goto fail;
        }
        gc_exec *victim = pick_victim(cache, filter_idle, NULL, NULL);
        if (!victim) victim = pick_victim(cache, NULL, NULL, NULL);
        if (!victim && !pools_trimmed) {
            pools_trimmed = true;
            uint64_t released = trim_pools_locked(cache);
            if (released) {
                tpi_logf(log, TP_LOG_INFO,
                        "graph cache: out of device memory instantiating key 0x%llx; the pools gave back %llu idle "
                        "bytes", (unsigned long long)key, (unsigned long long)released);
                continue;
            }
        }
        if (!victim) {
            cache->stats.eager_fallbacks++;
            tpi_logf(log, TP_LOG_WARN,
                    "graph cache: out of device memory instantiating key 0x%llx with nothing left to evict; "
                    "run it eagerly", (unsigned long long)key);
            st = TP_ERR_RUN_EAGER;
            goto fail;
        }
        evict(cache, victim, REASON_PRESSURE, true, NULL);
    }

    cache->stats.instantiations++;
    cache->recent[cache->recent_next] = bytes;
    cache->recent_next = (cache->recent_next + 1) % GC_RECENT;
    e->key = key;
    e->graph = graph;
    e->exec = exec;
    e->bytes = bytes;
    e->segment = SEG_PROBATION;
    e->prepared_seq = ++cache->seq;
    if (newpins) {
        e->pins = *newpins;
        *newpins = (gc_pins){0};
    }
    index_insert(cache, e);
    list_push_head(&cache->seg[SEG_PROBATION], e);
    cache->stats.execs++;
    cache->exec_bytes += bytes;
    if (cache->exec_bytes > cache->stats.exec_bytes_peak) cache->stats.exec_bytes_peak = cache->exec_bytes;
    touch(cache, e, false, now);

    if (cache->config.max_bytes != TP_BYTES_UNLIMITED && bytes > cache->config.max_bytes) {
        tpi_logf(log, TP_LOG_WARN, "graph cache: key 0x%llx needs %llu bytes, more than max_bytes %llu; run it eagerly",
                (unsigned long long)key, (unsigned long long)bytes, (unsigned long long)cache->config.max_bytes);
        evict(cache, e, REASON_BYTES, false, NULL);
        cache->stats.eager_fallbacks++;
        return TP_ERR_RUN_EAGER;
    }
    make_room(cache, 0, 0, e);
    return TP_OK;

fail:
    if (newpins) pins_release(cache, newpins);
    tpi_host_free(cache->host, e, sizeof *e);
    return st;
}

/* Gives e the new pin set; the old one goes once e's launches are done. */
static void replace_pins(tp_graph_cache *cache, gc_exec *e, gc_pins *newpins) {
    if (e->pins.count) {
        if (exec_idle(cache, e)) {
            pins_release(cache, &e->pins);
        } else if (!e->completion_unknown && retire(cache, &e->pins, e->event)) {
            e->event = NULL; /* the record owns it; the next launch makes another */
            e->event_recorded = false;
        } else if (exec_wait(cache, e)) {
            pins_release(cache, &e->pins);
        } else {
            pins_abandon(cache, &e->pins);
        }
    }
    e->pins = *newpins;
    *newpins = (gc_pins){0};
}

/* Try order for updates: the variant last prepared with this handle, then
 * the most recently prepared. */
static bool variant_before(const gc_exec *a, const gc_exec *b, tp_graph graph) {
    bool a_same = a->graph == graph, b_same = b->graph == graph;
    if (a_same != b_same) return a_same;
    return a->prepared_seq > b->prepared_seq;
}

static tp_status prepare_locked(tp_graph_cache *cache, uint64_t key, tp_graph graph, gc_pins *newpins,
                                uint64_t now) {
    gc_exec *vars[GC_MAX_VARIANTS];
    size_t n = find_variants(cache, key, vars);
    /* Order: the one last prepared with this handle, then most recent first. */
    for (size_t i = 1; i < n; i++) {
        gc_exec *x = vars[i];
        size_t j = i;
        while (j > 0 && variant_before(x, vars[j - 1], graph)) {
            vars[j] = vars[j - 1];
            j--;
        }
        vars[j] = x;
    }
    bool refused = false;
    uint64_t estimate = 0;
    for (size_t i = 0; i < n; i++) {
        gc_exec *v = vars[i];
        tp_status st = cache->ops->graph_update(cache->device, v->exec, graph);
        if (st == TP_OK) {
            if (v->graph == graph) cache->stats.hits++; else cache->stats.updates++;
            v->graph = graph;
            v->prepared_seq = ++cache->seq;
            v->launched_since_prepare = false;
            touch(cache, v, true, now);
            if (newpins) replace_pins(cache, v, newpins);
            return TP_OK;
        }
        refused = true;
        estimate = TPI_MAX(estimate, v->bytes);
        if (st != TP_ERR_TOPOLOGY_MISMATCH) {
            tpi_logf(&cache->device->logger, TP_LOG_WARN,
                    "graph cache: updating key 0x%llx failed (%s); re-instantiating", (unsigned long long)key,
                    tp_status_name(st));
            evict(cache, v, REASON_INTERNAL, false, NULL);
            vars[i] = NULL;
        }
    }
    if (refused) cache->stats.update_failures++;
    /* Keep at most GC_MAX_VARIANTS per key: drop the least recently used. */
    size_t alive = 0;
    gc_exec *oldest = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!vars[i]) continue;
        alive++;
        if (!oldest || vars[i]->last_use_ns < oldest->last_use_ns ||
            (vars[i]->last_use_ns == oldest->last_use_ns && vars[i]->prepared_seq < oldest->prepared_seq))
            oldest = vars[i];
    }
    if (alive >= GC_MAX_VARIANTS) evict(cache, oldest, REASON_COUNT, false, NULL);
    estimate = TPI_MAX(estimate, recent_max(cache));
    uint64_t nodes = graph_node_count(cache, graph);
    if (nodes) estimate = TPI_MAX(estimate, modelled_bytes(cache, nodes));
    return instantiate_new(cache, key, graph, nodes, newpins, estimate, now);
}

/* ----------------------------------------------------------------- reclaim */

static bool pool_attached(const tp_graph_cache *cache, const tp_pool *pool, size_t *out_index) {
    for (size_t i = 0; i < cache->pool_count; i++) {
        if (cache->pools[i] == pool) {
            if (out_index) *out_index = i;
            return true;
        }
    }
    return false;
}

/* A pool ran out of memory: release what helps it, most useful first --
 * retired pins in it, idle executables pinning it, other idle executables
 * (only when the device itself is short), then the same with launches in
 * flight (waiting for them). Called without the pool lock. */
static uint64_t gc_reclaim(void *user, tp_pool *pool, uint64_t bytes_needed) {
    tp_graph_cache *cache = user;
    pthread_mutex_lock(&cache->lock);
    uint64_t freed = 0;
    if (!pool_attached(cache, pool, NULL)) goto out; /* detached while the pool was calling */
    freed += retired_process(cache, true, pool);
    for (int tier = 0; tier < 4 && freed < bytes_needed; tier++) {
        gc_filter filter = tier == 0 ? filter_idle_pins_pool : tier == 1 ? filter_idle : tier == 2 ? filter_pins_pool : NULL;
        if (tier == 1 || tier == 3) {
            /* Evicting executables that do not pin this pool only helps when
             * the device itself is short of memory. */
            uint64_t free_bytes = 0, total = 0;
            if (cache->ops->mem_info(cache->device, &free_bytes, &total) == TP_OK && free_bytes >= bytes_needed)
                continue;
        }
        while (freed < bytes_needed) {
            gc_exec *v = pick_victim(cache, filter, pool, NULL);
            if (!v) break;
            uint64_t bytes = v->bytes;
            freed += evict(cache, v, REASON_PRESSURE, true, pool) + bytes;
        }
    }
    tpi_logf(&cache->device->logger, TP_LOG_INFO, "graph cache: reclaim for a pool needing %llu bytes freed %llu",
            (unsigned long long)bytes_needed, (unsigned long long)freed);
out:
    pthread_mutex_unlock(&cache->lock);
    return freed;
}

/* -------------------------------------------------------- background thread */

static void *gc_thread_main(void *arg) {
    tp_graph_cache *cache = arg;
    pthread_mutex_lock(&cache->lock);
    while (!cache->thread_stop) {
        struct timespec deadline;
        clock_gettime(CLOCK_MONOTONIC, &deadline);
        uint64_t ns = (uint64_t)deadline.tv_nsec + cache->config.tick_interval_ns % 1000000000ull;
        uint64_t secs = cache->config.tick_interval_ns / 1000000000ull + ns / 1000000000ull;
        if (secs > (uint64_t)INT32_MAX) secs = INT32_MAX;
        deadline.tv_sec += (time_t)secs;
        deadline.tv_nsec = (long)(ns % 1000000000ull);
        int rc = 0;
        while (!cache->thread_stop && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&cache->cond, &cache->lock, &deadline);
        if (cache->thread_stop) break;
        upkeep(cache, now_ns(cache), true);
    }
    pthread_mutex_unlock(&cache->lock);
    return NULL;
}

/* ------------------------------------------------------------------- API */

tp_status tp_graph_cache_create(tp_device *device, const tp_graph_cache_config *config, tp_graph_cache **out_cache) {
    if (!out_cache) return TP_ERR_INVALID_ARGUMENT;
    *out_cache = NULL;
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    tp_graph_cache_config c = config ? *config : (tp_graph_cache_config){0};
    if (!c.max_execs) c.max_execs = GC_DEFAULT_MAX_EXECS;
    if (c.max_execs > GC_MAX_EXECS) c.max_execs = GC_MAX_EXECS;
    if (!c.max_bytes) c.max_bytes = GC_DEFAULT_MAX_BYTES;
    if (!c.idle_evict_ns) c.idle_evict_ns = GC_DEFAULT_IDLE_NS;
    if (!c.protected_percent) c.protected_percent = GC_DEFAULT_PROTECTED;
    if (!c.tick_interval_ns) c.tick_interval_ns = GC_DEFAULT_TICK_NS;
    if (!c.node_bytes_estimate) c.node_bytes_estimate = GC_DEFAULT_NODE_BYTES;
    if (c.protected_percent > 100) {
        tpi_logf(&device->logger, TP_LOG_ERROR, "tp_graph_cache_create: protected_percent %u is above 100",
                c.protected_percent);
        return TP_ERR_INVALID_ARGUMENT;
    }
    tp_graph_cache *cache = tpi_host_calloc(&device->host, 1, sizeof *cache);
    if (!cache) return TP_ERR_HOST_OUT_OF_MEMORY;
    cache->device = device;
    cache->ops = device->ops;
    cache->host = &device->host;
    cache->config = c;
    cache->protected_cap = (uint32_t)((uint64_t)c.max_execs * c.protected_percent / 100);
    cache->next_idle_check_ns = UINT64_MAX;
    uint64_t free_bytes = 0, total_bytes = 0;
    cache->exec_bytes_clamp = UINT64_MAX / ((uint64_t)c.max_execs + 2);
    if (device->ops->mem_info(device, &free_bytes, &total_bytes) == TP_OK && total_bytes)
        cache->exec_bytes_clamp = TPI_MIN(cache->exec_bytes_clamp, total_bytes);
    cache->stats.max_bytes = c.max_bytes;
    cache->stats.max_execs = c.max_execs;
    tpi_map_init(&cache->index, &cache->host->allocator);
    if (pthread_mutex_init(&cache->lock, NULL) != 0) goto fail_alloc;
    if (pthread_mutex_init(&cache->attach_lock, NULL) != 0) {
        pthread_mutex_destroy(&cache->lock);
        goto fail_alloc;
    }
    pthread_condattr_t attr;
    bool cond_ok = pthread_condattr_init(&attr) == 0;
    if (cond_ok) {
        pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
        cond_ok = pthread_cond_init(&cache->cond, &attr) == 0;
        pthread_condattr_destroy(&attr);
    }
    if (!cond_ok) {
        pthread_mutex_destroy(&cache->attach_lock);
        pthread_mutex_destroy(&cache->lock);
        goto fail_alloc;
    }
    if (c.background_thread) {
        if (pthread_create(&cache->thread, NULL, gc_thread_main, cache) != 0) {
            tpi_logf(&device->logger, TP_LOG_ERROR, "tp_graph_cache_create: could not start the background thread");
            pthread_cond_destroy(&cache->cond);
            pthread_mutex_destroy(&cache->attach_lock);
            pthread_mutex_destroy(&cache->lock);
            goto fail_alloc;
        }
        cache->thread_started = true;
    }
    atomic_fetch_add(&device->users, 1);
    *out_cache = cache;
    return TP_OK;
fail_alloc:
    tpi_host_free(&device->host, cache, sizeof *cache);
    return TP_ERR_HOST_OUT_OF_MEMORY;
}

tp_status tp_graph_cache_get_device(tp_graph_cache *cache, tp_device **out_device) {
    if (!cache || !out_device) return TP_ERR_INVALID_ARGUMENT;
    *out_device = cache->device;
    return TP_OK;
}

tp_status tp_graph_cache_destroy(tp_graph_cache *cache) {
    if (!cache) return TP_ERR_INVALID_ARGUMENT;
    tp_device *device = cache->device;
    if (cache->thread_started) {
        pthread_mutex_lock(&cache->lock);
        cache->thread_stop = true;
        pthread_cond_broadcast(&cache->cond);
        pthread_mutex_unlock(&cache->lock);
        pthread_join(cache->thread, NULL);
    }
    /* Detach every pool first, without `lock` held (see attach_lock). */
    pthread_mutex_lock(&cache->attach_lock);
    pthread_mutex_lock(&cache->lock);
    size_t pool_count = cache->pool_count;
    cache->pool_count = 0;
    pthread_mutex_unlock(&cache->lock);
    for (size_t i = 0; i < pool_count; i++) tp_pool_remove_reclaim_callback(cache->pools[i], gc_reclaim, cache);
    pthread_mutex_unlock(&cache->attach_lock);
    pthread_mutex_lock(&cache->lock);
    for (int s = SEG_PROBATION; s <= SEG_PROTECTED; s++)
        while (cache->seg[s].tail) evict(cache, cache->seg[s].tail, REASON_INTERNAL, true, NULL);
    retired_process(cache, true, NULL);
    while (cache->retired_count) { /* waits the device refused */
        gc_retired *r = &cache->retired[--cache->retired_count];
        pins_abandon(cache, &r->pins);
        cache->ops->event_destroy(device, r->event);
    }
    pthread_mutex_unlock(&cache->lock);
    pthread_cond_destroy(&cache->cond);
    pthread_mutex_destroy(&cache->attach_lock);
    pthread_mutex_destroy(&cache->lock);
    const tpi_host *host = cache->host;
    tpi_host_free(host, cache->retired, cache->retired_capacity * sizeof *cache->retired);
    tpi_host_free(host, cache->pools, cache->pool_capacity * sizeof *cache->pools);
    tpi_map_destroy(&cache->index);
    tpi_host_free(host, cache, sizeof *cache);
    atomic_fetch_sub(&device->users, 1);
    return TP_OK;
}

tp_status tp_graph_cache_attach_pool(tp_graph_cache *cache, tp_pool *pool) {
    if (!cache || !pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&cache->attach_lock);
    pthread_mutex_lock(&cache->lock);
    tp_status st = TP_OK;
    if (pool_attached(cache, pool, NULL))
        st = TP_ERR_INVALID_ARGUMENT;
    else if (!tpi_host_grow(cache->host, (void **)&cache->pools, sizeof *cache->pools, &cache->pool_capacity,
                            cache->pool_count + 1))
        st = TP_ERR_HOST_OUT_OF_MEMORY;
    pthread_mutex_unlock(&cache->lock);
    /* The pool's lock is taken without ours held: a reclaim round of this
     * pool may be waiting for ours. */
    if (st == TP_OK) st = tp_pool_add_reclaim_callback(pool, gc_reclaim, cache);
    if (st == TP_OK) {
        pthread_mutex_lock(&cache->lock);
        cache->pools[cache->pool_count++] = pool;
        pthread_mutex_unlock(&cache->lock);
    }
    pthread_mutex_unlock(&cache->attach_lock);
    return st;
}

tp_status tp_graph_cache_detach_pool(tp_graph_cache *cache, tp_pool *pool) {
    if (!cache || !pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&cache->attach_lock);
    pthread_mutex_lock(&cache->lock);
    size_t i;
    bool attached = pool_attached(cache, pool, &i);
    if (attached) cache->pools[i] = cache->pools[--cache->pool_count]; /* a round in flight now finds nothing */
    pthread_mutex_unlock(&cache->lock);
    /* Waits for a reclaim round in flight, which may need our lock. */
    tp_status st = attached ? tp_pool_remove_reclaim_callback(pool, gc_reclaim, cache) : TP_ERR_NOT_FOUND;
    if (st == TP_ERR_BUSY) {
        /* Called from a reclaim round of this pool: the callback stays, so
         * the pool stays attached (else destroy would leave the callback
         * behind, pointing at a freed cache). */
        pthread_mutex_lock(&cache->lock);
        cache->pools[cache->pool_count++] = pool; /* (room: it was there a moment ago) */
        pthread_mutex_unlock(&cache->lock);
        pthread_mutex_unlock(&cache->attach_lock);
        return st;
    }
    /* Evicted keys' pins that wait for their last launch would otherwise be
     * unpinned by a later tick, in a pool the caller may have destroyed. */
    pthread_mutex_lock(&cache->lock);
    retired_forget_pool_locked(cache, pool);
    pthread_mutex_unlock(&cache->lock);
    pthread_mutex_unlock(&cache->attach_lock);
    return st;
}

tp_status tp_graph_cache_prepare(tp_graph_cache *cache, uint64_t key, tp_graph graph, const tp_graph_pins *pins) {
    if (!cache || !graph) return TP_ERR_INVALID_ARGUMENT;
    tp_status st = pins_validate(pins);
    if (st != TP_OK) return st;
    pthread_mutex_lock(&cache->lock);
    uint64_t now = now_ns(cache);
    upkeep(cache, now, false);
    gc_pins newpins = {0};
    if (pins) st = pins_acquire(cache, pins, &newpins);
    if (st == TP_OK) st = prepare_locked(cache, key, graph, pins ? &newpins : NULL, now);
    pthread_mutex_unlock(&cache->lock);
    return st;
}

tp_status tp_graph_cache_launch(tp_graph_cache *cache, uint64_t key, tp_stream stream) {
    if (!cache) return TP_ERR_INVALID_ARGUMENT;
    const tpi_device_ops *ops = cache->ops;
    tp_device *dev = cache->device;
    pthread_mutex_lock(&cache->lock);
    tp_status st = TP_OK;
    gc_exec *e = current_variant(cache, key);
    if (!e) {
        tpi_logf(&dev->logger, TP_LOG_DEBUG, "graph cache: launch of key 0x%llx, which has no executable",
                (unsigned long long)key);
        st = TP_ERR_NOT_FOUND;
        goto out;
    }
    if (!e->event && (st = ops->event_create(dev, &e->event)) != TP_OK) {
        e->event = NULL;
        goto out;
    }
    bool capturing = false;
    if (ops->stream_capturing && ops->stream_capturing(dev, stream, &capturing) != TP_OK) capturing = false;
    /* Launches of one executable run one after another (as on CUDA), so the
     * event of the last covers all of them. Not into a capture: a capturing
     * stream may not wait on an event recorded outside it (CUDA refuses
     * without the external-event flag, and the capture is invalidated), and
     * the captured launch runs only when its graph does, which orders
     * nothing here. */
    if (!capturing && e->event_recorded && !e->completion_unknown && e->last_stream != stream &&
        ops->event_query(dev, e->event) != TP_OK && (st = ops->stream_wait_event(dev, stream, e->event)) != TP_OK)
        goto out;
    st = ops->graph_launch(dev, e->exec, stream);
    if (st != TP_OK) {
        tpi_logf(&dev->logger, TP_LOG_WARN, "graph cache: launching key 0x%llx failed: %s", (unsigned long long)key,
                tp_status_name(st));
        goto out;
    }
    cache->stats.launches++;
    bool reuse = e->launched_since_prepare;
    e->launched_since_prepare = true;
    touch(cache, e, reuse, now_ns(cache));
    /* Recorded into a capture, not run: an event recorded there would be a
     * node of the capture, and querying it later (a launch on another
     * stream, evict, tick) would invalidate the capture. The event keeps
     * covering the last launch that ran. */
    if (capturing) goto out;
    e->last_stream = stream;
    tp_status rec = ops->event_record(dev, e->event, stream);
    if (rec == TP_OK) {
        /* An earlier launch of unknown completion stays unknown: this one was
         * not made to wait for it, so its event does not cover it. */
        e->event_recorded = true;
    } else if (ops->stream_synchronize(dev, stream) == TP_OK) {
        /* Complete without the event: this launch, and every earlier one
         * it was ordered after (stream order, or the wait above). A device
         * synchronisation at eviction instead would invalidate whatever
         * another stream is capturing by then. */
        e->event_recorded = false;
        tpi_logf(&dev->logger, TP_LOG_WARN,
                "graph cache: recording the completion event of key 0x%llx failed (%s); waited for the stream",
                (unsigned long long)key, tp_status_name(rec));
    } else {
        if (!e->completion_unknown) e->unknown_stream = stream;
        else if (e->unknown_stream != stream) e->unknown_many = true;
        e->completion_unknown = true;
        tpi_logf(&dev->logger, TP_LOG_WARN,
                "graph cache: recording the completion event of key 0x%llx failed (%s); its eviction will "
                "synchronise the stream", (unsigned long long)key, tp_status_name(rec));
    }
out:
    pthread_mutex_unlock(&cache->lock);
    return st;
}

tp_status tp_graph_cache_run(tp_graph_cache *cache, uint64_t key, tp_graph graph, const tp_graph_pins *pins,
                             tp_stream stream) {
    tp_status st = tp_graph_cache_prepare(cache, key, graph, pins);
    if (st != TP_OK) return st;
    return tp_graph_cache_launch(cache, key, stream);
}

tp_status tp_graph_cache_evict(tp_graph_cache *cache, uint64_t key) {
    if (!cache) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&cache->lock);
    gc_exec *vars[GC_MAX_VARIANTS];
    size_t n = find_variants(cache, key, vars);
    for (size_t i = 0; i < n; i++) evict(cache, vars[i], REASON_EXPLICIT, false, NULL);
    pthread_mutex_unlock(&cache->lock);
    return n ? TP_OK : TP_ERR_NOT_FOUND;
}

tp_status tp_graph_cache_tick(tp_graph_cache *cache) {
    if (!cache) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&cache->lock);
    upkeep(cache, now_ns(cache), true);
    pthread_mutex_unlock(&cache->lock);
    return TP_OK;
}

tp_status tp_graph_cache_get_stats(tp_graph_cache *cache, tp_graph_cache_stats *out_stats) {
    if (!cache || !out_stats) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&cache->lock);
    *out_stats = cache->stats;
    out_stats->exec_bytes = cache->exec_bytes;
    pthread_mutex_unlock(&cache->lock);
    return TP_OK;
}

/* ------------------------------------------------------------------- check */

static bool check_locked(tp_graph_cache *cache, char *msg, size_t msg_capacity) {
    uint64_t execs = 0, bytes = 0, pinned = 0, indexed = 0;
    for (int s = SEG_PROBATION; s <= SEG_PROTECTED; s++) {
        const gc_list *l = &cache->seg[s];
        uint32_t count = 0;
        const gc_exec *prev = NULL;
        for (const gc_exec *e = l->head; e; e = e->next) {
            if (++count > l->count) TPI_FAIL(msg, msg_capacity, "segment %d longer than its count %u", s, l->count);
            if (e->prev != prev) TPI_FAIL(msg, msg_capacity, "segment %d: broken back link at key 0x%llx", s, (unsigned long long)e->key);
            if (e->segment != s) TPI_FAIL(msg, msg_capacity, "key 0x%llx in segment %d says %d", (unsigned long long)e->key, s, e->segment);
            if (!e->exec) TPI_FAIL(msg, msg_capacity, "key 0x%llx has no executable", (unsigned long long)e->key);
            if (e->event_recorded && !e->event) TPI_FAIL(msg, msg_capacity, "key 0x%llx: recorded without an event", (unsigned long long)e->key);
            if (e->pins.count && (!e->pins.ranges || !e->pins.pool))
                TPI_FAIL(msg, msg_capacity, "key 0x%llx: pins without ranges or pool", (unsigned long long)e->key);
            bool found = false;
            unsigned variants = 0;
            for (const gc_exec *h = variants_of(cache, e->key); h; h = h->vnext) {
                if (++variants > GC_MAX_VARIANTS)
                    TPI_FAIL(msg, msg_capacity, "key 0x%llx has more than %d variants", (unsigned long long)e->key, GC_MAX_VARIANTS);
                if (h->key != e->key)
                    TPI_FAIL(msg, msg_capacity, "key 0x%llx: its variants include key 0x%llx", (unsigned long long)e->key,
                            (unsigned long long)h->key);
                if (h == e) found = true;
                if (h != e && h->prepared_seq == e->prepared_seq)
                    TPI_FAIL(msg, msg_capacity, "key 0x%llx: two variants share a prepare number", (unsigned long long)e->key);
            }
            if (!found) TPI_FAIL(msg, msg_capacity, "key 0x%llx is not in the key index", (unsigned long long)e->key);
            execs++;
            bytes += e->bytes;
            pinned += e->pins.count;
            prev = e;
        }
        if (count != l->count) TPI_FAIL(msg, msg_capacity, "segment %d: %u entries, count says %u", s, count, l->count);
        if (prev != l->tail) TPI_FAIL(msg, msg_capacity, "segment %d: tail is not the last entry", s);
    }
    size_t cursor = 0;
    uint64_t key = 0, value = 0;
    while (tpi_map_next(&cache->index, &cursor, &key, &value)) {
        if (!value) TPI_FAIL(msg, msg_capacity, "key 0x%llx is in the key index without a variant", (unsigned long long)key);
        for (const gc_exec *h = exec_of(value); h; h = h->vnext) {
            if (h->key != key)
                TPI_FAIL(msg, msg_capacity, "key 0x%llx in the key index leads to key 0x%llx", (unsigned long long)key,
                        (unsigned long long)h->key);
            if (++indexed > execs) TPI_FAIL(msg, msg_capacity, "key index holds more executables than the lists");
        }
    }
    if (indexed != execs) TPI_FAIL(msg, msg_capacity, "key index holds %llu executables, lists %llu", (unsigned long long)indexed,
                                  (unsigned long long)execs);
    if (execs != cache->stats.execs) TPI_FAIL(msg, msg_capacity, "execs %llu, stats say %llu", (unsigned long long)execs,
                                             (unsigned long long)cache->stats.execs);
    if (bytes != cache->exec_bytes) TPI_FAIL(msg, msg_capacity, "exec bytes %llu, accounted %llu", (unsigned long long)bytes,
                                            (unsigned long long)cache->exec_bytes);
    if (execs > cache->config.max_execs) TPI_FAIL(msg, msg_capacity, "%llu execs above max_execs %u", (unsigned long long)execs,
                                                 cache->config.max_execs);
    if (cache->config.max_bytes != TP_BYTES_UNLIMITED && bytes > cache->config.max_bytes)
        TPI_FAIL(msg, msg_capacity, "%llu exec bytes above max_bytes %llu", (unsigned long long)bytes,
                (unsigned long long)cache->config.max_bytes);
    if (cache->stats.exec_bytes_peak < bytes) TPI_FAIL(msg, msg_capacity, "peak below current");
    if (cache->seg[SEG_PROTECTED].count > cache->protected_cap)
        TPI_FAIL(msg, msg_capacity, "protected holds %u, cap %u", cache->seg[SEG_PROTECTED].count, cache->protected_cap);
    for (size_t i = 0; i < cache->retired_count; i++) {
        const gc_retired *r = &cache->retired[i];
        if (!r->event || !r->pins.count || !r->pins.ranges || !r->pins.pool) TPI_FAIL(msg, msg_capacity, "retired record %zu is malformed", i);
        pinned += r->pins.count;
    }
    if (pinned != cache->stats.pinned_ranges) TPI_FAIL(msg, msg_capacity, "pinned ranges %llu, stats say %llu",
                                                      (unsigned long long)pinned,
                                                      (unsigned long long)cache->stats.pinned_ranges);
    for (size_t i = 0; i < cache->pool_count; i++)
        for (size_t k = i + 1; k < cache->pool_count; k++)
            if (cache->pools[i] == cache->pools[k]) TPI_FAIL(msg, msg_capacity, "pool attached twice");
    return true;
}

tp_status tp_graph_cache_check(tp_graph_cache *cache, char *msg, size_t msg_capacity) {
    if (!cache) return TP_ERR_INVALID_ARGUMENT;
    if (msg && msg_capacity) msg[0] = '\0';
    pthread_mutex_lock(&cache->lock);
    bool ok = check_locked(cache, msg, msg_capacity);
    pthread_mutex_unlock(&cache->lock);
    return ok ? TP_OK : TP_ERR_CORRUPT;
}
