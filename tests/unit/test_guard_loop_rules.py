"""The loop's slow-start, intercept and spread rules of iterations 12 and 13 (docs/guard.md, "The loop" and
"The matrix"), each on synthetic steps with a seeded noise."""
from __future__ import annotations

import random

import pytest

from vllm_spark_plugin.guard import LoopPolicy
from vllm_spark_plugin.guard.loop import COLD, REACH, ROUND_STEPS, RULES, TRACK, parse_move, upper_quantile

from support.guard_matrix import CPU

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
    assert p.rules == {"cold-double": 1}
    moved = p.refit(10.0)                              # the refit reports the round's move with its reading
    assert moved.startswith("1 -> 2 [cold-double] (round at 1: mean step ") and "slope unknown" in moved
    assert p.refit(20.0) is None


def test_a_rounds_tail_steps_count_at_the_share_all_rounds_show_not_at_their_own_luck():
    """Target 26.3 ms, spread prior 1.3: room at 1 while the mean step is under 25.0 ms.  A round of lone
    23.2 ms steps with two slow steps (4x) in it has a plain mean of 26.7 ms, and read so the slow start
    held 1 for another round; its mean outside the tail (23.2) times the tail's share over the rounds so
    far, read as if 80 steps without a tail had come first (x1.07), is 24.8: room.  Steps that are all
    slow are a slow level, not a tail: no room."""
    tail = [0.0232] * 38 + [0.0928] * 2
    p = LoopPolicy(38.0, 64)
    for t in tail:
        p.observe_step(1, 0, t)
    assert sum(tail) / len(tail) > 0.025 and p.cap == 2 and p.rules == {"cold-double": 1}
    assert "round at 1: mean step 24.8 + spread 1.3 ms" in p.refit(10.0)
    slow = LoopPolicy(38.0, 64)
    for _ in range(ROUND_STEPS):
        slow.observe_step(1, 0, 0.026)
    assert slow.cap == 1 and slow.moves == 0


def test_a_round_past_x_keeps_its_cap_while_its_own_steps_leave_room():
    """The first wave's prompts (1024 tokens each) all came in the round's first step, so x prices
    25 prompt tokens a stream-step where a steady load brings a few: x reads 3 at a cap of 7."""
    def first_round(alpha):
        p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(2)
        assert p.cap == 7
        p.observe_step(7, 7 * 1024, alpha + BETA * 7 + PREFILL * 7 * 1024)
        feed(p, 7, ROUND_STEPS, rng, alpha=alpha)
        return p, rng
    p, rng = first_round(ALPHA)             # mean step 30.4 ms + s 2.1 under the target of 41.7: room at 7
    assert p.x is None and p._streams() < 7
    assert p.state == COLD and p.cap == 8   # no slope read across 4 streams yet: a round at 8 measures one more
    feed(p, 8, ROUND_STEPS, rng, alpha=0.040)  # that round has no room (48 ms steps): back to 7, the last with room
    assert p.state == TRACK and p.cap == 7
    assert p.rules == {"cold-climb": 1, "cold-back-to-room": 1}
    # the refit reports the rounds' moves, then its own (the period's slow steps re-anchor the intercept), in order
    assert [line.split(" (")[0] for line in p.refit(10.0).splitlines()] == \
        ["7 -> 8 [cold-climb]", "8 -> 7 [cold-back-to-room]", "7 -> 4 [down-now]"]
    slow, _ = first_round(0.040)            # mean step 48.4 ms: no room at 7, back by at most half
    assert slow.state == TRACK and slow.cap == 4 and slow.rules == {"cold-back": 1}


def test_a_reported_move_reads_back_as_before_after_and_rule():
    p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(2)
    feed(p, 7, ROUND_STEPS, rng)
    feed(p, 8, ROUND_STEPS, rng, alpha=0.040)
    moves = [parse_move("INFO 12-07 vllm-spark-plugin: SLO guard cap " + line) for line in p.refit(10.0).splitlines()]
    assert len(moves) == p.moves >= 2
    assert [m[0] for m in moves] == [7] + [m[1] for m in moves[:-1]] and moves[-1][1] == p.cap  # a chain
    tally = {}
    for _, _, rule in moves:
        tally[rule] = tally.get(rule, 0) + 1
    assert tally == p.rules and set(tally) <= set(RULES)
    assert parse_move("none -> 3 [] (a cap set where there was none)") == (None, 3, "")
    assert parse_move("SLO guard cap in force: 7") is None


