/* SPDX-License-Identifier: MIT */
/* Watching a live pool: the observer's events (a recording replays to the
 * same peak), the memory map (every byte the pool holds, once, in the
 * right state) and the Prometheus text (well-formed; one HELP and TYPE per
 * metric; counters end in _total; a caller's labels checked, long ones
 * taken).
 *   test_observe [DIR]   also writes DIR/pool.prom and DIR/cache.prom for
 *                        a real parser to read (tests/check_openmetrics.py) */
#include "fixture.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *out_dir;

typedef struct recording {
    uint64_t live, peak, device_live;
    int allocs, frees, device_allocs, device_frees, ooms;
    bool ordered; /* time never went backwards */
    uint64_t last_ns;
} recording;

static void record(void *user, const tp_pool_event *e) {
    recording *r = user;
    if (e->time_ns < r->last_ns) r->ordered = false;
    r->last_ns = e->time_ns;
    switch (e->kind) {
    case TP_POOL_EVENT_ALLOC:
        r->allocs++;
        r->live += e->bytes;
        if (r->live > r->peak) r->peak = r->live;
        break;
    case TP_POOL_EVENT_FREE:
        r->frees++;
        r->live -= e->bytes;
        break;
    case TP_POOL_EVENT_DEVICE_ALLOC:
        r->device_allocs++;
        r->device_live += e->bytes;
        break;
    case TP_POOL_EVENT_DEVICE_FREE:
        r->device_frees++;
        r->device_live -= e->bytes;
        break;
    case TP_POOL_EVENT_OOM:
        r->ooms++;
        break;
    default:
        break;
    }
}

static void observer_events_add_up_to_the_statistics(tp_pool_kind kind) {
    tp_pool_config pc = {.limit_bytes = 256 * TEST_MiB, .release_threshold_bytes = TEST_MiB, .idle_release_ns = 1000};
    fixture f;
    fixture_open(&f, "sim:1GiB", kind, &pc);
    recording r = {.ordered = true};
    CHECK_OK(tp_pool_set_observer(f.pool, record, &r));
    test_rng rng = {3};
    void *live[32] = {0};
    for (int op = 0; op < 4000; op++) {
        int k = (int)rng_below(&rng, 32);
        if (live[k]) {
            CHECK_OK(tp_pool_free(f.pool, live[k], TP_STREAM_DEFAULT));
            live[k] = NULL;
        } else {
            tp_status st = tp_pool_alloc(f.pool, rng_log_uniform(&rng, 100, 64 * TEST_MiB), TP_STREAM_DEFAULT, &live[k]);
            CHECK(st == TP_OK || st == TP_ERR_OUT_OF_MEMORY);
        }
        if (op % 100 == 0) CHECK_OK(tp_sim_advance(f.dev, 5000));
        if (op % 500 == 0) CHECK_OK(tp_pool_tick(f.pool));
    }
    tp_pool_stats s;
    CHECK_OK(tp_pool_get_stats(f.pool, &s));
    CHECK_EQ_U64(r.peak, s.requested_bytes.peak);
    CHECK_EQ_U64(r.live, s.requested_bytes.current);
    CHECK_EQ_U64((uint64_t)r.allocs, s.allocs);
    CHECK_EQ_U64((uint64_t)r.frees, s.frees);
    CHECK_EQ_U64((uint64_t)r.ooms, s.ooms);
    CHECK_GT_U64((uint64_t)r.ooms, 0);
    CHECK_EQ_U64(r.device_live, s.reserved_bytes.current);
    CHECK_EQ_U64((uint64_t)r.device_allocs, s.device_allocs);
    CHECK_EQ_U64((uint64_t)r.device_frees, s.device_frees);
    CHECK(r.ordered);
    for (int k = 0; k < 32; k++)
        if (live[k]) CHECK_OK(tp_pool_free(f.pool, live[k], TP_STREAM_DEFAULT));
    CHECK_OK(tp_pool_set_observer(f.pool, NULL, NULL));
    int before = r.frees;
    void *p;
    CHECK_OK(tp_pool_alloc(f.pool, 4096, TP_STREAM_DEFAULT, &p));
    CHECK_OK(tp_pool_free(f.pool, p, TP_STREAM_DEFAULT));
    CHECK_EQ_U64((uint64_t)r.frees, (uint64_t)before); /* removed: no more events */
    CHECK_EQ_STR(tp_pool_event_name(TP_POOL_EVENT_DEVICE_FREE), "device_free");
    CHECK(tp_pool_event_name((tp_pool_event_kind)99) == NULL);
    fixture_close(&f);
}
KIND_TEST(observer_events_add_up_to_the_statistics)

/* The n-th "key":value of a JSON text from p on; value as a number. */
static const char *json_number(const char *p, const char *key, uint64_t *out) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":", key);
    p = strstr(p, pattern);
    if (!p) return NULL;
    p += strlen(pattern);
    if (*p == '"') p++;
    *out = strtoull(p, NULL, 0);
    return p;
}

