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
_CLIMB_PAST = ("the cap climbs past the best static cap (33-35 against 31-33) for a refit or two: the requests "
               "admitted then miss for a request life (10 s at this floor)")
_SHIFT = ("after the shift the cap falls a stream a refit or two behind the best: a cohort's spread counts at most "
          "three times the spread in use, and at 512-token outputs a cohort takes 30 s to finish")
_CPU_SLOW = ("the slow start's round at 3 has no room (its mean step and the spread's prior, 5% of the target, pass "
             "it) and tracks from 2; the secant at the cap lifts it a stream a refit or two: ")
_EDGE = ("the cap is the best static cap (10) from 6 s on and 11 from 80 s: 89% at the floor where the static 10 "
         "gets 92%")
# Gates a policy does not meet yet, per seed, each with its reason (docs/guard.md, "What the matrix shows"):
# strict, so a fix that meets one fails here until its line goes.
SHORT = {
    ("cold-30-6x", 1, "loop"): _CLIMB_PAST + ": 89% at the floor, 0.83x the best static cap's goodput",
    ("shift", 1, "loop"): _SHIFT + " (8 from 80 s to 120 s where 7 is best): 86% at the floor",
    ("cpu-cold-75-3x", 1, "loop"): _CPU_SLOW + "3 at 30 s, 4 (the best) at 60 s: 0.80x",
    ("cpu-warm-75-3x", 1, "loop"): _CPU_SLOW + "3 at 20 s, 4 (the best) at 40 s: 0.87x",
    ("warm-60-3x", 3, "loop"): _EDGE,
    ("warm-60-1.5x", 3, "loop"): _EDGE,
    ("warm-60-6x", 3, "loop"): _EDGE,
    ("cold-30-6x", 3, "loop"): ("the slow start's round at 16 goes to 24, and the refits lift it two streams past the "
                                "highest batch measured at a time (26 at 20 s, 28 at 40 s) where 31 is best: 0.89x"),
    ("open-60", 3, "loop"): "the cap one or two streams off the best under Poisson arrivals for a refit: 0.7x against 0.8x",
    ("shift", 3, "loop"): _SHIFT + " (8 from 110 s to 141 s where 6 is best): 87% at the floor, 0.87x",
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


def test_a_static_cap_tuned_on_another_day_is_judged_by_the_same_gates():
    """The yardstick of docs/guard.md ("The yardstick"): the best static cap of seed 1001, served on seed 1.
    On long-prefill that day's best is 6 where seed 1's own search found 5, and 6 keeps 85% at the floor:
    the cap a user tunes by sweep misses a gate that the searched cap, picked on the run it is judged on,
    meets by construction."""
    short = m.short_gates_tuned_elsewhere(1)
    assert "long-prefill: 85% at the floor (cap 6 against 5)" in short
    assert not any(x.startswith(("warm-60-3x", "warm-85-3x", "shift")) for x in short)


def test_a_slow_spell_lengthens_the_steps_inside_it_and_no_others():
    """`--slow FACTOR START END` (docs/guard.md, iteration 18): a static cap on the CPU steps with every step
    1.5x as long from 20 to 50 s finishes fewer tokens, and the requests that finish before the spell
    are exactly the run's without it (same seed, same clock up to 20 s)."""
    from dataclasses import replace

    from support.plant import Plant

    s = m.scenario("cpu-cold-55-3x")
    plain = Plant(s.engine, s.load, 1).run(static=13)
    slow = Plant(replace(s.engine, slow=(1.5, 20.0, 50.0)), s.load, 1).run(static=13)
    before = [(f.arrival, f.done) for f in plain.finished if f.done < 20.0]
    assert before and before == [(f.arrival, f.done) for f in slow.finished if f.done < 20.0]
    assert len(slow.finished) < 0.95 * len(plain.finished)  # 882 against 994 on seed 1
