/* SPDX-License-Identifier: MIT */
/*
 * test_graph_cache.c -- the graph cache's API on the simulated device: bad
 * input, prepare/launch/hit/update, the count and byte bounds, segmented
 * LRU protection, pins (taken, replaced, released after completion),
 * destroy with live pins, fault injection on instantiate/update/events
 * (including a fail-at-N loop), statistics and JSON, and the byte-estimate
 * path for devices that do not report an executable's size; and what
 * test_graph_fuzz found: launches into a capture and failed event records
 * must not invalidate captures, a launch of unknown completion is not
 * covered by later ones, detach releases the pins evicted keys still keep,
 * and a huge node_bytes_estimate does not wrap the byte counts; the highest
 * count cap still counts an executable of more than 4 GiB whole; and a
 * launch of unknown completion is waited for on its stream, not the device.
 */
#include "gc_test.h"

#include "internal.h"

static tp_graph_cache *make_cache(tp_device *dev, tp_graph_cache_config cfg) {
    tp_graph_cache *cache = NULL;
    tp_status st = tp_graph_cache_create(dev, &cfg, &cache);
    REQUIRE(st == TP_OK && cache);
    return cache;
}

static void test_create_refuses_bad_arguments(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    tp_graph_cache *cache = (tp_graph_cache *)&log;
    CHECK_STATUS(tp_graph_cache_create(NULL, NULL, &cache), TP_ERR_INVALID_ARGUMENT);
    CHECK_EQ_PTR(cache, NULL);
    CHECK_STATUS(tp_graph_cache_create(dev, NULL, NULL), TP_ERR_INVALID_ARGUMENT);
    tp_graph_cache_config bad = {.protected_percent = 101};
    CHECK_STATUS(tp_graph_cache_create(dev, &bad, &cache), TP_ERR_INVALID_ARGUMENT);
    CHECK_EQ_PTR(cache, NULL);
    CHECK_OK(tp_device_close(dev));
}

/* The bad-input tests' setup: a default cache, a pool (not attached) and a
 * 4-node graph on a 1 GiB device. */
typedef struct bad_input_env {
    test_log log;
    tp_device *dev;
    tp_graph_cache *cache;
    tp_pool *pool;
    tp_graph g;
} bad_input_env;

static void bad_input_open(bad_input_env *e) {
    memset(e, 0, sizeof *e);
    e->dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &e->log);
    CHECK_OK(tp_graph_cache_create(e->dev, NULL, &e->cache));
    REQUIRE(e->cache);
    e->g = gt_graph(e->dev, 4, 1, 0);
    CHECK_OK(tp_pool_create(e->dev, NULL, &e->pool));
}

static void bad_input_close(bad_input_env *e) {
    if (e->cache) {
        CHECK_CACHE(e->cache);
        CHECK_OK(tp_graph_cache_destroy(e->cache));
    }
    CHECK_OK(tp_pool_destroy(e->pool));
    CHECK_OK(tp_sim_graph_destroy(e->dev, e->g));
    CHECK_OK(tp_device_close(e->dev));
}

static void test_null_handles_are_refused(void) {
    bad_input_env e;
    bad_input_open(&e);
    tp_graph_cache *cache = e.cache;
    tp_pool *pool = e.pool;
    tp_graph g = e.g;
    tp_graph_cache_stats s;
    char buf[64];
    size_t len = 0;
    CHECK_STATUS(tp_graph_cache_destroy(NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_attach_pool(NULL, pool), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_detach_pool(NULL, pool), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_prepare(NULL, 1, g, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_launch(NULL, 1, TP_STREAM_DEFAULT), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_run(NULL, 1, g, NULL, TP_STREAM_DEFAULT), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_evict(NULL, 1), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_tick(NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_get_stats(NULL, &s), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_get_stats(cache, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_stats_json(NULL, buf, sizeof buf, &len), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_stats_json(cache, NULL, 8, &len), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_graph_cache_prepare(cache, 1, NULL, NULL), TP_ERR_INVALID_ARGUMENT);
    bad_input_close(&e);
}

static void test_malformed_pins_instantiate_and_pin_nothing(void) {
    bad_input_env e;
    bad_input_open(&e);
    tp_device *dev = e.dev;
    tp_graph_cache *cache = e.cache;
    tp_graph g = e.g;
    tp_graph_pins pins = {.pool = NULL, .ranges = NULL, .count = 1};
    CHECK_STATUS(tp_graph_cache_prepare(cache, 1, g, &pins), TP_ERR_INVALID_ARGUMENT);
    pins.pool = e.pool;
    CHECK_STATUS(tp_graph_cache_prepare(cache, 1, g, &pins), TP_ERR_INVALID_ARGUMENT);
    tp_range zero = {0x1000, 0};
    pins.ranges = &zero;
    CHECK_STATUS(tp_graph_cache_prepare(cache, 1, g, &pins), TP_ERR_INVALID_ARGUMENT);
    tp_range foreign = {0x1000, 4096}; /* not memory of this pool */
    pins.ranges = &foreign;
    tp_status st = tp_graph_cache_prepare(cache, 1, g, &pins);
    CHECK_NE_U64(st, TP_OK);
    tp_graph_cache_stats s = gt_stats(cache);
    CHECK_EQ_U64(s.execs, 0);
    CHECK_EQ_U64(s.instantiations, 0);
    CHECK_EQ_U64(s.pinned_ranges, 0);
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    bad_input_close(&e);
}

static void test_unknown_keys_are_refused(void) {
    bad_input_env e;
    bad_input_open(&e);
    CHECK_STATUS(tp_graph_cache_launch(e.cache, 99, TP_STREAM_DEFAULT), TP_ERR_NOT_FOUND);
    CHECK_STATUS(tp_graph_cache_evict(e.cache, 99), TP_ERR_NOT_FOUND);
    CHECK_EQ_U64(gt_counters(e.dev).calls[TP_SIM_OP_GRAPH_LAUNCH], 0);
    bad_input_close(&e);
}

static void test_attach_and_detach_pool_once(void) {
    bad_input_env e;
    bad_input_open(&e);
    tp_graph_cache *cache = e.cache;
    tp_pool *pool = e.pool;
    CHECK_STATUS(tp_graph_cache_attach_pool(cache, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool));
    CHECK_STATUS(tp_graph_cache_attach_pool(cache, pool), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_graph_cache_detach_pool(cache, pool));
    CHECK_STATUS(tp_graph_cache_detach_pool(cache, pool), TP_ERR_NOT_FOUND);
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool)); /* destroy detaches */
    bad_input_close(&e);
}

static void test_stats_json_sizing(void) {
    bad_input_env e;
    bad_input_open(&e);
    tp_graph_cache *cache = e.cache;
    char buf[64];
    size_t len = 0;
    CHECK_STATUS(tp_graph_cache_stats_json(cache, NULL, 0, &len), TP_ERR_BUFFER_TOO_SMALL);
    CHECK_GT_U64(len, 100);
    memset(buf, 'x', sizeof buf);
    CHECK_STATUS(tp_graph_cache_stats_json(cache, buf, sizeof buf, NULL), TP_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_U64(buf[sizeof buf - 1], '\0');
    bad_input_close(&e);
}

static void test_destroy_removes_the_reclaim_callback(void) {
    bad_input_env e;
    bad_input_open(&e);
    tp_device *dev = e.dev;
    tp_graph_cache *cache = e.cache;
    tp_pool *pool = e.pool;
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool));
    CHECK_STATUS(tp_device_close(dev), TP_ERR_BUSY); /* cache and pool open */
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    e.cache = NULL;
    /* destroy removed the reclaim callback: an out-of-memory allocation
     * calls no reclaimer (and does not touch the freed cache) */
    void *huge = NULL;
    CHECK_OK(tp_sim_occupy(dev, 900 * TEST_MiB));
    CHECK_STATUS(tp_pool_alloc(pool, 512 * TEST_MiB, TP_STREAM_DEFAULT, &huge), TP_ERR_OUT_OF_MEMORY);
    CHECK(gt_pool_stats(pool).oom_retries > 0 || gt_pool_stats(pool).ooms == 1);
    CHECK_EQ_U64(gt_pool_stats(pool).reclaim_calls, 0);
    CHECK_OK(tp_sim_occupy(dev, 0));
    bad_input_close(&e);
}

/* Detaching the pool from inside one of its reclaim callbacks is refused
 * (TP_ERR_BUSY) and leaves the pool attached: it used to drop the pool from
 * the cache's list while its reclaim callback stayed registered, so destroy
 * left the callback behind and the next out-of-memory called it on the
 * freed cache (a use-after-free under ASan; here, reclaim_calls after the
 * destroy and a second detach answering NOT_FOUND). */
typedef struct detach_in_reclaim {
    tp_graph_cache *cache;
    tp_status status;
    int calls;
} detach_in_reclaim;

static uint64_t detach_from_reclaim(void *user, tp_pool *pool, uint64_t bytes_needed) {
    (void)bytes_needed;
    detach_in_reclaim *d = user;
    if (d->calls++ == 0) d->status = tp_graph_cache_detach_pool(d->cache, pool);
    return 0;
}

static void test_detach_inside_a_reclaim_round_is_refused(void) {
    bad_input_env e;
    bad_input_open(&e);
    tp_device *dev = e.dev;
    tp_pool *pool = e.pool;
    detach_in_reclaim d = {e.cache, TP_OK, 0};
    CHECK_OK(tp_graph_cache_attach_pool(e.cache, pool));
    CHECK_OK(tp_pool_add_reclaim_callback(pool, detach_from_reclaim, &d));
    void *huge = NULL;
    CHECK_OK(tp_sim_occupy(dev, 900 * TEST_MiB));
    CHECK_STATUS(tp_pool_alloc(pool, 512 * TEST_MiB, TP_STREAM_DEFAULT, &huge), TP_ERR_OUT_OF_MEMORY);
    CHECK_EQ_U64(d.calls, 1);
    CHECK_STATUS(d.status, TP_ERR_BUSY);
    CHECK_OK(tp_graph_cache_detach_pool(e.cache, pool)); /* still attached: detached now */
    CHECK_OK(tp_graph_cache_destroy(e.cache));
    e.cache = NULL;
    uint64_t reclaim_calls = gt_pool_stats(pool).reclaim_calls;
    CHECK_STATUS(tp_pool_alloc(pool, 512 * TEST_MiB, TP_STREAM_DEFAULT, &huge), TP_ERR_OUT_OF_MEMORY);
    /* only the test's own callback ran: the cache's went with the detach */
    CHECK_EQ_U64(gt_pool_stats(pool).reclaim_calls - reclaim_calls, 1);
    CHECK_OK(tp_pool_remove_reclaim_callback(pool, detach_from_reclaim, &d));
    CHECK_OK(tp_sim_occupy(dev, 0));
    bad_input_close(&e);
}

static void test_prepare_launch_hit_update(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    tp_graph_cache *cache =
        make_cache(dev, (tp_graph_cache_config){.max_execs = 16, .max_bytes = TP_BYTES_UNLIMITED,
                                                .idle_evict_ns = TP_NS_NEVER});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    tp_graph g1 = gt_graph(dev, 8, 1, 1 * MS);
    tp_graph g1b = gt_graph(dev, 8, 1, 2 * MS); /* same topology, other parameters */

    CHECK_OK(tp_graph_cache_prepare(cache, 42, g1, NULL));
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.instantiations, 1);
    CHECK_EQ_U64(st.execs, 1);
    CHECK_EQ_U64(st.exec_bytes, 8 * TEST_MiB);
    CHECK_EQ_U64(gt_sim_exec_bytes(dev), 8 * TEST_MiB);

    uint64_t t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_launch(cache, 42, s));
    CHECK_EQ_U64(gt_counters(dev).pending_kernels, 1);
    CHECK_OK(tp_stream_synchronize(dev, s));
    CHECK_EQ_U64(gt_now(dev) - t0, 1 * MS);

    CHECK_OK(tp_graph_cache_prepare(cache, 42, g1, NULL)); /* same handle: a hit */
    CHECK_OK(tp_graph_cache_prepare(cache, 42, g1b, NULL)); /* new handle, same topology: update */
    st = gt_stats(cache);
    CHECK_EQ_U64(st.hits, 1);
    CHECK_EQ_U64(st.updates, 1);
    CHECK_EQ_U64(st.instantiations, 1);
    CHECK_EQ_U64(st.update_failures, 0);
    t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_launch(cache, 42, s));
    CHECK_OK(tp_stream_synchronize(dev, s));
    CHECK_MSG(gt_now(dev) - t0 == 2 * MS, "the update did not take effect (ran %llu ns)",
              (unsigned long long)(gt_now(dev) - t0));

    CHECK_OK(tp_graph_cache_run(cache, 7, g1, NULL, s));
    st = gt_stats(cache);
    CHECK_EQ_U64(st.instantiations, 2);
    CHECK_EQ_U64(st.launches, 3);
    CHECK_EQ_U64(st.execs, 2);
    CHECK_OK(tp_graph_cache_evict(cache, 42));
    CHECK_STATUS(tp_graph_cache_launch(cache, 42, s), TP_ERR_NOT_FOUND);
    CHECK_OK(tp_graph_cache_tick(cache)); /* idle eviction off: nothing happens */
    st = gt_stats(cache);
    CHECK_EQ_U64(st.evictions_explicit, 1);
    CHECK_EQ_U64(st.execs, 1);
    CHECK_EQ_U64(st.evictions_idle, 0);
    CHECK_EQ_U64(gt_sim_execs(dev), 1);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    CHECK_EQ_U64(gt_sim_exec_bytes(dev), 0);
    CHECK_OK(tp_sim_graph_destroy(dev, g1));
    CHECK_OK(tp_sim_graph_destroy(dev, g1b));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

