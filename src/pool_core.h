/* SPDX-License-Identifier: MIT */
/*
 * pool_core.h -- the state a pool's layers share, and the interface of the
 * two backings. Plain data: pool.c owns it and hands each layer a pointer.
 *
 * The layers, each calling only the ones below it:
 *
 *   pool.c           public API: create/destroy, alloc/free, trim/tick,
 *        |           pins, capture, forget, stats
 *   oom_ladder.c     finds memory for a request, stepping down a ladder of
 *        |           ever costlier ways to make room; never aborts
 *   front_cache.c    freed blocks parked for reuse as they are (the hit path)
 *        |
 *   backing_vmm.c / backing_segment.c   where a block goes and how the pool
 *        |           grows: pages mapped in one reservation, or segments
 *   units.c          pieces of device memory that go back on their own, the
 *        |           idle list, release
 *   stream_order.c   who may still use memory and what makes it safe
 *        |
 *   range_alloc.c (TLSF over offsets), common/tpi_map.h (block map),
 *   the device table (device.c, sim_device.c, cuda_device.c)
 *
 * Vocabulary: a block is a range handed to a caller (a used node of the
 * range allocator); a unit is a page or a segment (units.h); a tag says
 * who may still use a range (stream_order.h).
 */
#ifndef TIDEPOOL_POOL_CORE_H
#define TIDEPOOL_POOL_CORE_H

#include "range_alloc.h"
#include "stream_order.h"
#include "tpi_map.h"
#include "units.h"

/* Block flags (tpi_block.flags). */
#define TPI_BLOCK_FREED_PINNED 0x2u /* freed by the caller but kept by pins */

/* What the pool knows of a freed-but-pinned block: indexed by the range
 * allocator's node id, zero for every other node. A live block's record
 * (requested bytes, pins) is its entry in its stream's live map
 * (front_cache.h); a parked block's, its front-cache entry. The block's
 * tag, once freed, is the node's owner word (a parked block's is written
 * there when it leaves the cache). Written under the world lock only. */
typedef struct tpi_block {
    uint32_t pins;
    uint16_t flags;
} tpi_block;

typedef struct tpi_core {
    tp_device *device;
    const tpi_device_ops *ops;
    const tpi_host *host;
    tp_pool_config config; /* with defaults filled in */
    tpi_stats stats;
    tpi_order order;
    tpi_ra ra;
    tpi_units units;
    tpi_map blocks;   /* block start -> node: freed-pinned blocks (live ones are in the front cache's live maps) */
    tpi_block *info;  /* per node id */
    size_t info_capacity;
} tpi_core;

static inline tpi_block *tpi_block_at(tpi_core *core, uint32_t node) { return &core->info[node]; }

/* ------------------------------------------------------------- backings */

typedef struct tpi_backing tpi_backing;

typedef struct tpi_backing_ops {
    const char *name;
    /* Finds or makes room for size bytes usable on slot; on success the
     * block's node is taken (used). moving: the request looks like the next
     * copy of a buffer reallocated a little larger each time
     * (tpi_front_continues_chain), a hint the backing may use or ignore.
     * may_grow false: TP_NOT_READY when only new device memory would do.
     * TP_ERR_OUT_OF_MEMORY sets *out_need_bytes to the device memory it
     * could not get. */
    tp_status (*try_alloc)(tpi_backing *backing, uint64_t size, uint32_t slot, bool moving, bool may_grow,
                           uint32_t *out_node, uint64_t *out_need_bytes);
    /* Takes [offset, offset + size), which lies inside one free range, as a
     * used node (units made busy) in *out_node: the capture keeps the memory
     * its graph reuses. TP_ERR_INVALID_ARGUMENT when it is not all free (or,
     * VMM, not all mapped). */
    tp_status (*claim)(tpi_backing *backing, uint64_t offset, uint64_t size, uint32_t *out_node);
    /* Gives a used node back to the range allocator (its owner word holds
     * its tag); units it leaves idle count as idle since idle_since_ns
     * (0: now). */
    void (*release_block)(tpi_backing *backing, uint32_t node, uint64_t idle_since_ns);
    /* Optional: resizes used node, freed with tag, to size bytes where it
     * is, when release_block (its owner word set to tag) and then try_alloc
     * of size on slot would place the block there anyway, leaving every
     * range, unit and tag as they would (units a smaller block leaves idle
     * count as idle since idle_since_ns). False, and nothing changed, when
     * it cannot tell that placement would. */
    bool (*resize_block)(tpi_backing *backing, uint32_t node, uint64_t size, tpi_tag tag, uint32_t slot,
                         uint64_t idle_since_ns);
    /* try_alloc with may_grow false asks the device nothing while every
     * tag in the pool is clean or slot's own, and places the same whatever
     * moving says: the hit path of a pool with one stream may then place a
     * block itself (front_cache.h, tpi_front_hit_alone). */
    bool places_without_device;
    /* Returns all device memory and frees the backing. */
    void (*destroy)(tpi_backing *backing);
    /* Backing-specific invariants. */
    bool (*check)(tpi_backing *backing, char *msg, size_t msg_capacity);
    /* Free bytes inside reserved memory, the largest such range, how many. */
    void (*free_figures)(tpi_backing *backing, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges);
    /* Optional: the capture on slot has just ended (nothing could be given
     * back to the device during it). */
    void (*capture_ended)(tpi_backing *backing, uint32_t slot);
} tpi_backing_ops;

struct tpi_backing {
    const tpi_backing_ops *ops;
    tpi_core *core;
};

/* Each makes its backing's own state; the core's units are set up by it. */
tp_status tpi_vmm_create(tpi_core *core, tpi_backing **out_backing);
tp_status tpi_segment_create(tpi_core *core, tpi_backing **out_backing);

#endif /* TIDEPOOL_POOL_CORE_H */
