/* SPDX-License-Identifier: MIT */
/*
 * front_cache.c -- the per-stream bins and live maps, the last-freed slot,
 * the stream locks, the world gate and the stream lookup table; see
 * front_cache.h (the hit path itself is inline there). Everything here but
 * tpi_front_spin_wait runs under the world lock (tpi_front_world_enter
 * with the mutex held: it raises the gate).
 */
#include "front_cache.h"

#include <sched.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------------ the locks */

/* One wait for a lock held by someone else, the tries-th: spin briefly,
 * then yield, then sleep in short steps (held long: a locked operation
 * waiting on the device). */
static void back_off(unsigned tries) {
    if (tries < 64) {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
    } else if (tries < 256) {
        sched_yield();
    } else {
        struct timespec pause = {0, 20000};
        nanosleep(&pause, NULL);
    }
}

void tpi_front_spin_wait(atomic_int *lock) {
    for (unsigned tries = 0;; tries++) {
        if (!atomic_load_explicit(lock, memory_order_relaxed) &&
            !atomic_exchange_explicit(lock, 1, memory_order_seq_cst))
            return;
        back_off(tries);
    }
}

/* Waits until nobody holds the lock (the world, its gate raised: a hit
 * that takes the lock from here on lets it go untouched). */
static void wait_unlocked(atomic_int *lock) {
    for (unsigned tries = 0; atomic_load_explicit(lock, memory_order_seq_cst); tries++) back_off(tries);
}

/* ------------------------------------------------------------ lifecycle */

tp_status tpi_front_init(tpi_front *f, tpi_core *core, tpi_backing *backing, uint64_t limit_bytes,
                         bool slot_in_limit, uint64_t max_block_bytes) {
    memset(f, 0, sizeof *f);
    atomic_init(&f->world, 0);
    f->core = core;
    f->backing = backing;
    f->limit_bytes = limit_bytes;
    f->slot_in_limit = slot_in_limit;
    f->max_block_bytes = max_block_bytes;
    f->size_shift = core->ra.shift;
    uint64_t max_units = max_block_bytes >> core->ra.shift;
    uint32_t top = tpi_ra_bin_of_units(max_units > (UINT64_MAX >> 1) ? (UINT64_MAX >> 1) : max_units);
    f->bin_count = TPI_MIN(top + 2, (uint32_t)TPI_RA_BIN_COUNT);
    f->hazard_checker = core->device->hazard_checker;
    f->hazard_work = f->hazard_checker ? core->device->hazard_work : NULL;
    f->slot_resizes = backing->ops->resize_block != NULL;
    f->hit_places = backing->ops->places_without_device;
    atomic_init(&f->slot_word, TPI_FRONT_SLOT_EMPTY);
    for (size_t i = 0; i < TPI_FRONT_SETS * TPI_FRONT_WAYS; i++) {
        atomic_init(&f->lookup[i].key, 0);
        atomic_init(&f->lookup[i].stream, NULL);
    }
    return TP_OK;
}

static size_t stream_bytes(const tpi_front *f) {
    return sizeof(tpi_front_stream) + f->bin_count * (sizeof(uint8_t) + sizeof(tpi_front_entry[TPI_FRONT_DEPTH])) +
           2 * TPI_CACHE_LINE_BYTES;
}

void tpi_front_destroy(tpi_front *f) {
    const tpi_host *host = f->core->host;
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        tpi_front_stream *fs = f->streams[slot];
        if (!fs) continue;
        tpi_live_free(host, &fs->live);
        tpi_host_free(host, fs->base, stream_bytes(f));
    }
    tpi_host_free(host, f->streams, f->stream_capacity * sizeof *f->streams);
    f->streams = NULL;
    f->stream_capacity = 0;
}

/* -------------------------------------------------------------- streams */

static uint32_t lookup_set(uintptr_t key) {
    return (uint32_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 58) * TPI_FRONT_WAYS;
}

