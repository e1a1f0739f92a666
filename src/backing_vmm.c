/* SPDX-License-Identifier: MIT */
/*
 * backing_vmm.c -- the VMM backing: one address reservation made at creation,
 * physical pages mapped on demand and unmapped when idle.
 *
 * Algorithm: the range allocator manages the whole reservation, so any free
 * order works and a block may span any number of pages. Every page is a
 * unit of its own (units[p] for page p): it counts the live blocks touching
 * it, and with none it is idle and may be unmapped, with the rest of its
 * chunk, once the work that last used the chunk has completed. A block
 * goes to the first window, in good-fit order, whose pages are mapped and
 * usable on the stream (place_window); the pages it touches that are not
 * mapped are then mapped in runs, one
 * device call per run, each run backed by chunks (physical allocations) of
 * about 1/8 of it (chunk_pages_for: the driver's cost is per allocation; a
 * chunk unmaps only whole, which units.c sees to). Growth maps a look-ahead
 * after the block (lookahead_pages) so growing requests cost O(log n) calls,
 * and first unmaps idle pages when the pool would pass its soft or hard cap
 * (cap_with_headroom), or set a new peak of held memory past the peak cap.
 * The last-freed block, asked for again in another size on its stream, is
 * resized where it is (vmm_resize_block) when a release and this placement
 * would put it there anyway: the same ranges, pages and tags, without the
 * release, search and take.
 * Idle pages go back through units.c, chunk by chunk, which takes idle,
 * completed neighbouring chunks of the same age along into one unmap call.
 *
 * Invariants (vmm_check, with tpi_units_check): units[p].live equals the
 * number of used nodes overlapping page p; a page is UNUSED iff unmapped,
 * IDLE iff mapped with no live block, else BUSY; the mapped pages are the
 * units counted and reserved bytes are theirs; no page at or above
 * page_high is mapped.
 */
#include "pool_core.h"

#include <string.h>

typedef struct vmm_backing {
    tpi_backing base;
    uint64_t va_bytes;       /* the reservation */
    uint32_t growth_streak;  /* growths with no free in between */
    uint64_t frees_at_growth; /* stats.frees at the latest growth */
} vmm_backing;

static const tpi_backing_ops vmm_ops;

static void ref_pages(tpi_units *units, uint64_t offset, uint64_t size) {
    tpi_units_pages_ref(units, tpi_page_of(units, offset), tpi_page_of(units, offset + size - 1));
}

static void unref_pages(tpi_core *core, uint64_t offset, uint64_t size, tpi_tag tag, uint64_t idle_since_ns) {
    tpi_units *units = &core->units;
    tpi_units_pages_unref(units, tpi_page_of(units, offset), tpi_page_of(units, offset + size - 1), tag,
                          idle_since_ns);
}

static void vmm_release_block(tpi_backing *b, uint32_t node, uint64_t idle_since_ns) {
    tpi_core *core = b->core;
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    uint64_t offset = n->offset, size = n->size;
    tpi_tag tag = n->owner;
    tpi_ra_release(&core->ra, node);
    unref_pages(core, offset, size, tag, idle_since_ns);
}

/* The release of node and a new placement of size at its start, in one
 * step where the placement is known: the range allocator finds first the
 * range the release leaves at node's start (tpi_ra_release_lands_in_place),
 * and place_window takes the window there at once -- its pages are mapped
 * and each carries no tag or slot's own, the free's tag merged into the
 * block's (a page unmapped, or with a tag that needs a question to the
 * device, leaves the answer to the full path). The pages the block keeps
 * take the tag; those past a smaller block's end lose it, those past a
 * larger one's old end become busy. */
static bool vmm_resize_block(tpi_backing *b, uint32_t node, uint64_t size, tpi_tag tag, uint32_t slot,
                             uint64_t idle_since_ns) {
    tpi_core *core = b->core;
    tpi_units *units = &core->units;
    if (!tpi_ra_release_lands_in_place(&core->ra, node, size)) return false;
    const tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    uint64_t offset = n->offset;
    uint64_t first = tpi_page_of(units, offset), old_last = tpi_page_of(units, offset + n->size - 1),
             last = tpi_page_of(units, offset + size - 1);
    for (uint64_t p = old_last + 1; p <= last; p++) { /* a larger block's new pages */
        const tpi_unit *unit = &units->units[p];
        if (p >= units->page_high || unit->state == TPI_UNIT_UNUSED || !tpi_order_tag_own(unit->tag, slot))
            return false;
    }
    if (!tpi_ra_reserve_nodes(&core->ra, 1)) return false;
    /* The tag into the pages the block keeps (a page that fails the test
     * keeps it too: the full path merges the same tag in again, which
     * changes nothing). */
    if (!tpi_units_pages_merge_tag(units, first, TPI_MIN(last, old_last), tag, slot)) return false;
    tpi_ra_resize(&core->ra, node, size, tag); /* (cannot fail: a node is reserved) */
    if (last > old_last) tpi_units_pages_ref(units, old_last + 1, last);
    if (last < old_last) tpi_units_pages_unref(units, last + 1, old_last, tag, idle_since_ns);
    return true;
}

