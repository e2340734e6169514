"""Latency SLO end to end: a real CPU `vllm serve` with the plugin judges every finished request, and
an independent streaming client judges the same requests by the same definition.

The session server (tests/conftest.py) runs with SPARK_PLUGIN_TTFT_SLO_SECONDS=25 and
SPARK_PLUGIN_FLOORS=20,250,2000.  The light phase (2 streams, about 200 tok/s each, TTFT tens of ms) is
judged at the 20 tok/s floor: it meets it with a wide margin.  The loaded phase (16 streams) is judged
at a floor no stream reaches (2,000 tok/s; the tiny model streams at about 70 tok/s there): every
request misses it, whatever the speed of the box.
Both SLO values sit far from what each phase observes (a 1 s TTFT SLO did not: under 16 streams on
two cores the client saw half the first tokens after 1 s where the server's clock had them before),
so the two sides must agree on every request.

Near the boundary (`slo_boundary_server`: at most 4 running requests, TTFT SLO 0.5 s): 16 streams
queue in batches of 4, so TTFTs spread over about a second and the SLO splits them: some requests
meet it, some miss it.  Both sides judge TTFT on their own clock (the client from sending the
request to reading its first token; the server on the delivery clock, from the HTTP request reaching
its application to handing its first token to the request's handler): the server's interval lies
inside the client's, so it judges at least as many requests met (gated); how many they agree on is
printed (all 32 in the quiet runs here).

Off the bucket bounds: the TTFT SLO (25 s) and the 250 tok/s floor are no default bounds; the server
makes them bounds, so the rules generated with them (`vllm-spark dashboards --ttft-slo 25 --floor 250`)
select buckets that exist, a real Prometheus evaluating them against the server records data, and
the bucket at the floor counts exactly the requests the SLO counters judged below it.
"""
from __future__ import annotations

import collections
import statistics
import time
import urllib.request

import pytest

from support.load import measured_waves
from support.prom import PrometheusProcess
from support.scrape import scrape, value
from conftest import SLO_BOUNDARY_TTFT_SECONDS
from vllm_spark_plugin.definitions import SLO_MET, SLO_OUTCOMES, STREAM_RATE_BUCKETS, TTFT_BUCKETS, slo_outcome
from vllm_spark_plugin.grafana import rules
from vllm_spark_plugin.grafana.slo import SLOConfig
from vllm_spark_plugin.metrics.bounds import exported_bounds, unmatched_bounds

pytestmark = pytest.mark.server

P = "vllm_spark_"
TTFT_SLO = 25.0                  # must match the vllm_server fixture's environment
OFF_BOUND_FLOOR = 250.0          # one of its floors, between the default bounds 240 and 260
MAX_TOKENS = 64
PHASES = ((2, 6, 20.0), (16, 2, 2000.0))  # (concurrency, waves, the floor the phase is judged at)


def _server_counts(after: dict, before: dict, name: str, floor: float) -> dict[str, float]:
    floor = f"{floor:g}"
    return {o: value(after, P + name, floor=floor, outcome=o) - value(before, P + name, floor=floor, outcome=o)
            for o in SLO_OUTCOMES}


@pytest.fixture(scope="module")
def slo_run(vllm_server):
    """Both phases, one after the other; per phase: the client's streams and the counter deltas."""
    return [dict(concurrency=c, floor=floor, **measured_waves(vllm_server, c, waves, MAX_TOKENS, "slo-"))
            for c, waves, floor in PHASES]


def _client(streams, floor: float, ttft_slo: float = TTFT_SLO) -> tuple[collections.Counter, int]:
    """The client's classification (same definition) and the met requests' completion tokens."""
    judged = [slo_outcome(s.ttft, s.decode_rate, ttft_slo, floor) for s in streams]
    return collections.Counter(judged), sum(s.output_tokens for s, o in zip(streams, judged) if o == SLO_MET)


def _bursts(streams) -> list:
    """Streams the client read in a burst: all in one piece (no rate: the definition judges them on
    TTFT alone) or in reads close together (a rate ten times the phase's median).  Their client-side
    rate is the client's own lateness, not the server's delivery, so the two sides may judge them
    differently."""
    rates = [s.decode_rate for s in streams if s.decode_rate is not None]
    median = statistics.median(rates) if rates else 0.0
    return [s for s in streams if s.decode_rate is None or s.decode_rate > 10 * median]


