/* SPDX-License-Identifier: MIT */
/*
 * tide_run.h -- what `tide replay` and `tide scenario` share: the options
 * that choose the pools, the device and the output of a replay, and the
 * printing of a run's results (a table, or JSON lines) and its chart.
 *
 * A command parses its own arguments and hands each one it does not know
 * to tide_run_parse_option first; what that does not know either is an
 * error of the command.
 */
#ifndef TIDEPOOL_TIDE_RUN_H
#define TIDEPOOL_TIDE_RUN_H

#include "replay.h"

#include <stdbool.h>
#include <stdio.h>

/* Exit statuses of replay and scenario: TIDE_EXIT_ERROR wins over
 * TIDE_EXIT_GATE when both happen. */
#define TIDE_EXIT_OK 0
#define TIDE_EXIT_ERROR 1
#define TIDE_EXIT_USAGE 2
#define TIDE_EXIT_GATE 3

struct tide_metrics;

typedef struct tide_run_options {
    const char *pools;     /* comma-separated; NULL: vmm where the device has VMM, else segment */
    const char *plot_path; /* NULL: no chart */
    const char *metrics_path;    /* --metrics: Prometheus text of the final figures */
    const char *snapshot_prefix; /* --snapshot: PREFIX.<pool>.json and PREFIX.<pool>.end.json */
    const char *series_path;     /* --series: the chart's curves as CSV */
    bool fail_on_oom;            /* --fail-on-oom: exit 3 when any pool ran out of memory */
    double max_ratio;            /* --max-ratio: exit 3 when a tidepool pool's peak held / peak live exceeds it (0: off) */
    bool quiet;                  /* --quiet: no progress line */
    struct tide_metrics *metrics; /* gathered over the runs (tide_run_prepare) */
    bool json;
    bool device_given;     /* --device was on the command line */
    bool occupy_given;     /* --occupy was on the command line */
    char tidepool_only[96]; /* the options given that only tidepool pools heed ("--limit, --tick-ms"), or "" */
    replay_options replay;
} tide_run_options;

void tide_run_options_init(tide_run_options *options);

/* Looks at argv[*index]. One of the shared options: consumes it and its
 * value (advancing *index) and returns 1. Not one: returns 0. A shared
 * option with a missing or bad value: prints why, prefixed by command
 * ("tide replay"), and returns -1 (exit status 2). */
int tide_run_parse_option(const char *command, int argc, char **argv, int *index, tide_run_options *options);

/* Parses a whole number in [min, max] given to option; prints why not
 * (prefixed by command) and returns false. */
bool tide_parse_count_option(const char *command, const char *option, const char *value, uint64_t min, uint64_t max,
                             uint64_t *out);

/* The help lines of the shared options, and of the exit statuses. */
void tide_run_options_help(FILE *out);
void tide_exit_codes_help(FILE *out);

/* Resolves the default pool list from the device. Returns false (message
 * printed) when the device cannot be opened. */
bool tide_run_resolve_pools(const char *command, tide_run_options *options);

/* After parsing: what the options need of the replay (samples for a chart
 * or a series, peak snapshots) and the metrics accumulator. False (message
 * printed) on failure. */
bool tide_run_prepare(const char *command, tide_run_options *options);
/* At the end: writes --metrics and frees what tide_run_prepare made;
 * returns status, or TIDE_EXIT_ERROR if writing failed. */
int tide_run_end(const char *command, tide_run_options *options, int status);
/* Combines two exit statuses (error over gate over success). */
int tide_exit_merge(int a, int b);

/* Prints a finished run: with --json one line per pool,
 * {"<label_key>":"<label>","result":{...}}; otherwise heading, a table and
 * notes. Writes the chart, snapshots and series if asked for (the chart
 * titled chart_title) and gathers the metrics. Returns 0; 1 when a pool
 * reported errors or hazards or a file could not be written; 3 when a
 * gate (--fail-on-oom, --max-ratio) failed, with a line on stderr. */
int tide_run_report(const char *command, replay_run *run, const tide_run_options *options, const char *label_key,
                    const char *label, const char *heading, const char *chart_title);

/* Prints a JSON string literal (quotes and escapes included). */
void tide_json_string(FILE *out, const char *text);

#endif
