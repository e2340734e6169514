"""`vllm-spark doctor` as a registry of checks: one row per check, every check under the same
containment; and the `rules_floors` check against a real /metrics text (the plugin's exporter on a
registry of the test's own, served over real HTTP) and the committed rules files.

Fakes only at the device seam (`doctor.Probe`: this unit tier has no vLLM and no GPU)."""
from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from vllm_spark_plugin import cli, doctor
from vllm_spark_plugin.doctor import floors, registry
from vllm_spark_plugin.grafana import rules as grafana_rules
from vllm_spark_plugin.grafana.slo import SLOConfig
from vllm_spark_plugin.metrics.exporter import Exporter
from vllm_spark_plugin.settings import Settings

ALERTS = Path(__file__).resolve().parents[2] / "alerts"
CPU_BOX = dict(vllm_version=lambda: "not installed", in_window=lambda: False, capabilities=dict,
               has_cuda=lambda: False, device_name=lambda: "cpu", capability=lambda: None,
               backend_imports=dict, plugin_entry_points=lambda: ["spark"])   # nothing of vLLM is imported


def cpu_probe(tmp_path) -> doctor.Probe:
    return doctor.Probe(**CPU_BOX, extra={"sysfs_root": str(tmp_path), "vllm_env_names": set,
                                          "kernel_libraries": list, "kernel_log_path": str(tmp_path / "no-kmsg")})


def metrics_text(floor_values: tuple[float, ...]) -> str:
    """What a server with SPARK_PLUGIN_FLOORS=floor_values exports once its engine exists."""
    registry_ = CollectorRegistry()
    exp = Exporter("m", Settings(floors=floor_values), registry=registry_)
    exp.engine(0)
    return generate_latest(registry_).decode()


@pytest.fixture
def serve_metrics():
    """Serve a /metrics text over real HTTP; yields a function text -> base URL."""
    servers = []

    def start(text: str) -> str:
        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                body = text.encode() if self.path == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


def by_name(checks):
    return {c.name: c for c in checks}


# --- the registry ------------------------------------------------------------------------------------
def test_every_check_is_one_row_with_a_unique_name_in_report_order():
    names = [row.name for row in registry.CHECKS]
    assert len(names) == len(set(names))
    assert names[0] == "vllm" and names[-2:] == [floors.NAME, "links"]


def test_a_check_that_raises_is_one_failed_row_naming_it_and_the_others_still_run(tmp_path, monkeypatch):
    def broken(ctx):
        raise KeyError("no such reading")

    rows = tuple(registry.Row(r.name, broken) if r.name == "device" else r for r in registry.CHECKS)
    monkeypatch.setattr(registry, "CHECKS", rows)
    checks = doctor.run_checks({}, doctor.ServeArgs(), cpu_probe(tmp_path))
    device = [c for c in checks if c.name == "device"]
    assert len(device) == 1 and device[0].status == doctor.FAIL
    assert device[0].detail == "check could not run: KeyError: 'no such reading'" and device[0].fix
    assert {"plugin", "cuda_graphs", floors.NAME, "links"} <= set(by_name(checks))


def test_a_shared_reading_that_raises_fails_only_the_checks_that_read_it(tmp_path):
    def no_cuda_answer():
        raise RuntimeError("driver gone")

    probe = cpu_probe(tmp_path)
    probe.has_cuda = no_cuda_answer
    checks = by_name(doctor.run_checks({}, doctor.ServeArgs(), probe))
    assert checks["device"].status == checks["cuda_graphs"].status == doctor.FAIL
    assert "RuntimeError: driver gone" in checks["device"].detail
    assert checks["plugin"].status == doctor.OK and checks["settings"].status == doctor.OK


def test_a_sub_check_that_raises_is_contained_the_same_way():
    rows = doctor.check.contained("driver_events", lambda: (_ for _ in ()).throw(OSError("kmsg")))
    assert [(c.name, c.status) for c in rows] == [("driver_events", doctor.FAIL)] and "OSError: kmsg" in rows[0].detail


# --- rules_floors ------------------------------------------------------------------------------------
def test_the_committed_rules_select_the_default_floor():
    files = sorted(ALERTS.glob("*.rules.yml"))
    assert len(files) == 2
    for f in files:
        assert floors.rules_floors(f.read_text()) == [SLOConfig().floor_tokens_per_second], f


@pytest.mark.parametrize("floor", [15.0, 40.0])
def test_rules_generated_for_another_floor_select_that_floor(floor):
    for text in grafana_rules.render_files(SLOConfig(floor_tokens_per_second=floor)).values():
        assert floors.rules_floors(text) == [floor]


def test_a_server_exports_its_floors_from_the_start():
    assert floors.server_floors(metrics_text((20.0, 40.0))) == [20.0, 40.0]
    assert floors.server_floors(metrics_text((15.0,))) == [15.0]
    assert floors.server_floors("# no plugin here\nup 1\n") == []


