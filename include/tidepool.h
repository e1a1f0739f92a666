/* SPDX-License-Identifier: MIT */
/*
 * tidepool.h -- the whole public API of tidepool, a GPU device-memory manager
 * for long-running inference servers.
 *
 * Concepts
 *   tp_device  an opened device: the simulated device ("sim", the default
 *              everywhere) or a CUDA GPU ("cuda:0", driver loaded at run time).
 *   tp_stream  an ordered queue of device work. On CUDA it is the caller's
 *              CUstream cast to tp_stream; TP_STREAM_DEFAULT is the default
 *              stream. On the simulated device, tp_stream_create makes one.
 *   tp_pool    hands out device memory. Two kinds: a VMM pool (one address
 *              reservation, physical pages mapped on demand and unmapped when
 *              idle) and a segment pool (plain device allocations split and
 *              coalesced), both stream-ordered and both with the same
 *              out-of-memory ladder.
 *   tp_graph_cache  a bounded cache of instantiated graph executables.
 *
 * Conventions
 *   - Every function that can fail returns a tp_status; tp_status_name()
 *     gives its name. Nothing in the library aborts, exits or prints: runtime
 *     conditions come back as statuses and, with details, through the log
 *     callback in tp_device_config.
 *   - Config structs: zero means default for every field; units are in names.
 *   - Handles are opaque; every create/open call has its destroy/close.
 *
 * Thread-safety contract
 *   - tp_device: every function may be called from several threads at once,
 *     except tp_device_close, which must not race with any other use of the
 *     device or of pools and caches created on it.
 *   - tp_pool: alloc, free, trim, tick, stats, pin/unpin and capture calls may
 *     come from several threads at once. An alloc or free served from the
 *     stream's cache (its parked blocks, or the pool's last-freed block
 *     when the stream freed it, reused or resized where it lies) takes only
 *     that stream's lock, so threads on different streams run in parallel;
 *     every other call takes the pool's lock, waits for the calls being
 *     served from stream caches and keeps new ones out, and sees one
 *     consistent pool (currents, totals and counters exact; peaks: see
 *     tp_stat).
 *     A stream may be used from several threads (they take turns).
 *     tp_pool_destroy must not race with any other call on that pool.
 *     Reclaim callbacks run on the thread whose allocation ran out of memory,
 *     with the pool's lock released, so they may call back into the pool.
 *   - tp_graph_cache: all calls are thread-safe except destroy.
 *   - Streams given to a pool must stay valid until tp_pool_forget_stream
 *     or tp_pool_destroy.
 *   - Stream order is the caller's promise, as with cudaFree on a stream:
 *     tp_pool_free(p, ptr, s) means "free once the work already queued on s
 *     is done". Memory freed on s is handed out again at once on s, and on
 *     another stream only after the free has been observed complete or after
 *     that stream has been made to wait on an event recorded on s.
 */
