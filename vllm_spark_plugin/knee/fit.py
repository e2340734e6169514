"""Fit the step-time model to sweep points or per-step samples; derive knee, plateau and capacity.

Model: a decode step with b running streams takes t(b) = alpha + beta*b seconds (plus gamma per
prefill token mixed into the step).  With tokens_per_step tokens per stream per step (1 without
speculative decoding):

* per-stream rate      r(b) = tokens_per_step / t(b)
* aggregate throughput T(b) = b * tokens_per_step / t(b), rising to the plateau tokens_per_step/beta
* knee                 K = alpha/beta (where T's linear and plateau asymptotes meet)
* capacity at floor F  the highest integer b with r(b) >= F, i.e. b <= (tokens_per_step/F - alpha)/beta

Sweep points carry rates, not step times: the per-stream median rate r at concurrency c gives
1/r = alpha + beta*c and the aggregate A gives c/A = alpha + beta*c (both in seconds per token, so
speculative decoding is already folded in).  Both observations of a point enter one fit.

When the aggregate falls at high concurrency ("retrograde") the linear model cannot describe it;
the Universal Scalability Law X(N) = lambda*N / (1 + sigma*(N-1) + kappa*N*(N-1)) is fitted instead.
N/X is linear in (1, N-1, N(N-1)), so the same robust regression fits it (see robust.py).

Public functions never raise on bad data: they return a KneeResult with a verdict saying why.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, NamedTuple, Sequence

import numpy as np

from ..definitions import DEFAULT_FLOOR_TOKENS_PER_SECOND, SweepPoint, capacity_at_floor
from .result import (MODEL_LINEAR, MODEL_USL, VERDICT_INVALID, VERDICT_NO_KNEE, VERDICT_NO_SPREAD,
                     VERDICT_OK, VERDICT_RETROGRADE, VERDICT_TOO_FEW, KneeResult, finite_or_none,
                     floor_key)
from .robust import irls_batched, robust_fit, weighted_median, weighted_r2

DEFAULT_CI_LEVEL = 0.95
RETROGRADE_MIN_DROP = 0.05   # the aggregate must fall at least 5% below its peak (and 3 noise sigmas)
UNRESOLVED_GROWTH = 0.01     # step time growing less than this across the range: beta counts as 0
MIN_STEP_SAMPLES = 10        # per-step fits below this many samples say "too few points"
_LEVEL_BINS_ABOVE = 48       # more distinct batch sizes than this: group them in geometric bins


@dataclass
class _Data:
    x: np.ndarray        # concurrency / batch size per observation
    y: np.ndarray        # seconds per step (steps) or seconds per token (sweeps)
    p: np.ndarray | None  # prefill tokens per step (steps only)
    w: np.ndarray        # case weights (forgetting)
    case: np.ndarray     # bootstrap unit of each observation
    n_cases: int
    tps: float           # tokens per stream per step (weighted mean)
    k: np.ndarray        # tokens per stream of each observation (1 for sweep observations)
    level_min_count: int  # observations a level needs to take part in the retrograde check


@dataclass
class _Model:
    kind: str                    # MODEL_LINEAR or MODEL_USL
    active: list[int]            # design columns kept (others fixed at 0 by the sign constraints)
    theta: np.ndarray            # full-length coefficient vector (zeros where inactive)
    scale: float
    robust_weights: np.ndarray
    relative_residuals: np.ndarray
    colscale: np.ndarray


# ----------------------------------------------------------------------------- design and fitting

def _design(x: np.ndarray, p: np.ndarray | None, kind: str) -> np.ndarray:
    if kind == MODEL_LINEAR:
        cols = [np.ones_like(x), x]
    else:
        cols = [np.ones_like(x), x - 1.0, x * (x - 1.0)]
    if p is not None:
        cols.append(p)
    return np.column_stack(cols)


def _fit_constrained(X: np.ndarray, y: np.ndarray, w: np.ndarray, kind: str,
                     nonneg: Sequence[int]) -> _Model | None:
    """Robust fit; a coefficient in `nonneg` that comes out negative is fixed at 0 and the rest refit.

    Physical signs: a step cannot cost less than nothing (alpha >= 0), another stream cannot make
    a step faster (beta >= 0), nor can prefill tokens (gamma >= 0).
    """
    active = list(range(X.shape[1]))
    colscale = np.maximum(np.abs(X).max(axis=0), 1e-300)
    while active:
        Xs = X[:, active] / colscale[active]
        fit = robust_fit(Xs, y, w)
        theta_a = fit.theta / colscale[active]
        theta = np.zeros(X.shape[1])
        theta[active] = theta_a
        negative = [(theta[j], j) for j in active if j in nonneg and theta[j] < 0]
        if not negative or len(active) == 1:
            return _Model(kind, active, theta, fit.scale, fit.robust_weights, fit.relative_residuals,
                          colscale)
        active.remove(min(negative)[1])
    return None


# ----------------------------------------------------------------------------- derived quantities

def _unresolved_beta(alpha, beta, x_min: float, x_max: float):
    """True where step time grows by less than UNRESOLVED_GROWTH across the measured range.

    Such a slope is indistinguishable from 0, and K = alpha/beta would be an arbitrarily large
    number; it is treated as beta = 0 (no knee, no plateau) in estimates and bootstrap replicates.
    """
    return (beta > 0) & (beta * (x_max - x_min) < UNRESOLVED_GROWTH * (alpha + beta * x_min))


def _linear_derived(alpha: np.ndarray, beta: np.ndarray, tps: float, floors: Sequence[float]):
    """Knee, plateau and capacity (continuous, before flooring) for arrays of alpha/beta."""
    with np.errstate(divide="ignore", invalid="ignore"):
        pos = beta > 0
        knee = np.where(pos, np.maximum(alpha, 0.0) / np.where(pos, beta, 1.0), np.inf)
        plateau = np.where(pos, tps / np.where(pos, beta, 1.0), np.inf)
        caps = {}
        for f in floors:
            budget = tps / f - alpha          # step-time headroom above the fixed cost
            cap = np.where(pos, budget / np.where(pos, beta, 1.0), np.where(budget >= 0, np.inf, 0.0))
            caps[f] = cap
    return knee, plateau, caps


def _usl_params(theta: np.ndarray, tps: float) -> dict[str, float | None]:
    a, b, c = (float(v) for v in theta[:3])
    if not a > 0:
        return {}
    lam, sigma, kappa = tps / a, b / a, c / a
    peak_n = math.sqrt((1.0 - sigma) / kappa) if kappa > 0 and sigma < 1 else None
    peak_x = None
    if peak_n is not None:
        peak_x = lam * peak_n / (1 + sigma * (peak_n - 1) + kappa * peak_n * (peak_n - 1))
    return {"lambda_tokens_per_second": lam, "sigma": sigma, "kappa": kappa,
            "peak_concurrency": peak_n, "peak_tokens_per_second": peak_x,
            "step_seconds_quadratic": c}


def _usl_derived(theta: np.ndarray, tps: float, floors: Sequence[float]):
    """Arrays over replicates: peak N*, peak X(N*), alpha, beta, capacity for theta (B, >=3)."""
    a, b, c = theta[:, 0], theta[:, 1], theta[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = (a > 0) & (c > 0) & (b < a)
        n_star = np.where(ok, np.sqrt(np.where(ok, (a - b) / np.where(c > 0, c, 1.0), 0.0)), np.nan)
        t_star = a + b * (n_star - 1) + c * n_star * (n_star - 1)
        x_star = np.where(ok, n_star * tps / t_star, np.nan)
        caps = {}
        for f in floors:
            # c N^2 + (b - c) N + (a - b - tps/f) <= 0 : largest root
            qa, qb, qc = c, b - c, a - b - tps / f
            disc = qb * qb - 4 * qa * qc
            root = np.where((qa > 0) & (disc >= 0), (-qb + np.sqrt(np.maximum(disc, 0))) / (2 * np.where(qa > 0, qa, 1.0)), np.nan)
            caps[f] = np.where(a > tps / f, 0.0, root)  # even one stream is too slow
    return n_star, x_star, a - b, b - c, caps


def _floor_count(v: float | None) -> int | None:
    """Continuous stream count -> integer count of streams (None for unbounded/unknown)."""
    if v is None or not math.isfinite(v):
        return None
    return max(0, int(math.floor(v + 1e-9)))


def _interval(values: np.ndarray, level: float) -> list[float | None] | None:
    """Percentile interval by order statistics (robust to +inf replicates: unbounded -> None)."""
    v = np.sort(values[~np.isnan(values)])
    if v.size == 0:
        return None
    lo_q, hi_q = (1 - level) / 2, 1 - (1 - level) / 2
    lo = v[int(math.floor(lo_q * (v.size - 1)))]
    hi = v[int(math.ceil(hi_q * (v.size - 1)))]
    return [finite_or_none(lo), finite_or_none(hi)]


# ----------------------------------------------------------------------------- retrograde check

def _levels(x: np.ndarray, agg: np.ndarray, w: np.ndarray, min_count: int):
    """Weighted median aggregate per concurrency level (geometric bins when levels are many)."""
    ux = np.unique(x)
    if ux.size > _LEVEL_BINS_ABOVE:
        edges = np.exp(np.arange(0.0, math.log(ux.max()) + 0.5, math.log(1.25)))
        key = np.searchsorted(edges, x, side="right")
    else:
        key = np.searchsorted(ux, x)
    lx, la, counts = [], [], []
    for k in np.unique(key):
        m = key == k
        if m.sum() < min_count or not w[m].sum() > 0:
            continue
        lx.append(weighted_median(x[m], w[m]))
        la.append(weighted_median(agg[m], w[m]))
        counts.append(int(m.sum()))
    return np.array(lx), np.array(la), (min(counts) if counts else 0)


def _level_drop(data: _Data, ref: _Model) -> tuple[float, int]:
    """How far the measured aggregate at the largest level sits below its peak (0 if it does not).

    Each observation implies an aggregate x*k/(y - gamma*p) (for a sweep: 1/r -> c*r, c/A -> A).
    Observations the robust reference fit rejected are left out, so one wild point cannot fake
    a peak.  Returns (relative drop, observations behind the thinnest level).
    """
    y = data.y
    if data.p is not None:
        y = y - ref.theta[-1] * data.p
    keep = (ref.robust_weights > 0) & (y > 0) & (data.w > 0)
    if keep.sum() < 3:
        return 0.0, 0
    agg = data.x[keep] * data.k[keep] / y[keep]
    lx, la, lmin = _levels(data.x[keep], agg, data.w[keep], data.level_min_count)
    if lx.size < 3:
        return 0.0, lmin
    j = int(np.argmax(la))
    if j >= lx.size - 1:
        return 0.0, lmin
    return float(1.0 - la[-1] / la[j]), lmin


# ----------------------------------------------------------------------------- the core

def _ttft_bound(ttft: list[tuple[float, float]], slo: float) -> tuple[int | None, str | None]:
    """Highest concurrency whose (interpolated) TTFT p50 is within slo; None when never exceeded."""
    by_level: dict[float, list[float]] = {}
    for c, v in ttft:
        by_level.setdefault(c, []).append(v)
    levels = sorted((c, float(np.median(v))) for c, v in by_level.items())
    if not levels:
        return None, "no TTFT data: the TTFT bound was not applied"
    if levels[0][1] > slo:
        return 0, f"TTFT p50 {levels[0][1]:.3g} s at the smallest concurrency {levels[0][0]:g} already exceeds {slo:g} s"
    for (c0, v0), (c1, v1) in zip(levels, levels[1:]):
        if v1 > slo >= v0:
            c = c0 + (slo - v0) / (v1 - v0) * (c1 - c0)
            return _floor_count(c), None
    return None, (f"TTFT p50 stays within {slo:g} s up to the largest measured concurrency "
                  f"{levels[-1][0]:g}; beyond it the TTFT bound is unknown")


def _clean_floors(floors: Iterable[Any], notes: list[str]) -> list[float]:
    out = []
    for f in floors if floors is not None else ():
        v = finite_or_none(f)
        if v is None or v <= 0:
            notes.append(f"ignored floor {f!r}: must be a positive number of tokens/s")
        elif v not in out:
            out.append(v)
    return out


class _Quality(NamedTuple):
    r2: float | None
    dof: int                     # residual degrees of freedom (<= 0: exactly determined)
    mare: float                  # median absolute relative residual
    n_outliers: int


class _Estimate(NamedTuple):
    theta: np.ndarray            # the model's coefficients, beta zeroed when unresolved
    alpha: float
    beta: float
    knee: float
    plateau: float
    capacity: dict[float, float]  # floor -> continuous capacity (before flooring and the TTFT bound)


def _fit_core(data: _Data, *, source: str, floors: list[float], notes: list[str],
              n_input: int, n_dropped: int, concurrencies: Sequence[float] | None,
              ttft: list[tuple[float, float]], ttft_slo: float | None, bootstrap: int,
              seed: int, ci_level: float, points: Sequence[SweepPoint] | None) -> KneeResult:
    """The fit, step by step; each step appends its notes in this order."""
    x = data.x
    base = dict(source=source, n_input=n_input, n_dropped=n_dropped, tokens_per_step=data.tps,
                notes=notes, levels=int(np.unique(x).size), n=int(x.size),
                max_measured=float(x.max()))
    # 1. The linear model, robustly, with physical signs.
    model, gamma = _fit_linear(data, notes)
    if model is None:
        return KneeResult(verdict=VERDICT_INVALID, notes=notes + ["the robust fit found no solution"],
                          **{k: v for k, v in base.items() if k != "notes"})
    # 2. Retrograde?  The Universal Scalability Law replaces it when the aggregate falls in range.
    model, gamma, usl = _retrograde(data, model, gamma, base["levels"], base["max_measured"], notes)
    # 3. How well it fits.
    quality = _quality(data, model, notes)
    # 4. Point estimates: alpha, beta, knee, plateau, capacity per floor.
    est = _estimate(data, model, floors, notes)
    # 5. The TTFT bound, then 6. capacity per floor under both.
    ttft_cap = _ttft_cap(ttft, ttft_slo, notes)
    capacity = _capacity(floors, est.capacity, ttft_cap, base["max_measured"], notes)
    # 7. The verdict.
    verdict, knee, plateau, extrapolated = _verdict(model, est, base["max_measured"], notes)
    # 8. The fitted curves, 9. the bootstrap intervals, 10. the capacity the sweep measured.
    curves = _curves(source, x, est.theta, model.kind, data.tps, concurrencies, base["max_measured"])
    ci = _bootstrap(data, model, floors, ttft_cap, bootstrap, seed, ci_level, quality.dof)
    cap_measured = {}
    if points is not None:
        for f in floors:
            cap_measured[floor_key(f)] = capacity_at_floor(points, f, ttft_slo)

    return KneeResult(
        verdict=verdict, model=model.kind, alpha_seconds=est.alpha, beta_seconds=est.beta,
        gamma_seconds_per_prefill_token=gamma, knee=knee, plateau_tokens_per_second=plateau,
        capacity=capacity, capacity_measured=cap_measured, ttft_slo_seconds=ttft_slo,
        capacity_ttft_bound=ttft_cap, curves=curves, r2=quality.r2, median_abs_rel_residual=quality.mare,
        n_outliers=quality.n_outliers, extrapolated=extrapolated, ci=ci, usl=usl, **base)


def _fit_linear(data: _Data, notes: list[str]) -> tuple[_Model | None, float | None]:
    """Step 1: t = alpha + beta*x (+ gamma*p) with alpha, beta, gamma >= 0; (model, gamma)."""
    p = data.p
    nonneg = [0, 1] + ([2] if p is not None else [])
    model = _fit_constrained(_design(data.x, p, MODEL_LINEAR), data.y, data.w, MODEL_LINEAR, nonneg)
    if model is None:
        return None, None
    gamma = float(model.theta[2]) if p is not None else None
    if p is not None and 2 not in model.active:
        notes.append("prefill tokens showed no cost per token (gamma fixed at 0)")
    return model, gamma


def _retrograde(data: _Data, model: _Model, gamma: float | None, levels: int, max_measured: float,
                notes: list[str]) -> tuple[_Model, float | None, dict | None]:
    """Step 2: (model, gamma, USL parameters or None).  The USL (which contains the linear model as
    kappa = 0) is the reference: its outlier flags decide which observations count, and its noise
    scale how big a drop is real.  It replaces the linear model only with its peak inside the range."""
    if levels < 3:
        return model, gamma, None
    p = data.p
    p_cols = [3] if p is not None else []
    usl_model = _fit_constrained(_design(data.x, p, MODEL_USL), data.y, data.w, MODEL_USL, [1, 2] + p_cols)
    if usl_model is None:
        return model, gamma, None
    drop, lmin = _level_drop(data, usl_model)
    noise = usl_model.scale / math.sqrt(max(lmin, 1))
    if drop < max(RETROGRADE_MIN_DROP, 3.0 * noise):
        return model, gamma, None
    params = _usl_params(usl_model.theta, data.tps) if 2 in usl_model.active else {}
    peak = params.get("peak_concurrency")
    if peak is not None and peak < max_measured:
        return usl_model, (float(usl_model.theta[3]) if p is not None else gamma), params
    notes.append(f"the aggregate at the largest concurrency is {drop:.0%} below its "
                 "peak, but the Universal Scalability Law puts no peak inside the "
                 "measured range; linear model kept")
    return model, gamma, None


def _quality(data: _Data, model: _Model, notes: list[str]) -> _Quality:
    """Step 3: weighted R^2 (None when exactly determined), residual dof, outliers rejected."""
    x, y, w = data.x, data.y, data.w
    yhat = _design(x, data.p, model.kind) @ model.theta
    r2 = weighted_r2(y, yhat, w * model.robust_weights)
    dof = x.size - len(model.active)
    if dof <= 0:
        r2 = None
        notes.append("exactly determined (as many parameters as observations): no residual check "
                     "and no confidence interval")
    mare = float(np.median(np.abs(model.relative_residuals)))
    n_out = int(np.sum((model.robust_weights <= 0) & (w > 0)))
    if n_out:
        notes.append(f"{n_out} observation(s) rejected as outliers by the robust fit")
    return _Quality(r2, dof, mare, n_out)


def _estimate(data: _Data, model: _Model, floors: list[float], notes: list[str]) -> _Estimate:
    """Step 4: the point estimates; a linear slope too small to resolve counts as beta = 0."""
    theta, tps = model.theta, data.tps
    if model.kind == MODEL_LINEAR:
        alpha, beta = float(theta[0]), float(theta[1])
        if _unresolved_beta(alpha, beta, float(data.x.min()), float(data.x.max())):
            notes.append(f"step time grows by less than {UNRESOLVED_GROWTH:.0%} across the measured "
                         "range: beta is treated as 0")
            beta = 0.0
            theta = theta.copy()
            theta[1] = 0.0
        knee_a, plat_a, caps_a = _linear_derived(np.array([alpha]), np.array([beta]), tps, floors)
        return _Estimate(theta, alpha, beta, float(knee_a[0]), float(plat_a[0]),
                         {f: float(caps_a[f][0]) for f in floors})
    n_star, x_star, al, be, caps_a = _usl_derived(theta[None, :], tps, floors)
    return _Estimate(theta, float(al[0]), float(be[0]), float(n_star[0]), float(x_star[0]),
                     {f: float(caps_a[f][0]) for f in floors})


def _ttft_cap(ttft: list[tuple[float, float]], ttft_slo: float | None, notes: list[str]) -> int | None:
    """Step 5: the highest concurrency within the TTFT SLO (None: no SLO, or never exceeded)."""
    if ttft_slo is None:
        return None
    cap, why = _ttft_bound(ttft, ttft_slo)
    if why:
        notes.append(why)
    return cap


def _capacity(floors: list[float], continuous: dict[float, float], ttft_cap: int | None, max_measured: float,
              notes: list[str]) -> dict[str, int | None]:
    """Step 6: streams per floor, floored to a count and bounded by the TTFT cap."""
    capacity: dict[str, int | None] = {}
    for f in floors:
        c = _floor_count(continuous[f])
        if c is None and continuous[f] == math.inf:
            notes.append(f"per-stream rate never falls to {f:g} tok/s under the fitted model: "
                         "capacity at that floor is unbounded (reported as unknown)")
        if ttft_cap is not None:
            c = ttft_cap if c is None else min(c, ttft_cap)
        if c is not None and c > max_measured:
            notes.append(f"capacity {c} at {f:g} tok/s lies beyond the largest measured "
                         f"concurrency {max_measured:g}: an extrapolation")
        capacity[floor_key(f)] = c
    return capacity


def _verdict(model: _Model, est: _Estimate, max_measured: float,
             notes: list[str]) -> tuple[str, float | None, float | None, bool]:
    """Step 7: (verdict, knee, plateau, extrapolated); no knee reports neither knee nor plateau."""
    knee, plateau, extrapolated = est.knee, est.plateau, False
    if model.kind == MODEL_USL:
        verdict = VERDICT_RETROGRADE
        notes.append(f"retrograde: aggregate throughput falls at high concurrency; Universal "
                     f"Scalability Law peak N* = {knee:.3g} streams at {plateau:.4g} tok/s "
                     f"(knee and plateau report the peak)")
    elif not math.isfinite(knee):
        verdict = VERDICT_NO_KNEE
        notes.append("step time does not grow with the batch (beta = 0): throughput is still "
                     "rising linearly, no plateau or knee in the measured range")
        knee = plateau = None
    elif knee > max_measured:
        verdict = VERDICT_NO_KNEE
        extrapolated = True
        notes.append(f"knee {knee:.3g} lies beyond the largest measured concurrency "
                     f"{max_measured:g}: the estimate is an extrapolation")
    else:
        verdict = VERDICT_OK
    if model.kind == MODEL_LINEAR and 0 not in model.active:
        notes.append("no fixed cost per step resolved (alpha fixed at 0): the curve is at its "
                     "plateau from the smallest batch")
    return verdict, knee, plateau, extrapolated


def _curves(source: str, x: np.ndarray, theta: np.ndarray, kind: str, tps: float,
            concurrencies: Sequence[float] | None, max_measured: float) -> dict[str, list]:
    """Step 8: step time, per-stream and aggregate rate on the requested grid (default: the sweep's
    levels, or powers of two up to the largest batch)."""
    if concurrencies is None:
        if source == "sweep":
            grid = sorted(set(float(v) for v in x))
        else:
            top = max(max_measured, 1.0)
            grid = [float(2 ** k) for k in range(0, int(math.ceil(math.log2(top))) + 1)]
    else:
        grid = [float(v) for v in concurrencies if finite_or_none(v) is not None and float(v) > 0]
    g = np.array(grid, dtype=float)
    if kind == MODEL_LINEAR:
        t_grid = theta[0] + theta[1] * g
    else:
        t_grid = theta[0] + theta[1] * (g - 1) + theta[2] * g * (g - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        per_stream = np.where(t_grid > 0, tps / t_grid, np.nan)
    return {"concurrency": grid,
            "step_seconds": [finite_or_none(v) for v in t_grid],
            "per_stream_tokens_per_second": [finite_or_none(v) for v in per_stream],
            "aggregate_tokens_per_second": [finite_or_none(v) for v in per_stream * g]}


def _empty_ci(floors: Sequence[float], level: float, why: str | None = None) -> dict[str, Any]:
    ci: dict[str, Any] = {"level": level, "method": "percentile bootstrap", "resamples": 0,
                          "alpha_seconds": None, "beta_seconds": None, "knee": None,
                          "plateau_tokens_per_second": None,
                          "capacity": {floor_key(f): None for f in floors}}
    if why:
        ci["why_missing"] = why
    return ci


def _bootstrap(data: _Data, model: _Model, floors: Sequence[float], ttft_cap: int | None,
               resamples: int, seed: int, level: float, dof: int) -> dict[str, Any]:
    """Percentile bootstrap over cases (sweep points / step samples), all replicates in one batch.

    Each replicate reweights the cases by multinomial counts and restarts the Huber and bisquare
    steps from the full-sample fit at the full-sample scale (a fixed-scale robust bootstrap).
    """
    if resamples <= 0:
        return _empty_ci(floors, level, "bootstrap disabled")
    if data.n_cases < 3 or dof <= 0:
        return _empty_ci(floors, level, "fewer than 3 cases or no residual degrees of freedom")
    rng = np.random.default_rng(seed)
    counts = rng.multinomial(data.n_cases, np.full(data.n_cases, 1.0 / data.n_cases), size=resamples)
    W = counts[:, data.case] * data.w[None, :]
    present = W > 0
    spread = (np.where(present, data.x, np.inf).min(axis=1)
              < np.where(present, data.x, -np.inf).max(axis=1))
    W = W[spread]
    if W.shape[0] < max(10, resamples // 2):
        return _empty_ci(floors, level, "too few resamples with two or more concurrency levels")
    X = _design(data.x, data.p, model.kind)
    act = model.active
    Xs = X[:, act] / model.colscale[act]
    theta0 = np.broadcast_to(model.theta[act] * model.colscale[act], (W.shape[0], len(act))).copy()
    y_floor = max(float(np.median(data.y)) * 0.05, 1e-300)
    th_a = irls_batched(Xs, data.y, W, theta0, model.scale, y_floor) / model.colscale[act]
    theta = np.zeros((W.shape[0], X.shape[1]))
    theta[:, act] = th_a
    if model.kind == MODEL_LINEAR:
        alpha, beta = theta[:, 0], theta[:, 1].copy()
        beta[_unresolved_beta(alpha, beta, float(data.x.min()), float(data.x.max()))] = 0.0
        knee, plateau, caps = _linear_derived(alpha, beta, data.tps, floors)
    else:
        knee, plateau, alpha, beta, caps = _usl_derived(theta, data.tps, floors)
    cap_ci = {}
    for f in floors:
        c = np.floor(caps[f] + 1e-9)
        c = np.where(np.isnan(c), np.nan, np.maximum(c, 0.0))
        if ttft_cap is not None:
            c = np.minimum(c, ttft_cap)
        iv = _interval(c, level)
        cap_ci[floor_key(f)] = None if iv is None else [None if v is None else int(v) for v in iv]
    return {"level": level, "method": "percentile bootstrap", "resamples": int(W.shape[0]),
            "seed": seed, "alpha_seconds": _interval(alpha, level),
            "beta_seconds": _interval(beta, level), "knee": _interval(knee, level),
            "plateau_tokens_per_second": _interval(plateau, level), "capacity": cap_ci}


# ----------------------------------------------------------------------------- public entry points

def _guarded(fn):
    """Bad input must give a verdict, never an exception (this runs under vLLM's /metrics)."""
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - last line of defence, reported in the verdict
            return KneeResult(verdict=VERDICT_INVALID,
                              notes=[f"input could not be fitted: {type(exc).__name__}: {exc}"])
    wrapper.__name__ = fn.__name__
    wrapper.__doc__ = fn.__doc__
    wrapper.__wrapped__ = fn
    return wrapper


def _as_float_array(values: Any, name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a one-dimensional sequence, got shape {arr.shape}")
    return arr


@_guarded
def fit_points(points: Sequence[SweepPoint], *, floors: Iterable[float] = (DEFAULT_FLOOR_TOKENS_PER_SECOND,),
               ttft_slo_seconds: float | None = None, concurrencies: Sequence[float] | None = None,
               bootstrap: int = 1000, seed: int = 0, ci_level: float = DEFAULT_CI_LEVEL) -> KneeResult:
    """Fit sweep points (one curve): 1/r = alpha + beta*c and c/A = alpha + beta*c together.

    Points without a usable concurrency or any usable rate are dropped and counted.  With
    `ttft_slo_seconds`, capacity also requires the (interpolated) median TTFT to be within the bound.
    """
    notes: list[str] = []
    floor_list = _clean_floors(floors, notes)
    slo = finite_or_none(ttft_slo_seconds)
    if ttft_slo_seconds is not None and (slo is None or slo <= 0):
        notes.append(f"ignored TTFT bound {ttft_slo_seconds!r}: must be a positive number of seconds")
        slo = None
    try:
        pts = list(points)
    except TypeError:
        return KneeResult(verdict=VERDICT_INVALID, notes=notes + ["points is not a sequence of SweepPoint"])
    xs, ys, cases, kept, ttft = [], [], [], [], []
    dropped = 0
    for pt in pts:
        c = finite_or_none(getattr(pt, "concurrency", None))
        r = finite_or_none(getattr(pt, "per_stream_tokens_per_second", None))
        a = finite_or_none(getattr(pt, "aggregate_tokens_per_second", None))
        if c is None or c <= 0:
            dropped += 1
            continue
        obs = []
        if r is not None and r > 0:
            obs.append(1.0 / r)
        if a is not None and a > 0:
            obs.append(c / a)
        if not obs:
            dropped += 1
            continue
        case = len(kept)
        kept.append(pt)
        for v in obs:
            xs.append(c)
            ys.append(v)
            cases.append(case)
        t50 = finite_or_none(getattr(pt, "ttft_p50_seconds", None))
        if t50 is not None and t50 >= 0:
            ttft.append((c, t50))
    if dropped:
        notes.append(f"{dropped} point(s) without a positive finite concurrency and rate were ignored")
    base = dict(source="sweep", n_input=len(pts), n_dropped=dropped, notes=notes,
                capacity={floor_key(f): None for f in floor_list}, ci=_empty_ci(floor_list, ci_level))
    if not kept:
        verdict = VERDICT_INVALID if pts else VERDICT_TOO_FEW
        if not pts:
            notes.append("no points given")
        return KneeResult(verdict=verdict, **base)
    if len(kept) < 2:
        notes.append("one concurrency point cannot fix two parameters (alpha and beta)")
        return KneeResult(verdict=VERDICT_TOO_FEW, n=len(xs), levels=1, max_measured=max(xs), **base)
    x = np.array(xs)
    if np.unique(x).size < 2:
        notes.append(f"every point has concurrency {x[0]:g}: the slope beta is not identifiable")
        return KneeResult(verdict=VERDICT_NO_SPREAD, n=x.size, levels=1, max_measured=float(x[0]), **base)
    data = _Data(x=x, y=np.array(ys), p=None, w=np.ones(x.size), case=np.array(cases),
                 n_cases=len(kept), tps=1.0, k=np.ones(x.size), level_min_count=1)
    return _fit_core(data, source="sweep", floors=floor_list, notes=notes, n_input=len(pts),
                     n_dropped=dropped, concurrencies=concurrencies, ttft=ttft, ttft_slo=slo,
                     bootstrap=int(bootstrap), seed=int(seed), ci_level=float(ci_level), points=kept)


@_guarded
def fit_steps(batch: Sequence[float], prefill_tokens: Sequence[float] | None, step_seconds: Sequence[float],
              weights: Sequence[float] | None = None, tokens_per_stream: float | Sequence[float] = 1.0,
              *, floors: Iterable[float] = (DEFAULT_FLOOR_TOKENS_PER_SECOND,),
              concurrencies: Sequence[float] | None = None, bootstrap: int = 100, seed: int = 0,
              ci_level: float = DEFAULT_CI_LEVEL, min_samples: int = MIN_STEP_SAMPLES) -> KneeResult:
    """Fit per-step samples: step_seconds = alpha + beta*batch + gamma*prefill_tokens.

    The prefill term keeps steps that mixed a prompt's prefill into the decode batch from biasing
    alpha and beta.  `weights` (e.g. exponential forgetting by age) are case weights.
    `tokens_per_stream` (scalar or per step) is the tokens each stream gained in the step (> 1
    with speculative decoding); rates count tokens, so r(b) = tokens_per_step / t(b).
    """
    notes: list[str] = []
    floor_list = _clean_floors(floors, notes)
    empty = dict(source="steps", notes=notes, capacity={floor_key(f): None for f in floor_list},
                 ci=_empty_ci(floor_list, ci_level))
    try:
        b = _as_float_array(batch, "batch")
        t = _as_float_array(step_seconds, "step_seconds")
        p = np.zeros_like(b) if prefill_tokens is None else _as_float_array(prefill_tokens, "prefill_tokens")
        w = np.ones_like(b) if weights is None else _as_float_array(weights, "weights")
        k = (np.full_like(b, float(tokens_per_stream)) if np.ndim(tokens_per_stream) == 0
             else _as_float_array(tokens_per_stream, "tokens_per_stream"))
        if not (b.size == t.size == p.size == w.size == k.size):
            raise ValueError(f"sequence lengths differ: batch {b.size}, prefill {p.size}, "
                             f"step_seconds {t.size}, weights {w.size}, tokens_per_stream {k.size}")
    except (TypeError, ValueError) as exc:
        return KneeResult(verdict=VERDICT_INVALID, notes=notes + [str(exc)], **{k_: v for k_, v in empty.items() if k_ != "notes"})
    ok = (np.isfinite(b) & (b >= 1) & np.isfinite(t) & (t > 0) & np.isfinite(p) & (p >= 0)
          & np.isfinite(w) & (w > 0) & np.isfinite(k) & (k > 0))
    n_in, n_bad = int(b.size), int((~ok).sum())
    if n_bad:
        notes.append(f"{n_bad} sample(s) with a non-finite or non-positive value were ignored")
    empty.update(n_input=n_in, n_dropped=n_bad)
    b, t, p, w, k = b[ok], t[ok], p[ok], w[ok], k[ok]
    if b.size == 0:
        return KneeResult(verdict=VERDICT_INVALID if n_in else VERDICT_TOO_FEW, **empty)
    if b.size < max(2, int(min_samples)):
        notes.append(f"{b.size} usable step sample(s); at least {max(2, int(min_samples))} are needed")
        return KneeResult(verdict=VERDICT_TOO_FEW, n=int(b.size), max_measured=float(b.max()),
                          levels=int(np.unique(b).size), **empty)
    if np.unique(b).size < 2:
        notes.append(f"every step ran batch {b[0]:g}: the slope beta is not identifiable")
        return KneeResult(verdict=VERDICT_NO_SPREAD, n=int(b.size), levels=1,
                          max_measured=float(b[0]), **empty)
    w = w / w.max()
    tps = float((w * k).sum() / w.sum())
    # Prefill column only when the window holds enough prefill-mixed steps to estimate its cost
    use_p = int((p > 0).sum()) >= 3 and np.ptp(p) > 0
    if use_p:
        X = _design(b, p, MODEL_LINEAR)
        if np.linalg.matrix_rank(X / np.maximum(np.abs(X).max(axis=0), 1e-300)) < X.shape[1]:
            use_p = False
    data = _Data(x=b, y=t, p=p if use_p else None, w=w, case=np.arange(b.size), n_cases=int(b.size),
                 tps=tps, k=k, level_min_count=3)
    return _fit_core(data, source="steps", floors=floor_list, notes=notes, n_input=n_in,
                     n_dropped=n_bad, concurrencies=concurrencies, ttft=[], ttft_slo=None,
                     bootstrap=int(bootstrap), seed=int(seed), ci_level=float(ci_level), points=None)


def curve_at(result: KneeResult, concurrencies: Sequence[float]) -> tuple[list[float | None], list[float | None]]:
    """(per-stream, aggregate) tok/s of a fitted result at the given concurrencies (decode steps).

    None everywhere when the result holds no fitted model (too few points, invalid input, ...).
    """
    cs = [float(c) for c in concurrencies]
    if result.model == MODEL_USL and result.usl:
        lam, sig, kap = (result.usl.get(k) for k in ("lambda_tokens_per_second", "sigma", "kappa"))
        if None not in (lam, sig, kap):
            agg = [lam * c / (1 + sig * (c - 1) + kap * c * (c - 1)) for c in cs]
            return [finite_or_none(a / c) for a, c in zip(agg, cs)], [finite_or_none(a) for a in agg]
    a, b = result.alpha_seconds, result.beta_seconds
    if a is None or b is None or result.model != MODEL_LINEAR:
        return [None] * len(cs), [None] * len(cs)
    per = [result.tokens_per_step / (a + b * c) if a + b * c > 0 else None for c in cs]
    return [finite_or_none(v) for v in per], [None if v is None else finite_or_none(v * c) for v, c in zip(per, cs)]
