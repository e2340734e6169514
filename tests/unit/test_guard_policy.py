"""The SLO guard's decisions (guard/), deterministic: synthetic fits and a simulated clock."""
from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_spark_plugin.guard import MIN_PREFILL_CHUNK, Deferred, Guard, LoopPolicy, prefill_budget
from vllm_spark_plugin.guard.loop import COLD, ROUND_STEPS, RULES, TRACK
from vllm_spark_plugin.guard.policy import MAX_TAIL, capacity_at_rate, tail_factor
from vllm_spark_plugin.knee.online import OnlineKneeEstimator
from vllm_spark_plugin.knee.slo_capacity import ttft_capacity
from vllm_spark_plugin.knee.result import VERDICT_NO_KNEE, VERDICT_OK, VERDICT_TOO_FEW, KneeResult

FLOOR = 20.0


def fit(capacity, verdict=VERDICT_OK, alpha=0.01, beta=0.001, gamma=1e-5):
    return KneeResult(verdict, source="steps", alpha_seconds=alpha, beta_seconds=beta,
                      gamma_seconds_per_prefill_token=gamma, capacity={"20": capacity})


class NoSteps:
    """The estimator's reader side with no steps and no first tokens held (tail 1, no TTFT capacity)."""

    def recent_steps(self, n):
        return (), (), ()

    def ttft_capacity(self):
        return ttft_capacity((), (), None)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


# -- admission: the loop (guard/loop.py) ----------------------------------------------------------------
ALPHA, BETA = 0.022, 0.0012


def feed(p, batch, n, rng=None, alpha=ALPHA, beta=BETA, tail_every=0):
    """`n` decode steps at `batch` on the line alpha + beta*b (seeded noise, one step in `tail_every`
    four times as long)."""
    rng = rng or random.Random(0)
    for i in range(n):
        t = (alpha + beta * batch) * rng.lognormvariate(0, 0.05)
        if tail_every and i % tail_every == 0:
            t *= 4
        p.observe_step(batch, 0, t)


def test_limits_are_within_one_and_max_num_seqs_and_never_below_what_runs():
    p = LoopPolicy(FLOOR, 16, prior=(0.001, 0.0001))   # the prior says hundreds of streams
    assert p.cap == 16 // 2 and p.limit(3, 10) == 8
    assert p.limit(12, 10) == 12        # more run than the cap: none admitted, none preempted
    assert p.limit(80, 10) == 16        # never above vLLM's own limit
    assert LoopPolicy(1000.0, 16, prior=(0.5, 0.01)).cap == 1   # no stream meets it: one, never zero


def test_a_cold_start_engages_at_once_and_doubles_while_the_steps_leave_room():
    p = LoopPolicy(24.0, 64)            # target 41.7 ms a token: (41.7 - 5% - 22)/1.2 = 14.7 streams
    assert p.state == COLD and p.cap == 1 and p.limit(1, 50) == 1
    caps = [p.cap]
    for _ in range(8):
        feed(p, p.cap, ROUND_STEPS)
        caps.append(p.cap)
    assert caps[:5] == [1, 2, 4, 8, 14]  # doubling, then the streams the measured line allows
    assert max(caps) <= 15 and p.state == TRACK and p.beta == pytest.approx(BETA, rel=0.15)


def test_without_load_the_slow_start_waits_at_its_cap():
    p = LoopPolicy(24.0, 64)
    feed(p, 1, 5 * ROUND_STEPS)         # one stream runs, the cap of 1 holds nobody: rounds complete
    assert p.cap >= 2
    q = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
    cap = q.cap
    feed(q, 2, 5 * ROUND_STEPS)         # two streams under a cap of 7: no round at the cap, no growth
    assert q.cap == cap


