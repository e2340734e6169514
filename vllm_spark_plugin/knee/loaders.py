"""Read sweep results into `SweepPoint` curves, one list per label, from three formats (sniffed):

1. this project's sweep CSV (written by `vllm-spark bench`): columns include `row_type`
   ('trial' or 'point'), `label`, `workload`, `concurrency`, `trial`, `per_stream_median_tps`,
   `aggregate_tps`, `ttft_p50_s`, `ttft_p99_s`.  'point' rows are used as they are (their `trial`
   column counts the trials behind them); without any, the 'trial' rows are combined per
   (label, workload, endpoint, model, concurrency) by the median across trials.
2. the JSON that `vllm bench serve --save-result` writes (one object per run, or one per line with
   `--append-result`): `max_concurrency`, `output_throughput`, `median_ttft_ms`, `p99_ttft_ms`,
   `median_tpot_ms`, `model_id` (and `label`).  Per-stream rate = 1000 / median_tpot_ms.  Runs of
   one curve at the same concurrency are trials: their median is the point.  A directory is read
   as every *.json / *.jsonl / *.csv file in it.
3. the long-format CSV of the community spark-bench project: run_id, timestamp, tier, model, label,
   endpoint, topology, parallelism, context, batch, spec_decode, workload, metric, value, unit,
   notes (extra columns ignored).  Rows with workload 'concurrency' carry agg_decode_tps,
   per_stream_tps, ttft_p50_ms, ttft_p99_ms per `batch` (the concurrency); one curve per
   model/label, runs at the same batch combined by the median.

4. NVIDIA AIPerf (0.13) exports: a run's `profile_export_aiperf.json` (`aiperf_version`,
   `input_config`: the profiling phase's `concurrency`) or a sweep's
   `sweep_aggregate/profile_export_aiperf_sweep.json` (`per_combination_metrics`).  Per-stream rate =
   p50 of `output_token_throughput_per_user` (each request's 1 / inter-token latency, i.e.
   (tokens - 1) / (last - first token)); aggregate = `output_token_throughput`; TTFT p50/p99 of
   `time_to_first_token`.  An artifact folder is read as its per-run files.
5. GuideLLM (0.8) `benchmarks.json`: one point per concurrent (or synchronous) benchmark, computed
   from its per-request timings with this project's definitions (`definitions.StreamTiming`), TTFT
   from its `time_to_first_token_ms`.  Rate-driven benchmarks (constant, poisson, throughput) have no
   concurrency and are left out; a file with only those is refused.

Anything else raises `KneeInputError` naming the file and the problem.
"""
from __future__ import annotations

import csv
import io
import json
import math
import os
from collections import defaultdict
from typing import Iterable

from ..definitions import StreamTiming, SweepPoint, aggregate_throughput, median

SWEEP_COLUMNS = {"row_type", "label", "concurrency", "per_stream_median_tps", "aggregate_tps"}
SPARK_BENCH_COLUMNS = {"model", "label", "batch", "workload", "metric", "value"}
VLLM_BENCH_KEYS = {"max_concurrency", "output_throughput", "median_tpot_ms"}


class KneeInputError(ValueError):
    """A file that cannot be read as sweep results; the message names the file and the problem."""


def _num(raw, path: str, where: str, column: str) -> float | None:
    """Parse a numeric cell: empty/None/'nan' -> None; anything unparsable -> KneeInputError."""
    if raw is None:
        return None
    if isinstance(raw, (int, float)) and not isinstance(raw, bool):
        v = float(raw)
        return v if math.isfinite(v) else None
    s = str(raw).strip()
    if s == "" or s.lower() in ("nan", "none", "null", "na", "n/a", "-"):
        return None
    try:
        v = float(s)
    except ValueError:
        raise KneeInputError(f"{path}: {where}: {column} = {s!r} is not a number") from None
    return v if math.isfinite(v) else None


def _ms(v: float | None) -> float | None:
    return None if v is None else v / 1000.0


# ----------------------------------------------------------------------------- project sweep CSV

_SWEEP_CONFIG = ("endpoint", "model")  # optional columns that also tell curves apart


