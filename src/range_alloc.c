/* SPDX-License-Identifier: MIT */
/*
 * range_alloc.c -- two-level segregated fit (TLSF) over offsets; see
 * range_alloc.h for what it is and what it leaves to its owner.
 *
 * Algorithm: sizes are counted in alignment units. Bin (fl, sl) holds free
 * ranges whose unit count has its highest bit at fl + 3 and the next four
 * bits equal to sl (fl 0 holds counts below 16 exactly), so a bin spans at
 * most 1/16 of its lower bound. A bitmap of non-empty first levels and one
 * of non-empty second levels per first level find the first non-empty bin at
 * or above any bin in O(1). Finding a block: the request's own bin first
 * (its ranges may or may not fit; a few are tried), then the first
 * non-empty bin whose lower bound is at least the request (all fit).
 * Blocks are cut from the start of a free range; a release merges the range
 * with free neighbours of its region, combining their owner words through
 * the owner's merge hook (equal words are kept without a call). A block
 * can also be resized where it is (cut down, its tail released as a block
 * would be, or grown into the free range after it), for the owner that
 * knows a release and a new search would put the block there anyway
 * (tpi_ra_release_lands_in_place).
 *
 * Invariants (tpi_ra_check): a free node is in exactly the bin of its size and
 * that bin's bitmap bits are set iff its list is non-empty; neighbours link
 * both ways and touch (prev.offset + prev.size == offset); no two free
 * neighbours exist (they are always merged); neighbours share their
 * region; sizes and offsets are multiples of the alignment;
 * free_bytes/free_count/used_count match the nodes.
 */
#include "range_alloc.h"

#include <stdio.h>
#include <string.h>

#define TPI_RA_EXACT_BIN_TRIES 4

static inline uint32_t msb64(uint64_t v) { return 63u - (uint32_t)__builtin_clzll(v); }

static inline uint32_t bin_of_units(uint64_t units) { return tpi_ra_bin_of_units(units); }

uint64_t tpi_ra_bin_lower_bound(const tpi_ra *ra, uint32_t bin) {
    uint32_t fl = bin / TPI_RA_SL_COUNT, sl = bin % TPI_RA_SL_COUNT;
    uint64_t units = fl == 0 ? sl : ((uint64_t)(TPI_RA_SL_COUNT + sl) << (fl - 1));
    return units << ra->shift;
}

tp_status tpi_ra_init(tpi_ra *ra, const tpi_host *host, uint64_t alignment, tpi_ra_merge_fn merge, void *merge_ctx) {
    if (!tpi_is_pow2(alignment) || !merge) return TP_ERR_INVALID_ARGUMENT;
    memset(ra, 0, sizeof *ra);
    ra->host = host;
    ra->merge = merge;
    ra->merge_ctx = merge_ctx;
    ra->shift = msb64(alignment);
    ra->unused_head = TPI_RA_NONE;
    for (uint32_t i = 0; i < TPI_RA_BIN_COUNT; i++) ra->heads[i] = TPI_RA_NONE;
    return TP_OK;
}

void tpi_ra_destroy(tpi_ra *ra) {
    tpi_host_free(ra->host, ra->nodes, ra->node_capacity * sizeof *ra->nodes);
    ra->nodes = NULL;
    ra->node_capacity = 0;
}

/* A node off the unused list (grown when empty), its fields as they were;
 * TPI_RA_NONE without host memory. */
static uint32_t node_take(tpi_ra *ra) {
    if (ra->unused_head == TPI_RA_NONE) {
        size_t old = ra->node_capacity;
        if (old >= TPI_RA_NONE - 1) return TPI_RA_NONE;
        if (!tpi_host_grow(ra->host, (void **)&ra->nodes, sizeof *ra->nodes, &ra->node_capacity, old + 1))
            return TPI_RA_NONE;
        for (size_t i = ra->node_capacity; i-- > old;) {
            ra->nodes[i].state = TPI_RA_NODE_UNUSED;
            ra->nodes[i].list_next = ra->unused_head;
            ra->unused_head = (uint32_t)i;
        }
    }
    uint32_t id = ra->unused_head;
    ra->unused_head = ra->nodes[id].list_next;
    return id;
}

