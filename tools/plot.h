/*
 * plot.h -- SVG charts of replay curves: live, reserved and cached bytes
 * over the trace for every pool of a run, in one chart with axes, units, a
 * legend and each pool's peak marked.
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

#endif
