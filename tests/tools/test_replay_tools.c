/* SPDX-License-Identifier: MIT */
/*
 * test_replay_tools.c -- the replay engine, the ggml baselines, the
 * scenario generators and the SVG writer (tools/).
 *   - generated traces keep their invariants (each free names a live
 *     allocation with its size and stream; time never runs backwards) and
 *     the same parameters give the same trace;
 *   - tidepool's pools replay every scenario without errors or hazards,
 *     and keep the invariants of docs/failure-modes.md where a trace can
 *     show them;
 *   - the baselines reproduce the documented behaviour: ggml-legacy holds
 *     more than 5x peak live on fa-decode, ggml-vmm counts LIFO violations
 *     on out-of-order (and none on fa-decode, whose frees are LIFO), and
 *     ggml-legacy's flush frees only its own stream's pool;
 *   - the models of PyTorch's caching allocator keep their rules (segment
 *     sizes, splitting, merging, streams, the out-of-memory retry; with
 *     expandable segments, pages mapped at a reservation's end and
 *     unmapped when the device is full);
 *   - a free of an address the trace never allocated is counted, not fatal;
 *   - replay_file gives the same figures and curves whatever its threads
 *     (parse workers, lane threads);
 *   - the chart escapes its title and draws bytes near 2^64.
 * argv[1]: a scratch directory.
 */
#include "../check.h"
#include "plot.h"
#include "replay.h"
#include "scenarios.h"

#include <stdlib.h>
#include <string.h>

#define MiB (1024ull * 1024ull)
#define GiB (1024ull * MiB)

static const char *scratch_dir;

/* Replays a scenario with params through pools on device (occupied bytes taken first). */
static replay_run *replay_scenario(const char *name, const scenario_params *params, const char *pools,
                                   const char *device, uint64_t occupied_bytes, bool samples, replay_result **out,
                                   size_t *out_count) {
    const scenario *s = scenario_find(name);
    REQUIRE(s != NULL);
    replay_options options = {.device_spec = device, .keep_samples = samples, .follow_trace_time = true,
                              .occupied_bytes = occupied_bytes};
    char err[512];
    replay_run *run = replay_begin(pools, &options, err, sizeof err);
    if (!run) fprintf(stderr, "replay_begin: %s\n", err);
    REQUIRE(run != NULL);
    REQUIRE(scenario_replay(s, params, &run, 1, NULL) == 0);
    *out_count = replay_finish(run, out);
    return run;
}

static const replay_result *find_result(replay_result *results, size_t count, const char *pool) {
    for (size_t i = 0; i < count; i++)
        if (!strcmp(results[i].pool, pool)) return &results[i];
    REQUIRE(!"pool missing from the results");
    return NULL;
}

/* ---------------------------------------------- generated trace checks */

typedef struct live_entry {
    uint64_t address, bytes;
    uint32_t stream;
    bool used;
} live_entry;

typedef struct trace_checker {
    live_entry *table;
    size_t capacity, live;
    uint64_t events, last_time_ns, hash;
    uint64_t bad_frees, time_reversals, duplicate_addresses;
} trace_checker;

static live_entry *checker_slot(trace_checker *c, uint64_t address) {
    size_t i = (size_t)((address * 0x9E3779B97F4A7C15ull) >> 40) & (c->capacity - 1);
    while (c->table[i].used && c->table[i].address != address) i = (i + 1) & (c->capacity - 1);
    return &c->table[i];
}

static int check_events(void *user, const trace_event *events, size_t count) {
    trace_checker *c = user;
    for (size_t k = 0; k < count; k++) {
        const trace_event *e = &events[k];
        c->events++;
        c->hash = (c->hash ^ e->time_ns ^ (e->address << 1) ^ (e->bytes << 2) ^ e->stream ^ e->action) *
                  0x100000001B3ull;
        if (e->time_ns < c->last_time_ns) c->time_reversals++;
        c->last_time_ns = e->time_ns;
        live_entry *slot = checker_slot(c, e->address);
        if (e->action == TRACE_ALLOC) {
            if (slot->used) c->duplicate_addresses++;
            *slot = (live_entry){e->address, e->bytes, e->stream, true};
            c->live++;
            REQUIRE(c->live * 2 < c->capacity);
        } else if (!slot->used || slot->bytes != e->bytes || slot->stream != e->stream) {
            c->bad_frees++;
        } else {
            /* backward-shift deletion */
            size_t hole = (size_t)(slot - c->table), mask = c->capacity - 1;
            slot->used = false;
            for (size_t j = (hole + 1) & mask; c->table[j].used; j = (j + 1) & mask) {
                size_t home = (size_t)((c->table[j].address * 0x9E3779B97F4A7C15ull) >> 40) & mask;
                bool movable = (j > hole) ? (home <= hole || home > j) : (home <= hole && home > j);
                if (movable) {
                    c->table[hole] = c->table[j];
                    c->table[j].used = false;
                    hole = j;
                }
            }
            c->live--;
        }
    }
    return 0;
}

