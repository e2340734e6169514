"""`vllm-spark bench` against the fake OpenAI SSE server (vllm_spark_plugin/testbed/fake_server.py).

The fake stands in for vLLM where a test needs what a real server cannot give: exactly known step
times (so the client-measured rates can be checked against the truth), dying or hanging on command,
and fast runs.  Its engine: a step with b running streams takes alpha + beta*b seconds and gives each
stream one token, so the per-stream rate is 1/(alpha + beta*b) and the knee alpha/beta.

Exact timing is asserted on the fake's simulated clock (the `*_simulated_clock` tests): the test moves
time, the engine's steps end exactly on schedule, and the seed definitions applied to the server's
token times give the known rates to float rounding.  The end-to-end runs of the command (the
client times tokens on the wall clock) check the same rates with a tolerance.
"""
from __future__ import annotations

import asyncio
import csv
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from PIL import Image

from vllm_spark_plugin.bench import cli as bench_cli
from vllm_spark_plugin.bench.client import OpenAIStreamClient
from vllm_spark_plugin.bench.results import CSV_COLUMNS
from vllm_spark_plugin.bench.stats import summarize
from vllm_spark_plugin.cli import main as vllm_spark
from vllm_spark_plugin.definitions import StreamTiming, SweepPoint, aggregate_throughput, capacity_at_floor
from vllm_spark_plugin.knee.fit import fit_points
from vllm_spark_plugin.knee.online import OnlineKneeEstimator
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer, SimulatedClock

ROOT = Path(__file__).resolve().parents[2]
REQUIRED_COLUMNS = ["row_type", "label", "workload", "endpoint", "model", "mode", "concurrency", "trial",
                    "requests", "completed", "errors", "short_streams", "per_stream_median_tps",
                    "per_stream_min_tps", "per_stream_p10_tps", "aggregate_tps", "ttft_p50_s", "ttft_p90_s",
                    "ttft_p99_s", "output_tokens", "prompt_tokens", "duration_s"]


@pytest.fixture
def fake():
    servers = []

    def start(**kw) -> FakeServer:
        s = FakeServer(FakeConfig(**kw)).start()
        servers.append(s)
        return s

    yield start
    for s in servers:
        s.stop()


@pytest.fixture
def simulated():
    """A fake on simulated time: returns (server, clock)."""
    servers = []

    def start(**kw) -> tuple[FakeServer, SimulatedClock]:
        clock = SimulatedClock()
        s = FakeServer(FakeConfig(**kw), clock=clock).start()
        servers.append(s)
        return s, clock

    yield start
    for s in servers:
        s.stop()


async def _wait_in_flight(srv: FakeServer, n: int) -> None:
    deadline = time.monotonic() + 10
    while srv.in_flight < n:
        assert time.monotonic() < deadline, f"{srv.in_flight} of {n} requests reached the fake"
        await asyncio.sleep(0.005)


def stream_on_simulated_clock(srv: FakeServer, clock: SimulatedClock, batches: list[list[tuple[str, int]]],
                              advance: list[float]) -> list:
    """Send each batch of (prompt, max_tokens) with the real client, wait until the fake holds it,
    then move simulated time on by the matching `advance`; returns the client's results in order."""
    async def run():
        async with OpenAIStreamClient(srv.base_url, "fake-model", api="completions") as client:
            tasks = []
            for batch, dt in zip(batches, advance):
                expected = srv.in_flight + len(batch)
                tasks += [asyncio.create_task(client.stream(p, n)) for p, n in batch]
                await _wait_in_flight(srv, expected)
                clock.advance(dt)
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)
    return asyncio.run(run())


def server_timing(srv: FakeServer, rid: str) -> StreamTiming:
    """The seed definitions' view of one request, on the server's simulated clock."""
    t = srv.timings[rid]
    return StreamTiming(output_tokens=len(t.token_times), start=t.arrived, first_token=t.token_times[0],
                        last_token=t.token_times[-1])


