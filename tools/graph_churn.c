/* SPDX-License-Identifier: MIT */
/*
 * graph_churn.c -- `tide scenario graph-churn`: the image-request loop of
 * failure mode 7 (docs/failure-modes.md) against tidepool's graph cache on
 * the simulated device.
 *
 * Every request brings a graph of a topology never seen before (50..250
 * nodes, seeded) under a new key, run through tp_graph_cache_run; between
 * requests three of --hot steady keys (100 nodes each) are run again. The
 * same loop runs twice on fresh devices, with the cache's byte cap
 * (--cap-mib) and without one, and each run reports the device memory held
 * for graph executables (start, half-way, peak, end), what the cache counted
 * (graph_exec_bytes_peak), evictions by cause, and hot keys re-instantiated
 * once every hot key had been used twice (after WARM_REQUESTS requests).
 * A graph whose executable is larger than the cap (a hot key's is 100 nodes,
 * about 4.7 MiB) gets TP_ERR_RUN_EAGER and runs eagerly, request or hot key
 * alike: the cache counts these runs (eager_fallbacks), so any cap works.
 *
 * The default device pools graph memory as the CUDA driver does
 * ("graphpool": freed executable memory is kept for later ones and an
 * instantiation reports no bytes), so the cache must count executables it
 * cannot measure. Device memory held = the simulated device's physical
 * use; nothing but executables is on the device here.
 */
#include "plot.h"
#include "scenarios.h"
#include "tide.h"

#include "tide.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WARM_REQUESTS 20
#define HOT_NODES 100
#define HOT_PER_REQUEST 3

typedef struct churn_result {
    char label[32];
    bool capped;
    uint64_t cap_bytes;
    uint64_t device_start, device_half, device_peak, device_end;
    uint64_t hot_reinstantiations, hot_reinstantiations_after_warmup;
    tp_graph_cache_stats stats;
    char cache_json[2048];
    double *x;                /* request number, per request */
    uint64_t *device_bytes;   /* device memory held for graphs after it */
    uint64_t *counted_bytes;  /* what the cache counted */
    size_t samples;
} churn_result;

static uint64_t device_graph_bytes(tp_device *dev) {
    tp_sim_counters c;
    return tp_sim_get_counters(dev, &c) == TP_OK ? c.physical_used_bytes : 0;
}

static tp_status make_graph(tp_device *dev, uint32_t nodes, uint64_t topology, tp_graph *out) {
    tp_sim_graph_desc desc = {.node_count = nodes, .topology_id = topology};
    return tp_sim_graph_create(dev, &desc, out);
}

