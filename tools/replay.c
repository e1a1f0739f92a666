/* SPDX-License-Identifier: MIT */
/*
 * replay.c -- the replay engine and the adapter for tidepool's own pools.
 *
 * Each pool replays on its own device, opened from the same spec, so device
 * capacity and the simulated clock are per pool. The simulated clock
 * follows the trace's timestamps, so time-based policies (idle release)
 * behave as they would have in the recorded run. Trace addresses are only
 * identities: the run gives each live trace address a slot (once for all
 * pools) and each pool keeps what it returned per slot (see slot_table). Peak live bytes are computed by the engine from the
 * requests alone and are the same for every pool.
 *
 * Threads (replay_file): the parse workers run in a worker process (the
 * slots are given there, in the reader's batch hook), so that while one
 * thread replays, this process has no second thread and the library's
 * mutexes stay on glibc's single-threaded path; with several pools and
 * threads to spare, lane threads replay the pools side by side, each batch
 * handed to all of them at once (lane_crew). A pool's lane is touched by
 * one thread only, so the figures are the same whatever the threads.
 */
#include "replay.h"

#include "tide.h"
#include "tpi_map.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SAMPLE_TARGET 2048
#define MAX_STREAMS REPLAY_MAX_STREAMS

uint64_t replay_now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------ tidepool pool adapter */

typedef struct tidepool_adapter {
    tp_pool *pool;
    /* snapshot_peaks: the observer sets grew on a device allocation; the
     * alloc then compares reserved bytes with the snapshot's. */
    bool watch_peaks, grew;
    uint64_t snapshot_reserved;
    char *snapshot;
    size_t snapshot_capacity;
} tidepool_adapter;

static void tidepool_observe(void *user, const tp_pool_event *event) {
    if (event->kind == TP_POOL_EVENT_DEVICE_ALLOC) ((tidepool_adapter *)user)->grew = true;
}

/* Takes the memory map into a->snapshot; false if host memory ran out. */
static bool tidepool_take_snapshot(tidepool_adapter *a) {
    size_t length = 0;
    for (int attempt = 0; attempt < 4; attempt++) {
        tp_status st = tp_pool_snapshot_json(a->pool, a->snapshot, a->snapshot_capacity, &length);
        if (st == TP_OK && a->snapshot) return true;
        if (st != TP_OK && st != TP_ERR_BUFFER_TOO_SMALL) return false;
        size_t capacity = (length + 1) * 5 / 4 + 4096;
        char *grown = realloc(a->snapshot, capacity);
        if (!grown) return false;
        a->snapshot = grown;
        a->snapshot_capacity = capacity;
    }
    return false;
}

static void tidepool_check_peak(tidepool_adapter *a) {
    if (!a->grew) return;
    a->grew = false;
    tp_pool_stats s;
    if (tp_pool_get_stats(a->pool, &s) != TP_OK || s.reserved_bytes.current <= a->snapshot_reserved) return;
    if (tidepool_take_snapshot(a)) a->snapshot_reserved = s.reserved_bytes.current;
}

static void *tidepool_create(tp_device *device, const tp_pool_config *config, tp_pool_kind kind, char *err,
                             size_t cap) {
    tidepool_adapter *a = calloc(1, sizeof *a);
    if (!a) return NULL;
    tp_pool_config pc = *config;
    pc.kind = kind;
    tp_status st = tp_pool_create(device, &pc, &a->pool);
    if (st != TP_OK) {
        snprintf(err, cap, "creating the %s pool failed: %s", kind == TP_POOL_VMM ? "vmm" : "segment",
                 tp_status_name(st));
        free(a);
        return NULL;
    }
    return a;
}

static void *vmm_create(tp_device *d, const tp_pool_config *c, char *e, size_t n) {
    return tidepool_create(d, c, TP_POOL_VMM, e, n);
}
static void *segment_create(tp_device *d, const tp_pool_config *c, char *e, size_t n) {
    return tidepool_create(d, c, TP_POOL_SEGMENT, e, n);
}

static replay_status tidepool_alloc(void *impl, uint64_t bytes, tp_stream stream, uint64_t *out) {
    tidepool_adapter *a = impl;
    void *p = NULL;
    tp_status st = tp_pool_alloc(a->pool, (size_t)bytes, stream, &p);
    if (a->watch_peaks) tidepool_check_peak(a);
    if (st == TP_OK) {
        *out = (uint64_t)(uintptr_t)p;
        return REPLAY_OK;
    }
    return st == TP_ERR_OUT_OF_MEMORY ? REPLAY_OOM : REPLAY_ERROR;
}

static replay_status tidepool_free(void *impl, uint64_t address, uint64_t bytes, tp_stream stream) {
    (void)bytes;
    tidepool_adapter *a = impl;
    return tp_pool_free(a->pool, (void *)(uintptr_t)address, stream) == TP_OK ? REPLAY_OK : REPLAY_ERROR;
}

