/* SPDX-License-Identifier: MIT */
/* Real work through a shared pool, to catch aliasing: several threads, each
 * with its own stream, allocate blocks, write a byte pattern of their own
 * into each (cuMemsetD8Async), and free them stream-ordered -- always after
 * a late rewrite queued behind other work, so that memory the pool hands to
 * another stream too early gets overwritten after that stream wrote its own
 * pattern. A trimmer thread meanwhile releases idle memory (unmapping pages
 * or freeing segments while the other streams run). Every live block is
 * copied back (cuMemcpyDtoHAsync) and checked byte for byte, now and then
 * and at the end. Runs on the VMM pool ("cuda:N") and the segment pool
 * ("cuda:N,novmm"). */
#include "gpu_common.h"
#include "internal.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

enum { THREADS = 4, MAX_LIVE = 48 };

typedef struct block {
    void *ptr;
    uint64_t bytes;
    unsigned char pattern;
} block;

typedef struct worker {
    tp_device *dev;
    tp_pool *pool;
    int id;
    int ops;
    uint64_t bad_bytes;
    uint64_t bad_blocks;
    uint64_t allocs, frees, verified_bytes;
    int ooms;
} worker;

static atomic_int workers_running;

/* Keeps stream s busy for a while (0..3 passes over a 64 MiB scratch). */
static void delay(gpu_ptr scratch, int passes, tp_stream s) {
    for (int i = 0; i < passes; i++) GPU_OK(gpu.MemsetD8Async(scratch, (unsigned char)i, 64u << 20, (gpu_stream)s));
}

static void verify(worker *w, const block *b, tp_stream s) {
    uint64_t first_bad = 0;
    uint64_t bad = gpu_count_mismatch(gpu_addr(b->ptr), b->bytes, b->pattern, s, &first_bad);
    w->verified_bytes += b->bytes;
    if (bad) {
        w->bad_bytes += bad;
        w->bad_blocks++;
        fprintf(stderr, "  thread %d: block %p (%llu bytes, pattern 0x%02x): %llu bytes wrong, first at +%llu\n", w->id,
                b->ptr, (unsigned long long)b->bytes, b->pattern, (unsigned long long)bad,
                (unsigned long long)first_bad);
    }
}

static void *work(void *arg) {
    worker *w = arg;
    gpu_bind_thread();
    tp_stream s;
    CHECK_OK(tp_stream_create(w->dev, &s));
    gpu_ptr scratch = 0;
    GPU_OK(gpu.MemAlloc(&scratch, 64u << 20));
    block live[MAX_LIVE];
    int live_count = 0;
    unsigned counter = 0;
    test_rng rng = {(unsigned long long)(77 + w->id)};
    for (int op = 0; op < w->ops; op++) {
        unsigned long long r = rng_below(&rng, 100);
        if (r < 50 && live_count < MAX_LIVE) {
            uint64_t bytes = rng_below(&rng, 20) == 0 ? rng_log_uniform(&rng, 16 * TEST_MiB, 128 * TEST_MiB)
                                                      : rng_log_uniform(&rng, 1, 16 * TEST_MiB);
            void *p = NULL;
            tp_status st = tp_pool_alloc(w->pool, bytes, s, &p);
            if (st == TP_ERR_OUT_OF_MEMORY) {
                w->ooms++;
                continue;
            }
            CHECK_STATUS(st, TP_OK);
            if (st != TP_OK) break;
            w->allocs++;
            block *b = &live[live_count++];
            b->ptr = p;
            b->bytes = bytes;
            b->pattern = (unsigned char)(1 + (w->id * 61 + (int)(counter++) * 7) % 255);
            delay(scratch, (int)rng_below(&rng, 3), s);
            GPU_OK(gpu.MemsetD8Async(gpu_addr(p), b->pattern, bytes, (gpu_stream)s));
        } else if (r < 85 && live_count > 0) {
            int i = (int)rng_below(&rng, (unsigned long long)live_count);
            block *b = &live[i];
            /* A late rewrite of the same pattern, then the stream-ordered free. */
            delay(scratch, 1 + (int)rng_below(&rng, 3), s);
            GPU_OK(gpu.MemsetD8Async(gpu_addr(b->ptr), b->pattern, b->bytes, (gpu_stream)s));
            CHECK_OK(tp_pool_free(w->pool, b->ptr, s));
            w->frees++;
            live[i] = live[--live_count];
        } else if (live_count > 0) {
            verify(w, &live[rng_below(&rng, (unsigned long long)live_count)], s);
        }
        if (op % 200 == 199)
            for (int i = 0; i < live_count; i++) verify(w, &live[i], s);
    }
    for (int i = 0; i < live_count; i++) {
        verify(w, &live[i], s);
        CHECK_OK(tp_pool_free(w->pool, live[i].ptr, s));
        w->frees++;
    }
    CHECK_OK(tp_pool_forget_stream(w->pool, s));
    CHECK_OK(tp_stream_destroy(w->dev, s));
    GPU_OK(gpu.MemFree(scratch));
    atomic_fetch_sub(&workers_running, 1);
    return NULL;
}