/* One run of the loop. Returns 0, or 1 with a message printed. */
static int churn_once(const char *spec, const scenario_params *params, uint64_t cap_bytes, churn_result *r) {
    const uint64_t requests = params->requests, hot = params->hot_keys;
    r->capped = cap_bytes != TP_BYTES_UNLIMITED;
    r->cap_bytes = cap_bytes;
    if (r->capped)
        snprintf(r->label, sizeof r->label, "cap %llu MiB", (unsigned long long)(cap_bytes / TIDE_MiB));
    else
        snprintf(r->label, sizeof r->label, "no cap");
    r->x = calloc(requests, sizeof *r->x);
    r->device_bytes = calloc(requests, sizeof *r->device_bytes);
    r->counted_bytes = calloc(requests, sizeof *r->counted_bytes);
    tp_graph *hot_graphs = calloc(hot ? hot : 1, sizeof *hot_graphs);
    if (!r->x || !r->device_bytes || !r->counted_bytes || !hot_graphs) {
        free(hot_graphs);
        fprintf(stderr, "tide scenario: out of host memory\n");
        return 1;
    }
    tp_device *dev = NULL;
    tp_graph_cache *cache = NULL;
    tp_stream stream = NULL;
    size_t hot_made = 0;
    int status = 1;
    tp_status st = tp_device_open(spec, NULL, &dev);
    if (st != TP_OK) {
        fprintf(stderr, "tide scenario: cannot open device '%s': %s\n", spec, tp_status_name(st));
        goto done;
    }
    tp_graph_cache_config config = {.max_execs = 1000000, .max_bytes = cap_bytes, .idle_evict_ns = TP_NS_NEVER};
    if ((st = tp_graph_cache_create(dev, &config, &cache)) != TP_OK ||
        (st = tp_stream_create(dev, &stream)) != TP_OK) {
        fprintf(stderr, "tide scenario: graph-churn: setting up on '%s': %s\n", spec, tp_status_name(st));
        goto done;
    }
    r->device_start = r->device_peak = device_graph_bytes(dev);
    while (hot_made < hot) {
        st = make_graph(dev, HOT_NODES, 1 + hot_made, &hot_graphs[hot_made]);
        if (st == TP_ERR_UNSUPPORTED) {
            fprintf(stderr, "tide scenario: graph-churn runs on the simulated device only (got '%s'); on a GPU, "
                            "tests/gpu/test_gpu_graph_churn runs the same loop\n", spec);
            goto done;
        }
        if (st == TP_OK) hot_made++; /* destroyed at the end from here on */
        if (st == TP_OK) st = tp_graph_cache_run(cache, hot_made, hot_graphs[hot_made - 1], NULL, stream);
        if (st != TP_OK && st != TP_ERR_RUN_EAGER) { /* eager: larger than the cap, counted in the stats */
            fprintf(stderr, "tide scenario: graph-churn: hot key %zu: %s\n", hot_made, tp_status_name(st));
            goto done;
        }
    }
    uint64_t rng = params->seed * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t instantiations_warm = 0;
    for (uint64_t q = 0; q < requests; q++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        uint32_t nodes = 50 + (uint32_t)((rng >> 33) % 201);
        uint64_t key = hot + 1 + q;
        tp_graph g = NULL;
        if ((st = make_graph(dev, nodes, key, &g)) != TP_OK) {
            fprintf(stderr, "tide scenario: graph-churn: request %llu: %s\n", (unsigned long long)q + 1,
                    tp_status_name(st));
            goto done;
        }
        st = tp_graph_cache_run(cache, key, g, NULL, stream);
        tp_sim_graph_destroy(dev, g);
        if (st != TP_OK && st != TP_ERR_RUN_EAGER) { /* eager: counted in the stats */
            fprintf(stderr, "tide scenario: graph-churn: request %llu: %s\n", (unsigned long long)q + 1,
                    tp_status_name(st));
            goto done;
        }
        for (uint64_t k = 0; k < HOT_PER_REQUEST && k < hot; k++) {
            uint64_t h = (q + k) % hot;
            st = tp_graph_cache_run(cache, 1 + h, hot_graphs[h], NULL, stream);
            if (st != TP_OK && st != TP_ERR_RUN_EAGER) {
                fprintf(stderr, "tide scenario: graph-churn: hot key %llu: %s\n", (unsigned long long)h + 1,
                        tp_status_name(st));
                goto done;
            }
        }
        tp_graph_cache_get_stats(cache, &r->stats);
        if (q + 1 == WARM_REQUESTS) instantiations_warm = r->stats.instantiations;
        uint64_t held = device_graph_bytes(dev);
        if (held > r->device_peak) r->device_peak = held;
        if (q + 1 == (requests + 1) / 2) r->device_half = held;
        r->x[q] = (double)(q + 1);
        r->device_bytes[q] = held;
        r->counted_bytes[q] = r->stats.exec_bytes;
        r->samples = q + 1;
    }
    r->device_end = device_graph_bytes(dev);
    tp_graph_cache_get_stats(cache, &r->stats);
    /* Every instantiation beyond one per key and one per hot key. */
    uint64_t firsts = requests + hot;
    r->hot_reinstantiations = r->stats.instantiations > firsts ? r->stats.instantiations - firsts : 0;
    if (requests >= WARM_REQUESTS) {
        uint64_t later = r->stats.instantiations - instantiations_warm, new_keys = requests - WARM_REQUESTS;
        r->hot_reinstantiations_after_warmup = later > new_keys ? later - new_keys : 0;
    }
    size_t length = 0;
    if (tp_graph_cache_stats_json(cache, r->cache_json, sizeof r->cache_json, &length) != TP_OK)
        snprintf(r->cache_json, sizeof r->cache_json, "null");
    char msg[256] = "";
    if (tp_graph_cache_check(cache, msg, sizeof msg) != TP_OK) {
        fprintf(stderr, "tide scenario: graph-churn: cache invariant broken: %s\n", msg);
        goto done;
    }
    status = 0;
done:
    if (cache) tp_graph_cache_destroy(cache);
    for (size_t k = 0; k < hot_made; k++) tp_sim_graph_destroy(dev, hot_graphs[k]);
    free(hot_graphs);
    if (stream) tp_stream_destroy(dev, stream);
    if (dev) tp_device_close(dev);
    return status;
}

