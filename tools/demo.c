/* SPDX-License-Identifier: MIT */
/*
 * demo.c -- `tide demo`, the README's main command: the failures of the
 * public reports against tidepool, side by side, on a simulated 6 GiB GPU
 * without VMM (a laptop GPU) with 3 GiB taken by the model's weights.
 *
 * Two workloads (scenarios.c): flash-attention decode to a long context
 * and a vision-language server answering image requests. Each is generated
 * once and fed to two replays at the same time: ggml's legacy pool and
 * tidepool's segment pool on the GPU without VMM, and tidepool's VMM pool
 * on the same GPU with VMM. The story printed is computed from the results
 * (when a pool first ran out of memory, in tokens or requests, what its
 * out-of-memory report said, peak live against peak held); nothing in it is
 * written in advance. Exit status 0 when tidepool's pools had no errors,
 * hazards or out-of-memory failures.
 */
#include "plot.h"
#include "replay.h"
#include "scenarios.h"
#include "tide.h"
#include "tide_run.h"

#include <stdio.h>
#include <string.h>

#define DEMO_DEVICE "sim:6GiB,novmm"
#define DEMO_VMM_DEVICE "sim:6GiB"
#define DEMO_OCCUPIED_BYTES (3ull << 30)
#define DEMO_POOLS "ggml-legacy,segment"
#define DEMO_VMM_POOL "vmm"
#define RESULTS_PER_PART 3

typedef struct demo_part {
    const scenario *workload;
    scenario_params params;
    const char *heading;     /* what the workload is */
    const char *why_hoarding; /* why the baseline's cache grows on it */
    replay_run *runs[2];
    replay_result results[RESULTS_PER_PART]; /* ggml-legacy, segment, vmm */
    size_t result_count;
    scenario_units units;
    char title[160];
} demo_part;

static void demo_usage(FILE *out) {
    fprintf(out,
            "usage: tide demo [options]\n\n"
            "ggml's CUDA memory pool against tidepool on a simulated 6 GiB GPU without VMM (3 GiB of it\n"
            "taken by the model's weights): flash-attention decode to a long context, then a vision-language\n"
            "server answering image requests. Prints what happened and draws it.\n\n"
            "options:\n"
            "  --context N      tokens of the flash-attention decode (default 131072)\n"
            "  --requests N     image requests (default 100)\n"
            "  --seed N         seed of the image requests (default 1)\n"
            "  --plot FILE.svg  where the chart goes (default tide-demo.svg)\n"
            "  --no-plot        no chart\n"
            "  -h, --help       this text\n");
}

/* Prints text wrapped at 100 columns; the first line after first_prefix,
 * the others after an indent of the same width. */
static void print_wrapped(const char *first_prefix, const char *text) {
    enum { COLUMNS = 100 };
    size_t indent = strlen(first_prefix), column = indent;
    fputs(first_prefix, stdout);
    const char *word = text;
    while (*word) {
        while (*word == ' ' || *word == '\n') word++;
        size_t length = strcspn(word, " \n");
        if (!length) break;
        if (column > indent && column + 1 + length > COLUMNS) {
            printf("\n%*s", (int)indent, "");
            column = indent;
        } else if (column > indent) {
            putchar(' ');
            column++;
        }
        fwrite(word, 1, length, stdout);
        column += length;
        word += length;
    }
    putchar('\n');
}

/* Held over live in one half of the run (bucket maxima of the samples). */
static double half_ratio(const replay_result *r, bool second_half) {
    uint64_t held = 0, live = 0;
    size_t half = r->sample_count / 2;
    for (size_t i = second_half ? half : 0; i < (second_half ? r->sample_count : half); i++) {
        if (r->samples[i].reserved_bytes > held) held = r->samples[i].reserved_bytes;
        if (r->samples[i].live_bytes > live) live = r->samples[i].live_bytes;
    }
    return live ? (double)held / (double)live : 0.0;
}

static const replay_result *result_of(const demo_part *part, const char *pool) {
    for (size_t i = 0; i < part->result_count; i++)
        if (!strcmp(part->results[i].pool, pool)) return &part->results[i];
    return NULL;
}

/* Runs one workload through both replays; 0, or -1 with err filled. */
static int run_part(demo_part *part, char *err, size_t capacity) {
    replay_options options = {.device_spec = DEMO_DEVICE, .keep_samples = true, .follow_trace_time = true,
                              .occupied_bytes = DEMO_OCCUPIED_BYTES};
    part->runs[0] = replay_begin(DEMO_POOLS, &options, err, capacity);
    if (!part->runs[0]) return -1;
    options.device_spec = DEMO_VMM_DEVICE;
    part->runs[1] = replay_begin(DEMO_VMM_POOL, &options, err, capacity);
    if (!part->runs[1]) return -1;
    if (scenario_replay(part->workload, &part->params, part->runs, 2, &part->units) != 0) {
        snprintf(err, capacity, "out of host memory");
        return -1;
    }
    for (size_t r = 0; r < 2; r++) {
        replay_result *results;
        size_t n = replay_finish(part->runs[r], &results);
        for (size_t i = 0; i < n && part->result_count < RESULTS_PER_PART; i++)
            part->results[part->result_count++] = results[i];
    }
    return 0;
}

