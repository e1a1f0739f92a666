/* SPDX-License-Identifier: MIT */
/*
 * test_graph_fuzz.c -- random sequences of graph cache calls with hostile
 * arguments against one simulated device with two pools (VMM and segment),
 * two caches and a few streams, checked after every step.
 *
 * The model knows, per cache and key, whether the key must be absent (never
 * prepared, or evicted since), must be present (prepared just now, or in a
 * cache whose bounds can never evict: no byte cap, no idle eviction, room
 * for every variant of every key, no pool attached) or may be either; and
 * the blocks the fuzz holds in the pools. After each step:
 *   - every status is one the call may return, and launch/evict of a key
 *     the model says is absent (present) fail with TP_ERR_NOT_FOUND
 *     (succeed);
 *   - tp_graph_cache_check passes on both caches and tp_pool_check on both
 *     pools; each cache's executables and bytes stay within its caps; the
 *     device holds exactly the executables the caches count, and no more
 *     bytes of them than the caches count;
 *   - pool memory is pinned only while a cache holds pinned ranges (the
 *     fuzz keeps no pins of its own between steps);
 *   - the device saw no hazard, no access to memory that was not there, and
 *     no capture was invalidated; nothing was logged at ERROR.
 * Every DRAIN_EVERY steps, and before each cache is destroyed: every key is
 * evicted, the device synchronised and the caches ticked: no executable, no
 * pinned range and no pinned pool byte may remain.
 *
 * Calls: prepare and run with keys 0, 1..9, huge ones, new graphs, reused
 * graphs and NULL, pins from the cache (pinned by it), from the fuzz
 * (already_pinned) and from captures (the pool's footprint), empty pin
 * sets, malformed pins (NULL ranges, zero bytes, NULL pool, ranges the pool
 * does not own); launch on every stream, on unknown ones and on a stream
 * that captures (the cache must not invalidate the capture); evict present
 * and absent keys; tick with the virtual clock moved; attach and detach
 * pools (twice, to both caches, never attached); stats, JSON and
 * OpenMetrics with every buffer size; pool allocations large enough to run
 * the caches' reclaim callbacks; caches destroyed with executables live and
 * re-created with another configuration (caps of 1, tiny, huge, none; idle
 * eviction of 1 ns or never; protected share 0..100; a background thread);
 * pools let go before the caches (keys evicted, pool detached, destroyed);
 * device faults on instantiate, update, launch, events and memory.
 *
 * A second test runs threads calling launch/run/evict/tick/stats/check on
 * one cache at once (TSan: ctest -R thread).
 *
 *   test_graph_fuzz [filter]     60 seeds of 800 steps (~1 s; ~6 s under ASan)
 *   TP_FUZZ_SEED=N TP_FUZZ_SEEDS=K TP_FUZZ_STEPS=M   reproduce one seed / run longer
 *   TP_FUZZ_TRACE=1              print every call that changes the model
 *   TP_FUZZ_FAULTS=0             no fault injection
 */
#include "gc_test.h"
#include "fuzz_common.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define POOLS 2
#define CACHES 2
#define STREAMS 4 /* slot 0: the default stream */
#define MAX_BLOCKS 96
#define DRAIN_EVERY 97

static const uint64_t keys[] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, UINT64_MAX, UINT64_MAX - 1, 1ull << 63, 0x8000000000000001ull};
#define KEYS (sizeof keys / sizeof *keys)

typedef enum key_state { KEY_ABSENT = 0, KEY_PRESENT, KEY_MAYBE } key_state;

typedef struct blk {
    int pool;
    uint64_t address, bytes;
    int stream;
} blk;

typedef struct fuzz {
    fixture f; /* device and its counting log; pools and caches are ours */
    tp_pool *pool[POOLS];
    tp_graph_cache *cache[CACHES];
    tp_graph_cache_config config[CACHES];
    bool exact[CACHES];            /* nothing but evict (and out of memory) removes a key */
    uint64_t evictions[CACHES];    /* the cache's evictions other than explicit, last seen */
    bool attached[CACHES][POOLS];
    key_state key[CACHES][KEYS];
    tp_stream stream[STREAMS];
    blk b[MAX_BLOCKS];
    int n;
    test_rng rng;
    uint64_t seed, step;
    bool graphpool; /* the device does not report executables' bytes */
    uint64_t faults_left;
    bool fault_injection;
    uint64_t ok_calls, refused_calls, capture_launches;
} fuzz;

/* ---------------------------------------------------------------- helpers */


static void *addr(uint64_t a) { return (void *)(uintptr_t)a; }

/* A key prepared or evicted without certainty (faults, eviction by the
 * bounds): present becomes maybe. */
static void key_uncertain(fuzz *z, int c, size_t k) {
    if (z->key[c][k] == KEY_PRESENT) z->key[c][k] = KEY_MAYBE;
}

/* Whatever a call could have evicted: in a cache that evicts by itself,
 * every present key becomes maybe. */
static void cache_may_have_evicted(fuzz *z, int c) {
    if (z->exact[c]) return;
    for (size_t k = 0; k < KEYS; k++) key_uncertain(z, c, k);
}

static bool faults_now(fuzz *z) { return z->faults_left != 0; }

/* Out of device memory, even a cache that never evicts by its bounds does
 * (instantiation makes room): its eviction counters tell. */
static void note_evictions(fuzz *z, int c) {
    tp_graph_cache_stats s = gt_stats(z->cache[c]);
    uint64_t sum = s.evictions_count + s.evictions_bytes + s.evictions_idle + s.evictions_pressure;
    if (sum != z->evictions[c])
        for (size_t k = 0; k < KEYS; k++) key_uncertain(z, c, k);
    z->evictions[c] = sum;
}

/* ---------------------------------------------------------------- checks */

