/* SPDX-License-Identifier: MIT */
/*
 * device.c -- opening devices from spec strings and the public stream/event
 * calls, which dispatch to the backend's table of operations.
 *
 * Spec grammar: BACKEND[:ARG][,OPTION]... where BACKEND is "sim" (ARG: a
 * capacity such as 6GiB) or "cuda" (ARG: the ordinal). Unknown options are
 * an error, never silently ignored.
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static tp_status parse_option(tpi_device_options *options, const char *option, const tpi_logger *logger) {
    const char *eq = strchr(option, '=');
    size_t key_len = eq ? (size_t)(eq - option) : strlen(option);
    const char *value = eq ? eq + 1 : NULL;
#define KEY_IS(k) (key_len == strlen(k) && strncmp(option, k, key_len) == 0)
    if (KEY_IS("novmm") && !value) {
        options->novmm = true;
    } else if (KEY_IS("nocheck") && !value) {
        options->nocheck = true;
    } else if (KEY_IS("adjacent") && !value) {
        options->adjacent = true;
    } else if (KEY_IS("graphpool") && !value) {
        options->graphpool = true;
    } else if (KEY_IS("gran") && value) {
        /* A page table of 2.4 G entries for gran=1 helps no one: a power of
         * two from 4 KiB (the smallest page anywhere) to 1 GiB. */
        uint64_t gran = 0;
        if (!tp_parse_bytes(value, &gran) || !tpi_is_pow2(gran) || gran < 4 * TPI_KiB || gran > TPI_GiB) {
            tpi_logf(logger, TP_LOG_ERROR,
                    "device spec: bad option '%s' (gran=SIZE: a power of two from 4KiB to 1GiB)", option);
            return TP_ERR_BAD_SPEC;
        }
        options->granularity_bytes = gran;
    } else if (KEY_IS("graph_node_bytes") && value) {
        if (!tp_parse_bytes(value, &options->graph_node_bytes)) goto bad;
    } else if (KEY_IS("graph_exec_bytes") && value) {
        if (!tp_parse_bytes(value, &options->graph_exec_bytes)) goto bad;
    } else if (KEY_IS("seed") && value) {
        char *end;
        options->seed = strtoull(value, &end, 10);
        if (*end || end == value) goto bad;
    } else {
        goto bad;
    }
#undef KEY_IS
    return TP_OK;
bad:
    tpi_logf(logger, TP_LOG_ERROR, "device spec: bad option '%s' (known: novmm, nocheck, graphpool, adjacent, gran=SIZE, "
            "graph_node_bytes=SIZE, graph_exec_bytes=SIZE, seed=N)", option);
    return TP_ERR_BAD_SPEC;
}

tp_status tp_device_open(const char *spec, const tp_device_config *config, tp_device **out_device) {
    if (!out_device) return TP_ERR_INVALID_ARGUMENT;
    *out_device = NULL;
    if (!spec) spec = "sim";
    tp_device_config defaults = {0};
    if (!config) config = &defaults;
    tpi_logger logger = {config->log, config->log_user, config->log_level};

    char buf[256];
    if (strlen(spec) >= sizeof buf) {
        tpi_logf(&logger, TP_LOG_ERROR, "device spec too long");
        return TP_ERR_BAD_SPEC;
    }
    strcpy(buf, spec);

    tpi_device_options options = {0};
    char *save = NULL;
    char *head = strtok_r(buf, ",", &save);
    if (!head) {
        tpi_logf(&logger, TP_LOG_ERROR, "empty device spec (try \"sim\", \"sim:6GiB,novmm\" or \"cuda:0\")");
        return TP_ERR_BAD_SPEC;
    }
    char *colon = strchr(head, ':');
    char *arg = NULL;
    if (colon) {
        *colon = '\0';
        arg = colon + 1;
    }
    bool is_sim = strcmp(head, "sim") == 0;
    bool is_cuda = strcmp(head, "cuda") == 0;
    if (!is_sim && !is_cuda) {
        tpi_logf(&logger, TP_LOG_ERROR, "device spec '%s': unknown backend '%s' (use sim or cuda)", spec, head);
        return TP_ERR_BAD_SPEC;
    }
    if (arg) {
        if (is_sim) {
            if (!tp_parse_bytes(arg, &options.capacity_bytes) || options.capacity_bytes == 0) {
                tpi_logf(&logger, TP_LOG_ERROR, "device spec '%s': bad capacity '%s'", spec, arg);
                return TP_ERR_BAD_SPEC;
            }
        } else {
            char *end;
            long ordinal = strtol(arg, &end, 10);
            if (*end || end == arg || ordinal < 0 || ordinal > 1024) {
                tpi_logf(&logger, TP_LOG_ERROR, "device spec '%s': bad device ordinal '%s'", spec, arg);
                return TP_ERR_BAD_SPEC;
            }
            options.ordinal = (int)ordinal;
        }
    }
    for (char *opt = strtok_r(NULL, ",", &save); opt; opt = strtok_r(NULL, ",", &save)) {
        tp_status st = parse_option(&options, opt, &logger);
        if (st != TP_OK) return st;
    }

    tpi_host host;
    tpi_host_init(&host, &config->host);
    tp_device *device = tpi_host_calloc(&host, 1, sizeof *device);
    if (!device) return TP_ERR_HOST_OUT_OF_MEMORY;
    device->host = host;
    device->logger = logger;
    atomic_init(&device->users, 0);
    tp_status st = is_sim ? tpi_sim_device_create(device, &options) : tpi_cuda_device_create(device, &options);
    if (st != TP_OK) {
        tpi_host_free(&host, device, sizeof *device);
        return st;
    }
    *out_device = device;
    return TP_OK;
}

