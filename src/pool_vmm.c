/*
 * pool_vmm.c -- the VMM backing: one address reservation made at creation,
 * physical pages mapped on demand, unmapped when idle.
 *
 * Algorithm: the range allocator manages the whole reservation, so any free
 * order works and a block may span several mappings. A block is placed by
 * good fit over addresses; then every page it touches that is not mapped is
 * mapped, in runs of at most max_map_bytes (one device call per run). When
 * the pool grows it also maps a look-ahead of the free pages right after the
 * block, so that a stream of growing requests (weights being loaded, a KV
 * cache growing) costs O(log n) device calls instead of one per request.
 * Each page counts the live blocks touching it; a mapping (a unit) with no
 * touched page is idle and may be unmapped once the work that last used it
 * has completed.
 *
 * Invariants (vmm_check): page_refs[p] equals the number of used nodes that
 * overlap page p; page_unit[p] names the mapping covering p or POOL_NONE; a
 * unit's live count equals its pages with page_refs > 0, and it is idle iff
 * that count is zero; reserved bytes equal the bytes of all mappings.
 */
#include "pool_internal.h"

#include <stdio.h>
#include <string.h>

static inline uint64_t page_of(const tp_pool *pool, uint64_t address) {
    return (address - pool->va_base) >> pool->page_shift;
}

static tp_status vmm_init(tp_pool *pool) {
    pool->page_bytes = pool->config.page_bytes;
    pool->page_shift = (uint32_t)__builtin_ctzll(pool->page_bytes);
    pool->va_bytes = pool->config.va_reserve_bytes;
    uint64_t pages = pool->va_bytes >> pool->page_shift;
    if (pages > UINT32_MAX) return TP_ERR_INVALID_ARGUMENT;
    pool->page_unit = tp_host_alloc(pool->host, pages * sizeof *pool->page_unit);
    pool->page_refs = tp_host_calloc(pool->host, pages, sizeof *pool->page_refs);
    if (!pool->page_unit || !pool->page_refs) goto host_oom;
    memset(pool->page_unit, 0xff, pages * sizeof *pool->page_unit);
    tp_status st = pool->ops->va_reserve(pool->device, pool->va_bytes, pool->page_bytes, &pool->va_base);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
    if (st != TP_OK) {
        tp_logf(&pool->device->logger, TP_LOG_ERROR, "VMM pool: reserving %llu bytes of address space failed: %s",
                (unsigned long long)pool->va_bytes, tp_status_name(st));
        goto fail;
    }
    if (tp_ra_add_region(&pool->ra, pool->va_base, pool->va_bytes, 0, (tp_tag){RA_TAG_CLEAN, 0}) == RA_NONE) {
        pool->ops->va_release(pool->device, pool->va_base, pool->va_bytes);
        goto host_oom;
    }
    return TP_OK;
host_oom:
    st = TP_ERR_HOST_OUT_OF_MEMORY;
fail:
    tp_host_free(pool->host, pool->page_unit, pages * sizeof *pool->page_unit);
    tp_host_free(pool->host, pool->page_refs, pages * sizeof *pool->page_refs);
    pool->page_unit = NULL;
    pool->page_refs = NULL;
    return st;
}

static void vmm_destroy(tp_pool *pool) {
    for (size_t u = 0; u < pool->unit_capacity; u++) {
        pool_unit *unit = &pool->units[u];
        if (unit->state == UNIT_UNUSED) continue;
        tp_status st = pool->ops->unmap(pool->device, unit->base, unit->bytes, unit->handle);
        tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
        if (st != TP_OK)
            tp_logf(&pool->device->logger, TP_LOG_ERROR, "VMM pool destroy: unmap of %llu bytes failed: %s",
                    (unsigned long long)unit->bytes, tp_status_name(st));
        tp_pool_reserved_changed(pool, -(int64_t)unit->bytes);
    }
    tp_status st = pool->ops->va_release(pool->device, pool->va_base, pool->va_bytes);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_OTHER);
    uint64_t pages = pool->va_bytes >> pool->page_shift;
    tp_host_free(pool->host, pool->page_unit, pages * sizeof *pool->page_unit);
    tp_host_free(pool->host, pool->page_refs, pages * sizeof *pool->page_refs);
}

