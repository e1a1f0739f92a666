/* Range allocator: splitting, coalescing, bins, good fit, tags, and a
 * randomized run against a reference model with the checker after every
 * operation. */
#include "check.h"
#include "range_alloc.h"

#include <string.h>

static tp_host host;

static void check_ra(tp_ra *ra) {
    char msg[256] = "";
    bool ok = tp_ra_check(ra, msg, sizeof msg);
    CHECK_MSG(ok, "%s", msg);
}

static void test_bins(void) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    /* Bins are monotone in size and each bin spans at most 1/16 of its
     * lower bound above 16 units. */
    uint32_t prev = 0;
    for (uint64_t units = 1; units < (1ull << 40); units = units * 17 / 16 + 1) {
        uint32_t bin = tp_ra_bin_floor(&ra, units << 8);
        CHECK(bin >= prev);
        uint64_t lower = tp_ra_bin_lower_bound(&ra, bin);
        CHECK(lower <= (units << 8));
        uint64_t next_lower = tp_ra_bin_lower_bound(&ra, bin + 1);
        CHECK(next_lower > (units << 8));
        if (units >= 16) CHECK((next_lower - lower) * 16 <= lower);
        prev = bin;
    }
    tp_ra_destroy(&ra);
}

static void test_split_coalesce(void) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    tp_tag clean = {RA_TAG_CLEAN, 0};
    uint32_t region = tp_ra_add_region(&ra, 0x10000, 1 << 20, 7, clean);
    REQUIRE(region != RA_NONE);
    uint32_t a = tp_ra_find(&ra, 4096, NULL, NULL, 16, NULL);
    REQUIRE(a != RA_NONE);
    a = tp_ra_take(&ra, a, 4096);
    CHECK(tp_ra_node_at(&ra, a)->offset == 0x10000); /* cut from the start */
    CHECK(tp_ra_node_at(&ra, a)->unit == 7);
    uint32_t b = tp_ra_take(&ra, tp_ra_find(&ra, 8192, NULL, NULL, 16, NULL), 8192);
    uint32_t c = tp_ra_take(&ra, tp_ra_find(&ra, 256, NULL, NULL, 16, NULL), 256);
    CHECK(tp_ra_node_at(&ra, b)->offset == 0x10000 + 4096);
    CHECK(tp_ra_node_at(&ra, c)->offset == 0x10000 + 4096 + 8192);
    CHECK(ra.used_count == 3 && ra.free_count == 1);
    CHECK(ra.free_bytes == (1 << 20) - 4096 - 8192 - 256);
    check_ra(&ra);
    /* Free the middle, then its neighbours: everything merges back. */
    tp_ra_release(&ra, b, clean);
    CHECK(ra.free_count == 2);
    check_ra(&ra);
    tp_ra_release(&ra, a, clean);
    CHECK(ra.free_count == 2); /* a+b merged */
    uint32_t whole = tp_ra_release(&ra, c, clean);
    CHECK(ra.free_count == 1 && ra.used_count == 0);
    CHECK(tp_ra_node_at(&ra, whole)->size == 1 << 20);
    CHECK(tp_ra_largest_free(&ra) == 1 << 20);
    check_ra(&ra);
    tp_ra_remove_region(&ra, whole);
    CHECK(ra.free_count == 0 && ra.free_bytes == 0);
    check_ra(&ra);
    tp_ra_destroy(&ra);
}

static void test_regions_do_not_merge(void) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    tp_tag clean = {RA_TAG_CLEAN, 0};
    /* Two adjacent regions stay two ranges. */
    tp_ra_add_region(&ra, 0, 4096, 1, clean);
    tp_ra_add_region(&ra, 4096, 4096, 2, clean);
    CHECK(ra.free_count == 2);
    CHECK(tp_ra_find(&ra, 8192, NULL, NULL, 16, NULL) == RA_NONE);
    check_ra(&ra);
    tp_ra_destroy(&ra);
}

