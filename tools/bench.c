/* SPDX-License-Identifier: MIT */
/*
 * bench.c -- `tide bench`: the cost of a cached allocation, measured as
 * alloc+free pairs on one stream, for every tidepool pool the device has and
 * for a faithful model of ggml's legacy CUDA pool (baselines.c), side by
 * side in one run.
 *
 * Method: each pool first serves a warm-up pass of the same request
 * sequence, so the timed passes are cache hits (no device call; the tool
 * checks the pool's device-call counter did not move and says so if it
 * did). Each figure is the median of --runs timed passes of --pairs pairs.
 *   same size:    one size (--size, default 1 MiB) over and over; also at
 *                 4 KiB, a typical small tensor.
 *   random sizes: a fixed sequence of sizes log-uniform in 256 B..64 MiB.
 * The simulated device runs with its hazard checker off ("nocheck"), as a
 * real GPU would.
 *
 * The floor: the simplest cache that could serve the same sequences, timed
 * through the same harness (same loop, same indirect calls): a LIFO stack
 * of addresses per size class (4 classes per power of two), filled from a
 * bump arena on a miss; free finds the stack from the address alone. No
 * streams, no statistics, no lock. Tidepool's hit path is reported as a
 * multiple of it: each run times the default pool's pass and then the
 * floor's, and the ratio is the median of the runs' ratios, so a host whose
 * speed drifts from run to run (the H200 host's does) moves both sides.
 *
 * Threads: N threads share ONE default pool, each on its own stream
 * (tp_stream_create, on the simulated device and on CUDA alike), each doing
 * --pairs 4 KiB alloc+free pairs after a warm-up; pairs/s over all threads
 * from the common start to the last thread's end, median of --runs runs.
 * Beside it, the same threads on a default pool each: nothing of tidepool
 * is shared, so its speedup is what the host allows (cores, shared caches,
 * clock boost that drops as more cores run), the ceiling for the shared
 * pool's. Each run times 1, 2, ..., N threads in turn, one pool and then a
 * pool each; every speedup or ratio is the median of the runs' own ratios.
 */
#include "replay.h"
#include "tide.h"
#include "tide_run.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RANDOM_SIZES 4096
#define MAX_THREADS 256

/* Every timed pass folds the addresses it was given in here, so that no
 * compiler can drop the work. */
static volatile uint64_t bench_sink;

typedef struct bench_target {
    const char *name;
    const replay_pool_factory *factory;
    void *impl;
    tp_device *device;
} bench_target;

