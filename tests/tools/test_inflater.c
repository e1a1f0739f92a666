/* SPDX-License-Identifier: MIT */
/*
 * test_inflater.c -- tools/inflater.c against zlib.
 *
 * Valid streams: texts of many shapes (random bytes, runs, short periods,
 * CSV-like lines, a mix) deflated by zlib at every level and strategy, with
 * flushes (empty stored blocks, byte-aligned block ends) at random points,
 * decoded into buffers of random sizes (1 byte up to the whole text): the
 * text must come back exactly, END with it, and the input used must be the
 * stream's length.
 * Damaged streams: the same streams with bits flipped, bytes overwritten,
 * or cut short, and random bytes: whatever the inflater produces must be a
 * prefix of what zlib's inflate produces from the same bytes (the caller
 * hands an error to zlib, skipping the text it already has), and END only
 * where zlib also reaches the stream's end with the same text and input.
 */
#include "../check.h"
#include "inflater.h"
#include "zlib_reference.h"

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

/* The tests' random numbers, the same every run. */
static test_rng rng = {0x696e666c61746572ull};

/* A text of `shape`, length bytes. */
static void make_text(unsigned char *t, size_t length, unsigned shape) {
    size_t i = 0;
    switch (shape) {
    case 0: /* random bytes: stored blocks at level 0, literals otherwise */
        for (; i < length; i++) t[i] = (unsigned char)rng_next(&rng);
        break;
    case 1: /* runs: distance 1 */
        while (i < length) {
            unsigned char c = (unsigned char)rng_next(&rng);
            for (size_t n = 1 + rng_below(&rng, 600); n-- && i < length;) t[i++] = c;
        }
        break;
    case 2: /* short periods: distances 2..15 */
        while (i < length) {
            size_t period = 2 + rng_below(&rng, 14), n = rng_below(&rng, 400);
            unsigned char p[16];
            for (size_t k = 0; k < period; k++) p[k] = (unsigned char)('a' + rng_below(&rng, 4));
            for (size_t k = 0; k < n && i < length; k++) t[i++] = p[k % period];
        }
        break;
    case 3: { /* CSV lines like a trace's */
        uint64_t time = 1000, addr = 0x7f0000000000ull;
        while (i < length) {
            char line[128];
            int n = snprintf(line, sizeof line, "%llu,%s,0x%llx,%llu,%u\n", (unsigned long long)time,
                             rng_next(&rng) & 1 ? "alloc" : "free",
                             (unsigned long long)(addr + 512 * rng_below(&rng, 4096)),
                             (unsigned long long)(1ull << rng_below(&rng, 30)), (unsigned)rng_below(&rng, 3));
            time += rng_below(&rng, 50);
            for (int k = 0; k < n && i < length; k++) t[i++] = (unsigned char)line[k];
        }
        break;
    }
    default: /* a mix, with repeats from far back (distances up to 32 KiB) */
        while (i < length) {
            size_t n = 1 + rng_below(&rng, 3000), kind = rng_below(&rng, 4);
            for (size_t k = 0; k < n && i < length; k++, i++)
                t[i] = kind == 0 || i < 40000 ? (unsigned char)(rng_next(&rng) % (kind == 1 ? 3 : 256))
                       : kind == 1            ? t[i - 1 - rng_below(&rng, 8)]
                                              : t[i - 32768 + rng_below(&rng, 16)];
        }
    }
}

/* zlib's raw deflate of t at level/strategy, flushing (SYNC or FULL) at
 * random points when asked; NULL if zlib fails or does not finish. */
