# SPDX-License-Identifier: MIT
"""test_torch_ctypes.py LIB.so [TIDE] -- the PyTorch shim as PyTorch loads it (ctypes).

Standard library only; no torch, no GPU needed. Each case runs in a fresh
python3 process because the shim reads TIDEPOOL_TORCH_CONF once, at load.
  - loading with ctypes, the exported names, tidepool's own names hidden
  - no CUDA device (CUDA_VISIBLE_DEVICES= hides any): NULL, no crash,
    also with allocations from 8 threads at once
  - TIDEPOOL_TORCH_CONF: good values are applied, each bad one prints one
    line on stderr naming it and is refused as a whole: no pool is created
    (allocations fail; the statistics name the key at fault)
  - tp_torch_configure: the same parser from a call, before any pool
  - the exit report (stats=FILE with %p, stats=-), log forwarding
  - oom=null: tp_torch_alloc itself returns NULL; oom=abort: aborts with
    the report (the default, oom=raise, throws: C++ callers only, see
    test_torch_raise.cpp)
  - the simulated device behind the same entry points (backend=sim)
  - trace=PATH: a gzip CSV trace of every allocation and free, closed at
    exit; replayed by TIDE (`tide replay`, when given) through the same pool
    kind, its peak live bytes equal the pool's peak of requested bytes
"""
import json
import os
import subprocess
import sys
import tempfile

LIB = os.path.abspath(sys.argv[1])
TIDE = os.path.abspath(sys.argv[2]) if len(sys.argv) > 2 else None
failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL:", what, flush=True)


# Runs in the child: loads the library the way CUDAPluggableAllocator does.
CHILD_PRELUDE = r"""
import ctypes, json, sys, threading
lib = ctypes.CDLL(sys.argv[1])
lib.tp_torch_alloc.restype = ctypes.c_void_p
lib.tp_torch_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.tp_torch_try_alloc.restype = ctypes.c_void_p
lib.tp_torch_try_alloc.argtypes = [ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
alloc = lib.tp_torch_try_alloc  # never throws (tp_torch_alloc may, with oom=raise)
lib.tp_torch_free.restype = None
lib.tp_torch_free.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p]
lib.tp_torch_stats_json.restype = ctypes.c_char_p
lib.tp_torch_stats_json.argtypes = [ctypes.c_int]
def stats(d):
    return json.loads(lib.tp_torch_stats_json(d).decode())
"""


def child(body, conf=None, extra_env=None):
    env = dict(os.environ)
    env.pop("TIDEPOOL_TORCH_CONF", None)
    env["CUDA_VISIBLE_DEVICES"] = ""  # no CUDA device, even on a GPU machine
    if conf is not None:
        env["TIDEPOOL_TORCH_CONF"] = conf
    env.update(extra_env or {})
    r = subprocess.run([sys.executable, "-c", CHILD_PRELUDE + body, LIB], env=env,
                       capture_output=True, text=True, timeout=120)
    return r


def test_exports():
    r = child(r"""
for name in ["tp_torch_alloc", "tp_torch_try_alloc", "tp_torch_free", "tp_torch_init", "tp_torch_empty_cache",
             "tp_torch_set_memory_fraction", "tp_torch_record_stream", "tp_torch_trim",
             "tp_torch_reset_peaks", "tp_torch_stats_json", "tp_torch_configure", "tp_torch_prepare",
             "tp_torch_metrics", "tp_torch_snapshot_json", "tp_torch_set_oom_handler", "tp_torch_trace_close"]:
    getattr(lib, name)
hidden = []
for name in ["tp_pool_alloc", "tp_device_open", "tp_status_name", "parse_config", "g"]:
    try:
        getattr(lib, name)
        hidden.append(name)
    except AttributeError:
        pass
print(json.dumps(hidden))
""", conf="log=off")
    check(r.returncode == 0, "exports: child failed: " + r.stderr[-2000:])
    if r.returncode == 0:
        check(json.loads(r.stdout.strip().splitlines()[-1]) == [], "exports: internal names visible: " + r.stdout)


