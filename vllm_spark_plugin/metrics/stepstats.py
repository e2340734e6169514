"""One engine step as the plugin sees it, in plain types (no vLLM): what `hooks.stats` reads out of
vLLM's stats objects and the scheduler hook's records, and what `derive` turns into values."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class FinishedRequest:
    generation_tokens: int | None
    decode_seconds: float | None  # first token -> last token, engine-core clock
    prompt_tokens: int | None
    reason: str
    e2e_seconds: float | None = None  # arrival in the API server -> last token (vLLM's e2e_latency)


@dataclass
class StepStats:
    """One engine step as the API server receives it (None = not known)."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None  # 0..1, excludes vLLM's null block
    # from the scheduler hook (None when the hook is off or the step came from elsewhere)
    step_seconds: float | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    prefill_reqs: int | None = None
    decode_reqs: int | None = None
    kv_free_blocks: int | None = None
    kv_total_blocks: int | None = None
    spec_decoding: bool = False
    scheduler_present: bool = False
    # False once the engine's steps arrive through the scheduler hook: the batch is theirs then
    batch_from_running: bool = True
    sampled_tokens: int | None = None  # tokens the step produced (hook, speculative decoding only)
    missing: int = 0  # expected fields absent from vLLM's objects (a renamed field, a broken object)
    # from IterationStats
    generation_tokens: int = 0
    prompt_tokens: int = 0
    preempted: int = 0
    ttfts: list = field(default_factory=list)
    finished: list = field(default_factory=list)

    @property
    def has_scheduler_stats(self) -> bool:
        return self.scheduler_present
