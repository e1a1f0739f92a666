/* SPDX-License-Identifier: MIT */
/*
 * pool_stats.h -- the statistics every layer of a pool updates, and the
 * arithmetic on them. Plain data with inline helpers: a layer that counts a
 * device call or a change of reserved bytes writes here and calls nothing.
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
