/* SPDX-License-Identifier: MIT */
/*
 * test_ggml_adapter.cpp -- the ggml adapter driven the way ggml-cuda drives
 * its pools, on tidepool's simulated device.
 *
 *   test_ggml_adapter CASE     (config, bad_env, growth_vmm, growth_segment,
 *                               shared_pool, graph_churn, context_ids,
 *                               capture_misuse, oom, oom_abort,
 *                               contexts_threads)
 *
 * Temporaries are RAII objects freed right after their kernels are queued
 * (pool_alloc<T> below, the shape of ggml's helper); kernels are simulated
 * (tp_sim_launch) and touch the memory they were given, so the simulator's
 * hazard checker sees any reuse of memory that queued work still uses.
 * Graphs are captured on the simulated device (tp_sim_capture_begin/end)
 * around the adapter's capture helpers.
 */
#include "tidepool_ggml.h"
#include "tidepool_sim.h"

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <sys/wait.h>
#include <unistd.h>

namespace {

/* ------------------------------------------------------------------ checks */

std::atomic<int> g_failures{0};

#define CHECK(cond)                                                                     \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            g_failures++;                                                               \
        }                                                                               \
    } while (0)
#define CHECK_MSG(cond, ...)                                                            \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s: ", __FILE__, __LINE__, #cond); \
            std::fprintf(stderr, __VA_ARGS__);                                          \
            std::fprintf(stderr, "\n");                                                 \
            g_failures++;                                                               \
        }                                                                               \
    } while (0)
#define CHECK_OK(expr)                                                                  \
    do {                                                                                \
        tp_status st_ = (expr);                                                         \
        CHECK_MSG(st_ == TP_OK, "%s = %s", #expr, tp_status_name(st_));                 \
    } while (0)
#define REQUIRE(cond)                                                                   \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            std::fprintf(stderr, "%s:%d: REQUIRE failed: %s\n", __FILE__, __LINE__, #cond); \
            std::exit(1);                                                               \
        }                                                                               \
    } while (0)

constexpr uint64_t KiB = 1024, MiB = 1024 * KiB, GiB = 1024 * MiB;

double mib(uint64_t bytes) { return (double)bytes / (double)MiB; }

/* ------------------------------------------------------------ the log sink */

struct captured_log {
    std::mutex mu;
    int errors = 0;
    int warnings = 0;
    std::vector<std::string> error_lines;
    bool echo = true;
};

captured_log g_log;

void test_sink(void *user, int device, tp_log_level level, const char *message) {
    auto *log = static_cast<captured_log *>(user);
    std::lock_guard<std::mutex> lock(log->mu);
    if (level >= TP_LOG_ERROR) {
        log->errors++;
        log->error_lines.push_back(message);
    } else if (level == TP_LOG_WARN) {
        log->warnings++;
    }
    if (log->echo) std::fprintf(stderr, "  [log dev %d level %d] %s\n", device, (int)level, message);
}

int log_errors() {
    std::lock_guard<std::mutex> lock(g_log.mu);
    return g_log.errors;
}

void configure_or_die(const char *conf) {
    std::string err;
    bool ok = tp_ggml::configure(conf, &err);
    CHECK_MSG(ok, "configure(\"%s\"): %s", conf, err.c_str());
    REQUIRE(ok);
}

/* --------------------------------------------- ggml's RAII temporary shape */

/* Memory for n elements of T from a pool, given back in the destructor:
 * ggml frees a temporary right after its kernels are queued. */
template <typename T>
class pool_alloc {
public:
    pool_alloc(tp_ggml_pool_interface &pool, size_t n) : pool_(&pool) {
        ptr_ = static_cast<T *>(pool.alloc(n * sizeof(T), &actual_));
    }
    ~pool_alloc() {
        if (ptr_) pool_->free(ptr_, actual_);
    }
    pool_alloc(const pool_alloc &) = delete;
    pool_alloc &operator=(const pool_alloc &) = delete;
    T *get() const { return ptr_; }
    size_t actual_size() const { return actual_; }
    tp_range range(size_t bytes) const { return tp_range{(uint64_t)(uintptr_t)ptr_, bytes}; }

private:
    tp_ggml_pool_interface *pool_;
    T *ptr_ = nullptr;
    size_t actual_ = 0;
};

/* Counts the live bytes a workload asked for (its live peak). */
class counting_pool final : public tp_ggml_pool_interface {
public:
    explicit counting_pool(tp_ggml_pool_interface &inner) : inner_(inner) {}
    void *alloc(size_t size, size_t *actual_size) override {
        void *p = inner_.alloc(size, actual_size);
        if (p) {
            std::lock_guard<std::mutex> lock(mu_);
            sizes_[p] = size;
            live_ += size;
            peak_ = std::max(peak_, live_);
        }
        return p;
    }
    void free(void *ptr, size_t size) override {
        {
            std::lock_guard<std::mutex> lock(mu_);
            auto it = sizes_.find(ptr);
            if (it != sizes_.end()) {
                live_ -= it->second;
                sizes_.erase(it);
            }
        }
        inner_.free(ptr, size);
    }
    uint64_t live_peak() const { return peak_; }
    uint64_t live() const { return live_; }

private:
    tp_ggml_pool_interface &inner_;
    std::mutex mu_;
    std::unordered_map<void *, size_t> sizes_;
    uint64_t live_ = 0, peak_ = 0;
};

/* A model of ggml-cuda's legacy pool, for comparison (bookkeeping only, no
 * device memory): a fixed table of 256 buffer slots keeping freed buffers;
 * an allocation takes the best-fitting kept buffer that is large enough,
 * else allocates a new one 5% larger than asked (rounded to 256 bytes) and
 * reports that as its actual size; a freed buffer goes into an empty slot
 * (released only if the table is full); nothing is ever given back
 * otherwise. held() is what it holds from the device. */
