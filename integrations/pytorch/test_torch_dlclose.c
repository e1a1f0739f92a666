/* SPDX-License-Identifier: MIT */
/*
 * test_torch_dlclose.c -- the shim loaded with dlopen() and unloaded with
 * dlclose() while code of it is still due to run:
 *   - its upkeep thread (tick_ms, detached, never joined) wakes every few
 *     milliseconds;
 *   - a thread that asked for the stats JSON holds its per-thread buffers,
 *     whose pthread key destructor (run when that thread exits) is the
 *     shim's.
 * Unmapped, either jumps into nothing (SIGSEGV). The shim is linked with
 * -z nodelete, so dlclose() leaves it mapped and the process survives.
 *
 *   test_torch_dlclose PATH/libtidepool_torch.so
 *
 * A program of its own, not a mode of test_torch_shim: that one is linked
 * against the shim, whose dlclose() would then unload nothing.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>

typedef int (*configure_fn)(const char *, char *, size_t, char *, size_t);
typedef void *(*alloc_fn)(ssize_t, int, void *);
typedef void (*free_fn)(void *, ssize_t, int, void *);
typedef const char *(*stats_fn)(int);

static stats_fn stats_json;
static sem_t asked, unloaded;

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* Gets its per-thread buffers from the shim, then waits for the unload and
 * exits (running the shim's key destructor). */
static void *worker(void *arg) {
    (void)arg;
    const char *json = stats_json(-1);
    int ok = json && json[0] == '{';
    sem_post(&asked);
    sem_wait(&unloaded);
    return ok ? NULL : (void *)1;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: test_torch_dlclose PATH/libtidepool_torch.so\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    configure_fn configure = (configure_fn)dlsym(lib, "tp_torch_configure");
    alloc_fn try_alloc = (alloc_fn)dlsym(lib, "tp_torch_try_alloc");
    free_fn release = (free_fn)dlsym(lib, "tp_torch_free");
    stats_json = (stats_fn)dlsym(lib, "tp_torch_stats_json");
    if (!configure || !try_alloc || !release || !stats_json) {
        fprintf(stderr, "dlsym: a tp_torch_* function is missing\n");
        return 1;
    }
    char err[256], key[64];
    /* tick_ms=2: the upkeep thread starts with the pool and wakes every 2 ms. */
    if (configure("backend=sim:1GiB,log=off,oom=null,tick_ms=2", err, sizeof err, key, sizeof key) != 0) {
        fprintf(stderr, "tp_torch_configure: %s\n", err);
        return 1;
    }
    void *p = try_alloc(1 << 20, 0, NULL);
    if (!p) {
        fprintf(stderr, "tp_torch_try_alloc failed\n");
        return 1;
    }
    release(p, 1 << 20, 0, NULL);

    sem_init(&asked, 0, 0);
    sem_init(&unloaded, 0, 0);
    pthread_t thread;
    if (pthread_create(&thread, NULL, worker, NULL) != 0) return 1;
    sem_wait(&asked);

    if (dlclose(lib) != 0) {
        fprintf(stderr, "dlclose: %s\n", dlerror());
        return 1;
    }
    printf("dlclose done; the upkeep thread ticks on\n");
    fflush(stdout);
    sleep_ms(100); /* about 50 ticks */
    sem_post(&unloaded);
    void *result = (void *)1;
    pthread_join(thread, &result); /* its exit ran the key destructor */
    sleep_ms(20);
    printf("dlclose: %s\n", result ? "FAILED (no stats JSON)" : "ok (the process survived)");
    return result ? 1 : 0;
}
