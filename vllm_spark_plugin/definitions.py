"""The measurement definitions of the seed documents, in one place.

Both the server-side exporter and the client-side benchmark compute their numbers here, so the two
sides agree by construction (seed 003, "Measurement protocol"):

* per-stream decode rate = (output tokens - 1) / (time of last token - time of first token);
* within a trial take the median across streams, then the median across trials;
* aggregate throughput = sum over streams of (output tokens - 1) /
  (latest last token - earliest first token); it is not concurrency x median stream rate;
* TTFT (queueing + prefill) is reported separately;
* capacity reference: the highest concurrency whose median per-stream rate is >= 20 tok/s;
* latency SLO (`slo_outcome`): a request meets it when its TTFT is within the TTFT SLO and its
  per-stream decode rate is at least the floor; a request with no decode rate (fewer than 2 output
  tokens, or every token delivered with the first) is judged on TTFT alone, and a request that
  produced no token missed its TTFT.  Attainment = met / judged requests; goodput = output tokens of
  the requests that met the SLO per second.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, asdict
from typing import Iterable, Sequence

DEFAULT_FLOOR_TOKENS_PER_SECOND = 20.0  # seed 003's capacity reference
DEFAULT_TTFT_SLO_SECONDS = 2.0  # seed 001: median TTFT reached about 2 s at 64 streams

# --------------------------------------------------------------------------------------------------
# Histogram bucket bounds (the metric contract's, `metrics.names`).
# Batch sizes are integers: bounds sit on them so "le=16" means "at most 16".
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
STEP_TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768)
STEP_DURATION_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05,
                         0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)
# SLO-grade: the usual TTFT SLOs (0.2, 0.5, 1, 2, 3, 5 s) are bounds; the exporter adds the configured
# one (`with_slo_bounds`), so any TTFT SLO is exact.
TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 30.0, 60.0)
# Per-stream decode rate: steps of at most ~10%, so a median read from the histogram is within a few
# percent of the true one from 1 tok/s (a loaded Spark) to 2,000 tok/s (a tiny model on a CPU); the
# 20 tok/s floor of seed 003 (and 5, 10, 15, 30, 40, 60) are bounds, and the exporter adds every
# configured floor (`with_slo_bounds`), so SLO queries are exact at any floor.
STREAM_RATE_BUCKETS = (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 26, 28,
                       30, 33, 36, 40, 44, 48, 52, 56, 60, 65, 70, 75, 80, 90, 100, 110, 120, 130, 140,
                       150, 165, 180, 200, 220, 240, 260, 280, 300, 330, 360, 400, 440, 480, 520, 560,
                       600, 650, 700, 750, 800, 900, 1000, 1100, 1200, 1350, 1500, 1750, 2000)


def with_slo_bounds(defaults: Sequence[float], thresholds: Iterable[float]) -> tuple[float, ...]:
    """A histogram's bucket bounds with the SLO thresholds added: sorted, duplicates dropped.  The
    exporter's histograms and the generated rules' `le` selectors both come from these values."""
    return tuple(sorted({float(b) for b in defaults} | {float(t) for t in thresholds}))


def floor_label(floor: float) -> str:
    """A floor as a `floor` label value and key: 20.0 -> '20', 12.5 -> '12.5'; never rounded, so two
    floors never share a label (`repr` where six significant digits would lose the value)."""
    f = float(floor)
    text = f"{f:g}"
    return text if float(text) == f else repr(f)


# --------------------------------------------------------------------------------------------------
# The SLO rule: one check for the exporter's settings and the dashboard/rule generator.  Any positive,
# finite TTFT SLO and floor is an SLO: the per-request SLO counters judge each request exactly, and the
# histogram-based rules (error ratio = 1 - bucket{le=T} / count) are exact because the exporter makes
# each configured value a bucket bound (`with_slo_bounds`), so the rules generated with the same values
# select buckets that exist.
class SLOError(ValueError):
    """An SLO threshold the exporter, the dashboards and the rules cannot use; the message says the
    fix, and the caller prefixes the setting or flag and the value it came from."""


def _positive_number(raw, what: str) -> float:
    if isinstance(raw, bool):
        raise SLOError(f"expected {what}")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        raise SLOError(f"expected {what}") from None
    if not (math.isfinite(v) and v > 0):
        raise SLOError(f"expected {what}")
    return v


def check_ttft_slo(raw) -> float:
    """The TTFT SLO in seconds: a positive, finite number."""
    return _positive_number(raw, "a positive number of seconds, e.g. 2")


def check_floor(raw) -> float:
    """One per-stream floor in tok/s: a positive, finite number."""
    return _positive_number(raw, "a positive number of tok/s, e.g. 20")


def check_floors(raw, dropped: list | None = None) -> tuple[float, ...]:
    """Comma-separated (or a list of) floors, each as `check_floor`; sorted, duplicates dropped.

    With `dropped` (a list), each bad item is named there with the fix and the others are kept;
    without it the first bad item raises.  Raises SLOError when no floor is left.
    """
    items = raw if isinstance(raw, (list, tuple)) else str(raw).split(",")
    vals, bad = set(), []
    for item in (x for x in items if str(x).strip()):
        try:
            vals.add(check_floor(item))
        except SLOError as exc:
            bad.append(f"floor {str(item).strip()!r}: {exc}")
            if dropped is None:
                break
    if bad and (dropped is None or not vals):
        raise SLOError("; ".join(bad))
    if not vals:
        raise SLOError("expected comma-separated positive tok/s values, e.g. 20,60")
    if dropped is not None:
        dropped.extend(bad)
    return tuple(sorted(vals))


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def stream_decode_rate(output_tokens, decode_seconds, first_arrival_tokens: int = 1) -> float | None:
    """(output tokens - 1) / (last token time - first token time); None when undefined.

    `decode_seconds` is the interval from the first to the last token.  A stream with fewer than two
    tokens or a non-positive interval has no decode rate (it is not a rate of 0).

    A streaming server coalesces tokens into one chunk when its reader falls behind, so a client can
    see its first chunk carry k > 1 tokens.  Those k - 1 tokens did not take the interval to arrive:
    with `first_arrival_tokens=k` the rate is (output tokens - k) / interval, which is the seed
    definition when every token arrives on its own (k = 1).
    """
    if not (_finite(output_tokens) and _finite(decode_seconds)):
        return None
    k = first_arrival_tokens if _finite(first_arrival_tokens) and first_arrival_tokens >= 1 else 1
    if output_tokens - k < 1 or decode_seconds <= 0:
        return None
    return (output_tokens - k) / decode_seconds


@dataclass(frozen=True)
class StreamTiming:
    """One streamed request as the client saw it (times in seconds on one monotonic clock)."""

    output_tokens: int
    start: float  # request sent
    first_token: float | None
    last_token: float | None
    prompt_tokens: int = 0
    requested_tokens: int | None = None
    error: str | None = None
    first_arrival_tokens: int = 1  # tokens in the first chunk (coalesced by a busy server)

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    @property
    def decode_rate(self) -> float | None:
        if self.first_token is None or self.last_token is None:
            return None
        return stream_decode_rate(self.output_tokens, self.last_token - self.first_token, self.first_arrival_tokens)

    @property
    def short(self) -> bool:
        """Ended before the requested length (flagged, never silently averaged)."""
        return self.requested_tokens is not None and self.output_tokens < self.requested_tokens


def aggregate_throughput(streams: Iterable[StreamTiming]) -> float | None:
    """Sum of (output tokens - 1) over streams / (latest last token - earliest first token)."""
    ok = [s for s in streams if s.error is None and s.first_token is not None
          and s.last_token is not None and s.output_tokens >= 1]
    if not ok:
        return None
    span = max(s.last_token for s in ok) - min(s.first_token for s in ok)
    tokens = sum(s.output_tokens - 1 for s in ok)
    if span <= 0 or tokens <= 0:
        return None
    return tokens / span


def median(values: Iterable[float]) -> float | None:
    vals = [v for v in values if _finite(v)]
    return statistics.median(vals) if vals else None


def median_of_medians(trials: Iterable[Iterable[float]]) -> float | None:
    """Median across streams within each trial, then the median across trials."""
    return median(m for m in (median(t) for t in trials) if m is not None)


def quantile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated quantile (numpy's default), q in [0, 1]."""
    vals = sorted(v for v in values if _finite(v))
    if not vals:
        return None
    pos = (len(vals) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(vals) - 1)
    return vals[lo] + (vals[hi] - vals[lo]) * (pos - lo)


