/* SPDX-License-Identifier: MIT */
/* Several threads share one pool (and one simulated device): each allocates
 * on its own stream, launches kernels, frees its own blocks and some handed
 * over by other threads (after ordering its stream behind the owner's with
 * an event), while another thread trims and reads statistics. Then the
 * lock-free hit path against everything else: statistics, the checker,
 * trim and tick while threads hit; streams forgotten (their slots reused)
 * while others hit; two threads freeing each other's blocks. Run under
 * ThreadSanitizer by CI. Invariants: no error, no hazard, consistent
 * statistics, nothing leaked. */
#include "check.h"
#include "fixture.h"
#include "pool_object.h" /* the pool's mutex, held by a test below */

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#define THREADS 4
#define OPS_PER_THREAD 4000
#define MAILBOX 64

typedef struct handoff {
    void *ptr;
    uint64_t bytes;
    tp_event ready; /* recorded on the owner's stream after its last use */
} handoff;

typedef struct shared {
    tp_device *dev;
    tp_pool *pool;
    pthread_mutex_t lock;
    handoff mailbox[MAILBOX];
    int mailbox_count;
    bool stop;
    int errors;
} shared;

typedef struct worker {
    shared *sh;
    int id;
    tp_stream stream;
} worker;

/* The pool's own invariant checker finds nothing wrong. */
static void expect_pool_consistent(tp_pool *pool) {
    char msg[256] = "";
    tp_status st = tp_pool_check(pool, msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "%s", msg);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    test_rng rng = {1000 + (unsigned long long)w->id};
    void *mine[32] = {0};
    uint64_t mine_bytes[32];
    for (int op = 0; op < OPS_PER_THREAD; op++) {
        int k = (int)rng_below(&rng, 32);
        unsigned roll = (unsigned)rng_below(&rng, 100);
        if (!mine[k]) {
            uint64_t bytes = rng_log_uniform(&rng, 256, 8 * TEST_MiB);
            if (tp_pool_alloc(sh->pool, bytes, w->stream, &mine[k]) != TP_OK) {
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
                continue;
            }
            mine_bytes[k] = bytes;
            tp_range r = {(uint64_t)(uintptr_t)mine[k], bytes};
            tp_sim_launch(sh->dev, w->stream, rng_below(&rng, 20000), &r, 1);
        } else if (roll < 20) {
            /* Hand the block to another thread. */
            tp_event ev;
            if (tp_event_create(sh->dev, &ev) != TP_OK || tp_event_record(sh->dev, ev, w->stream) != TP_OK) {
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
                continue;
            }
            pthread_mutex_lock(&sh->lock);
            if (sh->mailbox_count < MAILBOX) {
                sh->mailbox[sh->mailbox_count++] = (handoff){mine[k], mine_bytes[k], ev};
                mine[k] = NULL;
            }
            pthread_mutex_unlock(&sh->lock);
            if (mine[k]) tp_event_destroy(sh->dev, ev);
        } else {
            if (tp_pool_free(sh->pool, mine[k], w->stream) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            mine[k] = NULL;
        }
        /* Take over a block from another thread: order after its owner. */
        handoff h = {0};
        pthread_mutex_lock(&sh->lock);
        if (sh->mailbox_count && rng_below(&rng, 4) == 0) h = sh->mailbox[--sh->mailbox_count];
        pthread_mutex_unlock(&sh->lock);
        if (h.ptr) {
            tp_stream_wait_event(sh->dev, w->stream, h.ready);
            tp_range r = {(uint64_t)(uintptr_t)h.ptr, h.bytes};
            tp_sim_launch(sh->dev, w->stream, rng_below(&rng, 20000), &r, 1);
            if (tp_pool_free(sh->pool, h.ptr, w->stream) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            tp_event_destroy(sh->dev, h.ready);
        }
        if (op % 50 == 0) tp_sim_advance(sh->dev, 10000);
    }
    for (int k = 0; k < 32; k++)
        if (mine[k] && tp_pool_free(sh->pool, mine[k], w->stream) != TP_OK)
            __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
    return NULL;
}

static void *housekeeper_main(void *arg) {
    shared *sh = arg;
    while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        tp_pool_stats s;
        tp_pool_get_stats(sh->pool, &s);
        uint64_t released;
        tp_pool_trim(sh->pool, 64 * TEST_MiB, &released);
        tp_pool_tick(sh->pool);
        char json[2048];
        tp_pool_stats_json(sh->pool, json, sizeof json, NULL);
        sched_yield();
    }
    return NULL;
}

static void run(tp_pool_kind kind) {
    shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.lock, NULL);
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:8GiB" : "sim:8GiB,novmm", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = kind, .release_threshold_bytes = 32 * TEST_MiB};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    worker workers[THREADS];
    pthread_t threads[THREADS], housekeeper;
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){&sh, i, TP_STREAM_DEFAULT};
        REQUIRE(tp_stream_create(sh.dev, &workers[i].stream) == TP_OK);
    }
    pthread_create(&housekeeper, NULL, housekeeper_main, &sh);
    for (int i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker_main, &workers[i]);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    __atomic_store_n(&sh.stop, true, __ATOMIC_RELEASE);
    pthread_join(housekeeper, NULL);
    /* Blocks still in the mailbox: freed by their last user's stream. */
    for (int i = 0; i < sh.mailbox_count; i++) {
        CHECK_OK(tp_stream_wait_event(sh.dev, workers[0].stream, sh.mailbox[i].ready));
        CHECK_OK(tp_pool_free(sh.pool, sh.mailbox[i].ptr, workers[0].stream));
        CHECK_OK(tp_event_destroy(sh.dev, sh.mailbox[i].ready));
    }
    CHECK_EQ_U64(sh.errors, 0);
    expect_pool_consistent(sh.pool);
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(sh.pool, &s));
    CHECK_EQ_U64(s.allocated_bytes.current, 0);
    CHECK_EQ_U64(s.requested_bytes.current, 0);
    CHECK_EQ_U64(s.allocs, s.frees);
    CHECK_GT_U64(s.allocs, THREADS * OPS_PER_THREAD / 4);
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(sh.dev, &c));
    CHECK_MSG(c.hazards == 0, "%llu hazards", (unsigned long long)c.hazards);
    printf("  %s: %llu allocs by %d threads, %llu cross-stream waits, %llu events, 0 hazards\n",
           kind == TP_POOL_VMM ? "vmm" : "segment", (unsigned long long)s.allocs, THREADS,
           (unsigned long long)s.cross_stream_waits, (unsigned long long)s.events_recorded);
    for (int i = 0; i < THREADS; i++) CHECK_OK(tp_pool_forget_stream(sh.pool, workers[i].stream));
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_sim_get_counters(sh.dev, &c));
    CHECK_EQ_U64(c.physical_used_bytes, 0);
    for (int i = 0; i < THREADS; i++) CHECK_OK(tp_stream_destroy(sh.dev, workers[i].stream));
    CHECK_OK(tp_device_close(sh.dev));
    pthread_mutex_destroy(&sh.lock);
}

