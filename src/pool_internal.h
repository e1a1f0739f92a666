/*
 * pool_internal.h -- the pool object shared by pool.c (API, stream order,
 * caches, statistics, out-of-memory ladder) and its two backings:
 * pool_vmm.c (one address reservation, pages mapped on demand) and
 * pool_segment.c (plain device allocations).
 *
 * Vocabulary
 *   block  a range handed to a caller (a used node of the range allocator).
 *   unit   a piece of device memory that can be given back on its own: a
 *          physical page (VMM; unit index = page index) or a segment.
 *          A unit with no live block in it is idle; idle units sit in an
 *          LRU list, oldest first, and are what release gives back.
 *   slot   the pool's index for a stream it has seen (0 means "no stream").
 *   tag    who may still be using a free range or an idle unit: a slot and
 *          the number of that stream's event that covers the work, or MULTI
 *          (safe after the next full synchronisation).
 */
#ifndef TIDEPOOL_POOL_INTERNAL_H
#define TIDEPOOL_POOL_INTERNAL_H

#include "range_alloc.h"

#define POOL_NONE UINT32_MAX
#define POOL_TCACHE_DEPTH 4
#define POOL_TCACHE_MAX_BLOCK (64 * TP_MiB)
#define POOL_TCACHE_MAX_BLOCK_VMM (64 * TP_KiB)
/* Every this many frees the pool looks at the clock (upkeep in pool.c). */
#define POOL_UPKEEP_FREES 256

/* Node flags (tp_ra_node.flags). */
#define NODE_CACHED 0x1u      /* freed by the caller, parked in the tcache */
#define NODE_FREED_PINNED 0x2u /* freed by the caller but kept by pins */
#define NODE_CAPTURED 0x4u    /* allocated during a capture */

typedef struct pool_stream {
    tp_stream handle;
    uint64_t next_epoch;      /* number the next event recorded here gets */
    uint64_t completed_epoch; /* every event up to this one has completed */
    uint64_t last_free_epoch; /* tag epoch of the latest free on this stream */
    /* events recorded and not yet seen complete, oldest first (a ring) */
    tp_event *ring_events;
    uint64_t *ring_epochs;
    uint32_t ring_head, ring_count, ring_capacity;
    bool retired; /* forgotten by tp_pool_forget_stream; never matched again */
    /* capture */
    bool capturing;
    tp_range *captured;
    size_t captured_count, captured_capacity;
} pool_stream;

enum { UNIT_UNUSED = 0, UNIT_BUSY = 1, UNIT_IDLE = 2 };

typedef struct pool_unit {
    uint64_t base;
    uint64_t bytes;
    uint64_t live;         /* VMM: live blocks touching the page; segment: used nodes */
    tp_tag tag;            /* merged tags of every free inside the unit */
    uint64_t idle_since_ns;
    uint64_t last_big_use_ns; /* segment: last hand-out of >= 1/4 of it */
    uint32_t lru_prev, lru_next;
    uint32_t idle_node;    /* segment: the free node spanning it while idle */
    uint8_t state;
} pool_unit;

typedef struct pool_reclaimer {
    tp_reclaim_fn fn;
    void *user;
} pool_reclaimer;

/* Pointer -> node map: open addressing, linear probing, backward-shift
 * deletion. Keys are block start addresses. */
typedef struct pool_map {
    uint64_t *keys;
    uint32_t *values;
    size_t capacity; /* power of two, 0 when empty */
    size_t count;
} pool_map;

typedef struct pool_backend pool_backend;

struct tp_pool {
    tp_device *device;
    const tp_device_ops *ops;
    const tp_host *host;
    const pool_backend *backend;
    tp_pool_config config; /* with defaults filled in */
    pthread_mutex_t lock;

    tp_ra ra;
    pool_map blocks; /* live, cached and pinned-freed blocks */

    /* tcache: per-bin LIFO of blocks freed and parked without coalescing */
    uint32_t (*tcache)[POOL_TCACHE_DEPTH];
    uint8_t *tcache_count;
    uint64_t tcache_bytes;
    uint64_t tcache_limit_bytes;
    uint64_t tcache_max_block_bytes;
    /* The last freed block too large for the tcache, parked until the next
     * allocation: reused if that allocation fits it, released (coalesced)
     * before anything else otherwise. RA_NONE when empty. */
    uint32_t last_freed;
    uint64_t last_freed_ns;  /* when it was freed */
    uint64_t idle_stamp_ns;  /* nonzero: the idle-since time for units going idle now */
    uint64_t calls_at_tick;  /* allocs + frees at the previous tp_pool_tick */

    pool_stream *streams; /* index = slot; slot 0 unused */
    size_t stream_count, stream_capacity;
    tp_stream last_stream;
    uint32_t last_slot;
    uint64_t full_sync_generation;
    tp_event *spare_events;
    size_t spare_count, spare_capacity;

    pool_unit *units;
    size_t unit_count, unit_capacity;
    uint32_t unused_units;
    uint32_t lru_head, lru_tail; /* idle units, oldest at head */
    uint64_t idle_bytes;         /* bytes of idle units */
    uint64_t next_aged_check_ns;
    uint32_t frees_since_upkeep;
    uint64_t last_upkeep_ns;

