/* SPDX-License-Identifier: MIT */
/* The failure modes (docs/failure-modes.md) that concern pools, each with
 * the invariant it must keep, on both pool kinds:
 *   1 monotonic growth, 2 more sizes than slots, 3 OOM with reclaimable
 *   cache, 5 high-water mark, 6 out-of-order frees across streams,
 *   11 cross-stream reuse. */
#include "fixture.h"

#include <math.h>
#include <string.h>

/* The fixture on a device of the given capacity, without VMM for segment
 * pools; the pool checks its invariants only where pc asks (the long
 * scenarios would take minutes). */
static void env_open(fixture *e, const char *capacity, tp_pool_kind kind, tp_pool_config pc) {
    char spec[64];
    snprintf(spec, sizeof spec, "sim:%s%s", capacity, kind == TP_POOL_SEGMENT ? ",novmm" : "");
    fixture_open_with(e, spec, kind, &pc, false);
}

static void *alloc_use(fixture *e, uint64_t bytes, tp_stream s, uint64_t kernel_ns) {
    void *p = NULL;
    tp_status st = tp_pool_alloc(e->pool, bytes, s, &p);
    CHECK_STATUS(st, TP_OK);
    if (st == TP_OK && kernel_ns) {
        tp_range r = {(uint64_t)(uintptr_t)p, bytes};
        CHECK_OK(tp_sim_launch(e->dev, s, kernel_ns, &r, 1));
    }
    return p;
}

/* 1. Flash-attention decode: K and V grow every 256 tokens, 20 small
 * temporaries, all freed in reverse each step. Memory held <= 1.1x peak live;
 * device allocations grow logarithmically with the step count. */
static void fm1_growth(tp_pool_kind kind) {
    fixture e;
    env_open(&e, "16GiB", kind, (tp_pool_config){0});
    const uint64_t small_sizes[20] = {4096, 8192, 16384, 65536, 131072, 262144, 1 << 20, 2048, 512, 98304,
                                      4096, 8192, 16384, 65536, 131072, 262144, 1 << 20, 2048, 512, 98304};
    const int total_steps = 131072;
    uint64_t allocs_at_quarter = 0, allocs_at_half = 0;
    void *blocks[22];
    int failures_before = check_failures;
    for (int t = 1; t <= total_steps; t++) {
        uint64_t n_kv = 256ull * (uint64_t)((512 + t + 255) / 256);
        blocks[0] = alloc_use(&e, n_kv * 2048, TP_STREAM_DEFAULT, 0);
        blocks[1] = alloc_use(&e, n_kv * 2048, TP_STREAM_DEFAULT, 0);
        for (int i = 0; i < 20; i++) blocks[2 + i] = alloc_use(&e, small_sizes[i], TP_STREAM_DEFAULT, 0);
        tp_range r = {(uint64_t)(uintptr_t)blocks[0], n_kv * 2048};
        CHECK_OK(tp_sim_launch(e.dev, TP_STREAM_DEFAULT, 20000, &r, 1));
        for (int i = 21; i >= 0; i--) CHECK_OK(tp_pool_free(e.pool, blocks[i], TP_STREAM_DEFAULT));
        CHECK_OK(tp_sim_advance(e.dev, 20000));
        if (t == total_steps / 4 || t == total_steps / 2) {
            tp_pool_stats s;
            tp_pool_get_stats(e.pool, &s);
            *(t == total_steps / 4 ? &allocs_at_quarter : &allocs_at_half) = s.device_allocs;
        }
        if (check_failures > failures_before) break;
    }
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(e.pool, &s));
    double ratio = (double)s.reserved_bytes.peak / (double)s.requested_bytes.peak;
    uint64_t last_doubling = s.device_allocs - allocs_at_half, previous_doubling = allocs_at_half - allocs_at_quarter;
    printf("  fm1 %s: peak live %.1f MiB, peak held %.1f MiB (%.3fx); device allocs %llu at t/4, %llu at t/2, %llu at "
           "t=%d\n",
           kind_name(kind), s.requested_bytes.peak / (double)TEST_MiB, s.reserved_bytes.peak / (double)TEST_MiB, ratio,
           (unsigned long long)allocs_at_quarter, (unsigned long long)allocs_at_half,
           (unsigned long long)s.device_allocs, total_steps);
    CHECK_MSG(ratio <= 1.1, "held %.3fx peak live", ratio);
    /* Logarithmic growth: each doubling of t costs about the same number of
     * calls. A pool that allocates per size would double them (and spend
     * 1024 calls here: K and V at each of 512 sizes). */
    CHECK_MSG(last_doubling <= previous_doubling + previous_doubling / 2 + 4, "%llu calls in the last doubling, %llu in the one before",
              (unsigned long long)last_doubling, (unsigned long long)previous_doubling);
    CHECK_LT_U64(s.device_allocs, 200);
    fixture_close(&e);
}