static void tidepool_counters(void *impl, replay_counters *out) {
    tidepool_adapter *a = impl;
    tp_pool_stats s;
    tp_pool_get_stats(a->pool, &s);
    out->reserved_bytes = s.reserved_bytes.current;
    out->peak_reserved_bytes = s.reserved_bytes.peak;
    out->cached_bytes = s.cached_bytes.current;
    out->device_calls = s.device_calls;
    out->device_allocs = s.device_allocs;
    out->hazards = s.hazards;
    out->lifo_violations = 0;
    out->oom_recoveries = s.oom_retries;
}

static void tidepool_extra(void *impl, char *buf, size_t cap) {
    tidepool_adapter *a = impl;
    tp_pool_stats s;
    tp_pool_get_stats(a->pool, &s);
    snprintf(buf, cap,
             "\"device_frees\":%llu,\"cache_hits\":%llu,\"synchronizations\":%llu,\"cross_stream_waits\":%llu,"
             "\"fragmentation_end\":%.4f",
             (unsigned long long)s.device_frees, (unsigned long long)s.cache_hits,
             (unsigned long long)s.synchronizations, (unsigned long long)s.cross_stream_waits, s.fragmentation);
}

static void tidepool_oom_report(void *impl, char *buf, size_t cap) {
    tidepool_adapter *a = impl;
    tp_oom_report report;
    if (tp_pool_last_oom_report(a->pool, &report) == TP_OK)
        snprintf(buf, cap, "%s", report.message);
    else if (cap)
        buf[0] = '\0';
}

static void tidepool_destroy(void *impl) {
    tidepool_adapter *a = impl;
    tp_pool_destroy(a->pool);
    free(a->snapshot);
    free(a);
}

static void tidepool_tick(void *impl) { tp_pool_tick(((tidepool_adapter *)impl)->pool); }

static const replay_pool_ops tidepool_ops = {.alloc = tidepool_alloc,
                                             .free = tidepool_free,
                                             .counters = tidepool_counters,
                                             .extra_json = tidepool_extra,
                                             .oom_report = tidepool_oom_report,
                                             .tick = tidepool_tick,
                                             .destroy = tidepool_destroy};

extern const replay_pool_factory replay_ggml_legacy_factory;
extern const replay_pool_factory replay_ggml_vmm_factory;
extern const replay_pool_factory replay_torch_default_factory;
extern const replay_pool_factory replay_torch_expandable_factory;

static const replay_pool_factory vmm_factory = {"vmm", true, vmm_create, &tidepool_ops};
static const replay_pool_factory segment_factory = {"segment", false, segment_create, &tidepool_ops};

static const replay_pool_factory *const factories[] = {&vmm_factory, &segment_factory, &replay_ggml_legacy_factory,
                                                       &replay_ggml_vmm_factory, &replay_torch_default_factory,
                                                       &replay_torch_expandable_factory};

const replay_pool_factory *replay_find_pool(const char *name) {
    for (size_t i = 0; i < sizeof factories / sizeof *factories; i++)
        if (strcmp(factories[i]->name, name) == 0) return factories[i];
    return NULL;
}

const char *replay_pool_names(void) { return "vmm, segment, ggml-legacy, ggml-vmm, torch-default, torch-expandable"; }

bool replay_is_tidepool(const char *name) { return !strcmp(name, "vmm") || !strcmp(name, "segment"); }

/* ------------------------------------------------------ opening devices */

/* The library's ERROR messages while a device opens (one thread at a time
 * opens here; the callback stays installed and drops what comes later). */
static _Thread_local char *open_messages;
static _Thread_local size_t open_messages_capacity;

static void capture_log(void *user, tp_log_level level, const char *message) {
    (void)user;
    if (level < TP_LOG_ERROR || !open_messages || !open_messages_capacity) return;
    size_t used = strlen(open_messages);
    if (used + 3 >= open_messages_capacity) return;
    snprintf(open_messages + used, open_messages_capacity - used, "%s%s", used ? "; " : "", message);
}

tp_status replay_open_device(const char *spec, tp_device **out, char *err, size_t cap) {
    char messages[512] = "";
    open_messages = messages;
    open_messages_capacity = sizeof messages;
    tp_device_config config = {.log = capture_log, .log_level = TP_LOG_ERROR};
    tp_status st = tp_device_open(spec, &config, out);
    open_messages = NULL;
    open_messages_capacity = 0;
    if (st == TP_OK) return st;
    if (st == TP_ERR_BAD_SPEC)
        snprintf(err, cap, "cannot open device '%s': bad device spec '%s' (try sim, sim:6GiB,novmm, cuda:0)%s%s", spec,
                 spec, messages[0] ? ": " : "", messages);
    else
        snprintf(err, cap, "cannot open device '%s': %s", spec, messages[0] ? messages : tp_status_describe(st));
    return st;
}

/* ----------------------------------------------------------- the engine */

