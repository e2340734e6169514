"""Sweep files in the benchmark's CSV layout for tests of `vllm-spark knee`."""
from __future__ import annotations

import csv

HEADER = ["row_type", "label", "workload", "concurrency", "trial", "per_stream_median_tps",
          "aggregate_tps", "ttft_p50_s", "ttft_p99_s"]


def sweep_file(path, labels=("marlin", "cutlass")):
    """Seed 001's published endpoints (concurrency 1 and 64), one curve per recipe."""
    data = {"marlin": [(1, 40.0, 40.715, 0.12), (64, 10.4, 557.471, 2.0)],
            "cutlass": [(1, 40.0, 38.643, 0.12), (64, 10.4, 558.618, 2.0)]}
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        for lab in labels:
            for c, r, a, t in data[lab]:
                w.writerow(["point", lab, "chat", c, "", r, a, t, t * 1.5])
    return str(path)
