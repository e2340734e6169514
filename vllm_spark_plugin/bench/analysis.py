"""From measured points to conclusions: the knee fit per curve, capacity statements, the fleet sum
(seed 003 sums deployment capacities per workload) and the capacity profile the exporter loads.

The knee and plateau come from `vllm_spark_plugin.knee.fit.fit_points` (the step-time model
t(b) = alpha + beta*b); capacity is the seed's measured definition (`capacity_at_floor`: the highest
measured concurrency whose median per-stream rate is >= the floor), with the fitted integer
capacity beside it.  With a latency SLO, the SLO capacity is the highest measured concurrency whose
attainment (share of requests meeting the SLO) is at least the target.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..definitions import LatencySLO, SweepPoint, capacity_at_floor, highest_concurrency_meeting
from ..knee.fit import fit_points
from ..knee.result import floor_key
from .results import CurveKey, Row, RunRecord

CURVE_GRID_POINTS = 64  # fitted curves are evaluated on this many geometric steps for the plots


@dataclass
class CurveAnalysis:
    key: CurveKey
    rows: list[Row]
    floors: tuple[float, ...]
    capacity: dict[str, int | None] = field(default_factory=dict)  # measured, seed definition
    knee: dict | None = None  # KneeResult.to_json()
    slo: LatencySLO | None = None
    slo_capacity: int | None = None  # highest concurrency whose attainment >= slo.target
    search: dict | None = None  # AdaptiveSearch.outcome() when --levels auto chose the levels

    @property
    def points(self) -> list[SweepPoint]:
        return [r.sweep_point() for r in self.rows]

    def knee_value(self) -> float | None:
        return None if not self.knee else self.knee.get("knee")

    def knee_ci(self) -> list | None:
        ci = (self.knee or {}).get("ci") or {}
        k = ci.get("knee")
        return k if isinstance(k, list) and len(k) == 2 and None not in k else None

    def statement(self) -> str:
        """'highest concurrency with median per-stream rate >= 20 tok/s: N; knee K [CI]'."""
        parts = []
        for f in self.floors:
            n = self.capacity.get(floor_key(f))
            parts.append(f"highest concurrency with median per-stream rate >= {f:g} tok/s: "
                         f"{n if n is not None else 'none measured'}" + self._boundary_note("floor", f))
        if self.slo is not None:
            n = self.slo_capacity
            parts.append(f"highest concurrency with SLO attainment >= {self.slo.target:.4g} ({slo_text(self.slo)}): "
                         f"{n if n is not None else 'none measured'}" + self._boundary_note("slo", self.slo.target))
        k = self.knee_value()
        if k is None:
            verdict = (self.knee or {}).get("verdict", "no fit")
            parts.append(f"knee: not determined ({verdict})")
        else:
            ci = self.knee_ci()
            ci_txt = f" [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else ""
            extra = " (extrapolated beyond the measured range)" if (self.knee or {}).get("extrapolated") else ""
            parts.append(f"knee {k:.1f}{ci_txt}{extra}")
        return f"{self.key.label} / {self.key.workload}: " + "; ".join(parts)

    def boundary(self, kind: str, threshold: float) -> dict | None:
        """The adaptive search's account of one boundary (None for a fixed ladder)."""
        for b in (self.search or {}).get("boundaries") or []:
            if b["kind"] == kind and math.isclose(b["threshold"], threshold):
                return b
        return None

    def _boundary_note(self, kind: str, threshold: float) -> str:
        b = self.boundary(kind, threshold)
        if b is None:
            return ""
        lo, hi = b["bracket"]
        doubt = f"; shaky: {', '.join(b['doubts'])}" if b.get("doubts") else ""
        if b["status"] == "known to one stream":
            return f" (known to one stream: {hi} misses it{doubt})" if lo else f" (even {hi} misses it)"
        if b["status"] == "bracketed":
            return f" (bracketed: {hi} misses it; not narrowed further{doubt})"
        if b["status"] == "not bracketed":
            return " (met at every measured level: the boundary lies higher)"
        return ""


def fit_knee(points: list[SweepPoint], floors: tuple[float, ...], ttft_slo: float | None = None) -> dict | None:
    """KneeResult.to_json() of the points, with fitted curves on a dense grid for plotting."""
    if len(points) < 2:
        return None
    top = max(p.concurrency for p in points)
    grid = sorted({round(math.exp(math.log(top) * i / (CURVE_GRID_POINTS - 1)), 6)
                   for i in range(CURVE_GRID_POINTS)} | {1.0, float(top)})
    return fit_points(points, floors=floors, ttft_slo_seconds=ttft_slo, concurrencies=grid).to_json()


