/* SPDX-License-Identifier: MIT */
/* The CUDA backend's device-level behaviour on a real GPU:
 *   - opening: "cuda:N" and "cuda:N,novmm" fill the info (backend, name,
 *     capacity, power-of-two granularity, VMM flags); a missing ordinal is
 *     TP_ERR_NO_DEVICE and a bad gran= is TP_ERR_BAD_SPEC, never an abort;
 *   - streams and events pass the driver's handles through: record, query
 *     (TP_NOT_READY while work runs), wait, synchronize;
 *   - every op leaves the calling thread's current context as it found it
 *     (none, or the primary context);
 *   - plain memory: a request larger than the card is TP_ERR_OUT_OF_MEMORY
 *     with a log line naming CUDA_ERROR_OUT_OF_MEMORY; mem_info agrees with
 *     cuMemGetInfo;
 *   - graph ops: instantiate (bytes measured), launch, update to a graph of
 *     the same topology, TP_ERR_TOPOLOGY_MISMATCH for another topology,
 *     destroy -- on graphs of memset nodes built with the driver API. */
#include "gpu_common.h"
#include "internal.h"

#include <pthread.h>

/* Capture of the log: did a message containing `needle` arrive? */
typedef struct text_log {
    test_log counts;
    char last[512];
    char needle_hit[64];
} text_log;

static void text_log_fn(void *user, tp_log_level level, const char *message) {
    text_log *log = user;
    test_log_fn(&log->counts, level, message);
    snprintf(log->last, sizeof log->last, "%s", message);
    if (strstr(message, "CUDA_ERROR_OUT_OF_MEMORY")) snprintf(log->needle_hit, sizeof log->needle_hit, "oom");
}

static void test_open_and_info(void) {
    test_log log = {0};
    tp_device *dev = gpu_open(gpu_spec(), &log);
    tp_device_info info;
    CHECK_OK(tp_device_get_info(dev, &info));
    printf("  %s: \"%s\" %.1f GiB, granularity %llu KiB, vmm supported %d enabled %d\n", gpu_spec(), info.name,
           info.capacity_bytes / (double)TEST_GiB, (unsigned long long)(info.granularity_bytes >> 10),
           info.vmm_supported, info.vmm_enabled);
    CHECK_EQ_STR(info.backend, "cuda");
    CHECK_NE_U64(info.name[0], '\0');
    CHECK_EQ_U64(info.ordinal, gpu.ordinal);
    CHECK_GT_U64(info.capacity_bytes, 0);
    CHECK(tpi_is_pow2(info.granularity_bytes));
    CHECK_EQ_U64(info.vmm_enabled, info.vmm_supported);
    CHECK_EQ_PTR(dev->ops->check_handout, NULL);
    CHECK(!dev->hazard_checker);
    uint64_t free_bytes = 0, total = 0;
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_GT_U64(total, 0);
    CHECK_LE_U64(free_bytes, total);
    CHECK_LE_U64(total, info.capacity_bytes + TEST_GiB);
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_device_close(dev));

    char spec[64];
    snprintf(spec, sizeof spec, "%s,novmm", gpu_spec());
    dev = gpu_open(spec, &log);
    tp_device_info info2;
    CHECK_OK(tp_device_get_info(dev, &info2));
    CHECK(!info2.vmm_enabled);
    CHECK_EQ_U64(info2.vmm_supported, info.vmm_supported);
    CHECK_EQ_U64(info2.capacity_bytes, info.capacity_bytes);
    uint64_t va = 0;
    CHECK_STATUS(dev->ops->va_reserve(dev, 64 * TEST_MiB, 0, &va), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(dev->ops->map(dev, 1ull << 40, info2.granularity_bytes, 0), TP_ERR_UNSUPPORTED);
    tp_pool *pool = NULL;
    CHECK_STATUS(tp_pool_create(dev, &(tp_pool_config){.kind = TP_POOL_VMM}, &pool), TP_ERR_UNSUPPORTED);
    CHECK_OK(tp_device_close(dev));

    /* Failures come back as statuses, with the reason logged. */
    text_log tl = {0};
    tp_device_config dc = {.log = text_log_fn, .log_user = &tl};
    tp_device *none = (tp_device *)1;
    CHECK_STATUS(tp_device_open("cuda:999", &dc, &none), TP_ERR_NO_DEVICE);
    CHECK_EQ_PTR(none, NULL);
    CHECK_GE_U64(tl.counts.errors, 1);
    CHECK_CONTAINS(tl.last, "cuda:999");
    snprintf(spec, sizeof spec, "cuda:%d,gran=4KiB", gpu.ordinal);
    CHECK_STATUS(tp_device_open(spec, &dc, &none), TP_ERR_BAD_SPEC);
    snprintf(spec, sizeof spec, "cuda:%d,bogus", gpu.ordinal);
    CHECK_STATUS(tp_device_open(spec, &dc, &none), TP_ERR_BAD_SPEC);
    /* A larger page size is accepted and becomes the granularity. */
    snprintf(spec, sizeof spec, "%s,gran=64MiB", gpu_spec());
    dev = gpu_open(spec, &log);
    CHECK_OK(tp_device_get_info(dev, &info2));
    CHECK(info2.granularity_bytes == 64 * TEST_MiB || !info2.vmm_supported);
    CHECK_OK(tp_device_close(dev));
}

