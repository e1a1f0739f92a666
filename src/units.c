/* SPDX-License-Identifier: MIT */
/*
 * units.c -- the unit table, the idle LRU list and giving idle units back;
 * see units.h.
 *
 * Release policy (shared by both pool kinds)
 *   - before growing (segments): idle units go while idle + growth would
 *     pass the release threshold; units of at least 1/8 of the growth
 *     first, since they are what the growth replaces;
 *   - aged: memory idle longer than idle_release_ns beyond the threshold
 *     goes back (only cold memory counts against the threshold: between
 *     the steps of a workload all its memory is idle for a moment, and that
 *     working set is not a cache to trim);
 *   - under pressure and on trim: as much as asked, oldest first, waiting
 *     for the last use where the caller allows.
 * A unit goes back only once the work that last used it has completed,
 * and never while one of the pool's streams is capturing a graph.
 */
#include "units.h"

#include <stdio.h>
#include <string.h>

static size_t mapped_words(size_t pages) { return (pages + 63) / 64; }

/* Sets (value true) or clears bits [first, last] of mapped_bits. */
static void mapped_bits_set(tpi_units *u, uint64_t first, uint64_t last, bool value) {
    for (uint64_t p = first; p <= last;) {
        uint64_t bit = p % 64, n = TPI_MIN(64 - bit, last + 1 - p);
        uint64_t mask = (n == 64 ? ~0ull : ((1ull << n) - 1)) << bit;
        if (value)
            u->mapped_bits[p / 64] |= mask;
        else
            u->mapped_bits[p / 64] &= ~mask;
        p += n;
    }
}

tp_status tpi_units_init(tpi_units *u, const tpi_units_config *config, tp_device *device, tpi_ra *ra,
                         tpi_order *order, tpi_stats *stats) {
    memset(u, 0, sizeof *u);
    u->kind = config->kind;
    u->device = device;
    u->ops = device->ops;
    u->host = &device->host;
    u->logger = &device->logger;
    u->ra = ra;
    u->order = order;
    u->stats = stats;
    u->release_threshold_bytes = config->release_threshold_bytes;
    u->idle_release_ns = config->idle_release_ns;
    u->max_release_bytes = config->max_release_bytes;
    u->unused_head = TPI_UNIT_NONE;
    u->lru_head = u->lru_tail = TPI_UNIT_NONE;
    if (u->kind == TPI_UNITS_PAGES) {
        u->page_bytes = config->page_bytes;
        u->page_shift = (uint32_t)__builtin_ctzll(config->page_bytes);
        if (config->pages >= TPI_UNIT_NONE) return TP_ERR_INVALID_ARGUMENT;
        /* Zeroed lazily by the host allocator: untouched pages cost nothing. */
        u->units = tpi_host_calloc(u->host, config->pages, sizeof *u->units);
        if (!u->units) return TP_ERR_HOST_OUT_OF_MEMORY;
        u->capacity = config->pages;
        u->mapped_bits = tpi_host_calloc(u->host, mapped_words(u->capacity), sizeof *u->mapped_bits);
        if (!u->mapped_bits) {
            tpi_units_destroy(u);
            return TP_ERR_HOST_OUT_OF_MEMORY;
        }
    }
    return TP_OK;
}

void tpi_units_destroy(tpi_units *u) {
    tpi_host_free(u->host, u->mapped_bits, mapped_words(u->capacity) * sizeof *u->mapped_bits);
    u->mapped_bits = NULL;
    tpi_host_free(u->host, u->units, u->capacity * sizeof *u->units);
    u->units = NULL;
    u->capacity = 0;
}

/* ------------------------------------------------------------- the table */