static void bench_usage(FILE *out) {
    fprintf(out,
            "usage: tide bench [options]\n\n"
            "Measures cached alloc+free pairs on one stream (the hit path) for tidepool's pools and for a\n"
            "model of ggml's legacy CUDA pool, in the same run, against the floor (a per-size-class LIFO\n"
            "free list: the simplest cache for the same sequence), and pairs/s with several threads on\n"
            "one pool beside the same threads on a pool each (what the host allows with nothing shared).\n"
            "Figures are medians of several runs.\n\n"
            "options:\n"
            "  --device SPEC   device (default sim:64GiB,nocheck; cuda:0 on a GPU)\n"
            "  --size SIZE     the same-size request (default 1MiB)\n"
            "  --pairs N       pairs per timed run, 1 to 10^12 (default 1000000)\n"
            "  --runs N        timed runs, 1 to 64; the median is reported (default 7)\n"
            "  --threads N     also 1..N threads on one default pool and on a pool each, 4 KiB\n"
            "                  pairs, a stream each (default 2; at most the number of online CPUs)\n"
            "  --json          one JSON object\n"
            "  -h, --help      this text\n");
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ns per pair over `pairs` pairs cycling through sizes[]. The next size's
 * index wraps with a compare, not `i % size_count`: a 64-bit division in
 * the loop (tens of cycles on some hosts) took longer than the floor's own
 * work, so the floor timed the division (20 ns a pair on the 2-core
 * development host, 8 ns without it). */
static double time_pairs(bench_target *t, const uint64_t *sizes, size_t size_count, uint64_t pairs, bool *ok) {
    uint64_t start = replay_now_ns(), sum = 0;
    size_t next = 0;
    for (uint64_t i = 0; i < pairs; i++) {
        uint64_t bytes = sizes[next], address = 0;
        if (++next == size_count) next = 0;
        if (t->factory->ops->alloc(t->impl, bytes, TP_STREAM_DEFAULT, &address) != REPLAY_OK ||
            t->factory->ops->free(t->impl, address, bytes, TP_STREAM_DEFAULT) != REPLAY_OK) {
            *ok = false;
            return 0;
        }
        sum += address;
    }
    uint64_t end = replay_now_ns();
    bench_sink += sum;
    return (double)(end - start) / (double)pairs;
}

/* Sorts the runs' samples; returns their median. */
static double median_of(double *samples, int runs) {
    qsort(samples, (size_t)runs, sizeof *samples, compare_double);
    return samples[runs / 2];
}

/* The median of the per-run ratios a[r] / b[r]. */
static double median_ratio(const double *a, const double *b, int runs) {
    double ratios[64];
    for (int r = 0; r < runs; r++) ratios[r] = b[r] > 0 ? a[r] / b[r] : 0;
    return median_of(ratios, runs);
}

/* Median over runs of t's timed passes, after one warm-up pass; sets
 * *device_calls_in_timed to the device calls t's timed passes made. With
 * beside (the floor; NULL: none) each run times t's pass and then beside's,
 * so a host whose speed drifts between runs moves both: *out_beside is
 * beside's median, *out_ratio the median of the per-run ratios t / beside
 * (what the ratio targets are about). 0 when a pass failed (*ok false). */
static double measure(bench_target *t, bench_target *beside, const uint64_t *sizes, size_t size_count,
                      uint64_t pairs, int runs, uint64_t *device_calls_in_timed, double *out_beside, double *out_ratio,
                      bool *ok) {
    double samples[64], beside_samples[64];
    uint64_t warm = size_count * 4 > pairs ? pairs : size_count * 4;
    time_pairs(t, sizes, size_count, warm, ok);
    if (beside) time_pairs(beside, sizes, size_count, warm, ok);
    replay_counters before = {0}, after = {0};
    t->factory->ops->counters(t->impl, &before);
    for (int r = 0; r < runs && *ok; r++) {
        samples[r] = time_pairs(t, sizes, size_count, pairs, ok);
        if (beside) beside_samples[r] = time_pairs(beside, sizes, size_count, pairs, ok);
    }
    t->factory->ops->counters(t->impl, &after);
    *device_calls_in_timed = after.device_calls - before.device_calls;
    if (!*ok) return 0;
    if (beside) {
        *out_ratio = median_ratio(samples, beside_samples, runs);
        *out_beside = median_of(beside_samples, runs);
    }
    return median_of(samples, runs);
}

/* ------------------------------------------------------------- the floor */

/* Size classes: 4 per power of two (256 B, 320, 384, 448, 512, 640, ...).
 * Class c's blocks come from its own region of a (never touched) address
 * range, so free maps an address to its class with a subtraction and a
 * shift. Sizes up to 2^40 bytes. */
#define FLOOR_BASE (1ull << 56)
#define FLOOR_REGION_SHIFT 48
#define FLOOR_MAX_BYTES (1ull << 40)
#define FLOOR_CLASSES 132

typedef struct floor_bin {
    uint64_t *items; /* the LIFO stack */
    uint32_t count, capacity;
    uint64_t next; /* bump pointer into the class's region (misses only) */
} floor_bin;

typedef struct floor_cache {
    floor_bin bins[FLOOR_CLASSES];
} floor_cache;

static inline unsigned floor_class(uint64_t bytes) {
    if (bytes <= 256) return 0;
    uint64_t b = bytes - 1;
    unsigned lg = 63u - (unsigned)__builtin_clzll(b); /* >= 8 */
    return 1 + (lg - 8) * 4 + (unsigned)((b >> (lg - 2)) & 3);
}

static uint64_t floor_class_bytes(unsigned c) {
    if (c == 0) return 256;
    unsigned lg = 8 + (c - 1) / 4, sub = (c - 1) % 4;
    return (uint64_t)(5 + sub) << (lg - 2);
}

static void *floor_create(tp_device *device, const tp_pool_config *config, char *err, size_t capacity) {
    (void)device, (void)config;
    floor_cache *f = calloc(1, sizeof *f);
    if (!f) snprintf(err, capacity, "out of host memory");
    return f;
}

static replay_status floor_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    (void)stream;
    floor_cache *f = impl;
    if (bytes > FLOOR_MAX_BYTES) return REPLAY_OOM;
    unsigned c = floor_class(bytes);
    floor_bin *bin = &f->bins[c];
    if (bin->count) {
        *out = bin->items[--bin->count];
        return REPLAY_OK;
    }
    uint64_t block = floor_class_bytes(c);
    if (bin->next + block > (1ull << FLOOR_REGION_SHIFT)) return REPLAY_OOM;
    *out = FLOOR_BASE + ((uint64_t)c << FLOOR_REGION_SHIFT) + bin->next;
    bin->next += block;
    return REPLAY_OK;
}