def test_no_device():
    r = child(r"""
ptrs = [alloc(1 << 20, 0, None), alloc(0, 0, None),
        alloc(-1, 0, None), alloc(256, 4096, None)]
assert all(p is None for p in ptrs), ptrs
lib.tp_torch_free(None, 0, 0, None)
lib.tp_torch_empty_cache()
out = []
def worker():
    out.append(all(alloc(4096 + i, 0, None) is None for i in range(500)))
ts = [threading.Thread(target=worker) for _ in range(8)]
[t.start() for t in ts]; [t.join() for t in ts]
assert out == [True] * 8, out
s = stats(0)
assert s["state"] == "failed" and s["pool"] is None, s
assert s["error"].startswith("TP_ERR_"), s
assert s["shim"]["failed_allocs"] == 1 + 8 * 500, s
assert s["shim"]["zero_size_allocs"] == 1, s
print("ok")
""", conf="log=off")
    check(r.returncode == 0 and r.stdout.strip().endswith("ok"),
          "no device: rc=%d out=%s err=%s" % (r.returncode, r.stdout[-500:], r.stderr[-2000:]))
    check(r.stderr == "", "no device with log=off printed: " + r.stderr[-500:])


def test_no_device_logs():
    # Default log level (warn): the failure to open the device is reported
    # once by the shim, and tidepool's own reason is forwarded with a prefix.
    r = child(r"""
for i in range(100):
    assert alloc(4096, 0, None) is None
print("ok")
""", conf=None)
    check(r.returncode == 0, "logs: child failed: " + r.stderr[-2000:])
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    check(any(l.startswith("tidepool-torch error: cuda:0: no pool (TP_ERR_") for l in lines),
          "logs: no 'no pool' line: %r" % lines)
    check(any(l.startswith("tidepool-torch[cuda:0] error: ") for l in lines),
          "logs: tidepool's reason not forwarded: %r" % lines)
    check(sum("no pool" in l for l in lines) == 1, "logs: 'no pool' repeated: %r" % lines)


def test_config_good():
    conf = ("kind=vmm,limit=70GiB,release_threshold=256MiB,idle_release_ms=10000,stats=-,log=warn,"
            "align=1KiB,tick_ms=250,va_reserve=1.5TiB,page=2MiB,max_map=512MB,max_chunk=64MiB")
    r = child(r"""
c = stats(-1)["tidepool_torch"]["config"]
print(json.dumps(c))
""", conf=conf)
    check(r.returncode == 0, "config good: child failed: " + r.stderr[-2000:])
    if r.returncode != 0:
        return
    c = json.loads(r.stdout.strip().splitlines()[-1])
    expect = dict(ok=True, kind="vmm", limit_bytes=70 << 30, release_threshold_bytes=256 << 20,
                  idle_release_ms=10000, align=1024, tick_ms=250, va_reserve_bytes=3 << 39,
                  page_bytes=2 << 20, max_map_bytes=512000000, max_chunk_bytes=64 << 20, log="warn", stats="-")
    for k, v in expect.items():
        check(c.get(k) == v, "config good: %s = %r, expected %r" % (k, c.get(k), v))
    # stats=- writes the report to stderr at exit, as one JSON line.
    report = [l for l in r.stderr.splitlines() if l.startswith("{")]
    check(len(report) == 1 and "devices" in json.loads(report[0]), "config good: no exit report: " + r.stderr[-500:])

    for conf, key, value in [("limit=90%", "limit", "90%"), ("release_threshold=unlimited", "release_threshold_bytes", "unlimited"),
                             ("idle_release_ms=never", "idle_release_ms", "never"), ("kind=segment", "kind", "segment"),
                             (" kind = auto , limit = 1g ", "limit_bytes", 1 << 30), ("limit=2.5GB", "limit_bytes", 2500000000),
                             ("", "ok", True), ("log=off", "log", "off"), ("release_threshold=0", "release_threshold_bytes", 1),
                             ("oom=null", "oom", "null"), ("oom=abort", "oom", "abort")]:
        r = child('print(json.dumps(stats(-1)["tidepool_torch"]["config"]))', conf=conf)
        got = json.loads(r.stdout.strip().splitlines()[-1]) if r.returncode == 0 else {}
        check(got.get(key) == value and got.get("ok") is True, "config %r: %s = %r" % (conf, key, got.get(key)))
        check(r.stderr == "", "config %r printed: %s" % (conf, r.stderr[-300:]))


