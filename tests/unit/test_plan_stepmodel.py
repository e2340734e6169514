"""Decode step-time model, knee, capacity, TTFT and multi-Spark terms of the planner."""
from __future__ import annotations

import math

import pytest

from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.deployment import Deployment
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.planner import make_plan
from vllm_spark_plugin.plan.stepmodel import Efficiency, StepModel, distinct_experts


def dep(model, fmt="nvfp4", kv="bf16", context=2048, **kw):
    arch = load_model(model)[0]
    hw = load_hardware(kw.pop("hw", "gb10"))
    return Deployment(arch=arch, hw=hw, weight_format=fmt, formats=component_formats(fmt), kv_dtype=kv,
                      state_dtype=arch.state_dtype, context=context, os_reserve_bytes=hw.os_reserve_bytes, **kw)


def test_distinct_experts_grows_and_saturates():
    # b=1: exactly top_k experts; b -> inf: all E
    assert distinct_experts(256, 8, 1) == pytest.approx(8)
    # b=64: 256 * (1 - (1 - 8/256)^64) = 256 * (1 - 0.96875^64) = 222.44
    assert distinct_experts(256, 8, 64) == pytest.approx(256 * (1 - 0.96875 ** 64))
    assert distinct_experts(256, 8, 10_000) == pytest.approx(256, rel=1e-9)
    vals = [distinct_experts(128, 8, b) for b in range(1, 200)]
    assert all(b > a for a, b in zip(vals, vals[1:]))


def test_dense_step_is_exactly_linear_and_knee_is_alpha_over_beta():
    sm = StepModel(dep("Llama-3.1-8B"))
    t1, t2, t3 = (sm.step_seconds(b) for b in (1, 2, 3))
    assert t2 - t1 == pytest.approx(t3 - t2)
    lin = sm.linear_fit()
    assert lin["r2"] == pytest.approx(1.0)
    a, beta = sm.alpha_beta_physical(1)
    assert lin["alpha_seconds"] == pytest.approx(a) and lin["beta_seconds"] == pytest.approx(beta)
    assert lin["knee"] == pytest.approx(a / beta)
    assert lin["plateau_tokens_per_second"] == pytest.approx(1 / beta)


def test_moe_step_has_the_expert_term_and_a_fitted_knee():
    sm = StepModel(dep("Qwen3-30B-A3B"))
    c1, c64 = sm.components(1), sm.components(64)
    assert c1["experts_touched_per_layer"] == pytest.approx(8)
    assert c64["experts"] > 10 * c1["experts"]  # more distinct experts read per step
    lin = sm.linear_fit()
    assert lin["r2"] < 1.0  # not a straight line
    assert 1 < lin["knee"] < 64
    # per-stream rate falls and aggregate rises with concurrency
    rates = [sm.per_stream_rate(b) for b in (1, 4, 16, 64)]
    aggs = [sm.aggregate_rate(b) for b in (1, 4, 16, 64)]
    assert rates == sorted(rates, reverse=True) and aggs == sorted(aggs)


def test_bandwidth_efficiency_scales_the_memory_terms():
    d = dep("Llama-3.1-8B")
    a = StepModel(d, Efficiency(bandwidth=0.5)).components(1)
    b = StepModel(d, Efficiency(bandwidth=1.0)).components(1)
    assert a["weights"] == pytest.approx(2 * b["weights"])
    assert a["overhead"] == b["overhead"]


def test_capacity_uses_the_seed_floor_definition():
    sm = StepModel(dep("Qwen3-30B-A3B"))
    cap = sm.capacity(20.0, limit=256)
    n = cap["streams"]
    assert n is not None and sm.per_stream_rate(n) >= 20.0
    assert n == 256 or sm.per_stream_rate(n + 1) < 20.0
    assert sm.capacity(1e6, limit=256)["streams"] is None  # nobody reaches 1M tok/s
    assert sm.capacity(20.0, limit=3)["streams"] <= 3


def test_ttft_is_prefill_plus_a_step_and_grows_with_prompt():
    short = StepModel(dep("Llama-3.1-8B", prompt_tokens=128))
    long = StepModel(dep("Llama-3.1-8B", prompt_tokens=4096, context=8192))
    assert short.ttft_seconds(1) == pytest.approx(short.prefill_seconds(1, 128) + short.step_seconds(1))
    assert long.ttft_seconds(1) > short.ttft_seconds(1)
    assert short.ttft_wave_median_seconds(64) > short.ttft_seconds(64)


def test_tensor_parallel_adds_allreduce_cost():
    one = StepModel(dep("Llama-3.1-8B"))
    two = StepModel(dep("Llama-3.1-8B", tp=2))
    assert two.components(1)["comm"] > 0 and one.components(1)["comm"] == 0
    # 2 all-reduces per layer x 32 layers = 64 collectives of 4096 x 8 tokens x 2 bytes = 65536 bytes,
    # each 24.5 us + 65536 / 1.61 GB/s = 65.2 us on the gb10 link (measured: 67.9 us at 64 KB)
    assert two.components(8)["comm"] == pytest.approx(64 * (24.5e-6 + 65536 / 1.61e9))
    assert 64e-6 < 24.5e-6 + 65536 / 1.61e9 < 68e-6
    # half the weights per rank: faster per stream than one Spark
    assert two.per_stream_rate(1) > one.per_stream_rate(1)