def _read_sweep_csv(path: str, rows: list[dict]) -> dict[str, list[SweepPoint]]:
    groups: dict[tuple, list[tuple[int, dict]]] = defaultdict(list)
    has_point = any((r.get("row_type") or "").strip() == "point" for r in rows)
    want = "point" if has_point else "trial"
    for i, r in enumerate(rows, start=2):
        if (r.get("row_type") or "").strip() != want:
            continue
        c = _num(r.get("concurrency"), path, f"line {i}", "concurrency")
        if c is None:
            raise KneeInputError(f"{path}: line {i}: a {want} row without a concurrency")
        config = tuple((k, (r.get(k) or "").strip()) for k in _SWEEP_CONFIG)
        groups[((r.get("label") or "").strip(), (r.get("workload") or "").strip(), config, c)].append((i, r))
    if not groups:
        raise KneeInputError(f"{path}: no rows with row_type 'point' or 'trial'")
    configs: dict[tuple[str, str], set] = defaultdict(set)
    for label, workload, config, _ in groups:
        configs[(label, workload)].add(config)
    out: list[SweepPoint] = []
    for (label, workload, config, c), members in groups.items():
        def col(name):
            return [v for v in (_num(r.get(name), path, f"line {i}", name) for i, r in members) if v is not None]
        if has_point and len(members) == 1:
            # a point row's `trial` (or `trials`) column counts the trials it aggregates
            i, r = members[0]
            col_name = "trials" if "trials" in r else "trial"
            trials = _num(r.get(col_name), path, f"line {i}", col_name)
            n_trials = int(trials) if trials is not None and trials >= 1 else 1
        else:
            n_trials = len(members)
        name = label
        if len(configs[(label, workload)]) > 1:  # same label on two endpoints/models: keep apart
            differing = [k for k in _SWEEP_CONFIG if len({dict(cf)[k] for cf in configs[(label, workload)]}) > 1]
            name += " [" + ", ".join(f"{k}={dict(config)[k]}" for k in differing) + "]"
        out.append(SweepPoint(concurrency=c, per_stream_tokens_per_second=median(col("per_stream_median_tps")),
                              aggregate_tokens_per_second=median(col("aggregate_tps")),
                              ttft_p50_seconds=median(col("ttft_p50_s")),
                              ttft_p99_seconds=median(col("ttft_p99_s")),
                              label=name, workload=workload, trials=n_trials,
                              extra={"source": os.path.basename(path), "format": "sweep-csv"}))
    return _by_curve(out)


# ----------------------------------------------------------------------------- spark-bench CSV

_SPARK_METRICS = {"agg_decode_tps": "aggregate", "per_stream_tps": "per_stream",
                  "ttft_p50_ms": "ttft_p50", "ttft_p99_ms": "ttft_p99"}
_SPARK_CONFIG = ("endpoint", "topology", "parallelism", "context", "spec_decode")


def _read_spark_bench_csv(path: str, rows: list[dict]) -> dict[str, list[SweepPoint]]:
    cells: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    runs: dict[tuple, set] = defaultdict(set)
    for i, r in enumerate(rows, start=2):
        if (r.get("workload") or "").strip() != "concurrency":
            continue
        metric = (r.get("metric") or "").strip()
        if metric not in _SPARK_METRICS:
            continue
        batch = _num(r.get("batch"), path, f"line {i}", "batch")
        if batch is None:
            raise KneeInputError(f"{path}: line {i}: concurrency row for {metric} without a batch")
        value = _num(r.get("value"), path, f"line {i}", "value")
        if value is None:
            continue
        config = tuple((k, (r.get(k) or "").strip()) for k in _SPARK_CONFIG)
        key = ((r.get("model") or "").strip(), (r.get("label") or "").strip(), config, batch)
        cells[key][_SPARK_METRICS[metric]].append(value)
        runs[key].add((r.get("run_id") or "").strip())
    if not cells:
        raise KneeInputError(f"{path}: a spark-bench CSV without rows of workload 'concurrency' carrying "
                             f"{', '.join(_SPARK_METRICS)}")
    # Name each curve model/label; add the configuration fields that differ between curves that
    # would otherwise share a name (e.g. two topologies of one model).
    configs: dict[tuple[str, str], set] = defaultdict(set)
    for model, label, config, _ in cells:
        configs[(model, label)].add(config)
    points = []
    for (model, label, config, batch), m in cells.items():
        name = "/".join(v for v in dict.fromkeys((model, label)) if v) or "unlabelled"
        if len(configs[(model, label)]) > 1:
            differing = [k for k in _SPARK_CONFIG
                         if len({dict(c)[k] for c in configs[(model, label)]}) > 1]
            name += " [" + ", ".join(f"{k}={dict(config)[k]}" for k in differing) + "]"
        points.append(SweepPoint(concurrency=batch, per_stream_tokens_per_second=median(m["per_stream"]),
                                 aggregate_tokens_per_second=median(m["aggregate"]),
                                 ttft_p50_seconds=_ms(median(m["ttft_p50"])),
                                 ttft_p99_seconds=_ms(median(m["ttft_p99"])),
                                 label=name, workload="concurrency",
                                 trials=max(1, len(runs[(model, label, config, batch)])),
                                 extra={"source": os.path.basename(path), "format": "spark-bench-csv"}))
    return _by_curve(points)


