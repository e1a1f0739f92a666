/* SPDX-License-Identifier: MIT */
/*
 * inflater.c -- raw deflate (RFC 1951) decoded from memory into the
 * caller's buffers, a buffer at a time (inflater.h).
 *
 * Why not zlib or libdeflate: zlib's inflate streams but decodes a trace
 * at under half this speed; libdeflate decodes about as fast (a little
 * slower on the traces, docs/results.md: "The inflater: literal pairs")
 * but only a whole stream in one call, so the trace's parse could not
 * start before the last byte is out (docs/results.md: "Gzip traces
 * through the trace reader's own inflater"). This decoder takes
 * libdeflate's way of decoding and keeps zlib's way of streaming.
 *
 * Algorithm.
 *   - Bits: a 64-bit buffer, lowest bit first, refilled to at least 56
 *     bits by one unaligned 8-byte load (its bytes past the count are read
 *     again, identical, by the next refill) while 8 input bytes are left;
 *     near the input's end byte by byte, then with zero bytes past it,
 *     counted (`overrun`): a stream that consumes one of those bits is cut
 *     short, and is rejected before anything decoded from them is written.
 *   - Codes: each Huffman code decodes through a table indexed by the next
 *     TABLE_BITS input bits (11 for literal/length, 8 for distance, 7 for
 *     the code-length code); a longer code's entry points to a subtable
 *     for its remaining bits (zlib's layout). An entry holds the bits to
 *     consume, its kind (literal, length, end of block, distance, subtable,
 *     invalid), the extra bits that follow and its value (the literal, the
 *     base length or distance, the subtable's index). In a table, a
 *     length's or a distance's entry counts its extra bits in the bits to
 *     consume and holds its code's own length where the extra bits' count
 *     was: one shift passes code and extra bits, and the value is summed
 *     from the bits as they were before it (entry_value). A primary
 *     literal entry whose index also decides the next code, a literal
 *     too, holds both bytes (pair_literals): a trace's text is mostly
 *     matches with a literal or two between them, and a pair takes one
 *     lookup and one branch instead of two.
 *   - The fast loop: while FAST_IN_MARGIN input bytes (enough for every
 *     refill of one pass) and FAST_OUT_MARGIN bytes of buffer are left, a
 *     refill gives enough bits for up to three literal entries or one
 *     length/distance pair without a check, and the next entry is looked
 *     up before a match is copied; matches copy 64 bytes and then 16 at a
 *     time, or 8, when the distance allows (writing up to 61 bytes past
 *     the match's end, inside the margin, to be overwritten; a third of
 *     a trace's matches are longer than 32 bytes, few longer than 64).
 *   - Near either end, a careful loop decodes one symbol at a time (the
 *     first of a pair alone, the second's bits given back, where one byte
 *     is left or the second's bits lie past the input's end); a
 *     match cut by the buffer's end is kept (match_left, match_dist) and
 *     finished by the next call.
 *   - The window: a match may reach back before this call's buffer, into
 *     the last WINDOW_BYTES of text produced by earlier calls, which each
 *     call copies to `history` as it returns.
 * Invariants: bit_count < 64 between refills; bits above bit_count are
 * either zero or the next input bits (so a refill may OR them again);
 * `in` never passes in_end and no load reads past it; total_out counts
 * every byte written to a caller's buffer; history holds the last
 * min(total_out, WINDOW_BYTES) of them, less this call's.
 * Rejected: everything zlib rejects (block type 3, stored lengths that
 * disagree, too many symbols, bad repeats, a missing end-of-block code,
 * over-subscribed codes, invalid symbols, distances before the start, a
 * cut-short stream), and incomplete codes except none or a single 1-bit
 * code (zlib's exceptions), plus an incomplete code-length code (zlib takes
 * one with no codes at all; the caller's zlib fallback covers it).
 */
#include "inflater.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW_BYTES 32768u
#define LIT_TABLE_BITS 11u
#define DIST_TABLE_BITS 8u
#define PRE_TABLE_BITS 7u
/* Primary table plus room for subtables; the builder checks the bound
 * (zlib's `enough` gives 2342 and 402 as the worst cases). */
