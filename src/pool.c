/* SPDX-License-Identifier: MIT */
/*
 * pool.c -- the public pool API: create/destroy, alloc/free, trim and tick,
 * reclaim callbacks, forgetting streams and statistics (pins and capture
 * are in pool_pins.c, the checker and the memory map in pool_inspect.c).
 * It orchestrates the layers below (pool_core.h draws them) and holds the
 * locks.
 *
 * The path of one allocation
 *   The hit path first, without the pool's mutex (front_cache.h): the
 *   stream's front state found in a lock-free table and its lock taken; a
 *   block parked in the stream's bins for the size (or the last-freed
 *   block, same size and stream, reusable in place) is recorded in the
 *   stream's live map, counted in the stream's own statistics, shown to the hazard checker, and returned. Anything else --
 *   no parked block, an observer set, a capturing stream,
 *   a stream not yet seen -- takes the world lock: stream -> slot (stream
 *   order); the front cache's parked block if any; else the ladder
 *   (oom_ladder.c) asks the backing for room -- good fit among free ranges
 *   the stream may use, and growth (pages mapped, or a new segment) when
 *   none fits -- and climbs its steps when the device or the limit says
 *   no. The block goes into the stream's live map; statistics, the hazard
 *   checker, capture and the observer see it.
 *
 * The path of one free
 *   The hit path: the block in the free stream's live map (allocated on
 *   this stream), unpinned; the stream tags it (stream order: safe for
 *   others once the stream's next event completes) and it parks in the
 *   stream's bins (or the empty last-freed slot). Otherwise, with the world
 *   lock: the block in any stream's live map (a free on another stream than
 *   the allocation's, or a refusal: double free, foreign pointer, inside a
 *   block); tagged; a pinned block is kept as freed-pinned; a capturing
 *   stream's goes back at once; otherwise the front cache parks it, or the
 *   backing takes it back (range merged with free neighbours, units left
 *   without live blocks become idle). Every TPI_FRONT_UPKEEP_FREES frees on
 *   a stream the pool looks at the clock: aged idle units go back.
 *
 * Invariants (tp_pool_check, pool_inspect.c): each layer's own (range
 * allocator, units, front cache, backing), and: every used node is exactly
 * one of live (in one stream's live map), parked (front cache) or
 * freed-pinned (in the block map core->blocks); allocated, requested,
 * pinned and freed-pinned bytes equal sums over the blocks;
 * cached = reserved - allocated - freed-pinned; reserved <= limit.
 *
 * Locking. Lock order: the pool's mutex, then the stream locks
 * (front_cache.h), then the device's lock. The world lock is the mutex and
 * the front cache's world gate (tpi_pool_lock): raised, it keeps hits out
 * and waits for the stream locks held to be let go. Everything but a hit
 * takes it, and with it folds the streams' hit statistics into the pool's,
 * so it sees one consistent pool. A hit takes one stream lock only and
 * never waits for another lock but the device's. A missed hit keeps its
 * stream lock and only tries the mutex (lock_after_miss): holding it, the
 * other stream locks can be waited for (their holders are hits, which wait
 * for nothing, or wait for the mutex themselves); failing, it lets the
 * stream lock go and takes the world lock in order. Helpers that need the world lock held
 * end in _locked. Reclaim callbacks run with the world lock released.
 */
#include "pool_object.h"

#include <stdlib.h>
#include <string.h>

#define POOL_FRONT_MAX_BLOCK (64 * TPI_MiB)
#define POOL_FRONT_MAX_BLOCK_VMM (64 * TPI_KiB)

/* ---------------------------------------------------------------- blocks */

/* Room in the per-node block table for every node the range allocator has. */
bool tpi_pool_blocks_fit_nodes_locked(tpi_core *core) {
    if (core->info_capacity >= core->ra.node_capacity) return true;
    size_t old = core->info_capacity;
    if (!tpi_host_grow(core->host, (void **)&core->info, sizeof *core->info, &core->info_capacity, core->ra.node_capacity))
        return false;
    memset(core->info + old, 0, (core->info_capacity - old) * sizeof *core->info);
    return true;
}

/* A block the caller gave back (or never got), in no live map and not
 * parked, returns to the backing (its owner word holds its tag). */
void tpi_pool_release_block_locked(tp_pool *pool, uint32_t node) {
    if (tpi_block_at(&pool->core, node)->flags & TPI_BLOCK_FREED_PINNED)
        tpi_map_remove(&pool->core.blocks, tpi_ra_node_at(&pool->core.ra, node)->offset, NULL);
    *tpi_block_at(&pool->core, node) = (tpi_block){0};
    pool->backing->ops->release_block(pool->backing, node, 0);
}

/* Sets pool->hit_extras from what it sums up (the world lock held: hits
 * read it; see the hit path below). A hazard checker that says when it has
 * work to check against (front.hazard_work) is not an extra: a hit
 * allocation looks at that count instead, and a free never checks. */
