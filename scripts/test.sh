#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds tidepool and runs its whole test suite.
#   scripts/test.sh          the suite (GPU tests skip, and say so, without a GPU)
#   scripts/test.sh asan     ... under AddressSanitizer + UndefinedBehaviorSanitizer
#   scripts/test.sh tsan     ... under ThreadSanitizer
#   scripts/test.sh all      all three
# Build directories: build, build-asan, build-tsan (the demo uses build-demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh test
jobs=$(nproc 2>/dev/null || echo 2)

run_suite() { # name, build dir, extra cmake args...
  local name=$1 dir=$2
  shift 2
  echo "== $name: configure and build in $dir"
  cmake -S . -B "$dir" -G Ninja -DTP_BUILD_TESTS=ON -DTP_BUILD_TOOLS=ON -DTP_BUILD_TORCH_SHIM=ON -DTP_BUILD_GGML_ADAPTER=ON "$@" >/dev/null
  cmake --build "$dir"
  echo "== $name: ctest"
  ctest --test-dir "$dir" --output-on-failure -j "$jobs"
}

mode=${1:-default}
case "$mode" in default|asan|tsan|all) ;; *) echo "usage: scripts/test.sh [default|asan|tsan|all]" >&2; exit 2 ;; esac
if [ "$mode" = default ] || [ "$mode" = all ]; then
  run_suite "tests" build -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
if [ "$mode" = asan ] || [ "$mode" = all ]; then
  CC=clang CXX=clang++ run_suite "tests under ASan+UBSan" build-asan -DCMAKE_BUILD_TYPE=Debug -DTP_SANITIZE=address,undefined
fi
if [ "$mode" = tsan ] || [ "$mode" = all ]; then
  # ThreadSanitizer: the tests that run threads.
  CC=clang CXX=clang++ cmake -S . -B build-tsan -G Ninja -DTP_BUILD_TESTS=ON -DTP_BUILD_TOOLS=ON -DTP_BUILD_TORCH_SHIM=ON -DTP_BUILD_GGML_ADAPTER=ON \
    -DCMAKE_BUILD_TYPE=Debug -DTP_SANITIZE=thread >/dev/null
  cmake --build build-tsan
  echo "== tests under TSan"
  TSAN_OPTIONS="halt_on_error=1" ctest --test-dir build-tsan --output-on-failure -R "thread"
fi
