"""Adaptive concurrency search (`vllm-spark bench --levels auto`): which level to measure next, and why.

A fixed ladder (`--levels 1,2,4,...`) has to bracket a knee and a capacity nobody knows yet: too short
and there is no knee, too coarse and the capacity is known only to a factor of two.  This search asks
the measured points instead.  It is pure (no I/O, no clock): `AdaptiveSearch.decide` takes the points
measured so far and the time spent, and returns one `Decision` with its reason; the runner measures
it and asks again.

The goals, in this order:

1. **the knee with an interval**: the step-time fit t(b) = alpha + beta*b of `knee.fit.fit_points` has
   the verdict ok (the knee lies inside the measured range; or retrograde, its peak) and a finite
   bootstrap interval for K;
2. **every boundary bracketed**: for each per-stream floor F, a measured level that meets it
   (median per-stream rate >= F) and a higher measured one that misses it; with a latency SLO, the
   same for attainment >= the target;
3. **every boundary known to one stream**: the highest level that meets it and the next level up
   both measured.

Growth (goals 1-2) starts at `Budget.start` and multiplies the top level by 2, or, once the fit
predicts where a missing goal lies (the capacity at a floor, twice the knee), jumps toward 1.2 times
that prediction, by at least 1.5 and at most 4 times the top level.  Bisection (goal 3) probes the
fit's predicted capacity inside the bracket, then the level above it; a probe whose outcome the fit
got wrong is followed by a plain midpoint, so a wrong model costs at most one extra probe per halving.
SLO brackets (no model predicts attainment) are narrowed by linear interpolation of attainment, with
the same midpoint safeguard.

The search stops when every goal is met, or before a point that would exceed the budget of points or
seconds, or at `Budget.max_concurrency`.  The boundary a run reports is the seed definition on the
measured points (`definitions.capacity_at_floor`: the highest measured level that meets the floor),
so the report, the CSV and the profile agree by construction; the search only chooses the levels.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from ..definitions import SweepPoint
from ..knee.fit import fit_points
from ..knee.result import VERDICT_OK, VERDICT_RETROGRADE, KneeResult, floor_key

PHASE_START, PHASE_GROW, PHASE_BISECT, PHASE_DONE, PHASE_LADDER = "start", "grow", "bisect", "done", "ladder"
PHASES = (PHASE_START, PHASE_GROW, PHASE_BISECT, PHASE_DONE, PHASE_LADDER)

GROWTH = 2.0           # top level x this when nothing predicts a missing goal
MIN_JUMP = 1.5         # a model-guided jump grows the top level by at least this ...
MAX_JUMP = 4.0         # ... and at most this
TARGET_MARGIN = 1.2    # aim this far past a predicted boundary, so one point brackets it
KNEE_SPAN = 2.0        # points up to this many knees give the knee's interval
MIN_POINTS = 3         # the smallest point budget: a fit with an interval needs three levels

KIND_FLOOR, KIND_SLO = "floor", "slo"


class BudgetError(ValueError):
    """A budget that cannot work (one line: which value and why)."""


@dataclass(frozen=True)
class Budget:
    """What one curve's search may spend."""

    max_points: int = 16              # measured levels
    max_seconds: float | None = 1800  # wall time, warm-ups included; None: no limit
    max_concurrency: int = 512        # the highest level the search may ask for
    start: int = 1                    # the first level

    def validate(self) -> "Budget":
        if self.max_points < MIN_POINTS:
            raise BudgetError(f"--budget-points {self.max_points}: the search needs at least {MIN_POINTS} "
                              "points (a knee with an interval needs three levels)")
        if self.max_seconds is not None and not (self.max_seconds > 0 and math.isfinite(self.max_seconds)):
            raise BudgetError(f"--budget-seconds {self.max_seconds}: must be a positive number of seconds")
        if self.start < 1:
            raise BudgetError(f"--auto-start {self.start}: must be at least 1")
        if self.max_concurrency < 2 * self.start:
            raise BudgetError(f"--max-concurrency {self.max_concurrency} leaves no room to grow from "
                              f"--auto-start {self.start} (it must be at least {2 * self.start})")
        return self


