"""Unified-memory telemetry on the background thread: /proc/meminfo, PSI, the kernel log, NVML memory.

Sampled once per hardware interval by `Exporter.sample_hardware`, never on the per-step path.  Each
source sets `vllm_spark_memory_source_available{source}`; a source that cannot be read (no such file,
no permission, a container without `/dev/kmsg`) logs one line the first time and then only keeps its
gauge at 0, with no error loop.  Malformed input is counted in `vllm_spark_plugin_errors_total
{where="invalid_<source>"}`.

The kernel log followed is the `kernel_log` setting (SPARK_PLUGIN_KERNEL_LOG, validated by
`settings`: an absolute /dev/kmsg-format path, default /dev/kmsg, or off), handed in by the exporter.
It is read once per pass, here; what the pass found (NIC link messages included) is kept in
`kernel_log_found` for the link telemetry (`metrics.link_telemetry`), None when the log was not read.
"""
from __future__ import annotations

import logging

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.common import memory_sources as ms

log = logging.getLogger("vllm_spark_plugin")

MEMINFO_EXPORTED = ("MemFree", "Cached", "Buffers", "SReclaimable", "Shmem", "SwapTotal", "SwapFree")
MEMINFO_PATH = "/proc/meminfo"
PSI_PATH = "/proc/pressure/memory"
MEMINFO, PSI, KERNEL_LOG, NVML_MEMORY = "meminfo", "psi", "kernel_log", "nvml_memory"


