/* SPDX-License-Identifier: MIT */
/*
 * tide_replay.c -- `tide replay FILE...`: replays allocation traces through
 * one or more pools side by side and reports the memory each held.
 */
#include "replay.h"
#include "tide.h"
#include "tide_run.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FILES 64

static void replay_usage(FILE *out) {
    fprintf(out,
            "usage: tide replay FILE... [options]\n\n"
            "Replays allocation traces through pools and reports the memory each held next to the trace's\n"
            "peak live bytes. Formats, told apart by their content, gzip-compressed or plain:\n"
            "  tidepool CSV         time_us,action,addr,size,stream (action alloc or free)\n"
            "  PyTorch snapshot     the pickle of torch.cuda.memory._snapshot(), read directly: in the\n"
            "                       program, torch.cuda.memory._record_memory_history() before the work, then\n"
            "                       torch.cuda.memory._dump_snapshot(\"run.pickle\") (or pickle.dump of\n"
            "                       _snapshot()) after it; alloc and free_requested become the trace. It\n"
            "                       is read whole: at most %llu GiB of it (inflated), a larger one is refused\n"
            "  RAPIDS RMM log       Thread,Time,Action,Pointer,Size,Stream (Time in seconds, or a time of\n"
            "                       day HH:MM:SS.ffffff: one falling back by over 12 h is the next day)\n\n"
            "options:\n"
            "  --pt-device N        PyTorch snapshots: replay device N's trace (default 0)\n"
            "  --threads N          threads that read, parse and replay a CSV trace, the replay's own\n"
            "                       included (default: the CPUs online, at most 16; 1: one thread); with\n"
            "                       several pools and N >= 3, up to one per pool replays; the rest parse\n"
            "                       (at most 4, in a process of their own). Any N gives the same figures;\n"
            "                       the heading says how many were used and where the time went\n",
            (unsigned long long)(TRACE_SNAPSHOT_MAX_BYTES >> 30));
    tide_run_options_help(out);
    fprintf(out, "  -h, --help           this text\n");
    tide_exit_codes_help(out);
}

/* The progress line: on a terminal, after 2 s (TIDE_PROGRESS_AFTER_MS, for
 * tests), at most 4 times a second. */
typedef struct progress_line {
    const char *name;
    uint64_t start_ns, last_ns, after_ns;
    bool shown;
} progress_line;

static void count_text(uint64_t n, char *buf, size_t capacity) {
    if (n >= 10000000) snprintf(buf, capacity, "%.1fM", n / 1e6);
    else if (n >= 10000) snprintf(buf, capacity, "%.0fk", n / 1e3);
    else snprintf(buf, capacity, "%llu", (unsigned long long)n);
}

static void show_progress(void *user, const replay_progress *p) {
    progress_line *line = user;
    uint64_t now = replay_now_ns();
    if (now - line->start_ns < line->after_ns || (line->shown && now - line->last_ns < 250000000ull)) return;
    line->last_ns = now;
    line->shown = true;
    double elapsed = (now - line->start_ns) / 1e9;
    double fraction = p->events_total ? (double)p->events / (double)p->events_total
                      : p->bytes_total ? (double)p->bytes_read / (double)p->bytes_total
                                       : 0;
    char done[32], total[32], bytes[32], eta[32] = "?";
    count_text(p->events, done, sizeof done);
    if (fraction > 0.001) {
        unsigned long long left = (unsigned long long)(elapsed * (1 - fraction) / fraction + 0.5);
        snprintf(eta, sizeof eta, "%llu:%02llu", left / 60, left % 60);
    }
    if (p->events_total) {
        count_text(p->events_total, total, sizeof total);
        fprintf(stderr, "\r%s: %s/%s events (%.0f%%), %.2fM events/s, ETA %s\033[K", line->name, done, total,
                100 * fraction, p->events / elapsed / 1e6, eta);
    } else {
        fprintf(stderr, "\r%s: %s events, %.0f%% of %s read, %.2fM events/s, ETA %s\033[K", line->name, done,
                100 * fraction, tide_bytes(p->bytes_total, bytes, sizeof bytes), p->events / elapsed / 1e6, eta);
    }
    fflush(stderr);
}