/* 2. 300 distinct sizes, 1..300 MiB, in rotation. The cache stays bounded
 * and, after the first round, no device call or host wait happens. */
static void fm2_rotation(tp_pool_kind kind) {
    fixture e;
    env_open(&e, "8GiB", kind, (tp_pool_config){0});
    uint64_t calls_after_first = 0, syncs_after_first = 0;
    for (int round = 0; round < 4; round++) {
        for (uint64_t mib = 1; mib <= 300; mib++) {
            void *p = alloc_use(&e, mib * TEST_MiB, TP_STREAM_DEFAULT, 100000);
            CHECK_OK(tp_pool_free(e.pool, p, TP_STREAM_DEFAULT));
            CHECK_OK(tp_sim_advance(e.dev, 1000000)); /* 1 ms a step */
        }
        tp_pool_stats s;
        tp_pool_get_stats(e.pool, &s);
        if (round == 0) {
            calls_after_first = s.device_calls;
            syncs_after_first = s.synchronizations;
        }
    }
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(e.pool, &s));
    printf("  fm2 %s: peak held %.1f MiB, device calls %llu after round 1, %llu after round 4, syncs %llu\n",
           kind_name(kind), s.reserved_bytes.peak / (double)TEST_MiB, (unsigned long long)calls_after_first,
           (unsigned long long)s.device_calls, (unsigned long long)s.synchronizations);
    CHECK_EQ_U64(s.device_calls, calls_after_first);
    CHECK_EQ_U64(s.synchronizations, syncs_after_first);
    CHECK_EQ_U64(s.synchronizations, 0);
    CHECK_LE_U64(s.reserved_bytes.peak, 330 * TEST_MiB + 64 * TEST_MiB);
    fixture_close(&e);
}

/* 3. 8 GiB device, 6 GiB live, 40 x 45 MiB idle, then 1.5 GiB. It succeeds
 * by releasing just enough idle cache, oldest first, never memory whose
 * last kernel is still running, and without waiting on the host. */
static void fm3_oom_reclaimable(tp_pool_kind kind) {
    fixture e;
    env_open(&e, "8GiB", kind, (tp_pool_config){.release_threshold_bytes = TP_BYTES_UNLIMITED});
    tp_stream s2, slow;
    CHECK_OK(tp_stream_create(e.dev, &s2));
    CHECK_OK(tp_stream_create(e.dev, &slow));
    void *live[6], *idle[40];
    for (int i = 0; i < 6; i++) live[i] = alloc_use(&e, TEST_GiB, TP_STREAM_DEFAULT, 1000);
    /* The oldest idle buffer belongs to a stream that still runs a 200 ms
     * kernel on it; the others' kernels are done. */
    idle[0] = alloc_use(&e, 45 * TEST_MiB, slow, 0);
    for (int i = 1; i < 40; i++) idle[i] = alloc_use(&e, 45 * TEST_MiB, TP_STREAM_DEFAULT, 1000);
    CHECK_OK(tp_sim_advance(e.dev, 100000));
    tp_range r = {(uint64_t)(uintptr_t)idle[0], 45 * TEST_MiB};
    CHECK_OK(tp_sim_launch(e.dev, slow, 200000000, &r, 1));
    CHECK_OK(tp_pool_free(e.pool, idle[0], slow));
    for (int i = 1; i < 40; i++) {
        CHECK_OK(tp_sim_advance(e.dev, 1000));
        CHECK_OK(tp_pool_free(e.pool, idle[i], TP_STREAM_DEFAULT));
    }
    tp_pool_stats before;
    CHECK_OK(tp_pool_get_stats(e.pool, &before));
    void *big = alloc_use(&e, 1536 * TEST_MiB, s2, 0);
    CHECK_NE_PTR(big, NULL);
    tp_pool_stats after;
    CHECK_OK(tp_pool_get_stats(e.pool, &after));
    uint64_t freed_segments = after.device_frees - before.device_frees;
    printf("  fm3 %s: held %.0f MiB before, %.0f MiB after; %llu device frees; syncs %llu\n", kind_name(kind),
           before.reserved_bytes.current / (double)TEST_MiB, after.reserved_bytes.current / (double)TEST_MiB,
           (unsigned long long)freed_segments, (unsigned long long)after.synchronizations);
    CHECK_EQ_U64(after.synchronizations, 0);
    if (kind == TP_POOL_SEGMENT) {
        /* Just enough: not all 40, and never the busy oldest one. */
        CHECK_GE_U64(freed_segments, 20);
        CHECK_LT_U64(freed_segments, 39);
        CHECK_GE_U64(after.reserved_bytes.current, 6 * TEST_GiB + 1536 * TEST_MiB + 45 * TEST_MiB);
    }
    /* The slow buffer's memory is still held (its kernel runs). */
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(e.dev, &c));
    CHECK_EQ_U64(c.hazards, 0);
    CHECK_GE_U64(c.pending_kernels, 1);
    CHECK_OK(tp_pool_free(e.pool, big, s2));
    for (int i = 0; i < 6; i++) CHECK_OK(tp_pool_free(e.pool, live[i], TP_STREAM_DEFAULT));
    CHECK_OK(tp_pool_forget_stream(e.pool, s2));
    CHECK_OK(tp_pool_forget_stream(e.pool, slow));
    CHECK_OK(tp_stream_destroy(e.dev, s2));
    CHECK_OK(tp_stream_destroy(e.dev, slow));
    fixture_close(&e);
}

