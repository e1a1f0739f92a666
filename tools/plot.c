/* SPDX-License-Identifier: MIT */
/*
 * plot.c -- hand-written SVG charts of replay curves (see plot.h).
 *
 * A chart is one or more panels stacked vertically; a panel draws the
 * results of one run: the live bytes once (a grey area: every pool sees the
 * same requests, so it is taken from the pool that failed least), and per
 * pool its reserved bytes (solid line) and cached bytes (dashed line) in the
 * pool's colour, its peak reserved marked with a dot and a label, and, for
 * a pool that gave up, a cross where it aborted (its curves end there);
 * under it a strip of held / live per pool with the 1.00-1.20x band.
 * plot_lines_svg draws plain byte-valued lines in the same frame.
 *
 * x is the trace's time when the trace has timestamps, else the event
 * index; ticks fall on 1-2-5 steps. y is bytes, ticks on power-of-two steps
 * so that labels read "512 MiB", "1.5 GiB". The samples are the engine's
 * downsampled curve (bucket maxima), so peaks survive downsampling.
 *
 * Output is valid XML whatever the title holds: markup characters are
 * escaped, control characters and bytes that are not UTF-8 become '?'.
 *
 * Where the chart goes: a new path or an existing regular file is written
 * to a temporary beside it (PATH.tmp.PID, created exclusively, so it
 * never writes through someone else's file or link) and renamed into
 * place, so a reader never sees half a chart; the temporary is removed on
 * every failure. A path that exists and is not a regular file -- a
 * symbolic link, a FIFO, a device such as /dev/stdout -- is opened and
 * written through instead: renaming over it would replace the link, pipe
 * or device with a file.
 */
#include "plot.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHART_WIDTH 1040.0
#define MAIN_HEIGHT 430.0
/* Under each chart, a strip of held / live per pool over the same x. */
#define RATIO_TOP_GAP 6.0
#define RATIO_HEIGHT 110.0
#define RATIO_FLOOR_SHARE 0.05 /* samples below 5% of peak live are left out (ratios of nothing) */
#define RATIO_SCALE_SHARE 0.5   /* the strip's scale fits the ratios where live is at least half its peak */
#define RATIO_STRIP_AT 392.0    /* below the main chart's x title */
#define PANEL_HEIGHT (RATIO_STRIP_AT + RATIO_TOP_GAP + RATIO_HEIGHT + 30.0)
#define HEADER_HEIGHT 34.0
#define PLOT_LEFT 90.0
#define PLOT_RIGHT (CHART_WIDTH - 290.0)
#define PLOT_TOP_OFFSET 46.0
#define PLOT_HEIGHT 300.0
#define LABEL_SPACING 15.0
#define MAX_LABELS 32

/* Colours by pool name, so a pool looks the same in every chart. */
static const struct {
    const char *pool;
    const char *colour;
} pool_colours[] = {{"vmm", "#2ca02c"}, {"segment", "#1f77b4"}, {"ggml-legacy", "#d62728"}, {"ggml-vmm", "#ff7f0e"}};
static const char *const spare_colours[] = {"#9467bd", "#8c564b", "#e377c2", "#17becf"};