static trace_checker check_scenario(const scenario *s, const scenario_params *p) {
    trace_checker c = {.capacity = 1 << 16};
    c.table = calloc(c.capacity, sizeof *c.table);
    REQUIRE(c.table != NULL);
    scenario_sink sink = {check_events, NULL, &c};
    CHECK_EQ_U64(s->generate(p, &sink), 0);
    free(c.table);
    c.table = NULL;
    return c;
}

/* Small parameters so that every scenario runs in well under a second. */
static void small_params(const scenario *s, scenario_params *p) {
    scenario_defaults(s, p);
    if (!strcmp(s->name, "fa-decode")) p->context_tokens = 4096;
    if (!strcmp(s->name, "size-rotation")) p->rounds = 2;
    if (!strcmp(s->name, "high-water")) p->minutes = 2;
    if (!strcmp(s->name, "out-of-order") || !strcmp(s->name, "cross-stream")) p->steps = 300;
    if (!strcmp(s->name, "image-requests")) p->requests = 12;
    if (!strcmp(s->name, "batched-serving")) p->steps = 300;
    if (!strcmp(s->name, "heavy-tail")) p->steps = 10000;
    if (!strcmp(s->name, "moe")) p->steps = 300;
}

static void test_generated_traces(void) {
    size_t count;
    const scenario *list = scenario_list(&count);
    const char *required[] = {"fa-decode",    "size-rotation", "oom-reclaim",   "high-water",
                              "out-of-order", "cross-stream",  "image-requests"};
    for (size_t i = 0; i < sizeof required / sizeof *required; i++)
        CHECK_MSG(scenario_find(required[i]) != NULL, "scenario %s missing", required[i]);
    for (size_t i = 0; i < count; i++) {
        const scenario *s = &list[i];
        if (!s->generate) continue;
        scenario_params p;
        small_params(s, &p);
        trace_checker a = check_scenario(s, &p), b = check_scenario(s, &p);
        printf("  %-15s %8llu events, %llu live at the end\n", s->name, (unsigned long long)a.events,
               (unsigned long long)a.live);
        CHECK_MSG(a.events > 0 && a.bad_frees == 0 && a.time_reversals == 0 && a.duplicate_addresses == 0,
                  "%s: %llu events, %llu bad frees, %llu time reversals, %llu reused addresses", s->name,
                  (unsigned long long)a.events, (unsigned long long)a.bad_frees,
                  (unsigned long long)a.time_reversals, (unsigned long long)a.duplicate_addresses);
        CHECK_MSG(a.hash == b.hash && a.events == b.events, "%s: not deterministic", s->name);
        if (s->params & SCENARIO_USES(SCENARIO_PARAM_SEED)) {
            p.seed++;
            trace_checker other = check_scenario(s, &p);
            CHECK_MSG(other.hash != a.hash, "%s: the seed changes nothing", s->name);
        }
    }
    /* fa-decode: 22 allocations and 22 frees a token, nothing left live. */
    scenario_params p;
    scenario_defaults(scenario_find("fa-decode"), &p);
    p.context_tokens = 100;
    trace_checker fa = check_scenario(scenario_find("fa-decode"), &p);
    CHECK_EQ_U64(fa.events, 100 * 44);
    CHECK_EQ_U64(fa.live, 0);
}

/* ------------------------------------------------------ tidepool pools */

