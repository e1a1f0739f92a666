/*
 * pool_vmm.c -- the VMM backing: one address reservation made at creation,
 * physical pages mapped on demand and unmapped when idle.
 *
 * Algorithm: the range allocator manages the whole reservation, so any free
 * order works and a block may span any number of pages. Every page is a
 * unit of its own (units[p] for page p): it counts the live blocks touching
 * it, and with none it is idle and may be unmapped alone once the work that
 * last used it has completed. A block goes to the first window, in good-fit
 * order, whose pages are mapped and usable on the stream (place_accept);
 * the pages it touches that are not mapped are then mapped in runs, one
 * device call per run (the driver backs each page with its own physical
 * allocation, so pages unmap independently). Growth maps a look-ahead after
 * the block (lookahead_pages) so growing requests cost O(log n) calls, and
 * first unmaps idle pages when the pool would pass its soft or hard cap
 * (cap_with_headroom).
 * Releasing an idle page takes its idle, completed neighbours of the same
 * age along in the same call.
 *
 * Invariants (vmm_check): units[p].live equals the number of used nodes
 * overlapping page p; a page is UNUSED iff unmapped, IDLE iff mapped with no
 * live block, else BUSY; unit_count equals the mapped pages and reserved
 * bytes equal unit_count pages; no page at or above page_high is mapped.
 */
#include "pool_internal.h"

#include <stdio.h>
#include <string.h>

static inline uint64_t page_of(const tp_pool *pool, uint64_t address) {
    return (address - pool->va_base) >> pool->page_shift;
}

static inline uint64_t page_address(const tp_pool *pool, uint64_t page) {
    return pool->va_base + (page << pool->page_shift);
}

static inline bool page_mapped(const tp_pool *pool, uint64_t page) {
    return pool->units[page].state != UNIT_UNUSED;
}

static tp_status vmm_init(tp_pool *pool) {
    pool->page_bytes = pool->config.page_bytes;
    pool->page_shift = (uint32_t)__builtin_ctzll(pool->page_bytes);
    pool->va_bytes = pool->config.va_reserve_bytes;
    uint64_t pages = pool->va_bytes >> pool->page_shift;
    if (pages >= POOL_NONE) return TP_ERR_INVALID_ARGUMENT;
    /* Zeroed lazily by the host allocator: untouched pages cost nothing. */
    pool->units = tp_host_calloc(pool->host, pages, sizeof *pool->units);
    if (!pool->units) return TP_ERR_HOST_OUT_OF_MEMORY;
    pool->unit_capacity = pages;
    tp_status st = pool->ops->va_reserve(pool->device, pool->va_bytes, pool->page_bytes, &pool->va_base);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
    if (st != TP_OK) {
        tp_logf(&pool->device->logger, TP_LOG_ERROR, "VMM pool: reserving %llu bytes of address space failed: %s",
                (unsigned long long)pool->va_bytes, tp_status_name(st));
        goto fail;
    }
    if (tp_ra_add_region(&pool->ra, pool->va_base, pool->va_bytes, 0, (tp_tag){RA_TAG_CLEAN, 0}) == RA_NONE) {
        pool->ops->va_release(pool->device, pool->va_base, pool->va_bytes);
        st = TP_ERR_HOST_OUT_OF_MEMORY;
        goto fail;
    }
    return TP_OK;
fail:
    tp_host_free(pool->host, pool->units, pages * sizeof *pool->units);
    pool->units = NULL;
    pool->unit_capacity = 0;
    return st;
}

