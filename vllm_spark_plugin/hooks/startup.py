"""The unified-memory snapshot at engine start-up, for every model: wraps vLLM's `Executor.__init__`
(`vllm.v1.executor.abstract`), so the snapshot is logged once per engine, in the engine core,
before the executor builds its workers.

Why there: vLLM's own free-memory check runs in the worker (CUDA: `Worker.init_device` ->
`v1/worker/utils.py::request_memory`, utilisation x total against CUDA's free memory, which is
MemFree on unified memory; CPU build: `CPUWorker.__init__`, against the NUMA node's available memory
unless the KV cache size is given) and raises before the model loads.  The worker class is resolved
and built right after the plugin loads in the worker, and with one GPU the worker lives in the
engine core; `Executor.__init__` is the one point in every release 0.26-0.34 that holds the
`VllmConfig`, runs after the plugin has loaded in the engine core, and comes before any worker
(so before the check) on every executor (uniprocess, multiprocess, Ray).  The engine core loads
the plugin inside `EngineCore.__init__`, so wrapping that method would miss its first call.

Registered in `hooks.PATCHES`; switched on when `vllm.capabilities.startup_snapshot()` passes and
the `memory_guard` setting is on.  Never raises into vLLM: a failure is counted under
`where="startup_snapshot"` and the executor is built as if the hook were not there.
"""
from __future__ import annotations

import functools
import logging

from vllm_spark_plugin.hooks import after_import, patching
from vllm_spark_plugin.vllm.capabilities import EXECUTOR_MODULE

log = logging.getLogger("vllm_spark_plugin")

PATCH = "startup_snapshot"
# vLLM's CPU build does not run the CUDA check; what it does instead, in words for the log line
CPU_KV_GIVEN = ("CPU build: the KV cache is sized by VLLM_CPU_KVCACHE_SPACE / --kv-cache-memory-bytes "
                "({gib:.1f} GiB), not by gpu_memory_utilization {util:.2f}")
CPU_KV_UNSET = ("CPU build: vLLM compares gpu_memory_utilization {util:.2f} x the NUMA node's memory with the "
                "node's available memory, not with CUDA's free memory")


def install(patch, settings, on_error, **_context) -> None:
    """Wrap `Executor.__init__` now, or as soon as vLLM imports its module."""

    after_import.patch_when_imported(EXECUTOR_MODULE, patch.probe,
                                     lambda module: patch_executor(module.Executor, on_error), on_error,
                                     "startup_snapshot_install", "no unified-memory snapshot at engine start-up")


def patch_executor(Executor, on_error) -> None:
    """`on_error(where, exc)` is called (never raises) when the snapshot fails; the executor is
    built either way."""
    if patching.marked(Executor, PATCH):
        return
    orig_init = Executor.__init__

    @functools.wraps(orig_init)
    def __init__(self, vllm_config, *args, **kwargs):
        try:
            log_snapshot(vllm_config)
        except Exception as exc:
            on_error("startup_snapshot", exc)
        return orig_init(self, vllm_config, *args, **kwargs)

    patching.replace(PATCH, Executor, "__init__", __init__)
    patching.mark(Executor, PATCH)


def log_snapshot(vllm_config):
    """Log the start-up snapshot for this engine (what vLLM's check will compare, and the fix)."""
    from vllm_spark_plugin.quant import memory_guard
    from vllm_spark_plugin.vllm import platform
    cache = getattr(vllm_config, "cache_config", None)
    util = getattr(cache, "gpu_memory_utilization", None)
    if not isinstance(util, (int, float)):
        return None
    sized_by = None
    if not platform.has_cuda():
        kv = getattr(cache, "kv_cache_memory_bytes", None)
        sized_by = (CPU_KV_GIVEN.format(gib=kv / memory_guard.GIB, util=util) if isinstance(kv, int) and kv > 0
                    else CPU_KV_UNSET.format(util=util))
    rank = getattr(getattr(vllm_config, "parallel_config", None), "data_parallel_rank", 0)
    engine = rank if isinstance(rank, int) and rank >= 0 else 0
    return memory_guard.log_startup_snapshot(float(util), sized_by=sized_by, where=f"engine {engine}")