static void check_caches(fuzz *z) {
    uint64_t execs = 0, bytes = 0, pinned_ranges = 0;
    bool background = false; /* a cache's own thread may evict between the reads below */
    for (int c = 0; c < CACHES; c++) {
        background |= z->config[c].background_thread;
        char msg[256] = "";
        tp_status st = tp_graph_cache_check(z->cache[c], msg, sizeof msg);
        if (st != TP_OK) FAIL_AT(z, "cache %d check: %s: %s", c, tp_status_name(st), msg);
        tp_graph_cache_stats s;
        CHECK_OK(tp_graph_cache_get_stats(z->cache[c], &s));
        if (s.execs > z->config[c].max_execs) FAIL_AT(z, "cache %d: %" PRIu64 " execs above %u", c, s.execs, z->config[c].max_execs);
        if (z->config[c].max_bytes != TP_BYTES_UNLIMITED && s.exec_bytes > z->config[c].max_bytes)
            FAIL_AT(z, "cache %d: %" PRIu64 " bytes above %" PRIu64, c, s.exec_bytes, z->config[c].max_bytes);
        if (s.exec_bytes_peak < s.exec_bytes) FAIL_AT(z, "cache %d: peak below current", c);
        if (s.max_execs != z->config[c].max_execs || s.max_bytes != z->config[c].max_bytes)
            FAIL_AT(z, "cache %d: stats say caps %" PRIu64 "/%" PRIu64 ", config %u/%" PRIu64, c, s.max_execs, s.max_bytes,
                    z->config[c].max_execs, z->config[c].max_bytes);
        execs += s.execs;
        bytes += s.exec_bytes;
        pinned_ranges += s.pinned_ranges;
    }
    /* The device is read last: a background thread can only have evicted
     * since the caches were read, so then it may hold fewer, never more. */
    tp_sim_counters ctr = gt_counters(z->f.dev);
    if (background ? ctr.graph_execs > execs : ctr.graph_execs != execs)
        FAIL_AT(z, "device holds %" PRIu64 " executables, caches count %" PRIu64, ctr.graph_execs, execs);
    if (!z->graphpool && ctr.graph_exec_bytes > bytes)
        FAIL_AT(z, "device holds %" PRIu64 " bytes of executables, caches count %" PRIu64, ctr.graph_exec_bytes, bytes);
    for (int p = 0; p < POOLS; p++) {
        tp_pool_stats ps = gt_pool_stats(z->pool[p]);
        if (ps.pinned_bytes.current && !pinned_ranges)
            FAIL_AT(z, "pool %d: %" PRIu64 " bytes pinned, no cache holds a pin", p, ps.pinned_bytes.current);
        if (ps.hazards) FAIL_AT(z, "pool %d counted %" PRIu64 " hazards", p, ps.hazards);
        char msg[256] = "";
        tp_status st = tp_pool_check(z->pool[p], msg, sizeof msg);
        if (st != TP_OK) FAIL_AT(z, "pool %d check: %s: %s", p, tp_status_name(st), msg);
    }
    FUZZ_CHECK_DEVICE(z, ctr);
}

/* Evicts every key of cache c, waits for the device and ticks: the cache
 * must then hold nothing, pins included. */
static void drain_cache(fuzz *z, int c) {
    for (size_t k = 0; k < KEYS; k++) {
        tp_status st = tp_graph_cache_evict(z->cache[c], keys[k]);
        if (z->key[c][k] == KEY_ABSENT && st != TP_ERR_NOT_FOUND)
            FAIL_AT(z, "drain: evict of absent key 0x%" PRIx64 " in cache %d: %s", keys[k], c, tp_status_name(st));
        else if (z->key[c][k] == KEY_PRESENT && st != TP_OK)
            FAIL_AT(z, "drain: evict of present key 0x%" PRIx64 " in cache %d: %s", keys[k], c, tp_status_name(st));
        else if (st != TP_OK && st != TP_ERR_NOT_FOUND)
            FAIL_AT(z, "drain: evict: %s", tp_status_name(st));
        z->key[c][k] = KEY_ABSENT;
    }
    CHECK_OK(tp_device_synchronize(z->f.dev));
    CHECK_OK(tp_graph_cache_tick(z->cache[c]));
    tp_graph_cache_stats s = gt_stats(z->cache[c]);
    if (s.execs || s.exec_bytes || s.pinned_ranges)
        FAIL_AT(z, "cache %d drained: %" PRIu64 " execs, %" PRIu64 " bytes, %" PRIu64 " pinned ranges", c, s.execs,
                s.exec_bytes, s.pinned_ranges);
}

static void drain_all(fuzz *z) {
    CHECK_OK(tp_device_synchronize(z->f.dev)); /* moves the clock: idle eviction */
    for (int c = 0; c < CACHES; c++) cache_may_have_evicted(z, c);
    for (int c = 0; c < CACHES; c++) drain_cache(z, c);
    for (int p = 0; p < POOLS; p++) {
        tp_pool_stats ps = gt_pool_stats(z->pool[p]);
        if (ps.pinned_bytes.current)
            FAIL_AT(z, "pool %d: %" PRIu64 " bytes still pinned with every cache drained", p, ps.pinned_bytes.current);
    }
    if (gt_sim_execs(z->f.dev)) FAIL_AT(z, "device still holds %" PRIu64 " executables", gt_sim_execs(z->f.dev));
}

/* ------------------------------------------------------------ configs */

static tp_graph_cache_config random_cache_config(fuzz *z) {
    tp_graph_cache_config c = {0};
    static const uint32_t execs[] = {0, 1, 2, 3, 5, 8, 64, UINT32_MAX};
    c.max_execs = execs[rnd(z, sizeof execs / sizeof *execs)];
    switch (rnd(z, 6)) {
    case 0: c.max_bytes = 0; break;
    case 1: c.max_bytes = 1 + rnd(z, 4096); break; /* smaller than any executable */
    case 2: c.max_bytes = rng_log_uniform(&z->rng, 64 * 1024, 4 * TEST_MiB); break;
    case 3: c.max_bytes = UINT64_MAX - 1; break;
    default: c.max_bytes = TP_BYTES_UNLIMITED; break;
    }
    switch (rnd(z, 5)) {
    case 0: c.idle_evict_ns = 0; break;
    case 1: c.idle_evict_ns = 1; break;
    case 2: c.idle_evict_ns = 1 + rnd(z, 50 * MS); break;
    case 3: c.idle_evict_ns = UINT64_MAX - 1; break;
    default: c.idle_evict_ns = TP_NS_NEVER; break;
    }
    c.protected_percent = chance(z, 30) ? 0 : (uint32_t)rnd(z, 101);
    c.background_thread = chance(z, 10);
    c.tick_interval_ns = chance(z, 50) ? 1000 : 0; /* 1 us: the thread runs all the time */
    static const uint64_t node[] = {0, 1, 4096, 1ull << 40, UINT64_MAX};
    c.node_bytes_estimate = node[rnd(z, sizeof node / sizeof *node)];
    return c;
}

/* Creates cache c with a random configuration (reading back the defaults
 * from its statistics). */
static void make_cache(fuzz *z, int c) {
    tp_graph_cache_config cfg = random_cache_config(z);
    REQUIRE_OK(tp_graph_cache_create(z->f.dev, &cfg, &z->cache[c]));
    tp_graph_cache_stats s = gt_stats(z->cache[c]);
    cfg.max_execs = (uint32_t)s.max_execs;
    cfg.max_bytes = s.max_bytes;
    if (!cfg.idle_evict_ns) cfg.idle_evict_ns = 10 * SEC;
    z->config[c] = cfg;
    z->exact[c] = cfg.max_execs >= 4 * KEYS && cfg.max_bytes == TP_BYTES_UNLIMITED && cfg.idle_evict_ns == TP_NS_NEVER;
    for (int p = 0; p < POOLS; p++) z->attached[c][p] = false;
    z->evictions[c] = 0;
    for (size_t k = 0; k < KEYS; k++) z->key[c][k] = KEY_ABSENT;
    TRACE(z, "cache %d: max_execs %u max_bytes %" PRIu64 " idle %" PRIu64 " protected %u thread %d exact %d", c,
          cfg.max_execs, cfg.max_bytes, cfg.idle_evict_ns, cfg.protected_percent, cfg.background_thread, z->exact[c]);
}

