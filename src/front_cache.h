/* SPDX-License-Identifier: MIT */
/*
 * front_cache.h -- freed blocks parked for reuse as they are, and the
 * live blocks each stream handed out: the hit path, which runs without the
 * pool's lock. Below it: the backings (a block that leaves the cache goes
 * back through its backing), stream order and the statistics. Above it:
 * the ladder and the pool.
 *
 * Per stream (tpi_front_stream, one per stream slot, cache-line aligned,
 * created on the stream's first locked call and kept until the pool goes):
 *   - bins: small freed blocks (up to max_block_bytes) park, not coalesced,
 *     in a per-size-bin LIFO of depth TPI_FRONT_DEPTH of the stream they
 *     were freed on, and are reused by a request of their bin (or the next)
 *     on that stream -- at once, as stream order allows (a free on S is
 *     safe on S). An entry carries offset, size, tag and node, so a hit
 *     never reads the range allocator. Each stream parks at most
 *     limit_bytes in its bins, counting the last-freed block (below) with
 *     them where the pool says so (slot_in_limit: pool.c says why). A
 *     flush reads the bins' counts eight at a time and skips eight empty
 *     bins with one test (no bitmap of non-empty bins: the hit path would
 *     keep it up on every take and put).
 *   - live map: the blocks handed out on the stream (offset -> requested
 *     bytes, size, node, pins), found by the free without the pool lock;
 *     the newest block sits beside the hash table, so an alloc+free pair
 *     never hashes.
 *     A free on another stream than the allocation's misses it and takes
 *     the locked path, which looks in every stream's map.
 *   - statistics: the stream's uncounted hits (pool_stats.h).
 * Pool-wide: the last-freed slot. The last freed block too large for the
 * bins parks alone until the next allocation that is not a bin's hit;
 * reused in place when that allocation asks for its size on its stream and
 * good-fit placement would choose the same address anyway, or, asking for
 * another size on its stream (where the backing can tell: resize_block,
 * VMM), resized to the request where it is when release and placement
 * would put it exactly there -- the same ranges, pages and tags in one
 * step instead of a release, a search and a take (on the hit path:
 * tpi_front_hit_resize_slot; or under the world lock); else released
 * before the allocation looks for room, so placement sees the same free
 * memory as without it. (An allocation served by a bin places nothing, so
 * the slot may stay through it: freeing a large and a small temporary in
 * turn costs no locked call.) Its state word (stream slot and node) is
 * atomic: every hit allocation too large for the bins goes by it (an
 * occupied slot sends an allocation of another stream, or of another size
 * that the hit cannot resize it to, to the locked path, which releases
 * it), and the hit path fills and empties it:
 * a hit free fills an empty word with a compare-exchange, or, while the
 * pool has a single front stream (whose lock it holds, so no other thread
 * can reach the word), with a plain store.
 *
 * Locks and their order: the pool's mutex, then the stream locks, then the
 * device's own lock. The world lock, which pool.c takes for everything
 * that is not a hit, is the mutex and the world gate: with the mutex held,
 * tpi_front_world_enter raises the gate (the word `world`) and then waits
 * until no stream lock is held; a hit takes its stream lock and then reads
 * the gate, and finding it raised lets the lock go untouched and takes the
 * locked path. Both sides write one word and then read the other's, all
 * sequentially consistent (Dekker's rule): either the world sees the
 * stream lock held and waits for it, or the hit sees the gate. So a hit
 * never runs beside a locked operation, and the world costs one load per
 * stream instead of an exchange and a store per stream. Data written only
 * under the world lock (the range allocator, units, block table, config,
 * stream order, a stream's own state) may be read on the hit path under
 * one stream lock. One exception writes: the hit of the stream the
 * last-freed slot names may resize the slot's block where it lies
 * (tpi_front_hit_resize_slot), changing the range allocator and the pages
 * under its stream lock alone. That is safe because the world waits for
 * that lock and no other hit reads either of them: a hit reads the range
 * allocator only to take the slot's block, while the word names its own
 * stream, and never reads the units' state (the clock only). A second
 * exception: while the pool has one front stream and has only ever known
 * that stream (tpi_front_hit_alone), that stream's hit is the only one
 * there is and the world waits for its lock, so it may do the world's work
 * where it asks the device nothing: place a block that no parked one
 * served in memory already mapped (tpi_front_hit_place), give the slot's
 * block back to park a large free in its place
 * (tpi_front_hit_park_slot_over), and give a small free that the bins
 * cannot take back to the backing (tpi_front_hit_release): the locked
 * path's own steps, so its decisions. The hit path takes exactly one
 * stream lock and nothing after it but the device's (the hazard checker).
 * One exception: a missed hit may keep its stream lock while it tries
 * (never waits for) the mutex; holding both, it raises the gate and
 * waits for the other stream locks (tpi_front_world_enter's held), whose
 * holders are hits that wait for nothing or missed hits that let go when
 * their try fails. A stream lock
 * is a spin lock (one exchange to take it, one store to give it back) that
 * backs off to sched_yield and then to short sleeps when held long; the
 * world waits for one the same way.
 *
 * Stream lookup without a lock: a 4-way set-associative table from stream
 * handle to tpi_front_stream, written under the world lock, read with
 * atomics; the reader checks the handle again under the stream lock. A
 * stream missing from it (evicted by three others of its set) takes the
 * locked path, which puts it back.
 *
 * Invariants (tpi_front_check, under the world lock): parked blocks are
 * exactly the bin entries plus the slot, each a used node, not in any live
 * map, in the bin of its size (the slot's above max_block_bytes); a
 * stream's parked bytes match its bins; live entries are used nodes of
 * their size, each in exactly one map.
 */
