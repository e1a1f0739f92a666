/* SPDX-License-Identifier: MIT */
/*
 * front_cache.h -- freed blocks parked for reuse as they are: the hit path.
 * Below it: the backings (a block that leaves the cache goes back through
 * its backing) and the core's block map. Above it: the ladder and the pool.
 *
 * Bins: small freed blocks (up to max_block_bytes) park in a per-size-bin
 * LIFO of depth TPI_FRONT_DEPTH, not coalesced, and are reused by a request
 * of their bin (or the next) on the stream that freed them. Slot: the last
 * freed block too large for the bins parks alone until the next
 * allocation; reused in place when that allocation asks for its size on its
 * stream and good-fit placement would choose the same address anyway, else
 * released before the allocation looks for room, so placement sees the same
 * free memory as without it.
 *
 * Invariants (tpi_front_check): parked blocks are exactly the bin entries
 * plus the slot, each a used node flagged PARKED and unpinned, in the bin
 * of its size (the slot's above max_block_bytes); their bytes sum to bytes.
 *
 * Not thread-safe: the pool's lock is held around every call.
 */
#ifndef TIDEPOOL_FRONT_CACHE_H
#define TIDEPOOL_FRONT_CACHE_H

#include "pool_core.h"

#define TPI_FRONT_DEPTH 4

typedef struct tpi_front {
    tpi_core *core;
    tpi_backing *backing;
    uint32_t (*bins)[TPI_FRONT_DEPTH];
    uint8_t *bin_count;
    uint64_t bytes;           /* parked, bins and slot */
    uint64_t limit_bytes;     /* most bytes the bins hold */
    uint64_t max_block_bytes; /* largest block a bin takes */
    uint32_t slot_node;       /* the last-freed slot, or TPI_RA_NONE */
    uint64_t slot_freed_ns;
} tpi_front;

tp_status tpi_front_init(tpi_front *front, tpi_core *core, tpi_backing *backing, uint64_t limit_bytes,
                         uint64_t max_block_bytes);
void tpi_front_destroy(tpi_front *front);

/* Parks a block the caller freed (its tag already in the node's owner
 * word). False when it does not fit: the caller releases it. */
bool tpi_front_push(tpi_front *front, uint32_t node);
/* A parked block for size bytes on slot, taken out of the cache, or
 * TPI_RA_NONE. Empties the slot either way. */
uint32_t tpi_front_pop(tpi_front *front, uint64_t size, uint32_t slot);
/* Gives every parked block back to the backing; returns the bytes. */
uint64_t tpi_front_flush(tpi_front *front);
/* Gives the slot's block back if it was freed at least idle_ns ago. */
void tpi_front_release_cold_slot(tpi_front *front, uint64_t now_ns, uint64_t idle_ns);

bool tpi_front_check(const tpi_front *front, char *msg, size_t msg_capacity);

#endif /* TIDEPOOL_FRONT_CACHE_H */
