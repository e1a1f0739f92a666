/* SPDX-License-Identifier: MIT */
/*
 * tide_map.c -- `tide map SNAPSHOT.json --plot OUT.svg`: draws the memory
 * map a pool writes with tp_pool_snapshot_json (tide replay --snapshot
 * writes them) as an SVG.
 *
 * The picture: one row per fixed span of address space (64 MiB unless
 * --row says otherwise); a unit -- a run of contiguous ranges, such as a
 * segment -- starts a row of its own and wraps over as many rows as it
 * needs; an unmapped run of a VMM reservation at least a row long is one
 * short labelled row instead. Ranges are coloured by state, with a legend
 * giving each state's bytes and count; hovering a range shows its address,
 * size, state, stream and idle time. The title is the file's base name.
 *
 * The JSON reader takes what the library writes ({"kind", "now_ns",
 * "reserved_bytes", "ranges": [{"address", "bytes", "state", "stream",
 * "requested", "idle_ns"}...]}, addresses and streams as numbers or "0x"
 * strings) and skips keys it does not know; anything else is an error with
 * its byte offset.
 */
#include "plot.h"
#include "tide.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAP_WIDTH 1100.0
#define BAR_LEFT 150.0
#define BAR_RIGHT 1010.0
#define ROW_HEIGHT 13.0
#define ROW_STEP 17.0
#define COMPRESSED_STEP 20.0
#define MAX_ROWS 4000
#define MAX_TOOLTIPS 20000
#define MAX_DEPTH 64

/* ------------------------------------------------------------ states */

enum { STATE_LIVE, STATE_PINNED, STATE_FREED_PINNED, STATE_PARKED, STATE_CACHED, STATE_UNMAPPED, STATE_OTHER, STATE_COUNT };

static const struct {
    const char *name, *colour, *meaning;
} states[STATE_COUNT] = {
    {"live", "#2ca02c", "handed out"},
    {"pinned", "#9467bd", "handed out, pinned"},
    {"freed_pinned", "#e377c2", "freed, kept by pins"},
    {"parked", "#ff7f0e", "freed, parked for reuse"},
    {"cached", "#9ecae1", "idle device memory"},
    {"unmapped", "#e6e6e6", "reserved address space, no memory"},
    {"other", "#7f7f7f", "a state this tide does not know"},
};

typedef struct map_range {
    uint64_t address, bytes, stream, requested, idle_ns;
    int state;
    char other_state[32]; /* STATE_OTHER: the file's name for the state */
} map_range;

typedef struct map_doc {
    char kind[32];
    uint64_t now_ns, reserved_bytes;
    bool have_reserved;
    map_range *ranges;
    size_t count, capacity;
    char other_state[32]; /* the first unknown state's name */
    bool other_states_differ; /* unknown states of more than one name */
} map_doc;

/* --------------------------------------------------------------- JSON */

typedef struct json {
    const char *start, *p, *end;
    char *err;
    size_t err_capacity;
    const char *path;
} json;

static bool json_fail(json *j, const char *what) {
    snprintf(j->err, j->err_capacity, "%s: offset %zu: %s", j->path, (size_t)(j->p - j->start), what);
    return false;
}

static void json_ws(json *j) {
    while (j->p < j->end && (*j->p == ' ' || *j->p == '\n' || *j->p == '\r' || *j->p == '\t')) j->p++;
}

static bool json_expect(json *j, char c) {
    json_ws(j);
    if (j->p >= j->end || *j->p != c) {
        char what[40];
        snprintf(what, sizeof what, "expected '%c'", c);
        return json_fail(j, what);
    }
    j->p++;
    return true;
}

/* After a member or an element: 1 if a ',' follows (another comes), 0 when
 * the container closes with close (consumed), -1 on an error. */
static int json_next(json *j, char close) {
    json_ws(j);
    if (j->p < j->end && *j->p == ',') {
        j->p++;
        return 1;
    }
    return json_expect(j, close) ? 0 : -1;
}

