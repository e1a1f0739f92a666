/* SPDX-License-Identifier: MIT */
/* Pools under CUDA stream capture, for both pool kinds ("cuda:N" gives the
 * VMM pool, "cuda:N,novmm" the segment pool), as ggml (llama.cpp) captures
 * graphs: allocations and frees on the capturing stream in RELAXED mode,
 * between tp_pool_capture_begin and _end:
 *   - 48 steps of alloc -> memset -> free (every third step frees three),
 *     4 to 36 MiB each, alone or while another stream allocates, writes
 *     and frees eagerly and the pool is trimmed and ticked: the capture
 *     must not be invalidated (cuStreamEndCapture succeeds), the graph
 *     instantiates and runs, and it writes what it was captured to write;
 *   - the graph's footprint, pinned by tp_pool_capture_end, stays near the
 *     temporaries' live peak, never their sum: alone, within 1.1x (VMM) and
 *     1.3x (segment: separate segments cannot merge); with the eager
 *     traffic, whose pending frees share pages and segments with the
 *     capture's, within 3x (figures printed);
 *   - the eager stream's blocks never overlap the graph's footprint;
 * the same in GLOBAL mode, PyTorch's default (torch.cuda.graph), where the
 * pool's growth during the capture (new physical memory, mapped; or new
 * segments), and the eager stream's trims, are calls capture counts as
 * unsafe: the backend makes them in relaxed mode, or the capture is
 * invalidated. And a capture in GLOBAL mode on another thread must survive
 * a pool's growth, trims and ticks on this one (a server's other requests,
 * the PyTorch shim's tick thread). */
#include "gpu_common.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>

typedef struct gpu_exec_st *gpu_graph_exec;

static struct {
    gpu_result (*StreamCreate)(gpu_stream *, unsigned);
    gpu_result (*StreamDestroy)(gpu_stream);
    gpu_result (*BeginCapture)(gpu_stream, int);
    gpu_result (*EndCapture)(gpu_stream, gpu_graph *);
    gpu_result (*IsCapturing)(gpu_stream, int *);
    gpu_result (*Instantiate)(gpu_graph_exec *, gpu_graph, unsigned long long);
    gpu_result (*Launch)(gpu_graph_exec, gpu_stream);
    gpu_result (*ExecDestroy)(gpu_graph_exec);
    gpu_result (*GraphDestroy)(gpu_graph);
} cap;

#define CAPTURE_MODE_GLOBAL 0
#define CAPTURE_MODE_RELAXED 2
#define CAPTURE_STATUS_ACTIVE 1

static void capture_load(void) {
    void *sym;
#define CAP_LOAD(field, name)             \
    sym = gpu_sym(name);                  \
    memcpy(&cap.field, &sym, sizeof sym);
    CAP_LOAD(StreamCreate, "cuStreamCreate")
    CAP_LOAD(StreamDestroy, "cuStreamDestroy_v2")
    CAP_LOAD(BeginCapture, "cuStreamBeginCapture_v2")
    CAP_LOAD(EndCapture, "cuStreamEndCapture")
    CAP_LOAD(IsCapturing, "cuStreamIsCapturing")
    CAP_LOAD(Instantiate, "cuGraphInstantiateWithFlags")
    CAP_LOAD(Launch, "cuGraphLaunch")
    CAP_LOAD(ExecDestroy, "cuGraphExecDestroy")
    CAP_LOAD(GraphDestroy, "cuGraphDestroy")
#undef CAP_LOAD
}

static bool overlaps(uint64_t a, uint64_t a_bytes, const tp_range *r) {
    return a < r->address + r->bytes && r->address < a + a_bytes;
}

/* The device (VMM on or off) and a pool of that kind on it. */
static tp_pool *open_pool(bool vmm, test_log *log, tp_device **out_dev) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s%s", gpu_spec(), vmm ? "" : ",novmm");
    *out_dev = gpu_open(spec, log);
    tp_pool_config pc = {.kind = vmm ? TP_POOL_VMM : TP_POOL_SEGMENT};
    tp_pool *pool = NULL;
    REQUIRE_OK(tp_pool_create(*out_dev, &pc, &pool));
    return pool;
}

