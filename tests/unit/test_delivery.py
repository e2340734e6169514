"""The delivery clock's arithmetic (metrics/delivery.py): hand-offs in, the seed definitions out."""
from __future__ import annotations

import math

import pytest

from vllm_spark_plugin.definitions import stream_decode_rate
from vllm_spark_plugin.metrics.delivery import Delivery, not_streamed


def test_one_token_per_hand_off_is_the_seed_definition():
    d = Delivery(start=10.0)
    for i in range(9):
        d.see(11.0 + 0.1 * i, 1)
    r = d.result()
    assert r.ttft == pytest.approx(1.0)
    assert r.output_tokens == 9
    assert r.decode_rate == pytest.approx(8 / 0.8)
    assert r.streamed


def test_coalesced_hand_offs_count_their_tokens_and_the_first_chunk_is_not_rated():
    # a handler that fell behind: 4 tokens in the first hand-off, then 2 + 2 + 4
    d = Delivery(start=0.0)
    for t, n in ((0.5, 4), (0.7, 2), (0.9, 2), (1.3, 4)):
        d.see(t, n)
    r = d.result()
    assert r.output_tokens == 12
    assert r.decode_rate == pytest.approx((12 - 4) / 0.8)
    assert r.decode_rate == stream_decode_rate(12, 1.3 - 0.5, 4)


def test_cumulative_outputs_count_new_tokens_only():
    d = Delivery(start=0.0, cumulative=True)
    for t, total in ((0.2, 1), (0.3, 3), (0.4, 3), (0.5, 6)):
        d.see(t, total)
    r = d.result()
    assert r.output_tokens == 6
    assert r.decode_rate == pytest.approx(5 / 0.3)


def test_outputs_without_tokens_move_no_clock():
    d = Delivery(start=0.0)
    d.see(0.1, 0)  # e.g. a finish marker before any token
    d.see(0.2, 1)
    d.see(0.4, 1)
    d.see(5.0, 0)  # the finish marker, long after the last token
    r = d.result()
    assert r.ttft == pytest.approx(0.2)
    assert r.decode_rate == pytest.approx(1 / 0.2)


def test_a_request_with_no_token_has_no_ttft_and_one_token_no_rate():
    assert Delivery(start=0.0).result().ttft is None
    d = Delivery(start=0.0)
    d.see(0.3, 1)
    r = d.result()
    assert (r.ttft, r.decode_rate, r.output_tokens) == (pytest.approx(0.3), None, 1)
    d = Delivery(start=0.0)
    d.see(0.3, 5)  # every token in one hand-off: no rate
    assert d.result().decode_rate is None


@pytest.mark.parametrize("ttft, window, tokens, want", [
    (0.5, 1.0, 11, (0.5, 10.0, 11)),
    (None, 1.0, 11, (None, 10.0, 11)),
    (math.nan, -1.0, 11, (None, None, 11)),
    (0.5, "x", None, (0.5, None, 0)),
])
def test_not_streamed_uses_vllm_figures_and_drops_bad_values(ttft, window, tokens, want):
    r = not_streamed(ttft, window, tokens)
    assert (r.ttft, r.decode_rate, r.output_tokens) == want
    assert not r.streamed


# -- the exporter: which clock each series takes ------------------------------------------------------
def _exporter(delivery: bool):
    from prometheus_client import CollectorRegistry
    from vllm_spark_plugin import settings as settings_mod
    from vllm_spark_plugin.metrics.exporter import Exporter

    registry = CollectorRegistry()
    s = settings_mod.load({"SPARK_PLUGIN_TTFT_SLO_SECONDS": "1", "SPARK_PLUGIN_FLOORS": "20"})
    exp = Exporter("unit-delivery", s, registry=registry)
    if delivery:
        exp.time_deliveries()
    get = lambda name, **lab: registry.get_sample_value(  # noqa: E731
        name, {"model_name": "unit-delivery", "engine": "0", **lab}) or 0.0
    return exp.engine(0), get


def _finished_step():
    from vllm_spark_plugin.metrics.engine_stats import EngineStats, FinishedRequest
    fr = FinishedRequest(generation_tokens=65, decode_seconds=2.0, prompt_tokens=8, reason="length", e2e_seconds=2.5)
    return EngineStats(finished=[fr])  # engine clock: TTFT 0.5 s, 32 tok/s


def test_with_the_delivery_clock_rates_and_slo_come_from_hand_offs_only():
    from vllm_spark_plugin.metrics.delivery import Delivered
    st, get = _exporter(delivery=True)
    st.record_stats(_finished_step())
    assert get("vllm_spark_engine_stream_decode_tokens_per_second_count") == 1
    assert get("vllm_spark_stream_decode_tokens_per_second_count") == 0
    assert get("vllm_spark_slo_requests_total", floor="20", outcome="met") == 0
    # the same request as its client received it: first token after 1.5 s, 10 tok/s
    st.record_delivered(Delivered(ttft=1.5, decode_rate=10.0, output_tokens=65, streamed=True))
    assert get("vllm_spark_stream_decode_tokens_per_second_sum") == 10.0
    assert get("vllm_spark_slo_requests_total", floor="20", outcome="missed_both") == 1
    assert get("vllm_spark_slo_output_tokens_total", floor="20", outcome="missed_both") == 65
    # answered in one piece: judged, but no stream rate of its own
    st.record_delivered(Delivered(ttft=0.5, decode_rate=32.0, output_tokens=65, streamed=False))
    assert get("vllm_spark_stream_decode_tokens_per_second_count") == 1
    assert get("vllm_spark_slo_requests_total", floor="20", outcome="met") == 1


def test_without_the_delivery_clock_the_engine_clock_feeds_both():
    st, get = _exporter(delivery=False)
    st.record_stats(_finished_step())
    assert get("vllm_spark_engine_stream_decode_tokens_per_second_sum") == 32.0
    assert get("vllm_spark_stream_decode_tokens_per_second_sum") == 32.0
    assert get("vllm_spark_slo_requests_total", floor="20", outcome="met") == 1
