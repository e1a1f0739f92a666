/* SPDX-License-Identifier: MIT */
/*
 * range_alloc.h -- a two-level segregated-fit allocator of offsets (TLSF).
 * The bottom layer of a pool, with the block map and the device table: it
 * calls nothing above it.
 *
 * It manages ranges of a number line (device addresses), never touching the
 * memory itself: metadata lives in a host array of nodes linked by index.
 * Regions are added as free ranges; blocks are cut from the start of a free
 * range and merged with free neighbours when released. Neighbours exist
 * only inside a region, so two regions never merge.
 *
 * Every node carries one word for its owner (the pool keeps a stream tag
 * there: who may still use the range). The allocator never interprets it:
 * a split copies it to both halves, and a merge combines the two words with
 * the merge hook the owner gave at init. Two equal words merge into that
 * word without a call: the hook must give a for (a, a).
 */
#ifndef TIDEPOOL_RANGE_ALLOC_H
#define TIDEPOOL_RANGE_ALLOC_H

#include "internal.h"

#define TPI_RA_NONE UINT32_MAX

#define TPI_RA_SL_BITS 4
#define TPI_RA_SL_COUNT (1u << TPI_RA_SL_BITS)
#define TPI_RA_FL_COUNT 58
#define TPI_RA_BIN_COUNT (TPI_RA_FL_COUNT * TPI_RA_SL_COUNT)

enum { TPI_RA_NODE_UNUSED = 0, TPI_RA_NODE_FREE = 1, TPI_RA_NODE_USED = 2 };

typedef struct tpi_ra_node {
    uint64_t offset;
    uint64_t size;
    uint64_t owner;                /* the owner's word (see above) */
    uint32_t addr_prev, addr_next; /* neighbours in address order, same region */
    uint32_t list_prev, list_next; /* bin list when free; unused-node list */
    uint32_t region;               /* the id given to add_region, kept on split */
    uint16_t bin;
    uint8_t state;
} tpi_ra_node;

/* Combines the owner words of two ranges that merge into one; called only
 * for two different words (merge(a, a) must be a). */
typedef uint64_t (*tpi_ra_merge_fn)(void *ctx, uint64_t a, uint64_t b);

typedef struct tpi_ra {
    const tpi_host *host;
    tpi_ra_node *nodes;
    size_t node_capacity;
    uint32_t unused_head;
    uint32_t shift; /* log2 of the alignment */
    uint64_t fl_bitmap;
    uint16_t sl_bitmap[TPI_RA_FL_COUNT];
    uint32_t heads[TPI_RA_BIN_COUNT];
    tpi_ra_merge_fn merge;
    void *merge_ctx;
    uint64_t free_bytes;
    uint64_t free_count;
    uint64_t used_count;
} tpi_ra;

tp_status tpi_ra_init(tpi_ra *ra, const tpi_host *host, uint64_t alignment, tpi_ra_merge_fn merge, void *merge_ctx);
void tpi_ra_destroy(tpi_ra *ra);

static inline tpi_ra_node *tpi_ra_node_at(const tpi_ra *ra, uint32_t id) { return &ra->nodes[id]; }

/* Makes sure the next `count` splits need no host allocation; false when
 * host memory runs out. Inline for the common case (two spare nodes at the
 * unused list's head); tpi_ra_reserve_nodes_counted counts and grows. */
bool tpi_ra_reserve_nodes_counted(tpi_ra *ra, uint32_t count);
static inline bool tpi_ra_reserve_nodes(tpi_ra *ra, uint32_t count) {
    if (count <= 2 && ra->unused_head != TPI_RA_NONE &&
        (count < 2 || ra->nodes[ra->unused_head].list_next != TPI_RA_NONE))
        return true;
    return tpi_ra_reserve_nodes_counted(ra, count);
}

/* Adds [offset, offset+size) as a free region; returns its node or
 * TPI_RA_NONE when host memory runs out. */
uint32_t tpi_ra_add_region(tpi_ra *ra, uint64_t offset, uint64_t size, uint32_t region, uint64_t owner);
/* Removes a free node that spans its whole region. */
void tpi_ra_remove_region(tpi_ra *ra, uint32_t node);

/* Good-fit search, one candidate at a time: free nodes of at least size,
 * from the request's own bin (its first few ranges, which may or may not
 * fit) and then from the first bins whose every range fits, smallest bin
 * first. The caller decides how many candidates to look at. */
typedef struct tpi_ra_search {
    uint64_t size;
    uint32_t floor_bin, bin;
    uint32_t next;     /* node to look at next, or TPI_RA_NONE */
    uint32_t resume;   /* where the floor bin's first pass stopped */
    unsigned tries;    /* nodes seen in the first pass */
    bool second_pass;
} tpi_ra_search;

static inline void tpi_ra_search_begin(const tpi_ra *ra, uint64_t size, tpi_ra_search *search);
/* The next candidate, or TPI_RA_NONE when there is none. */
uint32_t tpi_ra_search_next(const tpi_ra *ra, tpi_ra_search *search);

/* Splits size off the start of free node and marks it used; the rest stays
 * free with the same owner word. Returns the used node (same id) or
 * TPI_RA_NONE when host memory for the remainder runs out (nothing changes
 * then). */
uint32_t tpi_ra_take(tpi_ra *ra, uint32_t node, uint64_t size);
/* Splits a free node at offset + size into two free nodes (same owner
 * word), so that a block can start inside a free range. Returns the node of
 * the suffix or TPI_RA_NONE (nothing changes then). */