def test_pipeline_parallel_runs_micro_batches():
    one = StepModel(dep("Llama-3.3-70B"))
    two = StepModel(dep("Llama-3.3-70B", pp=2))
    assert two.components(8)["micro_batch"] == 4
    # a stream sees roughly the one-node step of half the batch plus a hop
    assert two.step_seconds(8) == pytest.approx(one.step_seconds(4) + two.comm_seconds(4)[0] + two.comm_seconds(4)[1])


def test_fleet_capacity_adds_over_replicas():
    one = make_plan(dep("Qwen3-30B-A3B"))
    four = make_plan(dep("Qwen3-30B-A3B", dp=4))
    assert four["fleet"]["capacity_streams"] == 4 * one["capacity"]["streams"]
    assert four["fleet"]["sparks"] == 4
    assert four["fleet"]["aggregate_tokens_per_second_at_capacity"] == pytest.approx(
        4 * one["capacity"]["aggregate_tokens_per_second"])


def test_plan_json_is_finite_and_complete():
    plan = make_plan(dep("gpt-oss-20b", fmt="mxfp4"))
    for key in ("curve", "memory", "step_model", "knee", "capacity", "inputs", "calibration", "fleet"):
        assert key in plan
    for row in plan["curve"]:
        for k in ("concurrency", "aggregate_tokens_per_second", "per_stream_tokens_per_second", "ttft_seconds"):
            assert isinstance(row[k], (int, float)) and math.isfinite(row[k])
    assert plan["step_model"]["alpha_seconds"] > 0 and plan["step_model"]["beta_seconds"] > 0


def test_speculative_step_verifies_n_plus_1_tokens_and_emits_the_acceptance_length():
    from vllm_spark_plugin.plan.engine import Serving, SpecDecode
    plain = StepModel(dep("Qwen3-30B-A3B"))
    spec = StepModel(dep("Qwen3-30B-A3B", serving=Serving(spec=SpecDecode(num_tokens=2, acceptance_length=2.5))))
    c = spec.components(4)
    assert c["tokens_per_stream"] == 3 and c["emitted_per_step"] == 2.5
    # 4 streams x 3 tokens are routed: the experts of 12 tokens are read
    assert c["experts_touched_per_layer"] == pytest.approx(distinct_experts(128, 8, 12, spec.skew))
    assert c["draft"] > 0 and spec.step_seconds(4) > plain.step_seconds(4)
    assert spec.per_stream_rate(4) == pytest.approx(2.5 / spec.step_seconds(4))
    # default acceptance: 1 + 0.85 + 0.85^2 for two drafted tokens
    assert SpecDecode(num_tokens=2).mean_emitted() == pytest.approx(1 + 0.85 + 0.85 ** 2)


def test_enforce_eager_adds_a_host_launch_per_kernel():
    from vllm_spark_plugin.plan.engine import ENGINES, Serving
    graphs = StepModel(dep("Llama-3.1-8B"))
    eager = StepModel(dep("Llama-3.1-8B", serving=Serving(enforce_eager=True)))
    extra = eager.components(1)["overhead"] - graphs.components(1)["overhead"]
    assert extra == pytest.approx(graphs.kernels * ENGINES["vllm"].eager_kernel_seconds)


def test_engine_overhead_scales_the_kernel_and_host_terms():
    from vllm_spark_plugin.plan.engine import ENGINES, Serving
    hw = load_hardware("gb10")
    sm = StepModel(dep("Llama-3.1-8B", serving=Serving(engine="llama.cpp")))
    e = ENGINES["llama.cpp"]
    assert sm.base_overhead == pytest.approx(sm.kernels * hw.kernel_overhead_seconds * e.kernel_scale
                                             + hw.step_overhead_seconds * e.host_scale)


def test_kernel_path_efficiency_applies_per_path():
    from vllm_spark_plugin.plan.engine import Serving, path_efficiency
    assert path_efficiency("vllm", "nvfp4", "marlin").bandwidth_scale == 1.0  # generic path
    slow = path_efficiency("vllm-0.17", "nvfp4", "marlin")
    assert slow.bandwidth_scale == 0.5 and "kubis" in slow.source
    base = StepModel(dep("Qwen3-30B-A3B")).components(1)
    old = StepModel(dep("Qwen3-30B-A3B", serving=Serving(release="vllm-0.17", moe_backend="marlin"))).components(1)
    assert old["experts"] == pytest.approx(2 * base["experts"])  # the MoE backend's path only
    assert old["weights"] == pytest.approx(base["weights"])
