#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test_compare_summary.py -- compare.py's medians and step sums over rounds,
without torch or a GPU: summarize() and step_median_sum() on made-up runs,
the generate() probe, its step clock and its reading of the shim's call
times on a stand-in model, side by side runs (--side-by-side, --gpus, --pin: the GPUs' and CPUs'
rotation, the GPU and CPUs each run gets, the paired ratio), the GPU's own
time (--gpu-time: the activities summed, the probe's timer, the medians
and ratios, the kernels by name), tidepool modes with settings of their
own, and the options' checks."""
import contextlib
import io
import json
import os
import subprocess
import sys

from script_checks import HERE, Checks, load_script

compare = load_script("compare.py")
check = Checks("test_compare_summary")


def run(mode, gen_s, wall_s, rc=0, scenario="decode_growing_kv"):
    return dict(scenario=scenario, mode=mode, rc=rc, error=None, gen_s=gen_s, wall_s=wall_s)


check(compare.median([3, 1, 2]) == 2 and compare.median([4, 1, 3, 2]) == 2.5 and compare.median([]) is None,
      "median")
results = [run("default", 10.0, 12.0), run("tp-vmm", 10.4, 12.5), run("default", 11.0, 13.0),
           run("tp-vmm", 10.2, 12.1), run("default", 30.0, 31.0), run("tp-vmm", 99.0, 100.0, rc=1),
           run("default", 5.0, 6.0, scenario="gemma3_mtmd")]
rows = {(r["scenario"], r["mode"]): r for r in compare.summarize(results, "default")}
d, t = rows[("decode_growing_kv", "default")], rows[("decode_growing_kv", "tp-vmm")]
check(d["runs"] == 3 and d["gen_median_s"] == 11.0 and d["gen_min_s"] == 10.0 and d["gen_max_s"] == 30.0,
      "default's three runs: %s" % d)
check(t["runs"] == 2 and abs(t["gen_median_s"] - 10.3) < 1e-9, "the failed run is left out: %s" % t)
check(abs(t["gen_vs_baseline"] - 10.3 / 11.0) < 1e-9 and d["gen_vs_baseline"] == 1.0, "ratios: %s %s" % (d, t))
check(rows[("gemma3_mtmd", "default")]["runs"] == 1, "workloads kept apart")
check(compare.run_counts(results)[("decode_growing_kv", "default")] == 3, "run_counts")

# Per-step medians over rounds, summed: a slow spell in one run's steps drops out.
def timed(mode, steps_ms, gen_s=1.0, output_hash="h", scenario="decode_growing_kv"):
    r = run(mode, gen_s, gen_s + 1.0, scenario=scenario)
    r.update(step_ms=steps_ms, output_hash=output_hash)
    return r


total, steps = compare.step_median_sum([timed("default", [10, 20, 30]), timed("default", [11, 90, 30]),
                                        timed("default", [99, 21, 31])])
check(steps == 3 and abs(total - (11 + 21 + 30) / 1000.0) < 1e-12, "step medians summed: %s %s" % (total, steps))
check(compare.step_median_sum([timed("default", [10, 20]), timed("default", [10, 20, 30])]) == (None, None),
      "runs of different lengths are not compared step by step")
check(compare.step_median_sum([timed("default", [10, 20]), timed("default", [10, 20], output_hash="x")])
      == (None, None), "without per-call step counts, runs that generated different tokens are left out")
a, b = timed("default", [10, 20, 30], output_hash="x"), timed("default", [12, 22, 32], output_hash="y")
a["step_calls"], b["step_calls"] = [2, 1], [2, 1]
check(compare.step_median_sum([a, b]) == (0.063, 3), "the same steps per call, other tokens: compared")
b["step_calls"] = [1, 2]
check(compare.step_median_sum([a, b]) == (None, None), "steps split otherwise between the calls: left out")
check(compare.step_median_sum([timed("default", [10, 20]), run("default", 1.0, 2.0)]) == (None, None),
      "a run without step times leaves the sum out")