# ----------------------------------------------------------------------------- AIPerf JSON

AIPERF_RUN_FILE, AIPERF_SWEEP_FILE = "profile_export_aiperf.json", "profile_export_aiperf_sweep.json"


def _aiperf_stat(metrics: dict, name: str, stat: str, path: str, where: str) -> float | None:
    block = metrics.get(name)
    return _num(block.get(stat), path, where, f"{name}.{stat}") if isinstance(block, dict) else None


def _aiperf_point(metrics: dict, concurrency, label: str, trials: int, path: str, where: str) -> SweepPoint:
    c = _num(concurrency, path, where, "concurrency")
    if c is None or c <= 0:
        raise KneeInputError(f"{path}: {where}: an AIPerf run without a fixed concurrency (--concurrency N); "
                             "request-rate runs give no curve point")
    per_stream = _aiperf_stat(metrics, "output_token_throughput_per_user", "p50", path, where)
    if per_stream is None:  # older exports: the median inter-token latency
        itl = _aiperf_stat(metrics, "inter_token_latency", "p50", path, where)
        per_stream = 1000.0 / itl if itl else None
    aggregate = _aiperf_stat(metrics, "output_token_throughput", "avg", path, where)
    if per_stream is None and aggregate is None:
        raise KneeInputError(f"{path}: {where}: no output_token_throughput_per_user, inter_token_latency or "
                             "output_token_throughput: was the run streamed (--streaming)?")
    requests = _aiperf_stat(metrics, "completed_request_count", "avg", path, where)
    if requests is None:
        requests = _aiperf_stat(metrics, "request_count", "avg", path, where)
    return SweepPoint(concurrency=c, per_stream_tokens_per_second=per_stream, aggregate_tokens_per_second=aggregate,
                      ttft_p50_seconds=_ms(_aiperf_stat(metrics, "time_to_first_token", "p50", path, where)),
                      ttft_p99_seconds=_ms(_aiperf_stat(metrics, "time_to_first_token", "p99", path, where)),
                      label=label, trials=trials,
                      extra={"source": os.path.basename(path), "format": "aiperf-json",
                             "requests": None if requests is None else int(requests)})


def _aiperf_run(obj: dict, path: str, where: str) -> list[SweepPoint]:
    """One `aiperf profile` run: its profiling phase's concurrency, the model as the label."""
    cfg = obj.get("input_config") or {}
    phases = [p for p in cfg.get("phases") or [] if isinstance(p, dict) and p.get("kind", "profiling") == "profiling"]
    concurrency = phases[0].get("concurrency") if phases else (cfg.get("loadgen") or {}).get("concurrency")
    models = [m.get("name") for m in ((cfg.get("models") or {}).get("items") or []) if isinstance(m, dict)]
    label = "/".join(m for m in models if m) or "aiperf"
    return [_aiperf_point(obj, concurrency, label, 1, path, where)]


def _aiperf_sweep(obj: dict, path: str, where: str) -> list[SweepPoint]:
    """The sweep aggregate: one point per concurrency (means over trials where there were several)."""
    meta = obj.get("metadata") or {}
    trials = int(_num(meta.get("num_trials_per_value"), path, where, "num_trials_per_value") or 1)
    label = str(meta.get("model") or "").strip() or "aiperf"
    points = []
    for n, combo in enumerate(obj.get("per_combination_metrics") or [], start=1):
        params = combo.get("parameters") or {}
        if "concurrency" not in params:
            raise KneeInputError(f"{path}: {where}: combination {n} sweeps {', '.join(params) or 'nothing'}, "
                                 "not concurrency; only a concurrency sweep gives a curve")
        points.append(_aiperf_point(combo.get("metrics") or {}, params["concurrency"], label, trials, path,
                                    f"{where}, combination {n}"))
    if not points:
        raise KneeInputError(f"{path}: {where}: an AIPerf sweep aggregate without per_combination_metrics")
    return points