/* 5. One 3 GiB temporary, an hour of 10 MiB temporaries, then 500 MiB
 * with only 100 MiB free on the device. The 3 GiB went back long ago; the
 * request that cannot fit returns an error; the pool keeps working. */
static void fm5_high_water(tp_pool_kind kind) {
    fixture e;
    env_open(&e, "8GiB", kind, (tp_pool_config){0});
    void *huge = alloc_use(&e, 3 * TEST_GiB, TP_STREAM_DEFAULT, 5000000);
    CHECK_OK(tp_pool_free(e.pool, huge, TP_STREAM_DEFAULT));
    const uint64_t hour_ns = 3600ull * 1000000000ull, step_ns = 50000000; /* 20 Hz */
    uint64_t max_reserved_late = 0;
    for (uint64_t t = 0; t < hour_ns; t += step_ns) {
        void *p = alloc_use(&e, 10 * TEST_MiB, TP_STREAM_DEFAULT, 1000000);
        CHECK_OK(tp_pool_free(e.pool, p, TP_STREAM_DEFAULT));
        CHECK_OK(tp_sim_advance(e.dev, step_ns));
        if (t > 60ull * 1000000000ull) {
            tp_pool_stats s;
            tp_pool_get_stats(e.pool, &s);
            if (s.reserved_bytes.current > max_reserved_late) max_reserved_late = s.reserved_bytes.current;
        }
    }
    printf("  fm5 %s: held at most %.0f MiB after the first minute\n", kind_name(kind),
           max_reserved_late / (double)TEST_MiB);
    /* The 3 GiB went back; what stays is at most the release threshold of
     * cold memory plus the working set. */
    CHECK_LE_U64(max_reserved_late, 128 * TEST_MiB);
    /* Another tenant takes all but 100 MiB. */
    uint64_t free_bytes, total;
    CHECK_OK(tp_device_mem_info(e.dev, &free_bytes, &total));
    CHECK_OK(tp_sim_occupy(e.dev, free_bytes - 100 * TEST_MiB));
    void *p = (void *)1;
    CHECK_STATUS(tp_pool_alloc(e.pool, 500 * TEST_MiB, TP_STREAM_DEFAULT, &p), TP_ERR_OUT_OF_MEMORY);
    CHECK_EQ_PTR(p, NULL);
    tp_oom_report rep;
    CHECK_OK(tp_pool_last_oom_report(e.pool, &rep));
    /* It truly could not fit: even after the ladder gave back the pool's
     * idle memory the device had less free than asked. */
    CHECK_EQ_U64(rep.request_bytes, 500 * TEST_MiB);
    CHECK_LT_U64(rep.device_free_bytes, 500 * TEST_MiB);
    CHECK_CONTAINS(rep.message, "request 500.00 MiB");
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(e.pool, &s));
    CHECK_EQ_U64(s.ooms, 1);
    /* Still usable. */
    p = alloc_use(&e, 10 * TEST_MiB, TP_STREAM_DEFAULT, 0);
    CHECK_OK(tp_pool_free(e.pool, p, TP_STREAM_DEFAULT));
    CHECK_OK(tp_sim_occupy(e.dev, 0));
    fixture_close(&e);
}

