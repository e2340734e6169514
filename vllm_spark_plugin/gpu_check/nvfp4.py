"""The NVFP4 format (`quant.nvfp4`) on the device against the CPU.

Round trip: known tensors quantised on the device and on the CPU give the same bytes (packed codes,
FP8 block scales, FP32 global scale), and dequantise (2-D and 3-D experts, bf16 and fp32) and
quantise-dequantise activations to the same bits.  The format is elementwise arithmetic with one
rounding per step (no reduction whose order could differ), so anything short of bit equality is a
device-dependent rounding: a wrong weight in every model served on that device.

GEMM: the reference path's GEMM (activations x dequantised weights, as `spark_nvfp4` serves NVFP4
without kernels) on the device against the float64 product of the CPU-dequantised operands.  The
operands are bit-equal (the round trip), so the only difference is accumulation order and the
output's rounding: bf16 output carries 2^-9 relative rounding per element, hence GEMM_REL_BF16;
an fp32 product must agree to GEMM_REL_FP32, which a TF32 GEMM (~1e-3) would not.

torch and the format are imported when a check runs: importing this module costs nothing.
"""
from __future__ import annotations

from vllm_spark_plugin.gpu_check.report import Verdict, verdict

GEMM_REL_BF16 = 1e-2
GEMM_REL_FP32 = 1e-5
SEED = 20261201


def known_tensors(torch) -> dict:
    """Deterministic CPU tensors covering what the format must get right: ordinary weights with an
    outlier per block, exact zeros and signed zeros, rows spread over five decades, activations."""
    g = torch.Generator(device="cpu").manual_seed(SEED)
    w = torch.randn(256, 1024, generator=g) * 0.05
    w[:, ::16] *= 20.0                      # one outlier per block of 16
    w[0] = 0.0
    w[1, ::2] = -0.0
    wide = torch.randn(64, 512, generator=g) * 10 ** torch.empty(64, 1).uniform_(-3, 2, generator=g)
    x = torch.randn(32, 1024, generator=g) * 2.0
    return {"weight": w.to(torch.bfloat16), "wide": wide.to(torch.bfloat16), "activation": x.to(torch.bfloat16)}


def _bits(torch, t):
    """Same-size integer view on the CPU: equal bits, not equal values (-0.0 != 0.0, NaN == NaN)."""
    t = t.detach().to("cpu").contiguous()
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.view(view)


def _mismatches(torch, a, b) -> int:
    if tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype:
        return -1
    return int((_bits(torch, a) != _bits(torch, b)).sum())


