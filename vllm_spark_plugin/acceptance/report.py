"""`check.json` and `report.html` of `vllm-spark check`: the verdict, the doctor's checks, the
prediction beside the measurement, and the bench's plots (measured points, fit, knee with its
interval, the floor and the capacity, the planner's curve in grey)."""
from __future__ import annotations

import html
from pathlib import Path

from ..bench.report import CSS, PLOT_NAMES, REPORT_NAME, img_tag, table


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, int):
        return str(v)
    a = abs(v)
    return f"{v:.3g}" if a < 1 else f"{v:.1f}" if a < 1000 else f"{v:,.0f}"


def comparison_lines(rows: list[dict]) -> list[str]:
    """The side-by-side table as text."""
    if not rows:
        return ["  nothing measured to compare"]
    width = max(len(r["quantity"]) for r in rows)
    out = [f"  {'':{width}}  {'predicted':>10}  {'measured':>10}  {'measured/predicted':>18}"]
    for r in rows:
        ratio = "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"
        out.append(f"  {r['quantity']:{width}}  {_fmt(r['predicted']):>10}  {_fmt(r['measured']):>10}  {ratio:>18}")
    return out


def _doctor_html(d: dict) -> str:
    rows = [[html.escape(c["status"]), html.escape(c["name"]), html.escape(c["detail"]), html.escape(c.get("fix") or "")]
            for c in d["checks"]]
    return "<div class='doctor'>" + table(["status", "check", "detail", "fix"], rows) + "</div>"


def _comparison_html(rows: list[dict]) -> str:
    out = []
    for r in rows:
        measured = _fmt(r["measured"])
        iv = r.get("measured_interval")
        if isinstance(iv, list) and None not in iv:
            measured += f" [{iv[0]:.1f}, {iv[1]:.1f}]"
        out.append([html.escape(r["quantity"]), _fmt(r["predicted"]), html.escape(measured),
                    "n/a" if r["ratio"] is None else f"{r['ratio']:.2f}"])
    return table(["quantity", "predicted (planner)", "measured (bench)", "measured / predicted"], out)


def _measured_html(doc: dict, sizing: dict) -> str:
    if doc.get("sweep"):
        return f"Measured: a sweep already run, <code>{html.escape(' '.join(doc['sweep']))}</code>."
    return f"Measured: <code>vllm-spark bench --levels auto</code>, {sizing.get('trials')} trial(s) per level."


def write_report(path: Path, doc: dict, bench_dir: Path) -> Path:
    passed = doc["exit_status"] == 0
    plots = "".join(img_tag(bench_dir / PLOT_NAMES[k], k) for k in ("aggregate", "per_stream")
                    if (bench_dir / PLOT_NAMES[k]).exists())
    sizing = doc.get("sizing") or {}
    pred = doc.get("prediction")
    server = doc.get("server") or {}
    bench_report = bench_dir / REPORT_NAME
    link = (f"<p class='meta'>Every point, trial and fit: <a href='{html.escape(bench_dir.name)}/{REPORT_NAME}'>"
            f"{html.escape(bench_dir.name)}/{REPORT_NAME}</a></p>" if bench_report.exists() else "")
    notes = "".join(f"<li>{html.escape(n)}</li>" for n in doc.get("notes") or [])
    statements = "".join(f"<li>{html.escape(s)}</li>" for s in (doc.get("bench") or {}).get("capacity_statements") or [])
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vllm-spark check</title>
<style>{CSS}
.verdict{{font-weight:600;padding:8px 12px;border:1px solid}} .pass{{background:#e8f5e9;border-color:#81c784}}
.fail{{background:#fdecea;border-color:#e57373}} .doctor td{{text-align:left;vertical-align:top}}</style></head><body>
<h1>vllm-spark check</h1>
<p class="meta">{html.escape(str(server.get('model') or ''))} at {html.escape(doc['endpoint'])}, started
{html.escape(doc['started'])}, {doc.get('seconds', 0):.0f} s</p>
<p class="verdict {'pass' if passed else 'fail'}">{html.escape(doc['verdict'])}</p>
<h2>Capacity</h2><ul>{statements or '<li>nothing measured</li>'}</ul>
<div class="plots">{plots}</div>
<h2>Prediction beside measurement</h2>
<p class="meta">Planner: {html.escape(pred['model']) if pred else 'no prediction'}
{('as ' + html.escape(pred['weight_format']) + ' on ' + html.escape(pred['hardware'])) if pred else ''};
workload {doc['prompt_tokens']}-token prompts, {sizing.get('output_tokens')}-token outputs, floor {doc['floor']:g} tok/s.
{_measured_html(doc, sizing)}</p>
{_comparison_html(doc.get('comparison') or [])}
<p class="note">Run size: {html.escape(sizing.get('reason') or '')}</p>
<ul class="note">{notes}</ul>
{link}
<h2>Doctor</h2>{_doctor_html(doc['doctor'])}
</body></html>
"""
    Path(path).write_text(page, encoding="utf-8")
    return Path(path)
