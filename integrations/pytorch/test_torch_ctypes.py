"""test_torch_ctypes.py LIB.so -- the PyTorch shim as PyTorch loads it (ctypes).

Standard library only; no torch, no GPU needed. Each case runs in a fresh
python3 process because the shim reads TIDEPOOL_TORCH_CONF once, at load.
  - loading with ctypes, the exported names, tidepool's own names hidden
  - no CUDA device (CUDA_VISIBLE_DEVICES= hides any): NULL, no crash,
    also with allocations from 8 threads at once
  - TIDEPOOL_TORCH_CONF: good values are applied, each bad one prints one
    line on stderr and leaves the defaults
  - the exit report (stats=FILE with %p, stats=-), log forwarding
  - oom=null: tp_torch_alloc itself returns NULL; oom=abort: aborts with
    the report (the default, oom=raise, throws: C++ callers only, see
    test_torch_raise.cpp)
  - the simulated device behind the same entry points (backend=sim)
"""
import json
import os
import subprocess
import sys
import tempfile

LIB = os.path.abspath(sys.argv[1])
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
             "tp_torch_reset_peaks", "tp_torch_stats_json"]:
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
            "align=1KiB,tick_ms=250,va_reserve=1.5TiB,page=2MiB,max_map=512MB")
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
                  page_bytes=2 << 20, max_map_bytes=512000000, log="warn", stats="-")
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
    bad = ["kind=foo", "limit=70XB", "limit=", "limit=-1GiB", "limit=0x10", "limit=1e9", "limit=150%", "limit=0%",
           "bogus=1", "limit=1GiB,limit=2GiB", "align=300", "align=128", "idle_release_ms=-5", "idle_release_ms=1.5",
           "log=loud", "release_threshold=lots", "kind", "kind=vmm,,limit=1GiB", "tick_ms=abc",
           "limit=99999999999999999999", "page=3MiB", "backend=rocm", "limit=1.5", "oom=maybe"]
    for conf in bad:
        r = child('print(json.dumps(stats(-1)["tidepool_torch"]["config"]))', conf=conf)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        check(r.returncode == 0, "config %r: child failed: %s" % (conf, r.stderr[-1000:]))
        check(len(lines) == 1 and lines[0].startswith("tidepool-torch: TIDEPOOL_TORCH_CONF=")
              and lines[0].endswith("using the defaults"), "config %r: stderr %r" % (conf, lines))
        if r.returncode == 0:
            c = json.loads(r.stdout.strip().splitlines()[-1])
            check(c["ok"] is False and c["kind"] == "auto" and c["limit_bytes"] is None and c["align"] == 512
                  and c["log"] == "warn", "config %r: not the defaults: %r" % (conf, c))


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


for t in [test_exports, test_no_device, test_no_device_logs, test_config_good, test_config_bad,
          test_oom_modes, test_exit_report_file, test_sim_backend]:
    t()
    print("%s: %s" % (t.__name__, "done"), flush=True)
print("FAILED (%d)" % len(failures) if failures else "all ok")
sys.exit(1 if failures else 0)
