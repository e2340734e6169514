"""Contained failures in the engine core (a process that exports nothing) reach the API server's
`vllm_spark_plugin_errors_total`: a start-up failure and per-step hook failures, injected at two
narrow seams of the plugin's own code (tests/support/faults) into the second test server."""
from __future__ import annotations

import re
import time

import pytest

from support.load import run_streams
from support.scrape import scrape, value

pytestmark = pytest.mark.server
P = "vllm_spark_"


def errors_by_where(server) -> dict:
    return {dict(lab).get("where"): v for (n, lab), v in scrape(server.metrics_url).items()
            if n == P + "plugin_errors_total"}


def test_engine_core_errors_reach_the_api_servers_metrics(second_vllm_server):
    server = second_vllm_server
    streams = run_streams(server.base_url, server.model, 8, max_tokens=256, prompt_prefix="faults")
    assert all(s.error is None for s in streams)  # serving is unaffected
    deadline = time.monotonic() + 20  # the engine core spills within 1 s, the API server absorbs every 1 s
    errs = errors_by_where(server)
    while time.monotonic() < deadline and not (errs.get("tuned_configs") and errs.get("scheduler_hook")):
        time.sleep(0.5)
        errs = errors_by_where(server)
    assert errs.get("tuned_configs", 0) >= 1, errs       # the start-up failure
    # one hook record in `every` fails: of N records, N // every are counted errors and the rest are steps
    every = int(server.env["SPARK_TEST_FAULT_EVERY"])
    def failed_and_steps():
        return (errors_by_where(server).get("scheduler_hook", 0),
                value(scrape(server.metrics_url), P + "step_duration_seconds_count"))
    failed, steps = failed_and_steps()
    while time.monotonic() < deadline + 10 and failed != (failed + steps) // every:
        time.sleep(0.5)
        failed, steps = failed_and_steps()
    assert failed >= 1 and failed == (failed + steps) // every, (failed, steps)
    log = server.log_path.read_text(errors="replace")
    engine_lines = re.findall(r"EngineCore.*contained error in scheduler_hook", log)
    assert len(engine_lines) == 1  # logged once, counted every time
