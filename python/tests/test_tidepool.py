#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test_tidepool.py [--tide PATH] -- the tidepool Python package without a GPU.

Standard library only (unittest; pytest not needed). Runs against the
installed package, or, with PYTHONPATH=python and TIDEPOOL_TORCH_LIB=
build/libtidepool_torch.so, against the build tree. Pools run on tidepool's
simulated device (backend=sim); torch is replaced by a stand-in module where
enable()/mem_pool() are tested. Every case that configures the library runs
in a fresh python process (the library is configured once per process).
Prints "N passed, M failed" and exits non-zero on failure.

  - import without torch and without a GPU; __version__ from one place
  - configuration: ValueError (ConfigError) naming the key, for arguments
    and for TIDEPOOL_TORCH_CONF (refused as a whole, never silently dropped)
  - stats / memory_summary / metrics (valid Prometheus text) / snapshot /
    trim / reset_peak_stats / empty_cache on the simulated device
  - trace=: a gzip CSV trace; `tide replay` (with --tide) through the same
    pool kind reproduces the pool's peak live bytes exactly
  - enable() and mem_pool() against a stand-in torch: the allocator names,
    the message when PyTorch's allocator was already used, the
    out-of-memory helper's absence reported
  - the out-of-memory helper builder against stand-in c10 headers
"""
import gzip
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
TIDE = None


def run_child(code, conf=None, env=None, pythonpath=None, timeout=120):
    e = dict(os.environ)
    e.pop("TIDEPOOL_TORCH_CONF", None)
    e["CUDA_VISIBLE_DEVICES"] = ""  # never a real GPU, even on a GPU machine
    if conf is not None:
        e["TIDEPOOL_TORCH_CONF"] = conf
    if pythonpath:
        e["PYTHONPATH"] = os.pathsep.join([pythonpath] + ([e["PYTHONPATH"]] if e.get("PYTHONPATH") else []))
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=e, capture_output=True, text=True,
                          timeout=timeout)


def last_json(r):
    return json.loads(r.stdout.strip().splitlines()[-1])


# A stand-in for torch: records what tidepool.torch asks of it.
FAKE_TORCH = r'''
import os, types
__version__ = "0.0.0+fake"
calls = []
class _C:
    _GLIBCXX_USE_CXX11_ABI = True
class CUDAPluggableAllocator:
    def __init__(self, path, alloc_fn_name, free_fn_name):
        calls.append(["CUDAPluggableAllocator", path, alloc_fn_name, free_fn_name])
        self.alloc_fn_name = alloc_fn_name
    def allocator(self):
        return ("raw-allocator", self.alloc_fn_name)
def change_current_allocator(allocator):
    if os.environ.get("FAKE_TORCH_ALLOCATOR_USED"):
        raise RuntimeError("Can't swap an already initialized allocator")
    calls.append(["change_current_allocator", allocator.alloc_fn_name])
def _mem_pool(raw):
    calls.append(["MemPool", raw[1]])
    return ("MemPool", raw)
cuda = types.SimpleNamespace(
    memory=types.SimpleNamespace(CUDAPluggableAllocator=CUDAPluggableAllocator,
                                 change_current_allocator=change_current_allocator),
    MemPool=_mem_pool, use_mem_pool=lambda pool: None,
    memory_allocated=lambda: 123456, memory_stats=lambda: {"allocation.all.current": 3},
    is_initialized=lambda: False, empty_cache=lambda: None)
'''


class Import(unittest.TestCase):
    def test_import_without_torch(self):
        r = run_child("""
            import sys, json, tidepool, tidepool.torch
            print(json.dumps({"version": tidepool.__version__, "torch": "torch" in sys.modules,
                              "lib": tidepool.library_path(), "exists": __import__("os").path.exists(tidepool.library_path())}))
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        self.assertFalse(o["torch"], "importing tidepool.torch imported torch")
        self.assertTrue(o["exists"], o)
        self.assertTrue(o["lib"].endswith("libtidepool_torch.so"))
        # the version: written once, in tidepool/_version.py
        src = os.path.join(HERE, "..", "tidepool", "_version.py")
        want = re.search(r'__version__ = "([^"]+)"', open(src).read()).group(1)
        self.assertEqual(o["version"], want)
        self.assertEqual(want, "0.1.0")

    def test_installed_layout(self):
        # Installed (not the build tree): the library is inside the package.
        if os.environ.get("TIDEPOOL_TORCH_LIB"):
            self.skipTest("build-tree run (TIDEPOOL_TORCH_LIB set)")
        r = run_child("import os, tidepool; print(os.path.dirname(tidepool.library_path()) == "
                      "os.path.dirname(tidepool.__file__))")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "True")