/* An empty container: close right away (consumed). */
static bool json_closes_at_once(json *j, char close) {
    json_ws(j);
    if (j->p < j->end && *j->p == close) {
        j->p++;
        return true;
    }
    return false;
}

/* A string into buf (truncated to fit; \u escapes outside ASCII become '?'). */
static bool json_string(json *j, char *buf, size_t capacity) {
    json_ws(j);
    if (j->p >= j->end || *j->p != '"') return json_fail(j, "expected a string");
    j->p++;
    size_t used = 0;
    while (j->p < j->end && *j->p != '"') {
        char c = *j->p++;
        if ((unsigned char)c < 0x20) return json_fail(j, "control character in a string");
        if (c == '\\') {
            if (j->p >= j->end) break;
            char e = *j->p++;
            switch (e) {
            case 'n': c = '\n'; break;
            case 't': c = '\t'; break;
            case 'r': c = '\r'; break;
            case 'b': c = '\b'; break;
            case 'f': c = '\f'; break;
            case '"': case '\\': case '/': c = e; break;
            case 'u': {
                unsigned code = 0;
                for (int k = 0; k < 4; k++, j->p++) {
                    if (j->p >= j->end) return json_fail(j, "truncated \\u escape");
                    char h = *j->p;
                    int v = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                          : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                    if (v < 0) return json_fail(j, "bad \\u escape");
                    code = code * 16 + (unsigned)v;
                }
                c = code < 0x80 ? (char)code : '?';
                break;
            }
            default: return json_fail(j, "bad escape in a string");
            }
        }
        if (buf && used + 1 < capacity) buf[used++] = c;
    }
    if (j->p >= j->end) return json_fail(j, "unterminated string");
    j->p++;
    if (buf && capacity) buf[used] = '\0';
    return true;
}

/* A whole number: digits, or a string "0x..." (hex) or of digits. */
static bool json_u64(json *j, uint64_t *out) {
    json_ws(j);
    char text[40];
    if (j->p < j->end && *j->p == '"') {
        if (!json_string(j, text, sizeof text)) return false;
    } else {
        size_t n = 0;
        while (j->p < j->end && n + 1 < sizeof text &&
               ((*j->p >= '0' && *j->p <= '9') || *j->p == '-' || *j->p == '.' || *j->p == 'e' || *j->p == 'E' || *j->p == '+'))
            text[n++] = *j->p++;
        text[n] = '\0';
        if (!n) return json_fail(j, "expected a number");
    }
    char *end = NULL;
    errno = 0;
    bool hex = text[0] == '0' && (text[1] == 'x' || text[1] == 'X');
    if (!hex && (strchr(text, '.') || strchr(text, 'e') || strchr(text, 'E'))) {
        double v = strtod(text, &end);
        if (*end || !(v >= 0) || v >= 18446744073709551616.0) return json_fail(j, "expected a whole number");
        *out = (uint64_t)v;
        return true;
    }
    if (text[0] == '-' || !text[0]) return json_fail(j, "expected a whole number");
    unsigned long long v = strtoull(text, &end, hex ? 16 : 10);
    if (*end || errno == ERANGE || (hex && !text[2])) return json_fail(j, "expected a whole number");
    *out = v;
    return true;
}

/* Skips any value (nesting bounded by MAX_DEPTH). */
static bool json_skip(json *j, int depth) {
    if (depth > MAX_DEPTH) return json_fail(j, "nested too deep");
    json_ws(j);
    if (j->p >= j->end) return json_fail(j, "expected a value");
    char c = *j->p;
    if (c == '"') return json_string(j, NULL, 0);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        j->p++;
        if (json_closes_at_once(j, close)) return true;
        int more;
        do {
            if (c == '{' && (!json_string(j, NULL, 0) || !json_expect(j, ':'))) return false;
            if (!json_skip(j, depth + 1)) return false;
        } while ((more = json_next(j, close)) == 1);
        return more == 0;
    }
    const char *words[] = {"true", "false", "null"};
    for (size_t i = 0; i < 3; i++) {
        size_t n = strlen(words[i]);
        if ((size_t)(j->end - j->p) >= n && !memcmp(j->p, words[i], n)) {
            j->p += n;
            return true;
        }
    }
    uint64_t ignored;
    if (c == '-') j->p++; /* a negative number: skipped */
    return json_u64(j, &ignored);
}

