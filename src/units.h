/* SPDX-License-Identifier: MIT */
/*
 * units.h -- the pieces of device memory a pool can give back on their
 * own, which of them are idle, and giving them back. Below it: stream order
 * (is the last use of a unit complete?), the range allocator and the device
 * table. Above it: the two backings, the front cache, the ladder and the
 * pool.
 *
 * A unit is a physical page of the VMM reservation (unit index = page
 * index) or
 * a segment (one device allocation, a region of the range allocator; a
 * release frees it and removes its region). A unit with no live block is
 * idle; idle units sit in an LRU list, oldest first, and are what release
 * gives back -- only once the work that last used them has completed.
 * Pages are mapped in chunks (one physical allocation each, of one or more
 * pages: the device's cost is per allocation) and given back only as whole
 * chunks: a page goes only with every page of its chunk, all of them idle
 * and complete; a release unmaps a run of such neighbouring chunks in one
 * call.
 *
 * Invariants (tpi_units_check): idle units are exactly the LRU list, in
 * order of idle_since_ns, and their bytes sum to idle_bytes; reserved bytes
 * (stats) equal the bytes of the units in use or idle; pages: a page is
 * UNUSED iff unmapped, iff its bit in mapped_bits is clear; none at or
 * above page_high is mapped, and every mapped page lies in its chunk, whose
 * pages are all mapped and agree on it.
 *
 * Not thread-safe: the pool's lock is held around every call.
 */
#ifndef TIDEPOOL_UNITS_H
#define TIDEPOOL_UNITS_H

#include "range_alloc.h"
#include "stream_order.h"

#define TPI_UNIT_NONE UINT32_MAX

enum { TPI_UNIT_UNUSED = 0, TPI_UNIT_BUSY = 1, TPI_UNIT_IDLE = 2 };

typedef enum tpi_units_kind { TPI_UNITS_PAGES = 1, TPI_UNITS_SEGMENTS = 2 } tpi_units_kind;

typedef struct tpi_unit {
    uint64_t base;
    uint64_t bytes;
    uint64_t live;            /* pages: live blocks touching it; segments: used nodes */
    uint64_t live_bytes;      /* segments: the bytes of its used nodes */
    tpi_tag tag;              /* merged tags of every free inside the unit */
    uint64_t idle_since_ns;
    uint64_t last_big_use_ns; /* segments: last hand-out of >= 1/4 of it */
    uint32_t lru_prev, lru_next;
    uint32_t idle_node;       /* segments: the free node spanning it while idle */
    uint32_t chunk_first, chunk_pages; /* pages, mapped: its chunk [first, first + pages) */
    uint8_t state;
    bool made_for_moving;  /* segments: grown for a moving buffer's copy (backing_segment.c) */
    uint16_t made_for_bin; /* segments: the size bin of the request it was grown for */
} tpi_unit;

typedef struct tpi_units {
    tpi_units_kind kind;
    tp_device *device;
    const tpi_device_ops *ops;
    const tpi_host *host;
    const tpi_logger *logger;
    tpi_ra *ra;
    tpi_order *order;
    tpi_stats *stats;
    uint64_t release_threshold_bytes;
    uint64_t idle_release_ns;
    uint64_t max_release_bytes; /* pages: most bytes one unmap covers */
    tpi_unit *units;
    size_t count;    /* units in use or idle */
    size_t capacity;
    uint32_t unused_head; /* segments: recycled entries */
    uint32_t lru_head, lru_tail;
    uint64_t idle_bytes;
    uint64_t next_aged_check_ns;
    /* pages */
    uint64_t va_base;
    uint64_t page_bytes;
    uint32_t page_shift;
    uint64_t page_high; /* pages at or above this were never mapped */
    uint64_t *mapped_bits; /* bit p set iff page p is mapped: placement skips unmapped runs a word at a time */
} tpi_units;

