"""`scripts/gpu-check.sh`'s tensor checks in its dry run (CPU vs CPU through the code that compares
the GPU with the CPU on a GPU machine): the NVFP4 round trip and GEMM, the MoE self-check on the
device and tune-moe's timing protocol.  They need PyTorch, which the unit tier does not have; the rest
of the dry run is tests/unit/test_gpu_check.py."""
from __future__ import annotations

import json

import pytest
import torch

from vllm_spark_plugin.gpu_check import nvfp4, run
from vllm_spark_plugin.gpu_check.env import DryEnv
from vllm_spark_plugin.gpu_check.report import FAIL, NA, PASS
from vllm_spark_plugin.quant import nvfp4 as fmt

TENSOR_CHECKS = ("nvfp4_roundtrip", "nvfp4_gemm", "moe_selfcheck", "moe_timing")


def quiet_env() -> DryEnv:
    return DryEnv(progress=lambda msg: None)


@pytest.fixture(scope="module")
def dry_result(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    code = run.run(out, dry=True, env=quiet_env())
    return code, {c["name"]: c for c in json.loads((out / "gpu-check.json").read_text())["checks"]}


def test_with_torch_every_check_of_the_dry_run_passes_but_the_gb10_ones(dry_result):
    code, checks = dry_result
    assert {n: c["status"] for n, c in checks.items() if c["status"] != PASS} == \
        {"moe_tune_smem": NA, "gb10_kernels": NA}, {n: c["detail"] for n, c in checks.items()}
    assert code == 0


def test_the_selfcheck_on_the_device_still_rejects_a_wrong_nibble_order(dry_result):
    f = dry_result[1]["moe_selfcheck"]["figures"]
    assert f["swapped_nibbles"] == {**f["swapped_nibbles"], "passed": False, "expected": False}
    assert f["swapped_nibbles"]["cosine"] < 0.5
    assert f["reference_path"]["passed"] and f["reference_on_device"]["rel_error"] < 1e-9


def test_the_timing_protocol_counts_its_calls_and_tune_picks_from_the_space(dry_result):
    f = dry_result[1]["moe_timing"]["figures"]
    assert {b["calls"] for b in f["batches"].values()} == {22}  # 2 warm-up + 20 timed
    assert sorted(int(m) for m in f["chosen"]) == [16, 256]


def one_value_off(packed, block_scale, scale_2, dtype):
    out = fmt.dequantize(packed, block_scale, scale_2, dtype).clone()
    out.view(-1)[4097] += 1
    return out


def zeros_unsigned(packed, block_scale, scale_2, dtype):
    return fmt.dequantize(packed, block_scale, scale_2, dtype) + 0.0  # -0.0 becomes +0.0: equal values, other bits


@pytest.mark.parametrize("corrupt", [one_value_off, zeros_unsigned])
def test_a_corrupted_dequantisation_on_the_device_side_fails_the_round_trip(corrupt):
    v = nvfp4.check_roundtrip(quiet_env(), dequantize=corrupt)
    assert v.status == FAIL
    bad = {k for k, n in v.figures["mismatches"].items() if n}
    assert bad and all(".dequantize." in k for k in bad), v.figures["mismatches"]
    assert "differ:" in v.detail


def test_the_known_tensors_hold_negative_zeros_after_quantisation():
    w = nvfp4.known_tensors(torch)["weight"]
    q = fmt.quantize_weight(w)
    d = fmt.dequantize(q.weight, q.weight_scale, q.weight_scale_2, torch.float32)
    assert bool(((d == 0) & torch.signbit(d)).any())  # what `zeros_unsigned` above must be caught on
