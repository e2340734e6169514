"""Capacity under both SLOs (floor and TTFT), spare capacity, and the live SLO counters.

Steps and first tokens are synthetic, the estimator's clock is injected; each exporter writes to a
prometheus-client registry of its own.
"""
from __future__ import annotations

import numpy as np
from prometheus_client import CollectorRegistry

from vllm_spark_plugin.knee import OnlineKneeEstimator
from vllm_spark_plugin.knee.slo_capacity import (VERDICT_EXCEEDED_AT_SMALLEST, VERDICT_NO_SLO, VERDICT_OK,
                                                 VERDICT_TOO_FEW, VERDICT_WITHIN, capacity_under_both, ttft_capacity)
from vllm_spark_plugin.metrics.derive import finished_values
from vllm_spark_plugin.metrics.engine_stats import EngineStats, FinishedRequest
from vllm_spark_plugin.metrics.exporter import Exporter
from vllm_spark_plugin.metrics.step import HookStep
from vllm_spark_plugin.settings import Settings

ALPHA, BETA = 0.010, 0.001          # floor 20 tok/s -> capacity floor((1/20 - alpha)/beta) = 40


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def ttft_of(b):
    return 0.05 + 0.01 * b           # within 0.2 s up to batch 15


def feed_steps(est, clock, rng, n=1500):
    for _ in range(n):
        b = int(rng.integers(1, 65))
        est.observe(b, 0, (ALPHA + BETA * b) * (1 + 0.02 * rng.standard_normal()))
        clock.t += 0.05


def feed_ttfts(est, rng, batches=range(1, 65), per=8):
    for b in batches:
        for _ in range(per):
            est.observe_ttft(b, ttft_of(b) * (1 + 0.02 * rng.standard_normal()))


def test_ttft_capacity_interpolates_where_the_median_crosses_the_slo():
    b = np.repeat(np.arange(1, 65), 6)
    t = ttft_of(b)
    cap = ttft_capacity(b, t, 0.2)
    assert cap.verdict == VERDICT_OK and 13 <= cap.streams <= 15
    assert ttft_capacity(b, t, 0.01).verdict == VERDICT_EXCEEDED_AT_SMALLEST
    assert ttft_capacity(b, t, 0.01).streams == 0                      # smallest observed batch is 1
    hi = ttft_capacity(b[b >= 20], t[b >= 20], 0.1)                    # only large batches seen
    assert hi.verdict == VERDICT_EXCEEDED_AT_SMALLEST and hi.streams == 19   # an upper bound: below 20
    assert ttft_capacity(b, t, 5.0) == ttft_capacity(b, t, 5.0) and ttft_capacity(b, t, 5.0).streams is None
    assert ttft_capacity(b, t, 5.0).verdict == VERDICT_WITHIN
    assert ttft_capacity(b[:3], t[:3], 0.2).verdict == VERDICT_TOO_FEW   # fewer than 5 per level
    assert ttft_capacity(b, t, None).verdict == VERDICT_NO_SLO


def test_capacity_under_both_takes_the_tighter_bound():
    b = np.repeat(np.arange(1, 65), 6)
    tight = ttft_capacity(b, ttft_of(b), 0.2)
    loose = ttft_capacity(b, ttft_of(b), 5.0)
    assert capacity_under_both(40, tight) == tight.streams < 40
    assert capacity_under_both(40, loose) == 40
    assert capacity_under_both(None, tight) == tight.streams


def test_live_capacity_is_lower_with_a_ttft_slo_tighter_than_the_floor_allows():
    caps = {}
    for slo in (0.2, 5.0):
        clock, rng = Clock(), np.random.default_rng(7)
        est = OnlineKneeEstimator(clock=clock, refit_seconds=0, ttft_slo_seconds=slo)
        feed_steps(est, clock, rng)
        feed_ttfts(est, rng)
        floor_cap = est.estimate(force=True).capacity_at(20)
        caps[slo] = (floor_cap, capacity_under_both(floor_cap, est.ttft_capacity()))
    floor_cap = caps[5.0][0]
    assert 36 <= floor_cap <= 44                          # (1/20 - alpha)/beta = 40
    assert caps[5.0][1] == floor_cap                      # TTFT never binds: the floor decides
    assert caps[0.2][1] < floor_cap and 12 <= caps[0.2][1] <= 16


def test_ttft_ring_keeps_only_the_latest_window():
    est = OnlineKneeEstimator(clock=Clock(), ttft_slo_seconds=0.3, ttft_window=64)
    for _ in range(10):
        est.observe_ttft(1, 5.0)          # old, slow first tokens ...
    for b in (1, 2, 3, 4, 6, 8, 12, 16):
        for _ in range(8):
            est.observe_ttft(b, ttft_of(b))   # ... pushed out by 64 newer ones
    cap = est.ttft_capacity()
    # the reader trusts window - 1 slots (the next one may be being written): all of them new
    assert cap.verdict == VERDICT_WITHIN and sum(n for _, _, n, _ in cap.levels) == 63
    est.observe_ttft(0, 1.0)
    est.observe_ttft(3, float("nan"))
    est.observe_ttft("x", 1.0)             # invalid pairs are dropped, nothing raises
    assert sum(n for _, _, n, _ in est.ttft_capacity().levels) == 63