#ifndef TIDEPOOL_H
#define TIDEPOOL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions a shared build exports; everything else the library
 * defines is hidden (-fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define TP_API __attribute__((visibility("default")))
#else
#define TP_API
#endif

#define TP_VERSION_MAJOR 0
#define TP_VERSION_MINOR 1
#define TP_VERSION_PATCH 0

/* The library's version at run time (the macros above give the version of the
 * header you compiled against): MAJOR*10000 + MINOR*100 + PATCH, and
 * "MAJOR.MINOR.PATCH". */
TP_API uint32_t tp_version(void);
TP_API const char *tp_version_string(void);

/* ------------------------------------------------------------------ status */

/* X(name, description). The order gives the numeric values (TP_OK == 0). */
#define TP_STATUS_LIST(X)                                                        \
    X(TP_OK, "success")                                                          \
    X(TP_NOT_READY, "queued work has not completed yet (not an error)")          \
    X(TP_ERR_INVALID_ARGUMENT, "invalid argument")                               \
    X(TP_ERR_OUT_OF_MEMORY, "out of device memory (pool limit or device full)")  \
    X(TP_ERR_HOST_OUT_OF_MEMORY, "out of host memory for bookkeeping")           \
    X(TP_ERR_NOT_OWNED, "pointer was not allocated by this pool")                \
    X(TP_ERR_DOUBLE_FREE, "pointer was already freed")                           \
    X(TP_ERR_NOT_BLOCK_START, "pointer is inside a live block, not its start")   \
    X(TP_ERR_BAD_SPEC, "device spec string could not be parsed")                 \
    X(TP_ERR_NO_DEVICE, "no such device, or its driver could not be loaded")     \
    X(TP_ERR_UNSUPPORTED, "operation not supported by this device or backend")   \
    X(TP_ERR_DEVICE, "the device or driver reported an error")                   \
    X(TP_ERR_BUSY, "object still in use")                                        \
    X(TP_ERR_RUN_EAGER, "graph could not be instantiated: run the work eagerly") \
    X(TP_ERR_TOPOLOGY_MISMATCH, "graph topology differs from the executable")   \
    X(TP_ERR_CAPTURE, "invalid stream-capture state")                          \
    X(TP_ERR_BUFFER_TOO_SMALL, "the output buffer is too small")                \
    X(TP_ERR_NOT_FOUND, "no such key, report or registration")                  \
    X(TP_ERR_CORRUPT, "an internal invariant does not hold")

typedef enum tp_status {
#define TP_STATUS_ENUM_(name, description) name,
    TP_STATUS_LIST(TP_STATUS_ENUM_)
#undef TP_STATUS_ENUM_
    TP_STATUS_COUNT_
} tp_status;

/* "TP_ERR_OUT_OF_MEMORY"; "TP_UNKNOWN_STATUS" for values outside the list. */
TP_API const char *tp_status_name(tp_status status);
/* A sentence describing the status. */
TP_API const char *tp_status_describe(tp_status status);

/* ------------------------------------------------------------- host hooks */

typedef enum tp_log_level {
    TP_LOG_DEBUG = 0,
    TP_LOG_INFO = 1,
    TP_LOG_WARN = 2,
    TP_LOG_ERROR = 3
} tp_log_level;

/* Receives everything the library has to say (hazards found by the simulated
 * device, driver error names, out-of-memory reports). May be called with
 * internal locks held: do not call back into tidepool from it. */
typedef void (*tp_log_fn)(void *user, tp_log_level level, const char *message);

/* "debug", "info", "warn", "error"; "unknown" for values outside the list. */
TP_API const char *tp_log_level_name(tp_log_level level);

/* Host memory for bookkeeping. All three or none (zero = libc). */
typedef struct tp_host_allocator {
    void *(*alloc)(void *user, size_t bytes);
    void *(*realloc)(void *user, void *ptr, size_t old_bytes, size_t new_bytes);
    void (*free)(void *user, void *ptr, size_t bytes);
    void *user;
} tp_host_allocator;

/* ------------------------------------------------------------------ device */

typedef struct tp_device tp_device;
typedef struct tp_stream_opaque *tp_stream;
typedef struct tp_event_opaque *tp_event;
/* A graph template: a captured CUgraph cast to tp_graph on CUDA, or one made
 * by the simulated device (tidepool_sim.h). */
typedef struct tp_graph_opaque *tp_graph;
#define TP_STREAM_DEFAULT ((tp_stream)0)

typedef struct tp_device_config {
    tp_log_fn log;          /* NULL: messages are dropped */
    void *log_user;
    tp_log_level log_level; /* messages below this level are not produced */
    tp_host_allocator host; /* zero: libc malloc/realloc/free */
} tp_device_config;

/* Opens a device from a spec string:
 *   "sim"                      simulated device, 16 GiB, VMM, 2 MiB granularity
 *   "sim:6GiB"                 with that capacity (B, KiB, MiB, GiB, TiB; KB..TB
 *                              are decimal)
 *   "sim:6GiB,novmm"           without virtual memory management
 *   options after commas:      novmm, gran=2MiB, nocheck (hazard checker off),
 *                              graph_node_bytes=10KiB, graph_exec_bytes=0 (a
 *                              fixed cost per executable on top), seed=N,
 *                              graphpool (the
 *                              driver keeps the memory of destroyed graph
 *                              executables for later ones and does not
 *                              report an executable's bytes, as CUDA does),
 *                              adjacent (a device allocation may start where
 *                              the previous one ends, as cudaMalloc's often
 *                              do; by default a gap follows each)
 *   "cuda:0"                   CUDA device 0 through the driver API
 *   "cuda:0,novmm"             ... with VMM disabled (segment pools only)
 * config may be NULL. */
TP_API tp_status tp_device_open(const char *spec, const tp_device_config *config, tp_device **out_device);
/* Closes the device. Pools and graph caches created on it must be destroyed
 * first (TP_ERR_BUSY otherwise, and nothing is closed). */
TP_API tp_status tp_device_close(tp_device *device);

typedef struct tp_device_info {
    char name[96];              /* "simulated device", "NVIDIA H200", ... */
    char backend[16];           /* "sim" or "cuda" */
    int ordinal;                /* device number for cuda, 0 for sim */
    uint64_t capacity_bytes;    /* total device memory */
    uint64_t granularity_bytes; /* physical page size for VMM mappings */
    bool vmm_supported;         /* hardware/driver supports VMM */
    bool vmm_enabled;           /* ... and the spec did not say novmm */
} tp_device_info;

TP_API tp_status tp_device_get_info(const tp_device *device, tp_device_info *out_info);
/* Free and total device memory as the driver (or simulator) sees it. */
TP_API tp_status tp_device_mem_info(tp_device *device, uint64_t *out_free_bytes, uint64_t *out_total_bytes);
TP_API tp_status tp_device_synchronize(tp_device *device);

TP_API tp_status tp_stream_create(tp_device *device, tp_stream *out_stream);
TP_API tp_status tp_stream_destroy(tp_device *device, tp_stream stream);
TP_API tp_status tp_stream_synchronize(tp_device *device, tp_stream stream);
TP_API tp_status tp_stream_wait_event(tp_device *device, tp_stream stream, tp_event event);

TP_API tp_status tp_event_create(tp_device *device, tp_event *out_event);
TP_API tp_status tp_event_destroy(tp_device *device, tp_event event);
TP_API tp_status tp_event_record(tp_device *device, tp_event event, tp_stream stream);
/* TP_OK when complete, TP_NOT_READY when not yet. */
TP_API tp_status tp_event_query(tp_device *device, tp_event event);
TP_API tp_status tp_event_synchronize(tp_device *device, tp_event event);

/* ------------------------------------------------------------------ ranges */

/* A device address range: [address, address + bytes). */
typedef struct tp_range {
    uint64_t address;
    uint64_t bytes;
} tp_range;

/* ------------------------------------------------- raw device memory */

/* Device memory outside any pool: what the pools themselves are built on.
 * For baselines, tools and tests that model other allocators; a program
 * that wants pooled memory uses tp_pool_alloc. Addresses are device
 * addresses (a CUdeviceptr on CUDA). */
TP_API tp_status tp_device_mem_alloc(tp_device *device, uint64_t bytes, uint64_t *out_address);
TP_API tp_status tp_device_mem_free(tp_device *device, uint64_t address, uint64_t bytes);
/* VMM (TP_ERR_UNSUPPORTED without it): reserve address space, then back
 * [va, va + bytes) with physical pages of the device's granularity. */
TP_API tp_status tp_device_va_reserve(tp_device *device, uint64_t bytes, uint64_t alignment, uint64_t *out_va);
TP_API tp_status tp_device_va_release(tp_device *device, uint64_t va, uint64_t bytes);
TP_API tp_status tp_device_map(tp_device *device, uint64_t va, uint64_t bytes);
TP_API tp_status tp_device_unmap(tp_device *device, uint64_t va, uint64_t bytes);

/* ------------------------------------------------------------- byte sizes */

/* Parses "6GiB", "512MiB", "1.5G", "4096", "10KB": binary units for K/M/G/T
 * with or without "iB", decimal for KB/MB/GB/TB. False on anything else,
 * and on values that do not fit in 64 bits. */
TP_API bool tp_parse_bytes(const char *text, uint64_t *out_bytes);
/* Writes "1.50 GiB"-style text into buf and returns buf. */
TP_API const char *tp_format_bytes(uint64_t bytes, char *buf, size_t capacity);

/* ------------------------------------------------------------------- pool */

typedef struct tp_pool tp_pool;

typedef enum tp_pool_kind {
    TP_POOL_AUTO = 0, /* VMM where the device has it enabled, else segment */
    TP_POOL_VMM = 1,
    TP_POOL_SEGMENT = 2
} tp_pool_kind;

#define TP_BYTES_UNLIMITED UINT64_MAX
#define TP_NS_NEVER UINT64_MAX

/* Run the invariant checker after every operation (slow; for tests). */
#define TP_POOL_FLAG_CHECK_INVARIANTS 0x1u

typedef struct tp_pool_config {
    tp_pool_kind kind;
    /* Most device memory the pool may hold. 0: the device's capacity. */
    uint64_t limit_bytes;
    /* Idle device memory the pool keeps cached for reuse. Idle memory above
     * this is released once it has been idle for idle_release_ns, and (segment
     * pool) before the pool grows. 0: 64 MiB for VMM pools, 16 MiB for
     * segment pools. TP_BYTES_UNLIMITED: keep all (release only under memory
     * pressure or on trim). */
    uint64_t release_threshold_bytes;
    /* How long memory above the threshold stays cached before release.
     * 0: 10 s. TP_NS_NEVER: only under pressure or on trim. */
    uint64_t idle_release_ns;
    /* VMM: page size, the unit of accounting and placement (0: the
     * device's granularity), and the most bytes one map or unmap call
     * covers (0: 1 GiB). */
    uint64_t page_bytes;
    uint64_t max_map_bytes;
    /* VMM: the largest physical allocation (chunk) behind pages mapped
     * together (0: 32 MiB; page_bytes: every page its own allocation). The
     * driver's cost is per allocation, so a growth of G bytes is backed by
     * chunks of about G/8 (a power of two of pages, at most this, at most
     * 1/32 of the pool's high-water mark): large growths get cheap, small
     * ones keep page granularity. A chunk goes back to the device only
     * whole, once all of its pages are idle. */
    uint64_t max_chunk_bytes;
    /* VMM: address space reserved once at creation. 0: four times the
     * smaller of the limit and the device's capacity (address space costs
     * no device memory; blocks never move, so it fragments first). */
    uint64_t va_reserve_bytes;
    /* Segment pool: segment sizes. Requests up to 1 MiB come from segments
     * of small_segment_bytes (0: 2 MiB, or the alignment if larger), up to
     * 10 MiB from medium_segment_bytes (0: 20 MiB, rounded to the
     * alignment); larger ones get their own segment, rounded up to a
     * geometric size ladder (growth_step_percent) so that a growing request
     * allocates O(log n) segments. Any request may use free room in any
     * segment, except while segments pinned by a few small blocks hold a
     * quarter of the pool: then none goes into a segment more than twice
     * its own (docs/architecture.md, "The segment pool"). */
    uint64_t small_segment_bytes;
    uint64_t medium_segment_bytes;
    uint32_t growth_step_percent; /* 0: 6 (each ladder step is 6% larger) */
    /* Alignment of every block, a power of two >= 256. 0: 256. */
    uint64_t alignment_bytes;
    /* Largest freed block parked for reuse without coalescing (the hit
     * path). 0: 64 KiB for VMM pools (a parked block keeps its pages
     * mapped, so larger ones cost memory on some workloads), 64 MiB for
     * segment pools. */
    uint64_t tcache_max_block_bytes;
    uint32_t flags;
} tp_pool_config;

TP_API tp_status tp_pool_create(tp_device *device, const tp_pool_config *config, tp_pool **out_pool);
/* Waits for queued work on every stream the pool has seen, then returns all
 * device memory. Blocks still live are released too; their count is logged.
 * TP_ERR_CAPTURE, and nothing is destroyed, while a capture the pool was
 * told of (tp_pool_capture_begin) has not ended: its stream cannot be
 * waited for. A stream that captures without the pool being told is not
 * waited for either: the pool is destroyed and TP_ERR_CAPTURE returned. */
TP_API tp_status tp_pool_destroy(tp_pool *pool);

/* The device the pool was created on. */
TP_API tp_status tp_pool_get_device(tp_pool *pool, tp_device **out_device);

/* bytes > 0. On TP_ERR_OUT_OF_MEMORY (also for any request above the
 * pool's limit, however large) *out_ptr is NULL and
 * tp_pool_last_oom_report() says why. */
TP_API tp_status tp_pool_alloc(tp_pool *pool, size_t bytes, tp_stream stream, void **out_ptr);
/* ptr NULL: TP_OK, nothing done. A pointer that is not a live block's start
 * is refused and changes nothing: TP_ERR_NOT_OWNED (not in the pool),
 * TP_ERR_DOUBLE_FREE (freed already), TP_ERR_NOT_BLOCK_START (inside a
 * live block); a stream the device does not know: TP_ERR_INVALID_ARGUMENT. */
TP_API tp_status tp_pool_free(tp_pool *pool, void *ptr, tp_stream stream);
/* Requested size of a live block (TP_ERR_NOT_OWNED if none starts at ptr). */
TP_API tp_status tp_pool_block_size(tp_pool *pool, const void *ptr, size_t *out_bytes);

/* A pool remembers every stream it has seen (it records events on them and
 * waits for them in trim and destroy). Before destroying a stream the pool
 * has seen, forget it here: this waits for the stream's queued work and
 * drops the pool's reference. Unknown streams are ignored. */
TP_API tp_status tp_pool_forget_stream(tp_pool *pool, tp_stream stream);

/* Releases idle memory until the pool holds at most target_reserved_bytes,
 * oldest idle first, waiting for queued work where it must. Memory in use or
 * pinned is never released. (On CUDA, a segment pool gives a segment back
 * with cuMemFree, which returns only once all work queued on the device is
 * done: the calling thread waits for that, other threads go on.) */
TP_API tp_status tp_pool_trim(tp_pool *pool, uint64_t target_reserved_bytes, uint64_t *out_released_bytes);
/* Time-driven upkeep for hosts that may go quiet: releases memory idle
 * longer than idle_release_ns above the threshold, and, once no alloc or
 * free has happened since the previous tick, the blocks parked for quick
 * reuse (a large parked block freed longer than idle_release_ns ago goes
 * even from a busy pool). Cheap; call it now and then (e.g. once a second).
 * A segment pool on CUDA that gives a segment back waits here for the
 * device's queued work (see tp_pool_trim): a thread of its own, like the
 * PyTorch shim's upkeep thread, keeps that off the thread that launches. */
TP_API tp_status tp_pool_tick(tp_pool *pool);

/* A callback the out-of-memory ladder calls when releasing the pool's own
 * idle memory was not enough. It should release what it can (graph
 * executables, pins, other caches) and return the bytes it believes it
 * freed. Runs without the pool lock held, so it may call the pool; an
 * allocation it makes from the same pool does not start another round of
 * callbacks (it fails with TP_ERR_OUT_OF_MEMORY instead of recursing). */
typedef uint64_t (*tp_reclaim_fn)(void *user, tp_pool *pool, uint64_t bytes_needed);
TP_API tp_status tp_pool_add_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user);
/* After it returns, fn is not running and will not be called again (it
 * waits for a reclaim round in progress). TP_ERR_NOT_FOUND if fn and user
 * were not registered; TP_ERR_BUSY when called from inside a reclaim
 * callback of this pool (it would wait for itself). */
