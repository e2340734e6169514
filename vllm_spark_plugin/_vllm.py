"""The ONE module that touches vLLM internals.  Everything else talks to the plain types below.

vLLM documents `SchedulerStats`, `IterationStats` and the scheduler as unstable.  Supporting a new
vLLM release means checking this file against it: the accessors read fields with `getattr`
defaults so a renamed field degrades to "unknown" instead of an exception, and `SUPPORTED` says which
releases were checked.

How per-step truth reaches the API server
-----------------------------------------
vLLM's API server sees `SchedulerStats` once per engine step, but not the step's wall time nor its
exact prefill/decode composition.  The plugin wraps `Scheduler.schedule` and
`Scheduler.update_from_output` in the engine-core process (no `--scheduler-cls` flag needed) and
adds a few integer entries to `SchedulerStats.num_kv_fetch_reqs_by_stage`, a declared
`dict[str, int]` field that survives the msgspec trip between processes (fields of a subclass would
be dropped).  The plugin's stat logger, which vLLM calls before its own loggers, pops those entries
again, so vLLM's own logging never sees them.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field

log = logging.getLogger("vllm_spark_plugin")

# vLLM releases whose internals this module was checked against.
SUPPORTED = ((0, 32), (0, 33))

# Keys carried in SchedulerStats.num_kv_fetch_reqs_by_stage (values are ints).
_K = "spark_plugin/"
K_STEP_US = _K + "step_us"
K_PREFILL_TOKENS = _K + "prefill_tokens"
K_DECODE_TOKENS = _K + "decode_tokens"
K_PREFILL_REQS = _K + "prefill_reqs"
K_DECODE_REQS = _K + "decode_reqs"
K_KV_FREE = _K + "kv_free_blocks"
K_KV_TOTAL = _K + "kv_total_blocks"
_ALL_KEYS = (K_STEP_US, K_PREFILL_TOKENS, K_DECODE_TOKENS, K_PREFILL_REQS, K_DECODE_REQS, K_KV_FREE, K_KV_TOTAL)


def vllm_version() -> str:
    try:
        import vllm
        return str(getattr(vllm, "__version__", "unknown"))
    except Exception:
        return "not installed"


def version_tuple(v: str | None = None) -> tuple[int, int]:
    v = v or vllm_version()
    try:
        major, minor = v.split(".")[:2]
        return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)
    except ValueError:
        return (0, 0)


def is_supported(v: str | None = None) -> bool:
    return version_tuple(v) in SUPPORTED


# --------------------------------------------------------------------------------------------------
# Plain types the rest of the plugin uses
# --------------------------------------------------------------------------------------------------
@dataclass
class FinishedRequest:
    generation_tokens: int | None
    decode_seconds: float | None  # first token -> last token, engine-core clock
    prompt_tokens: int | None
    reason: str


@dataclass
class StepStats:
    """One engine step as the API server receives it (None = not known)."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None  # 0..1, excludes vLLM's null block
    # from the scheduler hook (None when the hook is off or the step came from elsewhere)
    step_seconds: float | None = None
    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    prefill_reqs: int | None = None
    decode_reqs: int | None = None
    kv_free_blocks: int | None = None
    kv_total_blocks: int | None = None
    spec_decoding: bool = False
    scheduler_present: bool = False
    missing: int = 0  # expected fields absent from vLLM's objects (a renamed field, a broken object)
    # from IterationStats
    generation_tokens: int = 0
    prompt_tokens: int = 0
    preempted: int = 0
    ttfts: list = field(default_factory=list)
    finished: list = field(default_factory=list)

    @property
    def has_scheduler_stats(self) -> bool:
        return self.scheduler_present


_MISSING = object()


