"""The guard's decisions: the admission cap, the prefill budget, the record of requests held back.

* Admission (`AdmissionPolicy`): the cap on running requests is the fit's capacity at the first
  floor, bounded by a TTFT capacity when one is given (the engine core has none today: docs/guard.md),
  within [1, max_num_seqs], and it moves
  by whole streams with hysteresis: at once when the target is `band` or more streams away, else
  only after the target has stayed on the same side for `confirm` refits in a row.  While the fit
  has no usable verdict (`usable`) there is no cap: vLLM decides alone.  The limit applied to a step
  is never below the requests already running (the guard never preempts).
* Prefill (`prefill_budget`): while decode streams run, the prefill tokens a step may take so the
  fitted step time keeps them at the floor, (1/floor - alpha - beta*batch)/gamma, never below
  `min_chunk` (a prompt always progresses) and never above vLLM's own budget.
* `Deferred`: when each held request was first held, and how long each waited once admitted.
* `Guard`: the engine core's live fit (an `OnlineKneeEstimator` fed from the step hook), refitted at
  most once per `refit_seconds` on the step path, and the per-step decision (`StepDecision`).
"""
from __future__ import annotations

import math
import time
from collections import deque
from typing import Callable, Iterable, NamedTuple

from vllm_spark_plugin.knee.result import VERDICT_NO_KNEE, VERDICT_OK, VERDICT_RETROGRADE, KneeResult

OFF, ADMISSION, PREFILL, BOTH = "off", "admission", "prefill", "both"
MODES = (OFF, ADMISSION, PREFILL, BOTH)
MIN_PREFILL_CHUNK = 64  # tokens: the least prefill a step takes while the prefill guard bounds it
USABLE_VERDICTS = (VERDICT_OK, VERDICT_RETROGRADE)  # a knee in the measured range


def usable(fit: KneeResult | None, floor: float) -> bool:
    """The fit gives a capacity at the floor the guard may act on: a knee in the measured range, or,
    without one, a capacity within the measured batches (measured, not extrapolated: once the cap
    holds, the batches stay below the knee and the fit sees no knee, yet the capacity at the floor is
    still where it was observed).  Too few points, no spread, an extrapolated capacity: not usable."""
    if fit is None or fit.capacity_at(floor) is None:
        return False
    if fit.verdict in USABLE_VERDICTS:
        return True
    return (fit.verdict == VERDICT_NO_KNEE and fit.max_measured is not None
            and fit.capacity_at(floor) <= fit.max_measured)


class AdmissionPolicy:
    """The cap on running requests, moved with hysteresis (see the module doc)."""

    def __init__(self, floor: float, max_num_seqs: int, band: int = 2, confirm: int = 2) -> None:
        if not (isinstance(max_num_seqs, int) and max_num_seqs >= 1):
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
        self.floor = float(floor)
        self.max_num_seqs = max_num_seqs
        self.band = max(1, int(band))
        self.confirm = max(1, int(confirm))
        self.cap: int | None = None  # None: no cap (vLLM's own max_num_seqs)
        self._side = 0
        self._seen = 0

    def target(self, fit: KneeResult | None, ttft_streams: int | None = None) -> int | None:
        """Capacity under both SLOs at the floor, bounded to [1, max_num_seqs]; None when unusable."""
        if not usable(fit, self.floor):
            return None
        cap = fit.capacity_at(self.floor)
        if ttft_streams is not None:
            cap = min(cap, int(ttft_streams))
        return min(self.max_num_seqs, max(1, int(cap)))

    def update(self, fit: KneeResult | None, ttft_streams: int | None = None) -> int | None:
        """One refit: the cap in force afterwards."""
        target = self.target(fit, ttft_streams)
        if target is None:
            self.cap, self._side, self._seen = None, 0, 0
            return None
        if self.cap is None or abs(target - self.cap) >= self.band:
            self.cap, self._side, self._seen = target, 0, 0
            return self.cap
        if target == self.cap:
            self._side, self._seen = 0, 0
            return self.cap
        side = 1 if target > self.cap else -1
        self._seen = self._seen + 1 if side == self._side else 1
        self._side = side
        if self._seen >= self.confirm:
            self.cap, self._side, self._seen = target, 0, 0
        return self.cap

    def limit(self, running: int) -> int | None:
        """The limit to apply to this step: the cap, never below what runs already (no preemption),
        never above max_num_seqs; None when there is no cap."""
        if self.cap is None:
            return None
        return min(self.max_num_seqs, max(self.cap, int(running)))


