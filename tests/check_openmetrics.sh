#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Writes the pool's and the graph cache's Prometheus text (test_observe DIR)
# and parses it with prometheus_client, with whichever python3 has it
# (exit 77 -- a skip -- when none does).
#   tests/check_openmetrics.sh TEST_OBSERVE_BINARY SCRATCH_DIR
set -euo pipefail
bin=$1 dir=$2
mkdir -p "$dir"
rm -f "$dir/pool.prom" "$dir/cache.prom" # (a file left by an earlier run would hide one not written)
"$bin" "$dir" test_prometheus_text_is_well_formed >/dev/null
for py in python3 /usr/bin/python3; do
  if command -v "$py" >/dev/null && "$py" -c 'import prometheus_client' 2>/dev/null; then
    exec "$py" "$(dirname "$0")/check_openmetrics.py" "$dir/pool.prom" "$dir/cache.prom"
  fi
done
echo "SKIP: no python3 with prometheus_client (Debian: python3-prometheus-client)"
exit 77