static void test_count_bound(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    tp_graph_cache *cache =
        make_cache(dev, (tp_graph_cache_config){.max_execs = 8, .max_bytes = TP_BYTES_UNLIMITED,
                                                .idle_evict_ns = TP_NS_NEVER});
    tp_graph g = gt_graph(dev, 1, 1, 0);
    for (uint64_t k = 0; k < 20; k++) {
        CHECK_OK(tp_graph_cache_prepare(cache, k, g, NULL));
        CHECK_LE_U64(gt_stats(cache).execs, 8);
        CHECK_LE_U64(gt_sim_execs(dev), 8);
    }
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.execs, 8);
    CHECK_EQ_U64(st.evictions_count, 12);
    CHECK_EQ_U64(st.max_execs, 8);
    for (uint64_t k = 0; k < 20; k++) /* least recently used went first */
        CHECK_STATUS(tp_graph_cache_launch(cache, k, TP_STREAM_DEFAULT), k >= 12 ? TP_OK : TP_ERR_NOT_FOUND);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));

    /* one slot: no protected share; a reused key still stays in bounds */
    cache = make_cache(dev, (tp_graph_cache_config){.max_execs = 1, .protected_percent = 100,
                                                    .idle_evict_ns = TP_NS_NEVER});
    for (uint64_t k = 0; k < 5; k++) {
        CHECK_OK(tp_graph_cache_run(cache, k, g, NULL, TP_STREAM_DEFAULT));
        CHECK_OK(tp_graph_cache_run(cache, k, g, NULL, TP_STREAM_DEFAULT));
        CHECK_OK(tp_graph_cache_launch(cache, k, TP_STREAM_DEFAULT));
        CHECK_EQ_U64(gt_stats(cache).execs, 1);
        CHECK_CACHE(cache);
    }
    CHECK_EQ_U64(gt_stats(cache).evictions_count, 4);
    CHECK_EQ_U64(gt_stats(cache).hits, 5);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_device_close(dev));
}

static void test_byte_bound(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    tp_graph_cache *cache =
        make_cache(dev, (tp_graph_cache_config){.max_bytes = 10 * TEST_MiB, .idle_evict_ns = TP_NS_NEVER});
    tp_graph g3 = gt_graph(dev, 3, 1, 0);
    for (uint64_t k = 0; k < 10; k++) {
        CHECK_OK(tp_graph_cache_prepare(cache, k, g3, NULL));
        CHECK_LE_U64(gt_stats(cache).exec_bytes, 10 * TEST_MiB);
        CHECK_LE_U64(gt_sim_exec_bytes(dev), 10 * TEST_MiB);
    }
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.execs, 3);
    CHECK_EQ_U64(st.exec_bytes, 9 * TEST_MiB);
    CHECK_EQ_U64(st.evictions_bytes, 7);
    CHECK_MSG(st.exec_bytes_peak <= 10 * TEST_MiB, "peak %llu", (unsigned long long)st.exec_bytes_peak);
    CHECK_EQ_U64(st.max_bytes, 10 * TEST_MiB);

    /* bigger than the cap on its own: never cached */
    tp_graph g11 = gt_graph(dev, 11, 2, 0);
    CHECK_STATUS(tp_graph_cache_prepare(cache, 100, g11, NULL), TP_ERR_RUN_EAGER);
    st = gt_stats(cache);
    CHECK_EQ_U64(st.eager_fallbacks, 1);
    CHECK_LE_U64(st.exec_bytes, 10 * TEST_MiB);
    CHECK_EQ_U64(gt_sim_exec_bytes(dev), st.exec_bytes);
    CHECK_STATUS(tp_graph_cache_launch(cache, 100, TP_STREAM_DEFAULT), TP_ERR_NOT_FOUND);
    CHECK_CACHE(cache);

    /* unlimited */
    tp_graph_cache *big =
        make_cache(dev, (tp_graph_cache_config){.max_bytes = TP_BYTES_UNLIMITED, .idle_evict_ns = TP_NS_NEVER});
    for (uint64_t k = 0; k < 5; k++) CHECK_OK(tp_graph_cache_prepare(big, k, g11, NULL));
    st = gt_stats(big);
    CHECK_EQ_U64(st.execs, 5);
    CHECK_EQ_U64(st.exec_bytes, 55 * TEST_MiB);
    CHECK_EQ_U64(st.max_bytes, TP_BYTES_UNLIMITED);
    CHECK_CACHE(big);
    CHECK_OK(tp_graph_cache_destroy(big));
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g3));
    CHECK_OK(tp_sim_graph_destroy(dev, g11));
    CHECK_OK(tp_device_close(dev));
}

