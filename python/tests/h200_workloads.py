# SPDX-License-Identifier: MIT
"""Runs the transformer workloads the real traces were recorded from (docs/traces.md)
(Llama-style decode with a growing KV cache, Gemma 3 image requests,
Qwen2-VL dynamic-resolution images; randomly initialised models, nothing
downloaded) with PyTorch's allocator swapped for tidepool by
tidepool.torch.enable(), one process per workload, and prints what each
pool held. Needs torch, transformers and a GPU.
  python3 python/tests/h200_workloads.py RECORDER.py [KIND] [--quick]
RECORDER.py is the recorder script that defines the workloads (its
decode_growing_kv, gemma3_mtmd and qwen2vl_dynres functions)."""
import importlib.util
import json
import subprocess
import sys
import time

QUICK = dict(decode_growing_kv=dict(new_tokens=64), gemma3_mtmd=dict(requests=3), qwen2vl_dynres=dict(requests=3))


def child(recorder, name, kind, kwargs):
    import tidepool.torch as tt
    tt.enable(kind=kind)
    import torch
    spec = importlib.util.spec_from_file_location("recorder", recorder)
    rec = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(rec)
    t0 = time.time()
    getattr(rec, name)(torch, **kwargs)
    torch.cuda.synchronize()
    s = tt.stats(0)["pool"]
    print(json.dumps(dict(workload=name, kind=kind, seconds=round(time.time() - t0, 1),
                          peak_live_mib=round(s["requested_bytes"]["peak"] / 2**20, 1),
                          peak_held_mib=round(s["reserved_bytes"]["peak"] / 2**20, 1),
                          device_allocs=s["device_allocs"], ooms=s["ooms"], hazards=s["hazards"])))


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3], sys.argv[4], json.loads(sys.argv[5]))
        return 0
    recorder = sys.argv[1]
    kind = sys.argv[2] if len(sys.argv) > 2 and not sys.argv[2].startswith("-") else "vmm"
    failed = 0
    for name, kwargs in QUICK.items():
        r = subprocess.run([sys.executable, __file__, "--child", recorder, name, kind, json.dumps(kwargs)],
                           capture_output=True, text=True, timeout=600)
        line = [l for l in r.stdout.splitlines() if l.startswith("{")]
        if r.returncode or not line:
            failed += 1
            print("FAIL %s: rc %d %s" % (name, r.returncode, r.stderr[-800:]))
        else:
            print("PASS " + line[-1])
    print("%d passed, %d failed" % (len(QUICK) - failed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
