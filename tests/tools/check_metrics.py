# SPDX-License-Identifier: MIT
"""Parses tide's --metrics file with prometheus_client's parser (the one
scrapers use) and checks it: every family a gauge or a counter with HELP
text, named tidepool_*, no series twice, every sample labelled with the
trace (or scenario) and the pool, and the pools named on the command line
present. Usage: check_metrics.py FILE LABEL_KEY POOL... (exit 77 without the
package: the CLI test then skips this part)."""
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("SKIP: prometheus_client is not installed (Debian: python3-prometheus-client)")
    sys.exit(77)

path, label_key, pools = sys.argv[1], sys.argv[2], set(sys.argv[3:])
with open(path) as f:
    text = f.read()
families = list(text_string_to_metric_families(text))
assert families, f"{path}: no metrics"
seen, names, found_pools = set(), set(), set()
for family in families:
    assert family.type in ("gauge", "counter"), (family.name, family.type)
    assert family.documentation, family.name
    assert family.name.startswith("tidepool_"), family.name
    # (a gauge x_bytes and a counter x_bytes_total both parse as family x_bytes)
    assert (family.name, family.type) not in names, f"family {family.name} split in two"
    names.add((family.name, family.type))
    for sample in family.samples:
        assert label_key in sample.labels and "pool" in sample.labels, sample
        key = (sample.name, tuple(sorted(sample.labels.items())))
        assert key not in seen, f"series twice: {key}"
        seen.add(key)
        found_pools.add(sample.labels["pool"])
assert pools <= found_pools, f"pools {pools - found_pools} missing"
for needed in ("tidepool_replay_peak_live_bytes", "tidepool_replay_held_to_live_ratio"):
    assert (needed, "gauge") in names, needed
print(f"{len(seen)} samples in {len(families)} families parse with prometheus_client")
