/* SPDX-License-Identifier: MIT */
/*
 * tpi_map.h -- the one hash map of the project: 64-bit keys to 64-bit
 * values. Used by the pool (block start -> range node), the CUDA backend
 * (page address -> physical handle), the graph cache (key -> executable),
 * the replay tool (traced address -> live block) and the PyTorch shim
 * (pointer -> stream uses). Header-only and internal: it lives outside
 * src/ so that tools and integrations can use it without reaching into the
 * library, and its names (tpi_) are not part of the public API.
 *
 * Algorithm: open addressing with linear probing over a power-of-two table
 * of {key, value} entries, at most half full; the top bits of a
 * Fibonacci hash of the key pick the home slot (so keys that differ only
 * in high bits, like page-aligned addresses, still spread). Deletion shifts later entries of the probe run back
 * (no tombstones), so lookups stay short however many keys come and go;
 * the table halves when it is less than 1/8 full. Every key is allowed:
 * the key that marks an empty slot (TPI_MAP_EMPTY) is kept beside the
 * table.
 *
 * Invariants: every stored key is reachable from its home slot without
 * crossing an empty slot; count equals the stored keys (the side entry
 * included); capacity is 0 or a power of two >= TPI_MAP_MIN_CAPACITY.
 *
 * Host memory comes from a tp_host_allocator whose three functions are all
 * set (the library's own, or libc's through tpi_map_libc_allocator).
 * Not thread-safe: the owner locks.
 */
#ifndef TIDEPOOL_TPI_MAP_H
#define TIDEPOOL_TPI_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "tidepool.h"

#define TPI_MAP_EMPTY UINT64_MAX
#define TPI_MAP_MIN_CAPACITY 64u

typedef struct tpi_map_entry {
    uint64_t key; /* TPI_MAP_EMPTY: free slot */
    uint64_t value;
} tpi_map_entry;

typedef struct tpi_map {
    tpi_map_entry *entries;
    size_t capacity; /* slots; 0 before the first insert */
    unsigned shift;  /* 64 - log2(capacity) */
    size_t count;    /* keys stored, the side entry included */
    bool has_empty_key;
    uint64_t empty_key_value; /* value of key TPI_MAP_EMPTY when stored */
    const tp_host_allocator *host;
} tpi_map;

static inline void *tpi_map_libc_alloc_(void *user, size_t bytes) {
    (void)user;
    return malloc(bytes);
}
static inline void *tpi_map_libc_realloc_(void *user, void *ptr, size_t old_bytes, size_t new_bytes) {
    (void)user;
    (void)old_bytes;
    return realloc(ptr, new_bytes);
}
static inline void tpi_map_libc_free_(void *user, void *ptr, size_t bytes) {
    (void)user;
    (void)bytes;
    free(ptr);
}
/* libc as a tp_host_allocator, for users outside the library. */
static const tp_host_allocator tpi_map_libc_allocator = {tpi_map_libc_alloc_, tpi_map_libc_realloc_,
                                                         tpi_map_libc_free_, NULL};

static inline void tpi_map_init(tpi_map *m, const tp_host_allocator *host) {
    memset(m, 0, sizeof *m);
    m->host = host ? host : &tpi_map_libc_allocator;
}

static inline void tpi_map_destroy(tpi_map *m) {
    if (m->entries) m->host->free(m->host->user, m->entries, m->capacity * sizeof *m->entries);
    m->entries = NULL;
    m->capacity = m->count = 0;
    m->has_empty_key = false;
}

static inline size_t tpi_map_home_(const tpi_map *m, uint64_t key) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> m->shift);
}

/* Slot of key in the table, or capacity when absent (key != EMPTY). */
static inline size_t tpi_map_slot_(const tpi_map *m, uint64_t key) {
    if (!m->capacity) return 0;
    for (size_t i = tpi_map_home_(m, key);; i = (i + 1) & (m->capacity - 1)) {
        if (m->entries[i].key == key) return i;
        if (m->entries[i].key == TPI_MAP_EMPTY) return m->capacity;
    }
}

/* Pointer to key's value (valid until the next put or remove), or NULL. */
static inline uint64_t *tpi_map_find(tpi_map *m, uint64_t key) {
    if (key == TPI_MAP_EMPTY) return m->has_empty_key ? &m->empty_key_value : NULL;
    size_t i = tpi_map_slot_(m, key);
    return i < m->capacity ? &m->entries[i].value : NULL;
}

static inline bool tpi_map_get(const tpi_map *m, uint64_t key, uint64_t *out_value) {
    uint64_t *v = tpi_map_find((tpi_map *)m, key);
    if (v && out_value) *out_value = *v;
    return v != NULL;
}