/* ---------------------------------------------------------------- steps */

static int random_block(fuzz *z, int pool) {
    int cand[MAX_BLOCKS], count = 0;
    for (int i = 0; i < z->n; i++)
        if (pool < 0 || z->b[i].pool == pool) cand[count++] = i;
    return count ? cand[rnd(z, (uint64_t)count)] : -1;
}

static void step_alloc(fuzz *z) {
    if (z->n >= MAX_BLOCKS) return;
    int p = (int)rnd(z, POOLS), s = (int)rnd(z, STREAMS);
    size_t bytes = (size_t)rng_log_uniform(&z->rng, 1, 8 * TEST_MiB);
    void *ptr = NULL;
    tp_status st = tp_pool_alloc(z->pool[p], bytes, z->stream[s], &ptr);
    EXPECT_IN(z, "alloc", st, TP_OK, TP_ERR_OUT_OF_MEMORY);
    /* (the pool's reclaim callbacks may have evicted) */
    for (int c = 0; c < CACHES; c++)
        if (z->attached[c][p]) cache_may_have_evicted(z, c);
    if (st != TP_OK) return;
    z->b[z->n++] = (blk){p, (uint64_t)(uintptr_t)ptr, bytes, s};
    TRACE(z, "alloc pool %d stream %d: 0x%" PRIx64 "+%zu", p, s, (uint64_t)(uintptr_t)ptr, bytes);
}

/* Frees a block on its stream: graphs that use it pin it, so the pool keeps
 * it until their launches are done. */
static void step_free(fuzz *z) {
    int i = random_block(z, -1);
    if (i < 0) return;
    blk b = z->b[i];
    EXPECT_IN(z, "free", tp_pool_free(z->pool[b.pool], addr(b.address), z->stream[b.stream]), TP_OK);
    z->b[i] = z->b[--z->n];
    TRACE(z, "free 0x%" PRIx64, b.address);
}

/* A pool allocation far above what is free: the ladder ends in the
 * reclaim callbacks of the caches attached to the pool. */
static void step_pressure(fuzz *z) {
    int p = (int)rnd(z, POOLS);
    tp_pool_stats ps = gt_pool_stats(z->pool[p]);
    size_t bytes = (size_t)(ps.limit_bytes / 2 + rnd(z, ps.limit_bytes));
    void *ptr = NULL;
    tp_status st = tp_pool_alloc(z->pool[p], bytes, z->stream[rnd(z, STREAMS)], &ptr);
    EXPECT_IN(z, "alloc(pressure)", st, TP_OK, TP_ERR_OUT_OF_MEMORY);
    for (int c = 0; c < CACHES; c++)
        if (z->attached[c][p]) cache_may_have_evicted(z, c);
    if (st == TP_OK) CHECK_OK(tp_pool_free(z->pool[p], ptr, TP_STREAM_DEFAULT));
    TRACE(z, "pressure on pool %d: %zu bytes: %s", p, bytes, tp_status_name(st));
}

/* A graph over sub-ranges of 1..3 of the fuzz's blocks of one pool, or over
 * nothing. */
static size_t random_ranges(fuzz *z, int *out_pool, tp_range *ranges) {
    int first = random_block(z, -1);
    if (first < 0 || chance(z, 25)) return 0;
    int p = z->b[first].pool;
    *out_pool = p;
    size_t count = 1 + rnd(z, 3);
    for (size_t k = 0; k < count; k++) {
        const blk *b = &z->b[k == 0 ? first : random_block(z, p)];
        uint64_t off = chance(z, 50) ? 0 : rnd(z, b->bytes);
        uint64_t len = chance(z, 50) ? b->bytes - off : 1 + rnd(z, b->bytes - off);
        ranges[k] = (tp_range){b->address + off, len};
    }
    return count;
}

static tp_graph new_graph(fuzz *z, uint64_t key, const tp_range *ranges, size_t count) {
    /* Few topologies per key, so keys update in place, alternate between
     * variants and overflow the variant limit now and then. */
    uint64_t topology = key * 8 + rnd(z, 6);
    uint32_t nodes = 1 + (uint32_t)(topology % 7) * 13;
    tp_sim_graph_desc desc = {.node_count = nodes, .topology_id = topology, .duration_ns = rnd(z, 20 * MS),
                              .ranges = ranges, .range_count = count};
    tp_graph g = NULL;
    tp_status st = tp_sim_graph_create(z->f.dev, &desc, &g);
    if (st != TP_OK) {
        FAIL_AT(z, "tp_sim_graph_create: %s", tp_status_name(st));
        return NULL;
    }
    return g;
}

/* Status checks shared by prepare and run; updates the model. */
static void after_prepare(fuzz *z, int c, size_t k, tp_status st, bool launched, const char *what) {
    if (launched) {
        EXPECT_IN(z, what, st, TP_OK, TP_ERR_RUN_EAGER, TP_ERR_NOT_FOUND);
        if (st == TP_ERR_NOT_FOUND) FAIL_AT(z, "%s: the key vanished between prepare and launch", what);
    } else {
        EXPECT_IN(z, what, st, TP_OK, TP_ERR_RUN_EAGER);
    }
    cache_may_have_evicted(z, c);
    note_evictions(z, c);
    if (st == TP_OK) {
        z->key[c][k] = KEY_PRESENT;
    } else if (z->key[c][k] != KEY_ABSENT) {
        z->key[c][k] = KEY_MAYBE; /* an update that failed drops the variant */
    } else if (launched && st != TP_ERR_RUN_EAGER) {
        z->key[c][k] = KEY_MAYBE; /* prepared, then the launch failed */
    }
}

