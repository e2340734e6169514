"""PNG plots (matplotlib, Agg backend: no display needed)."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

from .analysis import CurveAnalysis  # noqa: E402

COLORS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _curve_name(a: CurveAnalysis, many_labels: bool) -> str:
    return f"{a.key.label} / {a.key.workload}" if many_labels else a.key.workload


def _log2_axis(ax, levels: list[int]) -> None:
    ax.set_xscale("log", base=2)
    if levels:
        ax.set_xlim(min(levels) / 1.25, max(levels) * 1.25)  # also when no point has data
        ax.set_xticks(levels)
        ax.set_xticklabels([str(v) for v in levels])
    ax.set_xlabel("concurrency (streams)")
    ax.grid(True, which="major", alpha=0.3)


def _fit_line(a: CurveAnalysis, field: str):
    curves = (a.knee or {}).get("curves") or {}
    xs, ys = curves.get("concurrency") or [], curves.get(field) or []
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def plot_rates(curves: list[CurveAnalysis], path: Path, which: str, floors: tuple[float, ...] = ()) -> Path:
    """`which` = 'aggregate' or 'per_stream': measured points, the fitted model curve, the knee."""
    fig, ax = plt.subplots(figsize=(7.5, 4.6), dpi=110)
    many = len({a.key.label for a in curves}) > 1
    levels = sorted({r.concurrency for a in curves for r in a.rows})
    field = "aggregate_tokens_per_second" if which == "aggregate" else "per_stream_tokens_per_second"
    for i, a in enumerate(curves):
        color = COLORS[i % len(COLORS)]
        xs = [r.concurrency for r in a.rows]
        if which == "aggregate":
            ys = [r.metrics.aggregate_tps for r in a.rows]
        else:
            ys = [r.metrics.per_stream_median_tps for r in a.rows]
        pts = [(x, y) for x, y in zip(xs, ys) if y is not None]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], "o", color=color, label=_curve_name(a, many))
        if which == "per_stream":
            lo = [(r.concurrency, r.metrics.per_stream_min_tps) for r in a.rows if r.metrics.per_stream_min_tps]
            if lo:
                ax.plot([p[0] for p in lo], [p[1] for p in lo], "v", color=color, alpha=0.5, markersize=5,
                        label=f"{_curve_name(a, many)} (min stream)")
        fx, fy = _fit_line(a, field)
        if fx:
            ax.plot(fx, fy, "-", color=color, alpha=0.7, linewidth=1.5,
                    label=f"fit t(b) = {a.knee['alpha_seconds'] * 1e3:.3g} ms + {a.knee['beta_seconds'] * 1e3:.3g} ms*b"
                    if a.knee.get("alpha_seconds") is not None and a.knee.get("beta_seconds") is not None else "fit")
        k = a.knee_value()
        if k is not None:
            ax.axvline(k, color=color, linestyle=":", linewidth=1.5)
            ci = a.knee_ci()
            if ci:
                ax.axvspan(max(ci[0], 0.5), ci[1], color=color, alpha=0.08)
            ymax = max((p[1] for p in pts), default=1.0)
            ax.annotate(f"knee {k:.1f}", (k, ymax), textcoords="offset points", xytext=(4, -12 - 12 * i),
                        color=color, fontsize=9)
        if which == "aggregate" and (a.knee or {}).get("plateau_tokens_per_second"):
            ax.axhline(a.knee["plateau_tokens_per_second"], color=color, linestyle="--", linewidth=0.8, alpha=0.5)
    if which == "per_stream":
        for f in floors:
            ax.axhline(f, color="crimson", linestyle="--", linewidth=1, alpha=0.7)
            ax.annotate(f"floor {f:g} tok/s", (levels[0] if levels else 1, f), textcoords="offset points",
                        xytext=(2, 3), color="crimson", fontsize=8)
    _log2_axis(ax, levels)
    ax.set_ylabel("aggregate tokens/s" if which == "aggregate" else "per-stream decode tokens/s (median)")
    ax.set_title("Aggregate throughput vs concurrency" if which == "aggregate"
                 else "Per-stream decode rate vs concurrency")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


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
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path)
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