def test_config_bad():
    bad = [("kind=foo", "kind"), ("limit=70XB", "limit"), ("limit=", "limit"), ("limit=-1GiB", "limit"),
           ("limit=0x10", "limit"), ("limit=1e9", "limit"), ("limit=150%", "limit"), ("limit=0%", "limit"),
           ("limit=0", "limit"), ("limit=0GiB", "limit"), ("limit=0.0MiB", "limit"),
           ("bogus=1", "bogus"), ("limit=1GiB,limit=2GiB", "limit"), ("align=300", "align"), ("align=128", "align"),
           ("idle_release_ms=-5", "idle_release_ms"), ("idle_release_ms=1.5", "idle_release_ms"), ("log=loud", "log"),
           ("release_threshold=lots", "release_threshold"), ("kind", "kind"), ("kind=vmm,,limit=1GiB", ""),
           ("tick_ms=abc", "tick_ms"), ("limit=99999999999999999999", "limit"), ("page=3MiB", "page"),
           ("backend=rocm", "backend"), ("limit=1.5", "limit"), ("oom=maybe", "oom"),
           ("backend=sim,limt=1GiB", "limt"), ("backend=sim,trace=", "trace")]
    for conf, key in bad:
        # The configuration is refused as a whole: on the simulated device
        # (which would otherwise work) no pool is created either.
        r = child(r"""
c = stats(-1)["tidepool_torch"]["config"]
p = alloc(4096, 0, None)
print(json.dumps({"config": c, "ptr": p, "state": stats(0)["state"]}))
""", conf=conf)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode == 0, "config %r: child failed: %s" % (conf, r.stderr[-1000:]))
        check(len(lines) >= 1 and lines[0].startswith("tidepool-torch: TIDEPOOL_TORCH_CONF=")
              and lines[0].endswith("no pool will be created (every allocation fails) until it is fixed"),
              "config %r: stderr %r" % (conf, lines))
        if r.returncode == 0:
            out = json.loads(r.stdout.strip().splitlines()[-1])
            c = out["config"]
            check(c["ok"] is False and c["bad_key"] == key and c["error"], "config %r: %r" % (conf, c))
            check(out["ptr"] is None and out["state"] == "failed", "config %r: allocated anyway: %r" % (conf, out))


def test_configure_call():
    # tp_torch_configure: applied before the first pool; a bad item names
    # its key and changes nothing; after a pool exists it is refused (-2).
    r = child(r"""
lib.tp_torch_configure.restype = ctypes.c_int
lib.tp_torch_configure.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
err, key = ctypes.create_string_buffer(256), ctypes.create_string_buffer(64)
out = {}
out["bad"] = lib.tp_torch_configure(b"backend=sim:2GiB,limt=1GiB", err, 256, key, 64)
out["bad_key"], out["bad_err"] = key.value.decode(), err.value.decode()
out["good"] = lib.tp_torch_configure(b"backend=sim:2GiB,limit=1GiB,log=off", err, 256, key, 64)
c = stats(-1)["tidepool_torch"]["config"]
out["config"] = [c["ok"], c["limit_bytes"], c["source"]]
p = alloc(4096, 0, None)
out["ptr"] = p is not None
out["late"] = lib.tp_torch_configure(b"limit=2GiB", err, 256, key, 64)
out["late_err"] = err.value.decode()
out["limit"] = stats(0)["pool"]["limit_bytes"]
print(json.dumps(out))
""", conf="bogus=1")
    check(r.returncode == 0, "configure: child failed: " + r.stderr[-1000:])
    if r.returncode == 0:
        o = json.loads(r.stdout.strip().splitlines()[-1])
        check(o["bad"] == -1 and o["bad_key"] == "limt" and "unknown key 'limt'" in o["bad_err"], "configure bad: %r" % o)
        check(o["good"] == 0 and o["config"] == [True, 1 << 30, "tp_torch_configure"], "configure good: %r" % o)
        check(o["ptr"] and o["late"] == -2 and "once a pool exists" in o["late_err"], "configure late: %r" % o)
        check(o["limit"] == 1 << 30, "configure: pool limit %r" % o["limit"])


