"""GB10 NVFP4 MoE backend policy over simulated devices, and the self-check run for real on CPU.

Fakes, at the kernel seam only (no GB10 here): the device capability and the availability map are
passed in as data, and a "kernel" is a runner function `problem -> output` standing in for
`vllm.kernels.nvfp4_moe_runner`.  The fake kernels compute real MoE outputs on the CPU (correct ones via
the reference math, broken ones by corrupting the weights' nibble order or raising), so the
self-check's comparison against vLLM's reference dequantiser runs for real.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import torch

from vllm_spark_plugin.vllm import kernels, platform
from vllm_spark_plugin.moe import policy, selfcheck, startup
from vllm_spark_plugin.quant import nvfp4

ALL_AVAILABLE = {name: None for name in policy.SM12X_PREFERENCE}


@pytest.fixture(scope="module")
def problem() -> selfcheck.MoEProblem:
    return selfcheck.make_problem()


def vllm_dequant(packed, scale, scale_2, dtype):
    return kernels.vllm_reference_dequantize(packed, scale, scale_2, dtype)


# ---- fake kernels (the seam) ---------------------------------------------------------------------
def correct_w4a16(problem):
    return selfcheck.reference_runner(problem)


def correct_w4a4(problem):
    """W4A4 emulation with vLLM's own activation quantiser (what a correct FP4 kernel computes)."""
    w13 = nvfp4.dequantize(problem.w13, problem.w13_scale, problem.w13_scale_2, torch.float32)
    w2 = nvfp4.dequantize(problem.w2, problem.w2_scale, problem.w2_scale_2, torch.float32)

    def act_quant(t, e, which):
        s = (problem.a13_scale if which == "a13" else problem.a2_scale)[e]
        return kernels.vllm_reference_quant_dequant(t.to(torch.bfloat16), (1.0 / s).reshape(()))

    return selfcheck.moe_forward(problem.x, w13, w2, problem.topk_weights, problem.topk_ids, act_quant,
                                 compute_dtype=torch.float32).to(torch.bfloat16)


def swapped_nibbles(problem):
    """A kernel that reads the two E2M1 values of a byte in the wrong order."""
    w13 = ((problem.w13 & 0xF) << 4) | (problem.w13 >> 4)
    return selfcheck.reference_runner(dataclasses.replace(problem, w13=w13))


def wrong_expert(problem):
    """A kernel that routes every token to the next expert."""
    ids = (problem.topk_ids + 1) % problem.w13.shape[0]
    return selfcheck.reference_runner(dataclasses.replace(problem, topk_ids=ids))


def crashes(problem):
    raise RuntimeError("Failed to initialize cutlass TMA WS grouped gemm")


def runners(**by_name):
    calls = []

    def runner_for(name):
        calls.append(name)
        return by_name.get(name, correct_w4a4 if name in policy.W4A4_BACKENDS else correct_w4a16)

    runner_for.calls = calls
    return runner_for


# ---- the self-check itself, for real on CPU ------------------------------------------------------
def test_reference_candidate_passes_against_vllm_reference(problem):
    r = selfcheck.check_runner(selfcheck.reference_runner, False, problem, vllm_dequant)
    assert r.passed, r.detail
    assert r.cosine > 0.999 and r.rel_error < 0.02


def test_w4a4_candidate_checked_against_w4a4_reference(problem):
    ok = selfcheck.check_runner(correct_w4a4, True, problem, vllm_dequant)
    assert ok.passed, ok.detail
    # the same W4A4 output judged as W4A16 is far off: the reference follows the backend's scheme
    assert ok.rel_error < selfcheck.check_runner(correct_w4a4, False, problem, vllm_dequant).rel_error


@pytest.mark.parametrize("bad", [swapped_nibbles, wrong_expert])
def test_wrong_results_fail_the_self_check(problem, bad):
    r = selfcheck.check_runner(bad, False, problem, vllm_dequant)
    assert not r.passed
    assert r.cosine < 0.9, r.detail


def test_crash_and_nan_fail_the_self_check(problem):
    r = selfcheck.check_runner(crashes, False, problem)
    assert not r.passed and "TMA WS" in r.detail
    nan = selfcheck.check_runner(lambda p: torch.full((p.x.shape[0], p.x.shape[1]), float("nan")), False, problem)
    assert not nan.passed and "NaN" in nan.detail
    shape = selfcheck.check_runner(lambda p: torch.zeros(3, 3), False, problem)
    assert not shape.passed and "shape" in shape.detail