static void hit_extras_update_locked(tp_pool *pool) {
    pool->hit_extras = pool->core.stats.observer.fn || (pool->front.hazard_checker && !pool->front.hazard_work) ||
                       (pool->core.config.flags & TP_POOL_FLAG_CHECK_INVARIANTS);
}

void tpi_pool_lock(tp_pool *pool) {
    pthread_mutex_lock(&pool->lock);
    tpi_front_world_enter(&pool->front, NULL);
}

/* The world lock after a missed hit, whose stream lock (fs's) is held:
 * the mutex is tried, never waited for, with it held (a stream lock
 * before the mutex would break the lock order, so on failure fs is let go
 * and the mutex taken in order); the gate follows, with the other stream
 * locks waited for, and fs stays held instead of being given back and
 * taken again. fs NULL (no hit
 * was tried): the world lock as usual. */
static void lock_after_miss(tp_pool *pool, tpi_front_stream *fs) {
    if (!fs) {
        tpi_pool_lock(pool);
        return;
    }
    if (pthread_mutex_trylock(&pool->lock) == 0) {
        tpi_front_world_enter(&pool->front, fs);
        return;
    }
    tpi_front_stream_unlock(fs);
    tpi_pool_lock(pool);
}

/* When upkeep_locked next has something to do: at once while idle memory is
 * above the threshold, else when the next flush is due; never without idle
 * release. */
static uint64_t upkeep_due_locked(const tp_pool *pool) {
    const tpi_core *core = &pool->core;
    if (core->config.idle_release_ns == TP_NS_NEVER) return UINT64_MAX;
    if (core->units.idle_bytes > core->config.release_threshold_bytes) return 0;
    return pool->last_upkeep_ns + core->config.idle_release_ns / 2;
}

/* upkeep_due_locked's answer where the hit path reads it, without a lock
 * (a hit free compares the clock with it to skip its upkeep). */
static inline void upkeep_due_publish_locked(tp_pool *pool) {
    atomic_store_explicit(&pool->upkeep_due_ns, upkeep_due_locked(pool), memory_order_relaxed);
}

void tpi_pool_unlock(tp_pool *pool) {
    upkeep_due_publish_locked(pool);
    tpi_front_world_leave(&pool->front);
    pthread_mutex_unlock(&pool->lock);
}

