/* SPDX-License-Identifier: MIT */
/*
 * backing_segment.c -- the segment backing, for devices without VMM: plain
 * device allocations (segments) split and coalesced inside, whole idle
 * segments given back.
 *
 * Algorithm: every segment is a region of the shared range allocator, so a
 * request takes the best-fitting free range of any segment. A miss mallocs a
 * new segment: requests up to 1 MiB get a small segment (2 MiB), up to
 * 10 MiB a medium one (20 MiB), larger ones a segment of their own rounded
 * up a geometric ladder (2 MiB steps, then +growth_step_percent each), so a
 * request that grows a little every step -- the flash-attention temporaries
 * of failure mode 1 (docs/failure-modes.md) -- needs a new segment only
 * O(log n) times, and each new segment retires the idle ones it replaces
 * (the release before growth). An idle segment more than four times a request's size is
 * woken up for it only while the segment is warm (it held a block of at
 * least a quarter of its size within idle_release_ns): a working set that
 * rotates through sizes keeps reusing it, while a one-off huge temporary
 * goes cold and ages out instead of being pinned forever by small blocks.
 *
 * Pinned segments. A small block placed in a large busy segment (the slack
 * of a ladder segment beside the block it was made for) keeps the whole
 * segment when that block is freed, and lives as long as it likes: a KV
 * cache reallocated larger every token, with small long-lived blocks made
 * meanwhile, pinned one ladder segment after another (11.8x its live peak;
 * failed allocations at a third of the device live). So at each growth the
 * pool sums the free bytes of its sparse segments: busy, larger than a small
 * one, at most 1/SPARSE_LIVE_DIV live. Once that passes 1/APART_ON_DIV of
 * what it holds, placement keeps requests apart -- a request takes no room
 * in a segment more than APART_SIZE_FACTOR times the one it would get of its
 * own (a request of up to 1 MiB then only goes to small segments) -- until
 * the sum falls below 1/APART_OFF_DIV. New large segments then stay clean,
 * and the pinned ones go back as their blocks die. Out of memory, a request
 * kept apart takes the larger segments' room after all. Workloads whose
 * small blocks die young seldom get there and keep filling large segments'
 * slack; those that do (short-lived blocks leaving large segments sparse
 * for a while) pay in device calls and some memory (docs/results.md).
 *
 * Moving buffers' segments. A buffer reallocated a little larger every
 * step (allocate the larger copy, free the old: the front cache tells,
 * tpi_front_continues_chain) leaves each ladder segment it grew soon after
 * it grew it, and a long-lived block placed in that segment's slack
 * meanwhile keeps the whole segment when it goes (sawtooth: 2.3x its live
 * peak held over 100,000 steps; docs/results.md). So a segment remembers
 * whether it was grown for such a copy and the size bin of that copy, and
 * the backing keeps, per size bin, a running average (1/LIFETIME_WEIGHT_DIV
 * weight) of how many allocations a block stays placed, from its
 * placement to its return here (parked time included: a parked block keeps
 * its segment as a live one does). A request stays out of a moving
 * buffer's segment more than MOVING_APART_FACTOR times the one it would
 * get of its own when its bin stays placed longer than the bin the segment
 * was grown for (both bins with a history; out of memory it may go there
 * after all). Temporaries, whose bins stay placed as briefly as the
 * buffer's copies, still use the slack.
 *
 * Growth past the cap (the high-water mark plus 1/16) gives superseded
 * idle segments back first, waiting for the growing stream's own older
 * work. While any pool stream captures a graph nothing may go back to the
 * device, so growth during a capture only notes the debt; when the last
 * capture ends (capture_ended) the idle segments go back down to the cap.
 * Without that, a temporary growing inside every captured evaluation (ggml
 * with CUDA graphs) kept every superseded segment until it aged out.
 *
 * Idle segments go back through units.c.
 *
 * Invariants (segment_check, with tpi_units_check): a unit's live count
 * equals the used nodes in its segment (its region in the range
 * allocator), and its live bytes their sizes; an idle segment is one free
 * node spanning it; reserved bytes equal the segments' bytes.
 */
