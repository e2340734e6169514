"""Optional OpenTelemetry bridge: the plugin's Prometheus instruments, exported over OTLP/HTTP.

Off by default (SPARK_PLUGIN_OTEL_ENDPOINT empty).  It never touches the per-step path: a daemon
thread reads prometheus-client's registry every interval, converts the `vllm_spark_*` families to
OTLP metrics (counters -> cumulative monotonic sums, gauges -> gauges, histograms -> cumulative
explicit-bucket histograms) and exports them.  The series are the same ones /metrics serves.
"""
from __future__ import annotations

import logging
import threading
import time

from prometheus_client import REGISTRY

from vllm_spark_plugin import __version__
from vllm_spark_plugin.metrics import errors
from vllm_spark_plugin.metrics.names import PREFIX

log = logging.getLogger("vllm_spark_plugin")


def _attrs(labels: dict) -> dict:
    return {k: v for k, v in labels.items() if k != "le"}


def collect_metrics_data(registry=REGISTRY, start_ns: int | None = None):
    """Prometheus registry -> opentelemetry.sdk.metrics.export.MetricsData (vllm_spark_* only)."""
    from opentelemetry.sdk.metrics.export import (AggregationTemporality, Gauge, Histogram,
                                                  HistogramDataPoint, Metric, MetricsData,
                                                  NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    now = time.time_ns()
    start = start_ns or now
    metrics = []
    for fam in registry.collect():
        if not fam.name.startswith(PREFIX):
            continue
        if fam.type == "counter":
            pts = [NumberDataPoint(attributes=_attrs(s.labels), start_time_unix_nano=start, time_unix_nano=now, value=s.value)
                   for s in fam.samples if s.name.endswith("_total")]
            data = Sum(data_points=pts, aggregation_temporality=AggregationTemporality.CUMULATIVE, is_monotonic=True)
            name = fam.name + "_total" if not fam.name.endswith("_total") else fam.name
        elif fam.type == "gauge":
            pts = [NumberDataPoint(attributes=_attrs(s.labels), start_time_unix_nano=start, time_unix_nano=now, value=s.value)
                   for s in fam.samples]
            data = Gauge(data_points=pts)
            name = fam.name
        elif fam.type == "histogram":
            series: dict = {}
            for s in fam.samples:
                key = tuple(sorted(_attrs(s.labels).items()))
                entry = series.setdefault(key, {"buckets": [], "count": 0, "sum": 0.0})
                if s.name.endswith("_bucket"):
                    entry["buckets"].append((float(s.labels["le"]), s.value))
                elif s.name.endswith("_count"):
                    entry["count"] = int(s.value)
                elif s.name.endswith("_sum"):
                    entry["sum"] = s.value
            pts = []
            for key, e in series.items():
                cum = sorted(e["buckets"])
                bounds = [b for b, _ in cum if b != float("inf")]
                counts, prev = [], 0.0
                for _, c in cum:  # cumulative -> per-bucket, the +Inf bucket last
                    counts.append(int(c - prev))
                    prev = c
                pts.append(HistogramDataPoint(attributes=dict(key), start_time_unix_nano=start, time_unix_nano=now,
                                              count=e["count"], sum=e["sum"], bucket_counts=counts,
                                              explicit_bounds=bounds, min=None, max=None))
            data = Histogram(data_points=pts, aggregation_temporality=AggregationTemporality.CUMULATIVE)
            name = fam.name
        else:
            continue
        if data.data_points:
            metrics.append(Metric(name=name, description=fam.documentation, unit=fam.unit or "", data=data))
    scope = InstrumentationScope("vllm_spark_plugin", __version__)
    resource = Resource.create({"service.name": "vllm", "vllm_spark_plugin.version": __version__})
    return MetricsData(resource_metrics=[ResourceMetrics(resource=resource, scope_metrics=[
        ScopeMetrics(scope=scope, metrics=metrics, schema_url="")], schema_url="")])


class OtelBridge:
    def __init__(self, endpoint: str, interval_seconds: float = 10.0, registry=REGISTRY, exporter=None) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            if not endpoint.rstrip("/").endswith("/v1/metrics"):
                endpoint = endpoint.rstrip("/") + "/v1/metrics"
            exporter = OTLPMetricExporter(endpoint=endpoint, timeout=5)
        self.exporter = exporter
        self.interval = interval_seconds
        self.registry = registry
        self.start_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def export_once(self) -> bool:
        from opentelemetry.sdk.metrics.export import MetricExportResult
        result = self.exporter.export(collect_metrics_data(self.registry, self.start_ns))
        return result == MetricExportResult.SUCCESS

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                if not self.export_once():
                    errors.report("otel_export", "export failed")
            except Exception as exc:
                errors.report("otel_export", exc)

    def start(self) -> "OtelBridge":
        self._thread = threading.Thread(target=self._loop, name="vllm-spark-otel", daemon=True)
        self._thread.start()
        log.info("vllm-spark-plugin: OpenTelemetry bridge exporting every %.0fs", self.interval)
        return self

    def stop(self) -> None:
        self._stop.set()
