/* SPDX-License-Identifier: MIT */
/*
 * torch_model.c -- models of PyTorch's CUDA caching allocator, so that any
 * trace can be held against the allocator most users run, without a GPU or
 * PyTorch: "torch-default" (its default settings) and "torch-expandable"
 * (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) in tide replay.
 *
 * The rules modelled (PyTorch 2.x; no max_split_size, no garbage collection
 * threshold, no roundup divisions), in our own words:
 *
 *  - A request of n bytes is rounded up to a multiple of 512 (512 at least).
 *  - Requests of at most 1 MiB come from the small pool, larger ones from
 *    the large pool. Each pool keeps its free blocks ordered by (stream,
 *    size, address); a request takes the smallest free block of its own
 *    stream that holds it (the lowest address among equal sizes). A block
 *    is only ever reused on the stream it was first allocated on.
 *  - A block larger than the request is split, the request at its start:
 *    by default when the rest is at least 512 bytes (small pool) or more
 *    than 1 MiB (large pool), with expandable segments whenever it is at
 *    least 512 bytes. Otherwise the whole block is handed out.
 *  - A freed block merges with the free blocks before and after it in its
 *    segment and goes back to its pool. Nothing goes back to the device
 *    except when the device is full (PyTorch keeps its cache until
 *    empty_cache).
 *
 * Default: with no free block that fits, the pool mallocs a new segment:
 * 2 MiB for a small request, 20 MiB for a request below 10 MiB, else the
 * request rounded up to 2 MiB. If that malloc fails it frees every free
 * block that is a whole segment (both pools, every stream) and retries once;
 * a second failure is out of memory. Held bytes are the segments' bytes.
 *
 * Expandable segments: each (stream, pool) gets one large reservation of
 * address space (1 1/8 of the device), mapped in pages of 2 MiB (small
 * pool) or 20 MiB (large pool); free address space is kept as unmapped
 * blocks. The best-fit search above prefers, among the blocks it may take,
 * ones with less unmapped space right after them. With no free block that
 * fits, the lowest-addressed unmapped block of the stream that, with the
 * free block just before it and those after it, holds the request is
 * mapped as far as needed (whole pages) and merged with that free block;
 * each such mapping counts as one device allocation. When mapping fails,
 * every free block's whole pages are unmapped and the allocation retried
 * once. Held bytes are the mapped pages.
 *
 * Checked against PyTorch's own counters (docs/results.md): both models
 * reproduce their reserved peaks and device-allocation counts on the three
 * recorded traces.
 *
 * Data structures: blocks live in one array (indices, a free list of
 * unused entries), linked to their neighbours in the segment; each pool's
 * free mapped blocks form a treap keyed by (stream, size, address) for the
 * smallest-fit search, its unmapped blocks one keyed by (stream, address);
 * live blocks are found by address in a hash map.
 */
#include "replay.h"

#include "tide.h"
#include "tpi_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TORCH_MIN_BLOCK_BYTES 512ull
#define TORCH_SMALL_BYTES (1ull << 20)        /* at most this: the small pool */
#define TORCH_SMALL_SEGMENT_BYTES (2ull << 20) /* a small pool's segment, and its expandable page */
#define TORCH_MIN_LARGE_ALLOC_BYTES (10ull << 20)
#define TORCH_LARGE_SEGMENT_BYTES (20ull << 20) /* a segment for requests of 1-10 MiB; the large expandable page */
#define TORCH_ROUND_LARGE_BYTES (2ull << 20)

#define NONE UINT32_MAX

typedef struct torch_block {
    uint64_t address, size;
    tp_stream stream;
    uint32_t prev, next;        /* neighbours in the segment, NONE at its ends */
    uint32_t kid[2], prio;      /* the treap the block is in, while free: lesser [0], greater [1] */
    uint32_t segment;           /* expandable: its segment; NONE otherwise */
    uint8_t small, allocated, used, mapped; /* used: the entry holds a block */
} torch_block;

/* An expandable segment: a reservation mapped page by page. */
typedef struct torch_segment {
    uint64_t base, bytes, page_bytes;
} torch_segment;