static void lookup_put(tpi_front *f, tpi_front_stream *fs) {
    uintptr_t key = (uintptr_t)fs->handle + 1;
    uint32_t set = lookup_set(key), way = set, victim = set + (fs->slot % TPI_FRONT_WAYS);
    uint32_t empty = TPI_FRONT_SETS * TPI_FRONT_WAYS; /* none yet */
    for (; way < set + TPI_FRONT_WAYS; way++) {
        uintptr_t at = atomic_load_explicit(&f->lookup[way].key, memory_order_relaxed);
        if (at == key) {
            if (atomic_load_explicit(&f->lookup[way].stream, memory_order_relaxed) != fs)
                atomic_store_explicit(&f->lookup[way].stream, fs, memory_order_release);
            fs->lookup_way = way;
            return;
        }
        if (at == 0 && empty == TPI_FRONT_SETS * TPI_FRONT_WAYS) empty = way;
    }
    /* The first empty way, so that the hit path, which scans the set in
     * order, finds a set's first stream at its first look. */
    if (empty != TPI_FRONT_SETS * TPI_FRONT_WAYS) victim = empty;
    atomic_store_explicit(&f->lookup[victim].key, 0, memory_order_relaxed);
    atomic_store_explicit(&f->lookup[victim].stream, fs, memory_order_release);
    atomic_store_explicit(&f->lookup[victim].key, key, memory_order_release);
    fs->lookup_way = victim;
}

static void lookup_drop(tpi_front *f, tp_stream handle) {
    uintptr_t key = (uintptr_t)handle + 1;
    uint32_t set = lookup_set(key);
    for (uint32_t way = set; way < set + TPI_FRONT_WAYS; way++)
        if (atomic_load_explicit(&f->lookup[way].key, memory_order_relaxed) == key)
            atomic_store_explicit(&f->lookup[way].key, 0, memory_order_relaxed);
}

tpi_front_stream *tpi_front_stream_make(tpi_front *f, uint32_t slot, tp_stream handle) {
    const tpi_host *host = f->core->host;
    if (slot >= f->stream_capacity) {
        size_t old = f->stream_capacity;
        if (!tpi_host_grow(host, (void **)&f->streams, sizeof *f->streams, &f->stream_capacity, (size_t)slot + 1))
            return NULL;
        memset(f->streams + old, 0, (f->stream_capacity - old) * sizeof *f->streams);
    }
    tpi_front_stream *fs = f->streams[slot];
    if (!fs) {
        void *base = tpi_host_calloc(host, 1, stream_bytes(f));
        if (!base) return NULL;
        fs = (tpi_front_stream *)tpi_align_up((uint64_t)(uintptr_t)base, TPI_CACHE_LINE_BYTES);
        atomic_init(&fs->lock, 0); /* (the world's gate keeps hits out until it leaves) */
        fs->base = base;
        fs->slot = slot;
        fs->handle = handle;
        fs->hits = true;
        fs->frees_to_upkeep = TPI_FRONT_UPKEEP_FREES;
        fs->live.newest.offset = UINT64_MAX;
        fs->counts = (uint8_t *)(fs + 1);
        fs->bins = (tpi_front_entry(*)[TPI_FRONT_DEPTH])tpi_align_up((uint64_t)(uintptr_t)(fs->counts + f->bin_count),
                                                                   TPI_CACHE_LINE_BYTES);
        f->streams[slot] = fs;
        f->stream_count++;
        if (slot >= f->slot_end) f->slot_end = slot + 1;
    } else if (fs->handle != handle) { /* a forgotten stream's slot, now another's */
        lookup_drop(f, fs->handle);
        fs->handle = handle;
        fs->hits = true;
    }
    lookup_put(f, fs);
    return fs;
}

void tpi_front_set_hits(tpi_front *f, uint32_t slot, bool hits) {
    if (slot >= f->stream_capacity || !f->streams[slot]) return;
    f->streams[slot]->hits = hits;
    if (hits)
        lookup_put(f, f->streams[slot]);
    else
        lookup_drop(f, f->streams[slot]->handle);
}

/* The gate raised; then, one pass over the streams: each waited for (but
 * held) and its hit statistics' extremes summed. Then the peaks rise by
 * those sums (pool_stats.h) and the streams with hits fold in: a stream
 * without hits since the last fold has nothing to add (every field of its
 * statistics moves only with a hit's alloc or free). */