/* The same, cleared: no neighbours, in no list. */
static uint32_t node_new(tpi_ra *ra) {
    uint32_t id = node_take(ra);
    if (id == TPI_RA_NONE) return TPI_RA_NONE;
    memset(&ra->nodes[id], 0, sizeof ra->nodes[id]);
    ra->nodes[id].addr_prev = ra->nodes[id].addr_next = TPI_RA_NONE;
    ra->nodes[id].list_prev = ra->nodes[id].list_next = TPI_RA_NONE;
    return id;
}

static void node_recycle(tpi_ra *ra, uint32_t id) {
    ra->nodes[id].state = TPI_RA_NODE_UNUSED;
    ra->nodes[id].list_next = ra->unused_head;
    ra->unused_head = id;
}

static void bin_insert(tpi_ra *ra, uint32_t id) {
    tpi_ra_node *n = &ra->nodes[id];
    uint32_t bin = bin_of_units(n->size >> ra->shift);
    n->bin = (uint16_t)bin;
    n->list_prev = TPI_RA_NONE;
    n->list_next = ra->heads[bin];
    if (n->list_next != TPI_RA_NONE) ra->nodes[n->list_next].list_prev = id;
    ra->heads[bin] = id;
    ra->fl_bitmap |= 1ull << (bin / TPI_RA_SL_COUNT);
    ra->sl_bitmap[bin / TPI_RA_SL_COUNT] |= (uint16_t)(1u << (bin % TPI_RA_SL_COUNT));
}

static void bin_remove(tpi_ra *ra, uint32_t id) {
    tpi_ra_node *n = &ra->nodes[id];
    uint32_t bin = n->bin;
    if (n->list_prev != TPI_RA_NONE)
        ra->nodes[n->list_prev].list_next = n->list_next;
    else
        ra->heads[bin] = n->list_next;
    if (n->list_next != TPI_RA_NONE) ra->nodes[n->list_next].list_prev = n->list_prev;
    if (ra->heads[bin] == TPI_RA_NONE) {
        uint32_t fl = bin / TPI_RA_SL_COUNT;
        ra->sl_bitmap[fl] &= (uint16_t)~(1u << (bin % TPI_RA_SL_COUNT));
        if (!ra->sl_bitmap[fl]) ra->fl_bitmap &= ~(1ull << fl);
    }
    n->list_prev = n->list_next = TPI_RA_NONE;
}

/* Node in takes node out's place in out's bin, where in belongs too (its
 * size is in the same bin): the list becomes what removing out and
 * inserting in would make it (in first), without touching the bitmaps,
 * since the bin stays non-empty. */
static inline void bin_replace(tpi_ra *ra, uint32_t out, uint32_t in) {
    tpi_ra_node *o = &ra->nodes[out], *i = &ra->nodes[in];
    uint32_t bin = o->bin;
    if (o->list_prev == TPI_RA_NONE) {
        i->list_next = o->list_next;
    } else {
        ra->nodes[o->list_prev].list_next = o->list_next;
        if (o->list_next != TPI_RA_NONE) ra->nodes[o->list_next].list_prev = o->list_prev;
        i->list_next = ra->heads[bin];
    }
    if (i->list_next != TPI_RA_NONE) ra->nodes[i->list_next].list_prev = in;
    i->list_prev = TPI_RA_NONE;
    i->bin = (uint16_t)bin;
    ra->heads[bin] = in;
    o->list_prev = o->list_next = TPI_RA_NONE;
}

bool tpi_ra_reserve_nodes_counted(tpi_ra *ra, uint32_t count) {
    uint32_t spare = 0;
    for (uint32_t id = ra->unused_head; id != TPI_RA_NONE && spare < count; id = ra->nodes[id].list_next) spare++;
    if (spare >= count) return true;
    size_t old = ra->node_capacity;
    if (old + (count - spare) >= TPI_RA_NONE - 1) return false;
    if (!tpi_host_grow(ra->host, (void **)&ra->nodes, sizeof *ra->nodes, &ra->node_capacity, old + (count - spare)))
        return false;
    for (size_t i = ra->node_capacity; i-- > old;) {
        ra->nodes[i].state = TPI_RA_NODE_UNUSED;
        ra->nodes[i].list_next = ra->unused_head;
        ra->unused_head = (uint32_t)i;
    }
    return true;
}

