"""Routing term of the planner: expected distinct experts per MoE layer under skewed routing."""
from __future__ import annotations

import pytest

from vllm_spark_plugin.plan.routing import (concentration, distinct_experts, gini, selection_probabilities,
                                            skew_for_concentration, skew_for_gini, skew_from_routing_doc)


def test_uniform_limit_is_the_closed_form():
    # skew 0: E * (1 - (1 - k/E)^b); 256 x (1 - 0.96875^64) = 222.44 for Qwen3.6 at b = 64
    assert distinct_experts(256, 8, 64, 0.0) == pytest.approx(256 * (1 - 0.96875 ** 64))
    # the skewed profile itself tends to the same value as the skew goes to 0
    assert distinct_experts(256, 8, 64, 1e-9) == pytest.approx(256 * (1 - 0.96875 ** 64), rel=1e-6)
    assert gini(256, 8, 0.0) == pytest.approx(0.0, abs=1e-12)


def test_full_skew_limit_touches_only_k_experts():
    for b in (1, 8, 64, 1024):
        assert distinct_experts(256, 8, b, 50.0) == pytest.approx(8.0, rel=1e-12)
    # and the profile converges to it as the skew grows
    at64 = [distinct_experts(256, 8, 64, s) for s in (1.0, 3.0, 10.0, 30.0)]
    assert all(b < a for a, b in zip(at64, at64[1:])) and at64[-1] < 9.0
    q = selection_probabilities(128, 4, 50.0)
    assert list(q[:4]) == pytest.approx([1.0] * 4) and q[4:].sum() == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("skew", [0.0, 0.3, 0.8, 2.0])
def test_monotone_in_batch_and_bounded(skew):
    vals = [distinct_experts(128, 8, b, skew) for b in range(1, 300)]
    assert vals[0] == pytest.approx(8.0)  # one token: exactly its k experts
    assert all(b > a for a, b in zip(vals, vals[1:]))
    assert vals[-1] <= 128


def test_more_skew_touches_fewer_experts_at_mid_batch():
    vals = [distinct_experts(256, 8, 32, s) for s in (0.0, 0.2, 0.5, 1.0, 2.0)]
    assert all(b < a for a, b in zip(vals, vals[1:]))


def test_selection_probabilities_are_a_valid_top_k_profile():
    for skew in (0.0, 0.4, 1.5, 10.0):
        q = selection_probabilities(64, 6, skew)
        assert q.sum() == pytest.approx(6.0) and q.max() <= 1.0 + 1e-12 and q.min() >= 0
        assert all(b <= a + 1e-15 for a, b in zip(q, q[1:]))  # most popular first


def test_published_statistics_invert_to_a_skew():
    s = skew_for_gini(256, 8, 0.24)
    assert gini(256, 8, s) == pytest.approx(0.24, abs=1e-6)
    c = skew_for_concentration(128, 8, 0.111)
    assert concentration(128, 8, c) == pytest.approx(0.111, abs=1e-6)
    with pytest.raises(ValueError, match="out of reach"):
        skew_for_gini(256, 8, 0.999)


def test_model_routing_blocks():
    assert skew_from_routing_doc(None, 256, 8)[0] == 0.0
    assert skew_from_routing_doc({"skew": 0.7}, 256, 8)[0] == 0.7
    s, where = skew_from_routing_doc({"gini": 0.24, "source": "paper"}, 256, 8)
    assert s == pytest.approx(skew_for_gini(256, 8, 0.24)) and "Gini 0.24" in where
    with pytest.raises(ValueError):
        skew_from_routing_doc({"something": 1}, 256, 8)


def test_skew_lowers_the_expert_bytes_of_a_moe_step():
    from vllm_spark_plugin.plan.published import deployment_for
    from vllm_spark_plugin.plan.stepmodel import ModelFactors, StepModel
    d = deployment_for({"model": "Qwen3.6-35B-A3B", "weight_format": "nvfp4", "kv_dtype": "fp8", "context": 4096})
    assert d.routing_skew()[0] == pytest.approx(skew_for_gini(256, 8, 0.24))  # the packaged default
    uniform = StepModel(d, model=ModelFactors(routing_skew=0.0)).components(64)
    skewed = StepModel(d, model=ModelFactors(routing_skew=1.0)).components(64)
    assert skewed["experts"] < uniform["experts"]
    assert skewed["experts"] / uniform["experts"] == pytest.approx(
        distinct_experts(256, 8, 64, 1.0) / distinct_experts(256, 8, 64, 0.0))