@pytest.mark.parametrize("c", [1, 4, 16])
def test_rates_are_exact_on_the_simulated_clock(simulated, c):
    alpha, beta, n = 0.010, 0.001, 40
    srv, clock = simulated(alpha=alpha, beta=beta)
    results = stream_on_simulated_clock(srv, clock, [[(f"sim {i}", n) for i in range(c)]], [10.0])
    assert all(r.ok and r.timing.output_tokens == n for r in results)
    step = alpha + beta * c
    rids = [f"cmpl-{i}" for i in range(1, c + 1)]
    for rid in rids:  # every stream joined the first step: a token every step from t = 0
        assert srv.timings[rid].token_times == pytest.approx([k * step for k in range(1, n + 1)], rel=1e-9)
    timings = [server_timing(srv, rid) for rid in rids]
    for t in timings:
        assert t.start == 0.0
        assert t.ttft == pytest.approx(step, rel=1e-9)
        assert t.decode_rate == pytest.approx(1 / step, rel=1e-9)
    assert aggregate_throughput(timings) == pytest.approx(c / step, rel=1e-9)
    assert srv.max_batch_seen == c


def test_sweep_on_the_simulated_clock_gives_the_exact_curve_knee_and_capacity(simulated):
    """The sweep's numbers (summarize, capacity, knee fit) on token times the test controls."""
    alpha, beta, n = 0.010, 0.001, 40
    srv, clock = simulated(alpha=alpha, beta=beta)
    points = []
    for c in (1, 2, 4, 8, 16):
        before = set(srv.timings)
        stream_on_simulated_clock(srv, clock, [[(f"sweep c{c} {i}", n) for i in range(c)]], [10.0])
        timings = [server_timing(srv, rid) for rid in srv.timings if rid not in before]
        m = summarize([timings], [n * (alpha + beta * c)])
        step = alpha + beta * c
        assert m.per_stream_median_tps == pytest.approx(1 / step, rel=1e-9)
        assert m.aggregate_tps == pytest.approx(c / step, rel=1e-9)
        assert m.ttft_p50_s == pytest.approx(step, rel=1e-9)
        assert m.output_tps == pytest.approx(c / step, rel=1e-9)
        points.append(SweepPoint(concurrency=c, per_stream_tokens_per_second=m.per_stream_median_tps,
                                 aggregate_tokens_per_second=m.aggregate_tps, ttft_p50_seconds=m.ttft_p50_s))
    # 1/(a+16b) = 38.5 >= 20; 1/(a+16b) < 50 <= 1/(a+8b) = 55.6
    assert capacity_at_floor(points, 20) == 16 and capacity_at_floor(points, 50) == 8
    fit = fit_points(points, floors=(20, 50), bootstrap=0)
    assert fit.alpha_seconds == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_seconds == pytest.approx(beta, rel=1e-6)
    assert fit.knee == pytest.approx(alpha / beta, rel=1e-6)


def test_live_and_sweep_knee_agree_on_the_same_steps(simulated):
    """The two estimators of K on one load ramp whose timing the test controls: the online estimator
    fed the engine's steps (what the scheduler hook hands it), and the offline fit of the sweep's
    client-side points (the seed definitions on the streams' token times).  Prompts cost prefill
    time in their first step, which the online fit prices (gamma) and the decode rate never sees.  On a real server the same comparison is a measurement: benchmarks/knee_agreement.py."""
    alpha, beta, gamma, n = 0.012, 0.0008, 0.0002, 40
    srv, clock = simulated(alpha=alpha, beta=beta, prefill_per_token=gamma)
    points = []
    for c in (1, 2, 4, 8, 16, 32):
        before = set(srv.timings)
        prompts = [(" ".join(f"ramp{c}-{i}-w{w}" for w in range(50)), n) for i in range(c)]
        stream_on_simulated_clock(srv, clock, [prompts], [20.0])
        timings = [server_timing(srv, rid) for rid in srv.timings if rid not in before]
        m = summarize([timings], [timings[0].last_token - timings[0].start])
        points.append(SweepPoint(concurrency=c, per_stream_tokens_per_second=m.per_stream_median_tps,
                                 aggregate_tokens_per_second=m.aggregate_tps, ttft_p50_seconds=m.ttft_p50_s))
    assert [b for b, p, _ in srv.steps if p] == [1, 2, 4, 8, 16, 32]  # one prefill step per level
    est = OnlineKneeEstimator(clock=lambda: 0.0)
    for b, p, t in srv.steps:
        est.observe(b, p, t)
    live = est.estimate(force=True)
    offline = fit_points(points, floors=(20,), bootstrap=0)
    assert live.alpha_seconds == pytest.approx(alpha, rel=1e-6)
    assert live.beta_seconds == pytest.approx(beta, rel=1e-6)
    assert live.gamma_seconds_per_prefill_token == pytest.approx(gamma, rel=1e-6)
    assert live.knee == pytest.approx(offline.knee, rel=1e-6)
    assert live.knee == pytest.approx(alpha / beta, rel=1e-6)
    assert live.capacity_at(20) == offline.capacity_at(20) == int((1 / 20 - alpha) / beta)