static void vmm_destroy(tp_pool *pool) {
    /* Unmap every run of mapped pages; the pool's teardown frees units[]. */
    for (uint64_t p = 0; p < pool->page_high;) {
        if (!page_mapped(pool, p)) {
            p++;
            continue;
        }
        uint64_t end = p;
        while (end + 1 < pool->page_high && page_mapped(pool, end + 1)) end++;
        uint64_t bytes = (end - p + 1) << pool->page_shift;
        tp_status st = pool->ops->unmap(pool->device, page_address(pool, p), bytes);
        tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
        if (st != TP_OK)
            tp_logf(&pool->device->logger, TP_LOG_ERROR, "VMM pool destroy: unmap of %llu bytes failed: %s",
                    (unsigned long long)bytes, tp_status_name(st));
        tp_pool_reserved_changed(pool, -(int64_t)bytes);
        p = end + 1;
    }
    tp_status st = pool->ops->va_release(pool->device, pool->va_base, pool->va_bytes);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
}

static void ref_pages(tp_pool *pool, uint64_t offset, uint64_t size) {
    for (uint64_t p = page_of(pool, offset), last = page_of(pool, offset + size - 1); p <= last; p++) {
        pool_unit *unit = &pool->units[p];
        if (unit->live++ == 0 && unit->state == UNIT_IDLE) tp_pool_unit_became_busy(pool, (uint32_t)p);
    }
}

static void vmm_after_release(tp_pool *pool, uint64_t offset, uint64_t size, uint32_t free_node, tp_tag tag) {
    (void)free_node;
    for (uint64_t p = page_of(pool, offset), last = page_of(pool, offset + size - 1); p <= last; p++) {
        pool_unit *unit = &pool->units[p];
        if (unit->state != UNIT_UNUSED) unit->tag = tp_ra_merge_tags(unit->tag, tag, pool->ra.multi_epoch);
        if (--unit->live == 0 && unit->state == UNIT_BUSY) tp_pool_unit_became_idle(pool, (uint32_t)p);
    }
}

/* Maps pages [first, last] in one call. */
static tp_status map_run(tp_pool *pool, uint64_t first, uint64_t last) {
    uint64_t bytes = (last - first + 1) << pool->page_shift;
    tp_status st = pool->ops->map(pool->device, page_address(pool, first), bytes);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_ALLOC);
    if (st != TP_OK) return st;
    for (uint64_t p = first; p <= last; p++) {
        pool_unit *unit = &pool->units[p];
        unit->base = page_address(pool, p);
        unit->bytes = pool->page_bytes;
        unit->tag = (tp_tag){RA_TAG_CLEAN, 0};
        unit->lru_prev = unit->lru_next = POOL_NONE;
        pool->unit_count++;
        if (unit->live) {
            unit->state = UNIT_BUSY;
        } else {
            tp_pool_unit_became_idle(pool, (uint32_t)p);
        }
    }
    if (last + 1 > pool->page_high) pool->page_high = last + 1;
    tp_pool_reserved_changed(pool, (int64_t)bytes);
    return TP_OK;
}

/* Growth policy. The pool may hold up to a soft cap: the highest allocated
 * bytes it has seen plus 1/SOFT_HEADROOM_DIV of that (and always what the
 * current request needs). Below the cap it keeps idle pages cached and maps
 * a look-ahead when it grows; past the cap it first unmaps idle pages whose
 * work has completed and that have been idle for VMM_CAP_RELEASE_MIN_IDLE_NS
 * (fresher ones are the working set of the step in progress: unmapping them
 * only to map them again is churn). Past the hard cap (1/HARD_HEADROOM_DIV)
 * fresh idle pages go too: a workload whose blocks move through the address
 * space every step (two streams, KV blocks reallocated larger every token:
 * the image-requests scenario) would otherwise keep mapping new pages,
 * 1.37x its peak live instead of 1.07x. So the cache is generous while the
 * pool runs below its high-water mark and tight when it reaches a new one. */
#define SOFT_HEADROOM_DIV 128
#define HARD_HEADROOM_DIV 16
#define VMM_CAP_RELEASE_MIN_IDLE_NS 100000000ull

static uint64_t high_water(const tp_pool *pool) {
    return TP_MAX(pool->stats.allocated_bytes.peak, pool->high_water_allocated);
}