static unsigned char *deflate_text(const unsigned char *t, size_t length, int level, int strategy, int mem_level,
                                   bool flushes, size_t *out_length) {
    z_stream z;
    memset(&z, 0, sizeof z);
    if (deflateInit2(&z, level, Z_DEFLATED, -15, mem_level, strategy) != Z_OK) return NULL;
    size_t capacity = deflateBound(&z, length) + 64, used = 0;
    unsigned char *out = malloc(capacity);
    size_t at = 0;
    int ret = Z_OK;
    while (out && ret != Z_STREAM_END) {
        size_t n = flushes ? 1 + rng_below(&rng, length / 4 + 1) : length - at;
        if (n > length - at) n = length - at;
        z.next_in = (unsigned char *)t + at;
        z.avail_in = (uInt)n;
        at += n;
        int flush = at == length ? Z_FINISH : !flushes ? Z_NO_FLUSH : rng_next(&rng) & 1 ? Z_SYNC_FLUSH : Z_FULL_FLUSH;
        do { /* (a flush adds bytes deflateBound does not count: the buffer grows) */
            if (used == capacity) {
                unsigned char *grown = realloc(out, capacity * 2);
                if (!grown) break;
                out = grown;
                capacity *= 2;
            }
            z.next_out = out + used;
            z.avail_out = (uInt)(capacity - used);
            ret = deflate(&z, flush);
            used = capacity - z.avail_out;
        } while ((ret == Z_OK || ret == Z_BUF_ERROR) && z.avail_out == 0);
        if (ret != Z_OK && ret != Z_STREAM_END && ret != Z_BUF_ERROR) break;
        if (at == length && ret != Z_STREAM_END && z.avail_out != 0) break; /* Z_FINISH should have ended it */
    }
    deflateEnd(&z);
    if (ret != Z_STREAM_END) {
        free(out);
        return NULL;
    }
    *out_length = used;
    return out;
}

/* The inflater over in, into buffers of random sizes (or all `chunk` when
 * not 0): the text, the status it ended with, the input used at END. */
static inflater_status inflate_chunks(inflater *d, const unsigned char *in, size_t length, unsigned char *text,
                                      size_t capacity, size_t chunk, size_t *text_length, size_t *used) {
    inflater_start(d, in, length);
    size_t at = 0;
    inflater_status st = INFLATER_MORE;
    for (;;) {
        size_t n = chunk                     ? chunk
                   : rng_next(&rng) % 4 == 0 ? 1 + rng_below(&rng, 16)
                                             : 1 + rng_below(&rng, 1u << (rng_below(&rng, 20) + 1));
        if (n > capacity - at) n = capacity - at;
        size_t got = 0;
        st = inflater_read(d, text + at, n, &got);
        CHECK_MSG(got <= n, "produced %zu into %zu", got, n);
        if (got > n) break;
        at += got;
        if (st != INFLATER_MORE) break;
        CHECK_MSG(got == n, "MORE with a buffer not full (%zu of %zu)", got, n);
        if (got != n) break;
        if (at == capacity) break; /* more text than the case allows: the caller's check fails */
    }
    *text_length = at;
    *used = st == INFLATER_END ? inflater_input_used(d) : 0;
    if (st == INFLATER_END) { /* after END, END again with nothing */
        size_t got = 1;
        unsigned char b;
        CHECK_MSG(inflater_read(d, &b, 1, &got) == INFLATER_END && got == 0, "END is not sticky");
    }
    CHECK_MSG(inflater_total_out(d) == at, "total_out %llu, produced %zu", (unsigned long long)inflater_total_out(d),
              at);
    return st;
}

#define MAX_TEXT (3u << 20)
#define VALID_CASES 300u
#define DAMAGED_CASES (5u * VALID_CASES)

/* A text, what the inflater makes of it, what zlib makes of it. */
static unsigned char text_buffer[MAX_TEXT], mine_buffer[MAX_TEXT], theirs_buffer[MAX_TEXT];

