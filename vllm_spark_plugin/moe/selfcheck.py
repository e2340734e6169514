"""Start-up self-check of an NVFP4 MoE kernel backend on a small problem.

A candidate is a *runner*: `runner(problem) -> [tokens, hidden]` output of the fused MoE
(SiLU-gated experts, top-k routed, router weights applied).  Its output is compared with the
reference computed in float64 from the dequantised weights (and, for W4A4 backends, with the
activations quantised to FP4 exactly as vLLM's emulation does).  A candidate passes when

    cosine(candidate, reference) >= MIN_COSINE  and  ||candidate - reference|| / ||reference|| <= MAX_REL_ERROR

The thresholds leave room for bf16 accumulation and FP4 rounding flips between kernel and
emulation (measured well under them on the CPU reference), and catch what matters: a wrong nibble
order, scale layout or expert mapping gives a cosine near 0.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from vllm_spark_plugin.moe.policy import W4A4_BACKENDS, CheckResult
from vllm_spark_plugin.quant import nvfp4

MIN_COSINE = 0.98
MAX_REL_ERROR = 0.15

Dequant = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.dtype], torch.Tensor]


@dataclass
class MoEProblem:
    """Weights in the ModelOpt checkpoint layout vLLM loads them into (w13 = [gate; up])."""

    x: torch.Tensor               # bf16 [T, H]
    router_logits: torch.Tensor   # fp32 [T, E]
    topk_weights: torch.Tensor    # fp32 [T, k] (softmax over the top-k, renormalised)
    topk_ids: torch.Tensor        # int32 [T, k]
    w13: torch.Tensor             # uint8 [E, 2I, H/2]
    w13_scale: torch.Tensor       # fp8 [E, 2I, H/16]
    w13_scale_2: torch.Tensor     # fp32 [E] (gate and up share it)
    w2: torch.Tensor              # uint8 [E, H, I/2]
    w2_scale: torch.Tensor        # fp8 [E, H, I/16]
    w2_scale_2: torch.Tensor      # fp32 [E]
    a13_scale: torch.Tensor       # fp32 [E] input_scale of w13 (amax/2688)
    a2_scale: torch.Tensor        # fp32 [E] input_scale of w2

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        t, h = self.x.shape
        e, two_i, _ = self.w13.shape
        return t, h, two_i // 2, e, self.topk_ids.shape[1]


def make_problem(seed: int = 1234, tokens: int = 16, experts: int = 8, topk: int = 2,
                 hidden: int = 256, intermediate: int = 256) -> MoEProblem:
    """A deterministic small problem (dims are multiples of 128 for every kernel's alignment)."""
    cpu = torch.device("cpu")  # explicit: vLLM may build models under a CUDA default device
    g = torch.Generator(device=cpu).manual_seed(seed)
    x = (torch.randn(tokens, hidden, generator=g, device=cpu) * 0.5).to(torch.bfloat16)
    w13_list, w2_list = [], []
    for _ in range(experts):
        gate = torch.randn(intermediate, hidden, generator=g, device=cpu) * 0.05
        up = torch.randn(intermediate, hidden, generator=g, device=cpu) * 0.05
        down = torch.randn(hidden, intermediate, generator=g, device=cpu) * 0.05
        shared = torch.maximum(nvfp4.amax(gate), nvfp4.amax(up))
        qg = nvfp4.quantize_weight(gate.to(torch.bfloat16), shared)
        qu = nvfp4.quantize_weight(up.to(torch.bfloat16), shared)
        qd = nvfp4.quantize_weight(down.to(torch.bfloat16))
        w13_list.append((torch.cat([qg.weight, qu.weight]), torch.cat([qg.weight_scale, qu.weight_scale]),
                         qg.weight_scale_2))
        w2_list.append((qd.weight, qd.weight_scale, qd.weight_scale_2))
    logits = torch.randn(tokens, experts, generator=g, device=cpu)
    probs = torch.softmax(logits, dim=-1)
    tw, ti = torch.topk(probs, topk, dim=-1)
    tw = tw / tw.sum(dim=-1, keepdim=True)
    # One activation scale for every expert (as the converter writes): amax 8 -> input_scale 8/2688.
    a_scale = torch.full((experts,), 8.0 / (nvfp4.FP4_E2M1_MAX * nvfp4.FP8_E4M3_MAX), dtype=torch.float32, device=cpu)
    return MoEProblem(
        x=x, router_logits=logits, topk_weights=tw.to(torch.float32), topk_ids=ti.to(torch.int32),
        w13=torch.stack([a for a, _, _ in w13_list]), w13_scale=torch.stack([b for _, b, _ in w13_list]),
        w13_scale_2=torch.stack([c for _, _, c in w13_list]),
        w2=torch.stack([a for a, _, _ in w2_list]), w2_scale=torch.stack([b for _, b, _ in w2_list]),
        w2_scale_2=torch.stack([c for _, _, c in w2_list]),
        a13_scale=a_scale.clone(), a2_scale=a_scale.clone())


def moe_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor, act_quant: Callable[[torch.Tensor, int, str], torch.Tensor] | None = None,
                compute_dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Plain routed SiLU-gated MoE.  `act_quant(t, expert, "a13"|"a2")` optionally quantises the
    inputs of the two GEMMs (W4A4 emulation)."""
    t, _ = x.shape
    inter = w13.shape[1] // 2
    out = torch.zeros(t, w2.shape[1], dtype=compute_dtype, device=x.device)
    for tok in range(t):
        for j in range(topk_ids.shape[1]):
            e = int(topk_ids[tok, j])
            xi = x[tok:tok + 1]
            if act_quant is not None:
                xi = act_quant(xi, e, "a13")
            h = xi.to(compute_dtype) @ w13[e].to(compute_dtype).T
            a = torch.nn.functional.silu(h[:, :inter]) * h[:, inter:]
            if act_quant is not None:
                a = act_quant(a.to(torch.bfloat16), e, "a2")
            y = a.to(compute_dtype) @ w2[e].to(compute_dtype).T
            out[tok] += float(topk_weights[tok, j]) * y[0]
    return out


def reference_output(problem: MoEProblem, w4a4: bool, dequant: Dequant = nvfp4.dequantize) -> torch.Tensor:
    """float64 reference from the dequantised weights (`dequant` is vLLM's reference code when
    the caller passes it); activations FP4-quantised when `w4a4`."""
    w13 = dequant(problem.w13, problem.w13_scale, problem.w13_scale_2, torch.float32)
    w2 = dequant(problem.w2, problem.w2_scale, problem.w2_scale_2, torch.float32)
    def act_quant(t: torch.Tensor, e: int, which: str) -> torch.Tensor:
        scale = (problem.a13_scale if which == "a13" else problem.a2_scale)[e]
        return nvfp4.quant_dequant(t.to(torch.bfloat16), 1.0 / scale)

    return moe_forward(problem.x, w13, w2, problem.topk_weights, problem.topk_ids, act_quant if w4a4 else None)


def reference_runner(problem: MoEProblem) -> torch.Tensor:
    """The CPU candidate: what the plugin's reference path serves - NVFP4 dequantised to bf16 at
    load, then a bf16 MoE."""
    w13 = nvfp4.dequantize(problem.w13, problem.w13_scale, problem.w13_scale_2, torch.bfloat16)
    w2 = nvfp4.dequantize(problem.w2, problem.w2_scale, problem.w2_scale_2, torch.bfloat16)
    return moe_forward(problem.x, w13, w2, problem.topk_weights, problem.topk_ids,
                       compute_dtype=torch.float32).to(torch.bfloat16)


def compare(candidate: torch.Tensor, reference: torch.Tensor) -> CheckResult:
    c = candidate.detach().to("cpu", torch.float64).reshape(-1)
    r = reference.detach().to("cpu", torch.float64).reshape(-1)
    if c.shape != r.shape:
        return CheckResult(False, f"output shape {list(candidate.shape)} != reference {list(reference.shape)}")
    if not bool(torch.isfinite(c).all()):
        return CheckResult(False, "output has NaN/inf")
    denom = float(r.norm()) or 1.0
    rel = float((c - r).norm()) / denom
    cos = float(torch.nn.functional.cosine_similarity(c, r, dim=0))
    ok = cos >= MIN_COSINE and rel <= MAX_REL_ERROR
    return CheckResult(ok, f"cosine {cos:.4f}, rel. error {rel:.4f} "
                           f"(needs >= {MIN_COSINE} and <= {MAX_REL_ERROR})", cos, rel)


def check_runner(runner: Callable[[MoEProblem], torch.Tensor], w4a4: bool, problem: MoEProblem | None = None,
                 dequant: Dequant = nvfp4.dequantize) -> CheckResult:
    problem = problem or make_problem()
    try:
        out = runner(problem)
    except Exception as exc:
        return CheckResult(False, f"{type(exc).__name__}: {exc}")
    return compare(out, reference_output(problem, w4a4, dequant))


def make_self_check(runner_for: Callable[[str], Callable[[MoEProblem], torch.Tensor]],
                    problem: MoEProblem | None = None,
                    dequant: Dequant = nvfp4.dequantize) -> Callable[[str], CheckResult]:
    """`self_check(backend)` for `policy.decide`: builds the backend's runner and checks it.
    The problem is built on the first check (never when no candidate needs checking)."""
    state = {"problem": problem}

    def self_check(name: str) -> CheckResult:
        try:
            runner = runner_for(name)
        except Exception as exc:
            return CheckResult(False, f"cannot build: {type(exc).__name__}: {exc}")
        if state["problem"] is None:
            state["problem"] = make_problem()
        return check_runner(runner, name in W4A4_BACKENDS, state["problem"], dequant)

    return self_check