/* max(high water + high water / div + 2 pages, what the pool needs now) */
static uint64_t cap_with_headroom(const tp_pool *pool, uint64_t div, uint64_t missing_bytes) {
    uint64_t high = high_water(pool);
    uint64_t floor = pool->stats.reserved_bytes.current - pool->idle_bytes + missing_bytes;
    return TP_MAX(high + high / div + 2 * pool->page_bytes, floor);
}

/* Look-ahead: while the pool only grows (a streak of growths with no free
 * in between, like weights being loaded) it doubles with each growth, up to
 * 1/8 of what the pool holds. Otherwise it is 1/16 of the transient part of
 * the high-water mark: the peak allocated bytes minus the lowest allocated
 * bytes seen since the previous growth. A workload whose temporaries grow
 * step by step (design.md failure mode 1) thus grows geometrically, in
 * O(log n) calls, while a model whose weights dominate (decode with a
 * growing KV cache) maps little ahead beyond its long-lived memory. */
static uint64_t lookahead_pages(const tp_pool *pool) {
    uint64_t reserved = pool->stats.reserved_bytes.current;
    uint64_t target = 2 * pool->page_bytes;
    if (pool->growth_streak > 1) {
        uint32_t doublings = TP_MIN(pool->growth_streak - 1, 20u);
        target = TP_MAX(target, TP_MIN(pool->page_bytes << doublings, reserved / 8));
    } else {
        uint64_t high = high_water(pool);
        uint64_t low = TP_MIN(pool->low_water_allocated, high);
        target = TP_MAX(target, (high - low) / 16);
    }
    return TP_MIN(target, pool->config.max_map_bytes) >> pool->page_shift;
}

/* Maps the pages block id touches that are not mapped, plus a look-ahead of
 * free unmapped pages after it. */
static tp_status map_block(tp_pool *pool, uint32_t id, uint64_t *out_need) {
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    uint64_t first = page_of(pool, n->offset), last = page_of(pool, n->offset + n->size - 1);
    uint64_t missing_pages = 0;
    for (uint64_t p = first; p <= last; p++) missing_pages += !page_mapped(pool, p);
    if (!missing_pages) return TP_OK;
    uint64_t missing = missing_pages << pool->page_shift;

    pool->growth_streak++;
    uint64_t cap = cap_with_headroom(pool, SOFT_HEADROOM_DIV, missing);
    /* Look-ahead: unmapped pages wholly inside the free range after the block. */
    uint64_t extra = 0, want = lookahead_pages(pool);
    pool->low_water_allocated = pool->stats.allocated_bytes.current;
    if (want && n->addr_next != RA_NONE && tp_ra_node_at(&pool->ra, n->addr_next)->state == RA_NODE_FREE) {
        const tp_ra_node *rest = tp_ra_node_at(&pool->ra, n->addr_next);
        uint64_t end_page = page_of(pool, rest->offset + rest->size); /* first page not wholly free */
        for (uint64_t p = last + 1; p < end_page && extra < want && !page_mapped(pool, p); p++) extra++;
    }
    if (pool->stats.reserved_bytes.current + missing > cap)
        tp_pool_release_idle_down_to(pool, cap > missing ? cap - missing : 0, VMM_CAP_RELEASE_MIN_IDLE_NS);
    uint64_t hard = cap_with_headroom(pool, HARD_HEADROOM_DIV, missing);
    if (pool->stats.reserved_bytes.current + missing > hard)
        tp_pool_release_idle_down_to(pool, hard > missing ? hard - missing : 0, 0);
    uint64_t reserved = pool->stats.reserved_bytes.current, limit = pool->config.limit_bytes;
    if (reserved + missing > limit) {
        *out_need = reserved + missing - limit;
        return TP_ERR_OUT_OF_MEMORY;
    }
    extra = TP_MIN(extra, (limit - reserved - missing) >> pool->page_shift);
    uint64_t end = last + extra;
    uint64_t max_run = TP_MAX(pool->config.max_map_bytes >> pool->page_shift, 1);
    for (uint64_t p = first; p <= end;) {
        if (page_mapped(pool, p)) {
            p++;
            continue;
        }
        uint64_t run_end = p;
        while (run_end < end && !page_mapped(pool, run_end + 1) && run_end + 1 - p < max_run) run_end++;
        tp_status st = map_run(pool, p, run_end);
        if (st != TP_OK && p <= last && run_end > last) {
            run_end = last; /* try again without the look-ahead */
            st = map_run(pool, p, run_end);
        }
        if (st != TP_OK) {
            if (p > last) return TP_OK; /* only the look-ahead failed */
            uint64_t still = 0;
            for (uint64_t q = p; q <= last; q++) still += !page_mapped(pool, q);
            *out_need = still << pool->page_shift;
            return st;
        }
        p = run_end + 1;
    }
    return TP_OK;
}

