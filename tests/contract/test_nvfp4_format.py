"""NVFP4 format: bit-exact agreement with vLLM's own reference code (CPU, no fakes).

vLLM's references: `ref_nvfp4_quant` (quantise), `dequantize_to_dtype(..., swizzle=False)` and
`break_fp4_bytes` (unpack + dequantise), `ref_nvfp4_quant_dequant` (activation emulation).
Equality is checked on the raw bit patterns, so even the sign of zero must agree.
"""
from __future__ import annotations

import pytest
import torch

from vllm_spark_plugin.vllm import kernels
from vllm_spark_plugin.quant import nvfp4

DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = t.contiguous()
    return t.view(torch.int32) if t.dtype == torch.float32 else t.view(torch.int16)


def _assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    diff = (_bits(a) != _bits(b))
    assert not bool(diff.any()), f"{int(diff.sum())} elements differ, first at {torch.nonzero(diff)[0].tolist()}"


def _ref():
    from vllm.model_executor.layers.quantization.utils import nvfp4_emulation_utils as ref
    return ref


def _check_against_vllm(x: torch.Tensor, global_scale: torch.Tensor) -> None:
    ref = _ref()
    values_ref, scale_ref = ref.ref_nvfp4_quant(x.clone(), global_scale, 16)
    codes, scale = nvfp4.quantize(x, global_scale)
    _assert_same_bits(nvfp4.decode(codes), values_ref)
    _assert_same_bits(scale.to(torch.float32), scale_ref)
    packed = nvfp4.pack(codes)
    _assert_same_bits(ref.break_fp4_bytes(packed, torch.float32), nvfp4.decode(nvfp4.unpack(packed)))
    scale_2 = (1.0 / global_scale).to(torch.float32)
    _assert_same_bits(nvfp4.dequantize(packed, scale, scale_2, x.dtype),
                      ref.dequantize_to_dtype(packed, scale, scale_2, x.dtype, 16, swizzle=False))
    _assert_same_bits(nvfp4.quant_dequant(x, global_scale), ref.ref_nvfp4_quant_dequant(x, global_scale, 16))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_tensors_bit_exact(dtype, seed):
    g = torch.Generator().manual_seed(seed)
    # magnitudes over 8 decades per row, so block scales span the FP8 range incl. subnormals
    x = (torch.randn(48, 256, generator=g) * 10 ** (torch.rand(48, 1, generator=g) * 7 - 4)).to(dtype)
    _check_against_vllm(x, nvfp4.global_scale_from_amax(nvfp4.amax(x)))
    _check_against_vllm(x, torch.tensor(1.0))  # a fixed global scale: block scales clamp at 448


@pytest.mark.parametrize("dtype", DTYPES)
def test_adversarial_tensors_bit_exact(dtype):
    fmax = float(torch.finfo(dtype).max) if dtype != torch.float32 else 3.0e38
    tiny = float(torch.finfo(dtype).tiny)
    rows = [
        torch.zeros(64),                                        # all zeros
        torch.full((64,), fmax), torch.full((64,), -fmax),      # +/- max of the dtype
        torch.full((64,), tiny), torch.full((64,), -tiny),      # smallest normals
        torch.full((64,), 1e-30),                               # underflows in bf16/fp16 -> 0
        torch.cat([torch.full((1,), 1000.0), torch.full((63,), 0.01)]),  # one outlier in a block
        torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 8),  # E2M1 rounding ties
        -torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0] * 8),
        torch.tensor([-0.0, 0.0, -1e-6, 1e-6] * 16),             # signed zeros / tiny negatives
    ]
    x = torch.stack(rows).to(dtype)
    for gs in (nvfp4.global_scale_from_amax(nvfp4.amax(x)), torch.tensor(1.0), torch.tensor(2688.0)):
        _check_against_vllm(x, gs.to(torch.float32))