stepped = [timed("default", [10, 10]), timed("default", [10, 12]), timed("default", [40, 10]),
           timed("async", [9, 9]), timed("async", [9, 50]), timed("async", [30, 9]),
           timed("tp-vmm", [9, 10]), timed("tp-vmm", [9, 10]), timed("tp-vmm", [60, 60]),
           timed("expandable", [1, 1])]  # one run only: not held against the three-run allocators
rows = {r["mode"]: r for r in compare.summarize(stepped, "default")}
check(abs(rows["async"]["steps_s"] - 0.018) < 1e-12 and abs(rows["tp-vmm"]["steps_s"] - 0.019) < 1e-12,
      "step sums: %s %s" % (rows["async"], rows["tp-vmm"]))
check(abs(rows["tp-vmm"]["steps_vs_fastest_torch"] - 19.0 / 18.0) < 1e-12
      and abs(rows["default"]["steps_vs_fastest_torch"] - 20.0 / 18.0) < 1e-12,
      "against the fastest PyTorch allocator with as many runs: %s" % rows["tp-vmm"])
check(rows["expandable"]["steps_vs_fastest_torch"] == 1.0, "a one-run allocator against itself only")

# The step clock: the prompt's put starts it, every later put is a step.
clock_steps = []
clock = compare.StepClock(clock_steps)
clock.put(None)
clock.put(None)
clock.put(None)
clock.end()
check(len(clock_steps) == 2 and all(t >= 0 for t in clock_steps), "StepClock: %s" % clock_steps)

# The probe around generate(): a call without a streamer gets a StepClock,
# and one that brings its own keeps it. (A stand-in for torch and a model.)
class FakeTensor(list):
    @property
    def shape(self):
        return (len(self), len(self[0]))

    def tolist(self):
        return [list(row) for row in self]


class FakeTorch:
    @staticmethod
    def is_tensor(x):
        return isinstance(x, FakeTensor)


class FakeModel:
    def generate(self, input_ids=None, streamer=None, new=3):
        if streamer is not None:
            streamer.put(input_ids)
            for _ in range(new):
                streamer.put(None)
            streamer.end()
        return FakeTensor([list(input_ids[0]) + [7] * new])


record = dict(calls=0, new_tokens=0, gen_s=0.0, hash=None, inputs_hash=None, step_s=[], step_calls=[])
compare.install_generate_probe(FakeTorch, FakeModel, record, [], step_times=True)
FakeModel().generate(input_ids=FakeTensor([[1, 2]]), new=3)
FakeModel().generate(input_ids=FakeTensor([[1, 2]]), new=2)
check(record["calls"] == 2 and record["new_tokens"] == 5 and len(record["step_s"]) == 5
      and record["step_calls"] == [3, 2], "probe with step times: %s" % record)
own = compare.StepClock([])
FakeModel().generate(input_ids=FakeTensor([[1]]), streamer=own, new=4)
check(len(own.steps) == 4 and len(record["step_s"]) == 5, "a caller's own streamer is kept")

# time_calls=on: the allocator's own time inside generate(). The probe reads
# the shim's running total before and after each call (a stand-in that moves
# 5 ns a read, and 1000 more during each call), and summarize() gives the
# median milliseconds and share of generate() over the runs.
ticks = [0]


def fake_call_ns():
    ticks[0] += 5
    return ticks[0]


class CountingModel(FakeModel):
    def generate(self, input_ids=None, streamer=None, new=3):
        ticks[0] += 1000
        return FakeModel.generate(self, input_ids=input_ids, streamer=streamer, new=new)


record = dict(calls=0, new_tokens=0, gen_s=0.0, hash=None, inputs_hash=None, step_s=[], step_calls=[])
compare.install_generate_probe(FakeTorch, CountingModel, record, [], step_times=False, call_ns=fake_call_ns)
CountingModel().generate(input_ids=FakeTensor([[1, 2]]), new=1)
CountingModel().generate(input_ids=FakeTensor([[1, 2]]), new=1)
check(record["calls_ns"] == 2 * 1005, "calls_ns adds what each call moved the total: %s" % record.get("calls_ns"))
record = dict(calls=0, new_tokens=0, gen_s=0.0, hash=None, inputs_hash=None, step_s=[], step_calls=[])
compare.install_generate_probe(FakeTorch, CountingModel, record, [], step_times=False, call_ns=lambda: None)
CountingModel().generate(input_ids=FakeTensor([[1, 2]]), new=1)
check("calls_ns" not in record, "an untimed shim leaves no calls_ns: %s" % record)
timed_runs = [run("tp-vmm", 10.0, 11.0), run("tp-vmm", 20.0, 21.0), run("tp-vmm", 8.0, 9.0), run("default", 9.0, 10.0)]
for r, ms in zip(timed_runs, [30.0, 10.0, 8.0]):
    r["tp_calls_in_generate_ms"] = ms