/* 6. alloc A, alloc B, free A, free B on two streams, many times. */
static void fm6_out_of_order(tp_pool_kind kind) {
    fixture e;
    env_open(&e, "4GiB", kind, (tp_pool_config){.flags = TP_POOL_FLAG_CHECK_INVARIANTS});
    tp_stream s1, s2;
    CHECK_OK(tp_stream_create(e.dev, &s1));
    CHECK_OK(tp_stream_create(e.dev, &s2));
    test_rng rng = {6};
    for (int i = 0; i < 2000; i++) {
        uint64_t a_bytes = rng_log_uniform(&rng, 256, 64 * TEST_MiB);
        uint64_t b_bytes = rng_log_uniform(&rng, 256, 64 * TEST_MiB);
        void *a = alloc_use(&e, a_bytes, s1, rng_below(&rng, 50000));
        void *b = alloc_use(&e, b_bytes, s2, rng_below(&rng, 50000));
        CHECK_NE_PTR(a, b);
        CHECK_OK(tp_pool_free(e.pool, a, s1));
        CHECK_OK(tp_pool_free(e.pool, b, s2));
        CHECK_OK(tp_sim_advance(e.dev, rng_below(&rng, 40000)));
    }
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(e.pool, &s));
    CHECK_EQ_U64(s.allocated_bytes.current, 0);
    CHECK_EQ_U64(s.allocs, 4000);
    CHECK_EQ_U64(s.frees, 4000);
    CHECK_OK(tp_pool_forget_stream(e.pool, s1));
    CHECK_OK(tp_pool_forget_stream(e.pool, s2));
    CHECK_OK(tp_stream_destroy(e.dev, s1));
    CHECK_OK(tp_stream_destroy(e.dev, s2));
    fixture_close(&e);
}

/* 11. Alloc on stream 1 with a pending kernel, free, alloc the same size on
 * stream 2: never the same memory unless stream 2 was made to wait. */
static void fm11_cross_stream(tp_pool_kind kind) {
    fixture e;
    env_open(&e, "4GiB", kind, (tp_pool_config){.flags = TP_POOL_FLAG_CHECK_INVARIANTS});
    tp_stream s1, s2, s3;
    CHECK_OK(tp_stream_create(e.dev, &s1));
    CHECK_OK(tp_stream_create(e.dev, &s2));
    CHECK_OK(tp_stream_create(e.dev, &s3));
    const uint64_t sizes[] = {4096, 3 * TEST_MiB, 100 * TEST_MiB};
    for (int k = 0; k < 3; k++) {
        uint64_t bytes = sizes[k];
        void *a = alloc_use(&e, bytes, s1, 1000000); /* 1 ms kernel */
        CHECK_OK(tp_pool_free(e.pool, a, s1));
        tp_pool_stats before, after;
        CHECK_OK(tp_pool_get_stats(e.pool, &before));
        void *b = alloc_use(&e, bytes, s2, 10);
        CHECK_OK(tp_pool_get_stats(e.pool, &after));
        if (b == a) CHECK_GT_U64(after.cross_stream_waits, before.cross_stream_waits);
        /* The same block again on the original stream reuses it at once. */
        CHECK_OK(tp_pool_free(e.pool, b, s2));
        void *c = alloc_use(&e, bytes, s1, 10);
        CHECK_OK(tp_pool_free(e.pool, c, s1));
        /* Once everything completed, a third stream may have it freely. */
        CHECK_OK(tp_sim_advance(e.dev, 5000000));
        CHECK_OK(tp_pool_tick(e.pool));
        void *d = alloc_use(&e, bytes, s3, 10);
        CHECK_OK(tp_pool_free(e.pool, d, s3));
        CHECK_OK(tp_sim_advance(e.dev, 1000));
    }
    tp_stream all[3] = {s1, s2, s3};
    for (int i = 0; i < 3; i++) {
        CHECK_OK(tp_pool_forget_stream(e.pool, all[i]));
        CHECK_OK(tp_stream_destroy(e.dev, all[i]));
    }
    fixture_close(&e);
}

KIND_TEST(fm1_growth)
KIND_TEST(fm2_rotation)
KIND_TEST(fm3_oom_reclaimable)
KIND_TEST(fm5_high_water)
KIND_TEST(fm6_out_of_order)
KIND_TEST(fm11_cross_stream)

static const test_case tests[] = {
    KIND_CASES(fm1_growth),
    KIND_CASES(fm2_rotation),
    KIND_CASES(fm3_oom_reclaimable),
    KIND_CASES(fm5_high_water),
    KIND_CASES(fm6_out_of_order),
    KIND_CASES(fm11_cross_stream),
};

int main(int argc, char **argv) { return TEST_MAIN("test_scenarios", tests, argc, argv); }
