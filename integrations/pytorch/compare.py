#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
r"""compare.py -- PyTorch's CUDA allocator against tidepool, side by side, on
the workloads of record_pytorch_traces.py, the script that recorded the real
traces (docs/traces.md; not part of this repository: --workloads gives its
path).

Every (workload, allocator) pair runs in a fresh python3 process:
  default      PyTorch's caching allocator
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
  async        PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (the CUDA
               driver's stream-ordered pool behind PyTorch)
  tp-vmm       libtidepool_torch.so plugged in, TIDEPOOL_TORCH_CONF=kind=vmm
  tp-segment   ... kind=segment
  tp-vmm-pages ... kind=vmm,max_chunk=2MiB: every page its own physical
               allocation, as before chunks (not in the default list)
  tp-MODE:ITEM+ITEM...  a tidepool mode with TIDEPOOL_TORCH_CONF items of
               its own, e.g. tp-vmm:page=32MiB or tp-vmm:page=8MiB+max_chunk=64MiB
               (a mode of its own in every table: several settings side by side)
and reports
  peak used    device memory in use (NVML, or torch.cuda.mem_get_info when
               pynvml is missing), sampled by a background thread every
               --sample-ms, peak minus the value before the model was built
  alloc peak   the allocator's own peak reserved memory:
               torch.cuda.max_memory_reserved() for PyTorch's runs, tidepool's
               reserved_bytes.peak (tp_torch_stats_json) for ours
  wall, tok/s  the workload's wall time (model build included) and generated
               tokens per second of the time spent inside generate()
  same         whether the generated token ids (greedy, fixed seeds) hash the
               same as the first mode's run of that workload
  steps        (with --rounds) the time of every generated step, taken by a
               streamer that generate() calls once a step (--no-step-times:
               none): per step its median over the allocator's rounds, summed
               over the steps, and that sum's ratio to the fastest PyTorch
               allocator's (see below)
Prints a table; --out FILE writes every figure as JSON.

Usage, on a machine with a GPU, torch and transformers (no network needed):
  python3 integrations/pytorch/compare.py --workloads PATH/record_pytorch_traces.py \
      --lib build-torch/libtidepool_torch.so --out compare.json
Duration on the H200 here: about 8 minutes for 12 runs (three workloads,
four modes) with the default parameters; each run costs ~20 s of process start, imports and model build
before the workload's own time.
Parameters: the defaults are shortened to fit one 10-minute call:
--decode-tokens 256 (the trace: 2000) and --requests 8 (the traces: 16; with 8
the vision workloads already reach the recorded peaks). --full restores the
recorded parameters (about 17 minutes in all: split it with --scenarios and
--modes); --quick (64 tokens, 3 requests) is a smoke test of a few minutes.
Determinism: every run gets PYTHONHASHSEED=0 and torch.manual_seed(--seed).
Without PYTHONHASHSEED, two runs with the same allocator generated different
tokens (decode_growing_kv, qwen2vl_dynres); with it, every run once matched.
On the H200 on 2026-12-02 (PyTorch 2.11, transformers 5.17) runs of 256
decode tokens still differed from run to run with every allocator, PyTorch's
default too (near-tied logits), while runs of 64 tokens all matched. A
mismatch is reported with its likely source: a weights fingerprint and a hash
of the prompts and pixel values are compared too.
--warmup (read, the default) first reads the libraries' files into the page
cache, so the first run does not pay for cold disk reads. --modes and
--scenarios pick a subset (a mode may repeat, e.g. default,default, to see
the run-to-run spread); --rounds N runs the --modes list N times,
interleaved (A B A B ...), and prints per allocator the median, min and max
of the time inside generate() and its ratio to the first mode's median: the
way to put a figure on "within 2%" on a noisy host (on the H200, single
full-length runs of one allocator varied by tens of percent). With rounds
it also sums, over the generated steps, each step's median over the rounds
(every generate() call makes as many steps in every run, so step i does
the same work in each): a slow spell of the host that hits some steps of
one run and other steps of the next drops out, while a cost that comes at
the same step in every run -- an allocator's growth, say -- stays. It discounts, too, costs
that land on a different step each run, such as the tidepool shim's upkeep
thread (ticks once a second); the total time inside generate() keeps them.
The streamer that times the steps is called with each step's new token ids
copied to the host (generate() makes that copy, a few bytes, in every mode
alike; the ids are not read). --tp-conf adds TIDEPOOL_TORCH_CONF items to
the tidepool runs. With --tp-conf time_calls=on the shim times its own
allocations and frees, and each tidepool run also reports how many
milliseconds of its time inside generate() were spent in them
(tp_calls_in_generate_ms; the summary prints their median and their share
of generate()): what the allocator's own host work can account for, apart
from the host's spells. PyTorch's allocators have no such figure.
--side-by-side runs each round's modes at once instead of one after the
other, each in its own process. Runs of one round share the host at the
same moment, so a slow spell of the host slows them all; the summary then
also gives, per allocator, the median over rounds of its generate()
seconds over the fastest PyTorch allocator's in the same round ("side by
side / fastest torch"), a ratio the spells drop out of. A round takes as
long as its slowest run, not the sum of them. With --gpus N each run sees
one GPU (CUDA_VISIBLE_DEVICES), mode i of round r GPU (i + r) mod N, so
that over N rounds every mode runs on every GPU once; with fewer GPUs than
modes the runs share them, and then contend for the GPU as well as the
host; and the GPU's memory in use is theirs together, so "peak used" is
left out (the allocators' own peaks stay). A mode given twice
(default,async,tp-vmm,default) is a control: the summary's "control" line
gives its second run's time over its first's in each round, how far two
identical runs at the same moment differ. --pin gives each run of a round
its own share of the CPUs (sched_setaffinity), the shares rotating from
round to round.
--gpu-time puts PyTorch's profiler (CUDA activity only, through CUPTI)
around every generate() call and reports the GPU's own time in it: the
kernels' durations summed, the copies' and memsets', and the time the GPU
was busy with either (overlaps counted once), with the number of kernels.
That is what an allocator can change on the device -- where its memory
lies, how it is mapped and in what pages -- apart from the host, whose
spells move the time inside generate() by tens of percent: the same
kernels run in every mode (their count says so), and their durations come
from the GPU's clock. The summary gives each allocator's median over the
rounds and its ratio to the fastest PyTorch allocator's, and for tidepool
the five kernels (by name) whose time exceeds that allocator's the most;
the JSON keeps each run's 40 longest (gpu_time.top). The profiler costs
host time at every launch, so generate() seconds of such runs compare only
with other --gpu-time runs. Runs sharing a GPU slow each other's kernels:
with --side-by-side it needs a GPU a run (--gpus).
"""
import argparse
import concurrent.futures
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time