/* Keeps a stream busy for a while: repeated memsets of a large buffer. */
static void busy(gpu_ptr scratch, uint64_t bytes, int times, tp_stream s) {
    for (int i = 0; i < times; i++) GPU_OK(gpu.MemsetD8Async(scratch, (unsigned char)i, bytes, (gpu_stream)s));
}

static void test_streams_events(void) {
    test_log log = {0};
    tp_device *dev = gpu_open(gpu_spec(), &log);
    tp_stream s1, s2;
    CHECK_OK(tp_stream_create(dev, &s1));
    CHECK_OK(tp_stream_create(dev, &s2));
    CHECK_NE_PTR(s1, TP_STREAM_DEFAULT);
    CHECK_NE_PTR(s2, TP_STREAM_DEFAULT);
    CHECK_NE_PTR(s1, s2);
    tp_event e;
    CHECK_OK(tp_event_create(dev, &e));
    CHECK_OK(tp_event_query(dev, e)); /* never recorded: complete */

    const uint64_t scratch_bytes = 1 * TEST_GiB;
    gpu_ptr scratch = 0, target = 0;
    GPU_OK(gpu.MemAlloc(&scratch, scratch_bytes));
    GPU_OK(gpu.MemAlloc(&target, 4096));
    /* s1: long work, then the pattern; s2 waits on the event, then checks. */
    busy(scratch, scratch_bytes, 40, s1);
    GPU_OK(gpu.MemsetD8Async(target, 0xab, 4096, (gpu_stream)s1));
    CHECK_OK(tp_event_record(dev, e, s1));
    tp_status q = tp_event_query(dev, e);
    CHECK(q == TP_NOT_READY || q == TP_OK);
    if (q == TP_OK) printf("  note: 40 GiB of memsets finished before the query\n");
    CHECK_OK(tp_stream_wait_event(dev, s2, e));
    uint64_t bad = gpu_count_mismatch(target, 4096, 0xab, s2, NULL);
    CHECK_EQ_U64(bad, 0);
    CHECK_OK(tp_event_synchronize(dev, e));
    CHECK_OK(tp_event_query(dev, e));
    /* The default stream passes through as NULL. */
    busy(scratch, scratch_bytes, 2, TP_STREAM_DEFAULT);
    CHECK_OK(tp_event_record(dev, e, TP_STREAM_DEFAULT));
    CHECK_OK(tp_stream_synchronize(dev, TP_STREAM_DEFAULT));
    CHECK_OK(tp_event_query(dev, e));
    CHECK_OK(tp_stream_synchronize(dev, s1));
    CHECK_OK(tp_device_synchronize(dev));
    GPU_OK(gpu.MemFree(scratch));
    GPU_OK(gpu.MemFree(target));
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_stream_destroy(dev, s1));
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

/* A thread with no current context: ops work and leave it with none. */
static void *contextless_thread(void *arg) {
    tp_device *dev = arg;
    gpu_context cur = (gpu_context)1;
    GPU_OK(gpu.CtxGetCurrent(&cur));
    CHECK_EQ_PTR(cur, NULL);
    uint64_t free_bytes = 0, total = 0;
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_GT_U64(free_bytes, 0);
    tp_stream s;
    tp_event e;
    CHECK_OK(tp_stream_create(dev, &s));
    CHECK_OK(tp_event_create(dev, &e));
    CHECK_OK(tp_event_record(dev, e, s));
    CHECK_OK(tp_event_synchronize(dev, e));
    tp_pool *pool;
    CHECK_OK(tp_pool_create(dev, NULL, &pool));
    void *p = NULL;
    CHECK_OK(tp_pool_alloc(pool, 3 * TEST_MiB, s, &p));
    CHECK_OK(tp_pool_free(pool, p, s));
    CHECK_OK(tp_pool_forget_stream(pool, s));
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_stream_destroy(dev, s));
    GPU_OK(gpu.CtxGetCurrent(&cur));
    CHECK_MSG(cur == NULL, "an op left a context current on a thread that had none");
    return NULL;
}

static void test_context_restore(void) {
    test_log log = {0};
    tp_device *dev = gpu_open(gpu_spec(), &log);
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, contextless_thread, dev) == 0);
    pthread_join(t, NULL);
    /* On this thread the primary context is current and stays so. */
    uint64_t free_bytes, total;
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    gpu_context cur = NULL;
    GPU_OK(gpu.CtxGetCurrent(&cur));
    CHECK_EQ_PTR(cur, gpu.ctx);
    CHECK_OK(tp_device_close(dev));
}

