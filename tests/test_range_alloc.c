/* SPDX-License-Identifier: MIT */
/* Range allocator, on its own (no pool): splitting, coalescing, bins, good
 * fit, the owner word and its merge hook, and a randomized run against a
 * reference model with the checker after every operation. */
#include "check.h"
#include "range_alloc.h"

#include <string.h>

static tpi_host host;

/* The owner word in these tests: bit flags, merged by OR. */
static uint64_t merge_or(void *ctx, uint64_t a, uint64_t b) {
    (*(int *)ctx)++;
    return a | b;
}
static int merges;

static tp_status ra_open(tpi_ra *ra) { return tpi_ra_init(ra, &host, 256, merge_or, &merges); }

/* The first candidate of a good-fit search that accept (NULL: any) takes,
 * among the first 16. */
static uint32_t find(tpi_ra *ra, uint64_t size, bool (*accept)(tpi_ra *, uint32_t)) {
    tpi_ra_search search;
    tpi_ra_search_begin(ra, size, &search);
    for (int seen = 0; seen < 16; seen++) {
        uint32_t id = tpi_ra_search_next(ra, &search);
        if (id == TPI_RA_NONE || !accept || accept(ra, id)) return id;
    }
    return TPI_RA_NONE;
}

static void check_ra(tpi_ra *ra) {
    char msg[256] = "";
    bool ok = tpi_ra_check(ra, msg, sizeof msg);
    CHECK_MSG(ok, "%s", msg);
}

/* The bin of a size in units as the header defines it, written plainly:
 * below SL_COUNT units the count itself; from there the first level (the
 * msb above SL_BITS) times SL_COUNT plus the SL_BITS bits below the msb. */
static uint32_t reference_bin(uint64_t units) {
    if (units < TPI_RA_SL_COUNT) return (uint32_t)units;
    unsigned msb = 63u - (unsigned)__builtin_clzll(units);
    uint32_t fl = msb - TPI_RA_SL_BITS + 1, sl = (uint32_t)(units >> (msb - TPI_RA_SL_BITS)) & (TPI_RA_SL_COUNT - 1);
    return fl * TPI_RA_SL_COUNT + sl;
}

static void test_bins(void) {
    /* The computed bin against the definition: every size up to 2^16
     * units, and around every power of two above. */
    for (uint64_t units = 0; units <= (1u << 16); units++) CHECK(tpi_ra_bin_of_units(units) == reference_bin(units));
    for (unsigned bit = 16; bit < 64; bit++)
        for (int delta = -2; delta <= 2; delta++) {
            uint64_t units = (1ull << bit) + (uint64_t)(int64_t)delta;
            CHECK_MSG(tpi_ra_bin_of_units(units) == reference_bin(units), "units %llu", (unsigned long long)units);
        }
    CHECK(tpi_ra_bin_of_units(UINT64_MAX) == reference_bin(UINT64_MAX));
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    /* Bins are monotone in size and each bin spans at most 1/16 of its
     * lower bound above 16 units. */
    uint32_t prev = 0;
    for (uint64_t units = 1; units < (1ull << 40); units = units * 17 / 16 + 1) {
        uint32_t bin = tpi_ra_bin_floor(&ra, units << 8);
        CHECK(bin >= prev);
        uint64_t lower = tpi_ra_bin_lower_bound(&ra, bin);
        CHECK(lower <= (units << 8));
        uint64_t next_lower = tpi_ra_bin_lower_bound(&ra, bin + 1);
        CHECK(next_lower > (units << 8));
        if (units >= 16) CHECK((next_lower - lower) * 16 <= lower);
        prev = bin;
    }
    tpi_ra_destroy(&ra);
}

