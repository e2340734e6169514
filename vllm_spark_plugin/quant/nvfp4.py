"""The NVFP4 format: E2M1 values, an FP8-E4M3 scale per 16 values, an FP32 global scale.

Bit-compatible with vLLM's reference code (`ref_nvfp4_quant`, `dequantize_to_dtype` with
`swizzle=False`, `break_fp4_bytes`) and with ModelOpt checkpoints:

* a value is 4 bits: sign bit (bit 3) and a 3-bit magnitude index into
  `E2M1_VALUES = 0, 0.5, 1, 1.5, 2, 3, 4, 6`;
* two values share a byte, the even-indexed element in the LOW nibble, the odd one in the high
  nibble (`weight` is uint8 `[N, K/2]`);
* each group of 16 consecutive values along K has an FP8-E4M3 scale (`weight_scale`
  float8_e4m3fn `[N, K/16]`);
* the tensor has one FP32 dequantisation scale `weight_scale_2 = amax / (6 * 448)`;
  quantisation uses its inverse, the "global scale" `6 * 448 / amax`.

    dequantised = e2m1 * float(weight_scale) * weight_scale_2

Only torch is needed; everything runs on the CPU.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

FP4_E2M1_MAX = 6.0
FP8_E4M3_MAX = 448.0
GROUP_SIZE = 16
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# vLLM computes the per-group scale as vec_max * (1 / 6); keep the same rounding.
_FP4_MAX_RECIPROCAL = 1 / FP4_E2M1_MAX
# Elements per quantisation chunk: bounds the fp32 temporaries of one call to a few x 4 MiB
# (ops are row-wise, so chunking by rows does not change a single bit of the result).
_CHUNK_ELEMENTS = 1 << 20


class NvFp4Error(ValueError):
    """Input the NVFP4 format cannot represent (NaN/inf, bad shapes or dtypes)."""


def _e2m1_table(device) -> torch.Tensor:
    return torch.tensor(E2M1_VALUES, dtype=torch.float32, device=device)


def check_finite(x: torch.Tensor, name: str = "tensor") -> None:
    """Raise NvFp4Error naming the first NaN/inf element of `x`."""
    if x.is_floating_point() and x.numel():
        # max/min propagate NaN and inf without a full-size temporary; search only when needed
        if bool(torch.isfinite(x.max())) and bool(torch.isfinite(x.min())):
            return
        bad = ~torch.isfinite(x)
        if bool(bad.any()):
            idx = tuple(int(i) for i in torch.nonzero(bad)[0].tolist())
            n = int(bad.sum())
            raise NvFp4Error(
                f"{name}: {n} non-finite value(s) (first {x[idx].item()!r} at index {list(idx)}); "
                "NVFP4 cannot represent NaN or inf: fix or drop the tensor before quantising")


def _check_groups(x: torch.Tensor, group_size: int, name: str) -> None:
    if group_size != GROUP_SIZE:
        raise NvFp4Error(f"{name}: NVFP4 uses groups of {GROUP_SIZE} values, got group_size={group_size}")
    if x.ndim != 2:
        raise NvFp4Error(f"{name}: expected a 2-D tensor [N, K], got shape {list(x.shape)}")
    if x.shape[1] % group_size:
        raise NvFp4Error(f"{name}: K={x.shape[1]} (shape {list(x.shape)}) is not a multiple of {group_size}")


def global_scale_from_amax(amax: torch.Tensor | float) -> torch.Tensor:
    """Quantisation global scale 6*448/amax (fp32), as vLLM's NVFP4 quantiser computes it."""
    device = amax.device if isinstance(amax, torch.Tensor) else "cpu"
    a = torch.as_tensor(amax, dtype=torch.float32, device=device).clamp_min(1e-8)
    return (FP4_E2M1_MAX * FP8_E4M3_MAX) / a


def amax(x: torch.Tensor) -> torch.Tensor:
    """max |x| as fp32 scalar tensor (no full-size temporary)."""
    if not x.numel():
        return torch.zeros((), dtype=torch.float32, device=x.device)
    return torch.maximum(x.max().to(torch.float32).abs(), x.min().to(torch.float32).abs())


def _reciprocal(t: torch.Tensor) -> torch.Tensor:
    # vLLM's get_reciprocal: 1 / (x + (x == 0) * 1e8), kept verbatim for identical rounding.
    return 1.0 / (t + (t == 0) * 1e8)


def _round_e2m1_index(a: torch.Tensor) -> torch.Tensor:
    """Magnitude index (0..7) of |x| already clipped to [0, 6]; ties go to the even value,
    exactly the thresholds of vLLM's `cast_to_fp4`."""
    idx = (a > 0.25).to(torch.uint8)
    idx += a >= 0.75
    idx += a > 1.25
    idx += a >= 1.75
    idx += a > 2.5
    idx += a >= 3.5
    idx += a > 5.0
    return idx


