/* SPDX-License-Identifier: MIT */
/*
 * stats_format.c -- the statistics of pools and graph caches as text: JSON
 * and the Prometheus text exposition format, both generated from the one
 * list of fields per object in tidepool.h (TP_POOL_STAT_BYTES_LIST,
 * TP_POOL_STAT_COUNT_LIST, TP_GRAPH_CACHE_STAT_LIST). It uses only the
 * public API, above the pool and the graph cache.
 */
#include "text_out.h"

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

/* One metric: HELP, TYPE and a sample with the labels. */
static void metric(text_out *out, const char *prefix, const char *name, const char *suffix, const char *type,
                   const char *help, const char *labels, uint64_t value) {
    out_printf(out, "# HELP %s_%s%s %s\n# TYPE %s_%s%s %s\n%s_%s%s{%s} %llu\n", prefix, name, suffix, help, prefix,
               name, suffix, type, prefix, name, suffix, labels, (unsigned long long)value);
}

/* device="sim:0",kind="vmm" plus the caller's; false if they do not fit. */
static bool base_labels(char *out, size_t capacity, tp_device_info *info, const char *kind, const char *extra) {
    int n = snprintf(out, capacity, "device=\"%s:%d\"%s%s%s%s%s", info->backend, info->ordinal, kind ? ",kind=\"" : "",
                     kind ? kind : "", kind ? "\"" : "", extra && *extra ? "," : "", extra && *extra ? extra : "");
    return n >= 0 && (size_t)n < capacity;
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
    char all[512];
    if (!base_labels(all, sizeof all, &info, s.kind == TP_POOL_VMM ? "vmm" : "segment", labels))
        return TP_ERR_INVALID_ARGUMENT;
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
#define METRIC_BYTES_(name, kind, description)                                                                     \
    metric(&out, "tidepool_pool", #name, "", "gauge", description, all, s.name.current);                           \
    metric(&out, "tidepool_pool", #name, "_peak", "gauge", description " (peak since creation or reset)", all,    \
           s.name.peak);                                                                                          \
    metric(&out, "tidepool_pool", #name, "_total", "counter", description " (cumulative)", all, s.name.total);
#define METRIC_COUNT_(name, kind, description) \
    metric(&out, "tidepool_pool", #name, #kind[0] == 'c' ? "_total" : "", #kind, description, all, s.name);
    TP_POOL_STAT_BYTES_LIST(METRIC_BYTES_)
    TP_POOL_STAT_COUNT_LIST(METRIC_COUNT_)
#undef METRIC_BYTES_
#undef METRIC_COUNT_
    out_printf(&out, "# HELP tidepool_pool_fragmentation 1 - largest free range / free bytes\n"
                     "# TYPE tidepool_pool_fragmentation gauge\ntidepool_pool_fragmentation{%s} %.6f\n",
               all, s.fragmentation);
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
    char all[512];
    if (!base_labels(all, sizeof all, &info, NULL, labels)) return TP_ERR_INVALID_ARGUMENT;
    if (capacity) buf[0] = '\0';
    text_out out = {buf, capacity, 0, false};
#define METRIC_FIELD_(name, kind, description) \
    metric(&out, "tidepool_graph_cache", #name, #kind[0] == 'c' ? "_total" : "", #kind, description, all, s.name);
    TP_GRAPH_CACHE_STAT_LIST(METRIC_FIELD_)
#undef METRIC_FIELD_
    return out_finish(&out, out_length);
}
