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
def test_exported_median_rate_is_reported_beside_the_clients(runs, c):
    """The exported median and the client's over the same streams, side by side (printed; the agreement
    is benchmarks/clock_agreement.py's figure, measured on a quiet box, since a test client starved on
    two shared cores reads its streams' backlog in bursts and times its own lateness).  Gated here: a
    finite positive median on each clock, and no stream the client rated that the server did not."""
    r = runs[c]
    med = {k: histogram_quantile(0.5, delta_buckets(buckets(r["after"], P + k), buckets(r["before"], P + k)))
           for k in ("stream_decode_tokens_per_second", "engine_stream_decode_tokens_per_second")}
    rated = [s.decode_rate for s in r["streams"] if s.decode_rate is not None]
    client = statistics.median(rated)
    print(f"\nconcurrency {c}: exported median {med['stream_decode_tokens_per_second']:.1f} tok/s, client "
          f"{client:.1f} tok/s, engine clock {med['engine_stream_decode_tokens_per_second']:.1f} tok/s; "
          f"client first-chunk tokens {sorted(s.first_arrival_tokens for s in r['streams'])}")
    assert all(v is not None and 0 < v < float("inf") for v in med.values()), med
    assert _delta(r, P + "stream_decode_tokens_per_second_count") >= len(rated)