TP_API tp_status tp_pool_remove_reclaim_callback(tp_pool *pool, tp_reclaim_fn fn, void *user);

/* Pins keep memory out of reach: a block with pins is not reused, unmapped
 * or returned to the device until every pin is gone, even after it is freed.
 * Pinning [ptr, ptr+bytes) pins every live block that overlaps it; the
 * range must lie wholly in blocks (live, or freed but pinned) of the pool:
 * otherwise, and for bytes 0 or a range that wraps, nothing is pinned and
 * the call returns TP_ERR_NOT_OWNED (ptr outside the memory the pool
 * holds) or TP_ERR_INVALID_ARGUMENT. Unpin takes one pin from every block that
 * overlaps the range, all or nothing: TP_ERR_INVALID_ARGUMENT if one of
 * them has none. */
TP_API tp_status tp_pool_pin(tp_pool *pool, const void *ptr, size_t bytes);
TP_API tp_status tp_pool_unpin(tp_pool *pool, const void *ptr, size_t bytes);

/* Capture: call begin right BEFORE the stream starts capturing a graph
 * (cudaStreamBeginCapture) and end right after the capture ends. Before,
 * not after: another thread's pool call that has just seen the stream not
 * capturing could otherwise record an event on it, and query it, inside the
 * new capture, which invalidates it; once told, the pool stays off the
 * stream. (Nothing is noted between begin and the device's capture start,
 * as long as the caller queues nothing on the stream in between.) In
 * between, blocks allocated on
 * `stream` are recorded; a block freed on it may be reused by later
 * allocations of the same capture (their order is fixed in the graph), but
 * by no other stream and not given back to the device. A block of the
 * capturing stream freed on another stream during the capture stays the
 * capture's too: no stream gets it before the capture ends, and the
 * footprint covers it. The pool also asks
 * the device whether a stream captures and never records, queries or waits
 * for an event on a capturing stream (that would invalidate the capture).
 * end returns the graph's footprint: the blocks allocated during the
 * capture, live or freed, as merged address ranges (the caller owns the
 * array; free it with tp_pool_free_ranges). Each range carries one pin the
 * caller owns: tp_pool_unpin it once the graph is gone, or hand it to a
 * graph cache (tp_graph_pins.already_pinned). The pinned bytes are the
 * footprint of the capture's temporaries, about their peak, not their sum. */
