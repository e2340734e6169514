"""Recording, per engine: the labelled instrument children and the one write path of each source.

Three sources reach an engine's instruments, each through one method:

* `record_step(HookStep)`: the scheduler hook's record of one step (channel thread): batch, step
  time, prefill/decode tokens, KV blocks, and the knee estimator's sample;
* `record_stats(EngineStats)`: vLLM's own stats of one step (API server's output loop): running and
  waiting requests, tokens, preemptions, TTFTs, finished requests; the batch and KV blocks too when
  the hook's steps do not reach this engine;
* `record_delivered(Delivered)`: one finished request on the delivery clock (`hooks.delivery`).

Each instrument is written in one place (`_batch`, `_kv_used` where two sources share one); gauges
are set only when their value changes (a set takes a lock and most steps change nothing), except
with several API servers, where the most recent write of any process is the value.
"""
from __future__ import annotations

from vllm_spark_plugin.definitions import SLO_OUTCOMES, slo_outcome
from vllm_spark_plugin.knee.result import floor_key
from vllm_spark_plugin.metrics import derive
from vllm_spark_plugin.metrics.names import METRICS
from vllm_spark_plugin.metrics.engine_stats import EngineStats
from vllm_spark_plugin.metrics.step import NOT_COUNTED, HookStep


PER_ENGINE = tuple(m for m in METRICS if m.per_engine)


class EngineChildren:
    """Labelled children cached once: `.labels()` costs ~2 us per call on the hot path.

    The plain ones (`step_batch`, `step_prefill`, `ttft`, ...) come from the `per_engine` field of
    their declaration in `names.METRICS`; the ones below are made by reason, by floor or on first use.
    """

    def __init__(self, ins, model: str, engine: str, floors: tuple[float, ...]) -> None:
        lv = (model, engine)
        for m in PER_ENGINE:
            parent = getattr(ins, m.attr)
            for attr, values in m.per_engine:
                setattr(self, attr, parent.labels(*lv, *values))
        self._finished = ins.finished
        self._lv = lv
        self._finished_children: dict = {}
        self.invalid = ins.errors.labels(where="invalid_stats")
        # the guard's series are created on its first value (absent while it is off)
        self.guard_limit, self.guard_deferred, self.guard_budget = ins.guard_limit, ins.guard_deferred, ins.guard_budget
        self.guard_deferred_seconds = ins.guard_deferred_seconds
        # latency SLO, per floor: (floor, {outcome: requests child}, {outcome: tokens child}); every
        # outcome's series exists from the start, so attainment is defined as soon as requests finish
        self.slo = tuple((f, {o: ins.slo_requests.labels(*lv, floor_key(f), o) for o in SLO_OUTCOMES},
                          {o: ins.slo_tokens.labels(*lv, floor_key(f), o) for o in SLO_OUTCOMES}) for f in floors)
        self.spare = tuple(ins.spare_capacity.labels(*lv, floor_key(f)) for f in floors)

    def finished(self, reason: str):
        c = self._finished_children.get(reason)
        if c is None:
            c = self._finished_children[reason] = self._finished.labels(*self._lv, reason)
        return c


