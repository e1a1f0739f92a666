/* SPDX-License-Identifier: MIT */
/*
 * tidepool_torch.c -- a PyTorch CUDA pluggable allocator backed by tidepool.
 *
 * PyTorch loads the pair
 *     void *tp_torch_alloc(ssize_t size, int device, cudaStream_t stream)
 *     void  tp_torch_free(void *ptr, ssize_t size, int device, cudaStream_t stream)
 * through torch.cuda.memory.CUDAPluggableAllocator(path, "tp_torch_alloc",
 * "tp_torch_free"). A cudaStream_t is the driver's CUstream, so it is passed
 * to tidepool as a tp_stream unchanged; no CUDA header is needed and nothing
 * links against CUDA (tidepool dlopens the driver).
 *
 * Pools: one per device ordinal, created on the first allocation for that
 * device ("cuda:N", or "cuda:N,novmm" for kind=segment), under a global
 * creation lock; afterwards the pool pointer is read with one acquire load.
 * A device that cannot be opened stays failed (one line on stderr) and every
 * allocation on it returns NULL; PyTorch's own handling of a NULL return
 * applies (see README.md).
 *
 * Size 0: returns NULL without touching a pool, as PyTorch's caching
 * allocator does for empty tensors; tp_torch_free(NULL, ...) does nothing.
 *
 * Out of memory (oom=): PyTorch 2.11's pluggable allocator does not check
 * for NULL (a failed 2 GiB request became a tensor at address 0), so
 * tp_torch_alloc, defined in tidepool_torch_raise.cpp, throws a C++
 * exception by default (oom=raise: PyTorch raises RuntimeError with
 * tidepool's out-of-memory report); oom=null returns NULL, oom=abort prints
 * the report and aborts. tp_torch_try_alloc never throws: the entry point
 * for C and ctypes callers. Built without a C++ compiler, tp_torch_alloc is
 * defined here and oom=raise is not available (the default is then null).
 *
 * Configuration: TIDEPOOL_TORCH_CONF, read once when the library is loaded
 * (constructor) or at the first call, or tp_torch_configure before the
 * first pool. key=value items separated by commas; an unknown key, a
 * duplicate or a value that does not parse prints one line to stderr naming
 * it, and the configuration is refused as a whole: no pool is created and
 * every allocation fails with that message (falling back to the defaults
 * would drop the limit the user asked for). tp_torch_configure reports the
 * item instead (the Python package raises ValueError naming the key).
 * Until the first pool it may replace the configuration while other
 * threads read it: the configuration changes only under the creation lock,
 * and its readers copy it under that lock, except the log level, the oom
 * mode and time_calls, mirrored in atomics (log lines are also written with
 * the lock held).
 *
 * Observability: tp_torch_metrics (Prometheus text), tp_torch_snapshot_json
 * (the memory map), trace=PATH (a CSV trace of every alloc and free, from a
 * pool observer: tidepool_torch_trace.c), time_calls=on (the wall time spent
 * inside the shim's alloc and free and the upkeep thread's ticks, summed per
 * device in the stats JSON: what the allocator's own work costs the host
 * thread that calls it; two precise clock reads a call, off by default).
 *
 * Hooks beyond alloc/free, for C++ hosts (CUDAPluggableAllocator's set_*_fn
 * are not exposed to Python) and for ctypes callers: tp_torch_init,
 * tp_torch_empty_cache (reset_fn: trim every pool to 0), tp_torch_set_memory_
 * fraction, tp_torch_record_stream, tp_torch_reset_peaks, tp_torch_trim and
 * tp_torch_stats_json.
 *
 * record_stream: a side table of (ptr, stream) pairs: a tpi_map from the
 * pointer to a list of its streams in a side array of nodes. At
 * free, for every recorded stream other than the free stream, an event is
 * recorded on it and the free stream waits on it before the block is freed
 * on the free stream: tidepool then reuses the block only after the work of
 * every stream that used it. A failing event call falls back to
 * synchronising that stream. A free that is going to fail (the pointer is
 * not a live block of that device's pool: a wrong device) leaves the
 * pointer's streams recorded for the free that succeeds. The table costs
 * one relaxed load per free while it is empty; otherwise a lookup under its
 * lock, and for a pointer with recorded streams tp_pool_block_size.
 *
 * Upkeep: a background thread wakes every tick_ms; if no allocation or free
 * happened since its last wake it calls tp_pool_tick on every pool, so idle
 * memory above release_threshold goes back to the driver after
 * idle_release_ms even when the process has gone quiet. Busy processes do
 * not need it (the pools' own upkeep runs on frees).
 *
 * Exit: an atexit handler writes every pool's statistics to the stats= path
 * (or stderr with stats=-). Pools are never destroyed: PyTorch can still free
 * tensors after atexit handlers have run. A fork()ed child writes neither
 * the report nor the traces (see "fork" below).
 */
#include "tidepool.h"
#include "tidepool_torch_internal.h"
#include "tpi_map.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#define TPT_EXPORT __attribute__((visibility("default")))
#define TPT_MAX_DEVICES 64
#define TPT_PREFIX "tidepool-torch"
#define TPT_LOG_OFF 4

/* ------------------------------------------------------------ exported API */

TPT_EXPORT void *tp_torch_alloc(ssize_t size, int device, void *stream);
TPT_EXPORT void *tp_torch_try_alloc(ssize_t size, int device, void *stream);
TPT_EXPORT void tp_torch_free(void *ptr, ssize_t size, int device, void *stream);
TPT_EXPORT void tp_torch_init(int device_count);
TPT_EXPORT void tp_torch_empty_cache(void);
TPT_EXPORT void tp_torch_set_memory_fraction(double fraction, int device);
TPT_EXPORT void tp_torch_record_stream(void *ptr, void *stream);
TPT_EXPORT unsigned long long tp_torch_trim(int device, unsigned long long target_reserved_bytes);
TPT_EXPORT int tp_torch_reset_peaks(int device);
TPT_EXPORT const char *tp_torch_stats_json(int device);
TPT_EXPORT int tp_torch_configure(const char *text, char *err, size_t err_capacity, char *bad_key,
                                  size_t bad_key_capacity);
TPT_EXPORT int tp_torch_prepare(int device);
TPT_EXPORT const char *tp_torch_metrics(int device, const char *labels);
TPT_EXPORT const char *tp_torch_snapshot_json(int device);
TPT_EXPORT void tp_torch_set_oom_handler(void (*handler)(const char *message));
TPT_EXPORT int tp_torch_trace_close(void);

/* ----------------------------------------------------------------- config */

typedef enum tpt_backend { TPT_BACKEND_CUDA, TPT_BACKEND_SIM } tpt_backend;

typedef struct tpt_config {
    tp_pool_kind kind;
    uint64_t limit_bytes;       /* 0: the device's capacity */
    double limit_fraction;      /* > 0: limit=NN% of capacity */
    uint64_t release_threshold_bytes;
    uint64_t idle_release_ns;
    uint64_t alignment_bytes;
    uint64_t page_bytes;
    uint64_t va_reserve_bytes;
    uint64_t max_map_bytes;
    uint64_t max_chunk_bytes;
    uint64_t tick_ns;           /* 0: no upkeep thread */
    int log_level;              /* tp_log_level, or TPT_LOG_OFF */
    tpt_backend backend;
    uint64_t sim_capacity_bytes;
    tpt_oom_mode oom;
    bool time_calls;            /* time_calls=on: time every call (stats JSON) */
    char stats_path[PATH_MAX];  /* "": none, "-": stderr */
    char trace_path[PATH_MAX];  /* "": no trace */
} tpt_config;

static void config_defaults(tpt_config *c) {
    memset(c, 0, sizeof *c);
    c->kind = TP_POOL_AUTO;
    c->alignment_bytes = 512; /* PyTorch's caching allocator rounds blocks to 512 B */
    c->tick_ns = 1000000000ull;
    c->log_level = TP_LOG_WARN;
    c->backend = TPT_BACKEND_CUDA;
#ifdef TPT_HAVE_CXX
    c->oom = TPT_OOM_RAISE;
#else
    c->oom = TPT_OOM_NULL;
#endif
}

static const char *oom_name(tpt_oom_mode mode) {
    return mode == TPT_OOM_RAISE ? "raise" : mode == TPT_OOM_ABORT ? "abort" : "null";
}