static void test_split_coalesce(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    uint32_t region = tpi_ra_add_region(&ra, 0x10000, 1 << 20, 7, 0);
    REQUIRE(region != TPI_RA_NONE);
    uint32_t a = find(&ra, 4096, NULL);
    REQUIRE(a != TPI_RA_NONE);
    a = tpi_ra_take(&ra, a, 4096);
    CHECK(tpi_ra_node_at(&ra, a)->offset == 0x10000); /* cut from the start */
    CHECK(tpi_ra_node_at(&ra, a)->region == 7);
    uint32_t b = tpi_ra_take(&ra, find(&ra, 8192, NULL), 8192);
    uint32_t c = tpi_ra_take(&ra, find(&ra, 256, NULL), 256);
    CHECK(tpi_ra_node_at(&ra, b)->offset == 0x10000 + 4096);
    CHECK(tpi_ra_node_at(&ra, c)->offset == 0x10000 + 4096 + 8192);
    CHECK(ra.used_count == 3 && ra.free_count == 1);
    CHECK(ra.free_bytes == (1 << 20) - 4096 - 8192 - 256);
    check_ra(&ra);
    /* Free the middle, then its neighbours: everything merges back. */
    tpi_ra_release(&ra, b);
    CHECK(ra.free_count == 2);
    check_ra(&ra);
    tpi_ra_release(&ra, a);
    CHECK(ra.free_count == 2); /* a+b merged */
    uint32_t whole = tpi_ra_release(&ra, c);
    CHECK(ra.free_count == 1 && ra.used_count == 0);
    CHECK(tpi_ra_node_at(&ra, whole)->size == 1 << 20);
    CHECK(tpi_ra_largest_free(&ra) == 1 << 20);
    check_ra(&ra);
    tpi_ra_remove_region(&ra, whole);
    CHECK(ra.free_count == 0 && ra.free_bytes == 0);
    check_ra(&ra);
    tpi_ra_destroy(&ra);
}

static void test_regions_do_not_merge(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    /* Two adjacent regions stay two ranges. */
    tpi_ra_add_region(&ra, 0, 4096, 1, 0);
    tpi_ra_add_region(&ra, 4096, 4096, 2, 0);
    CHECK(ra.free_count == 2);
    CHECK(find(&ra, 8192, NULL) == TPI_RA_NONE);
    check_ra(&ra);
    tpi_ra_destroy(&ra);
}

static void test_good_fit(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    tpi_ra_add_region(&ra, 0, 64 << 20, 1, 0);
    tpi_ra_add_region(&ra, 1ull << 32, 1 << 20, 2, 0);
    tpi_ra_add_region(&ra, 2ull << 32, 3 << 20, 3, 0);
    /* 900 KiB fits all; the 1 MiB region is the best fit. */
    uint32_t id = find(&ra, 900 << 10, NULL);
    REQUIRE(id != TPI_RA_NONE);
    CHECK(tpi_ra_node_at(&ra, id)->region == 2);
    /* 2 MiB: the 3 MiB region. */
    id = find(&ra, 2 << 20, NULL);
    CHECK(id != TPI_RA_NONE && tpi_ra_node_at(&ra, id)->region == 3);
    /* Larger than everything. */
    CHECK(find(&ra, 65 << 20, NULL) == TPI_RA_NONE);
    tpi_ra_destroy(&ra);
}

static bool reject_region2(tpi_ra *ra, uint32_t id) { return tpi_ra_node_at(ra, id)->region != 2; }

static void test_search_skips_what_the_caller_rejects(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    tpi_ra_add_region(&ra, 0, 8 << 20, 1, 0);
    tpi_ra_add_region(&ra, 1ull << 32, 1 << 20, 2, 0);
    /* Good fit would take region 2; rejecting it leads to region 1. */
    uint32_t id = find(&ra, 4096, NULL);
    CHECK(id != TPI_RA_NONE && tpi_ra_node_at(&ra, id)->region == 2);
    id = find(&ra, 4096, reject_region2);
    CHECK(id != TPI_RA_NONE && tpi_ra_node_at(&ra, id)->region == 1);
    tpi_ra_destroy(&ra);
}