static replay_status floor_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)bytes, (void)stream; /* by address alone, as tp_pool_free */
    floor_cache *f = impl;
    floor_bin *bin = &f->bins[(address - FLOOR_BASE) >> FLOOR_REGION_SHIFT];
    if (bin->count == bin->capacity) {
        uint32_t grown = bin->capacity ? bin->capacity * 2 : 64;
        uint64_t *items = realloc(bin->items, grown * sizeof *items);
        if (!items) return REPLAY_ERROR;
        bin->items = items;
        bin->capacity = grown;
    }
    bin->items[bin->count++] = address;
    return REPLAY_OK;
}

static void floor_counters(void *impl, replay_counters *out) {
    (void)impl;
    memset(out, 0, sizeof *out);
}

static void floor_destroy(void *impl) {
    floor_cache *f = impl;
    for (unsigned c = 0; c < FLOOR_CLASSES; c++) free(f->bins[c].items);
    free(f);
}

static const replay_pool_ops floor_ops = {
    .alloc = floor_alloc, .free = floor_free, .counters = floor_counters, .destroy = floor_destroy};
static const replay_pool_factory floor_factory = {"floor", false, floor_create, &floor_ops};

/* ----------------------------------------------------------- the threads */

typedef struct thread_shared {
    uint64_t pairs;
    atomic_int ready;
    atomic_int go;
    atomic_int errors;
} thread_shared;

/* One cache line (or more) each: the workers sit in one array, and a
 * worker that wrote a field its neighbour's line holds would make the
 * threads wait on each other, not on the pool. */
typedef struct thread_worker {
    _Alignas(64) thread_shared *sh;
    tp_pool *pool;
    tp_stream stream;
    uint64_t end_ns;
    uint64_t sum;
    pthread_t thread;
} thread_worker;

static bool thread_pairs(thread_worker *w, uint64_t pairs) {
    tp_pool *pool = w->pool;
    tp_stream stream = w->stream;
    uint64_t sum = 0;
    bool ok = true;
    for (uint64_t i = 0; i < pairs && ok; i++) {
        void *p = NULL;
        ok = tp_pool_alloc(pool, 4 * TIDE_KiB, stream, &p) == TP_OK && tp_pool_free(pool, p, stream) == TP_OK;
        sum += (uint64_t)(uintptr_t)p;
    }
    w->sum += sum;
    return ok;
}

static void *thread_main(void *arg) {
    thread_worker *w = arg;
    thread_shared *sh = w->sh;
    bool ok = thread_pairs(w, sh->pairs < 1000 ? sh->pairs : 1000); /* warm-up */
    atomic_fetch_add(&sh->ready, 1);
    while (!atomic_load_explicit(&sh->go, memory_order_acquire)) sched_yield();
    ok = ok && thread_pairs(w, sh->pairs);
    w->end_ns = replay_now_ns();
    if (!ok) atomic_fetch_add(&sh->errors, 1);
    return NULL;
}

/* Pairs per second over n threads, one run, thread i on pools[i] (all the
 * same pool, or one each) and streams[i]; 0 on failure. */
