/* SPDX-License-Identifier: MIT */
/*
 * tidepool_ggml.cpp -- the adapter behind tidepool_ggml.h.
 *
 * Registry: one process-wide table (ordinal -> entry) under one mutex. An
 * entry holds the shared tp_device, tp_pool and tp_graph_cache of one GPU
 * ordinal and a count of its users (bindings, graph contexts, device_refs).
 * The first user opens the device, creates the pool and the cache (with its
 * background thread) and attaches the cache to the pool as a reclaim
 * callback; the last one destroys them in the reverse order. Users hold the
 * entry pointer, which stays valid while they hold it, and call the pool and
 * the cache directly: both are thread-safe (tidepool.h), so the registry
 * mutex is taken only when users come and go and for stats.
 *
 * Streams: each entry counts the bindings per stream (under the entry's own
 * mutex); when the last binding of a stream goes, the pool forgets it
 * (tp_pool_forget_stream, which waits for the stream's queued work) with the
 * entry mutex held, so a binding created on the same stream at that moment
 * waits for the forget to finish. Each entry also records which graph
 * context began the capture on a stream (under a mutex of its own), so that
 * a context destroyed mid-capture ends it rather than leave the pool
 * capturing.
 *
 * The registry and the log sink are leaked on purpose: a host may destroy
 * adapters from its own static destructors, after ours would have run.
 */
#include "tidepool_ggml.h"

#include <atomic>
#include <cctype>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <vector>

