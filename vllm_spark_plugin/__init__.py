"""vllm-spark-plugin: a vLLM plugin for DGX Spark (GB10).

`register()` is the `vllm.general_plugins` entry point.  vLLM calls it once in every process (API
server, engine core, workers).  It must be cheap, idempotent, and never raise into vLLM.
"""
from __future__ import annotations

from vllm_spark_plugin._version import __version__  # noqa: F401  (re-exported)

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        _adopt_vllm_logging()
        from vllm_spark_plugin.hooks import registration
        registration.register_all()
    except Exception as exc:  # never take vLLM down over the plugin
        import logging
        logging.getLogger("vllm_spark_plugin").warning(
            "vllm-spark-plugin: registration failed, plugin inactive: %r", exc)


def _adopt_vllm_logging() -> None:
    """Route the plugin's log records through vLLM's logger, so they look like vLLM's lines and
    appear at INFO.  vLLM configures its handlers lazily (after plugins load in the API server), so
    the plugin's logger is made a child of "vllm" rather than copying handlers."""
    import logging
    ours = logging.getLogger("vllm_spark_plugin")
    ours.parent = logging.getLogger("vllm")
