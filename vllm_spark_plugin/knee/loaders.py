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

from ..definitions import SweepPoint, median

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
        points.append(_vllm_bench_point(obj, path, where))
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
    raise KneeInputError(
        f"{path}: unrecognised CSV columns ({', '.join(sorted(header)[:12])}"
        f"{', ...' if len(header) > 12 else ''}); expected this project's sweep CSV "
        f"({', '.join(sorted(SWEEP_COLUMNS))}) or a spark-bench long CSV ({', '.join(sorted(SPARK_BENCH_COLUMNS))})")


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
