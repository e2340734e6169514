"""What the installed vLLM offers the plugin, feature by feature, decided by probing its classes and
signatures rather than by its version number.

Each probe returns a `Capability`: on or off, and the reason in words (the first missing piece).
`vllm-spark doctor`, the start-up log line and `vllm_spark_info` all show these; the hooks switch a
feature on only when its probe passes.  The release window (`WINDOW`) is the range of releases the
probes were checked against on real installs (docs/vllm-releases.md); outside it a passing probe
still switches the feature on, and the log says the release was not checked.
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
from dataclasses import dataclass

from .platform import version_tuple, vllm_version
from .releases import WINDOW  # oldest and newest minor release checked (inclusive)

SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"
STAT_LOGGER_GROUP = "vllm.stat_logger_plugins"


@dataclass(frozen=True)
class Capability:
    name: str
    ok: bool
    reason: str  # what it needs and found, or the first piece missing

    def __str__(self) -> str:
        return f"{self.name}: {'on' if self.ok else 'off'} ({self.reason})"


def in_window(version: str | None = None) -> bool:
    v = version_tuple(version)
    return WINDOW[0] <= v <= WINDOW[1]


def window_text() -> str:
    (a, b), (c, d) = WINDOW
    return f"{a}.{b}-{c}.{d}"


def _attr(path: str):
    """Import `module:attr.attr` and return the object; raises with the missing piece named."""
    module, _, attrs = path.partition(":")
    obj = importlib.import_module(module)
    for name in filter(None, attrs.split(".")):
        if not hasattr(obj, name):
            raise LookupError(f"{module}:{attrs} has no {name!r}")
        obj = getattr(obj, name)
    return obj


def _first_attr(*paths: str):
    errors = []
    for p in paths:
        try:
            return _attr(p)
        except Exception as exc:
            errors.append(f"{p} ({type(exc).__name__})")
    raise LookupError("none of " + ", ".join(errors))


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def _probe(name: str, check) -> Capability:
    try:
        return Capability(name, True, check())
    except Exception as exc:
        return Capability(name, False, f"{type(exc).__name__}: {exc}")


# --- the per-step scheduler hook (engine core) -----------------------------------------------------
SCHEDULER_OUTPUT_FIELDS = ("num_scheduled_tokens", "total_num_scheduled_tokens", "scheduled_new_reqs",
                           "scheduled_cached_reqs")


def _check_step_hook() -> str:
    sched = _attr(SCHEDULER_MODULE + ":Scheduler")
    for method in ("schedule", "update_from_output"):
        if not callable(getattr(sched, method, None)):
            raise LookupError(f"Scheduler has no {method}()")
    upd = _params(sched.update_from_output)
    if upd[:3] != ["self", "scheduler_output", "model_runner_output"]:
        raise LookupError(f"Scheduler.update_from_output{tuple(upd)} is not (scheduler_output, model_runner_output)")
    out = _attr("vllm.v1.core.sched.output:SchedulerOutput")
    names = {f.name for f in dataclasses.fields(out)} if dataclasses.is_dataclass(out) else set(dir(out))
    missing = [f for f in SCHEDULER_OUTPUT_FIELDS if f not in names]
    if missing:
        raise LookupError(f"SchedulerOutput lacks {', '.join(missing)}")
    pool = _attr("vllm.v1.core.block_pool:BlockPool")
    if not callable(getattr(pool, "get_num_free_blocks", None)):
        raise LookupError("BlockPool has no get_num_free_blocks()")
    return "Scheduler.schedule/update_from_output, SchedulerOutput and BlockPool as expected"


def step_hook() -> Capability:
    """Per-step batch, composition, step duration and KV blocks from the engine core's scheduler."""
    return _probe("step_hook", _check_step_hook)


# --- the stat logger (API server) ------------------------------------------------------------------
STATS_FIELDS = {
    "SchedulerStats": ("num_running_reqs", "num_waiting_reqs", "kv_cache_usage"),
    "IterationStats": ("num_generation_tokens", "num_prompt_tokens", "time_to_first_tokens_iter",
                       "finished_requests"),
    "FinishedRequestStats": ("num_generation_tokens", "decode_time", "num_prompt_tokens", "finish_reason"),
}


