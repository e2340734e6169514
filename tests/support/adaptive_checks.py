"""The adaptive search's claims on the simulated bed (support.simulated), shared by the unit tier
(tests/unit/test_bench_adaptive.py) and its heavier cases in the contract tier
(tests/contract/test_bench_adaptive_large.py)."""
from __future__ import annotations

import math

import pytest

from vllm_spark_plugin.bench.adaptive import Budget, SearchConfig, run_search

from .simulated import SimulatedBed, noisy

UNLIMITED = Budget(max_seconds=None)


@pytest.fixture
def bed():
    """bed(alpha, beta): a simulated bed, closed after the test."""
    beds = []

    def start(alpha: float, beta: float) -> SimulatedBed:
        b = SimulatedBed(alpha, beta)
        beds.append(b)
        return b

    yield start
    for b in beds:
        b.close()


def geometric_ladder_points(capacity: int) -> int:
    """Levels 1, 2, 4, ... up to the first one past the capacity: what a fixed ladder needs to bracket it."""
    return math.floor(math.log2(capacity + 1)) + 2


def search_lands_on_the_true_capacity_and_knee(sim: SimulatedBed, alpha: float, beta: float, floor: float) -> None:
    trace = run_search(SearchConfig.make([floor], budget=UNLIMITED), sim.measure)
    out = trace.outcome()
    truth = sim.true_capacity(floor)
    (b,) = out["boundaries"]
    assert out["complete"] and out["stop_reason"].startswith("every goal met")
    assert b["bracket"] == [truth, truth + 1] and b["status"] == "known to one stream"
    assert b["lower"]["trials_agreeing"] == 1 and b["upper"]["trials_agreeing"] == 1
    res = trace.search.result
    assert res.knee == pytest.approx(alpha / beta, rel=1e-3)
    lo, hi = res.ci["knee"]
    assert lo <= alpha / beta * 1.001 and hi >= alpha / beta * 0.999
    # one stream of precision with about the points a doubling ladder needs just to bracket it
    assert len(out["order"]) <= geometric_ladder_points(truth) + 1, out["order"]


def noisy_points_still_end_near_the_truth(sim: SimulatedBed, seed: int) -> None:
    """2% trial-to-trial noise, the median of 3 trials per point: the search ends by itself, and the
    capacity it reports is within the streams that noise blurs (a 2% rate change is 2 streams at 53)."""
    out = run_search(SearchConfig.make([50.0], budget=UNLIMITED), noisy(sim.measure, 0.02, seed)).outcome()
    (b,) = out["boundaries"]
    assert out["complete"] and b["resolution"] == 1
    assert abs(b["value"] - sim.true_capacity(50.0)) <= 2
    assert len(out["order"]) <= 10