static const char *colour_of(const char *pool, size_t index) {
    for (size_t i = 0; i < sizeof pool_colours / sizeof *pool_colours; i++)
        if (!strcmp(pool_colours[i].pool, pool)) return pool_colours[i].colour;
    return spare_colours[index % (sizeof spare_colours / sizeof *spare_colours)];
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static int utf8_sequence_length(const unsigned char *s) {
    int length;
    unsigned min;
    unsigned code;
    if (s[0] < 0x80) return 1;
    if ((s[0] & 0xE0) == 0xC0) length = 2, min = 0x80, code = s[0] & 0x1Fu;
    else if ((s[0] & 0xF0) == 0xE0) length = 3, min = 0x800, code = s[0] & 0x0Fu;
    else if ((s[0] & 0xF8) == 0xF0) length = 4, min = 0x10000, code = s[0] & 0x07u;
    else return 0;
    for (int i = 1; i < length; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        code = (code << 6) | (s[i] & 0x3Fu);
    }
    if (code < min || code > 0x10FFFF || (code >= 0xD800 && code <= 0xDFFF)) return 0;
    return length;
}

/* Writes text as XML character data or attribute content. */
void plot_xml_text(FILE *out, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    while (*s) {
        switch (*s) {
        case '&': fputs("&amp;", out); break;
        case '<': fputs("&lt;", out); break;
        case '>': fputs("&gt;", out); break;
        case '"': fputs("&quot;", out); break;
        case '\'': fputs("&apos;", out); break;
        default:
            if (*s < 0x20 && *s != '\t') {
                fputc('?', out);
            } else {
                int length = utf8_sequence_length(s);
                if (!length) {
                    fputc('?', out);
                } else {
                    fwrite(s, 1, (size_t)length, out);
                    s += length - 1;
                }
            }
        }
        s++;
    }
}

/* "0", "256 MiB", "1.5 GiB": a byte count for an axis label. */
static void axis_bytes(double bytes, char *buf, size_t capacity) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    if (bytes <= 0) {
        snprintf(buf, capacity, "0");
        return;
    }
    int unit = 0;
    double value = bytes;
    while (value >= 1024.0 && unit < 5) {
        value /= 1024.0;
        unit++;
    }
    char number[32];
    snprintf(number, sizeof number, "%.2f", value);
    char *end = number + strlen(number) - 1;
    while (*end == '0') *end-- = '\0';
    if (*end == '.') *end = '\0';
    snprintf(buf, capacity, "%s %s", number, units[unit]);
}

/* A 1-2-5 step that cuts span into about target pieces. */
static double nice_step(double span, int target) {
    double raw = span / target;
    if (raw <= 0) return 1;
    double magnitude = pow(10.0, floor(log10(raw)));
    double normalized = raw / magnitude;
    double factor = normalized < 1.5 ? 1 : normalized < 3 ? 2 : normalized < 7 ? 5 : 10;
    return factor * magnitude;
}

/* The x axis: time in a readable unit, or the event index. */
typedef struct x_axis {
    bool by_time;
    double max;          /* in display units */
    double ns_per_unit;  /* time: nanoseconds per display unit */
    const char *title;
} x_axis;

static double sample_x(const x_axis *axis, const replay_sample *s) {
    return axis->by_time ? (double)s->time_ns / axis->ns_per_unit : (double)s->event;
}

/* Samples of r to draw: a pool that gave up is drawn up to where it did. */
static size_t drawn_samples(const replay_result *r) {
    if (!r->fatal) return r->sample_count;
    size_t n = 0;
    while (n < r->sample_count && r->samples[n].event <= r->fatal_event) n++;
    return n ? n : (r->sample_count ? 1 : 0);
}

static void choose_x_axis(const replay_result *results, size_t count, x_axis *axis) {
    uint64_t max_ns = 0, max_event = 0;
    for (size_t i = 0; i < count; i++) {
        const replay_result *r = &results[i];
        if (!r->sample_count) continue;
        const replay_sample *last = &r->samples[r->sample_count - 1];
        if (last->time_ns > max_ns) max_ns = last->time_ns;
        if (last->event > max_event) max_event = last->event;
    }
    axis->by_time = max_ns > 0;
    if (!axis->by_time) {
        axis->ns_per_unit = 1;
        axis->max = max_event ? (double)max_event : 1;
        axis->title = "events";
        return;
    }
    double seconds = (double)max_ns / 1e9;
    if (seconds < 2) axis->ns_per_unit = 1e6, axis->title = "time (ms)";
    else if (seconds < 600) axis->ns_per_unit = 1e9, axis->title = "time (s)";
    else if (seconds < 3 * 3600) axis->ns_per_unit = 60e9, axis->title = "time (min)";
    else axis->ns_per_unit = 3600e9, axis->title = "time (h)";
    axis->max = (double)max_ns / axis->ns_per_unit;
}

