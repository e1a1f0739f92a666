/*
 * check.h -- the test harness: CHECK records a failure with its location
 * and keeps going; a test's main returns check_report().
 */
#ifndef TIDEPOOL_TEST_CHECK_H
#define TIDEPOOL_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "tidepool.h"
#include "tidepool_sim.h"

static int check_failures;

#define CHECK(cond)                                                               \
    do {                                                                          \
        if (!(cond)) {                                                            \
            check_failures++;                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                         \
    } while (0)

#define CHECK_MSG(cond, ...)                                                      \
    do {                                                                          \
        if (!(cond)) {                                                            \
            check_failures++;                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                         \
            fputc('\n', stderr);                                                  \
        }                                                                         \
    } while (0)

/* A status comparison that prints both names when it fails. */
#define CHECK_STATUS(expr, expected)                                              \
    do {                                                                          \
        tp_status check_got_ = (expr);                                            \
        if (check_got_ != (expected)) {                                           \
            check_failures++;                                                     \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr, \
                    tp_status_name(check_got_), tp_status_name(expected));        \
        }                                                                         \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, TP_OK)

/* Stops the test at once (for setup that later steps depend on). */
#define REQUIRE(cond)                                                             \
    do {                                                                          \
        if (!(cond)) {                                                            \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                              \
        }                                                                         \
    } while (0)

static inline int check_report(const char *name) {
    if (check_failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, check_failures);
        return 1;
    }
    printf("%s: all checks passed\n", name);
    return 0;
}

/* Deterministic generator for randomized tests (splitmix64). */
typedef struct test_rng {
    unsigned long long state;
} test_rng;

static inline unsigned long long rng_next(test_rng *r) {
    unsigned long long z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
/* Uniform in [0, n). */
static inline unsigned long long rng_below(test_rng *r, unsigned long long n) { return n ? rng_next(r) % n : 0; }
/* Log-uniform in [lo, hi]. */
static inline unsigned long long rng_log_uniform(test_rng *r, unsigned long long lo, unsigned long long hi) {
    int lo_bits = 63 - __builtin_clzll(lo), hi_bits = 63 - __builtin_clzll(hi);
    int bits = lo_bits + (int)rng_below(r, (unsigned long long)(hi_bits - lo_bits + 1));
    unsigned long long base = 1ull << bits;
    unsigned long long v = base + rng_below(r, base);
    return v < lo ? lo : v > hi ? hi : v;
}

/* A log callback that counts messages at WARN and above (and prints them
 * when TP_TEST_VERBOSE is set). */
typedef struct test_log {
    int warnings;
    int errors;
} test_log;

static inline void test_log_fn(void *user, tp_log_level level, const char *message) {
    test_log *log = user;
    if (level >= TP_LOG_WARN) log->warnings++;
    if (level >= TP_LOG_ERROR) log->errors++;
    if (getenv("TP_TEST_VERBOSE")) fprintf(stderr, "[log %d] %s\n", (int)level, message);
}

#define TEST_MiB (1024ull * 1024ull)
#define TEST_GiB (1024ull * TEST_MiB)

#endif
