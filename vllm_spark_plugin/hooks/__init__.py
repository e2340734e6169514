"""The inbound side of the vLLM port: the only code vLLM calls.

`registration` (the general-plugin entry, in every process: installs the registry's patches),
`scheduler` (the per-step hook in the engine core), `channel` (how engine core and workers reach the
API server), `stats` (reading vLLM's stats objects), `stat_logger` (the stat-logger entry, API server),
`delivery` (the clock the client sees, API server), `load_endpoint` (GET /get_load for routers, API server), `guard` (the SLO guard's levers, engine core), `nvfp4_claim` and `nvfp4_methods` (the
quantization config and its layer methods), `startup` (the unified-memory snapshot before the engine
builds its workers), `after_import` (patching a module once vLLM imports it), `patching` (the one
way an attribute of vLLM is replaced), `roles`.

`PATCHES` is the registry of every place where the plugin patches, subclasses or registers with vLLM:
what it touches, why, the releases it was checked on, what would let it go, and how it is installed
(its probe, its setting, the phase and processes it is installed in, its install function).
`registration.install(phase, ...)` installs exactly what the registry lists, and
`tests/unit/test_patch_registry.py` fails when a wrap site exists that the registry does not list, or
the reverse.  Adding a release to the window means checking each entry (docs/vllm-releases.md has the
facts per release; `scripts/release-matrix.sh` proves them on real installs).
"""
from __future__ import annotations

from dataclasses import dataclass


# When a patch is installed: at plugin load (vLLM's general-plugin entry, every process), by the stat
# logger once the API server's exporter exists, or by vLLM itself (an entry point, a subclass it builds).
PLUGIN_LOAD, STAT_LOGGER, BY_VLLM = "plugin load", "stat logger", "by vLLM"
EVERY = "every"  # processes: every process of a `vllm serve`


@dataclass(frozen=True)
class Patch:
    name: str
    touches: str  # the vLLM object patched or subclassed
    kind: str  # "wrap" (monkeypatch), "subclass", "register" (a public registry), "entry point"
    why: str
    checked: str  # vLLM releases checked on real installs
    removal: str  # what would let the plugin drop it
    phase: str = PLUGIN_LOAD
    install: str = ""  # "module:function", called as fn(patch, settings, on_error, **context); "" when BY_VLLM
    probe: str = ""  # the `vllm.capabilities` probe the install checks before it patches ("" = none)
    setting: str = ""  # the `settings.Settings` switch that must be on ("" = always)
    processes: tuple[str, ...] = (EVERY,)  # `roles.process_role()` values, or EVERY


