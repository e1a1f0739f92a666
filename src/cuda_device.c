/* SPDX-License-Identifier: MIT */
/*
 * cuda_device.c -- the CUDA backend: the driver API, loaded at run time.
 *
 * Loading: dlopen("libcuda.so.1") and dlsym of each entry point, by the
 * versioned name where the ABI has several (cuMemAlloc_v2, cuMemGetInfo_v2,
 * cuStreamDestroy_v2, ...). No CUDA header and no link-time dependency: the
 * few types, enum values and struct layouts the backend needs are declared
 * below and checked against cuda.h (CUDA 13.0) by size. A missing library,
 * a missing required symbol, a failing cuInit or a missing device make
 * tp_device_open return TP_ERR_NO_DEVICE with the reason in the log. The
 * library is never dlclose'd: the driver keeps threads and state that must
 * not be unloaded under it (the CUDA runtime does the same); a second open
 * only takes another reference.
 *
 * Context: the device's primary context is retained at open and released at
 * close. Every op runs inside ctx_enter/ctx_exit: if another context (or
 * none) is current on the calling thread, the primary context is made
 * current for the call and the caller's context is restored afterwards, so
 * pools work from any thread and never change what a host program
 * (cudaSetDevice, its own driver calls) sees as current.
 *
 * Streams and events are the driver's, passed through: a tp_stream is a
 * CUstream (TP_STREAM_DEFAULT = NULL = the legacy default stream), a
 * tp_event a CUevent (CU_EVENT_DISABLE_TIMING). The plain, non-_ptsz entry
 * points are used, so the special handles CU_STREAM_LEGACY and
 * CU_STREAM_PER_THREAD work when a caller passes them. stream_capturing
 * asks cuStreamIsCapturing (optional: without it, nothing captures); an
 * active or an invalidated capture both read as capturing.
 *
 * Stream capture modes: every op's driver calls but the capture query run
 * with the calling thread's capture mode relaxed
 * (cuThreadExchangeStreamCaptureMode, restored after the op; see
 * ctx_enter_relaxed). Under the default (global) mode, while any thread
 * captures a stream in global mode, a call capture counts as unsafe
 * (allocating, freeing, mapping, synchronising, querying an event, ...)
 * fails and invalidates that capture: a pool growing for its own capture,
 * or a tick or another stream's allocation on any other thread, would
 * break a PyTorch graph capture (test_gpu_capture: without this, the
 * capture is invalidated and the pool's allocations fail).
 *
 * VMM: map(va, bytes, chunk_bytes) backs each chunk of the run (chunk_bytes
 * from va, the last one shorter; 0: one page of the device's granularity)
 * with its own physical allocation (cuMemCreate, pinned device memory),
 * maps each chunk (cuMemMap) and grants read/write access to the run in one
 * cuMemSetAccess. The driver's cost is per allocation (on an H200 about
 * 10 us create, 28 us set access, 18 us unmap, 11 us release, whatever the
 * size), hence chunks. Every page's chunk handle goes into a page table,
 * the project's hash map (tpi_map.h) from page number (address >>
 * page_shift, so that the key's low bits vary) to handle, in the device's
 * host memory; a chunk is a maximal stretch of pages with one handle.
 * unmap(va, bytes) takes the handles of any run of mapped pages made of
 * whole chunks out of the table (all of them present and no chunk cut, or
 * nothing happens), unmaps each chunk (cuMemUnmap) and then releases each
 * handle (cuMemRelease). Both are all-or-nothing: a map that
 * fails part way unmaps and releases what it did; an unmap that fails part
 * way maps the pages it had unmapped back and puts their handles back.
 * Reservations (cuMemAddressReserve/Free) are tracked with a count of the
 * pages mapped inside them: map outside a reservation, over mapped pages,
 * and va_release of a reservation with pages still mapped are refused with
 * TP_ERR_INVALID_ARGUMENT before the driver is called, as the simulator
 * does.
 *
 * Graphs: instantiate (cuGraphInstantiateWithFlags, or cuGraphInstantiate_v2
 * on drivers without it) reports what it cost as the drop of cuMemGetInfo's
 * free memory around the call, 0 when that could not be measured (the
 * caller then estimates). The measure lock is a reader/writer lock:
 * instantiation takes it exclusively, every other op that changes device
 * memory (map, unmap, mem_alloc, mem_free, graph update and destroy) takes
 * it shared, so the backend's own allocations never disturb a measurement
 * and never wait for each other. Another process or the host program's own
 * allocations can still disturb it; a rise of free memory reads as 0.
 * cuGraphExecUpdate_v2 failures (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, for
 * any reason: topology, node type, parameters) become
 * TP_ERR_TOPOLOGY_MISMATCH -- the executable cannot take the graph, make a
 * new one -- with the driver's reason in the log.
 *
 * Errors: a failing driver call becomes a status (CUDA_ERROR_OUT_OF_MEMORY
 * -> TP_ERR_OUT_OF_MEMORY, CUDA_ERROR_NOT_READY -> TP_NOT_READY without a
 * message, invalid value/handle -> TP_ERR_INVALID_ARGUMENT, not supported ->
 * TP_ERR_UNSUPPORTED, stream capture errors -> TP_ERR_CAPTURE, anything else
 * -> TP_ERR_DEVICE) and a log line naming the call and the driver's error
 * name (cuGetErrorName). Nothing aborts, exits or prints.
 *
 * Invariants: every key of the page table is the number of a page inside
 * exactly one reservation, mapped to the device with read/write access and
 * backed by the handle stored with it; a reservation's mapped_pages equals
 * the table's keys inside it.
 *
 * Locking: table_lock guards the page table and the reservations and is
 * never held across a slow driver call except in va_release (rare). Lock
 * order: measure_lock, then table_lock. The function table is written once
 * at open and only read afterwards. All ops may be called from any thread.
 */
#include "internal.h"
#include "tpi_map.h"

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* ------------------------------------------------------ driver declarations */

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef struct CUgraphNode_st *CUgraphNode;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_INVALID_HANDLE = 400,
    CUDA_ERROR_NOT_READY = 600,
    CUDA_ERROR_NOT_SUPPORTED = 801,
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900,    /* 900..908: stream capture */
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906,
    CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD = 908,
    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE = 910,
};

enum { CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED = 102 };
enum { CU_STREAM_NON_BLOCKING = 0x1 };
enum { CU_EVENT_DISABLE_TIMING = 0x2 };
enum { CU_MEM_ALLOCATION_TYPE_PINNED = 0x1 };
enum { CU_MEM_HANDLE_TYPE_NONE = 0x0 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 0x1 };
enum { CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3 };
enum { CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0 };
enum { CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED = 0x2 };
/* CUstreamCaptureStatus */
enum { CU_STREAM_CAPTURE_STATUS_NONE = 0, CU_STREAM_CAPTURE_STATUS_ACTIVE = 1, CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2 };
enum { CU_STREAM_CAPTURE_MODE_RELAXED = 2 }; /* CUstreamCaptureMode */

/* Layouts as in cuda.h (CUmemLocation_v1, CUmemAllocationProp_v1,
 * CUmemAccessDesc_v1, CUgraphExecUpdateResultInfo_v1); enums are int-sized. */
typedef struct CUmemLocation {
    int type;
    int id;
} CUmemLocation;