static void capture_alloc_memset_free(bool vmm, bool traffic, int mode) {
    test_log log = {0};
    tp_device *dev = NULL;
    tp_pool *pool = open_pool(vmm, &log, &dev);
    gpu_stream cs = NULL, eager = NULL;
    GPU_OK(cap.StreamCreate(&cs, 1 /* non-blocking */));
    GPU_OK(cap.StreamCreate(&eager, 1));
    tp_stream tcs = (tp_stream)cs, teager = (tp_stream)eager;

    /* Memory the capture will reuse once freed: eager work first. */
    void *warm;
    REQUIRE_OK(tp_pool_alloc(pool, 64 * TEST_MiB, tcs, &warm));
    GPU_OK(gpu.MemsetD8Async(gpu_addr(warm), 1, 64 * TEST_MiB, cs));

    REQUIRE_OK(tp_pool_capture_begin(pool, tcs)); /* before the stream captures: the contract */
    GPU_OK(cap.BeginCapture(cs, mode));
    CHECK_OK(tp_pool_free(pool, warm, tcs));
    void *pending[3];
    tp_range captured[48];
    int pending_count = 0;
    uint64_t live = 0, peak = 0, sum = 0;
    for (int step = 0; step < 48; step++) {
        uint64_t bytes = (4 + 8 * (uint64_t)(step % 5)) * TEST_MiB;
        void *p = NULL;
        REQUIRE_OK(tp_pool_alloc(pool, bytes, tcs, &p));
        GPU_OK(gpu.MemsetD8Async(gpu_addr(p), (unsigned char)(0x40 + step), bytes, cs));
        captured[step] = (tp_range){gpu_addr(p), bytes};
        live += bytes;
        sum += bytes;
        if (live > peak) peak = live;
        pending[pending_count++] = p;
        /* Eager traffic on another stream meanwhile. */
        void *q = NULL;
        if (traffic) REQUIRE_OK(tp_pool_alloc(pool, (1 + (uint64_t)(step % 7)) * TEST_MiB, teager, &q));
        if (q) {
            GPU_OK(gpu.MemsetD8Async(gpu_addr(q), 0x11, TEST_MiB, eager));
            for (int i = 0; i <= step; i++) CHECK(!overlaps(gpu_addr(q), TEST_MiB, &captured[i]));
            CHECK_OK(tp_pool_free(pool, q, teager));
        }
        if (traffic && step % 16 == 8) {
            uint64_t released;
            CHECK_OK(tp_pool_trim(pool, 0, &released));
            CHECK_OK(tp_pool_tick(pool));
        }
        if (step % 3 != 2) continue;
        for (int i = 0; i < pending_count; i++) {
            size_t size;
            CHECK_OK(tp_pool_block_size(pool, pending[i], &size));
            live -= size;
            CHECK_OK(tp_pool_free(pool, pending[i], tcs));
        }
        pending_count = 0;
    }
    int status = 0;
    GPU_OK(cap.IsCapturing(cs, &status));
    CHECK_EQ_U64(status, CAPTURE_STATUS_ACTIVE); /* not invalidated */
    gpu_graph graph = NULL;
    GPU_OK(cap.EndCapture(cs, &graph));
    tp_range *ranges = NULL;
    size_t count = 0;
    CHECK_OK(tp_pool_capture_end(pool, tcs, &ranges, &count));
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(pool, &s));
    double ratio = (double)s.pinned_bytes.current / (double)peak;
    printf("  %s %s capture%s: %.0f MiB of temporaries, peak %.0f MiB live, %.1f MiB pinned in %zu ranges (%.3fx), "
           "%llu device calls\n",
           vmm ? "vmm" : "segment", mode == CAPTURE_MODE_GLOBAL ? "global" : "relaxed",
           traffic ? " with eager traffic" : "", sum / (double)TEST_MiB,
           peak / (double)TEST_MiB, s.pinned_bytes.current / (double)TEST_MiB, count, ratio,
           (unsigned long long)s.device_calls);
    CHECK_MSG(ratio <= (traffic ? 3.0 : vmm ? 1.1 : 1.3), "pinned %.3fx the peak", ratio);

    /* The graph runs, twice, and its last step's writes are there. */
    gpu_graph_exec exec = NULL;
    if (graph) GPU_OK(cap.Instantiate(&exec, graph, 0));
    if (exec) {
        GPU_OK(cap.Launch(exec, cs));
        GPU_OK(cap.Launch(exec, cs));
        GPU_OK(gpu.StreamSynchronize(cs));
        uint64_t bad_at = 0;
        CHECK_EQ_U64(gpu_count_mismatch(captured[47].address, captured[47].bytes, 0x40 + 47, tcs, &bad_at), 0);
        /* Eager blocks never land in the footprint, even after the capture. */
        void *q = NULL;
        REQUIRE_OK(tp_pool_alloc(pool, 16 * TEST_MiB, teager, &q));
        for (size_t i = 0; i < count; i++) CHECK(!overlaps(gpu_addr(q), 16 * TEST_MiB, &ranges[i]));
        CHECK_OK(tp_pool_free(pool, q, teager));
        GPU_OK(cap.ExecDestroy(exec));
    }
    if (graph) GPU_OK(cap.GraphDestroy(graph));
    for (size_t i = 0; i < count; i++)
        CHECK_OK(tp_pool_unpin(pool, (void *)(uintptr_t)ranges[i].address, ranges[i].bytes));
    tp_pool_free_ranges(pool, ranges);
    char msg[256] = "";
    CHECK_MSG(tp_pool_check(pool, msg, sizeof msg) == TP_OK, "%s", msg);
    CHECK_OK(tp_pool_forget_stream(pool, tcs));
    CHECK_OK(tp_pool_forget_stream(pool, teager));
    CHECK_OK(tp_pool_destroy(pool));
    GPU_OK(cap.StreamDestroy(cs));
    GPU_OK(cap.StreamDestroy(eager));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

