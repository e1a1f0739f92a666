/* SPDX-License-Identifier: MIT */
/*
 * baselines.c -- faithful models of the two ggml CUDA pools of the public
 * reports (background of docs/failure-modes.md), replayed on the same
 * devices as tidepool.
 *
 * ggml-legacy (no VMM): 256 slots of idle buffers. alloc: best fit over the
 * slots, handing out the whole buffer (an exact size match is taken at
 * once); on a miss, malloc 1.05 x the request rounded up to 256 B. free:
 * park the buffer in the first empty slot, or free it to the device when all
 * 256 are taken. Out of memory, as merged: synchronise, free every parked
 * buffer of this pool, retry once; if that fails the backend aborts (fatal
 * here). ggml keeps one such pool per device and stream of a backend
 * context (pools[device][stream]), and a second context (the vision
 * encoder's, in llama.cpp's multimodal server) has pools of its own; so the
 * model keeps one pool per trace stream, a buffer goes back to the pool it
 * came from, and a flush frees only the flushing pool's idle buffers while
 * the others keep theirs.
 *
 * ggml-vmm: reserve 32 GiB of address space (capped by the device), a bump
 * pointer over it; grow the mapped part by whole granules when the bump
 * passes it; never unmap; a free must be the most recent allocation (LIFO):
 * anything else is counted as a violation (the real pool asserts). Out of
 * memory when mapping is fatal. One pool serves every stream.
 */
#include "replay.h"

#include "tide.h"
#include "tpi_map.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEGACY_SLOTS 256

typedef struct legacy_slot {
    uint64_t address;
    uint64_t bytes;
} legacy_slot;

/* The pool of one stream: its parked buffers. */
typedef struct legacy_stream_pool {
    tp_stream stream;
    legacy_slot slots[LEGACY_SLOTS];
    uint64_t parked_bytes;
} legacy_stream_pool;

typedef struct legacy_pool {
    tp_device *device;
    legacy_stream_pool *pools;
    size_t pool_count, pool_capacity;
    uint64_t pool_bytes;   /* every buffer malloced and not freed */
    uint64_t peak_bytes;
    uint64_t parked_bytes; /* idle in the slots of all pools */
    uint64_t device_calls, device_allocs;
    uint64_t flushes, recoveries; /* out-of-memory flushes; those whose retry succeeded */
    tpi_map live; /* live buffers: address -> actual size and the pool it came from (live_put) */
    char last_oom[448];
} legacy_pool;

/* A live buffer's value in p->live: its size in the low 48 bits (256 TiB),
 * the index of the pool it came from in the high 16. */
#define LIVE_SIZE_BITS 48
#define LIVE_SIZE_MASK ((1ull << LIVE_SIZE_BITS) - 1)

static bool live_put(legacy_pool *p, uint64_t address, uint64_t bytes, uint32_t owner) {
    if (bytes > LIVE_SIZE_MASK || owner >= (1u << (64 - LIVE_SIZE_BITS))) return false;
    return tpi_map_put(&p->live, address, bytes | (uint64_t)owner << LIVE_SIZE_BITS);
}

/* Removes address from the live table; returns its size (0 if unknown). */
static uint64_t live_take(legacy_pool *p, uint64_t address, uint32_t *out_owner) {
    uint64_t value;
    if (!tpi_map_remove(&p->live, address, &value)) return 0;
    *out_owner = (uint32_t)(value >> LIVE_SIZE_BITS);
    return value & LIVE_SIZE_MASK;
}

static void *legacy_create(tp_device *device, const tp_pool_config *config, char *err, size_t cap) {
    (void)config;
    (void)err;
    (void)cap;
    legacy_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->device = device;
    tpi_map_init(&p->live, NULL);
    return p;
}

/* The pool of stream (made on first use); NULL when host memory runs out. */
static legacy_stream_pool *legacy_pool_of(legacy_pool *p, tp_stream stream, uint32_t *out_index) {
    for (size_t i = 0; i < p->pool_count; i++)
        if (p->pools[i].stream == stream) {
            *out_index = (uint32_t)i;
            return &p->pools[i];
        }
    if (p->pool_count == p->pool_capacity) {
        size_t cap = p->pool_capacity ? 2 * p->pool_capacity : 2;
        legacy_stream_pool *pools = realloc(p->pools, cap * sizeof *pools);
        if (!pools) return NULL;
        p->pools = pools;
        p->pool_capacity = cap;
    }
    legacy_stream_pool *sp = &p->pools[p->pool_count];
    memset(sp, 0, sizeof *sp);
    sp->stream = stream;
    *out_index = (uint32_t)p->pool_count++;
    return sp;
}