# ----------------------------------------------------------------------------- GuideLLM JSON

GUIDELLM_FILE = "benchmarks.json"


def _guidellm_point(bench: dict, label: str, path: str, where: str) -> SweepPoint | None:
    """A concurrent benchmark as a point; None for a rate-driven one (no concurrency)."""
    strategy = (bench.get("config") or {}).get("strategy") or {}
    kind = strategy.get("type_")
    if kind == "synchronous":
        c = 1.0
    elif kind == "concurrent":
        c = _num(strategy.get("streams"), path, where, "strategy.streams")
    else:
        return None
    streams = []
    for r in (bench.get("requests") or {}).get("successful") or []:
        t = ((r.get("info") or {}).get("timings") or {})
        streams.append(StreamTiming(output_tokens=int(r.get("output_tokens") or 0),
                                    start=_num(t.get("request_start"), path, where, "request_start") or 0.0,
                                    first_token=_num(t.get("first_token_iteration"), path, where, "first_token_iteration"),
                                    last_token=_num(t.get("last_token_iteration"), path, where, "last_token_iteration")))
    if not streams:
        raise KneeInputError(f"{path}: {where}: a GuideLLM benchmark without per-request timings "
                             "(requests.successful); the per-stream rate cannot be computed")
    ttft = ((bench.get("metrics") or {}).get("time_to_first_token_ms") or {}).get("successful") or {}
    return SweepPoint(concurrency=c, per_stream_tokens_per_second=median(s.decode_rate for s in streams),
                      aggregate_tokens_per_second=aggregate_throughput(streams),
                      ttft_p50_seconds=_ms(_num(ttft.get("median"), path, where, "time_to_first_token_ms.median")),
                      ttft_p99_seconds=_ms(_num((ttft.get("percentiles") or {}).get("p99"), path, where,
                                                "time_to_first_token_ms.p99")),
                      label=label, extra={"source": os.path.basename(path), "format": "guidellm-json",
                                          "requests": len(streams)})


def _guidellm_report(obj: dict, path: str, where: str) -> list[SweepPoint]:
    backend = (((obj.get("config") or {}).get("spec") or {}).get("backend") or {})
    label = str(backend.get("model") or "").strip() or "guidellm"
    points, skipped = [], []
    for n, bench in enumerate(obj.get("benchmarks") or [], start=1):
        p = _guidellm_point(bench, label, path, f"{where}, benchmark {n}")
        if p is None:
            skipped.append(str(((bench.get("config") or {}).get("strategy") or {}).get("type_")))
        else:
            points.append(p)
    if not points:
        raise KneeInputError(f"{path}: {where}: no concurrent or synchronous GuideLLM benchmark "
                             f"(found: {', '.join(skipped) or 'none'}); run --profile kind=concurrent with "
                             "--override profile.streams 1,2,4,...")
    return points


def _sniffed_points(obj: dict, path: str, where: str) -> list[SweepPoint]:
    """The points of one JSON object, by what it holds (AIPerf, GuideLLM, else `vllm bench serve`)."""
    if "aiperf_version" in obj and "input_config" in obj:
        return _aiperf_run(obj, path, where)
    if obj.get("aggregation_type") == "sweep" and "per_combination_metrics" in obj:
        return _aiperf_sweep(obj, path, where)
    if obj.get("aggregation_type") == "confidence" or "aiperf_version" in obj:
        raise KneeInputError(f"{path}: {where}: an AIPerf confidence aggregate (one concurrency across trials); "
                             f"give the run folder, its {AIPERF_RUN_FILE} files or {AIPERF_SWEEP_FILE}")
    if "guidellm_version" in (obj.get("metadata") or {}) or ("benchmarks" in obj and "config" in obj):
        return _guidellm_report(obj, path, where)
    return [_vllm_bench_point(obj, path, where)]


