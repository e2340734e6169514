"""Speculative decoding on a real CPU `vllm serve` (n-gram proposals, up to 3 draft tokens per step)
with the plugin: real streaming clients, the real /metrics, a real Prometheus with the committed rules.

With speculation a step can give a stream several tokens.  What must hold: the batch histogram counts
streams (not tokens), token counters count tokens, per-stream rates and the live plateau count tokens
(not steps), and vLLM's own spec-decode counters are there for the acceptance rules and panels.
Prompts repeat a phrase, so prompt-lookup drafts get accepted.  Method and results: docs/speculative.md.
"""
from __future__ import annotations

import json
import math
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from support.load import run_streams_with_arrivals
from support.prom import PrometheusProcess
from support.scrape import buckets, delta_buckets, scrape, value, wait_idle
from vllm_spark_plugin.grafana import dashboards, iter_panel_queries

pytestmark = pytest.mark.server

P = "vllm_spark_"
ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = [ROOT / "alerts" / "recording.rules.yml", ROOT / "alerts" / "alerting.rules.yml"]
SPEC_TOKENS = 3  # num_speculative_tokens of the server (tests/conftest.py), checked in the fixture
MAX_TOKENS = 384  # long enough that a stream's first and last arrival delays are a small part of it
PHASES = ((1, 4), (2, 3), (4, 2), (8, 2))  # (concurrency, waves): batches 1 to 8 for the step-time fit
PROMPT = "the sea and the ship, the sea and the ship, the sea and the ship"
# vLLM 0.32's spec-decode counters as /metrics serves them
VLLM_DRAFTS = "vllm:spec_decode_num_drafts_total"
VLLM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
VLLM_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
VLLM_ACCEPTED_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
VLLM_TPOT = "vllm:request_time_per_output_token_seconds"  # per request: decode time / (tokens - 1)
SPEC_PANELS = ("Draft acceptance rate", "Mean accepted length", "Tokens per step per stream")
SPEC_RULES = ("instance:vllm_spark_spec_decode_acceptance:ratio_rate5m",
              "instance:vllm_spark_spec_decode_accepted_length:mean5m",
              "instance:vllm_spark_spec_decode_acceptance_by_position:ratio_rate5m",
              "instance:vllm_spark_step_tokens_per_stream:mean5m")


def _delta(after: dict, before: dict, name: str, **labels) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


@pytest.fixture(scope="module")
def spec_load(spec_decode_server):
    """Streaming waves at concurrency 1, 2, 4 and 8 while a real Prometheus scrapes the server every
    second with the committed rules; /metrics before and after each phase."""
    server = spec_decode_server
    args = server.extra_args
    spec = json.loads(args[args.index("--speculative-config") + 1])
    assert spec["method"] == "ngram" and spec["num_speculative_tokens"] == SPEC_TOKENS, spec
    with PrometheusProcess([server.metrics_url], rule_files=RULE_FILES) as prom:
        prom.wait_for('up{job="vllm"} == 1', timeout=60)
        first = wait_idle(server.metrics_url)
        time.sleep(2)  # a scrape of the idle counters before the load
        start = time.time()
        phases = []
        for c, waves in PHASES:
            before = wait_idle(server.metrics_url)
            streams, arrivals = [], []
            for w in range(waves):
                got = run_streams_with_arrivals(server.base_url, server.model, c, max_tokens=MAX_TOKENS,
                                                prompt_prefix=f"{PROMPT} (c{c} w{w})")
                streams += [t for t, _ in got]
                arrivals += [a for _, a in got]
            phases.append(dict(c=c, before=before, after=wait_idle(server.metrics_url),
                               streams=streams, arrivals=arrivals))
        end = time.time()
        time.sleep(4)  # the last scrapes and rule evaluations after the load
        yield dict(prom=prom, start=start, end=end, first=first, last=phases[-1]["after"], phases=phases,
                   hostport=urllib.parse.urlsplit(server.metrics_url).netloc)


def test_generation_tokens_equal_the_usage_the_clients_got(spec_load):
    for ph in spec_load["phases"]:
        usage = sum(s.output_tokens for s in ph["streams"])
        assert usage == MAX_TOKENS * len(ph["streams"]), ph["c"]  # ignore_eos: every stream ran to the end
        assert _delta(ph["after"], ph["before"], P + "generation_tokens_total") == usage, ph["c"]
        assert _delta(ph["after"], ph["before"], "vllm:generation_tokens_total") == usage, ph["c"]


