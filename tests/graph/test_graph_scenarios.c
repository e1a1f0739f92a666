/* SPDX-License-Identifier: MIT */
/*
 * test_graph_scenarios.c -- failure modes 4, 7, 8, 9 and 10 (docs/failure-modes.md) for the
 * graph cache, on the simulated device:
 *   4  reclaim vs captured graphs (pins transferred from a capture; a pool
 *      flush cannot free memory a live executable uses; eviction releases it)
 *   7  key churn (hot keys replayed at 20 Hz, a new ~25 MB executable every
 *      2 s, bursts of 100 new keys): bytes within the cap, hot keys kept
 *   8  idle retention: an hour with no compute call empties the cache, via
 *      tick and via the background thread
 *   9  instantiate out of memory: LRU (idle first) eviction and retry, then
 *      TP_ERR_RUN_EAGER
 *  10  key aliasing: one key alternating topologies re-instantiates a
 *      bounded number of times and updates in place otherwise
 */
#include "gc_test.h"

#include <time.h>

static tp_graph_cache *make_cache(tp_device *dev, tp_graph_cache_config cfg) {
    tp_graph_cache *cache = NULL;
    tp_status st = tp_graph_cache_create(dev, &cfg, &cache);
    REQUIRE(st == TP_OK && cache);
    return cache;
}

static void sleep_ms(unsigned ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* ------------------------------------------------------------ mode 4 */

/* Captures a graph whose kernels use a 64 MiB temporary; the ranges come
 * back pinned and are handed to the cache. The caller frees the temporary
 * afterwards, as a capture-and-replay runtime does. */
static tp_graph capture_with_temporary(tp_device *dev, tp_pool *pool, tp_graph_cache *cache, uint64_t key,
                                       tp_stream s, uint64_t duration_ns) {
    CHECK_OK(tp_pool_capture_begin(pool, s));
    void *tmp = NULL;
    CHECK_OK(tp_pool_alloc(pool, 64 * TEST_MiB, s, &tmp));
    REQUIRE(tmp);
    tp_range *ranges = NULL;
    size_t count = 0;
    CHECK_OK(tp_pool_capture_end(pool, s, &ranges, &count));
    CHECK_EQ_U64(count, 1);
    CHECK_NE_PTR(ranges, NULL);
    if (count == 1 && ranges) CHECK_EQ_U64(ranges[0].address, (uint64_t)(uintptr_t)tmp);
    tp_graph g = gt_graph_ranges(dev, 50, 4, duration_ns, ranges, count);
    tp_graph_pins pins = {pool, ranges, count, true};
    CHECK_OK(tp_graph_cache_prepare(cache, key, g, &pins));
    tp_pool_free_ranges(pool, ranges);
    CHECK_OK(tp_pool_free(pool, tmp, s));
    return g;
}

static void test_mode4_reclaim_vs_captured_graphs(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB", &log);
    tp_pool *pool = NULL;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.idle_evict_ns = TP_NS_NEVER});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));

    /* Part 1: the cache is not attached. A flush cannot touch the pinned
     * temporary, so replays never read freed memory. */
    tp_graph g = capture_with_temporary(dev, pool, cache, 1, s, 20 * MS);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 64 * TEST_MiB);
    CHECK_OK(tp_graph_cache_launch(cache, 1, s));
    CHECK_OK(tp_pool_trim(pool, 0, NULL));
    tp_pool_stats ps = gt_pool_stats(pool);
    CHECK_GE_U64(ps.reserved_bytes.current, 64 * TEST_MiB);
    CHECK_EQ_U64(ps.pinned_bytes.current, 64 * TEST_MiB);
    void *big = NULL;
    CHECK_STATUS(tp_pool_alloc(pool, 1000 * TEST_MiB, s, &big), TP_ERR_OUT_OF_MEMORY);
    CHECK_GT_U64(gt_pool_stats(pool).oom_retries, 0); /* the ladder ran */
    for (int i = 0; i < 3; i++) CHECK_OK(tp_graph_cache_launch(cache, 1, s));
    tp_sim_counters c = gt_counters(dev);
    CHECK_MSG(c.invalid_accesses == 0 && c.hazards == 0, "replay after flush: invalid %llu hazards %llu",
              (unsigned long long)c.invalid_accesses, (unsigned long long)c.hazards);
    /* Eviction releases the memory once the queued replays are done. */
    CHECK_OK(tp_graph_cache_evict(cache, 1));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 64 * TEST_MiB); /* 4 x 20 ms still queued */
    CHECK_OK(tp_sim_advance(dev, 100 * MS));
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_OK(tp_pool_trim(pool, 0, NULL));
    CHECK_EQ_U64(gt_pool_stats(pool).reserved_bytes.current, 0);
    CHECK_OK(tp_pool_alloc(pool, 1000 * TEST_MiB, s, &big));
    CHECK_OK(tp_pool_free(pool, big, s));
    CHECK_OK(tp_pool_trim(pool, 0, NULL));

    /* Part 2: attached. The out-of-memory ladder's reclaim step evicts the
     * executable, waits for its pending 300 ms replay and only then unpins:
     * the allocation succeeds with no hazard. */
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool));
    tp_graph g2 = capture_with_temporary(dev, pool, cache, 2, s, 300 * MS);
    /* replayed on a stream the pool has never seen: its own ladder
     * (which synchronises streams with pending frees) cannot wait for it */
    tp_stream replay;
    CHECK_OK(tp_stream_create(dev, &replay));
    uint64_t t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_launch(cache, 2, replay));
    uint64_t reclaims = gt_pool_stats(pool).reclaim_calls;
    CHECK_OK(tp_pool_alloc(pool, 1000 * TEST_MiB, s, &big));
    CHECK_GT_U64(gt_pool_stats(pool).reclaim_calls, reclaims);
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.evictions_pressure, 1);
    CHECK_EQ_U64(st.execs, 0);
    CHECK_EQ_U64(st.pinned_ranges, 0);
    CHECK_GE_U64(gt_now(dev), t0 + 300 * MS); /* waited for the replay */
    CHECK_STATUS(tp_graph_cache_launch(cache, 2, replay), TP_ERR_NOT_FOUND);
    c = gt_counters(dev);
    CHECK_MSG(c.invalid_accesses == 0 && c.hazards == 0, "reclaim: invalid %llu hazards %llu (unmap %llu handout %llu)",
              (unsigned long long)c.invalid_accesses, (unsigned long long)c.hazards,
              (unsigned long long)c.hazards_unmap, (unsigned long long)c.hazards_handout);
    CHECK_OK(tp_pool_free(pool, big, s));
    CHECK_POOL(pool);
    CHECK_CACHE(cache);
    printf("mode 4: flush kept the 64 MiB temporary pinned (replays: 0 invalid accesses, 0 hazards); "
           "reclaim evicted after waiting %.0f ms\n", (double)(gt_now(dev) - t0) / 1e6);

    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_pool_forget_stream(pool, s));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_sim_graph_destroy(dev, g2));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_stream_destroy(dev, replay));
    CHECK_OK(tp_device_close(dev));
}