#include "pool_core.h"

#define SMALL_REQUEST_MAX (1 * TPI_MiB)
#define MEDIUM_REQUEST_MAX (10 * TPI_MiB)
#define LADDER_BASE (2 * TPI_MiB)
#define SEGMENT_FIND_CANDIDATES 16
#define SEGMENT_FIND_PASSED_OVER 256
#define SPARSE_LIVE_DIV 8
#define APART_ON_DIV 4
#define APART_OFF_DIV 8
#define APART_SIZE_FACTOR 2
#define MOVING_APART_FACTOR 8
#define LIFETIME_WEIGHT_DIV 8
#define NO_LIFETIME UINT64_MAX

static const tpi_backing_ops segment_ops;

/* The backing's state: growth during a capture that passed the cap (see
 * grow) and could not be balanced then. */
typedef struct segment_backing {
    tpi_backing base; /* first: a tpi_backing * is a segment_backing * */
    bool capture_growth_owed;
    bool keep_apart; /* pinned segments hold too much: see the header */
    /* Per size bin, how long its blocks stay placed: a running average of
     * the pool's allocations between a block's placement and its return
     * here (parked time included: a parked block pins its segment just as
     * a live one); NO_LIFETIME while none has come back. */
    uint64_t lifetime_allocs[TPI_RA_BIN_COUNT];
    uint64_t *placed_at_allocs; /* per node: the pool's allocation count at its placement */
    size_t placed_capacity;
} segment_backing;

/* Smallest ladder size holding bytes: 2 MiB steps while a step of
 * growth_step_percent is smaller than 2 MiB, then geometric. Saturates at
 * the largest aligned size rather than wrapping. */
static uint64_t ladder_size(const tpi_core *core, uint64_t bytes) {
    const uint64_t top = UINT64_MAX - (UINT64_MAX % LADDER_BASE) - LADDER_BASE;
    uint64_t size = LADDER_BASE;
    while (size < bytes) {
        uint64_t step = tpi_align_up(TPI_MAX(size / 100 * core->config.growth_step_percent, LADDER_BASE), LADDER_BASE);
        if (size > top - step) return bytes;
        size += step;
    }
    return size;
}

static uint64_t segment_bytes_for(const tpi_core *core, uint64_t size) {
    const tp_pool_config *config = &core->config;
    if (size <= SMALL_REQUEST_MAX && size <= config->small_segment_bytes) return config->small_segment_bytes;
    if (size <= MEDIUM_REQUEST_MAX && size <= config->medium_segment_bytes) return config->medium_segment_bytes;
    uint64_t ladder = ladder_size(core, size);
    return ladder > UINT64_MAX - config->alignment_bytes ? size : tpi_align_up(ladder, config->alignment_bytes);
}

/* Free space in a busy segment is always fair game; an idle segment when it
 * is not much larger than the request, or still warm. */
static bool segment_wakes(tpi_core *core, uint32_t id, uint64_t wake_limit_bytes, uint64_t *now_ns) {
    const tpi_unit *unit = &core->units.units[tpi_ra_node_at(&core->ra, id)->region];
    if (unit->state != TPI_UNIT_IDLE || unit->bytes <= wake_limit_bytes) return true;
    if (!*now_ns) *now_ns = tpi_units_now(&core->units) + 1;
    return *now_ns - 1 - unit->last_big_use_ns < core->config.idle_release_ns;
}

/* The moving buffers' segments a request stays out of (see the header):
 * those larger than above_bytes grown for a request whose size bin stays
 * placed for less than lifetime_allocs, the request's own bin's figure
 * (NO_LIFETIME, no history: none). */
typedef struct moving_keep_out {
    uint64_t above_bytes;
    uint64_t lifetime_allocs;
} moving_keep_out;

static bool kept_out(const segment_backing *sb, const moving_keep_out *keep_out, uint32_t u) {
    if (!keep_out || keep_out->lifetime_allocs == NO_LIFETIME) return false;
    const tpi_unit *unit = &sb->base.core->units.units[u];
    if (!unit->made_for_moving || unit->bytes <= keep_out->above_bytes) return false;
    uint64_t made_for = sb->lifetime_allocs[unit->made_for_bin];
    return made_for != NO_LIFETIME && keep_out->lifetime_allocs > made_for;
}