void tpi_front_world_enter(tpi_front *f, tpi_front_stream *held) {
    atomic_store_explicit(&f->world, 1, memory_order_seq_cst);
    uint64_t allocated_rise = 0, allocated_fall = 0, requested_rise = 0;
    bool any = false, hits = false;
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        tpi_front_stream *fs = f->streams[slot];
        if (!fs) continue;
        if (fs != held) wait_unlocked(&fs->lock);
        any = true;
        const tpi_stats_local *l = &fs->stats;
        if (!(l->allocs | l->frees)) continue;
        hits = true;
        allocated_rise += (uint64_t)l->allocated_rise;
        allocated_fall += (uint64_t)(-l->allocated_fall);
        requested_rise += (uint64_t)l->requested_rise;
    }
    f->world_held = held;
    f->world_epoch++; /* (no hit runs now: every stream lock was seen free) */
    tpi_stats_fold_extremes(&f->core->stats, allocated_rise, allocated_fall, requested_rise);
    for (size_t slot = 1; hits && slot < f->slot_end; slot++) {
        tpi_front_stream *fs = f->streams[slot];
        if (fs && (fs->stats.allocs | fs->stats.frees)) tpi_stats_fold(&f->core->stats, &fs->stats);
    }
    if (any) tpi_stats_update_cached(&f->core->stats);
}

void tpi_front_world_leave(tpi_front *f) {
    if (f->world_held) tpi_front_stream_unlock(f->world_held);
    f->world_held = NULL;
    atomic_store_explicit(&f->world, 0, memory_order_release);
}

/* ----------------------------------------------------------- live maps */

/* The entries fill whole cache lines of their own: two streams' maps
 * never share one. */
static size_t live_bytes(uint32_t capacity) { return capacity * sizeof(tpi_live_entry) + TPI_CACHE_LINE_BYTES; }

void tpi_live_free(const tpi_host *host, tpi_live_map *m) {
    if (m->base) tpi_host_free(host, m->base, live_bytes(m->capacity));
    *m = (tpi_live_map){0};
    m->newest.offset = UINT64_MAX;
}

bool tpi_live_grow(const tpi_host *host, tpi_live_map *m) {
    uint32_t capacity = m->capacity ? 2 * m->capacity : 16;
    void *base = tpi_host_alloc(host, live_bytes(capacity));
    if (!base) return false;
    tpi_live_entry *entries = (tpi_live_entry *)tpi_align_up((uint64_t)(uintptr_t)base, TPI_CACHE_LINE_BYTES);
    for (uint32_t i = 0; i < capacity; i++) entries[i].offset = UINT64_MAX;
    tpi_live_map grown = {m->newest, entries, capacity, m->count, 64u - (unsigned)__builtin_ctz(capacity), base};
    for (uint32_t i = 0; i < m->capacity; i++)
        if (m->entries[i].offset != UINT64_MAX) tpi_live_table_insert_(&grown, &m->entries[i]);
    tpi_live_free(host, m);
    *m = grown;
    return true;
}

bool tpi_front_live_add(tpi_front *f, uint32_t slot, uint64_t offset, uint64_t requested, uint64_t size,
                        uint32_t node) {
    tpi_live_map *m = &f->streams[slot]->live;
    /* Keep room for one more, so that a hit finds it without growing. */
    while (!tpi_live_has_room(m, 2))
        if (!tpi_live_grow(f->core->host, m)) return false;
    tpi_live_insert_(m, &(tpi_live_entry){offset, requested, size, node, 0});
    return true;
}

tpi_live_entry *tpi_front_live_find(tpi_front *f, uint64_t offset, uint32_t *out_slot) {
    return tpi_front_live_find_from(f, offset, 0, out_slot);
}

tpi_live_entry *tpi_front_live_find_from(tpi_front *f, uint64_t offset, uint32_t first_slot, uint32_t *out_slot) {
    if (first_slot && first_slot < f->slot_end && f->streams[first_slot]) {
        tpi_live_entry *e = tpi_live_find(&f->streams[first_slot]->live, offset);
        if (e) {
            if (out_slot) *out_slot = first_slot;
            return e;
        }
    }
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        if (!f->streams[slot] || slot == first_slot) continue;
        tpi_live_entry *e = tpi_live_find(&f->streams[slot]->live, offset);
        if (e) {
            if (out_slot) *out_slot = (uint32_t)slot;
            return e;
        }
    }
    return NULL;
}

