"""The GB10 MoE backend's device-side code that runs without vLLM's kernels.

* `check_selfcheck` - the start-up self-check (`moe.selfcheck`) with its problem on the device: the
  reference path as a candidate (passes), the W4A4 emulation (passes), the float64 reference
  computed on the device against the CPU (equal to REFERENCE_REL), and a candidate with swapped
  nibbles (must fail: the self-check still tells a wrong kernel from a right one on this device).
* `check_timing` - `tune-moe`'s CUDA-event timing (`moe.tune.gpu_bench`) and `tune.tune` over a
  few configs.  vLLM's Triton fused MoE is replaced, at the one call `gpu_bench` makes
  (`vllm.kernels.run_triton_fused_moe`), by a dense PyTorch MoE of the same signature: the timing
  protocol (warm-up, events, synchronise) is what runs for real; the events' time per call is held
  to the wall clock's over the same calls (in the dry run, wall clock against wall clock: reported,
  not judged).
* `check_tune_smem` - the tuner's tile filter (GB10's shared memory per block) against the device.
* `check_policy` - the backend `moe.policy.decide` picks for the capability the device reports.
* `check_gb10_kernels` - what this script cannot prove: vLLM's NVFP4 MoE kernels on 12.x.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import time

from vllm_spark_plugin.gpu_check.report import NotApplicable, Verdict, verdict

REFERENCE_REL = 1e-9          # float64 on the device vs float64 on the CPU, same operands
TIMING_SHAPE = dict(experts=8, hidden=1024, intermediate=512, topk=2, dtype=None)
DRY_TIMING_SHAPE = dict(experts=4, hidden=256, intermediate=128, topk=2, dtype=None)  # seconds on a CPU
TIMING_BATCHES = (16, 256)
TIMING_ITERS = 20
TIMING_CONFIGS = 4
EVENT_WALL_RATIO = (0.8, 1.2)  # CUDA-event time per call / wall time per call


def to_device(problem, device):
    return dataclasses.replace(problem, **{f.name: getattr(problem, f.name).to(device)
                                           for f in dataclasses.fields(problem)})


def swap_nibbles(packed):
    return ((packed & 0x0F) << 4) | (packed >> 4)


def check_selfcheck(env) -> Verdict:
    env.require_torch()
    from vllm_spark_plugin.moe import selfcheck

    dev = env.device
    problem = selfcheck.make_problem()

    def reference_path(p):
        return selfcheck.reference_runner(to_device(p, dev))

    def w4a4_emulation(p):
        return selfcheck.reference_output(to_device(p, dev), w4a4=True)

    def swapped(p):
        q = to_device(p, dev)
        return selfcheck.reference_runner(dataclasses.replace(q, w13=swap_nibbles(q.w13), w2=swap_nibbles(q.w2)))

    runs = {  # name: (result, expected to pass)
        "reference_path": (selfcheck.check_runner(reference_path, False, problem), True),
        "w4a4_emulation": (selfcheck.check_runner(w4a4_emulation, True, problem), True),
        "swapped_nibbles": (selfcheck.check_runner(swapped, False, problem), False),
    }
    ref = selfcheck.compare(selfcheck.reference_output(to_device(problem, dev), False),
                            selfcheck.reference_output(problem, False))
    ref.passed = ref.passed and ref.rel_error is not None and ref.rel_error <= REFERENCE_REL
    runs["reference_on_device"] = (ref, True)
    wrong = [f"{k}: {'failed' if not r.passed else 'passed'} ({r.detail}), expected to "
             f"{'pass' if want else 'fail'}" for k, (r, want) in runs.items() if r.passed != want]
    where = "CPU (dry run)" if env.dry else str(dev)
    detail = (f"problem on {where} (T,H,I,E,k = {problem.shape}): "
              + ", ".join(f"{k} {'pass' if r.passed else 'fail'} (cos {r.cosine:.4f}, rel {r.rel_error:.2g})"
                          for k, (r, _) in runs.items() if r.cosine is not None)
              + (f"; wrong: {'; '.join(wrong)}" if wrong else "; as expected"))
    return verdict(not wrong, detail, **{k: {"passed": r.passed, "expected": want, "cosine": r.cosine,
                                             "rel_error": r.rel_error, "detail": r.detail}
                                         for k, (r, want) in runs.items()})


def dense_fused_moe(x, w1, w2, topk_weights, topk_ids, config=None, quant_config=None):
    """A PyTorch MoE with the signature of `vllm.kernels.run_triton_fused_moe` (bf16 weights
    [E, 2N, H] and [E, H, N]); dense over experts, so no device synchronisation inside a call."""
    import torch

    n = w1.shape[1] // 2
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w1.shape[0]):
        weight = (topk_weights * (topk_ids == e)).sum(dim=-1, keepdim=True)
        h = x @ w1[e].T
        a = torch.nn.functional.silu(h[:, :n]) * h[:, n:]
        out += weight * (a @ w2[e].T).float()
    return out.to(x.dtype)


@contextlib.contextmanager
def kernel_stand_in(calls: list):
    """`gpu_bench`'s kernel call answered by `dense_fused_moe` for the duration (counted in `calls`)."""
    from vllm_spark_plugin.vllm import kernels

    saved = kernels.run_triton_fused_moe

    def counted(*args, **kwargs):
        calls.append(1)
        return dense_fused_moe(*args, **kwargs)

    kernels.run_triton_fused_moe = counted
    try:
        yield
    finally:
        kernels.run_triton_fused_moe = saved


