/* SPDX-License-Identifier: MIT */
/*
 * stream_order.h -- the one home of stream-order semantics: which queued
 * work may still use a piece of memory, and what makes it safe for a
 * stream to use it. Below it: the device table. Above it: units, backings,
 * front cache, ladder and pool, which ask it questions and never keep
 * stream state of their own.
 *
 * Vocabulary
 *   slot   the pool's index for a stream it has seen (0: no stream).
 *   epoch  the number of one of a stream's events. A stream numbers its
 *          events 1, 2, ... in the order they are recorded; events are
 *          recorded lazily, only when someone needs to know.
 *   tag    who may still use memory, packed in one word (the range
 *          allocator's owner word):
 *            CLEAN                nobody;
 *            (slot, e)            work on that stream up to its event e;
 *            (MULTI, g)           several streams: safe once the pool's
 *                                 full-synchronisation generation reaches g.
 *
 * Rules (the whole of stream order)
 *   - A free on stream S tags the memory (S, next epoch of S): the memory is
 *     safe for other streams once the next event recorded on S completes.
 *   - S itself may reuse memory tagged with S at once (stream order).
 *   - Another stream T may use it once that event is seen complete (query,
 *     no wait), or after T was made to wait on the event (order_after: no
 *     host wait).
 *   - Giving memory back to the device needs completion: queried on the
 *     normal path, waited for (tag_wait) under memory pressure, in trim
 *     and in destroy.
 *   - Tags of merged ranges merge: the later epoch of one stream, or MULTI
 *     when two streams meet.
 *   - A stream that is capturing a graph (the pool was told, or the device
 *     says so) is never asked anything: no event is recorded on it, queried
 *     or waited for, and it is never made to wait. Its frees therefore stay
 *     pending for every other stream and for the device until the capture
 *     ends, while the capture itself reuses them (same stream).
 *
 * A slot whose stream was forgotten is recycled for a later stream; its
 * epochs continue, so tags left over from the old stream read as complete.
 *
 * Invariants: for each slot, completed_epoch < next_epoch, the ring holds
 * the recorded events completed_epoch < e < next_epoch not yet seen
 * complete, oldest first; last_free_epoch <= next_epoch.
 *
 * Locking: every call here needs the pool's world lock (the pool's mutex
 * and the world gate, pool.c), so _locked would be on every name and is
 * said here once. One exception, the hit path's free (front_cache.h): with
 * only its own stream's lock it reads that stream's next_epoch and writes
 * its last_free_epoch (tpi_order_note_free) -- fields that everything else
 * touches only under the world lock, which includes that stream lock.
 * Each tpi_stream fills whole cache lines so that hit frees on different
 * streams write different lines.
 */
#ifndef TIDEPOOL_STREAM_ORDER_H
#define TIDEPOOL_STREAM_ORDER_H

#include "pool_stats.h"

typedef uint64_t tpi_tag;

#define TPI_TAG_CLEAN 0ull
#define TPI_TAG_SLOT_BITS 16
#define TPI_TAG_EPOCH_BITS 48
#define TPI_TAG_EPOCH_MASK ((1ull << TPI_TAG_EPOCH_BITS) - 1)
#define TPI_SLOT_MULTI ((1u << TPI_TAG_SLOT_BITS) - 1)
/* Streams a pool can know at once (slot 0 and MULTI are taken). */
#define TPI_MAX_SLOTS (TPI_SLOT_MULTI - 1)

static inline tpi_tag tpi_tag_make(uint32_t slot, uint64_t epoch) {
    return ((uint64_t)slot << TPI_TAG_EPOCH_BITS) | (epoch & TPI_TAG_EPOCH_MASK);
}
static inline uint32_t tpi_tag_slot(tpi_tag tag) { return (uint32_t)(tag >> TPI_TAG_EPOCH_BITS); }
static inline uint64_t tpi_tag_epoch(tpi_tag tag) { return tag & TPI_TAG_EPOCH_MASK; }

#define TPI_CACHE_LINE_BYTES 64

typedef struct tpi_stream {
    _Alignas(TPI_CACHE_LINE_BYTES) tp_stream handle;
    uint64_t next_epoch;      /* number the next event recorded here gets */
    uint64_t completed_epoch; /* every event up to this one has completed */
    uint64_t last_free_epoch; /* tag epoch of the latest free on this stream */
    /* events recorded and not yet seen complete, oldest first (a ring) */
    tp_event *ring_events;
    uint64_t *ring_epochs;
    uint32_t ring_head, ring_count, ring_capacity;
    bool retired; /* forgotten; the slot waits for reuse */
    /* capture bookkeeping, kept by the pool: between tp_pool_capture_begin
     * and _end (the device may report a capture the pool was not told of) */
    bool capturing;
    tp_range *captured;
    size_t captured_count, captured_capacity;
} tpi_stream;

typedef struct tpi_order {
    tp_device *device;
    const tpi_device_ops *ops;
    const tpi_host *host;
    tpi_stats *stats;
    tpi_stream *streams; /* index = slot; slot 0 unused; cache-line aligned */
    size_t stream_count, stream_capacity;
    void *streams_base;  /* the allocation streams lies in */
    uint32_t retired_count;
    uint32_t captures; /* streams between tp_pool_capture_begin and _end */
    tp_stream last_stream; /* one-entry lookup cache */
    uint32_t last_slot;
    uint64_t full_sync_generation;
    uint64_t multi_epoch; /* generation a new MULTI tag waits for */
    tp_event *spare_events;
    size_t spare_count, spare_capacity;
} tpi_order;