static void test_owner_words_split_and_merge_through_the_hook(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    tpi_ra_add_region(&ra, 0, 8 << 20, 1, 0x100);
    uint32_t x = tpi_ra_take(&ra, find(&ra, 4096, NULL), 4096);
    uint32_t y = tpi_ra_take(&ra, find(&ra, 4096, NULL), 4096);
    CHECK(tpi_ra_node_at(&ra, x)->owner == 0x100); /* a split copies the word */
    CHECK(tpi_ra_node_at(&ra, y)->owner == 0x100);
    tpi_ra_node_at(&ra, x)->owner = 0x1;
    tpi_ra_node_at(&ra, y)->owner = 0x2;
    merges = 0;
    tpi_ra_release(&ra, x); /* no free neighbour: no merge */
    CHECK(merges == 0);
    CHECK(tpi_ra_node_at(&ra, x)->owner == 0x1);
    uint32_t merged = tpi_ra_release(&ra, y); /* merges with x, then the rest */
    CHECK(merges == 2);
    CHECK(tpi_ra_node_at(&ra, merged)->owner == 0x103);
    CHECK(ra.free_count == 1);
    check_ra(&ra);
    /* Equal words merge without the hook (it must give a for (a, a)). */
    x = tpi_ra_take(&ra, find(&ra, 4096, NULL), 4096);
    CHECK(tpi_ra_node_at(&ra, x)->owner == 0x103);
    merges = 0;
    tpi_ra_release(&ra, x);
    CHECK(merges == 0);
    CHECK(ra.free_count == 1 && tpi_ra_node_at(&ra, x)->owner == 0x103);
    check_ra(&ra);
    tpi_ra_destroy(&ra);
}

static void test_reserved_nodes_let_split_and_take_succeed(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    uint32_t id = tpi_ra_add_region(&ra, 0, 8 << 20, 1, 0);
    REQUIRE(tpi_ra_reserve_nodes(&ra, 2));
    size_t capacity = ra.node_capacity;
    uint32_t suffix = tpi_ra_split_free(&ra, id, 1 << 20);
    REQUIRE(suffix != TPI_RA_NONE);
    CHECK(tpi_ra_take(&ra, suffix, 4096) == suffix);
    CHECK(ra.node_capacity == capacity); /* no growth was needed */
    CHECK(tpi_ra_node_at(&ra, suffix)->offset == 1 << 20);
    check_ra(&ra);
    tpi_ra_destroy(&ra);
}

/* Reference model: a byte map at 256-byte granularity of a 4 MiB region
 * (0 = free, else the owning block's id), checked against the allocator. */
#define MODEL_UNITS (4u << 20 >> 8)

static void test_random_against_model(unsigned long long seed) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    static uint32_t owner[MODEL_UNITS];
    memset(owner, 0, sizeof owner);
    const uint64_t base = 1ull << 40;
    tpi_ra_add_region(&ra, base, (uint64_t)MODEL_UNITS << 8, 1, 0);
    uint32_t live[512];
    size_t live_count = 0;
    test_rng rng = {seed};
    uint64_t used_bytes = 0;
    for (int op = 0; op < 20000; op++) {
        if (live_count < 512 && (live_count == 0 || rng_below(&rng, 100) < 55)) {
            uint64_t size = rng_log_uniform(&rng, 1, 256 << 10);
            size = (size + 255) & ~255ull;
            uint32_t id = find(&ra, size, NULL);
            /* The model says whether any free run of that length exists at
             * all; TLSF good fit may miss a fit only within one bin's span. */
            if (id == TPI_RA_NONE) continue;
            id = tpi_ra_take(&ra, id, size);
            REQUIRE(id != TPI_RA_NONE);
            tpi_ra_node *n = tpi_ra_node_at(&ra, id);
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
            tpi_ra_node *n = tpi_ra_node_at(&ra, id);
            for (uint64_t u = (n->offset - base) >> 8; u < (n->offset - base + n->size) >> 8; u++) {
                CHECK(owner[u] == id + 1);
                owner[u] = 0;
            }
            used_bytes -= n->size;
            tpi_ra_release(&ra, id);
            live[k] = live[--live_count];
        }
        CHECK(ra.free_bytes + used_bytes == (uint64_t)MODEL_UNITS << 8);
        if (op % 97 == 0) check_ra(&ra);
        if (check_failures > 20) break;
    }
    /* Free everything: one range again. */
    while (live_count) tpi_ra_release(&ra, live[--live_count]);
    CHECK(ra.free_count == 1);
    check_ra(&ra);
    tpi_ra_destroy(&ra);
}

/* A copy of ra, its nodes its own. */
static void ra_clone(const tpi_ra *from, tpi_ra *to) {
    *to = *from;
    to->nodes = tpi_host_alloc(&host, from->node_capacity * sizeof *from->nodes);
    REQUIRE(to->nodes);
    memcpy(to->nodes, from->nodes, from->node_capacity * sizeof *from->nodes);
}