@dataclass
class SweepPoint:
    """One concurrency level of a sweep: what the knee fit and the planner consume."""

    concurrency: float
    per_stream_tokens_per_second: float | None  # median (of medians) per-stream decode rate
    aggregate_tokens_per_second: float | None
    ttft_p50_seconds: float | None = None
    ttft_p99_seconds: float | None = None
    label: str = ""  # model / recipe / endpoint: one curve per label
    workload: str = ""
    trials: int = 1
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def capacity_at_floor(points: Sequence[SweepPoint], floor: float = DEFAULT_FLOOR_TOKENS_PER_SECOND,
                      ttft_bound_seconds: float | None = None) -> float | None:
    """Highest measured concurrency whose median per-stream rate is >= floor (seed 003).

    With `ttft_bound_seconds`, the point's median TTFT must also be within the bound.
    None when no measured point qualifies.
    """
    best = None
    for p in points:
        rate = p.per_stream_tokens_per_second
        if rate is None or rate < floor:
            continue
        if ttft_bound_seconds is not None and (p.ttft_p50_seconds is None or p.ttft_p50_seconds > ttft_bound_seconds):
            continue
        best = p.concurrency if best is None else max(best, p.concurrency)
    return best


# --------------------------------------------------------------------------------------------------
# Latency SLO: one classification for the exporter (per finished request) and the benchmark (per
# streamed request).
SLO_MET = "met"
SLO_MISSED_TTFT = "missed_ttft"
SLO_MISSED_RATE = "missed_rate"
SLO_MISSED_BOTH = "missed_both"
SLO_OUTCOMES = (SLO_MET, SLO_MISSED_TTFT, SLO_MISSED_RATE, SLO_MISSED_BOTH)


