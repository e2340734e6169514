"""Grafana dashboards and Prometheus rules for vllm-spark-plugin, generated from the metric contract.

`vllm-spark dashboards` (cli.py) writes `dashboards/*.json` and `alerts/*.rules.yml`; both depend on
the same SLOs and thresholds (`slo.SLOConfig`).
"""
from vllm_spark_plugin.grafana.queries import iter_panel_queries, substitute
from vllm_spark_plugin.grafana.slo import SLOConfig, SLOError

__all__ = ["iter_panel_queries", "substitute", "SLOConfig", "SLOError"]