static void test_plain_memory(void) {
    text_log tl = {0};
    tp_device_config dc = {.log = text_log_fn, .log_user = &tl};
    tp_device *dev = NULL;
    REQUIRE(tp_device_open(gpu_spec(), &dc, &dev) == TP_OK);
    uint64_t free0 = 0, total = 0;
    CHECK_OK(tp_device_mem_info(dev, &free0, &total));
    size_t drv_free = 0, drv_total = 0;
    GPU_OK(gpu.MemGetInfo(&drv_free, &drv_total));
    CHECK_EQ_U64(total, drv_total);

    uint64_t address = 0;
    CHECK_OK(dev->ops->mem_alloc(dev, 256 * TEST_MiB, &address));
    CHECK_NE_U64(address, 0);
    CHECK_EQ_U64(address % 256, 0);
    GPU_OK(gpu.MemsetD8Async(address, 0x11, 256 * TEST_MiB, NULL));
    CHECK_EQ_U64(gpu_count_mismatch(address, 256 * TEST_MiB, 0x11, TP_STREAM_DEFAULT, NULL), 0);
    CHECK_OK(dev->ops->mem_free(dev, address, 256 * TEST_MiB));

    /* More than the card holds: a status and a log line, no abort. */
    address = 0;
    CHECK_STATUS(dev->ops->mem_alloc(dev, total + 8 * TEST_GiB, &address), TP_ERR_OUT_OF_MEMORY);
    CHECK_EQ_STR(tl.needle_hit, "oom");
    /* Still usable afterwards. */
    CHECK_OK(dev->ops->mem_alloc(dev, 2 * TEST_MiB, &address));
    CHECK_OK(dev->ops->mem_free(dev, address, 2 * TEST_MiB));
    CHECK_OK(tp_device_close(dev));
}

static void test_graphs(void) {
    if (!gpu_graphs_load()) {
        printf("  graphs: driver has no cuGraphCreate, skipped\n");
        return;
    }

    test_log log = {0};
    tp_device *dev = gpu_open(gpu_spec(), &log);
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    const int nodes = 200;
    gpu_ptr dst = 0;
    GPU_OK(gpu.MemAlloc(&dst, (size_t)nodes * 4096));

    gpu_graph g1 = gpu_memset_graph(dst, nodes, 0x21, 1);
    tpi_graph_exec exec = NULL;
    uint64_t bytes = 0;
    CHECK_OK(dev->ops->graph_instantiate(dev, (tp_graph)g1, &exec, &bytes));
    printf("  graph of %d memset nodes: instantiation measured at %llu KiB\n", nodes,
           (unsigned long long)(bytes >> 10));
    CHECK_OK(dev->ops->graph_launch(dev, exec, s));
    CHECK_EQ_U64(gpu_count_mismatch(dst, (uint64_t)nodes * 4096, 0x21, s, NULL), 0);

    /* Same topology, other value: updated in place. */
    gpu_graph g2 = gpu_memset_graph(dst, nodes, 0x42, 1);
    CHECK_OK(dev->ops->graph_update(dev, exec, (tp_graph)g2));
    CHECK_OK(dev->ops->graph_launch(dev, exec, s));
    CHECK_EQ_U64(gpu_count_mismatch(dst, (uint64_t)nodes * 4096, 0x42, s, NULL), 0);

    /* Other topology: refused, the executable still runs what it had. */
    gpu_graph g3 = gpu_memset_graph(dst, nodes / 2, 0x63, 0);
    CHECK_STATUS(dev->ops->graph_update(dev, exec, (tp_graph)g3), TP_ERR_TOPOLOGY_MISMATCH);
    CHECK_OK(dev->ops->graph_launch(dev, exec, s));
    CHECK_EQ_U64(gpu_count_mismatch(dst, (uint64_t)nodes * 4096, 0x42, s, NULL), 0);

    /* Many instantiations from several threads at once would race on the
     * measurement; here, sequentially, each is measured or 0. */
    tpi_graph_exec more[8];
    uint64_t more_bytes = 0;
    for (int i = 0; i < 8; i++) {
        uint64_t b = 0;
        CHECK_OK(dev->ops->graph_instantiate(dev, (tp_graph)g3, &more[i], &b));
        more_bytes += b;
    }
    printf("  8 more executables of %d nodes: %llu KiB measured in all\n", nodes / 2,
           (unsigned long long)(more_bytes >> 10));
    for (int i = 0; i < 8; i++) CHECK_OK(dev->ops->graph_destroy(dev, more[i]));

    CHECK_OK(tp_stream_synchronize(dev, s));
    CHECK_OK(dev->ops->graph_destroy(dev, exec));
    GPU_OK(gpu_graphs.Destroy(g1));
    GPU_OK(gpu_graphs.Destroy(g2));
    GPU_OK(gpu_graphs.Destroy(g3));
    GPU_OK(gpu.MemFree(dst));
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

static const test_case tests[] = {
    TEST_CASE(test_open_and_info),
    TEST_CASE(test_streams_events),
    TEST_CASE(test_context_restore),
    TEST_CASE(test_plain_memory),
    TEST_CASE(test_graphs),
};

int main(int argc, char **argv) {
    gpu_init(); /* exits 77 without a device */
    int rc = TEST_MAIN("test_gpu_device", tests, argc, argv);
    gpu_fini();
    return rc;
}