static void step_prepare(fuzz *z) {
    int c = (int)rnd(z, CACHES);
    size_t k = rnd(z, KEYS);
    uint64_t key = keys[k];
    bool run = chance(z, 40);
    int s = (int)rnd(z, STREAMS);
    tp_range ranges[3];
    int p = 0;
    size_t count = random_ranges(z, &p, ranges);
    tp_graph g = new_graph(z, key, ranges, count);
    if (!g) return;
    unsigned how = (unsigned)rnd(z, 100);
    tp_status st;
    if (how < 6) { /* malformed: refused, nothing changes, caller keeps its pins */
        tp_range bad = {count ? ranges[0].address : 0x1000, 0};
        tp_graph_pins pins = {z->pool[rnd(z, POOLS)], &bad, 1, chance(z, 50)};
        switch (rnd(z, 4)) {
        case 0: pins.ranges = NULL; break;
        case 1: break; /* zero bytes */
        case 2: pins.pool = NULL, bad.bytes = 4096; break;
        default: break;
        }
        st = run ? tp_graph_cache_run(z->cache[c], key, g, &pins, z->stream[s])
                 : tp_graph_cache_prepare(z->cache[c], key, g, &pins);
        EXPECT_IN(z, "prepare(malformed pins)", st, TP_ERR_INVALID_ARGUMENT);
        if (tp_graph_cache_prepare(z->cache[c], key, NULL, NULL) != TP_ERR_INVALID_ARGUMENT)
            FAIL_AT(z, "prepare(NULL graph) accepted");
    } else if (how < 10) { /* pins the pool does not own: refused with the pin's status */
        tp_range r = {0x10, 4096};
        tp_graph_pins pins = {z->pool[rnd(z, POOLS)], &r, 1, false};
        st = tp_graph_cache_prepare(z->cache[c], key, g, &pins);
        EXPECT_IN(z, "prepare(foreign pins)", st, TP_ERR_NOT_OWNED, TP_ERR_INVALID_ARGUMENT);
        if (st == TP_ERR_NOT_OWNED || st == TP_ERR_INVALID_ARGUMENT) z->f.log.errors = 0;
    } else {
        /* valid: pins match the graph's ranges */
        tp_graph_pins pins = {z->pool[p], ranges, count, false};
        const tp_graph_pins *pp = &pins;
        if (count == 0) {
            pp = chance(z, 50) ? NULL : &pins; /* NULL keeps, empty drops: both fine for a graph over nothing */
            pins.pool = chance(z, 50) ? NULL : z->pool[rnd(z, POOLS)];
        } else if (chance(z, 40)) {
            /* the fuzz pins, the cache takes the pins over */
            pins.already_pinned = true;
            for (size_t i = 0; i < count; i++)
                CHECK_OK(tp_pool_pin(z->pool[p], addr(ranges[i].address), (size_t)ranges[i].bytes));
        }
        st = run ? tp_graph_cache_run(z->cache[c], key, g, pp, z->stream[s]) : tp_graph_cache_prepare(z->cache[c], key, g, pp);
        after_prepare(z, c, k, st, run, run ? "run" : "prepare");
        TRACE(z, "%s cache %d key 0x%" PRIx64 " (%zu ranges in pool %d%s): %s", run ? "run" : "prepare", c, key, count, p,
              pins.already_pinned ? ", already pinned" : "", tp_status_name(st));
        if (st == TP_OK && !run && !faults_now(z)) {
            /* prepared just now: present */
            tp_status l = tp_graph_cache_launch(z->cache[c], key, z->stream[s]);
            EXPECT_IN(z, "launch(just prepared)", l, TP_OK);
        }
    }
    CHECK_OK(tp_sim_graph_destroy(z->f.dev, g)); /* the cache keeps no use of the template */
}

static void step_launch(fuzz *z) {
    int c = (int)rnd(z, CACHES);
    size_t k = rnd(z, KEYS);
    bool bogus = chance(z, 5);
    tp_stream s = bogus ? fuzz_bogus_stream(&z->rng, z->f.dev) : z->stream[rnd(z, STREAMS)];
    tp_status st = tp_graph_cache_launch(z->cache[c], keys[k], s);
    if (bogus) {
        EXPECT_IN(z, "launch(unknown stream)", st, TP_ERR_INVALID_ARGUMENT, TP_ERR_NOT_FOUND);
        if (st == TP_ERR_NOT_FOUND && z->key[c][k] == KEY_PRESENT) FAIL_AT(z, "launch: present key not found");
        return;
    }
    EXPECT_IN(z, "launch", st, TP_OK, TP_ERR_NOT_FOUND);
    if (z->key[c][k] == KEY_ABSENT && st != TP_ERR_NOT_FOUND)
        FAIL_AT(z, "launch of absent key 0x%" PRIx64 " in cache %d: %s", keys[k], c, tp_status_name(st));
    if (z->key[c][k] == KEY_PRESENT && st == TP_ERR_NOT_FOUND)
        FAIL_AT(z, "launch of present key 0x%" PRIx64 " in cache %d: not found", keys[k], c);
    if (st == TP_ERR_NOT_FOUND) z->key[c][k] = KEY_ABSENT;
}

static void step_evict(fuzz *z) {
    int c = (int)rnd(z, CACHES);
    size_t k = rnd(z, KEYS);
    tp_status st = tp_graph_cache_evict(z->cache[c], keys[k]);
    EXPECT_IN(z, "evict", st, TP_OK, TP_ERR_NOT_FOUND);
    if (z->key[c][k] == KEY_ABSENT && st != TP_ERR_NOT_FOUND) FAIL_AT(z, "evict of absent key 0x%" PRIx64 ": OK", keys[k]);
    if (z->key[c][k] == KEY_PRESENT && st != TP_OK) FAIL_AT(z, "evict of present key 0x%" PRIx64 ": %s", keys[k], tp_status_name(st));
    z->key[c][k] = KEY_ABSENT;
    TRACE(z, "evict cache %d key 0x%" PRIx64 ": %s", c, keys[k], tp_status_name(st));
}

static void step_tick(fuzz *z) {
    uint64_t ns;
    switch (rnd(z, 4)) {
    case 0: ns = 0; break;
    case 1: ns = 1 + rnd(z, 1000); break;
    case 2: ns = rnd(z, 30 * MS); break;
    default: ns = rnd(z, 20 * SEC); break;
    }
    CHECK_OK(tp_sim_advance(z->f.dev, ns));
    if (chance(z, 20)) CHECK_OK(tp_stream_synchronize(z->f.dev, z->stream[rnd(z, STREAMS)]));
    int c = (int)rnd(z, CACHES);
    EXPECT_IN(z, "tick", tp_graph_cache_tick(z->cache[c]), TP_OK);
    /* idle eviction (any cache: the clock moved for all, and background
     * threads tick) */
    for (int q = 0; q < CACHES; q++) cache_may_have_evicted(z, q);
    if (chance(z, 30)) CHECK_OK(tp_pool_tick(z->pool[rnd(z, POOLS)]));
    TRACE(z, "tick cache %d after %" PRIu64 " ns", c, ns);
}

static void step_attach(fuzz *z) {
    int c = (int)rnd(z, CACHES), p = (int)rnd(z, POOLS);
    if (chance(z, 50)) {
        tp_status st = tp_graph_cache_attach_pool(z->cache[c], z->pool[p]);
        EXPECT_IN(z, "attach", st, z->attached[c][p] ? TP_ERR_INVALID_ARGUMENT : TP_OK);
        if (st == TP_OK) z->attached[c][p] = true, z->exact[c] = false;
    } else {
        tp_status st = tp_graph_cache_detach_pool(z->cache[c], z->pool[p]);
        EXPECT_IN(z, "detach", st, z->attached[c][p] ? TP_OK : TP_ERR_NOT_FOUND);
        if (st == TP_OK) z->attached[c][p] = false;
    }
    TRACE(z, "attach/detach cache %d pool %d: %d", c, p, z->attached[c][p]);
}

