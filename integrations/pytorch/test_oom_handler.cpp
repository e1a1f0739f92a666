/* SPDX-License-Identifier: MIT */
/*
 * test_oom_handler.cpp -- a stand-in, for tests, for the Python package's
 * _tidepool_oom.so: a shared library whose handler throws its own exception
 * type (there: c10::OutOfMemoryError), so that test_torch_raise can check
 * that the exception crosses tp_torch_alloc (another library) unchanged.
 */
#include "test_oom_handler.h"

extern "C" __attribute__((visibility("default"))) void test_oom_throw(const char *message) {
    throw test_oom::OutOfMemoryError(message);
}
