/* SPDX-License-Identifier: MIT */
/*
 * tide_run.c -- the options and the output that `tide replay` and
 * `tide scenario` share (see tide_run.h), and the byte helpers of tide.h.
 */
#include "tide_run.h"

#include "plot.h"
#include "tide.h"
#include "tide_observe.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

bool tide_parse_bytes_option(const char *option, const char *value, uint64_t *out) {
    if (!value || !tp_parse_bytes(value, out)) {
        fprintf(stderr, "tide: %s needs a size such as 512MiB or 6GiB, got '%s'\n", option, value ? value : "");
        return false;
    }
    return true;
}

const char *tide_bytes(uint64_t bytes, char *buf, size_t capacity) { return tp_format_bytes(bytes, buf, capacity); }

bool tide_parse_count_option(const char *command, const char *option, const char *value, uint64_t min, uint64_t max,
                             uint64_t *out) {
    char *end = NULL;
    errno = 0;
    unsigned long long number = value && isdigit((unsigned char)value[0]) ? strtoull(value, &end, 10) : 0;
    if (!end || *end || errno == ERANGE || number < min || number > max) {
        fprintf(stderr, "%s: %s needs a whole number from %llu to %llu, got '%s'\n", command, option,
                (unsigned long long)min, (unsigned long long)max, value ? value : "");
        return false;
    }
    *out = number;
    return true;
}

void tide_run_options_init(tide_run_options *options) {
    *options = (tide_run_options){.replay = {.follow_trace_time = true}};
}

void tide_run_options_help(FILE *out) {
    fprintf(out,
            "  --pool LIST          pools, comma-separated, each once: %s\n"
            "                       (default: vmm where the device has VMM, else segment); ggml-legacy and\n"
            "                       ggml-vmm model ggml's CUDA pools, torch-default and torch-expandable\n"
            "                       PyTorch's caching allocator (default settings; expandable segments)\n"
            "  --device SPEC        device for every pool (default sim:1TiB; e.g. sim:6GiB,novmm, cuda:0)\n"
            "  --occupy SIZE        device memory another tenant holds throughout (e.g. model weights)\n"
            "  --json               one JSON object per pool, one per line\n"
            "  --plot FILE.svg      chart of live/reserved/cached bytes over the run\n"
            "  --limit SIZE         pool byte limit (e.g. 6GiB)\n"
            "                       --limit, --release-threshold, --idle-release-ms and --tick-ms apply to\n"
            "                       tidepool pools (vmm, segment) only; the ggml baselines ignore them\n"
            "  --release-threshold SIZE   idle bytes a tidepool pool keeps cached (default 64 MiB vmm,\n"
            "                       16 MiB segment; 0: none)\n"
            "  --idle-release-ms N  how long idle memory above the threshold stays (default 10000; 0:\n"
            "                       released at the next tick or allocation)\n"
            "  --tick-ms N          call tidepool's tp_pool_tick every N ms of trace time (the PyTorch\n"
            "                       shim's upkeep thread ticks every 1000 ms)\n"
            "  --no-trace-time      do not move the simulated clock with the events' timestamps\n"
            "  --metrics FILE       the final figures in the Prometheus text format: tidepool pools'\n"
            "                       tidepool_pool_* (tp_pool_stats_openmetrics), baselines' tidepool_baseline_*,\n"
            "                       and tidepool_replay_* (peak live/held, ratio) for every pool; samples\n"
            "                       labelled trace=\"NAME\" (or scenario=\"NAME\") and pool=\"POOL\"\n"
            "  --snapshot PREFIX    memory maps of the tidepool pools (tp_pool_snapshot_json):\n"
            "                       PREFIX.<pool>.json when held memory peaked, PREFIX.<pool>.end.json at the\n"
            "                       end; draw one with tide map FILE.json --plot map.svg\n"
            "  --series FILE.csv    the chart's curves: event,time_us and per pool live, held, cached bytes\n"
            "  --fail-on-oom        exit 3 if any pool ran out of memory\n"
            "  --max-ratio R        exit 3 if a tidepool pool's peak held / peak live exceeds R (e.g. 1.2)\n"
            "  --quiet              no progress line on stderr (it shows on a terminal after 2 s)\n",
            replay_pool_names());
}