static void test_valid_streams(void) {
    static const int strategies[] = {Z_DEFAULT_STRATEGY, Z_FILTERED, Z_HUFFMAN_ONLY, Z_RLE, Z_FIXED};
    inflater *d = inflater_create();
    REQUIRE(d != NULL);
    unsigned char *text = text_buffer, *back = mine_buffer;
    for (unsigned k = 0; k < VALID_CASES; k++) {
        size_t length = k % 7 == 0   ? rng_below(&rng, 64)
                        : k % 3 == 0 ? rng_below(&rng, MAX_TEXT)
                                     : rng_below(&rng, 200000);
        unsigned shape = (unsigned)rng_below(&rng, 5);
        int level = (int)rng_below(&rng, 10), strategy = strategies[rng_below(&rng, 5)],
            mem_level = 1 + (int)rng_below(&rng, 9);
        bool flushes = rng_next(&rng) % 3 == 0;
        make_text(text, length, shape);
        size_t zlength = 0;
        unsigned char *z = deflate_text(text, length, level, strategy, mem_level, flushes, &zlength);
        CHECK_MSG(z, "deflate failed");
        if (!z) continue;
        size_t chunk = k % 5 == 0 ? MAX_TEXT : 0, got = 0, used = 0;
        inflater_status st = inflate_chunks(d, z, zlength, back, MAX_TEXT, chunk, &got, &used);
        CHECK_MSG(st == INFLATER_END, "case %u (shape %u, level %d, strategy %d, %zu bytes): status %d (%s)", k, shape,
                  level, strategy, length, st, inflater_error(d));
        CHECK_MSG(got == length && !memcmp(back, text, length), "case %u: %zu bytes back of %zu, or different", k, got,
                  length);
        CHECK_MSG(used == zlength, "case %u: used %zu of %zu", k, used, zlength);
        /* the same stream with bytes after it: they are not taken */
        unsigned char *longer = malloc(zlength + 40);
        memcpy(longer, z, zlength);
        for (unsigned i = 0; i < 40; i++) longer[zlength + i] = (unsigned char)rng_next(&rng);
        st = inflate_chunks(d, longer, zlength + 40, back, MAX_TEXT, 0, &got, &used);
        CHECK_MSG(st == INFLATER_END && got == length && used == zlength, "case %u with bytes after it", k);
        free(longer);
        free(z);
    }
    inflater_destroy(d);
}

static void test_damaged_streams(void) {
    inflater *d = inflater_create();
    REQUIRE(d != NULL);
    unsigned char *text = text_buffer, *mine = mine_buffer, *theirs = theirs_buffer;
    unsigned ends = 0, errors = 0;
    for (unsigned k = 0; k < DAMAGED_CASES; k++) {
        size_t length = rng_below(&rng, k % 4 == 0 ? 300000 : 20000), zlength = 0;
        make_text(text, length, (unsigned)rng_below(&rng, 5));
        unsigned char *z =
            deflate_text(text, length, (int)rng_below(&rng, 10), rng_next(&rng) & 1 ? Z_DEFAULT_STRATEGY : Z_FIXED, 8,
                         rng_next(&rng) % 4 == 0, &zlength);
        if (!z) continue;
        switch (k % 4) {
        case 0: /* bits flipped */
            for (size_t n = 1 + rng_below(&rng, 3); n--;)
                z[rng_below(&rng, zlength)] ^= (unsigned char)(1u << rng_below(&rng, 8));
            break;
        case 1: /* bytes overwritten */
            for (size_t n = 1 + rng_below(&rng, 4); n--;) z[rng_below(&rng, zlength)] = (unsigned char)rng_next(&rng);
            break;
        case 2: /* cut short */
            zlength = rng_below(&rng, zlength);
            break;
        default: /* random bytes */
            for (size_t i = 0; i < zlength; i++) z[i] = (unsigned char)rng_next(&rng);
            zlength = rng_below(&rng, zlength + 1);
        }
        size_t mine_length = 0, used = 0, theirs_length = 0, theirs_used = 0;
        inflater_status st = inflate_chunks(d, z, zlength, mine, MAX_TEXT, 0, &mine_length, &used);
        bool zlib_end = zlib_raw_inflate(z, zlength, theirs, MAX_TEXT, &theirs_length, &theirs_used);
        CHECK_MSG(mine_length <= theirs_length && !memcmp(mine, theirs, mine_length),
                  "case %u: the inflater's %zu bytes are not a prefix of zlib's %zu", k, mine_length, theirs_length);
        if (st == INFLATER_END) {
            ends++;
            CHECK_MSG(zlib_end && theirs_length == mine_length && theirs_used == used,
                      "case %u: END where zlib %s (%zu/%zu bytes, used %zu/%zu)", k, zlib_end ? "ended" : "did not end",
                      mine_length, theirs_length, used, theirs_used);
        } else {
            errors++;
            CHECK_MSG(st == INFLATER_ERROR, "case %u: status %d", k, st);
        }
        free(z);
    }
    printf("  damaged streams: %u cases, %u ended (zlib agreeing), %u rejected\n", DAMAGED_CASES, ends, errors);
    inflater_destroy(d);
}

