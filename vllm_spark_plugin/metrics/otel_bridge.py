"""Optional OpenTelemetry bridge: the plugin's Prometheus instruments, exported over OTLP/HTTP.

Off by default (SPARK_PLUGIN_OTEL_ENDPOINT empty).  It never touches the per-step path: a daemon
thread collects the plugin's own instruments every interval (only them: vLLM's series, which share
the process's registry, are neither collected nor converted), and when any value changed since the
last export converts them to OTLP metrics (counters -> cumulative monotonic sums, gauges -> gauges,
histograms -> cumulative explicit-bucket histograms) and exports them.  Nothing changed: no
conversion and no export, but for a keep-alive export every `KEEPALIVE_SECONDS` (receivers expire
series they have not seen for 5 minutes).  The series are the same ones /metrics serves.
`benchmarks/render_overhead.py` measures the cost.
"""
from __future__ import annotations

import logging
import threading
import time

from vllm_spark_plugin._version import __version__
from vllm_spark_plugin.common import errors
from vllm_spark_plugin.metrics.names import PREFIX

log = logging.getLogger("vllm_spark_plugin")
KEEPALIVE_SECONDS = 240.0


def _attrs(labels: dict) -> dict:
    return {k: v for k, v in labels.items() if k != "le"}


def collect(collectors) -> list:
    """The metric families of `collectors` (prometheus-client collectors), vllm_spark_* only."""
    return [fam for c in collectors for fam in c.collect() if fam.name.startswith(PREFIX)]


def fingerprint(families) -> tuple:
    """Every sample's name, labels and value: equal fingerprints mean nothing changed."""
    return tuple((s.name, tuple(s.labels.items()), s.value) for fam in families for s in fam.samples)


def collect_metrics_data(families, start_ns: int | None = None):
    """Prometheus metric families -> opentelemetry.sdk.metrics.export.MetricsData (vllm_spark_* only)."""
    from opentelemetry.sdk.metrics.export import (AggregationTemporality, Gauge, Histogram,
                                                  HistogramDataPoint, Metric, MetricsData,
                                                  NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    now = time.time_ns()
    start = start_ns or now
    metrics = []
    for fam in families:
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
    def __init__(self, endpoint: str, interval_seconds: float = 10.0, collectors=None, exporter=None,
                 clock=time.monotonic) -> None:
        """`collectors`: what to export (default: the process's plugin instruments)."""
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
            if not endpoint.rstrip("/").endswith("/v1/metrics"):
                endpoint = endpoint.rstrip("/") + "/v1/metrics"
            exporter = OTLPMetricExporter(endpoint=endpoint, timeout=5)
        if collectors is None:
            from vllm_spark_plugin.metrics import instruments
            collectors = instruments.get().collectors()
        self.exporter = exporter
        self.interval = interval_seconds
        self.collectors = collectors
        self.clock = clock
        self.start_ns = time.time_ns()
        self._last: tuple | None = None
        self._last_export = 0.0
        self.exports = 0
        self.skipped = 0  # intervals in which nothing changed
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def export_once(self, force: bool = False) -> bool:
        """Export when a value changed (or `force`, or the keep-alive is due); True unless the export
        failed."""
        from opentelemetry.sdk.metrics.export import MetricExportResult
        families = collect(self.collectors)
        key = fingerprint(families)
        now = self.clock()
        if not force and key == self._last and now - self._last_export < KEEPALIVE_SECONDS:
            self.skipped += 1
            return True
        result = self.exporter.export(collect_metrics_data(families, self.start_ns))
        ok = result == MetricExportResult.SUCCESS
        if ok:  # a failed export is retried next interval even when nothing changed
            self._last, self._last_export = key, now
            self.exports += 1
        return ok

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
