/* SPDX-License-Identifier: MIT */
/*
 * test_api_fuzz.c -- random sequences of public calls with hostile
 * arguments against one simulated device with two pools (VMM and segment)
 * and a few streams, checked against a reference model after every step.
 *
 * The model knows every block a pool handed out (pool, address, bytes asked,
 * bytes the pool counted for it, stream, pins) and the memory pins keep
 * after a free or a capture's end (freed-pinned). After each step:
 *   - the status is one the call may return (per call, below), and an
 *     operation the model says must succeed (or must fail) did;
 *   - tp_pool_check passes on both pools;
 *   - allocated, requested and pinned bytes equal the model's sums, cached
 *     = reserved - allocated - freed-pinned, reserved <= limit;
 *   - no two blocks overlap, across both pools;
 *   - the device saw no hazard and no access to memory that was not there.
 * Every few steps each live block answers tp_pool_block_size with its size
 * and the memory map (snapshot JSON) lists exactly the model's live blocks.
 *
 * Hostile arguments: pointers NULL, all ones, misaligned, inside a block,
 * already freed, from the other pool; sizes 0, 1, huge, SIZE_MAX - k;
 * unknown and destroyed streams; pin/unpin of wrapping, empty, partly owned
 * ranges and unpins without pins; capture begin/end misuse; trims to odd
 * targets; buffers of every size for the text outputs. Streams are forgotten
 * and destroyed with blocks still live on them. Graph captures on the device
 * (the pools told of them or not: none may be invalidated) and pool-level
 * captures alone; device calls failing now and then (fault injection: any
 * call may then fail with TP_ERR_DEVICE or TP_ERR_OUT_OF_MEMORY, and must
 * leave the model's state). Pools are destroyed with blocks live, pinned
 * and captures open. A phase before the run creates pools with odd
 * configurations (each must be refused or work).
 *
 *   test_api_fuzz [filter]      60 seeds of 1500 steps (~1.5 s; ~12 s under ASan)
 *   TP_FUZZ_SEED=N TP_FUZZ_SEEDS=K TP_FUZZ_STEPS=M   reproduce one seed / run longer
 *   TP_FUZZ_TRACE=1             print every call that changes the model
 *   TP_FUZZ_FAULTS=0            no fault injection
 */
#include "fixture.h"
#include "fuzz_common.h"

#include <inttypes.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000ull
#define MAX_BLOCKS 512
#define STREAMS 4 /* slot 0: the default stream */
#define POOLS 2

typedef struct blk {
    int pool;
    uint64_t address, requested, size; /* size: the bytes the pool counted */
    int stream;                         /* allocation's stream slot */
    int use_stream;                     /* last stream with work on it (-1: none) */
    uint32_t pins;
    bool live;     /* false: freed but pinned (or a capture's footprint) */
    bool captured; /* allocated during a capture of its stream */
} blk;

typedef struct fuzz {
    fixture f; /* device (and its log); the pools are ours */
    tp_pool *pool[POOLS];
    tp_pool_config config[POOLS];
    tp_stream stream[STREAMS];
    bool capturing[POOLS][STREAMS]; /* the pool was told (tp_pool_capture_begin) */
    bool device_capturing[STREAMS]; /* the simulated device captures the stream */
    blk b[MAX_BLOCKS];
    int n;
    test_rng rng;
    uint64_t step;
    uint64_t seed;
    /* The observer's counts, while set on pool 0. */
    bool observing;
    uint64_t observed_allocs, observed_frees, expected_allocs, expected_frees;
    /* Steps left with device faults injected (any call may then fail with
     * TP_ERR_DEVICE or TP_ERR_OUT_OF_MEMORY, and must leave the pool as it
     * was). */
    uint64_t faults_left;
    bool fault_injection; /* TP_FUZZ_FAULTS=0 turns it off */
    /* Tallies for the summary line. */
    uint64_t ok_calls, refused_calls;
} fuzz;

/* ---------------------------------------------------------------- helpers */


static int find_block(fuzz *z, int pool, uint64_t address, bool live_only) {
    for (int i = 0; i < z->n; i++)
        if (z->b[i].pool == pool && z->b[i].address == address && (!live_only || z->b[i].live)) return i;
    return -1;
}

/* The model block of pool that holds the byte at address, or -1. */
static int block_containing(fuzz *z, int pool, uint64_t address) {
    for (int i = 0; i < z->n; i++)
        if (z->b[i].pool == pool && address >= z->b[i].address && address - z->b[i].address < z->b[i].size) return i;
    return -1;
}

static void drop_block(fuzz *z, int i) { z->b[i] = z->b[--z->n]; }

static int random_live(fuzz *z, int pool) {
    int candidates[MAX_BLOCKS], count = 0;
    for (int i = 0; i < z->n; i++)
        if (z->b[i].live && (pool < 0 || z->b[i].pool == pool)) candidates[count++] = i;
    return count ? candidates[rnd(z, (uint64_t)count)] : -1;
}

static bool any_capture(fuzz *z) {
    for (int s = 0; s < STREAMS; s++)
        if (z->device_capturing[s]) return true;
    for (int p = 0; p < POOLS; p++)
        for (int s = 0; s < STREAMS; s++)
            if (z->capturing[p][s]) return true;
    return false;
}

/* Work on another stream than the one that last used a block must not race
 * with it (the caller's promise, as with cudaFree): wait for that stream. */
static void order_after_use(fuzz *z, blk *b, int stream) {
    if (b->use_stream >= 0 && b->use_stream != stream)
        CHECK_OK(tp_stream_synchronize(z->f.dev, z->stream[b->use_stream]));
    b->use_stream = stream;
}

static void observe(void *user, const tp_pool_event *event) {
    fuzz *z = user;
    if (event->kind == TP_POOL_EVENT_ALLOC) z->observed_allocs++;
    if (event->kind == TP_POOL_EVENT_FREE) z->observed_frees++;
}



/* ---------------------------------------------------------------- checks */