/* Placement. For the VMM pool the question "may this stream use this
 * memory?" is asked of physical pages, not of free ranges: a free range
 * may run on into address space that is not even mapped, and a stream tag
 * on the range would make all of it look busy. Each mapped page carries the
 * merged tag of every free inside it (vmm_after_release); unmapped pages
 * carry none (a page is only unmapped once its work has completed).
 *
 * Among free ranges in good-fit order, the first whose pages are all
 * usable and mapped wins; failing that, the usable one needing the fewest
 * new pages; failing that, one whose only obstacle is work of one other
 * stream, after making this stream wait for it. */
typedef struct placement {
    tp_pool *pool;
    uint64_t size;
    uint32_t slot;
    uint64_t offset;   /* where in the accepted range the block goes */
    uint32_t best;
    uint64_t best_offset, best_missing;
    uint32_t wait;     /* candidate blocked by one other stream only */
    uint64_t wait_offset;
    tp_tag wait_tag;
} placement;

static bool place_accept(void *c, tp_ra *ra, uint32_t id) {
    placement *pl = c;
    tp_pool *pool = pl->pool;
    const tp_ra_node *n = tp_ra_node_at(ra, id);
    uint64_t end = n->offset + n->size;
    /* The first window of size bytes in the range whose pages this stream
     * may use; a blocked page pushes the window past it. */
    uint64_t at = n->offset, missing = 0;
    tp_tag blocker = {RA_TAG_CLEAN, 0};
    uint64_t blocked_at = n->offset;
    for (uint64_t p = page_of(pool, at); at + pl->size <= end && p <= page_of(pool, at + pl->size - 1); p++) {
        pool_unit *unit = &pool->units[p];
        if (unit->state == UNIT_UNUSED) {
            missing++;
        } else if (!tp_pool_tag_usable(pool, &unit->tag, pl->slot)) {
            if (blocker.slot == RA_TAG_CLEAN) blocked_at = at;
            blocker = tp_ra_merge_tags(blocker, unit->tag, pool->ra.multi_epoch);
            at = page_address(pool, p + 1);
            missing = 0;
        }
    }
    if (at + pl->size > end) {
        /* No free window: one other stream's pending work is the only
         * obstacle if its tag names a single stream. */
        if (pl->wait == RA_NONE && blocker.slot != RA_TAG_CLEAN && blocker.slot != RA_TAG_MULTI &&
            blocked_at + pl->size <= end) {
            pl->wait = id;
            pl->wait_offset = blocked_at;
            pl->wait_tag = blocker;
        }
        return false;
    }
    if (missing == 0) {
        pl->offset = at;
        return true;
    }
    if (missing < pl->best_missing) {
        pl->best = id;
        pl->best_offset = at;
        pl->best_missing = missing;
    }
    return false;
}

