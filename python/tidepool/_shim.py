# SPDX-License-Identifier: MIT
"""ctypes binding of libtidepool_torch.so: configuration, statistics, metrics,
memory map, trimming, traces. Standard library only (no torch, no GPU).

The library reads TIDEPOOL_TORCH_CONF when it is loaded; configure() replaces
that configuration before the first pool exists.
"""
import ctypes
import json
import os
import threading

LIB_NAME = "libtidepool_torch.so"

# The shim's configuration keys (integrations/pytorch/README.md).
KEYS = ("kind", "limit", "release_threshold", "idle_release_ms", "align", "page", "va_reserve", "max_map",
        "tick_ms", "log", "stats", "trace", "oom", "backend")

_lock = threading.Lock()
_lib = None
_applied = None  # the text configure() applied last


class ConfigError(ValueError):
    """A configuration item tidepool refuses; .key names its key ('' when
    the item has none), .item is the item as written."""

    def __init__(self, message, key="", item=""):
        super().__init__(message)
        self.key = key
        self.item = item


def library_path():
    env = os.environ.get("TIDEPOOL_TORCH_LIB")
    if env:
        return os.path.abspath(env)
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), LIB_NAME)


def lib():
    """The loaded library (loaded once; PyTorch's CUDAPluggableAllocator
    loading the same path gets the same copy)."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = library_path()
        if not os.path.exists(path):
            raise OSError("tidepool: %s not found (the package was installed without its native library? "
                          "reinstall with `pip install --no-build-isolation ./python`, or set TIDEPOOL_TORCH_LIB)"
                          % path)
        L = ctypes.CDLL(path)
        c_int, c_char_p, c_size_t, c_void_p, c_ssize_t = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t,
                                                         ctypes.c_void_p, ctypes.c_ssize_t)
        sig = {
            "tp_torch_stats_json": (c_char_p, [c_int]),
            "tp_torch_metrics": (c_char_p, [c_int, c_char_p]),
            "tp_torch_snapshot_json": (c_char_p, [c_int]),
            "tp_torch_configure": (c_int, [c_char_p, c_char_p, c_size_t, c_char_p, c_size_t]),
            "tp_torch_prepare": (c_int, [c_int]),
            "tp_torch_trim": (ctypes.c_ulonglong, [c_int, ctypes.c_ulonglong]),
            "tp_torch_reset_peaks": (c_int, [c_int]),
            "tp_torch_empty_cache": (None, []),
            "tp_torch_trace_close": (c_int, []),
            "tp_torch_set_oom_handler": (None, [c_void_p]),
            "tp_torch_record_stream": (None, [c_void_p, c_void_p]),
            "tp_torch_try_alloc": (c_void_p, [c_ssize_t, c_int, c_void_p]),
            "tp_torch_free": (None, [c_void_p, c_ssize_t, c_int, c_void_p]),
        }
        for name, (restype, argtypes) in sig.items():
            fn = getattr(L, name)
            fn.restype = restype
            fn.argtypes = argtypes
        _lib = L
        return L


# ------------------------------------------------------------ configuration

def _format_value(key, value):
    if isinstance(value, bool):
        raise ConfigError("tidepool: %s=%r: expected a number or a string" % (key, value), key)
    if isinstance(value, int):
        if value < 0:
            raise ConfigError("tidepool: %s=%d: must not be negative" % (key, value), key)
        return str(value)
    if isinstance(value, float):
        raise ConfigError("tidepool: %s=%r: give an integer (bytes, milliseconds) or a string such as '70GiB', "
                          "'90%%' or 'never'" % (key, value), key)
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value)
        if "," in text:
            raise ConfigError("tidepool: %s=%r: a value cannot hold a comma" % (key, text), key)
        return text
    raise ConfigError("tidepool: %s=%r: expected a number or a string" % (key, value), key)


def split_items(text):
    """TIDEPOOL_TORCH_CONF text -> [(key, item)], in order (an item without
    '=' has itself as key, so that the library reports it)."""
    out = []
    for item in (text or "").split(","):
        item = item.strip()
        if not item and not (text or "").strip():
            continue
        key = item.split("=", 1)[0].strip() if "=" in item else item
        out.append((key, item))
    return out


def build_conf(options, env_text=None):
    """The configuration text for options (a dict; None values are left
    out) on top of env_text (TIDEPOOL_TORCH_CONF): options replace the
    environment's items with the same key."""
    items = split_items(env_text)
    for key, value in options.items():
        if value is None:
            continue
        item = "%s=%s" % (key, _format_value(key, value))
        for i, (k, _) in enumerate(items):
            if k == key:
                items[i] = (key, item)
                break
        else:
            items.append((key, item))
    return ",".join(item for _, item in items)


