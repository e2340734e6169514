"""What vLLM's own stats objects say about one engine step, in plain types (no vLLM): what
`hooks.stats.read` fills from `SchedulerStats` and `IterationStats` in the API server, and what
`EngineState.record_stats` records.  The step's exact batch, time and KV blocks come from the
scheduler hook instead (`metrics.step.HookStep`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class FinishedRequest:
    generation_tokens: int | None
    decode_seconds: float | None  # first token -> last token, engine-core clock
    prompt_tokens: int | None
    reason: str
    e2e_seconds: float | None = None  # arrival in the API server -> last token (vLLM's e2e_latency)


class EngineStats:
    """One engine step as vLLM's stat loggers receive it (None = not known).  Slots, no per-step
    lists of its own: the TTFT and finished lists are vLLM's (or one shared empty tuple)."""

    __slots__ = ("running", "waiting", "kv_usage", "generation_tokens", "prompt_tokens", "preempted",
                 "ttfts", "finished", "missing")

    def __init__(self, running=None, waiting=None, kv_usage=None, generation_tokens=0, prompt_tokens=0,
                 preempted=0, ttfts=(), finished=(), missing: int = 0) -> None:
        self.running = running        # requests running after the step (None: no scheduler stats)
        self.waiting = waiting
        self.kv_usage = kv_usage      # 0..1, excludes vLLM's null block
        self.generation_tokens = generation_tokens
        self.prompt_tokens = prompt_tokens
        self.preempted = preempted
        self.ttfts = ttfts            # seconds, one per request that got its first token in the step
        self.finished = finished      # FinishedRequest, one per request that finished in the step
        self.missing = missing        # expected fields absent from vLLM's objects (a renamed field)