static void test_segmented_lru(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=64KiB", &log);
    /* 10 slots, 5 of them protected */
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.max_execs = 10, .protected_percent = 50,
                                                                    .max_bytes = TP_BYTES_UNLIMITED,
                                                                    .idle_evict_ns = TP_NS_NEVER});
    tp_graph g = gt_graph(dev, 2, 1, 0);
    tp_stream s = TP_STREAM_DEFAULT;
    /* hot keys: run, then replayed (second launch since the prepare) */
    for (uint64_t k = 100; k < 104; k++) {
        CHECK_OK(tp_graph_cache_run(cache, k, g, NULL, s));
        CHECK_OK(tp_graph_cache_launch(cache, k, s));
    }
    /* used again through a second prepare */
    CHECK_OK(tp_graph_cache_prepare(cache, 104, g, NULL));
    CHECK_OK(tp_graph_cache_prepare(cache, 104, g, NULL));
    /* a burst of 200 one-shot keys */
    for (uint64_t k = 1000; k < 1200; k++) {
        CHECK_OK(tp_graph_cache_run(cache, k, g, NULL, s));
        CHECK_LE_U64(gt_stats(cache).execs, 10);
    }
    for (uint64_t k = 100; k < 105; k++) CHECK_OK(tp_graph_cache_launch(cache, k, s)); /* all survived */
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.execs, 10);
    CHECK_EQ_U64(st.evictions_count, 200 - 5);
    CHECK_EQ_U64(st.instantiations, 205);
    CHECK_CACHE(cache);

    /* 7 more keys promoted: protected keeps its 5 most recent, the rest
     * drop to probation and are the first victims of the next burst */
    for (uint64_t k = 300; k < 307; k++) {
        CHECK_OK(tp_graph_cache_run(cache, k, g, NULL, s));
        CHECK_OK(tp_graph_cache_launch(cache, k, s));
    }
    for (uint64_t k = 2000; k < 2020; k++) CHECK_OK(tp_graph_cache_run(cache, k, g, NULL, s));
    for (uint64_t k = 302; k < 307; k++) CHECK_OK(tp_graph_cache_launch(cache, k, s));
    for (uint64_t k = 100; k < 105; k++) CHECK_STATUS(tp_graph_cache_launch(cache, k, s), TP_ERR_NOT_FOUND);
    CHECK_STATUS(tp_graph_cache_launch(cache, 300, s), TP_ERR_NOT_FOUND);
    CHECK_STATUS(tp_graph_cache_launch(cache, 301, s), TP_ERR_NOT_FOUND);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_device_close(dev));
}

static void *alloc_or_die(tp_pool *pool, size_t bytes, tp_stream s) {
    void *p = NULL;
    tp_status st = tp_pool_alloc(pool, bytes, s, &p);
    REQUIRE(st == TP_OK && p);
    return p;
}

static void test_pins(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB", &log);
    tp_pool *pool = NULL;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.idle_evict_ns = TP_NS_NEVER});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));

    /* the cache pins a live block; the caller frees it; eviction releases
     * the pin only after the launch that reads it has completed */
    void *a = alloc_or_die(pool, 8 * TEST_MiB, s);
    tp_range ra = {(uint64_t)(uintptr_t)a, 8 * TEST_MiB};
    tp_graph ga = gt_graph_ranges(dev, 10, 1, 100 * MS, &ra, 1);
    tp_graph_pins pa = {pool, &ra, 1, false};
    CHECK_OK(tp_graph_cache_prepare(cache, 1, ga, &pa));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 8 * TEST_MiB);
    CHECK_EQ_U64(gt_stats(cache).pinned_ranges, 1);
    CHECK_OK(tp_pool_free(pool, a, s));
    CHECK_OK(tp_graph_cache_launch(cache, 1, s));
    CHECK_OK(tp_graph_cache_evict(cache, 1));
    CHECK_EQ_U64(gt_stats(cache).execs, 0);
    CHECK_MSG(gt_pool_stats(pool).pinned_bytes.current == 8 * TEST_MiB, "pin released before the launch completed");
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 8 * TEST_MiB);
    CHECK_OK(tp_sim_advance(dev, 50 * MS));
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 8 * TEST_MiB);
    CHECK_OK(tp_sim_advance(dev, 60 * MS));
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_EQ_U64(gt_stats(cache).pinned_ranges, 0);
    uint64_t released = 0;
    CHECK_OK(tp_pool_trim(pool, 0, &released));
    CHECK_EQ_U64(gt_pool_stats(pool).reserved_bytes.current, 0);
    CHECK_POOL(pool);
    CHECK_CACHE(cache);

    /* launched on two streams: the second launch is ordered after the
     * first, so one event covers both and the pin outlives the longer */
    tp_stream s2;
    CHECK_OK(tp_stream_create(dev, &s2));
    void *d = alloc_or_die(pool, 2 * TEST_MiB, s);
    tp_range rd = {(uint64_t)(uintptr_t)d, 2 * TEST_MiB};
    tp_graph gd = gt_graph_ranges(dev, 10, 9, 100 * MS, &rd, 1);
    tp_graph_pins pd = {pool, &rd, 1, false};
    uint64_t t1 = gt_now(dev);
    CHECK_OK(tp_graph_cache_run(cache, 9, gd, &pd, s));
    CHECK_OK(tp_pool_free(pool, d, s));
    CHECK_OK(tp_graph_cache_launch(cache, 9, s2));
    CHECK_OK(tp_graph_cache_evict(cache, 9));
    CHECK_OK(tp_sim_advance(dev, 150 * MS)); /* the first launch is done, the second is not */
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_MSG(gt_pool_stats(pool).pinned_bytes.current == 2 * TEST_MiB,
              "pin released while the launch on the second stream still runs");
    CHECK_OK(tp_sim_advance(dev, 60 * MS));
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_GE_U64(gt_now(dev) - t1, 200 * MS);
    CHECK_OK(tp_pool_trim(pool, 0, NULL));
    CHECK_EQ_U64(gt_counters(dev).hazards, 0);

    /* pins replaced by an update: the old set goes once the launch is done */
    void *b1 = alloc_or_die(pool, 4 * TEST_MiB, s), *b2 = alloc_or_die(pool, 4 * TEST_MiB, s);
    tp_range r1 = {(uint64_t)(uintptr_t)b1, 4 * TEST_MiB}, r2 = {(uint64_t)(uintptr_t)b2, 4 * TEST_MiB};
    tp_graph g1 = gt_graph_ranges(dev, 10, 2, 100 * MS, &r1, 1), g2 = gt_graph_ranges(dev, 10, 2, 100 * MS, &r2, 1);
    tp_graph_pins p1 = {pool, &r1, 1, false}, p2 = {pool, &r2, 1, false};
    CHECK_OK(tp_graph_cache_run(cache, 2, g1, &p1, s));
    CHECK_OK(tp_pool_free(pool, b1, s));
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g2, &p2));
    CHECK_OK(tp_pool_free(pool, b2, s));
    CHECK_EQ_U64(gt_stats(cache).updates, 1);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 8 * TEST_MiB); /* b1 still read by the pending launch */
    CHECK_EQ_U64(gt_stats(cache).pinned_ranges, 2);
    CHECK_OK(tp_sim_advance(dev, 200 * MS));
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g2, NULL)); /* NULL keeps b2's pin; upkeep drops b1's */
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 4 * TEST_MiB);
    CHECK_EQ_U64(gt_stats(cache).hits, 1);
    tp_graph_pins none = {pool, NULL, 0, false};
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g2, &none)); /* an empty set drops them */
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_EQ_U64(gt_stats(cache).pinned_ranges, 0);
    CHECK_POOL(pool);
    CHECK_CACHE(cache);

    /* already_pinned pins are consumed even when prepare fails */
    CHECK_OK(tp_pool_capture_begin(pool, s));
    void *c = alloc_or_die(pool, 2 * TEST_MiB, s);
    tp_range *captured = NULL;
    size_t n = 0;
    CHECK_OK(tp_pool_capture_end(pool, s, &captured, &n));
    CHECK_EQ_U64(n, 1);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 2 * TEST_MiB);
    tp_graph gc = gt_graph_ranges(dev, 10, 3, MS, captured, n);
    tp_graph_pins pc = {pool, captured, n, true};
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_GRAPH_INSTANTIATE, 0, 1, TP_ERR_DEVICE));
    CHECK_STATUS(tp_graph_cache_prepare(cache, 3, gc, &pc), TP_ERR_DEVICE);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    tp_pool_free_ranges(pool, captured);
    CHECK_OK(tp_pool_free(pool, c, s));
    CHECK_POOL(pool);
    CHECK_CACHE(cache);

    tp_sim_counters ctr = gt_counters(dev);
    CHECK_EQ_U64(ctr.hazards, 0);
    CHECK_EQ_U64(ctr.invalid_accesses, 0);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_pool_destroy(pool));
    tp_graph graphs[] = {ga, g1, g2, gc, gd};
    for (size_t i = 0; i < 5; i++) CHECK_OK(tp_sim_graph_destroy(dev, graphs[i]));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK_OK(tp_device_close(dev));
}