#define LIT_TABLE_CAPACITY 2560u
#define DIST_TABLE_CAPACITY 512u
#define PRE_TABLE_CAPACITY 128u
#define FAST_OUT_MARGIN (258u + 64u)
#define FAST_IN_MARGIN 32

enum { KIND_LITERAL, KIND_LENGTH, KIND_END_OF_BLOCK, KIND_SUBTABLE, KIND_INVALID, KIND_DISTANCE };
#define KIND_MASK (7u << 5)
#define ENTRY(kind, extra, value) (((uint32_t)(value) << 16) | ((uint32_t)(extra) << 8) | ((uint32_t)(kind) << 5))
#define ENTRY_BITS(e) ((e) & 31u)
#define ENTRY_KIND(e) (((e) >> 5) & 7u)
#define ENTRY_EXTRA(e) (((e) >> 8) & 255u)
#define ENTRY_VALUE(e) ((e) >> 16)

typedef enum mode { MODE_HEADER, MODE_STORED, MODE_HUFFMAN, MODE_END, MODE_ERROR } mode;

struct inflater {
    const unsigned char *start, *in, *in_end;
    uint64_t bits;
    unsigned bit_count;
    unsigned overrun; /* zero bytes counted in past in_end */
    mode mode;
    bool last;             /* the block being decoded is the final one */
    uint32_t stored_left;  /* MODE_STORED: bytes of the block still to copy */
    uint32_t match_left, match_dist; /* a match the previous buffer's end cut */
    uint64_t total_out;
    size_t input_used;
    const char *error;
    const uint32_t *lit, *dist; /* the block's tables: the fixed ones or lit_table/dist_table */
    uint32_t lit_table[LIT_TABLE_CAPACITY], dist_table[DIST_TABLE_CAPACITY];
    uint32_t fixed_lit[LIT_TABLE_CAPACITY], fixed_dist[DIST_TABLE_CAPACITY];
    uint32_t lit_entries[288], dist_entries[32]; /* each symbol's entry, its length left out */
    uint32_t history_length;
    unsigned char history[WINDOW_BYTES];
};

static const uint16_t LENGTH_BASE[29] = {3,  4,  5,  6,  7,  8,  9,  10, 11,  13,  15,  17,  19,  23, 27,
                                         31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258};
static const uint8_t LENGTH_EXTRA[29] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2,
                                         2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0};
static const uint16_t DIST_BASE[30] = {1,   2,   3,   4,   5,   7,    9,    13,   17,   25,   33,   49,   65,    97,    129,
                                       193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385, 24577};
static const uint8_t DIST_EXTRA[30] = {0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13};
static const uint8_t PRECODE_ORDER[19] = {16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15};

/* --------------------------------------------------------------- tables */

/* Symbol entry e (its bits left out) as the table holds it for a code of
 * len bits: a literal's or a code without extra bits takes len bits; a
 * length's or a distance's takes its extra bits with it, and keeps len in
 * its extra field (entry_value says why). */
static uint32_t entry_for_code(uint32_t e, unsigned len) {
    unsigned kind = ENTRY_KIND(e);
    if (kind == KIND_LENGTH || kind == KIND_DISTANCE) return ENTRY(kind, len, ENTRY_VALUE(e)) | (len + ENTRY_EXTRA(e));
    return e | len;
}

/* Builds a decode table for the code lengths lens[0, n) (0: no code),
 * symbol s decoding to entries[s] (the bits it takes added here): the
 * primary table of 2^table_bits entries, subtables after it. False for an
 * over-subscribed code, an incomplete one (unless allow_incomplete and it
 * has no code or one 1-bit code: the entries left are then invalid), or
 * subtables beyond capacity. */
