"""The `vllm.stat_logger_plugins` entry point: vLLM calls `record()` once per engine step in the
API-server process.  Everything it does is O(1) per step plus O(1) per finished request, and no
exception leaves it.

Per-step records of the scheduler hook arrive separately, on the plugin's own channel
(`hooks.channel`), and are recorded by the channel's reader thread.  Registered in `hooks.PATCHES`.
"""
from __future__ import annotations

import logging
import os

from vllm.v1.metrics.loggers import StatLoggerBase

from vllm_spark_plugin import settings as settings_mod
from vllm_spark_plugin.common import errors
from vllm_spark_plugin.hooks import STAT_LOGGER, channel, registration, stats
from vllm_spark_plugin.metrics.step import HookStep
from vllm_spark_plugin.vllm import capabilities, platform

log = logging.getLogger("vllm_spark_plugin")
_announced = False


def features(settings: settings_mod.Settings) -> dict[str, capabilities.Capability]:
    """The capability probes, and the NVFP4 registration as it went in this process."""
    caps = capabilities.all_capabilities()
    nv = registration.nvfp4_state()
    if caps["nvfp4_config"].ok and not nv["registered"] and nv["reason"] != "not tried":
        caps["nvfp4_config"] = capabilities.Capability("nvfp4_config", False, nv["reason"])
    if not settings.scheduler_hook:
        caps["step_hook"] = capabilities.Capability("step_hook", False, "SPARK_PLUGIN_SCHEDULER_HOOK=0")
    return caps


def announce(caps: dict) -> None:
    """Say once, plainly, which features are off and why."""
    global _announced
    if _announced:
        return
    _announced = True
    text = capabilities.summary(caps)
    (log.info if all(c.ok for c in caps.values()) else log.warning)("vllm-spark-plugin: %s", text)


class SparkStatLogger(StatLoggerBase):
    def __init__(self, vllm_config, engine_index: int = 0):
        self.engine_index = engine_index
        self.exporter = None
        self.reader = None
        self._engines: dict = {}
        try:
            from vllm_spark_plugin.metrics import exporter as exporter_mod
            s = settings_mod.current()
            if s.disable:
                return
            self.caps = features(s)
            announce(self.caps)
            # the engines' steps come through the channel (to this or another API server of the serve)
            hook_steps = channel.run_dir() is not None and self.caps["step_hook"].ok
            self.exporter = exporter_mod.get(platform.model_name(vllm_config), s, hook_steps=hook_steps)
            self.exporter.set_total_blocks(platform.num_gpu_blocks(vllm_config))
            self.exporter.engine(engine_index)
            self._set_info()
            self.exporter.absorb_errors_from(channel.read_spilled)
            self.exporter.start_background()
            registration.start_otel_bridge(s)
            if hook_steps:
                self._start_reader()
            self._time_deliveries(s)
            log.info("vllm-spark-plugin: stat logger active in the API server (engine %d, pid %d, "
                     "%d KV blocks%s)", engine_index, os.getpid(), self.exporter.total_blocks or 0,
                     ", reading the engines' steps" if self.reader else "")
        except Exception as exc:
            errors.report("stat_logger_init", exc)
            self.exporter = None

    def _set_info(self) -> None:
        off = ",".join(sorted(n for n, c in self.caps.items() if not c.ok))
        self.exporter.set_info(platform.vllm_version(), platform.device_name(), registration.moe_backend_label(),
                               features_off=off or "none")

    def _start_reader(self) -> None:
        reader = channel.StepReader(channel.run_dir(), self.record_step, self.count_invalid, errors.report)
        if reader.start():  # else another API server of this serve reads them
            self.reader = reader

    def _time_deliveries(self, s: settings_mod.Settings) -> None:
        """The stat-logger phase of the registry: per-stream rates and the SLO on the clock the client
        sees (`hooks.delivery`), where its setting is on and its probe passes; GET /get_load
        (`hooks.load_endpoint`)."""
        done = registration.install(STAT_LOGGER, s, "api_server", exporter=self.exporter,
                                    sink=self.exporter.engine(self.engine_index).record_delivered)
        if done.get("delivery_clock"):
            self.exporter.time_deliveries()

    def _engine(self, idx: int):
        st = self._engines.get(idx)
        if st is None:
            st = self._engines[idx] = self.exporter.engine(idx)
        return st

    def record_step(self, step: HookStep) -> None:
        """One scheduler-hook step from the channel (the reader thread)."""
        self._engine(step.engine).record_step(step)

    def count_invalid(self, fields) -> None:
        """A channel record `HookStep.from_wire` refused: counted, not recorded."""
        self._engine(fields[0] if fields and isinstance(fields[0], int) else 0).children.invalid.inc()

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        if self.exporter is None:
            return
        try:
            self._engine(engine_idx).record_stats(stats.read(scheduler_stats, iteration_stats))
        except Exception as exc:
            errors.report("record", exc)

    def log_engine_initialized(self):
        try:
            if self.exporter is not None:
                self._set_info()
        except Exception as exc:
            errors.report("log_engine_initialized", exc)

    def log(self):
        pass