def test_prefill_stall_is_exact_on_the_simulated_clock(simulated):
    """A 2000-token uncached prompt joining two running streams stalls them for exactly its prefill.

    It arrives in the middle of the 6th step, so it joins the 7th (a step's batch is set when it starts)."""
    alpha, beta, per_token = 0.010, 0.001, 0.0005
    srv, clock = simulated(alpha=alpha, beta=beta, prefill_per_token=per_token)
    short = [("a b c d", 30), ("e f g h", 30)]  # 4 prompt tokens each, prefilled in the first step
    long = [(" ".join(f"w{i}" for i in range(2000)), 5)]
    first_step = alpha + 2 * beta + 8 * per_token
    steady = alpha + 2 * beta
    # run the two streams for 5 steps and half of the 6th, then the long prompt arrives
    results = stream_on_simulated_clock(srv, clock, [short, long], [first_step + 4 * steady + steady / 2, 30.0])
    assert [r.timing.output_tokens for r in results] == [30, 30, 5]
    stall = alpha + 3 * beta + 2000 * per_token  # the 7th step, which the long prompt joins
    for rid in ("cmpl-1", "cmpl-2"):
        times = srv.timings[rid].token_times
        gaps = [b - a for a, b in zip(times, times[1:])]
        assert times[0] == pytest.approx(first_step, rel=1e-9)
        assert gaps[:5] == pytest.approx([steady] * 5, rel=1e-9)
        assert gaps[5] == pytest.approx(stall, rel=1e-9)
        assert gaps[6:10] == pytest.approx([alpha + 3 * beta] * 4, rel=1e-9)
    joined = srv.timings["cmpl-3"]
    assert joined.arrived == pytest.approx(first_step + 4 * steady + steady / 2, rel=1e-9)
    assert joined.token_times[0] == pytest.approx(first_step + 5 * steady + stall, rel=1e-9)
    assert joined.prompt_tokens == 2000


def test_prefix_cache_skips_the_prefill_on_the_simulated_clock(simulated):
    """The same 2000-token prompt again: its first token comes one plain step after it arrives."""
    alpha, beta, per_token = 0.010, 0.001, 0.0005
    srv, clock = simulated(alpha=alpha, beta=beta, prefill_per_token=per_token)
    prompt = " ".join(f"w{i}" for i in range(2000))
    stream_on_simulated_clock(srv, clock, [[(prompt, 3)]], [10.0])
    stream_on_simulated_clock(srv, clock, [[(prompt, 3)]], [10.0])
    cold, cached = srv.timings["cmpl-1"], srv.timings["cmpl-2"]
    assert cold.token_times[0] - cold.arrived == pytest.approx(alpha + beta + 2000 * per_token, rel=1e-9)
    assert cached.token_times[0] - cached.arrived == pytest.approx(alpha + beta, rel=1e-9)


def test_multi_token_chunks_on_the_simulated_clock(simulated):
    """Four tokens per chunk: the client sees a chunk every fourth step and counts tokens from usage."""
    alpha, beta, k, n = 0.008, 0.001, 4, 41
    srv, clock = simulated(alpha=alpha, beta=beta, tokens_per_chunk=k)
    chunks: list[float] = []

    async def run():
        async with OpenAIStreamClient(srv.base_url, "fake-model", api="completions") as client:
            task = asyncio.create_task(client.stream("one two", n, chunk_times=chunks))
            await _wait_in_flight(srv, 1)
            clock.advance(10.0)
            return await asyncio.wait_for(task, 30)
    result = asyncio.run(run())
    assert result.ok and result.timing.output_tokens == n  # usage, not the 11 chunks
    assert len(chunks) == -(-n // k)
    step = alpha + beta
    times = srv.timings["cmpl-1"].token_times
    assert times == pytest.approx([i * step for i in range(1, n + 1)], rel=1e-9)
    # chunks leave at tokens k, 2k, ... and n: the client's rate is (n-1) tokens over (n-k) steps
    seen = StreamTiming(output_tokens=n, start=0.0, first_token=times[k - 1], last_token=times[-1])
    assert seen.decode_rate == pytest.approx((n - 1) / ((n - k) * step), rel=1e-9)


def test_simulated_clock_moves_only_forward_when_told():
    clock = SimulatedClock(start=5.0)
    assert clock.now() == 5.0
    assert clock.advance(0.25) == 5.25 == clock.now()
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError):
            clock.advance(bad)