class Config(unittest.TestCase):
    def bad(self, call, conf=None, key=None, contains=()):
        r = run_child("""
            import json, tidepool.torch as tt
            from tidepool import _shim
            try:
                %s
                print(json.dumps({"raised": None}))
            except ValueError as e:
                print(json.dumps({"raised": type(e).__name__, "key": getattr(e, "key", None), "msg": str(e)}))
        """ % call, conf=conf)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        self.assertEqual(o["raised"], "ConfigError", o)
        self.assertEqual(o["key"], key, o)
        for c in contains:
            self.assertIn(c, o["msg"])
        return o

    def test_bad_arguments(self):
        # configure() is what enable() and mem_pool() call first.
        cases = [("tt._apply_config({'limt': '1GiB'})", "limt", ["unknown configuration key 'limt'"]),
                 ("tt._apply_config({'limit': '70XB'})", "limit", ["'limit=70XB'", "expected a size"]),
                 ("tt._apply_config({'limit': 1.5})", "limit", []),
                 ("tt._apply_config({'kind': 'foo'})", "kind", ["kind=foo"]),
                 ("tt._apply_config({'idle_release_ms': -1})", "idle_release_ms", []),
                 ("tt._apply_config({'trace': '/tmp/a,b.csv'})", "trace", ["comma"]),
                 ("tt._apply_config({'release_threshold': True})", "release_threshold", [])]
        for call, key, contains in cases:
            with self.subTest(call=call):
                self.bad(call, key=key, contains=contains)

    def test_env_refused(self):
        # A typo in TIDEPOOL_TORCH_CONF: refused as a whole (the limit is
        # not silently dropped); the API names the item and where it came from.
        conf = "backend=sim:4GiB,limt=1GiB,log=off"
        o = self.bad("tt._apply_config({})", conf=conf, key="limt",
                     contains=["'limt=1GiB'", "TIDEPOOL_TORCH_CONF", "no pool is created"])
        # arguments on top of it: still refused, naming the environment's item
        self.bad("tt._apply_config({'limit': '2GiB'})", conf=conf, key="limt", contains=["TIDEPOOL_TORCH_CONF"])
        r = run_child("""
            import json, tidepool.torch as tt
            from tidepool import _shim
            p = _shim.lib().tp_torch_try_alloc(4096, 0, None)
            print(json.dumps({"ptr": p, "state": tt.stats(0)["state"], "config": tt.config()}))
        """, conf=conf)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        self.assertIsNone(o["ptr"])
        self.assertEqual(o["state"], "failed")
        self.assertEqual([o["config"]["ok"], o["config"]["bad_key"]], [False, "limt"])
        self.assertIn("limt", r.stderr)  # the library's one line at load

    def test_env_merged(self):
        # Arguments override the environment's items with the same key.
        r = run_child("""
            import json, tidepool.torch as tt
            tt._apply_config({"limit": "2GiB", "kind": "segment"})
            print(json.dumps(tt.config()))
        """, conf="backend=sim:4GiB,limit=1GiB,log=off")
        self.assertEqual(r.returncode, 0, r.stderr)
        c = last_json(r)
        self.assertEqual([c["ok"], c["limit_bytes"], c["kind"], c["backend"], c["source"]],
                         [True, 2 << 30, "segment", "sim", "tp_torch_configure"])


SIM = "backend=sim:16GiB,limit=4GiB,log=off,oom=null"


