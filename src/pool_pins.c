/* SPDX-License-Identifier: MIT */
/*
 * pool_pins.c -- pins and stream capture, part of the public pool API
 * (pool_object.h).
 *
 * A pin keeps a block out of reach: not reused, unmapped or given back,
 * even once freed (it becomes freed-pinned until the last unpin). A capture
 * records the blocks a capturing stream allocates; its frees are reused by
 * the capture itself (stream order), and at its end the footprint -- the
 * merged ranges of every block it allocated -- is pinned whole: live blocks
 * get a pin, ranges it freed are taken back as freed-pinned blocks. So a
 * graph keeps about its temporaries' peak, not their sum.
 */
#include "pool_object.h"

#include <stdlib.h>
#include <string.h>

/* Records a block allocated during a capture. It is freed and reused
 * within the capture like any block of its stream; what the graph keeps is
 * settled at capture end (capture_keep_locked). */
tp_status tpi_pool_capture_note_locked(tp_pool *pool, tpi_stream *s, uint32_t node) {
    tpi_core *core = &pool->core;
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    if (!tpi_host_grow(core->host, (void **)&s->captured, sizeof *s->captured, &s->captured_capacity,
                       s->captured_count + 1))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    s->captured[s->captured_count++] = (tp_range){n->offset, n->size};
    return TP_OK;
}

/* ------------------------------------------------------------------- pins */

/* Calls visit on every block overlapping [address, +bytes) after checking
 * that the whole range lies in blocks visit accepts. The range may run from
 * one region (segment) into the next where the device placed them end to
 * end: a capture's footprint merges ranges that touch. */
typedef bool (*block_visit_fn)(tp_pool *pool, uint32_t node, bool apply);

static tp_status for_blocks_in_range_locked(tp_pool *pool, uint64_t address, uint64_t bytes, block_visit_fn visit) {
    tpi_core *core = &pool->core;
    if (bytes == 0 || bytes > UINT64_MAX - address) return TP_ERR_INVALID_ARGUMENT;
    tpi_live_entry *live = tpi_front_live_find(&pool->front, address, NULL);
    uint64_t *found = live ? NULL : tpi_map_find(&core->blocks, address);
    uint32_t first = live ? live->node : found ? (uint32_t)*found : tpi_ra_node_containing(&core->ra, address);
    if (first == TPI_RA_NONE) return TP_ERR_NOT_OWNED;
    uint64_t end = address + bytes;
    for (int apply = 0; apply <= 1; apply++) {
        for (uint32_t id = first; id != TPI_RA_NONE;) {
            tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
            uint32_t next = n->addr_next;
            uint64_t node_end = n->offset + n->size;
            if (!apply && (n->state != TPI_RA_NODE_USED || !tpi_pool_pins_locked(pool, id) || !visit(pool, id, false)))
                return TP_ERR_INVALID_ARGUMENT;
            if (apply) visit(pool, id, true);
            if (node_end >= end) break;
            if (next == TPI_RA_NONE) { /* the region ends: another may start right there */
                next = tpi_ra_node_containing(&core->ra, node_end);
                if (next == TPI_RA_NONE || tpi_ra_node_at(&core->ra, next)->offset != node_end) {
                    if (!apply) return TP_ERR_INVALID_ARGUMENT; /* range runs past the region */
                    break;
                }
            }
            id = next;
        }
    }
    return TP_OK;
}

/* (The first pass checked that every node is a live or freed-pinned
 * block: tpi_pool_pins_locked is not NULL.) */
static bool pin_visit(tp_pool *pool, uint32_t node, bool apply) {
    uint32_t *pins = tpi_pool_pins_locked(pool, node);
    if (!apply) return *pins < UINT32_MAX;
    if ((*pins)++ == 0) tpi_stat_add(&pool->core.stats.pub.pinned_bytes, tpi_ra_node_at(&pool->core.ra, node)->size);
    return true;
}

static bool unpin_visit(tp_pool *pool, uint32_t node, bool apply) {
    tpi_core *core = &pool->core;
    uint32_t *pins = tpi_pool_pins_locked(pool, node);
    if (!apply) return *pins > 0;
    if (--*pins == 0) {
        uint64_t size = tpi_ra_node_at(&core->ra, node)->size;
        tpi_stat_sub(&core->stats.pub.pinned_bytes, size);
        if (tpi_block_at(core, node)->flags & TPI_BLOCK_FREED_PINNED) {
            core->stats.zombie_bytes -= size;
            tpi_pool_release_block_locked(pool, node);
            tpi_stats_update_cached(&core->stats);
        }
    }
    return true;
}