/* Do a and b hold the same ranges (offset, size, state; the owner word of
 * free ones) and the same bin lists, in the same order? Node ids may
 * differ. */
static void check_same_ranges(const tpi_ra *a, const tpi_ra *b) {
    CHECK(a->free_bytes == b->free_bytes && a->free_count == b->free_count && a->used_count == b->used_count);
    CHECK(a->fl_bitmap == b->fl_bitmap && !memcmp(a->sl_bitmap, b->sl_bitmap, sizeof a->sl_bitmap));
    for (uint32_t bin = 0; bin < TPI_RA_BIN_COUNT; bin++) {
        uint32_t x = a->heads[bin], y = b->heads[bin];
        for (; x != TPI_RA_NONE && y != TPI_RA_NONE; x = a->nodes[x].list_next, y = b->nodes[y].list_next) {
            const tpi_ra_node *m = &a->nodes[x], *n = &b->nodes[y];
            CHECK_MSG(m->offset == n->offset && m->size == n->size && m->owner == n->owner,
                      "bin %u: [%llx +%llx owner %llx] against [%llx +%llx owner %llx]", bin,
                      (unsigned long long)m->offset, (unsigned long long)m->size, (unsigned long long)m->owner,
                      (unsigned long long)n->offset, (unsigned long long)n->size, (unsigned long long)n->owner);
        }
        CHECK_MSG(x == TPI_RA_NONE && y == TPI_RA_NONE, "bin %u: lists of different lengths", bin);
    }
    /* Address order, region by region, from each region's first node. */
    for (uint32_t id = 0; id < a->node_capacity; id++) {
        const tpi_ra_node *m = &a->nodes[id];
        if (m->state == TPI_RA_NODE_UNUSED || m->addr_prev != TPI_RA_NONE) continue;
        uint32_t other = TPI_RA_NONE;
        for (uint32_t j = 0; j < b->node_capacity && other == TPI_RA_NONE; j++)
            if (b->nodes[j].state != TPI_RA_NODE_UNUSED && b->nodes[j].offset == m->offset) other = j;
        REQUIRE(other != TPI_RA_NONE);
        for (uint32_t x = id, y = other; x != TPI_RA_NONE || y != TPI_RA_NONE;
             x = a->nodes[x].addr_next, y = b->nodes[y].addr_next) {
            REQUIRE(x != TPI_RA_NONE && y != TPI_RA_NONE);
            const tpi_ra_node *p = &a->nodes[x], *q = &b->nodes[y];
            CHECK(p->offset == q->offset && p->size == q->size && p->state == q->state);
            if (p->state == TPI_RA_NODE_FREE) CHECK(p->owner == q->owner);
        }
    }
}

/* On copy, a clone of ra: block id released with owner word owner. Returns
 * the first range a good-fit search for size finds there (TPI_RA_NONE:
 * none), which a resize in place stands for when it is the block's start. */
static uint32_t released_copy_finds(const tpi_ra *ra, uint32_t id, uint64_t size, uint64_t owner, tpi_ra *copy) {
    ra_clone(ra, copy);
    tpi_ra_node_at(copy, id)->owner = owner;
    tpi_ra_release(copy, id);
    return find(copy, size, NULL);
}

/* Block id of ra resized to size where it is (freed with owner word
 * owner), against the take of size from range first of copy
 * (released_copy_finds): the block stays where it was, used, of size, with
 * the take's owner word, and both hold the same ranges, owner words and
 * bin lists. */
static void check_resize_as_take(tpi_ra *ra, tpi_ra *copy, uint32_t id, uint32_t first, uint64_t size,
                                 uint64_t owner) {
    uint64_t start = tpi_ra_node_at(ra, id)->offset;
    REQUIRE(tpi_ra_resize(ra, id, size, owner));
    uint32_t taken = tpi_ra_take(copy, first, size);
    REQUIRE(taken != TPI_RA_NONE);
    const tpi_ra_node *m = tpi_ra_node_at(ra, id);
    CHECK(m->size == size && m->offset == start && m->state == TPI_RA_NODE_USED);
    CHECK(m->owner == tpi_ra_node_at(copy, taken)->owner);
    check_same_ranges(ra, copy);
    check_ra(ra);
}