class Stats(unittest.TestCase):
    def test_stats_summary_metrics_snapshot(self):
        r = run_child("""
            import json, tidepool.torch as tt
            from tidepool import _shim
            L = _shim.lib()
            sizes = [1000, 1 << 20, 300 << 20, 5 << 20]
            ptrs = [L.tp_torch_try_alloc(n, 0, None) for n in sizes]
            assert all(ptrs), ptrs
            oom = L.tp_torch_try_alloc(8 << 30, 0, None)  # over the limit
            out = {"oom": oom, "stats": tt.stats(0), "all": tt.stats(None), "summary": tt.memory_summary(0),
                   "metrics": tt.metrics(), "snapshot": tt.snapshot(0), "devices": tt.devices(),
                   "none": tt.snapshot(3)}
            for p, n in zip(ptrs[2:], sizes[2:]):
                L.tp_torch_free(p, n, 0, None)
            out["reserved_before_trim"] = tt.stats(0)["pool"]["reserved_bytes"]["current"]
            out["released"] = tt.trim(0)
            out["after_trim"] = tt.stats(0)["pool"]
            out["reset"] = tt.reset_peak_stats()
            out["after_reset"] = tt.stats(0)["pool"]["requested_bytes"]
            tt.empty_cache()
            print(json.dumps(out))
        """, conf=SIM)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        s = o["stats"]
        self.assertEqual(s["state"], "active")
        self.assertEqual(s["pool"]["requested_bytes"]["current"], 1000 + (1 << 20) + (300 << 20) + (5 << 20))
        self.assertEqual(s["pool"]["limit_bytes"], 4 << 30)
        self.assertEqual(o["all"]["tidepool_torch"]["config"]["limit_bytes"], 4 << 30)
        self.assertEqual(o["devices"], [0])
        self.assertIsNone(o["none"])
        self.assertIsNone(o["oom"])
        for word in ("Requested memory", "Reserved memory", "Limit: 4.00 GiB", "OOMs: 1"):
            self.assertIn(word, o["summary"])
        # snapshot: the memory map, every live block listed
        live = [x for x in o["snapshot"]["ranges"] if x["state"] == "live"]
        self.assertEqual(sorted(x["requested"] for x in live), sorted([1000, 1 << 20, 300 << 20, 5 << 20]))
        # trim released the idle memory; the peaks stay until reset
        self.assertGreater(o["released"], 0)
        self.assertLess(o["after_trim"]["reserved_bytes"]["current"], o["reserved_before_trim"])
        self.assertEqual(o["reset"], 1)
        self.assertEqual(o["after_reset"]["peak"], o["after_reset"]["current"])
        check_exposition(self, o["metrics"])
        self.assertIn('tidepool_pool_requested_bytes{device="sim:0",kind="vmm"}', o["metrics"])

    def test_metrics_merge(self):
        # Two pools' texts become one exposition: one HELP/TYPE per family.
        sys.path.insert(0, os.path.join(HERE, ".."))
        try:
            from tidepool._shim import merge_expositions
        finally:
            sys.path.pop(0)
        a = "# HELP x_total x\n# TYPE x_total counter\nx_total{device=\"cuda:0\"} 1\n# HELP y y\n# TYPE y gauge\ny{device=\"cuda:0\"} 2\n"
        b = a.replace("cuda:0", "cuda:1")
        m = merge_expositions([a, b])
        self.assertEqual(m.count("# HELP x_total"), 1)
        self.assertLess(m.index('x_total{device="cuda:1"}'), m.index("# HELP y"))
        check_exposition(self, m)


def check_exposition(test, text):
    """Prometheus text: each family's HELP and TYPE once, before its
    samples, samples of a family together, numeric values."""
    seen_families, current = set(), None
    samples = set()
    for line in text.splitlines():
        if not line:
            continue
        if line.startswith("# "):
            kind, name = line.split()[1:3]
            test.assertIn(kind, ("HELP", "TYPE"))
            if name != current:
                test.assertNotIn(name, seen_families, "family %s split" % name)
                seen_families.add(name)
                current = name
            continue
        m = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$", line)
        test.assertIsNotNone(m, line)
        test.assertTrue(m.group(1) == current or m.group(1).startswith(current), line)
        float(m.group(3))
        test.assertNotIn(m.group(1) + (m.group(2) or ""), samples, "duplicate sample " + line)
        samples.add(m.group(1) + (m.group(2) or ""))
    test.assertTrue(samples)


WORKLOAD = """
import random
from tidepool import _shim
L = _shim.lib()
rng = random.Random(11)
live = []
for i in range(4000):
    if live and (rng.random() < 0.47 or len(live) > 300):
        p, n = live.pop(rng.randrange(len(live)))
        L.tp_torch_free(p, n, 0, None)
    else:
        n = rng.choice([1, 511, 4096, 65536, 1 << 20, 7 << 20, 96 << 20]) + rng.randrange(4096)
        p = L.tp_torch_try_alloc(n, 0, None)
        assert p, n
        live.append((p, n))
"""


