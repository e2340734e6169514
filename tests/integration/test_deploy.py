"""Deployment files: compose files parse, Prometheus / Alertmanager configs pass their own checkers,
systemd units pass `systemd-analyze verify`, and the fleet's Prometheus configs really scrape and
federate.

Tools: Debian's `docker-compose` 1.29 (`docker-compose -f FILE config` parses, interpolates and
validates against the compose schema it ships; `docker compose` v2 is not installable here),
`promtool` and `amtool` (prometheus, prometheus-alertmanager), `systemd-analyze` (systemd 252).
Nothing is faked, with one seam: the vllm unit's ExecStart path (/opt/vllm/venv/bin/vllm) is provided
by bind-mounting this repository's own virtualenv (which holds a real `vllm` console script) in a
private mount namespace, because `systemd-analyze verify` requires the binary to exist.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from support.prom import PrometheusProcess, free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
ALERTS = ROOT / "alerts"
COMPOSE_FILES = {
    DEPLOY / "spark" / "compose.yaml": {"MODEL": "Qwen/Qwen3-30B-A3B", "GRAFANA_ADMIN_PASSWORD": "s3cret"},
    DEPLOY / "fleet" / "compose.node.yaml": {"MODEL": "m", "SPARK_NAME": "spark-1"},
    DEPLOY / "fleet" / "compose.tp-head.yaml": {"MODEL": "m", "NODE_IP": "192.0.2.11", "CLUSTER_IFACE": "enp1s0f1np1"},
    DEPLOY / "fleet" / "compose.tp-worker.yaml": {"NODE_IP": "192.0.2.12", "HEAD_IP": "192.0.2.11", "CLUSTER_IFACE": "enp1s0f1np1"},
    DEPLOY / "fleet" / "compose.central.yaml": {"GRAFANA_ADMIN_PASSWORD": "s3cret"},
    DEPLOY / "fleet" / "compose.router.yaml": {"ROUTER_WORKER_URLS": "http://192.0.2.11:8000 http://192.0.2.12:8000"},
}
# Variables a user might have exported; cleared so the defaults in the files are what is tested.
_CLEAR = ("BIND_ADDRESS", "MODEL", "GRAFANA_ADMIN_PASSWORD", "NODE_IP", "HEAD_IP", "CLUSTER_IFACE",
          "SPARK_NAME", "GPU_MEMORY_UTILIZATION", "VLLM_IMAGE", "ROUTER_WORKER_URLS")


def _tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if not path:
        pytest.fail(f"{name} not found: apt-get install {package}")
    return path


def _compose_config(path: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in _CLEAR}
    return subprocess.run([_tool("docker-compose", "docker-compose"), "-f", str(path), "config"],
                          capture_output=True, text=True, timeout=120, env={**base, **env}, cwd=path.parent)


def _compose(path: Path, **extra) -> dict:
    res = _compose_config(path, {**COMPOSE_FILES[path], **extra})
    assert res.returncode == 0, f"{path.relative_to(ROOT)} does not parse:\n{res.stderr}"
    return yaml.safe_load(res.stdout)


@pytest.mark.parametrize("path", list(COMPOSE_FILES), ids=lambda p: str(p.relative_to(DEPLOY)))
def test_compose_files_parse_and_bind_to_loopback_by_default(path):
    cfg = _compose(path)
    assert cfg["services"]
    for name, svc in cfg["services"].items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
        if svc.get("network_mode") == "host":  # the API binds to BIND_ADDRESS itself
            assert svc["environment"].get("BIND_ADDRESS", "127.0.0.1") == "127.0.0.1"
    moved = _compose(path, BIND_ADDRESS="10.1.2.3")
    ports = [str(p) for s in moved["services"].values() for p in s.get("ports", [])]
    assert all(p.startswith("10.1.2.3:") for p in ports), ports


def test_compose_rejects_an_invalid_file(tmp_path):
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  x:\n    image: busybox\n    ports: 8000\n    restartt: always\n")
    res = _compose_config(bad, {})
    assert res.returncode != 0 and ("restartt" in res.stderr or "ports" in res.stderr), res.stderr


def test_grafana_needs_a_password_and_allows_no_anonymous_access():
    for path in (DEPLOY / "spark" / "compose.yaml", DEPLOY / "fleet" / "compose.central.yaml"):
        env = {k: v for k, v in COMPOSE_FILES[path].items() if k != "GRAFANA_ADMIN_PASSWORD"}
        res = _compose_config(path, env)
        assert res.returncode != 0 and "GRAFANA_ADMIN_PASSWORD" in res.stderr, res.stderr
        g = _compose(path)["services"]["grafana"]["environment"]
        assert g["GF_SECURITY_ADMIN_PASSWORD"] == "s3cret"
        assert g["GF_AUTH_ANONYMOUS_ENABLED"] == "false" and g["GF_USERS_ALLOW_SIGN_UP"] == "false"


def test_vllm_service_installs_the_plugin_and_uses_spark_memory_settings():
    for path, svc_name in ((DEPLOY / "spark" / "compose.yaml", "vllm"), (DEPLOY / "fleet" / "compose.node.yaml", "vllm"),
                           (DEPLOY / "fleet" / "compose.tp-head.yaml", "vllm-head")):
        svc = _compose(path)["services"][svc_name]
        script = "\n".join(svc["command"])
        assert "pip install" in script and "vllm serve" in script, path
        assert svc["environment"]["GPU_MEMORY_UTILIZATION"] == "0.7"
        assert svc["image"] == "vllm/vllm-openai:v0.32.0"
        assert svc["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    tp = _compose(DEPLOY / "fleet" / "compose.tp-head.yaml")["services"]["vllm-head"]
    script = "\n".join(tp["command"])
    assert "--distributed-executor-backend ray" in script and "ray start --head" in script
    assert _compose(DEPLOY / "spark" / "compose.yaml", GPU_MEMORY_UTILIZATION="0.5")["services"]["vllm"]["environment"]["GPU_MEMORY_UTILIZATION"] == "0.5"


def _container_layout(tmp_path: Path, config: Path, targets: dict[str, list] | None = None) -> Path:
    """The file layout the compose files mount: prometheus.yml, rules/ (= alerts/), targets/."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    shutil.copy(config, tmp_path / "prometheus.yml")
    (tmp_path / "rules").symlink_to(ALERTS, target_is_directory=True)
    (tmp_path / "targets").mkdir()
    for name, doc in (targets or {}).items():
        (tmp_path / "targets" / name).write_text(json.dumps(doc))
    return tmp_path / "prometheus.yml"


