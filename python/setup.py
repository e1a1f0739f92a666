# SPDX-License-Identifier: MIT
"""setup.py -- the tidepool Python package.

Building runs CMake on the repository this directory belongs to (python/..,
or $TIDEPOOL_SOURCE_DIR) and builds the PyTorch shim only (target
tidepool_torch; no tests, no tools): libtidepool_torch.so goes into the
package. No CUDA toolkit is needed (tidepool loads the driver at run time).
If torch is importable here (pip --no-build-isolation in an environment
with torch), the out-of-memory helper _tidepool_oom.so is built against its
headers too; otherwise tidepool.torch.enable() builds it on first use (a C++
compiler is needed then), or out of memory raises RuntimeError.

Environment: TIDEPOOL_SOURCE_DIR, TIDEPOOL_CMAKE_ARGS (extra -D options),
TIDEPOOL_OOM_HELPER=0 (do not build the helper), CMAKE_GENERATOR.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


def read_version():
    with open(os.path.join(HERE, "tidepool", "_version.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def source_dir():
    root = os.environ.get("TIDEPOOL_SOURCE_DIR") or os.path.dirname(HERE)
    if not os.path.exists(os.path.join(root, "integrations", "pytorch", "CMakeLists.txt")):
        sys.exit("tidepool: the C sources are not at %s (build from the repository checkout, "
                 "`pip install ./python`, or set TIDEPOOL_SOURCE_DIR)" % root)
    return root


class BuildWithCMake(build_py):
    def run(self):
        super().run()
        out_dir = os.path.join(self.build_lib, "tidepool")
        os.makedirs(out_dir, exist_ok=True)
        build_temp = os.path.join(self.get_finalized_command("build").build_temp, "cmake")
        self.build_shim(build_temp, out_dir)
        self.build_oom_helper(out_dir)

    def build_shim(self, build_temp, out_dir):
        cmake = shutil.which("cmake")
        if not cmake:
            sys.exit("tidepool: cmake not found (apt-get install cmake)")
        args = [cmake, "-S", source_dir(), "-B", build_temp, "-DCMAKE_BUILD_TYPE=Release",
                "-DTP_BUILD_TESTS=OFF", "-DTP_BUILD_TOOLS=OFF", "-DTP_BUILD_TORCH_SHIM=ON", "-DTP_WERROR=OFF",
                "-Wno-dev"]
        if not os.environ.get("CMAKE_GENERATOR") and shutil.which("ninja") and \
                not os.path.exists(os.path.join(build_temp, "CMakeCache.txt")):
            args += ["-G", "Ninja"]
        args += shlex.split(os.environ.get("TIDEPOOL_CMAKE_ARGS", ""))
        self.announce("tidepool: " + " ".join(args), level=2)
        subprocess.check_call(args)
        subprocess.check_call([cmake, "--build", build_temp, "--target", "tidepool_torch", "--parallel",
                               str(os.cpu_count() or 2)])
        lib = os.path.join(build_temp, "libtidepool_torch.so")
        if not os.path.exists(lib):
            sys.exit("tidepool: the build did not produce %s" % lib)
        shutil.copy2(lib, os.path.join(out_dir, "libtidepool_torch.so"))

    def build_oom_helper(self, out_dir):
        if os.environ.get("TIDEPOOL_OOM_HELPER", "auto") == "0":
            return
        probe = ("import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__); "
                 "print(int(getattr(torch._C, '_GLIBCXX_USE_CXX11_ABI', True)))")
        r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
        if r.returncode != 0:
            print("tidepool: torch is not importable while building (pip without --no-build-isolation, or no "
                  "torch yet): the out-of-memory helper will be built by tidepool.torch.enable() on first use")
            return
        torch_dir, version, abi = r.stdout.split()[-3:]
        sys.path.insert(0, os.path.join(HERE, "tidepool"))
        try:
            import _oom_build
        finally:
            sys.path.pop(0)
        ok, log = _oom_build.build(torch_dir, version, int(abi), os.path.join(out_dir, _oom_build.HELPER_NAME))
        if not ok:
            print("tidepool: could not build the out-of-memory helper against torch %s:\n%s" % (version, log))


class BinaryDistribution(Distribution):
    """The wheel holds a native library: platform-specific."""

    def has_ext_modules(self):
        return True


setup(
    name="tidepool",
    version=read_version(),
    description="tidepool: a GPU device-memory manager, as a pluggable CUDA allocator for PyTorch",
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.8",
    packages=find_packages(include=["tidepool", "tidepool.*"]),
    package_data={"tidepool": ["_oom.cpp"]},
    distclass=BinaryDistribution,
    cmdclass={"build_py": BuildWithCMake},
    zip_safe=False,
)