void tide_exit_codes_help(FILE *out) {
    fprintf(out, "\nexit status: 0 success; 1 error (unreadable trace, pool errors or hazards, a file or the\n"
                 "output not written); 2 bad usage; 3 a gate failed (--fail-on-oom, --max-ratio)\n");
}

/* The value of option argv[*index], or NULL (message printed). */
static const char *option_value(const char *command, int argc, char **argv, int *index) {
    if (*index + 1 >= argc) {
        fprintf(stderr, "%s: %s needs a value (see %s --help)\n", command, argv[*index], command);
        return NULL;
    }
    return argv[++*index];
}

int tide_run_parse_option(const char *command, int argc, char **argv, int *index, tide_run_options *o) {
    const char *a = argv[*index];
    static const char *const with_value[] = {"--pool",    "--device",   "--plot",    "--limit",  "--release-threshold",
                                             "--idle-release-ms", "--occupy", "--tick-ms", "--metrics", "--snapshot",
                                             "--series",  "--max-ratio"};
    bool takes_value = false;
    for (size_t i = 0; i < sizeof with_value / sizeof *with_value; i++) takes_value |= !strcmp(a, with_value[i]);
    if (!strcmp(a, "--json")) {
        o->json = true;
        return 1;
    }
    if (!strcmp(a, "--no-trace-time")) {
        o->replay.follow_trace_time = false;
        return 1;
    }
    if (!strcmp(a, "--fail-on-oom")) {
        o->fail_on_oom = true;
        return 1;
    }
    if (!strcmp(a, "--quiet") || !strcmp(a, "-q")) {
        o->quiet = true;
        return 1;
    }
    if (!takes_value) return 0;
    const char *v = option_value(command, argc, argv, index);
    if (!v) return -1;
    if (!strcmp(a, "--limit") || !strcmp(a, "--release-threshold") || !strcmp(a, "--idle-release-ms") ||
        !strcmp(a, "--tick-ms")) { /* noted for the baselines, which ignore them (tide_run_resolve_pools) */
        size_t used = strlen(o->tidepool_only);
        if (!strstr(o->tidepool_only, a))
            snprintf(o->tidepool_only + used, sizeof o->tidepool_only - used, "%s%s", used ? ", " : "", a);
    }
    if (!strcmp(a, "--pool")) {
        o->pools = v;
    } else if (!strcmp(a, "--device")) {
        o->replay.device_spec = v;
        o->device_given = true;
    } else if (!strcmp(a, "--plot")) {
        o->plot_path = v;
    } else if (!strcmp(a, "--metrics")) {
        o->metrics_path = v;
    } else if (!strcmp(a, "--snapshot")) {
        o->snapshot_prefix = v;
    } else if (!strcmp(a, "--series")) {
        o->series_path = v;
    } else if (!strcmp(a, "--max-ratio")) {
        char *end = NULL;
        double r = strtod(v, &end);
        if (!end || end == v || *end || !(r >= 1.0) || r > 1e6) {
            fprintf(stderr, "%s: --max-ratio needs a ratio of at least 1 such as 1.2, got '%s'\n", command, v);
            return -1;
        }
        o->max_ratio = r;
    } else if (!strcmp(a, "--limit")) {
        if (!tide_parse_bytes_option(a, v, &o->replay.pool_config.limit_bytes)) return -1;
    } else if (!strcmp(a, "--release-threshold")) {
        if (!tide_parse_bytes_option(a, v, &o->replay.pool_config.release_threshold_bytes)) return -1;
        /* the library reads 0 as its default (64 MiB VMM, 16 MiB segment); here 0 keeps nothing: 1 byte */
        if (!o->replay.pool_config.release_threshold_bytes) o->replay.pool_config.release_threshold_bytes = 1;
    } else if (!strcmp(a, "--occupy")) {
        if (!tide_parse_bytes_option(a, v, &o->replay.occupied_bytes)) return -1;
        o->occupy_given = true;
    } else if (!strcmp(a, "--tick-ms")) {
        uint64_t ms;
        if (!tide_parse_count_option(command, a, v, 1, UINT64_MAX / 1000000ull, &ms)) return -1;
        o->replay.tick_ns = ms * 1000000ull;
    } else { /* --idle-release-ms */
        uint64_t ms;
        if (!tide_parse_count_option(command, a, v, 0, UINT64_MAX / 1000000ull, &ms)) return -1;
        /* the library reads 0 as its default (10 s); here 0 releases at once: 1 ns */
        o->replay.pool_config.idle_release_ns = ms ? ms * 1000000ull : 1;
    }
    return 1;
}