/* ------------------------------------------------------------ mode 7 */

typedef struct churn_result {
    uint64_t peak_after_call; /* most executable bytes the device held between calls */
    uint64_t new_keys;
    uint64_t hot_launches;
    tp_graph_cache_stats stats;
} churn_result;

static churn_result run_churn(uint64_t idle_evict_ns, uint64_t requests) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:16GiB", &log); /* 10 KiB per node */
    const uint64_t cap = 256 * TEST_MiB;
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.max_bytes = cap, .idle_evict_ns = idle_evict_ns});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    tp_graph hot = gt_graph(dev, 200, 1, 5 * MS);       /* ~2 MB */
    tp_graph churn = gt_graph(dev, 2500, 2, 30 * MS);   /* 25.6 MB */
    tp_graph burst[4] = {gt_graph(dev, 60, 3, MS), gt_graph(dev, 400, 4, MS), gt_graph(dev, 1200, 5, MS),
                         gt_graph(dev, 2400, 6, MS)};
    churn_result r = {0};
    test_rng rng = {7};
    uint64_t next_key = 1000;
    for (uint64_t k = 0; k < 10; k++) CHECK_OK(tp_graph_cache_run(cache, k, hot, NULL, s));
    uint64_t hot_failures = 0;
    for (uint64_t step = 0; r.new_keys < requests; step++) {
        /* 20 Hz replay of the hot keys; once a second through run() */
        for (uint64_t k = 0; k < 10; k++) {
            tp_status st = step % 20 == 0 ? tp_graph_cache_run(cache, k, hot, NULL, s) : tp_graph_cache_launch(cache, k, s);
            if (st != TP_OK) hot_failures++;
            r.hot_launches++;
        }
        if (step % 40 == 0) { /* every 2 s a new ~25 MB executable */
            CHECK_OK(tp_graph_cache_run(cache, next_key++, churn, NULL, s));
            r.new_keys++;
            if (r.new_keys % 100 == 0) { /* and now and then a burst of 100 new keys */
                for (int i = 0; i < 100; i++) {
                    CHECK_OK(tp_graph_cache_run(cache, next_key++, burst[rng_below(&rng, 4)], NULL, s));
                    uint64_t b = gt_sim_exec_bytes(dev);
                    CHECK_LE_U64(b, cap);
                    if (b > r.peak_after_call) r.peak_after_call = b;
                }
            }
            uint64_t b = gt_sim_exec_bytes(dev);
            CHECK_MSG(b <= cap, "executables hold %llu bytes, cap %llu", (unsigned long long)b, (unsigned long long)cap);
            if (b > r.peak_after_call) r.peak_after_call = b;
            CHECK_EQ_U64(gt_stats(cache).exec_bytes, b);
        }
        CHECK_OK(tp_sim_advance(dev, 50 * MS));
        if (step % 20 == 0) CHECK_OK(tp_graph_cache_tick(cache));
    }
    CHECK_MSG(hot_failures == 0, "%llu hot replays found their key evicted", (unsigned long long)hot_failures);
    r.stats = gt_stats(cache);
    uint64_t bursts = r.new_keys / 100;
    /* hot keys were instantiated once each, never again */
    CHECK_MSG(r.stats.instantiations == 10 + r.new_keys + 100 * bursts, "instantiations %llu, expected %llu",
              (unsigned long long)r.stats.instantiations, (unsigned long long)(10 + r.new_keys + 100 * bursts));
    CHECK_LE_U64(r.stats.exec_bytes, cap);
    CHECK_CACHE(cache);
    CHECK_EQ_U64(gt_counters(dev).invalid_accesses, 0);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, hot));
    CHECK_OK(tp_sim_graph_destroy(dev, churn));
    for (int i = 0; i < 4; i++) CHECK_OK(tp_sim_graph_destroy(dev, burst[i]));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
    return r;
}

