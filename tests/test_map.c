/* SPDX-License-Identifier: MIT */
/* The one internal hash map (common/tpi_map.h), against a reference model:
 * random puts, replacements and removals over a small key space (so keys
 * collide and probe runs form), the key that marks empty slots, growth and
 * shrinking, iteration and a host allocator that fails. */
#include "check.h"
#include "tpi_map.h"

#include <stdint.h>

enum { KEYS = 512 };

/* Keys that share home slots and the reserved empty-slot key. */
static uint64_t key_of(unsigned i) { return i == 0 ? TPI_MAP_EMPTY : (uint64_t)i << 21; }

static void test_map_matches_a_reference_model(void) {
    tpi_map m;
    tpi_map_init(&m, NULL);
    uint64_t model[KEYS];
    bool present[KEYS] = {false};
    size_t count = 0;
    test_rng rng = {7};
    for (int op = 0; op < 200000; op++) {
        unsigned i = (unsigned)rng_below(&rng, KEYS);
        /* phases: mostly inserting, then mostly removing (shrinks the table) */
        bool inserting = (op / 20000) % 2 == 0 ? rng_below(&rng, 4) != 0 : rng_below(&rng, 4) == 0;
        if (inserting) {
            uint64_t v = rng_next(&rng);
            CHECK(tpi_map_put(&m, key_of(i), v));
            if (!present[i]) count++;
            present[i] = true;
            model[i] = v;
        } else {
            uint64_t got = 0;
            bool removed = tpi_map_remove(&m, key_of(i), &got);
            CHECK_EQ_U64(removed, present[i]);
            if (present[i]) CHECK_EQ_U64(got, model[i]);
            if (present[i]) count--;
            present[i] = false;
        }
        if (op % 997 == 0) {
            for (unsigned k = 0; k < KEYS; k++) {
                uint64_t v = 0;
                bool found = tpi_map_get(&m, key_of(k), &v);
                CHECK_EQ_U64(found, present[k]);
                if (found && present[k]) CHECK_EQ_U64(v, model[k]);
            }
            CHECK_EQ_U64(m.count, count);
            CHECK(m.capacity == 0 || m.count * 2 <= m.capacity);
        }
    }
    size_t cursor = 0, seen = 0;
    uint64_t key, value;
    while (tpi_map_next(&m, &cursor, &key, &value)) {
        unsigned i = key == TPI_MAP_EMPTY ? 0 : (unsigned)(key >> 21);
        CHECK_LT_U64(i, KEYS);
        if (i < KEYS) {
            CHECK(present[i]);
            if (present[i]) CHECK_EQ_U64(model[i], value);
        }
        seen++;
    }
    CHECK_EQ_U64(seen, count);
    tpi_map_destroy(&m);
}

static void test_map_shrinks_when_emptied(void) {
    tpi_map m;
    tpi_map_init(&m, NULL);
    for (uint64_t k = 1; k <= 100000; k++) CHECK(tpi_map_put(&m, k * 256, k));
    size_t grown = m.capacity;
    CHECK_GE_U64(grown, 200000);
    for (uint64_t k = 1; k <= 100000; k++) CHECK(tpi_map_remove(&m, k * 256, NULL));
    CHECK_EQ_U64(m.count, 0);
    CHECK_LE_U64(m.capacity, TPI_MAP_MIN_CAPACITY * 2);
    CHECK(!tpi_map_remove(&m, 256, NULL));
    tpi_map_destroy(&m);
}

static int failing_allowed;
static void *failing_alloc(void *user, size_t bytes) {
    (void)user;
    if (failing_allowed-- <= 0) return NULL;
    return malloc(bytes);
}

static void test_map_survives_host_out_of_memory(void) {
    tp_host_allocator failing = tpi_map_libc_allocator;
    failing.alloc = failing_alloc;
    failing_allowed = 1;
    tpi_map m;
    tpi_map_init(&m, &failing);
    size_t stored = 0;
    for (uint64_t k = 1; k <= 1000; k++)
        if (tpi_map_put(&m, k, k)) stored++;
    CHECK_EQ_U64(stored, TPI_MAP_MIN_CAPACITY / 2); /* the first table, then no room */
    CHECK_EQ_U64(m.count, stored);
    for (uint64_t k = 1; k <= stored; k++) {
        uint64_t v = 0;
        CHECK(tpi_map_get(&m, k, &v));
        CHECK_EQ_U64(v, k);
    }
    tpi_map_destroy(&m);
}

static void test_map_spreads_keys_aligned_to_large_powers_of_two(void) {
    /* 1 GiB-aligned keys: a hash that kept low bits would pile them up. */
    tpi_map m;
    tpi_map_init(&m, NULL);
    for (uint64_t k = 1; k <= 4096; k++) CHECK(tpi_map_put(&m, k << 30, k));
    size_t longest = 0, run = 0;
    for (size_t i = 0; i < m.capacity; i++) {
        run = m.entries[i].key == TPI_MAP_EMPTY ? 0 : run + 1;
        if (run > longest) longest = run;
    }
    CHECK_LT_U64(longest, 64);
    tpi_map_destroy(&m);
}

static const test_case tests[] = {
    TEST_CASE(test_map_matches_a_reference_model),
    TEST_CASE(test_map_shrinks_when_emptied),
    TEST_CASE(test_map_survives_host_out_of_memory),
    TEST_CASE(test_map_spreads_keys_aligned_to_large_powers_of_two),
};

int main(int argc, char **argv) { return TEST_MAIN("test_map", tests, argc, argv); }