namespace tp_ggml {

namespace {

constexpr int kLogOff = 4;
constexpr const char *kEnvName = "TIDEPOOL_GGML_CONF";

struct config {
    tp_pool_kind kind = TP_POOL_AUTO;
    uint64_t limit_bytes = 0;             /* 0: the device's capacity */
    uint64_t release_threshold_bytes = 0; /* 0: tidepool's default */
    uint64_t idle_release_ns = 0;         /* 0: tidepool's default (10 s) */
    uint64_t graph_cache_bytes = 0;       /* 0: 256 MiB */
    uint32_t graph_cache_execs = 0;       /* 0: 64 */
    uint64_t graph_idle_ns = 0;           /* 0: 10 s */
    int log_level = TP_LOG_WARN;          /* or kLogOff */
    std::string device = "cuda";          /* "cuda", or a sim spec */
    bool check = false;                   /* pool invariants after every op */
    bool oom_abort = true;                /* a failed alloc aborts (as ggml's own pools), or returns NULL */
};

const char *level_name(int level) {
    return level == kLogOff ? "off" : tp_log_level_name(static_cast<tp_log_level>(level));
}

const char *kind_name(tp_pool_kind kind) {
    return kind == TP_POOL_VMM ? "vmm" : kind == TP_POOL_SEGMENT ? "segment" : "auto";
}

/* ------------------------------------------------------------------ logging */

struct sink_state {
    std::mutex mu;
    log_fn fn = nullptr;
    void *user = nullptr;
    std::atomic<int> level{TP_LOG_WARN}; /* the configured level */
};

sink_state &sink() {
    static sink_state *s = new sink_state;
    return *s;
}

void emit(int device, tp_log_level level, const char *message) {
    sink_state &s = sink();
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.fn) {
        s.fn(s.user, device, level, message);
    } else if (device >= 0) {
        std::fprintf(stderr, "tidepool-ggml[%d] %s: %s\n", device, level_name(level), message);
    } else {
        std::fprintf(stderr, "tidepool-ggml %s: %s\n", level_name(level), message);
    }
}

#if defined(__GNUC__) || defined(__clang__)
__attribute__((format(printf, 3, 4)))
#endif
void log_msg(int device, tp_log_level level, const char *fmt, ...) {
    if ((int)level < sink().level.load(std::memory_order_relaxed)) return;
    char buf[768];
    va_list ap;
    va_start(ap, fmt);
    std::vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    emit(device, level, buf);
}

/* ------------------------------------------------------------------ parsing */

std::string trim(const std::string &s) {
    size_t b = 0, e = s.size();
    while (b < e && std::isspace((unsigned char)s[b])) b++;
    while (e > b && std::isspace((unsigned char)s[e - 1])) e--;
    return s.substr(b, e - b);
}

bool parse_uint(const std::string &text, uint64_t max, uint64_t *out) {
    if (text.empty()) return false;
    uint64_t v = 0;
    for (char ch : text) {
        if (ch < '0' || ch > '9') return false;
        uint64_t d = (uint64_t)(ch - '0');
        if (v > (max - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* A size as tp_parse_bytes reads it, without spaces or a sign, and without
 * fractions of a byte: "0.5" or "1.5B" would be rounded to 1 or 2 bytes
 * (a unit forgotten, most likely), so they are refused, as the PyTorch
 * shim does. */
bool parse_size(const std::string &text, uint64_t *out) {
    if (text.empty() || !std::isdigit((unsigned char)text[0])) return false;
    for (char ch : text)
        if (!std::isalnum((unsigned char)ch) && ch != '.') return false;
    size_t unit = text.find_first_not_of("0123456789.");
    std::string number = text.substr(0, unit), suffix = unit == std::string::npos ? "" : text.substr(unit);
    size_t dot = number.find('.');
    bool fraction = dot != std::string::npos && number.find_first_not_of('0', dot + 1) != std::string::npos;
    if (fraction && (suffix.empty() || suffix == "B" || suffix == "b")) return false;
    return tp_parse_bytes(text.c_str(), out);
}

bool parse_ms(const std::string &text, uint64_t *out_ns) {
    if (text == "never") {
        *out_ns = TP_NS_NEVER;
        return true;
    }
    uint64_t ms;
    if (!parse_uint(text, UINT64_MAX / 1000000u - 1, &ms)) return false;
    *out_ns = ms ? ms * 1000000u : 1; /* tidepool's 0 means the default */
    return true;
}

const char *const kKeys = "kind, limit, release_threshold, idle_release_ms, graph_cache_bytes, graph_cache_execs, "
                          "graph_idle_ms, log, device, check, oom";

bool parse_item(config &c, const std::string &key, const std::string &value, std::string &err) {
    auto bad = [&](const std::string &why) {
        err = key + "=" + value + ": " + why;
        return false;
    };
    if (value.empty()) return bad("no value");
    if (key == "kind") {
        if (value == "vmm") c.kind = TP_POOL_VMM;
        else if (value == "segment") c.kind = TP_POOL_SEGMENT;
        else if (value == "auto") c.kind = TP_POOL_AUTO;
        else return bad("expected vmm, segment or auto");
    } else if (key == "limit") {
        if (!parse_size(value, &c.limit_bytes) || !c.limit_bytes) return bad("expected a size such as 20GiB");
    } else if (key == "release_threshold") {
        if (value == "unlimited") c.release_threshold_bytes = TP_BYTES_UNLIMITED;
        else if (!parse_size(value, &c.release_threshold_bytes)) return bad("expected a size or 'unlimited'");
        else if (!c.release_threshold_bytes) c.release_threshold_bytes = 1; /* tidepool's 0 means default */
    } else if (key == "idle_release_ms") {
        if (!parse_ms(value, &c.idle_release_ns)) return bad("expected milliseconds or 'never'");
    } else if (key == "graph_cache_bytes") {
        if (value == "unlimited") c.graph_cache_bytes = TP_BYTES_UNLIMITED;
        else if (!parse_size(value, &c.graph_cache_bytes) || !c.graph_cache_bytes)
            return bad("expected a size such as 256MiB, or 'unlimited'");
    } else if (key == "graph_cache_execs") {
        uint64_t n;
        if (!parse_uint(value, UINT32_MAX, &n) || !n) return bad("expected a count >= 1");
        c.graph_cache_execs = (uint32_t)n;
    } else if (key == "graph_idle_ms") {
        if (!parse_ms(value, &c.graph_idle_ns)) return bad("expected milliseconds or 'never'");
    } else if (key == "log") {
        if (value == "debug") c.log_level = TP_LOG_DEBUG;
        else if (value == "info") c.log_level = TP_LOG_INFO;
        else if (value == "warn") c.log_level = TP_LOG_WARN;
        else if (value == "error") c.log_level = TP_LOG_ERROR;
        else if (value == "off") c.log_level = kLogOff;
        else return bad("expected debug, info, warn, error or off");
    } else if (key == "device") {
        /* cuda, or the simulated device: sim, sim:SIZE, options after '+'
         * (sim:8GiB+novmm+graph_node_bytes=1MiB), for tests. */
        if (value == "cuda") {
            c.device = value;
        } else if (value.compare(0, 3, "sim") == 0 && (value.size() == 3 || value[3] == ':' || value[3] == '+')) {
            std::string spec = value;
            for (char &ch : spec)
                if (ch == '+') ch = ',';
            tp_device *probe = nullptr;
            tp_status st = tp_device_open(spec.c_str(), nullptr, &probe);
            if (st != TP_OK) return bad(std::string("the simulated device does not accept it (") + tp_status_name(st) + ")");
            tp_device_close(probe);
            c.device = spec;
        } else {
            return bad("expected cuda, sim, sim:SIZE or sim:SIZE+OPTION...");
        }
    } else if (key == "oom") {
        if (value == "abort") c.oom_abort = true;
        else if (value == "null") c.oom_abort = false;
        else return bad("expected abort or null");
    } else if (key == "check") {
        if (value == "1" || value == "on") c.check = true;
        else if (value == "0" || value == "off") c.check = false;
        else return bad("expected 0 or 1");
    } else {
        err = "unknown key '" + key + "' (known: " + kKeys + ")";
        return false;
    }
    return true;
}

bool parse_config(const char *text, config &out, std::string &err) {
    out = config();
    if (!text) return true;
    std::string all = trim(text);
    if (all.empty()) return true;
    std::set<std::string> seen;
    size_t start = 0;
    for (;;) {
        size_t comma = all.find(',', start);
        std::string item = trim(all.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
        if (item.empty()) {
            err = "empty item";
            return false;
        }
        size_t eq = item.find('=');
        if (eq == std::string::npos) {
            err = "'" + item + "' is not key=value";
            return false;
        }
        std::string key = trim(item.substr(0, eq)), value = trim(item.substr(eq + 1));
        if (!seen.insert(key).second) {
            err = "'" + key + "' given twice";
            return false;
        }
        if (!parse_item(out, key, value, err)) return false;
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return true;
}

std::string bytes_text(uint64_t bytes) {
    if (bytes == TP_BYTES_UNLIMITED) return "unlimited";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%" PRIu64, bytes);
    return buf;
}

std::string ms_text(uint64_t ns) {
    if (ns == TP_NS_NEVER) return "never";
    char buf[32];
    std::snprintf(buf, sizeof buf, "%" PRIu64, ns / 1000000u);
    return buf;
}

std::string format_config(const config &c) {
    std::string spec = c.device;
    for (char &ch : spec)
        if (ch == ',') ch = '+';
    std::string s = std::string("kind=") + kind_name(c.kind);
    s += ",limit=" + (c.limit_bytes ? bytes_text(c.limit_bytes) : std::string("device"));
    s += ",release_threshold=" + (c.release_threshold_bytes ? bytes_text(c.release_threshold_bytes) : "default");
    s += ",idle_release_ms=" + (c.idle_release_ns ? ms_text(c.idle_release_ns) : "default");
    s += ",graph_cache_bytes=" + (c.graph_cache_bytes ? bytes_text(c.graph_cache_bytes) : "default");
    s += ",graph_cache_execs=" + (c.graph_cache_execs ? std::to_string(c.graph_cache_execs) : "default");
    s += ",graph_idle_ms=" + (c.graph_idle_ns ? ms_text(c.graph_idle_ns) : "default");
    s += std::string(",log=") + level_name(c.log_level);
    s += ",device=" + spec;
    s += std::string(",check=") + (c.check ? "1" : "0");
    s += std::string(",oom=") + (c.oom_abort ? "abort" : "null");
    return s;
}

void json_string(std::string &out, const std::string &s) {
    out += '"';
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\') {
            out += '\\';
            out += (char)ch;
        } else if (ch < 0x20 || ch >= 0x7f) {
            char buf[8];
            std::snprintf(buf, sizeof buf, "\\u%04x", ch);
            out += buf;
        } else {
            out += (char)ch;
        }
    }
    out += '"';
}

} // namespace

/* ----------------------------------------------------------------- registry */

namespace detail {

struct entry {
    int ordinal = 0;
    std::string spec;
    tp_device *dev = nullptr;
    tp_pool *pool = nullptr;
    tp_graph_cache *cache = nullptr;
    int users = 0; /* under the registry mutex */
    bool oom_abort = true; /* oom= when the entry was opened */
    std::mutex mu; /* streams */
    std::unordered_map<tp_stream, int> streams;
    /* Streams in a pool capture begun through a graph_context: stream -> the
     * id of that context, which ends the capture if it is destroyed first.
     * Its own mutex: mu is held while a stream's queued work drains. */
    std::mutex capture_mu;
    std::unordered_map<tp_stream, uint32_t> captures;
};

} // namespace detail

namespace {

struct registry {
    std::mutex mu;
    bool configured = false;
    config cfg;
    std::map<int, detail::entry *> entries;
};

registry &reg() {
    static registry *r = new registry;
    return *r;
}

/* With the registry mutex held. */
void load_config_locked(registry &r) {
    if (r.configured) return;
    r.configured = true;
    const char *text = std::getenv(kEnvName);
    std::string err;
    if (!parse_config(text, r.cfg, err)) {
        r.cfg = config();
        sink().level.store(r.cfg.log_level, std::memory_order_relaxed);
        log_msg(-1, TP_LOG_ERROR, "%s=\"%s\": %s; using the defaults", kEnvName, text, err.c_str());
    }
    sink().level.store(r.cfg.log_level, std::memory_order_relaxed);
}

void device_log(void *user, tp_log_level level, const char *message) {
    emit(static_cast<detail::entry *>(user)->ordinal, level, message);
}

void destroy_entry(detail::entry *e) {
    if (e->cache) {
        tp_status st = tp_graph_cache_destroy(e->cache);
        if (st != TP_OK) log_msg(e->ordinal, TP_LOG_ERROR, "tp_graph_cache_destroy: %s", tp_status_name(st));
    }
    if (e->pool) {
        tp_status st = tp_pool_destroy(e->pool);
        if (st != TP_OK) log_msg(e->ordinal, TP_LOG_ERROR, "tp_pool_destroy: %s", tp_status_name(st));
    }
    if (e->dev) {
        tp_status st = tp_device_close(e->dev);
        if (st != TP_OK) log_msg(e->ordinal, TP_LOG_ERROR, "tp_device_close: %s", tp_status_name(st));
    }
    delete e;
}

detail::entry *acquire(int ordinal) {
    if (ordinal < 0) {
        log_msg(-1, TP_LOG_ERROR, "device %d: not a device ordinal", ordinal);
        return nullptr;
    }
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.mu);
    load_config_locked(r);
    auto it = r.entries.find(ordinal);
    if (it != r.entries.end()) {
        it->second->users++;
        return it->second;
    }
    const config &c = r.cfg;
    auto *e = new detail::entry;
    e->ordinal = ordinal;
    e->oom_abort = c.oom_abort;
    e->spec = c.device == "cuda" ? "cuda:" + std::to_string(ordinal) : c.device;
    tp_device_config dc{};
    if (c.log_level != kLogOff) {
        dc.log = device_log;
        dc.log_user = e;
        dc.log_level = (tp_log_level)c.log_level;
    }
    tp_status st = tp_device_open(e->spec.c_str(), &dc, &e->dev);
    const char *what = "tp_device_open";
    if (st == TP_OK) {
        tp_pool_config pc{};
        pc.kind = c.kind;
        pc.limit_bytes = c.limit_bytes;
        pc.release_threshold_bytes = c.release_threshold_bytes;
        pc.idle_release_ns = c.idle_release_ns;
        if (c.check) pc.flags |= TP_POOL_FLAG_CHECK_INVARIANTS;
        st = tp_pool_create(e->dev, &pc, &e->pool);
        what = "tp_pool_create";
    }
    if (st == TP_OK) {
        tp_graph_cache_config gc{};
        gc.max_execs = c.graph_cache_execs;
        gc.max_bytes = c.graph_cache_bytes;
        gc.idle_evict_ns = c.graph_idle_ns;
        gc.background_thread = true;
        st = tp_graph_cache_create(e->dev, &gc, &e->cache);
        what = "tp_graph_cache_create";
    }
    if (st == TP_OK) {
        st = tp_graph_cache_attach_pool(e->cache, e->pool);
        what = "tp_graph_cache_attach_pool";
    }
    if (st != TP_OK) {
        log_msg(ordinal, TP_LOG_ERROR, "%s(\"%s\"): %s; allocations on this device will return NULL", what,
             e->spec.c_str(), tp_status_name(st));
        destroy_entry(e);
        return nullptr;
    }
    log_msg(ordinal, TP_LOG_INFO, "opened %s with %s", e->spec.c_str(), format_config(c).c_str());
    e->users = 1;
    r.entries[ordinal] = e;
    return e;
}

void release(detail::entry *e) {
    if (!e) return;
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.mu);
    if (--e->users > 0) return;
    r.entries.erase(e->ordinal);
    destroy_entry(e);
}

constexpr unsigned kGenerationBits = 40;
constexpr uint64_t kGenerationMask = (1ull << kGenerationBits) - 1;
constexpr uint32_t kContextIds = 1u << 24;

/* Graph context ids: 24 bits, handed out in turn and skipping the ids of
 * live contexts, so that after 2^24 contexts have come and gone a new one
 * never shares an id (and so cache keys) with one still alive. An id comes
 * back only after its context is destroyed, which evicted all its keys.
 * Leaked like the registry. */
struct context_ids {
    std::mutex mu;
    uint32_t next = 1;
    std::set<uint32_t> live;
};

context_ids &ctx_ids() {
    static context_ids *c = new context_ids;
    return *c;
}

/* A free id, or kContextIds when every id is taken. */
uint32_t take_context_id() {
    context_ids &c = ctx_ids();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.live.size() >= kContextIds) return kContextIds;
    for (;;) {
        uint32_t id = c.next;
        c.next = (c.next + 1) & (kContextIds - 1);
        if (c.live.insert(id).second) return id;
    }
}

void give_back_context_id(uint32_t id) {
    if (id >= kContextIds) return;
    context_ids &c = ctx_ids();
    std::lock_guard<std::mutex> lock(c.mu);
    c.live.erase(id);
}

} // namespace

/* ------------------------------------------------------------ configuration */

void set_log_sink(log_fn fn, void *user) {
    sink_state &s = sink();
    std::lock_guard<std::mutex> lock(s.mu);
    s.fn = fn;
    s.user = user;
}

bool configure(const char *text, std::string *error) {
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.mu);
    if (!r.entries.empty()) {
        if (error) *error = "devices are open: configure before the first adapter, or after the last one is gone";
        return false;
    }
    config c;
    std::string err;
    if (!parse_config(text, c, err)) {
        if (error) *error = err;
        return false;
    }
    r.cfg = c;
    r.configured = true;
    sink().level.store(c.log_level, std::memory_order_relaxed);
    return true;
}