def test_a_binding_cap_keeps_the_model_and_re_anchors_the_intercept():
    """Held at the cap the batch never moves: no spread for a slope.  The loop keeps the slope it
    learned and re-anchors the intercept on the steps at the batch in force: a slower host lowers
    the cap, it is never lifted."""
    p = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
    now, rng = 0.0, random.Random(1)
    for _ in range(12):
        feed(p, p.cap, 250, rng)
        p.limit(p.cap, 20)
        now += 10
        p.refit(now)
    assert p.cap is not None and 12 <= p.cap <= 15 and p.beta == pytest.approx(BETA, rel=0.2)
    for _ in range(6):                  # the host slows: every step 6 ms longer
        feed(p, p.cap, 250, rng, alpha=ALPHA + 0.006)
        p.limit(p.cap, 20)
        now += 10
        p.refit(now)
    assert p.cap is not None and 7 <= p.cap <= 11   # (41.7 - 2.1 - 28) / 1.2 = 9.7
    # the levels follow the host's speed (a 6 ms longer step reads as 15% slower at 13 streams), so
    # slope and intercept move together: the step at the batch in force is the slowed host's
    assert p.beta == pytest.approx(BETA, rel=0.2)
    assert p.alpha + p.beta * p.cap == pytest.approx(ALPHA + 0.006 + BETA * p.cap, rel=0.03)


def test_near_the_lone_stream_rate_a_heavy_tail_does_not_collapse_the_cap():
    """Floor at 85% of the lone-stream rate, one step in 50 four times as long: the tail costs the
    streams a share of a step, which the loop subtracts from the target (36 -> ~2.5 ms of room above
    the lone step), not a factor multiplied into the floor (which made 11 streams 1)."""
    lone = 1 / ((ALPHA + BETA) * 1.06)
    p = LoopPolicy(0.85 * lone, 64, prior=(ALPHA, BETA))
    now, rng = 0.0, random.Random(2)
    for _ in range(10):
        feed(p, p.cap, 250, rng, tail_every=50)
        for _ in range(20):             # finished requests: the mean step at that batch, spread a little
            p.observe_finished((ALPHA + BETA * p.cap) * 1.06 * rng.uniform(0.98, 1.04), p.cap)
        p.limit(p.cap, 20)
        now += 10
        p.refit(now)
    assert p.cap in (2, 3)


def test_moves_are_bounded_down_by_half_and_up_by_double_after_two_refits():
    p = LoopPolicy(12.0, 64, prior=(ALPHA, BETA))
    now, rng = 0.0, random.Random(3)
    for _ in range(6):
        feed(p, p.cap, 250, rng)
        for _ in range(20):
            p.observe_finished((ALPHA + BETA * p.cap) * rng.uniform(0.98, 1.04), p.cap)
        p.limit(p.cap, 20)
        now += 10
        p.refit(now)
    high = p.cap
    assert high >= 30 and p.state == TRACK
    moves, held = 0, 0
    for _ in range(7):                     # the step time jumps: room for a few streams only
        before = p.cap
        feed(p, before, 250, rng, alpha=0.070)
        now += 10
        p.refit(now)
        assert before - before // 2 <= p.cap              # down, by at most half a refit
        if p.cap > before:                 # (the slope read across the jump's levels runs low: the cap
            assert held >= 1                # may rise again, but only after a refit that held it)
        held = held + 1 if p.cap == before else 0
        moves += p.cap < before
    assert p.cap <= 16 and moves >= 2
    assert p.rules.get("down-now", 0) >= 2 and set(p.rules) <= set(RULES)
    p2, rng = LoopPolicy(12.0, 64, prior=(0.06, BETA)), random.Random(3)
    while p2.state != TRACK:               # the host is slow: the slow start ends at its x ...
        feed(p2, p2.cap, ROUND_STEPS, rng, alpha=0.06)
    low = p2.cap
    for now in (10.0, 20.0):               # ... then fast: up once two refits agree, at most doubling
        feed(p2, p2.cap, 250, rng)
        p2.limit(p2.cap, 20)
        p2.refit(now)
        if now == 10.0:
            assert p2.cap == low
    assert low < p2.cap <= 2 * low
    assert p2.rules.get("up-confirmed") == 1


def test_the_prefill_each_stream_brings_is_priced_into_the_slope():
    """Steady admissions put prefill steps among decode steps: 256 prompt tokens per 128-token request,
    0.15 ms a token.  The loop prices it per stream (cost per prefill token times prefill tokens per
    stream-step), so a first wave whose prefills came before its first tokens does not look cheaper."""
    p = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
    p.alpha, p._measured = ALPHA, True
    for _ in range(40):
        feed(p, 10, 12)
        p.observe_step(10, 256, ALPHA + BETA * 10 + 256 * 0.00015)
    assert p.prefill_per_stream == pytest.approx(0.00015 * 256 / 130, rel=0.1)   # 256 tokens per 13 steps of 10
    assert p.slope == pytest.approx(BETA + p.prefill_per_stream)
    without = (p.target - p.spread_in_use - ALPHA) / BETA
    assert p._streams() < without - 1