static tp_status legacy_device_free(legacy_pool *p, uint64_t address, uint64_t bytes) {
    p->device_calls++;
    tp_status st = tp_device_mem_free(p->device, address, bytes);
    if (st == TP_OK) p->pool_bytes -= bytes;
    return st;
}

/* Frees every parked buffer of one pool; returns how many and the bytes. */
static unsigned legacy_flush(legacy_pool *p, legacy_stream_pool *sp, uint64_t *out_bytes) {
    unsigned buffers = 0;
    uint64_t bytes = 0;
    for (int i = 0; i < LEGACY_SLOTS; i++) {
        legacy_slot *s = &sp->slots[i];
        if (!s->address) continue;
        if (legacy_device_free(p, s->address, s->bytes) == TP_OK) {
            buffers++;
            bytes += s->bytes;
        }
        *s = (legacy_slot){0, 0};
    }
    sp->parked_bytes -= bytes;
    p->parked_bytes -= bytes;
    *out_bytes = bytes;
    return buffers;
}

/* The out-of-memory report: what failed, what the flush gave back, and
 * (when the retry failed too) where the rest of the device went. */
static void legacy_note_oom(legacy_pool *p, uint64_t request, uint64_t look_ahead, unsigned flushed,
                            uint64_t flushed_bytes, bool retry_failed) {
    uint64_t free_bytes = 0, total_bytes = 0;
    tp_device_mem_info(p->device, &free_bytes, &total_bytes);
    uint64_t live = p->pool_bytes - p->parked_bytes;
    char req[32], ask[32], fr[32], tot[32], fl[32], other[32], used[32];
    tp_format_bytes(request, req, sizeof req);
    tp_format_bytes(look_ahead, ask, sizeof ask);
    tp_format_bytes(free_bytes, fr, sizeof fr);
    tp_format_bytes(total_bytes, tot, sizeof tot);
    tp_format_bytes(flushed_bytes, fl, sizeof fl);
    tp_format_bytes(p->parked_bytes, other, sizeof other);
    tp_format_bytes(live, used, sizeof used);
    if (!retry_failed)
        snprintf(p->last_oom, sizeof p->last_oom,
                 "cudaMalloc of %s (request %s x 1.05) failed; the pool synchronised the device, freed its %u idle "
                 "buffers (%s) and the retry succeeded",
                 ask, req, flushed, fl);
    else
        snprintf(p->last_oom, sizeof p->last_oom,
                 "cudaMalloc of %s (request %s x 1.05) failed again after the pool freed its %u idle buffers (%s): "
                 "%s free of %s, %s in use, %s idle in other pools out of its reach; ggml aborts",
                 ask, req, flushed, fl, fr, tot, used, other);
}

static replay_status legacy_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    legacy_pool *p = impl;
    uint32_t owner;
    legacy_stream_pool *sp = legacy_pool_of(p, stream, &owner);
    if (!sp) return REPLAY_ERROR;
    int best = -1;
    uint64_t best_diff = UINT64_MAX;
    for (int i = 0; i < LEGACY_SLOTS; i++) {
        legacy_slot *s = &sp->slots[i];
        if (!s->address || s->bytes < bytes) continue;
        uint64_t diff = s->bytes - bytes;
        if (diff < best_diff) {
            best = i;
            best_diff = diff;
            if (diff == 0) break;
        }
    }
    if (best >= 0) {
        legacy_slot s = sp->slots[best];
        sp->slots[best] = (legacy_slot){0, 0};
        sp->parked_bytes -= s.bytes;
        p->parked_bytes -= s.bytes;
        if (!live_put(p, s.address, s.bytes, owner)) return REPLAY_ERROR;
        *out = s.address;
        return REPLAY_OK;
    }
    /* look-ahead: 1.05 x the request, rounded up to 256 bytes. Above 2^64 -
     * 4096 (a request over ~15.2 EiB) it is clamped to the largest multiple
     * of 256: converting a double past 2^64 is undefined, and the + 255
     * would wrap; the device call then fails as cudaMalloc would. */
    double scaled = 1.05 * (double)bytes;
    uint64_t look_ahead = scaled >= 18446744073709547520.0 /* 2^64 - 4096 */
                              ? UINT64_MAX & ~(uint64_t)255
                              : 256 * (((uint64_t)scaled + 255) / 256);
    uint64_t address = 0;
    p->device_calls++;
    tp_status st = tp_device_mem_alloc(p->device, look_ahead, &address);
    bool recovered = false;
    if (st == TP_ERR_OUT_OF_MEMORY) {
        /* the merged fix: synchronise, free everything this pool parked, retry once */
        p->flushes++;
        tp_device_synchronize(p->device);
        uint64_t flushed_bytes;
        unsigned flushed = legacy_flush(p, sp, &flushed_bytes);
        p->device_calls++;
        st = tp_device_mem_alloc(p->device, look_ahead, &address);
        legacy_note_oom(p, bytes, look_ahead, flushed, flushed_bytes, st == TP_ERR_OUT_OF_MEMORY);
        if (st == TP_ERR_OUT_OF_MEMORY) return REPLAY_FATAL; /* GGML_ABORT */
        recovered = st == TP_OK;
        p->recoveries += recovered;
    }
    if (st != TP_OK) return REPLAY_ERROR;
    p->device_allocs++;
    p->pool_bytes += look_ahead;
    if (p->pool_bytes > p->peak_bytes) p->peak_bytes = p->pool_bytes;
    if (!live_put(p, address, look_ahead, owner)) return REPLAY_ERROR;
    *out = address;
    return recovered ? REPLAY_RECOVERED : REPLAY_OK;
}

