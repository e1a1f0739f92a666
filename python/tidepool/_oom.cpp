/* SPDX-License-Identifier: MIT */
// _oom.cpp -- built against the installed torch's headers (like a torch
// extension): throws c10::OutOfMemoryError, which PyTorch's Python bindings
// turn into torch.cuda.OutOfMemoryError. libtidepool_torch.so calls it
// through tp_torch_set_oom_handler when an allocation runs out of memory;
// the exception passes through tp_torch_alloc (C++) into PyTorch.
#include <c10/util/Exception.h>

#include <string>

extern "C" __attribute__((visibility("default"))) void tp_torch_oom_throw(const char *message) {
    // The macro PyTorch's own caching allocator uses to raise it.
    C10_THROW_ERROR(OutOfMemoryError, std::string(message));
}
