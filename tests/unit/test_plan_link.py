"""`vllm-spark plan --link-rate / --link-rate-from`: the measured link instead of the profile's, and what
a degraded link costs the fleet.  The seed's case is a four-Spark ring at 12.5 Gb/s per link: the
assertions are relations (cost above zero, falling as the rate rises, zero at the profile's link), not
figures fitted to the seed's +27 % / 2x."""
from __future__ import annotations

import http.server
import json
import threading

import pytest
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from vllm_spark_plugin.metrics import names as N
from vllm_spark_plugin.plan import links
from vllm_spark_plugin.plan.arch import load_model
from vllm_spark_plugin.plan.cli import main
from vllm_spark_plugin.plan.deployment import Deployment
from vllm_spark_plugin.plan.formats import component_formats
from vllm_spark_plugin.plan.hardware import load_hardware
from vllm_spark_plugin.plan.links import LinkRateError, parse_rate
from vllm_spark_plugin.plan.planner import make_plan
from vllm_spark_plugin.plan.stepmodel import StepModel

SEED_RING = 12.5e9 / 8      # 12.5 Gb/s per link, bytes/s
PROFILE_LINK = 20e9         # gb10's interconnect.bandwidth_bytes_per_second
CONCURRENCY = (1, 4, 16, 64)


def dep(model="Llama-3.3-70B", rate=None, **kw):
    arch, doc = load_model(model)
    hw = load_hardware("gb10")
    if rate is not None:
        hw = hw.with_link_rate(rate, "test")
    return Deployment(arch=arch, hw=hw, weight_format="nvfp4", formats=component_formats("nvfp4"), kv_dtype="bf16",
                      context=4096, os_reserve_bytes=hw.os_reserve_bytes, model_routing=doc.get("routing") or {}, **kw)


def link_of(rate, model="Llama-3.3-70B", **kw) -> dict:
    return make_plan(dep(model, rate=rate, **kw), concurrencies=CONCURRENCY)["fleet"]["link"]


def plan(capsys, *args, rc=0) -> tuple[str, str]:
    """`vllm-spark plan ARGS` in this process: (stdout, stderr); argparse's refusals exit 2 too."""
    try:
        code = main(list(args))
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert code == rc, err + out
    return out, err


# -- the rate and its sources -----------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("12.5Gbit", SEED_RING), ("12.5Gb/s", SEED_RING), ("12.5 Gbit/s", SEED_RING), ("100Gbps", 12.5e9),
    ("1.5GB/s", 1.5e9), ("1.5GBps", 1.5e9), ("1.5e9", 1.5e9), ("200000Mbit", 25e9), ("1500MB/s", 1.5e9),
])
def test_rates_with_units(text, expected):
    assert parse_rate(text) == pytest.approx(expected)


@pytest.mark.parametrize("text, says", [
    ("12.5G", "has no unit: say 12.5Gbit for bits/s or 12.5GB/s"),
    ("12.5", "not a plausible link rate; give a unit"),
    ("fast", "is not a link rate"),
    ("-3Gbit", "is not a link rate"),
    ("0Gbit", "positive, finite"),
    ("1e400", "positive, finite"),
    ("9000TB/s", "above any link's rate"),
])
def test_bad_rates_are_named(text, says):
    with pytest.raises(LinkRateError) as err:
        parse_rate(text)
    assert says in str(err.value), str(err.value)


def test_the_metric_read_is_the_public_one():
    assert links.LINK_RATE_METRIC == N.LINK_RATE


def _exposition(rates: dict[str, float]) -> str:
    registry = CollectorRegistry()
    g = Gauge(N.LINK_RATE, "negotiated rate", ["interface"], registry=registry)
    for interface, rate in rates.items():
        g.labels(interface).set(rate)
    Gauge("vllm_spark_other", "something else", registry=registry).set(1)
    return generate_latest(registry).decode()


def test_metrics_text_gives_the_slowest_negotiated_link(tmp_path):
    path = tmp_path / "metrics.txt"
    path.write_text(_exposition({"enp1s0f0np0": 25e9, "enp1s0f1np1": 12.5e9}))
    rate = links.read_source(str(path))
    assert rate.bytes_per_second == 12.5e9
    assert "enp1s0f1np1, the slowest" in rate.source and "enp1s0f0np0" in rate.source


