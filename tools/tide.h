/* SPDX-License-Identifier: MIT */
/*
 * tide.h -- the subcommands of the tide command line and what they share.
 * Each returns the process exit status: 0 success, 1 failure of the work,
 * 2 bad usage, 3 a gate failed (replay and scenario: --fail-on-oom,
 * --max-ratio).
 *
 * The tools see tidepool only through its public headers (tidepool.h,
 * tidepool_sim.h) and the shared hash map (common/tpi_map.h); the few
 * helpers below stand in for the library's private ones.
 */
#ifndef TIDEPOOL_TIDE_H
#define TIDEPOOL_TIDE_H

#include "tidepool.h"
#include "tidepool_sim.h"

#include <stdbool.h>
#include <stdint.h>

#define TIDE_KiB (1024ull)
#define TIDE_MiB (1024ull * 1024ull)
#define TIDE_GiB (1024ull * 1024ull * 1024ull)

/* alignment: a power of two */
static inline uint64_t tide_align_up(uint64_t value, uint64_t alignment) {
    return (value + alignment - 1) & ~(alignment - 1);
}

int tide_demo(int argc, char **argv);
int tide_replay(int argc, char **argv);
int tide_scenario(int argc, char **argv);
int tide_bench(int argc, char **argv);
int tide_map(int argc, char **argv);

/* "1.50 GiB" */
const char *tide_bytes(uint64_t bytes, char *buf, size_t capacity);
/* Parses a byte count option value; prints the error and returns false. */
bool tide_parse_bytes_option(const char *option, const char *value, uint64_t *out);

#endif
