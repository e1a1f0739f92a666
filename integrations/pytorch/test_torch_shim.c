/* SPDX-License-Identifier: MIT */
/*
 * test_torch_shim.c -- the PyTorch shim through its exported entry points.
 *
 *   test_torch_shim nodevice   TIDEPOOL_TORCH_CONF=log=off, no CUDA device
 *                              (CUDA_VISIBLE_DEVICES= or no driver at all):
 *                              every allocation returns NULL, nothing crashes,
 *                              also from 8 threads at once.
 *   test_torch_shim sim        TIDEPOOL_TORCH_CONF=backend=sim:4GiB,limit=1GiB,...
 *                              the simulated device behind the same entry
 *                              points: alloc/free from 8 threads, the limit,
 *                              empty_cache, record_stream, reset_peaks, stats.
 *   test_torch_shim timed      TIDEPOOL_TORCH_CONF=...,time_calls=on,tick_ms=10: a
 *                              bad time_calls value is refused; after 8
 *                              threads allocate and free, the stats JSON has
 *                              the time inside alloc and free (above zero,
 *                              within the threads' wall time, the slowest call
 *                              between the mean and the sum), and after a
 *                              quiet spell the upkeep thread's time. (The sim
 *                              mode, untimed, checks that all of it reads 0.)
 *   test_torch_shim trace      TIDEPOOL_TORCH_CONF=backend=sim,...,trace=FILE (plain
 *                              CSV): 8 threads allocate and free; after
 *                              tp_torch_trace_close the file has the header,
 *                              one row per alloc and free, and its peak of
 *                              live bytes is the pool's requested peak; later
 *                              events are not recorded.
 *   test_torch_shim trace_full TIDEPOOL_TORCH_CONF=...,log=error,trace=/dev/full:
 *                              every write fails; the first failure is logged
 *                              once, the stats JSON says "write_failed" and
 *                              counts "rows_lost" apart from the rows
 *                              recorded, tp_torch_trace_close returns -1.
 *   test_torch_shim config_threads
 *                              TIDEPOOL_TORCH_CONF=log=off,oom=null: before any
 *                              pool, two threads replace the configuration
 *                              (tp_torch_configure, two settings in turn)
 *                              while others read it (tp_torch_stats_json(-1),
 *                              the log level and the oom mode through failing
 *                              calls): every JSON shows one whole setting,
 *                              never half of each (and TSan sees no race).
 *   test_torch_shim fork       TIDEPOOL_TORCH_CONF=...,trace=FILE (plain CSV): after
 *                              the parent's first rows were written, a child
 *                              that calls exit(0) and one that allocates and
 *                              frees more rows than the trace buffers leave
 *                              the file as it was; at the end it holds
 *                              exactly the parent's rows, and they parse.
 *   test_torch_shim fork_exit_threads
 *                              TIDEPOOL_TORCH_CONF=...,trace=FILE: a thread
 *                              allocates and frees in a loop while the main
 *                              thread forks 20 children that call exit(0);
 *                              none may hang in the shim's exit handler (on
 *                              a lock the thread held at the fork).
 *   test_torch_shim json DIR   the stats JSON stays valid JSON in valid UTF-8
 *                              whatever the configuration holds: it runs
 *                              itself again (json-child) with a configuration
 *                              whose stats path (in DIR) and, in a second run,
 *                              whose bad value hold a quote, a backslash, a
 *                              control character, 0xff and a cut UTF-8
 *                              sequence, and checks the JSON returned and the
 *                              file written at exit.
 *
 * The shim exports only tp_torch_*, so the checks read its stats JSON.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

void *tp_torch_alloc(ssize_t size, int device, void *stream);
void tp_torch_free(void *ptr, ssize_t size, int device, void *stream);
void tp_torch_init(int device_count);
void tp_torch_empty_cache(void);
void tp_torch_set_memory_fraction(double fraction, int device);
void tp_torch_record_stream(void *ptr, void *stream);
unsigned long long tp_torch_trim(int device, unsigned long long target_reserved_bytes);
int tp_torch_reset_peaks(int device);
const char *tp_torch_stats_json(int device);
int tp_torch_trace_close(void);
const char *tp_torch_metrics(int device, const char *labels);
const char *tp_torch_snapshot_json(int device);
int tp_torch_configure(const char *text, char *err, size_t err_capacity, char *bad_key, size_t bad_key_capacity);

static int failures;

#define CHECK(cond)                                                             \
    do {                                                                        \
        if (!(cond)) {                                                          \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                         \
        }                                                                       \
    } while (0)

/* The number after `"key":` at the first occurrence of path (a substring
 * that ends with the key, e.g. "\"reserved_bytes\":{\"current\""). */
static long long json_number(const char *json, const char *path) {
    const char *p = strstr(json, path);
    if (!p) return -1;
    p += strlen(path);
    if (*p != ':') return -1;
    return strtoll(p + 1, NULL, 10);
}

#define THREADS 8
#define ROUNDS 2000

static void *nodevice_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        void *p = tp_torch_alloc(4096 + i, 0, NULL);
        if (p) return (void *)1;
    }
    return NULL;
}