PATCHES = (
    Patch("scheduler_hook", "vllm.v1.core.sched.scheduler.Scheduler.schedule / .update_from_output", "wrap",
          "per-step wall time, prefill/decode composition and free KV blocks exist only in the engine core; "
          "vLLM's stats carry neither the step's duration nor its exact batch",
          "0.27.1, 0.29.0, 0.32.0 (served); 0.33.0, 0.34.0 (classes and signatures)",
          "vLLM handing per-step iteration details to stat-logger plugins (upstream vllm#53550, "
          "StatLoggerRequirements) or emitting forward-pass metrics (vllm#52061)",
          install="vllm_spark_plugin.hooks.scheduler:install", probe="step_hook", setting="scheduler_hook"),
    Patch("stat_logger", "vllm.v1.metrics.loggers.StatLoggerBase", "entry point",
          "the API server's per-step stats (TTFT, finished requests, running/waiting, KV usage)",
          "0.27.1, 0.29.0, 0.32.0 (served); 0.33.0, 0.34.0 (classes and signatures)",
          "none needed: vllm.stat_logger_plugins is vLLM's public extension point",
          phase=BY_VLLM, processes=("api_server",)),
    Patch("delivery_clock", "vllm.v1.engine.async_llm.AsyncLLM.generate; starlette.applications.Starlette.__call__ "
          "(the HTTP arrival stamp)", "wrap",
          "the per-stream rate and the SLO as the client experiences them: vLLM stamps tokens on the "
          "engine core's clock, before the API server's output processing and the handler's wait",
          "0.27.1, 0.32.0 (served); 0.26.0-0.34.0 (signature)",
          "vLLM recording when each output is handed to the request's consumer (per-request "
          "delivery timestamps in RequestStateStats)",
          phase=STAT_LOGGER, install="vllm_spark_plugin.hooks.delivery:install", probe="delivery_clock",
          setting="delivery_clock", processes=("api_server",)),
    Patch("load_endpoint", "vllm.plugins.load_endpoint_plugins (adds the plugin's EndpointPlugin: GET /get_load)", "wrap",
          "routers (vllm-router --policy power_of_two, SGLang's gateway) poll GET /get_load on each worker; stock vLLM "
          "has none, and its endpoint-plugin group loads a plugin only when VLLM_PLUGINS names it",
          "0.32.0 (served, behind vllm-router 0.1.17: tests/integration/test_router.py); 0.33.0, 0.34.0 "
          "(probe); 0.27.1 (the source, read from its wheel)",
          "vLLM loading endpoint plugins without VLLM_PLUGINS naming them, or serving a load figure of its own",
          phase=STAT_LOGGER, install="vllm_spark_plugin.hooks.load_endpoint:install", probe="load_endpoint",
          processes=("api_server",)),
    Patch("nvfp4_claim", "vllm.model_executor.layers.quantization.register_quantization_config", "register",
          "claim ModelOpt NVFP4 checkpoints on GB10 and on devices without FP4 kernels",
          "0.27.1, 0.29.0, 0.32.0 (served with an NVFP4 checkpoint); 0.33.0, 0.34.0 (classes)",
          "vLLM choosing a correct NVFP4 MoE backend on SM12x by itself and running NVFP4 without CUDA",
          install="vllm_spark_plugin.hooks.nvfp4_claim:install", probe="nvfp4_config"),
    Patch("nvfp4_methods", "ModelOptNvFp4Config, ModelOptNvFp4FusedMoE, UnquantizedFusedMoEMethod, "
          "UnquantizedLinearMethod (+ WEIGHT_LOADER_V2_SUPPORTED)", "subclass",
          "the GB10 MoE backend policy, and the reference (dequantise-at-load) path on the CPU",
          "0.27.1, 0.29.0, 0.32.0 (served); 0.33.0, 0.34.0 (classes)",
          "as for nvfp4_claim",
          phase=BY_VLLM),
    Patch("startup_snapshot", "vllm.v1.executor.abstract.Executor.__init__", "wrap",
          "vLLM's start-up free-memory check (CUDA: request_memory in Worker.init_device, against MemFree on "
          "unified memory; CPU: CPUWorker.__init__) fails or leaves the OS too little with no word on why; the "
          "snapshot and its fix are logged once per engine before the workers are built, for every model",
          "0.32.0 (served, CPU); 0.26.0-0.34.0 (classes and signatures)",
          "vLLM reading MemAvailable (or cudaMemGetInfo counting reclaimable page cache) on unified memory "
          "(vllm#48140) and saying the fix in its own error",
          install="vllm_spark_plugin.hooks.startup:install", probe="startup_snapshot", setting="memory_guard"),
    Patch("guard", "vllm.v1.core.sched.scheduler.Scheduler.schedule (for the one call: max_num_active_reqs, or "
          "max_num_running_reqs before 0.32, and max_num_scheduled_tokens)", "wrap",
          "the opt-in SLO guard (SPARK_PLUGIN_GUARD): admission into RUNNING capped at the live capacity and "
          "the prefill per step bounded so running streams keep the floor; vLLM offers no per-step limit hook",
          "0.27.1, 0.32.0 (a real Scheduler, tests/contract/test_guard_scheduler.py); 0.33.0 (probes: the source); "
          "0.34.0 (a real Scheduler: throttle_prefills through the wrap, tests/contract/test_admission_path.py)",
          "vLLM exposing an admission policy or a per-step token-budget hook to plugins",
          install="vllm_spark_plugin.hooks.guard:install", probe="guard", setting="guard_on"),
    Patch("tuned_configs", "VLLM_TUNED_CONFIG_FOLDER (environment)", "register",
          "GB10 Triton fused-MoE configs vLLM does not ship",
          "0.27.1, 0.29.0, 0.32.0, 0.33.0",
          "vLLM shipping GB10 configs for the shapes in moe/configs",
          install="vllm_spark_plugin.hooks.registration:install_tuned_configs"),
)
PATCH_NAMES = frozenset(p.name for p in PATCHES)
