/* SPDX-License-Identifier: MIT */
/* Simulated device: spec parsing, capacity, VMM and plain memory, the
 * virtual clock, events and ordering, the hazard checker, fault injection,
 * occupancy and graph executables. */
#include "check.h"
#include "internal.h"

#include <string.h>

static tp_device *open_sim(const char *spec, test_log *log) {
    tp_device_config cfg = {0};
    cfg.log = test_log_fn;
    cfg.log_user = log;
    tp_device *dev = NULL;
    REQUIRE(tp_device_open(spec, &cfg, &dev) == TP_OK);
    return dev;
}

static void test_default_spec_is_16gib_with_vmm(void) {
    tp_device *dev = NULL;
    CHECK_OK(tp_device_open("sim", NULL, &dev));
    tp_device_info info;
    CHECK_OK(tp_device_get_info(dev, &info));
    CHECK_EQ_U64(info.capacity_bytes, 16 * TEST_GiB);
    CHECK(info.vmm_enabled);
    CHECK_EQ_U64(info.granularity_bytes, 2 * TEST_MiB);
    CHECK_EQ_STR(info.backend, "sim");
    CHECK_OK(tp_device_close(dev));
}

static void test_spec_options_set_capacity_vmm_and_granularity(void) {
    tp_device *dev = NULL;
    tp_device_info info;
    CHECK_OK(tp_device_open("sim:6GiB,novmm,gran=4MiB", NULL, &dev));
    CHECK_OK(tp_device_get_info(dev, &info));
    CHECK_EQ_U64(info.capacity_bytes, 6 * TEST_GiB);
    CHECK(!info.vmm_enabled);
    CHECK_EQ_U64(info.granularity_bytes, 4 * TEST_MiB);
    CHECK_OK(tp_device_close(dev));
}

static void test_spec_capacity_may_be_fractional(void) {
    tp_device *dev = NULL;
    tp_device_info info;
    CHECK_OK(tp_device_open("sim:1.5GiB", NULL, &dev));
    CHECK_OK(tp_device_get_info(dev, &info));
    CHECK_EQ_U64(info.capacity_bytes, 3 * TEST_GiB / 2);
    CHECK_OK(tp_device_close(dev));
}

static void test_bad_specs_are_refused_and_explained(void) {
    tp_device *dev = NULL;
    test_log log = {0};
    tp_device_config cfg = {.log = test_log_fn, .log_user = &log};
    const char *bad[] = {"", "simx", "sim:", "sim:lots", "sim:6GiB,turbo", "sim:6GiB,gran=3MiB", "gpu:0",
                         "cuda:x", "sim:0"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        dev = (tp_device *)0x1;
        CHECK_STATUS(tp_device_open(bad[i], &cfg, &dev), TP_ERR_BAD_SPEC);
        CHECK_EQ_PTR(dev, NULL);
    }
    CHECK_GE_U64(log.errors, (int)(sizeof bad / sizeof *bad)); /* each one explained */
    CHECK_STATUS(tp_device_open("sim", NULL, NULL), TP_ERR_INVALID_ARGUMENT);
}

static void test_granularity_is_a_power_of_two_from_4kib_to_1gib(void) {
    /* gran=1 or 2 once made a 2.4 G-entry page table and a 10 s check. */
    test_log log = {0};
    tp_device_config cfg = {.log = test_log_fn, .log_user = &log};
    const char *bad[] = {"sim,gran=1", "sim,gran=2", "sim,gran=2KiB", "sim,gran=2GiB", "sim,gran=0",
                         "sim,gran=6KiB"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        tp_device *dev = (tp_device *)0x1;
        CHECK_STATUS(tp_device_open(bad[i], &cfg, &dev), TP_ERR_BAD_SPEC);
        CHECK_EQ_PTR(dev, NULL);
        if (dev && dev != (tp_device *)0x1) tp_device_close(dev);
    }
    CHECK_EQ_I64(log.errors, (long long)(sizeof bad / sizeof *bad)); /* each one explained */
    const char *good[] = {"sim,gran=4KiB", "sim,gran=1GiB"};
    uint64_t want[] = {4 * 1024, TEST_GiB};
    for (size_t i = 0; i < 2; i++) {
        tp_device *dev = NULL;
        CHECK_OK(tp_device_open(good[i], &cfg, &dev));
        if (!dev) continue;
        tp_device_info info;
        CHECK_OK(tp_device_get_info(dev, &info));
        CHECK_EQ_U64(info.granularity_bytes, want[i]);
        CHECK_OK(tp_device_close(dev));
    }
}

