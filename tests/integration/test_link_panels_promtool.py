"""The fleet dashboard's Links row evaluated by the real `promtool` over link counters (the values a
4-Spark ring would give).  The row's place and the generated alerts: tests/unit/test_link_alerts.py."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_spark_plugin.grafana import dashboards, iter_panel_queries
from vllm_spark_plugin.metrics import names as N

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _fleet_queries() -> dict[str, str]:
    fleet = dashboards.build_all()["vllm-spark-fleet.json"]
    return {title: expr for _, title, expr in iter_panel_queries(fleet)}


def test_the_links_row_computes_throughput_and_share_from_the_counters(tmp_path):
    """A 4-Spark ring's link at 12.5 Gb/s each way on a 200 Gb/s port: 3.125e9 bytes/s tx+rx, 12.5 %."""
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool not found: apt-get install prometheus")
    q = _fleet_queries()
    labels = 'job="vllm", instance="spark-1:8000", interface="enp1s0f0np0"'
    series = [
        {"series": f"{N.LINK_TRANSMIT}{{{labels}}}", "values": "0+93750000000x20"},
        {"series": f"{N.LINK_RECEIVE}{{{labels}}}", "values": "0+93750000000x20"},
        {"series": f"{N.LINK_RATE}{{{labels}}}", "values": "25000000000x20"},
        {"series": f"{N.LINK_PORT_RATE}{{{labels}}}", "values": "25000000000x20"},
        {"series": f"{N.LINK_CARRIER_CHANGES}{{{labels}}}", "values": "0 0 0 0 0 0 0 0 0 0 2 2 2 2 2 2 2 2 2 2"},
    ]
    out = {"instance": "spark-1:8000", "interface": "enp1s0f0np0"}

    def case(expr: str, value: float) -> dict:
        return {"expr": expr, "eval_time": "10m", "exp_samples": [{"labels": "{" + ", ".join(
            f'{k}="{v}"' for k, v in out.items()) + "}", "value": value}]}

    doc = {"evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
        case(q["Link throughput vs negotiated rate [A]"], 3.125e9),
        case(q["Link throughput vs negotiated rate [B]"], 25e9),
        case(q["Link throughput as a share of its rate [A]"], 0.125),
        case(q["Per link [C]"], 25e9),
        # the carrier counter went 0 -> 2 within the last minute; the window is $__rate_interval (1m)
        case(q["Link flaps and NIC events [A]"], 2),
    ]}]}
    path = tmp_path / "links_panels_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    res = subprocess.run([PROMTOOL, "test", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr

