"""What `register()` does in each vLLM process (vLLM calls it once in every one of them).

* every process: the one settings instance; the run directory and the error spill (so contained
  errors anywhere reach the API server's /metrics); the NVFP4 config and the MoE policy state, where
  the installed vLLM offers what they need;
* engine core: the scheduler hook, installed when vLLM imports its scheduler; the unified-memory
  snapshot before the executor builds its workers (`hooks.startup`);
* API server: the stat logger, a separate entry point (`hooks.stat_logger`).
"""
from __future__ import annotations

import logging
import os
import threading

from vllm_spark_plugin import __version__, settings
from vllm_spark_plugin.hooks import channel, roles
from vllm_spark_plugin.metrics import errors

log = logging.getLogger("vllm_spark_plugin")
_otel_started = False
_otel_lock = threading.Lock()
NVFP4_STATE: dict = {"registered": False, "reason": "not tried"}  # for vllm_spark_info and doctor


def _spill(counts) -> None:
    if counts is None:
        channel.drop_spilled()
    else:
        channel.spill_errors(counts)


def register_all() -> None:
    s = settings.current()
    role = roles.process_role()
    if s.disable:
        log.info("vllm-spark-plugin %s: disabled by SPARK_PLUGIN_DISABLE", __version__)
        return
    try:
        channel.ensure_run_dir()
        errors.set_spill(_spill)
    except Exception as exc:
        errors.report("run_dir", exc)
    log.info("vllm-spark-plugin %s loaded in process %s (pid %d, role %s)", __version__,
             __import__("multiprocessing").current_process().name, os.getpid(), role)
    if s.scheduler_hook:
        try:
            from vllm_spark_plugin.hooks import scheduler
            scheduler.install(errors.report)
        except Exception as exc:
            errors.report("scheduler_hook_install", exc)
    if s.memory_guard:
        try:
            from vllm_spark_plugin.hooks import startup
            startup.install(errors.report)
        except Exception as exc:
            errors.report("startup_snapshot_install", exc)
    register_nvfp4(announce=role == "api_server")
    for where, fn in (("moe_state_path", _moe_state_path), ("tuned_configs", _tuned_configs)):
        try:
            fn()
        except Exception as exc:
            errors.report(where, exc)


def register_nvfp4(announce: bool = False) -> bool:
    """Register the NVFP4 config where the installed vLLM has every piece it builds on."""
    from vllm_spark_plugin.vllm import capabilities
    try:
        cap = capabilities.nvfp4_config()
        if not cap.ok:
            NVFP4_STATE.update(registered=False, reason=cap.reason)
            if announce:
                log.warning("vllm-spark-plugin: NVFP4 config not registered: vLLM %s lacks %s",
                            capabilities.vllm_version(), cap.reason)
            return False
        from vllm_spark_plugin.hooks import nvfp4_claim
        nvfp4_claim.register_nvfp4_quantization()
        NVFP4_STATE.update(registered=True, reason=cap.reason)
        return True
    except Exception as exc:
        NVFP4_STATE.update(registered=False, reason=f"{type(exc).__name__}: {exc}")
        errors.report("quant_config_register", exc)
        return False


def _moe_state_path() -> None:
    from vllm_spark_plugin.moe import policy
    policy.ensure_state_path()


def _tuned_configs() -> None:
    from vllm_spark_plugin.moe import tuned_configs
    tuned_configs.apply()


def moe_backend_label() -> str:
    try:
        from vllm_spark_plugin.moe import policy
        return policy.current_moe_backend()
    except Exception:
        return "none"


def start_otel_bridge() -> None:
    """Start the OTLP bridge once per process when an endpoint is configured (off by default)."""
    global _otel_started
    endpoint = settings.current().otel_endpoint
    if not endpoint:
        return
    with _otel_lock:
        if _otel_started:
            return
        _otel_started = True
    try:
        from vllm_spark_plugin.metrics.otel_bridge import OtelBridge
        OtelBridge(endpoint, settings.current().otel_interval_seconds).start()
    except Exception as exc:
        errors.report("otel_bridge", exc)
