"""Measure concurrency levels on the fake server's simulated clock (testbed/fake_server.py), for the
adaptive search's tests and benchmarks/levels_auto.py.

A level is one synchronized wave of real streaming requests from the bench client; the fake's engine
runs it on simulated time, and the point is computed with the seed definitions from the token times
the server recorded on that clock, so its rates are the step model's to float rounding and its
`seconds` is what the wave would take on a server with that step model (times the waves a point
costs: a warm-up and the trials).  `noisy` multiplies rates by seeded log-normal noise, the trial to
trial spread of a real machine, with the truth still known.
"""
from __future__ import annotations

import asyncio
import math
import random
import statistics
import time
from dataclasses import dataclass, field, replace

from vllm_spark_plugin.bench.adaptive import Observation
from vllm_spark_plugin.bench.client import OpenAIStreamClient
from vllm_spark_plugin.definitions import StreamTiming, aggregate_throughput
from vllm_spark_plugin.testbed.fake_server import FakeConfig, FakeServer, SimulatedClock


@dataclass
class SimulatedBed:
    """A fake server on simulated time and the measurement of one level on it."""

    alpha: float
    beta: float
    output_tokens: int = 32
    waves_per_point: int = 4  # a warm-up wave and 3 trials, as `vllm-spark bench` runs a point
    server: FakeServer = field(init=False)
    clock: SimulatedClock = field(init=False)
    waves: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self.clock = SimulatedClock()
        self.server = FakeServer(FakeConfig(alpha=self.alpha, beta=self.beta), clock=self.clock).start()

    def close(self) -> None:
        self.server.stop()

    def __enter__(self) -> "SimulatedBed":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def true_rate(self, c: int) -> float:
        return 1.0 / (self.alpha + self.beta * c)

    def true_capacity(self, floor: float) -> int:
        """Highest integer level whose true per-stream rate is at or above the floor (0: none)."""
        return max(0, math.floor((1.0 / floor - self.alpha) / self.beta + 1e-9))

    def measure(self, level: int) -> Observation:
        timings = asyncio.run(self._wave(level))
        rates = [t.decode_rate for t in timings if t.decode_rate is not None]
        start = min(t.start for t in timings)
        end = max(t.last_token for t in timings)
        self.waves += 1
        rate = statistics.median(rates)
        return Observation(concurrency=level, per_stream_tps=rate, aggregate_tps=aggregate_throughput(timings),
                           ttft_p50_s=statistics.median(t.ttft for t in timings),
                           seconds=self.waves_per_point * (end - start), trial_rates=(rate,))

    async def _wave(self, level: int) -> list[StreamTiming]:
        srv = self.server
        before = set(srv.timings)
        async with OpenAIStreamClient(srv.base_url, srv.cfg.model, api="completions",
                                      max_connections=level + 8) as client:
            tasks = [asyncio.create_task(client.stream(f"wave {self.waves} stream {i}", self.output_tokens))
                     for i in range(level)]
            deadline = time.monotonic() + 180  # a liveness bound on a loaded box, not a measurement
            # every request of the wave has reached the engine (a request is recorded as it is queued;
            # `in_flight` may still count the last wave's requests while the engine finishes its step) ...
            while len(srv.timings) - len(before) < level:
                assert time.monotonic() < deadline, f"{len(srv.timings) - len(before)} of {level} requests reached the fake"
                await asyncio.sleep(0.002)
            # ... so all join its first step; then simulated time runs past the wave's end at once
            self.clock.advance(2.0 * self.output_tokens * (self.alpha + self.beta * level) + 1.0)
            results = await asyncio.wait_for(asyncio.gather(*tasks), 300)
        assert all(r.ok for r in results), [r.timing.error for r in results if not r.ok][:1]
        out = []
        for rid in sorted(set(srv.timings) - before):
            t = srv.timings[rid]
            out.append(StreamTiming(output_tokens=len(t.token_times), start=t.arrived,
                                    first_token=t.token_times[0], last_token=t.token_times[-1],
                                    requested_tokens=self.output_tokens))
        assert len(out) == level
        return out


def noisy(measure, sigma: float, seed: int, trials: int = 3):
    """`measure` with each trial's rates multiplied by exp(N(0, sigma)) (seeded); the point is the
    median of `trials` such trials, as the bench takes it."""
    rng = random.Random(seed)
    cache: dict[int, Observation] = {}

    def wrapped(level: int) -> Observation:
        if level not in cache:
            cache[level] = measure(level)
        o = cache[level]
        rates = tuple(o.per_stream_tps * math.exp(rng.gauss(0.0, sigma)) for _ in range(trials))
        aggs = [o.aggregate_tps * math.exp(rng.gauss(0.0, sigma)) for _ in range(trials)]
        return replace(o, per_stream_tps=statistics.median(rates), aggregate_tps=statistics.median(aggs),
                       trial_rates=rates)
    return wrapped