# ---- policy over simulated capabilities ----------------------------------------------------------
@pytest.mark.parametrize("cap", [(12, 1), (12, 0)])
def test_sm12x_prefers_marlin_when_it_passes(cap, problem):
    rf = runners()
    d = policy.decide(cap, ALL_AVAILABLE, selfcheck.make_self_check(rf, problem, vllm_dequant))
    assert d.backend == "marlin" and d.source == "policy"
    assert rf.calls == ["marlin"]  # first passing candidate stops the search
    assert "passed" in d.candidates["marlin"]


def test_candidate_failing_self_check_is_dropped(problem):
    rf = runners(marlin=swapped_nibbles)
    d = policy.decide((12, 1), ALL_AVAILABLE, selfcheck.make_self_check(rf, problem, vllm_dequant))
    assert d.backend == "flashinfer_cutlass"
    assert d.candidates["marlin"].startswith("failed")
    assert rf.calls == ["marlin", "flashinfer_cutlass"]


def test_crashing_and_missing_candidates_are_dropped(problem):
    available = dict(ALL_AVAILABLE, flashinfer_cutlass="Python package 'flashinfer' is not installed")
    rf = runners(marlin=crashes)
    d = policy.decide((12, 1), available, selfcheck.make_self_check(rf, problem, vllm_dequant))
    assert d.backend == "b12x"
    assert "TMA WS" in d.candidates["marlin"]
    assert d.candidates["flashinfer_cutlass"].startswith("unavailable: Python package 'flashinfer'")
    assert "flashinfer_cutlass" not in rf.calls


def test_nothing_passes_leaves_the_choice_to_vllm(problem):
    rf = runners(marlin=wrong_expert, flashinfer_cutlass=crashes, b12x=swapped_nibbles, cutlass=wrong_expert)
    d = policy.decide((12, 1), ALL_AVAILABLE, selfcheck.make_self_check(rf, problem, vllm_dequant))
    assert d.backend == policy.AUTO and d.source == "vllm-auto"
    assert all(v.startswith("failed") for v in d.candidates.values())


@pytest.mark.parametrize("cap", [(10, 0), (9, 0)])
def test_other_gpus_keep_vllms_selection(cap):
    rf = runners()
    d = policy.decide(cap, ALL_AVAILABLE, selfcheck.make_self_check(rf))
    assert d.backend == policy.AUTO and f"{cap[0]}.{cap[1]}" in d.reason
    assert rf.calls == []


def test_cpu_uses_the_reference_path():
    d = policy.decide(None, {}, None)
    assert d.backend == policy.REFERENCE and d.source == "reference"


def test_vllm_moe_backend_always_wins():
    rf = runners()
    d = policy.decide((12, 1), ALL_AVAILABLE, selfcheck.make_self_check(rf), setting="b12x",
                      vllm_backend="flashinfer_cutlass")
    assert d.backend == "flashinfer_cutlass" and d.source == "vllm"
    assert rf.calls == []


def test_user_setting_overrides_preference(problem):
    rf = runners()
    d = policy.decide((12, 1), ALL_AVAILABLE, selfcheck.make_self_check(rf, problem, vllm_dequant), setting="B12X")
    assert d.backend == "b12x" and d.source == "setting"
    assert rf.calls == ["b12x"]


def test_user_setting_failing_or_unavailable_falls_back(problem, caplog):
    rf = runners(b12x=swapped_nibbles)
    d = policy.decide((12, 1), ALL_AVAILABLE, selfcheck.make_self_check(rf, problem, vllm_dequant), setting="b12x")
    assert d.backend == "marlin" and "failed its self-check" in d.reason
    d = policy.decide((12, 1), dict(ALL_AVAILABLE, b12x="b12x is not installed"),
                      selfcheck.make_self_check(runners(), problem, vllm_dequant), setting="b12x")
    assert d.backend == "marlin" and "unavailable" in d.reason
    d = policy.decide((12, 1), ALL_AVAILABLE, selfcheck.make_self_check(runners(), problem, vllm_dequant),
                      setting="triton")
    assert d.backend == "marlin" and "not one of" in d.reason


def test_preference_order_is_documented_with_measurements():
    doc = policy.__doc__
    assert policy.SM12X_PREFERENCE[0] == "marlin"
    for figure in ("40.715", "38.643", "557.471", "558.618"):
        assert figure in doc
    for name in policy.SM12X_PREFERENCE:
        assert f"`{name}`" in doc


