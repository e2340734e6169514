"""The split calibration: shared machine/engine factors, each model's own factors, priors at the defaults."""
from __future__ import annotations

import pytest

from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.deployment import Deployment
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.jointfit import Observation, fit_joint
from vllm_spark_plugin.plan.stepmodel import Efficiency, ModelFactors, StepModel

BS = (1, 4, 16, 64)


def dep(model):
    arch, doc = load_model(model)
    hw = load_hardware("gb10")
    return Deployment(arch=arch, hw=hw, weight_format="nvfp4", formats=component_formats("nvfp4"), kv_dtype="fp8",
                      context=1024, os_reserve_bytes=hw.os_reserve_bytes, model_routing=doc.get("routing") or {})


def observe(model, eff, mf=None):
    d = dep(model)
    sm = StepModel(d, eff, mf)
    return [Observation(dep=d, concurrency=b, rate=sm.aggregate_rate(b), model=model, engine="vllm") for b in BS]


def test_a_machine_shared_by_every_model_is_recovered_as_the_machine():
    truth = Efficiency(bandwidth=0.75, overhead_scale=1.2)
    fit = fit_joint(observe("Qwen3-30B-A3B", truth) + observe("Llama-3.1-8B", truth) + observe("gpt-oss-20b", truth))
    assert fit.rms_log_error < 0.02
    # bandwidth is what every model's curve shows; a dense model's constant terms (overhead and weight
    # bytes) trade against each other, so the overhead moves only part of the way (its prior is tight)
    assert fit.machine["vllm"].bandwidth == pytest.approx(0.75, rel=0.03)
    assert 1.03 < fit.machine["vllm"].overhead_scale < 1.25
    for mf in fit.models.values():
        assert mf.overhead_scale == pytest.approx(1.0, abs=0.1)


def test_one_models_peculiarity_stays_with_that_model():
    base = Efficiency()
    slow = ModelFactors(overhead_scale=1.6)  # e.g. kernels that cost more than counted
    fit = fit_joint(observe("Qwen3-30B-A3B", base, slow) + observe("Llama-3.1-8B", base)
                    + observe("gpt-oss-20b", base))
    m = fit.models
    assert m["Qwen3-30B-A3B"].overhead_scale > 1.3
    assert m["Qwen3-30B-A3B"].overhead_scale > 1.5 * max(m["Llama-3.1-8B"].overhead_scale,
                                                        m["gpt-oss-20b"].overhead_scale)
    assert fit.machine["vllm"].bandwidth == pytest.approx(0.85, rel=0.03)
    assert fit.machine["vllm"].overhead_scale < 1.1


def test_a_sweep_fits_the_routing_skew_one_point_cannot():
    truth = ModelFactors(routing_skew=1.5)
    d = dep("Qwen3-30B-A3B")
    fit = fit_joint(observe("Qwen3-30B-A3B", Efficiency(), truth))
    assert fit.models["Qwen3-30B-A3B"].routing_skew > d.routing_skew()[0] + 0.2  # moved toward 1.5
    one = fit_joint(observe("Qwen3-30B-A3B", Efficiency(), truth)[:1])
    assert one.models["Qwen3-30B-A3B"].routing_skew is None  # c = 1 cannot see routing