def test_metrics_without_link_series_and_garbage_are_refused(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text(_exposition({}))
    with pytest.raises(LinkRateError, match=f"no {N.LINK_RATE} sample.*SPARK_PLUGIN_LINKS"):
        links.read_source(str(empty))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(LinkRateError, match="not valid JSON"):
        links.read_source(str(broken))
    with pytest.raises(LinkRateError, match="cannot read .*No such file"):
        links.read_source(str(tmp_path / "missing"))
    with pytest.raises(LinkRateError, match="only http:// and https://"):
        links.read_source("ftp://spark-1/metrics")


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self):  # noqa: N802 (the stdlib's name)
        if self.path != "/metrics":
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    _Handler.body = _exposition({"enp1s0f0np0": 10e9}).encode()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(5)


def test_a_metrics_url_is_read(metrics_server):
    assert links.read_source(metrics_server + "/metrics").bytes_per_second == 10e9
    with pytest.raises(LinkRateError, match="HTTP 404"):
        links.read_source(metrics_server + "/nothing")


def test_an_unreachable_url_is_named():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]   # bound, not listening: the connection is refused
        with pytest.raises(LinkRateError, match=f"cannot read http://127.0.0.1:{port}/metrics"):
            links.read_source(f"http://127.0.0.1:{port}/metrics")


def test_a_real_probe_report_over_loopback(tmp_path, capsys):
    """`vllm-spark doctor --link-probe 127.0.0.1 --json` against a local server, bounded to 0.5 s and 64 MiB."""
    from vllm_spark_plugin.doctor.link_probe import run_probe
    from vllm_spark_plugin.doctor.link_server import LinkServer
    from vllm_spark_plugin.doctor.link_wire import Limits

    limits = Limits(seconds=0.5, bytes=64 << 20, streams=1)
    server = LinkServer("127.0.0.1", 0, limits)
    thread = threading.Thread(target=server.serve, args=(1,), daemon=True)
    thread.start()
    try:
        assert run_probe(f"127.0.0.1:{server.address[1]}", limits, as_json=True) == 0
    finally:
        thread.join(10)
        server.close()
    report = tmp_path / "probe.json"
    report.write_text(capsys.readouterr().out)
    achieved = json.loads(report.read_text())["probe"]["achieved_bytes_per_second"]
    rate = links.read_source(str(report))
    assert rate.bytes_per_second == achieved > 0
    assert "TCP throughput the probe achieved to 127.0.0.1 over lo" in rate.source


def test_a_failed_probe_report_says_why(tmp_path):
    report = tmp_path / "probe.json"
    report.write_text(json.dumps({"ok": False, "error": "spark-2:7471 refused the connection"}))
    with pytest.raises(LinkRateError, match="the probe did not measure: spark-2:7471 refused"):
        links.read_source(str(report))
    report.write_text(json.dumps({"ok": True, "probe": {"achieved_bytes_per_second": "fast"}}))
    with pytest.raises(LinkRateError, match="is 'fast', not a number"):
        links.read_source(str(report))


# -- the model ------------------------------------------------------------------------------------

def test_the_measured_rate_caps_the_collective_by_hand():
    hw = load_hardware("gb10")
    slow = hw.with_link_rate(SEED_RING, "test")
    n, ring = 65536, 1.5   # a decode all-reduce of a four-Spark ring
    assert hw.collective_seconds(n, ring) == pytest.approx(24.5e-6 + n / 1.61e9)
    assert slow.collective_seconds(n, ring) == pytest.approx(24.5e-6 + ring * n / SEED_RING)
    big = 64 << 20
    assert slow.collective_seconds(big, ring) == pytest.approx(
        24.5e-6 + ring * (1 << 20) / SEED_RING + ring * (big - (1 << 20)) / SEED_RING)
    # at or above the profile's own link the profile's figures stand
    assert hw.with_link_rate(PROFILE_LINK).collective_seconds(big, ring) == hw.collective_seconds(big, ring)


def test_seed_ring_costs_throughput_and_prefill():
    # a MoE model over four Sparks, like the seed's DeepSeek ring (no DeepSeek model file is built in)
    link = link_of(SEED_RING, model="gpt-oss-120b", tp=4)
    assert link["enters"] and link["rate_bytes_per_second"] == SEED_RING
    assert 0 < link["throughput_cost_share"] < 1 and 0 < link["prefill_cost_share"] < 1
    assert link["aggregate_tokens_per_second_at_measured"] < link["aggregate_tokens_per_second_at_nominal"]
    assert link["capacity_streams_at_measured"] <= link["capacity_streams_at_nominal"]
    # prefill moves megabyte collectives: the link's bandwidth weighs more there than in decode
    assert link["prefill_cost_share"] > link["throughput_cost_share"]
    # more streams, bigger collectives, a larger share of the step on the slow link
    costs = [c["cost_share"] for c in link["curve"]]
    assert costs == sorted(costs) and costs[0] > 0


