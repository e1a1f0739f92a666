/*
 * pool_segment.c -- the segment backing, for devices without VMM: plain
 * device allocations (segments) split and coalesced inside, whole idle
 * segments given back.
 *
 * Algorithm: every segment is a region of the shared range allocator, so a
 * request takes the best-fitting free range of any segment. A miss mallocs a
 * new segment: requests up to 1 MiB get a small segment (2 MiB), up to
 * 10 MiB a medium one (20 MiB), larger ones a segment of their own rounded
 * up a geometric ladder (2 MiB steps, then +growth_step_percent each), so a
 * request that grows a little every step -- the flash-attention temporaries
 * of design.md failure mode 1 -- needs a new segment only O(log n) times,
 * and each new segment retires the idle ones it replaces (the release
 * before growth). An idle segment more than four times a request's size is
 * woken up for it only while the segment is warm (it held a block of at
 * least a quarter of its size within idle_release_ns): a working set that
 * rotates through sizes keeps reusing it, while a one-off huge temporary
 * goes cold and ages out instead of being pinned forever by small blocks.
 *
 * Invariants (segment_check): a unit's live count equals the used nodes in
 * its segment; an idle segment is one free node spanning it; reserved bytes
 * equal the segments' bytes.
 */
#include "pool_internal.h"

#include <stdio.h>

#define SMALL_REQUEST_MAX (1 * TP_MiB)
#define MEDIUM_REQUEST_MAX (10 * TP_MiB)
#define LADDER_BASE (2 * TP_MiB)

static tp_status segment_init(tp_pool *pool) {
    (void)pool;
    return TP_OK;
}

static void segment_destroy(tp_pool *pool) {
    for (size_t u = 0; u < pool->unit_capacity; u++) {
        pool_unit *unit = &pool->units[u];
        if (unit->state == UNIT_UNUSED) continue;
        tp_status st = pool->ops->mem_free(pool->device, unit->base, unit->bytes);
        tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
        if (st != TP_OK)
            tp_logf(&pool->device->logger, TP_LOG_ERROR, "segment pool destroy: free of %llu bytes failed: %s",
                    (unsigned long long)unit->bytes, tp_status_name(st));
        tp_pool_reserved_changed(pool, -(int64_t)unit->bytes);
    }
}

/* Smallest ladder size holding bytes: 2 MiB steps while a step of
 * growth_step_percent is smaller than 2 MiB, then geometric. */
static uint64_t ladder_size(const tp_pool *pool, uint64_t bytes) {
    uint64_t size = LADDER_BASE;
    while (size < bytes) {
        uint64_t step = size / 100 * pool->config.growth_step_percent;
        size += tp_align_up(TP_MAX(step, LADDER_BASE), LADDER_BASE);
    }
    return size;
}

static uint64_t segment_bytes_for(const tp_pool *pool, uint64_t size) {
    if (size <= SMALL_REQUEST_MAX && size <= pool->config.small_segment_bytes) return pool->config.small_segment_bytes;
    if (size <= MEDIUM_REQUEST_MAX && size <= pool->config.medium_segment_bytes) return pool->config.medium_segment_bytes;
    return tp_align_up(ladder_size(pool, size), pool->config.alignment_bytes);
}

typedef struct wake_ctx {
    tp_pool *pool;
    uint64_t wake_limit_bytes;
    uint64_t now_ns; /* read on first need */
} wake_ctx;

/* Free space in a busy segment is always fair game; an idle segment when it
 * is not much larger than the request, or still warm. */
static bool accept_segment(void *c, tp_ra *ra, uint32_t id) {
    wake_ctx *ctx = c;
    const pool_unit *unit = &ctx->pool->units[tp_ra_node_at(ra, id)->unit];
    if (unit->state != UNIT_IDLE || unit->bytes <= ctx->wake_limit_bytes) return true;
    if (!ctx->now_ns) ctx->now_ns = tp_pool_now(ctx->pool) + 1;
    return ctx->now_ns - 1 - unit->last_big_use_ns < ctx->pool->config.idle_release_ns;
}