def slo_outcome(ttft_seconds: float | None, decode_rate: float | None,
                ttft_slo_seconds: float | None, floor_tokens_per_second: float | None) -> str:
    """met / missed_ttft / missed_rate / missed_both for one request.

    * TTFT is met when `ttft_seconds <= ttft_slo_seconds` (a bound of None is no bound); a request
      with no first token (`ttft_seconds` None) missed it;
    * the rate is met when `decode_rate >= floor_tokens_per_second` (None floor: no bound);
      `decode_rate` None means the request has no decode rate (fewer than 2 output tokens, or its
      tokens came all at once): it is judged on TTFT alone.
    """
    ttft_ok = _finite(ttft_seconds) and (ttft_slo_seconds is None or ttft_seconds <= ttft_slo_seconds)
    rate_ok = (decode_rate is None or floor_tokens_per_second is None
               or (_finite(decode_rate) and decode_rate >= floor_tokens_per_second))
    if ttft_ok:
        return SLO_MET if rate_ok else SLO_MISSED_RATE
    return SLO_MISSED_TTFT if rate_ok else SLO_MISSED_BOTH


@dataclass(frozen=True)
class LatencySLO:
    """A latency SLO as the benchmark applies it: TTFT bound, per-stream floor, optional end-to-end
    bound (request sent to last token; the exporter has no end-to-end bound)."""

    ttft_seconds: float | None = None
    floor_tokens_per_second: float | None = None
    e2e_seconds: float | None = None
    target: float = 0.99  # attainment a point must reach to count as meeting the SLO

    def outcome(self, s: "StreamTiming") -> str:
        """TTFT/rate outcome of a streamed request (the end-to-end bound is judged by `met`)."""
        if s.error is not None or s.first_token is None or s.output_tokens < 1:
            return slo_outcome(None, None, self.ttft_seconds, self.floor_tokens_per_second)
        return slo_outcome(s.ttft, s.decode_rate, self.ttft_seconds, self.floor_tokens_per_second)

    def e2e_ok(self, s: "StreamTiming") -> bool:
        if self.e2e_seconds is None:
            return True
        return s.error is None and s.last_token is not None and s.last_token - s.start <= self.e2e_seconds

    def met(self, s: "StreamTiming") -> bool:
        return self.outcome(s) == SLO_MET and self.e2e_ok(s)


@dataclass
class SLOTally:
    """Per-outcome counts of requests and of their output tokens; attainment and goodput."""

    requests: dict = field(default_factory=lambda: dict.fromkeys(SLO_OUTCOMES, 0))
    tokens: dict = field(default_factory=lambda: dict.fromkeys(SLO_OUTCOMES, 0))
    met: int = 0             # met the TTFT/rate SLO and the end-to-end bound, if any
    met_tokens: int = 0
    missed_e2e: int = 0      # met TTFT and rate but not the end-to-end bound

    def add(self, slo: LatencySLO, s: "StreamTiming") -> None:
        o = slo.outcome(s)
        tokens = s.output_tokens if s.error is None else 0
        self.requests[o] += 1
        self.tokens[o] += tokens
        if o == SLO_MET:
            if slo.e2e_ok(s):
                self.met += 1
                self.met_tokens += tokens
            else:
                self.missed_e2e += 1

    @property
    def total(self) -> int:
        return sum(self.requests.values())

    @property
    def attainment(self) -> float | None:
        """Share of the requests that met the SLO; None without requests."""
        return self.met / self.total if self.total else None

    def goodput(self, seconds: float) -> float | None:
        """Output tokens of the requests that met the SLO, per second of wall time."""
        return self.met_tokens / seconds if seconds > 0 and self.total else None


def slo_tally(slo: LatencySLO, streams: Iterable["StreamTiming"]) -> SLOTally:
    t = SLOTally()
    for s in streams:
        t.add(slo, s)
    return t


def highest_concurrency_meeting(points: Iterable[tuple[float, float | None]], target: float) -> float | None:
    """Highest concurrency whose attainment is >= target; `points` are (concurrency, attainment)."""
    ok = [c for c, a in points if a is not None and a >= target]
    return max(ok) if ok else None
