"""A real router in front of two real CPU `vllm serve` servers with the plugin: vLLM's router
(`vllm-router` 0.1.17, scripts/router-env.sh) with `--policy power_of_two` reads each server's
GET /get_load, and its share of requests follows the loads the plugin reports.

The two session servers differ in spare capacity by their highest floor, whose capacity is the one
/get_load counts: the main server's is 2,000 tok/s (no stream of the tiny model meets it: capacity 0,
so it is always at or over capacity), the second server's 20 tok/s (it holds dozens of streams
there).  Shares are counted on the servers' side (each server's finished-request counter on
/metrics), not from client timings.
"""
from __future__ import annotations

import threading
import time

import pytest

from support.live_load import drive
from support.prom import PrometheusProcess
from support.scrape import scrape
from vllm_spark_plugin.grafana import dashboards, iter_panel_queries
from vllm_spark_plugin.metrics.load import LOAD_AT_ZERO_SPARE
from vllm_spark_plugin.testbed.router import Router, get_json

pytestmark = pytest.mark.server
P = "vllm_spark_"


def _finished(metrics_url: str) -> float:
    return sum(v for (name, _), v in scrape(metrics_url).items() if name == P + "requests_finished_total")


def _has_capacity(metrics_url: str, floor: str) -> bool:
    return any(name == P + "slo_capacity_streams" and dict(lab).get("floor") == floor
               for (name, lab) in scrape(metrics_url))


@pytest.fixture(scope="module")
def fitted_pair(vllm_server_pair):
    """(roomy, tight): both servers with a capacity verdict at their highest floor: one stream alone,
    then 16 at once on each (so every fit holds steps at batch 1 and 16), then the next refit (10 s)."""
    tight, roomy = vllm_server_pair

    def verdicts():
        return _has_capacity(tight.metrics_url, "2000") and _has_capacity(roomy.metrics_url, "20")

    if not verdicts():
        drive([roomy.base_url, tight.base_url], roomy.model, seconds=8, concurrency=1, max_tokens=32, stagger=0)
        drive([roomy.base_url, tight.base_url], roomy.model, seconds=12, concurrency=16, max_tokens=32, stagger=0)
    deadline = time.monotonic() + 60
    while not verdicts():
        assert time.monotonic() < deadline, "no capacity verdict on both servers within 60 s of the load"
        time.sleep(2)
    return roomy, tight


def test_get_load_is_the_spare_capacity_the_server_reports(fitted_pair):
    a, b = fitted_pair
    def spare(url):
        return next(v for (n, lab), v in scrape(url).items() if n == P + "spare_capacity_streams" and dict(lab)["floor"] == "20")

    for _ in range(3):  # idle: load = LOAD_AT_ZERO_SPARE - spare, the spare gauge at its one floor
        before = spare(a.metrics_url)
        la, lb = get_json(a.base_url + "/get_load")["load"], get_json(b.base_url + "/get_load")["load"]
        if spare(a.metrics_url) == before:  # no refit in between
            break
    assert isinstance(la, int) and isinstance(lb, int) and la >= 0 and lb >= 0
    assert la == max(0, LOAD_AT_ZERO_SPARE - int(before)), (la, before)
    assert lb >= LOAD_AT_ZERO_SPARE > la  # b's capacity at 2,000 tok/s is 0: no spare at all


