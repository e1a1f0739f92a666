# SPDX-License-Identifier: MIT
"""Builds _tidepool_oom.so, the out-of-memory handler that throws
c10::OutOfMemoryError (so that PyTorch raises torch.cuda.OutOfMemoryError),
against an installed torch's headers and libc10.so -- as a torch C++
extension would be. Used by setup.py at install time (when torch is
importable there) and, if the helper is missing or was built for another
torch version, by tidepool.torch.enable() into a cache directory.

Standard library only; torch is located from its module, not imported here.
"""
import os
import re
import shutil
import subprocess
import sys
import sysconfig

HELPER_NAME = "_tidepool_oom.so"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_oom.cpp")


def torch_tag(torch_version, cxx11_abi):
    """What a helper must match: torch's version and its C++ ABI flag."""
    return "torch-%s-abi%d" % (torch_version, int(bool(cxx11_abi)))


def stamp_path(so_path):
    return so_path + ".tag"


def read_stamp(so_path):
    try:
        with open(stamp_path(so_path)) as f:
            return f.read().strip()
    except OSError:
        return None


def build(torch_dir, torch_version, cxx11_abi, out_path, cxx=None, verbose=False):
    """Compiles SOURCE into out_path. torch_dir: the torch package directory
    (with include/ and lib/). Returns (ok, log)."""
    cxx = cxx or os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if not cxx:
        return False, "no C++ compiler found (set CXX)"
    include = os.path.join(torch_dir, "include")
    libdir = os.path.join(torch_dir, "lib")
    if not os.path.isdir(os.path.join(include, "c10")):
        return False, "%s has no c10 headers" % include
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    tmp = out_path + ".tmp%d" % os.getpid()
    log = []
    for std in ("c++17", "c++20"):
        cmd = [cxx, "-std=" + std, "-O2", "-fPIC", "-shared", "-fvisibility=hidden",
               "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(bool(cxx11_abi)), "-I", include,
               SOURCE, "-o", tmp, "-L", libdir, "-lc10", "-Wl,-rpath," + libdir]
        r = subprocess.run(cmd, capture_output=True, text=True)
        log.append("$ " + " ".join(cmd) + "\n" + r.stdout + r.stderr)
        if r.returncode == 0:
            os.replace(tmp, out_path)
            with open(stamp_path(out_path), "w") as f:
                f.write(torch_tag(torch_version, cxx11_abi) + "\n")
            return True, "\n".join(log)
    try:
        os.unlink(tmp)
    except OSError:
        pass
    return False, "\n".join(log)


def cache_dir():
    base = os.environ.get("TIDEPOOL_CACHE_DIR")
    if base:
        return base
    xdg = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(xdg, "tidepool")


def cached_path(torch_version, cxx11_abi):
    tag = re.sub(r"[^A-Za-z0-9_.+-]", "_", torch_tag(torch_version, cxx11_abi))
    py = sysconfig.get_config_var("SOABI") or "py%d%d" % sys.version_info[:2]
    return os.path.join(cache_dir(), "oom-%s-%s.so" % (tag, py))
