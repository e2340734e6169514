"""deploy/llm-d/epp-config.yaml stays consistent with the plugin: it scores on the spare-capacity
series the exporter writes, at the default (highest) floor, and every reference in it names a plugin of
the file.  (The field names were checked against llm-d-router's Go types by hand: docs/deploy.md.)"""
from __future__ import annotations

from pathlib import Path

import yaml

from vllm_spark_plugin.metrics import names as n
from vllm_spark_plugin.settings import Settings

LLMD = Path(__file__).resolve().parents[2] / "deploy" / "llm-d"


def _config() -> dict:
    return yaml.safe_load((LLMD / "epp-config.yaml").read_text(encoding="utf-8"))


def test_the_picker_scores_on_the_spare_capacity_at_the_highest_default_floor():
    cfg = _config()
    plugins = {p["name"]: p for p in cfg["plugins"]}
    custom = [m for e in plugins["metrics-extractor"]["parameters"]["engineConfigs"] for m in e.get("customMetrics", ())]
    floor = f"{max(Settings().floors):g}"
    assert [m["metricSpec"] for m in custom] == [f'{n.SPARE_CAPACITY}{{floor="{floor}"}}']
    scorer = plugins["spare-capacity"]["parameters"]
    assert scorer["attributeKey"] == custom[0]["attributeKey"]
    assert scorer["algorithm"]["type"] == "linear_higher_is_better"


def test_every_reference_names_a_plugin_and_discovery_reads_the_endpoints_file():
    cfg = _config()
    names = {p["name"] for p in cfg["plugins"]}
    refs = [p["pluginRef"] for prof in cfg["schedulingProfiles"] for p in prof["plugins"]]
    dl = cfg["dataLayer"]
    refs += [dl["discovery"]["pluginRef"]] + [s["pluginRef"] for s in dl["sources"]]
    refs += [x["pluginRef"] for s in dl["sources"] for x in s["extractors"]]
    assert set(refs) <= names, set(refs) - names
    entries = yaml.safe_load((LLMD / "endpoints.yaml").read_text(encoding="utf-8"))["endpoints"]
    assert entries and all(isinstance(e["port"], str) and e["address"].count(".") == 3 for e in entries)