class legacy_pool_model final : public tp_ggml_pool_interface {
public:
    void *alloc(size_t size, size_t *actual_size) override {
        int best = -1;
        for (int i = 0; i < kSlots; i++) {
            if (slots_[i].ptr && slots_[i].size >= size && (best < 0 || slots_[i].size < slots_[best].size)) best = i;
        }
        if (best >= 0) {
            void *p = slots_[best].ptr;
            *actual_size = slots_[best].size;
            slots_[best] = slot{};
            return p;
        }
        size_t look_ahead = (size_t)(1.05 * (double)size);
        look_ahead = (look_ahead + 255) / 256 * 256;
        void *p = reinterpret_cast<void *>(next_address_);
        next_address_ += look_ahead;
        held_ += look_ahead;
        held_peak_ = std::max(held_peak_, held_);
        device_mallocs_++;
        *actual_size = look_ahead;
        return p;
    }
    void free(void *ptr, size_t size) override {
        for (auto &s : slots_) {
            if (!s.ptr) {
                s = slot{ptr, size};
                return;
            }
        }
        held_ -= size;
    }
    uint64_t held() const { return held_; }
    uint64_t held_peak() const { return held_peak_; }
    uint64_t device_mallocs() const { return device_mallocs_; }

private:
    static constexpr int kSlots = 256;
    struct slot {
        void *ptr = nullptr;
        size_t size = 0;
    };
    slot slots_[kSlots];
    uintptr_t next_address_ = (uintptr_t)1 << 40;
    uint64_t held_ = 0, held_peak_ = 0, device_mallocs_ = 0;
};

tp_pool_stats pool_stats(tp_pool *pool) {
    tp_pool_stats s;
    std::memset(&s, 0, sizeof s);
    CHECK_OK(tp_pool_get_stats(pool, &s));
    return s;
}

tp_graph_cache_stats cache_stats(tp_graph_cache *cache) {
    tp_graph_cache_stats s;
    std::memset(&s, 0, sizeof s);
    CHECK_OK(tp_graph_cache_get_stats(cache, &s));
    return s;
}

tp_sim_counters sim_counters(tp_device *dev) {
    tp_sim_counters c;
    std::memset(&c, 0, sizeof c);
    CHECK_OK(tp_sim_get_counters(dev, &c));
    return c;
}

/* What every case must leave behind on the device: no hazard, no access to
 * memory that was not there, consistent pool and cache. */
void check_device_clean(const tp_ggml::device_ref &ref, const char *where) {
    tp_sim_counters c = sim_counters(ref.device());
    CHECK_MSG(c.hazards == 0, "%s: %" PRIu64 " hazards (handout %" PRIu64 ", unmap %" PRIu64 ", free %" PRIu64 ")",
              where, c.hazards, c.hazards_handout, c.hazards_unmap, c.hazards_free);
    CHECK_MSG(c.invalid_accesses == 0, "%s: %" PRIu64 " invalid accesses", where, c.invalid_accesses);
    char msg[256] = "";
    tp_status st = tp_pool_check(ref.pool(), msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "%s: pool invariant: %s", where, msg);
    st = tp_graph_cache_check(ref.graph_cache(), msg, sizeof msg);
    CHECK_MSG(st == TP_OK, "%s: graph cache invariant: %s", where, msg);
    std::printf("  %s: hazards %" PRIu64 ", invalid accesses %" PRIu64 "\n", where, c.hazards, c.invalid_accesses);
}

/* Waits for the device, then lets the cache release the pins of evicted
 * executables whose last launch was still running when they went. */
void release_retired_pins(const tp_ggml::device_ref &ref) {
    CHECK_OK(tp_device_synchronize(ref.device()));
    CHECK_OK(tp_graph_cache_tick(ref.graph_cache()));
}

/* The end of a case that ran on a stream of its own: the pins of finished
 * launches released, nothing left pinned, the stream destroyed, the device
 * clean. */
void finish_case_on_stream(const tp_ggml::device_ref &ref, tp_stream s, const char *where) {
    release_retired_pins(ref);
    CHECK(pool_stats(ref.pool()).pinned_bytes.current == 0);
    CHECK_OK(tp_stream_destroy(ref.device(), s));
    check_device_clean(ref, where);
}

/* A kernel of duration ns on stream touching the given ranges. */
void kernel(tp_device *dev, tp_stream s, uint64_t ns, std::initializer_list<tp_range> ranges) {
    std::vector<tp_range> r(ranges);
    CHECK_OK(tp_sim_launch(dev, s, ns, r.data(), r.size()));
}

/* ----------------------------------------------------------------- config */

