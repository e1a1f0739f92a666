/* SPDX-License-Identifier: MIT */
/*
 * oom_ladder.h -- finding device memory for a request that the front cache
 * did not serve, and what happens when there is none. Below it: the front
 * cache, the backing, units and stream order. Above it: pool.c.
 *
 * The ladder: ask the backing for room without growing while blocks are
 * parked; failing that, give the parked blocks back and let it grow. Out of
 * memory then climbs, retrying after each step that freed something:
 *   1. parked blocks and completed idle units, oldest first, as much as the
 *      request needs;
 *   2. wait for the streams that hold pending frees;
 *   3. every idle unit, waiting for its last use;
 *   4. the reclaim callbacks (graph caches and other owners of pool
 *      memory), run with the pool lock released, then 1 and 3 again --
 *      skipped on a thread already inside a reclaim round of this pool (a
 *      callback that allocates from the pool would otherwise recurse);
 * and ends in TP_ERR_OUT_OF_MEMORY with a report. It never aborts, and it
 * never releases memory whose last use has not completed.
 *
 * Not thread-safe: called with the pool's world lock held (its mutex and
 * the world gate, front_cache.h); the world lock is released (and
 * retaken, hits folded in again) only around the reclaim callbacks and
 * while tpi_ladder_remove_reclaimer_locked waits for a round to end.
 */
#ifndef TIDEPOOL_OOM_LADDER_H
#define TIDEPOOL_OOM_LADDER_H

#include "front_cache.h"

#define TPI_MAX_RECLAIMERS 16

typedef struct tpi_reclaimer {
    tp_reclaim_fn fn;
    void *user;
} tpi_reclaimer;

/* A reclaim round in progress, on the stack of the thread running it. */
typedef struct tpi_reclaim_round {
    pthread_t thread;
    struct tpi_reclaim_round *next;
} tpi_reclaim_round;

typedef struct tpi_ladder {
    tpi_core *core;
    tpi_front *front;
    tpi_backing *backing;
    tp_pool *pool;          /* passed to reclaim callbacks */
    pthread_mutex_t *lock;  /* the pool's mutex, released (with the stream locks) around the callbacks */
    tpi_reclaimer reclaimers[TPI_MAX_RECLAIMERS];
    size_t reclaimer_count;
    uint32_t reclaims_in_flight;  /* rounds running without the lock */
    tpi_reclaim_round *rounds;    /* their threads: a callback that allocates
                                     from the pool does not start another */
    pthread_cond_t reclaims_done; /* signalled when one ends */
    bool has_report;
    tp_oom_report report;
} tpi_ladder;

tp_status tpi_ladder_init(tpi_ladder *ladder, tpi_core *core, tpi_front *front, tpi_backing *backing, tp_pool *pool,
                          pthread_mutex_t *lock);
void tpi_ladder_destroy(tpi_ladder *ladder);

/* A block of size bytes usable on slot (its node in *out_node), by the
 * ladder above; moving goes to the backing (tpi_backing_ops.try_alloc). On
 * TP_ERR_OUT_OF_MEMORY the report names request_bytes. */
tp_status tpi_ladder_alloc_locked(tpi_ladder *ladder, uint64_t size, uint64_t request_bytes, uint32_t slot,
                                  bool moving, uint32_t *out_node);
/* Fills the report for a request (on stream) the pool refused. */
void tpi_ladder_report_oom_locked(tpi_ladder *ladder, uint64_t request_bytes, tp_stream stream, tp_status device_status);

tp_status tpi_ladder_add_reclaimer_locked(tpi_ladder *ladder, tp_reclaim_fn fn, void *user);
/* Removes it and waits (the lock released while waiting) until no round
 * that may still call it runs. TP_ERR_NOT_FOUND if it was not there. */
tp_status tpi_ladder_remove_reclaimer_locked(tpi_ladder *ladder, tp_reclaim_fn fn, void *user);

#endif /* TIDEPOOL_OOM_LADDER_H */
