/* SPDX-License-Identifier: MIT */
/*
 * scenarios.c -- the scenario generators (see scenarios.h).
 *
 * A generator walks its workload and emits one trace event per allocation
 * and free through a small buffer that is handed to the sink in chunks.
 * Invariants of every generated trace: each free names a live allocation
 * (same address, size and stream as its alloc: a buffer is freed on the
 * stream it was allocated on), addresses are unique identities (never
 * reused, so the trace means the same to any reader), and time never runs
 * backwards. Times are realistic (a decode step about 20 ms, requests
 * seconds apart) because replays move the simulated clock with them and
 * pools release idle memory on time (tidepool: after 10 s by default).
 * Random choices come from a seeded generator: the same parameters give
 * the same trace.
 */
#include "scenarios.h"

#include "tide.h"

#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#define MS 1000000ull
#define SECOND 1000000000ull
#define CHUNK_EVENTS 4096

/* ------------------------------------------------------------ generator */

typedef struct gen {
    const scenario_sink *sink;
    trace_event chunk[CHUNK_EVENTS];
    size_t pending;
    uint64_t emitted; /* events handed to the sink or pending */
    uint64_t now_ns;
    uint64_t next_address;
    uint64_t rng;
    bool stopped;
} gen;

/* An allocation of the trace, to be freed later. */
typedef struct block {
    uint64_t address;
    uint64_t bytes;
    uint32_t stream;
} block;

static void gen_flush(gen *g) {
    if (g->pending && !g->stopped && g->sink->events(g->sink->user, g->chunk, g->pending) != 0) g->stopped = true;
    g->pending = 0;
}

static void gen_emit(gen *g, uint8_t action, uint64_t address, uint64_t bytes, uint32_t stream) {
    if (g->stopped) return;
    g->chunk[g->pending++] = (trace_event){g->now_ns, address, bytes, stream, action};
    g->emitted++;
    if (g->pending == CHUNK_EVENTS) gen_flush(g);
}

static block gen_alloc(gen *g, uint64_t bytes, uint32_t stream) {
    block b = {g->next_address, bytes, stream};
    g->next_address += tide_align_up(bytes ? bytes : 1, 512);
    gen_emit(g, TRACE_ALLOC, b.address, b.bytes, b.stream);
    return b;
}

static void gen_free(gen *g, block *b) {
    if (!b->bytes && !b->address) return;
    gen_emit(g, TRACE_FREE, b->address, b->bytes, b->stream);
    *b = (block){0, 0, 0};
}

/* *b reallocated to bytes on stream, as torch.cat does it: the new
 * block allocated before the old one (none, if *b is empty) is freed. */
static void gen_realloc(gen *g, block *b, uint64_t bytes, uint32_t stream) {
    block grown = gen_alloc(g, bytes, stream);
    gen_free(g, b);
    *b = grown;
}

static void gen_wait(gen *g, uint64_t ns) { g->now_ns += ns; }

static void gen_mark(gen *g, uint64_t unit) {
    if (g->sink->mark && !g->stopped) g->sink->mark(g->sink->user, unit, g->emitted);
}