int tide_replay(int argc, char **argv) {
    tide_run_options options;
    tide_run_options_init(&options);
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    options.replay.threads = cpus < 1 ? 1 : cpus > 16 ? 16 : (unsigned)cpus;
    const char *files[MAX_FILES];
    int file_count = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            replay_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--threads")) {
            uint64_t threads;
            if (!tide_parse_count_option("tide replay", a, i + 1 < argc ? argv[++i] : NULL, 1, 64, &threads)) return 2;
            options.replay.threads = (unsigned)threads;
            continue;
        }
        if (!strcmp(a, "--pt-device")) {
            uint64_t device;
            if (!tide_parse_count_option("tide replay", a, i + 1 < argc ? argv[++i] : NULL, 0, 1023, &device)) return 2;
            options.replay.pt_device = (unsigned)device;
            continue;
        }
        int shared = tide_run_parse_option("tide replay", argc, argv, &i, &options);
        if (shared < 0) return 2;
        if (shared > 0) continue;
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tide replay: unknown option '%s' (see tide replay --help)\n", a);
            return 2;
        }
        if (file_count == MAX_FILES) {
            fprintf(stderr, "tide replay: at most %d files\n", MAX_FILES);
            return 2;
        }
        files[file_count++] = a;
    }
    if (!file_count) {
        fprintf(stderr, "tide replay: no trace file given\n\n");
        replay_usage(stderr);
        return 2;
    }
    const char *one_file_option = options.plot_path ? "--plot draws" : options.series_path ? "--series writes"
                                  : options.snapshot_prefix ? "--snapshot writes" : NULL;
    if (one_file_option && file_count != 1) {
        fprintf(stderr, "tide replay: %s one trace; give one file\n", one_file_option);
        return 2;
    }
    if (!tide_run_resolve_pools("tide replay", &options)) return 2;
    if (!tide_run_prepare("tide replay", &options)) return 1;
    bool progress = !options.quiet && isatty(STDERR_FILENO);
    uint64_t progress_after_ns = 2000000000ull;
    const char *after = getenv("TIDE_PROGRESS_AFTER_MS");
    if (after && *after) progress_after_ns = strtoull(after, NULL, 10) * 1000000ull;
    int status = 0;
    for (int f = 0; f < file_count; f++) {
        char err[1024];
        replay_run *run = NULL;
        replay_file_timing timing;
        progress_line line = {files[f], replay_now_ns(), 0, progress_after_ns, false};
        if (progress) {
            options.replay.progress = show_progress;
            options.replay.progress_user = &line;
        }
        int rc = replay_file(files[f], options.pools, &options.replay, &run, &timing, err, sizeof err);
        if (line.shown) fprintf(stderr, "\r\033[K"); /* the report replaces the progress line */
        if (rc != 0) {
            fprintf(stderr, "tide replay: %s\n", err);
            status = tide_exit_merge(status, TIDE_EXIT_ERROR);
            continue;
        }
        char heading[900], pools_on[64] = "";
        double wall_s = timing.wall_ns / 1e9;
        if (timing.lane_threads > 1) snprintf(pools_on, sizeof pools_on, " on %u threads", timing.lane_threads);
        snprintf(heading, sizeof heading,
                 "%s (%llu events in %.3f s end to end, %.1fM events/s, %u thread%s: opening %.3f s, waiting for "
                 "parsed events %.3f s, live table %.3f s%s, pools %.3f s%s)",
                 files[f], (unsigned long long)timing.events, wall_s, wall_s > 0 ? timing.events / wall_s / 1e6 : 0.0,
                 timing.threads, timing.threads == 1 ? "" : "s", timing.open_ns / 1e9, timing.read_ns / 1e9,
                 timing.slot_ns / 1e9, timing.slots_on_workers ? " (beside, on the parse workers)" : "",
                 timing.replay_ns / 1e9, pools_on);
        const char *base = strrchr(files[f], '/');
        base = base && base[1] ? base + 1 : files[f];
        status = tide_exit_merge(status, tide_run_report("tide replay", run, &options, "trace", files[f], heading, base));
        replay_free(run);
    }
    return tide_run_end("tide replay", &options, status);
}