MODES = ["default", "expandable", "async", "tp-vmm", "tp-segment"]
TP_CONF = {"tp-vmm": "kind=vmm", "tp-segment": "kind=segment", "tp-vmm-pages": "kind=vmm,max_chunk=2MiB"}
SCENARIOS = ["decode_growing_kv", "gemma3_mtmd", "qwen2vl_dynres"]
# The model class whose generate() each workload calls.
GENERATE_CLASS = {
    "decode_growing_kv": "LlamaForCausalLM",
    "gemma3_mtmd": "Gemma3ForConditionalGeneration",
    "qwen2vl_dynres": "Qwen2VLForConditionalGeneration",
}
RESULT_TAG = "@@COMPARE_RESULT "
MiB = 1024.0 * 1024.0
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def tp_conf_of(mode):
    """TIDEPOOL_TORCH_CONF's items for a tidepool mode: TP_CONF's for its
    name, then those after a colon, joined by '+' (tp-vmm:page=32MiB);
    None for a mode that is not one, or an item that is not NAME=VALUE."""
    base, colon, extra = mode.partition(":")
    if base not in TP_CONF:
        return None
    items = extra.split("+") if colon else []
    if any(not item.partition("=")[0] or not item.partition("=")[2] for item in items):
        return None
    return ",".join([TP_CONF[base]] + items)


def tidepool_torch_conf(mode, tp_conf):
    """TIDEPOOL_TORCH_CONF for a run of tidepool mode: its items
    (tp_conf_of), log=warn, then --tp-conf's."""
    return ",".join(filter(None, [tp_conf_of(mode), "log=warn", tp_conf]))


# --------------------------------------------------------------- the worker

class MemSampler:
    """Device memory in use, sampled from a background thread."""

    def __init__(self, torch, interval_s):
        self.torch = torch
        self.interval_s = interval_s
        self.source = None
        self._read = None
        self._stop = threading.Event()
        self.peak = 0
        self.samples = 0
        self.timeline = []  # (seconds, bytes) about every 100 ms
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = None
            want = str(torch.cuda.get_device_properties(torch.cuda.current_device()).uuid)
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                uuid = pynvml.nvmlDeviceGetUUID(h)
                uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
                if uuid.replace("GPU-", "") == want.replace("GPU-", ""):
                    handle = h
                    break
            if handle is None and pynvml.nvmlDeviceGetCount() == 1:
                handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            if handle is not None:
                self._read = lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used
                self.source = "nvml"
        except Exception as e:  # no pynvml, no NVML in this container, ...
            self.source_error = repr(e)
        if self._read is None:
            def read():
                free, total = torch.cuda.mem_get_info()
                return total - free
            self._read = read
            self.source = "cudaMemGetInfo"

    def read(self):
        return self._read()

    def start(self):
        self.t0 = time.perf_counter()
        self.peak = self.read()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        next_mark = 0.0
        while not self._stop.is_set():
            v = self.read()
            self.samples += 1
            if v > self.peak:
                self.peak = v
            t = time.perf_counter() - self.t0
            if t >= next_mark:
                self.timeline.append((round(t, 2), v))
                next_mark = t + 0.1
            self._stop.wait(self.interval_s)

    def stop(self):
        self._stop.set()
        self._thread.join()
        v = self.read()
        self.peak = max(self.peak, v)
        self.timeline.append((round(time.perf_counter() - self.t0, 2), v))


class StepClock:
    """A streamer for generate() that keeps the seconds of every generated
    step in `steps`: generate() calls put() with the prompt first, then once
    a step with its new tokens (the value is not read), and end() last."""

    def __init__(self, steps):
        self.steps = steps
        self.last = None

    def put(self, value):
        now = time.perf_counter()
        if self.last is not None:
            self.steps.append(now - self.last)
        self.last = now

    def end(self):
        pass


def gpu_time_summary(events):
    """The GPU's own time in a list of (name, start_ns, duration_ns) of
    its activities: kernel_ns, the kernels' durations summed; copy_ns, the
    copies' and memsets' (names starting Memcpy or Memset, as the profiler
    calls them); busy_ns, the time covered by any of them, overlaps counted
    once; the counts of kernels and copies; and by_name, each name's
    [count, nanoseconds]."""
    kernel_ns = copy_ns = busy_ns = kernels = copies = 0
    intervals = []
    by_name = {}
    for name, start_ns, duration_ns in events:
        if name.startswith("Memcpy") or name.startswith("Memset"):
            copy_ns += duration_ns
            copies += 1
        else:
            kernel_ns += duration_ns
            kernels += 1
        intervals.append((start_ns, start_ns + duration_ns))
        entry = by_name.setdefault(name, [0, 0])
        entry[0] += 1
        entry[1] += duration_ns
    end_ns = None
    for start_ns, stop_ns in sorted(intervals):
        if end_ns is None or start_ns >= end_ns:
            busy_ns += stop_ns - start_ns
            end_ns = stop_ns
        elif stop_ns > end_ns:
            busy_ns += stop_ns - end_ns
            end_ns = stop_ns
    return dict(kernel_ns=kernel_ns, copy_ns=copy_ns, busy_ns=busy_ns, kernels=kernels, copies=copies,
                by_name=by_name)


class GpuTimer:
    """PyTorch's profiler, CUDA activity only, around one generate() call
    (a context manager); events() gives the GPU's activities as (name,
    start_ns, duration_ns)."""

    def __init__(self, torch):
        self.torch = torch
        self.prof = None

    def __enter__(self):
        self.prof = self.torch.profiler.profile(activities=[self.torch.profiler.ProfilerActivity.CUDA])
        self.prof.__enter__()
        return self

    def __exit__(self, *exc):
        self.prof.__exit__(*exc)
        return False

    def events(self):
        device_type = getattr(self.torch.profiler, "DeviceType", None) or self.torch.autograd.DeviceType
        cuda = device_type.CUDA
        results = getattr(self.prof.profiler, "kineto_results", None)
        if results is not None:  # the raw events: no per-event Python objects built beyond these
            return [(e.name(), e.start_ns(), e.duration_ns()) for e in results.events() if e.device_type() == cuda]
        return [(e.name, int(e.time_range.start * 1000), int(e.time_range.elapsed_us() * 1000))
                for e in self.prof.events() if e.device_type == cuda]


