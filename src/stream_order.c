/* SPDX-License-Identifier: MIT */
/*
 * stream_order.c -- stream tags, epochs and event rings; the rules are in
 * stream_order.h.
 *
 * Algorithm: each stream keeps a ring of the events recorded on it and not
 * yet seen complete, oldest first. Asking whether epoch e of stream S is
 * complete first compares e with what is known, then polls the ring from
 * its oldest event (queries, no wait), and only if e was never recorded
 * records it and polls again. Waiting for e waits on the first recorded
 * event at or after e. MULTI tags compare a generation that advances each
 * time every pending free of every stream is known complete. Spare events
 * are kept for reuse, so steady state creates none.
 */
#include "stream_order.h"

#include <string.h>

#define RING_MAX_EVENTS 1024u

/* Room for `need` streams in a cache-line aligned array (the host
 * allocator promises no alignment: over-allocate and align). */
static bool streams_grow(tpi_order *o, size_t need) {
    if (need <= o->stream_capacity) return true;
    size_t capacity = TPI_MAX(need, 2 * o->stream_capacity);
    void *base = tpi_host_alloc(o->host, capacity * sizeof *o->streams + TPI_CACHE_LINE_BYTES);
    if (!base) return false;
    tpi_stream *streams = (tpi_stream *)tpi_align_up((uint64_t)(uintptr_t)base, TPI_CACHE_LINE_BYTES);
    if (o->stream_count) memcpy(streams, o->streams, o->stream_count * sizeof *streams);
    if (o->streams_base) tpi_host_free(o->host, o->streams_base, o->stream_capacity * sizeof *o->streams + TPI_CACHE_LINE_BYTES);
    o->streams = streams;
    o->streams_base = base;
    o->stream_capacity = capacity;
    return true;
}

tp_status tpi_order_init(tpi_order *o, tp_device *device, tpi_stats *stats) {
    memset(o, 0, sizeof *o);
    o->device = device;
    o->ops = device->ops;
    o->host = &device->host;
    o->stats = stats;
    o->multi_epoch = 1;
    if (!streams_grow(o, 4)) return TP_ERR_HOST_OUT_OF_MEMORY;
    o->stream_count = 1; /* slot 0 means "no stream" */
    memset(&o->streams[0], 0, sizeof o->streams[0]);
    return TP_OK;
}

void tpi_order_destroy(tpi_order *o) {
    for (uint32_t slot = 1; slot < o->stream_count; slot++) {
        tpi_stream *s = &o->streams[slot];
        for (uint32_t i = 0; i < s->ring_count; i++)
            o->ops->event_destroy(o->device, s->ring_events[(s->ring_head + i) % s->ring_capacity]);
        tpi_host_free(o->host, s->ring_events, s->ring_capacity * sizeof *s->ring_events);
        tpi_host_free(o->host, s->ring_epochs, s->ring_capacity * sizeof *s->ring_epochs);
        tpi_host_free(o->host, s->captured, s->captured_capacity * sizeof *s->captured);
    }
    for (size_t i = 0; i < o->spare_count; i++) o->ops->event_destroy(o->device, o->spare_events[i]);
    tpi_host_free(o->host, o->spare_events, o->spare_capacity * sizeof *o->spare_events);
    tpi_host_free(o->host, o->streams_base, o->stream_capacity * sizeof *o->streams + TPI_CACHE_LINE_BYTES);
    memset(o, 0, sizeof *o);
}

/* ------------------------------------------------------------------ slots */

uint32_t tpi_order_find_slot(const tpi_order *o, tp_stream handle) {
    if (o->last_slot && o->last_stream == handle) return o->last_slot;
    for (uint32_t i = 1; i < o->stream_count; i++)
        if (o->streams[i].handle == handle && !o->streams[i].retired) return i;
    return 0;
}

/* A stream the device says it does not know is refused: a pool that kept
 * it would fail to wait for it later (destroy, trim). */
static bool device_knows(tpi_order *o, tp_stream handle) {
    bool capturing;
    return !o->ops->stream_capturing || o->ops->stream_capturing(o->device, handle, &capturing) != TP_ERR_INVALID_ARGUMENT;
}

