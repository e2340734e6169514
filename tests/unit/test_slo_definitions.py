"""The latency-SLO classification (definitions.py) shared by the exporter and the benchmark, and the
SLO settings and their one rule (settings.py, definitions.check_ttft_slo / check_floors)."""
from __future__ import annotations

import logging
import math

import pytest

from vllm_spark_plugin import settings as settings_mod
from vllm_spark_plugin.grafana.slo import SLOConfig, SLOError
from vllm_spark_plugin.definitions import (SLO_MET, SLO_MISSED_BOTH, SLO_MISSED_RATE, SLO_MISSED_TTFT, SLO_OUTCOMES,
                                           LatencySLO, StreamTiming, highest_concurrency_meeting, slo_outcome,
                                           slo_tally)


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


@pytest.mark.parametrize("name, raw", [
    ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "-1"), ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "0"),
    ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "fast"), ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "inf"),
    ("SPARK_PLUGIN_TTFT_SLO_SECONDS", "2.5"),
    ("SPARK_PLUGIN_FLOORS", "-5"), ("SPARK_PLUGIN_FLOORS", "0,20"), ("SPARK_PLUGIN_FLOORS", "twenty"),
    ("SPARK_PLUGIN_FLOORS", " , "), ("SPARK_PLUGIN_FLOORS", "17"), ("SPARK_PLUGIN_FLOORS", "20,100000"),
])
def test_bad_slo_setting_logs_one_line_naming_it_and_keeps_the_default(caplog, name, raw):
    with caplog.at_level(logging.WARNING, logger="vllm_spark_plugin"):
        s = settings_mod.load({name: raw})
    assert (s.ttft_slo_seconds, s.floors) == (2.0, (20.0,))
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1, lines
    assert name in lines[0] and "using the default" in lines[0] and repr(raw) in lines[0]
    assert s.problems and name in s.problems[0]  # what doctor shows


@pytest.mark.parametrize("ttft, floor", [(2.5, 20.0), (2.0, 17.0), (0.5, 100000.0)])
def test_the_runtime_and_the_rule_generator_apply_one_slo_rule(ttft, floor):
    """A threshold the generator refuses is a setting the exporter refuses, and the reverse."""
    with pytest.raises(SLOError):
        SLOConfig(ttft_slo_seconds=ttft, floor_tokens_per_second=floor).validate()
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": str(ttft), "SPARK_PLUGIN_FLOORS": str(floor)},
                          announce=False)
    assert len(s.problems) == 1
    ok = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": "3", "SPARK_PLUGIN_FLOORS": "15"}, announce=False)
    assert ok.problems == ()
    SLOConfig(ttft_slo_seconds=ok.ttft_slo_seconds, floor_tokens_per_second=ok.first_floor).validate()


def test_a_misspelt_setting_is_named_with_the_key_it_resembles():
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO": "1", "SPARK_PLUGIN_RUN_DIR": "/tmp/x"}, announce=False)
    assert s.problems == ("unknown setting SPARK_PLUGIN_TTFT_SLO ignored (did you mean SPARK_PLUGIN_TTFT_SLO_SECONDS?)",)
