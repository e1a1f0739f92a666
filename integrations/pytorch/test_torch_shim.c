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
 *
 * The shim exports only tp_torch_*, so the checks read its stats JSON.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

void *tp_torch_alloc(ssize_t size, int device, void *stream);
void tp_torch_free(void *ptr, ssize_t size, int device, void *stream);
void tp_torch_init(int device_count);
void tp_torch_empty_cache(void);
void tp_torch_set_memory_fraction(double fraction, int device);
void tp_torch_record_stream(void *ptr, void *stream);
unsigned long long tp_torch_trim(int device, unsigned long long target_reserved_bytes);
int tp_torch_reset_peaks(int device);
const char *tp_torch_stats_json(int device);

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
    return NULL;
}

static int run_sim(void) {
    tp_torch_init(2);
    CHECK(tp_torch_alloc(0, 0, NULL) == NULL);

    pthread_t threads[THREADS];
    for (int i = 0; i < THREADS; i++)
        CHECK(pthread_create(&threads[i], NULL, sim_thread, (void *)(uintptr_t)(i + 1)) == 0);
    for (int i = 0; i < THREADS; i++) {
        void *got = (void *)1;
        pthread_join(threads[i], &got);
        CHECK(got == NULL);
    }
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

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_torch_shim nodevice|sim\n");
        return 2;
    }
    int rc = !strcmp(argv[1], "nodevice") ? run_nodevice() : !strcmp(argv[1], "sim") ? run_sim() : -1;
    if (rc < 0) {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    printf("%s: %s\n", argv[1], failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
