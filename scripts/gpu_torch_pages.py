#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
r"""gpu_torch_pages.py -- where a PyTorch workload's time goes with each
allocator: on the host (the allocator's own calls) or on the GPU (kernels
reading memory the allocator mapped).

Why: with tidepool's VMM pool (2 MiB pages, each its own physical
allocation) a Qwen2-VL workload ran ~1.4x slower inside generate() than with
the segment pool, and 32 MiB pages closed most of the gap. That points either
at host time in the allocator (per-page work, map/unmap) or at the GPU's
address translation (many small physical allocations). This script separates
the two, one fresh process per allocator:

  host     alloc+free pairs through torch.empty/del of mixed sizes
           (1 KiB..256 MiB, log-uniform, fixed seed), after a warm-up pass:
           microseconds per pair, the allocator's own cost plus PyTorch's
  grow     the same with every size new (nothing cached): the path that maps
           or allocates device memory
  stream   a kernel streaming over a 4 GiB tensor allocated after the pool
           was fragmented (x.add_(1)), GB/s
  gather   random 4-byte reads over that tensor (64 M of them, index_select):
           address-translation bound, G reads/s
  matmul   an 8192^2 fp16 matmul (compute bound; the control)
Each GPU figure is the median of 15 runs timed with CUDA events.

Usage (a GPU, torch): python3 scripts/gpu_torch_pages.py LIB.so [--modes ...]
  modes: default, expandable, tp-vmm, tp-vmm-pages (max_chunk=2MiB: a physical
  allocation per page, as before chunks), tp-vmm-32m (page=32MiB), tp-segment
"""
import argparse
import json
import os
import subprocess
import sys
import time

MODES = ["default", "expandable", "tp-vmm", "tp-vmm-pages", "tp-vmm-32m", "tp-segment"]
TAG = "@@PAGES "


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def worker(lib, mode):
    import torch
    if mode.startswith("tp-"):
        a = torch.cuda.memory.CUDAPluggableAllocator(lib, "tp_torch_alloc", "tp_torch_free")
        torch.cuda.memory.change_current_allocator(a)
    torch.cuda.init()
    dev = torch.device("cuda:0")
    import random
    rng = random.Random(0)
    sizes = [int(2 ** rng.uniform(10, 28)) for _ in range(4000)]
    res = {"mode": mode}

    def pairs(seq):
        t0 = time.perf_counter()
        for n in seq:
            x = torch.empty(n, dtype=torch.uint8, device=dev)
            del x
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) / len(seq) * 1e6

    pairs(sizes)  # warm
    res["host_us_per_pair"] = round(median([pairs(sizes) for _ in range(5)]), 2)
    # every size new: 256 MiB .. 2 GiB growing by 2 MiB + 1 KiB steps, each kept then freed in bulk
    t0 = time.perf_counter()
    keep = []
    for i in range(400):
        keep.append(torch.empty((1 << 20) + i * ((2 << 20) + 1024), dtype=torch.uint8, device=dev))
        if len(keep) == 8:
            keep.clear()
    keep.clear()
    torch.cuda.synchronize()
    res["grow_us_per_alloc"] = round((time.perf_counter() - t0) / 400 * 1e6, 1)

    # fragment the pool, then a 4 GiB tensor in what is left
    frag = [torch.empty(int(2 ** rng.uniform(16, 25)), dtype=torch.uint8, device=dev) for _ in range(3000)]
    del frag[::2]
    big = torch.zeros(1 << 30, dtype=torch.float32, device=dev)  # 4 GiB
    idx = torch.randint(0, big.numel(), (64 << 20,), device=dev)
    a = torch.randn(8192, 8192, dtype=torch.float16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.float16, device=dev)

    def timed(fn, reps=15):
        fn()
        out = []
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            out.append(s.elapsed_time(e) / 1e3)
        return median(out)

    t = timed(lambda: big.add_(1.0))
    res["stream_GBps"] = round(2 * big.numel() * 4 / t / 1e9, 1)
    t = timed(lambda: big.index_select(0, idx))
    res["gather_Greads_per_s"] = round(idx.numel() / t / 1e9, 2)
    t = timed(lambda: a @ b)
    res["matmul_TFLOPs"] = round(2 * 8192 ** 3 / t / 1e12, 1)
    if mode.startswith("tp-"):
        import ctypes
        lib_h = ctypes.CDLL(lib)
        lib_h.tp_torch_stats_json.restype = ctypes.c_char_p
        lib_h.tp_torch_stats_json.argtypes = [ctypes.c_int]
        pool = json.loads(lib_h.tp_torch_stats_json(0)).get("pool") or {}
        res["device_allocs"] = pool.get("device_allocs")
        res["device_frees"] = pool.get("device_frees")
    print(TAG + json.dumps(res), flush=True)
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("lib")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.lib, args.worker)
    rows = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            sys.exit("unknown mode %s (known: %s)" % (mode, ", ".join(MODES)))
        env = dict(os.environ)
        env.pop("PYTORCH_CUDA_ALLOC_CONF", None)
        env.pop("TIDEPOOL_TORCH_CONF", None)
        if mode == "expandable":
            env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        elif mode.startswith("tp-"):
            env["TIDEPOOL_TORCH_CONF"] = {"tp-vmm": "kind=vmm", "tp-vmm-pages": "kind=vmm,max_chunk=2MiB",
                                          "tp-vmm-32m": "kind=vmm,page=32MiB",
                                          "tp-segment": "kind=segment"}[mode]
        p = subprocess.run([sys.executable, __file__, args.lib, "--worker", mode], env=env, capture_output=True,
                           text=True, timeout=300)
        r = next((json.loads(l[len(TAG):]) for l in p.stdout.splitlines() if l.startswith(TAG)), None)
        if r is None:
            print("%s: no result (rc %s): %s" % (mode, p.returncode, p.stderr[-1500:]))
            continue
        rows.append(r)
        print(json.dumps(r), flush=True)
    keys = ["host_us_per_pair", "grow_us_per_alloc", "stream_GBps", "gather_Greads_per_s", "matmul_TFLOPs",
            "device_allocs", "device_frees"]
    print("%-12s" % "mode" + "".join("%20s" % k for k in keys))
    for r in rows:
        print("%-12s" % r["mode"] + "".join("%20s" % r.get(k) for k in keys))


if __name__ == "__main__":
    main()