def rows(out: Path, row_type: str | None = None) -> list[dict]:
    with open(out / "sweep.csv", newline="") as fh:
        data = list(csv.DictReader(fh))
    return [r for r in data if row_type is None or r["row_type"] == row_type]


def bench(*argv) -> int:
    return vllm_spark(["bench", "--quiet", *argv])


TOKENS = 20  # per request: enough for a rate, few enough that the wall-clock sweep takes seconds


def test_rates_match_known_timings_and_all_outputs_written(fake, tmp_path, capsys):
    alpha, beta = 0.010, 0.001
    srv = fake(alpha=alpha, beta=beta)
    out = tmp_path / "run"
    rc = bench("--endpoint", srv.base_url, "--levels", "1,2,4,8,16", "--trials", "2", "--workload", "code",
               "--output-tokens", str(TOKENS), "--floor", "20,50", "--out", str(out))
    assert rc == 0
    stdout = capsys.readouterr().out

    header = next(csv.reader(open(out / "sweep.csv")))
    assert header == CSV_COLUMNS and set(REQUIRED_COLUMNS) <= set(header)
    points, trials = rows(out, "point"), rows(out, "trial")
    assert [int(p["concurrency"]) for p in points] == [1, 2, 4, 8, 16]
    assert len(trials) == 10 and {t["trial"] for t in trials} == {"1", "2"}
    # The client times tokens on the wall clock, where a busy machine only makes the fake's steps
    # later: rates are bounded above by the engine's (with slack for the client's own delays) and
    # below with room for a slow machine (a quarter: the box once ran this at 0.48 of the engine's
    # rate with stray servers loading it).  The exact rates, knee and capacity: the sweep on the
    # simulated clock (test_sweep_on_the_simulated_clock_gives_the_exact_curve_knee_and_capacity).
    for p in points:
        c = int(p["concurrency"])
        step = alpha + beta * c
        assert 0.25 / step <= float(p["per_stream_median_tps"]) <= 1.10 / step, p
        assert 0.25 * c / step <= float(p["aggregate_tps"]) <= 1.12 * c / step, p
        assert float(p["per_stream_min_tps"]) <= float(p["per_stream_median_tps"])
        assert 0 < float(p["ttft_p50_s"]) <= float(p["ttft_p90_s"]) <= float(p["ttft_p99_s"]) < 1.0
        assert int(p["requests"]) == int(p["completed"]) == 2 * c and int(p["errors"]) == 0
        assert int(p["short_streams"]) == 0
        assert int(p["output_tokens"]) == 2 * c * TOKENS
        assert p["engine_version"] == "0.0.0-fake" and p["max_model_len"] == "8192"
        assert "gpu_memory_utilization=0.5" in p["recipe"] and p["model"] == "fake-model"

    streams = list(csv.DictReader(open(out / "streams.csv")))  # every measured request, individually
    assert len(streams) == sum(int(t["requests"]) for t in trials) == 62
    for r in streams:
        step = alpha + beta * int(r["concurrency"])
        assert int(r["output_tokens"]) == TOKENS and r["short"] == "0" and r["bunched"] == "0" and not r["error"]
        assert 0.25 / step <= float(r["decode_tps"]) <= 1.15 / step
        assert float(r["decode_tps"]) == pytest.approx((TOKENS - 1) / float(r["decode_s"]), rel=1e-4)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["complete"] is True
    curve = summary["curves"][0]
    measured = [SweepPoint(concurrency=int(p["concurrency"]), aggregate_tokens_per_second=float(p["aggregate_tps"]),
                           per_stream_tokens_per_second=float(p["per_stream_median_tps"])) for p in points]
    expected_capacity = {"20": capacity_at_floor(measured, 20), "50": capacity_at_floor(measured, 50)}
    assert curve["capacity"] == expected_capacity and expected_capacity["20"] == 16  # 1/(a+16b) = 38.5 >= 20
    assert curve["knee"]["knee"] >= 1 and curve["knee"]["plateau_tokens_per_second"] > 0
    assert "highest concurrency with median per-stream rate >= 20 tok/s: 16" in stdout

    profile = json.loads((out / "capacity_profile.json").read_text())
    for key in ("knee", "plateau_tokens_per_second", "alpha_seconds", "beta_seconds", "capacity", "model",
                "endpoint", "date", "source"):
        assert key in profile, key
    assert profile["capacity"] == expected_capacity and profile["model"] == "fake-model"
    assert profile["knee"] == curve["knee"]["knee"] and profile["endpoint"] == srv.base_url

    # the colleague formats read what the benchmark writes: `vllm-spark knee` and the exporter
    from prometheus_client import CollectorRegistry

    from vllm_spark_plugin.knee.loaders import load_points
    from vllm_spark_plugin.metrics import instruments, knee_gauges
    (curve_points,) = load_points(out / "sweep.csv").values()
    assert [(p.concurrency, p.trials) for p in curve_points] == [(c, 2) for c in (1, 2, 4, 8, 16)]
    assert [p.per_stream_tokens_per_second for p in curve_points] == [float(p["per_stream_median_tps"])
                                                                       for p in points]
    registry = CollectorRegistry()
    assert knee_gauges.load_profile(instruments.Instruments(registry), "bench-test-model",
                                    str(out / "capacity_profile.json"))
    assert registry.get_sample_value("vllm_spark_profile_knee_batch_size",
                                     {"model_name": "bench-test-model"}) == pytest.approx(profile["knee"])
    assert registry.get_sample_value("vllm_spark_profile_capacity_streams",
                                     {"model_name": "bench-test-model", "floor": "50"}) == 8

    meta = json.loads((out / "meta.json").read_text())
    assert meta["servers"][0]["engine_version"] == "0.0.0-fake" and meta["status"] == "complete"
    assert meta["workloads"][0] == {"name": "code", "output_tokens": TOKENS, "temperature": 0.0, "input_tokens": None}

    for name in ("aggregate.png", "per_stream.png", "ttft.png"):
        img = Image.open(out / name).convert("RGB")
        assert img.size[0] > 400 and len(img.getcolors(1 << 20) or []) > 20, name
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert "highest concurrency with median per-stream rate &gt;= 20 tok/s: 16" in html
    assert "Partial results" not in html


