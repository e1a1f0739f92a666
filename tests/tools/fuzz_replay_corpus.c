/* SPDX-License-Identifier: MIT */
/*
 * fuzz_replay_corpus.c -- runs the trace fuzzer's target once on every
 * file named on the command line, without libFuzzer: the committed corpus
 * stays a regression test under any compiler (gcc included).
 */
#include <stdio.h>
#include <stdlib.h>

int LLVMFuzzerTestOneInput(const unsigned char *data, size_t size);

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: fuzz_replay_corpus FILE...\n");
        return 2;
    }
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            fprintf(stderr, "fuzz_replay_corpus: cannot open %s\n", argv[i]);
            return 1;
        }
        unsigned char *data = NULL;
        size_t size = 0, capacity = 0;
        for (;;) {
            if (size == capacity) {
                capacity = capacity ? 2 * capacity : 4096;
                unsigned char *grown = realloc(data, capacity);
                if (!grown) {
                    fprintf(stderr, "fuzz_replay_corpus: out of memory\n");
                    return 1;
                }
                data = grown;
            }
            size_t n = fread(data + size, 1, capacity - size, f);
            if (!n) break;
            size += n;
        }
        fclose(f);
        LLVMFuzzerTestOneInput(data, size);
        free(data);
    }
    printf("fuzz_replay_corpus: %d inputs ran clean\n", argc - 1);
    return 0;
}
