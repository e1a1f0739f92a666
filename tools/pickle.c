/* SPDX-License-Identifier: MIT */
/*
 * pickle.c -- the pickle reader (see pickle.h).
 *
 * Values live in chunks of an arena, freed at once; the item arrays of
 * lists and dicts are grown with realloc, and pk_free finds them by walking
 * the chunks. The memo holds pointers to values already built (a value may
 * be shared, and a list may even hold itself: nothing here walks values
 * recursively).
 *
 * Memory is bounded by the input: every byte the reader asks malloc for
 * (values' chunks, item arrays, the stack, marks and memo) counts against
 * PK_MEMORY_PER_BYTE per byte of the pickle read so far (up to the opcode
 * at hand) plus PK_MEMORY_BASE, and a pickle that takes more is refused as
 * malformed as soon as it does. Without it a few bytes could cost far more:
 * a LONG_BINPUT 4096 entries on takes 32 KiB of memo for 5 bytes, and a
 * 50 MiB run of EMPTY_LIST (a 50 KB gzip file) took 3 GB. Item arrays start
 * at the items first added (a tuple's hold exactly its items) and double
 * from there; None, booleans and the empty tuple are shared values.
 */
#include "pickle.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_VALUES 4096
/* The memory budget (see above). PyTorch's snapshots take about 4 bytes per
 * byte of pickle (tests/tools/data/h200_torch_snapshot.pickle.gz: 3.9).
 * Python's pickler writes every value in 2 bytes or more (EMPTY_LIST and
 * EMPTY_DICT with a MEMOIZE) but None, booleans and the empty tuple; what
 * costs most per byte -- a long list of small ints or of empty lists, a
 * list nested a million deep -- takes up to 24 to 32 (a 32-byte value, an
 * item and a stack or memo slot, arrays doubled, for 2 bytes). A run of
 * values nothing consumes (the 3 GB EMPTY_LIST run: a value and a stack
 * slot, 40 to 48 a byte) or of memo indices skipped ahead is refused
 * within its first MiB or so. */
#define PK_MEMORY_PER_BYTE 32
#define PK_MEMORY_BASE (1u << 20)
/* Python's pickler numbers memo entries 0, 1, 2, ...: an index far beyond
 * the entries so far is not one of its pickles (and would cost memory). */
#define MEMO_SLACK 4096

typedef struct chunk {
    struct chunk *next;
    size_t used;
    pk_value values[CHUNK_VALUES];
} chunk;

struct pk_doc {
    chunk *chunks;
    uint64_t allocated, budget; /* bytes; budget: for the bytes read so far */
    bool over_budget;           /* an allocation was refused for the budget */
    pk_value **stack;
    size_t depth, stack_capacity;
    size_t *marks; /* stack depths at each MARK */
    size_t mark_count, mark_capacity;
    pk_value **memo;
    size_t memo_count; /* slots in use: highest index + 1 */
    size_t memo_capacity;
    const pk_value *root;
};

static pk_value none_value = {.type = PK_NONE};
/* Booleans are immutable: two values serve every NEWTRUE and NEWFALSE. */
static pk_value true_value = {.type = PK_BOOL, .u.i = 1};
static pk_value false_value = {.type = PK_BOOL, .u.i = 0};
/* So is the empty tuple (a list here, which nothing may append to: Python
 * refuses that too, a tuple having no append). */
static pk_value empty_tuple_value = {.type = PK_LIST};

/* Counts bytes against the document's budget; false (and over_budget set)
 * when they do not fit. */
static bool charge(pk_doc *d, uint64_t bytes) {
    if (bytes > d->budget - d->allocated) {
        d->over_budget = true;
        return false;
    }
    d->allocated += bytes;
    return true;
}

/* Grows *array (of element size) to hold at least need elements: to
 * exactly need when it has none yet and need is above first (a tuple's
 * items, known at once), else doubling from first. */
static bool grow(pk_doc *d, void *array_ptr, size_t *capacity, size_t need, size_t element, size_t first) {
    if (need <= *capacity) return true;
    size_t cap = *capacity ? *capacity : first;
    while (cap < need) {
        if (cap > SIZE_MAX / 2 / element) return false;
        cap *= 2;
    }
    if (!*capacity && need > first) cap = need;
    if (!charge(d, (uint64_t)(cap - *capacity) * element)) return false;
    void **array = array_ptr;
    void *grown = realloc(*array, cap * element);
    if (!grown) return false;
    *array = grown;
    *capacity = cap;
    return true;
}

