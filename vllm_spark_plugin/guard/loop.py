"""The admission cap as a control loop (docs/guard.md, "The loop"): a step-time model that survives its
own feedback, a slow start from cold, a correction from measured outcomes, bounded moves, a dead band.

Everything is in step-time space and additive.  The target is the engine-clock seconds per token a
stream may take, `T = 1 / (floor * ratio)` (`ratio`: the delivery clock's seconds per token over the
engine's, fed back from the API server).  A stream at batch b pays the mean step at b,
`a + (beta + p) * b`, and the requests spread around that mean by `s`.  So the streams at the floor
are `x = (T - s - a) / (beta + p)`, and the cap follows x:

* `beta` (the decode slope) comes from per-batch-level means of decode-only steps (`StepLevels`);
  while the levels span fewer than MIN_SPAN streams (a binding cap keeps the batch at one or two
  levels) it comes from the secant at the cap (`slope_near`: steps bend at small batches, so a line
  read at streams 1-2 is not the slope at 4), and with no second level the last usable slope is
  kept: the loop never falls back to "no model"; the levels follow the host's speed (a period's steps
  against their levels' means, past three standard errors), so a level read before a slowdown and one
  read after it do not tilt the line;
* `a` is re-anchored at each refit on the decode-only steps measured since the last one, whatever
  their batch (`mean(t) - beta * mean(b)`): it needs no spread and carries the step-time tail;
* `p` is the prefill each running stream brings into every step in steady admission: the measured
  cost of a prefill token (what a step with prefill took beyond the decode line, per token) times
  the prefill tokens per stream-step, both read over minutes, so a first wave whose prefills came
  before its first tokens, or a shift of prompt lengths, moves it smoothly and not by the luck of a
  period;
* `s` is measured on the requests that finished (each one's seconds per token above the model at the
  mean batch of its steps), so a bias the step model cannot see converges instead of being
  multiplied into the floor; a cohort's 90th percentile is read at rank 0.9 (n + 1), and a request
  that ran at a mean batch above the cap now (before a fall) is left out;
* under arrivals in bursts (a period whose mean batch sat a stream or more below the cap) x is read
  from the requests that finished under the cap as well: x is the batch at which 90% meet the floor,
  and a cap the batch reaches only at times keeps 90% at the floor higher than that, so when 90% of
  them would still meet it with one more stream's step on every token, x is at least cap + 1 (when
  90% met it as they ran, at least the cap);
* whatever the arrivals, x less than half a stream below the cap is held at the cap when 90% of the
  requests that ran at it met the floor (`_held`): near the single-stream rate a stream is a third of
  the goodput, and a spread read a few tenths of a millisecond high is that far off.

States: `cold` runs a slow start, the cap doubling each round of `round_steps` decode steps at the
cap while the mean step (read outside the round's tail, times the tail's share over every round:
`_round_mean`) leaves room, toward x as soon as a slope is known (the levels', read from
any two levels while cold, or a prior's), and past x one stream a round while the rounds leave room
and no slope spans MIN_SPAN streams (a period in which no request waited at the cap, so no round ran,
raises it at the refit instead, to x by at most doubling); `track` moves the cap toward x at each
refit, down at once when x is half a stream or more below it (by at most half the cap), up only after
two refits agree (to the lower of them, by at most doubling the cap), and not at all while x is
within [cap, cap + 1).  In either state a refit raises the cap at most REACH streams past the highest
batch the levels have measured: x past that is the line extrapolated, and a quiet load reads the line
at small batches (flat on a GPU until compute binds), so a cap that crept there met the next burst by
admitting every waiting request at once.
Pure Python, no vLLM, no clock of its own: the caller passes `now`.
"""
from __future__ import annotations

import math
import re
from collections import deque