void case_config() {
    std::string err;
    CHECK(!tp_ggml::configure("kind=vmm,colour=blue", &err));
    CHECK_MSG(err.find("unknown key 'colour'") != std::string::npos, "message: %s", err.c_str());
    std::printf("  unknown key: %s\n", err.c_str());
    CHECK(!tp_ggml::configure("limit=twenty", &err));
    CHECK_MSG(err.find("limit=twenty") != std::string::npos, "message: %s", err.c_str());
    CHECK(!tp_ggml::configure("log=warn,log=info", &err));
    CHECK_MSG(err.find("'log' given twice") != std::string::npos, "message: %s", err.c_str());
    CHECK(!tp_ggml::configure("kind=vmm,,log=off", &err));
    CHECK(!tp_ggml::configure("device=gpu7", &err));
    CHECK_MSG(err.find("device=gpu7") != std::string::npos, "message: %s", err.c_str());
    CHECK(!tp_ggml::configure("device=sim:lots", &err));
    CHECK(!tp_ggml::configure("graph_cache_execs=0", &err));
    /* Fractions of a byte (a unit forgotten) are refused, not rounded. */
    CHECK(!tp_ggml::configure("limit=0.5", &err));
    CHECK_MSG(err.find("limit=0.5") != std::string::npos, "message: %s", err.c_str());
    CHECK(!tp_ggml::configure("limit=1.5B", &err));
    CHECK(!tp_ggml::configure("release_threshold=2.25", &err));
    CHECK(!tp_ggml::configure("oom=maybe", &err));
    CHECK_MSG(err.find("oom=maybe: expected abort or null") != std::string::npos, "message: %s", err.c_str());
    CHECK(tp_ggml::configure("limit=1.5GiB,release_threshold=2.0", &err));
    CHECK(tp_ggml::config_string().find("limit=1610612736,release_threshold=2,") != std::string::npos);
    CHECK(tp_ggml::config_string().find(",oom=abort") != std::string::npos); /* the default */
    CHECK(tp_ggml::configure("oom=null", &err));
    CHECK(tp_ggml::config_string().find(",oom=null") != std::string::npos);

    configure_or_die("kind=vmm,limit=20GiB,graph_cache_bytes=256MiB,graph_cache_execs=64,log=warn,device=sim:24GiB");
    std::string text = tp_ggml::config_string();
    std::printf("  config: %s\n", text.c_str());
    CHECK(text.find("kind=vmm") != std::string::npos);
    CHECK(text.find("limit=21474836480") != std::string::npos);
    CHECK(text.find("graph_cache_execs=64") != std::string::npos);
    CHECK(text.find("device=sim:24GiB") != std::string::npos);

    CHECK(tp_ggml::stats_json(0) == "null");
    {
        tp_ggml::pool p(0, TP_STREAM_DEFAULT);
        REQUIRE(p.get_binding().ok());
        /* Refused while a device is open. */
        CHECK(!tp_ggml::configure("kind=segment", &err));
        CHECK_MSG(err.find("devices are open") != std::string::npos, "message: %s", err.c_str());
        tp_device_info info;
        tp_ggml::device_ref ref(0);
        CHECK_OK(tp_device_get_info(ref.device(), &info));
        CHECK(info.capacity_bytes == 24 * GiB);
        CHECK(std::string(ref.spec()) == "sim:24GiB");

        size_t actual = 123;
        void *a = p.alloc(1000, &actual);
        CHECK(a != nullptr);
        CHECK(actual == 1000);
        void *z = p.alloc(0, &actual); /* a valid block, size 0 reported */
        CHECK(z != nullptr && actual == 0);
        std::string json = tp_ggml::stats_json(0);
        std::printf("  stats: %.160s...\n", json.c_str());
        CHECK(json.find("\"pool\":{") != std::string::npos);
        CHECK(json.find("\"graph_cache\":{") != std::string::npos);
        CHECK(json.find("\"spec\":\"sim:24GiB\"") != std::string::npos);
        CHECK(json.find("\"requested_bytes\"") != std::string::npos);
        p.free(a, 1000);
        p.free(z, 0);
        p.free(nullptr, 0);
        check_device_clean(ref, "config");
    }
    /* Everything gone: the device is closed and configurable again. */
    CHECK(tp_ggml::stats_json(0) == "null");
    CHECK(tp_ggml::configure("kind=segment,device=sim", &err));
    CHECK(log_errors() == 0);
}

/* TIDEPOOL_GGML_CONF with an unknown key (CMakeLists.txt): one error naming
 * the key, and the defaults. */
void case_bad_env() {
    {
        std::lock_guard<std::mutex> lock(g_log.mu);
        g_log.echo = false;
    }
    std::string text = tp_ggml::config_string();
    std::lock_guard<std::mutex> lock(g_log.mu);
    g_log.echo = true;
    std::string line = g_log.error_lines.empty() ? "" : g_log.error_lines.front();
    std::printf("  logged: %s\n  config: %s\n", line.c_str(), text.c_str());
    CHECK(g_log.errors == 1);
    CHECK_MSG(line.find("unknown key 'colour'") != std::string::npos, "%s", line.c_str());
    CHECK_MSG(line.find("using the defaults") != std::string::npos, "%s", line.c_str());
    CHECK(text.find("kind=auto") != std::string::npos && text.find("device=cuda") != std::string::npos);
}

/* ---------------------------------------------- #22107: growing temporaries */

/* Flash-attention-shaped prompt processing: per ubatch the KV length grows
 * by 512 and every layer converts K and V to temporaries of n_kv rows, a
 * little larger than the step before, plus a fixed-size output. */
struct growth_figures {
    uint64_t live_peak = 0;
};

void growth_workload(tp_ggml_pool_interface &pool, const std::function<void(std::initializer_list<tp_range>)> &use,
                     int steps) {
    const size_t row_bytes = 4 * KiB; /* per KV row, K or V in F16 */
    const int layers = 4;
    for (int step = 1; step <= steps; step++) {
        const size_t n_kv = 512 * (size_t)step;
        for (int layer = 0; layer < layers; layer++) {
            pool_alloc<uint16_t> k(pool, n_kv * row_bytes / 2);
            pool_alloc<uint16_t> v(pool, n_kv * row_bytes / 2);
            REQUIRE(k.get() && v.get());
            use({k.range(n_kv * row_bytes), v.range(n_kv * row_bytes)});
            pool_alloc<float> dst(pool, 512 * 1024); /* 2 MiB */
            REQUIRE(dst.get());
            use({k.range(n_kv * row_bytes), v.range(n_kv * row_bytes), dst.range(2 * MiB)});
        }
    }
}