/* The live table, in two parts. The run's slot table (shared by its lanes,
 * filled once per batch before any lane replays it) gives each live trace
 * address a slot: an alloc (of any size, zero bytes too) takes a new slot (from a free list,
 * else the next never used) or, when its address is live already (an alloc
 * the trace never freed), that address's slot; a free gives its address's
 * slot back. The slot replaces the event's address (trace addresses are
 * only identities, and nothing after this needs them), so a batch of
 * events carries its slots. Each lane keeps, per slot, what its pool
 * returned (a live_block), so its replay loop indexes an array instead of
 * hashing. Which addresses are live depends on the trace alone, not on
 * what any pool did, so one table serves every lane: a lane writes its
 * block at the alloc and reads it at the free, in trace order, before the
 * slot can be taken again. replay_file resolves slots in the trace
 * reader's ordering step (trace_set_batch_hook: in the parse worker process
 * when there are workers, so off the replay's critical path; only the
 * events come back from there, so the run's own table stays empty);
 * replay_feed resolves a copy of the caller's events. */
typedef struct live_block {
    uint64_t address; /* what the pool returned; 0 = the allocation failed */
    uint64_t bytes;
} live_block;

#define SLOT_NONE UINT32_MAX /* no slot: a free of an address not live (or no memory for the table) */
/* Beside the slot in an alloc's address: the address was live already (the
 * trace never freed the older block); the alloc takes the same slot. */
#define SLOT_DUPLICATE (1ull << 32)

typedef struct slot_table {
    tpi_map map;        /* trace address -> slot */
    uint32_t *free;     /* slots given back, a stack */
    size_t free_count, free_capacity;
    uint32_t used;      /* slots ever handed out */
} slot_table;

static void slots_init(slot_table *t) {
    memset(t, 0, sizeof *t);
    tpi_map_init(&t->map, NULL);
}

static void slots_destroy(slot_table *t) {
    tpi_map_destroy(&t->map);
    free(t->free);
}

/* Replaces each event's address by its slot (SLOT_NONE: none; an alloc of
 * an address live already: its slot and SLOT_DUPLICATE). A map or
 * free-list that cannot grow leaves the alloc without a slot (its free is
 * then unknown). A trace_batch_hook (user: the slot_table). */
static void slots_resolve(void *user, trace_event *events, size_t count) {
    slot_table *t = user;
    for (size_t i = 0; i < count; i++) {
        trace_event *e = &events[i];
        uint32_t slot = SLOT_NONE;
        uint64_t duplicate = 0;
        if (e->action == TRACE_ALLOC) { /* zero bytes too: its free is then known (and frees nothing) */
            uint64_t *known = tpi_map_find(&t->map, e->address);
            if (known) {
                slot = (uint32_t)*known;
                duplicate = SLOT_DUPLICATE;
            } else if (t->free_count || t->used < SLOT_NONE) {
                uint32_t fresh = t->free_count ? t->free[t->free_count - 1] : t->used;
                if (tpi_map_put(&t->map, e->address, fresh)) {
                    slot = fresh;
                    if (t->free_count) t->free_count--;
                    else t->used++;
                }
            }
        } else if (e->action == TRACE_FREE) {
            uint64_t taken;
            if (tpi_map_remove(&t->map, e->address, &taken)) {
                if (t->free_count == t->free_capacity) {
                    size_t cap = t->free_capacity ? t->free_capacity * 2 : 4096;
                    uint32_t *grown = realloc(t->free, cap * sizeof *grown);
                    if (grown) {
                        t->free = grown;
                        t->free_capacity = cap;
                    }
                }
                slot = (uint32_t)taken;
                /* a slot that cannot go back on the stack is never reused */
                if (t->free_count < t->free_capacity) t->free[t->free_count++] = slot;
            }
        }
        e->address = duplicate | slot;
    }
}

typedef struct stream_entry {
    uint32_t trace_id;
    tp_stream stream;
} stream_entry;

typedef struct replay_lane {
    const replay_pool_factory *factory;
    void *impl;
    tp_device *device;
    bool is_sim;
    uint64_t sim_now_ns;
    uint64_t last_event_ns; /* trace time of the latest event, for the final sample */
    uint64_t next_tick_ns;  /* trace time of the next tick (options.tick_ns) */
    /* A tidepool pool that needs nothing of its adapter per call (not
     * watching peaks): the loop calls it directly, as tidepool_alloc and
     * tidepool_free would. NULL: through factory->ops. */
    tp_pool *direct_pool;
    live_block *blocks; /* by slot (slot_table) */
    size_t block_capacity;
    stream_entry streams[MAX_STREAMS];
    size_t stream_count;
    stream_entry last_stream; /* the latest lane_stream answer (at first trace stream 0: the default) */
    tpi_map folded; /* trace streams past MAX_STREAMS (or not created), replayed on the default stream */
    uint64_t live_bytes;
    uint64_t sample_every, next_sample, samples_capacity;
    replay_result result;
} replay_lane;

#define FEED_EVENTS 4096 /* replay_feed's events resolved, then replayed by every lane, at a time */
#define MAX_LANE_HELPERS 63
/* Parse workers replay_file uses at most: one parses about twice as fast
 * as a pool replays (docs/results.md), so more only take memory (each
 * brings two blocks of text and events) and wake-ups. */
#define MAX_PARSE_WORKERS 4

/* replay_file's lane threads: with several pools and threads to spare,
 * helper h replays lanes l with l % (helpers + 1) == h + 1, the calling
 * thread the others, each batch at once; the caller hands a batch out
 * (batch, generation++) and waits until no helper is busy with it before
 * the batch's memory is reused. Lanes share nothing but the read-only
 * batch, so they need no lock while they replay. */