def test_batch_histogram_counts_streams_not_tokens(spec_load):
    """Every step holds at most `c` streams (with drafts a step verifies up to 4c tokens), and the
    stream-steps account for the tokens: each stream-step gives one token plus the drafts it accepted,
    less what was cut off at max_tokens (at most the drafts of one step per request)."""
    for ph in spec_load["phases"]:
        c, after, before = ph["c"], ph["after"], ph["before"]
        d = delta_buckets(buckets(after, P + "step_batch_size"), buckets(before, P + "step_batch_size"))
        total = d[math.inf]
        assert total > 0 and d[float(c)] == total, f"steps with more than {c} streams: {d}"
        stream_steps = _delta(after, before, P + "step_batch_size_sum")
        accepted = _delta(after, before, VLLM_ACCEPTED)
        generated = _delta(after, before, P + "generation_tokens_total")
        requests = len(ph["streams"])
        assert stream_steps + accepted - SPEC_TOKENS * requests <= generated <= stream_steps + accepted, (
            f"concurrency {c}: {generated} tokens from {stream_steps} stream-steps and {accepted} accepted drafts")


def test_tokens_per_step_per_stream_above_one(spec_load):
    """Accepted drafts give a stream more than one token per step (1 without speculation)."""
    for ph in spec_load["phases"]:
        stream_steps = _delta(ph["after"], ph["before"], P + "step_batch_size_sum")
        generated = _delta(ph["after"], ph["before"], P + "generation_tokens_total")
        assert generated / stream_steps > 1.2, (ph["c"], generated, stream_steps)
        # scheduled decode tokens include the drafts: at least the tokens decoded, at most 1 + 3 per stream-step
        decode = _delta(ph["after"], ph["before"], P + "step_tokens_sum", phase="decode")
        assert generated - len(ph["streams"]) <= decode <= (1 + SPEC_TOKENS) * stream_steps, (ph["c"], decode)


def test_per_stream_rate_counts_tokens_like_vllm(spec_load):
    """Exact, on the server's own clock: vLLM observes each finished request's decode time / (tokens - 1)
    and the plugin (tokens - 1) / decode time, from the same stats.  The plugin's mean rate is then
    at least the harmonic mean vLLM's histogram gives (1 / mean time per token) and at most that times
    the Kantorovich bound (m + M)^2 / 4mM for rates within [m, M] (the plugin's lowest and highest
    non-empty bucket bounds).  A rate counting steps would sit near 1 / tokens per stream-step of it."""
    for ph in spec_load["phases"]:
        c, after, before = ph["c"], ph["after"], ph["before"]
        n = _delta(after, before, P + "stream_decode_tokens_per_second_count")
        assert n == _delta(after, before, VLLM_TPOT + "_count") == len(ph["streams"]), c
        mean_rate = _delta(after, before, P + "stream_decode_tokens_per_second_sum") / n
        harmonic = n / _delta(after, before, VLLM_TPOT + "_sum")
        d = delta_buckets(buckets(after, P + "stream_decode_tokens_per_second"),
                          buckets(before, P + "stream_decode_tokens_per_second"))
        bounds = sorted(d)
        hi = next(le for le in bounds if d[le] == n)
        lo = max([le for le in bounds if d[le] == 0], default=0.0)
        assert math.isfinite(hi) and lo > 0, (c, d)
        kantorovich = (lo + hi) ** 2 / (4 * lo * hi)
        assert harmonic * (1 - 1e-9) <= mean_rate <= harmonic * kantorovich * (1 + 1e-9), (
            f"concurrency {c}: plugin mean {mean_rate:.1f} tok/s, vLLM harmonic mean {harmonic:.1f} tok/s, "
            f"rates within [{lo:g}, {hi:g}]")


def _knee_gauges(url: str, timeout: float = 30.0) -> dict:
    """The live-knee gauges once a refit has seen every phase's steps (refit every 2 s here)."""
    deadline = time.monotonic() + timeout
    while True:
        s = scrape(url)
        steps = value(s, P + "step_duration_seconds_count")
        if value(s, P + "knee_fit_samples") >= min(steps, 4096) or time.monotonic() > deadline:
            return s
        time.sleep(1)