static bool build_table(uint32_t *table, unsigned capacity, unsigned table_bits, const uint8_t *lens, unsigned n,
                        const uint32_t *entries, bool allow_incomplete) {
    unsigned count[16] = {0}, offset[16], remaining[16];
    uint16_t sorted[288];
    for (unsigned s = 0; s < n; s++) count[lens[s]]++;
    count[0] = 0;
    unsigned max = 15;
    while (max > 0 && !count[max]) max--;
    int left = 1;
    for (unsigned len = 1; len <= 15; len++) {
        left = 2 * left - (int)count[len];
        if (left < 0) return false; /* over-subscribed */
    }
    unsigned size = 1u << table_bits;
    if (left > 0) {
        if (!allow_incomplete || max > 1) return false;
        for (unsigned i = 0; i < size; i++) table[i] = ENTRY(KIND_INVALID, 0, 0);
        for (unsigned s = 0; s < n; s++) /* one 1-bit code: 0 */
            if (lens[s] == 1)
                for (unsigned i = 0; i < size; i += 2) table[i] = entry_for_code(entries[s], 1);
        return true;
    }
    offset[1] = 0;
    for (unsigned len = 1; len < 15; len++) offset[len + 1] = offset[len] + count[len];
    for (unsigned s = 0; s < n; s++)
        if (lens[s]) sorted[offset[lens[s]]++] = (uint16_t)s;
    memcpy(remaining, count, sizeof remaining);
    unsigned mask = size - 1, rev = 0, next = size, sub_start = 0, sub_bits = 0, prefix = ~0u, i = 0;
    for (unsigned len = 1; len <= max; len++) {
        for (unsigned c = 0; c < count[len]; c++, i++) {
            uint32_t e = entries[sorted[i]];
            if (len <= table_bits) {
                uint32_t coded = entry_for_code(e, len);
                for (unsigned k = rev; k < size; k += 1u << len) table[k] = coded;
            } else {
                if ((rev & mask) != prefix) { /* a new subtable: wide enough for the codes it starts (zlib's rule) */
                    prefix = rev & mask;
                    unsigned bits = len - table_bits;
                    int room = 1 << bits;
                    while (bits + table_bits < max) {
                        room -= (int)remaining[bits + table_bits];
                        if (room <= 0) break;
                        bits++;
                        room <<= 1;
                    }
                    if (next + (1u << bits) > capacity) return false;
                    table[prefix] = ENTRY(KIND_SUBTABLE, bits, next) | table_bits;
                    sub_start = next;
                    sub_bits = bits;
                    next += 1u << bits;
                }
                unsigned sub_len = len - table_bits;
                uint32_t coded = entry_for_code(e, sub_len);
                for (unsigned k = rev >> table_bits; k < (1u << sub_bits); k += 1u << sub_len)
                    table[sub_start + k] = coded;
            }
            remaining[len]--;
            /* the next code, its bits reversed: the canonical code plus one */
            unsigned bit = 1u << (len - 1);
            while (rev & bit) bit >>= 1;
            rev = (rev & (bit - 1)) | bit;
        }
    }
    return true;
}

/* Pairs literals in a literal/length table's primary part: where an
 * index's first code is a literal of l1 bits and the code after it, a
 * literal too, is decided by the index's other bits alone, the entry
 * becomes both: the two bytes in its value (the first in the low byte),
 * l1 in its extra field (0 in a single literal's), the bits of both to
 * consume. Downward, so the single entry at index >> l1 (never above the
 * index) is read before it is paired. */
static void pair_literals(uint32_t *table, unsigned table_bits) {
    for (unsigned i = 1u << table_bits; i-- > 0;) {
        uint32_t e = table[i];
        unsigned l1 = ENTRY_BITS(e);
        if (ENTRY_KIND(e) != KIND_LITERAL || l1 >= table_bits) continue;
        uint32_t next = table[i >> l1];
        unsigned l2 = ENTRY_BITS(next);
        if (ENTRY_KIND(next) != KIND_LITERAL || ENTRY_EXTRA(next) || l2 > table_bits - l1) continue;
        table[i] = ENTRY(KIND_LITERAL, l1, ENTRY_VALUE(e) | ENTRY_VALUE(next) << 8) | (l1 + l2);
    }
}