tp_status tp_pool_pin(tp_pool *pool, const void *ptr, size_t bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tp_status st = for_blocks_in_range_locked(pool, (uint64_t)(uintptr_t)ptr, bytes, pin_visit);
    tpi_pool_unlock(pool);
    return st;
}

tp_status tp_pool_unpin(tp_pool *pool, const void *ptr, size_t bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tp_status st = for_blocks_in_range_locked(pool, (uint64_t)(uintptr_t)ptr, bytes, unpin_visit);
    if (st == TP_OK && pool->core.units.idle_bytes > pool->core.config.release_threshold_bytes)
        tpi_units_release_aged(&pool->core.units, false);
    tpi_pool_unlock(pool);
    return st;
}

/* ---------------------------------------------------------------- capture */

tp_status tp_pool_capture_begin(tp_pool *pool, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    uint32_t slot;
    tp_status st = tpi_pool_stream_slot_locked(pool, stream, &slot);
    if (st == TP_OK) {
        tpi_stream *s = tpi_order_stream(&pool->core.order, slot);
        if (s->capturing) {
            st = TP_ERR_CAPTURE;
        } else {
            s->capturing = true;
            pool->core.order.captures++;
            s->captured_count = 0;
            /* Its allocations must be noted and its frees must not park:
             * the locked path does both. */
            tpi_front_set_hits(&pool->front, slot, false);
        }
    }
    tpi_pool_unlock(pool);
    return st;
}

static int range_order(const void *a, const void *b) {
    const tp_range *x = a, *y = b;
    return x->address < y->address ? -1 : x->address > y->address;
}

/* Does the byte at address lie in the same region (segment) as the one
 * just below it? Regions the device placed end to end touch but are kept
 * apart: everything that walks a range walks one region's nodes. */
static bool same_region(const tpi_ra *ra, uint64_t address) {
    uint32_t below = tpi_ra_node_containing(ra, address - 1), at = tpi_ra_node_containing(ra, address);
    return below != TPI_RA_NONE && at != TPI_RA_NONE &&
           tpi_ra_node_at(ra, below)->region == tpi_ra_node_at(ra, at)->region;
}

/* Sorts ranges and merges the ones that overlap, or touch within one
 * region; returns the count. */
static size_t merge_ranges(const tpi_ra *ra, tp_range *ranges, size_t count) {
    if (!count) return 0;
    qsort(ranges, count, sizeof *ranges, range_order);
    size_t out = 0;
    for (size_t i = 1; i < count; i++) {
        tp_range *last = &ranges[out];
        uint64_t last_end = last->address + last->bytes;
        if (ranges[i].address < last_end || (ranges[i].address == last_end && same_region(ra, last_end))) {
            uint64_t end = TPI_MAX(last->address + last->bytes, ranges[i].address + ranges[i].bytes);
            last->bytes = end - last->address;
        } else {
            ranges[++out] = ranges[i];
        }
    }
    return out + 1;
}

/* Pins everything in [address, +bytes), the footprint of blocks a capture
 * allocated: live blocks get a pin; ranges the capture freed (to reuse
 * them) are taken back as freed-but-pinned blocks, so that no other stream
 * and not the device gets them while the graph lives. All or nothing. */