def install_generate_probe(torch, cls, record, models, step_times=False, call_ns=None, gpu_timer=None):
    """Wraps cls.generate: counts new tokens, times the calls, hashes the
    generated ids (output_hash) and, to tell where a difference comes from,
    the prompts and pixel values (inputs_hash). Keeps the models in `models`
    so that their weights can be fingerprinted after the measurement. With
    step_times, a call that brings no streamer of its own gets a StepClock
    that appends its steps' seconds to record["step_s"], and every call's
    number of steps goes to record["step_calls"]. call_ns, if given, returns
    the nanoseconds the allocator has spent in its calls so far (tidepool's
    shim with time_calls=on); what a generate() call adds goes to
    record["calls_ns"], read outside the timed part. gpu_timer, if given,
    makes a context manager (GpuTimer) entered before the timed part and
    left after it, the generated ids on the host: the GPU's time in each
    call (gpu_time_summary) adds up in record["gpu"], per name too."""
    orig = cls.generate
    out_digest, in_digest = hashlib.sha256(), hashlib.sha256()

    def generate(self, *args, **kwargs):
        if not any(m is self for m in models):
            models.append(self)
        steps_before = len(record["step_s"])
        if step_times and kwargs.get("streamer") is None:
            kwargs["streamer"] = StepClock(record["step_s"])
        ns_before = call_ns() if call_ns else None
        timer = gpu_timer() if gpu_timer else None
        if timer:
            timer.__enter__()
        try:
            t0 = time.perf_counter()
            out = orig(self, *args, **kwargs)
            if step_times:
                record["step_calls"].append(len(record["step_s"]) - steps_before)
            seqs = out if torch.is_tensor(out) else out.sequences
            ids = seqs.tolist()  # waits for the device
            record["gen_s"] += time.perf_counter() - t0
        finally:
            if timer:
                timer.__exit__(None, None, None)
        if timer:
            total = record.setdefault("gpu", dict(kernel_ns=0, copy_ns=0, busy_ns=0, kernels=0, copies=0,
                                                  by_name={}))
            for key, value in gpu_time_summary(timer.events()).items():
                if key == "by_name":
                    for name, (count, ns) in value.items():
                        entry = total["by_name"].setdefault(name, [0, 0])
                        entry[0] += count
                        entry[1] += ns
                else:
                    total[key] += value
        if ns_before is not None:
            record["calls_ns"] = record.get("calls_ns", 0) + call_ns() - ns_before
        inp = kwargs.get("input_ids", args[0] if args else None)
        n_in = int(inp.shape[-1]) if torch.is_tensor(inp) else 0
        new = [row[n_in:] for row in ids]
        record["calls"] += 1
        record["new_tokens"] += sum(len(r) for r in new)
        out_digest.update(json.dumps(new).encode())
        record["hash"] = out_digest.hexdigest()[:16]
        in_digest.update(json.dumps([row[:n_in] for row in ids]).encode())
        pv = kwargs.get("pixel_values")
        if torch.is_tensor(pv):
            in_digest.update(repr(float(pv.sum(dtype=torch.float64))).encode())
        record["inputs_hash"] = in_digest.hexdigest()[:16]
        return out

    cls.generate = generate


def shim_call_ns(lib):
    """A function returning the nanoseconds tidepool's shim has spent in
    alloc and free on device 0 so far, or None while it does not time its
    calls (time_calls=on in --tp-conf turns that on)."""
    def call_ns():
        shim = json.loads(lib.tp_torch_stats_json(0).decode()).get("shim") or {}
        return shim["alloc_ns"] + shim["free_ns"] if shim.get("timed") else None
    return call_ns


def weights_fingerprint(torch, models):
    """A hash of every parameter's float64 sum and first elements."""
    d = hashlib.sha256()
    with torch.no_grad():
        for m in models:
            for name, p in m.named_parameters():
                d.update(name.encode())
                d.update(repr(float(p.sum(dtype=torch.float64))).encode())
                d.update(repr(p.reshape(-1)[:8].float().tolist()).encode())
    return d.hexdigest()[:16] if models else None


WARM_KWARGS = dict(decode_growing_kv=dict(new_tokens=8), gemma3_mtmd=dict(requests=1),
                   qwen2vl_dynres=dict(requests=1))


def warm_page_cache(budget_s=60.0):
    """Reads the files of torch, transformers and the nvidia libraries once
    (no import, no CUDA), so that no run pays for reading them from disk."""
    t0 = time.perf_counter()
    total = 0
    roots = []
    for name in ("torch", "transformers", "nvidia", "triton"):
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            spec = None
        if spec and spec.submodule_search_locations:
            roots.extend(spec.submodule_search_locations)
    buf = bytearray(8 << 20)
    for root in roots:
        for dirpath, _, files in os.walk(root):
            for fn in files:
                if time.perf_counter() - t0 > budget_s:
                    return total, time.perf_counter() - t0
                try:
                    with open(os.path.join(dirpath, fn), "rb", buffering=0) as f:
                        while True:
                            n = f.readinto(buf)
                            if not n:
                                break
                            total += n
                except OSError:
                    pass
    return total, time.perf_counter() - t0


def warmup_worker(args):
    """Runs each workload once, tiny, with the default allocator: reads the
    kernel images and modules the workloads need into the page cache."""
    t0 = time.perf_counter()
    import torch
    spec = importlib.util.spec_from_file_location("tp_compare_workloads", args.workloads)
    workloads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workloads)
    torch.manual_seed(args.seed)
    for scen in args.scenario.split(","):
        workloads.SCEN[scen](torch, **WARM_KWARGS[scen])
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
    print(RESULT_TAG + json.dumps(dict(scenario=args.scenario, mode="warmup", process_s=round(time.perf_counter() - t0, 1))),
          flush=True)
    return 0


def pin_to(cpus_text):
    """This process (and the threads it starts later) on the CPUs of a
    comma list, e.g. "0,1,2,3" (--pin's share for the run)."""
    os.sched_setaffinity(0, {int(c) for c in cpus_text.split(",")})


