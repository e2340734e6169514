"""One engine step as the scheduler hook measured it: `HookStep`, the record the engine core sends and
the API server records.

It owns the wire layout (`LAYOUT`, packed by the engine core into `hooks.channel` batches) and the one
validating constructor (`HookStep.from_wire`), and derives the values the instruments take (batch,
seconds, KV blocks in use, tokens per stream).  Adding a field means adding it here and where the hook
measures it; nothing else spells the layout out.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

# thirteen little-endian int64: one record per step; a batch of records is one datagram
LAYOUT = struct.Struct("<13q")
NOT_COUNTED = -1  # `kv_free` / `sampled` / the guard's fields when the hook could not count them (or the guard is off)


class InvalidStep(ValueError):
    """A record with a negative time or count: dropped and counted, never recorded."""


# Adding a per-step field (six places; docs/architecture.md, "The metrics core, per step"):
#   1. hooks/scheduler.py: measure it and pass it to `HookStep(...)`;
#   2. here: the field (a NOT_COUNTED default when a record may lack it), the count in `LAYOUT`, and
#      its check in `from_wire` when a negative value is invalid;
#   3. metrics/names.py: its one `_metric(...)` declaration (name, kind, attribute, labels, help,
#      buckets; `per_engine=True` makes `EngineChildren` cache its child), which also creates it;
#   4. metrics/engine.py: the line of `EngineState.record_step` that writes it;
#   5. grafana/dashboards.py: its panel (then `vllm-spark dashboards` regenerates dashboards/);
#   6. docs/metrics.md: its row of the metric contract.
class HookStep(NamedTuple):
    engine: int          # data-parallel rank of the engine core
    step_us: int         # wall time of the step, microseconds
    prefill_reqs: int    # requests prefilling in the step (new, or a continuing chunked prefill)
    prefill_tokens: int
    decode_reqs: int
    decode_tokens: int
    kv_free: int         # free KV blocks after the step (NOT_COUNTED: unknown)
    kv_total: int        # blocks in the pool, vLLM's null block included (0: unknown)
    sampled: int         # tokens the step produced; counted only with speculative decoding, else NOT_COUNTED
    # the SLO guard (guard/, hooks.guard); NOT_COUNTED while it is off or has no verdict
    guard_limit: int = NOT_COUNTED     # the admission cap in force (running requests allowed)
    guard_held: int = NOT_COUNTED      # waiting requests the cap holds back now
    guard_budget: int = NOT_COUNTED    # prefill tokens a step may take while decode streams run
    guard_wait_us: int = NOT_COUNTED   # how long one request admitted after being held waited, microseconds

    @classmethod
    def from_wire(cls, fields) -> "HookStep":
        """The one way a record becomes a step: raises InvalidStep naming the first bad field."""
        step = cls(*fields)  # the guard's fields default to NOT_COUNTED when a record lacks them
        if step.step_us < 0 or step.prefill_reqs < 0 or step.prefill_tokens < 0 or step.decode_reqs < 0 \
                or step.decode_tokens < 0:
            bad = next(n for n in ("step_us", "prefill_reqs", "prefill_tokens", "decode_reqs", "decode_tokens")
                       if getattr(step, n) < 0)
            raise InvalidStep(f"{bad} = {getattr(step, bad)} < 0")
        return step

    def pack(self) -> bytes:
        return LAYOUT.pack(*self)

    @property
    def batch(self) -> int:
        """Requests scheduled in the step: the batch that shared the forward pass."""
        return self.prefill_reqs + self.decode_reqs

    @property
    def seconds(self) -> float:
        return self.step_us * 1e-6

    @property
    def kv_used(self) -> int | None:
        """Blocks in use: vLLM's pool keeps one null block out of circulation, so total - 1 - free."""
        if self.kv_total <= 0 or self.kv_free < 0:
            return None
        return max(0, self.kv_total - 1 - self.kv_free)

    @property
    def tokens_per_stream(self) -> float:
        """Tokens each stream got from the step (above 1 only with speculative decoding)."""
        batch = self.prefill_reqs + self.decode_reqs
        if self.sampled < 0 or not batch:
            return 1.0
        return max(1.0, self.sampled / batch)


def read_records(data: bytes) -> Iterator[tuple]:
    """The whole records of one datagram, as wire tuples (a torn tail is ignored)."""
    usable = len(data) - len(data) % LAYOUT.size
    return LAYOUT.iter_unpack(data[:usable])