typedef struct torch_pool {
    tp_device *device;
    bool expandable;
    torch_block *blocks;
    uint32_t block_count, block_capacity, unused; /* unused: first unused entry (chained by next) */
    uint32_t roots[2];          /* free mapped blocks of the large [0] and small [1] pool */
    uint32_t unmapped_roots[2]; /* expandable: unmapped blocks, likewise */
    torch_segment *segments;
    uint32_t segment_count, segment_capacity;
    uint64_t capacity_bytes; /* the device's, for an expandable reservation */
    uint64_t reserved_bytes, peak_reserved_bytes, free_bytes;
    uint64_t device_calls, device_allocs, device_frees;
    uint64_t oom_retries, oom_recoveries; /* retries after emptying the cache; those that succeeded */
    uint64_t rng;
    tpi_map live; /* address -> block index */
    char last_oom[256];
} torch_pool;

/* ------------------------------------------------------------ the treaps */

/* Free mapped blocks order as PyTorch's pools do: stream, size, address.
 * Unmapped blocks by stream and address (by_size false). */
static int block_cmp(const torch_block *a, tp_stream stream, uint64_t size, uint64_t address, bool by_size) {
    if ((uintptr_t)a->stream != (uintptr_t)stream) return (uintptr_t)a->stream < (uintptr_t)stream ? -1 : 1;
    if (by_size && a->size != size) return a->size < size ? -1 : 1;
    if (a->address != address) return a->address < address ? -1 : 1;
    return 0;
}

static uint32_t treap_insert(torch_block *b, uint32_t root, uint32_t id, bool by_size) {
    if (root == NONE) return id;
    int side = block_cmp(&b[id], b[root].stream, b[root].size, b[root].address, by_size) >= 0;
    uint32_t child = b[root].kid[side] = treap_insert(b, b[root].kid[side], id, by_size);
    if (b[child].prio <= b[root].prio) return root;
    b[root].kid[side] = b[child].kid[!side]; /* rotate the child up */
    b[child].kid[!side] = root;
    return child;
}

static uint32_t treap_merge(torch_block *b, uint32_t l, uint32_t r) {
    if (l == NONE) return r;
    if (r == NONE) return l;
    if (b[l].prio > b[r].prio) {
        b[l].kid[1] = treap_merge(b, b[l].kid[1], r);
        return l;
    }
    b[r].kid[0] = treap_merge(b, l, b[r].kid[0]);
    return r;
}

static uint32_t treap_remove(torch_block *b, uint32_t root, uint32_t id, bool by_size) {
    if (root == id) return treap_merge(b, b[id].kid[0], b[id].kid[1]);
    int side = block_cmp(&b[id], b[root].stream, b[root].size, b[root].address, by_size) >= 0;
    b[root].kid[side] = treap_remove(b, b[root].kid[side], id, by_size);
    return root;
}

/* The first block at or after the key (stream, size, address), or NONE. */
static uint32_t treap_lower_bound(const torch_block *b, uint32_t root, tp_stream stream, uint64_t size,
                                  uint64_t address, bool by_size) {
    uint32_t found = NONE;
    while (root != NONE) {
        if (block_cmp(&b[root], stream, size, address, by_size) >= 0) {
            found = root;
            root = b[root].kid[0];
        } else {
            root = b[root].kid[1];
        }
    }
    return found;
}

/* The block after id (which is in the treap), or NONE. */
static uint32_t treap_successor(const torch_block *b, uint32_t root, uint32_t id, bool by_size) {
    uint32_t found = NONE;
    while (root != NONE) {
        if (block_cmp(&b[root], b[id].stream, b[id].size, b[id].address, by_size) > 0) {
            found = root;
            root = b[root].kid[0];
        } else {
            root = b[root].kid[1];
        }
    }
    return found;
}

/* -------------------------------------------------------------- blocks */

/* Room for count more blocks, so that the next count block_new calls
 * cannot fail; false without host memory. */
static bool blocks_reserve(torch_pool *p, uint32_t count) {
    if (p->block_capacity - p->block_count >= count) return true;
    uint32_t capacity = p->block_capacity ? 2 * p->block_capacity : 256;
    while (capacity - p->block_count < count) capacity *= 2;
    torch_block *blocks = realloc(p->blocks, (size_t)capacity * sizeof *blocks);
    if (!blocks) return false;
    p->blocks = blocks;
    p->block_capacity = capacity;
    return true;
}

