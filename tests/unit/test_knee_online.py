"""OnlineKneeEstimator: hot-path behaviour, forgetting, caching, bounded memory, thread safety.

The clock is injected (a plain counter) so half-lives can be crossed instantly; nothing else is faked.
"""
from __future__ import annotations

import inspect
import math
import sys
import threading
import time
import tracemalloc

import numpy as np
import pytest

import vllm_spark_plugin.knee.online as online_mod
from vllm_spark_plugin.knee import OnlineKneeEstimator
from vllm_spark_plugin.settings import load as load_settings


class Clock:
    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def feed(est, clock, rng, alpha, beta, n, dt=0.05, gamma=0.0, prefill_frac=0.0, tps=1.0, noise=0.03):
    for _ in range(n):
        b = int(rng.integers(1, 65))
        p = int(rng.integers(64, 2048)) if rng.random() < prefill_frac else 0
        t = (alpha + beta * b + gamma * p) * (1 + noise * rng.standard_normal())
        est.observe(b, p, t, tps)
        clock.t += dt


def test_constructor_defaults_match_the_documented_api():
    sig = inspect.signature(OnlineKneeEstimator)
    d = {k: v.default for k, v in sig.parameters.items()}
    assert d["window"] == 4096 and d["halflife_seconds"] == 600.0 and d["refit_seconds"] == 10.0
    assert tuple(d["floors"]) == (20.0,) and d["clock"] is time.monotonic
    obs = inspect.signature(OnlineKneeEstimator.observe).parameters
    assert list(obs) == ["self", "batch", "prefill_tokens", "step_seconds", "tokens_per_stream"]
    assert obs["tokens_per_stream"].default == 1.0


def test_from_settings_maps_the_environment_variables():
    s = load_settings({"SPARK_PLUGIN_KNEE_WINDOW": "512", "SPARK_PLUGIN_KNEE_HALFLIFE_SECONDS": "30",
                       "SPARK_PLUGIN_KNEE_REFIT_SECONDS": "0.5", "SPARK_PLUGIN_FLOORS": "10,20"})
    est = OnlineKneeEstimator.from_settings(s)
    assert (est.window, est.halflife_seconds, est.refit_seconds, est.floors) == (512, 30.0, 0.5, (10.0, 20.0))


def test_estimate_is_none_before_any_valid_sample():
    est = OnlineKneeEstimator(clock=Clock())
    assert est.estimate() is None
    est.observe(0, 0, 0.01)
    assert est.estimate(force=True) is None
    assert est.ratio(8) is None


def test_recovers_known_curve_and_reports_capacity_and_ratio():
    clock, rng = Clock(), np.random.default_rng(0)
    est = OnlineKneeEstimator(window=4096, floors=(20.0, 10.0), clock=clock)
    feed(est, clock, rng, 0.025, 0.0012, 3000, gamma=2e-4, prefill_frac=0.1)
    res = est.estimate()
    assert res.verdict == "ok" and res.source == "steps"
    assert res.knee == pytest.approx(0.025 / 0.0012, rel=0.03)
    assert res.plateau_tokens_per_second == pytest.approx(1 / 0.0012, rel=0.03)
    assert res.gamma_seconds_per_prefill_token == pytest.approx(2e-4, rel=0.1)
    a, b = res.alpha_seconds, res.beta_seconds
    assert res.capacity["10"] == math.floor((0.1 - a) / b)
    assert est.ratio(16) == pytest.approx(16 / res.knee)
    assert est.ratio(float("nan")) is None


def test_speculative_steps_count_tokens_not_steps():
    clock, rng = Clock(), np.random.default_rng(1)
    est = OnlineKneeEstimator(clock=clock)
    feed(est, clock, rng, 0.025, 0.0012, 2000, tps=2.5)
    res = est.estimate()
    assert res.tokens_per_step == pytest.approx(2.5)
    assert res.plateau_tokens_per_second == pytest.approx(2.5 / 0.0012, rel=0.03)
    a, b = res.alpha_seconds, res.beta_seconds
    assert res.capacity["20"] == math.floor((2.5 / 20 - a) / b)