static pk_value *new_value(pk_doc *d, pk_type type) {
    if (!d->chunks || d->chunks->used == CHUNK_VALUES) {
        if (!charge(d, sizeof(chunk))) return NULL;
        chunk *c = malloc(sizeof *c);
        if (!c) return NULL;
        c->next = d->chunks;
        c->used = 0;
        d->chunks = c;
    }
    pk_value *v = &d->chunks->values[d->chunks->used++];
    memset(v, 0, sizeof *v);
    v->type = (uint8_t)type;
    return v;
}

/* Appends the stack's items [first, first + n) to a list or dict; its first
 * array holds exactly n. (An index, not a pointer: with nothing pushed yet
 * the stack is NULL, and NULL + 0 is undefined.) */
static bool seq_append(pk_doc *d, pk_value *seq, size_t first, size_t n) {
    if (!n) return true;
    if (!grow(d, &seq->u.seq.items, &seq->u.seq.capacity, seq->u.seq.count + n, sizeof *seq->u.seq.items, 1))
        return false;
    memcpy(seq->u.seq.items + seq->u.seq.count, d->stack + first, n * sizeof *d->stack);
    seq->u.seq.count += n;
    return true;
}

void pk_free(pk_doc *d) {
    if (!d) return;
    for (chunk *c = d->chunks, *next; c; c = next) {
        next = c->next;
        for (size_t i = 0; i < c->used; i++)
            if (c->values[i].type == PK_LIST || c->values[i].type == PK_DICT) free(c->values[i].u.seq.items);
        free(c);
    }
    free(d->stack);
    free(d->marks);
    free(d->memo);
    free(d);
}

const pk_value *pk_root(const pk_doc *d) { return d->root; }

/* The names of opcodes this reader refuses, for the error message. */
static const char *opcode_name(unsigned char op) {
    static const struct {
        unsigned char op;
        const char *name;
    } names[] = {
        {'c', "GLOBAL"},        {0x93, "STACK_GLOBAL"},   {'R', "REDUCE"},     {'b', "BUILD"},
        {0x81, "NEWOBJ"},       {0x92, "NEWOBJ_EX"},      {'o', "OBJ"},        {'i', "INST"},
        {'I', "INT"},           {'L', "LONG"},            {'F', "FLOAT"},      {'S', "STRING"},
        {'T', "BINSTRING"},     {'U', "SHORT_BINSTRING"}, {'V', "UNICODE"},    {'l', "LIST"},
        {'d', "DICT"},          {'p', "PUT"},             {'g', "GET"},        {'2', "DUP"},
        {'0', "POP"},           {'1', "POP_MARK"},        {'P', "PERSID"},     {'Q', "BINPERSID"},
        {0x82, "EXT1"},         {0x83, "EXT2"},           {0x84, "EXT4"},      {0x96, "BYTEARRAY8"},
        {0x97, "NEXT_BUFFER"},  {0x98, "READONLY_BUFFER"},
    };
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].op == op) return names[i].name;
    return NULL;
}

static uint64_t read_le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* LONG1/LONG4: n little-endian bytes of two's complement. */
static void decode_long(pk_value *v, const unsigned char *p, uint64_t n) {
    v->int_range = PK_INT_I64;
    v->u.i = 0;
    if (n == 0) return; /* zero */
    bool negative = (p[n - 1] & 0x80) != 0;
    unsigned char fill = negative ? 0xFF : 0x00;
    for (uint64_t i = 8; i < n; i++)
        if (p[i] != fill) { /* more than 64 bits of value */
            v->int_range = PK_INT_BIG;
            return;
        }
    uint64_t low = n < 8 ? n : 8;
    uint64_t bits = negative ? ~0ull : 0; /* sign-extended */
    for (uint64_t i = low; i-- > 0;) bits = (bits << 8) | p[i];
    v->u.i = (int64_t)bits;
    if (!negative && (bits >> 63)) v->int_range = PK_INT_U64;       /* 2^63 .. 2^64-1 */
    else if (negative && !(bits >> 63)) v->int_range = PK_INT_BIG;  /* below -2^63 */
}

