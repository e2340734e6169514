"""The engine-core start-up hook (vllm_spark_plugin/hooks/startup.py) on a stand-in executor class:
the snapshot is logged once per executor built, before the executor builds its workers; a failure is
counted and the executor is built anyway; the `memory_guard` setting turns it off; the CPU build gets
figures without a verdict.  The real `Executor` is wrapped in tests/contract/test_vllm_port.py."""
from __future__ import annotations

import logging
import types

import pytest

from vllm_spark_plugin import settings
from vllm_spark_plugin.hooks import startup
from vllm_spark_plugin.quant import memory_guard

LINE = "unified memory at start-up"


def config(util=0.7, kv=1 << 30, dp_rank=0):
    cache = types.SimpleNamespace(gpu_memory_utilization=util, kv_cache_memory_bytes=kv)
    return types.SimpleNamespace(cache_config=cache, parallel_config=types.SimpleNamespace(data_parallel_rank=dp_rank))


@pytest.fixture
def executor_class():
    events = []

    class Executor:
        def __init__(self, vllm_config):
            events.append("workers built")  # where vLLM's own memory check runs
            self.vllm_config = vllm_config

    Executor.events = events
    return Executor


@pytest.fixture(autouse=True)
def fresh_settings(monkeypatch):
    monkeypatch.delenv("SPARK_PLUGIN_MEMORY_GUARD", raising=False)
    settings.reset_current()
    yield
    settings.reset_current()


def lines(caplog):
    return [r for r in caplog.records if LINE in r.getMessage()]


def test_snapshot_once_per_executor_before_the_workers(executor_class, monkeypatch):
    monkeypatch.setattr(memory_guard, "log_startup_snapshot", lambda *a, **k: executor_class.events.append("snapshot"))
    startup.patch_executor(executor_class, lambda where, exc: pytest.fail(f"{where}: {exc}"))
    startup.patch_executor(executor_class, None)  # idempotent
    executor_class(config())
    assert executor_class.events == ["snapshot", "workers built"]
    executor_class(config())  # a second engine in the same process gets its own
    assert executor_class.events.count("snapshot") == 2


def test_cpu_build_logs_figures_without_a_verdict(executor_class, caplog, monkeypatch):
    caplog.set_level(logging.INFO, logger="vllm_spark_plugin")
    monkeypatch.setattr("vllm_spark_plugin.vllm.platform.has_cuda", lambda: False)
    startup.patch_executor(executor_class, lambda where, exc: pytest.fail(f"{where}: {exc}"))
    executor_class(config(util=0.99, kv=2 << 30, dp_rank=1))
    (rec,) = lines(caplog)
    msg = rec.getMessage()
    assert rec.levelno == logging.INFO and "(engine 1)" in msg
    assert "VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes (2.0 GiB)" in msg and "gpu_memory_utilization 0.99" in msg
    assert "requested 0.99" in msg and "MemFree" in msg and "MemAvailable" in msg and "Fix" not in msg
    executor_class(config(kv=None))
    assert "node's available memory" in lines(caplog)[1].getMessage()


def test_cuda_build_gets_the_verdict(executor_class, monkeypatch):
    seen = {}
    monkeypatch.setattr("vllm_spark_plugin.vllm.platform.has_cuda", lambda: True)
    monkeypatch.setattr(memory_guard, "log_startup_snapshot", lambda util, **kw: seen.update(util=util, **kw))
    startup.patch_executor(executor_class, lambda where, exc: pytest.fail(f"{where}: {exc}"))
    executor_class(config(util=0.85))
    assert seen == {"util": 0.85, "sized_by": None, "where": "engine 0"}


def test_a_failing_snapshot_is_counted_and_the_engine_starts(executor_class, monkeypatch):
    errors = []

    def broken(*a, **k):
        raise OSError("no /proc/meminfo")
    monkeypatch.setattr(memory_guard, "log_startup_snapshot", broken)
    startup.patch_executor(executor_class, lambda where, exc: errors.append((where, type(exc).__name__)))
    ex = executor_class(config())
    assert errors == [("startup_snapshot", "OSError")] and ex.vllm_config is not None
    assert executor_class.events == ["workers built"]


def test_memory_guard_off_means_the_snapshot_is_not_installed(monkeypatch):
    from vllm_spark_plugin.hooks import PATCHES, PLUGIN_LOAD, registration
    patch = next(p for p in PATCHES if p.name == "startup_snapshot")
    monkeypatch.setenv("SPARK_PLUGIN_MEMORY_GUARD", "0")
    assert not registration.applies(patch, PLUGIN_LOAD, settings.load(), "engine_core")
    monkeypatch.delenv("SPARK_PLUGIN_MEMORY_GUARD")
    assert registration.applies(patch, PLUGIN_LOAD, settings.load(), "engine_core")

def test_a_config_without_a_utilisation_is_skipped(executor_class, caplog):
    caplog.set_level(logging.INFO, logger="vllm_spark_plugin")
    startup.patch_executor(executor_class, lambda where, exc: pytest.fail(f"{where}: {exc}"))
    executor_class(types.SimpleNamespace())
    assert lines(caplog) == []


def test_the_nvfp4_path_does_not_log_the_snapshot_a_second_time(monkeypatch, caplog, tmp_path):
    caplog.set_level(logging.INFO, logger="vllm_spark_plugin")
    monkeypatch.setattr("vllm_spark_plugin.vllm.platform.has_cuda", lambda: True)
    cfg = types.SimpleNamespace(cache_config=types.SimpleNamespace(gpu_memory_utilization=0.5),
                                model_config=types.SimpleNamespace(model=str(tmp_path)))
    memory_guard.check_at_startup(cfg, snapshot=False)
    assert lines(caplog) == [] and any("unified memory:" in r.getMessage() for r in caplog.records)
    memory_guard.check_at_startup(cfg)
    assert len(lines(caplog)) == 1