#ifndef TIDEPOOL_FRONT_CACHE_H
#define TIDEPOOL_FRONT_CACHE_H

#include "pool_core.h"

#include <stdatomic.h>

#define TPI_FRONT_DEPTH 4
#define TPI_FRONT_SETS 64
#define TPI_FRONT_WAYS 4
/* The slot's state word: (stream slot << 32) | node, or one of these. */
#define TPI_FRONT_SLOT_EMPTY UINT64_MAX
#define TPI_FRONT_SLOT_FILLING (UINT64_MAX - 1) /* a hit free is writing it */
/* Whether a slot word names stream slot `slot`'s parked block: neither
 * EMPTY nor FILLING (whose high halves, all ones, name no stream either). */
static inline bool tpi_front_slot_word_names(uint64_t word, uint32_t slot) {
    return word < TPI_FRONT_SLOT_FILLING && (uint32_t)(word >> 32) == slot;
}
/* Every this many frees on a stream the pool looks at the clock. */
#define TPI_FRONT_UPKEEP_FREES 256

typedef struct tpi_front_entry {
    uint64_t offset, size;
    tpi_tag tag;
    uint32_t node;
} tpi_front_entry;

/* One way of the lookup table: a stream handle (+1, 0: empty) and its
 * front stream, side by side (a set's four ways fill one cache line). */
typedef struct tpi_front_way {
    _Atomic(uintptr_t) key;
    _Atomic(struct tpi_front_stream *) stream;
} tpi_front_way;

typedef struct tpi_live_entry {
    uint64_t offset; /* UINT64_MAX: empty */
    uint64_t requested;
    uint64_t size;
    uint32_t node;
    uint32_t pins;
} tpi_live_entry;

/* The newest block apart, then a hash table: open addressing, linear
 * probing, at most a quarter full, backward-shift deletion (the scheme of
 * common/tpi_map.h with a wider value; a quarter, not half: a replay of a
 * trace with a thousand blocks live probed 1.2 extra entries per insertion
 * at half, 0.3 at a quarter, for 32 bytes more per live block). The newest
 * block is the next one freed more often than not (a temporary freed before
 * the next allocation, or scopes ending in reverse): its entry, newest, is a
 * plain field, and such a pair never hashes. An allocation moves the
 * previous newest into the table. count covers both. */
typedef struct tpi_live_map {
    tpi_live_entry newest;   /* offset UINT64_MAX: empty */
    tpi_live_entry *entries; /* cache-line aligned, inside base */
    uint32_t capacity, count;
    unsigned shift;
    void *base;
} tpi_live_map;

typedef struct tpi_front_stream {
    _Alignas(TPI_CACHE_LINE_BYTES) atomic_int lock;
    bool hits;       /* the hit path may serve it: known, not retired, not capturing */
    uint32_t slot;
    uint32_t lookup_way; /* where the lookup table put it last (checked before use) */
    tp_stream handle;
    uint32_t frees_to_upkeep; /* frees until the pool looks at the clock */
    uint64_t parked_bytes;
    tpi_stats_local stats;
    tpi_live_map live;
    uint8_t *counts;                          /* per bin */
    tpi_front_entry (*bins)[TPI_FRONT_DEPTH]; /* per bin, LIFO */
    void *base;                               /* the allocation it lies in */
    /* The last block freed on the stream that went back to the backing
     * unparked (bins full), by the locked path: tpi_front_continues_chain. */
    uint64_t released_bytes;
} tpi_front_stream;

