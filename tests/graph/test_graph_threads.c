/* SPDX-License-Identifier: MIT */
/*
 * test_graph_threads.c -- several threads preparing, launching, evicting and
 * ticking one graph cache while another advances the virtual clock, another
 * allocates from an attached pool hard enough to run the reclaim callback,
 * and the background thread ticks. Run under ThreadSanitizer too: the lock
 * order cache -> pool -> device must hold with reclaim callbacks calling
 * back into the cache from inside a pool allocation.
 *
 * Templates are re-created for every prepare and destroyed right after, so
 * handles get reused: a cache that skipped the update on a reused handle
 * would launch kernels on memory whose pins it had already let go, which
 * the simulator reports as invalid accesses or hazards.
 */
#include "gc_test.h"

#include <pthread.h>
#include <stdatomic.h>
#include <time.h>

#define WORKERS 4
#define ITERATIONS 3000
#define KEYS 24

typedef struct shared {
    tp_device *dev;
    tp_pool *pool;
    tp_graph_cache *cache;
    atomic_int done_workers;
    atomic_ullong launches_ok;
    atomic_ullong runs_ok;
    atomic_ullong eager;
    atomic_ullong errors;
} shared;

typedef struct worker {
    shared *sh;
    int id;
    tp_stream stream;
} worker;

static atomic_int log_warnings, log_errors;

static void mt_log(void *user, tp_log_level level, const char *message) {
    (void)user;
    (void)message;
    if (level >= TP_LOG_WARN) atomic_fetch_add(&log_warnings, 1);
    if (level >= TP_LOG_ERROR) atomic_fetch_add(&log_errors, 1);
}

static void nap_us(long us) {
    struct timespec ts = {0, us * 1000L};
    nanosleep(&ts, NULL);
}

static void *worker_main(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    test_rng rng = {(unsigned long long)w->id * 977 + 3};
    for (int i = 0; i < ITERATIONS; i++) {
        uint64_t key = rng_below(&rng, KEYS);
        unsigned op = (unsigned)rng_below(&rng, 10);
        if (op < 4) { /* run with a fresh temporary, pinned by the cache */
            void *p = NULL;
            size_t bytes = (size_t)(1 + rng_below(&rng, 4)) * TEST_MiB;
            if (tp_pool_alloc(sh->pool, bytes, w->stream, &p) != TP_OK) continue;
            tp_range r = {(uint64_t)(uintptr_t)p, bytes};
            /* topology by key (two per key), so the same key from several
             * threads mostly updates in place */
            uint32_t variant = (uint32_t)rng_below(&rng, 2);
            tp_graph g = gt_graph_ranges(sh->dev, (uint32_t)(20 + key * 2 + variant), key * 2 + variant,
                                         (1 + rng_below(&rng, 20)) * MS, &r, 1);
            tp_graph_pins pins = {sh->pool, &r, 1, false};
            tp_status st = tp_graph_cache_run(sh->cache, key, g, &pins, w->stream);
            /* NOT_FOUND: another thread evicted the key between
             * this thread's prepare and launch */
            if (st == TP_OK) atomic_fetch_add(&sh->runs_ok, 1);
            else if (st == TP_ERR_RUN_EAGER) atomic_fetch_add(&sh->eager, 1);
            else if (st != TP_ERR_NOT_FOUND) atomic_fetch_add(&sh->errors, 1);
            tp_pool_free(sh->pool, p, w->stream);
            tp_sim_graph_destroy(sh->dev, g);
        } else if (op < 8) {
            tp_status st = tp_graph_cache_launch(sh->cache, key, w->stream);
            if (st == TP_OK) atomic_fetch_add(&sh->launches_ok, 1);
            else if (st != TP_ERR_NOT_FOUND) atomic_fetch_add(&sh->errors, 1);
        } else if (op == 8) {
            if (rng_below(&rng, 2)) tp_graph_cache_evict(sh->cache, key);
            else tp_graph_cache_tick(sh->cache);
        } else {
            tp_graph_cache_stats s;
            char buf[1024];
            if (tp_graph_cache_get_stats(sh->cache, &s) != TP_OK) atomic_fetch_add(&sh->errors, 1);
            if (s.execs > 16) atomic_fetch_add(&sh->errors, 1);
            if (tp_graph_cache_stats_json(sh->cache, buf, sizeof buf, NULL) != TP_OK) atomic_fetch_add(&sh->errors, 1);
        }
    }
    atomic_fetch_add(&sh->done_workers, 1);
    return NULL;
}

/* Big allocations against the pool's limit: the ladder ends in the cache's
 * reclaim callback, called with the pool lock released. */
static void *pressure_main(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    while (atomic_load(&sh->done_workers) < WORKERS) {
        void *p = NULL;
        if (tp_pool_alloc(sh->pool, 100 * TEST_MiB, w->stream, &p) == TP_OK) tp_pool_free(sh->pool, p, w->stream);
        nap_us(500);
    }
    return NULL;
}

