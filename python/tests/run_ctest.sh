#!/bin/sh
# SPDX-License-Identifier: MIT
# run_ctest.sh dev LIB.so SANITIZED [TIDE]
#     the package's tests against the build tree (PYTHONPATH=python,
#     TIDEPOOL_TORCH_LIB=LIB.so)
# run_ctest.sh install WORKDIR SANITIZED [TIDE]
#     installs the package as a user would, offline -- a venv with the
#     system's site packages (setuptools, wheel), then
#     `pip install --no-build-isolation` of a copy of python/ (CMake builds
#     the library) -- and runs the tests against the installed package.
# Exit 77 (CTest SKIP_RETURN_CODE) when no suitable python3 is found, or
# in a sanitizer build (python3 cannot dlopen a sanitized library; the C
# tests cover the shim there).
set -u
mode=$1 arg=$2 sanitized=$3
tide=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
pkg=$(dirname "$here")
root=$(dirname "$pkg")
if [ "$sanitized" = 1 ]; then
  echo "SKIP: sanitizer build"
  exit 77
fi
tide_args=
[ -n "$tide" ] && tide_args="--tide $tide"

case "$mode" in
dev)
  py=$(command -v python3 || true)
  if [ -z "$py" ]; then echo "SKIP: python3 not found"; exit 77; fi
  PYTHONPATH="$pkg" TIDEPOOL_TORCH_LIB="$arg" exec "$py" "$here/test_tidepool.py" $tide_args
  ;;
install)
  # A python3 that can make a venv with pip, and has setuptools and wheel
  # (Debian: python3-venv python3-setuptools python3-wheel).
  py=
  for cand in /usr/bin/python3 python3; do
    p=$(command -v "$cand" 2>/dev/null) || continue
    # (wheel: setuptools before 70.1 needs it to build a wheel)
    if "$p" -c "import setuptools, venv, ensurepip, importlib.util as u
v = tuple(int(x) for x in setuptools.__version__.split('.')[:2])
assert v >= (61, 0) and (u.find_spec('wheel') or v >= (70, 1))" >/dev/null 2>&1; then py=$p; break; fi
  done
  if [ -z "$py" ]; then
    echo "SKIP: no python3 with setuptools, wheel, venv and ensurepip (apt-get install python3-venv python3-setuptools python3-wheel)"
    exit 77
  fi
  rm -rf "$arg"
  mkdir -p "$arg/src"
  # a copy of python/ (not its build/ or egg-info): pip builds in the
  # source directory, and two builds must not share one
  (cd "$pkg" && tar cf - --exclude=./build --exclude='*.egg-info' --exclude=__pycache__ .) | (cd "$arg/src" && tar xf -)
  "$py" -m venv --system-site-packages "$arg/venv" || { echo "FAIL: python3 -m venv"; exit 1; }
  PIP_DISABLE_PIP_VERSION_CHECK=1 TIDEPOOL_SOURCE_DIR="$root" \
    "$arg/venv/bin/pip" install --no-index --no-build-isolation "$arg/src" || { echo "FAIL: pip install"; exit 1; }
  cd "$arg" || exit 1
  env -u TIDEPOOL_TORCH_LIB -u PYTHONPATH "$arg/venv/bin/python" "$here/test_tidepool.py" $tide_args
  ;;
*)
  echo "usage: run_ctest.sh dev|install ..." >&2
  exit 2
  ;;
esac
