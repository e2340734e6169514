"""The telemetry loop: one daemon thread per API server that does everything the per-step path must
not (hardware sampling, the unified-memory sources, the network links, the offline profile, other processes' contained
errors, the knee refits), and the leader election that keeps N API servers from counting one
machine N times.

One pass per `hardware_interval_seconds`; the knee is refitted every `knee_refit_seconds`.  Each job is
contained on its own: one that fails is counted and the others still run.
"""
from __future__ import annotations

import fcntl
import os
import threading
import time

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.metrics import knee_gauges

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's; set by vLLM with several API servers
LEADER_LOCK = "vllm_spark_hardware.lock"


class Leader:
    """Only one process of a `vllm serve` samples the machine: the one holding an exclusive lock in
    prometheus-client's multiprocess directory (every process, when there is none)."""

    def __init__(self, environ=None) -> None:
        self._environ = os.environ if environ is None else environ
        self._held: bool | None = None
        self._fh = None

    def held(self) -> bool:
        if self._held is None:
            d = self._environ.get(MULTIPROC_ENV)
            if not d:
                self._held = True
            else:
                try:
                    self._fh = open(os.path.join(d, LEADER_LOCK), "w")
                    fcntl.flock(self._fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._held = True
                except OSError:
                    self._held = False
        return self._held


class Hardware:
    """NVML, the unified-memory sources and the network links, written to the process's instruments
    (leader only).  `kernel_log` and `links` are those settings."""

    def __init__(self, ins, kernel_log: str, links: str = "auto") -> None:
        self.ins = ins
        self.kernel_log = kernel_log
        self.links = links
        self._nvml = None   # metrics.hardware.NvmlSampler, built on first use
        self._mem = None    # metrics.memory_telemetry.MemoryTelemetry, built on first use
        self._links = None  # metrics.link_telemetry.LinkTelemetry, built on first use

    def sample(self, nvml=None) -> None:
        """`nvml`: an NVML module to read (default pynvml, where it imports)."""
        from vllm_spark_plugin.metrics import hardware
        ins = self.ins
        if self._mem is None:
            from vllm_spark_plugin.metrics.memory_telemetry import MemoryTelemetry
            self._mem = MemoryTelemetry(ins, kernel_log=self.kernel_log)
        self._mem.sample()  # /proc/meminfo, /proc/pressure/memory, kernel log (NVRM events); never raises
        if self._links is None:
            from vllm_spark_plugin.metrics.link_telemetry import LinkTelemetry
            self._links = LinkTelemetry(ins, self.links)
        self._links.sample(self._mem.kernel_log_found)  # sysfs, RDMA ports, the log's link messages; never raises
        if self._nvml is None:
            self._nvml = hardware.NvmlSampler(nvml)
            self._nvml.init()
        if not self._nvml.available:
            self._mem.sample_gpu_memory(None)
            return
        rows = self._nvml.sample()
        self._mem.sample_gpu_memory(rows)
        for r in rows:
            g = r["gpu"]
            if "energy_delta_j" in r:
                ins.energy.labels(g).inc(r["energy_delta_j"])  # 0 on the first reading: the series exists
            if "power_w" in r:
                ins.power.labels(g).set(r["power_w"])
            if "sm_clock_hz" in r:
                ins.sm_clock.labels(g).set(r["sm_clock_hz"])
            if "temperature_c" in r:
                ins.temperature.labels(g).set(r["temperature_c"])
            if "utilization" in r:
                ins.utilization.labels(g).set(r["utilization"])
            for reason, active in r.get("reasons", {}).items():
                ins.clock_event.labels(g, reason).set(active)


class ProfileWatch:
    """(Re)load the offline profile when its file appears or changes (a sweep can rewrite it)."""

    def __init__(self, ins, model: str, path: str) -> None:
        self.ins, self.model, self.path = ins, model, path
        self._mtime: float | None = None

    def check(self) -> None:
        if not self.path:
            return
        try:
            mtime = os.stat(self.path).st_mtime
        except FileNotFoundError:
            return  # not written yet
        if mtime != self._mtime:
            self._mtime = mtime
            knee_gauges.load_profile(self.ins, self.model, self.path)


class TelemetryLoop:
    """The thread.  `exporter` is the process's `metrics.exporter.Exporter`."""

    def __init__(self, exporter, clock=time.monotonic) -> None:
        self.exporter = exporter
        self.clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_refit = 0.0
        self._absorbed: dict = {}  # (pid, where) -> other processes' errors already counted

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vllm-spark-telemetry", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        period = self.exporter.settings.hardware_interval_seconds
        while not self._stop.is_set():
            self.run_once()
            self._stop.wait(period)

    def run_once(self) -> None:
        """One pass of every job (the thread's body; tests and benchmarks call it directly)."""
        exp = self.exporter
        leader = exp.leader.held()
        for where, job, enabled in (("hardware", exp.sample_hardware, leader),
                                    ("profile", exp.profile.check, True),
                                    ("absorb_errors", self._absorb, leader and exp.read_spilled is not None)):
            if enabled:
                try:
                    job()
                except Exception as exc:
                    errors.report(where, exc)
        now = self.clock()
        if now >= self._next_refit:
            self._next_refit = now + exp.settings.knee_refit_seconds
            try:
                exp.refresh_knee()
            except Exception as exc:
                errors.report("knee", exc)

    def _absorb(self) -> None:
        errors.absorb(self.exporter.read_spilled(), self._absorbed)
