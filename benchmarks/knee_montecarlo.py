"""Monte Carlo accuracy and cost of the knee model (not a test: prints a table, writes JSON).

Accuracy: synthetic curves with known alpha and beta (knee K = alpha/beta drawn log-uniformly in
[4, 48] streams, alpha in [15, 40] ms):

* sweep: 6 geometric concurrency points 1..64 (1, 2, 5, 12, 28, 64), per-stream and aggregate
  rates each with independent 5% multiplicative noise -> `fit_points`; the same aggregate curve
  through Kneedle (`kneed.KneeLocator`, concave/increasing) side by side;
* steps: 2,048 per-step samples, batch uniform in 1..64, 5% multiplicative noise, 10% of steps
  with 64-2048 prefill tokens mixed in (gamma = 0.125 ms/token), 1% outliers (step x 3..20)
  -> `fit_steps`; an ordinary least-squares fit of t = alpha + beta*b (no prefill term, not
  robust) on the same samples for contrast.

Cost: `OnlineKneeEstimator.observe` (median ns per call over many calls, loop overhead measured
separately) and `estimate(force=True)` on a full 4,096-step window.

Run:  .venv/bin/python benchmarks/knee_montecarlo.py [--trials 400] [--step-trials 100] [--seed 0]
Writes benchmarks/results/knee_montecarlo.json.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import time
import warnings

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from vllm_spark_plugin.definitions import SweepPoint  # noqa: E402
from vllm_spark_plugin.knee import OnlineKneeEstimator, fit_points, fit_steps  # noqa: E402

SWEEP_CONCURRENCY = [1, 2, 5, 12, 28, 64]  # round(64 ** (i / 5)), i = 0..5
NOISE = 0.05
GAMMA = 1.25e-4


def draw_curve(rng: np.random.Generator) -> tuple[float, float]:
    alpha = rng.uniform(0.015, 0.040)
    knee = math.exp(rng.uniform(math.log(4), math.log(48)))
    return alpha, alpha / knee


def sweep_trial(rng, alpha, beta):
    pts = []
    for c in SWEEP_CONCURRENCY:
        t = alpha + beta * c
        r = (1.0 / t) * (1 + NOISE * rng.standard_normal())
        a = (c / t) * (1 + NOISE * rng.standard_normal())
        pts.append(SweepPoint(float(c), r, a))
    return pts


def kneedle(pts):
    from kneed import KneeLocator
    x = [p.concurrency for p in pts]
    y = [p.aggregate_tokens_per_second for p in pts]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        k = KneeLocator(x, y, curve="concave", direction="increasing").knee
    return None if k is None else float(k)


def steps_trial(rng, alpha, beta, n=2048):
    b = rng.integers(1, 65, n).astype(float)
    p = np.where(rng.random(n) < 0.10, rng.integers(64, 2049, n), 0).astype(float)
    t = (alpha + beta * b + GAMMA * p) * (1 + NOISE * rng.standard_normal(n))
    out = rng.random(n) < 0.01
    t[out] *= rng.uniform(3, 20, int(out.sum()))
    return b, p, t


def rel(est, true):
    return None if est is None else abs(est - true) / true


def summarise(errors):
    vals = [e for e in errors if e is not None]
    if not vals:
        return {"median": None, "p90": None, "failures": len(errors)}
    return {"median": float(np.median(vals)), "p90": float(np.quantile(vals, 0.9)),
            "failures": len(errors) - len(vals)}


def time_observe(calls: int = 200_000, batch: int = 1000) -> dict:
    est = OnlineKneeEstimator(window=4096)
    rng = np.random.default_rng(0)
    args = [(int(b), 0, float(t)) for b, t in zip(rng.integers(1, 65, batch), rng.uniform(0.02, 0.1, batch))]
    obs = est.observe

    def noop(b, p, t, k=1.0):
        return None

    per_call, overhead = [], []
    for _ in range(calls // batch):
        t0 = time.perf_counter_ns()
        for a in args:
            obs(*a)
        per_call.append((time.perf_counter_ns() - t0) / batch)
        t0 = time.perf_counter_ns()
        for a in args:
            noop(*a)
        overhead.append((time.perf_counter_ns() - t0) / batch)
    med, base = statistics.median(per_call), statistics.median(overhead)
    return {"calls": calls, "median_ns_per_call": med, "loop_and_call_overhead_ns": base,
            "median_ns_net": med - base, "p90_ns_per_call": float(np.quantile(per_call, 0.9)),
            "window_bytes": 5 * 8 * est.window}


def time_refit(repeats: int = 15, bootstrap: int = 0) -> dict:
    now = [0.0]
    est = OnlineKneeEstimator(window=4096, clock=lambda: now[0], bootstrap=bootstrap)
    rng = np.random.default_rng(1)
    b, p, t = steps_trial(rng, 0.025, 0.0012, n=4096)
    for i in range(4096):
        now[0] = i * 0.05
        est.observe(int(b[i]), int(p[i]), float(t[i]))
    times = []
    res = None
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = est.estimate(force=True)
        times.append(time.perf_counter() - t0)
    return {"window": 4096, "bootstrap": bootstrap, "median_ms": 1e3 * statistics.median(times),
            "min_ms": 1e3 * min(times), "knee": res.knee, "verdict": res.verdict}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=400, help="sweep trials (default 400)")
    ap.add_argument("--step-trials", type=int, default=100, help="per-step trials (default 100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "knee_montecarlo.json"))
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)

    k_fit, k_kneedle, p_fit, verdicts = [], [], [], {}
    for _ in range(args.trials):
        alpha, beta = draw_curve(rng)
        pts = sweep_trial(rng, alpha, beta)
        res = fit_points(pts, bootstrap=0)
        verdicts[res.verdict] = verdicts.get(res.verdict, 0) + 1
        k_fit.append(rel(res.knee, alpha / beta))
        p_fit.append(rel(res.plateau_tokens_per_second, 1.0 / beta))
        k_kneedle.append(rel(kneedle(pts), alpha / beta))

    s_fit, s_ols, s_pl, s_gamma, s_verdicts = [], [], [], [], {}
    for _ in range(args.step_trials):
        alpha, beta = draw_curve(rng)
        b, p, t = steps_trial(rng, alpha, beta)
        res = fit_steps(b, p, t, bootstrap=0)
        s_verdicts[res.verdict] = s_verdicts.get(res.verdict, 0) + 1
        s_fit.append(rel(res.knee, alpha / beta))
        s_pl.append(rel(res.plateau_tokens_per_second, 1.0 / beta))
        s_gamma.append(rel(res.gamma_seconds_per_prefill_token, GAMMA))
        coef = np.linalg.lstsq(np.column_stack([np.ones_like(b), b]), t, rcond=None)[0]
        s_ols.append(rel(coef[0] / coef[1] if coef[1] > 0 else None, alpha / beta))

    out = {
        "setup": {"sweep_concurrency": SWEEP_CONCURRENCY, "noise": NOISE,
                  "knee_range": [4, 48], "alpha_range_s": [0.015, 0.040],
                  "sweep_trials": args.trials, "step_trials": args.step_trials,
                  "step_samples": 2048, "prefill_fraction": 0.10, "gamma_s_per_token": GAMMA,
                  "outlier_fraction": 0.01, "seed": args.seed,
                  "python": platform.python_version(), "numpy": np.__version__,
                  "machine": platform.machine(), "cpus": os.cpu_count(),
                  "load_average_1m_at_start": os.getloadavg()[0]},
        "sweep": {"knee_rel_error_fit": summarise(k_fit), "knee_rel_error_kneedle": summarise(k_kneedle),
                  "plateau_rel_error_fit": summarise(p_fit), "verdicts": verdicts},
        "steps": {"knee_rel_error_fit": summarise(s_fit), "knee_rel_error_ols_no_prefill_term": summarise(s_ols),
                  "plateau_rel_error_fit": summarise(s_pl), "gamma_rel_error_fit": summarise(s_gamma),
                  "verdicts": s_verdicts},
        "cost": {"observe": time_observe(), "refit_4096": time_refit(),
                 "refit_4096_bootstrap_50": time_refit(repeats=5, bootstrap=50)},
    }

    def pct(d):
        return "n/a" if d["median"] is None else f"{100 * d['median']:.1f}% (p90 {100 * d['p90']:.1f}%)"

    rows = [
        ("sweep, 6 points: K, robust fit", pct(out["sweep"]["knee_rel_error_fit"]), "<= 10%"),
        ("sweep, 6 points: K, Kneedle", pct(out["sweep"]["knee_rel_error_kneedle"])
         + f", no knee {out['sweep']['knee_rel_error_kneedle']['failures']}x", ""),
        ("sweep, 6 points: plateau, robust fit", pct(out["sweep"]["plateau_rel_error_fit"]), ""),
        ("steps, 2048 samples: K, robust fit", pct(out["steps"]["knee_rel_error_fit"]), "<= 3%"),
        ("steps, 2048 samples: K, OLS without prefill", pct(out["steps"]["knee_rel_error_ols_no_prefill_term"]), ""),
        ("steps, 2048 samples: plateau, robust fit", pct(out["steps"]["plateau_rel_error_fit"]), ""),
        ("steps, 2048 samples: gamma, robust fit", pct(out["steps"]["gamma_rel_error_fit"]), ""),
    ]
    print(f"{'median relative error (p90)':48s} {'measured':34s} target")
    for name, val, target in rows:
        print(f"{name:48s} {val:34s} {target}")
    print(f"sweep verdicts: {verdicts}; step verdicts: {s_verdicts}")
    o, r, rb = out["cost"]["observe"], out["cost"]["refit_4096"], out["cost"]["refit_4096_bootstrap_50"]
    print(f"observe(): median {o['median_ns_per_call']:.0f} ns/call "
          f"(loop+call overhead {o['loop_and_call_overhead_ns']:.0f} ns, net {o['median_ns_net']:.0f} ns), "
          f"ring {o['window_bytes']} bytes")
    print(f"estimate(force=True) on 4096 steps: median {r['median_ms']:.1f} ms "
          f"(with 50 bootstrap resamples {rb['median_ms']:.1f} ms)")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(out, fh, indent=2, allow_nan=False)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