static int run_nodevice(void) {
    tp_torch_init(1);
    CHECK(tp_torch_alloc(1 << 20, 0, NULL) == NULL);
    CHECK(tp_torch_alloc(0, 0, NULL) == NULL);
    CHECK(tp_torch_alloc(-5, 0, NULL) == NULL);
    CHECK(tp_torch_alloc(256, -1, NULL) == NULL);
    CHECK(tp_torch_alloc(256, 1000, NULL) == NULL);
    tp_torch_free(NULL, 0, 0, NULL);                   /* no-op */
    tp_torch_free((void *)(uintptr_t)0x1000, 256, 0, NULL); /* no pool: counted, no crash */
    tp_torch_free((void *)(uintptr_t)0x1000, 256, 77, NULL);
    tp_torch_record_stream((void *)(uintptr_t)0x1000, NULL);
    tp_torch_empty_cache();
    tp_torch_set_memory_fraction(0.5, 0);
    tp_torch_set_memory_fraction(7.0, 0); /* rejected */
    CHECK(tp_torch_reset_peaks(-1) == 0);
    CHECK(tp_torch_trim(-1, 0) == 0);

    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++) CHECK(pthread_create(&threads[i], NULL, nodevice_thread, NULL) == 0);
    for (int i = 0; i < THREADS; i++) {
        void *got = (void *)1;
        pthread_join(threads[i], &got);
        CHECK(got == NULL);
    }

    const char *dev0 = tp_torch_stats_json(0);
    printf("%s\n", dev0);
    CHECK(strstr(dev0, "\"state\":\"failed\"") != NULL);
    CHECK(strstr(dev0, "\"error\":\"TP_ERR_") != NULL);
    CHECK(strstr(dev0, "\"pool\":null") != NULL);
    CHECK(json_number(dev0, "\"failed_allocs\"") == 1 + THREADS * ROUNDS);
    CHECK(json_number(dev0, "\"zero_size_allocs\"") == 1);
    CHECK(json_number(dev0, "\"free_errors\"") == 1);
    const char *all = tp_torch_stats_json(-1);
    printf("%s\n", all);
    CHECK(strncmp(all, "{\"tidepool_torch\":", 18) == 0);
    CHECK(strstr(all, "\"devices\":[{\"device\":0,") != NULL);
    CHECK(strstr(all, "\"log\":\"off\"") != NULL);
    CHECK(strstr(tp_torch_stats_json(5), "\"state\":\"unused\"") != NULL);
    CHECK(strstr(tp_torch_stats_json(500), "\"state\":\"invalid\"") != NULL);
    return failures;
}

/* ------------------------------------------------------------------ sim */

static void *sim_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
    void *live[32] = {0};
    ssize_t sizes[32] = {0};
    for (int i = 0; i < ROUNDS; i++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % 32);
        if (live[k]) {
            tp_torch_free(live[k], sizes[k], 0, NULL);
            live[k] = NULL;
        } else {
            seed = seed * 1103515245u + 12345u;
            sizes[k] = (ssize_t)(1 + (seed >> 4) % (3u << 20)); /* up to 3 MiB */
            live[k] = tp_torch_alloc(sizes[k], 0, NULL);
            if (!live[k]) return (void *)1;
            if ((uintptr_t)live[k] % 512) return (void *)2;
        }
    }
    for (int k = 0; k < 32; k++)
        if (live[k]) tp_torch_free(live[k], sizes[k], 0, NULL);
    /* Every thread reads the statistics too: its buffers go with it (the
     * ASan build's leak check fails otherwise). */
    if (!strstr(tp_torch_stats_json(0), "\"state\":\"active\"")) return (void *)3;
    if (!strstr(tp_torch_metrics(0, NULL), "tidepool_")) return (void *)4;
    if (tp_torch_snapshot_json(0)[0] != '{') return (void *)5;
    return NULL;
}

/* THREADS threads of sim_thread, each checked. */
static void run_sim_threads(void) {
    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, sim_thread, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < THREADS; i++) {
        void *got = (void *)1;
        pthread_join(threads[i], &got);
        CHECK(got == NULL);
    }
}

