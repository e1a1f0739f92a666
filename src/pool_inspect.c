/* SPDX-License-Identifier: MIT */
/*
 * pool_inspect.c -- looking at a pool from outside: the invariant checker
 * (tp_pool_check) and the memory map (tp_pool_snapshot_json). Part of the
 * public pool API (pool_object.h).
 */
#include "pool_object.h"
#include "text_out.h"

#include <stdio.h>
#include <stdlib.h>

/* ------------------------------------------------------------------ check */

/* The blocks against the statistics, the live maps and the block map:
 * every used node is live (in one live map), freed-pinned (in the block
 * map) or parked (the front cache checks its own entries). */
static bool blocks_agree_locked(tp_pool *pool, char *msg, size_t msg_capacity) {
    tpi_core *core = &pool->core;
    const tp_pool_stats *s = &core->stats.pub;
    uint64_t zombie = 0, zombie_pinned = 0, used = 0, freed_pinned = 0, live_seen = 0;
    for (size_t i = 0; i < core->ra.node_capacity; i++) {
        const tpi_ra_node *n = &core->ra.nodes[i];
        if (n->state != TPI_RA_NODE_USED) continue;
        if (i >= core->info_capacity) TPI_FAIL(msg, msg_capacity, "used node %zu has no block entry", i);
        used++;
        const tpi_block *b = &core->info[i];
        const tpi_live_entry *e = tpi_front_live_find(&pool->front, n->offset, NULL);
        if (e && e->node != i) TPI_FAIL(msg, msg_capacity, "live entry 0x%llx names another node", (unsigned long long)n->offset);
        if (e) live_seen++;
        if (b->flags & TPI_BLOCK_FREED_PINNED) {
            uint64_t mapped;
            if (e) TPI_FAIL(msg, msg_capacity, "freed-pinned node %zu is also live", i);
            if (!tpi_map_get(&core->blocks, n->offset, &mapped) || mapped != i)
                TPI_FAIL(msg, msg_capacity, "freed-pinned node %zu missing from the block map", i);
            if (!b->pins) TPI_FAIL(msg, msg_capacity, "freed-pinned node %zu has no pins", i);
            zombie += n->size;
            zombie_pinned += n->size;
            freed_pinned++;
        } else if (b->pins || b->flags) {
            TPI_FAIL(msg, msg_capacity, "node %zu: a block record without the freed-pinned flag", i);
        }
    }
    uint64_t allocated, requested, pinned, live;
    tpi_front_live_sums(&pool->front, &allocated, &requested, &pinned, &live);
    if (live != live_seen) TPI_FAIL(msg, msg_capacity, "live maps hold %llu blocks, %llu found by node",
                                    (unsigned long long)live, (unsigned long long)live_seen);
    if (freed_pinned != core->blocks.count)
        TPI_FAIL(msg, msg_capacity, "block map holds %zu entries, %llu freed-pinned nodes", core->blocks.count,
                 (unsigned long long)freed_pinned);
    uint64_t parked = tpi_front_parked_count(&pool->front);
    if (used != live + freed_pinned + parked)
        TPI_FAIL(msg, msg_capacity, "%llu used nodes, %llu live + %llu freed-pinned + %llu parked", (unsigned long long)used,
                 (unsigned long long)live, (unsigned long long)freed_pinned, (unsigned long long)parked);
    pinned += zombie_pinned;
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
    tpi_pool_lock(pool);
    bool ok = tpi_pool_check_locked(pool, msg, msg_capacity);
    tpi_pool_unlock(pool);
    return ok ? TP_OK : TP_ERR_CORRUPT;
}

/* ------------------------------------------------------------ memory map */

static int node_order(const void *a, const void *b, void *ra) {
    uint64_t x = tpi_ra_node_at(ra, *(const uint32_t *)a)->offset, y = tpi_ra_node_at(ra, *(const uint32_t *)b)->offset;
    return x < y ? -1 : x > y;
}

/* The stream a tag names, as JSON: its handle, "multi" or 0. */
static void stream_json(text_out *out, tpi_order *order, tpi_tag tag) {
    uint32_t slot = tpi_tag_slot(tag);
    if (tag == TPI_TAG_CLEAN || slot == 0)
        out_printf(out, "0");
    else if (slot == TPI_SLOT_MULTI)
        out_printf(out, "\"multi\"");
    else
        out_printf(out, "\"0x%llx\"", (unsigned long long)(uintptr_t)order->streams[slot].handle);
}