static void test_destroy_with_live_pins(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB", &log);
    tp_pool *pool = NULL;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){0});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    void *a = alloc_or_die(pool, 16 * TEST_MiB, s);
    tp_range ra = {(uint64_t)(uintptr_t)a, 16 * TEST_MiB};
    tp_graph g = gt_graph_ranges(dev, 10, 1, 500 * MS, &ra, 1);
    tp_graph_pins pa = {pool, &ra, 1, false};
    uint64_t t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_run(cache, 1, g, &pa, s));
    CHECK_OK(tp_pool_free(pool, a, s));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 16 * TEST_MiB);
    CHECK_OK(tp_graph_cache_destroy(cache)); /* waits for the launch, then unpins */
    CHECK_GE_U64(gt_now(dev), t0 + 500 * MS);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    CHECK_OK(tp_pool_trim(pool, 0, NULL));
    CHECK_EQ_U64(gt_pool_stats(pool).reserved_bytes.current, 0);
    tp_sim_counters ctr = gt_counters(dev);
    CHECK_EQ_U64(ctr.hazards, 0);
    CHECK_EQ_U64(ctr.invalid_accesses, 0);
    CHECK_POOL(pool);
    CHECK_OK(tp_pool_forget_stream(pool, s));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
}

static void test_faults(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    tp_pool *pool = NULL;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    tp_graph_cache *cache =
        make_cache(dev, (tp_graph_cache_config){.max_execs = 16, .max_bytes = TP_BYTES_UNLIMITED,
                                                .idle_evict_ns = TP_NS_NEVER});
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    tp_graph g = gt_graph(dev, 4, 1, MS);

    /* instantiate fails: nothing cached, next try works */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_GRAPH_INSTANTIATE, 0, 1, TP_ERR_DEVICE));
    CHECK_STATUS(tp_graph_cache_prepare(cache, 1, g, NULL), TP_ERR_DEVICE);
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.instantiate_failures, 1);
    CHECK_EQ_U64(st.execs, 0);
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    CHECK_OK(tp_graph_cache_prepare(cache, 1, g, NULL));
    CHECK_CACHE(cache);

    /* instantiate reports out of memory once: one victim, then success */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_GRAPH_INSTANTIATE, 0, 1, TP_ERR_OUT_OF_MEMORY));
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g, NULL));
    st = gt_stats(cache);
    CHECK_EQ_U64(st.instantiate_failures, 2);
    CHECK_EQ_U64(st.evictions_pressure, 1);
    CHECK_EQ_U64(st.execs, 1);
    CHECK_STATUS(tp_graph_cache_launch(cache, 1, s), TP_ERR_NOT_FOUND);
    CHECK_CACHE(cache);

    /* update fails with a device error: the executable is rebuilt */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_GRAPH_UPDATE, 0, 1, TP_ERR_DEVICE));
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g, NULL));
    st = gt_stats(cache);
    CHECK_EQ_U64(st.update_failures, 1);
    CHECK_EQ_U64(st.instantiations, 3);
    CHECK_EQ_U64(st.execs, 1);
    CHECK_EQ_U64(gt_sim_execs(dev), 1);
    CHECK_OK(tp_graph_cache_launch(cache, 2, s));
    CHECK_CACHE(cache);

    /* update and re-instantiation both fail: the key is gone, cleanly */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_GRAPH_UPDATE, 0, 1, TP_ERR_DEVICE));
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_GRAPH_INSTANTIATE, 0, 1, TP_ERR_DEVICE));
    CHECK_STATUS(tp_graph_cache_prepare(cache, 2, g, NULL), TP_ERR_DEVICE);
    CHECK_STATUS(tp_graph_cache_launch(cache, 2, s), TP_ERR_NOT_FOUND);
    CHECK_EQ_U64(gt_stats(cache).execs, 0);
    CHECK_EQ_U64(gt_sim_execs(dev), 0);
    CHECK_CACHE(cache);

    /* the completion event cannot be created: nothing is launched */
    CHECK_OK(tp_graph_cache_prepare(cache, 3, g, NULL));
    uint64_t launches = gt_counters(dev).calls[TP_SIM_OP_GRAPH_LAUNCH];
    uint64_t counted = gt_stats(cache).launches;
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_EVENT, 0, 1, TP_ERR_DEVICE));
    CHECK_STATUS(tp_graph_cache_launch(cache, 3, s), TP_ERR_DEVICE);
    CHECK_EQ_U64(gt_counters(dev).calls[TP_SIM_OP_GRAPH_LAUNCH], launches);
    CHECK_EQ_U64(gt_stats(cache).launches, counted);

    /* the launch runs but its event cannot be recorded: eviction then
     * synchronises before releasing the pins */
    void *a = alloc_or_die(pool, 4 * TEST_MiB, s);
    tp_range ra = {(uint64_t)(uintptr_t)a, 4 * TEST_MiB};
    tp_graph gr = gt_graph_ranges(dev, 4, 1, 300 * MS, &ra, 1);
    tp_graph_pins pa = {pool, &ra, 1, false};
    CHECK_OK(tp_graph_cache_prepare(cache, 3, gr, &pa));
    CHECK_OK(tp_pool_free(pool, a, s));
    CHECK_OK(tp_graph_cache_launch(cache, 3, s)); /* event created and recorded */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_EVENT, 0, 1, TP_ERR_DEVICE));
    uint64_t t0 = gt_now(dev);
    CHECK_OK(tp_graph_cache_launch(cache, 3, s)); /* record fails: completion unknown */
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 4 * TEST_MiB);
    CHECK_OK(tp_graph_cache_evict(cache, 3));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_GE_U64(gt_now(dev), t0 + 600 * MS); /* both launches were waited for */
    CHECK_EQ_U64(gt_counters(dev).hazards, 0);
    CHECK_CACHE(cache);
    CHECK_POOL(pool);

    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_sim_graph_destroy(dev, gr));
    CHECK_OK(tp_pool_forget_stream(pool, s));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
}

/* One scripted workload with pins, updates, evictions and pressure, run with
 * a fault at every possible device call in turn: whatever fails, the cache
 * stays consistent, leaks no executable and no pin, and no launch ever
 * reads released memory. */