typedef struct CUmemAllocationProp {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;

typedef struct CUmemAccessDesc {
    CUmemLocation location;
    int flags; /* CUmemAccess_flags */
} CUmemAccessDesc;

typedef struct CUgraphExecUpdateResultInfo {
    int result; /* CUgraphExecUpdateResult */
    CUgraphNode errorNode;
    CUgraphNode errorFromNode;
} CUgraphExecUpdateResultInfo;

_Static_assert(sizeof(CUmemLocation) == 8, "CUmemLocation layout");
_Static_assert(sizeof(CUmemAllocationProp) == 16 + 2 * sizeof(void *), "CUmemAllocationProp layout");
_Static_assert(offsetof(CUmemAllocationProp, win32HandleMetaData) == 16, "CUmemAllocationProp layout");
_Static_assert(sizeof(CUmemAccessDesc) == 12, "CUmemAccessDesc layout");
_Static_assert(sizeof(CUgraphExecUpdateResultInfo) == 3 * sizeof(void *), "CUgraphExecUpdateResultInfo layout");

/* The entry points. Required ones fail the open when missing; VMM and graph
 * ones only disable what needs them. */
typedef struct cu_api {
    CUresult (*Init)(unsigned int flags);
    CUresult (*DriverGetVersion)(int *version);
    CUresult (*GetErrorName)(CUresult error, const char **name);
    CUresult (*DeviceGetCount)(int *count);
    CUresult (*DeviceGet)(CUdevice *device, int ordinal);
    CUresult (*DeviceGetName)(char *name, int len, CUdevice device);
    CUresult (*DeviceTotalMem)(size_t *bytes, CUdevice device);
    CUresult (*DeviceGetAttribute)(int *value, int attribute, CUdevice device);
    CUresult (*DevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice device);
    CUresult (*DevicePrimaryCtxRelease)(CUdevice device);
    CUresult (*CtxGetCurrent)(CUcontext *ctx);
    CUresult (*CtxSetCurrent)(CUcontext ctx);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*MemAlloc)(CUdeviceptr *ptr, size_t bytes);
    CUresult (*MemFree)(CUdeviceptr ptr);
    CUresult (*StreamCreate)(CUstream *stream, unsigned int flags);
    CUresult (*StreamDestroy)(CUstream stream);
    CUresult (*StreamSynchronize)(CUstream stream);
    CUresult (*StreamWaitEvent)(CUstream stream, CUevent event, unsigned int flags);
    CUresult (*EventCreate)(CUevent *event, unsigned int flags);
    CUresult (*EventDestroy)(CUevent event);
    CUresult (*EventRecord)(CUevent event, CUstream stream);
    CUresult (*EventQuery)(CUevent event);
    CUresult (*EventSynchronize)(CUevent event);
    CUresult (*StreamIsCapturing)(CUstream stream, int *status); /* optional; status: CUstreamCaptureStatus */
    CUresult (*ThreadExchangeStreamCaptureMode)(int *mode);      /* optional; mode: CUstreamCaptureMode */
    /* VMM */
    CUresult (*MemAddressReserve)(CUdeviceptr *ptr, size_t bytes, size_t alignment, CUdeviceptr addr,
                                  unsigned long long flags);
    CUresult (*MemAddressFree)(CUdeviceptr ptr, size_t bytes);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                          unsigned long long flags);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle handle);
    CUresult (*MemMap)(CUdeviceptr ptr, size_t bytes, size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long flags);
    CUresult (*MemUnmap)(CUdeviceptr ptr, size_t bytes);
    CUresult (*MemSetAccess)(CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc *desc, size_t count);
    CUresult (*MemGetAllocationGranularity)(size_t *granularity, const CUmemAllocationProp *prop, int option);
    /* graphs */
    CUresult (*GraphInstantiateWithFlags)(CUgraphExec *exec, CUgraph graph, unsigned long long flags);
    CUresult (*GraphInstantiateV2)(CUgraphExec *exec, CUgraph graph, CUgraphNode *error_node, char *log,
                                   size_t log_bytes);
    CUresult (*GraphExecUpdateV2)(CUgraphExec exec, CUgraph graph, CUgraphExecUpdateResultInfo *info);
    CUresult (*GraphExecUpdateV1)(CUgraphExec exec, CUgraph graph, CUgraphNode *error_node, int *result);
    CUresult (*GraphLaunch)(CUgraphExec exec, CUstream stream);
    CUresult (*GraphExecDestroy)(CUgraphExec exec);
    CUresult (*GraphGetNodes)(CUgraph graph, CUgraphNode *nodes, size_t *count);
} cu_api;

enum { SYM_REQUIRED, SYM_VMM, SYM_OPTIONAL };

typedef struct cu_symbol {
    const char *names[2]; /* the first the library has wins; same ABI */
    size_t offset;
    int need;
} cu_symbol;

#define CU_SYM(field, need, ...) {{__VA_ARGS__}, offsetof(cu_api, field), need}

