/*
 * graph_cache.c -- placeholder until the graph cache lands: every call
 * reports TP_ERR_UNSUPPORTED.
 */
#include "internal.h"

tp_status tp_graph_cache_create(tp_device *device, const tp_graph_cache_config *config, tp_graph_cache **out_cache) {
    (void)device; (void)config;
    if (out_cache) *out_cache = NULL;
    return TP_ERR_UNSUPPORTED;
}
tp_status tp_graph_cache_destroy(tp_graph_cache *cache) { (void)cache; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_attach_pool(tp_graph_cache *cache, tp_pool *pool) { (void)cache; (void)pool; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_detach_pool(tp_graph_cache *cache, tp_pool *pool) { (void)cache; (void)pool; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_prepare(tp_graph_cache *cache, uint64_t key, tp_graph graph, const tp_graph_pins *pins) {
    (void)cache; (void)key; (void)graph; (void)pins;
    return TP_ERR_UNSUPPORTED;
}
tp_status tp_graph_cache_launch(tp_graph_cache *cache, uint64_t key, tp_stream stream) { (void)cache; (void)key; (void)stream; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_run(tp_graph_cache *cache, uint64_t key, tp_graph graph, const tp_graph_pins *pins, tp_stream stream) {
    (void)cache; (void)key; (void)graph; (void)pins; (void)stream;
    return TP_ERR_UNSUPPORTED;
}
tp_status tp_graph_cache_evict(tp_graph_cache *cache, uint64_t key) { (void)cache; (void)key; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_tick(tp_graph_cache *cache) { (void)cache; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_get_stats(tp_graph_cache *cache, tp_graph_cache_stats *out_stats) { (void)cache; (void)out_stats; return TP_ERR_UNSUPPORTED; }
tp_status tp_graph_cache_stats_json(tp_graph_cache *cache, char *buf, size_t capacity, size_t *out_length) {
    (void)cache; (void)buf; (void)capacity; (void)out_length;
    return TP_ERR_UNSUPPORTED;
}
