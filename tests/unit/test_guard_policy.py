"""The SLO guard's decisions (guard/), deterministic: synthetic fits and a simulated clock."""
from __future__ import annotations

import random

import numpy as np
import pytest

from vllm_spark_plugin.guard import MIN_PREFILL_CHUNK, AdmissionPolicy, Deferred, Guard, prefill_budget, usable
from vllm_spark_plugin.guard.policy import MAX_TAIL, applied_capacity, capacity_at_rate, tail_factor
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


# -- admission ---------------------------------------------------------------------------------------
def test_no_usable_fit_means_no_cap():
    p = AdmissionPolicy(FLOOR, 64)
    extrapolated = fit(10, VERDICT_NO_KNEE)
    extrapolated.max_measured = 8.0
    for f in (None, fit(10, VERDICT_TOO_FEW), fit(10, VERDICT_NO_KNEE), extrapolated, fit(None)):
        assert not usable(f, FLOOR)
        assert p.update(f) is None and p.limit(5) is None


def test_without_a_knee_a_capacity_within_the_measured_batches_is_usable():
    """Once the cap holds, the batches stay below the knee: the capacity seen there still counts."""
    measured = fit(6, VERDICT_NO_KNEE)
    measured.max_measured = 6.0
    assert usable(measured, FLOOR)
    assert AdmissionPolicy(FLOOR, 64).update(measured) == 6


def test_a_cap_that_goes_unusable_is_lifted():
    p = AdmissionPolicy(FLOOR, 64)
    assert p.update(fit(10)) == 10
    assert p.update(fit(10, VERDICT_TOO_FEW)) is None and p.limit(3) is None


def test_bounds_never_below_one_never_above_max_num_seqs():
    p = AdmissionPolicy(FLOOR, 16)
    assert p.update(fit(0)) == 1
    p = AdmissionPolicy(FLOOR, 16)
    assert p.update(fit(500)) == 16


def test_hysteresis_up_and_small_moves_wait_for_confirmation_big_moves_down_are_immediate():
    p = AdmissionPolicy(FLOOR, 64, band=2, confirm=2)
    assert p.update(fit(10)) == 10
    assert p.update(fit(11)) == 10      # one stream up, once: held
    assert p.update(fit(10)) == 10      # back: the count restarts
    assert p.update(fit(11)) == 10
    assert p.update(fit(11)) == 11      # twice in a row: moved
    assert p.update(fit(10)) == 11
    assert p.update(fit(12)) == 11      # other side: restarts
    assert p.update(fit(7)) == 7        # 4 streams down: at once
    assert p.update(fit(15)) == 7       # 8 streams up: never at once (admitted requests cannot be taken back)
    assert p.update(fit(13)) == 13      # confirmed, to the nearer of the two targets


def test_the_cap_moves_by_whole_streams_and_not_on_every_refit():
    rng = random.Random(3)
    p = AdmissionPolicy(FLOOR, 64)
    moves = 0
    last = p.update(fit(20))
    for _ in range(200):  # a capacity that jitters by one stream around 20
        cap = p.update(fit(20 + rng.choice((-1, 0, 1))))
        assert isinstance(cap, int)
        moves += cap != last
        last = cap
    assert moves < 100


def test_the_limit_is_never_below_what_runs_so_nothing_is_preempted():
    p = AdmissionPolicy(FLOOR, 64)
    p.update(fit(8))
    assert p.limit(3) == 8
    assert p.limit(12) == 12          # more run than the cap: none admitted, none preempted
    assert p.limit(80) == 64          # and never above vLLM's own limit


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


def test_guard_leaves_vllm_alone_until_the_fit_has_a_verdict_then_caps():
    clock = Clock()
    knee = OnlineKneeEstimator(refit_seconds=0, floors=(FLOOR,), clock=clock)
    g = Guard("admission", FLOOR, 128, 2048, knee, refit_seconds=10.0, clock=clock)
    d = g.decide(running=5, waiting=50, decode_tokens=5)
    assert d.limit is None and d.token_budget is None and d.held == 0
    steps(knee, g, clock)
    clock.t += 10
    d = g.decide(running=5, waiting=50, decode_tokens=5)
    # 1/(0.01 + 0.001 b) >= 20  ->  b <= 40
    assert d.limit == 40 and d.token_budget is None
    d = g.decide(running=40, waiting=50, decode_tokens=40)
    assert d.limit == 40 and d.held == 50


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
    """A toy scheduler at three times the capacity: admission as vLLM's (FCFS up to the limit)."""
    clock = Clock()

    class Knee(NoSteps):
        def observe(self, *a):
            pass

        def estimate(self, force=False):
            return fit(12)

    g = Guard("admission", FLOOR, 64, 2048, Knee(), refit_seconds=1.0, clock=clock)
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
        if step > 200:
            assert len(running) <= 12
        for rid in list(running):
            running[rid] -= 1
            if running[rid] == 0:
                del running[rid]
                finished += 1
        clock.t += 0.05
    assert finished + len(running) + len(waiting) == arrived


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


