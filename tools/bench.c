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
 */
#include "replay.h"
#include "tide.h"

#include "tide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANDOM_SIZES 4096

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
            "model of ggml's legacy CUDA pool, in the same run. Figures are medians of several runs.\n\n"
            "options:\n"
            "  --device SPEC   device (default sim:64GiB,nocheck; cuda:0 on a GPU)\n"
            "  --size SIZE     the same-size request (default 1MiB)\n"
            "  --pairs N       pairs per timed run (default 1000000)\n"
            "  --runs N        timed runs; the median is reported (default 7)\n"
            "  --json          one JSON object\n"
            "  -h, --help      this text\n");
}

static int compare_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* ns per pair over `pairs` pairs cycling through sizes[]. */
static double time_pairs(bench_target *t, const uint64_t *sizes, size_t size_count, uint64_t pairs, bool *ok) {
    uint64_t start = replay_now_ns();
    for (uint64_t i = 0; i < pairs; i++) {
        uint64_t bytes = sizes[i % size_count], address = 0;
        if (t->factory->ops->alloc(t->impl, bytes, TP_STREAM_DEFAULT, &address) != REPLAY_OK ||
            t->factory->ops->free(t->impl, address, bytes, TP_STREAM_DEFAULT) != REPLAY_OK) {
            *ok = false;
            return 0;
        }
    }
    return (double)(replay_now_ns() - start) / (double)pairs;
}

/* Median over runs of the timed passes, after one warm-up pass. Sets
 * *device_calls_in_timed to the device calls the timed passes made. */
static double measure(bench_target *t, const uint64_t *sizes, size_t size_count, uint64_t pairs, int runs,
                      uint64_t *device_calls_in_timed, bool *ok) {
    double samples[64];
    time_pairs(t, sizes, size_count, size_count * 4 > pairs ? pairs : size_count * 4, ok);
    replay_counters before = {0}, after = {0};
    t->factory->ops->counters(t->impl, &before);
    for (int r = 0; r < runs && *ok; r++) samples[r] = time_pairs(t, sizes, size_count, pairs, ok);
    t->factory->ops->counters(t->impl, &after);
    *device_calls_in_timed = after.device_calls - before.device_calls;
    qsort(samples, (size_t)runs, sizeof *samples, compare_double);
    return samples[runs / 2];
}

int tide_bench(int argc, char **argv) {
    const char *device_spec = "sim:64GiB,nocheck";
    uint64_t size = TIDE_MiB, pairs = 1000000;
    int runs = 7;
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
            if (!tide_parse_bytes_option(a, v, &size) || size == 0) return 2;
            i++;
        } else if (!strcmp(a, "--pairs") && v) {
            pairs = strtoull(v, NULL, 10);
            i++;
            if (pairs == 0) {
                fprintf(stderr, "tide bench: --pairs needs a positive number\n");
                return 2;
            }
        } else if (!strcmp(a, "--runs") && v) {
            runs = atoi(v);
            i++;
            if (runs < 1 || runs > 64) {
                fprintf(stderr, "tide bench: --runs must be 1..64\n");
                return 2;
            }
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
    double first_same = 0, first_random = 0;
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
        double same = measure(&t, &size, 1, pairs, runs, &calls_same, &ok);
        double small = measure(&t, &small_size, 1, pairs, runs, &calls_small, &ok);
        double random = measure(&t, random_sizes, RANDOM_SIZES, pairs, runs, &calls_random, &ok);
        if (!ok) {
            fprintf(stderr, "tide bench: %s: an allocation failed\n", names[k]);
            status = 1;
        }
        if (k == 0) {
            first_same = same;
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
    if (json)
        printf("},\"default_pool\":\"%s\",\"hit_ns_per_pair_same_size\":%.1f,\"hit_ns_per_pair_random_sizes\":%.1f}\n",
               names[0], first_same, first_random);
    else
        printf("\nsame size = %s; the first row is the device's default pool.\n",
               tide_bytes(size, (char[32]){0}, 32));
    return status;
}
