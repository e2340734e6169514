"""`GET /get_load` on vLLM's own port: the figure routers read to pick a server
(`metrics.load`; docs/deploy.md, "A fleet behind a router").  API-server process only; installed by
the stat logger, which owns the exporter the figures come from.  Registered in `hooks.PATCHES`.

The route goes in through vLLM's endpoint-plugin contract (an `EndpointPlugin` whose
`attach_router` adds it while vLLM builds the app, after its own routes).  vLLM loads endpoint
plugins only when VLLM_PLUGINS names them, so the plugin wraps `vllm.plugins.load_endpoint_plugins`
to add its own to what vLLM loaded, and nothing else: no VLLM_PLUGINS change for the user to make,
and the route is the one read-only figure.  Where the probe fails, the start-up line says so once and
the server has no /get_load.

Per request: the figures the last step and refit published (one process), or the plugin's gauges
read from prometheus-client's multiprocess files (several API servers); never a fit.  A failure is
counted and answered with 503, never raised into vLLM.
"""
from __future__ import annotations

import os

from vllm_spark_plugin.common import errors
from vllm_spark_plugin.hooks import patching
from vllm_spark_plugin.metrics import load
from vllm_spark_plugin.metrics.telemetry import MULTIPROC_ENV
from vllm_spark_plugin.vllm import capabilities

PATCH = "load_endpoint"
ROUTE = "/get_load"

_ORIGINAL = None
_exporter = None  # the process's metrics.exporter.Exporter, set by install()


def install(patch, settings, on_error, exporter=None, **_context) -> bool:
    """Offer the route to vLLM's endpoint-plugin loader once per process; the first exporter stays.
    False when the probe fails or there is no exporter."""
    global _ORIGINAL, _exporter
    if exporter is None or not getattr(capabilities, patch.probe)().ok:
        return False
    if _exporter is None:
        _exporter = exporter
    if _ORIGINAL is None:
        owner = capabilities.endpoint_plugin_loader_owner()
        current = owner.load_endpoint_plugins
        # already ours (this module's state was reset, the wrap was not): vLLM's loader is behind it;
        # wrapping it again would make the wrapper its own original
        _ORIGINAL = (current.__wrapped__ if current is load_endpoint_plugins
                     else patching.replace(PATCH, owner, "load_endpoint_plugins", load_endpoint_plugins))
    return True


def load_endpoint_plugins(*args, **kwargs):
    """vLLM's loader, plus this plugin's endpoint unless vLLM already loaded one of that name."""
    plugins = _ORIGINAL(*args, **kwargs)
    try:
        if not any(getattr(p, "name", None) == LoadEndpoint.name for p in plugins):
            plugins = [*plugins, LoadEndpoint()]
    except Exception as exc:
        errors.report("load_endpoint", exc)
    return plugins


def current_load() -> int:
    """The `load` this server answers now (`metrics.load`)."""
    exp = _exporter
    if exp is None:
        return 0
    shared = os.environ.get(MULTIPROC_ENV)
    if shared:  # several API servers: each answers for the whole server
        figures = load.from_multiprocess(shared, exp.model)
    else:
        figures = load.from_engines(list(exp.engines.values()))
    return load.server_load(figures)


class LoadEndpoint:
    """The `EndpointPlugin` (vllm/plugins/endpoint_plugins/interface.py) that serves /get_load."""

    name = "spark_load"
    required_tasks = None  # any server with an engine; the render-only server never installs this

    def attach_router(self, app) -> None:
        from fastapi.responses import JSONResponse

        async def get_load():
            try:
                return JSONResponse({"load": current_load()})
            except Exception as exc:
                errors.report("load_endpoint", exc)
                return JSONResponse({"error": f"load unavailable ({type(exc).__name__}); "
                                              "see vllm_spark_plugin_errors_total{where=\"load_endpoint\"}"},
                                    status_code=503)

        app.add_api_route(ROUTE, get_load, methods=["GET"], include_in_schema=False)

    async def init_state(self, engine_client, state, args) -> None:
        pass