rows = {r["mode"]: r for r in compare.summarize(timed_runs, "default")}
t = rows["tp-vmm"]
check(t["calls_ms_median"] == 10.0 and abs(t["calls_share_median"] - 0.001) < 1e-12
      and abs(t["calls_share_max"] - 0.003) < 1e-12, "calls figures: %s" % t)
check(rows["default"]["calls_ms_median"] is None and rows["default"]["calls_share_max"] is None,
      "no calls figures without the timing: %s" % rows["default"])

# --gpu-time: the GPU's own time from the profiler's activities. Kernels and
# copies summed apart; busy time counts overlaps once (two kernels on two
# streams at once) and the gaps not at all.
events = [("gemm", 100, 50), ("Memcpy HtoD (Pageable -> Device)", 120, 10), ("softmax", 200, 20),
          ("Memset (Device)", 300, 5), ("norm", 210, 30)]
g = compare.gpu_time_summary(events)
check(g == dict(kernel_ns=100, copy_ns=15, busy_ns=50 + 40 + 5, kernels=3, copies=2,
               by_name={"gemm": [1, 50], "Memcpy HtoD (Pageable -> Device)": [1, 10], "softmax": [1, 20],
                        "Memset (Device)": [1, 5], "norm": [1, 30]}), "gpu_time_summary: %s" % g)
check(compare.gpu_time_summary([("k", 0, 3), ("k", 5, 4)])["by_name"] == {"k": [2, 7]}, "a name's count and time")
check(compare.gpu_time_summary([]) == dict(kernel_ns=0, copy_ns=0, busy_ns=0, kernels=0, copies=0, by_name={}),
      "no activity: zeros")
check(compare.gpu_time_summary([("a", 0, 100), ("b", 10, 20), ("c", 40, 10)])["busy_ns"] == 100,
      "activities inside another count once")

# The probe enters the timer before the call and leaves it only once the
# ids are on the host (the profiler keeps what the GPU did up to there);
# every call's figures add up; a call that raises still stops the profiler.
order = []


class FakeTimer:
    def __enter__(self):
        order.append("enter")
        return self

    def __exit__(self, *exc):
        order.append("exit")
        return False

    def events(self):
        return [("k", 0, 7), ("Memcpy DtoH", 10, 2)]


class OrderedTensor(FakeTensor):
    def tolist(self):
        order.append("ids")
        return FakeTensor.tolist(self)


class OrderedModel(FakeModel):
    def generate(self, input_ids=None, streamer=None, new=3, fail=False):
        order.append("call")
        if fail:
            raise RuntimeError("out of memory")
        return OrderedTensor(FakeModel.generate(self, input_ids=input_ids, streamer=streamer, new=new))


record = dict(calls=0, new_tokens=0, gen_s=0.0, hash=None, inputs_hash=None, step_s=[], step_calls=[])
compare.install_generate_probe(FakeTorch, OrderedModel, record, [], gpu_timer=FakeTimer)
OrderedModel().generate(input_ids=FakeTensor([[1, 2]]), new=1)
OrderedModel().generate(input_ids=FakeTensor([[1, 2]]), new=2)
check(order == ["enter", "call", "ids", "exit"] * 2, "timer around the call and the ids' copy: %s" % order)
check(record["gpu"] == dict(kernel_ns=14, copy_ns=4, busy_ns=18, kernels=2, copies=2,
                            by_name={"k": [2, 14], "Memcpy DtoH": [2, 4]}),
      "two calls' GPU time added, per name too: %s" % record.get("gpu"))
order.clear()
try:
    OrderedModel().generate(input_ids=FakeTensor([[1]]), fail=True)
except RuntimeError:
    pass