def _fields_of(cls) -> set[str]:
    if dataclasses.is_dataclass(cls):
        return {f.name for f in dataclasses.fields(cls)}
    names = set(getattr(cls, "__struct_fields__", ()) or ())  # msgspec
    names |= set(getattr(cls, "__annotations__", {}))
    names |= {n for n in STATS_FIELDS.get(cls.__name__, ()) if hasattr(cls, n)}  # properties
    try:  # plain classes that set their fields in __init__
        names |= set(inspect.signature(cls).parameters)
        src = inspect.getsource(cls.__init__)
        names |= {n for n in STATS_FIELDS.get(cls.__name__, ()) if f"self.{n}" in src}
    except (TypeError, ValueError, OSError):
        pass
    return names


def _check_stat_logger() -> str:
    group = getattr(importlib.import_module("vllm.plugins"), "STAT_LOGGER_PLUGINS_GROUP", None)
    if group != STAT_LOGGER_GROUP:
        raise LookupError(f"vLLM loads no {STAT_LOGGER_GROUP!r} entry points")
    base = _attr("vllm.v1.metrics.loggers:StatLoggerBase")
    rec = _params(base.record)
    if rec[:3] != ["self", "scheduler_stats", "iteration_stats"]:
        raise LookupError(f"StatLoggerBase.record{tuple(rec)} is not (scheduler_stats, iteration_stats, ...)")
    stats = importlib.import_module("vllm.v1.metrics.stats")
    for cls_name, wanted in STATS_FIELDS.items():
        have = _fields_of(getattr(stats, cls_name))
        missing = [f for f in wanted if f not in have]
        if missing:
            raise LookupError(f"{cls_name} lacks {', '.join(missing)}")
    return f"{STAT_LOGGER_GROUP} entry points; StatLoggerBase.record and the stats fields as expected"


def stat_logger() -> Capability:
    """TTFT, per-stream decode rate, tokens, running/waiting and KV usage in the API server."""
    return _probe("stat_logger", _check_stat_logger)


# --- the delivery clock (API server) --------------------------------------------------------------
ENGINE_CLIENT = "vllm.v1.engine.async_llm:AsyncLLM"


def engine_client_class():
    """The engine client the OpenAI server iterates per request (AsyncLLM, every release in the window)."""
    return _attr(ENGINE_CLIENT)


def asgi_app_class():
    """Starlette, the ASGI application class vLLM's OpenAI server is built on; None when it is not
    importable or its entry is not `async __call__(scope, receive, send)` (the clock then starts at
    `generate`)."""
    try:
        app = _attr("starlette.applications:Starlette")
        call = inspect.unwrap(app.__call__)
        if inspect.iscoroutinefunction(call) and _params(call)[:4] == ["self", "scope", "receive", "send"]:
            return app
    except Exception:
        pass
    return None


def _check_delivery_clock() -> str:
    cls = engine_client_class()
    if not inspect.isasyncgenfunction(getattr(cls, "generate", None)):
        raise LookupError("AsyncLLM.generate is not an async generator")
    gen = _params(cls.generate)
    if gen[:4] != ["self", "prompt", "sampling_params", "request_id"]:
        raise LookupError(f"AsyncLLM.generate{tuple(gen)} is not (prompt, sampling_params, request_id, ...)")
    kind = _attr("vllm.sampling_params:RequestOutputKind")
    missing = [k for k in ("CUMULATIVE", "DELTA", "FINAL_ONLY") if not hasattr(kind, k)]
    if missing:
        raise LookupError(f"RequestOutputKind lacks {', '.join(missing)}")
    _attr("vllm.outputs:RequestOutput")
    start = "HTTP arrival (Starlette)" if asgi_app_class() is not None else "generate() (no Starlette entry)"
    return f"AsyncLLM.generate (async generator of RequestOutput) and RequestOutputKind; clock from {start}"


def delivery_clock() -> Capability:
    """Per-stream rate and SLO judged where the API server hands tokens to the client's handler."""
    return _probe("delivery_clock", _check_delivery_clock)