static int fail_at_n_run(uint64_t n, tp_status fault) {
    tp_device *dev = gt_open("sim:256MiB,graph_node_bytes=1MiB", NULL);
    tp_pool *pool = NULL;
    REQUIRE(tp_pool_create(dev, NULL, &pool) == TP_OK);
    tp_graph_cache *cache = NULL;
    tp_graph_cache_config cfg = {.max_execs = 4, .max_bytes = 24 * TEST_MiB, .idle_evict_ns = 500 * MS};
    REQUIRE(tp_graph_cache_create(dev, &cfg, &cache) == TP_OK);
    tp_graph_cache_attach_pool(cache, pool);
    tp_stream s1, s2;
    REQUIRE(tp_stream_create(dev, &s1) == TP_OK && tp_stream_create(dev, &s2) == TP_OK);
    tp_sim_inject_fault(dev, TP_SIM_OP_ANY, n, 1, fault);
    uint64_t before = gt_counters(dev).faults_injected;
    test_rng rng = {12345}; /* one workload; only the fault point moves */
    tp_graph graphs[32];
    size_t graph_count = 0;
    for (int step = 0; step < 24; step++) {
        uint64_t key = rng_below(&rng, 6);
        void *p = NULL;
        if (tp_pool_alloc(pool, (size_t)(1 + rng_below(&rng, 8)) * TEST_MiB, s1, &p) != TP_OK) p = NULL;
        tp_range r = {(uint64_t)(uintptr_t)p, 0};
        size_t sz = 0;
        if (p && tp_pool_block_size(pool, p, &sz) == TP_OK) r.bytes = sz;
        uint32_t nodes = (uint32_t)(2 + rng_below(&rng, 6));
        uint64_t duration = (1 + rng_below(&rng, 50)) * MS;
        tp_graph g = gt_graph_ranges(dev, nodes, key % 2, duration, p ? &r : NULL, p ? 1 : 0);
        if (graph_count < 32) graphs[graph_count++] = g;
        tp_graph_pins pins = {pool, &r, 1, false};
        tp_graph_cache_run(cache, key, g, p ? &pins : NULL, rng_below(&rng, 2) ? s1 : s2);
        if (p) tp_pool_free(pool, p, s1);
        switch (rng_below(&rng, 5)) {
        case 0: tp_graph_cache_evict(cache, rng_below(&rng, 6)); break;
        case 1: tp_sim_advance(dev, 200 * MS); tp_graph_cache_tick(cache); break;
        case 2: { /* pressure: the reclaim callback runs */
            void *big = NULL;
            if (tp_pool_alloc(pool, 200 * TEST_MiB, s2, &big) == TP_OK) tp_pool_free(pool, big, s2);
            break;
        }
        default: tp_graph_cache_launch(cache, rng_below(&rng, 6), s2); break;
        }
    }
    bool injected = gt_counters(dev).faults_injected > before;
    tp_sim_clear_faults(dev);
    CHECK_CACHE(cache);
    CHECK_POOL(pool);
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_MSG(st.execs == gt_sim_execs(dev), "n=%llu: cache has %llu execs, device %llu", (unsigned long long)n,
              (unsigned long long)st.execs, (unsigned long long)gt_sim_execs(dev));
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_MSG(gt_sim_execs(dev) == 0, "n=%llu: executables leaked", (unsigned long long)n);
    CHECK_MSG(gt_pool_stats(pool).pinned_bytes.current == 0, "n=%llu: pins leaked (%llu bytes)",
              (unsigned long long)n, (unsigned long long)gt_pool_stats(pool).pinned_bytes.current);
    tp_sim_counters ctr = gt_counters(dev);
    CHECK_MSG(ctr.hazards == 0 && ctr.invalid_accesses == 0, "n=%llu: hazards %llu invalid %llu",
              (unsigned long long)n, (unsigned long long)ctr.hazards, (unsigned long long)ctr.invalid_accesses);
    tp_pool_forget_stream(pool, s1);
    tp_pool_forget_stream(pool, s2);
    CHECK_OK(tp_pool_destroy(pool));
    for (size_t i = 0; i < graph_count; i++) tp_sim_graph_destroy(dev, graphs[i]);
    tp_device_synchronize(dev);
    tp_stream_destroy(dev, s1);
    tp_stream_destroy(dev, s2);
    CHECK_OK(tp_device_close(dev));
    return injected;
}

static void test_fail_at_n(void) {
    int runs = 0, injected = 0;
    for (uint64_t n = 0; n < 5000; n++) {
        int hit = fail_at_n_run(n, n % 3 == 0 ? TP_ERR_OUT_OF_MEMORY : TP_ERR_DEVICE);
        runs++;
        injected += hit;
        if (!hit) break; /* the fault point is past the workload: every point covered */
    }
    CHECK_GE_U64(injected, 50);
    printf("fail-at-N: %d runs, %d with a fault injected\n", runs, injected);
}

static void test_stats_json(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){0});
    tp_graph g = gt_graph(dev, 2, 1, 0), g2 = gt_graph(dev, 2, 1, 0);
    CHECK_OK(tp_graph_cache_run(cache, 1, g, NULL, TP_STREAM_DEFAULT));
    CHECK_OK(tp_graph_cache_run(cache, 1, g, NULL, TP_STREAM_DEFAULT));
    CHECK_OK(tp_graph_cache_run(cache, 1, g2, NULL, TP_STREAM_DEFAULT));
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g, NULL));
    CHECK_OK(tp_graph_cache_evict(cache, 2));
    char buf[1024];
    size_t len = 0;
    CHECK_OK(tp_graph_cache_stats_json(cache, buf, sizeof buf, &len));
    CHECK_EQ_U64(len, strlen(buf));
    const char *expect[] = {"{\"execs\":1,", "\"exec_bytes\":2097152,", "\"exec_bytes_peak\":4194304,",
                            "\"max_bytes\":268435456,", "\"max_execs\":64,", "\"hits\":1,", "\"updates\":1,",
                            "\"update_failures\":0,", "\"instantiations\":2,", "\"instantiate_failures\":0,",
                            "\"eager_fallbacks\":0,", "\"launches\":3,", "\"evictions_count\":0,",
                            "\"evictions_bytes\":0,", "\"evictions_idle\":0,", "\"evictions_pressure\":0,",
                            "\"evictions_explicit\":1,", "\"pinned_ranges\":0}"};
    for (size_t i = 0; i < sizeof expect / sizeof *expect; i++)
        CHECK_MSG(strstr(buf, expect[i]) != NULL, "missing %s in %s", expect[i], buf);
    CHECK_EQ_U64(buf[len - 1], '}');
    /* exactly len bytes do not fit (NUL), len + 1 do */
    char small[1024];
    size_t len2 = 0;
    CHECK_STATUS(tp_graph_cache_stats_json(cache, small, len, &len2), TP_ERR_BUFFER_TOO_SMALL);
    CHECK_EQ_U64(len2, len);
    CHECK_EQ_U64(small[len - 1], '\0');
    CHECK_OK(tp_graph_cache_stats_json(cache, small, len + 1, NULL));
    CHECK_EQ_STR(small, buf);
    tp_graph_cache_stats s = gt_stats(cache);
    CHECK_EQ_U64(s.execs, 1);
    CHECK_EQ_U64(s.hits, 1);
    CHECK_EQ_U64(s.updates, 1);
    CHECK_EQ_U64(s.launches, 3);
    CHECK_EQ_U64(s.instantiations, 2);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_sim_graph_destroy(dev, g2));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_device_close(dev));
}

/* A backend that does not report an executable's size (and one that cannot
 * even report free memory): the cache measures or estimates. */
static tp_status (*real_instantiate)(tp_device *, tp_graph, tpi_graph_exec *, uint64_t *);
static tp_status instantiate_unreported(tp_device *device, tp_graph graph, tpi_graph_exec *out_exec,
                                        uint64_t *out_bytes) {
    tp_status st = real_instantiate(device, graph, out_exec, out_bytes);
    if (st == TP_OK) *out_bytes = 0;
    return st;
}
static tp_status mem_info_broken(tp_device *device, uint64_t *out_free, uint64_t *out_total) {
    (void)device;
    (void)out_free;
    (void)out_total;
    return TP_ERR_DEVICE;
}

/* Points dev at a copy of its operations whose instantiate is fn (which
 * calls real_instantiate); returns the copy, for further changes. Undo by
 * restoring dev->ops. */
static tpi_device_ops *wrap_instantiate(tp_device *dev,
                                       tp_status (*fn)(tp_device *, tp_graph, tpi_graph_exec *, uint64_t *)) {
    static tpi_device_ops wrapped;
    wrapped = *dev->ops;
    real_instantiate = dev->ops->graph_instantiate;
    wrapped.graph_instantiate = fn;
    dev->ops = &wrapped;
    return &wrapped;
}

static void test_byte_estimate(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graph_node_bytes=1MiB", &log);
    const tpi_device_ops *real_ops = dev->ops;
    tpi_device_ops *wrapped = wrap_instantiate(dev, instantiate_unreported);

    /* measured: the drop of free device memory across the instantiation */
    tp_graph_cache *cache =
        make_cache(dev, (tp_graph_cache_config){.max_bytes = 12 * TEST_MiB, .idle_evict_ns = TP_NS_NEVER});
    tp_graph g5 = gt_graph(dev, 5, 1, 0);
    CHECK_OK(tp_graph_cache_prepare(cache, 1, g5, NULL));
    CHECK_MSG(gt_stats(cache).exec_bytes == 5 * TEST_MiB, "measured %llu",
              (unsigned long long)gt_stats(cache).exec_bytes);
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g5, NULL));
    CHECK_OK(tp_graph_cache_prepare(cache, 3, g5, NULL));
    tp_graph_cache_stats st = gt_stats(cache);
    CHECK_EQ_U64(st.execs, 2);
    CHECK_EQ_U64(st.exec_bytes, 10 * TEST_MiB);
    CHECK_EQ_U64(st.evictions_bytes, 1);
    CHECK_EQ_U64(gt_sim_exec_bytes(dev), 10 * TEST_MiB);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));

    /* not measurable: node_bytes_estimate per node of the template */
    wrapped->mem_info = mem_info_broken;
    cache = make_cache(dev, (tp_graph_cache_config){.node_bytes_estimate = 3 * TEST_MiB,
                                                    .idle_evict_ns = TP_NS_NEVER});
    CHECK_OK(tp_graph_cache_prepare(cache, 1, g5, NULL));
    CHECK_EQ_U64(gt_stats(cache).exec_bytes, 5 * 3 * TEST_MiB);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));

    dev->ops = real_ops;
    CHECK_OK(tp_sim_graph_destroy(dev, g5));
    CHECK_OK(tp_device_close(dev));
}

