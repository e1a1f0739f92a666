#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""h200_check.py [--tide PATH] [--keep DIR] -- the tidepool package with PyTorch on a GPU.

Needs torch and a CUDA GPU, and the tidepool package (installed, or
PYTHONPATH=python TIDEPOOL_TORCH_LIB=build/libtidepool_torch.so). Each
check runs in a fresh python process (enable() must come before CUDA is
used); about a minute in all. Prints a PASS/FAIL table; exit 1 on a FAIL.

  enable        tidepool.torch.enable(limit=8GiB, trace=...): a small conv
                model trains (cudnn.benchmark off) and matches the CPU;
                stats/memory_summary/metrics/snapshot work; the OOM helper is
                installed
  oom           a 16 GiB tensor over the 8 GiB limit raises
                torch.cuda.OutOfMemoryError (tidepool's report as message);
                the process goes on allocating
  record_stream tidepool.torch.record_stream: the free waits for the side
                stream (cross_stream_waits counts it)
  trace         the trace recorded during `enable` is a complete gzip CSV;
                its peak live bytes equal the pool's requested peak (and, with
                --tide, `tide replay` says the same); its path is printed
  mem_pool      cudnn.benchmark = True with a conv model inside
                torch.cuda.use_mem_pool(tidepool.torch.mem_pool()): works,
                segments come from tidepool, torch.cuda.memory_stats() works;
                a too-large tensor there raises torch.cuda.OutOfMemoryError
  config        TIDEPOOL_TORCH_CONF=limt=1GiB: enable() raises ValueError
                naming 'limt'
  too_late      enable() after a CUDA tensor: RuntimeError saying what to move
  benchmark+enable (INFO) cudnn.benchmark under enable(): PyTorch's
                pluggable allocator has no cacheInfo; reported, not a failure