typedef struct lane_crew {
    pthread_mutex_t lock;
    pthread_cond_t go, done;
    pthread_t threads[MAX_LANE_HELPERS];
    unsigned helpers;
    uint64_t generation; /* batches handed out */
    unsigned busy;       /* helpers not done with the current batch */
    bool stop;
    const trace_event *batch;
    size_t batch_count;
} lane_crew;

struct replay_run {
    replay_lane *lanes;
    size_t lane_count;
    slot_table slots;
    replay_options options;
    uint64_t events;
    replay_result *results;
    trace_event scratch[FEED_EVENTS]; /* replay_feed's resolved copy */
    lane_crew *crew; /* replay_file with lane threads; NULL: every lane on the caller's thread */
};

static void lane_sample(replay_lane *lane, uint64_t time_ns) {
    replay_counters c = {0};
    lane->factory->ops->counters(lane->impl, &c);
    replay_result *r = &lane->result;
    if (r->sample_count && r->samples[r->sample_count - 1].event / lane->sample_every ==
                               r->events / lane->sample_every) {
        /* same bucket: keep the maxima */
        replay_sample *s = &r->samples[r->sample_count - 1];
        if (lane->live_bytes > s->live_bytes) s->live_bytes = lane->live_bytes;
        if (c.reserved_bytes > s->reserved_bytes) s->reserved_bytes = c.reserved_bytes;
        if (c.cached_bytes > s->cached_bytes) s->cached_bytes = c.cached_bytes;
        return;
    }
    if (r->sample_count == lane->samples_capacity) {
        /* Halve the resolution: merge neighbours, keeping maxima. */
        size_t half = 0;
        for (size_t i = 0; i < r->sample_count; i += 2, half++) {
            replay_sample m = r->samples[i];
            if (i + 1 < r->sample_count) {
                const replay_sample *b = &r->samples[i + 1];
                m.live_bytes = m.live_bytes > b->live_bytes ? m.live_bytes : b->live_bytes;
                m.reserved_bytes = m.reserved_bytes > b->reserved_bytes ? m.reserved_bytes : b->reserved_bytes;
                m.cached_bytes = m.cached_bytes > b->cached_bytes ? m.cached_bytes : b->cached_bytes;
            }
            r->samples[half] = m;
        }
        r->sample_count = half;
        lane->sample_every *= 2;
    }
    r->samples[r->sample_count++] =
        (replay_sample){r->events, time_ns, lane->live_bytes, c.reserved_bytes, c.cached_bytes};
}

static tp_stream lane_stream_lookup(replay_lane *lane, uint32_t trace_id) {
    if (trace_id == 0) return TP_STREAM_DEFAULT;
    for (size_t i = 0; i < lane->stream_count; i++)
        if (lane->streams[i].trace_id == trace_id) return lane->streams[i].stream;
    tp_stream s = TP_STREAM_DEFAULT;
    if (lane->stream_count < MAX_STREAMS && tp_stream_create(lane->device, &s) == TP_OK) {
        lane->streams[lane->stream_count++] = (stream_entry){trace_id, s};
        return s;
    }
    /* no stream of its own: the default one, and the stream counted once */
    if (!tpi_map_find(&lane->folded, trace_id) && tpi_map_put(&lane->folded, trace_id, 1)) lane->result.folded_streams++;
    return TP_STREAM_DEFAULT;
}

/* The pool stream of a trace stream (made at its first event); the same as
 * the previous event's more often than not, which costs no call. */
static inline tp_stream lane_stream(replay_lane *lane, uint32_t trace_id) {
    if (trace_id != lane->last_stream.trace_id)
        lane->last_stream = (stream_entry){trace_id, lane_stream_lookup(lane, trace_id)};
    return lane->last_stream.stream;
}

static void lane_oom_report(replay_lane *lane, char *buf, size_t capacity) {
    if (lane->factory->ops->oom_report) lane->factory->ops->oom_report(lane->impl, buf, capacity);
}

/* Room for slot in lane->blocks; false when host memory ran out. */
static bool lane_reserve(replay_lane *lane, uint32_t slot) {
    if (slot < lane->block_capacity) return true;
    size_t cap = lane->block_capacity ? lane->block_capacity : 4096;
    while (cap <= slot) cap *= 2;
    live_block *grown = realloc(lane->blocks, cap * sizeof *grown);
    if (!grown) return false;
    lane->blocks = grown;
    lane->block_capacity = cap;
    return true;
}

/* Frees the pool's block in slot (nothing for a failed or zero-byte alloc). */
static inline void lane_release(replay_lane *lane, uint32_t slot, uint32_t trace_stream) {
    live_block block = lane->blocks[slot];
    lane->blocks[slot] = (live_block){0, 0};
    if (!block.address) return;
    tp_stream stream = lane_stream(lane, trace_stream);
    bool freed = lane->direct_pool ? tp_pool_free(lane->direct_pool, (void *)(uintptr_t)block.address, stream) == TP_OK
                                   : lane->factory->ops->free(lane->impl, block.address, block.bytes, stream) == REPLAY_OK;
    if (!freed) lane->result.errors++;
    lane->live_bytes -= block.bytes;
}

