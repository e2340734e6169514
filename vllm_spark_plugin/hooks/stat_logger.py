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

from vllm_spark_plugin import settings
from vllm_spark_plugin.hooks import channel, registration
from vllm_spark_plugin.hooks.stats import unpack
from vllm_spark_plugin.metrics import errors
from vllm_spark_plugin.metrics.derive import derive
from vllm_spark_plugin.vllm import capabilities, platform

log = logging.getLogger("vllm_spark_plugin")
_announced = False


def features() -> dict[str, capabilities.Capability]:
    """The capability probes, and the NVFP4 registration as it went in this process."""
    caps = capabilities.all_capabilities()
    nv = registration.NVFP4_STATE
    if caps["nvfp4_config"].ok and not nv["registered"] and nv["reason"] != "not tried":
        caps["nvfp4_config"] = capabilities.Capability("nvfp4_config", False, nv["reason"])
    if not settings.current().scheduler_hook:
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
        self.hook_steps = False  # the engines' steps come through the channel (to this or another API server)
        self._engines: dict = {}
        try:
            from vllm_spark_plugin.metrics import exporter as exporter_mod
            if settings.current().disable:
                return
            self.exporter = exporter_mod.get(platform.model_name(vllm_config))
            self.exporter.set_total_blocks(platform.num_gpu_blocks(vllm_config))
            self.exporter.engine(engine_index)
            self.caps = features()
            announce(self.caps)
            self._set_info()
            self.exporter.absorb_errors_from(channel.read_spilled)
            self.exporter.start_background()
            registration.start_otel_bridge()
            self._start_reader()
            self._time_deliveries()
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
        directory = channel.run_dir()
        if directory is None or not self.caps["step_hook"].ok:
            return
        self.hook_steps = True
        reader = channel.StepReader(directory, self._on_step, errors.report)
        if reader.start():  # else another API server of this serve reads them
            self.reader = reader

    def _time_deliveries(self) -> None:
        """Per-stream rates and the SLO on the clock the client sees (`hooks.delivery`)."""
        if not settings.current().delivery_clock or not self.caps["delivery_clock"].ok:
            return
        from vllm_spark_plugin.hooks import delivery
        try:
            delivery.install(self.exporter.engine(self.engine_index).record_delivered)
            self.exporter.delivery_clock = True
        except Exception as exc:
            errors.report("delivery_install", exc)

    def _on_step(self, fields) -> None:
        """One scheduler-hook step (channel thread): validated inline, recorded on the lean path."""
        engine, step_us, pr, pt, dr, dt, free, total, sampled = fields
        st = self._engines.get(engine)
        if st is None:
            st = self._engines[engine] = self.exporter.engine(engine)
        if step_us < 0 or pr < 0 or pt < 0 or dr < 0 or dt < 0:
            st.children.invalid.inc()
            return
        batch = pr + dr
        # vLLM's pool keeps one null block out of circulation: used = total - 1 - free
        kv_used = max(0, total - 1 - free) if total > 0 and free >= 0 else None
        tps = max(1.0, sampled / batch) if sampled >= 0 and batch else 1.0
        st.record_hook_step(batch, step_us / 1e6, pt, dt, kv_used, tps)

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        exp = self.exporter
        if exp is None:
            return
        try:
            st = self._engines.get(engine_idx)
            if st is None:
                st = self._engines[engine_idx] = exp.engine(engine_idx)
            s = unpack(scheduler_stats, iteration_stats)
            # with the hook's records arriving on the channel, the batch histogram is theirs (exact,
            # one per step); vLLM's running count would count each step a second time
            s.batch_from_running = not self.hook_steps
            st.record(derive(s, exp.total_blocks))
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
