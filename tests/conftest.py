"""Session-wide test bed: the tiny local model and real CPU vLLM servers, each started once.

Servers are expensive (1-3 minutes to start on 2 cores), so every fixture here is session-scoped and
lazily started: a run that selects no server test starts none.
"""
from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIERS = ("unit", "contract", "integration")
UNREADABLE_KERNEL_LOG = "/nonexistent/kmsg"  # the main server's kernel-log source: missing on purpose
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared helpers: `from support.x import ...`
pytest_plugins = ["support.registry",  # the `fresh` fixture: a registry of the test's own
                  "support.fake_bench"]  # the `fake` fixture: fake OpenAI servers on the wall clock


def pytest_collection_modifyitems(config, items):
    """Each test carries the marker of its tier, from the folder it lives in."""
    for item in items:
        tier = Path(str(item.fspath)).parent.name
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))


@pytest.fixture(scope="session", autouse=True)
def _client_priority(request):
    """Streaming clients in tests time token arrivals: let them preempt the engine's compute."""
    if any(item.get_closest_marker("integration") for item in request.session.items):
        from vllm_spark_plugin.testbed.server import prioritize_client
        prioritize_client()


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    """Server logs and outputs of this test session (SPARK_TEST_ARTIFACTS to keep them somewhere)."""
    path = os.environ.get("SPARK_TEST_ARTIFACTS")
    if path:
        Path(path).mkdir(parents=True, exist_ok=True)
        return Path(path)
    return Path(tempfile.mkdtemp(prefix="vllm-spark-test-"))


@pytest.fixture(scope="session")
def tiny_model_path() -> Path:
    """The tiny model, built once per machine into the user cache (deterministic, atomic)."""
    from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model
    return ensure_tiny_model()


def _start(model_path, artifacts_dir, name, **kw):
    from vllm_spark_plugin.testbed.server import VllmServer
    server = VllmServer(model_path=str(model_path), log_path=artifacts_dir / f"{name}.log", **kw)
    server.start(timeout=float(os.environ.get("SPARK_TEST_SERVER_TIMEOUT", "900")))
    server.prioritize_frontend()
    return server


@pytest.fixture(scope="session")
def otlp_receiver():
    from support.otlp_receiver import OtlpReceiver
    rx = OtlpReceiver().start()
    yield rx
    rx.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_path, artifacts_dir, otlp_receiver):
    """The main CPU `vllm serve` with the plugin (shared by every server test).

    Its OpenTelemetry bridge is on, exporting to a real OTLP/HTTP receiver every 5 s.  Its latency SLO
    (TTFT 25 s, floors 20 and 2,000 tok/s: one met easily, one never) is what test_slo_e2e.py judges by;
    the TTFT SLO and the 250 tok/s floor are off the histograms' default bounds, so the rules generated
    with them read buckets only the configured SLO creates (test_slo_e2e.py).
    """
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-main",
                    env={"SPARK_PLUGIN_OTEL_ENDPOINT": otlp_receiver.endpoint,
                         "SPARK_PLUGIN_OTEL_INTERVAL_SECONDS": "5",
                         "SPARK_PLUGIN_TTFT_SLO_SECONDS": "25", "SPARK_PLUGIN_FLOORS": "20,250,2000",
                         # an unreadable kernel log, as in a container (test_memory_live.py)
                         "SPARK_PLUGIN_KERNEL_LOG": UNREADABLE_KERNEL_LOG})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def second_vllm_server(tiny_model_path, artifacts_dir):
    """A second plugin server on another loopback port (fleet tests).  Its engine core carries
    injected faults (tests/support/faults): a failing start-up step and one failing hook record in
    50, so the errors of a process without an exporter are seen on the API server's /metrics.
    A second server alive while test_exporter_e2e.py times streams on two cores makes them bursty:
    the tests that use it (test_fleet_live.py, test_injected_faults.py) come after it in file order."""
    faults = Path(__file__).resolve().parent / "support" / "faults"
    path = os.pathsep.join(p for p in (str(faults), os.environ.get("PYTHONPATH", "")) if p)
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-second",
                    env={"PYTHONPATH": path, "SPARK_TEST_FAULTS": "1", "SPARK_TEST_FAULT_EVERY": "50"})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def multi_api_server(tiny_model_path, artifacts_dir):
    """Two API-server processes in front of one engine (prometheus-client multiprocess mode)."""
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-multi-api", extra_args=["--api-server-count", "2"])
    yield server
    server.stop()


# n-gram (prompt lookup) speculation: the method that runs on the CPU build with nothing else
# installed (docs/speculative.md); up to 3 draft tokens per step, matches of 1 to 3 tokens.
NGRAM_SPECULATIVE_CONFIG = {"method": "ngram", "num_speculative_tokens": 3,
                            "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="session")
def spec_decode_server(tiny_model_path, artifacts_dir):
    """A plugin server with n-gram speculative decoding (test_spec_decode.py).  The knee is refitted
    every 2 s so its gauges follow a short load."""
    import json
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-spec-ngram",
                    extra_args=["--speculative-config", json.dumps(NGRAM_SPECULATIVE_CONFIG)],
                    env={"SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"})
    yield server
    server.stop()


SLO_BOUNDARY_TTFT_SECONDS = 0.5


@pytest.fixture(scope="module")
def slo_boundary_server(tiny_model_path, artifacts_dir):
    """A plugin server whose TTFT SLO falls inside what a queue makes requests wait (test_slo_e2e.py):
    at most 4 running requests, TTFT SLO 0.5 s, floor 20 tok/s.  Stopped after its module, so no
    later timing test shares the cores with it."""
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-slo-boundary", extra_args=["--max-num-seqs", "4"],
                    env={"SPARK_PLUGIN_TTFT_SLO_SECONDS": str(SLO_BOUNDARY_TTFT_SECONDS),
                         "SPARK_PLUGIN_FLOORS": "20"})
    yield server
    server.stop()


# A floor no stream of the tiny model reaches: the guard's cap sits at its minimum, one stream, so
# admissions are one at a time (test_guard_served.py).
PRIORITY_GUARD_FLOOR = "2000"


@pytest.fixture(scope="module")
def priority_guard_server(tiny_model_path, artifacts_dir):
    """A plugin server with vLLM's priority scheduling and the admission guard at a floor that binds
    (test_guard_served.py).  Stopped after its module, so no later timing test shares the cores."""
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-priority-guard",
                    extra_args=["--scheduling-policy", "priority"],
                    env={"SPARK_PLUGIN_GUARD": "admission", "SPARK_PLUGIN_FLOORS": PRIORITY_GUARD_FLOOR,
                         "SPARK_PLUGIN_KNEE_REFIT_SECONDS": "2"})
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_server_pair(vllm_server, second_vllm_server):
    return vllm_server, second_vllm_server