typedef struct tpi_front {
    tpi_core *core;
    tpi_backing *backing;
    uint64_t limit_bytes;     /* most bytes one stream's bins hold */
    uint64_t max_block_bytes; /* largest block a bin takes */
    uint32_t bin_count;       /* bins a block up to max_block_bytes can use */
    unsigned size_shift;      /* the range allocator's unit */
    bool hazard_checker;      /* the device checks every block handed out */
    bool slot_resizes;        /* the backing can resize the slot's block where it lies (resize_block) */
    bool hit_places;          /* the backing places without the device (places_without_device) */
    bool slot_in_limit;       /* the slot's block counts against its stream's limit_bytes */
    /* With hazard_checker: the device's count that is 0 while a check would
     * find nothing (tp_device.hazard_work); NULL: check every hand-out. */
    const _Atomic size_t *hazard_work;
    tpi_front_stream **streams; /* by slot; NULL until the stream's first call */
    size_t stream_capacity;
    uint32_t slot_end;        /* above the highest slot with a front stream */
    uint32_t stream_count;    /* front streams made (never fewer: they stay until the pool goes) */
    tpi_front_stream *world_held; /* the stream lock the world lock's holder kept (a missed hit's) */
    /* stream handle -> its tpi_front_stream */
    tpi_front_way lookup[TPI_FRONT_SETS * TPI_FRONT_WAYS];
    /* The world gate: 1 while the world lock is held (in a line of its own:
     * every hit reads it, the world writes it). */
    _Alignas(TPI_CACHE_LINE_BYTES) atomic_int world;
    /* Raised at every tpi_front_world_enter and by a hit that resizes the
     * last-freed slot's block (tpi_front_hit_resize_slot; only the stream
     * the slot names reads it on the hit path, to take that block): what a
     * hit found out about the range allocator holds while it has not
     * moved. */
    uint64_t world_epoch;
    /* The last-freed slot. The fields below the word are written by whoever
     * moved the word from EMPTY (to FILLING, then to the block), read by the
     * stream the word names under its lock, or under the world lock. */
    _Alignas(TPI_CACHE_LINE_BYTES) _Atomic(uint64_t) slot_word;
    uint64_t slot_offset, slot_size, slot_freed_ns;
    tpi_tag slot_tag;
    /* The answer of tpi_ra_release_lands_in_place (may the parked block be
     * handed out again in place?) for node in_place_node, found in
     * world epoch in_place_epoch (0: none). Written and read by the stream
     * the word names, under its lock (a hit taking the slot), so ordered by
     * the word's changes like the fields above. */
    uint64_t in_place_epoch;
    uint32_t in_place_node;
    bool in_place;
    /* The slot's word and the size of the latest resize of its block that
     * failed on the hit path, which the locked path then does not try
     * again (tpi_front_pop). Written by the stream the word names, under
     * its lock; read under the world lock. */
    uint64_t resize_failed_word, resize_failed_size;
} tpi_front;

/* limit_bytes: the most one stream's bins hold, with the last-freed
 * block's bytes where slot_in_limit. */
tp_status tpi_front_init(tpi_front *front, tpi_core *core, tpi_backing *backing, uint64_t limit_bytes,
                         bool slot_in_limit, uint64_t max_block_bytes);
void tpi_front_destroy(tpi_front *front);

/* ------------------------------------------------------- stream locks */

/* (Sequentially consistent: the world gate's rule, above.) */
void tpi_front_spin_wait(atomic_int *lock);
static inline void tpi_front_stream_lock(tpi_front_stream *fs) {
    if (!atomic_exchange_explicit(&fs->lock, 1, memory_order_seq_cst)) return;
    tpi_front_spin_wait(&fs->lock);
}
/* The lock if nobody holds it (the same one exchange), else false. */
static inline bool tpi_front_stream_trylock(tpi_front_stream *fs) {
    return !atomic_exchange_explicit(&fs->lock, 1, memory_order_seq_cst);
}
static inline void tpi_front_stream_unlock(tpi_front_stream *fs) {
    atomic_store_explicit(&fs->lock, 0, memory_order_release);
}

/* ------------------------------------------------ under the world lock */

/* After taking the pool's mutex: the gate raised, every stream lock but
 * held (which the caller holds already: see the lock order above) seen
 * free, hit statistics folded in. Before giving the mutex back: held given
 * back, the gate lowered. (The ladder also leaves and enters around
 * reclaim callbacks.) */
