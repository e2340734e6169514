"""The `vllm.stat_logger_plugins` entry point: vLLM calls `record()` once per engine step in the
API-server process.  Everything it does is O(1) per step plus O(1) per finished request, and no
exception leaves it.
"""
from __future__ import annotations

import logging

from vllm_spark_plugin import _vllm
from vllm_spark_plugin.metrics import errors
from vllm_spark_plugin.metrics.derive import derive

log = logging.getLogger("vllm_spark_plugin")


class SparkStatLogger(_vllm.stat_logger_base()):
    def __init__(self, vllm_config, engine_index: int = 0):
        self.engine_index = engine_index
        self.exporter = None
        self._engines: dict = {}
        try:
            from vllm_spark_plugin.metrics import exporter as exporter_mod
            from vllm_spark_plugin import plugin
            if plugin.settings().disable:
                return
            self.exporter = exporter_mod.get(_vllm.model_name(vllm_config))
            self.exporter.set_total_blocks(_vllm.num_gpu_blocks(vllm_config))
            self.exporter.engine(engine_index)
            self.exporter.set_info(_vllm.vllm_version(), _vllm.device_name(), plugin.moe_backend_label())
            self.exporter.start_background()
            plugin.start_otel_bridge()
            log.info("vllm-spark-plugin: stat logger active in the API server (engine %d, pid %d, "
                     "%d KV blocks)", engine_index, __import__("os").getpid(), self.exporter.total_blocks or 0)
        except Exception as exc:
            errors.report("stat_logger_init", exc)
            self.exporter = None

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
        exp = self.exporter
        if exp is None:
            return
        try:
            st = self._engines.get(engine_idx)
            if st is None:
                st = self._engines[engine_idx] = exp.engine(engine_idx)
            st.record(derive(_vllm.unpack(scheduler_stats, iteration_stats), exp.total_blocks))
        except Exception as exc:
            errors.report("record", exc)

    def log_engine_initialized(self):
        try:
            if self.exporter is not None:
                from vllm_spark_plugin import plugin
                self.exporter.set_info(_vllm.vllm_version(), _vllm.device_name(), plugin.moe_backend_label())
        except Exception as exc:
            errors.report("log_engine_initialized", exc)

    def log(self):
        pass