/* JSON and OpenMetrics: the length asked with capacity 0 is what every
 * buffer size gets, truncated and NUL-terminated below it. */
static void step_text(fuzz *z) {
    int c = (int)rnd(z, CACHES);
    static const char *const labels[] = {NULL, "", "cache=\"g\"", "a=\"1\",b=\"2\""};
    const char *label = labels[rnd(z, 4)];
    bool json = chance(z, 50);
    size_t length = 0;
    tp_status st = json ? tp_graph_cache_stats_json(z->cache[c], NULL, 0, &length)
                        : tp_graph_cache_stats_openmetrics(z->cache[c], label, NULL, 0, &length);
    EXPECT_IN(z, "text(0)", st, TP_ERR_BUFFER_TOO_SMALL);
    if (length == 0 || length > 1 << 20) {
        FAIL_AT(z, "text length %zu", length);
        return;
    }
    char *buf = malloc(length + 2);
    REQUIRE(buf);
    size_t caps[] = {1, 2, rnd(z, length) + 1, length, length + 1, length + 2};
    /* now and then every size from 1 up */
    size_t sizes = chance(z, 5) ? length + 2 : sizeof caps / sizeof *caps;
    for (size_t i = 0; i < sizes; i++) {
        size_t cap = sizes == length + 2 ? i + 1 : caps[i], got = 0;
        memset(buf, 'x', length + 2);
        st = json ? tp_graph_cache_stats_json(z->cache[c], buf, cap, &got)
                  : tp_graph_cache_stats_openmetrics(z->cache[c], label, buf, cap, &got);
        /* (the figures may change between calls: a background thread) */
        EXPECT_IN(z, "text", st, cap > length ? TP_OK : TP_ERR_BUFFER_TOO_SMALL, TP_OK, TP_ERR_BUFFER_TOO_SMALL);
        if (memchr(buf, '\0', cap) == NULL) FAIL_AT(z, "text not NUL-terminated in %zu bytes", cap);
        if (cap < length + 2 && buf[cap] != 'x') FAIL_AT(z, "text wrote past %zu bytes", cap);
        if (st == TP_OK && strlen(buf) != got) FAIL_AT(z, "text length %zu, says %zu", strlen(buf), got);
    }
    if (json && chance(z, 50)) {
        size_t got = 0;
        EXPECT_IN(z, "json(NULL, 5)", tp_graph_cache_stats_json(z->cache[c], NULL, 5, &got), TP_ERR_INVALID_ARGUMENT);
    }
    free(buf);
    EXPECT_IN(z, "get_stats(NULL)", tp_graph_cache_get_stats(z->cache[c], NULL), TP_ERR_INVALID_ARGUMENT);
    char small[4];
    EXPECT_IN(z, "check(small msg)", tp_graph_cache_check(z->cache[c], small, sizeof small), TP_OK);
    EXPECT_IN(z, "check(NULL msg)", tp_graph_cache_check(z->cache[c], NULL, 0), TP_OK);
}

/* A device capture on a stream, the pool told first: allocations and
 * kernels of the capture, and cache calls in the middle of it (a launch of
 * a cached key into the capture among them); then the graph is prepared
 * with the capture's footprint as already-pinned pins, or thrown away. */
static void step_capture(fuzz *z) {
    int s = 1 + (int)rnd(z, STREAMS - 1), p = (int)rnd(z, POOLS), c = (int)rnd(z, CACHES);
    tp_stream stream = z->stream[s];
    EXPECT_IN(z, "pool capture_begin", tp_pool_capture_begin(z->pool[p], stream), TP_OK);
    EXPECT_IN(z, "sim capture_begin", tp_sim_capture_begin(z->f.dev, stream), TP_OK);
    void *temp[4] = {0};
    int temps = 0;
    bool nested_launch = false;
    int ops = 1 + (int)rnd(z, 6);
    for (int i = 0; i < ops; i++) {
        unsigned r = (unsigned)rnd(z, 10);
        if (r < 4 && temps < 4) {
            size_t bytes = (size_t)rng_log_uniform(&z->rng, 256, 4 * TEST_MiB);
            tp_status st = tp_pool_alloc(z->pool[p], bytes, stream, &temp[temps]);
            EXPECT_IN(z, "alloc(capture)", st, TP_OK, TP_ERR_OUT_OF_MEMORY);
            for (int q = 0; q < CACHES; q++)
                if (z->attached[q][p]) cache_may_have_evicted(z, q);
            if (st != TP_OK) continue;
            tp_range r1 = {(uint64_t)(uintptr_t)temp[temps], bytes};
            CHECK_OK(tp_sim_launch(z->f.dev, stream, 1 + rnd(z, 5 * MS), &r1, 1));
            temps++;
        } else if (r < 5 && temps) {
            int t = (int)rnd(z, (uint64_t)temps);
            CHECK_OK(tp_pool_free(z->pool[p], temp[t], stream)); /* reused within the capture only */
            temp[t] = temp[--temps];
        } else if (r < 7) {
            /* a cached graph launched into the capture: recorded, not run */
            size_t k = rnd(z, KEYS);
            tp_status st = tp_graph_cache_launch(z->cache[c], keys[k], stream);
            EXPECT_IN(z, "launch(into a capture)", st, TP_OK, TP_ERR_NOT_FOUND);
            if (st == TP_OK) nested_launch = true, z->capture_launches++;
            if (st == TP_ERR_NOT_FOUND && z->key[c][k] == KEY_PRESENT) FAIL_AT(z, "present key not found");
        } else if (r < 8) {
            size_t k = rnd(z, KEYS);
            int other = s == STREAMS - 1 ? 1 : s + 1;
            EXPECT_IN(z, "launch(beside a capture)", tp_graph_cache_launch(z->cache[c], keys[k], z->stream[other]), TP_OK,
                      TP_ERR_NOT_FOUND);
        } else if (r < 9) {
            CHECK_OK(tp_sim_advance(z->f.dev, rnd(z, 30 * MS)));
            EXPECT_IN(z, "tick(during a capture)", tp_graph_cache_tick(z->cache[c]), TP_OK);
            for (int q = 0; q < CACHES; q++) cache_may_have_evicted(z, q);
        } else {
            size_t k = rnd(z, KEYS);
            tp_status st = tp_graph_cache_evict(z->cache[c], keys[k]);
            EXPECT_IN(z, "evict(during a capture)", st, TP_OK, TP_ERR_NOT_FOUND);
            z->key[c][k] = KEY_ABSENT;
        }
    }
    tp_graph g = NULL;
    EXPECT_IN(z, "sim capture_end", tp_sim_capture_end(z->f.dev, stream, &g), TP_OK);
    tp_range *ranges = NULL;
    size_t count = 0;
    EXPECT_IN(z, "pool capture_end", tp_pool_capture_end(z->pool[p], stream, &ranges, &count), TP_OK);
    for (int t = 0; t < temps; t++) CHECK_OK(tp_pool_free(z->pool[p], temp[t], stream));
    TRACE(z, "capture on stream %d pool %d: %zu ranges, nested launch %d", s, p, count, nested_launch);
    /* A graph that launched a cached executable also reads that one's
     * memory, which the footprint does not cover: not cached here. */
    if (!g || nested_launch || chance(z, 20)) {
        for (size_t i = 0; i < count; i++) CHECK_OK(tp_pool_unpin(z->pool[p], addr(ranges[i].address), (size_t)ranges[i].bytes));
    } else {
        size_t k = rnd(z, KEYS);
        tp_graph_pins pins = {z->pool[p], ranges, count, true};
        bool run = chance(z, 50);
        tp_status st = run ? tp_graph_cache_run(z->cache[c], keys[k], g, &pins, z->stream[rnd(z, STREAMS)])
                           : tp_graph_cache_prepare(z->cache[c], keys[k], g, &pins);
        after_prepare(z, c, k, st, run, "prepare(captured)");
    }
    tp_pool_free_ranges(z->pool[p], ranges);
    if (g) CHECK_OK(tp_sim_graph_destroy(z->f.dev, g));
}