def test_pipeline_ring_costs_too():
    link = link_of(SEED_RING, pp=4)
    assert link["enters"] and link["throughput_cost_share"] > 0 and link["prefill_cost_share"] > 0


def test_cost_falls_as_the_rate_rises_and_is_zero_at_the_profile_link():
    rates = [0.5e9, SEED_RING, 5e9, 12.5e9, PROFILE_LINK, 25e9]
    costs = [link_of(r, tp=4)["throughput_cost_share"] for r in rates]
    prefill = [link_of(r, tp=4)["prefill_cost_share"] for r in rates]
    for series in (costs, prefill):
        assert all(a >= b for a, b in zip(series, series[1:])), series
        assert series[0] > series[1] > 0
        assert series[-2] == pytest.approx(0, abs=1e-12) and series[-1] == pytest.approx(0, abs=1e-12)


def test_the_plan_itself_runs_at_the_measured_rate():
    healthy = make_plan(dep(tp=4), concurrencies=CONCURRENCY)
    slow = make_plan(dep(rate=SEED_RING, tp=4), concurrencies=CONCURRENCY)
    assert healthy["fleet"]["link"] is None
    for h, s in zip(healthy["curve"], slow["curve"]):
        assert s["aggregate_tokens_per_second"] < h["aggregate_tokens_per_second"]
    assert slow["hardware"]["interconnect"]["measured_rate_bytes_per_second"] == SEED_RING
    link = slow["fleet"]["link"]
    # the cost's nominal side is the plan without the measured rate
    assert link["aggregate_tokens_per_second_at_nominal"] == pytest.approx(
        StepModel(dep(tp=4)).aggregate_rate(link["reference_concurrency"]))
    assert link["capacity_streams_at_nominal"] == healthy["fleet"]["capacity_streams"]
    assert link["capacity_streams_at_measured"] == slow["fleet"]["capacity_streams"]


def test_one_spark_per_replica_accepts_the_rate_and_says_it_does_not_enter():
    for kw in ({}, {"dp": 4}):
        healthy = make_plan(dep(**kw), concurrencies=CONCURRENCY)
        slow = make_plan(dep(rate=SEED_RING, **kw), concurrencies=CONCURRENCY)
        link = slow["fleet"]["link"]
        assert link["enters"] is False and "does not enter" in link["note"]
        assert "throughput_cost_share" not in link
        assert slow["curve"] == healthy["curve"]


# -- the command ------------------------------------------------------------------------------------

def test_cli_reports_the_cost_of_the_seed_ring(capsys):
    out, _ = plan(capsys, "--model", "Llama-3.3-70B", "--tp", "4", "--link-rate", "12.5Gbit")
    line = next(l for l in out.splitlines() if l.startswith("Link: "))
    assert "1.56 GB/s (12.5 Gbit/s) from --link-rate 12.5Gbit, against the profile's 20 GB/s" in line
    assert "of the predicted throughput" in line and "prefill" in line


def test_cli_one_spark_and_bad_input(tmp_path, capsys):
    out, _ = plan(capsys, "--model", "Llama-3.1-8B", "--link-rate", "100Gbit")
    assert "the link does not enter the prediction: one Spark per replica" in out
    _, err = plan(capsys, "--model", "Llama-3.1-8B", "--tp", "2", "--link-rate", "12.5G", rc=2)
    assert "argument --link-rate: '12.5G' has no unit" in err
    _, err = plan(capsys, "--model", "Llama-3.1-8B", "--tp", "2", "--link-rate-from", str(tmp_path / "none"), rc=2)
    assert err.startswith("vllm-spark plan: error: cannot read") and "No such file" in err


def test_cli_reads_metrics_and_takes_the_slower_of_both(tmp_path, capsys):
    path = tmp_path / "metrics.txt"
    path.write_text(_exposition({"enp1s0f0np0": 25e9, "enp1s0f1np1": 12.5e9}))
    out, _ = plan(capsys, "--model", "Llama-3.1-8B", "--tp", "2", "--link-rate-from", str(path), "--json")
    assert json.loads(out)["fleet"]["link"]["rate_bytes_per_second"] == 12.5e9
    out, _ = plan(capsys, "--model", "Llama-3.1-8B", "--tp", "2", "--link-rate-from", str(path),
                  "--link-rate", "12.5Gbit", "--json")
    both = json.loads(out)["fleet"]["link"]
    assert both["rate_bytes_per_second"] == SEED_RING
    assert both["source"].startswith("--link-rate 12.5Gbit, the slower of it and") and "enp1s0f1np1" in both["source"]