def configure(text, env_text=None):
    """Applies text (TIDEPOOL_TORCH_CONF's syntax) before any pool exists.
    ConfigError (a ValueError) names the key of a bad item; RuntimeError
    when a pool already exists with another configuration."""
    global _applied
    L = lib()
    err = ctypes.create_string_buffer(512)
    key = ctypes.create_string_buffer(128)
    rc = L.tp_torch_configure(text.encode(), err, len(err), key, len(key))
    if rc == -1:
        k = key.value.decode(errors="replace")
        item = next((it for kk, it in split_items(text) if kk == k), k)
        origin = ""
        if env_text and any(kk == k for kk, _ in split_items(env_text)) and item in env_text:
            origin = " (from TIDEPOOL_TORCH_CONF=%r)" % env_text
        raise ConfigError("tidepool: bad configuration item %r%s: %s" % (item, origin, err.value.decode(errors="replace")),
                          k, item)
    if rc == -2:
        if _applied == text:
            return
        raise RuntimeError("tidepool: %s; configure tidepool before the first CUDA allocation" %
                           err.value.decode(errors="replace"))
    _applied = text


def config():
    """The configuration in force: {"ok", "source", "kind", "limit_bytes", ...};
    with "error" and "bad_key" when TIDEPOOL_TORCH_CONF was refused."""
    return stats(None)["tidepool_torch"]["config"]


def check_env_config():
    """Raises ConfigError if TIDEPOOL_TORCH_CONF was refused (no pool would
    be created)."""
    c = config()
    if not c.get("ok", True) and c.get("source") == "TIDEPOOL_TORCH_CONF":
        env = os.environ.get("TIDEPOOL_TORCH_CONF", "")
        k = c.get("bad_key", "")
        item = next((it for kk, it in split_items(env) if kk == k), k)
        raise ConfigError("tidepool: bad configuration item %r (from TIDEPOOL_TORCH_CONF=%r): %s; no pool is created "
                          "until it is fixed" % (item, env, c.get("error", "")), k, item)


# --------------------------------------------------------------- statistics

def _dev(device):
    if device is None:
        return -1
    if hasattr(device, "index"):  # torch.device
        return 0 if device.index is None else int(device.index)
    return int(device)


def stats(device=0):
    """tidepool's statistics as a dict: one device ({"device", "spec",
    "state", "shim", "trace"?, "pool"}), or with device=None every device
    used and the configuration ({"tidepool_torch", "devices"})."""
    return json.loads(lib().tp_torch_stats_json(_dev(device)).decode())


def devices():
    """Numbers of the devices tidepool has a pool (or a failed attempt) for."""
    return [d["device"] for d in stats(None)["devices"]]


def metrics(device=None, labels=None):
    """Prometheus text exposition of the pools (tp_pool_stats_openmetrics);
    device=None: every pool, merged into one valid exposition."""
    L = lib()
    devs = [_dev(device)] if device is not None else devices()
    lab = labels.encode() if labels else None
    texts = [L.tp_torch_metrics(d, lab).decode() for d in devs]
    return merge_expositions([t for t in texts if t])


def merge_expositions(texts):
    """Merges Prometheus texts with the same metric families: one HELP and
    TYPE per family, then the samples of every text, families in order of
    first appearance."""
    if len(texts) == 1:
        return texts[0]
    order, meta, samples = [], {}, {}
    for text in texts:
        family = None
        for line in text.splitlines():
            if line.startswith("# HELP ") or line.startswith("# TYPE "):
                family = line.split()[2]
                if family not in meta:
                    order.append(family)
                    meta[family] = []
                    samples[family] = []
                if line not in meta[family]:
                    meta[family].append(line)
            elif line.strip() and family is not None:
                samples[family].append(line)
    out = []
    for family in order:
        out.extend(meta[family])
        out.extend(samples[family])
    return "\n".join(out) + ("\n" if out else "")


def snapshot(device=0):
    """The memory map of device's pool (tp_pool_snapshot_json), parsed:
    {"kind", "now_ns", "reserved_bytes", "ranges": [...]}; None when the
    device has no pool."""
    text = lib().tp_torch_snapshot_json(_dev(device)).decode()
    return json.loads(text) if text else None


def trim(target_bytes=0, device=None):
    """Releases idle memory until each pool (or device's) holds at most
    target_bytes; returns the bytes released."""
    return int(lib().tp_torch_trim(_dev(device), int(target_bytes)))