def test_in_steady_state_the_cap_settles():
    p = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
    now, rng, caps = 0.0, random.Random(4), []
    for _ in range(40):
        feed(p, p.cap, 250, rng, tail_every=50)
        for _ in range(20):
            p.observe_finished((ALPHA + BETA * p.cap) * 1.06 * rng.uniform(0.97, 1.05), p.cap)
        p.limit(p.cap, 20)
        now += 10
        p.refit(now)
        caps.append(p.cap)
    changes = sum(a != b for a, b in zip(caps[10:], caps[11:]))
    assert changes <= 3                 # at most once in ten refits after the first ten


def test_the_delivery_ratio_and_the_spread_lower_the_cap_additively():
    def settled(ratio=None, spread=0.0):
        p = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
        if ratio:
            p.observe_feedback(ratio)
        now, rng = 0.0, random.Random(5)
        for _ in range(8):
            feed(p, p.cap, 250, rng)
            for i in range(20):
                p.observe_finished(ALPHA + BETA * p.cap + (spread if i < 4 else 0.0), p.cap)
            p.limit(p.cap, 20)
            now += 10
            p.refit(now)
        return p.cap, p
    base, _ = settled()
    slower, p = settled(ratio=1.2)      # the client sees 20% longer per token than the engine
    assert p.target == pytest.approx(1 / (24.0 * 1.2))
    assert slower < base
    spread, q = settled(spread=0.006)   # one request in five 6 ms a token slower than the mean step
    assert q.spread == pytest.approx(0.006, abs=0.0015) and spread < base


# -- prefill budget ----------------------------------------------------------------------------------
def test_prefill_budget_from_the_fit():
    # (1/20 - 0.01 - 0.001*10) / 1e-5 = 3000 tokens
    assert prefill_budget(fit(30), FLOOR, 10, 8192) == 3000
    assert prefill_budget(fit(30), FLOOR, 10, 2048) == 2048


@pytest.mark.parametrize("batch", [0, 1, 30, 40, 1000])
def test_prefill_budget_is_never_below_the_minimum_chunk(batch):
    b = prefill_budget(fit(30), FLOOR, batch, 8192)
    assert MIN_PREFILL_CHUNK <= b <= 8192


def test_prefill_budget_needs_a_step_model():
    assert prefill_budget(None, FLOOR, 4, 8192) is None
    assert prefill_budget(fit(30, VERDICT_TOO_FEW), FLOOR, 4, 8192) is None
    assert prefill_budget(fit(30, gamma=None), FLOOR, 4, 8192) is None
    assert prefill_budget(fit(30, gamma=0.0), FLOOR, 4, 8192) is None