def test_with_a_heavy_step_tail_nine_in_ten_request_length_stretches_meet_the_floor():
    """Steps at one in five three times slower: the cap from the typical step lets most 64-step
    stretches miss the floor; the cap with the tail priced in keeps nine in ten at it."""
    rng = np.random.default_rng(3)
    clock = Clock()
    knee = OnlineKneeEstimator(refit_seconds=0, floors=(FLOOR,), clock=clock)
    g = Guard("admission", FLOOR, 128, 2048, knee, refit_seconds=10.0, clock=clock)

    def step_time(b, n):
        return (0.005 + 0.0005 * b) * np.where(rng.random(n) < 0.2, 3.0, 1.0)

    for _ in range(30):
        for b in (1, 2, 4, 8, 16, 32, 64, 96):
            for t in step_time(b, 4):
                g.observe(b, 0, float(t))
                clock.t += 0.01
    clock.t += 10
    d = g.decide(running=1, waiting=200, decode_tokens=1)
    typical = g.fit.capacity_at(FLOOR)      # ~ (1/20 - 0.005)/0.0005 = 90
    assert g.tail > 1.2 and d.limit == g.policy.cap == capacity_at_rate(g.fit, FLOOR * g.tail) < typical

    def share_meeting(batch):
        t = step_time(batch, 64 * 400).reshape(400, 64)
        return float(np.mean(64 / t.sum(axis=1) >= FLOOR))

    assert share_meeting(d.limit) >= 0.9
    assert share_meeting(typical) < 0.5


def test_the_cap_is_bounded_by_the_ttft_capacity_from_admission_to_first_token():
    clock = Clock()
    knee = OnlineKneeEstimator(refit_seconds=0, floors=(FLOOR,), clock=clock, ttft_slo_seconds=1.0)
    g = Guard("admission", FLOOR, 128, 2048, knee, refit_seconds=10.0, clock=clock)
    steps(knee, g, clock)                   # capacity 40 at the floor
    for batch, ttft in ((2, 0.1), (4, 0.2), (8, 0.4), (12, 0.8), (16, 1.6), (24, 2.4)):
        for _ in range(6):
            g.observe_ttft(batch, ttft)
    clock.t += 10
    d = g.decide(running=1, waiting=100, decode_tokens=1)
    assert g.ttft_streams() is not None and 12 <= g.ttft_streams() < 16
    assert d.limit == g.ttft_streams() < 40


def test_a_tailed_cap_the_batches_reached_stays_usable_without_a_knee():
    """Held at a tailed cap of 7, the batches never pass 7 and the fit sees no knee, with the fit's
    own capacity (21) beyond them: the cap must hold (lifting it let 13 requests in at once and every
    one of them missed the floor on the test bed), since what it applies was measured."""
    f = fit(21, VERDICT_NO_KNEE, alpha=0.003, beta=0.0002)
    f.max_measured = 7.0
    tail = 1.0 / (FLOOR * (0.003 + 0.0002 * 7.5))   # the floor * tail that the line meets at 7.5 streams
    p = AdmissionPolicy(FLOOR, 64)
    assert not usable(f, FLOOR) and p.update(f) is None       # untailed: extrapolated, no cap
    assert applied_capacity(f, FLOOR, tail) == 7 and usable(f, FLOOR, 7)
    assert p.update(f, tail=tail) == 7


def test_a_binding_cap_whose_fit_sees_no_knee_rises_one_stream_at_a_time_instead_of_going():
    """Held at 15, the batches never pass 15; a fit with no knee and a capacity of 17 beyond them is
    an extrapolation.  Lifting the cap let every held request in at once (on the test bed all of those
    missed the floor): the cap rises one stream past what was measured, one step per confirmation."""
    p = AdmissionPolicy(FLOOR, 64, band=2, confirm=2)
    assert p.update(fit(15)) == 15
    f = fit(17, VERDICT_NO_KNEE)
    f.max_measured = 15.0
    assert p.update(f) == 15 and p.update(f) == 16     # confirmed on the second refit
    f.max_measured = 16.0
    assert p.update(f) == 16 and p.update(f) == 17
    # with no cap in force, no knee in range still leaves vLLM alone
    assert AdmissionPolicy(FLOOR, 64).update(f) is None
    # an unusable fit of another kind still lifts the cap
    assert p.update(fit(17, VERDICT_TOO_FEW)) is None


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
