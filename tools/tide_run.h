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

typedef struct tide_run_options {
    const char *pools;     /* comma-separated; NULL: vmm where the device has VMM, else segment */
    const char *plot_path; /* NULL: no chart */
    bool json;
    bool device_given;     /* --device was on the command line */
    bool occupy_given;     /* --occupy was on the command line */
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

/* The help lines of the shared options. */
void tide_run_options_help(FILE *out);

/* Resolves the default pool list from the device. Returns false (message
 * printed) when the device cannot be opened. */
bool tide_run_resolve_pools(const char *command, tide_run_options *options);

/* Prints a finished run: with --json one line per pool,
 * {"<label_key>":"<label>","result":{...}}; otherwise heading, a table and
 * notes. Writes the chart if asked for (titled chart_title). Returns 0, or
 * 1 when a pool reported errors or hazards or the chart failed. */
int tide_run_report(const char *command, replay_run *run, const tide_run_options *options, const char *label_key,
                    const char *label, const char *heading, const char *chart_title);

/* Prints a JSON string literal (quotes and escapes included). */
void tide_json_string(FILE *out, const char *text);

#endif
