/* SPDX-License-Identifier: MIT */
/*
 * plot.h -- SVG charts of replay curves: live, reserved and cached bytes
 * over the trace for every pool of a run, in one chart with axes, units, a
 * legend and each pool's peak marked; and plain byte-valued lines over a
 * count (the graph-churn scenario).
 */
#ifndef TIDEPOOL_PLOT_H
#define TIDEPOOL_PLOT_H

#include "replay.h"

/* Writes the chart to path. Returns 0, or -1 with err filled. */
int plot_replay_svg(const char *path, const char *title, const replay_result *results, size_t count, char *err,
                    size_t capacity);

/* One chart of a multi-chart figure: the results of one run. */
typedef struct plot_panel {
    const char *title;
    const replay_result *results;
    size_t count;
} plot_panel;

/* Several charts stacked in one SVG under a common title. */
int plot_replay_svg_panels(const char *path, const char *title, const plot_panel *panels, size_t panel_count,
                           char *err, size_t capacity);

/* A line of a plot_lines_svg chart: points (x[k], y[k]), y in bytes. */
typedef struct plot_line {
    const char *name;   /* legend text */
    const char *colour; /* "#rrggbb"; NULL: one of a fixed set */
    bool dashed;
    const double *x;
    const uint64_t *y;
    size_t count;
} plot_line;

/* One chart of byte-valued lines over x (titled x_title, ticks on 1-2-5
 * steps from 0), with a legend. Returns 0, or -1 with err filled. */
int plot_lines_svg(const char *path, const char *title, const char *x_title, const plot_line *lines,
                   size_t line_count, char *err, size_t capacity);

/* For other SVG pictures (tide map): an SVG file written through a
 * temporary renamed into place at plot_svg_end (a path that exists and is
 * not a regular file -- a link, a FIFO -- is written through), and XML
 * text escaping (markup characters escaped, bytes that are not UTF-8 and
 * control characters become '?'). */
typedef struct plot_svg_file {
    const char *path;
    char temp_path[4096];
} plot_svg_file;
/* Opens path and writes the prologue (<svg ...><title>title</title> and a
 * white background); NULL with err filled on failure. */
FILE *plot_svg_begin(plot_svg_file *file, const char *path, double width, double height, const char *title, char *err,
                     size_t capacity);
/* Writes </svg>, closes and puts the file in place. 0, or -1 with err. */
int plot_svg_end(plot_svg_file *file, FILE *out, char *err, size_t capacity);
void plot_xml_text(FILE *out, const char *text);

#endif
