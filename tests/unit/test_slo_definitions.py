"""The latency-SLO classification (definitions.py) shared by the exporter and the benchmark, the SLO
settings and their one rule (settings.py, definitions.check_ttft_slo / check_floors), and the
histogram bounds the configured SLO adds (definitions.with_slo_bounds, metrics.instruments)."""
from __future__ import annotations

import json
import logging
import math

import pytest

from vllm_spark_plugin import settings as settings_mod
from vllm_spark_plugin.grafana.slo import SLOConfig, SLOError
from prometheus_client import CollectorRegistry, generate_latest

from vllm_spark_plugin.definitions import (SLO_MET, SLO_MISSED_BOTH, SLO_MISSED_RATE, SLO_MISSED_TTFT, SLO_OUTCOMES,
                                           STREAM_RATE_BUCKETS, TTFT_BUCKETS, LatencySLO, StreamTiming,
                                           check_floors, highest_concurrency_meeting, slo_outcome, slo_tally,
                                           with_slo_bounds)
from vllm_spark_plugin.metrics.instruments import Instruments


@pytest.mark.parametrize("ttft, rate, expected", [
    (0.5, 30.0, SLO_MET),
    (2.0, 20.0, SLO_MET),            # both bounds are inclusive
    (2.01, 30.0, SLO_MISSED_TTFT),
    (0.5, 19.9, SLO_MISSED_RATE),
    (3.0, 5.0, SLO_MISSED_BOTH),
    (0.5, None, SLO_MET),            # no decode rate (< 2 tokens): TTFT alone
    (3.0, None, SLO_MISSED_TTFT),
    (None, None, SLO_MISSED_TTFT),   # no first token
    (None, 5.0, SLO_MISSED_BOTH),
    (math.nan, 30.0, SLO_MISSED_TTFT),
])
def test_outcome_of_one_request(ttft, rate, expected):
    assert slo_outcome(ttft, rate, 2.0, 20.0) == expected


def test_unbounded_sides_always_pass():
    assert slo_outcome(100.0, 1.0, None, None) == SLO_MET
    assert slo_outcome(100.0, 1.0, None, 20.0) == SLO_MISSED_RATE
    assert slo_outcome(100.0, 1.0, 2.0, None) == SLO_MISSED_TTFT
    assert set(SLO_OUTCOMES) == {"met", "missed_ttft", "missed_rate", "missed_both"}


def _stream(ttft, tokens, decode_s, error=None, start=10.0):
    first = None if ttft is None else start + ttft
    last = None if first is None else first + decode_s
    return StreamTiming(output_tokens=tokens, start=start, first_token=first, last_token=last, error=error)


def test_streams_use_the_seed_rate_and_short_streams_are_judged_on_ttft():
    slo = LatencySLO(ttft_seconds=1.0, floor_tokens_per_second=20.0)
    assert slo.outcome(_stream(0.5, 41, 1.0)) == SLO_MET           # 40 tok/s
    assert slo.outcome(_stream(0.5, 41, 4.0)) == SLO_MISSED_RATE   # 10 tok/s
    assert slo.outcome(_stream(0.5, 1, 0.0)) == SLO_MET            # one token: no rate
    assert slo.outcome(_stream(1.5, 1, 0.0)) == SLO_MISSED_TTFT
    assert slo.outcome(_stream(None, 0, 0.0, error="HTTP 500")) == SLO_MISSED_TTFT
    assert slo.outcome(_stream(0.1, 41, 1.0, error="reset")) == SLO_MISSED_TTFT  # a failed request never meets


def test_tally_attainment_goodput_and_e2e_bound():
    slo = LatencySLO(ttft_seconds=1.0, floor_tokens_per_second=20.0, e2e_seconds=2.0)
    streams = [_stream(0.5, 41, 1.0),     # met, e2e 1.5
               _stream(0.5, 41, 1.9),     # 21 tok/s, met on TTFT/rate, but e2e 2.4 > 2
               _stream(1.5, 41, 1.0),     # missed TTFT
               _stream(0.2, 11, 1.0),     # 10 tok/s: missed rate
               _stream(None, 0, 0, error="boom")]
    t = slo_tally(slo, streams)
    assert t.requests == {SLO_MET: 2, SLO_MISSED_TTFT: 2, SLO_MISSED_RATE: 1, SLO_MISSED_BOTH: 0}
    assert t.tokens == {SLO_MET: 82, SLO_MISSED_TTFT: 41, SLO_MISSED_RATE: 11, SLO_MISSED_BOTH: 0}
    assert (t.met, t.met_tokens, t.missed_e2e) == (1, 41, 1)
    assert t.attainment == pytest.approx(1 / 5)
    assert t.goodput(10.0) == pytest.approx(4.1)
    assert slo_tally(slo, []).attainment is None