/* ------------------------------------------- captures beside other threads */

/* One thread captures graphs on its stream, between captures also running
 * work there eagerly; another allocates on its own stream over memory the
 * first freed (so the pool asks whether the capturer's frees are complete)
 * and trims. The pool is told of each capture before the stream starts
 * capturing (tp_pool_capture_begin's contract): it then never records or
 * queries an event on that stream, so no capture is invalidated. (Told
 * after, another thread that has just seen the stream not capturing can
 * record and query an event inside the capture; the window is narrow: the
 * ggml adapter's four-context test hit it about once in a hundred runs,
 * this one did not in a few thousand rounds.) */
typedef struct capture_shared {
    tp_device *dev;
    tp_pool *pool;
    tp_stream capturer, other;
    int started; /* the other thread is running */
    int done;
    int invalidated;
    int errors;
} capture_shared;

static void *capturer_main(void *arg) {
    capture_shared *sh = arg;
    while (!__atomic_load_n(&sh->started, __ATOMIC_ACQUIRE)) sched_yield();
    for (int round = 0; round < 400; round++) {
        void *p = NULL;
        /* Eager work first: frees whose completion others will ask about. */
        if (tp_pool_alloc(sh->pool, 3 * TEST_MiB, sh->capturer, &p) != TP_OK) sh->errors++;
        tp_range r = {(uint64_t)(uintptr_t)p, 3 * TEST_MiB};
        if (p && tp_sim_launch(sh->dev, sh->capturer, 50000, &r, 1) != TP_OK) sh->errors++;
        if (p && tp_pool_free(sh->pool, p, sh->capturer) != TP_OK) sh->errors++;
        if (tp_pool_capture_begin(sh->pool, sh->capturer) != TP_OK) sh->errors++;
        if (tp_sim_capture_begin(sh->dev, sh->capturer) != TP_OK) sh->errors++;
        for (int k = 0; k < 2; k++) {
            if (tp_pool_alloc(sh->pool, 2 * TEST_MiB, sh->capturer, &p) != TP_OK) {
                sh->errors++;
                continue;
            }
            r = (tp_range){(uint64_t)(uintptr_t)p, 2 * TEST_MiB};
            tp_sim_launch(sh->dev, sh->capturer, 20000, &r, 1); /* fails only in an invalidated capture */
            if (tp_pool_free(sh->pool, p, sh->capturer) != TP_OK) sh->errors++;
        }
        tp_graph g = NULL;
        if (tp_sim_capture_end(sh->dev, sh->capturer, &g) != TP_OK) sh->invalidated++;
        tp_range *ranges = NULL;
        size_t count = 0;
        if (tp_pool_capture_end(sh->pool, sh->capturer, &ranges, &count) != TP_OK) sh->errors++;
        for (size_t i = 0; i < count; i++)
            if (tp_pool_unpin(sh->pool, (void *)(uintptr_t)ranges[i].address, ranges[i].bytes) != TP_OK) sh->errors++;
        tp_pool_free_ranges(sh->pool, ranges);
        if (g) tp_sim_graph_destroy(sh->dev, g);
        tp_sim_advance(sh->dev, 10000);
    }
    __atomic_store_n(&sh->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void captures_beside_other_threads(tp_pool_kind kind) {
    capture_shared sh = {0};
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:8GiB" : "sim:8GiB,novmm", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = kind};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    REQUIRE(tp_stream_create(sh.dev, &sh.capturer) == TP_OK);
    REQUIRE(tp_stream_create(sh.dev, &sh.other) == TP_OK);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, capturer_main, &sh) == 0);
    unsigned rounds = 0;
    while (!__atomic_load_n(&sh.done, __ATOMIC_ACQUIRE)) {
        if (rounds == 1) __atomic_store_n(&sh.started, 1, __ATOMIC_RELEASE);
        void *p = NULL;
        uint64_t bytes = (1 + rounds % 5) * TEST_MiB;
        if (tp_pool_alloc(sh.pool, bytes, sh.other, &p) == TP_OK) {
            tp_range r = {(uint64_t)(uintptr_t)p, bytes};
            CHECK_OK(tp_sim_launch(sh.dev, sh.other, 30000, &r, 1));
            CHECK_OK(tp_pool_free(sh.pool, p, sh.other));
        }
        uint64_t released = 0;
        if (rounds % 4 == 0) tp_pool_trim(sh.pool, 0, &released); /* may meet the capture: not an error */
        rounds++;
    }
    pthread_join(t, NULL);
    CHECK_EQ_U64(sh.errors, 0);
    CHECK_MSG(sh.invalidated == 0, "%d of 400 captures invalidated by another thread's pool calls", sh.invalidated);
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(sh.dev, &c));
    CHECK_EQ_U64(c.hazards, 0);
    CHECK_EQ_U64(c.captures_invalidated, 0);
    printf("  %s: 400 captures beside %u rounds of another thread\n", kind == TP_POOL_VMM ? "vmm" : "segment", rounds);
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_stream_destroy(sh.dev, sh.capturer));
    CHECK_OK(tp_stream_destroy(sh.dev, sh.other));
    CHECK_OK(tp_device_close(sh.dev));
}
static void captures_beside_other_threads_vmm(void) { captures_beside_other_threads(TP_POOL_VMM); }
static void captures_beside_other_threads_segment(void) { captures_beside_other_threads(TP_POOL_SEGMENT); }

static void four_threads_share_a_vmm_pool(void) { run(TP_POOL_VMM); }
static void four_threads_share_a_segment_pool(void) { run(TP_POOL_SEGMENT); }

/* ------------------------------------------------ the lock-free hit path */

#define HIT_THREADS 3
#define HIT_LIVE 4
#define HIT_BYTES (4 * 1024ull)