bool tide_run_resolve_pools(const char *command, tide_run_options *o) {
    if (o->pools) {
        /* Check the names now: a misspelt pool is a usage error. */
        char names[256];
        if ((size_t)snprintf(names, sizeof names, "%s", o->pools) >= sizeof names) {
            fprintf(stderr, "%s: --pool list too long\n", command);
            return false;
        }
        char *save = NULL;
        const char *named[sizeof names / 2 + 1]; /* at most one name a character and a comma */
        size_t count = 0;
        for (char *name = strtok_r(names, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
            while (*name == ' ') name++;
            if (!replay_find_pool(name)) {
                fprintf(stderr, "%s: unknown pool '%s' (known: %s)\n", command, name, replay_pool_names());
                return false;
            }
            /* the same pool twice replays the same figures twice, under one name */
            for (size_t k = 0; k < count; k++)
                if (!strcmp(named[k], name)) {
                    fprintf(stderr, "%s: pool '%s' named twice in --pool\n", command, name);
                    return false;
                }
            named[count++] = name;
            if (o->tidepool_only[0] && !replay_is_tidepool(name))
                fprintf(stderr, "%s: note: %s ignores %s (tidepool pools only)\n", command, name, o->tidepool_only);
        }
        if (!count) {
            fprintf(stderr, "%s: --pool names no pool (known: %s)\n", command, replay_pool_names());
            return false;
        }
        return true;
    }
    /* The default pool: VMM when the device has it. */
    const char *spec = o->replay.device_spec ? o->replay.device_spec : "sim:1TiB";
    tp_device *probe = NULL;
    tp_device_info info = {0};
    char why[700];
    if (replay_open_device(spec, &probe, why, sizeof why) != TP_OK) {
        fprintf(stderr, "%s: %s\n", command, why);
        return false;
    }
    tp_device_get_info(probe, &info);
    tp_device_close(probe);
    o->pools = info.vmm_enabled ? "vmm" : "segment";
    return true;
}

void tide_json_string(FILE *out, const char *text) {
    fputc('"', out);
    for (const unsigned char *c = (const unsigned char *)text; *c; c++) {
        if (*c == '"' || *c == '\\')
            fprintf(out, "\\%c", *c);
        else if (*c < 0x20)
            fprintf(out, "\\u%04x", *c);
        else
            fputc(*c, out);
    }
    fputc('"', out);
}

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
    if (r->unknown_frees)
        printf("%-12s %llu frees of addresses the trace never allocated\n", "", (unsigned long long)r->unknown_frees);
    if (r->duplicate_allocs)
        printf("%-12s %llu allocs of addresses already live (the older block, never freed, was freed first)\n", "",
               (unsigned long long)r->duplicate_allocs);
    if (r->folded_streams)
        printf("%-12s %llu streams past the %d a replay creates ran on the default stream\n", "",
               (unsigned long long)r->folded_streams, REPLAY_MAX_STREAMS);
    if (r->lifo_violations) printf("%-12s %llu frees out of LIFO order\n", "", (unsigned long long)r->lifo_violations);
    if (r->oom_recoveries)
        printf("%-12s %llu out-of-memory recoveries (cache released, then retried)\n", "",
               (unsigned long long)r->oom_recoveries);
    if (r->fatal) printf("%-12s aborted at event %llu: %s\n", "", (unsigned long long)r->fatal_event, r->first_oom_report);
}

bool tide_run_prepare(const char *command, tide_run_options *o) {
    o->replay.keep_samples = o->plot_path || o->series_path;
    o->replay.snapshot_peaks = o->snapshot_prefix != NULL;
    if (o->metrics_path && !(o->metrics = tide_metrics_create())) {
        fprintf(stderr, "%s: out of memory\n", command);
        return false;
    }
    return true;
}