# --- NVFP4 quantization config and the MoE policy -------------------------------------------------
def moe_layer_class():
    """The layer class that holds MoE weights (every release in the window)."""
    return _first_attr("vllm.model_executor.layers.fused_moe:RoutedExperts",
                       "vllm.model_executor.layers.fused_moe.routed_experts:RoutedExperts")


def modelopt_linear_method_class():
    """vLLM's ModelOpt NVFP4 linear method: ModelOptLinearMethod (0.30 on), ModelOptNvFp4LinearMethod before."""
    return _first_attr("vllm.model_executor.layers.quantization.modelopt:ModelOptLinearMethod",
                       "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4LinearMethod")


def unquantized_moe_method_class():
    return _first_attr(
        "vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method:UnquantizedFusedMoEMethod",
        "vllm.model_executor.layers.fused_moe.layer:UnquantizedFusedMoEMethod",
        "vllm.model_executor.layers.fused_moe:UnquantizedFusedMoEMethod")


NVFP4_PIECES = (
    "vllm.model_executor.layers.quantization:register_quantization_config",
    "vllm.model_executor.layers.quantization.base_config:QuantizationConfig",
    "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4Config",
    "vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE",
    "vllm.model_executor.layers.linear:UnquantizedLinearMethod",
    "vllm.model_executor.layers.linear:WEIGHT_LOADER_V2_SUPPORTED",
    "vllm.model_executor.parameter:ModelWeightParameter",
    "vllm.model_executor.parameter:PerTensorScaleParameter",
    "vllm.model_executor.utils:replace_parameter",
    "vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils:dequantize_to_dtype",
)


def _check_nvfp4() -> str:
    for p in NVFP4_PIECES:
        _attr(p)
    layer = moe_layer_class()
    unquantized_moe_method_class()
    linear = modelopt_linear_method_class()
    fused = _attr("vllm.model_executor.layers.quantization.modelopt:ModelOptNvFp4FusedMoE")
    init = _params(fused.__init__)
    if init[:3] != ["self", "quant_config", "moe_config"]:
        raise LookupError(f"ModelOptNvFp4FusedMoE.__init__{tuple(init)} is not (quant_config, moe_config)")
    return f"register_quantization_config, ModelOpt NVFP4 classes ({linear.__name__}), MoE layer {layer.__name__}"


def nvfp4_config() -> Capability:
    """The `spark_nvfp4` quantization config (claims ModelOpt NVFP4 checkpoints)."""
    return _probe("nvfp4_config", _check_nvfp4)


def _check_moe_policy() -> str:
    oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.nvfp4")
    for name in ("map_nvfp4_backend", "backend_to_kernel_cls"):
        if not callable(getattr(oracle, name, None)):
            raise LookupError(f"fused_moe.oracle.nvfp4 has no {name}()")
    cfg = _attr("vllm.model_executor.layers.fused_moe.config:FusedMoEConfig")
    if "moe_backend" not in _fields_of(cfg):
        raise LookupError("FusedMoEConfig has no moe_backend (no --moe-backend)")
    return "fused_moe.oracle.nvfp4 and FusedMoEConfig.moe_backend"


def moe_policy() -> Capability:
    """The GB10 NVFP4 MoE backend policy (needs vLLM's backend oracle and --moe-backend)."""
    return _probe("moe_policy", _check_moe_policy)


# --- the start-up memory snapshot (engine core) ---------------------------------------------------
EXECUTOR_MODULE = "vllm.v1.executor.abstract"


def _check_startup_snapshot() -> str:
    executor = _attr(EXECUTOR_MODULE + ":Executor")
    init = _params(executor.__init__)
    if init[:2] != ["self", "vllm_config"]:
        raise LookupError(f"Executor.__init__{tuple(init)} is not (vllm_config)")
    try:
        builds_workers = "_init_executor(" in inspect.getsource(executor.__init__)
    except (OSError, TypeError):
        builds_workers = True  # no source (zipped install): the signature has to do
    if not builds_workers:
        raise LookupError("Executor.__init__ no longer builds the workers (_init_executor)")
    cache = _attr("vllm.config:CacheConfig")
    missing = [f for f in ("gpu_memory_utilization", "kv_cache_memory_bytes") if f not in _fields_of(cache)]
    if missing:
        raise LookupError(f"CacheConfig lacks {', '.join(missing)}")
    return "Executor.__init__(vllm_config) builds the workers; CacheConfig.gpu_memory_utilization"