check(order == ["enter", "call", "exit"], "a call that raises leaves the profiler: %s" % order)
record = dict(calls=0, new_tokens=0, gen_s=0.0, hash=None, inputs_hash=None, step_s=[], step_calls=[])
compare.install_generate_probe(FakeTorch, FakeModel, record, [])
FakeModel().generate(input_ids=FakeTensor([[1, 2]]), new=1)
check("gpu" not in record, "no timer, no GPU figures: %s" % record)
check(compare.gpu_time_result(None) is None and compare.gpu_time_result(
    dict(kernel_ns=2e9, copy_ns=1e6, busy_ns=2.5e9, kernels=9, copies=1,
         by_name={"b": [3, 1e9], "a": [6, 1e9], "Memcpy": [1, 1e6]})) == dict(
        kernel_s=2.0, copy_s=0.001, busy_s=2.5, kernels=9, copies=1,
        top=[["a", 6, 1.0], ["b", 3, 1.0], ["Memcpy", 1, 0.001]]),
      "gpu_time_result in seconds, the longest activities first (ties by name)")
many = {"k%03d" % i: [1, i] for i in range(100)}
top = compare.gpu_time_result(dict(kernel_ns=1, copy_ns=0, busy_ns=1, kernels=100, copies=0, by_name=many))["top"]
check(len(top) == compare.GPU_TOP_NAMES and top[0][0] == "k099" and top[-1][0] == "k%03d" % (100 - compare.GPU_TOP_NAMES),
      "only the longest %d kept" % compare.GPU_TOP_NAMES)


# GpuTimer reads the profiler's raw events and keeps the GPU's only (a
# stand-in for torch's profiler: the CPU-side launch is left out).
class FakeKinetoEvent:
    def __init__(self, name, device, start_ns, duration_ns):
        self._v = (name, device, start_ns, duration_ns)

    def name(self):
        return self._v[0]

    def device_type(self):
        return self._v[1]

    def start_ns(self):
        return self._v[2]

    def duration_ns(self):
        return self._v[3]


class FakeProfile:
    def __init__(self, activities):
        self.activities = activities
        self.profiler = self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kineto_results = self
        return False

    def events(self):
        return [FakeKinetoEvent("cudaLaunchKernel", "CPU", 5, 3), FakeKinetoEvent("gemm", "CUDA", 9, 40)]


class ProfilingTorch:
    class profiler:
        profile = FakeProfile

        class ProfilerActivity:
            CUDA = "cuda-activity"

    class autograd:
        class DeviceType:
            CUDA = "CUDA"


with compare.GpuTimer(ProfilingTorch) as timer:
    pass
check(timer.prof.activities == ["cuda-activity"] and timer.events() == [("gemm", 9, 40)],
      "GpuTimer: CUDA activity only, the GPU's events: %s" % timer.events())


def gpu_run(mode, kernel_s, kernels=100, busy_s=None, scenario="qwen2vl_dynres"):
    r = run(mode, 10.0, 11.0, scenario=scenario)
    r["gpu_time"] = dict(kernel_s=kernel_s, copy_s=0.01, busy_s=busy_s or kernel_s + 0.01, kernels=kernels,
                         copies=3)
    return r


gpu_runs = [gpu_run("default", 5.0), gpu_run("async", 4.9), gpu_run("tp-vmm", 4.95),
            gpu_run("default", 5.2), gpu_run("async", 5.0), gpu_run("tp-vmm", 5.05),
            gpu_run("default", 5.1), gpu_run("async", 4.8), gpu_run("tp-vmm", 9.0),
            gpu_run("default", 3.0, scenario="gemma3_mtmd")]
rows = {(r["scenario"], r["mode"]): r for r in compare.summarize(gpu_runs, "default")}
t = rows[("qwen2vl_dynres", "tp-vmm")]
check(t["gpu_runs"] == 3 and t["gpu_kernel_median_s"] == 5.05 and t["gpu_kernel_min_s"] == 4.95
      and t["gpu_kernel_max_s"] == 9.0 and abs(t["gpu_busy_median_s"] - 5.06) < 1e-12, "GPU medians: %s" % t)