static void check_pool(fuzz *z, int p) {
    tp_pool *pool = z->pool[p];
    char msg[256] = "";
    tp_status st = tp_pool_check(pool, msg, sizeof msg);
    if (st != TP_OK) FAIL_AT(z, "pool %d check: %s: %s", p, tp_status_name(st), msg);
    uint64_t allocated = 0, requested = 0, pinned = 0, freed_pinned = 0;
    for (int i = 0; i < z->n; i++) {
        const blk *b = &z->b[i];
        if (b->pool != p) continue;
        if (b->live) {
            allocated += b->size;
            requested += b->requested;
        } else {
            freed_pinned += b->size;
        }
        if (b->pins) pinned += b->size;
    }
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(pool, &s));
    if (s.allocated_bytes.current != allocated)
        FAIL_AT(z, "pool %d allocated %" PRIu64 ", model %" PRIu64, p, s.allocated_bytes.current, allocated);
    if (s.requested_bytes.current != requested)
        FAIL_AT(z, "pool %d requested %" PRIu64 ", model %" PRIu64, p, s.requested_bytes.current, requested);
    if (s.pinned_bytes.current != pinned)
        FAIL_AT(z, "pool %d pinned %" PRIu64 ", model %" PRIu64, p, s.pinned_bytes.current, pinned);
    if (s.reserved_bytes.current < allocated + freed_pinned ||
        s.cached_bytes.current != s.reserved_bytes.current - allocated - freed_pinned)
        FAIL_AT(z, "pool %d reserved %" PRIu64 " cached %" PRIu64 ", model allocated %" PRIu64 " freed-pinned %" PRIu64,
                p, s.reserved_bytes.current, s.cached_bytes.current, allocated, freed_pinned);
    if (s.reserved_bytes.current > s.limit_bytes)
        FAIL_AT(z, "pool %d reserved %" PRIu64 " above its limit %" PRIu64, p, s.reserved_bytes.current, s.limit_bytes);
    uint64_t cur[] = {s.requested_bytes.current, s.allocated_bytes.current, s.reserved_bytes.current,
                      s.cached_bytes.current, s.pinned_bytes.current};
    uint64_t peak[] = {s.requested_bytes.peak, s.allocated_bytes.peak, s.reserved_bytes.peak, s.cached_bytes.peak,
                       s.pinned_bytes.peak};
    for (int k = 0; k < 5; k++)
        if (peak[k] < cur[k]) FAIL_AT(z, "pool %d stat %d: peak %" PRIu64 " below current %" PRIu64, p, k, peak[k], cur[k]);
    if (s.hazards) FAIL_AT(z, "pool %d counted %" PRIu64 " hazards", p, s.hazards);
}

static void check_no_overlap(fuzz *z) {
    for (int i = 0; i < z->n; i++)
        for (int j = i + 1; j < z->n; j++) {
            const blk *a = &z->b[i], *c = &z->b[j];
            if (a->address < c->address + c->size && c->address < a->address + a->size)
                FAIL_AT(z, "blocks overlap: pool %d 0x%" PRIx64 "+%" PRIu64 " and pool %d 0x%" PRIx64 "+%" PRIu64, a->pool,
                        a->address, a->size, c->pool, c->address, c->size);
        }
}

static void check_device(fuzz *z) {
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(z->f.dev, &c));
    FUZZ_CHECK_DEVICE(z, c);
}

/* Reads "address":"0x..","bytes":N,"state":"S" entries from the memory map
 * and checks the live and pinned ones are exactly the model's live blocks,
 * and the freed-pinned bytes the model's. */
static void check_snapshot(fuzz *z, int p) {
    size_t length = 0;
    tp_status st = tp_pool_snapshot_json(z->pool[p], NULL, 0, &length);
    if (st != TP_ERR_BUFFER_TOO_SMALL && st != TP_OK) FAIL_AT(z, "snapshot length: %s", tp_status_name(st));
    char *buf = malloc(length + 1);
    REQUIRE(buf);
    size_t again = 0;
    st = tp_pool_snapshot_json(z->pool[p], buf, length + 1, &again);
    if (st != TP_OK || again != length || strlen(buf) != length)
        FAIL_AT(z, "snapshot: %s, length %zu then %zu, strlen %zu", tp_status_name(st), length, again, strlen(buf));
    int live_seen = 0, live_model = 0;
    uint64_t freed_pinned_seen = 0, freed_pinned_model = 0;
    for (int i = 0; i < z->n; i++) {
        if (z->b[i].pool != p) continue;
        if (z->b[i].live) live_model++;
        else freed_pinned_model += z->b[i].size;
    }
    for (const char *at = strstr(buf, "{\"address\""); at; at = strstr(at + 1, "{\"address\"")) {
        unsigned long long address = 0, bytes = 0;
        char state[32] = "";
        if (sscanf(at, "{\"address\":\"0x%llx\",\"bytes\":%llu,\"state\":\"%31[a-z_]\"", &address, &bytes, state) != 3) {
            FAIL_AT(z, "snapshot entry unreadable: %.80s", at);
            break;
        }
        if (!strcmp(state, "live") || !strcmp(state, "pinned")) {
            live_seen++;
            int i = find_block(z, p, address, true);
            if (i < 0) FAIL_AT(z, "pool %d map: live block 0x%llx the model does not have", p, address);
            else if (z->b[i].size != bytes || (z->b[i].pins > 0) != !strcmp(state, "pinned"))
                FAIL_AT(z, "pool %d map: block 0x%llx %llu bytes %s, model %" PRIu64 " bytes %u pins", p, address, bytes,
                        state, z->b[i].size, z->b[i].pins);
        } else if (!strcmp(state, "freed_pinned")) {
            freed_pinned_seen += bytes;
        }
    }
    if (live_seen != live_model) FAIL_AT(z, "pool %d map: %d live blocks, model %d", p, live_seen, live_model);
    if (freed_pinned_seen != freed_pinned_model)
        FAIL_AT(z, "pool %d map: %" PRIu64 " freed-pinned bytes, model %" PRIu64, p, freed_pinned_seen, freed_pinned_model);
    free(buf);
    for (int i = 0; i < z->n; i++) {
        if (z->b[i].pool != p || !z->b[i].live) continue;
        size_t bytes = 0;
        st = tp_pool_block_size(z->pool[p], (void *)(uintptr_t)z->b[i].address, &bytes);
        if (st != TP_OK || bytes != z->b[i].requested)
            FAIL_AT(z, "block_size(0x%" PRIx64 "): %s %zu, model %" PRIu64, z->b[i].address, tp_status_name(st), bytes,
                    z->b[i].requested);
    }
}

static void check_all(fuzz *z, bool deep) {
    for (int p = 0; p < POOLS; p++) {
        check_pool(z, p);
        if (deep) check_snapshot(z, p);
    }
    check_no_overlap(z);
    check_device(z);
    if (z->observing && (z->observed_allocs != z->expected_allocs || z->observed_frees != z->expected_frees))
        FAIL_AT(z, "observer saw %" PRIu64 " allocs %" PRIu64 " frees, expected %" PRIu64 " and %" PRIu64,
                z->observed_allocs, z->observed_frees, z->expected_allocs, z->expected_frees);
}

/* ---------------------------------------------------------------- steps */

static uint64_t allocated_now(fuzz *z, int p) {
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(z->pool[p], &s));
    return s.allocated_bytes.current;
}

