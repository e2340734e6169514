"""What `register()` does in each vLLM process (vLLM calls it once in every one of them): load the
process's settings, set up the run directory and the error spill (so contained errors anywhere reach
the API server's /metrics), share the MoE policy's state path, and install every `hooks.PATCHES`
entry of the plugin-load phase whose setting is on and whose processes include this one.  The
stat logger installs the stat-logger phase the same way (`install(STAT_LOGGER, ...)`).
"""
from __future__ import annotations

import importlib
import logging
import os
import threading

from vllm_spark_plugin import settings as settings_mod
from vllm_spark_plugin._version import __version__
from vllm_spark_plugin.common import errors
from vllm_spark_plugin.hooks import EVERY, PATCHES, PLUGIN_LOAD, Patch, channel, roles

log = logging.getLogger("vllm_spark_plugin")
_otel_started = False
_otel_lock = threading.Lock()


def _spill(counts) -> None:
    if counts is None:
        channel.drop_spilled()
    else:
        channel.spill_errors(counts)


def install_function(patch: Patch):
    module, _, name = patch.install.partition(":")
    return getattr(importlib.import_module(module), name)


def applies(patch: Patch, phase: str, settings: settings_mod.Settings, process: str) -> bool:
    """The patch belongs to this phase, runs in this process, and its setting is on."""
    return (patch.phase == phase and bool(patch.install)
            and (EVERY in patch.processes or process in patch.processes)
            and (not patch.setting or bool(getattr(settings, patch.setting))))


def install(phase: str, settings: settings_mod.Settings, process: str, **context) -> dict[str, object]:
    """Install the registry's patches of `phase` for this process: name -> what its install function
    returned (patches skipped by their setting or process are absent).  A failing install is counted
    under `<name>_install` and the others still go in."""
    done = {}
    for patch in PATCHES:
        if not applies(patch, phase, settings, process):
            continue
        try:
            done[patch.name] = install_function(patch)(patch, settings, errors.report, **context)
        except Exception as exc:
            errors.report(f"{patch.name}_install", exc)
    return done


def register_all() -> None:
    s = settings_mod.current()
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
    try:
        from vllm_spark_plugin.moe import policy
        policy.ensure_state_path()  # before vLLM spawns the engine: its processes inherit the path
    except Exception as exc:
        errors.report("moe_state_path", exc)
    install(PLUGIN_LOAD, s, role, role=role)  # role: who logs what is off (the API server)


def install_tuned_configs(patch, settings, on_error, **_context) -> str | None:
    """The `tuned_configs` entry: GB10 fused-MoE configs on VLLM_TUNED_CONFIG_FOLDER (a failure is
    counted under where="tuned_configs", its name on /metrics since the first release)."""
    from vllm_spark_plugin.moe import tuned_configs
    try:
        return tuned_configs.apply()
    except Exception as exc:
        on_error("tuned_configs", exc)
        return None


def nvfp4_state() -> dict:
    from vllm_spark_plugin.hooks import nvfp4_claim
    return nvfp4_claim.STATE


def moe_backend_label() -> str:
    try:
        from vllm_spark_plugin.moe import policy
        return policy.current_moe_backend()
    except Exception:
        return "none"


def start_otel_bridge(settings: settings_mod.Settings) -> None:
    """Start the OTLP bridge once per process when an endpoint is configured (off by default)."""
    global _otel_started
    if not settings.otel_endpoint:
        return
    with _otel_lock:
        if _otel_started:
            return
        _otel_started = True
    try:
        from vllm_spark_plugin.metrics.otel_bridge import OtelBridge
        OtelBridge(settings.otel_endpoint, settings.otel_interval_seconds).start()
    except Exception as exc:
        errors.report("otel_bridge", exc)