bent = CPU.decode_step  # the CPU build's decode step: 5 ms, 0.25 ms a stream, 0.8 ms the second stream brings


def test_the_slow_start_climbs_past_a_slope_read_at_streams_1_and_2_while_the_rounds_leave_room():
    """Floor 135 tok/s (7.4 ms a token, 7.0 less the spread's prior): 4 streams leave room (6.9 ms), 5
    do not (7.1).  The line through levels 1 and 2 (0.95 ms a stream) puts x at 2; climbing a stream a
    round measures 3, 4 and 5 and tracks from 4, the last round with room."""
    p, rng = LoopPolicy(135.0, 64), random.Random(4)
    for _ in range(12):
        if p.state != COLD:
            break
        for _ in range(ROUND_STEPS):
            p.observe_step(p.cap, 0, bent(p.cap) * rng.lognormvariate(0, 0.01))
    assert p.state == TRACK and p.cap == 4
    assert p.beta > 1.5 * p.levels.slope_near(4)  # the line through levels 1-5 is steeper ...
    assert p.levels.slope_near(4) < 0.0004        # ... than the secant at the cap, the slope there
    assert p.levels.slope_near(1) > 0.0008        # the secant from 1 to 2: the bend (0.88 ms)


def test_a_tracking_cap_reads_the_slope_at_the_cap_when_the_levels_are_close():
    """A cap of 3 holds the batch at levels 2-4: the slope the refit reads is the secant from the cap's
    level to the one above, not the line from level 1; and x follows it."""
    p, rng = LoopPolicy(140.0, 64), random.Random(5)
    p.state, p.cap, p.alpha, p.beta, p._measured = TRACK, 3, 0.0042, 0.00095, True
    for b in (1, 2, 3, 4):
        for _ in range(40):
            p.observe_step(b, 0, bent(b))
    assert p.levels.slope() is None               # levels 1-4 span 3 streams
    assert p.levels.slope_near(3) == pytest.approx(bent(4) - bent(3))
    for _ in range(300):
        p.observe_step(3, 0, bent(3))
    p.refit(10.0)
    assert p.beta == pytest.approx(0.00095 * 0.75)  # half way toward the secant, a move bounded by half
    assert p.x > 3.0                                # the steep line put x at 2.6


def test_the_intercepts_first_readings_weigh_by_their_steps():
    """A 40-step round with slow steps reads the intercept 8 ms high; the first refit's 340 steps
    outweigh it at once instead of moving it 0.3 of the way."""
    p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(3)
    feed(p, 2, 8, rng, alpha=0.030)         # levels 4 streams apart: the slope is read, no climb past x
    feed(p, 6, 8, rng, alpha=0.030)
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


def test_one_cohorts_spread_moves_the_spread_by_a_bounded_step():
    """A cohort that ran beside a change reads 17 ms where 1 ms was in use: it counts as 3 ms (three times
    the spread in use, more than the prior's 5% of the target), half way: 2 ms.  A cohort reading 0
    counts as half the spread in use."""
    def with_spread(spread, readings):
        p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(6)
        feed(p, 2, 8, rng)
        feed(p, 6, 8, rng)
        feed(p, 7, ROUND_STEPS, rng)
        p.spread, p._spread_known = spread, True
        feed(p, 7, 300, rng)
        mean_step = p._period[1] / p._period[0]
        for r in readings:  # seconds per token above the mean step at the period's batch
            p.observe_finished(mean_step + r, 7.0)
        p.refit(10.0)
        return p.spread
    assert with_spread(0.001, [0.017] * 8) == pytest.approx(0.002, rel=0.05)
    assert with_spread(0.001, [0.0] * 8) == pytest.approx(0.00075, rel=0.05)
    assert with_spread(0.001, [0.0015] * 8) == pytest.approx(0.00125, rel=0.2)  # within the bounds: half way
    # a spread worn down to 1 us by quiet cohorts: a reading counts up to the prior's 5% of the target
    # (41.7 ms a token: 2.1 ms), not only to 3 us
    assert with_spread(1e-6, [0.017] * 8) == pytest.approx(0.5 * 0.05 / 24.0, rel=0.01)