def test_refit_is_cached_for_refit_seconds_and_forced_on_request():
    clock, rng = Clock(), np.random.default_rng(2)
    est = OnlineKneeEstimator(refit_seconds=2.0, clock=clock)
    feed(est, clock, rng, 0.025, 0.0012, 500, dt=0.0)
    first = est.estimate()
    feed(est, clock, rng, 0.025, 0.0012, 100, dt=0.0)
    clock.t += 1.0
    assert est.estimate() is first             # within refit_seconds: cached
    assert est.estimate(force=True) is not first
    again = est.estimate()
    clock.t += 2.5
    assert est.estimate() is again             # nothing new observed: same fit
    feed(est, clock, rng, 0.025, 0.0012, 10, dt=0.0)
    assert est.estimate() is not again          # new samples and refit_seconds passed
    assert est.estimate().n == 610


def test_follows_a_change_of_alpha_and_beta_after_the_half_life():
    clock, rng = Clock(), np.random.default_rng(3)
    hl = 60.0
    est = OnlineKneeEstimator(window=4096, halflife_seconds=hl, refit_seconds=0.0, clock=clock)
    a1, b1, a2, b2 = 0.025, 0.0012, 0.040, 0.0005   # K 20.8 -> 80
    feed(est, clock, rng, a1, b1, 4000, dt=0.05)   # 200 s of the old workload
    before = est.estimate()
    assert before.knee == pytest.approx(a1 / b1, rel=0.05)
    feed(est, clock, rng, a2, b2, int(0.25 * hl / 0.05), dt=0.05)
    early = est.estimate()                          # a quarter half-life in: still the old curve
    assert early.knee == pytest.approx(a1 / b1, rel=0.05)
    feed(est, clock, rng, a2, b2, int(1.75 * hl / 0.05), dt=0.05)
    after = est.estimate()                          # two half-lives after the change: the new one
    assert after.alpha_seconds == pytest.approx(a2, rel=0.05)
    assert after.beta_seconds == pytest.approx(b2, rel=0.05)
    assert after.knee == pytest.approx(a2 / b2, rel=0.05)
    assert after.plateau_tokens_per_second == pytest.approx(1 / b2, rel=0.05)


def test_forgetting_weights_do_the_work_not_the_ring():
    """The ring holds both workloads; only the half-life decides which one the fit reports."""
    rng = np.random.default_rng(4)
    results = {}
    for hl in (10.0, 1e6):
        clock = Clock()
        est = OnlineKneeEstimator(window=4096, halflife_seconds=hl, refit_seconds=0.0, clock=clock)
        feed(est, clock, rng, 0.025, 0.0012, 2000, dt=0.05)
        feed(est, clock, rng, 0.040, 0.0005, 1000, dt=0.05)   # 50 s = 5 half-lives of the short one
        results[hl] = est.estimate().beta_seconds
    assert results[10.0] == pytest.approx(0.0005, rel=0.05)
    assert results[1e6] > 0.0008   # without forgetting, the older majority still dominates


def test_ring_memory_is_bounded():
    clock = Clock()
    est = OnlineKneeEstimator(window=256, clock=clock)
    sizes = [len(a) for a in (est._b, est._p, est._t, est._k, est._ts)]
    for i in range(5000):            # warm up: fill the ring, grow the counter past small ints
        est.observe(1 + i % 64, 0, 0.02 + 0.001 * (i % 64))
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    for i in range(50_000):
        est.observe(1 + i % 64, 0, 0.02 + 0.001 * (i % 64))
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    # allocations made by the estimator's own code only: threads other tests left running in this
    # process (an exporter's telemetry loop) allocate too
    mine = [tracemalloc.Filter(True, online_mod.__file__)]
    grown = sum(s.size_diff for s in after.filter_traces(mine).compare_to(before.filter_traces(mine), "filename"))
    assert grown < 4096, f"observe() retained {grown} bytes over 50k calls"
    assert [len(a) for a in (est._b, est._p, est._t, est._k, est._ts)] == sizes
    assert est.samples == 256 and est.observed == 55_000
    res = est.estimate(force=True)
    # the snapshot skips the oldest slot, which an in-flight observe() could be overwriting
    assert est.window - 1 <= res.n <= est.window