void tpi_front_live_remove(tpi_front *f, uint32_t slot, uint64_t offset) {
    tpi_live_map *m = &f->streams[slot]->live;
    tpi_live_entry *e = tpi_live_find(m, offset);
    if (e) tpi_live_remove_entry(m, e);
}

void tpi_front_live_sums(const tpi_front *f, uint64_t *out_allocated, uint64_t *out_requested, uint64_t *out_pinned,
                         uint64_t *out_count) {
    uint64_t allocated = 0, requested = 0, pinned = 0, count = 0;
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        const tpi_front_stream *fs = f->streams[slot];
        if (!fs) continue;
        for (uint32_t i = 0; i <= fs->live.capacity; i++) { /* the table, then the newest */
            const tpi_live_entry *e = i < fs->live.capacity ? &fs->live.entries[i] : &fs->live.newest;
            if (e->offset == UINT64_MAX) continue;
            allocated += e->size;
            requested += e->requested;
            if (e->pins) pinned += e->size;
            count++;
        }
    }
    *out_allocated = allocated;
    *out_requested = requested;
    *out_pinned = pinned;
    *out_count = count;
}

/* -------------------------------------------------------- parked blocks */

/* A parked block leaves the cache for good (or a live one, freed, goes
 * straight back: tpi_front_hit_release): its tag into the node's owner
 * word, back to the backing; units it leaves idle count as idle since
 * idle_since_ns (0: now). */
static void release_parked(tpi_front *f, uint32_t node, tpi_tag tag, uint64_t idle_since_ns) {
    tpi_core *core = f->core;
    tpi_ra_node_at(&core->ra, node)->owner = tag;
    tpi_block_at(core, node)->flags = 0;
    f->backing->ops->release_block(f->backing, node, idle_since_ns);
}

static void slot_release(tpi_front *f) {
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_relaxed);
    if (word == TPI_FRONT_SLOT_EMPTY) return;
    atomic_store_explicit(&f->slot_word, TPI_FRONT_SLOT_EMPTY, memory_order_relaxed);
    release_parked(f, (uint32_t)word, f->slot_tag, f->slot_freed_ns ? f->slot_freed_ns : 1);
}

/* The slot's bytes when its block is slot's stream's, else 0. */
static uint64_t slot_bytes_of(const tpi_front *f, uint32_t slot) {
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_relaxed);
    return tpi_front_slot_word_names(word, slot) ? f->slot_size : 0;
}

bool tpi_front_push(tpi_front *f, uint32_t slot, uint32_t node, uint64_t offset, uint64_t size, tpi_tag tag) {
    tpi_front_stream *fs = f->streams[slot];
    if (size > f->max_block_bytes) {
        slot_release(f);
        f->slot_offset = offset;
        f->slot_size = size;
        f->slot_tag = tag;
        f->slot_freed_ns = tpi_units_now(&f->core->units);
        atomic_store_explicit(&f->slot_word, ((uint64_t)slot << 32) | node, memory_order_relaxed);
        return true;
    }
    if (fs->parked_bytes + (f->slot_in_limit ? slot_bytes_of(f, slot) : 0) + size > f->limit_bytes) return false;
    uint32_t bin = tpi_ra_bin_of_units(size >> f->size_shift);
    uint8_t count = fs->counts[bin];
    if (count == TPI_FRONT_DEPTH) return false;
    fs->bins[bin][count] = (tpi_front_entry){offset, size, tag, node};
    fs->counts[bin] = (uint8_t)(count + 1);
    fs->parked_bytes += size;
    return true;
}

/* The slot's block, of another size than size and freed on slot, resized
 * to size where it is when placement would put the allocation there anyway
 * (the backing's resize_block); false, the slot as it was, otherwise. */
static bool slot_resize(tpi_front *f, uint32_t node, uint64_t size, uint32_t slot) {
    tpi_backing *b = f->backing;
    return f->slot_resizes &&
           b->ops->resize_block(b, node, size, f->slot_tag, slot, f->slot_freed_ns ? f->slot_freed_ns : 1);
}