def test_closed_loop_counts_tokens_from_usage_with_multi_token_chunks(fake, tmp_path):
    alpha, beta, k, n = 0.008, 0.001, 4, 41
    srv = fake(alpha=alpha, beta=beta, tokens_per_chunk=k)
    out = tmp_path / "run"
    rc = bench("--endpoint", srv.base_url, "--mode", "closed-loop", "--levels", "4", "--requests", "8",
               "--trials", "1", "--no-warmup", "--api", "completions", "--workload", "random",
               "--random-input-len", "32", "--output-tokens", str(n), "--out", str(out))
    assert rc == 0
    (p,) = rows(out, "point")
    assert p["mode"] == "closed-loop" and p["api"] == "completions"
    assert int(p["requests"]) == 8 and int(p["output_tokens"]) == 8 * n  # usage, not 11 chunks each
    assert int(p["prompt_tokens"]) == 8 * 32  # exact-length token-id prompts
    assert srv.max_batch_seen == 4  # never more than 4 in flight
    # first chunk after k tokens, last after n: (n-1) tokens over (n-k) steps (exact: the simulated
    # clock's test_multi_token_chunks_...); on the wall clock, bounded above with slack
    step = alpha + beta * 4
    assert 0.5 <= float(p["per_stream_median_tps"]) / ((n - 1) / ((n - k) * step)) <= 1.12


def test_short_streams_flagged_not_averaged(fake, tmp_path, capsys):
    srv = fake(alpha=0.005, beta=0.0005, eos_after=10)
    out = tmp_path / "run"
    assert bench("--endpoint", srv.base_url, "--levels", "2", "--trials", "1", "--no-warmup", "--workload",
                 "prose", "--output-tokens", "30", "--no-ignore-eos", "--out", str(out)) == 0
    (p,) = rows(out, "point")
    assert int(p["short_streams"]) == 2 and int(p["completed"]) == 2
    assert p["per_stream_median_tps"] == "" and p["ignore_eos"] == "0"
    out2 = tmp_path / "run2"  # the default sends ignore_eos: outputs are as long as requested
    assert bench("--endpoint", srv.base_url, "--levels", "2", "--trials", "1", "--no-warmup", "--workload",
                 "prose", "--output-tokens", "30", "--out", str(out2)) == 0
    (p2,) = rows(out2, "point")
    assert int(p2["short_streams"]) == 0 and int(p2["output_tokens"]) == 60