void case_growth(const char *kind) {
    std::string conf = std::string("kind=") + kind + ",device=sim:16GiB,log=warn";
    configure_or_die(conf.c_str());
    const int steps = 48;

    legacy_pool_model legacy;
    counting_pool legacy_counted(legacy);
    growth_workload(legacy_counted, [](std::initializer_list<tp_range>) {}, steps);

    tp_ggml::device_ref ref(0);
    REQUIRE(ref.ok());
    tp_stream s;
    CHECK_OK(tp_stream_create(ref.device(), &s));
    uint64_t live_peak = 0;
    {
        tp_ggml::pool adapter(0, s);
        counting_pool counted(adapter);
        int n = 0;
        growth_workload(counted,
                        [&](std::initializer_list<tp_range> r) {
                            kernel(ref.device(), s, 200000, r);
                            /* The host runs ahead of the device most of the time. */
                            if (++n % 3 == 0) tp_sim_advance(ref.device(), 300000);
                        },
                        steps);
        live_peak = counted.live_peak();
        CHECK(counted.live() == 0);
    }
    tp_pool_stats st = pool_stats(ref.pool());
    double adapter_ratio = (double)st.reserved_bytes.peak / (double)live_peak;
    double legacy_ratio = (double)legacy.held_peak() / (double)legacy_counted.live_peak();
    std::printf("  #22107 growth (%s pool, %d steps): live peak %.1f MiB\n", kind, steps, mib(live_peak));
    std::printf("    tidepool adapter: held peak %.1f MiB (%.3fx live peak), holds %.1f MiB at the end, %" PRIu64
                " device allocations\n",
                mib(st.reserved_bytes.peak), adapter_ratio, mib(st.reserved_bytes.current), st.device_allocs);
    std::printf("    legacy pool model: held %.1f MiB (%.2fx live peak), %" PRIu64 " cudaMalloc calls, never given back\n",
                mib(legacy.held_peak()), legacy_ratio, legacy.device_mallocs());
    CHECK(legacy_counted.live_peak() == live_peak);
    CHECK_MSG(adapter_ratio <= 1.10, "adapter holds %.3fx its live peak", adapter_ratio);
    CHECK_MSG(legacy_ratio >= 4.0, "the legacy model was expected to hoard (%.2fx)", legacy_ratio);
    CHECK_OK(tp_stream_destroy(ref.device(), s));
    check_device_clean(ref, kind);
    CHECK(log_errors() == 0);
}

/* ------------------------------------- one pool per GPU, shared by contexts */

/* The vision encoder runs, goes idle and is destroyed; the text model then
 * needs as much again: it is served from the memory the encoder left. Two
 * per-context ggml pools would hold both. */
void case_shared_pool() {
    configure_or_die("kind=vmm,device=sim:8GiB,log=warn");
    tp_ggml::device_ref ref(0);
    REQUIRE(ref.ok());
    tp_device *dev = ref.device();
    tp_stream enc_stream, text_stream;
    CHECK_OK(tp_stream_create(dev, &enc_stream));
    CHECK_OK(tp_stream_create(dev, &text_stream));
    {
    tp_ggml::pool text(0, text_stream); /* the text model exists all along */
    counting_pool text_counted(text);
    uint64_t enc_peak = 0;
    {
        tp_ggml::pool enc(0, enc_stream);
        counting_pool enc_counted(enc);
        for (int image = 0; image < 4; image++) {
            std::vector<std::unique_ptr<pool_alloc<char>>> live;
            for (int i = 0; i < 4; i++) {
                live.emplace_back(new pool_alloc<char>(enc_counted, 200 * MiB + (size_t)image * MiB));
                REQUIRE(live.back()->get());
                kernel(dev, enc_stream, 500000, {live.back()->range(200 * MiB)});
            }
        }
        enc_peak = enc_counted.live_peak();
    } /* the encoder's context goes: its stream is forgotten */
    uint64_t after_encoder = pool_stats(ref.pool()).reserved_bytes.current;
    for (int token = 0; token < 16; token++) {
        pool_alloc<char> a(text_counted, 300 * MiB), b(text_counted, 250 * MiB), c(text_counted, 200 * MiB);
        REQUIRE(a.get() && b.get() && c.get());
        kernel(dev, text_stream, 100000, {a.range(300 * MiB), b.range(250 * MiB), c.range(200 * MiB)});
        tp_sim_advance(dev, 50000);
    }
    tp_pool_stats st = pool_stats(ref.pool());
    uint64_t larger = std::max(enc_peak, text_counted.live_peak());
    double ratio = (double)st.reserved_bytes.peak / (double)larger;
    std::printf("  shared pool: encoder live peak %.0f MiB, text live peak %.0f MiB; held after the encoder %.0f MiB\n",
                mib(enc_peak), mib(text_counted.live_peak()), mib(after_encoder));
    std::printf("    one tidepool pool for both: held peak %.0f MiB (%.3fx the larger); two per-context pools: >= %.0f MiB\n",
                mib(st.reserved_bytes.peak), ratio, mib(enc_peak + text_counted.live_peak()));
    CHECK_MSG(ratio <= 1.10, "held peak %.3fx the larger live peak", ratio);
    } /* the text model goes */
    CHECK_OK(tp_stream_destroy(dev, enc_stream));
    CHECK_OK(tp_stream_destroy(dev, text_stream));
    check_device_clean(ref, "shared pool");
    CHECK(log_errors() == 0);
}

/* ---------------------------------------------------------------- graphs */

/* ggml's capture path for one graph: capture on stream, temporaries
 * allocated and freed inside it, then the executable made ready. Returns
 * the helper's status (TP_OK or TP_ERR_RUN_EAGER). */
