"""NVFP4 for vLLM on GB10: the format (`nvfp4`), the converter (`convert`), checkpoint validation
(`checkpoint`), the unified-memory guard (`memory_guard`) and the `spark_nvfp4` quantization config
registered with vLLM by `register()`.
"""
from __future__ import annotations

import logging
import threading

log = logging.getLogger("vllm_spark_plugin")
_lock = threading.Lock()
_registered = False


def register() -> None:
    """Called by the plugin's general-plugin entry in every vLLM process.  Cheap (imports only
    modules vLLM has loaded by then), idempotent, never raises."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    try:
        from vllm_spark_plugin import _vllm
        _vllm.register_nvfp4_quantization()
    except Exception as exc:
        _contained("quant_config_register", exc)
    try:
        from vllm_spark_plugin.moe import policy
        policy.ensure_state_path()
    except Exception as exc:
        _contained("moe_state_path", exc)
    try:
        from vllm_spark_plugin.moe import tuned_configs
        tuned_configs.apply()
    except Exception as exc:
        _contained("tuned_configs", exc)


def _contained(where: str, exc: BaseException) -> None:
    try:
        from vllm_spark_plugin.metrics import errors
        errors.report(where, exc)
    except Exception:
        log.warning("vllm-spark-plugin: %s failed: %r", where, exc)
