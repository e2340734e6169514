"""The OpenTelemetry bridge against a real OTLP/HTTP endpoint (decoded with opentelemetry-proto)."""
from __future__ import annotations

import time
import types

from prometheus_client import REGISTRY
from vllm.v1.engine import FinishReason
from vllm.v1.metrics.stats import FinishedRequestStats, IterationStats, SchedulerStats

from support.otlp_receiver import OtlpReceiver
from vllm_spark_plugin.metrics.otel_bridge import OtelBridge
from vllm_spark_plugin.hooks.stat_logger import SparkStatLogger


def test_bridge_exports_the_same_instruments():
    cfg = types.SimpleNamespace(cache_config=types.SimpleNamespace(num_gpu_blocks=64),
                                model_config=types.SimpleNamespace(served_model_name="otel-model"))
    logger = SparkStatLogger(cfg, engine_index=0)
    for _ in range(3):
        it = IterationStats()
        it.num_generation_tokens = 7
        it.time_to_first_tokens_iter = [0.15]
        it.finished_requests = [FinishedRequestStats(finish_reason=FinishReason.LENGTH,
                                                     num_generation_tokens=21, decode_time=1.0)]
        logger.record(SchedulerStats(num_running_reqs=3), it)

    rx = OtlpReceiver().start()
    try:
        bridge = OtelBridge(rx.endpoint, interval_seconds=3600)
        assert bridge.export_once()
        m = rx.latest_metrics()
    finally:
        rx.stop()

    gen = m["vllm_spark_generation_tokens_total"]
    assert gen.sum.is_monotonic
    pts = {tuple(sorted((a.key, a.value.string_value) for a in p.attributes)): p.as_double for p in gen.sum.data_points}
    prom = REGISTRY.get_sample_value("vllm_spark_generation_tokens_total", {"model_name": "otel-model", "engine": "0"})
    assert pts[(("engine", "0"), ("model_name", "otel-model"))] == prom >= 21

    rate = m["vllm_spark_engine_stream_decode_tokens_per_second"]  # the engine clock: no streams here
    dp = [p for p in rate.histogram.data_points
          if {a.key: a.value.string_value for a in p.attributes}.get("model_name") == "otel-model"][0]
    assert dp.count == 3 and sum(dp.bucket_counts) == dp.count
    assert len(dp.bucket_counts) == len(dp.explicit_bounds) + 1
    # every observation was (21 - 1) / 1.0 = 20 tok/s: all in the bucket whose upper bound is 20
    idx = list(dp.explicit_bounds).index(20.0)
    assert dp.bucket_counts[idx] == 3

    assert "vllm_spark_info" in m and m["vllm_spark_info"].gauge.data_points
    assert not any(name.startswith("python_") or name.startswith("process_") for name in m)


def test_bridge_failure_is_counted_not_raised():
    bridge = OtelBridge("http://127.0.0.1:9/v1/metrics", interval_seconds=0.05)
    before = REGISTRY.get_sample_value("vllm_spark_plugin_errors_total", {"where": "otel_export"}) or 0
    bridge.start()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = REGISTRY.get_sample_value("vllm_spark_plugin_errors_total", {"where": "otel_export"}) or 0
        if now > before:
            break
        time.sleep(0.1)
    bridge.stop()
    assert now > before


def test_bridge_converts_only_the_plugins_series_and_nothing_when_nothing_changed():
    """The exporter seam counts what the bridge hands it: an unchanged interval hands nothing, a
    change (or the keep-alive) hands the plugin's families only."""
    from opentelemetry.sdk.metrics.export import MetricExportResult
    from prometheus_client import CollectorRegistry, Counter

    from vllm_spark_plugin.metrics import instruments, otel_bridge

    class Seam:
        def __init__(self):
            self.batches = []

        def export(self, data):
            self.batches.append([m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics])
            return MetricExportResult.SUCCESS

    registry = CollectorRegistry()
    ins = instruments.Instruments(registry)
    Counter("vllm:foreign_total", "vLLM's own series in the same registry", registry=registry).inc()
    now = [0.0]
    seam = Seam()
    bridge = OtelBridge("unused", collectors=ins.collectors(), exporter=seam, clock=lambda: now[0])
    ins.generation_tokens.labels("m", "0").inc(3)
    assert bridge.export_once() and len(seam.batches) == 1
    assert "vllm_spark_generation_tokens_total" in seam.batches[0]
    assert all(n.startswith("vllm_spark_") for n in seam.batches[0])
    now[0] = 10.0
    assert bridge.export_once() and len(seam.batches) == 1 and bridge.skipped == 1  # nothing changed
    ins.generation_tokens.labels("m", "0").inc()
    assert bridge.export_once() and len(seam.batches) == 2                       # a change
    now[0] = 10.0 + otel_bridge.KEEPALIVE_SECONDS
    assert bridge.export_once() and len(seam.batches) == 3                       # the keep-alive
