"""Unified-memory series on the real CPU `vllm serve` (the session's main server, tests/conftest.py).

That server's kernel-log source is set to a path that does not exist (SPARK_PLUGIN_KERNEL_LOG), as a
container without /dev/kmsg would have it: the source gauge must say so, the server log must carry
exactly one line about it, and nothing else may go wrong.  The other sources are this machine's own
/proc/meminfo and /proc/pressure/memory, compared with what /metrics shows.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from support.scrape import scrape, value
from vllm_spark_plugin.metrics import memory_sources as ms

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