std::string config_string() {
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.mu);
    load_config_locked(r);
    return format_config(r.cfg);
}

/* ------------------------------------------------------------------ binding */

binding::binding(int device, tp_stream stream) : entry_(acquire(device)), device_(device), stream_(stream) {
    if (!entry_) return;
    std::lock_guard<std::mutex> lock(entry_->mu);
    entry_->streams[stream_]++;
}

binding::~binding() {
    if (!entry_) return;
    {
        std::lock_guard<std::mutex> lock(entry_->mu);
        auto it = entry_->streams.find(stream_);
        if (it != entry_->streams.end() && --it->second == 0) {
            entry_->streams.erase(it);
            tp_status st = tp_pool_forget_stream(entry_->pool, stream_);
            if (st != TP_OK)
                log_msg(device_, TP_LOG_ERROR, "tp_pool_forget_stream(%p): %s", (void *)stream_, tp_status_name(st));
        }
    }
    release(entry_);
}

tp_pool *binding::tidepool_pool() const { return entry_ ? entry_->pool : nullptr; }

void *binding::alloc(size_t size, size_t *actual_size) {
    if (actual_size) *actual_size = 0;
    if (!entry_) {
        log_msg(device_, TP_LOG_ERROR, "alloc of %zu bytes: device %d is not available", size, device_);
        return nullptr;
    }
    void *ptr = nullptr;
    tp_status st = tp_pool_alloc(entry_->pool, size ? size : 1, stream_, &ptr);
    if (st == TP_OK) {
        if (actual_size) *actual_size = size;
        return ptr;
    }
    /* The pool keeps one report, its most recent failure: with several
     * threads failing at once this may be another thread's (same pool). */
    char want[32];
    tp_format_bytes(size, want, sizeof want);
    tp_oom_report report;
    if (st == TP_ERR_OUT_OF_MEMORY && tp_pool_last_oom_report(entry_->pool, &report) == TP_OK) {
        log_msg(device_, TP_LOG_ERROR, "%s pool: allocating %s on stream %p: %s", entry_->spec.c_str(), want,
             (void *)stream_, report.message);
    } else {
        log_msg(device_, TP_LOG_ERROR, "%s pool: allocating %s on stream %p failed: %s", entry_->spec.c_str(), want,
             (void *)stream_, tp_status_name(st));
    }
    if (entry_->oom_abort) {
        /* ggml's callers (ggml_cuda_pool_alloc<T>::alloc) do not check the
         * pointer: a NULL would reach a kernel. ggml's own pools abort here
         * too. One line straight to stderr, whatever the log level and the
         * sink, so that the abort is never silent. */
        std::fprintf(stderr,
                     "tidepool-ggml[%d]: allocating %s on device %d (%s, stream %p) failed: %s; aborting (oom=abort: "
                     "ggml's callers do not check for NULL)\n",
                     device_, want, device_, entry_->spec.c_str(), (void *)stream_, tp_status_name(st));
        std::fflush(stderr);
        std::abort();
    }
    return nullptr;
}

