"""A real vLLM server killed in the middle of a sweep: the completed points stay in a valid CSV,
the report is written and marked partial, the message says what happened, the exit status is 3.

Uses its own server (never the shared `vllm_server`); the fake-server variant of this test is in
test_bench_fake_wall.py (test_server_dying_mid_sweep_leaves_valid_partial_results).
"""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_spark_plugin.testbed.server import VllmServer

ROOT = Path(__file__).resolve().parents[2]


def points(out: Path) -> list[dict]:
    try:
        with open(out / "sweep.csv", newline="") as fh:
            return [r for r in csv.DictReader(fh) if r["row_type"] == "point"]
    except FileNotFoundError:
        return []


@pytest.mark.server
def test_killed_server_leaves_partial_results(tiny_model_path, artifacts_dir, tmp_path):
    server = VllmServer(model_path=str(tiny_model_path), log_path=artifacts_dir / "vllm-server-bench-kill.log")
    server.start(timeout=float(os.environ.get("SPARK_TEST_SERVER_TIMEOUT", "900")))
    server.prioritize_frontend()  # as conftest does for the shared server
    out = tmp_path / "run"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--endpoint",
                                 server.base_url, "--levels", "1,2,4,8,16,32,64", "--trials", "2",
                                 "--workload", "prose", "--output-tokens", "64", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        deadline = time.monotonic() + 300
        while len(points(out)) < 2 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert len(points(out)) >= 2, "the sweep did not get going"
        os.killpg(os.getpgid(server.proc.pid), signal.SIGKILL)  # a crash, not a clean shutdown
        killed_at = time.monotonic()
        stdout, stderr = proc.communicate(timeout=120)
        assert time.monotonic() - killed_at < 60, "the benchmark took too long to notice"
    finally:
        server.stop()
    assert proc.returncode == 3, stderr
    assert "stopped answering" in stderr and "Partial results in" in stderr
    kept = points(out)
    assert len(kept) >= 2 and int(kept[-1]["concurrency"]) < 64
    for p in kept:  # a completed point: no errors, and a rate unless every stream was flagged bunched
        assert int(p["errors"]) == 0 and int(p["completed"]) == int(p["requests"])
        assert p["per_stream_median_tps"] or int(p["bunched_streams"]) == int(p["completed"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and len(summary["curves"][0]["points"]) == len(kept)
    assert "Partial results (failed)" in (out / "report.html").read_text()
    assert (out / "per_stream.png").exists()