static void test_tidepool_on_scenarios(void) {
    size_t count;
    const scenario *list = scenario_list(&count);
    for (size_t i = 0; i < count; i++) {
        const scenario *s = &list[i];
        if (!s->generate) continue;
        scenario_params p;
        small_params(s, &p);
        /* vmm on the scenario's device with VMM, segment on it without */
        const char *base = s->device ? s->device : "sim:64GiB";
        char novmm[96];
        snprintf(novmm, sizeof novmm, "%s%s", base, strstr(base, "novmm") ? "" : ",novmm");
        char vmm[96];
        snprintf(vmm, sizeof vmm, "%.*s", (int)(strstr(base, ",novmm") ? strstr(base, ",novmm") - base : (long)strlen(base)), base);
        const char *devices[2] = {vmm, novmm}, *pools[2] = {"vmm", "segment"};
        for (int k = 0; k < 2; k++) {
            replay_result *results;
            size_t n;
            replay_run *run = replay_scenario(s->name, &p, pools[k], devices[k], s->occupied_bytes, false, &results, &n);
            const replay_result *r = &results[0];
            printf("  %-15s %-8s on %-18s held %7.1f MiB for %7.1f MiB live (%.3fx), %llu ooms, %llu recoveries\n",
                   s->name, r->pool, devices[k], r->peak_reserved_bytes / (double)MiB,
                   r->peak_live_bytes / (double)MiB, replay_ratio(r), (unsigned long long)r->ooms,
                   (unsigned long long)r->oom_recoveries);
            CHECK_MSG(r->errors == 0 && r->hazards == 0 && r->unknown_frees == 0 && !r->fatal,
                      "%s/%s: errors %llu hazards %llu unknown frees %llu fatal %d", s->name, r->pool,
                      (unsigned long long)r->errors, (unsigned long long)r->hazards,
                      (unsigned long long)r->unknown_frees, r->fatal);
            if (!strcmp(s->name, "image-requests") && !strcmp(r->pool, "vmm")) {
                /* two streams, KV blocks growing every token: the hard cap
                 * unmaps fresh idle pages before growing (1.37x without) */
                CHECK_MSG(replay_ratio(r) <= 1.15, "image-requests/vmm holds %.3fx peak live", replay_ratio(r));
            }
            if (!strcmp(s->name, "high-water")) {
                /* the 5 GiB request cannot fit in 4 GiB: one error, not an abort, and the pool goes on */
                CHECK_MSG(r->ooms == 1, "%s/%s: %llu ooms", s->name, r->pool, (unsigned long long)r->ooms);
                CHECK_EQ_U64(r->allocs, r->frees);
            } else {
                /* everything fits: oom-reclaim only if the pool gives back idle cache */
                CHECK_MSG(r->ooms == 0, "%s/%s: %llu ooms", s->name, r->pool, (unsigned long long)r->ooms);
            }
            replay_free(run);
        }
    }
}

/* ------------------------------------------------------------ baselines */

static void test_baselines_on_fa_decode(void) {
    replay_result *results;
    size_t n;
    scenario_params p;

    /* fa-decode as failure mode 1 (docs/failure-modes.md) states it, t = 1..131072 */
    scenario_defaults(scenario_find("fa-decode"), &p);
    REQUIRE(p.context_tokens == 131072);
    replay_run *run = replay_scenario("fa-decode", &p, "ggml-legacy,ggml-vmm,segment,vmm", "sim:1TiB", 0, false,
                                      &results, &n);
    const replay_result *legacy = find_result(results, n, "ggml-legacy");
    const replay_result *ggml_vmm = find_result(results, n, "ggml-vmm");
    const replay_result *segment = find_result(results, n, "segment");
    const replay_result *vmm = find_result(results, n, "vmm");
    printf("  fa-decode %llu tokens: ggml-legacy %.2fx, ggml-vmm %.3fx, segment %.3fx (%llu device allocs), vmm "
           "%.3fx (%llu device allocs) peak live\n",
           (unsigned long long)p.context_tokens, replay_ratio(legacy), replay_ratio(ggml_vmm), replay_ratio(segment),
           (unsigned long long)segment->device_allocs, replay_ratio(vmm), (unsigned long long)vmm->device_allocs);
    CHECK_MSG(replay_ratio(legacy) > 5.0, "ggml-legacy holds only %.2fx peak live", replay_ratio(legacy));
    CHECK_EQ_U64(legacy->peak_live_bytes, segment->peak_live_bytes);
    CHECK_EQ_U64(vmm->peak_live_bytes, segment->peak_live_bytes);
    CHECK_EQ_U64(ggml_vmm->lifo_violations, 0); /* fa-decode frees in reverse */
    /* failure mode 1's invariant for tidepool: held <= 1.1x peak live */
    CHECK_MSG(replay_ratio(segment) <= 1.1 && replay_ratio(vmm) <= 1.1, "segment %.3fx, vmm %.3fx",
              replay_ratio(segment), replay_ratio(vmm));
    CHECK_EQ_U64(segment->errors, 0);
    CHECK_EQ_U64(vmm->errors, 0);
    CHECK_EQ_U64(segment->ooms, 0);
    CHECK_EQ_U64(vmm->ooms, 0);
    replay_free(run);
}

