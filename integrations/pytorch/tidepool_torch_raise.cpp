/* SPDX-License-Identifier: MIT */
/*
 * tidepool_torch_raise.cpp -- tp_torch_alloc, the allocation entry point
 * PyTorch calls, in C++ so that an allocation failure can be an exception.
 *
 * Why: PyTorch's CUDAPluggableAllocator does not check what alloc_fn
 * returns. Measured with torch 2.11 on an H200: a NULL from alloc_fn for a
 * 2 GiB request became a tensor with data_ptr() == 0 and no error, so the
 * first kernel to touch it faults. Throwing instead makes the failing call
 * raise in Python (PyTorch turns a std::exception into RuntimeError, whose
 * subclass torch.cuda.OutOfMemoryError its own allocator raises), with
 * tidepool's out-of-memory report as the message; nothing in PyTorch holds
 * a lock or half-made state at that point (alloc_fn is the first thing its
 * malloc calls).
 *
 * PyTorch maps exceptions by their C++ type: only c10::OutOfMemoryError
 * becomes torch.cuda.OutOfMemoryError. This file does not know torch, so a
 * handler built against the installed torch's headers (the Python
 * package's _tidepool_oom.so, see python/README.md) can be installed with
 * tp_torch_set_oom_handler; it throws that type, and the exception passes
 * through tp_torch_alloc into PyTorch. Without a handler: std::runtime_error
 * (RuntimeError).
 *
 * C callers, ctypes among them, must not call a function that may throw:
 * they use tp_torch_try_alloc, or set oom=null. The C shim does all the
 * work; this file only decides what a failure looks like.
 */
#include "tidepool_torch_internal.h"

#include <stdexcept>

namespace {

class tidepool_out_of_memory : public std::runtime_error {
public:
    explicit tidepool_out_of_memory(const char *what) : std::runtime_error(what) {}
};

// Calls the handler. clang's -fsanitize=function (part of "undefined")
// would check the call through the pointer against C++ type information,
// and its runtime support is in the C++ part of UBSan's runtime, which a C
// program linking this library (test_torch_shim) does not have: the check
// is left out here (the handler's type is a C ABI contract, nothing more).
#if defined(__clang__)
__attribute__((no_sanitize("function")))
#endif
void call_oom_handler(tpt_oom_handler handler, const char *message) {
    handler(message);
}

} // namespace

extern "C" __attribute__((visibility("default"))) void *tp_torch_alloc(ssize_t size, int device, void *stream);

extern "C" void *tp_torch_alloc(ssize_t size, int device, void *stream) {
    void *ptr = tpt_alloc(size, device, stream);
    if (ptr || size <= 0) return ptr;
    switch (tpt_get_oom_mode()) {
    case TPT_OOM_NULL:
        return nullptr;
    case TPT_OOM_ABORT:
        tpt_oom_abort(size, device);
    case TPT_OOM_RAISE:
        break;
    }
    char message[768];
    tpt_oom_message(size, device, message, sizeof message);
    // Out of memory proper: the host's own exception when one was installed
    // (the Python package installs a function that throws
    // c10::OutOfMemoryError, built against the installed torch, so that
    // PyTorch raises torch.cuda.OutOfMemoryError). No device, or a refused
    // configuration, stays a plain error (RuntimeError).
    tpt_oom_handler handler = tpt_get_oom_handler();
    if (handler && tpt_last_failure_was_oom()) call_oom_handler(handler, message); // throws
    throw tidepool_out_of_memory(message);
}