typedef struct tpi_units_config {
    tpi_units_kind kind;
    uint64_t release_threshold_bytes;
    uint64_t idle_release_ns;
    uint64_t max_release_bytes;
    uint64_t page_bytes; /* pages */
    uint64_t pages;      /* pages: entries made at init */
} tpi_units_config;

tp_status tpi_units_init(tpi_units *units, const tpi_units_config *config, tp_device *device, tpi_ra *ra,
                         tpi_order *order, tpi_stats *stats);
void tpi_units_destroy(tpi_units *units);

static inline uint64_t tpi_units_now(const tpi_units *units) { return units->ops->now_ns(units->device); }

/* Pages: index and address arithmetic (va_base is set by the owner once
 * the reservation exists). */
static inline uint64_t tpi_page_of(const tpi_units *units, uint64_t address) {
    return (address - units->va_base) >> units->page_shift;
}
static inline uint64_t tpi_page_address(const tpi_units *units, uint64_t page) {
    return units->va_base + (page << units->page_shift);
}
static inline bool tpi_page_mapped(const tpi_units *units, uint64_t page) {
    return units->units[page].state != TPI_UNIT_UNUSED;
}
/* The first mapped page in [from, limit), or limit if none is: so pages
 * [from, result) are all unmapped (pages at or above page_high are). */
static inline uint64_t tpi_units_next_mapped(const tpi_units *units, uint64_t from, uint64_t limit) {
    uint64_t end = TPI_MIN(limit, units->page_high);
    for (uint64_t p = from; p < end;) {
        uint64_t word = units->mapped_bits[p / 64] >> (p % 64);
        if (word) {
            uint64_t found = p + (uint64_t)__builtin_ctzll(word);
            return found < end ? found : limit;
        }
        p = (p / 64 + 1) * 64;
    }
    return limit;
}

/* Segments: a new entry (BUSY, zeroed) or TPI_UNIT_NONE; recycle gives it
 * back. */
uint32_t tpi_units_new(tpi_units *units);
void tpi_units_recycle(tpi_units *units, uint32_t unit);
/* Pages: page [first, last] was just mapped, in chunks of chunk_pages
 * from first (the last one shorter): accounting, idle state. */
void tpi_units_pages_mapped(tpi_units *units, uint64_t first, uint64_t last, uint64_t chunk_pages);

/* The idle list (inline: the segment backing calls these for every block
 * it hands out or takes back, the VMM backing the run versions below once
 * per block, for all of its pages). */
static inline void tpi_units_lru_unlink_(tpi_units *u, uint32_t id) {
    tpi_unit *unit = &u->units[id];
    if (unit->lru_prev != TPI_UNIT_NONE)
        u->units[unit->lru_prev].lru_next = unit->lru_next;
    else
        u->lru_head = unit->lru_next;
    if (unit->lru_next != TPI_UNIT_NONE)
        u->units[unit->lru_next].lru_prev = unit->lru_prev;
    else
        u->lru_tail = unit->lru_prev;
    unit->lru_prev = unit->lru_next = TPI_UNIT_NONE;
    u->idle_bytes -= unit->bytes;
}

static inline void tpi_units_lru_append_(tpi_units *u, uint32_t id, uint64_t now_ns) {
    tpi_unit *unit = &u->units[id];
    unit->idle_since_ns = now_ns;
    unit->lru_prev = u->lru_tail;
    unit->lru_next = TPI_UNIT_NONE;
    if (u->lru_tail != TPI_UNIT_NONE)
        u->units[u->lru_tail].lru_next = id;
    else
        u->lru_head = id;
    u->lru_tail = id;
    u->idle_bytes += unit->bytes;
}

/* A unit whose last block went away, idle since since_ns (0: now; kept in
 * order with the list), or one that holds a block again. */
static inline void tpi_units_became_idle(tpi_units *u, uint32_t id, uint64_t since_ns) {
    u->units[id].state = TPI_UNIT_IDLE;
    if (!since_ns) since_ns = tpi_units_now(u);
    if (u->lru_tail != TPI_UNIT_NONE && u->units[u->lru_tail].idle_since_ns > since_ns)
        since_ns = u->units[u->lru_tail].idle_since_ns; /* keep the list in idle order */
    tpi_units_lru_append_(u, id, since_ns);
}

