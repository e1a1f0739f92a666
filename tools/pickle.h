/* SPDX-License-Identifier: MIT */
/*
 * pickle.h -- a small reader of Python pickles (protocols 2 to 5), enough for
 * the memory snapshots PyTorch writes (torch.cuda.memory._snapshot(),
 * pickled by _dump_snapshot or pickle.dump): dicts, lists, tuples, strings,
 * bytes, integers, floats, booleans and None, with the memo. No classes, no
 * code: GLOBAL, REDUCE and the like are refused with the opcode's name and
 * offset, as is anything else outside that set.
 *
 * The reader is a stack machine over the bytes (no recursion), so nesting
 * depth costs memory, not stack; every length is checked against the bytes
 * left before it is used. Its memory is bounded by the bytes read: more than
 * 32 a byte plus 1 MiB (a snapshot takes about 4), and the pickle is refused
 * as malformed. Strings point into the caller's buffer, which
 * must outlive the document.
 */
#ifndef TIDEPOOL_PICKLE_H
#define TIDEPOOL_PICKLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum pk_type {
    PK_NONE = 0,
    PK_BOOL,
    PK_INT,
    PK_FLOAT,
    PK_STR,   /* UTF-8, not NUL-terminated */
    PK_BYTES,
    PK_LIST,  /* lists, tuples and sets */
    PK_DICT,  /* items[2k] is a key, items[2k+1] its value */
    PK_MARK_, /* internal */
} pk_type;

typedef enum pk_int_range {
    PK_INT_I64 = 0, /* the value is i */
    PK_INT_U64 = 1, /* in [2^63, 2^64): the value is (uint64_t)i */
    PK_INT_BIG = 2, /* outside both */
} pk_int_range;

typedef struct pk_value pk_value;
struct pk_value {
    uint8_t type;      /* pk_type */
    uint8_t int_range; /* PK_INT: pk_int_range */
    union {
        int64_t i;     /* PK_INT, PK_BOOL */
        double f;      /* PK_FLOAT */
        struct {
            const char *data;
            size_t length;
        } str;         /* PK_STR, PK_BYTES */
        struct {
            pk_value **items;
            size_t count; /* PK_DICT: 2 x pairs */
            size_t capacity;
        } seq;
    } u;
};

typedef struct pk_doc pk_doc;

/* Parses the pickle in data[0, length). Returns the document, or NULL with
 * "offset N: what" in err (N: the offset of the opcode at fault). */
pk_doc *pk_parse(const unsigned char *data, size_t length, char *err, size_t capacity);
const pk_value *pk_root(const pk_doc *doc);
void pk_free(pk_doc *doc);

/* The value of a dict's string key, or NULL (also when d is not a dict). */
const pk_value *pk_dict_get(const pk_value *d, const char *key);
/* Items of a list (or tuple); 0 when v is not one. */
size_t pk_list_count(const pk_value *v);
const pk_value *pk_list_item(const pk_value *v, size_t index);
/* An integer (or boolean) as 64 bits: negative values and values up to
 * 2^64-1 come back as their two's complement bits. False for other types
 * and integers outside [-2^63, 2^64). */
bool pk_as_bits64(const pk_value *v, uint64_t *out);
/* A string equal to text. */
bool pk_str_is(const pk_value *v, const char *text);
/* "dict", "list", ... */
const char *pk_type_name(const pk_value *v);

#endif