def worker(args):
    if args.cpus:  # first, so that every thread torch and CUDA start inherits it
        pin_to(args.cpus)
    if args.mode == "warmup":
        return warmup_worker(args)
    kwargs = json.loads(args.kwargs)
    mode = args.mode
    t_start = time.perf_counter()
    import torch

    lib = None
    if mode.startswith("tp-"):
        import ctypes
        alloc = torch.cuda.memory.CUDAPluggableAllocator(args.lib, "tp_torch_alloc", "tp_torch_free")
        torch.cuda.memory.change_current_allocator(alloc)  # before any CUDA allocation
        lib = ctypes.CDLL(args.lib)  # the same handle: dlopen of a loaded path
        lib.tp_torch_stats_json.restype = ctypes.c_char_p
        lib.tp_torch_stats_json.argtypes = [ctypes.c_int]

    spec = importlib.util.spec_from_file_location("tp_compare_workloads", args.workloads)
    workloads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(workloads)
    import transformers

    if args.deterministic:
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    torch.cuda.init()
    torch.cuda.set_device(0)
    torch.cuda.synchronize()  # the context exists from here on
    torch.manual_seed(args.seed)  # CPU (model init) and CUDA generators
    sampler = MemSampler(torch, args.sample_ms / 1000.0)
    baseline = sampler.read()

    record = dict(calls=0, new_tokens=0, gen_s=0.0, hash=None, inputs_hash=None, step_s=[], step_calls=[])
    models = []
    install_generate_probe(torch, getattr(transformers, GENERATE_CLASS[args.scenario]), record, models,
                           step_times=args.step_times, call_ns=shim_call_ns(lib) if lib is not None else None,
                           gpu_timer=(lambda: GpuTimer(torch)) if args.gpu_time else None)

    sampler.start()
    t0 = time.perf_counter()
    error = None
    try:
        workloads.SCEN[args.scenario](torch, **kwargs)
        torch.cuda.synchronize()
    except Exception as e:  # an out-of-memory, a NULL from the allocator, ...
        error = "%s: %s" % (type(e).__name__, str(e)[:2000])
    wall = time.perf_counter() - t0
    sampler.stop()

    res = dict(scenario=args.scenario, mode=mode, kwargs=kwargs, error=error,
               wall_s=round(wall, 2), gen_s=round(record["gen_s"], 2),
               generate_calls=record["calls"], new_tokens=record["new_tokens"],
               tok_per_s=round(record["new_tokens"] / record["gen_s"], 1) if record["gen_s"] else None,
               output_hash=record["hash"], inputs_hash=record["inputs_hash"],
               step_ms=[round(t * 1000.0, 3) for t in record["step_s"]] if args.step_times else None,
               step_calls=record["step_calls"] if args.step_times else None,
               sampler=sampler.source, samples=sampler.samples, sample_ms=args.sample_ms,
               baseline_used_mib=round(baseline / MiB, 1),
               peak_used_mib=round((sampler.peak - baseline) / MiB, 1),
               timeline_mib=[(t, round((v - baseline) / MiB, 1)) for t, v in sampler.timeline],
               gpu_time=gpu_time_result(record.get("gpu")) if args.gpu_time else None,
               torch=torch.__version__, transformers=transformers.__version__,
               device=torch.cuda.get_device_name(0))
    if lib is None:
        st = torch.cuda.memory_stats()
        res.update(alloc_conf=os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
                   alloc_peak_reserved_mib=round(st.get("reserved_bytes.all.peak", 0) / MiB, 1),
                   alloc_peak_allocated_mib=round(st.get("allocated_bytes.all.peak", 0) / MiB, 1),
                   alloc_peak_requested_mib=round(st.get("requested_bytes.all.peak", 0) / MiB, 1),
                   alloc_end_reserved_mib=round(st.get("reserved_bytes.all.current", 0) / MiB, 1),
                   driver_allocs=st.get("num_device_alloc"), driver_frees=st.get("num_device_free"),
                   alloc_retries=st.get("num_alloc_retries"), ooms=st.get("num_ooms"))
    else:
        stats = json.loads(lib.tp_torch_stats_json(0).decode())
        pool = stats.get("pool") or {}
        res.update(tidepool_conf=os.environ.get("TIDEPOOL_TORCH_CONF", ""), tidepool_stats=stats)
        if record.get("calls_ns") is not None:  # time_calls=on: tidepool's own time inside generate()
            res.update(tp_calls_in_generate_ms=round(record["calls_ns"] / 1e6, 3))
        if pool:
            res.update(alloc_peak_reserved_mib=round(pool["reserved_bytes"]["peak"] / MiB, 1),
                       alloc_peak_allocated_mib=round(pool["allocated_bytes"]["peak"] / MiB, 1),
                       alloc_peak_requested_mib=round(pool["requested_bytes"]["peak"] / MiB, 1),
                       alloc_end_reserved_mib=round(pool["reserved_bytes"]["current"] / MiB, 1),
                       driver_allocs=pool["device_allocs"], driver_frees=pool["device_frees"],
                       alloc_retries=pool["oom_retries"], ooms=pool["ooms"])
    res["weights_hash"] = weights_fingerprint(torch, models)  # after every figure above
    res["process_s"] = round(time.perf_counter() - t_start, 1)
    print(RESULT_TAG + json.dumps(res), flush=True)
    sys.stderr.flush()
    # Skip the interpreter's and CUDA's teardown (seconds per run): every
    # figure is out. (The shim's exit report is skipped too; its stats are in
    # the result above.)
    os._exit(0 if error is None else 3)


GPU_TOP_NAMES = 40


def gpu_time_result(gpu):
    """--gpu-time's figures of a run, in seconds, from the probe's sums
    (None: no generate() call ran), with the GPU_TOP_NAMES activities that
    took the most time: [name, count, seconds] each, the longest first."""
    if not gpu:
        return None
    top = sorted(gpu.get("by_name", {}).items(), key=lambda item: (-item[1][1], item[0]))[:GPU_TOP_NAMES]
    return dict(kernel_s=gpu["kernel_ns"] / 1e9, copy_s=gpu["copy_ns"] / 1e9, busy_s=gpu["busy_ns"] / 1e9,
                kernels=gpu["kernels"], copies=gpu["copies"],
                top=[[name, count, ns / 1e9] for name, (count, ns) in top])


# --------------------------------------------------------------- the parent

