/* SPDX-License-Identifier: MIT */
/* The VMM ops of the CUDA backend against their contract in internal.h (the
 * simulator's semantics), on a real GPU:
 *   - map backs every page with its own allocation: after mapping a run,
 *     unmapping any sub-run gives its memory back (cuMemGetInfo) and leaves
 *     the other pages' contents intact; the sub-run can be mapped again,
 *     in other pieces than it was mapped in;
 *   - refusals, before the driver is called: map over mapped pages or
 *     outside a reservation, unmap of a run with an unmapped page (nothing
 *     is unmapped), misaligned arguments, va_release with pages mapped;
 *   - runs longer than the on-stack handle array, and thousands of single
 *     pages unmapped in random order (the page table's deletions);
 *   - device out of memory: with gran=1GiB, mapping more than the card has
 *     fails with TP_ERR_OUT_OF_MEMORY and undoes everything it did;
 *   - map/unmap from several threads at once, each on its own reservation,
 *     with the data of every page checked. */
#include "gpu_common.h"
#include "internal.h"

#include <pthread.h>

static uint64_t G; /* granularity */

static uint64_t page(uint64_t va, uint64_t i) { return va + i * G; }

static void fill_pages(uint64_t va, uint64_t first, uint64_t count, unsigned char base) {
    for (uint64_t i = first; i < first + count; i++)
        GPU_OK(gpu.MemsetD8Async(page(va, i), (unsigned char)(base + i), G, NULL));
}

static uint64_t check_pages(uint64_t va, uint64_t first, uint64_t count, unsigned char base) {
    uint64_t bad = 0;
    for (uint64_t i = first; i < first + count; i++) {
        uint64_t n = gpu_count_mismatch(page(va, i), G, (unsigned char)(base + i), TP_STREAM_DEFAULT, NULL);
        if (n) fprintf(stderr, "  page %llu: %llu bytes wrong\n", (unsigned long long)i, (unsigned long long)n);
        bad += n;
    }
    return bad;
}

