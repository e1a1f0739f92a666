/*
 * pool.c -- what both pool kinds share: the public pool API, stream order,
 * the tcache, idle-unit release, statistics and the out-of-memory ladder.
 *
 * Allocation path
 *   1. tcache: a freed block parked per size bin (not coalesced), reused by
 *      a request of its bin on the stream that freed it. No device call, no
 *      range-allocator work: the hit path. Blocks above the tcache's size
 *      bound park in a single last-freed slot that lives only until the next
 *      allocation: reused when that allocation fits it (free X, alloc X
 *      again: the common loop), else released before the allocation looks
 *      for room, so placement sees the same free memory as without it.
 *   2. the backing's try_alloc: good fit in the range allocator among free
 *      ranges usable on the stream; the VMM backing maps pages the block
 *      lacks (under its soft cap, pool_vmm.c), the segment backing mallocs a
 *      segment when nothing fits (after releasing idle segments beyond the
 *      release threshold, tp_pool_release_before_growth).
 *   3. out of memory: the ladder (alloc_with_ladder): flush the tcache and
 *      release completed idle units, oldest first, as much as needed ->
 *      synchronise the streams holding pending frees -> release all idle
 *      units -> reclaim callbacks (graph eviction) -> retry after each step
 *      -> TP_ERR_OUT_OF_MEMORY with a report. Never aborts.
 *
 * Stream order
 *   A free on stream S tags the memory (slot(S), e) where e is the number
 *   the next event recorded on S will get: the memory is safe for other
 *   streams once that event completes. Events are recorded lazily, only when
 *   another stream wants the memory or memory is released, so single-stream
 *   use records none. Reuse on another stream T happens when the event is
 *   seen complete (query), or, failing that, after T is made to wait on the
 *   event (no host wait). Releasing memory to the device requires
 *   completion: queried on the normal path, waited for on the ladder and in
 *   trim/destroy.
 *
 * Invariants (tp_pool_check): the range allocator's own; every map entry is
 * a used node starting at its key; cached nodes are exactly the tcache
 * entries (bins plus the last-freed slot) and their bytes sum to
 * tcache_bytes; idle units are exactly the
 * LRU list and sum to idle_bytes; allocated/requested/pinned statistics
 * equal sums over the nodes; plus the backing's invariants.
 *
 * Locking: one mutex per pool around every public call. Reclaim callbacks
 * run with it released.
 */
#include "pool_internal.h"

#include <stdio.h>
#include <string.h>

/* ------------------------------------------------------------- stat math */

static inline void stat_add(tp_stat *s, uint64_t v) {
    s->current += v;
    s->total += v;
    if (s->current > s->peak) s->peak = s->current;
}
static inline void stat_sub(tp_stat *s, uint64_t v) { s->current -= v; }

static inline void update_cached(tp_pool *pool) {
    tp_stat *c = &pool->stats.cached_bytes;
    c->current = pool->stats.reserved_bytes.current - pool->stats.allocated_bytes.current - pool->zombie_bytes;
    if (c->current > c->peak) c->peak = c->current;
}

void tp_pool_reserved_changed(tp_pool *pool, int64_t delta_bytes) {
    if (delta_bytes >= 0)
        stat_add(&pool->stats.reserved_bytes, (uint64_t)delta_bytes);
    else
        stat_sub(&pool->stats.reserved_bytes, (uint64_t)(-delta_bytes));
    update_cached(pool);
}

void tp_pool_count_device_call(tp_pool *pool, tp_status status, int kind) {
    pool->stats.device_calls++;
    if (status == TP_OK) {
        if (kind == DEVICE_CALL_ALLOC) pool->stats.device_allocs++;
        if (kind == DEVICE_CALL_FREE) pool->stats.device_frees++;
    } else {
        pool->stats.device_errors++;
        pool->last_device_status = status;
    }
}

uint64_t tp_pool_now(tp_pool *pool) { return pool->ops->now_ns(pool->device); }

/* ------------------------------------------------------------ block map */

static inline size_t map_slot(const pool_map *m, uint64_t key) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (m->capacity - 1);
}

static uint32_t map_get(const pool_map *m, uint64_t key) {
    if (!m->capacity) return POOL_NONE;
    for (size_t i = map_slot(m, key);; i = (i + 1) & (m->capacity - 1)) {
        if (m->values[i] == POOL_NONE) return POOL_NONE;
        if (m->keys[i] == key) return m->values[i];
    }
}

static bool map_put(tp_pool *pool, uint64_t key, uint32_t value) {
    pool_map *m = &pool->blocks;
    if ((m->count + 1) * 2 > m->capacity) {
        size_t new_capacity = m->capacity ? m->capacity * 2 : 1024;
        uint64_t *keys = tp_host_alloc(pool->host, new_capacity * sizeof *keys);
        uint32_t *values = tp_host_alloc(pool->host, new_capacity * sizeof *values);
        if (!keys || !values) {
            tp_host_free(pool->host, keys, new_capacity * sizeof *keys);
            tp_host_free(pool->host, values, new_capacity * sizeof *values);
            return false;
        }
        memset(values, 0xff, new_capacity * sizeof *values);
        pool_map grown = {keys, values, new_capacity, 0};
        for (size_t i = 0; i < m->capacity; i++) {
            if (m->values[i] == POOL_NONE) continue;
            size_t j = map_slot(&grown, m->keys[i]);
            while (grown.values[j] != POOL_NONE) j = (j + 1) & (new_capacity - 1);
            grown.keys[j] = m->keys[i];
            grown.values[j] = m->values[i];
            grown.count++;
        }
        tp_host_free(pool->host, m->keys, m->capacity * sizeof *m->keys);
        tp_host_free(pool->host, m->values, m->capacity * sizeof *m->values);
        *m = grown;
    }
    size_t i = map_slot(m, key);
    while (m->values[i] != POOL_NONE) i = (i + 1) & (m->capacity - 1);
    m->keys[i] = key;
    m->values[i] = value;
    m->count++;
    return true;
}

static void map_del(pool_map *m, uint64_t key) {
    size_t mask = m->capacity - 1;
    size_t i = map_slot(m, key);
    while (m->values[i] != POOL_NONE && m->keys[i] != key) i = (i + 1) & mask;
    if (m->values[i] == POOL_NONE) return;
    /* backward-shift deletion keeps probe sequences unbroken */
    size_t hole = i;
    for (size_t j = (hole + 1) & mask; m->values[j] != POOL_NONE; j = (j + 1) & mask) {
        size_t home = map_slot(m, m->keys[j]);
        bool movable = (j > hole) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->keys[hole] = m->keys[j];
            m->values[hole] = m->values[j];
            hole = j;
        }
    }
    m->values[hole] = POOL_NONE;
    m->count--;
}

/* --------------------------------------------------------------- streams */

static tp_status stream_slot(tp_pool *pool, tp_stream handle, uint32_t *out_slot) {
    if (pool->last_slot && pool->last_stream == handle) {
        *out_slot = pool->last_slot;
        return TP_OK;
    }
    for (uint32_t i = 1; i < pool->stream_count; i++) {
        if (pool->streams[i].handle == handle && !pool->streams[i].retired) {
            pool->last_stream = handle;
            pool->last_slot = i;
            *out_slot = i;
            return TP_OK;
        }
    }
    if (pool->stream_count >= RA_TAG_MULTI - 1) return TP_ERR_INVALID_ARGUMENT;
    if (!tp_host_grow(pool->host, (void **)&pool->streams, sizeof *pool->streams, &pool->stream_capacity,
                      pool->stream_count + 1))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    uint32_t slot = (uint32_t)pool->stream_count++;
    memset(&pool->streams[slot], 0, sizeof pool->streams[slot]);
    pool->streams[slot].handle = handle;
    pool->streams[slot].next_epoch = 1;
    pool->stats.streams = pool->stream_count - 1;
    pool->last_stream = handle;
    pool->last_slot = slot;
    *out_slot = slot;
    return TP_OK;
}

static tp_status event_get(tp_pool *pool, tp_event *out) {
    if (pool->spare_count) {
        *out = pool->spare_events[--pool->spare_count];
        return TP_OK;
    }
    tp_status st = pool->ops->event_create(pool->device, out);
    if (st != TP_OK) tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
    return st;
}

static void event_put(tp_pool *pool, tp_event event) {
    if (tp_host_grow(pool->host, (void **)&pool->spare_events, sizeof *pool->spare_events, &pool->spare_capacity,
                     pool->spare_count + 1))
        pool->spare_events[pool->spare_count++] = event;
    else
        pool->ops->event_destroy(pool->device, event);
}

static void ring_pop(tp_pool *pool, pool_stream *s) {
    s->completed_epoch = s->ring_epochs[s->ring_head];
    event_put(pool, s->ring_events[s->ring_head]);
    s->ring_head = (s->ring_head + 1) % s->ring_capacity;
    s->ring_count--;
}

