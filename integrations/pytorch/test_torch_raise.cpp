/*
 * test_torch_raise.cpp -- tp_torch_alloc as PyTorch calls it, from C++.
 *   nodevice  no CUDA device, oom=raise (default): std::runtime_error whose
 *             message says why; size 0 returns NULL without throwing
 *   sim       the simulated device, limit=1GiB: over the limit throws with
 *             tidepool's out-of-memory report; below it allocates
 *   null      oom=null: NULL, no exception
 */
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
    } else if (mode == "null") {
        CHECK(alloc_error(1 << 20, 0, &p).empty() && p == nullptr);
        CHECK(std::strstr(tp_torch_stats_json(-1), "\"oom\":\"null\"") != nullptr);
    } else {
        return 2;
    }
    std::printf("%s: %s\n", mode.c_str(), failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
