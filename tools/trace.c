/* SPDX-License-Identifier: MIT */
/*
 * trace.c -- the trace reader and writer (formats in trace.h).
 *
 * Lines are read with gzgets (zlib reads gzip and plain files alike) into a
 * fixed buffer; a line longer than the buffer is an error, never silently
 * split. Fields are parsed strictly: anything but the expected digits (or
 * the RMM time syntax) is reported with its file and line. Blank lines and
 * a trailing CR are accepted, as is a last line without a newline.
 *
 * Damaged gzip input is an error, never a shorter trace: zlib's gzgets
 * returns what it could inflate and keeps the reason in gzerror (a stream
 * cut short is Z_BUF_ERROR, "unexpected end of file"; bad deflate data or a
 * wrong CRC/length trailer is Z_DATA_ERROR), so the reader asks gzerror at
 * the end of the data (gzgets NULL) and for a line without its newline (the
 * last bytes before a cut), and reports the file and the line reached.
 */
#include "trace.h"

#include "pickle.h"

#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#define LINE_CAPACITY 1024

struct trace_reader {
    gzFile gz;            /* file source, or NULL */
    const char *data;     /* memory source */
    size_t length, offset;
    char name[200];
    trace_format format;
    unsigned long long line;
    bool have_origin;
    uint64_t origin_ns; /* time of the first event */
    char damage[512];   /* LINE_DAMAGED: "FILE:LINE: what" */
    unsigned pt_device; /* PyTorch snapshot: which device's trace */
    uint64_t file_bytes; /* the file's size as stored (0: not known) */
    trace_event *pk_events; /* PyTorch snapshot: every event, converted at open */
    size_t pk_count, pk_next;
    char buf[LINE_CAPACITY];
};

static const char TIDEPOOL_HEADER[] = "time_us,action,addr,size,stream";
static const char RMM_HEADER[] = "Thread,Time,Action,Pointer,Size,Stream";

typedef enum line_status {
    LINE_OK = 0,
    LINE_BAD,      /* too long for the buffer, or holds a NUL byte (not text) */
    LINE_DAMAGED,  /* the gzip data is truncated or corrupt, or reading failed: r->damage says how */
} line_status;

/* Fills r->damage with why zlib stopped, if it stopped on an error (the
 * line number is the line being read when the data ran out). */
static bool gz_damaged(trace_reader *r, unsigned long long line) {
    char where[230];
    if (line) snprintf(where, sizeof where, "%s:%llu", r->name, line);
    else snprintf(where, sizeof where, "%s", r->name); /* a pickle: read whole, no lines */
    int code = Z_OK;
    const char *msg = gzerror(r->gz, &code);
    if (code == Z_OK || code == Z_STREAM_END) return false;
    /* zlib's message starts with the path it was opened with: drop it */
    size_t name_len = strlen(r->name);
    if (msg && !strncmp(msg, r->name, name_len) && !strncmp(msg + name_len, ": ", 2)) msg += name_len + 2;
    if (code == Z_BUF_ERROR)
        snprintf(r->damage, sizeof r->damage, "%s: truncated gzip file: the compressed data stops before its end (zlib: %s)",
                 where, msg && *msg ? msg : "unexpected end of file");
    else if (code == Z_DATA_ERROR)
        snprintf(r->damage, sizeof r->damage, "%s: corrupt gzip data (zlib: %s)", where,
                 msg && *msg ? msg : "bad deflate data");
    else if (code == Z_ERRNO)
        snprintf(r->damage, sizeof r->damage, "%s: read error: %s", where, strerror(errno));
    else
        snprintf(r->damage, sizeof r->damage, "%s: zlib error %d (%s)", where, code, msg && *msg ? msg : "unknown");
    return true;
}

