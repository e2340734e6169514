"""Interconnect term for 2+ Sparks against hand-computed cases (gb10 profile: NCCL all-reduce measured
between two Sparks, 24.5 us + bytes / 1.61 GB/s for decode-size messages, 20 GB/s above 1 MiB)."""
from __future__ import annotations

import pytest

from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.deployment import Deployment, PlanError
from vllm_spark_plugin.plan.engine import Serving
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.stepmodel import Efficiency, StepModel

LAT, SMALL_BW, BIG_BW, LIMIT = 24.5e-6, 1.61e9, 20e9, 1 << 20


def dep(model="Llama-3.1-8B", **kw):
    arch, doc = load_model(model)
    hw = load_hardware("gb10")
    return Deployment(arch=arch, hw=hw, weight_format="nvfp4", formats=component_formats("nvfp4"), kv_dtype="bf16",
                      context=2048, os_reserve_bytes=hw.os_reserve_bytes, model_routing=doc.get("routing") or {}, **kw)


def test_collective_time_small_and_large_messages():
    hw = load_hardware("gb10")
    assert hw.collective_seconds(0) == 0.0
    assert hw.collective_seconds(8192) == pytest.approx(LAT + 8192 / SMALL_BW)          # 29.6 us (measured 35.2 / 30.3)
    assert hw.collective_seconds(65536) == pytest.approx(LAT + 65536 / SMALL_BW)        # 65.2 us (measured 67.9)
    # a 64 MiB prefill all-reduce: 1 MiB on the small-message line, the rest at the bus bandwidth
    n = 64 * (1 << 20)
    assert hw.collective_seconds(n, ring=1.0) == pytest.approx(LAT + LIMIT / SMALL_BW + (n - LIMIT) / BIG_BW)


def test_tp2_decode_allreduces_by_hand():
    # Llama-3.1-8B: 32 layers x 2 all-reduces of hidden 4096 x b tokens x 2 bytes
    sm = StepModel(dep(tp=2))
    for b in (1, 8, 64):
        n = 4096 * b * 2
        assert sm.components(b)["comm"] == pytest.approx(64 * (LAT + n / SMALL_BW))
    lat, rest = sm.comm_seconds(1)
    assert lat == pytest.approx(64 * LAT) and rest == pytest.approx(64 * 8192 / SMALL_BW)


def test_link_scale_multiplies_only_the_link():
    d = dep(tp=2)
    a, b = StepModel(d).components(8), StepModel(d, Efficiency(link_scale=2.0)).components(8)
    assert b["comm"] == pytest.approx(2 * a["comm"]) and b["weights"] == a["weights"]


def test_pipeline_hop_by_hand():
    # pp=2: one hop of the micro-batch's hidden vectors (8 streams -> micro-batch 4)
    sm = StepModel(dep("Llama-3.3-70B", pp=2))
    assert sm.components(8)["comm"] == pytest.approx(LAT + 8192 * 4 * 2 / SMALL_BW)


def test_expert_parallel_replaces_the_moe_allreduce_with_all_to_all():
    # Qwen3-30B-A3B: 48 layers, each attention + MoE; hidden 2048, top-8.  tp=2 with experts spread:
    # 48 attention all-reduces of 2048 x b x 2 bytes + 2 x 48 all-to-alls of (1/2) x 8 x 2048 x b x 2 bytes
    b = 4
    ep = StepModel(dep("Qwen3-30B-A3B", tp=2, serving=Serving(expert_parallel=True)))
    expected = 48 * (LAT + 2048 * b * 2 / SMALL_BW) + 96 * (LAT + 0.5 * 8 * 2048 * b * 2 / SMALL_BW)
    assert ep.components(b)["comm"] == pytest.approx(expected)
    plain = StepModel(dep("Qwen3-30B-A3B", tp=2))
    assert plain.components(b)["comm"] == pytest.approx(96 * (LAT + 2048 * b * 2 / SMALL_BW))


def test_expert_parallel_needs_two_ranks():
    with pytest.raises(PlanError, match="expert parallelism needs"):
        dep("Qwen3-30B-A3B", serving=Serving(expert_parallel=True))


def test_data_parallel_replicas_add_no_link_time():
    assert StepModel(dep(dp=4)).components(8)["comm"] == 0.0
