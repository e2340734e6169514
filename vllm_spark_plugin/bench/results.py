"""Result records and the files that hold them: `sweep.csv` (one row per trial and per point,
appended and flushed as each completes, so an interrupted run leaves a valid CSV), `streams.csv`
(one row per measured request: the individual lengths and timings behind every number) and
`meta.json`.

CSV rows carry their own metadata columns (engine version, recipe, requested length, date...), so a
row copied out of the file still says what it measured; `meta.json` holds the rest.
"""
from __future__ import annotations

import csv
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..definitions import SLO_MET, SweepPoint
from .stats import Metrics

if TYPE_CHECKING:
    from .adaptive import Decision

CSV_NAME = "sweep.csv"
STREAMS_NAME = "streams.csv"
META_NAME = "meta.json"

CSV_COLUMNS = [
    "row_type", "run_id", "date", "label", "workload", "endpoint", "model", "mode", "api",
    "concurrency", "trial", "requests", "completed", "errors", "short_streams", "bunched_streams",
    "per_stream_median_tps", "per_stream_min_tps", "per_stream_p10_tps", "aggregate_tps", "output_tps",
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "output_tokens", "prompt_tokens",
    "requested_output_tokens", "temperature", "ignore_eos", "duration_s",
    "engine_version", "max_model_len", "recipe", "first_error",
    # latency SLO (--slo-*; empty without): see stats.py and definitions.LatencySLO
    "slo_attainment", "goodput_tps", "slo_met", "slo_missed_ttft", "slo_missed_rate", "slo_missed_both",
    "slo_missed_e2e",
    # how the level was chosen: its step in the run's order, `ladder` (--levels) or the adaptive
    # search's phase (start, grow, bisect; --levels auto) and the reason it gave
    "search_step", "search_phase", "search_reason",
]

STREAM_COLUMNS = [
    "label", "workload", "endpoint", "model", "concurrency", "trial", "index", "prompt_tokens",
    "output_tokens", "requested_output_tokens", "ttft_s", "decode_s", "decode_tps", "arrivals", "short",
    "bunched", "finish_reason", "error", "slo_outcome",
]


@dataclass(frozen=True)
class CurveKey:
    """One curve: a workload on one endpoint/model (the label names it in plots and tables)."""

    label: str
    workload: str
    endpoint: str
    model: str


@dataclass
class Row:
    """A trial (`trial` = 1-based index) or a point (`trial` = number of trials it aggregates)."""

    row_type: str  # "trial" | "point"
    key: CurveKey
    concurrency: int
    trial: int
    metrics: Metrics
    date: str
    mode: str
    api: str
    requested_output_tokens: int
    temperature: float
    ignore_eos: bool
    engine_version: str | None = None
    max_model_len: int | None = None
    recipe: str = ""
    run_id: str = ""
    chosen: "Decision | None" = None  # why this level was measured (ladder or adaptive search)

    def csv_row(self) -> dict:
        m = self.metrics
        row = {
            "row_type": self.row_type, "run_id": self.run_id, "date": self.date,
            "label": self.key.label, "workload": self.key.workload, "endpoint": self.key.endpoint,
            "model": self.key.model, "mode": self.mode, "api": self.api,
            "concurrency": self.concurrency, "trial": self.trial,
            "requested_output_tokens": self.requested_output_tokens,
            "temperature": self.temperature, "ignore_eos": int(self.ignore_eos),
            "engine_version": self.engine_version or "", "max_model_len": self.max_model_len or "",
            "recipe": self.recipe,
            "search_step": "" if self.chosen is None else self.chosen.step,
            "search_phase": "" if self.chosen is None else self.chosen.phase,
            "search_reason": "" if self.chosen is None else self.chosen.reason,
        }
        for name, value in asdict(m).items():
            if name == "first_error":
                row["first_error"] = value or ""
            else:
                row[name] = _fmt(value)
        return row

    def sweep_point(self) -> SweepPoint:
        m = self.metrics
        return SweepPoint(concurrency=self.concurrency, per_stream_tokens_per_second=m.per_stream_median_tps,
                          aggregate_tokens_per_second=m.aggregate_tps, ttft_p50_seconds=m.ttft_p50_s,
                          ttft_p99_seconds=m.ttft_p99_s, label=self.key.label, workload=self.key.workload,
                          trials=self.trial,
                          extra={"per_stream_min_tps": m.per_stream_min_tps,
                                 "per_stream_p10_tps": m.per_stream_p10_tps, "ttft_p90_s": m.ttft_p90_s,
                                 "short_streams": m.short_streams, "bunched_streams": m.bunched_streams,
                                 "errors": m.errors, "slo_attainment": m.slo_attainment,
                                 "goodput_tps": m.goodput_tps,
                                 "requests": m.requests, "endpoint": self.key.endpoint,
                                 "model": self.key.model})

    def to_json(self) -> dict:
        """The CSV fields as numbers, marked `measured` (fitted values live in the knee's curves)."""
        d = {k: v for k, v in self.csv_row().items()}
        for name, value in asdict(self.metrics).items():
            d[name] = value
        d["measured"] = True
        return d