static const cu_symbol cu_symbols[] = {
    CU_SYM(Init, SYM_REQUIRED, "cuInit"),
    CU_SYM(DriverGetVersion, SYM_REQUIRED, "cuDriverGetVersion"),
    CU_SYM(GetErrorName, SYM_REQUIRED, "cuGetErrorName"),
    CU_SYM(DeviceGetCount, SYM_REQUIRED, "cuDeviceGetCount"),
    CU_SYM(DeviceGet, SYM_REQUIRED, "cuDeviceGet"),
    CU_SYM(DeviceGetName, SYM_REQUIRED, "cuDeviceGetName"),
    CU_SYM(DeviceTotalMem, SYM_REQUIRED, "cuDeviceTotalMem_v2"),
    CU_SYM(DeviceGetAttribute, SYM_REQUIRED, "cuDeviceGetAttribute"),
    CU_SYM(DevicePrimaryCtxRetain, SYM_REQUIRED, "cuDevicePrimaryCtxRetain"),
    CU_SYM(DevicePrimaryCtxRelease, SYM_REQUIRED, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"),
    CU_SYM(CtxGetCurrent, SYM_REQUIRED, "cuCtxGetCurrent"),
    CU_SYM(CtxSetCurrent, SYM_REQUIRED, "cuCtxSetCurrent"),
    CU_SYM(CtxSynchronize, SYM_REQUIRED, "cuCtxSynchronize"),
    CU_SYM(MemGetInfo, SYM_REQUIRED, "cuMemGetInfo_v2"),
    CU_SYM(MemAlloc, SYM_REQUIRED, "cuMemAlloc_v2"),
    CU_SYM(MemFree, SYM_REQUIRED, "cuMemFree_v2"),
    CU_SYM(StreamCreate, SYM_REQUIRED, "cuStreamCreate"),
    CU_SYM(StreamDestroy, SYM_REQUIRED, "cuStreamDestroy_v2", "cuStreamDestroy"),
    CU_SYM(StreamSynchronize, SYM_REQUIRED, "cuStreamSynchronize"),
    CU_SYM(StreamWaitEvent, SYM_REQUIRED, "cuStreamWaitEvent"),
    CU_SYM(EventCreate, SYM_REQUIRED, "cuEventCreate"),
    CU_SYM(EventDestroy, SYM_REQUIRED, "cuEventDestroy_v2", "cuEventDestroy"),
    CU_SYM(EventRecord, SYM_REQUIRED, "cuEventRecord"),
    CU_SYM(EventQuery, SYM_REQUIRED, "cuEventQuery"),
    CU_SYM(EventSynchronize, SYM_REQUIRED, "cuEventSynchronize"),
    CU_SYM(StreamIsCapturing, SYM_OPTIONAL, "cuStreamIsCapturing"),
    CU_SYM(ThreadExchangeStreamCaptureMode, SYM_OPTIONAL, "cuThreadExchangeStreamCaptureMode"),
    CU_SYM(MemAddressReserve, SYM_VMM, "cuMemAddressReserve"),
    CU_SYM(MemAddressFree, SYM_VMM, "cuMemAddressFree"),
    CU_SYM(MemCreate, SYM_VMM, "cuMemCreate"),
    CU_SYM(MemRelease, SYM_VMM, "cuMemRelease"),
    CU_SYM(MemMap, SYM_VMM, "cuMemMap"),
    CU_SYM(MemUnmap, SYM_VMM, "cuMemUnmap"),
    CU_SYM(MemSetAccess, SYM_VMM, "cuMemSetAccess"),
    CU_SYM(MemGetAllocationGranularity, SYM_VMM, "cuMemGetAllocationGranularity"),
    CU_SYM(GraphInstantiateWithFlags, SYM_OPTIONAL, "cuGraphInstantiateWithFlags"),
    CU_SYM(GraphInstantiateV2, SYM_OPTIONAL, "cuGraphInstantiate_v2"),
    CU_SYM(GraphExecUpdateV2, SYM_OPTIONAL, "cuGraphExecUpdate_v2"),
    CU_SYM(GraphExecUpdateV1, SYM_OPTIONAL, "cuGraphExecUpdate"),
    CU_SYM(GraphLaunch, SYM_OPTIONAL, "cuGraphLaunch"),
    CU_SYM(GraphExecDestroy, SYM_OPTIONAL, "cuGraphExecDestroy"),
    CU_SYM(GraphGetNodes, SYM_OPTIONAL, "cuGraphGetNodes"),
};

/* ----------------------------------------------------------------- state */

typedef struct cu_reservation {
    uint64_t va;
    uint64_t bytes;
    uint64_t mapped_pages;
} cu_reservation;

typedef struct cuda_device {
    tp_device *device;
    void *library;
    cu_api api;
    int ordinal;
    CUdevice dev;
    CUcontext ctx;
    bool vmm;            /* VMM ops enabled */
    bool graphs;         /* instantiate/launch/destroy available */
    uint64_t page_bytes; /* mapping granularity: one physical allocation each */
    uint32_t page_shift;
    CUmemAllocationProp prop;
    CUmemAccessDesc access;

    pthread_rwlock_t measure_lock;
    pthread_mutex_t table_lock;
    tpi_map pages; /* page number -> CUmemGenericAllocationHandle */
    cu_reservation *reservations;
    size_t reservation_count, reservation_capacity;
} cuda_device;

static cuda_device *cu_of(tp_device *device) { return (cuda_device *)device->impl; }

/* ---------------------------------------------------------------- errors */

static tp_status status_of(CUresult r) {
    switch (r) {
    case CUDA_SUCCESS: return TP_OK;
    case CUDA_ERROR_NOT_READY: return TP_NOT_READY;
    case CUDA_ERROR_OUT_OF_MEMORY: return TP_ERR_OUT_OF_MEMORY;
    case CUDA_ERROR_INVALID_VALUE:
    case CUDA_ERROR_INVALID_HANDLE: return TP_ERR_INVALID_ARGUMENT;
    case CUDA_ERROR_NOT_SUPPORTED: return TP_ERR_UNSUPPORTED;
    default:
        if (r >= CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED && r <= CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD)
            return TP_ERR_CAPTURE;
        return TP_ERR_DEVICE;
    }
}

static const char *error_name(const cu_api *api, CUresult r) {
    const char *name = NULL;
    if (api->GetErrorName && api->GetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
    /* The stub library and very old drivers name nothing: the common ones. */
    switch (r) {
    case 1: return "CUDA_ERROR_INVALID_VALUE";
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 3: return "CUDA_ERROR_NOT_INITIALIZED";
    case 4: return "CUDA_ERROR_DEINITIALIZED";
    case 34: return "CUDA_ERROR_STUB_LIBRARY";
    case 35: return "CUDA_ERROR_INSUFFICIENT_DRIVER";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 801: return "CUDA_ERROR_NOT_SUPPORTED";
    case 803: return "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return "unknown CUDA error";
    }
}

/* The status for a driver result; failures are logged with the call's name
 * and the driver's error name. NOT_READY is a state, not a failure. */
static tp_status cu_check(cuda_device *cu, CUresult r, const char *call) {
    if (r == CUDA_SUCCESS) return TP_OK;
    if (r == CUDA_ERROR_NOT_READY) return TP_NOT_READY;
    tp_status st = status_of(r);
    tpi_logf(&cu->device->logger, st == TP_ERR_OUT_OF_MEMORY ? TP_LOG_WARN : TP_LOG_ERROR,
            "cuda:%d: %s failed: %s (%d) -> %s", cu->ordinal, call, error_name(&cu->api, r), r, tp_status_name(st));
    return st;
}

/* --------------------------------------------------------------- context */

typedef struct ctx_scope {
    CUcontext saved;
    bool switched;
    bool relaxed;    /* the thread's capture mode was switched to relaxed */
    int saved_mode;  /* ... and was this before */
} ctx_scope;

/* Makes the device's primary context current on this thread for the call. */
static tp_status ctx_enter(cuda_device *cu, ctx_scope *scope) {
    scope->saved = NULL;
    scope->switched = false;
    scope->relaxed = false;
    tp_status st = cu_check(cu, cu->api.CtxGetCurrent(&scope->saved), "cuCtxGetCurrent");
    if (st != TP_OK || scope->saved == cu->ctx) return st;
    st = cu_check(cu, cu->api.CtxSetCurrent(cu->ctx), "cuCtxSetCurrent");
    scope->switched = st == TP_OK;
    return st;
}

/* ctx_enter, and the thread's stream-capture mode relaxed for the call.
 * Under the default (global) mode a call that stream capture counts as
 * potentially unsafe (allocating, freeing, mapping, synchronising,
 * instantiating, querying or recording an event, ...) fails, and
 * invalidates the capture, while any thread captures a stream in global
 * mode -- and in any mode on a thread that is capturing itself. The pool
 * makes such calls on purpose while streams capture (growing for a
 * capture's own requests; a tick or another stream's allocations on other
 * threads) and never gives back memory a capture may use, which is the
 * caution the modes exist for; PyTorch's allocator relaxes its cudaMalloc
 * in a capture the same way. Relaxed still refuses what necessarily
 * conflicts with a capture (querying an event recorded inside one), which
 * the callers never do. A driver without the entry point (before CUDA
 * 10.1) has no modes: nothing to do. */
static tp_status ctx_enter_relaxed(cuda_device *cu, ctx_scope *scope) {
    tp_status st = ctx_enter(cu, scope);
    if (st != TP_OK || !cu->api.ThreadExchangeStreamCaptureMode) return st;
    scope->saved_mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    scope->relaxed = cu->api.ThreadExchangeStreamCaptureMode(&scope->saved_mode) == CUDA_SUCCESS;
    return st;
}

/* Gives the thread back the context (and capture mode) it had before
 * ctx_enter (or ctx_enter_relaxed). */
static void ctx_exit(cuda_device *cu, const ctx_scope *scope) {
    if (scope->relaxed) {
        int mode = scope->saved_mode;
        cu_check(cu, cu->api.ThreadExchangeStreamCaptureMode(&mode),
                 "cuThreadExchangeStreamCaptureMode (restoring the caller's mode)");
    }
    if (scope->switched)
        cu_check(cu, cu->api.CtxSetCurrent(scope->saved), "cuCtxSetCurrent (restoring the caller's context)");
}

/* Runs one driver call with the context current: enter (ctx_enter or
 * ctx_enter_relaxed), expr, ctx_exit, then cu_check of expr's result under
 * call_name. st gets the status (that of the enter when it failed: expr is
 * not evaluated then). */
#define CU_DO_WITH(enter, cu, call_name, expr, st)        \
    do {                                                  \
        ctx_scope scope_;                                 \
        (st) = enter((cu), &scope_);                      \
        if ((st) == TP_OK) {                              \
            CUresult result_ = (expr);                    \
            ctx_exit((cu), &scope_);                      \
            (st) = cu_check((cu), result_, (call_name));  \
        }                                                 \
    } while (0)
#define CU_DO(cu, call_name, expr, st) CU_DO_WITH(ctx_enter, cu, call_name, expr, st)
/* ... for the potentially unsafe calls (ctx_enter_relaxed). */
#define CU_DO_RELAXED(cu, call_name, expr, st) CU_DO_WITH(ctx_enter_relaxed, cu, call_name, expr, st)

/* ------------------------------------------------------------ page table */

/* The key of page i of the run at va: its page number. Page-aligned
 * addresses end in page_shift zero bits, which tpi_map's hash would carry
 * into the low bits of the home slot; page numbers do not. */
static uint64_t page_key(const cuda_device *cu, uint64_t va, size_t i) { return (va >> cu->page_shift) + i; }

/* Whether none of the run's pages is in the table. Caller holds table_lock. */
static bool pages_absent(cuda_device *cu, uint64_t va, size_t pages) {
    for (size_t i = 0; i < pages; i++)
        if (tpi_map_get(&cu->pages, page_key(cu, va, i), NULL)) return false;
    return true;
}

/* Puts the run's handles into the table: all of them, or none (false) when
 * host memory runs out. Caller holds table_lock. */
static bool pages_put(cuda_device *cu, uint64_t va, size_t pages, const CUmemGenericAllocationHandle *handles) {
    if (pages > SIZE_MAX / 4 - cu->pages.count || !tpi_map_reserve(&cu->pages, cu->pages.count + pages)) return false;
    /* The room is reserved: no put below allocates, so none fails. */
    for (size_t i = 0; i < pages; i++) tpi_map_put(&cu->pages, page_key(cu, va, i), handles[i]);
    return true;
}

/* Takes the run's handles out of the table into handles: all of them, or
 * none (false) when a page is missing. Caller holds table_lock. */
static bool pages_take(cuda_device *cu, uint64_t va, size_t pages, CUmemGenericAllocationHandle *handles) {
    for (size_t i = 0; i < pages; i++)
        if (!tpi_map_get(&cu->pages, page_key(cu, va, i), NULL)) return false;
    for (size_t i = 0; i < pages; i++) {
        uint64_t handle = 0;
        tpi_map_remove(&cu->pages, page_key(cu, va, i), &handle);
        handles[i] = handle;
    }
    return true;
}

/* ---------------------------------------------------------- reservations */

/* The reservation holding [va, va+bytes), or NULL. Caller holds table_lock. */
static cu_reservation *reservation_of(cuda_device *cu, uint64_t va, uint64_t bytes) {
    for (size_t i = 0; i < cu->reservation_count; i++) {
        cu_reservation *r = &cu->reservations[i];
        if (va >= r->va && bytes <= r->bytes && va - r->va <= r->bytes - bytes) return r;
    }
    return NULL;
}

/* ------------------------------------------------------------ basic ops */

static tp_status cuda_mem_info(tp_device *device, uint64_t *out_free, uint64_t *out_total) {
    cuda_device *cu = cu_of(device);
    size_t free_bytes = 0, total_bytes = 0;
    tp_status st;
    CU_DO_RELAXED(cu, "cuMemGetInfo_v2", cu->api.MemGetInfo(&free_bytes, &total_bytes), st);
    if (st == TP_OK) {
        *out_free = free_bytes;
        *out_total = total_bytes;
    }
    return st;
}

static tp_status cuda_mem_alloc(tp_device *device, uint64_t bytes, uint64_t *out_address) {
    cuda_device *cu = cu_of(device);
    if (bytes == 0 || bytes > SIZE_MAX) return TP_ERR_INVALID_ARGUMENT;
    CUdeviceptr ptr = 0;
    tp_status st;
    pthread_rwlock_rdlock(&cu->measure_lock);
    CU_DO_RELAXED(cu, "cuMemAlloc_v2", cu->api.MemAlloc(&ptr, (size_t)bytes), st);
    pthread_rwlock_unlock(&cu->measure_lock);
    if (st == TP_OK) *out_address = ptr;
    return st;
}

static tp_status cuda_mem_free(tp_device *device, uint64_t address, uint64_t bytes) {
    cuda_device *cu = cu_of(device);
    (void)bytes;
    if (!address) return TP_ERR_INVALID_ARGUMENT;
    tp_status st;
    pthread_rwlock_rdlock(&cu->measure_lock);
    CU_DO_RELAXED(cu, "cuMemFree_v2", cu->api.MemFree((CUdeviceptr)address), st);
    pthread_rwlock_unlock(&cu->measure_lock);
    return st;
}

static tp_status cuda_stream_create(tp_device *device, tp_stream *out_stream) {
    cuda_device *cu = cu_of(device);
    CUstream stream = NULL;
    tp_status st;
    CU_DO_RELAXED(cu, "cuStreamCreate", cu->api.StreamCreate(&stream, CU_STREAM_NON_BLOCKING), st);
    if (st == TP_OK) *out_stream = (tp_stream)stream;
    return st;
}

static tp_status cuda_stream_destroy(tp_device *device, tp_stream stream) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuStreamDestroy_v2", cu->api.StreamDestroy((CUstream)stream), st);
    return st;
}

static tp_status cuda_stream_synchronize(tp_device *device, tp_stream stream) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuStreamSynchronize", cu->api.StreamSynchronize((CUstream)stream), st);
    return st;
}

