#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
r"""replay_trace.py -- an allocation trace replayed through PyTorch's CUDA
allocators, and through tidepool plugged into PyTorch, on a real GPU.

`tide replay` answers "how much would tidepool hold on this trace" on the
simulated device. This answers the same question for PyTorch's own
allocators, for the reference figures next to it: every event of the trace
becomes torch.empty(size, dtype=torch.uint8) on a CUDA stream (one
torch.cuda.Stream per stream id of the trace; id 0 is the default stream) or
the release of that tensor, so the allocator sees the sizes, order and
streams of the trace and nothing else (no kernels run).

Allocators, each (trace, allocator) pair in a fresh python3 process:
  default      PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  async        PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
  tp-vmm       libtidepool_torch.so plugged in (--lib), TIDEPOOL_TORCH_CONF=kind=vmm
  tp-segment   ... kind=segment
Reported per run, as `tide replay` does:
  peak live    the most bytes the trace had allocated at once (its sizes as
               written, before any allocator's rounding)
  peak held    the allocator's peak reserved bytes (torch.cuda.memory_stats
               "reserved_bytes.all.peak"; tidepool's reserved_bytes.peak)
  held/live    their ratio
  driver       device allocations and frees the allocator made (PyTorch's
               num_device_alloc / num_device_free; tidepool's device_allocs /
               device_frees); cudaMallocAsync reports none
  used peak    device memory in use (torch.cuda.mem_get_info), read every
               --sample-every events, peak minus the value before the first
               event: a check on the allocator's own figure that every
               allocator is measured by alike (it may miss a short peak)

Trace format: tidepool CSV (time_us,action,addr,size,stream; action alloc or
free; a header line is optional), plain or gzip (told apart by content). The
address is an identity: a free names the address of a live alloc. Time is
ignored: the replay runs as fast as the host can issue the calls, so
allocators that release memory after a time idle see a much shorter run
than the trace's.

Usage, on a machine with a GPU and torch:
  python3 integrations/pytorch/replay_trace.py TRACE.csv.gz [TRACE ...] \
      [--modes default,expandable,tp-vmm] [--lib build/libtidepool_torch.so] [--out runs.json]
Exit status: 0 every run finished; 1 a run failed (its error is in the
table and in --out); 2 bad usage or an unreadable trace.
"""
import argparse
import gzip
import json
import os
import subprocess
import sys
import time

MODES = ["default", "expandable", "async", "tp-vmm", "tp-segment"]
ALLOC_CONF = {"default": "", "expandable": "expandable_segments:True", "async": "backend:cudaMallocAsync"}
TP_CONF = {"tp-vmm": "kind=vmm", "tp-segment": "kind=segment"}
RESULT_TAG = "REPLAY_TRACE_RESULT "
MiB = 1 << 20


class TraceError(Exception):
    pass


def open_text(path):
    with open(path, "rb") as f:
        magic = f.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rt", newline="")
    return open(path, "r", newline="")


def events(path):
    """Yields (is_alloc, addr, size, stream) for every event of a tidepool CSV
    trace. Raises TraceError naming the line of the first malformed event."""
    with open_text(path) as f:
        for number, line in enumerate(f, 1):
            line = line.strip()
            if not line or (number == 1 and line.startswith("time_us")):
                continue
            parts = line.split(",")
            if len(parts) != 5:
                raise TraceError("%s:%d: expected time_us,action,addr,size,stream, got %r" % (path, number, line[:80]))
            _, action, addr, size, stream = parts
            if action not in ("alloc", "free"):
                raise TraceError("%s:%d: action %r is neither alloc nor free" % (path, number, action))
            try:
                size_bytes = int(size)
                stream_id = int(stream)
                int(addr, 0)
            except ValueError:
                raise TraceError("%s:%d: address, size and stream must be integers: %r" % (path, number, line[:80]))
            if size_bytes < 0 or stream_id < 0:
                raise TraceError("%s:%d: negative size or stream" % (path, number))
            yield action == "alloc", addr, size_bytes, stream_id