TP_API tp_status tp_pool_capture_begin(tp_pool *pool, tp_stream stream);
TP_API tp_status tp_pool_capture_end(tp_pool *pool, tp_stream stream, tp_range **out_ranges, size_t *out_count);
TP_API void tp_pool_free_ranges(tp_pool *pool, tp_range *ranges);

/* current / peak (since creation or the last reset) / total (cumulative).
 * A peak is never below the true one. It is exact when one stream at a time
 * is served from its cache between two calls that take the pool's lock (a
 * miss, trim, tick, stats; every single-stream program); when several
 * streams are served at once it may exceed the true peak by at most the sum
 * of each stream's own rise since the last such call. */
typedef struct tp_stat {
    uint64_t current;
    uint64_t peak;
    uint64_t total;
} tp_stat;

/* The pool's statistics, one list for the struct, the JSON and the docs:
 * X(name, kind, description), kind being counter (only grows) or gauge. */
#define TP_POOL_STAT_BYTES_LIST(X)                                                    \
    X(requested_bytes, gauge, "live bytes as the callers asked for them")             \
    X(allocated_bytes, gauge, "live bytes after rounding to the alignment")           \
    X(reserved_bytes, gauge, "device memory held (mapped pages or segments)")         \
    X(cached_bytes, gauge, "reserved but not allocated (idle in the pool)")           \
    X(pinned_bytes, gauge, "bytes kept by pins")

