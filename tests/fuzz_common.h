/* SPDX-License-Identifier: MIT */
/*
 * fuzz_common.h -- what the two API fuzz tests (test_api_fuzz.c,
 * graph/test_graph_fuzz.c) share: failure reports that name the seed and
 * step, status lists a call may return, a trace of the calls that change
 * the model (TP_FUZZ_TRACE=1), and the TP_FUZZ_* settings.
 *
 * The including file defines its `fuzz` state with at least: seed, step,
 * faults_left (injected faults still to come), ok_calls, refused_calls, f
 * (the fixture) and rng (test_rng).
 */
#ifndef TIDEPOOL_TESTS_FUZZ_COMMON_H
#define TIDEPOOL_TESTS_FUZZ_COMMON_H

#include "check.h"

#include "tidepool.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define FAIL_AT(z, ...)                                                                                    \
    do {                                                                                                   \
        check_count_failure_();                                                                            \
        fprintf(stderr, "%s:%d: seed %llu step %llu: ", __FILE__, __LINE__, (unsigned long long)(z)->seed, \
                (unsigned long long)(z)->step);                                                            \
        fprintf(stderr, __VA_ARGS__);                                                                      \
        fputc('\n', stderr);                                                                               \
    } while (0)

/* The status must be one of the list (terminated by TP_STATUS_COUNT_). */
static inline bool fuzz_status_in(tp_status st, const tp_status *allowed) {
    for (; *allowed != TP_STATUS_COUNT_; allowed++)
        if (st == *allowed) return true;
    return false;
}

/* The status must be one of the list; while faults are injected, the
 * injected statuses too. (st is evaluated once: it is often the call.) */
#define EXPECT_IN(z, call, st, ...)                                                                          \
    do {                                                                                                     \
        const tp_status allowed_[] = {__VA_ARGS__, TP_STATUS_COUNT_};                                        \
        tp_status got_ = (st);                                                                               \
        bool injected_ = (z)->faults_left && (got_ == TP_ERR_DEVICE || got_ == TP_ERR_OUT_OF_MEMORY);       \
        if (!injected_ && !fuzz_status_in(got_, allowed_))                                                   \
            FAIL_AT(z, "%s returned %s (not allowed)", call, tp_status_name(got_));                          \
        if (got_ == TP_OK) (z)->ok_calls++;                                                                  \
        else (z)->refused_calls++, (z)->f.log.errors = 0; /* refusals are logged at ERROR on purpose */      \
    } while (0)

/* TP_FUZZ_TRACE=1: every call that changes the model, for reproducing. */
static bool g_trace;
#define TRACE(z, ...)                                                  \
    do {                                                               \
        if (g_trace) {                                                 \
            fprintf(stderr, "[%llu] ", (unsigned long long)(z)->step); \
            fprintf(stderr, __VA_ARGS__);                              \
            fputc('\n', stderr);                                       \
        }                                                              \
    } while (0)

/* What the simulated device counted must be clean: no capture
 * invalidated, no hazard, no invalid access, nothing logged at ERROR
 * (ctr: its tp_sim_counters). */
#define FUZZ_CHECK_DEVICE(z, ctr)                                                                                  \
    do {                                                                                                           \
        if ((ctr).captures_invalidated) FAIL_AT(z, "%" PRIu64 " captures invalidated", (ctr).captures_invalidated); \
        if ((ctr).hazards || (ctr).invalid_accesses)                                                                \
            FAIL_AT(z,                                                                                             \
                    "device: %" PRIu64 " hazards (handout %" PRIu64 " unmap %" PRIu64 " free %" PRIu64 "), %" PRIu64  \
                    " invalid accesses",                                                                           \
                    (ctr).hazards, (ctr).hazards_handout, (ctr).hazards_unmap, (ctr).hazards_free,                 \
                    (ctr).invalid_accesses);                                                                       \
        if ((z)->f.log.errors) FAIL_AT(z, "%d error(s) logged", (z)->f.log.errors);                                  \
    } while (0)

#define rnd(z, n) rng_below(&(z)->rng, (n))
#define chance(z, percent) (rnd((z), 100) < (unsigned)(percent))

/* A stream handle nobody has: the simulator's streams are small indexes,
 * so one beyond its table, or all ones, or one just destroyed (the next
 * create may reuse it, but none comes before the call). */
static inline tp_stream fuzz_bogus_stream(test_rng *rng, tp_device *dev) {
    switch (rng_below(rng, 3)) {
    case 0: return (tp_stream)(uintptr_t)UINTPTR_MAX;
    case 1: return (tp_stream)(uintptr_t)(1000 + rng_below(rng, 1000));
    default: {
        tp_stream s;
        if (tp_stream_create(dev, &s) != TP_OK) return (tp_stream)(uintptr_t)0xdead0;
        CHECK_OK(tp_stream_destroy(dev, s));
        return s;
    }
    }
}

static inline uint64_t env_u64(const char *name, uint64_t fallback) {
    const char *v = getenv(name);
    return v && *v ? strtoull(v, NULL, 0) : fallback;
}

/* Runs run(seed, steps) for the seeds TP_FUZZ_SEED (default 1) and
 * TP_FUZZ_SEEDS (default 60, or 1 when a seed is named) ask for, with
 * TP_FUZZ_STEPS steps (default default_steps), until a check fails. */
static inline void fuzz_seeds(void (*run)(uint64_t seed, uint64_t steps), uint64_t default_steps) {
    uint64_t first = env_u64("TP_FUZZ_SEED", 1), seeds = env_u64("TP_FUZZ_SEEDS", getenv("TP_FUZZ_SEED") ? 1 : 60);
    uint64_t steps = env_u64("TP_FUZZ_STEPS", default_steps);
    g_trace = getenv("TP_FUZZ_TRACE") != NULL;
    for (uint64_t seed = first; seed < first + seeds && check_failures == 0; seed++) run(seed, steps);
}

#endif /* TIDEPOOL_TESTS_FUZZ_COMMON_H */