static int run_sim(void) {
    tp_torch_init(2);
    CHECK(tp_torch_alloc(0, 0, NULL) == NULL);

    run_sim_threads();
    const char *s = tp_torch_stats_json(0);
    printf("%s\n", s);
    CHECK(strstr(s, "\"state\":\"active\"") != NULL);
    long long allocs = json_number(s, "\"alloc_calls\"");
    CHECK(allocs > THREADS * ROUNDS / 4);
    CHECK(json_number(s, "\"free_calls\"") == allocs);
    CHECK(json_number(s, "\"allocs\"") == allocs);
    CHECK(json_number(s, "\"requested_bytes\":{\"current\"") == 0);
    CHECK(json_number(s, "\"limit_bytes\"") == 1ll << 30);
    CHECK(json_number(s, "\"hazards\"") == 0);
    /* Not asked to time the calls: nothing timed. */
    CHECK(strstr(s, "\"timed\":false") != NULL);
    CHECK(json_number(s, "\"alloc_ns\"") == 0);
    CHECK(json_number(s, "\"free_ns\"") == 0);
    CHECK(json_number(s, "\"slowest_call_ns\"") == 0);

    /* Over the 1 GiB limit: NULL, counted as an out-of-memory. */
    CHECK(tp_torch_alloc((ssize_t)3 << 29, 0, NULL) == NULL);
    s = tp_torch_stats_json(0);
    CHECK(json_number(s, "\"ooms\"") == 1);
    CHECK(json_number(s, "\"failed_allocs\"") == 1);

    /* A second device gets its own pool. */
    void *other = tp_torch_alloc(1000, 1, NULL);
    CHECK(other != NULL);
    CHECK(strstr(tp_torch_stats_json(1), "\"state\":\"active\"") != NULL);

    /* record_stream on the same stream as the free: no cross-stream wait. */
    void *p = tp_torch_alloc(5 << 20, 0, NULL);
    CHECK(p != NULL);
    tp_torch_record_stream(p, NULL);
    tp_torch_record_stream(p, NULL); /* recorded once */
    tp_torch_record_stream((void *)(uintptr_t)0x10, NULL); /* unknown: ignored */
    tp_torch_free(p, 5 << 20, 0, NULL);
    s = tp_torch_stats_json(0);
    CHECK(json_number(s, "\"record_stream_calls\"") == 2);
    CHECK(json_number(s, "\"cross_stream_waits\"") == 0);

    /* Many pointers, each used by streams 1..3 (one of them twice) and the
     * free stream: three waits per free, in whatever state the table is after
     * the frees before it. Streams 1..3 do not exist on the simulated device,
     * so the event calls fail and the shim falls back to synchronising; the
     * waits are counted all the same. A pointer with more than 16 streams
     * makes the shim synchronise the device instead (no waits counted). */
    enum { RS_PTRS = 300 };
    void *rs_ptrs[RS_PTRS];
    for (int i = 0; i < RS_PTRS; i++) {
        rs_ptrs[i] = tp_torch_alloc(4096, 0, NULL);
        CHECK(rs_ptrs[i] != NULL);
        for (uintptr_t st = 1; st <= 3; st++) tp_torch_record_stream(rs_ptrs[i], (void *)st);
        tp_torch_record_stream(rs_ptrs[i], (void *)(uintptr_t)2);
        tp_torch_record_stream(rs_ptrs[i], NULL);
        if (i % 3 == 2) tp_torch_free(rs_ptrs[i - 1], 4096, 0, NULL); /* frees interleaved with records */
    }
    for (int i = 0; i < RS_PTRS; i++)
        if (i % 3 != 1) tp_torch_free(rs_ptrs[i], 4096, 0, NULL);
    s = tp_torch_stats_json(0);
    CHECK(json_number(s, "\"record_stream_calls\"") == 2 + 5 * RS_PTRS);
    CHECK(json_number(s, "\"cross_stream_waits\"") == 3 * RS_PTRS);
    void *many = tp_torch_alloc(4096, 0, NULL);
    CHECK(many != NULL);
    for (uintptr_t st = 1; st <= 20; st++) tp_torch_record_stream(many, (void *)st);
    tp_torch_free(many, 4096, 0, NULL);
    CHECK(json_number(tp_torch_stats_json(0), "\"cross_stream_waits\"") == 3 * RS_PTRS);
    tp_torch_free(other, 1000, 1, NULL);

    /* A free on the wrong device fails (device 1's pool has no live block
     * there) and must leave the pointer's recorded stream in place: the free
     * on the right device still waits for it. */
    void *wrong = tp_torch_alloc(8192, 0, NULL);
    CHECK(wrong != NULL);
    tp_torch_record_stream(wrong, (void *)(uintptr_t)1);
    tp_torch_free(wrong, 8192, 1, NULL);
    CHECK(json_number(tp_torch_stats_json(1), "\"free_errors\"") == 1);
    CHECK(json_number(tp_torch_stats_json(1), "\"cross_stream_waits\"") == 0);
    tp_torch_free(wrong, 8192, 0, NULL);
    CHECK(json_number(tp_torch_stats_json(0), "\"cross_stream_waits\"") == 3 * RS_PTRS + 1);
    CHECK(json_number(tp_torch_stats_json(0), "\"free_errors\"") == 0);

    /* Double free: tidepool refuses it, the shim counts it. */
    tp_torch_free(p, 5 << 20, 0, NULL);
    CHECK(json_number(tp_torch_stats_json(0), "\"free_errors\"") == 1);

    /* empty_cache gives everything idle back. */
    CHECK(json_number(tp_torch_stats_json(0), "\"reserved_bytes\":{\"current\"") > 0);
    tp_torch_empty_cache();
    s = tp_torch_stats_json(0);
    CHECK(json_number(s, "\"reserved_bytes\":{\"current\"") == 0);
    CHECK(json_number(tp_torch_stats_json(1), "\"reserved_bytes\":{\"current\"") == 0);

    CHECK(tp_torch_reset_peaks(-1) == 2);
    CHECK(json_number(tp_torch_stats_json(0), "\"reserved_bytes\":{\"current\":0,\"peak\"") == 0);
    tp_torch_set_memory_fraction(0.25, 0); /* live pool: trims, keeps its limit */
    CHECK(json_number(tp_torch_stats_json(0), "\"limit_bytes\"") == 1ll << 30);
    tp_torch_set_memory_fraction(0.125, 2); /* before creation: becomes the limit, over limit= */
    void *q = tp_torch_alloc(4096, 2, NULL);
    CHECK(q != NULL);
    CHECK(json_number(tp_torch_stats_json(2), "\"limit_bytes\"") == 1ll << 29);
    tp_torch_free(q, 4096, 2, NULL);

    const char *all = tp_torch_stats_json(-1);
    printf("%s\n", all);
    CHECK(strstr(all, "\"backend\":\"sim\"") != NULL);
    CHECK(strstr(all, "{\"device\":2,") != NULL);
    return failures;
}