void tpi_front_world_enter(tpi_front *front, tpi_front_stream *held);
void tpi_front_world_leave(tpi_front *front);

/* Is fs where the lookup table says its handle is (so hits find it)? */
static inline bool tpi_front_lookup_has(const tpi_front *f, const tpi_front_stream *fs) {
    return atomic_load_explicit(&f->lookup[fs->lookup_way].key, memory_order_relaxed) == (uintptr_t)fs->handle + 1 &&
           atomic_load_explicit(&f->lookup[fs->lookup_way].stream, memory_order_relaxed) == fs;
}

/* The slot's front stream, made on its first use (unlocked: the raised
 * gate keeps hits off it until the world lock goes); NULL without host
 * memory. Puts it in the lookup table. Inline for the common case (known,
 * and in the table); tpi_front_stream_make does the rest. */
tpi_front_stream *tpi_front_stream_make(tpi_front *front, uint32_t slot, tp_stream handle);
static inline tpi_front_stream *tpi_front_stream_at(tpi_front *front, uint32_t slot, tp_stream handle) {
    if (slot < front->stream_capacity) {
        tpi_front_stream *known = front->streams[slot];
        if (known && known->handle == handle && tpi_front_lookup_has(front, known)) return known;
    }
    return tpi_front_stream_make(front, slot, handle);
}
/* A stream forgotten (its slot may go to another handle later) or between
 * capture begin and end: no hits. */
void tpi_front_set_hits(tpi_front *front, uint32_t slot, bool hits);

/* Live blocks. tpi_front_live_add returns false without host memory. */
bool tpi_front_live_add(tpi_front *front, uint32_t slot, uint64_t offset, uint64_t requested, uint64_t size,
                        uint32_t node);
/* The live block starting at offset, on any stream (*out_slot), or NULL. */
tpi_live_entry *tpi_front_live_find(tpi_front *front, uint64_t offset, uint32_t *out_slot);
/* ... looking on first_slot's stream first (0: none), where a free most
 * often finds its block: the others only when it is not there. */
tpi_live_entry *tpi_front_live_find_from(tpi_front *front, uint64_t offset, uint32_t first_slot, uint32_t *out_slot);
void tpi_front_live_remove(tpi_front *front, uint32_t slot, uint64_t offset);
/* Live bytes (allocated and requested) and blocks over every map. */
void tpi_front_live_sums(const tpi_front *front, uint64_t *out_allocated, uint64_t *out_requested,
                         uint64_t *out_pinned, uint64_t *out_count);

/* Parks a block freed on slot with tag. False when it does not fit: the
 * caller releases it. */
bool tpi_front_push(tpi_front *front, uint32_t slot, uint32_t node, uint64_t offset, uint64_t size, tpi_tag tag);
/* A parked block for size bytes on slot, taken out of the cache (the
 * last-freed slot's block reused in place, or resized where it is), or
 * TPI_RA_NONE, the last-freed slot then released (the allocation looks for
 * room next). A bin's block leaves the slot as it is, as the hit path's
 * pick does. A resize the hit path has tried (the same word and size:
 * resize_failed_word) is not tried again: the block is released, and were
 * the range allocator to have moved since, so that the resize would now
 * succeed, the search after the release finds the same place (a resize is
 * made only where it would). */
uint32_t tpi_front_pop(tpi_front *front, uint64_t size, uint32_t slot);
/* Does a request of size bytes on slot look like the next copy of a buffer
 * reallocated a little larger each time (allocate the larger, copy, free
 * the old)? True when the stream's newest live block is smaller by at most
 * size / 16 (the copy now in use) and so is a block it freed (the copy
 * before: the one in the last-freed slot, the newest of bin(size) or the
 * bin below, or the last one it gave back unparked). Sizes that merely
 * rotate upwards (free, then allocate a little larger) have no such live
 * block. Before tpi_front_pop, which may release the slot. */
bool tpi_front_continues_chain(const tpi_front *front, uint64_t size, uint32_t slot);
/* Gives every parked block back to the backing; returns the bytes. */
uint64_t tpi_front_flush(tpi_front *front);
/* ... only those of one stream (and the last-freed slot if it is its). */
uint64_t tpi_front_flush_stream(tpi_front *front, uint32_t slot);
/* Blocks parked, bins and slot. */
uint64_t tpi_front_parked_count(const tpi_front *front);
/* Is any block parked, in a bin or the slot? */
bool tpi_front_any_parked(const tpi_front *front);
/* Is node parked (in a bin or the slot)? Its tag in *out_tag. */
bool tpi_front_parked(const tpi_front *front, uint32_t node, tpi_tag *out_tag);
/* Gives the slot's block back if it was freed at least idle_ns ago. */
void tpi_front_release_cold_slot(tpi_front *front, uint64_t now_ns, uint64_t idle_ns);