/* Learns, without waiting, which of the stream's events have completed. */
static void stream_poll(tp_pool *pool, pool_stream *s) {
    while (s->ring_count) {
        tp_status st = pool->ops->event_query(pool->device, s->ring_events[s->ring_head]);
        if (st == TP_NOT_READY) return;
        if (st != TP_OK) {
            tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
            return;
        }
        ring_pop(pool, s);
    }
}

static tp_status event_wait(tp_pool *pool, tp_event event) {
    pool->stats.synchronizations++;
    tp_status st = pool->ops->event_synchronize(pool->device, event);
    if (st != TP_OK) tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
    return st;
}

/* Records the stream's next event (numbered next_epoch). */
static tp_status stream_record(tp_pool *pool, uint32_t slot) {
    pool_stream *s = &pool->streams[slot];
    if (s->ring_count == s->ring_capacity) {
        if (s->ring_capacity >= 1024) {
            /* Too many outstanding: wait for the oldest to make room. */
            tp_status st = event_wait(pool, s->ring_events[s->ring_head]);
            if (st != TP_OK) return st;
            ring_pop(pool, s);
        } else {
            uint32_t cap = s->ring_capacity ? s->ring_capacity * 2 : 8;
            tp_event *events = tp_host_alloc(pool->host, cap * sizeof *events);
            uint64_t *epochs = tp_host_alloc(pool->host, cap * sizeof *epochs);
            if (!events || !epochs) {
                tp_host_free(pool->host, events, cap * sizeof *events);
                tp_host_free(pool->host, epochs, cap * sizeof *epochs);
                return TP_ERR_HOST_OUT_OF_MEMORY;
            }
            for (uint32_t i = 0; i < s->ring_count; i++) {
                events[i] = s->ring_events[(s->ring_head + i) % s->ring_capacity];
                epochs[i] = s->ring_epochs[(s->ring_head + i) % s->ring_capacity];
            }
            tp_host_free(pool->host, s->ring_events, s->ring_capacity * sizeof *events);
            tp_host_free(pool->host, s->ring_epochs, s->ring_capacity * sizeof *epochs);
            s->ring_events = events;
            s->ring_epochs = epochs;
            s->ring_head = 0;
            s->ring_capacity = cap;
        }
    }
    tp_event event;
    tp_status st = event_get(pool, &event);
    if (st != TP_OK) return st;
    st = pool->ops->event_record(pool->device, event, s->handle);
    if (st != TP_OK) {
        tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
        event_put(pool, event);
        return st;
    }
    uint32_t at = (s->ring_head + s->ring_count) % s->ring_capacity;
    s->ring_events[at] = event;
    s->ring_epochs[at] = s->next_epoch++;
    s->ring_count++;
    pool->stats.events_recorded++;
    return TP_OK;
}

/* Non-blocking: is the stream's event `epoch` known complete? Records it
 * first if it was never recorded. */
static bool stream_epoch_complete(tp_pool *pool, uint32_t slot, uint64_t epoch) {
    pool_stream *s = &pool->streams[slot];
    if (s->completed_epoch >= epoch) return true;
    stream_poll(pool, s);
    if (s->completed_epoch >= epoch) return true;
    if (epoch >= s->next_epoch) {
        if (stream_record(pool, slot) != TP_OK) return false;
        stream_poll(pool, s);
    }
    return s->completed_epoch >= epoch;
}

/* The recorded event that covers `epoch` (recording it if needed). */
static tp_status stream_event_for(tp_pool *pool, uint32_t slot, uint64_t epoch, tp_event *out) {
    pool_stream *s = &pool->streams[slot];
    if (epoch >= s->next_epoch) {
        tp_status st = stream_record(pool, slot);
        if (st != TP_OK) return st;
    }
    for (uint32_t i = 0; i < s->ring_count; i++) {
        uint32_t at = (s->ring_head + i) % s->ring_capacity;
        if (s->ring_epochs[at] >= epoch) {
            *out = s->ring_events[at];
            return TP_OK;
        }
    }
    return TP_ERR_INVALID_ARGUMENT; /* already complete: caller checked */
}

/* Blocking: waits until the stream's event `epoch` has completed. */
static tp_status stream_wait_epoch(tp_pool *pool, uint32_t slot, uint64_t epoch) {
    if (stream_epoch_complete(pool, slot, epoch)) return TP_OK;
    pool_stream *s = &pool->streams[slot];
    tp_event event;
    tp_status st = stream_event_for(pool, slot, epoch, &event);
    if (st != TP_OK) return st;
    st = event_wait(pool, event);
    if (st != TP_OK) return st;
    while (s->ring_count && s->ring_epochs[s->ring_head] <= epoch) ring_pop(pool, s);
    if (s->completed_epoch < epoch) s->completed_epoch = epoch;
    return TP_OK;
}

static void full_sync_done(tp_pool *pool) {
    pool->full_sync_generation++;
    pool->ra.multi_epoch = pool->full_sync_generation + 1;
}

/* Non-blocking: have all frees on all streams completed? */
static bool all_frees_complete(tp_pool *pool) {
    for (uint32_t slot = 1; slot < pool->stream_count; slot++) {
        pool_stream *s = &pool->streams[slot];
        if (s->last_free_epoch > s->completed_epoch && !stream_epoch_complete(pool, slot, s->last_free_epoch))
            return false;
    }
    full_sync_done(pool);
    return true;
}

/* Blocking: waits for every free on every stream. Returns whether anything
 * was pending in *out_waited. */
static tp_status sync_pending_frees(tp_pool *pool, bool *out_waited) {
    bool waited = false;
    for (uint32_t slot = 1; slot < pool->stream_count; slot++) {
        pool_stream *s = &pool->streams[slot];
        if (s->last_free_epoch <= s->completed_epoch) continue;
        waited = true;
        tp_status st = stream_wait_epoch(pool, slot, s->last_free_epoch);
        if (st != TP_OK) return st;
    }
    full_sync_done(pool);
    if (out_waited) *out_waited = waited;
    return TP_OK;
}

bool tp_pool_tag_complete(tp_pool *pool, tp_tag tag) {
    if (tag.slot == RA_TAG_CLEAN) return true;
    if (tag.slot == RA_TAG_MULTI) return pool->full_sync_generation >= tag.epoch || all_frees_complete(pool);
    return stream_epoch_complete(pool, tag.slot, tag.epoch);
}

static tp_status tag_wait(tp_pool *pool, tp_tag tag) {
    if (tag.slot == RA_TAG_CLEAN) return TP_OK;
    if (tag.slot == RA_TAG_MULTI) {
        if (pool->full_sync_generation >= tag.epoch) return TP_OK;
        return sync_pending_frees(pool, NULL);
    }
    return stream_wait_epoch(pool, tag.slot, tag.epoch);
}

/* ------------------------------------------------------ finding a range */

typedef struct usable_ctx {
    tp_pool *pool;
    uint32_t slot;
    tp_ra_accept_fn filter;
    void *filter_ctx;
    uint32_t wait_candidate; /* passed the filter, blocked only by another stream */
} usable_ctx;

/* Usable on the stream first, then the backing's filter: the filter only
 * ever sees ranges the stream may use, so a backing may remember what it
 * was shown. */
static bool accept_usable(void *c, tp_ra *ra, uint32_t id) {
    usable_ctx *ctx = c;
    tp_ra_node *n = tp_ra_node_at(ra, id);
    if (n->tag.slot != RA_TAG_CLEAN && n->tag.slot != ctx->slot) {
        if (!tp_pool_tag_complete(ctx->pool, n->tag)) {
            if (ctx->wait_candidate == RA_NONE && n->tag.slot != RA_TAG_MULTI) ctx->wait_candidate = id;
            return false;
        }
        n->tag = (tp_tag){RA_TAG_CLEAN, 0};
    }
    return !ctx->filter || ctx->filter(ctx->filter_ctx, ra, id);
}

tp_status tp_pool_order_after(tp_pool *pool, uint32_t slot, tp_tag tag) {
    tp_event event;
    tp_status st = stream_event_for(pool, tag.slot, tag.epoch, &event);
    if (st != TP_OK) return st;
    st = pool->ops->stream_wait_event(pool->device, pool->streams[slot].handle, event);
    if (st != TP_OK) {
        tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
        return st;
    }
    pool->stats.cross_stream_waits++;
    return TP_OK;
}

bool tp_pool_tag_usable(tp_pool *pool, tp_tag *tag, uint32_t slot) {
    if (tag->slot == RA_TAG_CLEAN || tag->slot == slot) return true;
    if (!tp_pool_tag_complete(pool, *tag)) return false;
    *tag = (tp_tag){RA_TAG_CLEAN, 0};
    return true;
}

