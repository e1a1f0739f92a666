/*
 * range_alloc.h -- a two-level segregated-fit allocator of offsets.
 *
 * It manages ranges of a number line (device addresses), never touching the
 * memory itself: metadata lives in a host array of nodes linked by index.
 * Regions are added as free ranges; blocks are split off their start and
 * coalesced with free neighbours when released. Neighbours exist only inside
 * a region, so two regions never merge.
 *
 * Every free range carries a stream tag saying which queued work may still
 * use it: slot 0 is clean, a stream slot with an epoch means "safe once that
 * stream's event number epoch has completed", and RA_TAG_MULTI with an epoch
 * means "safe once the pool's full-synchronisation generation reaches epoch".
 * Coalescing merges tags conservatively.
 */
#ifndef TIDEPOOL_RANGE_ALLOC_H
#define TIDEPOOL_RANGE_ALLOC_H

#include "internal.h"

#define RA_NONE UINT32_MAX
#define RA_TAG_CLEAN 0u
#define RA_TAG_MULTI UINT32_MAX

#define RA_SL_BITS 4
#define RA_SL_COUNT (1u << RA_SL_BITS)
#define RA_FL_COUNT 58
#define RA_BIN_COUNT (RA_FL_COUNT * RA_SL_COUNT)

enum { RA_NODE_UNUSED = 0, RA_NODE_FREE = 1, RA_NODE_USED = 2 };

typedef struct tp_tag {
    uint32_t slot;
    uint64_t epoch;
} tp_tag;

typedef struct tp_ra_node {
    uint64_t offset;
    uint64_t size;
    uint32_t addr_prev, addr_next; /* neighbours in address order, same region */
    uint32_t list_prev, list_next; /* bin list when free; unused-node list */
    uint8_t state;
    uint16_t bin;
    tp_tag tag;       /* free nodes: who may still use it */
    uint32_t unit;    /* owner's id for the region (segment), kept on split */
    /* Owner data for used nodes (the range allocator never reads these). */
    uint64_t requested;
    uint32_t pins;
    uint32_t flags;
    uint32_t alloc_slot; /* stream slot the block was handed out on */
} tp_ra_node;

typedef struct tp_ra {
    const tp_host *host;
    tp_ra_node *nodes;
    size_t node_capacity;
    uint32_t unused_head;
    uint32_t shift; /* log2 of the alignment */
    uint64_t fl_bitmap;
    uint16_t sl_bitmap[RA_FL_COUNT];
    uint32_t heads[RA_BIN_COUNT];
    uint64_t multi_epoch; /* epoch for new MULTI tags (set by the owner) */
    uint64_t free_bytes;
    uint64_t free_count;
    uint64_t used_count;
} tp_ra;

/* Candidate filter for tp_ra_find: true to accept the free node. */
typedef bool (*tp_ra_accept_fn)(void *ctx, tp_ra *ra, uint32_t node);

tp_status tp_ra_init(tp_ra *ra, const tp_host *host, uint64_t alignment);
void tp_ra_destroy(tp_ra *ra);

static inline tp_ra_node *tp_ra_node_at(tp_ra *ra, uint32_t id) { return &ra->nodes[id]; }

/* Adds [offset, offset+size) as a free region; returns its node or RA_NONE
 * when host memory runs out. */
uint32_t tp_ra_add_region(tp_ra *ra, uint64_t offset, uint64_t size, uint32_t unit, tp_tag tag);
/* Removes a free node that spans its whole region. */
void tp_ra_remove_region(tp_ra *ra, uint32_t node);

/* Good fit: visits free nodes of at least size, exact bin first, then the
 * first bins whose every node fits, up to max_visits candidates; returns the
 * first one accept() takes (accept NULL: any), else RA_NONE. The first
 * rejected candidate, if any, goes to *out_rejected (may be NULL). */
uint32_t tp_ra_find(tp_ra *ra, uint64_t size, tp_ra_accept_fn accept, void *ctx, unsigned max_visits,
                    uint32_t *out_rejected);
/* Splits size off the start of free node and marks it used; the rest stays
 * free with the same tag. Returns the used node (same id) or RA_NONE when
 * host memory for the remainder's node runs out (nothing changes then). */
uint32_t tp_ra_take(tp_ra *ra, uint32_t node, uint64_t size);
/* Splits a free node at offset + size into two free nodes (same tag), so a
 * prefix can be removed alone. Returns the node of the suffix or RA_NONE. */
uint32_t tp_ra_split_free(tp_ra *ra, uint32_t node, uint64_t size);
/* Marks a used node free with tag and coalesces; returns the free node that
 * now contains it. */
uint32_t tp_ra_release(tp_ra *ra, uint32_t node, tp_tag tag);
/* The tag of two ranges merged into one: the later epoch of one stream, or
 * RA_TAG_MULTI(multi_epoch) when two streams meet. */
tp_tag tp_ra_merge_tags(tp_tag a, tp_tag b, uint64_t multi_epoch);

/* Free figures. largest walks the top non-empty bin. */
uint64_t tp_ra_largest_free(tp_ra *ra);

/* Node with the given start offset among all used/free nodes, by scan
 * (error paths only). */
uint32_t tp_ra_node_containing(tp_ra *ra, uint64_t offset);

/* Checks every invariant; writes the first violation into msg. */
bool tp_ra_check(tp_ra *ra, char *msg, size_t msg_capacity);

/* Bin arithmetic, exposed (inline: the tcache uses it on the hit path). */
static inline uint32_t tp_ra_bin_of_units(uint64_t units) {
    if (units < RA_SL_COUNT) return (uint32_t)units;
    uint32_t msb = 63u - (uint32_t)__builtin_clzll(units);
    uint32_t fl = msb - RA_SL_BITS + 1;
    uint32_t sl = (uint32_t)(units >> (msb - RA_SL_BITS)) & (RA_SL_COUNT - 1);
    return fl * RA_SL_COUNT + sl;
}
static inline uint32_t tp_ra_bin_floor(const tp_ra *ra, uint64_t size) { return tp_ra_bin_of_units(size >> ra->shift); }
uint64_t tp_ra_bin_lower_bound(const tp_ra *ra, uint32_t bin);

/* First non-empty bin at or above bin, or RA_NONE. */
static inline uint32_t tp_ra_next_nonempty_bin(const tp_ra *ra, uint32_t bin) {
    if (bin >= RA_BIN_COUNT) return RA_NONE;
    uint32_t fl = bin / RA_SL_COUNT, sl = bin % RA_SL_COUNT;
    uint32_t sl_map = ra->sl_bitmap[fl] & (0xffffu << sl);
    if (!sl_map) {
        uint64_t fl_map = ra->fl_bitmap & (~0ull << (fl + 1));
        if (!fl_map) return RA_NONE;
        fl = (uint32_t)__builtin_ctzll(fl_map);
        sl_map = ra->sl_bitmap[fl];
    }
    return fl * RA_SL_COUNT + (uint32_t)__builtin_ctz(sl_map);
}

#endif /* TIDEPOOL_RANGE_ALLOC_H */
