"""`--levels auto` against fixed ladders on servers with a known step model (not a test: prints a
table, writes JSON).

Each case is a fake OpenAI server on simulated time (tests/support/simulated.py) whose decode step
with b streams takes exactly alpha + beta*b, so the true capacity at the floor (the highest b with
1/(alpha + beta*b) >= floor) and the knee alpha/beta are known.  Levels are measured with the real
bench client; a point costs a warm-up wave and 3 trials of simulated time, what the sweep would take
on that server.  Noise: every trial's rates times exp(N(0, sigma)), the point the median of 3.

Three ways to find the capacity, side by side in one run:

* auto: the adaptive search of `vllm-spark bench --levels auto` (bench/adaptive.py), unlimited time;
* ladder: levels 1, 2, 4, ... up to the first that misses the floor (the shortest doubling ladder that
  brackets the capacity, chosen in hindsight); it knows the capacity only to its last bracket;
* ladder + refine: that ladder, then every level inside its bracket (a second sweep by hand): the
  fixed ladders' way to know the boundary to one stream.

Per case and noise level: the median over seeds of points, simulated seconds and |error| (found minus
true capacity, streams), and the ratios auto / ladder and auto / (ladder + refine).  Goal: auto within
one stream with at most half the points of ladder + refine.

Run:  .venv-fast/bin/python benchmarks/levels_auto.py [--seeds 5] [--noise 0,0.02] [--output-tokens 32]
Writes benchmarks/results/levels_auto.json.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the simulated bed

from support.simulated import SimulatedBed, noisy  # noqa: E402

from vllm_spark_plugin.bench.adaptive import Budget, SearchConfig, bracket, floor_boundary, run_search  # noqa: E402

# name, alpha (s), beta (s), floor (tok/s)
CASES = [
    ("test bed: tiny MoE, 2 CPU cores", 0.004, 0.00047, 50.0),       # knee 8.5, capacity 34
    ("Spark: Qwen3.6-35B-A3B NVFP4 (seed 001)", 0.0231, 0.00143, 20.0),  # knee 16, capacity 18
    ("knee 10, floor 23 tok/s", 0.010, 0.001, 23.0),                 # capacity 33
    ("knee 100, floor 21 tok/s", 0.010, 0.0001, 21.0),               # capacity 376
]


def ladder(measure, floor: float) -> list:
    """Doubling levels up to the first that misses the floor."""
    obs, c = [], 1
    while True:
        o = measure(c)
        obs.append(o)
        if o.per_stream_tps is not None and o.per_stream_tps < floor:
            return obs
        c *= 2


def refine(measure, obs: list, floor: float) -> list:
    b = bracket(floor_boundary(floor), obs)
    return obs + [measure(c) for c in range(b.lower + 1, b.upper)]


def found(obs: list, floor: float) -> int:
    return bracket(floor_boundary(floor), obs).lower


def run_case(name, alpha, beta, floor, sigma, seeds, tokens) -> dict:
    bed = SimulatedBed(alpha, beta, output_tokens=tokens)
    cache: dict = {}

    def exact(c: int):
        if c not in cache:
            cache[c] = bed.measure(c)
        return cache[c]

    truth = bed.true_capacity(floor)
    runs = []
    try:
        for seed in (range(seeds) if sigma > 0 else [0]):
            row = {}
            for method in ("auto", "ladder", "ladder + refine"):
                measure = noisy(exact, sigma, seed) if sigma > 0 else exact
                if method == "auto":
                    cfg = SearchConfig.make([floor], budget=Budget(max_points=40, max_seconds=None))
                    obs = run_search(cfg, measure).observations
                else:
                    obs = ladder(measure, floor)
                    if method == "ladder + refine":
                        obs = refine(measure, obs, floor)
                b = bracket(floor_boundary(floor), obs)
                row[method] = {"points": len(obs), "seconds": sum(o.seconds for o in obs),
                               "found": b.lower, "bracket": [b.lower, b.upper],
                               "error": abs(b.lower - truth), "levels": [o.concurrency for o in obs]}
            runs.append(row)
    finally:
        bed.close()

    def med(method, key):
        return statistics.median(r[method][key] for r in runs)

    summary = {m: {k: med(m, k) for k in ("points", "seconds", "error")} for m in ("auto", "ladder", "ladder + refine")}
    summary["ratio_points_vs_ladder"] = statistics.median(r["auto"]["points"] / r["ladder"]["points"] for r in runs)
    summary["ratio_points_vs_refine"] = statistics.median(r["auto"]["points"] / r["ladder + refine"]["points"] for r in runs)
    summary["ratio_seconds_vs_ladder"] = statistics.median(r["auto"]["seconds"] / r["ladder"]["seconds"] for r in runs)
    summary["ratio_seconds_vs_refine"] = statistics.median(r["auto"]["seconds"] / r["ladder + refine"]["seconds"] for r in runs)
    summary["auto_within_one_stream"] = sum(r["auto"]["error"] <= 1 for r in runs) / len(runs)
    summary["ladder_bracket_width"] = statistics.median(r["ladder"]["bracket"][1] - r["ladder"]["bracket"][0] for r in runs)
    summary["goal_met"] = summary["auto"]["error"] <= 1 and summary["ratio_points_vs_refine"] <= 0.5
    return {"case": name, "alpha_seconds": alpha, "beta_seconds": beta, "floor": floor, "knee": alpha / beta,
            "true_capacity": truth, "noise_sigma": sigma, "runs": len(runs), "summary": summary, "detail": runs}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, default=5, help="noisy runs per case (median over them)")
    p.add_argument("--noise", default="0,0.02", help="trial noise sigmas, comma-separated")
    p.add_argument("--output-tokens", type=int, default=32)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "levels_auto.json")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    results = []
    header = (f"{'case':42} {'noise':>5} {'true':>5} | {'auto pts':>8} {'s':>7} {'err':>4} | {'ladder pts':>10} "
              f"{'s':>7} {'width':>5} | {'+refine pts':>11} {'s':>8} | {'pts/ladder':>10} {'pts/refine':>10} "
              f"{'s/refine':>8} {'<=1':>4} goal")
    print(header)
    for name, alpha, beta, floor in CASES:
        for sigma in (float(x) for x in args.noise.split(",")):
            r = run_case(name, alpha, beta, floor, sigma, args.seeds, args.output_tokens)
            results.append(r)
            s = r["summary"]
            a, lad, ref = s["auto"], s["ladder"], s["ladder + refine"]
            print(f"{name:42} {sigma:5.2f} {r['true_capacity']:5d} | {a['points']:8.0f} {a['seconds']:7.1f} "
                  f"{a['error']:4.0f} | {lad['points']:10.0f} {lad['seconds']:7.1f} {s['ladder_bracket_width']:5.0f} | "
                  f"{ref['points']:11.0f} {ref['seconds']:8.1f} | {s['ratio_points_vs_ladder']:10.2f} "
                  f"{s['ratio_points_vs_refine']:10.2f} {s['ratio_seconds_vs_refine']:8.2f} "
                  f"{s['auto_within_one_stream']:4.0%} {'met' if s['goal_met'] else 'MISSED'}", flush=True)
    doc = {"benchmark": "levels_auto", "python": platform.python_version(), "machine": platform.machine(),
           "output_tokens": args.output_tokens, "waves_per_point": 4, "seeds": args.seeds,
           "wall_seconds": round(time.monotonic() - t0, 1), "cases": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out} ({doc['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
