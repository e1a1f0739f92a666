/* SPDX-License-Identifier: MIT */
/*
 * fixture.h -- the shared test fixture: a simulated device with a counting
 * log, and a pool on it that checks its invariants after every operation.
 *
 *   fixture f;
 *   fixture_open(&f, "sim:1GiB", TP_POOL_VMM, NULL);   device + pool
 *   ...
 *   fixture_close(&f);
 *
 * fixture_close checks what every test must leave behind: the pool's
 * invariants hold, nothing was logged at ERROR (a test that provokes errors
 * on purpose counts them itself and sets f.log.errors back to 0), the pool
 * gave every byte back to the device once destroyed, and the simulator saw
 * no hazard (exactly f.hazards_expected, for a test that provokes them) and
 * no access to memory that was not there. Then it closes the device.
 *
 * Tests over both pool kinds: write `static void name(tp_pool_kind kind)`,
 * then KIND_TEST(name) defines name_vmm and name_segment, and
 * KIND_CASES(name) lists both in a test_case table.
 */
#ifndef TIDEPOOL_TEST_FIXTURE_H
#define TIDEPOOL_TEST_FIXTURE_H

#include "check.h"

#include <string.h>

typedef struct fixture {
    tp_device *dev;
    tp_pool *pool; /* NULL after fixture_open_device */
    tp_pool_kind kind;
    test_log log;
    uint64_t hazards_expected; /* the simulator's hazards fixture_close expects (0 unless a test sets it) */
} fixture;

static inline const char *kind_name(tp_pool_kind k) {
    return k == TP_POOL_VMM ? "vmm" : k == TP_POOL_SEGMENT ? "segment" : "auto";
}

/* Opens the simulated device spec with the counting log (at the library's
 * default level) and nothing else. */
static inline void fixture_open_device(fixture *f, const char *spec) {
    memset(f, 0, sizeof *f);
    tp_device_config cfg = {.log = test_log_fn, .log_user = &f->log};
    tp_status st = tp_device_open(spec, &cfg, &f->dev);
    if (st != TP_OK) fprintf(stderr, "fixture: tp_device_open(\"%s\"): %s\n", spec, tp_status_name(st));
    REQUIRE(st == TP_OK);
}

/* Opens spec and a pool of the given kind on it, configured by extra (when
 * given); check_invariants adds TP_POOL_FLAG_CHECK_INVARIANTS (which makes
 * every operation walk the whole pool: too slow for the long scenarios,
 * which keep their own flags). */
static inline void fixture_open_with(fixture *f, const char *spec, tp_pool_kind kind, const tp_pool_config *extra,
                                     bool check_invariants) {
    fixture_open_device(f, spec);
    f->kind = kind;
    tp_pool_config pc = extra ? *extra : (tp_pool_config){0};
    pc.kind = kind;
    if (check_invariants) pc.flags |= TP_POOL_FLAG_CHECK_INVARIANTS;
    tp_status st = tp_pool_create(f->dev, &pc, &f->pool);
    if (st != TP_OK) fprintf(stderr, "fixture: tp_pool_create(%s): %s\n", kind_name(kind), tp_status_name(st));
    REQUIRE(st == TP_OK);
}

/* The usual fixture: the pool checks its invariants after every operation. */
static inline void fixture_open(fixture *f, const char *spec, tp_pool_kind kind, const tp_pool_config *extra) {
    fixture_open_with(f, spec, kind, extra, true);
}

/* Checks the pool, destroys it, checks the device for leaks and hazards and
 * closes it. */
static inline void fixture_close(fixture *f) {
    const char *kind = f->pool ? kind_name(f->kind) : "device";
    if (f->pool) {
        char msg[256] = "";
        tp_status st = tp_pool_check(f->pool, msg, sizeof msg);
        CHECK_MSG(st == TP_OK, "%s pool invariant: %s", kind, msg);
        CHECK_OK(tp_pool_destroy(f->pool));
        f->pool = NULL;
    }
    CHECK_MSG(f->log.errors == 0, "%s: %d error(s) logged", kind, f->log.errors);
    tp_sim_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(tp_sim_get_counters(f->dev, &c));
    CHECK_MSG(c.physical_used_bytes == 0, "%s: device memory leaked: %llu bytes", kind,
              (unsigned long long)c.physical_used_bytes);
    CHECK_MSG(c.hazards == f->hazards_expected, "%s: %llu hazards, expected %llu (handout %llu unmap %llu free %llu)",
              kind, (unsigned long long)c.hazards, (unsigned long long)f->hazards_expected,
              (unsigned long long)c.hazards_handout, (unsigned long long)c.hazards_unmap,
              (unsigned long long)c.hazards_free);
    CHECK_MSG(c.invalid_accesses == 0, "%s: %llu invalid accesses", kind, (unsigned long long)c.invalid_accesses);
    CHECK_OK(tp_device_close(f->dev));
    f->dev = NULL;
}

/* name_vmm and name_segment, running name(kind). */
#define KIND_TEST(name)                                  \
    static void name##_vmm(void) { name(TP_POOL_VMM); } \
    static void name##_segment(void) { name(TP_POOL_SEGMENT); }
#define KIND_CASES(name) {#name "_vmm", name##_vmm}, {#name "_segment", name##_segment}

#endif
