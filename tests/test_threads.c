/* SPDX-License-Identifier: MIT */
/* Several threads share one pool (and one simulated device): each allocates
 * on its own stream, launches kernels, frees its own blocks and some handed
 * over by other threads (after ordering its stream behind the owner's with
 * an event), while another thread trims and reads statistics. Run under
 * ThreadSanitizer by CI. Invariants: no error, no hazard, consistent
 * statistics, nothing leaked. */
#include "check.h"

#include <pthread.h>
#include <string.h>

#define THREADS 4
#define OPS_PER_THREAD 4000
#define MAILBOX 64

typedef struct handoff {
    void *ptr;
    uint64_t bytes;
    tp_event ready; /* recorded on the owner's stream after its last use */
} handoff;

typedef struct shared {
    tp_device *dev;
    tp_pool *pool;
    pthread_mutex_t lock;
    handoff mailbox[MAILBOX];
    int mailbox_count;
    bool stop;
    int errors;
} shared;

typedef struct worker {
    shared *sh;
    int id;
    tp_stream stream;
} worker;

static void *worker_main(void *arg) {
    worker *w = arg;
    shared *sh = w->sh;
    test_rng rng = {1000 + (unsigned long long)w->id};
    void *mine[32] = {0};
    uint64_t mine_bytes[32];
    for (int op = 0; op < OPS_PER_THREAD; op++) {
        int k = (int)rng_below(&rng, 32);
        unsigned roll = (unsigned)rng_below(&rng, 100);
        if (!mine[k]) {
            uint64_t bytes = rng_log_uniform(&rng, 256, 8 * TEST_MiB);
            if (tp_pool_alloc(sh->pool, bytes, w->stream, &mine[k]) != TP_OK) {
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
                continue;
            }
            mine_bytes[k] = bytes;
            tp_range r = {(uint64_t)(uintptr_t)mine[k], bytes};
            tp_sim_launch(sh->dev, w->stream, rng_below(&rng, 20000), &r, 1);
        } else if (roll < 20) {
            /* Hand the block to another thread. */
            tp_event ev;
            if (tp_event_create(sh->dev, &ev) != TP_OK || tp_event_record(sh->dev, ev, w->stream) != TP_OK) {
                __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
                continue;
            }
            pthread_mutex_lock(&sh->lock);
            if (sh->mailbox_count < MAILBOX) {
                sh->mailbox[sh->mailbox_count++] = (handoff){mine[k], mine_bytes[k], ev};
                mine[k] = NULL;
            }
            pthread_mutex_unlock(&sh->lock);
            if (mine[k]) tp_event_destroy(sh->dev, ev);
        } else {
            if (tp_pool_free(sh->pool, mine[k], w->stream) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            mine[k] = NULL;
        }
        /* Take over a block from another thread: order after its owner. */
        handoff h = {0};
        pthread_mutex_lock(&sh->lock);
        if (sh->mailbox_count && rng_below(&rng, 4) == 0) h = sh->mailbox[--sh->mailbox_count];
        pthread_mutex_unlock(&sh->lock);
        if (h.ptr) {
            tp_stream_wait_event(sh->dev, w->stream, h.ready);
            tp_range r = {(uint64_t)(uintptr_t)h.ptr, h.bytes};
            tp_sim_launch(sh->dev, w->stream, rng_below(&rng, 20000), &r, 1);
            if (tp_pool_free(sh->pool, h.ptr, w->stream) != TP_OK) __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
            tp_event_destroy(sh->dev, h.ready);
        }
        if (op % 50 == 0) tp_sim_advance(sh->dev, 10000);
    }
    for (int k = 0; k < 32; k++)
        if (mine[k] && tp_pool_free(sh->pool, mine[k], w->stream) != TP_OK)
            __atomic_add_fetch(&sh->errors, 1, __ATOMIC_RELAXED);
    return NULL;
}

static void *housekeeper_main(void *arg) {
    shared *sh = arg;
    while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
        tp_pool_stats s;
        tp_pool_get_stats(sh->pool, &s);
        uint64_t released;
        tp_pool_trim(sh->pool, 64 * TEST_MiB, &released);
        tp_pool_tick(sh->pool);
        char json[2048];
        tp_pool_stats_json(sh->pool, json, sizeof json, NULL);
        sched_yield();
    }
    return NULL;
}

