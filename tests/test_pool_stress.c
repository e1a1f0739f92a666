/* SPDX-License-Identifier: MIT */
/* Randomized stress against a reference model: tens of thousands of seeded
 * operations on several streams (or one: see run), kernels of random durations touching the
 * blocks, cross-stream use ordered by events, trims, ticks, out-of-memory
 * under a limit. After every operation the pool's invariant checker runs;
 * the simulated device's hazard checker watches every hand-out, unmap and
 * free. Invariants: zero hazards, zero invariant violations, no two live
 * blocks overlap, statistics equal the model's sums, no leak at the end.
 * TP_STRESS_OPS overrides the operation count. */
#include "fixture.h"

#include <stdint.h>
#include <string.h>

#define MAX_LIVE 400
#define MAX_STREAMS 4

typedef struct model_block {
    uint64_t address;
    uint64_t bytes;
    int last_stream; /* stream whose queued work last touches it */
} model_block;

typedef struct model {
    model_block live[MAX_LIVE];
    int count;
    uint64_t requested;
} model;

static bool overlaps_live(const model *m, uint64_t address, uint64_t bytes) {
    for (int i = 0; i < m->count; i++)
        if (address < m->live[i].address + m->live[i].bytes && m->live[i].address < address + bytes) return true;
    return false;
}

/* An allocation of bytes on stream, checked: true with its address, which
 * overlaps no live block of the model; false on out of memory (counted in
 * *ooms) or an error (a failed check). */
static bool alloc_checked(tp_pool *pool, const model *m, uint64_t bytes, tp_stream stream, int *ooms,
                          uint64_t *out_address) {
    void *p = NULL;
    tp_status st = tp_pool_alloc(pool, bytes, stream, &p);
    if (st == TP_ERR_OUT_OF_MEMORY) {
        (*ooms)++;
        return false;
    }
    CHECK_STATUS(st, TP_OK);
    if (st != TP_OK) return false;
    *out_address = (uint64_t)(uintptr_t)p;
    CHECK_MSG(!overlaps_live(m, *out_address, bytes), "block 0x%llx+%llu overlaps a live block",
              (unsigned long long)*out_address, (unsigned long long)bytes);
    return true;
}

/* On stream_count streams (1..MAX_STREAMS); with one, a quarter of the
 * operations are temporaries that resize the last-freed block. */