def test_server_outcomes_agree_with_the_client_on_at_least_95_percent(slo_run):
    total = agree = bursts = 0
    report, unjudged = [], []
    for run in slo_run:
        server = _server_counts(run["after"], run["before"], "slo_requests_total", run["floor"])
        client, _ = _client(run["streams"], run["floor"])
        n = len(run["streams"])
        burst = len(_bursts(run["streams"]))
        report.append(f"c={run['concurrency']}: {n} requests ({burst} read in a burst), server {server}, "
                      f"client {dict(client)}")
        if sum(server.values()) != n:
            unjudged.append(run["concurrency"])
        # counts per outcome: the requests on which the two sides can agree at most
        agree += sum(min(server[o], client[o]) for o in SLO_OUTCOMES)
        total += n
        bursts += burst
    print("\n" + "\n".join(report))
    # the client times on a core of its own (support/cores.py), so other load cannot make it read late
    assert all(run["own_core"] for run in slo_run), "the client could not get a core of its own"
    assert not unjudged, "the server did not judge every finished request: " + "; ".join(report)
    assert agree >= 0.95 * (total - bursts), "; ".join(report)


def test_the_phases_meet_and_miss_as_set_up(slo_run):
    """Both classes occur: most of the light phase meets the SLO (a box shared with other servers
    can slow a few of its streams below the floor), next to nothing of the overloaded phase does."""
    low, high = slo_run
    server_low = _server_counts(low["after"], low["before"], "slo_requests_total", low["floor"])
    server_high = _server_counts(high["after"], high["before"], "slo_requests_total", high["floor"])
    assert server_low[SLO_MET] >= 0.5 * len(low["streams"]), server_low
    assert server_high[SLO_MET] == 0, server_high


def test_goodput_tokens_are_the_met_requests_completion_tokens(slo_run):
    for run in slo_run:
        requests = _server_counts(run["after"], run["before"], "slo_requests_total", run["floor"])
        tokens = _server_counts(run["after"], run["before"], "slo_output_tokens_total", run["floor"])
        _, client_met_tokens = _client(run["streams"], run["floor"])
        assert run["own_core"], "the client could not get a core of its own"
        # every request ran to MAX_TOKENS (ignore_eos): the server's met tokens are exactly its met
        # requests' completion tokens, and all outcomes together are every completion token
        assert all(s.output_tokens == MAX_TOKENS for s in run["streams"])
        assert tokens[SLO_MET] == MAX_TOKENS * requests[SLO_MET]
        assert sum(tokens.values()) == sum(s.output_tokens for s in run["streams"])
        # the tokens of streams the client read in a burst (`_bursts`) may be judged differently
        burst = sum(s.output_tokens for s in _bursts(run["streams"]))
        assert abs(tokens[SLO_MET] - client_met_tokens) <= burst + 0.05 * MAX_TOKENS * len(run["streams"])


def test_ttft_slo_and_capacity_series_are_exported(slo_run, vllm_server):
    s = scrape(vllm_server.metrics_url)
    assert value(s, P + "ttft_slo_seconds") == TTFT_SLO
    # the knee refit (every 10 s) publishes the TTFT capacity verdict and the spare capacity
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        s = scrape(vllm_server.metrics_url)
        if any(n == P + "capacity_ttft_verdict" and v == 1 for (n, _), v in s.items()):
            break
        time.sleep(1)
    verdicts = [dict(lab)["verdict"] for (n, lab), v in s.items() if n == P + "capacity_ttft_verdict" and v == 1]
    assert len(verdicts) == 1, verdicts
    if any(n == P + "slo_capacity_streams" for n, _ in s):
        spare = value(s, P + "spare_capacity_streams", floor="20")
        cap = value(s, P + "slo_capacity_streams", floor="20")
        assert spare == cap - value(s, P + "running_requests")


@pytest.fixture(scope="module")
def off_bound_rules(vllm_server, tmp_path_factory):
    """The rules generated with the server's TTFT SLO and its 250 tok/s floor, loaded into a real
    Prometheus scraping the server every second while 4 streams run 4 waves; the server's /metrics
    text at the end and the scrapes around the load."""
    assert OFF_BOUND_FLOOR not in STREAM_RATE_BUCKETS and TTFT_SLO not in TTFT_BUCKETS
    folder = tmp_path_factory.mktemp("off-bound-rules")
    slo = SLOConfig(ttft_slo_seconds=TTFT_SLO, floor_tokens_per_second=OFF_BOUND_FLOOR).validate()
    for name, text in rules.render_files(slo).items():
        (folder / name).write_text(text)
    with PrometheusProcess([vllm_server.metrics_url], rule_files=sorted(folder.iterdir())) as prom:
        prom.wait_for('up{job="vllm"} == 1', timeout=60)
        run = measured_waves(vllm_server, 4, 4, MAX_TOKENS, "off-bound-")
        time.sleep(4)  # the last scrapes and rule evaluations after the load
        with urllib.request.urlopen(vllm_server.metrics_url, timeout=10) as r:
            text = r.read().decode()
        records = {name: prom.query(name) for name in ("instance:vllm_spark_stream_rate_slo_errors:ratio_rate5m",
                                                       "instance:vllm_spark_ttft_slo_errors:ratio_rate5m")}
    return dict(run, text=text, records=records, recording=(folder / rules.RECORDING_FILE).read_text())


