/* SPDX-License-Identifier: MIT */
/*
 * scenarios.h -- the workloads of the failure modes in docs/failure-modes.md
 * (and the image-request server of its background), adversarial shapes and
 * the allocations of kinds of model beside them, as allocation traces made
 * on the fly.
 *
 * A scenario either generates trace events, which `tide scenario` replays
 * through pools or writes as a trace file and `tide demo` replays side by
 * side, or has a run function of its own for workloads that drive something
 * other than a pool (a graph cache, say). Generated events stream through a
 * sink in chunks, so a scenario of millions of events runs in fixed memory.
 */
#ifndef TIDEPOOL_SCENARIOS_H
#define TIDEPOOL_SCENARIOS_H

#include "tide_run.h"
#include "trace.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Every parameter any scenario takes; each scenario says which it uses. */
typedef struct scenario_params {
    uint64_t context_tokens; /* --context */
    uint64_t requests;       /* --requests */
    uint64_t steps;          /* --steps */
    uint64_t rounds;         /* --rounds */
    uint64_t minutes;        /* --minutes */
    uint64_t seed;           /* --seed */
    uint64_t hot_keys;       /* --hot */
    uint64_t cap_mib;        /* --cap-mib */
} scenario_params;

typedef enum scenario_param_id {
    SCENARIO_PARAM_CONTEXT,
    SCENARIO_PARAM_REQUESTS,
    SCENARIO_PARAM_STEPS,
    SCENARIO_PARAM_ROUNDS,
    SCENARIO_PARAM_MINUTES,
    SCENARIO_PARAM_SEED,
    SCENARIO_PARAM_HOT,
    SCENARIO_PARAM_CAP_MIB,
    SCENARIO_PARAM_COUNT_
} scenario_param_id;

#define SCENARIO_USES(id) (1u << (id))

typedef struct scenario_param_info {
    const char *option;  /* "--context" */
    const char *meaning; /* "context length in tokens" */
    size_t offset;       /* of the field in scenario_params */
    uint64_t min, max;   /* accepted values */
} scenario_param_info;

/* The table, indexed by scenario_param_id. */
extern const scenario_param_info scenario_param_table[SCENARIO_PARAM_COUNT_];

/* Where generated events go. */
typedef struct scenario_sink {
    /* Receives the next events; returns 0, or -1 to stop the generation. */
    int (*events)(void *user, const trace_event *events, size_t count);
    /* Optional: unit number `unit` (a token, a request; 1-based) starts
     * with event number events_before + 1. */
    void (*mark)(void *user, uint64_t unit, uint64_t events_before);
    void *user;
} scenario_sink;

typedef struct scenario scenario;
struct scenario {
    const char *name;
    const char *title;       /* one line: what it is, which failure mode */
    const char *description; /* a few lines for --help */
    const char *unit;        /* what mark() counts: "token", "request", "step" */
    unsigned params;         /* SCENARIO_USES(...) of the parameters it takes */
    scenario_params defaults;
    const char *device;      /* device when --device is not given; NULL: replay's default */
    uint64_t occupied_bytes; /* --occupy when not given (memory outside the pools) */
    /* Says what is wrong with the parameters, or NULL. Optional. */
    const char *(*check)(const scenario_params *params);
    /* Generates the events (NULL for scenarios with a run of their own).
     * Returns 0, or -1 when the sink stopped it or host memory ran out. */
    int (*generate)(const scenario_params *params, const scenario_sink *sink);
    /* A run of its own instead of generate-and-replay (NULL: none). Gets
     * the resolved options; returns the exit status. */
    int (*run)(const scenario *self, const scenario_params *params, const tide_run_options *options);
};

/* graph-churn's run (graph_churn.c). */
int graph_churn_run(const scenario *self, const scenario_params *params, const tide_run_options *options);

/* NULL if there is none of that name. */
const scenario *scenario_find(const char *name);
/* All scenarios, in the order of --help. */
const scenario *scenario_list(size_t *count);
/* Fills params with s's defaults. */
void scenario_defaults(const scenario *s, scenario_params *params);

/* Where each unit (token, request, ...) of a generated scenario starts. */
typedef struct scenario_unit_start {
    uint64_t unit;
    uint64_t events_before;
} scenario_unit_start;

typedef struct scenario_units {
    scenario_unit_start *starts; /* in order of events_before */
    size_t count, capacity;
} scenario_units;

/* The unit that event number `event` (1-based, as replay results count)
 * belongs to; 0 when it comes before the first unit. */
uint64_t scenario_unit_of(const scenario_units *units, uint64_t event);
void scenario_units_free(scenario_units *units);

/* Generates s and feeds every event to each of the runs; records where the
 * units start if units is not NULL. Returns 0, or -1 (host memory). */
int scenario_replay(const scenario *s, const scenario_params *params, replay_run *const *runs, size_t run_count,
                    scenario_units *units);

#endif
