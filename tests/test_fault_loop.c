/* SPDX-License-Identifier: MIT */
/* Fault injection: the Nth device call fails (for one call, then for three
 * in a row), for N = 1, 2, ... until the workload runs without the fault
 * firing. Every run must end with clean statuses (only the documented ones),
 * the pool's invariants intact, the pool still usable, no hazard, and no
 * device memory leaked once the pool is destroyed. */
#include "check.h"

#include <string.h>

typedef struct run_result {
    int faults_fired;
    int failed_ops;
} run_result;

static bool allowed(tp_status st) {
    return st == TP_OK || st == TP_ERR_OUT_OF_MEMORY || st == TP_ERR_DEVICE;
}

/* The workload: allocations of many sizes on two streams, kernels, frees in
 * mixed order, a cross-stream reuse, trim, tick, and an allocation beyond
 * what is idle so the out-of-memory ladder runs. */
static run_result run_once(tp_pool_kind kind, uint64_t fail_at, uint64_t fail_count) {
    run_result result = {0, 0};
    test_log log = {0};
    tp_device_config dc = {.log = test_log_fn, .log_user = &log};
    tp_device *dev;
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:1GiB" : "sim:1GiB,novmm", &dc, &dev) == TP_OK);
    tp_stream s2;
    REQUIRE(tp_stream_create(dev, &s2) == TP_OK);
    if (fail_at) CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_ANY, fail_at - 1, fail_count, TP_ERR_DEVICE));
    tp_pool_config pc = {.kind = kind, .limit_bytes = 512 * TEST_MiB, .release_threshold_bytes = 8 * TEST_MiB,
                         .idle_release_ns = 1000000, .flags = TP_POOL_FLAG_CHECK_INVARIANTS};
    tp_pool *pool = NULL;
    tp_status st = tp_pool_create(dev, &pc, &pool);
    CHECK_MSG(allowed(st), "create: %s", tp_status_name(st));
    if (st != TP_OK) {
        /* The pool could not even be made: nothing may be left behind. */
        result.failed_ops++;
        tp_sim_counters c;
        CHECK_OK(tp_sim_get_counters(dev, &c));
        result.faults_fired = (int)c.faults_injected;
        CHECK_EQ_U64(c.physical_used_bytes, 0);
        CHECK_OK(tp_stream_destroy(dev, s2));
        CHECK_OK(tp_device_close(dev));
        return result;
    }
    void *live[32] = {0};
    tp_stream live_stream[32];
    const uint64_t sizes[] = {1000, 3 * TEST_MiB, 40 * TEST_MiB, 64 * 1024, 100 * TEST_MiB, 700, 12 * TEST_MiB};
    test_rng rng = {77};
    for (int op = 0; op < 60; op++) {
        int k = (int)rng_below(&rng, 32);
        tp_stream s = rng_below(&rng, 2) ? s2 : TP_STREAM_DEFAULT;
        if (!live[k]) {
            uint64_t bytes = sizes[rng_below(&rng, sizeof sizes / sizeof *sizes)];
            st = tp_pool_alloc(pool, bytes, s, &live[k]);
            CHECK_MSG(allowed(st), "alloc: %s", tp_status_name(st));
            if (st != TP_OK) {
                result.failed_ops++;
                CHECK_EQ_PTR(live[k], NULL);
                continue;
            }
            live_stream[k] = s;
            tp_range r = {(uint64_t)(uintptr_t)live[k], bytes};
            st = tp_sim_launch(dev, s, rng_below(&rng, 100000), &r, 1);
            CHECK_OK(st);
        } else {
            st = tp_pool_free(pool, live[k], live_stream[k]);
            CHECK_MSG(st == TP_OK, "free: %s", tp_status_name(st)); /* frees never need the device */
            live[k] = NULL;
        }
        if (op % 7 == 0) CHECK_OK(tp_sim_advance(dev, 40000));
        if (op % 13 == 0) {
            uint64_t released;
            CHECK_OK(tp_pool_trim(pool, 0, &released));
        }
        if (op % 17 == 0) CHECK_OK(tp_pool_tick(pool));
    }
    /* More than what is idle: the ladder runs (release, sync, retry). */
    void *big = NULL;
    st = tp_pool_alloc(pool, 300 * TEST_MiB, TP_STREAM_DEFAULT, &big);
    CHECK_MSG(allowed(st), "big alloc: %s", tp_status_name(st));
    if (st != TP_OK) result.failed_ops++;

    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    result.faults_fired = (int)c.faults_injected;
    CHECK_OK(tp_sim_clear_faults(dev));

    /* Still usable, invariants intact. */
    void *probe = NULL;
    CHECK_OK(tp_pool_alloc(pool, 5 * TEST_MiB, s2, &probe));
    CHECK_OK(tp_pool_free(pool, probe, s2));
    if (big) CHECK_OK(tp_pool_free(pool, big, TP_STREAM_DEFAULT));
    for (int k = 0; k < 32; k++)
        if (live[k]) CHECK_OK(tp_pool_free(pool, live[k], live_stream[k]));
    char msg[256] = "";
    st = tp_pool_check(pool, msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "fail_at %llu: %s", (unsigned long long)fail_at, msg);
    CHECK_OK(tp_pool_forget_stream(pool, s2));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_MSG(c.physical_used_bytes == 0, "fail_at %llu: %llu bytes leaked", (unsigned long long)fail_at,
              (unsigned long long)c.physical_used_bytes);
    CHECK_MSG(c.hazards == 0 && c.invalid_accesses == 0, "fail_at %llu: %llu hazards", (unsigned long long)fail_at,
              (unsigned long long)c.hazards);
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK_OK(tp_device_close(dev));
    return result;
}

/* Faults at call n, for n = 1, 2, ... until the workload makes fewer than n
 * calls, each failing `count` calls in a row. */
static void fault_loop(tp_pool_kind kind, uint64_t count) {
    /* Without faults the workload may meet its pool limit (the big
     * allocation): that count is the baseline. */
    run_result clean = run_once(kind, 0, 0);
    CHECK_EQ_U64(clean.faults_fired, 0);
    uint64_t n = 1;
    int runs = 0, failing_runs = 0;
    for (;; n++) {
        run_result r = run_once(kind, n, count);
        runs++;
        failing_runs += r.failed_ops > clean.failed_ops;
        if (r.faults_fired == 0) break; /* the workload made fewer than n calls */
        if (check_failures > 20 || n > 5000) break;
    }
    printf("  %s, %llu failing call(s): %d runs (faults at calls 1..%llu), %d saw more operations fail "
           "cleanly than without faults\n",
           kind == TP_POOL_VMM ? "vmm" : "segment", (unsigned long long)count, runs, (unsigned long long)(n - 1),
           failing_runs);
    CHECK_GT_I64(runs, 20);         /* the workload really makes device calls */
    CHECK_GT_I64(failing_runs, 0);  /* and some injected faults really surfaced */
}

static void one_failing_call_vmm(void) { fault_loop(TP_POOL_VMM, 1); }
static void three_failing_calls_vmm(void) { fault_loop(TP_POOL_VMM, 3); }
static void one_failing_call_segment(void) { fault_loop(TP_POOL_SEGMENT, 1); }
static void three_failing_calls_segment(void) { fault_loop(TP_POOL_SEGMENT, 3); }

static const test_case tests[] = {
    TEST_CASE(one_failing_call_vmm),
    TEST_CASE(three_failing_calls_vmm),
    TEST_CASE(one_failing_call_segment),
    TEST_CASE(three_failing_calls_segment),
};

int main(int argc, char **argv) { return TEST_MAIN("test_fault_loop", tests, argc, argv); }