static void test_driver_pooled_graph_memory(void) {
    /* As on the H200: the driver keeps the memory of destroyed executables
     * and hands it to later ones, so an instantiation that reuses it shows
     * no drop in free memory. The cache must still count such executables
     * at their real size, or it admits more than the cap and the driver's
     * pool (the device memory graphs hold) grows past it. */
    test_log log = {0};
    tp_device *dev = gt_open("sim:8GiB,graph_node_bytes=64KiB,graphpool", &log);
    const uint64_t cap = 64 * TEST_MiB;
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.max_bytes = cap, .idle_evict_ns = TP_NS_NEVER});
    tp_sim_counters c;
    uint64_t pool_half = 0;
    for (int r = 0; r < 2000; r++) {
        uint32_t nodes = 50 + (uint32_t)((r * 37) % 201); /* 3.1 .. 15.6 MiB */
        tp_graph g = gt_graph(dev, nodes, 1000 + (uint64_t)r, 0);
        CHECK_OK(tp_graph_cache_prepare(cache, 1000 + (uint64_t)r, g, NULL));
        CHECK_OK(tp_graph_cache_launch(cache, 1000 + (uint64_t)r, TP_STREAM_DEFAULT));
        CHECK_OK(tp_sim_graph_destroy(dev, g));
        if (r == 999) {
            CHECK_OK(tp_sim_get_counters(dev, &c));
            pool_half = c.physical_used_bytes;
        }
    }
    CHECK_OK(tp_sim_get_counters(dev, &c));
    tp_graph_cache_stats st = gt_stats(cache);
    /* The live executables fit the cap by the device's own count ... */
    CHECK_MSG(c.graph_exec_bytes <= cap, "live executables hold %.1f MiB, cap %.0f MiB",
              c.graph_exec_bytes / (double)TEST_MiB, cap / (double)TEST_MiB);
    /* ... so the driver's pool stays within the cap plus one executable, and flat. */
    CHECK_MSG(c.physical_used_bytes <= cap + 16 * TEST_MiB, "graph memory grew to %.1f MiB",
              c.physical_used_bytes / (double)TEST_MiB);
    CHECK_EQ_U64(c.physical_used_bytes, pool_half);
    CHECK_GT_U64(st.evictions_bytes, 1000);
    CHECK_LE_U64(st.exec_bytes, cap);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_device_close(dev));
}

/* Churns new keys (50..250 nodes) through cache; returns the executables
 * alive at the end and the device's graph memory then. */
static uint64_t churn_new_keys(tp_device *dev, tp_graph_cache *cache, int requests, uint64_t *out_device_bytes) {
    for (int r = 0; r < requests; r++) {
        uint32_t nodes = 50 + (uint32_t)((r * 37) % 201);
        tp_graph g = gt_graph(dev, nodes, 5000 + (uint64_t)r, 0);
        tp_status st = tp_graph_cache_prepare(cache, 5000 + (uint64_t)r, g, NULL);
        CHECK_MSG(st == TP_OK || st == TP_ERR_RUN_EAGER, "request %d: %s", r, tp_status_name(st));
        CHECK_OK(tp_sim_graph_destroy(dev, g));
    }
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    *out_device_bytes = c.physical_used_bytes;
    return gt_stats(cache).execs;
}

static void test_byte_model_fixed_cost(void) {
    /* Executables that cost about the same whatever their node count (the
     * H200: ~8 MiB for 50..250 memset nodes), on a driver that pools graph
     * memory: the per-node model over-counts the larger ones, so the cache
     * holds fewer than its cap would allow -- but never more: the device
     * stays within the cap plus one executable. */
    test_log log = {0};
    tp_device *dev = gt_open("sim:8GiB,graph_node_bytes=1KiB,graph_exec_bytes=8MiB,graphpool", &log);
    const uint64_t cap = 64 * TEST_MiB;
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.max_bytes = cap, .idle_evict_ns = TP_NS_NEVER});
    uint64_t held = 0, execs = churn_new_keys(dev, cache, 500, &held);
    uint64_t counted = gt_stats(cache).exec_bytes, real = gt_sim_exec_bytes(dev);
    printf("  fixed cost 8 MiB, 64 MiB cap: %llu executables, counted %.1f MiB for %.1f MiB, device %.1f MiB\n",
           (unsigned long long)execs, counted / (double)TEST_MiB, real / (double)TEST_MiB, held / (double)TEST_MiB);
    CHECK_MSG(held <= cap + 9 * TEST_MiB, "graph memory %.1f MiB", held / (double)TEST_MiB);
    CHECK_GE_U64(execs, 1);
    CHECK_LE_U64(real, cap);
    CHECK_GE_U64(counted, real);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_device_close(dev));
}

static int inflated_left;
static tp_status instantiate_inflated(tp_device *device, tp_graph graph, tpi_graph_exec *out_exec,
                                      uint64_t *out_bytes) {
    tp_status st = real_instantiate(device, graph, out_exec, out_bytes);
    if (st == TP_OK && inflated_left > 0) {
        inflated_left--;
        *out_bytes = 512 * TEST_MiB; /* a one-time cost the driver charged to this one */
    }
    return st;
}

static void test_byte_model_outlier(void) {
    /* One instantiation that reported a huge cost (driver start-up, say)
     * makes the cache count big, then leaves the model after newer
     * measurements: the cache holds several executables again. */
    test_log log = {0};
    tp_device *dev = gt_open("sim:8GiB,graph_node_bytes=64KiB", &log);
    const tpi_device_ops *real_ops = dev->ops;
    wrap_instantiate(dev, instantiate_inflated);
    inflated_left = 1;
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.max_bytes = TPI_GiB, .idle_evict_ns = TP_NS_NEVER});
    uint64_t held = 0;
    churn_new_keys(dev, cache, 60, &held);
    /* 64 KiB/node, 50..250 nodes: 3..16 MiB each, about 100 fit in 1 GiB.
     * While the outlier was in the window, executables were counted at its
     * cost per node (some above the cap on their own: run eagerly); after
     * 16 newer measurements every one is cached and counted right. */
    tp_graph_cache_stats st = gt_stats(cache);
    printf("  outlier: %llu eager fallbacks, %llu executables alive after 60 requests\n",
           (unsigned long long)st.eager_fallbacks, (unsigned long long)st.execs);
    CHECK_MSG(st.eager_fallbacks <= 16, "%llu eager fallbacks", (unsigned long long)st.eager_fallbacks);
    /* (those counted big while it was in the window stay counted big until
     * evicted: ~30 alive, not ~45) */
    CHECK_MSG(st.execs >= 25, "%llu executables alive after the outlier", (unsigned long long)st.execs);
    uint64_t counted = gt_stats(cache).exec_bytes, real = gt_sim_exec_bytes(dev);
    CHECK_MSG(counted == real, "counted %.1f MiB for %.1f MiB", counted / (double)TEST_MiB, real / (double)TEST_MiB);
    dev->ops = real_ops;
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_device_close(dev));
}

/* A cached executable launched on a stream that captures is recorded into
 * the capture, not run. Its completion event must not be recorded there:
 * the cache queries that event later (a launch on another stream, evict,
 * tick), and querying an event recorded in a capture invalidates it. */
static void test_launch_into_a_capture_leaves_it_valid(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB", &log);
    tp_pool *pool = NULL;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.idle_evict_ns = TP_NS_NEVER});
    tp_stream s1, s2;
    CHECK_OK(tp_stream_create(dev, &s1));
    CHECK_OK(tp_stream_create(dev, &s2));
    void *a = alloc_or_die(pool, 4 * TEST_MiB, s1);
    tp_range ra = {(uint64_t)(uintptr_t)a, 4 * TEST_MiB};
    tp_graph g = gt_graph_ranges(dev, 10, 1, 100 * MS, &ra, 1);
    tp_graph_pins pa = {pool, &ra, 1, false};
    CHECK_OK(tp_graph_cache_run(cache, 1, g, &pa, s1)); /* runs until +100 ms */

    CHECK_OK(tp_sim_capture_begin(dev, s2));
    CHECK_OK(tp_graph_cache_launch(cache, 1, s2));     /* recorded into the capture */
    CHECK_OK(tp_graph_cache_launch(cache, 1, s1));     /* runs until +200 ms */
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_OK(tp_graph_cache_evict(cache, 1));
    tp_graph captured = NULL;
    CHECK_OK(tp_sim_capture_end(dev, s2, &captured));
    CHECK_EQ_U64(gt_counters(dev).captures_invalidated, 0);
    CHECK(captured != NULL);

    /* the pin still follows the launches that ran */
    CHECK_OK(tp_pool_free(pool, a, s1));
    CHECK_OK(tp_sim_advance(dev, 150 * MS));
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 4 * TEST_MiB);
    CHECK_OK(tp_sim_advance(dev, 60 * MS));
    CHECK_OK(tp_graph_cache_tick(cache));
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_EQ_U64(gt_stats(cache).pinned_ranges, 0);
    CHECK_EQ_U64(gt_counters(dev).hazards, 0);
    CHECK_CACHE(cache);
    CHECK_POOL(pool);
    CHECK_EQ_U64(log.errors, 0);

    CHECK_OK(tp_graph_cache_destroy(cache));
    if (captured) CHECK_OK(tp_sim_graph_destroy(dev, captured));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(dev, s1));
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK_OK(tp_device_close(dev));
}