/* Moves every entry into a table of new_capacity slots. */
static inline bool tpi_map_rehash_(tpi_map *m, size_t new_capacity) {
    tpi_map_entry *entries = m->host->alloc(m->host->user, new_capacity * sizeof *entries);
    if (!entries) return false;
    for (size_t i = 0; i < new_capacity; i++) entries[i].key = TPI_MAP_EMPTY;
    tpi_map grown = *m;
    grown.entries = entries;
    grown.capacity = new_capacity;
    grown.shift = 64u - (unsigned)__builtin_ctzll((unsigned long long)new_capacity);
    for (size_t i = 0; i < m->capacity; i++) {
        if (m->entries[i].key == TPI_MAP_EMPTY) continue;
        size_t j = tpi_map_home_(&grown, m->entries[i].key);
        while (entries[j].key != TPI_MAP_EMPTY) j = (j + 1) & (new_capacity - 1);
        entries[j] = m->entries[i];
    }
    if (m->entries) m->host->free(m->host->user, m->entries, m->capacity * sizeof *m->entries);
    m->entries = entries;
    m->capacity = new_capacity;
    m->shift = grown.shift;
    return true;
}

/* Makes room for `count` keys in all without a further allocation. */
static inline bool tpi_map_reserve(tpi_map *m, size_t count) {
    size_t capacity = m->capacity ? m->capacity : TPI_MAP_MIN_CAPACITY;
    while (count * 2 > capacity) {
        if (capacity > SIZE_MAX / 2 / sizeof(tpi_map_entry)) return false;
        capacity *= 2;
    }
    return capacity == m->capacity || tpi_map_rehash_(m, capacity);
}

/* Inserts key or replaces its value. False (map unchanged) when host
 * memory runs out. */
static inline bool tpi_map_put(tpi_map *m, uint64_t key, uint64_t value) {
    if (key == TPI_MAP_EMPTY) {
        if (!m->has_empty_key) m->count++;
        m->has_empty_key = true;
        m->empty_key_value = value;
        return true;
    }
    if (!tpi_map_reserve(m, m->count + 1)) return false;
    size_t i = tpi_map_home_(m, key);
    while (m->entries[i].key != TPI_MAP_EMPTY && m->entries[i].key != key) i = (i + 1) & (m->capacity - 1);
    if (m->entries[i].key == TPI_MAP_EMPTY) m->count++;
    m->entries[i] = (tpi_map_entry){key, value};
    return true;
}

/* Removes key; its value goes to *out_value (may be NULL). False when
 * absent. */
static inline bool tpi_map_remove(tpi_map *m, uint64_t key, uint64_t *out_value) {
    if (key == TPI_MAP_EMPTY) {
        if (!m->has_empty_key) return false;
        if (out_value) *out_value = m->empty_key_value;
        m->has_empty_key = false;
        m->count--;
        return true;
    }
    size_t i = tpi_map_slot_(m, key);
    if (i >= m->capacity) return false;
    if (out_value) *out_value = m->entries[i].value;
    size_t mask = m->capacity - 1, hole = i;
    for (size_t j = (hole + 1) & mask; m->entries[j].key != TPI_MAP_EMPTY; j = (j + 1) & mask) {
        size_t home = tpi_map_home_(m, m->entries[j].key);
        /* entry j may fill the hole if the hole lies on its probe path [home, j] */
        bool movable = (j > hole) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->entries[hole] = m->entries[j];
            hole = j;
        }
    }
    m->entries[hole].key = TPI_MAP_EMPTY;
    m->count--;
    if (m->capacity > TPI_MAP_MIN_CAPACITY && m->count * 8 < m->capacity) tpi_map_rehash_(m, m->capacity / 2);
    return true;
}

/* Iteration in no particular order: start with *cursor = 0; returns false
 * once every key was visited. No put or remove in between. */
static inline bool tpi_map_next(const tpi_map *m, size_t *cursor, uint64_t *out_key, uint64_t *out_value) {
    while (*cursor < m->capacity) {
        const tpi_map_entry *e = &m->entries[(*cursor)++];
        if (e->key == TPI_MAP_EMPTY) continue;
        if (out_key) *out_key = e->key;
        if (out_value) *out_value = e->value;
        return true;
    }
    if (*cursor == m->capacity && m->has_empty_key) {
        (*cursor)++;
        if (out_key) *out_key = TPI_MAP_EMPTY;
        if (out_value) *out_value = m->empty_key_value;
        return true;
    }
    return false;
}

#endif /* TIDEPOOL_TPI_MAP_H */
