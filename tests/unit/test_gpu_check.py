"""`scripts/gpu-check.sh` between loans of a GPU machine: its dry run (the same check functions on
the NVML fake, `gpu_check.fake_nvml`, faked at the `pynvml` module seam `NvmlSampler` already has)
through the Python entry and through the script, the report it writes, and checks that must fail
when what they compare disagrees.  The tensor checks' dry run needs PyTorch: tests/contract/
test_gpu_check_tensors.py."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_spark_plugin.gpu_check import render, run, telemetry
from vllm_spark_plugin.gpu_check.env import DRY_TIMING, DryEnv
from vllm_spark_plugin.gpu_check.fake_nvml import FakeNvml
from vllm_spark_plugin.gpu_check.report import FAIL, NA, PASS, STATUSES, NotApplicable

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
# what the dry run proves without PyTorch (the unit tier's environment has none)
NO_TORCH_CHECKS = ("import_weight", "device", "moe_policy", "nvml_memory", "nvml_energy", "nvml_gauges",
                   "nvidia_smi", "exporter_render")


def quiet_env(**fake) -> DryEnv:
    return DryEnv(nvml=FakeNvml(**fake), progress=lambda msg: None)


def dry_run(out: Path, env=None) -> tuple[int, dict, str]:
    code = run.run(out, dry=True, env=env)
    return code, json.loads((out / "gpu-check.json").read_text()), (out / "gpu-check.txt").read_text()


@pytest.fixture(scope="module")
def consistent(tmp_path_factory):
    return dry_run(tmp_path_factory.mktemp("gpu-check"), quiet_env())


def by_name(result: dict) -> dict:
    return {c["name"]: c for c in result["checks"]}


def test_the_dry_run_reports_every_check_with_a_status(consistent):
    code, result, _ = consistent
    assert [c["name"] for c in result["checks"]] == list(run.CHECK_NAMES)
    assert result["mode"] == "dry" and result["complete"] is True
    for c in result["checks"]:
        assert c["status"] in STATUSES, c
        assert c["dry"] is True
        if c["status"] == NA:
            assert re.match(r"not applicable here: \S.{20,}", c["detail"]), c
    assert result["summary"] == {s: sum(c["status"] == s for c in result["checks"]) for s in STATUSES}
    checks = by_name(result)
    assert {n: checks[n]["status"] for n in NO_TORCH_CHECKS} == {n: PASS for n in NO_TORCH_CHECKS}, \
        {n: checks[n]["detail"] for n in NO_TORCH_CHECKS}
    assert checks["gb10_kernels"]["status"] == NA and checks["moe_tune_smem"]["status"] == NA
    assert code == 0


def test_the_text_summary_lists_each_check_in_order(consistent):
    _, result, text = consistent
    lines = text.splitlines()
    assert lines[0].startswith("vllm-spark gpu-check (dry) ")
    listed = [m.group(2) for ln in lines if (m := re.match(r"\[\s*(pass|fail|n/a)\] (\S+)\s", ln))]
    assert listed == list(run.CHECK_NAMES)
    c = result["summary"]
    assert lines[-1].startswith(f"{len(run.CHECK_NAMES)} checks: {c[PASS]} passed, {c[FAIL]} failed, "
                                f"{c[NA]} not applicable")


def test_the_fakes_energy_counter_is_the_integral_of_its_power_profile():
    clock = [100.0]
    nv = FakeNvml(clock=lambda: clock[0])
    h = nv.nvmlDeviceGetHandleByIndex(0)
    e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    ts, ps = [], []
    for seconds, loaded in ((0.7, False), (2.0, True), (0.3, False), (1.5, True), (0.5, False)):
        nv.set_load(loaded)
        for _ in range(round(seconds / 0.01)):
            ts.append(clock[0])
            ps.append(nv.nvmlDeviceGetPowerUsage(h) / 1000)
            clock[0] += 0.01
    ts.append(clock[0])
    ps.append(nv.nvmlDeviceGetPowerUsage(h) / 1000)
    delta_j = (nv.nvmlDeviceGetTotalEnergyConsumption(h) - e0) / 1000
    exact = 60 * (0.7 + 0.3 + 0.5) + 300 * (2.0 + 1.5)
    assert delta_j == pytest.approx(exact, abs=0.01)
    assert telemetry.trapezoid(ts, ps) == pytest.approx(delta_j, rel=0.01)


def test_the_energy_check_agrees_with_a_consistent_counter(consistent):
    f = by_name(consistent[1])["nvml_energy"]["figures"]
    assert f["error"] < telemetry.ENERGY_TOLERANCE and f["plugin_error"] < telemetry.ENERGY_TOLERANCE
    assert f["energy_j"] > 0 and f["backwards_steps"] == 0
    assert f["samples"] >= 0.5 * f["window_seconds"] / DRY_TIMING.sample_period


def test_a_coarsely_updated_counter_is_compared_over_the_span_between_its_updates():
    # a counter that moves every 0.3 s: the window's ends alone would be off by up to 0.3 s of power
    v = telemetry.check_energy(quiet_env(counter_period=0.3))
    assert v.status == PASS, v.detail
    assert 3 <= v.figures["counter_updates"] <= 6
    assert v.figures["span_seconds"] < v.figures["window_seconds"]


def test_an_inconsistent_energy_counter_fails_the_run_and_the_rest_still_runs(tmp_path):
    code, result, text = dry_run(tmp_path, quiet_env(energy_scale=0.5))  # counts half the joules
    assert code == 1
    checks = by_name(result)
    energy = checks["nvml_energy"]
    assert energy["status"] == FAIL
    assert energy["figures"]["error"] == pytest.approx(0.5, abs=0.05)
    assert energy["figures"]["plugin_error"] == pytest.approx(0.5, abs=0.05)
    assert [c["name"] for c in result["checks"]] == list(run.CHECK_NAMES) and result["complete"]
    assert checks["nvml_gauges"]["status"] == PASS
    assert re.search(r"^\[fail\] nvml_energy\s", text, re.M)


class PowerFails(FakeNvml):
    def nvmlDeviceGetPowerUsage(self, h):
        raise RuntimeError("power sensor gone")


def test_a_crashing_check_is_a_fail_with_the_exception_and_the_rest_run(tmp_path):
    env = DryEnv(nvml=PowerFails(), progress=lambda msg: None,
                 timing=dataclasses.replace(DRY_TIMING, burn_seconds=0.2, lead_seconds=0.05, tail_seconds=0.05))
    code, result, _ = dry_run(tmp_path, env)
    assert code == 1
    checks = by_name(result)
    for name in ("nvml_energy", "nvml_gauges", "nvidia_smi"):
        assert checks[name]["status"] == FAIL
        assert "power sensor gone" in checks[name]["detail"], checks[name]["detail"]
    assert checks["nvml_energy"]["figures"]["traceback"]
    assert checks["nvml_memory"]["status"] == PASS and result["complete"]


def test_checks_not_started_within_the_budget_fail_as_not_run(tmp_path):
    env = DryEnv(progress=lambda msg: None, timing=dataclasses.replace(DRY_TIMING, budget_seconds=0))
    code, result, _ = dry_run(tmp_path, env)
    assert code == 1
    assert {c["status"] for c in result["checks"]} == {FAIL}
    assert all("time budget" in c["detail"] for c in result["checks"])


def test_nvml_without_memory_makes_the_memory_check_not_applicable():
    with pytest.raises(NotApplicable, match="GB10"):
        telemetry.check_memory(quiet_env(memory_supported=False))


def test_a_memory_reading_that_does_not_follow_the_allocation_fails():
    class StuckMemory(FakeNvml):
        def allocate(self, nbytes):  # the driver never sees it
            pass

    v = telemetry.check_memory(DryEnv(nvml=StuckMemory(), progress=lambda msg: None))
    assert v.status == FAIL and "NVML used grew 0 MiB" in v.detail


def test_the_render_check_is_not_applicable_without_prometheus_client(monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    with pytest.raises(NotApplicable, match="prometheus-client not installed"):
        render.check_render(quiet_env())


def test_nvidia_smi_csv_is_parsed_with_missing_fields_as_none():
    line = "NVIDIA H200, 580.65.06, 118.37, 1980, 41, 100, 143771, 4613\n"
    assert telemetry.parse_smi(line) == {"name": "NVIDIA H200", "driver_version": "580.65.06", "power.draw": 118.37,
                                         "clocks.sm": 1980.0, "temperature.gpu": 41.0, "utilization.gpu": 100.0,
                                         "memory.total": 143771.0, "memory.used": 4613.0}
    gb10 = telemetry.parse_smi("NVIDIA GB10, 580.95.05, 11.20, 2405, 43, 0, [N/A], [N/A]")
    assert gb10["memory.total"] is None and gb10["memory.used"] is None
    with pytest.raises(ValueError, match="fields"):
        telemetry.parse_smi("NVIDIA H200, 580.65.06")


def script(*args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_the_script_dry_run_writes_both_files_and_exits_0(tmp_path):
    out = tmp_path / "out"
    p = script(str(out), "--dry")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    result = json.loads((out / "gpu-check.json").read_text())
    assert [c["name"] for c in result["checks"]] == list(run.CHECK_NAMES)
    text = (out / "gpu-check.txt").read_text()
    assert all(re.search(rf"^\[\s*(pass|n/a)\] {n}\s", text, re.M) for n in run.CHECK_NAMES), text
    assert "gpu-check: [1/" in p.stdout  # progress as it goes


def test_the_script_leaves_a_failed_result_when_python_never_starts(tmp_path):
    p = script(str(tmp_path), "--dry", PYTHON="false")
    assert p.returncode == 1
    result = json.loads((tmp_path / "gpu-check.json").read_text())
    assert [(c["name"], c["status"]) for c in result["checks"]] == [("startup", FAIL)]
    assert "[fail] startup" in (tmp_path / "gpu-check.txt").read_text()


def test_the_script_usage_errors_exit_2(tmp_path):
    assert script().returncode == 2
    assert script(str(tmp_path), "--wet").returncode == 2
    assert script(str(tmp_path), "--dry", "extra").returncode == 2