static double threads_run(tp_pool *const *pools, const tp_stream *streams, int n, uint64_t pairs) {
    thread_shared sh = {.pairs = pairs};
    atomic_init(&sh.ready, 0);
    atomic_init(&sh.go, 0);
    atomic_init(&sh.errors, 0);
    thread_worker workers[MAX_THREADS];
    int started = 0;
    for (; started < n; started++) {
        workers[started] = (thread_worker){.sh = &sh, .pool = pools[started], .stream = streams[started]};
        if (pthread_create(&workers[started].thread, NULL, thread_main, &workers[started]) != 0) break;
    }
    if (started < n) atomic_fetch_add(&sh.errors, 1);
    while (atomic_load(&sh.ready) < started) sched_yield();
    uint64_t start = replay_now_ns(), end = start;
    atomic_store_explicit(&sh.go, 1, memory_order_release);
    for (int i = 0; i < started; i++) {
        pthread_join(workers[i].thread, NULL);
        if (workers[i].end_ns > end) end = workers[i].end_ns;
        bench_sink += workers[i].sum;
    }
    if (atomic_load(&sh.errors) || end == start) return 0;
    return (double)n * (double)pairs * 1e9 / (double)(end - start);
}

/* What measure_threads found: for 1..max_threads threads ([n - 1]), the
 * median pairs/s with every thread on one shared pool and with a pool per
 * thread, and the medians of the runs' ratios: n threads / one thread (for
 * each), and shared / own. */
typedef struct threads_figures {
    double shared[MAX_THREADS], own[MAX_THREADS];
    double speedup_shared[MAX_THREADS], speedup_own[MAX_THREADS], shared_over_own[MAX_THREADS];
    uint64_t device_calls; /* device calls the pools made in the timed runs */
} threads_figures;

/* Threads on pools of the default kind, each thread on its own stream.
 * Each round runs, for n = 1, 2, ..., max_threads in turn, n threads on
 * ONE pool and then n threads on a pool each (nothing of tidepool shared:
 * what the host itself allows), so a host whose speed drifts between
 * rounds moves all of them alike. False (message printed) on failure. */
static bool measure_threads(const char *device_spec, int max_threads, uint64_t pairs, int runs,
                            threads_figures *out) {
    tp_device *device = NULL;
    tp_pool *shared_pool = NULL, *own_pools[MAX_THREADS] = {0}, *shared_row[MAX_THREADS];
    tp_stream streams[MAX_THREADS] = {0};
    int stream_count = 0, own_count = 0;
    bool ok = false;
    if (tp_device_open(device_spec, NULL, &device) != TP_OK) {
        fprintf(stderr, "tide bench: cannot open device '%s'\n", device_spec);
        return false;
    }
    tp_pool_config pc = {0}; /* TP_POOL_AUTO: the default pool */
    tp_status st = tp_pool_create(device, &pc, &shared_pool);
    for (; st == TP_OK && own_count < max_threads; own_count++) {
        st = tp_pool_create(device, &pc, &own_pools[own_count]);
        if (st != TP_OK) break;
    }
    if (st != TP_OK) {
        fprintf(stderr, "tide bench: threads: creating a pool failed: %s\n", tp_status_name(st));
        goto out;
    }
    for (; stream_count < max_threads; stream_count++) {
        shared_row[stream_count] = shared_pool;
        st = tp_stream_create(device, &streams[stream_count]);
        if (st != TP_OK) {
            fprintf(stderr, "tide bench: threads: creating a stream failed: %s\n", tp_status_name(st));
            goto out;
        }
    }
    static double shared[MAX_THREADS][64], own[MAX_THREADS][64]; /* [threads - 1][run] */
    uint64_t warm_pairs = pairs < 10000 ? pairs : 10000;
    for (int n = 1; n <= max_threads; n++) {
        threads_run(shared_row, streams, n, warm_pairs);
        threads_run(own_pools, streams, n, warm_pairs);
    }
    uint64_t calls_before = 0, calls_after = 0;
    tp_pool_stats stats;
    for (int i = 0; i <= max_threads; i++) {
        tp_pool_get_stats(i ? own_pools[i - 1] : shared_pool, &stats);
        calls_before += stats.device_calls;
    }
    for (int r = 0; r < runs; r++) {
        for (int n = 1; n <= max_threads; n++) {
            shared[n - 1][r] = threads_run(shared_row, streams, n, pairs);
            own[n - 1][r] = threads_run(own_pools, streams, n, pairs);
            if (shared[n - 1][r] <= 0 || own[n - 1][r] <= 0) {
                fprintf(stderr, "tide bench: threads: an allocation or a thread failed with %d threads\n", n);
                goto out;
            }
        }
    }
    for (int i = 0; i <= max_threads; i++) {
        tp_pool_get_stats(i ? own_pools[i - 1] : shared_pool, &stats);
        calls_after += stats.device_calls;
    }
    out->device_calls = calls_after - calls_before;
    /* Every ratio first, from the runs as they came: sorting one thread's
     * samples would unpair them from the runs they were measured in. */
    for (int n = 1; n <= max_threads; n++) {
        out->speedup_shared[n - 1] = median_ratio(shared[n - 1], shared[0], runs);
        out->speedup_own[n - 1] = median_ratio(own[n - 1], own[0], runs);
        out->shared_over_own[n - 1] = median_ratio(shared[n - 1], own[n - 1], runs);
    }
    for (int n = 1; n <= max_threads; n++) {
        out->shared[n - 1] = median_of(shared[n - 1], runs);
        out->own[n - 1] = median_of(own[n - 1], runs);
    }
    ok = true;
out:
    for (int i = 0; i < stream_count; i++) {
        if (shared_pool) tp_pool_forget_stream(shared_pool, streams[i]);
        if (own_pools[i]) tp_pool_forget_stream(own_pools[i], streams[i]);
        tp_stream_destroy(device, streams[i]);
    }
    if (shared_pool) tp_pool_destroy(shared_pool);
    for (int i = 0; i < own_count; i++) tp_pool_destroy(own_pools[i]);
    tp_device_close(device);
    return ok;
}

