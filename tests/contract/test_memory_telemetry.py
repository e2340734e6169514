"""The unified-memory sampler behind the exporter: real files, the real /dev/kmsg where it can be read,
the process's real prometheus-client instruments.  Faked only: NVML (no GPU here), as a module object
handed to the sampler (the seam the exporter already has).
"""
from __future__ import annotations

import logging
import os
import shutil
import types
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from vllm_spark_plugin.metrics import exporter as exporter_mod
from vllm_spark_plugin.metrics import instruments
from vllm_spark_plugin.common import memory_sources as ms
from vllm_spark_plugin import settings
from vllm_spark_plugin.metrics.memory_telemetry import MemoryTelemetry

DATA = Path(__file__).resolve().parents[1] / "unit" / "data" / "memory_sources"
GB10_NO_MEMORY = ("NVRM: nvCheckOkFailedNoLog: Check failed: Out of memory [NV_ERR_NO_MEMORY] (0x00000051) "
                  "returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359")  # vllm#56824, GB10


def value(name: str, **labels) -> float:
    v = REGISTRY.get_sample_value(name, labels)
    return 0.0 if v is None else v


def telemetry(tmp_path, meminfo=DATA / "meminfo.gb10-after-60g-write", psi=None, kernel_log=None):
    psi_path = tmp_path / "psi"
    if psi is None:
        shutil.copy(DATA / "pressure_memory.testbed-x86_64", psi_path)
    else:
        psi_path.write_text(psi)
    return MemoryTelemetry(instruments.get(), meminfo_path=str(meminfo), psi_path=str(psi_path),
                           kernel_log=kernel_log or str(tmp_path / "kmsg-absent"))


def test_gb10_meminfo_becomes_gauges(tmp_path):
    t = telemetry(tmp_path)
    t.sample()
    gib = 1 << 30
    assert value("vllm_spark_memory_source_available", source="meminfo") == 1
    assert value("vllm_spark_meminfo_bytes", field="MemFree") / gib == pytest.approx(41.52, abs=0.01)
    assert value("vllm_spark_meminfo_bytes", field="Cached") / gib == pytest.approx(72.64, abs=0.01)
    assert value("vllm_spark_unified_memory_bytes", kind="available") / gib == pytest.approx(115.65, abs=0.01)
    assert value("vllm_spark_memory_reclaimable_bytes") / gib == pytest.approx(72.64, abs=0.01)


def test_kernel_log_is_followed_incrementally(tmp_path):
    log_file = tmp_path / "kmsg"
    log_file.write_text(f"3,1,100,-;{GB10_NO_MEMORY}\n")     # before start-up: not counted
    t = telemetry(tmp_path, kernel_log=str(log_file))
    no_mem0 = value("vllm_spark_nvrm_events_total", kind="nv_err_no_memory")
    xid0 = value("vllm_spark_nvrm_xid_events_total", xid="31")
    t.sample()
    assert value("vllm_spark_memory_source_available", source="kernel_log") == 1
    assert REGISTRY.get_sample_value("vllm_spark_nvrm_events_total", {"kind": "xid"}) is not None  # exists at 0
    with open(log_file, "a") as fh:
        fh.write(f"3,2,200,-;{GB10_NO_MEMORY}\n"
                 "3,3,300,-;NVRM: Xid (PCI:000f:01:00): 31, pid=1, name=python3, Ch 00000008\n"
                 f"11,4,400,-;{GB10_NO_MEMORY}\n")            # facility 1 (user space): not counted
    t.sample()
    t.sample()
    assert value("vllm_spark_nvrm_events_total", kind="nv_err_no_memory") - no_mem0 == 1
    assert value("vllm_spark_nvrm_xid_events_total", xid="31") - xid0 == 1


def test_unreadable_kernel_log_one_line_gauge_zero_no_errors(tmp_path, caplog):
    errors0 = sum(m.value for f in REGISTRY.collect() if f.name == "vllm_spark_plugin_errors" for m in f.samples)
    t = telemetry(tmp_path)  # kernel log path does not exist
    with caplog.at_level(logging.INFO, logger="vllm_spark_plugin"):
        for _ in range(5):
            t.sample()
    lines = [r for r in caplog.records if "kernel_log unavailable" in r.getMessage()]
    assert len(lines) == 1 and "No such file" in lines[0].getMessage()
    assert value("vllm_spark_memory_source_available", source="kernel_log") == 0
    errors1 = sum(m.value for f in REGISTRY.collect() if f.name == "vllm_spark_plugin_errors" for m in f.samples)
    assert errors1 == errors0


