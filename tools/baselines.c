/*
 * baselines.c -- faithful models of the two ggml CUDA pools of the public
 * reports (design.md section 1), replayed on the same devices as tidepool.
 *
 * ggml-legacy (no VMM): 256 slots of idle buffers. alloc: best fit over the
 * slots, handing out the whole buffer (an exact size match is taken at
 * once); on a miss, malloc 1.05 x the request rounded up to 256 B. free:
 * park the buffer in the first empty slot, or free it to the device when all
 * 256 are taken. Out of memory, as merged: synchronise, free every parked
 * buffer, retry once; if that fails the backend aborts (fatal here).
 *
 * ggml-vmm: reserve 32 GiB of address space (capped by the device), a bump
 * pointer over it; grow the mapped part by whole granules when the bump
 * passes it; never unmap; a free must be the most recent allocation (LIFO):
 * anything else is counted as a violation (the real pool asserts). Out of
 * memory when mapping is fatal.
 */
#include "replay.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define LEGACY_SLOTS 256

typedef struct legacy_slot {
    uint64_t address;
    uint64_t bytes;
} legacy_slot;

typedef struct legacy_pool {
    tp_device *device;
    legacy_slot slots[LEGACY_SLOTS];
    uint64_t pool_bytes; /* every buffer malloced and not freed */
    uint64_t peak_bytes;
    uint64_t device_calls, device_allocs, flushes;
    /* live buffers: address -> actual size */
    uint64_t *keys, *sizes;
    size_t capacity, count;
} legacy_pool;

static size_t slot_of(uint64_t key, size_t capacity) {
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 21) & (capacity - 1);
}

static bool live_put(legacy_pool *p, uint64_t address, uint64_t bytes) {
    if ((p->count + 1) * 2 > p->capacity) {
        size_t cap = p->capacity ? p->capacity * 2 : 1024;
        uint64_t *keys = calloc(cap, sizeof *keys), *sizes = calloc(cap, sizeof *sizes);
        if (!keys || !sizes) {
            free(keys);
            free(sizes);
            return false;
        }
        for (size_t i = 0; i < p->capacity; i++) {
            if (!p->keys[i]) continue;
            size_t j = slot_of(p->keys[i], cap);
            while (keys[j]) j = (j + 1) & (cap - 1);
            keys[j] = p->keys[i];
            sizes[j] = p->sizes[i];
        }
        free(p->keys);
        free(p->sizes);
        p->keys = keys;
        p->sizes = sizes;
        p->capacity = cap;
    }
    size_t i = slot_of(address, p->capacity);
    while (p->keys[i]) i = (i + 1) & (p->capacity - 1);
    p->keys[i] = address;
    p->sizes[i] = bytes;
    p->count++;
    return true;
}

static uint64_t live_take(legacy_pool *p, uint64_t address) {
    size_t mask = p->capacity - 1;
    size_t i = slot_of(address, p->capacity);
    while (p->keys[i] && p->keys[i] != address) i = (i + 1) & mask;
    if (!p->keys[i]) return 0;
    uint64_t bytes = p->sizes[i];
    size_t hole = i;
    for (size_t j = (hole + 1) & mask; p->keys[j]; j = (j + 1) & mask) {
        size_t home = slot_of(p->keys[j], p->capacity);
        bool movable = (j > hole) ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            p->keys[hole] = p->keys[j];
            p->sizes[hole] = p->sizes[j];
            hole = j;
        }
    }
    p->keys[hole] = 0;
    p->count--;
    return bytes;
}

static void *legacy_create(tp_device *device, const tp_pool_config *config, char *err, size_t cap) {
    (void)config;
    (void)err;
    (void)cap;
    legacy_pool *p = calloc(1, sizeof *p);
    if (p) p->device = device;
    return p;
}

static tp_status legacy_device_free(legacy_pool *p, uint64_t address, uint64_t bytes) {
    p->device_calls++;
    tp_status st = p->device->ops->mem_free(p->device, address, bytes);
    if (st == TP_OK) p->pool_bytes -= bytes;
    return st;
}