static size_t random_size(fuzz *z) {
    switch (rnd(z, 12)) {
    case 0: return 0;
    case 1: return 1;
    case 2: return SIZE_MAX - rnd(z, 4096);
    case 3: return (SIZE_MAX >> rnd(z, 40)) - rnd(z, 3);
    case 4: return (size_t)rng_log_uniform(&z->rng, 2 * TEST_MiB, 96 * TEST_MiB);
    default: return (size_t)rng_log_uniform(&z->rng, 1, 2 * TEST_MiB);
    }
}

static void step_alloc(fuzz *z) {
    int p = (int)rnd(z, POOLS), s = (int)rnd(z, STREAMS);
    bool bogus = chance(z, 5);
    tp_stream stream = bogus ? fuzz_bogus_stream(&z->rng, z->f.dev) : z->stream[s];
    size_t bytes = random_size(z);
    if (z->n >= MAX_BLOCKS - 8) bytes = 0;
    uint64_t before = allocated_now(z, p);
    if (chance(z, 2)) {
        tp_status st = tp_pool_alloc(z->pool[p], bytes ? bytes : 1, stream, NULL);
        EXPECT_IN(z, "alloc(out NULL)", st, TP_ERR_INVALID_ARGUMENT);
        return;
    }
    void *ptr = (void *)(uintptr_t)0x1234;
    tp_status st = tp_pool_alloc(z->pool[p], bytes, stream, &ptr);
    if (bytes == 0 || bogus) {
        EXPECT_IN(z, "alloc(0 bytes or unknown stream)", st, TP_ERR_INVALID_ARGUMENT);
    } else {
        EXPECT_IN(z, "alloc", st, TP_OK, TP_ERR_OUT_OF_MEMORY);
        if (bytes > z->config[p].limit_bytes && st == TP_OK)
            FAIL_AT(z, "alloc of %zu above the limit succeeded", bytes);
    }
    if (st != TP_OK) {
        if (ptr) FAIL_AT(z, "failed alloc left *out_ptr %p", ptr);
        if (st == TP_ERR_OUT_OF_MEMORY) {
            tp_oom_report r;
            CHECK_OK(tp_pool_last_oom_report(z->pool[p], &r));
            if (r.request_bytes != bytes) FAIL_AT(z, "oom report for %" PRIu64 " bytes, asked %zu", r.request_bytes, bytes);
        }
        return;
    }
    uint64_t address = (uint64_t)(uintptr_t)ptr;
    uint64_t size = allocated_now(z, p) - before;
    if (!ptr || address % z->config[p].alignment_bytes || size < bytes || size % z->config[p].alignment_bytes)
        FAIL_AT(z, "alloc(%zu) gave %p counted as %" PRIu64 " bytes", bytes, ptr, size);
    if (z->observing && p == 0) z->expected_allocs++;
    TRACE(z, "alloc pool %d stream %d %zu -> 0x%" PRIx64 "+%" PRIu64 "%s", p, s, bytes, address, size,
          z->capturing[p][s] ? " (captured)" : "");
    if (z->n >= MAX_BLOCKS) {
        FAIL_AT(z, "model full");
        return;
    }
    /* (The allocation is ordered on s, after work of a previous owner of
     * the memory on s: another stream may use it only after s.) */
    z->b[z->n++] = (blk){.pool = p, .address = address, .requested = bytes, .size = size, .stream = s,
                         .use_stream = s, .live = true, .captured = z->capturing[p][s]};
    /* Kernels touch it (recorded, not run, while a capture goes on: the
     * simulator does not know of pool-level captures, so it runs them). */
    if (chance(z, 60)) {
        tp_range r = {address, bytes < 64 * 1024 ? bytes : 64 * 1024};
        CHECK_OK(tp_sim_launch(z->f.dev, z->stream[s], rnd(z, 3 * MS), &r, 1));
    }
}

static void step_free_live(fuzz *z) {
    int i = random_live(z, -1);
    if (i < 0) return;
    blk *b = &z->b[i];
    int p = b->pool;
    int s = chance(z, 70) ? b->stream : (int)rnd(z, STREAMS);
    /* (a capturing stream cannot be waited for: its blocks go back on it) */
    if (b->use_stream >= 0 && z->device_capturing[b->use_stream]) s = b->use_stream;
    if (chance(z, 5)) { /* unknown stream: refused, the block stays */
        tp_status st = tp_pool_free(z->pool[p], (void *)(uintptr_t)b->address, fuzz_bogus_stream(&z->rng, z->f.dev));
        EXPECT_IN(z, "free(unknown stream)", st, TP_ERR_INVALID_ARGUMENT);
        return;
    }
    if (chance(z, 5)) { /* the other pool's block */
        tp_status st = tp_pool_free(z->pool[1 - p], (void *)(uintptr_t)b->address, z->stream[s]);
        EXPECT_IN(z, "free(other pool's block)", st, TP_ERR_NOT_OWNED, TP_ERR_INVALID_ARGUMENT);
        return;
    }
    order_after_use(z, b, s);
    tp_status st = tp_pool_free(z->pool[p], (void *)(uintptr_t)b->address, z->stream[s]);
    EXPECT_IN(z, "free(live)", st, TP_OK);
    if (st != TP_OK) return;
    TRACE(z, "free pool %d stream %d 0x%" PRIx64 " (%u pins)", p, s, b->address, b->pins);
    if (z->observing && p == 0) z->expected_frees++;
    if (b->pins) b->live = false;
    else drop_block(z, i);
}

/* A pointer that is not a live block's start: freeing it must fail. */
static void step_free_bad(fuzz *z) {
    int p = (int)rnd(z, POOLS);
    uint64_t address;
    int i = random_live(z, -1);
    switch (rnd(z, 7)) {
    case 0: address = UINT64_MAX - rnd(z, 3) * 256; break;
    case 1: address = rnd(z, 1ull << 48); break;
    case 2: address = i >= 0 ? z->b[i].address + 1 + rnd(z, z->b[i].size - 1) : 1; break; /* interior, misaligned */
    case 3: address = i >= 0 ? z->b[i].address + 256 * (1 + rnd(z, 4)) : 256; break;       /* interior, aligned */
    case 4: address = i >= 0 ? z->b[i].address + z->b[i].size : 512; break;               /* just past a block */
    case 5: address = i >= 0 && z->b[i].address >= 256 ? z->b[i].address - 256 : 4096; break;
    default: address = 0; break;
    }
    int at = find_block(z, p, address, true);
    tp_stream stream = z->stream[rnd(z, STREAMS)];
    if (at >= 0) return; /* a real block after all: not this step's business */
    tp_status st = tp_pool_free(z->pool[p], (void *)(uintptr_t)address, stream);
    if (address == 0) {
        EXPECT_IN(z, "free(NULL)", st, TP_OK);
    } else {
        EXPECT_IN(z, "free(bad pointer)", st, TP_ERR_NOT_OWNED, TP_ERR_DOUBLE_FREE, TP_ERR_NOT_BLOCK_START);
        z->f.log.errors = 0; /* refusals are logged at ERROR on purpose */
    }
    size_t bytes = 0;
    st = tp_pool_block_size(z->pool[p], (void *)(uintptr_t)address, &bytes);
    EXPECT_IN(z, "block_size(bad pointer)", st, TP_ERR_NOT_OWNED);
}