/* Good fit among free ranges the stream may use (same stream, completed,
 * or -- failing all else -- made safe by a stream wait) in segments it may
 * wake, no larger than max_segment_bytes and not kept out (keep_out, NULL
 * for none). Ranges in the other segments are passed over without counting
 * against the candidates, up to SEGMENT_FIND_PASSED_OVER of them. Returns
 * the node or TPI_RA_NONE. */
static uint32_t find_usable(segment_backing *sb, uint64_t size, uint32_t slot, uint64_t wake_limit_bytes,
                            uint64_t max_segment_bytes, const moving_keep_out *keep_out) {
    tpi_core *core = sb->base.core;
    tpi_ra_search search;
    tpi_ra_search_begin(&core->ra, size, &search);
    uint32_t wait_candidate = TPI_RA_NONE, first_usable = TPI_RA_NONE;
    uint64_t now_ns = 0;
    /* A capturing stream prefers the ranges it freed itself: the graph's
     * footprint then stays near its peak instead of spreading. */
    bool capturing = tpi_order_stream(&core->order, slot)->capturing;
    unsigned passed_over = 0;
    for (unsigned seen = 0; seen < SEGMENT_FIND_CANDIDATES; seen++) {
        uint32_t id = tpi_ra_search_next(&core->ra, &search);
        if (id == TPI_RA_NONE) break;
        tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
        if (core->units.units[n->region].bytes > max_segment_bytes || kept_out(sb, keep_out, n->region)) {
            if (passed_over++ < SEGMENT_FIND_PASSED_OVER) seen--;
            continue;
        }
        uint32_t owner_slot = tpi_tag_slot(n->owner);
        if (!tpi_order_tag_usable(&core->order, &n->owner, slot)) {
            if (wait_candidate == TPI_RA_NONE && owner_slot != TPI_SLOT_MULTI) wait_candidate = id;
            continue;
        }
        if (!segment_wakes(core, id, wake_limit_bytes, &now_ns)) continue;
        if (!capturing || owner_slot == slot || owner_slot == TPI_SLOT_MULTI) return id; /* its own frees, maybe merged */
        if (first_usable == TPI_RA_NONE) first_usable = id;
    }
    if (first_usable != TPI_RA_NONE) return first_usable;
    if (wait_candidate == TPI_RA_NONE) return TPI_RA_NONE;
    /* Only ranges another stream may still use: order this stream after
     * that stream's event instead of waiting on the host. */
    if (tpi_order_after(&core->order, slot, tpi_ra_node_at(&core->ra, wait_candidate)->owner) != TP_OK)
        return TPI_RA_NONE;
    return wait_candidate;
}

/* A new segment of segment_bytes (or just the request, if the rounded size
 * does not fit) as a free region; its node goes to *out_node. */
/* The pool may grow to its high-water mark (the most it ever had live,
 * this request included) plus 1/GROWTH_HEADROOM_DIV before it waits for
 * its own stream to give superseded segments back. */
#define GROWTH_HEADROOM_DIV 16

static uint64_t growth_cap(const tpi_core *core, uint64_t size) {
    const tp_pool_stats *s = &core->stats.pub;
    uint64_t high = TPI_MAX(TPI_MAX(s->allocated_bytes.peak, core->stats.high_water_allocated),
                            s->allocated_bytes.current + size);
    return high > UINT64_MAX / 2 ? UINT64_MAX : high + high / GROWTH_HEADROOM_DIV;
}

/* Pinned segments (see the header): decides at a growth whether placement
 * keeps requests apart from much larger segments. O(segments), at a device
 * allocation. */
