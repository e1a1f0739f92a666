/* SPDX-License-Identifier: MIT */
/*
 * stats_format.c -- the statistics of pools and graph caches as text: JSON
 * and the Prometheus text exposition format, both generated from the one
 * list of fields per object in tidepool.h (TP_POOL_STAT_BYTES_LIST,
 * TP_POOL_STAT_COUNT_LIST, TP_GRAPH_CACHE_STAT_LIST). It uses only the
 * public API, above the pool and the graph cache.
 */
#include "text_out.h"

#include <string.h>

tp_status tp_pool_stats_json(tp_pool *pool, char *buf, size_t capacity, size_t *out_length) {
    if (!pool || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    tp_pool_stats s;
    tp_status st = tp_pool_get_stats(pool, &s);
    if (st != TP_OK) return st;
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
    out_printf(&out, "{\"kind\":\"%s\"", s.kind == TP_POOL_VMM ? "vmm" : "segment");
#define JSON_BYTES_(name, kind, description)                                                                    \
    out_printf(&out, ",\"" #name "\":{\"current\":%llu,\"peak\":%llu,\"total\":%llu}",                          \
               (unsigned long long)s.name.current, (unsigned long long)s.name.peak, (unsigned long long)s.name.total);
#define JSON_COUNT_(name, kind, description) out_printf(&out, ",\"" #name "\":%llu", (unsigned long long)s.name);
    TP_POOL_STAT_BYTES_LIST(JSON_BYTES_)
    TP_POOL_STAT_COUNT_LIST(JSON_COUNT_)
#undef JSON_BYTES_
#undef JSON_COUNT_
    out_printf(&out, ",\"fragmentation\":%.6f}", s.fragmentation);
    return out_finish(&out, out_length);
}

tp_status tp_graph_cache_stats_json(tp_graph_cache *cache, char *buf, size_t capacity, size_t *out_length) {
    if (!cache || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    tp_graph_cache_stats s;
    tp_status st = tp_graph_cache_get_stats(cache, &s);
    if (st != TP_OK) return st;
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
    const char *sep = "{";
#define JSON_FIELD_(name, kind, description)                                       \
    out_printf(&out, "%s\"" #name "\":%llu", sep, (unsigned long long)s.name); \
    sep = ",";
    TP_GRAPH_CACHE_STAT_LIST(JSON_FIELD_)
#undef JSON_FIELD_
    out_printf(&out, "}");
    return out_finish(&out, out_length);
}

/* ------------------------------------------------------------- metrics */

/* One metric: HELP, TYPE and a sample with the labels (ours, then the
 * caller's, already checked by labels_valid). */
static void metric(text_out *out, const char *prefix, const char *name, const char *suffix, const char *type,
                   const char *help, const char *labels, const char *extra, uint64_t value) {
    out_printf(out, "# HELP %s_%s%s %s\n# TYPE %s_%s%s %s\n%s_%s%s{%s%s%s} %llu\n", prefix, name, suffix, help, prefix,
               name, suffix, type, prefix, name, suffix, labels, *extra ? "," : "", extra, (unsigned long long)value);
}

/* device="sim:0",kind="vmm" (kind NULL: no kind). Always fits: the backend
 * names are short and ours. */
static void base_labels(char *out, size_t capacity, const tp_device_info *info, const char *kind) {
    snprintf(out, capacity, "device=\"%s:%d\"%s%s%s", info->backend, info->ordinal, kind ? ",kind=\"" : "",
             kind ? kind : "", kind ? "\"" : "");
}

/* Most label pairs a caller may add. */
#define MAX_EXTRA_LABELS 64

static bool label_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool label_name_char(char c) { return label_name_start(c) || (c >= '0' && c <= '9'); }

/* Is labels (NULL or "": none) a list of at most MAX_EXTRA_LABELS pairs
 * name="value", separated by commas, that the exposition format reads as
 * written: names [a-zA-Z_][a-zA-Z0-9_]*, not reserved (a leading "__"),
 * none twice nor one of ours (device, and kind when has_kind); values
 * without a raw newline or quote, a backslash only as \\, \" or \n?
 * Anything else would be written into every sample as it is: a broken
 * scrape, or samples a caller's string made up. */
static bool labels_valid(const char *labels, bool has_kind) {
    if (!labels || !*labels) return true;
    struct {
        const char *at;
        size_t length;
    } names[MAX_EXTRA_LABELS + 2] = {{"device", 6}, {"kind", 4}};
    size_t count = has_kind ? 2 : 1;
    const char *p = labels;
    for (;;) {
        const char *name = p;
        if (!label_name_start(*p)) return false;
        while (label_name_char(*p)) p++;
        size_t length = (size_t)(p - name);
        if (length >= 2 && name[0] == '_' && name[1] == '_') return false;
        for (size_t i = 0; i < count; i++)
            if (names[i].length == length && !memcmp(names[i].at, name, length)) return false;
        if (count == (has_kind ? 2 : 1) + MAX_EXTRA_LABELS) return false;
        names[count].at = name;
        names[count].length = length;
        count++;
        if (*p++ != '=' || *p++ != '"') return false;
        for (; *p != '"'; p++) {
            if (*p == '\0' || *p == '\n') return false;
            if (*p == '\\') {
                p++;
                if (*p != '\\' && *p != '"' && *p != 'n') return false;
            }
        }
        p++; /* the closing quote */
        if (*p == '\0') return true;
        if (*p++ != ',') return false;
    }
}

tp_status tp_pool_stats_openmetrics(tp_pool *pool, const char *labels, char *buf, size_t capacity, size_t *out_length) {
    if (!pool || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    tp_pool_stats s;
    tp_device_info info;
    tp_status st = tp_pool_get_stats(pool, &s);
    tp_device *device = NULL;
    if (st == TP_OK) st = tp_pool_get_device(pool, &device);
    if (st == TP_OK) st = tp_device_get_info(device, &info);
    if (st != TP_OK) return st;
    if (!labels_valid(labels, true)) return TP_ERR_INVALID_ARGUMENT;
    const char *extra = labels ? labels : "";
    char all[64];
    base_labels(all, sizeof all, &info, s.kind == TP_POOL_VMM ? "vmm" : "segment");
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
#define METRIC_BYTES_(name, kind, description)                                                                     \
    metric(&out, "tidepool_pool", #name, "", "gauge", description, all, extra, s.name.current);                           \
    metric(&out, "tidepool_pool", #name, "_peak", "gauge", description " (peak since creation or reset)", all,    \
           extra, s.name.peak);                                                                                          \
    metric(&out, "tidepool_pool", #name, "_total", "counter", description " (cumulative)", all, extra, s.name.total);
#define METRIC_COUNT_(name, kind, description) \
    metric(&out, "tidepool_pool", #name, #kind[0] == 'c' ? "_total" : "", #kind, description, all, extra, s.name);
    TP_POOL_STAT_BYTES_LIST(METRIC_BYTES_)
    TP_POOL_STAT_COUNT_LIST(METRIC_COUNT_)
#undef METRIC_BYTES_
#undef METRIC_COUNT_
    out_printf(&out, "# HELP tidepool_pool_fragmentation 1 - largest free range / free bytes\n"
                     "# TYPE tidepool_pool_fragmentation gauge\ntidepool_pool_fragmentation{%s%s%s} %.6f\n",
               all, *extra ? "," : "", extra, s.fragmentation);
    return out_finish(&out, out_length);
}

tp_status tp_graph_cache_stats_openmetrics(tp_graph_cache *cache, const char *labels, char *buf, size_t capacity,
                                           size_t *out_length) {
    if (!cache || (!buf && capacity)) return TP_ERR_INVALID_ARGUMENT;
    tp_graph_cache_stats s;
    tp_device_info info;
    tp_status st = tp_graph_cache_get_stats(cache, &s);
    tp_device *device = NULL;
    if (st == TP_OK) st = tp_graph_cache_get_device(cache, &device);
    if (st == TP_OK) st = tp_device_get_info(device, &info);
    if (st != TP_OK) return st;
    if (!labels_valid(labels, false)) return TP_ERR_INVALID_ARGUMENT;
    const char *extra = labels ? labels : "";
    char all[64];
    base_labels(all, sizeof all, &info, NULL);
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
#define METRIC_FIELD_(name, kind, description) \
    metric(&out, "tidepool_graph_cache", #name, #kind[0] == 'c' ? "_total" : "", #kind, description, all, extra, s.name);
    TP_GRAPH_CACHE_STAT_LIST(METRIC_FIELD_)
#undef METRIC_FIELD_
    return out_finish(&out, out_length);
}