/* One event whose address is its slot (slots_resolve). */
static void lane_event(replay_lane *lane, const trace_event *e, bool follow_time, uint64_t tick_ns) {
    replay_result *r = &lane->result;
    uint32_t slot = (uint32_t)e->address;
    lane->last_event_ns = e->time_ns;
    if (lane->is_sim && follow_time && e->time_ns > lane->sim_now_ns) {
        tp_sim_advance(lane->device, e->time_ns - lane->sim_now_ns);
        lane->sim_now_ns = e->time_ns;
    }
    if (tick_ns && lane->factory->ops->tick && e->time_ns >= lane->next_tick_ns) {
        lane->factory->ops->tick(lane->impl);
        lane->next_tick_ns = e->time_ns + tick_ns;
    }
    r->events++;
    if (r->fatal) return;
    if (e->action == TRACE_ALLOC) {
        r->allocs++;
        if (e->address & SLOT_DUPLICATE) {
            /* an alloc of an address already live: the older block, which
             * the trace never freed, is freed first, as if the trace had */
            r->duplicate_allocs++;
            if (slot < lane->block_capacity) lane_release(lane, slot, e->stream);
        }
        if (!e->bytes) { /* zero-byte requests are not memory: an empty block, so that its free frees nothing */
            if (slot != SLOT_NONE && lane_reserve(lane, slot)) lane->blocks[slot] = (live_block){0, 0};
            return;
        }
        uint64_t address = 0;
        replay_status st;
        if (lane->direct_pool) { /* tidepool_alloc without the calls through pointers */
            void *p = NULL;
            tp_status pst = tp_pool_alloc(lane->direct_pool, (size_t)e->bytes, lane_stream(lane, e->stream), &p);
            address = (uint64_t)(uintptr_t)p;
            st = pst == TP_OK ? REPLAY_OK : pst == TP_ERR_OUT_OF_MEMORY ? REPLAY_OOM : REPLAY_ERROR;
        } else {
            st = lane->factory->ops->alloc(lane->impl, e->bytes, lane_stream(lane, e->stream), &address);
        }
        if (st == REPLAY_RECOVERED) {
            if (!r->first_recovery_event) {
                r->first_recovery_event = r->events;
                lane_oom_report(lane, r->first_recovery_report, sizeof r->first_recovery_report);
            }
            st = REPLAY_OK;
        }
        if (st == REPLAY_OOM || st == REPLAY_FATAL) {
            if (!r->ooms) {
                r->first_oom_event = r->events;
                lane_oom_report(lane, r->first_oom_report, sizeof r->first_oom_report);
            }
            r->ooms++;
            if (st == REPLAY_FATAL) {
                r->fatal = true;
                r->fatal_event = r->events;
            }
            address = 0;
        } else if (st != REPLAY_OK) {
            r->errors++;
            address = 0;
        } else {
            lane->live_bytes += e->bytes;
            if (lane->live_bytes > r->peak_live_bytes) r->peak_live_bytes = lane->live_bytes;
        }
        if (slot != SLOT_NONE && lane_reserve(lane, slot)) lane->blocks[slot] = (live_block){address, e->bytes};
    } else if (e->action == TRACE_FREE) {
        r->frees++;
        if (slot == SLOT_NONE || slot >= lane->block_capacity) {
            r->unknown_frees++;
            return;
        }
        lane_release(lane, slot, e->stream);
    }
}