/* The most bytes ever allocated at once. */
static uint64_t high_water(const tpi_core *core) {
    return TPI_MAX(core->stats.pub.allocated_bytes.peak, core->stats.high_water_allocated);
}

/* The most bytes the pool ever held at once. */
static uint64_t held_high_water(const tpi_core *core) {
    return TPI_MAX(core->stats.pub.reserved_bytes.peak, core->stats.high_water_reserved);
}

/* Chunk size, in pages, for a run of run_pages mapped in one call: about
 * 1/8 of the run (a power of two), at most max_chunk_bytes and at most
 * 1/32 of the high-water mark, at least one page. The driver's cost is per
 * chunk, so a large growth costs few calls into it; but a chunk goes back
 * only whole, so chunks stay small against the run (a run is mapped for
 * one block and its look-ahead: its pages are busy and idle together more
 * often than not) and against the pool (what one live page can keep
 * mapped stays a small share of it). */
static uint64_t chunk_pages_for(const tpi_core *core, uint64_t run_pages) {
    const tpi_units *units = &core->units;
    uint64_t cap = TPI_MIN(core->config.max_chunk_bytes, high_water(core) / 32) >> units->page_shift;
    uint64_t want = TPI_MIN(run_pages / 8, cap);
    return want > 1 ? 1ull << (63 - __builtin_clzll(want)) : 1;
}