/* The failed-launch tests' setup: a pool, a cache that never evicts when
 * idle, two streams, and key 1 prepared with a 100 ms graph that pins a
 * 4 MiB block allocated on s1. */
typedef struct failed_launch_env {
    test_log log;
    tp_device *dev;
    tp_pool *pool;
    tp_graph_cache *cache;
    tp_stream s1, s2;
    void *block;
    tp_range range;
    tp_graph g;
} failed_launch_env;

static void failed_launch_open(failed_launch_env *e) {
    memset(e, 0, sizeof *e);
    e->dev = gt_open("sim:1GiB", &e->log);
    CHECK_OK(tp_pool_create(e->dev, NULL, &e->pool));
    e->cache = make_cache(e->dev, (tp_graph_cache_config){.idle_evict_ns = TP_NS_NEVER});
    CHECK_OK(tp_stream_create(e->dev, &e->s1));
    CHECK_OK(tp_stream_create(e->dev, &e->s2));
    e->block = alloc_or_die(e->pool, 4 * TEST_MiB, e->s1);
    e->range = (tp_range){(uint64_t)(uintptr_t)e->block, 4 * TEST_MiB};
    e->g = gt_graph_ranges(e->dev, 10, 1, 100 * MS, &e->range, 1);
    tp_graph_pins pins = {e->pool, &e->range, 1, false};
    CHECK_OK(tp_graph_cache_prepare(e->cache, 1, e->g, &pins));
}

/* The next launch creates its event, then fails to record it, and then,
 * when stream_wait_fails, fails to wait for its stream: completion unknown. */
static void failed_launch_faults(failed_launch_env *e, bool stream_wait_fails) {
    CHECK_OK(tp_sim_inject_fault(e->dev, TP_SIM_OP_EVENT, 1, 1, TP_ERR_DEVICE));
    if (stream_wait_fails) CHECK_OK(tp_sim_inject_fault(e->dev, TP_SIM_OP_SYNC, 0, 1, TP_ERR_DEVICE));
}

static void failed_launch_close(failed_launch_env *e) {
    CHECK_OK(tp_graph_cache_destroy(e->cache));
    CHECK_OK(tp_sim_graph_destroy(e->dev, e->g));
    CHECK_OK(tp_pool_destroy(e->pool));
    CHECK_OK(tp_stream_destroy(e->dev, e->s1));
    CHECK_OK(tp_stream_destroy(e->dev, e->s2));
    CHECK_OK(tp_device_close(e->dev));
}

/* A launch whose completion event cannot be recorded: the cache waits for
 * the launch's stream at once. Left for eviction, the wait had to be a
 * device synchronisation, which invalidates any capture in progress on
 * another stream, fails, and leaves the executable's pins pinned for good. */
static void failed_event_record_spares_other_captures(bool stream_wait_fails) {
    failed_launch_env e;
    failed_launch_open(&e);
    failed_launch_faults(&e, stream_wait_fails);
    CHECK_OK(tp_graph_cache_launch(e.cache, 1, e.s1));
    CHECK_OK(tp_sim_clear_faults(e.dev));
    CHECK_OK(tp_pool_free(e.pool, e.block, e.s1));

    CHECK_OK(tp_sim_capture_begin(e.dev, e.s2));
    CHECK_OK(tp_graph_cache_evict(e.cache, 1));
    tp_graph captured = NULL;
    CHECK_OK(tp_sim_capture_end(e.dev, e.s2, &captured));
    CHECK_EQ_U64(gt_counters(e.dev).captures_invalidated, 0);
    CHECK_EQ_U64(gt_pool_stats(e.pool).pinned_bytes.current, 0);
    CHECK_EQ_U64(gt_stats(e.cache).pinned_ranges, 0);
    CHECK_EQ_U64(gt_counters(e.dev).hazards, 0);
    CHECK_EQ_U64(e.log.errors, 0);
    CHECK_CACHE(e.cache);
    CHECK_POOL(e.pool);
    if (captured) CHECK_OK(tp_sim_graph_destroy(e.dev, captured));
    failed_launch_close(&e);
}

static void test_failed_event_record_spares_other_captures(void) { failed_event_record_spares_other_captures(false); }

/* ... and when waiting for the stream fails too, completion is unknown:
 * eviction must then synchronise that stream, not the device, which would
 * invalidate a capture in progress on another stream (and, failing, leave
 * the pins pinned for good). */
static void test_unknown_completion_waits_for_its_stream_only(void) { failed_event_record_spares_other_captures(true); }

/* node_bytes_estimate is what an executable is counted at when the device
 * shows no cost (a driver that reuses the memory of destroyed executables).
 * A huge one must count executables big, not wrap: 2^63 per node times 2
 * nodes counted 0 bytes, and sums of UINT64_MAX-byte executables wrapped
 * exec_bytes to a few bytes. */
static void test_huge_node_estimate_does_not_wrap(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB,graphpool", &log);
    /* another cache leaves the driver's graph pool room for the next ones */
    tp_graph_cache *warm = make_cache(dev, (tp_graph_cache_config){0});
    tp_graph big = gt_graph(dev, 64, 99, MS);
    CHECK_OK(tp_graph_cache_prepare(warm, 1, big, NULL));
    CHECK_OK(tp_graph_cache_evict(warm, 1));
    static const uint64_t estimates[] = {1ull << 63, UINT64_MAX};
    for (size_t i = 0; i < 2; i++) {
        tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){
            .max_bytes = TP_BYTES_UNLIMITED, .node_bytes_estimate = estimates[i], .idle_evict_ns = TP_NS_NEVER});
        tp_graph g[3] = {gt_graph(dev, 2, 1, MS), gt_graph(dev, 1, 2, MS), gt_graph(dev, 3, 3, MS)};
        for (uint64_t k = 0; k < 3; k++) {
            CHECK_OK(tp_graph_cache_prepare(cache, k, g[k], NULL));
            tp_graph_cache_stats s = gt_stats(cache);
            CHECK_EQ_U64(s.execs, k + 1);
            /* counted at no less than the device holds, at most the device each */
            CHECK_GE_U64(s.exec_bytes, gt_sim_exec_bytes(dev));
            CHECK_LE_U64(s.exec_bytes, (k + 1) * TEST_GiB);
            CHECK_GE_U64(s.exec_bytes_peak, s.exec_bytes);
        }
        CHECK_CACHE(cache);
        CHECK_OK(tp_graph_cache_destroy(cache));
        for (int k = 0; k < 3; k++) CHECK_OK(tp_sim_graph_destroy(dev, g[k]));
    }
    CHECK_OK(tp_graph_cache_destroy(warm));
    CHECK_OK(tp_sim_graph_destroy(dev, big));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

/* A count cap as high as the type allows (UINT32_MAX, "no count cap" to a
 * caller) must not shrink what one executable is counted at: the byte
 * sums' guard against wrapping used to divide by max_execs + 2, which with
 * UINT32_MAX counted every executable at no more than 4 GiB, so max_bytes
 * let through executables the device could not hold. */
static void test_highest_count_cap_counts_large_executables(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:64GiB,graph_node_bytes=6GiB", &log); /* 6 GiB per node, reported */
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){
        .max_execs = UINT32_MAX, .max_bytes = 16 * TEST_GiB, .idle_evict_ns = TP_NS_NEVER});
    tp_graph_cache_stats s = gt_stats(cache);
    CHECK_EQ_U64(s.max_execs, 1u << 24); /* the highest cap the header names */
    tp_graph g[3] = {gt_graph(dev, 1, 1, MS), gt_graph(dev, 1, 2, MS), gt_graph(dev, 1, 3, MS)};
    CHECK_OK(tp_graph_cache_prepare(cache, 0, g[0], NULL));
    CHECK_EQ_U64(gt_stats(cache).exec_bytes, 6 * TEST_GiB);
    CHECK_OK(tp_graph_cache_prepare(cache, 1, g[1], NULL));
    CHECK_EQ_U64(gt_stats(cache).exec_bytes, 12 * TEST_GiB);
    /* a third would pass max_bytes: the least recent goes */
    CHECK_OK(tp_graph_cache_prepare(cache, 2, g[2], NULL));
    s = gt_stats(cache);
    CHECK_EQ_U64(s.execs, 2);
    CHECK_EQ_U64(s.exec_bytes, 12 * TEST_GiB);
    CHECK_CACHE(cache);
    CHECK_OK(tp_graph_cache_destroy(cache));
    for (int k = 0; k < 3; k++) CHECK_OK(tp_sim_graph_destroy(dev, g[k]));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