def test_a_long_prompt_always_progresses_and_completes():
    """Chunks of at least the minimum: a 100k-token prompt finishes in a bounded number of steps."""
    prompt, done, steps = 100_000, 0, 0
    tight = fit(30, alpha=0.049, beta=0.001)  # no room at all at the floor
    while done < prompt:
        done += prefill_budget(tight, FLOOR, 20, 8192)
        steps += 1
    assert steps == -(-prompt // MIN_PREFILL_CHUNK)


# -- deferred ----------------------------------------------------------------------------------------
def test_deferred_waits_are_measured_once_per_admitted_request():
    clock = Clock()
    d = Deferred(clock)
    d.hold(["a", "b"])
    clock.t += 2
    d.hold(["a", "b", "c"])           # already held: first time kept
    clock.t += 1
    d.admitted(["a", "x"])            # x was never held
    assert d.next_wait() == 3.0 and d.next_wait() is None
    d.admitted(["a"])
    assert d.next_wait() is None


def test_deferred_forgets_requests_aborted_while_held():
    d = Deferred(Clock(), keep=10)
    d.hold(range(11))
    assert len(d.since) <= 10


# -- the guard, with a live estimator on a simulated clock ----------------------------------------------
def steps(knee, guard, clock, alpha=0.01, beta=0.001, batches=(1, 2, 4, 8, 16, 32, 48, 64)):
    for _ in range(40):
        for b in batches:
            guard.observe(b, 0, alpha + beta * b)
            clock.t += 0.01


def test_guard_off_modes_and_validation():
    with pytest.raises(ValueError):
        Guard("sometimes", FLOOR, 8, 2048, None, 10.0)


def test_the_guard_engages_from_a_cold_start_and_feeds_its_policy():
    clock = Clock()
    knee = OnlineKneeEstimator(refit_seconds=0, floors=(FLOOR,), clock=clock)
    g = Guard("admission", FLOOR, 128, 2048, knee, refit_seconds=10.0, clock=clock)
    d = g.decide(running=1, waiting=50, decode_tokens=1)
    assert d.limit == 1 and d.token_budget is None and d.held == 50   # a slow start: one stream first
    steps(knee, g, clock, batches=(1,))
    assert g.decide(running=1, waiting=50, decode_tokens=1).limit >= 2
    assert Guard("prefill", FLOOR, 128, 2048, knee, 10.0, clock=clock).policy is None


def test_each_move_of_the_cap_is_one_log_line_that_names_its_rule(caplog):
    """The slow start's rounds move the cap between refits; the refit logs each of those moves and its
    own, one line each, `SLO guard cap before -> after [rule] (what the rule read)`."""
    clock = Clock()
    knee = OnlineKneeEstimator(refit_seconds=0, floors=(FLOOR,), clock=clock)
    g = Guard("admission", FLOOR, 128, 2048, knee, refit_seconds=10.0, clock=clock)
    with caplog.at_level("INFO", logger="vllm_spark_plugin"):
        for _ in range(3):   # three rounds at the cap, between two refits
            g.decide(running=g.policy.cap, waiting=50, decode_tokens=1)
            for _ in range(ROUND_STEPS):
                g.observe(g.policy.cap, 0, ALPHA + BETA * g.policy.cap)
        clock.t += 10.0
        g.decide(running=g.policy.cap, waiting=50, decode_tokens=1)
    lines = [r.getMessage() for r in caplog.records if "SLO guard cap" in r.getMessage()]
    assert len(lines) == g.policy.moves == 3, lines
    for line in lines:
        rule = line.split("[", 1)[1].split("]", 1)[0]
        assert rule in RULES and line.startswith("vllm-spark-plugin: SLO guard cap ")


def test_guard_refits_at_most_once_per_period():
    clock = Clock()
    calls = []

    class Knee(NoSteps):
        def observe(self, *a):
            pass

        def estimate(self, force=False):
            calls.append(clock.t)
            return fit(10)

    g = Guard("both", FLOOR, 64, 2048, Knee(), refit_seconds=10.0, clock=clock)
    for _ in range(1000):
        g.decide(3, 0, 3)
        clock.t += 0.05
    assert len(calls) == 4  # 50 simulated seconds, the first refit 10 s after start


def test_prefill_guard_bounds_the_budget_only_while_decode_runs():
    clock = Clock()

    class Knee(NoSteps):
        def observe(self, *a):
            pass

        def estimate(self, force=False):
            return fit(30)

    g = Guard("prefill", FLOOR, 64, 8192, Knee(), refit_seconds=1.0, clock=clock)
    clock.t += 1
    d = g.decide(running=10, waiting=3, decode_tokens=10)
    assert d.limit is None and d.prefill_budget == 3000 and d.token_budget == 3010
    assert g.decide(running=0, waiting=3, decode_tokens=0).token_budget is None


def test_simulated_overload_never_exceeds_the_cap_never_preempts_never_loses():
    """A toy scheduler at three times the capacity: admission as vLLM's (FCFS up to the limit); the
    scenario matrix (test_guard_matrix.py) runs the same guarantees on the plant."""
    clock = Clock()
    g = Guard("admission", FLOOR, 64, 2048, NoSteps(), refit_seconds=1.0, clock=clock)
    g.knee.observe = lambda *a: None
    rng = random.Random(7)
    waiting, running, finished, arrived = [], {}, 0, 0
    for step in range(3000):
        for _ in range(rng.choice((0, 0, 1))):
            waiting.append(arrived)
            arrived += 1
        before = set(running)
        d = g.decide(len(running), len(waiting), len(running))
        limit = 64 if d.limit is None else d.limit
        if d.held:
            g.deferred.hold(waiting[:d.held])
        admitted = []
        while waiting and len(running) < limit:
            rid = waiting.pop(0)
            running[rid] = rng.randint(20, 60)
            admitted.append(rid)
        g.deferred.admitted(admitted)
        assert before <= set(running)   # nothing preempted
        assert len(running) <= max(limit, len(before)) and limit >= 1
        for rid in list(running):
            running[rid] -= 1
            if running[rid] == 0:
                del running[rid]
                finished += 1
        g.observe(len(running) or 1, 0, 0.01 + 0.001 * len(running))
        clock.t += 0.05
    assert finished + len(running) + len(waiting) == arrived
    assert g.policy.cap is not None and 1 <= g.policy.cap <= 40   # (1/20 - 0.01)/0.001 = 40 at most


# -- the step-time tail and the TTFT bound -------------------------------------------------------------
def test_tail_factor_prices_slow_steps_the_robust_fit_ignores():
    f = fit(40)  # t = 0.01 + 0.001 b
    b = np.full(1000, 10.0)
    exact = 0.01 + 0.001 * b
    assert tail_factor(f, b, np.zeros(1000), exact) == 1.0
    slow = exact.copy()
    slow[::5] *= 3.0                        # one step in five takes three times as long
    assert 1.35 < tail_factor(f, b, np.zeros(1000), slow) < 1.45   # (4 + 3) / 5 per window
    assert tail_factor(f, b[:10], np.zeros(10), slow[:10]) == 1.0  # fewer steps than one window
    assert tail_factor(f, b, np.zeros(1000), exact * 0.5) == 1.0   # faster than fitted: never above the fit
    assert tail_factor(f, b, np.zeros(1000), exact * 100) == MAX_TAIL
    assert tail_factor(None, b, np.zeros(1000), slow) == 1.0
    assert capacity_at_rate(f, FLOOR * 1.4) == 25           # (1/28 - 0.01) / 0.001 = 25.7
    assert capacity_at_rate(f, 1000.0) == 0


def test_the_cap_is_bounded_by_the_ttft_capacity_from_admission_to_first_token():
    clock = Clock()
    knee = OnlineKneeEstimator(refit_seconds=0, floors=(FLOOR,), clock=clock, ttft_slo_seconds=1.0)
    g = Guard("admission", FLOOR, 128, 2048, knee, refit_seconds=10.0, clock=clock, prior=(0.01, 0.001))
    steps(knee, g, clock)                   # capacity 40 at the floor
    for batch, ttft in ((2, 0.1), (4, 0.2), (8, 0.4), (12, 0.8), (16, 1.6), (24, 2.4)):
        for _ in range(6):
            g.observe_ttft(batch, ttft)
    clock.t += 10
    d = g.decide(running=1, waiting=100, decode_tokens=1)
    assert g.ttft_streams() is not None and 12 <= g.ttft_streams() < 16
    assert d.limit <= g.ttft_streams() < 40


def test_prefill_budget_prices_the_cost_per_token_the_last_prefill_steps_measured():
    """A chunk deep in a long prompt costs more per token than the fit's gamma (it attends to all
    the prompt before it): the budget follows the measured cost when it is higher, never lower."""
    clock = Clock()

    class Knee(NoSteps):
        def observe(self, *a):
            pass

        def estimate(self, force=False):
            return fit(30)                  # alpha 10 ms, beta 1 ms, gamma 10 us per prefill token

    g = Guard("prefill", FLOOR, 64, 8192, Knee(), refit_seconds=1.0, clock=clock)
    clock.t += 1
    assert g.decide(running=10, waiting=0, decode_tokens=10).prefill_budget == 3000
    g.observe(11, 100, 0.010 + 0.011 + 100 * 1e-4)   # this chunk cost 100 us a token
    assert g.token_cost == pytest.approx(1e-4)
    assert g.decide(running=10, waiting=0, decode_tokens=10).prefill_budget == 300   # (50 - 10 - 10 ms) / 100 us
    g.observe(11, 100, 0.010 + 0.011 + 100 * 1e-6)   # cheaper than gamma: gamma still rules
    assert g.decide(running=10, waiting=0, decode_tokens=10).prefill_budget == int(0.030 / max(g.token_cost, 1e-5))
    assert prefill_budget(fit(30), FLOOR, 10, 8192, token_cost=1e-6) == 3000