/* A size: a decimal number with an optional fraction, then an optional unit
 * (README.md). tidepool's tp_parse_bytes reads it; this only turns away what
 * tp_parse_bytes would accept beyond that syntax (spaces, exponents,
 * hexadecimal, a sign) and fractions of a byte ("1.5", "1.5B"). */
static bool parse_size(const char *text, uint64_t *out) {
    const char *p = text;
    while (isdigit((unsigned char)*p)) p++;
    if (p == text) return false;
    bool nonzero_fraction = false;
    if (*p == '.') {
        const char *digits = ++p;
        while (isdigit((unsigned char)*p)) nonzero_fraction |= *p++ != '0';
        if (p == digits) return false;
    }
    const char *unit = p;
    while (isalpha((unsigned char)*p)) p++;
    if (*p) return false;
    bool bytes = !*unit || ((unit[0] == 'B' || unit[0] == 'b') && !unit[1]);
    if (bytes && nonzero_fraction) return false;
    return tp_parse_bytes(text, out);
}

static bool parse_uint(const char *text, uint64_t max, uint64_t *out) {
    if (!*text) return false;
    uint64_t v = 0;
    for (const char *p = text; *p; p++) {
        if (*p < '0' || *p > '9') return false;
        if (v > (max - (uint64_t)(*p - '0')) / 10) return false;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    *out = v;
    return true;
}

static bool is_pow2(uint64_t v) { return v && !(v & (v - 1)); }

static const char *level_name(int level) {
    return level == TPT_LOG_OFF ? "off" : tp_log_level_name((tp_log_level)level);
}

static const char *kind_name(tp_pool_kind kind) {
    return kind == TP_POOL_VMM ? "vmm" : kind == TP_POOL_SEGMENT ? "segment" : "auto";
}

/* Parses one item into c. On failure writes why into err. */
static bool parse_item(tpt_config *c, const char *key, const char *value, char *err, size_t err_cap) {
#define BAD(...) do { snprintf(err, err_cap, __VA_ARGS__); return false; } while (0)
    if (!*value) BAD("'%s' has no value", key);
    if (!strcmp(key, "kind")) {
        if (!strcmp(value, "vmm")) c->kind = TP_POOL_VMM;
        else if (!strcmp(value, "segment")) c->kind = TP_POOL_SEGMENT;
        else if (!strcmp(value, "auto")) c->kind = TP_POOL_AUTO;
        else BAD("kind=%s: expected vmm, segment or auto", value);
    } else if (!strcmp(key, "limit")) {
        size_t len = strlen(value);
        if (value[len - 1] == '%') {
            char num[32];
            uint64_t pct;
            if (len - 1 >= sizeof num) BAD("limit=%s: bad percentage", value);
            memcpy(num, value, len - 1);
            num[len - 1] = '\0';
            if (!parse_uint(num, 100, &pct) || pct == 0) BAD("limit=%s: expected 1%%..100%%", value);
            c->limit_fraction = (double)pct / 100.0;
        } else if (!parse_size(value, &c->limit_bytes) || c->limit_bytes == 0) {
            /* 0 is refused, as 0%: inside, 0 means "no limit" (the device's
             * capacity), the opposite of what limit=0 asks for. */
            BAD("limit=%s: expected a size such as 70GiB (> 0), or a percentage such as 90%%", value);
        }
    } else if (!strcmp(key, "release_threshold")) {
        if (!strcmp(value, "unlimited")) c->release_threshold_bytes = TP_BYTES_UNLIMITED;
        else if (!parse_size(value, &c->release_threshold_bytes)) BAD("release_threshold=%s: expected a size or 'unlimited'", value);
        else if (c->release_threshold_bytes == 0) c->release_threshold_bytes = 1; /* tidepool's 0 means default */
    } else if (!strcmp(key, "idle_release_ms")) {
        uint64_t ms;
        if (!strcmp(value, "never")) c->idle_release_ns = TP_NS_NEVER;
        else if (!parse_uint(value, UINT64_MAX / 1000000ull - 1, &ms)) BAD("idle_release_ms=%s: expected milliseconds or 'never'", value);
        else c->idle_release_ns = ms ? ms * 1000000ull : 1;
    } else if (!strcmp(key, "align")) {
        if (!parse_size(value, &c->alignment_bytes) || !is_pow2(c->alignment_bytes) || c->alignment_bytes < 256)
            BAD("align=%s: expected a power of two >= 256", value);
    } else if (!strcmp(key, "page")) {
        if (!parse_size(value, &c->page_bytes) || !is_pow2(c->page_bytes)) BAD("page=%s: expected a power of two size", value);
    } else if (!strcmp(key, "va_reserve")) {
        if (!parse_size(value, &c->va_reserve_bytes)) BAD("va_reserve=%s: expected a size", value);
    } else if (!strcmp(key, "max_map")) {
        if (!parse_size(value, &c->max_map_bytes)) BAD("max_map=%s: expected a size", value);
    } else if (!strcmp(key, "max_chunk")) {
        if (!parse_size(value, &c->max_chunk_bytes)) BAD("max_chunk=%s: expected a size", value);
    } else if (!strcmp(key, "tick_ms")) {
        uint64_t ms;
        if (!parse_uint(value, 86400000ull, &ms)) BAD("tick_ms=%s: expected milliseconds (0: off)", value);
        c->tick_ns = ms * 1000000ull;
    } else if (!strcmp(key, "log")) {
        if (!strcmp(value, "debug")) c->log_level = TP_LOG_DEBUG;
        else if (!strcmp(value, "info")) c->log_level = TP_LOG_INFO;
        else if (!strcmp(value, "warn")) c->log_level = TP_LOG_WARN;
        else if (!strcmp(value, "error")) c->log_level = TP_LOG_ERROR;
        else if (!strcmp(value, "off")) c->log_level = TPT_LOG_OFF;
        else BAD("log=%s: expected debug, info, warn, error or off", value);
    } else if (!strcmp(key, "time_calls")) {
        if (!strcmp(value, "on") || !strcmp(value, "1")) c->time_calls = true;
        else if (!strcmp(value, "off") || !strcmp(value, "0")) c->time_calls = false;
        else BAD("time_calls=%s: expected on or off", value);
    } else if (!strcmp(key, "stats")) {
        if (strlen(value) >= sizeof c->stats_path) BAD("stats=: path too long");
        strcpy(c->stats_path, value);
    } else if (!strcmp(key, "trace")) {
        if (strlen(value) >= sizeof c->trace_path) BAD("trace=: path too long");
        strcpy(c->trace_path, value);
    } else if (!strcmp(key, "oom")) {
        if (!strcmp(value, "null")) c->oom = TPT_OOM_NULL;
        else if (!strcmp(value, "abort")) c->oom = TPT_OOM_ABORT;
#ifdef TPT_HAVE_CXX
        else if (!strcmp(value, "raise")) c->oom = TPT_OOM_RAISE;
        else BAD("oom=%s: expected raise, null or abort", value);
#else
        else BAD("oom=%s: expected null or abort (raise needs the C++ part, not built)", value);
#endif
    } else if (!strcmp(key, "backend")) {
        /* For tests: sim[:CAPACITY] runs on tidepool's simulated device. */
        if (!strcmp(value, "cuda")) {
            c->backend = TPT_BACKEND_CUDA;
        } else if (!strncmp(value, "sim", 3) && (value[3] == '\0' || value[3] == ':')) {
            c->backend = TPT_BACKEND_SIM;
            c->sim_capacity_bytes = 0;
            if (value[3] == ':' && (!parse_size(value + 4, &c->sim_capacity_bytes) || !c->sim_capacity_bytes))
                BAD("backend=%s: expected cuda, sim or sim:SIZE", value);
        } else {
            BAD("backend=%s: expected cuda, sim or sim:SIZE", value);
        }
    } else {
        BAD("unknown key '%s' (known: kind, limit, release_threshold, idle_release_ms, align, page, va_reserve, "
            "max_map, max_chunk, tick_ms, log, time_calls, stats, trace, oom, backend)", key);
    }
    return true;
#undef BAD
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
    return s;
}

/* Parses text into *out (defaults first). Returns false with err filled,
 * and the key of the item at fault (or the item itself, when it is not
 * key=value) in bad_key. */
static bool parse_config(const char *text, tpt_config *out, char *err, size_t err_cap, char *bad_key,
                         size_t bad_key_cap) {
    snprintf(bad_key, bad_key_cap, "%s", "");
    config_defaults(out);
    if (!text) return true;
    size_t len = strlen(text);
    char *copy = malloc(len + 1);
    if (!copy) {
        snprintf(err, err_cap, "out of host memory");
        return false;
    }
    memcpy(copy, text, len + 1);
    bool ok = true;
    char seen[32][24];
    size_t seen_count = 0;
    char *item = copy;
    if (!*trim(copy)) goto done; /* empty: defaults */
    for (;;) {
        char *comma = strchr(item, ',');
        if (comma) *comma = '\0';
        char *it = trim(item);
        char *eq = strchr(it, '=');
        if (!*it) {
            snprintf(err, err_cap, "empty item");
            snprintf(bad_key, bad_key_cap, "%s", "");
            ok = false;
            break;
        }
        if (!eq) {
            snprintf(err, err_cap, "'%s' is not key=value", it);
            snprintf(bad_key, bad_key_cap, "%s", it);
            ok = false;
            break;
        }
        *eq = '\0';
        char *key = trim(it), *value = trim(eq + 1);
        for (size_t i = 0; i < seen_count; i++) {
            if (!strcmp(seen[i], key)) {
                snprintf(err, err_cap, "'%s' given twice", key);
                snprintf(bad_key, bad_key_cap, "%s", key);
                ok = false;
                goto done;
            }
        }
        if (!parse_item(out, key, value, err, err_cap)) {
            snprintf(bad_key, bad_key_cap, "%s", key);
            ok = false;
            break;
        }
        if (seen_count < 32 && strlen(key) < sizeof seen[0]) strcpy(seen[seen_count++], key);
        if (!comma) break;
        item = comma + 1;
    }
done:
    free(copy);
    if (!ok) config_defaults(out);
    return ok;
}

/* ----------------------------------------------------------------- state */

enum { SLOT_UNUSED = 0, SLOT_ACTIVE = 1, SLOT_FAILED = 2 };

typedef struct tpt_slot {
    _Atomic(tp_pool *) pool;
    tp_device *device;      /* set with pool, under create_lock */
    int state;              /* under create_lock */
    tp_status error;        /* why it failed */
    double fraction;        /* from tp_torch_set_memory_fraction before creation; 0: none */
    uint64_t limit_bytes;   /* the limit the pool was created with */
    char spec[48];
    atomic_ullong alloc_calls;
    atomic_ullong free_calls;
    atomic_ullong zero_size_allocs;
    atomic_ullong failed_allocs;
    atomic_ullong free_errors;
    atomic_ullong record_stream_calls;
    atomic_ullong cross_stream_waits;
    /* time_calls=on: nanoseconds inside alloc, free and the upkeep ticks,
     * and the longest single alloc or free */
    atomic_ullong alloc_ns;
    atomic_ullong free_ns;
    atomic_ullong upkeep_ns;
    atomic_ullong slowest_call_ns;
    tpt_trace *trace;       /* trace=: set with pool, under create_lock; never freed */
    char trace_error[160];  /* why the trace could not be opened */
} tpt_slot;

/* record_stream side table: ptr -> the index of its first rs_node in g.rs_nodes;
 * a pointer's streams are a list in recording order. Unused nodes form a free
 * list. */
typedef struct rs_node {
    void *stream;
    uint64_t next; /* RS_NONE: the last */
} rs_node;
#define RS_NONE UINT64_MAX

static struct {
    pthread_once_t once;
    tpt_config config;
    bool config_ok;
    char config_error[256];
    char config_bad_key[64];     /* the key of the item at fault */
    bool config_from_call;       /* set by tp_torch_configure (not the environment) */
    /* config, config_ok, config_error, config_bad_key and config_from_call
     * change only under create_lock (tp_torch_configure, until the first
     * pool): readers that may run before then copy them under the lock
     * (config_view); the three read on every path are mirrored here. */
    atomic_int log_level;        /* config.log_level */
    atomic_int oom_mode;         /* config.oom */
    atomic_bool time_calls;      /* config.time_calls */
    bool pools_attempted;        /* under create_lock: the configuration can no longer change */
    _Atomic(tpt_oom_handler) oom_handler;
    int device_count;            /* from tp_torch_init; 0: unknown */
    pthread_mutex_t create_lock;
    tpt_slot slots[TPT_MAX_DEVICES];
    atomic_ullong activity;      /* allocs + frees, for the upkeep thread */
    atomic_bool exiting;
    atomic_bool forked_child;    /* set in a fork()ed child (after_fork_child) */
    bool tick_started;           /* under create_lock */
    /* record_stream table, under rs_lock */
    pthread_mutex_t rs_lock;
    atomic_size_t rs_live;       /* (ptr, stream) pairs recorded */
    tpi_map rs;                  /* ptr -> first node */
    rs_node *rs_nodes;
    size_t rs_node_count, rs_node_cap;
    uint64_t rs_free;            /* first unused node; RS_NONE: none */
} g = {.once = PTHREAD_ONCE_INIT,
       .create_lock = PTHREAD_MUTEX_INITIALIZER,
       .rs_lock = PTHREAD_MUTEX_INITIALIZER,
       .rs = {.host = &tpi_map_libc_allocator},
       .rs_free = RS_NONE};

/* The shim's own messages, and tidepool_torch_trace.c's (declared in
 * tidepool_torch_internal.h): a line on stderr at level, if the configured
 * log level lets it through. */
void tpt_log(int level, const char *fmt, ...) {
    if (level < atomic_load_explicit(&g.log_level, memory_order_relaxed)) return;
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    fprintf(stderr, TPT_PREFIX " %s: %s\n", level_name(level), buf);
}

/* tidepool's log callback: user is the slot's spec string. */
static void forward_log(void *user, tp_log_level level, const char *message) {
    if ((int)level < atomic_load_explicit(&g.log_level, memory_order_relaxed)) return;
    fprintf(stderr, TPT_PREFIX "[%s] %s: %s\n", (const char *)user, level_name(level), message);
}

static void at_exit(void);
static void before_fork(void);
static void after_fork_parent(void);
static void after_fork_child(void);

/* A configuration with an error is refused as a whole: no pool is created
 * (every allocation fails, naming the item), rather than running on the
 * defaults without the limit the user asked for. */
static void global_init(void) {
    const char *text = getenv("TIDEPOOL_TORCH_CONF");
    char err[200] = "";
    g.config_ok = parse_config(text, &g.config, err, sizeof err, g.config_bad_key, sizeof g.config_bad_key);
    atomic_store(&g.log_level, g.config.log_level);
    atomic_store(&g.oom_mode, (int)g.config.oom);
    atomic_store(&g.time_calls, g.config.time_calls);
    if (!g.config_ok) {
        snprintf(g.config_error, sizeof g.config_error, "%s", err);
        fprintf(stderr, TPT_PREFIX ": TIDEPOOL_TORCH_CONF=\"%s\": %s; no pool will be created (every allocation "
                "fails) until it is fixed\n", text, err);
    }
    atexit(at_exit);
    pthread_atfork(before_fork, after_fork_parent, after_fork_child);
}

static inline void ensure_init(void) { pthread_once(&g.once, global_init); }

__attribute__((constructor)) static void on_load(void) { ensure_init(); }

/* ------------------------------------------------------------ call times */

/* time_calls=on: the precise clock (calls take 0.1-10 us; the coarse one
 * ticks every few milliseconds). */
static uint64_t call_clock_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* The clock if calls are timed, else 0 (then call_timed does nothing). */
static inline uint64_t call_start(void) {
    return atomic_load_explicit(&g.time_calls, memory_order_relaxed) ? call_clock_ns() : 0;
}

/* Adds the time since start_ns (call_start) to *sum, and to the slot's
 * slowest call if alloc or free (slowest true) took longer. */
static void call_timed(tpt_slot *slot, atomic_ullong *sum, uint64_t start_ns, bool slowest) {
    if (!start_ns) return;
    unsigned long long ns = call_clock_ns() - start_ns;
    atomic_fetch_add_explicit(sum, ns, memory_order_relaxed);
    if (!slowest) return;
    unsigned long long seen = atomic_load_explicit(&slot->slowest_call_ns, memory_order_relaxed);
    while (ns > seen && !atomic_compare_exchange_weak_explicit(&slot->slowest_call_ns, &seen, ns,
                                                                memory_order_relaxed, memory_order_relaxed)) {
    }
}

/* ----------------------------------------------------------------- upkeep */

static void *tick_main(void *arg) {
    (void)arg;
    unsigned long long last = ~0ull;
    uint64_t ns = g.config.tick_ns;
    struct timespec ts = {(time_t)(ns / 1000000000ull), (long)(ns % 1000000000ull)};
    while (!atomic_load(&g.exiting)) {
        nanosleep(&ts, NULL);
        if (atomic_load(&g.exiting)) break;
        unsigned long long now = atomic_load_explicit(&g.activity, memory_order_relaxed);
        if (now != last) { /* busy: the pools' own upkeep runs on frees */
            last = now;
            continue;
        }
        for (int d = 0; d < TPT_MAX_DEVICES; d++) {
            tp_pool *pool = atomic_load_explicit(&g.slots[d].pool, memory_order_acquire);
            if (!pool) continue;
            uint64_t start_ns = call_start();
            tp_pool_tick(pool);
            call_timed(&g.slots[d], &g.slots[d].upkeep_ns, start_ns, false);
        }
    }
    return NULL;
}

/* Called with create_lock held. */
static void start_tick_thread(void) {
    if (g.tick_started || !g.config.tick_ns || g.config.idle_release_ns == TP_NS_NEVER) return;
    g.tick_started = true;
    pthread_attr_t attr;
    pthread_t thread;
    if (pthread_attr_init(&attr) != 0) return;
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&thread, &attr, tick_main, NULL) != 0)
        tpt_log(TP_LOG_WARN, "could not start the upkeep thread; idle memory is released only on frees");
    pthread_attr_destroy(&attr);
}

