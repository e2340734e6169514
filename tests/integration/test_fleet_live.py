"""The fleet dashboard against two real CPU `vllm serve` servers with the plugin, scraped by one real
Prometheus: the fleet capacity and fleet knee ratio equal the sums of the per-instance values."""
from __future__ import annotations

import math
import time

import pytest

from support.live_load import drive
from support.prom import PrometheusProcess
from vllm_spark_plugin.grafana import dashboards, iter_panel_queries
from vllm_spark_plugin.grafana import promql as q
from vllm_spark_plugin.grafana.slo import SLOConfig

pytestmark = pytest.mark.server


def _panel_exprs(model: str) -> dict[str, str]:
    fleet = dashboards.build_all()["vllm-spark-fleet.json"]
    return {title: expr for _, title, expr in iter_panel_queries(fleet, {"model": model})}


def _by_instance(result: list) -> dict[str, float]:
    return {s["metric"]["instance"]: float(s["value"][1]) for s in result}


def test_fleet_capacity_is_the_sum_of_the_instances(vllm_server_pair):
    a, b = vllm_server_pair
    assert a.model == b.model
    floor = SLOConfig().floor_tokens_per_second
    with PrometheusProcess([a.metrics_url, b.metrics_url]) as prom:
        prom.wait_for('count(up{job="vllm"} == 1) == 2', timeout=60)
        both = f"count(count by (instance) (vllm_spark_capacity_streams{{{q.floor_matcher(floor)}}})) == 2"
        # Each instance reports a capacity once its step-time fit has a positive slope.  The load makes
        # that so by construction: every server first runs one stream alone, then 16 at once, so each
        # fit holds steps at batch 1 and at batch 16, and a step of 16 streams takes longer than a step
        # of one on any machine; the next refit (every 10 s) publishes it.
        solo = drive([a.base_url, b.base_url], a.model, seconds=8, concurrency=1, max_tokens=32, stagger=0)
        counts = drive([a.base_url, b.base_url], a.model, seconds=12, concurrency=16, max_tokens=32, stagger=0)
        assert solo["requests"] >= 2 and counts["requests"] >= 32, (solo, counts)
        try:
            prom.wait_for(both, timeout=60)
        except TimeoutError:
            state = prom.query('vllm_spark_knee_verdict == 1 or vllm_spark_knee_fit_samples '
                               'or vllm_spark_knee_batch_size or vllm_spark_capacity_streams')
            pytest.fail(f"no capacity at {floor:g} tok/s from both instances; "
                        f"fit state: {[(s['metric'], s['value'][1]) for s in state]}")
        time.sleep(2)
        at = time.time() - 1  # one evaluation instant for every query
        exprs = _panel_exprs(a.model)

        fleet_capacity = float(prom.query(exprs[f"Fleet capacity at {floor:g} tok/s [A]"], at)[0]["value"][1])
        per_instance = _by_instance(prom.query(exprs["Per instance [C]"], at))
        assert len(per_instance) == 2, per_instance
        assert math.isclose(fleet_capacity, sum(per_instance.values()), rel_tol=1e-9), (fleet_capacity, per_instance)
        assert fleet_capacity > 0

        knee = _by_instance(prom.query(exprs["Per instance [D]"], at))
        running = _by_instance(prom.query(exprs["Per instance [E]"], at))
        fleet_ratio = prom.query(exprs["Fleet knee ratio [A]"], at)
        assert set(knee) == set(running) == set(per_instance)
        assert math.isclose(float(fleet_ratio[0]["value"][1]), sum(running.values()) / sum(knee.values()), rel_tol=1e-9)

        instances = float(prom.query(exprs["Instances reporting [A]"], at)[0]["value"][1])
        assert instances == 2
        print(f"\nfleet capacity at {floor:g} tok/s = {fleet_capacity:g} = sum of {per_instance}; load {counts}")