/* ----------------------------------------------------------------- json */

/* Well-formed UTF-8 (Unicode table 3-7: no overlongs, no surrogates,
 * nothing past U+10FFFF); written apart from the shim's own check. */
static bool valid_utf8(const unsigned char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        unsigned cp, len;
        if (c < 0x80) { i++; continue; }
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return false;
        if (i + len > n) return false;
        for (unsigned k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        static const unsigned min[5] = {0, 0, 0x80, 0x800, 0x10000};
        if (cp < min[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

/* A JSON value at p (RFC 8259 syntax); the end of it, or NULL. */
static const char *json_value(const char *p, int depth);

static const char *json_space(const char *p) {
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

static const char *json_string(const char *p) {
    if (*p++ != '"') return NULL;
    for (;;) {
        unsigned char c = (unsigned char)*p++;
        if (c == '"') return p;
        if (c < 0x20) return NULL; /* the end of the text, or a raw control character */
        if (c != '\\') continue;
        c = (unsigned char)*p++;
        if (c == 'u') {
            for (int k = 0; k < 4; k++, p++)
                if (!strchr("0123456789abcdefABCDEF", *p) || !*p) return NULL;
        } else if (!c || !strchr("\"\\/bfnrt", c)) {
            return NULL;
        }
    }
}

static const char *json_value(const char *p, int depth) {
    if (depth > 64) return NULL;
    p = json_space(p);
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = json_space(p + 1);
        if (*p == close) return p + 1;
        for (;;) {
            if (close == '}') {
                p = json_string(json_space(p));
                if (!p) return NULL;
                p = json_space(p);
                if (*p++ != ':') return NULL;
            }
            p = json_value(p, depth + 1);
            if (!p) return NULL;
            p = json_space(p);
            if (*p == close) return p + 1;
            if (*p++ != ',') return NULL;
        }
    }
    if (*p == '"') return json_string(p);
    if (!strncmp(p, "true", 4)) return p + 4;
    if (!strncmp(p, "false", 5)) return p + 5;
    if (!strncmp(p, "null", 4)) return p + 4;
    const char *start = p;
    if (*p == '-') p++;
    if (*p == '0') p++;
    else if (*p >= '1' && *p <= '9') while (*p >= '0' && *p <= '9') p++;
    else return NULL;
    if (*p == '.') {
        if (*++p < '0' || *p > '9') return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    if (*p == 'e' || *p == 'E') {
        p++;
        if (*p == '+' || *p == '-') p++;
        if (*p < '0' || *p > '9') return NULL;
        while (*p >= '0' && *p <= '9') p++;
    }
    return p > start ? p : NULL;
}

/* text is one JSON value (after it: only blanks) in valid UTF-8. */
static bool valid_json(const char *text) {
    const char *end = json_value(text, 0);
    return end && !*json_space(end) && valid_utf8((const unsigned char *)text, strlen(text));
}

/* A quote, 0xff, a well-formed e-acute (passes as it is), a cut
 * three-byte sequence (one U+FFFD), a control character and a backslash;
 * and how the JSON must say them. */
#define HOSTILE "q\"\xff" "\xc3\xa9" "\xe2\x82" "\x01\\z"
#define HOSTILE_JSON "q\\\"\\ufffd" "\xc3\xa9" "\\ufffd\\u0001\\\\z"

/* The child: the configuration is in TIDEPOOL_TORCH_CONF already. */
static int run_json_child(const char *expect) {
    tp_torch_init(1);
    /* On the simulated device, a pool's object too. (A configuration with
     * an error runs on the defaults, whose failed allocation throws.) */
    const char *conf = getenv("TIDEPOOL_TORCH_CONF");
    if (conf && strstr(conf, "backend=sim")) {
        void *p = tp_torch_alloc(4096, 0, NULL);
        CHECK(p != NULL);
        if (p) tp_torch_free(p, 4096, 0, NULL);
    }
    const char *all = tp_torch_stats_json(-1);
    printf("%s\n", all);
    CHECK(valid_json(all));
    if (!strstr(all, expect)) {
        fprintf(stderr, "the stats JSON lacks %s\n", expect);
        failures++;
    }
    CHECK(valid_json(tp_torch_stats_json(0)));
    return failures;
}

/* Runs this program as json-child with conf; its exit status. */
static int spawn_json_child(const char *conf, const char *expect) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        setenv("TIDEPOOL_TORCH_CONF", conf, 1);
        setenv("CUDA_VISIBLE_DEVICES", "", 1);
        execl("/proc/self/exe", "test_torch_shim", "json-child", expect, (char *)NULL);
        perror("exec /proc/self/exe");
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run_json(const char *dir) {
    char path[1024], conf[1200];
    /* the stats path: in the JSON's configuration and the file's name */
    snprintf(path, sizeof path, "%s/stats-" HOSTILE ".json", dir);
    CHECK(!strchr(dir, ','));
    remove(path);
    snprintf(conf, sizeof conf, "backend=sim:1GiB,log=off,oom=null,stats=%s", path);
    CHECK(spawn_json_child(conf, "/stats-" HOSTILE_JSON ".json\"") == 0);
    /* the file written at exit holds the same */
    FILE *f = fopen(path, "rb");
    CHECK(f != NULL);
    if (f) {
        static char text[1 << 16];
        size_t n = fread(text, 1, sizeof text - 1, f);
        fclose(f);
        text[n] = '\0';
        CHECK(n > 0 && valid_json(text));
        CHECK(strstr(text, "/stats-" HOSTILE_JSON ".json\"") != NULL);
        remove(path);
    }
    /* a bad value: echoed in the configuration's error */
    CHECK(spawn_json_child("log=off,oom=null,limit=" HOSTILE, "\"error\":\"limit=" HOSTILE_JSON ": expected") == 0);
    /* the checks themselves: what they must refuse */
    CHECK(!valid_json("{\"a\":\"\xff\"}"));
    CHECK(!valid_json("{\"a\":\"\xe2\x82\"}"));
    CHECK(!valid_json("{\"a\":\"\xed\xa0\x80\"}")); /* a surrogate */
    CHECK(!valid_json("{\"a\":\"x\"y\"}"));
    CHECK(!valid_json("{\"a\":\"\x01\"}"));
    CHECK(!valid_json("{\"a\":\"\\x\"}"));
    CHECK(valid_json("{\"a\":[1,-2.5e3,true,null,\"\xc3\xa9\\u00ff\"],\"b\":{}}"));
    return failures;
}

static uint64_t wall_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int run_timed(void) {
    char err[256], key[64];
    /* A value that is neither on nor off: refused, naming the key; the
     * configuration from the environment stays. */
    CHECK(tp_torch_configure("backend=sim:4GiB,time_calls=maybe", err, sizeof err, key, sizeof key) == -1);
    CHECK(!strcmp(key, "time_calls"));
    CHECK(strstr(err, "expected on or off") != NULL);
    CHECK(strstr(tp_torch_stats_json(-1), "\"time_calls\":true") != NULL);

    uint64_t start = wall_ns();
    run_sim_threads();
    long long wall = (long long)(wall_ns() - start);
    const char *s = tp_torch_stats_json(0);
    printf("%s\n", s);
    CHECK(strstr(s, "\"timed\":true") != NULL);
    long long calls = json_number(s, "\"alloc_calls\"") + json_number(s, "\"free_calls\"");
    long long alloc_ns = json_number(s, "\"alloc_ns\""), free_ns = json_number(s, "\"free_ns\"");
    long long slowest = json_number(s, "\"slowest_call_ns\"");
    CHECK(calls > THREADS * ROUNDS / 2);
    CHECK(alloc_ns > 0 && free_ns > 0);
    CHECK(alloc_ns + free_ns <= THREADS * wall); /* each thread's calls fit in its own time */
    CHECK(slowest > 0 && slowest * calls >= alloc_ns + free_ns && slowest <= alloc_ns + free_ns);

    /* Quiet for 20 ticks: the upkeep thread ticks the pool, timed. */
    struct timespec pause = {0, 200 * 1000000L};
    nanosleep(&pause, NULL);
    CHECK(json_number(tp_torch_stats_json(0), "\"upkeep_ns\"") > 0);
    return failures;
}

static void *trace_thread(void *arg) {
    unsigned seed = (unsigned)(uintptr_t)arg;
    void *live[16] = {0};
    ssize_t sizes[16] = {0};
    for (int i = 0; i < 2000; i++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 8) % 16);
        if (live[k]) {
            tp_torch_free(live[k], sizes[k], 0, NULL);
            live[k] = NULL;
        } else {
            sizes[k] = (ssize_t)(1 + (seed >> 12) % (3u << 20));
            live[k] = tp_torch_alloc(sizes[k], 0, NULL);
            if (!live[k]) return (void *)1;
        }
    }
    for (int k = 0; k < 16; k++)
        if (live[k]) tp_torch_free(live[k], sizes[k], 0, NULL);
    return NULL;
}

/* The trace file of device 0 (its "path" in the stats JSON, %p replaced)
 * into path; false when the JSON has none. */
static bool trace_path_of_device0(char *path, size_t capacity) {
    const char *at = strstr(tp_torch_stats_json(0), "\"trace\":{\"path\":\"");
    if (!at) return false;
    at += strlen("\"trace\":{\"path\":\"");
    snprintf(path, capacity, "%.*s", (int)strcspn(at, "\""), at);
    return true;
}

/* What a trace file holds: its rows read back as tide replay would. */
typedef struct trace_figures {
    bool header_ok;
    long long allocs, frees; /* rows that parse and fit (a free of a live block) */
    long long bad_rows;      /* rows that do not parse, or free no live block */
    long long live, max_live;
    long long stream_nonzero;
} trace_figures;

static trace_figures read_trace(const char *path) {
    trace_figures r = {0};
    FILE *f = fopen(path, "r");
    if (!f) {
        r.bad_rows = -1;
        return r;
    }
    char line[256];
    r.header_ok = fgets(line, sizeof line, f) && !strcmp(line, "time_us,action,addr,size,stream\n");
    /* live bytes per address: a small open-addressing table */
    enum { SLOTS = 1 << 12 };
    static unsigned long long keys[SLOTS], vals[SLOTS];
    memset(keys, 0, sizeof keys);
    size_t count = 0;
    while (fgets(line, sizeof line, f)) {
        unsigned long long t, addr, size, stream;
        char action[8];
        int end = 0;
        if (sscanf(line, "%llu,%7[a-z],%llu,%llu,%llu\n%n", &t, action, &addr, &size, &stream, &end) != 5 || !end ||
            line[end] || !addr || (strcmp(action, "alloc") && strcmp(action, "free"))) {
            r.bad_rows++;
            continue;
        }
        if (stream) r.stream_nonzero++;
        size_t h = (size_t)((addr * 0x9E3779B97F4A7C15ull) >> 52) & (SLOTS - 1);
        while (keys[h] && keys[h] != addr) h = (h + 1) & (SLOTS - 1);
        if (!strcmp(action, "alloc")) {
            if (keys[h] || count + 1 >= SLOTS) { /* already live */
                r.bad_rows++;
                continue;
            }
            keys[h] = addr;
            vals[h] = size;
            count++;
            r.allocs++;
            r.live += (long long)size;
            if (r.live > r.max_live) r.max_live = r.live;
            continue;
        }
        if (keys[h] != addr || vals[h] != size) {
            r.bad_rows++;
            continue;
        }
        r.live -= (long long)vals[h];
        /* deletion with backward shift */
        size_t i = h;
        for (size_t j = (i + 1) & (SLOTS - 1); keys[j]; j = (j + 1) & (SLOTS - 1)) {
            size_t home = (size_t)((keys[j] * 0x9E3779B97F4A7C15ull) >> 52) & (SLOTS - 1);
            if (((j - home) & (SLOTS - 1)) >= ((j - i) & (SLOTS - 1))) {
                keys[i] = keys[j];
                vals[i] = vals[j];
                i = j;
            }
        }
        keys[i] = 0;
        count--;
        r.frees++;
    }
    fclose(f);
    return r;
}

static int run_trace(void) {
    pthread_t threads[THREADS];
    for (int t = 0; t < THREADS; t++) pthread_create(&threads[t], NULL, trace_thread, (void *)(uintptr_t)(t + 1));
    for (int t = 0; t < THREADS; t++) {
        void *r;
        pthread_join(threads[t], &r);
        CHECK(r == NULL);
    }
    const char *s = tp_torch_stats_json(0);
    long long allocs = json_number(s, "\"allocs\""), frees = json_number(s, "\"frees\"");
    long long peak = json_number(s, "\"requested_bytes\":{\"current\":0,\"peak\"");
    CHECK(allocs > 0 && allocs == frees && peak > 0);
    CHECK(strstr(s, "\"open\":true") != NULL);
    /* the file: the resolved path (%p replaced) in the device's "trace" */
    char path[1024];
    CHECK(trace_path_of_device0(path, sizeof path));
    if (!path[0]) return 1;
    CHECK(strstr(path, "%p") == NULL);
    CHECK(tp_torch_trace_close() == 1);
    CHECK(tp_torch_trace_close() == 0); /* already closed */
    CHECK(strstr(tp_torch_stats_json(0), "\"open\":false") != NULL);
    void *late = tp_torch_alloc(4096, 0, NULL); /* not recorded */
    CHECK(late != NULL);
    tp_torch_free(late, 4096, 0, NULL);
    trace_figures r = read_trace(path);
    CHECK(r.header_ok && r.bad_rows == 0 && r.stream_nonzero == 0);
    CHECK(r.allocs == allocs && r.frees == frees && r.live == 0);
    CHECK(r.max_live == peak);
    if (r.max_live != peak) fprintf(stderr, "trace peak %lld, pool peak %lld\n", r.max_live, peak);
    remove(path);
    return failures;
}

/* fork: pairs of alloc and free of 4096.. bytes on device 0 (the trace
 * buffers about 6000 rows before it writes). */
static bool alloc_free_pairs(int pairs) {
    for (int i = 0; i < pairs; i++) {
        void *p = tp_torch_alloc(4096 + (i % 7) * 512, 0, NULL);
        if (!p) return false;
        tp_torch_free(p, 4096 + (i % 7) * 512, 0, NULL);
    }
    return true;
}

static long long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* LeakSanitizer's check at exit is skipped in fork()ed children. Its
 * runtime (clang 14's, Debian's) holds none of its own locks across
 * fork(): a child of a threaded process can wait for good in that check for
 * a sanitizer lock that was held in the parent at the fork (gdb on a hung
 * child of fork_exit_threads under ASan, on a loaded 2-core machine: in
 * __lsan::LockAllocator; about one run in ten; none in 40 runs with
 * detect_leaks=0). The shim's
 * exit handler, what fork_exit_threads tests, still runs in every child;
 * the parent's leak check stays. __lsan_is_turned_off is the runtime's
 * hook for this: it asks the program before each check. */
static atomic_bool is_forked_child;
#if defined(__SANITIZE_ADDRESS__)
#define TPT_LSAN_HOOK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(leak_sanitizer)
#define TPT_LSAN_HOOK 1
#endif
#endif
#ifdef TPT_LSAN_HOOK
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return atomic_load(&is_forked_child); }
#endif

/* Runs child in a fork()ed child; its wait status. */
static int in_child(void (*child)(void)) {
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        atomic_store(&is_forked_child, true);
        child(); /* does not return */
    }
    int status = -1;
    if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
    return status;
}

static void child_exits(void) { exit(0); }

static void child_allocates(void) { _exit(alloc_free_pairs(5000) ? 0 : 1); }

/* fork with trace=FILE (plain CSV): the parent has written part of its rows
 * (16000, more than the buffer holds). A child that calls exit(0) (libc
 * flushes every FILE there) and a child that allocates and frees 10000
 * rows, more than the buffer holds, leave the parent's file as it was; at
 * the end it holds exactly the parent's rows. */
static int run_fork(void) {
    enum { PARENT_PAIRS = 8000 };
    CHECK(alloc_free_pairs(PARENT_PAIRS));
    char path[1024] = "";
    CHECK(trace_path_of_device0(path, sizeof path));
    if (!path[0]) return 1;
    long long before = file_size(path);
    CHECK(before > 0); /* the parent's first rows went out */
    int status = in_child(child_exits);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    long long after_exit = file_size(path);
    CHECK(after_exit == before);
    if (after_exit != before) fprintf(stderr, "a child's exit(0) wrote %lld bytes into the trace\n", after_exit - before);
    status = in_child(child_allocates);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    long long after_allocs = file_size(path);
    CHECK(after_allocs == after_exit);
    if (after_allocs != after_exit)
        fprintf(stderr, "a child's allocations wrote %lld bytes into the trace\n", after_allocs - after_exit);
    const char *s = tp_torch_stats_json(0);
    CHECK(json_number(s, "\"rows\"") == 2 * PARENT_PAIRS); /* the parent's count: the children's are their own */
    CHECK(tp_torch_trace_close() == 1);
    trace_figures r = read_trace(path);
    CHECK(r.header_ok && r.bad_rows == 0 && r.live == 0);
    CHECK(r.allocs == PARENT_PAIRS && r.frees == PARENT_PAIRS);
    if (r.bad_rows || r.allocs != PARENT_PAIRS)
        fprintf(stderr, "the trace: %lld allocs, %lld frees, %lld bad rows; the parent made %d of each\n", r.allocs,
                r.frees, r.bad_rows, PARENT_PAIRS);
    remove(path);
    return failures;
}

/* fork_exit_threads: a thread allocates and frees in a loop (trace= on:
 * every event takes the trace's lock) while the main thread forks children
 * that call exit(0), as os.fork() + sys.exit() would. A lock that thread
 * held at the fork stays held in the child for good: the shim's exit
 * handler must not wait for it. A child that hangs dies of SIGALRM. */
static atomic_bool hammer_stop;

static void *hammer_thread(void *arg) {
    (void)arg;
    while (!atomic_load(&hammer_stop)) {
        void *p = tp_torch_alloc(8192, 0, NULL);
        if (!p) return (void *)1;
        tp_torch_free(p, 8192, 0, NULL);
    }
    return NULL;
}

/* ThreadSanitizer sleeps a second in every exit (atexit_sleep_ms), a
 * child's too: fewer forks there. */
#if defined(__SANITIZE_THREAD__)
#define TSAN_BUILD 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define TSAN_BUILD 1
#endif
#endif
#ifndef TSAN_BUILD
#define TSAN_BUILD 0
#endif

/* A hang is forever; the alarm only has to outlast a slow exit (a child's
 * exit under a sanitizer, on a loaded 2-core CI machine: seconds). */
static void child_exits_soon(void) {
    alarm(10);
    exit(0);
}

static int run_fork_exit_threads(void) {
    void *p = tp_torch_alloc(4096, 0, NULL); /* the pool and its trace exist before the thread starts */
    CHECK(p != NULL);
    tp_torch_free(p, 4096, 0, NULL);
    pthread_t thread;
    CHECK(pthread_create(&thread, NULL, hammer_thread, NULL) == 0);
    int hung = 0, other = 0;
    enum { FORKS = TSAN_BUILD ? 4 : 20 };
    for (int i = 0; i < FORKS; i++) {
        usleep(1000);
        int status = in_child(child_exits_soon);
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM) hung++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) other++;
    }
    atomic_store(&hammer_stop, true);
    void *r = (void *)1;
    pthread_join(thread, &r);
    CHECK(r == NULL);
    CHECK(hung == 0);
    CHECK(other == 0);
    if (hung || other) fprintf(stderr, "of %d forked children, %d hung in exit() and %d failed\n", FORKS, hung, other);
    char path[1024] = "";
    CHECK(trace_path_of_device0(path, sizeof path));
    CHECK(tp_torch_trace_close() == 1);
    trace_figures t = read_trace(path);
    CHECK(t.header_ok && t.bad_rows == 0 && t.live == 0 && t.allocs > 0);
    remove(path);
    return failures;
}

