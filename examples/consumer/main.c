/* SPDX-License-Identifier: MIT */
/*
 * consumer -- a program outside the tidepool tree that uses an installed
 * tidepool: opens a simulated 1 GiB device, makes a pool, allocates and frees
 * on a stream, and prints the library's version and the pool's statistics.
 */
#include <tidepool.h>

#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                    \
    do {                                                                               \
        tp_status st_ = (call);                                                        \
        if (st_ != TP_OK) {                                                            \
            fprintf(stderr, "consumer: %s: %s\n", #call, tp_status_name(st_));         \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

int main(void) {
    printf("tidepool %s (tp_version %u, header %d.%d.%d)\n", tp_version_string(), (unsigned)tp_version(),
           TP_VERSION_MAJOR, TP_VERSION_MINOR, TP_VERSION_PATCH);

    tp_device *dev;
    tp_pool *pool;
    tp_stream stream;
    CHECK(tp_device_open("sim:1GiB", NULL, &dev));
    CHECK(tp_stream_create(dev, &stream));
    tp_pool_config cfg = {0}; /* zero fields mean defaults */
    CHECK(tp_pool_create(dev, &cfg, &pool));

    void *bufs[8];
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 8; i++) CHECK(tp_pool_alloc(pool, (size_t)(i + 1) << 20, stream, &bufs[i]));
        for (int i = 0; i < 8; i++) CHECK(tp_pool_free(pool, bufs[i], stream));
    }
    CHECK(tp_stream_synchronize(dev, stream));

    char json[8192];
    CHECK(tp_pool_stats_json(pool, json, sizeof json, NULL));
    printf("%s\n", json);

    CHECK(tp_pool_destroy(pool));
    CHECK(tp_stream_destroy(dev, stream));
    CHECK(tp_device_close(dev));
    return 0;
}
