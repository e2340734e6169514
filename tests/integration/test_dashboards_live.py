"""Every dashboard panel query and every recording rule against a real Prometheus that scraped a real
CPU `vllm serve` with the plugin under streaming load (8 concurrent streams, about 20 s).

What cannot have data here is listed in EXPECTED_EMPTY with the reason; every other query must return
at least one non-NaN sample.  Nothing is faked: the only difference from a Spark is the hardware.
"""
from __future__ import annotations

import math
import time
import urllib.parse
from pathlib import Path

import pytest
import yaml

from support.live_load import drive
from support.prom import PrometheusProcess, PromQueryError
from vllm_spark_plugin.grafana import dashboards, iter_panel_queries

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
RULE_FILES = [ROOT / "alerts" / "recording.rules.yml", ROOT / "alerts" / "alerting.rules.yml"]

# substring of the query -> why it has no data on the CPU test bed
EXPECTED_EMPTY: dict[str, str] = {
    "vllm_spark_gpu_": "no NVML on the CPU test bed: GPU power, energy, clocks, temperature, utilisation "
                       "and clock-event series are absent by design",
    "vllm_spark_profile_": "the test server runs without an offline sweep profile (SPARK_PLUGIN_PROFILE unset)",
    "instance:vllm_spark_gpu_": "recorded from the GPU series above",
    "predicted_by_fit_1h_ago": "uses `offset 1h`: needs an hour of history",
    "vllm_spark_nvrm_": "the test server's kernel-log source is unreadable on purpose (SPARK_PLUGIN_KERNEL_LOG in "
                        "tests/conftest.py), so no NVRM event series exist",
    "instance:vllm_spark_nvrm_": "recorded from the NVRM event series above",
    "spec_decode": "the main test server runs without speculative decoding, so vLLM exports no vllm:spec_decode_* "
                   "counters; tests/integration/test_spec_decode.py runs these panels and rules against an n-gram server",
    "vllm_spark_guard_": "the main test server runs with the SLO guard off (SPARK_PLUGIN_GUARD unset, the default), and "
                         "the guard's series are absent while it is off; tests/contract/test_guard_scheduler.py "
                         "checks the values they carry",
    "vllm_spark_capacity_ttft_streams": "the TTFT capacity is unknown (absent) while TTFT stays within the SLO at "
                                        "every observed batch, as under this light load (verdict gauge says so)",
    "vllm_spark_link_": "no interface is selected on a box without RDMA devices or NCCL/Gloo interface variables "
                        "(SPARK_PLUGIN_LINKS=auto, NCCL_SOCKET_IFNAME / NCCL_IB_HCA / GLOO_SOCKET_IFNAME unset), so the "
                        "per-interface link series (and the links' recording rules) are absent; "
                        "tests/integration/test_link_panels_promtool.py evaluates the Links row over link counters with promtool",
    "vllm_router_": "no router runs in front of this test's server; tests/integration/test_router.py runs the fleet "
                    "dashboard's router panels against a real vllm-router",
}
if not Path("/proc/pressure/memory").exists():
    EXPECTED_EMPTY["vllm_spark_memory_pressure_ratio"] = "this kernel exposes no /proc/pressure/memory (PSI)"
    EXPECTED_EMPTY["instance:vllm_spark_memory_pressure"] = "recorded from the PSI series"


def _why_empty(expr: str) -> str | None:
    for key, reason in EXPECTED_EMPTY.items():
        if key in expr:
            return reason
    return None


def _has_data(result: list) -> bool:
    for series in result:
        values = series.get("values") or [series.get("value")]
        if any(v and not math.isnan(float(v[1])) for v in values):
            return True
    return False


