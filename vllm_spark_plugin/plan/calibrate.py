"""Fit the efficiency factors to a measured sweep, and save / load them as JSON.

The predicted step time is linear in the three factors' reciprocals:

    t(b) = s * O(b) + x * M(b) + y * C(b) + K(b)

with O the profile's fixed overhead, M = bytes / nominal bandwidth, C = FLOPs / peak, K the
interconnect time, s = overhead_scale, x = 1 / bandwidth_efficiency, y = 1 / compute_efficiency.
The fit is a weighted linear least squares on relative step-time error (each measured point's step
time is concurrency / aggregate throughput, or 1 / per-stream rate when no aggregate is given).
With fewer points than free factors, a factor the data cannot see (compute below 10 % of the largest
step), or factors the data cannot tell apart (a dense model's per-stream memory and compute terms are
both linear in b), the lower-priority factor keeps its value (priority: bandwidth, overhead, compute);
a factor that comes out non-positive is also held.

`fit_efficiency` treats every factor as the machine's.  `calibrate_split` (what the command line
uses) keeps the model's own factors apart (plan/jointfit.py), so that a saved calibration carried to
another model brings only the machine/engine part: calibration file version 2 stores both, and the
model part is applied only to the same model.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from vllm_spark_plugin.definitions import SweepPoint
from vllm_spark_plugin.plan.deployment import Deployment, PlanError
from vllm_spark_plugin.plan.stepmodel import Efficiency, ModelFactors, StepModel

FORMAT = "vllm-spark-plan-calibration"
VERSION = 2          # 2: machine/engine factors apart from the model's (version 1 files are read too)
FACTORS = ("bandwidth", "overhead", "compute")  # priority order when the data supports fewer


@dataclass
class Calibration:
    efficiency: Efficiency
    hardware: str
    fitted: list
    points: list = field(default_factory=list)
    model_inputs: dict = field(default_factory=dict)
    rms_relative_error: float | None = None
    engine: str = "vllm"
    model_name: str = ""
    model_factors: ModelFactors | None = None  # apply only to the same model

    def factors_for(self, model_name: str) -> ModelFactors | None:
        return self.model_factors if self.model_factors is not None and model_name == self.model_name else None

    def to_dict(self) -> dict:
        return {
            "format": FORMAT, "version": VERSION, "hardware": self.hardware, "engine": self.engine,
            "bandwidth_efficiency": self.efficiency.bandwidth,
            "compute_efficiency": self.efficiency.compute,
            "overhead_scale": self.efficiency.overhead_scale,
            "link_scale": self.efficiency.link_scale,
            "model": None if self.model_factors is None else {"name": self.model_name, **self.model_factors.to_dict()},
            "fitted": list(self.fitted),
            "fit": {"model_inputs": self.model_inputs, "points": self.points,
                    "rms_relative_error": self.rms_relative_error},
        }


def observed_step_seconds(p: SweepPoint) -> float | None:
    agg, per = p.aggregate_tokens_per_second, p.per_stream_tokens_per_second
    if agg and agg > 0 and p.concurrency and p.concurrency > 0:
        return p.concurrency / agg
    if per and per > 0:
        return 1.0 / per
    return None


def _terms(dep: Deployment, base: Efficiency, b: float) -> tuple[float, float, float, float]:
    c = StepModel(dep, base).components(b)
    return c["overhead_raw"], c["memory_raw"], c["compute_raw"], c["comm_raw"]


def fit_efficiency(dep: Deployment, points: Iterable[SweepPoint], base: Efficiency | None = None,
                   factors: Sequence[str] | None = None) -> Calibration:
    base = base or Efficiency()
    usable = [(p, observed_step_seconds(p)) for p in points]
    usable = [(p, t) for p, t in usable if t is not None and t > 0 and p.concurrency and p.concurrency >= 1]
    if not usable:
        raise PlanError("calibration needs at least one point with a concurrency and a positive aggregate or per-stream rate")
    rows = np.array([_terms(dep, base, p.concurrency) for p, _ in usable])  # O, M, C, K
    t_obs = np.array([t for _, t in usable])
    current = {"overhead": base.overhead_scale, "bandwidth": 1.0 / base.bandwidth, "compute": 1.0 / base.compute}
    col = {"overhead": 0, "bandwidth": 1, "compute": 2}
    if factors is None:
        n = len(usable)
        compute_share = float(np.max(rows[:, 2] * current["compute"] / t_obs))
        wanted = ["bandwidth", "overhead", "compute"] if (n >= 3 and compute_share >= 0.10) else ["bandwidth", "overhead"]
        free = wanted[:max(1, min(len(wanted), n))]
    else:
        bad = [f for f in factors if f not in FACTORS]
        if bad:
            raise PlanError(f"unknown calibration factor(s) {bad}; choose from {', '.join(FACTORS)}")
        free = list(factors)
    # distinct concurrencies limit what can be separated
    distinct = len({p.concurrency for p, _ in usable})
    free = free[:max(1, distinct)]
    while free:
        fixed = [f for f in FACTORS if f not in free]
        target = t_obs - rows[:, 3] - sum(rows[:, col[f]] * current[f] for f in fixed)
        A = np.stack([rows[:, col[f]] for f in free], axis=1) / t_obs[:, None]
        # a dense model's memory and compute terms are both linear in b: the data cannot tell them apart
        scale = np.linalg.norm(A, axis=0)
        if np.linalg.matrix_rank(A / np.where(scale > 0, scale, 1), tol=1e-6) < len(free):
            free = free[:-1]
            continue
        sol, *_ = np.linalg.lstsq(A, target / t_obs, rcond=None)
        if np.all(sol > 0):
            for f, v in zip(free, sol):
                current[f] = float(v)
            break
        free = [f for f, v in zip(free, sol) if v > 0] if any(sol > 0) else free[:-1]
    eff = Efficiency(bandwidth=1.0 / current["bandwidth"], compute=1.0 / current["compute"],
                     overhead_scale=current["overhead"], source="calibrated")
    eff.validate()
    sm = StepModel(dep, eff)
    pts, errs = [], []
    for p, t in usable:
        pred = sm.step_seconds(p.concurrency)
        err = pred / t - 1.0
        errs.append(err)
        pts.append({"concurrency": p.concurrency, "observed_step_seconds": t, "predicted_step_seconds": pred,
                    "observed_aggregate_tokens_per_second": p.aggregate_tokens_per_second,
                    "predicted_aggregate_tokens_per_second": p.concurrency / pred, "relative_error": err,
                    "label": p.label})
    rms = math.sqrt(sum(e * e for e in errs) / len(errs))
    return Calibration(efficiency=eff, hardware=dep.hw.name, fitted=list(free), points=pts,
                       model_inputs=dep.inputs(), rms_relative_error=rms)


def calibrate_split(dep: Deployment, points: Iterable[SweepPoint], base: Efficiency | None = None) -> Calibration:
    """Fit a sweep of one model, keeping the machine/engine factors apart from the model's own
    (plan/jointfit.py): what is saved for other models is only the machine's part."""
    from vllm_spark_plugin.plan.jointfit import Observation, fit_joint

    usable = [(p, observed_step_seconds(p)) for p in points]
    usable = [(p, t) for p, t in usable if t is not None and t > 0 and p.concurrency and p.concurrency >= 1]
    obs = [Observation(dep=dep, concurrency=p.concurrency, rate=p.concurrency / t, model=dep.arch.name,
                       engine=dep.serving.engine) for p, t in usable]
    if not obs:
        raise PlanError("calibration needs at least one point with a concurrency and a positive aggregate or per-stream rate")
    fit = fit_joint(obs, base=base)
    eff, mf = fit.machine[dep.serving.engine], fit.models[dep.arch.name]
    eff.source = "calibrated"
    sm = StepModel(dep, eff, mf)
    pts, errs = [], []
    for o, (p, _) in zip(obs, usable):
        pred = sm.aggregate_rate(o.concurrency)
        err = pred / o.rate - 1.0
        errs.append(err)
        pts.append({"concurrency": o.concurrency, "observed_aggregate_tokens_per_second": o.rate,
                    "predicted_aggregate_tokens_per_second": pred, "relative_error": err, "label": p.label})
    return Calibration(efficiency=eff, hardware=dep.hw.name, fitted=fit.fitted, points=pts,
                       model_inputs=dep.inputs(), rms_relative_error=math.sqrt(sum(e * e for e in errs) / len(errs)),
                       engine=dep.serving.engine, model_name=dep.arch.name, model_factors=mf)