replay_run *replay_begin(const char *pool_names, const replay_options *options, char *err, size_t cap) {
    replay_run *run = calloc(1, sizeof *run);
    if (!run) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    run->options = *options;
    slots_init(&run->slots);
    if (!run->options.device_spec) run->options.device_spec = "sim:1TiB";
    char names[256];
    snprintf(names, sizeof names, "%s", pool_names);
    size_t count = 1;
    for (const char *p = names; *p; p++) count += *p == ',';
    run->lanes = calloc(count, sizeof *run->lanes);
    if (!run->lanes) goto oom;
    char *save = NULL;
    for (char *name = strtok_r(names, ",", &save); name; name = strtok_r(NULL, ",", &save)) {
        while (*name == ' ') name++;
        const replay_pool_factory *f = replay_find_pool(name);
        if (!f) {
            snprintf(err, cap, "unknown pool '%s' (known: %s)", name, replay_pool_names());
            goto fail;
        }
        replay_lane *lane = &run->lanes[run->lane_count];
        lane->factory = f;
        tpi_map_init(&lane->folded, NULL);
        if (replay_open_device(run->options.device_spec, &lane->device, err, cap) != TP_OK) goto fail;
        run->lane_count++;
        tp_device_info info;
        tp_device_get_info(lane->device, &info);
        lane->is_sim = strcmp(info.backend, "sim") == 0;
        if (run->options.occupied_bytes) {
            tp_status occupy = tp_sim_occupy(lane->device, run->options.occupied_bytes);
            if (occupy != TP_OK) {
                char bytes[32];
                snprintf(err, cap, "cannot occupy %s of device '%s': %s",
                         tp_format_bytes(run->options.occupied_bytes, bytes, sizeof bytes), run->options.device_spec,
                         occupy == TP_ERR_UNSUPPORTED ? "only simulated devices can be occupied" : tp_status_name(occupy));
                goto fail;
            }
        }
        if (f->needs_vmm && !info.vmm_enabled) {
            snprintf(err, cap, "pool '%s' needs a device with VMM; '%s' has none (try segment or ggml-legacy)", name,
                     run->options.device_spec);
            goto fail;
        }
        lane->impl = f->create(lane->device, &run->options.pool_config, err, cap);
        if (!lane->impl) goto fail;
        if (run->options.snapshot_peaks && f->ops == &tidepool_ops) {
            tidepool_adapter *a = lane->impl;
            a->watch_peaks = true;
            tp_pool_set_observer(a->pool, tidepool_observe, a);
        } else if (f->ops == &tidepool_ops) {
            lane->direct_pool = ((tidepool_adapter *)lane->impl)->pool;
        }
        snprintf(lane->result.pool, sizeof lane->result.pool, "%s", f->name);
        snprintf(lane->result.device, sizeof lane->result.device, "%s", run->options.device_spec);
        lane->sample_every = 1;
        lane->samples_capacity = run->options.keep_samples ? SAMPLE_TARGET : 0;
        if (lane->samples_capacity) {
            lane->result.samples = calloc(lane->samples_capacity, sizeof *lane->result.samples);
            if (!lane->result.samples) goto oom;
        }
    }
    if (!run->lane_count) {
        snprintf(err, cap, "no pool named");
        goto fail;
    }
    return run;
oom:
    snprintf(err, cap, "out of memory");
fail:
    replay_free(run);
    return NULL;
}

/* Replays a batch of resolved events (their addresses are slots) on lane. */
static void lane_replay(const replay_run *run, replay_lane *lane, const trace_event *events, size_t n) {
    uint64_t sample_ns = 0;
    uint64_t start = replay_now_ns();
    bool follow_time = run->options.follow_trace_time;
    uint64_t tick_ns = run->options.tick_ns;
    for (size_t i = 0; i < n; i++) {
        lane_event(lane, &events[i], follow_time, tick_ns);
        if (lane->samples_capacity && lane->result.events >= lane->next_sample) {
            uint64_t s0 = replay_now_ns();
            lane_sample(lane, events[i].time_ns);
            lane->next_sample = lane->result.events + lane->sample_every;
            sample_ns += replay_now_ns() - s0;
        }
    }
    lane->result.replay_ns += replay_now_ns() - start - sample_ns;
}

/* The lanes of thread `member` of the crew (0: the caller) replay batch. */
static void crew_share(replay_run *run, unsigned member, unsigned members, const trace_event *events, size_t n) {
    for (size_t l = member; l < run->lane_count; l += members) lane_replay(run, &run->lanes[l], events, n);
}

typedef struct crew_start {
    replay_run *run;
    unsigned member;
} crew_start;

static void *crew_main(void *arg) {
    crew_start *start = arg;
    replay_run *run = start->run;
    unsigned member = start->member;
    free(start);
    lane_crew *c = run->crew;
    uint64_t seen = 0;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        while (c->generation == seen && !c->stop) pthread_cond_wait(&c->go, &c->lock);
        if (c->stop) {
            pthread_mutex_unlock(&c->lock);
            return NULL;
        }
        seen = c->generation;
        const trace_event *events = c->batch;
        size_t n = c->batch_count;
        unsigned members = c->helpers + 1;
        pthread_mutex_unlock(&c->lock);
        crew_share(run, member, members, events, n);
        pthread_mutex_lock(&c->lock);
        if (--c->busy == 0) pthread_cond_signal(&c->done);
        pthread_mutex_unlock(&c->lock);
    }
}

static void crew_stop(replay_run *run);

/* Starts up to `helpers` lane threads (fewer if the system has no more);
 * when none could start, run->crew stays NULL (the lanes replay on the
 * caller's thread). */
static void crew_start_threads(replay_run *run, unsigned helpers) {
    if (helpers > MAX_LANE_HELPERS) helpers = MAX_LANE_HELPERS;
    lane_crew *c = calloc(1, sizeof *c);
    if (!c) return;
    if (pthread_mutex_init(&c->lock, NULL)) {
        free(c);
        return;
    }
    if (pthread_cond_init(&c->go, NULL)) {
        pthread_mutex_destroy(&c->lock);
        free(c);
        return;
    }
    if (pthread_cond_init(&c->done, NULL)) {
        pthread_cond_destroy(&c->go);
        pthread_mutex_destroy(&c->lock);
        free(c);
        return;
    }
    run->crew = c;
    /* helpers only read c->helpers (how lanes are dealt) once a batch is
     * handed out, after the last write here */
    unsigned started = 0;
    for (unsigned h = 0; h < helpers; h++) {
        crew_start *arg = malloc(sizeof *arg);
        if (!arg) break;
        *arg = (crew_start){run, h + 1};
        c->helpers = h + 1;
        if (pthread_create(&c->threads[h], NULL, crew_main, arg) != 0) {
            c->helpers = h;
            free(arg);
            break;
        }
        started++;
    }
    if (!started) crew_stop(run);
}