inflater *inflater_create(void) {
    inflater *d = calloc(1, sizeof *d);
    if (!d) return NULL;
    for (unsigned s = 0; s < 288; s++)
        d->lit_entries[s] = s < 256    ? ENTRY(KIND_LITERAL, 0, s)
                            : s == 256 ? ENTRY(KIND_END_OF_BLOCK, 0, 0)
                            : s < 286  ? ENTRY(KIND_LENGTH, LENGTH_EXTRA[s - 257], LENGTH_BASE[s - 257])
                                       : ENTRY(KIND_INVALID, 0, 0);
    for (unsigned s = 0; s < 32; s++)
        d->dist_entries[s] = s < 30 ? ENTRY(KIND_DISTANCE, DIST_EXTRA[s], DIST_BASE[s]) : ENTRY(KIND_INVALID, 0, 0);
    uint8_t lens[288];
    for (unsigned s = 0; s < 288; s++) lens[s] = s < 144 ? 8 : s < 256 ? 9 : s < 280 ? 7 : 8;
    /* (Not paired: the fixed code's literals take 8 or 9 bits, so any two
     * take more than LIT_TABLE_BITS.) */
    bool ok = build_table(d->fixed_lit, LIT_TABLE_CAPACITY, LIT_TABLE_BITS, lens, 288, d->lit_entries, false);
    memset(lens, 5, 32);
    ok = ok && build_table(d->fixed_dist, DIST_TABLE_CAPACITY, DIST_TABLE_BITS, lens, 32, d->dist_entries, false);
    if (!ok) { /* (cannot happen: the fixed codes are complete) */
        free(d);
        return NULL;
    }
    return d;
}

void inflater_destroy(inflater *d) { free(d); }

void inflater_start(inflater *d, const unsigned char *in, size_t length) {
    d->start = d->in = in;
    d->in_end = in + length;
    d->bits = 0;
    d->bit_count = d->overrun = 0;
    d->mode = MODE_HEADER;
    d->last = false;
    d->stored_left = d->match_left = d->match_dist = 0;
    d->total_out = 0;
    d->input_used = 0;
    d->error = NULL;
    d->history_length = 0;
}

size_t inflater_input_used(const inflater *d) { return d->input_used; }
size_t inflater_input_position(const inflater *d) { return (size_t)(d->in - d->start); }
uint64_t inflater_total_out(const inflater *d) { return d->total_out; }
const char *inflater_error(const inflater *d) { return d->error ? d->error : "no error"; }

/* ---------------------------------------------------------------- decode */

static inline uint64_t load_le64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* The decoder's hot state, in locals while a call runs. */
typedef struct cursor {
    const unsigned char *in, *in_end;
    uint64_t bits;
    unsigned bit_count, overrun;
} cursor;

/* At least 56 bits in the buffer. */
static inline void refill(cursor *c) {
    if (c->in_end - c->in >= 8) {
        c->bits |= load_le64(c->in) << c->bit_count;
        c->in += (63u - c->bit_count) >> 3;
        c->bit_count |= 56u;
        return;
    }
    while (c->bit_count < 56) {
        if (c->in < c->in_end) c->bits |= (uint64_t)*c->in++ << c->bit_count;
        else c->overrun++;
        c->bit_count += 8;
    }
}

static inline void consume(cursor *c, unsigned n) {
    c->bits >>= n;
    c->bit_count -= n;
}

static inline uint32_t take(cursor *c, unsigned n) {
    uint32_t v = (uint32_t)(c->bits & ((1ull << n) - 1));
    consume(c, n);
    return v;
}

/* True when the stream has used bits past the input's end. */
static inline bool cut_short(const cursor *c) { return c->overrun && c->overrun * 8u > c->bit_count; }

/* The code whose primary entry e (table's, primary width table_bits) was
 * looked up from the next bits: its final entry (through its subtable for
 * a long code), its bits consumed. */
