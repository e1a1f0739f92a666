/* SPDX-License-Identifier: MIT */
/*
 * replay.h -- replaying allocation traces through pools, several side by
 * side, each on its own simulated (or real) device.
 *
 * A replay pool is an adapter: tidepool's own pools, or the baselines that
 * model the pools of the public reports (baselines.c). Events stream in
 * chunks from trace.h's reader and every pool sees every chunk, so a trace
 * of any length replays in fixed memory.
 */
#ifndef TIDEPOOL_REPLAY_H
#define TIDEPOOL_REPLAY_H

#include "tidepool.h"
#include "trace.h"

#include <stdbool.h>
#include <stdio.h>

/* REPLAY_RECOVERED: the allocation succeeded, but only after the pool ran
 * out of device memory and released its cache (ggml-legacy's
 * flush-and-retry); it counts as success. */
typedef enum replay_status {
    REPLAY_OK = 0,
    REPLAY_OOM = 1,
    REPLAY_FATAL = 2,
    REPLAY_ERROR = 3,
    REPLAY_RECOVERED = 4
} replay_status;

typedef struct replay_counters {
    uint64_t reserved_bytes;  /* device memory the pool holds now */
    uint64_t peak_reserved_bytes; /* exact maximum of reserved_bytes so far */
    uint64_t cached_bytes;    /* of which idle */
    uint64_t device_calls;
    uint64_t device_allocs;
    uint64_t hazards;
    uint64_t lifo_violations; /* ggml-vmm only */
    uint64_t oom_recoveries;  /* out-of-memory recoveries (tidepool: OOM-ladder steps; ggml-legacy: flushes) */
} replay_counters;

typedef struct replay_pool_ops {
    replay_status (*alloc)(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out_address);
    replay_status (*free)(void *impl, uint64_t address, uint64_t bytes, tp_stream stream);
    void (*counters)(void *impl, replay_counters *out);
    /* Extra JSON members ("\"key\":value,...") or "" (optional). */
    void (*extra_json)(void *impl, char *buf, size_t capacity);
    /* One line on the most recent out-of-memory: what was asked, what the
     * pool and the device held, what it did about it (optional). */
    void (*oom_report)(void *impl, char *buf, size_t capacity);
    /* Time-driven upkeep, as a host calls it now and then (optional). */
    void (*tick)(void *impl);
    void (*destroy)(void *impl);
} replay_pool_ops;

/* A pool name ("vmm", "segment", "ggml-legacy", "ggml-vmm", "torch-default",
 * "torch-expandable") on device. */
typedef struct replay_pool_factory {
    const char *name;
    bool needs_vmm;
    /* Creates the adapter on device; NULL with err filled on failure. */
    void *(*create)(tp_device *device, const tp_pool_config *config, char *err, size_t capacity);
    const replay_pool_ops *ops;
} replay_pool_factory;

const replay_pool_factory *replay_find_pool(const char *name);
/* "vmm, segment, ggml-legacy, ggml-vmm, torch-default, torch-expandable" */
const char *replay_pool_names(void);

/* Streams a replay creates on each pool's device for the trace's streams;
 * events of further streams run on the default stream (folded_streams). */
#define REPLAY_MAX_STREAMS 63

typedef struct replay_sample {
    uint64_t event;
    uint64_t time_ns;
    uint64_t live_bytes;
    uint64_t reserved_bytes;
    uint64_t cached_bytes;
} replay_sample;

typedef struct replay_result {
    char pool[32];
    char device[256]; /* the spec as given: tp_device_open accepts up to 255 bytes */
    uint64_t events;
    uint64_t allocs, frees;
    uint64_t peak_live_bytes;
    uint64_t peak_reserved_bytes;
    uint64_t end_reserved_bytes;
    uint64_t device_calls;
    uint64_t device_allocs;
    uint64_t ooms;
    uint64_t errors;         /* frees the pool refused, statuses other than OOM */
    uint64_t unknown_frees;  /* frees of addresses the trace never allocated */
    /* allocs of an address the trace holds live already: the older block,
     * never freed by the trace, is freed (as if the trace had) before the
     * new one is allocated */
    uint64_t duplicate_allocs;
    /* streams of the trace beyond REPLAY_MAX_STREAMS: their events ran
     * on the default stream (ordering and cross-stream behaviour not as traced) */
    uint64_t folded_streams;
    uint64_t hazards;
    uint64_t lifo_violations;
    uint64_t oom_recoveries; /* see replay_counters */
    bool fatal;              /* the pool gave up (ggml-vmm aborts on OOM) */
    uint64_t fatal_event;
    uint64_t first_oom_event;      /* 1-based event index of the first failed allocation */
    uint64_t first_recovery_event; /* ... of the first REPLAY_RECOVERED (0: none reported) */
    char first_oom_report[448];      /* the pool's oom_report at first_oom_event */
    char first_recovery_report[448]; /* ... at first_recovery_event */
    uint64_t replay_ns;      /* host time spent replaying (not parsing) */
    char extra[512];
    /* Downsampled curve: buckets keep their maxima, so peaks survive. */
    replay_sample *samples;
    size_t sample_count;
} replay_result;