static inline void tpi_units_became_busy(tpi_units *u, uint32_t id) {
    tpi_units_lru_unlink_(u, id);
    u->units[id].state = TPI_UNIT_BUSY;
}

/* Pages [first, last], a block's, take one more live block each (the
 * block placed on them): the idle ones among them leave the list and are
 * busy. Exactly tpi_units_became_busy page by page; one pass over the run
 * with the list's ends and idle bytes held in locals, where a store into a
 * page's entry could otherwise be the list's end for all the compiler
 * knows (the VMM backing calls this for every block it hands out). Idle
 * pages linked one after the other in page order (a block's pages go idle
 * together, appended in page order: tpi_units_pages_unref) leave the list
 * as one piece, only its two ends' neighbours relinked. */
static inline void tpi_units_pages_ref(tpi_units *u, uint64_t first, uint64_t last) {
    tpi_unit *units = u->units;
    uint32_t head = u->lru_head, tail = u->lru_tail;
    uint64_t idle_bytes = u->idle_bytes;
    for (uint64_t p = first; p <= last; p++) {
        tpi_unit *unit = &units[p];
        if (unit->live++ != 0 || unit->state != TPI_UNIT_IDLE) continue;
        /* The piece [p, q]: each page's successor in the list is the next
         * page (in the list, so idle with no live block). */
        uint32_t prev = unit->lru_prev;
        for (;;) {
            uint32_t next = unit->lru_next;
            unit->lru_prev = unit->lru_next = TPI_UNIT_NONE;
            unit->state = TPI_UNIT_BUSY;
            idle_bytes -= unit->bytes;
            if (p == last || next != p + 1) {
                if (prev != TPI_UNIT_NONE) units[prev].lru_next = next;
                else head = next;
                if (next != TPI_UNIT_NONE) units[next].lru_prev = prev;
                else tail = prev;
                break;
            }
            unit = &units[++p];
            unit->live = 1;
        }
    }
    u->lru_head = head;
    u->lru_tail = tail;
    u->idle_bytes = idle_bytes;
}

/* A page's tag unit_tag with tag (a free inside the page) merged in, for
 * the pages of one block in turn: the merge is made again only when
 * unit_tag differs from the one before (*from, whose merge is *merged;
 * both start at tag, as merge(tag, tag) == tag): a block's pages mostly
 * carry the same tag. */
static inline tpi_tag tpi_units_merged_tag_(const tpi_units *u, tpi_tag unit_tag, tpi_tag tag, tpi_tag *from,
                                            tpi_tag *merged) {
    if (unit_tag != *from) {
        *from = unit_tag;
        *merged = tpi_order_merge(u->order, unit_tag, tag);
    }
    return *merged;
}

/* Pages [first, last] of a block that stays live take tag (a free inside
 * them) into their own, as tpi_units_pages_unref does; their live counts
 * and idle state are unchanged. Stops, false, at the first page whose
 * merged tag is neither clean nor slot's own (the pages before it
 * merged). */
static inline bool tpi_units_pages_merge_tag(tpi_units *u, uint64_t first, uint64_t last, tpi_tag tag,
                                             uint32_t slot) {
    tpi_tag from = tag, merged = tag;
    for (uint64_t p = first; p <= last; p++) {
        tpi_unit *unit = &u->units[p];
        if (unit->state == TPI_UNIT_UNUSED) continue;
        tpi_tag now = tpi_units_merged_tag_(u, unit->tag, tag, &from, &merged);
        if (!tpi_order_tag_own(now, slot)) return false;
        unit->tag = now;
    }
    return true;
}

/* Pages [first, last], a block's, lose that live block, freed with tag:
 * every mapped one merges tag into its own, and those left with no live
 * block become idle at since_ns (0: now, the clock read once, at the
 * first), appended to the list in page order. Exactly the merge and
 * tpi_units_became_idle page by page, in one pass as above (the merge
 * through tpi_units_merged_tag_). Once a page has gone idle, the pages
 * after it that go idle too (the block's alone: busy with one live block)
 * are appended in an inner loop that links each to the one before it. */