static void crew_stop(replay_run *run) {
    lane_crew *c = run->crew;
    if (!c) return;
    pthread_mutex_lock(&c->lock);
    c->stop = true;
    pthread_cond_broadcast(&c->go);
    pthread_mutex_unlock(&c->lock);
    for (unsigned h = 0; h < c->helpers; h++) pthread_join(c->threads[h], NULL);
    pthread_cond_destroy(&c->done);
    pthread_cond_destroy(&c->go);
    pthread_mutex_destroy(&c->lock);
    free(c);
    run->crew = NULL;
}

/* Every lane replays a batch of resolved events. */
static void feed_resolved(replay_run *run, const trace_event *events, size_t n) {
    lane_crew *c = run->crew;
    if (!c) {
        crew_share(run, 0, 1, events, n);
    } else {
        pthread_mutex_lock(&c->lock);
        c->batch = events;
        c->batch_count = n;
        c->busy = c->helpers;
        c->generation++;
        pthread_cond_broadcast(&c->go);
        pthread_mutex_unlock(&c->lock);
        crew_share(run, 0, c->helpers + 1, events, n);
        pthread_mutex_lock(&c->lock);
        while (c->busy) pthread_cond_wait(&c->done, &c->lock);
        pthread_mutex_unlock(&c->lock);
    }
    run->events += n;
}

void replay_feed(replay_run *run, const trace_event *events, size_t count) {
    while (count) {
        size_t n = count < FEED_EVENTS ? count : FEED_EVENTS;
        memcpy(run->scratch, events, n * sizeof *events);
        slots_resolve(&run->slots, run->scratch, n);
        feed_resolved(run, run->scratch, n);
        events += n;
        count -= n;
    }
}

size_t replay_finish(replay_run *run, replay_result **out_results) {
    for (size_t l = 0; l < run->lane_count; l++) {
        replay_lane *lane = &run->lanes[l];
        replay_counters c = {0};
        lane->factory->ops->counters(lane->impl, &c);
        if (lane->samples_capacity) lane_sample(lane, lane->last_event_ns);
        replay_result *r = &lane->result;
        r->end_reserved_bytes = c.reserved_bytes;
        r->peak_reserved_bytes = c.peak_reserved_bytes;
        r->device_calls = c.device_calls;
        r->device_allocs = c.device_allocs;
        r->hazards = c.hazards;
        r->lifo_violations = c.lifo_violations;
        r->oom_recoveries = c.oom_recoveries;
        if (lane->factory->ops->extra_json) lane->factory->ops->extra_json(lane->impl, r->extra, sizeof r->extra);
    }
    if (!run->results) run->results = calloc(run->lane_count, sizeof *run->results);
    for (size_t l = 0; l < run->lane_count && run->results; l++) run->results[l] = run->lanes[l].result;
    *out_results = run->results;
    return run->results ? run->lane_count : 0;
}

tp_pool *replay_tidepool_of(replay_run *run, size_t lane) {
    if (lane >= run->lane_count || run->lanes[lane].factory->ops != &tidepool_ops) return NULL;
    return ((tidepool_adapter *)run->lanes[lane].impl)->pool;
}

const char *replay_peak_snapshot(replay_run *run, size_t lane) {
    if (!replay_tidepool_of(run, lane)) return NULL;
    return ((tidepool_adapter *)run->lanes[lane].impl)->snapshot;
}

void replay_free(replay_run *run) {
    if (!run) return;
    crew_stop(run);
    for (size_t l = 0; l < run->lane_count; l++) {
        replay_lane *lane = &run->lanes[l];
        if (lane->impl) lane->factory->ops->destroy(lane->impl);
        for (size_t i = 0; i < lane->stream_count; i++) tp_stream_destroy(lane->device, lane->streams[i].stream);
        tpi_map_destroy(&lane->folded);
        if (lane->device) tp_device_close(lane->device);
        free(lane->blocks);
        free(lane->result.samples);
    }
    free(run->lanes);
    free(run->results);
    slots_destroy(&run->slots);
    free(run);
}