uint32_t tp_pool_find_usable(tp_pool *pool, uint64_t size, uint32_t slot, tp_ra_accept_fn filter, void *filter_ctx) {
    usable_ctx ctx = {pool, slot, filter, filter_ctx, RA_NONE};
    uint32_t id = tp_ra_find(&pool->ra, size, accept_usable, &ctx, 16, NULL);
    if (id != RA_NONE || ctx.wait_candidate == RA_NONE) return id;
    /* Only ranges another stream may still use: order this stream after
     * that stream's event instead of waiting on the host. */
    if (tp_pool_order_after(pool, slot, tp_ra_node_at(&pool->ra, ctx.wait_candidate)->tag) != TP_OK) return RA_NONE;
    return ctx.wait_candidate;
}

/* ----------------------------------------------------------------- units */

uint32_t tp_pool_unit_new(tp_pool *pool) {
    if (pool->unused_units == POOL_NONE) {
        size_t old = pool->unit_capacity;
        if (!tp_host_grow(pool->host, (void **)&pool->units, sizeof *pool->units, &pool->unit_capacity, old + 1))
            return POOL_NONE;
        for (size_t i = pool->unit_capacity; i-- > old;) {
            pool->units[i].state = UNIT_UNUSED;
            pool->units[i].lru_next = pool->unused_units;
            pool->unused_units = (uint32_t)i;
        }
    }
    uint32_t u = pool->unused_units;
    pool->unused_units = pool->units[u].lru_next;
    memset(&pool->units[u], 0, sizeof pool->units[u]);
    pool->units[u].lru_prev = pool->units[u].lru_next = POOL_NONE;
    pool->units[u].idle_node = RA_NONE;
    pool->units[u].state = UNIT_BUSY;
    pool->unit_count++;
    return u;
}

void tp_pool_unit_recycle(tp_pool *pool, uint32_t u) {
    pool->units[u].state = UNIT_UNUSED;
    pool->units[u].lru_next = pool->unused_units;
    pool->unused_units = u;
    pool->unit_count--;
}

void tp_pool_lru_unlink(tp_pool *pool, uint32_t u) {
    pool_unit *unit = &pool->units[u];
    if (unit->lru_prev != POOL_NONE)
        pool->units[unit->lru_prev].lru_next = unit->lru_next;
    else
        pool->lru_head = unit->lru_next;
    if (unit->lru_next != POOL_NONE)
        pool->units[unit->lru_next].lru_prev = unit->lru_prev;
    else
        pool->lru_tail = unit->lru_prev;
    unit->lru_prev = unit->lru_next = POOL_NONE;
    pool->idle_bytes -= unit->bytes;
}

void tp_pool_lru_append(tp_pool *pool, uint32_t u, uint64_t now) {
    pool_unit *unit = &pool->units[u];
    unit->idle_since_ns = now;
    unit->lru_prev = pool->lru_tail;
    unit->lru_next = POOL_NONE;
    if (pool->lru_tail != POOL_NONE)
        pool->units[pool->lru_tail].lru_next = u;
    else
        pool->lru_head = u;
    pool->lru_tail = u;
    pool->idle_bytes += unit->bytes;
}

void tp_pool_unit_became_idle(tp_pool *pool, uint32_t u) {
    pool->units[u].state = UNIT_IDLE;
    uint64_t since = pool->idle_stamp_ns;
    if (!since) {
        since = tp_pool_now(pool);
    } else if (pool->lru_tail != POOL_NONE && pool->units[pool->lru_tail].idle_since_ns > since) {
        since = pool->units[pool->lru_tail].idle_since_ns; /* keep the list in idle order */
    }
    tp_pool_lru_append(pool, u, since);
}

void tp_pool_unit_became_busy(tp_pool *pool, uint32_t u) {
    tp_pool_lru_unlink(pool, u);
    pool->units[u].state = UNIT_BUSY;
}

/* Gives one idle unit back to the device if its last use has completed
 * (waiting for it when blocking); neighbours idle since idle_before_ns may
 * go along, up to max_bytes in all. */
static tp_status release_unit(tp_pool *pool, uint32_t u, bool blocking, uint64_t idle_before_ns, uint64_t max_bytes) {
    pool_unit *unit = &pool->units[u];
    if (!tp_pool_tag_complete(pool, unit->tag)) {
        if (!blocking) return TP_NOT_READY;
        tp_status st = tag_wait(pool, unit->tag);
        if (st != TP_OK) return st;
    }
    unit->tag = (tp_tag){RA_TAG_CLEAN, 0};
    tp_pool_lru_unlink(pool, u);
    tp_status st = pool->backend->release_unit(pool, u, idle_before_ns, max_bytes);
    if (st != TP_OK) {
        tp_logf(&pool->device->logger, TP_LOG_WARN, "pool: giving %llu bytes back to the device failed: %s",
                (unsigned long long)unit->bytes, tp_status_name(st));
        tp_pool_lru_append(pool, u, tp_pool_now(pool)); /* keep it; try again later */
    }
    return st;
}

/* Releases idle units, oldest first, until want_bytes are released or idle
 * bytes are down to keep_bytes. min_idle_ns > 0 skips units idle for less. */
static uint64_t release_idle(tp_pool *pool, uint64_t want_bytes, bool blocking, uint64_t min_idle_ns,
                             uint64_t keep_bytes) {
    uint64_t released = 0;
    uint64_t now = min_idle_ns ? tp_pool_now(pool) : 0;
    size_t budget = pool->unit_count;
    for (uint32_t u = pool->lru_head; u != POOL_NONE && budget-- > 0;) {
        if (released >= want_bytes || pool->idle_bytes <= keep_bytes) break;
        uint32_t next = pool->units[u].lru_next;
        if (min_idle_ns && now - pool->units[u].idle_since_ns < min_idle_ns) break;
        uint64_t reserved = pool->stats.reserved_bytes.current;
        uint64_t excess = pool->idle_bytes - keep_bytes;
        release_unit(pool, u, blocking, min_idle_ns ? now - min_idle_ns : UINT64_MAX,
                     TP_MIN(want_bytes - released, excess));
        released += reserved - pool->stats.reserved_bytes.current;
        /* A backing may release neighbours too, next among them. */
        if (next != POOL_NONE && pool->units[next].state != UNIT_IDLE) next = pool->lru_head;
        u = next;
    }
    return released;
}

void tp_pool_release_idle_down_to(tp_pool *pool, uint64_t target_reserved_bytes, uint64_t min_idle_ns) {
    uint64_t reserved = pool->stats.reserved_bytes.current;
    if (reserved > target_reserved_bytes) release_idle(pool, reserved - target_reserved_bytes, false, min_idle_ns, 0);
}

void tp_pool_release_before_growth(tp_pool *pool, uint64_t grow_bytes) {
    uint64_t threshold = pool->config.release_threshold_bytes;
    if (pool->idle_bytes + grow_bytes <= threshold || threshold == TP_BYTES_UNLIMITED) return;
    uint64_t keep = threshold > grow_bytes ? threshold - grow_bytes : 0;
    /* Units of at least 1/8 of the growth first: they are what the growth
     * replaces, and each call returns a lot. Small ones (the small-block
     * segments a workload reuses every step) go only if that was not
     * enough. Completed ones only, oldest first within each pass. */
    uint64_t min_bytes = grow_bytes / 8;
    size_t budget = pool->unit_count;
    for (uint32_t u = pool->lru_head; u != POOL_NONE && budget-- > 0 && pool->idle_bytes > keep;) {
        uint32_t next = pool->units[u].lru_next;
        if (pool->units[u].bytes >= min_bytes) release_unit(pool, u, false, UINT64_MAX, pool->idle_bytes - keep);
        if (next != POOL_NONE && pool->units[next].state != UNIT_IDLE) next = pool->lru_head;
        u = next;
    }
    release_idle(pool, UINT64_MAX, false, 0, keep);
}

/* Cold memory -- idle for longer than idle_release_ns -- beyond the release
 * threshold goes back, oldest first (non-blocking; rate-limited by
 * next_aged_check_ns unless forced). Only cold memory counts against the
 * threshold: between the steps of a workload all its memory is idle for a
 * moment, and that working set must not be mistaken for a cache to trim. */
static void release_aged(tp_pool *pool, bool force) {
    uint64_t delay = pool->config.idle_release_ns;
    uint64_t threshold = pool->config.release_threshold_bytes;
    if (delay == TP_NS_NEVER || pool->idle_bytes <= threshold) return;
    uint64_t now = tp_pool_now(pool);
    if (!force && now < pool->next_aged_check_ns) return;
    uint64_t cold = 0;
    for (uint32_t u = pool->lru_head; u != POOL_NONE && now - pool->units[u].idle_since_ns >= delay;
         u = pool->units[u].lru_next)
        cold += pool->units[u].bytes;
    if (cold > threshold) release_idle(pool, cold - threshold, false, delay, 0);
    uint32_t head = pool->lru_head;
    if (head != POOL_NONE && now - pool->units[head].idle_since_ns < delay)
        pool->next_aged_check_ns = pool->units[head].idle_since_ns + delay;
    else
        pool->next_aged_check_ns = now + TP_MAX(delay / 16, 1);
}

