# SPDX-License-Identifier: MIT
"""tidepool for PyTorch.

Two modes (README.md, "Which mode"):

  enable(...)    tidepool becomes PyTorch's CUDA allocator for the whole
                 process (CUDAPluggableAllocator + change_current_allocator).
                 Call it right after `import torch`, before anything uses
                 CUDA memory. PyTorch's caching allocator is out of the way,
                 so its own statistics, cacheInfo (cudnn.benchmark),
                 snapshots and record_stream are not available: use
                 stats()/memory_summary()/snapshot()/record_stream() here.

  mem_pool(...)  a torch.cuda.MemPool whose memory comes from tidepool, used
                 with `with torch.cuda.use_mem_pool(pool):`. PyTorch's
                 caching allocator stays in charge above tidepool (its
                 statistics, cacheInfo -- so cudnn.benchmark works --,
                 snapshots, memory_viz, record_stream, graphs), and asks
                 tidepool for its segments. Any time, any number of pools.

Importing this module needs neither torch nor a GPU; enable() and
mem_pool() import torch.
"""
import ctypes
import os
import threading
import warnings

from . import _oom_build, _shim
from ._shim import (ConfigError, config, devices, empty_cache as _tp_empty_cache, format_bytes, memory_summary,
                    metrics, reset_peak_stats, snapshot, stats, stop_trace, trace_paths, trim)

__all__ = ["enable", "mem_pool", "is_enabled", "stats", "memory_summary", "empty_cache", "reset_peak_stats", "trim",
           "metrics", "snapshot", "config", "devices", "record_stream", "stop_trace", "trace_paths", "oom_handler_status",
           "ConfigError", "format_bytes"]

_lock = threading.RLock()
_state = {
    "mode": None,          # None, "enabled"
    "conf": None,          # the configuration text applied
    "allocator": None,     # the CUDAPluggableAllocator of enable()
    "pool_allocator": None,  # the one behind mem_pool() (never throws)
    "oom_lib": None,       # the loaded _tidepool_oom.so
    "oom_status": "not installed (enable() was not called)",
}


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("tidepool.torch.enable()/mem_pool() need PyTorch (import torch failed: %s)" % e) from e
    return torch


def _apply_config(options):
    """Validates and applies the configuration (options over
    TIDEPOOL_TORCH_CONF). ConfigError names the key of a bad item."""
    env = os.environ.get("TIDEPOOL_TORCH_CONF")
    for key in options:
        if key not in _shim.KEYS:
            raise ConfigError("tidepool: unknown configuration key %r (known: %s)" % (key, ", ".join(_shim.KEYS)), key,
                              key)
    if not any(v is not None for v in options.values()):
        # Nothing given here: the environment's configuration, which the
        # library already read (and may have refused).
        if _state["conf"] is None:
            _shim.check_env_config()
            _state["conf"] = env or ""
        return
    text = _shim.build_conf(options, env)
    _shim.configure(text, env)
    _state["conf"] = text


def _too_late_message(torch, error):
    held = ""
    try:
        held = " (it holds %s in %d allocations now)" % (
            format_bytes(torch.cuda.memory_allocated()), int(torch.cuda.memory_stats().get("allocation.all.current", 0)))
    except Exception:
        pass
    return ("tidepool.torch.enable() came after PyTorch's own CUDA allocator was used%s, and PyTorch cannot swap "
            "allocators after that (%s). Move `tidepool.torch.enable(...)` to the top of the program, right after "
            "`import torch` and before anything touches CUDA memory: before a model or tensor is moved to 'cuda' "
            "(.cuda(), .to('cuda'), device='cuda'), before torch.cuda.mem_get_info()/memory_reserved(), and before "
            "importing libraries that do so at import time. Or use tidepool.torch.mem_pool(), which works at any "
            "time." % (held, error))


def _install_oom_handler(torch):
    """Loads (or builds) _tidepool_oom.so for this torch and installs it:
    out of memory then raises torch.cuda.OutOfMemoryError."""
    if _state["oom_lib"] is not None:
        return
    if os.environ.get("TIDEPOOL_OOM_HELPER", "auto") == "0":
        _state["oom_status"] = "off (TIDEPOOL_OOM_HELPER=0): out of memory raises RuntimeError"
        return
    abi = bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    want = _oom_build.torch_tag(torch.__version__, abi)
    packaged = os.path.join(os.path.dirname(os.path.abspath(__file__)), _oom_build.HELPER_NAME)
    candidates = [packaged, _oom_build.cached_path(torch.__version__, abi)]
    path = next((p for p in candidates if os.path.exists(p) and _oom_build.read_stamp(p) == want), None)
    why = ""
    if path is None and os.environ.get("TIDEPOOL_OOM_HELPER", "auto") != "packaged":
        # Not built at install time (torch absent then, or another version):
        # build it now, once, into the cache.
        ok, log = _oom_build.build(os.path.dirname(os.path.abspath(torch.__file__)), torch.__version__, abi,
                                   candidates[1])
        if ok:
            path = candidates[1]
        else:
            why = log.strip().splitlines()[-1] if log.strip() else "build failed"
    if path is None:
        _state["oom_status"] = ("missing (%s): out of memory raises RuntimeError, not torch.cuda.OutOfMemoryError"
                                % (why or "not built for torch %s" % torch.__version__))
        warnings.warn("tidepool: the out-of-memory helper is " + _state["oom_status"], RuntimeWarning, stacklevel=3)
        return
    helper = ctypes.CDLL(path)
    fn = ctypes.cast(helper.tp_torch_oom_throw, ctypes.c_void_p).value
    _shim.lib().tp_torch_set_oom_handler(fn)
    _state["oom_lib"] = helper
    _state["oom_status"] = "installed (%s): out of memory raises torch.cuda.OutOfMemoryError" % path