def slo_text(slo: LatencySLO) -> str:
    """'TTFT <= 2 s, per-stream rate >= 20 tok/s, end-to-end <= 30 s' (the bounds that are set)."""
    parts = []
    if slo.ttft_seconds is not None:
        parts.append(f"TTFT <= {slo.ttft_seconds:g} s")
    if slo.floor_tokens_per_second is not None:
        parts.append(f"per-stream rate >= {slo.floor_tokens_per_second:g} tok/s")
    if slo.e2e_seconds is not None:
        parts.append(f"end-to-end <= {slo.e2e_seconds:g} s")
    return ", ".join(parts) or "no bound"


def analyze(record: RunRecord, floors: tuple[float, ...], ttft_slo: float | None = None,
            slo: LatencySLO | None = None) -> list[CurveAnalysis]:
    out = []
    for key, rows in record.curves().items():
        a = CurveAnalysis(key=key, rows=rows, floors=floors, slo=slo)
        pts = a.points
        a.capacity = {floor_key(f): _int_or_none(capacity_at_floor(pts, f)) for f in floors}
        if slo is not None:
            a.slo_capacity = _int_or_none(highest_concurrency_meeting(
                ((r.concurrency, r.metrics.slo_attainment) for r in rows), slo.target))
        a.knee = fit_knee(pts, floors, ttft_slo)
        a.search = record.searches.get(key)
        out.append(a)
    return out


def _int_or_none(x) -> int | None:
    return None if x is None else int(x)


def fleet_capacity(curves: list[CurveAnalysis], floors: tuple[float, ...]) -> dict:
    """Per workload: each endpoint's measured capacity and their sum (seed 003: ~11 text or ~28 code
    streams across the fleet).  Alternative workloads, not a mixed load: each sum stands alone."""
    out: dict = {}
    for a in curves:
        w = out.setdefault(a.key.workload, {"endpoints": {}, "total": {}})
        w["endpoints"][a.key.label] = {"endpoint": a.key.endpoint, "model": a.key.model,
                                       "capacity": dict(a.capacity)}
    for w in out.values():
        for f in floors:
            fk = floor_key(f)
            w["total"][fk] = sum((e["capacity"].get(fk) or 0) for e in w["endpoints"].values())
    return out


def fleet_statement(fleet: dict, floors: tuple[float, ...]) -> list[str]:
    lines = []
    for workload, w in fleet.items():
        for f in floors:
            fk = floor_key(f)
            parts = ", ".join(f"{label} {e['capacity'].get(fk) or 0}" for label, e in w["endpoints"].items())
            lines.append(f"fleet, {workload}: {w['total'][fk]} streams at >= {f:g} tok/s median per-stream "
                         f"rate ({parts})")
    return lines


def capacity_profile(a: CurveAnalysis, date: str, source: str) -> dict:
    """The profile one exporter loads (SPARK_PLUGIN_PROFILE): the offline knee beside the live one."""
    k = a.knee or {}
    return {
        "knee": k.get("knee"),
        "plateau_tokens_per_second": k.get("plateau_tokens_per_second"),
        "alpha_seconds": k.get("alpha_seconds"),
        "beta_seconds": k.get("beta_seconds"),
        "capacity": dict(a.capacity),
        "capacity_fitted": dict(k.get("capacity") or {}),
        "knee_ci": a.knee_ci(),
        "verdict": k.get("verdict", "no fit"),
        "model": a.key.model,
        "endpoint": a.key.endpoint,
        "label": a.key.label,
        "workload": a.key.workload,
        "max_measured_concurrency": max((r.concurrency for r in a.rows), default=None),
        "levels": "auto" if a.search else "ladder",
        "search": None if a.search is None else {k: v for k, v in a.search.items() if k != "decisions"},
        "slo": None if a.slo is None else {
            "ttft_seconds": a.slo.ttft_seconds, "floor_tokens_per_second": a.slo.floor_tokens_per_second,
            "e2e_seconds": a.slo.e2e_seconds, "target_attainment": a.slo.target, "capacity": a.slo_capacity,
            "attainment": {str(r.concurrency): r.metrics.slo_attainment for r in a.rows},
            "goodput_tokens_per_second": {str(r.concurrency): r.metrics.goodput_tps for r in a.rows}},
        "date": date,
        "source": source,
    }