def test_live_knee_counts_tokens_per_step(spec_load, spec_decode_server):
    """The plateau is tokens per stream-step / beta: max_throughput x beta is the fit's tokens per
    stream-step, which must be the counters' (within 20%: the fit weighs steps, the counters
    stream-steps) and above 1; the capacity at the floor is floor(plateau / floor - K)."""
    s = _knee_gauges(spec_decode_server.metrics_url)
    verdicts = [dict(lab)["verdict"] for (n, lab), v in s.items() if n == P + "knee_verdict" and v == 1]
    assert verdicts in (["ok"], ["no knee in the measured range"]), verdicts
    plateau = value(s, P + "max_throughput_tokens_per_second")
    alpha, beta = value(s, P + "step_alpha_seconds"), value(s, P + "step_beta_seconds")
    knee = value(s, P + "knee_batch_size")
    capacity = value(s, P + "capacity_streams", floor="20")
    for name, v in (("plateau", plateau), ("alpha", alpha), ("beta", beta), ("knee", knee), ("capacity", capacity)):
        assert math.isfinite(v) and v > 0, (name, v)
    assert math.isfinite(value(s, P + "knee_ratio"))
    fit_tps = plateau * beta
    tps = (_delta(s, spec_load["first"], P + "generation_tokens_total")
           / _delta(s, spec_load["first"], P + "step_batch_size_sum"))
    print(f"\nlive fit: {verdicts[0]}, K {knee:.1f}, plateau {plateau:.0f} tok/s, alpha {alpha * 1e3:.2f} ms, "
          f"beta {beta * 1e3:.3f} ms, capacity at 20 tok/s {capacity:.0f}; tokens per stream-step: fit {fit_tps:.2f}, "
          f"counters {tps:.2f}")
    assert fit_tps > 1.2 and abs(fit_tps - tps) / tps <= 0.2, (fit_tps, tps)
    assert abs(knee - alpha / beta) <= 1e-6 * knee
    expected = math.floor(plateau / 20 - knee)
    assert expected - 1 <= capacity <= expected + 1, (capacity, plateau, knee)


def test_vllm_spec_decode_counters_present_and_consistent(spec_load):
    first, last = spec_load["first"], spec_load["last"]
    drafts = _delta(last, first, VLLM_DRAFTS)
    draft_tokens = _delta(last, first, VLLM_DRAFT_TOKENS)
    accepted = _delta(last, first, VLLM_ACCEPTED)
    per_pos = {dict(lab)["position"]: v - first.get((n, lab), 0.0)
               for (n, lab), v in last.items() if n == VLLM_ACCEPTED_PER_POS}
    assert drafts > 0 and draft_tokens > 0 and accepted > 0, (drafts, draft_tokens, accepted)
    assert drafts <= draft_tokens <= SPEC_TOKENS * drafts
    assert accepted <= draft_tokens
    assert sorted(per_pos) == [str(i) for i in range(SPEC_TOKENS)], per_pos
    assert sum(per_pos.values()) == accepted
    # a draft token is accepted only after every earlier one in its draft
    assert per_pos["0"] > 0 and per_pos["0"] >= per_pos["1"] >= per_pos["2"], per_pos


def test_spec_decode_rules_and_panels_through_prometheus(spec_load, spec_decode_server):
    """The committed recording rules and the serving dashboard's speculative-decoding panels, run by a
    real Prometheus on what it scraped: every one has data, and the rules equal the counters' ratios
    over the load (the 5 m window holds all of it, from an idle scrape on)."""
    prom, first, last = spec_load["prom"], spec_load["first"], spec_load["last"]
    at = spec_load["end"] + 3
    got = {}
    for name in SPEC_RULES:
        res = prom.query(name, at)
        assert res, f"{name}: no data"
        got[name] = {s["metric"].get("position"): float(s["value"][1]) for s in res}
    accepted = _delta(last, first, VLLM_ACCEPTED)
    assert got[SPEC_RULES[0]][None] == pytest.approx(accepted / _delta(last, first, VLLM_DRAFT_TOKENS), rel=0.02)
    assert got[SPEC_RULES[1]][None] == pytest.approx(1 + accepted / _delta(last, first, VLLM_DRAFTS), rel=0.02)
    assert sorted(got[SPEC_RULES[2]]) == [str(i) for i in range(SPEC_TOKENS)]
    tps = _delta(last, first, P + "generation_tokens_total") / _delta(last, first, P + "step_batch_size_sum")
    print(f"\nrules after the load: {got}")
    assert got[SPEC_RULES[3]][None] == pytest.approx(tps, rel=0.02) and tps > 1.2
    # the rules file holds what this test checks, so a renamed rule cannot leave it checking nothing
    records = {r["record"] for g in yaml.safe_load(RULE_FILES[0].read_text())["groups"] for r in g["rules"]}
    assert set(SPEC_RULES) <= records

    serving = dashboards.build_all()["vllm-spark-serving.json"]
    variables = {"model": spec_decode_server.model, "instance": spec_load["hostport"].replace(".", "\\\\.")}
    queries = [(t, e) for _, t, e in iter_panel_queries(serving, variables) if t.split(" [")[0] in SPEC_PANELS]
    assert len(queries) == 4, queries
    for title, expr in queries:
        res = prom.query_range(expr, spec_load["start"], spec_load["end"] + 3, step=2)
        values = [float(v[1]) for series in res for v in series["values"] if not math.isnan(float(v[1]))]
        assert values, f"{title}: no data: {expr}"
        assert all(v > 0 for v in values), (title, values)


def test_no_plugin_errors_on_a_speculative_server(spec_load):
    errors = {dict(lab).get("where"): v for (n, lab), v in spec_load["last"].items() if n == P + "plugin_errors_total"}
    assert all(v == 0 for v in errors.values()), errors