static tp_status cuda_stream_wait_event(tp_device *device, tp_stream stream, tp_event event) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuStreamWaitEvent", cu->api.StreamWaitEvent((CUstream)stream, (CUevent)event, 0), st);
    return st;
}

/* cuStreamIsCapturing. An invalidated capture counts as capturing (the
 * stream is still in capture mode until cuStreamEndCapture: hands off), as
 * does the legacy stream while a global-mode capture forbids its use
 * (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT). A driver without the entry point
 * (before CUDA 10) cannot capture at all. */
static tp_status cuda_stream_capturing(tp_device *device, tp_stream stream, bool *out_capturing) {
    cuda_device *cu = cu_of(device);
    *out_capturing = false;
    if (!cu->api.StreamIsCapturing) return TP_OK;
    int status = CU_STREAM_CAPTURE_STATUS_NONE;
    ctx_scope scope;
    tp_status st = ctx_enter(cu, &scope);
    if (st != TP_OK) return st;
    CUresult r = cu->api.StreamIsCapturing((CUstream)stream, &status);
    ctx_exit(cu, &scope);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        *out_capturing = true;
        return TP_OK;
    }
    st = cu_check(cu, r, "cuStreamIsCapturing");
    if (st == TP_OK)
        *out_capturing =
            status == CU_STREAM_CAPTURE_STATUS_ACTIVE || status == CU_STREAM_CAPTURE_STATUS_INVALIDATED;
    return st;
}

static tp_status cuda_event_create(tp_device *device, tp_event *out_event) {
    cuda_device *cu = cu_of(device);
    CUevent event = NULL;
    tp_status st;
    CU_DO_RELAXED(cu, "cuEventCreate", cu->api.EventCreate(&event, CU_EVENT_DISABLE_TIMING), st);
    if (st == TP_OK) *out_event = (tp_event)event;
    return st;
}

static tp_status cuda_event_destroy(tp_device *device, tp_event event) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuEventDestroy_v2", cu->api.EventDestroy((CUevent)event), st);
    return st;
}

static tp_status cuda_event_record(tp_device *device, tp_event event, tp_stream stream) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuEventRecord", cu->api.EventRecord((CUevent)event, (CUstream)stream), st);
    return st;
}

static tp_status cuda_event_query(tp_device *device, tp_event event) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuEventQuery", cu->api.EventQuery((CUevent)event), st);
    return st;
}

static tp_status cuda_event_synchronize(tp_device *device, tp_event event) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuEventSynchronize", cu->api.EventSynchronize((CUevent)event), st);
    return st;
}

static tp_status cuda_device_synchronize(tp_device *device) {
    cuda_device *cu = cu_of(device);
    tp_status st;
    CU_DO_RELAXED(cu, "cuCtxSynchronize", cu->api.CtxSynchronize(), st);
    return st;
}