typedef struct hit_shared {
    tp_device *dev;
    tp_pool *pool;
    int stop;
    int errors;
    int running; /* workers past their first round */
    unsigned long long pairs;
    uint64_t large_bytes; /* 0: HIT_BYTES only; else a large and a small temporary in turn */
} hit_shared;

typedef struct hit_worker {
    hit_shared *sh;
    tp_stream stream;
} hit_worker;

/* Keeps HIT_LIVE blocks of HIT_BYTES and frees and reallocates them on its
 * own stream: after the first round every call is a hit. */
static void *hitter_main(void *arg) {
    hit_worker *w = arg;
    hit_shared *sh = w->sh;
    void *live[HIT_LIVE] = {0};
    unsigned long long pairs = 0;
    while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        if (sh->large_bytes) { /* free a large block (the last-freed slot), then small ones from the bins */
            void *large = NULL, *small = NULL;
            if (tp_pool_alloc(sh->pool, sh->large_bytes, w->stream, &large) != TP_OK ||
                tp_pool_alloc(sh->pool, HIT_BYTES, w->stream, &small) != TP_OK ||
                tp_pool_free(sh->pool, large, w->stream) != TP_OK || tp_pool_free(sh->pool, small, w->stream) != TP_OK ||
                tp_pool_alloc(sh->pool, HIT_BYTES, w->stream, &small) != TP_OK ||
                tp_pool_free(sh->pool, small, w->stream) != TP_OK)
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            pairs += 3;
            if (pairs == 3) __atomic_add_fetch(&sh->running, 1, __ATOMIC_RELEASE);
            continue;
        }
        for (int k = 0; k < HIT_LIVE; k++) {
            if (live[k] && tp_pool_free(sh->pool, live[k], w->stream) != TP_OK)
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            live[k] = NULL;
            if (tp_pool_alloc(sh->pool, HIT_BYTES, w->stream, &live[k]) != TP_OK)
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            pairs++;
        }
        if (pairs == HIT_LIVE) __atomic_add_fetch(&sh->running, 1, __ATOMIC_RELEASE);
    }
    for (int k = 0; k < HIT_LIVE; k++)
        if (live[k] && tp_pool_free(sh->pool, live[k], w->stream) != TP_OK)
            __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&sh->pairs, pairs, __ATOMIC_RELAXED);
    return NULL;
}

static void hitters_start(hit_shared *sh, hit_worker *workers, pthread_t *threads, int n) {
    for (int i = 0; i < n; i++) {
        workers[i] = (hit_worker){sh, TP_STREAM_DEFAULT};
        REQUIRE(tp_stream_create(sh->dev, &workers[i].stream) == TP_OK);
        REQUIRE(pthread_create(&threads[i], NULL, hitter_main, &workers[i]) == 0);
    }
    /* Every worker hits before the test goes on: on a loaded machine the
     * main thread could otherwise finish before any worker has run. */
    while (__atomic_load_n(&sh->running, __ATOMIC_ACQUIRE) < n) sched_yield();
}

static void hitters_stop(hit_shared *sh, hit_worker *workers, pthread_t *threads, int n) {
    __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
    for (int i = 0; i < n; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < n; i++) {
        CHECK_OK(tp_pool_forget_stream(sh->pool, workers[i].stream));
        CHECK_OK(tp_stream_destroy(sh->dev, workers[i].stream));
    }
}

/* Stops the hitters, then: no errors, the pool's checker content, every
 * allocation freed, no hazard; the final statistics in *out. */
static void hitters_stop_and_check(hit_shared *sh, hit_worker *workers, pthread_t *threads, int n, tp_pool_stats *out) {
    hitters_stop(sh, workers, threads, n);
    CHECK_EQ_U64(sh->errors, 0);
    expect_pool_consistent(sh->pool);
    CHECK_OK(tp_pool_get_stats(sh->pool, out));
    CHECK_EQ_U64(out->allocs, out->frees);
    CHECK_EQ_U64(out->allocated_bytes.current, 0);
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(sh->dev, &c));
    CHECK_EQ_U64(c.hazards, 0);
}

/* The statistics, the checker, trim and tick while other threads hit:
 * every read sees one consistent pool (the world lock excludes hits and
 * folds their counts in), and trim and tick reach every stream's cache. */
static void stats_trim_and_check_while_threads_hit(tp_pool_kind kind) {
    hit_shared sh = {0};
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:8GiB" : "sim:8GiB,novmm", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = kind};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    hit_worker workers[HIT_THREADS];
    pthread_t threads[HIT_THREADS];
    hitters_start(&sh, workers, threads, HIT_THREADS);
    unsigned long long reads = 0, flushed_reads = 0;
    for (int round = 0; round < 300; round++) {
        tp_pool_stats s;
        CHECK_OK(tp_pool_get_stats(sh.pool, &s));
        /* Every block is HIT_BYTES: live bytes are the live count times it. */
        CHECK_GE_U64(s.allocs, s.frees);
        CHECK_LE_U64(s.allocs - s.frees, HIT_THREADS * HIT_LIVE);
        CHECK_EQ_U64(s.allocated_bytes.current, (s.allocs - s.frees) * HIT_BYTES);
        CHECK_EQ_U64(s.requested_bytes.current, s.allocated_bytes.current);
        CHECK_EQ_U64(s.allocated_bytes.total, s.allocs * HIT_BYTES);
        CHECK_EQ_U64(s.cached_bytes.total, s.frees * HIT_BYTES);
        CHECK_LE_U64(s.allocated_bytes.peak, HIT_THREADS * HIT_LIVE * HIT_BYTES);
        CHECK_GE_U64(s.allocated_bytes.peak, s.allocated_bytes.current);
        CHECK_EQ_U64(s.cached_bytes.current, s.reserved_bytes.current - s.allocated_bytes.current);
        CHECK_LE_U64(s.cache_hits, s.allocs);
        expect_pool_consistent(sh.pool);
        if (round % 3 == 0) {
            uint64_t released = 0;
            CHECK_OK(tp_pool_trim(sh.pool, 0, &released));
            /* The trim flushed every stream's cache: what is reserved now is
             * at most the pages under the blocks still live. */
            CHECK_OK(tp_pool_get_stats(sh.pool, &s));
            CHECK_LE_U64(s.reserved_bytes.current, HIT_THREADS * HIT_LIVE * 2 * TEST_MiB);
            flushed_reads++;
        }
        if (round % 7 == 0) CHECK_OK(tp_pool_tick(sh.pool));
        reads++;
        sched_yield();
    }
    tp_pool_stats s;
    hitters_stop_and_check(&sh, workers, threads, HIT_THREADS, &s);
    CHECK_EQ_U64(s.allocs, sh.pairs);
    CHECK_GT_U64(s.cache_hits, s.allocs / 2); /* mostly hits */
    printf("  %s: %llu pairs by %d threads, %llu consistent reads (%llu after a trim)\n",
           kind == TP_POOL_VMM ? "vmm" : "segment", (unsigned long long)s.allocs, HIT_THREADS, reads, flushed_reads);
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_device_close(sh.dev));
}