/* Next line without its terminator; NULL at the end, or on LINE_DAMAGED. */
static char *next_line(trace_reader *r, line_status *status) {
    *status = LINE_OK;
    size_t n = 0;
    if (r->gz) {
        if (!gzgets(r->gz, r->buf, sizeof r->buf)) {
            if (gz_damaged(r, r->line + 1)) *status = LINE_DAMAGED;
            return NULL;
        }
        r->line++;
        n = strlen(r->buf);
        /* A line without its newline is the last of the data: if zlib
         * stopped on an error, the line is cut (or garbage), not the end. */
        if ((n == 0 || r->buf[n - 1] != '\n') && gz_damaged(r, r->line)) {
            *status = LINE_DAMAGED;
            return NULL;
        }
        /* gzgets stops at a newline, a full buffer or the end of the file;
         * anything else means strlen stopped at a NUL inside the line. */
        if ((n == 0 || r->buf[n - 1] != '\n') && !gzeof(r->gz)) {
            *status = LINE_BAD;
            return r->buf;
        }
    } else {
        if (r->offset >= r->length) return NULL;
        r->line++;
        const char *start = r->data + r->offset;
        const char *nl = memchr(start, '\n', r->length - r->offset);
        size_t len = nl ? (size_t)(nl - start) + 1 : r->length - r->offset;
        r->offset += len;
        if (len >= sizeof r->buf) {
            *status = LINE_BAD;
            return r->buf;
        }
        memcpy(r->buf, start, len);
        r->buf[len] = '\0';
        n = len;
        if (memchr(r->buf, '\0', n)) { /* an embedded NUL: not text */
            *status = LINE_BAD;
            return r->buf;
        }
    }
    while (n && (r->buf[n - 1] == '\n' || r->buf[n - 1] == '\r')) r->buf[--n] = '\0';
    return r->buf;
}

static bool open_pickle(trace_reader *r, char *err, size_t cap);

static trace_reader *open_common(trace_reader *r, char *err, size_t cap) {
    /* A pickle starts with PROTO (0x80), which no text header does. */
    bool pickle = false;
    if (r->gz) {
        int first = gzgetc(r->gz);
        if (first >= 0) {
            pickle = first == 0x80;
            if (gzungetc(first, r->gz) < 0) {
                snprintf(err, cap, "%s: read error", r->name);
                goto fail;
            }
        }
    } else {
        pickle = r->length && (unsigned char)r->data[0] == 0x80;
    }
    if (pickle) {
        if (!open_pickle(r, err, cap)) goto fail;
        r->format = TRACE_FORMAT_PYTORCH_PICKLE;
        return r;
    }
    line_status status;
    char *header = next_line(r, &status);
    if (status == LINE_DAMAGED) {
        snprintf(err, cap, "%s", r->damage);
        goto fail;
    }
    if (!header) {
        snprintf(err, cap, "%s: empty file (expected a header line '%s' or '%s')", r->name, TIDEPOOL_HEADER, RMM_HEADER);
        goto fail;
    }
    if (status == LINE_BAD) {
        snprintf(err, cap, "%s:1: header line too long or not text", r->name);
        goto fail;
    }
    /* Tolerate a UTF-8 byte-order mark and surrounding blanks. */
    if ((unsigned char)header[0] == 0xEF && (unsigned char)header[1] == 0xBB && (unsigned char)header[2] == 0xBF) header += 3;
    while (*header == ' ') header++;
    if (strcmp(header, TIDEPOOL_HEADER) == 0) {
        r->format = TRACE_FORMAT_TIDEPOOL;
    } else if (strcmp(header, RMM_HEADER) == 0) {
        r->format = TRACE_FORMAT_RMM;
    } else {
        snprintf(err, cap, "%s:1: unknown header '%.80s' (expected '%s' or '%s')", r->name, header, TIDEPOOL_HEADER,
                 RMM_HEADER);
        goto fail;
    }
    return r;
fail:
    trace_close(r);
    return NULL;
}

trace_reader *trace_open(const char *path, char *err, size_t cap) { return trace_open_with(path, NULL, err, cap); }

trace_reader *trace_open_memory(const char *data, size_t length, char *err, size_t cap) {
    return trace_open_memory_with(data, length, NULL, err, cap);
}

trace_reader *trace_open_with(const char *path, const trace_open_options *options, char *err, size_t cap) {
    trace_reader *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    snprintf(r->name, sizeof r->name, "%s", path);
    if (options) r->pt_device = options->pt_device;
    r->gz = gzopen(path, "rb");
    if (!r->gz) {
        snprintf(err, cap, "%s: cannot open: %s", path, strerror(errno ? errno : ENOENT));
        free(r);
        return NULL;
    }
    gzbuffer(r->gz, 1 << 17);
    struct stat st;
    if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) r->file_bytes = (uint64_t)st.st_size;
    return open_common(r, err, cap);
}