static const char *json_string(const char *p, const char *key, char *out, size_t capacity) {
    char pattern[64];
    snprintf(pattern, sizeof pattern, "\"%s\":\"", key);
    p = strstr(p, pattern);
    if (!p) return NULL;
    p += strlen(pattern);
    size_t n = 0;
    while (*p && *p != '"' && n + 1 < capacity) out[n++] = *p++;
    out[n] = '\0';
    return p;
}

static void memory_map_covers_every_byte_once(tp_pool_kind kind) {
    tp_pool_config pc = {.limit_bytes = 64 * TEST_MiB, .va_reserve_bytes = 128 * TEST_MiB};
    fixture f;
    fixture_open(&f, "sim:1GiB", kind, &pc);
    void *live, *pinned, *parked, *zombie, *gone;
    REQUIRE_OK(tp_pool_alloc(f.pool, 3 * TEST_MiB, TP_STREAM_DEFAULT, &live));
    REQUIRE_OK(tp_pool_alloc(f.pool, 5000, TP_STREAM_DEFAULT, &pinned));
    REQUIRE_OK(tp_pool_alloc(f.pool, 4096, TP_STREAM_DEFAULT, &parked));
    REQUIRE_OK(tp_pool_alloc(f.pool, 8192, TP_STREAM_DEFAULT, &zombie));
    REQUIRE_OK(tp_pool_alloc(f.pool, 6 * TEST_MiB, TP_STREAM_DEFAULT, &gone));
    CHECK_OK(tp_pool_pin(f.pool, pinned, 5000));
    CHECK_OK(tp_pool_pin(f.pool, zombie, 8192));
    CHECK_OK(tp_pool_free(f.pool, parked, TP_STREAM_DEFAULT)); /* small: parked */
    CHECK_OK(tp_pool_free(f.pool, zombie, TP_STREAM_DEFAULT)); /* pinned: kept */
    CHECK_OK(tp_pool_free(f.pool, gone, TP_STREAM_DEFAULT)); /* large: the last-freed slot, parked too */
    CHECK_OK(tp_sim_advance(f.dev, 1000000));
    size_t length = 0;
    CHECK_STATUS(tp_pool_snapshot_json(f.pool, NULL, 0, &length), TP_ERR_BUFFER_TOO_SMALL);
    char *json = malloc(length + 1);
    REQUIRE(json != NULL);
    CHECK_OK(tp_pool_snapshot_json(f.pool, json, length + 1, NULL));
    CHECK_EQ_U64(strlen(json), length);
    uint64_t reserved = 0, total = 0, by_state[6] = {0}, prev_end = 0, requested_live = 0;
    static const char *const states[6] = {"live", "pinned", "parked", "freed_pinned", "cached", "unmapped"};
    json_number(json, "reserved_bytes", &reserved);
    int ranges = 0;
    bool sorted = true, known = true;
    for (const char *p = strstr(json, "\"ranges\":["); p && (p = strstr(p, "{\"address\""));) {
        uint64_t address = 0, bytes = 0, requested = 0;
        char state[32] = "";
        json_number(p, "address", &address);
        json_number(p, "bytes", &bytes);
        json_string(p, "state", state, sizeof state);
        json_number(p, "requested", &requested);
        if (address < prev_end) sorted = false;
        prev_end = address + bytes;
        int which = -1;
        for (int i = 0; i < 6; i++)
            if (!strcmp(state, states[i])) which = i;
        if (which < 0) known = false; else by_state[which] += bytes;
        if (which == 0 || which == 1) requested_live += requested;
        total += bytes;
        ranges++;
        p++;
    }
    free(json);
    CHECK(sorted);
    CHECK(known);
    CHECK_GT_U64((uint64_t)ranges, 4);
    CHECK_EQ_U64(by_state[0], 3 * TEST_MiB);
    CHECK_EQ_U64(by_state[1], 5120);
    CHECK_EQ_U64(by_state[2], 4096 + 6 * TEST_MiB);
    CHECK_EQ_U64(by_state[3], 8192);
    CHECK_EQ_U64(requested_live, 3 * TEST_MiB + 5000);
    if (kind == TP_POOL_VMM) {
        CHECK_EQ_U64(total, 128 * TEST_MiB); /* the whole reservation */
        CHECK_EQ_U64(total - by_state[5], reserved);
    } else {
        CHECK_EQ_U64(total, reserved);
        CHECK_EQ_U64(by_state[5], 0);
    }
    CHECK_OK(tp_pool_unpin(f.pool, pinned, 5000));
    CHECK_OK(tp_pool_unpin(f.pool, zombie, 8192));
    CHECK_OK(tp_pool_free(f.pool, live, TP_STREAM_DEFAULT));
    CHECK_OK(tp_pool_free(f.pool, pinned, TP_STREAM_DEFAULT));
    fixture_close(&f);
}
KIND_TEST(memory_map_covers_every_byte_once)