def test_highest_concurrency_meeting_a_target():
    pts = [(1, 1.0), (2, 0.995), (4, 0.98), (8, None), (16, 0.2)]
    assert highest_concurrency_meeting(pts, 0.99) == 2
    assert highest_concurrency_meeting(pts, 0.5) == 4
    assert highest_concurrency_meeting(pts, 1.01) is None


# ------------------------------------------------------------------------------------ settings
def test_slo_settings_from_the_environment():
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": "0.5", "SPARK_PLUGIN_FLOORS": "30, 10,30"})
    assert (s.ttft_slo_seconds, s.floors, s.problems) == (0.5, (10.0, 30.0), ())
    d = settings_mod.load({})
    assert (d.ttft_slo_seconds, d.floors) == (2.0, (20.0,)) == (SLOConfig().ttft_slo_seconds, (SLOConfig().floor_tokens_per_second,))


def test_any_positive_floor_and_ttft_slo_is_an_slo_off_the_bucket_bounds_too():
    """A Spark owner's SLO comes from their users, not from our bucket list."""
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": "2.5", "SPARK_PLUGIN_FLOORS": "20,60,250,12.75"})
    assert (s.ttft_slo_seconds, s.floors, s.problems) == (2.5, (12.75, 20.0, 60.0, 250.0), ())
    assert 250 not in STREAM_RATE_BUCKETS and 2.5 not in TTFT_BUCKETS  # off the default bounds indeed


@pytest.mark.parametrize("name, raw", [
    ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "-1"), ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "0"),
    ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "fast"), ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "inf"),
    ("SPARK_PLUGIN_FLOORS", "-5"), ("SPARK_PLUGIN_FLOORS", "0"), ("SPARK_PLUGIN_FLOORS", "twenty"),
    ("SPARK_PLUGIN_FLOORS", " , "), ("SPARK_PLUGIN_FLOORS", "nan,-1"),
])
def test_a_setting_with_nothing_usable_logs_one_line_naming_it_and_keeps_the_default(caplog, name, raw):
    with caplog.at_level(logging.WARNING, logger="vllm_spark_plugin"):
        s = settings_mod.load({name: raw})
    assert (s.ttft_slo_seconds, s.floors) == (2.0, (20.0,))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert name in lines[0] and "using the default" in lines[0] and repr(raw) in lines[0]
    assert "expected" in lines[0]  # the fix: what a valid value looks like
    assert s.problems and name in s.problems[0]  # what doctor shows


@pytest.mark.parametrize("raw, kept, bad", [
    ("20,60,-250", (20.0, 60.0), ["'-250'"]),
    ("0,20", (20.0,), ["'0'"]),
    ("twenty, 250 ,inf", (250.0,), ["'twenty'", "'inf'"]),
])
def test_one_bad_floor_is_named_with_the_fix_and_the_others_are_kept(caplog, raw, kept, bad):
    """Never "all refused, default used": the server judges by the floors it was given that make sense."""
    with caplog.at_level(logging.WARNING, logger="vllm_spark_plugin"):
        s = settings_mod.load({"SPARK_PLUGIN_FLOORS": raw})
    assert s.floors == kept
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and lines == [f"vllm-spark-plugin: {p}" for p in s.problems], lines
    assert "SPARK_PLUGIN_FLOORS" in lines[0] and "positive number of tok/s" in lines[0]
    assert all(f"floor {b}" in lines[0] for b in bad), lines[0]
    assert lines[0].endswith("kept " + ",".join(f"{f:g}" for f in kept)) and "using the default" not in lines[0]


def test_floors_from_a_settings_file_list_keep_the_good_items(tmp_path):
    cfg = tmp_path / "s.json"
    cfg.write_text(json.dumps({"floors": [250, "x", 20]}))
    s = settings_mod.load({"SPARK_PLUGIN_CONFIG": str(cfg)}, announce=False)
    assert s.floors == (20.0, 250.0) and len(s.problems) == 1 and "floor 'x'" in s.problems[0]


