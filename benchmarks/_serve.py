"""The server a benchmark measures: a running plugin server given by --endpoint/--model, or a CPU
`vllm serve` of the tiny test model with the plugin, started here and stopped on the way out."""
from __future__ import annotations

import contextlib
from types import SimpleNamespace


@contextlib.contextmanager
def plugin_server(endpoint: str | None, model: str | None):
    """Yields an object with base_url, metrics_url and model."""
    if endpoint:
        base = endpoint.rstrip("/")
        yield SimpleNamespace(base_url=base, metrics_url=base + "/metrics", model=model)
        return
    from vllm_spark_plugin.testbed.server import VllmServer, prioritize_client
    from vllm_spark_plugin.testbed.tiny_model import ensure_tiny_model
    print("starting a CPU vllm serve of the tiny model with the plugin ...", flush=True)
    server = VllmServer(model_path=str(ensure_tiny_model())).start(timeout=900)
    try:
        server.prioritize_frontend()
        prioritize_client()
        yield server
    finally:
        server.stop()
