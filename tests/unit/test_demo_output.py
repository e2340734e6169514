"""What `vllm-spark demo` prints about the knee: the live fit read from /metrics text, the wait for a
refit that has the sweep's steps, and the offline and live estimates side by side with their ratio."""
from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from vllm_spark_plugin.metrics import names as N
from vllm_spark_plugin.testbed import demo

LIVE = f"""# TYPE {N.KNEE_FIT_SAMPLES} gauge
{N.KNEE_FIT_SAMPLES}{{model_name="m",engine="0"}} 2867
# TYPE {N.KNEE_VERDICT} gauge
{N.KNEE_VERDICT}{{model_name="m",engine="0",verdict="ok"}} 1
{N.KNEE_VERDICT}{{model_name="m",engine="0",verdict="too few points"}} 0
# TYPE {N.KNEE_BATCH} gauge
{N.KNEE_BATCH}{{model_name="m",engine="0"}} 19.2
# TYPE {N.MAX_THROUGHPUT} gauge
{N.MAX_THROUGHPUT}{{model_name="m",engine="0"}} 6906
# TYPE {N.CAPACITY_STREAMS} gauge
{N.CAPACITY_STREAMS}{{model_name="m",engine="0",floor="20"}} 300
{N.CAPACITY_STREAMS}{{model_name="m",engine="0",floor="60"}} 98
# TYPE {N.KNEE_FIT_R2} gauge
{N.KNEE_FIT_R2}{{model_name="m",engine="0"}} 0.79
"""
BEFORE_REFIT = f"""# TYPE {N.KNEE_FIT_SAMPLES} gauge
{N.KNEE_FIT_SAMPLES}{{model_name="m",engine="0"}} 0
# TYPE {N.KNEE_VERDICT} gauge
{N.KNEE_VERDICT}{{model_name="m",engine="0",verdict="too few points"}} 1
"""
SUMMARY = {"curves": [{"capacity": {"60": 81}, "points": [{}] * 10,
                       "knee": {"knee": 16.0, "ci": {"knee": [12.5, 21.0]}, "verdict": "ok",
                                "plateau_tokens_per_second": 5000.0},
                       "search": {"boundaries": [{"kind": "floor", "threshold": 60.0, "status": "known to one stream",
                                                  "bisection_probes": 3}]}}]}


def test_live_fit_is_read_at_the_demo_floor():
    live = demo.live_knee(LIVE, 60.0)
    assert live.ready and (live.samples, live.verdict, live.knee, live.plateau, live.capacity) == (2867, "ok", 19.2, 6906, 98)
    early = demo.live_knee(BEFORE_REFIT, 60.0)
    assert not early.ready and early.samples == 0 and early.verdict == "too few points"


def test_the_knee_block_sets_offline_beside_live_with_the_ratio():
    offline = demo.offline_knee(SUMMARY, 60.0)
    lines = demo.offline_lines(offline, 60.0)
    assert lines[0].startswith("  knee K = 16.0 streams [12.5, 21.0] (95% bootstrap interval), plateau 5000 tok/s")
    assert lines[1].startswith("  capacity at 60 tok/s: 81 streams (81 meets the floor, 82 misses it; 10 levels")
    block = demo.knee_block(offline, demo.live_knee(LIVE, 60.0), 60.0)
    assert block[1].split() == ["knee", "K", "(streams)", "16.0", "19.2", "1.20"]
    assert block[2].split() == ["plateau", "(tok/s)", "5000", "6906", "1.38"]
    assert block[3].split()[-3:] == ["81", "98", "1.21"]
    assert block[4].split() == ["verdict", "ok", "ok"]


@pytest.fixture
def metrics_server():
    """/metrics that answers BEFORE_REFIT twice, then LIVE (a refit arriving while the demo waits)."""
    pages = [BEFORE_REFIT, BEFORE_REFIT, LIVE]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = (pages.pop(0) if len(pages) > 1 else pages[0]).encode()
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/metrics"
    srv.shutdown()


def test_the_demo_waits_for_the_refit(metrics_server):
    live, waited, why = demo.wait_for_live_knee(metrics_server, 60.0, timeout=10.0, poll=0.05)
    assert why == "refit done" and live.knee == 19.2 and waited < 10.0


def test_a_refit_that_never_comes_is_said_so(tmp_path):
    import http.server
    srv = HTTPServer(("127.0.0.1", 0), type("H", (http.server.BaseHTTPRequestHandler,), {
        "do_GET": lambda self: (self.send_response(200), self.end_headers(), self.wfile.write(BEFORE_REFIT.encode())),
        "log_message": lambda self, *a: None}))
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        live, waited, why = demo.wait_for_live_knee(f"http://127.0.0.1:{srv.server_address[1]}/metrics", 60.0,
                                                    timeout=0.2, poll=0.05)
    finally:
        srv.shutdown()
    assert why == "gave up after 0 s: no step samples reached the live fit" and not live.ready


def test_the_demo_floor_is_any_positive_rate():
    import argparse
    assert demo._floor("60") == 60.0 and demo._floor("55.5") == 55.5  # off the default bucket bounds too
    for bad in ("0", "-5", "fast"):
        with pytest.raises(argparse.ArgumentTypeError, match=repr(bad)):
            demo._floor(bad)