def test_not_a_rules_file_is_a_clear_error():
    with pytest.raises(ValueError, match="no `groups:` list"):
        floors.rules_floors("scrape_configs: []\n")


def rules_row(tmp_path, **kw):
    return by_name(doctor.run_checks({}, doctor.ServeArgs(), cpu_probe(tmp_path), **kw))[floors.NAME]


def test_rules_and_server_on_the_same_floor_pass(tmp_path, serve_metrics):
    url = serve_metrics(metrics_text((20.0,)))
    c = rules_row(tmp_path, endpoint=url, rules=[str(ALERTS)])
    assert c.status == doctor.OK and "select 20 tok/s" in c.detail and "exports 20 tok/s" in c.detail


def test_rules_on_a_floor_the_server_does_not_export_fail_with_the_regeneration(tmp_path, serve_metrics):
    url = serve_metrics(metrics_text((15.0, 40.0)))
    c = rules_row(tmp_path, endpoint=url, rules=[str(ALERTS / "recording.rules.yml")])
    assert c.status == doctor.FAIL
    assert "select 20 tok/s" in c.detail and "exports 15, 40 tok/s" in c.detail and "SLO alerts stay silent" in c.detail
    assert f"vllm-spark dashboards --floor 15 --alerts-out {ALERTS}" in c.fix
    assert "SPARK_PLUGIN_FLOORS including 20" in c.fix


def test_rules_reading_a_bucket_the_server_does_not_export_fail(tmp_path, serve_metrics):
    """Same floor, another TTFT SLO: the rules read the TTFT histogram at a bound the server lacks."""
    for name, text in grafana_rules.render_files(SLOConfig(ttft_slo_seconds=7)).items():
        (tmp_path / name).write_text(text)
    c = rules_row(tmp_path, endpoint=serve_metrics(metrics_text((20.0,))), rules=[str(tmp_path)])
    assert c.status == doctor.FAIL and "select 20 tok/s" in c.detail
    assert "buckets the server does not export: vllm_spark_ttft_seconds le=7" in c.detail
    assert "--ttft-slo" in c.fix and "SPARK_PLUGIN_FLOORS" not in c.fix


def test_a_server_with_more_floors_than_the_rules_watch_is_noted(tmp_path, serve_metrics):
    url = serve_metrics(metrics_text((20.0, 40.0)))
    c = rules_row(tmp_path, endpoint=url.removeprefix("http://"), rules=[str(ALERTS)])
    assert c.status == doctor.INFO and "no rule watches 40 tok/s" in c.detail


def test_what_cannot_be_compared_says_why(tmp_path, serve_metrics):
    assert rules_row(tmp_path).status == doctor.NA
    down = rules_row(tmp_path, endpoint="http://127.0.0.1:9", rules=[str(ALERTS)])
    assert down.status == doctor.FAIL and "cannot read http://127.0.0.1:9/metrics" in down.detail
    bare = rules_row(tmp_path, endpoint=serve_metrics("up 1\n"), rules=[str(ALERTS)])
    assert bare.status == doctor.FAIL and "the plugin is not loaded there" in bare.detail
    missing = rules_row(tmp_path, endpoint="http://127.0.0.1:9", rules=[str(tmp_path / "nope.yml")])
    assert missing.status == doctor.FAIL and "no such file or folder" in missing.detail


def test_without_rules_doctor_reads_the_deploys(tmp_path, monkeypatch):
    monkeypatch.chdir(ALERTS.parent)
    assert floors.rule_files(()) == [Path("alerts/alerting.rules.yml"), Path("alerts/recording.rules.yml")]
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(floors, "RULES_HOMES", (str(tmp_path / "none"),))
    assert floors.rule_files(()) == []


def test_the_command_exits_1_on_a_floor_mismatch_and_0_when_they_agree(tmp_path, serve_metrics, monkeypatch, capsys):
    monkeypatch.setattr(registry, "CHECKS", tuple(r for r in registry.CHECKS if r.name == floors.NAME))
    bad = serve_metrics(metrics_text((40.0,)))
    assert cli.main(["doctor", "--json", "--endpoint", bad, "--rules", str(ALERTS)]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["checks"][0]["name"] == floors.NAME
    good = serve_metrics(metrics_text((20.0,)))
    assert cli.main(["doctor", "--endpoint", good, "--rules", str(ALERTS)]) == 0
    assert capsys.readouterr().out.startswith(f"[ OK ] {floors.NAME}: the rules (")


def test_every_probe_has_the_words_doctor_says_it_with():
    from vllm_spark_plugin.doctor.environment import FEATURE_TEXT
    from vllm_spark_plugin.vllm.capabilities import PROBES
    assert set(PROBES) == set(FEATURE_TEXT), "a probe doctor would name only by its key"