bool tpi_front_check(const tpi_front *front, char *msg, size_t msg_capacity);

/* ---------------------------------------------------- the live map */

static inline uint32_t tpi_live_home_(const tpi_live_map *m, uint64_t offset) {
    return (uint32_t)((offset * 0x9E3779B97F4A7C15ull) >> m->shift);
}

/* Is there room for `more` blocks beyond count, the table kept at most a
 * quarter full? (A hit needs room for its one block: growing is the
 * locked path's.) */
static inline bool tpi_live_has_room(const tpi_live_map *m, uint32_t more) {
    return 4 * (m->count + more) <= m->capacity;
}

/* (No block starts at UINT64_MAX, the empty marker: a caller's pointer of
 * all ones must not find an empty entry.) */
static inline tpi_live_entry *tpi_live_find(tpi_live_map *m, uint64_t offset) {
    if (offset == UINT64_MAX) return NULL;
    if (m->newest.offset == offset) return &m->newest;
    if (!m->capacity) return NULL;
    for (uint32_t i = tpi_live_home_(m, offset);; i = (i + 1) & (m->capacity - 1)) {
        tpi_live_entry *e = &m->entries[i];
        if (e->offset == offset) return e;
        if (e->offset == UINT64_MAX) return NULL;
    }
}

/* Takes e (an entry of m) out: the newest slot emptied, or a table entry
 * out with the rest of its probe run shifted back. */
static inline void tpi_live_remove_entry(tpi_live_map *m, tpi_live_entry *e) {
    if (e == &m->newest) {
        m->newest.offset = UINT64_MAX;
        m->count--;
        return;
    }
    uint32_t mask = m->capacity - 1, hole = (uint32_t)(e - m->entries);
    for (uint32_t i = (hole + 1) & mask;; i = (i + 1) & mask) {
        tpi_live_entry *x = &m->entries[i];
        if (x->offset == UINT64_MAX) break;
        uint32_t home = tpi_live_home_(m, x->offset);
        /* x may move to the hole if its home is not in (hole, i] */
        if (((i - home) & mask) >= ((i - hole) & mask)) {
            m->entries[hole] = *x;
            hole = i;
        }
    }
    m->entries[hole].offset = UINT64_MAX;
    m->count--;
}

bool tpi_live_grow(const tpi_host *host, tpi_live_map *m);
void tpi_live_free(const tpi_host *host, tpi_live_map *m);

/* Puts entry in the table (its offset is not in the map; there is room). */
static inline void tpi_live_table_insert_(tpi_live_map *m, const tpi_live_entry *entry) {
    uint32_t i = tpi_live_home_(m, entry->offset);
    while (m->entries[i].offset != UINT64_MAX) i = (i + 1) & (m->capacity - 1);
    m->entries[i] = *entry;
}

/* Adds entry as the newest block, the previous newest moving into the table
 * (offset is not in the map; the table has room for one more). */
static inline void tpi_live_insert_(tpi_live_map *m, const tpi_live_entry *entry) {
    if (m->newest.offset != UINT64_MAX) tpi_live_table_insert_(m, &m->newest);
    m->newest = *entry;
    m->count++;
}

/* -------------------------------------------------------- the hit path */

/* In steps, each with fs's lock held (tpi_front_hit_enter) and none giving
 * it back, so that a caller can keep every call out of its common case
 * (pool.c: a function that makes no call that returns to it saves no
 * registers). The steps that call out say so. */

/* The front stream of a handle, locked, if the hit path may serve it;
 * NULL otherwise (the caller takes the locked path). wait false: NULL too
 * when someone holds its lock (the caller then asks again, waiting). */
static inline tpi_front_stream *tpi_front_hit_enter(tpi_front *f, tp_stream handle, bool wait) {
    uintptr_t key = (uintptr_t)handle + 1;
    tpi_front_way *ways = &f->lookup[(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 58) * TPI_FRONT_WAYS];
    for (tpi_front_way *w = ways; w < ways + TPI_FRONT_WAYS; w++) {
        if (atomic_load_explicit(&w->key, memory_order_relaxed) != key) continue;
        tpi_front_stream *fs = atomic_load_explicit(&w->stream, memory_order_acquire);
        if (!fs) return NULL;
        if (wait)
            tpi_front_stream_lock(fs);
        else if (!tpi_front_stream_trylock(fs))
            return NULL;
        /* The gate before anything of the stream's: under a raised gate the
         * world may be writing it. */
        if (!atomic_load_explicit(&f->world, memory_order_seq_cst) && fs->hits && fs->handle == handle) return fs;
        tpi_front_stream_unlock(fs);
        return NULL;
    }
    return NULL;
}

