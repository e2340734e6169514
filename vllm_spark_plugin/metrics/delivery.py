"""One request as its client receives it: the delivery clock of the per-stream rate and the SLO.

The engine core stamps each token when it is sampled; the client sees it only after the API server
has processed the engine's output, handed it to the request's handler and written it out.  Under
load the handler falls behind and vLLM merges the waiting outputs into one, so the client receives
tokens in bursts the engine-core clock never shows (issue: user-facing rate).  `Delivery` times each
output where the API server hands it to the request's handler (`hooks.delivery`), the last point the
server controls before the HTTP write, and counts the tokens in each hand-off the way the client
counts them in each chunk: the first hand-off's tokens are `first_arrival_tokens` of
`definitions.stream_decode_rate`.

Pure: no vLLM, no Prometheus.  Times are seconds on one clock (`time.monotonic`).
"""
from __future__ import annotations

from dataclasses import dataclass

from vllm_spark_plugin.definitions import stream_decode_rate


@dataclass(frozen=True)
class Delivered:
    """A finished request on the delivery clock (what `EngineState.record_delivered` takes)."""

    ttft: float | None          # request handed to the engine -> first token handed to its handler
    decode_rate: float | None   # definitions.stream_decode_rate on the hand-off times; None: < 2 tokens
    output_tokens: int
    streamed: bool              # False: the client got every token at once (no per-stream rate to see)


class Delivery:
    """Accumulates one request's hand-offs.  `see` is on the API server's hot path: O(1), no allocation."""

    __slots__ = ("start", "first", "last", "tokens", "first_tokens", "cumulative")

    def __init__(self, start: float, cumulative: bool = False) -> None:
        self.start = start
        self.first: float | None = None
        self.last: float | None = None
        self.tokens = 0
        self.first_tokens = 0
        self.cumulative = cumulative  # outputs carry every token so far, not the new ones

    def see(self, now: float, tokens: int) -> None:
        """One hand-off carrying `tokens` (new tokens, or the total so far when cumulative)."""
        new = tokens - self.tokens if self.cumulative else tokens
        if new <= 0:
            return  # an output without tokens (a finish marker, a stop string trimmed away)
        self.tokens += new
        if self.first is None:
            self.first = now
            self.first_tokens = new
        self.last = now

    def result(self) -> Delivered:
        if self.first is None:
            return Delivered(None, None, 0, True)
        rate = stream_decode_rate(self.tokens, self.last - self.first, self.first_tokens)
        return Delivered(max(0.0, self.first - self.start), rate, self.tokens, True)


def not_streamed(ttft, decode_seconds, output_tokens) -> Delivered:
    """A request answered in one piece: its client sees no first token and no rate of its own, so it
    is judged on vLLM's figures (TTFT at output processing, decode window on the engine-core clock)."""
    ok = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and x == x and x >= 0  # noqa: E731
    tokens = int(output_tokens) if ok(output_tokens) else 0
    rate = stream_decode_rate(tokens, decode_seconds) if ok(decode_seconds) else None
    return Delivered(float(ttft) if ok(ttft) else None, rate, tokens, False)
