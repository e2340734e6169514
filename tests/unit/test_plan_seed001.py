"""Seed 001: Qwen3.6-35B-A3B NVFP4 on one Spark under vLLM, published aggregate decode throughput
40.715 tok/s at concurrency 1 and 557.471 at 64 (Marlin recipe).

The planner runs with its defaults (packaged architecture and checkpoint facts, gb10 profile, default
efficiency factors, default 4096-token context): none of them is fitted to these two numbers.
"""
from __future__ import annotations

import pytest

from vllm_spark_plugin.definitions import SweepPoint
from vllm_spark_plugin.plan.calibrate import calibrate_split, load_calibration, save_calibration
from vllm_spark_plugin.plan.cli import add_arguments, build_deployment
from vllm_spark_plugin.plan.stepmodel import Efficiency, StepModel

PUBLISHED = {1: 40.715, 64: 557.471}


def seed_deployment():
    import argparse
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    dep, _ = build_deployment(parser.parse_args(["--model", "Qwen3.6-35B-A3B", "--weight-format", "nvfp4"]))
    return dep


def test_defaults_are_not_the_seed_numbers():
    dep = seed_deployment()
    assert Efficiency() == Efficiency(bandwidth=0.85, compute=0.5, overhead_scale=1.0, source="defaults")
    # the planner's own inputs: checkpoint KV fp8, config's fp32 DeltaNet state, 4096-token context
    assert (dep.kv_dtype, dep.state_dtype, dep.context) == ("fp8", "fp32", 4096)


def test_uncalibrated_prediction_within_25_percent():
    sm = StepModel(seed_deployment())
    for c, published in PUBLISHED.items():
        pred = sm.aggregate_rate(c)
        print(f"c={c}: predicted {pred:.1f} tok/s, published {published} ({(pred / published - 1) * 100:+.1f}%)")
        assert abs(pred / published - 1) <= 0.25, (c, pred, published)


def test_calibrated_prediction_within_10_percent(tmp_path):
    dep = seed_deployment()
    pts = [SweepPoint(concurrency=c, per_stream_tokens_per_second=None, aggregate_tokens_per_second=a)
           for c, a in PUBLISHED.items()]
    cal = calibrate_split(dep, pts)
    # machine factors stay physical; Qwen3.6's own factors (routing skew, kernels) are kept apart
    assert 0.7 < cal.efficiency.bandwidth < 1.0 and 0.8 < cal.efficiency.overhead_scale < 1.25
    assert "compute" not in cal.fitted
    path = tmp_path / "cal.json"
    save_calibration(cal, path)
    loaded = load_calibration(path)
    assert loaded.efficiency.bandwidth == pytest.approx(cal.efficiency.bandwidth)
    assert loaded.factors_for("Qwen3.6-35B-A3B") == cal.model_factors
    assert loaded.factors_for("gpt-oss-120b") is None
    sm = StepModel(dep, loaded.efficiency, loaded.factors_for(dep.arch.name))
    for c, published in PUBLISHED.items():
        pred = sm.aggregate_rate(c)
        print(f"calibrated c={c}: predicted {pred:.1f} tok/s, published {published}")
        assert abs(pred / published - 1) <= 0.10, (c, pred, published)
    # in-between points stay between the endpoints (the curve is monotone)
    assert PUBLISHED[1] < sm.aggregate_rate(16) < PUBLISHED[64]