static inline uint32_t finish_entry(cursor *c, const uint32_t *table, unsigned table_bits, uint32_t e,
                                    uint64_t *out_bits) {
    if (ENTRY_KIND(e) == KIND_SUBTABLE) {
        consume(c, table_bits);
        e = table[ENTRY_VALUE(e) + (c->bits & ((1u << ENTRY_EXTRA(e)) - 1))];
    }
    *out_bits = c->bits;
    consume(c, ENTRY_BITS(e));
    return e;
}

/* The entry for the next code in table, its bits consumed (*out_bits: the
 * buffer before they were). */
static inline uint32_t decode(cursor *c, const uint32_t *table, unsigned table_bits, uint64_t *out_bits) {
    return finish_entry(c, table, table_bits, table[c->bits & ((1u << table_bits) - 1)], out_bits);
}

/* A length's or a distance's value: its base plus the extra bits that
 * followed its code in bits (the buffer before the entry's bits were
 * consumed). The extra bits are taken from there, beside the consume,
 * not after it: one shift less in the chain from one code to the next. */
static inline uint32_t entry_value(uint32_t e, uint64_t bits) {
    return ENTRY_VALUE(e) + (uint32_t)((bits & ((1ull << ENTRY_BITS(e)) - 1)) >> ENTRY_EXTRA(e));
}

/* Copies a match of length bytes from dist back, byte by byte, through
 * the history where it reaches before out_begin (dist checked). */
static unsigned char *copy_match_careful(const inflater *d, unsigned char *out_begin, unsigned char *out, uint32_t dist,
                                         uint32_t length) {
    size_t here = (size_t)(out - out_begin);
    if (dist > here) {
        uint32_t back = dist - (uint32_t)here;
        uint32_t n = back < length ? back : length;
        memcpy(out, d->history + d->history_length - back, n);
        out += n;
        length -= n;
    }
    const unsigned char *src = out - dist;
    while (length--) *out++ = *src++;
    return out;
}

/* The cursor byte-aligned and its whole bytes given back to the input.
 * False when the stream used bits past the input's end. */
static bool align_to_byte(cursor *c) {
    consume(c, c->bit_count & 7u);
    unsigned bytes = c->bit_count >> 3;
    if (c->overrun > bytes) return false;
    c->in -= bytes - c->overrun;
    c->bits = 0;
    c->bit_count = c->overrun = 0;
    return true;
}

/* A dynamic block's header: its code lengths read, its tables built.
 * NULL or why it is rejected. */
static const char *read_dynamic_header(inflater *d, cursor *c) {
    uint8_t lens[286 + 30], pre_lens[19] = {0};
    uint32_t pre_table[PRE_TABLE_CAPACITY], pre_entries[19];
    refill(c);
    unsigned nlit = take(c, 5) + 257, ndist = take(c, 5) + 1, npre = take(c, 4) + 4;
    if (nlit > 286 || ndist > 30) return "too many length or distance symbols";
    for (unsigned i = 0; i < npre; i++) {
        if (c->bit_count < 3) refill(c);
        pre_lens[PRECODE_ORDER[i]] = (uint8_t)take(c, 3);
    }
    if (cut_short(c)) return "cut short";
    for (unsigned s = 0; s < 19; s++) pre_entries[s] = ENTRY(KIND_LITERAL, 0, s);
    if (!build_table(pre_table, PRE_TABLE_CAPACITY, PRE_TABLE_BITS, pre_lens, 19, pre_entries, false))
        return "invalid code lengths set";
    for (unsigned i = 0; i < nlit + ndist;) {
        refill(c); /* a code (7 bits) and its extra bits (7) */
        uint64_t bits;
        unsigned sym = ENTRY_VALUE(decode(c, pre_table, PRE_TABLE_BITS, &bits)), repeat, value = 0;
        if (sym < 16) {
            lens[i++] = (uint8_t)sym;
            continue;
        }
        if (sym == 16) {
            if (i == 0) return "invalid bit length repeat";
            value = lens[i - 1];
            repeat = 3 + take(c, 2);
        } else {
            repeat = sym == 17 ? 3 + take(c, 3) : 11 + take(c, 7);
        }
        if (i + repeat > nlit + ndist) return "invalid bit length repeat";
        memset(lens + i, (int)value, repeat);
        i += repeat;
    }
    if (cut_short(c)) return "cut short";
    if (!lens[256]) return "invalid code -- missing end-of-block";
    if (!build_table(d->lit_table, LIT_TABLE_CAPACITY, LIT_TABLE_BITS, lens, nlit, d->lit_entries, true))
        return "invalid literal/lengths set";
    pair_literals(d->lit_table, LIT_TABLE_BITS);
    if (!build_table(d->dist_table, DIST_TABLE_CAPACITY, DIST_TABLE_BITS, lens + nlit, ndist, d->dist_entries, true))
        return "invalid distances set";
    d->lit = d->lit_table;
    d->dist = d->dist_table;
    return NULL;
}

