"""`vllm-spark bench --levels auto`: the adaptive search (bench/adaptive.py) finds the knee and each
capacity boundary to one stream, within its budget, and says why it chose every level.

Correctness is checked on the fake server's simulated clock (tests/support/simulated.py): a step with
b streams takes exactly alpha + beta*b there, so the true capacity at a floor F is the largest b with
1/(alpha + beta*b) >= F and the true knee alpha/beta, and the search must land on them exactly.
Seeded noise on those points checks the search still ends and stays near the truth.  Bad flags are
refused in one line.  The command's own runs (the fake on the wall clock, checked for what holds by
construction: every point marked, the budget kept, the files written) wait on real time:
tests/integration/test_bench_adaptive_cli.py.
"""
from __future__ import annotations

import math

import pytest
from support.adaptive_checks import (UNLIMITED, bed, noisy_points_still_end_near_the_truth,  # noqa: F401 (bed: a fixture)
                                     search_lands_on_the_true_capacity_and_knee)

from vllm_spark_plugin.bench.adaptive import (PHASE_BISECT, PHASE_DONE, PHASE_GROW, PHASE_START,
                                              Budget, BudgetError, Observation, SearchConfig, run_search)
from vllm_spark_plugin.cli import main as vllm_spark

# (alpha s, beta s, floor tok/s): knees 13.3, 8.5, 20.8 and 100 streams; capacities 53, 34, 20, 376
# the capacity-376 model (0.010, 0.0001, 21.0: waves of hundreds of streams) and noise seeds 3-5 run in
# tests/contract/test_bench_adaptive_large.py: seconds of CPU each
STEP_MODELS = [(0.004, 0.0003, 50.0), (0.004, 0.00047, 50.0), (0.025, 0.0012, 20.0)]


@pytest.mark.parametrize("alpha, beta, floor", STEP_MODELS)
def test_search_lands_on_the_true_capacity_and_knee(bed, alpha, beta, floor):
    search_lands_on_the_true_capacity_and_knee(bed(alpha, beta), alpha, beta, floor)


def test_every_decision_names_its_phase_and_reason(bed):
    sim = bed(0.004, 0.0003)
    out = run_search(SearchConfig.make([50.0], budget=UNLIMITED), sim.measure).outcome()
    decisions = out["decisions"]
    assert [d["step"] for d in decisions] == list(range(1, len(decisions) + 1))
    assert decisions[0]["phase"] == PHASE_START and decisions[0]["concurrency"] == 1
    assert decisions[-1]["phase"] == PHASE_DONE and decisions[-1]["concurrency"] is None
    assert {d["phase"] for d in decisions[1:-1]} <= {PHASE_GROW, PHASE_BISECT}
    assert all(len(d["reason"]) > 20 for d in decisions)
    levels = [d["concurrency"] for d in decisions[:-1]]
    assert levels == out["order"] and len(set(levels)) == len(levels), "a level measured twice"
    grown = [d["concurrency"] for d in decisions if d["phase"] in (PHASE_START, PHASE_GROW)]
    assert grown == sorted(grown) and all(b <= 4 * a for a, b in zip(grown, grown[1:]))
    bisect = [d for d in decisions if d["phase"] == PHASE_BISECT]
    assert bisect and all("lies in [" in d["reason"] for d in bisect)


def test_the_search_is_deterministic(bed):
    sim = bed(0.025, 0.0012)
    runs = [run_search(SearchConfig.make([20.0], budget=UNLIMITED), sim.measure).outcome() for _ in range(2)]
    assert runs[0]["decisions"] == runs[1]["decisions"]


@pytest.mark.parametrize("seed", range(3))
def test_noisy_points_still_end_near_the_truth(bed, seed):
    noisy_points_still_end_near_the_truth(bed(0.004, 0.0003), seed)


def test_a_wrong_model_costs_probes_not_the_answer():
    """A curve that falls off a cliff past 30 streams: the linear fit keeps predicting a higher
    capacity, each miss is followed by a midpoint, and the bracket still closes on the truth."""
    alpha, beta = 0.004, 0.0003

    def cliff(c: int) -> Observation:
        t = (alpha + beta * c) * (1.0 if c <= 30 else 2.0)
        return Observation(c, 1 / t, c / t, seconds=4 * 32 * t, trial_rates=(1 / t,))

    out = run_search(SearchConfig.make([50.0], budget=UNLIMITED), cliff).outcome()
    (b,) = out["boundaries"]
    assert b["bracket"] == [30, 31] and out["complete"]
    assert b["bisection_probes"] <= 2 * math.ceil(math.log2(b["bracket"][1])) + 2
    assert any("the last guess missed, so the midpoint" in d["reason"] for d in out["decisions"])


