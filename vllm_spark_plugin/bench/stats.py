"""Per-trial and per-point numbers, computed with the seed definitions (`definitions.py`).

For a point (one concurrency level of one workload on one endpoint) made of several trials:

* per-stream decode rate: median across streams within each trial, then the median across trials
  (`median_of_medians`); min and p10 are taken over every stream of every trial;
* aggregate throughput: the seed definition per trial, then the median across trials;
* TTFT p50/p90/p99 over every stream of every trial;
* output-length validation: streams that ended before the requested length are counted in
  `short_streams` and, unless asked otherwise, left out of the per-stream rate statistics (they are
  shorter, hence faster, streams: averaging them in silently would flatter the point).  Aggregate
  throughput counts every completed stream's tokens: it is work the server did;
* delivery validation: streams the server delivered in a few bursts (`bunched_streams`, see
  `client.is_bunched`) carry no decode timing; they are counted and left out of the per-stream
  rates and of the aggregate's token sum and time span (output tok/s and TTFT keep them);
* latency SLO (with `--slo-*`): every request of every trial is judged as the user saw it
  (`definitions.LatencySLO`: short and bunched streams too, a failed request never meets it);
  attainment = requests that met it / requests sent, goodput = output tokens of those requests /
  wall time of the trial(s) (the same time base as output tok/s).

A trial row uses the same function with a single trial.  Streams are `StreamTiming`s or the
client's `StreamResult`s (which also know whether they arrived bunched).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence, Union

from ..definitions import (SLO_MISSED_BOTH, SLO_MISSED_RATE, SLO_MISSED_TTFT, LatencySLO, StreamTiming,
                           aggregate_throughput, median, median_of_medians, quantile, slo_tally)
from .client import StreamResult

Stream = Union[StreamTiming, StreamResult]


@dataclass
class Metrics:
    requests: int
    completed: int
    errors: int
    short_streams: int
    bunched_streams: int
    per_stream_median_tps: float | None
    per_stream_min_tps: float | None
    per_stream_p10_tps: float | None
    aggregate_tps: float | None
    output_tps: float | None  # output tokens / wall time of the trial(s) (vllm bench's definition)
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    ttft_p99_s: float | None
    output_tokens: int
    prompt_tokens: int
    duration_s: float
    first_error: str | None = None
    # latency SLO (None without --slo-*): requests by outcome, attainment, goodput
    slo_attainment: float | None = None
    goodput_tps: float | None = None
    slo_met: int | None = None
    slo_missed_ttft: int | None = None
    slo_missed_rate: int | None = None
    slo_missed_both: int | None = None
    slo_missed_e2e: int | None = None


def _timing(s: Stream) -> StreamTiming:
    return s.timing if isinstance(s, StreamResult) else s


def _bunched(s: Stream) -> bool:
    return isinstance(s, StreamResult) and s.timing.error is None and s.bunched


def _rates(streams: Sequence[Stream], include_short: bool) -> list[float]:
    return [r for s in streams if not _bunched(s)
            for t in (_timing(s),) if t.error is None and (include_short or not t.short)
            for r in (t.decode_rate,) if r is not None]


def summarize(trials: Sequence[Sequence[Stream]], durations: Sequence[float],
              include_short: bool = False, slo: LatencySLO | None = None) -> Metrics:
    """Metrics of one point (or one trial, with a single entry in `trials`)."""
    timings = [[_timing(s) for s in t] for t in trials]
    all_streams = [s for t in timings for s in t]
    ok = [s for s in all_streams if s.error is None]
    per_trial_rates = [_rates(t, include_short) for t in trials]
    pooled = [r for rates in per_trial_rates for r in rates]
    timed = [[_timing(s) for s in t if not _bunched(s)] for t in trials]  # streams with real timings
    aggregates = [a for a in (aggregate_throughput(t) for t in timed) if a is not None]
    ttfts = [s.ttft for s in ok if s.ttft is not None]
    out_tokens = sum(s.output_tokens for s in ok)
    duration = float(sum(durations))
    errors = [s.error for s in all_streams if s.error is not None]
    slo_fields = {}
    if slo is not None:
        t = slo_tally(slo, all_streams)
        slo_fields = dict(slo_attainment=t.attainment, goodput_tps=t.goodput(duration), slo_met=t.met,
                          slo_missed_ttft=t.requests[SLO_MISSED_TTFT], slo_missed_rate=t.requests[SLO_MISSED_RATE],
                          slo_missed_both=t.requests[SLO_MISSED_BOTH], slo_missed_e2e=t.missed_e2e)
    return Metrics(
        requests=len(all_streams),
        completed=len(ok),
        errors=len(errors),
        short_streams=sum(1 for s in ok if s.short),
        bunched_streams=sum(1 for t in trials for s in t if _bunched(s)),
        per_stream_median_tps=median_of_medians(per_trial_rates),
        per_stream_min_tps=min(pooled) if pooled else None,
        per_stream_p10_tps=quantile(pooled, 0.10),
        aggregate_tps=median(aggregates),
        output_tps=(out_tokens / duration) if duration > 0 and ok else None,
        ttft_p50_s=quantile(ttfts, 0.50),
        ttft_p90_s=quantile(ttfts, 0.90),
        ttft_p99_s=quantile(ttfts, 0.99),
        output_tokens=out_tokens,
        prompt_tokens=sum(s.prompt_tokens for s in ok),
        duration_s=duration,
        first_error=errors[0] if errors else None,
        **slo_fields,
    )