typedef struct trimmer {
    tp_pool *pool;
    int trims;
    uint64_t released;
} trimmer;

static void *trim_loop(void *arg) {
    trimmer *t = arg;
    gpu_bind_thread();
    while (atomic_load(&workers_running) > 0) {
        usleep(3000);
        tp_pool_stats s;
        CHECK_OK(tp_pool_get_stats(t->pool, &s));
        uint64_t released = 0;
        if (t->trims % 4 == 3) {
            CHECK_OK(tp_pool_tick(t->pool));
        } else {
            CHECK_OK(tp_pool_trim(t->pool, s.reserved_bytes.current / 2, &released));
        }
        t->released += released;
        t->trims++;
    }
    return NULL;
}

static void run(bool vmm) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s%s", gpu_spec(), vmm ? "" : ",novmm");
    test_log log = {0};
    tp_device *dev = gpu_open(spec, &log);
    tp_pool *pool = NULL;
    tp_pool_config pc = {.kind = vmm ? TP_POOL_VMM : TP_POOL_SEGMENT,
                         .limit_bytes = 12 * TEST_GiB,
                         .release_threshold_bytes = 32 * TEST_MiB,
                         .idle_release_ns = 10000000};
    REQUIRE(tp_pool_create(dev, &pc, &pool) == TP_OK);
    worker w[THREADS];
    pthread_t threads[THREADS], trim_thread;
    trimmer tr = {pool, 0, 0};
    atomic_store(&workers_running, THREADS);
    double t0 = gpu_seconds();
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){.dev = dev, .pool = pool, .id = i, .ops = gpu_quick() ? 400 : 3000};
        REQUIRE(pthread_create(&threads[i], NULL, work, &w[i]) == 0);
    }
    REQUIRE(pthread_create(&trim_thread, NULL, trim_loop, &tr) == 0);
    uint64_t bad = 0, bad_blocks = 0, allocs = 0, frees = 0, verified = 0;
    int ooms = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(threads[i], NULL);
        bad += w[i].bad_bytes;
        bad_blocks += w[i].bad_blocks;
        allocs += w[i].allocs;
        frees += w[i].frees;
        verified += w[i].verified_bytes;
        ooms += w[i].ooms;
    }
    pthread_join(trim_thread, NULL);
    double t1 = gpu_seconds();
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(pool, &s));
    printf("  %s: %d threads, %llu allocs, %llu frees, %.1f GiB verified in %.1f s; %d trims released %.0f MiB; "
           "%llu device allocs / %llu frees, %llu cross-stream waits, %llu host syncs, %d OOMs\n",
           vmm ? "vmm" : "segment", THREADS, (unsigned long long)allocs, (unsigned long long)frees,
           verified / (double)TEST_GiB, t1 - t0, tr.trims, tr.released / (double)TEST_MiB,
           (unsigned long long)s.device_allocs, (unsigned long long)s.device_frees,
           (unsigned long long)s.cross_stream_waits, (unsigned long long)s.synchronizations, ooms);
    CHECK_MSG(bad == 0, "%llu bytes in %llu blocks held another stream's data: aliasing", (unsigned long long)bad,
              (unsigned long long)bad_blocks);
    CHECK_EQ_U64(allocs, frees);
    CHECK_EQ_U64(s.allocated_bytes.current, 0);
    CHECK_EQ_U64(s.device_errors, 0);
    CHECK_EQ_U64(ooms, 0);
    char msg[256] = "";
    CHECK_MSG(tp_pool_check(pool, msg, sizeof msg) == TP_OK, "%s", msg);
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_EQ_U64(log.errors, 0);
    CHECK_OK(tp_device_close(dev));
}

static void data_survives_reuse_vmm(void) { run(true); }
static void data_survives_reuse_segment(void) { run(false); }

/* The vmm test first; left out where the device has no VMM. */
static const test_case tests[] = {
    TEST_CASE(data_survives_reuse_vmm),
    TEST_CASE(data_survives_reuse_segment),
};

int main(int argc, char **argv) {
    gpu_init(); /* exits 77 without a device */
    test_log log = {0};
    tp_device *dev = gpu_open(gpu_spec(), &log);
    tp_device_info info;
    CHECK_OK(tp_device_get_info(dev, &info));
    CHECK_OK(tp_device_close(dev));
    if (check_failures) return 1;
    size_t first = info.vmm_enabled ? 0 : 1;
    int rc = test_main("test_gpu_data", tests + first, TEST_COUNT(tests) - first, argc, argv);
    gpu_fini();
    return rc;
}
