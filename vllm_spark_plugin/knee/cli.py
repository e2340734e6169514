"""`vllm-spark knee FILE [FILE...]`: fit the step-time model to sweep results and print the knee.

Input: this project's sweep CSV, `vllm bench serve --save-result` JSON (files or a directory),
a spark-bench long CSV, or an AIPerf or GuideLLM export (see loaders.py).  One fit per curve (label).
Exit status: 0 when every file was read (whatever the verdicts), 2 when input is unreadable.
"""
from __future__ import annotations

import argparse
import json
import math
import sys

from .fit import curve_at, fit_points
from .loaders import KneeInputError, load_points
from .result import KneeResult


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE",
                        help="sweep CSV, vllm bench serve JSON (file or directory), spark-bench CSV, "
                             "or an AIPerf artifact folder / GuideLLM benchmarks.json")
    parser.add_argument("--floor", type=float, action="append", metavar="TOK_S",
                        help="per-stream decode-rate floor in tok/s for capacity (repeatable; "
                             "default: SPARK_PLUGIN_FLOORS, else 20)")
    parser.add_argument("--ttft-slo", type=float, metavar="S",
                        help="also require the median TTFT (interpolated between measured points) "
                             "to stay within S seconds")
    parser.add_argument("--json", action="store_true",
                        help="print JSON: one object for one curve, {label: object} for several")
    parser.add_argument("--plot", metavar="OUT.png", help="write a PNG of the measured points and fitted curves")
    parser.add_argument("--label", action="append", metavar="LABEL", help="only these curves (repeatable)")
    parser.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                        help="bootstrap resamples for the confidence intervals (default 1000, 0 = off)")
    parser.add_argument("--seed", type=int, default=0, help="bootstrap random seed (default 0)")


def _default_floors() -> list[float]:
    try:
        from ..settings import load
        return list(load().floors)
    except Exception:  # settings problems are reported by settings itself; fall back to seed 003
        return [20.0]


def _fmt(v, spec: str, unit: str = "", scale: float = 1.0) -> str:
    if v is None:
        return "unknown"
    return f"{v * scale:{spec}}{unit}"


def _ci(iv, spec: str, scale: float = 1.0) -> str:
    if not iv or iv[0] is None and iv[1] is None:
        return ""
    lo = "?" if iv[0] is None else f"{iv[0] * scale:{spec}}"
    hi = "unbounded" if iv[1] is None else f"{iv[1] * scale:{spec}}"
    return f"  [{lo} .. {hi}]"