#define TP_POOL_STAT_COUNT_LIST(X)                                                    \
    X(limit_bytes, gauge, "most device memory the pool may hold")                     \
    X(allocs, counter, "allocations served")                                          \
    X(frees, counter, "frees")                                                        \
    X(cache_hits, counter, "allocations served without a device call")                \
    X(device_calls, counter, "map/unmap/malloc/free/reserve calls, and failed event calls") \
    X(device_allocs, counter, "maps (VMM) or mallocs (segment)")                      \
    X(device_frees, counter, "unmaps or frees")                                       \
    X(oom_retries, counter, "out-of-memory ladder steps taken")                       \
    X(ooms, counter, "allocations that failed for lack of memory")                    \
    X(synchronizations, counter, "host waits on device work")                         \
    X(events_recorded, counter, "events recorded to learn when frees completed")      \
    X(cross_stream_waits, counter, "stream-wait-event instead of a host wait")        \
    X(hazards, counter, "hazards the device's checker reported")                      \
    X(device_errors, counter, "device calls that failed")                             \
    X(reclaim_calls, counter, "reclaim callbacks invoked")                            \
    X(streams, counter, "streams the pool has seen")                                  \
    X(free_ranges, gauge, "free ranges inside reserved memory")                       \
    X(largest_free_bytes, gauge, "largest of them")