static void update_keep_apart(segment_backing *sb) {
    tpi_core *core = sb->base.core;
    const tpi_units *units = &core->units;
    uint64_t sparse_free = 0, reserved = core->stats.pub.reserved_bytes.current;
    for (uint32_t u = 0; u < units->capacity; u++) {
        const tpi_unit *unit = &units->units[u];
        if (unit->state == TPI_UNIT_BUSY && unit->bytes > core->config.small_segment_bytes &&
            unit->live_bytes <= unit->bytes / SPARSE_LIVE_DIV)
            sparse_free += unit->bytes - unit->live_bytes;
    }
    bool was = sb->keep_apart;
    if (sparse_free > reserved / APART_ON_DIV)
        sb->keep_apart = true;
    else if (sparse_free < reserved / APART_OFF_DIV)
        sb->keep_apart = false;
    if (sb->keep_apart != was)
        tpi_logf(&core->device->logger, TP_LOG_DEBUG,
                 "segment pool: %llu of %llu bytes held lie free in sparse segments; requests %s larger segments",
                 (unsigned long long)sparse_free, (unsigned long long)reserved,
                 sb->keep_apart ? "now kept apart from" : "again placed in");
}

static tp_status grow(segment_backing *sb, uint64_t size, uint32_t slot, bool moving, uint64_t segment_bytes,
                      uint32_t *out_node, uint64_t *out_need) {
    tpi_core *core = sb->base.core;
    const tp_pool_config *config = &core->config;
    update_keep_apart(sb);
    tpi_units_release_before_growth(&core->units, segment_bytes);
    const tp_pool_stats *s = &core->stats.pub;
    uint64_t cap = growth_cap(core, size);
    if (s->reserved_bytes.current + segment_bytes > cap && s->reserved_bytes.current < UINT64_MAX - segment_bytes) {
        if (core->order.captures)
            sb->capture_growth_owed = true; /* nothing goes back now: at the capture's end */
        else
            tpi_units_release_own_stream(&core->units, slot, s->reserved_bytes.current + segment_bytes - cap);
    }
    uint64_t reserved = core->stats.pub.reserved_bytes.current;
    uint64_t exact = tpi_align_up(size, config->alignment_bytes);
    if (segment_bytes > config->limit_bytes - TPI_MIN(reserved, config->limit_bytes)) {
        /* A smaller segment that just holds the request may still fit. */
        segment_bytes = exact;
        if (reserved > config->limit_bytes || segment_bytes > config->limit_bytes - reserved) {
            *out_need = reserved + segment_bytes - config->limit_bytes;
            return TP_ERR_OUT_OF_MEMORY;
        }
    }
    uint32_t u = tpi_units_new(&core->units);
    if (u == TPI_UNIT_NONE) return TP_ERR_HOST_OUT_OF_MEMORY;
    uint64_t base = 0;
    tp_status st = core->ops->mem_alloc(core->device, segment_bytes, &base);
    tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_ALLOC);
    if (st == TP_ERR_OUT_OF_MEMORY && segment_bytes > exact) {
        /* The device may still hold the request without the rounding. */
        segment_bytes = exact;
        st = core->ops->mem_alloc(core->device, segment_bytes, &base);
        tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_ALLOC);
    }
    if (st != TP_OK) {
        tpi_units_recycle(&core->units, u);
        *out_need = segment_bytes;
        return st;
    }
    uint32_t id = tpi_ra_add_region(&core->ra, base, segment_bytes, u, TPI_TAG_CLEAN);
    if (id == TPI_RA_NONE) {
        st = core->ops->mem_free(core->device, base, segment_bytes);
        tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_FREE);
        tpi_units_recycle(&core->units, u);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    tpi_unit *unit = &core->units.units[u];
    unit->base = base;
    unit->bytes = segment_bytes;
    unit->live = 0;
    unit->live_bytes = 0;
    unit->tag = TPI_TAG_CLEAN;
    unit->made_for_moving = moving;
    unit->made_for_bin = (uint16_t)tpi_ra_bin_floor(&core->ra, size);
    tpi_stats_reserved_changed(&core->stats, (int64_t)segment_bytes);
    tpi_observe(&core->stats, TP_POOL_EVENT_DEVICE_ALLOC, base, segment_bytes, TP_STREAM_DEFAULT);
    *out_node = id;
    return TP_OK;
}