static tp_status segment_try_alloc(tp_pool *pool, uint64_t size, uint32_t slot, uint32_t *out_node,
                                   uint64_t *out_need) {
    uint64_t segment_bytes = segment_bytes_for(pool, size);
    wake_ctx ctx = {pool, TP_MAX(4 * size, segment_bytes), 0};
    uint32_t id = tp_pool_find_usable(pool, size, slot, accept_segment, &ctx);
    if (id == RA_NONE && pool->tcache_bytes) {
        tp_pool_tcache_flush(pool);
        id = tp_pool_find_usable(pool, size, slot, accept_segment, &ctx);
    }
    if (id == RA_NONE) {
        tp_pool_release_before_growth(pool, segment_bytes);
        uint64_t reserved = pool->stats.reserved_bytes.current;
        if (reserved + segment_bytes > pool->config.limit_bytes) {
            /* A smaller segment that just holds the request may still fit. */
            segment_bytes = tp_align_up(size, pool->config.alignment_bytes);
            if (reserved + segment_bytes > pool->config.limit_bytes) {
                *out_need = reserved + segment_bytes - pool->config.limit_bytes;
                return TP_ERR_OUT_OF_MEMORY;
            }
        }
        uint32_t u = tp_pool_unit_new(pool);
        if (u == POOL_NONE) return TP_ERR_HOST_OUT_OF_MEMORY;
        uint64_t base = 0;
        tp_status st = pool->ops->mem_alloc(pool->device, segment_bytes, &base);
        tp_pool_count_device_call(pool, st, DEVICE_CALL_ALLOC);
        uint64_t exact = tp_align_up(size, pool->config.alignment_bytes);
        if (st == TP_ERR_OUT_OF_MEMORY && segment_bytes > exact) {
            /* The device may still hold the request without the rounding. */
            segment_bytes = exact;
            st = pool->ops->mem_alloc(pool->device, segment_bytes, &base);
            tp_pool_count_device_call(pool, st, DEVICE_CALL_ALLOC);
        }
        if (st != TP_OK) {
            tp_pool_unit_recycle(pool, u);
            *out_need = segment_bytes;
            return st;
        }
        id = tp_ra_add_region(&pool->ra, base, segment_bytes, u, (tp_tag){RA_TAG_CLEAN, 0});
        if (id == RA_NONE) {
            st = pool->ops->mem_free(pool->device, base, segment_bytes);
            tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
            tp_pool_unit_recycle(pool, u);
            return TP_ERR_HOST_OUT_OF_MEMORY;
        }
        pool_unit *unit = &pool->units[u];
        unit->base = base;
        unit->bytes = segment_bytes;
        unit->live = 0;
        unit->tag = (tp_tag){RA_TAG_CLEAN, 0};
        tp_pool_reserved_changed(pool, (int64_t)segment_bytes);
    }
    uint32_t u = tp_ra_node_at(&pool->ra, id)->unit;
    if (tp_ra_take(&pool->ra, id, size) == RA_NONE) {
        if (pool->units[u].live == 0 && pool->units[u].state == UNIT_BUSY) { /* a fresh segment: keep it, idle */
            pool->units[u].idle_node = id;
            tp_pool_unit_became_idle(pool, u);
        }
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    if (pool->units[u].live++ == 0 && pool->units[u].state == UNIT_IDLE) tp_pool_unit_became_busy(pool, u);
    if (size * 4 >= pool->units[u].bytes) pool->units[u].last_big_use_ns = tp_pool_now(pool);
    *out_node = id;
    return TP_OK;
}

static void segment_after_release(tp_pool *pool, uint64_t offset, uint64_t size, uint32_t free_node, tp_tag tag) {
    (void)offset;
    (void)size;
    uint32_t u = tp_ra_node_at(&pool->ra, free_node)->unit;
    pool_unit *unit = &pool->units[u];
    unit->tag = tp_ra_merge_tags(unit->tag, tag, pool->ra.multi_epoch);
    if (--unit->live == 0) {
        unit->idle_node = free_node;
        tp_pool_unit_became_idle(pool, u);
    }
}

static tp_status segment_release_unit(tp_pool *pool, uint32_t u, uint64_t idle_before_ns, uint64_t max_bytes) {
    (void)idle_before_ns; /* segments go back one at a time */
    (void)max_bytes;
    pool_unit *unit = &pool->units[u];
    tp_status st = pool->ops->mem_free(pool->device, unit->base, unit->bytes);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
    if (st != TP_OK) return st;
    tp_ra_remove_region(&pool->ra, unit->idle_node);
    tp_pool_reserved_changed(pool, -(int64_t)unit->bytes);
    tp_pool_unit_recycle(pool, u);
    return TP_OK;
}

static void segment_free_figures(tp_pool *pool, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges) {
    *out_free = pool->ra.free_bytes;
    *out_largest = tp_ra_largest_free(&pool->ra);
    *out_ranges = pool->ra.free_count;
}

static bool segment_check(tp_pool *pool, char *msg, size_t capacity) {
    size_t units = pool->unit_capacity;
    uint64_t *covered = tp_host_calloc(pool->host, units ? units : 1, sizeof *covered);
    uint64_t *used = tp_host_calloc(pool->host, units ? units : 1, sizeof *used);
    bool ok = covered && used;
    for (size_t i = 0; ok && i < pool->ra.node_capacity; i++) {
        const tp_ra_node *n = &pool->ra.nodes[i];
        if (n->state == RA_NODE_UNUSED) continue;
        const pool_unit *unit = n->unit < units ? &pool->units[n->unit] : NULL;
        if (!unit || unit->state == UNIT_UNUSED || n->offset < unit->base ||
            n->offset + n->size > unit->base + unit->bytes) {
            if (msg && capacity) snprintf(msg, capacity, "node %zu lies outside its segment", i);
            ok = false;
            break;
        }
        covered[n->unit] += n->size;
        used[n->unit] += n->state == RA_NODE_USED;
    }
    for (uint32_t u = 0; ok && u < units; u++) {
        const pool_unit *unit = &pool->units[u];
        if (unit->state == UNIT_UNUSED) continue;
        if (covered[u] != unit->bytes || used[u] != unit->live || (unit->state == UNIT_IDLE) != (used[u] == 0)) {
            if (msg && capacity)
                snprintf(msg, capacity, "segment %u: covered %llu of %llu bytes, %llu used nodes, live %llu", u,
                         (unsigned long long)covered[u], (unsigned long long)unit->bytes,
                         (unsigned long long)used[u], (unsigned long long)unit->live);
            ok = false;
        } else if (unit->state == UNIT_IDLE) {
            const tp_ra_node *n = tp_ra_node_at(&pool->ra, unit->idle_node);
            if (n->state != RA_NODE_FREE || n->offset != unit->base || n->size != unit->bytes) {
                if (msg && capacity) snprintf(msg, capacity, "idle segment %u: its free node does not span it", u);
                ok = false;
            }
        }
    }
    tp_host_free(pool->host, covered, (units ? units : 1) * sizeof *covered);
    tp_host_free(pool->host, used, (units ? units : 1) * sizeof *used);
    return ok;
}

const pool_backend tp_segment_backend = {
    .name = "segment",
    .init = segment_init,
    .destroy = segment_destroy,
    .try_alloc = segment_try_alloc,
    .after_release = segment_after_release,
    .release_unit = segment_release_unit,
    .check = segment_check,
    .free_figures = segment_free_figures,
};
