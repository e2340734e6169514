"""`vllm-spark bench --levels auto` end to end against the fake server on the wall clock: what holds by
construction (every point marked with why it was chosen, the budget kept, the files written, a lost
server's points kept).  Each run measures for seconds of real time, so these are not unit tests; the
search's exact landing is checked on the simulated clock in tests/unit/test_bench_adaptive.py.
"""
from __future__ import annotations

import csv
import json

import pytest

from vllm_spark_plugin.bench.adaptive import KIND_FLOOR
from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer


@pytest.fixture
def served(fake):
    return fake(alpha=0.005, beta=0.0005)  # 60 tok/s floor: capacity 23, knee 10


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_levels_auto_marks_every_point_and_writes_the_profile(served, tmp_path, capsys):
    out = tmp_path / "auto"
    rc = vllm_spark(["bench", "--endpoint", served.base_url, "--levels", "auto", "--trials", "1",
                     "--workload", "prose", "--output-tokens", "16", "--floor", "60", "--budget-points", "10",
                     "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0
    points = [r for r in _rows(out / "sweep.csv") if r["row_type"] == "point"]
    assert 3 <= len(points) <= 10
    assert [int(p["search_step"]) for p in points] == list(range(1, len(points) + 1))
    assert points[0]["search_phase"] == "start" and {p["search_phase"] for p in points} <= {"start", "grow", "bisect"}
    assert all(p["search_reason"] for p in points)
    # progress says why each level was chosen, before it is measured
    for p in points:
        assert f"point {p['search_step']} at c={p['concurrency']} ({p['search_phase']}): " in captured.err

    summary = json.loads((out / "summary.json").read_text())
    assert summary["config"]["levels"] == "auto" and summary["config"]["search"]["budget_points"] == 10
    curve = summary["curves"][0]
    assert all(p["measured"] for p in curve["points"])
    search = curve["search"]
    assert search["order"] == [int(p["concurrency"]) for p in points]
    assert len(search["decisions"]) == len(points) + 1 and search["decisions"][-1]["concurrency"] is None
    (b,) = search["boundaries"]
    assert b["kind"] == KIND_FLOOR and b["value"] == curve["capacity"]["60"]
    assert summary["config"]["request_count_per_trial"] == {p["concurrency"]: int(p["concurrency"]) for p in points}

    profile = json.loads((out / "capacity_profile.json").read_text())
    assert profile["levels"] == "auto" and profile["capacity"]["60"] == b["value"]
    assert profile["search"]["boundaries"][0]["bracket"] == b["bracket"] and "decisions" not in profile["search"]
    statement = next(line for line in captured.out.splitlines() if line.startswith("fake-model / prose"))
    assert statement == curve["statement"]
    if b["status"] == "known to one stream":
        assert f"(known to one stream: {b['bracket'][1]} misses it" in statement
    html = (out / "report.html").read_text()
    assert "How the levels were chosen (--levels auto)" in html and "why this level" in html


def test_a_fixed_ladder_marks_its_points_as_given(served, tmp_path):
    out = tmp_path / "ladder"
    assert vllm_spark(["bench", "--quiet", "--endpoint", served.base_url, "--levels", "1,4", "--trials", "1",
                       "--workload", "prose", "--output-tokens", "8", "--out", str(out)]) == 0
    rows = _rows(out / "sweep.csv")
    assert {(r["search_phase"], r["search_reason"]) for r in rows} == {("ladder", "given by --levels")}
    assert [r["search_step"] for r in rows if r["row_type"] == "point"] == ["1", "2"]
    assert json.loads((out / "capacity_profile.json").read_text())["search"] is None


def test_budget_points_and_time_bound_the_run(served, tmp_path):
    out = tmp_path / "budget"
    assert vllm_spark(["bench", "--quiet", "--endpoint", served.base_url, "--levels", "auto", "--trials", "1",
                       "--no-warmup", "--workload", "prose", "--output-tokens", "16", "--floor", "60",
                       "--budget-points", "3", "--out", str(out)]) == 0
    search = json.loads((out / "summary.json").read_text())["curves"][0]["search"]
    assert search["points"] == 3 and search["stop_reason"].startswith("budget of 3 points spent")

    out = tmp_path / "seconds"
    assert vllm_spark(["bench", "--quiet", "--endpoint", served.base_url, "--levels", "auto", "--trials", "1",
                       "--no-warmup", "--workload", "prose", "--output-tokens", "64", "--floor", "60",
                       "--budget-seconds", "0.5", "--out", str(out)]) == 0
    search = json.loads((out / "summary.json").read_text())["curves"][0]["search"]
    spent = [d for d in search["decisions"] if d["concurrency"] is not None]
    assert search["stop_reason"].startswith("time budget:") or search["complete"]
    # each point was started only while the time spent was within the budget
    rows = [r for r in _rows(out / "sweep.csv") if r["row_type"] == "point"]
    assert len(rows) == len(spent) and sum(float(r["duration_s"]) for r in rows[:-1]) <= 0.5


def test_a_server_lost_mid_search_keeps_what_was_measured(tmp_path):
    srv = FakeServer(FakeConfig(alpha=0.005, beta=0.0005, die_after_requests=7)).start()  # dies in the third level's warm-up
    try:
        out = tmp_path / "lost"
        rc = vllm_spark(["bench", "--quiet", "--endpoint", srv.base_url, "--levels", "auto", "--trials", "1",
                         "--workload", "prose", "--output-tokens", "8", "--floor", "60", "--out", str(out),
                         "--read-timeout", "10"])  # a loopback fake: a stream cut in its death is seen at once
    finally:
        srv.stop()
    assert rc == 3
    points = [r for r in _rows(out / "sweep.csv") if r["row_type"] == "point"]
    assert [int(p["concurrency"]) for p in points] == [1, 2]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed"
    assert summary["curves"][0]["search"]["stop_reason"] == "the run ended before the search did"
    assert json.loads((out / "capacity_profile.json").read_text())["search"]["points"] == 2