/* Used node id, just taken, counts in its segment: one more live block (an
 * idle segment becomes busy) and its bytes; its placement is stamped (no
 * stamp without host memory: its lifetime then goes unrecorded). */
static void count_taken_block(segment_backing *sb, uint32_t id) {
    tpi_core *core = sb->base.core;
    size_t had = sb->placed_capacity;
    if (id < had || tpi_host_grow(core->host, (void **)&sb->placed_at_allocs, sizeof *sb->placed_at_allocs,
                                  &sb->placed_capacity, (size_t)id + 1)) {
        if (sb->placed_capacity > had)
            memset(sb->placed_at_allocs + had, 0, (sb->placed_capacity - had) * sizeof *sb->placed_at_allocs);
        sb->placed_at_allocs[id] = core->stats.pub.allocs + 1; /* 0: not stamped */
    }
    const tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
    tpi_unit *unit = &core->units.units[n->region];
    if (unit->live++ == 0 && unit->state == TPI_UNIT_IDLE) tpi_units_became_busy(&core->units, n->region);
    unit->live_bytes += n->size;
}

static tp_status segment_try_alloc(tpi_backing *b, uint64_t size, uint32_t slot, bool moving, bool may_grow,
                                   uint32_t *out_node, uint64_t *out_need) {
    segment_backing *sb = (segment_backing *)b;
    tpi_core *core = b->core;
    uint64_t segment_bytes = segment_bytes_for(core, size);
    uint64_t max_segment_bytes = UINT64_MAX;
    if (sb->keep_apart && segment_bytes <= UINT64_MAX / APART_SIZE_FACTOR)
        max_segment_bytes = APART_SIZE_FACTOR * segment_bytes;
    moving_keep_out keep_out = {segment_bytes <= UINT64_MAX / MOVING_APART_FACTOR ? MOVING_APART_FACTOR * segment_bytes
                                                                                  : UINT64_MAX,
                                sb->lifetime_allocs[tpi_ra_bin_floor(&core->ra, size)]};
    uint64_t wake_limit_bytes = TPI_MAX(4 * size, segment_bytes);
    uint32_t id = find_usable(sb, size, slot, wake_limit_bytes, max_segment_bytes, &keep_out);
    if (id == TPI_RA_NONE) {
        if (!may_grow) return TP_NOT_READY;
        tp_status st = grow(sb, size, slot, moving, segment_bytes, &id, out_need);
        /* Out of memory while kept apart or out: the other segments' room
         * is still better than a failure. */
        if (st == TP_ERR_OUT_OF_MEMORY && (max_segment_bytes != UINT64_MAX || keep_out.lifetime_allocs != NO_LIFETIME)) {
            id = find_usable(sb, size, slot, wake_limit_bytes, UINT64_MAX, NULL);
            if (id != TPI_RA_NONE) st = TP_OK;
        }
        if (st != TP_OK) return st;
    }
    tpi_units *units = &core->units;
    uint32_t u = tpi_ra_node_at(&core->ra, id)->region;
    if (tpi_ra_take(&core->ra, id, size) == TPI_RA_NONE) {
        if (units->units[u].live == 0 && units->units[u].state == TPI_UNIT_BUSY) { /* a fresh segment: keep it, idle */
            units->units[u].idle_node = id;
            tpi_units_became_idle(units, u, 0);
        }
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    count_taken_block(sb, id);
    if (size * 4 >= units->units[u].bytes) units->units[u].last_big_use_ns = tpi_units_now(units);
    *out_node = id;
    return TP_OK;
}

static tp_status segment_claim(tpi_backing *b, uint64_t offset, uint64_t size, uint32_t *out_node) {
    tpi_core *core = b->core;
    uint32_t id = tpi_ra_take_at(&core->ra, offset, size);
    if (id == TPI_RA_NONE) return TP_ERR_INVALID_ARGUMENT;
    count_taken_block((segment_backing *)b, id);
    *out_node = id;
    return TP_OK;
}

/* A block of block_bytes placed at stamp (count_taken_block) comes back:
 * its bin's running average of lifetimes takes it in. */
static void note_lifetime(segment_backing *sb, uint64_t stamp, uint64_t block_bytes) {
    tpi_core *core = sb->base.core;
    if (!stamp) return;
    uint64_t life = core->stats.pub.allocs + 1 - stamp;
    uint64_t *average = &sb->lifetime_allocs[tpi_ra_bin_floor(&core->ra, block_bytes)];
    *average = *average == NO_LIFETIME ? life : (*average * (LIFETIME_WEIGHT_DIV - 1) + life) / LIFETIME_WEIGHT_DIV;
}

static void segment_release_block(tpi_backing *b, uint32_t node, uint64_t idle_since_ns) {
    segment_backing *sb = (segment_backing *)b;
    tpi_core *core = b->core;
    tpi_tag tag = tpi_ra_node_at(&core->ra, node)->owner;
    uint64_t block_bytes = tpi_ra_node_at(&core->ra, node)->size;
    if (node < sb->placed_capacity) {
        note_lifetime(sb, sb->placed_at_allocs[node], block_bytes);
        sb->placed_at_allocs[node] = 0;
    }
    uint32_t free_node = tpi_ra_release(&core->ra, node);
    uint32_t u = tpi_ra_node_at(&core->ra, free_node)->region;
    tpi_unit *unit = &core->units.units[u];
    unit->tag = tpi_order_merge(&core->order, unit->tag, tag);
    unit->live_bytes -= block_bytes;
    if (--unit->live == 0) {
        unit->idle_node = free_node;
        tpi_units_became_idle(&core->units, u, idle_since_ns);
    }
}

static void segment_free_figures(tpi_backing *b, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges) {
    tpi_ra *ra = &b->core->ra;
    *out_free = ra->free_bytes;
    *out_largest = tpi_ra_largest_free(ra);
    *out_ranges = ra->free_count;
}

/* covered[], used[] and used_bytes[] have one zeroed entry per unit. */
static bool segments_agree(tpi_core *core, uint64_t *covered, uint64_t *used, uint64_t *used_bytes, char *msg,
                           size_t capacity) {
    const tpi_units *units = &core->units;
    for (size_t i = 0; i < core->ra.node_capacity; i++) {
        const tpi_ra_node *n = &core->ra.nodes[i];
        if (n->state == TPI_RA_NODE_UNUSED) continue;
        const tpi_unit *unit = n->region < units->capacity ? &units->units[n->region] : NULL;
        if (!unit || unit->state == TPI_UNIT_UNUSED || n->offset < unit->base ||
            n->offset + n->size > unit->base + unit->bytes)
            TPI_FAIL(msg, capacity, "node %zu lies outside its segment", i);
        covered[n->region] += n->size;
        used[n->region] += n->state == TPI_RA_NODE_USED;
        used_bytes[n->region] += n->state == TPI_RA_NODE_USED ? n->size : 0;
    }
    for (uint32_t u = 0; u < units->capacity; u++) {
        const tpi_unit *unit = &units->units[u];
        if (unit->state == TPI_UNIT_UNUSED) continue;
        if (covered[u] != unit->bytes || used[u] != unit->live || (unit->state == TPI_UNIT_IDLE) != (used[u] == 0))
            TPI_FAIL(msg, capacity, "segment %u: covered %llu of %llu bytes, %llu used nodes, live %llu", u,
                     (unsigned long long)covered[u], (unsigned long long)unit->bytes, (unsigned long long)used[u],
                     (unsigned long long)unit->live);
        if (used_bytes[u] != unit->live_bytes)
            TPI_FAIL(msg, capacity, "segment %u: its used nodes hold %llu bytes, its count says %llu", u,
                     (unsigned long long)used_bytes[u], (unsigned long long)unit->live_bytes);
        if (unit->state == TPI_UNIT_IDLE) {
            const tpi_ra_node *n = tpi_ra_node_at(&core->ra, unit->idle_node);
            if (n->state != TPI_RA_NODE_FREE || n->offset != unit->base || n->size != unit->bytes)
                TPI_FAIL(msg, capacity, "idle segment %u: its free node does not span it", u);
        }
    }
    return true;
}

static bool segment_check(tpi_backing *b, char *msg, size_t capacity) {
    tpi_core *core = b->core;
    size_t entries = core->units.capacity ? core->units.capacity : 1;
    uint64_t *covered = tpi_host_calloc(core->host, entries, sizeof *covered);
    uint64_t *used = tpi_host_calloc(core->host, entries, sizeof *used);
    uint64_t *used_bytes = tpi_host_calloc(core->host, entries, sizeof *used_bytes);
    bool ok = !covered || !used || !used_bytes || segments_agree(core, covered, used, used_bytes, msg, capacity);
    tpi_host_free(core->host, covered, entries * sizeof *covered);
    tpi_host_free(core->host, used, entries * sizeof *used);
    tpi_host_free(core->host, used_bytes, entries * sizeof *used_bytes);
    return ok;
}

static void segment_destroy(tpi_backing *b) {
    tpi_core *core = b->core;
    for (size_t u = 0; u < core->units.capacity; u++) {
        tpi_unit *unit = &core->units.units[u];
        if (unit->state == TPI_UNIT_UNUSED) continue;
        tp_status st = core->ops->mem_free(core->device, unit->base, unit->bytes);
        tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_FREE);
        if (st != TP_OK)
            tpi_logf(&core->device->logger, TP_LOG_ERROR, "segment pool destroy: free of %llu bytes failed: %s",
                    (unsigned long long)unit->bytes, tp_status_name(st));
        tpi_stats_reserved_changed(&core->stats, -(int64_t)unit->bytes);
        tpi_observe(&core->stats, TP_POOL_EVENT_DEVICE_FREE, unit->base, unit->bytes, TP_STREAM_DEFAULT);
    }
    segment_backing *sb = (segment_backing *)b;
    tpi_host_free(core->host, sb->placed_at_allocs, sb->placed_capacity * sizeof *sb->placed_at_allocs);
    tpi_host_free(core->host, sb, sizeof *sb);
}

