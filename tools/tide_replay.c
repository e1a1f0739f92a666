/*
 * tide_replay.c -- `tide replay FILE...`: replays allocation traces through
 * one or more pools side by side and reports the memory each held.
 */
#include "plot.h"
#include "replay.h"
#include "tide.h"

#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void replay_usage(FILE *out) {
    fprintf(out,
            "usage: tide replay FILE... [options]\n\n"
            "Replays allocation traces (tidepool/PyTorch CSV time_us,action,addr,size,stream, or RAPIDS RMM\n"
            "logs Thread,Time,Action,Pointer,Size,Stream; gzip or plain) through pools and reports the memory\n"
            "each held next to the trace's peak live bytes.\n\n"
            "options:\n"
            "  --pool LIST          pools, comma-separated: %s\n"
            "                       (default: vmm where the device has VMM, else segment)\n"
            "  --device SPEC        device for every pool (default sim:1TiB; e.g. sim:6GiB,novmm, cuda:0)\n"
            "  --json               one JSON object per pool and trace, one per line\n"
            "  --plot FILE.svg      chart of live/reserved/cached bytes over the trace (one trace only)\n"
            "  --limit SIZE         pool byte limit (e.g. 6GiB)\n"
            "  --release-threshold SIZE   idle bytes a tidepool pool keeps cached\n"
            "  --idle-release-ms N  how long idle memory above the threshold stays\n"
            "  --no-trace-time      do not move the simulated clock with the trace's timestamps\n"
            "  -h, --help           this text\n",
            replay_pool_names());
}

bool tide_parse_bytes_option(const char *option, const char *value, uint64_t *out) {
    if (!value || !tp_parse_bytes(value, out)) {
        fprintf(stderr, "tide: %s needs a size such as 512MiB or 6GiB, got '%s'\n", option, value ? value : "");
        return false;
    }
    return true;
}

const char *tide_bytes(uint64_t bytes, char *buf, size_t capacity) { return tp_format_bytes(bytes, buf, capacity); }

static void print_table_header(void) {
    printf("%-12s %12s %14s %14s %7s %12s %8s %6s %7s %8s %9s\n", "pool", "events", "peak live", "peak held",
           "ratio", "end held", "dev calls", "ooms", "errors", "hazards", "ns/event");
}

static void print_table_row(const replay_result *r) {
    char live[32], held[32], end[32];
    printf("%-12s %12llu %14s %14s %7.3f %12s %8llu %6llu %7llu %8llu %9.1f%s\n", r->pool,
           (unsigned long long)r->events, tide_bytes(r->peak_live_bytes, live, sizeof live),
           tide_bytes(r->peak_reserved_bytes, held, sizeof held), replay_ratio(r),
           tide_bytes(r->end_reserved_bytes, end, sizeof end), (unsigned long long)r->device_calls,
           (unsigned long long)r->ooms, (unsigned long long)r->errors, (unsigned long long)r->hazards,
           r->events ? (double)r->replay_ns / (double)r->events : 0.0, r->fatal ? "  (aborted)" : "");
    if (r->unknown_frees) printf("%-12s %llu frees of addresses the trace never allocated\n", "",
                                 (unsigned long long)r->unknown_frees);
    if (r->lifo_violations) printf("%-12s %llu frees out of LIFO order\n", "", (unsigned long long)r->lifo_violations);
}

int tide_replay(int argc, char **argv) {
    const char *pools = NULL, *plot = NULL;
    bool json = false;
    replay_options options = {.follow_trace_time = true};
    const char *files[64];
    int file_count = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            replay_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--pool") && v) {
            pools = v;
            i++;
        } else if (!strcmp(a, "--device") && v) {
            options.device_spec = v;
            i++;
        } else if (!strcmp(a, "--json")) {
            json = true;
        } else if (!strcmp(a, "--plot") && v) {
            plot = v;
            i++;
        } else if (!strcmp(a, "--limit")) {
            if (!tide_parse_bytes_option(a, v, &options.pool_config.limit_bytes)) return 2;
            i++;
        } else if (!strcmp(a, "--release-threshold")) {
            if (!tide_parse_bytes_option(a, v, &options.pool_config.release_threshold_bytes)) return 2;
            i++;
        } else if (!strcmp(a, "--idle-release-ms") && v) {
            char *end;
            unsigned long long ms = strtoull(v, &end, 10);
            if (*end || end == v) {
                fprintf(stderr, "tide replay: --idle-release-ms needs a number of milliseconds\n");
                return 2;
            }
            options.pool_config.idle_release_ns = ms * 1000000ull;
            i++;
        } else if (!strcmp(a, "--no-trace-time")) {
            options.follow_trace_time = false;
        } else if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tide replay: unknown or incomplete option '%s' (see tide replay --help)\n", a);
            return 2;
        } else if (file_count < 64) {
            files[file_count++] = a;
        } else {
            fprintf(stderr, "tide replay: at most 64 files\n");
            return 2;
        }
    }
    if (!file_count) {
        fprintf(stderr, "tide replay: no trace file given\n\n");
        replay_usage(stderr);
        return 2;
    }
    if (plot && file_count != 1) {
        fprintf(stderr, "tide replay: --plot draws one trace; give one file\n");
        return 2;
    }
    if (!pools) {
        /* The default pool: VMM when the device has it. */
        tp_device *probe = NULL;
        tp_device_info info = {0};
        if (tp_device_open(options.device_spec ? options.device_spec : "sim:1TiB", NULL, &probe) != TP_OK) {
            fprintf(stderr, "tide replay: cannot open device '%s'\n", options.device_spec);
            return 2;
        }
        tp_device_get_info(probe, &info);
        tp_device_close(probe);
        pools = info.vmm_enabled ? "vmm" : "segment";
    }
    options.keep_samples = plot != NULL;
    int status = 0;
    for (int f = 0; f < file_count; f++) {
        char err[512];
        replay_run *run = NULL;
        uint64_t parse_ns = 0;
        if (replay_file(files[f], pools, &options, &run, &parse_ns, err, sizeof err) != 0) {
            fprintf(stderr, "tide replay: %s\n", err);
            status = 1;
            continue;
        }
        replay_result *results;
        size_t n = replay_finish(run, &results);
        if (json) {
            for (size_t i = 0; i < n; i++) {
                printf("{\"trace\":\"%s\",\"result\":", files[f]);
                replay_result_json(&results[i], stdout);
                printf("}\n");
            }
        } else {
            printf("%s (parsed in %.2f s)\n", files[f], parse_ns / 1e9);
            print_table_header();
            for (size_t i = 0; i < n; i++) print_table_row(&results[i]);
            printf("\n");
        }
        if (plot) {
            if (plot_replay_svg(plot, files[f], results, n, err, sizeof err) != 0) {
                fprintf(stderr, "tide replay: %s\n", err);
                status = 1;
            } else if (!json) {
                printf("wrote %s\n", plot);
            }
        }
        for (size_t i = 0; i < n; i++)
            if (results[i].errors || results[i].hazards) status = status ? status : 1;
        replay_free(run);
    }
    return status;
}
