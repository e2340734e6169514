"""The interconnect's alerts, runbooks and fleet-dashboard row.

The alerts fire and stay silent in alerts/tests/links_test.yml (run by tests/integration/test_alerts.py);
here: the generator's link share, the runbooks walking the diagnosis and the row's place and queries.
The row's queries evaluated by the real `promtool`: tests/integration/test_link_panels_promtool.py."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from vllm_spark_plugin.grafana import cli, dashboards, iter_panel_queries, rules
from vllm_spark_plugin.grafana.slo import SLOConfig, SLOError
from vllm_spark_plugin.metrics import names as N

ROOT = Path(__file__).resolve().parents[2]
RUNBOOKS = ROOT / "alerts" / "runbooks"
LINK_ALERTS = ("VllmSparkLinkBelowRate", "VllmSparkLinkFlapping")


def _rule(name: str, slo: SLOConfig | None = None) -> dict:
    return next(r for g in rules.alerting_groups((slo or SLOConfig()).validate()) for r in g["rules"]
                if r.get("alert") == name)


def test_both_link_alerts_are_generated_with_the_public_names():
    below, flap = _rule("VllmSparkLinkBelowRate"), _rule("VllmSparkLinkFlapping")
    assert below["for"] == "10m" and below["labels"]["severity"] == "warning"
    records = {r["record"]: r["expr"] for g in rules.recording_groups(SLOConfig()) for r in g["rules"]}
    share = records["instance:vllm_spark_link_bytes:share_of_rate5m"]
    assert N.LINK_RATE in share
    assert N.LINK_TRANSMIT in records["instance:vllm_spark_link_bytes:rate5m"]
    assert N.LINK_RECEIVE in records["instance:vllm_spark_link_bytes:rate5m"]
    # the baseline: the offline profile where present, else the fit an hour ago
    assert N.PROFILE_KNEE_BATCH in below["expr"] and "predicted_by_fit_1h_ago" in below["expr"]
    assert "< 0.25" in below["expr"] and "> 1.25" in below["expr"]
    assert f"increase({N.LINK_CARRIER_CHANGES}[15m])" in flap["expr"]
    assert f'{N.LINK_EVENTS}{{kind=~"link_down|nic_reinit"}}' in flap["expr"]


def test_the_link_share_is_a_generator_option_and_validated():
    assert "< 0.1\n" in _rule("VllmSparkLinkBelowRate", SLOConfig(link_share=0.1))["expr"]
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    assert cli.slo_from_args(parser.parse_args(["--link-share", "0.4"])).link_share == 0.4
    for bad in (0, 1, 1.5, float("nan")):
        with pytest.raises(SLOError, match="--link-share"):
            SLOConfig(link_share=bad).validate()
    fleet = dashboards.build_all(SLOConfig(link_share=0.1))["vllm-spark-fleet.json"]
    share_panel = next(p for p in fleet["panels"] if p["title"] == "Link throughput as a share of its rate")
    assert [s["value"] for s in share_panel["fieldConfig"]["defaults"]["thresholds"]["steps"]] == [None, 0.1]


@pytest.mark.parametrize("name", LINK_ALERTS)
def test_runbooks_walk_the_diagnosis(name):
    text = (RUNBOOKS / f"{name}.md").read_text()
    assert text.startswith(f"# {name} (warning)")
    for section in ("**Meaning.**", "**Fires when**", "**Diagnose", "**Act.**"):
        assert section in text, section
    assert "12.5-13 Gb/s" in text and "reboot" in text.lower() and "cables connected" in text
    assert "journalctl -k" in text and "vllm-spark doctor" in text


def test_below_rate_runbook_has_the_seed_steps_in_order():
    text = (RUNBOOKS / "VllmSparkLinkBelowRate.md").read_text()
    steps = ["--link-probe", "loopback", "journalctl -k", "Reboot the affected hosts with the cables connected"]
    positions = [text.index(s) for s in steps]
    assert positions == sorted(positions), positions
    assert "27 %" in text and "prefill throughput roughly doubled" in text
    assert "vllm-spark plan --tp N --link-rate" in text


def _fleet_queries() -> dict[str, str]:
    fleet = dashboards.build_all()["vllm-spark-fleet.json"]
    return {title: expr for _, title, expr in iter_panel_queries(fleet)}


def test_the_links_row_sits_in_the_fleet_dashboard_beside_the_step_time():
    fleet = dashboards.build_all()["vllm-spark-fleet.json"]
    titles = [p["title"] for p in fleet["panels"]]
    row = titles.index("Links")
    assert titles[row + 1:row + 3] == ["Link throughput vs negotiated rate", "Engine step time vs baseline"]
    queries = _fleet_queries()
    assert N.STEP_DURATION + "_sum" in queries["Engine step time vs baseline [A]"]
    assert N.LINK_RATE in queries["Link throughput vs negotiated rate [B]"]


