/* SPDX-License-Identifier: MIT */
/* Simulated stream capture: work launched on a capturing stream is recorded,
 * not run; tp_sim_capture_end makes a graph of it that runs (and is checked
 * for hazards) when launched; calls CUDA forbids during a capture invalidate
 * it. Also the device table's stream_capturing op. */
#include "fixture.h"
#include "internal.h"

#include <string.h>

static tp_device *open_sim(const char *spec, test_log *log) {
    tp_device_config cfg = {.log = test_log_fn, .log_user = log};
    tp_device *dev = NULL;
    REQUIRE(tp_device_open(spec, &cfg, &dev) == TP_OK);
    return dev;
}

static tp_sim_counters counters(tp_device *dev) {
    tp_sim_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(tp_sim_get_counters(dev, &c));
    return c;
}

static uint64_t now_of(tp_device *dev) {
    uint64_t now = 0;
    CHECK_OK(tp_sim_now(dev, &now));
    return now;
}

static tp_sim_capture_state state_of(tp_device *dev, tp_stream s) {
    tp_sim_capture_state state = (tp_sim_capture_state)-1;
    CHECK_OK(tp_sim_capture_status(dev, s, &state));
    return state;
}

static bool capturing_op(tp_device *dev, tp_stream s) {
    bool on = false;
    REQUIRE(dev->ops->stream_capturing != NULL);
    CHECK_OK(dev->ops->stream_capturing(dev, s, &on));
    return on;
}

static void test_kernels_during_capture_do_not_run(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream cs, other;
    CHECK_OK(tp_stream_create(dev, &cs));
    CHECK_OK(tp_stream_create(dev, &other));
    uint64_t buf;
    CHECK_OK(dev->ops->mem_alloc(dev, TEST_MiB, &buf));
    tp_range r = {buf, TEST_MiB};
    CHECK_EQ_U64(state_of(dev, cs), TP_SIM_CAPTURE_NONE);
    CHECK_FALSE(capturing_op(dev, cs));
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    CHECK_EQ_U64(state_of(dev, cs), TP_SIM_CAPTURE_ACTIVE);
    CHECK_TRUE(capturing_op(dev, cs));
    CHECK_FALSE(capturing_op(dev, other));
    CHECK_OK(tp_sim_launch(dev, cs, 1000, &r, 1));
    CHECK_OK(tp_sim_launch(dev, cs, 500, &r, 1));
    /* Nothing queued: no pending kernel, no hazard for another stream, and
     * freeing the memory is no hazard now (the graph is checked at launch). */
    tp_sim_counters c = counters(dev);
    CHECK_EQ_U64(c.pending_kernels, 0);
    CHECK_EQ_U64(dev->ops->check_handout(dev, buf, TEST_MiB, other), 0);
    tp_graph g = NULL;
    CHECK_OK(tp_sim_capture_end(dev, cs, &g));
    CHECK_NE_PTR(g, NULL);
    CHECK_EQ_U64(state_of(dev, cs), TP_SIM_CAPTURE_NONE);
    CHECK_FALSE(capturing_op(dev, cs));
    /* The stream's tail did not move: synchronising it takes no time. */
    CHECK_OK(tp_stream_synchronize(dev, cs));
    CHECK_EQ_U64(now_of(dev), 0);
    CHECK_OK(dev->ops->mem_free(dev, buf, TEST_MiB));
    c = counters(dev);
    CHECK_EQ_U64(c.hazards, 0);
    CHECK_EQ_U64(c.captures, 1);
    CHECK_EQ_U64(c.captures_invalidated, 0);
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_stream_destroy(dev, cs));
    CHECK_OK(tp_stream_destroy(dev, other));
    CHECK_OK(tp_device_close(dev));
}

