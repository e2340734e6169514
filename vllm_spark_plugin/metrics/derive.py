"""Pure derivations from vLLM's stats (`EngineStats`) to the values the exporter records.

No Prometheus, no vLLM imports: plain values in, plain values out.  Every value is validated: None,
NaN, infinities and negatives are dropped and counted as invalid, so a broken stat costs one sample,
never an exception in vLLM's output loop.
"""
from __future__ import annotations

import math

from vllm_spark_plugin.definitions import stream_decode_rate
from vllm_spark_plugin.metrics.engine_stats import FinishedRequest


def count(x) -> int | None:
    """A non-negative integer count, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if not math.isfinite(x) or x < 0:
        return None
    return int(x)


def seconds(x) -> float | None:
    """A non-negative finite number of seconds, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if not math.isfinite(x) or x < 0:
        return None
    return float(x)


def kv_used_from_usage(usage, total_blocks: int | None) -> int | None:
    """Blocks in use from vLLM's 0-1 usage, which excludes the pool's null block; None when either is
    unknown or the usage is not a fraction."""
    u = seconds(usage)  # same validation: finite and >= 0
    if not total_blocks or u is None or u > 1.0:
        return None
    return int(round(u * (total_blocks - 1)))


class FinishedValues:
    """What the finished requests of one step give: engine-clock rates, reasons, and per request
    (TTFT or None, decode rate or None, output tokens) for the SLO."""

    __slots__ = ("rates", "reasons", "slo", "invalid")

    def __init__(self) -> None:
        self.rates: list[float] = []
        self.reasons: list[str] = []
        self.slo: list[tuple] = []
        self.invalid = 0


def finished_values(finished: list[FinishedRequest]) -> FinishedValues:
    out = FinishedValues()
    for fr in finished:
        out.reasons.append(fr.reason)
        tokens = count(fr.generation_tokens)
        secs = seconds(fr.decode_seconds)
        if tokens is None or secs is None:
            out.invalid += 1
            continue
        rate = stream_decode_rate(tokens, secs)  # None for 0/1-token requests: no rate, not an error
        if rate is not None:
            out.rates.append(rate)
        # TTFT of the request = end-to-end latency - decode window (arrival in the API server to the
        # first token); requests without an end-to-end latency are not judged against the SLO.
        if fr.e2e_seconds is not None:
            e2e = seconds(fr.e2e_seconds)
            if e2e is None:
                out.invalid += 1
            else:
                out.slo.append((max(0.0, e2e - secs) if tokens else None, rate, tokens))
    return out