uint32_t tpi_units_new(tpi_units *u) {
    if (u->unused_head == TPI_UNIT_NONE) {
        size_t old = u->capacity;
        if (!tpi_host_grow(u->host, (void **)&u->units, sizeof *u->units, &u->capacity, old + 1)) return TPI_UNIT_NONE;
        for (size_t i = u->capacity; i-- > old;) {
            u->units[i].state = TPI_UNIT_UNUSED;
            u->units[i].lru_next = u->unused_head;
            u->unused_head = (uint32_t)i;
        }
    }
    uint32_t id = u->unused_head;
    u->unused_head = u->units[id].lru_next;
    memset(&u->units[id], 0, sizeof u->units[id]);
    u->units[id].lru_prev = u->units[id].lru_next = TPI_UNIT_NONE;
    u->units[id].idle_node = TPI_RA_NONE;
    u->units[id].state = TPI_UNIT_BUSY;
    u->count++;
    return id;
}

void tpi_units_recycle(tpi_units *u, uint32_t id) {
    u->units[id].state = TPI_UNIT_UNUSED;
    u->units[id].lru_next = u->unused_head;
    u->unused_head = id;
    u->count--;
}

/* --------------------------------------------------------- the idle list */

void tpi_units_pages_mapped(tpi_units *u, uint64_t first, uint64_t last, uint64_t chunk_pages) {
    for (uint64_t p = first; p <= last; p++) {
        tpi_unit *unit = &u->units[p];
        unit->chunk_first = (uint32_t)(first + (p - first) / chunk_pages * chunk_pages);
        unit->chunk_pages = (uint32_t)TPI_MIN(chunk_pages, last + 1 - unit->chunk_first);
        unit->base = tpi_page_address(u, p);
        unit->bytes = u->page_bytes;
        unit->tag = TPI_TAG_CLEAN;
        unit->lru_prev = unit->lru_next = TPI_UNIT_NONE;
        u->count++;
        if (unit->live)
            unit->state = TPI_UNIT_BUSY;
        else
            tpi_units_became_idle(u, (uint32_t)p, 0);
    }
    mapped_bits_set(u, first, last, true);
    if (last + 1 > u->page_high) u->page_high = last + 1;
    uint64_t bytes = (last - first + 1) << u->page_shift;
    tpi_stats_reserved_changed(u->stats, (int64_t)bytes);
    tpi_observe(u->stats, TP_POOL_EVENT_DEVICE_ALLOC, tpi_page_address(u, first), bytes, TP_STREAM_DEFAULT);
}

/* --------------------------------------------------------------- release */

/* May page p join an unmap run: idle, idle since idle_before_ns at the
 * latest, its work complete (waited for when blocking)? */
static bool page_joins_release(tpi_units *u, uint64_t p, uint64_t idle_before_ns, bool blocking) {
    tpi_unit *unit = &u->units[p];
    if (unit->state != TPI_UNIT_IDLE || unit->idle_since_ns > idle_before_ns) return false;
    return tpi_order_tag_complete(u->order, unit->tag) ||
           (blocking && tpi_order_tag_wait(u->order, unit->tag) == TP_OK);
}

/* May the whole chunk [first, first + pages) join, page skip excepted? */
static bool chunk_joins_release(tpi_units *u, uint64_t first, uint64_t pages, uint64_t skip,
                                uint64_t idle_before_ns, bool blocking) {
    for (uint64_t p = first; p < first + pages; p++)
        if (p != skip && !page_joins_release(u, p, idle_before_ns, blocking)) return false;
    return true;
}

static void lru_unlink_chunk(tpi_units *u, uint64_t first, uint64_t pages, uint64_t skip) {
    for (uint64_t p = first; p < first + pages; p++)
        if (p != skip) tpi_units_lru_unlink_(u, (uint32_t)p);
}

/* Unmaps page id's chunk (id already off the idle list; the chunk's other
 * pages may join: the caller checked) with the idle, completed
 * neighbouring chunks idle since idle_before_ns at the latest, in one call
 * of at most max_bytes (or the one chunk, if larger). */