static void range_json(text_out *out, bool *first, uint64_t address, uint64_t bytes, const char *state) {
    out_printf(out, "%s{\"address\":\"0x%llx\",\"bytes\":%llu,\"state\":\"%s\",\"stream\":", *first ? "" : ",",
               (unsigned long long)address, (unsigned long long)bytes, state);
    *first = false;
}

/* A free range: VMM splits it into runs of mapped (cached) and unmapped
 * pages; idle time is that of the first unit under it. */
static void free_range_json_locked(tp_pool *pool, text_out *out, bool *first, const tpi_ra_node *n, uint64_t now) {
    tpi_core *core = &pool->core;
    tpi_units *units = &core->units;
    if (units->kind == TPI_UNITS_SEGMENTS) {
        const tpi_unit *unit = &units->units[n->region];
        range_json(out, first, n->offset, n->size, "cached");
        stream_json(out, &core->order, n->owner);
        out_printf(out, ",\"requested\":0,\"idle_ns\":%llu}",
                   (unsigned long long)(unit->state == TPI_UNIT_IDLE ? now - unit->idle_since_ns : 0));
        return;
    }
    uint64_t end = n->offset + n->size;
    for (uint64_t at = n->offset; at < end;) {
        uint64_t page = tpi_page_of(units, at);
        bool mapped = tpi_page_mapped(units, page);
        uint64_t run_end = at;
        if (page >= units->page_high) run_end = end; /* never mapped from here on */
        while (run_end < end && tpi_page_mapped(units, tpi_page_of(units, run_end)) == mapped)
            run_end = TPI_MIN(tpi_page_address(units, tpi_page_of(units, run_end) + 1), end);
        const tpi_unit *unit = &units->units[page];
        range_json(out, first, at, run_end - at, mapped ? "cached" : "unmapped");
        stream_json(out, &core->order, mapped ? unit->tag : TPI_TAG_CLEAN);
        out_printf(out, ",\"requested\":0,\"idle_ns\":%llu}",
                   (unsigned long long)(mapped && unit->state == TPI_UNIT_IDLE ? now - unit->idle_since_ns : 0));
        at = run_end;
    }
}

tp_status tp_pool_snapshot_json(tp_pool *pool, char *buf, size_t capacity, size_t *out_length) {
    if (!pool || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    if (capacity) buf[0] = '\0';
    tpi_pool_lock(pool);
    tpi_core *core = &pool->core;
    size_t count = 0;
    for (size_t i = 0; i < core->ra.node_capacity; i++) count += core->ra.nodes[i].state != TPI_RA_NODE_UNUSED;
    uint32_t *order = tpi_host_alloc(core->host, (count ? count : 1) * sizeof *order);
    if (!order) {
        tpi_pool_unlock(pool);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    count = 0;
    for (size_t i = 0; i < core->ra.node_capacity; i++)
        if (core->ra.nodes[i].state != TPI_RA_NODE_UNUSED) order[count++] = (uint32_t)i;
    qsort_r(order, count, sizeof *order, node_order, &core->ra);
    uint64_t now = tpi_units_now(&core->units);
    text_out out = {buf, capacity, 0, false};
    out_printf(&out, "{\"kind\":\"%s\",\"now_ns\":%llu,\"reserved_bytes\":%llu,\"ranges\":[",
               core->config.kind == TP_POOL_VMM ? "vmm" : "segment", (unsigned long long)now,
               (unsigned long long)core->stats.pub.reserved_bytes.current);
    bool first = true;
    for (size_t k = 0; k < count; k++) {
        const tpi_ra_node *n = tpi_ra_node_at(&core->ra, order[k]);
        if (n->state == TPI_RA_NODE_FREE) {
            free_range_json_locked(pool, &out, &first, n, now);
            continue;
        }
        const tpi_block *b = tpi_block_at(core, order[k]);
        uint32_t live_slot = 0;
        const tpi_live_entry *e = tpi_front_live_find(&pool->front, n->offset, &live_slot);
        tpi_tag tag = n->owner;
        const char *state = "parked";
        if (e)
            state = e->pins ? "pinned" : "live";
        else if (b->flags & TPI_BLOCK_FREED_PINNED)
            state = "freed_pinned";
        else
            tpi_front_parked(&pool->front, order[k], &tag); /* its tag is the cache entry's */
        range_json(&out, &first, n->offset, n->size, state);
        stream_json(&out, &core->order, e ? tpi_tag_make(live_slot, 0) : tag);
        out_printf(&out, ",\"requested\":%llu,\"idle_ns\":0}", (unsigned long long)(e ? e->requested : 0));
    }
    out_printf(&out, "]}");
    tpi_host_free(core->host, order, (count ? count : 1) * sizeof *order);
    tpi_pool_unlock(pool);
    return out_finish(&out, out_length);
}