/* Maps pages [first, last] in one call. */
static tp_status map_run(tpi_core *core, uint64_t first, uint64_t last) {
    tpi_units *units = &core->units;
    uint64_t pages = last - first + 1, chunk_pages = chunk_pages_for(core, pages);
    tp_status st = core->ops->map(core->device, tpi_page_address(units, first), pages << units->page_shift,
                                  chunk_pages << units->page_shift);
    tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_ALLOC);
    if (st == TP_OK) tpi_units_pages_mapped(units, first, last, chunk_pages);
    return st;
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
 * pool runs below its high-water mark and tight when it reaches a new one.
 * The look-ahead (below) stays under the hard cap too: mapped past it, it
 * was what a pool whose buffers move held above its peak (1.12x on
 * spec-decode, up to 1.21x on phases; 1.06x with it kept under). And while
 * the pool grows back below its high-water mark, under the soft cap
 * (training, its activations freed and made again every step: 1.063x with
 * the hard cap, 1.020x with the soft).
 *
 * The held high-water mark moves only for live memory. Below the most the
 * pool has ever held, the caps above trade driver calls for cache. Past it,
 * the pool would be setting a new peak of device memory -- the figure that
 * decides whether a long-running server and its neighbours fit -- so it
 * grows no further than the peak cap (1/PEAK_HEADROOM_DIV above the
 * allocated high-water mark) for the sake of idle pages, fresh ones
 * included, or of its look-ahead: idle pages go back first and the
 * look-ahead stops at that line. Without it the pool's peak carried what
 * the last growth had mapped ahead or kept idle: a streak of growths
 * stopped by the hard cap (weights loading: 1.043x on moe, 1.031x on
 * oom-reclaim, against expandable segments' 1.018x and 1.002x), the
 * look-ahead of the largest request of a rotation (size-rotation 1.040x),
 * fresh idle pages of a step that set a new peak (spec-decode 1.063x ->
 * 1.016x). The price is driver calls where the live peak creeps up a
 * little at a time (about 3.5x on batched-serving): docs/results.md,
 * "The held high-water mark". */
#define SOFT_HEADROOM_DIV 128
#define PEAK_HEADROOM_DIV 64
#define HARD_HEADROOM_DIV 16
#define VMM_CAP_RELEASE_MIN_IDLE_NS 100000000ull


/* max(high water + high water / div + 2 pages, what the pool needs now) */
static uint64_t cap_with_headroom(const tpi_core *core, uint64_t div, uint64_t missing_bytes) {
    uint64_t high = high_water(core);
    uint64_t floor = core->stats.pub.reserved_bytes.current - core->units.idle_bytes + missing_bytes;
    return TPI_MAX(high + high / div + 2 * core->units.page_bytes, floor);
}

/* Look-ahead: while the pool only grows (a streak of growths with no free
 * in between, like weights being loaded) it doubles with each growth, up to
 * 1/8 of what the pool holds. Otherwise it is 1/16 of the transient part of
 * the high-water mark: the peak allocated bytes minus the lowest allocated
 * bytes seen since the previous growth. A workload whose temporaries grow
 * step by step (failure mode 1 in docs/failure-modes.md) thus grows
 * geometrically, in O(log n) calls, while a model whose weights dominate
 * (decode with a growing KV cache) maps little ahead beyond its long-lived
 * memory. */
static uint64_t lookahead_pages(const vmm_backing *vmm) {
    const tpi_core *core = vmm->base.core;
    uint64_t page_bytes = core->units.page_bytes;
    uint64_t reserved = core->stats.pub.reserved_bytes.current;
    uint64_t target = 2 * page_bytes;
    if (vmm->growth_streak > 1) {
        uint32_t doublings = TPI_MIN(vmm->growth_streak - 1, 20u);
        target = TPI_MAX(target, TPI_MIN(page_bytes << doublings, reserved / 8));
    } else {
        uint64_t high = high_water(core);
        uint64_t low = TPI_MIN(core->stats.allocated_low_water, high);
        target = TPI_MAX(target, (high - low) / 16);
    }
    return TPI_MIN(target, core->config.max_map_bytes) >> core->units.page_shift;
}

/* Maps the pages block id touches that are not mapped, plus a look-ahead of
 * free unmapped pages after it. */
static tp_status map_block(vmm_backing *vmm, uint32_t id, uint64_t *out_need) {
    tpi_core *core = vmm->base.core;
    tpi_units *units = &core->units;
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
    uint64_t first = tpi_page_of(units, n->offset), last = tpi_page_of(units, n->offset + n->size - 1);
    uint64_t missing_pages = 0;
    for (uint64_t p = first; p <= last; p++) missing_pages += !tpi_page_mapped(units, p);
    if (!missing_pages) return TP_OK;
    uint64_t missing = missing_pages << units->page_shift;

    if (core->stats.pub.frees != vmm->frees_at_growth) {
        vmm->growth_streak = 0; /* a free since the previous growth */
        vmm->frees_at_growth = core->stats.pub.frees;
    }
    vmm->growth_streak++;
    uint64_t cap = cap_with_headroom(core, SOFT_HEADROOM_DIV, missing);
    /* Look-ahead: unmapped pages wholly inside the free range after the block. */
    uint64_t extra = 0, want = lookahead_pages(vmm);
    core->stats.allocated_low_water = core->stats.pub.allocated_bytes.current;
    if (want && n->addr_next != TPI_RA_NONE && tpi_ra_node_at(&core->ra, n->addr_next)->state == TPI_RA_NODE_FREE) {
        const tpi_ra_node *rest = tpi_ra_node_at(&core->ra, n->addr_next);
        uint64_t end_page = tpi_page_of(units, rest->offset + rest->size); /* first page not wholly free */
        for (uint64_t p = last + 1; p < end_page && extra < want && !tpi_page_mapped(units, p); p++) extra++;
    }
    /* None after it (a block placed at the end of its range): unmapped
     * pages wholly inside the free range before it instead. */
    uint64_t extra_before = 0;
    if (want && !extra && n->addr_prev != TPI_RA_NONE &&
        tpi_ra_node_at(&core->ra, n->addr_prev)->state == TPI_RA_NODE_FREE) {
        const tpi_ra_node *before = tpi_ra_node_at(&core->ra, n->addr_prev);
        uint64_t start_page = tpi_page_of(units, before->offset + units->page_bytes - 1); /* first wholly free */
        for (uint64_t p = first; p > start_page && extra_before < want && !tpi_page_mapped(units, p - 1); p--)
            extra_before++;
    }
    uint64_t reserved = core->stats.pub.reserved_bytes.current;
    if (reserved + missing > cap)
        tpi_units_release_idle_down_to(units, cap > missing ? cap - missing : 0, VMM_CAP_RELEASE_MIN_IDLE_NS);
    uint64_t hard = cap_with_headroom(core, HARD_HEADROOM_DIV, missing);
    /* Past the held high-water mark, only as far as the peak cap. */
    uint64_t peak_line = TPI_MAX(held_high_water(core), cap_with_headroom(core, PEAK_HEADROOM_DIV, missing));
    hard = TPI_MIN(hard, peak_line);
    if (core->stats.pub.reserved_bytes.current + missing > hard)
        tpi_units_release_idle_down_to(units, hard > missing ? hard - missing : 0, 0);
    reserved = core->stats.pub.reserved_bytes.current;
    uint64_t limit = core->config.limit_bytes;
    if (missing > limit || reserved > limit - missing) {
        *out_need = missing > limit ? missing : reserved + missing - limit;
        return TP_ERR_OUT_OF_MEMORY;
    }
    /* The look-ahead is a bet that the pool keeps growing: it never takes
     * the pool past its hard cap (nor its limit, nor, past the held
     * high-water mark, the peak cap: both in hard). Past the cap, pages mapped
     * ahead are memory above the promise, and the next growth would unmap
     * fresh idle pages to stay under it while they stay mapped. Below its
     * high-water mark the pool is only filling up to a level it has held
     * before, so the bet is smaller: the soft cap. */
    uint64_t ceiling = TPI_MIN(limit, hard);
    if (core->stats.pub.allocated_bytes.current + n->size <= high_water(core)) ceiling = TPI_MIN(ceiling, cap);
    uint64_t room_pages = (ceiling > reserved + missing ? ceiling - reserved - missing : 0) >> units->page_shift;
    extra = TPI_MIN(extra, room_pages);
    extra_before = TPI_MIN(extra_before, room_pages);
    uint64_t end = last + extra;
    uint64_t max_run = TPI_MAX(core->config.max_map_bytes >> units->page_shift, 1);
    for (uint64_t p = first - extra_before; p <= end;) {
        if (tpi_page_mapped(units, p)) {
            p++;
            continue;
        }
        uint64_t run_end = p;
        while (run_end < end && !tpi_page_mapped(units, run_end + 1) && run_end + 1 - p < max_run) run_end++;
        tp_status st = map_run(core, p, run_end);
        if (st != TP_OK && p <= last && run_end > last) {
            run_end = last; /* try again without the look-ahead */
            st = map_run(core, p, run_end);
        }
        if (st != TP_OK && p < first) { /* the look-ahead before it failed: the block's own pages alone */
            p = first;
            continue;
        }
        if (st != TP_OK) {
            if (p > last) return TP_OK; /* only the look-ahead failed */
            uint64_t still = 0;
            for (uint64_t q = p; q <= last; q++) still += !tpi_page_mapped(units, q);
            *out_need = still << units->page_shift;
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
 * merged tag of every free inside it (unref_pages); unmapped pages carry
 * none (a page is only unmapped once its work has completed).
 *
 * Among free ranges in good-fit order, the first whose window at its start
 * has all pages usable and mapped wins; failing that, the first with a
 * window further in that does: at its end (a range whose start was given
 * back, unmapped, while its end, next to a live block, still has idle pages
 * mapped: the block takes them instead of new ones) or at a page boundary
 * inside it; failing that, the usable window needing the fewest new pages,
 * wherever it lies in its range; failing that, one whose only obstacle is
 * queued work of other streams, each page's named by one stream, after
 * making this stream wait for all of it on the device.
 *
 * Windows inside a range (fewest_missing_window) are looked at only when
 * no candidate has a ready window at its start or end, the case where the
 * pool would map pages. A block that outgrew its hole (a KV cache
 * reallocated larger, its old copy freed: the hole stays mapped but is a
 * little too small) then takes the mapped pages of the hole and maps only
 * the few it lacks, instead of mapping all of its pages at the start of
 * the range -- which, at the pool's cap, also made it unmap as many idle
 * pages elsewhere. The slide visits each page of a range once and stops
 * after PLACE_SLIDE_PAGES_PER_MISSING pages for every page the best window
 * at a start would map: the search costs in proportion to what it can save
 * (a page visited is a few nanoseconds; a page mapped, tens of
 * microseconds of driver time). Measured over every scenario, ten seeds:
 * device calls -28%, mean held/live 1.040 -> 1.037, worst 1.107 -> 1.100;
 * one workload pays (batched-serving, whose growth went to fresh address
 * space and kept its holes for the reallocations that follow: 1,120 ->
 * 3,732 calls); docs/results.md.
 *
 * Runs of unmapped pages are crossed a word of the units' mapped bitmap at
 * a time, by the slide and by the count of a window's missing pages: a
 * step whose page out and page in are both unmapped changes no count, so
 * the slide takes a run of such steps at once (still paying its budget a
 * page a step, so where it stops and what it picks are as before). Most
 * steps are such steps where address space was given back: spec-decode
 * spent 73% of its instructions sliding, 95% of the steps over unmapped
 * pages; -74% instructions for the whole replay, its placement the same. */
#define PLACE_SLIDE_PAGES_PER_MISSING 256
typedef struct placement {
    uint64_t size;
    uint32_t slot;
    uint32_t best;
    uint64_t best_offset, best_missing;
    uint32_t wait;     /* candidate usable after device-side waits */
    uint64_t wait_offset;
    uint32_t end;      /* candidate with a window past its start mapped and usable */
    uint64_t end_offset;
    uint64_t slide_budget; /* pages fewest_missing_window may still visit */
} placement;

/* May slot wait (on the device) for every page of [at, at + size) that it
 * cannot use yet? Only if each such page's tag names a single stream; a
 * page whose frees came from several streams needs a host synchronisation. */
static bool window_waitable(tpi_core *core, uint32_t slot, uint64_t at, uint64_t size) {
    tpi_units *units = &core->units;
    for (uint64_t p = tpi_page_of(units, at), last = tpi_page_of(units, at + size - 1); p <= last; p++) {
        tpi_unit *unit = &units->units[p];
        if (unit->state == TPI_UNIT_UNUSED || tpi_order_tag_usable(&core->order, &unit->tag, slot)) continue;
        if (tpi_tag_slot(unit->tag) == TPI_SLOT_MULTI) return false;
    }
    return true;
}

/* Orders slot after the pending work of every page of [at, at + size) it
 * cannot use yet (window_waitable said they name single streams). */
static tp_status wait_for_window(tpi_core *core, uint32_t slot, uint64_t at, uint64_t size) {
    tpi_units *units = &core->units;
    for (uint64_t p = tpi_page_of(units, at), last = tpi_page_of(units, at + size - 1); p <= last; p++) {
        tpi_unit *unit = &units->units[p];
        if (unit->state == TPI_UNIT_UNUSED || tpi_order_tag_usable(&core->order, &unit->tag, slot)) continue;
        tp_status st = tpi_order_after(&core->order, slot, unit->tag);
        if (st != TP_OK) return st;
    }
    return TP_OK;
}

/* What page p is to slot: mapped and usable, unmapped (pages at or above
 * page_high never were), or blocked by other streams' pending work. */
typedef enum { PAGE_USABLE, PAGE_UNMAPPED, PAGE_BLOCKED } page_kind;
static inline page_kind page_kind_for(tpi_core *core, uint32_t slot, uint64_t p) {
    tpi_units *units = &core->units;
    if (p >= units->page_high) return PAGE_UNMAPPED;
    tpi_unit *unit = &units->units[p];
    if (unit->state == TPI_UNIT_UNUSED) return PAGE_UNMAPPED;
    return tpi_order_tag_usable(&core->order, &unit->tag, slot) ? PAGE_USABLE : PAGE_BLOCKED;
}

/* Are the pages of [at, at + size) all mapped and usable by slot? */
static bool window_ready(tpi_core *core, uint32_t slot, uint64_t at, uint64_t size) {
    tpi_units *units = &core->units;
    for (uint64_t p = tpi_page_of(units, at), last = tpi_page_of(units, at + size - 1); p <= last; p++)
        if (page_kind_for(core, slot, p) != PAGE_USABLE) return false;
    return true;
}

/* The unmapped pages from p (unmapped) on, up to the next mapped page or
 * limit: their count, at least 1 (read a word of mapped_bits at a time). */
static inline uint64_t unmapped_run(const tpi_units *units, uint64_t p, uint64_t limit) {
    return tpi_units_next_mapped(units, p + 1, limit) - p;
}

/* Slides a window of pl->size bytes over the page-aligned positions of free
 * range id after its start (place_window has looked there),
 * and notes the one with the fewest unmapped pages and no blocked page as
 * pl->best if it beats it (and as pl->end when it has none missing). Stops
 * past the pages ever mapped (beyond them every window is all new pages)
 * and when pl->slide_budget runs out. */
static void fewest_missing_window(tpi_core *core, placement *pl, uint32_t id) {
    tpi_units *units = &core->units;
    const tpi_ra_node *range = tpi_ra_node_at(&core->ra, id);
    uint64_t end = range->offset + range->size;
    uint64_t first = tpi_page_of(units, range->offset) + 1;
    if (first >= units->page_high) return;
    uint64_t last_start = tpi_page_of(units, end - pl->size); /* its window ends at or before end */
    uint64_t width = (pl->size + units->page_bytes - 1) >> units->page_shift;
    if (last_start < first || pl->slide_budget < width) return;
    pl->slide_budget -= width;
    uint64_t missing = 0, blocked = 0;
    for (uint64_t p = first; p < first + width; p++) {
        page_kind kind = page_kind_for(core, pl->slot, p);
        if (kind == PAGE_UNMAPPED) { /* and the unmapped pages after it */
            uint64_t run = unmapped_run(units, p, first + width);
            missing += run;
            p += run - 1;
        }
        blocked += kind == PAGE_BLOCKED;
    }
    for (uint64_t p = first;; p++) {
        if (!blocked && missing < pl->best_missing) {
            pl->best = id;
            pl->best_offset = tpi_page_address(units, p);
            pl->best_missing = missing;
            if (!missing) {
                pl->end = id;
                pl->end_offset = pl->best_offset;
                return;
            }
        }
        if (p >= last_start || p >= units->page_high || !pl->slide_budget) return;
        page_kind out = page_kind_for(core, pl->slot, p), in = page_kind_for(core, pl->slot, p + width);
        if (out == PAGE_UNMAPPED && in == PAGE_UNMAPPED) {
            /* Steps whose page out and page in are both unmapped leave
             * both counts as they are, so no window along them beats
             * this one: take the whole run of them at once, at its
             * price in budget, as far as the stops above allow. */
            uint64_t bound = TPI_MIN(TPI_MIN(last_start, units->page_high) - p, pl->slide_budget);
            uint64_t run = TPI_MIN(tpi_units_next_mapped(units, p + 1, p + bound) - p,
                                   tpi_units_next_mapped(units, p + width + 1, p + width + bound) - (p + width));
            pl->slide_budget -= run;
            p += run - 1;
            continue;
        }
        pl->slide_budget--;
        missing += (uint64_t)(in == PAGE_UNMAPPED) - (uint64_t)(out == PAGE_UNMAPPED);
        blocked += (uint64_t)(in == PAGE_BLOCKED) - (uint64_t)(out == PAGE_BLOCKED);
    }
}

/* Looks for a window of pl->size bytes in free range id whose pages the
 * stream may use; a blocked page pushes the window past it. True with
 * *out_offset when the window's pages are all mapped; otherwise notes the
 * range as pl->end when the window at its end is ready (the first such
 * range only), as pl->best, or as pl->wait when its first blocked window
 * could be made usable by waiting on the device for the streams that block
 * it. */
static inline bool place_window(tpi_core *core, placement *pl, uint32_t id, uint64_t *out_offset) {
    tpi_units *units = &core->units;
    const tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
    uint64_t end = n->offset + n->size;
    uint64_t at = n->offset, missing = 0;
    bool blocked = false;
    uint64_t blocked_at = n->offset;
    /* The window's last page moves only when a blocked page pushes the
     * window past it. */
    if (at + pl->size <= end) {
        tpi_unit *table = units->units;
        for (uint64_t p = tpi_page_of(units, at), last = tpi_page_of(units, at + pl->size - 1); p <= last; p++) {
            tpi_unit *unit = &table[p];
            if (unit->state == TPI_UNIT_UNUSED) { /* and the unmapped pages after it, a word at a time */
                uint64_t run = unmapped_run(units, p, last + 1);
                missing += run;
                p += run - 1;
            } else if (!tpi_order_tag_usable(&core->order, &unit->tag, pl->slot)) {
                if (!blocked) blocked_at = at;
                blocked = true;
                at = tpi_page_address(units, p + 1);
                missing = 0;
                if (at + pl->size > end) break;
                last = tpi_page_of(units, at + pl->size - 1);
            }
        }
    }
    if (at + pl->size > end) {
        /* No free window. The first blocked one will do after device-side
         * waits if every page in it that other streams still use names a
         * single stream (all of its pages: a later one may carry another
         * stream's pending free). */
        if (pl->wait == TPI_RA_NONE && blocked && blocked_at + pl->size <= end &&
            window_waitable(core, pl->slot, blocked_at, pl->size)) {
            pl->wait = id;
            pl->wait_offset = blocked_at;
        }
        return false;
    }
    if (missing == 0) {
        *out_offset = at;
        return true;
    }
    uint64_t end_at = tpi_align_down(end - pl->size, (uint64_t)1 << core->ra.shift);
    if (pl->end == TPI_RA_NONE && end_at > at && window_ready(core, pl->slot, end_at, pl->size)) {
        pl->end = id;
        pl->end_offset = end_at;
    }
    if (missing < pl->best_missing) {
        pl->best = id;
        pl->best_offset = at;
        pl->best_missing = missing;
    }
    return false;
}

#define VMM_PLACE_CANDIDATES 16

static tp_status vmm_try_alloc(tpi_backing *b, uint64_t size, uint32_t slot, bool moving, bool may_grow,
                               uint32_t *out_node, uint64_t *out_need) {
    (void)moving; /* pages are mapped where blocks land: nothing for a moving buffer to pin */
    vmm_backing *vmm = (vmm_backing *)b;
    tpi_core *core = b->core;
    placement pl = {size, slot, TPI_RA_NONE, 0, UINT64_MAX, TPI_RA_NONE, 0, TPI_RA_NONE, 0, 0};
    tpi_ra_search search;
    tpi_ra_search_begin(&core->ra, size, &search);
    uint32_t id = TPI_RA_NONE;
    uint64_t offset = 0;
    uint32_t seen_ids[VMM_PLACE_CANDIDATES];
    unsigned seen = 0;
    for (; seen < VMM_PLACE_CANDIDATES; seen++) {
        uint32_t candidate = tpi_ra_search_next(&core->ra, &search);
        if (candidate == TPI_RA_NONE) break;
        seen_ids[seen] = candidate;
        if (place_window(core, &pl, candidate, &offset)) {
            id = candidate;
            break;
        }
    }
    /* No window at a candidate's start or end: windows inside them. */
    if (pl.best_missing != UINT64_MAX) pl.slide_budget = pl.best_missing * PLACE_SLIDE_PAGES_PER_MISSING;
    for (unsigned i = 0; id == TPI_RA_NONE && pl.end == TPI_RA_NONE && i < seen; i++)
        fewest_missing_window(core, &pl, seen_ids[i]);
    /* Nothing usable among the first candidates (their pages held by other
     * streams' pending work, which a capture keeps pending): look on, so
     * that blocked ranges do not hide address space that can take new
     * pages (an out-of-memory failure otherwise, far below the limit). */
    while (id == TPI_RA_NONE && may_grow && pl.best == TPI_RA_NONE && pl.end == TPI_RA_NONE) {
        uint32_t candidate = tpi_ra_search_next(&core->ra, &search);
        if (candidate == TPI_RA_NONE) break;
        if (place_window(core, &pl, candidate, &offset)) id = candidate;
    }
    if (id == TPI_RA_NONE && pl.end != TPI_RA_NONE) {
        id = pl.end;
        offset = pl.end_offset;
    }
    bool needs_pages = id == TPI_RA_NONE; /* an accepted range has every page mapped */
    if (needs_pages && !may_grow) return TP_NOT_READY;
    if (id == TPI_RA_NONE && pl.best != TPI_RA_NONE) {
        id = pl.best;
        offset = pl.best_offset;
    }
    if (id == TPI_RA_NONE && pl.wait != TPI_RA_NONE && wait_for_window(core, slot, pl.wait_offset, size) == TP_OK) {
        id = pl.wait;
        offset = pl.wait_offset;
    }
    if (id == TPI_RA_NONE) {
        *out_need = size;
        return TP_ERR_OUT_OF_MEMORY; /* address space exhausted, or all of it still in use by other streams */
    }
    /* A split and a take: make sure neither can fail half way. */
    if (!tpi_ra_reserve_nodes(&core->ra, 2)) return TP_ERR_HOST_OUT_OF_MEMORY;
    if (offset != tpi_ra_node_at(&core->ra, id)->offset)
        id = tpi_ra_split_free(&core->ra, id, offset - tpi_ra_node_at(&core->ra, id)->offset);
    tpi_tag saved = tpi_ra_node_at(&core->ra, id)->owner;
    tpi_ra_take(&core->ra, id, size);
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, id);
    ref_pages(&core->units, n->offset, n->size);
    tp_status st = needs_pages ? map_block(vmm, id, out_need) : TP_OK;
    if (st != TP_OK) {
        n->owner = saved;
        vmm_release_block(b, id, 0);
        return st;
    }
    *out_node = id;
    return TP_OK;
}

static tp_status vmm_claim(tpi_backing *b, uint64_t offset, uint64_t size, uint32_t *out_node) {
    tpi_core *core = b->core;
    tpi_units *units = &core->units;
    for (uint64_t p = tpi_page_of(units, offset), last = tpi_page_of(units, offset + size - 1); p <= last; p++)
        if (!tpi_page_mapped(units, p)) return TP_ERR_INVALID_ARGUMENT;
    uint32_t id = tpi_ra_take_at(&core->ra, offset, size);
    if (id == TPI_RA_NONE) return TP_ERR_INVALID_ARGUMENT;
    ref_pages(units, offset, size);
    *out_node = id;
    return TP_OK;
}

static void vmm_free_figures(tpi_backing *b, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges) {
    tpi_core *core = b->core;
    const tpi_units *units = &core->units;
    uint64_t free_bytes = 0, largest = 0, ranges = 0;
    for (size_t i = 0; i < core->ra.node_capacity; i++) {
        const tpi_ra_node *n = &core->ra.nodes[i];
        if (n->state != TPI_RA_NODE_FREE) continue;
        uint64_t end = n->offset + n->size, first = tpi_page_of(units, n->offset);
        uint64_t last = TPI_MIN(tpi_page_of(units, end - 1), units->page_high ? units->page_high - 1 : 0);
        uint64_t run = 0;
        for (uint64_t p = first; p <= last && p < units->page_high; p++) {
            if (!tpi_page_mapped(units, p)) {
                if (run) ranges++;
                run = 0;
                continue;
            }
            uint64_t start = tpi_page_address(units, p);
            uint64_t lo = TPI_MAX(start, n->offset), hi = TPI_MIN(start + units->page_bytes, end);
            run += hi - lo;
            free_bytes += hi - lo;
            largest = TPI_MAX(largest, run);
        }
        if (run) ranges++;
    }
    *out_free = free_bytes;
    *out_largest = largest;
    *out_ranges = ranges;
}

/* Page states and live counts against the blocks; expected[] has one
 * zeroed entry per page. */
static bool pages_agree(tpi_core *core, const vmm_backing *vmm, uint64_t *expected, char *msg, size_t capacity) {
    const tpi_units *units = &core->units;
    for (size_t i = 0; i < core->ra.node_capacity; i++) {
        const tpi_ra_node *n = &core->ra.nodes[i];
        if (n->state != TPI_RA_NODE_USED) continue;
        if (n->offset < units->va_base || n->offset + n->size > units->va_base + vmm->va_bytes)
            TPI_FAIL(msg, capacity, "block 0x%llx outside the reservation", (unsigned long long)n->offset);
        for (uint64_t p = tpi_page_of(units, n->offset), last = tpi_page_of(units, n->offset + n->size - 1); p <= last; p++) {
            expected[p]++;
            if (!tpi_page_mapped(units, p))
                TPI_FAIL(msg, capacity, "live block 0x%llx touches unmapped page %llu", (unsigned long long)n->offset,
                         (unsigned long long)p);
        }
    }
    for (uint64_t p = 0; p < units->capacity; p++) {
        const tpi_unit *unit = &units->units[p];
        if (expected[p] != unit->live)
            TPI_FAIL(msg, capacity, "page %llu: live %llu, blocks %llu", (unsigned long long)p,
                     (unsigned long long)unit->live, (unsigned long long)expected[p]);
        if (unit->state == TPI_UNIT_UNUSED) continue;
        if (unit->base != tpi_page_address(units, p) || unit->bytes != units->page_bytes)
            TPI_FAIL(msg, capacity, "page %llu: wrong address or size", (unsigned long long)p);
        if ((unit->state == TPI_UNIT_IDLE) != (unit->live == 0))
            TPI_FAIL(msg, capacity, "page %llu: idle state wrong", (unsigned long long)p);
    }
    return true;
}

static bool vmm_check(tpi_backing *b, char *msg, size_t capacity) {
    tpi_core *core = b->core;
    uint64_t pages = core->units.capacity;
    uint64_t *expected = tpi_host_calloc(core->host, pages, sizeof *expected);
    if (!expected) return true; /* cannot check without memory; not a violation */
    bool ok = pages_agree(core, (const vmm_backing *)b, expected, msg, capacity);
    tpi_host_free(core->host, expected, pages * sizeof *expected);
    return ok;
}

static void vmm_destroy(tpi_backing *b) {
    vmm_backing *vmm = (vmm_backing *)b;
    tpi_core *core = b->core;
    tpi_units *units = &core->units;
    /* Unmap every run of mapped pages. */
    for (uint64_t p = tpi_units_next_mapped(units, 0, units->page_high); p < units->page_high;) {
        uint64_t end = p;
        while (end + 1 < units->page_high && tpi_page_mapped(units, end + 1)) end++;
        uint64_t bytes = (end - p + 1) << units->page_shift;
        tp_status st = core->ops->unmap(core->device, tpi_page_address(units, p), bytes);
        tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_FREE);
        if (st != TP_OK)
            tpi_logf(&core->device->logger, TP_LOG_ERROR, "VMM pool destroy: unmap of %llu bytes failed: %s",
                    (unsigned long long)bytes, tp_status_name(st));
        tpi_stats_reserved_changed(&core->stats, -(int64_t)bytes);
        tpi_observe(&core->stats, TP_POOL_EVENT_DEVICE_FREE, tpi_page_address(units, p), bytes, TP_STREAM_DEFAULT);
        p = tpi_units_next_mapped(units, end + 1, units->page_high);
    }
    tp_status st = core->ops->va_release(core->device, units->va_base, vmm->va_bytes);
    tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_OTHER);
    tpi_host_free(core->host, vmm, sizeof *vmm);
}

tp_status tpi_vmm_create(tpi_core *core, tpi_backing **out_backing) {
    const tp_pool_config *config = &core->config;
    vmm_backing *vmm = tpi_host_calloc(core->host, 1, sizeof *vmm);
    if (!vmm) return TP_ERR_HOST_OUT_OF_MEMORY;
    vmm->base = (tpi_backing){&vmm_ops, core};
    vmm->va_bytes = config->va_reserve_bytes;
    tpi_units_config uc = {TPI_UNITS_PAGES, config->release_threshold_bytes, config->idle_release_ns,
                           config->max_map_bytes, config->page_bytes, vmm->va_bytes / config->page_bytes};
    tp_status st = tpi_units_init(&core->units, &uc, core->device, &core->ra, &core->order, &core->stats);
    if (st != TP_OK) goto fail;
    /* Aligned for the blocks too: the range allocator cuts them from here. */
    uint64_t alignment = TPI_MAX(config->page_bytes, config->alignment_bytes);
    st = core->ops->va_reserve(core->device, vmm->va_bytes, alignment, &core->units.va_base);
    tpi_stats_device_call(&core->stats, st, TPI_DEVICE_CALL_OTHER);
    if (st != TP_OK) {
        tpi_logf(&core->device->logger, TP_LOG_ERROR, "VMM pool: reserving %llu bytes of address space failed: %s",
                (unsigned long long)vmm->va_bytes, tp_status_name(st));
        goto fail;
    }
    if (tpi_ra_add_region(&core->ra, core->units.va_base, vmm->va_bytes, 0, TPI_TAG_CLEAN) == TPI_RA_NONE) {
        core->ops->va_release(core->device, core->units.va_base, vmm->va_bytes);
        st = TP_ERR_HOST_OUT_OF_MEMORY;
        goto fail;
    }
    *out_backing = &vmm->base;
    return TP_OK;
fail:
    tpi_units_destroy(&core->units);
    tpi_host_free(core->host, vmm, sizeof *vmm);
    return st;
}

static const tpi_backing_ops vmm_ops = {
    .name = "vmm",
    .try_alloc = vmm_try_alloc,
    .claim = vmm_claim,
    .release_block = vmm_release_block,
    .resize_block = vmm_resize_block,
    .places_without_device = true, /* (moving is ignored; without growth: no map, no wait) */
    .destroy = vmm_destroy,
    .check = vmm_check,
    .free_figures = vmm_free_figures,
};