/* tpi_ra_release_lands_in_place and tpi_ra_resize against what they stand
 * for, on random states of two regions: whenever the predicate says yes,
 * a release of the block (owner word set) and a good-fit search for the
 * new size (smaller, or up to the block and a free range after it) find
 * first the range at the block's start, and a take of the size there
 * leaves the same ranges, owner words and bin lists as the resize. */
static void test_resize_is_release_then_take(unsigned long long seed) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    const uint64_t base = 1ull << 40, region_bytes = 4ull << 20;
    REQUIRE(tpi_ra_add_region(&ra, base, region_bytes, 1, 0) != TPI_RA_NONE);
    REQUIRE(tpi_ra_add_region(&ra, base + region_bytes, region_bytes, 2, 0) != TPI_RA_NONE);
    uint32_t live[512];
    size_t live_count = 0;
    test_rng rng = {seed};
    unsigned said_yes = 0, landed = 0, trials = 0, grown = 0;
    int failures_before = check_failures;
    for (int op = 0; op < 12000 && check_failures < failures_before + 20; op++) {
        unsigned what = rng_below(&rng, 100);
        if (live_count < 512 && (live_count == 0 || what < 50)) {
            uint64_t size = (rng_log_uniform(&rng, 1, 512 << 10) + 255) & ~255ull;
            uint32_t id = find(&ra, size, NULL);
            if (id == TPI_RA_NONE) continue;
            REQUIRE((id = tpi_ra_take(&ra, id, size)) != TPI_RA_NONE);
            live[live_count++] = id;
        } else if (what < 80) {
            size_t k = rng_below(&rng, live_count);
            tpi_ra_node_at(&ra, live[k])->owner = 1ull << rng_below(&rng, 8);
            tpi_ra_release(&ra, live[k]);
            live[k] = live[--live_count];
        } else {
            size_t k = rng_below(&rng, live_count);
            uint32_t id = live[k];
            const tpi_ra_node *n = tpi_ra_node_at(&ra, id);
            uint64_t old_size = n->size, start = n->offset, room = old_size;
            if (n->addr_next != TPI_RA_NONE && tpi_ra_node_at(&ra, n->addr_next)->state == TPI_RA_NODE_FREE)
                room += tpi_ra_node_at(&ra, n->addr_next)->size;
            /* smaller (256 B at least) or larger (up to the room, now and then a little more) */
            uint64_t size = rng_below(&rng, 2) ? (rng_below(&rng, old_size >> 8) + 1) << 8
                                               : old_size + ((rng_below(&rng, ((room - old_size) >> 8) + 2)) << 8);
            if (size == old_size) continue;
            uint64_t owner = 1ull << rng_below(&rng, 8);
            bool yes = tpi_ra_release_lands_in_place(&ra, id, size);
            tpi_ra copy;
            uint32_t first = released_copy_finds(&ra, id, size, owner, &copy);
            bool lands = first != TPI_RA_NONE && tpi_ra_node_at(&copy, first)->offset == start;
            trials++;
            said_yes += yes;
            landed += lands;
            CHECK_MSG(!yes || lands, "seed %llu op %d: said in place, the search found %s", seed, op,
                      first == TPI_RA_NONE ? "nothing" : "another range");
            if (yes && lands) {
                if (trials % 2) REQUIRE(tpi_ra_reserve_nodes(&ra, 1)); /* else a cut may grow the node array */
                check_resize_as_take(&ra, &copy, id, first, size, owner);
                grown += size > old_size;
            }
            tpi_ra_destroy(&copy);
        }
    }
    /* The test means something only if both answers came up often (not
     * asked after a failure above, which ends the loop early). */
    if (check_failures == failures_before)
        CHECK_MSG(trials >= 800 && said_yes >= 50 && trials - said_yes >= trials / 10 &&
                      grown >= said_yes / 10 && said_yes - grown >= said_yes / 10,
                  "seed %llu: %u trials, %u said in place (%u landed there), %u of them grown", seed, trials, said_yes,
                  landed, grown);
    tpi_ra_destroy(&ra);
}

