"""`vllm-spark doctor --endpoint URL --rules ...` against the real CPU `vllm serve` of the session
(floors 20, 250 and 2,000 tok/s, tests/conftest.py) and the rules `vllm-spark dashboards` writes: the
committed ones (floor 20) and ones regenerated for a floor the server does not run."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from vllm_spark_plugin.doctor import floors
from vllm_spark_plugin.grafana import rules as grafana_rules
from vllm_spark_plugin.grafana.slo import SLOConfig

ALERTS = Path(__file__).resolve().parents[2] / "alerts"


def doctor(*args) -> tuple[int, dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_PLUGIN_", "VLLM_"))}
    r = subprocess.run([sys.executable, "-m", "vllm_spark_plugin.cli", "doctor", "--json", *args],
                       capture_output=True, text=True, env=env, timeout=600)
    report = json.loads(r.stdout)
    return r.returncode, next(c for c in report["checks"] if c["name"] == floors.NAME)


def test_the_committed_rules_against_the_real_servers_floors(vllm_server):
    rc, row = doctor("--endpoint", vllm_server.base_url, "--rules", str(ALERTS))
    assert row["status"] == "info", row
    assert "select 20 tok/s" in row["detail"] and "exports 20, 250, 2000 tok/s" in row["detail"]
    assert "no rule watches 250, 2000 tok/s" in row["detail"]
    assert floors.server_floors(open_metrics(vllm_server)) == [20.0, 250.0, 2000.0]
    assert rc == 0


def test_rules_for_a_floor_the_server_does_not_run_fail_with_the_regeneration(vllm_server, tmp_path):
    for name, text in grafana_rules.render_files(SLOConfig(floor_tokens_per_second=15)).items():
        (tmp_path / name).write_text(text)
    rc, row = doctor("--endpoint", vllm_server.base_url, "--rules", str(tmp_path))
    assert rc == 1 and row["status"] == "fail", row
    assert "select 15 tok/s" in row["detail"] and "exports 20, 250, 2000 tok/s" in row["detail"]
    assert f"vllm-spark dashboards --floor 20 --alerts-out {tmp_path}" in row["fix"]


def open_metrics(server) -> str:
    return floors.fetch_metrics(server.base_url)