static tp_status vmm_try_alloc(tp_pool *pool, uint64_t size, uint32_t slot, uint32_t *out_node, uint64_t *out_need) {
    for (int attempt = 0;; attempt++) {
        placement pl = {pool, size, slot, 0, RA_NONE, 0, UINT64_MAX, RA_NONE, 0, {RA_TAG_CLEAN, 0}};
        uint32_t id = tp_ra_find(&pool->ra, size, place_accept, &pl, 16, NULL);
        uint64_t offset = pl.offset;
        bool needs_pages = id == RA_NONE; /* an accepted range has every page mapped */
        if (id == RA_NONE && pl.best != RA_NONE) {
            id = pl.best;
            offset = pl.best_offset;
        }
        if (id == RA_NONE && pl.wait != RA_NONE && tp_pool_order_after(pool, slot, pl.wait_tag) == TP_OK) {
            id = pl.wait;
            offset = pl.wait_offset;
        }
        if (id == RA_NONE) {
            *out_need = size;
            return TP_ERR_OUT_OF_MEMORY; /* address space exhausted, or all of it still in use by other streams */
        }
        if (offset != tp_ra_node_at(&pool->ra, id)->offset) {
            id = tp_ra_split_free(&pool->ra, id, offset - tp_ra_node_at(&pool->ra, id)->offset);
            if (id == RA_NONE) return TP_ERR_HOST_OUT_OF_MEMORY;
        }
        tp_tag saved = tp_ra_node_at(&pool->ra, id)->tag;
        if (tp_ra_take(&pool->ra, id, size) == RA_NONE) return TP_ERR_HOST_OUT_OF_MEMORY;
        tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
        ref_pages(pool, n->offset, n->size);
        if (needs_pages && attempt == 0 && pool->tcache_bytes) {
            /* Parked blocks may make room without new pages: flush, place again. */
            tp_pool_release_block(pool, id, saved);
            tp_pool_tcache_flush(pool);
            continue;
        }
        tp_status st = needs_pages ? map_block(pool, id, out_need) : TP_OK;
        if (st != TP_OK) {
            tp_pool_release_block(pool, id, saved);
            return st;
        }
        *out_node = id;
        return TP_OK;
    }
}

/* May page p join an unmap run: idle, idle long enough, work complete? */
static bool joins_release(tp_pool *pool, uint64_t p, uint64_t idle_before_ns) {
    pool_unit *unit = &pool->units[p];
    return unit->state == UNIT_IDLE && unit->idle_since_ns <= idle_before_ns && tp_pool_tag_complete(pool, unit->tag);
}

/* Takes idle, completed neighbours of page u (idle since idle_before_ns at
 * the latest) along into one unmap call of at most max_bytes. */
static tp_status vmm_release_unit(tp_pool *pool, uint32_t u, uint64_t idle_before_ns, uint64_t max_bytes) {
    uint64_t max_run = TP_MAX(TP_MIN(pool->config.max_map_bytes, max_bytes) >> pool->page_shift, 1);
    uint64_t first = u, last = u;
    while (last - first + 1 < max_run && first > 0 && joins_release(pool, first - 1, idle_before_ns)) {
        tp_pool_lru_unlink(pool, (uint32_t)--first);
    }
    while (last - first + 1 < max_run && last + 1 < pool->page_high && joins_release(pool, last + 1, idle_before_ns)) {
        tp_pool_lru_unlink(pool, (uint32_t)++last);
    }
    uint64_t bytes = (last - first + 1) << pool->page_shift;
    tp_status st = pool->ops->unmap(pool->device, page_address(pool, first), bytes);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
    if (st != TP_OK) {
        /* Keep them all; u goes back to the idle list in the caller. */
        uint64_t now = tp_pool_now(pool);
        for (uint64_t p = first; p <= last; p++)
            if (p != u) tp_pool_lru_append(pool, (uint32_t)p, now);
        return st;
    }
    for (uint64_t p = first; p <= last; p++) {
        pool->units[p].state = UNIT_UNUSED;
        pool->units[p].tag = (tp_tag){RA_TAG_CLEAN, 0};
        pool->unit_count--;
    }
    tp_pool_reserved_changed(pool, -(int64_t)bytes);
    return TP_OK;
}

