/* SPDX-License-Identifier: MIT */
/*
 * tide_observe.c -- --metrics, --snapshot and --series (see tide_observe.h).
 */
#include "tide_observe.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ strings */

typedef struct text {
    char *data;
    size_t length, capacity;
    bool failed; /* host memory ran out */
} text;

static void text_append(text *t, const char *s, size_t n) {
    if (t->failed) return;
    if (t->length + n + 1 > t->capacity) {
        size_t cap = t->capacity ? t->capacity : 1024;
        while (cap < t->length + n + 1) cap *= 2;
        char *grown = realloc(t->data, cap);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->data = grown;
        t->capacity = cap;
    }
    memcpy(t->data + t->length, s, n);
    t->length += n;
    t->data[t->length] = '\0';
}

static void text_printf(text *t, const char *format, ...) {
    char buf[1024];
    va_list args;
    va_start(args, format);
    int n = vsnprintf(buf, sizeof buf, format, args);
    va_end(args);
    if (n < 0) return;
    if ((size_t)n < sizeof buf) {
        text_append(t, buf, (size_t)n);
        return;
    }
    char *big = malloc((size_t)n + 1);
    if (!big) {
        t->failed = true;
        return;
    }
    va_start(args, format);
    vsnprintf(big, (size_t)n + 1, format, args);
    va_end(args);
    text_append(t, big, (size_t)n);
    free(big);
}

size_t tide_label_escape(const char *s, char *buf, size_t capacity) {
    size_t used = 0;
    for (; *s; s++) {
        const char *piece = NULL;
        char one[2] = {*s, '\0'};
        if (*s == '\\') piece = "\\\\";
        else if (*s == '"') piece = "\\\"";
        else if (*s == '\n') piece = "\\n";
        else piece = one;
        size_t n = strlen(piece);
        if (used + n + 1 > capacity) break;
        memcpy(buf + used, piece, n);
        used += n;
    }
    if (capacity) buf[used < capacity ? used : capacity - 1] = '\0';
    return used;
}

static bool ends_with(const char *s, size_t length, const char *suffix) {
    size_t n = strlen(suffix);
    return length > n && !strcmp(s + length - n, suffix);
}

void tide_trace_label(const char *path, char *buf, size_t capacity) {
    const char *slash = strrchr(path, '/');
    snprintf(buf, capacity, "%s", slash ? slash + 1 : path);
    size_t n = strlen(buf);
    if (ends_with(buf, n, ".gz")) buf[n -= 3] = '\0';
    static const char *const extensions[] = {".csv", ".pickle", ".pkl"};
    for (size_t i = 0; i < sizeof extensions / sizeof *extensions; i++)
        if (ends_with(buf, n, extensions[i])) {
            buf[n - strlen(extensions[i])] = '\0';
            break;
        }
}

/* ------------------------------------------------------------- files */