static void run(tp_pool_kind kind, unsigned long long seed, int ops, int stream_count) {
    tp_pool_config pc = {.kind = kind,
                         .limit_bytes = 1536 * TEST_MiB,
                         .release_threshold_bytes = 32 * TEST_MiB,
                         .idle_release_ns = 500000,
                         .flags = TP_POOL_FLAG_CHECK_INVARIANTS};
    fixture f;
    fixture_open(&f, kind == TP_POOL_VMM ? "sim:4GiB" : "sim:4GiB,novmm", kind, &pc);
    tp_device *dev = f.dev;
    tp_pool *pool = f.pool;
    tp_stream streams[MAX_STREAMS] = {TP_STREAM_DEFAULT};
    for (int i = 1; i < stream_count; i++) REQUIRE(tp_stream_create(dev, &streams[i]) == TP_OK);
    tp_event event;
    REQUIRE(tp_event_create(dev, &event) == TP_OK);

    static model m;
    memset(&m, 0, sizeof m);
    test_rng rng = {seed * 7919 + (unsigned long long)kind};
    int ooms = 0, allocs = 0, cross = 0, temporaries = 0;
    for (int op = 0; op < ops && check_failures < 10; op++) {
        unsigned roll = (unsigned)rng_below(&rng, 100);
        if (stream_count == 1 && roll % 4 == 0) {
            /* (One stream: a quarter of the operations are this instead.)
             * A temporary of 64 KiB..64 MiB, written and freed at once: the
             * next one finds the block in the last-freed slot and, asking
             * for another size, has it resized where it lies when it can
             * (on the hit path), over and over: what the several streams'
             * operations rarely do, the slot being one for the pool. */
            uint64_t bytes = rng_log_uniform(&rng, 64 * 1024, 64 * TEST_MiB), address;
            if (!alloc_checked(pool, &m, bytes, streams[0], &ooms, &address)) continue;
            tp_range r = {address, bytes};
            CHECK_OK(tp_sim_launch(dev, streams[0], rng_below(&rng, 200000), &r, 1));
            CHECK_OK(tp_pool_free(pool, (void *)(uintptr_t)address, streams[0]));
            allocs++;
            temporaries++;
        } else if (roll < 45 && m.count < MAX_LIVE) {
            int s = (int)rng_below(&rng, (uint64_t)stream_count);
            uint64_t bytes = rng_log_uniform(&rng, 1, rng_below(&rng, 10) == 0 ? 256 * TEST_MiB : 4 * TEST_MiB), address;
            if (!alloc_checked(pool, &m, bytes, streams[s], &ooms, &address)) continue;
            m.live[m.count++] = (model_block){address, bytes, s};
            m.requested += bytes;
            allocs++;
            /* The new owner writes it right away. */
            tp_range r = {address, bytes};
            CHECK_OK(tp_sim_launch(dev, streams[s], rng_below(&rng, 200000), &r, 1));
        } else if (roll < 85 && m.count) {
            int k = (int)rng_below(&rng, (unsigned long long)m.count);
            model_block b = m.live[k];
            CHECK_OK(tp_pool_free(pool, (void *)(uintptr_t)b.address, streams[b.last_stream]));
            m.requested -= b.bytes;
            m.live[k] = m.live[--m.count];
        } else if (roll < 92 && m.count) {
            /* Another stream uses a live block after waiting for its owner. */
            int k = (int)rng_below(&rng, (unsigned long long)m.count);
            int t = (int)rng_below(&rng, (uint64_t)stream_count);
            model_block *b = &m.live[k];
            if (t != b->last_stream) {
                CHECK_OK(tp_event_record(dev, event, streams[b->last_stream]));
                CHECK_OK(tp_stream_wait_event(dev, streams[t], event));
                cross++;
            }
            tp_range r = {b->address, b->bytes};
            CHECK_OK(tp_sim_launch(dev, streams[t], rng_below(&rng, 300000), &r, 1));
            b->last_stream = t;
        } else if (roll < 97) {
            CHECK_OK(tp_sim_advance(dev, rng_below(&rng, 150000)));
        } else if (roll < 98) {
            CHECK_OK(tp_pool_tick(pool));
        } else if (roll < 99) {
            uint64_t released;
            CHECK_OK(tp_pool_trim(pool, rng_below(&rng, 512) * TEST_MiB, &released));
        } else {
            CHECK_OK(tp_pool_reset_peaks(pool));
        }
        tp_pool_stats st;
        CHECK_OK(tp_pool_get_stats(pool, &st));
        CHECK_EQ_U64(st.requested_bytes.current, m.requested);
        CHECK_LE_U64(st.reserved_bytes.current, pc.limit_bytes);
    }
    while (m.count) {
        model_block b = m.live[--m.count];
        CHECK_OK(tp_pool_free(pool, (void *)(uintptr_t)b.address, streams[b.last_stream]));
    }
    char msg[256] = "";
    tp_status cst = tp_pool_check(pool, msg, sizeof msg);
    CHECK_MSG(cst == TP_OK, "%s", msg);
    CHECK_EQ_U64(f.log.errors, 0);
    tp_pool_stats st;
    CHECK_OK(tp_pool_get_stats(pool, &st));
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_MSG(c.hazards == 0, "%llu hazards (handout %llu unmap %llu free %llu)", (unsigned long long)c.hazards,
              (unsigned long long)c.hazards_handout, (unsigned long long)c.hazards_unmap,
              (unsigned long long)c.hazards_free);
    CHECK_EQ_U64(c.invalid_accesses, 0);
    CHECK_EQ_U64(st.hazards, 0);
    printf("  %s seed %llu, %d stream%s: %d ops, %d allocs (%d temporaries), %d OOMs, %d cross-stream uses; "
           "device calls %llu, cross-stream waits %llu, syncs %llu, events %llu, peak reserved %.1f MiB\n",
           kind == TP_POOL_VMM ? "vmm" : "segment", seed, stream_count, stream_count == 1 ? "" : "s", ops, allocs,
           temporaries, ooms, cross,
           (unsigned long long)st.device_calls, (unsigned long long)st.cross_stream_waits,
           (unsigned long long)st.synchronizations, (unsigned long long)st.events_recorded,
           st.reserved_bytes.peak / (double)TEST_MiB);
    CHECK_GT_I64(allocs, ops / 4);
    CHECK_OK(tp_event_destroy(dev, event));
    for (int i = 1; i < stream_count; i++) CHECK_OK(tp_pool_forget_stream(pool, streams[i]));
    for (int i = 1; i < stream_count; i++) CHECK_OK(tp_stream_destroy(dev, streams[i]));
    fixture_close(&f); /* no leak, no hazard once the pool is gone */
}

