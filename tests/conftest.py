"""Session-wide test bed: the tiny local model and real CPU vLLM servers, each started once.

Servers are expensive (1-3 minutes to start on 2 cores), so every fixture here is session-scoped and
lazily started: a run that selects no server test starts none.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from vllm_spark_plugin.testbed.server import VllmServer
from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = Path(os.environ.get("SPARK_TEST_ARTIFACTS", "/tmp/vllm-spark-test"))


@pytest.fixture(scope="session")
def artifacts_dir() -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS


@pytest.fixture(scope="session")
def tiny_model_path(artifacts_dir) -> Path:
    return ensure_tiny_model(artifacts_dir / "tiny-qwen3-moe")


def _start(model_path, artifacts_dir, name, **kw) -> VllmServer:
    server = VllmServer(model_path=str(model_path), log_path=artifacts_dir / f"{name}.log", **kw)
    server.start(timeout=float(os.environ.get("SPARK_TEST_SERVER_TIMEOUT", "900")))
    return server


@pytest.fixture(scope="session")
def vllm_server(tiny_model_path, artifacts_dir):
    """The main CPU `vllm serve` with the plugin (shared by every server test)."""
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-main")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def second_vllm_server(tiny_model_path, artifacts_dir):
    """A second plugin server on another loopback port (fleet tests)."""
    server = _start(tiny_model_path, artifacts_dir, "vllm-server-second")
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_server_pair(vllm_server, second_vllm_server):
    return vllm_server, second_vllm_server