/* ------------------------------------------------------------------ pools */

static tp_pool *create_pool(int ordinal) {
    tpt_slot *slot = &g.slots[ordinal];
    pthread_mutex_lock(&g.create_lock);
    tp_pool *pool = atomic_load_explicit(&slot->pool, memory_order_relaxed);
    if (pool || slot->state == SLOT_FAILED) goto out;
    g.pools_attempted = true;
    const tpt_config *c = &g.config;
    if (!g.config_ok) {
        slot->state = SLOT_FAILED;
        slot->error = TP_ERR_INVALID_ARGUMENT;
        snprintf(slot->spec, sizeof slot->spec, "cuda:%d", ordinal);
        tpt_log(TP_LOG_ERROR, "%s: no pool: the configuration was refused (%s)", slot->spec, g.config_error);
        goto out;
    }
    if (c->backend == TPT_BACKEND_SIM) {
        char cap[32] = "";
        if (c->sim_capacity_bytes) snprintf(cap, sizeof cap, ":%llu", (unsigned long long)c->sim_capacity_bytes);
        snprintf(slot->spec, sizeof slot->spec, "sim%s%s", cap, c->kind == TP_POOL_SEGMENT ? ",novmm" : "");
    } else {
        snprintf(slot->spec, sizeof slot->spec, "cuda:%d%s", ordinal, c->kind == TP_POOL_SEGMENT ? ",novmm" : "");
    }
    tp_device_config dc = {0};
    if (c->log_level != TPT_LOG_OFF) {
        dc.log = forward_log;
        dc.log_user = slot->spec;
        dc.log_level = (tp_log_level)c->log_level;
    }
    tp_device *device = NULL;
    tp_status st = tp_device_open(slot->spec, &dc, &device);
    if (st == TP_OK) {
        tp_device_info info;
        st = tp_device_get_info(device, &info);
        tp_pool_config pc = {0};
        pc.kind = c->kind;
        pc.limit_bytes = c->limit_bytes;
        double fraction = slot->fraction > 0 ? slot->fraction : c->limit_fraction;
        if (st == TP_OK && fraction > 0) {
            uint64_t lim = (uint64_t)((double)info.capacity_bytes * fraction);
            pc.limit_bytes = lim ? lim : 1;
        }
        if (st == TP_OK && pc.limit_bytes > info.capacity_bytes) pc.limit_bytes = 0; /* the device's capacity */
        pc.release_threshold_bytes = c->release_threshold_bytes;
        pc.idle_release_ns = c->idle_release_ns;
        pc.alignment_bytes = c->alignment_bytes;
        pc.page_bytes = c->page_bytes;
        pc.va_reserve_bytes = c->va_reserve_bytes;
        pc.max_map_bytes = c->max_map_bytes;
        pc.max_chunk_bytes = c->max_chunk_bytes;
        if (st == TP_OK) st = tp_pool_create(device, &pc, &pool);
        if (st != TP_OK) {
            tp_device_close(device);
            device = NULL;
            pool = NULL;
        } else {
            tp_pool_stats s;
            if (tp_pool_get_stats(pool, &s) == TP_OK) slot->limit_bytes = s.limit_bytes;
        }
    }
    if (st != TP_OK) {
        slot->state = SLOT_FAILED;
        slot->error = st;
        tpt_log(TP_LOG_ERROR, "%s: no pool (%s: %s); allocations on device %d return NULL", slot->spec,
                 tp_status_name(st), tp_status_describe(st), ordinal);
        goto out;
    }
    if (c->trace_path[0]) {
        /* Before the pool is published: the trace sees its first allocation. */
        char path[PATH_MAX];
        tpt_trace_resolve(c->trace_path, ordinal, path, sizeof path);
        slot->trace = tpt_trace_open(path, slot->trace_error, sizeof slot->trace_error);
        if (!slot->trace) tpt_log(TP_LOG_ERROR, "%s: trace=%s: %s; not recording", slot->spec, path, slot->trace_error);
        else if (tp_pool_set_observer(pool, tpt_trace_observer, slot->trace) != TP_OK)
            tpt_log(TP_LOG_ERROR, "%s: trace: could not install the pool observer", slot->spec);
        else
            tpt_log(TP_LOG_INFO, "%s: recording the trace to %s", slot->spec, path);
    }
    slot->device = device;
    slot->state = SLOT_ACTIVE;
    atomic_store_explicit(&slot->pool, pool, memory_order_release);
    start_tick_thread();
out:
    pthread_mutex_unlock(&g.create_lock);
    return pool;
}