static void print_table(const demo_part *part) {
    char live[32], held[32], end[32], failures[48];
    printf("   %-18s %11s %11s %10s %11s %13s   %s\n", "pool", "peak live", "peak held", "held/live", "end held",
           "device calls", "out of memory");
    for (size_t i = 0; i < part->result_count; i++) {
        const replay_result *r = &part->results[i];
        char name[40];
        snprintf(name, sizeof name, "%s%s", r->pool, strcmp(r->pool, "vmm") ? "" : " (VMM GPU)");
        if (r->fatal)
            snprintf(failures, sizeof failures, "aborted");
        else if (r->ooms)
            snprintf(failures, sizeof failures, "%llu failed", (unsigned long long)r->ooms);
        else if (r->oom_recoveries)
            snprintf(failures, sizeof failures, "%llu recovered", (unsigned long long)r->oom_recoveries);
        else
            snprintf(failures, sizeof failures, "none");
        printf("   %-18s %11s %11s %9.2fx %11s %13llu   %s\n", name,
               tide_bytes(r->peak_live_bytes, live, sizeof live), tide_bytes(r->peak_reserved_bytes, held, sizeof held),
               replay_ratio(r), tide_bytes(r->end_reserved_bytes, end, sizeof end),
               (unsigned long long)r->device_calls, failures);
    }
}

static void print_baseline_story(const demo_part *part, const replay_result *r) {
    const char *unit = part->workload->unit;
    char text[2048], held[32], live[32];
    tide_bytes(r->peak_reserved_bytes, held, sizeof held);
    tide_bytes(r->peak_live_bytes, live, sizeof live);
    if (r->fatal) {
        int n = snprintf(text, sizeof text, "ggml-legacy ABORTED at %s %llu of the run (event %llu): %s.", unit,
                         (unsigned long long)scenario_unit_of(&part->units, r->fatal_event),
                         (unsigned long long)r->fatal_event, r->first_oom_report);
        if (n > 0 && (size_t)n < sizeof text && r->first_recovery_event && r->first_recovery_event < r->fatal_event)
            snprintf(text + n, sizeof text - (size_t)n,
                     " It had first run out at %s %llu and survived that by flushing its cache.", unit,
                     (unsigned long long)scenario_unit_of(&part->units, r->first_recovery_event));
    } else if (r->first_recovery_event) {
        snprintf(text, sizeof text,
                 "ggml-legacy ran out of device memory at %s %llu (event %llu): %s. It flushed %llu time(s) in all, "
                 "each a device-wide synchronisation; before the merged fix the first would have aborted the process.",
                 unit, (unsigned long long)scenario_unit_of(&part->units, r->first_recovery_event),
                 (unsigned long long)r->first_recovery_event, r->first_recovery_report,
                 (unsigned long long)r->oom_recoveries);
    } else {
        snprintf(text, sizeof text,
                 "ggml-legacy did not run out of memory here; it held at most %s for a peak live of %s.", held, live);
    }
    print_wrapped("   -> ", text);
    if (r->fatal || r->first_recovery_event) {
        snprintf(text, sizeof text, "Why: %s.", part->why_hoarding);
        print_wrapped("      ", text);
    }
}

/* Prints tidepool's side; returns false if it did not behave. */
static bool print_tidepool_story(const replay_result *r) {
    char text[1024], held[32], live[32], end[32];
    tide_bytes(r->peak_reserved_bytes, held, sizeof held);
    tide_bytes(r->peak_live_bytes, live, sizeof live);
    tide_bytes(r->end_reserved_bytes, end, sizeof end);
    bool behaved = !r->errors && !r->hazards && !r->ooms && !r->fatal;
    double first = half_ratio(r, false), second = half_ratio(r, true);
    bool flat = second <= first * 1.1 + 0.05;
    snprintf(text, sizeof text,
             "tidepool (%s%s): held at most %s for a peak live of %s (%.2fx) and %s at the end; held/live %.2fx in "
             "the first half of the run and %.2fx in the second (%s); %llu device calls, %llu out-of-memory failures, "
             "%llu errors, %llu hazards.",
             r->pool, strcmp(r->pool, "vmm") ? "" : ", GPU with VMM", held, live, replay_ratio(r), end, first, second,
             flat ? "flat: no growth" : "it grew", (unsigned long long)r->device_calls, (unsigned long long)r->ooms,
             (unsigned long long)r->errors, (unsigned long long)r->hazards);
    print_wrapped("   -> ", text);
    return behaved;
}