def test_power_of_two_sends_the_larger_share_to_the_server_with_spare_capacity(fitted_pair, artifacts_dir):
    a, b = fitted_pair
    before = {s.base_url: _finished(s.metrics_url) for s in (a, b)}
    loads: list[tuple[int, int]] = []
    stop = threading.Event()

    def sample():  # what the servers report while the router routes
        while not stop.is_set():
            loads.append((get_json(a.base_url + "/get_load")["load"], get_json(b.base_url + "/get_load")["load"]))
            stop.wait(0.5)

    with Router([a.base_url, b.base_url], policy="power_of_two", poll_seconds=1,
                log_path=artifacts_dir / "vllm-router.log") as router, \
            PrometheusProcess([a.metrics_url, b.metrics_url, router.metrics_url]) as prom:
        time.sleep(3)  # the router's first polls of /get_load
        seen = {w["worker"]: w["load"] for w in get_json(router.base_url + "/get_loads")["workers"]}
        assert set(seen) == {a.base_url, b.base_url} and seen[a.base_url] < seen[b.base_url], seen
        poller = threading.Thread(target=sample, daemon=True)
        poller.start()
        sent = drive([router.base_url], a.model, seconds=15, concurrency=4, max_tokens=16, stagger=0)
        stop.set()
        poller.join()
        decisions = {lab_w: v for (n, lab), v in scrape(router.metrics_url).items()
                     if n == "vllm_router_policy_decisions_total" for k, lab_w in lab if k == "worker"}
        time.sleep(3)  # the last samples scraped
        empty = [f"{title}: {expr}" for title, expr in _router_panel_queries(a.model)
                 if not [r for r in prom.query(expr) if r["value"][1] not in ("NaN", "+Inf", "-Inf")]]
    time.sleep(1)
    served = {url: _finished(s.metrics_url) - before[url] for url, s in ((a.base_url, a), (b.base_url, b))}
    total = served[a.base_url] + served[b.base_url]
    assert total >= sent["requests"] >= 8, (served, sent)
    assert loads and all(la < lb for la, lb in loads), loads  # the plugin ranked a (roomy) first throughout
    share_b = served[b.base_url] / total
    print(f"\nserved through the router: {served} (share of the zero-spare server {share_b:.2f}); "
          f"router decisions {decisions}; loads a/b sampled {loads[:3]}...{loads[-3:]}")
    assert served[a.base_url] > served[b.base_url]
    assert share_b <= 0.1, served  # power of two over two workers: the lower load wins every pick
    assert decisions.get(a.base_url, 0) > decisions.get(b.base_url, 0)
    assert not empty, "fleet-dashboard router panels without data against a real router:\n" + "\n".join(empty)


def _router_panel_queries(model: str) -> list[tuple[str, str]]:
    """The fleet dashboard's router row and its reported-load panel (tests/integration/test_dashboards_live.py
    runs no router and lists them as expected empty)."""
    fleet = dashboards.build_all()["vllm-spark-fleet.json"]
    return [(t, e) for _, t, e in iter_panel_queries(fleet, {"model": model}) if "vllm_router_" in e or "/get_load" in t]


def test_every_api_server_answers_for_the_whole_server(multi_api_server):
    """Two API servers in front of one engine: each new connection may land on either, and every
    answer is the figure of the gauges /metrics shows for the whole server."""
    from vllm_spark_plugin.metrics.load import EngineFigures, server_load
    srv = multi_api_server
    drive([srv.base_url], srv.model, seconds=10, concurrency=8, max_tokens=32, stagger=0.5)
    time.sleep(2)  # idle: the gauges hold still
    samples = scrape(srv.metrics_url)
    engines: dict[str, dict] = {}
    for (name, lab), v in samples.items():
        lab = dict(lab)
        f = engines.setdefault(lab.get("engine", ""), {"capacity": []})
        if name == P + "running_requests":
            f["running"] = int(v)
        elif name == P + "waiting_requests":
            f["waiting"] = int(v)
        elif name == P + "slo_capacity_streams":
            f["capacity"].append(int(v))
    figures = [EngineFigures(f["running"], f.get("waiting", 0), min(f["capacity"], default=None))
               for f in engines.values() if "running" in f]
    assert figures, "no running-requests gauge on /metrics"
    expected = server_load(figures)
    answers = {get_json(srv.base_url + "/get_load")["load"] for _ in range(20)}  # a new connection each
    assert answers == {expected}, (answers, expected, engines)
    print(f"\n20 answers from two API servers: {answers}; from the gauges: {figures}")
