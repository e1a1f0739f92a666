#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""smoke_torch.py LIB.so -- libtidepool_torch.so inside PyTorch, on a GPU.

Checks, each reported as ok/FAIL with what was seen:
  math        tensors from tidepool give the same results as on the CPU
  size0       empty tensors (PyTorch asks for 0 bytes; the shim returns NULL)
  streams     allocations on a side stream, freed after the stream's work
  stats       tp_torch_stats_json through ctypes; tp_torch_empty_cache trims
  oom         (own process, limit=1GiB) a 2 GiB tensor: PyTorch must raise
              (RuntimeError: CUDA out of memory ..., from the shim's oom=raise),
              the process must survive, and a later small tensor must work
Run: python3 integrations/pytorch/smoke_torch.py build-torch/libtidepool_torch.so
"""
import ctypes
import json
import os
import subprocess
import sys

LIB = os.path.abspath(sys.argv[1]) if len(sys.argv) > 1 else None


def load(torch):
    alloc = torch.cuda.memory.CUDAPluggableAllocator(LIB, "tp_torch_alloc", "tp_torch_free")
    torch.cuda.memory.change_current_allocator(alloc)
    lib = ctypes.CDLL(LIB)
    lib.tp_torch_stats_json.restype = ctypes.c_char_p
    lib.tp_torch_stats_json.argtypes = [ctypes.c_int]
    return lib


def oom_child():
    import torch
    lib = load(torch)
    out = {}
    small = torch.ones(1024, device="cuda")
    try:
        big = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        out["raised"] = None
        out["data_ptr"] = big.data_ptr()
    except Exception as e:
        out["raised"] = type(e).__name__
        out["is_oom"] = isinstance(e, torch.cuda.OutOfMemoryError)
        out["message"] = str(e)[:300]
    try:
        after = torch.ones(1 << 20, device="cuda") * 2
        out["after_ok"] = float(after.sum().item()) == 2.0 * (1 << 20) and float(small.sum().item()) == 1024
    except Exception as e:
        out["after_ok"] = False
        out["after_error"] = repr(e)[:300]
    out["stats"] = json.loads(lib.tp_torch_stats_json(0).decode())
    print("@@OOM " + json.dumps(out))


def main():
    if not LIB:
        print(__doc__)
        return 2
    if len(sys.argv) > 2 and sys.argv[2] == "--oom-child":
        oom_child()
        return 0
    results = []

    def report(name, ok, seen):
        results.append(ok)
        print("%-8s %s  %s" % (name, "ok  " if ok else "FAIL", seen), flush=True)

    import torch
    lib = load(torch)
    torch.manual_seed(0)
    # math
    try:
        a_cpu, b_cpu = torch.randn(512, 256), torch.randn(256, 128)
        a, b = a_cpu.cuda(), b_cpu.cuda()
        c = (a @ b).relu().sum(dim=0)
        ref = (a_cpu @ b_cpu).relu().sum(dim=0)
        err = float((c.cpu() - ref).abs().max())
        ptrs = [t.data_ptr() for t in (a, b, c)]
        report("math", err < 1e-2 and all(p % 512 == 0 for p in ptrs), "max |diff| %.2e, ptrs %s" % (err, [hex(p) for p in ptrs]))
    except Exception as e:
        report("math", False, repr(e)[:500])
    # size 0
    try:
        e0 = torch.empty(0, device="cuda")
        e1 = torch.zeros(0, 5).cuda()
        cat = torch.cat([e0, torch.ones(3, device="cuda")])
        report("size0", e0.numel() == 0 and e1.shape == (0, 5) and float(cat.sum()) == 3.0,
               "empty tensors data_ptr %s %s" % (e0.data_ptr(), e1.data_ptr()))
    except Exception as e:
        report("size0", False, repr(e)[:500])
    # a side stream
    try:
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            xs = [torch.full((1 << 18,), float(i), device="cuda") for i in range(16)]
            total = sum(float(x.sum()) for x in xs)
        s.synchronize()
        del xs
        y = torch.ones(1 << 20, device="cuda")
        report("streams", total == sum(i * (1 << 18) for i in range(16)) and float(y.sum()) == 1 << 20,
               "16 tensors on a side stream")
    except Exception as e:
        report("streams", False, repr(e)[:500])
    # stats and empty_cache
    try:
        del a, b, c, y
        torch.cuda.synchronize()
        before = json.loads(lib.tp_torch_stats_json(0).decode())
        lib.tp_torch_empty_cache()
        after = json.loads(lib.tp_torch_stats_json(0).decode())
        rb, ra = before["pool"]["reserved_bytes"]["current"], after["pool"]["reserved_bytes"]["current"]
        report("stats", before["state"] == "active" and ra <= rb and after["pool"]["allocs"] > 0,
               "kind %s, allocs %d, reserved %d -> %d after empty_cache, live %d" % (
                   after["pool"]["kind"], after["pool"]["allocs"], rb, ra, after["pool"]["allocated_bytes"]["current"]))
    except Exception as e:
        report("stats", False, repr(e)[:500])
    # out of memory, in its own process
    env = dict(os.environ, TIDEPOOL_TORCH_CONF="limit=1GiB,log=warn")
    p = subprocess.run([sys.executable, os.path.abspath(__file__), LIB, "--oom-child"], env=env,
                       capture_output=True, text=True, timeout=300)
    line = next((l for l in p.stdout.splitlines() if l.startswith("@@OOM ")), None)
    if line is None:
        report("oom", False, "child rc %s, no result; stderr: %s" % (p.returncode, p.stderr[-1500:]))
    else:
        o = json.loads(line[6:])
        # PyTorch turns the shim's C++ exception into RuntimeError (its own
        # allocator raises torch.cuda.OutOfMemoryError, a RuntimeError too).
        raised_ok = o.get("raised") in ("RuntimeError", "OutOfMemoryError") and "out of memory" in (o.get("message") or "")
        report("oom", raised_ok and bool(o.get("after_ok")),
               "raised %s (OutOfMemoryError: %s), later allocation ok: %s, pool ooms %s; %s" % (
                   o.get("raised"), o.get("is_oom"), o.get("after_ok"),
                   (o["stats"].get("pool") or {}).get("ooms"), (o.get("message") or o.get("data_ptr") or "")))
        tp = [l for l in p.stderr.splitlines() if l.startswith("tidepool-torch")]
        if tp:
            print("         shim log: " + tp[-1][:300])
    print("smoke: %d/%d ok" % (sum(results), len(results)))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
