/* SPDX-License-Identifier: MIT */
/*
 * test_torch_raise.cpp -- tp_torch_alloc as PyTorch calls it, from C++.
 *   nodevice  no CUDA device, oom=raise (default): std::runtime_error whose
 *             message says why; size 0 returns NULL without throwing
 *   sim       the simulated device, limit=1GiB: over the limit throws with
 *             tidepool's out-of-memory report; below it allocates
 *   null      oom=null: NULL, no exception
 *   handler   the simulated device, limit=1GiB, with an out-of-memory handler
 *             from another shared library (tp_torch_set_oom_handler, as the
 *             Python package installs one that throws c10::OutOfMemoryError):
 *             out of memory throws the handler's type with the report; a
 *             request on a device without a pool stays std::runtime_error
 *   refused   TIDEPOOL_TORCH_CONF with a bad item (and a handler): no pool,
 *             std::runtime_error naming the item, never the handler's type
 */
#include "test_oom_handler.h"

#include <sys/types.h>

#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>

extern "C" {
void *tp_torch_alloc(ssize_t size, int device, void *stream);
void *tp_torch_try_alloc(ssize_t size, int device, void *stream);
void tp_torch_free(void *ptr, ssize_t size, int device, void *stream);
const char *tp_torch_stats_json(int device);
void tp_torch_set_oom_handler(void (*handler)(const char *message));
}

// Which type tp_torch_alloc threw: "oom" (the handler's), "runtime" (any
// other std::exception) or "" if it returned; *message gets what().
static std::string alloc_kind(ssize_t size, int device, void **out, std::string *message) {
    *out = nullptr;
    try {
        *out = tp_torch_alloc(size, device, nullptr);
    } catch (const test_oom::OutOfMemoryError &e) {
        *message = e.what();
        return "oom";
    } catch (const std::exception &e) {
        *message = e.what();
        return "runtime";
    }
    return "";
}

static int failures;
#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

// The message of the exception tp_torch_alloc throws, or "" if it returned.
static std::string alloc_error(ssize_t size, int device, void **out) {
    *out = nullptr;
    try {
        *out = tp_torch_alloc(size, device, nullptr);
    } catch (const std::exception &e) {
        return e.what();
    }
    return "";
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    std::string mode = argv[1];
    void *p = nullptr;
    if (mode == "nodevice") {
        std::string err = alloc_error(1 << 20, 0, &p);
        std::printf("%s\n", err.c_str());
        CHECK(p == nullptr);
        CHECK(err.find("CUDA out of memory. Tried to allocate 1.00 MiB on device 0") == 0);
        CHECK(err.find("tidepool could not open cuda:0 (TP_ERR_") != std::string::npos);
        CHECK(alloc_error(0, 0, &p).empty() && p == nullptr); // empty tensors: NULL, no exception
        CHECK(alloc_error(256, 5000, &p).find("no pool for that device number") != std::string::npos);
        CHECK(tp_torch_try_alloc(1 << 20, 0, nullptr) == nullptr); // never throws
        CHECK(std::strstr(tp_torch_stats_json(-1), "\"oom\":\"raise\"") != nullptr);
    } else if (mode == "sim") {
        CHECK(alloc_error(1 << 20, 0, &p).empty() && p != nullptr);
        tp_torch_free(p, 1 << 20, 0, nullptr);
        std::string err = alloc_error((ssize_t)3 << 30, 0, &p);
        std::printf("%s\n", err.c_str());
        CHECK(p == nullptr);
        CHECK(err.find("CUDA out of memory. Tried to allocate 3.00 GiB on device 0 (tidepool sim") == 0);
        CHECK(err.find("out of memory: request 3.00 GiB; pool limit 1.00 GiB") != std::string::npos);
        CHECK(alloc_error(1 << 20, 0, &p).empty() && p != nullptr); // still usable
        tp_torch_free(p, 1 << 20, 0, nullptr);
    } else if (mode == "handler") {
        tp_torch_set_oom_handler(test_oom_throw);
        std::string msg;
        CHECK(alloc_kind(1 << 20, 0, &p, &msg).empty() && p != nullptr);
        tp_torch_free(p, 1 << 20, 0, nullptr);
        CHECK(alloc_kind((ssize_t)3 << 30, 0, &p, &msg) == "oom");
        std::printf("%s\n", msg.c_str());
        CHECK(msg.find("CUDA out of memory. Tried to allocate 3.00 GiB on device 0 (tidepool sim") == 0);
        CHECK(alloc_kind(256, 5000, &p, &msg) == "runtime"); // no pool for that device: not out of memory
        CHECK(alloc_kind(1 << 20, 0, &p, &msg).empty() && p != nullptr); // still usable
        tp_torch_free(p, 1 << 20, 0, nullptr);
        tp_torch_set_oom_handler(nullptr);
        CHECK(alloc_kind((ssize_t)3 << 30, 0, &p, &msg) == "runtime");
    } else if (mode == "refused") {
        tp_torch_set_oom_handler(test_oom_throw);
        std::string msg;
        CHECK(alloc_kind(1 << 20, 0, &p, &msg) == "runtime");
        std::printf("%s\n", msg.c_str());
        CHECK(msg.find("configuration was refused") != std::string::npos);
        CHECK(msg.find("'limt'") != std::string::npos);
        CHECK(std::strstr(tp_torch_stats_json(0), "\"state\":\"failed\"") != nullptr);
        CHECK(std::strstr(tp_torch_stats_json(-1), "\"bad_key\":\"limt\"") != nullptr);
    } else if (mode == "null") {
        CHECK(alloc_error(1 << 20, 0, &p).empty() && p == nullptr);
        CHECK(std::strstr(tp_torch_stats_json(-1), "\"oom\":\"null\"") != nullptr);
    } else {
        return 2;
    }
    std::printf("%s: %s\n", mode.c_str(), failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
