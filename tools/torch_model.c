/* SPDX-License-Identifier: MIT */
/*
 * torch_model.c -- a model of PyTorch's CUDA caching allocator with its
 * default settings ("torch-default" in tide replay), so that any trace can be
 * held against the allocator most users run, without a GPU or PyTorch.
 *
 * The rules modelled (PyTorch 2.x, default configuration: no
 * max_split_size, no garbage collection threshold, no expandable segments,
 * no roundup divisions), in our own words:
 *
 *  - A request of n bytes is rounded up to a multiple of 512 (512 at least).
 *  - Requests of at most 1 MiB come from the small pool, larger ones from
 *    the large pool. Each pool keeps its free blocks ordered by (stream,
 *    size, address); a request takes the smallest free block of its own
 *    stream that holds it (the lowest address among equal sizes). A block
 *    is only ever reused on the stream it was first allocated on.
 *  - With no such block, the pool mallocs a new segment: 2 MiB for a small
 *    request, 20 MiB for a request below 10 MiB, else the request rounded
 *    up to 2 MiB. If that malloc fails it frees every free block that is a
 *    whole segment (both pools, every stream: what empty_cache frees) and
 *    retries once; a second failure is out of memory.
 *  - A block larger than the request is split, the request at its start,
 *    when the rest is at least 512 bytes (small pool) or more than 1 MiB
 *    (large pool); otherwise the whole block is handed out.
 *  - A freed block merges with the free blocks before and after it in its
 *    segment and goes back to its pool. Nothing is freed to the device
 *    except by the out-of-memory retry (PyTorch keeps its cache until
 *    empty_cache).
 *
 * Peak held is the peak of the segments' bytes (PyTorch's reserved bytes);
 * device allocations are its segment mallocs. Checked against PyTorch's own
 * counters on the three recorded traces (docs/results.md): the model
 * reproduces their reserved peaks and malloc counts.
 *
 * Data structures: blocks live in one array (indices, a free list of
 * unused entries), linked to their neighbours in the segment; each pool's
 * free blocks form a treap keyed by (stream, size, address) for the
 * smallest-fit search; live blocks are found by address in a hash map.
 */
#include "replay.h"

#include "tide.h"
#include "tpi_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TORCH_MIN_BLOCK_BYTES 512ull
#define TORCH_SMALL_BYTES (1ull << 20)        /* at most this: the small pool */
#define TORCH_SMALL_SEGMENT_BYTES (2ull << 20) /* a small pool's segment */
#define TORCH_MIN_LARGE_ALLOC_BYTES (10ull << 20)
#define TORCH_LARGE_SEGMENT_BYTES (20ull << 20) /* a segment for requests of 1-10 MiB */
#define TORCH_ROUND_LARGE_BYTES (2ull << 20)

#define NONE UINT32_MAX

typedef struct torch_block {
    uint64_t address, size;
    tp_stream stream;
    uint32_t prev, next;         /* neighbours in the segment, NONE at its ends */
    uint32_t left, right, prio;  /* the pool's treap, while free */
    uint8_t small, allocated, used; /* used: the entry holds a block */
} torch_block;

typedef struct torch_pool {
    tp_device *device;
    torch_block *blocks;
    uint32_t block_count, block_capacity, unused; /* unused: first unused entry (chained by next) */
    uint32_t roots[2];                             /* free blocks of the large [0] and small [1] pool */
    uint64_t reserved_bytes, peak_reserved_bytes, free_bytes;
    uint64_t device_calls, device_allocs, device_frees;
    uint64_t oom_retries, oom_recoveries; /* retries after emptying the cache; those that succeeded */
    uint64_t rng;
    tpi_map live; /* address -> block index */
    char last_oom[256];
} torch_pool;

/* ------------------------------------------------------------ the treap */

/* Orders blocks as PyTorch's pools do: stream, then size, then address. */
static int block_cmp(const torch_block *a, tp_stream stream, uint64_t size, uint64_t address) {
    if ((uintptr_t)a->stream != (uintptr_t)stream) return (uintptr_t)a->stream < (uintptr_t)stream ? -1 : 1;
    if (a->size != size) return a->size < size ? -1 : 1;
    if (a->address != address) return a->address < address ? -1 : 1;
    return 0;
}