uint32_t tpi_ra_add_region(tpi_ra *ra, uint64_t offset, uint64_t size, uint32_t region, uint64_t owner) {
    uint32_t id = node_new(ra);
    if (id == TPI_RA_NONE) return TPI_RA_NONE;
    tpi_ra_node *n = &ra->nodes[id];
    n->offset = offset;
    n->size = size;
    n->state = TPI_RA_NODE_FREE;
    n->region = region;
    n->owner = owner;
    bin_insert(ra, id);
    ra->free_bytes += size;
    ra->free_count++;
    return id;
}

void tpi_ra_remove_region(tpi_ra *ra, uint32_t id) {
    tpi_ra_node *n = &ra->nodes[id];
    bin_remove(ra, id);
    ra->free_bytes -= n->size;
    ra->free_count--;
    node_recycle(ra, id);
}

uint32_t tpi_ra_search_next(const tpi_ra *ra, tpi_ra_search *s) {
    if (!s->second_pass) {
        /* The request's own bin: its first few ranges, which may not fit. */
        while (s->next != TPI_RA_NONE && s->tries < TPI_RA_EXACT_BIN_TRIES) {
            uint32_t id = s->next;
            s->next = ra->nodes[id].list_next;
            s->tries++;
            if (ra->nodes[id].size >= s->size) return id;
        }
        s->resume = s->next;
        s->second_pass = true;
        s->bin = tpi_ra_next_nonempty_bin(ra, s->bin);
        if (s->bin != TPI_RA_NONE) s->next = s->bin == s->floor_bin ? s->resume : ra->heads[s->bin];
    }
    /* Bins whose ranges all fit, smallest first (in the floor bin only the
     * ranges the first pass did not try). */
    while (s->bin != TPI_RA_NONE) {
        while (s->next != TPI_RA_NONE) {
            uint32_t id = s->next;
            s->next = ra->nodes[id].list_next;
            if (ra->nodes[id].size >= s->size) return id;
        }
        s->bin = tpi_ra_next_nonempty_bin(ra, s->bin + 1);
        if (s->bin != TPI_RA_NONE) s->next = s->bin == s->floor_bin ? s->resume : ra->heads[s->bin];
    }
    return TPI_RA_NONE;
}

/* Cuts free node id at size: id keeps [offset, +size), a new free node gets
 * the rest, in no bin yet. (Inline: tpi_ra_take makes one for every block
 * cut from a larger range.) */
static TPI_ALWAYS_INLINE uint32_t split_off_tail_unbinned(tpi_ra *ra, uint32_t id, uint64_t size) {
    /* Every field of the new node is written here or by the bin's insert,
     * so it is taken as it is. */
    uint32_t rest = node_take(ra);
    if (rest == TPI_RA_NONE) return TPI_RA_NONE;
    tpi_ra_node *n = &ra->nodes[id];
    tpi_ra_node *r = &ra->nodes[rest];
    r->offset = n->offset + size;
    r->size = n->size - size;
    r->state = TPI_RA_NODE_FREE;
    r->owner = n->owner;
    r->region = n->region;
    r->addr_prev = id;
    r->addr_next = n->addr_next;
    if (n->addr_next != TPI_RA_NONE) ra->nodes[n->addr_next].addr_prev = rest;
    n->addr_next = rest;
    n->size = size;
    return rest;
}

/* The same, the rest in its bin. The caller has removed id from its bin. */
static uint32_t split_off_tail(tpi_ra *ra, uint32_t id, uint64_t size) {
    uint32_t rest = split_off_tail_unbinned(ra, id, size);
    if (rest != TPI_RA_NONE) bin_insert(ra, rest);
    return rest;
}

uint32_t tpi_ra_take(tpi_ra *ra, uint32_t id, uint64_t size) {
    if (ra->nodes[id].size > size) {
        /* Make sure the remainder's node exists before changing anything. */
        if (ra->unused_head == TPI_RA_NONE) {
            uint32_t probe = node_new(ra);
            if (probe == TPI_RA_NONE) return TPI_RA_NONE;
            node_recycle(ra, probe);
        }
        /* The rest takes id's place in its bin when it stays in the same
         * one (a large range losing a small block: the common case). */
        uint32_t bin = ra->nodes[id].bin;
        uint32_t rest = split_off_tail_unbinned(ra, id, size);
        if (bin_of_units(ra->nodes[rest].size >> ra->shift) == bin) {
            bin_replace(ra, id, rest);
        } else {
            bin_remove(ra, id);
            bin_insert(ra, rest);
        }
        ra->free_count++;
    } else {
        bin_remove(ra, id);
    }
    tpi_ra_node *n = &ra->nodes[id];
    n->state = TPI_RA_NODE_USED;
    ra->free_bytes -= size;
    ra->free_count--;
    ra->used_count++;
    return id;
}

