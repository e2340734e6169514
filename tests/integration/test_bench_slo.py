"""`vllm-spark bench --slo-*` against the fake server: goodput and attainment per trial and per point
equal what `streams.csv` gives by the same definition, and the SLO capacity reaches every report.

The fake's engine (testbed/fake_server.py): a step with b running streams takes alpha + beta*b and
gives each one token; with max_batch 4, streams beyond the fourth queue for a whole batch, so
their TTFT is long.  alpha 1 ms, beta 5 ms: 167 tok/s at 1 stream, 91 at 2, 48 at 4 and up, so a
floor of 65 tok/s is met at 1 stream with a wide margin and missed from 4 on (a busy machine only
makes streams slower, never faster).  Each run measures on the wall clock for seconds, so this is
not a unit test.
"""
from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest

from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer
from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.definitions import SLO_MET, slo_outcome

TTFT, FLOOR, E2E = 0.3, 65.0, 5.0


@pytest.fixture
def served():
    srv = FakeServer(FakeConfig(alpha=0.001, beta=0.005, max_batch=4)).start()
    yield srv
    srv.stop()


def _f(text: str) -> float | None:
    return float(text) if text != "" else None


def outcome_from_stream_row(r: dict) -> str:
    """The SLO judgement of one streams.csv row, from its raw columns, by the shared definition."""
    if r["error"]:
        return slo_outcome(None, None, TTFT, FLOOR)
    o = slo_outcome(_f(r["ttft_s"]), _f(r["decode_tps"]), TTFT, FLOOR)
    if o == SLO_MET and _f(r["ttft_s"]) + (_f(r["decode_s"]) or 0.0) > E2E:
        return "missed_e2e"
    return o


def test_goodput_and_attainment_equal_what_streams_csv_gives(served, tmp_path, capsys):
    out = tmp_path / "run"
    rc = vllm_spark(["bench", "--quiet", "--endpoint", served.base_url, "--levels", "1,2,4,8", "--trials", "2",
                     "--workload", "code", "--output-tokens", "20", "--slo-ttft", str(TTFT), "--slo-floor", str(FLOOR),
                     "--slo-e2e", str(E2E), "--out", str(out)])
    assert rc == 0
    stdout = capsys.readouterr().out
    sweep = list(csv.DictReader(open(out / "sweep.csv")))
    streams = list(csv.DictReader(open(out / "streams.csv")))

    groups: dict = defaultdict(list)
    for r in streams:
        groups[(int(r["concurrency"]), int(r["trial"]))].append(r)
        assert r["slo_outcome"] == outcome_from_stream_row(r)
    outcomes_seen = set()
    for row in sweep:
        c, trial = int(row["concurrency"]), int(row["trial"])
        rs = (groups[(c, trial)] if row["row_type"] == "trial"
              else [r for t in range(1, trial + 1) for r in groups[(c, t)]])
        judged = [outcome_from_stream_row(r) for r in rs]
        outcomes_seen |= set(judged)
        met_tokens = sum(int(r["output_tokens"]) for r, o in zip(rs, judged) if o == SLO_MET)
        assert len(rs) == int(row["requests"]) > 0
        assert float(row["slo_attainment"]) == pytest.approx(judged.count(SLO_MET) / len(rs), rel=1e-5), row
        assert float(row["goodput_tps"]) == pytest.approx(met_tokens / float(row["duration_s"]), rel=1e-4), row
        for name in ("met", "missed_ttft", "missed_rate", "missed_both", "missed_e2e"):
            assert int(row[f"slo_{name}"]) == judged.count(name), (name, row)
        assert float(row["goodput_tps"]) <= float(row["output_tps"]) * (1 + 1e-6)
    assert {SLO_MET, "missed_rate", "missed_both"} <= outcomes_seen  # the run exercised the SLO

    points = {int(r["concurrency"]): r for r in sweep if r["row_type"] == "point"}
    assert float(points[1]["slo_attainment"]) == 1.0
    assert float(points[4]["slo_attainment"]) == 0.0          # 48 tok/s < 65 for every stream
    assert float(points[8]["goodput_tps"]) == 0.0
    capacity = max(c for c, p in points.items() if float(p["slo_attainment"]) >= 0.99)
    assert capacity in (1, 2)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["curves"][0]["slo_capacity"] == capacity
    assert summary["config"]["slo"] == {"ttft_seconds": TTFT, "floor_tokens_per_second": FLOOR,
                                        "e2e_seconds": E2E, "target_attainment": 0.99}
    profile = json.loads((out / "capacity_profile.json").read_text())
    assert profile["slo"]["capacity"] == capacity and profile["slo"]["target_attainment"] == 0.99
    assert profile["slo"]["attainment"]["4"] == 0.0
    assert ("highest concurrency with SLO attainment >= 0.99 (TTFT <= 0.3 s, per-stream rate >= 65 tok/s, "
            f"end-to-end <= 5 s): {capacity}") in stdout
    html = (out / "report.html").read_text()
    assert "SLO attainment %" in html and "goodput tok/s" in html and "Latency SLO" in html


def test_no_slo_options_leave_the_slo_columns_empty(served, tmp_path):
    out = tmp_path / "run"
    assert vllm_spark(["bench", "--quiet", "--endpoint", served.base_url, "--levels", "1", "--trials", "1",
                       "--no-warmup", "--output-tokens", "8", "--out", str(out)]) == 0
    row = next(csv.DictReader(open(out / "sweep.csv")))
    assert row["slo_attainment"] == row["goodput_tps"] == row["slo_met"] == ""
    assert json.loads((out / "capacity_profile.json").read_text())["slo"] is None


@pytest.mark.parametrize("argv, message", [(["--slo-target", "1.5"], "fraction"),
                                           (["--slo-ttft", "-1"], "positive")])
def test_bad_slo_options_are_usage_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        vllm_spark(["bench", "--quiet", *argv])
    assert exc.value.code == 2 and message in capsys.readouterr().err