static void test_ggml_vmm_counts_lifo_violations_on_out_of_order(void) {
    replay_result *results;
    size_t n;
    scenario_params p;
    scenario_defaults(scenario_find("out-of-order"), &p);
    replay_run *run = replay_scenario("out-of-order", &p, "ggml-vmm,vmm", "sim:64GiB", 0, false, &results, &n);
    const replay_result *ggml_vmm = find_result(results, n, "ggml-vmm");
    printf("  out-of-order %llu steps: ggml-vmm %llu LIFO violations\n", (unsigned long long)p.steps,
           (unsigned long long)ggml_vmm->lifo_violations);
    CHECK_GE_U64(ggml_vmm->lifo_violations, p.steps); /* every step frees A before B */
    CHECK_EQ_U64(find_result(results, n, "vmm")->lifo_violations, 0);
    replay_free(run);
}

/* ggml-legacy's flush frees only the pool of the stream that ran out: the
 * same events on one stream recover, on two streams they abort. */
static int feed_events(replay_run *run, const trace_event *events, size_t count) {
    replay_feed(run, events, count);
    return 0;
}

static void test_legacy_flush_scope(void) {
    for (uint32_t other_stream = 0; other_stream < 2; other_stream++) {
        /* 1 GiB device: 600 MiB used and parked by `other_stream`, then 600 MiB on stream 0. */
        const trace_event events[] = {
            {0, 0x1000, 600 * MiB, other_stream, TRACE_ALLOC},
            {1000, 0x1000, 600 * MiB, other_stream, TRACE_FREE},
            {2000, 0x2000, 700 * MiB, 0, TRACE_ALLOC},
            {3000, 0x2000, 700 * MiB, 0, TRACE_FREE},
        };
        replay_options options = {.device_spec = "sim:1GiB,novmm", .follow_trace_time = true};
        char err[512];
        replay_run *run = replay_begin("ggml-legacy,segment", &options, err, sizeof err);
        REQUIRE(run != NULL);
        feed_events(run, events, sizeof events / sizeof *events);
        replay_result *results;
        size_t n = replay_finish(run, &results);
        const replay_result *legacy = find_result(results, n, "ggml-legacy");
        const replay_result *segment = find_result(results, n, "segment");
        if (other_stream == 0) {
            CHECK(!legacy->fatal);
            CHECK_EQ_U64(legacy->ooms, 0);
            CHECK_EQ_U64(legacy->oom_recoveries, 1);
            CHECK_EQ_U64(legacy->first_recovery_event, 3);
            CHECK_CONTAINS(legacy->first_recovery_report, "retry succeeded");
        } else {
            CHECK(legacy->fatal);
            CHECK_EQ_U64(legacy->fatal_event, 3);
            CHECK_EQ_U64(legacy->first_oom_event, 3);
            CHECK_MSG(strstr(legacy->first_oom_report, "idle in other pools"), "'%s'", legacy->first_oom_report);
        }
        CHECK_EQ_U64(segment->ooms, 0);
        CHECK(!segment->fatal); /* tidepool gives back its idle memory either way */
        replay_free(run);
    }
}

/* ------------------------------------------------- PyTorch's allocator */

/* Replays events through one pool alone on device. */
static replay_result one_pool_on(const char *pool, const char *device, const trace_event *events, size_t count) {
    replay_options options = {.device_spec = device, .follow_trace_time = true};
    char err[512];
    replay_run *run = replay_begin(pool, &options, err, sizeof err);
    REQUIRE(run != NULL);
    feed_events(run, events, count);
    replay_result *results;
    size_t n = replay_finish(run, &results);
    REQUIRE(n == 1);
    replay_result r = results[0];
    replay_free(run);
    return r;
}

static replay_result torch_default_on(const char *device, const trace_event *events, size_t count) {
    return one_pool_on("torch-default", device, events, count);
}

/* One out-of-memory recovery at recovery_event (the cache given back, the
 * retry successful), then one failure at oom_event with nothing left to
 * give back; held_bytes held at the peak and at the end, no error. */
static void check_recovery_then_oom(const replay_result *r, uint64_t recovery_event, uint64_t oom_event,
                                    uint64_t held_bytes) {
    CHECK_EQ_U64(r->oom_recoveries, 1);
    CHECK_EQ_U64(r->first_recovery_event, recovery_event);
    CHECK_CONTAINS(r->first_recovery_report, "retry succeeded");
    CHECK_EQ_U64(r->ooms, 1);
    CHECK_EQ_U64(r->first_oom_event, oom_event);
    CHECK_EQ_U64(r->peak_reserved_bytes, held_bytes);
    CHECK_EQ_U64(r->end_reserved_bytes, held_bytes);
    CHECK_EQ_U64(r->errors, 0);
}