static void test_mode7_key_churn(void) {
    const uint64_t cap = 256 * TEST_MiB;
    churn_result r = run_churn(TP_NS_NEVER, 2000);
    /* the cap did the work: evictions by bytes, never a hot key */
    CHECK_GT_U64(r.stats.evictions_bytes, 0);
    CHECK_GE_U64(r.stats.hits, 10 * (r.hot_launches / 10 / 20) - 10);
    /* inside one instantiation the device can briefly hold the new
     * executable before victims for a larger-than-estimated one go */
    CHECK_MSG(r.stats.exec_bytes_peak <= cap + 25600000ull, "transient peak %llu",
              (unsigned long long)r.stats.exec_bytes_peak);
    printf("mode 7 (cap only): %llu new keys + %llu burst keys, %llu hot replays; exec bytes after calls "
           "peaked at %.1f MiB, transient peak %.1f MiB, cap %.0f MiB; evictions: bytes %llu, count %llu\n",
           (unsigned long long)r.new_keys, (unsigned long long)(r.new_keys / 100 * 100),
           (unsigned long long)r.hot_launches, (double)r.peak_after_call / TEST_MiB,
           (double)r.stats.exec_bytes_peak / TEST_MiB, (double)cap / TEST_MiB,
           (unsigned long long)r.stats.evictions_bytes, (unsigned long long)r.stats.evictions_count);

    /* with idle eviction too (10 s): churn keys age out, hot keys stay */
    r = run_churn(10 * SEC, 1000);
    CHECK_GT_U64(r.stats.evictions_idle, 0);
    printf("mode 7 (cap + 10 s idle): %llu idle evictions, %llu by bytes, %llu by count; "
           "exec bytes after calls peaked at %.1f MiB\n",
           (unsigned long long)r.stats.evictions_idle, (unsigned long long)r.stats.evictions_bytes,
           (unsigned long long)r.stats.evictions_count, (double)r.peak_after_call / TEST_MiB);
}

/* ------------------------------------------------------------ mode 8 */