tp_status tpi_order_slot_lookup(tpi_order *o, tp_stream handle, uint32_t *out_slot) {
    uint32_t slot = tpi_order_find_slot(o, handle);
    if (!slot && !device_knows(o, handle)) return TP_ERR_INVALID_ARGUMENT;
    if (!slot && o->retired_count) {
        /* Reuse a forgotten stream's slot: its epochs go on, so its old
         * tags stay complete. */
        for (slot = 1; !o->streams[slot].retired; slot++) {}
        tpi_stream *s = &o->streams[slot];
        s->retired = false;
        s->handle = handle;
        s->capturing = false;
        s->captured_count = 0;
        o->retired_count--;
        o->stats->pub.streams++;
    } else if (!slot) {
        if (o->stream_count > TPI_MAX_SLOTS) return TP_ERR_BUSY;
        if (!streams_grow(o, o->stream_count + 1)) return TP_ERR_HOST_OUT_OF_MEMORY;
        slot = (uint32_t)o->stream_count++;
        memset(&o->streams[slot], 0, sizeof o->streams[slot]);
        o->streams[slot].handle = handle;
        o->streams[slot].next_epoch = 1;
        o->stats->pub.streams++;
    }
    o->last_stream = handle;
    o->last_slot = slot;
    *out_slot = slot;
    return TP_OK;
}

bool tpi_order_capturing(tpi_order *o, uint32_t slot) {
    tpi_stream *s = &o->streams[slot];
    if (s->capturing) return true;
    if (!o->ops->stream_capturing) return false;
    bool capturing = false;
    return o->ops->stream_capturing(o->device, s->handle, &capturing) != TP_OK || capturing;
}

/* ----------------------------------------------------------------- events */

static tp_status event_get(tpi_order *o, tp_event *out) {
    if (o->spare_count) {
        *out = o->spare_events[--o->spare_count];
        return TP_OK;
    }
    tp_status st = o->ops->event_create(o->device, out);
    if (st != TP_OK) tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
    return st;
}

static void event_put(tpi_order *o, tp_event event) {
    if (tpi_host_grow(o->host, (void **)&o->spare_events, sizeof *o->spare_events, &o->spare_capacity,
                     o->spare_count + 1))
        o->spare_events[o->spare_count++] = event;
    else
        o->ops->event_destroy(o->device, event);
}

static void ring_pop(tpi_order *o, tpi_stream *s) {
    s->completed_epoch = s->ring_epochs[s->ring_head];
    event_put(o, s->ring_events[s->ring_head]);
    s->ring_head = (s->ring_head + 1) % s->ring_capacity;
    s->ring_count--;
}

/* Learns, without waiting, which of the stream's events have completed. */
static void stream_poll(tpi_order *o, tpi_stream *s) {
    while (s->ring_count) {
        tp_status st = o->ops->event_query(o->device, s->ring_events[s->ring_head]);
        if (st == TP_NOT_READY) return;
        if (st != TP_OK) {
            tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
            return;
        }
        ring_pop(o, s);
    }
}

static tp_status event_wait(tpi_order *o, tp_event event) {
    o->stats->pub.synchronizations++;
    tp_status st = o->ops->event_synchronize(o->device, event);
    if (st != TP_OK) tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
    return st;
}

static bool ring_grow(tpi_order *o, tpi_stream *s) {
    uint32_t cap = s->ring_capacity ? s->ring_capacity * 2 : 8;
    tp_event *events = tpi_host_alloc(o->host, cap * sizeof *events);
    uint64_t *epochs = tpi_host_alloc(o->host, cap * sizeof *epochs);
    if (!events || !epochs) {
        tpi_host_free(o->host, events, cap * sizeof *events);
        tpi_host_free(o->host, epochs, cap * sizeof *epochs);
        return false;
    }
    for (uint32_t i = 0; i < s->ring_count; i++) {
        events[i] = s->ring_events[(s->ring_head + i) % s->ring_capacity];
        epochs[i] = s->ring_epochs[(s->ring_head + i) % s->ring_capacity];
    }
    tpi_host_free(o->host, s->ring_events, s->ring_capacity * sizeof *events);
    tpi_host_free(o->host, s->ring_epochs, s->ring_capacity * sizeof *epochs);
    s->ring_events = events;
    s->ring_epochs = epochs;
    s->ring_head = 0;
    s->ring_capacity = cap;
    return true;
}