COLD, TRACK = "cold", "track"
ROUND_STEPS = 40          # steps at the cap per slow-start round: enough for a mean step at that batch
LEVEL_HALFLIFE = 120.0    # seconds: the slope forgets levels not seen for a few minutes
MIN_LEVEL_STEPS = 8       # a level's mean counts toward the slope with this many decode steps
MIN_SPAN = 4              # streams between the lowest and highest level the slope is read from
COLD_SPAN = 1             # ... during the slow start: a rough slope from two levels beats doubling blind
OUTLIER = 2.0             # a decode step this many times its level's mean is left out of the slope
TAIL_PRIOR_STEPS = 80     # steps without a tail the slow start's rounds assume before theirs (two rounds)
LEVEL_WEIGHT_CAP = 200.0  # one crowded level does not drown the others in the slope's fit
MIN_FINISHED = 8          # finished requests in a cohort before its spread is read (else it waits a refit)
FINISHED_KEEP = 256       # a cohort never holds more
SPREAD_QUANTILE = 0.9     # >= 90% of requests at the floor
DOWN_NOW = 0.5            # streams: x this far below the cap moves it down at once
CONFIRM_UP = 2            # refits in a row that must agree before the cap rises (to the lower of them)
SMOOTH = 0.5              # weight of the newest refit in the slope and the spread ...
PREFILL_HALFLIFE = 60.0   # seconds: the prefill a stream brings is read over a few request lives
ANCHOR_SMOOTH = 0.3       # ... and in the intercept (a period holds few of the longest prefill steps),
                          # or the reading's share of the steps read so far when that is more
ABOVE_CAP = 0.5           # streams: a finished request whose mean batch was this far above the cap ran
                          # under a higher cap (before a fall); the spread leaves it out
SPREAD_PRIOR = 0.05       # of the target: the spread assumed until finished requests measure it
SPREAD_STEP = (2.0, 3.0)  # a cohort's reading counts at most this many times below / above the spread in
                          # use (above: or up to SPREAD_PRIOR of the target)
SPEED_EVIDENCE = 3.0      # standard errors: a change of the host's speed the levels follow
OUTCOMES_MIN = 12         # requests finished under the cap in force before their rates may hold or raise it
OUTCOMES_SECONDS = 15.0   # ... read over this period and those that ended this recently
BELOW_CAP = 1.0           # streams: a period whose mean batch is this far below the cap ran under a cap
                          # that binds only at times (arrivals in bursts): its requests' rates price it
REACH = 2                 # streams: the cap rises at most this far past the highest batch measured (as
                          # TCP's congestion avoidance: a stream or two past what the steps have shown)
RATIO_RANGE = (0.5, 3.0)  # a delivery/engine ratio outside this is a broken feedback, clamped

# The rules that move the cap, each move's key in the log and in `LoopPolicy.rules` (docs/guard.md, "The loop")
RULES = {
    "cold-double": "slow start: the round's mean step left room and no slope is known yet, so the cap doubles",
    "cold-halve": "slow start: the round's mean step left no room and no slope is known yet, so back by half",
    "cold-toward-x": "slow start: a slope is known and the cap is short of x, so toward x (at most doubling)",
    "cold-climb": "slow start: at or past x but the round left room and no slope spans MIN_SPAN streams: one more",
    "cold-back-to-room": "slow start: the climb's round left no room, so back to the last cap that had room",
    "cold-back": "slow start: at or past x and no room, so back (by at most half) and track",
    "cold-raise": "slow start: the load did not reach the cap this period, so the refit raises it toward x",
    "down-now": "x fell half a stream or more below the cap: down at once (by at most half)",
    "down-confirmed": "x below the cap (by less than half a stream) at two refits in a row, and under 90% of the "
                      "requests that ran at the cap met the floor: down",
    "down-ttft": "the TTFT capacity is below the cap: down to it",
    "up-confirmed": "two refits in a row put x above the cap: up to the lower of them (at most doubling)",
    "up-outcomes": "as up-confirmed, x read from the requests' own rates under a cap the batch reached only at times",
}

MOVE_LINE = re.compile(r"(\d+|none) -> (\d+) \[([a-z-]*)\]")  # a move as `refit` reports it (and the log shows it)


def parse_move(line: str) -> tuple[int | None, int, str] | None:
    """(cap before, cap after, rule) of the first move `LoopPolicy.refit` reported in `line` (a log line
    holding one), or None."""
    m = MOVE_LINE.search(line)
    if m is None:
        return None
    return (None if m.group(1) == "none" else int(m.group(1))), int(m.group(2)), m.group(3)


def upper_quantile(values, q: float) -> float:
    """The q-quantile of a small sample read at rank q (n + 1) (1-based), the largest value past it: on
    average a share q of the population lies below it.  The interpolation at rank 1 + q (n - 1) that
    `definitions.quantile` uses reads the 80th-85th percentile from 8-20 values, not the 90th."""
    vals = sorted(values)
    pos = q * (len(vals) + 1) - 1.0
    if pos >= len(vals) - 1:
        return vals[-1]
    if pos <= 0:
        return vals[0]
    lo = int(pos)
    return vals[lo] + (vals[lo + 1] - vals[lo]) * (pos - lo)