# ----------------------------------------------------------------------------- vllm bench serve JSON

def _vllm_bench_point(obj: dict, path: str, where: str) -> SweepPoint:
    missing = sorted(VLLM_BENCH_KEYS - obj.keys())
    if missing:
        raise KneeInputError(f"{path}: {where}: not a `vllm bench serve` result (missing {', '.join(missing)})")
    c = _num(obj.get("max_concurrency"), path, where, "max_concurrency")
    if c is None or c <= 0:
        raise KneeInputError(f"{path}: {where}: max_concurrency is {obj.get('max_concurrency')!r}; "
                             "only fixed-concurrency runs (--max-concurrency N) give a curve point")
    tpot = _num(obj.get("median_tpot_ms"), path, where, "median_tpot_ms")
    model = str(obj.get("model_id") or "").strip()
    label = str(obj.get("label") or "").strip()
    return SweepPoint(concurrency=c,
                      per_stream_tokens_per_second=(1000.0 / tpot) if tpot is not None and tpot > 0 else None,
                      aggregate_tokens_per_second=_num(obj.get("output_throughput"), path, where, "output_throughput"),
                      ttft_p50_seconds=_ms(_num(obj.get("median_ttft_ms"), path, where, "median_ttft_ms")),
                      ttft_p99_seconds=_ms(_num(obj.get("p99_ttft_ms"), path, where, "p99_ttft_ms")),
                      label="/".join(v for v in (model, label) if v) or "unlabelled",
                      extra={"source": os.path.basename(path), "format": "vllm-bench-json"})


def _read_json(path: str, text: str) -> list[SweepPoint]:
    try:
        data = json.loads(text)
        objects = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        # --append-result writes one object per line
        objects = []
        for n, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                try:
                    objects.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise KneeInputError(f"{path}: line {n}: not valid JSON ({exc.msg})") from None
    if not objects:
        raise KneeInputError(f"{path}: empty JSON")
    points = []
    for n, obj in enumerate(objects, start=1):
        where = f"object {n}" if len(objects) > 1 else "top level"
        if not isinstance(obj, dict):
            raise KneeInputError(f"{path}: {where}: expected a JSON object, got {type(obj).__name__}")
        points.extend(_sniffed_points(obj, path, where))
    return points


def _merge_trials(points: Iterable[SweepPoint]) -> list[SweepPoint]:
    """Runs of one curve at one concurrency are trials of one point: take their median."""
    groups: dict[tuple[str, float], list[SweepPoint]] = defaultdict(list)
    for p in points:
        groups[(p.label, p.concurrency)].append(p)
    out = []
    for (label, c), ps in groups.items():
        if len(ps) == 1:
            out.append(ps[0])
            continue
        out.append(SweepPoint(concurrency=c,
                              per_stream_tokens_per_second=median(p.per_stream_tokens_per_second for p in ps),
                              aggregate_tokens_per_second=median(p.aggregate_tokens_per_second for p in ps),
                              ttft_p50_seconds=median(p.ttft_p50_seconds for p in ps),
                              ttft_p99_seconds=median(p.ttft_p99_seconds for p in ps),
                              label=label, workload=ps[0].workload, trials=len(ps),
                              extra={"source": ", ".join(sorted({p.extra.get('source', '') for p in ps})),
                                     "format": ps[0].extra.get("format", "")}))
    return out


# ----------------------------------------------------------------------------- entry points

def _by_curve(points: Iterable[SweepPoint]) -> dict[str, list[SweepPoint]]:
    """Group by label; a label measured under several workloads becomes one curve per workload."""
    workloads: dict[str, set] = defaultdict(set)
    pts = list(points)
    for p in pts:
        workloads[p.label].add(p.workload)
    out: dict[str, list[SweepPoint]] = defaultdict(list)
    for p in pts:
        key = p.label or "unlabelled"
        if len(workloads[p.label]) > 1 and p.workload:
            key = f"{key} [{p.workload}]"
        out[key].append(p)
    return {k: sorted(v, key=lambda p: p.concurrency) for k, v in out.items()}