static void test_captured_graph_runs_when_launched_and_is_checked(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    const tpi_device_ops *ops = dev->ops;
    tp_stream cs, run, other;
    CHECK_OK(tp_stream_create(dev, &cs));
    CHECK_OK(tp_stream_create(dev, &run));
    CHECK_OK(tp_stream_create(dev, &other));
    uint64_t a, b;
    CHECK_OK(ops->mem_alloc(dev, 16 * 4096, &a));
    CHECK_OK(ops->mem_alloc(dev, 16 * 4096, &b));
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    /* a: two adjacent ranges (merged); b: two overlapping ones with a hole
     * before the rest of b; an empty range (dropped). */
    tp_range k1[] = {{a, 4096}, {b, 4096}};
    tp_range k2[] = {{a + 4096, 4096}, {b + 2048, 4096}, {b + 8 * 4096, 0}};
    tp_range k3[] = {{b + 8 * 4096, 4096}};
    CHECK_OK(tp_sim_launch(dev, cs, 100, k1, 2));
    CHECK_OK(tp_sim_launch(dev, cs, 200, k2, 3));
    CHECK_OK(tp_sim_launch(dev, cs, 300, k3, 1));
    tp_graph g = NULL;
    CHECK_OK(tp_sim_capture_end(dev, cs, &g));
    REQUIRE(g != NULL);
    CHECK_EQ_U64(ops->graph_node_count(dev, g), 3);
    CHECK_EQ_U64(counters(dev).pending_kernels, 0);

    tpi_graph_exec x;
    uint64_t bytes;
    CHECK_OK(ops->graph_instantiate(dev, g, &x, &bytes));
    CHECK_OK(ops->graph_launch(dev, x, run));
    tp_sim_counters c = counters(dev);
    CHECK_EQ_U64(c.pending_kernels, 1);
    CHECK_EQ_U64(c.invalid_accesses, 0);
    /* The union of the ranges, and nothing else, is in use. */
    CHECK_EQ_U64(ops->check_handout(dev, a, 2 * 4096, other), 1);
    CHECK_EQ_U64(ops->check_handout(dev, a + 2 * 4096, 4096, other), 0);
    CHECK_EQ_U64(ops->check_handout(dev, b + 6144 - 1, 1, other), 1);
    CHECK_EQ_U64(ops->check_handout(dev, b + 6144, 8 * 4096 - 6144, other), 0);
    CHECK_EQ_U64(ops->check_handout(dev, b + 8 * 4096, 1, other), 1);
    /* It lasts the sum of the kernels' durations. */
    tp_event e;
    CHECK_OK(tp_event_create(dev, &e));
    CHECK_OK(tp_event_record(dev, e, run));
    CHECK_STATUS(tp_event_query(dev, e), TP_NOT_READY);
    CHECK_OK(tp_sim_advance(dev, 599));
    CHECK_STATUS(tp_event_query(dev, e), TP_NOT_READY);
    CHECK_OK(tp_sim_advance(dev, 1));
    CHECK_OK(tp_event_query(dev, e));
    /* Launched again, freeing under it is a hazard. */
    CHECK_OK(ops->graph_launch(dev, x, run));
    CHECK_OK(ops->mem_free(dev, a, 16 * 4096));
    c = counters(dev);
    CHECK_EQ_U64(c.hazards_free, 1);
    CHECK_EQ_U64(c.hazards_handout, 3);
    CHECK_OK(tp_stream_synchronize(dev, run));
    CHECK_EQ_U64(now_of(dev), 1200);
    CHECK_OK(ops->mem_free(dev, b, 16 * 4096));
    CHECK_OK(ops->graph_destroy(dev, x));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_stream_destroy(dev, cs));
    CHECK_OK(tp_stream_destroy(dev, run));
    CHECK_OK(tp_stream_destroy(dev, other));
    CHECK_OK(tp_device_close(dev));
}

static void test_same_kernel_sequence_same_topology(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream cs;
    CHECK_OK(tp_stream_create(dev, &cs));
    uint64_t buf;
    CHECK_OK(dev->ops->mem_alloc(dev, 8192, &buf));
    tp_range r1 = {buf, 4096}, r2 = {buf + 4096, 4096};
    tp_graph g[3] = {NULL, NULL, NULL};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(tp_sim_capture_begin(dev, cs));
        CHECK_OK(tp_sim_launch(dev, cs, 10 * (uint64_t)(i + 1), i == 1 ? &r2 : &r1, 1));
        CHECK_OK(tp_sim_launch(dev, cs, 10, &r1, 1));
        if (i == 2) CHECK_OK(tp_sim_launch(dev, cs, 10, &r1, 1)); /* one more node */
        CHECK_OK(tp_sim_capture_end(dev, cs, &g[i]));
    }
    tpi_graph_exec x;
    uint64_t bytes;
    CHECK_OK(dev->ops->graph_instantiate(dev, g[0], &x, &bytes));
    CHECK_OK(dev->ops->graph_update(dev, x, g[1]));                             /* other parameters */
    CHECK_STATUS(dev->ops->graph_update(dev, x, g[2]), TP_ERR_TOPOLOGY_MISMATCH); /* other nodes */
    /* An executable launched on a capturing stream is recorded as its nodes. */
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    CHECK_OK(dev->ops->graph_launch(dev, x, cs));
    CHECK_EQ_U64(counters(dev).pending_kernels, 0);
    tp_graph nested = NULL;
    CHECK_OK(tp_sim_capture_end(dev, cs, &nested));
    CHECK_EQ_U64(dev->ops->graph_node_count(dev, nested), 2);
    CHECK_OK(tp_sim_graph_destroy(dev, nested));
    /* An empty capture is an empty graph. */
    tp_graph empty = NULL;
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    CHECK_OK(tp_sim_capture_end(dev, cs, &empty));
    CHECK_NE_PTR(empty, NULL);
    CHECK_EQ_U64(dev->ops->graph_node_count(dev, empty), 0);
    CHECK_OK(tp_sim_graph_destroy(dev, empty));
    CHECK_OK(dev->ops->graph_destroy(dev, x));
    for (int i = 0; i < 3; i++) CHECK_OK(tp_sim_graph_destroy(dev, g[i]));
    CHECK_OK(dev->ops->mem_free(dev, buf, 8192));
    CHECK_OK(tp_stream_destroy(dev, cs));
    CHECK_OK(tp_device_close(dev));
}