    /* VMM backing: units[] has one entry per page of the reservation */
    uint64_t va_base, va_bytes, page_bytes;
    uint32_t page_shift;
    uint64_t page_high; /* pages at or above this were never mapped */

    pool_reclaimer *reclaimers;
    size_t reclaimer_count, reclaimer_capacity;
    uint32_t reclaims_in_flight;   /* reclaim rounds running without the lock */
    pthread_cond_t reclaims_done;  /* signalled when one ends */

    uint64_t zombie_bytes; /* freed-but-pinned */
    uint64_t high_water_allocated; /* highest allocated bytes ever (not reset) */
    uint32_t growth_streak; /* VMM: growths since the last free */
    uint64_t low_water_allocated; /* VMM: lowest allocated bytes since the last growth */
    uint64_t capturing_streams;
    tp_pool_stats stats;
    bool has_oom_report;
    tp_oom_report oom_report;
    tp_status last_device_status;
};

struct pool_backend {
    const char *name;
    tp_status (*init)(tp_pool *pool);
    void (*destroy)(tp_pool *pool);
    /* Finds or makes room for size bytes usable on stream; on success the
     * block's node is taken (used). TP_ERR_OUT_OF_MEMORY sets *out_need_bytes
     * to the device memory it could not get. */
    tp_status (*try_alloc)(tp_pool *pool, uint64_t size, uint32_t slot, uint32_t *out_node,
                           uint64_t *out_need_bytes);
    /* After [offset, +size) was given back to the range allocator as
     * free_node, with tag. */
    void (*after_release)(tp_pool *pool, uint64_t offset, uint64_t size, uint32_t free_node, tp_tag tag);
    /* Gives an idle unit back to the device. A backing may take idle,
     * completed neighbours along in the same call, but only ones idle since
     * at most idle_before_ns, and at most max_bytes in all. */
    tp_status (*release_unit)(tp_pool *pool, uint32_t unit, uint64_t idle_before_ns, uint64_t max_bytes);
    /* Backing-specific invariants. */
    bool (*check)(tp_pool *pool, char *msg, size_t capacity);
    /* Free bytes inside reserved memory and the largest such range. */
    void (*free_figures)(tp_pool *pool, uint64_t *out_free, uint64_t *out_largest, uint64_t *out_ranges);
};

extern const pool_backend tp_vmm_backend;
extern const pool_backend tp_segment_backend;

/* ---- services pool.c offers the backings ---- */

/* Finds a free range of size usable on slot (same stream, completed, or
 * made safe by a stream wait), searching good-fit order; filter (optional)
 * further restricts candidates. Returns the node or RA_NONE. */
uint32_t tp_pool_find_usable(tp_pool *pool, uint64_t size, uint32_t slot, tp_ra_accept_fn filter, void *filter_ctx);
/* Non-blocking: true when work covered by tag is known complete (may
 * record an event). */
bool tp_pool_tag_complete(tp_pool *pool, tp_tag tag);
/* Non-blocking: may memory with *tag be handed out on slot? Clears *tag
 * when the work it names is seen complete. */
bool tp_pool_tag_usable(tp_pool *pool, tp_tag *tag, uint32_t slot);
/* Makes slot's stream wait (on the device) for the event covering tag, a
 * single-stream tag. */
tp_status tp_pool_order_after(tp_pool *pool, uint32_t slot, tp_tag tag);

uint32_t tp_pool_unit_new(tp_pool *pool);
void tp_pool_unit_recycle(tp_pool *pool, uint32_t unit);
/* Idle bookkeeping: a unit whose last block went away / came back. */
void tp_pool_unit_became_idle(tp_pool *pool, uint32_t unit);
void tp_pool_unit_became_busy(tp_pool *pool, uint32_t unit);
/* The idle list itself (oldest at the head). */
void tp_pool_lru_unlink(tp_pool *pool, uint32_t unit);
void tp_pool_lru_append(tp_pool *pool, uint32_t unit, uint64_t now_ns);
/* Before growing by grow_bytes: release completed idle units, oldest first,
 * while idle + grow_bytes exceeds the release threshold. */
void tp_pool_release_before_growth(tp_pool *pool, uint64_t grow_bytes);
/* Releases completed idle units idle for at least min_idle_ns, oldest
 * first, until reserved bytes are at most target (non-blocking). */
void tp_pool_release_idle_down_to(tp_pool *pool, uint64_t target_reserved_bytes, uint64_t min_idle_ns);
/* Records a device call's outcome in the stats. */
void tp_pool_count_device_call(tp_pool *pool, tp_status status, int kind);
enum { DEVICE_CALL_ALLOC = 1, DEVICE_CALL_FREE = 2, DEVICE_CALL_OTHER = 3 };
void tp_pool_reserved_changed(tp_pool *pool, int64_t delta_bytes);
uint64_t tp_pool_now(tp_pool *pool);
/* Gives a used block back to the range allocator with tag (and tells the
 * backing). */
void tp_pool_release_block(tp_pool *pool, uint32_t node, tp_tag tag);
/* Gives every parked (tcache) block back; returns the bytes. */
uint64_t tp_pool_tcache_flush(tp_pool *pool);

#endif /* TIDEPOOL_POOL_INTERNAL_H */
