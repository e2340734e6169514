"""The guard's decisions: the admission cap, the prefill budget, the record of requests held back.

* Admission (`AdmissionPolicy`): the cap on running requests is the fit's capacity at the first
  floor, with the step-time tail (`tail_factor`) priced in, bounded by the TTFT capacity when one is
  given, within [1, max_num_seqs], and it moves by whole streams with hysteresis: down at once when
  the target is `band` or more streams below, otherwise (up, or a small move down) only after the
  target has stayed on the same side for `confirm` refits in a row, to the nearest of those targets.  While the fit
  has no usable verdict (`usable`) there is no cap: vLLM decides alone; but a cap in force whose fit
  sees no knee and a capacity above the batches measured (all a binding cap lets it see) rises one
  stream past them instead of going.  The limit applied to a step
  is never below the requests already running (the guard never preempts).
* Prefill (`prefill_budget`): while decode streams run, the prefill tokens a step may take so the
  fitted step time keeps them at the floor, (1/(floor*tail) - alpha - beta*batch)/gamma (gamma, or
  the cost per token measured on the last prefill steps when higher), never below
  `min_chunk` (a prompt always progresses) and never above vLLM's own budget.
* `Deferred`: when each held request was first held, and how long each waited once admitted.
* `Guard`: the engine core's live fit (an `OnlineKneeEstimator` fed from the step hook, and each
  admitted request's time from admission to first token), refitted at most once per
  `refit_seconds` on the step path, and the per-step decision (`StepDecision`).

Why a tail factor: the fit is robust (a slow step is an outlier it gives little weight), so it
tracks the typical step; a stream's rate is its tokens over the sum of its steps, so it pays every
slow step.  Where steps have a heavy tail (a shared host, a busy API server beside the engine) the
capacity of the typical step is too high for the streams.  `tail_factor` is the `quantile` (0.9) of
actual over fitted step time summed over windows of `window` consecutive steps (about one request's
life): the cap is the capacity at floor * tail, so nine in ten request-length stretches of steps
meet the floor, not one in two.
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Callable, Iterable, NamedTuple

import numpy as np

from vllm_spark_plugin.knee import slo_capacity
from vllm_spark_plugin.knee.result import MODEL_LINEAR, VERDICT_NO_KNEE, VERDICT_OK, VERDICT_RETROGRADE, KneeResult

log = logging.getLogger("vllm_spark_plugin")

OFF, ADMISSION, PREFILL, BOTH = "off", "admission", "prefill", "both"
MODES = (OFF, ADMISSION, PREFILL, BOTH)
MIN_PREFILL_CHUNK = 8   # tokens: the least prefill a step takes while the prefill guard bounds it
TOKEN_COST_WEIGHT = 0.5  # weight of the newest step in the measured prefill cost per token
USABLE_VERDICTS = (VERDICT_OK, VERDICT_RETROGRADE)  # a knee in the measured range
TAIL_WINDOW = 64        # steps summed per window: about one request's decode at 1 token a step
TAIL_QUANTILE = 0.9     # the share of request-length stretches the cap means to keep at the floor
TAIL_STEPS = 2048       # the newest steps the tail is read from
MAX_TAIL = 4.0          # a tail beyond this is a broken fit, not a slow host: priced at this
TTFT_BOUNDS = (slo_capacity.VERDICT_OK, slo_capacity.VERDICT_EXCEEDED_AT_SMALLEST)  # a TTFT capacity known


def usable(fit: KneeResult | None, floor: float, capacity: int | None = None) -> bool:
    """The fit gives a capacity at the floor the guard may act on: a knee in the measured range, or,
    without one, a capacity within the measured batches (measured, not extrapolated: once the cap
    holds, the batches stay below the knee and the fit sees no knee, yet the capacity at the floor is
    still where it was observed).  Too few points, no spread, an extrapolated capacity: not usable.
    `capacity`: the capacity the guard would apply (default: the fit's at the floor)."""
    if fit is None:
        return False
    cap = fit.capacity_at(floor) if capacity is None else capacity
    if cap is None:
        return False
    if fit.verdict in USABLE_VERDICTS:
        return True
    return fit.verdict == VERDICT_NO_KNEE and fit.max_measured is not None and cap <= fit.max_measured


def applied_capacity(fit: KneeResult | None, floor: float, tail: float = 1.0) -> int | None:
    """The capacity at the floor with the step-time tail priced in: the fit's capacity at `floor`,
    lowered to the linear model's at `floor * tail`; None when neither is known."""
    if fit is None:
        return None
    cap = fit.capacity_at(floor)
    tailed = capacity_at_rate(fit, floor * tail) if tail > 1.0 else None
    if tailed is None:
        return cap
    return tailed if cap is None else min(cap, tailed)


def tail_factor(fit: KneeResult | None, batch, prefill, seconds, window: int = TAIL_WINDOW,
                quantile: float = TAIL_QUANTILE) -> float:
    """The `quantile` of (sum of actual step seconds) / (sum of fitted step seconds) over every run of
    `window` consecutive steps (arrays oldest first), within [1, MAX_TAIL]; 1.0 with fewer steps than
    one window or no linear step model.  Never below 1: the tail only lowers the cap."""
    if fit is None or fit.model != MODEL_LINEAR or fit.alpha_seconds is None or fit.beta_seconds is None:
        return 1.0
    t = np.asarray(seconds, dtype=float)
    if window < 1 or len(t) < window:
        return 1.0
    gamma = fit.gamma_seconds_per_prefill_token or 0.0
    pred = fit.alpha_seconds + fit.beta_seconds * np.asarray(batch, dtype=float) + gamma * np.asarray(prefill, dtype=float)
    if not np.all(np.isfinite(pred)) or not np.all(pred > 0):
        return 1.0
    cy, cp = np.concatenate(([0.0], np.cumsum(t))), np.concatenate(([0.0], np.cumsum(pred)))
    ratios = (cy[window:] - cy[:-window]) / (cp[window:] - cp[:-window])
    q = float(np.quantile(ratios, quantile))
    return min(MAX_TAIL, max(1.0, q)) if math.isfinite(q) else 1.0


def capacity_at_rate(fit: KneeResult, rate: float) -> int | None:
    """Streams the linear step model keeps at `rate` tok/s each: floor((k/rate - alpha)/beta), at
    least 0; None without a linear model."""
    a, b, k = fit.alpha_seconds, fit.beta_seconds, fit.tokens_per_step or 1.0
    if fit.model != MODEL_LINEAR or a is None or b is None or not b > 0 or not rate > 0:
        return None
    return max(0, int(math.floor((k / rate - a) / b + 1e-9)))


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
        self._nearest = 0  # the target nearest the cap among the refits seen on this side

    def target(self, fit: KneeResult | None, ttft_streams: int | None = None, tail: float = 1.0) -> int | None:
        """Capacity under both SLOs at the floor (with the step-time `tail` priced in), bounded to
        [1, max_num_seqs]; None when unusable."""
        cap = applied_capacity(fit, self.floor, tail)
        if not usable(fit, self.floor, cap):  # judged on what is applied: a tailed cap the batches reached
            return None
        if ttft_streams is not None:
            cap = min(cap, int(ttft_streams))
        return min(self.max_num_seqs, max(1, int(cap)))

    def beyond_measured(self, fit: KneeResult | None, tail: float = 1.0) -> bool:
        """No knee and a capacity above the batches measured: what a binding cap makes the fit see,
        since the batches cannot pass it."""
        cap = applied_capacity(fit, self.floor, tail)
        return (fit is not None and fit.verdict == VERDICT_NO_KNEE and fit.max_measured is not None
                and cap is not None and cap > fit.max_measured)

    def update(self, fit: KneeResult | None, ttft_streams: int | None = None, tail: float = 1.0) -> int | None:
        """One refit: the cap in force afterwards."""
        target = self.target(fit, ttft_streams, tail)
        if target is None and self.cap is not None and self.beyond_measured(fit, tail):
            # Held at the cap, the fit cannot confirm a capacity above it: lifting the cap would let
            # every waiting request in at once.  Raise it one stream past what was measured instead
            # (with the hysteresis below: one stream per `confirm` refits) and let the fit see there.
            target = min(self.max_num_seqs, int(fit.max_measured) + 1)
            if ttft_streams is not None:
                target = max(1, min(target, int(ttft_streams)))
        if target is None:
            self.cap, self._side, self._seen = None, 0, 0
            return None
        if self.cap is None or self.cap - target >= self.band:  # the first cap, or a big move down: now
            self.cap, self._side, self._seen = target, 0, 0
            return self.cap
        if target == self.cap:
            self._side, self._seen = 0, 0
            return self.cap
        # Up, or a small move down: only once `confirm` refits in a row agree, and then to the nearest
        # of their targets.  Up is never at once: the requests it lets in cannot be taken back (the
        # guard never preempts), so an estimate that jitters must not open the gate on one refit.
        side = 1 if target > self.cap else -1
        if side == self._side:
            self._seen += 1
            self._nearest = min(self._nearest, target) if side > 0 else max(self._nearest, target)
        else:
            self._side, self._seen, self._nearest = side, 1, target
        if self._seen >= self.confirm:
            self.cap, self._side, self._seen = self._nearest, 0, 0
        return self.cap

    def limit(self, running: int) -> int | None:
        """The limit to apply to this step: the cap, never below what runs already (no preemption),
        never above max_num_seqs; None when there is no cap."""
        if self.cap is None:
            return None
        return min(self.max_num_seqs, max(self.cap, int(running)))


def prefill_budget(fit: KneeResult | None, floor: float, batch: int, max_tokens: int,
                   min_chunk: int = MIN_PREFILL_CHUNK, tail: float = 1.0,
                   token_cost: float | None = None) -> int | None:
    """Prefill tokens a step with `batch` decode streams can take and keep them at `floor` tok/s:
    (1/(floor*tail) - alpha - beta*batch)/gamma, within [min(min_chunk, max_tokens), max_tokens];
    None when the fit has no usable step model (no verdict with a curve, or no positive gamma).
    `token_cost`: seconds per prefill token measured on the last steps that had prefill; priced
    instead of gamma when higher (a chunk deep in a long prompt attends to all of it before, so it
    costs more per token than the fit's average)."""
    if fit is None or not fit.ok:
        return None
    a, b, g = fit.alpha_seconds, fit.beta_seconds, fit.gamma_seconds_per_prefill_token
    if a is None or b is None or g is None or not g > 0 or floor <= 0:
        return None
    if token_cost is not None and token_cost > g:
        g = token_cost
    room = (1.0 / (floor * max(1.0, tail)) - a - b * max(0, batch)) / g
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

    def admitted(self, request_ids: Iterable) -> dict:
        """Record the admission of `request_ids`; {request id: seconds held} of those that were held."""
        if not self.since:
            return {}
        now = self._clock()
        held = {}
        for rid in request_ids:
            t = self.since.pop(rid, None)
            if t is not None:
                held[rid] = wait = max(0.0, now - t)
                self.waits.append(wait)
        return held

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
                 min_chunk: int = MIN_PREFILL_CHUNK, band: int = 2, confirm: int = 2,
                 tail_window: int = TAIL_WINDOW, tail_quantile: float = TAIL_QUANTILE) -> None:
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
        self.tail_window = tail_window
        self.tail_quantile = tail_quantile
        self.fit: KneeResult | None = None
        self.tail = 1.0                      # the step-time tail priced into the cap and the budget
        self.token_cost: float | None = None  # seconds per prefill token of the last prefill steps (moving average)
        self.ttft: slo_capacity.TtftCapacity | None = None
        self._next_refit = clock() + refit_seconds
        self.deferred = Deferred(clock)
        self.last = StepDecision(None, None, None, 0)

    def observe(self, batch: int, prefill_tokens: int, seconds: float, tokens_per_stream: float = 1.0) -> None:
        self.knee.observe(batch, prefill_tokens, seconds, tokens_per_stream)
        fit = self.fit
        if self.prefill and prefill_tokens > 0 and fit is not None and fit.alpha_seconds is not None \
                and fit.beta_seconds is not None:
            # what this step's prefill cost per token beyond the fitted decode step
            per = (seconds - fit.alpha_seconds - fit.beta_seconds * batch) / prefill_tokens
            if per > 0:
                last = self.token_cost
                self.token_cost = per if last is None else last + TOKEN_COST_WEIGHT * (per - last)

    def observe_ttft(self, batch: int, seconds: float) -> None:
        """One admitted request's first token, timed from its admission: what joining a batch of
        `batch` costs a newcomer.  The wait before admission is left out: it is the queue the cap
        keeps, and counting it would lower the cap, lengthen the queue and lower the cap again."""
        self.knee.observe_ttft(batch, seconds)

    def ttft_streams(self) -> int | None:
        t = self.ttft
        return t.streams if t is not None and t.verdict in TTFT_BOUNDS else None

    def refit_due(self) -> None:
        now = self._clock()
        if now < self._next_refit:
            return
        self._next_refit = now + self.refit_seconds
        self.fit = self.knee.estimate(force=True)
        self.tail = tail_factor(self.fit, *self.knee.recent_steps(TAIL_STEPS), window=self.tail_window,
                                quantile=self.tail_quantile)
        if self.admission:
            self.ttft = self.knee.ttft_capacity()
            before = self.policy.cap
            cap = self.policy.update(self.fit, self.ttft_streams(), self.tail)
            if cap != before:
                log.info("vllm-spark-plugin: SLO guard cap %s -> %s (capacity at %g tok/s: %s from the fit, "
                         "%s with the step-time tail %.2f; TTFT capacity %s)", before or "none", cap or "none",
                         self.floor, None if self.fit is None else self.fit.capacity_at(self.floor),
                         applied_capacity(self.fit, self.floor, self.tail),
                         self.tail, self.ttft_streams())

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
            prefill = prefill_budget(self.fit, self.floor, running, self.max_tokens, self.min_chunk, self.tail,
                                     self.token_cost)
            if prefill is not None:
                budget = min(self.max_tokens, decode_tokens + prefill)
        self.last = StepDecision(limit, budget, prefill, max(0, held))
        return self.last
