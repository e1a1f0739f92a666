/* SPDX-License-Identifier: MIT */
/*
 * pool_stats.h -- the statistics every layer of a pool updates, and the
 * arithmetic on them. Plain data with inline helpers: a layer that counts a
 * device call or a change of reserved bytes writes here and calls nothing.
 *
 * Two places hold them. tpi_stats is the pool's, written with the pool's
 * mutex and the world gate held (pool.c: "the world lock"). The hit path
 * (front_cache.h) runs under one stream's lock only, so it counts into that
 * stream's tpi_stats_local, which the next world lock folds in; nothing on
 * the hit path is shared and written.
 *
 * Peaks without a shared counter: a hit changes allocated (and requested)
 * bytes, so it may set a new peak of allocated, requested or cached bytes,
 * or a new low of allocated (the VMM backing's low water). Each stream
 * keeps, besides its change, the highest and lowest its change reached
 * since the last fold (rise >= 0, fall <= 0). The fold first raises the
 * peaks to the pool's figure plus the sum of the rises (and lowers the low
 * water to it plus the sum of the falls), then adds the changes. So:
 *   - a peak is never below the true one, whatever the interleaving;
 *   - it is exact when at most one stream hit between two locked calls
 *     (every single-stream program), and when the streams' highs coincide;
 *   - otherwise it may overstate by at most the sum of the streams' own
 *     rises since the last locked call (tp_pool_get_stats is one).
 * Exact peaks would need every hit to read a shared figure: a stream whose
 * share of the room below the peak ran out would take the locked path, and
 * with several threads near their peak every allocation did (measured: 8
 * threads fell to 0.04x one thread's pairs/s on the H200). Currents, totals
 * and counters are sums: exact after the fold.
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
    uint64_t high_water_reserved;  /* highest reserved bytes ever (likewise) */
    uint64_t allocated_low_water;  /* lowest allocated bytes since the VMM backing last grew */
    uint64_t zombie_bytes;         /* freed by the caller but kept by pins */
} tpi_stats;

/* One stream's uncounted hits (see the opening comment). Deltas are
 * two's-complement in uint64_t (current changes may be negative). */
typedef struct tpi_stats_local {
    uint64_t allocated_delta;  /* change of allocated_bytes.current */
    uint64_t requested_delta;  /* change of requested_bytes.current */
    /* (No allocated_total: a hit free adds to cached_total what it takes
     * from allocated_delta, so the hits allocated allocated_delta +
     * cached_total; the fold adds that.) */
    uint64_t requested_total, cached_total;
    uint64_t allocs, frees, hazards; /* (every hit allocation is a cache hit) */
    int64_t allocated_rise;    /* highest allocated_delta since the fold (>= 0) */
    int64_t allocated_fall;    /* lowest allocated_delta since the fold (<= 0) */
    int64_t requested_rise;    /* highest requested_delta since the fold (>= 0) */
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

/* Before the streams' hits are folded (tpi_stats_fold, one stream at a
 * time), the peaks and the low water take the extremes the sum of their
 * changes could have reached: rises and falls summed over every stream
 * (see the opening comment). */
static inline void tpi_stats_fold_extremes(tpi_stats *s, uint64_t allocated_rise, uint64_t allocated_fall,
                                           uint64_t requested_rise) {
    tp_pool_stats *p = &s->pub;
    uint64_t high = p->allocated_bytes.current + allocated_rise;
    if (high > p->allocated_bytes.peak) p->allocated_bytes.peak = high;
    uint64_t requested_high = p->requested_bytes.current + requested_rise;
    if (requested_high > p->requested_bytes.peak) p->requested_bytes.peak = requested_high;
    uint64_t low = p->allocated_bytes.current - allocated_fall;
    if (low < s->allocated_low_water) s->allocated_low_water = low;
    uint64_t cached_high = p->reserved_bytes.current - low - s->zombie_bytes;
    if (cached_high > p->cached_bytes.peak) p->cached_bytes.peak = cached_high;
}

/* Folds a stream's hits into the pool's figures and clears them; the
 * caller updates the cached bytes after the last stream (their peak is
 * already at least any value between two streams' folds: see
 * tpi_stats_fold_extremes). */
static inline void tpi_stats_fold(tpi_stats *s, tpi_stats_local *l) {
    tp_pool_stats *p = &s->pub;
    p->allocated_bytes.current += l->allocated_delta;
    p->allocated_bytes.total += l->allocated_delta + l->cached_total;
    p->requested_bytes.current += l->requested_delta;
    p->requested_bytes.total += l->requested_total;
    p->cached_bytes.total += l->cached_total;
    p->allocs += l->allocs;
    p->frees += l->frees;
    p->cache_hits += l->allocs;
    p->hazards += l->hazards;
    *l = (tpi_stats_local){0};
}

/* A hit's change of allocated (and requested) bytes, with its extremes. A
 * rise can only move the high and a fall only the low: every change is one
 * of these four, and the fold starts delta, high and low at 0, so the delta
 * never leaves [low, high] (changes are far below 2^63 bytes). Requested
 * bytes keep their high only. */
static inline void tpi_stats_local_allocated_rise(tpi_stats_local *l, uint64_t delta_bytes) {
    l->allocated_delta += delta_bytes;
    int64_t now = (int64_t)l->allocated_delta;
    if (now > l->allocated_rise) l->allocated_rise = now;
}

static inline void tpi_stats_local_allocated_fall(tpi_stats_local *l, uint64_t delta_bytes) {
    l->allocated_delta -= delta_bytes;
    int64_t now = (int64_t)l->allocated_delta;
    if (now < l->allocated_fall) l->allocated_fall = now;
}

static inline void tpi_stats_local_requested_rise(tpi_stats_local *l, uint64_t delta_bytes) {
    l->requested_delta += delta_bytes;
    int64_t now = (int64_t)l->requested_delta;
    if (now > l->requested_rise) l->requested_rise = now;
}

static inline void tpi_stats_local_requested_fall(tpi_stats_local *l, uint64_t delta_bytes) {
    l->requested_delta -= delta_bytes;
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