uint32_t *tpi_pool_pins_locked(tp_pool *pool, uint32_t node) {
    tpi_block *block = tpi_block_at(&pool->core, node);
    if (block->flags & TPI_BLOCK_FREED_PINNED) return &block->pins;
    tpi_live_entry *e = tpi_front_live_find(&pool->front, tpi_ra_node_at(&pool->core.ra, node)->offset, NULL);
    return e && e->node == node ? &e->pins : NULL;
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
    if (!out->max_chunk_bytes) out->max_chunk_bytes = 32 * TPI_MiB;
    out->max_chunk_bytes = TPI_MIN(tpi_align_up(TPI_MAX(out->max_chunk_bytes, out->page_bytes), out->page_bytes),
                                   out->max_map_bytes);
    if (out->kind == TP_POOL_VMM) {
        /* The reservation: four times what the pool can hold, which is
         * never more than the device (an unlimited pool included). Blocks
         * never move, so the address space fragments where physical memory
         * does not (unmapped pages cost nothing): a buffer reallocated
         * larger every step moves through about three times its size, and
         * long-lived small blocks made meanwhile stay scattered over that
         * range. With twice, such a pool ran out of address space -- out of
         * memory with its live bytes at 40-75% of the device -- while four
         * times held (tests/test_pool_adversarial.c,
         * test_vmm_address_space_outlasts_a_moving_buffer). Address space
         * costs no device memory; the host keeps a small entry per page. */
        uint64_t holdable = TPI_MIN(out->limit_bytes, info->capacity_bytes);
        if (!out->va_reserve_bytes) out->va_reserve_bytes = holdable > UINT64_MAX / 8 ? holdable : 4 * holdable;
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
     * allocation. In the segment pool the slot's block counts against its
     * stream's limit with the bins (every parked block keeps its segment
     * from going back; without it the scenarios held more: mixed-lifetimes
     * 2.42x its live peak instead of 2.19x). In the VMM pool it does not:
     * the bins hold blocks of 64 KiB at most, and a slot's block of tens
     * of MiB would turn the stream's small frees into releases until it
     * leaves (216 k pairs of random sizes from 256 B to 64 MiB: 38.7 k
     * allocations and 6.2 k frees on the locked path, instead of 28.6 k
     * and none; docs/results.md, "The last-freed block outside the bins'
     * limit"). */
    bool vmm = config->kind == TP_POOL_VMM;
    uint64_t front_limit = TPI_MIN(config->release_threshold_bytes, vmm ? 32 * TPI_MiB : 256 * TPI_MiB);
    st = tpi_front_init(&pool->front, core, pool->backing, front_limit, !vmm, config->tcache_max_block_bytes);
    if (st != TP_OK) goto no_front;
    st = tpi_ladder_init(&pool->ladder, core, &pool->front, pool->backing, pool, &pool->lock);
    if (st == TP_OK) {
        hit_extras_update_locked(pool); /* (no other thread knows the pool yet) */
        return TP_OK;
    }
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
    tpi_pool_lock(pool);
    /* A stream the pool was told captures cannot be waited for (that would
     * invalidate the capture), and work queued on it before the capture
     * may still use the pool's memory: refused, nothing destroyed, until
     * the capture ends (returning the memory anyway unmapped it under
     * running kernels). */
    if (core->order.captures) {
        tpi_pool_unlock(pool);
        return TP_ERR_CAPTURE;
    }
    tpi_front_flush(&pool->front);
    /* Queued work on any stream the pool has seen may still use its memory. */
    tp_status result = tpi_order_synchronize_all(&core->order);
    if (core->ra.used_count)
        tpi_logf(&device->logger, TP_LOG_WARN,
                 "tp_pool_destroy: %llu blocks still live or pinned (%llu bytes live, %llu pinned) are released",
                 (unsigned long long)core->ra.used_count, (unsigned long long)core->stats.pub.allocated_bytes.current,
                 (unsigned long long)core->stats.pub.pinned_bytes.current);
    tpi_ladder_destroy(&pool->ladder);
    tpi_front_destroy(&pool->front);
    pool->backing->ops->destroy(pool->backing);
    tpi_units_destroy(&core->units);
    tpi_ra_destroy(&core->ra);
    tpi_order_destroy(&core->order);
    tpi_map_destroy(&core->blocks);
    tpi_host_free(core->host, core->info, core->info_capacity * sizeof *core->info);
    pthread_mutex_unlock(&pool->lock); /* the stream locks went with the front cache */
    pthread_mutex_destroy(&pool->lock);
    tpi_host_free(&device->host, pool, sizeof *pool);
    atomic_fetch_sub(&device->users, 1);
    return result;
}

/* --------------------------------------------------------- alloc and free */

static void check_invariants_if_asked_locked(tp_pool *pool) {
    if (!(pool->core.config.flags & TP_POOL_FLAG_CHECK_INVARIANTS)) return;
    char msg[256];
    if (!tpi_pool_check_locked(pool, msg, sizeof msg))
        tpi_logf(&pool->core.device->logger, TP_LOG_ERROR, "pool invariant violated: %s", msg);
}

/* After a hit: the checker, if the pool asks for it after every call (out
 * of line: the hit path pays for the flag's test only). TP_OK. */
TPI_NOINLINE static tp_status check_after_hit_asked(tp_pool *pool) {
    tpi_pool_lock(pool);
    check_invariants_if_asked_locked(pool);
    tpi_pool_unlock(pool);
    return TP_OK;
}
static inline tp_status check_after_hit(tp_pool *pool) {
    if (pool->core.config.flags & TP_POOL_FLAG_CHECK_INVARIANTS) return check_after_hit_asked(pool);
    return TP_OK;
}

/* Node, just placed for slot, has room for its record in the block table;
 * false when the table cannot grow: the node is then given back, tagged
 * with slot's pending work (there is no record to clear). */
static bool node_has_record_locked(tp_pool *pool, uint32_t node, uint32_t slot) {
    tpi_core *core = &pool->core;
    if (tpi_pool_blocks_fit_nodes_locked(core)) return true;
    tpi_ra_node_at(&core->ra, node)->owner = tpi_order_pending_tag(&core->order, slot);
    pool->backing->ops->release_block(pool->backing, node, 0);
    return false;
}

/* A block found by the ladder. */
static tp_status ladder_alloc_locked(tp_pool *pool, uint64_t size, size_t bytes, uint32_t slot, bool moving,
                                     uint32_t *out_node) {
    tpi_core *core = &pool->core;
    if (size > core->config.limit_bytes) {
        tpi_ladder_report_oom_locked(&pool->ladder, bytes, tpi_order_stream(&core->order, slot)->handle,
                                     core->stats.last_device_status);
        return TP_ERR_OUT_OF_MEMORY;
    }
    uint64_t device_allocs = core->stats.pub.device_allocs;
    tp_status st = tpi_ladder_alloc_locked(&pool->ladder, size, bytes, slot, moving, out_node);
    if (st != TP_OK) return st;
    if (core->stats.pub.device_allocs == device_allocs) core->stats.pub.cache_hits++;
    return node_has_record_locked(pool, *out_node, slot) ? TP_OK : TP_ERR_HOST_OUT_OF_MEMORY;
}

static tp_status alloc_locked(tp_pool *pool, uint64_t size, size_t bytes, tp_stream stream, void **out_ptr) {
    tpi_core *core = &pool->core;
    uint32_t slot, node;
    tp_status st = tpi_pool_stream_slot_locked(pool, stream, &slot);
    if (st != TP_OK) return st;
    bool moving = tpi_front_continues_chain(&pool->front, size, slot); /* (before the pop releases the slot) */
    node = tpi_front_pop(&pool->front, size, slot);
    if (node != TPI_RA_NONE) {
        core->stats.pub.cache_hits++;
    } else {
        st = ladder_alloc_locked(pool, size, bytes, slot, moving, &node);
        if (st != TP_OK) return st;
    }
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    if (!tpi_front_live_add(&pool->front, slot, n->offset, bytes, n->size, node)) {
        n->owner = tpi_order_pending_tag(&core->order, slot);
        tpi_pool_release_block_locked(pool, node);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    tp_pool_stats *s = &core->stats.pub;
    s->allocs++;
    tpi_stat_add(&s->requested_bytes, bytes);
    tpi_stat_add(&s->allocated_bytes, n->size);
    tpi_stats_update_cached(&core->stats);
    if (core->device->hazard_checker) s->hazards += core->ops->check_handout(core->device, n->offset, n->size, stream);
    tpi_stream *stream_state = tpi_order_stream(&core->order, slot);
    if (stream_state->capturing) {
        st = tpi_pool_capture_note_locked(pool, stream_state, node);
        if (st != TP_OK) { /* cannot track it: undo the allocation */
            s->allocs--;
            tpi_stat_sub(&s->requested_bytes, bytes);
            tpi_stat_sub(&s->allocated_bytes, n->size);
            tpi_front_live_remove(&pool->front, slot, n->offset);
            n->owner = tpi_order_pending_tag(&core->order, slot);
            tpi_pool_release_block_locked(pool, node);
            tpi_stats_update_cached(&core->stats);
            return st;
        }
    }
    *out_ptr = (void *)(uintptr_t)n->offset;
    tpi_observe(&core->stats, TP_POOL_EVENT_ALLOC, n->offset, bytes, stream);
    return TP_OK;
}

/* The hit path, in tp_pool_alloc and tp_pool_free, makes no call that
 * returns to it, so that they save no registers and keep no stack frame,
 * and tests one flag for the hit's rare extras (pool->hit_extras; an
 * allocation also whether the hazard checker has work pending): where a
 * hit needs a call (a stream lock someone holds, the last-freed slot, the
 * upkeep's clock) or has extras (an observer, the hazard checker, the
 * checks after every call) it goes on in a function of its own (*_waiting,
 * *_slot, *_entered below), which makes the calls and looks at each extra;
 * a miss goes on in the locked path -- or, in a pool that has only ever
 * seen one stream, in the hit's own placement or give-back (*_placed,
 * *_unparked: tpi_front_hit_alone), the locked path's steps without its
 * lock. The steps are front_cache.h's, in the same order whichever
 * function makes them. */

/* The locked path of an allocation the hit path did not serve (fs: the
 * stream lock it kept, or NULL). *out_ptr is NULL from here unless it
 * succeeds (a hit sets it once, so tp_pool_alloc leaves it to the misses). */
TPI_NOINLINE static tp_status alloc_after_miss(tp_pool *pool, tpi_front_stream *fs, uint64_t size, size_t bytes,
                                               tp_stream stream, void **out_ptr) {
    *out_ptr = NULL;
    lock_after_miss(pool, fs);
    tp_status st = alloc_locked(pool, size, bytes, stream, out_ptr);
    check_invariants_if_asked_locked(pool);
    tpi_pool_unlock(pool);
    return st;
}

/* The hit's block recorded on fs, shown to the hazard checker if any,
 * handed out; the stream lock given back. calls false: no extras. */
static inline tp_status alloc_recorded(tp_pool *pool, tpi_front_stream *fs, const tpi_live_entry *block,
                                       void **out_ptr, bool calls) {
    tpi_front_hit_record(fs, block);
    if (calls && pool->front.hazard_checker)
        tpi_front_hit_check(&pool->front, fs, block->offset, block->size, fs->handle);
    tpi_front_stream_unlock(fs);
    *out_ptr = (void *)(uintptr_t)block->offset;
    return calls ? check_after_hit(pool) : TP_OK;
}

/* A block no parked one served (the bins', or the last-freed slot's),
 * placed by the hit itself (tpi_front_hit_alone: the world's work, done
 * the world's way) when it fits in mapped memory; else the locked path,
 * which finds the same state (the slot released) and goes on from there. */
TPI_NOINLINE static tp_status alloc_placed(tp_pool *pool, tpi_front_stream *fs, uint64_t size, size_t bytes,
                                           void **out_ptr) {
    tpi_live_entry block;
    /* (The locked path works out when upkeep is due as it leaves.) */
    if (!tpi_front_hit_place(&pool->front, fs, size, bytes, &block) ||
        !node_has_record_locked(pool, block.node, fs->slot))
        return alloc_after_miss(pool, fs, size, bytes, fs->handle, out_ptr);
    upkeep_due_publish_locked(pool);
    pool->core.stats.last_device_status = TP_OK; /* (as the ladder's first try sets it) */
    return alloc_recorded(pool, fs, &block, out_ptr, true);
}

/* The hit's last step for an allocation no parked block served: placed by
 * the hit if it may (alloc_placed), else the locked path. (Live map room:
 * the pick's test, made again.) */
static inline tp_status alloc_unparked(tp_pool *pool, tpi_front_stream *fs, uint64_t size, size_t bytes,
                                       void **out_ptr) {
    if (tpi_front_hit_alone(&pool->front) && tpi_live_has_room(&fs->live, 1))
        return alloc_placed(pool, fs, size, bytes, out_ptr);
    return alloc_after_miss(pool, fs, size, bytes, fs->handle, out_ptr);
}

/* The last-freed slot picked on fs (its word): taken if in place, or, a
 * block of another size, resized where it is if it can be. A resize may
 * leave pages idle: when upkeep is due is worked out again, as the world
 * lock's holder does on leaving, while the word still names fs (what that
 * reads, only the world and the slot's stream write: see
 * tpi_front_hit_resize_slot), and then the word is emptied. */
TPI_NOINLINE static tp_status alloc_slot(tp_pool *pool, tpi_front_stream *fs, uint64_t size, size_t bytes,
                                         void **out_ptr, uint64_t word) {
    tpi_live_entry block;
    if (pool->front.slot_size == size) {
        if (!tpi_front_hit_take_slot(&pool->front, size, bytes, word, &block))
            return alloc_unparked(pool, fs, size, bytes, out_ptr);
    } else {
        if (!tpi_front_hit_resize_slot(&pool->front, fs, size, bytes, word, &block))
            return alloc_unparked(pool, fs, size, bytes, out_ptr);
        upkeep_due_publish_locked(pool);
        tpi_front_hit_slot_emptied(&pool->front);
    }
    return alloc_recorded(pool, fs, &block, out_ptr, true);
}

/* The allocation on fs, its lock held (so stream is fs->handle): the
 * hit, else the locked path; calls false: no call that returns here, and
 * no extras (the caller saw pool->hit_extras false). */
static TPI_ALWAYS_INLINE tp_status alloc_from(tp_pool *pool, tpi_front_stream *fs, uint64_t size, size_t bytes,
                                              void **out_ptr, bool calls) {
    tpi_live_entry block;
    uint64_t word;
    /* (The observer is read under the stream lock and written under the
     * world lock, which no hit runs beside: no race.) */
    if (calls && pool->core.stats.observer.fn) return alloc_after_miss(pool, fs, size, bytes, fs->handle, out_ptr);
    if (!tpi_front_hit_pick(&pool->front, fs, size, bytes, &block, &word))
        return alloc_unparked(pool, fs, size, bytes, out_ptr);
    if (word != TPI_FRONT_SLOT_EMPTY) return alloc_slot(pool, fs, size, bytes, out_ptr, word);
    return alloc_recorded(pool, fs, &block, out_ptr, calls);
}

TPI_NOINLINE static tp_status alloc_entered(tp_pool *pool, tpi_front_stream *fs, uint64_t size, size_t bytes,
                                            void **out_ptr) {
    return alloc_from(pool, fs, size, bytes, out_ptr, true);
}

/* The allocation, waiting for the stream lock if someone holds it. */
TPI_NOINLINE static tp_status alloc_waiting(tp_pool *pool, uint64_t size, size_t bytes, tp_stream stream,
                                            void **out_ptr) {
    tpi_front_stream *fs = tpi_front_hit_enter(&pool->front, stream, true);
    if (!fs) return alloc_after_miss(pool, NULL, size, bytes, stream, out_ptr);
    return alloc_entered(pool, fs, size, bytes, out_ptr);
}

tp_status tp_pool_alloc(tp_pool *pool, size_t bytes, tp_stream stream, void **out_ptr) {
    if (!out_ptr) return TP_ERR_INVALID_ARGUMENT;
    if (!pool || bytes == 0) {
        *out_ptr = NULL;
        return TP_ERR_INVALID_ARGUMENT;
    }
    uint64_t align = pool->core.config.alignment_bytes;
    /* Too large to round: larger than any limit, so out of memory below. */
    uint64_t size = (uint64_t)bytes > UINT64_MAX - align ? UINT64_MAX : tpi_align_up(bytes, align);

    tpi_front_stream *fs = tpi_front_hit_enter(&pool->front, stream, false);
    if (!fs) return alloc_waiting(pool, size, bytes, stream, out_ptr);
    /* (hit_extras is read under the stream lock and written under the
     * world lock, which no hit runs beside: no race.) */
    if (pool->hit_extras || tpi_front_hazard_work_pending(&pool->front))
        return alloc_entered(pool, fs, size, bytes, out_ptr);
    return alloc_from(pool, fs, size, bytes, out_ptr, false);
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

/* Every TPI_FRONT_UPKEEP_FREES frees on a stream: idle memory above the
 * threshold that has aged goes back; at most every idle_release_ns / 2 the
 * front cache is flushed first, so parked blocks cannot keep a unit busy
 * forever. */
static void upkeep_locked(tp_pool *pool, tpi_front_stream *fs) {
    tpi_core *core = &pool->core;
    fs->frees_to_upkeep = TPI_FRONT_UPKEEP_FREES;
    /* When it is due is upkeep_due_locked's rule (the hit free skips the
     * world lock by the same rule). */
    uint64_t due = upkeep_due_locked(pool), now = 0;
    if (due == UINT64_MAX || (now = tpi_units_now(&core->units)) < due) return;
    if (now - pool->last_upkeep_ns >= core->config.idle_release_ns / 2) {
        pool->last_upkeep_ns = now;
        tpi_front_flush(&pool->front);
        tpi_units_release_aged(&core->units, true);
    } else {
        tpi_units_release_aged(&core->units, false); /* due now: idle memory above the threshold */
    }
}

/* hint_slot: the slot the free's stream had when its hit was tried (0:
 * none), where the block most likely is (a slot given to another stream
 * since then only costs a look). */
static tp_status free_locked(tp_pool *pool, uint64_t address, tp_stream stream, uint32_t hint_slot) {
    tpi_core *core = &pool->core;
    uint32_t alloc_slot = 0;
    tpi_live_entry *e = tpi_front_live_find_from(&pool->front, address, hint_slot, &alloc_slot);
    if (!e) {
        tp_status st = classify_bad_pointer_locked(pool, address);
        tpi_logf(&core->device->logger, TP_LOG_ERROR, "tp_pool_free(0x%llx): %s", (unsigned long long)address,
                 tp_status_describe(st));
        return st;
    }
    tpi_live_entry block = *e;
    uint32_t slot;
    tp_status st = tpi_pool_stream_slot_locked(pool, stream, &slot);
    if (st != TP_OK) return st;
    tpi_front_stream *fs = pool->front.streams[slot];
    if (block.pins && !tpi_map_put(&core->blocks, address, block.node)) return TP_ERR_HOST_OUT_OF_MEMORY;
    tpi_front_live_remove(&pool->front, alloc_slot, address);
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, block.node);
    tpi_tag tag = tpi_order_note_free(&core->order, slot);
    /* A block of a capturing stream freed on another stream: the graph
     * being captured may use it at every replay, so no other stream may
     * have it before the capture ends (its footprint then takes it back).
     * It goes back unparked, tagged as freed on the capturing stream too:
     * work no stream can wait for before the capture ends. */
    bool captures_block = alloc_slot != slot && tpi_order_stream(&core->order, alloc_slot)->capturing;
    if (captures_block) tag = tpi_order_merge(&core->order, tag, tpi_order_note_free(&core->order, alloc_slot));
    tpi_observe(&core->stats, TP_POOL_EVENT_FREE, address, block.requested, stream);
    tp_pool_stats *s = &core->stats.pub;
    s->frees++;
    tpi_stat_sub(&s->requested_bytes, block.requested);
    tpi_stat_sub(&s->allocated_bytes, block.size);
    if (s->allocated_bytes.current < core->stats.allocated_low_water)
        core->stats.allocated_low_water = s->allocated_bytes.current;
    s->cached_bytes.total += block.size;
    if (block.pins) {
        n->owner = tag;
        *tpi_block_at(core, block.node) = (tpi_block){.pins = block.pins, .flags = TPI_BLOCK_FREED_PINNED};
        core->stats.zombie_bytes += block.size;
    } else if (tpi_order_stream(&core->order, slot)->capturing || captures_block ||
               !tpi_front_push(&pool->front, slot, block.node, address, block.size, tag)) {
        /* (A capture's frees are not parked: merged with their neighbours,
         * they serve its later requests of any size, which keeps the
         * graph's footprint near its peak.) */
        n->owner = tag;
        tpi_pool_release_block_locked(pool, block.node);
        fs->released_bytes = block.size; /* (tpi_front_continues_chain) */
    }
    tpi_stats_update_cached(&core->stats);
    if (--fs->frees_to_upkeep == 0) upkeep_locked(pool, fs);
    return TP_OK;
}

/* The locked path of a free the hit path did not serve (fs: the stream
 * lock it kept, or NULL). */
TPI_NOINLINE static tp_status free_after_miss(tp_pool *pool, tpi_front_stream *fs, uint64_t address,
                                              tp_stream stream) {
    uint32_t hint_slot = fs ? fs->slot : 0; /* (a front stream's slot never changes) */
    lock_after_miss(pool, fs);
    tp_status st = free_locked(pool, address, stream, hint_slot);
    check_invariants_if_asked_locked(pool);
    tpi_pool_unlock(pool);
    return st;
}

/* A hit free's end: the block parked, counted, the stream lock given
 * back. calls false: no extras. */
static inline tp_status free_hit_done(tp_pool *pool, tpi_front_stream *fs, tpi_live_entry *e, bool calls) {
    tpi_front_hit_freed(fs, e);
    tpi_front_stream_unlock(fs);
    return calls ? check_after_hit(pool) : TP_OK;
}

/* e, found on fs, parked in the last-freed slot if it is empty. */
TPI_NOINLINE static tp_status free_slot(tp_pool *pool, tpi_front_stream *fs, tpi_live_entry *e) {
    if (!tpi_front_hit_park_slot(&pool->front, fs, e)) {
        /* Occupied: its block goes back as the locked path would give it
         * back, by the hit where it may (alone, the word fs's own). */
        uint64_t word = atomic_load_explicit(&pool->front.slot_word, memory_order_relaxed);
        if (!tpi_front_hit_alone(&pool->front) || !tpi_front_slot_word_names(word, fs->slot))
            return free_after_miss(pool, fs, e->offset, fs->handle);
        tpi_front_hit_park_slot_over(&pool->front, fs, e);
        upkeep_due_publish_locked(pool);
    }
    return free_hit_done(pool, fs, e, true);
}

/* e, found on fs, which the bins cannot take: given back to the backing by
 * the hit where it may (tpi_front_hit_alone), as the locked path would. */
TPI_NOINLINE static tp_status free_unparked(tp_pool *pool, tpi_front_stream *fs, tpi_live_entry *e) {
    if (!tpi_front_hit_alone(&pool->front)) return free_after_miss(pool, fs, e->offset, fs->handle);
    tpi_front_hit_release(&pool->front, fs, e);
    upkeep_due_publish_locked(pool);
    return free_hit_done(pool, fs, e, true);
}

TPI_NOINLINE static tp_status free_entered(tp_pool *pool, tpi_front_stream *fs, uint64_t address);

/* The free on fs, its lock held (so stream is fs->handle): the hit, else
 * the locked path; calls false: no call that returns here, and no extras
 * (the caller saw pool->hit_extras false). */
static TPI_ALWAYS_INLINE tp_status free_from(tp_pool *pool, tpi_front_stream *fs, uint64_t address, bool calls) {
    /* The stream's upkeep is due every TPI_FRONT_UPKEEP_FREES frees; when it
     * would do nothing, it is skipped here instead of taking the world lock
     * (which every other stream's hits would wait for). When it is due, the
     * free is not a hit. */
    bool upkeep_due = false;
    if (fs->frees_to_upkeep <= 1) {
        if (!calls) return free_entered(pool, fs, address);
        if (tpi_units_now(&pool->core.units) < atomic_load_explicit(&pool->upkeep_due_ns, memory_order_relaxed))
            fs->frees_to_upkeep = TPI_FRONT_UPKEEP_FREES;
        else
            upkeep_due = true;
    }
    /* (The observer is read under the stream lock and written under the
     * world lock, which no hit runs beside: no race.) */
    tpi_live_entry *e =
        upkeep_due || (calls && pool->core.stats.observer.fn) ? NULL : tpi_front_hit_free_find(fs, address);
    if (!e) return free_after_miss(pool, fs, address, fs->handle);
    if (e->size > pool->front.max_block_bytes) return free_slot(pool, fs, e);
    if (!tpi_front_hit_park_bins(&pool->front, fs, e)) return free_unparked(pool, fs, e);
    return free_hit_done(pool, fs, e, calls);
}

TPI_NOINLINE static tp_status free_entered(tp_pool *pool, tpi_front_stream *fs, uint64_t address) {
    return free_from(pool, fs, address, true);
}

/* The free, waiting for the stream lock if someone holds it. */
TPI_NOINLINE static tp_status free_waiting(tp_pool *pool, uint64_t address, tp_stream stream) {
    tpi_front_stream *fs = tpi_front_hit_enter(&pool->front, stream, true);
    if (!fs) return free_after_miss(pool, NULL, address, stream);
    return free_entered(pool, fs, address);
}

tp_status tp_pool_free(tp_pool *pool, void *ptr, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    if (!ptr) return TP_OK;
    uint64_t address = (uint64_t)(uintptr_t)ptr;
    tpi_front_stream *fs = tpi_front_hit_enter(&pool->front, stream, false);
    if (!fs) return free_waiting(pool, address, stream);
    if (pool->hit_extras) return free_entered(pool, fs, address);
    return free_from(pool, fs, address, false);
}

tp_status tp_pool_block_size(tp_pool *pool, const void *ptr, size_t *out_bytes) {
    if (!pool || !out_bytes) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tpi_live_entry *e = tpi_front_live_find(&pool->front, (uint64_t)(uintptr_t)ptr, NULL);
    if (e) *out_bytes = (size_t)e->requested;
    tpi_pool_unlock(pool);
    return e ? TP_OK : TP_ERR_NOT_OWNED;
}

/* ---------------------------------------------------------- trim and tick */

tp_status tp_pool_trim(tp_pool *pool, uint64_t target_reserved_bytes, uint64_t *out_released_bytes) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
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
    tpi_pool_unlock(pool);
    return TP_OK;
}

tp_status tp_pool_tick(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
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
    tpi_pool_unlock(pool);
    return TP_OK;
}

/* ---------------------------------------------------------------- reclaim */

tp_status tp_pool_add_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user) {
    if (!pool || !fn) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tp_status st = tpi_ladder_add_reclaimer_locked(&pool->ladder, fn, user);
    tpi_pool_unlock(pool);
    return st;
}