def save_calibration(cal: Calibration, path: str | Path) -> None:
    Path(path).write_text(json.dumps(cal.to_dict(), indent=2) + "\n", encoding="utf-8")


def load_calibration(path: str | Path) -> Calibration:
    p = Path(path)
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlanError(f"calibration file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise PlanError(f"{p}: not valid JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise PlanError(f"{p}: not a planner calibration file (expected \"format\": \"{FORMAT}\")")
    if doc.get("version") not in (1, VERSION):
        raise PlanError(f"{p}: unsupported calibration version {doc.get('version')!r} (this planner reads 1 and {VERSION})")
    try:
        eff = Efficiency(bandwidth=float(doc["bandwidth_efficiency"]), compute=float(doc["compute_efficiency"]),
                         overhead_scale=float(doc["overhead_scale"]), source="calibration file",
                         link_scale=float(doc.get("link_scale", 1.0)))
        eff.validate()
        model = doc.get("model") or None
        mf = None
        if model is not None:
            mf = ModelFactors(routing_skew=None if model.get("routing_skew") is None else float(model["routing_skew"]),
                              overhead_scale=float(model.get("overhead_scale", 1.0)),
                              per_stream_scale=float(model.get("per_stream_scale", 1.0)))
            mf.validate()
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise PlanError(f"{p}: bad calibration value ({exc})") from None
    fit = doc.get("fit") or {}
    return Calibration(efficiency=eff, hardware=str(doc.get("hardware", "")), fitted=list(doc.get("fitted", [])),
                       points=list(fit.get("points", [])), model_inputs=dict(fit.get("model_inputs", {})),
                       rms_relative_error=fit.get("rms_relative_error"), engine=str(doc.get("engine", "vllm")),
                       model_name=str((model or {}).get("name", "")), model_factors=mf)


def points_from_file(path: str, label: str | None = None) -> tuple[str, list[SweepPoint]]:
    """Sweep points via the benchmark's loader (`vllm_spark_plugin.knee.loaders.load_points`)."""
    try:
        from vllm_spark_plugin.knee.loaders import load_points  # imported lazily: optional module
    except ImportError as exc:
        raise PlanError(f"--calibrate FILE needs vllm_spark_plugin.knee.loaders ({exc}); "
                        "give the points with --calibrate-point CONCURRENCY:AGGREGATE instead") from None
    if not Path(path).exists():
        raise PlanError(f"sweep file not found: {path}")
    try:
        curves = load_points(path)
    except Exception as exc:  # the loader's own message names the problem
        raise PlanError(f"{path}: cannot read sweep points ({exc})") from None
    if not curves:
        raise PlanError(f"{path}: no sweep points found")
    if label is None:
        if len(curves) > 1:
            raise PlanError(f"{path} holds several curves ({', '.join(map(str, curves))}); choose one with --calibrate-label")
        label = next(iter(curves))
    if label not in curves:
        raise PlanError(f"{path}: no curve labelled {label!r}; found {', '.join(map(str, curves))}")
    return label, list(curves[label])


def parse_point(text: str) -> SweepPoint:
    """'CONCURRENCY:AGGREGATE_TOK_S' (e.g. 64:557.471)."""
    try:
        c, agg = text.split(":")
        c_v, agg_v = float(c), float(agg)
    except ValueError:
        raise PlanError(f"bad --calibrate-point {text!r}: expected CONCURRENCY:AGGREGATE, e.g. 64:557.471") from None
    if c_v < 1 or agg_v <= 0 or not (math.isfinite(c_v) and math.isfinite(agg_v)):
        raise PlanError(f"bad --calibrate-point {text!r}: concurrency must be >= 1 and the aggregate positive")
    return SweepPoint(concurrency=c_v, per_stream_tokens_per_second=None, aggregate_tokens_per_second=agg_v,
                      label="cli")