def test_server_dying_mid_sweep_leaves_valid_partial_results(fake, tmp_path, capsys):
    # requests per level with warm-up + 2 trials: c1 -> 3, c2 -> 6 (9 in all), c4 -> 12: request 16 kills it
    srv = fake(alpha=0.005, beta=0.0005, die_after_requests=15)
    out = tmp_path / "run"
    t0 = time.monotonic()
    rc = bench("--endpoint", srv.base_url, "--levels", "1,2,4,8", "--trials", "2", "--workload", "code",
               "--output-tokens", "30", "--out", str(out))
    assert time.monotonic() - t0 < 60
    err = capsys.readouterr().err
    assert rc == 3
    assert "stopped answering" in err and "connection refused" in err and "Partial results in" in err
    points = rows(out, "point")
    assert [int(p["concurrency"]) for p in points] == [1, 2]
    assert all(int(p["errors"]) == 0 and p["per_stream_median_tps"] for p in points)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["complete"] is False
    assert [p["concurrency"] for p in summary["curves"][0]["points"]] == [1, 2]
    assert "Partial results (failed)" in (out / "report.html").read_text()
    assert json.loads((out / "meta.json").read_text())["status"] == "failed"


def test_wrong_url_or_model_fails_within_seconds(fake, tmp_path, capsys):
    srv = fake()
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    cases = [
        (["--endpoint", f"http://127.0.0.1:{closed}"], ["cannot connect", "connection refused", str(closed)]),
        (["--endpoint", srv.base_url, "--model", "nope"],
         ["model 'nope' is not served here; served: fake-model"]),
        (["--endpoint", srv.base_url + "/not-openai"], ["returned 404", "not an OpenAI-compatible endpoint"]),
    ]
    for argv, expected in cases:
        t0 = time.monotonic()
        rc = bench(*argv, "--out", str(tmp_path / "x"))
        err = capsys.readouterr().err
        assert rc == 1, argv
        assert time.monotonic() - t0 < 5, argv
        for text in expected:
            assert text in err, (text, err)
        assert "Traceback" not in err


def test_silent_server_times_out_instead_of_hanging(fake, tmp_path, capsys):
    # a listener that accepts and never answers (preflight), and a server whose streams go silent
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        t0 = time.monotonic()
        rc = bench("--endpoint", f"http://127.0.0.1:{silent.getsockname()[1]}", "--connect-timeout", "1",
                   "--out", str(tmp_path / "x"))
        assert rc == 1 and time.monotonic() - t0 < 5
        assert "timed out" in capsys.readouterr().err
    finally:
        silent.close()
    srv = fake(alpha=0.005, beta=0.0005, stall_after_tokens=5)
    t0 = time.monotonic()
    rc = bench("--endpoint", srv.base_url, "--levels", "2", "--trials", "1", "--no-warmup",
               "--read-timeout", "1", "--output-tokens", "30", "--workload", "code", "--out", str(tmp_path / "y"))
    assert time.monotonic() - t0 < 10
    err = capsys.readouterr().err
    assert rc == 3 and "every request of" in err and "timed out: no data for 1s" in err


def test_fleet_reports_per_endpoint_curves_and_summed_capacity(fake, tmp_path, capsys):
    # a busy machine only makes streams slower: every rate that must reach the floor does so with a
    # wide margin (spark-a at 8: +85%, spark-b at 4: +39%), spark-b's at 8 is below it
    a = fake(alpha=0.010, beta=0.001)   # per-stream 90.9, 83.3, 71.4, 55.6 at 1, 2, 4, 8
    b = fake(alpha=0.008, beta=0.004)   # 83.3, 62.5, 41.7, 25.0
    out = tmp_path / "fleet"
    rc = bench("--endpoint", a.base_url, "--endpoint", b.base_url, "--label", "spark-a", "--label", "spark-b",
               "--levels", "1,2,4,8", "--trials", "1", "--no-warmup", "--workload", "code",
               "--output-tokens", "20", "--floor", "30", "--out", str(out))
    assert rc == 0
    stdout = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    fleet = summary["fleet"]["code"]
    assert fleet["endpoints"]["spark-a"]["capacity"] == {"30": 8}
    assert fleet["endpoints"]["spark-b"]["capacity"] == {"30": 4}
    assert fleet["total"] == {"30": 12}
    assert "fleet, code: 12 streams at >= 30 tok/s" in stdout
    assert {r["label"] for r in rows(out, "point")} == {"spark-a", "spark-b"}
    for label, endpoint in (("spark-a", a.base_url), ("spark-b", b.base_url)):
        prof = json.loads((out / f"capacity_profile-{label}.json").read_text())
        assert prof["endpoint"] == endpoint and prof["label"] == label
    assert "Fleet capacity" in (out / "report.html").read_text()