typedef struct tp_pool_stats {
    tp_pool_kind kind;
#define TP_POOL_STAT_FIELD_BYTES_(name, kind, description) tp_stat name;
#define TP_POOL_STAT_FIELD_COUNT_(name, kind, description) uint64_t name;
    TP_POOL_STAT_BYTES_LIST(TP_POOL_STAT_FIELD_BYTES_)
    TP_POOL_STAT_COUNT_LIST(TP_POOL_STAT_FIELD_COUNT_)
#undef TP_POOL_STAT_FIELD_BYTES_
#undef TP_POOL_STAT_FIELD_COUNT_
    double fragmentation; /* 1 - largest free / total free (0 if none) */
} tp_pool_stats;

/* Full statistics; walks the pool's metadata for the free-range figures. */
TP_API tp_status tp_pool_get_stats(tp_pool *pool, tp_pool_stats *out_stats);
/* Sets every peak to its current value. */
TP_API tp_status tp_pool_reset_peaks(tp_pool *pool);
/* Writes the stats as one JSON object into buf (always NUL-terminated when
 * capacity > 0); *out_length (optional) gets the full length. Returns
 * TP_ERR_BUFFER_TOO_SMALL if it did not fit. */
TP_API tp_status tp_pool_stats_json(tp_pool *pool, char *buf, size_t capacity, size_t *out_length);
/* The same figures in the Prometheus text exposition format (which
 * OpenMetrics parsers read too), for a server's /metrics: a HELP and a TYPE
 * line per metric, names tidepool_pool_<field> (gauges) and
 * tidepool_pool_<field>_total (counters); byte figures as
 * tidepool_pool_<field> (current), _peak and _total. Every sample carries
 * labels device="sim:0" or "cuda:N" and kind="vmm" or "segment", then
 * `labels` if given: up to 64 more label pairs, e.g. `pool="kv",host="a"`,
 * written as they are, so they must be valid there -- names
 * [a-zA-Z_][a-zA-Z0-9_]* not starting with "__", none twice nor device or
 * kind; values in double quotes with \\, \" and \n the only escapes and no
 * raw newline; commas between pairs, no spaces -- or the call returns
 * TP_ERR_INVALID_ARGUMENT. Same buffer contract as tp_pool_stats_json. */
TP_API tp_status tp_pool_stats_openmetrics(tp_pool *pool, const char *labels, char *buf, size_t capacity,
                                           size_t *out_length);

/* The memory map: one JSON object listing every range the pool holds, in
 * address order -- {"kind", "now_ns", "reserved_bytes", "ranges": [{"address",
 * "bytes", "state", "stream", "requested", "idle_ns"}...]} -- where state is
 * "live" (handed out), "pinned" (handed out and pinned), "freed_pinned"
 * (freed but kept by pins), "parked" (freed, kept for quick reuse),
 * "cached" (free device memory the pool holds) or "unmapped" (reserved
 * address space without memory, VMM); stream is the stream of the block's
 * allocation, or of the last free in a free range (0 when none); idle_ns
 * how long the memory under a free range has been idle. Same buffer
 * contract as tp_pool_stats_json (ask with capacity 0 for the length). */
TP_API tp_status tp_pool_snapshot_json(tp_pool *pool, char *buf, size_t capacity, size_t *out_length);

/* What a pool does, as it does it: one event per alloc, free, device
 * allocation (a map or a malloc), device free (an unmap or a free) and
 * out-of-memory, for recording traces from a live pool. */
#define TP_POOL_EVENT_LIST(X)                        \
    X(TP_POOL_EVENT_ALLOC, "alloc")                  \
    X(TP_POOL_EVENT_FREE, "free")                    \
    X(TP_POOL_EVENT_DEVICE_ALLOC, "device_alloc")    \
    X(TP_POOL_EVENT_DEVICE_FREE, "device_free")      \
    X(TP_POOL_EVENT_OOM, "oom")

typedef enum tp_pool_event_kind {
#define TP_POOL_EVENT_ENUM_(name, label) name,
    TP_POOL_EVENT_LIST(TP_POOL_EVENT_ENUM_)
#undef TP_POOL_EVENT_ENUM_
    TP_POOL_EVENT_COUNT_
} tp_pool_event_kind;

typedef struct tp_pool_event {
    tp_pool_event_kind kind;
    uint64_t time_ns;  /* the device's clock (the virtual one on the simulator) */
    uint64_t address;  /* the block, or the device range; 0 for out of memory */
    uint64_t bytes;    /* alloc, free, oom: bytes as the caller asked; device: the range */
    tp_stream stream;  /* alloc, free, oom: the caller's stream; device events: 0 */
} tp_pool_event;

typedef void (*tp_pool_observer_fn)(void *user, const tp_pool_event *event);
/* One observer per pool (fn NULL removes it). It is called on the thread of
 * the call, with the pool's lock held (while an observer is set every alloc
 * and free takes it, so events come one at a time): keep it short, and do
 * not call into the pool from it. */
