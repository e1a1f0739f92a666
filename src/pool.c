/*
 * pool.c -- the public pool API: create/destroy, alloc/free, trim and tick,
 * pins, capture, forgetting streams, statistics and the checker. It
 * orchestrates the layers below (pool_core.h draws them) and holds the one
 * lock.
 *
 * The path of one allocation
 *   tp_pool_alloc: stream -> slot (stream order); the front cache's parked
 *   block for the size and stream if there is one (the hit path: no range
 *   allocator, no device call); else the ladder (oom_ladder.c) asks the
 *   backing for room -- good fit among free ranges the stream may use, and
 *   growth (pages mapped, or a new segment) when none fits -- and climbs
 *   its steps when the device or the limit says no. The block goes into the
 *   block map; statistics, the hazard checker and capture see it.
 *
 * The path of one free
 *   tp_pool_free: block map -> node; the stream tags it (stream order: safe
 *   for others once the stream's next event completes); a pinned block is
 *   kept as freed-pinned; otherwise the front cache parks it, or the
 *   backing takes it back (range merged with free neighbours, units left
 *   without live blocks become idle). Every POOL_UPKEEP_FREES frees the
 *   pool looks at the clock: aged idle units go back to the device.
 *
 * Invariants (tp_pool_check): each layer's own (range allocator, units,
 * front cache, backing), and here: every block-map entry is a used node
 * starting at its key and every used node is in the map; allocated,
 * requested, pinned and freed-pinned bytes equal sums over the blocks;
 * cached = reserved - allocated - freed-pinned; reserved <= limit.
 *
 * Locking: one mutex per pool around every public call; helpers that need
 * it held end in _locked. Reclaim callbacks run with it released.
 */
#include "oom_ladder.h"

#include <stdlib.h>
#include <string.h>

#define POOL_FRONT_MAX_BLOCK (64 * TPI_MiB)
#define POOL_FRONT_MAX_BLOCK_VMM (64 * TPI_KiB)
/* Every this many frees the pool looks at the clock (upkeep_locked). */
#define POOL_UPKEEP_FREES 256

struct tp_pool {
    pthread_mutex_t lock;
    tpi_core core;
    tpi_backing *backing;
    tpi_front front;
    tpi_ladder ladder;
    uint64_t calls_at_tick; /* allocs + frees at the previous tp_pool_tick */
    uint32_t frees_since_upkeep;
    uint64_t last_upkeep_ns;
};

/* ---------------------------------------------------------------- blocks */

/* Room in the per-node block table for every node the range allocator has. */
static bool blocks_fit_nodes_locked(tpi_core *core) {
    if (core->info_capacity >= core->ra.node_capacity) return true;
    size_t old = core->info_capacity;
    if (!tpi_host_grow(core->host, (void **)&core->info, sizeof *core->info, &core->info_capacity, core->ra.node_capacity))
        return false;
    memset(core->info + old, 0, (core->info_capacity - old) * sizeof *core->info);
    return true;
}

/* A block the caller gave back (or never got) returns to the backing. */
static void release_block_locked(tp_pool *pool, uint32_t node) {
    tpi_map_remove(&pool->core.blocks, tpi_ra_node_at(&pool->core.ra, node)->offset, NULL);
    tpi_block_at(&pool->core, node)->flags = 0;
    pool->backing->ops->release_block(pool->backing, node, 0);
}

/* ------------------------------------------------------------- lifecycle */