uint32_t tpi_ra_split_free(tpi_ra *ra, uint32_t node, uint64_t size);
/* Takes exactly [offset, offset + size) as a used node, when it lies inside
 * one free node; returns the node or TPI_RA_NONE (nothing changes then:
 * not free, or no host memory for the split). */
uint32_t tpi_ra_take_at(tpi_ra *ra, uint64_t offset, uint64_t size);
/* Marks a used node free, its owner word as it is, and merges it with free
 * neighbours; returns the free node that now contains it. */
uint32_t tpi_ra_release(tpi_ra *ra, uint32_t node);

/* Would a release of used node id, and then a good-fit search for size,
 * find first the free range that starts where id does -- so that the
 * block could be resized to size where it is instead? Exactly that, or
 * false where it cannot tell cheaply: id's previous neighbour is not free,
 * id and a free next neighbour hold at least size, and the bins the search
 * would look at before the merged range's hold nothing but that neighbour
 * (which the merge takes away); a released range is the first of its own
 * bin. */
bool tpi_ra_release_lands_in_place(const tpi_ra *ra, uint32_t id, uint64_t size);
/* Resizes used node id where it is, to size (not its size) that
 * tpi_ra_release_lands_in_place allowed: cut down, the tail becomes free and
 * merges with a free next neighbour; grown, it takes the start of that
 * neighbour. Every range, owner word (the block's too) and bin list ends up
 * as a release of id with owner word freed_owner and then a take of size
 * from the same place would leave them. False, and nothing changed, when
 * a cut with no free neighbour after the block finds no host memory for
 * the new free node (tpi_ra_reserve_nodes(ra, 1) first makes sure there
 * is; a cut or growth into a free neighbour needs none) or when a growth
 * finds no room after the block. */
bool tpi_ra_resize(tpi_ra *ra, uint32_t id, uint64_t size, uint64_t freed_owner);

/* Size of the largest free range (walks the top non-empty bin). */
uint64_t tpi_ra_largest_free(const tpi_ra *ra);

/* Node (used or free) containing offset, by scan (error paths only). */
uint32_t tpi_ra_node_containing(const tpi_ra *ra, uint64_t offset);

/* Checks every invariant; writes the first violation into msg. */
bool tpi_ra_check(const tpi_ra *ra, char *msg, size_t msg_capacity);

/* Bin arithmetic (inline: the front cache uses it on the hit path). */
/* Below SL_COUNT units the bin is the count; from there fl * SL_COUNT + sl,
 * fl = msb - SL_BITS + 1 and sl the SL_BITS bits below the msb, which is
 * shift * SL_COUNT + (units >> shift) for shift = msb - SL_BITS (units >>
 * shift is SL_COUNT + sl): one shift, no mask. Both cases without a
 * branch: the msb of units | SL_COUNT is max(msb, SL_BITS), so shift is 0
 * below 2 * SL_COUNT units, where the bin is units itself (the hit path
 * computes a bin on every alloc and free). */
static inline uint32_t tpi_ra_bin_of_units(uint64_t units) {
    uint32_t shift = 63u - (uint32_t)__builtin_clzll(units | TPI_RA_SL_COUNT) - TPI_RA_SL_BITS;
    return shift * TPI_RA_SL_COUNT + (uint32_t)(units >> shift);
}
static inline uint32_t tpi_ra_bin_floor(const tpi_ra *ra, uint64_t size) { return tpi_ra_bin_of_units(size >> ra->shift); }
uint64_t tpi_ra_bin_lower_bound(const tpi_ra *ra, uint32_t bin);

/* Smallest bin all of whose ranges hold at least units. */
static inline uint32_t tpi_ra_bin_ceil_units(uint64_t units) {
    if (units < TPI_RA_SL_COUNT) return (uint32_t)units;
    uint32_t msb = 63u - (uint32_t)__builtin_clzll(units);
    uint64_t step = 1ull << (msb - TPI_RA_SL_BITS);
    if (units > UINT64_MAX - step) return TPI_RA_BIN_COUNT;
    return tpi_ra_bin_of_units(units + step - 1);
}

/* (Inline: both backings begin a search for every block they place.) */
static inline void tpi_ra_search_begin(const tpi_ra *ra, uint64_t size, tpi_ra_search *search) {
    uint64_t units = size >> ra->shift;
    search->size = size;
    search->floor_bin = tpi_ra_bin_of_units(units);
    search->bin = tpi_ra_bin_ceil_units(units); /* where the second pass starts */
    search->next = search->floor_bin < TPI_RA_BIN_COUNT ? ra->heads[search->floor_bin] : TPI_RA_NONE;
    search->resume = TPI_RA_NONE;
    search->tries = 0;
    search->second_pass = false;
}

/* First non-empty bin at or above bin, or TPI_RA_NONE. */
static inline uint32_t tpi_ra_next_nonempty_bin(const tpi_ra *ra, uint32_t bin) {
    if (bin >= TPI_RA_BIN_COUNT) return TPI_RA_NONE;
    uint32_t fl = bin / TPI_RA_SL_COUNT, sl = bin % TPI_RA_SL_COUNT;
    uint32_t sl_map = ra->sl_bitmap[fl] & (0xffffu << sl);
    if (!sl_map) {
        uint64_t fl_map = fl + 1 < 64 ? ra->fl_bitmap & (~0ull << (fl + 1)) : 0;
        if (!fl_map) return TPI_RA_NONE;
        fl = (uint32_t)__builtin_ctzll(fl_map);
        sl_map = ra->sl_bitmap[fl];
    }
    return fl * TPI_RA_SL_COUNT + (uint32_t)__builtin_ctz(sl_map);
}

#endif /* TIDEPOOL_RANGE_ALLOC_H */
