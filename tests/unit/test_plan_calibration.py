"""Calibration of the planner's efficiency factors: recovery, save/load, the sweep-file path, errors."""
from __future__ import annotations

import json

import pytest

from vllm_spark_plugin.definitions import SweepPoint
from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.calibrate import (fit_efficiency, load_calibration, parse_point, points_from_file,
                                              save_calibration)
from vllm_spark_plugin.plan.deployment import Deployment, PlanError
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.stepmodel import Efficiency, StepModel


def dep(model="Qwen3-30B-A3B", context=2048):
    arch = load_model(model)[0]
    hw = load_hardware("gb10")
    return Deployment(arch=arch, hw=hw, weight_format="nvfp4", formats=component_formats("nvfp4"),
                      kv_dtype="bf16", context=context, os_reserve_bytes=hw.os_reserve_bytes)


def synthetic(d, eff, bs):
    sm = StepModel(d, eff)
    return [SweepPoint(concurrency=b, per_stream_tokens_per_second=sm.per_stream_rate(b),
                       aggregate_tokens_per_second=sm.aggregate_rate(b), label="syn") for b in bs]


def test_recovers_known_factors_from_a_synthetic_sweep():
    # an MoE model (its expert term is not linear in b, which separates the three factors), with bf16
    # compute so that compute is a visible share of the step at b=256
    d = dep(context=256)
    d.compute_dtype = "bf16"
    truth = Efficiency(bandwidth=0.7, compute=0.3, overhead_scale=1.6)
    cal = fit_efficiency(d, synthetic(d, truth, [1, 4, 16, 64, 256]))
    assert set(cal.fitted) == {"bandwidth", "overhead", "compute"}
    assert cal.efficiency.bandwidth == pytest.approx(0.7, rel=1e-6)
    assert cal.efficiency.compute == pytest.approx(0.3, rel=1e-6)
    assert cal.efficiency.overhead_scale == pytest.approx(1.6, rel=1e-6)
    assert cal.rms_relative_error < 1e-9


def test_dense_model_cannot_separate_compute_from_bandwidth():
    d = dep("Llama-3.3-70B")
    d.compute_dtype = "bf16"
    truth = Efficiency(bandwidth=0.7, compute=0.5, overhead_scale=1.6)
    cal = fit_efficiency(d, synthetic(d, truth, [1, 4, 16, 64, 256]))
    assert "compute" not in cal.fitted
    assert cal.efficiency.bandwidth == pytest.approx(0.7, rel=1e-6)


def test_two_points_fit_two_factors_and_hold_compute():
    d = dep()
    cal = fit_efficiency(d, synthetic(d, Efficiency(bandwidth=0.6, overhead_scale=2.0), [1, 64]))
    assert cal.fitted == ["bandwidth", "overhead"]
    assert cal.efficiency.compute == 0.5
    assert cal.efficiency.bandwidth == pytest.approx(0.6, rel=1e-6)


def test_save_and_load_roundtrip_and_predict_another_model(tmp_path):
    d = dep()
    cal = fit_efficiency(d, synthetic(d, Efficiency(bandwidth=0.7, overhead_scale=1.5), [1, 8, 64]))
    path = tmp_path / "gb10.json"
    save_calibration(cal, path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "vllm-spark-plan-calibration" and doc["hardware"] == "gb10"
    loaded = load_calibration(path)
    assert loaded.efficiency.bandwidth == pytest.approx(0.7)
    # the same factors predict another model on the same box
    other = StepModel(dep("Llama-3.1-8B"), loaded.efficiency)
    base = StepModel(dep("Llama-3.1-8B"))
    assert other.step_seconds(1) > base.step_seconds(1)  # lower efficiency, more overhead


def test_bad_calibration_files(tmp_path):
    with pytest.raises(PlanError, match="not found"):
        load_calibration(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(PlanError, match="not valid JSON"):
        load_calibration(bad)
    bad.write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(PlanError, match="not a planner calibration"):
        load_calibration(bad)
    bad.write_text(json.dumps({"format": "vllm-spark-plan-calibration", "version": 1,
                               "bandwidth_efficiency": -1, "compute_efficiency": 0.5, "overhead_scale": 1}))
    with pytest.raises(PlanError, match="bad calibration value"):
        load_calibration(bad)


def test_parse_point():
    p = parse_point("64:557.471")
    assert (p.concurrency, p.aggregate_tokens_per_second) == (64, 557.471)
    for bad in ("64", "a:b", "0:10", "4:-1"):
        with pytest.raises(PlanError):
            parse_point(bad)


def test_points_from_file_uses_the_knee_loader(tmp_path):
    """A real sweep CSV with two curves, read through knee.loaders."""
    f = tmp_path / "sweep.csv"
    rows = ["row_type,label,workload,concurrency,trial,per_stream_median_tps,aggregate_tps,ttft_p50_s,ttft_p99_s"]
    for label in ("a", "b"):
        rows += [f"point,{label},code,1,1,40.0,40.0,0.1,0.2", f"point,{label},code,64,1,10.0,557.0,2.0,3.0"]
    f.write_text("\n".join(rows) + "\n")
    with pytest.raises(PlanError, match="several curves"):
        points_from_file(str(f))
    label, got = points_from_file(str(f), "b")
    assert label == "b"
    assert [(p.concurrency, p.aggregate_tokens_per_second) for p in got] == [(1, 40.0), (64, 557.0)]
    with pytest.raises(PlanError, match="no curve labelled"):
        points_from_file(str(f), "zzz")
    with pytest.raises(PlanError, match="not found"):
        points_from_file(str(tmp_path / "nope.json"), "a")
