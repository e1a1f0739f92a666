/* SPDX-License-Identifier: MIT */
/* The statistics table in docs/stats.md is generated from the one field
 * list in tidepool.h (TP_POOL_STAT_BYTES_LIST, TP_POOL_STAT_COUNT_LIST):
 * this test fails when the two disagree, and `test_stats_doc --write
 * docs/stats.md` rewrites the table between its markers. */
#include "check.h"

#include <string.h>

#define BEGIN_MARK "<!-- begin: generated from TP_POOL_STAT_*_LIST by tests/test_stats_doc.c -->\n"
#define END_MARK "<!-- end: generated -->\n"

static const char *doc_path;

static void table(char *out, size_t capacity) {
    size_t n = 0;
    n += (size_t)snprintf(out + n, capacity - n, "| field | kind | JSON | meaning |\n|---|---|---|---|\n");
#define ROW_BYTES_(name, kind, description)                                                                         \
    n += (size_t)snprintf(out + n, capacity - n, "| `%s` | %s | `{current, peak, total}` | %s |\n", #name, #kind, \
                          description);
#define ROW_COUNT_(name, kind, description) \
    n += (size_t)snprintf(out + n, capacity - n, "| `%s` | %s | number | %s |\n", #name, #kind, description);
    TP_POOL_STAT_BYTES_LIST(ROW_BYTES_)
    TP_POOL_STAT_COUNT_LIST(ROW_COUNT_)
#undef ROW_BYTES_
#undef ROW_COUNT_
    snprintf(out + n, capacity - n, "| `fragmentation` | gauge | number | 1 - largest free / total free (0 if none) |\n");
}

static char *read_all(const char *path, size_t *out_length) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    *out_length = n;
    return buf;
}

static void test_docs_table_matches_the_field_list(void) {
    char expected[1 << 14];
    table(expected, sizeof expected);
    size_t length;
    char *doc = read_all(doc_path, &length);
    REQUIRE(doc != NULL);
    char *begin = strstr(doc, BEGIN_MARK), *end = begin ? strstr(begin, END_MARK) : NULL;
    REQUIRE(begin && end);
    begin += strlen(BEGIN_MARK);
    *end = '\0';
    CHECK_MSG(strcmp(begin, expected) == 0, "%s is out of date: run test_stats_doc --write %s", doc_path, doc_path);
}

static void test_json_has_every_field(void) {
    tp_device *dev;
    tp_pool *pool;
    REQUIRE_OK(tp_device_open("sim:1GiB", NULL, &dev));
    REQUIRE_OK(tp_pool_create(dev, NULL, &pool));
    char json[4096];
    CHECK_OK(tp_pool_stats_json(pool, json, sizeof json, NULL));
#define HAS_FIELD_(name, kind, description) CHECK_CONTAINS(json, "\"" #name "\":");
    TP_POOL_STAT_BYTES_LIST(HAS_FIELD_)
    TP_POOL_STAT_COUNT_LIST(HAS_FIELD_)
#undef HAS_FIELD_
    CHECK_OK(tp_pool_destroy(pool));
    CHECK_OK(tp_device_close(dev));
}

static int write_table(const char *path) {
    size_t length;
    char *doc = read_all(path, &length);
    char *begin = doc ? strstr(doc, BEGIN_MARK) : NULL, *end = begin ? strstr(begin, END_MARK) : NULL;
    if (!begin || !end) {
        fprintf(stderr, "%s: no generated-table markers\n", path);
        return 1;
    }
    char expected[1 << 14];
    table(expected, sizeof expected);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    fwrite(doc, 1, (size_t)(begin - doc) + strlen(BEGIN_MARK), f);
    fputs(expected, f);
    fputs(end, f);
    return fclose(f) != 0;
}

static const test_case tests[] = {
    TEST_CASE(test_docs_table_matches_the_field_list),
    TEST_CASE(test_json_has_every_field),
};

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[1], "--write") == 0) return write_table(argv[2]);
    doc_path = argc >= 2 ? argv[1] : "docs/stats.md";
    return TEST_MAIN("test_stats_doc", tests, argc - 1, argv + 1);
}
