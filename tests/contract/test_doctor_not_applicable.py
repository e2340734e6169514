"""`vllm-spark doctor` on a machine without a GPU: a check that cannot apply says "n/a" and why,
in the text and the JSON output, instead of passing.  The real command runs on this machine (vLLM's
CPU build, no CUDA device); the GB10 side goes through the `doctor.Probe` seam."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from vllm_spark_plugin import doctor


def run_doctor(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in doctor.STALE_ENV and not k.startswith("SPARK_PLUGIN_")}
    env.pop("VLLM_TUNED_CONFIG_FOLDER", None)
    return subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "doctor", *args],
                          capture_output=True, text=True, env=env, timeout=600)


def test_cuda_graphs_check_is_not_applicable_without_a_gpu():
    text = run_doctor()
    assert text.returncode == 0, text.stdout + text.stderr
    line = next(ln for ln in text.stdout.splitlines() if "cuda_graphs:" in ln)
    assert line.startswith("[ n/a] cuda_graphs: no CUDA device"), line
    assert "[ OK ] cuda_graphs" not in text.stdout
    assert text.stdout.rstrip().endswith("not applicable"), text.stdout  # the summary counts it

    report = json.loads(run_doctor("--json").stdout)
    check = next(c for c in report["checks"] if c["name"] == "cuda_graphs")
    assert check["status"] == "n/a" and "no CUDA device" in check["detail"]
    assert report["ok"]  # not applicable is not a failure


def test_cuda_graphs_check_still_applies_on_a_gpu():
    """Through the device seam: on a GB10 without --enforce-eager it passes, with it it warns."""
    probe = doctor.Probe()
    probe.has_cuda, probe.capability = (lambda: True), (lambda: (12, 1))
    probe.device_name, probe.backend_imports = (lambda: "NVIDIA GB10"), (lambda: {"marlin": None})
    graphs = {serve.enforce_eager: next(c for c in doctor.run_checks({}, serve, probe) if c.name == "cuda_graphs")
              for serve in (doctor.ServeArgs(gpu_memory_utilization=0.5),
                            doctor.ServeArgs(gpu_memory_utilization=0.5, enforce_eager=True))}
    assert graphs[False].status == doctor.OK
    assert "[ OK ] cuda_graphs: CUDA graphs on" in doctor.format_checks([graphs[False]])
    assert graphs[True].status == doctor.WARN and "drop --enforce-eager" in graphs[True].fix


def test_formatting_counts_each_status():
    text = doctor.format_checks([doctor.Check("a", doctor.NA, "does not apply: no GPU"),
                                 doctor.Check("b", doctor.WARN, "careful", "do this"),
                                 doctor.Check("c", doctor.OK, "fine")])
    assert text.splitlines() == ["[ n/a] a: does not apply: no GPU", "[WARN] b: careful", "       fix: do this",
                                 "[ OK ] c: fine", "0 failed, 1 warning(s), 1 not applicable"]


def test_unknown_status_is_refused():
    with pytest.raises(ValueError, match=r"status 'skipped' is not one of ok, info, warn, fail, n/a"):
        doctor.Check("x", "skipped", "?")