/* Records the stream's next event (numbered next_epoch). */
static tp_status stream_record(tpi_order *o, uint32_t slot) {
    tpi_stream *s = &o->streams[slot];
    if (s->ring_count == s->ring_capacity) {
        if (s->ring_capacity >= RING_MAX_EVENTS) {
            /* Too many outstanding: wait for the oldest to make room. */
            tp_status st = event_wait(o, s->ring_events[s->ring_head]);
            if (st != TP_OK) return st;
            ring_pop(o, s);
        } else if (!ring_grow(o, s)) {
            return TP_ERR_HOST_OUT_OF_MEMORY;
        }
    }
    tp_event event;
    tp_status st = event_get(o, &event);
    if (st != TP_OK) return st;
    st = o->ops->event_record(o->device, event, s->handle);
    if (st != TP_OK) {
        tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
        event_put(o, event);
        return st;
    }
    uint32_t at = (s->ring_head + s->ring_count) % s->ring_capacity;
    s->ring_events[at] = event;
    s->ring_epochs[at] = s->next_epoch++;
    s->ring_count++;
    o->stats->pub.events_recorded++;
    return TP_OK;
}

/* Non-blocking: is the stream's event `epoch` known complete? Records it
 * first if it was never recorded. */
static bool epoch_complete(tpi_order *o, uint32_t slot, uint64_t epoch) {
    tpi_stream *s = &o->streams[slot];
    if (s->completed_epoch >= epoch) return true;
    if (tpi_order_capturing(o, slot)) return false; /* not to be asked */
    stream_poll(o, s);
    if (s->completed_epoch >= epoch) return true;
    if (epoch >= s->next_epoch) {
        if (stream_record(o, slot) != TP_OK) return false;
        stream_poll(o, s);
    }
    return s->completed_epoch >= epoch;
}

/* The recorded event that covers `epoch` (recording it if needed). The
 * caller has seen that epoch is not complete. */
static tp_status event_for(tpi_order *o, uint32_t slot, uint64_t epoch, tp_event *out) {
    tpi_stream *s = &o->streams[slot];
    if (epoch >= s->next_epoch) {
        tp_status st = stream_record(o, slot);
        if (st != TP_OK) return st;
    }
    for (uint32_t i = 0; i < s->ring_count; i++) {
        uint32_t at = (s->ring_head + i) % s->ring_capacity;
        if (s->ring_epochs[at] >= epoch) {
            *out = s->ring_events[at];
            return TP_OK;
        }
    }
    return TP_ERR_CORRUPT; /* complete after all: the caller's view was stale */
}

/* Blocking: waits until the stream's event `epoch` has completed. */
static tp_status epoch_wait(tpi_order *o, uint32_t slot, uint64_t epoch) {
    if (epoch_complete(o, slot, epoch)) return TP_OK;
    if (tpi_order_capturing(o, slot)) return TP_ERR_CAPTURE;
    tpi_stream *s = &o->streams[slot];
    tp_event event;
    tp_status st = event_for(o, slot, epoch, &event);
    if (st != TP_OK) return st;
    st = event_wait(o, event);
    if (st != TP_OK) return st;
    while (s->ring_count && s->ring_epochs[s->ring_head] <= epoch) ring_pop(o, s);
    if (s->completed_epoch < epoch) s->completed_epoch = epoch;
    return TP_OK;
}

/* ------------------------------------------------------------------- tags */

static void full_sync_done(tpi_order *o) {
    o->full_sync_generation++;
    o->multi_epoch = o->full_sync_generation + 1;
}

/* Non-blocking: have all frees on all streams completed? */
static bool all_frees_complete(tpi_order *o) {
    for (uint32_t slot = 1; slot < o->stream_count; slot++) {
        tpi_stream *s = &o->streams[slot];
        if (s->last_free_epoch > s->completed_epoch && !epoch_complete(o, slot, s->last_free_epoch)) return false;
    }
    full_sync_done(o);
    return true;
}

uint64_t tpi_order_merge_hook(void *order, uint64_t a, uint64_t b) { return tpi_order_merge(order, a, b); }

bool tpi_order_tag_complete(tpi_order *o, tpi_tag tag) {
    if (tag == TPI_TAG_CLEAN) return true;
    uint32_t slot = tpi_tag_slot(tag);
    if (slot == TPI_SLOT_MULTI) return o->full_sync_generation >= tpi_tag_epoch(tag) || all_frees_complete(o);
    return epoch_complete(o, slot, tpi_tag_epoch(tag));
}