static uint32_t block_new(torch_pool *p) {
    if (p->unused != NONE) {
        uint32_t id = p->unused;
        p->unused = p->blocks[id].next;
        return id;
    }
    if (!blocks_reserve(p, 1)) return NONE;
    return p->block_count++;
}

static void block_drop(torch_pool *p, uint32_t id) {
    p->blocks[id].used = 0;
    p->blocks[id].next = p->unused;
    p->unused = id;
}

static uint32_t next_prio(torch_pool *p) {
    p->rng = p->rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(p->rng >> 33);
}

/* A free block into its pool's treap: mapped blocks by size, unmapped ones
 * by address. */
static void pool_insert(torch_pool *p, uint32_t id) {
    torch_block *x = &p->blocks[id];
    x->kid[0] = x->kid[1] = NONE;
    x->prio = next_prio(p);
    if (x->mapped) {
        p->roots[x->small] = treap_insert(p->blocks, p->roots[x->small], id, true);
        p->free_bytes += x->size;
    } else {
        p->unmapped_roots[x->small] = treap_insert(p->blocks, p->unmapped_roots[x->small], id, false);
    }
}

static void pool_remove(torch_pool *p, uint32_t id) {
    torch_block *x = &p->blocks[id];
    if (x->mapped) {
        p->roots[x->small] = treap_remove(p->blocks, p->roots[x->small], id, true);
        p->free_bytes -= x->size;
    } else {
        p->unmapped_roots[x->small] = treap_remove(p->blocks, p->unmapped_roots[x->small], id, false);
    }
}

/* Merges free neighbour n of block id (which is in no treap) into it, when
 * n is free and mapped as id is; n leaves its treap. */
static void merge_neighbour(torch_pool *p, uint32_t id, uint32_t n) {
    if (n == NONE || p->blocks[n].allocated || p->blocks[n].mapped != p->blocks[id].mapped) return;
    pool_remove(p, n);
    torch_block *x = &p->blocks[id], *y = &p->blocks[n];
    if (y->address < x->address) {
        x->address = y->address;
        x->prev = y->prev;
        if (x->prev != NONE) p->blocks[x->prev].next = id;
    } else {
        x->next = y->next;
        if (x->next != NONE) p->blocks[x->next].prev = id;
    }
    x->size += y->size;
    block_drop(p, n);
}

/* Cuts block id (in no treap) at size: id keeps [address, +size), a new
 * block after it gets the rest, free, in the same state and treap-less.
 * Returns the new block, or NONE without host memory. */
static uint32_t cut(torch_pool *p, uint32_t id, uint64_t size) {
    uint32_t tail = block_new(p); /* (after blocks_reserve: cannot fail) */
    if (tail == NONE) return NONE;
    torch_block *x = &p->blocks[id];
    p->blocks[tail] = (torch_block){x->address + size, x->size - size, x->stream, id, x->next, {NONE, NONE}, 0,
                                    x->segment, x->small, 0, 1, x->mapped};
    if (x->next != NONE) p->blocks[x->next].prev = tail;
    x->next = tail;
    x->size = size;
    return tail;
}

/* ---------------------------------------------------------- the device */

static tp_status segment_malloc(torch_pool *p, uint64_t bytes, uint64_t *out_address) {
    p->device_calls++;
    tp_status st = tp_device_mem_alloc(p->device, bytes, out_address);
    if (st != TP_OK) return st;
    p->device_allocs++;
    p->reserved_bytes += bytes;
    if (p->reserved_bytes > p->peak_reserved_bytes) p->peak_reserved_bytes = p->reserved_bytes;
    return TP_OK;
}

/* Default: frees every free block that is a whole segment, in both pools
 * (PyTorch's release_cached_blocks); returns how many. */
static unsigned release_cached_segments(torch_pool *p) {
    unsigned released = 0;
    for (uint32_t id = 0; id < p->block_count; id++) {
        torch_block *x = &p->blocks[id];
        if (!x->used || x->allocated || x->prev != NONE || x->next != NONE) continue;
        pool_remove(p, id);
        p->device_calls++;
        if (tp_device_mem_free(p->device, x->address, x->size) == TP_OK) {
            p->device_frees++;
            p->reserved_bytes -= x->size;
        }
        block_drop(p, id);
        released++;
    }
    return released;
}

