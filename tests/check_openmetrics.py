# SPDX-License-Identifier: MIT
"""Parses Prometheus text files with prometheus_client's parser (the one
servers' scrapers use) and checks what tidepool promises of them: every
family is a gauge or a counter, has HELP text, and every sample carries the
device label. Usage: check_openmetrics.py FILE... (exit 77 without the
package, so ctest reports a skip)."""
import sys

try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError:
    print("SKIP: prometheus_client is not installed (Debian: python3-prometheus-client)")
    sys.exit(77)

samples = 0
for path in sys.argv[1:]:
    with open(path) as f:
        text = f.read()
    families = list(text_string_to_metric_families(text))
    assert families, f"{path}: no metrics"
    for family in families:
        assert family.type in ("gauge", "counter"), (path, family.name, family.type)
        assert family.documentation, (path, family.name)
        assert family.name.startswith("tidepool_"), (path, family.name)
        for sample in family.samples:
            assert "device" in sample.labels, (path, sample)
            # the caller's label test_observe adds, escapes decoded
            if "note" in sample.labels:
                assert sample.labels["note"] == 'a "quoted" back\\slash\nline', (path, sample.labels)
            samples += 1
print(f"{samples} samples in {len(sys.argv) - 1} files parse with prometheus_client")