static tp_status release_pages(tpi_units *u, uint32_t id, uint64_t idle_before_ns, uint64_t max_bytes) {
    uint64_t max_run = TPI_MAX(TPI_MIN(u->max_release_bytes, max_bytes) >> u->page_shift, 1);
    uint64_t first = u->units[id].chunk_first, last = first + u->units[id].chunk_pages - 1;
    lru_unlink_chunk(u, first, last - first + 1, id);
    while (first > 0 && tpi_page_mapped(u, first - 1)) {
        const tpi_unit *before = &u->units[first - 1];
        if (last + 1 - before->chunk_first > max_run ||
            !chunk_joins_release(u, before->chunk_first, before->chunk_pages, UINT64_MAX, idle_before_ns, false))
            break;
        first = before->chunk_first;
        lru_unlink_chunk(u, first, before->chunk_pages, UINT64_MAX);
    }
    while (last + 1 < u->page_high && tpi_page_mapped(u, last + 1)) {
        const tpi_unit *after = &u->units[last + 1];
        if (last + after->chunk_pages + 1 - first > max_run ||
            !chunk_joins_release(u, last + 1, after->chunk_pages, UINT64_MAX, idle_before_ns, false))
            break;
        lru_unlink_chunk(u, last + 1, after->chunk_pages, UINT64_MAX);
        last += after->chunk_pages;
    }
    uint64_t bytes = (last - first + 1) << u->page_shift;
    tp_status st = u->ops->unmap(u->device, tpi_page_address(u, first), bytes);
    tpi_stats_device_call(u->stats, st, TPI_DEVICE_CALL_FREE);
    if (st != TP_OK) {
        /* Keep them all; id goes back to the idle list in the caller. */
        uint64_t now = tpi_units_now(u);
        for (uint64_t p = first; p <= last; p++)
            if (p != id) tpi_units_lru_append_(u, (uint32_t)p, now);
        return st;
    }
    for (uint64_t p = first; p <= last; p++) {
        u->units[p].state = TPI_UNIT_UNUSED;
        u->units[p].tag = TPI_TAG_CLEAN;
        u->count--;
    }
    mapped_bits_set(u, first, last, false);
    tpi_stats_reserved_changed(u->stats, -(int64_t)bytes);
    tpi_observe(u->stats, TP_POOL_EVENT_DEVICE_FREE, tpi_page_address(u, first), bytes, TP_STREAM_DEFAULT);
    return TP_OK;
}

/* Frees segment id (already off the idle list) and removes its region. */
static tp_status release_segment(tpi_units *u, uint32_t id) {
    tpi_unit *unit = &u->units[id];
    tp_status st = u->ops->mem_free(u->device, unit->base, unit->bytes);
    tpi_stats_device_call(u->stats, st, TPI_DEVICE_CALL_FREE);
    if (st != TP_OK) return st;
    tpi_ra_remove_region(u->ra, unit->idle_node);
    tpi_stats_reserved_changed(u->stats, -(int64_t)unit->bytes);
    tpi_observe(u->stats, TP_POOL_EVENT_DEVICE_FREE, unit->base, unit->bytes, TP_STREAM_DEFAULT);
    tpi_units_recycle(u, id);
    return TP_OK;
}

/* Gives one idle unit back if its last use has completed (waiting for it
 * when blocking); page neighbours idle since idle_before_ns may go along,
 * up to max_bytes in all. */
static tp_status release_unit(tpi_units *u, uint32_t id, bool blocking, uint64_t idle_before_ns, uint64_t max_bytes) {
    tpi_unit *unit = &u->units[id];
    /* During a capture the device is not asked to free or unmap anything:
     * such calls may synchronise, which a capture does not survive. */
    if (u->order->captures) return TP_ERR_CAPTURE;
    if (!tpi_order_tag_complete(u->order, unit->tag)) {
        if (!blocking) return TP_NOT_READY;
        tp_status st = tpi_order_tag_wait(u->order, unit->tag);
        if (st != TP_OK) return st;
    }
    /* A page goes only with the rest of its chunk. */
    if (u->kind == TPI_UNITS_PAGES &&
        !chunk_joins_release(u, unit->chunk_first, unit->chunk_pages, id, idle_before_ns, blocking))
        return TP_NOT_READY;
    unit->tag = TPI_TAG_CLEAN;
    uint64_t bytes = unit->bytes;
    tpi_units_lru_unlink_(u, id);
    tp_status st = u->kind == TPI_UNITS_PAGES ? release_pages(u, id, idle_before_ns, max_bytes) : release_segment(u, id);
    if (st != TP_OK) {
        tpi_logf(u->logger, TP_LOG_WARN, "pool: giving %llu bytes back to the device failed: %s",
                (unsigned long long)bytes, tp_status_name(st));
        tpi_units_lru_append_(u, id, tpi_units_now(u)); /* keep it; try again later */
    }
    return st;
}