/* Expandable: maps the pages under [block id's start, +size) (id unmapped,
 * in its treap, starting on a page); the mapped part becomes a free mapped
 * block merged with its free neighbours, in the free treap; the rest stays
 * unmapped. Returns the merged block, or NONE (the device is full, or no
 * host memory) with nothing changed. */
static uint32_t map_block(torch_pool *p, uint32_t id, uint64_t size) {
    torch_block *x = &p->blocks[id];
    const torch_segment *s = &p->segments[x->segment];
    uint64_t end = x->address + size;
    uint64_t mapped = (end - s->base + s->page_bytes - 1) / s->page_bytes * s->page_bytes - (x->address - s->base);
    if (mapped > x->size) mapped = x->size;
    bool split = mapped < x->size;
    if (!blocks_reserve(p, 1)) return NONE;
    uint32_t rest = split ? block_new(p) : NONE; /* (cannot fail: reserved) */
    x = &p->blocks[id];
    p->device_calls++;
    if (tp_device_map(p->device, x->address, mapped) != TP_OK) {
        if (rest != NONE) block_drop(p, rest);
        return NONE;
    }
    p->device_allocs++;
    p->reserved_bytes += mapped;
    if (p->reserved_bytes > p->peak_reserved_bytes) p->peak_reserved_bytes = p->reserved_bytes;
    pool_remove(p, id);
    if (rest != NONE) {
        p->blocks[rest] = (torch_block){x->address + mapped, x->size - mapped, x->stream, id, x->next, {NONE, NONE}, 0,
                                        x->segment, x->small, 0, 1, 0};
        if (x->next != NONE) p->blocks[x->next].prev = rest;
        x->next = rest;
        x->size = mapped;
        pool_insert(p, rest);
    }
    p->blocks[id].mapped = 1;
    merge_neighbour(p, id, p->blocks[id].prev);
    merge_neighbour(p, id, p->blocks[id].next);
    pool_insert(p, id);
    return id;
}

/* Expandable: the lowest-addressed unmapped block of stream in the pool
 * that, starting from the free block just before it if any, has room for
 * size bytes in free and unmapped blocks; a new segment's when none has.
 * NONE: no address space or host memory. */
static uint32_t find_expandable_block(torch_pool *p, tp_stream stream, uint8_t small, uint64_t size) {
    const torch_block *b = p->blocks;
    uint32_t root = p->unmapped_roots[small];
    for (uint32_t c = treap_lower_bound(b, root, stream, 0, 0, false); c != NONE && b[c].stream == stream;
         c = treap_successor(b, root, c, false)) {
        uint32_t start = c;
        if (b[c].prev != NONE && !b[b[c].prev].allocated) start = b[c].prev;
        uint64_t room = 0;
        for (uint32_t at = start; at != NONE && !b[at].allocated && room < size; at = b[at].next) room += b[at].size;
        if (room >= size) return start;
    }
    if (p->segment_count == p->segment_capacity) {
        uint32_t capacity = p->segment_capacity ? 2 * p->segment_capacity : 4;
        torch_segment *segments = realloc(p->segments, (size_t)capacity * sizeof *segments);
        if (!segments) return NONE;
        p->segments = segments;
        p->segment_capacity = capacity;
    }
    uint64_t page = small ? TORCH_SMALL_SEGMENT_BYTES : TORCH_LARGE_SEGMENT_BYTES;
    uint64_t want = p->capacity_bytes + p->capacity_bytes / 8;
    uint64_t pages = want / page + (want % page != 0);
    torch_segment s = {0, pages * page, page};
    /* A request larger than a whole reservation can never be mapped: no
     * reservation for it (PyTorch makes one and fails to map it; each such
     * request would leave one more behind to search). */
    if (size > s.bytes) return NONE;
    uint32_t id = block_new(p);
    if (id == NONE) return NONE;
    p->device_calls++;
    if (tp_device_va_reserve(p->device, s.bytes, 0, &s.base) != TP_OK) {
        block_drop(p, id);
        return NONE;
    }
    p->segments[p->segment_count] = s;
    p->blocks[id] = (torch_block){s.base, s.bytes, stream, NONE, NONE, {NONE, NONE}, 0, p->segment_count++, small, 0, 1, 0};
    pool_insert(p, id);
    return id;
}