/* Every POOL_UPKEEP_FREES frees: idle memory above the threshold that has
 * aged goes back; at most every idle_release_ns / 2 the tcache is flushed
 * first, so parked blocks cannot keep a unit busy forever. */
static void upkeep(tp_pool *pool) {
    pool->frees_since_upkeep = 0;
    if (pool->config.idle_release_ns == TP_NS_NEVER) return;
    uint64_t now = tp_pool_now(pool);
    if (now - pool->last_upkeep_ns >= pool->config.idle_release_ns / 2) {
        pool->last_upkeep_ns = now;
        tp_pool_tcache_flush(pool);
        release_aged(pool, true);
    } else if (pool->idle_bytes > pool->config.release_threshold_bytes) {
        release_aged(pool, false);
    }
}

/* ---------------------------------------------------------------- tcache */

void tp_pool_release_block(tp_pool *pool, uint32_t id, tp_tag tag) {
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    uint64_t offset = n->offset, size = n->size;
    n->flags = 0;
    uint32_t merged = tp_ra_release(&pool->ra, id, tag);
    pool->backend->after_release(pool, offset, size, merged, tag);
}

/* May the parked block n be handed out again in place? Only where
 * good-fit placement would choose the same address had n been released:
 * n has no free range before it (release would merge backwards), and the
 * free range F after it, if any, leaves no better fit: the first non-empty
 * bin at or above n's, F itself aside, is at or above the bin of n + F.
 * So the free X / alloc X loop skips the range allocator without changing
 * where blocks go. */
static bool reuse_in_place(tp_ra *ra, const tp_ra_node *n) {
    if (n->addr_prev != RA_NONE && tp_ra_node_at(ra, n->addr_prev)->state == RA_NODE_FREE) return false;
    if (n->addr_next == RA_NONE) return true;
    const tp_ra_node *f = tp_ra_node_at(ra, n->addr_next);
    if (f->state != RA_NODE_FREE) return true;
    uint32_t bin = tp_ra_bin_floor(ra, n->size);
    uint32_t first = tp_ra_next_nonempty_bin(ra, bin);
    if (first != RA_NONE && first == f->bin && ra->heads[first] == n->addr_next && f->list_next == RA_NONE)
        first = tp_ra_next_nonempty_bin(ra, first + 1); /* F alone in its bin: look past it */
    return first == RA_NONE || first >= tp_ra_bin_floor(ra, n->size + f->size);
}

/* Returns the last-freed block, if any, to the range allocator; units it
 * leaves idle count as idle since the block was freed. */
static void last_freed_release(tp_pool *pool) {
    uint32_t id = pool->last_freed;
    if (id == RA_NONE) return;
    pool->last_freed = RA_NONE;
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    pool->tcache_bytes -= n->size;
    map_del(&pool->blocks, n->offset);
    pool->idle_stamp_ns = pool->last_freed_ns ? pool->last_freed_ns : 1;
    tp_pool_release_block(pool, id, n->tag);
    pool->idle_stamp_ns = 0;
}

static bool tcache_push(tp_pool *pool, uint32_t id) {
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    if (n->size > pool->tcache_max_block_bytes) {
        last_freed_release(pool);
        pool->last_freed = id;
        pool->last_freed_ns = tp_pool_now(pool);
        pool->tcache_bytes += n->size;
        n->flags |= NODE_CACHED;
        return true;
    }
    if (pool->tcache_bytes + n->size > pool->tcache_limit_bytes) return false;
    uint32_t bin = tp_ra_bin_floor(&pool->ra, n->size);
    uint8_t count = pool->tcache_count[bin];
    if (count == POOL_TCACHE_DEPTH) return false;
    pool->tcache[bin][count] = id;
    pool->tcache_count[bin] = (uint8_t)(count + 1);
    pool->tcache_bytes += n->size;
    n->flags |= NODE_CACHED;
    return true;
}

/* A parked block of bin(size) or the next bin, freed on slot, that holds
 * size bytes and wastes at most 1/8 of them. */
static uint32_t tcache_pop(tp_pool *pool, uint64_t size, uint32_t slot) {
    if (size > pool->tcache_max_block_bytes || pool->last_freed != RA_NONE) {
        uint32_t id = pool->last_freed;
        if (id == RA_NONE) return RA_NONE;
        tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
        if (n->size == size && n->tag.slot == slot && reuse_in_place(&pool->ra, n)) {
            pool->last_freed = RA_NONE;
            pool->tcache_bytes -= n->size;
            n->flags &= ~NODE_CACHED;
            return id;
        }
        last_freed_release(pool);
        if (size > pool->tcache_max_block_bytes) return RA_NONE;
    }
    uint32_t bin = tp_ra_bin_floor(&pool->ra, size);
    for (uint32_t b = bin; b <= bin + 1 && b < RA_BIN_COUNT; b++) {
        uint8_t count = pool->tcache_count[b];
        if (!count) continue;
        uint32_t id = pool->tcache[b][count - 1];
        tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
        if (n->size < size || n->size - size > size / 8 || n->tag.slot != slot) continue;
        pool->tcache_count[b] = (uint8_t)(count - 1);
        pool->tcache_bytes -= n->size;
        n->flags &= ~NODE_CACHED;
        return id;
    }
    return RA_NONE;
}

uint64_t tp_pool_tcache_flush(tp_pool *pool) {
    if (!pool->tcache_bytes) return 0;
    uint64_t flushed = pool->tcache_bytes;
    last_freed_release(pool);
    for (uint32_t bin = 0; bin < RA_BIN_COUNT; bin++) {
        for (uint8_t i = 0; i < pool->tcache_count[bin]; i++) {
            uint32_t id = pool->tcache[bin][i];
            tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
            map_del(&pool->blocks, n->offset);
            tp_pool_release_block(pool, id, n->tag);
        }
        pool->tcache_count[bin] = 0;
    }
    pool->tcache_bytes = 0;
    return flushed;
}

/* ------------------------------------------------------------ the ladder */

static void fill_oom_report(tp_pool *pool, uint64_t request_bytes, tp_status device_status) {
    tp_oom_report *r = &pool->oom_report;
    memset(r, 0, sizeof *r);
    uint64_t device_free = 0, device_total = 0;
    if (pool->ops->mem_info(pool->device, &device_free, &device_total) != TP_OK) device_total = pool->device->info.capacity_bytes;
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    pool->backend->free_figures(pool, &free_bytes, &largest, &ranges);
    r->request_bytes = request_bytes;
    r->limit_bytes = pool->config.limit_bytes;
    r->capacity_bytes = device_total;
    r->device_free_bytes = device_free;
    r->allocated_bytes = pool->stats.allocated_bytes.current;
    r->reserved_bytes = pool->stats.reserved_bytes.current;
    r->cached_bytes = pool->stats.cached_bytes.current;
    r->pinned_bytes = pool->stats.pinned_bytes.current;
    r->largest_free_bytes = largest;
    r->fragmentation = free_bytes ? 1.0 - (double)largest / (double)free_bytes : 0.0;
    r->device_status = device_status;
    char req[32], lim[32], cap[32], dfree[32], used[32], res[32], cached[32], pinned[32], big[32];
    snprintf(r->message, sizeof r->message,
             "out of memory: request %s; pool limit %s; device %s total, %s free; in use %s; reserved %s; "
             "cached %s; pinned %s; largest free range %s; fragmentation %.3f; last device status %s",
             tp_format_bytes(request_bytes, req, sizeof req), tp_format_bytes(r->limit_bytes, lim, sizeof lim),
             tp_format_bytes(device_total, cap, sizeof cap), tp_format_bytes(device_free, dfree, sizeof dfree),
             tp_format_bytes(r->allocated_bytes, used, sizeof used), tp_format_bytes(r->reserved_bytes, res, sizeof res),
             tp_format_bytes(r->cached_bytes, cached, sizeof cached), tp_format_bytes(r->pinned_bytes, pinned, sizeof pinned),
             tp_format_bytes(largest, big, sizeof big), r->fragmentation, tp_status_name(device_status));
    pool->has_oom_report = true;
    tp_logf(&pool->device->logger, TP_LOG_WARN, "%s", r->message);
}

