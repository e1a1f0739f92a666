#include "plot.h"
#include "tide.h"
#include <stdio.h>
int plot_replay_svg(const char *path, const char *title, const replay_result *results, size_t count, char *err, size_t capacity) { (void)path; (void)title; (void)results; (void)count; snprintf(err, capacity, "not yet"); return -1; }
int tide_demo(int argc, char **argv) { (void)argc; (void)argv; return 1; }
int tide_scenario(int argc, char **argv) { (void)argc; (void)argv; return 1; }
int tide_bench(int argc, char **argv) { (void)argc; (void)argv; return 1; }