/* Every sample's metric was announced by one HELP and one TYPE line just
 * before; names are tidepool_*; counters end in _total; labels parse;
 * values are numbers. Returns the number of samples. */
static int check_prometheus_text(const char *text, const char *must_label) {
    int samples = 0;
    char help[128] = "", type[128] = "";
    for (const char *line = text; *line;) {
        const char *end = strchr(line, '\n');
        CHECK(end != NULL); /* every line ends with a newline */
        if (!end) break;
        size_t n = (size_t)(end - line);
        static char buf[1 << 14]; /* lines with long caller labels */
        if (n >= sizeof buf) n = sizeof buf - 1;
        memcpy(buf, line, n);
        buf[n] = '\0';
        if (!strncmp(buf, "# HELP ", 7)) {
            sscanf(buf + 7, "%127s", help);
        } else if (!strncmp(buf, "# TYPE ", 7)) {
            char kind[32] = "";
            sscanf(buf + 7, "%127s %31s", type, kind);
            CHECK_EQ_STR(type, help);
            CHECK(!strcmp(kind, "gauge") || !strcmp(kind, "counter"));
            if (!strcmp(kind, "counter")) CHECK(strlen(type) > 6 && !strcmp(type + strlen(type) - 6, "_total"));
        } else {
            char name[128] = "";
            const char *brace = strchr(buf, '{'), *close = strrchr(buf, '}');
            CHECK(brace && close && close > brace);
            if (!brace || !close) break;
            memcpy(name, buf, (size_t)(brace - buf));
            name[brace - buf] = '\0';
            CHECK_EQ_STR(name, type);
            CHECK(!strncmp(name, "tidepool_", 9));
            CHECK_CONTAINS(buf, must_label);
            for (const char *c = close + 2; *c; c++) CHECK(isdigit((unsigned char)*c) || *c == '.');
            CHECK_EQ_U64(close[1], ' ');
            samples++;
        }
        line = end + 1;
    }
    return samples;
}