@pytest.fixture(scope="module")
def loaded(vllm_server):
    """Prometheus scraping the server every second, rules loaded, after ~20 s of streaming load."""
    hostport = urllib.parse.urlsplit(vllm_server.metrics_url).netloc
    with PrometheusProcess([vllm_server.metrics_url], rule_files=RULE_FILES) as prom:
        prom.wait_for('up{job="vllm"} == 1', timeout=60)
        start = time.time()
        counts = drive([vllm_server.base_url], vllm_server.model, seconds=20, concurrency=8, max_tokens=32)
        assert counts["requests"] >= 8, counts
        time.sleep(4)  # the last scrapes and rule evaluations after the load
        yield prom, start, hostport, counts


def test_every_panel_query_runs_and_returns_data(loaded, vllm_server):
    prom, start, hostport, counts = loaded
    variables = {"model": vllm_server.model, "instance": hostport.replace(".", "\\\\.")}
    end = time.time()
    missing, broken, allowed = [], [], []
    n = 0
    for d in dashboards.build_all().values():
        for dash, title, expr in iter_panel_queries(d, variables):
            n += 1
            try:
                result = prom.query_range(expr, start, end, step=2)
            except PromQueryError as exc:
                broken.append(f"{dash} / {title}: {exc}")
                continue
            if _has_data(result):
                continue
            reason = _why_empty(expr)
            (allowed if reason else missing).append(f"{dash} / {title}: {expr}" + (f"  [{reason}]" if reason else ""))
    print(f"\n{n} panel queries; load: {counts}; allowed empty ({len(allowed)}):\n  " + "\n  ".join(allowed))
    assert not broken, "queries Prometheus rejected:\n" + "\n".join(broken)
    assert not missing, "queries with no data (and no reason to be empty):\n" + "\n".join(missing)
    assert n > 80


def test_every_recording_rule_has_data(loaded):
    prom, *_ = loaded
    records = [r["record"] for g in yaml.safe_load(RULE_FILES[0].read_text())["groups"] for r in g["rules"]]
    missing = []
    for name in records:
        if not _has_data(prom.query(name)) and not _why_empty(name):
            missing.append(name)
    assert not missing, f"recording rules without data after the load: {missing}"
    groups = {g["name"]: g for g in prom.rule_groups()}
    unhealthy = [r["name"] for g in groups.values() for r in g["rules"] if r.get("health") not in ("ok", None)]
    assert not unhealthy, unhealthy


def test_vllm_series_names_as_prometheus_stores_them(loaded):
    prom, *_ = loaded
    res = prom.query('{__name__=~"vllm[:_]num_requests_running"}')
    names = {s["metric"]["__name__"] for s in res}
    assert names and names <= {"vllm:num_requests_running", "vllm_num_requests_running"}, names
    print(f"\nvLLM's gauge is stored as {sorted(names)}")


def test_generation_rate_matches_the_load(loaded):
    """The dashboards' headline number is right: tokens/s from the plugin's counter is the tokens the
    client received (32 per request, ignore_eos) over the load, within scrape granularity."""
    prom, start, _, counts = loaded
    res = prom.query(f"sum(increase(vllm_spark_generation_tokens_total[{int(time.time() - start) + 5}s]))")
    generated = float(res[0]["value"][1])
    expected = counts["requests"] * 32
    assert expected * 0.8 <= generated <= expected * 1.3, (generated, expected)


def test_print_headline_figures(loaded, vllm_server):
    """Not a benchmark: the figures the serving dashboard's top row showed right after the load, for
    the record (docs/observability.md), plus any errors the plugin contained."""
    prom, start, hostport, counts = loaded
    serving = dashboards.build_all()["vllm-spark-serving.json"]
    variables = {"model": vllm_server.model, "instance": hostport.replace(".", "\\\\."), "__rate_interval": "30s"}
    at = time.time() - 5
    lines = []
    for _, title, expr in iter_panel_queries(serving, variables)[:6]:
        res = prom.query(expr, at)
        lines.append(f"{title}: {[round(float(s['value'][1]), 3) for s in res]}")
    errs = prom.query("sum by (where) (vllm_spark_plugin_errors_total)")
    lines.append(f"plugin errors: {[(s['metric'].get('where'), s['value'][1]) for s in errs]}")
    print("\n" + "\n".join(lines))
    assert len(lines) == 7