def _tracking(rng, levels=(2, 3, 6, 8, 10), steps=200):
    """A loop tracking at a cap of 3 whose levels were read at 2-10 streams at the host's usual speed."""
    p = LoopPolicy(24.0, 64, prior=(ALPHA, BETA))
    p.state, p.cap, p.alpha, p.beta, p._measured = TRACK, 3, ALPHA, BETA, True
    for b in levels:
        feed(p, b, steps, rng)
    p.refit(0.0)
    return p


def test_the_levels_follow_the_hosts_speed_where_the_cap_no_longer_goes():
    """Another job slows every step by half while the cap holds the batch at 3: the levels at 6-10 streams,
    no longer visited, follow the speed the steps at 3 measure, so the slope read across them is the
    slowed host's (a level read at the old speed beside one read at the new gives any slope); when the
    host comes back, they come back with it."""
    rng = random.Random(7)
    p = _tracking(rng)
    before = {b: p.levels.mean(b) for b in (2, 10)}
    for k in range(1, 4):
        feed(p, 3, 300, rng, alpha=1.5 * ALPHA)   # 1.5x the intercept: about 1.4x the step at 3
        p.refit(10.0 * k)
    slowed = (1.5 * ALPHA + BETA * 3) / (ALPHA + BETA * 3)
    assert p.levels.mean(10) / before[10] == pytest.approx(slowed, rel=0.03)
    for k in range(4, 8):
        feed(p, 3, 300, rng)
        p.refit(10.0 * k)
    assert p.levels.mean(10) / before[10] == pytest.approx(1.0, rel=0.03)
    assert p.levels.slope() == pytest.approx(BETA, rel=0.15)


def test_a_level_read_high_by_one_round_does_not_move_the_others():
    """A level first read from one 40-step round 2% high, then at length at the usual speed: the period's
    steps differ from its mean by its own error, not the host's speed (the level's 40 steps weigh in the
    evidence), so the other levels keep their means."""
    rng = random.Random(8)
    p = _tracking(rng, levels=(2, 6, 10))
    for _ in range(ROUND_STEPS):
        p.observe_step(4, 0, 1.02 * (ALPHA + BETA * 4) * rng.lognormvariate(0, 0.05))
    p.refit(10.0)
    before = {b: p.levels.mean(b) for b in (2, 6, 10)}
    for k in range(2, 5):
        feed(p, 4, 300, rng)
        p.refit(10.0 * k)
    for b, m in before.items():
        assert p.levels.mean(b) == pytest.approx(m, rel=0.005)


def test_a_slow_start_the_load_does_not_reach_climbs_at_the_refit_and_one_it_reaches_does_not():
    """Floor 20 tok/s on the prior (22 ms + 1.2 ms a stream): x is 21 streams and the slow start begins at
    10.  Arrivals that keep the batch just under the cap (9) never make a round at it, so the refit raises
    it, by at most two streams past the batch measured (REACH); where requests waited at the cap this
    period, the rounds do that; and a batch that stays at 3 leaves the cap where it is (x there is the
    prior's line, extrapolated)."""
    def period(bound, batch=9):
        p, rng = LoopPolicy(20.0, 64, prior=(ALPHA, BETA)), random.Random(11)
        assert p.cap == 10 and p.state == COLD
        if bound:
            p.limit(10, 2)
        feed(p, batch, 40, rng)
        moved = p.refit(10.0)
        return p, moved
    idle, moved = period(bound=False)
    assert idle.state == COLD and idle.x > 20 and idle.cap == 9 + REACH
    assert moved.startswith("10 -> 11 [cold-raise]") and moved.endswith("; highest batch measured 9)")
    assert period(bound=True)[0].cap == 10
    quiet, moved = period(bound=False, batch=3)
    assert quiet.x > 20 and quiet.cap == 10 and moved is None