def oom_handler_status():
    """Whether out of memory raises torch.cuda.OutOfMemoryError (and why not)."""
    return _state["oom_status"]


def is_enabled():
    return _state["mode"] == "enabled"


def enable(kind=None, limit=None, release_threshold=None, idle_release_ms=None, trace=None, device=None, **options):
    """Makes tidepool PyTorch's CUDA allocator for this process.

    kind: "vmm", "segment" or "auto"; limit: bytes (int) or "70GiB" / "90%";
    release_threshold: idle bytes kept cached (int, "256MiB", "unlimited");
    idle_release_ms: int or "never"; trace: path of a CSV trace to record
    (".gz": gzip; %p: pid; %d: device); device: device number(s) whose pool
    is created now, so that a device or configuration problem raises here;
    options: the other TIDEPOOL_TORCH_CONF keys (log, stats, align, page,
    va_reserve, max_map, tick_ms, oom). Arguments override the same keys of
    TIDEPOOL_TORCH_CONF; a bad item raises ConfigError (a ValueError)
    naming its key. Returns the CUDAPluggableAllocator.
    """
    opts = dict(kind=kind, limit=limit, release_threshold=release_threshold, idle_release_ms=idle_release_ms,
                trace=trace, **options)
    with _lock:
        if _state["mode"] == "enabled":
            env = os.environ.get("TIDEPOOL_TORCH_CONF")
            if any(v is not None for v in opts.values()) and _shim.build_conf(opts, env) != _state["conf"]:
                raise RuntimeError("tidepool.torch.enable() was already called with another configuration (%r); "
                                   "the configuration cannot change once tidepool is PyTorch's allocator"
                                   % _state["conf"])
            return _state["allocator"]
        torch = _torch()
        _apply_config(opts)
        allocator = torch.cuda.memory.CUDAPluggableAllocator(_shim.library_path(), "tp_torch_alloc", "tp_torch_free")
        try:
            torch.cuda.memory.change_current_allocator(allocator)
        except RuntimeError as e:
            if "already initialized" in str(e):
                raise RuntimeError(_too_late_message(torch, e)) from e
            raise
        _state["mode"] = "enabled"
        _state["allocator"] = allocator
        _install_oom_handler(torch)
        for d in ([device] if isinstance(device, int) else (device or [])):
            _shim.prepare(d)
        return allocator


def mem_pool(**options):
    """A torch.cuda.MemPool backed by tidepool, for
    `with torch.cuda.use_mem_pool(pool): ...`. PyTorch's caching allocator
    keeps working above it (cudnn.benchmark, torch.cuda.memory_stats(),
    snapshots, record_stream, CUDA graphs) and takes its segments from
    tidepool. options: as enable()'s (only before tidepool's first pool
    exists). Out of memory: PyTorch's own torch.cuda.OutOfMemoryError, after
    PyTorch released its cache and retried."""
    torch = _torch()
    if not hasattr(torch.cuda, "MemPool") or not hasattr(torch.cuda, "use_mem_pool"):
        raise RuntimeError("tidepool.torch.mem_pool() needs torch.cuda.MemPool and torch.cuda.use_mem_pool "
                           "(a recent PyTorch); this is torch %s" % torch.__version__)
    with _lock:
        _apply_config(options)
        if _state["pool_allocator"] is None:
            # tp_torch_try_alloc never throws: PyTorch's caching allocator
            # handles a NULL segment (frees its cache, retries, raises
            # torch.cuda.OutOfMemoryError).
            _state["pool_allocator"] = torch.cuda.memory.CUDAPluggableAllocator(
                _shim.library_path(), "tp_torch_try_alloc", "tp_torch_free")
        return torch.cuda.MemPool(_state["pool_allocator"].allocator())


def empty_cache():
    """Releases idle memory: PyTorch's cached segments first (mem_pool mode;
    a no-op after enable()), then every tidepool pool's idle memory."""
    try:
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception:
        pass
    _tp_empty_cache()


def record_stream(tensor, stream):
    """What Tensor.record_stream(stream) does for PyTorch's own allocator,
    for tensors from enable() (Tensor.record_stream is a no-op there:
    PyTorch gives Python no way to register the hook): the tensor's memory
    is not reused before the work queued on stream so far is done."""
    storage = tensor.untyped_storage()
    _shim.record_stream(storage.data_ptr(), int(stream.cuda_stream))