/* trace_full: trace=/dev/full, where every write fails (ENOSPC). The
 * first failure is logged once at ERROR (stderr is read back here); the
 * stats JSON says so ("write_failed") and counts the rows that never
 * reached the file ("rows_lost") apart from the rows recorded; closing
 * reports the failure, and then every row is lost. */
static int run_trace_full(void) {
    FILE *log = tmpfile();
    CHECK(log != NULL);
    if (!log) return 1;
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(log), 2);
    enum { PAIRS = 20000 }; /* 40000 rows: the buffer (about 6000) is written several times */
    bool ok = alloc_free_pairs(PAIRS);
    const char *s = tp_torch_stats_json(0);
    printf("%s\n", s);
    CHECK(ok);
    CHECK(strstr(s, "\"trace\":{\"path\":\"/dev/full\"") != NULL);
    CHECK(strstr(s, "\"write_failed\":true") != NULL);
    CHECK(strstr(s, "\"open\":true") != NULL);
    long long rows = json_number(s, "\"rows\""), lost = json_number(s, "\"rows_lost\"");
    CHECK(rows == 2 * PAIRS);
    CHECK(lost > 0 && lost < rows && rows - lost < 10000); /* all but the rows still buffered */
    CHECK(tp_torch_trace_close() == -1);
    s = tp_torch_stats_json(0);
    CHECK(json_number(s, "\"rows_lost\"") == rows); /* the rest went at the close */
    CHECK(strstr(s, "\"write_failed\":true") != NULL && strstr(s, "\"open\":false") != NULL);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    static char text[1 << 14];
    rewind(log);
    size_t n = fread(text, 1, sizeof text - 1, log);
    fclose(log);
    text[n] = '\0';
    fprintf(stderr, "stderr: %s", text);
    int lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    CHECK(lines == 1); /* logged once */
    CHECK(strstr(text, "tidepool-torch error: ") == text);
    CHECK(strstr(text, "/dev/full") != NULL);
    return failures;
}