def run_one(args, scenario, mode, kwargs, gpu=None, cpus=None):
    """One (workload, allocator) run in a fresh process; gpu: the one GPU it
    may see (CUDA_VISIBLE_DEVICES), None: as this process sees them; cpus:
    the CPUs it may run on (the worker pins itself: --cpus), None: this
    process's."""
    env = dict(os.environ)
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = str(gpu)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    env.pop("TIDEPOOL_TORCH_CONF", None)
    # PYTHONHASHSEED: set and dict iteration orders (and with them anything
    # that walks modules by name) are the same in every run.
    env.update(PYTHONUNBUFFERED="1", PYTHONHASHSEED="0", TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", HF_HUB_DISABLE_TELEMETRY="1")
    if args.deterministic:
        env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    if mode == "expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    elif mode == "async":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "backend:cudaMallocAsync"
    elif mode.startswith("tp-"):
        env["TIDEPOOL_TORCH_CONF"] = tidepool_torch_conf(mode, args.tp_conf)
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--scenario", scenario, "--mode", mode,
           "--kwargs", json.dumps(kwargs), "--workloads", args.workloads, "--lib", args.lib,
           "--seed", str(args.seed), "--sample-ms", str(args.sample_ms)]
    if args.deterministic:
        cmd.append("--deterministic")
    cmd.append("--step-times" if args.step_times else "--no-step-times")
    if args.gpu_time:
        cmd.append("--gpu-time")
    if cpus:  # the worker pins itself (no preexec_fn: runs start from several threads at once)
        cmd += ["--cpus", ",".join(str(c) for c in sorted(cpus))]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
        rc, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc = "timeout"
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
    res = None
    for line in out.splitlines():
        if line.startswith(RESULT_TAG):
            res = json.loads(line[len(RESULT_TAG):])
    if res is None:
        res = dict(scenario=scenario, mode=mode, kwargs=kwargs, error="no result (rc %s)" % rc)
    res["rc"] = rc
    res["elapsed_s"] = round(time.perf_counter() - t0, 1)
    if gpu is not None:
        res["gpu"] = gpu
    if cpus:
        res["cpus"] = sorted(cpus)
    if rc != 0:
        res["stderr_tail"] = err[-3000:]
    # tidepool's warnings (out-of-memory reports and the like) are worth keeping.
    tp_lines = [l for l in err.splitlines() if l.startswith("tidepool-torch")]
    if tp_lines:
        res["tidepool_log"] = tp_lines[-20:]
    return res


def round_gpus(mode_count, rnd, gpus):
    """Side by side over gpus GPUs: the GPU of each of mode_count modes in
    round rnd, mode i on GPU (i + rnd) mod gpus, so that over gpus rounds
    every mode runs on every GPU once (one GPU a little faster than another
    then favours no allocator); all different when there are enough."""
    return [(i + rnd) % gpus for i in range(mode_count)]


def round_cpus(cpus, mode_count, rnd):
    """Side by side with --pin: the CPUs of each of mode_count modes in round
    rnd, the sorted cpus cut into mode_count groups of equal size (the rest
    left out), mode i on group (i + rnd) mod mode_count."""
    cpus = sorted(cpus)
    size = len(cpus) // mode_count
    groups = [cpus[g * size:(g + 1) * size] for g in range(mode_count)]
    return [groups[(i + rnd) % mode_count] for i in range(mode_count)]


def write_out(path, t0, results):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(dict(total_s=round(time.perf_counter() - t0, 1), argv=sys.argv, results=results), f, indent=1)
    os.replace(tmp, path)


def fmt(v, spec="%.1f"):
    return "-" if v is None else (spec % v if isinstance(v, (int, float)) else str(v))


def print_table(results, baseline_mode):
    hdr = ["workload", "allocator", "peak used MiB", "alloc peak MiB", "alloc/used", "drv allocs",
           "wall s", "tok/s", "tokens", "same", "status"]
    rows = []
    by_scen = {}
    for r in results:
        by_scen.setdefault(r["scenario"], []).append(r)
    for scen, rs in by_scen.items():
        ref = next((r for r in rs if r["mode"] == baseline_mode and r.get("output_hash")), None)
        if ref is None:
            ref = next((r for r in rs if r.get("output_hash")), None)
        for r in rs:
            h = r.get("output_hash")
            same = "-" if h is None or ref is None else ("yes" if h == ref["output_hash"] else "NO")
            r["same_output"] = None if same == "-" else same == "yes"
            if same == "NO":  # where from: the model, the inputs, or the computation
                if r.get("weights_hash") != ref.get("weights_hash"):
                    same = "NO (weights)"
                elif r.get("inputs_hash") != ref.get("inputs_hash"):
                    same = "NO (inputs)"
            used, peak = r.get("peak_used_mib"), r.get("alloc_peak_reserved_mib")
            status = "ok" if r.get("rc") == 0 and not r.get("error") else (r.get("error") or "rc %s" % r.get("rc"))
            rows.append([scen, r["mode"], fmt(used), fmt(peak),
                         fmt(peak / used if used and peak else None, "%.3f"), fmt(r.get("driver_allocs"), "%d"),
                         fmt(r.get("wall_s")), fmt(r.get("tok_per_s")), fmt(r.get("new_tokens"), "%d"),
                         same, status[:60]])
    widths = [max(len(str(x)) for x in col) for col in zip(hdr, *rows)]
    line = lambda cells: "  ".join(str(c).ljust(w) for c, w in zip(cells, widths))
    print(line(hdr))
    print(line(["-" * w for w in widths]))
    for row in rows:
        print(line(row))


def run_counts(results):
    counts = {}
    for r in results:
        counts[(r["scenario"], r["mode"])] = counts.get((r["scenario"], r["mode"]), 0) + 1
    return counts


def median(values):
    v = sorted(values)
    if not v:
        return None
    mid = len(v) // 2
    return v[mid] if len(v) % 2 else (v[mid - 1] + v[mid]) / 2.0


def run_succeeded(r):
    """A run that ended well and timed its generate() calls."""
    return r.get("rc") == 0 and not r.get("error") and bool(r.get("gen_s"))


def side_by_side_rounds(results):
    """Side-by-side runs by (workload, round), each round's in mode order."""
    rounds = {}
    for r in results:
        if r.get("side_by_side"):
            rounds.setdefault((r["scenario"], r["round"]), []).append(r)
    return rounds