/* Expandable: a free mapped block of at least size bytes, mapped for the
 * request, out of its treap; NONE when the device is full. */
static uint32_t allocate_expandable(torch_pool *p, tp_stream stream, uint8_t small, uint64_t size) {
    uint32_t candidate = find_expandable_block(p, stream, small, size);
    if (candidate == NONE) return NONE;
    if (!p->blocks[candidate].mapped) {
        uint64_t want = p->blocks[candidate].size < size ? p->blocks[candidate].size : size;
        if ((candidate = map_block(p, candidate, want)) == NONE) return NONE;
    }
    while (p->blocks[candidate].size < size) { /* free, then unmapped, after it */
        uint32_t next = p->blocks[candidate].next;
        uint64_t remaining = size - p->blocks[candidate].size;
        uint64_t want = p->blocks[next].size < remaining ? p->blocks[next].size : remaining;
        if ((candidate = map_block(p, next, want)) == NONE) return NONE;
    }
    pool_remove(p, candidate);
    return candidate;
}

/* Expandable: unmaps the whole pages of every free mapped block (PyTorch's
 * release_cached_blocks with expandable segments); returns the bytes. */
static uint64_t unmap_free_pages(torch_pool *p) {
    uint64_t released = 0;
    for (uint32_t id = 0; id < p->block_count; id++) {
        torch_block *x = &p->blocks[id];
        if (!x->used || x->allocated || !x->mapped) continue;
        const torch_segment *s = &p->segments[x->segment];
        uint64_t first = (x->address - s->base + s->page_bytes - 1) / s->page_bytes * s->page_bytes + s->base;
        uint64_t last = (x->address + x->size - s->base) / s->page_bytes * s->page_bytes + s->base;
        if (first >= last || !blocks_reserve(p, 2)) continue; /* (the cuts below cannot fail) */
        p->device_calls++;
        if (tp_device_unmap(p->device, first, last - first) != TP_OK) continue;
        p->device_frees++;
        p->reserved_bytes -= last - first;
        released += last - first;
        pool_remove(p, id);
        uint32_t middle = id;
        if (first > p->blocks[id].address) { /* a mapped head stays */
            middle = cut(p, id, first - p->blocks[id].address);
            pool_insert(p, id);
        }
        if (p->blocks[middle].address + p->blocks[middle].size > last) /* a mapped tail stays */
            pool_insert(p, cut(p, middle, last - first));
        p->blocks[middle].mapped = 0;
        merge_neighbour(p, middle, p->blocks[middle].prev);
        merge_neighbour(p, middle, p->blocks[middle].next);
        pool_insert(p, middle);
    }
    return released;
}

/* ------------------------------------------------------------ the pool */

static void *torch_create_common(tp_device *device, bool expandable) {
    torch_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->device = device;
    p->expandable = expandable;
    p->unused = NONE;
    p->roots[0] = p->roots[1] = p->unmapped_roots[0] = p->unmapped_roots[1] = NONE;
    p->rng = 0x746f726368ull;
    uint64_t free_bytes = 0;
    tp_device_mem_info(device, &free_bytes, &p->capacity_bytes);
    tpi_map_init(&p->live, NULL);
    return p;
}

static void *torch_create(tp_device *device, const tp_pool_config *config, char *err, size_t cap) {
    (void)config;
    (void)err;
    (void)cap;
    return torch_create_common(device, false);
}

static void *torch_expandable_create(tp_device *device, const tp_pool_config *config, char *err, size_t cap) {
    (void)config;
    (void)err;
    (void)cap;
    return torch_create_common(device, true);
}

/* Default: a new segment's block for a request of size bytes; NONE with
 * *out_status set when the device (even after the cache went back) or the
 * host has no room. */