int tide_demo(int argc, char **argv) {
    const char *plot_path = "tide-demo.svg";
    demo_part parts[2] = {
        {.workload = scenario_find("fa-decode"),
         .why_hoarding = "every 256 tokens K and V grow by 512 KiB; each cached buffer is handed out whole and "
                         "is 1.05x its first request, so it soon fits no later request and idles in one of 256 "
                         "slots, which fill with buffers just too small"},
        {.workload = scenario_find("image-requests"),
         .why_hoarding = "the vision encoder runs in a ggml context of its own whose pool keeps its idle "
                         "buffers (attention scores of up to 512 MiB per image size); a flush frees only the "
                         "flushing pool's buffers, so the text model's pool cannot get them back"},
    };
    for (size_t p = 0; p < 2; p++) {
        if (!parts[p].workload) {
            fprintf(stderr, "tide demo: scenario missing\n");
            return 1;
        }
        scenario_defaults(parts[p].workload, &parts[p].params);
    }
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            demo_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--no-plot")) {
            plot_path = NULL;
        } else if (!strcmp(a, "--plot")) {
            if (!v) {
                fprintf(stderr, "tide demo: --plot needs a file name\n");
                return 2;
            }
            plot_path = v;
            i++;
        } else if (!strcmp(a, "--context")) {
            if (!tide_parse_count_option("tide demo", a, v, 1, 1u << 24, &parts[0].params.context_tokens)) return 2;
            i++;
        } else if (!strcmp(a, "--requests")) {
            if (!tide_parse_count_option("tide demo", a, v, 1, 1000000, &parts[1].params.requests)) return 2;
            i++;
        } else if (!strcmp(a, "--seed")) {
            if (!tide_parse_count_option("tide demo", a, v, 0, UINT64_MAX, &parts[1].params.seed)) return 2;
            i++;
        } else {
            fprintf(stderr, "tide demo: unknown option '%s' (see tide demo --help)\n", a);
            return 2;
        }
    }
    snprintf(parts[0].title, sizeof parts[0].title, "fa-decode: flash-attention decode to %llu tokens",
             (unsigned long long)parts[0].params.context_tokens);
    snprintf(parts[1].title, sizeof parts[1].title, "image-requests: %llu requests, context %llu tokens",
             (unsigned long long)parts[1].params.requests, (unsigned long long)parts[1].params.context_tokens);
    parts[0].heading = "flash-attention decode (failure mode 1, docs/failure-modes.md): each token, K and V temporaries of "
                       "n_kv x 2 KiB (n_kv = 256*ceil((512+t)/256)) and 20 small ones, freed in reverse; 20 ms a token";
    parts[1].heading = "a vision-language server (docs/failure-modes.md, background): each request 1-2 images of 64-1024 tokens "
                       "through a vision encoder, then prefill and decode with a growing KV cache";

    char occupied[32];
    printf("tide demo: ggml's CUDA memory pool against tidepool on a simulated 6 GiB GPU without VMM\n"
           "(like the laptop GPUs of the public reports), %s of it taken by the model's weights.\n"
           "  ggml-legacy  ggml's pool for GPUs without VMM, modelled on its source: 256 slots, best fit,\n"
           "               1.05x look-ahead, one pool per context and stream, flush-and-retry (as merged)\n"
           "  segment      tidepool's pool for GPUs without VMM\n"
           "  vmm          tidepool's VMM pool, on the same GPU with VMM\n",
           tide_bytes(DEMO_OCCUPIED_BYTES, occupied, sizeof occupied));

    int status = 0;
    bool tidepool_behaved = true;
    for (size_t p = 0; p < 2 && !status; p++) {
        demo_part *part = &parts[p];
        char err[512];
        if (run_part(part, err, sizeof err) != 0) {
            fprintf(stderr, "tide demo: %s\n", err);
            status = 1;
            break;
        }
        printf("\n%zu. %s\n", p + 1, part->title);
        print_wrapped("   ", part->heading);
        printf("\n");
        print_table(part);
        printf("\n");
        const replay_result *baseline = result_of(part, "ggml-legacy");
        if (baseline) print_baseline_story(part, baseline);
        for (size_t i = 0; i < part->result_count; i++)
            if (strcmp(part->results[i].pool, "ggml-legacy"))
                tidepool_behaved &= print_tidepool_story(&part->results[i]);
    }
    if (!status && plot_path) {
        plot_panel panels[2];
        for (size_t p = 0; p < 2; p++) panels[p] = (plot_panel){parts[p].title, parts[p].results, parts[p].result_count};
        char err[512], title[160];
        snprintf(title, sizeof title, "tide demo: ggml-legacy vs tidepool on a 6 GiB GPU, %s taken by weights",
                 occupied);
        if (plot_replay_svg_panels(plot_path, title, panels, 2, err, sizeof err) != 0) {
            fprintf(stderr, "tide demo: %s\n", err);
            status = 1;
        } else {
            printf("\nchart: %s\n", plot_path);
        }
    }
    if (!status) {
        printf("%s\n", tidepool_behaved ? "tidepool: no errors, no hazards, no out-of-memory failures."
                                        : "tidepool: FAILED (see above).");
        if (!tidepool_behaved) status = 1;
    }
    for (size_t p = 0; p < 2; p++) {
        for (size_t r = 0; r < 2; r++) replay_free(parts[p].runs[r]);
        scenario_units_free(&parts[p].units);
    }
    return status;
}