static void test_status_and_log_level_names(void) {
    CHECK_EQ_STR(tp_status_name(TP_OK), "TP_OK");
    CHECK_EQ_STR(tp_status_name(TP_ERR_OUT_OF_MEMORY), "TP_ERR_OUT_OF_MEMORY");
    CHECK_EQ_STR(tp_status_name((tp_status)999), "TP_UNKNOWN_STATUS");
    CHECK_EQ_STR(tp_log_level_name(TP_LOG_DEBUG), "debug");
    CHECK_EQ_STR(tp_log_level_name(TP_LOG_INFO), "info");
    CHECK_EQ_STR(tp_log_level_name(TP_LOG_WARN), "warn");
    CHECK_EQ_STR(tp_log_level_name(TP_LOG_ERROR), "error");
    CHECK_EQ_STR(tp_log_level_name((tp_log_level)7), "unknown");
    for (int s = 0; s < TP_STATUS_COUNT_; s++) {
        CHECK(strncmp(tp_status_name((tp_status)s), "TP_", 3) == 0);
        CHECK_GT_U64(strlen(tp_status_describe((tp_status)s)), 3);
    }
}

static void test_parse_bytes(void) {
    uint64_t v = 0;
    CHECK(tp_parse_bytes("6GiB", &v));
    CHECK_EQ_U64(v, 6 * TEST_GiB);
    CHECK(tp_parse_bytes("512 MiB", &v));
    CHECK_EQ_U64(v, 512 * TEST_MiB);
    CHECK(tp_parse_bytes("10KB", &v));
    CHECK_EQ_U64(v, 10000);
    CHECK(tp_parse_bytes("4096", &v));
    CHECK_EQ_U64(v, 4096);
    CHECK(tp_parse_bytes("2g", &v));
    CHECK_EQ_U64(v, 2 * TEST_GiB);
    CHECK(!tp_parse_bytes("-1", &v));
    CHECK(!tp_parse_bytes("12 parsecs", &v));
    CHECK(!tp_parse_bytes("", &v));
    CHECK(!tp_parse_bytes("1e30 TiB", &v));
}

