"""A discrete-event plant for the SLO guard: vLLM's scheduling on a simulated clock, one engine step
per loop turn (no HTTP, no asyncio), so a scenario of minutes runs in tens of milliseconds.

What it models, and only that:

* vLLM's FCFS waiting queue and running set: each step the running requests are scheduled first
  (one decode token each, continuing prefills in chunks from the step's token budget), then waiting
  requests are admitted from the head while `running < limit` and budget is left (the limit as vLLM
  applies `max_num_active_reqs`); nothing is ever preempted;
* a step time `alpha + beta*b + prefill cost` (a prefill token costs more deep in a long prompt:
  `gamma * (1 + context/ctx_scale)`), times seeded log-normal noise, and one step in `tail_every`
  `tail_factor` times longer (the heavy tail of a shared host); optionally a bend at small batches,
  `bend * (1 - exp(-(b - 1)/bend_streams))`, as the CPU build's steps have (1 to 2 streams cost 0.8 ms,
  later ones 0.2: a line read from the first levels is three times too steep), or a knee past which
  each stream costs more (a GPU's steps: a line read from the first levels is too flat); optionally a slow
  drift of the whole step (AR(1) on a log scale), the speed of a shared host wandering between refits;
* the API server: each step's outputs are handed to the requests' handlers in order, taking
  `api_fixed + api_per_stream*b` (and now and then a stall); a token's delivery time is that hand-off
  (the delivery clock, `metrics/delivery.py`'s), never before the engine produced it;
* requests with prompt and output lengths (uniform in [0.5, 1.5] of the load's means); a closed loop
  (N clients, each sending its next request when the last one was delivered) or open-loop Poisson
  arrivals, a shift of lengths mid-run, a burst, long prompts among decode streams.

The guard is driven through exactly the calls `hooks/guard.py` and `hooks/scheduler.py` make
(`Guard.decide`, `deferred.hold/admitted`, `observe`, `observe_ttft`, `observe_finished`,
`observe_feedback`), on the plant's clock, so the plant runs the real policy code.  Rates are
`definitions.stream_decode_rate`, judged on the delivery clock (what a client sees).
"""
from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field

from vllm_spark_plugin.definitions import quantile, stream_decode_rate
from vllm_spark_plugin.guard import Guard
from vllm_spark_plugin.knee.online import OnlineKneeEstimator


@dataclass(frozen=True)
class Engine:
    """The engine and the API server beside it: a GB10 serving a MoE model, roughly."""

    alpha: float = 0.022            # seconds a step costs at any batch
    beta: float = 0.0012            # seconds each running stream adds
    gamma: float = 1.5e-4           # seconds a prefill token costs at no context (6.7k tok/s)
    ctx_scale: float = 4096.0       # a prefill token at this context costs twice gamma
    sigma: float = 0.05             # log-normal step noise
    tail_every: int = 50            # one step in this many is slow ...
    tail_factor: float = 4.0        # ... this many times as long
    api_fixed: float = 0.001        # the API server's hand-off per step
    api_per_stream: float = 0.0006  # ... and per stream in it
    api_stall_every: int = 400      # one hand-off in this many stalls ...
    api_stall: float = 0.12         # ... this long
    max_num_seqs: int = 64          # vLLM's own limit
    max_tokens: int = 2048          # vLLM's token budget per step
    bend: float = 0.0               # seconds the small batches' bend adds once saturated ...
    bend_streams: float = 2.0       # ... reached within about this many streams past the first
    knee_streams: int = 0           # past this many streams each one adds knee_beta more (a GPU's steps: flat
    knee_beta: float = 0.0          # while decode is bound by weight reads, steeper once compute binds)
    drift_sigma: float = 0.0        # a slow drift of the whole step (log scale, stationary std) ...
    drift_tau: float = 20.0         # ... correlated over about this many seconds (AR(1)): a shared host
                                    # whose speed wanders between refits, as the CPU test bed's does
    slow: tuple[float, float, float] | None = None  # (factor, start, end): every step this many times as
                                    # long from `start` to `end` seconds, a host that slows within a
                                    # minute (another job on the box) and comes back

    @property
    def mean_noise(self) -> float:
        return math.exp(self.sigma ** 2 / 2) * (1 + (self.tail_factor - 1) / self.tail_every)

    def decode_step(self, b: int) -> float:
        """A decode step at batch b, before noise."""
        bent = self.bend * (1.0 - math.exp(-(b - 1) / self.bend_streams)) if self.bend else 0.0
        knee = self.knee_beta * max(0, b - self.knee_streams) if self.knee_beta else 0.0
        return self.alpha + self.beta * b + bent + knee

    def lone_rate(self) -> float:
        """A lone stream's mean decode rate, tok/s."""
        return 1.0 / (self.decode_step(1) * self.mean_noise)

    def streams_at(self, floor: float) -> int:
        """Streams whose mean step keeps them at `floor` (no spread, no prefill): the nominal capacity."""
        b = 1
        while b < self.max_num_seqs and self.decode_step(b + 1) * self.mean_noise <= 1.0 / floor:
            b += 1
        return b

    def sweep_line(self, levels=(1, 2, 4, 8, 16, 32, 64)) -> tuple[float, float]:
        """(alpha, beta) of a least-squares line through the mean decode step at a sweep's levels: what a
        capacity profile holds (alpha and beta without a bend)."""
        ts = [self.decode_step(b) for b in levels]
        mb, mt = sum(levels) / len(levels), sum(ts) / len(ts)
        beta = sum((b - mb) * (t - mt) for b, t in zip(levels, ts)) / sum((b - mb) ** 2 for b in levels)
        return mt - beta * mb, beta