static replay_status legacy_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)bytes;
    (void)stream; /* ggml returns a buffer to the pool it came from */
    legacy_pool *p = impl;
    uint32_t owner = 0;
    uint64_t actual = live_take(p, address, &owner);
    if (!actual) return REPLAY_ERROR;
    legacy_stream_pool *sp = &p->pools[owner];
    for (int i = 0; i < LEGACY_SLOTS; i++) {
        if (sp->slots[i].address) continue;
        sp->slots[i] = (legacy_slot){address, actual};
        sp->parked_bytes += actual;
        p->parked_bytes += actual;
        return REPLAY_OK;
    }
    /* all slots taken: a synchronous free on the hot path */
    return legacy_device_free(p, address, actual) == TP_OK ? REPLAY_OK : REPLAY_ERROR;
}

static void legacy_counters(void *impl, replay_counters *out) {
    legacy_pool *p = impl;
    *out = (replay_counters){.reserved_bytes = p->pool_bytes,
                             .peak_reserved_bytes = p->peak_bytes,
                             .cached_bytes = p->parked_bytes,
                             .device_calls = p->device_calls,
                             .device_allocs = p->device_allocs,
                             .oom_recoveries = p->recoveries};
}

static void legacy_extra(void *impl, char *buf, size_t cap) {
    legacy_pool *p = impl;
    int used = 0;
    for (size_t k = 0; k < p->pool_count; k++)
        for (int i = 0; i < LEGACY_SLOTS; i++) used += p->pools[k].slots[i].address != 0;
    snprintf(buf, cap, "\"slots_used_end\":%d,\"oom_flushes\":%llu,\"stream_pools\":%zu", used,
             (unsigned long long)p->flushes, p->pool_count);
}

static void legacy_oom_report(void *impl, char *buf, size_t cap) {
    legacy_pool *p = impl;
    snprintf(buf, cap, "%s", p->last_oom);
}

static void legacy_destroy(void *impl) {
    legacy_pool *p = impl;
    for (size_t k = 0; k < p->pool_count; k++) {
        uint64_t flushed_bytes;
        legacy_flush(p, &p->pools[k], &flushed_bytes);
    }
    size_t cursor = 0;
    uint64_t address, value;
    while (tpi_map_next(&p->live, &cursor, &address, &value)) legacy_device_free(p, address, value & LIVE_SIZE_MASK);
    tpi_map_destroy(&p->live);
    free(p->pools);
    free(p);
}

static const replay_pool_ops legacy_ops = {.alloc = legacy_alloc,
                                           .free = legacy_free,
                                           .counters = legacy_counters,
                                           .extra_json = legacy_extra,
                                           .oom_report = legacy_oom_report,
                                           .destroy = legacy_destroy};
const replay_pool_factory replay_ggml_legacy_factory = {"ggml-legacy", false, legacy_create, &legacy_ops};

/* ------------------------------------------------------------- ggml-vmm */

#define GGML_VMM_MAX_BYTES (32ull << 30)
#define GGML_VMM_ALIGNMENT 128

typedef struct ggml_vmm_pool {
    tp_device *device;
    uint64_t base, reserved_va, granularity;
    uint64_t mapped, used, peak_mapped;
    uint64_t device_calls, device_allocs, lifo_violations;
    uint64_t exhausted_by; /* the request that did not fit the reserved space (0: a map call failed) */
} ggml_vmm_pool;

