/* SPDX-License-Identifier: MIT */
/*
 * test_hazards_random.c -- thousands of small, independent, seeded
 * multi-stream workloads that keep every rule of the stream-ordered contract
 * (include/tidepool.h, top comment), each checked by the simulated device's
 * hazard checker. Whatever hazard the checker sees is a fault of the library
 * (the pools, the graph cache, or the simulated device itself).
 *
 * Each seed draws its own configuration:
 *   - pool kind (VMM on "sim:SIZE", segment on "sim:SIZE,novmm", half the
 *     time with ",adjacent": segments end to end); for VMM the
 *     address reservation is the default (4 x limit) or exactly the limit (a
 *     tight reservation forces address reuse); page size 2 MiB, 1 MiB or
 *     512 KiB;
 *   - a limit of 16-64 MiB, a device that may be smaller or larger than it,
 *     release threshold, idle time, parking size, alignment, segment sizes,
 *     map-call size, invariant checks after every call or not, the virtual
 *     clock at the start (0 or later);
 *   - 1 to 5 streams (sometimes the default stream among them; one on
 *     about one seed in sixteen, where the pool has a single front stream
 *     and its hits fill the last-freed slot with plain stores);
 *   - graph-cache activity on about a third of the seeds: a cache attached
 *     to the pool (its reclaim callback evicts under pressure), keys
 *     prepared with pins of live blocks, launched, updated, evicted, ticked.
 * and then runs a random sequence of legal operations:
 *   alloc on a random stream (256 B .. a few MiB, some near the limit; out
 *     of memory is a legal outcome), the owner touching the new block;
 *   kernels of 0 .. 4 ms touching whole blocks or parts of blocks, only
 *     blocks allocated on the kernel's own stream (cross-stream reuse of
 *     memory happens only through the pool: that is what is under test);
 *   free on the block's stream, or on another stream after making it wait on
 *     an event recorded on the block's stream;
 *   tp_sim_advance, tp_pool_trim (random targets), tp_pool_tick;
 *   pins and unpins of live blocks (a pinned block may be freed; the pin
 *     keeps it until unpinned);
 *   stream recycling: free the stream's blocks on it, evict the graph keys
 *     that used it, tp_pool_forget_stream, tp_stream_destroy, a new stream;
 *   graph cache: prepare (new key, hit, in-place update to other ranges,
 *     a second topology), launch on the stream whose blocks it pins, evict,
 *     tick; TP_ERR_RUN_EAGER runs the work as a kernel instead.
 *
 * After every operation: no hazard of any kind and no invalid access so far.
 * After every alloc: the block is aligned, overlaps no live block and no
 * pinned range of the model, and tp_pool_block_size gives its size. Now and
 * then (every operation on seeds that set TP_POOL_FLAG_CHECK_INVARIANTS):
 * tp_pool_check, tp_graph_cache_check, requested bytes equal the model's.
 * At the end: everything freed and unpinned, cache destroyed, pool checked
 * and destroyed, and the device holds no memory, saw no hazard, and nothing
 * was logged at ERROR.
 *
 * Test cases (one ctest entry each) take the seeds of one configuration
 * group: vmm_wide (VMM, default reservation), vmm_tight (VMM, reservation =
 * limit), segment. f1_regression is the deterministic reproduction of
 * finding F1 (place_window overlooks a second stream's pending free inside
 * the window it waits for); sync_waits_regression and idle_order_regression
 * reproduce the two other faults the random workloads found (see there).
 *
 * Environment:
 *   TP_HAZARD_SEEDS=N     seeds in all (split over the groups by draw);
 *                         default 3000, 1500 under a sanitizer
 *   TP_HAZARD_FIRST=S     first seed (default 1)
 *   TP_HAZARD_SEED=S      run only seed S (in whichever group it falls)
 *   TP_HAZARD_OPS=N       operations per seed (default: drawn, 300..900)
 *   TP_HAZARD_TRACE=1     print every operation (use with TP_HAZARD_SEED)
 *   TP_HAZARD_SHOW=N      failing seeds described per group (default 25,
 *                         and up to 25 more with hazards)
 *   TP_TEST_VERBOSE=1     print the library's log messages
 */
#include "check.h"

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define HZ_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || __has_feature(memory_sanitizer)
#define HZ_SANITIZED 1
#endif
#endif
#ifndef HZ_SANITIZED
#define HZ_SANITIZED 0
#endif

#define HZ_KiB 1024ull
#define HZ_MS 1000000ull
#define HZ_MAX_STREAMS 5
#define HZ_MAX_LIVE 192
#define HZ_MAX_PINS 24
#define HZ_KEYS 8

enum { G_VMM_WIDE, G_VMM_TIGHT, G_SEGMENT, G_COUNT };
static const char *const group_names[G_COUNT] = {"vmm_wide", "vmm_tight", "segment"};

typedef struct hz_block {
    uint64_t address, bytes;
    int stream; /* the stream it was allocated on: the only one that touches it */
} hz_block;

typedef struct hz_pin {
    uint64_t address, bytes; /* exactly one block's range, live or freed */
} hz_pin;

typedef struct hz_key {
    bool live;     /* prepared and not known evicted */
    int stream;    /* the stream of the blocks its current executable pins */
    unsigned mask; /* streams any of its executables was prepared or launched for */
} hz_key;

typedef struct hz_config {
    int group;
    tp_pool_config pc;
    uint64_t device_bytes, gran, node_bytes;
    int streams;
    bool default_stream; /* slot 0 is TP_STREAM_DEFAULT (never recycled) */
    bool graphs;
    tp_graph_cache_config gc;
    int ops;
    uint64_t start_ns; /* the virtual clock at the first operation */
    char spec[128];
} hz_config;

typedef struct hz_totals {
    unsigned long long seeds, ops, allocs, ooms, frees, cross_frees, kernels, pins, recycles, trims, prepares,
        eager, launches, launch_misses, evictions, evictions_pressure, hazard_seeds;
} hz_totals;

/* Counts like test_log_fn and keeps the first hazard message. */
typedef struct hz_log {
    int warnings, errors;
    bool verbose;
    char first_hazard[320];
} hz_log;

static void hz_log_fn(void *user, tp_log_level level, const char *message) {
    hz_log *log = user;
    if (level >= TP_LOG_WARN) log->warnings++;
    if (level >= TP_LOG_ERROR) log->errors++;
    if (!log->first_hazard[0] && strstr(message, "hazard"))
        snprintf(log->first_hazard, sizeof log->first_hazard, "%s", message);
    if (log->verbose) fprintf(stderr, "[log %d] %s\n", (int)level, message);
}