@pytest.mark.parametrize("config", ["spark/prometheus/prometheus.yml", "systemd/prometheus.yml",
                                    "fleet/prometheus/central-scrape.yml", "fleet/prometheus/central-federate.yml",
                                    "fleet/prometheus/node.yml"])
def test_prometheus_configs_pass_promtool(tmp_path, config):
    path = _container_layout(tmp_path, DEPLOY / config)
    res = subprocess.run([_tool("promtool", "prometheus"), "check", "config", str(path)],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    if "node.yml" not in config:  # every server that alerts loads both rule files
        assert "SUCCESS: 43 rules found" in res.stdout or res.stdout.count("rules found") == 2, res.stdout


def test_alertmanager_config_passes_amtool_and_names_real_alerts():
    path = DEPLOY / "spark" / "alertmanager" / "alertmanager.yml"
    res = subprocess.run([_tool("amtool", "prometheus-alertmanager"), "check-config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stdout + res.stderr
    alerts = {r["alert"] for g in yaml.safe_load((ALERTS / "alerting.rules.yml").read_text())["groups"] for r in g["rules"]}
    cfg = yaml.safe_load(path.read_text())
    named = set()
    for rule in cfg["inhibit_rules"]:
        for m in rule["source_matchers"] + rule["target_matchers"]:
            if m.startswith('alertname="'):
                named.add(m.split('"')[1])
            elif m.startswith('alertname=~"'):
                named.update(m.split('"')[1].split("|"))
    assert named and named <= alerts, named - alerts
    severities = {m.split('"')[1] for r in cfg["route"]["routes"] for m in r["matchers"]}
    assert severities == {"critical", "warning", "info"}


def test_systemd_units_verify():
    sa = shutil.which("systemd-analyze")
    assert sa, "systemd-analyze is missing: scripts/setup.sh installs Debian's systemd package"
    venv = Path(sys.prefix)
    assert (venv / "bin" / "vllm").exists(), f"no vllm console script in {venv}"
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    assert {u.name for u in units} == {"vllm.service", "vllm-spark-prometheus.service", "vllm-spark-alertmanager.service"}
    script = ("set -e; mount -t tmpfs tmpfs /opt; mkdir -p /opt/vllm/venv; "
              f"mount --bind {venv} /opt/vllm/venv; exec {sa} verify " + " ".join(str(u) for u in units))
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and not res.stderr.strip(), res.stdout + res.stderr
    # the check is not vacuous: a unit with a typo and a missing binary fails
    bad = Path("/tmp") / f"vllm-spark-bad-{os.getpid()}.service"
    bad.write_text("[Service]\nExecStrt=/bin/true\nExecStart=/nonexistent/bin/x\n")
    try:
        res = subprocess.run([sa, "verify", str(bad)], capture_output=True, text=True, timeout=60)
        assert res.returncode != 0 and "ExecStrt" in res.stderr
    finally:
        bad.unlink()


def _make_targets(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(DEPLOY / "fleet" / "make_targets.py"), *args],
                          capture_output=True, text=True, timeout=60)


def test_make_targets_writes_file_sd(tmp_path):
    out = tmp_path / "vllm.json"
    res = _make_targets("--out", str(out), "spark-1:8001", "spark-2", "10.0.0.3:9000")
    assert res.returncode == 0, res.stderr
    doc = json.loads(out.read_text())
    assert doc == [{"targets": ["spark-1:8001"], "labels": {"spark": "spark-1"}},
                   {"targets": ["spark-2:8000"], "labels": {"spark": "spark-2"}},
                   {"targets": ["10.0.0.3:9000"], "labels": {"spark": "10.0.0.3"}}]
    res = _make_targets("--out", str(out), "--kind", "federate", "spark-1")
    assert json.loads(out.read_text())[0]["targets"] == ["spark-1:9090"]
    for bad in (["spark 1"], ["a:1", "a:1"], []):
        res = _make_targets("--out", str(out), *bad)
        assert res.returncode == 2 and "make_targets:" in res.stderr, (bad, res.stderr)


@pytest.fixture
def two_exporters():
    """Two real prometheus-client HTTP endpoints standing in for two Sparks' /metrics."""
    ports = []
    for i in range(2):
        reg = CollectorRegistry()
        g = Gauge("vllm_spark_capacity_streams", "x", ["model_name", "engine", "floor"], registry=reg)
        g.labels("m", "0", "20").set(10 + 4 * i)
        port = free_port()
        start_http_server(port, addr="127.0.0.1", registry=reg)
        ports.append(port)
    return ports


def test_fleet_central_scrape_config_scrapes_every_node(tmp_path, two_exporters):
    res = _make_targets("--out", str(tmp_path / "t.json"), *(f"127.0.0.1:{p}" for p in two_exporters))
    assert res.returncode == 0, res.stderr
    targets = json.loads((tmp_path / "t.json").read_text())
    cfg = _container_layout(tmp_path / "central", DEPLOY / "fleet" / "prometheus" / "central-scrape.yml", {"vllm.json": targets})
    with PrometheusProcess(config_file=cfg) as prom:
        prom.wait_for('count(up{job="vllm"} == 1) == 2', timeout=60)
        groups = {g["name"] for g in prom.rule_groups()}
        assert {"vllm_spark_instance", "vllm_spark_slo", "vllm_spark_fleet", "vllm_spark_slo_alerts"} <= groups, groups
        # both nodes' gauges (10 + 14) once a rule evaluation has seen both scrapes
        res = prom.wait_for('job:vllm_spark_capacity_streams:sum{floor="20"}', timeout=60,
                            predicate=lambda r: [float(s["value"][1]) for s in r] == [24.0])
        assert res[0]["metric"] == {"__name__": "job:vllm_spark_capacity_streams:sum", "job": "vllm",
                                    "model_name": "m", "floor": "20"}


def test_fleet_federation_keeps_job_and_names_instances_by_spark(tmp_path, two_exporters):
    """Two node Prometheus servers (deploy/fleet/prometheus/node.yml) federated by central-federate.yml.

    The node config scrapes `vllm:8000` (the compose service name); here that one target is replaced
    by a local exporter's address: the only change to the file under test.
    """
    nodes = []
    try:
        for i, port in enumerate(two_exporters):
            text = (DEPLOY / "fleet" / "prometheus" / "node.yml").read_text()
            assert '"vllm:8000"' in text
            d = tmp_path / f"node{i}"
            d.mkdir()
            (d / "prometheus.yml").write_text(text.replace('"vllm:8000"', f'"127.0.0.1:{port}"'))
            node = PrometheusProcess(config_file=d / "prometheus.yml", env={"SPARK_NAME": f"spark-{i + 1}"},
                                     extra_args=["--enable-feature=expand-external-labels"]).start()
            nodes.append(node)
            node.wait_for('up{job="vllm"} == 1', timeout=60)
        res = _make_targets("--out", str(tmp_path / "f.json"), "--kind", "federate", *(f"127.0.0.1:{n.port}" for n in nodes))
        assert res.returncode == 0, res.stderr
        cfg = _container_layout(tmp_path / "central", DEPLOY / "fleet" / "prometheus" / "central-federate.yml",
                                {"federate.json": json.loads((tmp_path / "f.json").read_text())})
        with PrometheusProcess(config_file=cfg) as central:
            res = central.wait_for('vllm_spark_capacity_streams{job="vllm"}', timeout=90, predicate=lambda r: len(r) == 2)
            assert sorted(s["metric"]["instance"] for s in res) == ["spark-1", "spark-2"]
            assert central.wait_for('count(up{job="vllm"} == 1) == 2', timeout=30)
            central.wait_for('job:vllm_spark_capacity_streams:sum{floor="20"}', timeout=60,
                             predicate=lambda r: [float(s["value"][1]) for s in r] == [24.0])
    finally:
        for n in nodes:
            n.stop()