static bool parse_range(json *j, map_doc *d) {
    if (!json_expect(j, '{')) return false;
    map_range r = {0};
    r.state = -1;
    bool have_address = false, have_bytes = false;
    json_ws(j);
    if (j->p < j->end && *j->p == '}') return json_fail(j, "a range without address, bytes and state");
    for (;;) {
        char key[32], state[32];
        if (!json_string(j, key, sizeof key) || !json_expect(j, ':')) return false;
        bool ok;
        if (!strcmp(key, "address")) ok = json_u64(j, &r.address), have_address = true;
        else if (!strcmp(key, "bytes")) ok = json_u64(j, &r.bytes), have_bytes = true;
        else if (!strcmp(key, "stream")) ok = json_u64(j, &r.stream);
        else if (!strcmp(key, "requested")) ok = json_u64(j, &r.requested);
        else if (!strcmp(key, "idle_ns")) ok = json_u64(j, &r.idle_ns);
        else if (!strcmp(key, "state")) {
            ok = json_string(j, state, sizeof state);
            r.state = STATE_OTHER;
            for (int s = 0; s < STATE_OTHER; s++)
                if (!strcmp(state, states[s].name)) r.state = s;
            if (ok && r.state == STATE_OTHER) {
                snprintf(r.other_state, sizeof r.other_state, "%s", state);
                if (!d->other_state[0]) snprintf(d->other_state, sizeof d->other_state, "%s", state);
                else if (strcmp(d->other_state, state)) d->other_states_differ = true;
            }
        } else ok = json_skip(j, 2);
        if (!ok) return false;
        int more = json_next(j, '}');
        if (more < 0) return false;
        if (!more) break;
    }
    if (!have_address || !have_bytes || r.state < 0) return json_fail(j, "a range without address, bytes or state");
    if (r.bytes && r.address > UINT64_MAX - r.bytes) return json_fail(j, "a range past the end of the address space");
    if (d->count == d->capacity) {
        size_t cap = d->capacity ? d->capacity * 2 : 256;
        map_range *grown = realloc(d->ranges, cap * sizeof *grown);
        if (!grown) return json_fail(j, "out of memory");
        d->ranges = grown;
        d->capacity = cap;
    }
    d->ranges[d->count++] = r;
    return true;
}

static bool parse_map(json *j, map_doc *d) {
    if (!json_expect(j, '{')) return false;
    bool have_ranges = false;
    json_ws(j);
    if (j->p < j->end && *j->p == '}') return json_fail(j, "no \"ranges\": not a memory map (tp_pool_snapshot_json)");
    for (;;) {
        char key[32];
        if (!json_string(j, key, sizeof key) || !json_expect(j, ':')) return false;
        bool ok;
        if (!strcmp(key, "kind")) ok = json_string(j, d->kind, sizeof d->kind);
        else if (!strcmp(key, "now_ns")) ok = json_u64(j, &d->now_ns);
        else if (!strcmp(key, "reserved_bytes")) ok = json_u64(j, &d->reserved_bytes), d->have_reserved = true;
        else if (!strcmp(key, "ranges")) {
            have_ranges = true;
            ok = json_expect(j, '[');
            if (ok && !json_closes_at_once(j, ']')) {
                int more = -1; /* (set by the loop whenever ok: gcc at -O3 cannot tell) */
                do ok = parse_range(j, d);
                while (ok && (more = json_next(j, ']')) == 1);
                ok = ok && more == 0;
            }
        } else ok = json_skip(j, 1);
        if (!ok) return false;
        int more = json_next(j, '}');
        if (more < 0) return false;
        if (!more) break;
    }
    if (!have_ranges) return json_fail(j, "no \"ranges\": not a memory map (tp_pool_snapshot_json)");
    return true;
}