static replay_status legacy_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    (void)stream;
    legacy_pool *p = impl;
    int best = -1;
    uint64_t best_diff = UINT64_MAX;
    for (int i = 0; i < LEGACY_SLOTS; i++) {
        legacy_slot *s = &p->slots[i];
        if (!s->address || s->bytes < bytes) continue;
        uint64_t diff = s->bytes - bytes;
        if (diff < best_diff) {
            best = i;
            best_diff = diff;
            if (diff == 0) break;
        }
    }
    if (best >= 0) {
        legacy_slot s = p->slots[best];
        p->slots[best] = (legacy_slot){0, 0};
        if (!live_put(p, s.address, s.bytes)) return REPLAY_ERROR;
        *out = s.address;
        return REPLAY_OK;
    }
    /* look-ahead: 1.05 x the request, rounded up to 256 bytes */
    uint64_t look_ahead = (uint64_t)(1.05 * (double)bytes);
    look_ahead = 256 * ((look_ahead + 255) / 256);
    uint64_t address = 0;
    p->device_calls++;
    tp_status st = p->device->ops->mem_alloc(p->device, look_ahead, &address);
    if (st == TP_ERR_OUT_OF_MEMORY) {
        /* the merged fix: synchronise, free everything parked, retry once */
        p->flushes++;
        p->device->ops->device_synchronize(p->device);
        for (int i = 0; i < LEGACY_SLOTS; i++) {
            if (!p->slots[i].address) continue;
            legacy_device_free(p, p->slots[i].address, p->slots[i].bytes);
            p->slots[i] = (legacy_slot){0, 0};
        }
        p->device_calls++;
        st = p->device->ops->mem_alloc(p->device, look_ahead, &address);
        if (st == TP_ERR_OUT_OF_MEMORY) return REPLAY_FATAL; /* GGML_ABORT */
    }
    if (st != TP_OK) return REPLAY_ERROR;
    p->device_allocs++;
    p->pool_bytes += look_ahead;
    if (p->pool_bytes > p->peak_bytes) p->peak_bytes = p->pool_bytes;
    if (!live_put(p, address, look_ahead)) return REPLAY_ERROR;
    *out = address;
    return REPLAY_OK;
}

static replay_status legacy_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)bytes;
    (void)stream;
    legacy_pool *p = impl;
    uint64_t actual = live_take(p, address);
    if (!actual) return REPLAY_ERROR;
    for (int i = 0; i < LEGACY_SLOTS; i++) {
        if (p->slots[i].address) continue;
        p->slots[i] = (legacy_slot){address, actual};
        return REPLAY_OK;
    }
    /* all slots taken: a synchronous free on the hot path */
    return legacy_device_free(p, address, actual) == TP_OK ? REPLAY_OK : REPLAY_ERROR;
}

static void legacy_counters(void *impl, replay_counters *out) {
    legacy_pool *p = impl;
    uint64_t parked = 0;
    for (int i = 0; i < LEGACY_SLOTS; i++) parked += p->slots[i].bytes;
    *out = (replay_counters){.reserved_bytes = p->pool_bytes,
                             .peak_reserved_bytes = p->peak_bytes,
                             .cached_bytes = parked,
                             .device_calls = p->device_calls,
                             .device_allocs = p->device_allocs};
}

static void legacy_extra(void *impl, char *buf, size_t cap) {
    legacy_pool *p = impl;
    int used = 0;
    for (int i = 0; i < LEGACY_SLOTS; i++) used += p->slots[i].address != 0;
    snprintf(buf, cap, "\"slots_used_end\":%d,\"oom_flushes\":%llu", used, (unsigned long long)p->flushes);
}

static void legacy_destroy(void *impl) {
    legacy_pool *p = impl;
    for (int i = 0; i < LEGACY_SLOTS; i++)
        if (p->slots[i].address) legacy_device_free(p, p->slots[i].address, p->slots[i].bytes);
    for (size_t i = 0; i < p->capacity; i++)
        if (p->keys[i]) legacy_device_free(p, p->keys[i], p->sizes[i]);
    free(p->keys);
    free(p->sizes);
    free(p);
}

static const replay_pool_ops legacy_ops = {legacy_alloc, legacy_free, legacy_counters, legacy_extra, legacy_destroy};
const replay_pool_factory replay_ggml_legacy_factory = {"ggml-legacy", false, legacy_create, &legacy_ops};

/* ------------------------------------------------------------- ggml-vmm */

#define GGML_VMM_MAX_BYTES (32ull << 30)
#define GGML_VMM_ALIGNMENT 128

typedef struct ggml_vmm_pool {
    tp_device *device;
    uint64_t base, reserved_va, granularity;
    uint64_t mapped, used, peak_mapped;
    uint64_t device_calls, device_allocs, lifo_violations;
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
    if (device->ops->va_reserve(device, p->reserved_va, p->granularity, &p->base) != TP_OK) {
        snprintf(err, cap, "ggml-vmm: reserving the address space failed");
        free(p);
        return NULL;
    }
    return p;
}

static replay_status ggml_vmm_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    (void)stream;
    ggml_vmm_pool *p = impl;
    uint64_t size = (bytes + GGML_VMM_ALIGNMENT - 1) / GGML_VMM_ALIGNMENT * GGML_VMM_ALIGNMENT;
    uint64_t available = p->mapped - p->used;
    if (size > available) {
        uint64_t grow = (size - available + p->granularity - 1) / p->granularity * p->granularity;
        if (p->mapped + grow > p->reserved_va) return REPLAY_FATAL; /* GGML_ASSERT: pool exhausted */
        p->device_calls++;
        tp_status st = p->device->ops->map(p->device, p->base + p->mapped, grow);
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
    if (p->mapped) p->device->ops->unmap(p->device, p->base, p->mapped);
    p->device->ops->va_release(p->device, p->base, p->reserved_va);
    free(p);
}

static const replay_pool_ops ggml_vmm_ops = {ggml_vmm_alloc, ggml_vmm_free, ggml_vmm_counters, NULL, ggml_vmm_destroy};
const replay_pool_factory replay_ggml_vmm_factory = {"ggml-vmm", true, ggml_vmm_create, &ggml_vmm_ops};
