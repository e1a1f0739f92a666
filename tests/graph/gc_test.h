/* SPDX-License-Identifier: MIT */
/*
 * gc_test.h -- helpers shared by the graph cache tests, on top of the
 * shared harness (check.h, fixture.h). A failure to open the device or build
 * a graph ends the current test (REQUIRE), not the whole suite.
 */
#ifndef TIDEPOOL_GC_TEST_H
#define TIDEPOOL_GC_TEST_H

#include "fixture.h"

#include <string.h>

/* The cache's invariant checker (graph_cache.c; not in the public header). */

#define CHECK_CACHE(cache)                                                  \
    do {                                                                    \
        char check_msg_[256];                                               \
        tp_status check_st_ = tp_graph_cache_check((cache), check_msg_, sizeof check_msg_); \
        CHECK_MSG(check_st_ == TP_OK, "cache invariant: %s", check_msg_);   \
    } while (0)

#define CHECK_POOL(pool)                                                    \
    do {                                                                    \
        char check_msg_[256];                                               \
        tp_status check_st_ = tp_pool_check((pool), check_msg_, sizeof check_msg_); \
        CHECK_MSG(check_st_ == TP_OK, "pool invariant: %s", check_msg_);    \
    } while (0)

#define MS 1000000ull
#define SEC 1000000000ull

static inline tp_device *gt_open(const char *spec, test_log *log) {
    tp_device_config cfg = {.log = test_log_fn, .log_user = log, .log_level = TP_LOG_DEBUG};
    tp_device *dev = NULL;
    tp_status st = tp_device_open(spec, log ? &cfg : NULL, &dev);
    if (st != TP_OK) fprintf(stderr, "tp_device_open(%s): %s\n", spec, tp_status_name(st));
    REQUIRE(st == TP_OK);
    return dev;
}

static inline tp_graph gt_graph_ranges(tp_device *dev, uint32_t nodes, uint64_t topology, uint64_t duration_ns,
                                       const tp_range *ranges, size_t range_count) {
    tp_sim_graph_desc desc = {.node_count = nodes, .topology_id = topology, .duration_ns = duration_ns,
                              .ranges = ranges, .range_count = range_count};
    tp_graph g = NULL;
    tp_status st = tp_sim_graph_create(dev, &desc, &g);
    if (st != TP_OK) fprintf(stderr, "tp_sim_graph_create: %s\n", tp_status_name(st));
    REQUIRE(st == TP_OK);
    return g;
}

static inline tp_graph gt_graph(tp_device *dev, uint32_t nodes, uint64_t topology, uint64_t duration_ns) {
    return gt_graph_ranges(dev, nodes, topology, duration_ns, NULL, 0);
}

static inline tp_graph_cache_stats gt_stats(tp_graph_cache *cache) {
    tp_graph_cache_stats s;
    memset(&s, 0, sizeof s);
    tp_status st = tp_graph_cache_get_stats(cache, &s);
    if (st != TP_OK) fprintf(stderr, "tp_graph_cache_get_stats: %s\n", tp_status_name(st));
    return s;
}

static inline tp_sim_counters gt_counters(tp_device *dev) {
    tp_sim_counters c;
    memset(&c, 0, sizeof c);
    tp_sim_get_counters(dev, &c);
    return c;
}

static inline tp_pool_stats gt_pool_stats(tp_pool *pool) {
    tp_pool_stats s;
    memset(&s, 0, sizeof s);
    tp_pool_get_stats(pool, &s);
    return s;
}

static inline uint64_t gt_now(tp_device *dev) {
    uint64_t now = 0;
    tp_sim_now(dev, &now);
    return now;
}

/* Device bytes the simulator says graph executables hold, and how many. */
static inline uint64_t gt_sim_exec_bytes(tp_device *dev) { return gt_counters(dev).graph_exec_bytes; }
static inline uint64_t gt_sim_execs(tp_device *dev) { return gt_counters(dev).graph_execs; }

#endif