/* ------------------------------------------------------------- layout */

/* A row of the picture: a span of address space, or a compressed
 * unmapped run. */
typedef struct map_row {
    uint64_t address;     /* where the row starts */
    uint64_t bytes;       /* compressed: the run's length */
    bool compressed;
    bool unit_start;      /* the first row of a unit */
    uint64_t unit_bytes;  /* unit_start: the unit's length */
} map_row;

/* A piece of a range drawn in a row. */
typedef struct map_piece {
    size_t row, range;
    uint64_t offset, bytes; /* within the row */
} map_piece;

typedef struct map_layout {
    map_row *rows;
    size_t row_count, row_capacity;
    map_piece *pieces;
    size_t piece_count, piece_capacity;
    size_t rows_left_out; /* 1: MAX_ROWS reached, the rest not drawn */
} map_layout;

/* Makes room for one more element in *array (elem bytes each), doubling
 * from first; false when memory runs out (the array is kept). */
static bool grow_for_one(void **array, size_t elem, size_t count, size_t *capacity, size_t first) {
    if (count < *capacity) return true;
    size_t cap = *capacity ? *capacity * 2 : first;
    void *grown = realloc(*array, cap * elem);
    if (!grown) return false;
    *array = grown;
    *capacity = cap;
    return true;
}

static bool add_row(map_layout *l, map_row row) {
    if (!grow_for_one((void **)&l->rows, sizeof *l->rows, l->row_count, &l->row_capacity, 64)) return false;
    l->rows[l->row_count++] = row;
    return true;
}

static bool add_piece(map_layout *l, map_piece piece) {
    if (!grow_for_one((void **)&l->pieces, sizeof *l->pieces, l->piece_count, &l->piece_capacity, 256)) return false;
    l->pieces[l->piece_count++] = piece;
    return true;
}

static int by_address(const void *a, const void *b) {
    uint64_t x = ((const map_range *)a)->address, y = ((const map_range *)b)->address;
    return (x > y) - (x < y);
}

static bool lay_out(const map_doc *d, uint64_t row_bytes, map_layout *l) {
    uint64_t unit_end = 0, row_start = 0, row_end = 0;
    bool in_unit = false, row_open = false, unit_start = false;
    uint64_t unit_bytes = 0;
    for (size_t i = 0; i < d->count; i++) {
        const map_range *r = &d->ranges[i];
        if (!r->bytes) continue;
        if (!in_unit || r->address != unit_end) { /* a new unit: its contiguous ranges */
            unit_bytes = 0;
            for (size_t k = i, at = r->address; k < d->count && d->ranges[k].address == at; k++) {
                unit_bytes += d->ranges[k].bytes;
                at += d->ranges[k].bytes;
            }
            in_unit = true;
            row_open = false;
            unit_start = true;
        }
        unit_end = r->address + r->bytes;
        if (r->state == STATE_UNMAPPED && r->bytes >= row_bytes) {
            if (l->row_count == MAX_ROWS) {
                l->rows_left_out = 1;
                return true;
            }
            if (!add_row(l, (map_row){r->address, r->bytes, true, unit_start, unit_start ? unit_bytes : 0})) return false;
            unit_start = false;
            row_open = false; /* what follows starts a row */
            continue;
        }
        for (uint64_t at = r->address; at < unit_end;) {
            if (!row_open || at >= row_end) {
                if (l->row_count == MAX_ROWS) {
                    l->rows_left_out = 1;
                    return true;
                }
                if (!add_row(l, (map_row){at, row_bytes, false, unit_start, unit_start ? unit_bytes : 0})) return false;
                unit_start = false;
                row_open = true;
                row_start = at;
                row_end = at + row_bytes < at ? UINT64_MAX : at + row_bytes;
            }
            uint64_t stop = unit_end < row_end ? unit_end : row_end;
            if (!add_piece(l, (map_piece){l->row_count - 1, i, at - row_start, stop - at})) return false;
            at = stop;
        }
    }
    return true;
}

/* ------------------------------------------------------------ drawing */