static inline tp_pool *pool_for(int device) {
    tp_pool *pool = atomic_load_explicit(&g.slots[device].pool, memory_order_acquire);
    return pool ? pool : create_pool(device);
}

/* --------------------------------------------------------- record_stream */

/* rs_lock held. A node for stream, or RS_NONE when host memory runs out. */
static uint64_t rs_node_new(void *stream) {
    uint64_t n = g.rs_free;
    if (n != RS_NONE) {
        g.rs_free = g.rs_nodes[n].next;
    } else {
        if (g.rs_node_count == g.rs_node_cap) {
            size_t cap = g.rs_node_cap ? 2 * g.rs_node_cap : 64;
            rs_node *nodes = realloc(g.rs_nodes, cap * sizeof *nodes);
            if (!nodes) return RS_NONE;
            g.rs_nodes = nodes;
            g.rs_node_cap = cap;
        }
        n = g.rs_node_count++;
    }
    g.rs_nodes[n] = (rs_node){stream, RS_NONE};
    return n;
}

static void rs_insert(uintptr_t ptr, void *stream) {
    pthread_mutex_lock(&g.rs_lock);
    uint64_t *head = tpi_map_find(&g.rs, ptr);
    uint64_t last = RS_NONE;
    for (uint64_t n = head ? *head : RS_NONE; n != RS_NONE; last = n, n = g.rs_nodes[n].next)
        if (g.rs_nodes[n].stream == stream) goto out; /* already recorded */
    uint64_t node = rs_node_new(stream);
    if (node == RS_NONE) goto out;
    if (last != RS_NONE) {
        g.rs_nodes[last].next = node;
    } else if (!tpi_map_put(&g.rs, ptr, node)) {
        g.rs_nodes[node].next = g.rs_free;
        g.rs_free = node;
        goto out;
    }
    atomic_fetch_add(&g.rs_live, 1);
out:
    pthread_mutex_unlock(&g.rs_lock);
}

/* Takes every recorded stream of ptr out of the table (up to cap of them
 * into out; any further ones are synchronised by the caller's fallback, so
 * count reports them all). */