/* A resize that grows a block a little into a free neighbour which
 * stays in its bin but is not at that bin's head (another range of the
 * same bin was freed after it): a release and a take leave the rest at
 * the head of its bin, so the resize must move it there. (The random
 * states above seldom make this case.) Units are 256 B; the neighbour's
 * 287 units and the rest's 286 share a bin, and the block's new size and
 * the merged range lie in bins that hold nothing else. */
static void test_resize_moves_the_rest_to_its_bin_head(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    const uint64_t base = 1ull << 40, unit = 256, block = 4096 * unit, gap = 287 * unit, pin = 16 * unit;
    REQUIRE(tpi_ra_add_region(&ra, base, 4ull << 20, 1, 0) != TPI_RA_NONE);
    /* [a][x: free][b][y: free][c][the rest of the region] */
    uint32_t a = tpi_ra_take_at(&ra, base, block);
    uint32_t x = tpi_ra_take_at(&ra, base + block, gap);
    uint32_t b = tpi_ra_take_at(&ra, base + block + gap, pin);
    uint32_t y = tpi_ra_take_at(&ra, base + block + gap + pin, gap);
    uint32_t c = tpi_ra_take_at(&ra, base + block + 2 * gap + pin, pin);
    REQUIRE(a != TPI_RA_NONE && x != TPI_RA_NONE && b != TPI_RA_NONE && y != TPI_RA_NONE && c != TPI_RA_NONE);
    tpi_ra_release(&ra, x);
    tpi_ra_release(&ra, y); /* y heads the bin, x is second */
    uint32_t bin = tpi_ra_node_at(&ra, y)->bin;
    REQUIRE(tpi_ra_node_at(&ra, x)->bin == bin && ra.heads[bin] == y);
    REQUIRE(tpi_ra_bin_of_units(286) == bin);
    uint64_t size = block + unit;
    REQUIRE(tpi_ra_release_lands_in_place(&ra, a, size));
    tpi_ra copy;
    uint32_t first = released_copy_finds(&ra, a, size, 0, &copy);
    REQUIRE(first != TPI_RA_NONE && tpi_ra_node_at(&copy, first)->offset == base);
    check_resize_as_take(&ra, &copy, a, first, size, 0);
    CHECK(ra.nodes[ra.heads[bin]].offset == base + size); /* the rest heads its bin */
    tpi_ra_destroy(&copy);
    tpi_ra_destroy(&ra);
}

static void test_checker_catches_corruption(void) {
    tpi_ra ra;
    REQUIRE(ra_open(&ra) == TP_OK);
    tpi_ra_add_region(&ra, 0, 1 << 20, 1, 0);
    uint32_t a = tpi_ra_take(&ra, find(&ra, 4096, NULL), 4096);
    check_ra(&ra);
    char msg[128];
    tpi_ra_node_at(&ra, a)->size += 256; /* overlap with the next range */
    CHECK(!tpi_ra_check(&ra, msg, sizeof msg));
    tpi_ra_node_at(&ra, a)->size -= 256;
    ra.free_bytes += 1;
    CHECK(!tpi_ra_check(&ra, msg, sizeof msg));
    ra.free_bytes -= 1;
    ra.sl_bitmap[0] ^= 1; /* a bitmap bit without a list */
    CHECK(!tpi_ra_check(&ra, msg, sizeof msg));
    ra.sl_bitmap[0] ^= 1;
    check_ra(&ra);
    tpi_ra_destroy(&ra);
}

int main(void) {
    tpi_host_init(&host, NULL);
    test_bins();
    test_split_coalesce();
    test_regions_do_not_merge();
    test_good_fit();
    test_search_skips_what_the_caller_rejects();
    test_owner_words_split_and_merge_through_the_hook();
    test_reserved_nodes_let_split_and_take_succeed();
    for (unsigned long long seed = 1; seed <= 4; seed++) test_random_against_model(seed);
    for (unsigned long long seed = 1; seed <= 8; seed++) test_resize_is_release_then_take(seed);
    test_resize_moves_the_rest_to_its_bin_head();
    test_checker_catches_corruption();
    return check_report("test_range_alloc");
}