TP_API tp_status tp_pool_set_observer(tp_pool *pool, tp_pool_observer_fn fn, void *user);
/* "alloc", "free", ...; NULL for values outside the list. */
TP_API const char *tp_pool_event_name(tp_pool_event_kind kind);

typedef struct tp_oom_report {
    uint64_t request_bytes;
    uint64_t limit_bytes;
    uint64_t capacity_bytes;      /* device total */
    uint64_t device_free_bytes;   /* device free at the time */
    uint64_t allocated_bytes;     /* in use by callers */
    uint64_t reserved_bytes;
    uint64_t cached_bytes;
    uint64_t pinned_bytes;
    uint64_t largest_free_bytes;
    double fragmentation;
    tp_status device_status;      /* what the last device call said */
    char message[320];            /* one readable line with all of the above */
} tp_oom_report;

/* The report of the most recent failed allocation (TP_ERR_NOT_FOUND if
 * there was none). */
TP_API tp_status tp_pool_last_oom_report(tp_pool *pool, tp_oom_report *out_report);

/* Validates every invariant of the pool and its layers. On failure returns
 * TP_ERR_CORRUPT and describes the first violation in msg. */
TP_API tp_status tp_pool_check(tp_pool *pool, char *msg, size_t msg_capacity);

/* ------------------------------------------------------------ graph cache */

/* A bounded cache of instantiated graph executables, keyed by a caller-chosen
 * 64-bit key (llama.cpp uses the address of a graph split's first node).
 * Bounded by count and by bytes; least recently used goes first, but keys in
 * steady use sit in a protected segment that a burst of one-shot keys cannot
 * flush (segmented LRU). Executables idle longer than idle_evict_ns are
 * destroyed on tick (or by the optional background thread) even if nothing
 * is launched again. An executable can pin pool memory it uses; the pins go
 * when it is evicted, after its last launch has completed.
 *
 * Lifetime: pools attached to a cache, or whose memory it pins, must outlive
 * the cache, or first have the keys pinning them evicted and then be
 * detached (detach waits for those keys' last launches and releases their
 * pins).
 * tp_graph_cache_destroy must not race with allocations on attached pools. */
typedef struct tp_graph_cache tp_graph_cache;

typedef struct tp_graph_cache_config {
    uint32_t max_execs;         /* 0: 64; at most 16,777,216 (2^24: larger
                                   values, UINT32_MAX included, mean that) */
    uint64_t max_bytes;         /* device bytes of all executables; 0: 256 MiB;
                                   TP_BYTES_UNLIMITED: no cap */
    uint64_t idle_evict_ns;     /* 0: 10 s; TP_NS_NEVER: no idle eviction */
    uint32_t protected_percent; /* share of the count kept for keys used more
                                   than once; 0: 80 */
    bool background_thread;     /* run tick from a thread of the cache's own */
    uint64_t tick_interval_ns;  /* that thread's period; 0: 1 s */
    uint64_t node_bytes_estimate; /* bytes per graph node when the device cannot
                                   measure an instantiation; 0: 10 KiB */
} tp_graph_cache_config;

/* Pool memory an executable uses. If already_pinned, the ranges carry one
 * pin each that the cache takes over (as tp_pool_capture_end returns them)
 * on every return of prepare/run but TP_ERR_INVALID_ARGUMENT (when prepare
 * fails they are released at once); otherwise the cache pins them itself.
 * count 0 (ranges and pool may then be NULL): the executable pins nothing. */
typedef struct tp_graph_pins {
    tp_pool *pool;
    const tp_range *ranges;
    size_t count;
    bool already_pinned;
} tp_graph_pins;

/* The cache's statistics, one list for the struct, the JSON and the
 * metrics: X(name, kind, description). */
#define TP_GRAPH_CACHE_STAT_LIST(X)                                                          \
    X(execs, gauge, "executables alive")                                                     \
    X(exec_bytes, gauge, "their device bytes")                                               \
    X(exec_bytes_peak, gauge, "most device bytes of executables at once")                    \
    X(max_bytes, gauge, "the byte cap (TP_BYTES_UNLIMITED if none)")                         \
    X(max_execs, gauge, "the count cap")                                                     \
    X(hits, counter, "prepares that found the key with the same graph")                      \
    X(updates, counter, "executables updated in place to a new graph")                       \
    X(update_failures, counter, "updates refused, re-instantiated")                          \
    X(instantiations, counter, "executables instantiated")                                   \
    X(instantiate_failures, counter, "instantiations that failed")                           \
    X(eager_fallbacks, counter, "TP_ERR_RUN_EAGER returned")                                 \
    X(launches, counter, "launches")                                                         \
    X(evictions_count, counter, "evictions to stay within max_execs")                        \
    X(evictions_bytes, counter, "evictions to stay within max_bytes")                        \
    X(evictions_idle, counter, "evictions of keys idle longer than idle_evict_ns")           \
    X(evictions_pressure, counter, "evictions for out of memory on instantiate or a pool's reclaim") \
    X(evictions_explicit, counter, "tp_graph_cache_evict")                                   \
    X(pinned_ranges, gauge, "pool ranges the executables pin")