static void ref_pages(tp_pool *pool, uint64_t offset, uint64_t size) {
    for (uint64_t p = page_of(pool, offset), last = page_of(pool, offset + size - 1); p <= last; p++) {
        if (pool->page_refs[p]++ != 0) continue;
        uint32_t u = pool->page_unit[p];
        if (u != POOL_NONE && pool->units[u].live++ == 0) tp_pool_unit_became_busy(pool, u);
    }
}

static void vmm_after_release(tp_pool *pool, uint64_t offset, uint64_t size, uint32_t free_node, tp_tag tag) {
    (void)free_node;
    uint32_t last_unit = POOL_NONE;
    for (uint64_t p = page_of(pool, offset), last = page_of(pool, offset + size - 1); p <= last; p++) {
        uint32_t u = pool->page_unit[p];
        if (u != POOL_NONE && u != last_unit) {
            pool->units[u].tag = tp_ra_merge_tags(pool->units[u].tag, tag, pool->ra.multi_epoch);
            last_unit = u;
        }
        if (--pool->page_refs[p] != 0 || u == POOL_NONE) continue;
        if (--pool->units[u].live == 0) tp_pool_unit_became_idle(pool, u);
    }
}

/* Maps pages [first, last] as one unit. */
static tp_status map_run(tp_pool *pool, uint64_t first, uint64_t last) {
    uint32_t u = tp_pool_unit_new(pool);
    if (u == POOL_NONE) return TP_ERR_HOST_OUT_OF_MEMORY;
    uint64_t va = pool->va_base + (first << pool->page_shift);
    uint64_t bytes = (last - first + 1) << pool->page_shift;
    uint64_t handle = 0;
    tp_status st = pool->ops->map(pool->device, va, bytes, &handle);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_ALLOC);
    if (st != TP_OK) {
        tp_pool_unit_recycle(pool, u);
        return st;
    }
    pool_unit *unit = &pool->units[u];
    unit->base = va;
    unit->bytes = bytes;
    unit->handle = handle;
    unit->tag = (tp_tag){RA_TAG_CLEAN, 0};
    unit->live = 0;
    for (uint64_t p = first; p <= last; p++) {
        pool->page_unit[p] = u;
        if (pool->page_refs[p]) unit->live++;
    }
    tp_pool_reserved_changed(pool, (int64_t)bytes);
    if (unit->live == 0) tp_pool_unit_became_idle(pool, u);
    return TP_OK;
}

/* Look-ahead for a growing pool: map more than asked, up to 1/32 of what
 * the pool holds (at least 2 pages, at most max_map_bytes), so repeated
 * growth costs a logarithmic number of calls while overshooting little. */
static uint64_t lookahead_pages(const tp_pool *pool, uint64_t missing_bytes) {
    uint64_t reserved = pool->stats.reserved_bytes.current;
    uint64_t target = TP_MIN(TP_MAX(reserved / 32, 2 * pool->page_bytes), pool->config.max_map_bytes);
    if (missing_bytes >= target) return 0;
    return (target - missing_bytes) >> pool->page_shift;
}

/* Maps the pages block id touches that are not mapped, plus a look-ahead of
 * free unmapped pages after it. */
