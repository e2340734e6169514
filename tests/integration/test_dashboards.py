"""Grafana dashboards: deterministic regeneration, Grafana's published schema, PromQL that parses.

The schema check is the real TypeScript compiler against npm `@grafana/schema` (no Grafana server can
be installed here); the PromQL check runs every panel query through a real Prometheus (2.42).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.prom import PrometheusProcess, PromQueryError
from vllm_spark_plugin.grafana import cli, dashboards, iter_panel_queries
from vllm_spark_plugin.grafana.queries import substitute
from vllm_spark_plugin.grafana.render import dashboard_json
from vllm_spark_plugin.grafana.slo import SLOConfig

ROOT = Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
SCHEMA_CHECK = ROOT / "tools" / "grafana-schema-check"


def _committed() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(DASHBOARDS.glob("*.json"))}


def test_regenerating_gives_byte_identical_json():
    generated = {name: dashboard_json(d) for name, d in dashboards.build_all(SLOConfig()).items()}
    committed = _committed()
    assert sorted(committed) == sorted(generated), "dashboards/ holds other files than the generator writes"
    for name, text in generated.items():
        assert committed[name] == text, f"dashboards/{name} is stale: run `vllm-spark dashboards`"
        assert text.endswith("}\n") and "\t" not in text
        assert json.dumps(json.loads(text), sort_keys=True, indent=2, ensure_ascii=False) + "\n" == text


def test_two_builds_are_identical():
    a = {n: dashboard_json(d) for n, d in dashboards.build_all().items()}
    b = {n: dashboard_json(d) for n, d in dashboards.build_all().items()}
    assert a == b


def _tsc(env_dir: Path | None = None) -> subprocess.CompletedProcess:
    npm = shutil.which("npm")
    node = shutil.which("node")
    assert npm and node, "node and npm are needed for the schema check (node >= 20)"
    if not (SCHEMA_CHECK / "node_modules" / "@grafana" / "schema").is_dir():
        res = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=SCHEMA_CHECK,
                             capture_output=True, text=True, timeout=600)
        assert res.returncode == 0, f"npm ci failed:\n{res.stdout}\n{res.stderr}"
    env = dict(os.environ)
    if env_dir is not None:
        env["DASHBOARDS_DIR"] = str(env_dir)
    gen = subprocess.run([node, "generate.mjs"], cwd=SCHEMA_CHECK, capture_output=True, text=True,
                         timeout=120, env=env)
    assert gen.returncode == 0, gen.stdout + gen.stderr
    return subprocess.run([str(SCHEMA_CHECK / "node_modules" / ".bin" / "tsc"), "--noEmit", "-p", "tsconfig.json"],
                          cwd=SCHEMA_CHECK, capture_output=True, text=True, timeout=600, env=env)


def test_dashboards_type_check_against_grafana_schema():
    res = _tsc()
    assert res.returncode == 0, "tsc rejected the dashboards:\n" + res.stdout + res.stderr
    generated = (SCHEMA_CHECK / "generated" / "dashboards.ts").read_text()
    for name in _committed():
        assert f"// {name}" in generated, f"{name} was not type-checked"


def test_schema_check_rejects_a_broken_dashboard(tmp_path):
    d = json.loads((DASHBOARDS / "vllm-spark-serving.json").read_text())
    d["panels"][1]["gridPos"]["w"] = "wide"            # a string where the schema wants a number
    d["panels"][2]["fieldConfig"]["defaults"]["thresholds"]["mode"] = "relative"  # no such ThresholdsMode
    (tmp_path / "broken.json").write_text(json.dumps(d))
    res = _tsc(tmp_path)
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert "ThresholdsMode" in out and "number" in out, out
    _tsc()  # leave generated/ describing the committed dashboards


def test_template_variables_and_panel_layout():
    for name, d in dashboards.build_all().items():
        variables = {v["name"]: v for v in d["templating"]["list"]}
        assert set(variables) == {"datasource", "model", "instance"}, name
        assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
        for v in ("model", "instance"):
            assert variables[v]["multi"] and variables[v]["includeAll"], (name, v)
            assert variables[v]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        ids = []
        stack = list(d["panels"])
        while stack:
            p = stack.pop()
            ids.append(p["id"])
            stack.extend(p.get("panels") or [])
            g = p["gridPos"]
            assert 0 <= g["x"] and g["x"] + g["w"] <= 24, (name, p["title"], g)
            if p["type"] != "row":
                assert p["datasource"]["uid"] == "${datasource}", (name, p["title"])
                assert p.get("description"), (name, p["title"])
                assert p["targets"], (name, p["title"])
        assert len(ids) == len(set(ids)), f"{name}: duplicate panel ids"


def test_required_panels_exist():
    built = dashboards.build_all()
    titles = {d["title"]: {p["title"] for p in _walk(d["panels"])} for d in built.values()}
    serving = titles["vLLM on Spark: serving vs knee"]
    for t in ("Aggregate tokens/s vs plateau", "Per-stream decode rate (p10 / p50 / p90)", "Batch size per step",
              "Knee ratio (running / K)", "Running streams vs knee and capacity (live and profile)",
              "TTFT quantiles vs SLO", "Step duration", "Waiting requests (queue)", "Preemptions/s"):
        assert t in serving, t
    assert {"KV blocks used / total", "Unified memory", "Memory pressure (PSI)"} <= titles["vLLM on Spark: KV cache and unified memory"]
    assert {"GPU power", "Joules per token", "Tokens per joule", "SM clock", "GPU temperature",
            "Clock-event reasons"} <= titles["vLLM on Spark: power and efficiency"]
    assert {"Per instance", "Fleet capacity at 20 tok/s", "Fleet knee ratio"} <= titles["vLLM on Spark: fleet"]
    heat = next(p for p in _walk(built["vllm-spark-serving.json"]["panels"]) if p["title"] == "Batch size per step")
    assert heat["type"] == "heatmap" and heat["targets"][0]["format"] == "heatmap"


def _walk(panels):
    for p in panels:
        yield p
        yield from _walk(p.get("panels") or [])


def _steps(panel) -> list:
    return [s["value"] for s in panel["fieldConfig"]["defaults"]["thresholds"]["steps"]]


def test_thresholds_follow_the_users_slos():
    slo = SLOConfig(ttft_slo_seconds=1.0, floor_tokens_per_second=15, knee_warn=0.7, knee_crit=0.9).validate()
    built = dashboards.build_all(slo)
    panels = {p["title"]: p for p in _walk(built["vllm-spark-serving.json"]["panels"])}
    assert _steps(panels["TTFT quantiles vs SLO"]) == [None, 1.0]
    assert _steps(panels["Per-stream decode rate (p10 / p50 / p90)"]) == [None, 15]
    assert _steps(panels["Knee ratio (running / K)"]) == [None, 0.7, 0.9]
    assert 'le="1.0"' in panels["TTFT <= 1 s"]["targets"][0]["expr"]
    fleet = {p["title"]: p for p in _walk(built["vllm-spark-fleet.json"]["panels"])}
    assert 'floor=~"15(\\\\.0+)?"' in fleet["Fleet capacity at 15 tok/s"]["targets"][0]["expr"]


def test_iter_panel_queries_substitutes_every_variable():
    queries = [q for d in dashboards.build_all().values() for q in iter_panel_queries(d, {"model": "m1"})]
    assert len(queries) > 80
    for dash, title, expr in queries:
        assert "$" not in expr, (dash, title, expr)
    # the collapsed, repeated per-instance row of the fleet dashboard is descended into
    assert any(t.startswith("Tokens/s and plateau") for d, t, _ in queries if d == "vLLM on Spark: fleet")
    assert substitute('rate(x{model_name=~"$model"}[$__rate_interval])', {"model": "a"}) == 'rate(x{model_name=~"a"}[1m])'
    with pytest.raises(KeyError, match=r"\$nosuch"):
        substitute("x{a=\"$nosuch\"}")


def test_every_panel_query_parses_in_prometheus():
    """Run each query against a real (empty) Prometheus: a syntax or type error is a 400 answer."""
    queries = [q for d in dashboards.build_all().values() for q in iter_panel_queries(d)]
    bad = []
    with PrometheusProcess(["127.0.0.1:9"]) as prom:  # nothing listens there; only parsing matters
        for dash, title, expr in queries:
            try:
                prom.query(expr)
            except PromQueryError as exc:
                bad.append(f"{dash} / {title}: {exc}")
        # and the parse check itself can fail
        with pytest.raises(PromQueryError):
            prom.query("sum(rate(x[1m])")
    assert not bad, "\n".join(bad)


def test_cli_writes_checks_and_rejects(tmp_path, capsys):
    parser = __import__("argparse").ArgumentParser()
    cli.add_arguments(parser)
    out, alerts = tmp_path / "d", tmp_path / "a"
    args = parser.parse_args(["--out", str(out), "--alerts-out", str(alerts), "--ttft-slo", "1", "--floor", "15"])
    assert cli.run(args) == 0
    assert sorted(p.name for p in out.iterdir()) == sorted(dashboards.DASHBOARDS)
    assert sorted(p.name for p in alerts.iterdir()) == ["alerting.rules.yml", "recording.rules.yml"]
    serving = json.loads((out / "vllm-spark-serving.json").read_text())
    assert "TTFT SLO 1 s" in serving["description"]
    check = parser.parse_args(["--out", str(out), "--alerts-out", str(alerts), "--ttft-slo", "1", "--floor", "15", "--check"])
    assert cli.run(check) == 0
    (out / "vllm-spark-power.json").write_text("{}\n")
    assert cli.run(check) == 1
    assert "vllm-spark-power.json" in capsys.readouterr().err
    bad = parser.parse_args(["--out", str(out), "--alerts-out", str(alerts), "--ttft-slo", "0"])
    assert cli.run(bad) == 2
    err = capsys.readouterr().err
    assert "--ttft-slo 0" in err and "positive number of seconds" in err


def test_vllm_spark_dashboards_check_passes_on_the_repository():
    from vllm_spark_plugin.cli import main

    assert main(["dashboards", "--out", str(DASHBOARDS), "--alerts-out", str(ROOT / "alerts"), "--check"]) == 0