/* The clock of idle ages (pools: 100 ms and more; graph cache: seconds).
 * The coarse clock (a few ms resolution) is enough and is read without a
 * precise timer read: on the H200 host CLOCK_MONOTONIC cost 31 ns a read
 * and the coarse clock 6 ns, against ~60 ns for a whole cached pair. */
static uint64_t cuda_now_ns(tp_device *device) {
    (void)device;
    struct timespec ts;
#ifdef CLOCK_MONOTONIC_COARSE
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &ts) != 0)
#endif
        clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ------------------------------------------------------------------ VMM */

static tp_status cuda_va_reserve(tp_device *device, uint64_t bytes, uint64_t alignment, uint64_t *out_va) {
    cuda_device *cu = cu_of(device);
    if (!cu->vmm) return TP_ERR_UNSUPPORTED;
    uint64_t align = TPI_MAX(alignment, cu->page_bytes);
    if (bytes == 0 || bytes % cu->page_bytes || bytes > SIZE_MAX || !tpi_is_pow2(align)) return TP_ERR_INVALID_ARGUMENT;
    CUdeviceptr va = 0;
    ctx_scope scope;
    tp_status st = ctx_enter_relaxed(cu, &scope);
    if (st != TP_OK) return st;
    st = cu_check(cu, cu->api.MemAddressReserve(&va, (size_t)bytes, (size_t)align, 0, 0), "cuMemAddressReserve");
    if (st == TP_OK) {
        pthread_mutex_lock(&cu->table_lock);
        if (tpi_host_grow(&device->host, (void **)&cu->reservations, sizeof *cu->reservations,
                         &cu->reservation_capacity, cu->reservation_count + 1)) {
            cu->reservations[cu->reservation_count++] = (cu_reservation){va, bytes, 0};
        } else {
            st = TP_ERR_HOST_OUT_OF_MEMORY;
        }
        pthread_mutex_unlock(&cu->table_lock);
        if (st != TP_OK) cu_check(cu, cu->api.MemAddressFree(va, (size_t)bytes), "cuMemAddressFree");
    }
    ctx_exit(cu, &scope);
    if (st == TP_OK) *out_va = va;
    return st;
}

static tp_status cuda_va_release(tp_device *device, uint64_t va, uint64_t bytes) {
    cuda_device *cu = cu_of(device);
    if (!cu->vmm) return TP_ERR_UNSUPPORTED;
    tp_status st = TP_ERR_INVALID_ARGUMENT;
    pthread_mutex_lock(&cu->table_lock);
    for (size_t i = 0; i < cu->reservation_count; i++) {
        cu_reservation *res = &cu->reservations[i];
        if (res->va != va || res->bytes != bytes) continue;
        if (res->mapped_pages) {
            tpi_logf(&device->logger, TP_LOG_ERROR,
                    "cuda:%d: va_release of [0x%llx, +%llu) refused: %llu pages still mapped inside", cu->ordinal,
                    (unsigned long long)va, (unsigned long long)bytes, (unsigned long long)res->mapped_pages);
            break;
        }
        ctx_scope scope;
        st = ctx_enter_relaxed(cu, &scope);
        if (st != TP_OK) break;
        st = cu_check(cu, cu->api.MemAddressFree((CUdeviceptr)va, (size_t)bytes), "cuMemAddressFree");
        ctx_exit(cu, &scope);
        if (st == TP_OK) cu->reservations[i] = cu->reservations[--cu->reservation_count];
        break;
    }
    pthread_mutex_unlock(&cu->table_lock);
    return st;
}

/* A handle array: on the stack for short runs, else from the host. */
#define HANDLE_STACK 64

static CUmemGenericAllocationHandle *handles_get(cuda_device *cu, size_t pages,
                                                 CUmemGenericAllocationHandle *stack) {
    if (pages <= HANDLE_STACK) return stack;
    if (pages > SIZE_MAX / sizeof(CUmemGenericAllocationHandle)) return NULL;
    return tpi_host_alloc(&cu->device->host, pages * sizeof(CUmemGenericAllocationHandle));
}

static void handles_put(cuda_device *cu, size_t pages, CUmemGenericAllocationHandle *handles,
                        CUmemGenericAllocationHandle *stack) {
    if (handles != stack) tpi_host_free(&cu->device->host, handles, pages * sizeof *handles);
}

/* Pages [i, end) of a run whose page handles are handles[]: a chunk is a
 * maximal stretch of pages with the same handle (every cuMemCreate gives
 * a new one). The first page after the chunk that starts at i. */
static size_t chunk_end(const CUmemGenericAllocationHandle *handles, size_t pages, size_t i) {
    size_t end = i + 1;
    while (end < pages && handles[end] == handles[i]) end++;
    return end;
}

/* Unmaps the chunks of the first `mapped` pages and releases those of the
 * first `created` pages (undoing part of a map). Context current, measure
 * lock held. */
static void undo_chunks(cuda_device *cu, uint64_t va, const CUmemGenericAllocationHandle *handles, size_t mapped,
                        size_t created) {
    for (size_t i = 0, end; i < mapped; i = end) {
        end = chunk_end(handles, mapped, i);
        cu_check(cu, cu->api.MemUnmap((CUdeviceptr)(va + i * cu->page_bytes), (size_t)((end - i) * cu->page_bytes)),
                 "cuMemUnmap (undo)");
    }
    for (size_t i = 0, end; i < created; i = end) {
        end = chunk_end(handles, created, i);
        cu_check(cu, cu->api.MemRelease(handles[i]), "cuMemRelease (undo)");
    }
}

/* Do the run's ends fall on chunk boundaries (the page before it and the
 * page after it, where mapped, belong to other chunks)? True when an end
 * is not mapped at all (pages_take then refuses the run). Caller holds
 * table_lock. */
static bool run_is_whole_chunks(cuda_device *cu, uint64_t va, size_t pages) {
    uint64_t first = 0, last = 0, neighbour = 0;
    if (!tpi_map_get(&cu->pages, page_key(cu, va, 0), &first) ||
        !tpi_map_get(&cu->pages, page_key(cu, va, pages - 1), &last))
        return true;
    if (va >= cu->page_bytes && tpi_map_get(&cu->pages, page_key(cu, va - cu->page_bytes, 0), &neighbour) &&
        neighbour == first)
        return false;
    return !(tpi_map_get(&cu->pages, page_key(cu, va, pages), &neighbour) && neighbour == last);
}

