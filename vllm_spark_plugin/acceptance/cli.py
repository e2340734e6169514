"""`vllm-spark check`: the acceptance run for the server you already run.

    vllm-spark check --endpoint http://127.0.0.1:8000 [--out DIR] [-- <your vllm serve arguments>]
    vllm-spark check --sweep FILE_OR_FOLDER [...]     (a sweep already run: no bench)

1. `vllm-spark doctor` on this machine (with the serve arguments after `--`, if given);
2. the planner's prediction for the served model and this workload (`--plan-model` when the server's
   model is neither a built-in planner model nor a folder on this machine);
3. `vllm-spark bench --levels auto` on the served model, sized from the prediction to fit `--minutes`
   (default 10, everything included);
   With `--sweep`, a sweep already run (any file or folder `vllm-spark knee` reads: this project's
   CSV, `vllm bench serve` JSON, spark-bench CSV, an AIPerf artifact folder, GuideLLM's
   benchmarks.json) is fitted instead, and nothing is sent to the server;
4. the prediction beside the measurement (per-stream rate, aggregate, knee, plateau, capacity at the
   floor, TTFT) in `report.html` and `check.json`; the bench's own files in `bench/`.

Exit status: 0 doctor found no failure and the measurement completed; 1 doctor found a failure (the
rest still runs and is reported); 2 bad options; 3 the server could not be measured (preflight failed,
or it failed during the run: what was measured is kept); 130 interrupted.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from ..bench.cli import positive
from ..definitions import DEFAULT_FLOOR_TOKENS_PER_SECOND
from .prediction import Prediction, PredictionError, compare, model_spec, predict, reference_curve, size_run

PROG = "vllm-spark check"
EXIT_OK, EXIT_DOCTOR, EXIT_USAGE, EXIT_MEASURE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
DEFAULT_MINUTES = 10.0
OVERHEAD_SECONDS = 30.0   # doctor, preflight, planning, sizing and the reports
MIN_MEASURE_SECONDS = 20.0
JSON_NAME, REPORT_NAME, BENCH_DIR = "check.json", "report.html", "bench"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    t = parser.add_argument_group("the server")
    t.add_argument("--endpoint", default="http://127.0.0.1:8000", help="OpenAI-compatible server root "
                   "(default: %(default)s)")
    t.add_argument("--model", default=None, help="served model name (default: the first it serves)")
    t.add_argument("--api-key", default=None, help="bearer token (default: $OPENAI_API_KEY)")
    w = parser.add_argument_group("workload and time")
    w.add_argument("--floor", type=positive(float), default=DEFAULT_FLOOR_TOKENS_PER_SECOND,
                   help="per-stream decode-rate floor for capacity, tok/s (default: 20, seed 003)")
    w.add_argument("--prompt-tokens", type=positive(int), default=512,
                   help="random prompt tokens per request (default: %(default)s)")
    w.add_argument("--output-tokens", type=positive(int), default=256,
                   help="output tokens per request; halved (to 64 at least) when the prediction says the "
                        "run would not fit --minutes (default: %(default)s)")
    w.add_argument("--trials", type=positive(int), default=None,
                   help="trials per level (default: 3, 2 or 1, the most the prediction fits in --minutes)")
    w.add_argument("--minutes", type=positive(float), default=DEFAULT_MINUTES,
                   help="the whole check's time, doctor and reports included (default: %(default)g)")
    w.add_argument("--max-concurrency", type=positive(int), default=512,
                   help="highest level the search may ask for (default: %(default)s, lowered to 4x the "
                        "predicted capacity or knee)")
    w.add_argument("--sweep", nargs="+", default=None, metavar="FILE",
                   help="fit a sweep already run instead of measuring (any input vllm-spark knee reads: "
                        "sweep CSV, vllm bench serve JSON, spark-bench CSV, AIPerf folder, GuideLLM benchmarks.json)")
    p = parser.add_argument_group("prediction (vllm-spark plan)")
    p.add_argument("--plan-model", default=None, metavar="NAME|PATH",
                   help="the planner's model: a built-in name or a config.json / checkpoint folder (default: "
                        "the served name when built in, else the server's model folder when on this machine)")
    p.add_argument("--hardware", default="gb10", help="planner hardware profile or JSON file (default: %(default)s)")
    p.add_argument("--weight-format", default=None,
                   help="checkpoint storage format for the planner (default: from the model's config.json "
                        "quantization_config, bf16 without one; nvfp4 for a built-in name)")
    p.add_argument("--calibration", default=None, metavar="FILE", help="planner calibration file (vllm-spark plan "
                   "--save-calibration)")
    p.add_argument("--plan-arg", action="append", default=[], metavar="ARG",
                   help="one more vllm-spark plan argument (repeat: --plan-arg=--tp --plan-arg=2)")
    o = parser.add_argument_group("output")
    o.add_argument("--out", type=Path, default=None, help="output folder (default runs/check-YYYYmmdd-HHMMSS)")
    o.add_argument("--quiet", action="store_true", help="no progress output")
    parser.add_argument("serve_args", nargs="*", metavar="-- VLLM_SERVE_ARGS",
                        help="after --: the vllm serve arguments the server runs with (for doctor)")


def _say(args, text: str = "") -> None:
    if not args.quiet:
        print(text, flush=True)


def _doctor(args) -> dict:
    from .. import doctor
    try:
        serve = doctor.parse_serve_args(list(args.serve_args or []))
    except ValueError as exc:
        raise _Usage(f"the serve arguments after --: {exc}") from None
    checks = doctor.run_checks(serve=serve)
    failed = [c.name for c in checks if c.status == doctor.FAIL]
    _say(args, doctor.format_checks(checks))
    return {"ok": not failed, "failed": failed, "checks": [asdict(c) for c in checks]}


class _Usage(ValueError):
    pass


def _preflight(args):
    from ..bench.server_info import PreflightError, preflight
    try:
        return asyncio.run(preflight(args.endpoint, args.model, timeout=5.0, api_key=args.api_key)), None
    except PreflightError as exc:
        return None, str(exc)


def _bench_argv(args, info, sizing, out: Path) -> list[str]:
    argv = ["--endpoint", info.endpoint, "--model", info.model, "--api", "completions", "--workload", "random",
            "--random-input-len", str(args.prompt_tokens), "--output-tokens", str(sizing.output_tokens),
            "--trials", str(sizing.trials), "--floor", f"{args.floor:g}", "--levels", "auto",
            "--budget-seconds", f"{sizing.budget_seconds:g}", "--max-concurrency", str(sizing.max_concurrency),
            "--out", str(out)]
    if args.api_key:
        argv += ["--api-key", args.api_key]
    return argv + (["--quiet"] if args.quiet else [])


def _run_bench(argv: list[str], reference: dict | None) -> int:
    from ..bench import cli as bench_cli
    parser = argparse.ArgumentParser(prog="vllm-spark bench")
    bench_cli.add_arguments(parser)
    return bench_cli.run(parser.parse_args(argv), reference=reference)


def run(args) -> int:
    t0 = time.monotonic()
    budget = args.minutes * 60.0 - OVERHEAD_SECONDS
    if budget < MIN_MEASURE_SECONDS:
        print(f"{PROG}: error: --minutes {args.minutes:g} leaves no time to measure (at least "
              f"{(OVERHEAD_SECONDS + MIN_MEASURE_SECONDS) / 60:.2g} minutes)", file=sys.stderr)
        return EXIT_USAGE
    out = Path(args.out or Path("runs") / f"check-{datetime.now():%Y%m%d-%H%M%S}")
    out.mkdir(parents=True, exist_ok=True)
    doc: dict = {"tool": PROG, "endpoint": args.endpoint, "started": datetime.now().astimezone().isoformat(timespec="seconds"),
                 "floor": args.floor, "prompt_tokens": args.prompt_tokens, "minutes": args.minutes}

    _say(args, "[1/4] doctor")
    try:
        doc["doctor"] = _doctor(args)
    except _Usage as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE

    _say(args, f"[2/4] the planner's prediction for the served model ({args.endpoint})")
    info, pred = _prediction(args, doc)
    sizing = size_run(pred, args.floor, budget - (time.monotonic() - t0), args.trials, args.output_tokens,
                      args.max_concurrency)
    doc["sizing"] = sizing.to_json()
    _say(args, f"      run size: {sizing.reason}")

    code, summary = EXIT_MEASURE, {}
    if args.sweep:
        doc["sweep"] = [str(f) for f in args.sweep]
        _say(args, f"[3/4] the sweep already run: {' '.join(map(str, args.sweep))}")
        try:
            summary = sweep_summary(args.sweep, args.floor)
        except ValueError as exc:  # KneeInputError: names the file and what was expected
            print(f"{PROG}: error: --sweep: {exc}", file=sys.stderr)
            return EXIT_USAGE
        code = 0
    elif info is not None:
        _say(args, f"[3/4] vllm-spark bench --levels auto on {info.model} ({sizing.trials} trial(s), "
                   f"{args.prompt_tokens}-token prompts, {sizing.output_tokens}-token outputs, "
                   f"budget {sizing.budget_seconds:.0f} s)")
        code = _run_bench(_bench_argv(args, info, sizing, out / BENCH_DIR), reference_curve(pred))
        if code == EXIT_USAGE:
            return EXIT_USAGE  # the bench said which option (one line)
        summary = _read_summary(out / BENCH_DIR)
    doc["bench"] = {"exit_status": code, "status": summary.get("status"), "message": summary.get("message"),
                    "folder": BENCH_DIR, "capacity_statements": summary.get("capacity_statements", []),
                    "search": ((summary.get("curves") or [{}])[0]).get("search")}
    doc["comparison"] = compare(pred, summary, args.floor) if summary else []
    doc["seconds"] = round(time.monotonic() - t0, 1)
    doc["exit_status"] = status = _status(doc["doctor"]["ok"], code)
    doc["verdict"] = _verdict(doc, status)
    _say(args, "[4/4] prediction beside measurement")
    _write(args, out, doc)
    return status


def _prediction(args, doc: dict):
    """Preflight the server and plan its model; records `server`, `prediction` and `notes` in `doc`.
    Returns (server info or None, prediction or None)."""
    info, why = _preflight(args)
    pred: Prediction | None = None
    notes = doc.setdefault("notes", [])
    doc["server"] = None if info is None else {"endpoint": info.endpoint, "model": info.model, "root": info.root,
                                               "max_model_len": info.max_model_len}
    if info is None and not (args.sweep and args.plan_model):
        notes.append(f"the server could not be {'reached' if args.sweep else 'measured'}: {why}")
    else:  # with --sweep and --plan-model the prediction needs no server
        spec, how = (model_spec(args.plan_model, info.model, info.root) if info is not None
                     else (args.plan_model, "--plan-model"))
        if spec is None:
            notes.append(how)
        else:
            try:
                pred = predict(spec, hardware=args.hardware, weight_format=args.weight_format, floor=args.floor,
                               prompt_tokens=args.prompt_tokens, output_tokens=args.output_tokens,
                               calibration=args.calibration, extra=args.plan_arg)
                notes.append(f"planned {spec} ({how}) as {pred.weight_format} on {args.hardware}")
            except PredictionError as exc:
                notes.append(str(exc))
    for n in notes:
        _say(args, f"      {n}")
    doc["prediction"] = None if pred is None else {"model": pred.model_spec, "hardware": args.hardware,
                                                    "weight_format": pred.weight_format, "plan": pred.plan}
    return info, pred


def sweep_summary(files, floor: float) -> dict:
    """A sweep already run, fitted like `vllm-spark knee` does, in the shape of the bench's summary that
    `compare` reads (its first curve; the others are named in the status)."""
    from ..knee.fit import fit_points
    from ..knee.loaders import load_points
    curves = load_points(files)
    label, points = next(iter(curves.items()))
    res = fit_points(points, floors=[floor])
    cap = res.capacity_at(floor)
    others = [k for k in curves if k != label]
    rows = [{"concurrency": int(p.concurrency) if float(p.concurrency).is_integer() else p.concurrency, "per_stream_median_tps": p.per_stream_tokens_per_second,
             "aggregate_tps": p.aggregate_tokens_per_second, "ttft_p50_s": p.ttft_p50_seconds} for p in points]
    statement = (f"{label}: capacity at {floor:g} tok/s per stream: {cap} streams (fit: {res.verdict})"
                 if cap is not None else f"{label}: no capacity at {floor:g} tok/s from this sweep ({res.verdict})")
    return {"status": f"fitted {label}" + (f" (also in the input: {', '.join(others)})" if others else ""),
            "message": None, "capacity_statements": [statement],
            "curves": [{"label": label, "points": rows, "capacity": {f"{floor:g}": cap},
                        "knee": {"knee": res.knee, "plateau_tokens_per_second": res.plateau_tokens_per_second,
                                 "ci": res.ci, "verdict": res.verdict}}]}


def _read_summary(bench_dir: Path) -> dict:
    try:
        return json.loads((bench_dir / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _status(doctor_ok: bool, bench_code: int) -> int:
    if not doctor_ok:
        return EXIT_DOCTOR
    if bench_code == EXIT_INTERRUPTED:
        return EXIT_INTERRUPTED
    return EXIT_OK if bench_code == 0 else EXIT_MEASURE


def _write(args, out: Path, doc: dict) -> None:
    from ..bench.results import write_json
    from .report import comparison_lines, write_report
    for line in comparison_lines(doc["comparison"]):
        _say(args, line)
    write_json(out / JSON_NAME, doc)
    write_report(out / REPORT_NAME, doc, out / BENCH_DIR)
    print(doc["verdict"])
    print(f"results: {out}/ ({REPORT_NAME}, {JSON_NAME}" + (")" if doc.get("sweep") else f", {BENCH_DIR}/)"))


def _verdict(doc: dict, status: int) -> str:
    d = doc["doctor"]
    parts = ["doctor: no failure" if d["ok"] else f"doctor: {len(d['failed'])} failure(s) ({', '.join(d['failed'])})"]
    b = doc["bench"]
    parts.append("measurement: complete" if b["exit_status"] == 0 else
                 f"measurement: {b['status'] or 'not run'}" + (f" ({b['message']})" if b["message"] else ""))
    for line in b["capacity_statements"][:1]:
        parts.append(line)
    return f"check {'passed' if status == EXIT_OK else 'FAILED'}: " + "; ".join(parts)