static void axis_number(double value, bool by_time, char *buf, size_t capacity) {
    if (!by_time && value >= 1e6) snprintf(buf, capacity, "%gM", value / 1e6);
    else if (!by_time && value >= 1e3) snprintf(buf, capacity, "%gk", value / 1e3);
    else snprintf(buf, capacity, "%g", value);
}

/* A label beside a marker; labels are spread so that none overlap. */
typedef struct marker_label {
    double x, y;       /* the marker */
    double label_y;
    const char *colour;
    char text[96];
} marker_label;

static int by_y(const void *a, const void *b) {
    double ya = ((const marker_label *)a)->y, yb = ((const marker_label *)b)->y;
    return (ya > yb) - (ya < yb);
}

static void spread_labels(marker_label *labels, size_t count, double top, double bottom) {
    qsort(labels, count, sizeof *labels, by_y);
    for (size_t i = 0; i < count; i++) {
        double wanted = labels[i].y - 6;
        double floor_y = i ? labels[i - 1].label_y + LABEL_SPACING : top + 10;
        labels[i].label_y = wanted > floor_y ? wanted : floor_y;
    }
    /* Pushed past the bottom: shift the run back up. */
    for (size_t i = count; i-- > 0;) {
        double limit = i + 1 < count ? labels[i + 1].label_y - LABEL_SPACING : bottom - 4;
        if (labels[i].label_y > limit) labels[i].label_y = limit;
    }
}

static void draw_polyline(FILE *out, const replay_result *r, size_t n, const x_axis *axis, double x_scale,
                          double y_scale, double bottom, bool cached, const char *colour) {
    if (!n) return;
    fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%s\"%s points=\"", colour,
            cached ? "1.2" : "1.8", cached ? " stroke-dasharray=\"5,3\" opacity=\"0.85\"" : "");
    for (size_t i = 0; i < n; i++) {
        const replay_sample *s = &r->samples[i];
        double value = (double)(cached ? s->cached_bytes : s->reserved_bytes);
        fprintf(out, "%.1f,%.1f ", PLOT_LEFT + sample_x(axis, s) * x_scale, bottom - value * y_scale);
    }
    fprintf(out, "\"/>\n");
}

/* Where a panel's plot area lies and how values map into it. */
typedef struct plot_frame {
    double plot_top, bottom;
    double y_scale, x_scale; /* pixels per byte, per x unit */
} plot_frame;

/* A panel's title, grid, byte labels on y (power-of-two steps up to at
 * least y_max) and x ticks (1-2-5 steps up to x_max), x titled x_title. */
static plot_frame draw_frame(FILE *out, double top, const char *title, uint64_t y_max, double x_max, bool by_time,
                             const char *x_title) {
    if (y_max < 1) y_max = 1;
    if (x_max <= 0) x_max = 1;
    uint64_t y_step = 1;
    while (y_step < y_max / 8 + (y_max % 8 != 0)) y_step *= 2;
    /* the top in steps, not bytes: a y_max near 2^64 rounded up would wrap */
    uint64_t y_steps = y_max / y_step + (y_max % y_step != 0);
    plot_frame f;
    f.plot_top = top + PLOT_TOP_OFFSET;
    f.bottom = f.plot_top + PLOT_HEIGHT;
    f.y_scale = PLOT_HEIGHT / ((double)y_steps * (double)y_step);
    f.x_scale = (PLOT_RIGHT - PLOT_LEFT) / x_max;

    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"15\" font-weight=\"bold\">", PLOT_LEFT, top + 24);
    plot_xml_text(out, title ? title : "");
    fprintf(out, "</text>\n");

    char label[48];
    for (uint64_t k = 0; k <= y_steps; k++) {
        double v = (double)k * (double)y_step;
        double y = f.bottom - v * f.y_scale;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", PLOT_LEFT, y,
                PLOT_RIGHT, y);
        axis_bytes(v, label, sizeof label);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%s</text>\n", PLOT_LEFT - 6,
                y + 4, label);
    }
    double x_step = nice_step(x_max, 8);
    for (double v = 0; v <= x_max * 1.0001; v += x_step) {
        double x = PLOT_LEFT + v * f.x_scale;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x, f.bottom, x,
                f.bottom + 5);
        axis_number(v, by_time, label, sizeof label);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", x,
                f.bottom + 18, label);
    }
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">", (PLOT_LEFT + PLOT_RIGHT) / 2,
            f.bottom + 36);
    plot_xml_text(out, x_title);
    fprintf(out, "</text>\n");
    fprintf(out,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">device memory</text>\n",
            PLOT_LEFT - 62, (f.plot_top + f.bottom) / 2, PLOT_LEFT - 62, (f.plot_top + f.bottom) / 2);
    return f;
}