static tp_status map_block(tp_pool *pool, uint32_t id, uint64_t *out_need) {
    tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
    uint64_t first = page_of(pool, n->offset), last = page_of(pool, n->offset + n->size - 1);
    uint64_t missing_pages = 0;
    for (uint64_t p = first; p <= last; p++) missing_pages += pool->page_unit[p] == POOL_NONE;
    if (!missing_pages) return TP_OK;
    uint64_t missing = missing_pages << pool->page_shift;

    /* Look-ahead pages: unmapped pages wholly inside the free range after
     * the block. */
    uint64_t extra = 0;
    uint64_t want = lookahead_pages(pool, missing);
    if (want && n->addr_next != RA_NONE && tp_ra_node_at(&pool->ra, n->addr_next)->state == RA_NODE_FREE) {
        tp_ra_node *rest = tp_ra_node_at(&pool->ra, n->addr_next);
        uint64_t rest_end_page = page_of(pool, rest->offset + rest->size) ; /* first page past the free range */
        for (uint64_t p = last + 1; p < rest_end_page && extra < want && pool->page_unit[p] == POOL_NONE; p++) extra++;
    }
    uint64_t reserved = pool->stats.reserved_bytes.current;
    uint64_t limit = pool->config.limit_bytes;
    tp_pool_release_before_growth(pool, missing + (extra << pool->page_shift));
    reserved = pool->stats.reserved_bytes.current;
    if (reserved + missing > limit) {
        *out_need = reserved + missing - limit;
        return TP_ERR_OUT_OF_MEMORY;
    }
    extra = TP_MIN(extra, (limit - reserved - missing) >> pool->page_shift);
    uint64_t end = last + extra;
    uint64_t max_run = pool->config.max_map_bytes >> pool->page_shift;
    for (uint64_t p = first; p <= end;) {
        if (pool->page_unit[p] != POOL_NONE) {
            p++;
            continue;
        }
        uint64_t run_end = p;
        while (run_end < end && pool->page_unit[run_end + 1] == POOL_NONE && run_end + 1 - p < max_run) run_end++;
        tp_status st = map_run(pool, p, run_end);
        if (st != TP_OK) {
            if (p > last) return TP_OK; /* only the look-ahead failed */
            if (run_end > last) { /* retry without the look-ahead part */
                run_end = last;
                st = map_run(pool, p, run_end);
            }
            if (st != TP_OK) {
                uint64_t still = 0;
                for (uint64_t q = p; q <= last; q++) still += pool->page_unit[q] == POOL_NONE;
                *out_need = still << pool->page_shift;
                return st;
            }
        }
        p = run_end + 1;
    }
    return TP_OK;
}