tp_status tpi_order_init(tpi_order *order, tp_device *device, tpi_stats *stats);
/* Destroys every event; the caller has synchronised the streams. */
void tpi_order_destroy(tpi_order *order);

/* The slot of a stream, added if new (TP_ERR_BUSY past TPI_MAX_SLOTS;
 * TP_ERR_INVALID_ARGUMENT for a stream the device says it does not know).
 * Inline for the stream the pool saw last (the hit path). */
tp_status tpi_order_slot_lookup(tpi_order *order, tp_stream handle, uint32_t *out_slot);
static inline tp_status tpi_order_slot(tpi_order *order, tp_stream handle, uint32_t *out_slot) {
    if (order->last_slot && order->last_stream == handle) {
        *out_slot = order->last_slot;
        return TP_OK;
    }
    return tpi_order_slot_lookup(order, handle, out_slot);
}
/* The slot of a known stream, or 0. */
uint32_t tpi_order_find_slot(const tpi_order *order, tp_stream handle);
static inline tpi_stream *tpi_order_stream(tpi_order *order, uint32_t slot) { return &order->streams[slot]; }

/* Is the stream capturing a graph (pool told so, or the device says so,
 * or cannot say)? */
bool tpi_order_capturing(tpi_order *order, uint32_t slot);

/* A free on slot: returns the tag the freed memory carries. Inline: the
 * hit path's free calls it with only the stream's lock held. */
static inline tpi_tag tpi_order_note_free(tpi_order *order, uint32_t slot) {
    tpi_stream *s = &order->streams[slot];
    s->last_free_epoch = s->next_epoch;
    return tpi_tag_make(slot, s->next_epoch);
}
/* The tag of one stream's pending use, without a free (undo paths). */
static inline tpi_tag tpi_order_pending_tag(const tpi_order *order, uint32_t slot) {
    return tpi_tag_make(slot, order->streams[slot].next_epoch);
}

/* The tag of two ranges merged into one (inline: the VMM backing merges
 * one per page of every block it takes back). */
static inline tpi_tag tpi_order_merge(const tpi_order *o, tpi_tag a, tpi_tag b) {
    if (a == TPI_TAG_CLEAN) return b;
    if (b == TPI_TAG_CLEAN) return a;
    uint32_t slot_a = tpi_tag_slot(a), slot_b = tpi_tag_slot(b);
    if (slot_a == slot_b) return tpi_tag_make(slot_a, TPI_MAX(tpi_tag_epoch(a), tpi_tag_epoch(b)));
    uint64_t epoch = o->multi_epoch;
    if (slot_a == TPI_SLOT_MULTI) epoch = TPI_MAX(epoch, tpi_tag_epoch(a));
    if (slot_b == TPI_SLOT_MULTI) epoch = TPI_MAX(epoch, tpi_tag_epoch(b));
    return tpi_tag_make(TPI_SLOT_MULTI, epoch);
}
/* The same as the range allocator's merge hook (ctx: the tpi_order). */
uint64_t tpi_order_merge_hook(void *order, uint64_t a, uint64_t b);
/* Non-blocking: is the work covered by tag known complete? May record an
 * event to find out. */
bool tpi_order_tag_complete(tpi_order *order, tpi_tag tag);
/* Non-blocking: may memory tagged *tag be used on slot now? Clears *tag
 * when its work is seen complete. Inline for the common answers (clean, or
 * the stream's own); tpi_order_tag_usable_other asks about the rest. */
bool tpi_order_tag_usable_other(tpi_order *order, tpi_tag *tag, uint32_t slot);
/* Usable on slot without asking: clean, or slot's own frees. */
static inline bool tpi_order_tag_own(tpi_tag tag, uint32_t slot) {
    return tag == TPI_TAG_CLEAN || tpi_tag_slot(tag) == slot;
}
static inline bool tpi_order_tag_usable(tpi_order *order, tpi_tag *tag, uint32_t slot) {
    if (tpi_order_tag_own(*tag, slot)) return true;
    return tpi_order_tag_usable_other(order, tag, slot);
}
/* Blocking: waits until the work covered by tag has completed
 * (TP_ERR_CAPTURE when that work is on a capturing stream). */
tp_status tpi_order_tag_wait(tpi_order *order, tpi_tag tag);
/* Makes slot's stream wait, on the device, for the event covering tag (a
 * single-stream tag). */
tp_status tpi_order_after(tpi_order *order, uint32_t slot, tpi_tag tag);
/* Blocking: waits for every free on every stream that is not capturing;
 * *out_waited (optional) says whether any was pending. */
tp_status tpi_order_sync_pending_frees(tpi_order *order, bool *out_waited);
/* Waits for the stream's queued work and retires its slot. */
tp_status tpi_order_forget(tpi_order *order, uint32_t slot);
/* Waits for the queued work of every stream still known and not
 * capturing; returns the first failure (TP_ERR_CAPTURE for a capturing
 * stream) but tries them all. */
tp_status tpi_order_synchronize_all(tpi_order *order);

#endif /* TIDEPOOL_STREAM_ORDER_H */