static tp_status cuda_map(tp_device *device, uint64_t va, uint64_t bytes, uint64_t chunk_bytes) {
    cuda_device *cu = cu_of(device);
    if (!cu->vmm) return TP_ERR_UNSUPPORTED;
    if (!chunk_bytes) chunk_bytes = cu->page_bytes;
    if (bytes == 0 || va % cu->page_bytes || bytes % cu->page_bytes || chunk_bytes % cu->page_bytes || va + bytes < va)
        return TP_ERR_INVALID_ARGUMENT;
    size_t pages = (size_t)(bytes >> cu->page_shift), chunk_pages = (size_t)(chunk_bytes >> cu->page_shift);

    /* Inside one reservation, and nothing there mapped yet. */
    pthread_mutex_lock(&cu->table_lock);
    bool ok = reservation_of(cu, va, bytes) != NULL && pages_absent(cu, va, pages);
    pthread_mutex_unlock(&cu->table_lock);
    if (!ok) {
        tpi_logf(&device->logger, TP_LOG_ERROR,
                "cuda:%d: map of [0x%llx, +%llu) refused: outside every reservation or over mapped pages", cu->ordinal,
                (unsigned long long)va, (unsigned long long)bytes);
        return TP_ERR_INVALID_ARGUMENT;
    }

    CUmemGenericAllocationHandle stack[HANDLE_STACK];
    CUmemGenericAllocationHandle *handles = handles_get(cu, pages, stack);
    if (!handles) return TP_ERR_HOST_OUT_OF_MEMORY;

    pthread_rwlock_rdlock(&cu->measure_lock);
    ctx_scope scope;
    tp_status st = ctx_enter_relaxed(cu, &scope);
    if (st == TP_OK) {
        /* One physical allocation per chunk, mapped whole; every page of
         * the chunk records its handle. */
        size_t created = 0, mapped = 0; /* pages */
        while (st == TP_OK && created < pages) {
            size_t n = TPI_MIN(chunk_pages, pages - created);
            CUmemGenericAllocationHandle handle = 0;
            st = cu_check(cu, cu->api.MemCreate(&handle, (size_t)(n * cu->page_bytes), &cu->prop, 0), "cuMemCreate");
            if (st != TP_OK) break;
            for (size_t k = 0; k < n; k++) handles[created + k] = handle;
            created += n;
            st = cu_check(cu,
                          cu->api.MemMap((CUdeviceptr)(va + (uint64_t)mapped * cu->page_bytes),
                                         (size_t)(n * cu->page_bytes), 0, handle, 0),
                          "cuMemMap");
            if (st == TP_OK) mapped += n;
        }
        if (st == TP_OK)
            st = cu_check(cu, cu->api.MemSetAccess((CUdeviceptr)va, (size_t)bytes, &cu->access, 1), "cuMemSetAccess");
        if (st == TP_OK) {
            pthread_mutex_lock(&cu->table_lock);
            if (pages_put(cu, va, pages, handles)) {
                cu_reservation *res = reservation_of(cu, va, bytes);
                if (res) res->mapped_pages += pages;
            } else {
                st = TP_ERR_HOST_OUT_OF_MEMORY;
            }
            pthread_mutex_unlock(&cu->table_lock);
        }
        if (st != TP_OK) undo_chunks(cu, va, handles, mapped, created);
        ctx_exit(cu, &scope);
    }
    pthread_rwlock_unlock(&cu->measure_lock);
    handles_put(cu, pages, handles, stack);
    return st;
}

static tp_status cuda_unmap(tp_device *device, uint64_t va, uint64_t bytes) {
    cuda_device *cu = cu_of(device);
    if (!cu->vmm) return TP_ERR_UNSUPPORTED;
    if (bytes == 0 || va % cu->page_bytes || bytes % cu->page_bytes || va + bytes < va) return TP_ERR_INVALID_ARGUMENT;
    size_t pages = (size_t)(bytes >> cu->page_shift);
    CUmemGenericAllocationHandle stack[HANDLE_STACK];
    CUmemGenericAllocationHandle *handles = handles_get(cu, pages, stack);
    if (!handles) return TP_ERR_HOST_OUT_OF_MEMORY;

    /* Claim every page's handle, or none: all mapped, whole chunks. */
    pthread_mutex_lock(&cu->table_lock);
    bool ok = run_is_whole_chunks(cu, va, pages) && pages_take(cu, va, pages, handles);
    if (ok) {
        cu_reservation *res = reservation_of(cu, va, bytes);
        if (res) res->mapped_pages -= TPI_MIN(res->mapped_pages, (uint64_t)pages);
    }
    pthread_mutex_unlock(&cu->table_lock);
    if (!ok) {
        tpi_logf(&device->logger, TP_LOG_ERROR,
                "cuda:%d: unmap of [0x%llx, +%llu) refused: not every page is mapped, or it cuts a physical allocation",
                cu->ordinal, (unsigned long long)va, (unsigned long long)bytes);
        handles_put(cu, pages, handles, stack);
        return TP_ERR_INVALID_ARGUMENT;
    }

    pthread_rwlock_rdlock(&cu->measure_lock);
    ctx_scope scope;
    tp_status st = ctx_enter_relaxed(cu, &scope);
    size_t unmapped = 0; /* pages */
    if (st == TP_OK) {
        while (unmapped < pages) {
            size_t end = chunk_end(handles, pages, unmapped);
            st = cu_check(cu,
                          cu->api.MemUnmap((CUdeviceptr)(va + (uint64_t)unmapped * cu->page_bytes),
                                           (size_t)((end - unmapped) * cu->page_bytes)),
                          "cuMemUnmap");
            if (st != TP_OK) break;
            unmapped = end;
        }
        if (st != TP_OK && unmapped) {
            /* Map back what was unmapped, so the run stays whole. */
            bool restored = true;
            for (size_t i = 0, end; i < unmapped; i = end) {
                end = chunk_end(handles, unmapped, i);
                restored &= cu->api.MemMap((CUdeviceptr)(va + (uint64_t)i * cu->page_bytes),
                                           (size_t)((end - i) * cu->page_bytes), 0, handles[i], 0) == CUDA_SUCCESS;
            }
            restored = restored && cu->api.MemSetAccess((CUdeviceptr)va, (size_t)(unmapped << cu->page_shift),
                                                        &cu->access, 1) == CUDA_SUCCESS;
            if (!restored)
                tpi_logf(&device->logger, TP_LOG_ERROR,
                        "cuda:%d: unmap failed part way and [0x%llx, +%llu) could not be mapped back", cu->ordinal,
                        (unsigned long long)va, (unsigned long long)(unmapped << cu->page_shift));
        }
        if (st == TP_OK) {
            /* The mappings are gone; a failing release leaks memory but
             * leaves the pages unmapped, which is what the caller asked. */
            for (size_t i = 0, end; i < pages; i = end) {
                end = chunk_end(handles, pages, i);
                cu_check(cu, cu->api.MemRelease(handles[i]), "cuMemRelease");
            }
        }
        ctx_exit(cu, &scope);
    }
    pthread_rwlock_unlock(&cu->measure_lock);

    pthread_mutex_lock(&cu->table_lock);
    if (st != TP_OK) {
        /* Put the handles back (this allocates only if taking them shrank
         * the table, or another thread filled it since). */
        if (pages_put(cu, va, pages, handles)) {
            cu_reservation *res = reservation_of(cu, va, bytes);
            if (res) res->mapped_pages += pages;
        } else {
            tpi_logf(&device->logger, TP_LOG_ERROR, "cuda:%d: out of host memory putting back %zu page handles",
                    cu->ordinal, pages);
        }
    }
    pthread_mutex_unlock(&cu->table_lock);
    handles_put(cu, pages, handles, stack);
    return st;
}

/* --------------------------------------------------------------- graphs */

/* Instantiates graph between two cuMemGetInfo reads; *out_bytes gets the
 * drop of free memory, 0 when it could not be measured. Context current,
 * measure lock held exclusively. */
static CUresult instantiate_measured(cuda_device *cu, CUgraph graph, CUgraphExec *out_exec, uint64_t *out_bytes) {
    size_t free_before = 0, free_after = 0, total = 0;
    CUresult r;
    bool measured = cu->api.MemGetInfo(&free_before, &total) == CUDA_SUCCESS;
    if (cu->api.GraphInstantiateWithFlags)
        r = cu->api.GraphInstantiateWithFlags(out_exec, graph, 0);
    else
        r = cu->api.GraphInstantiateV2(out_exec, graph, NULL, NULL, 0);
    measured = measured && cu->api.MemGetInfo(&free_after, &total) == CUDA_SUCCESS;
    *out_bytes = measured && free_before > free_after ? (uint64_t)(free_before - free_after) : 0;
    return r;
}

static tp_status cuda_graph_instantiate(tp_device *device, tp_graph graph, tpi_graph_exec *out_exec,
                                        uint64_t *out_bytes) {
    cuda_device *cu = cu_of(device);
    if (!cu->graphs) return TP_ERR_UNSUPPORTED;
    if (!graph) return TP_ERR_INVALID_ARGUMENT;
    CUgraphExec exec = NULL;
    uint64_t bytes = 0;
    tp_status st;
    pthread_rwlock_wrlock(&cu->measure_lock);
    CU_DO_RELAXED(cu, cu->api.GraphInstantiateWithFlags ? "cuGraphInstantiateWithFlags" : "cuGraphInstantiate_v2",
          instantiate_measured(cu, (CUgraph)graph, &exec, &bytes), st);
    pthread_rwlock_unlock(&cu->measure_lock);
    if (st != TP_OK) return st;
    *out_exec = (tpi_graph_exec)exec;
    *out_bytes = bytes;
    return TP_OK;
}