/* Where a replay_file run is, for a progress line. */
typedef struct replay_progress {
    uint64_t events;       /* replayed so far */
    uint64_t events_total; /* 0: not known (CSV: only the bytes are) */
    uint64_t bytes_read;   /* of the file as stored (compressed or not) */
    uint64_t bytes_total;  /* 0: not known */
} replay_progress;

typedef struct replay_options {
    const char *device_spec; /* NULL: "sim:1TiB" */
    tp_pool_config pool_config;
    bool keep_samples;
    bool follow_trace_time;  /* advance the simulated clock with the trace (default on) */
    /* Device memory another tenant holds for the whole replay (e.g. model
     * weights outside the pool); simulated devices only. */
    uint64_t occupied_bytes;
    /* Call the pools' tick every this many ns of trace time, as the PyTorch
     * shim's upkeep thread does once a second (0: never). */
    uint64_t tick_ns;
    /* PyTorch snapshots: the device whose trace is replayed. */
    unsigned pt_device;
    /* tidepool pools keep the memory map (tp_pool_snapshot_json) taken when
     * their reserved bytes reach a new high after an allocation: see
     * replay_peak_snapshot. */
    bool snapshot_peaks;
    /* replay_file: threads that read, parse and replay the trace, the
     * replay's own included (0 or 1: all on the calling thread). With
     * several pools and 3 or more threads (a snapshot, parsed at open: 2),
     * up to one thread per pool replays (each pool is independent: the same
     * events, its own device) and at least one parses; the rest parse, at
     * most 4 (replay_file_timing.threads says how many were used). Parse
     * workers run in a worker process (trace_set_worker_process). The
     * figures are the same whatever the count. */
    unsigned threads;
    /* replay_file: bytes of text in a parse block (0: the reader's default;
     * for tests, trace_open_options.block_bytes). */
    size_t block_bytes;
    /* replay_file calls this after every chunk of events (optional). */
    void (*progress)(void *user, const replay_progress *progress);
    void *progress_user;
} replay_options;

typedef struct replay_run replay_run;

/* Starts replaying into the named pools (comma-separated). */
replay_run *replay_begin(const char *pool_names, const replay_options *options, char *err, size_t capacity);
/* Feeds a chunk of events to every pool. */
void replay_feed(replay_run *run, const trace_event *events, size_t count);
/* Ends the replay; results stay valid until replay_free. */
size_t replay_finish(replay_run *run, replay_result **out_results);
void replay_free(replay_run *run);

/* Where a replay_file run spent its time (host ns, wall clock). */
typedef struct replay_file_timing {
    uint64_t events;
    unsigned threads;  /* as used: lane threads + parse workers */
    unsigned lane_threads; /* threads replaying the pools (1, or up to one per pool) */
    bool slots_on_workers; /* the live table was filled on the parse workers, beside the replay */
    uint64_t open_ns;  /* opening the file: the header, and a gzip file inflated whole (trace.c) */
    uint64_t read_ns;  /* the replay thread waiting for parsed events (with one thread: reading and parsing them) */
    uint64_t slot_ns;  /* giving events their live-table slots (once for all pools; on the parse workers if any) */
    uint64_t replay_ns; /* the pools replaying (all of them, summed over the lane threads; replay_result.replay_ns is each one's) */
    uint64_t wall_ns;  /* from opening the file to the last event replayed, all included */
} replay_file_timing;

/* Replays a whole file. Returns 0, or -1 with err filled. timing may be NULL. */
int replay_file(const char *path, const char *pool_names, const replay_options *options, replay_run **out_run,
                replay_file_timing *timing, char *err, size_t capacity);

/* True for tidepool's own pools (vmm, segment), false for the baselines. */
bool replay_is_tidepool(const char *pool_name);
/* The tidepool pool behind lane (results[lane]); NULL for a baseline. Valid
 * until replay_free. */
tp_pool *replay_tidepool_of(replay_run *run, size_t lane);
/* With options.snapshot_peaks: lane's memory map at its highest reserved
 * bytes (NUL-terminated JSON), or NULL (a baseline, or nothing allocated). */
const char *replay_peak_snapshot(replay_run *run, size_t lane);

/* tp_device_open with the library's ERROR messages: on failure err holds
 * "cannot open device 'SPEC': " and why (a bad spec gets a hint). */
tp_status replay_open_device(const char *spec, tp_device **out, char *err, size_t capacity);

/* One JSON object per result (no trailing newline). */
void replay_result_json(const replay_result *r, FILE *out);
double replay_ratio(const replay_result *r);
uint64_t replay_now_ns(void);

#endif