static void step_faults(fuzz *z) {
    static const tp_sim_op ops[] = {TP_SIM_OP_GRAPH_INSTANTIATE, TP_SIM_OP_GRAPH_UPDATE, TP_SIM_OP_GRAPH_LAUNCH,
                                    TP_SIM_OP_EVENT, TP_SIM_OP_MAP, TP_SIM_OP_MALLOC};
    tp_sim_op op = ops[rnd(z, sizeof ops / sizeof *ops)];
    tp_status status = chance(z, 50) ? TP_ERR_OUT_OF_MEMORY : TP_ERR_DEVICE;
    CHECK_OK(tp_sim_inject_fault(z->f.dev, op, rnd(z, 4), 1 + rnd(z, 3), status));
    z->faults_left = 3 + rnd(z, 12);
    TRACE(z, "faults: %s fails with %s", tp_sim_op_name(op), tp_status_name(status));
}

/* Destroys a cache with whatever it holds, after a drain now and then (so
 * that both paths run), and makes another. */
static void step_recreate(fuzz *z) {
    int c = (int)rnd(z, CACHES);
    if (chance(z, 30) && !faults_now(z)) drain_cache(z, c); /* (event queries may fail under faults) */
    EXPECT_IN(z, "cache destroy", tp_graph_cache_destroy(z->cache[c]), TP_OK);
    z->cache[c] = NULL;
    for (int p = 0; p < POOLS; p++) {
        /* the pool's reclaim callback went with the cache */
        void *ptr = NULL;
        tp_pool_stats ps = gt_pool_stats(z->pool[p]);
        if (tp_pool_alloc(z->pool[p], (size_t)ps.limit_bytes, TP_STREAM_DEFAULT, &ptr) == TP_OK)
            CHECK_OK(tp_pool_free(z->pool[p], ptr, TP_STREAM_DEFAULT));
        z->f.log.errors = 0;
        for (int q = 0; q < CACHES; q++)
            if (q != c && z->attached[q][p]) cache_may_have_evicted(z, q);
    }
    make_cache(z, c);
}

/* Lets a pool go before the caches, the header's way: evict the keys that
 * may pin it, detach it from every cache (attached or not), and it must
 * hold no pin; then destroy it and make another. */
static void random_pool_config(fuzz *z, int p, tp_pool_config *pc) {
    *pc = (tp_pool_config){.kind = p == 0 ? TP_POOL_VMM : TP_POOL_SEGMENT};
    pc->limit_bytes = chance(z, 30) ? 0 : rng_log_uniform(&z->rng, 16 * TEST_MiB, 256 * TEST_MiB);
    if (chance(z, 30)) pc->idle_release_ns = 1 + rnd(z, 20 * MS);
}

static void step_replace_pool(fuzz *z) {
    int p = (int)rnd(z, POOLS);
    for (int c = 0; c < CACHES; c++) {
        for (size_t k = 0; k < KEYS; k++) {
            tp_status st = tp_graph_cache_evict(z->cache[c], keys[k]);
            EXPECT_IN(z, "evict(pool going)", st, TP_OK, TP_ERR_NOT_FOUND);
            z->key[c][k] = KEY_ABSENT;
        }
        tp_status st = tp_graph_cache_detach_pool(z->cache[c], z->pool[p]);
        EXPECT_IN(z, "detach(pool going)", st, z->attached[c][p] ? TP_OK : TP_ERR_NOT_FOUND);
        z->attached[c][p] = false;
    }
    tp_pool_stats ps = gt_pool_stats(z->pool[p]);
    if (ps.pinned_bytes.current)
        FAIL_AT(z, "pool %d: %" PRIu64 " bytes pinned after its keys were evicted and it was detached", p,
                ps.pinned_bytes.current);
    for (int i = 0; i < z->n; i++)
        if (z->b[i].pool == p) {
            CHECK_OK(tp_pool_free(z->pool[p], addr(z->b[i].address), z->stream[z->b[i].stream]));
            z->b[i--] = z->b[--z->n];
        }
    EXPECT_IN(z, "pool destroy", tp_pool_destroy(z->pool[p]), TP_OK);
    tp_pool_config pc;
    random_pool_config(z, p, &pc);
    REQUIRE_OK(tp_pool_create(z->f.dev, &pc, &z->pool[p]));
    TRACE(z, "pool %d replaced", p);
}

static void step_misc(fuzz *z) {
    int c = (int)rnd(z, CACHES);
    switch (rnd(z, 8)) {
    case 0: EXPECT_IN(z, "launch(NULL)", tp_graph_cache_launch(NULL, 1, TP_STREAM_DEFAULT), TP_ERR_INVALID_ARGUMENT); break;
    case 1: EXPECT_IN(z, "evict(NULL)", tp_graph_cache_evict(NULL, 1), TP_ERR_INVALID_ARGUMENT); break;
    case 2: EXPECT_IN(z, "attach(NULL pool)", tp_graph_cache_attach_pool(z->cache[c], NULL), TP_ERR_INVALID_ARGUMENT); break;
    case 3: EXPECT_IN(z, "detach(NULL pool)", tp_graph_cache_detach_pool(z->cache[c], NULL), TP_ERR_INVALID_ARGUMENT); break;
    case 4: {
        tp_device *d = NULL;
        EXPECT_IN(z, "get_device", tp_graph_cache_get_device(z->cache[c], &d), TP_OK);
        if (d != z->f.dev) FAIL_AT(z, "get_device: another device");
        break;
    }
    case 5: EXPECT_IN(z, "tick(NULL)", tp_graph_cache_tick(NULL), TP_ERR_INVALID_ARGUMENT); break;
    case 6: CHECK_OK(tp_device_synchronize(z->f.dev)); break;
    default: EXPECT_IN(z, "device_close(busy)", tp_device_close(z->f.dev), TP_ERR_BUSY); break;
    }
}