static int stress_ops(void) { return getenv("TP_STRESS_OPS") ? atoi(getenv("TP_STRESS_OPS")) : 30000; }

/* The hit path decides as the locked path: two pools, on two devices of
 * the same kind, get the same seeded calls on one stream, temporaries
 * freed at once and blocks kept a while, small and large (bins, the
 * last-freed slot in place or resized, and blocks the hit itself places
 * or parks over the slot's: tpi_front_hit_alone), with the clock moving
 * so that idle memory ages and goes back, with room to spare and under a
 * tight limit (out of memory). The second pool has an observer, which
 * keeps every call on the locked path. Every call must return the
 * same status and address from both, and the statistics and the device's
 * counters must agree at the end. (No kernels: hand-outs ask the device
 * nothing either way.) */
static void nothing_observed(void *user, const tp_pool_event *event) {
    (void)user;
    (void)event;
}

static void hits_decide_as_the_locked_path(tp_pool_kind kind, unsigned long long seed, int ops, uint64_t limit_bytes) {
    tp_pool_config pc = {.kind = kind, .limit_bytes = limit_bytes, .idle_release_ns = 2000000};
    fixture f[2];
    const char *spec = kind == TP_POOL_VMM ? "sim:4GiB" : "sim:4GiB,novmm";
    for (int i = 0; i < 2; i++) fixture_open_with(&f[i], spec, kind, &pc, false);
    CHECK_OK(tp_pool_set_observer(f[1].pool, nothing_observed, NULL));
    enum { LIVE = 48 };
    void *live[2][LIVE];
    int count = 0, allocs = 0, ooms = 0;
    test_rng rng = {seed * 104729 + (unsigned long long)kind};
    for (int op = 0; op < ops && check_failures < 5; op++) {
        unsigned roll = (unsigned)rng_below(&rng, 100);
        if (roll < 50 && count < LIVE) {
            bool large = rng_below(&rng, 2) == 0;
            uint64_t bytes = large ? rng_log_uniform(&rng, 64 * 1024, 96 * TEST_MiB) : rng_log_uniform(&rng, 1, 64 * 1024);
            bool temporary = rng_below(&rng, 3) == 0;
            void *p[2] = {NULL, NULL};
            tp_status st[2];
            for (int i = 0; i < 2; i++) st[i] = tp_pool_alloc(f[i].pool, bytes, TP_STREAM_DEFAULT, &p[i]);
            CHECK_EQ_I64(st[0], st[1]);
            CHECK_MSG(p[0] == p[1], "op %d: %llu bytes at %p with hits, %p on the locked path", op,
                      (unsigned long long)bytes, p[0], p[1]);
            if (st[0] != TP_OK) {
                ooms++;
                continue;
            }
            allocs++;
            if (temporary) {
                for (int i = 0; i < 2; i++) CHECK_OK(tp_pool_free(f[i].pool, p[i], TP_STREAM_DEFAULT));
            } else {
                live[0][count] = p[0];
                live[1][count++] = p[1];
            }
        } else if (roll < 90 && count) {
            int k = rng_below(&rng, 2) ? count - 1 : (int)rng_below(&rng, (unsigned long long)count);
            for (int i = 0; i < 2; i++) {
                CHECK_OK(tp_pool_free(f[i].pool, live[i][k], TP_STREAM_DEFAULT));
                live[i][k] = live[i][count - 1];
            }
            count--;
        } else if (roll < 99) {
            uint64_t ns = rng_below(&rng, 800000);
            for (int i = 0; i < 2; i++) CHECK_OK(tp_sim_advance(f[i].dev, ns));
        } else {
            for (int i = 0; i < 2; i++) CHECK_OK(tp_pool_tick(f[i].pool));
        }
    }
    tp_pool_stats st[2];
    tp_sim_counters c[2];
    for (int i = 0; i < 2; i++) {
        CHECK_OK(tp_pool_get_stats(f[i].pool, &st[i]));
        CHECK_OK(tp_sim_get_counters(f[i].dev, &c[i]));
    }
    CHECK_EQ_U64(st[0].reserved_bytes.current, st[1].reserved_bytes.current);
    CHECK_EQ_U64(st[0].reserved_bytes.peak, st[1].reserved_bytes.peak);
    CHECK_EQ_U64(st[0].allocated_bytes.peak, st[1].allocated_bytes.peak);
    CHECK_EQ_U64(st[0].cached_bytes.current, st[1].cached_bytes.current);
    CHECK_EQ_U64(st[0].device_allocs, st[1].device_allocs);
    CHECK_EQ_U64(st[0].device_frees, st[1].device_frees);
    CHECK_EQ_U64(st[0].cache_hits, st[1].cache_hits);
    CHECK_EQ_U64(c[0].calls[TP_SIM_OP_ANY], c[1].calls[TP_SIM_OP_ANY]);
    CHECK_EQ_U64(c[0].physical_peak_bytes, c[1].physical_peak_bytes);
    printf("  %s seed %llu: %d ops, %d allocs, %d OOMs, %llu device calls, peak reserved %.1f MiB\n",
           kind == TP_POOL_VMM ? "vmm" : "segment", seed, ops, allocs, ooms,
           (unsigned long long)c[0].calls[TP_SIM_OP_ANY], st[0].reserved_bytes.peak / (double)TEST_MiB);
    CHECK_GT_I64(allocs, ops / 4);
    for (int i = 0; i < 2; i++) {
        for (int k = 0; k < count; k++) CHECK_OK(tp_pool_free(f[i].pool, live[i][k], TP_STREAM_DEFAULT));
        fixture_close(&f[i]);
    }
}