@dataclass(frozen=True)
class Observation:
    """One measured level, as the search sees it."""

    concurrency: int
    per_stream_tps: float | None
    aggregate_tps: float | None
    ttft_p50_s: float | None = None
    slo_attainment: float | None = None
    seconds: float = 0.0                          # wall time the point took, warm-up included
    trial_rates: tuple[float | None, ...] = ()    # per-trial median per-stream rates
    trial_attainments: tuple[float | None, ...] = ()

    def sweep_point(self) -> SweepPoint:
        return SweepPoint(concurrency=self.concurrency, per_stream_tokens_per_second=self.per_stream_tps,
                          aggregate_tokens_per_second=self.aggregate_tps, ttft_p50_seconds=self.ttft_p50_s)


@dataclass(frozen=True)
class Boundary:
    """A threshold whose crossing the search locates: a per-stream floor or the SLO attainment target."""

    kind: str          # KIND_FLOOR | KIND_SLO
    threshold: float   # tok/s for a floor, a fraction for the SLO target
    label: str         # "50 tok/s floor", "SLO attainment 0.99"

    def value(self, obs: Observation) -> float | None:
        return obs.per_stream_tps if self.kind == KIND_FLOOR else obs.slo_attainment

    def trial_values(self, obs: Observation) -> tuple[float | None, ...]:
        return obs.trial_rates if self.kind == KIND_FLOOR else obs.trial_attainments

    def meets(self, obs: Observation) -> bool | None:
        v = self.value(obs)
        return None if v is None else v >= self.threshold


def floor_boundary(floor: float) -> Boundary:
    return Boundary(KIND_FLOOR, float(floor), f"{floor:g} tok/s floor")


def slo_boundary(target: float) -> Boundary:
    return Boundary(KIND_SLO, float(target), f"SLO attainment {target:g}")


@dataclass(frozen=True)
class SearchConfig:
    boundaries: tuple[Boundary, ...]
    budget: Budget = Budget()
    floors: tuple[float, ...] = ()    # floors handed to the fit (its capacity predictions)

    @classmethod
    def make(cls, floors: Sequence[float], slo_target: float | None = None,
             budget: Budget | None = None) -> "SearchConfig":
        bounds = tuple(floor_boundary(f) for f in floors)
        if slo_target is not None:
            bounds += (slo_boundary(slo_target),)
        return cls(boundaries=bounds, budget=(budget or Budget()).validate(), floors=tuple(floors))


@dataclass(frozen=True)
class Decision:
    """What to measure next (`concurrency`), or that the search is over (`concurrency` None)."""

    step: int                 # 1-based number of the point this decision asks for
    concurrency: int | None
    phase: str                # one of PHASES
    reason: str
    goal: str = ""            # the goal that chose it ("knee", a boundary label, "budget", ...)

    def to_json(self) -> dict:
        return {"step": self.step, "concurrency": self.concurrency, "phase": self.phase,
                "reason": self.reason, "goal": self.goal}


@dataclass
class Bracket:
    """Where one boundary stands: `lower` meets it (0: nothing measured meets it), `upper` misses it."""

    boundary: Boundary
    lower: int | None      # highest measured level that meets it (0 when the lowest measured misses)
    upper: int | None      # lowest measured level above `lower` (misses it, by construction)

    @property
    def bracketed(self) -> bool:
        return self.lower is not None and self.upper is not None

    @property
    def width(self) -> int | None:
        return None if not self.bracketed else self.upper - self.lower

    @property
    def known(self) -> bool:
        return self.bracketed and self.upper - self.lower <= 1


def bracket(boundary: Boundary, observations: Sequence[Observation]) -> Bracket:
    """The seed definition on the measured points: `lower` = the highest level that meets the
    boundary, `upper` = the lowest measured level above it.  Levels without a value (every stream
    bunched or short) take no part."""
    judged = sorted((o.concurrency, ok) for o in observations if (ok := boundary.meets(o)) is not None)
    if not judged:
        return Bracket(boundary, None, None)
    meeting = [c for c, ok in judged if ok]
    lower = max(meeting) if meeting else 0
    above = [c for c, _ in judged if c > lower]
    return Bracket(boundary, lower, min(above) if above else None)