static void test_vmm_memory_map_unmap_and_plain_allocations(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:64MiB", &log);
    const tpi_device_ops *ops = dev->ops;
    uint64_t va = 0, free_bytes, total;
    CHECK_OK(ops->va_reserve(dev, 256 * TEST_MiB, 0, &va)); /* address space may exceed capacity */
    CHECK_EQ_U64(va % (2 * TEST_MiB), 0);
    CHECK_OK(ops->map(dev, va, 32 * TEST_MiB, 0));
    CHECK_STATUS(ops->map(dev, va, 2 * TEST_MiB, 0), TP_ERR_INVALID_ARGUMENT);            /* overlap */
    CHECK_STATUS(ops->map(dev, va + TEST_MiB, 2 * TEST_MiB, 0), TP_ERR_INVALID_ARGUMENT); /* unaligned */
    CHECK_STATUS(ops->map(dev, va + 32 * TEST_MiB, 34 * TEST_MiB, 0), TP_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(ops->map(dev, va + 255 * TEST_MiB, 4 * TEST_MiB, 0), TP_ERR_INVALID_ARGUMENT); /* past end */
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_EQ_U64(total, 64 * TEST_MiB);
    CHECK_EQ_U64(free_bytes, 32 * TEST_MiB);
    uint64_t ptr = 0;
    CHECK_OK(ops->mem_alloc(dev, 1000, &ptr));
    CHECK_EQ_U64(ptr % 512, 0);
    CHECK_STATUS(ops->mem_free(dev, ptr + 256, 1000), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(ops->mem_free(dev, ptr, 1000));
    CHECK_STATUS(ops->mem_free(dev, ptr, 1000), TP_ERR_INVALID_ARGUMENT); /* double free */
    CHECK_STATUS(ops->va_release(dev, va, 256 * TEST_MiB), TP_ERR_INVALID_ARGUMENT); /* still mapped */
    /* Pages unmap in any runs, not only as mapped; holes are refused. */
    CHECK_OK(ops->unmap(dev, va + 4 * TEST_MiB, 8 * TEST_MiB));
    CHECK_STATUS(ops->unmap(dev, va, 8 * TEST_MiB), TP_ERR_INVALID_ARGUMENT); /* runs into the hole */
    CHECK_STATUS(ops->unmap(dev, va + 4 * TEST_MiB, 2 * TEST_MiB), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(ops->map(dev, va + 6 * TEST_MiB, 2 * TEST_MiB, 0));
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_EQ_U64(free_bytes, 38 * TEST_MiB);
    CHECK_OK(ops->unmap(dev, va, 4 * TEST_MiB));
    CHECK_OK(ops->unmap(dev, va + 6 * TEST_MiB, 2 * TEST_MiB));
    CHECK_OK(ops->unmap(dev, va + 12 * TEST_MiB, 20 * TEST_MiB));
    CHECK_OK(ops->va_release(dev, va, 256 * TEST_MiB));
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.physical_used_bytes, 0);
    CHECK_EQ_U64(c.physical_peak_bytes, 32 * TEST_MiB + 1000);
    CHECK_EQ_U64(c.calls[TP_SIM_OP_MAP], 6);
    CHECK_EQ_U64(c.calls[TP_SIM_OP_MALLOC], 1);
    CHECK_EQ_U64(c.calls[TP_SIM_OP_UNMAP], 6);
    CHECK_OK(tp_device_close(dev));
}

/* Chunks: one physical allocation for several pages; unmapped only whole. */
static void test_vmm_chunks_unmap_only_whole(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:64MiB", &log);
    const tpi_device_ops *ops = dev->ops;
    uint64_t va = 0;
    tp_sim_counters c;
    CHECK_OK(ops->va_reserve(dev, 256 * TEST_MiB, 0, &va));
    CHECK_OK(ops->map(dev, va, 20 * TEST_MiB, 8 * TEST_MiB)); /* 8 + 8 + 4 */
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.map_chunks, 3);
    CHECK_EQ_U64(c.map_chunks_made, 3);
    CHECK_STATUS(ops->map(dev, va + 32 * TEST_MiB, 4 * TEST_MiB, 3 * TEST_MiB), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ops->unmap(dev, va, 4 * TEST_MiB), TP_ERR_INVALID_ARGUMENT);               /* cuts the first */
    CHECK_STATUS(ops->unmap(dev, va + 2 * TEST_MiB, 6 * TEST_MiB), TP_ERR_INVALID_ARGUMENT); /* starts inside */
    CHECK_STATUS(ops->unmap(dev, va + 8 * TEST_MiB, 10 * TEST_MiB), TP_ERR_INVALID_ARGUMENT); /* ends inside */
    CHECK_OK(ops->unmap(dev, va + 8 * TEST_MiB, 8 * TEST_MiB));                              /* the middle one */
    CHECK_STATUS(ops->unmap(dev, va, 20 * TEST_MiB), TP_ERR_INVALID_ARGUMENT);               /* over the hole */
    CHECK_OK(ops->map(dev, va + 8 * TEST_MiB, 8 * TEST_MiB, 64 * TEST_MiB)); /* a chunk larger than the run */
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.map_chunks, 3);
    CHECK_EQ_U64(c.map_chunks_made, 4);
    CHECK_OK(ops->unmap(dev, va, 20 * TEST_MiB)); /* whole chunks of two map calls, in one */
    CHECK_OK(ops->map(dev, va, 6 * TEST_MiB, 0)); /* 0: a chunk per page */
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.map_chunks, 3);
    CHECK_OK(ops->unmap(dev, va + 2 * TEST_MiB, 2 * TEST_MiB));
    CHECK_OK(ops->unmap(dev, va, 2 * TEST_MiB));
    CHECK_OK(ops->unmap(dev, va + 4 * TEST_MiB, 2 * TEST_MiB));
    CHECK_OK(ops->va_release(dev, va, 256 * TEST_MiB));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.physical_used_bytes, 0);
    CHECK_EQ_U64(c.map_chunks, 0);
    CHECK_OK(tp_device_close(dev));
}

static void test_novmm_refuses_reservations_and_allocates_without_host_memory(void) {
    /* No VMM: reservations are refused; host memory does not scale with
     * the device (a 140 GiB device opens and runs). */
    test_log log = {0};
    tp_device *dev = open_sim("sim:140GiB,novmm", &log);
    uint64_t va = 0;
    CHECK_NE_U64(dev->ops->va_reserve(dev, 2 * TEST_MiB, 0, &va), TP_OK);
    uint64_t big;
    CHECK_OK(dev->ops->mem_alloc(dev, 100 * TEST_GiB, &big));
    CHECK_OK(dev->ops->mem_free(dev, big, 100 * TEST_GiB));
    CHECK_OK(tp_device_close(dev));
}