/* config_threads: settings A and B differ in two keys; a reader must see
 * both keys of one of them (or the environment's, before the first call). */
#define CONF_A "backend=sim:4GiB,kind=vmm,tick_ms=5,log=off,oom=null"
#define CONF_B "backend=sim:4GiB,kind=segment,tick_ms=7,log=off,oom=null"
static atomic_int configure_failures, torn_reads, config_readers_done;

static void *config_writer(void *arg) {
    (void)arg;
    char err[200], key[64];
    for (int i = 0; i < ROUNDS; i++)
        if (tp_torch_configure(i % 2 ? CONF_A : CONF_B, err, sizeof err, key, sizeof key) != 0)
            atomic_fetch_add(&configure_failures, 1);
    return NULL;
}

static void *config_reader(void *arg) {
    (void)arg;
    for (int i = 0; i < ROUNDS / 4; i++) {
        const char *json = tp_torch_stats_json(-1);
        bool a = strstr(json, "\"kind\":\"vmm\"") && strstr(json, "\"tick_ms\":5,");
        bool b = strstr(json, "\"kind\":\"segment\"") && strstr(json, "\"tick_ms\":7,");
        bool env = strstr(json, "\"kind\":\"auto\"") && strstr(json, "\"tick_ms\":1000,");
        if (!a && !b && !env) atomic_fetch_add(&torn_reads, 1);
        /* Failing calls that read the log level and the oom mode. */
        tp_torch_set_memory_fraction(-1.0, 0);
        if (tp_torch_alloc(4096, -1, NULL)) atomic_fetch_add(&torn_reads, 1000000);
        tp_torch_free((void *)(uintptr_t)0x1000, 4096, -1, NULL);
    }
    atomic_fetch_add(&config_readers_done, 1);
    return NULL;
}