/* Another thread captures a stream of its own in GLOBAL mode (what
 * torch.cuda.graph does by default) while this thread's pool grows, frees,
 * trims and ticks on its stream: the other capture must stay valid. */
typedef struct other_capture {
    gpu_ptr buffer;
    atomic_int stage; /* 1: capturing; 2: the pool is done; 3: checked */
    int status_at_end;
    gpu_result end_result;
} other_capture;

static void *capture_on_other_thread(void *arg) {
    other_capture *oc = arg;
    gpu_bind_thread();
    gpu_stream s = NULL;
    GPU_OK(cap.StreamCreate(&s, 1));
    GPU_OK(cap.BeginCapture(s, CAPTURE_MODE_GLOBAL));
    GPU_OK(gpu.MemsetD8Async(oc->buffer, 0x5a, TEST_MiB, s));
    atomic_store(&oc->stage, 1);
    while (atomic_load(&oc->stage) != 2) sched_yield();
    GPU_OK(cap.IsCapturing(s, &oc->status_at_end));
    gpu_graph graph = NULL;
    oc->end_result = cap.EndCapture(s, &graph);
    if (graph) GPU_OK(cap.GraphDestroy(graph));
    GPU_OK(cap.StreamDestroy(s));
    atomic_store(&oc->stage, 3);
    return NULL;
}