static void fill_fifty(tp_device *dev, tp_pool *pool, tp_graph_cache *cache, tp_stream s, tp_graph *graphs) {
    for (uint64_t k = 0; k < 50; k++) {
        void *p = NULL;
        CHECK_OK(tp_pool_alloc(pool, TEST_MiB, s, &p));
        tp_range r = {(uint64_t)(uintptr_t)p, TEST_MiB};
        graphs[k] = gt_graph_ranges(dev, 100, k, MS, &r, 1);
        tp_graph_pins pins = {pool, &r, 1, false};
        CHECK_OK(tp_graph_cache_run(cache, k, graphs[k], &pins, s));
        CHECK_OK(tp_pool_free(pool, p, s));
    }
}

static void test_mode8_idle_retention(void) {
    for (int background = 0; background <= 1; background++) {
        test_log log = {0};
        tp_device *dev = gt_open("sim:4GiB", &log);
        tp_pool_config pc = {.release_threshold_bytes = 2 * TEST_MiB, .idle_release_ns = SEC};
        tp_pool *pool = NULL;
        CHECK_OK(tp_pool_create(dev, &pc, &pool));
        tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.background_thread = background,
                                                                        .tick_interval_ns = MS});
        tp_stream s;
        CHECK_OK(tp_stream_create(dev, &s));
        tp_graph graphs[50];
        fill_fifty(dev, pool, cache, s, graphs);
        tp_graph_cache_stats st = gt_stats(cache);
        CHECK_EQ_U64(st.execs, 50);
        CHECK_EQ_U64(st.pinned_ranges, 50);
        uint64_t exec_bytes = gt_sim_exec_bytes(dev);
        CHECK_EQ_U64(exec_bytes, 50 * 100 * 10 * TEST_MiB / 1024);
        CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 50 * TEST_MiB);

        /* 5 s in: nothing is idle long enough yet */
        CHECK_OK(tp_sim_advance(dev, 5 * SEC));
        if (background) sleep_ms(30); else CHECK_OK(tp_graph_cache_tick(cache));
        CHECK_EQ_U64(gt_stats(cache).execs, 50);

        /* an hour with no compute call */
        CHECK_OK(tp_sim_advance(dev, 3600 * SEC));
        if (background) {
            for (int i = 0; i < 5000 && gt_stats(cache).execs > 0; i++) sleep_ms(1);
        } else {
            CHECK_OK(tp_graph_cache_tick(cache));
        }
        st = gt_stats(cache);
        CHECK_MSG(st.execs == 0 && st.evictions_idle == 50, "%s: execs %llu idle evictions %llu",
                  background ? "thread" : "tick", (unsigned long long)st.execs,
                  (unsigned long long)st.evictions_idle);
        CHECK_EQ_U64(gt_sim_exec_bytes(dev), 0);
        if (background) /* the thread may be between evicting and unpinning */
            for (int i = 0; i < 1000 && gt_pool_stats(pool).pinned_bytes.current; i++) sleep_ms(1);
        CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
        uint64_t reserved_before = gt_pool_stats(pool).reserved_bytes.current;
        CHECK_OK(tp_sim_advance(dev, 2 * SEC)); /* unpinned memory ages past idle_release_ns */
        CHECK_OK(tp_pool_tick(pool)); /* the pool's own idle release: its memory goes too */
        uint64_t reserved_after = gt_pool_stats(pool).reserved_bytes.current;
        CHECK_LE_U64(reserved_after, 2 * TEST_MiB);
        printf("mode 8 (%s): 50 executables (%.1f MiB) + 50 MiB pinned -> 0 after an idle hour; "
               "pool reserved %.0f -> %.0f MiB\n", background ? "background thread" : "tick",
               (double)exec_bytes / TEST_MiB, (double)reserved_before / TEST_MiB, (double)reserved_after / TEST_MiB);
        CHECK_CACHE(cache);
        CHECK_POOL(pool);
        CHECK_EQ_U64(gt_counters(dev).hazards, 0);
        CHECK_OK(tp_graph_cache_destroy(cache));
        CHECK_OK(tp_pool_forget_stream(pool, s));
        CHECK_OK(tp_pool_destroy(pool));
        for (int k = 0; k < 50; k++) CHECK_OK(tp_sim_graph_destroy(dev, graphs[k]));
        CHECK_OK(tp_stream_destroy(dev, s));
        CHECK_OK(tp_device_close(dev));
    }
}

/* ------------------------------------------------------------ mode 9 */