/* The held / live strip under a chart: each pool's reserved over live
 * bytes per sample (where live is at least RATIO_FLOOR_SHARE of the peak),
 * the 1.00-1.20x band shaded; the scale (1.3x to 3x) fits the ratios where
 * live is at least half its peak, higher values are clipped to its top. */
static void draw_ratio_strip(FILE *out, const plot_panel *panel, const x_axis *axis, double x_scale, double top) {
    const replay_result *results = panel->results;
    uint64_t peak_live = 0;
    for (size_t i = 0; i < panel->count; i++)
        if (results[i].peak_live_bytes > peak_live) peak_live = results[i].peak_live_bytes;
    double floor_bytes = (double)peak_live * RATIO_FLOOR_SHARE;
    double max_ratio = 1.0;
    for (size_t i = 0; i < panel->count; i++) {
        size_t n = drawn_samples(&results[i]);
        for (size_t k = 0; k < n; k++) {
            const replay_sample *s = &results[i].samples[k];
            if (s->live_bytes && (double)s->live_bytes >= (double)peak_live * RATIO_SCALE_SHARE) {
                double r = (double)s->reserved_bytes / (double)s->live_bytes;
                if (r > max_ratio) max_ratio = r;
            }
        }
    }
    double y_top = ceil(max_ratio * 10 - 1e-9) / 10;
    if (y_top < 1.3) y_top = 1.3;
    if (y_top > 3.0) y_top = 3.0;
    double strip_top = top + RATIO_TOP_GAP, bottom = strip_top + RATIO_HEIGHT;
    double scale = RATIO_HEIGHT / (y_top - 1.0);
    /* the 1.00-1.20x band */
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"#2ca02c\" fill-opacity=\"0.08\"/>\n",
            PLOT_LEFT, bottom - 0.2 * scale, PLOT_RIGHT - PLOT_LEFT, 0.2 * scale);
    double step = y_top - 1.0 > 1.0 ? 0.5 : y_top - 1.0 > 0.5 ? 0.2 : 0.1;
    for (double v = 1.0; v <= y_top + 1e-9; v += step) {
        double y = bottom - (v - 1.0) * scale;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e3e3e3\"/>\n", PLOT_LEFT, y,
                PLOT_RIGHT, y);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%.2fx</text>\n", PLOT_LEFT - 6,
                y + 4, v);
    }
    fprintf(out,
            "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\" "
            "transform=\"rotate(-90 %.1f %.1f)\">held / live</text>\n",
            PLOT_LEFT - 62, (strip_top + bottom) / 2, PLOT_LEFT - 62, (strip_top + bottom) / 2);
    for (size_t i = 0; i < panel->count; i++) {
        const replay_result *r = &results[i];
        size_t n = drawn_samples(r);
        bool open = false;
        for (size_t k = 0; k < n; k++) {
            const replay_sample *s = &r->samples[k];
            if (!s->live_bytes || (double)s->live_bytes < floor_bytes) {
                if (open) fprintf(out, "\"/>\n");
                open = false;
                continue;
            }
            double ratio = (double)s->reserved_bytes / (double)s->live_bytes;
            if (ratio > y_top) ratio = y_top;
            if (ratio < 1.0) ratio = 1.0;
            if (!open)
                fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.4\" points=\"", colour_of(r->pool, i));
            open = true;
            fprintf(out, "%.1f,%.1f ", PLOT_LEFT + sample_x(axis, s) * x_scale, bottom - (ratio - 1.0) * scale);
        }
        if (open) fprintf(out, "\"/>\n");
    }
    fprintf(out, "<path d=\"M%.1f,%.1f V%.1f H%.1f\" fill=\"none\" stroke=\"#333\"/>\n", PLOT_LEFT, strip_top, bottom,
            PLOT_RIGHT);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">held / live per pool</text>\n", PLOT_RIGHT + 20,
            strip_top + 12);
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"24\" height=\"10\" fill=\"#2ca02c\" fill-opacity=\"0.15\"/>\n",
            PLOT_RIGHT + 20, strip_top + 22);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">1.00-1.20x</text>\n", PLOT_RIGHT + 52, strip_top + 31);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#666\">(where live &gt;= %.0f%% of its peak)</text>\n",
            PLOT_RIGHT + 20, strip_top + 48, RATIO_FLOOR_SHARE * 100);
}