trace_reader *trace_open_memory_with(const char *data, size_t length, const trace_open_options *options, char *err,
                                     size_t cap) {
    trace_reader *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    snprintf(r->name, sizeof r->name, "<memory>");
    if (options) r->pt_device = options->pt_device;
    r->data = data;
    r->length = length;
    return open_common(r, err, cap);
}

void trace_close(trace_reader *r) {
    if (!r) return;
    if (r->gz) gzclose(r->gz);
    free(r->pk_events);
    free(r);
}

trace_format trace_get_format(const trace_reader *r) { return r->format; }

void trace_position(const trace_reader *r, uint64_t *bytes_read, uint64_t *bytes_total, uint64_t *events_total) {
    *events_total = r->format == TRACE_FORMAT_PYTORCH_PICKLE ? r->pk_count : 0;
    if (r->format == TRACE_FORMAT_PYTORCH_PICKLE) { /* read whole at open */
        *bytes_read = *bytes_total = r->gz ? r->file_bytes : r->length;
        return;
    }
    if (r->gz) {
        long offset = (long)gzoffset(r->gz);
        *bytes_read = offset > 0 ? (uint64_t)offset : 0;
        *bytes_total = r->file_bytes;
    } else {
        *bytes_read = r->offset;
        *bytes_total = r->length;
    }
}

/* Splits line at commas into exactly n fields; more or fewer is an error. */
static bool split_fields(char *line, char **fields, int n) {
    int count = 0;
    char *p = line;
    for (;;) {
        fields[count++] = p;
        char *comma = strchr(p, ',');
        if (!comma) break;
        if (count == n) return false; /* a field too many */
        *comma = '\0';
        p = comma + 1;
    }
    return count == n;
}