def unpack(scheduler_stats, iteration_stats) -> StepStats:
    """Read vLLM's stats objects into a StepStats.  Pops the plugin's transport entries."""
    s = StepStats()
    if scheduler_stats is not None:
        s.scheduler_present = True
        s.running = getattr(scheduler_stats, "num_running_reqs", _MISSING)
        s.waiting = getattr(scheduler_stats, "num_waiting_reqs", _MISSING)
        s.kv_usage = getattr(scheduler_stats, "kv_cache_usage", _MISSING)
        for name in ("running", "waiting", "kv_usage"):
            if getattr(s, name) is _MISSING:
                setattr(s, name, None)
                s.missing += 1
        s.spec_decoding = getattr(scheduler_stats, "spec_decoding_stats", None) is not None
        carried = getattr(scheduler_stats, "num_kv_fetch_reqs_by_stage", None)
        if carried and K_STEP_US in carried:
            us = carried.pop(K_STEP_US)
            s.step_seconds = us / 1e6 if isinstance(us, (int, float)) else None
            s.prefill_tokens = carried.pop(K_PREFILL_TOKENS, None)
            s.decode_tokens = carried.pop(K_DECODE_TOKENS, None)
            s.prefill_reqs = carried.pop(K_PREFILL_REQS, None)
            s.decode_reqs = carried.pop(K_DECODE_REQS, None)
            s.kv_free_blocks = carried.pop(K_KV_FREE, None)
            s.kv_total_blocks = carried.pop(K_KV_TOTAL, None)
    if iteration_stats is not None:
        if not hasattr(iteration_stats, "num_generation_tokens"):
            s.missing += 1
        s.generation_tokens = getattr(iteration_stats, "num_generation_tokens", 0)
        s.prompt_tokens = getattr(iteration_stats, "num_prompt_tokens", 0)
        s.preempted = getattr(iteration_stats, "num_preempted_reqs", 0)
        s.ttfts = getattr(iteration_stats, "time_to_first_tokens_iter", None) or []
        fin = getattr(iteration_stats, "finished_requests", None) or []
        s.finished = [FinishedRequest(
            generation_tokens=getattr(r, "num_generation_tokens", None),
            decode_seconds=getattr(r, "decode_time", None),
            prompt_tokens=getattr(r, "num_prompt_tokens", None),
            reason=_reason(getattr(r, "finish_reason", None)),
        ) for r in fin]
    return s


def _reason(reason) -> str:
    if reason is None:
        return "unknown"
    name = getattr(reason, "name", None) or str(reason)
    return name.lower()


# --------------------------------------------------------------------------------------------------
# Stat logger base class and config accessors (API-server process)
# --------------------------------------------------------------------------------------------------
def stat_logger_base():
    from vllm.v1.metrics.loggers import StatLoggerBase
    return StatLoggerBase


def num_gpu_blocks(vllm_config) -> int | None:
    n = getattr(getattr(vllm_config, "cache_config", None), "num_gpu_blocks", None)
    return int(n) if isinstance(n, int) and n > 0 else None


def model_name(vllm_config) -> str:
    mc = getattr(vllm_config, "model_config", None)
    name = getattr(mc, "served_model_name", None) or getattr(mc, "model", None) or "unknown"
    if isinstance(name, (list, tuple)):
        name = name[0] if name else "unknown"
    return str(name)


def api_server_count(vllm_config) -> int:
    pc = getattr(vllm_config, "parallel_config", None)
    return int(getattr(pc, "_api_process_count", 1) or 1)


def device_name() -> str:
    try:
        from vllm.platforms import current_platform
        if current_platform.is_cpu():
            return "cpu"
        return str(current_platform.get_device_name())
    except Exception:
        return "unknown"


def device_capability() -> tuple[int, int] | None:
    try:
        from vllm.platforms import current_platform
        cap = current_platform.get_device_capability()
        return None if cap is None else (int(cap.major), int(cap.minor))
    except Exception:
        return None


# --------------------------------------------------------------------------------------------------
# Scheduler hook (engine-core process)
# --------------------------------------------------------------------------------------------------
_HOOK_ATTR = "_vllm_spark_hooked"


class _HookState:
    __slots__ = ("pending", "last_end", "busy")

    def __init__(self) -> None:
        self.pending: dict[int, float] = {}  # id(scheduler_output) -> schedule start
        self.last_end = 0.0
        self.busy = False  # requests were left running or waiting when the last step ended


def _composition(so) -> tuple[int, int, int, int]:
    """(prefill_reqs, prefill_tokens, decode_reqs, decode_tokens) of one SchedulerOutput.

    A request is in prefill if it is new this step or a cached request with no output token yet
    (a continuing chunked prefill), as vLLM's own `compute_iteration_details` counts it; written
    to be O(new requests) in the common pure-decode step.
    """
    nst = so.num_scheduled_tokens
    total_tokens = so.total_num_scheduled_tokens
    pre_reqs = 0
    pre_tokens = 0
    for r in so.scheduled_new_reqs:
        pre_reqs += 1
        pre_tokens += nst.get(r.req_id, 0)
    cached = so.scheduled_cached_reqs
    outs = getattr(cached, "num_output_tokens", None)
    if outs and 0 in outs:
        for rid, n_out in zip(cached.req_ids, outs):
            if n_out == 0:
                pre_reqs += 1
                pre_tokens += nst.get(rid, 0)
    return pre_reqs, pre_tokens, len(nst) - pre_reqs, total_tokens - pre_tokens