static void draw_panel(FILE *out, const plot_panel *panel, double top) {
    const replay_result *results = panel->results;
    size_t count = panel->count;
    x_axis axis;
    choose_x_axis(results, count, &axis);

    /* y range: every drawn value and every exact peak. */
    uint64_t y_max = 1;
    for (size_t i = 0; i < count; i++) {
        const replay_result *r = &results[i];
        size_t n = drawn_samples(r);
        for (size_t k = 0; k < n; k++) {
            const replay_sample *s = &r->samples[k];
            if (s->reserved_bytes > y_max) y_max = s->reserved_bytes;
            if (s->live_bytes > y_max) y_max = s->live_bytes;
            if (s->cached_bytes > y_max) y_max = s->cached_bytes;
        }
        if (r->peak_reserved_bytes > y_max) y_max = r->peak_reserved_bytes;
    }
    plot_frame f = draw_frame(out, top, panel->title, y_max, axis.max, axis.by_time, axis.title);
    double plot_top = f.plot_top, bottom = f.bottom, y_scale = f.y_scale, x_scale = f.x_scale;

    /* Live bytes, once: from the pool that failed least. */
    const replay_result *live = NULL;
    for (size_t i = 0; i < count; i++) {
        const replay_result *r = &results[i];
        if (!r->sample_count) continue;
        if (!live || (live->fatal && !r->fatal) || (live->fatal == r->fatal && r->ooms < live->ooms)) live = r;
    }
    if (live) {
        size_t n = drawn_samples(live);
        fprintf(out, "<path fill=\"#9e9e9e\" fill-opacity=\"0.35\" stroke=\"#6b6b6b\" stroke-width=\"0.8\" d=\"M%.1f,%.1f",
                PLOT_LEFT + sample_x(&axis, &live->samples[0]) * x_scale, bottom);
        for (size_t k = 0; k < n; k++)
            fprintf(out, " L%.1f,%.1f", PLOT_LEFT + sample_x(&axis, &live->samples[k]) * x_scale,
                    bottom - (double)live->samples[k].live_bytes * y_scale);
        fprintf(out, " L%.1f,%.1f Z\"/>\n", PLOT_LEFT + sample_x(&axis, &live->samples[n - 1]) * x_scale, bottom);
    }

    /* Per pool: cached, reserved, markers. */
    marker_label labels[MAX_LABELS];
    size_t label_count = 0;
    char bytes[32];
    for (size_t i = 0; i < count; i++) {
        const replay_result *r = &results[i];
        const char *colour = colour_of(r->pool, i);
        size_t n = drawn_samples(r);
        draw_polyline(out, r, n, &axis, x_scale, y_scale, bottom, true, colour);
        draw_polyline(out, r, n, &axis, x_scale, y_scale, bottom, false, colour);
        if (!n) continue;
        size_t peak = 0;
        for (size_t k = 1; k < n; k++)
            if (r->samples[k].reserved_bytes > r->samples[peak].reserved_bytes) peak = k;
        if (label_count < MAX_LABELS) {
            marker_label *m = &labels[label_count++];
            m->x = PLOT_LEFT + sample_x(&axis, &r->samples[peak]) * x_scale;
            m->y = bottom - (double)r->peak_reserved_bytes * y_scale;
            m->colour = colour;
            axis_bytes((double)r->peak_reserved_bytes, bytes, sizeof bytes);
            snprintf(m->text, sizeof m->text, "%s peak %s", r->pool, bytes);
            fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"%s\" stroke=\"#fff\"/>\n", m->x, m->y,
                    colour);
        }
        if (r->fatal && label_count < MAX_LABELS) {
            marker_label *m = &labels[label_count++];
            const replay_sample *last = &r->samples[n - 1];
            m->x = PLOT_LEFT + sample_x(&axis, last) * x_scale;
            m->y = bottom - (double)last->reserved_bytes * y_scale;
            m->colour = colour;
            snprintf(m->text, sizeof m->text, "%s aborted: out of memory", r->pool);
            fprintf(out,
                    "<path d=\"M%.1f,%.1f l12,12 m0,-12 l-12,12\" stroke=\"%s\" stroke-width=\"3\"/>\n",
                    m->x - 6, m->y - 6, colour);
        }
    }
    spread_labels(labels, label_count, plot_top, bottom);
    for (size_t i = 0; i < label_count; i++) {
        marker_label *m = &labels[i];
        bool left = m->x > PLOT_RIGHT - 200;
        double text_x = left ? m->x - 10 : m->x + 10;
        if (fabs(m->label_y - (m->y - 6)) > 3)
            fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"0.6\"/>\n",
                    m->x, m->y, text_x, m->label_y - 4, m->colour);
        /* a white halo keeps the label readable over the curves */
        fprintf(out,
                "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"%s\" stroke=\"#fff\" stroke-width=\"3\" "
                "paint-order=\"stroke\"%s>",
                text_x, m->label_y, m->colour, left ? " text-anchor=\"end\"" : "");
        plot_xml_text(out, m->text);
        fprintf(out, "</text>\n");
    }

    /* Axes over the curves. */
    fprintf(out, "<path d=\"M%.1f,%.1f V%.1f H%.1f\" fill=\"none\" stroke=\"#333\"/>\n", PLOT_LEFT, plot_top, bottom,
            PLOT_RIGHT);

    draw_ratio_strip(out, panel, &axis, x_scale, top + RATIO_STRIP_AT);

    /* Legend. */
    double lx = PLOT_RIGHT + 20, ly = plot_top + 8;
    fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"24\" height=\"10\" fill=\"#9e9e9e\" fill-opacity=\"0.35\" "
                 "stroke=\"#6b6b6b\" stroke-width=\"0.8\"/>\n", lx, ly - 9);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">live (requested)</text>\n", lx + 32, ly);
    for (size_t i = 0; i < count; i++) {
        const char *colour = colour_of(results[i].pool, i);
        ly += 20;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.8\"/>\n", lx,
                ly - 4, lx + 24, ly - 4, colour);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", lx + 32, ly);
        plot_xml_text(out, results[i].pool);
        fprintf(out, " reserved%s</text>\n", results[i].fatal ? " (aborted)" : "");
        ly += 18;
        fprintf(out,
                "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.2\" "
                "stroke-dasharray=\"5,3\"/>\n",
                lx, ly - 4, lx + 24, ly - 4, colour);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", lx + 32, ly);
        plot_xml_text(out, results[i].pool);
        fprintf(out, " cached (idle)</text>\n");
    }
    ly += 20;
    fprintf(out, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"#555\"/>\n", lx + 12, ly - 4);
    fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">peak reserved</text>\n", lx + 32, ly);
}