uint32_t tpi_ra_split_free(tpi_ra *ra, uint32_t id, uint64_t size) {
    if (ra->unused_head == TPI_RA_NONE) {
        uint32_t probe = node_new(ra);
        if (probe == TPI_RA_NONE) return TPI_RA_NONE;
        node_recycle(ra, probe);
    }
    bin_remove(ra, id);
    uint32_t rest = split_off_tail(ra, id, size);
    bin_insert(ra, id);
    ra->free_count++;
    return rest;
}

uint32_t tpi_ra_take_at(tpi_ra *ra, uint64_t offset, uint64_t size) {
    uint32_t id = tpi_ra_node_containing(ra, offset);
    if (id == TPI_RA_NONE) return TPI_RA_NONE;
    tpi_ra_node *n = &ra->nodes[id];
    if (n->state != TPI_RA_NODE_FREE || size > n->size - (offset - n->offset)) return TPI_RA_NONE;
    if (!tpi_ra_reserve_nodes(ra, 2)) return TPI_RA_NONE;
    if (offset != n->offset) id = tpi_ra_split_free(ra, id, offset - n->offset);
    return tpi_ra_take(ra, id, size);
}

/* Free node next, the neighbour after id and already out of its bin, joins
 * id's range: the sizes add up, the links pass it by, its node is
 * recycled. (Owner words are the caller's.) */
static TPI_ALWAYS_INLINE void absorb_next(tpi_ra *ra, uint32_t id, uint32_t next) {
    tpi_ra_node *n = &ra->nodes[id], *x = &ra->nodes[next];
    n->size += x->size;
    n->addr_next = x->addr_next;
    if (x->addr_next != TPI_RA_NONE) ra->nodes[x->addr_next].addr_prev = id;
    node_recycle(ra, next);
    ra->free_count--;
}

uint32_t tpi_ra_release(tpi_ra *ra, uint32_t id) {
    tpi_ra_node *n = &ra->nodes[id];
    n->state = TPI_RA_NODE_FREE;
    ra->free_bytes += n->size;
    ra->free_count++;
    ra->used_count--;
    uint32_t prev = n->addr_prev;
    if (prev != TPI_RA_NONE && ra->nodes[prev].state == TPI_RA_NODE_FREE) {
        tpi_ra_node *p = &ra->nodes[prev];
        bin_remove(ra, prev);
        if (p->owner != n->owner) p->owner = ra->merge(ra->merge_ctx, p->owner, n->owner);
        absorb_next(ra, prev, id);
        id = prev;
        n = p;
    }
    uint32_t next = n->addr_next;
    bool binned = false;
    if (next != TPI_RA_NONE && ra->nodes[next].state == TPI_RA_NODE_FREE) {
        tpi_ra_node *x = &ra->nodes[next];
        /* The merged range takes the next one's place in its bin when it
         * stays in it (a block given back in front of the large rest of
         * the range it was cut from: the common case). */
        if (bin_of_units((n->size + x->size) >> ra->shift) == x->bin) {
            bin_replace(ra, next, id);
            binned = true;
        } else {
            bin_remove(ra, next);
        }
        if (n->owner != x->owner) n->owner = ra->merge(ra->merge_ctx, n->owner, x->owner);
        absorb_next(ra, id, next);
    }
    if (!binned) bin_insert(ra, id);
    return id;
}