@dataclass(frozen=True)
class Load:
    closed: bool = True
    clients: int = 0                 # closed loop: concurrent clients
    rate: float = 0.0                # open loop: Poisson arrivals per second
    prompt: int = 256                # mean prompt tokens
    output: int = 128                # mean output tokens
    duration: float = 90.0           # seconds of arrivals (closed loop: of the run)
    shift_at: float | None = None    # lengths change here ...
    shift_output: float = 4.0        # ... output x this
    shift_prompt: float = 8.0        # ... prompt x this
    burst: tuple[float, float, float] | None = None  # (start, seconds, arrivals/s) on top of the load
    long_prompt: tuple[float, int] | None = None     # (every seconds, prompt tokens): a long prefill now and then
    grace: float = 40.0              # open loop: seconds after the last arrival for the queue to drain


@dataclass
class Finished:
    arrival: float
    output: int
    ttft: float                 # delivery clock, from arrival (queue included)
    rate: float | None          # delivery clock
    engine_rate: float | None   # engine clock
    done: float                 # delivery time of the last token


class Request:
    __slots__ = ("rid", "arrival", "prompt", "output", "left", "admitted", "k0", "client", "mark")

    def __init__(self, rid: int, arrival: float, prompt: int, output: int, client: int = -1) -> None:
        self.rid, self.arrival, self.prompt, self.output, self.client = rid, arrival, prompt, output, client
        self.left = prompt
        self.admitted = 0.0
        self.k0 = -1
        self.mark = (0, 0)


@dataclass
class Run:
    finished: list[Finished] = field(default_factory=list)
    arrived: int = 0
    left_running: int = 0
    left_waiting: int = 0
    limit_exceeded: int = 0          # steps where admission passed the limit in force
    caps: list[tuple[float, int | None]] = field(default_factory=list)  # (time, cap) at each change
    end: float = 0.0
    steps: int = 0
    policy: object = None


