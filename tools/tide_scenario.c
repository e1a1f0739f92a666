/* SPDX-License-Identifier: MIT */
/*
 * tide_scenario.c -- `tide scenario NAME [parameters] [options]`: generates
 * a workload of docs/failure-modes.md (scenarios.c) and replays it through pools with
 * the options of `tide replay`, or writes it as a trace file (--out).
 */
#include "scenarios.h"
#include "tide.h"
#include "tide_run.h"

#include <stdio.h>
#include <string.h>

static void scenario_usage(FILE *out) {
    fprintf(out,
            "usage: tide scenario NAME [parameters] [options]\n"
            "       tide scenario NAME [parameters] --out FILE[.gz]\n\n"
            "Generates a workload -- a failure mode of docs/failure-modes.md, an adversarial shape, or the\n"
            "allocations of a kind of model -- and replays it through pools (the options of tide replay),\n"
            "or writes it as a trace (tidepool CSV time_us,action,addr,size,stream; gzip when FILE ends in\n"
            ".gz, - for stdout).\n\n"
            "scenarios and their parameters (default in brackets):\n");
    size_t count;
    const scenario *list = scenario_list(&count);
    for (size_t i = 0; i < count; i++) {
        const scenario *s = &list[i];
        fprintf(out, "  %-15s %s\n", s->name, s->title);
        fprintf(out, "                  ");
        for (const char *c = s->description; *c; c++) {
            fputc(*c, out);
            if (*c == '\n') fprintf(out, "                  ");
        }
        fputc('\n', out);
        for (int p = 0; p < SCENARIO_PARAM_COUNT_; p++) {
            if (!(s->params & SCENARIO_USES(p))) continue;
            const scenario_param_info *info = &scenario_param_table[p];
            uint64_t value = *(const uint64_t *)((const char *)&s->defaults + info->offset);
            fprintf(out, "                  %s N   %s [%llu]\n", info->option, info->meaning,
                    (unsigned long long)value);
        }
        if (s->device || s->occupied_bytes) {
            char bytes[32];
            fprintf(out, "                  device [%s]", s->device ? s->device : "sim:1TiB");
            if (s->occupied_bytes)
                fprintf(out, ", occupied [%s]", tide_bytes(s->occupied_bytes, bytes, sizeof bytes));
            fputc('\n', out);
        }
    }
    fprintf(out, "\noptions:\n"
                 "  --out FILE           write the trace instead of replaying it\n");
    tide_run_options_help(out);
    fprintf(out, "  -h, --help           this text\n");
    tide_exit_codes_help(out);
}

/* Parses a scenario parameter (argv[*index] is one of the table's). */
static int parse_param(const scenario *s, int argc, char **argv, int *index, scenario_params *params) {
    const char *option = argv[*index];
    for (int p = 0; p < SCENARIO_PARAM_COUNT_; p++) {
        const scenario_param_info *info = &scenario_param_table[p];
        if (strcmp(option, info->option)) continue;
        if (!(s->params & SCENARIO_USES(p))) {
            fprintf(stderr, "tide scenario: %s takes no %s (see tide scenario --help)\n", s->name, option);
            return -1;
        }
        const char *value = *index + 1 < argc ? argv[++*index] : NULL;
        uint64_t *field = (uint64_t *)((char *)params + info->offset);
        return tide_parse_count_option("tide scenario", option, value, info->min, info->max, field) ? 1 : -1;
    }
    return 0;
}

/* --out: writes the generated events. */
typedef struct trace_file_sink {
    trace_writer *writer;
    uint64_t events;
    bool failed;
} trace_file_sink;

static int write_events(void *user, const trace_event *events, size_t count) {
    trace_file_sink *t = user;
    for (size_t i = 0; i < count; i++)
        if (trace_write(t->writer, &events[i]) != 0) {
            t->failed = true;
            return -1;
        }
    t->events += count;
    return 0;
}

static int write_scenario(const scenario *s, const scenario_params *params, const tide_run_options *o,
                          const char *path) {
    char err[512];
    trace_file_sink target = {trace_writer_open(path, err, sizeof err), 0, false};
    if (!target.writer) {
        fprintf(stderr, "tide scenario: %s\n", err);
        return 1;
    }
    scenario_sink sink = {write_events, NULL, &target};
    int generated = s->generate(params, &sink);
    int closed = trace_writer_close(target.writer);
    if (generated != 0 || target.failed || closed != 0) {
        fprintf(stderr, "tide scenario: writing %s failed\n", path);
        return 1;
    }
    if (strcmp(path, "-") != 0) {
        char bytes[32];
        fprintf(stderr, "wrote %s: %llu events of %s; replay it with: tide replay %s", path,
                (unsigned long long)target.events, s->name, path);
        if (o->replay.device_spec) fprintf(stderr, " --device %s", o->replay.device_spec);
        if (o->replay.occupied_bytes)
            fprintf(stderr, " --occupy %s", tide_bytes(o->replay.occupied_bytes, bytes, sizeof bytes));
        fputc('\n', stderr);
    }
    return 0;
}