/* Threads each free a large block (above the VMM bins' bound: the pool's
 * one last-freed slot, filled by a hit's compare-exchange) and take small
 * ones from their bins while another stream's block is parked there, with
 * the checker, statistics and trim beside them: the slot changes hands
 * between streams without a lost or doubled block, and nothing is left. */
static void threads_share_the_last_freed_slot(void) {
    hit_shared sh = {.large_bytes = 256 * 1024};
    REQUIRE(tp_device_open("sim:8GiB", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = TP_POOL_VMM, .tcache_max_block_bytes = 64 * 1024};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    hit_worker workers[HIT_THREADS];
    pthread_t threads[HIT_THREADS];
    hitters_start(&sh, workers, threads, HIT_THREADS);
    for (int round = 0; round < 300; round++) {
        tp_pool_stats s;
        CHECK_OK(tp_pool_get_stats(sh.pool, &s));
        CHECK_GE_U64(s.allocs, s.frees);
        CHECK_LE_U64(s.allocs - s.frees, 2 * HIT_THREADS); /* a worker holds at most two */
        CHECK_LE_U64(s.allocated_bytes.current, HIT_THREADS * (sh.large_bytes + HIT_BYTES));
        expect_pool_consistent(sh.pool);
        if (round % 10 == 0) {
            uint64_t released = 0;
            CHECK_OK(tp_pool_trim(sh.pool, 0, &released));
        }
        sched_yield();
    }
    tp_pool_stats s;
    hitters_stop_and_check(&sh, workers, threads, HIT_THREADS, &s);
    CHECK_EQ_U64(s.allocs, sh.pairs);
    uint64_t released = 0;
    CHECK_OK(tp_pool_trim(sh.pool, 0, &released));
    CHECK_OK(tp_pool_get_stats(sh.pool, &s));
    CHECK_EQ_U64(s.reserved_bytes.current, 0); /* nothing parked or lost */
    printf("  %llu allocations by %d threads, large and small in turn\n", (unsigned long long)s.allocs, HIT_THREADS);
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_device_close(sh.dev));
}

/* Streams come and go (forgotten while their blocks are still live, the
 * slot then reused by a new stream) while other threads hit on theirs. */
static void forget_streams_while_threads_hit(tp_pool_kind kind) {
    hit_shared sh = {0};
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:8GiB" : "sim:8GiB,novmm", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = kind};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    hit_worker workers[2];
    pthread_t threads[2];
    hitters_start(&sh, workers, threads, 2);
    tp_stream keeper;
    REQUIRE(tp_stream_create(sh.dev, &keeper) == TP_OK);
    void *left_over[100] = {0};
    for (int round = 0; round < 100; round++) {
        tp_stream s;
        REQUIRE(tp_stream_create(sh.dev, &s) == TP_OK);
        void *a = NULL, *b = NULL, *c = NULL;
        CHECK_OK(tp_pool_alloc(sh.pool, 8 * 1024ull, s, &a));
        CHECK_OK(tp_pool_alloc(sh.pool, 8 * 1024ull, s, &b));
        CHECK_OK(tp_pool_free(sh.pool, a, s));
        CHECK_OK(tp_pool_alloc(sh.pool, 8 * 1024ull, s, &c)); /* a hit: a again */
        CHECK_EQ_PTR(a, c);
        tp_range r = {(uint64_t)(uintptr_t)b, 8 * 1024ull};
        tp_sim_launch(sh.dev, s, 5000, &r, 1);
        CHECK_OK(tp_pool_free(sh.pool, c, s));
        CHECK_OK(tp_pool_forget_stream(sh.pool, s)); /* b stays live */
        left_over[round] = b;
        /* A block of a forgotten stream, freed on another. */
        if (round % 2) {
            CHECK_OK(tp_pool_free(sh.pool, left_over[round - 1], keeper));
            left_over[round - 1] = NULL;
        }
        CHECK_OK(tp_stream_destroy(sh.dev, s));
    }
    for (int i = 0; i < 100; i++)
        if (left_over[i]) CHECK_OK(tp_pool_free(sh.pool, left_over[i], keeper));
    tp_pool_stats s;
    hitters_stop_and_check(&sh, workers, threads, 2, &s);
    CHECK_OK(tp_pool_forget_stream(sh.pool, keeper));
    CHECK_OK(tp_stream_destroy(sh.dev, keeper));
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_device_close(sh.dev));
}

/* Two threads, each on its own stream, free each other's blocks (a free on
 * another stream than the allocation's: the locked path) while hitting on
 * their own; the kernels that used a block are ordered before the free. */
typedef struct swap_shared {
    tp_device *dev;
    tp_pool *pool;
    tp_stream streams[2];
    pthread_mutex_t lock;
    handoff box[2][MAILBOX]; /* box[i]: blocks for thread i to free */
    int box_count[2];
    int errors;
} swap_shared;

typedef struct swap_worker {
    swap_shared *sh;
    int id;
} swap_worker;