static tp_status capture_keep_locked(tp_pool *pool, uint32_t slot, uint64_t address, uint64_t bytes) {
    tpi_core *core = &pool->core;
    uint64_t end = address + bytes;
    /* First pass: the nodes must be blocks or free ranges; count the free
     * parts and reserve what taking them needs, so the second cannot fail. */
    uint32_t first = tpi_ra_node_containing(&core->ra, address), free_parts = 0;
    if (first == TPI_RA_NONE) return TP_ERR_CORRUPT;
    for (uint32_t id = first; id != TPI_RA_NONE && tpi_ra_node_at(&core->ra, id)->offset < end;
         id = tpi_ra_node_at(&core->ra, id)->addr_next) {
        if (tpi_ra_node_at(&core->ra, id)->state == TPI_RA_NODE_FREE)
            free_parts++;
        else if (!tpi_pool_pins_locked(pool, id))
            return TP_ERR_CORRUPT; /* parked: the caller flushed the front cache */
        else if (*tpi_pool_pins_locked(pool, id) == UINT32_MAX)
            return TP_ERR_BUSY;
    }
    if (!tpi_ra_reserve_nodes(&core->ra, 2 * free_parts) || !tpi_pool_blocks_fit_nodes_locked(core) ||
        !tpi_map_reserve(&core->blocks, core->blocks.count + free_parts))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    for (uint32_t id = first; id != TPI_RA_NONE && tpi_ra_node_at(&core->ra, id)->offset < end;) {
        tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
        uint32_t next = n->addr_next;
        if (n->state == TPI_RA_NODE_FREE) {
            uint64_t lo = TPI_MAX(n->offset, address), hi = TPI_MIN(n->offset + n->size, end);
            uint32_t kept;
            tp_status st = pool->backing->ops->claim(pool->backing, lo, hi - lo, &kept);
            if (st != TP_OK) return TP_ERR_CORRUPT; /* resources were reserved: only a broken invariant */
            /* The graph's use joins the stream order the range already
             * carries (work of another stream that freed it there may still
             * run): merged, never replaced. */
            tpi_ra_node *k = tpi_ra_node_at(&core->ra, kept);
            k->owner = tpi_order_merge(&core->order, k->owner, tpi_order_pending_tag(&core->order, slot));
            *tpi_block_at(core, kept) = (tpi_block){.pins = 1, .flags = TPI_BLOCK_FREED_PINNED};
            tpi_map_put(&core->blocks, lo, kept);
            core->stats.zombie_bytes += hi - lo;
            tpi_stat_add(&core->stats.pub.pinned_bytes, hi - lo);
            next = tpi_ra_node_at(&core->ra, kept)->addr_next;
        } else if ((*tpi_pool_pins_locked(pool, id))++ == 0) {
            tpi_stat_add(&core->stats.pub.pinned_bytes, n->size);
        }
        id = next;
    }
    tpi_stats_update_cached(&core->stats);
    return TP_OK;
}

tp_status tp_pool_capture_end(tp_pool *pool, tp_stream stream, tp_range **out_ranges, size_t *out_count) {
    if (!pool || !out_ranges || !out_count) return TP_ERR_INVALID_ARGUMENT;
    *out_ranges = NULL;
    *out_count = 0;
    tpi_pool_lock(pool);
    uint32_t slot = tpi_order_find_slot(&pool->core.order, stream);
    tpi_stream *s = slot ? tpi_order_stream(&pool->core.order, slot) : NULL;
    tp_status st = s && s->capturing ? TP_OK : TP_ERR_CAPTURE;
    if (st == TP_OK) {
        /* Parked blocks of the stream may be in the footprint: they go
         * back first, so that the stream cannot reuse them after the
         * capture. */
        tpi_front_flush(&pool->front);
        size_t count = merge_ranges(&pool->core.ra, s->captured, s->captured_count);
        /* [count][ranges...]: the count lets tp_pool_free_ranges size the free */
        size_t block_bytes = sizeof(uint64_t) + count * sizeof(tp_range);
        uint64_t *block = tpi_host_alloc(pool->core.host, block_bytes);
        if (!block) st = TP_ERR_HOST_OUT_OF_MEMORY;
        size_t kept = 0;
        while (st == TP_OK && kept < count) {
            st = capture_keep_locked(pool, slot, s->captured[kept].address, s->captured[kept].bytes);
            if (st == TP_OK) kept++;
        }
        if (st != TP_OK) { /* undo: the ranges kept so far lose their pin again */
            for (size_t i = 0; i < kept; i++)
                for_blocks_in_range_locked(pool, s->captured[i].address, s->captured[i].bytes, unpin_visit);
            tpi_host_free(pool->core.host, block, block ? block_bytes : 0);
            s->captured_count = count; /* merged; the capture goes on */
        } else {
            block[0] = count;
            tp_range *ranges = (tp_range *)(block + 1);
            if (count) memcpy(ranges, s->captured, count * sizeof *ranges);
            *out_ranges = ranges;
            *out_count = count;
            s->capturing = false;
            s->captured_count = 0;
            pool->core.order.captures--;
            tpi_front_set_hits(&pool->front, slot, !s->retired);
            if (pool->backing->ops->capture_ended) pool->backing->ops->capture_ended(pool->backing, slot);
        }
    }
    tpi_pool_unlock(pool);
    return st;
}

void tp_pool_free_ranges(tp_pool *pool, tp_range *ranges) {
    if (!pool || !ranges) return;
    uint64_t *block = (uint64_t *)ranges - 1;
    tpi_host_free(pool->core.host, block, sizeof(uint64_t) + block[0] * sizeof(tp_range));
}

