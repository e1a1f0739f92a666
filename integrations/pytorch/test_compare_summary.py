#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""test_compare_summary.py -- compare.py's medians over rounds, without torch
or a GPU: summarize() on made-up runs, and the --rounds option's checks."""
import os
import subprocess
import sys

from script_checks import HERE, Checks, load_script

compare = load_script("compare.py")
check = Checks("test_compare_summary")


def run(mode, gen_s, wall_s, rc=0, scenario="decode_growing_kv"):
    return dict(scenario=scenario, mode=mode, rc=rc, error=None, gen_s=gen_s, wall_s=wall_s)


check(compare.median([3, 1, 2]) == 2 and compare.median([4, 1, 3, 2]) == 2.5 and compare.median([]) is None,
      "median")
results = [run("default", 10.0, 12.0), run("tp-vmm", 10.4, 12.5), run("default", 11.0, 13.0),
           run("tp-vmm", 10.2, 12.1), run("default", 30.0, 31.0), run("tp-vmm", 99.0, 100.0, rc=1),
           run("default", 5.0, 6.0, scenario="gemma3_mtmd")]
rows = {(r["scenario"], r["mode"]): r for r in compare.summarize(results, "default")}
d, t = rows[("decode_growing_kv", "default")], rows[("decode_growing_kv", "tp-vmm")]
check(d["runs"] == 3 and d["gen_median_s"] == 11.0 and d["gen_min_s"] == 10.0 and d["gen_max_s"] == 30.0,
      "default's three runs: %s" % d)
check(t["runs"] == 2 and abs(t["gen_median_s"] - 10.3) < 1e-9, "the failed run is left out: %s" % t)
check(abs(t["gen_vs_baseline"] - 10.3 / 11.0) < 1e-9 and d["gen_vs_baseline"] == 1.0, "ratios: %s %s" % (d, t))
check(rows[("gemma3_mtmd", "default")]["runs"] == 1, "workloads kept apart")
check(compare.run_counts(results)[("decode_growing_kv", "default")] == 3, "run_counts")

# --rounds 0 is a usage error (exit 2) before anything runs
p = subprocess.run([sys.executable, os.path.join(HERE, "compare.py"), "--workloads", __file__, "--rounds", "0"],
                   capture_output=True, text=True)
check(p.returncode == 2 and "--rounds must be at least 1" in p.stderr, "--rounds 0: rc %d %s" % (p.returncode, p.stderr))

check.finish()