# ------------------------------------------------------------------------------- the exporter
def _settings(ttft_slo, floors=(20.0,)):
    return Settings(knee_refit_seconds=0.0, floors=floors, ttft_slo_seconds=ttft_slo)


def _hook_step(batch, step_seconds):
    """The scheduler hook's record of a pure decode step of `batch` streams."""
    return HookStep(0, round(step_seconds * 1e6), 0, 0, batch, batch, -1, 0, -1)


def _reader(registry, model):
    def value(name, **labels):
        return registry.get_sample_value(name, {"model_name": model, "engine": "0", **labels})
    return value


def test_spare_capacity_crosses_zero_when_running_streams_exceed_capacity():
    model, registry = "unit-slo-spare", CollectorRegistry()
    exp = Exporter(model, _settings(0.2), registry=registry, hook_steps=True)
    _value = _reader(registry, model)
    st = exp.engine(0)
    rng = np.random.default_rng(3)
    for _ in range(1500):
        b = int(rng.integers(1, 65))
        st.record_step(_hook_step(b, (ALPHA + BETA * b) * (1 + 0.02 * rng.standard_normal())))
        st.record_stats(EngineStats(running=b, ttfts=[ttft_of(b)] * 4))
    exp.refresh_knee()
    cap = _value("vllm_spark_slo_capacity_streams", floor="20")
    floor_cap = _value("vllm_spark_capacity_streams", floor="20")
    assert cap == _value("vllm_spark_capacity_ttft_streams") and 12 <= cap <= 16 < floor_cap
    assert _value("vllm_spark_capacity_ttft_verdict", verdict="ok") == 1
    assert _value("vllm_spark_ttft_slo_seconds") == 0.2
    seen = []
    for running in (0, int(cap) - 2, int(cap), int(cap) + 3):
        st.record_stats(EngineStats(running=running))
        seen.append(_value("vllm_spark_spare_capacity_streams", floor="20"))
    assert seen == [cap, 2, 0, -3]


def test_slo_counters_count_requests_and_tokens_by_outcome_per_floor():
    model, registry = "unit-slo-counters", CollectorRegistry()
    st = Exporter(model, _settings(1.0, floors=(10.0, 30.0)), registry=registry).engine(0)
    _value = _reader(registry, model)
    finished = [(0.5, 40.0, 64),   # met at 10 and at 30
                (0.5, 20.0, 32),   # met at 10, missed_rate at 30
                (1.5, 20.0, 16),   # missed_ttft at 10, missed_both at 30
                (0.5, None, 1),    # one token: TTFT alone -> met
                (None, None, 0)]   # no first token -> missed_ttft
    st.record_slo(finished)
    req = {f: {o: _value("vllm_spark_slo_requests_total", floor=f, outcome=o)
               for o in ("met", "missed_ttft", "missed_rate", "missed_both")} for f in ("10", "30")}
    tok = {f: {o: _value("vllm_spark_slo_output_tokens_total", floor=f, outcome=o)
               for o in ("met", "missed_ttft", "missed_rate", "missed_both")} for f in ("10", "30")}
    assert req["10"] == {"met": 3, "missed_ttft": 2, "missed_rate": 0, "missed_both": 0}
    assert req["30"] == {"met": 2, "missed_ttft": 1, "missed_rate": 1, "missed_both": 1}
    assert tok["10"] == {"met": 97, "missed_ttft": 16, "missed_rate": 0, "missed_both": 0}
    assert tok["30"] == {"met": 65, "missed_ttft": 0, "missed_rate": 32, "missed_both": 16}


def test_derive_judges_finished_requests_from_e2e_latency_minus_decode_window():
    fr = lambda tokens, decode, e2e: FinishedRequest(generation_tokens=tokens, decode_seconds=decode,  # noqa: E731
                                                     prompt_tokens=8, reason="length", e2e_seconds=e2e)
    d = finished_values([fr(65, 2.0, 2.5), fr(1, 0.0, 0.3), fr(0, 0.0, 4.0), fr(10, 1.0, float("nan"))])
    assert d.slo == [(0.5, 32.0, 65), (0.3, None, 1), (None, None, 0)]
    assert d.invalid == 1                                      # the NaN latency, counted and dropped
    old = FinishedRequest(generation_tokens=65, decode_seconds=2.0, prompt_tokens=8, reason="length")
    assert finished_values([old]).slo == []   # no end-to-end latency: not judged