static uint64_t run_reclaimers(tp_pool *pool, uint64_t need) {
    uint64_t reclaimed = 0;
    size_t count = pool->reclaimer_count;
    if (!count) return 0;
    pool_reclaimer local[16];
    if (count > 16) count = 16;
    memcpy(local, pool->reclaimers, count * sizeof *local);
    pool->reclaims_in_flight++; /* tp_pool_remove_reclaim_callback waits for us */
    pthread_mutex_unlock(&pool->lock);
    for (size_t i = 0; i < count; i++) reclaimed += local[i].fn(local[i].user, pool, need);
    pthread_mutex_lock(&pool->lock);
    if (--pool->reclaims_in_flight == 0) pthread_cond_broadcast(&pool->reclaims_done);
    pool->stats.reclaim_calls += count;
    return reclaimed;
}

static tp_status alloc_with_ladder(tp_pool *pool, uint64_t size, uint32_t slot, uint32_t *out_node) {
    uint64_t need = 0;
    pool->last_device_status = TP_OK;
    tp_status st = pool->backend->try_alloc(pool, size, slot, out_node, &need);
    for (int step = 1; st == TP_ERR_OUT_OF_MEMORY && step <= 4; step++) {
        bool progress = false;
        switch (step) {
        case 1: /* idle cache whose last use completed, oldest first, as much as needed */
            progress = tp_pool_tcache_flush(pool) > 0;
            progress |= release_idle(pool, need ? need : size, false, 0, 0) > 0;
            break;
        case 2: { /* wait for the streams that hold pending frees */
            bool waited = false;
            if (sync_pending_frees(pool, &waited) == TP_OK) progress = waited;
            break;
        }
        case 3: /* everything idle */
            progress = release_idle(pool, UINT64_MAX, true, 0, 0) > 0;
            break;
        case 4: /* the owners of other memory: graph caches and the like */
            if (run_reclaimers(pool, need ? need : size) > 0 || pool->reclaimer_count) {
                tp_pool_tcache_flush(pool);
                release_idle(pool, UINT64_MAX, true, 0, 0);
                progress = true;
            }
            break;
        }
        if (!progress) continue;
        pool->stats.oom_retries++;
        st = pool->backend->try_alloc(pool, size, slot, out_node, &need);
    }
    return st;
}

/* -------------------------------------------------------------- lifecycle */

static tp_status resolve_config(tp_device *device, const tp_pool_config *in, tp_pool_config *out) {
    *out = in ? *in : (tp_pool_config){0};
    const tp_device_info *info = &device->info;
    if (out->kind == TP_POOL_AUTO) out->kind = info->vmm_enabled ? TP_POOL_VMM : TP_POOL_SEGMENT;
    if (out->kind != TP_POOL_VMM && out->kind != TP_POOL_SEGMENT) return TP_ERR_INVALID_ARGUMENT;
    if (out->kind == TP_POOL_VMM && !info->vmm_enabled) return TP_ERR_UNSUPPORTED;
    if (!out->limit_bytes) out->limit_bytes = info->capacity_bytes;
    if (!out->release_threshold_bytes) out->release_threshold_bytes = out->kind == TP_POOL_VMM ? 64 * TP_MiB : 16 * TP_MiB;
    if (!out->idle_release_ns) out->idle_release_ns = 10000000000ull;
    if (!out->alignment_bytes) out->alignment_bytes = 256;
    if (!tp_is_pow2(out->alignment_bytes) || out->alignment_bytes < 256) return TP_ERR_INVALID_ARGUMENT;
    if (!out->page_bytes) out->page_bytes = info->granularity_bytes;
    if (!tp_is_pow2(out->page_bytes) || out->page_bytes % info->granularity_bytes) return TP_ERR_INVALID_ARGUMENT;
    if (!out->max_map_bytes) out->max_map_bytes = TP_GiB;
    out->max_map_bytes = tp_align_up(TP_MAX(out->max_map_bytes, out->page_bytes), out->page_bytes);
    if (!out->va_reserve_bytes) out->va_reserve_bytes = out->limit_bytes > UINT64_MAX / 4 ? out->limit_bytes : 2 * out->limit_bytes;
    out->va_reserve_bytes = tp_align_up(TP_MAX(out->va_reserve_bytes, out->limit_bytes), out->page_bytes);
    if (!out->small_segment_bytes) out->small_segment_bytes = 2 * TP_MiB;
    if (!out->medium_segment_bytes) out->medium_segment_bytes = 20 * TP_MiB;
    if (!out->growth_step_percent) out->growth_step_percent = 6;
    if (!out->tcache_max_block_bytes)
        out->tcache_max_block_bytes = out->kind == TP_POOL_VMM ? POOL_TCACHE_MAX_BLOCK_VMM : POOL_TCACHE_MAX_BLOCK;
    if (out->small_segment_bytes % out->alignment_bytes || out->medium_segment_bytes % out->alignment_bytes)
        return TP_ERR_INVALID_ARGUMENT;
    return TP_OK;
}

