"""The Prometheus instruments of the metric contract (created once per process), built from the one
declaration of each in `metrics.names.METRICS`.

They live in prometheus-client's default registry, which vLLM's `/metrics` serves; vLLM only
unregisters collectors whose names start with `vllm:`.  When vLLM runs several API servers it switches
prometheus-client to multiprocess mode: histograms and counters then add up across processes, and
gauges report the most recent value written by any process (`multiprocess_mode="mostrecent"`).

The per-stream rate histograms take the configured floors, and the TTFT histogram the TTFT SLO, as
bucket bounds besides the defaults (`definitions.with_slo_bounds`): the SLO rules' `le` selectors are
then exact at whatever values the user chose.
"""
from __future__ import annotations

import threading
from typing import Iterable

from prometheus_client import REGISTRY, Counter, Gauge, Histogram

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.definitions import with_slo_bounds
from vllm_spark_plugin.metrics import names as n

LABELS = n.ENGINE
_lock = threading.Lock()
_instance = None


def _create(m: n.Metric, registry, slo_values: dict):
    if m.kind == n.COUNTER:
        return Counter(m.name, m.help, m.labels, registry=registry)
    if m.kind == n.GAUGE:
        return Gauge(m.name, m.help, m.labels, registry=registry, multiprocess_mode="mostrecent")
    buckets = with_slo_bounds(m.buckets, slo_values[m.slo]) if m.slo else m.buckets
    return Histogram(m.name, m.help, m.labels, buckets=buckets, registry=registry)


class Instruments:
    """One attribute per declaration of `names.METRICS` (`ins.step_batch`, `ins.ttft`, ...)."""

    def __init__(self, registry=REGISTRY, floors: Iterable[float] = (), ttft_slo_seconds: float | None = None) -> None:
        slo_values = {n.FLOORS: tuple(floors), n.TTFT_SLO_BOUND: () if ttft_slo_seconds is None else (ttft_slo_seconds,)}
        for m in n.METRICS:
            setattr(self, m.attr, _create(m, registry, slo_values))
        if registry is REGISTRY:  # the process's exporter counts contained errors; a test registry does not
            errors.bind_counter(self.errors)

    def collectors(self) -> list:
        """The plugin's own collectors (what the OpenTelemetry bridge reads; vLLM's are not among them)."""
        return [v for v in vars(self).values() if isinstance(v, (Counter, Gauge, Histogram))]


def get(floors: Iterable[float] = (), ttft_slo_seconds: float | None = None) -> Instruments:
    """The process's instruments, made on the first call with the SLO values it is given (the
    exporter's, from the process's settings); later calls return them as made."""
    global _instance
    with _lock:
        if _instance is None:
            _instance = Instruments(floors=floors, ttft_slo_seconds=ttft_slo_seconds)
        return _instance