SCHEDULER_MODULE = "vllm.v1.core.sched.scheduler"


class _AfterImport:
    """A meta-path finder that runs `fn(module)` right after `name` is imported.

    The hook is installed in every process, but only the engine core imports the scheduler; waiting
    for its import spares the API server and the workers a second of start-up imports.
    """

    def __init__(self, name: str, fn) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        exec_module, fn = spec.loader.exec_module, self.fn

        def exec_and_patch(module):
            exec_module(module)
            fn(module)
        spec.loader.exec_module = exec_and_patch
        return spec


def install_scheduler_hook(on_error) -> bool:
    """Wrap vLLM's v1 Scheduler (now, or as soon as its module is imported) so each step's stats carry
    wall time, composition and KV blocks.  Returns True when installed or pending."""
    import sys

    def patch(module):
        try:
            _patch_scheduler(module.Scheduler, on_error)
        except Exception as exc:
            on_error("scheduler_hook_install", exc)

    module = sys.modules.get(SCHEDULER_MODULE)
    if module is not None:
        patch(module)
    elif not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(SCHEDULER_MODULE, patch))
    return True


def _patch_scheduler(Scheduler, on_error) -> None:
    """`on_error(where, exc)` is called (never raises) when the hook's own code fails; vLLM's result
    is returned untouched in that case."""

    if getattr(Scheduler, _HOOK_ATTR, False):
        return
    orig_schedule = Scheduler.schedule
    orig_update = Scheduler.update_from_output
    perf = time.perf_counter

    def schedule(self, *args, **kwargs):
        t0 = perf()
        out = orig_schedule(self, *args, **kwargs)
        try:
            st = self.__dict__.get("_vllm_spark_state")
            if st is None:
                st = self.__dict__["_vllm_spark_state"] = _HookState()
                log.info("vllm-spark-plugin: scheduler hook active in this engine core (%s)",
                         type(self).__name__)
            if len(st.pending) > 64:  # outputs that never came back (aborted engine steps)
                st.pending.clear()
            st.pending[id(out)] = t0
        except Exception as exc:
            on_error("scheduler_hook", exc)
        return out

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = orig_update(self, scheduler_output, model_runner_output)
        try:
            end = perf()
            st = self.__dict__.get("_vllm_spark_state")
            if st is not None:
                t0 = st.pending.pop(id(scheduler_output), None)
                if t0 is not None and scheduler_output.total_num_scheduled_tokens > 0:
                    # A step lasts from the previous step's end while the engine stayed busy (so the
                    # engine loop's own work between steps counts: it is part of every token's cost,
                    # and with async scheduling the next step is scheduled before this one ends),
                    # else from its schedule() call (after idle time).
                    start = st.last_end if (st.busy and st.last_end) else t0
                    st.last_end = end
                    st.busy = bool(getattr(self, "running", None)) or bool(getattr(self, "waiting", None))
                    stats = None
                    for eco in outputs.values():
                        stats = getattr(eco, "scheduler_stats", None)
                        if stats is not None:
                            break
                    if stats is not None:
                        pr, pt, dr, dt = _composition(scheduler_output)
                        pool = self.kv_cache_manager.block_pool
                        carried = stats.num_kv_fetch_reqs_by_stage
                        carried[K_STEP_US] = int((end - start) * 1e6)
                        carried[K_PREFILL_REQS] = pr
                        carried[K_PREFILL_TOKENS] = pt
                        carried[K_DECODE_REQS] = dr
                        carried[K_DECODE_TOKENS] = dt
                        carried[K_KV_FREE] = pool.get_num_free_blocks()
                        carried[K_KV_TOTAL] = pool.num_gpu_blocks
        except Exception as exc:
            on_error("scheduler_hook", exc)
        return outputs

    Scheduler.schedule = schedule
    Scheduler.update_from_output = update_from_output
    setattr(Scheduler, _HOOK_ATTR, True)


def process_role() -> str:
    """'engine_core', 'worker' or 'api_server' (best effort, for logs and the load test)."""
    import multiprocessing
    name = multiprocessing.current_process().name
    if name.startswith("EngineCore"):
        return "engine_core"
    if "Worker" in name or "worker" in name.lower():
        return "worker"
    return "api_server" if name == "MainProcess" else name


def is_finite_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