static void pool_work_beside_a_global_capture(bool vmm) {
    test_log log = {0};
    tp_device *dev = NULL;
    tp_pool *pool = open_pool(vmm, &log, &dev);
    gpu_stream ps = NULL;
    GPU_OK(cap.StreamCreate(&ps, 1));
    tp_stream tps = (tp_stream)ps;
    other_capture oc = {0};
    atomic_init(&oc.stage, 0);
    GPU_OK(gpu.MemAlloc(&oc.buffer, TEST_MiB));
    pthread_t t;
    REQUIRE(pthread_create(&t, NULL, capture_on_other_thread, &oc) == 0);
    while (atomic_load(&oc.stage) != 1) sched_yield();
    /* Growth (every size new to the empty pool), frees, trims, ticks. */
    int failed = 0;
    for (int round = 0; round < 4; round++) {
        void *p[6] = {0};
        for (int i = 0; i < 6; i++) {
            uint64_t bytes = (uint64_t)(1 + 7 * i + 3 * round) * TEST_MiB;
            tp_status st = tp_pool_alloc(pool, bytes, tps, &p[i]);
            if (st != TP_OK) {
                failed++;
                fprintf(stderr, "  round %d: alloc of %llu MiB: %s\n", round, (unsigned long long)(bytes / TEST_MiB),
                        tp_status_name(st));
                continue;
            }
            GPU_OK(gpu.MemsetD8Async(gpu_addr(p[i]), 0x22, bytes, ps));
        }
        for (int i = 0; i < 6; i++)
            if (p[i]) CHECK_OK(tp_pool_free(pool, p[i], tps));
        uint64_t released = 0;
        CHECK_OK(tp_pool_trim(pool, 0, &released));
        CHECK_OK(tp_pool_tick(pool));
    }
    CHECK_EQ_U64(failed, 0);
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(pool, &s));
    atomic_store(&oc.stage, 2);
    pthread_join(t, NULL);
    printf("  %s pool beside another thread's global capture: %llu device calls; that capture %s at its end, "
           "cuStreamEndCapture %s\n",
           vmm ? "vmm" : "segment", (unsigned long long)s.device_calls,
           oc.status_at_end == CAPTURE_STATUS_ACTIVE ? "active" : "NOT active", gpu_error_name(oc.end_result));
    CHECK(s.device_calls > 0); /* the pool did call the driver during the capture */
    CHECK_EQ_U64(oc.status_at_end, CAPTURE_STATUS_ACTIVE);
    CHECK_EQ_U64(oc.end_result, 0);
    GPU_OK(gpu.StreamSynchronize(ps));
    GPU_OK(gpu.MemFree(oc.buffer));
    CHECK_OK(tp_pool_forget_stream(pool, tps));
    CHECK_OK(tp_pool_destroy(pool));
    GPU_OK(cap.StreamDestroy(ps));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

static void capture_vmm(void) { capture_alloc_memset_free(true, false, CAPTURE_MODE_RELAXED); }
static void capture_vmm_with_traffic(void) { capture_alloc_memset_free(true, true, CAPTURE_MODE_RELAXED); }
static void capture_segment(void) { capture_alloc_memset_free(false, false, CAPTURE_MODE_RELAXED); }
static void capture_segment_with_traffic(void) { capture_alloc_memset_free(false, true, CAPTURE_MODE_RELAXED); }
static void capture_vmm_global(void) { capture_alloc_memset_free(true, true, CAPTURE_MODE_GLOBAL); }
static void capture_segment_global(void) { capture_alloc_memset_free(false, true, CAPTURE_MODE_GLOBAL); }
static void vmm_beside_a_global_capture(void) { pool_work_beside_a_global_capture(true); }
static void segment_beside_a_global_capture(void) { pool_work_beside_a_global_capture(false); }

static const test_case tests[] = {
    TEST_CASE(capture_vmm),
    TEST_CASE(capture_vmm_with_traffic),
    TEST_CASE(capture_segment),
    TEST_CASE(capture_segment_with_traffic),
    TEST_CASE(capture_vmm_global),
    TEST_CASE(capture_segment_global),
    TEST_CASE(vmm_beside_a_global_capture),
    TEST_CASE(segment_beside_a_global_capture),
};

int main(int argc, char **argv) {
    gpu_init(); /* exits 77 without a device */
    capture_load();
    test_log log = {0};
    tp_device *dev = gpu_open(gpu_spec(), &log);
    tp_device_info info;
    CHECK_OK(tp_device_get_info(dev, &info));
    CHECK_OK(tp_device_close(dev));
    if (check_failures) return 1;
    size_t first = info.vmm_enabled ? 0 : 2;
    int rc = test_main("test_gpu_capture", tests + first, TEST_COUNT(tests) - first, argc, argv);
    gpu_fini();
    return rc;
}
