"""Robust weighted linear regression for step-time data (numpy only).

Method: an M-estimator fitted by iteratively reweighted least squares (IRLS), in three stages:

1. L1 (least absolute deviations) start, itself by IRLS.  LAD is convex, so the start does not
   depend on an ordinary least-squares fit that a gross outlier has already dragged away.
2. Huber steps (c = 1.345, 95% efficiency at Gaussian noise) with the scale re-estimated each
   iteration as 1.4826 x the weighted median absolute residual (MAD).
3. Tukey bisquare steps (c = 4.685) at the last Huber scale.  Bisquare redescends: a residual
   beyond about 4.7 scale units gets weight zero, so a 10x step-time spike (GC pause, preemption,
   a prefill the caller did not report) stops counting instead of merely counting less.

Residuals are relative, (y - yhat) / yhat: step-time noise is multiplicative (a 5% jitter on a
100 ms step is 5 ms, on a 25 ms step 1.25 ms), so each observation gets precision 1/yhat^2 and the
robust weights act on the relative error.

Why not Theil-Sen: it handles one regressor, no case weights (needed for exponential forgetting
and for the bootstrap) and costs O(n^2) pairs.  Why not least-trimmed squares: random elemental
subsets make the online estimate jitter between refits.  IRLS is a handful of 3x3 solves, accepts
weights, and the bootstrap runs all replicates at once as one batched solve.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HUBER_C = 1.345
BISQUARE_C = 4.685
MAD_TO_SIGMA = 1.482602218505602
MIN_RELATIVE_SCALE = 1e-6  # a perfect fit still has a usable scale


@dataclass
class RobustFit:
    theta: np.ndarray           # coefficients, one per design column
    scale: float                # robust scale of the relative residuals
    robust_weights: np.ndarray  # final per-observation robust weights (0 = rejected as outlier)
    relative_residuals: np.ndarray


def weighted_median(values: np.ndarray, weights: np.ndarray) -> float:
    """Weighted median (lower median for an exact tie); weights must be >= 0 with a positive sum."""
    order = np.argsort(values, kind="stable")
    v = values[order]
    cw = np.cumsum(weights[order])
    total = cw[-1]
    if not total > 0:
        return float(np.median(values))
    idx = int(np.searchsorted(cw, 0.5 * total, side="left"))
    return float(v[min(idx, v.size - 1)])


_TRIU: dict[int, tuple[np.ndarray, np.ndarray]] = {}


def _triu(p: int) -> tuple[np.ndarray, np.ndarray]:
    if p not in _TRIU:
        _TRIU[p] = np.triu_indices(p)
    return _TRIU[p]


def _solve_batched(Xs: np.ndarray, y: np.ndarray, v: np.ndarray,
                   cross: np.ndarray | None = None, xy: np.ndarray | None = None) -> np.ndarray:
    """Weighted least squares for every row of v (B, n) at once: returns theta (B, p).

    `cross` (products of design column pairs) and `xy` (columns times y) may be passed in
    precomputed: they do not change between iterations.
    """
    p = Xs.shape[1]
    iu0, iu1 = _triu(p)
    if cross is None:
        cross = Xs[:, iu0] * Xs[:, iu1]            # (n, p(p+1)/2)
    if xy is None:
        xy = Xs * y[:, None]
    flat = v @ cross                                # (B, p(p+1)/2)
    A = np.empty((v.shape[0], p, p))
    A[:, iu0, iu1] = flat
    A[:, iu1, iu0] = flat
    rhs = v @ xy                                    # (B, p)
    # A tiny ridge keeps a column that a resample left empty (all-zero prefill) solvable: its
    # coefficient comes out ~0 instead of the solve failing.
    diag = A[:, np.arange(p), np.arange(p)]
    A[:, np.arange(p), np.arange(p)] = diag + (1e-12 * diag.max(axis=1, keepdims=True) + 1e-300)
    try:
        return np.linalg.solve(A, rhs[..., None])[..., 0]
    except np.linalg.LinAlgError:
        return np.stack([np.linalg.lstsq(a, r, rcond=None)[0] for a, r in zip(A, rhs)])


def _denominators(yhat: np.ndarray, y_floor: float) -> np.ndarray:
    # yhat can dip to or below zero for a bad intermediate iterate; clamp so precision stays finite
    return np.maximum(yhat, y_floor)


def irls_batched(Xs: np.ndarray, y: np.ndarray, W: np.ndarray, theta: np.ndarray, scale: np.ndarray,
                 y_floor: float, huber_iters: int = 4, bisquare_iters: int = 6) -> np.ndarray:
    """Huber then bisquare steps for B weight vectors at a fixed scale (the bootstrap path).

    Xs (n, p) design, y (n,), W (B, n) case weights, theta (B, p) start, scale (B,) or scalar.
    """
    scale = np.broadcast_to(np.asarray(scale, dtype=float), (W.shape[0],))[:, None]
    iu0, iu1 = _triu(Xs.shape[1])
    cross, xy = Xs[:, iu0] * Xs[:, iu1], Xs * y[:, None]
    XsT = np.ascontiguousarray(Xs.T)
    for psi, iters in (("huber", huber_iters), ("bisquare", bisquare_iters)):
        for _ in range(iters):
            yhat = theta @ XsT
            d = _denominators(yhat, y_floor)
            u = (y - yhat) / (d * scale)
            v = _robust_weight(u, psi)
            v *= W
            v /= d * d
            theta = _solve_batched(Xs, y, v, cross, xy)
    return theta


def _robust_weight(u: np.ndarray, psi: str) -> np.ndarray:
    a = np.abs(u)
    if psi == "huber":
        return np.minimum(1.0, HUBER_C / np.maximum(a, 1e-300))
    t = np.clip(a / BISQUARE_C, 0.0, 1.0)
    return (1.0 - t * t) ** 2


def _mad_scale(e: np.ndarray, w: np.ndarray, n_params: int) -> float:
    """1.4826 x weighted median |e|, skipping the n_params smallest residuals.

    An L1 fit passes exactly through n_params observations; counting those zeros would shrink the
    scale towards nothing on small samples and turn every other point into an "outlier".
    """
    a = np.abs(e)
    order = np.argsort(a)[min(n_params, a.size - 1):]
    cw = np.cumsum(w[order])
    idx = int(np.searchsorted(cw, 0.5 * cw[-1], side="left")) if cw[-1] > 0 else order.size // 2
    return max(MAD_TO_SIGMA * float(a[order[min(idx, order.size - 1)]]), MIN_RELATIVE_SCALE)


def weighted_ls(Xs: np.ndarray, y: np.ndarray, w: np.ndarray, iters: int = 5) -> RobustFit:
    """Relative weighted least squares, no outlier rejection (for too few redundant observations)."""
    y_floor = max(float(np.median(y)) * 0.05, 1e-300)
    W = w[None, :]
    theta = _solve_batched(Xs, y, W / np.maximum(y, y_floor) ** 2)
    for _ in range(iters):
        d = _denominators(theta @ Xs.T, y_floor)
        theta = _solve_batched(Xs, y, W / (d * d))
    yhat = (theta @ Xs.T)[0]
    e = (y - yhat) / _denominators(yhat, y_floor)
    dof = max(y.size - Xs.shape[1], 1)
    scale = max(float(np.sqrt((w * e * e).sum() / w.sum() * y.size / dof)), MIN_RELATIVE_SCALE)
    return RobustFit(theta=theta[0], scale=scale, robust_weights=np.ones_like(y), relative_residuals=e)


def robust_fit(Xs: np.ndarray, y: np.ndarray, w: np.ndarray, max_iter: int = 30,
               tol: float = 1e-7, min_redundancy: int = 3) -> RobustFit:
    """Full three-stage fit (LAD start, Huber with MAD scale, bisquare) for one weight vector.

    With fewer than `min_redundancy` observations beyond the parameter count no observation can be
    told to be an outlier, so the fit falls back to relative weighted least squares.
    """
    n_params = Xs.shape[1]
    if int((w > 0).sum()) - n_params < min_redundancy:
        return weighted_ls(Xs, y, w)
    y_floor = max(float(np.median(y)) * 0.05, 1e-300)
    W = w[None, :]
    # 1. LAD by IRLS: weights 1/|r| with a floor that keeps exact-fit points finite
    theta = _solve_batched(Xs, y, W / np.maximum(y, y_floor) ** 2)
    eps = 1e-7 * float(np.median(np.abs(y))) + 1e-300
    for _ in range(max_iter):
        r = y - (theta @ Xs.T)
        new = _solve_batched(Xs, y, W / np.maximum(np.abs(r), eps))
        if np.allclose(new, theta, rtol=tol, atol=0.0):
            theta = new
            break
        theta = new
    # 2. Huber with the MAD scale of the relative residuals
    scale = MIN_RELATIVE_SCALE
    for _ in range(max_iter):
        yhat = theta @ Xs.T
        d = _denominators(yhat, y_floor)
        e = ((y - yhat) / d)[0]
        scale = _mad_scale(e, w, n_params)
        rw = _robust_weight(e / scale, "huber")
        new = _solve_batched(Xs, y, W * rw / (d * d))
        done = np.allclose(new, theta, rtol=tol, atol=0.0)
        theta = new
        if done:
            break
    # 3. bisquare at the Huber scale
    for _ in range(max_iter):
        yhat = theta @ Xs.T
        d = _denominators(yhat, y_floor)
        rw = _robust_weight(((y - yhat) / d)[0] / scale, "bisquare")
        if not np.any(rw * w > 0):
            break  # everything rejected: keep the Huber answer rather than divide by nothing
        new = _solve_batched(Xs, y, W * rw / (d * d))
        done = np.allclose(new, theta, rtol=tol, atol=0.0)
        theta = new
        if done:
            break
    yhat = (theta @ Xs.T)[0]
    e = (y - yhat) / _denominators(yhat, y_floor)
    rw = _robust_weight(e / scale, "bisquare")
    return RobustFit(theta=theta[0], scale=float(scale), robust_weights=rw, relative_residuals=e)


def weighted_r2(y: np.ndarray, yhat: np.ndarray, w: np.ndarray) -> float | None:
    """1 - SS_res/SS_tot with weights; None when y has no weighted spread."""
    sw = float(w.sum())
    if not sw > 0:
        return None
    ybar = float((w * y).sum() / sw)
    ss_tot = float((w * (y - ybar) ** 2).sum())
    if not ss_tot > 0:
        return None
    return 1.0 - float((w * (y - yhat) ** 2).sum()) / ss_tot
