"""`vllm-spark check` against the session's real CPU vLLM server: doctor, `bench --levels auto` and the
planner's prediction for the served model (planned from the folder the server loaded it from).

Gated only on what holds by construction (two wall-clock measurements on shared cores are never
raced): the search ends within its budget with every point marked, the profile is written and valid,
the JSON and HTML carry the side-by-side fields, the exit status follows doctor, and the report
reads at 1280 and 800 px."""
from __future__ import annotations

import csv
import json

import pytest
from support.cores import client_core
from support.layout import assert_reads_at

from vllm_spark_plugin.cli import main as vllm_spark

pytestmark = pytest.mark.server
MINUTES = 2.5
QUANTITIES = ("per-stream rate at", "aggregate at", "plateau", "knee K", "capacity at 100 tok/s", "TTFT p50 at")


@pytest.fixture(scope="module")
def check(vllm_server, tmp_path_factory):
    out = tmp_path_factory.mktemp("check")
    with client_core(vllm_server) as own_core:  # its sweep's client times streams: a core of its own
        rc = vllm_spark(["check", "--endpoint", vllm_server.base_url, "--minutes", str(MINUTES), "--prompt-tokens",
                         "64", "--output-tokens", "32", "--floor", "100", "--out", str(out), "--",
                         "serve", vllm_server.model, "--enforce-eager"])
    assert own_core, "the client could not get a core of its own"
    return rc, out, json.loads((out / "check.json").read_text())


def test_exit_status_follows_doctor(check):
    rc, _, doc = check
    assert rc == (0 if doc["doctor"]["ok"] else 1) == doc["exit_status"]
    assert doc["bench"]["exit_status"] == 0 and doc["doctor"]["checks"]
    assert doc["verdict"].startswith("check passed" if rc == 0 else "check FAILED")


def test_the_search_ends_within_its_budget_with_every_point_marked(check):
    _, out, doc = check
    sizing, search = doc["sizing"], doc["bench"]["search"]
    assert search["points"] <= 16 and max(search["order"]) <= sizing["max_concurrency"]
    assert doc["seconds"] <= MINUTES * 60 + 60  # the last point may run past the budget; no more than that
    rows = list(csv.DictReader(open(out / "bench" / "sweep.csv", newline="")))
    points = [r for r in rows if r["row_type"] == "point"]
    assert [int(p["concurrency"]) for p in points] == search["order"]
    assert all(r["search_phase"] in ("start", "grow", "bisect") and r["search_reason"] for r in rows)
    # each point was started while the time spent was within the budget
    assert sum(float(p["duration_s"]) for p in points[:-1]) <= sizing["budget_seconds"]
    assert search["stop_reason"] and search["decisions"][-1]["concurrency"] is None


def test_the_profile_is_the_one_the_plugin_watches(check):
    _, out, doc = check
    profile = json.loads((out / "bench" / "capacity_profile.json").read_text())
    assert profile["levels"] == "auto" and profile["model"] == doc["server"]["model"]
    assert "100" in profile["capacity"] and profile["search"]["boundaries"][0]["label"] == "100 tok/s floor"
    from prometheus_client import CollectorRegistry

    from vllm_spark_plugin.metrics import instruments, knee_gauges
    assert knee_gauges.load_profile(instruments.Instruments(CollectorRegistry()), "m", str(out / "bench" / "capacity_profile.json"))


def test_prediction_sits_beside_the_measurement(check, vllm_server):
    _, out, doc = check
    pred = doc["prediction"]
    assert pred is not None and pred["weight_format"] == "bf16"  # the tiny model's own config.json
    assert doc["server"]["root"] == pred["model"]
    rows = doc["comparison"]
    for q in QUANTITIES:
        assert any(r["quantity"].startswith(q) for r in rows), q
    first = rows[0]
    assert first["measured"] is not None and first["predicted"] is not None and first["ratio"] is not None
    html = (out / "report.html").read_text()
    assert "Prediction beside measurement" in html and "Doctor" in html
    assert html.count('src="data:image/png;base64,') == 2


@pytest.mark.parametrize("width", [1280, 800])
def test_the_reports_read_at_1280_and_800_px(check, width, tmp_path):
    _, out, _ = check
    assert_reads_at(out / "report.html", width, tmp_path)
    assert_reads_at(out / "bench" / "report.html", width, tmp_path)