def fit(observations: Sequence[Observation], floors: Sequence[float]) -> KneeResult | None:
    if len({o.concurrency for o in observations}) < 2:
        return None
    return fit_points([o.sweep_point() for o in observations], floors=floors)


def knee_with_interval(result: KneeResult | None) -> bool:
    if result is None or result.knee is None or result.verdict not in (VERDICT_OK, VERDICT_RETROGRADE):
        return False
    ci = (result.ci or {}).get("knee")
    return isinstance(ci, list) and len(ci) == 2 and None not in ci


def predicted_seconds(level: int, observations: Sequence[Observation], result: KneeResult | None) -> float:
    """Wall time a point at `level` should take: the measured point nearest to it, scaled by the
    fitted step time (a wave's length is its output tokens times the step time), or by the level
    ratio (an upper bound: step time grows at most in proportion to the batch) before a fit."""
    timed = [o for o in observations if o.seconds > 0]
    if not timed:
        return 0.0
    ref = min(timed, key=lambda o: abs(math.log(level / o.concurrency)))
    a = None if result is None else result.alpha_seconds
    b = None if result is None else result.beta_seconds
    if a is not None and b is not None and a + b * ref.concurrency > 0:
        scale = (a + b * level) / (a + b * ref.concurrency)
    else:
        scale = max(1.0, level / ref.concurrency)
    return ref.seconds * max(scale, 0.0)