def _bursty(step_batch, rng, p, at_cap=0):
    """One period: 40 decode steps at `step_batch` (and `at_cap` more at the cap), and 20 requests finished
    at a mean batch of 6, each 8-10 ms a token above the model there (37-39 ms a token against a target
    of 41.7)."""
    feed(p, step_batch, 40, rng)
    feed(p, p.cap, at_cap, rng)
    for _ in range(20):
        p.observe_finished(ALPHA + BETA * 6 + 0.010 * rng.uniform(0.8, 1.0), 6.0)


def test_requests_that_met_the_floor_with_room_under_a_cap_the_batch_seldom_reaches_raise_it():
    """The model's x is the batch at which 90% of requests meet the floor: 8 here (a spread of 10 ms).
    Under arrivals in bursts the batch sat at 6 and reached the cap of 10 at times, and every request met
    the floor with more than a stream's step to spare, so the cap rises to 11 (two refits agreeing)
    instead of falling to 8; where the period's batch sits at the cap the model's x moves it, down at
    once; and where the batch never came near the cap (a quiet load), the requests' rates say nothing of
    the cap and it stays (the creep of a cap under a light load, which the next burst met)."""
    def tracking(step_batch, at_cap):
        p, rng = LoopPolicy(24.0, 64, prior=(ALPHA, BETA)), random.Random(12)
        p.state, p.cap, p.spread, p._spread_known, p._measured, p._anchor = TRACK, 10, 0.010, True, True, ALPHA
        for now in (10.0, 20.0):
            _bursty(step_batch, rng, p, at_cap)
            p.refit(now)
        return p
    bursts = tracking(6, at_cap=10)
    assert bursts._streams() < 9 and bursts.x == 11.0 and bursts.cap == 11
    assert bursts.rules == {"up-outcomes": 1}
    at_cap = tracking(10, at_cap=0)
    assert at_cap.x < 9 and at_cap.cap == 8
    quiet = tracking(6, at_cap=0)
    assert quiet.x == 11.0 and quiet.cap == 10 and quiet.levels.highest() == 6


def test_requests_that_met_the_floor_at_the_cap_hold_it_against_a_model_half_a_stream_short():
    """Floor 37.9 tok/s (26.4 ms a token), 22 ms + 1.2 ms a stream, cap 3: with a spread of 1.6 ms the model
    puts x at 2.7 (and at 3.0 once their cohort is read), where the requests that ran at the cap all took 25 ms a token.  At a cap of 2 or 3 a
    stream is a third of the goodput, and the model is that far off by a spread read a few tenths of a
    millisecond high; the gate itself, measured at the cap, holds it.  Requests that ran at a batch of 1
    say nothing of the cap (it falls), and neither do met requests when x is half a stream or more
    below the cap (a host that slowed: down at once)."""
    def tracking(spread, batch, per_period):
        p, rng = LoopPolicy(37.936, 64, prior=(ALPHA, BETA)), random.Random(13)
        p.state, p.cap, p.spread, p._spread_known, p._measured, p._anchor = TRACK, 3, spread, True, True, ALPHA
        for now in (10.0, 20.0):
            feed(p, 3, 40, rng)
            for _ in range(per_period):
                p.observe_finished(0.025, batch)
            p.refit(now)
        return p
    held = tracking(0.0016, 3.0, 6)
    assert 2.5 <= held._streams() < 3 and held.x == 3.0 and held.cap == 3 and held.moves == 0
    lone = tracking(0.0016, 1.0, 6)
    assert lone.cap == 2 and set(lone.rules) <= {"down-confirmed", "down-now"}
    slowed = tracking(0.0030, 3.0, 12)
    assert slowed.cap == 2 and slowed.rules == {"down-now": 1}