class LiveBlocks:
    """The trace's live blocks, as the replay and the reader both count them:
    bytes live now, their peak, and frees of addresses that are not live
    (skipped). Each block may carry what keeps it alive (a tensor)."""

    def __init__(self, path):
        self.path, self.blocks, self.bytes, self.peak, self.unknown_frees = path, {}, 0, 0, 0

    def alloc(self, addr, size, payload=None):
        if addr in self.blocks:
            raise TraceError("%s: address %s allocated twice without a free" % (self.path, addr))
        self.blocks[addr] = (size, payload)
        self.bytes += size
        self.peak = max(self.peak, self.bytes)

    def free(self, addr):
        if addr in self.blocks:
            self.bytes -= self.blocks.pop(addr)[0]  # the payload goes with it
        else:
            self.unknown_frees += 1


def trace_figures(path):
    """The trace's own figures, with no allocator: events, peak live bytes,
    frees of addresses that are not live (skipped by the replay too)."""
    live, count = LiveBlocks(path), 0
    for is_alloc, addr, size, _ in events(path):
        count += 1
        if is_alloc:
            live.alloc(addr, size)
        else:
            live.free(addr)
    return dict(events=count, peak_live=live.peak, unknown_frees=live.unknown_frees)


# ---------------------------------------------------------------- the child

def child(args):
    mode, path = args.child, args.traces[0]
    t_start = time.perf_counter()
    try:
        import torch
    except ImportError:
        print("replay_trace.py: torch is not installed", file=sys.stderr)
        return 77
    lib = None
    if mode in TP_CONF:
        import ctypes
        alloc = torch.cuda.memory.CUDAPluggableAllocator(args.lib, "tp_torch_alloc", "tp_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)  # before any CUDA allocation
        lib = ctypes.CDLL(args.lib)
        lib.tp_torch_stats_json.restype = ctypes.c_char_p
        lib.tp_torch_stats_json.argtypes = [ctypes.c_int]
    torch.cuda.init()
    device = torch.device("cuda:0")
    torch.cuda.synchronize()
    free0, _ = torch.cuda.mem_get_info()
    used_peak, streams, current, live, count = 0, {}, None, LiveBlocks(path), 0
    error = None
    try:
        for is_alloc, addr, size, stream_id in events(path):
            count += 1
            if is_alloc:
                if stream_id != current:
                    if stream_id not in streams:
                        streams[stream_id] = torch.cuda.default_stream() if stream_id == 0 else torch.cuda.Stream()
                    torch.cuda.set_stream(streams[stream_id])
                    current = stream_id
                live.alloc(addr, size, torch.empty(size, dtype=torch.uint8, device=device))
            else:
                live.free(addr)
            if count % args.sample_every == 0:
                used_peak = max(used_peak, free0 - torch.cuda.mem_get_info()[0])
        torch.cuda.synchronize()
        used_peak = max(used_peak, free0 - torch.cuda.mem_get_info()[0])
    except Exception as e:  # out of memory, a trace error, ...
        error = "%s: %s" % (type(e).__name__, str(e)[:500])
    peak_live = live.peak
    res = dict(trace=os.path.basename(path), mode=mode, error=error, events=count, unknown_frees=live.unknown_frees,
               peak_live=peak_live, used_peak=used_peak, device=torch.cuda.get_device_name(0),
               torch=torch.__version__)
    if lib is None:
        st = torch.cuda.memory_stats()
        res.update(conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                   peak_held=st.get("reserved_bytes.all.peak"),
                   driver_allocs=st.get("num_device_alloc"), driver_frees=st.get("num_device_free"))
    else:
        pool = json.loads(lib.tp_torch_stats_json(0).decode()).get("pool") or {}
        res.update(conf=os.environ.get("TIDEPOOL_TORCH_CONF", ""),
                   peak_held=pool.get("reserved_bytes", {}).get("peak"),
                   driver_allocs=pool.get("device_allocs"), driver_frees=pool.get("device_frees"))
    if res["peak_held"] and peak_live:
        res["ratio"] = round(res["peak_held"] / peak_live, 3)
    res["seconds"] = round(time.perf_counter() - t_start, 1)
    print(RESULT_TAG + json.dumps(res), flush=True)
    os._exit(0 if error is None else 3)  # skip CUDA's teardown: every figure is out


# --------------------------------------------------------------- the parent

def run_one(args, path, mode):
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    if mode in ALLOC_CONF and ALLOC_CONF[mode]:
        env["PYTORCH_CUDA_ALLOC_CONF"] = ALLOC_CONF[mode]
    if mode in TP_CONF:
        env["TIDEPOOL_TORCH_CONF"] = ",".join(x for x in (TP_CONF[mode], args.tp_conf) if x)
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--lib", args.lib or "",
           "--sample-every", str(args.sample_every), path]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in p.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
    return dict(trace=os.path.basename(path), mode=mode, error="exit %d: %s" % (p.returncode, tail[:300]))


