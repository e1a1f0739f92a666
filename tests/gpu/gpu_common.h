/* SPDX-License-Identifier: MIT */
/*
 * gpu_common.h -- what the GPU tests share: the test's own handle on the
 * CUDA driver (dlopen'd, like the library's, for memsets and copies; no
 * nvcc, no CUDA headers), the skip rule, and small helpers.
 *
 * Skip rule: a test that finds no driver or no device prints
 * "SKIP: no CUDA device (reason)" and exits 77 (CTest's SKIP_RETURN_CODE).
 * Once the driver reports a device, everything else is a real failure.
 *
 * Environment: TP_GPU_DEVICE (default "cuda:0") names the device the tests
 * open; TP_GPU_QUICK=1 shrinks the iteration counts (for compute-sanitizer,
 * which slows every driver call down); TP_GPU_PROBE=1 makes a test exit 0
 * right after finding the device (77 without one).
 */
#ifndef TIDEPOOL_TEST_GPU_COMMON_H
#define TIDEPOOL_TEST_GPU_COMMON_H

#include "check.h"

#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int gpu_result;
typedef unsigned long long gpu_ptr;
typedef struct gpu_ctx_st *gpu_context;
typedef struct gpu_stream_st *gpu_stream;

typedef struct gpu_driver {
    void *lib;
    int ordinal;
    int device;
    gpu_context ctx;
    gpu_result (*Init)(unsigned);
    gpu_result (*DeviceGetCount)(int *);
    gpu_result (*DeviceGet)(int *, int);
    gpu_result (*DevicePrimaryCtxRetain)(gpu_context *, int);
    gpu_result (*DevicePrimaryCtxRelease)(int);
    gpu_result (*CtxSetCurrent)(gpu_context);
    gpu_result (*CtxGetCurrent)(gpu_context *);
    gpu_result (*GetErrorName)(gpu_result, const char **);
    gpu_result (*MemGetInfo)(size_t *, size_t *);
    gpu_result (*MemAlloc)(gpu_ptr *, size_t);
    gpu_result (*MemFree)(gpu_ptr);
    gpu_result (*MemsetD8Async)(gpu_ptr, unsigned char, size_t, gpu_stream);
    gpu_result (*MemcpyDtoHAsync)(void *, gpu_ptr, size_t, gpu_stream);
    gpu_result (*MemcpyHtoDAsync)(gpu_ptr, const void *, size_t, gpu_stream);
    gpu_result (*StreamSynchronize)(gpu_stream);
    gpu_result (*CtxSynchronize)(void);
} gpu_driver;

static gpu_driver gpu;

static inline void gpu_skip(const char *why) {
    printf("SKIP: no CUDA device (%s)\n", why);
    fflush(stdout);
    exit(77);
}

static inline const char *gpu_error_name(gpu_result r) {
    const char *name = NULL;
    if (!gpu.GetErrorName || gpu.GetErrorName(r, &name) != 0 || !name) return "unknown";
    return name;
}

static inline void *gpu_sym(const char *name) {
    void *p = dlsym(gpu.lib, name);
    if (!p) {
        char why[160];
        snprintf(why, sizeof why, "libcuda.so.1 lacks %s", name);
        gpu_skip(why);
    }
    return p;
}

#define GPU_LOAD(field, name)                    \
    do {                                         \
        void *sym_ = gpu_sym(name);              \
        memcpy(&gpu.field, &sym_, sizeof sym_);  \
    } while (0)

/* The device spec the tests open ("cuda:0" unless TP_GPU_DEVICE says). */
static inline const char *gpu_spec(void) {
    const char *spec = getenv("TP_GPU_DEVICE");
    return spec && *spec ? spec : "cuda:0";
}

static inline int gpu_quick(void) {
    const char *q = getenv("TP_GPU_QUICK");
    return q && *q && strcmp(q, "0") != 0;
}

/* Loads the driver and makes the device's primary context current on the
 * calling thread, or skips the test. */