def test_malformed_sources_are_counted_not_raised(tmp_path):
    bad = tmp_path / "meminfo"
    bad.write_text("MemTotal: 1000 kB\nMemFree: x kB\nMemAvailable: 500 kB\nCached: 12")   # cut last line
    before = value("vllm_spark_plugin_errors_total", where="invalid_meminfo")
    psi_before = value("vllm_spark_plugin_errors_total", where="invalid_psi")
    t = telemetry(tmp_path, meminfo=bad, psi="some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg1")
    t.sample()
    assert value("vllm_spark_plugin_errors_total", where="invalid_meminfo") - before == 2
    assert value("vllm_spark_plugin_errors_total", where="invalid_psi") - psi_before == 1
    assert value("vllm_spark_unified_memory_bytes", kind="used") == 500 * 1024


def test_psi_stall_counter_counts_deltas(tmp_path):
    t = telemetry(tmp_path, psi="some avg10=1.00 avg60=0.50 avg300=0.10 total=1000000\n"
                                "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    before = value("vllm_spark_memory_pressure_stall_seconds_total", kind="some")
    t.sample()                      # baseline
    (tmp_path / "psi").write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=3500000\n"
                                  "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    t.sample()
    assert value("vllm_spark_memory_pressure_stall_seconds_total", kind="some") - before == pytest.approx(2.5)
    assert value("vllm_spark_memory_pressure_ratio", kind="some", window="avg10") == 0.01


def test_kernel_log_setting():
    def kernel_log(env):
        return settings.load(env, announce=False).kernel_log
    assert kernel_log({}) == "/dev/kmsg"
    assert kernel_log({"SPARK_PLUGIN_KERNEL_LOG": "off"}) == ""
    assert kernel_log({"SPARK_PLUGIN_KERNEL_LOG": "/var/log/kmsg-copy"}) == "/var/log/kmsg-copy"
    relative = settings.load({"SPARK_PLUGIN_KERNEL_LOG": "relative/path"}, announce=False)
    assert relative.kernel_log == "/dev/kmsg" and "SPARK_PLUGIN_KERNEL_LOG" in relative.problems[0]


@pytest.mark.skipif(not os.access("/dev/kmsg", os.R_OK | os.W_OK), reason="needs read and write access to /dev/kmsg")
def test_real_dev_kmsg_is_read_without_blocking_and_user_records_do_not_count(tmp_path):
    """The real kernel log of this machine: the backlog is skipped, a record written now is read in
    the next round, and since it comes from user space it is not counted as a driver event."""
    reader = ms.KmsgReader("/dev/kmsg")
    reader.open()
    reader.read_new()  # drain whatever was logged since open()
    with open("/dev/kmsg", "w") as fh:
        fh.write(f"vllm-spark-plugin test record (user space): {GB10_NO_MEMORY}\n")
    got = reader.read_new()
    reader.close()
    assert got.records >= 1 and got.events[ms.NV_ERR_NO_MEMORY] == 0 and got.invalid == 0
    whole = ms.KmsgReader("/dev/kmsg", from_start=True)   # the whole buffer: every real record parses
    whole.open()
    backlog = whole.read_new()
    whole.close()
    assert backlog.records > 1 and backlog.invalid == 0


class NotSupported(Exception):
    pass


NotSupported.__name__ = "NVMLError_NotSupported"


class _OneGpu:
    """One GPU; every reading not defined below answers NOT_SUPPORTED."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __getattr__(self, name):
        if name.startswith("nvmlDevice"):
            def unsupported(*args):
                raise NotSupported()
            return unsupported
        raise AttributeError(name)

    def nvmlInit(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i


class DiscreteNvml(_OneGpu):
    """A GPU whose NVML reports memory (not GB10)."""

    def nvmlDeviceGetMemoryInfo(self, h):
        return types.SimpleNamespace(total=96 << 30, free=10 << 30, used=86 << 30)


class Gb10Nvml(_OneGpu):
    def nvmlDeviceGetMemoryInfo(self, h):
        raise NotSupported()


def test_nvml_memory_where_reported_and_not_on_gb10():
    exp = exporter_mod.Exporter("memory-nvml", settings.Settings())
    exp.sample_hardware(nvml=DiscreteNvml())
    assert value("vllm_spark_gpu_memory_bytes", gpu="0", kind="free") == 10 << 30
    assert value("vllm_spark_memory_source_available", source="nvml_memory") == 1
    gb10 = exporter_mod.Exporter("memory-gb10", settings.Settings())
    gb10.sample_hardware(nvml=Gb10Nvml())
    assert value("vllm_spark_memory_source_available", source="nvml_memory") == 0
    assert value("vllm_spark_memory_source_available", source="meminfo") == 1  # /proc/meminfo of this machine