static void write_file(const char *name, const char *text) {
    if (!out_dir) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    FILE *f = fopen(path, "w");
    REQUIRE(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void test_prometheus_text_is_well_formed(void) {
    fixture f;
    fixture_open(&f, "sim:1GiB", TP_POOL_VMM, NULL);
    void *p;
    REQUIRE_OK(tp_pool_alloc(f.pool, 3 * TEST_MiB, TP_STREAM_DEFAULT, &p));
    static char text[1 << 16];
    size_t length = 0;
    /* a caller's labels, escapes included (check_openmetrics.py parses the
     * file written below with prometheus_client) */
    const char *labels = "pool=\"kv\",note=\"a \\\"quoted\\\" back\\\\slash\\nline\"";
    CHECK_STATUS(tp_pool_stats_openmetrics(f.pool, labels, text, 64, &length), TP_ERR_BUFFER_TOO_SMALL);
    CHECK_OK(tp_pool_stats_openmetrics(f.pool, labels, text, sizeof text, NULL));
    CHECK_EQ_U64(strlen(text), length);
    CHECK_CONTAINS(text, "tidepool_pool_allocated_bytes{device=\"sim:0\",kind=\"vmm\",pool=\"kv\",note=\"a "
                         "\\\"quoted\\\" back\\\\slash\\nline\"} 3145728\n");
    CHECK_CONTAINS(text, "tidepool_pool_allocs_total{device=\"sim:0\",kind=\"vmm\",pool=\"kv\",note=\"a \\\"quoted\\\" "
                         "back\\\\slash\\nline\"} 1\n");
    CHECK_EQ_U64(check_prometheus_text(text, "device=\"sim:0\""), 5 * 3 + 18 + 1);
    write_file("pool.prom", text);
    tp_graph_cache *cache;
    REQUIRE_OK(tp_graph_cache_create(f.dev, NULL, &cache));
    CHECK_OK(tp_graph_cache_stats_openmetrics(cache, NULL, text, sizeof text, NULL));
    CHECK_CONTAINS(text, "tidepool_graph_cache_max_execs{device=\"sim:0\"} 64\n");
    CHECK_EQ_U64(check_prometheus_text(text, "device=\"sim:0\""), 18);
    write_file("cache.prom", text);
    char json[2048];
    CHECK_OK(tp_graph_cache_stats_json(cache, json, sizeof json, NULL));
    CHECK_CONTAINS(json, "{\"execs\":0,");
    CHECK_CONTAINS(json, "\"pinned_ranges\":0}");
    CHECK_OK(tp_graph_cache_destroy(cache));
    CHECK_OK(tp_pool_free(f.pool, p, TP_STREAM_DEFAULT));
    fixture_close(&f);
}

/* The caller's labels go into every sample as written, so they must be
 * label pairs the format reads as such: anything else is refused with
 * TP_ERR_INVALID_ARGUMENT (a newline would let a caller's string add
 * samples; a quote left open breaks the scrape). Long label values are
 * fine: they used to be refused past about 480 characters. */
static void test_prometheus_labels_are_checked(void) {
    fixture f;
    fixture_open(&f, "sim:1GiB", TP_POOL_SEGMENT, NULL);
    tp_graph_cache *cache;
    REQUIRE_OK(tp_graph_cache_create(f.dev, NULL, &cache));
    static char text[1 << 18];
    static const char *const bad[] = {
        "pool",          "pool=kv",        "pool=\"kv",          "pool=\"kv\"x",  "=\"kv\"",
        "1pool=\"kv\"",  "po-ol=\"kv\"",   "pool=\"kv\",",        ",pool=\"kv\"", "pool=\"a\nb\"",
        "pool=\"kv\"}\nevil_metric{a=\"1\"", "pool=\"a\\q\"", "pool=\"a\\\"", "__name__=\"x\"",
        "device=\"cuda:7\"", "a=\"1\",a=\"2\"", "pool = \"kv\""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        size_t length = 12345;
        CHECK_MSG(tp_pool_stats_openmetrics(f.pool, bad[i], text, sizeof text, &length) == TP_ERR_INVALID_ARGUMENT,
                  "pool labels '%s' were taken", bad[i]);
        CHECK_MSG(tp_graph_cache_stats_openmetrics(cache, bad[i], text, sizeof text, &length) ==
                      TP_ERR_INVALID_ARGUMENT,
                  "graph cache labels '%s' were taken", bad[i]);
    }
    /* ours: kind is the pool's, a graph cache has none */
    CHECK_STATUS(tp_pool_stats_openmetrics(f.pool, "kind=\"x\"", text, sizeof text, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_graph_cache_stats_openmetrics(cache, "kind=\"x\"", text, sizeof text, NULL));
    /* escapes, empty values, many pairs, long values */
    CHECK_OK(tp_pool_stats_openmetrics(f.pool, "a=\"\",b=\"q\\\"uote\",c=\"back\\\\slash\\n\",_d9=\"x\"", text,
                                       sizeof text, NULL));
    CHECK_CONTAINS(text, "tidepool_pool_allocs_total{device=\"sim:0\",kind=\"segment\",a=\"\",b=\"q\\\"uote\",c=\"back\\\\slash\\n\",_d9=\"x\"} 0\n");
    static char labels[4096];
    size_t used = 0;
    for (int i = 0; i < 64; i++) used += (size_t)snprintf(labels + used, sizeof labels - used, "%sl%d=\"%d\"", i ? "," : "", i, i);
    CHECK_OK(tp_pool_stats_openmetrics(f.pool, labels, text, sizeof text, NULL));
    CHECK_CONTAINS(text, ",l63=\"63\"} ");
    snprintf(labels + used, sizeof labels - used, ",l64=\"64\""); /* one pair too many */
    CHECK_STATUS(tp_pool_stats_openmetrics(f.pool, labels, text, sizeof text, NULL), TP_ERR_INVALID_ARGUMENT);
    memset(labels, 'v', sizeof labels);
    memcpy(labels, "host=\"", 6);
    memcpy(labels + sizeof labels - 2, "\"", 2); /* a 4088-character value */
    CHECK_OK(tp_pool_stats_openmetrics(f.pool, labels, text, sizeof text, NULL));
    CHECK_CONTAINS(text, labels);
    CHECK_EQ_U64(check_prometheus_text(text, "device=\"sim:0\""), 5 * 3 + 18 + 1);
    CHECK_OK(tp_graph_cache_stats_openmetrics(cache, labels, text, sizeof text, NULL));
    CHECK_CONTAINS(text, labels);
    CHECK_OK(tp_graph_cache_destroy(cache));
    fixture_close(&f);
}

static const test_case tests[] = {
    KIND_CASES(observer_events_add_up_to_the_statistics),
    KIND_CASES(memory_map_covers_every_byte_once),
    TEST_CASE(test_prometheus_text_is_well_formed),
    TEST_CASE(test_prometheus_labels_are_checked),
};

/* The first argument is DIR when it names a directory (a path with an
 * underscore in it included: a build directory such as /home/a_b/build),
 * and otherwise a test filter. */
static bool is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int main(int argc, char **argv) {
    if (argc >= 2 && argv[1][0] != '-' && (strchr(argv[1], '/') || is_directory(argv[1]))) {
        out_dir = argv[1];
        argc--;
        argv++;
    }
    return TEST_MAIN("test_observe", tests, argc, argv);
}