/* Hand-made streams zlib's rules treat specially. */
static void test_edge_streams(void) {
    inflater *d = inflater_create();
    REQUIRE(d != NULL);
    unsigned char *mine = mine_buffer, *theirs = theirs_buffer;
    static const struct {
        const char *what;
        unsigned char bytes[16];
        size_t length;
    } streams[] = {
        {"empty fixed block", {0x03, 0x00}, 2},
        {"empty stored block", {0x01, 0x00, 0x00, 0xff, 0xff}, 5},
        {"stored block, lengths that disagree", {0x01, 0x01, 0x00, 0xff, 0xff, 'x'}, 6},
        {"block type 3", {0x07, 0x00}, 2},
        {"distance before the start", {0x63, 0x00, 0x42, 0x00}, 4}, /* zlib: "invalid distance too far back" */
        {"nothing", {0}, 0},
    };
    for (size_t i = 0; i < sizeof streams / sizeof *streams; i++) {
        size_t mine_length = 0, used = 0, theirs_length = 0, theirs_used = 0;
        inflater_status st = inflate_chunks(d, streams[i].bytes, streams[i].length, mine, 4096, 0, &mine_length, &used);
        bool zlib_end =
            zlib_raw_inflate(streams[i].bytes, streams[i].length, theirs, 4096, &theirs_length, &theirs_used);
        CHECK_MSG((st == INFLATER_END) == zlib_end, "%s: inflater %d, zlib %s", streams[i].what, st,
                  zlib_end ? "ended" : "rejected");
        CHECK_MSG(mine_length <= theirs_length && !memcmp(mine, theirs, mine_length), "%s: not a prefix",
                  streams[i].what);
        if (st == INFLATER_END)
            CHECK_MSG(used == theirs_used, "%s: used %zu, zlib %zu", streams[i].what, used, theirs_used);
    }
    inflater_destroy(d);
}

/* --seeds OUT IN: the fuzzer's seeds (tools/fuzz_inflater.c) into OUT,
 * from each file in IN: its raw deflate at levels 1, 6 and 9 behind a byte
 * that picks the fuzzer's buffer sizes. */
static int write_seeds(const char *out_dir, const char *in_dir) {
    DIR *dir = opendir(in_dir);
    if (!dir) {
        fprintf(stderr, "test_inflater: cannot open %s\n", in_dir);
        return 1;
    }
    int written = 0;
    for (struct dirent *entry; (entry = readdir(dir));) {
        if (entry->d_name[0] == '.') continue;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", in_dir, entry->d_name);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        static unsigned char text[1u << 16];
        size_t length = fread(text, 1, sizeof text, f);
        fclose(f);
        for (int level = 1; level <= 9; level += level == 1 ? 5 : 3) {
            size_t zlength = 0;
            unsigned char *z = deflate_text(text, length, level, Z_DEFAULT_STRATEGY, 8, false, &zlength);
            snprintf(path, sizeof path, "%s/%s.%d", out_dir, entry->d_name, level);
            FILE *out = fopen(path, "wb");
            unsigned char chunk = (unsigned char)(1 + (written * 37 + level) % 255);
            bool ok = z && out && fwrite(&chunk, 1, 1, out) == 1 && fwrite(z, 1, zlength, out) == zlength;
            if (out && fclose(out) != 0) ok = false;
            free(z);
            if (!ok) {
                fprintf(stderr, "test_inflater: cannot write %s\n", path);
                closedir(dir);
                return 1;
            }
            written++;
        }
    }
    closedir(dir);
    printf("test_inflater: %d seeds in %s\n", written, out_dir);
    return written ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && !strcmp(argv[1], "--seeds")) return write_seeds(argv[2], argv[3]);
    static const test_case tests[] = {TEST_CASE(test_edge_streams), TEST_CASE(test_valid_streams),
                                      TEST_CASE(test_damaged_streams)};
    return TEST_MAIN("test_inflater", tests, argc, argv);
}
