"""The planner's prediction for the served model, the run's size chosen from it, and the prediction
beside what was measured.

* `predict` runs the planner (`plan.cli.build_deployment`, `plan.planner.make_plan`) for the model
  and the check's workload (prompt and output tokens, floor);
* `size_run` runs the adaptive search (`bench.adaptive.run_search`) on the predicted curve, so the
  levels it would measure and the time they take are known before any request: trials and output
  length are cut until that fits the time budget;
* `compare` lines the prediction up with the bench's summary: per-stream rate, aggregate, knee,
  plateau, capacity at the floor and TTFT, each with measured / predicted.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..bench.adaptive import Budget, Observation, SearchConfig, run_search

PLAN_CONCURRENCY = tuple(2 ** k for k in range(0, 10))  # 1..512: the curve the prediction is read from
QUANT_FORMATS = {"nvfp4": "nvfp4", "mxfp4": "mxfp4", "fp8": "fp8", "int4": "int4", "awq": "int4", "gptq": "int4"}


class PredictionError(ValueError):
    """No prediction can be made (the model's config cannot be found or planned); one line."""


@dataclass
class Prediction:
    """The plan (the planner's JSON document) and what the check reads from it."""

    plan: dict
    model_spec: str
    weight_format: str

    @property
    def alpha(self) -> float | None:
        return self.plan["step_model"].get("alpha_seconds")

    @property
    def beta(self) -> float | None:
        return self.plan["step_model"].get("beta_seconds")

    def _curve(self, key: str, c: float) -> float | None:
        """A curve quantity at concurrency c, interpolated on log c between the plan's points."""
        pts = [(p["concurrency"], p.get(key)) for p in self.plan["curve"] if p.get(key) is not None]
        if not pts:
            return None
        if c <= pts[0][0]:
            return pts[0][1]
        for (c0, v0), (c1, v1) in zip(pts, pts[1:]):
            if c0 <= c <= c1:
                w = (math.log(c) - math.log(c0)) / (math.log(c1) - math.log(c0))
                return v0 + w * (v1 - v0)
        return pts[-1][1]

    def per_stream(self, c: float) -> float | None:
        return self._curve("per_stream_tokens_per_second", c)

    def aggregate(self, c: float) -> float | None:
        v = self.per_stream(c)
        return None if v is None else v * c

    def ttft(self, c: float) -> float | None:
        """Median TTFT of a wave of c requests (the bench's waves)."""
        return self._curve("ttft_wave_median_seconds", c)


def weight_format_of(model_dir: Path) -> str:
    """The checkpoint's storage format from config.json's quantization_config (bf16 without one)."""
    try:
        cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "bf16"
    q = cfg.get("quantization_config") or {}
    for key in ("quant_algo", "quant_method", "format"):
        v = str(q.get(key) or "").lower()
        for name, fmt in QUANT_FORMATS.items():
            if name in v:
                return fmt
    return "bf16" if not q else "nvfp4"


def model_spec(given: str | None, served_name: str, root: str | None) -> tuple[str | None, str]:
    """What to plan: the --plan-model given, the served name when the planner knows it, or the
    folder the server loaded the model from when it is on this machine.  (spec, how it was chosen)."""
    from ..plan.arch import builtin_models
    if given:
        return given, "--plan-model"
    names = {n.lower() for doc in builtin_models().values() for n in [doc["name"], *doc.get("aliases", [])]}
    if served_name.lower() in names:
        return served_name, "the served model's name (a built-in planner model)"
    if root and (Path(root) / "config.json").is_file():
        return root, "the served model's folder (config.json on this machine)"
    return None, ("the served model is neither a built-in planner model nor a folder on this machine: "
                  "give --plan-model NAME|PATH for the prediction")


def predict(spec: str, *, hardware: str, weight_format: str | None, floor: float, prompt_tokens: int,
            output_tokens: int, calibration: str | None = None, extra: list[str] | None = None) -> Prediction:
    """The planner's plan for `spec` with the check's workload: context = prompt + output tokens."""
    from ..plan import cli as plan_cli
    from ..plan.arch import ConfigError
    from ..plan.deployment import PlanError
    from ..plan.hardware import HardwareError
    from ..plan.planner import make_plan
    from ..plan.stepmodel import Efficiency

    if weight_format is None:
        path = Path(spec).expanduser()
        weight_format = weight_format_of(path if path.is_dir() else path.parent) if path.exists() else "nvfp4"
    parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    plan_cli.add_arguments(parser)
    argv = ["--model", spec, "--hardware", hardware, "--weight-format", weight_format, "--floor", f"{floor:g}",
            "--context", str(prompt_tokens + output_tokens), "--prompt-tokens", str(prompt_tokens),
            "--concurrency", ",".join(str(c) for c in PLAN_CONCURRENCY)] + list(extra or [])
    try:
        args = parser.parse_args(argv)
        dep, doc = plan_cli.build_deployment(args)
        eff, factors = Efficiency(), None
        if calibration:
            from ..plan.calibrate import load_calibration
            cal = load_calibration(calibration)
            eff, factors = cal.efficiency, cal.factors_for(dep.arch.name)
        plan = make_plan(dep, eff, model_factors=factors, floor=floor, concurrencies=PLAN_CONCURRENCY, model_doc=doc)
    except (argparse.ArgumentError, PlanError, ConfigError, HardwareError, ValueError) as exc:
        raise PredictionError(f"the planner cannot plan {spec!r}: {exc}") from None
    except SystemExit:  # argparse already printed what it could not parse
        raise PredictionError(f"the planner arguments {' '.join(extra or [])!r} were not understood") from None
    return Prediction(plan=plan, model_spec=spec, weight_format=weight_format)


# ------------------------------------------------------------------------------------------ sizing
@dataclass
class Sizing:
    """How big the measurement is, and why."""

    trials: int
    output_tokens: int
    budget_seconds: float
    max_concurrency: int
    predicted_seconds: float | None = None
    predicted_levels: list[int] = field(default_factory=list)
    reason: str = ""

    def to_json(self) -> dict:
        return {"trials": self.trials, "output_tokens": self.output_tokens, "budget_seconds": self.budget_seconds,
                "max_concurrency": self.max_concurrency, "predicted_seconds": self.predicted_seconds,
                "predicted_levels": self.predicted_levels, "reason": self.reason}


def predicted_search(pred: Prediction, floor: float, trials: int, output_tokens: int,
                     max_concurrency: int) -> tuple[list[int], float]:
    """The levels the adaptive search would measure on the predicted curve, and their wall time
    (warm-up wave + trials per level, each wave output_tokens / rate + its median TTFT)."""
    def measure(c: int) -> Observation:
        rate = pred.per_stream(c) or 1e-9
        wave = output_tokens / rate + (pred.ttft(c) or 0.0)
        return Observation(c, rate, rate * c, ttft_p50_s=pred.ttft(c), seconds=(trials + 1) * wave,
                           trial_rates=(rate,) * trials)
    cfg = SearchConfig.make([floor], budget=Budget(max_seconds=None, max_concurrency=max_concurrency))
    trace = run_search(cfg, measure)
    return [o.concurrency for o in trace.observations], trace.seconds


def size_run(pred: Prediction | None, floor: float, budget_seconds: float, trials: int | None,
             output_tokens: int, max_concurrency: int) -> Sizing:
    """Trials and output length for the time budget: the given ones, or the largest of 3, 2, 1 trials
    (then halved outputs, down to 64 tokens) whose predicted search fits in 80% of the budget.  The
    budget itself is handed to the search, which stops before a point that would pass it."""
    if pred is None or pred.per_stream(1) is None:
        return Sizing(trials or 2, output_tokens, budget_seconds, max_concurrency,
                      reason="no prediction: fixed size, the time budget stops the search")
    cap = pred.plan["capacity"].get("streams")
    knee = pred.plan["knee"].get("concurrency")
    guide = max(v for v in (cap, knee, 4) if v)
    max_conc = int(min(max_concurrency, max(16, 2 ** math.ceil(math.log2(4 * guide)))))
    options = [(t, output_tokens) for t in ((trials,) if trials else (3, 2, 1))]
    tokens = output_tokens
    while tokens > 64:
        tokens //= 2
        options += [(1 if not trials else trials, tokens)]
    best = None
    for t, n in options:
        levels, secs = predicted_search(pred, floor, t, n, max_conc)
        best = Sizing(t, n, budget_seconds, max_conc, round(secs, 1), levels)
        if secs <= 0.8 * budget_seconds:
            best.reason = (f"the planner predicts {len(levels)} levels ({', '.join(map(str, levels))}) in "
                           f"{secs:.0f} s with {t} trial(s) of {n}-token outputs: within 80% of the "
                           f"{budget_seconds:.0f} s budget")
            return best
    best.reason = (f"even {best.trials} trial(s) of {best.output_tokens}-token outputs are predicted to take "
                   f"{best.predicted_seconds:.0f} s: the {budget_seconds:.0f} s budget will stop the search early")
    return best


# ------------------------------------------------------------------------------------------ compare
def _ratio(measured, predicted) -> float | None:
    if measured is None or predicted is None or not predicted:
        return None
    return measured / predicted


def compare(pred: Prediction | None, summary: dict, floor: float) -> list[dict]:
    """Rows of quantity / predicted / measured / measured÷predicted (None where one side is missing)."""
    curve = (summary.get("curves") or [{}])[0]
    points = {p["concurrency"]: p for p in curve.get("points") or []}
    knee = curve.get("knee") or {}
    cap = (curve.get("capacity") or {}).get(f"{floor:g}")
    plan = pred.plan if pred else None

    def at(c, key):
        p = points.get(c)
        return None if p is None else p.get(key)

    low = min(points) if points else 1
    rows = [
        (f"per-stream rate at {low} stream(s), tok/s", pred and pred.per_stream(low), at(low, "per_stream_median_tps")),
        (f"aggregate at {low} stream(s), tok/s", pred and pred.aggregate(low), at(low, "aggregate_tps")),
    ]
    if cap:
        rows += [(f"per-stream rate at {cap} streams (measured capacity), tok/s", pred and pred.per_stream(cap),
                  at(cap, "per_stream_median_tps")),
                 (f"aggregate at {cap} streams, tok/s", pred and pred.aggregate(cap), at(cap, "aggregate_tps"))]
    plan_cap = None
    if plan:
        plan_cap = plan["capacity"].get("streams")
        if plan_cap is None and (pred.per_stream(1) or 0) < floor:
            plan_cap = 0  # the planner: not even one stream reaches the floor
    rows += [
        ("plateau (aggregate limit 1/beta), tok/s", plan and plan["knee"].get("plateau_tokens_per_second"),
         knee.get("plateau_tokens_per_second")),
        ("knee K = alpha/beta, streams", plan and plan["knee"].get("concurrency"), knee.get("knee")),
        (f"capacity at {floor:g} tok/s, streams", plan_cap, cap),
        (f"TTFT p50 at {low} stream(s), s", pred and pred.ttft(low), at(low, "ttft_p50_s")),
    ]
    if cap:
        rows.append((f"TTFT p50 at {cap} streams, s", pred and pred.ttft(cap), at(cap, "ttft_p50_s")))
    out = []
    for name, p, m in rows:
        p = p if isinstance(p, (int, float)) and not isinstance(p, bool) else None
        out.append({"quantity": name, "predicted": p, "measured": m, "ratio": _ratio(m, p)})
    ci = (knee.get("ci") or {}).get("knee")
    for r in out:
        if r["quantity"].startswith("knee") and isinstance(ci, list):
            r["measured_interval"] = ci
    return out


def reference_curve(pred: Prediction | None) -> dict | None:
    """The prediction on the plan's grid, for the bench's plots (they clip it to the measured range)."""
    if pred is None:
        return None
    grid = list(PLAN_CONCURRENCY)
    return {"label": f"planner prediction ({pred.plan['hardware'].get('name', 'hardware')})",
            "concurrency": grid, "per_stream": [pred.per_stream(c) for c in grid],
            "aggregate": [pred.aggregate(c) for c in grid]}