def startup_snapshot() -> Capability:
    """The unified-memory snapshot before the workers (and vLLM's free-memory check) start."""
    return _probe("startup_snapshot", _check_startup_snapshot)


# --- the SLO guard's levers (engine core) ---------------------------------------------------------
# Admission into RUNNING: the limit vLLM's waiting loop checks (`num_running >= self.<attr>`), per
# release: max_num_active_reqs (0.32 on, separate from the model runner's slot count), else
# max_num_running_reqs.  The prefill lever: the step's token budget, read once at the top of schedule().
ADMISSION_ATTRIBUTES = ("max_num_active_reqs", "max_num_running_reqs")
BUDGET_ATTRIBUTE = "max_num_scheduled_tokens"
ENTERS_RUNNING = "self.running.append("  # the one place a waiting request enters RUNNING (0.27-0.34)


def _schedule_source() -> tuple[str, str]:
    sched = _attr(SCHEDULER_MODULE + ":Scheduler")
    return inspect.getsource(inspect.unwrap(sched.schedule)), inspect.getsource(sched.__init__)


def admission_attribute() -> str:
    """The Scheduler attribute that bounds admission into RUNNING on this release (LookupError if none):
    set in __init__, and checked in schedule() before every place a waiting request enters RUNNING."""
    schedule, init = _schedule_source()
    for attr in ADMISSION_ATTRIBUTES:
        if f"self.{attr} =" in init and f">= self.{attr}" in schedule:
            check = schedule.index(f">= self.{attr}")
            if any(m.start() < check for m in re.finditer(re.escape(ENTERS_RUNNING), schedule)):
                raise LookupError(f"Scheduler.schedule lets a request into RUNNING before it checks self.{attr}")
            return attr
    raise LookupError("Scheduler.schedule checks none of " + ", ".join(ADMISSION_ATTRIBUTES)
                      + " before admitting a waiting request")


def waiting_requests(sched) -> int:
    """Requests waiting for a running slot: vLLM's own count where the release has one
    (`Scheduler.get_request_counts`: the waiting queue plus 0.27's skipped_waiting, 0.31's
    kv_holding_waiting, 0.34's async_kv_waiting), else the waiting queue's length."""
    counts = getattr(sched, "get_request_counts", None)
    return counts()[1] if counts is not None else len(sched.waiting)


# What else in schedule() decides which waiting request enters RUNNING, placed against the admission
# check in the installed release's source (docs/vllm-releases.md says what each does).  The cap holds
# while each acts before the check (reordering the queue) or between the check and the entry into
# RUNNING (holding a request back); the contract tests read this on each release.
ADMISSION_FEATURES = {
    "cache_aware_admission": "self._reorder_waiting_by_cached_prefix(",  # 0.34: reorders the queue's head
    "inflight_kv_loads": "self._admits_inflight_kv_load(",  # 0.34: --max-num-inflight-kv-loads
}


def admission_path() -> list[tuple[str, int]]:
    """[(what, offset in Scheduler.schedule's source)] in source order: "admission_check" (the first
    check of the admission attribute), each entry into RUNNING ("enters_running") and each of
    ADMISSION_FEATURES this release has.  LookupError when there is no admission lever."""
    schedule, _ = _schedule_source()
    marks = {"admission_check": f">= self.{admission_attribute()}", "enters_running": ENTERS_RUNNING,
             **ADMISSION_FEATURES}
    found = [(name, m.start()) for name, text in marks.items() for m in re.finditer(re.escape(text), schedule)]
    first_check = min(at for name, at in found if name == "admission_check")
    return sorted(((n, at) for n, at in found if n != "admission_check" or at == first_check), key=lambda x: x[1])


def _check_guard_admission() -> str:
    return f"Scheduler.{admission_attribute()} bounds admission from the waiting queue"


def guard_admission() -> Capability:
    """The admission guard's lever: a per-step limit on running requests vLLM's scheduler reads."""
    return _probe("guard_admission", _check_guard_admission)


