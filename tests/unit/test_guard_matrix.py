"""The SLO guard against the best static max_num_seqs on a simulated plant (tests/support/plant.py),
scenario by scenario, for every registered admission policy: the gates of docs/guard.md ("The
matrix").  Deterministic (seeded); the whole matrix costs a few seconds of CPU, each oracle is
searched once per process."""
from __future__ import annotations

from pathlib import Path

import pytest

from support import guard_matrix as m

pytestmark = pytest.mark.unit

POLICIES = m.policies()
# Gates a policy does not meet yet, each with its reason (docs/guard.md, "What the matrix shows"): strict,
# so a fix that meets one fails here until its line goes.
SHORT = {
    ("cold-30-6x", "loop"): "the slow start's last rounds (40 steps each, at 70-80 ms a step) read x a stream or "
                            "two high and creep past the best cap; the requests admitted then miss for a request "
                            "life (10 s at this floor): 93% at the floor, 0.87x the best static cap's goodput",
}


def cases(names):
    return [pytest.param(n, p, marks=[pytest.mark.xfail(strict=True, reason=SHORT[n, p])] if (n, p) in SHORT else [])
            for n in names for p in POLICIES]


CLOSED = [s.name for s in m.SCENARIOS if s.kind == "closed"]


def figures(name, how):
    return m.outcome(name, how)["outcome"]


@pytest.mark.parametrize("name,policy", cases(CLOSED))
def test_the_guard_meets_the_floor_where_the_best_static_cap_does_and_keeps_its_goodput(name, policy):
    best, off, g = m.oracle(name)["outcome"], figures(name, "off"), figures(name, policy)
    if best.at_floor >= m.ATTAIN:
        assert g.at_floor >= m.ATTAIN, f"{name}: {g.at_floor:.1%} at the floor, the best static cap {best.at_floor:.1%}"
    assert g.goodput >= 0.9 * best.goodput, f"{name}: goodput {g.goodput:.0f} against {best.goodput:.0f}"
    assert g.goodput >= off.goodput


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("name", [s.name for s in m.SCENARIOS if s.kind != "open"])
def test_nothing_is_lost_and_the_limit_is_never_passed(name, policy):
    g = figures(name, policy)
    assert g.lost == 0 and g.limit_exceeded == 0 and g.finished > 0


@pytest.mark.parametrize("policy", POLICIES)
def test_open_loop_capacity_at_both_slos_is_within_a_tenth_of_the_best_static_cap(policy):
    best, off, g = m.oracle("open-60"), m.outcome("open-60", "off"), m.outcome("open-60", policy)
    assert best["capacity"] is not None
    assert (g["capacity"] or 0) >= 0.9 * best["capacity"], (g["curve"], best["curve"])
    assert (g["capacity"] or 0) >= (off["capacity"] or 0)


@pytest.mark.parametrize("name,policy", cases(["shift"]))
def test_after_a_shift_the_guard_is_back_at_the_new_best_and_the_old_best_misses(name, policy):
    """Output x4 and prompt x8 at 60 s: judged on 120-180 s, within 60 s of the shift."""
    o = m.oracle("shift")
    assert o["first_on_shift"].at_floor < m.ATTAIN          # tuned for the first phase: misses the floor
    g = figures("shift", policy)
    assert g.at_floor >= m.ATTAIN and g.goodput >= 0.9 * o["outcome"].goodput


def test_the_table_in_docs_guard_md_is_what_benchmarks_guard_matrix_py_writes():
    doc = Path(__file__).resolve().parents[2] / "docs" / "guard.md"
    text = doc.read_text(encoding="utf-8")
    assert m.replace_block(text, m.markdown(m.table())) == text, "run python benchmarks/guard_matrix.py"