static inline void tpi_units_pages_unref(tpi_units *u, uint64_t first, uint64_t last, tpi_tag tag,
                                         uint64_t since_ns) {
    tpi_unit *units = u->units;
    uint32_t head = u->lru_head, tail = u->lru_tail;
    uint64_t idle_bytes = u->idle_bytes;
    bool since_known = false;
    tpi_tag from = tag, merged = tag;
    for (uint64_t p = first; p <= last; p++) {
        tpi_unit *unit = &units[p];
        if (unit->state != TPI_UNIT_UNUSED) unit->tag = tpi_units_merged_tag_(u, unit->tag, tag, &from, &merged);
        if (--unit->live != 0 || unit->state != TPI_UNIT_BUSY) continue;
        if (!since_known) {
            if (!since_ns) since_ns = tpi_units_now(u);
            /* keep the list in idle order */
            if (tail != TPI_UNIT_NONE && units[tail].idle_since_ns > since_ns) since_ns = units[tail].idle_since_ns;
            since_known = true;
        }
        unit->state = TPI_UNIT_IDLE;
        unit->idle_since_ns = since_ns;
        unit->lru_prev = tail;
        if (tail != TPI_UNIT_NONE) units[tail].lru_next = (uint32_t)p;
        else head = (uint32_t)p;
        idle_bytes += unit->bytes;
        /* The next pages while they go idle as well: each after p. */
        for (; p < last && unit[1].state == TPI_UNIT_BUSY && unit[1].live == 1; p++) {
            tpi_unit *next = unit + 1;
            next->tag = tpi_units_merged_tag_(u, next->tag, tag, &from, &merged);
            next->live = 0;
            next->state = TPI_UNIT_IDLE;
            next->idle_since_ns = since_ns;
            next->lru_prev = (uint32_t)p;
            unit->lru_next = (uint32_t)p + 1;
            idle_bytes += next->bytes;
            unit = next;
        }
        unit->lru_next = TPI_UNIT_NONE;
        tail = (uint32_t)p;
    }
    u->lru_head = head;
    u->lru_tail = tail;
    u->idle_bytes = idle_bytes;
}

/* Releases idle units, oldest first, until want_bytes are released or idle
 * bytes are down to keep_bytes; blocking waits for their last use.
 * min_idle_ns > 0 skips units idle for less. Returns the bytes released. */
uint64_t tpi_units_release_idle(tpi_units *units, uint64_t want_bytes, bool blocking, uint64_t min_idle_ns,
                                uint64_t keep_bytes);
/* Non-blocking: completed idle units idle at least min_idle_ns go, oldest
 * first, until reserved bytes are at most target. */
void tpi_units_release_idle_down_to(tpi_units *units, uint64_t target_reserved_bytes, uint64_t min_idle_ns);
/* Before growing by grow_bytes: completed idle units go, the large ones
 * first, while idle + grow_bytes exceeds the release threshold. */
void tpi_units_release_before_growth(tpi_units *units, uint64_t grow_bytes);
/* Growth past the high-water mark with idle units whose last use is still
 * queued on the growing stream itself (a host that runs ahead of the
 * device): those go back, oldest first, after waiting for that stream's
 * older work -- which the new memory's first use waits for anyway -- until
 * want_bytes are released. Never waits for another stream. */
uint64_t tpi_units_release_own_stream(tpi_units *units, uint32_t slot, uint64_t want_bytes);
/* Cold memory (idle longer than idle_release_ns) beyond the release
 * threshold goes back, oldest first; rate-limited unless forced. */
void tpi_units_release_aged(tpi_units *units, bool force);

bool tpi_units_check(const tpi_units *units, char *msg, size_t msg_capacity);

#endif /* TIDEPOOL_UNITS_H */