void binding::free(void *ptr, size_t size) {
    if (!ptr || !entry_) return;
    tp_status st = tp_pool_free(entry_->pool, ptr, stream_);
    if (st != TP_OK)
        log_msg(device_, TP_LOG_ERROR, "%s pool: free(%p, %zu) on stream %p: %s", entry_->spec.c_str(), ptr, size,
             (void *)stream_, tp_status_name(st));
}

/* ------------------------------------------------------------ graph_context */

graph_context::graph_context(int device) : entry_(acquire(device)), device_(device), id_(take_context_id()) {
    if (id_ < kContextIds || !entry_) return;
    log_msg(device_, TP_LOG_ERROR, "graph context: all %u context ids are in use; this context is not available",
            kContextIds);
    release(entry_);
    entry_ = nullptr;
}

graph_context::~graph_context() {
    if (entry_) {
        /* A capture this context began and never ended (capture_end or
         * capture_abort): left open, the pool would stay in capture mode on
         * the stream (every later capture_begin there fails, and the last
         * user could not destroy the pool: device memory leaked). */
        std::vector<tp_stream> open;
        {
            std::lock_guard<std::mutex> lock(entry_->capture_mu);
            for (auto it = entry_->captures.begin(); it != entry_->captures.end();) {
                if (it->second == id_) {
                    open.push_back(it->first);
                    it = entry_->captures.erase(it);
                } else {
                    ++it;
                }
            }
        }
        for (tp_stream s : open) {
            log_msg(device_, TP_LOG_WARN, "graph context destroyed during a capture on stream %p: the capture is aborted",
                    (void *)s);
            end_capture(s);
        }
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto &kv : keys_) {
            tp_status st = tp_graph_cache_evict(entry_->cache, kv.second);
            if (st != TP_OK && st != TP_ERR_NOT_FOUND)
                log_msg(device_, TP_LOG_WARN, "evicting graph key 0x%" PRIx64 ": %s", kv.second, tp_status_name(st));
        }
        keys_.clear();
        release(entry_);
    }
    give_back_context_id(id_); /* after the eviction: the next owner of the id finds none of its keys */
}

