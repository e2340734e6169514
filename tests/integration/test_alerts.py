"""Prometheus rules: promtool checks, the unit tests in alerts/tests, and the bookkeeping around them.

Everything runs the real `promtool` (Debian's prometheus package, 2.42); nothing is faked.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from vllm_spark_plugin.grafana import rules
from vllm_spark_plugin.grafana.slo import SLOConfig, SLOError

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "alerts"
RULE_FILES = [ALERTS / rules.RECORDING_FILE, ALERTS / rules.ALERTING_FILE]
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SEVERITIES = {"critical", "warning", "info"}


def _promtool(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool not found: apt-get install prometheus")
    return subprocess.run([PROMTOOL, *args], capture_output=True, text=True, timeout=timeout)


def _alert_rules() -> list[dict]:
    doc = yaml.safe_load((ALERTS / rules.ALERTING_FILE).read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "alert" in r]


def _record_rules() -> list[dict]:
    doc = yaml.safe_load((ALERTS / rules.RECORDING_FILE).read_text())
    return [r for g in doc["groups"] for r in g["rules"] if "record" in r]


def test_promtool_check_rules_clean():
    res = _promtool("check", "rules", *map(str, RULE_FILES))
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(RULE_FILES), res.stdout
    assert "WARNING" not in (res.stdout + res.stderr).upper(), res.stdout + res.stderr


def test_promtool_test_rules_pass():
    """One promtool per test file, side by side: promtool runs a file's tests in turn, and the
    3-day slow-burn file alone takes half a minute of CPU."""
    assert TEST_FILES, "no promtool test files in alerts/tests"
    if not Path(PROMTOOL).exists():
        pytest.fail("promtool not found: apt-get install prometheus")
    procs = {path: subprocess.Popen([PROMTOOL, "test", "rules", str(path)], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for path in TEST_FILES}
    for path, proc in procs.items():
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{path.name}:\n{out}"
        assert out.count("SUCCESS") == 1, f"{path.name}:\n{out}"


def test_every_alert_has_a_firing_and_a_silent_case():
    names = {r["alert"] for r in _alert_rules()}
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        doc = yaml.safe_load(path.read_text())
        # the test files must load the committed rules, not a copy
        loaded = {(path.parent / f).resolve() for f in doc.get("rule_files", [])}
        assert (ALERTS / rules.RECORDING_FILE).resolve() in loaded, path
        has_alert_tests = any(case.get("alert_rule_test") for case in doc.get("tests", []))
        assert not has_alert_tests or (ALERTS / rules.ALERTING_FILE).resolve() in loaded, path
        for case in doc.get("tests", []):
            for t in case.get("alert_rule_test", []) or []:
                assert t["alertname"] in names, f"{path.name}: test for unknown alert {t['alertname']}"
                (firing if t.get("exp_alerts") else silent).add(t["alertname"])
    assert not names - firing, f"alerts without a firing test case: {sorted(names - firing)}"
    assert not names - silent, f"alerts without a not-firing test case: {sorted(names - silent)}"


def test_alerts_carry_severity_summary_description_and_an_existing_runbook():
    seen = set()
    for r in _alert_rules():
        name = r["alert"]
        assert name not in seen, f"duplicate alert name {name}"
        seen.add(name)
        assert r["labels"].get("severity") in SEVERITIES, name
        ann = r["annotations"]
        for key in ("summary", "description", "runbook_url"):
            assert ann.get(key, "").strip(), f"{name}: empty {key}"
        assert ann["runbook_url"] == f"alerts/runbooks/{name}.md", name
        runbook = ROOT / ann["runbook_url"]
        assert runbook.is_file(), f"{name}: runbook {runbook} missing"
        assert runbook.read_text().startswith(f"# {name} "), f"{runbook} does not open with the alert name"
    assert len(seen) >= 18
    stray = {p.stem for p in (ALERTS / "runbooks").glob("*.md")} - seen
    assert not stray, f"runbooks without an alert: {sorted(stray)}"


def test_recording_rules_are_named_level_metric_operations():
    pattern = re.compile(r"^(instance|job):[a-z][a-z0-9_]*:[a-z0-9_]+$")
    names = [r["record"] for r in _record_rules()]
    assert len(names) == len(set(names)), "duplicate recording rule"
    bad = [n for n in names if not pattern.match(n)]
    assert not bad, bad
    # counters lose their _total in the metric part
    assert not [n for n in names if "_total:" in n]


def test_committed_rules_are_what_the_generator_writes():
    for name, text in rules.render_files(SLOConfig()).items():
        assert (ALERTS / name).read_text() == text, f"alerts/{name} is stale: run `vllm-spark dashboards`"


def test_burn_rate_thresholds_follow_the_slo_target():
    by_name = {r["alert"]: r["expr"] for r in _alert_rules()}
    fast = by_name["VllmSparkTTFTBudgetBurnFast"]
    # 99% target -> 1% budget: 14.4x = 0.144 over 1h/5m, 6x = 0.06 over 6h/30m
    assert "ratio_rate1h > 0.144" in fast and "ratio_rate5m > 0.144" in fast
    assert "ratio_rate6h > 0.06" in fast and "ratio_rate30m > 0.06" in fast
    assert "ratio_rate3d > 0.01" in by_name["VllmSparkTTFTBudgetBurnSlow"]
    custom = rules.alerting_groups(SLOConfig(ttft_slo_target=0.999).validate())
    expr = next(r["expr"] for g in custom for r in g["rules"] if r["alert"] == "VllmSparkTTFTBudgetBurnFast")
    assert "ratio_rate1h > 0.0144" in expr and "ratio_rate6h > 0.006" in expr


def test_slo_thresholds_are_any_positive_number():
    """Off the default bucket bounds too: the server adds its SLO values to its histograms' bounds."""
    SLOConfig(ttft_slo_seconds=2.5, floor_tokens_per_second=17).validate()
    with pytest.raises(SLOError, match="--ttft-slo -2.5: expected a positive number of seconds"):
        SLOConfig(ttft_slo_seconds=-2.5).validate()
    with pytest.raises(SLOError, match="--floor 0: expected a positive number of tok/s"):
        SLOConfig(floor_tokens_per_second=0).validate()
    with pytest.raises(SLOError, match="--ttft-slo-target 0.9"):
        SLOConfig(ttft_slo_target=0.9).validate()  # 14.4 x 10% > 1: the page could never fire
    with pytest.raises(SLOError, match="--knee-warn"):
        SLOConfig(knee_warn=1.2, knee_crit=1.0).validate()


def test_rules_regenerated_with_other_slos_pass_promtool(tmp_path):
    slo = SLOConfig(ttft_slo_seconds=1.0, floor_tokens_per_second=15, ttft_slo_target=0.995,
                    job="vllm-fleet", runbook_base_url="https://runbooks.example/vllm-spark").validate()
    for name, text in rules.render_files(slo).items():
        (tmp_path / name).write_text(text)
    text = (tmp_path / rules.RECORDING_FILE).read_text() + (tmp_path / rules.ALERTING_FILE).read_text()
    assert 'le="1.0"' in text and 'le="15.0"' in text and 'le="2.0"' not in text
    assert 'up{job="vllm-fleet"}' in text
    assert "runbook_url: https://runbooks.example/vllm-spark/VllmSparkPastKnee.md" in text
    assert 'floor=~"15(\\\\.0+)?"' in text
    res = _promtool("check", "rules", *(str(tmp_path / n) for n in (rules.RECORDING_FILE, rules.ALERTING_FILE)))
    assert res.returncode == 0, res.stdout + res.stderr