def format_table(label: str, points, res: KneeResult) -> str:
    cs = sorted({p.concurrency for p in points})
    lvl = f"concurrency {cs[0]:g}-{cs[-1]:g}" if cs else "no concurrency"
    ci = res.ci or {}
    level = ci.get("level")
    rows = [("verdict", res.verdict + (" (USL)" if res.model == "usl" else "")),
            ("alpha (fixed cost/step)", _fmt(res.alpha_seconds, ".2f", " ms", 1e3) + _ci(ci.get("alpha_seconds"), ".2f", 1e3)),
            ("beta (cost per stream)", _fmt(res.beta_seconds, ".3f", " ms", 1e3) + _ci(ci.get("beta_seconds"), ".3f", 1e3)),
            ("knee K = alpha/beta" if res.model == "linear" else "peak N* (USL)",
             _fmt(res.knee, ".1f", " streams") + _ci(ci.get("knee"), ".1f")),
            ("plateau 1/beta" if res.model == "linear" else "peak throughput",
             _fmt(res.plateau_tokens_per_second, ".0f", " tok/s") + _ci(ci.get("plateau_tokens_per_second"), ".0f"))]
    for key, cap in res.capacity.items():
        measured = res.capacity_measured.get(key)
        extra = f"  (highest measured point meeting it: {measured:g})" if measured is not None else \
            "  (no measured point meets it)" if res.capacity_measured else ""
        cap_ci = (ci.get("capacity") or {}).get(key)
        cap_s = "unknown" if cap is None else f"{cap} streams"
        if cap_ci and cap_ci[0] is not None and cap_ci[1] is not None:
            cap_s += f"  [{cap_ci[0]} .. {cap_ci[1]}]"
        slo = f", TTFT p50 <= {res.ttft_slo_seconds:g} s" if res.ttft_slo_seconds is not None else ""
        rows.append((f"capacity at {key} tok/s{slo}", cap_s + extra))
    fit = f"R^2 {_fmt(res.r2, '.4f')}, median |relative residual| {_fmt(res.median_abs_rel_residual, '.1%')}, " \
          f"n={res.n} observations, {res.n_outliers} outlier(s)"
    rows.append(("fit", fit))
    if level and ci.get("resamples"):
        rows.append(("intervals", f"{level:.0%} percentile bootstrap, {ci['resamples']} resamples"))
    elif ci.get("why_missing"):
        rows.append(("intervals", f"none: {ci['why_missing']}"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{label}: {len(points)} point(s), {lvl}"]
    lines += [f"  {k:<{width}}  {v}" for k, v in rows]
    lines += [f"  note: {n}" for n in res.notes]
    return "\n".join(lines)


def _plot(path: str, fits: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_a, ax_r) = plt.subplots(1, 2, figsize=(12, 4.8))
    for i, (label, (points, res)) in enumerate(fits.items()):
        color = f"C{i % 10}"
        cs = [p.concurrency for p in points]
        top = max(cs + ([res.knee * 1.5] if res.knee else []))
        grid = [1 + (top - 1) * j / 199 for j in range(200)]
        per, agg = curve_at(res, grid)
        ax_a.plot(cs, [p.aggregate_tokens_per_second for p in points], "o", color=color, label=f"{label} measured")
        ax_r.plot(cs, [p.per_stream_tokens_per_second for p in points], "o", color=color)
        if any(v is not None for v in agg):
            ax_a.plot(grid, [math.nan if v is None else v for v in agg], "-", color=color,
                      label=f"{label} fit ({res.verdict})")
            ax_r.plot(grid, [math.nan if v is None else v for v in per], "-", color=color)
        if res.knee:
            ax_a.axvline(res.knee, color=color, ls=":", lw=1)
        if res.plateau_tokens_per_second and res.model == "linear":
            ax_a.axhline(res.plateau_tokens_per_second, color=color, ls="--", lw=0.8)
    for key in next(iter(fits.values()))[1].capacity:
        ax_r.axhline(float(key), color="grey", ls="--", lw=0.8)
        ax_r.annotate(f"floor {key} tok/s", (1, float(key)), color="grey", fontsize=8, va="bottom")
    ax_a.set(xlabel="concurrent streams", ylabel="aggregate tok/s", title="aggregate throughput")
    ax_r.set(xlabel="concurrent streams", ylabel="per-stream tok/s", title="per-stream decode rate")
    ax_a.legend(fontsize=7)
    for ax in (ax_a, ax_r):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    prog = "vllm-spark knee"
    try:
        curves = load_points(args.files)
    except KneeInputError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    if args.label:
        missing = [lab for lab in args.label if lab not in curves]
        if missing:
            print(f"{prog}: no curve named {', '.join(map(repr, missing))}; found: "
                  f"{', '.join(map(repr, curves))}", file=sys.stderr)
            return 2
        curves = {k: v for k, v in curves.items() if k in args.label}
    floors = args.floor or _default_floors()
    bad = [f for f in floors if not (math.isfinite(f) and f > 0)]
    if bad:
        print(f"{prog}: --floor must be a positive number of tok/s, got {bad[0]:g}", file=sys.stderr)
        return 2
    if args.ttft_slo is not None and not (math.isfinite(args.ttft_slo) and args.ttft_slo > 0):
        print(f"{prog}: --ttft-slo must be a positive number of seconds, got {args.ttft_slo:g}", file=sys.stderr)
        return 2
    fits = {label: (pts, fit_points(pts, floors=floors, ttft_slo_seconds=args.ttft_slo,
                                     bootstrap=args.bootstrap, seed=args.seed))
            for label, pts in curves.items()}
    if args.json:
        objs = {label: res.to_json() for label, (_, res) in fits.items()}
        if len(objs) == 1:
            label, obj = next(iter(objs.items()))
            out = {"label": label, **obj}
        else:
            out = objs
        print(json.dumps(out, indent=2, allow_nan=False))
    else:
        print("\n\n".join(format_table(label, pts, res) for label, (pts, res) in fits.items()))
    if args.plot:
        try:
            _plot(args.plot, fits)
        except OSError as exc:
            print(f"{prog}: cannot write plot {args.plot}: {exc.strerror or exc}", file=sys.stderr)
            return 2
        if not args.json:
            print(f"\nplot written to {args.plot}")
    return 0