def summarize(results, baseline_mode):
    """Per workload and allocator, over its successful runs: the number of
    runs, the median, min and max of the seconds inside generate() and of the
    workload's wall time, and the median generate() time relative to the
    baseline mode's (1.02 = 2% slower)."""
    groups = {}
    for r in results:
        if run_succeeded(r):
            groups.setdefault((r["scenario"], r["mode"]), []).append(r)
    rows = []
    for (scen, mode), rs in groups.items():
        gen = [r["gen_s"] for r in rs]
        wall = [r["wall_s"] for r in rs if r.get("wall_s") is not None]
        steps_s, steps = step_median_sum(rs)
        # time_calls=on: the allocator's own calls inside generate(), a run's
        # milliseconds and their share of its generate() time
        timed = [r for r in rs if r.get("tp_calls_in_generate_ms") is not None]
        calls = [r["tp_calls_in_generate_ms"] for r in timed]
        shares = [r["tp_calls_in_generate_ms"] / 1000.0 / r["gen_s"] for r in timed]
        # --gpu-time: the GPU's own time inside generate()
        gpu = [r["gpu_time"] for r in rs if r.get("gpu_time")]
        kernel_s = [g["kernel_s"] for g in gpu]
        rows.append(dict(scenario=scen, mode=mode, runs=len(rs), gen_median_s=median(gen), gen_min_s=min(gen),
                         gen_max_s=max(gen), wall_median_s=median(wall), steps=steps, steps_s=steps_s,
                         calls_ms_median=median(calls), calls_share_median=median(shares),
                         calls_share_max=max(shares) if shares else None,
                         gpu_runs=len(gpu), gpu_kernel_median_s=median(kernel_s),
                         gpu_kernel_min_s=min(kernel_s) if gpu else None,
                         gpu_kernel_max_s=max(kernel_s) if gpu else None,
                         gpu_busy_median_s=median([g["busy_s"] for g in gpu]),
                         gpu_copy_median_s=median([g["copy_s"] for g in gpu]),
                         gpu_kernel_counts=sorted({g["kernels"] for g in gpu})))
    for row in rows:
        same_scen = [b for b in rows if b["scenario"] == row["scenario"]]
        base = next((b for b in same_scen if b["mode"] == baseline_mode), None)
        row["gen_vs_baseline"] = (row["gen_median_s"] / base["gen_median_s"]
                                  if base and base["gen_median_s"] else None)
        # Against the fastest PyTorch allocator by step sums: only among
        # allocators with as many runs and steps (a median over more rounds
        # is a different estimate).
        torch_sums = [b["steps_s"] for b in same_scen if not b["mode"].startswith("tp-") and b["steps_s"]
                      and b["runs"] == row["runs"] and b["steps"] == row["steps"]]
        row["steps_vs_fastest_torch"] = (row["steps_s"] / min(torch_sums)
                                         if row["steps_s"] and torch_sums else None)
        row["paired_vs_fastest_torch"], row["paired_rounds"] = paired_ratio(results, row["scenario"], row["mode"])
        # The GPU's time against the fastest PyTorch allocator's (medians),
        # and whether every allocator's runs of the workload ran as many
        # kernels (the same work).
        timed_gpu = [b for b in same_scen if b["gpu_runs"]]
        torch_timed = [b for b in timed_gpu if not b["mode"].startswith("tp-")]
        for key in ("kernel", "busy"):
            torch_gpu = [b["gpu_%s_median_s" % key] for b in torch_timed]
            row["gpu_%s_vs_fastest_torch" % key] = (row["gpu_%s_median_s" % key] / min(torch_gpu)
                                                    if row["gpu_runs"] and torch_gpu and min(torch_gpu) > 0
                                                    else None)
        row["gpu_same_kernels"] = (len({n for b in timed_gpu for n in b["gpu_kernel_counts"]}) == 1
                                   if row["gpu_runs"] else None)
        fastest = min(torch_timed, key=lambda b: b["gpu_kernel_median_s"]) if torch_timed else None
        row["gpu_fastest_torch_mode"] = fastest["mode"] if fastest and row["gpu_runs"] else None
    return rows


def gpu_name_medians(runs):
    """--gpu-time: per activity name among the runs' longest (top), its
    seconds' median over the runs that list it."""
    seconds = {}
    for r in runs:
        for name, _, secs in (r.get("gpu_time") or {}).get("top", []):
            seconds.setdefault(name, []).append(secs)
    return {name: median(v) for name, v in seconds.items()}


def gpu_name_excess(results, scenario, mode, reference_mode, count=5):
    """--gpu-time: the activities whose time (median over the runs) mode's
    runs of scenario exceed reference_mode's by the most, as (name, mode's
    seconds, reference's seconds), the largest excess first; only names
    both list among their longest."""
    def runs_of(m):
        return [r for r in results if r["scenario"] == scenario and r["mode"] == m and run_succeeded(r)]
    own, ref = gpu_name_medians(runs_of(mode)), gpu_name_medians(runs_of(reference_mode))
    both = [(name, own[name], ref[name]) for name in own if name in ref]
    both.sort(key=lambda item: (item[2] - item[1], item[0]))
    return both[:count]


def paired_ratio(results, scenario, mode):
    """Side by side: in each round where every allocator's run
    succeeded, mode's generate() seconds over the fastest PyTorch
    allocator's in that round (runs of one round ran at the same moment on
    the same host, so a spell of the host slows them alike); the median of
    those ratios and the number of rounds. (None, 0) for runs made one after
    the other."""
    ratios = []
    for (scen, _), runs in side_by_side_rounds(results).items():
        if scen != scenario or not all(run_succeeded(r) for r in runs):
            continue
        own = [r["gen_s"] for r in runs if r["mode"] == mode]
        torch_gen = [r["gen_s"] for r in runs if not r["mode"].startswith("tp-")]
        if len(own) == 1 and torch_gen:
            ratios.append(own[0] / min(torch_gen))
    return median(ratios), len(ratios)


def control_ratios(results):
    """Side by side, a mode given twice in a round (the control): per
    (workload, mode), the ratios of its second run's generate() seconds to
    its first's in each round where both succeeded -- how far two identical
    runs at the same moment differ."""
    ratios = {}
    for (scen, _), runs in sorted(side_by_side_rounds(results).items()):
        for mode in dict.fromkeys(r["mode"] for r in runs):
            twins = [r for r in runs if r["mode"] == mode]
            if len(twins) == 2 and all(run_succeeded(r) for r in twins):
                ratios.setdefault((scen, mode), []).append(twins[1]["gen_s"] / twins[0]["gen_s"])
    return ratios


