"""Published DGX Spark decode figures (`plan/published.json`) set against the planner's prediction."""
from __future__ import annotations

import json
from importlib import resources

from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.deployment import Deployment, default_compute_dtype
from vllm_spark_plugin.plan.engine import Serving, SpecDecode
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.stepmodel import Efficiency, StepModel


def published_entries() -> list[dict]:
    doc = json.loads((resources.files("vllm_spark_plugin.plan") / "published.json").read_text(encoding="utf-8"))
    return list(doc["entries"])


def serving_for(entry: dict) -> Serving:
    spec = entry.get("spec")
    return Serving(engine=entry.get("engine_key", "vllm"), moe_backend=entry.get("moe_backend", "auto"),
                   linear_backend=entry.get("linear_backend", "auto"),
                   enforce_eager=bool(entry.get("enforce_eager", False)),
                   expert_parallel=bool(entry.get("expert_parallel", False)),
                   spec=SpecDecode(**spec) if spec else None)


def deployment_for(entry: dict, hardware: str = "gb10") -> Deployment:
    arch, doc = load_model(entry["model"])
    hw = load_hardware(hardware)
    fmt = entry["weight_format"]
    ckpt = (doc.get("checkpoints") or {}).get(fmt) or {}
    overrides = dict(ckpt.get("component_formats") or {})
    overrides.update(entry.get("component_formats") or {})
    return Deployment(arch=arch, hw=hw, weight_format=fmt, formats=component_formats(fmt, None, overrides),
                      kv_dtype=entry.get("kv_dtype", "bf16"), state_dtype=arch.state_dtype,
                      compute_dtype=default_compute_dtype(fmt), context=int(entry["context"]),
                      tp=int(entry.get("tp", 1)), os_reserve_bytes=hw.os_reserve_bytes,
                      serving=serving_for(entry), model_routing=doc.get("routing") or {})


def entry_class(entry: dict) -> str:
    """The error class a figure belongs to (docs/plan.md reports errors per class)."""
    if entry.get("engine_key", "vllm") != "vllm":
        return "other engines"
    if entry.get("spec"):
        return "speculative"
    if entry.get("enforce_eager"):
        return "eager"
    if int(entry.get("tp", 1)) > 1:
        return "2 Sparks"
    arch = load_model(entry["model"])[0]
    if not arch.is_moe:
        return "dense"
    return "MoE c1" if int(entry.get("concurrency", 1)) == 1 else "MoE c>1"


def predicted_rate(entry: dict, eff: Efficiency | None = None) -> float:
    sm = StepModel(deployment_for(entry), eff or Efficiency())
    c = int(entry.get("concurrency", 1))
    return sm.aggregate_rate(c) if c > 1 else sm.per_stream_rate(1)


def evaluate(eff: Efficiency | None = None) -> list[dict]:
    """Predicted vs published decode rate for every entry."""
    rows = []
    for e in published_entries():
        pred = predicted_rate(e, eff)
        rows.append({"id": e["id"], "model": e["model"], "engine": e["engine"], "tp": e.get("tp", 1),
                     "concurrency": e.get("concurrency", 1), "class": entry_class(e),
                     "published": e["tokens_per_second"], "predicted": pred,
                     "error": pred / e["tokens_per_second"] - 1.0, "source": e["source"]})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'entry':36} {'class':13} {'published':>9} {'predicted':>9} {'error':>7}"]
    for r in rows:
        lines.append(f"{r['id']:36} {r['class']:13} {r['published']:>9.2f} {r['predicted']:>9.2f} {r['error'] * 100:>+6.1f}%")
    return "\n".join(lines)