typedef struct tp_graph_cache_stats {
#define TP_GRAPH_CACHE_STAT_FIELD_(name, kind, description) uint64_t name;
    TP_GRAPH_CACHE_STAT_LIST(TP_GRAPH_CACHE_STAT_FIELD_)
#undef TP_GRAPH_CACHE_STAT_FIELD_
} tp_graph_cache_stats;

TP_API tp_status tp_graph_cache_create(tp_device *device, const tp_graph_cache_config *config, tp_graph_cache **out_cache);
/* The device the cache was created on. */
TP_API tp_status tp_graph_cache_get_device(tp_graph_cache *cache, tp_device **out_device);
/* Evicts everything (waiting for running launches) and frees the cache. */
TP_API tp_status tp_graph_cache_destroy(tp_graph_cache *cache);

/* Registers the cache as a reclaim callback of pool: when the pool runs out
 * of memory it evicts idle executables (releasing their pins) first. */
TP_API tp_status tp_graph_cache_attach_pool(tp_graph_cache *cache, tp_pool *pool);
/* Also waits for the last launches of evicted executables that pinned the
 * pool's memory and releases those pins, so that the cache keeps nothing of
 * the pool (executables still cached keep theirs: evict them first).
 * TP_ERR_NOT_FOUND if pool is not attached (the pins go all the same).
 * TP_ERR_BUSY from inside a reclaim callback of that pool: nothing is
 * detached (call it again after the round). */
TP_API tp_status tp_graph_cache_detach_pool(tp_graph_cache *cache, tp_pool *pool);

/* Makes key's executable match graph: a known key whose executable can be
 * updated to graph is updated in place; a new key, or a failed update, is
 * instantiated (evicting to stay within the bounds). If instantiation runs
 * out of memory after evicting everything evictable and having the
 * attached pools give back their idle memory (tp_pool_trim), or the
 * executable alone is larger than max_bytes, returns TP_ERR_RUN_EAGER: run the work
 * without a graph. pins NULL keeps the pins the executable already has;
 * pins replace them otherwise (the old ones go once its launches are done).
 * Refused, nothing prepared: graph NULL, or pins with count > 0 and NULL
 * pool or ranges, or a range of 0 bytes (TP_ERR_INVALID_ARGUMENT); ranges
 * the cache is to pin that the pool refuses (tp_pool_pin's status:
 * TP_ERR_NOT_OWNED, TP_ERR_INVALID_ARGUMENT). A device error of the
 * instantiation comes back as it is (TP_ERR_DEVICE, ...). */
TP_API tp_status tp_graph_cache_prepare(tp_graph_cache *cache, uint64_t key, tp_graph graph, const tp_graph_pins *pins);
/* Launches key's executable on stream (TP_ERR_NOT_FOUND if the key has
 * none). On a stream that captures, the launch is recorded into the capture
 * and the cache does not track it (nor makes the stream wait for the
 * executable's last launch elsewhere: a capturing stream may not wait on an
 * event recorded outside the capture): the captured graph reads the
 * executable's pool memory whenever it runs, and keeping that memory (pins)
 * for it is the caller's part. */
TP_API tp_status tp_graph_cache_launch(tp_graph_cache *cache, uint64_t key, tp_stream stream);
/* prepare, then launch (TP_ERR_NOT_FOUND if another thread evicted the key
 * in between). */
TP_API tp_status tp_graph_cache_run(tp_graph_cache *cache, uint64_t key, tp_graph graph, const tp_graph_pins *pins,
                             tp_stream stream);
/* Evicts every executable of key; TP_ERR_NOT_FOUND if it has none. */
TP_API tp_status tp_graph_cache_evict(tp_graph_cache *cache, uint64_t key);
/* Idle eviction: call now and then if background_thread is off. */
TP_API tp_status tp_graph_cache_tick(tp_graph_cache *cache);
TP_API tp_status tp_graph_cache_get_stats(tp_graph_cache *cache, tp_graph_cache_stats *out_stats);
/* JSON and Prometheus text, same contracts as tp_pool_stats_json and
 * tp_pool_stats_openmetrics (metric names tidepool_graph_cache_...; the
 * samples' own label is device only, so kind may be the caller's). */
TP_API tp_status tp_graph_cache_stats_json(tp_graph_cache *cache, char *buf, size_t capacity, size_t *out_length);
TP_API tp_status tp_graph_cache_stats_openmetrics(tp_graph_cache *cache, const char *labels, char *buf, size_t capacity,
                                                  size_t *out_length);
/* Validates the cache's invariants (lists, byte and count sums, bounds,
 * pins); on failure returns TP_ERR_CORRUPT with the first
 * violation in msg. */
TP_API tp_status tp_graph_cache_check(tp_graph_cache *cache, char *msg, size_t msg_capacity);

#ifdef __cplusplus
}
#endif

#endif /* TIDEPOOL_H */
