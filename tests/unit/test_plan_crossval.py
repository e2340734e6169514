"""Cross-validation over the published Spark figures: does a calibration transfer to unseen setups?

Leave one source out: the machine/engine factors are fitted (with each model's own factors kept
apart, plan/jointfit.py) to every figure of the other sources, then the held-out figures are
predicted.  The median absolute error must improve on the uncalibrated prediction.  Calibrated on
seed 001's two points alone, one free set of factors made the other models' vLLM figures much worse
(median 11.8 % -> 19.0 %); with the model's factors kept apart the machine factors stay physical and
the other models move by less than a point (11.8 % -> 12.7 %: not an improvement, see docs/plan.md).
"""
from __future__ import annotations

import argparse
from statistics import median

import pytest

from vllm_spark_plugin.definitions import SweepPoint
from vllm_spark_plugin.plan.calibrate import calibrate_split, fit_efficiency
from vllm_spark_plugin.plan.cli import add_arguments, build_deployment
from vllm_spark_plugin.plan.crossval import cross_validate, predict, published_entries, summary
from vllm_spark_plugin.plan.stepmodel import Efficiency

SEED = {1: 40.715, 64: 557.471}


@pytest.fixture(scope="module")
def loso():
    return cross_validate("source")


def test_leave_one_source_out_calibration_improves_the_median(loso):
    s = summary(loso)
    print()
    for cls, v in s.items():
        print(f"{cls:14} n={v['n']:2}  median {v['median_uncalibrated']:.3f} -> {v['median_calibrated']:.3f}  "
              f"worst {v['worst_uncalibrated']:.3f} -> {v['worst_calibrated']:.3f}")
    assert s["all"]["median_calibrated"] < s["all"]["median_uncalibrated"]
    assert s["all"]["worst_calibrated"] < s["all"]["worst_uncalibrated"]
    assert s["2 Sparks"]["median_calibrated"] < s["2 Sparks"]["median_uncalibrated"]


def test_every_figure_was_predicted_without_its_own_source(loso):
    assert len(loso) == len(published_entries())
    for r in loso:
        assert r["group"] == next(e["source"] for e in published_entries() if e["id"] == r["id"])


def _seed_points():
    return [SweepPoint(concurrency=c, per_stream_tokens_per_second=None, aggregate_tokens_per_second=a)
            for c, a in SEED.items()]


def _seed_deployment():
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return build_deployment(parser.parse_args(["--model", "Qwen3.6-35B-A3B"]))[0]


def _other_model_errors(eff):
    es = [e for e in published_entries() if e["model"] != "Qwen3.6-35B-A3B" and e["engine_key"] == "vllm"]
    return [abs(predict(e, eff) / e["tokens_per_second"] - 1) for e in es]


def test_seed_calibration_no_longer_spoils_other_models():
    cal = calibrate_split(_seed_deployment(), _seed_points())
    before, after = _other_model_errors(Efficiency()), _other_model_errors(cal.efficiency)
    free = _other_model_errors(fit_efficiency(_seed_deployment(), _seed_points()).efficiency)
    print(f"\nother models' vLLM figures: median {median(before):.3f} -> split {median(after):.3f}, "
          f"free {median(free):.3f}")
    assert median(after) <= median(before) + 0.02
    assert median(after) < median(free) - 0.05
    # the machine keeps a physical bandwidth; the model's own factors take what is Qwen3.6's
    assert cal.efficiency.bandwidth < 1.0
    assert cal.model_factors.routing_skew > 0 and cal.model_name == "Qwen3.6-35B-A3B"


def test_one_free_set_of_factors_does_not_transfer():
    """The failure this calibration fixes: all factors free on one model's points."""
    free = fit_efficiency(_seed_deployment(), _seed_points()).efficiency
    assert free.bandwidth > 1.0  # absorbs Qwen3.6's routing and kernels
    assert median(_other_model_errors(free)) > median(_other_model_errors(Efficiency()))


@pytest.fixture(scope="module")
def lomo():
    return cross_validate("model")


def test_leave_one_model_out_carries_only_machine_factors(lomo):
    """A held-out model is predicted with the machine/engine factors fitted on the other models and
    none of its own (its routing skew, overhead and per-stream factors are never seen)."""
    assert len(lomo) == len(published_entries())
    for r in lomo:
        assert r["model_factors"] is None, r["id"]
        assert r["group"] == next(e["model"] for e in published_entries() if e["id"] == r["id"])


def test_leave_one_source_out_keeps_the_models_own_factors(loso):
    """Leaving a source out, a model another source measured keeps the factors fitted to it."""
    entries = {e["id"]: e for e in published_entries()}
    sources_of = {}
    for e in entries.values():
        sources_of.setdefault(e["model"], set()).add(e["source"])
    seen_elsewhere = {i for i, e in entries.items() if sources_of[e["model"]] - {e["source"]}}
    assert seen_elsewhere and seen_elsewhere != set(entries)
    for r in loso:
        assert (r["model_factors"] is not None) == (r["id"] in seen_elsewhere), r["id"]


# The targets (uncalibrated median <= 10%, worst <= 30%, leave-one-model-out calibration
# better than none) are not met yet: docs/plan.md, "What the remaining misses are".  What is gated is
# that the planner does not move away from them: the figures as they stand (10.8%, 72.7%, 14.0%
# against 10.8% uncalibrated), each with a little room, tightened as the targets come closer.
def test_uncalibrated_errors_do_not_grow_past_where_they_stand(loso):
    s = summary(loso)["all"]
    assert s["median_uncalibrated"] <= 0.110, s
    assert s["worst_uncalibrated"] <= 0.75, s


def test_leave_one_model_out_calibration_costs_no_more_than_it_does_now(lomo):
    s = summary(lomo)["all"]
    assert s["median_calibrated"] <= 0.145, s