/* A block's header read (or the stream's end found): the mode set. NULL or
 * why the data is rejected. */
static const char *read_block_header(inflater *d, cursor *c) {
    if (d->last) { /* the final block ended */
        if (!align_to_byte(c)) return "cut short";
        d->input_used = (size_t)(c->in - d->start);
        d->mode = MODE_END;
        return NULL;
    }
    refill(c);
    d->last = take(c, 1);
    unsigned type = take(c, 2);
    if (cut_short(c)) return "cut short";
    if (type == 0) {
        if (!align_to_byte(c)) return "cut short";
        if (c->in_end - c->in < 4) return "cut short";
        uint32_t len = (uint32_t)c->in[0] | (uint32_t)c->in[1] << 8, nlen = (uint32_t)c->in[2] | (uint32_t)c->in[3] << 8;
        if (len != (~nlen & 0xffffu)) return "invalid stored block lengths";
        c->in += 4;
        d->stored_left = len;
        d->mode = MODE_STORED;
        return NULL;
    }
    if (type == 1) {
        d->lit = d->fixed_lit;
        d->dist = d->fixed_dist;
    } else if (type == 2) {
        const char *why = read_dynamic_header(d, c);
        if (why) return why;
    } else {
        return "invalid block type";
    }
    d->mode = MODE_HUFFMAN;
    return NULL;
}

/* A primary literal entry's one or two bytes to out (two bytes written
 * either way: the margin allows it); where the text goes on. */
static inline unsigned char *put_literals(unsigned char *out, uint32_t e) {
    out[0] = (unsigned char)ENTRY_VALUE(e);
    out[1] = (unsigned char)(ENTRY_VALUE(e) >> 8);
    return out + 1 + (ENTRY_EXTRA(e) != 0);
}

/* The fast loop (see the top): decodes while FAST_IN_MARGIN input bytes and
 * FAST_OUT_MARGIN bytes of buffer are left. Returns where the text ends;
 * *why set when the data is rejected, the block's end sets d->mode. */