static void hex(uint64_t v, char *buf, size_t capacity) { snprintf(buf, capacity, "0x%llx", (unsigned long long)v); }

static void duration(uint64_t ns, char *buf, size_t capacity) {
    if (ns >= 60000000000ull) snprintf(buf, capacity, "%.1f min", ns / 6e10);
    else if (ns >= 1000000000ull) snprintf(buf, capacity, "%.2f s", ns / 1e9);
    else snprintf(buf, capacity, "%.2f ms", ns / 1e6);
}

static int render(const char *path, const char *title, const map_doc *d, const map_layout *l, uint64_t row_bytes,
                  char *err, size_t capacity) {
    /* the legend: states present, with their bytes and counts */
    uint64_t state_bytes[STATE_COUNT] = {0}, state_count[STATE_COUNT] = {0};
    for (size_t i = 0; i < d->count; i++) {
        state_bytes[d->ranges[i].state] += d->ranges[i].bytes;
        state_count[d->ranges[i].state]++;
    }
    int legend_lines = 0;
    for (int s = 0; s < STATE_COUNT; s++) legend_lines += state_count[s] > 0;
    double legend_top = 70, rows_top = legend_top + 18.0 * (legend_lines ? legend_lines : 1) + 34;
    double height = rows_top + 20;
    for (size_t i = 0; i < l->row_count; i++) height += l->rows[i].compressed ? COMPRESSED_STEP : ROW_STEP;
    if (l->rows_left_out || !l->row_count) height += 20;

    plot_svg_file file;
    FILE *out = plot_svg_begin(&file, path, MAP_WIDTH, height, title, err, capacity);
    if (!out) return -1;
    char a[48], b[48], c[48];
    fprintf(out, "<text x=\"20\" y=\"26\" font-size=\"17\" font-weight=\"bold\">");
    plot_xml_text(out, title);
    fprintf(out, "</text>\n");
    uint64_t total = 0;
    for (size_t i = 0; i < d->count; i++) total += d->ranges[i].bytes;
    fprintf(out, "<text x=\"20\" y=\"46\" font-size=\"12\" fill=\"#444\">");
    plot_xml_text(out, d->kind[0] ? d->kind : "pool");
    fprintf(out, " pool: %zu ranges over %s of address space, %s held", d->count, tide_bytes(total, a, sizeof a),
            tide_bytes(d->have_reserved ? d->reserved_bytes : total - state_bytes[STATE_UNMAPPED], b, sizeof b));
    if (d->now_ns) {
        duration(d->now_ns, c, sizeof c);
        fprintf(out, " at %s", c);
    }
    fprintf(out, "; one row = %s</text>\n", tide_bytes(row_bytes, a, sizeof a));

    double ly = legend_top;
    for (int s = 0; s < STATE_COUNT; s++) {
        if (!state_count[s]) continue;
        fprintf(out, "<g class=\"legend\"><rect x=\"20\" y=\"%.1f\" width=\"22\" height=\"12\" fill=\"%s\" stroke=\"#888\" "
                     "stroke-width=\"0.5\"/>",
                ly - 10, states[s].colour);
        fprintf(out, "<text x=\"50\" y=\"%.1f\" font-size=\"12\">", ly);
        if (s == STATE_OTHER) plot_xml_text(out, d->other_states_differ ? "other states" : d->other_state);
        else fputs(states[s].name, out);
        fprintf(out, ": %s in %llu range%s (%s)</text></g>\n", tide_bytes(state_bytes[s], a, sizeof a),
                (unsigned long long)state_count[s], state_count[s] == 1 ? "" : "s", states[s].meaning);
        ly += 18;
    }

    /* scale over the rows */
    double scale_y = rows_top - 12, bar = BAR_RIGHT - BAR_LEFT;
    for (int k = 0; k <= 4; k++) {
        double x = BAR_LEFT + bar * k / 4;
        fprintf(out, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#999\"/>\n", x, scale_y + 2, x,
                scale_y + 7);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\" fill=\"#666\">+%s</text>\n", x,
                scale_y, tide_bytes(row_bytes / 4 * (uint64_t)k, a, sizeof a));
    }

    /* rows */
    double *row_y = malloc((l->row_count ? l->row_count : 1) * sizeof *row_y);
    if (!row_y) {
        fclose(out);
        snprintf(err, capacity, "out of memory");
        return -1;
    }
    double y = rows_top;
    for (size_t i = 0; i < l->row_count; i++) {
        const map_row *row = &l->rows[i];
        row_y[i] = y;
        hex(row->address, a, sizeof a);
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" font-family=\"monospace\" text-anchor=\"end\" "
                     "fill=\"%s\">%s</text>\n",
                BAR_LEFT - 6, y + ROW_HEIGHT - 3, row->unit_start ? "#000" : "#888", a);
        if (row->compressed) {
            fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\" stroke=\"#bbb\" "
                         "stroke-dasharray=\"4,3\"><title>unmapped: %s of reserved address space from %s</title></rect>\n",
                    BAR_LEFT, y, bar, ROW_HEIGHT, states[STATE_UNMAPPED].colour, tide_bytes(row->bytes, b, sizeof b), a);
            fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\" fill=\"#555\">unmapped: %s "
                         "(%.0f rows compressed)</text>\n",
                    (BAR_LEFT + BAR_RIGHT) / 2, y + ROW_HEIGHT - 3, tide_bytes(row->bytes, b, sizeof b),
                    (double)row->bytes / (double)row_bytes);
            y += COMPRESSED_STEP;
        } else {
            fprintf(out, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#ddd\" "
                         "stroke-width=\"0.5\"/>\n",
                    BAR_LEFT, y, bar, ROW_HEIGHT);
            y += ROW_STEP;
        }
        if (row->unit_start && row->unit_bytes)
            fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"#444\">%s</text>\n", BAR_RIGHT + 6,
                    row_y[i] + ROW_HEIGHT - 3, tide_bytes(row->unit_bytes, b, sizeof b));
    }
    /* pieces */
    size_t tooltips = 0;
    for (size_t k = 0; k < l->piece_count; k++) {
        const map_piece *p = &l->pieces[k];
        const map_range *r = &d->ranges[p->range];
        double x = BAR_LEFT + bar * (double)p->offset / (double)row_bytes;
        double w = bar * (double)p->bytes / (double)row_bytes;
        if (w < 0.6) w = 0.6; /* tiny blocks stay visible */
        fprintf(out, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\"%s>", x, row_y[p->row], w,
                ROW_HEIGHT, states[r->state].colour, w > 3 ? " stroke=\"#fff\" stroke-width=\"0.4\"" : "");
        if (tooltips++ < MAX_TOOLTIPS) {
            hex(r->address, a, sizeof a);
            fprintf(out, "<title>%s %s, ", a, tide_bytes(r->bytes, b, sizeof b));
            if (r->state == STATE_OTHER) plot_xml_text(out, r->other_state); /* the file's text: escaped */
            else fputs(states[r->state].name, out);
            if (r->requested) fprintf(out, " (%s requested)", tide_bytes(r->requested, b, sizeof b));
            if (r->stream) fprintf(out, ", stream 0x%llx", (unsigned long long)r->stream);
            if (r->idle_ns) {
                duration(r->idle_ns, c, sizeof c);
                fprintf(out, ", idle %s", c);
            }
            fprintf(out, "</title>");
        }
        fprintf(out, "</rect>\n");
    }
    free(row_y);
    if (!l->row_count)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#555\">the pool holds no memory</text>\n",
                BAR_LEFT, y + 12);
    if (l->rows_left_out)
        fprintf(out, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" fill=\"#a00\">... the rest is not drawn (more than %d "
                     "rows: try a larger --row)</text>\n",
                BAR_LEFT, y + 12, MAX_ROWS);
    return plot_svg_end(&file, out, err, capacity);
}