check(abs(t["gpu_kernel_vs_fastest_torch"] - 5.05 / 4.9) < 1e-12
      and abs(t["gpu_busy_vs_fastest_torch"] - 5.06 / 4.91) < 1e-12,
      "against the fastest PyTorch allocator's median (async's): %s" % t)
check(t["gpu_same_kernels"] is True and rows[("gemma3_mtmd", "default")]["gpu_kernel_vs_fastest_torch"] == 1.0,
      "same kernel counts; workloads kept apart")
check(rows[("qwen2vl_dynres", "default")]["gpu_kernel_counts"] == [100], "kernel counts")
check(t["gpu_fastest_torch_mode"] == "async" and rows[("qwen2vl_dynres", "default")]["gpu_fastest_torch_mode"] == "async",
      "the fastest PyTorch allocator by GPU kernel time: %s" % t["gpu_fastest_torch_mode"])

# Per kernel name: tidepool's runs against the fastest PyTorch allocator's,
# the largest excess first, names only one side lists left out.
def named(mode, top):
    r = run(mode, 10.0, 11.0, scenario="decode_growing_kv")
    r["gpu_time"] = dict(kernel_s=1.0, copy_s=0.0, busy_s=1.0, kernels=3, copies=0, top=top)
    return r


named_runs = [named("tp-vmm", [["gemv", 10, 0.50], ["norm", 10, 0.20], ["cat", 5, 0.10], ["only_tp", 1, 0.3]]),
              named("tp-vmm", [["gemv", 10, 0.52], ["norm", 10, 0.21], ["cat", 5, 0.10]]),
              named("tp-vmm", [["gemv", 10, 0.90], ["norm", 10, 0.22], ["cat", 5, 0.10]]),
              named("default", [["gemv", 10, 0.50], ["norm", 10, 0.20], ["cat", 5, 0.12], ["only_torch", 1, 0.1]]),
              named("default", [["gemv", 10, 0.50], ["norm", 10, 0.20], ["cat", 5, 0.12]])]
check(compare.gpu_name_medians(named_runs[:3]) == {"gemv": 0.52, "norm": 0.21, "cat": 0.10, "only_tp": 0.3},
      "per-name medians: %s" % compare.gpu_name_medians(named_runs[:3]))
excess = compare.gpu_name_excess(named_runs, "decode_growing_kv", "tp-vmm", "default", 2)
check([e[0] for e in excess] == ["gemv", "norm"] and abs(excess[0][1] - 0.52) < 1e-12 and excess[0][2] == 0.5,
      "the largest excesses first: %s" % excess)
check([e[0] for e in compare.gpu_name_excess(named_runs, "decode_growing_kv", "tp-vmm", "default", 9)]
      == ["gemv", "norm", "cat"], "every name both list, a shortfall last")
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    compare.print_summary(named_runs, "default")
lines = printed.getvalue().splitlines()
gemv = [l for l in lines if l.endswith(": gemv")]
check(len(gemv) == 1 and "+20.000 ms (520.000 against default's 500.000 ms)" in gemv[0]
      and any("GPU inside generate(): kernels 1.000 s" in l and "tp-vmm" in l for l in lines),
      "the summary prints the GPU lines and the excess per name: %s" % lines)

gpu_runs.append(gpu_run("tp-vmm", 5.0, kernels=101))
rows = {(r["scenario"], r["mode"]): r for r in compare.summarize(gpu_runs, "default")}
check(rows[("qwen2vl_dynres", "default")]["gpu_same_kernels"] is False
      and rows[("qwen2vl_dynres", "tp-vmm")]["gpu_kernel_counts"] == [100, 101],
      "a run with other kernels is flagged for the whole workload")
rows = {r["mode"]: r for r in compare.summarize(results, "default") if r["scenario"] == "decode_growing_kv"}
check(rows["tp-vmm"]["gpu_runs"] == 0 and rows["tp-vmm"]["gpu_kernel_vs_fastest_torch"] is None
      and rows["tp-vmm"]["gpu_same_kernels"] is None, "no GPU figures without --gpu-time: %s" % rows["tp-vmm"])