# ---- the decision reaches the API server (info metric label) -------------------------------------
def test_decision_is_published_across_processes(tmp_path, monkeypatch):
    state = tmp_path / "moe.json"
    monkeypatch.setenv(policy.STATE_ENV, str(state))
    policy.reset()
    assert policy.current_moe_backend() == policy.NONE
    policy.record(policy.Decision("marlin", "test", "policy", {"marlin": "passed: cosine 1.0"}))
    assert policy.current_moe_backend() == "marlin"
    out = subprocess.run([sys.executable, "-c",
                          "from vllm_spark_plugin.moe import policy; print(policy.current_moe_backend())"],
                         capture_output=True, text=True, env=dict(os.environ), timeout=120)
    assert out.stdout.strip() == "marlin", out.stderr
    assert json.loads(state.read_text())["candidates"]["marlin"].startswith("passed")
    policy.reset()


def test_startup_on_this_cpu_records_reference(tmp_path, monkeypatch):
    """The real start-up glue on this machine (no CUDA): the reference path, published."""
    monkeypatch.setenv(policy.STATE_ENV, str(tmp_path / "s.json"))
    startup.reset()

    class MoeConfig:
        moe_backend = "auto"

    d = startup.decide_once(MoeConfig(), None)
    assert d.backend == policy.REFERENCE
    assert policy.current_moe_backend() == policy.REFERENCE
    assert startup.decide_once(None, None) is d  # once per process
    startup.reset()


def test_ensure_state_path_sets_inheritable_env(monkeypatch):
    monkeypatch.setenv(policy.STATE_ENV, "")  # recorded, so teardown restores the original state
    monkeypatch.delenv(policy.STATE_ENV)
    p = policy.ensure_state_path()
    assert os.environ[policy.STATE_ENV] == str(p)
    assert policy.ensure_state_path() == p


def test_no_self_check_keeps_preference_order():
    d = policy.decide((12, 1), dict(ALL_AVAILABLE, marlin="not built for sm_121"), None)
    assert d.backend == "flashinfer_cutlass" and "self-check skipped" in d.candidates["flashinfer_cutlass"]


class _Parallel:
    def __init__(self, tp):
        self.tp_size, self.dp_size, self.use_ep = tp, 1, False


class _MoeConfig:
    def __init__(self, tp=1, backend="auto"):
        self.moe_backend = backend
        self.moe_parallel_config = _Parallel(tp)


@pytest.mark.parametrize("tp", [1, 2])
def test_startup_glue_on_a_simulated_gb10(monkeypatch, tmp_path, tp):
    """The start-up glue with the device and the kernels faked at their seams (`platform.has_cuda`,
    `device_capability`, backend availability, `nvfp4_moe_runner`); the self-check and vLLM's
    reference dequantiser run for real."""
    monkeypatch.setenv(policy.STATE_ENV, str(tmp_path / "s.json"))
    monkeypatch.setenv("SPARK_PLUGIN_MOE_BACKEND", "")
    monkeypatch.setattr(platform, "has_cuda", lambda: True)
    monkeypatch.setattr(platform, "device_capability", lambda: (12, 1))
    monkeypatch.setattr(kernels, "nvfp4_moe_backend_availability", lambda cfg, a16, names: dict(ALL_AVAILABLE))
    built = []

    def runner(name, moe_config, quant_config):
        built.append(name)
        return swapped_nibbles if name == "marlin" else (correct_w4a4 if name in policy.W4A4_BACKENDS else correct_w4a16)

    monkeypatch.setattr(kernels, "nvfp4_moe_runner", runner)
    startup.reset()
    try:
        d = startup.decide_once(_MoeConfig(tp), type("Q", (), {"quant_method": "NVFP4"})())
    finally:
        startup.reset()
    if tp == 1:
        assert d.backend == "flashinfer_cutlass" and built == ["marlin", "flashinfer_cutlass"]
        assert d.candidates["marlin"].startswith("failed: cosine")
    else:
        assert d.backend == "marlin" and built == [] and "self-check skipped" in d.candidates["marlin"]
    vllm_choice = policy.decide((12, 1), ALL_AVAILABLE, None, vllm_backend="cutlass")
    assert vllm_choice.backend == "cutlass"