tp_status tp_pool_create(tp_device *device, const tp_pool_config *config, tp_pool **out_pool) {
    if (!device || !out_pool) return TP_ERR_INVALID_ARGUMENT;
    *out_pool = NULL;
    tp_pool_config resolved;
    tp_status st = resolve_config(device, config, &resolved);
    if (st != TP_OK) {
        tp_logf(&device->logger, TP_LOG_ERROR, "tp_pool_create: invalid config (%s)", tp_status_name(st));
        return st;
    }
    tp_pool *pool = tp_host_calloc(&device->host, 1, sizeof *pool);
    if (!pool) return TP_ERR_HOST_OUT_OF_MEMORY;
    pool->device = device;
    pool->ops = device->ops;
    pool->host = &device->host;
    pool->config = resolved;
    pool->backend = resolved.kind == TP_POOL_VMM ? &tp_vmm_backend : &tp_segment_backend;
    pool->unused_units = POOL_NONE;
    pool->lru_head = pool->lru_tail = POOL_NONE;
    pool->stream_count = 1; /* slot 0 means "no stream" */
    pool->stream_capacity = 0;
    /* The segment pool parks blocks up to 64 MiB. The VMM pool parks only
     * small ones: a parked block keeps its pages busy, and large ones would
     * pin pages that a request of another size could use without mapping.
     * Larger blocks use the one last-freed slot, emptied by the next
     * allocation. */
    pool->tcache_max_block_bytes = resolved.tcache_max_block_bytes;
    pool->last_freed = RA_NONE;
    pool->tcache_limit_bytes = TP_MIN(resolved.release_threshold_bytes,
                                      resolved.kind == TP_POOL_VMM ? 32 * TP_MiB : 256 * TP_MiB);
    pool->stats.kind = resolved.kind;
    pool->stats.limit_bytes = resolved.limit_bytes;
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        tp_host_free(&device->host, pool, sizeof *pool);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    if (pthread_cond_init(&pool->reclaims_done, NULL) != 0) {
        pthread_mutex_destroy(&pool->lock);
        tp_host_free(&device->host, pool, sizeof *pool);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    st = TP_ERR_HOST_OUT_OF_MEMORY;
    if (!tp_host_grow(pool->host, (void **)&pool->streams, sizeof *pool->streams, &pool->stream_capacity, 4)) goto fail;
    memset(&pool->streams[0], 0, sizeof pool->streams[0]);
    pool->tcache = tp_host_calloc(pool->host, RA_BIN_COUNT, sizeof *pool->tcache);
    pool->tcache_count = tp_host_calloc(pool->host, RA_BIN_COUNT, 1);
    if (!pool->tcache || !pool->tcache_count) goto fail;
    st = tp_ra_init(&pool->ra, pool->host, resolved.alignment_bytes);
    if (st != TP_OK) goto fail;
    pool->ra.multi_epoch = 1;
    st = pool->backend->init(pool);
    if (st != TP_OK) {
        tp_ra_destroy(&pool->ra);
        goto fail;
    }
    atomic_fetch_add(&device->users, 1);
    *out_pool = pool;
    return TP_OK;
fail:
    tp_host_free(pool->host, pool->tcache, RA_BIN_COUNT * sizeof *pool->tcache);
    tp_host_free(pool->host, pool->tcache_count, RA_BIN_COUNT);
    tp_host_free(pool->host, pool->streams, pool->stream_capacity * sizeof *pool->streams);
    pthread_cond_destroy(&pool->reclaims_done);
    pthread_mutex_destroy(&pool->lock);
    tp_host_free(&device->host, pool, sizeof *pool);
    return st;
}

tp_status tp_pool_destroy(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tp_device *device = pool->device;
    const tp_host *host = pool->host;
    tp_status result = TP_OK;
    pthread_mutex_lock(&pool->lock);
    tp_pool_tcache_flush(pool);
    /* Queued work on any stream the pool has seen may still use its memory. */
    for (uint32_t slot = 1; slot < pool->stream_count; slot++) {
        if (pool->streams[slot].retired) continue;
        tp_status st = pool->ops->stream_synchronize(device, pool->streams[slot].handle);
        pool->stats.synchronizations++;
        if (st != TP_OK) {
            tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
            result = st;
        }
    }
    if (pool->ra.used_count)
        tp_logf(&device->logger, TP_LOG_WARN, "tp_pool_destroy: %llu blocks still live (%llu bytes) are released",
                (unsigned long long)pool->ra.used_count, (unsigned long long)pool->stats.allocated_bytes.current);
    pool->backend->destroy(pool);
    for (uint32_t slot = 1; slot < pool->stream_count; slot++) {
        pool_stream *s = &pool->streams[slot];
        for (uint32_t i = 0; i < s->ring_count; i++)
            pool->ops->event_destroy(device, s->ring_events[(s->ring_head + i) % s->ring_capacity]);
        tp_host_free(host, s->ring_events, s->ring_capacity * sizeof *s->ring_events);
        tp_host_free(host, s->ring_epochs, s->ring_capacity * sizeof *s->ring_epochs);
        tp_host_free(host, s->captured, s->captured_capacity * sizeof *s->captured);
    }
    for (size_t i = 0; i < pool->spare_count; i++) pool->ops->event_destroy(device, pool->spare_events[i]);
    tp_host_free(host, pool->spare_events, pool->spare_capacity * sizeof *pool->spare_events);
    tp_host_free(host, pool->streams, pool->stream_capacity * sizeof *pool->streams);
    tp_host_free(host, pool->units, pool->unit_capacity * sizeof *pool->units);
    tp_host_free(host, pool->reclaimers, pool->reclaimer_capacity * sizeof *pool->reclaimers);
    tp_host_free(host, pool->blocks.keys, pool->blocks.capacity * sizeof *pool->blocks.keys);
    tp_host_free(host, pool->blocks.values, pool->blocks.capacity * sizeof *pool->blocks.values);
    tp_host_free(host, pool->tcache, RA_BIN_COUNT * sizeof *pool->tcache);
    tp_host_free(host, pool->tcache_count, RA_BIN_COUNT);
    tp_ra_destroy(&pool->ra);
    pthread_mutex_unlock(&pool->lock);
    pthread_cond_destroy(&pool->reclaims_done);
    pthread_mutex_destroy(&pool->lock);
    tp_host_free(host, pool, sizeof *pool);
    atomic_fetch_sub(&device->users, 1);
    return result;
}

/* ------------------------------------------------------ alloc and free */

static tp_status capture_note(tp_pool *pool, pool_stream *s, tp_ra_node *n) {
    if (!tp_host_grow(pool->host, (void **)&s->captured, sizeof *s->captured, &s->captured_capacity,
                      s->captured_count + 1))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    s->captured[s->captured_count++] = (tp_range){n->offset, n->size};
    n->pins = 1;
    n->flags |= NODE_CAPTURED;
    stat_add(&pool->stats.pinned_bytes, n->size);
    return TP_OK;
}

static void check_invariants_if_asked(tp_pool *pool) {
    if (!(pool->config.flags & TP_POOL_FLAG_CHECK_INVARIANTS)) return;
    char msg[256];
    pthread_mutex_unlock(&pool->lock);
    tp_status st = tp_pool_check(pool, msg, sizeof msg);
    pthread_mutex_lock(&pool->lock);
    if (st != TP_OK) tp_logf(&pool->device->logger, TP_LOG_ERROR, "pool invariant violated: %s", msg);
}

tp_status tp_pool_alloc(tp_pool *pool, size_t bytes, tp_stream stream, void **out_ptr) {
    if (!out_ptr) return TP_ERR_INVALID_ARGUMENT;
    *out_ptr = NULL;
    if (!pool || bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    uint64_t align = pool->config.alignment_bytes;
    if ((uint64_t)bytes > UINT64_MAX - align) return TP_ERR_INVALID_ARGUMENT;
    uint64_t size = tp_align_up(bytes, align);

    pthread_mutex_lock(&pool->lock);
    uint32_t slot;
    tp_status st = stream_slot(pool, stream, &slot);
    if (st != TP_OK) goto out;
    uint32_t id = tcache_pop(pool, size, slot);
    if (id != RA_NONE) {
        pool->stats.cache_hits++;
    } else {
        if (size > pool->config.limit_bytes) {
            st = TP_ERR_OUT_OF_MEMORY;
        } else {
            uint64_t device_allocs = pool->stats.device_allocs;
            st = alloc_with_ladder(pool, size, slot, &id);
            if (st == TP_OK && pool->stats.device_allocs == device_allocs) pool->stats.cache_hits++;
            if (st == TP_OK && !map_put(pool, tp_ra_node_at(&pool->ra, id)->offset, id)) {
                tp_pool_release_block(pool, id, (tp_tag){slot, pool->streams[slot].next_epoch});
                st = TP_ERR_HOST_OUT_OF_MEMORY;
            }
        }
        if (st != TP_OK) {
            if (st == TP_ERR_OUT_OF_MEMORY) {
                pool->stats.ooms++;
                fill_oom_report(pool, bytes, pool->last_device_status);
            }
            goto out;
        }
    }
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    n->requested = bytes;
    n->alloc_slot = slot;
    n->flags = 0;
    n->pins = 0;
    pool->stats.allocs++;
    stat_add(&pool->stats.requested_bytes, bytes);
    stat_add(&pool->stats.allocated_bytes, n->size);
    update_cached(pool);
    if (pool->device->hazard_checker)
        pool->stats.hazards += pool->ops->check_handout(pool->device, n->offset, n->size, stream);
    if (pool->streams[slot].capturing) {
        st = capture_note(pool, &pool->streams[slot], n);
        if (st != TP_OK) { /* cannot track it: undo the allocation */
            pool->stats.allocs--;
            stat_sub(&pool->stats.requested_bytes, bytes);
            stat_sub(&pool->stats.allocated_bytes, n->size);
            map_del(&pool->blocks, n->offset);
            tp_pool_release_block(pool, id, (tp_tag){slot, pool->streams[slot].next_epoch});
            update_cached(pool);
            goto out;
        }
    }
    *out_ptr = (void *)(uintptr_t)n->offset;
out:
    check_invariants_if_asked(pool);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* Why a pointer that is not a block start cannot be freed. */
static tp_status classify_bad_pointer(tp_pool *pool, uint64_t address) {
    uint32_t id = tp_ra_node_containing(&pool->ra, address);
    if (id == RA_NONE) return TP_ERR_NOT_OWNED;
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    if (n->state == RA_NODE_FREE) return TP_ERR_DOUBLE_FREE;
    if (n->offset != address) return TP_ERR_NOT_BLOCK_START;
    return TP_ERR_DOUBLE_FREE; /* a parked or pinned-freed block */
}

tp_status tp_pool_free(tp_pool *pool, void *ptr, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    if (!ptr) return TP_OK;
    uint64_t address = (uint64_t)(uintptr_t)ptr;
    pthread_mutex_lock(&pool->lock);
    tp_status st = TP_OK;
    uint32_t id = map_get(&pool->blocks, address);
    tp_ra_node *n = id == POOL_NONE ? NULL : tp_ra_node_at(&pool->ra, id);
    if (!n || (n->flags & (NODE_CACHED | NODE_FREED_PINNED))) {
        st = n ? TP_ERR_DOUBLE_FREE : classify_bad_pointer(pool, address);
        tp_logf(&pool->device->logger, TP_LOG_ERROR, "tp_pool_free(0x%llx): %s", (unsigned long long)address,
                tp_status_describe(st));
        goto out;
    }
    uint32_t slot;
    st = stream_slot(pool, stream, &slot);
    if (st != TP_OK) goto out;
    pool_stream *s = &pool->streams[slot];
    tp_tag tag = {slot, s->next_epoch};
    s->last_free_epoch = s->next_epoch;
    pool->stats.frees++;
    pool->growth_streak = 0;
    stat_sub(&pool->stats.requested_bytes, n->requested);
    stat_sub(&pool->stats.allocated_bytes, n->size);
    if (pool->stats.allocated_bytes.current < pool->low_water_allocated)
        pool->low_water_allocated = pool->stats.allocated_bytes.current;
    pool->stats.cached_bytes.total += n->size;
    n->tag = tag;
    if (n->pins) {
        n->flags |= NODE_FREED_PINNED;
        pool->zombie_bytes += n->size;
    } else if (!tcache_push(pool, id)) {
        map_del(&pool->blocks, address);
        tp_pool_release_block(pool, id, tag);
    }
    update_cached(pool);
    if (++pool->frees_since_upkeep >= POOL_UPKEEP_FREES) upkeep(pool);
out:
    check_invariants_if_asked(pool);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_block_size(tp_pool *pool, const void *ptr, size_t *out_bytes) {
    if (!pool || !out_bytes) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    uint32_t id = map_get(&pool->blocks, (uint64_t)(uintptr_t)ptr);
    tp_status st = TP_ERR_NOT_OWNED;
    if (id != POOL_NONE && !(tp_ra_node_at(&pool->ra, id)->flags & (NODE_CACHED | NODE_FREED_PINNED))) {
        *out_bytes = (size_t)tp_ra_node_at(&pool->ra, id)->requested;
        st = TP_OK;
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* --------------------------------------------------------- trim and tick */

tp_status tp_pool_trim(tp_pool *pool, uint64_t target_reserved_bytes, uint64_t *out_released_bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_pool_tcache_flush(pool);
    uint64_t released = 0;
    for (int blocking = 0; blocking <= 1; blocking++) {
        uint64_t reserved = pool->stats.reserved_bytes.current;
        if (reserved <= target_reserved_bytes) break;
        released += release_idle(pool, reserved - target_reserved_bytes, blocking, 0, 0);
    }
    if (out_released_bytes) *out_released_bytes = released;
    check_invariants_if_asked(pool);
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

tp_status tp_pool_tick(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    if (pool->config.idle_release_ns != TP_NS_NEVER) {
        /* Parked blocks go back only once the pool has gone quiet (no
         * alloc or free since the previous tick): a busy pool is about to
         * reuse them, and its frees run the periodic upkeep anyway.
         * Flushing on every tick moved blocks mid-step: replayed with a
         * tick a second, decode_growing_kv held 1.033x peak live on VMM
         * instead of 1.008x, gemma3_mtmd 1.080x on segment for 1.057x. */
        uint64_t calls = pool->stats.allocs + pool->stats.frees;
        if (calls == pool->calls_at_tick)
            tp_pool_tcache_flush(pool);
        else if (pool->last_freed != RA_NONE &&
                 tp_pool_now(pool) - pool->last_freed_ns >= pool->config.idle_release_ns)
            last_freed_release(pool); /* cold since its free, whatever the pool did since */
        pool->calls_at_tick = calls;
        release_aged(pool, true);
    }
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

/* -------------------------------------------------------------- reclaim */

tp_status tp_pool_add_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user) {
    if (!pool || !fn) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = TP_OK;
    if (pool->reclaimer_count >= 16)
        st = TP_ERR_BUSY;
    else if (!tp_host_grow(pool->host, (void **)&pool->reclaimers, sizeof *pool->reclaimers,
                           &pool->reclaimer_capacity, pool->reclaimer_count + 1))
        st = TP_ERR_HOST_OUT_OF_MEMORY;
    else
        pool->reclaimers[pool->reclaimer_count++] = (pool_reclaimer){fn, user};
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_remove_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user) {
    if (!pool || !fn) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = TP_ERR_INVALID_ARGUMENT;
    for (size_t i = 0; i < pool->reclaimer_count; i++) {
        if (pool->reclaimers[i].fn == fn && pool->reclaimers[i].user == user) {
            pool->reclaimers[i] = pool->reclaimers[--pool->reclaimer_count];
            st = TP_OK;
            break;
        }
    }
    /* A reclaim round that copied the list before the removal may still be
     * calling fn: once this returns, fn is never called again. */
    while (st == TP_OK && pool->reclaims_in_flight) pthread_cond_wait(&pool->reclaims_done, &pool->lock);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* ------------------------------------------------------------------ pins */

/* Calls visit on every block overlapping [address, +bytes) after checking
 * that the whole range lies in blocks visit accepts. */
typedef bool (*block_visit_fn)(tp_pool *pool, uint32_t id, bool apply);

static tp_status for_blocks_in_range(tp_pool *pool, uint64_t address, uint64_t bytes, block_visit_fn visit) {
    if (bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    uint32_t first = map_get(&pool->blocks, address);
    if (first == POOL_NONE) first = tp_ra_node_containing(&pool->ra, address);
    if (first == RA_NONE) return TP_ERR_NOT_OWNED;
    for (int apply = 0; apply <= 1; apply++) {
        uint64_t end = address + bytes;
        for (uint32_t id = first; id != RA_NONE;) {
            tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
            uint32_t next = n->addr_next;
            uint64_t node_end = n->offset + n->size;
            if (!apply && (n->state != RA_NODE_USED || (n->flags & NODE_CACHED) || !visit(pool, id, false)))
                return TP_ERR_INVALID_ARGUMENT;
            if (apply) visit(pool, id, true);
            if (node_end >= end) break;
            if (next == RA_NONE) {
                if (!apply) return TP_ERR_INVALID_ARGUMENT; /* range runs past the region */
                break;
            }
            id = next;
        }
    }
    return TP_OK;
}

static bool pin_visit(tp_pool *pool, uint32_t id, bool apply) {
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    if (!apply) return n->pins < UINT32_MAX;
    if (n->pins++ == 0) stat_add(&pool->stats.pinned_bytes, n->size);
    return true;
}

static bool unpin_visit(tp_pool *pool, uint32_t id, bool apply) {
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    if (!apply) return n->pins > 0;
    if (--n->pins == 0) {
        stat_sub(&pool->stats.pinned_bytes, n->size);
        if (n->flags & NODE_FREED_PINNED) {
            pool->zombie_bytes -= n->size;
            map_del(&pool->blocks, n->offset);
            tp_pool_release_block(pool, id, n->tag);
            update_cached(pool);
        }
    }
    return true;
}

tp_status tp_pool_pin(tp_pool *pool, const void *ptr, size_t bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = for_blocks_in_range(pool, (uint64_t)(uintptr_t)ptr, bytes, pin_visit);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_unpin(tp_pool *pool, const void *ptr, size_t bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = for_blocks_in_range(pool, (uint64_t)(uintptr_t)ptr, bytes, unpin_visit);
    if (st == TP_OK && pool->idle_bytes > pool->config.release_threshold_bytes) release_aged(pool, false);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* --------------------------------------------------------------- streams */

tp_status tp_pool_forget_stream(tp_pool *pool, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = TP_OK;
    uint32_t slot = 0;
    for (uint32_t i = 1; i < pool->stream_count; i++)
        if (pool->streams[i].handle == stream && !pool->streams[i].retired) slot = i;
    if (slot) {
        pool_stream *s = &pool->streams[slot];
        if (s->capturing) {
            st = TP_ERR_CAPTURE;
        } else {
            /* Parked blocks of this stream could only be reused on it. */
            tp_pool_tcache_flush(pool);
            pool->stats.synchronizations++;
            st = pool->ops->stream_synchronize(pool->device, s->handle);
            if (st != TP_OK) {
                tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
            } else {
                while (s->ring_count) ring_pop(pool, s);
                /* Every free on it is complete and no new one can come:
                 * tags naming this slot now read as complete. */
                s->completed_epoch = UINT64_MAX;
                s->retired = true;
                pool->last_slot = 0;
            }
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* --------------------------------------------------------------- capture */

tp_status tp_pool_capture_begin(tp_pool *pool, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    uint32_t slot;
    tp_status st = stream_slot(pool, stream, &slot);
    if (st == TP_OK) {
        pool_stream *s = &pool->streams[slot];
        if (s->capturing) {
            st = TP_ERR_CAPTURE;
        } else {
            s->capturing = true;
            s->captured_count = 0;
            pool->capturing_streams++;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_capture_end(tp_pool *pool, tp_stream stream, tp_range **out_ranges, size_t *out_count) {
    if (!pool || !out_ranges || !out_count) return TP_ERR_INVALID_ARGUMENT;
    *out_ranges = NULL;
    *out_count = 0;
    pthread_mutex_lock(&pool->lock);
    uint32_t slot;
    tp_status st = stream_slot(pool, stream, &slot);
    if (st == TP_OK && !pool->streams[slot].capturing) st = TP_ERR_CAPTURE;
    if (st == TP_OK) {
        pool_stream *s = &pool->streams[slot];
        /* [count][ranges...]: the count lets tp_pool_free_ranges size the free */
        size_t count = s->captured_count;
        uint64_t *block = tp_host_alloc(pool->host, sizeof(uint64_t) + count * sizeof(tp_range));
        if (!block) {
            st = TP_ERR_HOST_OUT_OF_MEMORY;
        } else {
            block[0] = count;
            tp_range *ranges = (tp_range *)(block + 1);
            if (count) memcpy(ranges, s->captured, count * sizeof *ranges);
            *out_ranges = ranges;
            *out_count = count;
            s->capturing = false;
            s->captured_count = 0;
            pool->capturing_streams--;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

void tp_pool_free_ranges(tp_pool *pool, tp_range *ranges) {
    if (!pool || !ranges) return;
    uint64_t *block = (uint64_t *)ranges - 1;
    tp_host_free(pool->host, block, sizeof(uint64_t) + block[0] * sizeof(tp_range));
}

/* ----------------------------------------------------------------- stats */

static void stats_snapshot(tp_pool *pool, tp_pool_stats *out) {
    *out = pool->stats;
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    pool->backend->free_figures(pool, &free_bytes, &largest, &ranges);
    out->free_ranges = ranges;
    out->largest_free_bytes = largest;
    out->fragmentation = free_bytes ? 1.0 - (double)largest / (double)free_bytes : 0.0;
}

tp_status tp_pool_get_stats(tp_pool *pool, tp_pool_stats *out_stats) {
    if (!pool || !out_stats) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    stats_snapshot(pool, out_stats);
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

tp_status tp_pool_reset_peaks(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    if (pool->stats.allocated_bytes.peak > pool->high_water_allocated)
        pool->high_water_allocated = pool->stats.allocated_bytes.peak;
    tp_stat *all[] = {&pool->stats.requested_bytes, &pool->stats.allocated_bytes, &pool->stats.reserved_bytes,
                      &pool->stats.cached_bytes, &pool->stats.pinned_bytes};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++) all[i]->peak = all[i]->current;
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

tp_status tp_pool_stats_json(tp_pool *pool, char *buf, size_t capacity, size_t *out_length) {
    if (!pool || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    tp_pool_stats s;
    tp_pool_get_stats(pool, &s);
#define STAT3(name) "\"" #name "\":{\"current\":%llu,\"peak\":%llu,\"total\":%llu},"
#define STAT3_ARGS(x) (unsigned long long)(x).current, (unsigned long long)(x).peak, (unsigned long long)(x).total
    int n = snprintf(buf, capacity,
                     "{\"kind\":\"%s\"," STAT3(requested_bytes) STAT3(allocated_bytes) STAT3(reserved_bytes)
                         STAT3(cached_bytes) STAT3(pinned_bytes)
                     "\"limit_bytes\":%llu,\"allocs\":%llu,\"frees\":%llu,\"cache_hits\":%llu,"
                     "\"device_calls\":%llu,\"device_allocs\":%llu,\"device_frees\":%llu,\"oom_retries\":%llu,"
                     "\"ooms\":%llu,\"synchronizations\":%llu,\"events_recorded\":%llu,\"cross_stream_waits\":%llu,"
                     "\"hazards\":%llu,\"device_errors\":%llu,\"reclaim_calls\":%llu,\"streams\":%llu,"
                     "\"free_ranges\":%llu,\"largest_free_bytes\":%llu,\"fragmentation\":%.6f}",
                     s.kind == TP_POOL_VMM ? "vmm" : "segment", STAT3_ARGS(s.requested_bytes),
                     STAT3_ARGS(s.allocated_bytes), STAT3_ARGS(s.reserved_bytes), STAT3_ARGS(s.cached_bytes),
                     STAT3_ARGS(s.pinned_bytes), (unsigned long long)s.limit_bytes, (unsigned long long)s.allocs,
                     (unsigned long long)s.frees, (unsigned long long)s.cache_hits,
                     (unsigned long long)s.device_calls, (unsigned long long)s.device_allocs,
                     (unsigned long long)s.device_frees, (unsigned long long)s.oom_retries,
                     (unsigned long long)s.ooms, (unsigned long long)s.synchronizations,
                     (unsigned long long)s.events_recorded, (unsigned long long)s.cross_stream_waits,
                     (unsigned long long)s.hazards, (unsigned long long)s.device_errors,
                     (unsigned long long)s.reclaim_calls, (unsigned long long)s.streams,
                     (unsigned long long)s.free_ranges, (unsigned long long)s.largest_free_bytes, s.fragmentation);
#undef STAT3
#undef STAT3_ARGS
    if (n < 0) return TP_ERR_INVALID_ARGUMENT;
    if (out_length) *out_length = (size_t)n;
    return (size_t)n < capacity ? TP_OK : TP_ERR_INVALID_ARGUMENT;
}

tp_status tp_pool_last_oom_report(tp_pool *pool, tp_oom_report *out_report) {
    if (!pool || !out_report) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = pool->has_oom_report ? TP_OK : TP_ERR_INVALID_ARGUMENT;
    if (st == TP_OK) *out_report = pool->oom_report;
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* ----------------------------------------------------------------- check */

#define POOL_FAIL(...)                                                  \
    do {                                                                \
        if (msg && msg_capacity) snprintf(msg, msg_capacity, __VA_ARGS__); \
        ok = false;                                                     \
        goto done;                                                      \
    } while (0)

tp_status tp_pool_check(tp_pool *pool, char *msg, size_t msg_capacity) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    bool ok = true;
    pthread_mutex_lock(&pool->lock);
    if (!tp_ra_check(&pool->ra, msg, msg_capacity)) {
        ok = false;
        goto done;
    }
    {
        uint64_t allocated = 0, requested = 0, cached = 0, zombie = 0, pinned = 0, in_map = 0;
        for (size_t i = 0; i < pool->ra.node_capacity; i++) {
            tp_ra_node *n = &pool->ra.nodes[i];
            if (n->state != RA_NODE_USED) continue;
            if (map_get(&pool->blocks, n->offset) != i) POOL_FAIL("used node %zu missing from the block map", i);
            in_map++;
            if (n->pins) pinned += n->size;
            if (n->flags & NODE_CACHED) {
                cached += n->size;
                if (n->pins) POOL_FAIL("parked node %zu is pinned", i);
            } else if (n->flags & NODE_FREED_PINNED) {
                zombie += n->size;
                if (!n->pins) POOL_FAIL("freed-pinned node %zu has no pins", i);
            } else {
                allocated += n->size;
                requested += n->requested;
                if (n->requested > n->size) POOL_FAIL("node %zu: requested above its size", i);
            }
        }
        if (in_map != pool->blocks.count) POOL_FAIL("block map holds %zu entries, %llu used nodes", pool->blocks.count,
                                                    (unsigned long long)in_map);
        if (allocated != pool->stats.allocated_bytes.current) POOL_FAIL("allocated bytes disagree");
        if (requested != pool->stats.requested_bytes.current) POOL_FAIL("requested bytes disagree");
        if (cached != pool->tcache_bytes) POOL_FAIL("tcache bytes disagree");
        if (zombie != pool->zombie_bytes) POOL_FAIL("freed-pinned bytes disagree");
        if (pinned != pool->stats.pinned_bytes.current) POOL_FAIL("pinned bytes disagree");
        uint64_t parked = 0;
        for (uint32_t bin = 0; bin < RA_BIN_COUNT; bin++) {
            for (uint8_t k = 0; k < pool->tcache_count[bin]; k++) {
                tp_ra_node *n = tp_ra_node_at(&pool->ra, pool->tcache[bin][k]);
                if (n->state != RA_NODE_USED || !(n->flags & NODE_CACHED)) POOL_FAIL("tcache bin %u holds a bad node", bin);
                if (tp_ra_bin_floor(&pool->ra, n->size) != bin) POOL_FAIL("tcache bin %u holds a node of another bin", bin);
                parked += n->size;
            }
        }
        if (pool->last_freed != RA_NONE) {
            tp_ra_node *n = tp_ra_node_at(&pool->ra, pool->last_freed);
            if (n->state != RA_NODE_USED || !(n->flags & NODE_CACHED)) POOL_FAIL("last-freed slot holds a bad node");
            if (n->size <= pool->tcache_max_block_bytes) POOL_FAIL("last-freed slot holds a tcache-sized node");
            parked += n->size;
        }
        if (parked != cached) POOL_FAIL("tcache lists and flags disagree");
        uint64_t idle = 0, reserved = 0, listed = 0;
        for (size_t u = 0; u < pool->unit_capacity; u++) {
            if (pool->units[u].state == UNIT_UNUSED) continue;
            reserved += pool->units[u].bytes;
            if (pool->units[u].state == UNIT_IDLE) idle += pool->units[u].bytes;
        }
        for (uint32_t u = pool->lru_head, prev = POOL_NONE; u != POOL_NONE; prev = u, u = pool->units[u].lru_next) {
            if (pool->units[u].state != UNIT_IDLE) POOL_FAIL("unit %u in the idle list is not idle", u);
            if (pool->units[u].lru_prev != prev) POOL_FAIL("idle list back link broken at %u", u);
            if (prev != POOL_NONE && pool->units[prev].idle_since_ns > pool->units[u].idle_since_ns)
                POOL_FAIL("idle list out of age order at %u", u);
            listed += pool->units[u].bytes;
        }
        if (idle != pool->idle_bytes || listed != idle) POOL_FAIL("idle bytes disagree");
        if (reserved != pool->stats.reserved_bytes.current) POOL_FAIL("reserved bytes disagree with units");
        if (pool->stats.cached_bytes.current != reserved - allocated - zombie) POOL_FAIL("cached bytes disagree");
        if (reserved > pool->config.limit_bytes) POOL_FAIL("reserved above the limit");
        if (!pool->backend->check(pool, msg, msg_capacity)) ok = false;
    }
done:
    pthread_mutex_unlock(&pool->lock);
    return ok ? TP_OK : TP_ERR_INVALID_ARGUMENT;
}