/* The model of PyTorch's caching allocator keeps its rules: segment sizes
 * (2 MiB small, 20 MiB for 1-10 MiB, else 2 MiB steps), a large block split
 * only when more than 1 MiB is left, freed neighbours merged, blocks reused
 * only on their own stream, nothing given back but by the out-of-memory
 * retry. Each figure below follows from one rule and fails without it. */
static void test_torch_default_rules(void) {
    /* small and medium segments; a medium block split, the rest reused */
    const trace_event sizes[] = {
        {0, 0x1, 100, 0, TRACE_ALLOC},     /* a 2 MiB small segment */
        {1, 0x2, 3 * MiB, 0, TRACE_ALLOC}, /* a 20 MiB segment, split: 17 MiB left */
        {2, 0x3, 5 * MiB, 0, TRACE_ALLOC}, /* from the 17 MiB left, no new segment */
        {3, 0x4, 13 * MiB - 1, 0, TRACE_ALLOC}, /* 12 MiB left: a segment of its own, 14 MiB (2 MiB steps) */
    };
    replay_result r = torch_default_on("sim:1GiB,novmm", sizes, 4);
    CHECK_EQ_U64(r.device_allocs, 3);
    CHECK_EQ_U64(r.peak_reserved_bytes, 2 * MiB + 20 * MiB + 14 * MiB);

    /* merging: two freed neighbours and the segment's rest make one block that
     * holds 19 MiB; without merging the 19 MiB would need a new segment */
    const trace_event merge[] = {
        {0, 0x1, 3 * MiB, 0, TRACE_ALLOC}, {1, 0x2, 3 * MiB, 0, TRACE_ALLOC},
        {2, 0x1, 3 * MiB, 0, TRACE_FREE},  {3, 0x2, 3 * MiB, 0, TRACE_FREE},
        {4, 0x3, 19 * MiB, 0, TRACE_ALLOC},
    };
    r = torch_default_on("sim:1GiB,novmm", merge, 5);
    CHECK_EQ_U64(r.device_allocs, 1);
    CHECK_EQ_U64(r.peak_reserved_bytes, 20 * MiB);

    /* a large block split with more than 1 MiB to spare: the 1.25 MiB
     * request takes the 1.5 MiB left of a 12 MiB segment */
    const trace_event split[] = {
        {0, 0x1, 12 * MiB, 0, TRACE_ALLOC}, {1, 0x1, 12 * MiB, 0, TRACE_FREE},
        {2, 0x2, 21 * MiB / 2, 0, TRACE_ALLOC}, {3, 0x3, 5 * MiB / 4, 0, TRACE_ALLOC},
    };
    r = torch_default_on("sim:1GiB,novmm", split, 4);
    CHECK_EQ_U64(r.device_allocs, 1);
    CHECK_EQ_U64(r.peak_reserved_bytes, 12 * MiB);

    /* a block freed on one stream is not reused on another, whichever of
     * the two streams was made first (the search orders blocks by stream
     * first: one of the two orders puts the freed block after the key) */
    for (uint32_t freeing = 1; freeing <= 2; freeing++) {
        const trace_event streams[] = {
            {0, 0x9, 100, 3 - freeing, TRACE_ALLOC}, /* makes the asking stream first */
            {1, 0x1, 40 * MiB, freeing, TRACE_ALLOC},
            {2, 0x1, 40 * MiB, freeing, TRACE_FREE},
            {3, 0x2, 30 * MiB, 3 - freeing, TRACE_ALLOC},
        };
        r = torch_default_on("sim:1GiB,novmm", streams, 4);
        CHECK_EQ_U64(r.device_allocs, 3);
        CHECK_EQ_U64(r.peak_reserved_bytes, 2 * MiB + 70 * MiB);
    }

    /* out of memory: the cached whole segments go back and the malloc is
     * retried once (a recovery); when that fails too, an out-of-memory
     * failure, the cache empty */
    const trace_event oom[] = {
        {0, 0x1, 40 * MiB, 0, TRACE_ALLOC}, {1, 0x1, 40 * MiB, 0, TRACE_FREE},
        {2, 0x2, 50 * MiB, 0, TRACE_ALLOC}, /* 40 + 50 > 64: free the 40, retry */
        {3, 0x3, 30 * MiB, 0, TRACE_ALLOC}, /* 50 + 30 > 64, nothing cached: fails */
    };
    r = torch_default_on("sim:64MiB,novmm", oom, 4);
    check_recovery_then_oom(&r, 3, 4, 50 * MiB);
}

/* The model of PyTorch's expandable segments: pages of 2 MiB (small pool)
 * and 20 MiB (large pool) mapped at the end of a stream's reservation, a
 * free block and the unmapped space after it mapped into one block, free
 * pages unmapped when the device is full. */