static uint32_t treap_insert(torch_block *b, uint32_t root, uint32_t id) {
    if (root == NONE) return id;
    torch_block *r = &b[root], *x = &b[id];
    if (block_cmp(x, r->stream, r->size, r->address) < 0) {
        r->left = treap_insert(b, r->left, id);
        if (b[r->left].prio > r->prio) { /* rotate right */
            uint32_t l = r->left;
            r->left = b[l].right;
            b[l].right = root;
            return l;
        }
    } else {
        r->right = treap_insert(b, r->right, id);
        if (b[r->right].prio > r->prio) { /* rotate left */
            uint32_t rt = r->right;
            r->right = b[rt].left;
            b[rt].left = root;
            return rt;
        }
    }
    return root;
}

static uint32_t treap_merge(torch_block *b, uint32_t l, uint32_t r) {
    if (l == NONE) return r;
    if (r == NONE) return l;
    if (b[l].prio > b[r].prio) {
        b[l].right = treap_merge(b, b[l].right, r);
        return l;
    }
    b[r].left = treap_merge(b, l, b[r].left);
    return r;
}

static uint32_t treap_remove(torch_block *b, uint32_t root, uint32_t id) {
    if (root == id) return treap_merge(b, b[id].left, b[id].right);
    torch_block *r = &b[root];
    if (block_cmp(&b[id], r->stream, r->size, r->address) < 0)
        r->left = treap_remove(b, r->left, id);
    else
        r->right = treap_remove(b, r->right, id);
    return root;
}

/* The smallest free block of stream holding size bytes, or NONE. */
static uint32_t treap_smallest_fit(const torch_block *b, uint32_t root, tp_stream stream, uint64_t size) {
    uint32_t found = NONE;
    while (root != NONE) {
        if (block_cmp(&b[root], stream, size, 0) >= 0) {
            found = root;
            root = b[root].left;
        } else {
            root = b[root].right;
        }
    }
    return found != NONE && b[found].stream == stream ? found : NONE;
}

/* -------------------------------------------------------------- blocks */

