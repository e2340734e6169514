"""Unified-memory series on the real CPU `vllm serve` (the session's main server, tests/conftest.py).

That server's kernel-log source is set to a path that does not exist (SPARK_PLUGIN_KERNEL_LOG), as a
container without /dev/kmsg would have it: the source gauge must say so, the server log must carry
exactly one line about it, and nothing else may go wrong.  The other sources are this machine's own
/proc/meminfo and /proc/pressure/memory, compared with what /metrics shows.  The engine core's
start-up snapshot (hooks/startup.py) must be in the log exactly once, before the worker starts.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from support.scrape import scrape, value
from vllm_spark_plugin.common import memory_sources as ms

pytestmark = pytest.mark.server
GIB = 1 << 30


@pytest.fixture(scope="module")
def samples(vllm_server):
    """Two scrapes 3 s (3 telemetry rounds) apart: the second must still show one log line."""
    deadline = time.time() + 60
    first = scrape(vllm_server.metrics_url)
    while value(first, "vllm_spark_memory_source_available", source="meminfo") != 1 and time.time() < deadline:
        time.sleep(1)
        first = scrape(vllm_server.metrics_url)
    time.sleep(3)
    return first, scrape(vllm_server.metrics_url)


def test_meminfo_fields_match_this_machine(samples):
    _, s = samples
    here = ms.parse_meminfo(Path("/proc/meminfo").read_text()).values
    assert value(s, "vllm_spark_memory_source_available", source="meminfo") == 1
    assert value(s, "vllm_spark_unified_memory_bytes", kind="total") == here["MemTotal"]
    assert value(s, "vllm_spark_meminfo_bytes", field="SwapTotal") == here["SwapTotal"]
    for field in ("MemFree", "Cached", "Buffers", "SReclaimable", "Shmem"):
        got = [v for (n, lab), v in s.items() if n == "vllm_spark_meminfo_bytes" and dict(lab).get("field") == field]
        assert len(got) == 1, field
        assert abs(got[0] - here[field]) < 2 * GIB, (field, got[0], here[field])  # sampled a second apart
    rec = value(s, "vllm_spark_memory_reclaimable_bytes")
    assert 0 < rec <= value(s, "vllm_spark_meminfo_bytes", field="Cached") + value(s, "vllm_spark_meminfo_bytes", field="Buffers") \
        + value(s, "vllm_spark_meminfo_bytes", field="SReclaimable")


def test_psi_series_present(samples):
    _, s = samples
    if not Path("/proc/pressure/memory").exists():
        pytest.skip("this kernel has no PSI")
    assert value(s, "vllm_spark_memory_source_available", source="psi") == 1
    names = {(n, dict(lab).get("kind")) for (n, lab) in s if n == "vllm_spark_memory_pressure_stall_seconds_total"}
    assert names == {("vllm_spark_memory_pressure_stall_seconds_total", "some"),
                     ("vllm_spark_memory_pressure_stall_seconds_total", "full")}


def test_unreadable_kernel_log_is_one_gauge_and_one_log_line(samples, vllm_server):
    first, s = samples
    assert [v for (n, lab), v in s.items()
            if n == "vllm_spark_memory_source_available" and dict(lab) == {"source": "kernel_log"}] == [0.0]
    assert not [n for (n, _) in s if n.startswith("vllm_spark_nvrm_")]       # no event series without a source
    log = vllm_server.log_path.read_text(errors="replace")
    lines = [ln for ln in log.splitlines() if "memory source kernel_log unavailable" in ln]
    assert len(lines) == 1, lines
    assert "/nonexistent/kmsg" in lines[0] and "No such file" in lines[0]
    # no error loop: nothing counted against any memory source, before or after three more rounds
    for snap in (first, s):
        bad = {dict(lab)["where"]: v for (n, lab), v in snap.items()
               if n == "vllm_spark_plugin_errors_total" and ("memory" in dict(lab)["where"] or "kernel" in dict(lab)["where"])}
        assert not any(bad.values()), bad


def test_nvml_memory_source_is_reported_absent_on_the_cpu(samples):
    _, s = samples
    assert value(s, "vllm_spark_memory_source_available", source="nvml_memory") == 0
    assert not [n for (n, _) in s if n == "vllm_spark_gpu_memory_bytes"]


def test_start_up_snapshot_is_logged_once_by_the_engine_before_its_worker(samples, vllm_server):
    """The plain tiny model (no NVFP4): the engine core's start-up hook logs the snapshot once, before
    the worker (where vLLM's own memory check runs) starts; on the CPU build with no verdict."""
    log = vllm_server.log_path.read_text(errors="replace").splitlines()
    at = [i for i, ln in enumerate(log) if "unified memory at start-up" in ln]
    assert len(at) == 1, [log[i] for i in at]
    line = log[at[0]]
    assert "EngineCore" in line and "(engine 0)" in line, line
    assert re.search(r"CPU build: the KV cache is sized by VLLM_CPU_KVCACHE_SPACE \S+ --kv-cache-memory-bytes "
                     r"\(\d+\.\d GiB\), not by gpu_memory_utilization 0\.\d\d", line), line
    assert "MemFree" in line and "MemAvailable" in line and "page cache" in line and "Fix:" not in line
    worker = [i for i, ln in enumerate(log) if "role worker" in ln or ln.startswith("(Worker")]
    assert worker and at[0] < worker[0], (line, log[worker[0]] if worker else None)
    counted = [v for (n, lab), v in samples[1].items()
               if n == "vllm_spark_plugin_errors_total" and dict(lab).get("where", "").startswith("startup_snapshot")]
    assert not any(counted), counted