int tide_bench(int argc, char **argv) {
    const char *device_spec = "sim:64GiB,nocheck";
    uint64_t size = TIDE_MiB, pairs = 1000000;
    int runs = 7, threads = 2;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            bench_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--device") && v) {
            device_spec = v;
            i++;
        } else if (!strcmp(a, "--size")) {
            if (!tide_parse_bytes_option(a, v, &size)) return 2;
            if (size == 0) {
                fprintf(stderr, "tide bench: --size needs at least 1 byte, got '%s'\n", v);
                return 2;
            }
            i++;
        } else if (!strcmp(a, "--pairs")) {
            if (!tide_parse_count_option("tide bench", a, v, 1, 1000000000000ull, &pairs)) return 2;
            i++;
        } else if (!strcmp(a, "--runs")) {
            uint64_t n;
            if (!tide_parse_count_option("tide bench", a, v, 1, 64, &n)) return 2;
            runs = (int)n;
            i++;
        } else if (!strcmp(a, "--threads") && v) {
            char *end = NULL;
            long n = strtol(v, &end, 10);
            i++;
            if (*v == '\0' || *end != '\0' || n < 1 || n > MAX_THREADS) {
                fprintf(stderr, "tide bench: --threads must be 1..%d\n", MAX_THREADS);
                return 2;
            }
            threads = (int)n;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else {
            fprintf(stderr, "tide bench: unknown or incomplete option '%s' (see tide bench --help)\n", a);
            return 2;
        }
    }

    static uint64_t random_sizes[RANDOM_SIZES];
    uint64_t state = 0x7469646570ull; /* fixed: every run sees the same sequence */
    for (size_t i = 0; i < RANDOM_SIZES; i++) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;
        unsigned bits = 8 + (unsigned)((state >> 33) % 18); /* 2^8 .. 2^25 */
        uint64_t base = 1ull << bits;
        random_sizes[i] = base + ((state >> 7) & (base - 1)); /* up to 2^26 = 64 MiB */
    }
    const uint64_t small_size = 4 * TIDE_KiB;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int threads_asked = threads;
    if (cpus >= 1 && threads > cpus) threads = (int)cpus;

    tp_device *probe = NULL;
    if (tp_device_open(device_spec, NULL, &probe) != TP_OK) {
        fprintf(stderr, "tide bench: cannot open device '%s'\n", device_spec);
        return 2;
    }
    tp_device_info info;
    tp_device_get_info(probe, &info);
    tp_device_close(probe);

    const char *names[3];
    int name_count = 0;
    if (info.vmm_enabled) names[name_count++] = "vmm";
    names[name_count++] = "segment";
    names[name_count++] = "ggml-legacy";

    if (json)
        printf("{\"device\":\"%s\",\"device_name\":\"%s\",\"size_bytes\":%llu,\"pairs_per_run\":%llu,\"runs\":%d,"
               "\"statistic\":\"median\",\"pools\":{",
               device_spec, info.name, (unsigned long long)size, (unsigned long long)pairs, runs);
    else
        printf("tide bench on %s (%s): alloc+free pairs on one stream, median of %d runs of %llu pairs\n\n"
               "%-12s %16s %16s %18s\n",
               device_spec, info.name, runs, (unsigned long long)pairs, "pool", "same size", "same 4 KiB",
               "random 256B-64MiB");
    int status = 0;
    double first_same = 0, first_small = 0, first_random = 0;
    /* The floor runs beside the first (the default) pool, run for run, on
     * the same sequences through the same harness. */
    bench_target floor = {"floor", &floor_factory, NULL, NULL};
    double floor_same = 0, floor_small = 0, floor_random = 0;
    double ratio_same = 0, ratio_small = 0, ratio_random = 0;
    {
        char err[256] = "";
        floor.impl = floor.factory->create(NULL, NULL, err, sizeof err);
        if (!floor.impl) {
            fprintf(stderr, "tide bench: the floor: %s\n", err);
            return 1;
        }
    }
    for (int k = 0; k < name_count; k++) {
        bench_target t = {names[k], replay_find_pool(names[k]), NULL, NULL};
        char err[256] = "";
        if (tp_device_open(device_spec, NULL, &t.device) != TP_OK) {
            fprintf(stderr, "tide bench: cannot open device '%s'\n", device_spec);
            return 1;
        }
        tp_pool_config pc = {0};
        t.impl = t.factory->create(t.device, &pc, err, sizeof err);
        if (!t.impl) {
            fprintf(stderr, "tide bench: %s: %s\n", names[k], err);
            tp_device_close(t.device);
            status = 1;
            continue;
        }
        bool ok = true;
        uint64_t calls_same = 0, calls_small = 0, calls_random = 0;
        bench_target *beside = k == 0 ? &floor : NULL; /* the floor runs beside the default pool */
        double same = measure(&t, beside, &size, 1, pairs, runs, &calls_same, &floor_same, &ratio_same, &ok);
        double small =
            measure(&t, beside, &small_size, 1, pairs, runs, &calls_small, &floor_small, &ratio_small, &ok);
        double random = measure(&t, beside, random_sizes, RANDOM_SIZES, pairs, runs, &calls_random, &floor_random,
                                &ratio_random, &ok);
        if (!ok) {
            fprintf(stderr, "tide bench: %s: an allocation failed\n", names[k]);
            status = 1;
        }
        if (k == 0) {
            first_same = same;
            first_small = small;
            first_random = random;
        }
        if (json) {
            printf("%s\"%s\":{\"hit_ns_per_pair_same_size\":%.1f,\"hit_ns_per_pair_same_4KiB\":%.1f,"
                   "\"hit_ns_per_pair_random_sizes\":%.1f,\"device_calls_while_timed\":%llu}",
                   k ? "," : "", names[k], same, small, random,
                   (unsigned long long)(calls_same + calls_small + calls_random));
        } else {
            printf("%-12s %13.1f ns %13.1f ns %15.1f ns\n", names[k], same, small, random);
            if (calls_same + calls_small + calls_random)
                printf("%-12s (%llu device calls during the timed runs: not all pairs were cache hits)\n", "",
                       (unsigned long long)(calls_same + calls_small + calls_random));
        }
        t.factory->ops->destroy(t.impl);
        tp_device_close(t.device);
    }

    floor.factory->ops->destroy(floor.impl);

    static threads_figures tf;
    if (!measure_threads(device_spec, threads, pairs, runs, &tf)) status = 1;

    char size_text[32];
    tide_bytes(size, size_text, sizeof size_text);
    if (json) {
        printf("},\"default_pool\":\"%s\",\"hit_ns_per_pair_same_size\":%.1f,\"hit_ns_per_pair_random_sizes\":%.1f,"
               "\"hit_ns_per_pair_same_4KiB\":%.1f,"
               "\"floor_ns_per_pair\":{\"same_size\":%.1f,\"same_4k\":%.1f,\"random\":%.1f},"
               "\"floor_ratio\":{\"same_size\":%.2f,\"same_4k\":%.2f,\"random\":%.2f},"
               "\"threads_pairs_per_s\":{",
               names[0], first_same, first_random, first_small, floor_same, floor_small, floor_random, ratio_same,
               ratio_small, ratio_random);
        for (int n = 1; n <= threads; n++) printf("%s\"%d\":%.0f", n > 1 ? "," : "", n, tf.shared[n - 1]);
        printf("},\"threads_speedup\":{");
        for (int n = 1; n <= threads; n++) printf("%s\"%d\":%.2f", n > 1 ? "," : "", n, tf.speedup_shared[n - 1]);
        printf("},\"threads_own_pools_pairs_per_s\":{");
        for (int n = 1; n <= threads; n++) printf("%s\"%d\":%.0f", n > 1 ? "," : "", n, tf.own[n - 1]);
        printf("},\"threads_own_pools_speedup\":{");
        for (int n = 1; n <= threads; n++) printf("%s\"%d\":%.2f", n > 1 ? "," : "", n, tf.speedup_own[n - 1]);
        printf("},\"threads_shared_over_own\":{");
        for (int n = 1; n <= threads; n++) printf("%s\"%d\":%.2f", n > 1 ? "," : "", n, tf.shared_over_own[n - 1]);
        printf("},\"threads_pair_bytes\":4096,\"threads_device_calls_while_timed\":%llu}\n",
               (unsigned long long)tf.device_calls);
    } else {
        printf("\nsame size = %s; the first row is the device's default pool.\n", size_text);
        printf("\n%s against the floor (a LIFO free list per size class, no streams, no statistics, no lock;\n"
               "same harness, same sequences):\n",
               names[0]);
        const char *labels[3] = {NULL, "same 4 KiB", "random"};
        char same_label[48];
        snprintf(same_label, sizeof same_label, "same %s", size_text);
        labels[0] = same_label;
        double hit[3] = {first_same, first_small, first_random}, fl[3] = {floor_same, floor_small, floor_random};
        double ratio[3] = {ratio_same, ratio_small, ratio_random};
        for (int i = 0; i < 3; i++)
            printf("  %-14s %6.1f ns = %.1fx the floor (%.1f ns)\n", labels[i], hit[i], ratio[i], fl[i]);
        printf("  (each run times the pool, then the floor; the ratio is the median of the runs' ratios)\n");
        printf("\nthreads, each on its own stream, %llu 4 KiB pairs each, on ONE %s pool and, beside it, on a\n"
               "pool each (nothing of tidepool shared: what this host allows); median of %d runs, each\n"
               "timing 1..%d threads in turn; the ratios are medians of the runs' own ratios:\n"
               "  threads   one pool                 a pool each              one pool / a pool each\n",
               (unsigned long long)pairs, names[0], runs, threads);
        for (int n = 1; n <= threads; n++) {
            printf("  %7d   %6.1f M pairs/s %5.2fx   %6.1f M pairs/s %5.2fx   %.2f\n", n, tf.shared[n - 1] / 1e6,
                   tf.speedup_shared[n - 1], tf.own[n - 1] / 1e6, tf.speedup_own[n - 1], tf.shared_over_own[n - 1]);
        }
        printf("  (threads: pairs/s over all threads; x: n threads / one thread)\n");
        if (threads < threads_asked) printf("  (--threads %d capped at the %d online CPUs)\n", threads_asked, threads);
        if (tf.device_calls)
            printf("  (%llu device calls during the timed runs: not all pairs were cache hits)\n",
                   (unsigned long long)tf.device_calls);
    }
    return status;
}