static void test_record_and_wait_event_during_capture_are_legal(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream cs, other;
    CHECK_OK(tp_stream_create(dev, &cs));
    CHECK_OK(tp_stream_create(dev, &other));
    uint64_t buf;
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &buf));
    tp_range r = {buf, 4096};
    tp_event outside, inside;
    CHECK_OK(tp_event_create(dev, &outside));
    CHECK_OK(tp_event_create(dev, &inside));
    CHECK_OK(tp_sim_launch(dev, other, 100, &r, 1));
    CHECK_OK(tp_event_record(dev, outside, other));
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    CHECK_OK(tp_sim_launch(dev, cs, 50, &r, 1));
    CHECK_OK(tp_event_record(dev, inside, cs));
    CHECK_OK(tp_stream_wait_event(dev, cs, inside)); /* its own capture's event */
    CHECK_STATUS(tp_event_query(dev, outside), TP_NOT_READY); /* not a capture's event: fine */
    tp_graph g = NULL;
    CHECK_OK(tp_sim_capture_end(dev, cs, &g));
    CHECK_EQ_U64(counters(dev).captures_invalidated, 0);
    /* After the capture, the event recorded in it is an ordinary event
     * again (never really recorded: complete). */
    CHECK_OK(tp_event_query(dev, inside));
    CHECK_OK(tp_event_synchronize(dev, inside));
    CHECK_EQ_U64(now_of(dev), 0);
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_EQ_U64(now_of(dev), 100);
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_event_destroy(dev, outside));
    CHECK_OK(tp_event_destroy(dev, inside));
    CHECK_OK(dev->ops->mem_free(dev, buf, 4096));
    CHECK_EQ_U64(counters(dev).hazards, 0);
    CHECK_OK(tp_stream_destroy(dev, cs));
    CHECK_OK(tp_stream_destroy(dev, other));
    CHECK_OK(tp_device_close(dev));
}

/* What each illegal call does to an active capture on cs. */
typedef enum {
    BY_STREAM_SYNC,
    BY_DEVICE_SYNC,
    BY_EVENT_QUERY,
    BY_EVENT_SYNC,
    BY_OTHER_STREAM_WAIT,
    BY_WAIT_ON_OUTSIDE_EVENT, /* CUDA: invalid without cudaEventWaitExternal */
    BY_DESTROY
} by;

