/* SPDX-License-Identifier: MIT */
/*
 * tide.c -- the tidepool command line: dispatches to the subcommands.
 */
#include "tide.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} commands[] = {
    {"demo", tide_demo, "the side-by-side demo: the reported failures against tidepool (simulated device)"},
    {"replay", tide_replay, "replay allocation traces through pools and compare memory held"},
    {"scenario", tide_scenario, "generate the workloads of docs/failure-modes.md, replay or write them"},
    {"map", tide_map, "draw a pool's memory map (tide replay --snapshot) as an SVG"},
    {"bench", tide_bench, "measure the cached alloc+free hit path"},
};

static void usage(FILE *out) {
    fprintf(out,
            "tide -- tidepool, a GPU device-memory manager for long-running inference servers\n\n"
            "usage: tide COMMAND [options]     (tide COMMAND --help for its options)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(out, "  %-9s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\ndevices: sim (default), sim:6GiB, sim:6GiB,novmm, cuda:0, cuda:0,novmm\n"
                 "traces: tidepool CSV (time_us,action,addr,size,stream), PyTorch memory snapshots (the pickle of\n"
                 "        torch.cuda.memory._snapshot() after _record_memory_history(), read directly) and RAPIDS\n"
                 "        RMM logs; gzip or plain\n"
                 "exit status: 0 success; 1 error (also: the output could not be written); 2 bad usage;\n"
                 "             3 a gate failed (--fail-on-oom, --max-ratio)\n");
}

/* Results printed but never delivered (stdout on a full disk, a closed
 * file) are an error: exit 1 with a message, not the command's 0 (or 3). A
 * usage error keeps its 2. */
static int finish(const char *what, int status) {
    errno = 0;
    bool failed = fflush(stdout) != 0;
    int error = errno;
    if (failed || ferror(stdout)) {
        fprintf(stderr, "%s: writing the output failed%s%s\n", what, error ? ": " : "", error ? strerror(error) : "");
        return status == 2 ? 2 : 1;
    }
    return status;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        usage(stdout);
        return finish("tide", 0);
    }
    if (!strcmp(argv[1], "--version")) {
        printf("tide %d.%d.%d\n", TP_VERSION_MAJOR, TP_VERSION_MINOR, TP_VERSION_PATCH);
        return finish("tide", 0);
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) {
            char what[32];
            snprintf(what, sizeof what, "tide %s", commands[i].name);
            return finish(what, commands[i].run(argc - 1, argv + 1));
        }
    fprintf(stderr, "tide: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