static inline void gpu_init(void) {
    const char *spec = gpu_spec();
    gpu.ordinal = 0;
    if (strncmp(spec, "cuda:", 5) == 0) gpu.ordinal = atoi(spec + 5);
    gpu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!gpu.lib) {
        char why[300];
        const char *err = dlerror();
        snprintf(why, sizeof why, "cannot load libcuda.so.1: %s", err ? err : "?");
        gpu_skip(why);
    }
    GPU_LOAD(Init, "cuInit");
    GPU_LOAD(GetErrorName, "cuGetErrorName");
    GPU_LOAD(DeviceGetCount, "cuDeviceGetCount");
    GPU_LOAD(DeviceGet, "cuDeviceGet");
    GPU_LOAD(DevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    GPU_LOAD(DevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2");
    GPU_LOAD(CtxSetCurrent, "cuCtxSetCurrent");
    GPU_LOAD(CtxGetCurrent, "cuCtxGetCurrent");
    GPU_LOAD(MemGetInfo, "cuMemGetInfo_v2");
    GPU_LOAD(MemAlloc, "cuMemAlloc_v2");
    GPU_LOAD(MemFree, "cuMemFree_v2");
    GPU_LOAD(MemsetD8Async, "cuMemsetD8Async");
    GPU_LOAD(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2");
    GPU_LOAD(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2");
    GPU_LOAD(StreamSynchronize, "cuStreamSynchronize");
    GPU_LOAD(CtxSynchronize, "cuCtxSynchronize");
    gpu_result r = gpu.Init(0);
    if (r != 0) {
        char why[160];
        snprintf(why, sizeof why, "cuInit: %s", gpu_error_name(r));
        gpu_skip(why);
    }
    int count = 0;
    r = gpu.DeviceGetCount(&count);
    if (r != 0 || count <= gpu.ordinal) {
        char why[160];
        snprintf(why, sizeof why, "cuDeviceGetCount: %s, %d devices", gpu_error_name(r), count);
        gpu_skip(why);
    }
    REQUIRE(gpu.DeviceGet(&gpu.device, gpu.ordinal) == 0);
    REQUIRE(gpu.DevicePrimaryCtxRetain(&gpu.ctx, gpu.device) == 0);
    REQUIRE(gpu.CtxSetCurrent(gpu.ctx) == 0);
    if (getenv("TP_GPU_PROBE")) {
        printf("probe: CUDA device %d present\n", gpu.ordinal);
        exit(0);
    }
}

/* Call on every thread of the test before its own driver calls. */
static inline void gpu_bind_thread(void) { REQUIRE(gpu.CtxSetCurrent(gpu.ctx) == 0); }

static inline void gpu_fini(void) {
    gpu.CtxSetCurrent(NULL);
    gpu.DevicePrimaryCtxRelease(gpu.device);
}

/* A driver call the test relies on. */
#define GPU_OK(expr)                                                                                       \
    do {                                                                                                   \
        gpu_result gpu_r_ = (expr);                                                                        \
        if (gpu_r_ != 0) {                                                                                 \
            check_count_failure_();                                                                        \
            fprintf(stderr, "%s:%d: %s failed: %s (%d)\n", __FILE__, __LINE__, #expr, gpu_error_name(gpu_r_), \
                    gpu_r_);                                                                               \
        }                                                                                                  \
    } while (0)

static inline uint64_t gpu_free_bytes(void) {
    size_t free_bytes = 0, total = 0;
    GPU_OK(gpu.MemGetInfo(&free_bytes, &total));
    return free_bytes;
}

static inline gpu_ptr gpu_addr(const void *p) { return (gpu_ptr)(uintptr_t)p; }

/* Copies [p, p+bytes) back and counts the bytes that differ from value
 * (first mismatch offset in *first_bad when any). Synchronous on stream. */
static inline uint64_t gpu_count_mismatch(gpu_ptr p, uint64_t bytes, unsigned char value, tp_stream stream,
                                          uint64_t *first_bad) {
    const uint64_t chunk = 64u << 20;
    size_t buf_bytes = (size_t)(bytes < chunk ? bytes : chunk);
    unsigned char *buf = malloc(buf_bytes ? buf_bytes : 1);
    REQUIRE(buf != NULL);
    uint64_t bad = 0;
    for (uint64_t off = 0; off < bytes; off += buf_bytes) {
        size_t n = (size_t)(bytes - off < buf_bytes ? bytes - off : buf_bytes);
        memset(buf, value ^ 0x5a, n);
        GPU_OK(gpu.MemcpyDtoHAsync(buf, p + off, n, (gpu_stream)stream));
        GPU_OK(gpu.StreamSynchronize((gpu_stream)stream));
        for (size_t i = 0; i < n; i++) {
            if (buf[i] != value) {
                if (!bad && first_bad) *first_bad = off + i;
                bad++;
            }
        }
    }
    free(buf);
    return bad;
}

static inline double gpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Loads the driver's memset and copy code and settles its own memory use, so
 * that free-memory figures taken afterwards move only with the test. */
static inline void gpu_warmup(void) {
    gpu_ptr p = 0;
    GPU_OK(gpu.MemAlloc(&p, 2u << 20));
    GPU_OK(gpu.MemsetD8Async(p, 1, 2u << 20, NULL));
    (void)gpu_count_mismatch(p, 4096, 1, TP_STREAM_DEFAULT, NULL);
    GPU_OK(gpu.MemFree(p));
}

/* Opens spec (the library's view of the same device) or ends the test
 * (the process, outside the runner). */
static inline tp_device *gpu_open(const char *spec, test_log *log) {
    tp_device_config dc = {.log = test_log_fn, .log_user = log, .log_level = TP_LOG_INFO};
    tp_device *dev = NULL;
    tp_status st = tp_device_open(spec, &dc, &dev);
    if (st != TP_OK) fprintf(stderr, "tp_device_open(\"%s\") failed: %s\n", spec, tp_status_name(st));
    REQUIRE(st == TP_OK);
    return dev;
}

/* Graphs of memset nodes built with the driver API, for the graph tests. */
typedef struct gpu_graph_st *gpu_graph;
typedef struct gpu_graph_node_st *gpu_graph_node;
typedef struct gpu_memset_params {
    gpu_ptr dst;
    size_t pitch;
    unsigned int value;
    unsigned int elementSize;
    size_t width;
    size_t height;
} gpu_memset_params;

typedef struct gpu_graph_api {
    gpu_result (*Create)(gpu_graph *, unsigned);
    gpu_result (*Destroy)(gpu_graph);
    gpu_result (*AddMemsetNode)(gpu_graph_node *, gpu_graph, const gpu_graph_node *, size_t,
                                const gpu_memset_params *, gpu_context);
} gpu_graph_api;

static gpu_graph_api gpu_graphs;

/* Loads the graph entry points; false if the driver has none. */
static inline bool gpu_graphs_load(void) {
    void *sym = dlsym(gpu.lib, "cuGraphCreate");
    if (!sym) return false;
    memcpy(&gpu_graphs.Create, &sym, sizeof sym);
    sym = gpu_sym("cuGraphDestroy");
    memcpy(&gpu_graphs.Destroy, &sym, sizeof sym);
    sym = gpu_sym("cuGraphAddMemsetNode");
    memcpy(&gpu_graphs.AddMemsetNode, &sym, sizeof sym);
    return true;
}

/* A graph of `nodes` memset nodes over 4 KiB pieces of dst (node i writes
 * piece i modulo 256), in a chain (chain != 0) or all independent. */
static inline gpu_graph gpu_memset_graph(gpu_ptr dst, int nodes, unsigned value, int chain) {
    gpu_graph g = NULL;
    GPU_OK(gpu_graphs.Create(&g, 0));
    gpu_graph_node prev = NULL;
    for (int i = 0; i < nodes; i++) {
        gpu_memset_params p = {.dst = dst + (gpu_ptr)(i % 256) * 4096, .pitch = 0, .value = value,
                               .elementSize = 1, .width = 4096, .height = 1};
        gpu_graph_node n = NULL;
        GPU_OK(gpu_graphs.AddMemsetNode(&n, g, chain && prev ? &prev : NULL, chain && prev ? 1 : 0, &p, gpu.ctx));
        prev = n;
    }
    return g;
}

#endif