static void *swapper_main(void *arg) {
    swap_worker *w = arg;
    swap_shared *sh = w->sh;
    tp_stream mine = sh->streams[w->id];
    test_rng rng = {77 + (unsigned long long)w->id};
    for (int op = 0; op < 3000; op++) {
        void *p = NULL;
        uint64_t bytes = 256 * (1 + rng_below(&rng, 64));
        if (tp_pool_alloc(sh->pool, bytes, mine, &p) != TP_OK) {
            __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            continue;
        }
        tp_range r = {(uint64_t)(uintptr_t)p, bytes};
        tp_sim_launch(sh->dev, mine, rng_below(&rng, 3000), &r, 1);
        if (rng_below(&rng, 2)) { /* ours: a hit next time */
            if (tp_pool_free(sh->pool, p, mine) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
        } else { /* the other thread's to free */
            tp_event ev;
            bool sent = false;
            if (tp_event_create(sh->dev, &ev) == TP_OK && tp_event_record(sh->dev, ev, mine) == TP_OK) {
                pthread_mutex_lock(&sh->lock);
                int other = 1 - w->id;
                if (sh->box_count[other] < MAILBOX) {
                    sh->box[other][sh->box_count[other]++] = (handoff){p, bytes, ev};
                    sent = true;
                }
                pthread_mutex_unlock(&sh->lock);
                if (!sent) tp_event_destroy(sh->dev, ev);
            }
            if (!sent && tp_pool_free(sh->pool, p, mine) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
        }
        handoff h = {0};
        pthread_mutex_lock(&sh->lock);
        if (sh->box_count[w->id]) h = sh->box[w->id][--sh->box_count[w->id]];
        pthread_mutex_unlock(&sh->lock);
        if (h.ptr) {
            tp_stream_wait_event(sh->dev, mine, h.ready);
            if (tp_pool_free(sh->pool, h.ptr, mine) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            tp_event_destroy(sh->dev, h.ready);
        }
        if (op % 100 == 0) tp_sim_advance(sh->dev, 2000);
    }
    return NULL;
}

static void two_threads_free_each_others_blocks(tp_pool_kind kind) {
    swap_shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.lock, NULL);
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:8GiB" : "sim:8GiB,novmm", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = kind};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    swap_worker workers[2];
    pthread_t threads[2];
    for (int i = 0; i < 2; i++) {
        REQUIRE(tp_stream_create(sh.dev, &sh.streams[i]) == TP_OK);
        workers[i] = (swap_worker){&sh, i};
    }
    for (int i = 0; i < 2; i++) pthread_create(&threads[i], NULL, swapper_main, &workers[i]);
    for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < sh.box_count[i]; k++) {
            CHECK_OK(tp_stream_wait_event(sh.dev, sh.streams[i], sh.box[i][k].ready));
            CHECK_OK(tp_pool_free(sh.pool, sh.box[i][k].ptr, sh.streams[i]));
            CHECK_OK(tp_event_destroy(sh.dev, sh.box[i][k].ready));
        }
    CHECK_EQ_U64(sh.errors, 0);
    expect_pool_consistent(sh.pool);
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(sh.pool, &s));
    CHECK_EQ_U64(s.allocs, 6000);
    CHECK_EQ_U64(s.frees, 6000);
    CHECK_EQ_U64(s.allocated_bytes.current, 0);
    CHECK_EQ_U64(s.requested_bytes.current, 0);
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(sh.dev, &c));
    CHECK_MSG(c.hazards == 0, "%llu hazards", (unsigned long long)c.hazards);
    for (int i = 0; i < 2; i++) {
        CHECK_OK(tp_pool_forget_stream(sh.pool, sh.streams[i]));
        CHECK_OK(tp_stream_destroy(sh.dev, sh.streams[i]));
    }
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_device_close(sh.dev));
    pthread_mutex_destroy(&sh.lock);
}

/* The simulated clock: tp_sim_advance moves it without the device lock
 * while no kernel is pending, beside calls that raise it under the lock
 * (a stream synchronize). No step may be lost and no thread may see it go
 * back: three threads advance it one nanosecond at a time while a fourth
 * synchronizes a stream over and over, which sets the clock to at least
 * the stream's end (a clock it read before), and now and then launches a
 * zero-length kernel (so the advances switch between the locked and the
 * lock-free path). */
#define CLOCK_STEPPERS 3
#define CLOCK_STEPS 100000

typedef struct clock_race {
    tp_device *dev;
    tp_stream stream;
    atomic_int steppers_left;
    int backwards, errors;
    pthread_mutex_t lock;
} clock_race;

