/* SPDX-License-Identifier: MIT */
/*
 * check.h -- the test harness.
 *
 * Checks record a failure with its location and keep going:
 *   CHECK(cond), CHECK_MSG(cond, fmt, ...)       a condition (and a message)
 *   CHECK_TRUE(cond), CHECK_FALSE(cond)          the same, said plainly
 *   CHECK_EQ_U64(a, b) ... CHECK_GT_U64(a, b)    integers; on failure both
 *                                                sides print as unsigned long
 *                                                long (and hex)
 *   CHECK_EQ_I64(a, b) ... CHECK_GT_I64(a, b)    signed integers
 *   CHECK_EQ_PTR(a, b), CHECK_NE_PTR(a, b)       pointers, printed in hex
 *   CHECK_EQ_DBL(a, b) ... CHECK_GT_DBL(a, b)    doubles
 *   CHECK_EQ_STR(a, b), CHECK_CONTAINS(hay, s)   C strings (strcmp == 0,
 *                                                strstr != NULL)
 *   CHECK_STATUS(expr, expected), CHECK_OK(expr) tp_status, printed by name
 * Every check evaluates each argument once. The integer checks refuse
 * floating-point and pointer arguments at compile time.
 *
 * REQUIRE(cond) ends the current test at once (setup that later steps depend
 * on); outside test_main, or on a thread other than the runner's, it ends
 * the process as before.
 *
 * A suite lists its tests and hands them to the runner:
 *   static const test_case tests[] = {TEST_CASE(test_a), {"b", test_b}};
 *   int main(int argc, char **argv) { return TEST_MAIN("suite", tests, argc, argv); }
 * test_main runs every test on its own, prints "PASS name" or
 * "FAIL name (N checks)" for each, keeps going after a failure and ends with
 * the line "N passed, M failed"; it returns 0 only if every test passed.
 * Arguments after argv[0] select tests by substring of their name
 * ("--list" prints the names).
 *
 * check_report(name) remains for suites that call their tests by hand.
 */
#ifndef TIDEPOOL_TEST_CHECK_H
#define TIDEPOOL_TEST_CHECK_H

#include <setjmp.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tidepool.h"
#include "tidepool_sim.h"

#if defined(__GNUC__)
#define CHECK_UNUSED_ __attribute__((unused))
#else
#define CHECK_UNUSED_
#endif

/* Failures in the current test (reset by test_main for each test), and in
 * the whole run. Atomic: worker threads check too. */
static _Atomic int check_failures CHECK_UNUSED_;
static _Atomic int check_failures_total CHECK_UNUSED_;
/* Where REQUIRE jumps to: set on the runner's thread while a test runs. */
static _Thread_local jmp_buf *check_abort_ CHECK_UNUSED_;

static inline void check_count_failure_(void) {
    check_failures++;
    check_failures_total++;
}

/* Ends the current test (or the process outside the runner). */
static inline void check_abort_test_(void) {
    if (check_abort_) longjmp(*check_abort_, 1);
    exit(1);
}

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            check_count_failure_();                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                             \
    } while (0)

