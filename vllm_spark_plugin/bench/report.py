"""Write every report of a run from its `RunRecord`: `summary.json`, `capacity_profile.json`, the
PNG plots and the self-contained `report.html`.  Called at the end of a run and also after an
interrupted or failed one (the report then says it is partial)."""
from __future__ import annotations

import base64
import html
from pathlib import Path

from .analysis import CurveAnalysis, analyze, capacity_profile, fleet_capacity, fleet_statement
from .overload import LOAD_SCENARIOS
from .results import CSV_NAME, META_NAME, STREAMS_NAME, RunRecord, write_json

SUMMARY_NAME = "summary.json"
PROFILE_NAME = "capacity_profile.json"
REPORT_NAME = "report.html"
PLOT_NAMES = {"aggregate": "aggregate.png", "per_stream": "per_stream.png", "ttft": "ttft.png"}


def _safe(label: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)


def _profile_name(label: str) -> str:
    return f"capacity_profile-{_safe(label)}.json"


def write_reports(record: RunRecord, floors: tuple[float, ...], ttft_slo: float | None = None,
                  slo=None, reference: dict | None = None) -> dict:
    """Write all reports; returns the summary dict.  Plots are skipped (and said so) when there is
    nothing to plot.  `slo`: the run's `LatencySLO` (goodput, attainment, SLO capacity), if any.
    `reference`: a predicted curve drawn beside the measured ones (see `plots.plot_rates`)."""
    out = Path(record.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    curves = analyze(record, floors, ttft_slo, slo)
    files: dict[str, str] = {"csv": CSV_NAME, "streams": STREAMS_NAME, "meta": META_NAME}
    plots: dict[str, Path] = {}
    if curves:
        from . import plots as P  # matplotlib only when there is something to draw
        plots["aggregate"] = P.plot_rates(curves, out / PLOT_NAMES["aggregate"], "aggregate", floors, reference)
        plots["per_stream"] = P.plot_rates(curves, out / PLOT_NAMES["per_stream"], "per_stream", floors, reference)
        plots["ttft"] = P.plot_ttft(curves, out / PLOT_NAMES["ttft"])
    for key, res in record.scenarios.items():  # "prefill-interference", or "... (label)" in a fleet
        if res.get("scenario") == "prefill-interference":
            from . import plots as P
            label = key[len("prefill-interference"):].strip(" ()")
            name = "prefill_interference.png" if not label else f"prefill_interference-{_safe(label)}.png"
            plots[key] = P.plot_interference(res, out / name)
    files.update({k: p.name for k, p in plots.items()})

    source = f"vllm-spark bench run {record.run_id} ({CSV_NAME})"
    date = record.finished or record.started
    profiles = [capacity_profile(a, date, source) for a in curves]
    if profiles:
        main = dict(profiles[0])
        main["curves"] = profiles
        write_json(out / PROFILE_NAME, main)
        files["capacity_profile"] = PROFILE_NAME
        labels = list(dict.fromkeys(a.key.label for a in curves))
        if len(labels) > 1:  # a fleet: one profile per endpoint (its first workload) as well
            for label in labels:
                own = [p for p in profiles if p["label"] == label]
                prof = dict(own[0])
                prof["curves"] = own
                write_json(out / _profile_name(label), prof)
                files[f"capacity_profile:{label}"] = _profile_name(label)

    fleet = fleet_capacity(curves, floors)
    statements = [a.statement() for a in curves]
    if len({a.key.label for a in curves}) > 1:
        statements += fleet_statement(fleet, floors)
    files["summary"] = SUMMARY_NAME
    files["report"] = REPORT_NAME
    summary = {
        "run_id": record.run_id,
        "status": record.status,
        "complete": record.status == "complete",
        "message": record.message,
        "started": record.started,
        "finished": record.finished,
        "config": record.config,
        "servers": record.servers,
        "floors": list(floors),
        "capacity_statements": statements,
        "curves": [{"label": a.key.label, "workload": a.key.workload, "endpoint": a.key.endpoint,
                    "model": a.key.model, "capacity": a.capacity, "knee": a.knee,
                    "slo_capacity": a.slo_capacity, "search": a.search,
                    "statement": a.statement(), "points": [r.to_json() for r in a.rows],
                    "trials": [r.to_json() for r in record.trials if r.key == a.key]}
                   for a in curves],
        "fleet": fleet,
        "scenarios": {k: _without_timeline(v) for k, v in record.scenarios.items()},
        "files": files,
    }
    write_json(out / SUMMARY_NAME, summary)
    (out / REPORT_NAME).write_text(render_html(record, curves, summary, plots), encoding="utf-8")
    return summary


def _without_timeline(result: dict) -> dict:
    """Scenario results for the summary; the dense rate timeline stays in the plot."""
    return {k: v for k, v in result.items() if k != "timeline"}


# --------------------------------------------------------------------------------------------- HTML
def img_tag(path: Path, alt: str) -> str:
    data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{data}">'


def _num(x, spec=".1f") -> str:
    return "&ndash;" if x is None else format(x, spec)


def table(headers: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _curve_section(a: CurveAnalysis) -> str:
    rows = []
    for r in a.rows:
        m = r.metrics
        flag = []
        if m.short_streams:
            flag.append(f'<span class="warn">{m.short_streams} short</span>')
        if m.bunched_streams:
            flag.append(f'<span class="warn">{m.bunched_streams} bunched</span>')
        if m.errors:
            flag.append(f'<span class="warn">{m.errors} errors</span>')
        rows.append([str(r.concurrency), str(r.trial), _num(m.per_stream_median_tps), _num(m.per_stream_min_tps),
                     _num(m.per_stream_p10_tps), _num(m.aggregate_tps), _num(m.output_tps),
                     _num(m.ttft_p50_s, ".3f"), _num(m.ttft_p90_s, ".3f"), _num(m.ttft_p99_s, ".3f"),
                     f"{m.completed}/{m.requests}", " ".join(flag) or "ok", _chosen(r)]
                    + ([_num(None if m.slo_attainment is None else 100 * m.slo_attainment, ".1f"),
                        _num(m.goodput_tps)] if a.slo is not None else []))
    k = a.knee or {}
    fit = ""
    if k:
        ci = k.get("ci") or {}
        fit_rows = [[name, _num(k.get(key), spec), _ci_txt(ci.get(key), spec)]
                    for name, key, spec in (("alpha (s)", "alpha_seconds", ".4g"), ("beta (s)", "beta_seconds", ".4g"),
                                            ("knee (streams)", "knee", ".1f"),
                                            ("plateau (tok/s)", "plateau_tokens_per_second", ".1f"))]
        fit_rows += [[f"fitted capacity at {f} tok/s", "unbounded in the fit" if v is None else str(v),
                      _ci_txt((ci.get("capacity") or {}).get(f), ".0f")]
                     for f, v in (k.get("capacity") or {}).items()]
        fit = (f"<p>Step-time fit t(b) = alpha + beta&middot;b: verdict <b>{html.escape(str(k.get('verdict')))}</b>"
               f", model {html.escape(str(k.get('model')))}, R&sup2; {_num(k.get('r2'), '.3f')}.</p>"
               + table(["quantity", "estimate", f"{int(100 * (ci.get('level') or 0.95))}% CI"], fit_rows)
               + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in k.get("notes") or []))
    return (f"<h3>{html.escape(a.key.label)} / {html.escape(a.key.workload)}</h3>"
            f"<p class='meta'>endpoint {html.escape(a.key.endpoint)}, model {html.escape(a.key.model)}; "
            "every row is a measured point</p>"
            f"<p class='statement'>{html.escape(a.statement())}</p>"
            + table(["concurrency", "trials", "per-stream median tok/s", "min", "p10", "aggregate tok/s",
                      "output tok/s", "TTFT p50 s", "p90", "p99", "completed", "validation", "chosen (step)"]
                     + (["SLO attainment %", "goodput tok/s"] if a.slo is not None else []), rows)
            + fit + _search_html(a))


def _chosen(r) -> str:
    c = r.chosen
    return "&ndash;" if c is None else f"{html.escape(c.phase)} ({c.step})"


def _search_html(a: CurveAnalysis) -> str:
    """How --levels auto chose the levels and how sure each boundary is."""
    s = a.search
    if not s:
        return ""
    rows = []
    for b in s["boundaries"]:
        ev = []
        for side, word in (("lower", "meets"), ("upper", "misses")):
            e = b.get(side)
            if e:
                margin = "" if e["margin"] is None else f", {100 * e['margin']:+.1f}% of the threshold"
                ev.append(f"{e['concurrency']} {word} it in {e['trials_agreeing']}/{e['trials']} trial(s){margin}")
        fitted = "&ndash;"
        if b["kind"] == "floor":
            ci = b.get("fitted_ci")
            fitted = ("unbounded" if b.get("fitted") is None else str(b["fitted"])) + (
                f" {_ci_txt(ci, 'd')}" if isinstance(ci, list) and None not in ci else "")
        sure = "" if not b.get("confidence") else (
            f"<br>{html.escape(b['confidence'])}" + (f": {html.escape('; '.join(b['doubts']))}" if b["doubts"] else ""))
        rows.append([html.escape(b["label"]), _num(b["value"], "d"), html.escape(str(b["bracket"])),
                     html.escape(b["status"]) + sure, html.escape(b["found_by"]), html.escape("; ".join(ev)) or "&ndash;",
                     fitted])
    steps = [[str(d["step"]), "&ndash;" if d["concurrency"] is None else str(d["concurrency"]),
              html.escape(d["phase"]), f"<span class='reason'>{html.escape(d['reason'])}</span>"]
             for d in s["decisions"]]
    b = s["budget"]
    budget = (f"budget {b['max_points']} points, "
              + ("no time limit" if b["max_seconds"] is None else f"{b['max_seconds']:g} s")
              + f", levels {b['start']}..{b['max_concurrency']}")
    return ("<h4>How the levels were chosen (--levels auto)</h4>"
            f"<p class='meta'>{s['points']} points in {s['seconds']:.0f} s ({html.escape(budget)}); "
            f"{'complete' if s['complete'] else 'stopped'}: {html.escape(s['stop_reason'])}</p>"
            + "<div class='search'>" + table(["boundary", "value", "bracket [meets, misses]", "status", "found by",
                                               "evidence", "fitted [95% CI]"], rows) + "</div>"
            + "<div class='decisions'>" + table(["step", "level", "phase", "why this level"], steps) + "</div>")


def _ci_txt(ci, spec) -> str:
    if isinstance(ci, list) and len(ci) == 2 and None not in ci:
        return f"[{format(ci[0], spec)}, {format(ci[1], spec)}]"
    return "&ndash;"


def _interference_html(pi: dict) -> str:
    dip = pi.get("dip") or {}
    lp = pi.get("long_prompt") or {}
    pr = pi.get("probe_ttft_during_prefill_s") or {}
    rows = [["decode streams (requests run)", f"{pi.get('decode_streams')} ({pi.get('decode_requests')})"],
            ["long prompt tokens", str(lp.get("prompt_tokens"))],
            ["long prompt TTFT (s)", _num(lp.get("ttft_s"), ".3f")],
            ["baseline per-stream rate (tok/s)", _num(pi.get("baseline_tokens_per_second"))],
            ["dip detected", str(dip.get("detected"))],
            ["dip duration (s)", _num(dip.get("duration_s"), ".3f")],
            ["dip depth: lowest rate (tok/s)", _num(dip.get("min_tokens_per_second"))],
            ["dip depth: fraction of baseline", _num(dip.get("depth_ratio"), ".2f")],
            ["mean per-stream rate in the dip (tok/s)", _num(dip.get("mean_tokens_per_second"))],
            ["slowest stream's rate over the prefill (tok/s)",
             _num((pi.get("prefill_window") or {}).get("slowest_tokens_per_second"))],
            ["short-request TTFT before (s)", _num(pi.get("baseline_probe_ttft_s"), ".3f")],
            ["short-request TTFT during prefill, median (s)", _num(pr.get("median"), ".3f")],
            ["short-request TTFT during prefill, max (s)", _num(pr.get("max"), ".3f")],
            ["probes during prefill", str(pr.get("count"))]]
    return table(["quantity", "value"], rows)


def _overload_html(res: dict) -> str:
    share = res.get("rate_met_share")
    rows = [["floor (tok/s)", _num(res.get("floor_tokens_per_second"))],
            ["live capacity (streams)", f"{res.get('capacity_streams')} ({res.get('capacity_source')})"],
            ["load", f"{res['streams']} closed-loop streams" if "streams" in res
             else f"Poisson arrivals, {_num(res.get('arrival_rate_per_second'), '.2f')} req/s"],
            ["requests offered, completed (errors)", f"{res.get('requests')}, {res.get('completed')} ({res.get('errors')})"],
            ["offered requests at or above the floor (%)", _num(None if share is None else 100 * share)],
            ["... and within the TTFT SLO (%)", _num(None if res.get("slo_met_share") is None or res.get("ttft_slo_s") is None
                                                      else 100 * res["slo_met_share"])],
            ["rate goodput (tok/s)", _num(res.get("rate_goodput_tokens_per_second"))],
            ["server's count: requests at the floor (%)", _num(None if res.get("server_rate_met_share") is None
                                                                else 100 * res["server_rate_met_share"])],
            ["aggregate output (tok/s)", _num(res.get("output_tokens_per_second"))],
            ["per-stream rate, median (tok/s)", _num(res.get("per_stream_median_tokens_per_second"))],
            ["TTFT p50 / p99 (s)", f"{_num(res.get('ttft_p50_s'), '.3f')} / {_num(res.get('ttft_p99_s'), '.3f')}"],
            ["guard cap (requests held, mean wait s)",
             f"{res.get('guard_limit')} ({res.get('guard_requests_held')}, {_num(res.get('guard_mean_wait_s'), '.2f')})"]]
    return table(["quantity", "value"], rows)


def _reuse_html(pr: dict) -> str:
    rows = [[str(p["prompt_tokens"]), _num(p["cold_ttft_s"], ".3f"), _num(p["cached_ttft_s"], ".3f"),
             str(p.get("cached_tokens_reported"))] for p in pr["pairs"]]
    return (f"<p class='statement'>TTFT cold {_num(pr.get('cold_ttft_s'), '.3f')} s, cached "
            f"{_num(pr.get('cached_ttft_s'), '.3f')} s (x{_num(pr.get('speedup'), '.1f')}) for a "
            f"{pr.get('document_tokens')}-token document</p>"
            + table(["prompt tokens", "cold TTFT s", "cached TTFT s", "cached tokens (server)"], rows))


def _scenario_section(record: RunRecord, plots: dict) -> str:
    parts = []
    for key, res in record.scenarios.items():
        kind = res.get("scenario")
        body = (_interference_html(res) if kind == "prefill-interference" else
                _overload_html(res) if kind in LOAD_SCENARIOS else _reuse_html(res))
        parts.append(f"<h3>{html.escape(key)}</h3>" + body
                     + "".join(f"<p class='note'>{html.escape(n)}</p>" for n in res.get("notes") or [])
                     + (img_tag(plots[key], key) if key in plots else ""))
    return ("<h2>Scenarios</h2>" + "".join(parts)) if parts else ""


CSS = """
body{font-family:-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1100px}
h1{font-size:22px} h2{font-size:18px;margin-top:28px;border-bottom:1px solid #ddd} h3{font-size:15px}
table{border-collapse:collapse;margin:8px 0;font-size:12px} td,th{border:1px solid #ccc;padding:3px 7px;text-align:right}
th{background:#f3f3f3} td:first-child,th:first-child{text-align:left}
.statement{font-weight:600} .warn{color:#b00020;font-weight:600} .note{color:#555;font-size:12px}
.meta{color:#555;font-size:12px} .banner{background:#fff3cd;border:1px solid #e0c36c;padding:8px 12px}
.plots img{max-width:100%;width:720px;height:auto;display:block;margin:10px 0}
.reason{display:block;text-align:left;white-space:normal} .decisions td:last-child{text-align:left}
.search td{text-align:left;vertical-align:top}
@media (max-width:960px){body{margin:12px} table{font-size:10px} td,th{padding:2px 3px}}
.servers td,.servers th{text-align:left;vertical-align:top;overflow-wrap:anywhere} .settings{list-style:none;margin:0;padding:0}
"""


def _settings_list(recipe: str) -> str:
    """The recipe string ('key=value;...', one unbroken line) as a list, one setting a line."""
    items = "".join(f"<li>{html.escape(part)}</li>" for part in recipe.split(";") if part)
    return f"<ul class='settings'>{items}</ul>" if items else ""


def render_html(record: RunRecord, curves: list[CurveAnalysis], summary: dict, plots: dict) -> str:
    banner = ""
    if record.status != "complete":
        banner = (f"<p class='banner'><b>Partial results ({html.escape(record.status)}):</b> "
                  f"{html.escape(record.message)}</p>")
    statements = "".join(f"<li>{html.escape(s)}</li>" for s in summary["capacity_statements"])
    plot_html = "".join(img_tag(plots[k], k) for k in ("aggregate", "per_stream", "ttft") if k in plots)
    server_rows = [[html.escape(str(s.get("endpoint"))), html.escape(str(s.get("model"))),
                    html.escape(str(s.get("engine_version"))), html.escape(str(s.get("max_model_len"))),
                    _settings_list(str(s.get("recipe") or ""))] for s in record.servers]
    cfg_rows = [[html.escape(k), html.escape(str(v))] for k, v in record.config.items()]
    fleet_html = ""
    if len({a.key.label for a in curves}) > 1:
        rows = []
        for workload, w in summary["fleet"].items():
            for fk, total in w["total"].items():
                per = ", ".join(f"{html.escape(l)}: {e['capacity'].get(fk)}" for l, e in w["endpoints"].items())
                rows.append([html.escape(workload), fk, str(total), per])
        fleet_html = ("<h2>Fleet capacity</h2><p class='note'>Sums of per-endpoint capacities per workload "
                      "(alternative workloads, not a mixed load).</p>"
                      + table(["workload", "floor tok/s", "streams (sum)", "per endpoint"], rows))
    definitions = (
        "<h2>Definitions</h2><ul>"
        "<li>Per-stream decode rate = (output tokens &minus; 1) / (last token time &minus; first token time); "
        "median across streams within a trial, then median across trials.</li>"
        "<li>Aggregate throughput = sum over streams of (output tokens &minus; 1) / (latest last token &minus; "
        "earliest first token), per trial; median across trials. It differs from concurrency &times; median rate.</li>"
        "<li>TTFT (queueing + prefill) is reported separately. Output tok/s = output tokens / wall time.</li>"
        "<li>Capacity = the highest measured concurrency whose median per-stream rate is at or above the floor. "
        "Knee K = alpha/beta of the step-time fit t(b) = alpha + beta&middot;b.</li>"
        "<li>Latency SLO (with <code>--slo-*</code>): a request meets it when its TTFT is within the TTFT SLO, "
        "its per-stream decode rate is at least the floor (requests with fewer than 2 tokens: TTFT alone) and, "
        "if set, its end-to-end time is within the bound; a failed request never meets it. Attainment = requests "
        "meeting it / requests sent; goodput = output tokens of those requests / wall time.</li>"
        "<li>Streams that ended before the requested length are counted as <i>short</i> and "
        + ("included in" if record.config.get("include_short") else "left out of")
        + " the per-stream rate statistics. Streams the server delivered in a few bursts are counted as "
        "<i>bunched</i> and left out of them.</li></ul>")
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>vllm-spark bench {html.escape(record.run_id)}</title>
<style>{CSS}</style></head><body>
<h1>vllm-spark bench report</h1>
<p class="meta">run {html.escape(record.run_id)}, started {html.escape(record.started)}, finished
{html.escape(str(record.finished))}, status {html.escape(record.status)}</p>
{banner}
<h2>Capacity</h2><ul>{statements or '<li>no completed points</li>'}</ul>
<div class="plots">{plot_html}</div>
{fleet_html}
<h2>Points</h2>{''.join(_curve_section(a) for a in curves) or '<p>No completed points.</p>'}
{_scenario_section(record, plots)}
<h2>Servers</h2><div class="servers">{table(['endpoint', 'model', 'engine version', 'max_model_len', 'recipe'], server_rows)}</div>
<h2>Run configuration</h2>{table(['option', 'value'], cfg_rows)}
{definitions}
<p class="meta">Files: {html.escape(', '.join(sorted(set(summary['files'].values()))))}</p>
</body></html>
"""