/* Virtual time moves 1 ms per ~50 us of wall time. */
static void *clock_main(void *arg) {
    shared *sh = arg;
    while (atomic_load(&sh->done_workers) < WORKERS) {
        tp_sim_advance(sh->dev, MS);
        nap_us(50);
    }
    return NULL;
}

static void test_threads_share_one_cache(void) {
    tp_device_config cfg = {.log = mt_log};
    tp_device *dev = NULL;
    REQUIRE(tp_device_open("sim:8GiB", &cfg, &dev) == TP_OK);
    tp_pool_config pc = {.limit_bytes = 128 * TEST_MiB};
    tp_pool *pool = NULL;
    REQUIRE(tp_pool_create(dev, &pc, &pool) == TP_OK);
    tp_graph_cache_config gc = {.max_execs = 16, .max_bytes = 6 * TEST_MiB, .idle_evict_ns = 100 * MS,
                                .background_thread = true, .tick_interval_ns = MS};
    tp_graph_cache *cache = NULL;
    REQUIRE(tp_graph_cache_create(dev, &gc, &cache) == TP_OK);
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool));

    shared sh = {.dev = dev, .pool = pool, .cache = cache};
    worker workers[WORKERS + 1];
    pthread_t threads[WORKERS + 2];
    for (int i = 0; i <= WORKERS; i++) {
        workers[i] = (worker){.sh = &sh, .id = i};
        REQUIRE(tp_stream_create(dev, &workers[i].stream) == TP_OK);
    }
    for (int i = 0; i < WORKERS; i++) REQUIRE(pthread_create(&threads[i], NULL, worker_main, &workers[i]) == 0);
    REQUIRE(pthread_create(&threads[WORKERS], NULL, pressure_main, &workers[WORKERS]) == 0);
    REQUIRE(pthread_create(&threads[WORKERS + 1], NULL, clock_main, &sh) == 0);
    for (int i = 0; i < WORKERS + 2; i++) pthread_join(threads[i], NULL);

    CHECK_CACHE(cache);
    CHECK_POOL(pool);
    tp_graph_cache_stats st = gt_stats(cache);
    unsigned long long runs = atomic_load(&sh.runs_ok), launches = atomic_load(&sh.launches_ok);
    CHECK_MSG(atomic_load(&sh.errors) == 0, "%llu unexpected statuses", (unsigned long long)atomic_load(&sh.errors));
    CHECK_EQ_U64(st.launches, runs + launches);
    CHECK_GE_U64(st.hits + st.updates + st.instantiations, runs);
    CHECK_LE_U64(st.execs, 16);
    CHECK_LE_U64(st.exec_bytes, 6 * TEST_MiB);
    CHECK_EQ_U64(st.execs, gt_sim_execs(dev));
    CHECK_GT_U64(runs, WORKERS * ITERATIONS / 5);
    CHECK_GT_U64(launches, WORKERS * ITERATIONS / 10);
    CHECK_GT_U64(st.hits + st.updates, runs / 10);
    printf("threads: %llu runs, %llu launches, %llu eager; hits %llu, updates %llu, instantiations %llu; "
           "evictions: count %llu bytes %llu idle %llu pressure %llu explicit %llu; pool reclaim calls %llu\n",
           runs, launches, (unsigned long long)atomic_load(&sh.eager), (unsigned long long)st.hits,
           (unsigned long long)st.updates, (unsigned long long)st.instantiations,
           (unsigned long long)st.evictions_count, (unsigned long long)st.evictions_bytes,
           (unsigned long long)st.evictions_idle, (unsigned long long)st.evictions_pressure,
           (unsigned long long)st.evictions_explicit, (unsigned long long)gt_pool_stats(pool).reclaim_calls);
    CHECK_GT_U64(st.evictions_idle, 0);
    CHECK_GT_U64(gt_pool_stats(pool).reclaim_calls, 0);

    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    tp_sim_counters c = gt_counters(dev);
    CHECK_MSG(c.hazards == 0 && c.invalid_accesses == 0, "hazards %llu invalid accesses %llu",
              (unsigned long long)c.hazards, (unsigned long long)c.invalid_accesses);
    CHECK_EQ_U64(atomic_load(&log_errors), 0);
    for (int i = 0; i <= WORKERS; i++) CHECK_OK(tp_pool_forget_stream(pool, workers[i].stream));
    CHECK_OK(tp_pool_destroy(pool));
    for (int i = 0; i <= WORKERS; i++) CHECK_OK(tp_stream_destroy(dev, workers[i].stream));
    CHECK_OK(tp_device_close(dev));
}

static const test_case tests[] = {
    TEST_CASE(test_threads_share_one_cache),
};

int main(int argc, char **argv) { return TEST_MAIN("test_graph_threads", tests, argc, argv); }
