#!/usr/bin/env bash
# Builds tidepool and runs its demo on the simulated device: the memory
# failures reported for llama.cpp's pools, side by side with tidepool.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh build
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
./build/tide demo "$@"