JUNK = [
    (0, 0, 0.02), (-1, 0, 0.02), (4, 0, 0.0), (4, 0, -0.01), (4, 0, float("nan")),
    (4, 0, float("inf")), (float("nan"), 0, 0.02), (float("inf"), 0, 0.02), (4, -5, 0.02),
    (4, float("nan"), 0.02), (4, 0, 0.02, 0.0), (4, 0, 0.02, float("nan")), (4, 0, 0.02, -1.0),
    (None, 0, 0.02), ("8", 0, 0.02), (4, None, 0.02), (4, 0, None), (4, 0, "0.02"), (4, 0, [0.02]),
    (10 ** 400, 0, 0.02),
]


def test_observe_ignores_and_counts_junk():
    est = OnlineKneeEstimator(clock=Clock())
    for args in JUNK:
        est.observe(*args)                      # never raises
    assert est.invalid == len(JUNK)
    assert est.observed == 0 and est.samples == 0
    est.observe(4, 0, 0.02)
    assert est.observed == 1 and est.invalid == len(JUNK)


def test_observe_makes_no_numpy_call():
    est = OnlineKneeEstimator(clock=Clock())
    calls = []

    def prof(frame, event, arg):
        if event in ("call", "c_call"):
            mod = getattr(arg, "__module__", None) if event == "c_call" else frame.f_globals.get("__name__")
            calls.append(mod or "")
    sys.setprofile(prof)
    try:
        for i in range(100):
            est.observe(1 + i % 8, 0, 0.02, 1.0)
    finally:
        sys.setprofile(None)
    assert not [m for m in calls if m.startswith("numpy")]


def test_snapshot_is_consistent_while_a_writer_thread_observes():
    """Scrape-thread reads during hot-path writes never see a torn sample (t == f(b) exactly)."""
    est = OnlineKneeEstimator(window=1024, refit_seconds=0.0)
    stop = threading.Event()

    def writer():
        i = 0
        while not stop.is_set():
            b = 1 + i % 64
            est.observe(b, 0, 0.01 + 0.001 * b)
            i += 1
    th = threading.Thread(target=writer)
    th.start()
    try:
        # counted, not timed: 50 snapshots taken while the writer laps the ring, however slow the box
        deadline = time.monotonic() + 60  # a liveness bound, not a measurement
        while est.observed < 2 * 1024 and time.monotonic() < deadline:
            time.sleep(0.001)  # the writer is lapping the ring before the first snapshot
        snaps = 0
        while snaps < 50 and time.monotonic() < deadline:
            snap = est._snapshot()
            if snap is None:
                continue
            b, p, t, k, ts = snap
            assert np.all(t == 0.01 + 0.001 * b)
            assert np.all(np.diff(ts) >= 0)          # samples in order, none from a lapped slot
            assert np.all(k == 1.0) and np.all(p == 0.0)
            snaps += 1
    finally:
        stop.set()
        th.join()
    # fitted once the writer stopped: a writer lapping the ring 8 copies in a row (a loaded box)
    # makes a snapshot give up, which is not what this test is about
    res = est.estimate(force=True)
    assert snaps == 50
    assert res.knee == pytest.approx(10.0, rel=1e-6)


@pytest.mark.parametrize("kwargs", [{"window": 1}, {"window": 10.5}, {"halflife_seconds": 0},
                                    {"halflife_seconds": float("nan")}, {"refit_seconds": -1}])
def test_bad_configuration_is_refused_at_construction(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        OnlineKneeEstimator(**kwargs)