/* Double frees: allocate, free, free again (the address may have been
 * handed out meanwhile only by an allocation we make: none). */
static void step_double_free(fuzz *z) {
    int p = (int)rnd(z, POOLS), s = (int)rnd(z, STREAMS);
    void *ptr;
    size_t bytes = (size_t)rng_log_uniform(&z->rng, 1, 4 * TEST_MiB);
    if (tp_pool_alloc(z->pool[p], bytes, z->stream[s], &ptr) != TP_OK) return;
    /* (During a capture of the stream the block is recorded; once freed,
     * only the footprint at the capture's end remembers it.) */
    if (z->observing && p == 0) z->expected_allocs++, z->expected_frees++;
    int s_free = chance(z, 80) || z->device_capturing[s] ? s : (int)rnd(z, STREAMS);
    if (s_free != s) CHECK_OK(tp_stream_synchronize(z->f.dev, z->stream[s]));
    CHECK_OK(tp_pool_free(z->pool[p], ptr, z->stream[s_free]));
    TRACE(z, "alloc+free pool %d stream %d %zu -> %p%s", p, s, bytes, ptr, z->capturing[p][s] ? " (captured)" : "");
    int s2 = (int)rnd(z, STREAMS);
    tp_status st = tp_pool_free(z->pool[p], ptr, z->stream[s2]);
    EXPECT_IN(z, "free(freed)", st, TP_ERR_DOUBLE_FREE, TP_ERR_NOT_OWNED);
    z->f.log.errors = 0;
}

/* Does the union of pool p's model blocks cover [a, a + n)? */
static bool covered(fuzz *z, int p, uint64_t a, uint64_t n) {
    uint64_t at = a, end = a + n;
    while (at < end) {
        int i = block_containing(z, p, at);
        if (i < 0) return false;
        at = z->b[i].address + z->b[i].size;
    }
    return true;
}

static void step_pin(fuzz *z, bool unpin) {
    int p = (int)rnd(z, POOLS);
    int i = -1;
    for (int tries = 0; tries < 4 && i < 0; tries++) {
        int j = (int)rnd(z, (uint64_t)(z->n ? z->n : 1));
        if (j < z->n && z->b[j].pool == p) i = j;
    }
    uint64_t a, n;
    switch (rnd(z, 8)) {
    case 0: a = i >= 0 ? z->b[i].address : 4096, n = 0; break;
    case 1: a = i >= 0 ? z->b[i].address : 4096, n = SIZE_MAX - rnd(z, 2); break;
    case 2: a = i >= 0 ? z->b[i].address + rnd(z, z->b[i].size) : 4096, n = 1 + rnd(z, 4096); break;
    case 3: a = i >= 0 ? z->b[i].address : 4096, n = i >= 0 ? z->b[i].size + rnd(z, 8 * TEST_MiB) : 1; break;
    case 4: a = UINT64_MAX - rnd(z, 4096), n = 1 + rnd(z, 8192); break;
    case 5: a = rnd(z, 1ull << 48), n = 1 + rnd(z, TEST_MiB); break;
    default: a = i >= 0 ? z->b[i].address : 4096, n = i >= 0 ? z->b[i].size : 256; break;
    }
    bool wraps = n > UINT64_MAX - a;
    bool ok = n > 0 && !wraps && covered(z, p, a, n);
    if (ok && unpin)
        for (int j = 0; j < z->n; j++)
            if (z->b[j].pool == p && z->b[j].address < a + n && a < z->b[j].address + z->b[j].size && !z->b[j].pins)
                ok = false;
    tp_status st = unpin ? tp_pool_unpin(z->pool[p], (void *)(uintptr_t)a, (size_t)n)
                         : tp_pool_pin(z->pool[p], (void *)(uintptr_t)a, (size_t)n);
    const char *what = unpin ? "unpin" : "pin";
    if (ok) {
        EXPECT_IN(z, what, st, TP_OK);
    } else {
        EXPECT_IN(z, what, st, TP_ERR_INVALID_ARGUMENT, TP_ERR_NOT_OWNED);
        if (st == TP_OK) FAIL_AT(z, "%s(0x%" PRIx64 ", %" PRIu64 ") succeeded outside the model", what, a, n);
    }
    if (st != TP_OK) return;
    TRACE(z, "%s pool %d 0x%" PRIx64 "+%" PRIu64, what, p, a, n);
    for (int j = 0; j < z->n; j++) {
        blk *b = &z->b[j];
        if (b->pool != p || !(b->address < a + n && a < b->address + b->size)) continue;
        if (!unpin) {
            b->pins++;
        } else if (--b->pins == 0 && !b->live) {
            drop_block(z, j);
            j--;
        }
    }
}

static void end_pool_capture(fuzz *z, int p, int s);

static void step_capture(fuzz *z) {
    int p = (int)rnd(z, POOLS), s = (int)rnd(z, STREAMS);
    bool begin = chance(z, 50);
    if (chance(z, 5)) {
        tp_stream bad = fuzz_bogus_stream(&z->rng, z->f.dev);
        if (begin) {
            EXPECT_IN(z, "capture_begin(unknown stream)", tp_pool_capture_begin(z->pool[p], bad), TP_ERR_INVALID_ARGUMENT);
        } else {
            tp_range *r = (tp_range *)(uintptr_t)1;
            size_t c = 7;
            EXPECT_IN(z, "capture_end(unknown stream)", tp_pool_capture_end(z->pool[p], bad, &r, &c), TP_ERR_CAPTURE,
                      TP_ERR_INVALID_ARGUMENT);
            if (r || c) FAIL_AT(z, "failed capture_end left ranges");
        }
        return;
    }
    if (begin) {
        tp_status st = tp_pool_capture_begin(z->pool[p], z->stream[s]);
        EXPECT_IN(z, "capture_begin", st, z->capturing[p][s] ? TP_ERR_CAPTURE : TP_OK);
        if (st == TP_OK) z->capturing[p][s] = true;
        if (st == TP_OK) TRACE(z, "capture_begin pool %d stream %d", p, s);
        return;
    }
    if (chance(z, 5)) {
        EXPECT_IN(z, "capture_end(NULL out)", tp_pool_capture_end(z->pool[p], z->stream[s], NULL, NULL),
                  TP_ERR_INVALID_ARGUMENT);
        return;
    }
    end_pool_capture(z, p, s);
}