static uint32_t new_segment_block(torch_pool *p, tp_stream stream, uint8_t small, uint64_t size,
                                  replay_status *out_status) {
    uint64_t segment = small                                  ? TORCH_SMALL_SEGMENT_BYTES
                       : size < TORCH_MIN_LARGE_ALLOC_BYTES ? TORCH_LARGE_SEGMENT_BYTES
                                                              : (size + TORCH_ROUND_LARGE_BYTES - 1) /
                                                                    TORCH_ROUND_LARGE_BYTES * TORCH_ROUND_LARGE_BYTES;
    uint64_t address = 0;
    tp_status st = segment_malloc(p, segment, &address);
    if (st == TP_ERR_OUT_OF_MEMORY) {
        /* empty the cache of whole free segments and retry once */
        tp_device_synchronize(p->device);
        unsigned released = release_cached_segments(p);
        st = segment_malloc(p, segment, &address);
        p->oom_retries++;
        char want[32], held[32];
        snprintf(p->last_oom, sizeof p->last_oom,
                 "cudaMalloc of a %s segment failed; the allocator freed its %u cached segments and the retry %s "
                 "(%s held)",
                 tp_format_bytes(segment, want, sizeof want), released,
                 st == TP_OK ? "succeeded" : "failed: out of memory", tp_format_bytes(p->reserved_bytes, held, sizeof held));
        if (st == TP_OK) {
            *out_status = REPLAY_RECOVERED;
            p->oom_recoveries++;
        }
    }
    if (st != TP_OK) {
        *out_status = st == TP_ERR_OUT_OF_MEMORY ? REPLAY_OOM : REPLAY_ERROR;
        return NONE;
    }
    uint32_t id = block_new(p);
    if (id == NONE) {
        *out_status = REPLAY_ERROR;
        return NONE;
    }
    p->blocks[id] = (torch_block){address, segment, stream, NONE, NONE, {NONE, NONE}, 0, NONE, small, 0, 1, 1};
    return id;
}

/* Expandable: the request's block mapped where it fits; when the device is
 * full, every free page unmapped and one retry. */
static uint32_t new_expandable_block(torch_pool *p, tp_stream stream, uint8_t small, uint64_t size,
                                     replay_status *out_status) {
    uint32_t id = allocate_expandable(p, stream, small, size);
    if (id == NONE) {
        tp_device_synchronize(p->device);
        uint64_t released = unmap_free_pages(p);
        id = allocate_expandable(p, stream, small, size);
        p->oom_retries++;
        char want[32], freed[32], held[32];
        snprintf(p->last_oom, sizeof p->last_oom,
                 "mapping %s failed; the allocator unmapped %s of free pages and the retry %s (%s held)",
                 tp_format_bytes(size, want, sizeof want), tp_format_bytes(released, freed, sizeof freed),
                 id != NONE ? "succeeded" : "failed: out of memory", tp_format_bytes(p->reserved_bytes, held, sizeof held));
        if (id != NONE) {
            *out_status = REPLAY_RECOVERED;
            p->oom_recoveries++;
        }
    }
    if (id == NONE) *out_status = REPLAY_OOM;
    return id;
}

/* The free mapped block the best-fit search picks for size bytes on stream,
 * out of its treap, or NONE. With expandable segments, among blocks of
 * growing size it moves on while the next has less room once its unmapped
 * neighbour is counted. */
static uint32_t take_free_block(torch_pool *p, tp_stream stream, uint8_t small, uint64_t size) {
    const torch_block *b = p->blocks;
    uint32_t root = p->roots[small];
    uint32_t it = treap_lower_bound(b, root, stream, size, 0, true);
    if (it == NONE || b[it].stream != stream) return NONE;
    if (p->expandable) {
        for (;;) {
            uint32_t next = treap_successor(b, root, it, true);
            if (next == NONE || b[next].stream != stream) break;
            uint64_t room_next = b[next].size + (b[next].next != NONE && !b[b[next].next].mapped ? b[b[next].next].size : 0);
            uint64_t room_it = b[it].size + (b[it].next != NONE && !b[b[it].next].mapped ? b[b[it].next].size : 0);
            if (room_next >= room_it) break;
            it = next;
        }
    }
    pool_remove(p, it);
    return it;
}