def test_prefill_scenarios_measure_dip_and_cache(fake, tmp_path):
    """A 2000-token uncached prompt costs 2000 * 0.5 ms = 1 s of prefill, stalling every decode stream.

    The client times this on the wall clock, where a busy machine only makes steps later: its timing
    bounds are one-sided with slack (the exact stall and the cache's saving are asserted on the
    simulated clock: test_prefill_stall_is_exact_on_the_simulated_clock, test_prefix_cache_...)."""
    step = 0.010 + 0.004  # four streams
    srv = fake(alpha=0.010, beta=0.001, prefill_per_token=0.0005)
    out = tmp_path / "scn"
    rc = bench("--endpoint", srv.base_url, "--scenario", "prefill-interference", "--scenario", "prefix-reuse",
               "--api", "completions", "--long-prompt-tokens", "2000", "--scenario-streams", "4",
               "--baseline-seconds", "1", "--tail-seconds", "0.5", "--probe-interval", "0.2",
               "--reuse-repeats", "2", "--out", str(out))
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())["scenarios"]
    pi = s["prefill-interference"]
    assert pi["long_prompt"]["prompt_tokens"] == 2000
    # never faster than the engine; a stall of this process (the fake runs on one of its threads) slows it
    assert 0 < pi["baseline_tokens_per_second"] <= 1.1 / step
    assert pi["dip"]["detected"] and pi["dip"]["duration_s"] >= 0.75  # the 1 s stall, seen
    assert pi["dip"]["depth_ratio"] < 0.1
    assert pi["probe_ttft_during_prefill_s"]["count"] >= 2
    assert pi["probe_ttft_during_prefill_s"]["max"] > 0.6
    assert pi["baseline_probe_ttft_s"] < pi["probe_ttft_during_prefill_s"]["max"] - 0.5
    # the slowest running stream over the whole prefill got next to nothing (the 1 s stall)
    win = pi["prefill_window"]
    assert win["streams"] >= 1 and win["seconds"] >= 0.75
    assert win["slowest_tokens_per_second"] < 0.5 * pi["baseline_tokens_per_second"]
    pr = s["prefix-reuse"]
    assert pr["cold_ttft_s"] >= 0.75  # waits for its 1 s prefill
    assert pr["cold_ttft_s"] - pr["cached_ttft_s"] >= 0.75 and pr["speedup"] > 1  # the cache saved the prefill
    assert all(p["cached_tokens_reported"] == 2000 for p in pr["pairs"])
    assert (out / "prefill_interference.png").exists()
    html = (out / "report.html").read_text()
    assert "<h3>prefill-interference</h3>" in html and "<h3>prefix-reuse</h3>" in html
    assert html.count("data:image/png;base64,") == 1  # the interference plot