tp_graph_cache *graph_context::tidepool_graph_cache() const { return entry_ ? entry_->cache : nullptr; }

uint64_t graph_context::key_for(const void *key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(key);
    if (it != keys_.end()) return it->second;
    uint64_t k = ((uint64_t)id_ << kGenerationBits) | (next_generation_++ & kGenerationMask);
    keys_.emplace(key, k);
    return k;
}

uint64_t graph_context::cache_key(const void *key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = keys_.find(key);
    return it == keys_.end() ? 0 : it->second;
}

size_t graph_context::key_count() const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_.size();
}

tp_status graph_context::capture_begin(tp_stream stream) {
    if (!entry_) return TP_ERR_NO_DEVICE;
    tp_status st = tp_pool_capture_begin(entry_->pool, stream);
    if (st == TP_OK) {
        std::lock_guard<std::mutex> lock(entry_->capture_mu);
        entry_->captures[stream] = id_;
    }
    return st;
}

/* The stream's capture is no longer one a context must end. */
void graph_context::forget_capture(tp_stream stream) {
    std::lock_guard<std::mutex> lock(entry_->capture_mu);
    entry_->captures.erase(stream);
}

void graph_context::capture_abort(tp_stream stream) {
    if (!entry_) return;
    forget_capture(stream);
    end_capture(stream);
}

