"""The loop's slow-start, intercept and spread rules of iteration 12 (docs/guard.md, "The loop" and
"The matrix"), each on synthetic steps with a seeded noise."""
from __future__ import annotations

import random

import pytest

from vllm_spark_plugin.guard import LoopPolicy
from vllm_spark_plugin.guard.loop import COLD, ROUND_STEPS, TRACK, upper_quantile

ALPHA, BETA = 0.022, 0.0012
PREFILL = 1.5e-4  # seconds a prefill token costs


def feed(p, batch, n, rng, alpha=ALPHA):
    for _ in range(n):
        p.observe_step(batch, 0, (alpha + BETA * batch) * rng.lognormvariate(0, 0.05))


def test_a_cohorts_90th_percentile_is_read_at_rank_0_9_n_plus_1():
    assert upper_quantile(list(range(1, 21)), 0.9) == pytest.approx(18.9)   # 20 values: past the 18th
    assert upper_quantile(list(range(1, 9)), 0.9) == 8                      # 8 values: the largest
    assert upper_quantile([3.0], 0.9) == 3.0


def test_a_round_at_one_without_room_rounds_again_instead_of_holding_one_for_good():
    p, rng = LoopPolicy(38.0, 64), random.Random(1)   # target 26.3 ms: a lone stream (23.2 ms) has room
    feed(p, 1, ROUND_STEPS, rng, alpha=0.026)          # a round of slow steps: no room at 1, no slope
    assert p.cap == 1 and p.state == COLD
    feed(p, 1, ROUND_STEPS, rng)                       # the next round at 1 leaves room: the slow start goes on
    assert p.cap == 2 and p.state == COLD


def test_a_round_past_x_holds_its_cap_while_its_own_steps_leave_room():
    """The first wave's prompts (1024 tokens each) all came in the round's first step, so x prices
    25 prompt tokens a stream-step where a steady load brings a few: x reads 3 at a cap of 7."""
    def first_round(alpha):
        p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(2)
        assert p.cap == 7
        p.observe_step(7, 7 * 1024, alpha + BETA * 7 + PREFILL * 7 * 1024)
        feed(p, 7, ROUND_STEPS, rng, alpha=alpha)
        return p
    p = first_round(ALPHA)                  # mean step 30.4 ms + s 2.1 under the target of 41.7: hold 7
    assert p.x is None and p._streams() < 7 and p.state == TRACK and p.cap == 7
    slow = first_round(0.040)               # mean step 48.4 ms: no room at 7, back by at most half
    assert slow.state == TRACK and slow.cap == 4


def test_the_intercepts_first_readings_weigh_by_their_steps():
    """A 40-step round with slow steps reads the intercept 8 ms high; the first refit's 340 steps
    outweigh it at once instead of moving it 0.3 of the way."""
    p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(3)
    feed(p, 7, ROUND_STEPS, rng, alpha=0.030)
    assert p.alpha == pytest.approx(0.030, abs=1e-3) and p.state == TRACK and p.cap == 7
    feed(p, 7, 300, rng)                    # one refit period at the cap
    p.refit(10.0)
    assert p.alpha < 0.025                  # 0.3 of the way would leave it at 27.8 ms


def test_a_request_that_ran_above_the_cap_in_force_is_left_out_of_the_spread():
    p = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
    p.alpha, p._measured, p.cap = ALPHA, True, 5
    p.observe_finished(0.080, 10.0)         # ran at 10 streams before the cap fell to 5
    assert len(p.finished) == 0
    p.observe_finished(0.030, 5.4)          # within half a stream of the cap: read
    p.observe_finished(0.030, 3.0)
    assert len(p.finished) == 2