/* The newest block of bin b if it holds size bytes and wastes at most 1/8
 * of them, else NULL. (One unsigned test for both: a take asks in
 * bin(size) and the next, where a smaller block is smaller by less than
 * size / 16 -- a bin spans a sixteenth of its power of two -- so the
 * difference wraps far above size / 8.) */
static inline tpi_front_entry *tpi_front_bin_fit(tpi_front_stream *fs, uint32_t b, uint64_t size) {
    uint32_t count = fs->counts[b];
    if (!count) return NULL;
    tpi_front_entry *e = &fs->bins[b][count - 1];
    return e->size - size <= size / 8 ? e : NULL;
}

/* The bins' one rule for a request of size bytes, on the hit path and the
 * locked path alike: the newest block of bin(size), else of the next bin,
 * that fits (tpi_front_bin_fit), taken out of fs's bins; NULL if neither
 * has one. The entry stays readable until the bin's next put. */
static inline const tpi_front_entry *tpi_front_bin_take(const tpi_front *f, tpi_front_stream *fs, uint64_t size) {
    uint32_t b = tpi_ra_bin_of_units(size >> f->size_shift);
    tpi_front_entry *e = b < f->bin_count ? tpi_front_bin_fit(fs, b, size) : NULL;
    if (!e && (++b >= f->bin_count || !(e = tpi_front_bin_fit(fs, b, size)))) return NULL;
    fs->counts[b]--;
    fs->parked_bytes -= e->size;
    return e;
}

/* A hit allocation of size bytes (bytes asked): tpi_front_hit_pick, then
 * for the last-freed slot tpi_front_hit_take_slot (or, its block of
 * another size, tpi_front_hit_resize_slot), then
 * tpi_front_hit_record, then with the hazard checker tpi_front_hit_check.
 *
 * Pick (no call): false: the locked path (the live map must grow, or no
 * parked block of the stream fits). True: for a size the bins take, a
 * block of bin(size) or the next bin that holds size bytes and wastes at
 * most 1/8 of them, taken out of its bin into *out (*out_word
 * TPI_FRONT_SLOT_EMPTY), whatever the last-freed slot holds; for a larger
 * size, the slot's word in *out_word, naming this stream's block of size
 * bytes, which the next step takes if it lies in place -- or, where the
 * backing resizes blocks (VMM), of any size, which the next step resizes
 * if it can. */
static inline bool tpi_front_hit_pick(tpi_front *f, tpi_front_stream *fs, uint64_t size, uint64_t bytes,
                                      tpi_live_entry *out, uint64_t *out_word) {
    if (!tpi_live_has_room(&fs->live, 1)) return false; /* the live map must grow: the locked path */
    /* (Read before the size test although a bin's hit ignores it: so gcc
     * keeps one register fewer in tp_pool_alloc, a push and a pop a call.) */
    uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_acquire);
    if (size > f->max_block_bytes) {
        *out_word = word;
        return tpi_front_slot_word_names(word, fs->slot) && (f->slot_size == size || f->slot_resizes);
    }
    *out_word = TPI_FRONT_SLOT_EMPTY; /* a bin's block, whatever the slot holds: no placement, so it may stay */
    const tpi_front_entry *e = tpi_front_bin_take(f, fs, size);
    if (!e) return false;
    *out = (tpi_live_entry){e->offset, bytes, e->size, e->node, 0};
    return true;
}

/* Take the slot (calls the range allocator): its block, picked, if it lies
 * in place (into *out, with size and requested bytes as picked); false:
 * the locked path. "In place" is decided here, not at the free: the range
 * allocator it reads changes only under the world lock, which no hit runs
 * beside, so it is the same answer, and a pool whose sizes vary never pays
 * for it. */
