/* SPDX-License-Identifier: MIT */
/*
 * oom_ladder.c -- the out-of-memory ladder and its report; see
 * oom_ladder.h.
 */
#include "oom_ladder.h"

#include <string.h>

tp_status tpi_ladder_init(tpi_ladder *l, tpi_core *core, tpi_front *front, tpi_backing *backing, tp_pool *pool,
                          pthread_mutex_t *lock) {
    memset(l, 0, sizeof *l);
    l->core = core;
    l->front = front;
    l->backing = backing;
    l->pool = pool;
    l->lock = lock;
    return pthread_cond_init(&l->reclaims_done, NULL) == 0 ? TP_OK : TP_ERR_HOST_OUT_OF_MEMORY;
}

void tpi_ladder_destroy(tpi_ladder *l) { pthread_cond_destroy(&l->reclaims_done); }

void tpi_ladder_report_oom_locked(tpi_ladder *l, uint64_t request_bytes, tp_stream stream, tp_status device_status) {
    tpi_core *core = l->core;
    tp_oom_report *r = &l->report;
    memset(r, 0, sizeof *r);
    uint64_t device_free = 0, device_total = 0;
    if (core->ops->mem_info(core->device, &device_free, &device_total) != TP_OK)
        device_total = core->device->info.capacity_bytes;
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    l->backing->ops->free_figures(l->backing, &free_bytes, &largest, &ranges);
    const tp_pool_stats *s = &core->stats.pub;
    r->request_bytes = request_bytes;
    r->limit_bytes = core->config.limit_bytes;
    r->capacity_bytes = device_total;
    r->device_free_bytes = device_free;
    r->allocated_bytes = s->allocated_bytes.current;
    r->reserved_bytes = s->reserved_bytes.current;
    r->cached_bytes = s->cached_bytes.current;
    r->pinned_bytes = s->pinned_bytes.current;
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
    l->has_report = true;
    core->stats.pub.ooms++;
    tpi_observe(&core->stats, TP_POOL_EVENT_OOM, 0, request_bytes, stream);
    tpi_logf(&core->device->logger, TP_LOG_WARN, "%s", r->message);
}

/* Runs the reclaim callbacks with the lock released; returns the bytes they
 * say they freed. */
static bool inside_reclaim_round_locked(const tpi_ladder *l) {
    pthread_t self = pthread_self();
    for (const tpi_reclaim_round *r = l->rounds; r; r = r->next)
        if (pthread_equal(r->thread, self)) return true;
    return false;
}

static uint64_t run_reclaimers_locked(tpi_ladder *l, uint64_t need) {
    size_t count = l->reclaimer_count;
    if (!count) return 0;
    tpi_reclaimer local[TPI_MAX_RECLAIMERS];
    memcpy(local, l->reclaimers, count * sizeof *local);
    l->reclaims_in_flight++; /* remove_reclaimer waits for us */
    tpi_reclaim_round round = {pthread_self(), l->rounds};
    l->rounds = &round;
    tpi_front_world_leave(l->front);
    pthread_mutex_unlock(l->lock);
    uint64_t reclaimed = 0;
    for (size_t i = 0; i < count; i++) reclaimed += local[i].fn(local[i].user, l->pool, need);
    pthread_mutex_lock(l->lock);
    tpi_front_world_enter(l->front, NULL);
    tpi_reclaim_round **link = &l->rounds;
    while (*link != &round) link = &(*link)->next;
    *link = round.next;
    if (--l->reclaims_in_flight == 0) pthread_cond_broadcast(&l->reclaims_done);
    l->core->stats.pub.reclaim_calls += count;
    return reclaimed;
}

/* The backing's answer, without growth while blocks are parked: they may
 * make room, and are given back before the pool grows. */
static tp_status try_backing(tpi_ladder *l, uint64_t size, uint32_t slot, bool moving, uint32_t *out_node,
                             uint64_t *out_need) {
    tpi_backing *b = l->backing;
    if (tpi_front_any_parked(l->front)) {
        tp_status st = b->ops->try_alloc(b, size, slot, moving, false, out_node, out_need);
        if (st != TP_NOT_READY) return st;
        tpi_front_flush(l->front);
    }
    return b->ops->try_alloc(b, size, slot, moving, true, out_node, out_need);
}

tp_status tpi_ladder_alloc_locked(tpi_ladder *l, uint64_t size, uint64_t request_bytes, uint32_t slot, bool moving,
                                  uint32_t *out_node) {
    tpi_core *core = l->core;
    tpi_units *units = &core->units;
    uint64_t need = 0;
    core->stats.last_device_status = TP_OK;
    tp_status st = try_backing(l, size, slot, moving, out_node, &need);
    for (int step = 1; st == TP_ERR_OUT_OF_MEMORY && step <= 4; step++) {
        bool progress = false;
        switch (step) {
        case 1: /* parked blocks and idle units whose last use completed, oldest first, as much as needed */
            progress = tpi_front_flush(l->front) > 0;
            progress |= tpi_units_release_idle(units, need ? need : size, false, 0, 0) > 0;
            break;
        case 2: { /* wait for the streams that hold pending frees */
            bool waited = false;
            if (tpi_order_sync_pending_frees(&core->order, &waited) == TP_OK) progress = waited;
            break;
        }
        case 3: /* everything idle */
            progress = tpi_units_release_idle(units, UINT64_MAX, true, 0, 0) > 0;
            break;
        case 4: /* the owners of other memory: graph caches and the like */
            if (inside_reclaim_round_locked(l)) break; /* a callback allocating: no second round */
            if (run_reclaimers_locked(l, need ? need : size) > 0 || l->reclaimer_count) {
                tpi_front_flush(l->front);
                tpi_units_release_idle(units, UINT64_MAX, true, 0, 0);
                progress = true;
            }
            break;
        }
        if (!progress) continue;
        core->stats.pub.oom_retries++;
        st = try_backing(l, size, slot, moving, out_node, &need);
    }
    if (st == TP_ERR_OUT_OF_MEMORY)
        tpi_ladder_report_oom_locked(l, request_bytes, tpi_order_stream(&core->order, slot)->handle,
                                     core->stats.last_device_status);
    return st;
}

tp_status tpi_ladder_add_reclaimer_locked(tpi_ladder *l, tp_reclaim_fn fn, void *user) {
    if (l->reclaimer_count >= TPI_MAX_RECLAIMERS) return TP_ERR_BUSY;
    l->reclaimers[l->reclaimer_count++] = (tpi_reclaimer){fn, user};
    return TP_OK;
}

tp_status tpi_ladder_remove_reclaimer_locked(tpi_ladder *l, tp_reclaim_fn fn, void *user) {
    /* From inside a callback it would wait for its own round. */
    if (inside_reclaim_round_locked(l)) return TP_ERR_BUSY;
    tp_status st = TP_ERR_NOT_FOUND;
    for (size_t i = 0; i < l->reclaimer_count; i++) {
        if (l->reclaimers[i].fn == fn && l->reclaimers[i].user == user) {
            l->reclaimers[i] = l->reclaimers[--l->reclaimer_count];
            st = TP_OK;
            break;
        }
    }
    /* A reclaim round that copied the list before the removal may still be
     * calling fn: once this returns, fn is never called again. */
    while (st == TP_OK && l->reclaims_in_flight) {
        tpi_front_world_leave(l->front); /* the round's own calls may need the world lock */
        pthread_cond_wait(&l->reclaims_done, l->lock);
        tpi_front_world_enter(l->front, NULL);
    }
    return st;
}