def _fmt(value) -> str | int:
    if value is None:
        return ""
    if isinstance(value, float):
        if not math.isfinite(value):
            return ""
        return f"{value:.6g}" if abs(value) < 1e6 else f"{value:.1f}"
    return value


class CsvWriter:
    """A CSV written row by row (dicts) with a flush and fsync after each write, header first."""

    def __init__(self, path: Path, columns: list[str] = CSV_COLUMNS) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.path, "w", newline="", encoding="utf-8")
        self._writer = csv.DictWriter(self._fh, fieldnames=columns)
        self._writer.writeheader()
        self._sync()

    def write(self, row: "Row | dict") -> None:
        self.write_many([row])

    def write_many(self, rows: list) -> None:
        self._writer.writerows(r.csv_row() if isinstance(r, Row) else r for r in rows)
        self._sync()

    def _sync(self) -> None:
        self._fh.flush()
        try:
            os.fsync(self._fh.fileno())
        except OSError:
            pass

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def stream_rows(key: CurveKey, concurrency: int, trial: int, results: list, slo=None) -> list[dict]:
    """`streams.csv` rows: one per request of a measured trial (the client's `StreamResult`s); with a
    `LatencySLO`, each row's `slo_outcome` (met, missed_ttft, missed_rate, missed_both, or
    missed_e2e for a request that met those but not the end-to-end bound)."""
    rows = []
    for i, r in enumerate(results):
        t = r.timing
        decode = (t.last_token - t.first_token) if t.first_token is not None and t.last_token is not None else None
        rows.append({"label": key.label, "workload": key.workload, "endpoint": key.endpoint, "model": key.model,
                     "concurrency": concurrency, "trial": trial, "index": i,
                     "prompt_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
                     "requested_output_tokens": t.requested_tokens if t.requested_tokens is not None else "",
                     "ttft_s": _fmt(t.ttft), "decode_s": _fmt(decode), "decode_tps": _fmt(t.decode_rate),
                     "arrivals": r.arrivals, "short": int(t.short), "bunched": int(r.bunched),
                     "finish_reason": r.finish_reason or "", "error": t.error or "",
                     "slo_outcome": _slo_outcome(slo, t)})
    return rows


def _slo_outcome(slo, t) -> str:
    if slo is None:
        return ""
    o = slo.outcome(t)
    return "missed_e2e" if o == SLO_MET and not slo.e2e_ok(t) else o


def write_json(path: Path, data: dict) -> None:
    """Write JSON atomically (temp file + rename): readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str, allow_nan=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_csv_rows(path: Path) -> list[dict]:
    """All rows of a `sweep.csv` as dicts (strings), for tests and re-reporting."""
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


@dataclass
class RunRecord:
    """Everything a run produced so far; reports are written from it (also after an abort)."""

    run_id: str
    started: str
    config: dict
    out_dir: Path
    servers: list[dict] = field(default_factory=list)
    trials: list[Row] = field(default_factory=list)
    points: list[Row] = field(default_factory=list)
    scenarios: dict = field(default_factory=dict)
    searches: dict = field(default_factory=dict)  # CurveKey -> AdaptiveSearch.outcome() (--levels auto)
    status: str = "running"  # running | complete | interrupted | failed
    message: str = ""
    finished: str | None = None

    def curves(self) -> dict[CurveKey, list[Row]]:
        out: dict[CurveKey, list[Row]] = {}
        for p in self.points:
            out.setdefault(p.key, []).append(p)
        for rows in out.values():
            rows.sort(key=lambda r: r.concurrency)
        return out