static void test_good_fit(void) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    tp_tag clean = {RA_TAG_CLEAN, 0};
    tp_ra_add_region(&ra, 0, 64 << 20, 1, clean);
    tp_ra_add_region(&ra, 1ull << 32, 1 << 20, 2, clean);
    tp_ra_add_region(&ra, 2ull << 32, 3 << 20, 3, clean);
    /* 900 KiB fits all; the 1 MiB region is the best fit. */
    uint32_t id = tp_ra_find(&ra, 900 << 10, NULL, NULL, 16, NULL);
    REQUIRE(id != RA_NONE);
    CHECK(tp_ra_node_at(&ra, id)->unit == 2);
    /* 2 MiB: the 3 MiB region. */
    id = tp_ra_find(&ra, 2 << 20, NULL, NULL, 16, NULL);
    CHECK(id != RA_NONE && tp_ra_node_at(&ra, id)->unit == 3);
    /* Larger than everything. */
    CHECK(tp_ra_find(&ra, 65 << 20, NULL, NULL, 16, NULL) == RA_NONE);
    tp_ra_destroy(&ra);
}

static bool reject_unit2(void *ctx, tp_ra *ra, uint32_t id) {
    (void)ctx;
    return tp_ra_node_at(ra, id)->unit != 2;
}

static void test_filter_and_tags(void) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    tp_ra_add_region(&ra, 0, 8 << 20, 1, (tp_tag){RA_TAG_CLEAN, 0});
    tp_ra_add_region(&ra, 1ull << 32, 1 << 20, 2, (tp_tag){RA_TAG_CLEAN, 0});
    uint32_t rejected = RA_NONE;
    uint32_t id = tp_ra_find(&ra, 4096, reject_unit2, NULL, 16, &rejected);
    CHECK(id != RA_NONE && tp_ra_node_at(&ra, id)->unit == 1);
    /* Tags merge: same stream keeps the later epoch, two streams make MULTI. */
    tp_tag a = {3, 5}, b = {3, 9}, c = {4, 1};
    tp_tag ab = tp_ra_merge_tags(a, b, 77);
    CHECK(ab.slot == 3 && ab.epoch == 9);
    tp_tag ac = tp_ra_merge_tags(a, c, 77);
    CHECK(ac.slot == RA_TAG_MULTI && ac.epoch == 77);
    CHECK(tp_ra_merge_tags((tp_tag){RA_TAG_CLEAN, 0}, c, 1).slot == 4);
    tp_tag m = tp_ra_merge_tags((tp_tag){RA_TAG_MULTI, 99}, a, 10);
    CHECK(m.slot == RA_TAG_MULTI && m.epoch == 99);
    /* Coalescing applies the merge. */
    uint32_t x = tp_ra_take(&ra, tp_ra_find(&ra, 4096, reject_unit2, NULL, 16, NULL), 4096);
    uint32_t y = tp_ra_take(&ra, tp_ra_find(&ra, 4096, reject_unit2, NULL, 16, NULL), 4096);
    ra.multi_epoch = 42;
    tp_ra_release(&ra, x, (tp_tag){5, 1});
    uint32_t merged = tp_ra_release(&ra, y, (tp_tag){6, 1});
    CHECK(tp_ra_node_at(&ra, merged)->tag.slot == RA_TAG_MULTI);
    CHECK(tp_ra_node_at(&ra, merged)->tag.epoch == 42);
    check_ra(&ra);
    tp_ra_destroy(&ra);
}

/* Reference model: a byte map at 256-byte granularity of a 4 MiB region
 * (0 = free, else the owning block's id), checked against the allocator. */
#define MODEL_UNITS (4u << 20 >> 8)