static void end_pool_capture(fuzz *z, int p, int s) {
    tp_range *ranges = (tp_range *)(uintptr_t)1;
    size_t count = 99;
    tp_status st = tp_pool_capture_end(z->pool[p], z->stream[s], &ranges, &count);
    EXPECT_IN(z, "capture_end", st, z->capturing[p][s] ? TP_OK : TP_ERR_CAPTURE);
    if (st != TP_OK) {
        if (ranges || count) FAIL_AT(z, "failed capture_end left ranges");
        return;
    }
    z->capturing[p][s] = false;
    TRACE(z, "capture_end pool %d stream %d: %zu ranges", p, s, count);
    for (size_t k = 0; k < count; k++) TRACE(z, "  0x%" PRIx64 "+%" PRIu64, ranges[k].address, ranges[k].bytes);
    /* Every block of the capture, live still, lies in the footprint. */
    for (size_t k = 0; k < count; k++) {
        if (!ranges[k].bytes || (k && ranges[k].address < ranges[k - 1].address + ranges[k - 1].bytes))
            FAIL_AT(z, "capture range %zu empty or out of order", k);
    }
    for (int j = 0; j < z->n; j++) {
        blk *b = &z->b[j];
        if (b->pool != p || !b->captured || b->stream != s) continue;
        bool inside = false;
        for (size_t k = 0; k < count && !inside; k++)
            inside = b->address >= ranges[k].address && b->address + b->size <= ranges[k].address + ranges[k].bytes;
        if (!inside) FAIL_AT(z, "captured block 0x%" PRIx64 " not in the footprint", b->address);
        b->captured = false;
    }
    /* The model: blocks overlapping the ranges get a pin; the rest of each range is
     * kept freed-pinned, one pin. */
    for (size_t k = 0; k < count; k++) {
        uint64_t at = ranges[k].address, end = at + ranges[k].bytes;
        for (int j = 0; j < z->n; j++) {
            blk *b = &z->b[j];
            if (b->pool == p && b->address < end && at < b->address + b->size) {
                /* (a block may reach past the range: a capture block freed on
                 * another stream and reused there lies inside a larger one) */
                b->pins++;
            }
        }
        while (at < end) {
            int j = block_containing(z, p, at);
            if (j >= 0) {
                at = z->b[j].address + z->b[j].size;
                continue;
            }
            /* a gap up to the next model block (or the range's end) */
            uint64_t next = end;
            for (int q = 0; q < z->n; q++)
                if (z->b[q].pool == p && z->b[q].address > at && z->b[q].address < next) next = z->b[q].address;
            if (z->n >= MAX_BLOCKS) {
                FAIL_AT(z, "model full");
                break;
            }
            z->b[z->n++] = (blk){.pool = p, .address = at, .requested = 0, .size = next - at, .stream = s,
                                 .use_stream = -1, .pins = 1, .live = false};
            at = next;
        }
    }
    /* Now unpin some of it at once, or keep it for later unpins. */
    if (chance(z, 60)) {
        for (size_t k = 0; k < count; k++) {
            tp_status u = tp_pool_unpin(z->pool[p], (void *)(uintptr_t)ranges[k].address, ranges[k].bytes);
            EXPECT_IN(z, "unpin(capture range)", u, TP_OK);
            if (u != TP_OK) continue;
            uint64_t at = ranges[k].address, end = at + ranges[k].bytes;
            for (int j = 0; j < z->n; j++) {
                blk *b = &z->b[j];
                if (b->pool != p || !(b->address < end && at < b->address + b->size)) continue;
                if (--b->pins == 0 && !b->live) {
                    drop_block(z, j);
                    j--;
                }
            }
        }
    }
    tp_pool_free_ranges(z->pool[p], ranges);
}

static void step_trim(fuzz *z) {
    int p = (int)rnd(z, POOLS);
    uint64_t target;
    switch (rnd(z, 5)) {
    case 0: target = 0; break;
    case 1: target = UINT64_MAX; break;
    case 2: target = 1 + rnd(z, 4096); break;
    default: target = rnd(z, 512 * TEST_MiB); break;
    }
    tp_pool_stats before, after;
    CHECK_OK(tp_pool_get_stats(z->pool[p], &before));
    uint64_t released = UINT64_MAX;
    tp_status st = tp_pool_trim(z->pool[p], target, chance(z, 20) ? NULL : &released);
    EXPECT_IN(z, "trim", st, TP_OK);
    CHECK_OK(tp_pool_get_stats(z->pool[p], &after));
    if (after.reserved_bytes.current > before.reserved_bytes.current)
        FAIL_AT(z, "trim grew the pool: %" PRIu64 " -> %" PRIu64, before.reserved_bytes.current, after.reserved_bytes.current);
    if (released != UINT64_MAX && released != before.reserved_bytes.current - after.reserved_bytes.current)
        FAIL_AT(z, "trim says %" PRIu64 " released, reserved %" PRIu64 " -> %" PRIu64, released,
                before.reserved_bytes.current, after.reserved_bytes.current);
}

static void step_text(fuzz *z) {
    int p = (int)rnd(z, POOLS);
    static const char *const labels[] = {NULL, "", "pool=\"kv\"", "a=\"1\",b=\"2\""};
    const char *label = labels[rnd(z, 4)];
    int which = (int)rnd(z, 3);
    size_t length = 0;
    tp_status st = which == 0   ? tp_pool_stats_json(z->pool[p], NULL, 0, &length)
                   : which == 1 ? tp_pool_stats_openmetrics(z->pool[p], label, NULL, 0, &length)
                                : tp_pool_snapshot_json(z->pool[p], NULL, 0, &length);
    EXPECT_IN(z, "text(capacity 0)", st, TP_ERR_BUFFER_TOO_SMALL);
    if (length == 0) FAIL_AT(z, "text output %d has length 0", which);
    size_t capacity = chance(z, 50) ? length + 1 : (size_t)rnd(z, length + 2);
    char *buf = malloc(capacity + 16);
    REQUIRE(buf);
    memset(buf, 'X', capacity + 16);
    size_t got = 0;
    st = which == 0   ? tp_pool_stats_json(z->pool[p], buf, capacity, &got)
         : which == 1 ? tp_pool_stats_openmetrics(z->pool[p], label, buf, capacity, &got)
                      : tp_pool_snapshot_json(z->pool[p], buf, capacity, &got);
    /* (the memory map's now_ns and idle times do not change without the
     * clock moving: same length) */
    if (got != length) FAIL_AT(z, "text %d: length %zu then %zu", which, length, got);
    EXPECT_IN(z, "text", st, capacity > length ? TP_OK : TP_ERR_BUFFER_TOO_SMALL);
    if (capacity > 0 && !memchr(buf, 0, capacity)) FAIL_AT(z, "text %d not NUL-terminated in %zu", which, capacity);
    for (size_t k = capacity; k < capacity + 16; k++)
        if (buf[k] != 'X') {
            FAIL_AT(z, "text %d wrote past its capacity %zu", which, capacity);
            break;
        }
    free(buf);
}

