"""What `register()` does in each vLLM process.

* every process: read settings; register the NVFP4 quantization config and the GB10 MoE policy;
* engine-core process: wrap the scheduler (exact step time, composition, KV blocks);
* API-server process: the stat logger (a separate entry point) exports to /metrics.
"""
from __future__ import annotations

import logging
import os
import threading

from vllm_spark_plugin import __version__, _vllm
from vllm_spark_plugin import settings as settings_mod
from vllm_spark_plugin.metrics import errors

log = logging.getLogger("vllm_spark_plugin")
_settings: settings_mod.Settings | None = None
_otel_started = False
_otel_lock = threading.Lock()


def settings() -> settings_mod.Settings:
    global _settings
    if _settings is None:
        _settings = settings_mod.load()
    return _settings


def register_all() -> None:
    s = settings()
    role = _vllm.process_role()
    if s.disable:
        log.info("vllm-spark-plugin %s: disabled by SPARK_PLUGIN_DISABLE", __version__)
        return
    if not _vllm.is_supported():
        log.warning("vllm-spark-plugin %s: vLLM %s was not checked with this plugin (checked: %s); "
                    "metrics may be incomplete", __version__, _vllm.vllm_version(),
                    ", ".join(f"{a}.{b}" for a, b in _vllm.SUPPORTED))
    log.info("vllm-spark-plugin %s loaded in process %s (pid %d, role %s)", __version__,
             __import__("multiprocessing").current_process().name, os.getpid(), role)
    if s.scheduler_hook:
        try:
            _vllm.install_scheduler_hook(errors.report)
        except Exception as exc:
            errors.report("scheduler_hook_install", exc)
    try:
        from vllm_spark_plugin import quant
        register = getattr(quant, "register", None)
        if register is not None:
            register()
    except Exception as exc:
        errors.report("quant_register", exc)


def moe_backend_label() -> str:
    try:
        from vllm_spark_plugin.moe import policy
        return policy.current_moe_backend()
    except Exception:
        return "none"


def start_otel_bridge() -> None:
    """Start the OTLP bridge once per process when an endpoint is configured (off by default)."""
    global _otel_started
    endpoint = settings().otel_endpoint
    if not endpoint:
        return
    with _otel_lock:
        if _otel_started:
            return
        _otel_started = True
    try:
        from vllm_spark_plugin.metrics.otel_bridge import OtelBridge
        OtelBridge(endpoint, settings().otel_interval_seconds).start()
    except Exception as exc:
        errors.report("otel_bridge", exc)