/* Growth during a capture that passed the cap could give nothing back then
 * (no device frees while a stream captures): once the last capture has
 * ended, the idle segments it superseded go back as grow would have done
 * -- completed ones first, then those whose last use is this stream's own
 * older work, waited for -- down to the cap. */
static void segment_capture_ended(tpi_backing *b, uint32_t slot) {
    segment_backing *sb = (segment_backing *)b;
    tpi_core *core = b->core;
    if (!sb->capture_growth_owed || core->order.captures) return;
    sb->capture_growth_owed = false;
    uint64_t cap = growth_cap(core, 0);
    tpi_units_release_idle_down_to(&core->units, cap, 0);
    uint64_t reserved = core->stats.pub.reserved_bytes.current;
    if (reserved > cap) tpi_units_release_own_stream(&core->units, slot, reserved - cap);
}

tp_status tpi_segment_create(tpi_core *core, tpi_backing **out_backing) {
    segment_backing *sb = tpi_host_calloc(core->host, 1, sizeof *sb);
    if (!sb) return TP_ERR_HOST_OUT_OF_MEMORY;
    sb->base = (tpi_backing){&segment_ops, core};
    for (size_t bin = 0; bin < TPI_RA_BIN_COUNT; bin++) sb->lifetime_allocs[bin] = NO_LIFETIME;
    tpi_backing *b = &sb->base;
    tpi_units_config uc = {TPI_UNITS_SEGMENTS, core->config.release_threshold_bytes, core->config.idle_release_ns,
                           0, 0, 0};
    tp_status st = tpi_units_init(&core->units, &uc, core->device, &core->ra, &core->order, &core->stats);
    if (st != TP_OK) {
        tpi_host_free(core->host, sb, sizeof *sb);
        return st;
    }
    *out_backing = b;
    return TP_OK;
}

static const tpi_backing_ops segment_ops = {
    .name = "segment",
    .try_alloc = segment_try_alloc,
    .claim = segment_claim,
    .release_block = segment_release_block,
    .destroy = segment_destroy,
    .check = segment_check,
    .free_figures = segment_free_figures,
    .capture_ended = segment_capture_ended,
};