static void test_semantics(tp_device *dev) {
    const tpi_device_ops *ops = dev->ops;
    const uint64_t pages = 256;
    uint64_t va = 0;
    CHECK_OK(ops->va_reserve(dev, pages * G, G, &va));
    CHECK_NE_U64(va, 0);
    CHECK_EQ_U64(va % G, 0);

    uint64_t free0 = gpu_free_bytes();
    CHECK_OK(ops->map(dev, va, 64 * G, 0));
    uint64_t free1 = gpu_free_bytes();
    printf("  mapping 64 pages took %.1f MiB of free memory\n", (double)(free0 - free1) / TEST_MiB);
    CHECK_GE_U64(free0, free1);
    CHECK_GE_U64(free0 - free1, 60 * G);
    fill_pages(va, 0, 64, 1);
    CHECK_EQ_U64(check_pages(va, 0, 64, 1), 0);

    /* A sub-run goes back on its own. */
    CHECK_OK(ops->unmap(dev, page(va, 16), 32 * G));
    uint64_t free2 = gpu_free_bytes();
    printf("  unmapping 32 of them gave back %.1f MiB\n", (double)(free2 - free1) / TEST_MiB);
    CHECK_GE_U64(free2, free1);
    CHECK_GE_U64(free2 - free1, 30 * G);
    CHECK_EQ_U64(check_pages(va, 0, 16, 1), 0);
    CHECK_EQ_U64(check_pages(va, 48, 16, 1), 0);

    /* Remap part of the hole in other pieces. */
    CHECK_OK(ops->map(dev, page(va, 16), 4 * G, 0));
    CHECK_OK(ops->map(dev, page(va, 20), 1 * G, 0));
    fill_pages(va, 16, 5, 101);
    CHECK_EQ_U64(check_pages(va, 16, 5, 101), 0);

    /* Refusals. */
    CHECK_STATUS(ops->map(dev, page(va, 20), 2 * G, 0), TP_ERR_INVALID_ARGUMENT);   /* page 20 is mapped */
    CHECK_STATUS(ops->map(dev, page(va, 0), 1 * G, 0), TP_ERR_INVALID_ARGUMENT);    /* mapped */
    CHECK_STATUS(ops->unmap(dev, page(va, 19), 3 * G), TP_ERR_INVALID_ARGUMENT); /* page 21 is not */
    CHECK_STATUS(ops->unmap(dev, page(va, 30), 1 * G), TP_ERR_INVALID_ARGUMENT); /* never mapped again */
    CHECK_STATUS(ops->map(dev, va + pages * G, G, 0), TP_ERR_INVALID_ARGUMENT);     /* outside */
    CHECK_STATUS(ops->map(dev, page(va, 250), 8 * G, 0), TP_ERR_INVALID_ARGUMENT);  /* runs off the end */
    CHECK_STATUS(ops->map(dev, page(va, 100) + 4096, G, 0), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ops->map(dev, page(va, 100), G / 2, 0), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ops->unmap(dev, page(va, 0), 0), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ops->va_release(dev, va, pages * G), TP_ERR_INVALID_ARGUMENT); /* pages mapped */
    CHECK_STATUS(ops->va_release(dev, va + G, (pages - 1) * G), TP_ERR_INVALID_ARGUMENT);
    /* Nothing changed by the refusals. */
    CHECK_EQ_U64(check_pages(va, 19, 2, 101), 0);
    CHECK_EQ_U64(check_pages(va, 0, 16, 1), 0);

    /* A long run (more than the on-stack handle array) in one call. */
    CHECK_OK(ops->map(dev, page(va, 64), 150 * G, 0));
    fill_pages(va, 64, 150, 7);
    CHECK_EQ_U64(check_pages(va, 64, 150, 7), 0);

    /* Unmap everything in pieces unrelated to how it was mapped. */
    CHECK_OK(ops->unmap(dev, page(va, 0), 10 * G));
    CHECK_OK(ops->unmap(dev, page(va, 10), 11 * G)); /* 10..20: two map calls' pages */
    CHECK_OK(ops->unmap(dev, page(va, 48), 100 * G));
    CHECK_EQ_U64(check_pages(va, 148, 66, 7), 0);
    CHECK_OK(ops->unmap(dev, page(va, 148), 66 * G));
    CHECK_STATUS(ops->unmap(dev, page(va, 148), G), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(ops->va_release(dev, va, pages * G));
    CHECK_STATUS(ops->va_release(dev, va, pages * G), TP_ERR_INVALID_ARGUMENT);
    uint64_t free3 = gpu_free_bytes();
    CHECK_MSG(free3 + 4 * G >= free0, "free memory %llu MiB after, %llu MiB before",
              (unsigned long long)(free3 / TEST_MiB), (unsigned long long)(free0 / TEST_MiB));
}

/* Chunks: several pages backed by one physical allocation, unmapped only
 * whole; the data in them survives a refused unmap. */
static void test_chunks(tp_device *dev) {
    const tpi_device_ops *ops = dev->ops;
    uint64_t va = 0;
    CHECK_OK(ops->va_reserve(dev, 64 * G, G, &va));
    uint64_t free0 = gpu_free_bytes();
    CHECK_OK(ops->map(dev, va, 20 * G, 8 * G)); /* chunks of 8, 8 and 4 pages */
    CHECK_GE_U64(free0 - gpu_free_bytes(), 18 * G);
    fill_pages(va, 0, 20, 3);
    CHECK_STATUS(ops->unmap(dev, va, 4 * G), TP_ERR_INVALID_ARGUMENT);            /* cuts the first chunk */
    CHECK_STATUS(ops->unmap(dev, page(va, 2), 6 * G), TP_ERR_INVALID_ARGUMENT);   /* starts inside it */
    CHECK_STATUS(ops->unmap(dev, page(va, 8), 10 * G), TP_ERR_INVALID_ARGUMENT);  /* ends inside the last */
    CHECK_STATUS(ops->map(dev, page(va, 32), 4 * G, 3 * G / 2), TP_ERR_INVALID_ARGUMENT); /* not whole pages */
    CHECK_EQ_U64(check_pages(va, 0, 20, 3), 0);
    CHECK_OK(ops->unmap(dev, page(va, 8), 8 * G)); /* the middle chunk */
    CHECK_EQ_U64(check_pages(va, 0, 8, 3), 0);
    CHECK_EQ_U64(check_pages(va, 16, 4, 3), 0);
    CHECK_OK(ops->map(dev, page(va, 8), 8 * G, 64 * G)); /* one chunk, larger than the run asked */
    fill_pages(va, 8, 8, 5);
    CHECK_EQ_U64(check_pages(va, 8, 8, 5), 0);
    CHECK_EQ_U64(check_pages(va, 0, 8, 3), 0);
    CHECK_OK(ops->unmap(dev, va, 20 * G)); /* whole chunks of two map calls, in one call */
    CHECK_OK(ops->va_release(dev, va, 64 * G));
    CHECK_MSG(gpu_free_bytes() + 4 * G >= free0, "free memory not back after the chunks went");
}

/* Thousands of single pages, unmapped one by one in random order: the page
 * table grows, deletes with backward shifts, and shrinks. */
static void test_many_pages(tp_device *dev) {
    const tpi_device_ops *ops = dev->ops;
    const uint64_t pages = gpu_quick() ? 600 : 3000;
    uint64_t va = 0;
    CHECK_OK(ops->va_reserve(dev, pages * G, 0, &va));
    uint64_t free0 = gpu_free_bytes();
    double t0 = gpu_seconds();
    for (uint64_t i = 0; i < pages; i++) CHECK_OK(ops->map(dev, page(va, i), G, 0));
    double t1 = gpu_seconds();
    uint64_t *order = malloc(pages * sizeof *order);
    REQUIRE(order != NULL);
    for (uint64_t i = 0; i < pages; i++) order[i] = i;
    test_rng rng = {42};
    for (uint64_t i = pages - 1; i > 0; i--) {
        uint64_t j = rng_below(&rng, i + 1), t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    double t2 = gpu_seconds();
    for (uint64_t k = 0; k < pages; k++) {
        CHECK_OK(ops->unmap(dev, page(va, order[k]), G));
        if (k % 97 == 0) {
            /* Unmapping one already gone is refused, and so is mapping over one still there. */
            CHECK_STATUS(ops->unmap(dev, page(va, order[k]), G), TP_ERR_INVALID_ARGUMENT);
            if (k + 1 < pages) CHECK_STATUS(ops->map(dev, page(va, order[k + 1]), G, 0), TP_ERR_INVALID_ARGUMENT);
        }
    }
    double t3 = gpu_seconds();
    printf("  %llu single pages: map %.1f us each, unmap %.1f us each\n", (unsigned long long)pages,
           (t1 - t0) / pages * 1e6, (t3 - t2) / pages * 1e6);
    free(order);
    CHECK_OK(ops->va_release(dev, va, pages * G));
    CHECK_GE_U64(gpu_free_bytes() + 4 * G, free0);
}

/* With 1 GiB pages, ask for more than the card has. */
static void test_device_oom(void) {
    char spec[64];
    snprintf(spec, sizeof spec, "%s,gran=1GiB", gpu_spec());
    test_log log = {0};
    tp_device *dev = gpu_open(spec, &log);
    const tpi_device_ops *ops = dev->ops;
    uint64_t gib = TEST_GiB;
    uint64_t free0 = gpu_free_bytes();
    uint64_t pages = free0 / gib + 4;
    uint64_t va = 0;
    CHECK_OK(ops->va_reserve(dev, pages * gib, 0, &va));
    double t0 = gpu_seconds();
    CHECK_STATUS(ops->map(dev, va, pages * gib, 0), TP_ERR_OUT_OF_MEMORY);
    double t1 = gpu_seconds();
    uint64_t free1 = gpu_free_bytes();
    printf("  map of %llu GiB with %llu GiB free: TP_ERR_OUT_OF_MEMORY after %.2f s; free %.1f GiB before, %.1f after\n",
           (unsigned long long)pages, (unsigned long long)(free0 / gib), t1 - t0, free0 / (double)gib,
           free1 / (double)gib);
    CHECK_GE_U64(free1 + gib, free0); /* everything undone */
    CHECK_GE_U64(log.warnings, 1);
    /* Nothing is left mapped: the whole run is still free to map in part. */
    CHECK_OK(ops->map(dev, va, 2 * gib, 0));
    GPU_OK(gpu.MemsetD8Async(va, 0x5c, 2 * gib, NULL));
    CHECK_EQ_U64(gpu_count_mismatch(va + gib + 12345, 4096, 0x5c, TP_STREAM_DEFAULT, NULL), 0);
    CHECK_OK(ops->unmap(dev, va, gib));
    CHECK_OK(ops->unmap(dev, va + gib, gib));
    CHECK_OK(ops->va_release(dev, va, pages * gib));
    CHECK_OK(tp_device_close(dev));
}

typedef struct worker {
    tp_device *dev;
    int id;
    uint64_t errors;
} worker;

/* Each thread: its own reservation of 64 pages, random map/unmap runs, the
 * contents of every mapped page checked now and then. */
static void *map_worker(void *arg) {
    worker *w = arg;
    gpu_bind_thread();
    tp_device *dev = w->dev;
    const uint64_t pages = 64;
    bool mapped[64] = {false};
    unsigned char value[64];
    uint64_t va = 0;
    CHECK_OK(dev->ops->va_reserve(dev, pages * G, 0, &va));
    test_rng rng = {1000u + (unsigned)w->id};
    int rounds = gpu_quick() ? 60 : 300;
    for (int r = 0; r < rounds; r++) {
        uint64_t first = rng_below(&rng, pages), count = 1 + rng_below(&rng, 8);
        if (first + count > pages) count = pages - first;
        bool all_mapped = true, none_mapped = true;
        for (uint64_t i = first; i < first + count; i++) {
            all_mapped &= mapped[i];
            none_mapped &= !mapped[i];
        }
        if (none_mapped) {
            CHECK_OK(dev->ops->map(dev, page(va, first), count * G, 0));
            for (uint64_t i = first; i < first + count; i++) {
                mapped[i] = true;
                value[i] = (unsigned char)(w->id * 16 + r);
                GPU_OK(gpu.MemsetD8Async(page(va, i), value[i], G, NULL));
            }
        } else if (all_mapped) {
            CHECK_OK(dev->ops->unmap(dev, page(va, first), count * G));
            for (uint64_t i = first; i < first + count; i++) mapped[i] = false;
        } else {
            CHECK_STATUS(dev->ops->map(dev, page(va, first), count * G, 0), TP_ERR_INVALID_ARGUMENT);
            CHECK_STATUS(dev->ops->unmap(dev, page(va, first), count * G), TP_ERR_INVALID_ARGUMENT);
        }
        if (r % 50 == 49) {
            for (uint64_t i = 0; i < pages; i++)
                if (mapped[i]) w->errors += gpu_count_mismatch(page(va, i), G, value[i], TP_STREAM_DEFAULT, NULL);
        }
    }
    for (uint64_t i = 0; i < pages; i++)
        if (mapped[i]) {
            w->errors += gpu_count_mismatch(page(va, i), G, value[i], TP_STREAM_DEFAULT, NULL);
            CHECK_OK(dev->ops->unmap(dev, page(va, i), G));
        }
    CHECK_OK(dev->ops->va_release(dev, va, pages * G));
    return NULL;
}

static void test_threads(tp_device *dev) {
    enum { THREADS = 6 };
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){dev, i, 0};
        REQUIRE(pthread_create(&t[i], NULL, map_worker, &w[i]) == 0);
    }
    uint64_t errors = 0;
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        errors += w[i].errors;
    }
    CHECK_MSG(errors == 0, "%llu bytes wrong after concurrent map/unmap", (unsigned long long)errors);
}