/* ------------------------------------------------------------ command */

static void map_usage(FILE *out) {
    fprintf(out, "usage: tide map SNAPSHOT.json --plot OUT.svg [--row SIZE]\n\n"
                 "Draws a pool's memory map -- the JSON of tp_pool_snapshot_json, which tide replay --snapshot\n"
                 "PREFIX writes -- as an SVG: one row per span of address space, each unit (a segment, a\n"
                 "reservation) starting a row and wrapping over as many as it needs, long unmapped runs of a\n"
                 "VMM reservation compressed into one labelled row; ranges coloured by state (live, pinned,\n"
                 "freed_pinned, parked, cached, unmapped) with a legend; the title is the file's base name.\n\n"
                 "options:\n"
                 "  --plot FILE.svg      where the picture goes (required)\n"
                 "  --row SIZE           address space per row (default 64MiB)\n"
                 "  -h, --help           this text\n"
                 "\nexit status: 0 success; 1 unreadable map or picture not written; 2 bad usage\n");
}

int tide_map(int argc, char **argv) {
    const char *input = NULL, *plot = NULL;
    uint64_t row_bytes = 64 * TIDE_MiB;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            map_usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--plot") || !strcmp(a, "--row")) {
            if (i + 1 >= argc) {
                fprintf(stderr, "tide map: %s needs a value (see tide map --help)\n", a);
                return 2;
            }
            const char *v = argv[++i];
            if (!strcmp(a, "--plot")) plot = v;
            else if (!tide_parse_bytes_option(a, v, &row_bytes)) return 2;
            else if (row_bytes < 4096) {
                fprintf(stderr, "tide map: --row needs at least 4KiB\n");
                return 2;
            }
            continue;
        }
        if (a[0] == '-' && a[1]) {
            fprintf(stderr, "tide map: unknown option '%s' (see tide map --help)\n", a);
            return 2;
        }
        if (input) {
            fprintf(stderr, "tide map: one memory map at a time ('%s' and '%s')\n", input, a);
            return 2;
        }
        input = a;
    }
    if (!input) {
        fprintf(stderr, "tide map: no memory map given\n\n");
        map_usage(stderr);
        return 2;
    }
    if (!plot) {
        fprintf(stderr, "tide map: --plot OUT.svg is required (the picture is all tide map makes)\n");
        return 2;
    }
    FILE *f = strcmp(input, "-") ? fopen(input, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "tide map: %s: cannot open: %s\n", input, strerror(errno));
        return 1;
    }
    size_t length = 0, capacity = 1 << 16;
    char *data = malloc(capacity);
    for (size_t n; data && (n = fread(data + length, 1, capacity - length, f)) > 0;) {
        length += n;
        if (length == capacity) {
            char *grown = realloc(data, capacity *= 2);
            if (!grown) free(data);
            data = grown;
        }
    }
    bool read_failed = ferror(f) != 0;
    if (f != stdin) fclose(f);
    if (!data || read_failed) {
        fprintf(stderr, "tide map: %s: %s\n", input, data ? "read error" : "out of memory");
        free(data);
        return 1;
    }
    char err[700];
    map_doc doc = {0};
    json j = {data, data, data + length, err, sizeof err, input};
    int status = 0;
    if (!parse_map(&j, &doc)) {
        fprintf(stderr, "tide map: %s\n", err);
        status = 1;
    } else {
        qsort(doc.ranges, doc.count, sizeof *doc.ranges, by_address);
        map_layout layout = {0};
        const char *base = strrchr(input, '/');
        base = base && base[1] ? base + 1 : input;
        if (!lay_out(&doc, row_bytes, &layout)) {
            fprintf(stderr, "tide map: out of memory\n");
            status = 1;
        } else if (render(plot, base, &doc, &layout, row_bytes, err, sizeof err) != 0) {
            fprintf(stderr, "tide map: %s\n", err);
            status = 1;
        } else {
            printf("wrote %s: %zu ranges in %zu rows\n", plot, doc.count, layout.row_count);
        }
        free(layout.rows);
        free(layout.pieces);
    }
    free(doc.ranges);
    free(data);
    return status;
}
