"""`vllm-spark check` end to end against the fake server on the wall clock: doctor, the adaptive sweep
and the planner's prediction in one run, the side-by-side report, and the exit status following doctor.
Each run measures for seconds of real time, so these are not unit tests (the pure parts:
tests/unit/test_check_unit.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from vllm_spark_plugin import doctor
from vllm_spark_plugin.cli import main as vllm_spark

SIDE_BY_SIDE = ("per-stream rate at 1 stream(s)", "aggregate at 1 stream(s)", "plateau", "knee K",
                "capacity at 60 tok/s", "TTFT p50 at 1 stream(s)")


@pytest.fixture
def served(fake):
    return fake(alpha=0.005, beta=0.0005, model="Qwen3.6-35B-A3B")


def _check(served, out: Path, *extra) -> int:
    return vllm_spark(["check", "--quiet", "--endpoint", served.base_url, "--minutes", "1.5", "--prompt-tokens", "32",
                       "--output-tokens", "16", "--floor", "60", "--out", str(out), *extra])


def test_check_writes_the_side_by_side_report_and_exit_follows_doctor(served, tmp_path):
    out = tmp_path / "check"
    rc = _check(served, out)
    doc = json.loads((out / "check.json").read_text())
    assert rc == (0 if doc["doctor"]["ok"] else 1) == doc["exit_status"]
    assert doc["doctor"]["checks"] and doc["bench"]["exit_status"] == 0
    assert doc["prediction"]["model"] == "Qwen3.6-35B-A3B" and doc["prediction"]["weight_format"] == "nvfp4"
    quantities = [r["quantity"] for r in doc["comparison"]]
    for q in SIDE_BY_SIDE:
        row = next(r for r in doc["comparison"] if r["quantity"].startswith(q))
        assert row["measured"] is not None and row["predicted"] is not None, row
    measured_cap = next(r for r in doc["comparison"] if r["quantity"].startswith("capacity"))["measured"]
    assert any(q.startswith(f"per-stream rate at {measured_cap} streams") for q in quantities)
    for r in doc["comparison"]:
        if r["ratio"] is not None:
            assert r["ratio"] == pytest.approx(r["measured"] / r["predicted"])
    search = doc["bench"]["search"]
    assert search["points"] <= 16 and search["seconds"] <= doc["sizing"]["budget_seconds"] + 5
    html = (out / "report.html").read_text()
    assert "Prediction beside measurement" in html and "measured / predicted" in html
    assert html.count('src="data:image/png;base64,') == 2 and "bench/report.html" in html
    assert (out / "bench" / "report.html").exists() and (out / "bench" / "capacity_profile.json").exists()
    assert doc["verdict"].startswith("check passed" if rc == 0 else "check FAILED")


def test_exit_status_is_zero_only_when_doctor_finds_no_failure(served, tmp_path, monkeypatch):
    fine = [doctor.Check("vllm", doctor.OK, "fine")]
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: fine)
    assert _check(served, tmp_path / "ok") == 0
    monkeypatch.setattr(doctor, "run_checks", lambda **kw: fine + [doctor.Check("plugin", doctor.FAIL, "missing")])
    assert _check(served, tmp_path / "bad") == 1
    doc = json.loads((tmp_path / "bad" / "check.json").read_text())
    assert doc["doctor"]["failed"] == ["plugin"] and doc["bench"]["exit_status"] == 0