/* ------------------------------------------------------------- the run */

static void fuzz_run(uint64_t seed, uint64_t steps) {
    fuzz *z = calloc(1, sizeof *z);
    REQUIRE(z);
    z->seed = seed;
    z->rng.state = seed;
    z->fault_injection = env_u64("TP_FUZZ_FAULTS", 1) != 0;
    static const char *const specs[] = {"sim:1GiB", "sim:1GiB,graph_node_bytes=64KiB,graph_exec_bytes=1MiB",
                                        "sim:1GiB,graphpool", "sim:512MiB,graph_node_bytes=1KiB,adjacent"};
    size_t spec = rnd(z, 4);
    z->graphpool = spec == 2;
    fixture_open_device(&z->f, specs[spec]);
    for (int p = 0; p < POOLS; p++) {
        tp_pool_config pc;
        random_pool_config(z, p, &pc);
        REQUIRE_OK(tp_pool_create(z->f.dev, &pc, &z->pool[p]));
    }
    z->stream[0] = TP_STREAM_DEFAULT;
    for (int s = 1; s < STREAMS; s++) REQUIRE_OK(tp_stream_create(z->f.dev, &z->stream[s]));
    for (int c = 0; c < CACHES; c++) make_cache(z, c);
    for (z->step = 0; z->step < steps && check_failures == 0; z->step++) {
        unsigned r = (unsigned)rnd(z, 100);
        if (r < 14) step_alloc(z);
        else if (r < 22) step_free(z);
        else if (r < 48) step_prepare(z);
        else if (r < 62) step_launch(z);
        else if (r < 68) step_evict(z);
        else if (r < 74) step_tick(z);
        else if (r < 78) step_attach(z);
        else if (r < 81) step_text(z);
        else if (r < 88) step_capture(z);
        else if (r < 90) step_pressure(z);
        else if (r < 91) step_recreate(z);
        else if (r < 92 && !z->faults_left) step_replace_pool(z);
        else if (r < 94 && !z->faults_left && z->fault_injection) step_faults(z);
        else step_misc(z);
        if (z->faults_left && --z->faults_left == 0) {
            CHECK_OK(tp_sim_clear_faults(z->f.dev));
            for (int c = 0; c < CACHES; c++)
                for (size_t k = 0; k < KEYS; k++) key_uncertain(z, c, k);
        }
        /* Outside a step's own sequence, a cache that evicts by itself (a
         * background thread, a clock moved by a synchronisation) may have. */
        for (int c = 0; c < CACHES; c++) cache_may_have_evicted(z, c), note_evictions(z, c);
        check_caches(z);
        if (z->step % DRAIN_EVERY == DRAIN_EVERY - 1 && !z->faults_left) drain_all(z);
    }
    if (z->faults_left) CHECK_OK(tp_sim_clear_faults(z->f.dev));
    z->faults_left = 0;
    if (check_failures == 0) {
        if (chance(z, 50)) drain_all(z);
        check_caches(z);
    }
    /* Caches go first (they pin pool memory), with executables live. */
    for (int c = 0; c < CACHES; c++) CHECK_OK(tp_graph_cache_destroy(z->cache[c]));
    for (int p = 0; p < POOLS; p++) {
        tp_pool_stats ps = gt_pool_stats(z->pool[p]);
        if (ps.pinned_bytes.current) FAIL_AT(z, "pool %d: %" PRIu64 " bytes pinned after the caches went", p, ps.pinned_bytes.current);
    }
    if (gt_sim_execs(z->f.dev)) FAIL_AT(z, "device holds %" PRIu64 " executables after the caches went", gt_sim_execs(z->f.dev));
    for (int i = 0; i < z->n; i++) CHECK_OK(tp_pool_free(z->pool[z->b[i].pool], addr(z->b[i].address), z->stream[z->b[i].stream]));
    for (int p = 0; p < POOLS; p++) {
        char msg[256] = "";
        tp_status st = tp_pool_check(z->pool[p], msg, sizeof msg);
        if (st != TP_OK) FAIL_AT(z, "pool %d check: %s", p, msg);
        CHECK_OK(tp_pool_destroy(z->pool[p]));
    }
    for (int s = 1; s < STREAMS; s++) CHECK_OK(tp_stream_destroy(z->f.dev, z->stream[s]));
    if (z->f.log.errors) FAIL_AT(z, "%d error(s) logged while winding down", z->f.log.errors);
    z->f.pool = NULL;
    if (z->graphpool) {
        /* The driver keeps the memory of destroyed executables (as CUDA
         * does) until the device closes: everything else must be back. */
        tp_sim_counters ctr = gt_counters(z->f.dev);
        if (ctr.graph_execs || ctr.graph_exec_bytes || ctr.hazards || ctr.invalid_accesses)
            FAIL_AT(z, "device: %" PRIu64 " execs, %" PRIu64 " bytes, %" PRIu64 " hazards, %" PRIu64 " invalid accesses",
                    ctr.graph_execs, ctr.graph_exec_bytes, ctr.hazards, ctr.invalid_accesses);
        CHECK_OK(tp_device_close(z->f.dev));
    } else {
        fixture_close(&z->f);
    }
    if (getenv("TP_TEST_VERBOSE"))
        printf("  seed %llu: %llu steps, %llu calls succeeded, %llu refused, %llu launches into captures\n",
               (unsigned long long)seed, (unsigned long long)z->step, (unsigned long long)z->ok_calls,
               (unsigned long long)z->refused_calls, (unsigned long long)z->capture_launches);
    free(z);
}

static void test_random_graph_cache_calls(void) {
    fuzz_seeds(fuzz_run, 800);
}

/* ------------------------------------------------------------- threads */

#define MT_THREADS 3
#define MT_KEYS 6

typedef struct mt_shared {
    tp_device *dev;
    tp_pool *pool;
    tp_graph_cache *cache;
    void *block[MT_THREADS];
    atomic_int done;
    atomic_int bad; /* statuses outside the documented ones, failed checks */
    atomic_ullong runs_ok, launches_ok;
} mt_shared;

typedef struct mt_worker {
    mt_shared *sh;
    int id;
    tp_stream stream;
    uint64_t iterations;
} mt_worker;

static void mt_bad(mt_shared *sh, const char *what, tp_status st) {
    fprintf(stderr, "graph fuzz threads: %s: %s\n", what, tp_status_name(st));
    atomic_fetch_add(&sh->bad, 1);
}

