/* Temporary: the hit-path benchmark lands next. */
#include "tide.h"
#include <stdio.h>
int tide_bench(int argc, char **argv) { (void)argc; (void)argv; fprintf(stderr, "tide bench: not built yet\n"); return 1; }