static void test_mode9_instantiate_oom(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MB", &log); /* 1,000,000 bytes per node */
    tp_graph_cache *cache =
        make_cache(dev, (tp_graph_cache_config){.max_bytes = TP_BYTES_UNLIMITED, .idle_evict_ns = TP_NS_NEVER});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    tp_graph g10 = gt_graph(dev, 10, 1, MS), g30 = gt_graph(dev, 30, 2, MS);
    for (uint64_t k = 1; k <= 5; k++) CHECK_OK(tp_graph_cache_prepare(cache, k, g10, NULL)); /* 5 idle, 10 MB each */
    uint64_t free_bytes, total;
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_OK(tp_sim_occupy(dev, free_bytes - 10 * TEST_MiB)); /* 10 MiB free */

    /* 30 MB needed: the two least recently used go, then it fits */
    CHECK_OK(tp_graph_cache_prepare(cache, 6, g30, NULL));
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.evictions_pressure, 2);
    CHECK_EQ_U64(st.instantiate_failures, 2);
    CHECK_EQ_U64(st.execs, 4);
    CHECK_EQ_U64(st.eager_fallbacks, 0);
    for (uint64_t k = 1; k <= 6; k++)
        CHECK_STATUS(tp_graph_cache_launch(cache, k, s), k <= 2 ? TP_ERR_NOT_FOUND : TP_OK);
    CHECK_OK(tp_sim_advance(dev, 10 * MS));
    CHECK_CACHE(cache);

    /* idle ones first: the least recent executable (20) has a 1 s launch
     * in flight, so the next one (21) goes instead, with no host wait */
    for (uint64_t k = 3; k <= 6; k++) CHECK_OK(tp_graph_cache_evict(cache, k));
    CHECK_OK(tp_sim_occupy(dev, 0));
    tp_graph slow = gt_graph(dev, 10, 1, 1000 * MS);
    CHECK_OK(tp_graph_cache_prepare(cache, 20, slow, NULL));
    uint64_t t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_launch(cache, 20, s));
    CHECK_OK(tp_graph_cache_prepare(cache, 21, g10, NULL));
    CHECK_OK(tp_graph_cache_prepare(cache, 22, g10, NULL));
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_OK(tp_sim_occupy(dev, free_bytes - 5 * TEST_MiB)); /* 5 MiB free, 10 MB needed */
    uint64_t pressure = gt_stats(cache).evictions_pressure;
    CHECK_OK(tp_graph_cache_prepare(cache, 23, g10, NULL));
    CHECK_EQ_U64(gt_stats(cache).evictions_pressure, pressure + 1);
    CHECK_STATUS(tp_graph_cache_launch(cache, 21, s), TP_ERR_NOT_FOUND);
    CHECK_LT_U64(gt_now(dev), t0 + 1000 * MS); /* nobody waited for the slow launch */
    CHECK_OK(tp_graph_cache_launch(cache, 20, s)); /* skipped although least recent */
    CHECK_OK(tp_graph_cache_launch(cache, 22, s));
    CHECK_OK(tp_graph_cache_launch(cache, 23, s));
    CHECK_CACHE(cache);

    /* nothing left to evict: run eagerly, never abort */
    tp_graph huge = gt_graph(dev, 500, 3, MS);
    uint64_t eager = gt_stats(cache).eager_fallbacks;
    CHECK_STATUS(tp_graph_cache_prepare(cache, 9, huge, NULL), TP_ERR_RUN_EAGER);
    st = gt_stats(cache);
    CHECK_EQ_U64(st.eager_fallbacks, eager + 1);
    CHECK_EQ_U64(st.execs, 0);
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    CHECK_EQ_U64(gt_counters(dev).hazards, 0);
    CHECK_CACHE(cache);
    /* and usable again once memory is back */
    CHECK_OK(tp_sim_occupy(dev, 0));
    CHECK_OK(tp_graph_cache_run(cache, 10, g10, NULL, s));
    CHECK_OK(tp_graph_cache_prepare(cache, 9, huge, NULL));
    printf("mode 9: 30 MB needed with 10 MiB free -> 2 LRU evictions then success; in-flight key skipped; "
           "nothing left -> TP_ERR_RUN_EAGER (%llu instantiate failures in all)\n",
           (unsigned long long)gt_stats(cache).instantiate_failures);
    CHECK_OK(tp_graph_cache_destroy(cache));
    tp_graph all[] = {g10, g30, slow, huge};
    for (int i = 0; i < 4; i++) CHECK_OK(tp_sim_graph_destroy(dev, all[i]));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
}