static size_t rs_take(uintptr_t ptr, void **out, size_t cap) {
    size_t count = 0;
    pthread_mutex_lock(&g.rs_lock);
    uint64_t n;
    if (tpi_map_remove(&g.rs, ptr, &n)) {
        while (n != RS_NONE) {
            if (count < cap) out[count] = g.rs_nodes[n].stream;
            count++;
            uint64_t next = g.rs_nodes[n].next;
            g.rs_nodes[n].next = g.rs_free;
            g.rs_free = n;
            n = next;
        }
        atomic_fetch_sub(&g.rs_live, count);
        if (atomic_load(&g.rs_live) == 0) { /* nothing recorded: start the nodes over */
            g.rs_node_count = 0;
            g.rs_free = RS_NONE;
        }
    }
    pthread_mutex_unlock(&g.rs_lock);
    return count;
}

/* Whether ptr has recorded streams. */
static bool rs_has(uintptr_t ptr) {
    pthread_mutex_lock(&g.rs_lock);
    bool found = tpi_map_find(&g.rs, ptr) != NULL;
    pthread_mutex_unlock(&g.rs_lock);
    return found;
}

/* Makes free_stream wait for the work queued so far on each recorded stream
 * of ptr, if ptr is a live block of pool: a free that is going to fail (a
 * wrong device, a pointer inside a block) leaves its streams recorded for
 * the free that succeeds. */
static void order_after_recorded(tpt_slot *slot, tp_pool *pool, uintptr_t ptr, void *free_stream) {
    size_t bytes;
    if (!rs_has(ptr) || tp_pool_block_size(pool, (const void *)ptr, &bytes) != TP_OK) return;
    void *streams[16];
    size_t count = rs_take(ptr, streams, 16);
    if (count > 16) { /* more than we kept: everything the device has queued */
        tp_device_synchronize(slot->device);
        count = 0;
    }
    for (size_t i = 0; i < count; i++) {
        if (streams[i] == free_stream) continue;
        tp_event ev = NULL;
        tp_status st = tp_event_create(slot->device, &ev);
        if (st == TP_OK) st = tp_event_record(slot->device, ev, (tp_stream)streams[i]);
        if (st == TP_OK) st = tp_stream_wait_event(slot->device, (tp_stream)free_stream, ev);
        if (ev) tp_event_destroy(slot->device, ev);
        if (st != TP_OK) tp_stream_synchronize(slot->device, (tp_stream)streams[i]);
        atomic_fetch_add_explicit(&slot->cross_stream_waits, 1, memory_order_relaxed);
    }
}

/* ----------------------------------------------------------- alloc, free */

/* Why this thread's last tpt_alloc failed, for tpt_oom_message. */
static _Thread_local tp_status tls_alloc_status;

void *tpt_alloc(ssize_t size, int device, void *stream) {
    ensure_init();
    tls_alloc_status = TP_ERR_INVALID_ARGUMENT;
    if (device < 0 || device >= TPT_MAX_DEVICES) return NULL;
    tpt_slot *slot = &g.slots[device];
    if (size <= 0) {
        if (size == 0) atomic_fetch_add_explicit(&slot->zero_size_allocs, 1, memory_order_relaxed);
        return NULL;
    }
    uint64_t start_ns = call_start();
    tp_pool *pool = pool_for(device);
    void *ptr = NULL;
    tls_alloc_status = pool ? tp_pool_alloc(pool, (size_t)size, (tp_stream)stream, &ptr) : TP_ERR_NO_DEVICE;
    call_timed(slot, &slot->alloc_ns, start_ns, true);
    if (tls_alloc_status != TP_OK) {
        atomic_fetch_add_explicit(&slot->failed_allocs, 1, memory_order_relaxed);
        return NULL;
    }
    atomic_fetch_add_explicit(&slot->alloc_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g.activity, 1, memory_order_relaxed);
    return ptr;
}

TPT_EXPORT void *tp_torch_try_alloc(ssize_t size, int device, void *stream) { return tpt_alloc(size, device, stream); }

tpt_oom_mode tpt_get_oom_mode(void) {
    ensure_init();
    return (tpt_oom_mode)atomic_load_explicit(&g.oom_mode, memory_order_relaxed);
}

/* "2.00 GiB", "20.00 MiB", "512 bytes": as PyTorch's own out-of-memory message. */
static void format_bytes(uint64_t v, char *buf, size_t capacity) {
    static const char *units[] = {"KiB", "MiB", "GiB", "TiB"};
    if (v < 1024) {
        snprintf(buf, capacity, "%llu bytes", (unsigned long long)v);
        return;
    }
    double x = (double)v / 1024.0;
    int u = 0;
    while (x >= 1024.0 && u < 3) {
        x /= 1024.0;
        u++;
    }
    snprintf(buf, capacity, "%.2f %s", x, units[u]);
}

int tpt_last_failure_was_oom(void) { return tls_alloc_status == TP_ERR_OUT_OF_MEMORY; }

tpt_oom_handler tpt_get_oom_handler(void) { return atomic_load(&g.oom_handler); }

/* Installs (or with NULL removes) the function that turns an out-of-memory
 * failure of tp_torch_alloc into the host's exception (oom=raise). */
TPT_EXPORT void tp_torch_set_oom_handler(void (*handler)(const char *message)) {
    ensure_init();
    atomic_store(&g.oom_handler, handler);
}

void tpt_oom_message(ssize_t size, int device, char *buf, size_t capacity) {
    char amount[32];
    format_bytes(size > 0 ? (uint64_t)size : 0, amount, sizeof amount);
    pthread_mutex_lock(&g.create_lock);
    bool config_ok = g.config_ok;
    char config_error[sizeof g.config_error], config_bad_key[sizeof g.config_bad_key];
    memcpy(config_error, g.config_error, sizeof config_error);
    memcpy(config_bad_key, g.config_bad_key, sizeof config_bad_key);
    pthread_mutex_unlock(&g.create_lock);
    if (!config_ok) {
        snprintf(buf, capacity, "tidepool could not allocate %s on device %d: its configuration was refused: "
                 "%s (TIDEPOOL_TORCH_CONF; fix or remove the item '%s'; no pool is created until then)",
                 amount, device, config_error, config_bad_key);
        return;
    }
    if (device < 0 || device >= TPT_MAX_DEVICES) {
        snprintf(buf, capacity, "CUDA out of memory. Tried to allocate %s on device %d: tidepool has no pool "
                 "for that device number", amount, device);
        return;
    }
    tpt_slot *slot = &g.slots[device];
    tp_pool *pool = atomic_load_explicit(&slot->pool, memory_order_acquire);
    tp_oom_report r;
    if (pool && tls_alloc_status == TP_ERR_OUT_OF_MEMORY && tp_pool_last_oom_report(pool, &r) == TP_OK) {
        snprintf(buf, capacity, "CUDA out of memory. Tried to allocate %s on device %d (tidepool %s pool): %s",
                 amount, device, slot->spec, r.message);
    } else if (pool) {
        snprintf(buf, capacity, "CUDA out of memory. Tried to allocate %s on device %d: tidepool's %s pool "
                 "failed (%s: %s)", amount, device, slot->spec, tp_status_name(tls_alloc_status),
                 tp_status_describe(tls_alloc_status));
    } else {
        pthread_mutex_lock(&g.create_lock);
        tp_status st = slot->error;
        char spec[sizeof slot->spec];
        memcpy(spec, slot->spec, sizeof spec);
        pthread_mutex_unlock(&g.create_lock);
        snprintf(buf, capacity, "CUDA out of memory. Tried to allocate %s on device %d: tidepool could not "
                 "open %s (%s: %s)", amount, device, spec[0] ? spec : "the device", tp_status_name(st),
                 tp_status_describe(st));
    }
}

void tpt_oom_abort(ssize_t size, int device) {
    char message[768];
    tpt_oom_message(size, device, message, sizeof message);
    fprintf(stderr, TPT_PREFIX ": %s; aborting (oom=abort)\n", message);
    fflush(stderr);
    abort();
}

#ifndef TPT_HAVE_CXX
/* Without the C++ part: NULL, or abort with oom=abort. */
TPT_EXPORT void *tp_torch_alloc(ssize_t size, int device, void *stream) {
    void *ptr = tpt_alloc(size, device, stream);
    if (!ptr && size > 0 && tpt_get_oom_mode() == TPT_OOM_ABORT) tpt_oom_abort(size, device);
    return ptr;
}
#endif