int tide_write_file(const char *path, const char *data, size_t length, char *err, size_t cap) {
    struct stat st;
    char temp[4096] = "";
    int fd;
    if (lstat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
        fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC); /* a link, FIFO or device: written through */
    } else {
        if ((size_t)snprintf(temp, sizeof temp, "%s.tmp.%ld", path, (long)getpid()) >= sizeof temp) {
            snprintf(err, cap, "%s: path too long", path);
            return -1;
        }
        fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    }
    if (fd < 0) {
        snprintf(err, cap, "%s: cannot create: %s", path, strerror(errno));
        return -1;
    }
    size_t done = 0;
    while (done < length) {
        ssize_t n = write(fd, data + done, length - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (size_t)n;
    }
    int saved = errno;
    if (close(fd) != 0 && done == length) {
        done = 0;
        saved = errno;
    }
    if (done != length) {
        snprintf(err, cap, "%s: write failed: %s", path, strerror(saved));
        if (temp[0]) unlink(temp);
        return -1;
    }
    if (temp[0] && rename(temp, path) != 0) {
        snprintf(err, cap, "%s: cannot rename %s into place: %s", path, temp, strerror(errno));
        unlink(temp);
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------- metrics */

typedef struct family {
    char name[128];
    text head;    /* its HELP and TYPE lines */
    text samples;
} family;

struct tide_metrics {
    family *families;
    size_t count, capacity;
    bool failed;
    char **labels; /* the run labels used so far */
    size_t label_count;
};

tide_metrics *tide_metrics_create(void) { return calloc(1, sizeof(tide_metrics)); }

void tide_metrics_destroy(tide_metrics *m) {
    if (!m) return;
    for (size_t i = 0; i < m->count; i++) {
        free(m->families[i].head.data);
        free(m->families[i].samples.data);
    }
    free(m->families);
    for (size_t i = 0; i < m->label_count; i++) free(m->labels[i]);
    free(m->labels);
    free(m);
}

static family *family_named(tide_metrics *m, const char *name, size_t name_length) {
    if (name_length >= sizeof m->families->name) name_length = sizeof m->families->name - 1;
    for (size_t i = 0; i < m->count; i++)
        if (strlen(m->families[i].name) == name_length && !memcmp(m->families[i].name, name, name_length))
            return &m->families[i];
    if (m->count == m->capacity) {
        size_t cap = m->capacity ? m->capacity * 2 : 64;
        family *grown = realloc(m->families, cap * sizeof *grown);
        if (!grown) return NULL;
        m->families = grown;
        m->capacity = cap;
    }
    family *f = &m->families[m->count++];
    memset(f, 0, sizeof *f);
    memcpy(f->name, name, name_length);
    f->name[name_length] = '\0';
    return f;
}

/* Files the lines of exposition text under their families. */
static void metrics_merge(tide_metrics *m, const char *body) {
    family *current = NULL;
    bool new_family = false;
    for (const char *line = body; *line;) {
        const char *end = strchr(line, '\n');
        size_t length = end ? (size_t)(end - line) : strlen(line);
        if (!strncmp(line, "# HELP ", 7) || !strncmp(line, "# TYPE ", 7)) {
            const char *name = line + 7;
            size_t name_length = strcspn(name, " \n");
            if (!current || strlen(current->name) != name_length || memcmp(current->name, name, name_length)) {
                current = family_named(m, name, name_length);
                if (!current) {
                    m->failed = true;
                    return;
                }
                new_family = current->head.length == 0;
            }
            if (new_family) {
                text_append(&current->head, line, length);
                text_append(&current->head, "\n", 1);
            }
        } else if (length && line[0] != '#' && current) {
            text_append(&current->samples, line, length);
            text_append(&current->samples, "\n", 1);
        }
        line += length + (end ? 1 : 0);
    }
}

static void family_text(text *t, const char *name, const char *type, const char *help) {
    text_printf(t, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static bool label_used(const tide_metrics *m, const char *label) {
    for (size_t i = 0; i < m->label_count; i++)
        if (!strcmp(m->labels[i], label)) return true;
    return false;
}

bool tide_metrics_add_run(tide_metrics *m, const char *label_key, const char *label, const char *long_label,
                          replay_run *run, const replay_result *results, size_t count, char *err, size_t cap) {
    /* two runs of one name (a.csv and a.csv.gz): the longer name, then a number */
    char unique[520];
    snprintf(unique, sizeof unique, "%s", label);
    if (label_used(m, unique) && long_label) snprintf(unique, sizeof unique, "%s", long_label);
    for (unsigned n = 2; label_used(m, unique); n++) snprintf(unique, sizeof unique, "%.500s.%u", label, n);
    char **grown = realloc(m->labels, (m->label_count + 1) * sizeof *grown);
    if (grown) m->labels = grown;
    if (!grown || !(m->labels[m->label_count] = strdup(unique))) {
        snprintf(err, cap, "out of memory writing the metrics");
        return false;
    }
    m->label_count++;
    char escaped[1100];
    tide_label_escape(unique, escaped, sizeof escaped);
    for (size_t i = 0; i < count; i++) {
        const replay_result *r = &results[i];
        /* a pool named twice (the command line refuses --pool vmm,vmm; a caller of
         * replay_begin may not): pool="vmm", then "vmm.2" */
        char pool[48];
        unsigned seen = 1;
        for (size_t k = 0; k < i; k++) seen += !strcmp(results[k].pool, r->pool);
        if (seen > 1) snprintf(pool, sizeof pool, "%s.%u", r->pool, seen);
        else snprintf(pool, sizeof pool, "%s", r->pool);
        char labels[1300];
        snprintf(labels, sizeof labels, "%s=\"%s\",pool=\"%s\"", label_key, escaped, pool);

        text t = {0};
        tp_pool *tidepool = replay_tidepool_of(run, i);
        if (tidepool) {
            size_t length = 0;
            tp_pool_stats_openmetrics(tidepool, labels, NULL, 0, &length);
            char *buf = malloc(length + 1);
            if (!buf || tp_pool_stats_openmetrics(tidepool, labels, buf, length + 1, NULL) != TP_OK) {
                free(buf);
                snprintf(err, cap, "out of memory writing the metrics");
                return false;
            }
            text_append(&t, buf, length);
            free(buf);
        } else {
            /* a baseline: its own figures, named like the pool's */
            static const struct {
                const char *suffix, *type, *help;
            } names[] = {
                {"reserved_bytes", "gauge", "device memory the baseline model holds at the end of the replay"},
                {"reserved_bytes_peak", "gauge", "most device memory the baseline model held"},
                {"device_calls_total", "counter", "device calls the baseline model made"},
                {"device_allocs_total", "counter", "device allocations the baseline model made"},
                {"ooms_total", "counter", "allocations the baseline model failed for lack of memory"},
            };
            const uint64_t values[] = {r->end_reserved_bytes, r->peak_reserved_bytes, r->device_calls,
                                       r->device_allocs, r->ooms};
            for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
                char name[96];
                snprintf(name, sizeof name, "tidepool_baseline_%s", names[k].suffix);
                family_text(&t, name, names[k].type, names[k].help);
                text_printf(&t, "%s{%s} %llu\n", name, labels, (unsigned long long)values[k]);
            }
        }
        /* the replay's figures, for every pool */
        family_text(&t, "tidepool_replay_peak_live_bytes", "gauge",
                    "most bytes the trace held live at once (requested sizes; the floor for any pool)");
        text_printf(&t, "tidepool_replay_peak_live_bytes{%s} %llu\n", labels, (unsigned long long)r->peak_live_bytes);
        family_text(&t, "tidepool_replay_peak_held_bytes", "gauge", "most device memory the pool held during the replay");
        text_printf(&t, "tidepool_replay_peak_held_bytes{%s} %llu\n", labels,
                    (unsigned long long)r->peak_reserved_bytes);
        family_text(&t, "tidepool_replay_held_to_live_ratio", "gauge", "peak held bytes over peak live bytes");
        text_printf(&t, "tidepool_replay_held_to_live_ratio{%s} %.6f\n", labels, replay_ratio(r));
        family_text(&t, "tidepool_replay_events_total", "counter", "trace events replayed");
        text_printf(&t, "tidepool_replay_events_total{%s} %llu\n", labels, (unsigned long long)r->events);
        family_text(&t, "tidepool_replay_ooms_total", "counter", "allocations of the trace that failed for lack of memory");
        text_printf(&t, "tidepool_replay_ooms_total{%s} %llu\n", labels, (unsigned long long)r->ooms);
        family_text(&t, "tidepool_replay_unknown_frees_total", "counter",
                    "frees of addresses the trace never allocated");
        text_printf(&t, "tidepool_replay_unknown_frees_total{%s} %llu\n", labels, (unsigned long long)r->unknown_frees);
        if (t.failed) {
            free(t.data);
            snprintf(err, cap, "out of memory writing the metrics");
            return false;
        }
        metrics_merge(m, t.data ? t.data : "");
        free(t.data);
        if (m->failed) {
            snprintf(err, cap, "out of memory writing the metrics");
            return false;
        }
    }
    return true;
}

int tide_metrics_write(const tide_metrics *m, const char *path, char *err, size_t cap) {
    text all = {0};
    for (size_t i = 0; i < m->count; i++) {
        const family *f = &m->families[i];
        if (f->head.data) text_append(&all, f->head.data, f->head.length);
        if (f->samples.data) text_append(&all, f->samples.data, f->samples.length);
    }
    if (all.failed || m->failed) {
        free(all.data);
        snprintf(err, cap, "%s: out of memory", path);
        return -1;
    }
    int rc = tide_write_file(path, all.data ? all.data : "", all.length, err, cap);
    free(all.data);
    return rc;
}

/* --------------------------------------------------------- snapshots */

int tide_write_snapshots(const char *prefix, replay_run *run, const replay_result *results, size_t count, FILE *out,
                         char *err, size_t cap) {
    for (size_t i = 0; i < count; i++) {
        tp_pool *pool = replay_tidepool_of(run, i);
        if (!pool) continue; /* a baseline has no memory map */
        char path[4096];
        const char *peak = replay_peak_snapshot(run, i);
        if (peak) {
            snprintf(path, sizeof path, "%s.%s.json", prefix, results[i].pool);
            if (tide_write_file(path, peak, strlen(peak), err, cap) != 0) return -1;
            if (out) fprintf(out, "wrote %s (memory map at the peak of held memory)\n", path);
        }
        size_t length = 0;
        tp_pool_snapshot_json(pool, NULL, 0, &length);
        char *now = malloc(length + 1);
        if (!now || tp_pool_snapshot_json(pool, now, length + 1, NULL) != TP_OK) {
            free(now);
            snprintf(err, cap, "out of memory taking the memory map");
            return -1;
        }
        snprintf(path, sizeof path, "%s.%s.end.json", prefix, results[i].pool);
        int rc = tide_write_file(path, now, length, err, cap);
        free(now);
        if (rc) return -1;
        if (out) fprintf(out, "wrote %s (memory map at the end)\n", path);
    }
    return 0;
}

/* ------------------------------------------------------------ series */

int tide_write_series(const char *path, const replay_result *results, size_t count, char *err, size_t cap) {
    text t = {0};
    text_printf(&t, "event,time_us");
    for (size_t i = 0; i < count; i++)
        text_printf(&t, ",%s_live_bytes,%s_held_bytes,%s_cached_bytes", results[i].pool, results[i].pool,
                    results[i].pool);
    text_append(&t, "\n", 1);
    /* Rows at every event any pool sampled; each pool's value is its
     * sample at or before the row (the lanes sample alike, so they agree). */
    size_t *next = calloc(count ? count : 1, sizeof *next);
    if (!next) {
        snprintf(err, cap, "out of memory");
        return -1;
    }
    for (;;) {
        uint64_t event = UINT64_MAX, time_ns = 0;
        for (size_t i = 0; i < count; i++)
            if (next[i] < results[i].sample_count && results[i].samples[next[i]].event < event) {
                event = results[i].samples[next[i]].event;
                time_ns = results[i].samples[next[i]].time_ns;
            }
        if (event == UINT64_MAX) break;
        text_printf(&t, "%llu,%llu", (unsigned long long)event, (unsigned long long)(time_ns / 1000));
        for (size_t i = 0; i < count; i++) {
            while (next[i] < results[i].sample_count && results[i].samples[next[i]].event <= event) next[i]++;
            if (!next[i]) {
                text_append(&t, ",,,", 3);
                continue;
            }
            const replay_sample *s = &results[i].samples[next[i] - 1];
            text_printf(&t, ",%llu,%llu,%llu", (unsigned long long)s->live_bytes, (unsigned long long)s->reserved_bytes,
                        (unsigned long long)s->cached_bytes);
        }
        text_append(&t, "\n", 1);
    }
    free(next);
    if (t.failed) {
        free(t.data);
        snprintf(err, cap, "%s: out of memory", path);
        return -1;
    }
    int rc = tide_write_file(path, t.data, t.length, err, cap);
    free(t.data);
    return rc;
}
