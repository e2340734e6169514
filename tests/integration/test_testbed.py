"""The test bed itself: the tiny model is deterministic, and a failing server start reports its log."""
from __future__ import annotations

import hashlib
import time

import pytest

from vllm_spark_plugin.testbed.server import ServerStartError, VllmServer
from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model


def _digest(path):
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file() and f.name != ".complete":
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def test_tiny_model_is_deterministic(tmp_path):
    a = ensure_tiny_model(tmp_path / "a")
    b = ensure_tiny_model(tmp_path / "b")
    assert _digest(a) == _digest(b)
    cfg = (a / "config.json").read_text()
    assert '"num_experts": 8' in cfg or '"num_local_experts": 8' in cfg


def test_failed_start_reports_log_tail(tmp_path):
    server = VllmServer(model_path=str(tmp_path / "no-such-model"), log_path=tmp_path / "server.log")
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as err:
        server.start(timeout=300)
    assert "exited with code" in str(err.value)
    assert "no-such-model" in str(err.value)  # the tail of vLLM's own log names the problem
    assert time.monotonic() - t0 < 300
    assert not server.alive()
