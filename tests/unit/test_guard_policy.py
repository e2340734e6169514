"""The SLO guard's decisions (guard/), deterministic: synthetic fits and a simulated clock."""
from __future__ import annotations

import random

import pytest

from vllm_spark_plugin.guard import MIN_PREFILL_CHUNK, AdmissionPolicy, Deferred, Guard, prefill_budget, usable
from vllm_spark_plugin.knee.online import OnlineKneeEstimator
from vllm_spark_plugin.knee.result import VERDICT_NO_KNEE, VERDICT_OK, VERDICT_TOO_FEW, KneeResult

FLOOR = 20.0


def fit(capacity, verdict=VERDICT_OK, alpha=0.01, beta=0.001, gamma=1e-5):
    return KneeResult(verdict, source="steps", alpha_seconds=alpha, beta_seconds=beta,
                      gamma_seconds_per_prefill_token=gamma, capacity={"20": capacity})


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


def test_hysteresis_small_moves_wait_for_confirmation_big_moves_are_immediate():
    p = AdmissionPolicy(FLOOR, 64, band=2, confirm=2)
    assert p.update(fit(10)) == 10
    assert p.update(fit(11)) == 10      # one stream up, once: held
    assert p.update(fit(10)) == 10      # back: the count restarts
    assert p.update(fit(11)) == 10
    assert p.update(fit(11)) == 11      # twice in a row: moved
    assert p.update(fit(10)) == 11
    assert p.update(fit(12)) == 11      # other side: restarts
    assert p.update(fit(7)) == 7        # 4 streams away: at once


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

    class Knee:
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

    class Knee:
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

    class Knee:
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