def check_roundtrip(env, dequantize=None) -> Verdict:
    """Quantise and dequantise known tensors on the device and on the CPU: bit for bit equal.
    `dequantize` (default `quant.nvfp4.dequantize`) is what the device side dequantises with."""
    torch = env.require_torch()
    from vllm_spark_plugin.quant import nvfp4 as fmt

    dequantize = dequantize or fmt.dequantize
    dev = env.device
    known = known_tensors(torch)
    stages: dict[str, int] = {}
    elements = 0
    for name in ("weight", "wide"):
        w = known[name]
        q_cpu, q_dev = fmt.quantize_weight(w), fmt.quantize_weight(w.to(dev))
        stages[f"{name}.packed"] = _mismatches(torch, q_cpu.weight, q_dev.weight)
        stages[f"{name}.block_scale"] = _mismatches(torch, q_cpu.weight_scale, q_dev.weight_scale)
        stages[f"{name}.scale_2"] = _mismatches(torch, q_cpu.weight_scale_2, q_dev.weight_scale_2)
        for dtype in (torch.bfloat16, torch.float32):
            ref = fmt.dequantize(q_cpu.weight, q_cpu.weight_scale, q_cpu.weight_scale_2, dtype)
            got = dequantize(q_dev.weight, q_dev.weight_scale, q_dev.weight_scale_2, dtype)
            stages[f"{name}.dequantize.{str(dtype).removeprefix('torch.')}"] = _mismatches(torch, ref, got)
        # 3-D experts [E, N, K/2] with one scale_2 per expert (the MoE layout)
        e_cpu = (torch.stack([q_cpu.weight, q_cpu.weight]), torch.stack([q_cpu.weight_scale, q_cpu.weight_scale]),
                 torch.stack([q_cpu.weight_scale_2, q_cpu.weight_scale_2 * 2]))
        e_dev = tuple(t.to(dev) for t in e_cpu)
        stages[f"{name}.dequantize.experts"] = _mismatches(
            torch, fmt.dequantize(*e_cpu, torch.bfloat16), dequantize(*e_dev, torch.bfloat16))
        elements += w.numel()
    x = known["activation"]
    gs = fmt.global_scale_from_amax(fmt.amax(x))
    stages["activation.quant_dequant"] = _mismatches(torch, fmt.quant_dequant(x, gs),
                                                     fmt.quant_dequant(x.to(dev), gs.to(dev)))
    elements += x.numel()
    bad = {k: v for k, v in stages.items() if v != 0}
    where = "CPU vs CPU (dry run)" if env.dry else f"{dev} vs CPU"
    detail = (f"{elements} elements through {len(stages)} stages, {where}: "
              + ("bit for bit equal" if not bad else
                 "differ: " + ", ".join(f"{k} {'shape/dtype' if v < 0 else f'{v} values'}" for k, v in bad.items())))
    return verdict(not bad, detail, elements=elements, mismatches=stages)


def check_gemm(env) -> Verdict:
    """The reference NVFP4 GEMM on the device against the CPU float64 product of the same operands."""
    torch = env.require_torch()
    from vllm_spark_plugin.moe import selfcheck
    from vllm_spark_plugin.quant import nvfp4 as fmt

    dev = env.device
    known = known_tensors(torch)
    w, x = known["weight"], known["activation"]
    q_cpu = fmt.quantize_weight(w)
    deq64 = fmt.dequantize(q_cpu.weight, q_cpu.weight_scale, q_cpu.weight_scale_2, torch.float32).double()
    a_gs = fmt.global_scale_from_amax(fmt.amax(x))
    ref_a16 = x.double() @ deq64.T
    ref_a4 = fmt.quant_dequant(x, a_gs).double() @ deq64.T

    q = fmt.quantize_weight(w.to(dev))
    xd = x.to(dev)
    deq16 = fmt.dequantize(q.weight, q.weight_scale, q.weight_scale_2, torch.bfloat16)
    deq32 = fmt.dequantize(q.weight, q.weight_scale, q.weight_scale_2, torch.float32)
    runs = {
        "w4a16_bf16": (xd @ deq16.T, ref_a16, GEMM_REL_BF16),
        "w4a16_fp32": (xd.float() @ deq32.T, ref_a16, GEMM_REL_FP32),
        "w4a4_bf16": (fmt.quant_dequant(xd, a_gs.to(dev)) @ deq16.T, ref_a4, GEMM_REL_BF16),
    }
    env.synchronize()
    figures, bad = {}, []
    for name, (got, ref, tol) in runs.items():
        r = selfcheck.compare(got, ref)
        ok = r.passed and r.rel_error is not None and r.rel_error <= tol
        figures[name] = {"cosine": r.cosine, "rel_error": r.rel_error, "tolerance": tol, "passed": ok}
        if not ok:
            bad.append(f"{name}: {r.detail}, needs rel. error <= {tol:g}")
    shape = f"[{x.shape[0]}x{x.shape[1]}] x [{w.shape[1]}x{w.shape[0]}]"
    where = "CPU (dry run)" if env.dry else str(dev)
    detail = (f"{shape} on {where} vs CPU float64: "
              + ", ".join(f"{k} rel. error {v['rel_error']:.2e}" for k, v in figures.items() if v["rel_error"] is not None)
              + (f"; {'; '.join(bad)}" if bad else ""))
    return verdict(not bad, detail, **figures)