uint64_t tpi_units_release_idle(tpi_units *u, uint64_t want_bytes, bool blocking, uint64_t min_idle_ns,
                                uint64_t keep_bytes) {
    uint64_t released = 0;
    uint64_t now = min_idle_ns ? tpi_units_now(u) : 0;
    size_t budget = u->count;
    for (uint32_t id = u->lru_head; id != TPI_UNIT_NONE && budget-- > 0;) {
        if (released >= want_bytes || u->idle_bytes <= keep_bytes) break;
        uint32_t next = u->units[id].lru_next;
        if (min_idle_ns && now - u->units[id].idle_since_ns < min_idle_ns) break;
        uint64_t reserved = u->stats->pub.reserved_bytes.current;
        uint64_t excess = u->idle_bytes - keep_bytes;
        release_unit(u, id, blocking, min_idle_ns ? now - min_idle_ns : UINT64_MAX,
                     TPI_MIN(want_bytes - released, excess));
        released += reserved - u->stats->pub.reserved_bytes.current;
        /* Neighbouring pages may have gone along, next among them. */
        if (next != TPI_UNIT_NONE && u->units[next].state != TPI_UNIT_IDLE) next = u->lru_head;
        id = next;
    }
    return released;
}

void tpi_units_release_idle_down_to(tpi_units *u, uint64_t target_reserved_bytes, uint64_t min_idle_ns) {
    uint64_t reserved = u->stats->pub.reserved_bytes.current;
    if (reserved > target_reserved_bytes)
        tpi_units_release_idle(u, reserved - target_reserved_bytes, false, min_idle_ns, 0);
}

void tpi_units_release_before_growth(tpi_units *u, uint64_t grow_bytes) {
    uint64_t threshold = u->release_threshold_bytes;
    if (threshold == TP_BYTES_UNLIMITED || u->idle_bytes + grow_bytes <= threshold) return;
    uint64_t keep = threshold > grow_bytes ? threshold - grow_bytes : 0;
    /* Units of at least 1/8 of the growth first: they are what the growth
     * replaces, and each call returns a lot. Small ones (the small-block
     * segments a workload reuses every step) go only if that was not
     * enough. Completed ones only, oldest first within each pass. */
    uint64_t min_bytes = grow_bytes / 8;
    size_t budget = u->count;
    for (uint32_t id = u->lru_head; id != TPI_UNIT_NONE && budget-- > 0 && u->idle_bytes > keep;) {
        uint32_t next = u->units[id].lru_next;
        if (u->units[id].bytes >= min_bytes) release_unit(u, id, false, UINT64_MAX, u->idle_bytes - keep);
        if (next != TPI_UNIT_NONE && u->units[next].state != TPI_UNIT_IDLE) next = u->lru_head;
        id = next;
    }
    tpi_units_release_idle(u, UINT64_MAX, false, 0, keep);
}

uint64_t tpi_units_release_own_stream(tpi_units *u, uint32_t slot, uint64_t want_bytes) {
    uint64_t released = 0;
    size_t budget = u->count;
    for (uint32_t id = u->lru_head; id != TPI_UNIT_NONE && budget-- > 0 && released < want_bytes;) {
        uint32_t next = u->units[id].lru_next;
        tpi_tag tag = u->units[id].tag;
        bool own = tpi_order_tag_own(tag, slot);
        if (own || tpi_order_tag_complete(u->order, tag)) {
            uint64_t reserved = u->stats->pub.reserved_bytes.current;
            release_unit(u, id, own, UINT64_MAX, want_bytes - released);
            released += reserved - u->stats->pub.reserved_bytes.current;
        }
        if (next != TPI_UNIT_NONE && u->units[next].state != TPI_UNIT_IDLE) next = u->lru_head;
        id = next;
    }
    return released;
}