void graph_context::end_capture(tp_stream stream) {
    tp_range *ranges = nullptr;
    size_t count = 0;
    if (tp_pool_capture_end(entry_->pool, stream, &ranges, &count) != TP_OK) return;
    for (size_t i = 0; i < count; i++)
        tp_pool_unpin(entry_->pool, (const void *)(uintptr_t)ranges[i].address, (size_t)ranges[i].bytes);
    tp_pool_free_ranges(entry_->pool, ranges);
}

tp_status graph_context::capture_end(tp_stream stream, const void *key, tp_graph graph) {
    if (!entry_) return TP_ERR_NO_DEVICE;
    if (!graph) {
        capture_abort(stream);
        return TP_ERR_CAPTURE;
    }
    forget_capture(stream);
    tp_range *ranges = nullptr;
    size_t count = 0;
    tp_status st = tp_pool_capture_end(entry_->pool, stream, &ranges, &count);
    if (st != TP_OK) {
        log_msg(device_, TP_LOG_ERROR, "tp_pool_capture_end(stream %p): %s", (void *)stream, tp_status_name(st));
        return st;
    }
    uint64_t k = key_for(key);
    /* The ranges carry one pin each, handed to the cache (it releases them
     * itself when prepare fails); count 0 drops the executable's old pins. */
    tp_graph_pins pins{entry_->pool, ranges, count, true};
    st = tp_graph_cache_prepare(entry_->cache, k, graph, &pins);
    if (st == TP_ERR_INVALID_ARGUMENT) {
        for (size_t i = 0; i < count; i++)
            tp_pool_unpin(entry_->pool, (const void *)(uintptr_t)ranges[i].address, (size_t)ranges[i].bytes);
    }
    tp_pool_free_ranges(entry_->pool, ranges);
    if (st != TP_OK && st != TP_ERR_RUN_EAGER)
        log_msg(device_, TP_LOG_WARN, "graph key 0x%" PRIx64 ": prepare failed: %s; running eagerly", k,
             tp_status_name(st));
    return st == TP_OK ? TP_OK : TP_ERR_RUN_EAGER;
}