static void test_clock_events_hazards(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    const tpi_device_ops *ops = dev->ops;
    tp_stream s1, s2;
    CHECK_OK(tp_stream_create(dev, &s1));
    CHECK_OK(tp_stream_create(dev, &s2));
    uint64_t buf = 0;
    CHECK_OK(ops->mem_alloc(dev, TEST_MiB, &buf));
    tp_range r = {buf, TEST_MiB};
    CHECK_OK(tp_sim_launch(dev, s1, 1000, &r, 1)); /* 0..1000 */
    CHECK_OK(tp_sim_launch(dev, s1, 500, &r, 1));  /* 1000..1500: stream order */
    tp_event e;
    CHECK_OK(tp_event_create(dev, &e));
    CHECK_OK(tp_event_record(dev, e, s1));
    CHECK_STATUS(tp_event_query(dev, e), TP_NOT_READY);
    /* Handing the buffer out on s1 is fine (same stream), on s2 a hazard. */
    CHECK_EQ_U64(ops->check_handout(dev, buf, TEST_MiB, s1), 0);
    CHECK_EQ_U64(ops->check_handout(dev, buf, TEST_MiB, s2), 2);
    /* After s2 waits on the event, it is ordered after both kernels. */
    CHECK_OK(tp_stream_wait_event(dev, s2, e));
    CHECK_EQ_U64(ops->check_handout(dev, buf, TEST_MiB, s2), 0);
    /* s2's own work now starts after 1500. */
    CHECK_OK(tp_sim_launch(dev, s2, 100, &r, 1));
    tp_event e2;
    CHECK_OK(tp_event_create(dev, &e2));
    CHECK_OK(tp_event_record(dev, e2, s2));
    CHECK_OK(tp_event_synchronize(dev, e2));
    uint64_t now;
    CHECK_OK(tp_sim_now(dev, &now));
    CHECK_EQ_U64(now, 1600);
    CHECK_OK(tp_event_query(dev, e));
    /* Everything has completed: no hazards anywhere. */
    CHECK_EQ_U64(ops->check_handout(dev, buf, TEST_MiB, TP_STREAM_DEFAULT), 0);
    /* Freeing memory a pending kernel uses is a hazard. */
    CHECK_OK(tp_sim_launch(dev, TP_STREAM_DEFAULT, 50, &r, 1));
    CHECK_OK(ops->mem_free(dev, buf, TEST_MiB));
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.hazards_handout, 2);
    CHECK_EQ_U64(c.hazards_free, 1);
    CHECK_EQ_U64(c.hazards, 3);
    CHECK_EQ_U64(c.pending_kernels, 1);
    /* Work on memory that is not there. */
    CHECK_OK(tp_sim_launch(dev, s1, 10, &r, 1));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.invalid_accesses, 1);
    CHECK_GE_U64(log.warnings, 4);
    CHECK_OK(tp_sim_advance(dev, 1000000));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.pending_kernels, 0);
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_event_destroy(dev, e2));
    CHECK_OK(tp_stream_destroy(dev, s1));
    CHECK_STATUS(tp_stream_destroy(dev, s1), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_launch(dev, s1, 1, NULL, 0), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK_OK(tp_device_close(dev));
}

static void test_transitive_order(void) {
    /* s3 waits on s2, which waited on s1: s3 is ordered after s1's kernel. */
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream s1, s2, s3;
    CHECK_OK(tp_stream_create(dev, &s1));
    CHECK_OK(tp_stream_create(dev, &s2));
    CHECK_OK(tp_stream_create(dev, &s3));
    uint64_t buf;
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &buf));
    tp_range r = {buf, 4096};
    CHECK_OK(tp_sim_launch(dev, s1, 1000, &r, 1));
    tp_event a, b;
    CHECK_OK(tp_event_create(dev, &a));
    CHECK_OK(tp_event_create(dev, &b));
    CHECK_OK(tp_event_record(dev, a, s1));
    CHECK_OK(tp_stream_wait_event(dev, s2, a));
    CHECK_OK(tp_event_record(dev, b, s2));
    CHECK_EQ_U64(dev->ops->check_handout(dev, buf, 4096, s3), 1);
    CHECK_OK(tp_stream_wait_event(dev, s3, b));
    CHECK_EQ_U64(dev->ops->check_handout(dev, buf, 4096, s3), 0);
    CHECK_OK(tp_event_destroy(dev, a));
    CHECK_OK(tp_event_destroy(dev, b));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(dev->ops->mem_free(dev, buf, 4096));
    CHECK_OK(tp_device_close(dev));
}