tp_status capture_graph(tp_device *dev, tp_ggml::graph_context &ctx, tp_ggml_pool_interface &pool, tp_stream s,
                        const void *key, int kernels, size_t temp_bytes) {
    CHECK_OK(ctx.capture_begin(s)); /* before the stream captures (tp_pool_capture_begin's contract) */
    CHECK_OK(tp_sim_capture_begin(dev, s));
    for (int i = 0; i < kernels; i++) {
        pool_alloc<char> tmp(pool, temp_bytes);
        REQUIRE(tmp.get());
        kernel(dev, s, 20000, {tmp.range(temp_bytes)});
    }
    tp_graph g = nullptr;
    CHECK_OK(tp_sim_capture_end(dev, s, &g));
    tp_status st = ctx.capture_end(s, key, g);
    CHECK_MSG(st == TP_OK || st == TP_ERR_RUN_EAGER, "capture_end: %s", tp_status_name(st));
    if (g) CHECK_OK(tp_sim_graph_destroy(dev, g)); /* the executable keeps what it needs */
    return st;
}

/* Runs key's graph, or its work eagerly when the helper says so. */
bool run_graph(tp_device *dev, tp_ggml::graph_context &ctx, tp_ggml_pool_interface &pool, tp_stream s,
               const void *key, int kernels, size_t temp_bytes) {
    tp_status st = ctx.launch(key, s);
    if (st == TP_OK) return true;
    CHECK_MSG(st == TP_ERR_RUN_EAGER, "launch: %s", tp_status_name(st));
    for (int i = 0; i < kernels; i++) {
        pool_alloc<char> tmp(pool, temp_bytes);
        REQUIRE(tmp.get());
        kernel(dev, s, 20000, {tmp.range(temp_bytes)});
    }
    return false;
}

const void *fake_key(uintptr_t n) { return reinterpret_cast<const void *>((uintptr_t)0x7f0000000000 + n * 64); }

/* #19639: every image request brings a graph with a new key; a few text
 * graphs are reused all the time. ggml's map keeps every key for 10 s. */
void case_graph_churn() {
    configure_or_die("kind=vmm,device=sim:8GiB+graph_node_bytes=256KiB,graph_cache_execs=16,"
                     "graph_cache_bytes=64MiB,log=warn");
    tp_ggml::device_ref ref(0);
    REQUIRE(ref.ok());
    tp_device *dev = ref.device();
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    const int requests = 120, hot = 3, kernels = 8;
    uint64_t max_execs = 0, max_sim_execs = 0, max_pinned = 0, eager_hot = 0, eager_image = 0;
    {
        tp_ggml::pool pool(0, s);
        tp_ggml::graph_context ctx(0);
        REQUIRE(ctx.ok());
        /* Keys are unique across contexts, and per generation. */
        {
            tp_ggml::graph_context other(0);
            tp_status st = capture_graph(dev, other, pool, s, fake_key(1), 2, MiB);
            CHECK(st == TP_OK);
            st = capture_graph(dev, ctx, pool, s, fake_key(1), 2, MiB);
            CHECK(st == TP_OK);
            CHECK(other.cache_key(fake_key(1)) != ctx.cache_key(fake_key(1)));
            uint64_t before = ctx.cache_key(fake_key(1));
            ctx.drop(fake_key(1));
            CHECK(ctx.cache_key(fake_key(1)) == 0);
            CHECK(ctx.launch(fake_key(1), s) == TP_ERR_RUN_EAGER);
            st = capture_graph(dev, ctx, pool, s, fake_key(1), 2, MiB); /* the address comes back */
            CHECK(st == TP_OK && ctx.cache_key(fake_key(1)) != before);
            ctx.drop(fake_key(1));
        } /* other's executables are evicted with it */
        CHECK(cache_stats(ref.graph_cache()).execs == 0);

        for (int r = 0; r < requests; r++) {
            /* The image: a new graph, captured and run once. */
            const void *image_key = fake_key(1000 + (uintptr_t)r);
            tp_status st = capture_graph(dev, ctx, pool, s, image_key, kernels, (size_t)(4 + r % 5) * MiB);
            if (st == TP_OK) {
                if (!run_graph(dev, ctx, pool, s, image_key, kernels, 4 * MiB)) eager_image++;
            } else {
                eager_image++;
                run_graph(dev, ctx, pool, s, image_key, kernels, 4 * MiB);
            }
            /* The text graphs: captured when first seen and when ggml
             * decides an update is needed (every 8th request here), launched
             * a few times per request. */
            for (int h = 0; h < hot; h++) {
                const void *key = fake_key(10 + (uintptr_t)h);
                if (r % 8 == 0) CHECK(capture_graph(dev, ctx, pool, s, key, kernels, 2 * MiB) == TP_OK);
                for (int t = 0; t < 4; t++)
                    if (!run_graph(dev, ctx, pool, s, key, kernels, 2 * MiB)) eager_hot++;
            }
            /* The device keeps up: a request's work is about 2.1 ms. */
            tp_sim_advance(dev, 3000000);
            tp_graph_cache_stats cs = cache_stats(ref.graph_cache());
            tp_sim_counters sc = sim_counters(dev);
            max_execs = std::max(max_execs, cs.execs);
            max_sim_execs = std::max(max_sim_execs, sc.graph_execs);
            max_pinned = std::max(max_pinned, pool_stats(ref.pool()).pinned_bytes.current);
            CHECK_MSG(cs.execs <= 16, "request %d: %" PRIu64 " executables", r, cs.execs);
        }
        tp_graph_cache_stats cs = cache_stats(ref.graph_cache());
        std::printf("  #19639 key churn: %d requests, each a new image key + %d hot keys\n", requests, hot);
        std::printf("    executables alive: max %" PRIu64 " (device saw max %" PRIu64 "), cap 16; ggml's map (10 s idle "
                    "sweep) would hold %d in this window\n",
                    max_execs, max_sim_execs, requests + hot);
        std::printf("    instantiations %" PRIu64 ", hits+updates %" PRIu64 ", launches %" PRIu64 ", evictions (count) %" PRIu64
                    ", eager fallbacks: hot %" PRIu64 ", image %" PRIu64 "\n",
                    cs.instantiations, cs.hits + cs.updates, cs.launches, cs.evictions_count, eager_hot, eager_image);
        std::printf("    pinned capture footprints: max %.0f MiB\n", mib(max_pinned));
        CHECK(max_sim_execs <= 16);
        CHECK_MSG(eager_hot == 0, "hot keys were evicted %" PRIu64 " times", eager_hot);
        CHECK(eager_image == 0);
        CHECK(cs.evictions_count > 0);
        /* Footprints of at most 16 executables: image graphs pin <= 8 MiB each. */
        CHECK_MSG(max_pinned <= 16 * 8 * MiB, "pinned %.0f MiB", mib(max_pinned));
    } /* the context goes: its executables are evicted */
    CHECK(cache_stats(ref.graph_cache()).execs == 0);
    /* Pins of launches still in flight go once they complete (the cache's
     * background thread, or here a tick). */
    finish_case_on_stream(ref, s, "graph churn");
    CHECK(log_errors() == 0);
}