class StepLevels:
    """Decayed count and sum of step seconds per batch size (decode-only steps); the slope from a
    weighted least-squares line through the level means."""

    __slots__ = ("n", "s", "first", "marked", "speed")

    def __init__(self) -> None:
        self.n: dict[int, float] = {}
        self.s: dict[int, float] = {}
        self.first: dict[int, list[float]] = {}  # a new level's first steps, until their median is known
        # at the last mark, each level's [seconds (decayed with the level), mean, steps] (mean None below
        # one step), and since then, per level with a mean: [steps, sum of step/mean, sum of its square]
        self.marked: dict[int, list] = {}
        self.speed: dict[int, list[float]] = {}

    def add(self, batch: int, seconds: float) -> None:
        m = self.marked.get(batch)
        if m is not None and m[1] is not None and seconds <= OUTLIER * m[1]:
            q = seconds / m[1]
            v = self.speed.setdefault(batch, [0, 0.0, 0.0])
            v[0] += 1
            v[1] += q
            v[2] += q * q
        n = self.n.get(batch)
        if n is None:
            # A new level's first steps wait until there are MIN_LEVEL_STEPS of them and join against their
            # median: a slow step (one in 50, 4x) let in among a level's first few raised its mean by 2-3 ms
            # for minutes, and a low level read high is a slope read low (0.8 ms where 1.2 was true).
            first = self.first.setdefault(batch, [])
            first.append(seconds)
            if len(first) < MIN_LEVEL_STEPS:
                return
            del self.first[batch]
            mid = sorted(first)[len(first) // 2]
            kept = [t for t in first if t <= OUTLIER * mid]
            self.n[batch], self.s[batch] = float(len(kept)), sum(kept)
            return
        if seconds > OUTLIER * self.s[batch] / n:
            return  # a slow step (the tail): the anchor and the spread carry it, the slope does not
        self.n[batch] = n + 1.0
        self.s[batch] = self.s[batch] + seconds

    def follow_speed(self) -> float | None:
        """At the end of a period: when its steps show the host's speed changed since the last mark
        (`speed_change`), the steps measured before it are rescaled (the levels the batch no longer
        visits follow the host; the period's own steps are at the new speed already); then a new mark.
        Returns the factor applied, or None."""
        factor = self.speed_change()
        if factor is not None:
            for b, m in self.marked.items():
                if b in self.s:
                    self.s[b] += (factor - 1.0) * m[0]
        self.speed = {}
        self.marked = {b: [s, s / self.n[b] if self.n[b] >= 1.0 else None, self.n[b]] for b, s in self.s.items()}
        return factor

    def speed_change(self) -> float | None:
        """The host's speed over the period against the levels' means at the mark, when the steps show
        it: each level's ratio of the period's mean step to its mean, weighed by its precision (the step's
        spread over the period's steps and over the level's own), and a change only beyond SPEED_EVIDENCE
        standard errors (a level read from one 40-step round is itself 1-2% off)."""
        n = sum(v[0] for v in self.speed.values())
        if n < 2 * MIN_FINISHED:
            return None
        mean_q = sum(v[1] for v in self.speed.values()) / n
        var = max(1e-8, sum(v[2] for v in self.speed.values()) / n - mean_q * mean_q)
        w_sum = r_sum = 0.0
        for b, (k, q_sum, _) in self.speed.items():
            if k < 2:
                continue
            w = 1.0 / (var * (1.0 / k + 1.0 / self.marked[b][2]))
            w_sum += w
            r_sum += w * q_sum / k
        if not w_sum:
            return None
        r = r_sum / w_sum
        return r if abs(r - 1.0) > SPEED_EVIDENCE / math.sqrt(w_sum) else None

    def decay(self, factor: float) -> None:
        for b in list(self.n):
            self.n[b] *= factor
            self.s[b] *= factor
            if b in self.marked:
                self.marked[b][0] *= factor
            if self.n[b] < 0.5:
                del self.n[b], self.s[b]
                if b in self.marked:  # its seconds go with it; its mean at the mark still reads the speed
                    self.marked[b][0] = 0.0

    def highest(self) -> int | None:
        """The highest batch with MIN_LEVEL_STEPS decode steps still counted (levels decay), or None."""
        return max((b for b, n in self.n.items() if n >= MIN_LEVEL_STEPS), default=None)

    def mean(self, batch: int) -> float | None:
        n = self.n.get(batch, 0.0)
        return self.s[batch] / n if n >= 1.0 else None

    def slope(self, min_span: int = MIN_SPAN) -> float | None:
        """beta of the level means, or None without two levels of MIN_LEVEL_STEPS spanning `min_span`
        streams (closer levels give a slope that is mostly noise: good enough to steer a slow start,
        not to move a cap that is tracking)."""
        pts = [(b, self.s[b] / n, min(n, LEVEL_WEIGHT_CAP)) for b, n in self.n.items() if n >= MIN_LEVEL_STEPS]
        if len(pts) < 2 or max(p[0] for p in pts) - min(p[0] for p in pts) < min_span:
            return None
        w = sum(p[2] for p in pts)
        mb = sum(p[0] * p[2] for p in pts) / w
        mt = sum(p[1] * p[2] for p in pts) / w
        sbb = sum(p[2] * (p[0] - mb) ** 2 for p in pts)
        beta = sum(p[2] * (p[0] - mb) * (p[1] - mt) for p in pts) / sbb
        return beta if beta > 0 and math.isfinite(beta) else None

    def slope_near(self, cap: int) -> float | None:
        """The slope where the cap works: the secant from the highest level at or below `cap` to the
        level above it (up to cap + 1), else to the next level below (MIN_LEVEL_STEPS each); None
        without two such levels.  Read while the levels are too close together for `slope()`: steps
        bend at small batches (on the CPU build the second stream costs three times what the fourth
        does), so a line through levels 1 and 2 overprices every stream past them and, kept, holds a
        cap of 2 where 4 meet the floor."""
        pts = sorted((b, self.s[b] / n) for b, n in self.n.items() if n >= MIN_LEVEL_STEPS)
        below = [p for p in pts if p[0] <= cap]
        if not below:
            return None
        at = below[-1]
        above = [p for p in pts if at[0] < p[0] <= cap + 1]
        if above:
            (b0, t0), (b1, t1) = at, above[0]
        elif len(below) >= 2:
            (b0, t0), (b1, t1) = below[-2], at
        else:
            return None
        beta = (t1 - t0) / (b1 - b0)
        return beta if beta > 0 and math.isfinite(beta) else None


class LoopPolicy:
    """The admission cap as a control loop (see the module doc).  `prior`: (alpha, beta) seconds from
    a sweep's capacity profile or a prediction, or None (a slow start)."""

    name = "loop"

    def __init__(self, floor: float, max_num_seqs: int, prior: tuple[float, float] | None = None,
                 round_steps: int = ROUND_STEPS) -> None:
        if not (isinstance(max_num_seqs, int) and max_num_seqs >= 1):
            raise ValueError(f"max_num_seqs must be an integer >= 1, got {max_num_seqs!r}")
        if not floor > 0:
            raise ValueError(f"floor must be a positive tok/s, got {floor!r}")
        self.floor = float(floor)
        self.max_num_seqs = max_num_seqs
        self.round_steps = int(round_steps)
        self.levels = StepLevels()
        self.ratio = 1.0            # delivery seconds per token / engine seconds per token
        self.spread = 0.0           # s: p90 seconds per token of finished requests minus the mean step
        self.finished: deque = deque(maxlen=FINISHED_KEEP)
        self._outcomes: list = []     # (seconds per token, cap at its finish) of the requests finished this period
        self._past: deque = deque()   # (refit time, that period's outcomes) of the periods before
        self.moves = 0
        self.rules: dict[str, int] = {}  # moves per rule (RULES)
        self._moved: list[str] = []      # moves not yet reported (the refit reports them)
        self.x: float | None = None  # streams at the floor, from the last refit
        self._period = [0, 0.0, 0.0]  # steps, sum of seconds, sum of batch since the last refit
        self._bound = False           # the cap held requests back since the last refit
        self._up_seen = 0
        self._up_to = 0
        self._down_seen = 0
        self._last_refit: float | None = None
        self._round: list[float] = []  # slow start: this round's steps at the cap (seconds)
        self._rounds_tail = [0.0, 0.0]  # ... all rounds' step seconds, and those of their steps not in the tail
        self._load = [0.0, 0.0]       # prefill tokens, stream-steps (decayed)
        self._prefill = [0.0, 0.0]    # seconds prefill added to its steps, its tokens (decayed)
        self._spread_known = False
        self._measured = False        # the intercept comes from measured steps (not only the prior)
        self._anchor = 0.0            # the last period's intercept, unsmoothed: what finished requests are read against
        self._anchor_steps = 0.0      # decode steps the intercept has been read from so far
        self._room_cap: int | None = None  # slow start: the highest cap a climb's round left room at
        self.state = COLD
        self.alpha = self.beta = None
        self.cap: int | None = 1
        if prior is not None and prior[1] > 0:  # half the prior's streams, then a round re-anchors it
            self.alpha, self.beta = float(prior[0]), float(prior[1])
            self.cap = max(1, self._bounded(self._streams()) // 2)

    # -- what the loop observes -----------------------------------------------------------------------
    def observe_step(self, batch: int, prefill_tokens: int, seconds: float) -> None:
        if batch < 1 or not seconds > 0:
            return
        w = self._load
        w[1] += batch
        if prefill_tokens:  # what the prefill adds to the step, priced per token
            w[0] += prefill_tokens
            if self.alpha is not None and self.beta is not None:
                excess = seconds - self.alpha - self.beta * batch
                if excess > 0:
                    self._prefill[0] += excess
                    self._prefill[1] += prefill_tokens
            return
        p = self._period
        p[0] += 1
        p[1] += seconds
        p[2] += batch
        self.levels.add(batch, seconds)
        if self.state == COLD and self.cap is not None and batch >= self.cap:
            self._round.append(seconds)
            if len(self._round) >= self.round_steps:
                self._slow_start_round(self._round_mean(self._round))
                self._round = []

    def observe_finished(self, seconds_per_token: float, mean_batch: float) -> None:
        """One finished request: its engine-clock seconds per token and the mean batch of its steps."""
        if seconds_per_token > 0 and math.isfinite(seconds_per_token) and mean_batch >= 1 and self._measured \
                and self.beta is not None:
            if self.cap is not None and mean_batch > self.cap + ABOVE_CAP:
                return  # it ran under a higher cap: its spread is a load the cap no longer admits
            self.finished.append(seconds_per_token - self.slope * mean_batch - self._anchor)
            self._outcomes.append((seconds_per_token, self.cap, mean_batch))

    def observe_feedback(self, ratio: float) -> None:
        if ratio > 0 and math.isfinite(ratio):
            self.ratio = min(RATIO_RANGE[1], max(RATIO_RANGE[0], float(ratio)))

    def limit(self, running: int, waiting: int) -> int | None:
        """This step's limit: the cap, never below what runs (no preemption), never above max_num_seqs."""
        if self.cap is None:
            return None
        if waiting and running >= self.cap:
            self._bound = True
        return min(self.max_num_seqs, max(self.cap, int(running)))

    # -- the model ----------------------------------------------------------------------------------
    @property
    def target(self) -> float:
        """Engine-clock seconds per token a stream may take."""
        return 1.0 / (self.floor * self.ratio)

    @property
    def spread_in_use(self) -> float:
        """The measured spread, or SPREAD_PRIOR of the target before requests have finished."""
        return self.spread if self._spread_known else SPREAD_PRIOR * self.target

    @property
    def prefill_per_stream(self) -> float:
        """Seconds of prefill each running stream brings into every step in steady admission: the
        measured cost of a prefill token times the prefill tokens per stream-step (a prompt's tokens
        over its request's life, read over minutes: a first wave's prefills count once they are done)."""
        tokens, stream_steps = self._load
        cost_seconds, cost_tokens = self._prefill
        if not (stream_steps > 0 and cost_tokens > 0):
            return 0.0
        return (cost_seconds / cost_tokens) * (tokens / stream_steps)

    @property
    def slope(self) -> float:
        """What one more running stream adds to the mean step: its decode (beta) and its prefill."""
        return (self.beta or 0.0) + self.prefill_per_stream

    def _streams(self) -> float | None:
        if self.alpha is None or not self.beta:
            return None
        return (self.target - self.spread_in_use - self.alpha) / self.slope

    def _bounded(self, x: float | None) -> int | None:
        if x is None:
            return None
        return min(self.max_num_seqs, max(1, int(math.floor(x + 1e-9))))

    def _round_mean(self, steps: list[float]) -> float:
        """A round's mean step: the mean of its steps outside the tail (OUTLIER times its median) times the
        tail's share of all the rounds' steps so far, read as if TAIL_PRIOR_STEPS more steps without a tail
        had come first.  One slow step in 50 at four times the typical makes a 40-step round's plain mean
        1.8 ms noisy at a 25 ms step (more than a stream's cost), so the rounds at 3, 4 and 5 streams came
        out in any order; without the tail a round is 0.2 ms noisy, and the tail's share, common to every
        round, is read over all of them (a first round's own share is luck: none, or 15%)."""
        mid = sorted(steps)[len(steps) // 2]
        kept = [t for t in steps if t <= OUTLIER * mid]
        mean = sum(kept) / len(kept)
        self._rounds_tail[0] += sum(steps)
        self._rounds_tail[1] += sum(kept)
        prior = TAIL_PRIOR_STEPS * mean
        return mean * (self._rounds_tail[0] + prior) / (self._rounds_tail[1] + prior)

    def _slow_start_round(self, mean_step: float) -> None:
        """One round at the cap: double while the mean step leaves room; once a slope is known (the
        levels', from any two levels, or the prior's), toward x instead, the intercept measured at the
        cap (the first measurement replaces the prior's, later ones are blended: a round is few
        steps); at or past x, while the round's mean step leaves room, one stream more a round until
        the levels span MIN_SPAN streams, then the loop tracks from this cap; without room it tracks
        from the last cap that had room (or back by at most half)."""
        beta = self.levels.slope(COLD_SPAN)
        if beta is not None:
            self.beta = beta if self.beta is None else self.beta + SMOOTH * (beta - self.beta)
        if self.beta is None:  # one level so far: the mean step alone says whether to double
            if mean_step + self.spread_in_use > self.target:
                if self.cap > 1:
                    self._enter_track(max(1, self.cap // 2), "cold-halve", self._round_says(mean_step))
                # at 1 there is nowhere lower, and tracking without a slope would hold 1 for good:
                # another round at 1 (a round is 40 steps, and its share of slow steps is luck)
            else:
                self._set(min(self.max_num_seqs, 2 * self.cap), "cold-double", self._round_says(mean_step))
            return
        self._blend(mean_step - self.beta * self.cap, self.round_steps)
        self._anchor = self.alpha
        self._measured = True
        x = self._bounded(self._streams())
        says = self._round_says(mean_step)
        if x <= self.cap and mean_step + self.spread_in_use <= self.target:
            # at or past x, but the round's own steps leave room at this cap (a slow start's x prices
            # the first wave's prefills as every stream's, 1.6 ms a stream where 0.3 is steady).  While
            # no slope has been read across MIN_SPAN streams (the prior's is another day's line, one
            # from close levels is the slope there, and steps bend at small batches), climb a stream a
            # round, as TCP's congestion avoidance does: only a round at cap + 1 measures what one
            # more stream costs.  Then hold and track from here; the refits correct x within a period.
            if self.cap < self.max_num_seqs and self.levels.slope() is None:
                self._room_cap = self.cap
                self._set(self.cap + 1, "cold-climb", says)
            else:
                self._enter_track(self.cap)
        elif x <= self.cap and self._room_cap is not None and self._room_cap < self.cap:
            self._enter_track(self._room_cap, "cold-back-to-room", says)  # back to the last cap with room
        elif x <= self.cap:  # at or past x, and no room at the cap: back, by at most half
            self._enter_track(max(self.cap - max(1, self.cap // 2), x), "cold-back", says)
        else:  # short of x: toward it, a stream at least, at most double
            self._room_cap = None
            self._set(max(self.cap + 1, min(self.max_num_seqs, 2 * self.cap, x)), "cold-toward-x", says)

    def _measured_streams(self, now: float, mean_batch: float) -> float | None:
        """Streams at the floor read from the requests that finished under the cap in force (this period and
        those that ended within OUTCOMES_SECONDS), when the period's mean batch sat BELOW_CAP or more under
        the cap: cap + 1 when 90% of them would meet the floor with one more stream's step on every
        token (an upper bound: a higher cap adds a stream only while requests wait), the cap when 90%
        met it as they ran, else None.  The model's x is the batch at which 90% meet the floor; a cap
        the batch reaches only at times (arrivals in bursts) keeps 90% at the floor above that, and a
        cap at x keeps a queue that costs TTFT."""
        c = self.cap
        if mean_batch >= c - BELOW_CAP:
            return None
        rates = [t for t, cap, _ in self._recent(now) if cap == c]
        if self._nine_in_ten(rates, self.slope):
            return c + 1.0
        if self._nine_in_ten(rates):
            return float(c)
        return None

    def _nine_in_ten(self, rates: list[float], extra: float = 0.0) -> bool:
        """OUTCOMES_MIN or more requests' seconds per token, and 90% of them at the floor with `extra` seconds
        more on every token."""
        return len(rates) >= OUTCOMES_MIN and \
            sum(1 for t in rates if t + extra <= self.target) >= SPREAD_QUANTILE * len(rates)

    def _recent(self, now: float) -> list:
        """(seconds per token, cap, mean batch) of the requests finished this period and in those that ended
        within OUTCOMES_SECONDS."""
        periods = [self._outcomes] + [o for end, o in self._past if now - end < OUTCOMES_SECONDS]
        return [r for period in periods for r in period]

    def _held(self, now: float) -> bool:
        """90% or more of the requests that ran at the cap in force (finished under it, at a mean batch within
        ABOVE_CAP of it; OUTCOMES_MIN at least) met the floor: the gate itself, measured, so the model's x
        below the cap is its error and not a reason to cut a stream (at a cap of 2 or 3, a third or half of
        the goodput)."""
        c = self.cap
        return self._nine_in_ten([t for t, cap, b in self._recent(now) if cap == c and b >= c - ABOVE_CAP])

    def _blend(self, anchored: float, steps: float) -> None:
        """The intercept read on `steps` decode steps: the first reading replaces the prior's; later ones
        move it ANCHOR_SMOOTH of the way, or by their share of all the steps read so far when that is
        more (a 40-step round does not outweigh the 300 steps of the period after it for minutes)."""
        if not self._measured:
            self.alpha = anchored
        else:
            w = max(ANCHOR_SMOOTH, steps / (self._anchor_steps + steps))
            self.alpha = self.alpha + w * (anchored - self.alpha)
        self._anchor_steps += steps

    def _enter_track(self, cap: int, rule: str = "", says: str = "") -> None:
        self.state = TRACK
        self._set(cap, rule, says)

    def _set(self, cap: int, rule: str = "", says: str = "") -> None:
        self._move(cap, rule, says)
        self._up_seen = self._down_seen = 0

    def _move(self, cap: int, rule: str, says: str) -> None:
        """The one place the cap changes after the start: counted, and kept for the next refit's report
        as `before -> cap [rule] (what the rule read)`."""
        if cap != self.cap:
            self.moves += 1
            self.rules[rule] = self.rules.get(rule, 0) + 1
            self._moved.append(f"{self.cap or 'none'} -> {cap} [{rule}] ({says})")
        self.cap = cap

    def _round_says(self, mean_step: float) -> str:
        return (f"round at {self.cap}: mean step {mean_step * 1e3:.1f} + spread {self.spread_in_use * 1e3:.1f} ms "
                f"against the target {self.target * 1e3:.1f} ms a token; slope "
                + ("unknown" if self.beta is None else f"{self.beta * 1e3:.2f} ms a stream"))

    def _model_says(self, x: float | None, ttft_streams: int | None) -> str:
        x_s = "none" if x is None else f"{x:.1f}"
        return (f"streams at the floor {x_s}: target {self.target * 1e3:.1f} ms a token, mean step "
                f"{self.alpha * 1e3:.1f} + {self.beta * 1e3:.2f} + {self.prefill_per_stream * 1e3:.2f} (prefill) ms a "
                f"stream, spread {self.spread_in_use * 1e3:.1f} ms, delivery/engine {self.ratio:.2f}; TTFT capacity "
                f"{ttft_streams}")

    def refit(self, now: float, ttft_streams: int | None = None) -> str | None:
        """One refit: re-anchor the model on the period's steps, read the finished requests' spread,
        move the cap; returns every move since the last refit (the slow start's rounds' too), one line
        each with its rule and what it read, or None when the cap did not move."""
        self._refit(now, ttft_streams)
        moved, self._moved = self._moved, []
        return "\n".join(moved) if moved else None

    def _refit(self, now: float, ttft_streams: int | None) -> None:
        if self._last_refit is not None:
            self.levels.decay(0.5 ** ((now - self._last_refit) / LEVEL_HALFLIFE))
            keep = 0.5 ** ((now - self._last_refit) / PREFILL_HALFLIFE)
            self._load = [v * keep for v in self._load]
            self._prefill = [v * keep for v in self._prefill]
        self._last_refit = now
        n, sum_t, sum_b = self._period
        if n < 2 * MIN_FINISHED:
            return  # too few steps since the last refit: keep the period open
        self._period = [0, 0.0, 0.0]
        self.levels.follow_speed()  # the host slowed or sped up: the levels it no longer visits follow it
        bound, self._bound = self._bound, False
        mean_t = sum_t / n
        beta = self.levels.slope()
        if beta is None and self.state == TRACK and self.cap is not None:
            beta = self.levels.slope_near(self.cap)  # a binding cap keeps the batch at one or two levels
        if beta is not None:  # levels that span a change of load can give any slope: a bounded step
            self.beta = beta if self.beta is None else \
                self.beta + SMOOTH * (min(2 * self.beta, max(self.beta / 2, beta)) - self.beta)
        if self.beta is None:
            return  # cold, one level: the slow start goes on
        anchored = mean_t - self.beta * (sum_b / n)
        self._blend(anchored, n)
        self._anchor = anchored
        self._measured = True
        if len(self.finished) >= MIN_FINISHED:
            # the cohort of requests finished since the spread was last read: each one's own intercept
            # (its seconds per token less the slope times the mean batch it ran at) above the last
            # period's mean-step intercept when it finished; the cohort's 90th percentile is what the
            # mean step misses.  Per cohort, smoothed: requests that straddled a change of load (a
            # shift, the first wave of a closed loop) weigh on one or two readings, not on a minute's
            spread = max(0.0, upper_quantile(self.finished, SPREAD_QUANTILE))  # the 90th percentile is above the mean
            self.finished.clear()
            # a bounded step, as the slope's: one cohort that ran beside a change (a shift's first long
            # prefills) read 17 ms where 1 had been usual and 5 became so, and at the cap that fell the
            # next cohort took a minute and more to finish and correct it
            # (and up to the prior's share of the target at least, so a spread worn down to nothing
            # by quiet cohorts is not held there)
            hi = max(SPREAD_STEP[1] * self.spread_in_use, SPREAD_PRIOR * self.target)
            spread = min(hi, max(self.spread_in_use / SPREAD_STEP[0], spread))
            self.spread = self.spread_in_use + SMOOTH * (spread - self.spread_in_use)  # from the prior at first
            self._spread_known = True
            self.state = TRACK  # outcomes measured: the slow start is over
        self.x = x = self._streams()
        from_outcomes = False
        if self.state == TRACK and self.cap is not None and x is not None:
            measured = self._measured_streams(now, sum_b / n)
            if measured is None and self.cap - DOWN_NOW <= x < self.cap and self._held(now):
                measured = float(self.cap)
            if measured is not None and measured > x:
                self.x = x = measured
                from_outcomes = True
        self._past.append((now, self._outcomes))
        self._outcomes = []
        while self._past and now - self._past[0][0] >= OUTCOMES_SECONDS:
            self._past.popleft()
        before = self.cap
        target = self._bounded(x)
        if ttft_streams is not None:
            target = max(1, min(target, int(ttft_streams)))
        cap = before if before is not None else target
        bounded = ""
        highest = self.levels.highest()
        if target > cap and highest is not None and target > highest + REACH:
            # x past the batches measured is the line extrapolated: a quiet load reads it at small
            # batches, where GPU steps are flat and the spread is small, and the cap crept there met the
            # next burst with every waiting request admitted at once
            target = max(cap, highest + REACH)
            bounded = f"; highest batch measured {highest}"
        rule = ""
        if target < cap:
            self._up_seen = 0
            self._down_seen += 1
            if x < cap - DOWN_NOW:
                rule = "down-now"
            elif ttft_streams is not None and target == ttft_streams:
                rule = "down-ttft"
            elif self._down_seen >= CONFIRM_UP:
                rule = "down-confirmed"
            if rule:
                cap = max(target, cap - max(1, cap // 2))
                self._down_seen = 0
        elif target > cap and self.state == COLD and not bound:
            # a slow start whose cap the load did not reach this period: its rounds need steps at the cap,
            # so the refit, on the model the period's steps re-anchored, raises it (by at most doubling)
            # before a burst meets a cap of half the prior's streams
            cap = min(target, 2 * cap)
            rule = "cold-raise"
        elif target > cap and self.state == TRACK:  # cold, the cap reached: the slow start raises it
            self._down_seen = 0
            self._up_seen += 1
            self._up_to = target if self._up_seen == 1 else min(self._up_to, target)
            if self._up_seen >= CONFIRM_UP:  # never on one refit: who gets in cannot be taken back
                cap = min(self._up_to, 2 * cap)  # two refits agree: as far as the slow start would go
                self._up_seen = 0
                rule = "up-outcomes" if from_outcomes else "up-confirmed"
        else:
            self._up_seen = self._down_seen = 0
        if cap != before:
            self._move(cap, rule, self._model_says(x, ttft_streams) + bounded)