class Plant:
    def __init__(self, engine: Engine, load: Load, seed: int = 0) -> None:
        self.e, self.load, self.seed = engine, load, seed

    def _lengths(self, rng: random.Random, t: float) -> tuple[int, int]:
        ld = self.load
        p, o = ld.prompt, ld.output
        if ld.shift_at is not None and t >= ld.shift_at:
            p, o = int(p * ld.shift_prompt), int(o * ld.shift_output)
        return max(1, int(p * rng.uniform(0.5, 1.5))), max(2, int(o * rng.uniform(0.5, 1.5)))

    def _open_arrivals(self) -> list[Request]:
        ld, rng = self.load, random.Random(self.seed * 7919 + 1)
        times = []
        if ld.rate > 0:
            t = rng.expovariate(ld.rate)
            while t < ld.duration:
                times.append(t)
                t += rng.expovariate(ld.rate)
        if ld.burst is not None:
            start, secs, rate = ld.burst
            t = start + rng.expovariate(rate)
            while t < start + secs:
                times.append(t)
                t += rng.expovariate(rate)
        times.sort()
        out = []
        for i, t in enumerate(times):
            p, o = self._lengths(rng, t)
            out.append(Request(i, t, p, o))
        return out

    def run(self, guard: Guard | None = None, static: int | None = None, feedback_every: float = 5.0) -> Run:
        """One run: `guard` (the real `Guard`, on this plant's clock), or a static `max_num_seqs`, or
        neither (vLLM's own limit)."""
        e, ld = self.e, self.load
        rng = random.Random(self.seed)
        wander = random.Random(self.seed * 17 + 11)  # its own stream: no drift leaves the rest as it was
        drift = wander.gauss(0.0, e.drift_sigma) if e.drift_sigma else 0.0
        lens = random.Random(self.seed * 31 + 5)
        res = Run()
        clock = [0.0]
        if guard is not None:
            guard._clock = lambda: clock[0]
            guard.deferred._clock = guard._clock
            guard._next_refit = guard.refit_seconds
            if hasattr(guard.knee, "_clock"):
                guard.knee._clock = guard._clock
        own = min(e.max_num_seqs, static) if static else e.max_num_seqs
        pending: list = []   # heap of (arrival, rid, Request)
        if ld.closed:
            for c in range(ld.clients):
                p, o = self._lengths(lens, 0.0)
                heapq.heappush(pending, (0.0, c, Request(c, 0.0, p, o, c)))
            nid = ld.clients
        else:
            for r in self._open_arrivals():
                heapq.heappush(pending, (r.arrival, r.rid, r))
            nid = len(pending)
        res.arrived = len(pending)
        long_next = ld.long_prompt[0] if ld.long_prompt else math.inf
        stop_arrivals = ld.duration
        hard_end = ld.duration if ld.closed else ld.duration + ld.grace

        waiting: list[Request] = []
        wpos = 0                         # head of the FCFS queue in `waiting`
        prefilling: list[Request] = []
        decoding: list = []              # heap of (finish step, rid, Request)
        T: list[float] = []              # engine time at the end of each step
        D: list[float] = []              # its outputs' delivery time
        first_pending: list[Request] = []
        d_prev = 0.0
        t = 0.0
        k = -1
        ratios: list[float] = []
        next_feedback = feedback_every
        cap_seen = object()
        while True:
            while pending and pending[0][0] <= t:
                waiting.append(heapq.heappop(pending)[2])
            if t >= long_next and t < stop_arrivals:
                waiting.append(Request(nid, t, ld.long_prompt[1], max(2, int(ld.output * lens.uniform(0.5, 1.5)))))
                nid += 1
                res.arrived += 1
                long_next += ld.long_prompt[0]
            running = len(decoding) + len(prefilling)
            n_wait = len(waiting) - wpos
            if not running and not n_wait:
                if not pending or pending[0][0] > hard_end:
                    break
                t = clock[0] = max(t, pending[0][0])
                continue
            if t >= hard_end:
                break
            # -- the decision, as hooks/guard.py makes it at the top of schedule() --------------------
            limit, budget = own, e.max_tokens
            if guard is not None:
                if guard.policy is not None and t >= next_feedback:
                    next_feedback = t + feedback_every
                    if len(ratios) >= 8:  # the API server's file: delivery over engine seconds per token
                        guard.observe_feedback(feedback_ratio(ratios[-64:]))
                d = guard.decide(running, n_wait, len(decoding))
                if d.limit is not None:
                    limit = min(own, d.limit)
                if d.token_budget is not None:
                    budget = min(budget, d.token_budget)
                if d.held:
                    guard.deferred.hold(r.rid for r in waiting[wpos:wpos + d.held])
                cap = guard.policy.cap if guard.policy is not None else None
                if cap is not cap_seen and (not res.caps or res.caps[-1][1] != cap):
                    res.caps.append((t, cap))
                cap_seen = cap
            # -- schedule: running first, then admit from the queue head ------------------------------
            left = budget - len(decoding)
            prefill_tokens = 0
            chunks = []
            ctx_cost = 0.0
            for r in prefilling:
                if left <= 0:
                    break
                c = min(r.left, left)
                chunks.append((r, c))
                left -= c
            admitted = []
            before = running
            while wpos < len(waiting) and running < limit and left > 0:
                r = waiting[wpos]
                wpos += 1
                c = min(r.left, left)
                left -= c
                r.admitted = t
                prefilling.append(r)
                chunks.append((r, c))
                admitted.append(r)
                running += 1
            if running > max(limit, before):
                res.limit_exceeded += 1
            if wpos > 4096:
                del waiting[:wpos]
                wpos = 0
            if guard is not None and admitted and guard.deferred.since:
                guard.deferred.admitted(r.rid for r in admitted)
            for r, c in chunks:
                done_before = r.prompt - r.left
                ctx_cost += c * (1.0 + (done_before + c / 2) / e.ctx_scale)
                prefill_tokens += c
                r.left -= c
            b = len(decoding) + len(chunks)
            dt = (e.decode_step(b) + e.gamma * ctx_cost) * rng.lognormvariate(0.0, e.sigma)
            if rng.random() * e.tail_every < 1.0:
                dt *= e.tail_factor
            if e.slow and e.slow[1] <= t < e.slow[2]:
                dt *= e.slow[0]
            if e.drift_sigma:
                keep = math.exp(-dt / e.drift_tau)
                drift = drift * keep + wander.gauss(0.0, e.drift_sigma * math.sqrt(1.0 - keep * keep))
                dt *= math.exp(drift)
            t = clock[0] = t + dt
            k += 1
            T.append(t)
            d_prev = max(t, d_prev) + e.api_fixed + e.api_per_stream * b
            if rng.random() * e.api_stall_every < 1.0:
                d_prev += e.api_stall
            D.append(d_prev)
            # -- outputs -----------------------------------------------------------------------------
            if guard is not None:
                guard.observe(b, prefill_tokens, dt)
                for r in first_pending:  # first tokens, seen at the next schedule() as the hook does
                    guard.observe_ttft(b, max(0.0, t - r.admitted))
                first_pending = []
            if prefill_tokens:
                still = []
                for r in prefilling:
                    if r.left > 0:
                        still.append(r)
                        continue
                    r.k0 = k
                    heapq.heappush(decoding, (k + r.output - 1, r.rid, r))
                    if guard is not None:
                        first_pending.append(r)
                        r.mark = guard.mark()
                prefilling = still
            while decoding and decoding[0][0] <= k:
                _, _, r = heapq.heappop(decoding)
                eng = stream_decode_rate(r.output, T[k] - T[r.k0])
                rate = stream_decode_rate(r.output, D[k] - D[r.k0])
                res.finished.append(Finished(r.arrival, r.output, D[r.k0] - r.arrival, rate, eng, D[k]))
                if eng and rate:
                    ratios.append((1.0 / eng, 1.0 / rate))
                if guard is not None:
                    guard.observe_finished(r.output, T[k] - T[r.k0], r.mark)
                if ld.closed and D[k] < stop_arrivals:
                    p, o = self._lengths(lens, D[k])
                    heapq.heappush(pending, (D[k], nid, Request(nid, D[k], p, o, r.client)))
                    nid += 1
                    res.arrived += 1
        res.left_running = len(decoding) + len(prefilling)
        res.left_waiting = len(waiting) - wpos + len(pending)
        res.end, res.steps = t, k + 1
        res.policy = None if guard is None else guard.policy
        return res


def feedback_ratio(pairs) -> float:
    """What the API server feeds back: the 90th percentile of delivered seconds per token over the
    engine's, on the same finished requests (the quantile the floor is judged at)."""
    return quantile([d for _, d in pairs], 0.9) / quantile([e for e, _ in pairs], 0.9)


def new_guard(engine: Engine, floor: float, policy: str = "loop", prior=None, ttft_slo: float | None = None,
              refit_seconds: float = 10.0, mode: str = "admission") -> Guard:
    """The engine core's guard as hooks/guard.py builds it (its own estimator), on a clock the plant sets."""
    knee = OnlineKneeEstimator(window=1024, refit_seconds=0, floors=(floor,), clock=lambda: 0.0,
                               ttft_slo_seconds=ttft_slo)
    return Guard(mode, floor, engine.max_num_seqs, engine.max_tokens, knee, refit_seconds,
                 clock=lambda: 0.0, policy=policy, prior=prior)