int replay_file(const char *path, const char *pool_names, const replay_options *options, replay_run **out_run,
                replay_file_timing *timing, char *err, size_t cap) {
    *out_run = NULL;
    replay_file_timing t = {0};
    uint64_t start = replay_now_ns();
    trace_open_options open_options = {.pt_device = options->pt_device, .block_bytes = options->block_bytes};
    trace_reader *reader = trace_open_with(path, &open_options, err, cap);
    if (!reader) return -1;
    t.open_ns = replay_now_ns() - start;
    replay_run *run = replay_begin(pool_names, options, err, cap);
    if (!run) {
        trace_close(reader);
        return -1;
    }
    /* Threads: one replays; with several pools, up to one per pool (lane
     * threads) while one or more are left to parse, the rest parse (at most
     * MAX_PARSE_WORKERS). A snapshot was parsed at open: all may replay. */
    unsigned threads = options->threads > 1 ? options->threads : 1;
    bool parsed_at_open = trace_get_format(reader) == TRACE_FORMAT_PYTORCH_PICKLE;
    unsigned lane_threads = 1;
    if (run->lane_count > 1 && threads > 1) {
        unsigned spare = parsed_at_open ? threads : threads - 1;
        lane_threads = run->lane_count < spare ? (unsigned)run->lane_count : spare;
    }
    unsigned workers = parsed_at_open || threads <= lane_threads ? 0 : threads - lane_threads;
    if (workers > MAX_PARSE_WORKERS) workers = MAX_PARSE_WORKERS;
    /* The parse workers in a process of their own (on the simulated
     * device), so that this one keeps no second thread while one pool
     * replays (trace.h says why); lane
     * threads start after the first read, once the worker process is
     * forked from a process with one thread. */
    trace_set_threads(reader, workers);
    /* Not beside a real GPU: its driver runs threads of its own already,
     * and a fork of a process that holds device mappings costs more than
     * it could save. */
    bool simulated = strncmp(run->options.device_spec, "sim", 3) == 0;
    trace_set_worker_process(reader, simulated);
    trace_set_batch_hook(reader, slots_resolve, &run->slots);
    bool first = true;
    for (;;) {
        const trace_event *events;
        uint64_t t0 = replay_now_ns();
        long n = trace_read_batch(reader, &events, err, cap);
        t.read_ns += replay_now_ns() - t0;
        if (n < 0) {
            trace_close(reader); /* first: its workers may be in the hook, on run->slots */
            replay_free(run);
            return -1;
        }
        if (first && lane_threads > 1) crew_start_threads(run, lane_threads - 1);
        first = false;
        if (n == 0) break;
        feed_resolved(run, events, (size_t)n); /* resolved by the hook */
        if (options->progress) {
            replay_progress p = {.events = run->events};
            trace_position(reader, &p.bytes_read, &p.bytes_total, &p.events_total);
            options->progress(options->progress_user, &p);
        }
    }
    uint64_t end = replay_now_ns();
    t.slot_ns = trace_hook_ns(reader);
    trace_close(reader);
    lane_threads = run->crew ? run->crew->helpers + 1 : 1;
    crew_stop(run);
    t.threads = lane_threads + workers;
    t.lane_threads = lane_threads;
    t.slots_on_workers = workers > 0;
    t.events = run->events;
    if (!t.slots_on_workers) t.read_ns = t.read_ns > t.slot_ns ? t.read_ns - t.slot_ns : 0; /* the hook ran in the reads */
    for (size_t l = 0; l < run->lane_count; l++) t.replay_ns += run->lanes[l].result.replay_ns;
    t.wall_ns = end - start;
    if (timing) *timing = t;
    *out_run = run;
    return 0;
}

double replay_ratio(const replay_result *r) {
    return r->peak_live_bytes ? (double)r->peak_reserved_bytes / (double)r->peak_live_bytes : 0.0;
}

void replay_result_json(const replay_result *r, FILE *out) {
    fprintf(out,
            "{\"pool\":\"%s\",\"device\":\"%s\",\"events\":%llu,\"allocs\":%llu,\"frees\":%llu,"
            "\"peak_live_bytes\":%llu,\"peak_reserved_bytes\":%llu,\"reserved_to_live_ratio\":%.4f,"
            "\"end_reserved_bytes\":%llu,\"device_calls\":%llu,\"device_allocs\":%llu,\"ooms\":%llu,"
            "\"errors\":%llu,\"unknown_frees\":%llu,\"duplicate_allocs\":%llu,\"folded_streams\":%llu,\"hazards\":%llu,\"lifo_violations\":%llu,"
            "\"oom_recoveries\":%llu,\"fatal\":%s,\"ns_per_event\":%.1f",
            r->pool, r->device, (unsigned long long)r->events, (unsigned long long)r->allocs,
            (unsigned long long)r->frees, (unsigned long long)r->peak_live_bytes,
            (unsigned long long)r->peak_reserved_bytes, replay_ratio(r), (unsigned long long)r->end_reserved_bytes,
            (unsigned long long)r->device_calls, (unsigned long long)r->device_allocs, (unsigned long long)r->ooms,
            (unsigned long long)r->errors, (unsigned long long)r->unknown_frees,
            (unsigned long long)r->duplicate_allocs, (unsigned long long)r->folded_streams,
            (unsigned long long)r->hazards,
            (unsigned long long)r->lifo_violations, (unsigned long long)r->oom_recoveries, r->fatal ? "true" : "false",
            r->events ? (double)r->replay_ns / (double)r->events : 0.0);
    if (r->ooms) fprintf(out, ",\"first_oom_event\":%llu", (unsigned long long)r->first_oom_event);
    if (r->first_recovery_event)
        fprintf(out, ",\"first_recovery_event\":%llu", (unsigned long long)r->first_recovery_event);
    if (r->fatal) fprintf(out, ",\"fatal_event\":%llu", (unsigned long long)r->fatal_event);
    if (r->extra[0]) fprintf(out, ",%s", r->extra);
    fputc('}', out);
}