static void vmm_free_figures(tp_pool *pool, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges) {
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    for (size_t i = 0; i < pool->ra.node_capacity; i++) {
        const tp_ra_node *n = &pool->ra.nodes[i];
        if (n->state != RA_NODE_FREE) continue;
        uint64_t end = n->offset + n->size, first = page_of(pool, n->offset);
        uint64_t last = TP_MIN(page_of(pool, end - 1), pool->page_high ? pool->page_high - 1 : 0);
        uint64_t run = 0;
        for (uint64_t p = first; p <= last && p < pool->page_high; p++) {
            if (!page_mapped(pool, p)) {
                if (run) ranges++;
                run = 0;
                continue;
            }
            uint64_t start = page_address(pool, p);
            uint64_t lo = TP_MAX(start, n->offset), hi = TP_MIN(start + pool->page_bytes, end);
            run += hi - lo;
            free_bytes += hi - lo;
            largest = TP_MAX(largest, run);
        }
        if (run) ranges++;
    }
    *out_free = free_bytes;
    *out_largest = largest;
    *out_ranges = ranges;
}

#define VMM_FAIL(...)                                              \
    do {                                                           \
        if (msg && capacity) snprintf(msg, capacity, __VA_ARGS__); \
        ok = false;                                                \
        goto done;                                                 \
    } while (0)

static bool vmm_check(tp_pool *pool, char *msg, size_t capacity) {
    bool ok = true;
    uint64_t pages = pool->unit_capacity;
    uint64_t *expected = tp_host_calloc(pool->host, pages, sizeof *expected);
    if (!expected) return true; /* cannot check without memory; not a violation */
    for (size_t i = 0; i < pool->ra.node_capacity; i++) {
        const tp_ra_node *n = &pool->ra.nodes[i];
        if (n->state != RA_NODE_USED) continue;
        if (n->offset < pool->va_base || n->offset + n->size > pool->va_base + pool->va_bytes)
            VMM_FAIL("block 0x%llx outside the reservation", (unsigned long long)n->offset);
        for (uint64_t p = page_of(pool, n->offset), last = page_of(pool, n->offset + n->size - 1); p <= last; p++) {
            expected[p]++;
            if (!page_mapped(pool, p))
                VMM_FAIL("live block 0x%llx touches unmapped page %llu", (unsigned long long)n->offset,
                         (unsigned long long)p);
        }
    }
    uint64_t mapped = 0;
    for (uint64_t p = 0; p < pages; p++) {
        const pool_unit *unit = &pool->units[p];
        if (expected[p] != unit->live)
            VMM_FAIL("page %llu: live %llu, blocks %llu", (unsigned long long)p, (unsigned long long)unit->live,
                     (unsigned long long)expected[p]);
        if (unit->state == UNIT_UNUSED) continue;
        mapped++;
        if (p >= pool->page_high) VMM_FAIL("page %llu mapped above the high-water mark", (unsigned long long)p);
        if (unit->base != page_address(pool, p) || unit->bytes != pool->page_bytes)
            VMM_FAIL("page %llu: wrong address or size", (unsigned long long)p);
        if ((unit->state == UNIT_IDLE) != (unit->live == 0)) VMM_FAIL("page %llu: idle state wrong", (unsigned long long)p);
    }
    if (mapped != pool->unit_count) VMM_FAIL("%llu pages mapped, unit_count %zu", (unsigned long long)mapped, pool->unit_count);
done:
    tp_host_free(pool->host, expected, pages * sizeof *expected);
    return ok;
}

const pool_backend tp_vmm_backend = {
    .name = "vmm",
    .init = vmm_init,
    .destroy = vmm_destroy,
    .try_alloc = vmm_try_alloc,
    .after_release = vmm_after_release,
    .release_unit = vmm_release_unit,
    .check = vmm_check,
    .free_figures = vmm_free_figures,
};
