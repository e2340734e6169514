"""One request as its client receives it: the delivery clock of the per-stream rate and the SLO.

The engine core stamps each token when it is sampled; the client sees it only after the API server
has processed the engine's output, handed it to the request's handler and written it out.  Under
load the handler falls behind and vLLM merges the waiting outputs into one, so the client receives
tokens in bursts the engine-core clock never shows (issue: user-facing rate).  `Delivery` times each
output where the API server hands it to the request's handler (`hooks.delivery`), the last point the
server controls before the HTTP write, and counts the tokens in each hand-off the way the client
counts them in each chunk: the first hand-off's tokens are `first_arrival_tokens` of
`definitions.stream_decode_rate`.

Pure: no vLLM, no Prometheus.  Times are seconds on one clock (`time.monotonic`).  The guard's
feedback file (`FeedbackWriter`, `FeedbackReader`) carries the delivery clock's ratio to the engine
clock from the API server to the engine core.
"""
from __future__ import annotations

import math
import os
from collections import deque
from dataclasses import dataclass

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.definitions import quantile, stream_decode_rate


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


# -- the guard's feedback: the delivery clock against the engine clock (docs/guard.md, "The loop") ------
FEEDBACK_FILE = "guard-feedback"  # in the server's run directory (hooks.channel.run_dir)
FEEDBACK_KEEP = 64                # the newest finished requests the ratio is read from
FEEDBACK_MIN = 8
FEEDBACK_QUANTILE = 0.9           # the quantile the floor is judged at


class FeedbackWriter:
    """API server side: each finished streamed request's seconds per token on the delivery clock and on
    the engine-core clock (vLLM's first/last token stamps); every `every` seconds, the ratio of their
    90th percentiles written to the run directory (a temporary file renamed over the last: a reader
    never sees half a number).  `add` costs two appends; errors are the caller's to contain."""

    def __init__(self, directory: str, every: float = 5.0, clock=None) -> None:
        import time
        self.path = os.path.join(directory, FEEDBACK_FILE)
        self.every = every
        self._clock = clock or time.monotonic
        self._next = self._clock() + every
        self.delivered: deque = deque(maxlen=FEEDBACK_KEEP)
        self.engine: deque = deque(maxlen=FEEDBACK_KEEP)

    def add(self, delivered_rate: float | None, engine_rate: float | None) -> None:
        if delivered_rate and engine_rate and delivered_rate > 0 and engine_rate > 0:
            self.delivered.append(1.0 / delivered_rate)
            self.engine.append(1.0 / engine_rate)
        if self._clock() >= self._next and len(self.engine) >= FEEDBACK_MIN:
            self._next = self._clock() + self.every
            self.write()

    def ratio(self) -> float | None:
        d, e = quantile(self.delivered, FEEDBACK_QUANTILE), quantile(self.engine, FEEDBACK_QUANTILE)
        return d / e if d and e else None

    def write(self) -> None:
        r = self.ratio()
        if r is None:
            return
        tmp = f"{self.path}.{os.getpid()}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(f"{r:.6f}\n")
        os.replace(tmp, self.path)


class FeedbackReader:
    """Engine core side: the last ratio the API server wrote, read at most every `every` seconds (a stat
    and, when the file changed, one small read); None while there is nothing new.  Never raises: a
    missing file is no feedback yet, a bad one is counted under where="guard_feedback" once per change."""

    def __init__(self, directory: str, every: float, clock=None) -> None:
        import time
        self.path = os.path.join(directory, FEEDBACK_FILE)
        self.every = every
        self._clock = clock or time.monotonic
        self._next = 0.0
        self._mtime = None

    def poll(self) -> float | None:
        now = self._clock()
        if now < self._next:
            return None
        self._next = now + self.every
        try:
            mtime = os.stat(self.path).st_mtime_ns
            if mtime == self._mtime:
                return None
            self._mtime = mtime
            with open(self.path, encoding="utf-8") as fh:
                value = float(fh.read().strip())
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{self.path}: {value!r} is not a positive ratio")
            return value
        except FileNotFoundError:
            return None
        except Exception as exc:  # contained: the loop runs on without the correction
            errors.report("guard_feedback", exc)
            return None