static void test_torch_expandable_rules(void) {
    const trace_event grow[] = {
        {0, 0x1, 100, 0, TRACE_ALLOC},     /* a 2 MiB small page */
        {1, 0x2, 3 * MiB, 0, TRACE_ALLOC}, /* a 20 MiB large page */
        {2, 0x3, 5 * MiB, 0, TRACE_ALLOC}, /* from its rest: no mapping */
        {3, 0x4, 30 * MiB, 0, TRACE_ALLOC}, /* the 12 MiB left and one more page, as one block */
    };
    replay_result r = one_pool_on("torch-expandable", "sim:1GiB", grow, 4);
    CHECK_EQ_U64(r.device_allocs, 3);
    CHECK_EQ_U64(r.peak_reserved_bytes, 2 * MiB + 40 * MiB);
    r = torch_default_on("sim:1GiB", grow, 4); /* the same without expansion: a segment of its own */
    CHECK_EQ_U64(r.peak_reserved_bytes, 2 * MiB + 20 * MiB + 30 * MiB);

    /* device full: the free pages go back and the mapping is retried once */
    const trace_event oom[] = {
        {0, 0x1, 50 * MiB, 1, TRACE_ALLOC}, /* three pages */
        {1, 0x1, 50 * MiB, 1, TRACE_FREE},
        {2, 0x2, 100, 1, TRACE_ALLOC},      /* a small page: 62 MiB held */
        {3, 0x3, 50 * MiB, 2, TRACE_ALLOC}, /* another stream: unmaps stream 1's three free pages, then maps */
        {4, 0x4, 30 * MiB, 2, TRACE_ALLOC}, /* one more page would pass 64 MiB; nothing free to unmap */
    };
    r = one_pool_on("torch-expandable", "sim:64MiB", oom, 5);
    check_recovery_then_oom(&r, 4, 5, 62 * MiB);
}

/* ------------------------------------------------------- engine, chart */

static void test_unknown_free(void) {
    const trace_event events[] = {
        {0, 0x10, 4096, 0, TRACE_ALLOC},
        {10, 0x99, 4096, 0, TRACE_FREE}, /* never allocated */
        {20, 0x10, 4096, 0, TRACE_FREE},
        {30, 0x20, 8192, 0, TRACE_ALLOC},
    };
    replay_options options = {.follow_trace_time = true};
    char err[512];
    replay_run *run = replay_begin("vmm,segment,ggml-legacy,ggml-vmm", &options, err, sizeof err);
    REQUIRE(run != NULL);
    feed_events(run, events, 4);
    replay_result *results;
    size_t n = replay_finish(run, &results);
    CHECK_EQ_U64(n, 4);
    for (size_t i = 0; i < n; i++) {
        const replay_result *r = &results[i];
        CHECK_MSG(r->unknown_frees == 1 && r->errors == 0 && !r->fatal && r->events == 4 && r->allocs == 2 &&
                      r->frees == 2 && r->peak_live_bytes == 8192,
                  "%s: unknown %llu errors %llu", r->pool, (unsigned long long)r->unknown_frees,
                  (unsigned long long)r->errors);
    }
    replay_free(run);
}

/* A trace cut from a longer recording starts with frees of blocks allocated
 * before the cut: the first event reaches an empty live table (F2: the old
 * address map indexed its table before it had one and crashed). Addresses
 * 0 and UINT64_MAX too, every pool, with and without samples. */
static void test_trace_starting_with_frees(void) {
    const trace_event events[] = {
        {0, 4096, 0, 0, TRACE_FREE},          /* the first event: a free, on an empty table */
        {1, UINT64_MAX, 64, 0, TRACE_FREE},   /* never allocated, the largest address */
        {2, 0, 64, 1, TRACE_FREE},            /* never allocated, address 0, another stream */
        {3, 0x2000, 8192, 0, TRACE_ALLOC},
        {4, 4096, 0, 0, TRACE_FREE},          /* still unknown */
        {5, 0x2000, 8192, 0, TRACE_FREE},
        {6, 0x2000, 8192, 0, TRACE_FREE},     /* freed twice: the second is unknown */
        {7, UINT64_MAX, 128, 0, TRACE_ALLOC}, /* the largest address is a valid identity */
        {8, UINT64_MAX, 128, 0, TRACE_FREE},
    };
    size_t count = sizeof events / sizeof *events;
    for (int samples = 0; samples < 2; samples++) {
        replay_options options = {.follow_trace_time = true, .keep_samples = samples != 0};
        char err[512];
        replay_run *run = replay_begin("vmm,segment,ggml-legacy,ggml-vmm", &options, err, sizeof err);
        REQUIRE(run != NULL);
        /* one event at a time, so the first call holds frees only */
        for (size_t i = 0; i < count; i++) feed_events(run, &events[i], 1);
        replay_result *results;
        size_t n = replay_finish(run, &results);
        CHECK_EQ_U64(n, 4);
        for (size_t i = 0; i < n; i++) {
            const replay_result *r = &results[i];
            CHECK_MSG(r->unknown_frees == 5 && r->errors == 0 && !r->fatal && r->events == count && r->allocs == 2 &&
                          r->frees == 7 && r->peak_live_bytes == 8192 && r->ooms == 0,
                      "%s: unknown %llu errors %llu frees %llu peak %llu", r->pool,
                      (unsigned long long)r->unknown_frees, (unsigned long long)r->errors,
                      (unsigned long long)r->frees, (unsigned long long)r->peak_live_bytes);
        }
        replay_free(run);
    }
}

