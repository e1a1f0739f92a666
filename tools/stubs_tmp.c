/* Temporary: replaced as the subcommands land. */
#include "plot.h"
#include "tide.h"
#include <stdio.h>
int plot_replay_svg(const char *path, const char *title, const replay_result *results, size_t count, char *err,
                    size_t capacity) {
    (void)path; (void)title; (void)results; (void)count;
    snprintf(err, capacity, "plotting is not built yet");
    return -1;
}
int tide_demo(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tide demo: not built yet\n"); return 1; }
int tide_scenario(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tide scenario: not built yet\n"); return 1; }
