/* SPDX-License-Identifier: MIT */
/*
 * pool_stats.h -- the statistics every layer of a pool updates, and the
 * arithmetic on them. Plain data with inline helpers: a layer that counts a
 * device call or a change of reserved bytes writes here and calls nothing.
 *
 * Two places hold them. tpi_stats is the pool's, written with the pool's
 * lock and every stream lock held (pool.c: "the world lock"). The hit path
 * (front_cache.h) runs under one stream's lock only, so it counts into that
 * stream's tpi_stats_local, which the next world lock folds in; nothing on
 * the hit path is shared and written.
 *
 * Exact peaks without a shared counter: a hit changes allocated (and
 * requested) bytes, so it could set a new peak of allocated, requested or
 * cached bytes, or a new low of allocated (the VMM backing's low water).
 * Each stream gets bounds on how far its own uncounted change may go --
 * *_up for a rise, allocated_down for a fall -- taken from the slack
 * between the pool's current figures and those peaks (and that low),
 * divided among the streams when the world lock is released
 * (tpi_stats_give_bounds). While every stream stays within its bounds the
 * sum of all changes cannot reach a new peak or low, so the peaks the pool
 * keeps are exact; a hit that would leave its bounds is not a hit, and the
 * locked path counts it directly. Totals and counters are sums: exact
 * after the fold.
 */
#ifndef TIDEPOOL_POOL_STATS_H
#define TIDEPOOL_POOL_STATS_H

#include "internal.h"

/* The user's observer (tp_pool_set_observer) and what it needs to stamp
 * events with the device's time. */
typedef struct tpi_observer {
    tp_pool_observer_fn fn; /* NULL: nobody is listening */
    void *user;
    tp_device *device;
} tpi_observer;

typedef struct tpi_stats {
    tp_pool_stats pub;
    tpi_observer observer;             /* what tp_pool_get_stats returns (the free-range figures are added on read) */
    tp_status last_device_status;  /* of the latest failed device call */
    uint64_t high_water_allocated; /* highest allocated bytes ever (peak resets keep it) */
    uint64_t allocated_low_water;  /* lowest allocated bytes since the VMM backing last grew */
    uint64_t zombie_bytes;         /* freed by the caller but kept by pins */
} tpi_stats;

/* One stream's uncounted hits (see the opening comment). Deltas are
 * two's-complement in uint64_t (current changes may be negative). */
typedef struct tpi_stats_local {
    uint64_t allocated_delta;  /* change of allocated_bytes.current */
    uint64_t requested_delta;  /* change of requested_bytes.current */
    uint64_t allocated_total, requested_total, cached_total;
    uint64_t allocs, frees, hazards; /* (every hit allocation is a cache hit) */
    int64_t allocated_up;      /* allocated_delta may rise to this ... */
    int64_t allocated_down;    /* ... and fall to this (<= 0) */
    int64_t requested_up;      /* requested_delta may rise to this */
} tpi_stats_local;

enum { TPI_DEVICE_CALL_ALLOC = 1, TPI_DEVICE_CALL_FREE = 2, TPI_DEVICE_CALL_OTHER = 3 };

static inline void tpi_stat_add(tp_stat *s, uint64_t v) {
    s->current += v;
    s->total += v;
    if (s->current > s->peak) s->peak = s->current;
}

static inline void tpi_stat_sub(tp_stat *s, uint64_t v) { s->current -= v; }

/* cached = reserved - allocated - freed-but-pinned */
static inline void tpi_stats_update_cached(tpi_stats *s) {
    tp_stat *c = &s->pub.cached_bytes;
    c->current = s->pub.reserved_bytes.current - s->pub.allocated_bytes.current - s->zombie_bytes;
    if (c->current > c->peak) c->peak = c->current;
}

static inline void tpi_stats_reserved_changed(tpi_stats *s, int64_t delta_bytes) {
    if (delta_bytes >= 0)
        tpi_stat_add(&s->pub.reserved_bytes, (uint64_t)delta_bytes);
    else
        tpi_stat_sub(&s->pub.reserved_bytes, (uint64_t)(-delta_bytes));
    tpi_stats_update_cached(s);
}

/* Folds a stream's hits into the pool's figures and clears them (bounds
 * included: the stream may hit again only within new ones). */
static inline void tpi_stats_fold(tpi_stats *s, tpi_stats_local *l) {
    tp_pool_stats *p = &s->pub;
    p->allocated_bytes.current += l->allocated_delta;
    p->allocated_bytes.total += l->allocated_total;
    p->requested_bytes.current += l->requested_delta;
    p->requested_bytes.total += l->requested_total;
    p->cached_bytes.total += l->cached_total;
    p->allocs += l->allocs;
    p->frees += l->frees;
    p->cache_hits += l->allocs;
    p->hazards += l->hazards;
    *l = (tpi_stats_local){0};
    tpi_stats_update_cached(s);
}

static inline int64_t tpi_stats_share_(uint64_t slack, uint32_t streams) {
    uint64_t share = slack / streams;
    return share > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)share;
}

/* Bounds for one of `streams` streams whose changes are all folded: each
 * gets an equal share of the slack below the peaks and above the low. */
static inline void tpi_stats_give_bounds(const tpi_stats *s, tpi_stats_local *l, uint32_t streams) {
    const tp_pool_stats *p = &s->pub;
    uint64_t allocated = p->allocated_bytes.current;
    uint64_t up = p->allocated_bytes.peak - allocated;
    uint64_t down_cached = p->cached_bytes.peak - p->cached_bytes.current;
    uint64_t down_low = allocated > s->allocated_low_water ? allocated - s->allocated_low_water : 0;
    l->allocated_up = tpi_stats_share_(up, streams);
    l->allocated_down = -tpi_stats_share_(TPI_MIN(down_cached, down_low), streams);
    l->requested_up = tpi_stats_share_(p->requested_bytes.peak - p->requested_bytes.current, streams);
}

/* Records a device call's outcome. */
static inline void tpi_stats_device_call(tpi_stats *s, tp_status status, int kind) {
    s->pub.device_calls++;
    if (status == TP_OK) {
        if (kind == TPI_DEVICE_CALL_ALLOC) s->pub.device_allocs++;
        if (kind == TPI_DEVICE_CALL_FREE) s->pub.device_frees++;
    } else {
        s->pub.device_errors++;
        s->last_device_status = status;
    }
}

/* Tells the observer, if any, what just happened. */
static inline void tpi_observe(const tpi_stats *s, tp_pool_event_kind kind, uint64_t address, uint64_t bytes,
                               tp_stream stream) {
    if (!s->observer.fn) return;
    tp_device *device = s->observer.device;
    tp_pool_event event = {kind, device->ops->now_ns(device), address, bytes, stream};
    s->observer.fn(s->observer.user, &event);
}

#endif /* TIDEPOOL_POOL_STATS_H */