# ---- quantization / MoE backend interface (see vllm_spark_plugin.quant) appended below ----
# ==================================================================================================
# NVFP4 quantization config and GB10 MoE backend: every touch of vLLM's quantization / fused-MoE
# internals (vllm_spark_plugin.quant, vllm_spark_plugin.moe and doctor import from here).
# Checked against vLLM 0.32 (ModelOptNvFp4Config, ModelOptNvFp4FusedMoE, UnquantizedFusedMoEMethod,
# UnquantizedLinearMethod, oracle.nvfp4); `is_supported()` gates the registration.
# ==================================================================================================
SPARK_NVFP4 = "spark_nvfp4"          # the --quantization name the plugin registers
MODELOPT_FP4 = "modelopt_fp4"        # the checkpoint format name vLLM's model code keys on
NVFP4_ALGOS = ("NVFP4", "W4A16_NVFP4")
TUNED_CONFIG_ENV = "VLLM_TUNED_CONFIG_FOLDER"
_QUANT_CLASSES: dict = {}
_QUANT_CLASS_NAMES = ("SparkNvFp4Config", "SparkModelOptNvFp4FusedMoE", "SparkModelOptNvFp4ReferenceMoE",
                      "SparkNvFp4ReferenceLinearMethod")


def has_cuda() -> bool:
    try:
        from vllm.platforms import current_platform
        return bool(current_platform.is_cuda())
    except Exception:
        return False


def claims_device() -> bool:
    """Devices where the plugin claims ModelOpt NVFP4 checkpoints unasked: GB10-class (12.x) and
    devices without CUDA (no FP4 kernels: the reference path)."""
    if not has_cuda():
        return True
    cap = device_capability()
    return cap is not None and cap[0] == 12


def _modelopt_algo(hf_quant_cfg) -> str | None:
    if not isinstance(hf_quant_cfg, dict):
        return None
    if not str(hf_quant_cfg.get("quant_method", "")).lower().startswith("modelopt"):
        return None
    inner = hf_quant_cfg.get("quantization")
    algo = inner.get("quant_algo") if isinstance(inner, dict) else hf_quant_cfg.get("quant_algo")
    return str(algo or "").upper() or None


def register_nvfp4_quantization() -> bool:
    """Register `spark_nvfp4` with vLLM (idempotent).  Registers a light class whose
    `from_config` builds the real config on first use, so plugin loading imports nothing heavy."""
    if not is_supported():
        log.warning("vllm-spark-plugin: vLLM %s not checked for the NVFP4 config; not registered", vllm_version())
        return False
    from vllm.model_executor.layers import quantization as q
    from vllm.model_executor.layers.quantization.base_config import QuantizationConfig

    existing = getattr(q, "_CUSTOMIZED_METHOD_TO_QUANT_CONFIG", {}).get(SPARK_NVFP4)
    if existing is not None and getattr(existing, "_spark_claim", False):
        return True

    class SparkNvFp4Claim(QuantizationConfig):
        """Claims ModelOpt NVFP4 checkpoints; `from_config` returns the real `SparkNvFp4Config`."""

        _spark_claim = True

        def get_name(self):
            return SPARK_NVFP4

        def get_supported_act_dtypes(self):
            import torch
            return [torch.bfloat16, torch.half]

        @classmethod
        def get_min_capability(cls) -> int:
            return 75

        @staticmethod
        def get_config_filenames() -> list[str]:
            return ["hf_quant_config.json"]

        @classmethod
        def from_config(cls, config):
            return nvfp4_quant_classes()["SparkNvFp4Config"].from_config(config)

        def get_quant_method(self, layer, prefix):
            raise NotImplementedError("SparkNvFp4Claim only claims checkpoints")

        @classmethod
        def override_quantization_method(cls, hf_quant_cfg, user_quant, hf_config=None):
            if user_quant not in (None, SPARK_NVFP4):
                return None  # the user named another method (e.g. modelopt_fp4): leave it to vLLM
            if _modelopt_algo(hf_quant_cfg) not in NVFP4_ALGOS:
                return None
            if user_quant == SPARK_NVFP4 or claims_device():
                return SPARK_NVFP4
            return None

    SparkNvFp4Claim.__module__ = __name__
    q.register_quantization_config(SPARK_NVFP4)(SparkNvFp4Claim)
    return True