static double mib(uint64_t bytes) { return (double)bytes / (double)TIDE_MiB; }

static uint64_t evictions(const tp_graph_cache_stats *s) {
    return s->evictions_count + s->evictions_bytes + s->evictions_idle + s->evictions_pressure + s->evictions_explicit;
}

static void print_json(const churn_result *r, const scenario_params *params, const char *spec) {
    const tp_graph_cache_stats *s = &r->stats;
    printf("{\"scenario\":\"graph-churn\",\"result\":{\"run\":");
    tide_json_string(stdout, r->capped ? "cap" : "no-cap");
    printf(",\"device\":");
    tide_json_string(stdout, spec);
    printf(",\"requests\":%llu,\"hot_keys\":%llu,\"seed\":%llu,", (unsigned long long)params->requests,
           (unsigned long long)params->hot_keys, (unsigned long long)params->seed);
    if (r->capped)
        printf("\"graph_exec_bytes_cap\":%llu,", (unsigned long long)r->cap_bytes);
    else
        printf("\"graph_exec_bytes_cap\":null,");
    printf("\"graph_exec_bytes_peak\":%llu,\"graph_evictions\":%llu,\"graph_execs_end\":%llu,"
           "\"instantiations\":%llu,\"eager_fallbacks\":%llu,"
           "\"device_graph_bytes_start\":%llu,\"device_graph_bytes_half\":%llu,\"device_graph_bytes_peak\":%llu,"
           "\"device_graph_bytes_end\":%llu,\"hot_reinstantiations\":%llu,"
           "\"hot_reinstantiations_after_warmup\":%llu,\"warmup_requests\":%d,\"cache\":%s}}\n",
           (unsigned long long)s->exec_bytes_peak,
           (unsigned long long)evictions(s),
           (unsigned long long)s->execs, (unsigned long long)s->instantiations,
           (unsigned long long)s->eager_fallbacks, (unsigned long long)r->device_start,
           (unsigned long long)r->device_half, (unsigned long long)r->device_peak,
           (unsigned long long)r->device_end, (unsigned long long)r->hot_reinstantiations,
           (unsigned long long)r->hot_reinstantiations_after_warmup, WARM_REQUESTS, r->cache_json);
}

static void print_table(const churn_result *results, size_t count, const scenario_params *params,
                        const char *spec) {
    printf("scenario graph-churn --requests %llu --hot %llu --cap-mib %llu --seed %llu on %s: %llu requests of "
           "new graph topologies, %d of %llu hot keys run again after each\n\n",
           (unsigned long long)params->requests, (unsigned long long)params->hot_keys,
           (unsigned long long)params->cap_mib, (unsigned long long)params->seed, spec,
           (unsigned long long)params->requests, HOT_PER_REQUEST, (unsigned long long)params->hot_keys);
    printf("%-12s %28s %14s %10s %10s %8s %16s %6s\n", "run", "device graph MiB start/half/end", "peak MiB",
           "counted", "evictions", "execs", "hot re-inst", "eager");
    printf("%-12s %28s %14s %10s %10s %8s %16s %6s\n", "", "", "", "peak MiB", "", "at end", "(after warm-up)", "");
    for (size_t i = 0; i < count; i++) {
        const churn_result *r = &results[i];
        const tp_graph_cache_stats *s = &r->stats;
        char curve[64], hot[32];
        snprintf(curve, sizeof curve, "%.1f / %.1f / %.1f", mib(r->device_start), mib(r->device_half),
                 mib(r->device_end));
        snprintf(hot, sizeof hot, "%llu (%llu)", (unsigned long long)r->hot_reinstantiations,
                 (unsigned long long)r->hot_reinstantiations_after_warmup);
        printf("%-12s %28s %14.1f %10.1f %10llu %8llu %16s %6llu\n", r->label, curve, mib(r->device_peak),
               mib(s->exec_bytes_peak),
               (unsigned long long)evictions(s),
               (unsigned long long)s->execs, hot, (unsigned long long)s->eager_fallbacks);
    }
    printf("\ndevice graph = memory the device holds for executables (with graphpool, freed executable memory "
           "stays with the driver); counted = the cache's own count; hot re-inst after warm-up counts from "
           "request %d, when every hot key had been used twice; eager = runs, of requests and hot keys, without a "
           "graph (TP_ERR_RUN_EAGER: the executable is larger than the cap)\n",
           WARM_REQUESTS);
}