static void *ggml_vmm_create(tp_device *device, const tp_pool_config *config, char *err, size_t cap) {
    (void)config;
    ggml_vmm_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->device = device;
    tp_device_info info;
    tp_device_get_info(device, &info);
    p->granularity = info.granularity_bytes;
    p->reserved_va = GGML_VMM_MAX_BYTES;
    p->device_calls++;
    if (tp_device_va_reserve(device, p->reserved_va, p->granularity, &p->base) != TP_OK) {
        snprintf(err, cap, "ggml-vmm: reserving the address space failed");
        free(p);
        return NULL;
    }
    return p;
}

static replay_status ggml_vmm_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    (void)stream;
    ggml_vmm_pool *p = impl;
    /* more than the reserved space left: GGML_ASSERT (pool exhausted); checked
     * first, so that rounding a request near 2^64 up cannot wrap */
    if (bytes > p->reserved_va - p->used) {
        p->exhausted_by = bytes;
        return REPLAY_FATAL;
    }
    uint64_t size = (bytes + GGML_VMM_ALIGNMENT - 1) / GGML_VMM_ALIGNMENT * GGML_VMM_ALIGNMENT;
    uint64_t available = p->mapped - p->used;
    if (size > available) {
        uint64_t grow = (size - available + p->granularity - 1) / p->granularity * p->granularity;
        if (p->mapped + grow > p->reserved_va) { /* GGML_ASSERT: pool exhausted */
            p->exhausted_by = bytes;
            return REPLAY_FATAL;
        }
        p->device_calls++;
        tp_status st = tp_device_map(p->device, p->base + p->mapped, grow);
        if (st != TP_OK) return REPLAY_FATAL; /* CU_CHECK aborts */
        p->device_allocs++;
        p->mapped += grow;
        if (p->mapped > p->peak_mapped) p->peak_mapped = p->mapped;
    }
    *out = p->base + p->used;
    p->used += size;
    return REPLAY_OK;
}

static replay_status ggml_vmm_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)stream;
    ggml_vmm_pool *p = impl;
    if (bytes > p->used) { /* more than is in use (also: no wrap rounding a size near 2^64) */
        p->lifo_violations++;
        return REPLAY_OK;
    }
    uint64_t size = (bytes + GGML_VMM_ALIGNMENT - 1) / GGML_VMM_ALIGNMENT * GGML_VMM_ALIGNMENT;
    if (size > p->used) {
        p->lifo_violations++;
        return REPLAY_OK;
    }
    p->used -= size;
    if (address != p->base + p->used) p->lifo_violations++; /* GGML_ASSERT(ptr == pool_addr + pool_used) */
    return REPLAY_OK;
}

static void ggml_vmm_counters(void *impl, replay_counters *out) {
    ggml_vmm_pool *p = impl;
    *out = (replay_counters){.reserved_bytes = p->mapped,
                             .peak_reserved_bytes = p->peak_mapped,
                             .cached_bytes = p->mapped - p->used,
                             .device_calls = p->device_calls,
                             .device_allocs = p->device_allocs,
                             .lifo_violations = p->lifo_violations};
}

static void ggml_vmm_destroy(void *impl) {
    ggml_vmm_pool *p = impl;
    if (p->mapped) tp_device_unmap(p->device, p->base, p->mapped);
    tp_device_va_release(p->device, p->base, p->reserved_va);
    free(p);
}

static void ggml_vmm_oom_report(void *impl, char *buf, size_t cap) {
    ggml_vmm_pool *p = impl;
    char mapped[32], used[32], asked[32], reserved[32];
    if (p->exhausted_by) {
        snprintf(buf, cap, "a request of %s does not fit the pool's %s of address space with %s in use; ggml aborts (GGML_ASSERT)",
                 tp_format_bytes(p->exhausted_by, asked, sizeof asked),
                 tp_format_bytes(p->reserved_va, reserved, sizeof reserved), tp_format_bytes(p->used, used, sizeof used));
        return;
    }
    snprintf(buf, cap, "mapping more of the pool failed with %s mapped, %s in use; ggml aborts (no retry)",
             tp_format_bytes(p->mapped, mapped, sizeof mapped), tp_format_bytes(p->used, used, sizeof used));
}

static const replay_pool_ops ggml_vmm_ops = {.alloc = ggml_vmm_alloc,
                                             .free = ggml_vmm_free,
                                             .counters = ggml_vmm_counters,
                                             .oom_report = ggml_vmm_oom_report,
                                             .destroy = ggml_vmm_destroy};
const replay_pool_factory replay_ggml_vmm_factory = {"ggml-vmm", true, ggml_vmm_create, &ggml_vmm_ops};