static void *clock_stepper(void *arg) {
    clock_race *c = arg;
    uint64_t last = 0;
    int backwards = 0, errors = 0;
    for (int i = 0; i < CLOCK_STEPS; i++) {
        uint64_t now = 0;
        if (tp_sim_advance(c->dev, 1) != TP_OK || tp_sim_now(c->dev, &now) != TP_OK) errors++;
        if (now < last) backwards++;
        last = now;
    }
    atomic_fetch_sub(&c->steppers_left, 1);
    pthread_mutex_lock(&c->lock);
    c->backwards += backwards;
    c->errors += errors;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static void *clock_syncer(void *arg) {
    clock_race *c = arg;
    int errors = 0;
    for (unsigned i = 0; atomic_load(&c->steppers_left) > 0; i++) {
        if (i % 64 == 0 && tp_sim_launch(c->dev, c->stream, 0, NULL, 0) != TP_OK) errors++;
        if (tp_stream_synchronize(c->dev, c->stream) != TP_OK) errors++;
    }
    pthread_mutex_lock(&c->lock);
    c->errors += errors;
    pthread_mutex_unlock(&c->lock);
    return NULL;
}

static void the_simulated_clock_loses_no_step(void) {
    clock_race c = {0};
    REQUIRE(tp_device_open("sim:1GiB", NULL, &c.dev) == TP_OK);
    REQUIRE(tp_stream_create(c.dev, &c.stream) == TP_OK);
    pthread_mutex_init(&c.lock, NULL);
    atomic_init(&c.steppers_left, CLOCK_STEPPERS);
    uint64_t start = 0;
    CHECK_OK(tp_sim_now(c.dev, &start));
    pthread_t threads[CLOCK_STEPPERS + 1];
    for (int i = 0; i < CLOCK_STEPPERS; i++) REQUIRE(pthread_create(&threads[i], NULL, clock_stepper, &c) == 0);
    REQUIRE(pthread_create(&threads[CLOCK_STEPPERS], NULL, clock_syncer, &c) == 0);
    for (int i = 0; i <= CLOCK_STEPPERS; i++) pthread_join(threads[i], NULL);
    uint64_t end = 0;
    CHECK_OK(tp_sim_now(c.dev, &end));
    CHECK_EQ_U64(end - start, (uint64_t)CLOCK_STEPPERS * CLOCK_STEPS);
    CHECK_EQ_I64(c.backwards, 0);
    CHECK_EQ_I64(c.errors, 0);
    CHECK_OK(tp_stream_destroy(c.dev, c.stream));
    CHECK_OK(tp_device_close(c.dev));
    pthread_mutex_destroy(&c.lock);
}

/* The clock in two counters (sim_internal.h): the first thread that steps
 * it owns one, every other thread's steps and the host waits' raises go to
 * the other. Turn by turn, each move must land exactly: steps of both kinds
 * add up, a synchronize raises the sum to the kernel's end (not the shared
 * counter alone), and the sum saturates at 2^64 - 1 instead of wrapping. */
typedef struct clock_step {
    tp_device *dev;
    uint64_t ns;
    tp_status status;
} clock_step;

static void *clock_step_main(void *arg) {
    clock_step *step = arg;
    step->status = tp_sim_advance(step->dev, step->ns);
    return NULL;
}

/* One step by a thread of its own (never the clock's owner). */
static void step_on_another_thread(tp_device *dev, uint64_t ns) {
    clock_step step = {dev, ns, TP_ERR_INVALID_ARGUMENT};
    pthread_t thread;
    REQUIRE(pthread_create(&thread, NULL, clock_step_main, &step) == 0);
    pthread_join(thread, NULL);
    CHECK_OK(step.status);
}

static uint64_t sim_clock(tp_device *dev) {
    uint64_t now = 0;
    CHECK_OK(tp_sim_now(dev, &now));
    return now;
}

static void the_simulated_clock_adds_its_owners_and_the_others_steps(void) {
    tp_device *dev = NULL;
    tp_stream stream = NULL;
    REQUIRE(tp_device_open("sim:1GiB", NULL, &dev) == TP_OK);
    REQUIRE(tp_stream_create(dev, &stream) == TP_OK);
    uint64_t start = sim_clock(dev);
    CHECK_OK(tp_sim_advance(dev, 100)); /* this thread owns the clock from here */
    step_on_another_thread(dev, 50);
    CHECK_EQ_U64(sim_clock(dev) - start, 150);
    CHECK_OK(tp_sim_launch(dev, stream, 1000, NULL, 0));
    CHECK_OK(tp_stream_synchronize(dev, stream)); /* raised to the kernel's end */
    CHECK_EQ_U64(sim_clock(dev) - start, 1150);
    CHECK_OK(tp_stream_synchronize(dev, stream)); /* nothing left: no move */
    CHECK_EQ_U64(sim_clock(dev) - start, 1150);
    CHECK_OK(tp_sim_advance(dev, 10));
    step_on_another_thread(dev, 5);
    CHECK_EQ_U64(sim_clock(dev) - start, 1165);
    /* Saturation: the owner's counter at its top, the other's above 0. */
    CHECK_OK(tp_sim_advance(dev, UINT64_MAX));
    CHECK_EQ_U64(sim_clock(dev), UINT64_MAX);
    step_on_another_thread(dev, 1);
    CHECK_EQ_U64(sim_clock(dev), UINT64_MAX);
    CHECK_OK(tp_sim_advance(dev, 1));
    CHECK_EQ_U64(sim_clock(dev), UINT64_MAX);
    CHECK_OK(tp_stream_synchronize(dev, stream));
    CHECK_EQ_U64(sim_clock(dev), UINT64_MAX);
    CHECK_STATUS(tp_sim_launch(dev, stream, 1, NULL, 0), TP_ERR_INVALID_ARGUMENT); /* would end past 2^64 - 1 */
    CHECK_OK(tp_stream_destroy(dev, stream));
    CHECK_OK(tp_device_close(dev));
}

static void stats_trim_and_check_while_threads_hit_vmm(void) { stats_trim_and_check_while_threads_hit(TP_POOL_VMM); }
static void stats_trim_and_check_while_threads_hit_segment(void) { stats_trim_and_check_while_threads_hit(TP_POOL_SEGMENT); }
static void forget_streams_while_threads_hit_vmm(void) { forget_streams_while_threads_hit(TP_POOL_VMM); }
static void forget_streams_while_threads_hit_segment(void) { forget_streams_while_threads_hit(TP_POOL_SEGMENT); }
static void two_threads_free_each_others_blocks_vmm(void) { two_threads_free_each_others_blocks(TP_POOL_VMM); }
static void two_threads_free_each_others_blocks_segment(void) { two_threads_free_each_others_blocks(TP_POOL_SEGMENT); }

/* ------------------------------------- the last-freed block resized by a hit */

typedef struct held_alloc {
    tp_pool *pool;
    tp_stream stream;
    uint64_t bytes;
    void *ptr;
    void *to_free; /* not NULL: the call is the free of this block */
    tp_status status;
    atomic_int done;
} held_alloc;

static void *held_alloc_main(void *arg) {
    held_alloc *a = arg;
    a->status = a->to_free ? tp_pool_free(a->pool, a->to_free, a->stream)
                           : tp_pool_alloc(a->pool, a->bytes, a->stream, &a->ptr);
    atomic_store(&a->done, 1);
    return NULL;
}

/* Whether a's call (held_alloc_main), made on a thread of its own while
 * this thread holds the pool's mutex, finishes within wait_ms; the mutex
 * is then let go and the thread joined (*a says how it went). */
static bool calls_beside_the_held_mutex(held_alloc *a, int wait_ms) {
    tp_pool *pool = a->pool;
    pthread_t thread;
    pthread_mutex_lock(&pool->lock);
    if (pthread_create(&thread, NULL, held_alloc_main, a) != 0) {
        pthread_mutex_unlock(&pool->lock);
        REQUIRE(false);
    }
    for (int ms = 0; ms < wait_ms && !atomic_load(&a->done); ms++) {
        struct timespec pause = {0, 1000000};
        nanosleep(&pause, NULL);
    }
    bool finished = atomic_load(&a->done);
    pthread_mutex_unlock(&pool->lock);
    pthread_join(thread, NULL);
    return finished;
}

/* ... the allocation of `bytes` on `stream`. */
static bool allocates_beside_the_held_mutex(tp_pool *pool, tp_stream stream, uint64_t bytes, int wait_ms,
                                            held_alloc *a) {
    *a = (held_alloc){.pool = pool, .stream = stream, .bytes = bytes};
    return calls_beside_the_held_mutex(a, wait_ms);
}

/* ... the free of ptr. */
static bool frees_beside_the_held_mutex(tp_pool *pool, tp_stream stream, void *ptr, int wait_ms, held_alloc *a) {
    *a = (held_alloc){.pool = pool, .stream = stream, .to_free = ptr};
    return calls_beside_the_held_mutex(a, wait_ms);
}


/* The block in the last-freed slot, asked for again in another size on
 * the stream that freed it, is resized where it lies on the hit path: the
 * pool's mutex, held by this thread, does not stop it, smaller or larger,
 * with one stream on the pool or two. Another stream's large request waits
 * for the mutex: the slot is not its own, so its allocation is the locked
 * path's (which gives the slot's block back first). */
static void the_last_freed_block_is_resized_without_the_pool_lock(void) {
    fixture f; /* (no invariant check after every call: it would take the pool's mutex) */
    fixture_open_with(&f, "sim:8GiB", TP_POOL_VMM, NULL, false);
    tp_device *dev = f.dev;
    tp_pool *pool = f.pool;
    void *block = NULL;
    CHECK_OK(tp_pool_alloc(pool, 6 << 20, TP_STREAM_DEFAULT, &block));
    CHECK_OK(tp_pool_free(pool, block, TP_STREAM_DEFAULT));
    tp_stream other;
    REQUIRE(tp_stream_create(dev, &other) == TP_OK);
    const uint64_t sizes[] = {4 << 20, 5 << 20, 3 << 20, 4 << 20}; /* smaller, larger again, smaller, larger */
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        if (i == 2) {
            /* A second stream uses the pool from here on (its first
             * allocation, a locked one, gives the slot's block back: the
             * default stream parks one again). */
            void *theirs = NULL;
            CHECK_OK(tp_pool_alloc(pool, 4096, other, &theirs));
            CHECK_OK(tp_pool_free(pool, theirs, other));
            CHECK_OK(tp_pool_alloc(pool, 6 << 20, TP_STREAM_DEFAULT, &block));
            CHECK_OK(tp_pool_free(pool, block, TP_STREAM_DEFAULT));
        }
        held_alloc a;
        CHECK_MSG(allocates_beside_the_held_mutex(pool, TP_STREAM_DEFAULT, sizes[i], 2000, &a),
                  "the resize of %llu bytes waited for the pool's mutex", (unsigned long long)sizes[i]);
        CHECK_OK(a.status);
        CHECK_EQ_PTR(a.ptr, block); /* resized where it lies */
        CHECK_OK(tp_pool_free(pool, a.ptr, TP_STREAM_DEFAULT));
        expect_pool_consistent(pool);
    }
    held_alloc a;
    CHECK_FALSE(allocates_beside_the_held_mutex(pool, other, 4 << 20, 200, &a));
    CHECK_OK(a.status); /* (once the mutex was let go) */
    CHECK_OK(tp_pool_free(pool, a.ptr, other));
    expect_pool_consistent(pool);
    CHECK_OK(tp_pool_forget_stream(pool, other));
    CHECK_OK(tp_stream_destroy(dev, other));
    fixture_close(&f);
}