/* Context ids are 24 bits: after 2^24 contexts came and went, a new one
 * must not get the id of one still alive (its cache keys would alias the
 * live context's, and its capture would replace that context's executable). */
void case_context_ids() {
    configure_or_die("kind=vmm,device=sim:8GiB+graph_node_bytes=256KiB,log=warn");
    tp_ggml::device_ref ref(0);
    REQUIRE(ref.ok());
    tp_device *dev = ref.device();
    tp_stream s;
    CHECK_OK(tp_stream_create(dev, &s));
    {
        tp_ggml::pool pool(0, s);
        tp_ggml::graph_context old_ctx(0);
        REQUIRE(old_ctx.ok());
        CHECK(capture_graph(dev, old_ctx, pool, s, fake_key(1), 2, MiB) == TP_OK);
        for (uint32_t i = 0; i < (1u << 24) - 1; i++) {
            tp_ggml::graph_context churn(0);
            if (churn.id() == old_ctx.id()) {
                CHECK_MSG(false, "context %u got the id %u of a live context", i, churn.id());
                break;
            }
        }
        tp_ggml::graph_context new_ctx(0);
        REQUIRE(new_ctx.ok());
        CHECK(new_ctx.id() != old_ctx.id());
        CHECK(capture_graph(dev, new_ctx, pool, s, fake_key(1), 3, MiB) == TP_OK);
        CHECK(new_ctx.cache_key(fake_key(1)) != old_ctx.cache_key(fake_key(1)));
        CHECK_OK(new_ctx.launch(fake_key(1), s));
        /* The new context drops its key: the old context's executable stays. */
        new_ctx.drop(fake_key(1));
        CHECK(cache_stats(ref.graph_cache()).execs == 1);
        CHECK_OK(old_ctx.launch(fake_key(1), s));
        CHECK_OK(tp_stream_synchronize(dev, s));
    }
    CHECK(cache_stats(ref.graph_cache()).execs == 0);
    finish_case_on_stream(ref, s, "context ids");
    CHECK(log_errors() == 0);
}

/* A graph context destroyed between capture_begin and capture_end (ggml's
 * capture failed, or the context went away): the pool must not stay in
 * capture mode on the stream, neither for the next context nor when the
 * last user goes (the pool could not be destroyed: its memory would leak). */
void case_capture_misuse() {
    configure_or_die("kind=vmm,device=sim:8GiB+graph_node_bytes=256KiB,log=warn");
    {
        tp_ggml::device_ref ref(0);
        REQUIRE(ref.ok());
        tp_device *dev = ref.device();
        tp_stream s;
        CHECK_OK(tp_stream_create(dev, &s));
        {
            tp_ggml::pool pool(0, s);
            {
                tp_ggml::graph_context gone(0);
                CHECK_OK(gone.capture_begin(s));
                pool_alloc<char> tmp(pool, MiB); /* a temporary inside the capture */
                CHECK(tmp.get() != nullptr);
            } /* destroyed mid-capture */
            tp_ggml::graph_context next(0);
            CHECK(capture_graph(dev, next, pool, s, fake_key(1), 2, MiB) == TP_OK);
            CHECK_OK(next.launch(fake_key(1), s));
            CHECK_OK(tp_stream_synchronize(dev, s));
            /* Another context's open capture is not this one's to end. */
            tp_ggml::graph_context other(0);
            CHECK_OK(other.capture_begin(s));
            { tp_ggml::graph_context bystander(0); }
            CHECK(other.capture_begin(s) == TP_ERR_CAPTURE); /* still capturing */
            other.capture_abort(s);
        }
        finish_case_on_stream(ref, s, "capture misuse");
        /* A backend context destroyed as the README's wiring says while its
         * graph context has a capture open: the graph context first (it
         * ends the capture), then the pool, which can then forget its
         * stream (TP_ERR_CAPTURE, logged, in the other order) before the
         * stream is destroyed. */
        tp_stream s2;
        CHECK_OK(tp_stream_create(dev, &s2));
        {
            auto pool = std::make_unique<tp_ggml::pool>(0, s2);
            auto ctx = std::make_unique<tp_ggml::graph_context>(0);
            CHECK_OK(ctx->capture_begin(s2));
            {
                pool_alloc<char> tmp(*pool, MiB);
                CHECK(tmp.get() != nullptr);
            }
            ctx.reset();
            pool.reset();
        }
        CHECK(log_errors() == 0);
        finish_case_on_stream(ref, s2, "context destroyed mid-capture");
        /* The last users go while a context is mid-capture on the default
         * stream: the context is destroyed first, then ref. */
        tp_ggml::graph_context last(0);
        CHECK_OK(last.capture_begin(nullptr));
    }
    CHECK(tp_ggml::stats_json(0) == "null"); /* the device was closed */
    CHECK(log_errors() == 0);                /* and its pool destroyed without an error */
}

/* ---------------------------------------- out of memory with graphs alive */