def test_3d_expert_dequantize_matches_vllm():
    ref = _ref()
    g = torch.Generator().manual_seed(7)
    experts = [nvfp4.quantize_weight((torch.randn(32, 64, generator=g) * (i + 1)).to(torch.bfloat16))
               for i in range(4)]
    packed = torch.stack([q.weight for q in experts])
    scale = torch.stack([q.weight_scale for q in experts])
    scale_2 = torch.stack([q.weight_scale_2 for q in experts])
    ours = nvfp4.dequantize(packed, scale, scale_2, torch.bfloat16)
    _assert_same_bits(ours, ref.dequantize_to_dtype(packed, scale, scale_2, torch.bfloat16, 16, swizzle=False))
    _assert_same_bits(ours[2], experts[2].dequantize(torch.bfloat16))


def test_global_scale_convention_matches_vllm_online_quantiser():
    """weight_scale_2 = amax / (6 * 448), the value vLLM's online NVFP4 quantiser stores."""
    w = torch.randn(16, 32).to(torch.bfloat16) * 3
    q = nvfp4.quantize_weight(w)
    expected = 1.0 / ((6.0 * 448.0) / w.abs().max().float())
    assert torch.equal(q.weight_scale_2, expected)
    assert q.weight.dtype == torch.uint8 and q.weight.shape == (16, 16)
    assert q.weight_scale.dtype == torch.float8_e4m3fn and q.weight_scale.shape == (16, 2)
    # the dequantised weight is close to the original (4-bit values, FP8 scales)
    err = (q.dequantize(torch.float32) - w.float()).abs().max() / w.float().abs().max()
    assert float(err) < 0.2


def test_pack_unpack_round_trip_and_nibble_order():
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 2)  # [3, 32], every code
    packed = nvfp4.pack(codes)
    assert packed.shape == (3, 16)
    assert torch.equal(nvfp4.unpack(packed), codes)
    # element 0 in the low nibble, element 1 in the high nibble (ModelOpt / vLLM order)
    assert int(packed[0, 0]) == (0 | (1 << 4))
    all_bytes = torch.arange(256, dtype=torch.uint8).reshape(8, 32)
    assert torch.equal(nvfp4.pack(nvfp4.unpack(all_bytes)), all_bytes)
    assert nvfp4.decode(torch.tensor([0x8], dtype=torch.uint8)).item() == 0.0
    assert torch.signbit(nvfp4.decode(torch.tensor([0x8], dtype=torch.uint8))).item()
    assert nvfp4.decode(torch.arange(8, dtype=torch.uint8)).tolist() == list(nvfp4.E2M1_VALUES)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_input_rejected_with_clear_error(bad):
    x = torch.ones(4, 32, dtype=torch.bfloat16)
    x[2, 17] = bad
    with pytest.raises(nvfp4.NvFp4Error, match=r"layer\.q_proj\.weight: 1 non-finite value.*index \[2, 17\]"):
        nvfp4.quantize_weight(x, name="layer.q_proj.weight")
    with pytest.raises(nvfp4.NvFp4Error, match="NaN or inf"):
        nvfp4.quantize(x, 1.0)


def test_bad_shapes_and_scales_rejected():
    with pytest.raises(nvfp4.NvFp4Error, match="not a multiple of 16"):
        nvfp4.quantize(torch.ones(2, 24), 1.0)
    with pytest.raises(nvfp4.NvFp4Error, match="group size|groups of 16"):
        nvfp4.quantize(torch.ones(2, 64), 1.0, group_size=32)
    with pytest.raises(nvfp4.NvFp4Error, match="global scale"):
        nvfp4.quantize(torch.ones(2, 32), float("nan"))
    with pytest.raises(nvfp4.NvFp4Error, match="does not match"):
        nvfp4.dequantize(torch.zeros(2, 16, dtype=torch.uint8), torch.zeros(2, 1, dtype=torch.float8_e4m3fn), 1.0)


def test_vllm_reference_accessors_in_vllm_module_agree():
    """The port's accessors the self-check uses are vLLM's reference functions."""
    x = torch.randn(8, 64).to(torch.bfloat16)
    gs = nvfp4.global_scale_from_amax(nvfp4.amax(x))
    vals, scales = kernels.vllm_reference_quantize(x, gs)
    codes, ours = nvfp4.quantize(x, gs)
    _assert_same_bits(nvfp4.decode(codes), vals)
    packed = nvfp4.pack(codes)
    _assert_same_bits(kernels.vllm_reference_dequantize(packed, ours, 1.0 / gs, torch.bfloat16),
                      nvfp4.dequantize(packed, ours, 1.0 / gs))
