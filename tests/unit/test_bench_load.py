"""The load scenarios of `vllm-spark bench` (bench/overload.py): poisson, shift and the judging that
overload shares, against the fake server (testbed/fake_server.py).

The fake's engine: a step with b running streams takes alpha + beta*b and gives each one token;
`max_batch` caps the running requests the way the SLO guard's admission cap does (the rest queue).
Timing claims are checked on its simulated clock, where the test moves time and every request's
arrival and token times are exact (`server.timings`); the command-line runs on the wall clock check
only what no clock can change (counts, shapes, the load asked for, the errors).
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time

import pytest

from vllm_spark_plugin.bench.client import OpenAIStreamClient, StreamResult
from vllm_spark_plugin.bench.overload import (AFTER, BEFORE, LoadPlan, Sent, capacity_request_rate, judge,
                                              poisson_schedule, request_row, run_open, server_figures)
from vllm_spark_plugin.bench.workloads import PromptFactory, make_workload
from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.definitions import StreamTiming
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer, SimulatedClock


@pytest.fixture
def fake():
    servers = []

    def start(clock=None, **kw) -> FakeServer:
        s = FakeServer(FakeConfig(**kw), clock=clock).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


def bench(*argv) -> int:
    return vllm_spark(["bench", "--quiet", *argv])


def scenario_result(out, name: str) -> dict:
    return json.loads((out / "summary.json").read_text())["scenarios"][name]


def timing(start, first, last, tokens=11, error=None) -> StreamResult:
    return StreamResult(StreamTiming(output_tokens=tokens, start=start, first_token=first, last_token=last,
                                     error=error), arrivals=tokens)


# ----------------------------------------------------------------------------------- pure pieces
def test_poisson_schedule_is_seeded_starts_at_zero_and_has_the_rate_asked():
    a, b = poisson_schedule(20.0, 4000, seed=7), poisson_schedule(20.0, 4000, seed=7)
    assert a == b and a[0] == 0.0 and a == sorted(a) and len(a) == 4000
    assert poisson_schedule(20.0, 50, seed=8) != a[:50]
    gaps = [y - x for x, y in zip(a, a[1:])]
    assert statistics.mean(gaps) == pytest.approx(1 / 20.0, rel=0.05)
    assert statistics.stdev(gaps) == pytest.approx(1 / 20.0, rel=0.08)  # exponential: sd = mean
    with pytest.raises(ValueError):
        poisson_schedule(0.0, 3)


def test_capacity_request_rate_is_what_the_capacity_completes_at_the_floor():
    # 24 streams at 110 tok/s, 128 tokens each: 20.6 requests/s
    assert capacity_request_rate(24, 110.0, 128) == pytest.approx(24 * 110 / 128)


def test_load_plan_shifts_after_a_request_count_or_a_time():
    short, long_ = make_workload("random", output_tokens=10, input_tokens=4), make_workload("random", 40, None, 32)
    by_count = LoadPlan(short, long_, after_requests=3)
    assert [by_count.at(i, 99.0) for i in range(5)] == [(BEFORE, short)] * 3 + [(AFTER, long_)] * 2
    by_time = LoadPlan(short, long_, after_seconds=2.0)
    assert by_time.at(100, 1.99) == (BEFORE, short) and by_time.at(0, 2.0) == (AFTER, long_)
    assert LoadPlan(short).at(7, 1e9) == ("", short)


def test_every_offered_request_counts_and_a_failed_one_meets_nothing():
    """Floor 20 tok/s, TTFT SLO 1 s; 10 decode tokens per request."""
    sent = [Sent(0, "", 0.0, timing(0.0, 0.2, 0.4)),               # 50 tok/s, TTFT 0.2: both
            Sent(1, "", 0.1, timing(0.1, 0.3, 1.3)),               # 10 tok/s: TTFT only
            Sent(2, "", 0.2, timing(0.2, 2.2, 2.4)),               # 50 tok/s, TTFT 2.0: floor only
            Sent(3, "", 0.3, timing(0.3, None, None, 0, "HTTP 500: boom"))]
    rows = [request_row(s, 20.0, 1.0) for s in sent]
    assert [(r["met_floor"], r["met_ttft"], r["met_slo"]) for r in rows] == [
        (True, True, True), (False, True, False), (True, False, False), (False, False, False)]
    assert rows[0]["rate_tokens_per_second"] == pytest.approx(50.0) and rows[3]["ttft_s"] is None
    got = judge(rows, 4.0)
    assert (got["requests"], got["completed"], got["errors"]) == (4, 3, 1)
    assert (got["rate_met_share"], got["ttft_met_share"], got["slo_met_share"]) == (0.5, 0.5, 0.25)
    assert got["rate_goodput_tokens_per_second"] == pytest.approx(22 / 4.0)
    assert got["slo_goodput_tokens_per_second"] == pytest.approx(11 / 4.0)
    assert got["output_tokens_per_second"] == pytest.approx(33 / 4.0)
    assert got["ttft_p50_s"] == pytest.approx(0.2)


def test_the_servers_own_counts_are_the_change_of_its_slo_counters_over_the_run():
    def text(met, rate_missed, tokens_met):
        return ("# TYPE vllm_spark_slo_requests counter\n"
                f'vllm_spark_slo_requests_total{{engine="0",floor="110",outcome="met"}} {met}\n'
                f'vllm_spark_slo_requests_total{{engine="0",floor="110",outcome="missed_rate"}} {rate_missed}\n'
                f'vllm_spark_slo_requests_total{{engine="0",floor="20",outcome="met"}} 999\n'
                "# TYPE vllm_spark_slo_output_tokens counter\n"
                f'vllm_spark_slo_output_tokens_total{{engine="0",floor="110",outcome="met"}} {tokens_met}\n'
                "# TYPE vllm_spark_ttft_slo_seconds gauge\nvllm_spark_ttft_slo_seconds 2.0\n")
    got = server_figures(text(5, 1, 500), text(35, 11, 4340), 110.0, 10.0)
    assert got["server_requests"] == 40 and got["server_outcomes"]["met"] == 30
    assert got["server_rate_met_share"] == pytest.approx(0.75) and got["server_slo_met_share"] == pytest.approx(0.75)
    assert got["server_slo_goodput_tokens_per_second"] == pytest.approx(384.0)
    assert got["server_ttft_slo_s"] == 2.0
    assert server_figures("", text(1, 1, 1), 60.0, 1.0)["server_requests"] is None  # no counters at 60


# ----------------------------------------------------------------------- open loop, simulated clock
def _poisson_on_simulated_clock(fake, max_batch: int):
    """Six requests of 11 tokens, Poisson at 25/s (seed 3), through `run_open` on the fake's clock:
    the test advances time to each send time, waits until the request reached the fake, and runs
    the engine on until all are done.  Returns (schedule, server timings in arrival order, rows
    judged at floor 60 tok/s and TTFT 0.3 s on the server's clock)."""
    clock = SimulatedClock()
    alpha, beta, tokens = 0.005, 0.005, 11  # 100 tok/s alone, 66.7 at 2, 50 at 3
    srv = fake(clock=clock, alpha=alpha, beta=beta, max_batch=max_batch)
    schedule = poisson_schedule(25.0, 6, seed=3)
    plan = LoadPlan(make_workload("random", output_tokens=tokens, input_tokens=4))
    prompts = PromptFactory("sim", token_pool=list(range(20, 200)), seed=1)

    async def run():
        async with OpenAIStreamClient(srv.base_url, "fake-model", api="completions") as client:
            task = asyncio.create_task(run_open(client, prompts, plan, schedule, clock=clock))
            for i, when in enumerate(schedule):
                if when > clock.now():
                    clock.advance(when - clock.now() + 1e-12)
                deadline = time.monotonic() + 10
                while len(srv.timings) < i + 1:  # recorded with its arrival time (requests_seen counts earlier)
                    assert time.monotonic() < deadline, f"request {i} never reached the fake"
                    await asyncio.sleep(0.002)
            while not task.done():
                clock.advance(0.05)
                await asyncio.sleep(0.005)
            return await task
    sent, seconds = asyncio.run(asyncio.wait_for(run(), 30))
    assert [s.index for s in sent] == list(range(6)) and all(s.result.ok for s in sent)
    timings = [srv.timings[f"cmpl-{i}"] for i in range(1, 7)]
    rows = [request_row(Sent(i, "", t.arrived, StreamResult(StreamTiming(
        output_tokens=len(t.token_times), start=t.arrived, first_token=t.token_times[0],
        last_token=t.token_times[-1]), arrivals=len(t.token_times))), 60.0, 0.3) for i, t in enumerate(timings)]
    return schedule, timings, rows, alpha + beta


def test_open_loop_arrivals_follow_the_schedule_not_the_completions(fake):
    schedule, timings, rows, _ = _poisson_on_simulated_clock(fake, max_batch=1)
    assert [t.arrived for t in timings] == pytest.approx(schedule, abs=1e-9)
    # arrivals came faster than one stream is served: some arrived while others were still running
    assert any(b.arrived < a.token_times[-1] for a, b in zip(timings, timings[1:]))


def test_under_a_cap_the_open_loop_keeps_the_floor_and_the_wait_moves_into_ttft(fake):
    """max_batch 1 (a cap at one stream): every admitted stream runs alone at exactly 1/(alpha+beta),
    above the floor; requests that arrive while one runs wait, which only TTFT shows.  Uncapped,
    the same arrivals share steps and the streams that overlap fall below the floor."""
    _, timings, capped, step = _poisson_on_simulated_clock(fake, max_batch=1)
    assert all(r["rate_tokens_per_second"] == pytest.approx(1 / step, rel=1e-9) for r in capped)
    got = judge(capped, 1.0)
    assert got["rate_met_share"] == 1.0
    assert got["ttft_met_share"] < 1.0 and got["slo_met_share"] == got["ttft_met_share"]
    _, _, uncapped, _ = _poisson_on_simulated_clock(fake, max_batch=4096)
    free = judge(uncapped, 1.0)
    assert free["rate_met_share"] < 1.0 and free["ttft_met_share"] == 1.0
    assert free["ttft_p99_s"] < got["ttft_p99_s"]


# ---------------------------------------------------------------------- the command, wall clock
CAPACITY_2_AT_70 = 'vllm_spark_capacity_streams{engine="0",floor="70",model_name="fake-model"} 2.0\n'


def test_poisson_command_sizes_its_arrival_rate_from_the_live_capacity(fake, tmp_path):
    srv = fake(alpha=0.001, beta=0.001, extra_metrics=CAPACITY_2_AT_70)
    out = tmp_path / "p"
    rc = bench("--endpoint", srv.base_url, "--api", "completions", "--scenario", "poisson", "--slo-floor", "70",
               "--slo-ttft", "0.5", "--workload", "random", "--random-input-len", "4", "--output-tokens", "10",
               "--poisson-factor", "1.5", "--overload-requests", "6", "--seed", "1", "--out", str(out))
    assert rc == 0
    r = scenario_result(out, "poisson")
    assert r["arrival_rate_per_second"] == pytest.approx(1.5 * 2 * 70 / 10)
    assert (r["capacity_streams"], r["capacity_source"], r["requests"], r["completed"]) == (
        2, "vllm_spark_capacity_streams", 6, 6)
    assert len(r["per_request"]) == 6 and r["ttft_slo_s"] == 0.5
    assert [x["sent_s"] for x in r["per_request"]] == sorted(x["sent_s"] for x in r["per_request"])
    assert r["server_requests"] is None and "SPARK_PLUGIN_FLOORS" in r["server_note"]  # the fake counts nothing
    assert "<h3>poisson</h3>" in (out / "report.html").read_text()


def test_shift_command_changes_the_request_shape_after_n_requests(fake, tmp_path):
    srv = fake(alpha=0.001, beta=0.001)
    out = tmp_path / "s"
    rc = bench("--endpoint", srv.base_url, "--api", "completions", "--scenario", "shift", "--slo-floor", "70",
               "--workload", "random", "--random-input-len", "4", "--output-tokens", "5", "--overload-streams", "2",
               "--overload-requests", "8", "--shift-after-requests", "4", "--out", str(out))
    assert rc == 0
    r = scenario_result(out, "shift")
    shapes = [(x["phase"], x["prompt_tokens"], x["output_tokens"]) for x in r["per_request"]]
    assert shapes == [(BEFORE, 4, 5)] * 4 + [(AFTER, 32, 20)] * 4
    assert r["shift"] == {"after_requests": 4, "after_seconds": None, "output_tokens": [5, 20],
                          "prompt_tokens": [4, 32]}
    assert r["phases"][BEFORE]["requests"] == r["phases"][AFTER]["requests"] == 4
    assert r["streams"] == 2 and r["errors"] == 0


def test_load_scenarios_refuse_options_they_cannot_use(fake, tmp_path, capsys):
    srv = fake(max_model_len=256)
    base = ("--endpoint", srv.base_url, "--api", "completions", "--slo-floor", "70", "--out", str(tmp_path / "x"))
    assert bench(*base, "--scenario", "poisson", "--poisson-rate", "5") == 2
    assert "--slo-ttft" in capsys.readouterr().err
    assert bench(*base, "--scenario", "shift", "--workload", "code") == 2
    assert "--workload random" in capsys.readouterr().err
    assert bench(*base, "--scenario", "shift", "--workload", "random", "--shift-after-requests", "2",
                 "--shift-after-seconds", "1") == 2
    assert "not both" in capsys.readouterr().err
    # after the shift: 8 x 32 prompt tokens and 4 x 16 output tokens do not fit max_model_len 256
    assert bench(*base, "--scenario", "shift", "--workload", "random", "--random-input-len", "32",
                 "--output-tokens", "16") == 2
    assert "max_model_len 256" in capsys.readouterr().err
