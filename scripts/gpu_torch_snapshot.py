# SPDX-License-Identifier: MIT
"""Records a PyTorch CUDA memory snapshot of a small transformer-like
workload (attention with a growing KV cache, then a conv layer) and writes
two files that `tide replay` must read as the same trace:
  OUT/torch_snapshot.pickle   torch.cuda.memory._snapshot(), pickled
  OUT/torch_snapshot.csv      the same events as tidepool CSV
                              (alloc -> alloc, free_requested -> free)
Usage: python3 scripts/gpu_torch_snapshot.py OUT   (needs torch and a GPU)."""
import os
import pickle
import sys

import torch


def workload():
    torch.manual_seed(0)
    dev = "cuda"
    d, heads = 512, 8
    k = torch.empty(0, d, device=dev)
    v = torch.empty(0, d, device=dev)
    w = torch.randn(d, 3 * d, device=dev)
    for step in range(48):
        x = torch.randn(16 if step == 0 else 1, d, device=dev)
        qkv = x @ w
        q, kn, vn = qkv.split(d, dim=-1)
        k = torch.cat([k, kn])  # reallocated larger every token
        v = torch.cat([v, vn])
        att = torch.softmax((q.view(-1, heads, d // heads).transpose(0, 1) @
                             k.view(-1, heads, d // heads).transpose(0, 1).transpose(1, 2)) / 8.0, dim=-1)
        out = (att @ v.view(-1, heads, d // heads).transpose(0, 1)).transpose(0, 1).reshape(-1, d)
        del qkv, q, kn, vn, att, out
    conv = torch.nn.Conv2d(3, 16, 3).to(dev)
    img = torch.randn(2, 3, 224, 224, device=dev)
    y = conv(img)
    del y, img
    torch.cuda.synchronize()


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "."
    os.makedirs(out, exist_ok=True)
    torch.cuda.memory._record_memory_history(max_entries=100000)
    workload()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    with open(os.path.join(out, "torch_snapshot.pickle"), "wb") as f:
        pickle.dump(snap, f)
    rows = []
    for e in snap["device_traces"][0]:
        a = e["action"]
        if a in ("alloc", "free_requested"):
            rows.append("%d,%s,%d,%d,%d" % (e.get("time_us", 0), "alloc" if a == "alloc" else "free", e["addr"],
                                            e["size"], e.get("stream", 0)))
    with open(os.path.join(out, "torch_snapshot.csv"), "w") as f:
        f.write("time_us,action,addr,size,stream\n")
        f.write("\n".join(rows) + "\n")
    print("snapshot: %d trace entries, %d alloc/free events" % (len(snap["device_traces"][0]), len(rows)))


if __name__ == "__main__":
    main()