/* A pool that has only ever seen one stream: an allocation no parked block
 * serves (the bins' miss, or a large one the last-freed slot cannot serve)
 * is placed by the hit itself when it fits in memory already mapped; a
 * large free finding the slot taken gives the block there back and parks
 * itself; a small free the full bins cannot take goes back to the backing.
 * None of them waits for the pool's mutex (tpi_front_hit_alone). An
 * allocation that needs new device memory does, and so does the same
 * placement once a second stream has used the pool. */
static void a_lone_stream_places_and_gives_back_blocks_without_the_pool_lock(void) {
    fixture f;
    fixture_open_with(&f, "sim:8GiB", TP_POOL_VMM, NULL, false);
    tp_device *dev = f.dev;
    tp_pool *pool = f.pool;
    const tp_stream s = TP_STREAM_DEFAULT;
    void *a = NULL, *b = NULL, *c = NULL;
    CHECK_OK(tp_pool_alloc(pool, 16 << 20, s, &a));
    CHECK_OK(tp_pool_alloc(pool, 8 << 20, s, &b));
    CHECK_OK(tp_pool_alloc(pool, 32 << 20, s, &c));
    CHECK_OK(tp_pool_free(pool, c, s)); /* parked in the slot */
    held_alloc h;
    /* The slot taken (c): a's free gives c back (mapped, idle) and parks a. */
    CHECK_MSG(frees_beside_the_held_mutex(pool, s, a, 2000, &h), "the free over the slot's block waited for the mutex");
    CHECK_OK(h.status);
    expect_pool_consistent(pool);
    /* 24 MiB: a (16 MiB, b right after it) cannot be resized to it, so the
     * hit gives a back and places the request in c's idle memory. */
    CHECK_MSG(allocates_beside_the_held_mutex(pool, s, 24 << 20, 2000, &h), "the placement waited for the mutex");
    CHECK_OK(h.status);
    CHECK_EQ_PTR(h.ptr, c);
    void *placed = h.ptr;
    expect_pool_consistent(pool);
    /* Small blocks: bins empty for 8 KiB, so each allocation is placed;
     * the fifth free finds its bin full (TPI_FRONT_DEPTH 4) and gives the
     * block back. */
    void *small[16];
    for (int i = 0; i < 16; i++) CHECK_OK(tp_pool_alloc(pool, 4096, s, &small[i])); /* (the live map grows: a locked call) */
    for (int i = 0; i < 16; i++) CHECK_OK(tp_pool_free(pool, small[i], s));
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(allocates_beside_the_held_mutex(pool, s, 8192, 2000, &h), "small placement %d waited", i);
        CHECK_OK(h.status);
        small[i] = h.ptr;
    }
    for (int i = 0; i < 4; i++) CHECK_OK(tp_pool_free(pool, small[i], s));
    CHECK_MSG(frees_beside_the_held_mutex(pool, s, small[4], 2000, &h), "the give-back of a small block waited");
    CHECK_OK(h.status);
    expect_pool_consistent(pool);
    /* Nothing mapped fits 1 GiB: the locked path, after the mutex. */
    CHECK_FALSE(allocates_beside_the_held_mutex(pool, s, 1ull << 30, 200, &h));
    CHECK_OK(h.status);
    CHECK_OK(tp_pool_free(pool, h.ptr, s));
    CHECK_OK(tp_pool_free(pool, placed, s));
    expect_pool_consistent(pool);
    /* A second stream: the hit no longer places. */
    tp_stream other;
    REQUIRE(tp_stream_create(dev, &other) == TP_OK);
    void *theirs = NULL;
    CHECK_OK(tp_pool_alloc(pool, 4096, other, &theirs));
    CHECK_OK(tp_pool_free(pool, theirs, other));
    CHECK_FALSE(allocates_beside_the_held_mutex(pool, s, 40 << 20, 200, &h));
    CHECK_OK(h.status);
    CHECK_OK(tp_pool_free(pool, h.ptr, s));
    CHECK_OK(tp_pool_free(pool, b, s));
    expect_pool_consistent(pool);
    CHECK_OK(tp_pool_forget_stream(pool, other));
    CHECK_OK(tp_stream_destroy(dev, other));
    fixture_close(&f);
}

