/* SPDX-License-Identifier: MIT */
/*
 * tidepool_ggml.h -- tidepool behind ggml-cuda's pool interface (C++17).
 *
 * ggml-cuda asks its per-context, per-device, per-stream pools for
 * temporaries through two virtual methods, alloc(size, &actual_size) and
 * free(ptr, size), with no error return. This header declares an interface
 * of that shape (tp_ggml_pool_interface, ours: no ggml code is used or
 * shipped) and an implementation on tidepool, plus a helper for ggml's
 * graph-capture path. README.md says how a llama.cpp build wires it in.
 *
 * One tidepool device, one pool and one bounded graph cache per GPU ordinal,
 * shared by every adapter and graph context in the process (created on first
 * use, destroyed when the last user goes). Each adapter is bound to one
 * (device, stream) and passes its stream on every call, so tidepool orders
 * reuse by stream: memory freed by one context is handed to another only
 * once the freeing stream's queued work is done.
 *
 * Thread safety: every function and method may be called from several
 * threads at once, except that one object must not be destroyed while
 * another thread uses it. Streams must stay valid until every adapter and
 * graph context using them is destroyed.
 *
 * Configuration: TIDEPOOL_GGML_CONF (read at first use) or configure();
 * keys in README.md. Messages go to the log sink (stderr by default).
 */
#ifndef TIDEPOOL_GGML_H
#define TIDEPOOL_GGML_H

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>

#include "tidepool.h"

/* The shape of ggml-cuda's pool interface: alloc returns device memory for
 * at least size bytes and stores in *actual_size what the caller must pass
 * back to free; free(ptr, size) means "the last use of ptr is queued on the
 * pool's stream". No error return: NULL means out of memory. */
struct tp_ggml_pool_interface {
    virtual ~tp_ggml_pool_interface() = default;
    virtual void *alloc(size_t size, size_t *actual_size) = 0;
    virtual void free(void *ptr, size_t size) = 0;
};

namespace tp_ggml {

namespace detail {
struct entry; /* one device ordinal's shared device, pool and graph cache */
}

/* ------------------------------------------------------------ configuration */

/* Where the adapter's messages go, and tidepool's (hazards, driver errors,
 * out-of-memory reports): device is the ordinal, or -1 for messages about
 * the configuration. Called with tidepool's internal locks held: the sink
 * must not call back into tidepool or this adapter. NULL restores the
 * default, one line on stderr: "tidepool-ggml[cuda:0] error: ...". */
using log_fn = void (*)(void *user, int device, tp_log_level level, const char *message);
void set_log_sink(log_fn fn, void *user);

/* Replaces the configuration (and whatever TIDEPOOL_GGML_CONF said) with
 * text, same syntax. Refused while any device is open (a pool's settings
 * cannot change under it). Returns false and the reason in *error (which
 * names the offending key) if text does not parse; the configuration is then
 * unchanged. */
bool configure(const char *text, std::string *error);
/* The configuration in effect, every key spelled out. */
std::string config_string();

/* ------------------------------------------------------------------ the pool */

/* alloc/free of one (device, stream) on the device's shared pool. Not a
 * pool interface itself: pool_for<Base> wraps it in one. */
class binding {
public:
    /* device: the GPU ordinal (on the simulated device, see device= in
     * README.md); stream: the CUstream / cudaStream_t the caller's kernels
     * run on, cast to tp_stream. A device that cannot be opened is logged
     * and every alloc then returns NULL. */
    binding(int device, tp_stream stream);
    /* Forgets the stream (tp_pool_forget_stream: waits for its queued work)
     * once no other binding on this device uses it, and drops the device
     * reference. */
    ~binding();
    binding(const binding &) = delete;
    binding &operator=(const binding &) = delete;

    /* At least size bytes (size 0: a valid 1-byte block), ordered on the
     * stream. *actual_size = size: the bytes the caller may use (tidepool
     * rounds the block up to its alignment internally; free does not need
     * the size). Out of memory: logs tidepool's out-of-memory report at
     * ERROR, then with oom=abort (the default) writes one line to stderr
     * and aborts (ggml's callers do not check the pointer); with oom=null
     * returns NULL with *actual_size = 0. */
    void *alloc(size_t size, size_t *actual_size);
    /* Frees once the work queued on the stream so far is done. NULL: no-op.
     * A pointer the pool does not own is logged at ERROR. */
    void free(void *ptr, size_t size);