static tp_status resolve_config(tp_device *device, const tp_pool_config *in, tp_pool_config *out) {
    *out = in ? *in : (tp_pool_config){0};
    const tp_device_info *info = &device->info;
    if (out->kind == TP_POOL_AUTO) out->kind = info->vmm_enabled ? TP_POOL_VMM : TP_POOL_SEGMENT;
    if (out->kind != TP_POOL_VMM && out->kind != TP_POOL_SEGMENT) return TP_ERR_INVALID_ARGUMENT;
    if (out->kind == TP_POOL_VMM && !info->vmm_enabled) return TP_ERR_UNSUPPORTED;
    if (!out->limit_bytes) out->limit_bytes = info->capacity_bytes;
    if (!out->release_threshold_bytes) out->release_threshold_bytes = out->kind == TP_POOL_VMM ? 64 * TPI_MiB : 16 * TPI_MiB;
    if (!out->idle_release_ns) out->idle_release_ns = 10000000000ull;
    if (!out->alignment_bytes) out->alignment_bytes = 256;
    if (!tpi_is_pow2(out->alignment_bytes) || out->alignment_bytes < 256) return TP_ERR_INVALID_ARGUMENT;
    if (!out->page_bytes) out->page_bytes = info->granularity_bytes;
    if (!tpi_is_pow2(out->page_bytes) || out->page_bytes % info->granularity_bytes) return TP_ERR_INVALID_ARGUMENT;
    if (!out->max_map_bytes) out->max_map_bytes = TPI_GiB;
    out->max_map_bytes = tpi_align_up(TPI_MAX(out->max_map_bytes, out->page_bytes), out->page_bytes);
    if (out->kind == TP_POOL_VMM) {
        /* The reservation: twice what the pool can hold, which is never
         * more than the device (an unlimited pool included). */
        uint64_t holdable = TPI_MIN(out->limit_bytes, info->capacity_bytes);
        if (!out->va_reserve_bytes) out->va_reserve_bytes = holdable > UINT64_MAX / 4 ? holdable : 2 * holdable;
        uint64_t va_granule = TPI_MAX(out->page_bytes, out->alignment_bytes);
        uint64_t va = TPI_MAX(out->va_reserve_bytes, holdable);
        if (va > UINT64_MAX / 2) return TP_ERR_INVALID_ARGUMENT;
        out->va_reserve_bytes = tpi_align_up(va, va_granule);
    }
    /* Segments hold whole aligned blocks: by default at least one alignment. */
    if (!out->small_segment_bytes) out->small_segment_bytes = TPI_MAX(2 * TPI_MiB, out->alignment_bytes);
    if (!out->medium_segment_bytes) out->medium_segment_bytes = tpi_align_up(20 * TPI_MiB, out->alignment_bytes);
    if (!out->growth_step_percent) out->growth_step_percent = 6;
    if (!out->tcache_max_block_bytes)
        out->tcache_max_block_bytes = out->kind == TP_POOL_VMM ? POOL_FRONT_MAX_BLOCK_VMM : POOL_FRONT_MAX_BLOCK;
    if (out->small_segment_bytes % out->alignment_bytes || out->medium_segment_bytes % out->alignment_bytes)
        return TP_ERR_INVALID_ARGUMENT;
    return TP_OK;
}

/* Builds the layers bottom-up; unwinds what it built when one fails. */
static tp_status layers_init(tp_pool *pool) {
    tpi_core *core = &pool->core;
    const tp_pool_config *config = &core->config;
    tpi_map_init(&core->blocks, &core->host->allocator);
    tp_status st = tpi_order_init(&core->order, core->device, &core->stats);
    if (st != TP_OK) return st;
    st = tpi_ra_init(&core->ra, core->host, config->alignment_bytes, tpi_order_merge_hook, &core->order);
    if (st != TP_OK) goto no_ra;
    st = config->kind == TP_POOL_VMM ? tpi_vmm_create(core, &pool->backing) : tpi_segment_create(core, &pool->backing);
    if (st != TP_OK) goto no_backing;
    /* The segment pool parks blocks up to 64 MiB. The VMM pool parks only
     * small ones: a parked block keeps its pages busy, and large ones would
     * pin pages that a request of another size could use without mapping.
     * Larger blocks use the one last-freed slot, emptied by the next
     * allocation. */
    uint64_t front_limit = TPI_MIN(config->release_threshold_bytes, config->kind == TP_POOL_VMM ? 32 * TPI_MiB : 256 * TPI_MiB);
    st = tpi_front_init(&pool->front, core, pool->backing, front_limit, config->tcache_max_block_bytes);
    if (st != TP_OK) goto no_front;
    st = tpi_ladder_init(&pool->ladder, core, &pool->front, pool->backing, pool, &pool->lock);
    if (st == TP_OK) return TP_OK;
    tpi_front_destroy(&pool->front);
no_front:
    pool->backing->ops->destroy(pool->backing);
    tpi_units_destroy(&core->units);
no_backing:
    tpi_ra_destroy(&core->ra);
no_ra:
    tpi_order_destroy(&core->order);
    return st;
}

