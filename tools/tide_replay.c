/*
 * tide_replay.c -- `tide replay FILE...`: replays allocation traces through
 * one or more pools side by side and reports the memory each held.
 */
#include "replay.h"
#include "tide.h"
#include "tide_run.h"

#include <stdio.h>
#include <string.h>

#define MAX_FILES 64

static void replay_usage(FILE *out) {
    fprintf(out,
            "usage: tide replay FILE... [options]\n\n"
            "Replays allocation traces (tidepool/PyTorch CSV time_us,action,addr,size,stream, or RAPIDS RMM\n"
            "logs Thread,Time,Action,Pointer,Size,Stream; gzip or plain) through pools and reports the memory\n"
            "each held next to the trace's peak live bytes.\n\n"
            "options:\n");
    tide_run_options_help(out);
    fprintf(out, "  -h, --help           this text\n");
}

int tide_replay(int argc, char **argv) {
    tide_run_options options;
    tide_run_options_init(&options);
    const char *files[MAX_FILES];
    int file_count = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            replay_usage(stdout);
            return 0;
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
    if (options.plot_path && file_count != 1) {
        fprintf(stderr, "tide replay: --plot draws one trace; give one file\n");
        return 2;
    }
    if (!tide_run_resolve_pools("tide replay", &options)) return 2;
    options.replay.keep_samples = options.plot_path != NULL;
    int status = 0;
    for (int f = 0; f < file_count; f++) {
        char err[512];
        replay_run *run = NULL;
        uint64_t parse_ns = 0;
        if (replay_file(files[f], options.pools, &options.replay, &run, &parse_ns, err, sizeof err) != 0) {
            fprintf(stderr, "tide replay: %s\n", err);
            status = 1;
            continue;
        }
        char heading[600];
        snprintf(heading, sizeof heading, "%s (parsed in %.2f s)", files[f], parse_ns / 1e9);
        if (tide_run_report("tide replay", run, &options, "trace", files[f], heading, files[f])) status = 1;
        replay_free(run);
    }
    return status;
}