void tpi_units_release_aged(tpi_units *u, bool force) {
    uint64_t delay = u->idle_release_ns;
    uint64_t threshold = u->release_threshold_bytes;
    if (delay == TP_NS_NEVER || u->idle_bytes <= threshold) return;
    uint64_t now = tpi_units_now(u);
    if (!force && now < u->next_aged_check_ns) return;
    uint64_t cold = 0;
    for (uint32_t id = u->lru_head; id != TPI_UNIT_NONE && now - u->units[id].idle_since_ns >= delay;
         id = u->units[id].lru_next)
        cold += u->units[id].bytes;
    if (cold > threshold) tpi_units_release_idle(u, cold - threshold, false, delay, 0);
    uint32_t head = u->lru_head;
    if (head != TPI_UNIT_NONE && now - u->units[head].idle_since_ns < delay)
        u->next_aged_check_ns = u->units[head].idle_since_ns + delay;
    else
        u->next_aged_check_ns = now + TPI_MAX(delay / 16, 1);
}

/* ----------------------------------------------------------------- check */

bool tpi_units_check(const tpi_units *u, char *msg, size_t msg_capacity) {
    uint64_t idle = 0, reserved = 0, listed = 0, in_use = 0;
    for (size_t i = 0; i < u->capacity; i++) {
        const tpi_unit *unit = &u->units[i];
        if (u->kind == TPI_UNITS_PAGES &&
            ((u->mapped_bits[i / 64] >> (i % 64)) & 1) != (unit->state != TPI_UNIT_UNUSED))
            TPI_FAIL(msg, msg_capacity, "page %zu's mapped bit disagrees with its state", i);
        if (unit->state == TPI_UNIT_UNUSED) continue;
        in_use++;
        reserved += unit->bytes;
        if (unit->state == TPI_UNIT_IDLE) idle += unit->bytes;
        if (u->kind == TPI_UNITS_PAGES && i >= u->page_high)
            TPI_FAIL(msg, msg_capacity, "page %zu mapped above the high-water mark", i);
        if (u->kind == TPI_UNITS_PAGES) {
            uint64_t first = unit->chunk_first, pages = unit->chunk_pages;
            if (pages == 0 || i < first || i >= first + pages || first + pages > u->page_high)
                TPI_FAIL(msg, msg_capacity, "page %zu outside its chunk", i);
            for (uint64_t p = first; p < first + pages; p++)
                if (u->units[p].state == TPI_UNIT_UNUSED || u->units[p].chunk_first != first ||
                    u->units[p].chunk_pages != pages)
                    TPI_FAIL(msg, msg_capacity, "chunk of page %zu not whole", i);
        }
    }
    for (uint32_t id = u->lru_head, prev = TPI_UNIT_NONE; id != TPI_UNIT_NONE; prev = id, id = u->units[id].lru_next) {
        if (u->units[id].state != TPI_UNIT_IDLE) TPI_FAIL(msg, msg_capacity, "unit %u in the idle list is not idle", id);
        if (u->units[id].lru_prev != prev) TPI_FAIL(msg, msg_capacity, "idle list back link broken at %u", id);
        if (prev != TPI_UNIT_NONE && u->units[prev].idle_since_ns > u->units[id].idle_since_ns)
            TPI_FAIL(msg, msg_capacity, "idle list out of age order at %u", id);
        listed += u->units[id].bytes;
        if (listed > reserved) TPI_FAIL(msg, msg_capacity, "idle list longer than the units");
    }
    if (idle != u->idle_bytes || listed != idle) TPI_FAIL(msg, msg_capacity, "idle bytes disagree");
    if (in_use != u->count) TPI_FAIL(msg, msg_capacity, "%llu units in use, count %zu", (unsigned long long)in_use, u->count);
    if (reserved != u->stats->pub.reserved_bytes.current)
        TPI_FAIL(msg, msg_capacity, "reserved bytes disagree with units");
    return true;
}