def test_oom_modes():
    r = child(r"""
assert lib.tp_torch_alloc(1 << 20, 0, None) is None
assert lib.tp_torch_alloc(0, 0, None) is None
print("ok")
""", conf="log=off,oom=null")
    check(r.returncode == 0 and r.stdout.strip().endswith("ok"), "oom=null: rc=%d err=%s" % (r.returncode, r.stderr[-1000:]))
    r = child(r"""
assert lib.tp_torch_alloc(0, 0, None) is None  # size 0 never fails
lib.tp_torch_alloc(3 << 20, 0, None)
print("not reached")
""", conf="log=off,oom=abort")
    check(r.returncode != 0 and "not reached" not in r.stdout, "oom=abort: rc=%d" % r.returncode)
    check("tidepool-torch: CUDA out of memory. Tried to allocate 3.00 MiB on device 0: tidepool could not open cuda:0"
          in r.stderr and "aborting (oom=abort)" in r.stderr, "oom=abort: stderr %r" % r.stderr[-500:])


def test_exit_report_file():
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "stats-%p.json")
        r = child(r"""
import os
alloc(4096, 0, None)
print(os.getpid())
""", conf="log=off,stats=" + path)
        check(r.returncode == 0, "exit report: child failed: " + r.stderr[-1000:])
        if r.returncode != 0:
            return
        pid = r.stdout.strip().splitlines()[-1]
        f = os.path.join(d, "stats-%s.json" % pid)
        check(os.path.exists(f), "exit report: %s missing (%s)" % (f, os.listdir(d)))
        if os.path.exists(f):
            rep = json.load(open(f))
            check(rep["tidepool_torch"]["pid"] == int(pid), "exit report: pid")
            check(rep["devices"][0]["state"] == "failed", "exit report: device 0: %r" % rep["devices"])


def test_sim_backend():
    r = child(r"""
ptrs = [alloc(n, 0, None) for n in (1, 1000, 1 << 20, 300 << 20)]
assert all(p and p % 512 == 0 for p in ptrs), ptrs
assert len(set(ptrs)) == len(ptrs)
s = stats(0)
assert s["state"] == "active" and s["pool"]["allocs"] == 4, s
assert s["pool"]["kind"] == "vmm", s
assert s["pool"]["requested_bytes"]["current"] == 1 + 1000 + (1 << 20) + (300 << 20), s
assert alloc(3 << 30, 0, None) is None  # over limit=2GiB
for p, n in zip(ptrs, (1, 1000, 1 << 20, 300 << 20)):
    lib.tp_torch_free(p, n, 0, None)
lib.tp_torch_empty_cache()
s = stats(0)["pool"]
assert s["reserved_bytes"]["current"] == 0 and s["reserved_bytes"]["peak"] >= 300 << 20, s
assert s["ooms"] == 1, s
print("ok")
""", conf="backend=sim:8GiB,limit=2GiB,log=off")
    check(r.returncode == 0 and r.stdout.strip().endswith("ok"),
          "sim: rc=%d out=%s err=%s" % (r.returncode, r.stdout[-500:], r.stderr[-2000:]))


# A workload with sizes from 1 B to 64 MiB and frees in
# mixed order (seeded): the trace must give back the pool's peak exactly.
TRACE_WORKLOAD = r"""
import random
rng = random.Random(7)
live = []
for i in range(3000):
    if live and (rng.random() < 0.45 or len(live) > 200):
        p, n, s = live.pop(rng.randrange(len(live)))
        lib.tp_torch_free(p, n, 0, s)
    else:
        n = rng.choice([1, 512, 4096, 100000, 1 << 20, 3 << 20, 64 << 20]) + rng.randrange(1000)
        s = None  # the simulated device knows only its own streams (none made here)
        p = alloc(n, 0, s)
        assert p, n
        live.append((p, n, s))
for p, n, s in live[: len(live) // 2]:
    lib.tp_torch_free(p, n, 0, s)
"""