def prefill_budget(fit: KneeResult | None, floor: float, batch: int, max_tokens: int,
                   min_chunk: int = MIN_PREFILL_CHUNK) -> int | None:
    """Prefill tokens a step with `batch` decode streams can take and keep them at `floor` tok/s:
    (1/floor - alpha - beta*batch)/gamma, within [min(min_chunk, max_tokens), max_tokens]; None when
    the fit has no usable step model (no verdict with a curve, or no positive gamma)."""
    if fit is None or not fit.ok:
        return None
    a, b, g = fit.alpha_seconds, fit.beta_seconds, fit.gamma_seconds_per_prefill_token
    if a is None or b is None or g is None or not g > 0 or floor <= 0:
        return None
    room = (1.0 / floor - a - b * max(0, batch)) / g
    tokens = int(math.floor(room + 1e-6)) if math.isfinite(room) else max_tokens
    return max(min(min_chunk, max_tokens), min(max_tokens, tokens))


class Deferred:
    """Requests held back: when each was first held; the wait of each once admitted (drained one per
    step onto the step record, oldest first)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, keep: int = 4096) -> None:
        self._clock = clock
        self.keep = keep
        self.since: dict = {}
        self.waits: deque = deque(maxlen=1024)

    def hold(self, request_ids: Iterable) -> None:
        now = self._clock()
        since = self.since
        for rid in request_ids:
            if rid not in since:
                since[rid] = now
        if len(since) > self.keep:  # requests aborted while held: forget the oldest half
            for rid in sorted(since, key=since.get)[: len(since) // 2]:
                del since[rid]

    def admitted(self, request_ids: Iterable) -> None:
        if not self.since:
            return
        now = self._clock()
        for rid in request_ids:
            t = self.since.pop(rid, None)
            if t is not None:
                self.waits.append(max(0.0, now - t))

    def next_wait(self) -> float | None:
        return self.waits.popleft() if self.waits else None


class StepDecision(NamedTuple):
    limit: int | None         # running requests allowed this step (None: vLLM's own)
    token_budget: int | None  # tokens the step may schedule (None: vLLM's own)
    prefill_budget: int | None  # the prefill part of it
    held: int                 # waiting requests the cap holds back now


class Guard:
    """The engine core's guard: the live fit, refitted at most every `refit_seconds` (checked on the
    step path), and each step's decision."""

    def __init__(self, mode: str, floor: float, max_num_seqs: int, max_tokens: int, knee,
                 refit_seconds: float, clock: Callable[[], float] = time.monotonic,
                 min_chunk: int = MIN_PREFILL_CHUNK, band: int = 2, confirm: int = 2) -> None:
        if mode not in MODES:
            raise ValueError(f"guard mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.admission = mode in (ADMISSION, BOTH)
        self.prefill = mode in (PREFILL, BOTH)
        self.floor = float(floor)
        self.max_num_seqs = max_num_seqs
        self.max_tokens = max_tokens
        self.min_chunk = min_chunk
        self.knee = knee
        self.refit_seconds = refit_seconds
        self._clock = clock
        self.policy = AdmissionPolicy(floor, max_num_seqs, band, confirm)
        self.fit: KneeResult | None = None
        self._next_refit = clock() + refit_seconds
        self.deferred = Deferred(clock)
        self.last = StepDecision(None, None, None, 0)

    def observe(self, batch: int, prefill_tokens: int, seconds: float, tokens_per_stream: float = 1.0) -> None:
        self.knee.observe(batch, prefill_tokens, seconds, tokens_per_stream)

    def refit_due(self) -> None:
        now = self._clock()
        if now < self._next_refit:
            return
        self._next_refit = now + self.refit_seconds
        self.fit = self.knee.estimate(force=True)
        if self.admission:
            self.policy.update(self.fit)

    def decide(self, running: int, waiting: int, decode_tokens: int) -> StepDecision:
        """This step's limits: `running` requests run now, `waiting` wait, `decode_tokens` is what the
        running decode streams take from the token budget."""
        self.refit_due()
        limit = self.policy.limit(running) if self.admission else None
        held = 0
        if limit is not None and running >= limit and waiting:
            held = min(waiting, self.max_num_seqs - running)
        budget = prefill = None
        if self.prefill and running > 0:
            prefill = prefill_budget(self.fit, self.floor, running, self.max_tokens, self.min_chunk)
            if prefill is not None:
                budget = min(self.max_tokens, decode_tokens + prefill)
        self.last = StepDecision(limit, budget, prefill, max(0, held))
        return self.last