static void invalidate_by(by how) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream cs, other;
    CHECK_OK(tp_stream_create(dev, &cs));
    CHECK_OK(tp_stream_create(dev, &other));
    uint64_t buf;
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &buf));
    tp_range r = {buf, 4096};
    tp_event e, outside;
    CHECK_OK(tp_event_create(dev, &e));
    CHECK_OK(tp_event_create(dev, &outside));
    CHECK_OK(tp_sim_launch(dev, other, 100, &r, 1));
    CHECK_OK(tp_event_record(dev, outside, other));
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    CHECK_OK(tp_sim_launch(dev, cs, 100, &r, 1));
    CHECK_OK(tp_event_record(dev, e, cs));
    int warnings = log.warnings;
    switch (how) {
    case BY_STREAM_SYNC: CHECK_STATUS(tp_stream_synchronize(dev, cs), TP_ERR_CAPTURE); break;
    case BY_DEVICE_SYNC: CHECK_STATUS(tp_device_synchronize(dev), TP_ERR_CAPTURE); break;
    case BY_EVENT_QUERY: CHECK_STATUS(tp_event_query(dev, e), TP_ERR_CAPTURE); break;
    case BY_EVENT_SYNC: CHECK_STATUS(tp_event_synchronize(dev, e), TP_ERR_CAPTURE); break;
    case BY_OTHER_STREAM_WAIT: CHECK_STATUS(tp_stream_wait_event(dev, other, e), TP_ERR_CAPTURE); break;
    case BY_WAIT_ON_OUTSIDE_EVENT: CHECK_STATUS(tp_stream_wait_event(dev, cs, outside), TP_ERR_CAPTURE); break;
    case BY_DESTROY: CHECK_OK(tp_stream_destroy(dev, cs)); break;
    }
    CHECK_EQ_U64(counters(dev).captures_invalidated, 1);
    CHECK_EQ_I64(log.warnings, warnings + 1); /* said once */
    if (how != BY_DESTROY) {
        CHECK_EQ_U64(state_of(dev, cs), TP_SIM_CAPTURE_INVALIDATED);
        CHECK_TRUE(capturing_op(dev, cs)); /* still hands off for the pool */
        /* Every later op on the stream fails; other streams are unaffected. */
        CHECK_STATUS(tp_sim_launch(dev, cs, 1, &r, 1), TP_ERR_CAPTURE);
        CHECK_STATUS(tp_event_record(dev, e, cs), TP_ERR_CAPTURE);
        CHECK_STATUS(tp_stream_wait_event(dev, cs, e), TP_ERR_CAPTURE);
        CHECK_STATUS(tp_stream_synchronize(dev, cs), TP_ERR_CAPTURE);
        CHECK_STATUS(tp_sim_capture_begin(dev, cs), TP_ERR_CAPTURE);
        CHECK_OK(tp_sim_launch(dev, other, 1, &r, 1));
        CHECK_EQ_U64(counters(dev).captures_invalidated, 1); /* counted once */
        tp_graph g = (tp_graph)0x1;
        CHECK_STATUS(tp_sim_capture_end(dev, cs, &g), TP_ERR_CAPTURE);
        CHECK_EQ_PTR(g, NULL);
        /* end left capture mode: the stream works again. */
        CHECK_EQ_U64(state_of(dev, cs), TP_SIM_CAPTURE_NONE);
        CHECK_OK(tp_sim_launch(dev, cs, 10, &r, 1));
        CHECK_OK(tp_stream_synchronize(dev, cs));
        CHECK_OK(tp_stream_destroy(dev, cs));
    }
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_event_destroy(dev, outside));
    CHECK_OK(dev->ops->mem_free(dev, buf, 4096));
    CHECK_OK(tp_stream_destroy(dev, other));
    CHECK_EQ_U64(counters(dev).hazards, 0);
    CHECK_OK(tp_device_close(dev));
}

static void test_stream_sync_invalidates(void) { invalidate_by(BY_STREAM_SYNC); }
static void test_device_sync_invalidates(void) { invalidate_by(BY_DEVICE_SYNC); }
static void test_event_query_invalidates(void) { invalidate_by(BY_EVENT_QUERY); }
static void test_event_sync_invalidates(void) { invalidate_by(BY_EVENT_SYNC); }
static void test_other_stream_waiting_invalidates(void) { invalidate_by(BY_OTHER_STREAM_WAIT); }
static void test_waiting_on_an_outside_event_invalidates(void) { invalidate_by(BY_WAIT_ON_OUTSIDE_EVENT); }
static void test_destroying_the_stream_invalidates(void) { invalidate_by(BY_DESTROY); }

