# SPDX-License-Identifier: MIT
"""Writes the PyTorch memory-snapshot pickles of tests/tools/data and
tests/tools/fuzz_corpus: dicts shaped like what torch.cuda.memory._snapshot()
returns (segments, device_traces, allocator_settings), built by hand from the
committed CSV excerpt, so that a clean checkout needs neither PyTorch nor a
GPU. Run at test-authoring time (python3 make_pickles.py) and commit what it
writes; the tests only read the files.

The trace entries carry what PyTorch's carry: action, addr, size, stream,
time_us, frames (a list of {filename, line, name} dicts), and keys the
reader must ignore (compile_context, user_metadata); besides alloc and
free_requested there are the actions a replay leaves out (segment_alloc,
free_completed, segment_map, snapshot). Device 1 has a trace of its own.
"""
import gzip
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
CORPUS = os.path.join(HERE, "fuzz_corpus")

FRAMES = [
    {"filename": "/usr/lib/python3/site-packages/torch/nn/modules/linear.py", "line": 125, "name": "forward"},
    {"filename": "/usr/lib/python3/site-packages/transformers/models/qwen2_vl/modeling_qwen2_vl.py", "line": 412,
     "name": "forward"},
    {"filename": "serve.py", "line": 88, "name": "main"},
]


def read_csv(path):
    events = []
    with open(path) as f:
        assert f.readline().strip() == "time_us,action,addr,size,stream"
        for line in f:
            t, action, addr, size, stream = line.strip().split(",")
            events.append((int(t), action, int(addr), int(size), int(stream)))
    return events


def entry(action, addr, size, stream, time_us, frames):
    return {"action": action, "addr": addr, "size": size, "stream": stream, "time_us": time_us,
            "frames": frames, "compile_context": "N/A", "user_metadata": ""}


def device_trace(events, with_frames=True):
    """CSV events as PyTorch trace entries, with the actions a replay skips."""
    out = []
    segment = 0
    for i, (t, action, addr, size, stream) in enumerate(events):
        frames = FRAMES[: 1 + i % 3] if with_frames else []
        if action == "alloc":
            if i % 25 == 0:  # now and then a new segment first
                segment += 1
                out.append(entry("segment_alloc", 0x7F0000000000 + segment * (1 << 26), 1 << 26, stream, t, frames))
            out.append(entry("alloc", addr, size, stream, t, frames))
        else:
            out.append(entry("free_requested", addr, size, stream, t, frames))
            out.append(entry("free_completed", addr, size, stream, t + 3, frames))
    out.insert(len(out) // 2, {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": events[0][0],
                               "frames": []})
    return out


def snapshot(traces):
    return {
        "segments": [{"device": 0, "address": 0x7F0000000000, "total_size": 1 << 26, "stream": 0,
                      "segment_type": "large", "allocated_size": 0, "active_size": 0, "requested_size": 0,
                      "blocks": [{"address": 0x7F0000000000, "size": 1 << 26, "requested_size": 0,
                                  "state": "inactive", "frames": []}]}],
        "device_traces": traces,
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1, "garbage_collection_threshold": 0.0,
                               "expandable_segments": False, "pinned_num_register_threads": 1,
                               "release_lock_on_cudamalloc": False, "pinned_use_host_register": False,
                               "roundup_power2_divisions": [1] * 16},
    }


def write(path, obj, protocol, compress=False):
    data = pickle.dumps(obj, protocol=protocol)
    if compress:
        data = gzip.compress(data, mtime=0)
    with open(path, "wb") as f:
        f.write(data)
    print(f"wrote {os.path.relpath(path, HERE)} ({len(data)} bytes, protocol {protocol})")


def main():
    events = read_csv(os.path.join(DATA, "qwen2vl_excerpt.csv"))
    # device 1: a short trace of its own (3 allocs of 1 MiB, one freed)
    dev1 = [entry("alloc", 0x10000 * (k + 1), 1 << 20, 7, 1000 + k, []) for k in range(3)]
    dev1.append(entry("free_requested", 0x10000, 1 << 20, 7, 1010, []))
    snap = snapshot([device_trace(events), dev1])
    # the same events as qwen2vl_excerpt.csv: protocol 4 (pickle.dump's
    # default, with FRAME and MEMOIZE), and protocol 2 gzip-compressed
    # (BINPUT/BINGET, BINUNICODE), and protocol 5
    write(os.path.join(DATA, "qwen2vl_excerpt.pickle"), snap, 4)
    write(os.path.join(DATA, "qwen2vl_excerpt.p2.pickle.gz"), snap, 2, compress=True)
    write(os.path.join(DATA, "qwen2vl_excerpt.p5.pickle"), snap, 5)

    # fuzz seeds: small snapshots under the fuzzer's 4 KiB
    tiny = events[:6]
    write(os.path.join(CORPUS, "pt_snapshot_p4.pickle"), snapshot([device_trace(tiny), dev1]), 4)
    write(os.path.join(CORPUS, "pt_snapshot_p2.pickle"), snapshot([device_trace(tiny, with_frames=False)]), 2)
    write(os.path.join(CORPUS, "pt_snapshot_p5_numbers.pickle"),
          {"device_traces": [[entry("alloc", 2**64 - 4096, 2**30, -1, 2**50, []),
                              entry("free_requested", 2**64 - 4096, 2**30, -1, 2**50 + 1, []),
                              {"action": "alloc", "addr": 4096, "size": 512, "extra": (1.5, None, True, b"\x00\x01")},
                              {"action": "oom", "device_free": 0}]]},
          5)
    cut = pickle.dumps(snapshot([device_trace(tiny)]), protocol=4)
    with open(os.path.join(CORPUS, "pt_snapshot_cut.pickle"), "wb") as f:
        f.write(cut[: len(cut) * 2 // 3])
    print("wrote fuzz_corpus/pt_snapshot_cut.pickle (truncated)")


if __name__ == "__main__":
    main()