/* The header's way to let a pool go before the cache: evict the keys that
 * pin it, detach it, destroy it. An evicted key's pins wait for its last
 * launch in the cache's retired list; detach must release them (waiting for
 * that launch), or a later tick unpins them in the destroyed pool. */
static void test_detach_releases_retired_pins(void) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:1GiB", &log);
    tp_pool *pool = NULL;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.idle_evict_ns = TP_NS_NEVER});
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool));
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    void *a = alloc_or_die(pool, 4 * TEST_MiB, s);
    tp_range ra = {(uint64_t)(uintptr_t)a, 4 * TEST_MiB};
    tp_graph g = gt_graph_ranges(dev, 10, 1, 100 * MS, &ra, 1);
    tp_graph_pins pa = {pool, &ra, 1, false};
    CHECK_OK(tp_graph_cache_run(cache, 1, g, &pa, s));
    CHECK_OK(tp_pool_free(pool, a, s));
    CHECK_OK(tp_graph_cache_evict(cache, 1)); /* the launch still runs: its pin waits */
    CHECK_OK(tp_graph_cache_detach_pool(cache, pool));
    CHECK_EQ_U64(gt_stats(cache).pinned_ranges, 0);
    CHECK_EQ_U64(gt_pool_stats(pool).pinned_bytes.current, 0);
    CHECK_OK(tp_pool_forget_stream(pool, s));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_sim_advance(dev, 200 * MS));
    CHECK_OK(tp_graph_cache_tick(cache)); /* nothing of the pool left to touch */
    CHECK_CACHE(cache);
    CHECK_EQ_U64(gt_counters(dev).hazards, 0);
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
}

/* A launch whose completion the cache could not learn (its event not
 * recorded, its stream not waited for) stays unknown until the cache has
 * waited for the device: a later launch on another stream is not ordered
 * after it, so that one's event does not cover it. (It cleared the flag,
 * and the pins went when the later, shorter launch completed, while the
 * first still ran.) */
static void test_unknown_completion_is_not_covered_by_a_later_launch(void) {
    failed_launch_env e;
    failed_launch_open(&e);
    uint64_t t0 = gt_now(e.dev);
    /* the first launch: runs until t0 + 100 ms, nobody knows when */
    failed_launch_faults(&e, true);
    CHECK_OK(tp_graph_cache_launch(e.cache, 1, e.s1));
    CHECK_OK(tp_sim_clear_faults(e.dev));
    /* a shorter one on another stream (the update makes it 10 ms) */
    tp_graph g2 = gt_graph_ranges(e.dev, 10, 1, 10 * MS, &e.range, 1);
    CHECK_OK(tp_graph_cache_prepare(e.cache, 1, g2, NULL));
    CHECK_OK(tp_graph_cache_launch(e.cache, 1, e.s2));
    CHECK_OK(tp_pool_free(e.pool, e.block, e.s1));
    CHECK_OK(tp_graph_cache_evict(e.cache, 1));
    for (int i = 0; i < 10 && gt_pool_stats(e.pool).pinned_bytes.current; i++) {
        CHECK_OK(tp_sim_advance(e.dev, 20 * MS));
        CHECK_OK(tp_graph_cache_tick(e.cache));
    }
    CHECK_EQ_U64(gt_pool_stats(e.pool).pinned_bytes.current, 0);
    CHECK_MSG(gt_now(e.dev) >= t0 + 100 * MS, "pin released at +%llu ms, the first launch runs until +100 ms",
              (unsigned long long)((gt_now(e.dev) - t0) / MS));
    /* the block goes to another stream only once the first launch is done */
    tp_stream s3;
    CHECK_OK(tp_stream_create(e.dev, &s3));
    void *b = alloc_or_die(e.pool, 4 * TEST_MiB, s3);
    CHECK_OK(tp_pool_free(e.pool, b, s3));
    CHECK_EQ_U64(gt_counters(e.dev).hazards, 0);
    CHECK_CACHE(e.cache);
    CHECK_POOL(e.pool);
    e.log.errors = 0; /* the failed waits are logged */

    CHECK_OK(tp_sim_graph_destroy(e.dev, g2));
    CHECK_OK(tp_pool_forget_stream(e.pool, s3)); /* (a stream the pool knows goes only after it is forgotten) */
    CHECK_OK(tp_stream_destroy(e.dev, s3));
    failed_launch_close(&e);
}

/* Instantiation out of device memory while an attached pool holds idle
 * memory: the cache has nothing of its own to evict, so it has the pools
 * give their idle memory back and tries again, instead of answering "run
 * it eagerly" until that memory ages out (found by test_graph_fuzz's
 * author: one seed ran eagerly for every request). */
static void instantiate_trims_idle_pool_memory(tp_pool_kind kind) {
    test_log log = {0};
    tp_device *dev = gt_open("sim:256MiB,graph_node_bytes=1MiB", &log);
    tp_pool_config pc = {.kind = kind};
    tp_pool *pool = NULL;
    REQUIRE(tp_pool_create(dev, &pc, &pool) == TP_OK);
    tp_graph_cache *cache = make_cache(dev, (tp_graph_cache_config){.max_execs = 4});
    CHECK_OK(tp_graph_cache_attach_pool(cache, pool));
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    void *big = alloc_or_die(pool, 200 * TEST_MiB, s);
    CHECK_OK(tp_pool_free(pool, big, s));
    uint64_t idle_held = gt_pool_stats(pool).reserved_bytes.current;
    CHECK(idle_held >= 200 * TEST_MiB); /* kept, idle: nothing has aged yet */
    tp_graph g = gt_graph(dev, 100, 1, MS); /* 100 MiB: more than the device has free */
    CHECK_OK(tp_graph_cache_run(cache, 1, g, NULL, s));
    CHECK_EQ_U64(gt_stats(cache).execs, 1);
    CHECK(gt_pool_stats(pool).reserved_bytes.current < idle_held);
    void *again = alloc_or_die(pool, 64 * TEST_MiB, s); /* the pool still works */
    CHECK_OK(tp_pool_free(pool, again, s));
    CHECK_CACHE(cache);
    CHECK_POOL(pool);
    CHECK_EQ_U64(gt_counters(dev).hazards, 0);
    log.errors = 0;
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_device_close(dev));
}
static void test_instantiate_trims_idle_pool_memory_vmm(void) { instantiate_trims_idle_pool_memory(TP_POOL_VMM); }
static void test_instantiate_trims_idle_pool_memory_segment(void) {
    instantiate_trims_idle_pool_memory(TP_POOL_SEGMENT);
}

static const test_case tests[] = {
    TEST_CASE(test_create_refuses_bad_arguments),
    TEST_CASE(test_null_handles_are_refused),
    TEST_CASE(test_malformed_pins_instantiate_and_pin_nothing),
    TEST_CASE(test_unknown_keys_are_refused),
    TEST_CASE(test_attach_and_detach_pool_once),
    TEST_CASE(test_stats_json_sizing),
    TEST_CASE(test_destroy_removes_the_reclaim_callback),
    TEST_CASE(test_detach_inside_a_reclaim_round_is_refused),
    TEST_CASE(test_prepare_launch_hit_update),
    TEST_CASE(test_count_bound),
    TEST_CASE(test_byte_bound),
    TEST_CASE(test_segmented_lru),
    TEST_CASE(test_pins),
    TEST_CASE(test_destroy_with_live_pins),
    TEST_CASE(test_launch_into_a_capture_leaves_it_valid),
    TEST_CASE(test_failed_event_record_spares_other_captures),
    TEST_CASE(test_detach_releases_retired_pins),
    TEST_CASE(test_unknown_completion_is_not_covered_by_a_later_launch),
    TEST_CASE(test_faults),
    TEST_CASE(test_fail_at_n),
    TEST_CASE(test_stats_json),
    TEST_CASE(test_byte_estimate),
    TEST_CASE(test_driver_pooled_graph_memory),
    TEST_CASE(test_byte_model_fixed_cost),
    TEST_CASE(test_byte_model_outlier),
    TEST_CASE(test_unknown_completion_waits_for_its_stream_only),
    TEST_CASE(test_huge_node_estimate_does_not_wrap),
    TEST_CASE(test_highest_count_cap_counts_large_executables),
    TEST_CASE(test_instantiate_trims_idle_pool_memory_vmm),
    TEST_CASE(test_instantiate_trims_idle_pool_memory_segment),
};

int main(int argc, char **argv) { return TEST_MAIN("test_graph_cache", tests, argc, argv); }