static const char *update_reason(int result) {
    static const char *const reasons[] = {"success", "error", "topology changed", "node type changed",
                                          "function changed", "parameters changed", "not supported",
                                          "unsupported function change", "attributes changed"};
    return result >= 0 && (size_t)result < sizeof reasons / sizeof reasons[0] ? reasons[result] : "unknown";
}

/* cuGraphExecUpdate_v2 (cuGraphExecUpdate on older drivers). A refusal
 * (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) is an answer, not a failure of the
 * call: it reads as CUDA_SUCCESS with *refused set and the driver's
 * CUgraphExecUpdateResult in *result. Context current. */
static CUresult exec_update(cuda_device *cu, CUgraphExec exec, CUgraph graph, bool *refused, int *result) {
    CUresult r;
    if (cu->api.GraphExecUpdateV2) {
        CUgraphExecUpdateResultInfo info;
        memset(&info, 0, sizeof info);
        r = cu->api.GraphExecUpdateV2(exec, graph, &info);
        *result = info.result;
    } else {
        CUgraphNode error_node = NULL;
        r = cu->api.GraphExecUpdateV1(exec, graph, &error_node, result);
    }
    *refused = r == CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE;
    return *refused ? CUDA_SUCCESS : r;
}

static tp_status cuda_graph_update(tp_device *device, tpi_graph_exec exec, tp_graph graph) {
    cuda_device *cu = cu_of(device);
    if (!cu->api.GraphExecUpdateV2 && !cu->api.GraphExecUpdateV1) return TP_ERR_UNSUPPORTED;
    if (!exec || !graph) return TP_ERR_INVALID_ARGUMENT;
    int result = 0;
    bool refused = false;
    tp_status st;
    pthread_rwlock_rdlock(&cu->measure_lock);
    CU_DO_RELAXED(cu, "cuGraphExecUpdate", exec_update(cu, (CUgraphExec)exec, (CUgraph)graph, &refused, &result), st);
    if (st == TP_OK && refused) {
        tpi_logf(&device->logger, result == CU_GRAPH_EXEC_UPDATE_ERROR_TOPOLOGY_CHANGED ? TP_LOG_DEBUG : TP_LOG_INFO,
                "cuda:%d: graph update refused (%s): a new executable is needed", cu->ordinal, update_reason(result));
        st = TP_ERR_TOPOLOGY_MISMATCH;
    }
    pthread_rwlock_unlock(&cu->measure_lock);
    return st;
}

static tp_status cuda_graph_launch(tp_device *device, tpi_graph_exec exec, tp_stream stream) {
    cuda_device *cu = cu_of(device);
    if (!cu->graphs) return TP_ERR_UNSUPPORTED;
    tp_status st;
    CU_DO_RELAXED(cu, "cuGraphLaunch", cu->api.GraphLaunch((CUgraphExec)exec, (CUstream)stream), st);
    return st;
}

/* Nodes of a graph template (cuGraphGetNodes with no array); 0 if unknown. */
static uint64_t cuda_graph_node_count(tp_device *device, tp_graph graph) {
    cuda_device *cu = cu_of(device);
    size_t count = 0;
    if (!graph || !cu->api.GraphGetNodes) return 0;
    if (cu->api.GraphGetNodes((CUgraph)graph, NULL, &count) != CUDA_SUCCESS) return 0;
    return count;
}

static tp_status cuda_graph_destroy(tp_device *device, tpi_graph_exec exec) {
    cuda_device *cu = cu_of(device);
    if (!cu->graphs) return TP_ERR_UNSUPPORTED;
    tp_status st;
    pthread_rwlock_rdlock(&cu->measure_lock);
    CU_DO_RELAXED(cu, "cuGraphExecDestroy", cu->api.GraphExecDestroy((CUgraphExec)exec), st);
    pthread_rwlock_unlock(&cu->measure_lock);
    return st;
}

/* ------------------------------------------------------------ lifecycle */

static void cuda_free_state(tp_device *device, cuda_device *cu) {
    const tpi_host *host = &device->host;
    tpi_map_destroy(&cu->pages);
    tpi_host_free(host, cu->reservations, cu->reservation_capacity * sizeof *cu->reservations);
    pthread_mutex_destroy(&cu->table_lock);
    pthread_rwlock_destroy(&cu->measure_lock);
    tpi_host_free(host, cu, sizeof *cu);
}

static void cuda_close(tp_device *device) {
    cuda_device *cu = cu_of(device);
    ctx_scope scope;
    bool current = ctx_enter_relaxed(cu, &scope) == TP_OK;
    /* Pools unmap and release everything; anything left is a leak, freed here. */
    if (cu->pages.count || cu->reservation_count)
        tpi_logf(&device->logger, TP_LOG_WARN, "cuda:%d: close with %zu pages still mapped in %zu reservations",
                cu->ordinal, cu->pages.count, cu->reservation_count);
    if (current) {
        /* Chunk by chunk: a page whose predecessor has its handle is inside
         * a chunk already given back from its first page. */
        size_t cursor = 0;
        uint64_t page = 0, handle = 0, other = 0;
        while (tpi_map_next(&cu->pages, &cursor, &page, &handle)) {
            if (page > 0 && tpi_map_get(&cu->pages, page - 1, &other) && other == handle) continue;
            uint64_t pages = 1;
            while (tpi_map_get(&cu->pages, page + pages, &other) && other == handle) pages++;
            cu_check(cu, cu->api.MemUnmap((CUdeviceptr)(page << cu->page_shift), (size_t)(pages << cu->page_shift)),
                     "cuMemUnmap");
            cu_check(cu, cu->api.MemRelease(handle), "cuMemRelease");
        }
        for (size_t i = 0; i < cu->reservation_count; i++)
            cu_check(cu, cu->api.MemAddressFree((CUdeviceptr)cu->reservations[i].va, (size_t)cu->reservations[i].bytes),
                     "cuMemAddressFree");
        ctx_exit(cu, &scope);
    }
    cu_check(cu, cu->api.DevicePrimaryCtxRelease(cu->dev), "cuDevicePrimaryCtxRelease");
    device->impl = NULL;
    cuda_free_state(device, cu);
}

static const tpi_device_ops cuda_ops = {
    .backend = "cuda",
    .close = cuda_close,
    .mem_info = cuda_mem_info,
    .va_reserve = cuda_va_reserve,
    .va_release = cuda_va_release,
    .map = cuda_map,
    .unmap = cuda_unmap,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .stream_wait_event = cuda_stream_wait_event,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .device_synchronize = cuda_device_synchronize,
    .stream_capturing = cuda_stream_capturing,
    .now_ns = cuda_now_ns,
    .check_handout = NULL,
    .graph_instantiate = cuda_graph_instantiate,
    .graph_update = cuda_graph_update,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .graph_node_count = cuda_graph_node_count,
};

/* Resolves the entry points. Returns false (reason logged) when a required
 * one is missing; *out_vmm is false when any VMM one is. */