static bool parse_u64(const char *s, uint64_t *out) {
    if (!*s) return false;
    uint64_t v = 0;
    for (; *s; s++) {
        if (!isdigit((unsigned char)*s)) return false;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

/* Decimal, or hexadecimal with 0x. */
static bool parse_pointer(const char *s, uint64_t *out) {
    if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
        s += 2;
        if (!*s) return false;
        uint64_t v = 0;
        for (; *s; s++) {
            int d;
            if (*s >= '0' && *s <= '9') d = *s - '0';
            else if (*s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
            else if (*s >= 'A' && *s <= 'F') d = *s - 'A' + 10;
            else return false;
            if (v >> 60) return false;
            v = (v << 4) | (uint64_t)d;
        }
        *out = v;
        return true;
    }
    return parse_u64(s, out);
}

/* RMM time: fractional seconds ("1634567890.123456") or "HH:MM:SS.ffffff". */
static bool parse_rmm_time(const char *s, uint64_t *out_ns) {
    uint64_t whole = 0, frac_ns = 0;
    const char *dot = strchr(s, '.');
    char head[40];
    size_t head_len = dot ? (size_t)(dot - s) : strlen(s);
    if (head_len == 0 || head_len >= sizeof head) return false;
    memcpy(head, s, head_len);
    head[head_len] = '\0';
    if (strchr(head, ':')) {
        unsigned h, m, sec;
        char tail;
        if (sscanf(head, "%u:%u:%u%c", &h, &m, &sec, &tail) != 3 || m > 59 || sec > 60) return false;
        for (const char *c = head; *c; c++)
            if (!isdigit((unsigned char)*c) && *c != ':') return false;
        whole = (uint64_t)h * 3600 + m * 60 + sec;
    } else if (!parse_u64(head, &whole)) {
        return false;
    }
    if (dot) {
        const char *f = dot + 1;
        int digits = 0;
        if (!*f) return false;
        for (; *f; f++, digits++) {
            if (!isdigit((unsigned char)*f)) return false;
            if (digits < 9) frac_ns = frac_ns * 10 + (uint64_t)(*f - '0');
        }
        for (; digits < 9; digits++) frac_ns *= 10;
    }
    if (whole > UINT64_MAX / 1000000000ull - 1) return false;
    *out_ns = whole * 1000000000ull + frac_ns;
    return true;
}

static uint32_t fold_stream(uint64_t v) { return (uint32_t)(v ^ (v >> 32)); }

#define BAD(...)                                                              \
    do {                                                                      \
        int at_ = snprintf(err, cap, "%s:%llu: ", r->name, r->line);          \
        if (at_ > 0 && (size_t)at_ < cap) snprintf(err + at_, cap - (size_t)at_, __VA_ARGS__); \
        return -1;                                                            \
    } while (0)

long trace_read(trace_reader *r, trace_event *events, size_t capacity, char *err, size_t cap) {
    if (r->format == TRACE_FORMAT_PYTORCH_PICKLE) {
        size_t n = r->pk_count - r->pk_next < capacity ? r->pk_count - r->pk_next : capacity;
        if (n) memcpy(events, r->pk_events + r->pk_next, n * sizeof *events);
        r->pk_next += n;
        (void)err, (void)cap;
        return (long)n;
    }
    size_t n = 0;
    while (n < capacity) {
        line_status status;
        char *line = next_line(r, &status);
        if (status == LINE_DAMAGED) {
            snprintf(err, cap, "%s", r->damage);
            return -1;
        }
        if (!line) break;
        if (status == LINE_BAD) BAD("line too long or not text");
        if (!*line) continue;
        char *f[6];
        trace_event *e = &events[n];
        uint64_t t_ns;
        if (r->format == TRACE_FORMAT_TIDEPOOL) {
            if (!split_fields(line, f, 5)) BAD("expected 5 comma-separated fields (time_us,action,addr,size,stream)");
            uint64_t t_us, stream;
            if (!parse_u64(f[0], &t_us) || t_us > UINT64_MAX / 1000) BAD("bad time_us '%.40s'", f[0]);
            t_ns = t_us * 1000;
            if (strcmp(f[1], "alloc") == 0) e->action = TRACE_ALLOC;
            else if (strcmp(f[1], "free") == 0) e->action = TRACE_FREE;
            else BAD("bad action '%.40s' (expected alloc or free)", f[1]);
            if (!parse_pointer(f[2], &e->address)) BAD("bad addr '%.40s'", f[2]);
            if (!parse_u64(f[3], &e->bytes)) BAD("bad size '%.40s'", f[3]);
            if (!parse_u64(f[4], &stream)) BAD("bad stream '%.40s'", f[4]);
            e->stream = fold_stream(stream);
        } else {
            if (!split_fields(line, f, 6)) BAD("expected 6 comma-separated fields (Thread,Time,Action,Pointer,Size,Stream)");
            uint64_t thread, stream;
            if (!parse_pointer(f[0], &thread)) BAD("bad Thread '%.40s'", f[0]);
            if (!parse_rmm_time(f[1], &t_ns)) BAD("bad Time '%.40s'", f[1]);
            if (strcmp(f[2], "allocate") == 0) e->action = TRACE_ALLOC;
            else if (strcmp(f[2], "free") == 0 || strcmp(f[2], "deallocate") == 0) e->action = TRACE_FREE;
            else if (strcmp(f[2], "allocate failure") == 0 || strcmp(f[2], "allocate_failure") == 0)
                e->action = TRACE_ALLOC_FAILURE;
            else BAD("bad Action '%.40s' (expected allocate, free or allocate failure)", f[2]);
            if (!parse_pointer(f[3], &e->address)) BAD("bad Pointer '%.40s'", f[3]);
            if (!parse_u64(f[4], &e->bytes)) BAD("bad Size '%.40s'", f[4]);
            if (!parse_pointer(f[5], &stream)) BAD("bad Stream '%.40s'", f[5]);
            e->stream = fold_stream(stream);
        }
        if (!r->have_origin) {
            r->have_origin = true;
            r->origin_ns = t_ns;
        }
        /* Times that run backwards are clamped: the replay's clock only moves on. */
        e->time_ns = t_ns >= r->origin_ns ? t_ns - r->origin_ns : 0;
        n++;
    }
    return (long)n;
}

/* ------------------------------------------------ PyTorch memory snapshots */

/* The whole (decompressed) file into memory; NULL with err filled. */
static unsigned char *slurp(trace_reader *r, size_t *out_length, char *err, size_t cap) {
    if (!r->gz) {
        unsigned char *copy = malloc(r->length ? r->length : 1);
        if (!copy) snprintf(err, cap, "%s: out of memory", r->name);
        else memcpy(copy, r->data, r->length);
        *out_length = r->length;
        return copy;
    }
    size_t length = 0, capacity = 1 << 20;
    unsigned char *buf = malloc(capacity);
    for (;;) {
        if (!buf) {
            snprintf(err, cap, "%s: out of memory reading the snapshot", r->name);
            return NULL;
        }
        if (length == capacity) {
            unsigned char *grown = capacity <= SIZE_MAX / 2 ? realloc(buf, capacity * 2) : NULL;
            if (!grown) free(buf);
            buf = grown;
            capacity *= 2;
            continue;
        }
        size_t want = capacity - length < (1u << 30) ? capacity - length : (1u << 30);
        int n = gzread(r->gz, buf + length, (unsigned)want);
        if (n > 0) {
            length += (size_t)n;
            continue;
        }
        if (gz_damaged(r, 0)) {
            snprintf(err, cap, "%s", r->damage);
            free(buf);
            return NULL;
        }
        break;
    }
    *out_length = length;
    return buf;
}

/* Fills r->pk_events from device_traces[r->pt_device], as the recorder of
 * the shared traces did: alloc -> alloc, free_requested -> free, the rest
 * (free_completed, segment_*, snapshot, oom, ...) left out; time_us and
 * stream default to 0. */
static bool open_pickle(trace_reader *r, char *err, size_t cap) {
    size_t length = 0;
    unsigned char *data = slurp(r, &length, err, cap);
    if (!data) return false;
    char why[256];
    pk_doc *doc = pk_parse(data, length, why, sizeof why);
    if (!doc) {
        snprintf(err, cap, "%s: not a readable pickle: %s", r->name, why);
        free(data);
        return false;
    }
    bool ok = false;
    const pk_value *root = pk_root(doc);
    const pk_value *traces = pk_dict_get(root, "device_traces");
    if (!traces) {
        snprintf(err, cap, "%s: a pickle without 'device_traces' (expected what torch.cuda.memory._snapshot() returns, "
                 "recorded after torch.cuda.memory._record_memory_history())", r->name);
        goto done;
    }
    if (traces->type != PK_LIST) {
        snprintf(err, cap, "%s: 'device_traces' is a %s, not a list", r->name, pk_type_name(traces));
        goto done;
    }
    size_t devices = pk_list_count(traces);
    if (r->pt_device >= devices) {
        snprintf(err, cap, "%s: device %u has no trace: the snapshot holds %zu device%s (0 to %zu)", r->name,
                 r->pt_device, devices, devices == 1 ? "" : "s", devices ? devices - 1 : 0);
        if (!devices) snprintf(err, cap, "%s: the snapshot holds no device trace ('device_traces' is empty)", r->name);
        goto done;
    }
    const pk_value *list = pk_list_item(traces, r->pt_device);
    if (list->type != PK_LIST) {
        snprintf(err, cap, "%s: device_traces[%u] is a %s, not a list", r->name, r->pt_device, pk_type_name(list));
        goto done;
    }
    size_t count = pk_list_count(list), kept = 0;
    r->pk_events = malloc((count ? count : 1) * sizeof *r->pk_events);
    if (!r->pk_events) {
        snprintf(err, cap, "%s: out of memory", r->name);
        goto done;
    }
    for (size_t i = 0; i < count; i++) {
        const pk_value *entry = pk_list_item(list, i);
        const pk_value *action = pk_dict_get(entry, "action");
#define ENTRY_BAD(...)                                                                               \
    do {                                                                                             \
        int at_ = snprintf(err, cap, "%s: device_traces[%u][%zu]: ", r->name, r->pt_device, i);      \
        if (at_ > 0 && (size_t)at_ < cap) snprintf(err + at_, cap - (size_t)at_, __VA_ARGS__);       \
        goto done;                                                                                   \
    } while (0)
        if (entry->type != PK_DICT) ENTRY_BAD("a %s, not a dict", pk_type_name(entry));
        if (!action || action->type != PK_STR) ENTRY_BAD("no 'action' string");
        trace_event *e = &r->pk_events[kept];
        if (pk_str_is(action, "alloc")) e->action = TRACE_ALLOC;
        else if (pk_str_is(action, "free_requested")) e->action = TRACE_FREE;
        else continue;
        const pk_value *addr = pk_dict_get(entry, "addr"), *size = pk_dict_get(entry, "size");
        const pk_value *stream = pk_dict_get(entry, "stream"), *time = pk_dict_get(entry, "time_us");
        uint64_t t_us = 0, bits = 0;
        if (!pk_as_bits64(addr, &e->address)) ENTRY_BAD("'addr' is %s, not a 64-bit int", addr ? pk_type_name(addr) : "missing");
        if (!pk_as_bits64(size, &e->bytes) || (size->int_range == PK_INT_I64 && size->u.i < 0))
            ENTRY_BAD("'size' is %s, not a byte count", size ? pk_type_name(size) : "missing");
        if (stream && stream->type != PK_NONE && !pk_as_bits64(stream, &bits))
            ENTRY_BAD("'stream' is a %s, not an int", pk_type_name(stream));
        e->stream = fold_stream(bits);
        if (time && time->type != PK_NONE &&
            (!pk_as_bits64(time, &t_us) || (time->int_range == PK_INT_I64 && time->u.i < 0) || t_us > UINT64_MAX / 1000))
            ENTRY_BAD("'time_us' is not a time in microseconds");
#undef ENTRY_BAD
        uint64_t t_ns = t_us * 1000;
        if (!r->have_origin) {
            r->have_origin = true;
            r->origin_ns = t_ns;
        }
        e->time_ns = t_ns >= r->origin_ns ? t_ns - r->origin_ns : 0;
        kept++;
    }
    r->pk_count = kept;
    ok = true;
done:
    pk_free(doc);
    free(data);
    return ok;
}

/* ---------------------------------------------------------------- writer */

struct trace_writer {
    gzFile gz;
    FILE *plain;
};

trace_writer *trace_writer_open(const char *path, char *err, size_t cap) {
    trace_writer *w = calloc(1, sizeof *w);
    if (!w) {
        snprintf(err, cap, "out of memory");
        return NULL;
    }
    size_t len = strlen(path);
    if (len > 3 && strcmp(path + len - 3, ".gz") == 0)
        w->gz = gzopen(path, "wb6");
    else
        w->plain = strcmp(path, "-") == 0 ? stdout : fopen(path, "w");
    if (!w->gz && !w->plain) {
        snprintf(err, cap, "%s: cannot create: %s", path, strerror(errno));
        free(w);
        return NULL;
    }
    if (w->gz) gzprintf(w->gz, "%s\n", TIDEPOOL_HEADER);
    else fprintf(w->plain, "%s\n", TIDEPOOL_HEADER);
    return w;
}

int trace_write(trace_writer *w, const trace_event *e) {
    const char *action = e->action == TRACE_FREE ? "free" : "alloc";
    unsigned long long t_us = (unsigned long long)(e->time_ns / 1000);
    if (w->gz)
        return gzprintf(w->gz, "%llu,%s,%llu,%llu,%u\n", t_us, action, (unsigned long long)e->address,
                        (unsigned long long)e->bytes, e->stream) > 0 ? 0 : -1;
    return fprintf(w->plain, "%llu,%s,%llu,%llu,%u\n", t_us, action, (unsigned long long)e->address,
                   (unsigned long long)e->bytes, e->stream) > 0 ? 0 : -1;
}

int trace_writer_close(trace_writer *w) {
    int rc = 0;
    if (w->gz) rc = gzclose(w->gz) == Z_OK ? 0 : -1;
    else if (w->plain && w->plain != stdout) rc = fclose(w->plain) == 0 ? 0 : -1;
    else if (w->plain) rc = fflush(w->plain) == 0 ? 0 : -1;
    free(w);
    return rc;
}