/* ------------------------------------------------------------ mode 10 */

static uint64_t launch_and_time(tp_device *dev, tp_graph_cache *cache, uint64_t key, tp_stream s) {
    uint64_t t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_launch(cache, key, s));
    CHECK_OK(tp_stream_synchronize(dev, s));
    return gt_now(dev) - t0;
}

static void test_mode10_key_aliasing(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB", &log);
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.idle_evict_ns = TP_NS_NEVER});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    tp_graph ga = gt_graph(dev, 20, 1, 1 * MS), gb = gt_graph(dev, 30, 2, 2 * MS);

    /* the same two templates, alternating */
    int wrong = 0;
    for (int i = 0; i < 1000; i++) {
        CHECK_OK(tp_graph_cache_prepare(cache, 1, i % 2 ? gb : ga, NULL));
        if (launch_and_time(dev, cache, 1, s) != (i % 2 ? 2 : 1) * MS) wrong++;
    }
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_MSG(wrong == 0, "%d launches ran the other topology", wrong);
    CHECK_MSG(st.instantiations == 2 && st.hits == 998, "instantiations %llu hits %llu",
              (unsigned long long)st.instantiations, (unsigned long long)st.hits);

    /* re-captured each time (new handles; the old template destroyed first,
     * so handles get reused): updates in place, still 2 instantiations */
    for (int i = 0; i < 1000; i++) {
        tp_graph g = gt_graph(dev, i % 2 ? 30 : 20, i % 2 ? 2 : 1, (i % 2 ? 20 : 10) * MS);
        CHECK_OK(tp_graph_cache_prepare(cache, 2, g, NULL));
        if (launch_and_time(dev, cache, 2, s) != (i % 2 ? 20 : 10) * MS) wrong++;
        CHECK_OK(tp_sim_graph_destroy(dev, g));
    }
    tp_graph_cache_stats st2 = gt_stats(cache);
    uint64_t inst = st2.instantiations - st.instantiations;
    uint64_t in_place = st2.hits + st2.updates - st.hits - st.updates;
    CHECK_MSG(wrong == 0, "%d launches ran a stale executable", wrong);
    CHECK_MSG(inst == 2 && in_place == 998, "instantiations %llu, in place %llu", (unsigned long long)inst,
              (unsigned long long)in_place);

    /* same topology, new parameters: updated in place */
    tp_graph ga2 = gt_graph(dev, 20, 1, 7 * MS);
    CHECK_OK(tp_graph_cache_prepare(cache, 1, ga2, NULL));
    CHECK_EQ_U64(launch_and_time(dev, cache, 1, s), 7 * MS);
    CHECK_EQ_U64(gt_stats(cache).instantiations, st2.instantiations);

    /* six topologies in rotation: a key keeps at most 4 executables */
    tp_graph six[6];
    for (int t = 0; t < 6; t++) six[t] = gt_graph(dev, 10 + t, 100 + t, MS);
    for (int i = 0; i < 60; i++) {
        CHECK_OK(tp_graph_cache_prepare(cache, 3, six[i % 6], NULL));
        CHECK_EQ_U64(launch_and_time(dev, cache, 3, s), MS);
    }
    st = gt_stats(cache);
    CHECK_EQ_U64(st.execs, 2 + 2 + 4);
    CHECK_CACHE(cache);
    printf("mode 10: 1000 alternations -> 2 instantiations, 998 hits; re-captured templates -> 2 "
           "instantiations, 998 in-place updates\n");
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, ga));
    CHECK_OK(tp_sim_graph_destroy(dev, gb));
    CHECK_OK(tp_sim_graph_destroy(dev, ga2));
    for (int t = 0; t < 6; t++) CHECK_OK(tp_sim_graph_destroy(dev, six[t]));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
}

static const test_case tests[] = {
    TEST_CASE(test_mode4_reclaim_vs_captured_graphs),
    TEST_CASE(test_mode7_key_churn),
    TEST_CASE(test_mode8_idle_retention),
    TEST_CASE(test_mode9_instantiate_oom),
    TEST_CASE(test_mode10_key_aliasing),
};

int main(int argc, char **argv) { return TEST_MAIN("test_graph_scenarios", tests, argc, argv); }