def _check_guard_prefill() -> str:
    schedule, init = _schedule_source()
    if f"self.{BUDGET_ATTRIBUTE} =" not in init or f"token_budget = self.{BUDGET_ATTRIBUTE}" not in schedule:
        raise LookupError(f"Scheduler.schedule does not take its token budget from self.{BUDGET_ATTRIBUTE}")
    return f"Scheduler.{BUDGET_ATTRIBUTE} is the step's token budget"


def guard_prefill() -> Capability:
    """The prefill guard's lever: the per-step token budget vLLM's scheduler reads."""
    return _probe("guard_prefill", _check_guard_prefill)


def _check_guard() -> str:
    have = [c for c in (guard_admission(), guard_prefill()) if c.ok]
    if not have:
        raise LookupError("neither lever: " + guard_admission().reason + "; " + guard_prefill().reason)
    _check_step_hook()  # the guard's fit is fed by the step hook
    return "; ".join(c.reason for c in have)


def guard() -> Capability:
    """Some lever of the guard exists (each is probed again for the mode asked for)."""
    return _probe("guard", _check_guard)


# --- GET /get_load (API server) --------------------------------------------------------------------
# vLLM's endpoint-plugin contract: `attach_endpoint_plugins(app, ...)` imports `load_endpoint_plugins`
# from `vllm.plugins` when it runs and calls `attach_router(app)` on each plugin it returns.
ENDPOINT_LOADER = "vllm.plugins:load_endpoint_plugins"
ENDPOINT_ATTACH = ("vllm.plugins.endpoint_plugins.interface:attach_endpoint_plugins",  # 0.32 on
                   "vllm.entrypoints.openai.api_server:_attach_endpoint_plugins")  # 0.27.1 (read from its wheel)


def endpoint_plugin_loader_owner():
    """The module whose `load_endpoint_plugins` vLLM's app builder calls (`vllm.plugins`)."""
    return importlib.import_module(ENDPOINT_LOADER.partition(":")[0])


def endpoint_plugins_attacher():
    """The function vLLM's app builder calls to attach endpoint plugins (`attach_endpoint_plugins`)."""
    return _first_attr(*ENDPOINT_ATTACH)


def _check_load_endpoint() -> str:
    loader = _attr(ENDPOINT_LOADER)
    if "supported_tasks" not in _params(inspect.unwrap(loader)):
        raise LookupError("vllm.plugins.load_endpoint_plugins takes no supported_tasks")
    attach = endpoint_plugins_attacher()
    try:
        src = inspect.getsource(attach)
    except (OSError, TypeError):
        raise LookupError("attach_endpoint_plugins has no source to check") from None
    if "from vllm.plugins import load_endpoint_plugins" not in src or ".attach_router(app)" not in src:
        raise LookupError("attach_endpoint_plugins does not load plugins from vllm.plugins at call time "
                          "and call attach_router(app)")
    return "vLLM's endpoint-plugin contract (attach_endpoint_plugins -> load_endpoint_plugins, attach_router)"


def load_endpoint() -> Capability:
    """GET /get_load on vLLM's port, added through vLLM's endpoint-plugin contract."""
    return _probe("load_endpoint", _check_load_endpoint)


PROBES = {"step_hook": step_hook, "stat_logger": stat_logger, "delivery_clock": delivery_clock,
          "nvfp4_config": nvfp4_config, "moe_policy": moe_policy,
          "startup_snapshot": startup_snapshot, "guard_admission": guard_admission,
          "guard_prefill": guard_prefill, "load_endpoint": load_endpoint}


def all_capabilities() -> dict[str, Capability]:
    return {name: probe() for name, probe in PROBES.items()}


def summary(caps: dict[str, Capability] | None = None) -> str:
    caps = caps if caps is not None else all_capabilities()
    off = [c for c in caps.values() if not c.ok]
    where = "in" if in_window() else "OUTSIDE"
    head = f"vLLM {vllm_version()} ({where} the checked window {window_text()})"
    if not off:
        return f"{head}: all features on"
    return f"{head}: off: " + "; ".join(f"{c.name} ({c.reason})" for c in off)
