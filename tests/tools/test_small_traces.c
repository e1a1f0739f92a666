/* SPDX-License-Identifier: MIT */
/*
 * test_small_traces.c -- replays the short versions of the real traces
 * (docs/traces.md: recorded with PyTorch on the H200; the small/ directory
 * beside them) through tidepool's vmm and segment
 * pools: no errors, no hazards, no out-of-memory, no unknown frees, and
 * memory held within RATIO_BOUND of peak live. The bound was set from the
 * measured ratios (vmm 1.064 / 1.019 / 1.016, segment 1.016 / 1.072 /
 * 1.054 on decode_growing_kv / gemma3_mtmd / qwen2vl_dynres) with margin;
 * PyTorch's own allocator held 1.044 / 1.077 / 1.171 on the full traces.
 * The peak live the replay computes is checked against PyTorch's own
 * figure for the run (the .json beside each trace): PyTorch rounds every
 * request up to 512 bytes, so its peak is a little higher, never lower.
 * argv[1]: the directory of the real traces (TP_TRACES_DIR), or -;
 * argv[2]: the test data directory. Without the traces (a clean clone),
 * the excerpt committed
 * under the test data -- the first 2000 events of
 * qwen2vl_dynres.smoke.csv.gz -- replays instead, under the same checks and
 * with its peak live bytes known.
 */
#include "../check.h"
#include "replay.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#define RATIO_BOUND 1.12
#define EXCERPT "qwen2vl_dynres.head2000.csv.gz"
#define EXCERPT_PEAK_LIVE 2239692112ull

/* PyTorch's "peak_allocated" from the trace's .json, or 0. */
static uint64_t pytorch_peak_allocated(const char *trace_path) {
    char json_path[2048];
    size_t len = strlen(trace_path);
    if (len < 7 || len + 8 > sizeof json_path) return 0;
    snprintf(json_path, sizeof json_path, "%.*s.json", (int)(len - 7), trace_path); /* minus ".csv.gz" */
    FILE *f = fopen(json_path, "r");
    if (!f) return 0;
    char text[4096];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *key = strstr(text, "\"peak_allocated\":");
    return key ? strtoull(key + strlen("\"peak_allocated\":"), NULL, 10) : 0;
}

static int by_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static char dir_path[1024];
static bool excerpt_only; /* no real traces: the committed excerpt */

static void test_small_traces_replay_within_bounds(void) {
    DIR *dir = opendir(dir_path);
    REQUIRE(dir != NULL);
    char *names[64];
    int count = 0;
    for (struct dirent *entry; (entry = readdir(dir)) && count < 64;) {
        size_t len = strlen(entry->d_name);
        if (len > 7 && !strcmp(entry->d_name + len - 7, ".csv.gz") &&
            (!excerpt_only || !strcmp(entry->d_name, EXCERPT)))
            names[count++] = strdup(entry->d_name);
    }
    closedir(dir);
    qsort(names, (size_t)count, sizeof *names, by_name);
    if (excerpt_only)
        CHECK_MSG(count == 1, "%s/%s is missing", dir_path, EXCERPT);
    else
        CHECK_MSG(count >= 3, "%d traces in %s, expected the three workloads", count, dir_path);
    replay_options options = {.follow_trace_time = true};
    for (int i = 0; i < count; i++) {
        char path[2048], err[512];
        snprintf(path, sizeof path, "%s/%s", dir_path, names[i]);
        replay_run *run = NULL;
        int rc = replay_file(path, "vmm,segment", &options, &run, NULL, err, sizeof err);
        CHECK_MSG(rc == 0, "%s", err);
        if (rc) continue;
        replay_result *results;
        size_t n = replay_finish(run, &results);
        uint64_t pytorch_peak = pytorch_peak_allocated(path);
        for (size_t k = 0; k < n; k++) {
            const replay_result *r = &results[k];
            printf("  %-34s %-8s %9llu events, peak live %8.1f MiB, held %8.1f MiB, ratio %.3f, %llu device calls\n",
                   names[i], r->pool, (unsigned long long)r->events, r->peak_live_bytes / 1048576.0,
                   r->peak_reserved_bytes / 1048576.0, replay_ratio(r), (unsigned long long)r->device_calls);
            CHECK_MSG(r->errors == 0 && r->hazards == 0 && r->ooms == 0 && r->unknown_frees == 0 && !r->fatal,
                      "%s/%s: errors %llu hazards %llu ooms %llu unknown frees %llu", names[i], r->pool,
                      (unsigned long long)r->errors, (unsigned long long)r->hazards, (unsigned long long)r->ooms,
                      (unsigned long long)r->unknown_frees);
            CHECK_MSG(replay_ratio(r) <= RATIO_BOUND, "%s/%s holds %.3fx peak live (bound %.2f)", names[i], r->pool,
                      replay_ratio(r), RATIO_BOUND);
            CHECK_MSG(r->allocs + r->frees == r->events, "%s: %llu events are neither alloc nor free", names[i],
                      (unsigned long long)(r->events - r->allocs - r->frees));
            if (excerpt_only) CHECK_EQ_U64(r->peak_live_bytes, EXCERPT_PEAK_LIVE);
            if (pytorch_peak)
                CHECK_MSG(r->peak_live_bytes <= pytorch_peak && r->peak_live_bytes >= pytorch_peak - pytorch_peak / 50,
                          "%s: peak live %llu, PyTorch's peak allocated %llu", names[i],
                          (unsigned long long)r->peak_live_bytes, (unsigned long long)pytorch_peak);
        }
        replay_free(run);
        free(names[i]);
    }
}

static const test_case tests[] = {
    TEST_CASE(test_small_traces_replay_within_bounds),
};

/* argv[1]: the directory of the real traces, or -; argv[2]: the test data directory; further
 * arguments select tests. */
int main(int argc, char **argv) {
    REQUIRE(argc >= 3);
    snprintf(dir_path, sizeof dir_path, "%s/small", argv[1]);
    DIR *dir = strcmp(argv[1], "-") ? opendir(dir_path) : NULL;
    if (!dir) {
        printf("%s: replaying the excerpt %s/%s instead\n",
               strcmp(argv[1], "-") ? "the short traces are absent" : "no directory of real traces (TP_TRACES_DIR)",
               argv[2], EXCERPT);
        snprintf(dir_path, sizeof dir_path, "%s", argv[2]);
        excerpt_only = true;
    } else {
        closedir(dir);
    }
    return TEST_MAIN("test_small_traces", tests, argc - 2, argv + 2);
}