    bool ok() const { return entry_ != nullptr; }
    int device() const { return device_; }
    tp_stream stream() const { return stream_; }
    tp_pool *tidepool_pool() const; /* NULL if !ok() */

private:
    detail::entry *entry_;
    int device_;
    tp_stream stream_;
};

/* The pool: a Base with ggml's two virtual methods, implemented on tidepool.
 * pool_for<tp_ggml_pool_interface> (alias tp_ggml::pool) stands alone; a
 * ggml build can instantiate pool_for<ggml_cuda_pool> so that the object
 * IS a ggml_cuda_pool (Base's two methods must be virtual). */
template <class Base>
class pool_for final : public Base {
public:
    pool_for(int device, tp_stream stream) : binding_(device, stream) {}
    void *alloc(size_t size, size_t *actual_size) override { return binding_.alloc(size, actual_size); }
    void free(void *ptr, size_t size) override { binding_.free(ptr, size); }
    const tp_ggml::binding &get_binding() const { return binding_; }

private:
    tp_ggml::binding binding_;
};

using pool = pool_for<tp_ggml_pool_interface>;

/* ----------------------------------------------------------------- graphs */

/* The graph side of one ggml backend context on one device: its keys in the
 * device's shared graph cache. ggml's key (the address of a graph's first
 * node) is reused across contexts and over time, so each key is mapped to a
 * cache key unique in the process: the context id (24 bits, never that of
 * another live context; reused only after its context is destroyed) above
 * a per-context generation (40 bits), a new generation each time ggml's key
 * is first seen or seen again after drop(). With all 2^24 ids live, a new
 * context is logged at ERROR and not ok(). */
class graph_context {
public:
    explicit graph_context(int device);
    /* Aborts a capture this context began and did not end (logged at WARN),
     * evicts every executable of this context, then drops the device
     * reference. */
    ~graph_context();
    graph_context(const graph_context &) = delete;
    graph_context &operator=(const graph_context &) = delete;

    bool ok() const { return entry_ != nullptr; }
    uint32_t id() const { return id_; }

    /* Right before the stream starts capturing (cudaStreamBeginCapture):
     * temporaries allocated on the stream from now on are recorded as the
     * graph's footprint, and the pool stays off the stream's events (told
     * after the capture began, another context's pool call could record
     * an event inside it and invalidate it: tp_pool_capture_begin). */
    tp_status capture_begin(tp_stream stream);
    /* Right after the capture ends with graph (cudaStreamEndCapture; a
     * cudaGraph_t cast to tp_graph): the footprint is pinned for the
     * executable (tp_pool_capture_end) and key's executable made to match
     * graph (tp_graph_cache_prepare: updated in place or instantiated, within
     * the cache's bounds). TP_OK: launch(key) runs it. TP_ERR_RUN_EAGER: no
     * executable (out of memory, or over graph_cache_bytes on its own): run
     * this evaluation eagerly. graph NULL (the capture failed): same as
     * capture_abort, returns TP_ERR_CAPTURE. The caller keeps graph. */
    tp_status capture_end(tp_stream stream, const void *key, tp_graph graph);
    /* Ends the pool's side of a capture that produced no graph. */
    void capture_abort(tp_stream stream);
    /* TP_OK: key's executable is launched on stream. TP_ERR_RUN_EAGER: key
     * has no executable (never prepared, dropped, or evicted by the bounds,
     * idleness or memory pressure): run eagerly, and capture again next
     * time. Other statuses: the launch failed. */
    tp_status launch(const void *key, tp_stream stream);
    /* ggml no longer uses key (its map erased the entry): evict the
     * executable (its pins go once its last launch is done). */
    void drop(const void *key);

    /* The cache key currently behind key (0: none), and how many keys the
     * context has; for tests and logs. */
    uint64_t cache_key(const void *key) const;
    size_t key_count() const;
    tp_graph_cache *tidepool_graph_cache() const; /* NULL if !ok() */

private:
    uint64_t key_for(const void *key); /* assigns one if new */
    void forget_capture(tp_stream stream);
    void end_capture(tp_stream stream); /* the pool's side of capture_abort */

    detail::entry *entry_;
    int device_;
    uint32_t id_;
    mutable std::mutex mu_;
    uint64_t next_generation_ = 1;
    std::unordered_map<const void *, uint64_t> keys_;
};

/* ------------------------------------------------------------ device access */

/* Keeps device's shared device, pool and graph cache open (a reference like
 * an adapter's); for hosts that want the handles (stats, trim, and on the
 * simulated device its streams and tp_sim_* calls). */
class device_ref {
public:
    explicit device_ref(int device);
    ~device_ref();
    device_ref(const device_ref &) = delete;
    device_ref &operator=(const device_ref &) = delete;

    bool ok() const { return entry_ != nullptr; }
    tp_device *device() const;
    tp_pool *pool() const;
    tp_graph_cache *graph_cache() const;
    const char *spec() const; /* "cuda:0", "sim:24GiB", ... */

private:
    detail::entry *entry_;
};

/* {"device":N,"spec":"...","users":N,"config":"...","pool":{tp_pool_stats_json},
 * "graph_cache":{tp_graph_cache_stats_json}} for an open device, "null"
 * otherwise. */
std::string stats_json(int device);

} // namespace tp_ggml

#endif /* TIDEPOOL_GGML_H */
