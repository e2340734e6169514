"""Assemble a complete plan (the `--json` document): inputs, memory fit, step model, curve, knee,
capacity at the per-stream floor, fleet totals and calibration provenance."""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

from vllm_spark_plugin.definitions import DEFAULT_FLOOR_TOKENS_PER_SECOND
from vllm_spark_plugin.plan.calibrate import Calibration
from vllm_spark_plugin.plan.deployment import Deployment
from vllm_spark_plugin.plan.memory import plan_memory
from vllm_spark_plugin.plan.stepmodel import KNEE_FIT_RANGE, Efficiency, ModelFactors, StepModel

DEFAULT_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _clean(obj):
    """JSON-safe copy: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if hasattr(obj, "item") and not isinstance(obj, (str, bytes)):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def make_plan(dep: Deployment, eff: Efficiency | None = None, model_factors: ModelFactors | None = None,
              floor: float = DEFAULT_FLOOR_TOKENS_PER_SECOND,
              concurrencies: Sequence[int] = DEFAULT_CONCURRENCY, calibration: Calibration | None = None,
              calibration_file: str | None = None, model_doc: dict | None = None) -> dict:
    eff = eff or Efficiency()
    sm = StepModel(dep, eff, model_factors)
    mem = plan_memory(dep)
    limit = min(mem.max_streams, dep.max_num_seqs)
    fit_hi = KNEE_FIT_RANGE[1]
    lin = sm.linear_fit(KNEE_FIT_RANGE[0], fit_hi)
    knee = lin["knee"]
    cap = sm.capacity(floor, limit=limit)
    curve = sm.curve(concurrencies, max_streams=mem.max_streams)
    a1, beta_phys = sm.alpha_beta_physical(1)
    knee_b = None if knee is None else max(1, round(knee))
    fleet_streams = None if cap["streams"] is None else cap["streams"] * dep.dp
    doc = model_doc or {}
    plan = {
        "inputs": {**dep.inputs(), "floor_tokens_per_second": floor, "concurrency": list(concurrencies),
                   "efficiency": eff.to_dict()},
        "model": {
            "name": dep.arch.name, "model_type": dep.arch.model_type,
            "layers": {"total": dep.arch.n_layers,
                       **{f"mixer_{m}": dep.arch.count(mixer=m) for m in ("full", "sliding", "linear", "mamba", "mla") if dep.arch.count(mixer=m)},
                       **{f"ffn_{f}": dep.arch.count(ffn=f) for f in ("dense", "moe") if dep.arch.count(ffn=f)}},
            "params_by_component": dep.params.as_dict(),
            "total_params": dep.params.total,
            "active_params": dep.active_params(),
            "experts": ({"routed": dep.arch.n_experts, "per_token": dep.arch.top_k,
                         "params_per_expert": dep.params.per_expert, "moe_layers": dep.params.moe_layers}
                        if dep.arch.is_moe else None),
            "sources": doc.get("sources", []), "notes": doc.get("notes", ""),
            "checkpoint": (doc.get("checkpoints") or {}).get(dep.weight_format),
        },
        "hardware": dep.hw.to_dict(),
        "memory": mem.to_dict(),
        "step_model": {
            "alpha_seconds": lin["alpha_seconds"], "beta_seconds": lin["beta_seconds"],
            "definition": f"least-squares line t = alpha + beta*b through the predicted step times for b = {KNEE_FIT_RANGE[0]}..{fit_hi}",
            "fit_r2": lin["r2"], "fit_max_relative_error": lin["max_relative_error"], "fit_range": lin["fit_range"],
            "alpha_at_1_seconds": a1, "beta_physical_seconds": beta_phys,
            "step_seconds_at_1": sm.step_seconds(1), "step_seconds_at_64": sm.step_seconds(64),
            "components_at_1": sm.components(1), "components_at_64": sm.components(64),
            **sm.describe(),
        },
        "knee": {
            "concurrency": knee,
            "definition": "K = alpha/beta of the linear fit (where the per-stream-linear and plateau asymptotes meet)",
            "plateau_tokens_per_second": lin["plateau_tokens_per_second"],
            "aggregate_tokens_per_second": None if knee_b is None else sm.aggregate_rate(knee_b),
            "per_stream_tokens_per_second": None if knee_b is None else sm.per_stream_rate(knee_b),
        },
        "capacity": {**cap, "memory_max_streams": mem.max_streams, "max_num_seqs": dep.max_num_seqs,
                     "ttft_seconds": None if not cap["streams"] else sm.ttft_seconds(cap["streams"])},
        "fleet": {
            "sparks": dep.sparks, "tp": dep.tp, "pp": dep.pp, "replicas": dep.dp,
            "capacity_streams": fleet_streams,
            "aggregate_tokens_per_second_at_capacity": (None if cap["aggregate_tokens_per_second"] is None
                                                        else cap["aggregate_tokens_per_second"] * dep.dp),
            "max_concurrent_streams_memory": min(mem.max_streams, dep.max_num_seqs) * dep.dp,
            "plateau_tokens_per_second": None if lin["plateau_tokens_per_second"] is None else lin["plateau_tokens_per_second"] * dep.dp,
            "link": link_cost(dep, sm, floor, limit, concurrencies),
        },
        "curve": curve,
        "calibration": {
            "source": eff.source, "file": calibration_file,
            "bandwidth_efficiency": eff.bandwidth, "compute_efficiency": eff.compute,
            "overhead_scale": eff.overhead_scale, "link_scale": eff.link_scale,
            "model_factors": None if model_factors is None else model_factors.to_dict(),
            "fit": None if calibration is None else calibration.to_dict()["fit"],
            "fitted": None if calibration is None else calibration.fitted,
        },
    }
    return _clean(plan)


def _share_lost(nominal: float | None, measured: float | None) -> float | None:
    return None if not nominal or measured is None else 1.0 - measured / nominal


def link_cost(dep: Deployment, sm: StepModel, floor: float, limit: int, concurrencies: Sequence[int]) -> dict | None:
    """What the measured link rate (`Hardware.link_measured`) costs against the profile's link: the same
    plan at both, fleet-wide (dp replicas multiply both sides alike).  None without a measured rate.

    The headline is at the capacity the profile's link gives at the floor (the fleet's sizing), else at
    one stream; prefill is one --prompt-tokens prompt, where collectives are megabytes and the link's
    bandwidth, not its latency, sets the time."""
    hw = dep.hw
    if hw.link_measured is None:
        return None
    out = {"rate_bytes_per_second": hw.link_measured, "source": hw.link_measured_source,
           "profile_bandwidth_bytes_per_second": hw.link_bandwidth,
           "profile_small_message_bandwidth_bytes_per_second": hw.link_small_bandwidth,
           "enters": dep.tp * dep.pp > 1}
    if not out["enters"]:
        return {**out, "note": "the link does not enter the prediction: one Spark per replica (tp 1, pp 1), "
                               "no collective crosses a link and data-parallel replicas share none"}
    nominal = StepModel(dataclasses.replace(dep, hw=hw.with_link_rate(None)), sm.eff, sm.model)
    ref = nominal.capacity(floor, limit=limit)["streams"] or 1
    at = {"nominal": nominal, "measured": sm}
    agg = {k: m.aggregate_rate(ref) * dep.dp for k, m in at.items()}
    cap = {k: m.capacity(floor, limit=limit)["streams"] for k, m in at.items()}
    prefill = {k: dep.prompt_tokens / m.prefill_seconds(1, dep.prompt_tokens) for k, m in at.items()}
    return {
        **out,
        "reference_concurrency": ref,
        "aggregate_tokens_per_second_at_nominal": agg["nominal"],
        "aggregate_tokens_per_second_at_measured": agg["measured"],
        "throughput_cost_share": _share_lost(agg["nominal"], agg["measured"]),
        "capacity_streams_at_nominal": None if cap["nominal"] is None else cap["nominal"] * dep.dp,
        "capacity_streams_at_measured": None if cap["measured"] is None else cap["measured"] * dep.dp,
        "prefill_tokens_per_second_at_nominal": prefill["nominal"],
        "prefill_tokens_per_second_at_measured": prefill["measured"],
        "prefill_cost_share": _share_lost(prefill["nominal"], prefill["measured"]),
        "curve": [{"concurrency": int(b), "aggregate_tokens_per_second_at_nominal": nominal.aggregate_rate(b) * dep.dp,
                   "aggregate_tokens_per_second_at_measured": sm.aggregate_rate(b) * dep.dp,
                   "cost_share": _share_lost(nominal.aggregate_rate(b), sm.aggregate_rate(b))}
                  for b in concurrencies],
    }