def wall_bench(shape, iters: int):
    """The dry run's bench: `gpu_bench`'s protocol (2 warm-up calls, `iters` timed) on the CPU,
    timed with the wall clock (CUDA events need a CUDA device)."""
    import torch

    from vllm_spark_plugin.vllm import kernels

    g = torch.Generator(device="cpu").manual_seed(0)
    e, h, n = shape.experts, shape.hidden, shape.intermediate
    w1 = torch.randn(e, 2 * n, h, generator=g, dtype=torch.bfloat16) / h ** 0.5
    w2 = torch.randn(e, h, n, generator=g, dtype=torch.bfloat16) / n ** 0.5

    cache: dict[int, tuple] = {}

    def bench(cfg: dict, m: int) -> float:
        if m not in cache:
            w, ids = torch.topk(torch.softmax(torch.randn(m, e, generator=g), dim=-1), shape.topk, dim=-1)
            cache[m] = (torch.randn(m, h, generator=g, dtype=torch.bfloat16), w, ids)
        x, w, ids = cache[m]
        for _ in range(2):
            kernels.run_triton_fused_moe(x, w1, w2, w, ids, cfg)
        t0 = time.perf_counter()
        for _ in range(iters):
            kernels.run_triton_fused_moe(x, w1, w2, w, ids, cfg)
        return (time.perf_counter() - t0) / iters

    return bench


def check_timing(env) -> Verdict:
    env.require_torch()
    from vllm_spark_plugin.moe import tune

    dims = DRY_TIMING_SHAPE if env.dry else TIMING_SHAPE
    shape = tune.MoEShape(**dims)
    space = tune.search_space(shape.dtype, quick=True)[:TIMING_CONFIGS]
    calls: list = []
    per_batch, problems = {}, []
    with kernel_stand_in(calls):
        bench = wall_bench(shape, TIMING_ITERS) if env.dry else tune.gpu_bench(shape, TIMING_ITERS)
        for m in TIMING_BATCHES:
            bench(space[0], m)  # builds and caches this batch's inputs, warms up
            env.synchronize()
            del calls[:]
            t0 = time.perf_counter()
            per_call = bench(space[0], m)
            wall = (time.perf_counter() - t0) / len(calls) if calls else float("nan")
            ratio = per_call / wall if wall > 0 else float("nan")
            per_batch[m] = {"event_us": round(per_call * 1e6, 2), "wall_us": round(wall * 1e6, 2),
                            "ratio": round(ratio, 3), "calls": len(calls)}
            if len(calls) != TIMING_ITERS + 2:
                problems.append(f"M={m}: {len(calls)} kernel calls, expected {TIMING_ITERS} timed + 2 warm-up")
            # the dry run holds the wall clock against itself: reported, not judged
            if not env.dry and not EVENT_WALL_RATIO[0] <= ratio <= EVENT_WALL_RATIO[1]:
                problems.append(f"M={m}: timed {per_call * 1e6:.1f} us per call vs {wall * 1e6:.1f} us wall "
                                f"(ratio {ratio:.2f}, needs {EVENT_WALL_RATIO[0]}-{EVENT_WALL_RATIO[1]})")
        best = tune.tune(TIMING_BATCHES, space, bench)
    if sorted(best) != sorted(TIMING_BATCHES) or any(cfg not in space for cfg in best.values()):
        problems.append(f"tune() returned {best} for batches {TIMING_BATCHES}")
    clock = "wall clock (dry run: CUDA events need a CUDA device)" if env.dry else "CUDA events"
    detail = (f"tune.gpu_bench protocol timed with {clock}, kernel stood in by a PyTorch MoE "
              f"E={dims['experts']} H={dims['hidden']} N={dims['intermediate']} top-{dims['topk']}: "
              + ", ".join(f"M={m} {v['event_us']:.0f} us/call (wall {v['wall_us']:.0f})" for m, v in per_batch.items())
              + f"; tune() picked a config for {len(best)} batch sizes"
              + (f"; {'; '.join(problems)}" if problems else ""))
    return verdict(not problems, detail, batches=per_batch, configs_timed=len(space), chosen=best)