typedef plot_svg_file svg_target;
static int svg_close(svg_target *t, FILE *out, char *err, size_t capacity);

/* Opens the file the chart is written to (see the top of the file). */
static FILE *svg_target_open(svg_target *t, const char *path, char *err, size_t capacity) {
    t->path = path;
    t->temp_path[0] = '\0';
    struct stat st;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        /* a link, FIFO or device: write through it */
        FILE *out = fopen(path, "w");
        if (!out) snprintf(err, capacity, "%s: cannot create: %s", path, strerror(errno));
        return out;
    }
    int fd = -1;
    for (unsigned attempt = 0; fd < 0 && attempt < 100; attempt++) {
        int n = attempt ? snprintf(t->temp_path, sizeof t->temp_path, "%s.tmp.%ld.%u", path, (long)getpid(), attempt)
                        : snprintf(t->temp_path, sizeof t->temp_path, "%s.tmp.%ld", path, (long)getpid());
        if (n < 0 || (size_t)n >= sizeof t->temp_path) {
            snprintf(err, capacity, "%s: path too long", path);
            t->temp_path[0] = '\0';
            return NULL;
        }
        /* O_EXCL: never an existing file, nor through a link */
        fd = open(t->temp_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        snprintf(err, capacity, "%s: cannot create: %s", path, strerror(errno));
        t->temp_path[0] = '\0';
        return NULL;
    }
    FILE *out = fdopen(fd, "w");
    if (!out) {
        snprintf(err, capacity, "%s: cannot create: %s", path, strerror(errno));
        close(fd);
        remove(t->temp_path);
        t->temp_path[0] = '\0';
    }
    return out;
}