TPT_EXPORT void tp_torch_free(void *ptr, ssize_t size, int device, void *stream) {
    (void)size;
    if (!ptr) return;
    ensure_init();
    if (device < 0 || device >= TPT_MAX_DEVICES) {
        tpt_log(TP_LOG_ERROR, "free(%p) on device %d: no such device slot; the block is lost", ptr, device);
        return;
    }
    tpt_slot *slot = &g.slots[device];
    tp_pool *pool = atomic_load_explicit(&slot->pool, memory_order_acquire);
    if (!pool) {
        atomic_fetch_add_explicit(&slot->free_errors, 1, memory_order_relaxed);
        tpt_log(TP_LOG_ERROR, "free(%p) on device %d, which has no pool", ptr, device);
        return;
    }
    uint64_t start_ns = call_start();
    if (atomic_load_explicit(&g.rs_live, memory_order_relaxed))
        order_after_recorded(slot, pool, (uintptr_t)ptr, stream);
    tp_status st = tp_pool_free(pool, ptr, (tp_stream)stream);
    call_timed(slot, &slot->free_ns, start_ns, true);
    if (st != TP_OK) /* tidepool logs why */
        atomic_fetch_add_explicit(&slot->free_errors, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&slot->free_calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&g.activity, 1, memory_order_relaxed);
}

/* ------------------------------------------------------------- the hooks */

TPT_EXPORT void tp_torch_init(int device_count) {
    ensure_init();
    pthread_mutex_lock(&g.create_lock);
    g.device_count = device_count;
    pthread_mutex_unlock(&g.create_lock);
}

TPT_EXPORT unsigned long long tp_torch_trim(int device, unsigned long long target_reserved_bytes) {
    ensure_init();
    uint64_t total = 0;
    for (int d = 0; d < TPT_MAX_DEVICES; d++) {
        if (device >= 0 && d != device) continue;
        tp_pool *pool = atomic_load_explicit(&g.slots[d].pool, memory_order_acquire);
        uint64_t released = 0;
        if (pool && tp_pool_trim(pool, target_reserved_bytes, &released) == TP_OK) total += released;
    }
    return total;
}

TPT_EXPORT void tp_torch_empty_cache(void) { tp_torch_trim(-1, 0); }

TPT_EXPORT void tp_torch_set_memory_fraction(double fraction, int device) {
    ensure_init();
    if (device < 0 || device >= TPT_MAX_DEVICES || !(fraction > 0 && fraction <= 1)) {
        tpt_log(TP_LOG_ERROR, "set_memory_fraction(%g, %d): fraction must be in (0, 1]", fraction, device);
        return;
    }
    tpt_slot *slot = &g.slots[device];
    pthread_mutex_lock(&g.create_lock);
    tp_pool *pool = atomic_load_explicit(&slot->pool, memory_order_relaxed);
    slot->fraction = fraction;
    tp_device *dev = slot->device;
    pthread_mutex_unlock(&g.create_lock);
    if (!pool) return; /* applied when the pool is created */
    /* A live pool's limit cannot change (tidepool has no call for it): give
     * back cached memory above the new limit and say so. */
    tp_device_info info;
    if (tp_device_get_info(dev, &info) != TP_OK) return;
    uint64_t target = (uint64_t)((double)info.capacity_bytes * fraction);
    tp_pool_trim(pool, target, NULL);
    tpt_log(TP_LOG_WARN, "set_memory_fraction(%g, %d): the pool already exists with its limit; cached memory above "
             "%llu bytes was released, but the limit stays (set limit= in TIDEPOOL_TORCH_CONF instead)",
             fraction, device, (unsigned long long)target);
}

TPT_EXPORT void tp_torch_record_stream(void *ptr, void *stream) {
    ensure_init();
    if (!ptr) return;
    /* Which pool owns ptr: the one with a live block starting there. */
    for (int d = 0; d < TPT_MAX_DEVICES; d++) {
        tp_pool *pool = atomic_load_explicit(&g.slots[d].pool, memory_order_acquire);
        size_t bytes;
        if (!pool || tp_pool_block_size(pool, ptr, &bytes) != TP_OK) continue;
        atomic_fetch_add_explicit(&g.slots[d].record_stream_calls, 1, memory_order_relaxed);
        rs_insert((uintptr_t)ptr, stream);
        return;
    }
    tpt_log(TP_LOG_WARN, "record_stream(%p): not a live block of any tidepool pool; ignored", ptr);
}

/* Replaces the configuration (TIDEPOOL_TORCH_CONF's syntax) before any pool
 * exists. 0: applied. -1: an item is wrong: err says why and bad_key names
 * its key (or the item, when it is not key=value); nothing changes. -2: too
 * late, a pool was already created or tried (err says so); nothing changes. */
TPT_EXPORT int tp_torch_configure(const char *text, char *err, size_t err_capacity, char *bad_key,
                                  size_t bad_key_capacity) {
    ensure_init();
    char why[200] = "", key[64] = "";
    tpt_config parsed;
    if (!parse_config(text ? text : "", &parsed, why, sizeof why, key, sizeof key)) {
        if (err && err_capacity) snprintf(err, err_capacity, "%s", why);
        if (bad_key && bad_key_capacity) snprintf(bad_key, bad_key_capacity, "%s", key);
        return -1;
    }
    pthread_mutex_lock(&g.create_lock);
    if (g.pools_attempted) {
        pthread_mutex_unlock(&g.create_lock);
        if (err && err_capacity)
            snprintf(err, err_capacity, "the configuration cannot change once a pool exists (an allocation already "
                     "happened)");
        if (bad_key && bad_key_capacity) snprintf(bad_key, bad_key_capacity, "%s", "");
        return -2;
    }
    g.config = parsed;
    g.config_ok = true;
    g.config_error[0] = '\0';
    g.config_bad_key[0] = '\0';
    g.config_from_call = true;
    atomic_store(&g.log_level, parsed.log_level);
    atomic_store(&g.oom_mode, (int)parsed.oom);
    atomic_store(&g.time_calls, parsed.time_calls);
    pthread_mutex_unlock(&g.create_lock);
    return 0;
}

/* Creates device's pool now (it is otherwise created at the first
 * allocation), so that a device or configuration problem shows at once.
 * Returns TP_OK (0) or the tp_status of the failure. */
TPT_EXPORT int tp_torch_prepare(int device) {
    ensure_init();
    if (device < 0 || device >= TPT_MAX_DEVICES) return TP_ERR_INVALID_ARGUMENT;
    if (pool_for(device)) return TP_OK;
    pthread_mutex_lock(&g.create_lock);
    tp_status st = g.slots[device].error;
    pthread_mutex_unlock(&g.create_lock);
    return st != TP_OK ? (int)st : (int)TP_ERR_NO_DEVICE;
}

/* Stops every trace (trace=) and writes out and closes its file now rather
 * than at exit. Returns how many files were closed, or -1 if writing one
 * failed. */
TPT_EXPORT int tp_torch_trace_close(void) {
    ensure_init();
    int closed = 0;
    bool failed = false;
    for (int d = 0; d < TPT_MAX_DEVICES; d++) {
        pthread_mutex_lock(&g.create_lock);
        tpt_trace *t = g.slots[d].trace;
        pthread_mutex_unlock(&g.create_lock);
        int rc = tpt_trace_close(t);
        if (rc > 0) closed++;
        if (rc < 0) failed = true;
    }
    return failed ? -1 : closed;
}

TPT_EXPORT int tp_torch_reset_peaks(int device) {
    ensure_init();
    int count = 0;
    for (int d = 0; d < TPT_MAX_DEVICES; d++) {
        if (device >= 0 && d != device) continue;
        tp_pool *pool = atomic_load_explicit(&g.slots[d].pool, memory_order_acquire);
        if (pool && tp_pool_reset_peaks(pool) == TP_OK) count++;
    }
    return count;
}

/* ------------------------------------------------------------------ stats */

typedef struct sbuf {
    char *data;
    size_t len, cap;
    bool failed;
} sbuf;

static void sb_appendf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_appendf(sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->data ? b->data + b->len : NULL, b->data ? b->cap - b->len : 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = true;
            return;
        }
        if (b->data && b->len + (size_t)n < b->cap) {
            b->len += (size_t)n;
            return;
        }
        size_t cap = b->cap ? b->cap : 1024;
        while (cap <= b->len + (size_t)n) cap *= 2;
        char *grown = realloc(b->data, cap);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->cap = cap;
    }
}

/* Length of the well-formed UTF-8 sequence at s (1..4), or 0 when s does
 * not start one; *subpart is then how many bytes form the longest start of
 * a sequence that went wrong (at least 1: Unicode's "maximal subpart").
 * Well-formed follows Unicode's table 3-7: no overlong forms, no
 * surrogates, nothing past U+10FFFF. */