typedef struct hz_run {
    unsigned long long seed;
    hz_config cfg;
    int step;
    const char *op;
    bool trace;
    bool failed;
    char why[640];

    test_rng rng;
    hz_log log;
    tp_device *dev;
    tp_pool *pool;
    tp_graph_cache *cache;
    tp_event event;
    tp_stream streams[HZ_MAX_STREAMS];
    bool stream_made[HZ_MAX_STREAMS];

    hz_block live[HZ_MAX_LIVE];
    int nlive;
    uint64_t requested;
    hz_pin pins[HZ_MAX_PINS];
    int npins;
    hz_key keys[HZ_KEYS];
    hz_totals *totals;
} hz_run;

/* ------------------------------------------------------------- helpers */

static unsigned long long env_ull(const char *name, unsigned long long fallback) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : fallback;
}

static void hz_fail(hz_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hz_fail(hz_run *r, const char *fmt, ...) {
    if (r->failed) return;
    r->failed = true;
    uint64_t now = 0;
    if (r->dev) tp_sim_now(r->dev, &now);
    int n = snprintf(r->why, sizeof r->why, "step %d (%s, t=%llu ns): ", r->step, r->op ? r->op : "-",
                     (unsigned long long)now);
    if (n < 0 || (size_t)n >= sizeof r->why) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->why + n, sizeof r->why - (size_t)n, fmt, ap);
    va_end(ap);
}

/* True on TP_OK; false without failing on `also` (a legal outcome, e.g.
 * out of memory); fails the seed on anything else. */
static bool hz_st(hz_run *r, tp_status st, tp_status also, const char *what) {
    if (st == TP_OK) return true;
    if (st != also || also == TP_OK) hz_fail(r, "%s returned %s", what, tp_status_name(st));
    return false;
}
#define HZ_OK(r, expr) hz_st((r), (expr), TP_OK, #expr)