/* Forget a stream in both pools, destroy it, make a new one in its slot;
 * blocks live on it stay live, to be freed on other streams. */
static void step_replace_stream(fuzz *z) {
    int s = 1 + (int)rnd(z, STREAMS - 1);
    if (z->device_capturing[s]) return; /* destroying it would invalidate the capture */
    for (int p = 0; p < POOLS; p++) {
        tp_status st = tp_pool_forget_stream(z->pool[p], z->stream[s]);
        EXPECT_IN(z, "forget_stream", st, z->capturing[p][s] ? TP_ERR_CAPTURE : TP_OK);
        if (st != TP_OK) return; /* it captures: keep it */
    }
    CHECK_OK(tp_stream_synchronize(z->f.dev, z->stream[s]));
    CHECK_OK(tp_stream_destroy(z->f.dev, z->stream[s]));
    for (int j = 0; j < z->n; j++)
        if (z->b[j].use_stream == s) z->b[j].use_stream = -1; /* its work is done */
    REQUIRE_OK(tp_stream_create(z->f.dev, &z->stream[s]));
    /* forgetting an unknown stream is no error */
    EXPECT_IN(z, "forget_stream(unknown)", tp_pool_forget_stream(z->pool[rnd(z, POOLS)], fuzz_bogus_stream(&z->rng, z->f.dev)), TP_OK);
}

static uint64_t reclaim_nothing(void *user, tp_pool *pool, uint64_t bytes_needed) {
    (void)user;
    (void)pool;
    (void)bytes_needed;
    return 0;
}

static void step_misc(fuzz *z) {
    int p = (int)rnd(z, POOLS);
    switch (rnd(z, 8)) {
    case 0: EXPECT_IN(z, "tick", tp_pool_tick(z->pool[p]), TP_OK); break;
    case 1: CHECK_OK(tp_sim_advance(z->f.dev, rnd(z, 4) == 0 ? 11000 * MS : rnd(z, 5 * MS))); break;
    case 2: EXPECT_IN(z, "reset_peaks", tp_pool_reset_peaks(z->pool[p]), TP_OK); break;
    case 3: {
        tp_status st = tp_pool_add_reclaim_callback(z->pool[p], reclaim_nothing, z);
        EXPECT_IN(z, "add_reclaim", st, TP_OK, TP_ERR_BUSY, TP_ERR_HOST_OUT_OF_MEMORY);
        st = tp_pool_remove_reclaim_callback(z->pool[p], reclaim_nothing, z);
        EXPECT_IN(z, "remove_reclaim", st, TP_OK);
        st = tp_pool_remove_reclaim_callback(z->pool[p], reclaim_nothing, z);
        EXPECT_IN(z, "remove_reclaim(again)", st, TP_ERR_NOT_FOUND);
        break;
    }
    case 4: {
        if (z->observing) {
            CHECK_OK(tp_pool_set_observer(z->pool[0], NULL, NULL));
            z->observing = false;
        } else {
            z->observed_allocs = z->observed_frees = z->expected_allocs = z->expected_frees = 0;
            CHECK_OK(tp_pool_set_observer(z->pool[0], observe, z));
            z->observing = true;
        }
        break;
    }
    case 5: {
        tp_device *d = NULL;
        CHECK_OK(tp_pool_get_device(z->pool[p], &d));
        CHECK(d == z->f.dev);
        tp_oom_report r;
        EXPECT_IN(z, "last_oom_report", tp_pool_last_oom_report(z->pool[p], &r), TP_OK, TP_ERR_NOT_FOUND);
        break;
    }
    case 6:
        if (!any_capture(z)) CHECK_OK(tp_device_synchronize(z->f.dev));
        break;
    default: {
        /* NULL out-parameters */
        EXPECT_IN(z, "get_stats(NULL)", tp_pool_get_stats(z->pool[p], NULL), TP_ERR_INVALID_ARGUMENT);
        EXPECT_IN(z, "block_size(NULL out)", tp_pool_block_size(z->pool[p], NULL, NULL), TP_ERR_INVALID_ARGUMENT);
        EXPECT_IN(z, "pin(NULL pool)", tp_pool_pin(NULL, (void *)4096, 1), TP_ERR_INVALID_ARGUMENT);
        EXPECT_IN(z, "check(NULL msg)", tp_pool_check(z->pool[p], NULL, 0), TP_OK);
        break;
    }
    }
}

/* A capture on the device, as a program records a graph: begin (telling
 * some pools first, as the header asks, or none: the pool must find out
 * from the device), then end on the device and in the told pools. The pool
 * must never invalidate it (no event recorded, queried or waited for on
 * the stream). */
static void step_device_capture(fuzz *z) {
    int s = (int)rnd(z, STREAMS);
    if (!z->device_capturing[s]) {
        if (s == 0) { /* the default stream cannot capture */
            EXPECT_IN(z, "sim_capture_begin(default)", tp_sim_capture_begin(z->f.dev, z->stream[0]), TP_ERR_CAPTURE);
            return;
        }
        for (int p = 0; p < POOLS; p++)
            if (!z->capturing[p][s] && chance(z, 50)) {
                CHECK_OK(tp_pool_capture_begin(z->pool[p], z->stream[s]));
                z->capturing[p][s] = true;
            }
        CHECK_OK(tp_sim_capture_begin(z->f.dev, z->stream[s]));
        z->device_capturing[s] = true;
        TRACE(z, "device capture begins on stream %d", s);
        return;
    }
    tp_graph graph = NULL;
    EXPECT_IN(z, "sim_capture_end", tp_sim_capture_end(z->f.dev, z->stream[s], &graph), TP_OK);
    z->device_capturing[s] = false;
    TRACE(z, "device capture ends on stream %d", s);
    for (int p = 0; p < POOLS; p++)
        if (z->capturing[p][s] && chance(z, 80)) end_pool_capture(z, p, s);
    if (graph) CHECK_OK(tp_sim_graph_destroy(z->f.dev, graph));
}

/* The device fails some of its next map, unmap, malloc, free or event
 * calls for a few steps (host waits are left alone: the harness makes
 * them itself). */