static tp_status vmm_try_alloc(tp_pool *pool, uint64_t size, uint32_t slot, uint32_t *out_node, uint64_t *out_need) {
    for (int attempt = 0;; attempt++) {
        uint32_t id = tp_pool_find_usable(pool, size, slot, NULL, NULL);
        if (id == RA_NONE) {
            *out_need = size;
            return TP_ERR_OUT_OF_MEMORY; /* address space exhausted, or all of it still in use by other streams */
        }
        tp_tag saved = tp_ra_node_at(&pool->ra, id)->tag;
        if (tp_ra_take(&pool->ra, id, size) == RA_NONE) return TP_ERR_HOST_OUT_OF_MEMORY;
        tp_ra_node *n = tp_ra_node_at(&pool->ra, id);
        ref_pages(pool, n->offset, n->size);
        bool needs_pages = false;
        for (uint64_t p = page_of(pool, n->offset), last = page_of(pool, n->offset + size - 1); p <= last; p++)
            if (pool->page_unit[p] == POOL_NONE) {
                needs_pages = true;
                break;
            }
        if (needs_pages && attempt == 0 && pool->tcache_bytes) {
            /* Parked blocks may make room without new pages: flush, retry. */
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

static tp_status vmm_release_unit(tp_pool *pool, uint32_t u) {
    pool_unit *unit = &pool->units[u];
    tp_status st = pool->ops->unmap(pool->device, unit->base, unit->bytes, unit->handle);
    tp_pool_count_device_call(pool, st, DEVICE_CALL_FREE);
    if (st != TP_OK) return st;
    for (uint64_t p = page_of(pool, unit->base), last = page_of(pool, unit->base + unit->bytes - 1); p <= last; p++)
        pool->page_unit[p] = POOL_NONE;
    tp_pool_reserved_changed(pool, -(int64_t)unit->bytes);
    tp_pool_unit_recycle(pool, u);
    return TP_OK;
}

static void vmm_free_figures(tp_pool *pool, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges) {
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    for (size_t i = 0; i < pool->ra.node_capacity; i++) {
        const tp_ra_node *n = &pool->ra.nodes[i];
        if (n->state != RA_NODE_FREE) continue;
        uint64_t run = 0, end = n->offset + n->size;
        for (uint64_t p = page_of(pool, n->offset), last = page_of(pool, end - 1); p <= last; p++) {
            if (pool->page_unit[p] == POOL_NONE) {
                if (run) ranges++;
                run = 0;
                continue;
            }
            uint64_t page_start = pool->va_base + (p << pool->page_shift);
            uint64_t lo = TP_MAX(page_start, n->offset), hi = TP_MIN(page_start + pool->page_bytes, end);
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

#define VMM_FAIL(...)                                                   \
    do {                                                                \
        if (msg && capacity) snprintf(msg, capacity, __VA_ARGS__);      \
        ok = false;                                                     \
        goto done;                                                      \
    } while (0)

static bool vmm_check(tp_pool *pool, char *msg, size_t capacity) {
    bool ok = true;
    uint64_t pages = pool->va_bytes >> pool->page_shift;
    uint32_t *expected = tp_host_calloc(pool->host, pages, sizeof *expected);
    if (!expected) return true; /* cannot check without memory; not a violation */
    for (size_t i = 0; i < pool->ra.node_capacity; i++) {
        const tp_ra_node *n = &pool->ra.nodes[i];
        if (n->state != RA_NODE_USED) continue;
        if (n->offset < pool->va_base || n->offset + n->size > pool->va_base + pool->va_bytes)
            VMM_FAIL("block 0x%llx outside the reservation", (unsigned long long)n->offset);
        for (uint64_t p = page_of(pool, n->offset), last = page_of(pool, n->offset + n->size - 1); p <= last; p++) {
            expected[p]++;
            if (pool->page_unit[p] == POOL_NONE) VMM_FAIL("live block 0x%llx touches unmapped page %llu",
                                                          (unsigned long long)n->offset, (unsigned long long)p);
        }
    }
    for (uint64_t p = 0; p < pages; p++) {
        if (expected[p] != pool->page_refs[p]) VMM_FAIL("page %llu: %u refs, %u blocks", (unsigned long long)p,
                                                        pool->page_refs[p], expected[p]);
        uint32_t u = pool->page_unit[p];
        if (u == POOL_NONE) continue;
        if (u >= pool->unit_capacity || pool->units[u].state == UNIT_UNUSED) VMM_FAIL("page %llu: stale unit", (unsigned long long)p);
        uint64_t address = pool->va_base + (p << pool->page_shift);
        if (address < pool->units[u].base || address >= pool->units[u].base + pool->units[u].bytes)
            VMM_FAIL("page %llu outside its unit", (unsigned long long)p);
    }
    for (uint32_t u = 0; u < pool->unit_capacity; u++) {
        const pool_unit *unit = &pool->units[u];
        if (unit->state == UNIT_UNUSED) continue;
        uint64_t live = 0;
        for (uint64_t p = page_of(pool, unit->base), last = page_of(pool, unit->base + unit->bytes - 1); p <= last; p++) {
            if (pool->page_unit[p] != u) VMM_FAIL("unit %u: page %llu mapped elsewhere", u, (unsigned long long)p);
            live += pool->page_refs[p] > 0;
        }
        if (live != unit->live) VMM_FAIL("unit %u: live %llu, counted %llu", u, (unsigned long long)unit->live,
                                         (unsigned long long)live);
        if ((unit->state == UNIT_IDLE) != (live == 0)) VMM_FAIL("unit %u: idle state wrong", u);
    }
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