# Side by side (--side-by-side, --gpus): the GPUs rotate so that every mode runs on every
# GPU once over as many rounds; each run sees only its GPU; the paired
# ratio is each round's tidepool time over that round's fastest PyTorch one.
plan = [compare.round_gpus(4, rnd, 4) for rnd in range(4)]
check(plan[0] == [0, 1, 2, 3] and plan[1] == [1, 2, 3, 0] and all(len(set(p)) == 4 for p in plan)
      and all(sorted(p[i] for p in plan) == [0, 1, 2, 3] for i in range(4)), "GPU rotation: %s" % plan)
check(compare.round_gpus(2, 1, 4) == [1, 2], "fewer modes than GPUs: %s" % compare.round_gpus(2, 1, 4))


def side(mode, gen_s, rnd, rc=0, scenario="gemma3_mtmd"):
    r = run(mode, gen_s, gen_s + 1.0, rc=rc, scenario=scenario)
    r.update(round=rnd, side_by_side=True)
    return r


paired = [side("default", 10.0, 0), side("async", 9.0, 0), side("tp-vmm", 9.9, 0),  # 1.1 of async
          side("default", 20.0, 1), side("async", 21.0, 1), side("tp-vmm", 20.0, 1),  # 1.0 of default
          side("default", 10.0, 2), side("async", 10.0, 2), side("tp-vmm", 10.2, 2),  # 1.02
          side("default", 1.0, 3), side("async", 1.0, 3), side("tp-vmm", 5.0, 3, rc=1)]  # failed: left out
ratio, rounds = compare.paired_ratio(paired, "gemma3_mtmd", "tp-vmm")
check(rounds == 3 and abs(ratio - 1.02) < 1e-12, "paired ratio: %s over %s rounds" % (ratio, rounds))
rows = {r["mode"]: r for r in compare.summarize(paired, "default")}
check(abs(rows["tp-vmm"]["paired_vs_fastest_torch"] - 1.02) < 1e-12 and rows["tp-vmm"]["paired_rounds"] == 3,
      "summarize carries the paired ratio: %s" % rows["tp-vmm"])
check(compare.paired_ratio(results, "decode_growing_kv", "tp-vmm") == (None, 0),
      "runs one after the other have no paired ratio")

# The control: a mode given twice in a round, its second run over its first.
control = paired + [side("default", 11.0, 0), side("default", 18.0, 1), side("default", 10.5, 2),
                    side("default", 1.0, 3, rc=1)]
ratios = compare.control_ratios(control)
check(list(ratios) == [("gemma3_mtmd", "default")] and [round(x, 3) for x in ratios[("gemma3_mtmd", "default")]]
      == [1.1, 0.9, 1.05], "control ratios (the failed round left out): %s" % ratios)
check(compare.control_ratios(paired) == {}, "no mode twice in a round: no control")

captured = {}


def fake_subprocess_run(cmd, env=None, **kw):
    captured["env"] = env
    return subprocess.CompletedProcess(cmd, 0, compare.RESULT_TAG + '{"scenario": "s", "mode": "m"}\n', "")


class Args:
    deterministic, tp_conf, workloads, lib, seed, sample_ms, step_times, timeout = False, "", "w", "l", 0, 5.0, True, 9
    gpu_time = False


real_run, real_visible = compare.subprocess.run, os.environ.get("CUDA_VISIBLE_DEVICES")
compare.subprocess.run = fake_subprocess_run
try:
    r = compare.run_one(Args, "decode_growing_kv", "default", {}, gpu=3)
    check(captured["env"].get("CUDA_VISIBLE_DEVICES") == "3" and r.get("gpu") == 3, "a side-by-side run sees GPU 3: %s"
          % captured["env"].get("CUDA_VISIBLE_DEVICES"))
    os.environ["CUDA_VISIBLE_DEVICES"] = "7"
    r = compare.run_one(Args, "decode_growing_kv", "default", {})
    check(captured["env"].get("CUDA_VISIBLE_DEVICES") == "7" and "gpu" not in r, "one after the other: as it was")
    # A tidepool mode with settings of its own: its run gets them after the kind
    compare.run_one(Args, "decode_growing_kv", "tp-vmm:page=32MiB+max_chunk=64MiB", {})
    check(captured["env"].get("TIDEPOOL_TORCH_CONF") == "kind=vmm,page=32MiB,max_chunk=64MiB,log=warn"
          and "PYTORCH_CUDA_ALLOC_CONF" not in captured["env"],
          "a mode's own settings: %s" % captured["env"].get("TIDEPOOL_TORCH_CONF"))