static bool load_symbols(cuda_device *cu, bool *out_vmm) {
    *out_vmm = true;
    for (size_t i = 0; i < sizeof cu_symbols / sizeof cu_symbols[0]; i++) {
        const cu_symbol *s = &cu_symbols[i];
        void *address = NULL;
        for (int k = 0; k < 2 && !address && s->names[k]; k++) address = dlsym(cu->library, s->names[k]);
        if (address) {
            /* POSIX: a data pointer from dlsym converts to the function pointer. */
            memcpy((char *)&cu->api + s->offset, &address, sizeof address);
        } else if (s->need == SYM_REQUIRED) {
            tpi_logf(&cu->device->logger, TP_LOG_ERROR, "cuda:%d: the CUDA driver lacks %s", cu->ordinal, s->names[0]);
            return false;
        } else if (s->need == SYM_VMM) {
            *out_vmm = false;
            tpi_logf(&cu->device->logger, TP_LOG_INFO, "cuda:%d: the CUDA driver lacks %s: VMM disabled", cu->ordinal,
                    s->names[0]);
        }
    }
    return true;
}

/* Logs why the device cannot be opened; TP_ERR_NO_DEVICE. */
static tp_status no_device(cuda_device *cu, CUresult r, const char *call) {
    tpi_logf(&cu->device->logger, TP_LOG_ERROR, "cuda:%d: %s failed: %s (%d): no CUDA device", cu->ordinal, call,
            error_name(&cu->api, r), r);
    return TP_ERR_NO_DEVICE;
}

/* Opens the driver and the device; fills cu and the device info. On failure
 * the caller releases what cu->ctx holds. */
static tp_status cuda_open(tp_device *device, cuda_device *cu, const tpi_device_options *options) {
    const tpi_logger *logger = &device->logger;
    dlerror();
    cu->library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu->library) {
        const char *why = dlerror();
        tpi_logf(logger, TP_LOG_ERROR, "cuda:%d: cannot load the CUDA driver (libcuda.so.1): %s", cu->ordinal,
                why ? why : "unknown reason");
        return TP_ERR_NO_DEVICE;
    }
    bool vmm_symbols;
    if (!load_symbols(cu, &vmm_symbols)) return TP_ERR_NO_DEVICE;

    CUresult r = cu->api.Init(0);
    if (r != CUDA_SUCCESS) return no_device(cu, r, "cuInit");
    int driver_version = 0, count = 0;
    cu->api.DriverGetVersion(&driver_version);
    r = cu->api.DeviceGetCount(&count);
    if (r != CUDA_SUCCESS) return no_device(cu, r, "cuDeviceGetCount");
    if (cu->ordinal >= count) {
        tpi_logf(logger, TP_LOG_ERROR, "cuda:%d: no such device (%d CUDA device%s present)", cu->ordinal, count,
                count == 1 ? "" : "s");
        return TP_ERR_NO_DEVICE;
    }
    r = cu->api.DeviceGet(&cu->dev, cu->ordinal);
    if (r != CUDA_SUCCESS) return no_device(cu, r, "cuDeviceGet");
    r = cu->api.DevicePrimaryCtxRetain(&cu->ctx, cu->dev);
    if (r != CUDA_SUCCESS) {
        cu->ctx = NULL;
        return no_device(cu, r, "cuDevicePrimaryCtxRetain");
    }

    tp_device_info *info = &device->info;
    memset(info, 0, sizeof *info);
    snprintf(info->backend, sizeof info->backend, "cuda");
    info->ordinal = cu->ordinal;
    if (cu->api.DeviceGetName(info->name, (int)sizeof info->name, cu->dev) != CUDA_SUCCESS)
        snprintf(info->name, sizeof info->name, "CUDA device %d", cu->ordinal);
    info->name[sizeof info->name - 1] = '\0';
    size_t total = 0;
    r = cu->api.DeviceTotalMem(&total, cu->dev);
    if (r != CUDA_SUCCESS) return no_device(cu, r, "cuDeviceTotalMem_v2");
    info->capacity_bytes = total;

    int vmm_attribute = 0;
    if (vmm_symbols &&
        cu->api.DeviceGetAttribute(&vmm_attribute, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu->dev) !=
            CUDA_SUCCESS)
        vmm_attribute = 0;
    memset(&cu->prop, 0, sizeof cu->prop);
    cu->prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    cu->prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    cu->prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    cu->prop.location.id = cu->ordinal;
    cu->access.location = cu->prop.location;
    cu->access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;

    uint64_t granularity = 0;
    if (vmm_attribute) {
        size_t g = 0;
        tp_status st;
        CU_DO(cu, "cuMemGetAllocationGranularity",
              cu->api.MemGetAllocationGranularity(&g, &cu->prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), st);
        (void)st; /* a failure is logged; g is judged below either way */
        if (g && tpi_is_pow2(g)) {
            granularity = g;
        } else {
            tpi_logf(logger, TP_LOG_WARN, "cuda:%d: allocation granularity %zu unusable: VMM disabled", cu->ordinal, g);
            vmm_attribute = 0;
        }
    }
    info->vmm_supported = vmm_attribute != 0;
    info->vmm_enabled = info->vmm_supported && !options->novmm;
    if (!granularity) granularity = 2 * TPI_MiB; /* the page size segment pools still quote */
    if (options->granularity_bytes) {
        /* gran=SIZE: larger pages, each still one physical allocation. */
        if (options->granularity_bytes % granularity) {
            tpi_logf(logger, TP_LOG_ERROR, "cuda:%d: gran=%llu is not a multiple of the driver's granularity %llu",
                    cu->ordinal, (unsigned long long)options->granularity_bytes, (unsigned long long)granularity);
            return TP_ERR_BAD_SPEC;
        }
        granularity = options->granularity_bytes;
    }
    info->granularity_bytes = granularity;
    cu->page_bytes = granularity;
    cu->page_shift = (uint32_t)__builtin_ctzll(granularity);
    cu->vmm = info->vmm_enabled;
    cu->graphs = (cu->api.GraphInstantiateWithFlags || cu->api.GraphInstantiateV2) && cu->api.GraphLaunch &&
                 cu->api.GraphExecDestroy;

    char capacity[32], gran[32];
    tpi_logf(logger, TP_LOG_INFO, "cuda:%d: %s, %s, driver %d.%d, VMM %s, granularity %s%s", cu->ordinal, info->name,
            tp_format_bytes(info->capacity_bytes, capacity, sizeof capacity), driver_version / 1000,
            (driver_version % 1000) / 10,
            info->vmm_enabled ? "on" : info->vmm_supported ? "off (novmm)" : "unsupported",
            tp_format_bytes(granularity, gran, sizeof gran), cu->graphs ? "" : ", no graph support");
    return TP_OK;
}

tp_status tpi_cuda_device_create(tp_device *device, const tpi_device_options *options) {
    cuda_device *cu = tpi_host_calloc(&device->host, 1, sizeof *cu);
    if (!cu) return TP_ERR_HOST_OUT_OF_MEMORY;
    cu->device = device;
    cu->ordinal = options->ordinal;
    tpi_map_init(&cu->pages, &device->host.allocator);
    pthread_rwlockattr_t attr;
    pthread_rwlockattr_init(&attr);
#ifdef __GLIBC__
    /* An instantiation waiting to measure is not starved by a stream of maps. */
    pthread_rwlockattr_setkind_np(&attr, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
    int rc = pthread_rwlock_init(&cu->measure_lock, &attr);
    pthread_rwlockattr_destroy(&attr);
    if (rc != 0) {
        tpi_host_free(&device->host, cu, sizeof *cu);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    if (pthread_mutex_init(&cu->table_lock, NULL) != 0) {
        pthread_rwlock_destroy(&cu->measure_lock);
        tpi_host_free(&device->host, cu, sizeof *cu);
        return TP_ERR_HOST_OUT_OF_MEMORY;
    }
    tp_status st = cuda_open(device, cu, options);
    if (st != TP_OK) {
        if (cu->ctx) cu->api.DevicePrimaryCtxRelease(cu->dev);
        cuda_free_state(device, cu);
        return st;
    }
    device->impl = cu;
    device->ops = &cuda_ops;
    device->hazard_checker = false;
    return TP_OK;
}