static void step_faults(fuzz *z) {
    static const tp_sim_op ops[] = {TP_SIM_OP_MAP, TP_SIM_OP_UNMAP, TP_SIM_OP_MALLOC, TP_SIM_OP_FREE, TP_SIM_OP_EVENT};
    tp_sim_op op = ops[rnd(z, sizeof ops / sizeof *ops)];
    tp_status status = chance(z, 50) ? TP_ERR_OUT_OF_MEMORY : TP_ERR_DEVICE;
    CHECK_OK(tp_sim_inject_fault(z->f.dev, op, rnd(z, 4), 1 + rnd(z, 3), status));
    z->faults_left = 5 + rnd(z, 20);
    TRACE(z, "faults: %s fails with %s", tp_sim_op_name(op), tp_status_name(status));
}

/* ------------------------------------------------------------- the run */

static void random_pool_config(fuzz *z, int p) {
    tp_pool_config c = {.kind = p == 0 ? TP_POOL_VMM : TP_POOL_SEGMENT};
    c.limit_bytes = chance(z, 30) ? 0 : rng_log_uniform(&z->rng, 4 * TEST_MiB, 512 * TEST_MiB);
    if (chance(z, 30)) c.alignment_bytes = 256ull << rnd(z, 8);
    if (chance(z, 30)) c.release_threshold_bytes = chance(z, 50) ? TP_BYTES_UNLIMITED : 1 + rnd(z, 64 * TEST_MiB);
    if (chance(z, 30)) c.idle_release_ns = chance(z, 50) ? TP_NS_NEVER : 1 + rnd(z, 20 * MS);
    if (chance(z, 30)) c.tcache_max_block_bytes = 1 + rnd(z, 64 * TEST_MiB);
    if (p == 0 && chance(z, 30)) c.max_chunk_bytes = 2 * TEST_MiB << rnd(z, 5);
    if (p == 1 && chance(z, 30)) c.growth_step_percent = 1 + (uint32_t)rnd(z, 200);
    z->config[p] = c;
}

static void fuzz_run(uint64_t seed, uint64_t steps) {
    fuzz *z = calloc(1, sizeof *z);
    REQUIRE(z);
    z->seed = seed;
    z->rng.state = seed;
    z->fault_injection = env_u64("TP_FUZZ_FAULTS", 1) != 0;
    fixture_open_device(&z->f, "sim:2GiB");
    for (int p = 0; p < POOLS; p++) {
        random_pool_config(z, p);
        REQUIRE_OK(tp_pool_create(z->f.dev, &z->config[p], &z->pool[p]));
        tp_pool_stats s;
        CHECK_OK(tp_pool_get_stats(z->pool[p], &s));
        z->config[p].limit_bytes = s.limit_bytes;
        if (!z->config[p].alignment_bytes) z->config[p].alignment_bytes = 256;
    }
    z->stream[0] = TP_STREAM_DEFAULT;
    for (int s = 1; s < STREAMS; s++) REQUIRE_OK(tp_stream_create(z->f.dev, &z->stream[s]));
    for (z->step = 0; z->step < steps && check_failures == 0; z->step++) {
        unsigned r = (unsigned)rnd(z, 100);
        if (r < 34) step_alloc(z);
        else if (r < 58) step_free_live(z);
        else if (r < 64) step_free_bad(z);
        else if (r < 67) step_double_free(z);
        else if (r < 73) step_pin(z, false);
        else if (r < 79) step_pin(z, true);
        else if (r < 83) step_capture(z);
        else if (r < 86) step_trim(z);
        else if (r < 88) step_text(z);
        else if (r < 89) step_replace_stream(z);
        else if (r < 91) step_device_capture(z);
        else if (r < 93 && !z->faults_left && z->fault_injection) step_faults(z);
        else step_misc(z);
        if (z->faults_left && --z->faults_left == 0) CHECK_OK(tp_sim_clear_faults(z->f.dev));
        check_all(z, z->step % 32 == 0);
    }
    if (z->faults_left) CHECK_OK(tp_sim_clear_faults(z->f.dev));
    z->faults_left = 0;
    for (int s = 0; s < STREAMS; s++)
        if (z->device_capturing[s])
            {
                tp_graph graph = NULL;
                CHECK_OK(tp_sim_capture_end(z->f.dev, z->stream[s], &graph));
                z->device_capturing[s] = false;
                if (graph) CHECK_OK(tp_sim_graph_destroy(z->f.dev, graph));
            }
    /* Wind down: end captures, unpin and free everything, and check the
     * pools hand every byte back. */
    if (check_failures == 0) {
        for (int p = 0; p < POOLS; p++)
            for (int s = 0; s < STREAMS; s++)
                if (z->capturing[p][s] && chance(z, 70)) {
                    tp_range *ranges;
                    size_t count;
                    CHECK_OK(tp_pool_capture_end(z->pool[p], z->stream[s], &ranges, &count));
                    z->capturing[p][s] = false;
                    for (size_t k = 0; k < count; k++)
                        CHECK_OK(tp_pool_unpin(z->pool[p], (void *)(uintptr_t)ranges[k].address, ranges[k].bytes));
                    tp_pool_free_ranges(z->pool[p], ranges);
                }
    }
    if (check_failures == 0 && chance(z, 50)) {
        for (int j = 0; j < z->n; j++)
            while (z->b[j].pins) {
                tp_status st = tp_pool_unpin(z->pool[z->b[j].pool], (void *)(uintptr_t)z->b[j].address, 1);
                if (st != TP_OK) break;
                z->b[j].pins--;
            }
        for (int j = 0; j < z->n; j++) {
            if (!z->b[j].live) continue;
            order_after_use(z, &z->b[j], z->b[j].stream);
            CHECK_OK(tp_pool_free(z->pool[z->b[j].pool], (void *)(uintptr_t)z->b[j].address, z->stream[z->b[j].stream]));
        }
        z->n = 0;
        for (int p = 0; p < POOLS; p++) {
            tp_pool_stats s;
            CHECK_OK(tp_pool_get_stats(z->pool[p], &s));
            if (s.allocated_bytes.current || s.pinned_bytes.current || s.requested_bytes.current)
                FAIL_AT(z, "pool %d after freeing all: allocated %" PRIu64 " pinned %" PRIu64, p,
                        s.allocated_bytes.current, s.pinned_bytes.current);
        }
    }
    for (int p = 0; p < POOLS; p++) {
        bool mine = false;
        for (int s = 0; s < STREAMS; s++) mine |= z->capturing[p][s];
        tp_status st = tp_pool_destroy(z->pool[p]);
        /* A capture the pool was told of: refused, nothing destroyed. */
        EXPECT_IN(z, "destroy", st, mine ? TP_ERR_CAPTURE : TP_OK);
        if (!mine || st != TP_ERR_CAPTURE) continue; /* (destroyed, whatever it said) */
        check_pool(z, p);
        for (int s = 0; s < STREAMS; s++) {
            if (!z->capturing[p][s]) continue;
            tp_range *ranges;
            size_t count;
            CHECK_OK(tp_pool_capture_end(z->pool[p], z->stream[s], &ranges, &count));
            tp_pool_free_ranges(z->pool[p], ranges); /* pins left: destroy releases them */
        }
        EXPECT_IN(z, "destroy(after the captures)", tp_pool_destroy(z->pool[p]), TP_OK);
    }
    for (int s = 1; s < STREAMS; s++) CHECK_OK(tp_stream_destroy(z->f.dev, z->stream[s]));
    z->f.log.errors = 0; /* destroying live blocks warns; errors were checked per step */
    z->f.pool = NULL;
    fixture_close(&z->f);
    if (getenv("TP_TEST_VERBOSE"))
        printf("  seed %llu: %llu steps, %llu calls succeeded, %llu refused\n", (unsigned long long)seed,
               (unsigned long long)z->step, (unsigned long long)z->ok_calls, (unsigned long long)z->refused_calls);
    free(z);
}