/* ---------------------------------------------------- replay_file threads */

static int write_events(void *user, const trace_event *events, size_t count) {
    for (size_t i = 0; i < count; i++)
        if (trace_write(user, &events[i]) != 0) return -1;
    return 0;
}

/* Every figure of a result but the host time it took. */
static bool same_result(const replay_result *a, const replay_result *b) {
#define SAME(field) (a->field == b->field)
    bool same = SAME(events) && SAME(allocs) && SAME(frees) && SAME(peak_live_bytes) && SAME(peak_reserved_bytes) &&
                SAME(end_reserved_bytes) && SAME(device_calls) && SAME(device_allocs) && SAME(ooms) && SAME(errors) &&
                SAME(unknown_frees) && SAME(duplicate_allocs) && SAME(folded_streams) && SAME(hazards) &&
                SAME(lifo_violations) && SAME(oom_recoveries) && SAME(fatal) && SAME(fatal_event) &&
                SAME(first_oom_event) && SAME(first_recovery_event) && SAME(sample_count);
#undef SAME
    same = same && !strcmp(a->pool, b->pool) && !strcmp(a->first_oom_report, b->first_oom_report) &&
           !strcmp(a->first_recovery_report, b->first_recovery_report) && !strcmp(a->extra, b->extra);
    for (size_t i = 0; same && i < a->sample_count; i++) {
        const replay_sample *x = &a->samples[i], *y = &b->samples[i];
        same = x->event == y->event && x->time_ns == y->time_ns && x->live_bytes == y->live_bytes &&
               x->reserved_bytes == y->reserved_bytes && x->cached_bytes == y->cached_bytes;
    }
    return same;
}

/* replay_file gives the same figures, curves included, whatever the
 * threads: 1 (all on the caller's), 2 (a parse worker; the lanes one after
 * the other), 3 to 5 (lane threads beside the parse workers), with
 * out-of-memory, recoveries and a fatal baseline among the pools, and small
 * blocks so that many batches go through the lane threads. */
static void test_replay_file_threads_same_results(void) {
    const scenario *s = scenario_find("cross-stream");
    REQUIRE(s != NULL);
    scenario_params params;
    small_params(s, &params);
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/threads.csv", scratch_dir);
    trace_writer *w = trace_writer_open(path, err, sizeof err);
    REQUIRE(w != NULL);
    scenario_sink sink = {write_events, NULL, w};
    CHECK_EQ_U64(s->generate(&params, &sink), 0);
    REQUIRE(trace_writer_close(w) == 0);
    const char *pools = "vmm,segment,ggml-legacy,ggml-vmm";
    replay_run *reference = NULL;
    replay_result *expected = NULL;
    size_t expected_count = 0;
    for (unsigned threads = 1; threads <= 5; threads++) {
        replay_options options = {.device_spec = "sim:96MiB", .keep_samples = true, .follow_trace_time = true,
                                  .threads = threads, .block_bytes = 4096};
        replay_run *run = NULL;
        replay_file_timing timing;
        REQUIRE(replay_file(path, pools, &options, &run, &timing, err, sizeof err) == 0);
        CHECK_MSG(timing.threads == threads, "%u threads asked, %u used", threads, timing.threads);
        replay_result *results;
        size_t n = replay_finish(run, &results);
        CHECK_EQ_U64(n, 4);
        if (!reference) {
            reference = run;
            expected = results;
            expected_count = n;
            uint64_t ooms = 0;
            for (size_t i = 0; i < n; i++) ooms += results[i].ooms;
            printf("  %llu events, %llu out-of-memory answers over the pools\n", (unsigned long long)results[0].events,
                   (unsigned long long)ooms);
            CHECK(results[0].events > 1000 && ooms > 0);
            continue;
        }
        for (size_t i = 0; i < n && i < expected_count; i++)
            CHECK_MSG(same_result(&results[i], &expected[i]), "%u threads: pool %s differs", threads, results[i].pool);
        replay_free(run);
    }
    replay_free(reference);
}