/* Seeds 1-3 with room to spare; 4 and 5 under a tight limit, where
 * placement often needs memory the pool cannot get without the ladder's
 * steps (flushes, releases, out of memory). */
static void hits_decide_as_the_locked_path_vmm(void) {
    for (unsigned long long seed = 1; seed <= 5; seed++)
        hits_decide_as_the_locked_path(TP_POOL_VMM, seed, stress_ops(), (seed <= 3 ? 1536 : 320) * TEST_MiB);
}
static void hits_decide_as_the_locked_path_segment(void) {
    for (unsigned long long seed = 1; seed <= 5; seed++)
        hits_decide_as_the_locked_path(TP_POOL_SEGMENT, seed, stress_ops(), (seed <= 3 ? 1536 : 320) * TEST_MiB);
}

#define STRESS_TEST(kind, name, seed) \
    static void stress_##name##_seed##seed(void) { run(kind, seed, stress_ops(), MAX_STREAMS); }
#define STRESS_TEST_ONE_STREAM(kind, name, seed) \
    static void stress_##name##_one_stream_seed##seed(void) { run(kind, seed, stress_ops(), 1); }
STRESS_TEST(TP_POOL_VMM, vmm, 1)
STRESS_TEST(TP_POOL_SEGMENT, segment, 1)
STRESS_TEST(TP_POOL_VMM, vmm, 2)
STRESS_TEST(TP_POOL_SEGMENT, segment, 2)
STRESS_TEST(TP_POOL_VMM, vmm, 3)
STRESS_TEST(TP_POOL_SEGMENT, segment, 3)
STRESS_TEST_ONE_STREAM(TP_POOL_VMM, vmm, 1)
STRESS_TEST_ONE_STREAM(TP_POOL_VMM, vmm, 2)

static const test_case tests[] = {
    TEST_CASE(stress_vmm_seed1), TEST_CASE(stress_segment_seed1), TEST_CASE(stress_vmm_seed2),
    TEST_CASE(stress_segment_seed2), TEST_CASE(stress_vmm_seed3), TEST_CASE(stress_segment_seed3),
    TEST_CASE(stress_vmm_one_stream_seed1), TEST_CASE(stress_vmm_one_stream_seed2),
    TEST_CASE(hits_decide_as_the_locked_path_vmm), TEST_CASE(hits_decide_as_the_locked_path_segment),
};

int main(int argc, char **argv) { return TEST_MAIN("test_pool_stress", tests, argc, argv); }
