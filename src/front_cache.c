/* SPDX-License-Identifier: MIT */
/*
 * front_cache.c -- the bins and the last-freed slot; see front_cache.h.
 */
#include "front_cache.h"

tp_status tpi_front_init(tpi_front *f, tpi_core *core, tpi_backing *backing, uint64_t limit_bytes,
                         uint64_t max_block_bytes) {
    *f = (tpi_front){.core = core, .backing = backing, .limit_bytes = limit_bytes,
                     .max_block_bytes = max_block_bytes, .slot_node = TPI_RA_NONE};
    f->bins = tpi_host_calloc(core->host, TPI_RA_BIN_COUNT, sizeof *f->bins);
    f->bin_count = tpi_host_calloc(core->host, TPI_RA_BIN_COUNT, 1);
    if (!f->bins || !f->bin_count) {
        tpi_front_destroy(f);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    return TP_OK;
}

void tpi_front_destroy(tpi_front *f) {
    tpi_host_free(f->core->host, f->bins, TPI_RA_BIN_COUNT * sizeof *f->bins);
    tpi_host_free(f->core->host, f->bin_count, TPI_RA_BIN_COUNT);
    f->bins = NULL;
    f->bin_count = NULL;
}

/* A parked block leaves the cache for good: out of the block map, back to
 * the backing; units it leaves idle count as idle since idle_since_ns. */
static void release_parked(tpi_front *f, uint32_t node, uint64_t idle_since_ns) {
    tpi_core *core = f->core;
    tpi_map_remove(&core->blocks, tpi_ra_node_at(&core->ra, node)->offset, NULL);
    tpi_block_at(core, node)->flags = 0;
    f->backing->ops->release_block(f->backing, node, idle_since_ns);
}

static void slot_release(tpi_front *f) {
    uint32_t node = f->slot_node;
    if (node == TPI_RA_NONE) return;
    f->slot_node = TPI_RA_NONE;
    f->bytes -= tpi_ra_node_at(&f->core->ra, node)->size;
    release_parked(f, node, f->slot_freed_ns ? f->slot_freed_ns : 1);
}

/* May the parked block n be handed out again in place? Only where
 * good-fit placement would choose the same address had n been released:
 * n has no free range before it (release would merge backwards), and the
 * free range F after it, if any, leaves no better fit: the first non-empty
 * bin at or above n's, F itself aside, is at or above the bin of n + F.
 * So the free X / alloc X loop skips the range allocator without changing
 * where blocks go. */
static bool reuse_in_place(const tpi_ra *ra, const tpi_ra_node *n) {
    if (n->addr_prev != TPI_RA_NONE && tpi_ra_node_at(ra, n->addr_prev)->state == TPI_RA_NODE_FREE) return false;
    if (n->addr_next == TPI_RA_NONE) return true;
    const tpi_ra_node *next = tpi_ra_node_at(ra, n->addr_next);
    if (next->state != TPI_RA_NODE_FREE) return true;
    uint32_t bin = tpi_ra_bin_floor(ra, n->size);
    uint32_t first = tpi_ra_next_nonempty_bin(ra, bin);
    if (first != TPI_RA_NONE && first == next->bin && ra->heads[first] == n->addr_next && next->list_next == TPI_RA_NONE)
        first = tpi_ra_next_nonempty_bin(ra, first + 1); /* next alone in its bin: look past it */
    return first == TPI_RA_NONE || first >= tpi_ra_bin_floor(ra, n->size + next->size);
}

bool tpi_front_push(tpi_front *f, uint32_t node) {
    tpi_core *core = f->core;
    tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
    if (n->size > f->max_block_bytes) {
        slot_release(f);
        f->slot_node = node;
        f->slot_freed_ns = tpi_units_now(&core->units);
    } else {
        if (f->bytes + n->size > f->limit_bytes) return false;
        uint32_t bin = tpi_ra_bin_floor(&core->ra, n->size);
        uint8_t count = f->bin_count[bin];
        if (count == TPI_FRONT_DEPTH) return false;
        f->bins[bin][count] = node;
        f->bin_count[bin] = (uint8_t)(count + 1);
    }
    f->bytes += n->size;
    tpi_block_at(core, node)->flags |= TPI_BLOCK_PARKED;
    return true;
}

uint32_t tpi_front_pop(tpi_front *f, uint64_t size, uint32_t slot) {
    tpi_core *core = f->core;
    if (size > f->max_block_bytes || f->slot_node != TPI_RA_NONE) {
        uint32_t node = f->slot_node;
        if (node == TPI_RA_NONE) return TPI_RA_NONE;
        tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
        if (n->size == size && tpi_tag_slot(n->owner) == slot && reuse_in_place(&core->ra, n)) {
            f->slot_node = TPI_RA_NONE;
            f->bytes -= n->size;
            tpi_block_at(core, node)->flags &= ~TPI_BLOCK_PARKED;
            return node;
        }
        slot_release(f);
        if (size > f->max_block_bytes) return TPI_RA_NONE;
    }
    /* A block of bin(size) or the next bin, freed on slot, that holds size
     * bytes and wastes at most 1/8 of them. */
    uint32_t bin = tpi_ra_bin_floor(&core->ra, size);
    for (uint32_t b = bin; b <= bin + 1 && b < TPI_RA_BIN_COUNT; b++) {
        uint8_t count = f->bin_count[b];
        if (!count) continue;
        uint32_t node = f->bins[b][count - 1];
        tpi_ra_node *n = tpi_ra_node_at(&core->ra, node);
        if (n->size < size || n->size - size > size / 8 || tpi_tag_slot(n->owner) != slot) continue;
        f->bin_count[b] = (uint8_t)(count - 1);
        f->bytes -= n->size;
        tpi_block_at(core, node)->flags &= ~TPI_BLOCK_PARKED;
        return node;
    }
    return TPI_RA_NONE;
}

uint64_t tpi_front_flush(tpi_front *f) {
    if (!f->bytes) return 0;
    uint64_t flushed = f->bytes;
    slot_release(f);
    for (uint32_t bin = 0; bin < TPI_RA_BIN_COUNT; bin++) {
        for (uint8_t i = 0; i < f->bin_count[bin]; i++) release_parked(f, f->bins[bin][i], 0);
        f->bin_count[bin] = 0;
    }
    f->bytes = 0;
    return flushed;
}

void tpi_front_release_cold_slot(tpi_front *f, uint64_t now_ns, uint64_t idle_ns) {
    if (f->slot_node != TPI_RA_NONE && now_ns - f->slot_freed_ns >= idle_ns) slot_release(f);
}

bool tpi_front_check(const tpi_front *f, char *msg, size_t msg_capacity) {
    tpi_core *core = f->core;
    uint64_t parked = 0, flagged = 0;
    for (uint32_t bin = 0; bin < TPI_RA_BIN_COUNT; bin++) {
        for (uint8_t k = 0; k < f->bin_count[bin]; k++) {
            const tpi_ra_node *n = tpi_ra_node_at(&core->ra, f->bins[bin][k]);
            const tpi_block *b = tpi_block_at(core, f->bins[bin][k]);
            if (n->state != TPI_RA_NODE_USED || !(b->flags & TPI_BLOCK_PARKED))
                TPI_FAIL(msg, msg_capacity, "front-cache bin %u holds a bad node", bin);
            if (tpi_ra_bin_floor(&core->ra, n->size) != bin)
                TPI_FAIL(msg, msg_capacity, "front-cache bin %u holds a node of another bin", bin);
            parked += n->size;
        }
    }
    if (f->slot_node != TPI_RA_NONE) {
        const tpi_ra_node *n = tpi_ra_node_at(&core->ra, f->slot_node);
        if (n->state != TPI_RA_NODE_USED || !(tpi_block_at(core, f->slot_node)->flags & TPI_BLOCK_PARKED))
            TPI_FAIL(msg, msg_capacity, "last-freed slot holds a bad node");
        if (n->size <= f->max_block_bytes) TPI_FAIL(msg, msg_capacity, "last-freed slot holds a bin-sized node");
        parked += n->size;
    }
    for (size_t i = 0; i < core->ra.node_capacity && i < core->info_capacity; i++) {
        if (core->ra.nodes[i].state != TPI_RA_NODE_USED || !(core->info[i].flags & TPI_BLOCK_PARKED)) continue;
        if (core->info[i].pins) TPI_FAIL(msg, msg_capacity, "parked node %zu is pinned", i);
        flagged += core->ra.nodes[i].size;
    }
    if (parked != f->bytes) TPI_FAIL(msg, msg_capacity, "front-cache bytes disagree");
    if (flagged != parked) TPI_FAIL(msg, msg_capacity, "front-cache lists and flags disagree");
    return true;
}