static void test_random_call_sequences(void) {
    fuzz_seeds(fuzz_run, 1500);
}

/* Pool configurations with odd values: each is refused with
 * TP_ERR_INVALID_ARGUMENT (or TP_ERR_UNSUPPORTED), or makes a pool that
 * works: allocations succeed or run out of memory, and the pool checks. */
static void test_odd_pool_configs(void) {
    test_rng rng = {env_u64("TP_FUZZ_SEED", 1)};
    static const uint64_t odd[] = {0, 1, 255, 256, 257, 4096, 2 * TEST_MiB - 1, 2 * TEST_MiB, 3 * TEST_MiB,
                                   1ull << 40, 1ull << 62, 1ull << 63, UINT64_MAX - 1, UINT64_MAX};
    const size_t n_odd = sizeof odd / sizeof *odd;
    for (int round = 0; round < 400 && check_failures == 0; round++) {
        fixture f;
        fixture_open_device(&f, round % 3 == 2 ? "sim:1GiB,novmm" : "sim:1GiB");
        tp_pool_config c = {.kind = (tp_pool_kind)rng_below(&rng, 4)};
        uint64_t *fields[] = {&c.limit_bytes, &c.release_threshold_bytes, &c.idle_release_ns, &c.page_bytes,
                              &c.max_map_bytes, &c.max_chunk_bytes, &c.va_reserve_bytes, &c.small_segment_bytes,
                              &c.medium_segment_bytes, &c.alignment_bytes, &c.tcache_max_block_bytes};
        for (size_t k = 0; k < sizeof fields / sizeof *fields; k++)
            if (rng_below(&rng, 3) == 0) *fields[k] = odd[rng_below(&rng, n_odd)];
        if (rng_below(&rng, 3) == 0) c.growth_step_percent = (uint32_t)rng_below(&rng, 2) ? UINT32_MAX : (uint32_t)rng_below(&rng, 1000);
        c.flags = (uint32_t)rng_below(&rng, 2) ? TP_POOL_FLAG_CHECK_INVARIANTS : 0;
        tp_pool *pool = (tp_pool *)(uintptr_t)1;
        tp_status st = tp_pool_create(f.dev, &c, &pool);
        const tp_status allowed[] = {TP_OK, TP_ERR_INVALID_ARGUMENT, TP_ERR_UNSUPPORTED, TP_ERR_OUT_OF_MEMORY,
                                     TP_STATUS_COUNT_};
        CHECK_MSG(fuzz_status_in(st, allowed), "round %d: create: %s", round, tp_status_name(st));
        f.log.errors = 0; /* refusals are logged */
        if (st != TP_OK) {
            CHECK_MSG(pool == NULL, "round %d: failed create left *out_pool", round);
            fixture_close(&f);
            continue;
        }
        f.pool = pool;
        f.kind = TP_POOL_AUTO;
        tp_pool_stats s;
        CHECK_OK(tp_pool_get_stats(pool, &s));
        void *live[16] = {0};
        for (int op = 0; op < 64; op++) {
            int k = (int)rng_below(&rng, 16);
            if (live[k]) {
                CHECK_OK(tp_pool_free(pool, live[k], TP_STREAM_DEFAULT));
                live[k] = NULL;
                continue;
            }
            size_t bytes = (size_t)rng_log_uniform(&rng, 1, 64 * TEST_MiB);
            st = tp_pool_alloc(pool, bytes, TP_STREAM_DEFAULT, &live[k]);
            CHECK_MSG(st == TP_OK || st == TP_ERR_OUT_OF_MEMORY, "round %d: alloc(%zu): %s", round, bytes,
                      tp_status_name(st));
            if (st == TP_OK && bytes > s.limit_bytes) CHECK_MSG(false, "round %d: alloc above the limit", round);
            if (op % 16 == 0) {
                uint64_t released;
                CHECK_OK(tp_pool_trim(pool, rng_below(&rng, 2) ? 0 : UINT64_MAX, &released));
                CHECK_OK(tp_pool_tick(pool));
            }
            char msg[256] = "";
            CHECK_MSG(tp_pool_check(pool, msg, sizeof msg) == TP_OK, "round %d: %s", round, msg);
            if (check_failures) break;
        }
        for (int k = 0; k < 16; k++)
            if (live[k]) CHECK_OK(tp_pool_free(pool, live[k], TP_STREAM_DEFAULT));
        f.log.errors = 0;
        if (check_failures) fprintf(stderr, "  round %d config: kind %d limit %llu page %llu map %llu chunk %llu va %llu small %llu medium %llu align %llu tcache %llu growth %u\n",
                                    round, (int)c.kind, (unsigned long long)c.limit_bytes, (unsigned long long)c.page_bytes,
                                    (unsigned long long)c.max_map_bytes, (unsigned long long)c.max_chunk_bytes,
                                    (unsigned long long)c.va_reserve_bytes, (unsigned long long)c.small_segment_bytes,
                                    (unsigned long long)c.medium_segment_bytes, (unsigned long long)c.alignment_bytes,
                                    (unsigned long long)c.tcache_max_block_bytes, c.growth_step_percent);
        fixture_close(&f);
    }
}

static const test_case tests[] = {
    TEST_CASE(test_odd_pool_configs),
    TEST_CASE(test_random_call_sequences),
};

int main(int argc, char **argv) { return TEST_MAIN("test_api_fuzz", tests, argc, argv); }
