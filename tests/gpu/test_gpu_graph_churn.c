/* SPDX-License-Identifier: MIT */
/* Graph-key churn on a real GPU (failure mode 7, docs/failure-modes.md):
 * a loop like a vision server's image requests, where every request brings
 * a graph of a topology never seen before (50..250 memset nodes, chained or
 * independent) and ten hot keys are replayed in between. With the cache's
 * byte cap on, the driver's free memory stays bounded; the same loop with
 * the cap off grows with every request. Prints both curves (start, samples,
 * peak, end of the device memory in use).
 *
 * Measured on the H200 (driver 580): such an executable costs about 8 MiB
 * of device memory, and the driver keeps the memory of destroyed
 * executables for later ones, so most instantiations under the cap show no
 * drop in free memory: the cache counts them at its learned cost per node
 * (graph_cache.c, exec_bytes_accounted). Capped, the memory in use went
 * 528.8 -> 666.8 MiB by request 200 and stayed there to request 2000;
 * uncapped it grew to 17,100.8 MiB. The invariants below are about the
 * shape of the curve, not its first steps. */
#include "gpu_common.h"

#include "internal.h"

static uint64_t used_bytes(void) {
    size_t free_bytes = 0, total = 0;
    GPU_OK(gpu.MemGetInfo(&free_bytes, &total));
    return (uint64_t)(total - free_bytes);
}

/* Requests after which every hot key has been used at least twice. */
#define WARM_REQUESTS 20

typedef struct curve {
    uint64_t start, peak, end, half; /* half: in use halfway through */
    uint64_t execs_end, exec_bytes_peak, evictions;
    uint64_t hot_instantiations;     /* instantiations beyond one per key */
    uint64_t hot_instantiations_steady; /* ... once every hot key had been used twice */
} curve;

static curve churn(tp_device *dev, gpu_ptr dst, uint64_t cap_bytes, int requests) {
    tp_graph_cache_config cfg = {.max_execs = 1000000, .max_bytes = cap_bytes, .idle_evict_ns = TP_NS_NEVER};
    tp_graph_cache *cache = NULL;
    REQUIRE(tp_graph_cache_create(dev, &cfg, &cache) == TP_OK);
    tp_stream s;
    REQUIRE(tp_stream_create(dev, &s) == TP_OK);
    GPU_OK(gpu.CtxSynchronize());
    curve c = {0};
    c.start = c.peak = used_bytes();
    printf("  cap %s: request 0: %.1f MiB in use\n", cap_bytes == TP_BYTES_UNLIMITED ? "off" : "on",
           c.start / (double)TEST_MiB);
    gpu_graph hot[10];
    for (int k = 0; k < 10; k++) {
        hot[k] = gpu_memset_graph(dst, 100, 0x10 + (unsigned)k, k % 2);
        CHECK_OK(tp_graph_cache_run(cache, (uint64_t)k + 1, (tp_graph)hot[k], NULL, s));
    }
    int eager = 0;
    uint64_t instantiations_warm = 0; /* after request WARM_REQUESTS - 1 */
    for (int r = 0; r < requests; r++) {
        int nodes = 50 + (r * 37) % 201;
        gpu_graph g = gpu_memset_graph(dst, nodes, (unsigned)r & 0xff, r % 2);
        tp_status st = tp_graph_cache_run(cache, 1000 + (uint64_t)r, (tp_graph)g, NULL, s);
        if (st == TP_ERR_RUN_EAGER) eager++;
        else CHECK_OK(st);
        GPU_OK(gpu_graphs.Destroy(g)); /* the executable no longer needs its template */
        for (int k = 0; k < 3; k++) {
            int h = (r + k) % 10; /* hot keys come back through run: evicted or not, they launch */
            CHECK_OK(tp_graph_cache_run(cache, (uint64_t)h + 1, (tp_graph)hot[h], NULL, s));
        }
        if (r == WARM_REQUESTS - 1) {
            tp_graph_cache_stats warm;
            CHECK_OK(tp_graph_cache_get_stats(cache, &warm));
            instantiations_warm = warm.instantiations;
        }
        if ((r + 1) % (requests / 10) == 0) {
            CHECK_OK(tp_stream_synchronize(dev, s));
            uint64_t used = used_bytes();
            if (used > c.peak) c.peak = used;
            if (r + 1 == requests / 2) c.half = used;
            printf("  cap %s: request %d: %.1f MiB in use\n", cap_bytes == TP_BYTES_UNLIMITED ? "off" : "on", r + 1,
                   used / (double)TEST_MiB);
        }
    }
    tp_graph_cache_stats st;
    CHECK_OK(tp_graph_cache_get_stats(cache, &st));
    CHECK_OK(tp_stream_synchronize(dev, s));
    c.end = used_bytes();
    if (c.end > c.peak) c.peak = c.end;
    c.execs_end = st.execs;
    c.exec_bytes_peak = st.exec_bytes_peak;
    c.evictions = st.evictions_bytes + st.evictions_count;
    c.hot_instantiations = st.instantiations - (uint64_t)requests - 10;
    c.hot_instantiations_steady = st.instantiations - instantiations_warm - (uint64_t)(requests - WARM_REQUESTS);
    CHECK_EQ_U64(eager, 0);
    char msg[256] = "";
    tp_status cs = tp_graph_cache_check(cache, msg, sizeof msg);
    CHECK_MSG(cs == TP_OK, "%s", msg);
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_stream_destroy(dev, s));
    for (int k = 0; k < 10; k++) GPU_OK(gpu_graphs.Destroy(hot[k]));
    GPU_OK(gpu.CtxSynchronize());
    return c;
}