/* splitmix64 */
static uint64_t gen_random(gen *g) {
    uint64_t z = (g->rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [low, high]. */
static uint64_t gen_between(gen *g, uint64_t low, uint64_t high) { return low + gen_random(g) % (high - low + 1); }

/* Uniform in [0, 1). */
static double gen_unit(gen *g) { return (double)(gen_random(g) >> 11) / 9007199254740992.0; }

/* Log-uniform in [low, high]. */
static uint64_t gen_log_between(gen *g, uint64_t low, uint64_t high) {
    double u = gen_unit(g);
    double value = (double)low * exp2(u * log2((double)high / (double)low));
    uint64_t bytes = (uint64_t)value;
    return bytes < low ? low : bytes > high ? high : bytes;
}

/* Frees blocks[count-1] .. blocks[0], spacing them by gap_ns. */
static void gen_free_reverse(gen *g, block *blocks, size_t count, uint64_t gap_ns) {
    for (size_t i = count; i-- > 0;) {
        gen_free(g, &blocks[i]);
        gen_wait(g, gap_ns);
    }
}

/* ----------------------------------------------- 1. flash-attention decode */

/* Every decode step t: K and V converted to f16 for flash attention,
 * n_kv x 2048 B each with n_kv = 256 * ceil((512 + t) / 256), then 20 small
 * temporaries; all freed in reverse. The step takes 20 ms. */
static const uint64_t fa_small_bytes[20] = {4096, 8192, 16384, 65536, 131072, 262144, 1 << 20, 2048, 512, 98304,
                                            4096, 8192, 16384, 65536, 131072, 262144, 1 << 20, 2048, 512, 98304};

static int gen_fa_decode(gen *g, const scenario_params *p) {
    enum { BLOCKS = 22 };
    const uint64_t event_gap_ns = 20 * MS / (2 * BLOCKS);
    block blocks[BLOCKS];
    for (uint64_t t = 1; t <= p->context_tokens && !g->stopped; t++) {
        gen_mark(g, t);
        uint64_t n_kv = 256 * ((512 + t + 255) / 256);
        for (size_t i = 0; i < BLOCKS; i++) {
            blocks[i] = gen_alloc(g, i < 2 ? n_kv * 2048 : fa_small_bytes[i - 2], 0);
            gen_wait(g, event_gap_ns);
        }
        gen_free_reverse(g, blocks, BLOCKS, event_gap_ns);
    }
    return 0;
}

/* ----------------------------------------------------- 2. size rotation */

/* 300 distinct sizes, 1..300 MiB, each allocated, used 100 us and freed,
 * one a millisecond, round after round. */
static int gen_size_rotation(gen *g, const scenario_params *p) {
    uint64_t step = 0;
    for (uint64_t round = 0; round < p->rounds && !g->stopped; round++) {
        for (uint64_t mib = 1; mib <= 300; mib++) {
            gen_mark(g, ++step);
            block b = gen_alloc(g, mib * TIDE_MiB, 0);
            gen_wait(g, MS / 10);
            gen_free(g, &b);
            gen_wait(g, MS - MS / 10);
        }
    }
    return 0;
}

/* ------------------------------------------- 3. OOM with reclaimable cache */

/* On an 8 GiB device: 6 GiB live, 40 x 45 MiB allocated together and freed
 * (idle in the pool), then a 1.5 GiB request a moment later: it fits only
 * if the pool gives back idle memory. Units: the phases (1 live, 2 idle
 * cache, 3 big request). */
static int gen_oom_reclaim(gen *g, const scenario_params *p) {
    (void)p;
    block live[6], idle[40];
    gen_mark(g, 1);
    for (size_t i = 0; i < 6; i++) {
        live[i] = gen_alloc(g, TIDE_GiB, 0);
        gen_wait(g, MS);
    }
    gen_mark(g, 2);
    for (size_t i = 0; i < 40; i++) {
        idle[i] = gen_alloc(g, 45 * TIDE_MiB, 0);
        gen_wait(g, MS);
    }
    for (size_t i = 0; i < 40; i++) { /* oldest first */
        gen_free(g, &idle[i]);
        gen_wait(g, MS);
    }
    gen_wait(g, 100 * MS);
    gen_mark(g, 3);
    block big = gen_alloc(g, 1536 * TIDE_MiB, 0);
    gen_wait(g, 200 * MS);
    gen_free(g, &big);
    gen_wait(g, MS);
    gen_free_reverse(g, live, 6, MS);
    return 0;
}

/* --------------------------------------------------------- 5. high water */

/* One 3 GiB temporary, then --minutes of 10 MiB temporaries at 20 Hz, then
 * one request larger than the scenario's 4 GiB device (5 GiB: it must fail
 * with an error, not abort), then 100 more 10 MiB temporaries: the pool
 * must keep working. Units: minutes (0 is the 3 GiB temporary). */
static void ten_mib_steps(gen *g, uint64_t count) {
    for (uint64_t i = 0; i < count && !g->stopped; i++) {
        block b = gen_alloc(g, 10 * TIDE_MiB, 0);
        gen_wait(g, MS);
        gen_free(g, &b);
        gen_wait(g, 49 * MS);
    }
}

static int gen_high_water(gen *g, const scenario_params *p) {
    gen_mark(g, 0);
    block huge = gen_alloc(g, 3 * TIDE_GiB, 0);
    gen_wait(g, 5 * SECOND);
    gen_free(g, &huge);
    gen_wait(g, 50 * MS);
    for (uint64_t minute = 1; minute <= p->minutes && !g->stopped; minute++) {
        gen_mark(g, minute);
        ten_mib_steps(g, 60 * 20);
    }
    block too_big = gen_alloc(g, 5 * TIDE_GiB, 0);
    gen_wait(g, MS);
    gen_free(g, &too_big);
    gen_wait(g, 49 * MS);
    ten_mib_steps(g, 100);
    return 0;
}

/* ------------------------------------------------------- 6. out of order */

/* Per step: alloc A on stream 1, alloc B on stream 2, free A, free B;
 * sizes log-uniform in 256 B..64 MiB; a step a millisecond. */
static int gen_out_of_order(gen *g, const scenario_params *p) {
    for (uint64_t step = 1; step <= p->steps && !g->stopped; step++) {
        gen_mark(g, step);
        block a = gen_alloc(g, gen_log_between(g, 256, 64 * TIDE_MiB), 1);
        gen_wait(g, MS / 10);
        block b = gen_alloc(g, gen_log_between(g, 256, 64 * TIDE_MiB), 2);
        gen_wait(g, MS / 10);
        gen_free(g, &a);
        gen_wait(g, MS / 10);
        gen_free(g, &b);
        gen_wait(g, MS - 3 * (MS / 10));
    }
    return 0;
}

/* ------------------------------------------------------ 11. cross stream */

/* Per step, one size of 4 KiB, 3 MiB and 100 MiB in turn: alloc on stream
 * 1 (its kernel runs 1 ms), free; alloc the same size on stream 2, free;
 * again on stream 1; 5 ms later on stream 3. */
static int gen_cross_stream(gen *g, const scenario_params *p) {
    static const uint64_t sizes[3] = {4 * TIDE_KiB, 3 * TIDE_MiB, 100 * TIDE_MiB};
    for (uint64_t step = 1; step <= p->steps && !g->stopped; step++) {
        gen_mark(g, step);
        uint64_t bytes = sizes[(step - 1) % 3];
        block first = gen_alloc(g, bytes, 1);
        gen_wait(g, MS);
        gen_free(g, &first);
        static const uint32_t streams[3] = {2, 1, 3};
        for (size_t i = 0; i < 3; i++) {
            if (i == 2) gen_wait(g, 5 * MS);
            block b = gen_alloc(g, bytes, streams[i]);
            gen_wait(g, MS / 100);
            gen_free(g, &b);
        }
        gen_wait(g, MS);
    }
    return 0;
}

/* ------------------------------------------------------ mixed lifetimes */

/* Long-lived blocks made while a large temporary is live (not a failure
 * mode of docs/failure-modes.md: an adversarial shape, found against the
 * segment pool). Per step: a temporary of 64..512 MiB (uniform in MiB);
 * while it is live, three blocks of 1..30 MiB (on stream 0 or 1) that live
 * for the next 50 steps; then the temporary is freed, and so are the blocks
 * whose 50 steps are up. A millisecond a step. */
#define MIXED_LIFETIME_STEPS 50
static int gen_mixed_lifetimes(gen *g, const scenario_params *p) {
    enum { PER_STEP = 3, RING = (MIXED_LIFETIME_STEPS + 1) * PER_STEP };
    block ring[RING];
    memset(ring, 0, sizeof ring);
    for (uint64_t step = 0; step < p->steps && !g->stopped; step++) {
        gen_mark(g, step + 1);
        block temporary = gen_alloc(g, gen_between(g, 64, 512) * TIDE_MiB, 0);
        gen_wait(g, MS / 10);
        for (size_t i = 0; i < PER_STEP; i++) {
            block *slot = &ring[(step % (MIXED_LIFETIME_STEPS + 1)) * PER_STEP + i];
            *slot = gen_alloc(g, gen_between(g, 1, 30) * TIDE_MiB, (uint32_t)(gen_random(g) % 2));
            gen_wait(g, MS / 10);
        }
        gen_free(g, &temporary);
        gen_wait(g, MS / 10);
        if (step >= MIXED_LIFETIME_STEPS) { /* the blocks made MIXED_LIFETIME_STEPS steps ago */
            uint64_t old = (step - MIXED_LIFETIME_STEPS) % (MIXED_LIFETIME_STEPS + 1);
            for (size_t i = 0; i < PER_STEP; i++) gen_free(g, &ring[old * PER_STEP + i]);
        }
        gen_wait(g, MS - 5 * (MS / 10));
    }
    for (size_t i = 0; i < RING; i++) gen_free(g, &ring[i]);
    return 0;
}

/* ---------------------------------------------------------- kv realloc */

/* A KV cache reallocated a little larger every token (not a failure mode
 * of docs/failure-modes.md: an adversarial shape). At token t of a
 * conversation a buffer of 8 MiB + (t + 1) x 128 KiB is allocated, then
 * the previous one is freed; every 7th token a 256 KiB block is made that
 * lives 2000 tokens (a request's state, a cache entry); a new conversation
 * starts every --context tokens. 20 ms a token. Blocks never move, so the
 * buffer wanders through the address space (three positions: the hole it
 * leaves is always one step too small) and the small blocks land in what it
 * left behind. */
#define KV_REALLOC_EVERY 7
#define KV_REALLOC_LIFE 2000
static int gen_kv_realloc(gen *g, const scenario_params *p) {
    enum { RING = KV_REALLOC_LIFE / KV_REALLOC_EVERY + 3 };
    block ring[RING];
    memset(ring, 0, sizeof ring);
    block buffer = {0, 0, 0};
    for (uint64_t step = 0; step < p->steps && !g->stopped; step++) {
        gen_mark(g, step + 1);
        uint64_t token = step % p->context_tokens;
        gen_realloc(g, &buffer, 8 * TIDE_MiB + (token + 1) * 128 * TIDE_KiB, 0);
        if (step % KV_REALLOC_EVERY == 0) ring[(step / KV_REALLOC_EVERY) % RING] = gen_alloc(g, 256 * TIDE_KiB, 0);
        if (step >= KV_REALLOC_LIFE && (step - KV_REALLOC_LIFE) % KV_REALLOC_EVERY == 0)
            gen_free(g, &ring[((step - KV_REALLOC_LIFE) / KV_REALLOC_EVERY) % RING]);
        gen_wait(g, 20 * MS);
    }
    gen_free(g, &buffer);
    for (size_t i = 0; i < RING; i++) gen_free(g, &ring[i]);
    return 0;
}

/* ---------------------------------------------------- image requests */

/* A vision-language server (background of docs/failure-modes.md): a 4B-class text model
 * (Gemma 3 4B shapes) on stream 0 and a SigLIP-class vision encoder in a
 * backend context of its own, on stream 1. Every request brings 1 or 2
 * images of 64..1024 image tokens (dynamic resolution), 16..256 text tokens
 * and asks for 8..48 new tokens. Requests continue one conversation (its
 * KV cache kept) until the next would not fit in --context tokens; then the
 * conversation starts over.
 *   vision: per image and encoder layer, f16 temporaries of the patches
 *     (4 per image token) x the layer widths, and the f16 attention scores
 *     (16 heads x patches^2, the encoder has no flash attention), freed in
 *     reverse after the attention and after the MLP;
 *   text: prompt in micro-batches of up to 512 tokens, then one token a
 *     step; per batch and layer the KV cache grows (new K and V buffers for
 *     all tokens so far, the old ones freed, as torch.cat does), then
 *     temporaries: quantized activations (q8_1) and the flash-attention K
 *     and V conversions of n_kv x 2048 B (n_kv padded to 256).
 * Times: an encoder layer 1 ms + 2 us a patch, a text batch 20 ms + 0.15 ms
 * a token, 0.5..4 s between requests. */
#define TEXT_LAYERS 34
#define TEXT_HIDDEN 2560
#define TEXT_FFN 10240
#define KV_BYTES_PER_TOKEN 2048 /* K (and V) of one layer: 1024 f16 values */
#define FA_BYTES_PER_KV 2048
#define VISION_LAYERS 27
#define VISION_WIDTH 1152
#define VISION_FFN 4304
#define VISION_HEADS 16
#define PATCHES_PER_IMAGE_TOKEN 4
#define UBATCH_TOKENS 512
#define TEXT_STREAM 0
#define VISION_STREAM 1
#define MAX_REQUEST_TOKENS (2 * 1024 + 256 + 48)

static uint64_t q8_1_bytes(uint64_t values) { return (values + 31) / 32 * 36; }

typedef struct conversation {
    block k[TEXT_LAYERS], v[TEXT_LAYERS];
    uint64_t n_past;
} conversation;

/* Allocates the temporaries of one phase of a layer, spaced by gap_ns, and
 * frees them in reverse. */
static void gen_phase(gen *g, const uint64_t *bytes, size_t count, uint32_t stream, uint64_t gap_ns) {
    block temps[8];
    for (size_t i = 0; i < count; i++) {
        temps[i] = gen_alloc(g, bytes[i], stream);
        gen_wait(g, gap_ns);
    }
    gen_free_reverse(g, temps, count, gap_ns);
}

static void vision_encode(gen *g, uint64_t image_tokens) {
    uint64_t patches = PATCHES_PER_IMAGE_TOKEN * image_tokens;
    /* attention: input, Q/K/V and output in f16 for cuBLAS, and the f16
     * scores of the batched Q.K^T (heads x patches^2: no flash attention) */
    const uint64_t attention[4] = {patches * VISION_WIDTH * 2, patches * 3 * VISION_WIDTH * 2,
                                   VISION_HEADS * patches * patches * 2, patches * VISION_WIDTH * 2};
    /* MLP: input, up-projection output and down-projection input in f16 */
    const uint64_t mlp[3] = {patches * VISION_WIDTH * 2, patches * VISION_FFN * 2, patches * VISION_FFN * 2};
    uint64_t gap_ns = (MS + patches * 2000) / 14;
    for (int layer = 0; layer < VISION_LAYERS && !g->stopped; layer++) {
        gen_phase(g, attention, 4, VISION_STREAM, gap_ns);
        gen_phase(g, mlp, 3, VISION_STREAM, gap_ns);
    }
}

static void text_batch(gen *g, conversation *c, uint64_t n_tokens) {
    enum { TEMPS = 4, EVENTS_PER_LAYER = 4 + 2 * TEMPS };
    uint64_t n_total = c->n_past + n_tokens;
    uint64_t n_kv = 256 * ((n_total + 255) / 256);
    uint64_t gap_ns = (20 * MS + n_tokens * 150000) / TEXT_LAYERS / EVENTS_PER_LAYER;
    for (int layer = 0; layer < TEXT_LAYERS && !g->stopped; layer++) {
        block k = gen_alloc(g, n_total * KV_BYTES_PER_TOKEN, TEXT_STREAM);
        gen_wait(g, gap_ns);
        block v = gen_alloc(g, n_total * KV_BYTES_PER_TOKEN, TEXT_STREAM);
        gen_wait(g, gap_ns);
        gen_free(g, &c->k[layer]);
        gen_wait(g, gap_ns);
        gen_free(g, &c->v[layer]);
        gen_wait(g, gap_ns);
        c->k[layer] = k;
        c->v[layer] = v;
        const uint64_t bytes[TEMPS] = {q8_1_bytes(n_tokens * TEXT_HIDDEN), n_kv * FA_BYTES_PER_KV,
                                       n_kv * FA_BYTES_PER_KV, q8_1_bytes(n_tokens * TEXT_FFN)};
        gen_phase(g, bytes, TEMPS, TEXT_STREAM, gap_ns);
    }
    c->n_past = n_total;
}

static void conversation_end(gen *g, conversation *c) {
    for (int layer = TEXT_LAYERS; layer-- > 0;) {
        gen_free(g, &c->v[layer]);
        gen_free(g, &c->k[layer]);
    }
    c->n_past = 0;
}

static int gen_image_requests(gen *g, const scenario_params *p) {
    conversation c;
    memset(&c, 0, sizeof c);
    for (uint64_t request = 1; request <= p->requests && !g->stopped; request++) {
        gen_mark(g, request);
        uint64_t images = gen_between(g, 1, 2), image_tokens[2] = {0, 0};
        for (uint64_t i = 0; i < images; i++) image_tokens[i] = 64 * gen_between(g, 1, 16);
        uint64_t text_tokens = gen_between(g, 16, 256), new_tokens = gen_between(g, 8, 48);
        uint64_t prompt = image_tokens[0] + image_tokens[1] + text_tokens;
        if (c.n_past + prompt + new_tokens > p->context_tokens) conversation_end(g, &c);
        for (uint64_t i = 0; i < images; i++) vision_encode(g, image_tokens[i]);
        for (uint64_t done = 0; done < prompt;) {
            uint64_t n = prompt - done < UBATCH_TOKENS ? prompt - done : UBATCH_TOKENS;
            text_batch(g, &c, n);
            done += n;
        }
        for (uint64_t t = 0; t < new_tokens; t++) text_batch(g, &c, 1);
        gen_wait(g, gen_between(g, 500, 4000) * MS);
    }
    return 0; /* the last conversation stays: a server keeps its cache */
}

static const char *check_image_requests(const scenario_params *p) {
    return p->context_tokens < MAX_REQUEST_TOKENS ? "--context must be at least 2352 tokens (the largest request)"
                                                  : NULL;
}

/* ----------------------------------------------------- batched serving */

/* A server decoding a batch of sequences at once (a model-shaped workload, not a
 * failure mode of docs/failure-modes.md). Before every step sequences join
 * while the batch is below a fresh draw of 4..24 (so it wanders between 4
 * and 24). A joining sequence brings a prompt of 64, 128, 512, 1024, 2048
 * or 3000 tokens plus 0..200, prefilled through four temporaries of prompt
 * x 4096 B x {1, 3, 3, 1} (freed in reverse), and keeps 8 per-layer KV
 * buffers of 4 KiB a token (K and V). Every step: activations of batch x
 * 4096 B x {1, 2, 8, 2, 1}; each sequence's 8 KV buffers reallocated one
 * token larger (the new one allocated, then the old one freed, as
 * torch.cat does); the activations freed in reverse; a logits temporary of
 * batch x 32000 x 4 B. A sequence ends after an exponential number of
 * steps (mean 300), its buffers freed. 20 ms a step, all on stream 0.
 * Hard for a pool: some 180 live buffers of 0.25..15 MiB, each 4 KiB
 * larger every step, so none fits the hole its previous self leaves; the
 * holes must merge with their neighbours or pile up, and a sequence that
 * ends frees eight buffers in the middle of everyone else's. */
#define BATCH_LAYERS 8
#define BATCH_MAX 24
#define BATCH_KV_BYTES_PER_TOKEN (4 * TIDE_KiB)
#define BATCH_MEAN_STEPS 300.0

typedef struct batch_sequence {
    uint64_t tokens, steps_left;
    block kv[BATCH_LAYERS];
} batch_sequence;

static int gen_batched_serving(gen *g, const scenario_params *p) {
    static const uint64_t prompts[6] = {64, 128, 512, 1024, 2048, 3000};
    static const uint64_t prefill[4] = {1, 3, 3, 1}, activations[5] = {1, 2, 8, 2, 1};
    batch_sequence seqs[BATCH_MAX];
    size_t n = 0;
    for (uint64_t step = 0; step < p->steps && !g->stopped; step++) {
        gen_mark(g, step + 1);
        while (n < gen_between(g, 4, BATCH_MAX)) { /* a fresh draw each time, as the prototype */
            batch_sequence *s = &seqs[n++];
            s->tokens = prompts[gen_random(g) % 6] + gen_between(g, 0, 200);
            block temps[4];
            for (size_t i = 0; i < 4; i++) temps[i] = gen_alloc(g, s->tokens * 4096 * prefill[i], 0);
            gen_free_reverse(g, temps, 4, 0);
            s->steps_left = (uint64_t)(-BATCH_MEAN_STEPS * log(1.0 - gen_unit(g))) + 1;
            for (size_t l = 0; l < BATCH_LAYERS; l++) s->kv[l] = gen_alloc(g, s->tokens * BATCH_KV_BYTES_PER_TOKEN, 0);
        }
        block acts[5];
        for (size_t i = 0; i < 5; i++) acts[i] = gen_alloc(g, n * 4096 * activations[i], 0);
        for (size_t i = 0; i < n; i++) {
            batch_sequence *s = &seqs[i];
            s->tokens++;
            for (size_t l = 0; l < BATCH_LAYERS; l++) {
                gen_realloc(g, &s->kv[l], s->tokens * BATCH_KV_BYTES_PER_TOKEN, 0);
            }
        }
        gen_free_reverse(g, acts, 5, 0);
        block logits = gen_alloc(g, n * 32000 * 4, 0);
        gen_free(g, &logits);
        size_t kept = 0;
        for (size_t i = 0; i < n; i++) {
            if (--seqs[i].steps_left == 0)
                for (size_t l = 0; l < BATCH_LAYERS; l++) gen_free(g, &seqs[i].kv[l]);
            else
                seqs[kept++] = seqs[i];
        }
        n = kept;
        gen_wait(g, 20 * MS);
    }
    for (size_t i = 0; i < n; i++)
        for (size_t l = 0; l < BATCH_LAYERS; l++) gen_free(g, &seqs[i].kv[l]);
    return 0;
}

/* ---------------------------------------------------------- heavy tail */

/* Sizes and lifetimes both heavy-tailed (adversarial, not a failure mode).
 * Every step one block of a log-uniform size in 512 B..256 MiB, on stream
 * 0, 1 or 2, that lives a Pareto number of steps (alpha 1.2, scale 5: at
 * least 5, half of them at most 8, one in a hundred past 230, capped at
 * 50000); then the blocks whose steps are up are freed, soonest due first
 * (of the same step, oldest first). Half a millisecond a step.
 * Hard for a pool: nothing repeats. Sizes span six orders of magnitude on
 * three streams, most blocks die within a few steps and a few live for
 * thousands, so a long-lived block of any size can settle in the room of a
 * large short-lived one and keep it. */
#define HEAVY_TAIL_ALPHA 1.2
#define HEAVY_TAIL_SCALE 5.0
#define HEAVY_TAIL_MAX_LIFE 50000
#define HEAVY_TAIL_STREAMS 3

typedef struct due_block {
    uint64_t due, born;
    block b;
} due_block;

static bool due_before(const due_block *a, const due_block *b) {
    return a->due != b->due ? a->due < b->due : a->born < b->born;
}

/* A binary min-heap of blocks by (due, born). */
static void due_push(due_block *heap, size_t *count, due_block entry) {
    size_t i = (*count)++;
    while (i > 0 && due_before(&entry, &heap[(i - 1) / 2])) {
        heap[i] = heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    heap[i] = entry;
}

static due_block due_pop(due_block *heap, size_t *count) {
    due_block top = heap[0], last = heap[--*count];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= *count) break;
        if (child + 1 < *count && due_before(&heap[child + 1], &heap[child])) child++;
        if (!due_before(&heap[child], &last)) break;
        heap[i] = heap[child];
        i = child;
    }
    if (*count) heap[i] = last;
    return top;
}

static int gen_heavy_tail(gen *g, const scenario_params *p) {
    /* a block lives at most HEAVY_TAIL_MAX_LIFE steps: at most that many
     * are live at the end of a step, one more before its frees */
    size_t capacity = p->steps < HEAVY_TAIL_MAX_LIFE + 1 ? (size_t)p->steps : HEAVY_TAIL_MAX_LIFE + 1;
    due_block *heap = malloc(capacity * sizeof *heap);
    if (!heap) {
        g->stopped = true;
        return -1;
    }
    size_t live = 0;
    for (uint64_t step = 0; step < p->steps && !g->stopped; step++) {
        gen_mark(g, step + 1);
        uint64_t bytes = gen_log_between(g, 512, 256 * TIDE_MiB);
        double scaled = HEAVY_TAIL_SCALE * pow(1.0 - gen_unit(g), -1.0 / HEAVY_TAIL_ALPHA);
        uint64_t life = scaled >= HEAVY_TAIL_MAX_LIFE ? HEAVY_TAIL_MAX_LIFE : (uint64_t)scaled;
        uint32_t stream = (uint32_t)(gen_random(g) % HEAVY_TAIL_STREAMS);
        due_push(heap, &live, (due_block){step + life, step, gen_alloc(g, bytes, stream)});
        gen_wait(g, MS / 10);
        while (live && heap[0].due <= step) {
            due_block done = due_pop(heap, &live);
            gen_free(g, &done.b);
        }
        gen_wait(g, MS / 2 - MS / 10);
    }
    while (live) {
        due_block done = due_pop(heap, &live);
        gen_free(g, &done.b);
    }
    free(heap);
    return 0;
}

/* -------------------------------------------------------------- phases */

/* A workload that changes character (adversarial, not a failure mode).
 * Rounds alternate between two phases. Even rounds (the first, the
 * third, ...): a buffer of 200..600 MiB reallocated 512 KiB larger every
 * step for 400 steps (the new one allocated, then the old one freed), with
 * a temporary of 1..40 MiB each step; 10 ms a step; the buffer freed at
 * the end. Odd rounds: 500..1500 long-lived blocks of 64 KiB, 192 KiB,
 * 1 MiB or 3 MiB, then 3000 times one of them, at random, freed and
 * replaced by a new one of one of those sizes, a millisecond apart; all
 * freed at the end.
 * Hard for a pool: what the growth phase leaves (room sized for a buffer
 * that is gone) must serve thousands of small blocks, and the small blocks
 * that the churn scatters must not keep the next growth from its room. */
#define PHASES_GROWTH_STEPS 400
#define PHASES_REPLACEMENTS 3000
#define PHASES_MAX_BLOCKS 1500

static int gen_phases(gen *g, const scenario_params *p) {
    static const uint64_t sizes[4] = {64 * TIDE_KiB, 192 * TIDE_KiB, TIDE_MiB, 3 * TIDE_MiB};
    block blocks[PHASES_MAX_BLOCKS];
    uint64_t step = 0;
    for (uint64_t round = 0; round < p->rounds && !g->stopped; round++) {
        if (round % 2 == 0) {
            block buffer = {0, 0, 0};
            uint64_t base = gen_between(g, 200, 600) * TIDE_MiB;
            for (uint64_t token = 0; token < PHASES_GROWTH_STEPS && !g->stopped; token++) {
                gen_mark(g, ++step);
                gen_realloc(g, &buffer, base + token * 512 * TIDE_KiB, 0);
                block temporary = gen_alloc(g, gen_between(g, 1, 40) * TIDE_MiB, 0);
                gen_free(g, &temporary);
                gen_wait(g, 10 * MS);
            }
            gen_free(g, &buffer);
        } else {
            gen_mark(g, ++step);
            size_t count = (size_t)gen_between(g, 500, PHASES_MAX_BLOCKS);
            for (size_t i = 0; i < count; i++) blocks[i] = gen_alloc(g, sizes[gen_random(g) % 4], 0);
            for (uint64_t k = 0; k < PHASES_REPLACEMENTS && !g->stopped; k++) {
                gen_mark(g, ++step);
                size_t i = (size_t)(gen_random(g) % count);
                gen_free(g, &blocks[i]);
                blocks[i] = gen_alloc(g, sizes[gen_random(g) % 4], 0);
                gen_wait(g, MS);
            }
            for (size_t i = 0; i < count; i++) gen_free(g, &blocks[i]);
        }
    }
    return 0;
}

/* ------------------------------------------------------------ training */

/* Training steps of dynamic shape (a model-shaped workload, not a failure mode).
 * 12 layers of parameters (16, 32 or 64 MiB each, made first) and of
 * gradients (16 MiB each, made in the first step after its forward pass,
 * kept). Every step a sequence length of 256, 512, 1024, 2048 or 4096
 * times 1..4: the forward pass keeps three activations a layer (seq x 4096
 * x 2, seq x 4096 x 8 and seq x 64 x 4 B) and frees a temporary of seq x
 * 4096 x 4 B; the backward pass, last layer first, allocates two gradient
 * temporaries (seq x 4096 x 2 and x 8 B), frees the layer's activations,
 * then the temporaries; the optimizer makes and frees 4 temporaries of
 * 32 MiB. 100 ms a step, all on stream 0.
 * Hard for a pool: a step's activations are sized by its sequence length,
 * 64 KiB..512 MiB, so what a short step frees is too small for a long one
 * and what a long one leaves is far more than a short one needs; and the
 * backward pass frees activations between temporaries it made after them. */
#define TRAINING_LAYERS 12
#define TRAINING_HIDDEN 4096

static int gen_training(gen *g, const scenario_params *p) {
    static const uint64_t lengths[5] = {256, 512, 1024, 2048, 4096}, param_mib[3] = {16, 32, 64};
    block params[TRAINING_LAYERS], grads[TRAINING_LAYERS], acts[TRAINING_LAYERS][3];
    memset(grads, 0, sizeof grads);
    for (size_t l = 0; l < TRAINING_LAYERS; l++) params[l] = gen_alloc(g, param_mib[gen_random(g) % 3] * TIDE_MiB, 0);
    for (uint64_t step = 0; step < p->steps && !g->stopped; step++) {
        gen_mark(g, step + 1);
        uint64_t seq = lengths[gen_random(g) % 5] * gen_between(g, 1, 4);
        for (size_t l = 0; l < TRAINING_LAYERS; l++) {
            acts[l][0] = gen_alloc(g, seq * TRAINING_HIDDEN * 2, 0);
            acts[l][1] = gen_alloc(g, seq * TRAINING_HIDDEN * 8, 0);
            acts[l][2] = gen_alloc(g, seq * 64 * 4, 0);
            block temporary = gen_alloc(g, seq * TRAINING_HIDDEN * 4, 0);
            gen_free(g, &temporary);
        }
        if (step == 0)
            for (size_t l = 0; l < TRAINING_LAYERS; l++) grads[l] = gen_alloc(g, 16 * TIDE_MiB, 0);
        for (size_t l = TRAINING_LAYERS; l-- > 0;) {
            block small = gen_alloc(g, seq * TRAINING_HIDDEN * 2, 0);
            block large = gen_alloc(g, seq * TRAINING_HIDDEN * 8, 0);
            for (size_t i = 0; i < 3; i++) gen_free(g, &acts[l][i]);
            gen_free(g, &large);
            gen_free(g, &small);
        }
        block optimizer[4];
        for (size_t i = 0; i < 4; i++) optimizer[i] = gen_alloc(g, 32 * TIDE_MiB, 0);
        for (size_t i = 0; i < 4; i++) gen_free(g, &optimizer[i]);
        gen_wait(g, 100 * MS);
    }
    for (size_t l = 0; l < TRAINING_LAYERS; l++) gen_free(g, &params[l]);
    for (size_t l = 0; l < TRAINING_LAYERS; l++) gen_free(g, &grads[l]);
    return 0;
}

/* ---------------------------------------------------------------- table */

const scenario_param_info scenario_param_table[SCENARIO_PARAM_COUNT_] = {
    [SCENARIO_PARAM_CONTEXT] = {"--context", "context length in tokens", offsetof(scenario_params, context_tokens), 1,
                                1u << 24},
    [SCENARIO_PARAM_REQUESTS] = {"--requests", "number of requests", offsetof(scenario_params, requests), 1, 1000000},
    [SCENARIO_PARAM_STEPS] = {"--steps", "number of steps", offsetof(scenario_params, steps), 1, 100000000},
    [SCENARIO_PARAM_ROUNDS] = {"--rounds", "number of rounds", offsetof(scenario_params, rounds), 1, 100000},
    [SCENARIO_PARAM_MINUTES] = {"--minutes", "minutes of small temporaries", offsetof(scenario_params, minutes), 0,
                                100000},
    [SCENARIO_PARAM_SEED] = {"--seed", "seed of the random choices", offsetof(scenario_params, seed), 0, UINT64_MAX},
    [SCENARIO_PARAM_HOT] = {"--hot", "hot keys run again between requests", offsetof(scenario_params, hot_keys), 0,
                            1000},
    [SCENARIO_PARAM_CAP_MIB] = {"--cap-mib", "graph cache byte cap in MiB (0: run only without a cap; a graph larger runs eagerly)",
                                offsetof(scenario_params, cap_mib), 0, 1u << 30},
};

typedef int (*gen_fn)(gen *g, const scenario_params *p);

/* The generate entry of each scenario: runs its gen_fn over a generator. */
static int generate_with(gen_fn fn, const scenario_params *p, const scenario_sink *sink) {
    gen *g = calloc(1, sizeof *g);
    if (!g) return -1;
    g->sink = sink;
    g->next_address = 0x7f0000000000ull;
    g->rng = p->seed;
    fn(g, p);
    gen_flush(g);
    int status = g->stopped ? -1 : 0;
    free(g);
    return status;
}

#define GENERATOR(name)                                                                   \
    static int generate_##name(const scenario_params *p, const scenario_sink *sink) {    \
        return generate_with(gen_##name, p, sink);                                        \
    }

/* ------------------------------------------------------------ diffusion */

/* An image-diffusion server (not a failure mode of docs/failure-modes.md:
 * a workload whose sizes jump with the square of the resolution). 2000 MiB
 * of weights, then requests at a resolution of 512..1280 pixels a side
 * (six, at random), each 25 denoising steps of a 4-level U-Net. Down, per
 * level: two activations of latent x 40 / 2^level (the latent: pixels/64
 * x 4 channels in f16), one freed at once, the other kept as the skip
 * connection until the up path; then an attention temporary of
 * (pixels/64/4^level)^2 / 4 B + 4 KiB. Up, per level: a 1 MiB temporary,
 * then the skip freed. After the steps a VAE decode temporary of pixels x
 * 256 B. 30 ms a step, 50 ms the decode. The level-0 attention temporary
 * is 4 MiB at 512 and 156 MiB at 1280, the decode 64..400 MiB: each request
 * wants other large sizes than the one before, made while the step's skip
 * connections are live, and a pool that kept what it made for one
 * resolution would hold it through the others. */
static const uint64_t diffusion_sides[6] = {512, 640, 768, 896, 1024, 1280};
#define DIFFUSION_STEPS 25
#define DIFFUSION_LEVELS 4
static int gen_diffusion(gen *g, const scenario_params *p) {
    block weights = gen_alloc(g, 2000 * TIDE_MiB, 0);
    for (uint64_t request = 1; request <= p->requests && !g->stopped; request++) {
        gen_mark(g, request);
        uint64_t side = diffusion_sides[gen_random(g) % 6];
        uint64_t latent_pixels = (side / 8) * (side / 8);
        uint64_t latent_bytes = latent_pixels * 4 * 2;
        for (int step = 0; step < DIFFUSION_STEPS && !g->stopped; step++) {
            block skips[DIFFUSION_LEVELS];
            for (int level = 0; level < DIFFUSION_LEVELS; level++) {
                uint64_t activation = (latent_bytes >> level) * 40;
                block a = gen_alloc(g, activation, 0);
                skips[level] = gen_alloc(g, activation, 0);
                gen_free(g, &a);
                uint64_t tokens = latent_pixels >> (2 * level);
                block attention = gen_alloc(g, tokens * tokens / 4 + 4 * TIDE_KiB, 0);
                gen_free(g, &attention);
            }
            for (int level = DIFFUSION_LEVELS; level-- > 0;) {
                block up = gen_alloc(g, TIDE_MiB, 0);
                gen_free(g, &up);
                gen_free(g, &skips[level]);
            }
            gen_wait(g, 30 * MS);
        }
        block decode = gen_alloc(g, side * side * 128 * 2, 0);
        gen_free(g, &decode);
        gen_wait(g, 50 * MS);
    }
    gen_free(g, &weights);
    return 0;
}

/* ------------------------------------------------------ mixture of experts */

/* A mixture-of-experts layer (not a failure mode: a workload of many
 * sizes at once). 1500 MiB of weights; every step a batch of 8, 64, 512,
 * 4096 or 16384 tokens (at random) is routed at random over 64 experts: a
 * routing buffer of tokens x 64 x 4 B, then per expert an input buffer of
 * (its tokens, at least 1) x 2048 x 2 B, then per expert an intermediate
 * of 4 times that, all live together; the intermediates freed, an output
 * of tokens x 2048 x 2 B, then the inputs, the routing buffer and the
 * output freed. 5 ms a step. 130 blocks a step of sizes that follow the
 * routing (4 KiB .. about 1.3 MiB an input at the largest batch), and from
 * one step to the next the batch, and with it every size, can change 2000
 * times over. */
#define MOE_EXPERTS 64
#define MOE_HIDDEN 2048
static int gen_moe(gen *g, const scenario_params *p) {
    static const uint64_t batches[5] = {1, 8, 64, 512, 2048};
    block weights = gen_alloc(g, 1500 * TIDE_MiB, 0);
    block inputs[MOE_EXPERTS], intermediates[MOE_EXPERTS];
    for (uint64_t step = 1; step <= p->steps && !g->stopped; step++) {
        gen_mark(g, step);
        uint64_t tokens = batches[gen_random(g) % 5] * 8, counts[MOE_EXPERTS] = {0};
        for (uint64_t t = 0; t < tokens; t++) counts[gen_random(g) % MOE_EXPERTS]++;
        block route = gen_alloc(g, tokens * MOE_EXPERTS * 4, 0);
        for (size_t e = 0; e < MOE_EXPERTS; e++)
            inputs[e] = gen_alloc(g, (counts[e] ? counts[e] : 1) * MOE_HIDDEN * 2, 0);
        for (size_t e = 0; e < MOE_EXPERTS; e++)
            intermediates[e] = gen_alloc(g, (counts[e] ? counts[e] : 1) * MOE_HIDDEN * 8, 0);
        for (size_t e = 0; e < MOE_EXPERTS; e++) gen_free(g, &intermediates[e]);
        block out = gen_alloc(g, tokens * MOE_HIDDEN * 2, 0);
        for (size_t e = 0; e < MOE_EXPERTS; e++) gen_free(g, &inputs[e]);
        gen_free(g, &route);
        gen_free(g, &out);
        gen_wait(g, 5 * MS);
    }
    gen_free(g, &weights);
    return 0;
}

/* ------------------------------------------------------------- sawtooth */

/* A buffer reallocated larger every step, back to its base size every
 * 1000 steps (adversarial, not a failure mode: kv-realloc with the slope
 * and the base drawn from the seed). The seed picks a base of 16, 64 or
 * 200 MiB and a growth of 4 KiB, 64 KiB or 1 MiB a step; at step s the
 * buffer is base + growth x (s mod 1000), allocated before the previous one
 * is freed. Every 13th step a block of 512 KiB, 3 MiB or 12 MiB that lives
 * 100..5000 steps (uniform) is made. 10 ms a step. Blocks never move, so
 * the buffer never fits the hole it left and walks through the address
 * space, the long-lived blocks land in the holes and pin them, and every
 * 1000 steps the climb starts over among them. */
#define SAWTOOTH_PERIOD 1000
#define SAWTOOTH_EVERY 13
#define SAWTOOTH_LIFE_MIN 100
#define SAWTOOTH_LIFE_MAX 5000
typedef struct sawtooth_block {
    uint64_t until; /* the step at which it is freed */
    block b;
} sawtooth_block;

static int gen_sawtooth(gen *g, const scenario_params *p) {
    /* live at once: those made in the last SAWTOOTH_LIFE_MAX steps */
    enum { MAX_LIVE = SAWTOOTH_LIFE_MAX / SAWTOOTH_EVERY + 2 };
    static const uint64_t bases[3] = {16 * TIDE_MiB, 64 * TIDE_MiB, 200 * TIDE_MiB};
    static const uint64_t growths[3] = {4 * TIDE_KiB, 64 * TIDE_KiB, TIDE_MiB};
    static const uint64_t long_sizes[3] = {512 * TIDE_KiB, 3 * TIDE_MiB, 12 * TIDE_MiB};
    uint64_t base = bases[gen_random(g) % 3], growth = growths[gen_random(g) % 3];
    sawtooth_block live[MAX_LIVE]; /* in the order they were made */
    size_t live_count = 0;
    block buffer = {0, 0, 0};
    for (uint64_t step = 0; step < p->steps && !g->stopped; step++) {
        gen_mark(g, step + 1);
        gen_realloc(g, &buffer, base + growth * (step % SAWTOOTH_PERIOD), 0);
        if (step % SAWTOOTH_EVERY == 0 && live_count < MAX_LIVE) {
            uint64_t until = step + gen_between(g, SAWTOOTH_LIFE_MIN, SAWTOOTH_LIFE_MAX);
            live[live_count++] = (sawtooth_block){until, gen_alloc(g, long_sizes[gen_random(g) % 3], 0)};
        }
        size_t kept = 0;
        for (size_t i = 0; i < live_count; i++) {
            if (live[i].until <= step) gen_free(g, &live[i].b);
            else live[kept++] = live[i];
        }
        live_count = kept;
        gen_wait(g, 10 * MS);
    }
    for (size_t i = 0; i < live_count; i++) gen_free(g, &live[i].b);
    gen_free(g, &buffer);
    return 0;
}

/* ------------------------------------------------------ speculative decoding */

/* Speculative decoding (not a failure mode: two KV caches growing at
 * different rates). At context t, every step drafts k = 2..6 tokens: per
 * draft token i the draft model's KV cache is reallocated to (t + i) x 64
 * KiB (the new one allocated before the old is freed) and a 300 KiB
 * temporary made and freed; then the target model's KV cache is
 * reallocated to (t + k) x 512 KiB and the verify temporaries of k x 4,
 * k x 16 and k x 4 MiB are made and freed in reverse. 1..k of the drafts
 * are accepted (t grows by that), and past 4000 tokens the context starts
 * over at 100. 30 ms a step. Both caches walk through the address space
 * as kv-realloc's does, the draft's k times a step by 64 KiB, the target's
 * once a step (1.5 MiB smaller to 3 MiB larger), to about 2 GiB: the holes
 * each leaves are the wrong size for the other and for the verify
 * temporaries. */
#define SPEC_DECODE_START 100
#define SPEC_DECODE_CONTEXT 4000
static int gen_spec_decode(gen *g, const scenario_params *p) {
    static const uint64_t verify_mib[3] = {4, 16, 4};
    block draft = {0, 0, 0}, target = {0, 0, 0};
    uint64_t t = SPEC_DECODE_START;
    for (uint64_t step = 1; step <= p->steps && !g->stopped; step++) {
        gen_mark(g, step);
        uint64_t k = gen_between(g, 2, 6);
        for (uint64_t i = 0; i < k; i++) {
            gen_realloc(g, &draft, (t + i) * 64 * TIDE_KiB, 0);
            block temporary = gen_alloc(g, 300 * TIDE_KiB, 0);
            gen_free(g, &temporary);
        }
        gen_realloc(g, &target, (t + k) * 512 * TIDE_KiB, 0);
        block verify[3];
        for (size_t i = 0; i < 3; i++) verify[i] = gen_alloc(g, k * verify_mib[i] * TIDE_MiB, 0);
        gen_free_reverse(g, verify, 3, 0);
        t += gen_between(g, 1, k);
        if (t > SPEC_DECODE_CONTEXT) t = SPEC_DECODE_START;
        gen_wait(g, 30 * MS);
    }
    gen_free(g, &draft);
    gen_free(g, &target);
    return 0;
}

GENERATOR(fa_decode)
GENERATOR(size_rotation)
GENERATOR(oom_reclaim)
GENERATOR(high_water)
GENERATOR(out_of_order)
GENERATOR(cross_stream)
GENERATOR(image_requests)
GENERATOR(mixed_lifetimes)
GENERATOR(kv_realloc)
GENERATOR(batched_serving)
GENERATOR(heavy_tail)
GENERATOR(phases)
GENERATOR(training)
GENERATOR(diffusion)
GENERATOR(moe)
GENERATOR(sawtooth)
GENERATOR(spec_decode)

static const scenario scenarios[] = {
    {"fa-decode", "flash-attention decode, memory growing with the context (failure mode 1)",
     "every token t: K and V temporaries of n_kv x 2048 B, n_kv = 256*ceil((512+t)/256), and 20 small\n"
     "temporaries, freed in reverse; 20 ms a token",
     "token", SCENARIO_USES(SCENARIO_PARAM_CONTEXT), {.context_tokens = 131072}, NULL, 0, NULL, generate_fa_decode,
     NULL},
    {"size-rotation", "more sizes than slots (failure mode 2)",
     "300 distinct sizes, 1..300 MiB, allocated and freed in rotation, one a millisecond; a round\n"
     "goes through the 300 once",
     "step",
     SCENARIO_USES(SCENARIO_PARAM_ROUNDS), {.rounds = 4}, NULL, 0, NULL, generate_size_rotation, NULL},
    {"oom-reclaim", "out of memory with reclaimable cache (failure mode 3)",
     "8 GiB device: 6 GiB live, 40 x 45 MiB idle in the cache, then a 1.5 GiB request; it fits only if\n"
     "the pool gives back idle memory",
     "phase", 0, {0}, "sim:8GiB", 0, NULL, generate_oom_reclaim, NULL},
    {"high-water", "high-water mark (failure mode 5)",
     "4 GiB device: one 3 GiB temporary, then --minutes of 10 MiB temporaries at 20 Hz, then a 5 GiB\n"
     "request that cannot fit (an error, not an abort), then 100 more 10 MiB temporaries",
     "minute", SCENARIO_USES(SCENARIO_PARAM_MINUTES), {.minutes = 60}, "sim:4GiB", 0, NULL, generate_high_water,
     NULL},
    {"out-of-order", "out-of-order frees across streams (failure mode 6)",
     "alloc A on stream 1, alloc B on stream 2, free A, free B; sizes log-uniform 256 B..64 MiB",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 2000, .seed = 6},
     NULL, 0, NULL, generate_out_of_order, NULL},
    {"cross-stream", "cross-stream reuse (failure mode 11)",
     "alloc on stream 1, free, alloc the same size on stream 2, free, again on stream 1, then on\n"
     "stream 3; sizes 4 KiB, 3 MiB, 100 MiB in turn",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS), {.steps = 3000}, NULL, 0, NULL, generate_cross_stream, NULL},
    {"image-requests", "a vision-language server answering image+text requests (docs/failure-modes.md, background)",
     "per request 1-2 images of 64..1024 tokens through a vision encoder (stream 1, its own context),\n"
     "then prefill and decode of a 4B-class text model with a growing KV cache (stream 0); one\n"
     "conversation until --context is full. Default device: a 6 GiB GPU without VMM with 3 GiB\n"
     "taken by the weights (--occupy)",
     "request",
     SCENARIO_USES(SCENARIO_PARAM_REQUESTS) | SCENARIO_USES(SCENARIO_PARAM_CONTEXT) |
         SCENARIO_USES(SCENARIO_PARAM_SEED),
     {.requests = 100, .context_tokens = 16384, .seed = 1}, "sim:6GiB,novmm", 3 * TIDE_GiB, check_image_requests,
     generate_image_requests, NULL},
    {"mixed-lifetimes", "long-lived blocks made beside large temporaries (adversarial, not a failure mode)",
     "every step a temporary of 64..512 MiB; while it is live, 3 blocks of 1..30 MiB (stream 0 or\n"
     "1) that live 50 steps; a step a millisecond",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 3000, .seed = 1},
     NULL, 0, NULL, generate_mixed_lifetimes, NULL},
    {"kv-realloc", "a KV cache reallocated larger every token (adversarial, not a failure mode)",
     "every token a buffer of 8 MiB + 128 KiB x (tokens into the conversation) is allocated, then the\n"
     "previous one freed; every 7th token a 256 KiB block that lives 2000 tokens; a new conversation\n"
     "every --context tokens; 20 ms a token",
     "token", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_CONTEXT),
     {.steps = 6000, .context_tokens = 2000}, NULL, 0, NULL, generate_kv_realloc, NULL},
    {"batched-serving", "a server decoding a varying batch of sequences (model-shaped, not a failure mode)",
     "sequences join while the batch is below a fresh draw of 4..24, each with a prompt of 64..3200\n"
     "tokens (prefill temporaries) and 8 per-layer KV buffers of 4 KiB a token, reallocated one token\n"
     "larger every step (new allocated, then old freed); per step activations and a logits temporary\n"
     "sized by the batch; a sequence ends after an exponential number of steps (mean 300); 20 ms a step",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 3000, .seed = 1},
     NULL, 0, NULL, generate_batched_serving, NULL},
    {"heavy-tail", "heavy-tailed sizes and lifetimes on three streams (adversarial, not a failure mode)",
     "every step one block of a log-uniform size 512 B..256 MiB on stream 0, 1 or 2, living a Pareto\n"
     "number of steps (alpha 1.2, scale 5, at most 50000); half a millisecond a step",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 60000, .seed = 1},
     NULL, 0, NULL, generate_heavy_tail, NULL},
    {"phases", "a growing buffer and small-block churn in turn (adversarial, not a failure mode)",
     "rounds alternate: a buffer of 200..600 MiB reallocated 512 KiB larger every step for 400 steps,\n"
     "with a 1..40 MiB temporary a step (10 ms a step); then 500..1500 long-lived blocks of 64 KiB,\n"
     "192 KiB, 1 MiB or 3 MiB, one replaced at random 3000 times (1 ms apart)",
     "step", SCENARIO_USES(SCENARIO_PARAM_ROUNDS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.rounds = 6, .seed = 1},
     NULL, 0, NULL, generate_phases, NULL},
    {"training", "training steps of dynamic sequence length (model-shaped, not a failure mode)",
     "12 layers of parameters (16/32/64 MiB) and gradients (16 MiB); every step a sequence length of\n"
     "256..4096 x 1..4: forward keeps 3 activations a layer and frees a temporary, backward (last layer\n"
     "first) frees them between two gradient temporaries, then 4 x 32 MiB optimizer temporaries;\n"
     "100 ms a step",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 200, .seed = 1},
     NULL, 0, NULL, generate_training, NULL},
    {"diffusion", "an image-diffusion server at random resolutions (model-shaped, not a failure mode)",
     "2000 MiB of weights; per request a resolution of 512..1280 at random, 25 steps of a 4-level U-Net\n"
     "(per level two activations, one kept as the skip until the up path, and an attention temporary of\n"
     "(pixels/64/4^level)^2/4 B + 4 KiB), then a VAE decode temporary; 30 ms a step",
     "request", SCENARIO_USES(SCENARIO_PARAM_REQUESTS) | SCENARIO_USES(SCENARIO_PARAM_SEED),
     {.requests = 40, .seed = 1}, NULL, 0, NULL, generate_diffusion, NULL},
    {"moe", "a mixture-of-experts layer, a buffer per expert (model-shaped, not a failure mode)",
     "1500 MiB of weights; every step 8..16384 tokens routed at random over 64 experts: a routing\n"
     "buffer, per expert an input of (its tokens, at least 1) x 4 KiB and an intermediate 4 times\n"
     "that, an output; 5 ms a step",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 3000, .seed = 1},
     NULL, 0, NULL, generate_moe, NULL},
    {"sawtooth", "a buffer growing every step, back to its base every 1000 (adversarial, not a failure mode)",
     "every step a buffer of base + growth x (step mod 1000) is allocated, then the previous one freed\n"
     "(base 16, 64 or 200 MiB, growth 4 KiB, 64 KiB or 1 MiB a step, both from the seed); every 13th\n"
     "step a block of 512 KiB, 3 MiB or 12 MiB that lives 100..5000 steps; 10 ms a step",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 20000, .seed = 1},
     NULL, 0, NULL, generate_sawtooth, NULL},
    {"spec-decode", "speculative decoding, a draft and a target KV cache (model-shaped, not a failure mode)",
     "per step k = 2..6 draft tokens, each reallocating the draft KV cache to (t+i) x 64 KiB, with a\n"
     "300 KiB temporary; then the target KV cache reallocated to (t+k) x 512 KiB and verify temporaries\n"
     "of k x 4, 16 and 4 MiB; t grows by 1..k, back to 100 past 4000 tokens; 30 ms a step",
     "step", SCENARIO_USES(SCENARIO_PARAM_STEPS) | SCENARIO_USES(SCENARIO_PARAM_SEED), {.steps = 4000, .seed = 1},
     NULL, 0, NULL, generate_spec_decode, NULL},
    {"graph-churn", "a graph cache under new graph topologies at every request (failure mode 7)",
     "each request runs a graph of a new topology (50..250 nodes) under a new key through the graph\n"
     "cache, then 3 of --hot steady keys; once with the byte cap, once without, on fresh devices.\n"
     "The default device pools graph memory like the CUDA driver. Takes --device, --json, --plot",
     "request",
     SCENARIO_USES(SCENARIO_PARAM_REQUESTS) | SCENARIO_USES(SCENARIO_PARAM_HOT) |
         SCENARIO_USES(SCENARIO_PARAM_CAP_MIB) | SCENARIO_USES(SCENARIO_PARAM_SEED),
     {.requests = 2000, .hot_keys = 10, .cap_mib = 256, .seed = 7}, "sim:64GiB,graph_node_bytes=48KiB,graphpool", 0,
     NULL, NULL, graph_churn_run},
};