@pytest.mark.parametrize("ttft, floor", [(-1.0, 20.0), (2.0, 0.0), (math.inf, 20.0), (2.0, math.nan)])
def test_the_runtime_and_the_rule_generator_apply_one_slo_rule(ttft, floor):
    """A threshold the generator refuses is a setting the exporter refuses, and the reverse."""
    with pytest.raises(SLOError):
        SLOConfig(ttft_slo_seconds=ttft, floor_tokens_per_second=floor).validate()
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": str(ttft), "SPARK_PLUGIN_FLOORS": str(floor)},
                          announce=False)
    assert len(s.problems) == 1
    ok = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": "2.5", "SPARK_PLUGIN_FLOORS": "17"}, announce=False)
    assert ok.problems == ()
    SLOConfig(ttft_slo_seconds=ok.ttft_slo_seconds, floor_tokens_per_second=ok.first_floor).validate()


def test_check_floors_strict_names_the_first_bad_item_and_lenient_keeps_the_rest():
    with pytest.raises(SLOError, match="floor '-5': expected a positive number of tok/s"):
        check_floors("20,-5,60")
    dropped: list = []
    assert check_floors("20,-5,60", dropped) == (20.0, 60.0) and dropped == [
        "floor '-5': expected a positive number of tok/s, e.g. 20"]
    with pytest.raises(SLOError, match="floor '-5'"):
        check_floors("-5", [])  # nothing left to keep


# ----------------------------------------------------------------------------- histogram bounds
def test_slo_bounds_are_the_defaults_plus_the_values_sorted_without_duplicates():
    assert with_slo_bounds((1, 2, 3), (2.0, 2.5, 0.5, 2.5)) == (0.5, 1.0, 2.0, 2.5, 3.0)
    assert with_slo_bounds(STREAM_RATE_BUCKETS, ()) == tuple(float(b) for b in STREAM_RATE_BUCKETS)


def _bounds(histogram) -> list[float]:
    return list(histogram._upper_bounds)  # prometheus-client's own list, +Inf last


def test_the_exporters_histograms_carry_the_configured_floors_and_ttft_slo_as_bounds():
    ins = Instruments(CollectorRegistry(), floors=(20.0, 250.0, 12.75), ttft_slo_seconds=2.5)
    rate_bounds = sorted({*map(float, STREAM_RATE_BUCKETS), 250.0, 12.75}) + [math.inf]
    assert _bounds(ins.stream_rate) == rate_bounds and _bounds(ins.engine_stream_rate) == rate_bounds
    assert _bounds(ins.ttft) == sorted({*TTFT_BUCKETS, 2.5}) + [math.inf]
    # the histograms that take no SLO keep the public bounds
    assert _bounds(ins.guard_deferred_seconds) == list(TTFT_BUCKETS) + [math.inf]
    default = Instruments(CollectorRegistry())
    assert _bounds(default.stream_rate) == [float(b) for b in STREAM_RATE_BUCKETS] + [math.inf]
    assert _bounds(default.ttft) == list(TTFT_BUCKETS) + [math.inf]


def test_a_request_at_an_off_bound_floor_lands_in_its_own_bucket():
    """The exposition carries le="250.0" (what the generated rules select), and the bucket counts
    exactly the requests at or below the floor."""
    registry = CollectorRegistry()
    ins = Instruments(registry, floors=(250.0,), ttft_slo_seconds=2.5)
    child = ins.stream_rate.labels("m", "0")
    for rate in (245.0, 250.0, 255.0):
        child.observe(rate)
    ins.ttft.labels("m", "0").observe(2.4)
    text = generate_latest(registry).decode()
    le = 'vllm_spark_stream_decode_tokens_per_second_bucket{engine="0",le="%s",model_name="m"}'
    assert f"{le % '250.0'} 2.0" in text and f"{le % '240.0'} 0.0" in text and f"{le % '260.0'} 3.0" in text
    assert 'vllm_spark_ttft_seconds_bucket{engine="0",le="2.5",model_name="m"} 1.0' in text


def test_a_misspelt_setting_is_named_with_the_key_it_resembles():
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO": "1", "SPARK_PLUGIN_RUN_DIR": "/tmp/x"}, announce=False)
    assert s.problems == ("unknown setting SPARK_PLUGIN_TTFT_SLO ignored (did you mean SPARK_PLUGIN_TTFT_SLO_SECONDS?)",)
