#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test_replay_trace.py -- replay_trace.py without a GPU: its trace reader
against `tide replay` on generated traces (plain and gzip), its errors for
malformed traces and bad options, and a run without torch.
  python3 test_replay_trace.py [none] [TIDE]   (TIDE: the tide binary; the
                                         comparison is skipped without it)"""
import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

from script_checks import HERE, Checks, load_script

SCRIPT = os.path.join(HERE, "replay_trace.py")
rt = load_script("replay_trace.py")
check = Checks("test_replay_trace")


def run(*args):
    p = subprocess.run([sys.executable, SCRIPT] + list(args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       text=True)
    return p.returncode, p.stdout + p.stderr


tmp = tempfile.mkdtemp()


def write(name, text, compress=False):
    path = os.path.join(tmp, name)
    with (gzip.open(path, "wt") if compress else open(path, "w")) as f:
        f.write(text)
    return path


# A small trace: peak live 300 + 500 = 800 bytes (the 1000-byte block comes
# after the 300 is freed; 1000 + 500 = 1500 is the peak then), one free of an
# address that is not live.
small = ("time_us,action,addr,size,stream\n0,alloc,0x10,300,0\n1,alloc,0x20,500,1\n2,free,0x10,0,0\n"
         "3,alloc,0x30,1000,0\n4,free,0x99,0,0\n5,free,0x20,0,1\n6,free,0x30,0,0\n")
for compress in (False, True):
    fig = rt.trace_figures(write("small.csv" + (".gz" if compress else ""), small, compress))
    check(fig == dict(events=7, peak_live=1500, unknown_frees=1), "small trace (gzip %s): %s" % (compress, fig))
no_header = rt.trace_figures(write("nohead.csv", small.split("\n", 1)[1]))
check(no_header["peak_live"] == 1500 and no_header["events"] == 7, "a trace without its header line: %s" % no_header)

# Malformed traces: TraceError naming the file and line; the command exits 2
# with that message, before any GPU run.
bad = {
    "fields.csv": ("time_us,action,addr,size,stream\n0,alloc,0x10,300\n", ":2: expected"),
    "action.csv": ("0,alloc,0x10,300,0\n1,release,0x10,0,0\n", ":2: action 'release'"),
    "number.csv": ("0,alloc,0x10,3e2,0\n", ":1: address, size and stream must be integers"),
    "negative.csv": ("0,alloc,0x10,-5,0\n", ":1: negative size"),
    "twice.csv": ("0,alloc,0x10,5,0\n1,alloc,0x10,5,0\n", "allocated twice"),
}
for name, (text, message) in bad.items():
    path = write(name, text)
    try:
        rt.trace_figures(path)
        check(False, "%s: no error" % name)
    except rt.TraceError as e:
        check(message in str(e) and name in str(e), "%s: the error names the problem and the file: %s" % (name, e))
    code, out = run(path, "--modes", "default")
    check(code == 2 and message in out, "%s: the command exits 2 with the message (exit %d): %s" % (name, code, out))
code, out = run(os.path.join(tmp, "missing.csv"))
check(code == 2 and "missing.csv" in out, "a missing trace: exit %d: %s" % (code, out))

# Options.
small_path = os.path.join(tmp, "small.csv")
code, out = run(small_path, "--modes", "default,pytorch")
check(code == 2 and "unknown allocator pytorch" in out, "an unknown mode: exit %d: %s" % (code, out))
code, out = run(small_path, "--modes", "tp-vmm")
check(code == 2 and "--lib" in out, "tp-vmm without --lib: exit %d: %s" % (code, out))
code, out = run(small_path, "--sample-every", "0")
check(code == 2 and "--sample-every" in out, "--sample-every 0: exit %d: %s" % (code, out))
code, out = run("--help")
check(code == 0 and "tp-segment" in out and "held/live" in out, "--help names the allocators and figures")

# Without torch the run fails with a clear error (exit 1) and --out still
# records it. (Skipped where torch is installed: this test needs no GPU.)
if importlib.util.find_spec("torch") is None:
    out_json = os.path.join(tmp, "runs.json")
    code, out = run(small_path, "--modes", "default", "--out", out_json)
    runs = json.load(open(out_json)) if os.path.exists(out_json) else []
    check(code == 1 and "torch is not installed" in out, "no torch: exit %d: %s" % (code, out))
    check(len(runs) == 1 and "torch is not installed" in (runs[0].get("error") or ""), "--out records it: %s" % runs)

# The reader agrees with tide replay on generated traces: several streams and
# out-of-order frees, plain and gzip.
tide = next((a for a in sys.argv[1:] if a != "none"), None)  # run_ctypes_test.sh passes "none" first
if tide:
    for scenario, extra, name in (("out-of-order", ["--steps", "400"], "ooo.csv.gz"),
                                  ("cross-stream", ["--steps", "60"], "cross.csv")):
        path = os.path.join(tmp, name)
        subprocess.run([tide, "scenario", scenario] + extra + ["--out", path], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        p = subprocess.run([tide, "replay", path, "--json", "--quiet"], stdout=subprocess.PIPE, text=True, check=True)
        want = json.loads(p.stdout.splitlines()[0])["result"]
        got = rt.trace_figures(path)
        check(got["peak_live"] == want["peak_live_bytes"] and got["events"] == want["events"] and
              got["unknown_frees"] == want["unknown_frees"], "%s: %s against tide replay's %s" % (name, got, want))
else:
    print("note: no tide binary given; the comparison with tide replay is skipped")

check.finish()