class EngineState:
    """One engine's recording state.  `hook_steps`: the scheduler hook's records count this engine's
    batches and KV blocks (exact, one per step); otherwise vLLM's running count and KV usage do."""

    def __init__(self, ins, model: str, engine: str, floors: tuple[float, ...], ttft_slo_seconds: float,
                 knee, hook_steps: bool, rewrite_gauges: bool) -> None:
        self.engine = engine
        self.floors = floors
        self.ttft_slo = ttft_slo_seconds
        self.children = EngineChildren(ins, model, engine, floors)
        ins.ttft_slo.labels(model, engine).set(ttft_slo_seconds)
        self.knee = knee  # OnlineKneeEstimator, or None when it could not be built
        self.hook_steps = hook_steps
        self.total_blocks: int | None = None
        # per-stream rates and the SLO on the delivery clock once `hooks.delivery` times this
        # process's streams; the engine-clock rates then go to their own histogram only
        self.delivery_clock = False
        self.batch_sum = 0
        self.batch_n = 0
        # capacity under both SLOs per floor (set by the refit) and the running count it is spared from
        self.slo_capacity: tuple = (None,) * len(floors)
        self.running_now: int | None = None
        self.kv_used_now: int | None = None
        self.waiting_now: int | None = None
        self.rewrite = rewrite_gauges
        # the guard's last values (limit, held, prefill budget); NOT_COUNTED: absent
        self.guard_now = (NOT_COUNTED, NOT_COUNTED, NOT_COUNTED)
        self._model = model
        self._guard_wait = None  # the deferred-seconds child, made on the first held request

    # -- shared sinks --------------------------------------------------------------------------------
    def _batch(self, batch: int) -> None:
        if batch > 0:
            self.children.step_batch.observe(batch)
        self.batch_sum += batch
        self.batch_n += 1

    def _kv_used(self, used: int) -> None:
        if used != self.kv_used_now or self.rewrite:
            self.kv_used_now = used
            self.children.kv_used.set(used)

    def set_total_blocks(self, total: int) -> None:
        self.total_blocks = total
        self.children.kv_total.set(total)

    # -- the three sources ----------------------------------------------------------------------------
    def record_step(self, step: HookStep) -> None:
        """One scheduler-hook step (validated by `HookStep.from_wire`)."""
        c = self.children
        batch = step.prefill_reqs + step.decode_reqs
        seconds = step.step_us * 1e-6
        self._batch(batch)
        c.step_duration.observe(seconds)
        if step.prefill_tokens:
            c.step_prefill.observe(step.prefill_tokens)
        if step.decode_tokens:
            c.step_decode.observe(step.decode_tokens)
        if self.knee is not None and batch:
            self.knee.observe(batch, step.prefill_tokens, seconds, step.tokens_per_stream)
        used = step.kv_used
        if used is not None:
            self._kv_used(used)
        if step.guard_wait_us >= 0:
            if self._guard_wait is None:
                self._guard_wait = c.guard_deferred_seconds.labels(self._model, self.engine)
            self._guard_wait.observe(step.guard_wait_us * 1e-6)
        guard = (step.guard_limit, step.guard_held, step.guard_budget)
        if guard != self.guard_now or (self.rewrite and guard[0] >= 0):
            self._record_guard(guard)

    def _record_guard(self, guard: tuple) -> None:
        """The guard's gauges: set to each value, removed when it goes (the guard off or without a verdict)."""
        c = self.children
        for value, before, gauge in zip(guard, self.guard_now, (c.guard_limit, c.guard_deferred, c.guard_budget)):
            if value >= 0:
                gauge.labels(self._model, self.engine).set(value)
            elif before >= 0:
                gauge.remove(self._model, self.engine)
        self.guard_now = guard

    def record_stats(self, s: EngineStats) -> None:
        """vLLM's stats of one step.  O(1) plus O(1) per TTFT and finished request."""
        c = self.children
        bad = s.missing
        running = None
        if s.running is not None:
            running = derive.count(s.running)
            if running is None:
                bad += 1
            else:
                if running != self.running_now or self.rewrite:
                    c.running.set(running)
                    if running != self.running_now:
                        self.running_now = running
                        self.publish_spare()
                if not self.hook_steps and running > 0:
                    self._batch(running)
        if s.waiting is not None:
            waiting = derive.count(s.waiting)
            if waiting is None:
                bad += 1
            elif waiting != self.waiting_now or self.rewrite:
                self.waiting_now = waiting
                c.waiting.set(waiting)
        if not self.hook_steps and s.kv_usage is not None and self.total_blocks:
            used = derive.kv_used_from_usage(s.kv_usage, self.total_blocks)
            if used is None:
                bad += 1
            else:
                self._kv_used(used)
        for value, child in ((s.generation_tokens, c.generation_tokens), (s.prompt_tokens, c.prompt_tokens),
                             (s.preempted, c.preemptions)):
            if value:
                n = derive.count(value)
                if n is None:
                    bad += 1
                else:
                    child.inc(n)
        for t in s.ttfts:
            v = derive.seconds(t)
            if v is None:
                bad += 1
                continue
            c.ttft.observe(v)
            if self.knee is not None and running:
                self.knee.observe_ttft(running, v)
        if s.finished:
            bad += self._record_finished(s.finished)
        if bad:
            c.invalid.inc(bad)

    def _record_finished(self, finished) -> int:
        c = self.children
        f = derive.finished_values(finished)
        for r in f.rates:
            c.engine_stream_rate.observe(r)
            if not self.delivery_clock:
                c.stream_rate.observe(r)
        for reason in f.reasons:
            c.finished(reason).inc()
        if f.slo and not self.delivery_clock:
            self.record_slo(f.slo)
        return f.invalid

    def record_delivered(self, d) -> None:
        """One finished request on the delivery clock (`metrics.delivery.Delivered`)."""
        if d.streamed and d.decode_rate is not None:
            self.children.stream_rate.observe(d.decode_rate)
        self.record_slo(((d.ttft, d.decode_rate, d.output_tokens),))

    def record_slo(self, finished) -> None:
        """Count each finished request (TTFT, rate, tokens) under its SLO outcome at every floor."""
        ttft_slo = self.ttft_slo
        for ttft, rate, tokens in finished:
            for floor, requests, out_tokens in self.children.slo:
                o = slo_outcome(ttft, rate, ttft_slo, floor)
                requests[o].inc()
                if tokens:
                    out_tokens[o].inc(tokens)

    # -- read by the refit -----------------------------------------------------------------------------
    def publish_spare(self) -> None:
        """Spare capacity per floor = capacity under both SLOs - running streams (negative: overloaded)."""
        running = self.running_now
        if running is None:
            return
        for cap, child in zip(self.slo_capacity, self.children.spare):
            if cap is not None:
                child.set(cap - running)

    def take_mean_batch(self) -> float:
        n, s = self.batch_n, self.batch_sum
        self.batch_n = 0
        self.batch_sum = 0
        return s / n if n else 0.0
