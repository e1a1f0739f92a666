/*
 * pool_inspect.c -- looking at a pool from outside: the invariant checker
 * (tp_pool_check) and the memory map (tp_pool_snapshot_json). Part of the
 * public pool API (pool_object.h).
 */
#include "pool_object.h"

#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ check */

/* The blocks against the statistics and the block map. */
static bool blocks_agree_locked(tp_pool *pool, char *msg, size_t msg_capacity) {
    tpi_core *core = &pool->core;
    const tp_pool_stats *s = &core->stats.pub;
    uint64_t allocated = 0, requested = 0, zombie = 0, pinned = 0, used = 0;
    for (size_t i = 0; i < core->ra.node_capacity; i++) {
        const tpi_ra_node *n = &core->ra.nodes[i];
        if (n->state != TPI_RA_NODE_USED) continue;
        if (i >= core->info_capacity) TPI_FAIL(msg, msg_capacity, "used node %zu has no block entry", i);
        uint64_t mapped;
        if (!tpi_map_get(&core->blocks, n->offset, &mapped) || mapped != i)
            TPI_FAIL(msg, msg_capacity, "used node %zu missing from the block map", i);
        used++;
        const tpi_block *b = &core->info[i];
        if (b->pins) pinned += n->size;
        if (b->flags & TPI_BLOCK_PARKED) continue;
        if (b->flags & TPI_BLOCK_FREED_PINNED) {
            zombie += n->size;
            if (!b->pins) TPI_FAIL(msg, msg_capacity, "freed-pinned node %zu has no pins", i);
            continue;
        }
        allocated += n->size;
        requested += b->requested;
        if (b->requested > n->size) TPI_FAIL(msg, msg_capacity, "node %zu: requested above its size", i);
    }
    if (used != core->blocks.count)
        TPI_FAIL(msg, msg_capacity, "block map holds %zu entries, %llu used nodes", core->blocks.count,
                 (unsigned long long)used);
    if (allocated != s->allocated_bytes.current) TPI_FAIL(msg, msg_capacity, "allocated bytes disagree");
    if (requested != s->requested_bytes.current) TPI_FAIL(msg, msg_capacity, "requested bytes disagree");
    if (zombie != core->stats.zombie_bytes) TPI_FAIL(msg, msg_capacity, "freed-pinned bytes disagree");
    if (pinned != s->pinned_bytes.current) TPI_FAIL(msg, msg_capacity, "pinned bytes disagree");
    uint64_t reserved = s->reserved_bytes.current;
    if (s->cached_bytes.current != reserved - allocated - zombie) TPI_FAIL(msg, msg_capacity, "cached bytes disagree");
    if (reserved > core->config.limit_bytes) TPI_FAIL(msg, msg_capacity, "reserved above the limit");
    return true;
}

bool tpi_pool_check_locked(tp_pool *pool, char *msg, size_t msg_capacity) {
    tpi_core *core = &pool->core;
    return tpi_ra_check(&core->ra, msg, msg_capacity) && blocks_agree_locked(pool, msg, msg_capacity) &&
           tpi_front_check(&pool->front, msg, msg_capacity) && tpi_units_check(&core->units, msg, msg_capacity) &&
           pool->backing->ops->check(pool->backing, msg, msg_capacity);
}

tp_status tp_pool_check(tp_pool *pool, char *msg, size_t msg_capacity) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    bool ok = tpi_pool_check_locked(pool, msg, msg_capacity);
    pthread_mutex_unlock(&pool->lock);
    return ok ? TP_OK : TP_ERR_CORRUPT;
}