#define FAIL(...)                                                                  \
    do {                                                                           \
        int at_ = snprintf(err, capacity, "offset %zu: ", at);                      \
        if (at_ > 0 && (size_t)at_ < capacity) snprintf(err + at_, capacity - (size_t)at_, __VA_ARGS__); \
        pk_free(d);                                                                \
        return NULL;                                                               \
    } while (0)
#define NEED(n)                                                                    \
    do {                                                                           \
        if ((uint64_t)(n) > (uint64_t)(length - pos))                              \
            FAIL("truncated pickle: opcode 0x%02x needs %llu bytes, %zu left", op, \
                 (unsigned long long)(n), length - pos);                           \
    } while (0)
/* An allocation failed: for the budget, or the system's memory. */
#define OUT_OF_MEMORY()                                                            \
    do {                                                                           \
        if (d->over_budget)                                                        \
            FAIL("malformed pickle: its first %zu bytes take more than %llu bytes of memory to read (%d a " \
                 "byte plus %u; a snapshot takes about 4 a byte)",                \
                 at + 1, (unsigned long long)d->budget, PK_MEMORY_PER_BYTE, PK_MEMORY_BASE); \
        FAIL("out of memory");                                                     \
    } while (0)
#define PUSH(value)                                                                \
    do {                                                                           \
        if (!grow(d, &d->stack, &d->stack_capacity, d->depth + 1, sizeof *d->stack, 64)) OUT_OF_MEMORY(); \
        d->stack[d->depth++] = (value);                                            \
    } while (0)
#define NEW(var, type)                                                             \
    do {                                                                           \
        if (!((var) = new_value(d, (type)))) OUT_OF_MEMORY();                      \
    } while (0)

/* Index of the topmost MARK's first item; -1 when there is no mark. */
static long long top_mark(const pk_doc *d) { return d->mark_count ? (long long)d->marks[d->mark_count - 1] : -1; }