def _read_file(path: str) -> tuple[str, object]:
    """('json', [SweepPoint]) or ('curves', {label: [SweepPoint]}) for one file."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except OSError as exc:
        raise KneeInputError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise KneeInputError(f"{path}: not a text file (not UTF-8)") from None
    stripped = text.lstrip()
    if not stripped:
        raise KneeInputError(f"{path}: empty file")
    if path.endswith((".yaml", ".yml")):
        raise KneeInputError(f"{path}: YAML is not read; give the JSON export ({GUIDELLM_FILE} for GuideLLM)")
    if stripped[0] in "[{":
        return "json", _read_json(path, text)
    reader = csv.DictReader(io.StringIO(text))
    header = {h.strip() for h in (reader.fieldnames or []) if h}
    if len(header) < 2:
        raise KneeInputError(f"{path}: neither JSON nor a CSV with a header row")
    reader.fieldnames = [h.strip() for h in reader.fieldnames]
    try:
        rows = list(reader)
    except csv.Error as exc:
        raise KneeInputError(f"{path}: malformed CSV: {exc}") from None
    if SWEEP_COLUMNS <= header:
        return "curves", _read_sweep_csv(path, rows)
    if SPARK_BENCH_COLUMNS <= header:
        return "curves", _read_spark_bench_csv(path, rows)
    if "Metric" in header or ("concurrency" in header and any(h.endswith("_mean") for h in header)):
        raise KneeInputError(f"{path}: an AIPerf CSV (means, no per-stream median); give the run folder, its "
                             f"{AIPERF_RUN_FILE} or {AIPERF_SWEEP_FILE} instead")
    if "Run Info" in header:
        raise KneeInputError(f"{path}: a GuideLLM CSV (no per-request timings); give its {GUIDELLM_FILE} "
                             "instead (--output kind=json)")
    raise KneeInputError(
        f"{path}: unrecognised CSV columns ({', '.join(sorted(header)[:12])}"
        f"{', ...' if len(header) > 12 else ''}); expected this project's sweep CSV "
        f"({', '.join(sorted(SWEEP_COLUMNS))}) or a spark-bench long CSV ({', '.join(sorted(SPARK_BENCH_COLUMNS))})")


def _tool_files(folder: str) -> list[str]:
    """An AIPerf artifact folder's per-run exports (its aggregates repeat them), or GuideLLM's JSON."""
    runs = sorted(os.path.join(root, AIPERF_RUN_FILE) for root, _, names in os.walk(folder)
                  if AIPERF_RUN_FILE in names)
    if runs:
        return runs
    guidellm = os.path.join(folder, GUIDELLM_FILE)
    return [guidellm] if os.path.isfile(guidellm) else []


def load_points(path: str | os.PathLike | Iterable[str | os.PathLike]) -> dict[str, list[SweepPoint]]:
    """Curves (label -> points sorted by concurrency) from a file, a directory, or several paths."""
    if isinstance(path, (str, os.PathLike)):
        paths = [os.fspath(path)]
    else:
        paths = [os.fspath(p) for p in path]
    files: list[str] = []
    for p in paths:
        if os.path.isdir(p) and os.path.isfile(os.path.join(p, "sweep.csv")):
            files.append(os.path.join(p, "sweep.csv"))  # a `vllm-spark bench` output folder
        elif os.path.isdir(p) and _tool_files(p):
            files.extend(_tool_files(p))
        elif os.path.isdir(p):
            found = sorted(os.path.join(p, f) for f in os.listdir(p)
                           if f.endswith((".json", ".jsonl", ".csv")) and not f.endswith(".pytorch.json"))
            if not found:
                raise KneeInputError(f"{p}: directory holds no .json, .jsonl or .csv files")
            files.extend(found)
        elif not os.path.exists(p):
            raise KneeInputError(f"{p}: no such file or directory")
        else:
            files.append(p)
    json_points: list[SweepPoint] = []
    curves: dict[str, list[SweepPoint]] = defaultdict(list)
    for f in files:
        kind, got = _read_file(f)
        if kind == "json":
            json_points.extend(got)  # type: ignore[arg-type]
        else:
            for label, pts in got.items():  # type: ignore[union-attr]
                curves[label].extend(pts)
    for label, pts in _by_curve(_merge_trials(json_points)).items():
        curves[label].extend(pts)
    if not curves:
        raise KneeInputError(f"{', '.join(paths)}: no sweep points found")
    return {k: sorted(v, key=lambda p: p.concurrency) for k, v in curves.items()}