class AdaptiveSearch:
    """One curve's search.  Call `decide(observations, elapsed)` after every measured point (the
    observations in the order they were measured, each call extending the last); it returns the
    next level with its reason, or a stop (`concurrency` None).  Deterministic for given inputs."""

    def __init__(self, cfg: SearchConfig) -> None:
        self.cfg = cfg
        self.decisions: list[Decision] = []
        self._guided: dict[str, tuple[int, bool]] = {}  # boundary label -> (level, predicted to meet)
        self._midpoint_next: set[str] = set()
        self.result: KneeResult | None = None

    # ------------------------------------------------------------------------------------ deciding
    def decide(self, observations: Sequence[Observation], elapsed_seconds: float = 0.0) -> Decision:
        obs = list(observations)
        step = len(obs) + 1
        budget = self.cfg.budget
        if not obs:
            return self._emit(Decision(step, budget.start, PHASE_START,
                                       f"start at {budget.start} stream(s): the lowest level anchors the "
                                       "fixed cost per step (alpha)", "start"))
        self._score_guesses(obs)
        self.result = fit(obs, self.cfg.floors)
        brackets = [bracket(b, obs) for b in self.cfg.boundaries]
        level, phase, reason, goal = self._next(obs, brackets)
        if level is None:
            return self._emit(Decision(step, None, PHASE_DONE, reason, goal))
        if len(obs) >= budget.max_points:
            return self._emit(Decision(step, None, PHASE_DONE,
                                       f"budget of {budget.max_points} points spent; next would have been "
                                       f"{level} ({reason})", "budget"))
        if budget.max_seconds is not None:
            cost = predicted_seconds(level, obs, self.result)
            if elapsed_seconds + cost > budget.max_seconds:
                return self._emit(Decision(step, None, PHASE_DONE,
                                           f"time budget: {elapsed_seconds:.0f} s spent, and a point at {level} "
                                           f"(about {cost:.0f} s) would pass the {budget.max_seconds:.0f} s "
                                           f"allowed; next would have been {level} ({reason})", "budget"))
        return self._emit(Decision(step, level, phase, reason, goal))

    def _emit(self, d: Decision) -> Decision:
        self.decisions.append(d)
        return d

    def _next(self, obs: list[Observation], brackets: list[Bracket]) -> tuple[int | None, str, str, str]:
        measured = {o.concurrency for o in obs}
        top = max(measured)
        ceiling = self.cfg.budget.max_concurrency
        res = self.result

        # Goals 1-2: grow until the knee has an interval and every boundary has a level that misses it.
        missing = self._missing(top, brackets, res)
        if missing and top < ceiling:
            level, why = self._grow(top, missing, brackets, res)
            if level > ceiling:
                level, why = ceiling, why + f" (capped at --max-concurrency {ceiling})"
            return level, PHASE_GROW, why, missing[0]

        # Goal 3: narrow each bracket to one stream.
        for b in brackets:
            if not b.bracketed or b.known:
                continue
            inside = [c for c in range(b.lower + 1, b.upper) if c not in measured]
            if not inside:
                continue  # every level in between was measured without a value: as known as it gets
            level, why = self._probe(b, inside, res, obs)
            return level, PHASE_BISECT, why, b.boundary.label
        if missing:
            return None, PHASE_DONE, (f"reached --max-concurrency {ceiling} with "
                                      f"{_and(_goal_text(m) for m in missing)}; "
                                      + self._met_text(brackets, res)), "ceiling"
        if not knee_with_interval(res):
            return None, PHASE_DONE, ("boundaries known, but the knee has no interval even with points past "
                                      "twice the knee; " + self._met_text(brackets, res)), "knee"
        return None, PHASE_DONE, "every goal met: " + self._met_text(brackets, res), "done"

    def _missing(self, top: int, brackets: list[Bracket], res: KneeResult | None) -> list[str]:
        """Goals only growth can meet.  The knee counts while the top level is below twice the fitted
        knee (or there is none): past that, more growth rarely tightens its interval, and the
        bisection points serve it as well."""
        missing = []
        if not knee_with_interval(res) and (res is None or res.knee is None or top < KNEE_SPAN * res.knee):
            missing.append("knee")
        missing += [b.boundary.label for b in brackets if b.upper is None]
        return missing

    def _grow(self, top: int, missing: list[str], brackets: list[Bracket],
              res: KneeResult | None) -> tuple[int, str]:
        targets: list[tuple[float, str]] = []
        if res is not None and res.beta_seconds:
            if "knee" in missing and res.knee is not None:
                targets.append((KNEE_SPAN * res.knee, f"{KNEE_SPAN:g}x the fitted knee {res.knee:.1f} "
                                                      "(points past it give the knee its interval)"))
            for b in brackets:
                if b.upper is None and b.boundary.kind == KIND_FLOOR:
                    cap = res.capacity.get(floor_key(b.boundary.threshold))
                    if cap is not None:
                        targets.append((cap + 1, f"the fitted capacity {cap} at the {b.boundary.label}"))
        need = _and(_goal_text(m) for m in missing)
        if targets:
            aim, what = max(targets)
            level = max(int(min(max(math.ceil(TARGET_MARGIN * aim), math.ceil(MIN_JUMP * top)), MAX_JUMP * top)),
                        top + 1)
            return level, (f"{need} yet; aiming {TARGET_MARGIN:g}x past {what}: {level} "
                           f"(x{level / top:.2g} from {top}; jumps are x{MIN_JUMP:g} to x{MAX_JUMP:g})")
        level = max(int(math.ceil(GROWTH * top)), top + 1)
        return level, f"{need} yet and no fit predicts it: x{GROWTH:g} from {top}"

    def _probe(self, b: Bracket, inside: list[int], res: KneeResult | None,
               obs: list[Observation]) -> tuple[int, str]:
        label = b.boundary.label
        span = f"{label} lies in [{b.lower}, {b.upper}): {b.lower} meets it, {b.upper} misses it"
        mid = inside[len(inside) // 2] if len(inside) > 2 else inside[0]
        if label in self._midpoint_next:
            self._midpoint_next.discard(label)
            return mid, f"{span}; the last guess missed, so the midpoint {mid}"
        guess, how = self._guess(b, res, obs)
        if guess is None:
            return mid, f"{span}; no prediction, so the midpoint {mid}"
        level = min(inside, key=lambda c: (abs(c - guess), c))
        predicted_meet = level <= guess
        self._guided[label] = (level, predicted_meet)
        return level, f"{span}; {how}, so {level} (expected to {'meet' if predicted_meet else 'miss'} it)"

    def _guess(self, b: Bracket, res: KneeResult | None, obs: list[Observation]) -> tuple[float | None, str]:
        """Where the boundary is expected: a level up to which it is predicted to be met (probing
        `lower` + 1 when that is `lower` itself), and how that was predicted; None without a prediction."""
        bd = b.boundary
        if bd.kind == KIND_FLOOR:
            cap = None if res is None else res.capacity.get(floor_key(bd.threshold))
            if cap is None:
                return None, ""
            cap = min(max(cap, b.lower), b.upper - 1)
            return (cap + 0.5 if cap == b.lower else cap), f"the fit predicts the capacity {cap}"
        # attainment: no model predicts it; interpolate it linearly between the bracket's ends
        value = {o.concurrency: bd.value(o) for o in obs}
        lo_v = 1.0 if b.lower == 0 else value.get(b.lower)
        hi_v = value.get(b.upper)
        if lo_v is None or hi_v is None or not lo_v > hi_v:
            return None, ""
        at = b.lower + (lo_v - bd.threshold) / (lo_v - hi_v) * (b.upper - b.lower)
        return at, (f"attainment {lo_v:.3g} at {b.lower} and {hi_v:.3g} at {b.upper} cross "
                    f"{bd.threshold:g} near {at:.1f}")

    def _score_guesses(self, obs: list[Observation]) -> None:
        """A guided probe whose outcome the model got wrong makes the next probe of that boundary a
        midpoint (the safeguard that keeps a wrong model from stalling the bisection)."""
        last = obs[-1]
        for bd in self.cfg.boundaries:
            g = self._guided.pop(bd.label, None)
            if g is None or g[0] != last.concurrency:
                continue
            met = bd.meets(last)
            if met is not None and met != g[1]:
                self._midpoint_next.add(bd.label)

    def _met_text(self, brackets: list[Bracket], res: KneeResult | None) -> str:
        parts = []
        if res is not None and res.knee is not None:
            parts.append(f"knee {res.knee:.1f}" + _ci_text((res.ci or {}).get("knee")))
        for b in brackets:
            if b.lower is None:
                parts.append(f"{b.boundary.label}: no measured value")
            elif b.upper is None:
                parts.append(f"{b.boundary.label}: met up to {b.lower}")
            else:
                parts.append(f"{b.boundary.label}: {b.lower} meets it, {b.upper} misses it")
        return "; ".join(parts)

    # ------------------------------------------------------------------------------------- outcome
    def outcome(self, observations: Sequence[Observation]) -> dict:
        """How the search ended and how sure each boundary is (the `search` block of summary.json)."""
        obs = list(observations)
        res = self.result if self.result is not None else fit(obs, self.cfg.floors)
        last = self.decisions[-1] if self.decisions else None
        stopped = last is not None and last.concurrency is None
        return {
            "method": "adaptive (--levels auto)",
            "budget": {"max_points": self.cfg.budget.max_points, "max_seconds": self.cfg.budget.max_seconds,
                       "max_concurrency": self.cfg.budget.max_concurrency, "start": self.cfg.budget.start},
            "points": len(obs),
            "seconds": round(sum(o.seconds for o in obs), 3),
            "complete": stopped and last.goal == "done",
            "stop_reason": last.reason if stopped else "the run ended before the search did",
            "knee_with_interval": knee_with_interval(res),
            "order": [o.concurrency for o in obs],
            "decisions": [d.to_json() for d in self.decisions],
            "boundaries": [boundary_outcome(bracket(b, obs), obs, self.decisions, res)
                           for b in self.cfg.boundaries],
        }


def boundary_outcome(b: Bracket, obs: Sequence[Observation], decisions: Sequence[Decision],
                     res: KneeResult | None) -> dict:
    """One boundary: its value, bracket, how it was found, and the evidence behind it."""
    bd = b.boundary
    by_level = {o.concurrency: o for o in obs}
    grown = sum(1 for d in decisions if d.concurrency is not None and d.phase in (PHASE_START, PHASE_GROW))
    probes = [d for d in decisions if d.concurrency is not None and d.phase == PHASE_BISECT and d.goal == bd.label]
    if b.lower is None:
        status, how = "not measured", "no measured level has a value for it"
    elif b.upper is None:
        status, how = "not bracketed", f"every measured level up to {b.lower} meets it"
    else:
        status = "known to one stream" if b.known else "bracketed"
        if b.lower == 0:
            how = f"the lowest measured level, {b.upper}, already misses it"
        else:
            how = (f"growth ({grown} level(s), x2 or model-guided jumps) bracketed it; {len(probes)} "
                   f"bisection probe(s) narrowed it to [{b.lower}, {b.upper})")
    out = {"kind": bd.kind, "threshold": bd.threshold, "label": bd.label, "value": b.lower,
           "bracket": [b.lower, b.upper], "resolution": b.width, "status": status, "found_by": how,
           "bisection_probes": len(probes)}
    for side, level, want in (("lower", b.lower, True), ("upper", b.upper, False)):
        o = by_level.get(level) if level else None
        if o is None:
            out[side] = None
            continue
        vals = [v for v in bd.trial_values(o) if v is not None]
        agree = sum((v >= bd.threshold) == want for v in vals)
        value = bd.value(o)
        out[side] = {"concurrency": level, "value": value, "trials": len(vals), "trials_agreeing": agree,
                     "margin": None if value is None or not bd.threshold else
                     round((value - bd.threshold) / bd.threshold, 4)}
    sure = all(out[s] is not None and out[s]["trials"] and out[s]["trials_agreeing"] == out[s]["trials"]
               for s in ("lower", "upper"))
    out["every_trial_agrees"] = sure if b.bracketed and b.lower else None
    if bd.kind == KIND_FLOOR and res is not None:
        key = floor_key(bd.threshold)
        out["fitted"] = res.capacity.get(key)
        out["fitted_ci"] = ((res.ci or {}).get("capacity") or {}).get(key)
    out["confidence"], out["doubts"] = _confidence(out)
    return out


def _confidence(out: dict) -> tuple[str | None, list[str]]:
    """'firm' when every trial on both sides agrees and the fit's interval holds the value; else
    'shaky' with what speaks against it (a box whose speed changes between points shows here)."""
    if out["status"] not in ("known to one stream", "bracketed") or not out["value"]:
        return None, []
    doubts = []
    for side, word in (("lower", "met"), ("upper", "missed")):
        e = out.get(side)
        if e and e["trials"] and e["trials_agreeing"] < e["trials"]:
            doubts.append(f"{e['concurrency']} {word} it in {e['trials_agreeing']} of {e['trials']} trials")
    ci = out.get("fitted_ci")
    slack = max(1.0, 0.05 * out["value"])  # the interval of an integer count from a few points runs narrow
    if isinstance(ci, list) and None not in ci and not ci[0] - slack <= out["value"] <= ci[1] + slack:
        doubts.append(f"the fit's 95% interval for it is [{ci[0]}, {ci[1]}]")
    return ("shaky" if doubts else "firm"), doubts


def _ci_text(ci) -> str:
    return f" [{ci[0]:.1f}, {ci[1]:.1f}]" if isinstance(ci, list) and len(ci) == 2 and None not in ci else ""


def _goal_text(goal: str) -> str:
    return "no knee with an interval" if goal == "knee" else f"no level that misses the {goal}"


def _and(items) -> str:
    items = list(items)
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


@dataclass
class SearchTrace:
    """A finished search driven by `run_search`: the observations in measured order and the search."""

    search: AdaptiveSearch
    observations: list[Observation] = field(default_factory=list)
    seconds: float = 0.0

    def outcome(self) -> dict:
        return self.search.outcome(self.observations)


def run_search(cfg: SearchConfig, measure) -> SearchTrace:
    """Drive a search with `measure(level) -> Observation` (simulations, benchmarks; the CLI runner
    drives it itself, asynchronously).  Elapsed time is the sum of the observations' `seconds`."""
    trace = SearchTrace(AdaptiveSearch(cfg))
    while True:
        d = trace.search.decide(trace.observations, trace.seconds)
        if d.concurrency is None:
            return trace
        o = measure(d.concurrency)
        trace.observations.append(o)
        trace.seconds += o.seconds