uint32_t tpi_front_pop(tpi_front *f, uint64_t size, uint32_t slot) {
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_relaxed);
    if (size > f->max_block_bytes) {
        uint32_t node = (uint32_t)word;
        if (tpi_front_slot_word_names(word, slot) &&
            ((f->slot_size == size && tpi_ra_release_lands_in_place(&f->core->ra, node, size)) ||
             (f->slot_size != size && (word != f->resize_failed_word || size != f->resize_failed_size) &&
              slot_resize(f, node, size, slot)))) {
            atomic_store_explicit(&f->slot_word, TPI_FRONT_SLOT_EMPTY, memory_order_relaxed);
            return node;
        }
        slot_release(f);
        return TPI_RA_NONE;
    }
    tpi_front_stream *fs = slot < f->stream_capacity ? f->streams[slot] : NULL;
    const tpi_front_entry *e = fs ? tpi_front_bin_take(f, fs, size) : NULL;
    if (e) return e->node; /* no placement: the slot may stay */
    slot_release(f);
    return TPI_RA_NONE;
}

bool tpi_front_hit_resize_slot(tpi_front *f, tpi_front_stream *fs, uint64_t size, uint64_t bytes, uint64_t word,
                               tpi_live_entry *out) {
    uint32_t node = (uint32_t)word;
    if (!slot_resize(f, node, size, fs->slot)) { /* (the range allocator as it was) */
        f->resize_failed_word = word;
        f->resize_failed_size = size;
        return false;
    }
    f->world_epoch++; /* the range allocator moved: what hits found out before is stale */
    *out = (tpi_live_entry){f->slot_offset, bytes, size, node, 0};
    return true;
}

bool tpi_front_hit_place(tpi_front *f, tpi_front_stream *fs, uint64_t size, uint64_t bytes, tpi_live_entry *out) {
    slot_release(f);
    f->world_epoch++; /* the range allocator moves (or may have): what hits found out before is stale */
    tpi_backing *b = f->backing;
    uint32_t node;
    uint64_t need = 0;
    if (b->ops->try_alloc(b, size, fs->slot, false, false, &node, &need) != TP_OK) return false;
    const tpi_ra_node *n = tpi_ra_node_at(&f->core->ra, node);
    *out = (tpi_live_entry){n->offset, bytes, n->size, node, 0};
    return true;
}

void tpi_front_hit_park_slot_over(tpi_front *f, tpi_front_stream *fs, const tpi_live_entry *e) {
    slot_release(f);
    f->world_epoch++;
    tpi_front_hit_park_slot(f, fs, e); /* (empty now, and no other stream's hit can fill it) */
}

void tpi_front_hit_release(tpi_front *f, tpi_front_stream *fs, const tpi_live_entry *e) {
    /* (Its block record is zero, as every live block's: pool_core.h.) */
    release_parked(f, e->node, tpi_order_note_free(&f->core->order, fs->slot), 0);
    fs->released_bytes = e->size; /* (tpi_front_continues_chain) */
    f->world_epoch++;
}

static bool chain_step(uint64_t freed_bytes, uint64_t size) { return freed_bytes < size && size - freed_bytes <= size / 16; }

bool tpi_front_continues_chain(const tpi_front *f, uint64_t size, uint32_t slot) {
    const tpi_front_stream *fs = slot < f->stream_capacity ? f->streams[slot] : NULL;
    if (!fs || fs->live.newest.offset == UINT64_MAX || !chain_step(fs->live.newest.size, size)) return false;
    if (chain_step(fs->released_bytes, size)) return true;
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_relaxed);
    if (tpi_front_slot_word_names(word, slot) && chain_step(f->slot_size, size)) return true;
    uint32_t bin = tpi_ra_bin_of_units(size >> f->size_shift);
    for (uint32_t b = bin ? bin - 1 : 0; b <= bin && b < f->bin_count; b++)
        if (fs->counts[b] && chain_step(fs->bins[b][fs->counts[b] - 1].size, size)) return true;
    return false;
}

