"""The per-stream rate on the client's clock (issue: user-facing rate), on the real CPU server.

Same streams, two sides: the plugin's `vllm_spark_stream_decode_tokens_per_second` (timed where the
API server hands tokens to each request's handler, `hooks.delivery`) and an independent streaming
client (tests/support/load.py: aiohttp, its own chunk times, tokens per chunk from
`continuous_usage_stats`), both with `definitions.stream_decode_rate`, both counting the tokens
that came together with the first as one arrival.  Every stream counts on both
sides: none is left out as bunched.  The engine core's figure is checked to be there, for every
request, under its own name.  Figures over several rounds are benchmarks/clock_agreement.py's.
"""
from __future__ import annotations

import statistics

import pytest

from support.load import measured_waves
from support.scrape import buckets, delta_buckets, histogram_quantile, value

pytestmark = pytest.mark.server

P = "vllm_spark_"
WAVES = {3: 3, 8: 2, 12: 1}  # at least 9 streams behind each median
BOUND = 0.10
TOKENS = 512  # a few seconds per stream: a short stall of this 2-core test bed's client is diluted


@pytest.fixture(scope="module")
def runs(vllm_server):
    return {c: measured_waves(vllm_server, c, waves, TOKENS, "clock ") for c, waves in WAVES.items()}


def _delta(r, name):
    return value(r["after"], name) - value(r["before"], name)


@pytest.mark.parametrize("c", list(WAVES))
def test_every_stream_is_rated_on_both_clocks(runs, c):
    r = runs[c]
    n = len(r["streams"])
    assert all(s.output_tokens == TOKENS for s in r["streams"])
    assert _delta(r, P + "stream_decode_tokens_per_second_count") == n
    assert _delta(r, P + "engine_stream_decode_tokens_per_second_count") == n


@pytest.mark.parametrize("c", list(WAVES))
def test_exported_median_rate_is_the_clients(runs, c):
    """The exported median within 10% of the client's median over the same streams.  Failure text
    carries both sides and the engine clock's median, so a disagreement says which clock moved."""
    r = runs[c]
    med = {k: histogram_quantile(0.5, delta_buckets(buckets(r["after"], P + k), buckets(r["before"], P + k)))
           for k in ("stream_decode_tokens_per_second", "engine_stream_decode_tokens_per_second")}
    client = statistics.median(s.decode_rate for s in r["streams"])
    server = med["stream_decode_tokens_per_second"]
    assert abs(server - client) / client <= BOUND, (
        f"concurrency {c}: exported median {server:.1f} tok/s, client {client:.1f} tok/s, engine clock "
        f"{med['engine_stream_decode_tokens_per_second']:.1f} tok/s; client rates "
        f"{sorted(round(s.decode_rate) for s in r['streams'])}, first-chunk tokens "
        f"{sorted(s.first_arrival_tokens for s in r['streams'])}")
