"""Once-per-process start-up work of the NVFP4 config (runs where the model is built)."""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("vllm_spark_plugin")
_lock = threading.Lock()
_done = False


def once_per_process(quant_config, memory_guard_on: bool) -> None:
    """The unified-memory guard (the `memory_guard` setting), before any weight is loaded.  Never raises."""
    global _done
    with _lock:
        if _done:
            return
        _done = True
    try:
        from vllm_spark_plugin.vllm.platform import current_vllm_config
        from vllm_spark_plugin.quant import memory_guard

        if memory_guard_on:
            from vllm_spark_plugin.vllm import capabilities
            # the engine core's start-up hook logs the snapshot for every model where it can
            memory_guard.check_at_startup(current_vllm_config(),
                                          snapshot=not capabilities.startup_snapshot().ok)
    except Exception as exc:  # a guard must not stop the model from loading
        from vllm_spark_plugin.common import errors
        errors.report("memory_guard", exc)