class Trace(unittest.TestCase):
    def test_trace_replay(self):
        tmp = tempfile.mkdtemp(prefix="tidepool-trace-")
        try:
            for kind in ("vmm", "segment"):
                with self.subTest(kind=kind):
                    pattern = os.path.join(tmp, "t-%s-%%p-%%d.csv.gz" % kind)
                    setup = ("import json, tidepool.torch as tt\n"
                             "tt._apply_config({'backend': 'sim:64GiB', 'kind': %r, 'trace': %r, 'log': 'off', "
                             "'oom': 'null'})\n" % (kind, pattern))
                    r = run_child(setup + WORKLOAD + """
pool = tt.stats(0)["pool"]
paths = tt.stop_trace()
# after stop_trace: still allocating, no longer recorded
p = L.tp_torch_try_alloc(4096, 0, None)
print(json.dumps({"paths": paths, "peak": pool["requested_bytes"]["peak"], "allocs": pool["allocs"],
                  "frees": pool["frees"], "trace": tt.stats(0)["trace"]}))
""")
                    self.assertEqual(r.returncode, 0, r.stderr)
                    o = last_json(r)
                    path = o["paths"]["0"]
                    self.assertRegex(path, r"t-%s-\d+-0\.csv\.gz$" % kind)
                    self.assertFalse(o["trace"]["open"])
                    with gzip.open(path, "rt") as f:
                        rows = f.read().splitlines()
                    self.assertEqual(rows[0], "time_us,action,addr,size,stream")
                    actions = [x.split(",")[1] for x in rows[1:]]
                    self.assertEqual((actions.count("alloc"), actions.count("free")), (o["allocs"], o["frees"]))
                    if TIDE:
                        device = "sim:64GiB" + (",novmm" if kind == "segment" else "")
                        rr = subprocess.run([TIDE, "replay", path, "--json", "--pool", kind, "--device", device],
                                            capture_output=True, text=True, timeout=120)
                        self.assertEqual(rr.returncode, 0, rr.stderr)
                        res = json.loads(rr.stdout.strip().splitlines()[-1])["result"]
                        self.assertEqual(res["peak_live_bytes"], o["peak"])
                        self.assertEqual((res["errors"], res["unknown_frees"], res["pool"]), (0, 0, kind))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class TorchStandIn(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="tidepool-faketorch-")
        os.makedirs(os.path.join(self.dir, "torch"))
        with open(os.path.join(self.dir, "torch", "__init__.py"), "w") as f:
            f.write(FAKE_TORCH)
        self.env = {"TIDEPOOL_CACHE_DIR": os.path.join(self.dir, "cache"), "TIDEPOOL_OOM_HELPER": "auto"}

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_enable(self):
        r = run_child("""
            import json, warnings, torch, tidepool, tidepool.torch as tt
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                a = tt.enable(limit="1GiB", backend="sim:4GiB", log="off")
            again = tt.enable(limit="1GiB", backend="sim:4GiB", log="off") is a
            try:
                tt.enable(limit="2GiB", backend="sim:4GiB", log="off")
                other = None
            except RuntimeError as e:
                other = str(e)
            pool = tt.mem_pool()
            print(json.dumps({"calls": torch.calls, "lib": tidepool.library_path(), "again": again, "other": other,
                              "enabled": tt.is_enabled(), "limit": tt.config()["limit_bytes"], "pool": pool,
                              "warnings": [str(x.message) for x in w], "oom": tt.oom_handler_status()}))
        """, pythonpath=self.dir, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        self.assertEqual(o["calls"][0], ["CUDAPluggableAllocator", o["lib"], "tp_torch_alloc", "tp_torch_free"])
        self.assertEqual(o["calls"][1], ["change_current_allocator", "tp_torch_alloc"])
        # mem_pool: a MemPool over an allocator that never throws
        self.assertEqual(o["calls"][2], ["CUDAPluggableAllocator", o["lib"], "tp_torch_try_alloc", "tp_torch_free"])
        self.assertEqual(o["calls"][3], ["MemPool", "tp_torch_try_alloc"])
        self.assertTrue(o["again"] and o["enabled"])
        self.assertIn("already called with another configuration", o["other"])
        self.assertEqual(o["limit"], 1 << 30)
        # the stand-in has no c10 headers: no helper, and enable() says so
        self.assertTrue(o["oom"].startswith("missing"), o["oom"])
        self.assertTrue(any("RuntimeError, not torch.cuda.OutOfMemoryError" in x for x in o["warnings"]), o)

    def test_enable_too_late(self):
        r = run_child("""
            import json, tidepool.torch as tt
            try:
                tt.enable(backend="sim", log="off")
                print(json.dumps({"msg": None}))
            except RuntimeError as e:
                print(json.dumps({"msg": str(e), "enabled": tt.is_enabled()}))
        """, pythonpath=self.dir, env=dict(self.env, FAKE_TORCH_ALLOCATOR_USED="1"))
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        self.assertIsNotNone(o["msg"])
        for part in ("came after PyTorch's own CUDA allocator was used", "120.56 KiB in 3 allocations",
                     "Move `tidepool.torch.enable(...)` to the top", "tidepool.torch.mem_pool()"):
            self.assertIn(part, o["msg"])
        self.assertFalse(o["enabled"])

    def test_enable_bad_config(self):
        r = run_child("""
            import json, tidepool.torch as tt, torch
            try:
                tt.enable(limit="lots")
            except ValueError as e:
                print(json.dumps({"key": e.key, "calls": torch.calls}))
        """, pythonpath=self.dir, env=self.env)
        self.assertEqual(r.returncode, 0, r.stderr)
        o = last_json(r)
        self.assertEqual(o, {"key": "limit", "calls": []})  # nothing swapped


HEADER = r'''
#include <stdexcept>
#include <string>
namespace c10 {
struct SourceLocation { const char *function; const char *file; unsigned line; };
struct OutOfMemoryError : std::runtime_error {
    OutOfMemoryError(SourceLocation, const std::string &m) : std::runtime_error(m) {}
};
}
#define C10_THROW_ERROR(t, m) throw ::c10::t({__func__, __FILE__, __LINE__}, m)
'''


class OomHelperBuild(unittest.TestCase):
    def test_build_against_stand_in_headers(self):
        cxx = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
        cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
        if not cxx or not cc:
            self.skipTest("no C/C++ compiler")
        sys.path.insert(0, os.path.join(HERE, "..", "tidepool"))
        try:
            import _oom_build
        finally:
            sys.path.pop(0)
        tmp = tempfile.mkdtemp(prefix="tidepool-oom-")
        try:
            os.makedirs(os.path.join(tmp, "torch", "include", "c10", "util"))
            os.makedirs(os.path.join(tmp, "torch", "lib"))
            with open(os.path.join(tmp, "torch", "include", "c10", "util", "Exception.h"), "w") as f:
                f.write(HEADER)
            empty = os.path.join(tmp, "empty.c")
            open(empty, "w").write("int c10_stand_in;\n")
            subprocess.check_call([cc, "-shared", "-fPIC", empty, "-o", os.path.join(tmp, "torch", "lib", "libc10.so")])
            out = os.path.join(tmp, "out", _oom_build.HELPER_NAME)
            ok, log = _oom_build.build(os.path.join(tmp, "torch"), "9.9.9", True, out, cxx=cxx)
            self.assertTrue(ok, log)
            self.assertEqual(_oom_build.read_stamp(out), "torch-9.9.9-abi1")
            r = run_child("import ctypes, sys; h = ctypes.CDLL(sys.argv[1]); print(bool(h.tp_torch_oom_throw))"
                          .replace("sys.argv[1]", repr(out)))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.strip(), "True")
            bad, log = _oom_build.build(os.path.join(tmp, "nowhere"), "9.9.9", True, out + "2", cxx=cxx)
            self.assertFalse(bad)
            self.assertIn("no c10 headers", log)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Result(unittest.TextTestResult):
    pass


def main():
    global TIDE
    args = sys.argv[1:]
    if "--tide" in args:
        i = args.index("--tide")
        TIDE = os.path.abspath(args[i + 1])
        del args[i:i + 2]
    suite = unittest.defaultTestLoader.loadTestsFromModule(sys.modules[__name__])
    if args:
        suite = unittest.TestSuite(t for t in iter_tests(suite) if any(a in t.id() for a in args))
    result = unittest.TextTestRunner(verbosity=2, resultclass=Result).run(suite)
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    passed = result.testsRun - failed - skipped
    print("%d passed, %d failed%s%s" % (passed, failed, ", %d skipped" % skipped if skipped else "",
                                        "" if TIDE else " (no --tide: replay not checked)"))
    return 1 if failed or result.testsRun == 0 else 0


def iter_tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from iter_tests(t)
        else:
            yield t


if __name__ == "__main__":
    sys.exit(main())