/* "--context 131072 --seed 1" */
static void describe_params(const scenario *s, const scenario_params *params, char *buf, size_t capacity) {
    size_t used = 0;
    buf[0] = '\0';
    for (int p = 0; p < SCENARIO_PARAM_COUNT_ && used < capacity; p++) {
        if (!(s->params & SCENARIO_USES(p))) continue;
        const scenario_param_info *info = &scenario_param_table[p];
        int n = snprintf(buf + used, capacity - used, "%s%s %llu", used ? " " : "", info->option,
                         (unsigned long long)*(const uint64_t *)((const char *)params + info->offset));
        if (n < 0) break;
        used += (size_t)n;
    }
}

int tide_scenario(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        scenario_usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    const scenario *s = scenario_find(argv[1]);
    if (!s) {
        size_t count;
        const scenario *list = scenario_list(&count);
        fprintf(stderr, "tide scenario: unknown scenario '%s' (known:", argv[1]);
        for (size_t i = 0; i < count; i++) fprintf(stderr, " %s", list[i].name);
        fprintf(stderr, ")\n");
        return 2;
    }
    scenario_params params;
    scenario_defaults(s, &params);
    tide_run_options options;
    tide_run_options_init(&options);
    const char *out_path = NULL;
    const char *replay_option = NULL; /* the first replay option seen, for --out's message */
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            scenario_usage(stdout);
            return 0;
        }
        int param = parse_param(s, argc, argv, &i, &params);
        if (param < 0) return 2;
        if (param > 0) continue;
        if (!strcmp(a, "--out")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tide scenario: --out needs a file name\n");
                return 2;
            }
            out_path = argv[++i];
            continue;
        }
        int shared = tide_run_parse_option("tide scenario", argc, argv, &i, &options);
        if (shared < 0) return 2;
        if (shared > 0) {
            if (strcmp(a, "--device") && strcmp(a, "--occupy") && !replay_option) replay_option = a;
            continue;
        }
        fprintf(stderr, "tide scenario: unknown option '%s' (see tide scenario --help)\n", a);
        return 2;
    }
    const char *problem = s->check ? s->check(&params) : NULL;
    if (problem) {
        fprintf(stderr, "tide scenario: %s: %s\n", s->name, problem);
        return 2;
    }
    if (!options.device_given && s->device) options.replay.device_spec = s->device;
    if (!options.occupy_given) options.replay.occupied_bytes = s->occupied_bytes;
    if (s->run && out_path) {
        fprintf(stderr, "tide scenario: %s drives a graph cache, not pools: it has no trace to write (--out)\n",
                s->name);
        return 2;
    }
    if (s->run) return s->run(s, &params, &options);
    if (out_path) {
        if (replay_option) {
            fprintf(stderr, "tide scenario: --out writes the trace; %s is for replaying it (tide replay FILE %s)\n",
                    replay_option, replay_option);
            return 2;
        }
        return write_scenario(s, &params, &options, out_path);
    }
    if (!tide_run_resolve_pools("tide scenario", &options)) return 2;
    if (!tide_run_prepare("tide scenario", &options)) return 1;
    char err[512];
    replay_run *run = replay_begin(options.pools, &options.replay, err, sizeof err);
    if (!run) {
        fprintf(stderr, "tide scenario: %s\n", err);
        return 2;
    }
    if (scenario_replay(s, &params, &run, 1, NULL) != 0) {
        fprintf(stderr, "tide scenario: out of host memory\n");
        replay_free(run);
        return 1;
    }
    char described[160], heading[512], title[512], bytes[32];
    describe_params(s, &params, described, sizeof described);
    const char *device = options.replay.device_spec ? options.replay.device_spec : "sim:1TiB";
    char occupied[64] = "";
    if (options.replay.occupied_bytes)
        snprintf(occupied, sizeof occupied, ", %s occupied",
                 tide_bytes(options.replay.occupied_bytes, bytes, sizeof bytes));
    snprintf(heading, sizeof heading, "scenario %s%s%s on %s%s: %s", s->name, described[0] ? " " : "", described,
             device, occupied, s->title);
    snprintf(title, sizeof title, "%s%s%s on %s%s", s->name, described[0] ? " " : "", described, device, occupied);
    int status = tide_run_report("tide scenario", run, &options, "scenario", s->name, heading, title);
    replay_free(run);
    return tide_run_end("tide scenario", &options, status);
}