static void test_begin_end_misuse(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream cs;
    CHECK_OK(tp_stream_create(dev, &cs));
    tp_graph g = NULL;
    tp_sim_capture_state state;
    CHECK_STATUS(tp_sim_capture_end(dev, cs, &g), TP_ERR_CAPTURE); /* not capturing */
    CHECK_STATUS(tp_sim_capture_begin(dev, TP_STREAM_DEFAULT), TP_ERR_CAPTURE);
    CHECK_OK(tp_sim_capture_begin(dev, cs));
    CHECK_STATUS(tp_sim_capture_begin(dev, cs), TP_ERR_CAPTURE); /* already */
    CHECK_STATUS(tp_sim_capture_end(dev, cs, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_EQ_U64(state_of(dev, cs), TP_SIM_CAPTURE_ACTIVE); /* that did not end it */
    CHECK_STATUS(tp_sim_capture_status(dev, cs, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_capture_status(dev, (tp_stream)(uintptr_t)40, &state), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_capture_begin(NULL, cs), TP_ERR_INVALID_ARGUMENT);
    /* A recorded duration sum past 2^64 is refused, not wrapped. */
    CHECK_OK(tp_sim_launch(dev, cs, UINT64_MAX - 5, NULL, 0));
    CHECK_STATUS(tp_sim_launch(dev, cs, 6, NULL, 0), TP_ERR_INVALID_ARGUMENT);
    tp_range wrapping = {UINT64_MAX - 10, 100};
    CHECK_STATUS(tp_sim_launch(dev, cs, 1, &wrapping, 1), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_sim_capture_end(dev, cs, &g));
    CHECK_EQ_U64(dev->ops->graph_node_count(dev, g), 1);
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    /* Other backends: not supported. */
    tpi_device_ops other_ops = {.backend = "cuda"};
    tp_device other = {.ops = &other_ops};
    CHECK_STATUS(tp_sim_capture_begin(&other, cs), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(tp_sim_capture_end(&other, cs, &g), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(tp_sim_capture_status(&other, cs, &state), TP_ERR_UNSUPPORTED);
    CHECK_EQ_U64(counters(dev).captures_invalidated, 0);
    CHECK_OK(tp_stream_destroy(dev, cs));
    CHECK_OK(tp_device_close(dev));
}

/* A pool allocating during a capture, the graph launched later through the
 * graph cache with the captured blocks pinned: no hazard, nothing
 * invalidated, all memory back at the end. */
static void capture_with_pool(tp_pool_kind kind) {
    fixture f;
    fixture_open(&f, "sim:1GiB", kind, NULL);
    tp_stream cs;
    CHECK_OK(tp_stream_create(f.dev, &cs));
    CHECK_OK(tp_pool_capture_begin(f.pool, cs));
    CHECK_OK(tp_sim_capture_begin(f.dev, cs));
    void *p = NULL, *q = NULL;
    CHECK_OK(tp_pool_alloc(f.pool, 3 * TEST_MiB, cs, &p));
    CHECK_OK(tp_pool_alloc(f.pool, 4096, cs, &q));
    tp_range used[] = {{(uint64_t)(uintptr_t)p, 3 * TEST_MiB}, {(uint64_t)(uintptr_t)q, 4096}};
    CHECK_OK(tp_sim_launch(f.dev, cs, 1000, used, 2));
    CHECK_OK(tp_pool_free(f.pool, q, cs));
    tp_range *ranges = NULL;
    size_t count = 0;
    CHECK_OK(tp_pool_capture_end(f.pool, cs, &ranges, &count));
    tp_graph g = NULL;
    CHECK_OK(tp_sim_capture_end(f.dev, cs, &g));
    CHECK_OK(tp_pool_free(f.pool, p, cs));

    tp_graph_cache *cache = NULL;
    CHECK_OK(tp_graph_cache_create(f.dev, NULL, &cache));
    tp_graph_pins pins = {.pool = f.pool, .ranges = ranges, .count = count, .already_pinned = true};
    CHECK_OK(tp_graph_cache_run(cache, 42, g, &pins, cs));
    tp_sim_counters c = counters(f.dev);
    CHECK_EQ_U64(c.pending_kernels, 1);
    CHECK_EQ_U64(c.captures_invalidated, 0);
    tp_pool_free_ranges(f.pool, ranges);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_sim_graph_destroy(f.dev, g));
    CHECK_OK(tp_stream_synchronize(f.dev, cs));
    CHECK_OK(tp_pool_forget_stream(f.pool, cs));
    CHECK_OK(tp_stream_destroy(f.dev, cs));
    fixture_close(&f);
}
KIND_TEST(capture_with_pool)

static const test_case tests[] = {
    TEST_CASE(test_kernels_during_capture_do_not_run),
    TEST_CASE(test_captured_graph_runs_when_launched_and_is_checked),
    TEST_CASE(test_same_kernel_sequence_same_topology),
    TEST_CASE(test_record_and_wait_event_during_capture_are_legal),
    TEST_CASE(test_stream_sync_invalidates),
    TEST_CASE(test_device_sync_invalidates),
    TEST_CASE(test_event_query_invalidates),
    TEST_CASE(test_event_sync_invalidates),
    TEST_CASE(test_other_stream_waiting_invalidates),
    TEST_CASE(test_waiting_on_an_outside_event_invalidates),
    TEST_CASE(test_destroying_the_stream_invalidates),
    TEST_CASE(test_begin_end_misuse),
    KIND_CASES(capture_with_pool),
};

int main(int argc, char **argv) { return TEST_MAIN("test_sim_capture", tests, argc, argv); }