tp_status tp_pool_remove_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user) {
    if (!pool || !fn) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tp_status st = tpi_ladder_remove_reclaimer_locked(&pool->ladder, fn, user);
    tpi_pool_unlock(pool);
    return st;
}

/* ---------------------------------------------------------------- streams */

tp_status tp_pool_forget_stream(tp_pool *pool, tp_stream stream) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tp_status st = TP_OK;
    uint32_t slot = tpi_order_find_slot(&pool->core.order, stream);
    if (slot && tpi_order_stream(&pool->core.order, slot)->capturing) {
        st = TP_ERR_CAPTURE;
    } else if (slot) {
        /* Parked blocks of this stream could only be reused on it; other
         * streams keep theirs. Its live blocks stay in its live map, freed
         * later on any stream through the locked path (or on the stream
         * that gets the slot next). */
        tpi_front_flush_stream(&pool->front, slot);
        st = tpi_order_forget(&pool->core.order, slot);
        if (st == TP_OK) tpi_front_set_hits(&pool->front, slot, false);
    }
    tpi_pool_unlock(pool);
    return st;
}

/* ------------------------------------------------------------- statistics */

tp_status tp_pool_get_stats(tp_pool *pool, tp_pool_stats *out_stats) {
    if (!pool || !out_stats) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    *out_stats = pool->core.stats.pub;
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    pool->backing->ops->free_figures(pool->backing, &free_bytes, &largest, &ranges);
    tpi_pool_unlock(pool);
    out_stats->free_ranges = ranges;
    out_stats->largest_free_bytes = largest;
    out_stats->fragmentation = free_bytes ? 1.0 - (double)largest / (double)free_bytes : 0.0;
    return TP_OK;
}