/* semantics, many_pages, chunks and threads share one device (and its log), as
 * they always did; refusals_were_logged looks at that log afterwards and
 * closes the device. */
static tp_device *shared_dev;
static test_log shared_log;

static void semantics(void) { test_semantics(shared_dev); }
static void many_pages(void) { test_many_pages(shared_dev); }
static void chunks(void) { test_chunks(shared_dev); }
static void threads(void) { test_threads(shared_dev); }
static void refusals_were_logged(void) {
    CHECK_GT_U64(shared_log.errors, 0); /* the refusals are logged */
    CHECK_OK(tp_device_close(shared_dev));
    shared_dev = NULL;
}

static const test_case tests[] = {
    TEST_CASE(semantics),
    TEST_CASE(many_pages),
    TEST_CASE(chunks),
    TEST_CASE(threads),
    TEST_CASE(refusals_were_logged),
    TEST_CASE(test_device_oom),
};

int main(int argc, char **argv) {
    gpu_init(); /* exits 77 without a device */
    shared_dev = gpu_open(gpu_spec(), &shared_log);
    tp_device_info info;
    CHECK_OK(tp_device_get_info(shared_dev, &info));
    if (!info.vmm_enabled) {
        CHECK_OK(tp_device_close(shared_dev));
        gpu_fini();
        printf("SKIP: no CUDA device (device has no VMM support)\n");
        return 77;
    }
    G = info.granularity_bytes;
    int rc = TEST_MAIN("test_gpu_map", tests, argc, argv);
    if (shared_dev) tp_device_close(shared_dev); /* refusals_were_logged was not selected */
    gpu_fini();
    return rc;
}