#define RESIZERS 3

typedef struct resizer {
    tp_pool *pool;
    tp_stream stream;
    atomic_int *stop;
    unsigned long long seed;
    int errors;
    unsigned long long pairs;
} resizer;

/* Large temporaries of changing sizes on its own stream, one at a time,
 * with a small one between (the bins' hit, which leaves the slot alone):
 * whenever the pool's one last-freed slot holds this stream's block, the
 * next large one resizes it in place on the hit path if it can. */
static void *resizer_main(void *arg) {
    resizer *r = arg;
    uint64_t state = r->seed;
    while (!atomic_load(r->stop)) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        uint64_t large = (128 << 10) + ((state >> 33) % (16 << 20));
        void *p = NULL, *q = NULL;
        if (tp_pool_alloc(r->pool, large, r->stream, &p) != TP_OK ||
            tp_pool_alloc(r->pool, 4096, r->stream, &q) != TP_OK || tp_pool_free(r->pool, p, r->stream) != TP_OK ||
            tp_pool_free(r->pool, q, r->stream) != TP_OK)
            r->errors++;
        r->pairs += 2;
    }
    return NULL;
}

/* One stream, then three, resizing their last-freed blocks against
 * everything that takes the world lock -- statistics, the checker, trim
 * and tick -- on this thread (under ThreadSanitizer in CI): no error, the
 * checker content, nothing left once the streams stop. */
static void resizes_beside_stats_check_trim_and_tick(int streams) {
    fixture f;
    fixture_open_with(&f, "sim:8GiB", TP_POOL_VMM, NULL, false);
    tp_device *dev = f.dev;
    tp_pool *pool = f.pool;
    atomic_int stop = 0;
    resizer r[RESIZERS];
    pthread_t threads[RESIZERS];
    for (int i = 0; i < streams; i++) {
        r[i] = (resizer){.pool = pool, .stream = TP_STREAM_DEFAULT, .stop = &stop, .seed = 12345 + (unsigned)i};
        if (i) REQUIRE(tp_stream_create(dev, &r[i].stream) == TP_OK);
        REQUIRE(pthread_create(&threads[i], NULL, resizer_main, &r[i]) == 0);
    }
    for (int round = 0; round < 400; round++) {
        tp_pool_stats s;
        CHECK_OK(tp_pool_get_stats(pool, &s));
        CHECK_LE_U64(s.allocs - s.frees, 2 * (uint64_t)streams);
        CHECK_LE_U64(s.allocated_bytes.current, (uint64_t)streams * ((128 << 10) + (16 << 20) + 4096));
        expect_pool_consistent(pool);
        if (round % 8 == 0) {
            uint64_t released = 0;
            CHECK_OK(tp_pool_trim(pool, 0, &released));
        }
        if (round % 8 == 4) CHECK_OK(tp_pool_tick(pool));
        sched_yield();
    }
    atomic_store(&stop, 1);
    unsigned long long pairs = 0;
    for (int i = 0; i < streams; i++) {
        pthread_join(threads[i], NULL);
        CHECK_EQ_I64(r[i].errors, 0);
        pairs += r[i].pairs;
    }
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(pool, &s));
    CHECK_EQ_U64(s.allocs, pairs);
    CHECK_EQ_U64(s.allocated_bytes.current, 0);
    CHECK_EQ_U64(s.hazards, 0);
    uint64_t released = 0;
    CHECK_OK(tp_pool_trim(pool, 0, &released));
    CHECK_OK(tp_pool_get_stats(pool, &s));
    CHECK_EQ_U64(s.reserved_bytes.current, 0);
    printf("  %d stream%s: %llu allocations, large ones of changing sizes\n", streams, streams == 1 ? "" : "s",
           (unsigned long long)s.allocs);
    for (int i = 1; i < streams; i++) {
        CHECK_OK(tp_pool_forget_stream(pool, r[i].stream));
        CHECK_OK(tp_stream_destroy(dev, r[i].stream));
    }
    fixture_close(&f);
}

static void one_stream_resizes_beside_stats_check_trim_and_tick(void) {
    resizes_beside_stats_check_trim_and_tick(1);
}
static void three_streams_resize_beside_stats_check_trim_and_tick(void) {
    resizes_beside_stats_check_trim_and_tick(RESIZERS);
}

static const test_case tests[] = {
    TEST_CASE(four_threads_share_a_vmm_pool),
    TEST_CASE(four_threads_share_a_segment_pool),
    TEST_CASE(stats_trim_and_check_while_threads_hit_vmm),
    TEST_CASE(stats_trim_and_check_while_threads_hit_segment),
    TEST_CASE(forget_streams_while_threads_hit_vmm),
    TEST_CASE(forget_streams_while_threads_hit_segment),
    TEST_CASE(two_threads_free_each_others_blocks_vmm),
    TEST_CASE(two_threads_free_each_others_blocks_segment),
    TEST_CASE(captures_beside_other_threads_vmm),
    TEST_CASE(captures_beside_other_threads_segment),
    TEST_CASE(the_simulated_clock_loses_no_step),
    TEST_CASE(the_simulated_clock_adds_its_owners_and_the_others_steps),
    TEST_CASE(threads_share_the_last_freed_slot),
    TEST_CASE(the_last_freed_block_is_resized_without_the_pool_lock),
    TEST_CASE(a_lone_stream_places_and_gives_back_blocks_without_the_pool_lock),
    TEST_CASE(one_stream_resizes_beside_stats_check_trim_and_tick),
    TEST_CASE(three_streams_resize_beside_stats_check_trim_and_tick),
};

int main(int argc, char **argv) { return TEST_MAIN("test_threads", tests, argc, argv); }