def check_tune_smem(env) -> Verdict:
    """`tune-moe` keeps tiles within GB10's shared memory per block: on a 12.x device that figure
    must be the device's own."""
    from vllm_spark_plugin.moe import tune

    cap = env.capability()
    if cap is None:
        raise NotApplicable(f"no CUDA device (dry run): the tuner's tile limit is {tune.GB10_SMEM_BYTES} bytes "
                            "per block, GB10's")
    smem = getattr(env.torch.cuda.get_device_properties(env.device), "shared_memory_per_block_optin", None)
    if smem is None:
        return verdict(False, "PyTorch does not report shared_memory_per_block_optin for this device")
    if cap[0] != 12:
        raise NotApplicable(f"compute capability {cap[0]}.{cap[1]} is not GB10's 12.x: this device allows "
                            f"{smem} bytes per block, the tuner's filter is GB10's {tune.GB10_SMEM_BYTES}")
    return verdict(smem == tune.GB10_SMEM_BYTES,
                   f"device allows {smem} bytes of shared memory per block; the tuner filters tiles at "
                   f"{tune.GB10_SMEM_BYTES}", device_bytes=smem, tuner_bytes=tune.GB10_SMEM_BYTES)


def _availability(cap, names) -> tuple[dict, str]:
    """Which 12.x backends could run here: asked of vLLM only on a 12.x device (elsewhere the
    policy does not look at them)."""
    from vllm_spark_plugin.moe import policy

    if not policy.is_sm12x(cap):
        return {}, "not asked (not a 12.x device)"
    if importlib.util.find_spec("vllm") is None:
        return {n: "vLLM is not installed here" for n in names}, "vLLM not installed"
    from vllm_spark_plugin.vllm import kernels
    return kernels.nvfp4_backend_imports(), "vLLM's backend imports (vllm-spark doctor's view)"


def check_policy(env) -> Verdict:
    """What `policy.decide` picks for the capability this device reports (without self-check: the
    candidates' runners are vLLM's kernels)."""
    from vllm_spark_plugin.moe import policy

    cap = env.capability()
    available, source = _availability(cap, policy.SM12X_PREFERENCE)
    d = policy.decide(cap, available, None)
    if cap is None:
        expected = policy.REFERENCE
    elif not policy.is_sm12x(cap):
        expected = policy.AUTO
    else:
        expected = next((n for n in policy.SM12X_PREFERENCE if available.get(n) is None), policy.AUTO)
    seen = "no CUDA device (dry run)" if cap is None else f"compute capability {cap[0]}.{cap[1]}"
    return verdict(d.backend == expected,
                   f"{seen}: {d.backend} ({d.reason})" + (f"; 12.x backends from {source}" if available else "")
                   + ("" if d.backend == expected else f"; expected {expected}"),
                   capability=None if cap is None else list(cap), backend=d.backend, source=d.source,
                   reason=d.reason, candidates=d.candidates, available=available)


def check_gb10_kernels(env) -> Verdict:
    from vllm_spark_plugin.moe import policy

    cap = env.capability()
    kernels = ", ".join(policy.SM12X_PREFERENCE)
    if cap is None:
        raise NotApplicable(f"dry run: no device; vLLM's NVFP4 MoE kernels ({kernels}) run on 12.x GPUs only")
    if not policy.is_sm12x(cap):
        raise NotApplicable(f"GB10-only: vLLM's NVFP4 MoE kernels for compute capability 12.x ({kernels}) and "
                            f"their start-up self-check; this device is {cap[0]}.{cap[1]}")
    raise NotApplicable("this script builds no vLLM layer: on this 12.x device the kernels' self-check runs when "
                        "`vllm serve` builds the first NVFP4 MoE layer (log line 'NVFP4 MoE backend ...'), and "
                        "`vllm-spark doctor` checks their compiled payload")
