/*
 * tide.h -- the subcommands of the tide command line and what they share.
 * Each returns the process exit status: 0 success, 1 failure of the work,
 * 2 bad usage.
 */
#ifndef TIDEPOOL_TIDE_H
#define TIDEPOOL_TIDE_H

#include "tidepool.h"

#include <stdbool.h>
#include <stdint.h>

int tide_demo(int argc, char **argv);
int tide_replay(int argc, char **argv);
int tide_scenario(int argc, char **argv);
int tide_bench(int argc, char **argv);

/* "1.50 GiB" */
const char *tide_bytes(uint64_t bytes, char *buf, size_t capacity);
/* Parses a byte count option value; prints the error and returns false. */
bool tide_parse_bytes_option(const char *option, const char *value, uint64_t *out);

#endif
