"""The measurement definitions of the seed documents, in one place.

Both the server-side exporter and the client-side benchmark compute their numbers here, so the two
sides agree by construction (seed 003, "Measurement protocol"):

* per-stream decode rate = (output tokens - 1) / (time of last token - time of first token);
* within a trial take the median across streams, then the median across trials;
* aggregate throughput = sum over streams of (output tokens - 1) /
  (latest last token - earliest first token); it is not concurrency x median stream rate;
* TTFT (queueing + prefill) is reported separately;
* capacity reference: the highest concurrency whose median per-stream rate is >= 20 tok/s.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field, asdict
from typing import Iterable, Sequence

DEFAULT_FLOOR_TOKENS_PER_SECOND = 20.0  # seed 003's capacity reference


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