def empty_cache():
    """Every pool gives its idle memory back to the driver."""
    lib().tp_torch_empty_cache()


def reset_peak_stats(device=None):
    """Every peak back to its current value; returns the pools reset."""
    return int(lib().tp_torch_reset_peaks(_dev(device)))


def prepare(device):
    """Creates device's pool now; RuntimeError saying why if it cannot."""
    st = lib().tp_torch_prepare(_dev(device))
    if st != 0:
        s = stats(device)
        c = config()
        why = c.get("error") if not c.get("ok", True) else s.get("error", "status %d" % st)
        raise RuntimeError("tidepool: no pool on device %s (%s): %s" % (_dev(device), s.get("spec", ""), why))


def trace_paths():
    """{device: path} of the traces being (or having been) recorded."""
    out = {}
    for d in stats(None)["devices"]:
        t = d.get("trace") or {}
        if "path" in t:
            out[d["device"]] = t["path"]
    return out


def stop_trace():
    """Stops recording traces, writes and closes their files (otherwise done
    at exit); returns {device: path}."""
    rc = lib().tp_torch_trace_close()
    if rc < 0:
        raise OSError("tidepool: writing a trace failed")
    return trace_paths()


def record_stream(ptr, stream):
    """tp_torch_record_stream: the block at ptr (its start) is used on
    stream (a CUstream as an int); its free will wait for stream's work."""
    lib().tp_torch_record_stream(ctypes.c_void_p(ptr), ctypes.c_void_p(stream or None))


# ------------------------------------------------------------------ summary

def format_bytes(n):
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return ("%d %s" % (n, unit)) if unit == "B" else ("%.2f %s" % (n, unit))
        n /= 1024
    return str(n)


def memory_summary(device=0):
    """A text table of device's pool, in the spirit of
    torch.cuda.memory_summary()."""
    s = stats(device)
    width = 77
    lines = ["|" + "=" * (width - 2) + "|"]

    def row(text):
        lines.append("| " + text.ljust(width - 4) + " |")

    def rule():
        lines.append("|" + "-" * (width - 2) + "|")

    pool = s.get("pool")
    title = "tidepool memory summary, device %s" % s.get("device")
    if pool:
        title += " (%s, %s pool)" % (s.get("spec"), pool.get("kind"))
    row(title.center(width - 4))
    rule()
    if not pool:
        row("state: %s%s" % (s.get("state"), (" (%s)" % s["error"]) if s.get("error") else ""))
        lines.append("|" + "=" * (width - 2) + "|")
        return "\n".join(lines)
    row("%-22s|%16s |%16s |%16s" % ("Metric", "Current", "Peak", "Total"))
    rule()
    for key, name in (("requested_bytes", "Requested memory"), ("allocated_bytes", "Allocated memory"),
                      ("reserved_bytes", "Reserved memory"), ("cached_bytes", "Cached (idle)"),
                      ("pinned_bytes", "Pinned")):
        v = pool.get(key) or {}
        row("%-22s|%16s |%16s |%16s" % (name, format_bytes(v.get("current", 0)), format_bytes(v.get("peak", 0)),
                                          format_bytes(v.get("total", 0))))
    rule()
    allocs = pool.get("allocs", 0)
    hits = pool.get("cache_hits", 0)
    row("Limit: %s   allocations: %d   frees: %d   cache hits: %d (%.1f%%)" % (
        format_bytes(pool.get("limit_bytes", 0)), allocs, pool.get("frees", 0), hits,
        100.0 * hits / allocs if allocs else 0.0))
    row("Device allocs/frees: %d/%d   driver calls: %d   host syncs: %d" % (
        pool.get("device_allocs", 0), pool.get("device_frees", 0), pool.get("device_calls", 0),
        pool.get("synchronizations", 0)))
    row("OOMs: %d   OOM retries: %d   failed allocs (shim): %d" % (
        pool.get("ooms", 0), pool.get("oom_retries", 0), s.get("shim", {}).get("failed_allocs", 0)))
    row("Free ranges: %d   largest: %s   fragmentation: %.3f" % (
        pool.get("free_ranges", 0), format_bytes(pool.get("largest_free_bytes", 0)), pool.get("fragmentation", 0.0)))
    if s.get("trace", {}).get("path"):
        t = s["trace"]
        row("Trace: %s (%d rows%s)" % (t["path"], t.get("rows", 0), "" if t.get("open") else ", closed"))
    lines.append("|" + "=" * (width - 2) + "|")
    return "\n".join(lines)
