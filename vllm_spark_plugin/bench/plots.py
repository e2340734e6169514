"""PNG plots (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)
from matplotlib.ticker import FixedFormatter, FixedLocator, FuncFormatter, LogLocator, NullFormatter  # noqa: E402

from ..knee.result import floor_key  # noqa: E402
from .analysis import CurveAnalysis  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _curve_name(a: CurveAnalysis, many_labels: bool) -> str:
    return f"{a.key.label} / {a.key.workload}" if many_labels else a.key.workload


def _log2_axis(ax, levels: list[int]) -> None:
    """Log-2 concurrency axis, labelled at powers of two only: the levels an adaptive search measures
    sit close together (40, 41, ...), and labels at each would overlap."""
    ax.set_xscale("log", base=2)
    if levels:
        lo, hi = min(levels) / 1.25, max(levels) * 1.25
        ax.set_xlim(lo, hi)  # also when no point has data
        ticks = [2 ** k for k in range(0, 16) if lo <= 2 ** k <= hi] or sorted(set(levels))[:1]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_major_formatter(FixedFormatter([str(t) for t in ticks]))
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("concurrency (streams)")
    ax.grid(True, which="major", alpha=0.3)


def _fit_line(a: CurveAnalysis, field: str):
    curves = (a.knee or {}).get("curves") or {}
    xs, ys = curves.get("concurrency") or [], curves.get(field) or []
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _fit_label(a: CurveAnalysis, prefix: str) -> str:
    k = a.knee or {}
    if k.get("alpha_seconds") is None or k.get("beta_seconds") is None:
        return f"{prefix}fit"
    text = f"{prefix}fit t(b) = {k['alpha_seconds'] * 1e3:.3g} ms + {k['beta_seconds'] * 1e3:.3g} ms*b"
    return text if k.get("verdict") == "ok" else text + f" ({k.get('verdict')})"


def _capacity_points(a: CurveAnalysis, floors: tuple[float, ...]) -> list[tuple[float, int, float | None, float | None]]:
    """(floor, measured capacity, its per-stream rate, its aggregate) for each floor with a capacity."""
    by_level = {r.concurrency: r.metrics for r in a.rows}
    out = []
    for f in floors:
        n = a.capacity.get(floor_key(f))
        if n:
            m = by_level.get(n)
            out.append((f, n, m.per_stream_median_tps if m else None, m.aggregate_tps if m else None))
    return out


def plot_rates(curves: list[CurveAnalysis], path: Path, which: str, floors: tuple[float, ...] = (),
               reference: dict | None = None) -> Path:
    """`which` = 'aggregate' or 'per_stream': the measured points, the fitted model, the knee with its
    interval, and the capacity at each floor (on the per-stream plot also the floor itself).
    `reference` (label, concurrency, per_stream, aggregate): a predicted curve, drawn grey.

    The aggregate is drawn on log-log axes: there the model's two asymptotes (the linear rise b/alpha
    and the plateau 1/beta) are straight lines meeting at the knee, and a fit with no knee is a
    straight line rather than a curve bending upward."""
    fig, ax = plt.subplots(figsize=(7.5, 5.2), dpi=110)
    many_labels = len({a.key.label for a in curves}) > 1
    levels = sorted({r.concurrency for a in curves for r in a.rows})
    aggregate = which == "aggregate"
    field = "aggregate_tokens_per_second" if aggregate else "per_stream_tokens_per_second"
    floors = tuple(floors or (curves[0].floors if curves else ()))
    ys_all: list[float] = []
    for i, a in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        prefix = f"{_curve_name(a, many_labels)}: " if len(curves) > 1 else ""
        metric = (lambda m: m.aggregate_tps) if aggregate else (lambda m: m.per_stream_median_tps)
        pts = [(r.concurrency, metric(r.metrics)) for r in a.rows if metric(r.metrics) is not None]
        ys_all += [p[1] for p in pts]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color, markersize=5,
                label=f"{prefix}measured ({len(pts)} points)")
        if not aggregate:
            lo = [(r.concurrency, r.metrics.per_stream_min_tps) for r in a.rows if r.metrics.per_stream_min_tps]
            if lo:
                ax.plot([p[0] for p in lo], [p[1] for p in lo], "v", color=color, alpha=0.45, markersize=4,
                        label=f"{prefix}slowest stream (measured)")
        fx, fy = _fit_line(a, field)
        if fx:
            ax.plot(fx, fy, "-", color=color, alpha=0.75, linewidth=1.5, label=_fit_label(a, prefix))
        k = a.knee or {}
        if aggregate and k.get("alpha_seconds") and k.get("plateau_tokens_per_second") and levels:
            x_end = max(levels) * 1.25
            ax.plot([min(levels) / 1.25, x_end], [min(levels) / 1.25 / k["alpha_seconds"], x_end / k["alpha_seconds"]],
                    "--", color=color, linewidth=0.8, alpha=0.45)
            ax.axhline(k["plateau_tokens_per_second"], color=color, linestyle="--", linewidth=0.8, alpha=0.45,
                       label=f"{prefix}asymptotes b/alpha and plateau {k['plateau_tokens_per_second']:.0f} tok/s")
        knee = a.knee_value()
        if knee is not None:
            ci = a.knee_ci()
            ax.axvline(knee, color=color, linestyle=":", linewidth=1.6,
                       label=f"{prefix}knee {knee:.1f}" + (f", interval [{ci[0]:.1f}, {ci[1]:.1f}]" if ci else ""))
            if ci:
                ax.axvspan(max(ci[0], 0.5), ci[1], color=color, alpha=0.10)
        for f, n, rate, agg in _capacity_points(a, floors):
            ax.axvline(n, color="crimson", linestyle="-.", linewidth=1.1, alpha=0.8)
            y = agg if aggregate else rate
            if y is not None:
                ax.plot([n], [y], "D", color="crimson", markersize=6, markerfacecolor="none",
                        label=f"{prefix}capacity {n} streams at {f:g} tok/s (measured)")
    if reference:
        lo, hi = (min(levels) / 1.25, max(levels) * 1.25) if levels else (0, float("inf"))
        ref = [(c, v) for c, v in zip(reference["concurrency"], reference["aggregate" if aggregate else "per_stream"])
               if v is not None and v > 0 and lo <= c <= hi]
        if ref:
            ax.plot([p[0] for p in ref], [p[1] for p in ref], "s--", color="dimgray", markersize=3, linewidth=1.1,
                    alpha=0.8, label=str(reference.get("label", "prediction")))
            ys_all += [p[1] for p in ref]
    if not aggregate:
        for f in floors:
            ax.axhline(f, color="crimson", linestyle="--", linewidth=1, alpha=0.7, label=f"floor {f:g} tok/s")
    _log2_axis(ax, levels)
    if aggregate:
        ax.set_yscale("log")
        if ys_all:
            plateaus = [p for a in curves if (p := (a.knee or {}).get("plateau_tokens_per_second"))
                        and p < 4 * max(ys_all)]  # a plateau far above the data would squash it
            ax.set_ylim(min(ys_all) / 1.6, max(ys_all + plateaus) * 1.4)
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylabel("aggregate tokens/s (log)")
        ax.set_title("Aggregate throughput vs concurrency")
    else:
        ax.set_ylim(bottom=0, top=max(ys_all + list(floors) + [1.0]) * 1.12)
        ax.set_ylabel("per-stream decode tokens/s (median)")
        ax.set_title("Per-stream decode rate vs concurrency")
    _legend_below(fig, ax)
    fig.savefig(path, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def _legend_below(fig, ax) -> None:
    """The legend under the axes, never over the data."""
    handles, labels = ax.get_legend_handles_labels()
    n = len(labels)
    ax.legend(handles, labels, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.14),
              ncol=2 if n > 3 else 1, frameon=False)
    fig.tight_layout()


def plot_ttft(curves: list[CurveAnalysis], path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    many = len({a.key.label for a in curves}) > 1
    levels = sorted({r.concurrency for a in curves for r in a.rows})
    for i, a in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        for attr, style, name in (("ttft_p50_s", "o-", "p50"), ("ttft_p90_s", "s--", "p90"),
                                  ("ttft_p99_s", "^:", "p99")):
            pts = [(r.concurrency, getattr(r.metrics, attr)) for r in a.rows if getattr(r.metrics, attr) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], style, color=color, alpha=1.0 if name == "p50" else 0.6,
                        label=f"{_curve_name(a, many)} TTFT {name}")
    _log2_axis(ax, levels)
    ax.set_ylabel("time to first token (s)")
    ax.set_title("TTFT vs concurrency")
    ax.set_ylim(bottom=0)
    _legend_below(fig, ax)
    fig.savefig(path, bbox_inches="tight", pad_inches=0.15)
    plt.close(fig)
    return path


def plot_interference(result: dict, path: Path) -> Path:
    """Prefill interference: median instantaneous per-stream rate over time, injection and dip."""
    tl = result.get("timeline") or {}
    fig, ax = plt.subplots(figsize=(7.5, 4.2), dpi=110)
    if tl.get("t"):
        ax.plot(tl["t"], tl["median_rate"], "-", color=COLORS[0], label="median per-stream rate")
    base = result.get("baseline_tokens_per_second")
    if base:
        ax.axhline(base, color="gray", linestyle="--", linewidth=1, label=f"baseline {base:.1f} tok/s")
    ax.axvline(0.0, color="crimson", linewidth=1.2, label="long prompt sent")
    dip = result.get("dip") or {}
    if dip.get("start_s") is not None and dip.get("end_s") is not None:
        ax.axvspan(dip["start_s"], dip["end_s"], color="crimson", alpha=0.12,
                   label=f"dip {dip.get('duration_s', 0):.2f} s")
    ft = result.get("long_prompt", {}).get("ttft_s")
    if ft is not None:
        ax.axvline(ft, color="green", linestyle=":", label="long prompt first token")
    for p in result.get("probes", []):
        if p.get("sent_s") is not None and p.get("ttft_s") is not None:
            ax.plot([p["sent_s"], p["sent_s"] + p["ttft_s"]], [0, 0], "|-", color="purple", alpha=0.7)
    ax.set_xlabel("seconds since the long prompt was sent")
    ax.set_ylabel("tokens/s per stream")
    ax.set_title("Prefill interference: decode rate of running streams")
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