def _quantize_chunks(x: torch.Tensor, gs: torch.Tensor, group_size: int):
    """Yield (first row, codes uint8 [rows, K], block scales fp8 [rows, K/16]) chunk by chunk."""
    n, k = x.shape
    inv_gs = _reciprocal(gs)
    rows = max(1, _CHUNK_ELEMENTS // max(k, 1))
    for r0 in range(0, n, rows):
        xb = x[r0:r0 + rows].reshape(-1, k // group_size, group_size)
        vec_max = torch.max(torch.abs(xb), dim=-1, keepdim=True)[0].to(torch.float32)
        scale = gs * (vec_max * _FP4_MAX_RECIPROCAL)
        scale = torch.clamp(scale, max=FP8_E4M3_MAX, min=-FP8_E4M3_MAX)
        scale8 = scale.to(torch.float8_e4m3fn)
        output_scale = _reciprocal(scale8.to(torch.float32) * inv_gs)
        scaled = torch.clamp(xb.to(torch.float32) * output_scale, -FP4_E2M1_MAX, FP4_E2M1_MAX)
        c = _round_e2m1_index(scaled.abs())
        # vLLM's reference returns |x| rounded * sign(x): a negative value that rounds to zero
        # is -0.0 (code 0x8), while -0.0 itself (sign(-0.0) = 0) stays +0.0.
        c |= (scaled < 0).to(torch.uint8) << 3
        yield r0, c.reshape(-1, k), scale8.squeeze(-1)


def _checked_global_scale(x: torch.Tensor, global_scale, group_size: int, name: str) -> torch.Tensor:
    _check_groups(x, group_size, name)
    check_finite(x, name)
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device)
    if gs.numel() != 1 or not bool(torch.isfinite(gs).all()) or float(gs) <= 0:
        raise NvFp4Error(f"{name}: the global scale must be one positive finite number, got {gs.tolist()}")
    return gs.reshape(())


def quantize(x: torch.Tensor, global_scale: torch.Tensor | float,
             group_size: int = GROUP_SIZE, name: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise a 2-D tensor [N, K] to NVFP4 codes.

    Returns `(codes, block_scale)`: `codes` uint8 [N, K] with one 4-bit code per element
    (bit 3 = sign, bits 0-2 = magnitude index; not packed), `block_scale` float8_e4m3fn [N, K/16].
    `global_scale` is the quantisation scale (6*448/amax).  NaN/inf input raises NvFp4Error.
    """
    gs = _checked_global_scale(x, global_scale, group_size, name)
    n, k = x.shape
    codes = torch.empty((n, k), dtype=torch.uint8, device=x.device)
    scales = torch.empty((n, k // group_size), dtype=torch.float8_e4m3fn, device=x.device)
    for r0, c, s in _quantize_chunks(x, gs, group_size):
        codes[r0:r0 + c.shape[0]] = c
        scales[r0:r0 + c.shape[0]] = s
    return codes, scales


def quantize_packed(x: torch.Tensor, global_scale: torch.Tensor | float,
                    group_size: int = GROUP_SIZE, name: str = "tensor") -> tuple[torch.Tensor, torch.Tensor]:
    """`quantize` then `pack`, chunk by chunk: (uint8 [N, K/2], fp8 [N, K/16]) without the
    full-size unpacked codes."""
    gs = _checked_global_scale(x, global_scale, group_size, name)
    n, k = x.shape
    packed = torch.empty((n, k // 2), dtype=torch.uint8, device=x.device)
    scales = torch.empty((n, k // group_size), dtype=torch.float8_e4m3fn, device=x.device)
    for r0, c, s in _quantize_chunks(x, gs, group_size):
        packed[r0:r0 + c.shape[0]] = pack(c)
        scales[r0:r0 + c.shape[0]] = s
    return packed, scales


def decode(codes: torch.Tensor) -> torch.Tensor:
    """4-bit codes -> fp32 values (code 0x8 is -0.0, like vLLM's `break_fp4_bytes`)."""
    c = codes.to(torch.long)
    vals = _e2m1_table(codes.device)[c & 0x7]
    return vals * torch.where((c & 0x8).to(torch.bool), -1.0, 1.0)


def pack(codes: torch.Tensor) -> torch.Tensor:
    """[..., K] codes -> [..., K/2] uint8 bytes, element 2j in the low nibble."""
    if codes.dtype != torch.uint8:
        raise NvFp4Error(f"pack expects uint8 codes, got {codes.dtype}")
    if codes.shape[-1] % 2:
        raise NvFp4Error(f"pack needs an even last dimension, got shape {list(codes.shape)}")
    if codes.numel() and int(codes.max()) > 0xF:
        raise NvFp4Error("pack expects 4-bit codes (0..15)")
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack(packed: torch.Tensor) -> torch.Tensor:
    """[..., K/2] uint8 bytes -> [..., K] codes."""
    if packed.dtype != torch.uint8:
        raise NvFp4Error(f"unpack expects uint8, got {packed.dtype}")
    low = packed & 0x0F
    high = (packed >> 4) & 0x0F
    return torch.stack((low, high), dim=-1).reshape(*packed.shape[:-1], packed.shape[-1] * 2)


def dequantize(packed: torch.Tensor, block_scale: torch.Tensor, scale_2: torch.Tensor | float,
               dtype: torch.dtype = torch.bfloat16, group_size: int = GROUP_SIZE) -> torch.Tensor:
    """Packed NVFP4 -> `dtype`.  2-D `[N, K/2]` with a scalar `scale_2`, or 3-D experts
    `[E, N, K/2]` with `scale_2` of shape `[E]`.  Same arithmetic as vLLM's
    `dequantize_to_dtype(..., swizzle=False)` on the CPU: (e2m1 * (scale_fp32 * scale_2)) -> dtype.
    """
    if group_size != GROUP_SIZE:
        raise NvFp4Error(f"NVFP4 uses groups of {GROUP_SIZE} values, got group_size={group_size}")
    if packed.dtype != torch.uint8:
        raise NvFp4Error(f"packed weight must be uint8, got {packed.dtype}")
    if packed.ndim not in (2, 3):
        raise NvFp4Error(f"packed weight must be 2-D or 3-D, got shape {list(packed.shape)}")
    k = packed.shape[-1] * 2
    expect = (*packed.shape[:-1], k // group_size)
    if tuple(block_scale.shape) != expect:
        raise NvFp4Error(f"block scale shape {list(block_scale.shape)} does not match packed weight "
                         f"{list(packed.shape)} (expected {list(expect)})")
    s2 = torch.as_tensor(scale_2, dtype=torch.float32, device=packed.device)
    if packed.ndim == 3:
        s2 = s2.reshape(-1)[:, None, None] if s2.numel() > 1 else s2.reshape(1, 1, 1)
    else:
        s2 = s2.reshape(())
    vals = decode(unpack(packed)).reshape(*packed.shape[:-1], k // group_size, group_size)
    sf = block_scale.view(torch.float8_e4m3fn).to(torch.float32) * s2
    out = vals * sf.unsqueeze(-1)
    return out.reshape(*packed.shape[:-1], k).to(dtype)


def quant_dequant(x: torch.Tensor, global_scale: torch.Tensor | float,
                  group_size: int = GROUP_SIZE) -> torch.Tensor:
    """Quantise then dequantise activations like vLLM's CPU `ref_nvfp4_quant_dequant`
    (the W4A4 emulation of an FP4 activation), returning `x.dtype`."""
    codes, scale = quantize(x, global_scale, group_size, name="activation")
    gs = torch.as_tensor(global_scale, dtype=torch.float32, device=x.device).reshape(())
    m, k = x.shape
    vals = decode(codes).reshape(m, k // group_size, group_size)
    return (vals * (scale.to(torch.float32).unsqueeze(-1) / gs)).reshape(m, k).to(x.dtype)


@dataclass
class NvFp4Weight:
    """One quantised linear weight as a ModelOpt checkpoint stores it."""

    weight: torch.Tensor          # uint8 [N, K/2]
    weight_scale: torch.Tensor    # float8_e4m3fn [N, K/16]
    weight_scale_2: torch.Tensor  # fp32 scalar: amax / (6 * 448)

    def dequantize(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return dequantize(self.weight, self.weight_scale, self.weight_scale_2, dtype)


def quantize_weight(w: torch.Tensor, tensor_amax: torch.Tensor | float | None = None,
                    name: str = "weight") -> NvFp4Weight:
    """Quantise a [N, K] weight.  `tensor_amax` lets fused siblings (q/k/v, gate/up) share one
    global scale, as ModelOpt exports them and vLLM's fused kernels require."""
    _check_groups(w, GROUP_SIZE, name)
    check_finite(w, name)
    a = amax(w) if tensor_amax is None else torch.as_tensor(tensor_amax, dtype=torch.float32, device=w.device)
    gs = global_scale_from_amax(a)
    packed, scale = quantize_packed(w, gs, name=name)
    return NvFp4Weight(packed, scale, (1.0 / gs).to(torch.float32).reshape(()))