static size_t utf8_sequence(const unsigned char *s, size_t *subpart) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF; /* the range of the second byte */
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 1;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 2;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 3;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *subpart = 1;
        return 0;
    }
    for (size_t i = 1; i <= need; i++) {
        unsigned char b = s[i]; /* a NUL ends the string and fails here */
        bool ok = i == 1 ? b >= lo && b <= hi : b >= 0x80 && b <= 0xBF;
        if (!ok) {
            *subpart = i;
            return 0;
        }
    }
    return need + 1;
}

/* A JSON string of s, valid UTF-8 whatever s holds (config values and
 * paths come from the user): quotes and backslashes are escaped, control
 * characters become \u00XX, well-formed UTF-8 sequences pass through as
 * they are, and each ill-formed one (a stray byte >= 0x80, a cut or
 * overlong sequence, a surrogate) becomes one U+FFFD, written \ufffd --
 * the text is not Latin-1, so its bytes are not read as such. */
static void sb_json_string(sbuf *b, const char *s) {
    sb_appendf(b, "\"");
    const unsigned char *p = (const unsigned char *)s;
    while (*p) {
        const unsigned char *run = p; /* bytes that go out as they are */
        size_t length, subpart = 1;
        while (*p && *p != '"' && *p != '\\' && *p >= 0x20 && (length = utf8_sequence(p, &subpart)) != 0)
            p += length;
        if (p > run) sb_appendf(b, "%.*s", (int)(p - run), (const char *)run);
        if (!*p) break;
        if (*p == '"' || *p == '\\') {
            sb_appendf(b, "\\%c", *p);
            p++;
        } else if (*p < 0x20) {
            sb_appendf(b, "\\u%04x", *p);
            p++;
        } else {
            sb_appendf(b, "\\ufffd");
            p += subpart;
        }
    }
    sb_appendf(b, "\"");
}

static void sb_bytes_or_null(sbuf *b, const char *key, uint64_t v, bool zero_is_default) {
    if (zero_is_default && v == 0) sb_appendf(b, "\"%s\":null,", key);
    else if (v == UINT64_MAX) sb_appendf(b, "\"%s\":\"unlimited\",", key);
    else sb_appendf(b, "\"%s\":%llu,", key, (unsigned long long)v);
}

/* The configuration as one consistent copy (tp_torch_configure may replace
 * it from another thread until the first pool exists). */
typedef struct config_view {
    tpt_config config;
    bool ok, from_call;
    char error[sizeof g.config_error];
    char bad_key[sizeof g.config_bad_key];
} config_view;

static void config_view_get(config_view *v) {
    pthread_mutex_lock(&g.create_lock);
    v->config = g.config;
    v->ok = g.config_ok;
    v->from_call = g.config_from_call;
    memcpy(v->error, g.config_error, sizeof v->error);
    memcpy(v->bad_key, g.config_bad_key, sizeof v->bad_key);
    pthread_mutex_unlock(&g.create_lock);
}

static void sb_config(sbuf *b) {
    config_view *v = malloc(sizeof *v); /* two paths of PATH_MAX: not on the caller's stack */
    if (!v) {
        b->failed = true;
        return;
    }
    config_view_get(v);
    const tpt_config *c = &v->config;
    sb_appendf(b, "{\"ok\":%s,", v->ok ? "true" : "false");
    if (!v->ok) {
        sb_appendf(b, "\"error\":");
        sb_json_string(b, v->error);
        sb_appendf(b, ",\"bad_key\":");
        sb_json_string(b, v->bad_key);
        sb_appendf(b, ",");
    }
    sb_appendf(b, "\"source\":\"%s\",", v->from_call ? "tp_torch_configure" : "TIDEPOOL_TORCH_CONF");
    sb_appendf(b, "\"kind\":\"%s\",", kind_name(c->kind));
    if (c->limit_fraction > 0) sb_appendf(b, "\"limit\":\"%.0f%%\",", c->limit_fraction * 100);
    else sb_bytes_or_null(b, "limit_bytes", c->limit_bytes, true);
    sb_bytes_or_null(b, "release_threshold_bytes", c->release_threshold_bytes, true);
    if (c->idle_release_ns == TP_NS_NEVER) sb_appendf(b, "\"idle_release_ms\":\"never\",");
    else if (c->idle_release_ns == 0) sb_appendf(b, "\"idle_release_ms\":null,");
    else sb_appendf(b, "\"idle_release_ms\":%llu,", (unsigned long long)(c->idle_release_ns / 1000000ull));
    sb_appendf(b, "\"align\":%llu,", (unsigned long long)c->alignment_bytes);
    sb_bytes_or_null(b, "page_bytes", c->page_bytes, true);
    sb_bytes_or_null(b, "va_reserve_bytes", c->va_reserve_bytes, true);
    sb_bytes_or_null(b, "max_map_bytes", c->max_map_bytes, true);
    sb_bytes_or_null(b, "max_chunk_bytes", c->max_chunk_bytes, true);
    sb_appendf(b, "\"tick_ms\":%llu,\"log\":\"%s\",\"time_calls\":%s,\"oom\":\"%s\",\"backend\":\"%s\",\"stats\":",
               (unsigned long long)(c->tick_ns / 1000000ull), level_name(c->log_level), c->time_calls ? "true" : "false",
               oom_name(c->oom), c->backend == TPT_BACKEND_SIM ? "sim" : "cuda");
    sb_json_string(b, c->stats_path);
    sb_appendf(b, ",\"trace\":");
    sb_json_string(b, c->trace_path);
    sb_appendf(b, ",\"trace_gzip\":%s}", tpt_trace_has_gzip() ? "true" : "false");
    free(v);
}

/* One device's object. Returns false if the slot was never used. */
static bool sb_device(sbuf *b, int d, bool include_unused) {
    tpt_slot *slot = &g.slots[d];
    pthread_mutex_lock(&g.create_lock);
    int state = slot->state;
    tp_status error = slot->error;
    char spec[sizeof slot->spec];
    memcpy(spec, slot->spec, sizeof spec);
    pthread_mutex_unlock(&g.create_lock);
    unsigned long long zero = atomic_load(&slot->zero_size_allocs), failed = atomic_load(&slot->failed_allocs);
    if (state == SLOT_UNUSED && !include_unused && !zero && !failed) return false;
    sb_appendf(b, "{\"device\":%d,\"spec\":", d);
    sb_json_string(b, spec);
    sb_appendf(b, ",\"state\":\"%s\",",
               state == SLOT_ACTIVE ? "active" : state == SLOT_FAILED ? "failed" : "unused");
    if (state == SLOT_FAILED) sb_appendf(b, "\"error\":\"%s\",", tp_status_name(error));
    sb_appendf(b,
               "\"shim\":{\"alloc_calls\":%llu,\"free_calls\":%llu,\"zero_size_allocs\":%llu,\"failed_allocs\":%llu,"
               "\"free_errors\":%llu,\"record_stream_calls\":%llu,\"cross_stream_waits\":%llu,\"timed\":%s,"
               "\"alloc_ns\":%llu,\"free_ns\":%llu,\"upkeep_ns\":%llu,\"slowest_call_ns\":%llu},",
               (unsigned long long)atomic_load(&slot->alloc_calls), (unsigned long long)atomic_load(&slot->free_calls),
               zero, failed, (unsigned long long)atomic_load(&slot->free_errors),
               (unsigned long long)atomic_load(&slot->record_stream_calls),
               (unsigned long long)atomic_load(&slot->cross_stream_waits),
               atomic_load(&g.time_calls) ? "true" : "false", (unsigned long long)atomic_load(&slot->alloc_ns),
               (unsigned long long)atomic_load(&slot->free_ns), (unsigned long long)atomic_load(&slot->upkeep_ns),
               (unsigned long long)atomic_load(&slot->slowest_call_ns));
    pthread_mutex_lock(&g.create_lock);
    tpt_trace *trace = slot->trace;
    char trace_error[sizeof slot->trace_error];
    memcpy(trace_error, slot->trace_error, sizeof trace_error);
    pthread_mutex_unlock(&g.create_lock);
    if (trace) {
        sb_appendf(b, "\"trace\":{\"path\":");
        sb_json_string(b, tpt_trace_path(trace));
        tpt_trace_state ts = tpt_trace_get_state(trace);
        sb_appendf(b, ",\"rows\":%llu,\"rows_lost\":%llu,\"write_failed\":%s,\"open\":%s,\"gzip\":%s},",
                   (unsigned long long)ts.rows, (unsigned long long)ts.rows_lost, ts.write_failed ? "true" : "false",
                   ts.open ? "true" : "false", tpt_trace_has_gzip() ? "true" : "false");
    } else if (trace_error[0]) {
        sb_appendf(b, "\"trace\":{\"error\":");
        sb_json_string(b, trace_error);
        sb_appendf(b, "},");
    }
    sb_appendf(b, "\"pool\":");
    tp_pool *pool = atomic_load_explicit(&slot->pool, memory_order_acquire);
    if (!pool) {
        sb_appendf(b, "null}");
        return true;
    }
    char small[2048];
    size_t need = 0;
    tp_status st = tp_pool_stats_json(pool, small, sizeof small, &need);
    if (st == TP_OK) {
        sb_appendf(b, "%s}", small);
    } else {
        char *big = malloc(need + 1);
        if (big && tp_pool_stats_json(pool, big, need + 1, NULL) == TP_OK) sb_appendf(b, "%s}", big);
        else sb_appendf(b, "null}");
        free(big);
    }
    return true;
}