def fmt_mib(b):
    return "%.1f" % (b / MiB) if isinstance(b, int) else "-"


def print_table(results):
    print("%-28s %-11s %12s %12s %9s %13s %12s %7s" %
          ("trace", "allocator", "live MiB", "held MiB", "held/live", "driver a/f", "used MiB", "s"))
    for r in results:
        if r.get("error"):
            print("%-28s %-11s error: %s" % (r["trace"][:28], r["mode"], r["error"]))
            continue
        calls = "%s/%s" % (r.get("driver_allocs", "-"), r.get("driver_frees", "-"))
        print("%-28s %-11s %12s %12s %9s %13s %12s %7s" %
              (r["trace"][:28], r["mode"], fmt_mib(r["peak_live"]), fmt_mib(r.get("peak_held")),
               "%.3f" % r["ratio"] if r.get("ratio") else "-", calls, fmt_mib(r.get("used_peak")), r["seconds"]))


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="replay_trace.py", description=__doc__.split("-- ", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("traces", nargs="+", metavar="TRACE", help="tidepool CSV traces, plain or gzip")
    ap.add_argument("--modes", default="default,expandable",
                    help="comma list of " + ",".join(MODES) + " (default: default,expandable)")
    ap.add_argument("--lib", default=None, help="libtidepool_torch.so, for the tp-* modes")
    ap.add_argument("--tp-conf", default="", help="TIDEPOOL_TORCH_CONF items added to the tp-* modes")
    ap.add_argument("--sample-every", type=int, default=256, metavar="N",
                    help="read the device's used memory every N events (default 256)")
    ap.add_argument("--out", default=None, help="write every run's figures as a JSON list")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.sample_every < 1:
        ap.error("--sample-every must be at least 1")
    if args.child is None:
        modes = [m for m in args.modes.split(",") if m]
        bad = [m for m in modes if m not in MODES]
        if bad or not modes:
            ap.error("--modes: unknown allocator %s (choose from %s)" % (", ".join(bad) or "(none)", ",".join(MODES)))
        if any(m in TP_CONF for m in modes) and not (args.lib and os.path.exists(args.lib)):
            ap.error("the tp-* modes need --lib PATH to an existing libtidepool_torch.so")
        args.mode_list = modes
    return args


def main(argv):
    args = parse_args(argv)
    if args.child:
        return child(args)
    for path in args.traces:  # read every trace once before any GPU run: a bad one fails fast
        try:
            figures = trace_figures(path)
        except (OSError, EOFError, TraceError) as e:
            print("replay_trace.py: %s" % e, file=sys.stderr)
            return 2
        print("%s: %d events, peak live %.1f MiB%s" % (path, figures["events"], figures["peak_live"] / MiB,
              ", %d frees of addresses not live (skipped)" % figures["unknown_frees"] if figures["unknown_frees"] else ""),
              flush=True)
    results = []
    for path in args.traces:
        for mode in args.mode_list:
            results.append(run_one(args, path, mode))
    print_table(results)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 1 if any(r.get("error") for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