def nvfp4_quant_classes() -> dict:
    """Build (once) the config and method classes that subclass vLLM's.  Their names live in this
    module (see `__getattr__`) so the config pickles to the engine and worker processes."""
    if _QUANT_CLASSES:
        return _QUANT_CLASSES
    import torch
    from torch.nn import Parameter

    from vllm.model_executor.layers.fused_moe import RoutedExperts
    from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import UnquantizedFusedMoEMethod
    from vllm.model_executor.layers.linear import (
        WEIGHT_LOADER_V2_SUPPORTED,
        UnquantizedLinearMethod,
    )
    from vllm.model_executor.layers.quantization.modelopt import (
        ModelOptLinearMethod,
        ModelOptNvFp4Config,
        ModelOptNvFp4FusedMoE,
    )
    from vllm.model_executor.parameter import ModelWeightParameter, PerTensorScaleParameter
    from vllm.model_executor.utils import replace_parameter

    from vllm_spark_plugin.quant import nvfp4 as fmt

    class SparkNvFp4Config(ModelOptNvFp4Config):
        """ModelOpt NVFP4 with the GB10 MoE policy; on devices without CUDA, the reference path
        (dequantise to bf16 at load, vLLM's unquantised linear and MoE)."""

        def get_name(self):
            # The checkpoint format: vLLM's model code keys ModelOpt-NVFP4 workarounds on it.
            return MODELOPT_FP4

        def maybe_update_config(self, model_name, hf_config=None, revision=None):
            super().maybe_update_config(model_name, hf_config, revision)
            self._spark_model_path = model_name
            from vllm_spark_plugin.quant import checkpoint
            checkpoint.validate_at_load(model_name, group_size=getattr(self, "group_size", None))

        def get_quant_method(self, layer, prefix):
            from vllm_spark_plugin.quant import startup
            startup.once_per_process(self)
            reference = not has_cuda()
            if isinstance(layer, RoutedExperts) and not self.is_layer_excluded(prefix):
                cls = SparkModelOptNvFp4ReferenceMoE if reference else SparkModelOptNvFp4FusedMoE
                return cls(quant_config=self, moe_config=layer.moe_config)
            method = super().get_quant_method(layer, prefix)
            if reference and isinstance(method, ModelOptLinearMethod):
                return SparkNvFp4ReferenceLinearMethod(self)
            return method

    class SparkModelOptNvFp4FusedMoE(ModelOptNvFp4FusedMoE):
        """vLLM's ModelOpt NVFP4 MoE method; the backend comes from the plugin's GB10 policy unless
        vLLM's --moe-backend names one."""

        def __init__(self, quant_config, moe_config):
            from vllm_spark_plugin.moe import policy, startup
            decision = startup.decide_once(moe_config, quant_config)
            if moe_config.moe_backend == policy.AUTO and decision.backend not in (policy.AUTO, policy.REFERENCE):
                moe_config.moe_backend = decision.backend
            super().__init__(quant_config, moe_config)

    class SparkModelOptNvFp4ReferenceMoE(UnquantizedFusedMoEMethod):
        """Loads the NVFP4 expert tensors, dequantises them to the model dtype after loading and
        runs vLLM's unquantised MoE.  ("ModelOpt" in the name routes vLLM's weight loader through
        its ModelOpt branch: per-tensor weight_scale_2 and per-shard input_scale.)"""

        def __init__(self, quant_config, moe_config):
            super().__init__(moe_config)
            self.quant_config = quant_config
            self.use_global_sf = False
            from vllm_spark_plugin.moe import startup
            startup.decide_once(moe_config, quant_config)

        def uses_weight_scale_2_pattern(self) -> bool:
            return True

        def create_weights(self, layer, num_experts, hidden_size, intermediate_size_per_partition,
                           params_dtype, **extra_weight_attrs):
            ModelOptNvFp4FusedMoE.create_weights(self, layer, num_experts, hidden_size,
                                                 intermediate_size_per_partition, params_dtype,
                                                 **extra_weight_attrs)
            layer.w13_weight_scale_2.data.fill_(float("nan"))  # detect tensors never loaded
            layer.w2_weight_scale_2.data.fill_(float("nan"))

        def process_weights_after_loading(self, layer) -> None:
            name = getattr(layer, "layer_name", "experts")
            for p in ("w13_weight_scale_2", "w2_weight_scale_2"):
                if bool(torch.isnan(getattr(layer, p)).any()):
                    raise RuntimeError(f"NVFP4 {name}.{p} was never loaded: the checkpoint lacks "
                                       "some experts' weight_scale_2 tensors")
            dtype = layer.params_dtype
            inter = layer.w13_weight.shape[1] // 2
            s2 = layer.w13_weight_scale_2.data
            if self.moe.is_act_and_mul:
                halves = [fmt.dequantize(layer.w13_weight.data[:, r0:r0 + inter],
                                         layer.w13_weight_scale.data[:, r0:r0 + inter], s2[:, j], dtype)
                          for j, r0 in enumerate((0, inter))]
                w13 = torch.cat(halves, dim=1)
            else:
                w13 = fmt.dequantize(layer.w13_weight.data, layer.w13_weight_scale.data, s2[:, 0], dtype)
            w2 = fmt.dequantize(layer.w2_weight.data, layer.w2_weight_scale.data,
                                layer.w2_weight_scale_2.data, dtype)
            for p in ("w13_weight_scale", "w2_weight_scale", "w13_weight_scale_2", "w2_weight_scale_2",
                      "w13_input_scale", "w2_input_scale"):
                if hasattr(layer, p):
                    delattr(layer, p)
            replace_parameter(layer, "w13_weight", w13)
            replace_parameter(layer, "w2_weight", w2)
            super().process_weights_after_loading(layer)

    class SparkNvFp4ReferenceLinearMethod(UnquantizedLinearMethod):
        """Loads a ModelOpt NVFP4 linear (weight, weight_scale, weight_scale_2, input_scale), then
        dequantises each fused shard with its own global scale and runs vLLM's unquantised GEMM."""

        def __init__(self, quant_config) -> None:
            super().__init__()
            self.group_size = quant_config.group_size

        def create_weights(self, layer, input_size_per_partition, output_partition_sizes, input_size,
                           output_size, params_dtype, **extra_weight_attrs):
            wl = extra_weight_attrs.get("weight_loader")
            if input_size_per_partition % self.group_size:
                raise ValueError(f"NVFP4 linear with in_features={input_size_per_partition}, "
                                 f"not a multiple of the group size {self.group_size}")
            n = sum(output_partition_sizes)
            layer.logical_widths = list(output_partition_sizes)
            layer.input_size_per_partition = input_size_per_partition
            layer.output_size_per_partition = n
            layer.params_dtype = params_dtype
            k = input_size_per_partition
            layer.register_parameter("weight", ModelWeightParameter(
                data=torch.empty(n, k // 2, dtype=torch.uint8), input_dim=1, output_dim=0, weight_loader=wl))
            scale = ModelWeightParameter(data=torch.empty(n, k // self.group_size, dtype=torch.float8_e4m3fn),
                                         input_dim=1, output_dim=0, weight_loader=wl)
            scale.data.fill_(float("nan"))
            layer.register_parameter("weight_scale", scale)
            for p in ("weight_scale_2", "input_scale"):
                t = PerTensorScaleParameter(data=torch.full((len(output_partition_sizes),), float("nan"),
                                                            dtype=torch.float32), weight_loader=wl)
                layer.register_parameter(p, t)

        def process_weights_after_loading(self, layer) -> None:
            name = getattr(layer, "prefix", "") or type(layer).__name__
            if bool(torch.isnan(layer.weight_scale.data.float()).any()) or \
                    bool(torch.isnan(layer.weight_scale_2.data).any()):
                raise RuntimeError(f"NVFP4 weight_scale/weight_scale_2 of {name} was never loaded "
                                   "(the checkpoint stores this layer unquantised or lacks the scale); "
                                   "add it to the exclude list")
            parts, r0 = [], 0
            for i, width in enumerate(layer.logical_widths):
                parts.append(fmt.dequantize(layer.weight.data[r0:r0 + width],
                                            layer.weight_scale.data[r0:r0 + width],
                                            layer.weight_scale_2.data[i], layer.params_dtype))
                r0 += width
            for p in ("weight_scale", "weight_scale_2", "input_scale"):
                delattr(layer, p)
            layer.weight = Parameter(torch.cat(parts, dim=0), requires_grad=False)
            super().process_weights_after_loading(layer)

    WEIGHT_LOADER_V2_SUPPORTED.append(SparkNvFp4ReferenceLinearMethod.__name__)
    for cls in (SparkNvFp4Config, SparkModelOptNvFp4FusedMoE, SparkModelOptNvFp4ReferenceMoE,
                SparkNvFp4ReferenceLinearMethod):
        cls.__module__ = __name__
        cls.__qualname__ = cls.__name__
        _QUANT_CLASSES[cls.__name__] = cls
    return _QUANT_CLASSES


def __getattr__(name: str):
    # Unpickling the quant config in the engine/worker process resolves the class by name here.
    if name in _QUANT_CLASS_NAMES:
        return nvfp4_quant_classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def vllm_reference_dequantize(packed, block_scale, scale_2, dtype):
    """vLLM's own reference NVFP4 dequantisation (CPU path of `dequantize_to_dtype`)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import dequantize_to_dtype
    return dequantize_to_dtype(packed.cpu(), block_scale.cpu(), scale_2.cpu(), dtype, 16, swizzle=False)


def vllm_reference_quantize(x, global_scale):
    """vLLM's reference NVFP4 quantiser: (E2M1 values as fp32, block scales as fp32)."""
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant
    return ref_nvfp4_quant(x.clone(), global_scale, 16)


def vllm_reference_quant_dequant(x, global_scale):
    from vllm.model_executor.layers.quantization.utils.nvfp4_emulation_utils import ref_nvfp4_quant_dequant
    return ref_nvfp4_quant_dequant(x, global_scale, 16)


def nvfp4_moe_backend_availability(moe_config, use_a16: bool, names) -> dict:
    """For each --moe-backend name: None when vLLM says it can run this layer's configuration
    here, else the reason (import failure, device, quant scheme...)."""
    from vllm.model_executor.layers.fused_moe import modular_kernel as mk
    from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as oracle
    from vllm.model_executor.layers.quantization.utils.quant_utils import kNvfp4Dynamic, kNvfp4Static

    fmt = (mk.FusedMoEActivationFormat.BatchedExperts
           if moe_config.moe_parallel_config.use_batched_activation_format
           else mk.FusedMoEActivationFormat.Standard)
    out: dict = {}
    for name in names:
        try:
            backend = oracle.map_nvfp4_backend(name)
            classes = oracle.backend_to_kernel_cls(backend)
            akey = None if (use_a16 or oracle._use_a16(backend, False)) else kNvfp4Dynamic
            reasons = []
            for k_cls in classes:
                ok, reason = k_cls.is_supported_config(k_cls, moe_config, kNvfp4Static, akey, fmt)
                if ok:
                    out[name] = None
                    break
                reasons.append(reason or "unsupported configuration")
            else:
                out[name] = "; ".join(reasons) or "not supported"
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def nvfp4_moe_runner(backend: str, moe_config, quant_config):
    """A self-check runner for `backend`: builds vLLM's ModelOpt NVFP4 MoE method with that
    backend on a small stand-in layer, loads the problem's weights the way the checkpoint loader
    does, runs `process_weights_after_loading` (the real weight conversion) and the kernel."""
    import dataclasses

    import torch

    from vllm.model_executor.layers.quantization.modelopt import ModelOptNvFp4FusedMoE

    if moe_is_parallel(moe_config):
        raise NotImplementedError("the self-check runs only without tensor/expert/data parallelism")

    def run(problem):
        t, h, inter, e, k = problem.shape
        cfg = dataclasses.replace(moe_config, num_experts=e, num_local_experts=e, num_logical_experts=e,
                                  experts_per_token=k, hidden_dim=h, intermediate_size=inter,
                                  hidden_dim_unpadded=None, intermediate_size_per_partition_unpadded=None,
                                  moe_backend=backend, in_dtype=torch.bfloat16)
        device = torch.device("cuda", torch.cuda.current_device())
        method = ModelOptNvFp4FusedMoE(quant_config, cfg)
        layer = _SelfCheckLayer(cfg, e, h, inter)
        with torch.device(device):
            method.create_weights(layer, num_experts=e, hidden_size=h, intermediate_size_per_partition=inter,
                                  params_dtype=torch.bfloat16, weight_loader=_no_loader, global_num_experts=e)
        layer.w13_weight.data.copy_(problem.w13.to(device))
        layer.w13_weight_scale.data.copy_(problem.w13_scale.to(device))
        layer.w13_weight_scale_2.data.copy_(problem.w13_scale_2.to(device)[:, None].expand(e, 2))
        layer.w2_weight.data.copy_(problem.w2.to(device))
        layer.w2_weight_scale.data.copy_(problem.w2_scale.to(device))
        layer.w2_weight_scale_2.data.copy_(problem.w2_scale_2.to(device))
        layer.w13_input_scale.data.copy_(problem.a13_scale.to(device)[:, None].expand_as(layer.w13_input_scale))
        layer.w2_input_scale.data.copy_(problem.a2_scale.to(device).expand_as(layer.w2_input_scale))
        method.process_weights_after_loading(layer)
        x = problem.x.to(device)
        if method.is_monolithic:
            out = method.apply_monolithic(layer, x, problem.router_logits.to(device))
        else:
            out = method.apply(layer, x, problem.topk_weights.to(device), problem.topk_ids.to(device), None, None)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"kernel returned {type(out).__name__}, not a tensor")
        torch.cuda.synchronize()
        return out[:, :h].float().cpu()

    return run


def moe_is_parallel(moe_config) -> bool:
    """True when the MoE layer is sharded (tensor, expert or data parallel)."""
    pc = getattr(moe_config, "moe_parallel_config", None)
    return (getattr(pc, "tp_size", 1) != 1 or bool(getattr(pc, "use_ep", False))
            or getattr(pc, "dp_size", 1) != 1)


def _no_loader(*args, **kwargs):
    raise RuntimeError("the self-check layer loads its weights directly")


def _self_check_layer_cls():
    import torch

    class SelfCheckLayer(torch.nn.Module):
        """The attributes vLLM's NVFP4 MoE weight conversion and kernels read from a RoutedExperts."""

        def __init__(self, cfg, e: int, h: int, inter: int) -> None:
            super().__init__()
            self.moe_config = cfg
            self.layer_name = "spark_moe_selfcheck"
            self.activation = cfg.activation
            self.num_experts = self.local_num_experts = self.global_num_experts = e
            self.hidden_size = h
            self.intermediate_size_per_partition = inter
            self.params_dtype = torch.bfloat16
            self.top_k = cfg.experts_per_token
            self.renormalize = True
            self.use_grouped_topk = False
            self.num_expert_group = self.topk_group = None
            self.custom_routing_function = None
            self.scoring_func = "softmax"
            self.routed_scaling_factor = 1.0
            self.e_score_correction_bias = None
            self.apply_router_weight_on_input = False
            self.expert_map = None
            self.routing_sink = None
            self.swiglu_limit = self.swiglu_alpha = self.swiglu_beta = None

        def _expert_routing_tables(self):
            return None

    return SelfCheckLayer


def _SelfCheckLayer(cfg, e, h, inter):  # noqa: N802 - a constructor
    return _self_check_layer_cls()(cfg, e, h, inter)


def nvfp4_backend_imports() -> dict:
    """Which FP4 MoE backends' Python pieces import here (doctor): name -> None or the reason."""
    import importlib
    import importlib.util

    out: dict = {}
    if not has_cuda():
        reason = "no CUDA device (vLLM CPU build): NVFP4 loads through the plugin's reference path"
        return {n: reason for n in ("marlin", "flashinfer_cutlass", "b12x", "cutlass")}
    checks = {
        "marlin": ("vllm.model_executor.layers.fused_moe.experts.marlin_moe", None),
        "flashinfer_cutlass": ("vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe", "flashinfer"),
        "b12x": ("vllm.model_executor.layers.fused_moe.b12x", "b12x"),
        "cutlass": ("vllm.model_executor.layers.fused_moe.experts.cutlass_moe", None),
    }
    for name, (module, package) in checks.items():
        try:
            if package is not None and importlib.util.find_spec(package) is None:
                out[name] = f"Python package {package!r} is not installed"
                continue
            importlib.import_module(module)
            out[name] = None
        except Exception as exc:
            out[name] = f"{type(exc).__name__}: {exc}"
    return out


def fused_moe_config_file_name(experts: int, n: int, dtype: str | None) -> str:
    """The file name vLLM's Triton fused MoE looks up for this device (get_config_file_name)."""
    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name
    return get_config_file_name(experts, n, dtype)


def run_triton_fused_moe(x, w1, w2, topk_weights, topk_ids, config: dict, quant_config=None):
    """One call of vLLM's Triton fused MoE with an explicit kernel config (tuning)."""
    from vllm.model_executor.layers.fused_moe import override_config
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts
    with override_config(config):
        return fused_experts(x, w1, w2, topk_weights, topk_ids, quant_config=quant_config)


def fp8_w8a8_moe_quant_config(w1_scale, w2_scale, a1_scale, a2_scale):
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config as make
    return make(w1_scale=w1_scale, w2_scale=w2_scale, a1_scale=a1_scale, a2_scale=a2_scale)


def current_vllm_config():
    """The VllmConfig being built/served in this process (None outside vLLM's config context)."""
    try:
        from vllm.config import get_current_vllm_config_or_none
        return get_current_vllm_config_or_none()
    except Exception:
        return None