static void sb_all(sbuf *b) {
    sb_appendf(b, "{\"tidepool_torch\":{\"version\":\"%d.%d.%d\",\"pid\":%ld,\"config\":", TP_VERSION_MAJOR,
               TP_VERSION_MINOR, TP_VERSION_PATCH, (long)getpid());
    sb_config(b);
    sb_appendf(b, "},\"devices\":[");
    bool first = true;
    for (int d = 0; d < TPT_MAX_DEVICES; d++) {
        size_t mark = b->len;
        if (!first) sb_appendf(b, ",");
        if (sb_device(b, d, false)) first = false;
        else b->len = mark;
    }
    sb_appendf(b, "]}");
}

/* The strings tp_torch_stats_json, tp_torch_metrics and tp_torch_snapshot_json
 * return: one set per thread, freed when the thread exits (a pthread key's
 * destructor: thread-local pointers alone would leak them with every thread
 * that ever asked, e.g. one per metrics scrape). */
typedef struct tls_bufs {
    sbuf stats;
    char *text;
    size_t text_cap;
} tls_bufs;

static pthread_key_t tls_key;
static pthread_once_t tls_key_once = PTHREAD_ONCE_INIT;
static bool tls_key_ok;

static void tls_bufs_free(void *p) {
    tls_bufs *t = p;
    free(t->stats.data);
    free(t->text);
    free(t);
}

static void tls_key_create(void) { tls_key_ok = pthread_key_create(&tls_key, tls_bufs_free) == 0; }

/* This thread's buffers, or NULL when host memory runs out. */
static tls_bufs *thread_bufs(void) {
    pthread_once(&tls_key_once, tls_key_create);
    if (!tls_key_ok) return NULL;
    tls_bufs *t = pthread_getspecific(tls_key);
    if (t) return t;
    t = calloc(1, sizeof *t);
    if (t && pthread_setspecific(tls_key, t) != 0) {
        free(t);
        t = NULL;
    }
    return t;
}

/* The returned string belongs to the calling thread and stays valid until
 * that thread's next call (or its exit). device < 0: every pool, with the
 * configuration. */
TPT_EXPORT const char *tp_torch_stats_json(int device) {
    ensure_init();
    tls_bufs *t = thread_bufs();
    if (!t) return "{\"error\":\"out of host memory\"}";
    sbuf *b = &t->stats;
    b->len = 0;
    b->failed = false;
    if (device < 0) sb_all(b);
    else if (device >= TPT_MAX_DEVICES) sb_appendf(b, "{\"device\":%d,\"state\":\"invalid\",\"pool\":null}", device);
    else sb_device(b, device, true);
    if (b->failed || !b->data) return "{\"error\":\"out of host memory\"}";
    if (b->len < b->cap) b->data[b->len] = '\0';
    return b->data;
}

/* One pool's Prometheus text or memory map into this thread's buffer. */
static const char *tls_pool_text(int device, bool metrics, const char *labels) {
    ensure_init();
    if (device < 0 || device >= TPT_MAX_DEVICES) return "";
    tp_pool *pool = atomic_load_explicit(&g.slots[device].pool, memory_order_acquire);
    if (!pool) return "";
    tls_bufs *t = thread_bufs();
    if (!t) return "";
    for (int attempt = 0; attempt < 4; attempt++) {
        size_t need = 0;
        tp_status st = metrics ? tp_pool_stats_openmetrics(pool, labels, t->text, t->text_cap, &need)
                               : tp_pool_snapshot_json(pool, t->text, t->text_cap, &need);
        if (st == TP_OK && t->text) return t->text;
        if (st != TP_OK && st != TP_ERR_BUFFER_TOO_SMALL) return "";
        size_t grown = need + need / 4 + 4096; /* the map may grow between the calls */
        char *p = realloc(t->text, grown);
        if (!p) return "";
        t->text = p;
        t->text_cap = grown;
    }
    return "";
}

/* tidepool's Prometheus text for device's pool (tp_pool_stats_openmetrics;
 * labels: extra label pairs or NULL); "" when the device has no pool. The
 * string belongs to the calling thread until its next call of this
 * function or tp_torch_snapshot_json. */
TPT_EXPORT const char *tp_torch_metrics(int device, const char *labels) { return tls_pool_text(device, true, labels); }

/* The memory map of device's pool (tp_pool_snapshot_json); "" when none. */
TPT_EXPORT const char *tp_torch_snapshot_json(int device) { return tls_pool_text(device, false, NULL); }

/* ------------------------------------------------------------------- fork */

/* fork() copies only the calling thread: a lock another thread holds at
 * that moment stays held in the child for good. The creation lock and every
 * trace's lock are held across the fork, so that the child gets them
 * unlocked and the traces consistent. The pools, the traces' files and the
 * exit report stay the parent's: in the child the traces stop recording
 * and the exit handler does nothing (it would take a pool's lock, which a
 * thread of the parent may have held at the fork; and it would write the
 * parent's report again). */
static void before_fork(void) {
    pthread_mutex_lock(&g.create_lock);
    for (int d = 0; d < TPT_MAX_DEVICES; d++) tpt_trace_before_fork(g.slots[d].trace);
}

static void after_fork_parent(void) {
    for (int d = 0; d < TPT_MAX_DEVICES; d++) tpt_trace_after_fork_parent(g.slots[d].trace);
    pthread_mutex_unlock(&g.create_lock);
}

static void after_fork_child(void) {
    atomic_store(&g.forked_child, true);
    for (int d = 0; d < TPT_MAX_DEVICES; d++) tpt_trace_after_fork_child(g.slots[d].trace);
    pthread_mutex_unlock(&g.create_lock);
}

/* ------------------------------------------------------------------- exit */

static void at_exit(void) {
    if (atomic_load(&g.forked_child)) return; /* the parent's report and traces (see before_fork) */
    atomic_store(&g.exiting, true);
    if (tp_torch_trace_close() < 0) fprintf(stderr, TPT_PREFIX ": writing a trace failed\n");
    char path[sizeof g.config.stats_path];
    pthread_mutex_lock(&g.create_lock);
    memcpy(path, g.config.stats_path, sizeof path);
    pthread_mutex_unlock(&g.create_lock);
    if (!path[0]) return;
    sbuf b = {0};
    sb_all(&b);
    if (b.failed || !b.data) {
        free(b.data);
        return;
    }
    if (!strcmp(path, "-")) {
        fprintf(stderr, "%s\n", b.data);
    } else {
        /* %p in the path becomes the process id. */
        char resolved[PATH_MAX + 32];
        size_t o = 0;
        for (const char *p = path; *p && o + 24 < sizeof resolved; p++) {
            if (p[0] == '%' && p[1] == 'p') {
                o += (size_t)snprintf(resolved + o, sizeof resolved - o, "%ld", (long)getpid());
                p++;
            } else {
                resolved[o++] = *p;
            }
        }
        resolved[o] = '\0';
        FILE *f = fopen(resolved, "w");
        if (!f) {
            fprintf(stderr, TPT_PREFIX ": cannot write stats to %s: %s\n", resolved, strerror(errno));
        } else {
            fprintf(f, "%s\n", b.data);
            if (fclose(f) != 0) fprintf(stderr, TPT_PREFIX ": writing stats to %s failed\n", resolved);
        }
    }
    free(b.data);
}