static void test_faults(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB", &log);
    uint64_t p;
    /* After 2 successes, the next 3 mallocs fail, then it works again. */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_MALLOC, 2, 3, TP_ERR_OUT_OF_MEMORY));
    tp_status expected[] = {TP_OK, TP_OK, TP_ERR_OUT_OF_MEMORY, TP_ERR_OUT_OF_MEMORY, TP_ERR_OUT_OF_MEMORY, TP_OK};
    for (int i = 0; i < 6; i++) {
        tp_status st = dev->ops->mem_alloc(dev, 4096, &p);
        CHECK_STATUS(st, expected[i]);
        if (st == TP_OK) CHECK_OK(dev->ops->mem_free(dev, p, 4096));
    }
    /* ANY counts every kind; default status is TP_ERR_DEVICE. */
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_ANY, 1, 1, TP_OK));
    tp_event e;
    CHECK_OK(tp_event_create(dev, &e)); /* call 1 succeeds */
    CHECK_STATUS(dev->ops->mem_alloc(dev, 4096, &p), TP_ERR_DEVICE);
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &p));
    CHECK_OK(dev->ops->mem_free(dev, p, 4096));
    CHECK_OK(tp_sim_inject_fault(dev, TP_SIM_OP_FREE, 0, 100, TP_ERR_DEVICE));
    CHECK_OK(tp_sim_clear_faults(dev));
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &p));
    CHECK_OK(dev->ops->mem_free(dev, p, 4096));
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.faults_injected, 4);
    CHECK_STATUS(tp_sim_inject_fault(dev, TP_SIM_OP_COUNT_, 0, 1, TP_OK), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_device_close(dev));
}

static void test_occupy_and_graphs(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,graph_node_bytes=1MiB", &log);
    uint64_t free_bytes, total;
    CHECK_OK(tp_sim_occupy(dev, 900 * TEST_MiB));
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_EQ_U64(free_bytes, 124 * TEST_MiB);
    CHECK_STATUS(tp_sim_occupy(dev, 200 * TEST_MiB), TP_ERR_OUT_OF_MEMORY);
    tp_sim_graph_desc desc = {.node_count = 100, .topology_id = 7, .duration_ns = 10};
    tp_graph g;
    CHECK_OK(tp_sim_graph_create(dev, &desc, &g));
    tpi_graph_exec x;
    uint64_t bytes;
    CHECK_OK(dev->ops->graph_instantiate(dev, g, &x, &bytes));
    CHECK_EQ_U64(bytes, 100 * TEST_MiB);
    tpi_graph_exec y;
    CHECK_STATUS(dev->ops->graph_instantiate(dev, g, &y, &bytes), TP_ERR_OUT_OF_MEMORY); /* 24 MiB left */
    desc.topology_id = 8;
    tp_graph other;
    CHECK_OK(tp_sim_graph_create(dev, &desc, &other));
    CHECK_STATUS(dev->ops->graph_update(dev, x, other), TP_ERR_TOPOLOGY_MISMATCH);
    CHECK_OK(dev->ops->graph_update(dev, x, g));
    CHECK_OK(dev->ops->graph_launch(dev, x, TP_STREAM_DEFAULT));
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.graph_execs, 1);
    CHECK_EQ_U64(c.graph_exec_bytes, 100 * TEST_MiB);
    CHECK_EQ_U64(c.pending_kernels, 1);
    CHECK_OK(dev->ops->graph_destroy(dev, x));
    CHECK_OK(tp_sim_occupy(dev, 0));
    CHECK_OK(tp_device_mem_info(dev, &free_bytes, &total));
    CHECK_EQ_U64(free_bytes, TEST_GiB);
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_sim_graph_destroy(dev, other));
    CHECK_OK(tp_device_close(dev));
}