finally:
    compare.subprocess.run = real_run
    if real_visible is None:
        del os.environ["CUDA_VISIBLE_DEVICES"]
    else:
        os.environ["CUDA_VISIBLE_DEVICES"] = real_visible

check(compare.round_gpus(3, 1, 2) == [1, 0, 1], "more modes than GPUs share them: %s" % compare.round_gpus(3, 1, 2))

# main()'s side-by-side loop, with a stand-in for the runs: every round's
# modes start before any of them ends (each waits for all to have started),
# on the rotated GPUs, and the results carry their round.
import threading
started = threading.Barrier(3, timeout=10)
calls = []


def fake_run_one(args, scenario, mode, kwargs, gpu=None, cpus=None):
    started.wait()  # a BrokenBarrierError unless all three run at once
    calls.append((mode, gpu))
    gen = {"default": 10.0, "async": 9.0, "tp-vmm": 9.45}[mode]
    r = dict(scenario=scenario, mode=mode, kwargs=kwargs, rc=0, error=None, gen_s=gen, wall_s=gen + 1,
             peak_used_mib=100.0)
    if gpu is not None:
        r["gpu"] = gpu
    return r


real_main_run, real_argv = compare.run_one, sys.argv
compare.run_one = fake_run_one
sys.argv = ["compare.py", "--workloads", __file__, "--lib", __file__, "--warmup", "none", "--scenarios", "gemma3_mtmd",
            "--modes", "default,async,tp-vmm", "--rounds", "2", "--side-by-side", "--gpus", "3"]
try:
    import contextlib
    import io
    with contextlib.redirect_stdout(io.StringIO()) as out:
        rc = compare.main()
finally:
    compare.run_one, sys.argv = real_main_run, real_argv
check(rc == 0 and sorted(calls) == sorted([("default", 0), ("async", 1), ("tp-vmm", 2),
                                           ("default", 1), ("async", 2), ("tp-vmm", 0)]),
      "side by side: rc %s, runs %s" % (rc, calls))
check("side by side / fastest torch 1.050 (median of 2 rounds)" in out.getvalue(),
      "the summary gives the paired ratio: %s" % out.getvalue()[-600:])
# Three runs on one GPU: its memory in use is theirs together, kept apart
# from the table's "peak used".
calls.clear()
compare.run_one = fake_run_one
shared_out = os.path.join(os.environ.get("TMPDIR", "/tmp"), "compare_shared_%d.json" % os.getpid())
sys.argv = ["compare.py", "--workloads", __file__, "--lib", __file__, "--warmup", "none", "--scenarios", "gemma3_mtmd",
            "--modes", "default,async,tp-vmm", "--rounds", "1", "--side-by-side", "--out", shared_out]
try:
    with contextlib.redirect_stdout(io.StringIO()):
        compare.main()
    shared = json.load(open(shared_out))["results"]
finally:
    compare.run_one, sys.argv = real_main_run, real_argv
    if os.path.exists(shared_out):
        os.remove(shared_out)
check(all("peak_used_mib" not in r and r["peak_used_shared_gpu_mib"] == 100.0 for r in shared),
      "runs sharing one GPU keep its memory in use apart: %s" % shared)

# --pin: the CPUs cut into equal shares, one a run, rotating; the run's
# worker pins itself first thing (--cpus; no preexec_fn, since runs start
# from several threads at once).
shares = [compare.round_cpus({7, 0, 1, 2, 3, 4, 5, 6, 8}, 3, rnd) for rnd in range(3)]
check(shares[0] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]] and shares[1] == [[3, 4, 5], [6, 7, 8], [0, 1, 2]],
      "CPU shares: %s" % shares)
check(compare.round_cpus(range(7), 3, 0) == [[0, 1], [2, 3], [4, 5]], "the rest left out: %s"
      % compare.round_cpus(range(7), 3, 0))
pinned = {}


