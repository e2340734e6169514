"""The SLO guard against the best static max_num_seqs on a simulated plant (tests/support/plant.py),
scenario by scenario, for every registered admission policy, on three seeds: the gates of
docs/guard.md ("The matrix").  Deterministic (seeded); the whole matrix costs a few seconds of CPU a
seed, each oracle is searched once per process and seed."""
from __future__ import annotations

from pathlib import Path

import pytest

from support import guard_matrix as m

pytestmark = pytest.mark.unit

POLICIES = m.policies()
SEEDS = (1, 2, 3)  # every gate on each: a loop tuned to one seed's luck shows on the others
_SLOW_START = ("the slow start's last rounds (40 steps each, at 70-80 ms a step) read x a stream or two high "
               "and creep past the best cap; the requests admitted then miss for a request life (10 s here)")
_SHIFT = ("after the shift the cap falls with the first long requests and climbs back a stream per two refits "
          "(each up move waits for a second refit): short of 0.9x the new best's goodput by 120 s")
_NEAR = ("at 85% of the lone-stream rate the best cap is 2: the loop's cap moves between 1 and 3, and a refit at "
         "either costs a third to a half of the goodput for 10 s")
_ONE_HIGH = "the cap settles a stream above the best (11 against 10): 88% at the floor"
# Gates a policy does not meet yet, per seed, each with its reason (docs/guard.md, "What the matrix shows"):
# strict, so a fix that meets one fails here until its line goes.
SHORT = {
    ("cold-30-6x", 1, "loop"): _SLOW_START + ": 0.87x the best static cap's goodput",
    ("warm-85-3x", 2, "loop"): _NEAR + ": 0.77x",
    ("cold-85-3x", 2, "loop"): _NEAR + ": 81% at the floor, 0.82x",
    ("cold-30-6x", 2, "loop"): _SLOW_START + ": 89% at the floor, 0.84x",
    ("long-prefill", 2, "loop"): "the cap a stream or two above the best for a refit or two: 0.89x",
    ("shift", 2, "loop"): _SHIFT + ": 0.64x",
    ("warm-60-3x", 3, "loop"): _ONE_HIGH,
    ("warm-30-3x", 3, "loop"): ("a slow-start round of 40 steps read the intercept high (its share of 4x "
                                 "steps) and the cap fell from 24 to 15, back at 33 only at 40 s: 0.81x"),
    ("warm-60-1.5x", 3, "loop"): _ONE_HIGH,
    ("warm-60-6x", 3, "loop"): _ONE_HIGH,
    ("cold-30-6x", 3, "loop"): _SLOW_START + ": 0.85x",
    ("open-60", 3, "loop"): "the cap one or two streams high under Poisson arrivals for a refit: 0.5x against 0.8x",
    ("shift", 3, "loop"): _SHIFT + ": 0.45x",
}


def cases(names):
    return [pytest.param(n, seed, p, marks=[pytest.mark.xfail(strict=True, reason=SHORT[n, seed, p])]
                         if (n, seed, p) in SHORT else [])
            for seed in SEEDS for n in names for p in POLICIES]


CLOSED = [s.name for s in m.SCENARIOS if s.kind == "closed"]


def figures(name, how, seed):
    return m.outcome(name, how, seed)["outcome"]


@pytest.mark.parametrize("name,seed,policy", cases(CLOSED))
def test_the_guard_meets_the_floor_where_the_best_static_cap_does_and_keeps_its_goodput(name, seed, policy):
    best, off, g = m.oracle(name, seed)["outcome"], figures(name, "off", seed), figures(name, policy, seed)
    if best.at_floor >= m.ATTAIN:
        assert g.at_floor >= m.ATTAIN, f"{name}: {g.at_floor:.1%} at the floor, the best static cap {best.at_floor:.1%}"
    assert g.goodput >= 0.9 * best.goodput, f"{name}: goodput {g.goodput:.0f} against {best.goodput:.0f}"
    assert g.goodput >= off.goodput


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", [s.name for s in m.SCENARIOS if s.kind != "open"])
@pytest.mark.parametrize("seed", SEEDS)
def test_nothing_is_lost_and_the_limit_is_never_passed(seed, name, policy):
    g = figures(name, policy, seed)
    assert g.lost == 0 and g.limit_exceeded == 0 and g.finished > 0


@pytest.mark.parametrize("name,seed,policy", cases(["open-60"]))
def test_open_loop_capacity_at_both_slos_is_within_a_tenth_of_the_best_static_cap(name, seed, policy):
    best, off, g = m.oracle(name, seed), m.outcome(name, "off", seed), m.outcome(name, policy, seed)
    assert best["capacity"] is not None
    assert (g["capacity"] or 0) >= 0.9 * best["capacity"], (g["curve"], best["curve"])
    assert (g["capacity"] or 0) >= (off["capacity"] or 0)


@pytest.mark.parametrize("name,seed,policy", cases(["shift"]))
def test_after_a_shift_the_guard_is_back_at_the_new_best_and_the_old_best_misses(name, seed, policy):
    """Output x4 and prompt x8 at 60 s: judged on 120-180 s, within 60 s of the shift."""
    o = m.oracle(name, seed)
    assert o["first_on_shift"].at_floor < m.ATTAIN          # tuned for the first phase: misses the floor
    g = figures(name, policy, seed)
    assert g.at_floor >= m.ATTAIN and g.goodput >= 0.9 * o["outcome"].goodput


def test_the_table_in_docs_guard_md_is_what_benchmarks_guard_matrix_py_writes():
    doc = Path(__file__).resolve().parents[2] / "docs" / "guard.md"
    text = doc.read_text(encoding="utf-8")
    assert m.replace_block(text, m.markdown(m.table())) == text, "run python benchmarks/guard_matrix.py"
