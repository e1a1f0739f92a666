#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Everything tidepool measures on a real GPU, in one go (used on the H200):
# the GPU test suite and compute-sanitizer, the graph-churn curves, the
# hit-path benchmark (threads up to 8) and trace replays on cuda:0, and the
# replay tool's own speed. Traces are read from
# TRACES (default .carry/traces); results go to OUT (default gpu-results).
# SANITIZER=0 skips the compute-sanitizer pass (the slowest part).
set -uo pipefail
cd "$(dirname "$0")/.."
traces=${TRACES:-.carry/traces}
out=${OUT:-gpu-results}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
lscpu | grep -E "^Model name|^CPU\(s\)" | tee -a "$out/gpu.txt"
zlib_args=()
if [ ! -e /usr/include/zlib.h ] && [ -e .carry/zlib/zlib.h ]; then
  # No zlib development files on the image: carried headers, the system's libz.
  libz=$(ldconfig -p | awk '/libz\.so\.1 .*x86-64/ && !found {print $NF; found = 1}')
  zlib_args=(-DZLIB_INCLUDE_DIR="$PWD/.carry/zlib" -DZLIB_LIBRARY="$libz")
fi
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release "${zlib_args[@]}" >"$out/configure.log" 2>&1 && cmake --build build-gpu >"$out/build.log" 2>&1 \
  || { tail -30 "$out/configure.log" "$out/build.log"; exit 1; }
echo "== GPU tests"
(cd build-gpu && ctest -L gpu -V --output-on-failure) >"$out/gpu_tests.log" 2>&1; echo "gpu tests rc=$?"
grep -E "checks passed|[0-9]+ passed, [0-9]+ failed|^FAIL |failed|Passed|Failed|note:|graph churn|cap (on|off|64)|request [0-9]+:|vmm:|segment:" "$out/gpu_tests.log" | tail -60
if [ "${SANITIZER:-1}" != 0 ]; then
  echo "== compute-sanitizer"
  (cd build-gpu && ctest -L sanitizer --output-on-failure) >"$out/sanitizer.log" 2>&1; echo "sanitizer rc=$?"
  grep -E "ERROR SUMMARY|LEAK SUMMARY|all clean|Passed|Failed" "$out/sanitizer.log" | tail -12
fi
echo "== bench"
threads=$(( $(nproc) < 8 ? $(nproc) : 8 ))
./build-gpu/tide bench --device cuda:0 --runs 7 --pairs 300000 --threads "$threads" | tee "$out/bench_cuda.txt"
./build-gpu/tide bench --device cuda:0 --runs 7 --pairs 300000 --threads "$threads" --json > "$out/bench_cuda.json"
./build-gpu/tide bench --runs 7 --pairs 300000 | tee "$out/bench_sim.txt"
echo "== replays on cuda:0"
for t in decode_growing_kv gemma3_mtmd qwen2vl_dynres; do
  ./build-gpu/tide replay "$traces/$t.csv.gz" --device cuda:0 --pool vmm,segment --json >"$out/replay_cuda_$t.json" 2>&1
  ./build-gpu/tide replay "$traces/$t.csv.gz" --device cuda:0 --pool vmm,segment | tail -4
done
echo "== replay throughput (simulated device: the host's speed; reading, inflating and parsing included)"
# Five runs each: the host's speed swings by a third from run to run, so
# one run says little; the median is the figure.
t=decode_growing_kv
gzip -dc "$traces/$t.csv.gz" > "$out/$t.csv"
for f in "$out/$t.csv" "$traces/$t.csv.gz"; do
  for n in 1 4 "$(nproc)"; do
    echo "-- $(basename "$f"), --threads $n"
    for run in 1 2 3 4 5; do ./build-gpu/tide replay "$f" --threads "$n" | sed -n 1p; done | tee "$out/throughput.txt"
    echo "median of 5: $(grep -oE '[0-9.]+M events/s' "$out/throughput.txt" | sort -n | sed -n 3p)"
  done
done
rm -f "$out/throughput.txt"
rm -f "$out/$t.csv"