static void test_sim_calls_tell_bad_arguments_from_other_backends(void) {
    /* A missing output is an invalid argument; UNSUPPORTED means only "not
     * a simulated device". */
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB", &log);
    CHECK_STATUS(tp_sim_now(dev, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_get_counters(dev, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_graph_create(dev, NULL, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_graph_destroy(dev, NULL), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_launch(dev, TP_STREAM_DEFAULT, 1, NULL, 1), TP_ERR_INVALID_ARGUMENT);
    uint64_t now = 1;
    tp_sim_counters c;
    CHECK_STATUS(tp_sim_now(NULL, &now), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_get_counters(NULL, &c), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_advance(NULL, 1), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(tp_sim_occupy(NULL, 1), TP_ERR_INVALID_ARGUMENT);
    /* Another backend's device (a fake one: only its table's name counts). */
    tpi_device_ops other_ops = {.backend = "cuda"};
    tp_device other = {.ops = &other_ops};
    CHECK_STATUS(tp_sim_now(&other, &now), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(tp_sim_now(&other, NULL), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(tp_sim_get_counters(&other, NULL), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(tp_sim_advance(&other, 1), TP_ERR_UNSUPPORTED);
    CHECK_STATUS(tp_sim_clear_faults(&other), TP_ERR_UNSUPPORTED);
    CHECK_OK(tp_device_close(dev));
}

static void test_streams_run_out_busy_and_slots_are_reused(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB", &log);
    /* Slot 0 is the default stream: 63 more at once. */
    tp_stream streams[64];
    int made = 0;
    for (; made < 64; made++)
        if (tp_stream_create(dev, &streams[made]) != TP_OK) break;
    CHECK_EQ_I64(made, 63);
    tp_stream extra;
    int errors_before = log.errors;
    CHECK_STATUS(tp_stream_create(dev, &extra), TP_ERR_BUSY);
    CHECK_EQ_I64(log.errors, errors_before + 1); /* and says why */
    for (int i = 0; i < made; i++) CHECK_OK(tp_stream_destroy(dev, streams[i]));
    /* Destroyed streams give their slot back. */
    for (int i = 0; i < 10000; i++) {
        tp_stream s;
        tp_status st = tp_stream_create(dev, &s);
        CHECK_OK(st);
        if (st != TP_OK) break;
        CHECK_OK(tp_stream_destroy(dev, s));
    }
    /* A slot whose old kernels still run is not handed out while another
     * is free: its kernels would pass as the new stream's own. */
    uint64_t buf;
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &buf));
    tp_range r = {buf, 4096};
    tp_stream a, b;
    CHECK_OK(tp_stream_create(dev, &a));
    CHECK_OK(tp_sim_launch(dev, a, 1000, &r, 1));
    CHECK_OK(tp_stream_destroy(dev, a));
    CHECK_OK(tp_stream_create(dev, &b));
    CHECK_NE_PTR(b, a);
    CHECK_EQ_U64(dev->ops->check_handout(dev, buf, 4096, b), 1);
    CHECK_OK(tp_stream_destroy(dev, b));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(dev->ops->mem_free(dev, buf, 4096));
    CHECK_OK(tp_device_close(dev));
}

static void test_synchronize_waits_for_waited_events(void) {
    /* s2 waits on s1's work (ends at 5000); its own is empty. Its
     * synchronize returns only once s1's work is done too. */
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB,novmm", &log);
    tp_stream s1, s2, s3;
    CHECK_OK(tp_stream_create(dev, &s1));
    CHECK_OK(tp_stream_create(dev, &s2));
    CHECK_OK(tp_stream_create(dev, &s3));
    uint64_t buf, now;
    CHECK_OK(dev->ops->mem_alloc(dev, 4096, &buf));
    tp_range r = {buf, 4096};
    CHECK_OK(tp_sim_launch(dev, s1, 5000, &r, 1));
    tp_event e, f;
    CHECK_OK(tp_event_create(dev, &e));
    CHECK_OK(tp_event_create(dev, &f));
    CHECK_OK(tp_event_record(dev, e, s1));
    CHECK_OK(tp_stream_wait_event(dev, s2, e));
    CHECK_OK(tp_stream_synchronize(dev, s2));
    CHECK_OK(tp_sim_now(dev, &now));
    CHECK_EQ_U64(now, 5000);
    /* So freeing after that synchronize is no hazard. */
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.pending_kernels, 0);
    /* Transitively: s3 waits on s2, which waited on s1's next kernel. */
    CHECK_OK(tp_sim_launch(dev, s1, 3000, &r, 1)); /* 5000..8000 */
    CHECK_OK(tp_event_record(dev, e, s1));
    CHECK_OK(tp_stream_wait_event(dev, s2, e));
    CHECK_OK(tp_event_record(dev, f, s2));
    CHECK_OK(tp_stream_wait_event(dev, s3, f));
    CHECK_OK(tp_stream_synchronize(dev, s3));
    CHECK_OK(tp_sim_now(dev, &now));
    CHECK_EQ_U64(now, 8000);
    /* A destroyed stream's queued work still runs: a device synchronize
     * waits for it. */
    CHECK_OK(tp_sim_launch(dev, s1, 1000, &r, 1)); /* 8000..9000 */
    CHECK_OK(tp_stream_destroy(dev, s1));
    CHECK_OK(tp_device_synchronize(dev));
    CHECK_OK(tp_sim_now(dev, &now));
    CHECK_EQ_U64(now, 9000);
    CHECK_OK(dev->ops->mem_free(dev, buf, 4096));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.hazards, 0);
    CHECK_OK(tp_event_destroy(dev, e));
    CHECK_OK(tp_event_destroy(dev, f));
    CHECK_OK(tp_stream_destroy(dev, s2));
    CHECK_OK(tp_stream_destroy(dev, s3));
    CHECK_OK(tp_device_close(dev));
}

static void test_arithmetic_refuses_instead_of_wrapping(void) {
    test_log log = {0};
    tp_device *dev = open_sim("sim:1GiB", &log);
    const tpi_device_ops *ops = dev->ops;
    /* Occupy: used + request must not wrap past the capacity check. */
    CHECK_OK(tp_sim_occupy(dev, TEST_MiB));
    CHECK_STATUS(tp_sim_occupy(dev, UINT64_MAX), TP_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(tp_sim_occupy(dev, UINT64_MAX - TEST_MiB + 1), TP_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(tp_sim_occupy(dev, TEST_GiB), TP_ERR_OUT_OF_MEMORY);
    CHECK_OK(tp_sim_occupy(dev, TEST_GiB - TEST_MiB));
    CHECK_OK(tp_sim_occupy(dev, 0));
    /* Map, malloc: the same check. */
    uint64_t va = 0, p = 0;
    CHECK_OK(ops->va_reserve(dev, 4 * TEST_MiB, 0, &va));
    CHECK_OK(ops->map(dev, va, 2 * TEST_MiB, 0));
    CHECK_STATUS(ops->mem_alloc(dev, UINT64_MAX - TEST_MiB, &p), TP_ERR_OUT_OF_MEMORY);
    /* Ranges that run past 2^64 are refused wherever a range is taken. */
    uint64_t wrap_len = UINT64_MAX - va + 1 + 2 * TEST_MiB; /* va + wrap_len wraps to 2 MiB */
    CHECK_STATUS(ops->map(dev, va, wrap_len - wrap_len % (2 * TEST_MiB), 0), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ops->unmap(dev, va, wrap_len - wrap_len % (2 * TEST_MiB)), TP_ERR_INVALID_ARGUMENT);
    CHECK_STATUS(ops->mem_free(dev, UINT64_MAX - 10, 100), TP_ERR_INVALID_ARGUMENT);
    tp_range wrapping = {UINT64_MAX - 10, 100};
    CHECK_STATUS(tp_sim_launch(dev, TP_STREAM_DEFAULT, 10, &wrapping, 1), TP_ERR_INVALID_ARGUMENT);
    tp_sim_graph_desc desc = {.node_count = 1, .topology_id = 1, .duration_ns = 10, .ranges = &wrapping,
                              .range_count = 1};
    tp_graph g = NULL;
    CHECK_STATUS(tp_sim_graph_create(dev, &desc, &g), TP_ERR_INVALID_ARGUMENT);
    tp_sim_counters c;
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.pending_kernels, 0);
    CHECK_EQ_U64(c.invalid_accesses, 0);
    /* A kernel whose end would pass 2^64 ns is refused, not wrapped into
     * the past (where it would count as complete at once). */
    tp_range r = {va, 2 * TEST_MiB};
    CHECK_OK(tp_sim_launch(dev, TP_STREAM_DEFAULT, 10, &r, 1)); /* 0..10 */
    CHECK_STATUS(tp_sim_launch(dev, TP_STREAM_DEFAULT, UINT64_MAX, &r, 1), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_sim_advance(dev, UINT64_MAX - 1000));
    CHECK_STATUS(tp_sim_launch(dev, TP_STREAM_DEFAULT, 1001, &r, 1), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(tp_sim_launch(dev, TP_STREAM_DEFAULT, 1000, &r, 1)); /* ends at UINT64_MAX exactly */
    CHECK_STATUS(tp_sim_launch(dev, TP_STREAM_DEFAULT, 1, &r, 1), TP_ERR_INVALID_ARGUMENT); /* after it */
    /* A graph of that length cannot be launched either. */
    desc.ranges = &r;
    desc.duration_ns = UINT64_MAX;
    CHECK_OK(tp_sim_graph_create(dev, &desc, &g));
    tpi_graph_exec x;
    uint64_t bytes;
    CHECK_OK(ops->graph_instantiate(dev, g, &x, &bytes));
    CHECK_STATUS(ops->graph_launch(dev, x, TP_STREAM_DEFAULT), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(ops->graph_destroy(dev, x));
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    /* The pending kernel still counts: unmapping under it is a hazard. */
    CHECK_OK(ops->unmap(dev, va, 2 * TEST_MiB));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.hazards_unmap, 1);
    /* Address space: reservations past 2^64 and a non-power-of-two
     * alignment are refused. */
    uint64_t big = 0;
    CHECK_STATUS(ops->va_reserve(dev, 1ull << 63, 0, &big), TP_OK);
    CHECK_STATUS(ops->va_reserve(dev, 1ull << 63, 0, &big), TP_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(ops->va_reserve(dev, 4 * TEST_MiB, 3 * TEST_MiB, &big), TP_ERR_INVALID_ARGUMENT);
    CHECK_OK(ops->va_release(dev, va, 4 * TEST_MiB));
    CHECK_OK(tp_device_close(dev));

    /* Graph executable cost: node_count x graph_node_bytes saturates. */
    dev = open_sim("sim:1GiB,graph_node_bytes=16000000TiB", &log);
    tp_sim_graph_desc many = {.node_count = 1u << 20, .topology_id = 2, .duration_ns = 1};
    CHECK_OK(tp_sim_graph_create(dev, &many, &g));
    CHECK_STATUS(dev->ops->graph_instantiate(dev, g, &x, &bytes), TP_ERR_OUT_OF_MEMORY);
    CHECK_OK(tp_sim_graph_destroy(dev, g));
    CHECK_OK(tp_sim_get_counters(dev, &c));
    CHECK_EQ_U64(c.graph_exec_bytes, 0);
    CHECK_OK(tp_device_close(dev));

    /* A device larger than its malloc address space: allocations run out
     * of addresses (OUT_OF_MEMORY) before any sum wraps or two overlap. */
    dev = open_sim("sim:16000000TiB,novmm", &log);
    uint64_t a = 0, b = 0;
    CHECK_STATUS(dev->ops->mem_alloc(dev, 1ull << 59, &a), TP_OK);
    CHECK_STATUS(dev->ops->mem_alloc(dev, 1ull << 63, &b), TP_ERR_OUT_OF_MEMORY);
    CHECK_STATUS(dev->ops->mem_alloc(dev, UINT64_MAX - (1ull << 59), &b), TP_ERR_OUT_OF_MEMORY);
    CHECK_OK(dev->ops->mem_free(dev, a, 1ull << 59));
    CHECK_OK(tp_device_close(dev));
}

static const test_case tests[] = {
    TEST_CASE(test_default_spec_is_16gib_with_vmm),
    TEST_CASE(test_spec_options_set_capacity_vmm_and_granularity),
    TEST_CASE(test_spec_capacity_may_be_fractional),
    TEST_CASE(test_bad_specs_are_refused_and_explained),
    TEST_CASE(test_granularity_is_a_power_of_two_from_4kib_to_1gib),
    TEST_CASE(test_status_and_log_level_names),
    TEST_CASE(test_parse_bytes),
    TEST_CASE(test_vmm_memory_map_unmap_and_plain_allocations),
    TEST_CASE(test_vmm_chunks_unmap_only_whole),
    TEST_CASE(test_novmm_refuses_reservations_and_allocates_without_host_memory),
    TEST_CASE(test_clock_events_hazards),
    TEST_CASE(test_transitive_order),
    TEST_CASE(test_synchronize_waits_for_waited_events),
    TEST_CASE(test_faults),
    TEST_CASE(test_occupy_and_graphs),
    TEST_CASE(test_arithmetic_refuses_instead_of_wrapping),
    TEST_CASE(test_sim_calls_tell_bad_arguments_from_other_backends),
    TEST_CASE(test_streams_run_out_busy_and_slots_are_reused),
};

int main(int argc, char **argv) { return TEST_MAIN("test_sim_device", tests, argc, argv); }
