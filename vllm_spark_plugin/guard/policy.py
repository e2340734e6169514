"""The guard's decisions: the engine core's `Guard`, the prefill budget, the record of requests held back.

* Admission: the cap on running requests is an admission policy's (`policies`: one interface, one
  registry row each; the default is the control loop of `loop`).  The limit applied to a step is
  never below the requests already running (the guard never preempts) and never above vLLM's own.
* Prefill (`prefill_budget`): while decode streams run, the prefill tokens a step may take so the
  fitted step time keeps them at the floor, (1/(floor*tail) - alpha - beta*batch)/gamma (gamma, or
  the cost per token measured on the last prefill steps when higher), never below
  `min_chunk` (a prompt always progresses) and never above vLLM's own budget.
* `Deferred`: when each held request was first held, and how long each waited once admitted.
* `Guard`: feeds every step to the policy and to the engine core's live fit (an `OnlineKneeEstimator`,
  read by the prefill budget), each finished request's decode rate and the delivery clock's ratio to
  the policy, refits at most once per `refit_seconds` on the step path, and makes the per-step
  decision (`StepDecision`).

Why a tail factor for the prefill budget: the fit is robust (a slow step is an outlier it gives
little weight), so it tracks the typical step; a stream's rate is its tokens over the sum of its
steps, so it pays every slow step.  `tail_factor` is the `quantile` (0.9) of actual over fitted step
time summed over windows of `window` consecutive steps (about one request's life).  The admission
loop does not use it: it prices the tail additively (`loop`).
"""
from __future__ import annotations

import logging
import math
import time
from collections import deque
from typing import Callable, Iterable, NamedTuple

import numpy as np

from vllm_spark_plugin.definitions import stream_decode_rate
from vllm_spark_plugin.knee import slo_capacity
from vllm_spark_plugin.knee.result import MODEL_LINEAR, KneeResult
from vllm_spark_plugin.settings import GUARD_MODES

from . import policies

log = logging.getLogger("vllm_spark_plugin")

MODES = GUARD_MODES  # defined once, by the settings owner
OFF, ADMISSION, PREFILL, BOTH = MODES
MIN_PREFILL_CHUNK = 8   # tokens: the least prefill a step takes while the prefill guard bounds it
TOKEN_COST_WEIGHT = 0.5  # weight of the newest step in the measured prefill cost per token
TAIL_WINDOW = 64        # steps summed per window: about one request's decode at 1 token a step
TAIL_QUANTILE = 0.9     # the share of request-length stretches the cap means to keep at the floor
TAIL_STEPS = 2048       # the newest steps the tail is read from
MAX_TAIL = 4.0          # a tail beyond this is a broken fit, not a slow host: priced at this
TTFT_BOUNDS = (slo_capacity.VERDICT_OK, slo_capacity.VERDICT_EXCEEDED_AT_SMALLEST)  # a TTFT capacity known


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
    """The engine core's guard: the admission policy and the live fit, refitted at most every
    `refit_seconds` (checked on the step path), and each step's decision.  `policy`: a name in
    `policies.POLICIES`, or a policy object (one that keeps a fixed cap, for the scheduler's
    contract tests); `prior`: the loop's (alpha, beta) at a cold start (`prior.from_profile`)."""

    def __init__(self, mode: str, floor: float, max_num_seqs: int, max_tokens: int, knee,
                 refit_seconds: float, clock: Callable[[], float] = time.monotonic,
                 min_chunk: int = MIN_PREFILL_CHUNK, policy=policies.DEFAULT_POLICY,
                 prior: tuple[float, float] | None = None,
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
        if isinstance(policy, str):
            policy = policies.build(policy, floor, max_num_seqs, prior) if self.admission else None
        self.policy = policy if self.admission else None
        self.tail_window = tail_window
        self.tail_quantile = tail_quantile
        self.fit: KneeResult | None = None    # read by the prefill budget only
        self.tail = 1.0                      # the step-time tail priced into the prefill budget
        self.token_cost: float | None = None  # seconds per prefill token of the last prefill steps (moving average)
        self.ttft: slo_capacity.TtftCapacity | None = None
        self._next_refit = clock() + refit_seconds
        self.deferred = Deferred(clock)
        self.last = StepDecision(None, None, None, 0)
        self._steps = self._batches = 0

    def observe(self, batch: int, prefill_tokens: int, seconds: float, tokens_per_stream: float = 1.0) -> None:
        self.knee.observe(batch, prefill_tokens, seconds, tokens_per_stream)
        self._steps += 1
        self._batches += batch
        if self.policy is not None:
            self.policy.observe_step(batch, prefill_tokens, seconds / max(1.0, tokens_per_stream))
        fit = self.fit
        if self.prefill and prefill_tokens > 0 and fit is not None and fit.alpha_seconds is not None \
                and fit.beta_seconds is not None:
            # what this step's prefill cost per token beyond the fitted decode step
            per = (seconds - fit.alpha_seconds - fit.beta_seconds * batch) / prefill_tokens
            if per > 0:
                last = self.token_cost
                self.token_cost = per if last is None else last + TOKEN_COST_WEIGHT * (per - last)

    def mark(self) -> tuple[int, int]:
        """(steps, sum of their batches) observed so far: taken at a request's first token, handed back
        with its finish, so the policy knows the mean batch of the steps it ran in."""
        return self._steps, self._batches

    def observe_finished(self, output_tokens: int, decode_seconds: float, since: tuple[int, int]) -> None:
        """One finished request on the engine clock: its tokens, first-to-last-token seconds and the
        `mark()` taken at its first token."""
        if self.policy is not None:
            rate = stream_decode_rate(output_tokens, decode_seconds)
            steps = self._steps - since[0]
            if rate and steps > 0:
                self.policy.observe_finished(1.0 / rate, (self._batches - since[1]) / steps)

    def observe_feedback(self, ratio: float) -> None:
        """The delivery clock's seconds per token over the engine clock's (the API server's file)."""
        if self.policy is not None:
            self.policy.observe_feedback(ratio)

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
        if self.prefill:
            self.fit = self.knee.estimate(force=True)
            self.tail = tail_factor(self.fit, *self.knee.recent_steps(TAIL_STEPS), window=self.tail_window,
                                    quantile=self.tail_quantile)
        if self.policy is not None:
            self.ttft = self.knee.ttft_capacity()
            moved = self.policy.refit(now, self.ttft_streams())
            for line in (moved or "").splitlines():  # one line a move, each naming its rule
                log.info("vllm-spark-plugin: SLO guard cap %s", line)

    def decide(self, running: int, waiting: int, decode_tokens: int) -> StepDecision:
        """This step's limits: `running` requests run now, `waiting` wait, `decode_tokens` is what the
        running decode streams take from the token budget."""
        self.refit_due()
        limit = self.policy.limit(running, waiting) if self.policy is not None else None
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