static inline bool tpi_front_hit_take_slot(tpi_front *f, uint64_t size, uint64_t bytes, uint64_t word,
                                           tpi_live_entry *out) {
    /* The same block in the same epoch (a free X / alloc X loop with no
     * locked call in between): the range allocator has not moved, nor has
     * the answer. */
    uint32_t node = (uint32_t)word;
    if (f->in_place_epoch != f->world_epoch || f->in_place_node != node) {
        f->in_place = tpi_ra_release_lands_in_place(&f->core->ra, node, size);
        f->in_place_node = node;
        f->in_place_epoch = f->world_epoch;
    }
    if (!f->in_place) return false;
    /* The word names this stream, whose lock we hold: nobody else may
     * change it (other streams only fill an empty word) or its fields, so
     * a store empties it, no exchange needed. The fields are read first:
     * once the word is empty another stream may fill them. */
    *out = (tpi_live_entry){f->slot_offset, bytes, size, node, 0};
    atomic_store_explicit(&f->slot_word, TPI_FRONT_SLOT_EMPTY, memory_order_release);
    return true;
}

/* Resize the slot (calls the backing): the slot's block, picked, of
 * another size than size, resized to size where it lies when release and
 * placement would put it there (the backing's resize_block, as
 * tpi_front_pop does under the world lock), into *out; false: the locked
 * path. The range allocator and the pages it changes are otherwise the
 * world's: the world waits for fs's lock, and no other hit reads them (a
 * hit reads the range allocator only to take the slot's block, and only
 * while the word names its own stream -- here it names fs's), so fs's lock
 * is enough. A resize raises world_epoch: the range allocator moved (one
 * that fails leaves its ranges as they were, and the locked path does not
 * try it again: resize_failed_word). The word still names fs afterwards:
 * the caller reads what else the resize may have changed (the idle pages)
 * and then empties it (tpi_front_hit_slot_emptied), after which another
 * stream may fill the slot and resize its own block. */
bool tpi_front_hit_resize_slot(tpi_front *f, tpi_front_stream *fs, uint64_t size, uint64_t bytes, uint64_t word,
                               tpi_live_entry *out);
/* The slot's block taken (resized) by the stream the word names. */
static inline void tpi_front_hit_slot_emptied(tpi_front *f) {
    atomic_store_explicit(&f->slot_word, TPI_FRONT_SLOT_EMPTY, memory_order_release);
}

/* May this hit do the world's work on the range allocator, the units and
 * the last-freed slot -- place a block, give one back? Yes while the
 * pool has one front stream (fs, whose lock the caller holds: the world
 * waits for that lock, and no other hit runs) and has only ever known that
 * stream (slot 1 alone: every tag in the pool is clean or its own, so
 * placement asks the device nothing), on a backing that places without
 * the device (hit_places). (Read under the stream lock; written under the
 * world lock, which no hit runs beside.) */
static inline bool tpi_front_hit_alone(const tpi_front *f) {
    return f->hit_places && f->stream_count == 1 && f->core->order.stream_count == 2;
}

/* Place (calls the backing; tpi_front_hit_alone): for an allocation no
 * parked block served (the bins' miss, or a large one the slot did not
 * serve), what the locked path does (tpi_front_pop, then the ladder's
 * first try): the slot's block released, then room for size bytes found
 * in memory already mapped (try_alloc without growth), into *out. False
 * when that room would need new device memory (or host memory ran out):
 * the slot is released and nothing else changed, so the locked path finds
 * the same state and decides the same way. Raises world_epoch. The caller
 * gives the block a record (pool.c: node_has_record_locked) and works out
 * when upkeep is due: the units' idle bytes may have moved. */
bool tpi_front_hit_place(tpi_front *f, tpi_front_stream *fs, uint64_t size, uint64_t bytes, tpi_live_entry *out);

/* Record (no call): the block taken, live on the stream and counted. */
static inline void tpi_front_hit_record(tpi_front_stream *fs, const tpi_live_entry *block) {
    tpi_stats_local *st = &fs->stats;
    tpi_live_insert_(&fs->live, block); /* room checked by the pick */
    tpi_stats_local_allocated_rise(st, block->size);
    tpi_stats_local_requested_rise(st, block->requested);
    st->requested_total += block->requested;
    st->allocs++;
}

/* Whether a hit must go by the hazard checker although the pool's extras
 * leave it out (pool.c): the device counts work a hand-out could conflict
 * with, and some is pending. (Relaxed, as the checker's own early return:
 * work queued meanwhile on another thread is ordered after the hand-out.) */
static inline bool tpi_front_hazard_work_pending(const tpi_front *f) {
    return f->hazard_work && atomic_load_explicit(f->hazard_work, memory_order_relaxed);
}

/* Check (calls the device): the block shown to the hazard checker. */
static inline void tpi_front_hit_check(tpi_front *f, tpi_front_stream *fs, uint64_t offset, uint64_t size,
                                       tp_stream stream) {
    tpi_core *core = f->core;
    fs->stats.hazards += core->ops->check_handout(core->device, offset, size, stream);
}