def test_the_server_exports_buckets_at_its_off_bound_floor_and_ttft_slo(off_bound_rules):
    bounds = exported_bounds(off_bound_rules["text"])
    assert OFF_BOUND_FLOOR in bounds[P + "stream_decode_tokens_per_second"]
    assert OFF_BOUND_FLOOR in bounds[P + "engine_stream_decode_tokens_per_second"]
    assert TTFT_SLO in bounds[P + "ttft_seconds"]
    assert unmatched_bounds(off_bound_rules["recording"], off_bound_rules["text"]) == []


def test_the_histogram_rules_at_the_off_bound_floor_and_ttft_slo_have_data(off_bound_rules):
    """What a real Prometheus recorded from the generated rules: one finite error ratio per server."""
    for name, result in off_bound_rules["records"].items():
        values = [float(s["value"][1]) for s in result]
        assert len(values) == 1 and 0.0 <= values[0] <= 1.0, (name, result)


def test_the_bucket_at_the_floor_counts_the_requests_the_slo_counters_judged_below_it(off_bound_rules):
    """Both sides of one request on the delivery clock: its rate in the histogram, its outcome at the
    floor in the counters; the bucket le=250 (rate <= 250) and the misses of the rate (rate < 250)
    differ only for a rate of exactly 250 tok/s."""
    r = off_bound_rules
    bucket = P + "stream_decode_tokens_per_second_bucket"
    at_floor = value(r["after"], bucket, le="250.0") - value(r["before"], bucket, le="250.0")
    below = _server_counts(r["after"], r["before"], "slo_requests_total", OFF_BOUND_FLOOR)
    observed = (value(r["after"], P + "stream_decode_tokens_per_second_count")
                - value(r["before"], P + "stream_decode_tokens_per_second_count"))
    print(f"\n{len(r['streams'])} streams: {observed:.0f} rates observed, {at_floor:.0f} at or below "
          f"{OFF_BOUND_FLOOR:g} tok/s; counters at that floor {below}")
    # a request delivered in one piece has no rate: judged on TTFT alone, in neither figure below
    assert 0 < observed <= len(r["streams"]) == sum(below.values())
    assert at_floor == below["missed_rate"] + below["missed_both"]


@pytest.fixture(scope="module")
def boundary_run(slo_boundary_server):
    # gated by construction, not on the client's clock: the server keeps both cores
    return measured_waves(slo_boundary_server, 16, 2, MAX_TOKENS, "slo-boundary-", own_core=False)


def test_near_the_ttft_slo_the_server_judges_by_its_clock_and_some_miss(boundary_run):
    """Gated by construction, not by timing: the server's TTFT of a request starts no earlier (the HTTP
    request reaching its application) and ends no later (the first token handed to the handler) than
    the client's (sending, reading), on the one system-wide monotonic clock, so the server can judge
    only more requests within the TTFT SLO than the client, never fewer (every rate here is far above
    the 20 tok/s floor).  How many both sides agree on is printed: 32 of 32 in the quiet runs here; a
    client starved on two shared cores reads late and judges more misses."""
    r = boundary_run
    n = len(r["streams"])
    server = _server_counts(r["after"], r["before"], "slo_requests_total", 20.0)
    tokens = _server_counts(r["after"], r["before"], "slo_output_tokens_total", 20.0)
    client, _ = _client(r["streams"], 20.0, SLO_BOUNDARY_TTFT_SECONDS)
    agree = sum(min(server[o], client[o]) for o in SLO_OUTCOMES)
    report = (f"{n} requests, server {server}, client {dict(client)}, agreeing on {agree:.0f}; client TTFTs (s) "
              f"{sorted(round(s.ttft, 2) for s in r['streams'])}")
    print("\n" + report)
    assert sum(server.values()) == n, report
    assert server[SLO_MET] > 0 and server["missed_ttft"] + server["missed_both"] > 0, report
    assert server[SLO_MET] >= client[SLO_MET], report
    assert tokens[SLO_MET] == MAX_TOKENS * server[SLO_MET]
    assert sum(tokens.values()) == MAX_TOKENS * n