pk_doc *pk_parse(const unsigned char *data, size_t length, char *err, size_t capacity) {
    size_t at = 0;
    pk_doc *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(err, capacity, "out of memory");
        return NULL;
    }
    size_t pos = 0;
    while (pos < length) {
        at = pos;
        d->budget = (uint64_t)(at + 1) * PK_MEMORY_PER_BYTE + PK_MEMORY_BASE; /* data in memory: < 2^58 bytes */
        unsigned char op = data[pos++];
        pk_value *v = NULL;
        switch (op) {
        case 0x80: /* PROTO */
            NEED(1);
            if (data[pos] > 5) FAIL("pickle protocol %u is newer than 5", data[pos]);
            pos += 1;
            break;
        case 0x95: /* FRAME: a length hint only */
            NEED(8);
            pos += 8;
            break;
        case '}': NEW(v, PK_DICT); PUSH(v); break;
        case ']': NEW(v, PK_LIST); PUSH(v); break;
        case ')': PUSH(&empty_tuple_value); break;
        case 0x8f: NEW(v, PK_LIST); PUSH(v); break; /* EMPTY_SET: read as a list */
        case '(': /* MARK */
            if (!grow(d, &d->marks, &d->mark_capacity, d->mark_count + 1, sizeof *d->marks, 16)) OUT_OF_MEMORY();
            d->marks[d->mark_count++] = d->depth;
            break;
        case 's': { /* SETITEM */
            if (d->depth < 3 || (long long)d->depth - 3 < top_mark(d)) FAIL("SETITEM needs a dict, a key and a value");
            pk_value *dict = d->stack[d->depth - 3];
            if (dict->type != PK_DICT) FAIL("SETITEM on a %s, not a dict", pk_type_name(dict));
            if (!seq_append(d, dict, d->depth - 2, 2)) OUT_OF_MEMORY();
            d->depth -= 2;
            break;
        }
        case 'u':   /* SETITEMS */
        case 'e':   /* APPENDS */
        case 0x90: { /* ADDITEMS */
            long long mark = top_mark(d);
            if (mark < 1 || (d->mark_count > 1 && (size_t)mark - 1 < d->marks[d->mark_count - 2])) FAIL("%s without a MARK after its %s", op == 'u' ? "SETITEMS" : op == 'e' ? "APPENDS" : "ADDITEMS",
                               op == 'u' ? "dict" : "list");
            pk_value *target = d->stack[mark - 1];
            size_t items = d->depth - (size_t)mark;
            if (op == 'u' && target->type != PK_DICT) FAIL("SETITEMS on a %s, not a dict", pk_type_name(target));
            if (op != 'u' && target->type != PK_LIST) FAIL("%s on a %s, not a list", op == 'e' ? "APPENDS" : "ADDITEMS",
                                                          pk_type_name(target));
            if (op == 'u' && items % 2) FAIL("SETITEMS with a key without a value");
            if (target == &empty_tuple_value && items)
                FAIL("%s to an empty tuple", op == 'e' ? "APPENDS" : "ADDITEMS");
            if (!seq_append(d, target, (size_t)mark, items)) OUT_OF_MEMORY();
            d->depth = (size_t)mark;
            d->mark_count--;
            break;
        }
        case 'a': { /* APPEND */
            if (d->depth < 2 || (long long)d->depth - 2 < top_mark(d)) FAIL("APPEND needs a list and an item");
            pk_value *list = d->stack[d->depth - 2];
            if (list->type != PK_LIST) FAIL("APPEND to a %s, not a list", pk_type_name(list));
            if (list == &empty_tuple_value) FAIL("APPEND to an empty tuple");
            if (!seq_append(d, list, d->depth - 1, 1)) OUT_OF_MEMORY();
            d->depth--;
            break;
        }
        case 'X':   /* BINUNICODE */
        case 0x8c:  /* SHORT_BINUNICODE */
        case 0x8d:  /* BINUNICODE8 */
        case 'C':   /* SHORT_BINBYTES */
        case 'B':   /* BINBYTES */
        case 0x8e: { /* BINBYTES8 */
            int width = op == 0x8c || op == 'C' ? 1 : op == 'X' || op == 'B' ? 4 : 8;
            NEED(width);
            uint64_t n = read_le(data + pos, width);
            pos += (size_t)width;
            NEED(n);
            NEW(v, op == 'X' || op == 0x8c || op == 0x8d ? PK_STR : PK_BYTES);
            v->u.str.data = (const char *)data + pos;
            v->u.str.length = (size_t)n;
            pos += (size_t)n;
            PUSH(v);
            break;
        }
        case 'J': /* BININT: signed 32 bits */
            NEED(4);
            NEW(v, PK_INT);
            v->u.i = (int32_t)(uint32_t)read_le(data + pos, 4);
            pos += 4;
            PUSH(v);
            break;
        case 'K': /* BININT1 */
        case 'M': /* BININT2 */
            NEED(op == 'K' ? 1 : 2);
            NEW(v, PK_INT);
            v->u.i = (int64_t)read_le(data + pos, op == 'K' ? 1 : 2);
            pos += op == 'K' ? 1 : 2;
            PUSH(v);
            break;
        case 0x8a:   /* LONG1 */
        case 0x8b: { /* LONG4 */
            int width = op == 0x8a ? 1 : 4;
            NEED(width);
            uint64_t n = read_le(data + pos, width);
            if (op == 0x8b && (n >> 31)) FAIL("LONG4 with a negative length");
            pos += (size_t)width;
            NEED(n);
            NEW(v, PK_INT);
            decode_long(v, data + pos, n);
            pos += (size_t)n;
            PUSH(v);
            break;
        }
        case 'G': { /* BINFLOAT: big-endian IEEE 754 double */
            NEED(8);
            uint64_t bits = 0;
            for (int i = 0; i < 8; i++) bits = (bits << 8) | data[pos + (size_t)i];
            NEW(v, PK_FLOAT);
            memcpy(&v->u.f, &bits, sizeof bits);
            pos += 8;
            PUSH(v);
            break;
        }
        case 0x88: /* NEWTRUE */
        case 0x89: /* NEWFALSE */
            PUSH(op == 0x88 ? &true_value : &false_value);
            break;
        case 'N': PUSH(&none_value); break;
        case 0x85: /* TUPLE1 */
        case 0x86: /* TUPLE2 */
        case 0x87: { /* TUPLE3 */
            size_t n = (size_t)(op - 0x84);
            if (d->depth < n || (long long)(d->depth - n) < top_mark(d)) FAIL("TUPLE%zu needs %zu items", n, n);
            NEW(v, PK_LIST);
            if (!seq_append(d, v, d->depth - n, n)) OUT_OF_MEMORY();
            d->depth -= n;
            PUSH(v);
            break;
        }
        case 't':   /* TUPLE: from the MARK */
        case 0x91: { /* FROZENSET */
            long long mark = top_mark(d);
            if (mark < 0) FAIL("%s without a MARK", op == 't' ? "TUPLE" : "FROZENSET");
            NEW(v, PK_LIST);
            if (!seq_append(d, v, (size_t)mark, d->depth - (size_t)mark)) OUT_OF_MEMORY();
            d->depth = (size_t)mark;
            d->mark_count--;
            PUSH(v);
            break;
        }
        case 0x94:  /* MEMOIZE */
        case 'q':   /* BINPUT */
        case 'r': { /* LONG_BINPUT */
            if (!d->depth || (long long)d->depth - 1 < top_mark(d)) FAIL("nothing to memoize");
            uint64_t index = d->memo_count;
            if (op != 0x94) {
                int width = op == 'q' ? 1 : 4;
                NEED(width);
                index = read_le(data + pos, width);
                pos += (size_t)width;
            }
            if (index > d->memo_count + MEMO_SLACK)
                FAIL("memo index %llu far beyond the %zu entries so far", (unsigned long long)index, d->memo_count);
            if (!grow(d, &d->memo, &d->memo_capacity, (size_t)index + 1, sizeof *d->memo, 64)) OUT_OF_MEMORY();
            for (size_t i = d->memo_count; i <= index; i++) d->memo[i] = NULL;
            if (index >= d->memo_count) d->memo_count = (size_t)index + 1;
            d->memo[index] = d->stack[d->depth - 1];
            break;
        }
        case 'h':   /* BINGET */
        case 'j': { /* LONG_BINGET */
            int width = op == 'h' ? 1 : 4;
            NEED(width);
            uint64_t index = read_le(data + pos, width);
            pos += (size_t)width;
            if (index >= d->memo_count || !d->memo[index]) FAIL("memo entry %llu was never stored", (unsigned long long)index);
            PUSH(d->memo[index]);
            break;
        }
        case '.': /* STOP */
            if (!d->depth || (long long)d->depth - 1 < top_mark(d)) FAIL("STOP with nothing on the stack");
            d->root = d->stack[d->depth - 1];
            return d;
        default: {
            const char *name = opcode_name(op);
            if (name)
                FAIL("unsupported pickle opcode 0x%02x (%s): only plain data (dicts, lists, strings, numbers) is read", op,
                     name);
            FAIL("unknown pickle opcode 0x%02x", op);
        }
        }
    }
    at = length;
    FAIL("truncated pickle: the data ends before its STOP opcode");
}