def fake_pinned_run(cmd, env=None, **kw):
    pinned["cmd"] = cmd
    return subprocess.CompletedProcess(cmd, 0, compare.RESULT_TAG + '{"scenario": "s", "mode": "m"}\n', "")


compare.subprocess.run = fake_pinned_run
try:
    r = compare.run_one(Args, "decode_growing_kv", "default", {}, cpus=[2, 0])
    check(pinned["cmd"][-2:] == ["--cpus", "0,2"] and r.get("cpus") == [0, 2], "a pinned run: %s %s"
          % (r, pinned["cmd"][-2:]))
    r = compare.run_one(Args, "decode_growing_kv", "default", {})
    check("--cpus" not in pinned["cmd"] and "cpus" not in r, "an unpinned run: %s" % r)
finally:
    compare.subprocess.run = real_run
if hasattr(os, "sched_setaffinity"):  # the pinning itself, as a worker does it, in a child
    p = subprocess.run([sys.executable, "-c", "import os, sys; sys.path.insert(0, %r); from script_checks import "
                        "load_script; load_script('compare.py').pin_to('0'); print(sorted(os.sched_getaffinity(0)))"
                        % HERE], capture_output=True, text=True)
    check(p.stdout.strip() == "[0]", "a child pinned to CPU 0 sees %s (%s)" % (p.stdout.strip(), p.stderr[-300:]))

# --gpus without --side-by-side is a usage error
p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--workloads", __file__, "--gpus", "2"],
                   capture_output=True, text=True)
check(p.returncode == 2 and "it needs --side-by-side" in p.stderr, "--gpus 2 alone: rc %d %s"
      % (p.returncode, p.stderr))

p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--workloads", __file__, "--pin"],
                   capture_output=True, text=True)
check(p.returncode == 2 and "it needs --side-by-side" in p.stderr, "--pin alone: rc %d %s" % (p.returncode, p.stderr))

# --gpu-time side by side on fewer GPUs than runs is a usage error
p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--workloads", __file__, "--gpu-time",
                    "--side-by-side", "--modes", "default,tp-vmm"], capture_output=True, text=True)
check(p.returncode == 2 and "needs a GPU a run (--gpus 2 or more)" in p.stderr, "--gpu-time side by side: rc %d %s"
      % (p.returncode, p.stderr))

# Tidepool modes with settings of their own (tp-vmm:page=32MiB): parsed,
# refused when malformed, and a key that would reach the shim twice is a
# usage error before anything runs (the shim refuses one given twice).
check(compare.tp_conf_of("tp-vmm") == "kind=vmm" and compare.tp_conf_of("tp-segment:align=4096") == "kind=segment,align=4096"
      and compare.tp_conf_of("tp-vmm:page=8MiB+max_chunk=64MiB") == "kind=vmm,page=8MiB,max_chunk=64MiB",
      "tp_conf_of: a mode's own items after the kind")
check(all(compare.tp_conf_of(m) is None for m in ["default", "tp-nope:page=1", "tp-vmm:", "tp-vmm:page", "tp-vmm:=1",
                                                  "tp-vmm:page=2MiB+", "tp-vmm:page="]),
      "tp_conf_of: not a tidepool mode, or an item that is not NAME=VALUE")
lib = os.path.join(HERE, "compare.py")  # any file: the check for the library's path only needs one to exist
for modes, extra, message in [("default,tp-vmm:page", [], "unknown mode tp-vmm:page"),
                              ("tp-vmm:kind=segment", [], "kind given twice"),
                              ("tp-vmm:page=32MiB", ["--tp-conf", "page=8MiB"], "page given twice")]:
    p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--workloads", __file__, "--lib", lib,
                        "--modes", modes] + extra, capture_output=True, text=True)
    check(p.returncode == 2 and message in p.stderr, "--modes %s %s: rc %d %s" % (modes, extra, p.returncode,
                                                                                 p.stderr[-300:]))

# --rounds 0 is a usage error (exit 2) before anything runs
p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--workloads", __file__, "--rounds", "0"],
                   capture_output=True, text=True)
check(p.returncode == 2 and "--rounds must be at least 1" in p.stderr, "--rounds 0: rc %d %s" % (p.returncode, p.stderr))

check.finish()