static void test_random_against_model(unsigned long long seed) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    static uint32_t owner[MODEL_UNITS];
    memset(owner, 0, sizeof owner);
    const uint64_t base = 1ull << 40;
    tp_ra_add_region(&ra, base, (uint64_t)MODEL_UNITS << 8, 1, (tp_tag){RA_TAG_CLEAN, 0});
    uint32_t live[512];
    size_t live_count = 0;
    test_rng rng = {seed};
    uint64_t used_bytes = 0;
    for (int op = 0; op < 20000; op++) {
        if (live_count < 512 && (live_count == 0 || rng_below(&rng, 100) < 55)) {
            uint64_t size = rng_log_uniform(&rng, 1, 256 << 10);
            size = (size + 255) & ~255ull;
            uint32_t id = tp_ra_find(&ra, size, NULL, NULL, 16, NULL);
            /* The model says whether any free run of that length exists at
             * all; TLSF good fit may miss a fit only within one bin's span. */
            if (id == RA_NONE) continue;
            id = tp_ra_take(&ra, id, size);
            REQUIRE(id != RA_NONE);
            tp_ra_node *n = tp_ra_node_at(&ra, id);
            CHECK(n->size == size);
            for (uint64_t u = (n->offset - base) >> 8; u < (n->offset - base + size) >> 8; u++) {
                CHECK_MSG(owner[u] == 0, "overlap at unit %llu", (unsigned long long)u);
                owner[u] = id + 1;
            }
            used_bytes += size;
            live[live_count++] = id;
        } else {
            size_t k = rng_below(&rng, live_count);
            uint32_t id = live[k];
            tp_ra_node *n = tp_ra_node_at(&ra, id);
            for (uint64_t u = (n->offset - base) >> 8; u < (n->offset - base + n->size) >> 8; u++) {
                CHECK(owner[u] == id + 1);
                owner[u] = 0;
            }
            used_bytes -= n->size;
            tp_ra_release(&ra, id, (tp_tag){RA_TAG_CLEAN, 0});
            live[k] = live[--live_count];
        }
        CHECK(ra.free_bytes + used_bytes == (uint64_t)MODEL_UNITS << 8);
        if (op % 97 == 0) check_ra(&ra);
        if (check_failures > 20) break;
    }
    /* Free everything: one range again. */
    while (live_count) tp_ra_release(&ra, live[--live_count], (tp_tag){RA_TAG_CLEAN, 0});
    CHECK(ra.free_count == 1);
    check_ra(&ra);
    tp_ra_destroy(&ra);
}

static void test_checker_catches_corruption(void) {
    tp_ra ra;
    REQUIRE(tp_ra_init(&ra, &host, 256) == TP_OK);
    tp_ra_add_region(&ra, 0, 1 << 20, 1, (tp_tag){RA_TAG_CLEAN, 0});
    uint32_t a = tp_ra_take(&ra, tp_ra_find(&ra, 4096, NULL, NULL, 16, NULL), 4096);
    check_ra(&ra);
    char msg[128];
    tp_ra_node_at(&ra, a)->size += 256; /* overlap with the next range */
    CHECK(!tp_ra_check(&ra, msg, sizeof msg));
    tp_ra_node_at(&ra, a)->size -= 256;
    ra.free_bytes += 1;
    CHECK(!tp_ra_check(&ra, msg, sizeof msg));
    ra.free_bytes -= 1;
    ra.sl_bitmap[0] ^= 1; /* a bitmap bit without a list */
    CHECK(!tp_ra_check(&ra, msg, sizeof msg));
    ra.sl_bitmap[0] ^= 1;
    check_ra(&ra);
    tp_ra_destroy(&ra);
}

int main(void) {
    tp_host_init(&host, NULL);
    test_bins();
    test_split_coalesce();
    test_regions_do_not_merge();
    test_good_fit();
    test_filter_and_tags();
    for (unsigned long long seed = 1; seed <= 4; seed++) test_random_against_model(seed);
    test_checker_catches_corruption();
    return check_report("test_range_alloc");
}