static replay_status torch_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    torch_pool *p = impl;
    if (bytes > UINT64_MAX - TORCH_LARGE_SEGMENT_BYTES) bytes = UINT64_MAX - TORCH_LARGE_SEGMENT_BYTES; /* fails below */
    uint64_t size = bytes < TORCH_MIN_BLOCK_BYTES
                        ? TORCH_MIN_BLOCK_BYTES
                        : (bytes + TORCH_MIN_BLOCK_BYTES - 1) / TORCH_MIN_BLOCK_BYTES * TORCH_MIN_BLOCK_BYTES;
    uint8_t small = size <= TORCH_SMALL_BYTES;
    replay_status result = REPLAY_OK;
    uint32_t id = take_free_block(p, stream, small, size);
    if (id == NONE) {
        id = p->expandable ? new_expandable_block(p, stream, small, size, &result)
                           : new_segment_block(p, stream, small, size, &result);
        if (id == NONE) return result;
    }
    uint64_t rest = p->blocks[id].size - size;
    if ((p->expandable || small) ? rest >= TORCH_MIN_BLOCK_BYTES : rest > TORCH_SMALL_BYTES) {
        uint32_t tail = cut(p, id, size);
        if (tail == NONE) return REPLAY_ERROR;
        pool_insert(p, tail);
    }
    p->blocks[id].allocated = 1;
    if (!tpi_map_put(&p->live, p->blocks[id].address, id)) return REPLAY_ERROR;
    *out = p->blocks[id].address;
    return result;
}

static replay_status torch_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)bytes;
    (void)stream; /* a block goes back to the stream it was allocated on */
    torch_pool *p = impl;
    uint64_t value;
    if (!tpi_map_remove(&p->live, address, &value)) return REPLAY_ERROR;
    uint32_t id = (uint32_t)value;
    p->blocks[id].allocated = 0;
    merge_neighbour(p, id, p->blocks[id].prev);
    merge_neighbour(p, id, p->blocks[id].next);
    pool_insert(p, id);
    return REPLAY_OK;
}

static void torch_counters(void *impl, replay_counters *out) {
    torch_pool *p = impl;
    *out = (replay_counters){.reserved_bytes = p->reserved_bytes,
                             .peak_reserved_bytes = p->peak_reserved_bytes,
                             .cached_bytes = p->free_bytes,
                             .device_calls = p->device_calls,
                             .device_allocs = p->device_allocs,
                             .oom_recoveries = p->oom_recoveries};
}

static void torch_extra(void *impl, char *buf, size_t cap) {
    torch_pool *p = impl;
    snprintf(buf, cap, "\"device_frees\":%llu,\"oom_retries\":%llu", (unsigned long long)p->device_frees,
             (unsigned long long)p->oom_retries);
}

static void torch_oom_report(void *impl, char *buf, size_t cap) {
    torch_pool *p = impl;
    snprintf(buf, cap, "%s", p->last_oom);
}

static void torch_destroy(void *impl) {
    torch_pool *p = impl;
    if (p->expandable) {
        /* every mapped run, then every reservation, back to the device */
        for (uint32_t id = 0; id < p->block_count; id++) {
            const torch_block *x = &p->blocks[id];
            if (!x->used || !x->mapped || (x->prev != NONE && p->blocks[x->prev].mapped)) continue;
            uint64_t bytes = 0; /* the run of mapped blocks from here: whole pages */
            for (uint32_t at = id; at != NONE && p->blocks[at].mapped; at = p->blocks[at].next) bytes += p->blocks[at].size;
            tp_device_unmap(p->device, x->address, bytes);
        }
        for (uint32_t s = 0; s < p->segment_count; s++)
            tp_device_va_release(p->device, p->segments[s].base, p->segments[s].bytes);
    } else {
        /* every segment back: each starts with a block whose prev is NONE */
        for (uint32_t id = 0; id < p->block_count; id++) {
            const torch_block *x = &p->blocks[id];
            if (!x->used || x->prev != NONE) continue;
            uint64_t bytes = 0;
            for (uint32_t at = id; at != NONE; at = p->blocks[at].next) bytes += p->blocks[at].size;
            tp_device_mem_free(p->device, x->address, bytes);
        }
    }
    tpi_map_destroy(&p->live);
    free(p->segments);
    free(p->blocks);
    free(p);
}

static const replay_pool_ops torch_ops = {.alloc = torch_alloc,
                                          .free = torch_free,
                                          .counters = torch_counters,
                                          .extra_json = torch_extra,
                                          .oom_report = torch_oom_report,
                                          .destroy = torch_destroy};
const replay_pool_factory replay_torch_default_factory = {"torch-default", false, torch_create, &torch_ops};
const replay_pool_factory replay_torch_expandable_factory = {"torch-expandable", true, torch_expandable_create,
                                                             &torch_ops};