static int run_config_threads(void) {
    pthread_t t[6];
    for (int i = 0; i < 6; i++) pthread_create(&t[i], NULL, i < 2 ? config_writer : config_reader, NULL);
    for (int i = 0; i < 6; i++) pthread_join(t[i], NULL);
    CHECK(atomic_load(&config_readers_done) == 4);
    CHECK(atomic_load(&configure_failures) == 0); /* no pool was attempted: configure stays open */
    CHECK(atomic_load(&torn_reads) == 0);
    if (atomic_load(&torn_reads)) fprintf(stderr, "torn configuration reads: %d\n", atomic_load(&torn_reads));
    /* The last setting written is the one in force. */
    char err[200], key[64];
    CHECK(tp_torch_configure(CONF_A, err, sizeof err, key, sizeof key) == 0);
    void *p = tp_torch_alloc(4096, 0, NULL);
    CHECK(p != NULL);
    const char *json = tp_torch_stats_json(0);
    CHECK(strstr(json, "\"kind\":\"vmm\"") != NULL);
    tp_torch_free(p, 4096, 0, NULL);
    CHECK(tp_torch_configure(CONF_B, err, sizeof err, key, sizeof key) == -2);
    return failures;
}

int main(int argc, char **argv) {
    if (argc == 3 && !strcmp(argv[1], "json")) return run_json(argv[2]) ? 1 : 0;
    if (argc == 3 && !strcmp(argv[1], "json-child")) return run_json_child(argv[2]) ? 1 : 0;
    if (argc == 2 && !strcmp(argv[1], "trace_full") && access("/dev/full", W_OK) != 0) {
        printf("trace_full: no /dev/full: skipped\n");
        return 77;
    }
    if (argc != 2) {
        fprintf(stderr, "usage: test_torch_shim nodevice|sim|timed|trace|trace_full|config_threads|fork|fork_exit_threads|json DIR\n");
        return 2;
    }
    int rc = !strcmp(argv[1], "nodevice") ? run_nodevice()
             : !strcmp(argv[1], "sim")    ? run_sim()
             : !strcmp(argv[1], "trace")  ? run_trace()
             : !strcmp(argv[1], "timed")  ? run_timed()
             : !strcmp(argv[1], "config_threads") ? run_config_threads()
             : !strcmp(argv[1], "trace_full") ? run_trace_full()
             : !strcmp(argv[1], "fork")   ? run_fork()
             : !strcmp(argv[1], "fork_exit_threads") ? run_fork_exit_threads()
                                          : -1;
    if (rc < 0) {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    printf("%s: %s\n", argv[1], failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