/* Closes out and, when writing to a temporary, renames it into place; the
 * temporary is removed if anything failed. */
static int svg_target_close(svg_target *t, FILE *out, char *err, size_t capacity) {
    bool write_failed = ferror(out) != 0;
    int saved = errno;
    if (fclose(out) != 0) {
        write_failed = true;
        saved = errno;
    }
    if (write_failed) {
        snprintf(err, capacity, "%s: write failed: %s", t->path, strerror(saved));
        if (t->temp_path[0]) remove(t->temp_path);
        return -1;
    }
    if (t->temp_path[0] && rename(t->temp_path, t->path) != 0) {
        snprintf(err, capacity, "%s: cannot rename %s into place: %s", t->path, t->temp_path, strerror(errno));
        remove(t->temp_path);
        return -1;
    }
    return 0;
}

/* Opens the chart's file and writes the SVG prologue; NULL with err filled
 * on failure. */
FILE *plot_svg_begin(plot_svg_file *t, const char *path, double width, double height, const char *title, char *err,
                     size_t capacity) {
    FILE *out = svg_target_open(t, path, err, capacity);
    if (!out) return NULL;
    fprintf(out,
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
            "font-family=\"Helvetica, Arial, sans-serif\">\n<title>",
            width, height, width, height);
    plot_xml_text(out, title);
    fprintf(out, "</title>\n<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n");
    return out;
}

static FILE *svg_open(svg_target *t, const char *path, double height, const char *title, char *err,
                      size_t capacity) {
    return plot_svg_begin(t, path, CHART_WIDTH, height, title, err, capacity);
}

int plot_svg_end(plot_svg_file *t, FILE *out, char *err, size_t capacity) { return svg_close(t, out, err, capacity); }