/* A hit free of address, fs's upkeep not due (frees_to_upkeep above 1:
 * the caller's test): tpi_front_hit_free_find, then
 * tpi_front_hit_park_bins or (a block above max_block_bytes)
 * tpi_front_hit_park_slot, then tpi_front_hit_freed.
 *
 * Find (no call): the live entry of address on this stream, unpinned;
 * NULL: the locked path. */
static inline tpi_live_entry *tpi_front_hit_free_find(tpi_front_stream *fs, uint64_t address) {
    tpi_live_entry *e = tpi_live_find(&fs->live, address);
    return e && !e->pins ? e : NULL;
}

/* Park in the bins (no call); false: the locked path. */
static inline bool tpi_front_hit_park_bins(tpi_front *f, tpi_front_stream *fs, const tpi_live_entry *e) {
    /* The stream's bins hold at most limit_bytes, its last-freed block
     * included where slot_in_limit says so (which a locked call may be
     * filling: not a hit then). */
    uint64_t size = e->size, slot_bytes = 0;
    if (f->slot_in_limit) {
        uint64_t word = atomic_load_explicit(&f->slot_word, memory_order_acquire);
        if (word == TPI_FRONT_SLOT_FILLING) return false;
        if (tpi_front_slot_word_names(word, fs->slot)) slot_bytes = f->slot_size;
    }
    if (fs->parked_bytes + slot_bytes + size > f->limit_bytes) return false;
    uint32_t b = tpi_ra_bin_of_units(size >> f->size_shift);
    uint8_t count = fs->counts[b];
    if (count == TPI_FRONT_DEPTH) return false;
    fs->bins[b][count] = (tpi_front_entry){e->offset, size, tpi_order_note_free(&f->core->order, fs->slot), e->node};
    fs->counts[b] = (uint8_t)(count + 1);
    fs->parked_bytes += size;
    return true;
}

/* Park in the empty last-freed slot (reads the device's clock); false:
 * the locked path. */
static inline bool tpi_front_hit_park_slot(tpi_front *f, tpi_front_stream *fs, const tpi_live_entry *e) {
    tpi_core *core = f->core;
    if (f->stream_count == 1) {
        /* The only front stream, whose lock we hold: nobody else can
         * reach the word (every other caller takes the world lock), so
         * it is read and written plainly, no exchange needed. */
        if (atomic_load_explicit(&f->slot_word, memory_order_relaxed) != TPI_FRONT_SLOT_EMPTY) return false;
    } else {
        uint64_t empty = TPI_FRONT_SLOT_EMPTY;
        if (!atomic_compare_exchange_strong_explicit(&f->slot_word, &empty, TPI_FRONT_SLOT_FILLING,
                                                     memory_order_acquire, memory_order_relaxed))
            return false; /* occupied: releasing its block is the locked path's */
    }
    f->slot_offset = e->offset;
    f->slot_size = e->size;
    f->slot_freed_ns = tpi_units_now(&core->units);
    f->slot_tag = tpi_order_note_free(&core->order, fs->slot);
    atomic_store_explicit(&f->slot_word, ((uint64_t)fs->slot << 32) | e->node, memory_order_release);
    return true;
}

/* Park in the slot over the block there (calls the backing;
 * tpi_front_hit_alone, and the word names fs, not FILLING): that block
 * released, as the locked path's tpi_front_push releases it, then e parked
 * in its place. Raises world_epoch. The caller works out when upkeep is
 * due (the released block's units may be idle now). */
void tpi_front_hit_park_slot_over(tpi_front *f, tpi_front_stream *fs, const tpi_live_entry *e);

/* Give back (calls the backing; tpi_front_hit_alone): a block the bins
 * cannot take (full, or over limit_bytes) released to the backing as the
 * locked path releases it, tagged with the free. Raises world_epoch. The
 * caller counts it freed (tpi_front_hit_freed) and works out when upkeep
 * is due. */
void tpi_front_hit_release(tpi_front *f, tpi_front_stream *fs, const tpi_live_entry *e);

/* Freed (no call): the parked block counted and out of the live map. */
static inline void tpi_front_hit_freed(tpi_front_stream *fs, tpi_live_entry *e) {
    tpi_stats_local *st = &fs->stats;
    tpi_stats_local_allocated_fall(st, e->size);
    tpi_stats_local_requested_fall(st, e->requested);
    st->cached_total += e->size;
    st->frees++;
    fs->frees_to_upkeep--;
    tpi_live_remove_entry(&fs->live, e);
}

#endif /* TIDEPOOL_FRONT_CACHE_H */