static void run(tp_pool_kind kind) {
    shared sh;
    memset(&sh, 0, sizeof sh);
    pthread_mutex_init(&sh.lock, NULL);
    REQUIRE(tp_device_open(kind == TP_POOL_VMM ? "sim:8GiB" : "sim:8GiB,novmm", NULL, &sh.dev) == TP_OK);
    tp_pool_config pc = {.kind = kind, .release_threshold_bytes = 32 * TEST_MiB};
    REQUIRE(tp_pool_create(sh.dev, &pc, &sh.pool) == TP_OK);
    worker workers[THREADS];
    pthread_t threads[THREADS], housekeeper;
    for (int i = 0; i < THREADS; i++) {
        workers[i] = (worker){&sh, i, TP_STREAM_DEFAULT};
        REQUIRE(tp_stream_create(sh.dev, &workers[i].stream) == TP_OK);
    }
    pthread_create(&housekeeper, NULL, housekeeper_main, &sh);
    for (int i = 0; i < THREADS; i++) pthread_create(&threads[i], NULL, worker_main, &workers[i]);
    for (int i = 0; i < THREADS; i++) pthread_join(threads[i], NULL);
    __atomic_store_n(&sh.stop, true, __ATOMIC_RELEASE);
    pthread_join(housekeeper, NULL);
    /* Blocks still in the mailbox: freed by their last user's stream. */
    for (int i = 0; i < sh.mailbox_count; i++) {
        CHECK_OK(tp_stream_wait_event(sh.dev, workers[0].stream, sh.mailbox[i].ready));
        CHECK_OK(tp_pool_free(sh.pool, sh.mailbox[i].ptr, workers[0].stream));
        CHECK_OK(tp_event_destroy(sh.dev, sh.mailbox[i].ready));
    }
    CHECK_EQ_U64(sh.errors, 0);
    char msg[256] = "";
    tp_status st = tp_pool_check(sh.pool, msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "%s", msg);
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(sh.pool, &s));
    CHECK_EQ_U64(s.allocated_bytes.current, 0);
    CHECK_EQ_U64(s.requested_bytes.current, 0);
    CHECK_EQ_U64(s.allocs, s.frees);
    CHECK_GT_U64(s.allocs, THREADS * OPS_PER_THREAD / 4);
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(sh.dev, &c));
    CHECK_MSG(c.hazards == 0, "%llu hazards", (unsigned long long)c.hazards);
    printf("  %s: %llu allocs by %d threads, %llu cross-stream waits, %llu events, 0 hazards\n",
           kind == TP_POOL_VMM ? "vmm" : "segment", (unsigned long long)s.allocs, THREADS,
           (unsigned long long)s.cross_stream_waits, (unsigned long long)s.events_recorded);
    for (int i = 0; i < THREADS; i++) CHECK_OK(tp_pool_forget_stream(sh.pool, workers[i].stream));
    CHECK_OK(tp_pool_destroy(sh.pool));
    CHECK_OK(tp_sim_get_counters(sh.dev, &c));
    CHECK_EQ_U64(c.physical_used_bytes, 0);
    for (int i = 0; i < THREADS; i++) CHECK_OK(tp_stream_destroy(sh.dev, workers[i].stream));
    CHECK_OK(tp_device_close(sh.dev));
    pthread_mutex_destroy(&sh.lock);
}

static void four_threads_share_a_vmm_pool(void) { run(TP_POOL_VMM); }
static void four_threads_share_a_segment_pool(void) { run(TP_POOL_SEGMENT); }

static const test_case tests[] = {
    TEST_CASE(four_threads_share_a_vmm_pool),
    TEST_CASE(four_threads_share_a_segment_pool),
};

int main(int argc, char **argv) { return TEST_MAIN("test_threads", tests, argc, argv); }
