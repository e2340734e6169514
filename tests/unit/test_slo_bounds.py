"""Any floor and TTFT SLO on both sides: the exporter's histograms carry the configured values as bucket
bounds, the generated rules select exactly those buckets, and `metrics.bounds` names a rule whose
bucket the server does not have (what `vllm-spark doctor` reports)."""
from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vllm_spark_plugin.grafana import rules
from vllm_spark_plugin.grafana.slo import SLOConfig
from vllm_spark_plugin.metrics import names as N
from vllm_spark_plugin.metrics.bounds import exported_bounds, selected_bounds, unmatched_bounds
from vllm_spark_plugin.metrics.engine import EngineChildren
from vllm_spark_plugin.metrics.instruments import Instruments
from vllm_spark_plugin.settings import load


def _server_text(env: dict) -> str:
    """The /metrics text of an exporter's instruments built from these settings, one engine started."""
    s = load(env, announce=False)
    registry = CollectorRegistry()
    ins = Instruments(registry, floors=s.floors, ttft_slo_seconds=s.ttft_slo_seconds)
    EngineChildren(ins, "m", "0", s.floors)  # an engine's start makes its histogram children
    return generate_latest(registry).decode()


def _recording(**slo) -> str:
    return rules.render_files(SLOConfig(**slo))[rules.RECORDING_FILE]


def test_rules_generated_with_the_servers_off_bound_slo_select_buckets_it_exports():
    text = _server_text({"SPARK_PLUGIN_FLOORS": "20,250", "SPARK_PLUGIN_TTFT_SLO_SECONDS": "25"})
    recording = _recording(floor_tokens_per_second=250, ttft_slo_seconds=25)
    assert 'le="250.0"' in recording and 'le="25.0"' in recording
    assert selected_bounds(recording) == {N.TTFT: (25.0,), N.STREAM_RATE: (250.0,)}
    assert 250.0 in exported_bounds(text)[N.STREAM_RATE] and 25.0 in exported_bounds(text)[N.TTFT]
    assert unmatched_bounds(recording, text) == []


def test_the_committed_default_rules_match_a_default_server():
    assert unmatched_bounds(_recording(), _server_text({})) == []


def test_rules_for_values_the_server_does_not_run_with_are_named_with_its_nearest_bounds():
    text = _server_text({"SPARK_PLUGIN_FLOORS": "20,250"})
    assert unmatched_bounds(_recording(floor_tokens_per_second=255, ttft_slo_seconds=2.5), text) == [
        f"{N.STREAM_RATE} le=255 (the server's nearest: 250, 260)",
        f"{N.TTFT} le=2.5 (the server's nearest: 2, 3)"]


def test_selected_bounds_refuses_what_is_not_a_rules_file():
    with pytest.raises(ValueError, match="not a Prometheus rules file"):
        selected_bounds("just: text\n")


def test_one_table_builds_the_instruments_and_the_engine_children():
    """Every declaration becomes an instrument; every per-engine child it names is cached per engine."""
    ins = Instruments(CollectorRegistry())
    assert [getattr(ins, m.attr)._name for m in N.METRICS] == [m.name.removesuffix("_total") if m.kind == N.COUNTER
                                                                else m.name for m in N.METRICS]
    assert len({m.name for m in N.METRICS}) == len({m.attr for m in N.METRICS}) == len(N.METRICS)
    children = EngineChildren(ins, "m", "0", (20.0,))
    for m in N.METRICS:
        for attr, values in m.per_engine:
            child = getattr(children, attr)
            assert child is getattr(ins, m.attr).labels("m", "0", *values), (m.name, attr)
    assert {"step_batch", "step_prefill", "step_decode", "ttft", "stream_rate"} <= set(vars(children))