"""
import gzip
import json
import os
import subprocess
import sys
import tempfile
import time

GiB = 1 << 30


def emit(obj):
    print("@@RESULT " + json.dumps(obj), flush=True)


def conv_model(torch):
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(32, 64, 3, padding=1),
        torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))


def train_steps(torch, model, steps=5):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(32, 3, 64, 64, device="cuda")
    y = torch.randint(0, 10, (32,), device="cuda")
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    return float(loss.item())


def matches_cpu(torch, model):
    x = torch.randn(4, 3, 32, 32)
    with torch.no_grad():
        ref = model.cpu()(x)
        got = model.cuda()(x.cuda()).cpu()
    return float((ref - got).abs().max())


# ----------------------------------------------------------------- children

def child_enable(tmp):
    import torch
    import tidepool.torch as tt
    out = {}
    trace = os.path.join(tmp, "enable-%p.csv.gz")
    tt.enable(limit="8GiB", trace=trace, device=0)
    out["oom_helper"] = tt.oom_handler_status()
    torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    model = conv_model(torch).cuda()
    out["loss"] = train_steps(torch, model)
    out["cpu_diff"] = matches_cpu(torch, model)
    # out of memory: over the limit
    try:
        big = torch.empty(16 * GiB, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        out["oom"] = {"raised": None, "data_ptr": big.data_ptr()}
    except Exception as e:
        out["oom"] = {"raised": type(e).__name__, "is_oom": isinstance(e, torch.cuda.OutOfMemoryError),
                      "message": str(e)[:400]}
    after = torch.ones(1 << 20, device="cuda") * 2
    out["after_oom_ok"] = float(after.sum().item()) == 2.0 * (1 << 20)
    # record_stream on a side stream
    side = torch.cuda.Stream()
    before = tt.stats(0)["shim"]["cross_stream_waits"]
    with torch.cuda.stream(side):
        t = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    torch.cuda.current_stream().wait_stream(side)
    t.fill_(1)  # used on the default stream too
    tt.record_stream(t, torch.cuda.current_stream())
    del t
    torch.cuda.synchronize()
    out["cross_stream_waits"] = tt.stats(0)["shim"]["cross_stream_waits"] - before
    s = tt.stats(0)
    out["stats_state"] = s["state"]
    out["pool_kind"] = s["pool"]["kind"]
    out["peak_requested"] = s["pool"]["requested_bytes"]["peak"]
    out["allocs"] = s["pool"]["allocs"]
    out["summary"] = tt.memory_summary(0)
    m = tt.metrics()
    out["metrics_lines"] = len(m.splitlines())
    out["metrics_head"] = "\n".join(l for l in m.splitlines() if not l.startswith("#"))[:600]
    snap = tt.snapshot(0)
    out["snapshot_ranges"] = len(snap["ranges"])
    del model, after
    out["trace_paths"] = tt.stop_trace()
    out["trace_allocs"], out["trace_frees"] = s["pool"]["allocs"], s["pool"]["frees"]
    final = tt.stats(0)["pool"]
    out["final_peak"] = final["requested_bytes"]["peak"]
    emit(out)


def child_mempool(tmp):
    import torch
    import tidepool.torch as tt
    out = {}
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)
    pool = tt.mem_pool(limit="8GiB", trace=os.path.join(tmp, "mempool-%p.csv.gz"))
    with torch.cuda.use_mem_pool(pool):
        model = conv_model(torch).cuda()
        out["loss"] = train_steps(torch, model)
        try:
            torch.empty(16 * GiB, dtype=torch.uint8, device="cuda")
            out["oom"] = {"raised": None}
        except Exception as e:
            out["oom"] = {"raised": type(e).__name__, "is_oom": isinstance(e, torch.cuda.OutOfMemoryError),
                          "message": str(e)[:300]}
        x = torch.ones(1 << 20, device="cuda")
        out["after_oom_ok"] = float(x.sum().item()) == float(1 << 20)
    out["cpu_diff"] = matches_cpu(torch, model)
    s = tt.stats(0)
    out["tidepool_allocs"] = s["pool"]["allocs"] if s.get("pool") else 0
    out["tidepool_reserved"] = s["pool"]["reserved_bytes"]["current"] if s.get("pool") else 0
    ms = torch.cuda.memory_stats()
    out["torch_memory_stats"] = {"allocated_bytes.all.peak": ms.get("allocated_bytes.all.peak"),
                                 "reserved_bytes.all.current": ms.get("reserved_bytes.all.current")}
    out["summary"] = tt.memory_summary(0)
    emit(out)


def child_benchmark_enable(tmp):
    import torch
    import tidepool.torch as tt
    tt.enable(limit="8GiB")
    torch.backends.cudnn.benchmark = True
    try:
        conv = torch.nn.Conv2d(3, 8, 3).cuda()
        conv(torch.randn(2, 3, 32, 32, device="cuda"))
        torch.cuda.synchronize()
        emit({"works": True})
    except Exception as e:
        emit({"works": False, "error": str(e).splitlines()[0][:200]})


def child_config(tmp):
    import tidepool.torch as tt
    try:
        tt.enable()
        emit({"raised": None})
    except ValueError as e:
        emit({"raised": type(e).__name__, "key": getattr(e, "key", None), "message": str(e)})


def child_too_late(tmp):
    import torch
    import tidepool.torch as tt
    torch.ones(1, device="cuda")
    try:
        tt.enable()
        emit({"raised": None})
    except RuntimeError as e:
        emit({"raised": type(e).__name__, "message": str(e)})


CHILDREN = {"enable": child_enable, "mempool": child_mempool, "benchmark_enable": child_benchmark_enable,
            "config": child_config, "too_late": child_too_late}


def run_child(name, tmp, env=None):
    e = dict(os.environ)
    e.pop("TIDEPOOL_TORCH_CONF", None)
    e.update(env or {})
    t0 = time.time()
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", name, tmp], env=e,
                       capture_output=True, text=True, timeout=300)
    res = None
    for line in r.stdout.splitlines():
        if line.startswith("@@RESULT "):
            res = json.loads(line[len("@@RESULT "):])
    return res, r, time.time() - t0


def trace_peak(path):
    live = peak = rows = 0
    sizes = {}
    with gzip.open(path, "rt") as f:
        header = f.readline().strip()
        for line in f:
            t, a, addr, n, stream = line.rstrip("\n").split(",")
            rows += 1
            if a == "alloc":
                sizes[addr] = int(n)
                live += int(n)
                peak = max(peak, live)
            else:
                live -= sizes.pop(addr, 0)
    return header, rows, peak


def main():
    args = sys.argv[1:]
    if args and args[0] == "--child":
        CHILDREN[args[1]](args[2])
        return 0
    tide = None
    keep = None
    if "--tide" in args:
        tide = os.path.abspath(args[args.index("--tide") + 1])
    if "--keep" in args:
        keep = os.path.abspath(args[args.index("--keep") + 1])
    tmp = keep or tempfile.mkdtemp(prefix="tidepool-h200-")
    os.makedirs(tmp, exist_ok=True)
    rows = []

    def row(name, ok, seen):
        rows.append((name, "PASS" if ok is True else "FAIL" if ok is False else "INFO", seen))
        print("%-16s %-4s %s" % rows[-1], flush=True)

    import tidepool
    print("tidepool %s, library %s, scratch %s" % (tidepool.__version__, tidepool.library_path(), tmp), flush=True)
    t_start = time.time()

    res, r, dt = run_child("enable", tmp)
    if res is None:
        row("enable", False, "child failed (%.0fs): %s" % (dt, r.stderr[-1500:]))
    else:
        print(res["summary"])
        print(res["metrics_head"])
        row("enable", res["cpu_diff"] < 1e-3 and res["stats_state"] == "active" and res["metrics_lines"] > 20
            and res["snapshot_ranges"] > 0 and res["oom_helper"].startswith("installed"),
            "loss %.3f, |gpu-cpu| %.1e, %s pool, %d allocs, %d metric lines, %d map ranges; oom helper: %s (%.0fs)"
            % (res["loss"], res["cpu_diff"], res["pool_kind"], res["allocs"], res["metrics_lines"],
               res["snapshot_ranges"], res["oom_helper"], dt))
        o = res["oom"]
        row("oom", o.get("is_oom") is True and "tidepool" in o.get("message", "") and res["after_oom_ok"],
            "%s: %s" % (o.get("raised"), o.get("message", o)[:300]))
        row("record_stream", res["cross_stream_waits"] >= 1, "cross_stream_waits +%d" % res["cross_stream_waits"])
        paths = res["trace_paths"]
        path = paths.get("0") if paths else None
        if not path or not os.path.exists(path):
            row("trace", False, "no trace file: %r" % paths)
        else:
            header, n, peak = trace_peak(path)
            ok = header == "time_us,action,addr,size,stream" and n > 0 and peak == res["final_peak"]
            seen = "%s: %d rows, peak live %d B, pool peak %d B" % (path, n, peak, res["final_peak"])
            if tide:
                rr = subprocess.run([tide, "replay", path, "--json", "--pool", res["pool_kind"]],
                                    capture_output=True, text=True, timeout=300)
                if rr.returncode == 0:
                    rep = json.loads(rr.stdout.strip().splitlines()[-1])["result"]
                    ok = ok and rep["peak_live_bytes"] == res["final_peak"] and rep["errors"] == 0
                    seen += "; tide replay: peak live %d B, peak held %d B" % (rep["peak_live_bytes"],
                                                                              rep["peak_reserved_bytes"])
                else:
                    ok = False
                    seen += "; tide replay failed: " + rr.stderr[-300:]
            row("trace", ok, seen)
            print("trace recorded: " + path, flush=True)

    res, r, dt = run_child("mempool", tmp)
    if res is None:
        row("mem_pool", False, "child failed (%.0fs): %s" % (dt, r.stderr[-1500:]))
    else:
        print(res["summary"])
        o = res["oom"]
        row("mem_pool", res["cpu_diff"] < 1e-3 and res["tidepool_allocs"] > 0
            and res["torch_memory_stats"]["allocated_bytes.all.peak"] and o.get("is_oom") is True
            and res["after_oom_ok"],
            "cudnn.benchmark on, loss %.3f, |gpu-cpu| %.1e, tidepool: %d segment allocs, %d B reserved; torch "
            "memory_stats %s; oom: %s %s (%.0fs)" % (res["loss"], res["cpu_diff"], res["tidepool_allocs"],
                                                   res["tidepool_reserved"], res["torch_memory_stats"],
                                                   o.get("raised"), o.get("message", "")[:120], dt))

    res, r, dt = run_child("config", tmp, {"TIDEPOOL_TORCH_CONF": "limt=1GiB"})
    row("config", bool(res) and res["raised"] == "ConfigError" and res["key"] == "limt",
        (res or {}).get("message") or r.stderr[-500:])
    res, r, dt = run_child("too_late", tmp)
    row("too_late", bool(res) and res["raised"] == "RuntimeError" and "Move `tidepool.torch.enable" in res["message"],
        ((res or {}).get("message") or r.stderr[-500:])[:300])
    res, r, dt = run_child("benchmark_enable", tmp)
    row("benchmark+enable", None, "works" if res and res["works"] else
        "unsupported, as documented (use mem_pool()): %s" % ((res or {}).get("error") or r.stderr[-300:]))

    print("\n%-16s %-4s %s" % ("check", "", "seen"))
    for name, verdict, seen in rows:
        print("%-16s %-4s %s" % (name, verdict, seen[:160]))
    failed = sum(v == "FAIL" for _, v, _ in rows)
    print("\n%d passed, %d failed (%.0f s)" % (sum(v == "PASS" for _, v, _ in rows), failed, time.time() - t_start))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