bool tpi_ra_release_lands_in_place(const tpi_ra *ra, uint32_t id, uint64_t size) {
    const tpi_ra_node *n = &ra->nodes[id];
    if (n->addr_prev != TPI_RA_NONE && ra->nodes[n->addr_prev].state == TPI_RA_NODE_FREE) return false;
    uint32_t next = n->addr_next;
    const tpi_ra_node *x = next != TPI_RA_NONE && ra->nodes[next].state == TPI_RA_NODE_FREE ? &ra->nodes[next] : NULL;
    uint64_t merged = n->size + (x ? x->size : 0);
    if (size > merged) return false;
    uint32_t merged_bin = bin_of_units(merged >> ra->shift);
    /* Nothing in the bins the search looks at first but the neighbour the
     * merge takes away (alone in its bin). */
    for (uint32_t bin = tpi_ra_next_nonempty_bin(ra, bin_of_units(size >> ra->shift));
         bin != TPI_RA_NONE && bin < merged_bin; bin = tpi_ra_next_nonempty_bin(ra, bin + 1))
        if (!x || bin != x->bin || ra->heads[bin] != next || x->list_next != TPI_RA_NONE) return false;
    return true; /* and a released range goes to the head of its bin: the first the search sees there */
}

bool tpi_ra_resize(tpi_ra *ra, uint32_t id, uint64_t size, uint64_t freed_owner) {
    tpi_ra_node *n = &ra->nodes[id];
    uint32_t next = n->addr_next;
    tpi_ra_node *x = next != TPI_RA_NONE && ra->nodes[next].state == TPI_RA_NODE_FREE ? &ra->nodes[next] : NULL;
    /* The merged range's word, which the block and the rest keep. */
    uint64_t owner = x && x->owner != freed_owner ? ra->merge(ra->merge_ctx, freed_owner, x->owner) : freed_owner;
    if (x && size < n->size + x->size) {
        /* The free neighbour is the rest: it moves to the block's new end,
         * cut down or grown, and goes to the head of its bin, where a
         * release and a take leave the range they change -- already there
         * when it stays in its bin at its head (a block resized in front
         * of a large free range: the common case), so its lists are left
         * alone. (Release and take would also give the rest the
         * neighbour's node: the take reuses the node the release
         * recycled.) */
        uint64_t rest_size = n->size + x->size - size;
        ra->free_bytes = ra->free_bytes + n->size - size;
        x->offset = n->offset + size;
        x->size = rest_size;
        x->owner = owner;
        n->size = size;
        n->owner = owner;
        if (bin_of_units(rest_size >> ra->shift) != x->bin || ra->heads[x->bin] != next) {
            bin_remove(ra, next);
            bin_insert(ra, next);
        }
        return true;
    }
    if (size < n->size) { /* no free neighbour: the tail is a free range of its own */
        uint32_t rest = split_off_tail_unbinned(ra, id, size);
        if (rest == TPI_RA_NONE) return false;
        ra->free_bytes += ra->nodes[rest].size;
        ra->free_count++;
        ra->nodes[rest].owner = owner;
        ra->nodes[id].owner = owner; /* (the node array may have grown) */
        bin_insert(ra, rest);
        return true;
    }
    /* Grown over all of the free neighbour (the predicate saw it is large
     * enough). */
    if (!x || n->size + x->size != size) return false;
    bin_remove(ra, next);
    ra->free_bytes -= x->size;
    absorb_next(ra, id, next);
    n->owner = owner;
    return true;
}

uint64_t tpi_ra_largest_free(const tpi_ra *ra) {
    if (!ra->fl_bitmap) return 0;
    uint32_t fl = msb64(ra->fl_bitmap);
    uint32_t sl = 31u - (uint32_t)__builtin_clz((uint32_t)ra->sl_bitmap[fl]);
    uint64_t largest = 0;
    for (uint32_t id = ra->heads[fl * TPI_RA_SL_COUNT + sl]; id != TPI_RA_NONE; id = ra->nodes[id].list_next)
        largest = TPI_MAX(largest, ra->nodes[id].size);
    return largest;
}

uint32_t tpi_ra_node_containing(const tpi_ra *ra, uint64_t offset) {
    for (size_t i = 0; i < ra->node_capacity; i++) {
        const tpi_ra_node *n = &ra->nodes[i];
        if (n->state != TPI_RA_NODE_UNUSED && offset >= n->offset && offset - n->offset < n->size) return (uint32_t)i;
    }
    return TPI_RA_NONE;
}