static int write_plot(const char *path, const churn_result *results, size_t count, const scenario_params *params,
                      const char *spec) {
    static const char *const colours[] = {"#2ca02c", "#d62728"};
    plot_line lines[5];
    char names[4][96];
    size_t n = 0;
    double cap_x[2] = {0, (double)params->requests};
    uint64_t cap_y[2] = {0, 0};
    for (size_t i = 0; i < count && i < 2; i++) {
        const churn_result *r = &results[i];
        snprintf(names[2 * i], sizeof names[0], "%.31s: device graph memory", r->label);
        snprintf(names[2 * i + 1], sizeof names[0], "%.31s: counted by the cache", r->label);
        lines[n++] = (plot_line){names[2 * i], colours[i], false, r->x, r->device_bytes, r->samples};
        lines[n++] = (plot_line){names[2 * i + 1], colours[i], true, r->x, r->counted_bytes, r->samples};
        if (r->capped) cap_y[0] = cap_y[1] = r->cap_bytes;
    }
    if (cap_y[0]) lines[n++] = (plot_line){"cap", "#555555", true, cap_x, cap_y, 2};
    char title[256], err[512];
    snprintf(title, sizeof title, "graph-churn: %llu new topologies, %llu hot keys, on %s",
             (unsigned long long)params->requests, (unsigned long long)params->hot_keys, spec);
    if (plot_lines_svg(path, title, "requests", lines, n, err, sizeof err) != 0) {
        fprintf(stderr, "tide scenario: %s\n", err);
        return 1;
    }
    return 0;
}

int graph_churn_run(const scenario *self, const scenario_params *params, const tide_run_options *options) {
    const replay_options *ro = &options->replay;
    if (options->pools || options->occupy_given || ro->pool_config.limit_bytes ||
        ro->pool_config.release_threshold_bytes || ro->pool_config.idle_release_ns || !ro->follow_trace_time ||
        ro->tick_ns || options->metrics_path || options->snapshot_prefix || options->series_path ||
        options->fail_on_oom || options->max_ratio > 0) {
        fprintf(stderr, "tide scenario: graph-churn drives a graph cache, not pools: of the options below it takes "
                        "--device, --json and --plot (see tide scenario --help)\n");
        return 2;
    }
    const char *spec = ro->device_spec ? ro->device_spec : self->device;
    churn_result results[2];
    memset(results, 0, sizeof results);
    size_t count = 0;
    int status = 0;
    if (params->cap_mib) status = churn_once(spec, params, params->cap_mib * TIDE_MiB, &results[count++]);
    if (!status) status = churn_once(spec, params, TP_BYTES_UNLIMITED, &results[count++]);
    if (!status) {
        if (options->json)
            for (size_t i = 0; i < count; i++) print_json(&results[i], params, spec);
        else
            print_table(results, count, params, spec);
        if (options->plot_path) {
            status = write_plot(options->plot_path, results, count, params, spec);
            if (!status && !options->json) printf("wrote %s\n", options->plot_path);
        }
    }
    for (size_t i = 0; i < count; i++) {
        free(results[i].x);
        free(results[i].device_bytes);
        free(results[i].counted_bytes);
    }
    return status;
}