tp_status graph_context::launch(const void *key, tp_stream stream) {
    if (!entry_) return TP_ERR_NO_DEVICE;
    uint64_t k = cache_key(key);
    if (!k) return TP_ERR_RUN_EAGER;
    tp_status st = tp_graph_cache_launch(entry_->cache, k, stream);
    return st == TP_ERR_NOT_FOUND ? TP_ERR_RUN_EAGER : st;
}

void graph_context::drop(const void *key) {
    if (!entry_) return;
    uint64_t k;
    {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = keys_.find(key);
        if (it == keys_.end()) return;
        k = it->second;
        keys_.erase(it);
    }
    tp_status st = tp_graph_cache_evict(entry_->cache, k);
    if (st != TP_OK && st != TP_ERR_NOT_FOUND)
        log_msg(device_, TP_LOG_WARN, "evicting graph key 0x%" PRIx64 ": %s", k, tp_status_name(st));
}

/* --------------------------------------------------------------- device_ref */

device_ref::device_ref(int device) : entry_(acquire(device)) {}
device_ref::~device_ref() { release(entry_); }
tp_device *device_ref::device() const { return entry_ ? entry_->dev : nullptr; }
tp_pool *device_ref::pool() const { return entry_ ? entry_->pool : nullptr; }
tp_graph_cache *device_ref::graph_cache() const { return entry_ ? entry_->cache : nullptr; }
const char *device_ref::spec() const { return entry_ ? entry_->spec.c_str() : ""; }

