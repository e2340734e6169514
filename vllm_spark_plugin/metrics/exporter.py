"""The process's exporter: one per model in the API server, built by the stat logger with the
process's settings.  It holds the instruments, one `EngineState` per engine (`metrics.engine`: the
recording), and the telemetry loop (`metrics.telemetry`: hardware, profile, other processes' errors,
the knee refits that `metrics.knee_gauges` publishes).
"""
from __future__ import annotations

import os
import threading

from vllm_spark_plugin._version import __version__
from vllm_spark_plugin.common import errors
from vllm_spark_plugin.metrics import instruments, knee_gauges, telemetry
from vllm_spark_plugin.metrics.engine import EngineState
from vllm_spark_plugin.settings import Settings


class Exporter:
    def __init__(self, model: str, settings: Settings, registry=None, hook_steps: bool = False) -> None:
        """`registry`: a prometheus-client registry of its own (tests); default the process's, which
        vLLM's /metrics serves.  `hook_steps`: the scheduler hook's records reach this process (they
        then count the batches and KV blocks; see `metrics.engine.EngineState`)."""
        self.settings = settings
        self.model = model
        self.hook_steps = hook_steps
        slo = dict(floors=settings.floors, ttft_slo_seconds=settings.ttft_slo_seconds)  # bucket bounds too
        self.ins = instruments.get(**slo) if registry is None else instruments.Instruments(registry, **slo)
        self.engines: dict[int, EngineState] = {}
        self._lock = threading.Lock()
        self.total_blocks: int | None = None
        self.leader = telemetry.Leader()
        self.hardware = telemetry.Hardware(self.ins, settings.kernel_log, settings.links)
        self.profile = telemetry.ProfileWatch(self.ins, model, settings.profile)
        self.read_spilled = None  # fn() -> {pid: {where: total}} of processes without an exporter
        self.loop = telemetry.TelemetryLoop(self)
        self.delivery_clock = False

    # -- engines ----------------------------------------------------------------------------------
    def _new_estimator(self):
        try:
            from vllm_spark_plugin.knee.online import OnlineKneeEstimator
            return OnlineKneeEstimator.from_settings(self.settings)
        except Exception as exc:
            errors.report("knee_init", exc)
            return None

    def engine(self, idx: int) -> EngineState:
        st = self.engines.get(idx)
        if st is None:
            with self._lock:
                st = self.engines.get(idx)
                if st is None:
                    s = self.settings
                    st = EngineState(self.ins, self.model, str(idx), s.floors, s.ttft_slo_seconds,
                                     self._new_estimator(), self.hook_steps,
                                     rewrite_gauges=telemetry.MULTIPROC_ENV in os.environ)
                    st.delivery_clock = self.delivery_clock
                    knee_gauges.publish_first(self.ins, (self.model, st.engine))
                    if self.total_blocks:
                        st.set_total_blocks(self.total_blocks)
                    self.engines[idx] = st
        return st

    def set_total_blocks(self, total: int | None) -> None:
        if total:
            self.total_blocks = total
            for st in self.engines.values():
                st.set_total_blocks(total)

    def time_deliveries(self) -> None:
        """Per-stream rates and the SLO come from the delivery clock from now on (`hooks.delivery`)."""
        self.delivery_clock = True
        for st in self.engines.values():
            st.delivery_clock = True

    # -- static series ----------------------------------------------------------------------------
    def set_info(self, vllm_version: str, device: str, moe_backend: str, features_off: str = "none") -> None:
        info = self.ins.info
        for labels in list(getattr(info, "_metrics", {})):  # one info series: drop an earlier label set
            if labels[4] == self.model:
                info.remove(*labels)
        info.labels(__version__, vllm_version, device, moe_backend or "none", self.model, features_off).set(1)

    def absorb_errors_from(self, read_spilled) -> None:
        """Errors contained in processes without an exporter (engine core, workers) are added to
        this process's count by the telemetry loop: `read_spilled()` -> {pid: {where: total}}."""
        self.read_spilled = read_spilled

    # -- background work --------------------------------------------------------------------------
    def start_background(self) -> None:
        self.loop.start()

    def stop_background(self) -> None:
        self.loop.stop()

    def sample_hardware(self, nvml=None) -> None:
        """NVML and the memory sources, once (leader process only); `nvml` replaces pynvml."""
        if self.leader.held():
            self.hardware.sample(nvml)

    def refresh_knee(self) -> None:
        """Refit each engine's step-time model and set the knee and SLO-capacity gauges."""
        for st in list(self.engines.values()):
            knee_gauges.refresh(self.ins, self.model, st)


_exporters: dict[str, Exporter] = {}
_exporter_lock = threading.Lock()


def get(model: str, settings: Settings, hook_steps: bool = False) -> Exporter:
    """The process's exporter for `model` (vLLM serves one model per process; tests make several)."""
    with _exporter_lock:
        exp = _exporters.get(model)
        if exp is None:
            exp = _exporters[model] = Exporter(model, settings, hook_steps=hook_steps)
        return exp
