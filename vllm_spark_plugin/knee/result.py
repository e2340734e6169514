"""`KneeResult`: what a knee fit reports, and its JSON form.

Every number a gauge could export is either a finite float/int or None ("unknown"); NaN and
infinity never leave this module (`finite_or_none` is applied on construction and in `to_json`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..definitions import floor_label

VERDICT_OK = "ok"
VERDICT_NO_KNEE = "no knee in the measured range"
VERDICT_RETROGRADE = "retrograde"
VERDICT_TOO_FEW = "too few points"
VERDICT_NO_SPREAD = "no spread"
VERDICT_INVALID = "invalid input"
VERDICTS = (VERDICT_OK, VERDICT_NO_KNEE, VERDICT_RETROGRADE, VERDICT_TOO_FEW, VERDICT_NO_SPREAD,
            VERDICT_INVALID)

MODEL_LINEAR = "linear"
MODEL_USL = "usl"


def finite_or_none(x: Any) -> float | None:
    """A finite float, or None for None/NaN/inf/non-numbers."""
    if x is None or isinstance(x, bool):
        return None
    try:
        v = float(x)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def floor_key(floor: float) -> str:
    """Floors as dictionary keys / label values: 20.0 -> '20', 12.5 -> '12.5' (`definitions.floor_label`)."""
    return floor_label(floor)


def _clean(obj: Any) -> Any:
    """Deep copy with every non-finite float replaced by None (JSON and gauges never see NaN/inf)."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return obj
    if hasattr(obj, "item") and not isinstance(obj, (list, dict)):  # numpy scalar
        obj = obj.item()
        if isinstance(obj, (bool, int)):
            return obj
    return finite_or_none(obj)


@dataclass
class KneeResult:
    """The fitted step-time model t(b) = alpha + beta*b (+ gamma*prefill), and what follows from it.

    * `alpha_seconds`: fixed cost of a step (weights read once per step);
    * `beta_seconds`: extra cost per running stream;
    * `gamma_seconds_per_prefill_token`: cost of each prefill token mixed into a step (per-step
      fits only; None for sweep fits or when the window held no prefill);
    * `knee` = alpha/beta streams (where the linear and plateau asymptotes of the aggregate curve
      meet); in the retrograde (USL) case, the USL peak N*;
    * `plateau_tokens_per_second` = tokens_per_step/beta; in the USL case the peak throughput;
    * `capacity`: floor (tok/s, as a string key) -> highest integer stream count whose per-stream
      rate stays at or above the floor (and, with a TTFT bound, whose TTFT p50 stays within it);
    * `ci`: percentile-bootstrap intervals [low, high] (None where not computable).
    """

    verdict: str
    model: str = MODEL_LINEAR
    source: str = "sweep"  # "sweep" (per-point rates) or "steps" (per-step samples)
    alpha_seconds: float | None = None
    beta_seconds: float | None = None
    gamma_seconds_per_prefill_token: float | None = None
    tokens_per_step: float = 1.0
    knee: float | None = None
    plateau_tokens_per_second: float | None = None
    capacity: dict[str, int | None] = field(default_factory=dict)
    capacity_measured: dict[str, float | None] = field(default_factory=dict)
    ttft_slo_seconds: float | None = None
    capacity_ttft_bound: int | None = None
    curves: dict[str, list] = field(default_factory=dict)
    r2: float | None = None
    median_abs_rel_residual: float | None = None
    n: int = 0                      # observations the fit used
    n_input: int = 0                # points / samples offered
    n_dropped: int = 0              # rejected before fitting (NaN, inf, <= 0, ...)
    n_outliers: int = 0             # given zero weight by the robust fit
    levels: int = 0                 # distinct concurrencies / batch sizes
    max_measured: float | None = None
    extrapolated: bool = False
    ci: dict[str, Any] = field(default_factory=dict)
    usl: dict[str, float | None] | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in ("alpha_seconds", "beta_seconds", "gamma_seconds_per_prefill_token", "knee",
                     "plateau_tokens_per_second", "r2", "median_abs_rel_residual", "max_measured",
                     "ttft_slo_seconds"):
            setattr(self, name, finite_or_none(getattr(self, name)))
        self.tokens_per_step = finite_or_none(self.tokens_per_step) or 1.0
        self.capacity = {k: (None if v is None else int(v)) for k, v in self.capacity.items()}

    @property
    def ok(self) -> bool:
        """True when the estimate is usable for gauges (a fitted curve, maybe extrapolated)."""
        return self.verdict in (VERDICT_OK, VERDICT_NO_KNEE, VERDICT_RETROGRADE)

    def capacity_at(self, floor: float) -> int | None:
        return self.capacity.get(floor_key(floor))

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict; schema in docs/knee.md.  No NaN or infinity anywhere."""
        out = {
            "verdict": self.verdict,
            "model": self.model,
            "source": self.source,
            "alpha_seconds": self.alpha_seconds,
            "beta_seconds": self.beta_seconds,
            "gamma_seconds_per_prefill_token": self.gamma_seconds_per_prefill_token,
            "tokens_per_step": self.tokens_per_step,
            "knee": self.knee,
            "plateau_tokens_per_second": self.plateau_tokens_per_second,
            "capacity": dict(self.capacity),
            "capacity_measured": dict(self.capacity_measured),
            "ttft_slo_seconds": self.ttft_slo_seconds,
            "capacity_ttft_bound": self.capacity_ttft_bound,
            "ci": self.ci,
            "r2": self.r2,
            "median_abs_rel_residual": self.median_abs_rel_residual,
            "n": self.n,
            "n_input": self.n_input,
            "n_dropped": self.n_dropped,
            "n_outliers": self.n_outliers,
            "levels": self.levels,
            "max_measured": self.max_measured,
            "extrapolated": self.extrapolated,
            "usl": self.usl,
            "curves": self.curves,
            "notes": list(self.notes),
        }
        return _clean(out)