static unsigned char *decode_fast(inflater *d, cursor *cursor_in, unsigned char *out_begin, unsigned char *out,
                                  unsigned char *out_end, const char **why) {
    /* The cursor in locals: the caller's has its address taken, which
     * would keep it in memory through the loop. */
    cursor local = *cursor_in, *c = &local;
    const uint32_t *lit = d->lit, *dist = d->dist;
    const uint64_t lit_mask = (1u << LIT_TABLE_BITS) - 1;
    /* The next entry is looked up as soon as its bits are in (a refill
     * leaves the low bits as they were), before a match is copied. Every
     * lookup for the loop's top follows a refill: 56 bits or more there. */
    refill(c);
    uint32_t e = lit[c->bits & lit_mask];
    while (c->in_end - c->in > FAST_IN_MARGIN && (size_t)(out_end - out) > FAST_OUT_MARGIN) {
        if (!(e & KIND_MASK)) { /* up to three literal entries: 3 x 11 bits of the 56 */
            consume(c, ENTRY_BITS(e));
            out = put_literals(out, e);
            e = lit[c->bits & lit_mask];
            if (!(e & KIND_MASK)) {
                consume(c, ENTRY_BITS(e));
                out = put_literals(out, e);
                e = lit[c->bits & lit_mask];
                if (!(e & KIND_MASK)) {
                    consume(c, ENTRY_BITS(e));
                    out = put_literals(out, e);
                    refill(c);
                    e = lit[c->bits & lit_mask];
                    continue;
                }
            }
            refill(c); /* e stays: it was looked up with 34 bits or more in */
        }
        uint64_t bits;
        e = finish_entry(c, lit, LIT_TABLE_BITS, e, &bits);
        unsigned kind = ENTRY_KIND(e);
        if (kind == KIND_LITERAL) {
            *out++ = (unsigned char)ENTRY_VALUE(e);
            refill(c);
            e = lit[c->bits & lit_mask];
            continue;
        }
        if (kind != KIND_LENGTH) {
            if (kind == KIND_END_OF_BLOCK) d->mode = MODE_HEADER;
            else *why = "invalid literal/length code";
            break;
        }
        /* length: at most 15 + 5 bits; its distance at most 15 + 13 more */
        uint32_t length = entry_value(e, bits);
        e = decode(c, dist, DIST_TABLE_BITS, &bits);
        if (ENTRY_KIND(e) != KIND_DISTANCE) {
            *why = "invalid distance code";
            break;
        }
        uint32_t distance = entry_value(e, bits);
        size_t here = (size_t)(out - out_begin);
        if (distance > here) {
            if (distance > here + d->history_length) {
                *why = "invalid distance too far back";
                break;
            }
            out = copy_match_careful(d, out_begin, out, distance, length);
            refill(c);
            e = lit[c->bits & lit_mask];
            continue;
        }
        refill(c);
        e = lit[c->bits & lit_mask];
        const unsigned char *src = out - distance;
        unsigned char *end = out + length;
        if (distance >= 16) { /* 64 bytes, whatever the length: one branch for most matches */
            memcpy(out, src, 16);
            memcpy(out + 16, src + 16, 16);
            memcpy(out + 32, src + 32, 16);
            memcpy(out + 48, src + 48, 16);
            out += 64;
            src += 64;
            while (out < end) {
                memcpy(out, src, 16);
                out += 16;
                src += 16;
            }
        } else if (distance >= 8) {
            do {
                memcpy(out, src, 8);
                out += 8;
                src += 8;
            } while (out < end);
        } else if (distance == 1) {
            memset(out, *src, length);
        } else {
            while (out < end) *out++ = *src++;
        }
        out = end;
    }
    *cursor_in = local;
    return out;
}

/* One symbol at a time, checking both ends; stops at the buffer's end
 * (a match cut there kept), the block's end or damage. */
static unsigned char *decode_careful(inflater *d, cursor *c, unsigned char *out_begin, unsigned char *out,
                                     unsigned char *out_end, const char **why) {
    while (out < out_end) {
        refill(c);
        uint64_t bits;
        uint32_t e = decode(c, d->lit, LIT_TABLE_BITS, &bits);
        unsigned kind = ENTRY_KIND(e);
        if (kind == KIND_LITERAL && ENTRY_EXTRA(e)) { /* two literals */
            if (out_end - out >= 2 && !cut_short(c)) {
                out = put_literals(out, e);
                continue;
            }
            /* The first alone: the second's bits given back. */
            unsigned first = ENTRY_EXTRA(e);
            c->bit_count += ENTRY_BITS(e) - first;
            c->bits = bits >> first;
            e = ENTRY(KIND_LITERAL, 0, ENTRY_VALUE(e) & 255u) | first;
        }
        if (kind == KIND_LITERAL || kind == KIND_END_OF_BLOCK) {
            if (cut_short(c)) {
                *why = "cut short";
                return out;
            }
            if (kind == KIND_END_OF_BLOCK) {
                d->mode = MODE_HEADER;
                return out;
            }
            *out++ = (unsigned char)ENTRY_VALUE(e);
            continue;
        }
        if (kind != KIND_LENGTH) {
            *why = "invalid literal/length code";
            return out;
        }
        uint32_t length = entry_value(e, bits);
        e = decode(c, d->dist, DIST_TABLE_BITS, &bits);
        uint32_t distance = entry_value(e, bits);
        if (cut_short(c)) {
            *why = "cut short";
            return out;
        }
        if (ENTRY_KIND(e) != KIND_DISTANCE) {
            *why = "invalid distance code";
            return out;
        }
        if (distance > (size_t)(out - out_begin) + d->history_length) {
            *why = "invalid distance too far back";
            return out;
        }
        uint32_t room = (uint32_t)(out_end - out) < length ? (uint32_t)(out_end - out) : length;
        out = copy_match_careful(d, out_begin, out, distance, room);
        d->match_left = length - room;
        d->match_dist = distance;
    }
    return out;
}