bool tpi_ra_check(const tpi_ra *ra, char *msg, size_t msg_capacity) {
    uint64_t free_bytes = 0, free_count = 0, used_count = 0;
    uint64_t align_mask = (1ull << ra->shift) - 1;
    for (size_t i = 0; i < ra->node_capacity; i++) {
        const tpi_ra_node *n = &ra->nodes[i];
        if (n->state == TPI_RA_NODE_UNUSED) continue;
        if (n->state != TPI_RA_NODE_FREE && n->state != TPI_RA_NODE_USED) TPI_FAIL(msg, msg_capacity, "node %zu: bad state %u", i, n->state);
        if (n->size == 0 || (n->size & align_mask) || (n->offset & align_mask))
            TPI_FAIL(msg, msg_capacity, "node %zu: size %llu / offset 0x%llx not aligned", i, (unsigned long long)n->size,
                    (unsigned long long)n->offset);
        if (n->addr_prev != TPI_RA_NONE) {
            const tpi_ra_node *p = &ra->nodes[n->addr_prev];
            if (p->state == TPI_RA_NODE_UNUSED || p->addr_next != i) TPI_FAIL(msg, msg_capacity, "node %zu: prev link broken", i);
            if (p->offset + p->size != n->offset) TPI_FAIL(msg, msg_capacity, "node %zu: gap or overlap with prev", i);
            if (p->region != n->region) TPI_FAIL(msg, msg_capacity, "node %zu: prev in another region", i);
            if (p->state == TPI_RA_NODE_FREE && n->state == TPI_RA_NODE_FREE) TPI_FAIL(msg, msg_capacity, "node %zu: two free neighbours", i);
        }
        if (n->addr_next != TPI_RA_NONE) {
            const tpi_ra_node *x = &ra->nodes[n->addr_next];
            if (x->state == TPI_RA_NODE_UNUSED || x->addr_prev != i) TPI_FAIL(msg, msg_capacity, "node %zu: next link broken", i);
        }
        if (n->state == TPI_RA_NODE_FREE) {
            free_bytes += n->size;
            free_count++;
            if (n->bin != bin_of_units(n->size >> ra->shift)) TPI_FAIL(msg, msg_capacity, "node %zu: in the wrong bin", i);
        } else {
            used_count++;
        }
    }
    if (free_bytes != ra->free_bytes) TPI_FAIL(msg, msg_capacity, "free bytes %llu, counted %llu", (unsigned long long)ra->free_bytes,
                                              (unsigned long long)free_bytes);
    if (free_count != ra->free_count || used_count != ra->used_count) TPI_FAIL(msg, msg_capacity, "node counts disagree");
    uint64_t listed = 0;
    for (uint32_t bin = 0; bin < TPI_RA_BIN_COUNT; bin++) {
        uint32_t fl = bin / TPI_RA_SL_COUNT, sl = bin % TPI_RA_SL_COUNT;
        bool sl_bit = (ra->sl_bitmap[fl] >> sl) & 1u;
        bool fl_bit = (ra->fl_bitmap >> fl) & 1u;
        if (sl_bit != (ra->heads[bin] != TPI_RA_NONE)) TPI_FAIL(msg, msg_capacity, "bin %u: bitmap disagrees with list", bin);
        if (ra->sl_bitmap[fl] && !fl_bit) TPI_FAIL(msg, msg_capacity, "first level %u: bitmap bit missing", fl);
        uint32_t prev = TPI_RA_NONE;
        for (uint32_t id = ra->heads[bin]; id != TPI_RA_NONE; id = ra->nodes[id].list_next) {
            const tpi_ra_node *n = &ra->nodes[id];
            if (n->state != TPI_RA_NODE_FREE || n->bin != bin) TPI_FAIL(msg, msg_capacity, "bin %u: holds node %u wrongly", bin, id);
            if (n->list_prev != prev) TPI_FAIL(msg, msg_capacity, "bin %u: back link broken at %u", bin, id);
            prev = id;
            if (++listed > free_count) TPI_FAIL(msg, msg_capacity, "bin %u: list cycle", bin);
        }
    }
    if (listed != free_count) TPI_FAIL(msg, msg_capacity, "%llu free nodes, %llu in bins", (unsigned long long)free_count,
                                      (unsigned long long)listed);
    for (uint32_t fl = 0; fl < TPI_RA_FL_COUNT; fl++)
        if (((ra->fl_bitmap >> fl) & 1u) && !ra->sl_bitmap[fl]) TPI_FAIL(msg, msg_capacity, "first level %u: stray bit", fl);
    return true;
}