class MemoryTelemetry:
    """One per process (the hardware leader).  `ins` is the Instruments object."""

    def __init__(self, ins, meminfo_path: str = MEMINFO_PATH, psi_path: str = PSI_PATH,
                 kernel_log: str | None = ms.KMSG_PATH) -> None:
        """`kernel_log`: the path followed for NVRM events (the `kernel_log` setting); None or "": off."""
        self.ins = ins
        self.meminfo_path = meminfo_path
        self.psi_path = psi_path
        self.kernel_log = kernel_log or None
        self._kmsg: ms.KmsgReader | None = None
        self._kmsg_tried = False
        self.kernel_log_found: ms.KernelLog | None = None  # this pass's records; None: not read
        self._psi_total: dict[str, float] = {}
        self._down: set[str] = set()       # sources whose unavailability was logged
        self._children = {}

    # -- helpers -----------------------------------------------------------------------------------
    def _available(self, source: str, ok: bool, why: str = "", level: int = logging.WARNING) -> None:
        self.ins.source_available.labels(source).set(1 if ok else 0)
        if ok:
            self._down.discard(source)
        elif source not in self._down:
            self._down.add(source)
            log.log(level, "vllm-spark-plugin: memory source %s unavailable (%s); "
                        "vllm_spark_memory_source_available{source=\"%s\"} = 0, not retried in the log", source, why, source)

    @staticmethod
    def _read(path: str) -> str:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read()

    # -- sources -----------------------------------------------------------------------------------
    def sample(self) -> None:
        """All host sources; never raises."""
        for fn in (self.sample_meminfo, self.sample_psi, self.sample_kernel_log):
            try:
                fn()
            except Exception as exc:  # a bug here must not stop the other sources
                errors.report("memory_" + fn.__name__, exc)

    def sample_meminfo(self) -> ms.Meminfo | None:
        try:
            info = ms.parse_meminfo(self._read(self.meminfo_path))
        except OSError as exc:
            self._available(MEMINFO, False, f"{self.meminfo_path}: {exc.strerror or exc}")
            return None
        if info.invalid:
            self.ins.errors.labels(where="invalid_meminfo").inc(info.invalid)
        v = info.values
        if "MemTotal" not in v or "MemAvailable" not in v:
            self._available(MEMINFO, False, f"{self.meminfo_path} has no MemTotal/MemAvailable")
            return info
        self._available(MEMINFO, True)
        mem = self.ins.memory
        mem.labels("total").set(v["MemTotal"])
        mem.labels("available").set(v["MemAvailable"])
        mem.labels("used").set(v["MemTotal"] - v["MemAvailable"])
        for key in MEMINFO_EXPORTED:
            if key in v:
                self.ins.meminfo.labels(key).set(v[key])
        rec = info.reclaimable_bytes()
        if rec is not None:
            self.ins.reclaimable.set(rec)
        return info

    def sample_psi(self) -> ms.Psi | None:
        try:
            psi = ms.parse_psi(self._read(self.psi_path))
        except OSError as exc:
            self._available(PSI, False, f"{self.psi_path}: {exc.strerror or exc} (kernel without PSI?)")
            return None
        if psi.invalid:
            self.ins.errors.labels(where="invalid_psi").inc(psi.invalid)
        self._available(PSI, bool(psi.ratios), "" if psi.ratios else f"{self.psi_path} has no readable line")
        for (kind, window), value in psi.ratios.items():
            self.ins.pressure.labels(kind, window).set(value)
        for kind, total in psi.stall_seconds.items():
            base = self._psi_total.get(kind)
            self._psi_total[kind] = total
            # since the plugin started: the first reading is the baseline (the series exists at 0)
            self.ins.pressure_stall.labels(kind).inc(0.0 if base is None or total < base else total - base)
        return psi

    def sample_kernel_log(self) -> ms.KernelLog | None:
        self.kernel_log_found = None
        if self.kernel_log is None:
            self._available(KERNEL_LOG, False, "turned off by SPARK_PLUGIN_KERNEL_LOG")
            return None
        if self._kmsg is None:
            if self._kmsg_tried:
                self.ins.source_available.labels(KERNEL_LOG).set(0)
                return None
            self._kmsg_tried = True  # one attempt: an unreadable log stays unread, and quiet
            reader = ms.KmsgReader(self.kernel_log)
            try:
                reader.open()
            except OSError as exc:
                self._available(KERNEL_LOG, False, f"{self.kernel_log}: {exc.strerror or exc}; NVRM "
                                "NV_ERR_NO_MEMORY and Xid events are not counted (run the server with read "
                                "access to it, or set SPARK_PLUGIN_KERNEL_LOG=off)")
                return None
            self._kmsg = reader
            for kind in ms.KERNEL_EVENT_KINDS:  # series exist at 0, so increase() sees the first event
                self.ins.nvrm_events.labels(kind).inc(0)
        try:
            found = self._kmsg.read_new()
        except OSError as exc:
            self._kmsg.close()
            self._kmsg = None
            self._available(KERNEL_LOG, False, f"{self.kernel_log}: read failed: {exc.strerror or exc}")
            return None
        self._available(KERNEL_LOG, True)
        self.kernel_log_found = found
        for kind, n in found.events.items():
            self.ins.nvrm_events.labels(kind).inc(n)
        for xid, n in found.xids.items():
            self.ins.nvrm_xid.labels(str(xid)).inc(n)
        if found.invalid:
            self.ins.errors.labels(where="invalid_kernel_log").inc(found.invalid)
        return found

    def sample_gpu_memory(self, rows: list[dict] | None) -> None:
        """NVML's view of GPU memory from `NvmlSampler.sample()` rows; None when NVML is unavailable."""
        have = False
        for r in rows or ():
            for kind, value in (r.get("memory") or {}).items():
                self.ins.gpu_memory.labels(r["gpu"], kind).set(value)
                have = True
        # No NVML at all was logged by NvmlSampler.init; NOT_SUPPORTED is what GB10 answers: both info.
        self._available(NVML_MEMORY, have, "NVML not available" if rows is None else
                        "NVML reports no memory info (NOT_SUPPORTED on unified-memory GB10: /proc/meminfo is the truth)",
                        level=logging.DEBUG if rows is None else logging.INFO)
