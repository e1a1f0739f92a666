/* SPDX-License-Identifier: MIT */
/*
 * common.c -- status names, host-memory helpers, logging and byte-count
 * parsing/formatting shared by every component.
 *
 * Host memory goes through the caller's tp_host_allocator (libc when none is
 * given); nothing here keeps global state.
 */
#include "internal.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const status_names[] = {
#define TP_STATUS_NAME_(name, description) #name,
    TP_STATUS_LIST(TP_STATUS_NAME_)
#undef TP_STATUS_NAME_
};

static const char *const status_descriptions[] = {
#define TP_STATUS_DESCRIPTION_(name, description) description,
    TP_STATUS_LIST(TP_STATUS_DESCRIPTION_)
#undef TP_STATUS_DESCRIPTION_
};

const char *tp_status_name(tp_status status) {
    if ((unsigned)status >= (unsigned)TP_STATUS_COUNT_) return "TP_UNKNOWN_STATUS";
    return status_names[status];
}

const char *tp_status_describe(tp_status status) {
    if ((unsigned)status >= (unsigned)TP_STATUS_COUNT_) return "unknown status";
    return status_descriptions[status];
}

const char *tp_log_level_name(tp_log_level level) {
    switch (level) {
    case TP_LOG_DEBUG: return "debug";
    case TP_LOG_INFO: return "info";
    case TP_LOG_WARN: return "warn";
    case TP_LOG_ERROR: return "error";
    }
    return "unknown";
}

/* ---------------------------------------------------------------- version */

#define TPI_STRINGIFY_(x) #x
#define TPI_STRINGIFY(x) TPI_STRINGIFY_(x)

uint32_t tp_version(void) {
    return (uint32_t)TP_VERSION_MAJOR * 10000u + (uint32_t)TP_VERSION_MINOR * 100u + (uint32_t)TP_VERSION_PATCH;
}

const char *tp_version_string(void) {
    return TPI_STRINGIFY(TP_VERSION_MAJOR) "." TPI_STRINGIFY(TP_VERSION_MINOR) "." TPI_STRINGIFY(TP_VERSION_PATCH);
}

/* ------------------------------------------------------------ host memory */

static void *libc_alloc(void *user, size_t bytes) {
    (void)user;
    return malloc(bytes);
}
static void *libc_realloc(void *user, void *ptr, size_t old_bytes, size_t new_bytes) {
    (void)user;
    (void)old_bytes;
    return realloc(ptr, new_bytes);
}
static void libc_free(void *user, void *ptr, size_t bytes) {
    (void)user;
    (void)bytes;
    free(ptr);
}

void tpi_host_init(tpi_host *host, const tp_host_allocator *user_allocator) {
    if (user_allocator && user_allocator->alloc && user_allocator->realloc && user_allocator->free) {
        host->allocator = *user_allocator;
    } else {
        host->allocator.alloc = libc_alloc;
        host->allocator.realloc = libc_realloc;
        host->allocator.free = libc_free;
        host->allocator.user = NULL;
    }
}

void *tpi_host_alloc(const tpi_host *host, size_t bytes) {
    return host->allocator.alloc(host->allocator.user, bytes ? bytes : 1);
}

void *tpi_host_calloc(const tpi_host *host, size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) return NULL;
    /* libc's calloc hands out large zeroed blocks lazily (untouched pages
     * cost nothing), which the VMM pool's per-page table relies on. */
    if (host->allocator.alloc == libc_alloc) return calloc(count ? count : 1, size ? size : 1);
    size_t bytes = count * size;
    void *p = tpi_host_alloc(host, bytes);
    if (p && bytes) memset(p, 0, bytes);
    return p;
}

void *tpi_host_realloc(const tpi_host *host, void *ptr, size_t old_bytes, size_t new_bytes) {
    if (!ptr) return tpi_host_alloc(host, new_bytes);
    return host->allocator.realloc(host->allocator.user, ptr, old_bytes, new_bytes ? new_bytes : 1);
}

void tpi_host_free(const tpi_host *host, void *ptr, size_t bytes) {
    if (ptr) host->allocator.free(host->allocator.user, ptr, bytes);
}

bool tpi_host_grow(const tpi_host *host, void **array, size_t elem, size_t *capacity, size_t need) {
    if (need <= *capacity) return true;
    size_t new_capacity = *capacity ? *capacity : 16;
    while (new_capacity < need) {
        if (new_capacity > SIZE_MAX / 2 / elem) return false;
        new_capacity *= 2;
    }
    void *grown = tpi_host_realloc(host, *array, *capacity * elem, new_capacity * elem);
    if (!grown) return false;
    *array = grown;
    *capacity = new_capacity;
    return true;
}

/* ---------------------------------------------------------------- logging */

void tpi_logf(const tpi_logger *logger, tp_log_level level, const char *fmt, ...) {
    if (!logger || !logger->fn || level < logger->min_level) return;
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    logger->fn(logger->user, level, message);
}

/* ------------------------------------------------------------ byte counts */

const char *tp_format_bytes(uint64_t bytes, char *buf, size_t capacity) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double value = (double)bytes;
    int unit = 0;
    while (value >= 1024.0 && unit < 5) {
        value /= 1024.0;
        unit++;
    }
    if (unit == 0)
        snprintf(buf, capacity, "%llu B", (unsigned long long)bytes);
    else
        snprintf(buf, capacity, "%.2f %s", value, units[unit]);
    return buf;
}

bool tp_parse_bytes(const char *text, uint64_t *out_bytes) {
    if (!text || !*text) return false;
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (!isdigit((unsigned char)*p) && *p != '.') return false;
    char *end = NULL;
    double value = strtod(p, &end);
    if (end == p || value < 0) return false;
    while (isspace((unsigned char)*end)) end++;
    char unit[8] = {0};
    size_t n = 0;
    while (*end && !isspace((unsigned char)*end) && n < sizeof unit - 1) unit[n++] = (char)toupper((unsigned char)*end++);
    while (isspace((unsigned char)*end)) end++;
    if (*end) return false;
    double multiplier;
    if (n == 0 || strcmp(unit, "B") == 0) multiplier = 1;
    else if (!strcmp(unit, "K") || !strcmp(unit, "KIB")) multiplier = 1024.0;
    else if (!strcmp(unit, "M") || !strcmp(unit, "MIB")) multiplier = 1024.0 * 1024;
    else if (!strcmp(unit, "G") || !strcmp(unit, "GIB")) multiplier = 1024.0 * 1024 * 1024;
    else if (!strcmp(unit, "T") || !strcmp(unit, "TIB")) multiplier = 1024.0 * 1024 * 1024 * 1024;
    else if (!strcmp(unit, "KB")) multiplier = 1e3;
    else if (!strcmp(unit, "MB")) multiplier = 1e6;
    else if (!strcmp(unit, "GB")) multiplier = 1e9;
    else if (!strcmp(unit, "TB")) multiplier = 1e12;
    else return false;
    double bytes = value * multiplier;
    if (bytes >= 18446744073709551615.0) return false;
    *out_bytes = (uint64_t)(bytes + 0.5);
    return true;
}
