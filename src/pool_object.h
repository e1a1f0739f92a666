/* SPDX-License-Identifier: MIT */
/*
 * pool_object.h -- the pool object, shared by the files of the public pool
 * API: pool.c (lifecycle, alloc/free, trim/tick, reclaim, streams,
 * statistics), pool_pins.c (pins and capture) and pool_inspect.c (the
 * checker and the memory map). Helpers here need the world lock held
 * (but tpi_pool_lock, which takes it).
 */
#ifndef TIDEPOOL_POOL_OBJECT_H
#define TIDEPOOL_POOL_OBJECT_H

#include "oom_ladder.h"

struct tp_pool {
    pthread_mutex_t lock; /* with the front cache's world gate: the world lock (pool.c) */
    tpi_core core;
    tpi_backing *backing;
    tpi_front front;
    tpi_ladder ladder;
    uint64_t calls_at_tick; /* allocs + frees at the previous tp_pool_tick */
    uint64_t last_upkeep_ns;
    /* Before this time (the device's clock) a stream's upkeep would do
     * nothing: written when the world lock is given back, read by hits,
     * so a stream takes the world lock for its upkeep only when it is due. */
    _Atomic(uint64_t) upkeep_due_ns;
    /* An observer, a hazard checker that cannot say when it has nothing to
     * check against (the simulated device can: pool.c's hit path asks it),
     * or the checks after every call: what makes a hit more than the common
     * case (pool.c's hit path looks at each only when this is set). Written
     * with the world lock held, read by hits under their stream lock. */
    bool hit_extras;
};

/* The world lock: the pool's mutex, then the world gate (no hit runs
 * beside it: front_cache.h), the streams' hit statistics folded in; given back with the upkeep's next due time. */
void tpi_pool_lock(tp_pool *pool);
void tpi_pool_unlock(tp_pool *pool);
/* The slot of a stream (added if new) and its front-cache state. Inline:
 * every locked alloc and free asks, most often for the stream of the call
 * before, which the order's and the front cache's inline lookups answer. */
static inline tp_status tpi_pool_stream_slot_locked(tp_pool *pool, tp_stream stream, uint32_t *out_slot) {
    tp_status st = tpi_order_slot(&pool->core.order, stream, out_slot);
    if (st != TP_OK) return st;
    tpi_front_stream *fs = tpi_front_stream_at(&pool->front, *out_slot, stream);
    if (!fs) return TP_ERR_HOST_OUT_OF_MEMORY;
    /* A forgotten stream used again gets its old slot back, its hits off
     * since the forget: on again, unless a capture keeps them off. */
    const tpi_stream *s = tpi_order_stream(&pool->core.order, *out_slot);
    if (!fs->hits && !s->capturing && !s->retired) tpi_front_set_hits(&pool->front, *out_slot, true);
    return TP_OK;
}
/* The pin count of a used node: its live entry's or, freed-pinned, its
 * block's; NULL for a parked block. */
uint32_t *tpi_pool_pins_locked(tp_pool *pool, uint32_t node);
/* Room in the per-node block table for every node the range allocator has. */
bool tpi_pool_blocks_fit_nodes_locked(tpi_core *core);
/* A block the caller gave back (or never got) returns to the backing. */
void tpi_pool_release_block_locked(tp_pool *pool, uint32_t node);
/* Records a block allocated on a capturing stream (pool_pins.c). */
tp_status tpi_pool_capture_note_locked(tp_pool *pool, tpi_stream *s, uint32_t node);
/* Every invariant of the pool and its layers (pool_inspect.c). */
bool tpi_pool_check_locked(tp_pool *pool, char *msg, size_t msg_capacity);

#endif /* TIDEPOOL_POOL_OBJECT_H */