def test_ctrl_c_leaves_valid_partial_results(tmp_path):
    fake_proc = subprocess.Popen([sys.executable, "-m", "vllm_spark_plugin.testbed.fake_server", "--port", "0",
                                  "--alpha", "0.01", "--beta", "0.001"], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        url = fake_proc.stdout.readline().strip().rsplit(" ", 1)[-1]
        out = tmp_path / "run"
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        proc = subprocess.Popen([sys.executable, "-m", "vllm_spark_plugin.cli", "bench", "--endpoint", url,
                                 "--levels", "1,2,4,8,16,32", "--trials", "2", "--workload", "code",
                                 "--output-tokens", "60", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env,
                                # Ctrl-C's default action, even where this suite runs from a shell that
                                # ignores SIGINT for its background jobs (children inherit SIG_IGN)
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # interrupt once the first level is measured, by the bench's own progress (not a wall-clock
        # poll, which a slow machine can let run to the end of the sweep)
        seen = []
        for line in proc.stderr:  # the progress lines
            seen.append(line)
            if "c=2 trial 1/2" in line:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
        stderr = "".join(seen) + stderr
        assert proc.returncode == 130, stderr
        assert "interrupted by the user" in stderr and "Partial results in" in stderr
        points = rows(out, "point")
        assert points and all(p["per_stream_median_tps"] for p in points)
        assert int(points[-1]["concurrency"]) < 32
        summary = json.loads((out / "summary.json").read_text())
        assert summary["status"] == "interrupted" and len(summary["curves"][0]["points"]) == len(points)
        assert "Partial results (interrupted)" in (out / "report.html").read_text()
    finally:
        fake_proc.terminate()
        fake_proc.wait(10)


def test_progress_plain_lines_when_not_a_tty(fake, tmp_path, capsys):
    srv = fake(alpha=0.004, beta=0.0005)
    assert vllm_spark(["bench", "--endpoint", srv.base_url, "--levels", "1,2", "--trials", "1", "--workload",
                       "code", "--output-tokens", "10", "--out", str(tmp_path / "p")]) == 0
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("[")]
    assert lines[0].startswith("[1/4 ") and lines[-1].startswith("[4/4 100%]")
    assert "\r" not in err and "per-stream" in lines[-1]


CAPACITY_AT_70 = 'vllm_spark_slo_capacity_streams{engine="0",floor="70",model_name="fake-model"} 1.0\n'


def test_overload_scenario_loads_a_multiple_of_the_live_capacity_and_judges_the_floor(fake, tmp_path):
    """The fake's steps take 5 + 5 ms per stream: one stream runs at 100 tok/s, three at 50.  It
    exports a live capacity of 1 at 70 tok/s; the scenario loads it at 3x that.  Where the server
    admits one at a time (max_batch=1, a guard's cap) the streams keep 100 tok/s and meet the
    floor (a busy machine can only slow them: a margin of 30%); where it admits all three, no stream
    can reach 70 tok/s (by construction, whatever the machine)."""
    results = {}
    for name, max_batch in (("capped", 1), ("uncapped", 4096)):
        srv = fake(alpha=0.005, beta=0.005, max_batch=max_batch, extra_metrics=CAPACITY_AT_70)
        out = tmp_path / name
        rc = bench("--endpoint", srv.base_url, "--scenario", "overload", "--slo-floor", "70", "--api", "completions",
                   "--output-tokens", "30", "--overload-requests", "9", "--out", str(out))
        assert rc == 0
        results[name] = r = json.loads((out / "summary.json").read_text())["scenarios"]["overload"]
        assert (r["capacity_streams"], r["capacity_source"], r["streams"]) == (1, "vllm_spark_slo_capacity_streams", 3)
        assert r["requests"] == r["completed"] == 9 and r["errors"] == 0
        assert r["rate_goodput_tokens_per_second"] == pytest.approx(
            r["output_tokens_per_second"] * r["rate_met_share"], rel=1e-6)
        assert "<h3>overload</h3>" in (out / "report.html").read_text()
    assert results["uncapped"]["rate_met_share"] == 0.0
    assert results["capped"]["rate_met_share"] >= 0.7
    assert results["capped"]["ttft_p50_s"] > results["uncapped"]["ttft_p50_s"]  # the wait moved into TTFT


def test_overload_scenario_errors_name_the_missing_floor_or_capacity(fake, tmp_path, capsys):
    srv = fake()
    assert bench("--endpoint", srv.base_url, "--scenario", "overload", "--out", str(tmp_path / "a")) == 2
    assert "--slo-floor" in capsys.readouterr().err
    rc = bench("--endpoint", srv.base_url, "--scenario", "overload", "--slo-floor", "70", "--api", "completions",
               "--out", str(tmp_path / "b"))
    assert rc == bench_cli.EXIT_SERVER_FAILED
    err = capsys.readouterr().err
    assert "no live capacity" in err and "--overload-streams" in err
    # given the load directly, no capacity is needed
    rc = bench("--endpoint", srv.base_url, "--scenario", "overload", "--slo-floor", "70", "--api", "completions",
               "--overload-streams", "2", "--overload-requests", "2", "--output-tokens", "8", "--out", str(tmp_path / "c"))
    assert rc == 0
    r = json.loads((tmp_path / "c" / "summary.json").read_text())["scenarios"]["overload"]
    assert (r["streams"], r["capacity_streams"], r["capacity_source"]) == (2, None, "--overload-streams")