/* Non-blocking: have the frees of every stream but `slot` completed? */
static bool others_frees_complete(tpi_order *o, uint32_t slot) {
    for (uint32_t other = 1; other < o->stream_count; other++) {
        tpi_stream *s = &o->streams[other];
        if (other != slot && s->last_free_epoch > s->completed_epoch && !epoch_complete(o, other, s->last_free_epoch))
            return false;
    }
    return true;
}

bool tpi_order_tag_usable_other(tpi_order *o, tpi_tag *tag, uint32_t slot) {
    if (tpi_order_tag_complete(o, *tag)) {
        *tag = TPI_TAG_CLEAN;
        return true;
    }
    /* Several streams' frees, this one's among them maybe: usable here once
     * the others' are complete (this stream's own are in its order). The
     * tag stays, for the other streams. */
    return tpi_tag_slot(*tag) == TPI_SLOT_MULTI && others_frees_complete(o, slot);
}

tp_status tpi_order_sync_pending_frees(tpi_order *o, bool *out_waited) {
    bool waited = false;
    bool all = true;
    for (uint32_t slot = 1; slot < o->stream_count; slot++) {
        tpi_stream *s = &o->streams[slot];
        if (s->last_free_epoch <= s->completed_epoch) continue;
        if (tpi_order_capturing(o, slot)) {
            all = false; /* its frees stay pending until the capture ends */
            continue;
        }
        waited = true;
        tp_status st = epoch_wait(o, slot, s->last_free_epoch);
        if (st != TP_OK) return st;
    }
    if (all) full_sync_done(o);
    if (out_waited) *out_waited = waited;
    return TP_OK;
}

tp_status tpi_order_tag_wait(tpi_order *o, tpi_tag tag) {
    if (tag == TPI_TAG_CLEAN) return TP_OK;
    uint32_t slot = tpi_tag_slot(tag);
    if (slot == TPI_SLOT_MULTI) {
        if (o->full_sync_generation >= tpi_tag_epoch(tag)) return TP_OK;
        tp_status st = tpi_order_sync_pending_frees(o, NULL);
        if (st != TP_OK) return st;
        /* A capturing stream's frees could not be waited for. */
        return o->full_sync_generation >= tpi_tag_epoch(tag) ? TP_OK : TP_ERR_CAPTURE;
    }
    return epoch_wait(o, slot, tpi_tag_epoch(tag));
}

tp_status tpi_order_after(tpi_order *o, uint32_t slot, tpi_tag tag) {
    if (tpi_order_capturing(o, slot) || tpi_order_capturing(o, tpi_tag_slot(tag))) return TP_ERR_CAPTURE;
    tp_event event;
    tp_status st = event_for(o, tpi_tag_slot(tag), tpi_tag_epoch(tag), &event);
    if (st != TP_OK) return st;
    st = o->ops->stream_wait_event(o->device, o->streams[slot].handle, event);
    if (st != TP_OK) {
        tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
        return st;
    }
    o->stats->pub.cross_stream_waits++;
    return TP_OK;
}

/* ---------------------------------------------------- forgetting streams */

tp_status tpi_order_forget(tpi_order *o, uint32_t slot) {
    tpi_stream *s = &o->streams[slot];
    if (tpi_order_capturing(o, slot)) return TP_ERR_CAPTURE;
    o->stats->pub.synchronizations++;
    tp_status st = o->ops->stream_synchronize(o->device, s->handle);
    if (st != TP_OK) {
        tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
        return st;
    }
    while (s->ring_count) ring_pop(o, s);
    /* Every free on it is complete and no new one can come: its tags,
     * up to the pending epoch, now read as complete. */
    s->completed_epoch = s->next_epoch++;
    s->retired = true;
    o->retired_count++;
    if (o->last_slot == slot) o->last_slot = 0;
    return TP_OK;
}

tp_status tpi_order_synchronize_all(tpi_order *o) {
    tp_status result = TP_OK;
    for (uint32_t slot = 1; slot < o->stream_count; slot++) {
        if (o->streams[slot].retired) continue;
        if (tpi_order_capturing(o, slot)) {
            if (result == TP_OK) result = TP_ERR_CAPTURE;
            continue;
        }
        tp_status st = o->ops->stream_synchronize(o->device, o->streams[slot].handle);
        o->stats->pub.synchronizations++;
        if (st != TP_OK) {
            tpi_stats_device_call(o->stats, st, TPI_DEVICE_CALL_OTHER);
            if (result == TP_OK) result = st;
        }
    }
    return result;
}