static uint32_t block_new(torch_pool *p) {
    if (p->unused != NONE) {
        uint32_t id = p->unused;
        p->unused = p->blocks[id].next;
        return id;
    }
    if (p->block_count == p->block_capacity) {
        uint32_t capacity = p->block_capacity ? 2 * p->block_capacity : 256;
        torch_block *blocks = realloc(p->blocks, (size_t)capacity * sizeof *blocks);
        if (!blocks) return NONE;
        p->blocks = blocks;
        p->block_capacity = capacity;
    }
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

static void pool_insert(torch_pool *p, uint32_t id) {
    torch_block *x = &p->blocks[id];
    x->left = x->right = NONE;
    x->prio = next_prio(p);
    p->roots[x->small] = treap_insert(p->blocks, p->roots[x->small], id);
    p->free_bytes += x->size;
}

static void pool_remove(torch_pool *p, uint32_t id) {
    torch_block *x = &p->blocks[id];
    p->roots[x->small] = treap_remove(p->blocks, p->roots[x->small], id);
    p->free_bytes -= x->size;
}

/* ---------------------------------------------------------- the device */

/* Frees every free block that is a whole segment, in both pools (PyTorch's
 * release_cached_blocks); returns how many. */
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

static tp_status segment_malloc(torch_pool *p, uint64_t bytes, uint64_t *out_address) {
    p->device_calls++;
    tp_status st = tp_device_mem_alloc(p->device, bytes, out_address);
    if (st != TP_OK) return st;
    p->device_allocs++;
    p->reserved_bytes += bytes;
    if (p->reserved_bytes > p->peak_reserved_bytes) p->peak_reserved_bytes = p->reserved_bytes;
    return TP_OK;
}

/* ------------------------------------------------------------ the pool */

static void *torch_create(tp_device *device, const tp_pool_config *config, char *err, size_t cap) {
    (void)config;
    (void)err;
    (void)cap;
    torch_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->device = device;
    p->unused = NONE;
    p->roots[0] = p->roots[1] = NONE;
    p->rng = 0x746f726368ull;
    tpi_map_init(&p->live, NULL);
    return p;
}

static replay_status torch_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    torch_pool *p = impl;
    if (bytes > UINT64_MAX - TORCH_ROUND_LARGE_BYTES) bytes = UINT64_MAX - TORCH_ROUND_LARGE_BYTES; /* fails below */
    uint64_t size = bytes < TORCH_MIN_BLOCK_BYTES
                        ? TORCH_MIN_BLOCK_BYTES
                        : (bytes + TORCH_MIN_BLOCK_BYTES - 1) / TORCH_MIN_BLOCK_BYTES * TORCH_MIN_BLOCK_BYTES;
    uint8_t small = size <= TORCH_SMALL_BYTES;
    uint32_t id = treap_smallest_fit(p->blocks, p->roots[small], stream, size);
    replay_status result = REPLAY_OK;
    if (id != NONE) {
        pool_remove(p, id);
    } else {
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
                     st == TP_OK ? "succeeded" : "failed: out of memory",
                     tp_format_bytes(p->reserved_bytes, held, sizeof held));
            if (st == TP_OK) {
                result = REPLAY_RECOVERED;
                p->oom_recoveries++;
            }
        }
        if (st == TP_ERR_OUT_OF_MEMORY) return REPLAY_OOM;
        if (st != TP_OK) return REPLAY_ERROR;
        id = block_new(p);
        if (id == NONE) return REPLAY_ERROR;
        p->blocks[id] = (torch_block){address, segment, stream, NONE, NONE, NONE, NONE, 0, small, 0, 1};
    }
    torch_block *x = &p->blocks[id];
    uint64_t rest = x->size - size;
    if (small ? rest >= TORCH_MIN_BLOCK_BYTES : rest > TORCH_SMALL_BYTES) {
        uint32_t tail = block_new(p);
        if (tail == NONE) return REPLAY_ERROR;
        x = &p->blocks[id]; /* (the array may have moved) */
        p->blocks[tail] = (torch_block){x->address + size, rest, stream, id, x->next, NONE, NONE, 0, small, 0, 1};
        if (x->next != NONE) p->blocks[x->next].prev = tail;
        x->next = tail;
        x->size = size;
        pool_insert(p, tail);
        x = &p->blocks[id];
    }
    x->allocated = 1;
    if (!tpi_map_put(&p->live, x->address, id)) return REPLAY_ERROR;
    *out = x->address;
    return result;
}

/* Merges the free neighbour n of block id into it (n leaves its pool). */
static void merge_neighbour(torch_pool *p, uint32_t id, uint32_t n) {
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

static replay_status torch_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)bytes;
    (void)stream; /* a block goes back to the stream it was allocated on */
    torch_pool *p = impl;
    uint64_t value;
    if (!tpi_map_remove(&p->live, address, &value)) return REPLAY_ERROR;
    uint32_t id = (uint32_t)value;
    p->blocks[id].allocated = 0;
    uint32_t prev = p->blocks[id].prev, next = p->blocks[id].next;
    if (prev != NONE && !p->blocks[prev].allocated) merge_neighbour(p, id, prev);
    if (next != NONE && !p->blocks[next].allocated) merge_neighbour(p, id, next);
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
    /* every segment back to the device: each starts with a block whose prev is NONE */
    for (uint32_t id = 0; id < p->block_count; id++) {
        torch_block *x = &p->blocks[id];
        if (!x->used || x->prev != NONE) continue;
        uint64_t bytes = 0;
        for (uint32_t at = id; at != NONE; at = p->blocks[at].next) bytes += p->blocks[at].size;
        tp_device_mem_free(p->device, x->address, bytes);
    }
    tpi_map_destroy(&p->live);
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