tp_status tp_pool_reset_peaks(tp_pool *pool) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tpi_stats *stats = &pool->core.stats;
    if (stats->pub.allocated_bytes.peak > stats->high_water_allocated)
        stats->high_water_allocated = stats->pub.allocated_bytes.peak;
    if (stats->pub.reserved_bytes.peak > stats->high_water_reserved)
        stats->high_water_reserved = stats->pub.reserved_bytes.peak;
#define RESET_PEAK_(name, kind, description) stats->pub.name.peak = stats->pub.name.current;
    TP_POOL_STAT_BYTES_LIST(RESET_PEAK_)
#undef RESET_PEAK_
    tpi_pool_unlock(pool);
    return TP_OK;
}

tp_status tp_pool_get_device(tp_pool *pool, tp_device **out_device) {
    if (!pool || !out_device) return TP_ERR_INVALID_ARGUMENT;
    *out_device = pool->core.device;
    return TP_OK;
}

tp_status tp_pool_set_observer(tp_pool *pool, tp_pool_observer_fn fn, void *user) {
    if (!pool) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    pool->core.stats.observer = (tpi_observer){fn, user, pool->core.device};
    hit_extras_update_locked(pool);
    tpi_pool_unlock(pool);
    return TP_OK;
}

const char *tp_pool_event_name(tp_pool_event_kind kind) {
    static const char *const names[] = {
#define TP_POOL_EVENT_NAME_(name, label) label,
        TP_POOL_EVENT_LIST(TP_POOL_EVENT_NAME_)
#undef TP_POOL_EVENT_NAME_
    };
    return (unsigned)kind < TP_POOL_EVENT_COUNT_ ? names[kind] : NULL;
}

tp_status tp_pool_last_oom_report(tp_pool *pool, tp_oom_report *out_report) {
    if (!pool || !out_report) return TP_ERR_INVALID_ARGUMENT;
    tpi_pool_lock(pool);
    tp_status st = pool->ladder.has_report ? TP_OK : TP_ERR_NOT_FOUND;
    if (st == TP_OK) *out_report = pool->ladder.report;
    tpi_pool_unlock(pool);
    return st;
}

