"""Knee model fits: published seed points, synthetic curves with known parameters, bad input.

No fakes: every test runs the real fit on data built here.
"""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from vllm_spark_plugin.definitions import SweepPoint, capacity_at_floor
from vllm_spark_plugin.knee import VERDICTS, fit_points, fit_steps
from vllm_spark_plugin.knee.fit import curve_at

GAUGE_FIELDS = ("alpha_seconds", "beta_seconds", "gamma_seconds_per_prefill_token", "knee",
                "plateau_tokens_per_second", "r2", "median_abs_rel_residual")


def assert_clean(res):
    """No NaN/inf anywhere in the JSON, and every gauge-exported field finite or None."""
    obj = res.to_json()
    json.dumps(obj, allow_nan=False)  # raises on NaN/inf

    def walk(v):
        if isinstance(v, float):
            assert math.isfinite(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(obj)
    for name in GAUGE_FIELDS:
        v = getattr(res, name)
        assert v is None or math.isfinite(v), name
    for v in res.capacity.values():
        assert v is None or isinstance(v, int)
    assert res.verdict in VERDICTS
    # the last-resort guard (an unexpected exception inside the fit) must never be what answered
    assert not any(n.startswith("input could not be fitted") for n in res.notes), res.notes
    for key in ("alpha_seconds", "beta_seconds", "knee", "plateau_tokens_per_second", "capacity",
                "ci", "verdict", "r2", "n", "model"):
        assert key in obj


def linear_points(alpha, beta, cs, noise=0.0, rng=None, ttft=None):
    pts = []
    for c in cs:
        t = alpha + beta * c
        e1 = e2 = 0.0
        if noise:
            e1, e2 = noise * rng.standard_normal(), noise * rng.standard_normal()
        pts.append(SweepPoint(float(c), (1 / t) * (1 + e1), (c / t) * (1 + e2),
                              ttft_p50_seconds=None if ttft is None else ttft(c)))
    return pts


# ----------------------------------------------------------------------------- seed 001

MARLIN = [SweepPoint(1, 40.0, 40.715), SweepPoint(64, 10.4, 557.471)]
CUTLASS = [SweepPoint(1, 40.0, 38.643), SweepPoint(64, 10.4, 558.618)]


def two_point(c0, y0, c1, y1):
    beta = (y1 - y0) / (c1 - c0)
    alpha = y0 - beta * c0
    return alpha / beta, 1 / beta


@pytest.mark.parametrize("points", [MARLIN, CUTLASS, MARLIN + CUTLASS], ids=["marlin", "cutlass", "pooled"])
def test_seed001_plateau_and_knee_in_published_range(points):
    res = fit_points(points, floors=(20.0, 10.0), bootstrap=500)
    assert_clean(res)
    assert res.verdict == "ok"
    assert 600 <= res.plateau_tokens_per_second <= 900
    assert 12 <= res.knee <= 30
    # Combining both observations lands between the per-stream-only and aggregate-only lines.
    c = [p for p in points if p.concurrency == 1][0], [p for p in points if p.concurrency == 64][0]
    k_ps, p_ps = two_point(1, 1 / c[0].per_stream_tokens_per_second, 64, 1 / c[1].per_stream_tokens_per_second)
    k_ag, p_ag = two_point(1, 1 / c[0].aggregate_tokens_per_second, 64, 64 / c[1].aggregate_tokens_per_second)
    assert min(k_ps, k_ag) <= res.knee <= max(k_ps, k_ag)
    assert min(p_ps, p_ag) <= res.plateau_tokens_per_second <= max(p_ps, p_ag)
    # Measured at 64 streams: 10.4 tok/s per stream >= 10, so the 10 tok/s capacity reaches past 20.
    assert res.capacity["20"] < res.capacity["10"]
    assert res.capacity_measured["10"] == capacity_at_floor(points, 10.0) == 64


def test_seed001_pooled_has_bootstrap_interval_around_estimate():
    res = fit_points(MARLIN + CUTLASS, bootstrap=500, seed=7)
    lo, hi = res.ci["knee"]
    assert lo <= res.knee <= hi
    lo, hi = res.ci["plateau_tokens_per_second"]
    assert lo <= res.plateau_tokens_per_second <= hi


# ----------------------------------------------------------------------------- known curves

def test_noiseless_curve_recovered_exactly():
    alpha, beta = 0.025, 0.0012
    res = fit_points(linear_points(alpha, beta, [1, 2, 4, 8, 16, 32, 64]), floors=(20.0, 10.0))
    assert_clean(res)
    assert res.verdict == "ok" and res.model == "linear"
    assert res.alpha_seconds == pytest.approx(alpha, rel=1e-6)
    assert res.beta_seconds == pytest.approx(beta, rel=1e-6)
    assert res.knee == pytest.approx(alpha / beta, rel=1e-6)
    assert res.plateau_tokens_per_second == pytest.approx(1 / beta, rel=1e-6)
    for floor in (20.0, 10.0):
        # capacity = highest integer b with 1/(alpha + beta b) >= floor, by brute force
        best = max(b for b in range(1, 1000) if 1 / (alpha + beta * b) >= floor)
        assert res.capacity_at(floor) == best
    assert res.r2 == pytest.approx(1.0, abs=1e-9)
    per, agg = curve_at(res, [1, 10, 100])
    assert per[1] == pytest.approx(1 / (alpha + 10 * beta), rel=1e-6)
    assert agg[2] == pytest.approx(100 / (alpha + 100 * beta), rel=1e-6)
    assert res.curves["concurrency"] == [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]


def test_noisy_sweeps_recover_knee_within_ten_percent_median():
    rng = np.random.default_rng(11)
    errs = []
    for _ in range(40):
        alpha = rng.uniform(0.015, 0.04)
        knee = math.exp(rng.uniform(math.log(4), math.log(48)))
        res = fit_points(linear_points(alpha, alpha / knee, [1, 2, 5, 12, 28, 64], 0.05, rng), bootstrap=0)
        assert res.verdict in ("ok", "no knee in the measured range")
        errs.append(abs(res.knee - knee) / knee)
    assert np.median(errs) <= 0.10


def step_samples(rng, alpha, beta, gamma, n, noise=0.05, prefill_frac=0.1, outlier_frac=0.01):
    b = rng.integers(1, 65, n).astype(float)
    p = np.where(rng.random(n) < prefill_frac, rng.integers(64, 2049, n), 0).astype(float)
    t = (alpha + beta * b + gamma * p) * (1 + noise * rng.standard_normal(n))
    out = rng.random(n) < outlier_frac
    t[out] *= rng.uniform(3, 20, int(out.sum()))
    return b, p, t


def test_steps_recover_alpha_beta_gamma_despite_prefill_and_outliers():
    rng = np.random.default_rng(5)
    alpha, beta, gamma = 0.02, 0.0008, 1.25e-4
    b, p, t = step_samples(rng, alpha, beta, gamma, 3000)
    res = fit_steps(b, p, t, bootstrap=100)
    assert_clean(res)
    assert res.verdict == "ok"
    assert res.knee == pytest.approx(alpha / beta, rel=0.03)
    assert res.plateau_tokens_per_second == pytest.approx(1 / beta, rel=0.03)
    assert res.gamma_seconds_per_prefill_token == pytest.approx(gamma, rel=0.05)
    assert res.n_outliers >= 20  # about 30 spikes were injected
    lo, hi = res.ci["knee"]
    assert lo <= res.knee <= hi


def test_prefill_term_removes_bias_from_chunked_prefill_in_most_steps():
    """When most steps carry a little prefill, robust rejection cannot help: the gamma term must."""
    rng = np.random.default_rng(0)
    alpha, beta, gamma = 0.02, 0.0008, 1.25e-4
    b, p, t = step_samples(rng, alpha, beta, gamma, 3000, prefill_frac=0.6, outlier_frac=0.0)
    p = np.where(p > 0, 16 + p % 241, 0.0)  # 16..256 tokens: small chunks, not outliers
    t = (alpha + beta * b + gamma * p) * (1 + 0.05 * rng.standard_normal(b.size))
    with_p = fit_steps(b, p, t, bootstrap=0)
    without_p = fit_steps(b, None, t, bootstrap=0)
    assert with_p.knee == pytest.approx(alpha / beta, rel=0.03)
    assert with_p.gamma_seconds_per_prefill_token == pytest.approx(gamma, rel=0.05)
    assert abs(without_p.knee - alpha / beta) / (alpha / beta) > 0.15


def test_speculative_tokens_per_stream_scale_rates_not_step_times():
    rng = np.random.default_rng(2)
    b, p, t = step_samples(rng, 0.03, 0.001, 0.0, 2000, outlier_frac=0)
    one = fit_steps(b, None, t, tokens_per_stream=1.0, bootstrap=0)
    three = fit_steps(b, None, t, tokens_per_stream=3.0, bootstrap=0)
    assert three.knee == pytest.approx(one.knee, rel=1e-9)
    assert three.plateau_tokens_per_second == pytest.approx(3 * one.plateau_tokens_per_second, rel=1e-9)
    # r(b) = 3/t(b): capacity at 20 tok/s is the highest b with 3/(alpha + beta b) >= 20
    a, be = three.alpha_seconds, three.beta_seconds
    assert three.capacity["20"] == max(x for x in range(1, 5000) if 3 / (a + be * x) >= 20)


def test_weights_select_the_regime_they_emphasise():
    rng = np.random.default_rng(3)
    b1, p1, t1 = step_samples(rng, 0.02, 0.001, 0.0, 1000, outlier_frac=0)
    b2, p2, t2 = step_samples(rng, 0.05, 0.0005, 0.0, 1000, outlier_frac=0)
    b, t = np.concatenate([b1, b2]), np.concatenate([t1, t2])
    w = np.concatenate([np.full(1000, 1e-3), np.ones(1000)])
    res = fit_steps(b, None, t, weights=w, bootstrap=0)
    assert res.knee == pytest.approx(100.0, rel=0.05)


# ----------------------------------------------------------------------------- verdicts

def test_knee_beyond_measured_range_is_reported_as_extrapolation():
    alpha, beta = 0.025, 0.00005  # K = 500, measured only up to 64
    res = fit_points(linear_points(alpha, beta, [1, 2, 4, 8, 16, 32, 64]))
    assert_clean(res)
    assert res.verdict == "no knee in the measured range"
    assert res.knee == pytest.approx(500, rel=1e-3)
    assert res.extrapolated
    assert any("extrapolation" in n for n in res.notes)


def test_flat_step_time_has_no_knee_and_unknown_capacity():
    res = fit_points([SweepPoint(c, 40.0, 40.0 * c) for c in (1, 2, 4, 8, 16)])
    assert_clean(res)
    assert res.verdict == "no knee in the measured range"
    assert res.knee is None and res.plateau_tokens_per_second is None
    assert res.capacity["20"] is None  # unbounded: never falls to 20 tok/s


def usl_points(lam, sigma, kappa, cs, noise=0.0, rng=None):
    pts = []
    for c in cs:
        x = lam * c / (1 + sigma * (c - 1) + kappa * c * (c - 1))
        e1 = e2 = 0.0
        if noise:
            e1, e2 = noise * rng.standard_normal(), noise * rng.standard_normal()
        pts.append(SweepPoint(float(c), x / c * (1 + e1), x * (1 + e2)))
    return pts


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_retrograde_aggregate_gives_usl_verdict_and_peak(noise):
    lam, sigma, kappa = 40.0, 0.05, 0.002
    res = fit_points(usl_points(lam, sigma, kappa, [1, 2, 4, 8, 16, 32, 64], noise, np.random.default_rng(4)))
    assert_clean(res)
    assert res.verdict == "retrograde" and res.model == "usl"
    n_star = math.sqrt((1 - sigma) / kappa)
    assert res.usl["peak_concurrency"] == pytest.approx(n_star, rel=0.1)
    assert res.knee == res.usl["peak_concurrency"]
    x_star = lam * n_star / (1 + sigma * (n_star - 1) + kappa * n_star * (n_star - 1))
    assert res.plateau_tokens_per_second == pytest.approx(x_star, rel=0.05)
    assert any("Universal Scalability Law" in n for n in res.notes)
    # capacity under the USL step time: highest N with X(N)/N >= 20
    best = max(n for n in range(1, 500) if lam / (1 + sigma * (n - 1) + kappa * n * (n - 1)) >= 20)
    assert abs(res.capacity["20"] - best) <= (0 if noise == 0 else 2)


def test_retrograde_steps_detected():
    rng = np.random.default_rng(8)
    b = rng.integers(1, 65, 3000).astype(float)
    x = 40 * b / (1 + 0.05 * (b - 1) + 0.002 * b * (b - 1))
    t = b / x * (1 + 0.05 * rng.standard_normal(b.size))
    res = fit_steps(b, None, t, bootstrap=0)
    assert res.verdict == "retrograde"
    assert res.knee == pytest.approx(math.sqrt(0.95 / 0.002), rel=0.05)


def test_noisy_linear_curves_are_not_called_retrograde():
    rng = np.random.default_rng(21)
    verdicts = set()
    for _ in range(60):
        alpha = rng.uniform(0.015, 0.04)
        knee = math.exp(rng.uniform(math.log(2), math.log(48)))
        verdicts.add(fit_points(linear_points(alpha, alpha / knee, [1, 2, 5, 12, 28, 64], 0.05, rng),
                                bootstrap=0).verdict)
    assert "retrograde" not in verdicts


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("points, verdict", [
    ([], "too few points"),
    ([SweepPoint(1, 40.0, 40.0)], "too few points"),
    ([SweepPoint(NAN, NAN, NAN), SweepPoint(INF, INF, INF)], "invalid input"),
    ([SweepPoint(4, -3.0, 0.0), SweepPoint(8, 0.0, -1.0)], "invalid input"),
    ([SweepPoint(0, 30.0, 0.0), SweepPoint(-2, 30.0, 60.0)], "invalid input"),
    ([SweepPoint(8, 30.0, 240.0), SweepPoint(8, 31.0, 250.0), SweepPoint(8, 29.0, 232.0)], "no spread"),
    (None, "invalid input"),
    ([1, 2, 3], "invalid input"),
    ("garbage", "invalid input"),
], ids=["empty", "single", "nan-inf", "non-positive-rates", "non-positive-concurrency",
        "constant-concurrency", "none", "not-points", "string"])
def test_bad_sweep_input_gives_verdict_not_exception(points, verdict):
    res = fit_points(points, floors=(20.0, 10.0))
    assert res.verdict == verdict
    assert res.knee is None and res.alpha_seconds is None
    assert_clean(res)


def test_huge_outlier_point_is_rejected():
    alpha, beta = 0.025, 0.0012
    pts = linear_points(alpha, beta, [1, 2, 4, 8, 16, 32, 64])
    pts[3] = SweepPoint(8, pts[3].per_stream_tokens_per_second / 50, pts[3].aggregate_tokens_per_second * 30)
    res = fit_points(pts)
    assert_clean(res)
    assert res.verdict == "ok"
    assert res.knee == pytest.approx(alpha / beta, rel=0.02)
    assert res.n_outliers == 2


def test_some_invalid_points_are_dropped_and_counted():
    pts = linear_points(0.025, 0.0012, [1, 2, 4, 8, 16, 32]) + [SweepPoint(NAN, 1.0, 1.0), SweepPoint(64, None, None)]
    res = fit_points(pts)
    assert res.verdict == "ok" and res.n_dropped == 2 and res.n_input == 8
    assert res.knee == pytest.approx(0.025 / 0.0012, rel=1e-6)


@pytest.mark.parametrize("args, verdict", [
    (([NAN] * 20, None, [0.1] * 20), "invalid input"),
    (([4] * 20, None, [INF] * 20), "invalid input"),
    (([4] * 20, None, [0.0] * 20), "invalid input"),
    (([4] * 20, None, [-0.1] * 20), "invalid input"),
    (([0] * 20, None, [0.1] * 20), "invalid input"),
    (([8] * 50, None, list(0.03 + 0.001 * np.sin(np.arange(50)))), "no spread"),
    (([3], None, [0.05]), "too few points"),
    (([], None, []), "too few points"),
    (([1, 2, 3], None, [0.1, 0.2]), "invalid input"),
    ((["a", "b"], None, [0.1, 0.2]), "invalid input"),
    ((None, None, None), "invalid input"),
    (([[1, 2], [3, 4]], None, [[1, 2], [3, 4]]), "invalid input"),
], ids=["nan-batch", "inf-time", "zero-time", "negative-time", "zero-batch", "constant-batch",
        "single", "empty", "length-mismatch", "strings", "none", "2d"])
def test_bad_step_input_gives_verdict_not_exception(args, verdict):
    res = fit_steps(*args, floors=(20.0,))
    assert res.verdict == verdict
    assert res.knee is None
    assert_clean(res)


def test_steps_with_junk_mixed_in_still_fit():
    rng = np.random.default_rng(9)
    b, p, t = step_samples(rng, 0.02, 0.001, 0.0, 1000, outlier_frac=0.0)
    b[:50] = NAN
    t[50:100] = -1.0
    t[100:120] *= 100.0  # huge outliers
    res = fit_steps(b, p, t, bootstrap=0)
    assert res.verdict == "ok" and res.n_dropped == 100
    assert res.knee == pytest.approx(20.0, rel=0.03)


def test_bad_floors_are_ignored_with_a_note():
    res = fit_points(linear_points(0.025, 0.0012, [1, 4, 16, 64]), floors=(20.0, NAN, -5, "x"))
    assert list(res.capacity) == ["20"]
    assert sum("ignored floor" in n for n in res.notes) == 3
    assert_clean(res)


# ----------------------------------------------------------------------------- capacity with TTFT

def test_ttft_bound_limits_capacity_and_matches_seed_definition_on_points():
    alpha, beta = 0.025, 0.0012
    pts = linear_points(alpha, beta, [1, 2, 4, 8, 16, 32, 64], ttft=lambda c: 0.1 * c)
    res = fit_points(pts, floors=(20.0, 10.0), ttft_slo_seconds=2.0)
    # TTFT p50 = 0.1 c crosses 2 s at c = 20 (between the measured 16 and 32, linear interpolation)
    assert res.capacity_ttft_bound == 20
    rate_cap_10 = math.floor((1 / 10 - alpha) / beta)
    assert rate_cap_10 > 20
    assert res.capacity["10"] == 20
    assert res.capacity["20"] == min(math.floor((1 / 20 - alpha) / beta + 1e-9), 20)
    for f in (20.0, 10.0):
        assert res.capacity_measured[str(int(f))] == capacity_at_floor(pts, f, 2.0)
    no_ttft = fit_points(linear_points(alpha, beta, [1, 4, 16, 64]), ttft_slo_seconds=2.0)
    assert no_ttft.capacity_ttft_bound is None
    assert any("no TTFT data" in n for n in no_ttft.notes)


def test_bootstrap_is_reproducible_with_seed_and_changes_without():
    rng = np.random.default_rng(1)
    pts = linear_points(0.025, 0.0012, [1, 2, 4, 8, 16, 32, 64], 0.05, rng)
    a = fit_points(pts, bootstrap=300, seed=3)
    b = fit_points(pts, bootstrap=300, seed=3)
    c = fit_points(pts, bootstrap=300, seed=4)
    assert a.ci == b.ci
    assert a.ci["knee"] != c.ci["knee"]
    for key in ("alpha_seconds", "beta_seconds", "knee", "plateau_tokens_per_second"):
        lo, hi = a.ci[key]
        assert lo <= hi
    lo, hi = a.ci["capacity"]["20"]
    assert lo <= a.capacity["20"] <= hi