const scenario *scenario_find(const char *name) {
    for (size_t i = 0; i < sizeof scenarios / sizeof *scenarios; i++)
        if (!strcmp(scenarios[i].name, name)) return &scenarios[i];
    return NULL;
}

const scenario *scenario_list(size_t *count) {
    *count = sizeof scenarios / sizeof *scenarios;
    return scenarios;
}

void scenario_defaults(const scenario *s, scenario_params *params) { *params = s->defaults; }

/* ------------------------------------------------ replaying a scenario */

typedef struct replay_target {
    replay_run *const *runs;
    size_t run_count;
    scenario_units *units;
    bool out_of_memory;
} replay_target;

static int feed_runs(void *user, const trace_event *events, size_t count) {
    replay_target *t = user;
    for (size_t i = 0; i < t->run_count; i++) replay_feed(t->runs[i], events, count);
    return 0;
}

static void note_unit(void *user, uint64_t unit, uint64_t events_before) {
    replay_target *t = user;
    scenario_units *u = t->units;
    if (u->count == u->capacity) {
        size_t capacity = u->capacity ? 2 * u->capacity : 1024;
        scenario_unit_start *starts = realloc(u->starts, capacity * sizeof *starts);
        if (!starts) {
            t->out_of_memory = true;
            return;
        }
        u->starts = starts;
        u->capacity = capacity;
    }
    u->starts[u->count++] = (scenario_unit_start){unit, events_before};
}

int scenario_replay(const scenario *s, const scenario_params *params, replay_run *const *runs, size_t run_count,
                    scenario_units *units) {
    replay_target target = {runs, run_count, units, false};
    scenario_sink sink = {feed_runs, units ? note_unit : NULL, &target};
    int status = s->generate(params, &sink);
    return status == 0 && !target.out_of_memory ? 0 : -1;
}

uint64_t scenario_unit_of(const scenario_units *units, uint64_t event) {
    /* the last start with events_before < event */
    size_t low = 0, high = units->count;
    while (low < high) {
        size_t mid = low + (high - low) / 2;
        if (units->starts[mid].events_before < event) low = mid + 1;
        else high = mid;
    }
    return low ? units->starts[low - 1].unit : 0;
}

void scenario_units_free(scenario_units *units) {
    free(units->starts);
    *units = (scenario_units){0};
}