/* -------------------------------------------------------------------- stats */

namespace {

template <class F>
bool append_json(std::string &out, F render) {
    std::vector<char> buf(4096);
    for (int attempt = 0; attempt < 2; attempt++) {
        size_t length = 0;
        tp_status st = render(buf.data(), buf.size(), &length);
        if (st == TP_OK) {
            out += buf.data();
            return true;
        }
        if (st != TP_ERR_BUFFER_TOO_SMALL) break;
        buf.resize(length + 1);
    }
    out += "null";
    return false;
}

} // namespace

std::string stats_json(int device) {
    registry &r = reg();
    std::lock_guard<std::mutex> lock(r.mu);
    load_config_locked(r);
    auto it = r.entries.find(device);
    if (it == r.entries.end()) return "null";
    detail::entry *e = it->second;
    std::string out = "{\"device\":" + std::to_string(device) + ",\"spec\":";
    json_string(out, e->spec);
    out += ",\"users\":" + std::to_string(e->users) + ",\"config\":";
    json_string(out, format_config(r.cfg));
    out += ",\"pool\":";
    append_json(out, [e](char *b, size_t cap, size_t *len) { return tp_pool_stats_json(e->pool, b, cap, len); });
    out += ",\"graph_cache\":";
    append_json(out,
                [e](char *b, size_t cap, size_t *len) { return tp_graph_cache_stats_json(e->cache, b, cap, len); });
    out += "}";
    return out;
}

} // namespace tp_ggml