static void test_graph_churn_is_bounded_by_the_cap(void) {
    tp_device *dev = NULL;
    REQUIRE(tp_device_open(gpu_spec(), NULL, &dev) == TP_OK);
    gpu_ptr dst = 0;
    GPU_OK(gpu.MemAlloc(&dst, TEST_MiB));
    int requests = gpu_quick() ? 200 : 2000;
    const uint64_t cap = 256 * TEST_MiB; /* the default; room for the hot set */

    curve on = churn(dev, dst, cap, requests);
    curve off = churn(dev, dst, TP_BYTES_UNLIMITED, requests);
    printf("graph churn, %d requests of new topologies + 10 hot keys:\n", requests);
    printf("  cap %.0f MiB: in use start %.1f, half-way %.1f, peak %.1f, end %.1f MiB; %llu executables at the end, "
           "peak %.1f MiB of them, %llu evictions, %llu re-instantiations of hot keys (%llu after the first %d "
           "requests)\n",
           cap / (double)TEST_MiB, on.start / (double)TEST_MiB, on.half / (double)TEST_MiB, on.peak / (double)TEST_MiB,
           on.end / (double)TEST_MiB, (unsigned long long)on.execs_end, on.exec_bytes_peak / (double)TEST_MiB,
           (unsigned long long)on.evictions, (unsigned long long)on.hot_instantiations,
           (unsigned long long)on.hot_instantiations_steady, WARM_REQUESTS);
    printf("  cap off:    in use start %.1f, half-way %.1f, peak %.1f, end %.1f MiB; %llu executables at the end, "
           "peak %.1f MiB of them\n",
           off.start / (double)TEST_MiB, off.half / (double)TEST_MiB, off.peak / (double)TEST_MiB,
           off.end / (double)TEST_MiB, (unsigned long long)off.execs_end, off.exec_bytes_peak / (double)TEST_MiB);
    /* Bounded: flat over the second half of the run (the driver's own
     * growth happens early), and never far above the cap. */
    CHECK_MSG(on.end <= on.half + 32 * TEST_MiB, "capped run still growing: %.1f -> %.1f MiB", on.half / (double)TEST_MiB,
              on.end / (double)TEST_MiB);
    CHECK_MSG(on.peak - on.start <= cap + 512 * TEST_MiB, "capped run grew %.1f MiB",
              (on.peak - on.start) / (double)TEST_MiB);
    /* Without the cap the same loop keeps growing, to far beyond it. */
    CHECK_MSG(off.end > off.half + cap / 2 && off.peak - off.start > 4 * cap, "uncapped grew %.1f MiB",
              (off.peak - off.start) / (double)TEST_MiB);
    /* Hot keys live in the protected segment: once each has been used
     * twice, new keys do not push them out. (Before that they are new keys
     * like any other: on the H200 one was evicted in the first requests,
     * when the cache counts executables at a cautious learned size.) */
    CHECK_MSG(on.hot_instantiations_steady == 0, "hot keys re-instantiated %llu times after warm-up",
              (unsigned long long)on.hot_instantiations_steady);
    CHECK_LE_U64(on.hot_instantiations, 10);
    CHECK_GT_U64(on.evictions, 0);
    CHECK_EQ_U64(off.execs_end, (uint64_t)requests + 10);
    GPU_OK(gpu.MemFree(dst));
    CHECK_OK(tp_device_close(dev));
}

static const test_case tests[] = {
    TEST_CASE(test_graph_churn_is_bounded_by_the_cap),
};

int main(int argc, char **argv) {
    gpu_init(); /* exits 77 without a device */
    if (!gpu_graphs_load()) gpu_skip("driver has no cuGraphCreate");
    if (getenv("TP_GPU_PROBE")) return 0;
    return TEST_MAIN("test_gpu_graph_churn", tests, argc, argv);
}
