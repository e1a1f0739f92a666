#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Builds the tide tool and runs its demo on the simulated device: the memory
# failures reported for llama.cpp's pools, side by side with tidepool.
# Builds in build-demo (only tide and the library; the tests use build).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh build
cmake -S . -B build-demo -G Ninja -DCMAKE_BUILD_TYPE=Release \
      -DTP_BUILD_TESTS=OFF -DTP_BUILD_TOOLS=ON -DTP_BUILD_TORCH_SHIM=OFF >/dev/null
cmake --build build-demo --target tide
./build-demo/tide demo "$@"