def step_median_sum(runs):
    """The seconds of every generated step, each step's median over the
    runs, summed over the steps, and the number of steps; (None, None)
    unless every run timed its steps and step i did the same work in each:
    the runs' generate() calls made as many steps each (step_calls; the
    shapes a dense model computes on then match, whichever tokens it
    picked), or, without those counts, the runs generated the same
    tokens. (On the H200, runs of 256 decode tokens picked different
    tokens from run to run with every allocator, PyTorch's default too;
    runs of 64 did not.)"""
    lists = [r.get("step_ms") for r in runs]
    if not lists or any(not l for l in lists) or len({len(l) for l in lists}) != 1:
        return None, None
    calls = [r.get("step_calls") for r in runs]
    if all(calls):
        if len({tuple(c) for c in calls}) != 1:
            return None, None
    elif len({r.get("output_hash") for r in runs}) != 1:
        return None, None
    total_ms = sum(median(column) for column in zip(*lists))
    return total_ms / 1000.0, len(lists[0])


def print_summary(results, baseline_mode):
    print("medians over rounds (generate() seconds, min-max; wall seconds; generate() median / %s's;"
          % baseline_mode)
    print("steps: each generated step's median over the rounds, summed, and / the fastest PyTorch allocator's):")
    for row in summarize(results, baseline_mode):
        steps = ("  steps %s s (%d) / fastest torch %s" % (fmt(row["steps_s"], "%.2f"), row["steps"],
                                                          fmt(row["steps_vs_fastest_torch"], "%.3f"))
                 if row["steps_s"] else "")
        paired = ("  side by side / fastest torch %s (median of %d rounds)" % (
            fmt(row["paired_vs_fastest_torch"], "%.3f"), row["paired_rounds"]) if row["paired_rounds"] else "")
        print("  %-18s %-11s runs %d  generate %s s (%s-%s)  wall %s s  ratio %s%s%s" % (
            row["scenario"], row["mode"], row["runs"], fmt(row["gen_median_s"]), fmt(row["gen_min_s"]),
            fmt(row["gen_max_s"]), fmt(row["wall_median_s"]), fmt(row["gen_vs_baseline"], "%.3f"), steps, paired))
        if row["calls_ms_median"] is not None:
            print("  %-18s %-11s its allocs and frees inside generate(): %s ms a run (median), %s%% of generate() "
                  "(median; at most %s%%)" % (row["scenario"], row["mode"], fmt(row["calls_ms_median"], "%.1f"),
                                              fmt(100.0 * row["calls_share_median"], "%.3f"),
                                              fmt(100.0 * row["calls_share_max"], "%.3f")))
        if row["gpu_runs"]:
            print("  %-18s %-11s GPU inside generate(): kernels %s s (%s-%s; %s kernels%s), busy %s s, copies %s s; "
                  "kernels / fastest torch %s, busy / fastest torch %s" % (
                      row["scenario"], row["mode"], fmt(row["gpu_kernel_median_s"], "%.3f"),
                      fmt(row["gpu_kernel_min_s"], "%.3f"), fmt(row["gpu_kernel_max_s"], "%.3f"),
                      "/".join(str(n) for n in row["gpu_kernel_counts"]),
                      "" if row["gpu_same_kernels"] else ", NOT the same count in every run",
                      fmt(row["gpu_busy_median_s"], "%.3f"), fmt(row["gpu_copy_median_s"], "%.3f"),
                      fmt(row["gpu_kernel_vs_fastest_torch"], "%.4f"), fmt(row["gpu_busy_vs_fastest_torch"], "%.4f")))
            reference = row["gpu_fastest_torch_mode"]
            if row["mode"].startswith("tp-") and reference:
                for name, own_s, ref_s in gpu_name_excess(results, row["scenario"], row["mode"], reference, 5):
                    print("  %-18s %-11s   %+8.3f ms (%.3f against %s's %.3f ms): %s" % (
                        row["scenario"], row["mode"], (own_s - ref_s) * 1e3, own_s * 1e3, reference, ref_s * 1e3,
                        name[:100]))
    for (scen, mode), ratios in control_ratios(results).items():
        print("  %-18s %-11s control: its second run / its first in the same round, median %s (%s-%s) over %d "
              "rounds" % (scen, mode, fmt(median(ratios), "%.3f"), fmt(min(ratios), "%.3f"), fmt(max(ratios), "%.3f"),
                          len(ratios)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--workloads", help="path to record_pytorch_traces.py")
    ap.add_argument("--lib", default=os.path.join(REPO, "build-torch", "libtidepool_torch.so"),
                    help="libtidepool_torch.so (default: build-torch/ of this repo)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma list of " + ",".join(MODES))
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma list of " + ",".join(SCENARIOS))
    ap.add_argument("--decode-tokens", type=int, default=256,
                    help="decode_growing_kv new tokens (default 256; the trace was recorded with 2000)")
    ap.add_argument("--requests", type=int, default=8,
                    help="requests of the two vision workloads (default 8; the traces were recorded with 16)")
    ap.add_argument("--full", action="store_true",
                    help="the recorded parameters: --decode-tokens 2000 --requests 16 (about 17 minutes for "
                         "everything: split it with --scenarios/--modes to stay under 10 minutes a call)")
    ap.add_argument("--quick", action="store_true", help="--decode-tokens 64 --requests 3 (a smoke test)")
    ap.add_argument("--tp-conf", default="", help="extra TIDEPOOL_TORCH_CONF items for the tidepool runs")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sample-ms", type=float, default=5.0, help="memory sampling period (ms)")
    ap.add_argument("--warmup", choices=["read", "run", "none"], default="read",
                    help="before the runs: read torch's, transformers' and the nvidia libraries' files into the "
                         "page cache (read, a few seconds), or run every workload once, short and untimed (run, "
                         "about 45 s), or nothing")
    ap.add_argument("--deterministic", action="store_true",
                    help="torch.use_deterministic_algorithms(True) and CUBLAS_WORKSPACE_CONFIG=:4096:8 in every run")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per run (default 150; 420 with --full)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run the --modes list this many times, interleaved, and print medians (for wall time)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="run each round's --modes at once (one process each) instead of one after the other, and "
                         "give each allocator's median ratio to the fastest PyTorch allocator of the same round")
    ap.add_argument("--gpus", type=int, default=1,
                    help="with --side-by-side: spread each round's runs over this many GPUs, one each "
                         "(CUDA_VISIBLE_DEVICES), rotating from round to round (default 1: all on the one visible)")
    ap.add_argument("--pin", action="store_true",
                    help="with --side-by-side: each run on its own share of the CPUs this process may use "
                         "(sched_setaffinity), the shares rotating from round to round")
    ap.add_argument("--step-times", action=argparse.BooleanOptionalAction, default=True,
                    help="time every generated step with a streamer, for the per-step medians over rounds "
                         "(default: on)")
    ap.add_argument("--gpu-time", action="store_true",
                    help="profile every generate() call (CUDA activity only) and report the GPU's own time in it: "
                         "kernels, copies, busy (see above); generate() seconds then include the profiler's cost")
    ap.add_argument("--out", help="write the results as JSON here")
    # internal: one run
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--scenario", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--kwargs", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--cpus", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)

    if not args.workloads:
        ap.error("--workloads PATH is required: record_pytorch_traces.py, the script that recorded "
                 "the real traces (docs/traces.md)")
    if not os.path.exists(args.workloads):
        ap.error("--workloads %s: no such file" % args.workloads)
    args.workloads = os.path.abspath(args.workloads)
    args.lib = os.path.abspath(args.lib)
    if args.full:
        args.decode_tokens, args.requests = 2000, 16
    if args.quick:
        args.decode_tokens, args.requests = 64, 3
    if args.timeout is None:
        args.timeout = 420 if args.full else 150
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    modes = [m for m in args.modes.split(",") if m]
    if args.gpus < 1:
        ap.error("--gpus must be at least 1")
    if args.gpus > 1 and not args.side_by_side:
        ap.error("--gpus %d spreads side-by-side runs: it needs --side-by-side" % args.gpus)
    if args.gpu_time and args.side_by_side and args.gpus < len(modes):
        ap.error("--gpu-time with --side-by-side needs a GPU a run (--gpus %d or more): runs sharing a GPU slow "
                 "each other's kernels" % len(modes))
    if args.pin and not args.side_by_side:
        ap.error("--pin gives side-by-side runs CPUs of their own: it needs --side-by-side")
    if args.pin and not hasattr(os, "sched_setaffinity"):
        ap.error("--pin needs sched_setaffinity, which this system's Python has not")
    if args.pin and len(os.sched_getaffinity(0)) < len(modes):
        ap.error("--pin: %d CPUs cannot give %d runs one each" % (len(os.sched_getaffinity(0)), len(modes)))
    scens = [s for s in args.scenarios.split(",") if s]
    for m in modes:
        if m not in MODES and tp_conf_of(m) is None:
            ap.error("unknown mode %s (a tidepool mode with settings of its own reads tp-vmm:NAME=VALUE+NAME=VALUE)"
                     % m)
        if tp_conf_of(m) is not None:  # the shim refuses a key given twice
            keys = [item.partition("=")[0] for item in tidepool_torch_conf(m, args.tp_conf).split(",")]
            twice = sorted({k for k in keys if keys.count(k) > 1})
            if twice:
                ap.error("mode %s: %s given twice (the mode's own settings, compare.py's kind= and log=, and --tp-conf "
                         "must not repeat a key)" % (m, ", ".join(twice)))
    for s in scens:
        if s not in SCENARIOS:
            ap.error("unknown scenario %s" % s)
    if any(m.startswith("tp-") for m in modes) and not os.path.exists(args.lib):
        ap.error("%s not found (build it: cmake -B build-torch -G Ninja && cmake --build build-torch)" % args.lib)
    kwargs = dict(decode_growing_kv=dict(new_tokens=args.decode_tokens),
                  gemma3_mtmd=dict(requests=args.requests),
                  qwen2vl_dynres=dict(requests=args.requests))

    results = []
    t0 = time.perf_counter()
    if args.warmup == "run":
        w = run_one(args, ",".join(scens), "warmup", {})
        print("[%6.0fs] warm-up (every workload, short, default allocator) rc=%s %.0fs" % (
            time.perf_counter() - t0, w.get("rc"), w.get("elapsed_s", 0)), flush=True)
    elif args.warmup == "read":
        nbytes, secs = warm_page_cache()
        print("[%6.0fs] warm-up: read %.1f GiB of torch/transformers/nvidia files in %.0fs" % (
            time.perf_counter() - t0, nbytes / (1 << 30), secs), flush=True)
    for scen in scens:
        for rnd in range(args.rounds):  # rounds interleave: A B A B, so drift hits every mode alike
            if args.side_by_side:
                gpus = round_gpus(len(modes), rnd, args.gpus) if args.gpus > 1 else [None] * len(modes)
                cpus = (round_cpus(os.sched_getaffinity(0), len(modes), rnd) if args.pin
                        else [None] * len(modes))
                with concurrent.futures.ThreadPoolExecutor(len(modes)) as pool:
                    futures = [pool.submit(run_one, args, scen, mode, kwargs[scen], gpu, cpu_set)
                               for mode, gpu, cpu_set in zip(modes, gpus, cpus)]
                    batch = [f.result() for f in futures]
                if args.gpus < len(modes):
                    # Runs sharing a GPU: its memory in use is theirs together,
                    # not one allocator's (kept apart, out of the table).
                    for r in batch:
                        r["peak_used_shared_gpu_mib"] = r.pop("peak_used_mib", None)
            else:
                batch = None
            for i, mode in enumerate(modes):
                r = batch[i] if batch else run_one(args, scen, mode, kwargs[scen])
                r.update(round=rnd, side_by_side=batch is not None)
                results.append(r)
                print("[%6.0fs] %-18s %-11s rc=%s %5.0fs  used %s MiB  alloc peak %s MiB  %s tok/s  %s%s" % (
                    time.perf_counter() - t0, scen, mode, r.get("rc"), r.get("elapsed_s", 0),
                    fmt(r.get("peak_used_mib")), fmt(r.get("alloc_peak_reserved_mib")), fmt(r.get("tok_per_s")),
                    "gpu %d  " % r["gpu"] if "gpu" in r else "", r.get("error") or ""), flush=True)
                if r.get("rc") != 0 and r.get("stderr_tail"):
                    print("    " + r["stderr_tail"][-1200:].replace("\n", "\n    "), flush=True)
                if args.out:  # after every run, so that an interrupted comparison keeps what it has
                    write_out(args.out, t0, results)
    print()
    print_table(results, modes[0])
    if any(n > 1 for n in run_counts(results).values()) or any(
            r.get("tp_calls_in_generate_ms") is not None or r.get("gpu_time") for r in results):
        print()
        print_summary(results, modes[0])
    print("\npeak used = device memory in use (%s) at its peak minus before the model was built; "
          "alloc peak = the allocator's peak reserved bytes; same = generated ids hash like the %s run"
          % (next((r.get("sampler") for r in results if r.get("sampler")), "?"), modes[0]))
    if args.out:
        write_out(args.out, t0, results)
        print("wrote", args.out)
    return 0 if all(r.get("rc") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