static void hz_trace(hz_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hz_trace(hz_run *r, const char *fmt, ...) {
    if (!r->trace) return;
    va_list ap;
    va_start(ap, fmt);
    printf("    [%d] ", r->step);
    vprintf(fmt, ap);
    putchar('\n');
    va_end(ap);
}

static uint64_t below(hz_run *r, uint64_t n) { return rng_below(&r->rng, n); }
static bool chance(hz_run *r, unsigned percent) { return below(r, 100) < percent; }
static uint64_t log_uniform(hz_run *r, uint64_t lo, uint64_t hi) { return rng_log_uniform(&r->rng, lo, hi); }

static uint64_t hz_duration(hz_run *r) {
    if (chance(r, 15)) return 0;
    return log_uniform(r, 1000, 4 * HZ_MS);
}

static void *as_ptr(uint64_t address) { return (void *)(uintptr_t)address; }

/* A random live block of stream s (-1 if it has none). */
static int pick_live_of(hz_run *r, int s) {
    int n = 0;
    for (int i = 0; i < r->nlive; i++) n += r->live[i].stream == s;
    if (!n) return -1;
    int k = (int)below(r, (uint64_t)n);
    for (int i = 0; i < r->nlive; i++)
        if (r->live[i].stream == s && k-- == 0) return i;
    return -1;
}

/* Up to 3 ranges of live blocks of stream s, whole or in part. */
static size_t gather_ranges(hz_run *r, int s, tp_range *out, bool parts) {
    size_t n = 0, want = 1 + (size_t)below(r, 3);
    for (size_t i = 0; i < want; i++) {
        int k = pick_live_of(r, s);
        if (k < 0) break;
        const hz_block *b = &r->live[k];
        uint64_t off = 0, len = b->bytes;
        if (parts && b->bytes > 1 && chance(r, 25)) {
            off = below(r, b->bytes);
            len = 1 + below(r, b->bytes - off);
        }
        out[n++] = (tp_range){b->address + off, len};
    }
    return n;
}

static void check_hazards(hz_run *r) {
    tp_sim_counters c;
    memset(&c, 0, sizeof c);
    if (!HZ_OK(r, tp_sim_get_counters(r->dev, &c))) return;
    if (c.hazards || c.invalid_accesses)
        hz_fail(r, "%llu hazard(s): handout %llu, unmap %llu, free %llu; invalid accesses %llu",
                (unsigned long long)c.hazards, (unsigned long long)c.hazards_handout,
                (unsigned long long)c.hazards_unmap, (unsigned long long)c.hazards_free,
                (unsigned long long)c.invalid_accesses);
}

static void check_pool(hz_run *r) {
    char msg[256] = "";
    tp_status st = tp_pool_check(r->pool, msg, sizeof msg);
    if (st != TP_OK) {
        hz_fail(r, "tp_pool_check: %s: %s", tp_status_name(st), msg);
        return;
    }
    tp_pool_stats s;
    if (!HZ_OK(r, tp_pool_get_stats(r->pool, &s))) return;
    if (s.requested_bytes.current != r->requested)
        hz_fail(r, "requested bytes %llu, model %llu", (unsigned long long)s.requested_bytes.current,
                (unsigned long long)r->requested);
    else if (s.reserved_bytes.current > r->cfg.pc.limit_bytes)
        hz_fail(r, "reserved %llu above the limit %llu", (unsigned long long)s.reserved_bytes.current,
                (unsigned long long)r->cfg.pc.limit_bytes);
    else if (s.hazards)
        hz_fail(r, "pool stats count %llu hazard(s)", (unsigned long long)s.hazards);
    if (r->cache && !r->failed) {
        st = tp_graph_cache_check(r->cache, msg, sizeof msg);
        if (st != TP_OK) hz_fail(r, "tp_graph_cache_check: %s: %s", tp_status_name(st), msg);
    }
}

/* ---------------------------------------------------------- configuration */

static void draw_config(unsigned long long seed, hz_config *c, unsigned long long ops_override) {
    test_rng rng = {seed * 0x2545F4914F6CDD1Dull + 0x1234567ull};
    memset(c, 0, sizeof *c);
    /* The tight reservation is the most adversarial for VMM: half the seeds. */
    unsigned g = (unsigned)rng_below(&rng, 4);
    c->group = g == 0 ? G_VMM_WIDE : g == 3 ? G_SEGMENT : G_VMM_TIGHT;
    tp_pool_config *pc = &c->pc;
    pc->kind = c->group == G_SEGMENT ? TP_POOL_SEGMENT : TP_POOL_VMM;
    static const uint64_t grans[] = {2 * TEST_MiB, 2 * TEST_MiB, 2 * TEST_MiB, TEST_MiB, 512 * HZ_KiB};
    c->gran = pc->kind == TP_POOL_VMM ? grans[rng_below(&rng, 5)] : 2 * TEST_MiB;
    pc->limit_bytes = (8 + rng_below(&rng, 25)) * 2 * TEST_MiB; /* 16..64 MiB */
    if (c->group == G_VMM_TIGHT) pc->va_reserve_bytes = pc->limit_bytes;
    /* The device: mostly room for the pool and then some; sometimes less
     * than the limit (the device says out of memory first). */
    if (rng_below(&rng, 4) == 0)
        c->device_bytes = pc->limit_bytes / 2 + rng_below(&rng, pc->limit_bytes / 2 / TEST_MiB + 1) * TEST_MiB;
    else
        c->device_bytes = pc->limit_bytes + rng_below(&rng, pc->limit_bytes / TEST_MiB + 1) * TEST_MiB;
    if (c->device_bytes < 8 * TEST_MiB) c->device_bytes = 8 * TEST_MiB;
    unsigned r = (unsigned)rng_below(&rng, 10);
    pc->release_threshold_bytes =
        r < 5 ? 0 : r == 5 ? TP_BYTES_UNLIMITED : 1 + rng_below(&rng, pc->limit_bytes);
    r = (unsigned)rng_below(&rng, 20);
    pc->idle_release_ns = r < 9 ? 0 : r == 9 ? TP_NS_NEVER : rng_log_uniform(&rng, 10000, 20 * HZ_MS);
    if (rng_below(&rng, 5) < 2) pc->tcache_max_block_bytes = rng_log_uniform(&rng, 256, 4 * TEST_MiB);
    if (rng_below(&rng, 5) == 0) pc->alignment_bytes = 512ull << rng_below(&rng, 8);
    if (pc->kind == TP_POOL_VMM) {
        if (rng_below(&rng, 10) < 3) pc->max_map_bytes = (1 + rng_below(&rng, 4)) * c->gran;
    } else {
        if (rng_below(&rng, 10) < 3) pc->small_segment_bytes = (1ull << rng_below(&rng, 3)) * TEST_MiB;
        if (rng_below(&rng, 2)) pc->medium_segment_bytes = (4 + rng_below(&rng, 13)) * TEST_MiB;
        if (rng_below(&rng, 4) == 0) pc->growth_step_percent = 1 + (uint32_t)rng_below(&rng, 50);
    }
    if (rng_below(&rng, 4) == 0) pc->flags |= TP_POOL_FLAG_CHECK_INVARIANTS;
    /* (One draw: k % 8 == 0 were the seeds of two streams before one-stream
     * seeds came; half of them now run one.) */
    unsigned k = (unsigned)rng_below(&rng, 16);
    c->streams = k == 0 ? 1 : k == 8 ? 2 : 3 + (int)rng_below(&rng, HZ_MAX_STREAMS - 2);
    c->default_stream = rng_below(&rng, 4) == 0;
    c->graphs = rng_below(&rng, 3) == 0;
    c->node_bytes = rng_log_uniform(&rng, 4 * HZ_KiB, 128 * HZ_KiB);
    /* Executables and the pool compete for the device: often less device
     * than the limit, so instantiation meets out of memory too. */
    if (c->graphs && rng_below(&rng, 2))
        c->device_bytes = pc->limit_bytes / 2 + rng_below(&rng, pc->limit_bytes / 2 / TEST_MiB + 1) * TEST_MiB;
    if (c->graphs) {
        c->gc.max_execs = 2 + (uint32_t)rng_below(&rng, 7);
        c->gc.max_bytes = rng_below(&rng, 2) ? 0 : rng_log_uniform(&rng, 256 * HZ_KiB, pc->limit_bytes);
        c->gc.idle_evict_ns = rng_below(&rng, 2) ? 0 : rng_log_uniform(&rng, HZ_MS, 50 * HZ_MS);
        c->gc.protected_percent = rng_below(&rng, 2) ? 0 : 1 + (uint32_t)rng_below(&rng, 99);
    }
    c->start_ns = rng_below(&rng, 2) ? 0 : rng_log_uniform(&rng, 1000, 1000 * HZ_MS);
    c->ops = ops_override ? (int)ops_override : 300 + (int)rng_below(&rng, 601);
    char dev_size[32];
    snprintf(dev_size, sizeof dev_size, "%lluMiB", (unsigned long long)(c->device_bytes / TEST_MiB));
    if (pc->kind == TP_POOL_SEGMENT) /* segments end to end half the time, as cudaMalloc's often are */
        snprintf(c->spec, sizeof c->spec, "sim:%s,novmm,graph_node_bytes=%llu%s", dev_size,
                 (unsigned long long)c->node_bytes, rng_below(&rng, 2) ? ",adjacent" : "");
    else
        snprintf(c->spec, sizeof c->spec, "sim:%s,gran=%lluKiB,graph_node_bytes=%llu", dev_size,
                 (unsigned long long)(c->gran / HZ_KiB), (unsigned long long)c->node_bytes);
}

static void describe_config(const hz_config *c, char *buf, size_t cap) {
    const tp_pool_config *pc = &c->pc;
    snprintf(buf, cap,
             "%s \"%s\" limit %llu MiB va %s streams %d%s graphs %s ops %d threshold %llu idle_ns %llu tcache %llu "
             "align %llu max_map %llu small %llu medium %llu check %s start_ns %llu",
             group_names[c->group], c->spec, (unsigned long long)(pc->limit_bytes / TEST_MiB),
             pc->va_reserve_bytes ? "=limit" : "default", c->streams, c->default_stream ? " (default among them)" : "",
             c->graphs ? "yes" : "no", c->ops, (unsigned long long)pc->release_threshold_bytes,
             (unsigned long long)pc->idle_release_ns, (unsigned long long)pc->tcache_max_block_bytes,
             (unsigned long long)pc->alignment_bytes, (unsigned long long)pc->max_map_bytes,
             (unsigned long long)pc->small_segment_bytes, (unsigned long long)pc->medium_segment_bytes,
             pc->flags & TP_POOL_FLAG_CHECK_INVARIANTS ? "every op" : "periodic", (unsigned long long)c->start_ns);
}

/* ------------------------------------------------------------ operations */

static uint64_t draw_size(hz_run *r) {
    uint64_t limit = r->cfg.pc.limit_bytes;
    unsigned roll = (unsigned)below(r, 100);
    if (roll < 2) return 1 + below(r, 255);
    if (roll < 50) return log_uniform(r, 256, 64 * HZ_KiB);
    if (roll < 85) return log_uniform(r, 64 * HZ_KiB, 4 * TEST_MiB);
    if (roll < 91) return log_uniform(r, 2 * TEST_MiB, limit / 4);
    if (roll < 97) return (1 + below(r, 4)) * r->cfg.gran - below(r, 2) * below(r, r->cfg.gran); /* whole pages */
    return limit / 2 + below(r, limit / 2 + 1); /* near the limit */
}

static void launch(hz_run *r, int s, const tp_range *ranges, size_t n) {
    uint64_t duration = hz_duration(r);
    hz_trace(r, "kernel on s%d, %zu range(s) from 0x%llx, %llu ns", s, n, n ? (unsigned long long)ranges[0].address : 0ull,
             (unsigned long long)duration);
    if (HZ_OK(r, tp_sim_launch(r->dev, r->streams[s], duration, ranges, n))) r->totals->kernels++;
}

static void op_free_at(hz_run *r, int k, bool cross);

static void op_alloc(hz_run *r) {
    if (r->nlive >= HZ_MAX_LIVE) {
        op_free_at(r, (int)below(r, (uint64_t)r->nlive), false);
        return;
    }
    int s = (int)below(r, (uint64_t)r->cfg.streams);
    uint64_t bytes = draw_size(r);
    void *p = (void *)1;
    tp_status st = tp_pool_alloc(r->pool, (size_t)bytes, r->streams[s], &p);
    hz_trace(r, "alloc %llu on s%d: %s 0x%llx", (unsigned long long)bytes, s, tp_status_name(st),
             (unsigned long long)(uintptr_t)p);
    if (st == TP_ERR_OUT_OF_MEMORY) {
        r->totals->ooms++;
        if (p) hz_fail(r, "out of memory but *out_ptr is not NULL");
        return;
    }
    if (!hz_st(r, st, TP_OK, "tp_pool_alloc")) return;
    r->totals->allocs++;
    uint64_t a = (uint64_t)(uintptr_t)p;
    uint64_t align = r->cfg.pc.alignment_bytes ? r->cfg.pc.alignment_bytes : 256;
    if (!p || a % align) {
        hz_fail(r, "alloc of %llu gave 0x%llx, not aligned to %llu", (unsigned long long)bytes, (unsigned long long)a,
                (unsigned long long)align);
        return;
    }
    for (int i = 0; i < r->nlive; i++) {
        const hz_block *b = &r->live[i];
        if (a < b->address + b->bytes && b->address < a + bytes) {
            hz_fail(r, "new block [0x%llx, +%llu) on s%d overlaps live block [0x%llx, +%llu) of s%d",
                    (unsigned long long)a, (unsigned long long)bytes, s, (unsigned long long)b->address,
                    (unsigned long long)b->bytes, b->stream);
            return;
        }
    }
    for (int i = 0; i < r->npins; i++) {
        const hz_pin *pin = &r->pins[i];
        if (a < pin->address + pin->bytes && pin->address < a + bytes) {
            hz_fail(r, "new block [0x%llx, +%llu) overlaps pinned range [0x%llx, +%llu)", (unsigned long long)a,
                    (unsigned long long)bytes, (unsigned long long)pin->address, (unsigned long long)pin->bytes);
            return;
        }
    }
    size_t got = 0;
    if (!HZ_OK(r, tp_pool_block_size(r->pool, p, &got))) return;
    if (got != bytes) {
        hz_fail(r, "tp_pool_block_size says %zu, asked for %llu", got, (unsigned long long)bytes);
        return;
    }
    r->live[r->nlive++] = (hz_block){a, bytes, s};
    r->requested += bytes;
    if (chance(r, 60)) {
        tp_range whole = {a, bytes};
        launch(r, s, &whole, 1); /* the new owner writes it */
    }
}

static void op_free_at(hz_run *r, int k, bool cross) {
    hz_block b = r->live[k];
    int t = b.stream;
    if (cross && r->cfg.streams > 1) {
        t = (b.stream + 1 + (int)below(r, (uint64_t)r->cfg.streams - 1)) % r->cfg.streams;
        /* Legal: t waits for everything queued so far on the owner. */
        if (!HZ_OK(r, tp_event_record(r->dev, r->event, r->streams[b.stream]))) return;
        if (!HZ_OK(r, tp_stream_wait_event(r->dev, r->streams[t], r->event))) return;
        r->totals->cross_frees++;
    }
    hz_trace(r, "free 0x%llx (+%llu, of s%d) on s%d", (unsigned long long)b.address, (unsigned long long)b.bytes,
             b.stream, t);
    if (!HZ_OK(r, tp_pool_free(r->pool, as_ptr(b.address), r->streams[t]))) return;
    r->totals->frees++;
    r->requested -= b.bytes;
    r->live[k] = r->live[--r->nlive];
}

static void op_free(hz_run *r) {
    if (r->nlive) op_free_at(r, (int)below(r, (uint64_t)r->nlive), chance(r, 25));
}

static void op_kernel(hz_run *r) {
    if (!r->nlive) return;
    int s = r->live[below(r, (uint64_t)r->nlive)].stream;
    tp_range ranges[3];
    size_t n = gather_ranges(r, s, ranges, true);
    launch(r, s, ranges, n);
}

static void op_advance(hz_run *r) {
    unsigned roll = (unsigned)below(r, 100);
    uint64_t ns = roll < 70 ? below(r, 2 * HZ_MS) : roll < 95 ? below(r, 20 * HZ_MS) : log_uniform(r, 100 * HZ_MS, 1000 * HZ_MS);
    hz_trace(r, "advance %llu ns", (unsigned long long)ns);
    HZ_OK(r, tp_sim_advance(r->dev, ns));
}

static void op_trim(hz_run *r) {
    uint64_t target = chance(r, 30) ? 0 : below(r, r->cfg.pc.limit_bytes + 1);
    uint64_t released = 0;
    hz_trace(r, "trim to %llu", (unsigned long long)target);
    if (HZ_OK(r, tp_pool_trim(r->pool, target, &released))) r->totals->trims++;
}

static void op_tick(hz_run *r) {
    hz_trace(r, "tick");
    HZ_OK(r, tp_pool_tick(r->pool));
}

static void op_pin(hz_run *r) {
    if (!r->nlive || r->npins >= HZ_MAX_PINS) return;
    const hz_block *b = &r->live[below(r, (uint64_t)r->nlive)];
    hz_trace(r, "pin 0x%llx +%llu", (unsigned long long)b->address, (unsigned long long)b->bytes);
    if (!HZ_OK(r, tp_pool_pin(r->pool, as_ptr(b->address), (size_t)b->bytes))) return;
    r->pins[r->npins++] = (hz_pin){b->address, b->bytes};
    r->totals->pins++;
}

static void unpin_at(hz_run *r, int k) {
    hz_pin pin = r->pins[k];
    hz_trace(r, "unpin 0x%llx +%llu", (unsigned long long)pin.address, (unsigned long long)pin.bytes);
    if (!HZ_OK(r, tp_pool_unpin(r->pool, as_ptr(pin.address), (size_t)pin.bytes))) return;
    r->pins[k] = r->pins[--r->npins];
}

static void op_unpin(hz_run *r) {
    if (r->npins) unpin_at(r, (int)below(r, (uint64_t)r->npins));
}

static void evict_key(hz_run *r, uint64_t k) {
    hz_trace(r, "evict key %llu", (unsigned long long)k);
    tp_status st = tp_graph_cache_evict(r->cache, k);
    if (st == TP_OK) r->totals->evictions++;
    if (hz_st(r, st, TP_ERR_NOT_FOUND, "tp_graph_cache_evict") || st == TP_ERR_NOT_FOUND) r->keys[k] = (hz_key){0};
}

/* Frees the stream's blocks on it, evicts the keys that used it, forgets
 * and destroys it, and puts a new stream in its place. */
static void op_recycle(hz_run *r) {
    int first = r->cfg.default_stream ? 1 : 0;
    if (r->cfg.streams - first < 1) return;
    int s = first + (int)below(r, (uint64_t)(r->cfg.streams - first));
    hz_trace(r, "recycle s%d", s);
    for (int i = r->nlive - 1; i >= 0 && !r->failed; i--)
        if (r->live[i].stream == s) op_free_at(r, i, false);
    if (r->cache)
        for (uint64_t k = 0; k < HZ_KEYS && !r->failed; k++)
            if (r->keys[k].mask & (1u << s)) evict_key(r, k);
    if (r->failed) return;
    if (!HZ_OK(r, tp_pool_forget_stream(r->pool, r->streams[s]))) return;
    r->stream_made[s] = false;
    if (!HZ_OK(r, tp_stream_destroy(r->dev, r->streams[s]))) return;
    if (!HZ_OK(r, tp_stream_create(r->dev, &r->streams[s]))) return;
    r->stream_made[s] = true;
    r->totals->recycles++;
}

static void op_prepare(hz_run *r) {
    if (!r->nlive) return;
    int s = r->live[below(r, (uint64_t)r->nlive)].stream;
    tp_range ranges[3];
    size_t n = gather_ranges(r, s, ranges, false);
    uint64_t k = below(r, HZ_KEYS);
    tp_sim_graph_desc desc = {.node_count = 1 + (uint32_t)below(r, 96),
                              .topology_id = below(r, 3),
                              .duration_ns = hz_duration(r),
                              .ranges = ranges,
                              .range_count = n};
    tp_graph g = NULL;
    if (!HZ_OK(r, tp_sim_graph_create(r->dev, &desc, &g))) return;
    tp_graph_pins pins = {.pool = r->pool, .ranges = ranges, .count = n, .already_pinned = false};
    tp_status st = tp_graph_cache_prepare(r->cache, k, g, &pins);
    hz_trace(r, "prepare key %llu (%u nodes, topology %llu, %zu range(s) of s%d): %s", (unsigned long long)k,
             desc.node_count, (unsigned long long)desc.topology_id, n, s, tp_status_name(st));
    HZ_OK(r, tp_sim_graph_destroy(r->dev, g));
    if (r->failed) return;
    r->totals->prepares++;
    if (st == TP_OK) {
        r->keys[k].live = true;
        r->keys[k].stream = s;
        r->keys[k].mask |= 1u << s;
        return;
    }
    if (st != TP_ERR_RUN_EAGER) {
        hz_st(r, st, TP_OK, "tp_graph_cache_prepare");
        return;
    }
    /* Run it eagerly, and make sure no older executable of the key is left
     * to be launched for the wrong stream. */
    r->totals->eager++;
    launch(r, s, ranges, n);
    if (!r->failed) evict_key(r, k);
}

static void op_launch(hz_run *r) {
    uint64_t live[HZ_KEYS];
    int n = 0;
    for (uint64_t k = 0; k < HZ_KEYS; k++)
        if (r->keys[k].live) live[n++] = k;
    if (!n) return;
    uint64_t k = live[below(r, (uint64_t)n)];
    tp_status st = tp_graph_cache_launch(r->cache, k, r->streams[r->keys[k].stream]);
    hz_trace(r, "launch key %llu on s%d: %s", (unsigned long long)k, r->keys[k].stream, tp_status_name(st));
    if (st == TP_OK) {
        r->totals->launches++;
    } else if (hz_st(r, st, TP_ERR_NOT_FOUND, "tp_graph_cache_launch") || st == TP_ERR_NOT_FOUND) {
        r->keys[k].live = false; /* evicted by the bounds, idleness or pressure */
        r->totals->launch_misses++;
    }
}

static void op_evict(hz_run *r) { evict_key(r, below(r, HZ_KEYS)); }

static void op_cache_tick(hz_run *r) {
    hz_trace(r, "cache tick");
    HZ_OK(r, tp_graph_cache_tick(r->cache));
}

typedef struct hz_op {
    const char *name;
    void (*fn)(hz_run *);
    unsigned weight;
    bool graph;
} hz_op;

static const hz_op ops[] = {
    {"alloc", op_alloc, 30, false},     {"free", op_free, 22, false},       {"kernel", op_kernel, 16, false},
    {"advance", op_advance, 12, false}, {"tick", op_tick, 3, false},        {"trim", op_trim, 2, false},
    {"pin", op_pin, 2, false},          {"unpin", op_unpin, 2, false},      {"recycle", op_recycle, 1, false},
    {"prepare", op_prepare, 5, true},   {"launch", op_launch, 6, true},     {"evict", op_evict, 1, true},
    {"cache_tick", op_cache_tick, 1, true},
};
#define HZ_OPS (sizeof ops / sizeof *ops)

static const hz_op *pick_op(hz_run *r) {
    unsigned total = 0;
    for (size_t i = 0; i < HZ_OPS; i++)
        if (!ops[i].graph || r->cache) total += ops[i].weight;
    unsigned roll = (unsigned)below(r, total);
    for (size_t i = 0; i < HZ_OPS; i++) {
        if (ops[i].graph && !r->cache) continue;
        if (roll < ops[i].weight) return &ops[i];
        roll -= ops[i].weight;
    }
    return &ops[0];
}

/* ------------------------------------------------------------- one seed */

/* Tears everything down; with check, also verifies the end state. */
static void finish(hz_run *r, bool check) {
    r->op = "teardown";
    if (check && r->pool) {
        while (r->npins && !r->failed) unpin_at(r, r->npins - 1);
        while (r->nlive && !r->failed) op_free_at(r, r->nlive - 1, false);
        if (!r->failed) check_pool(r);
    }
    if (r->cache) {
        tp_graph_cache_stats gs;
        memset(&gs, 0, sizeof gs);
        if (tp_graph_cache_get_stats(r->cache, &gs) == TP_OK) r->totals->evictions_pressure += gs.evictions_pressure;
        if (!HZ_OK(r, tp_graph_cache_destroy(r->cache))) check = false;
        r->cache = NULL;
    }
    if (check && !r->failed && r->pool) {
        tp_pool_stats s;
        if (HZ_OK(r, tp_pool_get_stats(r->pool, &s)) && (s.pinned_bytes.current || s.requested_bytes.current))
            hz_fail(r, "after freeing and unpinning everything: pinned %llu, requested %llu",
                    (unsigned long long)s.pinned_bytes.current, (unsigned long long)s.requested_bytes.current);
        if (!r->failed) check_pool(r);
    }
    if (r->pool) {
        if (!HZ_OK(r, tp_pool_destroy(r->pool))) check = false;
        r->pool = NULL;
    }
    if (r->event) tp_event_destroy(r->dev, r->event);
    r->event = NULL;
    for (int i = 0; i < HZ_MAX_STREAMS; i++) {
        if (r->stream_made[i]) tp_stream_destroy(r->dev, r->streams[i]);
        r->stream_made[i] = false;
    }
    if (check && !r->failed) {
        check_hazards(r);
        tp_sim_counters c;
        memset(&c, 0, sizeof c);
        if (HZ_OK(r, tp_sim_get_counters(r->dev, &c)) && c.physical_used_bytes)
            hz_fail(r, "device memory leaked after destroy: %llu bytes", (unsigned long long)c.physical_used_bytes);
        if (!r->failed && r->log.errors) hz_fail(r, "%d error(s) logged", r->log.errors);
    }
    if (r->dev) tp_device_close(r->dev);
    r->dev = NULL;
}

/* Runs one seed; false (with r->why) when it broke a rule. */
static bool run_seed(hz_run *r) {
    r->op = "setup";
    r->rng.state = r->seed * 0x9E3779B97F4A7C15ull ^ 0xD1B54A32D192ED03ull;
    r->log.verbose = getenv("TP_TEST_VERBOSE") != NULL;
    tp_device_config dc = {.log = hz_log_fn, .log_user = &r->log, .log_level = TP_LOG_WARN};
    if (!HZ_OK(r, tp_device_open(r->cfg.spec, &dc, &r->dev))) return false;
    if (!HZ_OK(r, tp_pool_create(r->dev, &r->cfg.pc, &r->pool))) {
        finish(r, false);
        return false;
    }
    bool ok = HZ_OK(r, tp_event_create(r->dev, &r->event)) && HZ_OK(r, tp_sim_advance(r->dev, r->cfg.start_ns));
    for (int i = 0; ok && i < r->cfg.streams; i++) {
        if (i == 0 && r->cfg.default_stream) {
            r->streams[i] = TP_STREAM_DEFAULT;
            continue;
        }
        ok = HZ_OK(r, tp_stream_create(r->dev, &r->streams[i]));
        r->stream_made[i] = ok;
    }
    if (ok && r->cfg.graphs) {
        ok = HZ_OK(r, tp_graph_cache_create(r->dev, &r->cfg.gc, &r->cache)) &&
             HZ_OK(r, tp_graph_cache_attach_pool(r->cache, r->pool));
    }
    bool every = r->cfg.pc.flags & TP_POOL_FLAG_CHECK_INVARIANTS;
    for (r->step = 0; ok && !r->failed && r->step < r->cfg.ops; r->step++) {
        const hz_op *op = pick_op(r);
        r->op = op->name;
        op->fn(r);
        r->totals->ops++;
        if (!r->failed) check_hazards(r);
        if (!r->failed && (every || r->step % 16 == 15)) check_pool(r);
    }
    finish(r, !r->failed);
    return !r->failed;
}

/* ------------------------------------------------------------ the groups */

static void run_group(int group) {
    bool sanitized = HZ_SANITIZED;
    unsigned long long seeds = env_ull("TP_HAZARD_SEEDS", sanitized ? 1500 : 3000);
    unsigned long long first = env_ull("TP_HAZARD_FIRST", 1);
    unsigned long long only = env_ull("TP_HAZARD_SEED", 0);
    unsigned long long ops_override = env_ull("TP_HAZARD_OPS", 0);
    bool trace = getenv("TP_HAZARD_TRACE") != NULL;
    unsigned long long shown = env_ull("TP_HAZARD_SHOW", 25);
    if (only) {
        first = only;
        seeds = 1;
    }
    static hz_run r; /* large: keep it off the stack */
    hz_totals totals;
    memset(&totals, 0, sizeof totals);
    unsigned long long failed = 0, first_failed = 0, graph_seeds = 0;
    for (unsigned long long seed = first; seed < first + seeds; seed++) {
        hz_config cfg;
        draw_config(seed, &cfg, ops_override);
        if (cfg.group != group) continue;
        memset(&r, 0, sizeof r);
        r.seed = seed;
        r.cfg = cfg;
        r.trace = trace;
        r.totals = &totals;
        totals.seeds++;
        graph_seeds += cfg.graphs;
        if (trace) {
            char desc[512];
            describe_config(&cfg, desc, sizeof desc);
            printf("  seed %llu: %s\n", seed, desc);
        }
        if (run_seed(&r)) continue;
        bool hazard = strstr(r.why, "hazard") != NULL;
        totals.hazard_seeds += hazard;
        if (failed++ == 0) first_failed = seed;
        if (failed <= shown || (hazard && totals.hazard_seeds <= shown)) {
            char desc[512];
            describe_config(&cfg, desc, sizeof desc);
            fprintf(stderr, "  %s seed %llu FAILED at %s\n      config: %s\n", group_names[group], seed, r.why, desc);
            if (r.log.first_hazard[0]) fprintf(stderr, "      first: %s\n", r.log.first_hazard);
        }
    }
    printf("  %s: %llu seeds (%llu with graphs), %llu ops: %llu allocs, %llu OOMs, %llu frees (%llu cross-stream), "
           "%llu kernels, %llu pins, %llu trims, %llu stream recycles; graph: %llu prepares (%llu eager), %llu "
           "launches (%llu missed), %llu evictions, %llu under pressure\n",
           group_names[group], totals.seeds, graph_seeds, totals.ops, totals.allocs, totals.ooms, totals.frees,
           totals.cross_frees, totals.kernels, totals.pins, totals.trims, totals.recycles, totals.prepares,
           totals.eager, totals.launches, totals.launch_misses, totals.evictions, totals.evictions_pressure);
    CHECK_MSG(failed == 0,
              "%s: %llu of %llu seeds failed (%llu with hazards); first failing seed %llu "
              "(rerun: TP_HAZARD_SEED=%llu TP_HAZARD_TRACE=1 test_hazards_random %s)",
              group_names[group], failed, totals.seeds, totals.hazard_seeds, first_failed, first_failed,
              group_names[group]);
    /* The generator must actually reach the interesting states. */
    if (!only && totals.seeds >= 100) {
        CHECK_GT_U64(totals.ooms, 0);
        CHECK_GT_U64(totals.cross_frees, 0);
        CHECK_GT_U64(totals.recycles, 0);
        CHECK_GT_U64(totals.launches, 0);
    }
}

static void vmm_wide(void) { run_group(G_VMM_WIDE); }
static void vmm_tight(void) { run_group(G_VMM_TIGHT); }
static void segment(void) { run_group(G_SEGMENT); }

/* ---------------------------------------------------------- F1 regression */

/* Finding F1, with every step legal: a 12 MiB VMM pool whose reservation
 * is its limit (six 2 MiB pages), six 2 MiB blocks, block 2 allocated on B
 * and block 4 on C, each touched by a 1-second kernel of its own stream
 * and freed there; blocks 1 and 3 freed on A. The only window for 8 MiB is
 * pages 1..4, blocked by B's pending free on page 2 and C's on page 4. The
 * pool may make A wait (for both), wait on the host, or say out of memory;
 * it must not hand the pages to A ordered after B alone. */
static void f1_regression(void) {
    test_log log = {0};
    tp_device_config dc = {.log = test_log_fn, .log_user = &log, .log_level = TP_LOG_WARN};
    tp_device *dev = NULL;
    REQUIRE_OK(tp_device_open("sim:64MiB", &dc, &dev));
    tp_pool_config pc = {.kind = TP_POOL_VMM,
                         .limit_bytes = 12 * TEST_MiB,
                         .va_reserve_bytes = 12 * TEST_MiB,
                         .flags = TP_POOL_FLAG_CHECK_INVARIANTS};
    tp_pool *pool = NULL;
    REQUIRE_OK(tp_pool_create(dev, &pc, &pool));
    tp_stream a, b, c;
    REQUIRE_OK(tp_stream_create(dev, &a));
    REQUIRE_OK(tp_stream_create(dev, &b));
    REQUIRE_OK(tp_stream_create(dev, &c));
    const uint64_t page = 2 * TEST_MiB;
    tp_stream owner[6] = {a, a, b, a, c, a};
    void *blk[6] = {0};
    for (int i = 0; i < 6; i++) REQUIRE_OK(tp_pool_alloc(pool, page, owner[i], &blk[i]));
    /* The scenario needs block i on page i. */
    uint64_t base = (uint64_t)(uintptr_t)blk[0];
    bool in_order = true;
    for (int i = 0; i < 6; i++) in_order &= (uint64_t)(uintptr_t)blk[i] == base + (uint64_t)i * page;
    CHECK_MSG(in_order, "blocks not laid out page after page: the scenario does not apply");
    tp_range r2 = {(uint64_t)(uintptr_t)blk[2], page}, r4 = {(uint64_t)(uintptr_t)blk[4], page};
    CHECK_OK(tp_sim_launch(dev, b, 1000 * HZ_MS, &r2, 1));
    CHECK_OK(tp_sim_launch(dev, c, 1000 * HZ_MS, &r4, 1));
    CHECK_OK(tp_pool_free(pool, blk[1], a));
    CHECK_OK(tp_pool_free(pool, blk[3], a));
    CHECK_OK(tp_pool_free(pool, blk[2], b));
    CHECK_OK(tp_pool_free(pool, blk[4], c));
    void *big = NULL;
    tp_status st = tp_pool_alloc(pool, 4 * page, a, &big);
    CHECK_MSG(st == TP_OK || st == TP_ERR_OUT_OF_MEMORY, "alloc of 8 MiB on A: %s", tp_status_name(st));
    tp_sim_counters cnt;
    memset(&cnt, 0, sizeof cnt);
    CHECK_OK(tp_sim_get_counters(dev, &cnt));
    CHECK_MSG(cnt.hazards == 0, "8 MiB on A (at 0x%llx, page %lld): %llu hazard(s): handout %llu unmap %llu free %llu",
              (unsigned long long)(uintptr_t)big, big ? (long long)(((uint64_t)(uintptr_t)big - base) / page) : -1ll,
              (unsigned long long)cnt.hazards, (unsigned long long)cnt.hazards_handout,
              (unsigned long long)cnt.hazards_unmap, (unsigned long long)cnt.hazards_free);
    if (st == TP_OK) {
        tp_range rb = {(uint64_t)(uintptr_t)big, 4 * page};
        CHECK_OK(tp_sim_launch(dev, a, HZ_MS, &rb, 1)); /* A writes its new block */
        CHECK_OK(tp_pool_free(pool, big, a));
    }
    CHECK_OK(tp_pool_free(pool, blk[0], a));
    CHECK_OK(tp_pool_free(pool, blk[5], a));
    char msg[256] = "";
    st = tp_pool_check(pool, msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "pool invariant: %s", msg);
    CHECK_OK(tp_pool_forget_stream(pool, b));
    CHECK_OK(tp_pool_forget_stream(pool, c));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(dev, a));
    CHECK_OK(tp_stream_destroy(dev, b));
    CHECK_OK(tp_stream_destroy(dev, c));
    memset(&cnt, 0, sizeof cnt);
    CHECK_OK(tp_sim_get_counters(dev, &cnt));
    CHECK_EQ_U64(cnt.physical_used_bytes, 0);
    CHECK_EQ_U64(cnt.invalid_accesses, 0);
    CHECK_EQ_I64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

/* Found by the random workloads (segment and VMM pools alike): the
 * simulated device's tp_stream_synchronize returns before the events the
 * stream was made to wait on have completed (it waits for the stream's own
 * kernels only), although a stream-wait-event is queued work of the stream
 * as on CUDA. The pool trusts the synchronisation in tp_pool_forget_stream
 * and in trim's waits, and a block freed on a stream after it waited for its
 * owner is handed out (or unmapped) while the owner's kernel still runs. */
static void sync_waits_regression(void) {
    test_log log = {0};
    tp_device_config dc = {.log = test_log_fn, .log_user = &log, .log_level = TP_LOG_WARN};
    tp_device *dev = NULL;
    REQUIRE_OK(tp_device_open("sim:256MiB", &dc, &dev));
    tp_event e;
    REQUIRE_OK(tp_event_create(dev, &e));

    /* The device alone: y waits on x's 5-second kernel; synchronising y
     * waits for it. */
    tp_stream x, y;
    REQUIRE_OK(tp_stream_create(dev, &x));
    REQUIRE_OK(tp_stream_create(dev, &y));
    CHECK_OK(tp_sim_launch(dev, x, 5000 * HZ_MS, NULL, 0));
    CHECK_OK(tp_event_record(dev, e, x));
    CHECK_OK(tp_stream_wait_event(dev, y, e));
    CHECK_OK(tp_stream_synchronize(dev, y));
    uint64_t now = 0;
    CHECK_OK(tp_sim_now(dev, &now));
    CHECK_GE_U64(now, 5000 * HZ_MS);
    CHECK_OK(tp_stream_synchronize(dev, x));
    CHECK_OK(tp_stream_destroy(dev, x));
    CHECK_OK(tp_stream_destroy(dev, y));

    /* Through the pool: a block of s, touched by a 1-second kernel on s,
     * freed on t after t waited for s; t forgotten and destroyed; the
     * block must not go to a new stream before s's kernel has completed. */
    tp_pool_config pc = {.kind = TP_POOL_SEGMENT, .limit_bytes = 64 * TEST_MiB, .flags = TP_POOL_FLAG_CHECK_INVARIANTS};
    tp_pool *pool = NULL;
    REQUIRE_OK(tp_pool_create(dev, &pc, &pool));
    tp_stream s, t, u;
    REQUIRE_OK(tp_stream_create(dev, &s));
    REQUIRE_OK(tp_stream_create(dev, &t));
    void *a = NULL, *b = NULL;
    REQUIRE_OK(tp_pool_alloc(pool, TEST_MiB, s, &a));
    tp_range ra = {(uint64_t)(uintptr_t)a, TEST_MiB};
    CHECK_OK(tp_sim_launch(dev, s, 1000 * HZ_MS, &ra, 1));
    CHECK_OK(tp_event_record(dev, e, s));
    CHECK_OK(tp_stream_wait_event(dev, t, e));
    CHECK_OK(tp_pool_free(pool, a, t));
    CHECK_OK(tp_pool_forget_stream(pool, t));
    CHECK_OK(tp_stream_destroy(dev, t));
    REQUIRE_OK(tp_stream_create(dev, &u));
    CHECK_OK(tp_pool_alloc(pool, TEST_MiB, u, &b));
    tp_sim_counters cnt;
    memset(&cnt, 0, sizeof cnt);
    CHECK_OK(tp_sim_get_counters(dev, &cnt));
    CHECK_MSG(cnt.hazards == 0, "%llu hazard(s) (handout %llu): the block went to u at t=%llu ns, while s's kernel runs",
              (unsigned long long)cnt.hazards, (unsigned long long)cnt.hazards_handout,
              (unsigned long long)cnt.now_ns);
    CHECK_OK(tp_pool_free(pool, b, u));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_stream_destroy(dev, u));
    CHECK_OK(tp_event_destroy(dev, e));
    memset(&cnt, 0, sizeof cnt);
    CHECK_OK(tp_sim_get_counters(dev, &cnt));
    CHECK_EQ_U64(cnt.physical_used_bytes, 0);
    CHECK_EQ_I64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

/* Found by the random workloads: with the virtual clock still at 0, a
 * block parked in the front cache's last-freed slot is released as idle
 * since 1 ns (front_cache.c: slot_freed_ns 0 stands for "unknown" and
 * becomes 1), later than "now"; the next page that goes idle at now = 0
 * lands behind it and the idle list is out of age order (tp_pool_check:
 * TP_ERR_CORRUPT). */
static void idle_order_regression(void) {
    test_log log = {0};
    tp_device_config dc = {.log = test_log_fn, .log_user = &log, .log_level = TP_LOG_WARN};
    tp_device *dev = NULL;
    REQUIRE_OK(tp_device_open("sim:256MiB", &dc, &dev));
    tp_pool_config pc = {.kind = TP_POOL_VMM, .limit_bytes = 64 * TEST_MiB};
    tp_pool *pool = NULL;
    REQUIRE_OK(tp_pool_create(dev, &pc, &pool));
    tp_stream s;
    REQUIRE_OK(tp_stream_create(dev, &s));
    void *a = NULL, *b = NULL, *c = NULL;
    REQUIRE_OK(tp_pool_alloc(pool, 4 * TEST_MiB, s, &a));
    REQUIRE_OK(tp_pool_alloc(pool, 2 * TEST_MiB, s, &b));
    CHECK_OK(tp_pool_free(pool, a, s));                     /* parked in the slot at t = 0 */
    REQUIRE_OK(tp_pool_alloc(pool, 6 * TEST_MiB, s, &c)); /* the slot goes back: a's pages idle */
    CHECK_OK(tp_pool_free(pool, b, s));                     /* b's page idle at t = 0 */
    char msg[256] = "";
    tp_status st = tp_pool_check(pool, msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "pool invariant: %s", msg);
    CHECK_OK(tp_pool_free(pool, c, s));
    CHECK_OK(tp_pool_forget_stream(pool, s));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(dev, s));
    tp_sim_counters cnt;
    memset(&cnt, 0, sizeof cnt);
    CHECK_OK(tp_sim_get_counters(dev, &cnt));
    CHECK_EQ_U64(cnt.physical_used_bytes, 0);
    CHECK_EQ_U64(cnt.hazards, 0);
    CHECK_EQ_I64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

static const test_case tests[] = {
    TEST_CASE(vmm_wide),
    TEST_CASE(vmm_tight),
    TEST_CASE(segment),
    TEST_CASE(f1_regression),
    TEST_CASE(sync_waits_regression),
    TEST_CASE(idle_order_regression),
};

int main(int argc, char **argv) { return TEST_MAIN("test_hazards_random", tests, argc, argv); }
