"""vllm-spark-plugin: a vLLM plugin for DGX Spark (GB10).

`register()` is the `vllm.general_plugins` entry point.  vLLM calls it once in every process (API
server, engine core, workers).  It must be cheap, idempotent, and never raise into vLLM.
"""
from __future__ import annotations

__version__ = "0.1.0"

_registered = False


def register() -> None:
    global _registered
    if _registered:
        return
    _registered = True
    try:
        _adopt_vllm_logging()
        from vllm_spark_plugin import plugin
        plugin.register_all()
    except Exception as exc:  # never take vLLM down over the plugin
        import logging
        logging.getLogger("vllm_spark_plugin").warning(
            "vllm-spark-plugin: registration failed, plugin inactive: %r", exc)


def _adopt_vllm_logging() -> None:
    """Log through vLLM's handlers, so the plugin's lines look like vLLM's and show at INFO."""
    import logging
    ours, theirs = logging.getLogger("vllm_spark_plugin"), logging.getLogger("vllm")
    if theirs.handlers and not ours.handlers:
        for h in theirs.handlers:
            ours.addHandler(h)
        ours.setLevel(theirs.level or logging.INFO)
        ours.propagate = False