void case_oom() {
    configure_or_die("kind=vmm,limit=2GiB,device=sim:2GiB+graph_node_bytes=1MiB,graph_cache_execs=16,"
                     "graph_cache_bytes=unlimited,log=warn,oom=null");
    tp_ggml::device_ref ref(0);
    REQUIRE(ref.ok());
    tp_device *dev = ref.device();
    tp_stream s, s2;
    CHECK_OK(tp_stream_create(dev, &s));
    CHECK_OK(tp_stream_create(dev, &s2));
    {
        tp_ggml::pool pool(0, s);
        tp_ggml::pool other(0, s2); /* another context's pool on the same GPU */
        tp_ggml::graph_context ctx(0);
        /* Eight graphs whose temporaries (192 MiB each) stay pinned while
         * their executables live: 1.5 GiB of the 2 GiB. Each is launched
         * and still running. */
        const int graphs = 8;
        for (int i = 0; i < graphs; i++) {
            CHECK(capture_graph(dev, ctx, pool, s, fake_key((uintptr_t)i), 4, 192 * MiB) == TP_OK);
            CHECK(ctx.launch(fake_key((uintptr_t)i), s) == TP_OK);
        }
        tp_pool_stats before = pool_stats(ref.pool());
        tp_graph_cache_stats cbefore = cache_stats(ref.graph_cache());
        std::printf("  OOM with executables alive: %" PRIu64 " executables pin %.0f MiB; pool holds %.0f MiB of 2048\n",
                    cbefore.execs, mib(before.pinned_bytes.current), mib(before.reserved_bytes.current));
        CHECK(before.pinned_bytes.current >= (uint64_t)graphs * 192 * MiB);

        /* 1 GiB on the other context's stream: only there once executables
         * are evicted and their launches have completed. */
        size_t actual = 0;
        void *big = other.alloc(GiB, &actual);
        CHECK(big != nullptr && actual == GiB);
        if (big) kernel(dev, s2, 100000, {tp_range{(uint64_t)(uintptr_t)big, GiB}});
        tp_pool_stats after = pool_stats(ref.pool());
        tp_graph_cache_stats cafter = cache_stats(ref.graph_cache());
        std::printf("    1 GiB on another stream: %s; reclaim calls %" PRIu64 ", executables evicted under pressure %" PRIu64
                    ", left %" PRIu64 ", pinned now %.0f MiB\n",
                    big ? "served" : "FAILED", after.reclaim_calls, cafter.evictions_pressure, cafter.execs,
                    mib(after.pinned_bytes.current));
        CHECK(after.reclaim_calls >= 1);
        CHECK(cafter.evictions_pressure >= 1);
        CHECK(cafter.execs < cbefore.execs);
        int eager = 0;
        for (int i = 0; i < graphs; i++)
            if (!run_graph(dev, ctx, pool, s, fake_key((uintptr_t)i), 4, 16 * MiB)) eager++;
        std::printf("    launches of the %d keys afterwards: %d fall back to eager\n", graphs, eager);
        CHECK(eager == (int)(cbefore.execs - cafter.execs));
        CHECK(log_errors() == 0);

        /* Beyond the limit whatever is evicted: NULL (oom=null), with the report. */
        {
            std::lock_guard<std::mutex> lock(g_log.mu);
            g_log.echo = false;
        }
        void *huge = other.alloc(3 * GiB, &actual);
        CHECK(huge == nullptr && actual == 0);
        {
            std::lock_guard<std::mutex> lock(g_log.mu);
            g_log.echo = true;
            CHECK(g_log.errors == 1);
            std::string line = g_log.error_lines.empty() ? "" : g_log.error_lines.back();
            std::printf("    3 GiB: NULL; logged: %s\n", line.c_str());
            CHECK_MSG(line.find("out of memory") != std::string::npos, "%s", line.c_str());
            CHECK_MSG(line.find("request 3.00 GiB") != std::string::npos, "%s", line.c_str());
            CHECK_MSG(line.find("pool limit 2.00 GiB") != std::string::npos, "%s", line.c_str());
            g_log.errors = 0;
        }
        other.free(big, actual);
        CHECK_OK(tp_device_synchronize(dev));
        check_device_clean(ref, "oom");
    }
    CHECK_OK(tp_stream_destroy(dev, s));
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK(log_errors() == 0);
}

/* oom=abort, the default: ggml's callers (ggml_cuda_pool_alloc<T>::alloc)
 * do not check the pointer, so a failed allocation aborts, as ggml's own
 * pools do, with one line on stderr even with log=off. In a child process:
 * its stderr and its end (SIGABRT) are checked here. */
void case_oom_abort() {
    int fds[2];
    REQUIRE(pipe(fds) == 0);
    std::fflush(stdout);
    std::fflush(stderr);
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        close(fds[1]);
        configure_or_die("kind=vmm,limit=1GiB,device=sim:2GiB,log=off");
        tp_ggml::pool pool(0, TP_STREAM_DEFAULT);
        size_t actual = 0;
        void *p = pool.alloc(3 * GiB / 2, &actual);
        std::fprintf(stderr, "alloc returned %p\n", p);
        std::_Exit(3); /* not aborted: the test fails */
    }
    close(fds[1]);
    std::string text;
    char buf[512];
    ssize_t n;
    while ((n = read(fds[0], buf, sizeof buf)) > 0) text.append(buf, (size_t)n);
    close(fds[0]);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    std::printf("  child: %s; stderr: %s", WIFSIGNALED(status) ? strsignal(WTERMSIG(status)) : "exited",
                text.c_str());
    CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT, "status 0x%x", status);
    CHECK_MSG(std::count(text.begin(), text.end(), '\n') == 1, "stderr: %s", text.c_str()); /* log=off: that line only */
    CHECK_MSG(text.find("tidepool-ggml[0]") == 0, "%s", text.c_str());
    CHECK_MSG(text.find("1.50 GiB") != std::string::npos, "%s", text.c_str());
    CHECK_MSG(text.find("device 0 (sim:2GiB") != std::string::npos, "%s", text.c_str());
    CHECK_MSG(text.find("TP_ERR_OUT_OF_MEMORY") != std::string::npos, "%s", text.c_str());
    CHECK_MSG(text.find("abort") != std::string::npos, "%s", text.c_str());
}

