"""Pure derivations from one engine step's stats to the values the exporter records.

No Prometheus, no vLLM imports: `StepStats` (from `hooks.stats`) in, plain numbers out.  Every
value is validated: None, NaN, infinities and negatives are dropped and counted in `invalid`,
so a broken stat costs one sample, never an exception in vLLM's output loop.
"""
from __future__ import annotations

import math

from vllm_spark_plugin.metrics.stepstats import StepStats
from vllm_spark_plugin.definitions import stream_decode_rate


def _count(x) -> int | None:
    """A non-negative integer count, or None."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if not math.isfinite(x) or x < 0:
        return None
    return int(x)


def _seconds(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    if not math.isfinite(x) or x < 0:
        return None
    return float(x)


class DerivedStep:
    __slots__ = ("batch", "prefill_tokens", "decode_tokens", "step_seconds", "kv_used", "kv_total",
                 "running", "waiting", "generation_tokens", "prompt_tokens", "preempted", "ttfts",
                 "stream_rates", "finished_reasons", "finished_slo", "tokens_per_stream", "invalid",
                 "count_batch")

    def __init__(self) -> None:
        self.batch = None
        self.count_batch = True  # False when the scheduler hook's records count this engine's batches
        self.prefill_tokens = None
        self.decode_tokens = None
        self.step_seconds = None
        self.kv_used = None
        self.kv_total = None
        self.running = None
        self.waiting = None
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.preempted = 0
        self.ttfts: list[float] = []
        self.stream_rates: list[float] = []
        self.finished_reasons: list[str] = []
        # (TTFT or None, decode rate or None, output tokens) of each finished request, for the SLO
        self.finished_slo: list[tuple] = []
        self.tokens_per_stream = 1.0
        self.invalid = 0


def derive(s: StepStats, config_total_blocks: int | None = None) -> DerivedStep:
    d = DerivedStep()
    bad = s.missing
    if s.has_scheduler_stats:
        d.running = _count(s.running)
        bad += d.running is None and s.missing == 0
        if s.waiting is not None:
            d.waiting = _count(s.waiting)
            bad += d.waiting is None
        # The step's batch: requests scheduled in it (exact, from the scheduler hook), else the
        # running count vLLM reports after the step (unless the hook's records carry the batch).
        pr, dr = _count(s.prefill_reqs), _count(s.decode_reqs)
        if pr is not None and dr is not None:
            d.batch = pr + dr
        else:
            d.batch = d.running
            d.count_batch = s.batch_from_running
        if s.step_seconds is not None:
            d.step_seconds = _seconds(s.step_seconds)
            bad += d.step_seconds is None
            d.prefill_tokens = _count(s.prefill_tokens)
            d.decode_tokens = _count(s.decode_tokens)
        # KV blocks: vLLM's pool keeps one null block out of circulation, so used = total - 1 - free.
        total = _count(s.kv_total_blocks) or config_total_blocks
        d.kv_total = total
        free = _count(s.kv_free_blocks)
        if total and free is not None:
            d.kv_used = max(0, total - 1 - free)
        elif total and s.kv_usage is not None:
            u = _seconds(s.kv_usage)  # same validation: finite and >= 0
            if u is None or u > 1.0:
                bad += 1
            else:
                d.kv_used = int(round(u * (total - 1)))
    g = _count(s.generation_tokens)
    d.generation_tokens = g or 0
    bad += g is None
    p = _count(s.prompt_tokens)
    d.prompt_tokens = p or 0
    bad += p is None
    pre = _count(s.preempted)
    d.preempted = pre or 0
    bad += pre is None
    for t in s.ttfts:
        v = _seconds(t)
        if v is None:
            bad += 1
        else:
            d.ttfts.append(v)
    for fr in s.finished:
        d.finished_reasons.append(fr.reason)
        tokens = _count(fr.generation_tokens)
        secs = _seconds(fr.decode_seconds)
        if tokens is None or secs is None:
            bad += 1
            continue
        rate = stream_decode_rate(tokens, secs)  # None for 0/1-token requests: no rate, not an error
        if rate is not None:
            d.stream_rates.append(rate)
        # TTFT of the request = end-to-end latency - decode window (arrival in the API server to the
        # first token); requests without an end-to-end latency are not judged against the SLO.
        e2e = getattr(fr, "e2e_seconds", None)
        if e2e is not None:
            e2e = _seconds(e2e)
            if e2e is None:
                bad += 1
            else:
                d.finished_slo.append((max(0.0, e2e - secs) if tokens else None, rate, tokens))
    # Speculative decoding: a step can yield several tokens per stream; rates then count tokens.
    if s.sampled_tokens is not None and d.batch:
        d.tokens_per_stream = max(1.0, s.sampled_tokens / d.batch)
    elif s.spec_decoding and d.batch:
        d.tokens_per_stream = max(1.0, d.generation_tokens / d.batch)
    d.invalid = bad
    return d