def test_trace():
    import gzip
    with tempfile.TemporaryDirectory() as d:
        for kind in ("vmm", "segment"):
            path = os.path.join(d, "trace-%s-%%p.csv.gz" % kind)
            r = child(TRACE_WORKLOAD + r"""
import os
s = stats(0)
print(json.dumps({"pid": os.getpid(), "peak": s["pool"]["requested_bytes"]["peak"], "trace": s["trace"],
                  "allocs": s["pool"]["allocs"], "frees": s["pool"]["frees"]}))
""", conf="backend=sim:64GiB,log=off,oom=null,kind=%s,trace=%s" % (kind, path))
            check(r.returncode == 0, "trace %s: child failed: %s" % (kind, r.stderr[-1500:]))
            if r.returncode != 0:
                continue
            o = json.loads(r.stdout.strip().splitlines()[-1])
            f = path.replace("%p", str(o["pid"]))
            check(o["trace"]["path"] == f and o["trace"]["open"] is True and o["trace"]["gzip"] is True,
                  "trace %s: stats %r" % (kind, o["trace"]))
            check(os.path.exists(f), "trace %s: %s missing" % (kind, f))
            if not os.path.exists(f):
                continue
            with gzip.open(f, "rt") as fh:  # complete gzip: closed at exit
                rows = fh.read().splitlines()
            check(rows[0] == "time_us,action,addr,size,stream", "trace %s: header %r" % (kind, rows[0]))
            acts = [row.split(",")[1] for row in rows[1:]]
            check(acts.count("alloc") == o["allocs"] and acts.count("free") == o["frees"],
                  "trace %s: %d/%d rows for %d/%d" % (kind, acts.count("alloc"), acts.count("free"), o["allocs"], o["frees"]))
            live = peak = 0
            sizes = {}
            times = []
            for row in rows[1:]:
                t, a, addr, n, stream = row.split(",")
                times.append(int(t))
                check(stream == "0", "trace %s: stream %r" % (kind, stream))
                if a == "alloc":
                    sizes[addr] = int(n)
                    live += int(n)
                    peak = max(peak, live)
                else:
                    live -= sizes.pop(addr)
            check(peak == o["peak"], "trace %s: peak from the rows %d, pool %d" % (kind, peak, o["peak"]))
            check(times == sorted(times), "trace %s: time goes backwards" % kind)
            if TIDE:
                rr = subprocess.run([TIDE, "replay", f, "--json", "--pool", kind, "--device",
                                     "sim:64GiB" + (",novmm" if kind == "segment" else "")],
                                    capture_output=True, text=True, timeout=120)
                check(rr.returncode == 0, "trace %s: tide replay failed: %s" % (kind, rr.stderr[-500:]))
                if rr.returncode == 0:
                    res = json.loads(rr.stdout.strip().splitlines()[-1])["result"]
                    check(res["peak_live_bytes"] == o["peak"] and res["errors"] == 0 and res["pool"] == kind,
                          "trace %s: replay peak %d, pool peak %d (%r)" % (kind, res["peak_live_bytes"], o["peak"], res))
    # an unwritable path: one line, no trace, allocations still work
    r = child(r"""
assert alloc(4096, 0, None)
print(json.dumps(stats(0)["trace"]))
""", conf="backend=sim,oom=null,trace=/nonexistent-dir/t.csv.gz")
    check(r.returncode == 0 and "cannot create /nonexistent-dir/t.csv.gz" in r.stdout and "not recording" in r.stderr,
          "trace unwritable: rc=%d out=%s err=%s" % (r.returncode, r.stdout[-300:], r.stderr[-300:]))


for t in [test_trace, test_exports, test_no_device, test_no_device_logs, test_config_good, test_config_bad, test_configure_call,
          test_oom_modes, test_exit_report_file, test_sim_backend]:
    t()
    print("%s: %s" % (t.__name__, "done"), flush=True)
print("FAILED (%d)" % len(failures) if failures else "all ok")
sys.exit(1 if failures else 0)