static void test_unknown_pool_is_refused_with_its_name(void) {
    replay_options options = {.follow_trace_time = true};
    char err[512];
    CHECK(replay_begin("vmm,nope", &options, err, sizeof err) == NULL && strstr(err, "'nope'"));
}

static void test_units(void) {
    scenario_units units = {0};
    scenario_unit_start starts[] = {{1, 0}, {2, 44}, {3, 88}};
    units.starts = starts;
    units.count = 3;
    CHECK_EQ_U64(scenario_unit_of(&units, 1), 1);
    CHECK_EQ_U64(scenario_unit_of(&units, 44), 1);
    CHECK_EQ_U64(scenario_unit_of(&units, 45), 2);
    CHECK_EQ_U64(scenario_unit_of(&units, 89), 3);
    CHECK_EQ_U64(scenario_unit_of(&units, 5000), 3);
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)size + 1);
    if (text && fread(text, 1, (size_t)size, f) != (size_t)size) text[0] = '\0';
    fclose(f);
    return text;
}

static void test_plot(void) {
    scenario_params p;
    scenario_defaults(scenario_find("fa-decode"), &p);
    p.context_tokens = 2048;
    replay_result *results;
    size_t n;
    replay_run *run = replay_scenario("fa-decode", &p, "segment,ggml-legacy", "sim:16GiB,novmm", 0, true, &results,
                                      &n);
    char path[1024], err[512];
    snprintf(path, sizeof path, "%s/unit.svg", scratch_dir);
    CHECK_EQ_U64(plot_replay_svg(path, "a&b <c> \"d\" \x01 \xff", results, n, err, sizeof err), 0);
    char *svg = slurp(path);
    REQUIRE(svg != NULL);
    CHECK(strncmp(svg, "<?xml", 5) == 0);
    CHECK_CONTAINS(svg, "</svg>");
    CHECK_CONTAINS(svg, "a&amp;b &lt;c&gt; &quot;d&quot; ? ?");
    CHECK_CONTAINS(svg, "segment peak");
    CHECK_CONTAINS(svg, "ggml-legacy peak");
    CHECK_CONTAINS(svg, "MiB");
    free(svg);
    /* Without samples there is nothing to draw: an error, not an empty chart. */
    replay_result bare = results[0];
    bare.samples = NULL;
    bare.sample_count = 0;
    CHECK(plot_replay_svg(path, "x", &bare, 1, err, sizeof err) == -1 && strstr(err, "no samples"));
    /* Bytes near 2^64 (a trace's huge request): the y axis's top rounded up
     * wrapped to 0 and every coordinate was -nan. */
    replay_sample huge_samples[2] = {{1, 1000, 0, 0, 0}, {2, 2000, UINT64_MAX - 100, UINT64_MAX - 100, 0}};
    replay_result huge = results[0];
    huge.samples = huge_samples;
    huge.sample_count = 2;
    huge.peak_live_bytes = huge.peak_reserved_bytes = UINT64_MAX;
    CHECK_EQ_U64(plot_replay_svg(path, "huge", &huge, 1, err, sizeof err), 0);
    svg = slurp(path);
    REQUIRE(svg != NULL);
    CHECK_CONTAINS(svg, "</svg>");
    CHECK_MSG(!strstr(svg, "nan") && !strstr(svg, "inf"), "a coordinate is not a number");
    free(svg);
    replay_free(run);
}

static const test_case tests[] = {
    TEST_CASE(test_generated_traces),
    TEST_CASE(test_tidepool_on_scenarios),
    TEST_CASE(test_baselines_on_fa_decode),
    TEST_CASE(test_ggml_vmm_counts_lifo_violations_on_out_of_order),
    TEST_CASE(test_legacy_flush_scope),
    TEST_CASE(test_torch_default_rules),
    TEST_CASE(test_torch_expandable_rules),
    TEST_CASE(test_unknown_free),
    TEST_CASE(test_trace_starting_with_frees),
    TEST_CASE(test_unknown_pool_is_refused_with_its_name),
    TEST_CASE(test_replay_file_threads_same_results),
    TEST_CASE(test_units),
    TEST_CASE(test_plot),
};

/* argv[1]: the scratch directory; further arguments select tests. */
int main(int argc, char **argv) {
    REQUIRE(argc >= 2);
    scratch_dir = argv[1];
    return TEST_MAIN("test_replay_tools", tests, argc - 1, argv + 1);
}