static void *mt_main(void *arg) {
    mt_worker *w = arg;
    mt_shared *sh = w->sh;
    test_rng rng = {(unsigned long long)w->id * 7919 + 11};
    tp_range r = {(uint64_t)(uintptr_t)sh->block[w->id], TEST_MiB};
    for (uint64_t i = 0; i < w->iterations; i++) {
        uint64_t key = rng_below(&rng, MT_KEYS);
        tp_status st;
        switch (rng_below(&rng, 8)) {
        case 0:
        case 1: { /* run a fresh graph over this thread's block, pinned by the cache */
            tp_sim_graph_desc desc = {.node_count = 4 + (uint32_t)key, .topology_id = key * 2 + rng_below(&rng, 2),
                                      .duration_ns = rng_below(&rng, 2 * MS), .ranges = &r, .range_count = 1};
            tp_graph g = NULL;
            if ((st = tp_sim_graph_create(sh->dev, &desc, &g)) != TP_OK) {
                mt_bad(sh, "graph_create", st);
                break;
            }
            tp_graph_pins pins = {sh->pool, &r, 1, false};
            st = tp_graph_cache_run(sh->cache, key, g, &pins, w->stream);
            if (st == TP_OK) atomic_fetch_add(&sh->runs_ok, 1);
            else if (st != TP_ERR_RUN_EAGER && st != TP_ERR_NOT_FOUND) mt_bad(sh, "run", st);
            tp_sim_graph_destroy(sh->dev, g);
            break;
        }
        case 2:
        case 3:
            st = tp_graph_cache_launch(sh->cache, key, w->stream);
            if (st == TP_OK) atomic_fetch_add(&sh->launches_ok, 1);
            else if (st != TP_ERR_NOT_FOUND) mt_bad(sh, "launch", st);
            break;
        case 4:
            st = tp_graph_cache_evict(sh->cache, key);
            if (st != TP_OK && st != TP_ERR_NOT_FOUND) mt_bad(sh, "evict", st);
            break;
        case 5:
            if ((st = tp_graph_cache_tick(sh->cache)) != TP_OK) mt_bad(sh, "tick", st);
            break;
        case 6: {
            char buf[256];
            size_t length = 0;
            st = tp_graph_cache_stats_json(sh->cache, buf, sizeof buf, &length);
            if (st != TP_OK && st != TP_ERR_BUFFER_TOO_SMALL) mt_bad(sh, "json", st);
            st = tp_graph_cache_stats_openmetrics(sh->cache, "t=\"1\"", buf, sizeof buf, &length);
            if (st != TP_ERR_BUFFER_TOO_SMALL) mt_bad(sh, "openmetrics", st);
            break;
        }
        default: {
            char msg[256];
            if ((st = tp_graph_cache_check(sh->cache, msg, sizeof msg)) != TP_OK) {
                fprintf(stderr, "graph fuzz threads: check: %s\n", msg);
                mt_bad(sh, "check", st);
            }
            break;
        }
        }
    }
    atomic_fetch_add(&sh->done, 1);
    return NULL;
}

/* Moves the virtual clock, allocates against the pool's limit (the
 * cache's reclaim callback runs on this thread) and now and then detaches
 * and re-attaches the pool while the workers run. */
static void *mt_clock_main(void *arg) {
    mt_worker *w = arg;
    mt_shared *sh = w->sh;
    for (unsigned round = 0; atomic_load(&sh->done) < MT_THREADS; round++) {
        tp_sim_advance(sh->dev, 100000);
        void *p = NULL;
        if (tp_pool_alloc(sh->pool, 40 * TEST_MiB, w->stream, &p) == TP_OK) tp_pool_free(sh->pool, p, w->stream);
        if (round % 16 == 15) {
            tp_status st = tp_graph_cache_detach_pool(sh->cache, sh->pool);
            if (st != TP_OK) mt_bad(sh, "detach", st);
            if ((st = tp_graph_cache_attach_pool(sh->cache, sh->pool)) != TP_OK) mt_bad(sh, "attach", st);
        }
    }
    return NULL;
}

static void test_threads_concurrent_cache_calls(void) {
    fixture f;
    fixture_open_device(&f, "sim:1GiB");
    mt_shared sh = {.dev = f.dev};
    tp_pool_config pc = {.limit_bytes = 64 * TEST_MiB};
    REQUIRE_OK(tp_pool_create(f.dev, &pc, &sh.pool));
    tp_graph_cache_config cc = {.max_execs = 4, .max_bytes = 2 * TEST_MiB, .idle_evict_ns = 5 * MS,
                                .background_thread = true, .tick_interval_ns = 100000};
    REQUIRE_OK(tp_graph_cache_create(f.dev, &cc, &sh.cache));
    CHECK_OK(tp_graph_cache_attach_pool(sh.cache, sh.pool));
    mt_worker w[MT_THREADS + 1];
    pthread_t t[MT_THREADS + 1];
    uint64_t iterations = env_u64("TP_FUZZ_STEPS", 2000);
    for (int i = 0; i <= MT_THREADS; i++) {
        w[i] = (mt_worker){&sh, i, NULL, iterations};
        REQUIRE_OK(tp_stream_create(f.dev, &w[i].stream));
        if (i < MT_THREADS) REQUIRE_OK(tp_pool_alloc(sh.pool, TEST_MiB, w[i].stream, &sh.block[i]));
    }
    for (int i = 0; i < MT_THREADS; i++) REQUIRE(pthread_create(&t[i], NULL, mt_main, &w[i]) == 0);
    REQUIRE(pthread_create(&t[MT_THREADS], NULL, mt_clock_main, &w[MT_THREADS]) == 0);
    for (int i = 0; i <= MT_THREADS; i++) pthread_join(t[i], NULL);
    CHECK_EQ_U64(atomic_load(&sh.bad), 0);
    CHECK_GT_U64(atomic_load(&sh.runs_ok), 0);
    CHECK_GT_U64(atomic_load(&sh.launches_ok), 0);
    CHECK_CACHE(sh.cache);
    CHECK_POOL(sh.pool);
    /* drained: nothing pinned once every launch is done */
    for (uint64_t key = 0; key < MT_KEYS; key++) tp_graph_cache_evict(sh.cache, key);
    CHECK_OK(tp_device_synchronize(f.dev));
    CHECK_OK(tp_graph_cache_tick(sh.cache));
    tp_graph_cache_stats s = gt_stats(sh.cache);
    CHECK_EQ_U64(s.execs, 0);
    CHECK_EQ_U64(s.pinned_ranges, 0);
    CHECK_EQ_U64(gt_pool_stats(sh.pool).pinned_bytes.current, 0);
    CHECK_OK(tp_graph_cache_destroy(sh.cache));
    for (int i = 0; i <= MT_THREADS; i++) {
        if (i < MT_THREADS) CHECK_OK(tp_pool_free(sh.pool, sh.block[i], w[i].stream));
        CHECK_OK(tp_pool_forget_stream(sh.pool, w[i].stream));
        CHECK_OK(tp_stream_destroy(f.dev, w[i].stream));
    }
    f.pool = sh.pool;
    f.kind = TP_POOL_AUTO;
    fixture_close(&f);
}

static const test_case tests[] = {
    TEST_CASE(test_random_graph_cache_calls),
    TEST_CASE(test_threads_concurrent_cache_calls),
};

int main(int argc, char **argv) { return TEST_MAIN("test_graph_fuzz", tests, argc, argv); }