def test_slo_attainment_boundary_is_bisected_to_one_stream():
    """Attainment falls as requests queue behind a 0.3 s TTFT bound (the k-th request of a wave
    waits k*10 ms): the highest level with attainment >= 0.9 is 33."""
    alpha, beta = 0.01, 0.001

    def measure(c: int) -> Observation:
        t = alpha + beta * c
        att = min(c, 30) / c
        return Observation(c, 1 / t, c / t, slo_attainment=att, seconds=4 * 32 * t, trial_rates=(1 / t,),
                           trial_attainments=(att,))

    out = run_search(SearchConfig.make([20.0], slo_target=0.9, budget=UNLIMITED), measure).outcome()
    floor, slo = out["boundaries"]
    assert floor["bracket"] == [40, 41] and slo["bracket"] == [33, 34]
    assert slo["kind"] == "slo" and slo["status"] == "known to one stream"
    assert any("attainment" in d["reason"] and "cross 0.9" in d["reason"] for d in out["decisions"])


def test_point_budget_stops_the_search(bed):
    sim = bed(0.004, 0.0003)
    out = run_search(SearchConfig.make([50.0], budget=Budget(max_points=4, max_seconds=None)), sim.measure).outcome()
    assert len(out["order"]) == 4 and not out["complete"]
    assert out["stop_reason"].startswith("budget of 4 points spent; next would have been")
    assert out["boundaries"][0]["status"] == "not bracketed"


def test_time_budget_is_never_passed(bed):
    """On the simulated clock a point's cost is predicted exactly: the search stops before the point
    that would pass the budget, and the time spent stays within it."""
    sim = bed(0.004, 0.0003)
    full = run_search(SearchConfig.make([50.0], budget=UNLIMITED), sim.measure)
    budget = 0.6 * full.seconds
    trace = run_search(SearchConfig.make([50.0], budget=Budget(max_seconds=budget)), sim.measure)
    out = trace.outcome()
    assert trace.seconds <= budget and not out["complete"]
    assert out["stop_reason"].startswith("time budget:") and len(out["order"]) < len(full.observations)


def test_ceiling_ends_the_search_with_what_is_missing(bed):
    sim = bed(0.004, 0.0003)
    out = run_search(SearchConfig.make([50.0], budget=Budget(max_concurrency=16, max_seconds=None)),
                     sim.measure).outcome()
    assert max(out["order"]) == 16 and not out["complete"]
    assert out["stop_reason"].startswith("reached --max-concurrency 16 with no level that misses the 50 tok/s floor")
    assert out["boundaries"][0]["status"] == "not bracketed" and out["boundaries"][0]["value"] == 16


def test_a_floor_above_the_single_stream_rate_is_known_at_once(bed):
    sim = bed(0.004, 0.0003)  # 232 tok/s at one stream
    out = run_search(SearchConfig.make([1000.0], budget=UNLIMITED), sim.measure).outcome()
    (b,) = out["boundaries"]
    assert b["bracket"] == [0, 1] and b["status"] == "known to one stream" and b["bisection_probes"] == 0
    assert "already misses it" in b["found_by"] and out["knee_with_interval"]


@pytest.mark.parametrize("budget, message", [
    (Budget(max_points=2), "--budget-points 2: the search needs at least 3 points"),
    (Budget(max_seconds=0.0), "--budget-seconds 0.0: must be a positive number"),
    (Budget(max_concurrency=1), "--max-concurrency 1 leaves no room to grow"),
    (Budget(start=8, max_concurrency=12), "--max-concurrency 12 leaves no room to grow from --auto-start 8"),
])
def test_budgets_that_cannot_work_are_refused(budget, message):
    with pytest.raises(BudgetError, match="^" + message.replace("(", r"\(")):
        SearchConfig.make([20.0], budget=budget)


# ------------------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("argv, message", [
    (["--levels", "auto", "--budget-points", "2"], "--budget-points 2: the search needs at least 3 points"),
    (["--budget-points", "5"], "--budget-points applies to --levels auto only"),
    (["--levels", "1,2", "--max-concurrency", "8", "--auto-start", "2"],
     "--max-concurrency, --auto-start apply to --levels auto only"),
    (["--levels", "auto", "--max-concurrency", "1"], "--max-concurrency 1 leaves no room to grow"),
    (["--levels", "auto", "--scenario", "prefix-reuse"], "--levels auto chooses the sweep's levels"),
])
def test_contradictory_or_impossible_auto_flags_are_one_line_errors(argv, message, capsys):
    assert vllm_spark(["bench", "--quiet", "--endpoint", "http://127.0.0.1:9", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"vllm-spark bench: error: {message}") and "\n" not in err, err


@pytest.mark.parametrize("argv, message", [(["--levels", "automatic"], "expected comma-separated integers"),
                                           (["--levels", "auto", "--budget-seconds", "0"], "positive"),
                                           (["--levels", "auto", "--budget-points", "x"], "expected a int")])
def test_bad_auto_values_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        vllm_spark(["bench", "--quiet", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