static uint64_t flush_bins(tpi_front *f, tpi_front_stream *fs) {
    uint64_t flushed = fs->parked_bytes;
    /* The counts in order, eight bins to a load: eight empty bins cost one
     * test. (No bitmap of non-empty bins, which the hit path would keep up
     * on every take and put for the sake of this rare walk.) */
    for (uint32_t bin = 0; bin < f->bin_count && fs->parked_bytes; bin++) {
        if (bin % 8 == 0 && bin + 8 <= f->bin_count) {
            uint64_t eight;
            memcpy(&eight, &fs->counts[bin], sizeof eight);
            if (!eight) {
                bin += 7;
                continue;
            }
        }
        for (uint8_t i = 0; i < fs->counts[bin]; i++) {
            release_parked(f, fs->bins[bin][i].node, fs->bins[bin][i].tag, 0);
            fs->parked_bytes -= fs->bins[bin][i].size;
        }
        fs->counts[bin] = 0;
    }
    return flushed;
}

uint64_t tpi_front_flush(tpi_front *f) {
    uint64_t flushed = 0;
    if (atomic_load_explicit(&f->slot_word, memory_order_relaxed) != TPI_FRONT_SLOT_EMPTY) {
        flushed += f->slot_size;
        slot_release(f);
    }
    for (size_t slot = 1; slot < f->slot_end; slot++)
        if (f->streams[slot] && f->streams[slot]->parked_bytes) flushed += flush_bins(f, f->streams[slot]);
    return flushed;
}

uint64_t tpi_front_flush_stream(tpi_front *f, uint32_t slot) {
    uint64_t flushed = slot_bytes_of(f, slot);
    if (flushed) slot_release(f);
    if (slot < f->stream_capacity && f->streams[slot] && f->streams[slot]->parked_bytes)
        flushed += flush_bins(f, f->streams[slot]);
    return flushed;
}

uint64_t tpi_front_parked_count(const tpi_front *f) {
    uint64_t count = atomic_load_explicit(&f->slot_word, memory_order_relaxed) != TPI_FRONT_SLOT_EMPTY;
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        const tpi_front_stream *fs = f->streams[slot];
        if (!fs || !fs->parked_bytes) continue;
        for (uint32_t bin = 0; bin < f->bin_count; bin++) count += fs->counts[bin];
    }
    return count;
}

bool tpi_front_any_parked(const tpi_front *f) {
    if (atomic_load_explicit(&f->slot_word, memory_order_relaxed) != TPI_FRONT_SLOT_EMPTY) return true;
    for (size_t slot = 1; slot < f->slot_end; slot++)
        if (f->streams[slot] && f->streams[slot]->parked_bytes) return true;
    return false;
}

bool tpi_front_parked(const tpi_front *f, uint32_t node, tpi_tag *out_tag) {
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_relaxed);
    if (word != TPI_FRONT_SLOT_EMPTY && (uint32_t)word == node) {
        if (out_tag) *out_tag = f->slot_tag;
        return true;
    }
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        const tpi_front_stream *fs = f->streams[slot];
        if (!fs || !fs->parked_bytes) continue;
        for (uint32_t bin = 0; bin < f->bin_count; bin++)
            for (uint8_t i = 0; i < fs->counts[bin]; i++)
                if (fs->bins[bin][i].node == node) {
                    if (out_tag) *out_tag = fs->bins[bin][i].tag;
                    return true;
                }
    }
    return false;
}

void tpi_front_release_cold_slot(tpi_front *f, uint64_t now_ns, uint64_t idle_ns) {
    if (atomic_load_explicit(&f->slot_word, memory_order_relaxed) != TPI_FRONT_SLOT_EMPTY &&
        now_ns - f->slot_freed_ns >= idle_ns)
        slot_release(f);
}

/* -------------------------------------------------------------- checker */

static bool check_used(const tpi_core *core, uint32_t node, uint64_t offset, uint64_t size) {
    if (node >= core->ra.node_capacity) return false;
    const tpi_ra_node *n = &core->ra.nodes[node];
    return n->state == TPI_RA_NODE_USED && n->offset == offset && n->size == size;
}