/* Ends the SVG and puts the file in place. */
static int svg_close(svg_target *t, FILE *out, char *err, size_t capacity) {
    fprintf(out, "</svg>\n");
    return svg_target_close(t, out, err, capacity);
}

int plot_replay_svg_panels(const char *path, const char *title, const plot_panel *panels, size_t panel_count,
                           char *err, size_t capacity) {
    if (!panel_count) {
        snprintf(err, capacity, "%s: nothing to plot", path);
        return -1;
    }
    for (size_t p = 0; p < panel_count; p++) {
        bool any = false;
        for (size_t i = 0; i < panels[p].count; i++) any |= panels[p].results[i].sample_count > 0;
        if (!any) {
            snprintf(err, capacity, "%s: no samples to plot (the replay kept none)", path);
            return -1;
        }
    }
    svg_target target;
    double header = title && panel_count > 1 ? HEADER_HEIGHT : 0;
    FILE *out = svg_open(&target, path, header + PANEL_HEIGHT * (double)panel_count, title ? title : "tidepool replay",
                         err, capacity);
    if (!out) return -1;
    if (header) {
        fprintf(out, "<text x=\"%.1f\" y=\"24\" font-size=\"17\" font-weight=\"bold\">", PLOT_LEFT);
        plot_xml_text(out, title);
        fprintf(out, "</text>\n");
    }
    for (size_t p = 0; p < panel_count; p++) draw_panel(out, &panels[p], header + PANEL_HEIGHT * (double)p);
    return svg_close(&target, out, err, capacity);
}

int plot_lines_svg(const char *path, const char *title, const char *x_title, const plot_line *lines,
                   size_t line_count, char *err, size_t capacity) {
    uint64_t y_max = 1;
    double x_max = 0;
    size_t points = 0;
    for (size_t i = 0; i < line_count; i++) {
        for (size_t k = 0; k < lines[i].count; k++) {
            if (lines[i].y[k] > y_max) y_max = lines[i].y[k];
            if (lines[i].x[k] > x_max) x_max = lines[i].x[k];
        }
        points += lines[i].count;
    }
    if (!points) {
        snprintf(err, capacity, "%s: nothing to plot", path);
        return -1;
    }
    svg_target target;
    FILE *out = svg_open(&target, path, MAIN_HEIGHT, title, err, capacity);
    if (!out) return -1;
    plot_frame f = draw_frame(out, 0, title, y_max, x_max, false, x_title);
    double lx = PLOT_RIGHT + 20, ly = f.plot_top + 8;
    for (size_t i = 0; i < line_count; i++) {
        const plot_line *line = &lines[i];
        const char *colour = line->colour ? line->colour : spare_colours[i % (sizeof spare_colours / sizeof *spare_colours)];
        const char *dash = line->dashed ? " stroke-dasharray=\"5,3\"" : "";
        if (line->count) {
            fprintf(out, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s points=\"", colour, dash);
            for (size_t k = 0; k < line->count; k++)
                fprintf(out, "%.1f,%.1f ", PLOT_LEFT + line->x[k] * f.x_scale,
                        f.bottom - (double)line->y[k] * f.y_scale);
            fprintf(out, "\"/>\n");
        }
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.8\"%s/>\n",
                lx, ly - 4, lx + 24, ly - 4, colour, dash);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\">", lx + 32, ly);
        plot_xml_text(out, line->name);
        fprintf(out, "</text>\n");
        ly += 20;
    }
    fprintf(out, "<path d=\"M%.1f,%.1f V%.1f H%.1f\" fill=\"none\" stroke=\"#333\"/>\n", PLOT_LEFT, f.plot_top,
            f.bottom, PLOT_RIGHT);
    return svg_close(&target, out, err, capacity);
}

int plot_replay_svg(const char *path, const char *title, const replay_result *results, size_t count, char *err,
                    size_t capacity) {
    plot_panel panel = {title, results, count};
    return plot_replay_svg_panels(path, title, &panel, 1, err, capacity);
}
