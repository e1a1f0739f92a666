/* SPDX-License-Identifier: MIT */
/*
 * tide_observe.h -- what `tide replay` and `tide scenario` write besides
 * their report: the final figures in the Prometheus text format
 * (--metrics), the memory maps of tidepool pools (--snapshot) and the
 * plotted curves as CSV (--series).
 */
#ifndef TIDEPOOL_TIDE_OBSERVE_H
#define TIDEPOOL_TIDE_OBSERVE_H

#include "replay.h"

#include <stddef.h>

/* Metric families gathered over one or more runs, written at the end: each
 * family's HELP and TYPE once, then the samples of every pool of every run
 * (the Prometheus text format wants a family's lines together). */
typedef struct tide_metrics tide_metrics;

tide_metrics *tide_metrics_create(void);
void tide_metrics_destroy(tide_metrics *metrics);
/* Adds the final figures of a finished run, every sample labelled
 * <label_key>="<label>" and pool="<pool>" (a label used by an earlier run
 * becomes long_label -- the file's base name with its extensions -- or,
 * failing that, "<label>.2", ...; a pool named twice "<pool>.2"): tidepool pools through
 * tp_pool_stats_openmetrics (tidepool_pool_...), baselines as
 * tidepool_baseline_<field>, and for every pool the replay's own figures
 * (tidepool_replay_...). Returns false (err filled) if memory ran out. */
bool tide_metrics_add_run(tide_metrics *metrics, const char *label_key, const char *label, const char *long_label,
                          replay_run *run, const replay_result *results, size_t count, char *err, size_t capacity);
/* Writes the text to path (a temporary renamed into place). 0 or -1. */
int tide_metrics_write(const tide_metrics *metrics, const char *path, char *err, size_t capacity);

/* Appends text as a label value: backslash, double quote and newline
 * escaped as the format asks. Returns the length written (the buffer is
 * always NUL-terminated when capacity > 0). */
size_t tide_label_escape(const char *text, char *buf, size_t capacity);

/* "decode_growing_kv" for ".../decode_growing_kv.csv.gz": the base name
 * without .gz and then .csv, .pickle or .pkl. */
void tide_trace_label(const char *path, char *buf, size_t capacity);

/* Writes PREFIX.<pool>.json (the memory map at the pool's highest reserved
 * bytes; needs options.snapshot_peaks) and PREFIX.<pool>.end.json (now) for
 * each tidepool pool of the run; prints "wrote ..." lines to out (NULL:
 * silent). 0, or -1 with err filled. */
int tide_write_snapshots(const char *prefix, replay_run *run, const replay_result *results, size_t count, FILE *out,
                         char *err, size_t capacity);

/* The curves of a chart as CSV: event,time_us and per pool
 * <pool>_live_bytes,<pool>_held_bytes,<pool>_cached_bytes, one row per
 * sample (the downsampled curve: bucket maxima). 0, or -1 with err. */
int tide_write_series(const char *path, const replay_result *results, size_t count, char *err, size_t capacity);

/* Writes length bytes to path through a temporary renamed into place (a
 * path that exists and is not a regular file is written through). */
int tide_write_file(const char *path, const char *data, size_t length, char *err, size_t capacity);

#endif
