"""The admission policies: one interface, one registry row each.  The scenario matrix (`benchmarks/guard_matrix.py`, tests/unit) runs every
row, so the next policy is one module and one row here.  `Guard` builds the one it is given by name
(`DEFAULT_POLICY` in the engine core).

The interface (what `Guard` calls, on the engine core's step path; `now` is the guard's clock):

* `observe_step(batch, prefill_tokens, seconds)`: every engine step (O(1));
* `observe_finished(seconds_per_token, mean_batch)`: each finished request's decode time per token on
  the engine clock (`definitions.stream_decode_rate`, inverted) and the mean batch of its steps;
* `observe_feedback(ratio)`: the delivery clock's seconds per token over the engine's (API server);
* `refit(now, ttft_streams) -> str | None`: once per refit period; the moves since the last one, one
  line each (`before -> cap [rule] (what it read)`), or None;
* `limit(running, waiting) -> int | None`: this step's limit (None: vLLM's own), never below `running`;
* `cap`, `state`, `moves`: the cap in force, the loop's state and how often the cap moved.
"""
from __future__ import annotations

from typing import Protocol

from .loop import LoopPolicy


class AdmissionPolicy(Protocol):
    name: str
    cap: int | None
    state: str
    moves: int

    def observe_step(self, batch: int, prefill_tokens: int, seconds: float) -> None: ...
    def observe_finished(self, seconds_per_token: float, mean_batch: float) -> None: ...
    def observe_feedback(self, ratio: float) -> None: ...
    def refit(self, now: float, ttft_streams: int | None = None) -> str | None: ...
    def limit(self, running: int, waiting: int) -> int | None: ...


POLICIES = {LoopPolicy.name: LoopPolicy}  # name -> class(floor, max_num_seqs, prior)
DEFAULT_POLICY = LoopPolicy.name


def build(name: str, floor: float, max_num_seqs: int, prior: tuple[float, float] | None = None) -> AdmissionPolicy:
    if name not in POLICIES:
        raise ValueError(f"guard policy must be one of {', '.join(POLICIES)}, got {name!r}")
    return POLICIES[name](floor, max_num_seqs, prior)