const pk_value *pk_dict_get(const pk_value *d, const char *key) {
    if (!d || d->type != PK_DICT) return NULL;
    for (size_t i = 0; i + 1 < d->u.seq.count; i += 2)
        if (pk_str_is(d->u.seq.items[i], key)) return d->u.seq.items[i + 1];
    return NULL;
}

size_t pk_list_count(const pk_value *v) { return v && v->type == PK_LIST ? v->u.seq.count : 0; }

const pk_value *pk_list_item(const pk_value *v, size_t index) {
    return index < pk_list_count(v) ? v->u.seq.items[index] : NULL;
}

bool pk_as_bits64(const pk_value *v, uint64_t *out) {
    if (!v || (v->type != PK_INT && v->type != PK_BOOL) || v->int_range == PK_INT_BIG) return false;
    *out = (uint64_t)v->u.i;
    return true;
}

bool pk_str_is(const pk_value *v, const char *text) {
    size_t n = strlen(text);
    return v && v->type == PK_STR && v->u.str.length == n && memcmp(v->u.str.data, text, n) == 0;
}

const char *pk_type_name(const pk_value *v) {
    static const char *const names[] = {"None", "bool", "int", "float", "str", "bytes", "list", "dict", "mark"};
    return v && v->type < sizeof names / sizeof *names ? names[v->type] : "?";
}