#define CHECK_TRUE(cond) CHECK(cond)
#define CHECK_FALSE(cond)                                                              \
    do {                                                                               \
        if (cond) {                                                                    \
            check_count_failure_();                                                    \
            fprintf(stderr, "%s:%d: CHECK_FALSE failed: %s\n", __FILE__, __LINE__, #cond); \
        }                                                                              \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        if (!(cond)) {                                                                \
            check_count_failure_();                                                   \
            fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

/* ---- typed comparisons ---------------------------------------------------- */

static inline void check_fail_u64_(const char *file, int line, const char *ea, const char *op, const char *eb,
                                   unsigned long long a, unsigned long long b) {
    check_count_failure_();
    fprintf(stderr, "%s:%d: CHECK failed: %s %s %s\n    left:  %llu (0x%llx)\n    right: %llu (0x%llx)\n", file,
            line, ea, op, eb, a, a, b, b);
}

static inline void check_fail_i64_(const char *file, int line, const char *ea, const char *op, const char *eb,
                                   long long a, long long b) {
    check_count_failure_();
    fprintf(stderr, "%s:%d: CHECK failed: %s %s %s\n    left:  %lld\n    right: %lld\n", file, line, ea, op, eb, a,
            b);
}

static inline void check_fail_ptr_(const char *file, int line, const char *ea, const char *op, const char *eb,
                                   const void *a, const void *b) {
    check_count_failure_();
    fprintf(stderr, "%s:%d: CHECK failed: %s %s %s\n    left:  0x%llx\n    right: 0x%llx\n", file, line, ea, op, eb,
            (unsigned long long)(size_t)a, (unsigned long long)(size_t)b);
}

static inline void check_fail_dbl_(const char *file, int line, const char *ea, const char *op, const char *eb,
                                   double a, double b) {
    check_count_failure_();
    fprintf(stderr, "%s:%d: CHECK failed: %s %s %s\n    left:  %.17g\n    right: %.17g\n", file, line, ea, op, eb, a,
            b);
}

/* Integer arguments only: a floating-point one selects a void expression,
 * which does not compile as a function argument. */
#define CHECK_INT_ARG_(x) _Generic((x), float: (void)0, double: (void)0, long double: (void)0, default: (x))

static inline unsigned long long check_u64_(unsigned long long v) { return v; }
static inline long long check_i64_(long long v) { return v; }
static inline const void *check_ptr_(const void *v) { return v; }
static inline double check_dbl_(double v) { return v; }

#define CHECK_CMP_U64_(a, op, b)                                                           \
    do {                                                                                   \
        unsigned long long check_a_ = check_u64_(CHECK_INT_ARG_(a));                       \
        unsigned long long check_b_ = check_u64_(CHECK_INT_ARG_(b));                       \
        if (!(check_a_ op check_b_)) check_fail_u64_(__FILE__, __LINE__, #a, #op, #b, check_a_, check_b_); \
    } while (0)

#define CHECK_CMP_I64_(a, op, b)                                                           \
    do {                                                                                   \
        long long check_a_ = check_i64_(CHECK_INT_ARG_(a));                                \
        long long check_b_ = check_i64_(CHECK_INT_ARG_(b));                                \
        if (!(check_a_ op check_b_)) check_fail_i64_(__FILE__, __LINE__, #a, #op, #b, check_a_, check_b_); \
    } while (0)

#define CHECK_CMP_PTR_(a, op, b)                                                           \
    do {                                                                                   \
        const void *check_a_ = check_ptr_(a);                                              \
        const void *check_b_ = check_ptr_(b);                                              \
        if (!(check_a_ op check_b_)) check_fail_ptr_(__FILE__, __LINE__, #a, #op, #b, check_a_, check_b_); \
    } while (0)

#define CHECK_CMP_DBL_(a, op, b)                                                           \
    do {                                                                                   \
        double check_a_ = check_dbl_(a);                                                   \
        double check_b_ = check_dbl_(b);                                                   \
        if (!(check_a_ op check_b_)) check_fail_dbl_(__FILE__, __LINE__, #a, #op, #b, check_a_, check_b_); \
    } while (0)

#define CHECK_EQ_U64(a, b) CHECK_CMP_U64_(a, ==, b)
#define CHECK_NE_U64(a, b) CHECK_CMP_U64_(a, !=, b)
#define CHECK_LE_U64(a, b) CHECK_CMP_U64_(a, <=, b)
#define CHECK_LT_U64(a, b) CHECK_CMP_U64_(a, <, b)
#define CHECK_GE_U64(a, b) CHECK_CMP_U64_(a, >=, b)
#define CHECK_GT_U64(a, b) CHECK_CMP_U64_(a, >, b)

#define CHECK_EQ_I64(a, b) CHECK_CMP_I64_(a, ==, b)
#define CHECK_NE_I64(a, b) CHECK_CMP_I64_(a, !=, b)
#define CHECK_LE_I64(a, b) CHECK_CMP_I64_(a, <=, b)
#define CHECK_LT_I64(a, b) CHECK_CMP_I64_(a, <, b)
#define CHECK_GE_I64(a, b) CHECK_CMP_I64_(a, >=, b)
#define CHECK_GT_I64(a, b) CHECK_CMP_I64_(a, >, b)

#define CHECK_EQ_PTR(a, b) CHECK_CMP_PTR_(a, ==, b)
#define CHECK_NE_PTR(a, b) CHECK_CMP_PTR_(a, !=, b)

#define CHECK_EQ_DBL(a, b) CHECK_CMP_DBL_(a, ==, b)
#define CHECK_NE_DBL(a, b) CHECK_CMP_DBL_(a, !=, b)
#define CHECK_LE_DBL(a, b) CHECK_CMP_DBL_(a, <=, b)
#define CHECK_LT_DBL(a, b) CHECK_CMP_DBL_(a, <, b)
#define CHECK_GE_DBL(a, b) CHECK_CMP_DBL_(a, >=, b)
#define CHECK_GT_DBL(a, b) CHECK_CMP_DBL_(a, >, b)

static inline void check_str_(const char *file, int line, const char *ea, const char *eb, const char *a,
                              const char *b, bool contains) {
    bool ok = a && b && (contains ? strstr(a, b) != NULL : strcmp(a, b) == 0);
    if (ok) return;
    check_count_failure_();
    fprintf(stderr, "%s:%d: CHECK failed: %s %s %s\n    left:  \"%s\"\n    right: \"%s\"\n", file, line, ea,
            contains ? "contains" : "==", eb, a ? a : "(null)", b ? b : "(null)");
}

/* strcmp(a, b) == 0, with both strings printed when they differ. */
#define CHECK_EQ_STR(a, b) check_str_(__FILE__, __LINE__, #a, #b, (a), (b), false)
/* strstr(haystack, needle) != NULL, with both printed when it is not. */
#define CHECK_CONTAINS(haystack, needle) check_str_(__FILE__, __LINE__, #haystack, #needle, (haystack), (needle), true)

/* A status comparison that prints both names when it fails. */
#define CHECK_STATUS(expr, expected)                                                          \
    do {                                                                                      \
        tp_status check_got_ = (expr);                                                        \
        tp_status check_want_ = (expected);                                                   \
        if (check_got_ != check_want_) {                                                      \
            check_count_failure_();                                                           \
            fprintf(stderr, "%s:%d: %s returned %s, expected %s\n", __FILE__, __LINE__, #expr, \
                    tp_status_name(check_got_), tp_status_name(check_want_));                 \
        }                                                                                     \
    } while (0)

#define CHECK_OK(expr) CHECK_STATUS(expr, TP_OK)

/* Stops the current test at once (for setup that later steps depend on). */
#define REQUIRE(cond)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            check_count_failure_();                                                     \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            check_abort_test_();                                                        \
        }                                                                               \
    } while (0)

/* REQUIRE for a status: prints its name. */
#define REQUIRE_OK(expr)                                                                          \
    do {                                                                                          \
        tp_status check_got_ = (expr);                                                            \
        if (check_got_ != TP_OK) {                                                                \
            check_count_failure_();                                                               \
            fprintf(stderr, "%s:%d: REQUIRE failed: %s returned %s\n", __FILE__, __LINE__, #expr, \
                    tp_status_name(check_got_));                                                  \
            check_abort_test_();                                                                  \
        }                                                                                         \
    } while (0)

/* ---- the runner ----------------------------------------------------------- */

typedef struct test_case {
    const char *name;
    void (*fn)(void);
} test_case;

#define TEST_CASE(fn) {#fn, fn}
#define TEST_COUNT(tests) (sizeof(tests) / sizeof *(tests))
#define TEST_MAIN(suite, tests, argc, argv) test_main((suite), (tests), TEST_COUNT(tests), (argc), (argv))

static inline bool test_selected_(const char *name, int argc, char **argv) {
    bool any_filter = false;
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] == '-') continue;
        any_filter = true;
        if (strstr(name, argv[i])) return true;
    }
    return !any_filter;
}

/* Runs tests[0..count) that argv selects (arguments after argv[0]: name
 * substrings; none: all), each on its own. Returns the exit status. */
static inline int test_main(const char *suite, const test_case *tests, size_t count, int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            for (size_t t = 0; t < count; t++) printf("%s\n", tests[t].name);
            return 0;
        }
    }
    printf("%s: %zu test%s\n", suite, count, count == 1 ? "" : "s");
    int passed = 0, failed = 0;
    for (size_t t = 0; t < count; t++) {
        if (!test_selected_(tests[t].name, argc, argv)) continue;
        fflush(stdout);
        check_failures = 0;
        jmp_buf env;
        volatile bool aborted = false;
        if (setjmp(env) == 0) {
            check_abort_ = &env;
            tests[t].fn();
        } else {
            aborted = true;
        }
        check_abort_ = NULL;
        int n = check_failures;
        fflush(stderr);
        if (n == 0) {
            printf("PASS %s\n", tests[t].name);
            passed++;
        } else {
            printf("FAIL %s (%d check%s%s)\n", tests[t].name, n, n == 1 ? "" : "s",
                   aborted ? ", stopped by REQUIRE" : "");
            failed++;
        }
        fflush(stdout);
    }
    if (passed + failed == 0) fprintf(stderr, "%s: no test matches the arguments\n", suite);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 && passed > 0 ? 0 : 1;
}

/* For suites that call their tests by hand: reports every failure so far. */
static inline int check_report(const char *name) {
    int failures = check_failures_total;
    if (failures) {
        fprintf(stderr, "%s: %d check(s) failed\n", name, failures);
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
