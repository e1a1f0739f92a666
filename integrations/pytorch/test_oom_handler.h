/* SPDX-License-Identifier: MIT */
/* test_oom_handler.h -- the exception type test_oom_handler.cpp throws. */
#ifndef TEST_OOM_HANDLER_H
#define TEST_OOM_HANDLER_H

#include <stdexcept>
#include <string>

namespace test_oom {
class __attribute__((visibility("default"))) OutOfMemoryError : public std::runtime_error {
public:
    explicit OutOfMemoryError(const std::string &what) : std::runtime_error(what) {}
};
} // namespace test_oom

extern "C" void test_oom_throw(const char *message);

#endif