bool tpi_front_check(const tpi_front *f, char *msg, size_t msg_capacity) {
    tpi_core *core = f->core;
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_relaxed);
    if (word == TPI_FRONT_SLOT_FILLING) TPI_FAIL(msg, msg_capacity, "last-freed slot left half filled");
    if (word != TPI_FRONT_SLOT_EMPTY) {
        uint32_t node = (uint32_t)word;
        if (!check_used(core, node, f->slot_offset, f->slot_size)) TPI_FAIL(msg, msg_capacity, "last-freed slot holds a bad node");
        if (f->slot_size <= f->max_block_bytes) TPI_FAIL(msg, msg_capacity, "last-freed slot holds a bin-sized node");
        if (tpi_block_at(core, node)->pins || tpi_block_at(core, node)->flags)
            TPI_FAIL(msg, msg_capacity, "last-freed slot's block is pinned or flagged");
        if (tpi_front_live_find((tpi_front *)f, f->slot_offset, NULL))
            TPI_FAIL(msg, msg_capacity, "last-freed slot's block is also live");
    }
    for (size_t slot = 1; slot < f->slot_end; slot++) {
        const tpi_front_stream *fs = f->streams[slot];
        if (!fs) continue;
        if (fs->slot != slot) TPI_FAIL(msg, msg_capacity, "front stream %zu names slot %u", slot, fs->slot);
        uint64_t parked = 0;
        for (uint32_t bin = 0; bin < f->bin_count; bin++) {
            uint8_t count = fs->counts[bin];
            if (count > TPI_FRONT_DEPTH) TPI_FAIL(msg, msg_capacity, "stream %zu: bin %u overfull", slot, bin);
            for (uint8_t k = 0; k < count; k++) {
                const tpi_front_entry *e = &fs->bins[bin][k];
                if (!check_used(core, e->node, e->offset, e->size))
                    TPI_FAIL(msg, msg_capacity, "stream %zu: bin %u holds a bad node", slot, bin);
                if (tpi_ra_bin_of_units(e->size >> f->size_shift) != bin || e->size > f->max_block_bytes)
                    TPI_FAIL(msg, msg_capacity, "stream %zu: bin %u holds a block of another bin", slot, bin);
                if (tpi_tag_slot(e->tag) != slot) TPI_FAIL(msg, msg_capacity, "stream %zu: a parked tag names another stream", slot);
                if (tpi_block_at(core, e->node)->pins || tpi_block_at(core, e->node)->flags)
                    TPI_FAIL(msg, msg_capacity, "stream %zu: parked node %u is pinned or flagged", slot, e->node);
                if (tpi_front_live_find((tpi_front *)f, e->offset, NULL))
                    TPI_FAIL(msg, msg_capacity, "stream %zu: parked node %u is also live", slot, e->node);
                parked += e->size;
            }
        }
        if (parked != fs->parked_bytes) TPI_FAIL(msg, msg_capacity, "stream %zu: parked bytes disagree", slot);
        uint32_t live = 0;
        for (uint32_t i = 0; i <= fs->live.capacity; i++) { /* the table, then the newest */
            const tpi_live_entry *e = i < fs->live.capacity ? &fs->live.entries[i] : &fs->live.newest;
            if (e->offset == UINT64_MAX) continue;
            live++;
            if (!check_used(core, e->node, e->offset, e->size))
                TPI_FAIL(msg, msg_capacity, "stream %zu: live entry 0x%llx is not its node", slot, (unsigned long long)e->offset);
            if (e->requested > e->size || !e->requested)
                TPI_FAIL(msg, msg_capacity, "stream %zu: live entry 0x%llx: bad requested bytes", slot, (unsigned long long)e->offset);
            uint32_t found_slot = 0;
            if (tpi_front_live_find((tpi_front *)f, e->offset, &found_slot) != e)
                TPI_FAIL(msg, msg_capacity, "live block 0x%llx is in two maps", (unsigned long long)e->offset);
            if (tpi_live_find((tpi_live_map *)&fs->live, e->offset) != e)
                TPI_FAIL(msg, msg_capacity, "stream %zu: live entry 0x%llx unreachable", slot, (unsigned long long)e->offset);
        }
        if (live != fs->live.count) TPI_FAIL(msg, msg_capacity, "stream %zu: live count disagrees", slot);
    }
    return true;
}