tp_status tp_pool_create(tp_device *device, const tp_pool_config *config, tp_pool **out_pool) {
    if (!device || !out_pool) return TP_ERR_INVALID_ARGUMENT;
    *out_pool = NULL;
    tp_pool_config resolved;
    tp_status st = resolve_config(device, config, &resolved);
    if (st != TP_OK) {
        tpi_logf(&device->logger, TP_LOG_ERROR, "tp_pool_create: invalid config (%s)", tp_status_name(st));
        return st;
    }
    tp_pool *pool = tpi_host_calloc(&device->host, 1, sizeof *pool);
    if (!pool) return TP_ERR_HOST_OUT_OF_MEMORY;
    tpi_core *core = &pool->core;
    core->device = device;
    core->ops = device->ops;
    core->host = &device->host;
    core->config = resolved;
    core->stats.pub.kind = resolved.kind;
    core->stats.pub.limit_bytes = resolved.limit_bytes;
    if (pthread_mutex_init(&pool->lock, NULL) != 0) {
        tpi_host_free(&device->host, pool, sizeof *pool);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    st = layers_init(pool);
    if (st != TP_OK) {
        pthread_mutex_destroy(&pool->lock);
        tpi_host_free(&device->host, pool, sizeof *pool);
        return st;
    }
    atomic_fetch_add(&device->users, 1);
    *out_pool = pool;
    return TP_OK;
}

tp_status tp_pool_destroy(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_core *core = &pool->core;
    tp_device *device = core->device;
    pthread_mutex_lock(&pool->lock);
    tpi_front_flush(&pool->front);
    /* Queued work on any stream the pool has seen may still use its memory. */
    tp_status result = tpi_order_synchronize_all(&core->order);
    if (core->ra.used_count)
        tpi_logf(&device->logger, TP_LOG_WARN, "tp_pool_destroy: %llu blocks still live (%llu bytes) are released",
                (unsigned long long)core->ra.used_count, (unsigned long long)core->stats.pub.allocated_bytes.current);
    tpi_ladder_destroy(&pool->ladder);
    tpi_front_destroy(&pool->front);
    pool->backing->ops->destroy(pool->backing);
    tpi_units_destroy(&core->units);
    tpi_ra_destroy(&core->ra);
    tpi_order_destroy(&core->order);
    tpi_map_destroy(&core->blocks);
    tpi_host_free(core->host, core->info, core->info_capacity * sizeof *core->info);
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_destroy(&pool->lock);
    tpi_host_free(&device->host, pool, sizeof *pool);
    atomic_fetch_sub(&device->users, 1);
    return result;
}

/* --------------------------------------------------------- alloc and free */

static bool check_locked(tp_pool *pool, char *msg, size_t msg_capacity);

static void check_invariants_if_asked_locked(tp_pool *pool) {
    if (!(pool->core.config.flags & TP_POOL_FLAG_CHECK_INVARIANTS)) return;
    char msg[256];
    if (!check_locked(pool, msg, sizeof msg))
        tpi_logf(&pool->core.device->logger, TP_LOG_ERROR, "pool invariant violated: %s", msg);
}

/* Records a block allocated during a capture. It is freed and reused
 * within the capture like any block of its stream; what the graph keeps is
 * settled at capture end (capture_keep_locked). */
static tp_status capture_note_locked(tp_pool *pool, tpi_stream *s, uint32_t node) {
    tpi_core *core = &pool->core;
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    if (!tpi_host_grow(core->host, (void **)&s->captured, sizeof *s->captured, &s->captured_capacity,
                       s->captured_count + 1))
        return TP_ERR_HOST_OUT_OF_MEMORY;
    s->captured[s->captured_count++] = (tp_range){n->offset, n->size};
    return TP_OK;
}

/* A block found by the ladder, made known to the block map. */
static tp_status ladder_alloc_locked(tp_pool *pool, uint64_t size, size_t bytes, uint32_t slot, uint32_t *out_node) {
    tpi_core *core = &pool->core;
    if (size > core->config.limit_bytes) {
        tpi_ladder_report_oom_locked(&pool->ladder, bytes, core->stats.last_device_status);
        return TP_ERR_OUT_OF_MEMORY;
    }
    uint64_t device_allocs = core->stats.pub.device_allocs;
    tp_status st = tpi_ladder_alloc_locked(&pool->ladder, size, bytes, slot, out_node);
    if (st != TP_OK) return st;
    if (core->stats.pub.device_allocs == device_allocs) core->stats.pub.cache_hits++;
    uint64_t offset = tpi_ra_node_at(&core->ra, *out_node)->offset;
    if (!blocks_fit_nodes_locked(core) || !tpi_map_put(&core->blocks, offset, *out_node)) {
        tpi_ra_node_at(&core->ra, *out_node)->owner = tpi_order_pending_tag(&core->order, slot);
        pool->backing->ops->release_block(pool->backing, *out_node, 0);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    return TP_OK;
}

tp_status tp_pool_alloc(tp_pool *pool, size_t bytes, tp_stream stream, void **out_ptr) {
    if (!out_ptr) return TP_ERR_INVALID_ARGUMENT;
    *out_ptr = NULL;
    if (!pool || bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    tpi_core *core = &pool->core;
    uint64_t align = core->config.alignment_bytes;
    /* Too large to round: larger than any limit, so out of memory below. */
    uint64_t size = (uint64_t)bytes > UINT64_MAX - align ? UINT64_MAX : tpi_align_up(bytes, align);

    pthread_mutex_lock(&pool->lock);
    uint32_t slot, node;
    tp_status st = tpi_order_slot(&core->order, stream, &slot);
    if (st != TP_OK) goto out;
    node = tpi_front_pop(&pool->front, size, slot);
    if (node != TPI_RA_NONE) {
        core->stats.pub.cache_hits++;
    } else {
        st = ladder_alloc_locked(pool, size, bytes, slot, &node);
        if (st != TP_OK) goto out;
    }
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    *tpi_block_at(core, node) = (tpi_block){.requested = bytes};
    tp_pool_stats *s = &core->stats.pub;
    s->allocs++;
    tpi_stat_add(&s->requested_bytes, bytes);
    tpi_stat_add(&s->allocated_bytes, n->size);
    tpi_stats_update_cached(&core->stats);
    if (core->device->hazard_checker) s->hazards += core->ops->check_handout(core->device, n->offset, n->size, stream);
    tpi_stream *stream_state = tpi_order_stream(&core->order, slot);
    if (stream_state->capturing) {
        st = capture_note_locked(pool, stream_state, node);
        if (st != TP_OK) { /* cannot track it: undo the allocation */
            s->allocs--;
            tpi_stat_sub(&s->requested_bytes, bytes);
            tpi_stat_sub(&s->allocated_bytes, n->size);
            n->owner = tpi_order_pending_tag(&core->order, slot);
            release_block_locked(pool, node);
            tpi_stats_update_cached(&core->stats);
            goto out;
        }
    }
    *out_ptr = (void *)(uintptr_t)n->offset;
out:
    check_invariants_if_asked_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* Why a pointer that is not a live block's start cannot be freed. */
static tp_status classify_bad_pointer_locked(tp_pool *pool, uint64_t address) {
    uint32_t id = tpi_ra_node_containing(&pool->core.ra, address);
    if (id == TPI_RA_NONE) return TP_ERR_NOT_OWNED;
    tpi_ra_node *n = tpi_ra_node_at(&pool->core.ra, id);
    if (n->state == TPI_RA_NODE_FREE) return TP_ERR_DOUBLE_FREE;
    if (n->offset != address) return TP_ERR_NOT_BLOCK_START;
    return TP_ERR_DOUBLE_FREE; /* a parked or pinned-freed block */
}

/* Every POOL_UPKEEP_FREES frees: idle memory above the threshold that has
 * aged goes back; at most every idle_release_ns / 2 the front cache is
 * flushed first, so parked blocks cannot keep a unit busy forever. */
static void upkeep_locked(tp_pool *pool) {
    tpi_core *core = &pool->core;
    pool->frees_since_upkeep = 0;
    if (core->config.idle_release_ns == TP_NS_NEVER) return;
    uint64_t now = tpi_units_now(&core->units);
    if (now - pool->last_upkeep_ns >= core->config.idle_release_ns / 2) {
        pool->last_upkeep_ns = now;
        tpi_front_flush(&pool->front);
        tpi_units_release_aged(&core->units, true);
    } else if (core->units.idle_bytes > core->config.release_threshold_bytes) {
        tpi_units_release_aged(&core->units, false);
    }
}

tp_status tp_pool_free(tp_pool *pool, void *ptr, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    if (!ptr) return TP_OK;
    tpi_core *core = &pool->core;
    uint64_t address = (uint64_t)(uintptr_t)ptr;
    pthread_mutex_lock(&pool->lock);
    tp_status st = TP_OK;
    uint64_t *found = tpi_map_find(&core->blocks, address);
    uint32_t node = found ? (uint32_t)*found : TPI_RA_NONE;
    tpi_block *block = found ? tpi_block_at(core, node) : NULL;
    if (!block || (block->flags & (TPI_BLOCK_PARKED | TPI_BLOCK_FREED_PINNED))) {
        st = block ? TP_ERR_DOUBLE_FREE : classify_bad_pointer_locked(pool, address);
        tpi_logf(&core->device->logger, TP_LOG_ERROR, "tp_pool_free(0x%llx): %s", (unsigned long long)address,
                tp_status_describe(st));
        goto out;
    }
    uint32_t slot;
    st = tpi_order_slot(&core->order, stream, &slot);
    if (st != TP_OK) goto out;
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    n->owner = tpi_order_note_free(&core->order, slot);
    tp_pool_stats *s = &core->stats.pub;
    s->frees++;
    tpi_stat_sub(&s->requested_bytes, block->requested);
    tpi_stat_sub(&s->allocated_bytes, n->size);
    if (s->allocated_bytes.current < core->stats.allocated_low_water)
        core->stats.allocated_low_water = s->allocated_bytes.current;
    s->cached_bytes.total += n->size;
    if (block->pins) {
        block->flags |= TPI_BLOCK_FREED_PINNED;
        core->stats.zombie_bytes += n->size;
    } else if (tpi_order_stream(&core->order, slot)->capturing || !tpi_front_push(&pool->front, node)) {
        /* (A capture's frees are not parked: merged with their neighbours,
         * they serve its later requests of any size, which keeps the
         * graph's footprint near its peak.) */
        release_block_locked(pool, node);
    }
    tpi_stats_update_cached(&core->stats);
    if (++pool->frees_since_upkeep >= POOL_UPKEEP_FREES) upkeep_locked(pool);
out:
    check_invariants_if_asked_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_block_size(tp_pool *pool, const void *ptr, size_t *out_bytes) {
    if (!pool || !out_bytes) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    uint64_t *found = tpi_map_find(&pool->core.blocks, (uint64_t)(uintptr_t)ptr);
    tp_status st = TP_ERR_NOT_OWNED;
    if (found) {
        const tpi_block *block = tpi_block_at(&pool->core, (uint32_t)*found);
        if (!(block->flags & (TPI_BLOCK_PARKED | TPI_BLOCK_FREED_PINNED))) {
            *out_bytes = (size_t)block->requested;
            st = TP_OK;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* ---------------------------------------------------------- trim and tick */

tp_status tp_pool_trim(tp_pool *pool, uint64_t target_reserved_bytes, uint64_t *out_released_bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tpi_core *core = &pool->core;
    tpi_front_flush(&pool->front);
    uint64_t released = 0;
    for (int blocking = 0; blocking <= 1; blocking++) {
        uint64_t reserved = core->stats.pub.reserved_bytes.current;
        if (reserved <= target_reserved_bytes) break;
        released += tpi_units_release_idle(&core->units, reserved - target_reserved_bytes, blocking, 0, 0);
    }
    if (out_released_bytes) *out_released_bytes = released;
    check_invariants_if_asked_locked(pool);
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

tp_status tp_pool_tick(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tpi_core *core = &pool->core;
    uint64_t idle_ns = core->config.idle_release_ns;
    if (idle_ns != TP_NS_NEVER) {
        /* Parked blocks go back only once the pool has gone quiet (no
         * alloc or free since the previous tick): a busy pool is about to
         * reuse them, and its frees run the periodic upkeep anyway.
         * Flushing on every tick moved blocks mid-step: replayed with a
         * tick a second, decode_growing_kv held 1.033x peak live on VMM
         * instead of 1.008x, gemma3_mtmd 1.080x on segment for 1.057x.
         * The last-freed slot's block is cold once idle_ns has passed since
         * its free, busy pool or not. */
        uint64_t calls = core->stats.pub.allocs + core->stats.pub.frees;
        if (calls == pool->calls_at_tick)
            tpi_front_flush(&pool->front);
        else
            tpi_front_release_cold_slot(&pool->front, tpi_units_now(&core->units), idle_ns);
        pool->calls_at_tick = calls;
        tpi_units_release_aged(&core->units, true);
    }
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

/* ---------------------------------------------------------------- reclaim */

tp_status tp_pool_add_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user) {
    if (!pool || !fn) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = tpi_ladder_add_reclaimer_locked(&pool->ladder, fn, user);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_remove_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user) {
    if (!pool || !fn) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = tpi_ladder_remove_reclaimer_locked(&pool->ladder, fn, user);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* ------------------------------------------------------------------- pins */

/* Calls visit on every block overlapping [address, +bytes) after checking
 * that the whole range lies in blocks visit accepts. */
typedef bool (*block_visit_fn)(tp_pool *pool, uint32_t node, bool apply);

static tp_status for_blocks_in_range_locked(tp_pool *pool, uint64_t address, uint64_t bytes, block_visit_fn visit) {
    tpi_core *core = &pool->core;
    if (bytes == 0 || bytes > UINT64_MAX - address) return TP_ERR_INVALID_ARGUMENT;
    uint64_t *found = tpi_map_find(&core->blocks, address);
    uint32_t first = found ? (uint32_t)*found : tpi_ra_node_containing(&core->ra, address);
    if (first == TPI_RA_NONE) return TP_ERR_NOT_OWNED;
    uint64_t end = address + bytes;
    for (int apply = 0; apply <= 1; apply++) {
        for (uint32_t id = first; id != TPI_RA_NONE;) {
            tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
            uint32_t next = n->addr_next;
            uint64_t node_end = n->offset + n->size;
            if (!apply && (n->state != TPI_RA_NODE_USED || (tpi_block_at(core, id)->flags & TPI_BLOCK_PARKED) ||
                           !visit(pool, id, false)))
                return TP_ERR_INVALID_ARGUMENT;
            if (apply) visit(pool, id, true);
            if (node_end >= end) break;
            if (next == TPI_RA_NONE) {
                if (!apply) return TP_ERR_INVALID_ARGUMENT; /* range runs past the region */
                break;
            }
            id = next;
        }
    }
    return TP_OK;
}

static bool pin_visit(tp_pool *pool, uint32_t node, bool apply) {
    tpi_block *block = tpi_block_at(&pool->core, node);
    if (!apply) return block->pins < UINT32_MAX;
    if (block->pins++ == 0) tpi_stat_add(&pool->core.stats.pub.pinned_bytes, tpi_ra_node_at(&pool->core.ra, node)->size);
    return true;
}

static bool unpin_visit(tp_pool *pool, uint32_t node, bool apply) {
    tpi_core *core = &pool->core;
    tpi_block *block = tpi_block_at(core, node);
    if (!apply) return block->pins > 0;
    if (--block->pins == 0) {
        uint64_t size = tpi_ra_node_at(&core->ra, node)->size;
        tpi_stat_sub(&core->stats.pub.pinned_bytes, size);
        if (block->flags & TPI_BLOCK_FREED_PINNED) {
            core->stats.zombie_bytes -= size;
            release_block_locked(pool, node);
            tpi_stats_update_cached(&core->stats);
        }
    }
    return true;
}

tp_status tp_pool_pin(tp_pool *pool, const void *ptr, size_t bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = for_blocks_in_range_locked(pool, (uint64_t)(uintptr_t)ptr, bytes, pin_visit);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

tp_status tp_pool_unpin(tp_pool *pool, const void *ptr, size_t bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = for_blocks_in_range_locked(pool, (uint64_t)(uintptr_t)ptr, bytes, unpin_visit);
    if (st == TP_OK && pool->core.units.idle_bytes > pool->core.config.release_threshold_bytes)
        tpi_units_release_aged(&pool->core.units, false);
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* ---------------------------------------------------------------- streams */

tp_status tp_pool_forget_stream(tp_pool *pool, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = TP_OK;
    uint32_t slot = tpi_order_find_slot(&pool->core.order, stream);
    if (slot && tpi_order_stream(&pool->core.order, slot)->capturing) {
        st = TP_ERR_CAPTURE;
    } else if (slot) {
        tpi_front_flush(&pool->front); /* parked blocks of this stream could only be reused on it */
        st = tpi_order_forget(&pool->core.order, slot);
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

/* ---------------------------------------------------------------- capture */

tp_status tp_pool_capture_begin(tp_pool *pool, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    uint32_t slot;
    tp_status st = tpi_order_slot(&pool->core.order, stream, &slot);
    if (st == TP_OK) {
        tpi_stream *s = tpi_order_stream(&pool->core.order, slot);
        if (s->capturing) {
            st = TP_ERR_CAPTURE;
        } else {
            s->capturing = true;
            pool->core.order.captures++;
            s->captured_count = 0;
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

static int range_order(const void *a, const void *b) {
    const tp_range *x = a, *y = b;
    return x->address < y->address ? -1 : x->address > y->address;
}

/* Sorts ranges and merges the ones that overlap or touch; returns the count. */
static size_t merge_ranges(tp_range *ranges, size_t count) {
    if (!count) return 0;
    qsort(ranges, count, sizeof *ranges, range_order);
    size_t out = 0;
    for (size_t i = 1; i < count; i++) {
        tp_range *last = &ranges[out];
        if (ranges[i].address <= last->address + last->bytes) {
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
        else if (tpi_block_at(core, id)->flags & TPI_BLOCK_PARKED)
            return TP_ERR_CORRUPT; /* the caller flushed the front cache */
        else if (tpi_block_at(core, id)->pins == UINT32_MAX)
            return TP_ERR_BUSY;
    }
    if (!tpi_ra_reserve_nodes(&core->ra, 2 * free_parts) || !blocks_fit_nodes_locked(core) ||
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
            tpi_ra_node_at(&core->ra, kept)->owner = tpi_order_pending_tag(&core->order, slot);
            *tpi_block_at(core, kept) = (tpi_block){.pins = 1, .flags = TPI_BLOCK_FREED_PINNED};
            tpi_map_put(&core->blocks, lo, kept);
            core->stats.zombie_bytes += hi - lo;
            tpi_stat_add(&core->stats.pub.pinned_bytes, hi - lo);
            next = tpi_ra_node_at(&core->ra, kept)->addr_next;
        } else if (tpi_block_at(core, id)->pins++ == 0) {
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
    pthread_mutex_lock(&pool->lock);
    uint32_t slot = tpi_order_find_slot(&pool->core.order, stream);
    tpi_stream *s = slot ? tpi_order_stream(&pool->core.order, slot) : NULL;
    tp_status st = s && s->capturing ? TP_OK : TP_ERR_CAPTURE;
    if (st == TP_OK) {
        /* Parked blocks of the stream may be in the footprint: they go
         * back first, so that the stream cannot reuse them after the
         * capture. */
        tpi_front_flush(&pool->front);
        size_t count = merge_ranges(s->captured, s->captured_count);
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
        }
    }
    pthread_mutex_unlock(&pool->lock);
    return st;
}

void tp_pool_free_ranges(tp_pool *pool, tp_range *ranges) {
    if (!pool || !ranges) return;
    uint64_t *block = (uint64_t *)ranges - 1;
    tpi_host_free(pool->core.host, block, sizeof(uint64_t) + block[0] * sizeof(tp_range));
}

/* ------------------------------------------------------------- statistics */

tp_status tp_pool_get_stats(tp_pool *pool, tp_pool_stats *out_stats) {
    if (!pool || !out_stats) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    *out_stats = pool->core.stats.pub;
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    pool->backing->ops->free_figures(pool->backing, &free_bytes, &largest, &ranges);
    pthread_mutex_unlock(&pool->lock);
    out_stats->free_ranges = ranges;
    out_stats->largest_free_bytes = largest;
    out_stats->fragmentation = free_bytes ? 1.0 - (double)largest / (double)free_bytes : 0.0;
    return TP_OK;
}

tp_status tp_pool_reset_peaks(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tpi_stats *stats = &pool->core.stats;
    if (stats->pub.allocated_bytes.peak > stats->high_water_allocated)
        stats->high_water_allocated = stats->pub.allocated_bytes.peak;
#define RESET_PEAK_(name, kind, description) stats->pub.name.peak = stats->pub.name.current;
    TP_POOL_STAT_BYTES_LIST(RESET_PEAK_)
#undef RESET_PEAK_
    pthread_mutex_unlock(&pool->lock);
    return TP_OK;
}

tp_status tp_pool_last_oom_report(tp_pool *pool, tp_oom_report *out_report) {
    if (!pool || !out_report) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    tp_status st = pool->ladder.has_report ? TP_OK : TP_ERR_NOT_FOUND;
    if (st == TP_OK) *out_report = pool->ladder.report;
    pthread_mutex_unlock(&pool->lock);
    return st;
}

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

static bool check_locked(tp_pool *pool, char *msg, size_t msg_capacity) {
    tpi_core *core = &pool->core;
    return tpi_ra_check(&core->ra, msg, msg_capacity) && blocks_agree_locked(pool, msg, msg_capacity) &&
           tpi_front_check(&pool->front, msg, msg_capacity) && tpi_units_check(&core->units, msg, msg_capacity) &&
           pool->backing->ops->check(pool->backing, msg, msg_capacity);
}

tp_status tp_pool_check(tp_pool *pool, char *msg, size_t msg_capacity) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&pool->lock);
    bool ok = check_locked(pool, msg, msg_capacity);
    pthread_mutex_unlock(&pool->lock);
    return ok ? TP_OK : TP_ERR_CORRUPT;
}