/* The last WINDOW_BYTES of the text, after a call produced `produced`
 * bytes at out_begin. */
static void keep_history(inflater *d, const unsigned char *out_begin, size_t produced) {
    if (produced >= WINDOW_BYTES) {
        memcpy(d->history, out_begin + produced - WINDOW_BYTES, WINDOW_BYTES);
        d->history_length = WINDOW_BYTES;
        return;
    }
    uint32_t keep = d->history_length;
    if (keep > WINDOW_BYTES - produced) keep = WINDOW_BYTES - (uint32_t)produced;
    memmove(d->history, d->history + d->history_length - keep, keep);
    memcpy(d->history + keep, out_begin, produced);
    d->history_length = keep + (uint32_t)produced;
}

inflater_status inflater_read(inflater *d, unsigned char *out, size_t capacity, size_t *produced) {
    *produced = 0;
    if (d->mode == MODE_END) return INFLATER_END;
    if (d->mode == MODE_ERROR) return INFLATER_ERROR;
    cursor c = {d->in, d->in_end, d->bits, d->bit_count, d->overrun};
    unsigned char *out_begin = out, *pos = out, *out_end = out + capacity;
    const char *why = NULL;
    if (d->match_left) { /* the match the previous buffer's end cut */
        uint32_t room = (size_t)(out_end - pos) < d->match_left ? (uint32_t)(out_end - pos) : d->match_left;
        pos = copy_match_careful(d, out_begin, pos, d->match_dist, room);
        d->match_left -= room;
    }
    while (pos < out_end && !why && d->mode != MODE_END) {
        if (d->mode == MODE_HEADER) {
            why = read_block_header(d, &c);
        } else if (d->mode == MODE_STORED) {
            size_t n = d->stored_left;
            if (n > (size_t)(out_end - pos)) n = (size_t)(out_end - pos);
            if (n > (size_t)(c.in_end - c.in)) n = (size_t)(c.in_end - c.in);
            memcpy(pos, c.in, n);
            pos += n;
            c.in += n;
            d->stored_left -= (uint32_t)n;
            if (!d->stored_left) d->mode = MODE_HEADER;
            else if (pos < out_end) why = "cut short";
        } else {
            pos = decode_fast(d, &c, out_begin, pos, out_end, &why);
            if (!why && d->mode == MODE_HUFFMAN) pos = decode_careful(d, &c, out_begin, pos, out_end, &why);
        }
    }
    /* A final block that ends exactly at the buffer's end: found now, so
     * that END comes with its text. */
    if (!why && d->mode == MODE_HEADER && d->last && !d->match_left) why = read_block_header(d, &c);
    d->in = c.in;
    d->bits = c.bits;
    d->bit_count = c.bit_count;
    d->overrun = c.overrun;
    size_t n = (size_t)(pos - out_begin);
    *produced = n;
    d->total_out += n;
    if (why) {
        d->error = why;
        d->mode = MODE_ERROR;
        return INFLATER_ERROR;
    }
    keep_history(d, out_begin, n);
    return d->mode == MODE_END ? INFLATER_END : INFLATER_MORE;
}