int tide_exit_merge(int a, int b) {
    if (a == TIDE_EXIT_ERROR || b == TIDE_EXIT_ERROR) return TIDE_EXIT_ERROR;
    if (a == TIDE_EXIT_USAGE || b == TIDE_EXIT_USAGE) return TIDE_EXIT_USAGE;
    return a > b ? a : b;
}

int tide_run_end(const char *command, tide_run_options *o, int status) {
    if (o->metrics) {
        char err[512];
        if (tide_metrics_write(o->metrics, o->metrics_path, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", command, err);
            status = tide_exit_merge(status, TIDE_EXIT_ERROR);
        } else if (!o->json) {
            printf("wrote %s\n", o->metrics_path);
        }
        tide_metrics_destroy(o->metrics);
        o->metrics = NULL;
    }
    return status;
}

/* --fail-on-oom and --max-ratio: a line on stderr for each pool that fails. */
static int check_gates(const char *command, const tide_run_options *o, const char *label, const replay_result *results,
                       size_t n) {
    int status = TIDE_EXIT_OK;
    for (size_t i = 0; i < n; i++) {
        const replay_result *r = &results[i];
        if (o->fail_on_oom && r->ooms) {
            fprintf(stderr, "%s: gate failed (--fail-on-oom): %s: pool %s ran out of memory %llu time%s%s\n", command,
                    label, r->pool, (unsigned long long)r->ooms, r->ooms == 1 ? "" : "s",
                    r->fatal ? " and gave up" : "");
            status = TIDE_EXIT_GATE;
        }
        if (o->max_ratio > 0 && replay_is_tidepool(r->pool) && replay_ratio(r) > o->max_ratio) {
            char held[32], live[32];
            fprintf(stderr, "%s: gate failed (--max-ratio %g): %s: pool %s held %s at its peak, %.3fx the peak live %s\n",
                    command, o->max_ratio, label, r->pool, tide_bytes(r->peak_reserved_bytes, held, sizeof held),
                    replay_ratio(r), tide_bytes(r->peak_live_bytes, live, sizeof live));
            status = TIDE_EXIT_GATE;
        }
    }
    return status;
}

int tide_run_report(const char *command, replay_run *run, const tide_run_options *o, const char *label_key,
                    const char *label, const char *heading, const char *chart_title) {
    replay_result *results;
    size_t n = replay_finish(run, &results);
    int status = 0;
    if (o->json) {
        for (size_t i = 0; i < n; i++) {
            printf("{\"%s\":", label_key);
            tide_json_string(stdout, label);
            printf(",\"result\":");
            replay_result_json(&results[i], stdout);
            printf("}\n");
        }
    } else {
        printf("%s\n", heading);
        print_table_header();
        for (size_t i = 0; i < n; i++) print_table_row(&results[i]);
        printf("\n");
    }
    if (o->plot_path) {
        char err[512];
        if (plot_replay_svg(o->plot_path, chart_title, results, n, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", command, err);
            status = 1;
        } else if (!o->json) {
            printf("wrote %s\n", o->plot_path);
        }
    }
    char err[700];
    if (o->series_path) {
        if (tide_write_series(o->series_path, results, n, err, sizeof err) != 0) {
            fprintf(stderr, "%s: %s\n", command, err);
            status = 1;
        } else if (!o->json) {
            printf("wrote %s\n", o->series_path);
        }
    }
    if (o->snapshot_prefix &&
        tide_write_snapshots(o->snapshot_prefix, run, results, n, o->json ? NULL : stdout, err, sizeof err) != 0) {
        fprintf(stderr, "%s: %s\n", command, err);
        status = 1;
    }
    if (o->metrics) {
        char metric_label[512];
        const char *base = strrchr(label, '/');
        base = base && base[1] ? base + 1 : label;
        if (!strcmp(label_key, "trace")) tide_trace_label(label, metric_label, sizeof metric_label);
        else snprintf(metric_label, sizeof metric_label, "%s", label);
        if (!tide_metrics_add_run(o->metrics, label_key, metric_label, base, run, results, n, err, sizeof err)) {
            fprintf(stderr, "%s: %s\n", command, err);
            status = 1;
        }
    }
    for (size_t i = 0; i < n; i++)
        if (results[i].errors || results[i].hazards) status = 1;
    return tide_exit_merge(status, check_gates(command, o, label, results, n));
}