/* --------------------------------------------- several contexts at once */

void case_contexts_threads() {
    /* Configuration from TIDEPOOL_GGML_CONF (CMakeLists.txt). */
    std::string conf = tp_ggml::config_string();
    std::printf("  config from the environment: %s\n", conf.c_str());
    CHECK(conf.find("device=sim:8GiB") != std::string::npos);
    CHECK(conf.find("graph_cache_execs=24") != std::string::npos);
    tp_ggml::device_ref ref(0);
    REQUIRE(ref.ok());
    tp_device *dev = ref.device();
    const int contexts = 4;
    std::vector<tp_stream> streams(contexts);
    for (auto &s : streams) CHECK_OK(tp_stream_create(dev, &s));
    std::atomic<uint64_t> eager{0}, launched{0};
    auto worker = [&](int id) {
        tp_stream s = streams[(size_t)id];
        tp_ggml::pool pool(0, s);
        tp_ggml::graph_context ctx(0);
        uint32_t rng = 0x9e3779b9u * (uint32_t)(id + 1);
        auto next = [&rng]() {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            return rng;
        };
        /* Context 0 is the vision encoder: shorter, and gone early. */
        const int steps = id == 0 ? 30 : 80;
        for (int step = 0; step < steps; step++) {
            {
                pool_alloc<char> a(pool, (size_t)(1 + next() % 48) * MiB);
                pool_alloc<char> b(pool, (size_t)(1 + next() % 16) * MiB + next() % 4096);
                REQUIRE(a.get() && b.get());
                kernel(dev, s, 30000, {a.range(MiB), b.range(MiB)});
                pool_alloc<float> c(pool, 1024 + next() % 65536);
                REQUIRE(c.get());
                kernel(dev, s, 30000, {a.range(MiB), c.range(4096)});
            }
            /* Two hot graphs of this context, and a one-off now and then. */
            const void *key = fake_key((uintptr_t)(step % 2));
            if (step < 2 || step % 10 == 0) capture_graph(dev, ctx, pool, s, key, 3, 2 * MiB);
            if (run_graph(dev, ctx, pool, s, key, 3, 2 * MiB)) launched++;
            else eager++;
            if (step % 7 == 3) {
                const void *once = fake_key(100 + (uintptr_t)step);
                capture_graph(dev, ctx, pool, s, once, 2, 4 * MiB);
                if (run_graph(dev, ctx, pool, s, once, 2, 4 * MiB)) launched++;
                else eager++;
                if (step % 2) ctx.drop(once); /* ggml's sweep erased it */
            }
            tp_sim_advance(dev, 40000);
            tp_graph_cache_stats cs = cache_stats(ref.graph_cache());
            CHECK_MSG(cs.execs <= 24, "%" PRIu64 " executables", cs.execs);
        }
    };
    std::vector<std::thread> threads;
    for (int i = 0; i < contexts; i++) threads.emplace_back(worker, i);
    for (auto &t : threads) t.join();
    tp_pool_stats st = pool_stats(ref.pool());
    tp_graph_cache_stats cs = cache_stats(ref.graph_cache());
    std::printf("  %d contexts on one pool: held peak %.0f MiB, %" PRIu64 " allocations, %" PRIu64 " streams seen, %" PRIu64
                " cross-stream waits; graphs launched %" PRIu64 ", eager %" PRIu64 ", executables max bytes %.1f MiB\n",
                contexts, mib(st.reserved_bytes.peak), st.allocs, st.streams, st.cross_stream_waits, launched.load(),
                eager.load(), mib(cs.exec_bytes_peak));
    CHECK(cs.execs == 0); /* every context evicted its keys */
    release_retired_pins(ref);
    CHECK(pool_stats(ref.pool()).pinned_bytes.current == 0);
    CHECK(st.requested_bytes.current == 0);
    std::string json = tp_ggml::stats_json(0);
    CHECK(json.find("\"users\":1") != std::string::npos); /* only ref is left */
    CHECK_OK(tp_device_synchronize(dev));
    for (auto s : streams) CHECK_OK(tp_stream_destroy(dev, s));
    check_device_clean(ref, "contexts");
    CHECK(log_errors() == 0);
}

} // namespace

int main(int argc, char **argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s CASE\n", argv[0]);
        return 2;
    }
    tp_ggml::set_log_sink(test_sink, &g_log);
    std::string name = argv[1];
    const std::pair<const char *, std::function<void()>> cases[] = {
        {"config", case_config},
        {"bad_env", case_bad_env},
        {"growth_vmm", [] { case_growth("vmm"); }},
        {"growth_segment", [] { case_growth("segment"); }},
        {"shared_pool", case_shared_pool},
        {"graph_churn", case_graph_churn},
        {"context_ids", case_context_ids},
        {"capture_misuse", case_capture_misuse},
        {"oom", case_oom},
        {"oom_abort", case_oom_abort},
        {"contexts_threads", case_contexts_threads},
    };
    for (const auto &c : cases) {
        if (name != c.first) continue;
        std::printf("== %s\n", c.first);
        c.second();
        int failures = g_failures.load();
        std::printf("%s %s (%d failed checks)\n", failures ? "FAIL" : "PASS", c.first, failures);
        return failures ? 1 : 0;
    }
    std::fprintf(stderr, "unknown case '%s'\n", argv[1]);
    return 2;
}