tp_status tp_device_close(tp_device *device) {
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    int users = atomic_load(&device->users);
    if (users != 0) {
        tpi_logf(&device->logger, TP_LOG_ERROR, "tp_device_close: %d pools or caches still open", users);
        return TP_ERR_BUSY;
    }
    device->ops->close(device);
    tpi_host host = device->host;
    tpi_host_free(&host, device, sizeof *device);
    return TP_OK;
}

tp_status tp_device_get_info(const tp_device *device, tp_device_info *out_info) {
    if (!device || !out_info) return TP_ERR_INVALID_ARGUMENT;
    *out_info = device->info;
    return TP_OK;
}

tp_status tp_device_mem_info(tp_device *device, uint64_t *out_free_bytes, uint64_t *out_total_bytes) {
    if (!device || !out_free_bytes || !out_total_bytes) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->mem_info(device, out_free_bytes, out_total_bytes);
}

tp_status tp_device_synchronize(tp_device *device) {
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->device_synchronize(device);
}

tp_status tp_stream_create(tp_device *device, tp_stream *out_stream) {
    if (!device || !out_stream) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->stream_create(device, out_stream);
}

tp_status tp_stream_destroy(tp_device *device, tp_stream stream) {
    if (!device || stream == TP_STREAM_DEFAULT) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->stream_destroy(device, stream);
}

tp_status tp_stream_synchronize(tp_device *device, tp_stream stream) {
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->stream_synchronize(device, stream);
}

tp_status tp_stream_wait_event(tp_device *device, tp_stream stream, tp_event event) {
    if (!device || !event) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->stream_wait_event(device, stream, event);
}

tp_status tp_event_create(tp_device *device, tp_event *out_event) {
    if (!device || !out_event) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->event_create(device, out_event);
}

tp_status tp_event_destroy(tp_device *device, tp_event event) {
    if (!device || !event) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->event_destroy(device, event);
}

tp_status tp_event_record(tp_device *device, tp_event event, tp_stream stream) {
    if (!device || !event) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->event_record(device, event, stream);
}

tp_status tp_event_query(tp_device *device, tp_event event) {
    if (!device || !event) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->event_query(device, event);
}

tp_status tp_event_synchronize(tp_device *device, tp_event event) {
    if (!device || !event) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->event_synchronize(device, event);
}

/* ---------------------------------------------------- raw device memory */

tp_status tp_device_mem_alloc(tp_device *device, uint64_t bytes, uint64_t *out_address) {
    if (!device || !out_address || bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->mem_alloc(device, bytes, out_address);
}

tp_status tp_device_mem_free(tp_device *device, uint64_t address, uint64_t bytes) {
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    return device->ops->mem_free(device, address, bytes);
}

tp_status tp_device_va_reserve(tp_device *device, uint64_t bytes, uint64_t alignment, uint64_t *out_va) {
    if (!device || !out_va || bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    if (!device->info.vmm_enabled) return TP_ERR_UNSUPPORTED;
    return device->ops->va_reserve(device, bytes, alignment, out_va);
}

tp_status tp_device_va_release(tp_device *device, uint64_t va, uint64_t bytes) {
    if (!device) return TP_ERR_INVALID_ARGUMENT;
    if (!device->info.vmm_enabled) return TP_ERR_UNSUPPORTED;
    return device->ops->va_release(device, va, bytes);
}

tp_status tp_device_map(tp_device *device, uint64_t va, uint64_t bytes) {
    if (!device || bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    if (!device->info.vmm_enabled) return TP_ERR_UNSUPPORTED;
    return device->ops->map(device, va, bytes, 0);
}

tp_status tp_device_unmap(tp_device *device, uint64_t va, uint64_t bytes) {
    if (!device || bytes == 0) return TP_ERR_INVALID_ARGUMENT;
    if (!device->info.vmm_enabled) return TP_ERR_UNSUPPORTED;
    return device->ops->unmap(device, va, bytes);
}
