"""Published DGX Spark decode figures (`plan/published.json`) set against the planner's prediction."""
from __future__ import annotations

import json
from importlib import resources

from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.deployment import Deployment, default_compute_dtype
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.stepmodel import Efficiency, StepModel


def published_entries() -> list[dict]:
    doc = json.loads((resources.files("vllm_spark_plugin.plan") / "published.json").read_text(encoding="utf-8"))
    return list(doc["entries"])


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
                      tp=int(entry.get("tp", 1)), os_reserve_bytes=hw.os_reserve_bytes)


def evaluate(eff: Efficiency | None = None) -> list[dict]:
    """Predicted vs published per-stream decode rate for every entry."""
    rows = []
    for e in published_entries():
        sm = StepModel(deployment_for(e), eff or Efficiency())
        c = int(e.get("concurrency", 1))
        pred = sm.aggregate_rate(c) if c > 1 else sm.per_stream_rate(1)
        rows.append({"id": e["id"], "model": e["model"], "engine": e["engine"], "tp": e.get("tp", 1),
                     "published": e["tokens_per_second"], "predicted": pred,
                     "error": pred / e["tokens_per_second"] - 1.0, "source": e["source"]})
    return rows


def table(rows: list[dict]) -> str:
    lines = [f"{'entry':34} {'tp':>2} {'published':>9} {'predicted':>9} {'error':>7}"]
    for r in rows:
        lines.append(f"{r['id']:34} {r['tp']:>2} {r['published']:>9.2f} {r['predicted']:>9.2f} {r['error'] * 100:>+6.1f}%")
    return "\n".join(lines)
