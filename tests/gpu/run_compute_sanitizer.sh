#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Runs the GPU tests under compute-sanitizer's memcheck and fails on any
# error it reports (or any test failure). Skips (exit 77) when
# compute-sanitizer or a CUDA device is missing.
#
#   tests/gpu/run_compute_sanitizer.sh [DIR] [TEST...]
#
# DIR: a build directory (its tests/gpu is used) or the directory holding the
# test_gpu_* binaries; default build-cuda. TEST: test names (default: all
# test_gpu_* found). COMPUTE_SANITIZER overrides the tool's path;
# TP_GPU_QUICK (default 1 here) shortens the runs; CS_EXTRA adds options.
set -u

dir=${1:-build-cuda}
shift || true
[ -d "$dir/tests/gpu" ] && dir="$dir/tests/gpu"
if ! ls "$dir"/test_gpu_* >/dev/null 2>&1; then
    echo "error: no test_gpu_* binaries in $dir (build first: cmake --build BUILD)" >&2
    exit 1
fi
if [ $# -gt 0 ]; then tests=("$@"); else
    tests=()
    for f in "$dir"/test_gpu_*; do [ -x "$f" ] && tests+=("$(basename "$f")"); done
fi

cs=${COMPUTE_SANITIZER:-}
if [ -z "$cs" ]; then
    cs=$(command -v compute-sanitizer 2>/dev/null || true)
    for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer \
             /usr/local/cuda-*/bin/compute-sanitizer; do
        [ -z "$cs" ] && [ -x "$c" ] && cs=$c
    done
fi
if [ -z "$cs" ] || [ ! -x "$cs" ]; then
    echo "SKIP: compute-sanitizer not found"
    exit 77
fi

# Is there a device? The tests' own probe answers without the sanitizer.
probe_out=$(TP_GPU_PROBE=1 "$dir/${tests[0]}" 2>&1)
probe=$?
if [ $probe -eq 77 ]; then
    echo "$probe_out"
    exit 77
elif [ $probe -ne 0 ]; then
    echo "$probe_out"
    echo "error: the device probe failed ($probe)" >&2
    exit 1
fi

export TP_GPU_QUICK=${TP_GPU_QUICK:-1}
failed=0
for t in "${tests[@]}"; do
    log=$(mktemp)
    echo "== compute-sanitizer --tool memcheck $t"
    # API errors are not counted: the tests provoke some on purpose (out of
    # memory) and check every status themselves. Memory errors and leaks are.
    "$cs" --tool memcheck --leak-check full --report-api-errors no --error-exitcode 99 \
        ${CS_EXTRA:-} "$dir/$t" >"$log" 2>&1
    rc=$?
    cat "$log"
    summary=$(grep -E "ERROR SUMMARY: [0-9]+ error" "$log" | tail -1)
    errors=$(echo "$summary" | sed -E 's/.*ERROR SUMMARY: ([0-9]+) error.*/\1/')
    if [ $rc -eq 77 ]; then
        echo "skipped: $t"
    elif [ $rc -ne 0 ] || [ -z "$summary" ] || [ "${errors:-1}" != "0" ]; then
        echo "FAIL: $t (exit $rc, ${summary:-no error summary})"
        failed=1
    else
        echo "ok: $t (${summary#========= })"
    fi
    rm -f "$log"
done
[ $failed -eq 0 ] && echo "compute-sanitizer memcheck: all clean"
exit $failed
