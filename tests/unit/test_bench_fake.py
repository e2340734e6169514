"""`vllm-spark bench` against the fake OpenAI SSE server (vllm_spark_plugin/testbed/fake_server.py).

The fake stands in for vLLM where a test needs what a real server cannot give: exactly known step
times (so the client-measured rates can be checked against the truth), dying or hanging on command,
and fast runs.  Its engine: a step with b running streams takes alpha + beta*b seconds and gives each
stream one token, so the per-stream rate is 1/(alpha + beta*b) and the knee alpha/beta.

Exact timing is asserted on the fake's simulated clock (the `*_simulated_clock` tests): the test moves
time, the engine's steps end exactly on schedule, and the seed definitions applied to the server's
token times give the known rates to float rounding.  The end-to-end runs of the command (the
client times tokens on the wall clock) check the same rates with a tolerance: they wait on real time,
so they live in the integration tier (tests/integration/test_bench_fake_wall.py).
"""
from __future__ import annotations

import asyncio
import json
import time

import pytest
from support.fake_bench import bench

from vllm_spark_plugin.bench import cli as bench_cli
from vllm_spark_plugin.bench.client import OpenAIStreamClient
from vllm_spark_plugin.bench.stats import summarize
from vllm_spark_plugin.definitions import StreamTiming, SweepPoint, aggregate_throughput, capacity_at_floor
from vllm_spark_plugin.knee.fit import fit_points
from vllm_spark_plugin.knee.online import OnlineKneeEstimator
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer, SimulatedClock


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


def test_a_late_waking_engine_still_starts_at_the_arrival():
    # On a busy machine the engine may wake only after the test advanced the clock past the request's
    # arrival: the first step then starts at the arrival at once, not at the next advance (which may
    # never come: the test is waiting for the step's tokens).
    clock = SimulatedClock(start=5.0)
    clock.advance(0.25)
    assert asyncio.run(asyncio.wait_for(clock.started(5.0), 1.0)) == 5.0

    async def not_yet():  # before any advance past the arrival the engine waits
        waiting = asyncio.ensure_future(clock.started(5.25))
        await asyncio.sleep(0.05)
        assert not waiting.done()
        clock.advance(0.1)
        return await asyncio.wait_for(waiting, 1.0)
    assert asyncio.run(not_yet()) == 5.25


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
